/* The body of POST /v1/loras (docs/api.md): {"name": NAME, "path": PATH},
 * to a typed request, once, at the edge. What the route then does with it
 * (the path's folders, the load on every replica) is route_loras.c's and
 * sched_lora.c's. No daemon state: unit-tested and fuzzed alone. */
#ifndef DITD_SERVER_LORA_ADMIN_H
#define DITD_SERVER_LORA_ADMIN_H

#include <stddef.h>

#include "server/common/lora_spec.h"
#include "server/daemon/api_error.h"

typedef struct ditd_lora_admin_req {
    char name[DITD_LORA_NAME_MAX];   /* ditd_lora_name_ok */
    char path[DITD_LORA_PATH_MAX];   /* as given: not resolved, not checked on disk */
} ditd_lora_admin_req;

/* body[0 .. len): a JSON object with exactly "name" (an adapter name:
 * ditd_lora_name_ok) and "path" (a string of 1 .. DITD_LORA_PATH_MAX - 1
 * bytes without NUL). 0, or DITD_EINVAL with *e a 400 naming the field
 * (param "name", "path", or the unknown field; none for a body that is not
 * a JSON object). */
int ditd_lora_admin_parse(const char *body, size_t len, ditd_lora_admin_req *out,
                          ditd_api_error *e);

#endif
