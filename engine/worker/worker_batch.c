/* A batch on every rank of the replica: the leader's check, the sizes and
 * buffers, the step callback (progress, previews, cancels), the run and
 * its Result (worker_state.h). */
#include "engine/worker/worker_state.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/error.h"
#include "engine/pipeline/edit_images.h"
#include "engine/worker/cache_msg.h"

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
static void latents_to_image(const ditd__worker *w, const float *lat, uint8_t *px)
{
    const ditd_denoiser_shapes *sh = &w->rep.pipe->shapes;
    ditd_pipeline_to_pixels(lat, sh->in_channels, sh->height, sh->width, px);
}

/* The leader's Progress of a step, with n previews (pv) */
static void send_progress(ditd__worker *w, int step, int total, double step_ms, size_t n,
                          Ditd__Preview **pv)
{
    Ditd__Envelope env = DITD__ENVELOPE__INIT;
    Ditd__Progress pg = DITD__PROGRESS__INIT;
    pg.batch_id = w->batch->batch_id;
    pg.step = (uint32_t)step;
    pg.total = (uint32_t)total;
    pg.elapsed_ms = ditd_now_ms() - w->t_start;
    pg.step_ms = step_ms;
    pg.n_previews = n;
    pg.previews = pv;
    env.msg_case = DITD__ENVELOPE__MSG_PROGRESS;
    env.progress = &pg;
    ditd__worker_send_env(w, &env);
}

/* The step callback: on the leader only. What it decides (active flags,
 * stop) the pipeline broadcasts to the group after it returns. A pixel-space
 * model's previews are its x0 mapped here; a latent model's need the
 * group's decode, so with previews wanted its progress waits for
 * on_preview, which every rank runs after the broadcast. */
static int on_step(void *ud, int step, int total, const float *x0, uint8_t *active)
{
    ditd__worker *w = ud;
    const Ditd__Batch *b = w->batch;
    Ditd__Preview pv[DITD_WORKER_MAX_BATCH], *pvp[DITD_WORKER_MAX_BATCH];
    size_t npv = 0;
    double t = ditd_now_ms();
    uint8_t *buf = NULL;
    size_t len = 0;
    (void)active; /* == w->active */

    const double step_ms = t - w->t_step;
    w->t_step = t;
    for (size_t i = 0; i < b->n_samples; i++) {
        int k = (int)b->samples[i]->partial_images;
        /* a latent model's previews: on_preview; a video model's: none */
        if (w->rep.li || w->rep.info.frames > 0 || !w->active[i] ||
            !preview_due(k, w->partial_sent[i], step, total))
            continue;
        uint8_t *px = w->pix + npv * w->numel_img;
        latents_to_image(w, x0 + i * w->numel_lat, px);
        ditd__preview__init(&pv[npv]);
        pv[npv].slot = (uint32_t)i;
        pv[npv].partial_index = (uint32_t)w->partial_sent[i]++;
        pv[npv].pixels.data = px;
        pv[npv].pixels.len = w->numel_img;
        pvp[npv] = &pv[npv];
        npv++;
    }
    if (w->latent_previews)
        w->pend_step_ms = step_ms;
    else
        send_progress(w, step, total, step_ms, npv, pvp);
    if (t >= w->next_hb)
        ditd__worker_heartbeat(w, true);
    /* cancel / shutdown that came meanwhile act at this step boundary */
    while (!w->comm_err && w->t->recv(w->t, &buf, &len, 0) == 0)
        ditd__worker_handle_async(w, buf, len);
    return w->stop_now || w->comm_err;
}

/* Every rank: latents src (n samples, a batch's) to the leader's pixels, the
 * samples whose flag is set, each by the unscale of the row it followed
 * (ditd_pipeline_class_edit_row: an edit row may decode by another rule than
 * its folder's row), one collective decode per rule that some flagged sample
 * needs. The final images and the previews both. */
