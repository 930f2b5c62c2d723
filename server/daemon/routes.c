/* The route table of `ditd serve` and its dispatch (server/daemon/routes.h):
 * libmicrohttpd's request and completion callbacks, what every route gets
 * from its row (the key check, 404/405/413/415, the body kept or read
 * away), and the watch over waiting requests. Loop thread only. The
 * handlers are route_info.c's and route_gen.c's; responses and streams are
 * reply.c's; connection limits and read deadlines are http.c's.
 *
 * Every request is answered from the handler's last call (after its body,
 * possibly empty, is read), never from the first: libmicrohttpd closes a
 * connection whose answer was queued before the body was read, so an early
 * answer is kept for the 413 of a declared oversized body alone. */
#include "server/daemon/routes.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <gnutls/crypto.h>

#include "engine/core/error.h"
#include "server/daemon/log.h"
#include "server/daemon/reply.h"
#include "server/daemon/sched.h"
#include "server/daemon/serve.h"

/* ------------------------------------------------------------------ */
/* the table                                                           */

#define JSON "application/json"

/* One row per route: docs/api.md lists them, proto/openapi.json describes
 * them. The un-versioned /images/generations is the OpenAI client's path
 * under a base URL without /v1. */
const ditd_route_row ditd_routes[] = {
    /* method, path, metrics label, handler, who may call, flags, body limit (0: --max-body-bytes),
     * accepted Content-Types (NULL: any) */
    {"POST", "/v1/images/generations", DITD_ROUTE_GENERATIONS, ditd_route_generate, DITD_ROUTE_KEY,
     DITD_ROUTE_KEEP_BODY | DITD_ROUTE_NEW_WORK, 0, JSON},
    {"POST", "/images/generations", DITD_ROUTE_GENERATIONS, ditd_route_generate, DITD_ROUTE_KEY,
     DITD_ROUTE_KEEP_BODY | DITD_ROUTE_NEW_WORK, 0, JSON},
    /* OpenAI's image edit: the form its clients send, or JSON with base64 images; bodies
     * up to 48 MiB (an image and a mask; each image then under ditd_image_limits) */
    {"POST", "/v1/images/edits", DITD_ROUTE_EDITS, ditd_route_edit, DITD_ROUTE_KEY,
     DITD_ROUTE_KEEP_BODY | DITD_ROUTE_NEW_WORK, 48L << 20, JSON ",multipart/form-data"},
    {"POST", "/images/edits", DITD_ROUTE_EDITS, ditd_route_edit, DITD_ROUTE_KEY,
     DITD_ROUTE_KEEP_BODY | DITD_ROUTE_NEW_WORK, 48L << 20, JSON ",multipart/form-data"},
    {"GET", "/v1/models", DITD_ROUTE_MODELS, ditd_route_models, DITD_ROUTE_KEY, 0, 0, NULL},
    {"GET", "/v1/models/{name}", DITD_ROUTE_MODELS, ditd_route_model, DITD_ROUTE_KEY, 0, 0, NULL},
    {"GET", "/v1/loras", DITD_ROUTE_LORAS, ditd_route_loras, DITD_ROUTE_KEY, 0, 0, NULL},
    /* adapters at run time: an admin key, not an API key (docs/lora.md) */
    {"POST", "/v1/loras", DITD_ROUTE_LORAS, ditd_route_lora_load, DITD_ROUTE_ADMIN,
     DITD_ROUTE_KEEP_BODY, 16384, JSON},
    {"DELETE", "/v1/loras/{name}", DITD_ROUTE_LORAS, ditd_route_lora_unload, DITD_ROUTE_ADMIN, 0,
     0, NULL},
    {"GET", "/v1/jobs", DITD_ROUTE_JOBS, ditd_route_jobs_list, DITD_ROUTE_KEY, 0, 0, NULL},
    {"GET", "/v1/jobs/{id}", DITD_ROUTE_JOBS, ditd_route_job_get, DITD_ROUTE_KEY, 0, 0, NULL},
    {"DELETE", "/v1/jobs/{id}", DITD_ROUTE_JOBS, ditd_route_job_delete, DITD_ROUTE_KEY, 0, 0, NULL},
    {"GET", "/v1/jobs/{id}/content", DITD_ROUTE_JOBS, ditd_route_job_content, DITD_ROUTE_KEY, 0, 0,
     NULL},
    /* OpenAI's video create: JSON or its clients' form; up to 32 MiB (an input_reference,
     * then under ditd_image_limits, as base64 in JSON) */
    {"POST", "/v1/videos", DITD_ROUTE_VIDEOS, ditd_route_video_create, DITD_ROUTE_KEY,
     DITD_ROUTE_KEEP_BODY | DITD_ROUTE_NEW_WORK, 32L << 20, JSON ",multipart/form-data"},
    {"GET", "/v1/videos", DITD_ROUTE_VIDEOS, ditd_route_videos_list, DITD_ROUTE_KEY, 0, 0, NULL},
    {"GET", "/v1/videos/{id}", DITD_ROUTE_VIDEOS, ditd_route_video_get, DITD_ROUTE_KEY, 0, 0, NULL},
    {"DELETE", "/v1/videos/{id}", DITD_ROUTE_VIDEOS, ditd_route_video_delete, DITD_ROUTE_KEY, 0, 0,
     NULL},
    {"GET", "/v1/videos/{id}/content", DITD_ROUTE_VIDEOS, ditd_route_video_content, DITD_ROUTE_KEY,
     0, 0, NULL},
    {"GET", "/healthz", DITD_ROUTE_HEALTHZ, ditd_route_healthz, DITD_ROUTE_OPEN, 0, 0, NULL},
    {"GET", "/readyz", DITD_ROUTE_READYZ, ditd_route_readyz, DITD_ROUTE_OPEN, 0, 0, NULL},
    {"GET", "/metrics", DITD_ROUTE_METRICS, ditd_route_metrics, DITD_ROUTE_METRICS_KEY, 0, 0, NULL},
    {"GET", "/openapi.json", DITD_ROUTE_OPENAPI, ditd_route_openapi, DITD_ROUTE_OPEN, 0, 0, NULL},
    {"GET", "/", DITD_ROUTE_PAGE, ditd_route_page, DITD_ROUTE_OPEN, 0, 0, NULL},
};
const size_t ditd_routes_count = sizeof ditd_routes / sizeof ditd_routes[0];

