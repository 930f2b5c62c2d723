/* The HTTP routes of `ditd serve`: one table (routes.c, ditd_routes[]) with
 * one static const row per route saying everything about it (method, path,
 * handler, whether a key is needed, the body limit, the content types it
 * accepts), the dispatch that answers 404, 405 (with Allow), 413 and 415
 * from that table, libmicrohttpd's request and completion callbacks, and the
 * periodic watch over waiting requests. The handlers live beside it:
 * route_info.c (models, probes, metrics, the API's description, the page),
 * route_gen.c (image generations), route_jobs.c (background jobs). Loop
 * thread only.
 *
 * Not the HTTP edge (connection limits, read deadlines: http.h) nor the
 * responses' bodies (reply.h). */
#ifndef DITD_SERVER_DAEMON_ROUTES_H
#define DITD_SERVER_DAEMON_ROUTES_H

#include <jansson.h>
#include <microhttpd.h>
#include <stddef.h>

#include "server/daemon/genreq.h"
#include "server/daemon/job.h"
#include "server/daemon/metrics.h"

typedef struct ditd_srv ditd_srv;
typedef struct ditd_route_row ditd_route_row;

/* Who may call a route. */
typedef enum ditd_route_auth {
    DITD_ROUTE_KEY = 0,      /* a key, when keys are configured */
    DITD_ROUTE_OPEN,         /* never a key: probes, the API's description, the page */
    DITD_ROUTE_METRICS_KEY,  /* a key only under --metrics-auth */
    DITD_ROUTE_ADMIN,        /* an admin key (--admin-key), not an API key; without
                              * admin keys configured the route answers 403 */
} ditd_route_auth;

/* Row flags. */
#define DITD_ROUTE_KEEP_BODY 1u  /* the body is kept for the handler (else read and dropped) */
#define DITD_ROUTE_NEW_WORK 2u   /* makes work: refused with 503 while draining */

/* One request, from its headers to its end. */
typedef struct ditd_route_req {
    const ditd_route_row *row; /* NULL: no row matched (404 or 405) */
    ditd_route route;          /* the metrics label */
    int head;                  /* HEAD: no body is sent */
    int http10;                /* an HTTP/1.0 request: it must never get a 1xx answer */
    int handled;               /* the handler ran (later calls are resumes) */
    char *id;                  /* the path's {id} or {name} (owned), or NULL */
    char owner[65];            /* the caller's key as a SHA-256 hex digest ("" without keys) */
    ditd_job *job;             /* generations: a ref (the connection's) */
    ditd_api_error refuse;     /* decided at the headers, answered at the end */
    int refused;
    size_t body_seen;          /* bytes of a body that is not kept */
    int too_large;             /* the body passed the row's limit */
    char *body;                /* the kept body (KEEP_BODY rows) */
    size_t body_len, body_cap;
    /* a handler that waits on something other than a job (an adapter op,
     * route_loras.c): the suspended connection, and the answer it leaves
     * here before resuming it */
    struct MHD_Connection *conn;
    int waiting;
    /* called by the request's end while waiting is set (the client left):
     * the handler lets go of what it waits on */
    void (*gone)(ditd_srv *s, struct ditd_route_req *rq);
    struct MHD_Response *resp;
    int resp_status;
    size_t resp_len;
} ditd_route_req;

/* A handler: runs once the body is in, answers (or suspends). */
typedef enum MHD_Result (*ditd_route_fn)(ditd_srv *s, struct MHD_Connection *c,
                                         ditd_route_req *rq, const char *rid);

struct ditd_route_row {
    const char *method;       /* "GET" (HEAD too), "POST", "DELETE" */
    const char *path;         /* exact, or with one {id} segment ("/v1/jobs/{id}/content"),
                               * or ending in {name}: the rest ("/v1/models/{name}") */
    ditd_route route;         /* metrics label */
    ditd_route_fn fn;
    ditd_route_auth auth;
    unsigned flags;           /* DITD_ROUTE_KEEP_BODY, DITD_ROUTE_NEW_WORK */
    long max_body;            /* bytes; 0: --max-body-bytes */
    const char *types;        /* accepted Content-Types, comma-separated ("application/json"
                               * also takes any "+json" type); NULL: any */
};

extern const ditd_route_row ditd_routes[];
extern const size_t ditd_routes_count;

/* The row for method and path (*id: the {id} segment, malloc'd, or NULL),
 * or NULL. When no row has the method but some have the path, *allow gets
 * their methods ("GET, HEAD, DELETE"); else allow[0] is 0. */
const ditd_route_row *ditd_route_find(const char *method, const char *path, char **id,
                                      char *allow, size_t allow_n, ditd_route *label);

/* The owner of what a key makes: the key's SHA-256 in hex (the key itself
 * is never stored). */
void ditd_route_owner(const char *key, char out[65]);

/* Answering, for the handlers. Each counts the answer and records it for
 * the access log; a NULL response becomes a fixed 500. */
enum MHD_Result ditd_route_answer(ditd_srv *s, struct MHD_Connection *c, ditd_route route,
                                  int status, struct MHD_Response *r, size_t body_len);
/* Steals root (NULL: the fixed 500). */
enum MHD_Result ditd_route_answer_json(ditd_srv *s, struct MHD_Connection *c, ditd_route route,
                                       int status, json_t *root, const char *rid);
/* The error envelope (Retry-After when retry_after > 0; Connection: close
 * when close). */
