/* The worker loop and its two transports (in-process hub, MPI). */
#include "engine/worker/worker.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ditd_build_config.h"
#include "engine/backend/backend.h"
#include "engine/core/error.h"
#include "engine/models/model.h"
#include "engine/pipeline/pipeline.h"
#include "proto/ditd.pb-c.h"

#if DITD_HAVE_MPI
#include <mpi.h>
#endif

#define DITD_TAG 7701

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* ------------------------------------------------------------------ */
/* the worker                                                          */

typedef struct pending {
    struct pending *next;
    uint8_t *buf;
    size_t len;
} pending;

/* The leader's word to its group, broadcast lazily (the group may wait
 * long for it): a batch follows as a variable-length broadcast of the
 * packed Envelope, or the loop ends. */
enum { GROUP_BATCH = 1, GROUP_SHUTDOWN = 2 };
typedef struct group_hdr {
    uint32_t kind;
    uint32_t pad;
    uint64_t len;   /* GROUP_BATCH: bytes of the Envelope that follows */
} group_hdr;
#define GROUP_NAP_US 200

typedef struct worker {
    const ditd_worker_config *cfg;
    ditd_transport *t;     /* the leader's; NULL on a follower */
    const ditd_mesh *mesh; /* NULL or a group of one: no group messages */
    int leader;
    ditd_model_info info;
    ditd_pipeline *pipe;
    uint64_t hb_seq;
    double next_hb;
    bool stop, stop_now;
    pending *queued, **queued_tail; /* batches that came during a batch */
    /* the running batch */
    const Ditd__Batch *batch;
    ditd_gen_sample samples[DITD_WORKER_MAX_BATCH];
    uint8_t active[DITD_WORKER_MAX_BATCH];
    int partial_sent[DITD_WORKER_MAX_BATCH];
    double t_start, t_step;
    float *out;    /* max_batch * C*S*S latents */
    uint8_t *pix;  /* max_batch * C*S*S, for previews and results (leader) */
    uint8_t *gbuf; /* a follower's copy of the batch Envelope */
    size_t gcap;
    int comm_err;  /* the transport failed */
    int group_err; /* the group cannot stay in step */
} worker;

static int in_group(const worker *w)
{
    return w->mesh && w->mesh->size > 1;
}

static int send_env(worker *w, Ditd__Envelope *env)
{
    if (!w->t) /* a follower says nothing */
        return 0;
    env->replica = (uint32_t)w->cfg->replica; /* before sizing: it is encoded when non-zero */
    size_t len = ditd__envelope__get_packed_size(env);
    uint8_t stackbuf[512];
    uint8_t *buf = len <= sizeof stackbuf ? stackbuf : malloc(len);
    int err;
    if (!buf)
        return ditd_err_set(DITD_ENOMEM, "message of %zu bytes", len);
    ditd__envelope__pack(env, buf);
    err = w->t->send(w->t, buf, len);
    if (buf != stackbuf)
        free(buf);
    if (err)
        w->comm_err = err;
    return err;
}

static void send_heartbeat(worker *w, bool ready)
{
    Ditd__Envelope env = DITD__ENVELOPE__INIT;
    Ditd__Heartbeat hb = DITD__HEARTBEAT__INIT;
    hb.replica = (uint32_t)w->cfg->replica;
    hb.seq = ++w->hb_seq;
    hb.ready = ready;
    hb.running_batch = w->batch ? w->batch->batch_id : 0;
    hb.max_batch = (uint32_t)w->cfg->max_batch;
    hb.ranks = w->mesh ? (uint32_t)w->mesh->size : 1;
    env.msg_case = DITD__ENVELOPE__MSG_HEARTBEAT;
    env.heartbeat = &hb;
    send_env(w, &env);
    w->next_hb = now_ms() + w->cfg->heartbeat_ms;
}

static void send_error(worker *w, uint64_t batch_id, int code, const char *msg)
{
    Ditd__Envelope env = DITD__ENVELOPE__INIT;
    Ditd__Error e = DITD__ERROR__INIT;
    e.batch_id = batch_id;
    e.code = code;
    e.message = (char *)msg;
    env.msg_case = DITD__ENVELOPE__MSG_ERROR;
    env.error = &e;
    send_env(w, &env);
}

/* The leader: tells the group what comes next. A failure here leaves the
 * group out of step (fail-stop). */
static int group_send(worker *w, uint32_t kind, uint8_t *buf, size_t len)
{
    group_hdr h = {kind, 0, (uint64_t)len};
    size_t n = len;
    int err;
    if (!in_group(w))
        return 0;
    if (!(err = ditd_mesh_bcast_lazy(w->mesh, &h, sizeof h, GROUP_NAP_US)) && kind == GROUP_BATCH)
        err = ditd_mesh_bcast_var(w->mesh, buf, len, &n);
    if (err)
        w->group_err = err;
    return err;
}

/* A follower: waits (napping) for the leader's word; a batch lands in
 * w->gbuf[0..*len). */
