/* The denoising loop: noise, forward, guidance, sampler step; any family. */
#include "engine/pipeline/pipeline.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/error.h"
#include "engine/core/philox.h"

static int plan_buffers(ditd_pipeline *p);

/* numel (the latents: the sampler's), numel_cond (an image-to-video row's
 * condition after them: in_channels - out_channels) and numel_in. */
static void set_numels(ditd_pipeline *p)
{
    p->numel_in = ditd_denoiser_numel_in(&p->shapes);
    p->numel_out = ditd_denoiser_numel_out(&p->shapes);
    p->numel_cond = 0;
    p->first_frame = p->pc->image_to_video && p->info.expand_timesteps;
    if (p->pc->image_to_video && p->shapes.out_channels < p->shapes.in_channels)
        p->numel_cond = p->numel_in / (size_t)p->shapes.in_channels *
                        (size_t)(p->shapes.in_channels - p->shapes.out_channels);
    p->numel = p->numel_in - p->numel_cond;
    /* a reference's latents follow (FluxKontextPipeline) */
    p->numel_ref = (size_t)p->shapes.in_channels * (size_t)p->shapes.ref_height *
                   (size_t)p->shapes.ref_width;
    p->numel_in += p->numel_ref;
}

/* Whether two experts list the same LoRA targets (names, shapes, tp
 * slices), so an adapter opened and cut against one runs on the other. */
static int same_lora_targets(const ditd_denoiser *a, const ditd_denoiser *b)
{
    if (a->n_lora_targets != b->n_lora_targets)
        return 0;
    for (int i = 0; i < a->n_lora_targets; i++) {
        const ditd_lora_target *x = &a->lora_targets[i], *y = &b->lora_targets[i];
        if (strcmp(x->name, y->name) || x->n_out != y->n_out || x->k_in != y->k_in ||
            x->shard != y->shard || x->n_rng != y->n_rng ||
            memcmp(x->off, y->off, sizeof x->off) || memcmp(x->len, y->len, sizeof x->len))
            return 0;
    }
    return 1;
}

/* The adapters of a forward row of sample smp on the step's expert (low:
 * transformer_2); NULL when none. */
static const ditd_lora_set *row_set(int low, const ditd_gen_sample *smp)
{
    const ditd_lora_set *s = low && smp->loras_2 ? smp->loras_2 : smp->loras;
    return s && s->n > 0 ? s : NULL;
}

int ditd_pipeline_new(const ditd_model_info *info, const ditd_backend_ops *ops, int max_samples,
                      ditd_pipeline **out)
{
    return ditd_pipeline_new_group(info, ops, max_samples, NULL, out);
}

int ditd_pipeline_new_group(const ditd_model_info *info, const ditd_backend_ops *ops,
                            int max_samples, const ditd_mesh *mesh, ditd_pipeline **out)
{
    ditd_pipeline *p;
    size_t n2;
    int err;

    if (max_samples <= 0 || max_samples > 1024)
        return ditd_err_set(DITD_EINVAL, "max samples %d (1..1024)", max_samples);
    p = calloc(1, sizeof *p);
    if (!p)
        return ditd_err_set(DITD_ENOMEM, "pipeline");
    p->ops = ops;
    p->info = *info;
    p->mesh = mesh && mesh->size > 1 ? mesh : NULL;
    p->max_samples = max_samples;
    p->pc = info->pipeline;
    if (!p->pc) {
        err = ditd_err_set(DITD_EINVAL, "%s: no pipeline class", info->dir);
        goto fail;
    }
    /* conditional + unconditional rows, and a third set for skip-layer guidance */
    n2 = (p->pc->request & DITD_REQ_SKIP_LAYERS ? 3 : 2) * (size_t)max_samples;
    p->max_rows = (int)n2;
    if ((err = ditd_sched_config_load(info->scheduler_config, &p->sched_base)))
        goto fail;
    if (!info->denoiser) {
        err = ditd_err_set(DITD_EINVAL, "%s: no denoiser family", info->dir);
        goto fail;
    }
    /* what the backend supports, before a weight is read (on every rank alike) */
    if (info->shapes.head_dim > 0) {
        char what[DITD_MODEL_PATH_MAX + 64];
        snprintf(what, sizeof what, "%s/config.json: attention_head_dim", info->transformer_dir);
        if ((err = ditd_backend_check_head_dim(ops, info->shapes.head_dim, what)))
            goto fail;
    }
    /* one forward runs at most 2n rows (n under cfg parallel, where each
     * half and the skip-layer rows are forwards of their own) */
    if ((err = ditd_denoiser_load_file(info->denoiser, info->transformer_dir,
                                       info->transformer_file, ops,
                                       p->mesh && p->mesh->layout.cfg == 2 ? max_samples
                                                                           : 2 * max_samples,
                                       p->mesh, &p->den)))
        goto fail;
    p->cur = p->den;
    p->boundary_t = -1.0f;
    if (info->transformer_2_dir[0]) {
        char what[DITD_MODEL_PATH_MAX + 16];
        snprintf(what, sizeof what, "%s/config.json", info->transformer_2_dir);
        if ((err = ditd_denoiser_load(info->denoiser, info->transformer_2_dir, ops,
                                      p->mesh && p->mesh->layout.cfg == 2 ? max_samples
                                                                          : 2 * max_samples,
                                      p->mesh, &p->den2)) ||
            (err = ditd_denoiser_shapes_same(&p->den->shapes, &p->den2->shapes, what)))
            goto fail;
        /* WanPipeline: boundary_ratio * scheduler.config.num_train_timesteps, a
         * Python float that `t >= boundary` promotes to float32 */
        p->boundary_t = (float)(info->boundary_ratio * (double)p->sched_base.num_train_timesteps);
        /* an adapter is uploaded against den's targets and may run on either
         * expert: den2's must be the same list */
        p->lora_experts_differ = !same_lora_targets(p->den, p->den2);
    }
    p->shapes = p->den->shapes;
    set_numels(p);
    if (p->pc->image_to_video && p->shapes.cond.image_dim > 0) {
        p->img_emb = malloc(n2 * (size_t)p->shapes.cond.image_len *
                            (size_t)p->shapes.cond.image_dim * sizeof(float));
        if (!p->img_emb) {
            err = ditd_err_set(DITD_ENOMEM, "image embeddings");
            goto fail;
        }
    }
    if ((err = ditd_cond_init(&p->cond, &p->shapes.cond, (int)n2)) || (err = plan_buffers(p)))
        goto fail;
    p->h_t = malloc(n2 * sizeof(float));
    p->cond_row = malloc((size_t)max_samples * sizeof(int));
    p->uncond_row = malloc((size_t)max_samples * sizeof(int));
    p->skip_row = malloc((size_t)max_samples * sizeof(int));
    p->ctl = malloc(1 + (size_t)max_samples);
    /* step caching: its states; buffers are planned per batch (step_cache.h) */
    p->row_sample = malloc(n2 * sizeof(int));
    p->row_branch = malloc(n2);
    p->row_lora = calloc(n2, sizeof *p->row_lora);
    if ((err = ditd_step_cache_new(ops, p->mesh, max_samples, &p->scache)) ||
        (p->den2 && (err = ditd_step_cache_new(ops, p->mesh, max_samples, &p->scache2))))
        goto fail;
    p->sc = p->scache;
    if (!p->ctl || !p->cond_row || !p->uncond_row || !p->skip_row || !p->h_t || !p->row_sample ||
        !p->row_branch || !p->row_lora) {
        err = ditd_err_set(DITD_ENOMEM, "pipeline buffers");
        goto fail;
    }
    *out = p;
    return 0;
fail:
    ditd_pipeline_free(p);
    return err;
}

