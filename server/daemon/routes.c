/* HTTP routes: the request callbacks of libmicrohttpd, authentication,
 * validation and submission of generations, the GET routes, and the watch
 * over waiting requests. Loop thread only. Responses and streams are
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

#include "engine/core/error.h"
#include "proto/openapi.h"
#include "server/daemon/log.h"
#include "server/daemon/page.h"
#include "server/daemon/reply.h"
#include "server/daemon/sched.h"
#include "server/daemon/serve.h"

/* One request, from its headers to its end. */
typedef struct route_req {
    ditd_route route;
    int head;                 /* HEAD: no body is sent */
    ditd_job *job;            /* generations: a ref (the connection's) */
    ditd_api_error refuse;    /* decided at the headers, answered at the end */
    int refused;
    size_t body_seen;         /* bytes of a body that is not kept */
    int too_large;            /* the body passed --max-body-bytes */
} route_req;

/* ------------------------------------------------------------------ */
/* answering                                                           */

static const char oom_body[] =
    "{\"error\":{\"message\":\"the server could not build the answer\",\"type\":\"server_error\","
    "\"param\":null,\"code\":\"internal_error\"}}";

/* Queues r (NULL: a fixed 500, so that a request is never dropped without
 * an answer), counts it and records it for the access log. */
static enum MHD_Result answer(ditd_srv *s, struct MHD_Connection *c, ditd_route route, int status,
                              struct MHD_Response *r, size_t body_len)
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

static enum MHD_Result answer_json(ditd_srv *s, struct MHD_Connection *c, ditd_route route,
                                   int status, json_t *root, const char *rid)
{
    char *txt = root ? json_dumps(root, JSON_COMPACT) : NULL;
    json_decref(root);
    size_t n = txt ? strlen(txt) : 0;
    return answer(s, c, route, status, txt ? ditd_reply_buffer(txt, n, "application/json", rid) : NULL, n);
}

static enum MHD_Result answer_err(ditd_srv *s, struct MHD_Connection *c, ditd_route route,
                                  const ditd_api_error *e, const char *rid, int retry_after,
                                  int close)
{
    size_t n = 0;
    struct MHD_Response *r = ditd_reply_error(e, rid, retry_after, &n);
    if (r && e->status == 405)
        MHD_add_response_header(r, "Allow", route == DITD_ROUTE_GENERATIONS ? "POST" : "GET, HEAD");
    if (r && e->status == 401)
        MHD_add_response_header(r, "WWW-Authenticate", "Bearer");
    if (r && close)
        MHD_add_response_header(r, "Connection", "close");
    return answer(s, c, route, e->status, r, n);
}

/* ------------------------------------------------------------------ */
/* routes                                                              */

static ditd_route route_of(const char *url)
{
    if (!strcmp(url, "/v1/images/generations") || !strcmp(url, "/images/generations"))
        return DITD_ROUTE_GENERATIONS;
    if (!strcmp(url, "/v1/models") || !strncmp(url, "/v1/models/", 11))
        return DITD_ROUTE_MODELS;
    if (!strcmp(url, "/healthz"))
        return DITD_ROUTE_HEALTHZ;
    if (!strcmp(url, "/readyz"))
        return DITD_ROUTE_READYZ;
    if (!strcmp(url, "/metrics"))
        return DITD_ROUTE_METRICS;
    if (!strcmp(url, "/openapi.json"))
        return DITD_ROUTE_OPENAPI;
    if (!strcmp(url, "/"))
        return DITD_ROUTE_PAGE;
    return DITD_ROUTE_OTHER;
}

/* Routes open without a key: probes, the API's description, and the page
 * (static; the calls it makes carry the key its user types in). */
static int route_open(const ditd_srv *s, ditd_route r)
{
    return r == DITD_ROUTE_HEALTHZ || r == DITD_ROUTE_READYZ || r == DITD_ROUTE_OPENAPI ||
           r == DITD_ROUTE_PAGE ||
           (r == DITD_ROUTE_METRICS && !s->cfg.metrics_auth);
}

/* One entry of GET /v1/models: the served model under one of its names
 * (its folder's or an alias; "root" is the folder's). docs/api.md shows
 * the shape. NULL on out of memory. */