static int group_recv(worker *w, uint32_t *kind, size_t *len)
{
    group_hdr h;
    int err;
    if ((err = ditd_mesh_bcast_lazy(w->mesh, &h, sizeof h, GROUP_NAP_US)))
        return err;
    *kind = h.kind;
    if (h.kind != GROUP_BATCH)
        return 0;
    if (h.len > w->gcap) {
        /* the leader sends the bytes whatever we do: no way back into step */
        uint8_t *nb = h.len <= SIZE_MAX ? realloc(w->gbuf, (size_t)h.len) : NULL;
        if (!nb)
            return ditd_err_set(DITD_ENOMEM, "group message of %llu bytes",
                                (unsigned long long)h.len);
        w->gbuf = nb;
        w->gcap = (size_t)h.len;
    }
    *len = (size_t)h.len;
    return ditd_mesh_bcast_var(w->mesh, w->gbuf, w->gcap, len);
}

/* A message that arrives while a batch runs: cancel and shutdown act now,
 * a batch waits its turn. Takes ownership of buf. */
static void handle_async(worker *w, uint8_t *buf, size_t len)
{
    Ditd__Envelope *env = ditd__envelope__unpack(NULL, len, buf);
    if (!env) {
        free(buf);
        return;
    }
    switch (env->msg_case) {
    case DITD__ENVELOPE__MSG_CANCEL:
        if (w->batch && env->cancel->batch_id == w->batch->batch_id) {
            size_t n = w->batch->n_samples;
            if (env->cancel->n_slots == 0)
                memset(w->active, 0, n);
            for (size_t i = 0; i < env->cancel->n_slots; i++)
                if (env->cancel->slots[i] < n)
                    w->active[env->cancel->slots[i]] = 0;
        }
        free(buf);
        break;
    case DITD__ENVELOPE__MSG_SHUTDOWN:
        w->stop = true;
        w->stop_now = w->stop_now || env->shutdown->now;
        free(buf);
        break;
    case DITD__ENVELOPE__MSG_BATCH: {
        pending *p = malloc(sizeof *p);
        if (!p) {
            send_error(w, env->batch->batch_id, DITD_ENOMEM, "worker queue");
            free(buf);
            break;
        }
        p->next = NULL;
        p->buf = buf;
        p->len = len;
        *w->queued_tail = p;
        w->queued_tail = &p->next;
        break;
    }
    default:
        free(buf);
        break;
    }
    ditd__envelope__free_unpacked(env, NULL);
}

/* Whether sample slot wants a preview after this step: partial_images k
 * previews spread evenly over steps 1..total-1. */
static int preview_due(int k, int sent, int step, int total)
{
    if (sent >= k || step >= total)
        return 0;
    /* the j-th preview (1-based) goes at step ceil(j * total / (k + 1)) */
    int j = sent + 1;
    int at = (j * total + k) / (k + 1);
    if (at < 1)
        at = 1;
    return step >= at;
}

/* The step callback: on the leader only. What it decides (active flags,
 * stop) the pipeline broadcasts to the group after it returns. */
static int on_step(void *ud, int step, int total, const float *x0, uint8_t *active)
{
    worker *w = ud;
    const Ditd__Batch *b = w->batch;
    const ditd_dit_config *c = &w->info.dit;
    size_t numel = (size_t)c->in_channels * (size_t)c->sample_size * (size_t)c->sample_size;
    Ditd__Envelope env = DITD__ENVELOPE__INIT;
    Ditd__Progress pg = DITD__PROGRESS__INIT;
    Ditd__Preview pv[DITD_WORKER_MAX_BATCH], *pvp[DITD_WORKER_MAX_BATCH];
    double t = now_ms();
    uint8_t *buf = NULL;
    size_t len = 0;
    (void)active; /* == w->active */

    pg.batch_id = b->batch_id;
    pg.step = (uint32_t)step;
    pg.total = (uint32_t)total;
    pg.elapsed_ms = t - w->t_start;
    pg.step_ms = t - w->t_step;
    w->t_step = t;
    for (size_t i = 0; i < b->n_samples; i++) {
        int k = (int)b->samples[i]->partial_images;
        if (!w->active[i] || !preview_due(k, w->partial_sent[i], step, total))
            continue;
        uint8_t *px = w->pix + (size_t)pg.n_previews * numel;
        ditd_pipeline_to_pixels(x0 + i * numel, c->in_channels, c->sample_size, c->sample_size, px);
        ditd__preview__init(&pv[pg.n_previews]);
        pv[pg.n_previews].slot = (uint32_t)i;
        pv[pg.n_previews].partial_index = (uint32_t)w->partial_sent[i]++;
        pv[pg.n_previews].pixels.data = px;
        pv[pg.n_previews].pixels.len = numel;
        pvp[pg.n_previews] = &pv[pg.n_previews];
        pg.n_previews++;
    }
    pg.previews = pvp;
    env.msg_case = DITD__ENVELOPE__MSG_PROGRESS;
    env.progress = &pg;
    send_env(w, &env);
    if (t >= w->next_hb)
        send_heartbeat(w, true);
    /* cancel / shutdown that came meanwhile act at this step boundary */
    while (!w->comm_err && w->t->recv(w->t, &buf, &len, 0) == 0)
        handle_async(w, buf, len);
    return w->stop_now || w->comm_err;
}