static void free_buffers(ditd_pipeline *p)
{
    free(p->lat);
    free(p->x0);
    free(p->noise);
    if (p->ops->mem_free) {
        if (p->model_in)
            p->ops->mem_free(p->model_in, 0);
        if (p->model_out)
            p->ops->mem_free(p->model_out, 0);
    } else {
        free(p->model_in);
        free(p->model_out);
    }
    free(p->h_out);
    p->lat = p->x0 = p->noise = p->h_out = NULL;
    p->model_in = p->model_out = NULL;
    p->cap_numel = p->cap_numel_out = 0;
}

/* The per-sample buffers for p->numel / p->numel_out, kept when they are
 * large enough already. Backend buffers for the model's input and output
 * live in host memory on the CPU, in device memory on CUDA (mem_alloc). */
static int plan_buffers(ditd_pipeline *p)
{
    const ditd_backend_ops *ops = p->ops;
    size_t n1 = (size_t)p->max_samples, n2 = (size_t)p->max_rows, es = ditd_dtype_size(ops->act_dtype);
    size_t ni = p->numel_in, no = p->numel_out;
    int err;
    if (ni <= p->cap_numel && no <= p->cap_numel_out)
        return 0;
    free_buffers(p);
    p->lat = malloc(n1 * ni * sizeof(float)); /* numel <= numel_in */
    p->x0 = malloc(n1 * ni * sizeof(float));
    p->noise = malloc(n1 * ni * sizeof(float));
    p->h_out = malloc(n2 * no * sizeof(float));
    if (ops->mem_alloc) {
        if ((err = ops->mem_alloc(&p->model_in, n2 * ni * es)) ||
            (err = ops->mem_alloc(&p->model_out, n2 * no * es))) {
            free_buffers(p);
            return err;
        }
    } else {
        p->model_in = malloc(n2 * ni * es);
        p->model_out = malloc(n2 * no * es);
    }
    if (!p->lat || !p->x0 || !p->noise || !p->h_out || !p->model_in || !p->model_out) {
        free_buffers(p);
        return ditd_err_set(DITD_ENOMEM, "pipeline buffers for %zu latent values a sample", ni);
    }
    p->cap_numel = ni;
    p->cap_numel_out = no;
    return 0;
}

int ditd_pipeline_set_size(ditd_pipeline *p, int height, int width, int text_len)
{
    return ditd_pipeline_set_video_size(p, p->shapes.frames, height, width, text_len);
}