static json_t *model_json(ditd_srv *s, const char *id)
{
    const ditd_model_info *m = &s->info;
    int text = m->shapes.cond.kind == DITD_COND_TEXT;
    char size[32];
    json_t *o = json_object(), *sizes = json_array(), *samplers = json_array();
    json_t *defaults = json_object(), *range = json_object();
    if (!o || !sizes || !samplers || !defaults || !range) {
        json_decref(o), json_decref(sizes), json_decref(samplers), json_decref(defaults),
            json_decref(range);
        return NULL;
    }
    snprintf(size, sizeof size, "%dx%d", m->image_width, m->image_height);
    json_object_set_new(o, "id", json_string(id));
    json_object_set_new(o, "object", json_string("model"));
    json_object_set_new(o, "created", json_integer((json_int_t)s->t_wall));
    json_object_set_new(o, "owned_by", json_string("ditd"));
    json_object_set_new(o, "root", json_string(m->name));
    json_object_set_new(o, "architecture", json_string(m->denoiser_class));
    json_object_set_new(o, "conditioning", json_string(text ? "text" : "class"));
    if (!text) {
        json_t *classes = json_array();
        for (int i = 0; classes && i < m->num_classes; i++)
            json_array_append_new(classes, json_pack("{s:i,s:s}", "id", i, "label", m->labels[i]));
        json_object_set_new(o, "classes", classes);
        json_object_set_new(o, "num_classes", json_integer(m->num_classes));
    } else {
        json_object_set_new(o, "max_sequence_length", json_integer(m->max_sequence_length));
        json_object_set_new(o, "max_prompt_bytes", json_integer(DITD_GENREQ_MAX_PROMPT_BYTES));
    }
    /* sizes: the one a fixed model makes; a resizable model's default,
     * with the range it takes in size_range */
    json_array_append_new(sizes, json_string(size));
    json_object_set_new(o, "sizes", sizes);
    json_object_set_new(range, "resizable", json_boolean(m->resizable));
    json_object_set_new(range, "default", json_string(size));
    if (m->resizable) {
        json_object_set_new(range, "min", json_integer(m->min_size));
        json_object_set_new(range, "max", json_integer(m->max_size));
        json_object_set_new(range, "multiple", json_integer(m->size_multiple));
    }
    json_object_set_new(o, "size_range", range);
    json_object_set_new(o, "channels", json_integer(m->image_channels));
    json_object_set_new(defaults, "num_inference_steps", json_integer(m->default_steps));
    json_object_set_new(defaults, "guidance_scale", json_real((double)m->default_guidance));
    json_object_set_new(defaults, "sampler", json_string(ditd_sampler_kind_name(s->sched_default)));
    json_object_set_new(defaults, "size", json_string(size));
    if (text) {
        json_object_set_new(defaults, "max_sequence_length",
                            json_integer(m->default_max_sequence_length));
        json_object_set_new(defaults, "true_cfg_scale", json_real(1.0));
    }
    json_object_set_new(o, "defaults", defaults);
    for (int k = 0; k < DITD_SAMPLER_KIND_COUNT; k++)
        json_array_append_new(samplers, json_string(ditd_sampler_kind_name((ditd_sampler_kind)k)));
    json_object_set_new(o, "samplers", samplers);
    json_object_set_new(o, "max_n", json_integer(DITD_GENREQ_MAX_N));
    return o;
}

