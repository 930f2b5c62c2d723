/* The runner of stored jobs (server/daemon/jobrun.h). Loop thread only,
 * except write_work (libuv's work queue: encodes and writes files, touches
 * no database and no job). */
#include "server/daemon/jobrun.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>

#include "engine/core/error.h"
#include "engine/io/video_mp4.h"
#include "server/common/image.h"
#include "server/daemon/log.h"
#include "server/daemon/sched.h"
#include "server/daemon/serve.h"
#include "server/daemon/webhook.h"

static long long wall(void)
{
    return (long long)time(NULL);
}

static long long expiry(const ditd_jobrun *r, long long now)
{
    return r->ttl_s > 0 ? now + (long long)(r->ttl_s + 0.999) : 0;
}

/* Drops the runner's hold on j (the ref it had from ditd_job_new). */
static void fl_drop(ditd_jobrun *r, int i)
{
    ditd_job *j = r->fl[i];
    r->fl[i] = r->fl[--r->n_fl];
    ditd_job_unref(j);
}

/* The row goes in_progress; its wait since creation is observed. */
static void mark_running(ditd_srv *s, ditd_job *j)
{
    long long now = wall();
    j->store_running = 1;
    j->store_started = ditd__now();
    ditd_jobstore_set_running(s->jobrun->st, j->store_id, now);
    ditd_hist_observe(&s->m.job_wait[j->rq.frames > 0],
                      (double)(now - j->store_created > 0 ? now - j->store_created : 0));
}

/* ------------------------------------------------------------------ */
/* writing results                                                     */

typedef struct write_work {
    uv_work_t req;
    ditd_srv *s;
    ditd_job *job;             /* a ref: the row's id and what it made */
    char dir[4096];            /* "" in memory: the PNGs stay in png[] */
    char id[40];
    int n, W, H, C;
    int frames, fps;           /* a clip: n 1, its (frames, H, W, C) pixels; 0: images */
    uint8_t *pixels;           /* n images, owned */
    uint8_t *png[DITD_GENREQ_MAX_N];
    size_t png_len[DITD_GENREQ_MAX_N];
    long long bytes;
    int err;
    char detail[512];
} write_work;

/* A clip's outputs: the MP4 (through a temporary file: libavformat writes
 * to a path) and its first frame as a PNG. */
static int encode_clip(write_work *w)
{
    const char *tmpdir = getenv("TMPDIR") && *getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    char path[4200];
    int fd, err;
    snprintf(path, sizeof path, "%s/ditd-clip-%s-XXXXXX.mp4", tmpdir, w->id);
    if ((fd = mkstemps(path, 4)) < 0) {
        snprintf(w->detail, sizeof w->detail, "a temporary file in %s for the MP4", tmpdir);
        return DITD_EIO;
    }
    close(fd);
    err = ditd_video_write_mp4(path, w->pixels, w->frames, w->W, w->H, w->fps);
    if (err) {
        snprintf(w->detail, sizeof w->detail, "encoding the clip: %s", ditd_err_detail());
    } else {
        FILE *f = fopen(path, "rb");
        long n = -1;
        if (f && fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) > 0 && fseek(f, 0, SEEK_SET) == 0 &&
            (w->png[0] = malloc((size_t)n)) && fread(w->png[0], 1, (size_t)n, f) == (size_t)n) {
            w->png_len[0] = (size_t)n;
        } else {
            err = DITD_EIO;
            snprintf(w->detail, sizeof w->detail, "reading back the MP4 %s", path);
        }
        if (f)
            fclose(f);
    }
    unlink(path);
    if (!err && (err = ditd_png_encode(w->pixels, w->W, w->H, w->C, &w->png[1], &w->png_len[1])))
        snprintf(w->detail, sizeof w->detail, "encoding the thumbnail failed");
    for (int i = 0; i < 2 && !err; i++) {
        w->bytes += (long long)w->png_len[i];
        if (w->dir[0] && (err = ditd_jobstore_write_file(w->dir, w->id, i, i ? "png" : "mp4",
                                                         w->png[i], w->png_len[i])))
            snprintf(w->detail, sizeof w->detail, "writing the result: %s", ditd_err_detail());
    }
    return err;
}

