/* libFuzzer target: multipart/form-data (server/daemon/multipart.c). The
 * input up to its first newline (at most 200 bytes) is the Content-Type;
 * the rest is the body, parsed under small limits. Every part found must
 * lie inside the body and carry a name; the form as JSON (what POST
 * /v1/videos reads: ditd_multipart_to_json) is an object with one member
 * per name (a name repeated only by file parts, a list such as `image[]`,
 * is one), or refused naming a field. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "engine/core/error.h"
#include "server/daemon/multipart.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char ct[201];
    size_t n = 0;
    while (n < size && n < 200 && data[n] != '\n')
        n++;
    memcpy(ct, data, n);
    ct[n] = '\0';
    const uint8_t *body = data + n + (n < size);
    size_t blen = size - n - (n < size);
    char b[80];
    if (ditd_multipart_boundary(ct, b, sizeof b) == 0 && (b[0] == '\0' || strlen(b) > 70))
        abort();
    ditd_multipart_limits lim = {.max_parts = 16, .max_header_bytes = 512, .max_part_bytes = 2048};
    ditd_multipart_form f;
    if (ditd_multipart_parse(ct, body, blen, &lim, &f) == 0) {
        if (f.n_parts < 1 || f.n_parts > 16)
            abort();
        for (int i = 0; i < f.n_parts; i++) {
            const ditd_multipart_part *p = &f.parts[i];
            if (!p->name || !p->name[0] || p->data < body || p->len > 2048 ||
                p->len > (size_t)(body + blen - p->data))
                abort();
            if (ditd_multipart_find(&f, p->name, 0) == NULL || ditd_multipart_count(&f, p->name) < 1)
                abort();
        }
        static const char *const ints[] = {"seed", "num_frames", NULL};
        static const char *const nums[] = {"guidance_scale", NULL};
        static const char *const objs[] = {"cache", NULL};
        char field[64];
        json_t *o = ditd_multipart_to_json(&f, ints, nums, objs, field, sizeof field);
        if (o) {
            /* one member per name: a name repeated only as files (`image[]`) */
            size_t names = 0;
            for (int i = 0; i < f.n_parts; i++) {
                const ditd_multipart_part *p = &f.parts[i];
                names += ditd_multipart_find(&f, p->name, 0) == p;
                if (ditd_multipart_find(&f, p->name, 0) != p &&
                    (!p->filename || !ditd_multipart_find(&f, p->name, 0)->filename))
                    abort(); /* a repeated text part must have been refused */
            }
            if (!json_is_object(o) || json_object_size(o) != names)
                abort();
            char *txt = json_dumps(o, JSON_COMPACT); /* valid JSON, whatever the parts held */
            json_t *back = txt ? json_loads(txt, 0, NULL) : NULL;
            if (txt && !back)
                abort();
            json_decref(back);
            free(txt);
            json_decref(o);
        } else if (!field[0] && strstr(ditd_err_detail(), "memory") == NULL) {
            abort(); /* a refusal names the field */
        }
        ditd_multipart_free(&f);
    } else if (f.parts || f.n_parts || ditd_err_detail()[0] == '\0') {
        abort();
    }
    return 0;
}
