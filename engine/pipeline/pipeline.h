/* The denoising loop, as Diffusers' DiTPipeline and FluxPipeline: initial
 * noise, then per step: the denoiser's forward on the doubled batch when
 * classifier-free guidance is on, guidance on the epsilon half, a learned
 * sigma dropped, the sampler step. What differs by model_index.json's
 * pipeline class is its row in the pipeline table
 * (engine/models/pipeline_class.h): the guidance kind (FluxPipeline passes
 * guidance_scale to a model that embeds it and runs the unconditional pass
 * only for true_cfg_scale > 1 with a negative prompt; the others guide with
 * guidance_scale), skip-layer guidance (StableDiffusion3Pipeline), and
 * whether the scheduler gets the pipeline's own sigmas (FluxPipeline's
 * linspace(1, 1/steps)). The output is the final latents; for a pixel-space
 * model (no VAE) ditd_pipeline_to_pixels() maps them to 8-bit pixels as
 * DiTPipeline does ((x / 2 + 0.5) clamped, x 255, rounded).
 *
 * The loop never names a family: the model is a ditd_denoiser
 * (engine/models/denoiser.h) found by the model folder's registry lookup,
 * and each sample's conditioning is a ditd_cond_input; the unconditional
 * rows of guidance get what ditd_cond_set_row() gives (the null class K
 * for a class model, as DiTPipeline's hardcoded 1000 for ImageNet; the
 * negative prompt's embedding for a text model).
 *
 * Memory: model, sampler state and every buffer are planned in _new() for
 * max_samples; the step loop allocates nothing. A sampler is rebuilt only
 * when a batch asks for another (sampler, steps) pair.
 *
 * Groups (ditd_pipeline_new_group): the G ranks of a mesh run one batch
 * together, SPMD. Every rank calls ditd_pipeline_generate() with the same
 * gp, n, samples and init_noise (the worker broadcasts the batch first:
 * ditd_mesh_bcast_var); every rank ends with the same out. The leader
 * (group rank 0) alone runs the callback; after it, the leader broadcasts
 * the active flags and the stop decision, so every rank drops the same
 * samples and stops at the same step, and all run the same collectives.
 * Under cfg parallel the conditional rows run on cfg rank 0's sub-group,
 * the unconditional ones on cfg rank 1's, and the noise predictions are
 * exchanged (all-gather over the cfg axis) before each sampler step.
 */
#ifndef DITD_ENGINE_PIPELINE_H
#define DITD_ENGINE_PIPELINE_H

#include <stdint.h>

#include "engine/backend/backend.h"
#include "engine/models/denoiser.h"
#include "engine/parallel/mesh.h"
#include "engine/models/model.h"
#include "engine/pipeline/sampler.h"
#include "engine/pipeline/step_cache.h"

#define DITD_MAX_SKIP_LAYERS 16

/* What every sample of a batch shares (the batcher groups on these). */
typedef struct ditd_gen_params {
    int steps;                  /* num_inference_steps, 1..1000 */
    ditd_sampler_kind sampler;
    /* skip-layer guidance (StableDiffusion3Pipeline's skip_guidance_layers,
     * for a pipeline whose row has DITD_REQ_SKIP_LAYERS): at steps i with
     * steps * slg_start < i < steps * slg_stop (0-based), the samples that
     * run classifier-free guidance also run a conditional pass with these
     * blocks skipped s, and eps += slg_scale (c - s). 0 layers: off. */
    int n_skip_layers;
    int skip_layers[DITD_MAX_SKIP_LAYERS];
    float slg_scale, slg_start, slg_stop;
    /* img2img (a row with img2img, engine/models/pipeline_class.h): 0 for
     * text-to-image (the whole schedule from noise); in (0, 1] every sample
     * carries image_latents, the schedule is truncated as Diffusers'
     * get_timesteps (ditd_pipeline_strength_start) and each sample starts
     * from its image latents noised at the first kept step
     * (ditd_sampler_scale_noise_sigma). Double, as Diffusers computes
     * num_inference_steps * strength in Python floats. */
    double strength;
} ditd_gen_params;