/* The leader's check of a batch before the group sees it: 0, or an Error
 * went to the front-end. */
static int batch_ok(worker *w, const Ditd__Batch *b)
{
    const ditd_dit_config *c = &w->info.dit;
    int n = (int)b->n_samples;
    char msg[512];

    if (n < 1 || n > w->cfg->max_batch) {
        snprintf(msg, sizeof msg, "batch of %d samples (1..%d)", n, w->cfg->max_batch);
        send_error(w, b->batch_id, DITD_EINVAL, msg);
        return 0;
    }
    if ((int)b->width != c->sample_size || (int)b->height != c->sample_size) {
        snprintf(msg, sizeof msg, "size %ux%u, the model makes %dx%d", b->width, b->height,
                 c->sample_size, c->sample_size);
        send_error(w, b->batch_id, DITD_EINVAL, msg);
        return 0;
    }
    if (b->sampler >= DITD_SAMPLER_KIND_COUNT) {
        send_error(w, b->batch_id, DITD_EINVAL, "unknown sampler");
        return 0;
    }
    return 1;
}

/* Every rank of the group, with the same batch (checked by batch_ok on the
 * leader). The leader sends the outcome. */
static void run_batch(worker *w, const Ditd__Batch *b)
{
    const ditd_dit_config *c = &w->info.dit;
    size_t numel = (size_t)c->in_channels * (size_t)c->sample_size * (size_t)c->sample_size;
    int n = (int)b->n_samples, err;
    ditd_gen_params gp;
    char msg[512];

    gp.steps = (int)b->steps;
    gp.sampler = (ditd_sampler_kind)b->sampler;
    for (int i = 0; i < n; i++) {
        w->samples[i].seed = b->samples[i]->seed;
        w->samples[i].index = b->samples[i]->index;
        w->samples[i].class_id = b->samples[i]->class_id;
        w->samples[i].guidance = b->samples[i]->guidance;
        w->active[i] = 1;
        w->partial_sent[i] = 0;
    }
    w->batch = b;
    w->t_start = w->t_step = now_ms();
    err = ditd_pipeline_generate(w->pipe, &gp, n, w->samples, NULL, w->out, w->active,
                                 w->leader ? on_step : NULL, w);
    w->batch = NULL;
    if (err == DITD_ECOMM)
        w->group_err = err; /* a collective failed: the group is out of step */
    if (!w->leader) {
        if (err && err != DITD_ECANCELED)
            fprintf(stderr, "ditd worker: replica %d, group rank %d: batch %llu: %s: %s\n",
                    w->cfg->replica, w->mesh->rank, (unsigned long long)b->batch_id,
                    ditd_strerror(err), ditd_err_detail());
        return;
    }
    if (err) {
        snprintf(msg, sizeof msg, "%s%s%s", ditd_strerror(err), *ditd_err_detail() ? ": " : "",
                 ditd_err_detail());
        if (w->stop_now)
            snprintf(msg, sizeof msg, "the replica is shutting down");
        send_error(w, b->batch_id, w->stop_now ? DITD_EUNAVAIL : err, msg);
        return;
    }

    Ditd__Envelope env = DITD__ENVELOPE__INIT;
    Ditd__Result r = DITD__RESULT__INIT;
    Ditd__Image im[DITD_WORKER_MAX_BATCH], *imp[DITD_WORKER_MAX_BATCH];
    r.batch_id = b->batch_id;
    r.width = r.height = (uint32_t)c->sample_size;
    r.channels = (uint32_t)c->in_channels;
    r.compute_ms = now_ms() - w->t_start;
    for (int i = 0; i < n; i++) {
        ditd__image__init(&im[i]);
        im[i].slot = (uint32_t)i;
        im[i].canceled = !w->active[i];
        if (w->active[i]) {
            uint8_t *px = w->pix + (size_t)i * numel;
            ditd_pipeline_to_pixels(w->out + (size_t)i * numel, c->in_channels, c->sample_size,
                                    c->sample_size, px);
            im[i].pixels.data = px;
            im[i].pixels.len = numel;
        }
        imp[i] = &im[i];
    }
    r.n_images = (size_t)n;
    r.images = imp;
    env.msg_case = DITD__ENVELOPE__MSG_RESULT;
    env.result = &r;
    send_env(w, &env);
}