int ditd_pipeline_set_video_size(ditd_pipeline *p, int frames, int height, int width,
                                 int text_len)
{
    const ditd_denoiser_shapes *s = &p->shapes;
    int err;
    if (frames == s->frames && height == s->height && width == s->width &&
        (s->cond.kind != DITD_COND_TEXT || text_len == s->cond.text_len))
        return 0;
    if ((err = ditd_denoiser_set_video_size(p->den, frames, height, width, text_len)))
        return err;
    if (p->den2 && (err = ditd_denoiser_set_video_size(p->den2, frames, height, width, text_len)))
        return err;
    p->shapes = p->den->shapes;
    set_numels(p);
    /* the sampler's state is per sample's numel and its mu per image tokens */
    ditd_sampler_free(p->sampler);
    p->sampler = NULL;
    if (p->cond.shape.text_len != p->shapes.cond.text_len) {
        ditd_cond_free(&p->cond);
        if ((err = ditd_cond_init(&p->cond, &p->shapes.cond, p->max_rows)))
            return err;
    }
    return plan_buffers(p);
}

int ditd_pipeline_set_reference(ditd_pipeline *p, int rh, int rw)
{
    int err;
    if (rh == p->shapes.ref_height && rw == p->shapes.ref_width)
        return 0;
    if ((rh || rw) && !p->pc->reference)
        return ditd_err_set(DITD_EINVAL, "%s takes no reference image", p->pc->name);
    if (p->den2)
        return ditd_err_set(DITD_EUNSUPPORTED, "a reference image with two experts");
    if ((err = ditd_denoiser_set_reference(p->den, rh, rw)))
        return err;
    p->shapes = p->den->shapes;
    set_numels(p);
    return plan_buffers(p); /* the sampler's state and mu are the latents' alone: kept */
}

void ditd_pipeline_free(ditd_pipeline *p)
{
    if (!p)
        return;
    ditd_sampler_free(p->sampler);
    ditd_denoiser_free(p->den);
    ditd_denoiser_free(p->den2);
    ditd_cond_free(&p->cond);
    free_buffers(p);
    free(p->h_t);
    free(p->cond_row);
    free(p->uncond_row);
    free(p->skip_row);
    free(p->ctl);
    ditd_step_cache_free(p->scache);
    ditd_step_cache_free(p->scache2);
    free(p->row_sample);
    free(p->row_branch);
    free(p->row_lora);
    free(p->img_emb);
    free(p->t_frames);
    free(p);
}

/* The scale of classifier-free guidance for a sample, 0 for none: the
 * unconditional pass runs only then (the pipeline row's rule). */
static float cfg_scale(const ditd_pipeline *p, const ditd_gen_sample *s)
{
    return ditd_pipeline_class_cfg_scale(p->pc, s->guidance, s->true_cfg, s->cond.negative != NULL,
                                         p->shapes.guidance_embed);
}

/* Whether skip-layer guidance runs at 0-based step i of steps
 * (StableDiffusion3Pipeline: steps * start < i < steps * stop). */
static int slg_due(const ditd_gen_params *gp, int i, int steps)
{
    return gp->n_skip_layers > 0 && (double)i > (double)steps * (double)gp->slg_start &&
           (double)i < (double)steps * (double)gp->slg_stop;
}

/* Makes p->sampler the one for (kind, steps); rebuilt only on a change. */
static int ensure_sampler(ditd_pipeline *p, ditd_sampler_kind kind, int steps)
{
    ditd_sched_config cfg;
    int err;
    if (p->sampler && p->sampler_kind == kind && p->sampler_steps == steps)
        return 0;
    ditd_sampler_free(p->sampler);
    p->sampler = NULL;
    if ((err = ditd_sched_config_convert(&p->sched_base, kind, &cfg)))
        return err;
    cfg.image_seq_len = p->shapes.tokens; /* mu of dynamic shifting (flow only) */
    cfg.pipeline_sigmas = p->pc->pipeline_sigmas; /* FluxPipeline passes linspace(1, 1/steps) */
    if ((err = ditd_sampler_new(&cfg, steps, p->max_samples, p->numel, &p->sampler)))
        return err;
    p->sampler_kind = kind;
    p->sampler_steps = steps;
    return 0;
}

/* ---- step caching (engine/pipeline/step_cache.h) ---- */

/* Tells the cache this step's rows (sample, branch) and the ones this
 * rank's forward runs. */
static void cache_bind(ditd_pipeline *p, int n, int rows, int r0, int nr)
{
    for (int i = 0; i < n; i++) {
        if (p->cond_row[i] >= 0) {
            p->row_sample[p->cond_row[i]] = i;
            p->row_branch[p->cond_row[i]] = 0;
        }
        if (p->uncond_row[i] >= 0) {
            p->row_sample[p->uncond_row[i]] = i;
            p->row_branch[p->uncond_row[i]] = 1;
        }
    }
    ditd_step_cache_bind(p->sc, rows, p->row_sample, p->row_branch, r0, nr);
}

int ditd_pipeline_set_cache(ditd_pipeline *p, const ditd_cache_config *cfg)
{
    int err;
    if (cfg && (err = ditd_cache_config_check(cfg)))
        return err;
    if (cfg)
        p->cache_cfg = *cfg;
    else
        ditd_cache_config_default(DITD_CACHE_NONE, &p->cache_cfg);
    return 0;
}