/* One image of a batch. */
typedef struct ditd_gen_sample {
    uint64_t seed;              /* the request's seed */
    uint64_t index;             /* which image of the request: its noise stream */
    ditd_cond_input cond;       /* class id (0..K-1), or the prompt's embeddings */
    float guidance;             /* guidance_scale: classifier-free guidance (<= 1: no
                                 * unconditional pass), or for a family that embeds it
                                 * (FLUX.1-dev) the model's guidance input */
    float true_cfg;             /* true_cfg_scale of a DITD_GUIDANCE_TRUE_CFG pipeline
                                 * (FluxPipeline): > 1 with a negative prompt runs the
                                 * unconditional pass; else unused */
    int has_guidance_2;         /* guidance_scale_2 given (a model with two experts only) */
    float guidance_2;           /* the scale of the second expert's steps (WanPipeline's
                                 * guidance_scale_2); without it guidance. Whether the
                                 * unconditional pass runs is guidance's decision alone,
                                 * as in WanPipeline */
    const float *image_latents; /* img2img (gp->strength > 0): the input image's latents
                                 * (C, h, w) host f32, already as the transformer reads
                                 * them (VAE draw, shifted and scaled:
                                 * ditd_latent_image_encode); borrowed for the call,
                                 * samples may share one. NULL otherwise */
    /* image-to-video (a row with image_to_video): the condition (Cc, F, h, w)
     * (with expand_timesteps: the first frame's latents (C, 1, h, w))
     * host f32 that follows the latents on channels in every forward row of
     * this sample (ditd_image_cond_run: mask + scaled VAE latents), and for
     * a transformer with an image branch its image embeddings (Li, Di)
     * (both passes, as WanImageToVideoPipeline). Borrowed for the call;
     * NULL on other rows (required on an image-to-video row). */
    const float *video_cond;
    const float *image_embeds;
    const float *mask_latents;  /* inpainting (a row with inpaint; with image_latents): the
                                 * mask on the latent grid (h, w) f32, 1 repainted, 0 kept
                                 * (ditd_latent_mask_from_gray); after every step the kept
                                 * latents are the image's noised to the next sigma with
                                 * this sample's initial noise, as FluxInpaintPipeline.
                                 * Borrowed; NULL: no mask (img2img) */
    const float *ref_latents;   /* a reference row (FluxKontextPipeline: the row's reference,
                                 * ditd_pipeline_set_reference planned its size): the
                                 * reference image's latents (C, rh, rw) host f32 as the
                                 * transformer reads them (the VAE's mode, shifted and
                                 * scaled: ditd_latent_image_encode_mode), after this
                                 * sample's latents in every forward row (both guidance
                                 * passes). Samples of a batch may carry different ones
                                 * (Diffusers' image list) or share one; borrowed. Required
                                 * when a reference size is set, NULL otherwise */
    const ditd_lora_set *loras; /* LoRA adapters and their scales for every forward row
                                 * of this sample (borrowed; NULL: none). Samples of one
                                 * batch may carry different sets (engine/models/lora.h) */
    const ditd_lora_set *loras_2; /* a pipeline with two experts (Wan 2.2): the set of the
                                   * steps transformer_2 runs; NULL: loras there too (every
                                   * adapter on both experts); an empty set (n 0): none
                                   * there, loras on transformer alone (docs/lora.md) */
} ditd_gen_sample;

/* Called after every step on the calling thread: step is 1-based. x0 is
 * the current prediction of the clean latents (n, C, h, w), host f32, for
 * previews (rows of inactive samples are stale); borrowed for the call.
 * active (n flags, or NULL when the caller passed none) may be cleared
 * here to drop a sample: it leaves the batch from the next step on and its
 * output is left as it was. Return non-zero to stop the whole batch:
 * generate then returns DITD_ECANCELED. */
typedef int (*ditd_step_fn)(void *ud, int step, int total, const float *x0, uint8_t *active);

/* The preview hook (ditd_pipeline_set_preview): called on every rank of a
 * group (and on the one rank without a group) after step's callback and the
 * broadcast of its decision, only when the batch goes on, with the same x0
 * (n, C, h, w: the sampler's prediction of the clean latents, host f32,
 * borrowed for the call; rows of inactive samples stale) and the same active
 * flags (n, or NULL: all) on every rank. Made for what is collective and
 * must not delay a stop: a latent model's preview decode (the group decodes
 * together, after the leader decided; a stopped batch or a dropped sample
 * is never decoded). Returns 0, or a negative DITD_E* code that generate
 * returns (the same on every rank, or the group is out of step). */
typedef int (*ditd_preview_fn)(void *ud, int step, int total, const float *x0,
                               const uint8_t *active);