/* The leader: one message outside a batch. Takes ownership of buf. */
static void handle_idle(worker *w, uint8_t *buf, size_t len)
{
    Ditd__Envelope *env = ditd__envelope__unpack(NULL, len, buf);
    if (!env) {
        free(buf);
        return;
    }
    switch (env->msg_case) {
    case DITD__ENVELOPE__MSG_BATCH:
        if (!batch_ok(w, env->batch))
            break;
        if (group_send(w, GROUP_BATCH, buf, len)) {
            send_error(w, env->batch->batch_id, DITD_EUNAVAIL, "the replica's group failed");
            break;
        }
        run_batch(w, env->batch);
        break;
    case DITD__ENVELOPE__MSG_SHUTDOWN:
        w->stop = true;
        break;
    default: /* a cancel for a batch that is over */
        break;
    }
    ditd__envelope__free_unpacked(env, NULL);
    free(buf);
}

static void leader_loop(worker *w)
{
    ditd_transport *t = w->t;
    int err;

    send_heartbeat(w, true);
    while (!w->stop && !w->comm_err && !w->group_err) {
        uint8_t *buf = NULL;
        size_t len = 0;
        if (w->queued) {
            pending *p = w->queued;
            if (!(w->queued = p->next))
                w->queued_tail = &w->queued;
            handle_idle(w, p->buf, p->len);
            free(p);
            continue;
        }
        int wait = (int)(w->next_hb - now_ms());
        err = t->recv(t, &buf, &len, wait > 0 ? wait : 0);
        if (err == DITD_ETIMEDOUT) {
            send_heartbeat(w, true);
            continue;
        }
        if (err) {
            w->comm_err = err;
            break;
        }
        handle_idle(w, buf, len);
    }
    if (!w->group_err)
        group_send(w, GROUP_SHUTDOWN, NULL, 0);
    while (w->queued) { /* batches never started: tell the front-end */
        pending *p = w->queued;
        Ditd__Envelope *env = ditd__envelope__unpack(NULL, p->len, p->buf);
        if (env && env->msg_case == DITD__ENVELOPE__MSG_BATCH)
            send_error(w, env->batch->batch_id, DITD_EUNAVAIL, "the replica is shutting down");
        if (env)
            ditd__envelope__free_unpacked(env, NULL);
        w->queued = p->next;
        free(p->buf);
        free(p);
    }
    w->queued_tail = &w->queued;
}

static void follower_loop(worker *w)
{
    for (;;) {
        uint32_t kind = 0;
        size_t len = 0;
        int err = group_recv(w, &kind, &len);
        if (err) {
            fprintf(stderr, "ditd worker: replica %d, group rank %d: %s: %s\n", w->cfg->replica,
                    w->mesh->rank, ditd_strerror(err), ditd_err_detail());
            w->group_err = err;
            return;
        }
        if (kind != GROUP_BATCH)
            return; /* GROUP_SHUTDOWN */
        Ditd__Envelope *env = ditd__envelope__unpack(NULL, len, w->gbuf);
        if (!env || env->msg_case != DITD__ENVELOPE__MSG_BATCH) {
            /* the leader forwards only batches it unpacked: a broken group */
            fprintf(stderr, "ditd worker: replica %d, group rank %d: a group message of %zu "
                    "bytes is not a batch\n", w->cfg->replica, w->mesh->rank, len);
            if (env)
                ditd__envelope__free_unpacked(env, NULL);
            w->group_err = DITD_ECOMM;
            return;
        }
        run_batch(w, env->batch);
        ditd__envelope__free_unpacked(env, NULL);
        if (w->group_err)
            return;
    }
}

/* Whether every rank of the group started: each says, all learn who did
 * not. The leader's message names the ranks. */
static int group_agree(worker *w, int err, char *msg, size_t cap)
{
    if (!in_group(w))
        return err;
    int G = w->mesh->size, bad = 0, e2;
    float *f = calloc((size_t)G, sizeof *f);
    char *at = msg;
    if (!f) { /* cannot even agree: fail-stop */
        w->group_err = DITD_ECOMM;
        return ditd_err_set(DITD_ENOMEM, "group start-up");
    }
    f[w->mesh->rank] = err ? 1.0f : 0.0f;
    if ((e2 = ditd_comm_allreduce_sum(ditd_mesh_comm(w->mesh, DITD_AXIS_GROUP), DITD_DTYPE_F32, f,
                                      (size_t)G))) {
        free(f);
        w->group_err = DITD_ECOMM;
        return e2;
    }
    at += snprintf(at, cap, "group rank(s)");
    for (int g = 0; g < G; g++) {
        if (f[g] > 0.5f) {
            bad++;
            if ((size_t)(at - msg) + 16 < cap)
                at += snprintf(at, cap - (size_t)(at - msg), " %d", g);
        }
    }
    if ((size_t)(at - msg) + 40 < cap)
        snprintf(at, cap - (size_t)(at - msg), " of %d failed to start (see their logs)", G);
    free(f);
    if (bad && !err)
        err = ditd_err_set(DITD_EUNAVAIL, "%s", msg);
    return err;
}