static enum MHD_Result get_route(ditd_srv *s, struct MHD_Connection *c, ditd_route route,
                                 const char *url, const char *rid)
{
    ditd_api_error e;
    json_t *root;
    switch (route) {
    case DITD_ROUTE_MODELS:
        if (!strncmp(url, "/v1/models/", 11)) {
            if (!ditd_genreq_model_named(&s->gm, url + 11)) {
                ditd_api_error_set(&e, 404, "invalid_request_error", "model_not_found", "model",
                                   "no model '%.200s'; this server has '%s'", url + 11, s->info.name);
                return answer_err(s, c, route, &e, rid, 0, 0);
            }
            return answer_json(s, c, route, 200, model_json(s, url + 11), rid);
        }
        {
            /* every name is an entry (as vLLM lists its served names),
             * the folder's first */
            json_t *data = json_array();
            int ok = data && !json_array_append_new(data, model_json(s, s->info.name));
            for (int i = 0; ok && i < s->gm.n_aliases; i++)
                ok = !json_array_append_new(data, model_json(s, s->gm.aliases[i]));
            root = ok ? json_pack("{s:s,s:o}", "object", "list", "data", data) : NULL;
            if (!ok)
                json_decref(data);
        }
        return answer_json(s, c, route, 200, root, rid);
    case DITD_ROUTE_HEALTHZ: {
        /* alive while one replica is: a stalled replica is reported, and
         * routed around, but does not make the process look dead */
        double now = ditd__now();
        int alive_n = 0;
        json_t *reps = json_array();
        for (int r = 0; r < s->nrep; r++) {
            double age = s->rep[r].last_hb > 0 ? now - s->rep[r].last_hb : -1;
            int alive = ditd__sched_replica_alive(s, r);
            alive_n += alive;
            json_array_append_new(reps, json_pack("{s:i,s:b,s:b,s:f,s:b}", "replica", r, "alive",
                                                  alive, "ready", s->rep[r].ready,
                                                  "last_heartbeat_s", age, "busy",
                                                  s->rep[r].running != NULL));
        }
        const char *st = alive_n == 0 ? "unhealthy" : alive_n < s->nrep ? "degraded" : "ok";
        root = json_pack("{s:s,s:i,s:i,s:o}", "status", st, "replicas_alive", alive_n,
                         "replicas_total", s->nrep, "replicas", reps);
        return answer_json(s, c, route, alive_n ? 200 : 503, root, rid);
    }
    case DITD_ROUTE_READYZ: {
        int up = ditd__sched_replicas_up(s);
        const char *why = s->draining ? "draining" : up == 0 ? "no replica ready"
                          : s->q_len >= s->cfg.max_queue ? "queue full" : NULL;
        root = json_pack("{s:s,s:i,s:i,s:i,s:b}", "status", why ? why : "ready", "replicas_up", up,
                         "queue_depth", s->q_len, "max_queue", s->cfg.max_queue, "draining", s->draining);
        return answer_json(s, c, route, why ? 503 : 200, root, rid);
    }
    case DITD_ROUTE_METRICS: {
        ditd_metrics_gauges g = {.model = s->info.name,
                                 .queue_depth = s->q_len,
                                 .running_batches = ditd__sched_running(s),
                                 .replicas = s->nrep,
                                 .replicas_up = ditd__sched_replicas_up(s),
                                 .draining = s->draining,
                                 .connections = s->http.n_conns,
                                 .refused_capacity = s->http.refused_capacity,
                                 .refused_per_client = s->http.refused_per_client,
                                 .read_timeouts = s->http.read_timeouts,
                                 .evicted = s->http.evicted};
        for (ditd_job *j = s->jobs.head; j; j = j->all_next)
            g.inflight_requests += j->state == DITD_JOB_WAITING;
        for (int r = 0; r < s->nrep; r++) {
            g.text_cache_hits += s->rep[r].text_hits;
            g.text_cache_misses += s->rep[r].text_misses;
            g.text_cache_entries += s->rep[r].text_entries;
            g.text_encode_s += s->rep[r].text_encode_ms / 1e3;
        }
        size_t len = 0;
        char *text = ditd_metrics_render(&s->m, &g, &len);
        return answer(s, c, route, 200,
                      text ? ditd_reply_buffer(text, len, "text/plain; version=0.0.4; charset=utf-8", rid)
                           : NULL,
                      len);
    }
    case DITD_ROUTE_OPENAPI: {
        struct MHD_Response *r = MHD_create_response_from_buffer(
            ditd_openapi_json_len, (void *)ditd_openapi_json, MHD_RESPMEM_PERSISTENT);
        if (r) {
            MHD_add_response_header(r, "Content-Type", "application/json");
            ditd_reply_headers(r, rid);
        }
        return answer(s, c, route, 200, r, ditd_openapi_json_len);
    }
    case DITD_ROUTE_PAGE: {
        struct MHD_Response *r = ditd_page_response();
        if (r)
            ditd_reply_headers(r, rid);
        return answer(s, c, route, 200, r, ditd_page_html_len);
    }
    default:
        ditd_api_error_set(&e, 404, "invalid_request_error", "not_found", NULL, "no route %.200s", url);
        return answer_err(s, c, route, &e, rid, 0, 0);
    }
}

