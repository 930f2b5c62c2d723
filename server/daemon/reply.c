/* Responses, SSE streams and the encode work: what the HTTP side does with
 * a job (server/daemon/reply.h). Loop thread, except encode_work(), which runs on
 * libuv's work queue and touches only its own copy of the pixels. */
#include "server/daemon/reply.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/core/error.h"
#include "server/common/image.h"
#include "server/daemon/log.h"
#include "server/daemon/sched.h"
#include "server/daemon/serve.h"

/* ------------------------------------------------------------------ */
/* responses                                                           */

void ditd_reply_headers(struct MHD_Response *r, const char *rid)
{
    MHD_add_response_header(r, "Server", "ditd/" "0.1");
    if (rid && *rid)
        MHD_add_response_header(r, "X-Request-Id", rid);
}

struct MHD_Response *ditd_reply_buffer(char *body, size_t len, const char *ctype, const char *rid)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(body);
        return NULL;
    }
    MHD_add_response_header(r, "Content-Type", ctype);
    ditd_reply_headers(r, rid);
    return r;
}

struct MHD_Response *ditd_reply_json(json_t *root, const char *rid)
{
    char *s = root ? json_dumps(root, JSON_COMPACT) : NULL;
    json_decref(root);
    if (!s)
        return NULL;
    return ditd_reply_buffer(s, strlen(s), "application/json", rid);
}

struct MHD_Response *ditd_reply_error(const ditd_api_error *e, const char *rid, int retry_after,
                                      size_t *len)
{
    char *body = ditd_api_error_json(e);
    struct MHD_Response *r;
    if (!body)
        return NULL;
    if (len)
        *len = strlen(body);
    r = ditd_reply_buffer(body, strlen(body), "application/json", rid);
    if (r && retry_after > 0) {
        char ra[16];
        snprintf(ra, sizeof ra, "%d", retry_after);
        MHD_add_response_header(r, "Retry-After", ra);
    }
    return r;
}

void ditd_reply_resume(ditd_job *j)
{
    if (j->conn && j->suspended) {
        j->suspended = 0;
        MHD_resume_connection(j->conn);
        ditd_http_kick(&j->s->http);
    }
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
    int edit;             /* an edit's events are image_edit.*, a generation's image_generation.* */
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
            const char *type = w->kind == ENC_PARTIAL
                                   ? (w->edit ? "image_edit.partial_image"
                                              : "image_generation.partial_image")
                                   : (w->edit ? "image_edit.completed" : "image_generation.completed");
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
        if (w->err && w->kind == ENC_RESULT && j->outcome == DITD_JOB_RESULT &&
            j->state == DITD_JOB_WAITING) {
            ditd_api_error e;
            ditd_api_error_set(&e, 500, "server_error", "encode_failed", NULL,
                               "encoding the image failed (request %s)", j->rid);
            ditd_job_fail_encode(j, &e);
        }
        sse_flush(j);
    } else if (j->state != DITD_JOB_ANSWERED) {
        ditd_job_answered(j);
        if (w->err) {
            ditd_api_error e;
            ditd_api_error_set(&e, 500, "server_error", "encode_failed", NULL,
                               "encoding the image failed (request %s)", j->rid);
            j->resp = ditd_reply_error(&e, j->rid, 0, &j->resp_len);
            j->resp_status = 500;
        } else if (w->png_body) {
            char seed[32];
            j->resp = ditd_reply_buffer((char *)w->png, w->png_len, "image/png", j->rid);
            j->resp_len = w->png_len;
            w->png = NULL;
            snprintf(seed, sizeof seed, "%llu", (unsigned long long)j->rq.seed);
            if (j->resp)
                MHD_add_response_header(j->resp, "X-Seed", seed);
            j->resp_status = 200;
        } else {
            j->resp = ditd_reply_buffer(w->body, w->body_len, "application/json", j->rid);
            j->resp_len = w->body_len;
            w->body = NULL;
            j->resp_status = 200;
        }
        ditd_reply_resume(j);
    }
    for (int i = 0; i < DITD_GENREQ_MAX_N; i++)
        free(w->text[i]);
    free(w->png);
    free(w->body);
    free(w->pixels);
    ditd_job_unref(j);
    free(w);
}