int ditd_worker_run(const ditd_worker_config *cfg, ditd_transport *t)
{
    worker *w = calloc(1, sizeof *w);
    const ditd_backend_ops *ops = NULL;
    char msg[1024] = "", who[256] = "";
    int err = 0, own, have_info = 0;

    if (!w)
        return DITD_ENOMEM;
    w->cfg = cfg;
    w->t = t;
    w->mesh = cfg->mesh;
    w->leader = !cfg->mesh || ditd_mesh_is_leader(cfg->mesh);
    w->queued_tail = &w->queued;
    if (w->leader != (t != NULL)) {
        free(w);
        return ditd_err_set(DITD_EINVAL, "a transport on the leader and only there");
    }

    /* Every step runs on every rank, whatever failed before it, so that
     * all reach group_agree() (no rank may leave the others in a
     * collective). */
    if (cfg->max_batch < 1 || cfg->max_batch > DITD_WORKER_MAX_BATCH || cfg->heartbeat_ms <= 0)
        err = ditd_err_set(DITD_EINVAL, "max batch %d (1..%d), heartbeat %d ms", cfg->max_batch,
                           DITD_WORKER_MAX_BATCH, cfg->heartbeat_ms);
    /* the device: for CUDA this rank's GPU (cudaSetDevice(local rank)),
     * on this thread, before anything touches it; a group on GPUs then
     * moves its axis collectives to NCCL (collective: every rank calls it,
     * and they agree first) */
    if (!err && !(err = ditd_backend_check((ditd_device)cfg->device)) &&
        !(ops = ditd_backend_open((ditd_device)cfg->device)))
        err = DITD_EDEVICE;
    if (cfg->device != DITD_DEVICE_CPU && in_group(w)) {
        char own_detail[512];
        snprintf(own_detail, sizeof own_detail, "%s", ditd_err_detail());
        int e = ditd_mesh_use_nccl(cfg->mesh, !err, cfg->comm_timeout_ms);
        if (err)
            ditd_err_set(err, "%s", own_detail);
        else
            err = e;
    }
    if (!err && !(err = ditd_model_info_load(cfg->model_dir, &w->info)))
        have_info = 1;
    if (!err && w->info.needs_vae)
        err = ditd_err_set(DITD_EUNSUPPORTED, "%s is a latent model; the VAE decoder is not there yet",
                           cfg->model_dir);
    if (!err) { /* the weight dtype: --dtype, or auto by the checkpoint's */
        ditd_dtype ckpt;
        const ditd_backend_ops *wops;
        if (!(err = ditd_dit_checkpoint_dtype(w->info.transformer_dir, &ckpt))) {
            wops = ditd_backend_for_weights(
                ops, cfg->weight_dtype < 0 ? "auto" : ditd_dtype_name((ditd_dtype)cfg->weight_dtype),
                ckpt);
            if (wops)
                ops = wops;
            else
                err = DITD_EINVAL;
        }
    }
    if (!err)
        err = ditd_pipeline_new_group(&w->info, ops, cfg->max_batch, w->mesh, &w->pipe);
    if (!err) {
        size_t numel = (size_t)w->info.dit.in_channels * (size_t)w->info.dit.sample_size *
                       (size_t)w->info.dit.sample_size;
        ops->set_threads(cfg->threads);
        w->out = malloc((size_t)cfg->max_batch * numel * sizeof *w->out);
        w->pix = w->leader ? malloc((size_t)cfg->max_batch * numel) : NULL;
        if (!w->out || (w->leader && !w->pix))
            err = ditd_err_set(DITD_ENOMEM, "batch buffers");
    }
    if (err) /* the caller logs this rank's own reason (ditd_err_detail) */
        snprintf(msg, sizeof msg, "%s: %s", ditd_strerror(err), ditd_err_detail());
    own = err;
    err = group_agree(w, err, who, sizeof who);
    if (err) {
        if (w->leader && !w->group_err) {
            char full[1400];
            /* the leader's own reason, or which ranks of its group failed */
            snprintf(full, sizeof full, "replica %d: %s", cfg->replica, own ? msg : who);
            send_error(w, 0, err, full);
        }
        goto done;
    }

    if (w->leader)
        leader_loop(w);
    else
        follower_loop(w);
    err = w->group_err ? DITD_ECOMM : w->comm_err ? DITD_ECOMM : 0;
    if (err)
        ditd_err_set(err, "replica %d: %s", cfg->replica,
                     w->group_err ? "the group fell out of step" : "the transport to the front-end failed");
done:
    if (w->leader && !w->comm_err)
        send_heartbeat(w, false); /* bye */
    free(w->gbuf);
    free(w->pix);
    free(w->out);
    ditd_pipeline_free(w->pipe);
    if (have_info)
        ditd_model_info_free(&w->info);
    free(w);
    return err;
}

/* ------------------------------------------------------------------ */
/* hubs                                                                */

typedef struct msgq {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    ditd_hub_msg *head, **tail;
} msgq;

static void msgq_init(msgq *q)
{
    pthread_condattr_t ca;
    pthread_mutex_init(&q->mu, NULL);
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&q->cv, &ca);
    pthread_condattr_destroy(&ca);
    q->head = NULL;
    q->tail = &q->head;
}