static void write_work_fn(uv_work_t *req)
{
    write_work *w = req->data;
    size_t numel = (size_t)w->W * (size_t)w->H * (size_t)w->C;
    if (w->frames > 0) {
        w->err = encode_clip(w);
        return;
    }
    for (int i = 0; i < w->n && !w->err; i++) {
        if ((w->err = ditd_png_encode(w->pixels + (size_t)i * numel, w->W, w->H, w->C, &w->png[i],
                                      &w->png_len[i]))) {
            snprintf(w->detail, sizeof w->detail, "encoding image %d failed", i);
            break;
        }
        w->bytes += (long long)w->png_len[i];
        if (w->dir[0] &&
            (w->err = ditd_jobstore_write_file(w->dir, w->id, i, "png", w->png[i], w->png_len[i])))
            snprintf(w->detail, sizeof w->detail, "writing the result: %s", ditd_err_detail());
    }
}

static void write_work_done(uv_work_t *req, int status)
{
    write_work *w = req->data;
    ditd_srv *s = w->s;
    ditd_jobrun *r = s->jobrun;
    ditd_jrow row;
    (void)status;
    r->n_writing--;
    /* deleted while its files were written: they go too */
    int alive = ditd_jobstore_get(r->st, w->id, NULL, &row, 0) == 0;
    if (!alive) {
        ditd_jobstore_remove_files(r->st, w->id);
    } else {
        int outs = w->frames > 0 ? 2 : w->n; /* a clip: its MP4 and its thumbnail */
        for (int i = 0; i < outs && !w->err && !w->dir[0]; i++)
            if ((w->err = ditd_jobstore_put_blob(r->st, w->id, i, w->png[i], w->png_len[i])))
                snprintf(w->detail, sizeof w->detail, "storing the result: %s", ditd_err_detail());
        long long now = wall();
        if (!w->err && !ditd_jobstore_set_completed(r->st, w->id, outs, w->bytes, now, expiry(r, now))) {
            r->completed++;
            if (w->job->store_started > 0)
                ditd_hist_observe(&s->m.job_run[w->frames > 0], ditd__now() - w->job->store_started);
            ditd_webhook_emit(s->webhook, w->frames > 0 ? "video.completed" : "job.completed",
                              w->id);
            if (w->frames > 0)
                ditd_log(DITD_LOG_INFO, "job %s: completed (a clip of %d frames, %lld bytes)",
                         w->id, w->frames, w->bytes);
            else
                ditd_log(DITD_LOG_INFO, "job %s: completed (%d image%s, %lld bytes)", w->id, w->n,
                         w->n == 1 ? "" : "s", w->bytes);
        } else {
            if (!w->err)
                snprintf(w->detail, sizeof w->detail, "%s", ditd_err_detail());
            ditd_jobstore_remove_files(r->st, w->id);
            ditd_jobstore_set_failed(r->st, w->id, "storage_failed", w->detail, now, expiry(r, now));
            r->failed++;
            ditd_webhook_emit(s->webhook, w->frames > 0 ? "video.failed" : "job.failed", w->id);
            ditd_log(DITD_LOG_ERROR, "job %s: failed: %s", w->id, w->detail);
        }
    }
    for (int i = 0; i < DITD_GENREQ_MAX_N; i++)
        free(w->png[i]);
    free(w->pixels);
    ditd_job_unref(w->job);
    free(w);
}

/* ------------------------------------------------------------------ */
/* the sink of stored jobs                                             */

static void job_progress(ditd_job *j, int step, int total)
{
    ditd_jobrun *r = j->s->jobrun;
    /* of the job's samples: those back, and those in flight at step/total
     * (a job of more samples than a batch runs in several) */
    int n = j->rq.n, out = j->dispatched - j->finished;
    int pct = total > 0 && n > 0
                  ? (int)((100.0 * j->finished + 100.0 * out * step / total) / n)
                  : 0;
    double now = ditd__now();
    if (pct > 99)
        pct = 99; /* 100 once the result is stored */
    if (pct < j->store_pct)
        pct = j->store_pct; /* never back */
    if (!j->store_running)
        mark_running(j->s, j);
    /* a write when the percent moved, at most 4 a second */
    if (pct != j->store_pct && now - j->store_t >= 0.25) {
        j->store_pct = pct;
        j->store_t = now;
        ditd_jobstore_set_progress(r->st, j->store_id, pct);
    }
}

static void job_partial(ditd_job *j, int image, int partial_index, const uint8_t *pixels)
{
    (void)j, (void)image, (void)partial_index, (void)pixels;
}

