/* HTTP routes, responses, SSE streams and the encode work. Loop thread,
 * except encode_work(), which runs on libuv's work queue and touches only
 * its own copy of the pixels. */
#include <errno.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>

#include "engine/core/error.h"
#include "proto/openapi.h"
#include "server/image.h"
#include "server/serve.h"

/* ------------------------------------------------------------------ */
/* jobs                                                                */

ditd_job *ditd__job_new(ditd_srv *s, struct MHD_Connection *conn)
{
    ditd_job *j = calloc(1, sizeof *j);
    if (!j)
        return NULL;
    j->refs = 1; /* the connection's */
    j->s = s;
    j->conn = conn;
    j->id = ++s->next_job;
    snprintf(j->rid, sizeof j->rid, "req-%llx-%llu", (unsigned long long)(s->t_start * 1000) & 0xffffff,
             (unsigned long long)j->id);
    j->t_arrive = ditd__now();
    j->ev_tail = &j->ev_head;
    j->all_next = s->all;
    if (s->all)
        s->all->all_prev = j;
    s->all = j;
    s->jobs_live++;
    return j;
}

void ditd__job_ref(ditd_job *j)
{
    j->refs++;
}

void ditd__job_unref(ditd_job *j)
{
    if (--j->refs > 0)
        return;
    ditd_srv *s = j->s;
    if (j->all_prev)
        j->all_prev->all_next = j->all_next;
    else
        s->all = j->all_next;
    if (j->all_next)
        j->all_next->all_prev = j->all_prev;
    s->jobs_live--;
    while (j->ev_head) {
        ditd_sse_ev *e = j->ev_head;
        j->ev_head = e->next;
        free(e->text);
        free(e);
    }
    if (j->resp)
        MHD_destroy_response(j->resp);
    free(j->out);
    free(j->body);
    free(j->pixels);
    free(j);
}

void ditd__job_resume(ditd_job *j)
{
    if (j->conn && j->suspended) {
        j->suspended = 0;
        MHD_resume_connection(j->conn);
        ditd__mhd_kick(j->s);
    }
}

/* ------------------------------------------------------------------ */
/* responses                                                           */

static void add_common_headers(struct MHD_Response *r, const char *rid)
{
    MHD_add_response_header(r, "Server", "ditd/" "0.1");
    if (rid)
        MHD_add_response_header(r, "X-Request-Id", rid);
}

static struct MHD_Response *buffer_response(char *body, size_t len, const char *ctype, const char *rid)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(body);
        return NULL;
    }
    MHD_add_response_header(r, "Content-Type", ctype);
    add_common_headers(r, rid);
    return r;
}

static enum MHD_Result queue(ditd_srv *s, struct MHD_Connection *c, ditd_route route, int status,
                             struct MHD_Response *r)
{
    enum MHD_Result ret;
    if (!r)
        return MHD_NO;
    ret = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    ditd_metrics_count_request(&s->m, route, status);
    return ret;
}

static struct MHD_Response *json_response(json_t *root, const char *rid)
{
    char *s = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    if (!s)
        return NULL;
    return buffer_response(s, strlen(s), "application/json", rid);
}

static struct MHD_Response *error_response(const ditd_api_error *e, const char *rid, int retry_after)
{
    char *body = ditd_api_error_json(e);
    struct MHD_Response *r;
    if (!body)
        return NULL;
    r = buffer_response(body, strlen(body), "application/json", rid);
    if (r && retry_after > 0) {
        char ra[16];
        snprintf(ra, sizeof ra, "%d", retry_after);
        MHD_add_response_header(r, "Retry-After", ra);
    }
    return r;
}

static enum MHD_Result answer_error(ditd_srv *s, struct MHD_Connection *c, ditd_route route,
                                    const char *rid, int status, const char *type, const char *code,
                                    const char *param, const char *msg)
{
    ditd_api_error e;
    ditd_api_error_set(&e, status, type, code, param, "%s", msg);
    struct MHD_Response *r = error_response(&e, rid, 0);
    if (r && status == 413)
        MHD_add_response_header(r, "Connection", "close");
    return queue(s, c, route, status, r);
}