static int decode_by_rows(ditd__worker *w, const Ditd__Batch *b, int n, const float *src,
                          const uint8_t *flags)
{
    const ditd_pipeline_class *pc = w->rep.info.pipeline;
    uint8_t act[DITD_WORKER_MAX_BATCH];
    ditd_latent_rule rule[DITD_WORKER_MAX_BATCH];
    int mixed = 0;
    for (int i = 0; i < n; i++) {
        const ditd_pipeline_class *er =
            ditd_pipeline_class_edit_row(pc, b->strength != 0.0, b->samples[i]->mask.len > 0);
        rule[i] = er ? er->unscale : pc->unscale;
        mixed |= rule[i] != w->rep.li->rule;
    }
    if (!mixed)
        return ditd_latent_image_run(w->rep.li, src, n, flags, w->leader ? w->pix : NULL);
    for (int r = 0; r < DITD_LATENT_RULE_COUNT; r++) {
        int any = 0;
        for (int i = 0; i < n; i++)
            any |= (act[i] = (!flags || flags[i]) && rule[i] == (ditd_latent_rule)r);
        int err = any ? ditd_latent_image_run_as(w->rep.li, (ditd_latent_rule)r, src, n, act,
                                                 w->leader ? w->pix : NULL)
                      : 0;
        if (err)
            return err;
    }
    return 0;
}

/* The preview hook of a latent model's batch that wants previews: every
 * rank, after the leader's decision went to the group (so a stopped batch
 * or a dropped sample is never decoded, and a stop never waits for a
 * decode). The samples still active whose preview is due at this step
 * (the batch, partial_images and the steps are the same on every rank, so
 * the same samples everywhere) have their x0 decoded by the group's VAE,
 * unscaled exactly as the final latents are (decode_by_rows); the
 * leader's pixels land in pix (free until the final decode) and go out with
 * the step's progress. An inpainting sample's preview is x0 with its kept
 * region the image's latents (what the final latents hold there). */
static int on_preview(void *ud, int step, int total, const float *x0, const uint8_t *active)
{
    ditd__worker *w = ud;
    const Ditd__Batch *b = w->batch;
    const int n = (int)b->n_samples;
    uint8_t due[DITD_WORKER_MAX_BATCH];
    Ditd__Preview pv[DITD_WORKER_MAX_BATCH], *pvp[DITD_WORKER_MAX_BATCH];
    const float *src = x0;
    size_t npv = 0;
    int nd = 0, err = 0;

    for (int i = 0; i < n; i++) {
        due[i] = (!active || active[i]) &&
                 preview_due((int)b->samples[i]->partial_images, w->partial_sent[i], step, total);
        nd += due[i];
    }
    for (int i = 0; nd && i < n; i++) {
        const ditd_gen_sample *sm = &w->samples[i];
        if (!due[i] || !sm->mask_latents || !w->x0_keep)
            continue;
        /* (1 - m) image + m x0 on every channel, m on the latent grid */
        const size_t hw = (size_t)w->rep.li->h * (size_t)w->rep.li->w;
        const float *a = x0 + (size_t)i * w->numel_lat;
        float *o = w->x0_keep + (size_t)i * w->numel_lat;
        for (size_t j = 0; j < w->numel_lat; j++) {
            const float m = sm->mask_latents[j % hw];
            o[j] = m != 0.0f ? a[j] : sm->image_latents[j];
        }
        src = w->x0_keep;
    }
    if (src != x0) /* the samples without a mask go through as they are */
        for (int i = 0; i < n; i++)
            if (due[i] && !w->samples[i].mask_latents)
                memcpy(w->x0_keep + (size_t)i * w->numel_lat, x0 + (size_t)i * w->numel_lat,
                       w->numel_lat * sizeof *x0);
    if (nd)
        err = decode_by_rows(w, b, n, src, due);
    for (int i = 0; i < n; i++) {
        if (!due[i])
            continue;
        if (w->leader && !err) {
            ditd__preview__init(&pv[npv]);
            pv[npv].slot = (uint32_t)i;
            pv[npv].partial_index = (uint32_t)w->partial_sent[i];
            pv[npv].pixels.data = w->pix + (size_t)i * w->numel_img;
            pv[npv].pixels.len = w->numel_img;
            pvp[npv] = &pv[npv];
            npv++;
        }
        w->partial_sent[i]++;
    }
    if (w->leader && !err)
        send_progress(w, step, total, w->pend_step_ms, npv, pvp);
    return err;
}

/* The leader's check of a batch before the group sees it: 0, or an Error
 * went to the front-end. */