/* path against pattern; on a match with a {id} or {name} segment, *id,
 * *id_len point into path. {id} is one segment (no '/'); {name}, which
 * ends a pattern, is the rest of the path (a model's name may hold '/'). */
static int path_match(const char *pat, const char *path, const char **id, size_t *id_len)
{
    const char *brace = strchr(pat, '{');
    *id = NULL;
    *id_len = 0;
    if (!brace)
        return !strcmp(pat, path);
    int rest = !strncmp(brace, "{name}", 6);
    size_t pre = (size_t)(brace - pat), plen = strlen(path);
    const char *suf = brace + (rest ? 6 : 4);
    size_t sl = strlen(suf);
    if (strncmp(pat, path, pre) || plen < pre + sl || strcmp(path + plen - sl, suf))
        return 0;
    *id = path + pre;
    *id_len = plen - pre - sl;
    return rest || (*id_len > 0 && !memchr(*id, '/', *id_len));
}

static int method_match(const char *row, const char *method)
{
    return !strcmp(row, method) || (!strcmp(row, "GET") && !strcmp(method, "HEAD"));
}

const ditd_route_row *ditd_route_find(const char *method, const char *path, char **id,
                                      char *allow, size_t allow_n, ditd_route *label)
{
    size_t at = 0;
    *id = NULL;
    if (allow_n)
        allow[0] = 0;
    *label = DITD_ROUTE_OTHER;
    for (size_t i = 0; i < ditd_routes_count; i++) {
        const ditd_route_row *r = &ditd_routes[i];
        const char *p;
        size_t n;
        if (!path_match(r->path, path, &p, &n))
            continue;
        *label = r->route;
        if (method_match(r->method, method)) {
            if (p && !(*id = strndup(p, n)))
                return NULL;
            return r;
        }
        if (at < allow_n) {
            int w = snprintf(allow + at, allow_n - at, "%s%s%s", at ? ", " : "", r->method,
                             !strcmp(r->method, "GET") ? ", HEAD" : "");
            at += w > 0 ? (size_t)w : 0;
        }
    }
    return NULL;
}

/* A Content-Type against a row's list ("application/json" takes any
 * "+json" type too). */
static int type_accepted(const char *types, const char *ct)
{
    size_t n;
    if (!types)
        return 1;
    if (!ct)
        return 0;
    while (*ct == ' ')
        ct++;
    n = strcspn(ct, "; ");
    for (const char *t = types; *t;) {
        size_t tl = strcspn(t, ",");
        if ((n == tl && !strncasecmp(ct, t, tl)) ||
            (tl == 16 && !strncmp(t, JSON, 16) && n > 5 && !strncasecmp(ct + n - 5, "+json", 5)))
            return 1;
        t += tl;
        while (*t == ',' || *t == ' ')
            t++;
    }
    return 0;
}