static void job_complete(ditd_job *j)
{
    ditd_srv *s = j->s;
    ditd_jobrun *r = s->jobrun;
    write_work *w = calloc(1, sizeof *w);
    long long now = wall();
    ditd_job_answered(j);
    if (w)
        w->pixels = malloc((size_t)j->rq.n * j->numel);
    if (!w || !w->pixels) {
        if (w)
            free(w);
        ditd_jobstore_set_failed(r->st, j->store_id, "internal_error", "out of memory", now,
                                 expiry(r, now));
        r->failed++;
    } else {
        w->req.data = w;
        w->s = s;
        w->job = j;
        ditd_job_ref(j);
        snprintf(w->dir, sizeof w->dir, "%s", ditd_jobstore_dir(r->st));
        snprintf(w->id, sizeof w->id, "%s", j->store_id);
        w->n = j->rq.n;
        w->W = j->rq.width;
        w->H = j->rq.height;
        w->C = s->info.image_channels;
        w->frames = j->rq.frames;
        w->fps = j->rq.fps;
        memcpy(w->pixels, j->pixels, (size_t)j->rq.n * j->numel);
        r->n_writing++;
        if (uv_queue_work(s->loop, &w->req, write_work_fn, write_work_done)) {
            write_work_fn(&w->req); /* cannot happen with a live loop; stay correct */
            write_work_done(&w->req, 0);
        }
    }
    /* let go at the next watch, not here: a caller may still walk the job */
    j->store_done = 1;
}

static void job_failed(ditd_job *j, const ditd_api_error *e)
{
    ditd_srv *s = j->s;
    ditd_jobrun *r = s->jobrun;
    long long now = wall();
    ditd_job_answered(j);
    if (s->draining) {
        /* the server stops: the job runs again after the restart */
        ditd_jobstore_requeue(r->st, j->store_id);
    } else {
        ditd_jobstore_set_failed(r->st, j->store_id, e->code, e->message, now, expiry(r, now));
        r->failed++;
        ditd_webhook_emit(s->webhook, j->rq.frames > 0 ? "video.failed" : "job.failed",
                          j->store_id);
        ditd_log(DITD_LOG_WARN, "job %s: failed: %s", j->store_id, e->message);
    }
    j->store_done = 1; /* let go at the next watch */
}

static const ditd_job_sink store_sink = {job_progress, job_partial, job_complete, job_failed};

/* ------------------------------------------------------------------ */
/* open, create, delete                                                */

int ditd_jobrun_open(ditd_srv *s)
{
    ditd_jobrun *r = calloc(1, sizeof *r);
    ditd_jobstore_recovery rec;
    int err;
    if (!r)
        return DITD_ENOMEM;
    s->jobrun = r;
    r->ttl_s = s->cfg.job_ttl_s;
    r->max_bytes = (long long)(s->cfg.data_max_gb * 1e9);
    r->max_inflight = s->nrep < DITD_JOBRUN_MAX_INFLIGHT ? s->nrep : DITD_JOBRUN_MAX_INFLIGHT;
    if (r->max_inflight < 1)
        r->max_inflight = 1;
    if ((err = ditd_jobstore_open(s->cfg.data_dir, &r->st, &rec)))
        return err;
    if (r->ttl_s > 0 && (err = ditd_jobstore_expire_unset(r->st, (long long)(r->ttl_s + 0.999), NULL)))
        return err;
    if (s->cfg.data_dir[0]) {
        long long counts[DITD_JS_COUNT];
        ditd_jobstore_counts(r->st, counts);
        ditd_log(DITD_LOG_INFO,
                 "job store %s: %lld queued, %lld completed, %lld failed; recovery: %d requeued, "
                 "%d failed (interrupted too often), %d lost results, %d orphan files removed",
                 s->cfg.data_dir, counts[DITD_JS_QUEUED], counts[DITD_JS_COMPLETED],
                 counts[DITD_JS_FAILED], rec.requeued, rec.failed, rec.lost, rec.orphans_removed);
    }
    return 0;
}

void ditd_jobrun_close(ditd_srv *s)
{
    ditd_jobrun *r = s->jobrun;
    if (!r)
        return;
    while (r->n_fl)
        fl_drop(r, r->n_fl - 1);
    ditd_jobstore_close(r->st);
    free(r);
    s->jobrun = NULL;
}

/* Whether a store error is the disk being full (SQLite's SQLITE_FULL, or
 * ENOSPC writing a result). */
static int disk_full(const char *detail)
{
    return strstr(detail, "is full") || strstr(detail, "No space left");
}

