/* A generation request: the JSON body of POST /v1/images/generations turned,
 * once, into typed fields (JSON stops here). Validation names the field that
 * is wrong; nothing invalid reaches the scheduler.
 *
 * Also the OpenAI error envelope every route answers with. */
#ifndef DITD_SERVER_GENREQ_H
#define DITD_SERVER_GENREQ_H

#include <stddef.h>
#include <stdint.h>

#include "engine/models/model.h"
#include "engine/pipeline/sampler.h"

#define DITD_GENREQ_MAX_N 10

typedef struct ditd_genreq {
    int n;                      /* 1..10 */
    int width, height;
    int steps;
    ditd_sampler_kind sampler;
    float guidance;
    int64_t class_id;
    uint64_t seed;
    int seed_given;
    int stream;
    int partial_images;         /* 0..3 */
} ditd_genreq;

/* A validation failure: HTTP status, OpenAI type/code, the offending field
 * ("" when none) and a message for people. */
typedef struct ditd_api_error {
    int status;
    const char *type;           /* "invalid_request_error", "server_error", ... */
    const char *code;           /* "invalid_value", "model_not_found", ... */
    char param[64];
    char message[1024];
} ditd_api_error;

/* Parses and validates body (len bytes, not NUL-terminated) against the
 * model. sched_default is the model's scheduler kind. Returns 0, or
 * DITD_EINVAL / DITD_ENOENT (unknown model) with *e filled. */
int ditd_genreq_parse(const char *body, size_t len, const ditd_model_info *m,
                      ditd_sampler_kind sched_default, ditd_genreq *out, ditd_api_error *e);

/* The envelope {"error":{"message","type","param","code"}} as a malloc'd
 * string (NULL on out of memory). */
char *ditd_api_error_json(const ditd_api_error *e);

/* The length of the valid UTF-8 sequence at p (n bytes left), 0 if none
 * starts there. */
size_t ditd_utf8_seq(const unsigned char *p, size_t n);
/* Replaces each byte of s that starts no valid UTF-8 sequence with '?'. */
void ditd_utf8_clean(char *s);

/* Fills *e; returns status. param may be NULL. */
int ditd_api_error_set(ditd_api_error *e, int status, const char *type, const char *code,
                       const char *param, const char *fmt, ...) __attribute__((format(printf, 6, 7)));

#endif