int ditd__worker_batch_ok(ditd__worker *w, const Ditd__Batch *b)
{
    const ditd_model_info *m = &w->rep.info;
    int n = (int)b->n_samples;
    char msg[512];

    if (n < 1 || n > w->cfg->max_batch) {
        snprintf(msg, sizeof msg, "batch of %d samples (1..%d)", n, w->cfg->max_batch);
        ditd__worker_error(w, b->batch_id, DITD_EINVAL, msg);
        return 0;
    }
    if (b->width > 16384 || b->height > 16384 ||
        ditd_model_check_size(m, (int)b->width, (int)b->height)) {
        if (b->width > 16384 || b->height > 16384)
            snprintf(msg, sizeof msg, "size %ux%u pixels", b->width, b->height);
        else
            snprintf(msg, sizeof msg, "%s", ditd_err_detail());
        ditd__worker_error(w, b->batch_id, DITD_EINVAL, msg);
        return 0;
    }
    if (m->shapes.cond.kind == DITD_COND_TEXT &&
        (b->max_sequence_length < 1 || b->max_sequence_length > (uint32_t)m->max_sequence_length)) {
        snprintf(msg, sizeof msg, "max_sequence_length %u (1..%d)", b->max_sequence_length,
                 m->max_sequence_length);
        ditd__worker_error(w, b->batch_id, DITD_EINVAL, msg);
        return 0;
    }
    if (b->sampler >= DITD_SAMPLER_KIND_COUNT) {
        ditd__worker_error(w, b->batch_id, DITD_EINVAL, "unknown sampler");
        return 0;
    }
    if (b->n_skip_layers > DITD_MAX_SKIP_LAYERS ||
        (b->n_skip_layers > 0 && !(m->pipeline->request & DITD_REQ_SKIP_LAYERS))) {
        snprintf(msg, sizeof msg, "%zu skip_guidance_layers (%s takes %d)", b->n_skip_layers,
                 m->pipeline->name,
                 m->pipeline->request & DITD_REQ_SKIP_LAYERS ? DITD_MAX_SKIP_LAYERS : 0);
        ditd__worker_error(w, b->batch_id, DITD_EINVAL, msg);
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
        ditd__worker_error(w, b->batch_id, DITD_EINVAL, msg);
        return 0;
    }
    if (ditd_cache_msg_to_config(b->cache, &w->cache_cfg)) {
        snprintf(msg, sizeof msg, "%s", ditd_err_detail());
        ditd__worker_error(w, b->batch_id, DITD_EINVAL, msg);
        return 0;
    }
    /* an edit: the row takes it, every sample carries an image at the
     * batch's size (and at most a mask of it); else none does */
    const size_t np = (size_t)b->width * (size_t)b->height;
    if (b->strength != 0.0 && (!(b->strength > 0.0 && b->strength <= 1.0) ||
                               !m->pipeline->img2img || !w->rep.li)) {
        snprintf(msg, sizeof msg, "strength %g: %s (%s) takes no input image", b->strength,
                 m->name, m->pipeline->name);
        ditd__worker_error(w, b->batch_id, DITD_EINVAL, msg);
        return 0;
    }
    const int i2v = w->rep.ic != NULL; /* image-to-video: every sample's first frame */
    const int kontext = m->pipeline->reference; /* FluxKontextPipeline: a reference per sample */
    for (int i = 0; i < n; i++) {
        const Ditd__Sample *sm = b->samples[i];
        const char *why = NULL;
        if (kontext) {
            /* every sample a reference of the batch's one size (sample 0's,
             * rounded for the VAE), or none does (text-to-image) */
            const Ditd__Sample *s0 = b->samples[0];
            const int f = 2 * (m->vae_scale > 0 ? m->vae_scale : 1);
            if (b->strength != 0.0 || sm->mask.len || sm->last_image.len)
                why = "a strength, mask or last image: FluxKontextPipeline takes a reference only";
            else if (sm->image_width != s0->image_width || sm->image_height != s0->image_height)
                why = "a reference of another size than the batch's";
            else if (sm->image_width &&
                     (sm->image_width > 16384 || sm->image_height > 16384 ||
                      sm->image_width % (unsigned)f || sm->image_height % (unsigned)f ||
                      sm->image.len != (size_t)sm->image_width * sm->image_height * 3 || !w->rep.li))
                why = "a reference that is not (image_height, image_width, 3) bytes in multiples "
                      "of vae_scale_factor x 2";
            else if (!sm->image_width && (sm->image.len || sm->image_height))
                why = "an input image without its size";
        } else if (i2v) {
            if (b->strength != 0.0 || sm->mask.len)
                why = "an edit's strength or mask: image-to-video starts from noise";
            else if (sm->image_width < 1 || sm->image_height < 1 || sm->image_width > 16384 ||
                     sm->image_height > 16384 ||
                     sm->image.len != (size_t)sm->image_width * sm->image_height * 3)
                why = "no input image of (image_height, image_width, 3) bytes (image-to-video)";
            else if (m->last_image &&
                     (sm->last_image_width < 1 || sm->last_image_height < 1 ||
                      sm->last_image_width > 16384 || sm->last_image_height > 16384 ||
                      sm->last_image.len !=
                          (size_t)sm->last_image_width * sm->last_image_height * 3))
                why = "no last image of (last_image_height, last_image_width, 3) bytes (FLF2V)";
            else if (!m->last_image && (sm->last_image.len || sm->last_image_width ||
                                        sm->last_image_height))
                why = "a last image, and the transformer takes none (FLF2V only)";
        } else if (sm->last_image.len || sm->last_image_width || sm->last_image_height)
            why = "a last image, and the pipeline takes no image (FLF2V only)";
        else if (sm->image_width || sm->image_height)
            why = "an image-to-video input image, and the pipeline takes none";
        else if (b->strength == 0.0 && (sm->image.len || sm->mask.len))
            why = "an input image without strength";
        else if (b->strength != 0.0 && sm->image.len != np * 3)
            why = "an input image that is not (height, width, 3) bytes";
        else if (sm->image_index >= DITD_EDIT_MAX_IMAGES || (sm->image_index && !sm->image.len))
            why = "an image_index past the input images of an edit";
        else if (sm->mask.len && (sm->mask.len != np || !m->pipeline->inpaint))
            why = !m->pipeline->inpaint ? "a mask, and the pipeline takes none"
                                        : "a mask that is not (height, width) bytes";
        if (why) {
            snprintf(msg, sizeof msg, "sample %d: %s", i, why);
            ditd__worker_error(w, b->batch_id, DITD_EINVAL, msg);
            return 0;
        }
    }
    for (int i = 0; i < n; i++) {
        const Ditd__Sample *sm = b->samples[i];
        if (sm->n_lora_names != sm->n_lora_scales || sm->n_lora_names > DITD_LORA_MAX_SET) {
            snprintf(msg, sizeof msg, "sample %d: %zu LoRA names, %zu scales (at most %d)", i,
                     sm->n_lora_names, sm->n_lora_scales, DITD_LORA_MAX_SET);
            ditd__worker_error(w, b->batch_id, DITD_EINVAL, msg);
            return 0;
        }
        for (size_t k = 0; k < sm->n_lora_names; k++) {
            int loaded = ditd__worker_find_lora(w, sm->lora_names[k]) >= 0;
            if (!loaded || !isfinite(sm->lora_scales[k])) {
                snprintf(msg, sizeof msg, "sample %d: LoRA adapter '%.64s' %s", i,
                         sm->lora_names[k], !loaded ? "is not known on this replica"
                                                    : "has a scale that is not finite");
                ditd__worker_error(w, b->batch_id, DITD_EINVAL, msg);
                return 0;
            }
        }
    }
    return 1;
}