void ditd_pipeline_cache_stats(const ditd_pipeline *p, int i, ditd_cache_stats *out)
{
    ditd_cache_stats b;
    ditd_step_cache_sample_stats(p->scache, i, out);
    if (!p->scache2)
        return;
    ditd_step_cache_sample_stats(p->scache2, i, &b); /* the second expert's steps */
    out->steps += b.steps;
    out->steps_skipped += b.steps_skipped;
    out->evals += b.evals;
    out->evals_skipped += b.evals_skipped;
}

int ditd_pipeline_check_loras(const ditd_pipeline *p, const ditd_lora_set *s)
{
    if (!s)
        return 0;
    if (s->n > 0 && p->lora_experts_differ)
        return ditd_err_set(DITD_EUNSUPPORTED, "LoRA adapters: %s's transformer_2 has other "
                            "linear layers than its transformer (an adapter runs on both)",
                            p->info.name);
    if (s->n < 0 || s->n > DITD_LORA_MAX_SET)
        return ditd_err_set(DITD_EINVAL, "%d LoRA adapters on one image (0..%d)", s->n,
                            DITD_LORA_MAX_SET);
    if (s->n > 0 && p->den->n_lora_targets <= 0)
        return ditd_err_set(DITD_EUNSUPPORTED, "LoRA adapters: %s", p->den->lora_refusal);
    for (int i = 0; i < s->n; i++) {
        if (!s->ad[i] || s->ad[i]->n_targets != p->den->n_lora_targets ||
            s->ad[i]->ops != p->ops)
            return ditd_err_set(DITD_EINVAL, "LoRA adapter %s was not loaded for this model",
                                s->ad[i] ? s->ad[i]->name : "(null)");
        if (!isfinite(s->weight[i]))
            return ditd_err_set(DITD_EINVAL, "LoRA adapter %s: scale %g is not finite",
                                s->ad[i]->name, (double)s->weight[i]);
    }
    return 0;
}

/* One forward of rows [r0, r0 + nr) of the planned inputs, with the
 * layers skipped when skip is set. */
static int forward_rows(ditd_pipeline *p, int r0, int nr, const ditd_gen_params *skip)
{
    const ditd_backend_ops *ops = p->ops;
    ditd_cond c = ditd_cond_view(&p->cond, r0);
    if (nr <= 0)
        return 0;
    if (p->img_emb) { /* the rows' image embeddings (load_row) */
        c.image_len = p->shapes.cond.image_len;
        c.image_dim = p->shapes.cond.image_dim;
        c.image = p->img_emb + (size_t)r0 * (size_t)c.image_len * (size_t)c.image_dim;
    }
    if (skip) {
        c.skip_layers = skip->skip_layers;
        c.n_skip_layers = skip->n_skip_layers;
    }
    /* the rows' adapters (engine/models/lora.h), for this forward only */
    const ditd_lora_set *const *ls = NULL;
    for (int r = r0; r < r0 + nr && !ls; r++)
        if (p->row_lora[r])
            ls = p->row_lora + r0;
    p->cur->loras = ls;
    int err = ditd_denoiser_forward(p->cur, nr,
                                    ditd_ptr_act(ops, p->model_in, (size_t)r0 * p->numel_in),
                                    p->h_t + r0, &c,
                                    ditd_ptr_act(ops, p->model_out, (size_t)r0 * p->numel_out));
    p->cur->loras = NULL;
    return err;
}

/* The step's forwards: rows [0, rc) conditional, [rc, ru) unconditional,
 * [ru, rows) skip-layer. On one group the first two run as one forward (as
 * the pipelines batch them), the skip-layer rows as another. Under cfg
 * parallel cfg rank 0 runs the conditional rows and rank 1 the rest (a
 * half with no rows skips its forward: its whole sub-group agrees, the rows
 * come from the same batch), then the outputs are all-gathered. */
static int run_forwards(ditd_pipeline *p, int n, int rc, int ru, int rows, int cfg_par,
                        const ditd_gen_params *gp)
{
    int err;
    if (!cfg_par) {
        cache_bind(p, n, ru, 0, ru); /* the step cache sees the guided rows, not the skip-layer ones */
        return (err = forward_rows(p, 0, ru, NULL)) ? err : forward_rows(p, ru, rows - ru, gp);
    }
    int half = p->mesh->cfg_rank, r0 = half ? rc : 0, nr = half ? ru - rc : rc;
    cache_bind(p, n, ru, r0, nr);
    if (nr == 0 && (err = ditd_step_cache_idle(p->sc)))
        return err;
    err = forward_rows(p, r0, nr, NULL);
    if (!err && half)
        err = forward_rows(p, ru, rows - ru, gp);
    if (err)
        return err;
    int counts[2] = {(int)((size_t)rc * p->numel_out), (int)((size_t)(rows - rc) * p->numel_out)};
    int displs[2] = {0, counts[0]};
    return ditd_comm_allgatherv(p->mesh->cfg_comm, p->ops->act_dtype, NULL, p->model_out, counts,
                                displs);
}

/* TI2V-5B (first_frame): latent frame 0 of sample i := its image's latents
 * ((1 - first_frame_mask) x condition + first_frame_mask x latents, exact
 * for a 0/1 mask). Frame 0's own sampler state only ever reads itself, so
 * replacing it in place gives the other frames Diffusers' values. */