/* ------------------------------------------------------------------ */
/* base64 and encoding                                                 */

static char *base64(const uint8_t *p, size_t n, size_t *out_len)
{
    static const char tab[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t len = 4 * ((n + 2) / 3);
    char *o = malloc(len + 1), *q = o;
    if (!o)
        return NULL;
    size_t i = 0;
    for (; i + 2 < n; i += 3) {
        uint32_t v = (uint32_t)p[i] << 16 | (uint32_t)p[i + 1] << 8 | p[i + 2];
        *q++ = tab[v >> 18];
        *q++ = tab[(v >> 12) & 63];
        *q++ = tab[(v >> 6) & 63];
        *q++ = tab[v & 63];
    }
    if (i < n) {
        uint32_t v = (uint32_t)p[i] << 16 | (i + 1 < n ? (uint32_t)p[i + 1] << 8 : 0);
        *q++ = tab[v >> 18];
        *q++ = tab[(v >> 12) & 63];
        *q++ = i + 1 < n ? tab[(v >> 6) & 63] : '=';
        *q++ = '=';
    }
    *q = '\0';
    if (out_len)
        *out_len = len;
    return o;
}

typedef enum { ENC_RESULT, ENC_PARTIAL } enc_kind;

/* One encode job on libuv's work queue: its own pixels in, text out. */
typedef struct enc_work {
    uv_work_t req;
    ditd_job *job;        /* a ref; not touched by the work function */
    enc_kind kind;
    int n, W, H, C;
    uint8_t *pixels;      /* n images, owned */
    ditd_sse_ev *ev[DITD_GENREQ_MAX_N]; /* stream: the placeholders to fill */
    /* inputs the work needs, copied on the loop thread */
    int stream, png_body, partial_index, image_index;
    char head[1024];      /* JSON fields besides the images, for the final body */
    long long created;
    /* outputs */
    uint8_t *png;         /* png_body */
    size_t png_len;
    char *body;           /* JSON body */
    size_t body_len;
    char *text[DITD_GENREQ_MAX_N]; /* SSE events */
    int err;
} enc_work;

static void encode_work(uv_work_t *req)
{
    enc_work *w = req->data;
    size_t numel = (size_t)w->W * (size_t)w->H * (size_t)w->C;
    char size[32];
    snprintf(size, sizeof size, "%dx%d", w->W, w->H);
    if (w->png_body) {
        w->err = ditd_png_encode(w->pixels, w->W, w->H, w->C, &w->png, &w->png_len);
        return;
    }
    json_t *data = w->stream ? NULL : json_array();
    for (int i = 0; i < w->n; i++) {
        uint8_t *png = NULL;
        size_t plen = 0, blen = 0;
        char *b64;
        if ((w->err = ditd_png_encode(w->pixels + (size_t)i * numel, w->W, w->H, w->C, &png, &plen)))
            break;
        b64 = base64(png, plen, &blen);
        free(png);
        if (!b64) {
            w->err = DITD_ENOMEM;
            break;
        }
        if (w->stream) {
            json_t *ev;
            const char *type = w->kind == ENC_PARTIAL ? "image_generation.partial_image"
                                                      : "image_generation.completed";
            ev = json_pack("{s:s,s:s,s:I,s:s,s:s,s:s,s:s,s:i}", "type", type, "b64_json", b64,
                           "created_at", (json_int_t)w->created, "size", size, "quality", "auto",
                           "background", "opaque", "output_format", "png", "index",
                           w->kind == ENC_PARTIAL ? w->image_index : i);
            if (ev && w->kind == ENC_PARTIAL)
                json_object_set_new(ev, "partial_image_index", json_integer(w->partial_index));
            if (ev && w->kind == ENC_RESULT)
                json_object_set_new(ev, "usage", json_pack("{s:i,s:i,s:i}", "input_tokens", 0,
                                                           "output_tokens", 0, "total_tokens", 0));
            char *js = ev ? json_dumps(ev, JSON_COMPACT) : NULL;
            json_decref(ev);
            if (js) {
                size_t need = strlen(type) + strlen(js) + 32;
                w->text[i] = malloc(need);
                if (w->text[i])
                    snprintf(w->text[i], need, "event: %s\ndata: %s\n\n", type, js);
            }
            free(js);
            if (!w->text[i])
                w->err = DITD_ENOMEM;
        } else {
            json_array_append_new(data, json_pack("{s:s,s:i}", "b64_json", b64, "index", i));
        }
        free(b64);
    }
    if (!w->stream && !w->err) {
        json_error_t je;
        json_t *root = json_loads(w->head, 0, &je);
        if (root) {
            json_object_set_new(root, "created", json_integer(w->created));
            json_object_set(root, "data", data);
            w->body = json_dumps(root, JSON_COMPACT);
            json_decref(root);
        }
        if (!w->body)
            w->err = DITD_ENOMEM;
        else
            w->body_len = strlen(w->body);
    }
    json_decref(data);
}

static void sse_flush(ditd_job *j);

static void encode_done(uv_work_t *req, int status)
{
    enc_work *w = req->data;
    ditd_job *j = w->job;
    ditd_srv *s = j->s;
    (void)status;
    if (w->stream) {
        for (int i = 0; i < w->n; i++) {
            ditd_sse_ev *e = w->ev[i];
            if (!e)
                continue;
            e->text = w->text[i];
            e->len = e->text ? strlen(e->text) : 0;
            e->ready = 1;
            w->text[i] = NULL;
        }
        if (w->err && w->kind == ENC_RESULT) {
            j->terminal = 0; /* let the error through */
            ditd__job_fail(j, 500, "server_error", "encode_failed", "encoding the image failed");
        }
        sse_flush(j);
    } else if (j->state != DITD_JOB_ANSWERED) {
        j->state = DITD_JOB_ANSWERED;
        if (w->err) {
            ditd_api_error e;
            ditd_api_error_set(&e, 500, "server_error", "encode_failed", NULL,
                               "encoding the image failed (request %s)", j->rid);
            j->resp = error_response(&e, j->rid, 0);
            j->resp_status = 500;
        } else if (w->png_body) {
            char seed[32];
            j->resp = buffer_response((char *)w->png, w->png_len, "image/png", j->rid);
            w->png = NULL;
            snprintf(seed, sizeof seed, "%llu", (unsigned long long)j->rq.seed);
            if (j->resp)
                MHD_add_response_header(j->resp, "X-Seed", seed);
            j->resp_status = 200;
        } else {
            j->resp = buffer_response(w->body, w->body_len, "application/json", j->rid);
            w->body = NULL;
            j->resp_status = 200;
        }
        ditd__job_resume(j);
    }
    for (int i = 0; i < DITD_GENREQ_MAX_N; i++)
        free(w->text[i]);
    free(w->png);
    free(w->body);
    free(w->pixels);
    ditd__job_unref(j);
    free(w);
    (void)s;
}

static enc_work *enc_new(ditd_job *j, enc_kind kind, int n)
{
    ditd_srv *s = j->s;
    enc_work *w = calloc(1, sizeof *w);
    if (!w)
        return NULL;
    w->pixels = malloc((size_t)n * s->numel);
    if (!w->pixels) {
        free(w);
        return NULL;
    }
    w->req.data = w;
    w->job = j;
    w->kind = kind;
    w->n = n;
    w->W = j->rq.width;
    w->H = j->rq.height;
    w->C = s->info.image_channels;
    w->stream = j->rq.stream;
    w->created = (long long)time(NULL);
    return w;
}

static ditd_sse_ev *sse_push(ditd_job *j, char *text, int ready, int end)
{
    ditd_sse_ev *e = calloc(1, sizeof *e);
    if (!e) {
        free(text);
        return NULL;
    }
    e->text = text;
    e->len = text ? strlen(text) : 0;
    e->ready = ready;
    e->end = end;
    *j->ev_tail = e;
    j->ev_tail = &e->next;
    return e;
}

void ditd__job_complete(ditd_job *j)
{
    ditd_srv *s = j->s;
    enc_work *w;
    if (j->terminal)
        return;
    j->terminal = 1;
    if (!(w = enc_new(j, ENC_RESULT, j->rq.n))) {
        j->terminal = 0;
        ditd__job_fail(j, 500, "server_error", "internal_error", "out of memory (request %s)", j->rid);
        return;
    }
    memcpy(w->pixels, j->pixels, (size_t)j->rq.n * s->numel);
    w->png_body = j->want_png && j->rq.n == 1 && !j->rq.stream;
    snprintf(w->head, sizeof w->head,
             "{\"model\":\"%s\",\"size\":\"%dx%d\",\"output_format\":\"png\",\"seed\":%llu,"
             "\"num_inference_steps\":%d,\"guidance_scale\":%g,\"sampler\":\"%s\",\"class_label\":%lld}",
             s->info.name, j->rq.width, j->rq.height, (unsigned long long)j->rq.seed, j->rq.steps,
             (double)j->rq.guidance, ditd_sampler_kind_name(j->rq.sampler), (long long)j->rq.class_id);
    if (j->rq.stream) {
        for (int i = 0; i < j->rq.n; i++)
            w->ev[i] = sse_push(j, NULL, 0, i == j->rq.n - 1);
    }
    ditd__job_ref(j);
    if (uv_queue_work(s->loop, &w->req, encode_work, encode_done)) {
        encode_work(&w->req); /* cannot happen with a live loop; stay correct */
        encode_done(&w->req, 0);
    }
}

void ditd__job_partial(ditd_job *j, int image, int partial_index, const uint8_t *pixels)
{
    enc_work *w = enc_new(j, ENC_PARTIAL, 1);
    if (!w)
        return;
    memcpy(w->pixels, pixels, j->s->numel);
    w->partial_index = partial_index;
    w->image_index = image;
    w->ev[0] = sse_push(j, NULL, 0, 0);
    ditd__job_ref(j);
    if (uv_queue_work(j->s->loop, &w->req, encode_work, encode_done)) {
        encode_work(&w->req);
        encode_done(&w->req, 0);
    }
}

void ditd__job_progress(ditd_job *j, int step, int total, double elapsed_ms)
{
    char buf[256];
    snprintf(buf, sizeof buf,
             "event: image_generation.progress\ndata: {\"type\":\"image_generation.progress\","
             "\"step\":%d,\"total\":%d,\"elapsed_ms\":%.3f}\n\n",
             step, total, elapsed_ms);
    char *t = strdup(buf);
    if (t)
        sse_push(j, t, 1, 0);
    sse_flush(j);
}

void ditd__job_fail(ditd_job *j, int status, const char *type, const char *code, const char *fmt, ...)
{
    ditd_srv *s = j->s;
    ditd_api_error e;
    va_list ap;
    if (j->terminal)
        return;
    j->terminal = 1;
    e.status = status;
    e.type = type;
    e.code = code;
    e.param[0] = '\0';
    va_start(ap, fmt);
    vsnprintf(e.message, sizeof e.message, fmt, ap);
    va_end(ap);
    ditd__sched_withdraw(s, j);
    if (j->rq.stream) {
        char *js = ditd_api_error_json(&e);
        if (js) {
            size_t need = strlen(js) + 32;
            char *t = malloc(need);
            if (t)
                snprintf(t, need, "event: error\ndata: %s\n\n", js);
            free(js);
            sse_push(j, t, 1, 1);
        } else {
            sse_push(j, NULL, 1, 1);
        }
        sse_flush(j);
    } else if (j->state != DITD_JOB_ANSWERED) {
        j->state = DITD_JOB_ANSWERED;
        j->resp = error_response(&e, j->rid, status == 429 ? ditd__sched_retry_after(s) : 0);
        j->resp_status = status;
        ditd__job_resume(j);
    }
}

/* ------------------------------------------------------------------ */
/* SSE                                                                 */

/* Moves the ready events at the head into the output buffer, in order. */
static void sse_flush(ditd_job *j)
{
    while (j->ev_head && j->ev_head->ready) {
        ditd_sse_ev *e = j->ev_head;
        if (e->len) {
            if (j->out_off == j->out_len)
                j->out_off = j->out_len = 0;
            if (j->out_len + e->len > j->out_cap) {
                size_t cap = (j->out_len + e->len) * 2;
                char *p = realloc(j->out, cap);
                if (!p)
                    break; /* try again on the next wake-up */
                j->out = p;
                j->out_cap = cap;
            }
            memcpy(j->out + j->out_len, e->text, e->len);
            j->out_len += e->len;
        }
        if (e->end) {
            j->stream_end = 1;
            j->state = DITD_JOB_ANSWERED;
        }
        j->ev_head = e->next;
        if (!j->ev_head)
            j->ev_tail = &j->ev_head;
        free(e->text);
        free(e);
    }
    if (j->out_off < j->out_len || j->stream_end)
        ditd__job_resume(j);
}

static ssize_t sse_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    ditd_job *j = cls;
    (void)pos;
    if (j->out_off < j->out_len) {
        size_t n = j->out_len - j->out_off;
        if (n > max)
            n = max;
        memcpy(buf, j->out + j->out_off, n);
        j->out_off += n;
        return (ssize_t)n;
    }
    if (j->stream_end)
        return MHD_CONTENT_READER_END_OF_STREAM;
    if (j->conn && !j->suspended) {
        j->suspended = 1;
        MHD_suspend_connection(j->conn);
    }
    return 0;
}

