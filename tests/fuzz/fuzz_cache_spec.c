/* libFuzzer target: a step-caching specification as `--cache` and the
 * request's "cache" object give it (engine/pipeline/step_cache.h): the
 * METHOD[:key=value,...] parser, and one field set by name (the input split
 * at its first newline into key and value) on each method's defaults. Any
 * input must give 0 and a config that checks, compares equal to itself and
 * formats, or an error with a detail; never a crash or a leak. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/error.h"
#include "engine/pipeline/step_cache.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void checked(const ditd_cache_config *c)
{
    char buf[512];
    if (ditd_cache_config_check(c) != 0 || !ditd_cache_config_equal(c, c))
        abort();
    ditd_cache_config_format(c, buf, sizeof buf);
    if (!buf[0])
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ditd_cache_config c;
    char *s = malloc(size + 1);
    if (!s)
        return 0;
    memcpy(s, data, size);
    s[size] = 0;
    ditd_err_clear();
    if (ditd_cache_config_parse(s, &c) == 0)
        checked(&c);
    else if (ditd_err_detail()[0] == '\0')
        abort();
    char *nl = strchr(s, '\n');
    if (nl) {
        *nl = 0;
        for (int m = DITD_CACHE_FIRST_BLOCK; m <= DITD_CACHE_MAG; m++) {
            ditd_cache_config_default((ditd_cache_method)m, &c);
            ditd_err_clear();
            if (ditd_cache_config_set(&c, s, nl + 1) != 0 && ditd_err_detail()[0] == '\0')
                abort();
        }
    }
    free(s);
    return 0;
}
