/* Images in JSON bodies (image_json.c). */
#ifndef DITD_SERVER_IMAGE_JSON_H
#define DITD_SERVER_IMAGE_JSON_H

#include <stddef.h>
#include <stdint.h>

#include "server/daemon/api_error.h"

/* An image in a JSON body (image_json.c; the edits' image and mask, the videos'
 * input_reference): v a base64 string, a data URL
 * "data:image/...;base64,..." or an object {"image_url": ...} holding one;
 * decoded under lim (NULL: the defaults) into *out (ditd_image_free). 0, or
 * DITD_EINVAL (400 naming field: not base64, an image URL, undecodable, over
 * a limit) / DITD_ENOMEM with *e filled. */
struct json_t;
struct ditd_image;
/* The same image's encoded bytes alone (*data owned, free()), undecoded. */
int ditd_genreq_json_bytes(struct json_t *v, const char *field, uint8_t **data, size_t *len,
                           ditd_api_error *e);
int ditd_genreq_json_image(struct json_t *v, const char *field,
                           const struct ditd_image_limits *lim, struct ditd_image *out,
                           ditd_api_error *e);

#endif