void ditd_route_owner(const char *key, char out[65])
{
    unsigned char d[32];
    static const char hex[] = "0123456789abcdef";
    if (gnutls_hash_fast(GNUTLS_DIG_SHA256, key, strlen(key), d) != 0) {
        out[0] = 0; /* cannot happen with GnuTLS's own digest; owns nothing then */
        return;
    }
    for (int i = 0; i < 32; i++) {
        out[2 * i] = hex[d[i] >> 4];
        out[2 * i + 1] = hex[d[i] & 15];
    }
    out[64] = 0;
}

static long row_max_body(const ditd_srv *s, const ditd_route_row *r)
{
    return r && r->max_body > 0 ? r->max_body : s->cfg.max_body_bytes;
}

/* ------------------------------------------------------------------ */
/* answering                                                           */

static const char oom_body[] =
    "{\"error\":{\"message\":\"the server could not build the answer\",\"type\":\"server_error\","
    "\"param\":null,\"code\":\"internal_error\"}}";

enum MHD_Result ditd_route_answer(ditd_srv *s, struct MHD_Connection *c, ditd_route route,
                                  int status, struct MHD_Response *r, size_t body_len)
{
    ditd_http_conn *hc = ditd_http_conn_of(c);
    enum MHD_Result ret;
    if (!r) {
        status = 500;
        body_len = sizeof oom_body - 1;
        r = MHD_create_response_from_buffer(body_len, (void *)oom_body, MHD_RESPMEM_PERSISTENT);
        if (!r)
            return MHD_NO;
        MHD_add_response_header(r, "Content-Type", "application/json");
        ditd_reply_headers(r, hc ? hc->rid : NULL);
    }
    ret = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    ditd_metrics_count_request(&s->m, route, status);
    if (hc) {
        hc->status = status;
        hc->bytes = body_len;
    }
    return ret;
}

enum MHD_Result ditd_route_answer_json(ditd_srv *s, struct MHD_Connection *c, ditd_route route,
                                       int status, json_t *root, const char *rid)
{
    char *txt = root ? json_dumps(root, JSON_COMPACT) : NULL;
    json_decref(root);
    size_t n = txt ? strlen(txt) : 0;
    return ditd_route_answer(s, c, route, status,
                             txt ? ditd_reply_buffer(txt, n, "application/json", rid) : NULL, n);
}

static enum MHD_Result answer_err_allow(ditd_srv *s, struct MHD_Connection *c, ditd_route route,
                                        const ditd_api_error *e, const char *rid, int retry_after,
                                        int close, const char *allow)
{
    size_t n = 0;
    struct MHD_Response *r = ditd_reply_error(e, rid, retry_after, &n);
    if (r && e->status == 405 && allow && *allow)
        MHD_add_response_header(r, "Allow", allow);
    if (r && e->status == 401)
        MHD_add_response_header(r, "WWW-Authenticate", "Bearer");
    if (r && close)
        MHD_add_response_header(r, "Connection", "close");
    return ditd_route_answer(s, c, route, e->status, r, n);
}

enum MHD_Result ditd_route_answer_err(ditd_srv *s, struct MHD_Connection *c, ditd_route route,
                                      const ditd_api_error *e, const char *rid, int retry_after,
                                      int close)
{
    return answer_err_allow(s, c, route, e, rid, retry_after, close, NULL);
}

/* ------------------------------------------------------------------ */
/* dispatch                                                            */

/* What the dispatch keeps beside the handler's request. */
typedef struct route_conn {
    ditd_route_req rq;        /* first: the handlers see this */
    char allow[64];           /* a 405's Allow */
} route_conn;

static int needs_key(const ditd_srv *s, const ditd_route_row *r)
{
    if (!r)
        return 1; /* an unknown path hears 401 before 404: it does not probe the table */
    return r->auth == DITD_ROUTE_KEY || (r->auth == DITD_ROUTE_METRICS_KEY && s->cfg.metrics_auth);
}

