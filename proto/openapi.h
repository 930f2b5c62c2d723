/* The HTTP API's OpenAPI 3 document (proto/openapi.json), embedded at build
 * time by proto/embed.py. Served at GET /openapi.json; the http tests check
 * responses against the same file. */
#ifndef DITD_PROTO_OPENAPI_H
#define DITD_PROTO_OPENAPI_H

#include <stddef.h>

extern const unsigned char ditd_openapi_json[]; /* NUL-terminated */
extern const size_t ditd_openapi_json_len;      /* without the NUL */

#endif
