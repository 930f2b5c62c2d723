/* libFuzzer target: html.unescape and WanPipeline's prompt_clean
 * (engine/text/prompt_clean.h) on any bytes. Invalid UTF-8 must be refused
 * with a detail; valid input must give valid, NUL-terminated UTF-8 with no
 * leading or trailing whitespace and no run of two spaces; the same output
 * twice (no state); never a crash or a leak. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/error.h"
#include "engine/text/prompt_clean.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *u = NULL, *c = NULL, *c2 = NULL;
    size_t un = 0, cn = 0, cn2 = 0;
    ditd_err_clear();
    int e1 = ditd_html_unescape((const char *)data, size, &u, &un);
    int e2 = ditd_wan_prompt_clean((const char *)data, size, &c, &cn);
    if ((e1 != 0) != (e2 != 0))
        abort();
    if (e1) {
        if (ditd_err_detail()[0] == '\0')
            abort();
        return 0;
    }
    if (u[un] != '\0' || c[cn] != '\0')
        abort();
    /* the cleaned text: valid UTF-8 again (cleaning it again must not fail),
     * no ASCII whitespace at the ends, no double space */
    if (cn && (c[0] == ' ' || c[cn - 1] == ' ' || c[cn - 1] == '\n' || c[cn - 1] == '\t'))
        abort();
    if (memmem(c, cn, "  ", 2))
        abort();
    if (ditd_wan_prompt_clean(c, cn, &c2, &cn2) != 0)
        abort();
    free(c2);
    if (ditd_wan_prompt_clean((const char *)data, size, &c2, &cn2) != 0 || cn2 != cn ||
        memcmp(c2, c, cn) != 0)
        abort();
    free(c2);
    free(u);
    free(c);
    return 0;
}