/* The request's headers are in: what its row decides before the body. */
static enum MHD_Result on_headers(ditd_srv *s, struct MHD_Connection *c, const char *url,
                                  const char *method, route_conn *rc)
{
    ditd_route_req *rq = &rc->rq;
    ditd_http_conn *hc = ditd_http_conn_of(c);
    const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
    const char *rid_in = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "X-Request-Id");
    const char *authz = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    ditd_api_error *e = &rq->refuse;
    const ditd_route_row *row;

    row = ditd_route_find(method, url, &rq->id, rc->allow, sizeof rc->allow, &rq->route);
    rq->row = row;
    rq->head = !strcmp(method, "HEAD");
    if (hc) {
        hc->requests++;
        hc->t_req = ditd__now();
        hc->status = 0;
        hc->bytes = 0;
        hc->route = (int)rq->route;
        snprintf(hc->method, sizeof hc->method, "%s", method);
        snprintf(hc->path, sizeof hc->path, "%s", url);
        ditd_job_make_rid(&s->jobs, rid_in, hc->rid, sizeof hc->rid);
        ditd_http_conn_set_phase(hc, DITD_HTTP_BODY);
    }
    /* a declared body over the limit is refused unread (the connection
     * closes: what follows the headers is not a request) */
    long max = row_max_body(s, row);
    if (cl && strtoll(cl, NULL, 10) > max) {
        ditd_api_error_set(e, 413, "invalid_request_error", "body_too_large", NULL,
                           "the body (%.20s bytes) is over the limit of %ld bytes", cl, max);
        return ditd_route_answer_err(s, c, rq->route, e, hc ? hc->rid : NULL, 0, 1);
    }
    /* a 405 is judged by the first row of the path */
    const ditd_route_row *path_row = row;
    if (!row && rc->allow[0])
        for (size_t i = 0; i < ditd_routes_count && !path_row; i++)
            if (ditd_routes[i].route == rq->route)
                path_row = &ditd_routes[i];
    if (row && row->auth == DITD_ROUTE_ADMIN) {
        /* the admin key alone (an API key is not one); routes off without it.
         * Another method on an admin path hears its 405 as any path does. */
        if (!ditd_auth_enabled(&s->admin)) {
            rq->refused = 1;
            ditd_api_error_set(e, 403, "invalid_request_error", "admin_disabled", NULL,
                               "adapter administration is off on this server: start ditd serve "
                               "with --admin-key (DITD_ADMIN_KEY) or --admin-key-file");
            return MHD_YES;
        }
        if (ditd_auth_match(&s->admin, authz) < 0) {
            rq->refused = 1;
            ditd_api_error_set(e, 401, "invalid_request_error", "invalid_admin_key", NULL,
                               authz ? "Incorrect admin key provided. Send Authorization: Bearer "
                                       "<admin key> (--admin-key)."
                                     : "This route needs an admin key. Send Authorization: Bearer "
                                       "<admin key> (--admin-key).");
            return MHD_YES;
        }
    } else if (ditd_auth_enabled(&s->auth) && needs_key(s, path_row)) {
        int k = ditd_auth_match(&s->auth, authz);
        if (k < 0) {
            rq->refused = 1;
            ditd_api_error_set(e, 401, "invalid_request_error", "invalid_api_key", NULL,
                               authz ? "Incorrect API key provided. Send Authorization: Bearer <key>."
                                     : "You didn't provide an API key. Send Authorization: Bearer <key>.");
            return MHD_YES;
        }
        ditd_route_owner(s->auth.keys[k], rq->owner);
    }
    if (!row) {
        if (rc->allow[0]) {
            rq->refused = 1;
            ditd_api_error_set(e, 405, "invalid_request_error", "method_not_allowed", NULL,
                               "%.20s is not allowed on %.200s; allowed: %s", method, url, rc->allow);
        }
        return MHD_YES; /* no route: 404 once the body is read away */
    }
    if ((row->flags & DITD_ROUTE_NEW_WORK) && s->draining) {
        rq->refused = 1;
        ditd_api_error_set(e, 503, "server_error", "draining", NULL,
                           "the server is shutting down; retry on another instance");
        return MHD_YES;
    }
    if (!type_accepted(row->types, MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Type"))) {
        rq->refused = 1;
        if (!strcmp(row->types, JSON))
            ditd_api_error_set(e, 415, "invalid_request_error", "unsupported_media_type", NULL,
                               "the body must be JSON: send Content-Type: application/json");
        else
            ditd_api_error_set(e, 415, "invalid_request_error", "unsupported_media_type", NULL,
                               "the body must be one of: %s", row->types);
        return MHD_YES;
    }
    return MHD_YES;
}

/* Part of a body: kept for a row that keeps it, counted and dropped
 * otherwise. */
