/* libFuzzer target: the body of POST /v1/loras (ditd_lora_admin_parse,
 * server/daemon/lora_admin.h), the bytes an admin client controls, and the
 * error envelope of its refusal (it must stay valid JSON whatever the
 * message quotes). Any input gives a request within its bounds (a valid
 * adapter name, a path of 1..DITD_LORA_PATH_MAX - 1 bytes without NUL) or
 * a 400; never a crash or a leak. The path is not resolved here: that
 * touches the disk (tests/unit/test_lora_admin.c covers it). Seeds:
 * make_corpus_front.py. */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/error.h"
#include "server/daemon/lora_admin.h"
#include "server/daemon/genreq.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ditd_lora_admin_req r;
    ditd_api_error e;
    memset(&e, 0, sizeof e);
    int err = ditd_lora_admin_parse((const char *)data, size, &r, &e);
    if (!err) {
        size_t n = strlen(r.name), p = strlen(r.path);
        if (!ditd_lora_name_ok(r.name, n) || p == 0 || p >= DITD_LORA_PATH_MAX)
            abort();
        return 0;
    }
    if (err != DITD_EINVAL || e.status != 400 || !e.message[0])
        abort();
    char *js = ditd_api_error_json(&e);
    json_error_t je;
    json_t *root = js ? json_loads(js, 0, &je) : NULL;
    if (!root || !json_is_string(json_object_get(json_object_get(root, "error"), "message")))
        abort();
    json_decref(root);
    free(js);
    return 0;
}