static void msgq_destroy(msgq *q)
{
    ditd_hub_msg_free(q->head);
    pthread_mutex_destroy(&q->mu);
    pthread_cond_destroy(&q->cv);
}

static ditd_hub_msg *msg_new(int replica, const uint8_t *buf, size_t len)
{
    ditd_hub_msg *m = malloc(sizeof *m + len);
    if (!m)
        return NULL;
    m->next = NULL;
    m->replica = replica;
    m->len = len;
    memcpy(m->buf, buf, len);
    return m;
}

static void msgq_push(msgq *q, ditd_hub_msg *m)
{
    pthread_mutex_lock(&q->mu);
    *q->tail = m;
    q->tail = &m->next;
    pthread_cond_signal(&q->cv);
    pthread_mutex_unlock(&q->mu);
}

static ditd_hub_msg *msgq_take_all(msgq *q)
{
    ditd_hub_msg *m;
    pthread_mutex_lock(&q->mu);
    m = q->head;
    q->head = NULL;
    q->tail = &q->head;
    pthread_mutex_unlock(&q->mu);
    return m;
}

/* Pops one, waiting up to timeout_ms. */
static ditd_hub_msg *msgq_pop(msgq *q, int timeout_ms)
{
    ditd_hub_msg *m;
    struct timespec dl;
    clock_gettime(CLOCK_MONOTONIC, &dl);
    dl.tv_sec += timeout_ms / 1000;
    dl.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (dl.tv_nsec >= 1000000000L) {
        dl.tv_sec++;
        dl.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&q->mu);
    while (!q->head && timeout_ms > 0) {
        if (pthread_cond_timedwait(&q->cv, &q->mu, &dl) == ETIMEDOUT)
            break;
    }
    m = q->head;
    if (m && !(q->head = m->next))
        q->tail = &q->head;
    pthread_mutex_unlock(&q->mu);
    if (m)
        m->next = NULL;
    return m;
}

typedef struct inproc_end {
    ditd_transport base;
    ditd_hub *hub;
    int replica;
} inproc_end;

struct ditd_hub {
    int replicas;
    int mpi;
    ditd_hub_wake_fn wake;
    void *wake_ud;
    msgq in;          /* replicas -> front-end */
    msgq *out;        /* front-end -> replica r (in-process: one per replica) */
    inproc_end *ends; /* in-process */
    pthread_t thread; /* MPI */
    int group;        /* MPI: ranks per replica */
    uint8_t *bye;     /* MPI, the hub's thread only: replica r said bye */
    int nout;
    int stop;         /* MPI: guarded by out[0].mu */
};

void ditd_hub_msg_free(ditd_hub_msg *m)
{
    while (m) {
        ditd_hub_msg *n = m->next;
        free(m);
        m = n;
    }
}

static int inproc_send(ditd_transport *t, const uint8_t *buf, size_t len)
{
    inproc_end *e = (inproc_end *)t;
    ditd_hub_msg *m = msg_new(e->replica, buf, len);
    if (!m)
        return ditd_err_set(DITD_ENOMEM, "message");
    msgq_push(&e->hub->in, m);
    e->hub->wake(e->hub->wake_ud);
    return 0;
}

static int inproc_recv(ditd_transport *t, uint8_t **buf, size_t *len, int timeout_ms)
{
    inproc_end *e = (inproc_end *)t;
    ditd_hub_msg *m = msgq_pop(&e->hub->out[e->replica], timeout_ms);
    if (!m)
        return DITD_ETIMEDOUT;
    if (!(*buf = malloc(m->len ? m->len : 1))) {
        free(m);
        return ditd_err_set(DITD_ENOMEM, "message");
    }
    memcpy(*buf, m->buf, m->len);
    *len = m->len;
    free(m);
    return 0;
}

static int hub_alloc(int replicas, ditd_hub_wake_fn wake, void *ud, int nout, ditd_hub **out)
{
    ditd_hub *h = NULL;
    if (replicas < 1 || replicas > 4096)
        return ditd_err_set(DITD_EINVAL, "%d replicas", replicas);
    if (!(h = calloc(1, sizeof *h)))
        return ditd_err_set(DITD_ENOMEM, "hub");
    h->replicas = replicas;
    h->wake = wake;
    h->wake_ud = ud;
    msgq_init(&h->in);
    h->out = calloc((size_t)nout, sizeof *h->out);
    if (!h->out) {
        msgq_destroy(&h->in);
        free(h);
        return ditd_err_set(DITD_ENOMEM, "hub");
    }
    h->nout = nout;
    for (int i = 0; i < nout; i++)
        msgq_init(&h->out[i]);
    *out = h;
    return 0;
}

int ditd_hub_new_inproc(int replicas, ditd_hub_wake_fn wake, void *ud, ditd_hub **out)
{
    ditd_hub *h = NULL;
    int err;
    if ((err = hub_alloc(replicas, wake, ud, replicas, &h)))
        return err;
    if (!(h->ends = calloc((size_t)replicas, sizeof *h->ends))) {
        ditd_hub_free(h);
        return ditd_err_set(DITD_ENOMEM, "hub");
    }
    for (int r = 0; r < replicas; r++) {
        h->ends[r].base.send = inproc_send;
        h->ends[r].base.recv = inproc_recv;
        h->ends[r].hub = h;
        h->ends[r].replica = r;
    }
    *out = h;
    return 0;
}