static enc_work *enc_new(ditd_job *j, enc_kind kind, int n)
{
    ditd_srv *s = j->s;
    enc_work *w = calloc(1, sizeof *w);
    if (!w)
        return NULL;
    w->pixels = malloc((size_t)n * j->numel);
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
    w->edit = j->rq.edit;
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
            ditd_job_answered(j);
        }
        j->ev_head = e->next;
        if (!j->ev_head)
            j->ev_tail = &j->ev_head;
        free(e->text);
        free(e);
    }
    if (j->out_off < j->out_len || j->stream_end)
        ditd_reply_resume(j);
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
        ditd_http_conn *hc = ditd_http_conn_of(j->conn);
        if (hc)
            hc->bytes += n;
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
    ditd_job_unref(cls);
}

/* ------------------------------------------------------------------ */
/* routes                                                              */

/* ------------------------------------------------------------------ */
/* the jobs' sink                                                      */

static void on_complete(ditd_job *j)
{
    ditd_srv *s = j->s;
    enc_work *w;
    if (!(w = enc_new(j, ENC_RESULT, j->rq.n))) {
        ditd_api_error e;
        ditd_api_error_set(&e, 500, "server_error", "internal_error", NULL,
                           "out of memory (request %s)", j->rid);
        ditd_job_fail_encode(j, &e);
        return;
    }
    memcpy(w->pixels, j->pixels, (size_t)j->rq.n * j->numel);
    w->png_body = j->want_png && j->rq.n == 1 && !j->rq.stream;
    /* the fields besides the images, through jansson: the model's name is
     * the folder's and may hold any character */
    char size[32];
    snprintf(size, sizeof size, "%dx%d", j->rq.width, j->rq.height);
    json_t *head = json_pack("{s:s,s:s,s:s,s:I,s:i,s:f,s:s}", "model", s->info.name, "size",
                             size, "output_format", "png", "seed", (json_int_t)j->rq.seed,
                             "num_inference_steps", j->rq.steps, "guidance_scale",
                             (double)j->rq.guidance, "sampler",
                             ditd_sampler_kind_name(j->rq.sampler));
    if (head && j->rq.prompt) { /* a text model's request */
        json_object_set_new(head, "max_sequence_length", json_integer(j->rq.max_sequence_length));
        if (s->info.pipeline->request & DITD_REQ_TRUE_CFG)
            json_object_set_new(head, "true_cfg_scale", json_real((double)j->rq.true_cfg));
        if (j->rq.n_skip_layers > 0) {
            json_t *sl = json_array();
            for (int i = 0; sl && i < j->rq.n_skip_layers; i++)
                json_array_append_new(sl, json_integer(j->rq.skip_layers[i]));
            json_object_set_new(head, "skip_guidance_layers", sl);
        }
    } else if (head) {
        json_object_set_new(head, "class_label", json_integer((json_int_t)j->rq.class_id));
    }
    if (head && j->rq.edit) {
        json_object_set_new(head, "strength", json_real(j->rq.strength));
        json_object_set_new(head, "mask", json_boolean(j->rq.mask != NULL));
    }
    if (head && j->rq.cache.method != DITD_CACHE_NONE) /* sums over the request's images */
        json_object_set_new(head, "cache",
                            json_pack("{s:s,s:I,s:I,s:I,s:I}", "method",
                                      ditd_cache_method_name(j->rq.cache.method), "steps",
                                      (json_int_t)j->cache_steps, "steps_skipped",
                                      (json_int_t)j->cache_steps_skipped, "evals",
                                      (json_int_t)j->cache_evals, "evals_skipped",
                                      (json_int_t)j->cache_evals_skipped));
    char *hs = head ? json_dumps(head, JSON_COMPACT) : NULL;
    json_decref(head);
    if (!hs || strlen(hs) >= sizeof w->head) {
        free(hs);
        free(w->pixels);
        free(w);
        ditd_api_error e;
        ditd_api_error_set(&e, 500, "server_error", "internal_error", NULL,
                           "cannot write the response (request %s)", j->rid);
        ditd_job_fail_encode(j, &e);
        return;
    }
    memcpy(w->head, hs, strlen(hs) + 1);
    free(hs);
    if (j->rq.stream) {
        for (int i = 0; i < j->rq.n; i++)
            w->ev[i] = sse_push(j, NULL, 0, i == j->rq.n - 1);
    }
    ditd_job_ref(j);
    if (uv_queue_work(s->loop, &w->req, encode_work, encode_done)) {
        encode_work(&w->req); /* cannot happen with a live loop; stay correct */
        encode_done(&w->req, 0);
    }
}