typedef struct ditd_pipeline {
    const ditd_backend_ops *ops;
    ditd_model_info info;        /* copied; labels borrowed from the caller's info */
    ditd_denoiser *den;
    ditd_denoiser *den2;         /* the second expert (info.transformer_2_dir), or NULL */
    float boundary_t;            /* den2 runs the steps whose timestep is below this
                                  * (boundary_ratio x num_train_timesteps, in float32 as
                                  * WanPipeline compares it); -1 without den2 */
    ditd_denoiser *cur;          /* the step's denoiser: den or den2 */
    int lora_experts_differ;     /* den2's LoRA targets are not den's: no adapters */
    ditd_denoiser_shapes shapes; /* the denoiser's (latent) */
    ditd_sched_config sched_base;
    ditd_sampler *sampler;       /* for (sampler_kind, sampler_steps) */
    ditd_sampler_kind sampler_kind;
    int sampler_steps;
    int max_samples;
    const ditd_pipeline_class *pc; /* the model's row of the pipeline table (info.pipeline) */
    int max_rows;                /* forward rows planned: 2 max_samples, 3 with skip-layer guidance */
    size_t numel;                /* C*h*w per sample (latent) */
    size_t numel_in;             /* the transformer's input per row: numel + numel_cond +
                                  * numel_ref */
    size_t numel_cond;           /* image-to-video: the condition's Cc*F*h*w; else 0 */
    size_t numel_ref;            /* a reference (set_reference): C*rh*w of the reference
                                  * latents after the latents (and condition); else 0 */
    float *img_emb;              /* (max_rows, Li, Di) image embeddings of the rows, or NULL */
    int first_frame;             /* image-to-video with expand_timesteps (TI2V-5B): the
                                  * sample's video_cond (C, 1, h, w) replaces latent frame 0
                                  * of every forward and of the result, that frame at t = 0 */
    float *t_frames;             /* (max_rows, frames) per-frame timesteps then, else NULL */
    int t_frames_cap;
    size_t cap_numel, cap_numel_out; /* what the buffers below hold per sample */
    size_t numel_out;            /* Co*h*w per sample */
    float *lat;                  /* (n, C, h, w) host */
    float *x0;                   /* (n, C, h, w) host */
    float *noise;                /* (n, C, h, w) host: the initial noise (inpainting) */
    void *model_in;              /* (max_rows, C, h, w) backend */
    void *model_out;             /* (max_rows, Co, h, w) backend */
    float *h_out;                /* (max_rows, Co, h, w) host */
    float *h_t;                  /* (max_rows) */
    ditd_cond cond;              /* (max_rows) rows: conditional, unconditional, skip-layer */
    int *cond_row, *uncond_row, *skip_row; /* (n) forward row of each sample, -1 = none */
    const ditd_mesh *mesh;       /* borrowed; NULL = one rank */
    uint8_t *ctl;                /* (1 + max_samples) leader's stop flag + active flags */
    ditd_step_cache *scache;     /* step caching: states per sample and branch */
    ditd_step_cache *scache2;    /* den2's own (Diffusers hooks each expert apart), or NULL */
    ditd_step_cache *sc;         /* the step's: scache or scache2, as cur */
    ditd_cache_config cache_cfg; /* what ditd_pipeline_set_cache() gave (method none: off) */
    int *row_sample;             /* (2n) the step's forward rows: sample and branch */
    uint8_t *row_branch;
    const ditd_lora_set **row_lora; /* (max_rows) the step's forward rows: their adapters */
    ditd_preview_fn preview;     /* ditd_pipeline_set_preview's, or NULL */
    void *preview_ud;
} ditd_pipeline;

/* Loads the transformer weights of `info` for up to max_samples images per
 * batch (2 x max_samples forwards with guidance), and those of its second
 * expert when the folder has one (info.transformer_2_dir: Wan 2.2 A14B; both
 * planned for the same sizes, both re-planned by set_size). For a latent
 * model the output stays latents: decoding them is the caller's business. */
int ditd_pipeline_new(const ditd_model_info *info, const ditd_backend_ops *ops, int max_samples,
                      ditd_pipeline **out);

/* The same for one rank of a worker group: mesh (engine/parallel/mesh.h) is
 * borrowed and must outlive the pipeline; NULL or a mesh of one is the
 * single-rank pipeline. A layout that cannot run this model (heads, tokens:
 * ditd_layout_check_attention) is refused with DITD_EINVAL on every rank alike,
 * before any collective; a head size the backend's attention does not take
 * (ditd_backend_check_head_dim) with DITD_EUNSUPPORTED naming the device and
 * its limit, before any weight is read. Not collective itself. */
int ditd_pipeline_new_group(const ditd_model_info *info, const ditd_backend_ops *ops,
                            int max_samples, const ditd_mesh *mesh, ditd_pipeline **out);
void ditd_pipeline_free(ditd_pipeline *p);

/* Re-plans for latents of height x width and text_len text tokens (a
 * family with set_size: FLUX), keeping the weights; buffers grow when the
 * new size needs more. 0 when the size is the current one. A family
 * without set_size takes only its own size (DITD_EUNSUPPORTED naming it).
 * Between batches; not collective (every rank of a group calls it with the
 * same sizes, and a refusal is the same on every rank). */