static void on_body(ditd_srv *s, ditd_route_req *rq, const char *data, size_t n)
{
    size_t max = (size_t)row_max_body(s, rq->row);
    if (rq->too_large)
        return;
    if (!rq->row || rq->refused || !(rq->row->flags & DITD_ROUTE_KEEP_BODY)) {
        rq->body_seen += n;
        rq->too_large = rq->body_seen > max;
        return;
    }
    if (rq->body_len + n > max) {
        /* a chunked body gets here: the rest is read away (within
         * --body-timeout) and the answer is 413 */
        rq->too_large = 1;
        free(rq->body);
        rq->body = NULL;
        rq->body_len = rq->body_cap = 0;
        return;
    }
    if (rq->body_len + n > rq->body_cap) {
        size_t cap = (rq->body_len + n) * 2;
        if (cap > max)
            cap = max;
        char *p = realloc(rq->body, cap);
        if (!p) {
            rq->too_large = 1; /* cannot keep it: answered as too large */
            return;
        }
        rq->body = p;
        rq->body_cap = cap;
    }
    memcpy(rq->body + rq->body_len, data, n);
    rq->body_len += n;
}

enum MHD_Result ditd__on_request(void *cls, struct MHD_Connection *c, const char *url,
                                 const char *method, const char *version, const char *upload,
                                 size_t *upload_size, void **ctx)
{
    ditd_srv *s = cls;
    route_conn *rc = *ctx;

    if (!rc) {
        if (!(rc = calloc(1, sizeof *rc)))
            return MHD_NO;
        *ctx = rc;
        rc->rq.http10 = version && !strcmp(version, MHD_HTTP_VERSION_1_0);
        return on_headers(s, c, url, method, rc);
    }
    ditd_route_req *rq = &rc->rq;
    if (!rq->handled) {
        if (*upload_size) {
            on_body(s, rq, upload, *upload_size);
            *upload_size = 0;
            return MHD_YES;
        }
        /* the whole body is in */
        ditd_http_conn *hc = ditd_http_conn_of(c);
        const char *rid = hc ? hc->rid : NULL;
        ditd_http_conn_set_phase(hc, DITD_HTTP_BUSY);
        rq->handled = 1;
        if (rq->too_large) {
            ditd_api_error e;
            ditd_api_error_set(&e, 413, "invalid_request_error", "body_too_large", NULL,
                               "the body is over the limit of %ld bytes", row_max_body(s, rq->row));
            return ditd_route_answer_err(s, c, rq->route, &e, rid, 0, 1);
        }
        if (rq->refused)
            return answer_err_allow(s, c, rq->route, &rq->refuse, rid,
                                    rq->refuse.status == 503 ? 5 : 0, 0, rc->allow);
        if (!rq->row) {
            ditd_api_error e;
            ditd_api_error_set(&e, 404, "invalid_request_error", "not_found", NULL,
                               "no route %.200s", url);
            return ditd_route_answer_err(s, c, rq->route, &e, rid, 0, 0);
        }
        return rq->row->fn(s, c, rq, rid);
    }
    /* resumed: an admin request's answer, or a waiting generation */
    if (rq->resp) {
        struct MHD_Response *r = rq->resp;
        rq->resp = NULL;
        return ditd_route_answer(s, c, rq->route, rq->resp_status, r, rq->resp_len);
    }
    ditd_job *j = rq->job;
    if (!j)
        return MHD_NO;
    if (j->resp) {
        struct MHD_Response *r = j->resp;
        j->resp = NULL;
        j->status = j->resp_status;
        return ditd_route_answer(s, c, rq->route, j->resp_status, r, j->resp_len);
    }
    if (j->outcome == DITD_JOB_CANCELED)
        return MHD_NO; /* the client is gone: close */
    /* woken without an answer: wait again */
    j->suspended = 1;
    MHD_suspend_connection(c);
    return MHD_YES;
}