/* A stored request by its row's kind. */
static int parse_kind(ditd_srv *s, const char *kind, const char *body, size_t len, ditd_genreq *rq,
                      ditd_api_error *e)
{
    if (!strcmp(kind, "video"))
        return ditd_genreq_parse_video(body, len, &s->gm, rq, e);
    return ditd_genreq_parse(body, len, &s->gm, rq, e);
}

int ditd_jobrun_create(ditd_srv *s, const char *owner, const char *kind, const char *body,
                       size_t len, ditd_jrow *row, ditd_api_error *e)
{
    ditd_jobrun *r = s->jobrun;
    ditd_genreq rq;
    json_error_t je;
    int err;
    if ((err = parse_kind(s, kind, body, len, &rq, e)))
        return e->status;
    if (rq.stream) {
        ditd_genreq_free(&rq);
        return ditd_api_error_set(e, 400, "invalid_request_error", "invalid_value", "stream",
                                  "a background job is polled, not streamed: drop 'stream'");
    }
    uint64_t cost = ditd__sched_cost(s, &rq);
    if (s->cfg.max_cost > 0 && cost > (uint64_t)s->cfg.max_cost) {
        /* refused now, as the synchronous request is, not failed later */
        ditd_genreq_free(&rq);
        return ditd_api_error_set(e, 400, "invalid_request_error", "cost_too_high", "n",
                                  "the job costs %llu (n x num_inference_steps x tokens) and this "
                                  "server takes at most %ld (--max-cost): ask for fewer %s or "
                                  "steps", (unsigned long long)cost, s->cfg.max_cost,
                                  rq.frames > 0 ? "frames" : "images");
    }
    if (r->max_bytes > 0) {
        long long have = ditd_jobstore_bytes(r->st);
        if (have >= r->max_bytes) {
            ditd_genreq_free(&rq);
            r->refused_full++;
            return ditd_api_error_set(e, 507, "server_error", "insufficient_storage", NULL,
                                      "the job store holds %lld bytes, at its budget of %lld "
                                      "(--data-max-gb): delete jobs or wait for them to expire",
                                      have, r->max_bytes);
        }
    }
    /* the stored request: the body with its seed fixed (a re-run after a
     * restart makes the same images) and without "background" */
    json_t *root = json_loadb(body, len, 0, &je);
    if (!root) {
        ditd_genreq_free(&rq);
        return ditd_api_error_set(e, 500, "server_error", "internal_error", NULL, "out of memory");
    }
    json_object_del(root, "background");
    json_object_set_new(root, "seed", json_integer((json_int_t)rq.seed));
    if (rq.frames > 0) { /* a clip: its frames and rate as resolved (the video object says them) */
        json_object_del(root, "seconds");
        json_object_set_new(root, "num_frames", json_integer(rq.frames));
        json_object_set_new(root, "fps", json_integer(rq.fps));
    }
    char *req = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    memset(row, 0, sizeof *row);
    snprintf(row->kind, sizeof row->kind, "%s", kind);
    snprintf(row->owner, sizeof row->owner, "%s", owner);
    snprintf(row->model, sizeof row->model, "%s", s->info.name);
    snprintf(row->size, sizeof row->size, "%dx%d", rq.width, rq.height);
    row->created_at = wall();
    row->request = req;
    ditd_genreq_free(&rq);
    if (!req)
        return ditd_api_error_set(e, 500, "server_error", "internal_error", NULL, "out of memory");
    err = ditd_jobstore_insert(r->st, row);
    ditd_jrow_free(row);
    if (err && disk_full(ditd_err_detail())) {
        r->refused_full++;
        return ditd_api_error_set(e, 507, "server_error", "insufficient_storage", NULL,
                                  "the job store's disk is full (%s): delete jobs or free space",
                                  ditd_err_detail());
    }
    if (err)
        return ditd_api_error_set(e, 500, "server_error", "storage_failed", NULL, "%s",
                                  ditd_err_detail());
    r->created++;
    ditd_log(DITD_LOG_INFO, "job %s: queued", row->id);
    return 0;
}

int ditd_jobrun_delete(ditd_srv *s, const char *id)
{
    ditd_jobrun *r = s->jobrun;
    for (int i = 0; i < r->n_fl; i++) {
        ditd_job *j = r->fl[i];
        if (!strcmp(j->store_id, id)) {
            /* stops at the next step boundary: the replica drops the
             * canceled samples there */
            ditd_job_cancel(j);
            ditd__sched_withdraw(s, j);
            fl_drop(r, i);
            break;
        }
    }
    int err = ditd_jobstore_delete(r->st, id);
    if (!err)
        r->deleted++;
    return err;
}