int ditd_pipeline_set_size(ditd_pipeline *p, int height, int width, int text_len);

/* The same for a video family (set_video_size: Wan) with frames latent
 * frames (ditd_model_latent_frames of the clip's frame count): the noise,
 * the buffers and the sampler state are then (C, frames, height, width)
 * per sample. frames <= 1 on an image family is ditd_pipeline_set_size. */
int ditd_pipeline_set_video_size(ditd_pipeline *p, int frames, int height, int width,
                                 int text_len);

/* Reference latents of rh x rw (latent grid) for the batches that follow (a
 * row with `reference`: FluxKontextPipeline; the denoiser's set_reference):
 * every sample then carries ref_latents of that size. 0 x 0: none again. A
 * later set_size keeps it. Between batches; not collective (every rank of a
 * group calls it with the same size); DITD_EINVAL on a row without reference
 * or a size the denoiser refuses (the old one stays). */
int ditd_pipeline_set_reference(ditd_pipeline *p, int rh, int rw);

/* Runs n samples (1..max_samples) together. init_noise, when not NULL, is
 * (n, C, h, w) host f32 and replaces the generator (Diffusers' latents=);
 * otherwise sample i's noise is ditd_philox_normal(seed_i, index_i, ...).
 * With gp->strength > 0 (img2img) the noise is mixed with each sample's
 * image_latents as the scheduler's scale_noise does at the first kept step
 * (so init_noise is the pipeline's randn_tensor draw, not its latents=), the
 * steps before it are skipped, and cb sees steps 1..(steps - t_start).
 * out: (n, C, h, w) host f32, the final latents. active: n flags, 1 = run
 * (NULL = all); samples whose flag is 0 at a step boundary are skipped from
 * then on (cancellation). A sample's result does not depend on the others
 * in the batch. cb may be NULL.
 * In a group: collective over the group; cb runs on the leader only (pass
 * NULL elsewhere); active and the stop decision are the leader's, also at
 * the start (the leader's initial flags are broadcast), and each rank's
 * active array (when given) is updated to them after every step. */
int ditd_pipeline_generate(ditd_pipeline *p, const ditd_gen_params *gp, int n,
                           const ditd_gen_sample *samples, const float *init_noise, float *out,
                           uint8_t *active, ditd_step_fn cb, void *ud);

/* The preview hook for the batches that follow (NULL: none); ud borrowed.
 * Every rank of a group sets the same (the hook runs on all of them). */
void ditd_pipeline_set_preview(ditd_pipeline *p, ditd_preview_fn fn, void *ud);

/* Diffusers' get_timesteps(num_inference_steps, strength) (the img2img
 * pipelines): init_timestep = min(steps x strength, steps), t_start =
 * int(max(steps - init_timestep, 0)) in double; the loop runs steps t_start..
 * steps-1 (steps - t_start of them). 0 and *t_start, or DITD_EINVAL for a
 * strength outside (0, 1] or fewer than one step left (naming both). */
int ditd_pipeline_strength_start(int steps, double strength, int *t_start);

/* Whether a sample's adapter set can run on this pipeline's model: 0, or
 * DITD_EUNSUPPORTED (the model takes no adapters: its reason) /
 * DITD_EINVAL (too many, an adapter uploaded for another model, a scale
 * not finite). ditd_pipeline_generate checks every sample's. */
int ditd_pipeline_check_loras(const ditd_pipeline *p, const ditd_lora_set *s);

/* Step caching (engine/pipeline/step_cache.h) for the batches that follow:
 * cfg is copied (NULL or method none: every step computes); checked as
 * ditd_cache_config_check, DITD_EINVAL otherwise (the cache stays as it
 * was). Whether the model can run it (block hooks, TaylorSeer's module
 * names) is checked by ditd_pipeline_generate, before any step. Between
 * batches; not collective (every rank of a group sets the same). */
int ditd_pipeline_set_cache(ditd_pipeline *p, const ditd_cache_config *cfg);

/* What step caching did for sample i of the last ditd_pipeline_generate
 * (zeros without a cache): steps skipped, block evaluations skipped. In a
 * group every rank has the same counts (a cfg half without rows advances
 * the states as the other half's forward does). */
void ditd_pipeline_cache_stats(const ditd_pipeline *p, int i, ditd_cache_stats *out);

/* Latents (C, H, W) in [-1, 1] to interleaved 8-bit pixels (H, W, C):
 * round((x / 2 + 0.5) clamped to [0, 1] x 255), ties to even, as
 * DiTPipeline + numpy_to_pil. */
void ditd_pipeline_to_pixels(const float *x, int C, int H, int W, uint8_t *out);

#endif