ditd_transport *ditd_hub_transport(ditd_hub *h, int r)
{
    if (!h->ends || r < 0 || r >= h->replicas)
        return NULL;
    return &h->ends[r].base;
}

int ditd_hub_send(ditd_hub *h, int r, const uint8_t *buf, size_t len)
{
    ditd_hub_msg *m;
    if (r < 0 || r >= h->replicas)
        return ditd_err_set(DITD_EINVAL, "replica %d of %d", r, h->replicas);
    if (!(m = msg_new(r, buf, len)))
        return ditd_err_set(DITD_ENOMEM, "message");
    msgq_push(&h->out[h->mpi ? 0 : r], m);
    return 0;
}

ditd_hub_msg *ditd_hub_drain(ditd_hub *h)
{
    return msgq_take_all(&h->in);
}

/* ------------------------------------------------------------------ */
/* MPI                                                                 */

#if DITD_HAVE_MPI

static void sleep_us(long us)
{
    struct timespec ts = {0, us * 1000L};
    nanosleep(&ts, NULL);
}

static int mpi_send(ditd_transport *t, const uint8_t *buf, size_t len)
{
    (void)t;
    if (len > (size_t)0x7fffffff)
        return ditd_err_set(DITD_ECOMM, "message of %zu bytes", len);
    /* blocking is fine here: the hub on rank 0 always receives */
    if (MPI_Send(buf, (int)len, MPI_BYTE, 0, DITD_TAG, MPI_COMM_WORLD) != MPI_SUCCESS)
        return ditd_err_set(DITD_ECOMM, "MPI_Send to rank 0");
    return 0;
}

static int mpi_probe_recv(int src, uint8_t **buf, size_t *len, int *from)
{
    MPI_Status st;
    int flag = 0, count = 0;
    if (MPI_Iprobe(src, DITD_TAG, MPI_COMM_WORLD, &flag, &st) != MPI_SUCCESS)
        return ditd_err_set(DITD_ECOMM, "MPI_Iprobe");
    if (!flag)
        return DITD_ETIMEDOUT;
    MPI_Get_count(&st, MPI_BYTE, &count);
    if (!(*buf = malloc(count > 0 ? (size_t)count : 1)))
        return ditd_err_set(DITD_ENOMEM, "message");
    if (MPI_Recv(*buf, count, MPI_BYTE, st.MPI_SOURCE, DITD_TAG, MPI_COMM_WORLD,
                 MPI_STATUS_IGNORE) != MPI_SUCCESS) {
        free(*buf);
        return ditd_err_set(DITD_ECOMM, "MPI_Recv from rank %d", st.MPI_SOURCE);
    }
    *len = (size_t)count;
    if (from)
        *from = st.MPI_SOURCE;
    return 0;
}

static int mpi_recv(ditd_transport *t, uint8_t **buf, size_t *len, int timeout_ms)
{
    double dl = now_ms() + timeout_ms;
    (void)t;
    for (;;) {
        int err = mpi_probe_recv(0, buf, len, NULL);
        if (err != DITD_ETIMEDOUT || now_ms() >= dl)
            return err;
        sleep_us(500);
    }
}

int ditd_mpi_transport_new(ditd_transport **out)
{
    ditd_transport *t = calloc(1, sizeof *t);
    if (!t)
        return ditd_err_set(DITD_ENOMEM, "transport");
    t->send = mpi_send;
    t->recv = mpi_recv;
    *out = t;
    return 0;
}

/* A worker's last message: a Heartbeat with ready = false. */
static int is_bye(const uint8_t *buf, size_t len)
{
    int bye = 0;
    if (len > 64) /* a heartbeat is a few bytes; a result is not read here */
        return 0;
    Ditd__Envelope *env = ditd__envelope__unpack(NULL, len, buf);
    if (env) {
        bye = env->msg_case == DITD__ENVELOPE__MSG_HEARTBEAT && !env->heartbeat->ready;
        ditd__envelope__free_unpacked(env, NULL);
    }
    return bye;
}

/* The hub's thread: the only caller of MPI on rank 0 while the hub lives.
 * Starts sends of what the loop queued (MPI_Isend: it never blocks, so a
 * replica blocked sending it a large result is always received), receives
 * what the replicas sent, and naps 0.5 ms when there was nothing to do.
 * After stop: goes on until its sends are done and every replica said bye
 * (or 30 s). */