enum MHD_Result ditd_route_answer_err(ditd_srv *s, struct MHD_Connection *c, ditd_route route,
                                      const ditd_api_error *e, const char *rid, int retry_after,
                                      int close);

/* The handlers of route_info.c and route_gen.c. */
enum MHD_Result ditd_route_models(ditd_srv *s, struct MHD_Connection *c, ditd_route_req *rq,
                                  const char *rid);
enum MHD_Result ditd_route_model(ditd_srv *s, struct MHD_Connection *c, ditd_route_req *rq,
                                 const char *rid);
enum MHD_Result ditd_route_healthz(ditd_srv *s, struct MHD_Connection *c, ditd_route_req *rq,
                                   const char *rid);
enum MHD_Result ditd_route_readyz(ditd_srv *s, struct MHD_Connection *c, ditd_route_req *rq,
                                  const char *rid);
enum MHD_Result ditd_route_metrics(ditd_srv *s, struct MHD_Connection *c, ditd_route_req *rq,
                                   const char *rid);
enum MHD_Result ditd_route_openapi(ditd_srv *s, struct MHD_Connection *c, ditd_route_req *rq,
                                   const char *rid);
enum MHD_Result ditd_route_page(ditd_srv *s, struct MHD_Connection *c, ditd_route_req *rq,
                                const char *rid);
enum MHD_Result ditd_route_generate(ditd_srv *s, struct MHD_Connection *c, ditd_route_req *rq,
                                    const char *rid);
/* route_gen.c: POST /v1/images/edits (editreq.c parses it; then as a generation) */
enum MHD_Result ditd_route_edit(ditd_srv *s, struct MHD_Connection *c, ditd_route_req *rq,
                                const char *rid);
/* route_loras.c: GET /v1/loras; POST /v1/loras and DELETE /v1/loras/{name}
 * (admin: load and unload at run time; a waiting one sets rq->gone) */
enum MHD_Result ditd_route_loras(ditd_srv *s, struct MHD_Connection *c, ditd_route_req *rq,
                                 const char *rid);
enum MHD_Result ditd_route_lora_load(ditd_srv *s, struct MHD_Connection *c, ditd_route_req *rq,
                                     const char *rid);
enum MHD_Result ditd_route_lora_unload(ditd_srv *s, struct MHD_Connection *c, ditd_route_req *rq,
                                       const char *rid);
/* route_jobs.c: background jobs (create is asked by ditd_route_generate) */
/* Shared by the job routes (route_jobs.c) and the video routes
 * (route_videos.c): a finished-at time or null, a failed job's
 * {code, message} or null, the 500 of a store error, and a page of the
 * caller's jobs of one kind (NULL: all; limit, after, order from the
 * query) with obj making each row's object. */
struct ditd_jrow;
typedef json_t *(*ditd_route_job_fn)(ditd_srv *s, const struct ditd_jrow *r);
json_t *ditd_route_opt_time(long long t);
json_t *ditd_route_job_error(const struct ditd_jrow *r);
enum MHD_Result ditd_route_store_error(ditd_srv *s, struct MHD_Connection *c, ditd_route_req *rq,
                                       const char *rid);
enum MHD_Result ditd_route_jobs_page(ditd_srv *s, struct MHD_Connection *c, ditd_route_req *rq,
                                     const char *rid, const char *kind, ditd_route_job_fn obj);

/* route_videos.c: OpenAI's videos API on the job store */
enum MHD_Result ditd_route_video_create(ditd_srv *s, struct MHD_Connection *c, ditd_route_req *rq,
                                        const char *rid);
enum MHD_Result ditd_route_videos_list(ditd_srv *s, struct MHD_Connection *c, ditd_route_req *rq,
                                       const char *rid);
enum MHD_Result ditd_route_video_get(ditd_srv *s, struct MHD_Connection *c, ditd_route_req *rq,
                                     const char *rid);
enum MHD_Result ditd_route_video_content(ditd_srv *s, struct MHD_Connection *c, ditd_route_req *rq,
                                         const char *rid);
enum MHD_Result ditd_route_video_delete(ditd_srv *s, struct MHD_Connection *c, ditd_route_req *rq,
                                        const char *rid);
enum MHD_Result ditd_route_job_create(ditd_srv *s, struct MHD_Connection *c, ditd_route_req *rq,
                                      const char *rid);
enum MHD_Result ditd_route_jobs_list(ditd_srv *s, struct MHD_Connection *c, ditd_route_req *rq,
                                     const char *rid);
enum MHD_Result ditd_route_job_get(ditd_srv *s, struct MHD_Connection *c, ditd_route_req *rq,
                                   const char *rid);
enum MHD_Result ditd_route_job_content(ditd_srv *s, struct MHD_Connection *c, ditd_route_req *rq,
                                       const char *rid);
enum MHD_Result ditd_route_job_delete(ditd_srv *s, struct MHD_Connection *c, ditd_route_req *rq,
                                      const char *rid);

/* libmicrohttpd callbacks; cls is the ditd_srv. */
enum MHD_Result ditd__on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                 const char *method, const char *version, const char *upload,
                                 size_t *upload_size, void **ctx);
void ditd__on_completed(void *cls, struct MHD_Connection *conn, void **ctx,
                        enum MHD_RequestTerminationCode toe);
/* Periodic: request timeouts, clients gone while waiting, keep-alives. */
void ditd__jobs_watch(ditd_srv *s);

#endif
