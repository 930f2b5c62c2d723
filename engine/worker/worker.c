/* The worker loop of a replica (its transports: engine/worker/hub.c). */
#include "engine/worker/worker.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ditd_build_config.h"
#include "engine/backend/backend.h"
#include "engine/core/error.h"
#include "engine/models/lora.h"
#include "engine/models/model.h"
#include "engine/pipeline/pipeline.h"
#include "engine/pipeline/latent_image.h"
#include "engine/pipeline/latent_video.h"
#include "engine/pipeline/prompt_encoder.h"
#include "engine/worker/cache_msg.h"
#include "proto/ditd.pb-c.h"

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
    ditd_cache_config cache_cfg; /* the running batch's step caching (method none: off) */
    ditd_latent_image *li; /* a latent model's VAE decode (the whole group), else NULL */
    ditd_latent_video *lv; /* a video model's decode on the whole group (latent_video.h; the
                            * leader makes the frames) */
    /* a text model: the encoders on the text-encoder rank (else NULL), and
     * every rank's embeddings of the running batch: prompt i at te[i], its
     * negative at te[max_batch + i] */
    ditd_prompt_encoder *penc;
    int text_rank;         /* group rank of the encoders */
    int Dt, Dp;
    float *emb;            /* (2 max_batch, text_len(Lmax) Dt + Dp) */
    ditd_text_embeds *te;  /* (2 max_batch) */
    ditd_prompt_stats pstats; /* the text rank's, as its last broadcast said (leader) */
    /* LoRA adapters (cfg->loras), on the denoiser's device; the leader keeps
     * the files' host copies until its Adapters message is sent */
    int n_lora;
    ditd_lora_dev **lora_dev;
    ditd_lora **lora_host;
    ditd_lora_set lsets[DITD_WORKER_MAX_BATCH]; /* the running batch's, per sample */
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
    float *out;    /* max_batch latents of numel_lat (C h w) */
    uint8_t *pix;  /* max_batch images of numel_img (H W C pixels), previews and results (leader) */
    size_t numel_lat, numel_img;   /* at the running batch's size */
    size_t cap_lat, cap_img;       /* what out and pix hold per sample */
    int img_w, img_h;              /* the running batch's image, pixels */
    int frames;                    /* a video model: the running batch's clip in pixel frames
                                    * (its images are (frames, H, W, C)); 0 for images */
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
    hb.text_cache_hits = w->pstats.hits;
    hb.text_cache_misses = w->pstats.misses;
    hb.text_cache_entries = w->pstats.entries;
    hb.text_encode_ms = w->pstats.encode_ms;
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

/* One sample's latents (C, h, w) to its image (H, W, C) 8-bit. A
 * pixel-space model's latents are the image (DiTPipeline's mapping); a
 * latent model's go through its VAE, which the worker refuses to load
 * without (worker_init). */
static void latents_to_image(const worker *w, const float *lat, uint8_t *px)
{
    const ditd_denoiser_shapes *sh = &w->pipe->shapes;
    ditd_pipeline_to_pixels(lat, sh->in_channels, sh->height, sh->width, px);
}

/* The step callback: on the leader only. What it decides (active flags,
 * stop) the pipeline broadcasts to the group after it returns. */