static void put_first_frame(ditd_pipeline *p, int i, const ditd_gen_sample *smp)
{
    const int C = p->shapes.out_channels, F = p->shapes.frames > 0 ? p->shapes.frames : 1;
    const size_t hw = p->numel / ((size_t)C * F);
    float *x = p->lat + (size_t)i * p->numel;
    for (int c = 0; c < C; c++)
        memcpy(x + (size_t)c * F * hw, smp->video_cond + (size_t)c * hw, hw * sizeof(float));
}

/* Forward row r := sample i's latents, then (image-to-video) its
 * condition on the following channels and its image embeddings. */
static void load_row(ditd_pipeline *p, int r, int i, const ditd_gen_sample *smp)
{
    const ditd_backend_ops *ops = p->ops;
    void *in = ditd_ptr_act(ops, p->model_in, (size_t)r * p->numel_in);
    ops->upload(in, p->lat + (size_t)i * p->numel, p->numel);
    if (p->numel_cond)
        ops->upload(ditd_ptr_act(ops, in, p->numel), smp->video_cond, p->numel_cond);
    if (p->numel_ref) /* Kontext: torch.cat([latents, image_latents], dim=1) */
        ops->upload(ditd_ptr_act(ops, in, p->numel + p->numel_cond), smp->ref_latents,
                    p->numel_ref);
    if (p->img_emb) {
        size_t ne = (size_t)p->shapes.cond.image_len * (size_t)p->shapes.cond.image_dim;
        memcpy(p->img_emb + (size_t)r * ne, smp->image_embeds, ne * sizeof(float));
    }
    if (p->first_frame) { /* mask * t per frame: the first frame at 0 */
        int F = p->shapes.frames;
        float t = p->h_t[r];
        p->t_frames[(size_t)r * F] = 0.0f;
        for (int f = 1; f < F; f++)
            p->t_frames[(size_t)r * F + f] = t;
    }
}

/* FluxInpaintPipeline after the scheduler's step s: the kept part (mask 0)
 * is the image's latents noised to the next step's sigma with the sample's
 * initial noise (scale_noise: sigma noise + (1 - sigma) x0; the last step:
 * x0 itself), the repainted part (mask 1) the step's result:
 * (1 - m) proper + m latents, float32 in that order. The mask is (h, w),
 * the same for every channel. */
static int inpaint_blend(ditd_pipeline *p, int s, int steps, const ditd_gen_sample *smp,
                         const float *noise, float *lat)
{
    const float *x0 = smp->image_latents, *m = smp->mask_latents;
    const int C = p->shapes.in_channels;
    const size_t hw = p->numel / (size_t)C;
    float sigma = 0.0f;
    int err, last = s + 1 >= steps;
    if (!last && (err = ditd_sampler_scale_noise_sigma(p->sampler, s + 1, &sigma)))
        return err;
    const float keep = 1.0f - sigma;
    for (int c = 0; c < C; c++)
        for (size_t j = 0; j < hw; j++) {
            size_t k = (size_t)c * hw + j;
            float proper = x0[k];
            if (!last) {
                float a = sigma * noise[k], b = keep * x0[k];
                proper = a + b;
            }
            float u = (1.0f - m[j]) * proper, v = m[j] * lat[k];
            lat[k] = u + v;
        }
    return 0;
}