static int is_json_type(const char *ct)
{
    size_t n;
    if (!ct)
        return 0;
    while (*ct == ' ')
        ct++;
    n = strcspn(ct, "; ");
    return (n == 16 && !strncasecmp(ct, "application/json", 16)) ||
           (n > 5 && !strncasecmp(ct + n - 5, "+json", 5));
}

/* The body is in: validate, queue, and either stream or wait. */
static enum MHD_Result start_generation(ditd_srv *s, struct MHD_Connection *c, ditd_job *j)
{
    ditd_api_error e;
    ditd_genreq rq;
    int st;
    if (ditd_genreq_parse(j->body ? j->body : "", j->body_len, &s->gm, &rq, &e)) {
        ditd_job_refuse(j);
        return answer_err(s, c, DITD_ROUTE_GENERATIONS, &e, j->rid, 0, 0);
    }
    free(j->body);
    j->body = NULL;
    if (ditd_job_accept(j, &rq, ditd_genreq_numel(&rq, &s->info))) {
        ditd_genreq_free(&rq);
        ditd_job_refuse(j);
        ditd_api_error_set(&e, 500, "server_error", "internal_error", NULL, "out of memory");
        return answer_err(s, c, DITD_ROUTE_GENERATIONS, &e, j->rid, 0, 0);
    }
    if ((st = ditd__sched_submit(s, j, &e))) {
        ditd_job_refuse(j); /* nothing of it is out */
        return answer_err(s, c, DITD_ROUTE_GENERATIONS, &e, j->rid,
                          st == 429 ? ditd__sched_retry_after(s) : st == 503 ? 5 : 0, 0);
    }
    if (j->rq.stream) {
        j->status = 200;
        return answer(s, c, DITD_ROUTE_GENERATIONS, 200, ditd_reply_stream(j), 0);
    }
    j->suspended = 1;
    MHD_suspend_connection(c);
    return MHD_YES;
}