static void sse_free(void *cls)
{
    ditd__job_unref(cls);
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
    return DITD_ROUTE_OTHER;
}

static json_t *model_json(ditd_srv *s)
{
    const ditd_model_info *m = &s->info;
    json_t *classes = json_array();
    char size[32];
    for (int i = 0; i < m->num_classes; i++)
        json_array_append_new(classes, json_pack("{s:i,s:s}", "id", i, "label", m->labels[i]));
    snprintf(size, sizeof size, "%dx%d", m->image_size, m->image_size);
    return json_pack("{s:s,s:s,s:I,s:s,s:s,s:o,s:[s],s:i,s:{s:i,s:f,s:s,s:s},s:[s,s,s],s:i}",
                     "id", m->name, "object", "model", "created", (json_int_t)s->t_wall, "owned_by",
                     "ditd", "architecture", "DiTTransformer2DModel", "classes", classes, "sizes", size,
                     "channels", m->image_channels, "defaults", "num_inference_steps",
                     m->default_steps, "guidance_scale", (double)m->default_guidance, "sampler",
                     ditd_sampler_kind_name(s->sched_default), "size", size, "samplers", "ddim",
                     "dpmpp-2m", "flow-euler", "max_n", DITD_GENREQ_MAX_N);
}

static enum MHD_Result get_route(ditd_srv *s, struct MHD_Connection *c, ditd_route route,
                                 const char *url)
{
    json_t *root;
    switch (route) {
    case DITD_ROUTE_MODELS:
        if (!strncmp(url, "/v1/models/", 11)) {
            if (strcmp(url + 11, s->info.name) != 0)
                return answer_error(s, c, route, NULL, 404, "invalid_request_error",
                                    "model_not_found", "model", "no such model");
            return queue(s, c, route, 200, json_response(model_json(s), NULL));
        }
        root = json_pack("{s:s,s:[o]}", "object", "list", "data", model_json(s));
        return queue(s, c, route, 200, json_response(root, NULL));
    case DITD_ROUTE_HEALTHZ: {
        double now = ditd__now();
        int ok = 1;
        json_t *reps = json_array();
        for (int r = 0; r < s->nrep; r++) {
            double age = s->rep[r].last_hb > 0 ? now - s->rep[r].last_hb : -1;
            int alive = !s->rep[r].failed && age >= 0 && age < s->cfg.heartbeat_timeout_ms / 1000.0;
            /* a replica still loading its model is alive when it is young */
            if (!s->rep[r].ready && !s->rep[r].failed && now - s->t_start < s->cfg.heartbeat_timeout_ms / 1000.0)
                alive = 1;
            ok &= alive;
            json_array_append_new(reps, json_pack("{s:i,s:b,s:b,s:f,s:b}", "replica", r, "alive",
                                                  alive, "ready", s->rep[r].ready,
                                                  "last_heartbeat_s", age, "busy",
                                                  s->rep[r].running != NULL));
        }
        root = json_pack("{s:s,s:o}", "status", ok ? "ok" : "unhealthy", "replicas", reps);
        return queue(s, c, route, ok ? 200 : 503, json_response(root, NULL));
    }
    case DITD_ROUTE_READYZ: {
        int up = ditd__sched_replicas_up(s);
        const char *why = s->draining ? "draining" : up == 0 ? "no replica ready"
                          : s->q_len >= s->cfg.max_queue ? "queue full" : NULL;
        root = json_pack("{s:s,s:i,s:i,s:i,s:b}", "status", why ? why : "ready", "replicas_up", up,
                         "queue_depth", s->q_len, "max_queue", s->cfg.max_queue, "draining", s->draining);
        return queue(s, c, route, why ? 503 : 200, json_response(root, NULL));
    }
    case DITD_ROUTE_METRICS: {
        ditd_metrics_gauges g = {s->info.name, s->q_len, ditd__sched_running(s), s->nrep,
                                 ditd__sched_replicas_up(s), 0, s->draining};
        for (ditd_job *j = s->all; j; j = j->all_next)
            g.inflight_requests += j->state == DITD_JOB_WAITING;
        size_t len = 0;
        char *text = ditd_metrics_render(&s->m, &g, &len);
        if (!text)
            return MHD_NO;
        return queue(s, c, route, 200,
                     buffer_response(text, len, "text/plain; version=0.0.4; charset=utf-8", NULL));
    }
    case DITD_ROUTE_OPENAPI: {
        struct MHD_Response *r = MHD_create_response_from_buffer(
            ditd_openapi_json_len, (void *)ditd_openapi_json, MHD_RESPMEM_PERSISTENT);
        if (r) {
            MHD_add_response_header(r, "Content-Type", "application/json");
            add_common_headers(r, NULL);
        }
        return queue(s, c, route, 200, r);
    }
    default:
        return answer_error(s, c, route, NULL, 404, "invalid_request_error", "not_found", NULL,
                            "no such route");
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
    int st;
    if (ditd_genreq_parse(j->body ? j->body : "", j->body_len, &s->info, s->sched_default, &j->rq, &e)) {
        j->state = DITD_JOB_ANSWERED;
        j->terminal = 1;
        return queue(s, c, DITD_ROUTE_GENERATIONS, e.status, error_response(&e, j->rid, 0));
    }
    free(j->body);
    j->body = NULL;
    if (!(j->pixels = calloc((size_t)j->rq.n, s->numel))) {
        j->state = DITD_JOB_ANSWERED;
        j->terminal = 1;
        return answer_error(s, c, DITD_ROUTE_GENERATIONS, j->rid, 500, "server_error",
                            "internal_error", NULL, "out of memory");
    }
    if ((st = ditd__sched_submit(s, j, &e))) {
        j->state = DITD_JOB_ANSWERED;
        j->terminal = 1;
        return queue(s, c, DITD_ROUTE_GENERATIONS, st,
                     error_response(&e, j->rid, st == 429 ? ditd__sched_retry_after(s) : st == 503 ? 5 : 0));
    }
    j->state = DITD_JOB_WAITING;
    if (j->rq.stream) {
        struct MHD_Response *r =
            MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, sse_read, j, sse_free);
        if (!r)
            return MHD_NO;
        ditd__job_ref(j);
        MHD_add_response_header(r, "Content-Type", "text/event-stream");
        MHD_add_response_header(r, "Cache-Control", "no-cache");
        MHD_add_response_header(r, "X-Accel-Buffering", "no");
        char seed[32];
        snprintf(seed, sizeof seed, "%llu", (unsigned long long)j->rq.seed);
        MHD_add_response_header(r, "X-Seed", seed);
        add_common_headers(r, j->rid);
        j->next_keepalive = ditd__now() + s->cfg.sse_keepalive_ms / 1000.0;
        j->status = 200;
        return queue(s, c, DITD_ROUTE_GENERATIONS, 200, r);
    }
    j->suspended = 1;
    MHD_suspend_connection(c);
    return MHD_YES;
}