static int on_step(void *ud, int step, int total, const float *x0, uint8_t *active)
{
    worker *w = ud;
    const Ditd__Batch *b = w->batch;
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
        /* no previews of a latent model: its decode is collective, this callback the leader's */
        if (w->li || w->info.frames > 0 || !w->active[i] ||
            !preview_due(k, w->partial_sent[i], step, total))
            continue;
        uint8_t *px = w->pix + (size_t)pg.n_previews * w->numel_img;
        latents_to_image(w, x0 + i * w->numel_lat, px);
        ditd__preview__init(&pv[pg.n_previews]);
        pv[pg.n_previews].slot = (uint32_t)i;
        pv[pg.n_previews].partial_index = (uint32_t)w->partial_sent[i]++;
        pv[pg.n_previews].pixels.data = px;
        pv[pg.n_previews].pixels.len = w->numel_img;
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

/* The index of the loaded adapter called name, or -1. */
static int find_lora(const worker *w, const char *name)
{
    for (int k = 0; k < w->n_lora; k++)
        if (!strcmp(w->lora_dev[k]->name, name))
            return k;
    return -1;
}

/* Every rank: sample i's adapter set from its message (batch_ok checked
 * the names on the leader; the group runs the same bytes). */
static int set_loras(worker *w, int i, const Ditd__Sample *sm)
{
    ditd_lora_set *ls = &w->lsets[i];
    ls->n = 0;
    w->samples[i].loras = NULL;
    if (!sm->n_lora_names)
        return 0;
    if (sm->n_lora_names != sm->n_lora_scales || sm->n_lora_names > DITD_LORA_MAX_SET)
        return ditd_err_set(DITD_EINVAL, "sample %d: LoRA names and scales do not pair", i);
    for (size_t k = 0; k < sm->n_lora_names; k++) {
        int a = find_lora(w, sm->lora_names[k]);
        if (a < 0)
            return ditd_err_set(DITD_EINVAL, "sample %d: LoRA adapter '%.64s' is not loaded", i,
                                sm->lora_names[k]);
        ls->ad[ls->n] = w->lora_dev[a];
        ls->weight[ls->n++] = sm->lora_scales[k];
    }
    w->samples[i].loras = ls;
    return 0;
}

/* The leader's check of a batch before the group sees it: 0, or an Error
 * went to the front-end. */
static int batch_ok(worker *w, const Ditd__Batch *b)
{
    const ditd_model_info *m = &w->info;
    int n = (int)b->n_samples;
    char msg[512];

    if (n < 1 || n > w->cfg->max_batch) {
        snprintf(msg, sizeof msg, "batch of %d samples (1..%d)", n, w->cfg->max_batch);
        send_error(w, b->batch_id, DITD_EINVAL, msg);
        return 0;
    }
    if (b->width > 16384 || b->height > 16384 ||
        ditd_model_check_size(m, (int)b->width, (int)b->height)) {
        if (b->width > 16384 || b->height > 16384)
            snprintf(msg, sizeof msg, "size %ux%u pixels", b->width, b->height);
        else
            snprintf(msg, sizeof msg, "%s", ditd_err_detail());
        send_error(w, b->batch_id, DITD_EINVAL, msg);
        return 0;
    }
    if (m->shapes.cond.kind == DITD_COND_TEXT &&
        (b->max_sequence_length < 1 || b->max_sequence_length > (uint32_t)m->max_sequence_length)) {
        snprintf(msg, sizeof msg, "max_sequence_length %u (1..%d)", b->max_sequence_length,
                 m->max_sequence_length);
        send_error(w, b->batch_id, DITD_EINVAL, msg);
        return 0;
    }
    if (b->sampler >= DITD_SAMPLER_KIND_COUNT) {
        send_error(w, b->batch_id, DITD_EINVAL, "unknown sampler");
        return 0;
    }
    if (b->n_skip_layers > DITD_MAX_SKIP_LAYERS ||
        (b->n_skip_layers > 0 && !(m->pipeline->request & DITD_REQ_SKIP_LAYERS))) {
        snprintf(msg, sizeof msg, "%zu skip_guidance_layers (%s takes %d)", b->n_skip_layers,
                 m->pipeline->name,
                 m->pipeline->request & DITD_REQ_SKIP_LAYERS ? DITD_MAX_SKIP_LAYERS : 0);
        send_error(w, b->batch_id, DITD_EINVAL, msg);
        return 0;
    }
    if (m->frames > 0 ? b->num_frames < 1 || ditd_model_check_frames(m, (int)b->num_frames) ||
                            ditd_model_round_frames(m, (int)b->num_frames) != (int)b->num_frames
                      : b->num_frames > 1) {
        if (m->frames > 0 && b->num_frames >= 1 && ditd_model_check_frames(m, (int)b->num_frames))
            snprintf(msg, sizeof msg, "%s", ditd_err_detail());
        else
            snprintf(msg, sizeof msg, "num_frames %u: %s takes %s", b->num_frames, m->name,
                     m->frames > 0 ? "1 + k x its temporal scale" : "images only");
        send_error(w, b->batch_id, DITD_EINVAL, msg);
        return 0;
    }
    if (ditd_cache_msg_to_config(b->cache, &w->cache_cfg)) {
        snprintf(msg, sizeof msg, "%s", ditd_err_detail());
        send_error(w, b->batch_id, DITD_EINVAL, msg);
        return 0;
    }
    for (int i = 0; i < n; i++) {
        const Ditd__Sample *sm = b->samples[i];
        if (sm->n_lora_names != sm->n_lora_scales || sm->n_lora_names > DITD_LORA_MAX_SET) {
            snprintf(msg, sizeof msg, "sample %d: %zu LoRA names, %zu scales (at most %d)", i,
                     sm->n_lora_names, sm->n_lora_scales, DITD_LORA_MAX_SET);
            send_error(w, b->batch_id, DITD_EINVAL, msg);
            return 0;
        }
        for (size_t k = 0; k < sm->n_lora_names; k++)
            if (find_lora(w, sm->lora_names[k]) < 0 || !isfinite(sm->lora_scales[k])) {
                snprintf(msg, sizeof msg, "sample %d: LoRA adapter '%.64s' %s", i,
                         sm->lora_names[k],
                         find_lora(w, sm->lora_names[k]) < 0 ? "is not loaded on this replica"
                                                             : "has a scale that is not finite");
                send_error(w, b->batch_id, DITD_EINVAL, msg);
                return 0;
            }
    }
    return 1;
}

/* The batch buffers for the pipeline's current size (out on every rank,
 * pix on the leader), grown when a size needs more. */
static int plan_batch_buffers(worker *w)
{
    const ditd_model_info *m = &w->info;
    size_t nl = w->pipe->numel, ni;
    if (w->li) {
        w->img_w = w->li->W;
        w->img_h = w->li->H;
        ni = (size_t)w->li->W * (size_t)w->li->H * (size_t)w->li->Co;
    } else {
        w->img_w = w->pipe->shapes.width * (m->vae_scale > 0 ? m->vae_scale : 1);
        w->img_h = w->pipe->shapes.height * (m->vae_scale > 0 ? m->vae_scale : 1);
        ni = (size_t)w->img_w * (size_t)w->img_h * (size_t)m->image_channels;
        if (w->frames > 0) /* a clip: (F, H, W, C) */
            ni *= (size_t)w->frames;
    }
    w->numel_lat = nl;
    w->numel_img = ni;
    if (nl > w->cap_lat) {
        free(w->out);
        if (!(w->out = malloc((size_t)w->cfg->max_batch * nl * sizeof *w->out))) {
            w->cap_lat = 0;
            return ditd_err_set(DITD_ENOMEM, "batch buffers");
        }
        w->cap_lat = nl;
    }
    if (w->leader && ni > w->cap_img) {
        free(w->pix);
        if (!(w->pix = malloc((size_t)w->cfg->max_batch * ni))) {
            w->cap_img = 0;
            return ditd_err_set(DITD_ENOMEM, "image buffers");
        }
        w->cap_img = ni;
    }
    return 0;
}

/* Every rank: the batch's size. A model that takes any size re-plans its
 * pipeline and VAE (same sizes on every rank, so the same outcome). */
static int set_batch_size(worker *w, const Ditd__Batch *b)
{
    const ditd_model_info *m = &w->info;
    int err;
    if (m->resizable) {
        int h = (int)b->height / m->vae_scale, wd = (int)b->width / m->vae_scale;
        int L = m->shapes.cond.kind == DITD_COND_TEXT
                    ? ditd_pipeline_class_text_len(m->pipeline, (int)b->max_sequence_length)
                    : 0;
        if (m->frames > 0) { /* batch_ok checked the count */
            w->frames = (int)b->num_frames;
            err = ditd_pipeline_set_video_size(w->pipe, ditd_model_latent_frames(m, w->frames), h,
                                               wd, L);
        } else {
            err = ditd_pipeline_set_size(w->pipe, h, wd, L);
        }
        if (err || (w->li && (err = ditd_latent_image_set_size(w->li, h, wd))))
            return err;
    }
    return plan_batch_buffers(w);
}

/* What the text-encoder rank tells its group before the embeddings. */
typedef struct text_hdr {
    int32_t err;
    uint32_t pad;
    ditd_prompt_stats st;
    char msg[480];
} text_hdr;

/* Whether sample sm runs the unconditional pass on a negative prompt: the
 * pipeline row's rule. */
static int wants_negative(const worker *w, const Ditd__Sample *sm)
{
    return ditd_pipeline_class_needs_negative(w->info.pipeline, sm->guidance, sm->true_cfg,
                                              sm->has_negative, w->info.shapes.guidance_embed);
}

static const char *or_empty(const char *s)
{
    return s ? s : "";
}

/* Every rank: the batch's prompts (and the negative prompts of samples
 * whose unconditional pass runs) encoded once on the text-encoder rank,
 * broadcast to the group; sample i's cond points at them. An encoder's
 * error is every rank's (it travels in the header). */
static int encode_prompts(worker *w, const Ditd__Batch *b)
{
    const int n = (int)b->n_samples, L = (int)b->max_sequence_length;
    const int T = ditd_pipeline_class_text_len(w->info.pipeline, L);
    const size_t one = (size_t)T * (size_t)w->Dt + (size_t)w->Dp;
    const int me = in_group(w) ? w->mesh->rank : 0;
    text_hdr h;
    int err = 0;

    memset(&h, 0, sizeof h);
    if (me == w->text_rank) {
        for (int i = 0; i < n && !err; i++) {
            const Ditd__Sample *sm = b->samples[i];
            float *e = w->emb + (size_t)i * one, *ne = w->emb + (size_t)(n + i) * one;
            ditd_prompt_texts pt = {
                .texts = {or_empty(sm->prompt), or_empty(sm->prompt_2), or_empty(sm->prompt_3)}};
            ditd_prompt_texts nt = {.texts = {or_empty(sm->negative_prompt),
                                              or_empty(sm->negative_prompt_2),
                                              or_empty(sm->negative_prompt_3)}};
            for (int k = 0; k < 3; k++) {
                pt.lens[k] = strlen(pt.texts[k]);
                nt.lens[k] = strlen(nt.texts[k]);
            }
            err = ditd_prompt_encoder_encode_n(w->penc, &pt, L, e, e + (size_t)T * w->Dt);
            if (!err && wants_negative(w, sm))
                err = ditd_prompt_encoder_encode_n(w->penc, &nt, L, ne, ne + (size_t)T * w->Dt);
            if (!err && w->t && now_ms() >= w->next_hb) /* long encoders: stay alive */
                send_heartbeat(w, true);
            if (err)
                snprintf(h.msg, sizeof h.msg, "sample %d: %s", i, ditd_err_detail());
        }
        h.err = err;
        ditd_prompt_encoder_stats(w->penc, &h.st);
    }
    if (in_group(w)) {
        ditd_comm *g = w->mesh->group;
        if ((err = ditd_comm_bcast(g, &h, sizeof h, w->text_rank)) ||
            (!h.err && (err = ditd_comm_bcast(g, w->emb, 2 * (size_t)n * one * sizeof(float),
                                              w->text_rank)))) {
            w->group_err = err;
            return err;
        }
    }
    w->pstats = h.st;
    if (h.err) {
        h.msg[sizeof h.msg - 1] = '\0';
        return ditd_err_set(h.err, "%s", h.msg);
    }
    for (int i = 0; i < n; i++) {
        float *e = w->emb + (size_t)i * one, *ne = w->emb + (size_t)(n + i) * one;
        w->te[i] = (ditd_text_embeds){.seq = e, .pooled = w->Dp ? e + (size_t)T * w->Dt : NULL};
        w->te[n + i] = (ditd_text_embeds){.seq = ne,
                                          .pooled = w->Dp ? ne + (size_t)T * w->Dt : NULL};
        w->samples[i].cond.prompt = &w->te[i];
        w->samples[i].cond.negative = wants_negative(w, b->samples[i]) ? &w->te[n + i] : NULL;
    }
    return 0;
}

/* Every rank of the group, with the same batch (checked by batch_ok on the
 * leader). The leader sends the outcome. */
static void run_batch(worker *w, const Ditd__Batch *b)
{
    const ditd_model_info *m = &w->info;
    int n = (int)b->n_samples, err = 0;
    ditd_gen_params gp;
    char msg[512];

    memset(&gp, 0, sizeof gp);
    gp.steps = (int)b->steps;
    gp.sampler = (ditd_sampler_kind)b->sampler;
    gp.n_skip_layers = (int)b->n_skip_layers; /* batch_ok checked the count */
    for (int i = 0; i < gp.n_skip_layers; i++)
        gp.skip_layers[i] = (int)b->skip_layers[i];
    gp.slg_scale = b->slg_scale;
    gp.slg_start = b->slg_start;
    gp.slg_stop = b->slg_stop;
    for (int i = 0; i < n; i++) {
        w->samples[i].seed = b->samples[i]->seed;
        w->samples[i].index = b->samples[i]->index;
        w->samples[i].cond = (ditd_cond_input){.class_id = b->samples[i]->class_id};
        w->samples[i].guidance = b->samples[i]->guidance;
        w->samples[i].true_cfg = b->samples[i]->true_cfg;
        w->samples[i].has_guidance_2 = b->samples[i]->has_guidance_2;
        w->samples[i].guidance_2 = b->samples[i]->guidance_2;
        w->active[i] = 1;
        w->partial_sent[i] = 0;
        if (!err)
            err = set_loras(w, i, b->samples[i]);
    }
    w->batch = b;
    w->t_start = w->t_step = now_ms();
    /* step caching: every rank sets the batch's (the leader's batch_ok
     * checked it; the same bytes give the same config on every rank) */
    if (!err)
        err = ditd_cache_msg_to_config(b->cache, &w->cache_cfg);
    if (!err)
        err = ditd_pipeline_set_cache(w->pipe, &w->cache_cfg);
    if (!err)
        err = set_batch_size(w, b);
    if (!err && w->te)
        err = encode_prompts(w, b);
    if (!err && !w->group_err)
        err = ditd_pipeline_generate(w->pipe, &gp, n, w->samples, NULL, w->out, w->active,
                                     w->leader ? on_step : NULL, w);
    w->batch = NULL;
    /* a latent model: the group decodes the latents together */
    if (!err && w->li)
        err = ditd_latent_image_run(w->li, w->out, n, w->active, w->leader ? w->pix : NULL);
    /* a video model: the group decodes each clip still wanted (the same
     * active flags on every rank), the leader gets the frames */
    for (int i = 0; !err && w->lv && i < n; i++) {
        const ditd_denoiser_shapes *sh = &w->pipe->shapes;
        if (w->active[i])
            err = ditd_latent_video_run(w->lv, w->out + (size_t)i * w->numel_lat, 1, sh->frames,
                                        sh->height, sh->width,
                                        w->leader ? w->pix + (size_t)i * w->numel_img : NULL);
    }
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
    Ditd__CacheStats cs[DITD_WORKER_MAX_BATCH], *csp[DITD_WORKER_MAX_BATCH];
    r.batch_id = b->batch_id;
    r.width = (uint32_t)w->img_w;
    r.height = (uint32_t)w->img_h;
    r.channels = (uint32_t)m->image_channels;
    r.frames = (uint32_t)w->frames;
    r.compute_ms = now_ms() - w->t_start;
    for (int i = 0; i < n; i++) {
        ditd__image__init(&im[i]);
        im[i].slot = (uint32_t)i;
        im[i].canceled = !w->active[i];
        if (w->active[i]) {
            uint8_t *px = w->pix + (size_t)i * w->numel_img;
            if (!w->li && !w->lv) /* a latent model's pixels came from its VAE */
                latents_to_image(w, w->out + (size_t)i * w->numel_lat, px);
            im[i].pixels.data = px;
            im[i].pixels.len = w->numel_img;
        }
        imp[i] = &im[i];
    }
    r.n_images = (size_t)n;
    r.images = imp;
    if (w->cache_cfg.method != DITD_CACHE_NONE) {
        for (int i = 0; i < n; i++) {
            ditd_cache_stats st;
            ditd_pipeline_cache_stats(w->pipe, i, &st);
            ditd__cache_stats__init(&cs[i]);
            cs[i].slot = (uint32_t)i;
            cs[i].steps = (uint32_t)st.steps;
            cs[i].steps_skipped = (uint32_t)st.steps_skipped;
            cs[i].evals = (uint64_t)st.evals;
            cs[i].evals_skipped = (uint64_t)st.evals_skipped;
            csp[i] = &cs[i];
        }
        r.n_cache = (size_t)n;
        r.cache = csp;
    }
    env.msg_case = DITD__ENVELOPE__MSG_RESULT;
    env.result = &r;
    send_env(w, &env);
    if (w->te) /* the text cache's counters moved: /metrics hears it now */
        send_heartbeat(w, true);
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

/* A text model: the encoders on the text-encoder rank, the embedding
 * buffers on every rank. The encoders' widths are the transformer's. */
static int text_init(worker *w)
{
    const ditd_model_info *m = &w->info;
    const int G = in_group(w) ? w->mesh->size : 1, me = in_group(w) ? w->mesh->rank : 0;
    const size_t one =
        (size_t)ditd_pipeline_class_text_len(m->pipeline, m->max_sequence_length) *
            (size_t)m->shapes.cond.text_dim +
        (size_t)m->shapes.cond.pooled_dim;
    if (w->cfg->text_encoder_rank < 0 || w->cfg->text_encoder_rank >= G)
        return ditd_err_set(DITD_EINVAL, "text encoder rank %d: the replica's group has ranks 0..%d",
                            w->cfg->text_encoder_rank, G - 1);
    w->text_rank = w->cfg->text_encoder_rank;
    w->Dt = m->shapes.cond.text_dim;
    w->Dp = m->shapes.cond.pooled_dim;
    w->emb = malloc(2 * (size_t)w->cfg->max_batch * one * sizeof *w->emb);
    w->te = calloc(2 * (size_t)w->cfg->max_batch, sizeof *w->te);
    if (!w->emb || !w->te)
        return ditd_err_set(DITD_ENOMEM, "text embeddings for %d samples", w->cfg->max_batch);
    if (me != w->text_rank)
        return 0;
    ditd_prompt_encoder_opts o = {
        .max_sequence_length = m->max_sequence_length,
        .cache_entries = w->cfg->text_cache_entries > 0 ? (size_t)w->cfg->text_cache_entries : 0,
        .cache_bytes = (size_t)(w->cfg->text_cache_mb > 0 ? w->cfg->text_cache_mb : 1) << 20,
    };
    /* the encoders run on the CPU backend (on a GPU replica too: the GPU
     * is the denoiser's) */
    return ditd_prompt_encoder_new(m, &ditd_backend_cpu, &o, &w->penc);
}

/* Every rank: reads and uploads cfg->loras for the denoiser. The leader
 * keeps the host copies for its Adapters message. A file that does not
 * load is named, with the loader's reason. */
static int lora_init(worker *w)
{
    const ditd_worker_config *cfg = w->cfg;
    const ditd_denoiser *den = w->pipe->den;
    int err;
    if (cfg->n_loras <= 0)
        return 0;
    if (den->n_lora_targets <= 0)
        return ditd_err_set(DITD_EUNSUPPORTED, "--lora %s=%s: %s", cfg->loras[0].name,
                            cfg->loras[0].path, den->lora_refusal);
    w->lora_dev = calloc((size_t)cfg->n_loras, sizeof *w->lora_dev);
    w->lora_host = calloc((size_t)cfg->n_loras, sizeof *w->lora_host);
    if (!w->lora_dev || !w->lora_host)
        return ditd_err_set(DITD_ENOMEM, "%d LoRA adapters", cfg->n_loras);
    for (int i = 0; i < cfg->n_loras; i++) {
        ditd_lora *l = NULL;
        ditd_lora_dev *d = NULL;
        if ((err = ditd_lora_open(cfg->loras[i].path, cfg->loras[i].name, den->lora_targets,
                                  den->n_lora_targets, &l)) ||
            (err = ditd_lora_dev_new(l, w->pipe->ops, den->n_lora_targets, &d))) {
            char why[768];
            snprintf(why, sizeof why, "%s", ditd_err_detail());
            ditd_lora_free(l);
            return ditd_err_set(err, "--lora %s=%s: %s", cfg->loras[i].name, cfg->loras[i].path,
                                why);
        }
        w->lora_dev[w->n_lora++] = d;
        if (w->leader)
            w->lora_host[i] = l;
        else
            ditd_lora_free(l);
    }
    return 0;
}

/* The leader, once after start-up: what it loaded, for GET /v1/loras;
 * then the host copies go. */
static void send_adapters(worker *w)
{
    const ditd_denoiser *den = w->pipe->den;
    Ditd__Envelope env = DITD__ENVELOPE__INIT;
    Ditd__Adapters am = DITD__ADAPTERS__INIT;
    Ditd__LoraInfo *li = calloc((size_t)w->n_lora + 1, sizeof *li);
    Ditd__LoraInfo **lip = calloc((size_t)w->n_lora + 1, sizeof *lip);
    char ***mods = calloc((size_t)w->n_lora + 1, sizeof *mods);
    uint32_t **ranks = calloc((size_t)w->n_lora + 1, sizeof *ranks);
    int ok = li && lip && mods && ranks;
    for (int i = 0; ok && i < w->n_lora; i++) {
        const ditd_lora *l = w->lora_host[i];
        ditd__lora_info__init(&li[i]);
        li[i].name = w->lora_dev[i]->name;
        li[i].bytes = w->lora_dev[i]->bytes;
        lip[i] = &li[i];
        if (!l)
            continue;
        li[i].format = (uint32_t)l->format;
        li[i].max_rank = (uint32_t)l->max_rank;
        mods[i] = calloc((size_t)l->n_mod + 1, sizeof *mods[i]);
        ranks[i] = calloc((size_t)l->n_mod + 1, sizeof *ranks[i]);
        if (!mods[i] || !ranks[i]) {
            ok = 0;
            break;
        }
        for (int k = 0; k < l->n_mod; k++) {
            mods[i][k] = (char *)den->lora_targets[l->mod[k].target].name;
            ranks[i][k] = (uint32_t)l->mod[k].rank;
        }
        li[i].n_modules = li[i].n_ranks = (size_t)l->n_mod;
        li[i].modules = mods[i];
        li[i].ranks = ranks[i];
    }
    if (ok) {
        am.n_loras = (size_t)w->n_lora;
        am.loras = lip;
        env.msg_case = DITD__ENVELOPE__MSG_ADAPTERS;
        env.adapters = &am;
        send_env(w, &env);
    }
    for (int i = 0; i < w->n_lora; i++) {
        if (mods)
            free(mods[i]);
        if (ranks)
            free(ranks[i]);
        ditd_lora_free(w->lora_host[i]);
        w->lora_host[i] = NULL;
    }
    free(mods);
    free(ranks);
    free(lip);
    free(li);
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
    /* the denoiser's table by its weights' dtype (--dtype, or auto by the
     * checkpoint's); the VAE keeps the f32 table it is written for */
    const ditd_backend_ops *wops = ops;
    if (!err) {
        ditd_dtype ckpt;
        if (!(err = ditd_model_checkpoint_dtype(w->info.transformer_dir, &ckpt)) &&
            !(wops = ditd_backend_for_weights(
                  ops, cfg->weight_dtype < 0 ? "auto" : ditd_dtype_name((ditd_dtype)cfg->weight_dtype),
                  ckpt)))
            err = DITD_EINVAL;
    }
    if (!err)
        err = ditd_pipeline_new_group(&w->info, wops, cfg->max_batch, w->mesh, &w->pipe);
    if (!err && w->info.frames > 0) {
        /* a video model: its clips decode on the whole group, each rank a
         * band of rows (latent_video.h), planned for the largest size a
         * request may ask for */
        const ditd_model_info *m = &w->info;
        w->frames = m->frames;
        if (!m->vae_dir[0] || m->vae_scale <= 0)
            err = ditd_err_set(DITD_EUNSUPPORTED, "%s: a video model without vae/: its clips "
                               "cannot be decoded", m->name);
        else if (cfg->vae_tiling)
            err = ditd_err_set(DITD_EUNSUPPORTED, "--vae-tiling: not for video models yet");
        else
            err = ditd_latent_video_new_group(m, &ditd_backend_cpu, m->max_size / m->vae_scale,
                                              m->max_size / m->vae_scale,
                                              in_group(w) ? w->mesh->group : NULL, &w->lv);
    } else if (!err && w->info.needs_vae) {
        /* the decode runs on each rank's CPU backend (also on a GPU replica:
         * the VAE has no device decode yet, docs/vae.md); the group's comm
         * is host MPI */
        err = ditd_latent_image_new(&w->info, &ditd_backend_cpu, in_group(w) ? w->mesh->group : NULL,
                                    cfg->vae_tiling, &w->li);
    }
    if (!err) {
        ops->set_threads(cfg->threads);
        err = plan_batch_buffers(w);
    }
    if (!err && w->info.shapes.cond.kind == DITD_COND_TEXT)
        err = text_init(w);
    if (!err)
        err = lora_init(w);
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

    if (w->leader && cfg->n_loras > 0)
        send_adapters(w); /* before the first ready heartbeat */
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
    for (int i = 0; i < w->n_lora; i++)
        ditd_lora_dev_free(w->lora_dev[i]);
    for (int i = 0; w->lora_host && i < cfg->n_loras; i++)
        ditd_lora_free(w->lora_host[i]);
    free(w->lora_dev);
    free(w->lora_host);
    ditd_prompt_encoder_free(w->penc);
    free(w->emb);
    free(w->te);
    free(w->pix);
    free(w->out);
    ditd_latent_image_free(w->li);
    ditd_latent_video_free(w->lv);
    ditd_pipeline_free(w->pipe);
    if (have_info)
        ditd_model_info_free(&w->info);
    free(w);
    return err;
}