/* The request's headers are in: what is decided before the body. */
static enum MHD_Result on_headers(ditd_srv *s, struct MHD_Connection *c, const char *url,
                                  const char *method, route_req *rq)
{
    ditd_http_conn *hc = ditd_http_conn_of(c);
    const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
    const char *rid_in = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "X-Request-Id");
    int is_get = !strcmp(method, "GET") || !strcmp(method, "HEAD");
    ditd_api_error *e = &rq->refuse;

    rq->route = route_of(url);
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
    if (cl && strtoll(cl, NULL, 10) > s->cfg.max_body_bytes) {
        ditd_api_error_set(e, 413, "invalid_request_error", "body_too_large", NULL,
                           "the body (%.20s bytes) is over the limit of %ld bytes", cl,
                           s->cfg.max_body_bytes);
        return answer_err(s, c, rq->route, e, hc ? hc->rid : NULL, 0, 1);
    }
    if (ditd_auth_enabled(&s->auth) && !route_open(s, rq->route) &&
        !ditd_auth_check(&s->auth, MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization"))) {
        rq->refused = 1;
        ditd_api_error_set(e, 401, "invalid_request_error", "invalid_api_key", NULL,
                           MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization")
                               ? "Incorrect API key provided. Send Authorization: Bearer <key>."
                               : "You didn't provide an API key. Send Authorization: Bearer <key>.");
        return MHD_YES;
    }
    if (rq->route != DITD_ROUTE_GENERATIONS) {
        if (rq->route != DITD_ROUTE_OTHER && !is_get) {
            rq->refused = 1;
            ditd_api_error_set(e, 405, "invalid_request_error", "method_not_allowed", NULL,
                               "%.20s is not allowed on %.200s; allowed: GET, HEAD", method, url);
        }
        return MHD_YES;
    }
    if (strcmp(method, "POST") != 0) {
        rq->refused = 1;
        ditd_api_error_set(e, 405, "invalid_request_error", "method_not_allowed", NULL,
                           "%.20s is not allowed on %.200s; allowed: POST", method, url);
        return MHD_YES;
    }
    if (s->draining) {
        rq->refused = 1;
        ditd_api_error_set(e, 503, "server_error", "draining", NULL,
                           "the server is shutting down; retry on another instance");
        return MHD_YES;
    }
    if (!is_json_type(MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Type"))) {
        rq->refused = 1;
        ditd_api_error_set(e, 415, "invalid_request_error", "unsupported_media_type", NULL,
                           "the body must be JSON: send Content-Type: application/json");
        return MHD_YES;
    }
    if (!(rq->job = ditd_job_new(&s->jobs, s, &ditd_reply_sink, hc ? hc->rid : NULL)))
        return MHD_NO;
    rq->job->conn = c;
    const char *acc = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Accept");
    rq->job->want_png = acc && strstr(acc, "image/png") != NULL;
    return MHD_YES;
}

/* Part of a body: kept for a generation, counted and dropped otherwise. */
static void on_body(ditd_srv *s, route_req *rq, const char *data, size_t n)
{
    ditd_job *j = rq->job;
    if (rq->too_large)
        return;
    if (!j || rq->refused) {
        rq->body_seen += n;
        rq->too_large = rq->body_seen > (size_t)s->cfg.max_body_bytes;
        return;
    }
    if (j->body_len + n > (size_t)s->cfg.max_body_bytes) {
        /* a chunked body gets here: the rest is read away (within
         * --body-timeout) and the answer is 413 */
        rq->too_large = 1;
        free(j->body);
        j->body = NULL;
        j->body_len = j->body_cap = 0;
        return;
    }
    if (j->body_len + n > j->body_cap) {
        size_t cap = (j->body_len + n) * 2;
        if (cap > (size_t)s->cfg.max_body_bytes)
            cap = (size_t)s->cfg.max_body_bytes;
        char *p = realloc(j->body, cap);
        if (!p) {
            rq->too_large = 1; /* cannot keep it: answered as too large */
            return;
        }
        j->body = p;
        j->body_cap = cap;
    }
    memcpy(j->body + j->body_len, data, n);
    j->body_len += n;
}

enum MHD_Result ditd__on_request(void *cls, struct MHD_Connection *c, const char *url,
                                 const char *method, const char *version, const char *upload,
                                 size_t *upload_size, void **ctx)
{
    ditd_srv *s = cls;
    route_req *rq = *ctx;
    (void)version;

    if (!rq) {
        if (!(rq = calloc(1, sizeof *rq)))
            return MHD_NO;
        *ctx = rq;
        return on_headers(s, c, url, method, rq);
    }
    ditd_job *j = rq->job;
    if (!j || j->state == DITD_JOB_BODY) {
        if (*upload_size) {
            on_body(s, rq, upload, *upload_size);
            *upload_size = 0;
            return MHD_YES;
        }
        /* the whole body is in */
        ditd_http_conn *hc = ditd_http_conn_of(c);
        const char *rid = hc ? hc->rid : NULL;
        ditd_http_conn_set_phase(hc, DITD_HTTP_BUSY);
        if (rq->too_large) {
            ditd_api_error e;
            if (j)
                ditd_job_refuse(j);
            ditd_api_error_set(&e, 413, "invalid_request_error", "body_too_large", NULL,
                               "the body is over the limit of %ld bytes", s->cfg.max_body_bytes);
            return answer_err(s, c, rq->route, &e, rid, 0, 1);
        }
        if (rq->refused)
            return answer_err(s, c, rq->route, &rq->refuse, rid, rq->refuse.status == 503 ? 5 : 0, 0);
        if (!j)
            return get_route(s, c, rq->route, url, rid);
        return start_generation(s, c, j);
    }
    /* resumed with an answer */
    if (j->resp) {
        struct MHD_Response *r = j->resp;
        j->resp = NULL;
        j->status = j->resp_status;
        return answer(s, c, DITD_ROUTE_GENERATIONS, j->resp_status, r, j->resp_len);
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
    route_req *rq = *ctx;
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
 * "HTTP/1.1 102 Processing" (every HTTP/1.1 client reads past 1xx
 * answers); a client that closed for good answers it with a reset, which
 * the next look sees. Over TLS nothing can be written outside the
 * session: an end of stream means gone. */
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
        if (!ditd_job_terminal(j) && j->state == DITD_JOB_WAITING) {
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
