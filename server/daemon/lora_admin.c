/* POST /v1/loras's body (server/daemon/lora_admin.h). */
#include "server/daemon/lora_admin.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "engine/core/error.h"
#include "server/daemon/genreq.h"

int ditd_lora_admin_parse(const char *body, size_t len, ditd_lora_admin_req *out,
                          ditd_api_error *e)
{
    json_error_t jerr;
    json_t *root, *v;
    const char *key;
    int err = DITD_EINVAL;
    memset(out, 0, sizeof *out);
    if (!body || !len)
        return ditd_api_bad(e, NULL, "the body is empty: send {\"name\": NAME, \"path\": PATH}");
    if (!(root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &jerr)))
        return ditd_api_bad(e, NULL, "the body is not valid JSON: %s (line %d, column %d)",
                            jerr.text, jerr.line, jerr.column);
    if (!json_is_object(root)) {
        ditd_api_bad(e, NULL, "the body must be a JSON object {\"name\": NAME, \"path\": PATH}");
        goto done;
    }
    json_object_foreach(root, key, v)
        if (strcmp(key, "name") && strcmp(key, "path")) {
            char k[40];
            snprintf(k, sizeof k, "%.32s", key);
            ditd_utf8_clean(k);
            ditd_api_bad(e, k, "'%s': unknown field (the body has \"name\" and \"path\")", k);
            goto done;
        }
    v = json_object_get(root, "name");
    if (!json_is_string(v)) {
        ditd_api_bad(e, "name", "'name' must be a string: the adapter's name in requests");
        goto done;
    }
    if (!ditd_lora_name_ok(json_string_value(v), json_string_length(v))) {
        ditd_api_bad(e, "name", "'name' must be 1..%d letters, digits, '_', '-' and '.'",
                     DITD_LORA_NAME_MAX - 1);
        goto done;
    }
    memcpy(out->name, json_string_value(v), json_string_length(v) + 1);
    v = json_object_get(root, "path");
    if (!json_is_string(v)) {
        ditd_api_bad(e, "path", "'path' must be a string: a .safetensors file on the server");
        goto done;
    }
    size_t n = json_string_length(v);
    if (n == 0 || n >= DITD_LORA_PATH_MAX || memchr(json_string_value(v), '\0', n)) {
        ditd_api_bad(e, "path", "'path' must be 1..%d bytes without NUL", DITD_LORA_PATH_MAX - 1);
        goto done;
    }
    memcpy(out->path, json_string_value(v), n + 1);
    err = 0;
done:
    json_decref(root);
    return err;
}