enum MHD_Result ditd__on_request(void *cls, struct MHD_Connection *c, const char *url,
                                 const char *method, const char *version, const char *upload,
                                 size_t *upload_size, void **ctx)
{
    ditd_srv *s = cls;
    ditd_job *j = *ctx;
    (void)version;

    if (!j) {
        ditd_route route = route_of(url);
        int is_get = !strcmp(method, "GET") || !strcmp(method, "HEAD");
        if (route != DITD_ROUTE_GENERATIONS) {
            if (route != DITD_ROUTE_OTHER && !is_get) {
                struct MHD_Response *r;
                ditd_api_error e;
                ditd_api_error_set(&e, 405, "invalid_request_error", "method_not_allowed", NULL,
                                   "%s is not allowed on %s; allowed: GET, HEAD", method, url);
                r = error_response(&e, NULL, 0);
                if (r)
                    MHD_add_response_header(r, "Allow", "GET, HEAD");
                return queue(s, c, route, 405, r);
            }
            return get_route(s, c, route, url);
        }
        if (strcmp(method, "POST") != 0) {
            ditd_api_error e;
            ditd_api_error_set(&e, 405, "invalid_request_error", "method_not_allowed", NULL,
                               "%s is not allowed on %s; allowed: POST", method, url);
            struct MHD_Response *r = error_response(&e, NULL, 0);
            if (r)
                MHD_add_response_header(r, "Allow", "POST");
            return queue(s, c, route, 405, r);
        }
        if (s->draining)
            return answer_error(s, c, route, NULL, 503, "server_error", "draining", NULL,
                                "the server is shutting down; retry on another instance");
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
        if (cl && strtoll(cl, NULL, 10) > s->cfg.max_body_bytes) {
            char msg[128];
            snprintf(msg, sizeof msg, "the body (%s bytes) is over the limit of %ld bytes", cl,
                     s->cfg.max_body_bytes);
            return answer_error(s, c, route, NULL, 413, "invalid_request_error", "body_too_large",
                                NULL, msg);
        }
        if (!is_json_type(MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Type")))
            return answer_error(s, c, route, NULL, 415, "invalid_request_error",
                                "unsupported_media_type", NULL,
                                "the body must be JSON: send Content-Type: application/json");
        if (!(j = ditd__job_new(s, c)))
            return MHD_NO;
        const char *acc = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Accept");
        j->want_png = acc && strstr(acc, "image/png") != NULL;
        *ctx = j;
        return MHD_YES;
    }

    if (j->state == DITD_JOB_BODY) {
        if (*upload_size) {
            size_t n = *upload_size;
            *upload_size = 0;
            if (j->terminal) /* already answered 413: discard */
                return MHD_YES;
            if (j->body_len + n > (size_t)s->cfg.max_body_bytes) {
                j->terminal = 1;
                j->state = DITD_JOB_ANSWERED;
                return answer_error(s, c, DITD_ROUTE_GENERATIONS, j->rid, 413,
                                    "invalid_request_error", "body_too_large", NULL,
                                    "the body is over the limit");
            }
            if (j->body_len + n > j->body_cap) {
                size_t cap = (j->body_len + n) * 2;
                if (cap > (size_t)s->cfg.max_body_bytes)
                    cap = (size_t)s->cfg.max_body_bytes;
                char *p = realloc(j->body, cap);
                if (!p)
                    return MHD_NO;
                j->body = p;
                j->body_cap = cap;
            }
            memcpy(j->body + j->body_len, upload, n);
            j->body_len += n;
            return MHD_YES;
        }
        return start_generation(s, c, j);
    }
    /* resumed with an answer */
    if (j->resp) {
        struct MHD_Response *r = j->resp;
        j->resp = NULL;
        j->status = j->resp_status;
        return queue(s, c, DITD_ROUTE_GENERATIONS, j->resp_status, r);
    }
    if (j->state == DITD_JOB_ANSWERED && j->terminal)
        return MHD_NO; /* canceled: the client is gone, close */
    /* woken without an answer: wait again */
    j->suspended = 1;
    MHD_suspend_connection(c);
    return MHD_YES;
}

void ditd__on_completed(void *cls, struct MHD_Connection *c, void **ctx,
                        enum MHD_RequestTerminationCode toe)
{
    ditd_srv *s = cls;
    ditd_job *j = *ctx;
    (void)c;
    if (!j)
        return;
    *ctx = NULL;
    if (!j->terminal) {
        /* the client went away (or the stream write failed) */
        ditd__log(s, "request %s: client gone (%d); canceling", j->rid, (int)toe);
        j->state = DITD_JOB_ANSWERED;
        j->terminal = 1;
        ditd__sched_withdraw(s, j);
    } else if (toe == MHD_REQUEST_TERMINATED_COMPLETED_OK && j->status == 200) {
        ditd_hist_observe(&s->m.latency, ditd__now() - j->t_arrive);
    }
    if (s->cfg.log_requests)
        ditd__log(s, "request %s: %d in %.1f ms (n=%d, steps=%d)", j->rid, j->status,
                  (ditd__now() - j->t_arrive) * 1e3, j->rq.n, j->rq.steps);
    j->conn = NULL;
    j->suspended = 0;
    ditd__job_unref(j);
}

/* ------------------------------------------------------------------ */
/* the watch                                                           */

/* True when the peer closed a suspended connection (a waiting request is
 * not polled by libmicrohttpd, so it would not notice). */
static int peer_gone(struct MHD_Connection *c)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    char b;
    ssize_t n;
    if (!ci)
        return 0;
    n = recv(ci->connect_fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

void ditd__jobs_watch(ditd_srv *s)
{
    double now = ditd__now();
    ditd_job *next;
    for (ditd_job *j = s->all; j; j = next) {
        next = j->all_next;
        ditd__job_ref(j);
        if (!j->terminal && j->state == DITD_JOB_WAITING) {
            if (now - j->t_arrive > s->cfg.request_timeout_s) {
                s->m.timeouts_total++;
                ditd__job_fail(j, 504, "server_error", "timeout",
                               "the request took longer than %g s (--request-timeout)",
                               s->cfg.request_timeout_s);
            } else if (j->conn && j->suspended && !j->rq.stream && peer_gone(j->conn)) {
                ditd__log(s, "request %s: client gone while waiting; canceling", j->rid);
                j->terminal = 1;
                ditd__sched_withdraw(s, j);
                j->state = DITD_JOB_ANSWERED;
                j->resp = NULL;
                ditd__job_resume(j); /* libmicrohttpd then sees the close */
            }
        }
        if (j->rq.stream && j->conn && !j->stream_end && j->state != DITD_JOB_BODY &&
            now >= j->next_keepalive) {
            j->next_keepalive = now + s->cfg.sse_keepalive_ms / 1000.0;
            char *t = strdup(": keep-alive\n\n");
            if (t) {
                /* a comment can go ahead of events that wait for encoding */
                ditd_sse_ev *e = calloc(1, sizeof *e);
                if (e) {
                    e->text = t;
                    e->len = strlen(t);
                    e->ready = 1;
                    e->next = j->ev_head;
                    j->ev_head = e;
                    if (!e->next)
                        j->ev_tail = &e->next;
                } else {
                    free(t);
                }
            }
            sse_flush(j);
        }
        next = j->all_next;
        ditd__job_unref(j);
    }
}