static void on_partial(ditd_job *j, int image, int partial_index, const uint8_t *pixels)
{
    enc_work *w = enc_new(j, ENC_PARTIAL, 1);
    if (!w)
        return;
    memcpy(w->pixels, pixels, j->numel);
    w->partial_index = partial_index;
    w->image_index = image;
    w->ev[0] = sse_push(j, NULL, 0, 0);
    ditd_job_ref(j);
    if (uv_queue_work(j->s->loop, &w->req, encode_work, encode_done)) {
        encode_work(&w->req);
        encode_done(&w->req, 0);
    }
}

static void on_progress(ditd_job *j, int step, int total)
{
    char buf[256];
    const char *type = j->rq.edit ? "image_edit.progress" : "image_generation.progress";
    snprintf(buf, sizeof buf,
             "event: %s\ndata: {\"type\":\"%s\","
             "\"step\":%d,\"total\":%d,\"elapsed_ms\":%.3f}\n\n",
             type, type, step, total, (ditd__now() - j->t_arrive) * 1e3);
    char *t = strdup(buf);
    if (t)
        sse_push(j, t, 1, 0);
    sse_flush(j);
}

static void on_failed(ditd_job *j, const ditd_api_error *e)
{
    ditd_srv *s = j->s;
    if (j->rq.stream) {
        char *js = ditd_api_error_json(e);
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
        ditd_job_answered(j);
        j->resp = ditd_reply_error(e, j->rid, e->status == 429 ? ditd__sched_retry_after(s) : 0,
                                   &j->resp_len);
        j->resp_status = e->status;
        ditd_reply_resume(j);
    }
}

const ditd_job_sink ditd_reply_sink = {on_progress, on_partial, on_complete, on_failed};

struct MHD_Response *ditd_reply_stream(ditd_job *j)
{
    struct MHD_Response *r =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, sse_read, j, sse_free);
    char seed[32];
    if (!r)
        return NULL;
    ditd_job_ref(j);
    MHD_add_response_header(r, "Content-Type", "text/event-stream");
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    MHD_add_response_header(r, "X-Accel-Buffering", "no");
    snprintf(seed, sizeof seed, "%llu", (unsigned long long)j->rq.seed);
    MHD_add_response_header(r, "X-Seed", seed);
    ditd_reply_headers(r, j->rid);
    j->next_keepalive = ditd__now() + j->s->cfg.sse_keepalive_ms / 1000.0;
    return r;
}

void ditd_reply_keepalive(ditd_job *j)
{
    char *t = strdup(": keep-alive\n\n");
    ditd_sse_ev *e = t ? calloc(1, sizeof *e) : NULL;
    j->next_keepalive = ditd__now() + j->s->cfg.sse_keepalive_ms / 1000.0;
    if (!e) {
        free(t);
        return;
    }
    /* a comment can go ahead of events that wait for encoding */
    e->text = t;
    e->len = strlen(t);
    e->ready = 1;
    e->next = j->ev_head;
    j->ev_head = e;
    if (!e->next)
        j->ev_tail = &e->next;
    sse_flush(j);
}