/* The batch buffers for the pipeline's current size (out on every rank,
 * pix on the leader: the results, and a latent model's previews before
 * them), grown when a size needs more. */
int ditd__worker_plan_buffers(ditd__worker *w)
{
    const ditd_model_info *m = &w->rep.info;
    size_t nl = w->rep.pipe->numel, ni;
    if (w->rep.li) {
        w->img_w = w->rep.li->W;
        w->img_h = w->rep.li->H;
        ni = (size_t)w->rep.li->W * (size_t)w->rep.li->H * (size_t)w->rep.li->Co;
    } else {
        w->img_w = w->rep.pipe->shapes.width * (m->vae_scale > 0 ? m->vae_scale : 1);
        w->img_h = w->rep.pipe->shapes.height * (m->vae_scale > 0 ? m->vae_scale : 1);
        ni = (size_t)w->img_w * (size_t)w->img_h * (size_t)m->image_channels;
        if (w->frames > 0) /* a clip: (F, H, W, C) */
            ni *= (size_t)w->frames;
    }
    w->numel_lat = nl;
    w->numel_img = ni;
    if (w->rep.ic) { /* the image condition of a clip at this size */
        const int vs = m->vae_scale > 0 ? m->vae_scale : 1;
        const int W = w->rep.pipe->shapes.width * vs, H = w->rep.pipe->shapes.height * vs;
        const size_t nc = ditd_image_cond_numel(w->rep.ic, w->frames, W, H);
        w->numel_cond = nc;
        w->numel_emb = ditd_image_cond_embeds_numel(w->rep.ic);
        if (nc > w->cap_cond || (w->numel_emb && !w->i2v_emb)) {
            free(w->i2v_cond);
            w->i2v_cond = malloc((size_t)w->cfg->max_batch * nc * sizeof *w->i2v_cond);
            if (w->numel_emb && !w->i2v_emb)
                w->i2v_emb = malloc((size_t)w->cfg->max_batch * w->numel_emb * sizeof *w->i2v_emb);
            if (!w->i2v_cond || (w->numel_emb && !w->i2v_emb)) {
                w->cap_cond = 0;
                return ditd_err_set(DITD_ENOMEM, "image condition buffers");
            }
            w->cap_cond = nc;
        }
    }
    if (nl > w->cap_lat) {
        size_t bytes = (size_t)w->cfg->max_batch * nl * sizeof *w->out;
        free(w->out);
        free(w->img_lat);
        free(w->mask_lat);
        w->out = malloc(bytes);
        w->img_lat = w->rep.li && w->rep.info.pipeline->img2img ? malloc(bytes) : NULL;
        free(w->x0_keep);
        w->mask_lat = w->img_lat && w->rep.info.pipeline->inpaint ? malloc(bytes) : NULL;
        w->x0_keep = w->mask_lat ? malloc(bytes) : NULL;
        if (!w->out || (w->rep.li && w->rep.info.pipeline->img2img && !w->img_lat) ||
            (w->img_lat && w->rep.info.pipeline->inpaint && (!w->mask_lat || !w->x0_keep))) {
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
static int set_batch_size(ditd__worker *w, const Ditd__Batch *b)
{
    const ditd_model_info *m = &w->rep.info;
    int err;
    if (m->resizable) {
        int h = (int)b->height / m->vae_scale, wd = (int)b->width / m->vae_scale;
        int L = m->shapes.cond.kind == DITD_COND_TEXT
                    ? ditd_pipeline_class_text_len(m->pipeline, (int)b->max_sequence_length)
                    : 0;
        if (m->frames > 0) { /* batch_ok checked the count */
            w->frames = (int)b->num_frames;
            err = ditd_pipeline_set_video_size(w->rep.pipe,
                                               ditd_model_latent_frames(m, w->frames), h,
                                               wd, L);
        } else {
            err = ditd_pipeline_set_size(w->rep.pipe, h, wd, L);
        }
        if (err || (w->rep.li && (err = ditd_latent_image_set_size(w->rep.li, h, wd))))
            return err;
    }
    if (m->pipeline->reference) { /* Kontext: the batch's reference size (batch_ok: all alike) */
        const int vs = m->vae_scale > 0 ? m->vae_scale : 1;
        const Ditd__Sample *s0 = b->samples[0];
        if ((err = ditd_pipeline_set_reference(w->rep.pipe, (int)s0->image_height / vs,
                                               (int)s0->image_width / vs)))
            return err;
        size_t nr = w->rep.pipe->numel_ref;
        if (nr > w->cap_ref) {
            free(w->ref_lat);
            if (!(w->ref_lat = malloc((size_t)w->cfg->max_batch * nr * sizeof *w->ref_lat))) {
                w->cap_ref = 0;
                return ditd_err_set(DITD_ENOMEM, "reference latents");
            }
            w->cap_ref = nr;
        }
    }
    return ditd__worker_plan_buffers(w);
}

/* FluxKontextPipeline's references, on every rank (the group encodes each
 * together, ditd_latent_image_encode_mode being collective; the same bytes
 * everywhere, so the same decisions): sample i's reference through the VAE
 * encoder's mode (no draw), shifted and scaled; a sample with the same
 * reference as an earlier one copies its latents. */
static int reference_inputs(ditd__worker *w, const Ditd__Batch *b, int n)
{
    const size_t nr = w->rep.pipe->numel_ref;
    int err;
    for (int i = 0; nr && i < n; i++) {
        const Ditd__Sample *sm = b->samples[i];
        float *lat = w->ref_lat + (size_t)i * nr;
        int k = 0;
        while (k < i && !(b->samples[k]->image.len == sm->image.len &&
                          !memcmp(b->samples[k]->image.data, sm->image.data, sm->image.len)))
            k++;
        if (k < i)
            memcpy(lat, w->ref_lat + (size_t)k * nr, nr * sizeof *lat);
        else if ((err = ditd_latent_image_encode_mode(w->rep.li, sm->image.data,
                                                      (int)sm->image_height, (int)sm->image_width,
                                                      lat)))
            return err;
        w->samples[i].ref_latents = lat;
    }
    return 0;
}

/* An edit's inputs, on every rank (the group encodes each image together,
 * ditd_latent_image_encode being collective: the same latents everywhere,
 * bit-identical to one rank's): sample i's image through the VAE encoder
 * (posterior stream under its seed at its image_index's offset, so the
 * outputs of one request that edit the same input image share its
 * latents: encoded once), its mask on the latent grid. */
static int edit_inputs(ditd__worker *w, const Ditd__Batch *b, int n)
{
    const ditd_latent_image *li = w->rep.li;
    const size_t hw = (size_t)li->h * (size_t)li->w;
    int err;
    for (int i = 0; i < n; i++) {
        const Ditd__Sample *sm = b->samples[i];
        float *lat = w->img_lat + (size_t)i * w->numel_lat;
        int k = 0;
        while (k < i && !(b->samples[k]->seed == sm->seed &&
                          b->samples[k]->image_index == sm->image_index &&
                          b->samples[k]->image.len == sm->image.len &&
                          !memcmp(b->samples[k]->image.data, sm->image.data, sm->image.len)))
            k++;
        if (k < i)
            memcpy(lat, w->img_lat + (size_t)k * w->numel_lat, w->numel_lat * sizeof *lat);
        else if ((err = ditd_latent_image_encode_nth(w->rep.li, sm->image.data, (int)b->height,
                                                     (int)b->width, sm->seed,
                                                     (int)sm->image_index, lat)))
            return err;
        w->samples[i].image_latents = lat;
        if (sm->mask.len) {
            float *mk = w->mask_lat + (size_t)i * hw;
            if ((err = ditd_latent_mask_from_gray(sm->mask.data, (int)b->height, (int)b->width,
                                                  li->h, li->w, mk)))
                return err;
            w->samples[i].mask_latents = mk;
        }
    }
    return 0;
}

/* Image-to-video's inputs, on every rank (the same bytes everywhere, so the
 * same condition): sample i's first frame (and FLF2V's last) through the
 * image condition (resized to the clip, VAE-encoded, CLIP-embedded), into
 * the planned buffers; a sample with the same images as an earlier one
 * copies it. */
static int i2v_inputs(ditd__worker *w, const Ditd__Batch *b, int n)
{
    const int vs = w->rep.info.vae_scale > 0 ? w->rep.info.vae_scale : 1;
    const int W = w->rep.pipe->shapes.width * vs, H = w->rep.pipe->shapes.height * vs;
    int err;
    for (int i = 0; i < n; i++) {
        const Ditd__Sample *sm = b->samples[i];
        float *cond = w->i2v_cond + (size_t)i * w->numel_cond;
        float *emb = w->numel_emb ? w->i2v_emb + (size_t)i * w->numel_emb : NULL;
        int k = 0;
        while (k < i && !(b->samples[k]->image_width == sm->image_width &&
                          b->samples[k]->image.len == sm->image.len &&
                          !memcmp(b->samples[k]->image.data, sm->image.data, sm->image.len) &&
                          b->samples[k]->last_image_width == sm->last_image_width &&
                          b->samples[k]->last_image.len == sm->last_image.len &&
                          (!sm->last_image.len ||
                           !memcmp(b->samples[k]->last_image.data, sm->last_image.data,
                                   sm->last_image.len))))
            k++;
        if (k < i) {
            memcpy(cond, w->i2v_cond + (size_t)k * w->numel_cond, w->numel_cond * sizeof *cond);
            if (emb)
                memcpy(emb, w->i2v_emb + (size_t)k * w->numel_emb, w->numel_emb * sizeof *emb);
        } else if ((err = ditd_image_cond_run(w->rep.ic, sm->image.data, (int)sm->image_width,
                                              (int)sm->image_height,
                                              sm->last_image.len ? sm->last_image.data : NULL,
                                              (int)sm->last_image_width,
                                              (int)sm->last_image_height, w->frames, W, H, cond,
                                              emb))) {
            return err;
        }
        w->samples[i].video_cond = cond;
        w->samples[i].image_embeds = emb;
    }
    return 0;
}

/* Every rank of the group, with the same batch (checked by batch_ok on the
 * leader). The leader sends the outcome. */
void ditd__worker_run_batch(ditd__worker *w, const Ditd__Batch *b)
{
    const ditd_model_info *m = &w->rep.info;
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
    gp.strength = b->strength;
    /* its adapters on the device (under --lora-cache-mb a miss reloads one;
     * a collective when some rank had to) */
    err = ditd__worker_lora_prepare(w, b);
    for (int i = 0; i < n; i++) {
        w->samples[i].image_latents = w->samples[i].mask_latents = NULL;
        w->samples[i].video_cond = w->samples[i].image_embeds = NULL;
        w->samples[i].ref_latents = NULL;
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
            err = ditd__worker_set_loras(w, i, b->samples[i]);
    }
    w->batch = b;
    w->t_start = w->t_step = ditd_now_ms();
    /* a latent model's previews: the group decodes them (on_preview, every rank) */
    w->latent_previews = 0;
    for (int i = 0; w->rep.li && i < n; i++)
        w->latent_previews |= b->samples[i]->partial_images > 0;
    ditd_pipeline_set_preview(w->rep.pipe, w->latent_previews ? on_preview : NULL, w);
    /* step caching: every rank sets the batch's (the leader's batch_ok
     * checked it; the same bytes give the same config on every rank) */
    if (!err)
        err = ditd_cache_msg_to_config(b->cache, &w->cache_cfg);
    if (!err)
        err = ditd_pipeline_set_cache(w->rep.pipe, &w->cache_cfg);
    if (!err)
        err = set_batch_size(w, b);
    if (!err && w->te)
        err = ditd__worker_encode_prompts(w, b);
    if (!err && b->strength != 0.0)
        err = edit_inputs(w, b, n);
    if (!err && w->rep.ic)
        err = i2v_inputs(w, b, n);
    if (!err && m->pipeline->reference)
        err = reference_inputs(w, b, n);
    if (!err && !w->group_err)
        err = ditd_pipeline_generate(w->rep.pipe, &gp, n, w->samples, NULL, w->out, w->active,
                                     w->leader ? on_step : NULL, w);
    w->batch = NULL;
    ditd_pipeline_set_preview(w->rep.pipe, NULL, NULL);
    /* a latent model: the group decodes the latents together */
    if (!err && w->rep.li)
        err = decode_by_rows(w, b, n, w->out, w->active);
    /* a video model: the group decodes each clip still wanted (the same
     * active flags on every rank), the leader gets the frames */
    for (int i = 0; !err && w->rep.lv && i < n; i++) {
        const ditd_denoiser_shapes *sh = &w->rep.pipe->shapes;
        if (w->active[i])
            err = ditd_latent_video_run(w->rep.lv, w->out + (size_t)i * w->numel_lat, 1, sh->frames,
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
    ditd__worker_lora_flush(w); /* what the cache did for this batch, before its outcome */
    if (err) {
        snprintf(msg, sizeof msg, "%s%s%s", ditd_strerror(err), *ditd_err_detail() ? ": " : "",
                 ditd_err_detail());
        if (w->stop_now)
            snprintf(msg, sizeof msg, "the replica is shutting down");
        ditd__worker_error(w, b->batch_id, w->stop_now ? DITD_EUNAVAIL : err, msg);
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
    r.compute_ms = ditd_now_ms() - w->t_start;
    for (int i = 0; i < n; i++) {
        ditd__image__init(&im[i]);
        im[i].slot = (uint32_t)i;
        im[i].canceled = !w->active[i];
        if (w->active[i]) {
            uint8_t *px = w->pix + (size_t)i * w->numel_img;
            if (!w->rep.li && !w->rep.lv) /* a latent model's pixels came from its VAE */
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
            ditd_pipeline_cache_stats(w->rep.pipe, i, &st);
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
    ditd__worker_send_env(w, &env);
    if (w->te) /* the text cache's counters moved: /metrics hears it now */
        ditd__worker_heartbeat(w, true);
}