int ditd_pipeline_generate(ditd_pipeline *p, const ditd_gen_params *gp, int n,
                           const ditd_gen_sample *samples, const float *init_noise, float *out,
                           uint8_t *active, ditd_step_fn cb, void *ud)
{
    const ditd_backend_ops *ops = p->ops;
    size_t numel = p->numel; /* the epsilon channels: the first C of Co */
    int err, steps;
    const float *ts;

    if (n <= 0 || n > p->max_samples)
        return ditd_err_set(DITD_EINVAL, "%d samples (1..%d)", n, p->max_samples);
    if (gp->steps < 1 || gp->steps > 1000)
        return ditd_err_set(DITD_EINVAL, "num_inference_steps %d (1..1000)", gp->steps);
    if (gp->n_skip_layers < 0 || gp->n_skip_layers > DITD_MAX_SKIP_LAYERS)
        return ditd_err_set(DITD_EINVAL, "%d skip_guidance_layers (0..%d)", gp->n_skip_layers,
                            DITD_MAX_SKIP_LAYERS);
    if (gp->n_skip_layers > 0) {
        if (!(p->pc->request & DITD_REQ_SKIP_LAYERS))
            return ditd_err_set(DITD_EINVAL, "%s has no skip-layer guidance", p->pc->name);
        if (!isfinite(gp->slg_scale) || !isfinite(gp->slg_start) || !isfinite(gp->slg_stop))
            return ditd_err_set(DITD_EINVAL, "skip-layer guidance scale/start/stop not finite");
        for (int i = 0; i < gp->n_skip_layers; i++)
            if (gp->skip_layers[i] < 0)
                return ditd_err_set(DITD_EINVAL, "skip_guidance_layers[%d] = %d", i,
                                    gp->skip_layers[i]);
    }
    for (int i = 0; i < n; i++) {
        if ((err = ditd_cond_check(&p->shapes.cond, &samples[i].cond)))
            return err;
        if (!isfinite(samples[i].guidance) || samples[i].guidance < 0)
            return ditd_err_set(DITD_EINVAL, "guidance_scale %g", (double)samples[i].guidance);
        if (!isfinite(samples[i].true_cfg) || samples[i].true_cfg < 0)
            return ditd_err_set(DITD_EINVAL, "true_cfg_scale %g", (double)samples[i].true_cfg);
        if (samples[i].has_guidance_2 && !p->den2)
            return ditd_err_set(DITD_EINVAL, "guidance_scale_2: %s has one transformer (it needs "
                                "transformer_2 and boundary_ratio)", p->info.name);
        if (samples[i].has_guidance_2 &&
            (!isfinite(samples[i].guidance_2) || samples[i].guidance_2 < 0))
            return ditd_err_set(DITD_EINVAL, "guidance_scale_2 %g", (double)samples[i].guidance_2);
        if ((err = ditd_pipeline_check_loras(p, samples[i].loras)) ||
            (err = ditd_pipeline_check_loras(p, samples[i].loras_2)))
            return err;
        if (samples[i].loras_2 && !p->den2)
            return ditd_err_set(DITD_EINVAL, "LoRA adapters for transformer_2: %s has one "
                                "transformer", p->info.name);
        if (p->pc->image_to_video && (!samples[i].video_cond ||
                                      (p->img_emb && !samples[i].image_embeds)))
            return ditd_err_set(DITD_EINVAL, "%s: sample %d has no input image (%s)",
                                p->pc->name, i, !samples[i].video_cond ? "condition"
                                                                       : "image embeddings");
        if (!p->pc->image_to_video && (samples[i].video_cond || samples[i].image_embeds))
            return ditd_err_set(DITD_EINVAL, "%s takes no input image (sample %d)", p->pc->name,
                                i);
        if (p->numel_ref && !samples[i].ref_latents)
            return ditd_err_set(DITD_EINVAL, "%s: sample %d has no reference image latents (a "
                                "reference of %dx%d is planned)", p->pc->name, i,
                                p->shapes.ref_width, p->shapes.ref_height);
        if (!p->numel_ref && samples[i].ref_latents)
            return ditd_err_set(DITD_EINVAL, "sample %d has reference image latents but no "
                                "reference size is set (%s)", i, p->pc->name);
    }
    if (p->numel_ref && gp->strength != 0.0)
        return ditd_err_set(DITD_EINVAL, "strength %g: %s takes a reference image, not a start "
                            "(no strength)", gp->strength, p->pc->name);
    if (p->numel_ref && p->cache_cfg.method != DITD_CACHE_NONE)
        return ditd_err_set(DITD_EUNSUPPORTED, "step caching with a reference image (Kontext) "
                            "is not supported yet");
    if ((err = ensure_sampler(p, gp->sampler, gp->steps)))
        return err;
    ts = ditd_sampler_timesteps(p->sampler);
    steps = ditd_sampler_num_steps(p->sampler);
    /* img2img: the schedule from t_start, each sample from its image's
     * latents noised at sigma[t_start] (FlowMatchEulerDiscreteScheduler's
     * scale_noise after set_begin_index(t_start)) */
    int t_start = 0;
    float sigma0 = 1.0f;
    if (gp->strength != 0.0) {
        if (!p->pc->img2img)
            return ditd_err_set(DITD_EINVAL, "%s takes no input image (strength)", p->pc->name);
        if ((err = ditd_pipeline_strength_start(steps, gp->strength, &t_start)) ||
            (err = ditd_sampler_scale_noise_sigma(p->sampler, t_start, &sigma0)))
            return err;
        for (int i = 0; i < n; i++) {
            if (!samples[i].image_latents)
                return ditd_err_set(DITD_EINVAL, "strength %g: sample %d has no input image",
                                    gp->strength, i);
            if (samples[i].mask_latents && !p->pc->inpaint)
                return ditd_err_set(DITD_EINVAL, "%s takes no mask (inpainting)", p->pc->name);
            if (samples[i].mask_latents && p->info.frames > 0)
                return ditd_err_set(DITD_EUNSUPPORTED, "a mask on a video model");
            /* an edit follows its edit row's request fields (SD3's edit
             * pipelines have no skip-layer guidance) */
            const ditd_pipeline_class *er =
                ditd_pipeline_class_edit_row(p->pc, 1, samples[i].mask_latents != NULL);
            if (gp->n_skip_layers > 0 && !(er->request & DITD_REQ_SKIP_LAYERS))
                return ditd_err_set(DITD_EINVAL, "skip_guidance_layers: %s has no skip-layer "
                                    "guidance (sample %d is an edit)", er->name, i);
        }
        if (t_start > 0 && p->cache_cfg.method != DITD_CACHE_NONE)
            return ditd_err_set(DITD_EUNSUPPORTED, "step caching with strength < 1 (img2img) is "
                                "not supported yet");
    } else {
        for (int i = 0; i < n; i++)
            if (samples[i].image_latents || samples[i].mask_latents)
                return ditd_err_set(DITD_EINVAL, "sample %d has an input image or mask but no "
                                    "strength", i);
    }
    /* DiTPipeline and StableDiffusion3Pipeline run [x; x] under one cache
     * state, FluxPipeline and WanPipeline their branches under
     * cache_context("cond") / ("uncond") */
    if ((err = ditd_step_cache_begin(p->scache, p->den, &p->cache_cfg, steps, n,
                                     !p->pc->cache_branch_contexts)))
        return err;
    /* two experts: each its own hooks and states, as a Diffusers user
     * enables the cache on transformer and transformer_2 */
    if (p->scache2 && (err = ditd_step_cache_begin(p->scache2, p->den2, &p->cache_cfg, steps, n,
                                                   !p->pc->cache_branch_contexts))) {
        ditd_step_cache_end(p->scache);
        return err;
    }
    p->sc = p->scache;

    if (p->first_frame) { /* (max_rows, frames) timesteps, grown between batches */
        int F = p->shapes.frames > 0 ? p->shapes.frames : 1;
        if (p->t_frames_cap < F) {
            float *tf = realloc(p->t_frames, (size_t)p->max_rows * F * sizeof(float));
            if (!tf)
                return ditd_err_set(DITD_ENOMEM, "per-frame timesteps");
            p->t_frames = tf;
            p->t_frames_cap = F;
        }
        p->cond.t_frames = p->t_frames;
        p->cond.t_frames_n = F;
    }
    /* In a group the leader's flags rule: ctl = [stop, active[0..n)],
     * broadcast at the start and after every step's callback. */
    uint8_t *act = NULL;
    if (p->mesh) {
        act = p->ctl + 1;
        p->ctl[0] = 0;
        for (int i = 0; i < n; i++)
            act[i] = active ? active[i] != 0 : 1;
        if ((err = ditd_mesh_bcast(p->mesh, p->ctl, 1 + (size_t)n)))
            return err;
        if (active)
            memcpy(active, act, (size_t)n);
    } else {
        act = active;
    }

    /* initial noise (n, C, h, w); every sampler here has init_noise_sigma 1 */
    for (int i = 0; i < n; i++) {
        float *x = p->lat + (size_t)i * numel;
        if (init_noise)
            memcpy(x, init_noise + (size_t)i * numel, numel * sizeof(float));
        else
            ditd_philox_normal(samples[i].seed, samples[i].index, 0, numel, x);
        if (samples[i].mask_latents) /* inpainting noises the kept latents with it every step */
            memcpy(p->noise + (size_t)i * numel, x, numel * sizeof(float));
        if (samples[i].image_latents) {
            /* sigma * noise + (1 - sigma) * x0, float32 as the scheduler */
            const float *x0 = samples[i].image_latents;
            const float keep = 1.0f - sigma0;
            for (size_t j = 0; j < numel; j++) {
                float a = sigma0 * x[j], b = keep * x0[j];
                x[j] = a + b;
            }
        }
    }

    int cfg_par = p->mesh && p->mesh->layout.cfg == 2;
    for (int s = t_start; s < steps; s++) {
        for (int i = 0; p->first_frame && i < n; i++)
            put_first_frame(p, i, &samples[i]);
        /* WanPipeline: t >= boundary runs transformer, the rest transformer_2
         * with guidance_scale_2 */
        int low = p->den2 && ts[s] < p->boundary_t;
        p->cur = low ? p->den2 : p->den;
        p->sc = low ? p->scache2 : p->scache;
        /* The forward batch: the active samples with their conditioning,
         * then the unconditional input (null class, negative prompt) for
         * those with guidance > 1 (DiTPipeline's [x; x]). A family that
         * embeds the guidance (FLUX.1-dev) reads the scale from
         * cond.guidance and gets no unconditional row. */
        int rows = 0, rows_c;
        for (int i = 0; i < n; i++) {
            p->cond_row[i] = -1;
            if (act && !act[i])
                continue;
            p->cond_row[i] = rows;
            if ((err = ditd_cond_set_row(&p->cond, rows, &samples[i].cond, 0)))
                return err;
            p->cond.guidance[rows] = samples[i].guidance;
            p->h_t[rows] = ts[s];
            p->row_lora[rows] = row_set(low, &samples[i]);
            load_row(p, rows, i, &samples[i]);
            rows++;
        }
        if (rows == 0)
            break;
        rows_c = rows;
        for (int i = 0; i < n; i++) {
            p->uncond_row[i] = -1;
            if (p->cond_row[i] < 0 || cfg_scale(p, &samples[i]) == 0.0f)
                continue;
            p->uncond_row[i] = rows;
            if ((err = ditd_cond_set_row(&p->cond, rows, &samples[i].cond, 1)))
                return err;
            p->cond.guidance[rows] = samples[i].guidance;
            p->h_t[rows] = ts[s];
            p->row_lora[rows] = row_set(low, &samples[i]);
            load_row(p, rows, i, &samples[i]);
            rows++;
        }
        /* skip-layer guidance: the guided samples' conditional input once
         * more, through a forward of its own with the layers skipped */
        int rows_u = rows, slg = slg_due(gp, s - t_start, steps - t_start);
        for (int i = 0; i < n; i++) {
            p->skip_row[i] = -1;
            if (!slg || p->uncond_row[i] < 0)
                continue;
            p->skip_row[i] = rows;
            if ((err = ditd_cond_set_row(&p->cond, rows, &samples[i].cond, 0)))
                return err;
            p->cond.guidance[rows] = samples[i].guidance;
            p->h_t[rows] = ts[s];
            p->row_lora[rows] = row_set(low, &samples[i]);
            load_row(p, rows, i, &samples[i]);
            rows++;
        }
        if ((err = run_forwards(p, n, rows_c, rows_u, rows, cfg_par, gp)))
            return err;
        ops->download(p->h_out, p->model_out, (size_t)rows * p->numel_out);
        if ((err = ops->status()))
            return err;
        ditd_step_cache_step_done(p->sc);

        for (int i = 0; i < n; i++) {
            if (p->cond_row[i] < 0)
                continue;
            /* model output: the first C channels (a learned sigma is
             * dropped); with guidance eps = uncond + g (cond - uncond). */
            float *cond = p->h_out + (size_t)p->cond_row[i] * p->numel_out;
            if (p->uncond_row[i] >= 0) {
                const float *unc = p->h_out + (size_t)p->uncond_row[i] * p->numel_out;
                float g = low && samples[i].has_guidance_2 ? samples[i].guidance_2
                                                           : cfg_scale(p, &samples[i]);
                if (p->skip_row[i] >= 0) {
                    /* noise_pred + (noise_pred_text - noise_pred_skip_layers) * scale,
                     * in the pipeline's order of operations */
                    const float *sk = p->h_out + (size_t)p->skip_row[i] * p->numel_out;
                    for (size_t j = 0; j < numel; j++) {
                        float guided = unc[j] + g * (cond[j] - unc[j]);
                        cond[j] = guided + (cond[j] - sk[j]) * gp->slg_scale;
                    }
                } else {
                    for (size_t j = 0; j < numel; j++)
                        cond[j] = unc[j] + g * (cond[j] - unc[j]);
                }
            }
            if ((err = ditd_sampler_step(p->sampler, s, i, cond, p->lat + (size_t)i * numel,
                                         p->x0 + (size_t)i * numel)))
                return err;
            if (samples[i].mask_latents && (err = inpaint_blend(p, s, steps, &samples[i],
                                                                p->noise + (size_t)i * numel,
                                                                p->lat + (size_t)i * numel)))
                return err;
        }
        int stop = 0;
        if (!p->mesh) {
            stop = cb && cb(ud, s - t_start + 1, steps - t_start, p->x0, active);
        } else {
            if (ditd_mesh_is_leader(p->mesh)) {
                p->ctl[0] = cb && cb(ud, s - t_start + 1, steps - t_start, p->x0, active) ? 1 : 0;
                if (active)
                    for (int i = 0; i < n; i++)
                        act[i] = active[i] != 0;
            }
            if ((err = ditd_mesh_bcast(p->mesh, p->ctl, 1 + (size_t)n)))
                return err;
            if (active)
                memcpy(active, act, (size_t)n);
            stop = p->ctl[0];
        }
        /* a stop never waits for a preview: the hook runs after the decision */
        if (!stop && p->preview &&
            (err = p->preview(p->preview_ud, s - t_start + 1, steps - t_start, p->x0, act))) {
            ditd_step_cache_end(p->scache);
            ditd_step_cache_end(p->scache2);
            return err;
        }
        if (stop) {
            ditd_step_cache_end(p->scache);
            ditd_step_cache_end(p->scache2);
            return ditd_err_set(DITD_ECANCELED, "stopped after step %d of %d", s - t_start + 1,
                                steps - t_start);
        }
    }
    ditd_step_cache_end(p->scache);
    ditd_step_cache_end(p->scache2);
    p->cur = p->den;
    p->sc = p->scache;
    for (int i = 0; p->first_frame && i < n; i++) /* the result's first frame is the image's */
        put_first_frame(p, i, &samples[i]);
    memcpy(out, p->lat, (size_t)n * numel * sizeof(float));
    return 0;
}

