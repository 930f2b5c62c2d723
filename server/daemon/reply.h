/* What the HTTP side does with a job, and the responses every route builds:
 * JSON and error bodies (the OpenAI envelope), the PNG/base64 encode work on
 * libuv's work queue, and SSE streams. ditd_reply_sink is the job sink
 * (server/daemon/job.h) that routes.c gives every job. Loop thread. */
#ifndef DITD_SERVER_REPLY_H
#define DITD_SERVER_REPLY_H

#include <jansson.h>
#include <microhttpd.h>
#include <stddef.h>

#include "server/daemon/genreq.h"
#include "server/daemon/job.h"

/* Server and X-Request-Id (when rid is non-empty). */
void ditd_reply_headers(struct MHD_Response *r, const char *rid);
/* Steals body (malloc'd); NULL on out of memory. */
struct MHD_Response *ditd_reply_buffer(char *body, size_t len, const char *ctype, const char *rid);
/* Steals root. */
struct MHD_Response *ditd_reply_json(json_t *root, const char *rid);
/* The error envelope; Retry-After when retry_after > 0; *len (may be NULL)
 * the body's length. */
struct MHD_Response *ditd_reply_error(const ditd_api_error *e, const char *rid, int retry_after,
                                      size_t *len);

extern const ditd_job_sink ditd_reply_sink;

/* The SSE response of a streaming job (holds a reference until libmicrohttpd
 * frees it). */
struct MHD_Response *ditd_reply_stream(ditd_job *j);
/* A keep-alive comment on a stream (and the next one's time). */
void ditd_reply_keepalive(ditd_job *j);
/* Resumes a suspended job's connection. */
void ditd_reply_resume(ditd_job *j);

#endif