/* ------------------------------------------------------------------ */
/* the watch                                                           */

/* Hands the oldest queued row to the scheduler. 1 when one went, 0 when
 * none could (none queued, or the scheduler cannot take it now). */
static int hand_over(ditd_srv *s)
{
    ditd_jobrun *r = s->jobrun;
    ditd_jrow row;
    ditd_genreq rq;
    ditd_api_error e;
    long long now = wall();
    int err = ditd_jobstore_claim_next(r->st, &row);
    if (err) {
        /* the store cannot take the claim (a full disk): the queued jobs
         * wait, and the log says why once a minute */
        if (err != DITD_ENOENT && ditd__now() >= r->next_claim_warn) {
            r->next_claim_warn = ditd__now() + 60;
            ditd_log(DITD_LOG_WARN, "job store: queued jobs cannot start: %s; they wait",
                     ditd_err_detail());
        }
        return 0;
    }
    if (parse_kind(s, row.kind, row.request, strlen(row.request), &rq, &e)) {
        /* a stored request the model no longer takes (served another) */
        ditd_jobstore_set_failed(r->st, row.id, e.code, e.message, now, expiry(r, now));
        r->failed++;
        ditd_webhook_emit(s->webhook, strcmp(row.kind, "video") ? "job.failed" : "video.failed",
                          row.id);
        ditd_jrow_free(&row);
        return 1;
    }
    ditd_job *j = ditd_job_new(&s->jobs, s, &store_sink, NULL);
    if (!j || ditd_job_accept(j, &rq, ditd_genreq_numel(&rq, &s->info))) {
        ditd_genreq_free(&rq);
        if (j) {
            ditd_job_refuse(j);
            ditd_job_unref(j);
        }
        ditd_jobstore_unclaim(r->st, row.id);
        ditd_jrow_free(&row);
        return 0;
    }
    j->background = 1;
    j->store_created = row.created_at;
    snprintf(j->store_id, sizeof j->store_id, "%s", row.id);
    ditd_jrow_free(&row);
    int st = ditd__sched_submit(s, j, &e);
    if (st) {
        ditd_job_refuse(j);
        ditd_job_unref(j);
        if (st == 429 || st == 503) { /* later */
            ditd_jobstore_unclaim(r->st, j->store_id);
            return 0;
        }
        ditd_jobstore_set_failed(r->st, j->store_id, e.code, e.message, now, expiry(r, now));
        r->failed++;
        ditd_webhook_emit(s->webhook, j->rq.frames > 0 ? "video.failed" : "job.failed",
                          j->store_id);
        return 1;
    }
    r->fl[r->n_fl++] = j;
    return 1;
}

void ditd_jobrun_watch(ditd_srv *s)
{
    ditd_jobrun *r = s->jobrun;
    double now = ditd__now();
    if (!r || !r->st)
        return;
    for (int i = r->n_fl - 1; i >= 0; i--)
        if (r->fl[i]->store_done)
            fl_drop(r, i);
    if (s->draining) {
        if (!r->drained) {
            r->drained = 1;
            if (r->n_fl)
                ditd_log(DITD_LOG_INFO, "draining: %d running job(s) stop and stay queued", r->n_fl);
            while (r->n_fl) {
                ditd_job *j = r->fl[r->n_fl - 1];
                if (!ditd_job_terminal(j)) {
                    ditd_jobstore_requeue(r->st, j->store_id);
                    ditd_job_cancel(j);
                    ditd__sched_withdraw(s, j);
                }
                fl_drop(r, r->n_fl - 1);
            }
        }
        return;
    }
    /* dispatched: in_progress (the first step's progress says it too) */
    for (int i = 0; i < r->n_fl; i++)
        if (r->fl[i]->dispatched > 0 && !r->fl[i]->store_running)
            mark_running(s, r->fl[i]);
    while (r->n_fl < r->max_inflight && ditd__sched_replicas_up(s) > 0 && hand_over(s))
        ;
    if (now >= r->next_sweep) {
        int n = 0;
        r->next_sweep = now + 1.0;
        ditd_jobstore_expire(r->st, wall(), &n);
        r->expired += (unsigned long long)n;
        if (n)
            ditd_log(DITD_LOG_INFO, "%d job(s) expired (--job-ttl)", n);
    }
}