void ditd_pipeline_set_preview(ditd_pipeline *p, ditd_preview_fn fn, void *ud)
{
    p->preview = fn;
    p->preview_ud = ud;
}

int ditd_pipeline_strength_start(int steps, double strength, int *t_start)
{
    if (!(strength > 0.0 && strength <= 1.0))
        return ditd_err_set(DITD_EINVAL, "strength %g (0 < strength <= 1)", strength);
    /* get_timesteps: Python floats */
    double init = (double)steps * strength;
    if (init > (double)steps)
        init = (double)steps;
    double left = (double)steps - init;
    int t0 = (int)(left > 0.0 ? left : 0.0);
    if (steps - t0 < 1)
        return ditd_err_set(DITD_EINVAL, "strength %g leaves %d of %d num_inference_steps (at "
                            "least 1)", strength, steps - t0, steps);
    *t_start = t0;
    return 0;
}

void ditd_pipeline_to_pixels(const float *x, int C, int H, int W, uint8_t *out)
{
    size_t hw = (size_t)H * (size_t)W;
    for (int c = 0; c < C; c++) {
        for (size_t i = 0; i < hw; i++) {
            /* float32 arithmetic as torch: (x / 2 + 0.5).clamp(0, 1), then
             * numpy's (v * 255).round(): round half to even */
            float v = x[(size_t)c * hw + i] / 2.0f + 0.5f;
            v = v < 0.0f ? 0.0f : v > 1.0f ? 1.0f : v;
            if (v != v)
                v = 0.0f;
            out[i * (size_t)C + (size_t)c] = (uint8_t)nearbyintf(v * 255.0f);
        }
    }
}