static void *hub_thread(void *arg)
{
    ditd_hub *h = arg;
    ditd_hub_msg **sent = NULL; /* in flight, with their requests */
    MPI_Request *req = NULL;
    int nsent = 0, cap = 0, byes = 0;
    double stop_at = 0;
    for (;;) {
        int stop, busy = 0;
        ditd_hub_msg *m;
        pthread_mutex_lock(&h->out[0].mu);
        stop = h->stop;
        m = h->out[0].head;
        h->out[0].head = NULL;
        h->out[0].tail = &h->out[0].head;
        pthread_mutex_unlock(&h->out[0].mu);
        while (m) {
            ditd_hub_msg *n = m->next;
            if (nsent == cap) {
                int nc = cap ? 2 * cap : 16;
                ditd_hub_msg **ns = realloc(sent, (size_t)nc * sizeof *ns);
                MPI_Request *nr = ns ? realloc(req, (size_t)nc * sizeof *nr) : NULL;
                if (ns)
                    sent = ns;
                if (nr)
                    req = nr;
                if (!ns || !nr) { /* no memory to track it: send it blocking */
                    MPI_Send(m->buf, (int)m->len, MPI_BYTE, 1 + m->replica * h->group, DITD_TAG,
                             MPI_COMM_WORLD);
                    free(m);
                    m = n;
                    continue;
                }
                cap = nc;
            }
            MPI_Isend(m->buf, (int)m->len, MPI_BYTE, 1 + m->replica * h->group, DITD_TAG,
                      MPI_COMM_WORLD, &req[nsent]);
            sent[nsent++] = m;
            m = n;
            busy = 1;
        }
        for (int i = 0; i < nsent;) {
            int done = 0;
            MPI_Test(&req[i], &done, MPI_STATUS_IGNORE);
            if (!done) {
                i++;
                continue;
            }
            free(sent[i]);
            sent[i] = sent[--nsent];
            req[i] = req[nsent];
        }
        for (int k = 0; k < 64; k++) {
            uint8_t *buf = NULL;
            size_t len = 0;
            int from = 0, r;
            if (mpi_probe_recv(MPI_ANY_SOURCE, &buf, &len, &from))
                break;
            r = (from - 1) / h->group;
            if (r >= 0 && r < h->replicas && !h->bye[r] && is_bye(buf, len)) {
                h->bye[r] = 1;
                byes++;
            }
            ditd_hub_msg *im = msg_new(r, buf, len);
            free(buf);
            if (im)
                msgq_push(&h->in, im);
            busy = 1;
        }
        if (stop) {
            if (stop_at == 0)
                stop_at = now_ms();
            if (nsent == 0 && byes == h->replicas)
                break;
            if (now_ms() - stop_at > 30e3) {
                fprintf(stderr, "ditd hub: %d of %d replica(s) did not say bye, %d send(s) "
                        "pending; stopping anyway\n", h->replicas - byes, h->replicas, nsent);
                break; /* what is still in flight is left to MPI_Finalize / the exit */
            }
        }
        if (busy)
            h->wake(h->wake_ud);
        else
            sleep_us(500);
    }
    if (nsent == 0) {
        free(sent);
        free(req);
    }
    return NULL;
}

int ditd_hub_new_mpi(int replicas, int group_size, ditd_hub_wake_fn wake, void *ud,
                     ditd_hub **out)
{
    ditd_hub *h = NULL;
    int err;
    if (group_size < 1 || (long)replicas * group_size + 1 > 1L << 24)
        return ditd_err_set(DITD_EINVAL, "%d replicas of %d ranks", replicas, group_size);
    if ((err = hub_alloc(replicas, wake, ud, 1, &h)))
        return err;
    h->group = group_size;
    if (!(h->bye = calloc((size_t)replicas, sizeof *h->bye))) {
        ditd_hub_free(h);
        return ditd_err_set(DITD_ENOMEM, "hub");
    }
    h->mpi = 1;
    if (pthread_create(&h->thread, NULL, hub_thread, h)) {
        h->mpi = 0; /* no thread to join */
        ditd_hub_free(h);
        return ditd_err_set(DITD_EINTERNAL, "hub thread");
    }
    *out = h;
    return 0;
}

#else

int ditd_mpi_transport_new(ditd_transport **out)
{
    *out = NULL;
    return ditd_err_set(DITD_EUNSUPPORTED, "ditd was built without MPI");
}
int ditd_hub_new_mpi(int replicas, int group_size, ditd_hub_wake_fn wake, void *ud,
                     ditd_hub **out)
{
    (void)replicas, (void)group_size, (void)wake, (void)ud;
    *out = NULL;
    return ditd_err_set(DITD_EUNSUPPORTED, "ditd was built without MPI");
}

#endif

void ditd_hub_free(ditd_hub *h)
{
    if (!h)
        return;
#if DITD_HAVE_MPI
    if (h->mpi) {
        pthread_mutex_lock(&h->out[0].mu);
        h->stop = 1;
        pthread_mutex_unlock(&h->out[0].mu);
        pthread_join(h->thread, NULL);
    }
#endif
    msgq_destroy(&h->in);
    for (int i = 0; i < h->nout; i++)
        msgq_destroy(&h->out[i]);
    free(h->out);
    free(h->ends);
    free(h->bye);
    free(h);
}