void ditd__on_completed(void *cls, struct MHD_Connection *c, void **ctx,
                        enum MHD_RequestTerminationCode toe)
{
    ditd_srv *s = cls;
    ditd_route_req *rq = *ctx;
    ditd_http_conn *hc = ditd_http_conn_of(c);
    ditd_job *j = rq ? rq->job : NULL;
    *ctx = NULL;
    if (j && j->state != DITD_JOB_BODY && !ditd_job_terminal(j)) {
        /* the client went away (or the stream write failed) */
        ditd_log(DITD_LOG_INFO, "request %s: client gone (%d); canceling", j->rid, (int)toe);
        ditd_job_cancel(j);
        ditd__sched_withdraw(s, j);
    } else if (j && toe == MHD_REQUEST_TERMINATED_COMPLETED_OK && j->status == 200) {
        ditd_hist_observe(&s->m.latency, ditd__now() - j->t_arrive);
    }
    if (hc && rq) {
        int status = hc->status;
        if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK && (status == 0 || (j && j->rq.stream)))
            status = status ? status : 499; /* nginx's "client closed request" */
        ditd_log_access a = {hc->method, hc->path, ditd_route_name(rq->route), hc->rid, hc->peer,
                             status, rq->head ? 0 : hc->bytes, (ditd__now() - hc->t_req) * 1e3};
        if (s->cfg.log_requests)
            ditd_log_request(&a);
        ditd_http_conn_set_phase(hc, DITD_HTTP_HEADERS);
    }
    if (j) {
        if (j->state == DITD_JOB_BODY)
            ditd_job_refuse(j);
        j->conn = NULL;
        j->suspended = 0;
        ditd_job_unref(j);
    }
    if (rq) {
        if (rq->waiting && rq->gone)
            rq->gone(s, rq);
        if (rq->resp)
            MHD_destroy_response(rq->resp);
        free(rq->id);
        free(rq->body);
    }
    free(rq);
}

/* ------------------------------------------------------------------ */
/* the watch                                                           */

/* True when the client of a suspended connection is gone (a waiting
 * request is not polled by libmicrohttpd, so it would not notice).
 *
 * An end of stream alone does not say it: a client that half-closed
 * (shutdown(SHUT_WR) after its request, as some proxies do) still reads.
 * So on the first end of stream an interim answer is written,
 * "HTTP/1.1 102 Processing" (HTTP/1.1 clients read past 1xx answers); a
 * client that closed for good answers it with a reset, which the next look
 * sees. An HTTP/1.0 client must never get a 1xx answer (RFC 9110 15.2):
 * for it an end of stream is taken as a half-close, and --request-timeout
 * ends the wait of one that is gone. Over TLS nothing can be written
 * outside the session: an end of stream means gone. */
static int peer_gone(ditd_srv *s, struct MHD_Connection *c, ditd_job *j)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    char b;
    ssize_t n;
    if (!ci)
        return 0;
    n = recv(ci->connect_fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n < 0)
        return errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
    if (n > 0)
        return 0; /* a pipelined request waits its turn */
    if (s->cfg.tls_cert[0])
        return 1;
    if (j->http10)
        return 0;
    if (!j->probed) {
        static const char probe[] = "HTTP/1.1 102 Processing\r\n\r\n";
        j->probed = 1;
        return send(ci->connect_fd, probe, sizeof probe - 1, MSG_NOSIGNAL | MSG_DONTWAIT) < 0;
    }
    /* the reset closes the socket (recv keeps saying end of stream) */
    struct tcp_info ti;
    socklen_t tl = sizeof ti;
    int err = 0;
    socklen_t el = sizeof err;
    if (getsockopt(ci->connect_fd, SOL_SOCKET, SO_ERROR, &err, &el) == 0 && err)
        return 1;
    return getsockopt(ci->connect_fd, IPPROTO_TCP, TCP_INFO, &ti, &tl) == 0 && ti.tcpi_state == TCP_CLOSE;
}

void ditd__jobs_watch(ditd_srv *s)
{
    double now = ditd__now();
    ditd_job *next;
    for (ditd_job *j = s->jobs.head; j; j = next) {
        ditd_job_ref(j);
        if (!ditd_job_terminal(j) && j->state == DITD_JOB_WAITING && !j->background) {
            if (now - j->t_arrive > s->cfg.request_timeout_s) {
                s->m.timeouts_total++;
                ditd__sched_fail(s, j, 504, "server_error", "timeout",
                                 "the request took longer than %g s (--request-timeout)",
                                 s->cfg.request_timeout_s);
            } else if (j->conn && j->suspended && !j->rq.stream) {
                if (peer_gone(s, j->conn, j)) {
                    ditd_log(DITD_LOG_INFO, "request %s: client gone while waiting; canceling", j->rid);
                    ditd_job_cancel(j);
                    ditd__sched_withdraw(s, j);
                    ditd_reply_resume(j); /* libmicrohttpd then sees the close */
                }
            }
        }
        if (j->rq.stream && j->conn && !j->stream_end && j->state != DITD_JOB_BODY &&
            now >= j->next_keepalive)
            ditd_reply_keepalive(j);
        next = j->all_next;
        ditd_job_unref(j);
    }
}
