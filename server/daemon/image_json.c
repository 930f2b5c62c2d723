/* An image given in a JSON body (image_json.h: ditd_genreq_json_image): the
 * edits' image and mask (editreq.c), the videos' input_reference
 * (genreq.c). Its own file so that the request parser's fuzz target links
 * it without the edit's pipeline rules. Loop thread only. */
#include <gnutls/gnutls.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/error.h"
#include "server/common/image_in.h"
#include "server/daemon/image_json.h"

static int bad(ditd_api_error *e, const char *field, const char *what)
{
    ditd_api_error_set(e, 400, "invalid_request_error", "invalid_value", field, "'%s'%s", field,
                       what);
    return DITD_EINVAL;
}

int ditd_genreq_json_bytes(json_t *v, const char *field, uint8_t **data, size_t *len,
                           ditd_api_error *e)
{
    *data = NULL;
    *len = 0;
    if (json_is_object(v))
        v = json_object_get(v, "image_url");
    if (!json_is_string(v))
        return bad(e, field, " must be a base64 string or a data URL "
                   "(\"data:image/png;base64,...\"), or {\"image_url\": ...}");
    const char *s = json_string_value(v);
    size_t n = json_string_length(v);
    if (!strncmp(s, "data:", 5)) {
        const char *comma = memchr(s, ',', n);
        if (!comma || comma - s < 12 || strncmp(comma - 7, ";base64", 7))
            return bad(e, field, ": a data URL must be \"data:<type>;base64,<data>\"");
        n -= (size_t)(comma + 1 - s);
        s = comma + 1;
    } else if (!strncmp(s, "http://", 7) || !strncmp(s, "https://", 8)) {
        return bad(e, field, ": image URLs are not fetched; send the image as base64 or a data "
                   "URL");
    }
    gnutls_datum_t in = {(unsigned char *)s, (unsigned)n}, out = {NULL, 0};
    if (n == 0 || n > ((size_t)1 << 30) || gnutls_base64_decode2(&in, &out) < 0)
        return bad(e, field, " is not valid base64");
    *data = malloc(out.size ? out.size : 1);
    if (!*data) {
        gnutls_free(out.data);
        ditd_api_error_set(e, 500, "server_error", "internal_error", NULL, "out of memory");
        return DITD_ENOMEM;
    }
    memcpy(*data, out.data, out.size);
    *len = out.size;
    gnutls_free(out.data);
    return 0;
}

int ditd_genreq_json_image(json_t *v, const char *field, const ditd_image_limits *lim,
                           ditd_image *out, ditd_api_error *e)
{
    uint8_t *data;
    size_t len;
    memset(out, 0, sizeof *out);
    int err = ditd_genreq_json_bytes(v, field, &data, &len, e);
    if (err)
        return err;
    err = ditd_image_decode(data, len, lim, out);
    free(data);
    if (err == DITD_ENOMEM)
        ditd_api_error_set(e, 500, "server_error", "internal_error", NULL, "out of memory");
    else if (err)
        ditd_api_error_set(e, 400, "invalid_request_error", "invalid_value", field, "'%s': %s",
                           field, ditd_err_detail());
    ditd_err_clear();
    return err == DITD_ENOMEM ? err : err ? DITD_EINVAL : 0;
}
