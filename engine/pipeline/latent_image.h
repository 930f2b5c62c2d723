/* The last lines of a latent pipeline: latents -> VAE decode -> 8-bit pixels,
 * as Diffusers' DiTPipeline writes them:
 *   latents = 1 / vae.config.scaling_factor * latents   (shift_factor ignored)
 *   samples = vae.decode(latents).sample
 *   samples = (samples / 2 + 0.5).clamp(0, 1)           (float32)
 *   uint8   = (samples * 255).round()                    (half to even)
 * That is DiTPipeline's unscale. Each pipeline keeps its own (the
 * ditd_latent_rule of its row in the pipeline table,
 * engine/models/pipeline_class.h): FluxPipeline and StableDiffusion3Pipeline
 * unscale as (latents / scaling_factor) + shift_factor; the image mapping
 * after the decode is the same for all (VaeImageProcessor's).
 *
 * What it is not: the VAE (engine/models/vae/autoencoder_kl.h) or the
 * sampling loop (engine/pipeline/pipeline.h). Buffers are planned at _new.
 */
#ifndef DITD_ENGINE_LATENT_IMAGE_H
#define DITD_ENGINE_LATENT_IMAGE_H

#include <stdint.h>

#include "engine/backend/backend.h"
#include "engine/models/model.h"
#include "engine/models/vae/autoencoder_kl.h"
#include "engine/parallel/comm.h"

typedef struct ditd_latent_image {
    ditd_latent_rule rule;  /* the pipeline row's (ditd_latent_rule: engine/models/pipeline_class.h) */
    ditd_vae *vae;          /* owned */
    int Cl, h, w;           /* latent channels, rows, columns */
    int Co, H, W;           /* image channels, rows, columns */
    int max_h, max_w;       /* the largest latent the VAE and buffers are planned for */
    char dir[DITD_MODEL_PATH_MAX + 8]; /* vae/, for a re-plan */
    const struct ditd_vae_family *family;
    const ditd_backend_ops *ops;
    ditd_comm *group;
    int tiling;
    int img2img;            /* the row takes input images (its img2img, whose latents
                             * are (z - shift_factor) x scaling_factor) */
    int encoder;            /* the VAE's encoder is planned for H x W too
                             * (ditd_latent_image_enable_encode: off until then, so a
                             * model that only generates carries no encoder buffers) */
    float *z;               /* one latent, unscaled (host) */
    float *img;             /* one decoded image (host; the leader's) */
} ditd_latent_image;

/* Loads info->dir/vae for the model's latent size. group (borrowed, NULL:
 * one rank) is the worker group the decode runs on; tiling: Diffusers'
 * enable_tiling(). Owned: ditd_latent_image_free. */
int ditd_latent_image_new(const ditd_model_info *info, const ditd_backend_ops *ops,
                          ditd_comm *group, int tiling, ditd_latent_image **out);
void ditd_latent_image_free(ditd_latent_image *li);

/* Decodes latents of h x w from now on (a model that takes any size):
 * within the planned largest size nothing is loaded; a larger one reloads
 * the VAE planned for it. Between batches; every rank of the group calls it
 * with the same size. 0, or the load's error (the old size stays). */
int ditd_latent_image_set_size(ditd_latent_image *li, int h, int w);

/* Decodes n latents (n, Cl, h, w), host f32, into pixels (n, H, W, Co)
 * interleaved 8-bit on the leader (others may pass NULL). active: n flags
 * (NULL: all); skipped samples leave their pixels untouched. Collective over
 * the group: every rank calls it with the same latents and flags. */
int ditd_latent_image_run(ditd_latent_image *li, const float *latents, int n,
                          const uint8_t *active, uint8_t *pixels);

/* The same under another unscale rule than the folder row's: the rule of
 * the row the samples followed (ditd_pipeline_class_edit_row: the SD3
 * inpainting row decodes latents / scaling_factor). DITD_LATENT_RULE_SHIFTED
 * or _DIT; another is DITD_EUNSUPPORTED. */
int ditd_latent_image_run_as(ditd_latent_image *li, ditd_latent_rule rule, const float *latents,
                             int n, const uint8_t *active, uint8_t *pixels);

/* Plans the VAE's encoder too (a reload of vae/ at the planned size; later
 * re-plans keep it): 0, DITD_EUNSUPPORTED for a row without img2img, or the
 * load's error (the decoder stays as it was). ditd_latent_image_encode calls
 * it; call it first to pay the load up front. Not collective. */
int ditd_latent_image_enable_encode(ditd_latent_image *li);

/* The noise stream of the VAE's posterior draw in an edit: image latents are
 * latent_dist.sample() with n = ditd_philox_normal(seed, this, j C h w, C h w)
 * for input image j of the request (Diffusers encodes the request's k images
 * as one batch, once, and repeats them for num_images_per_prompt: one draw
 * of (k, C, h, w)); no output index reaches it. */
#define DITD_LATENT_POSTERIOR_STREAM (UINT64_C(1) << 63)

/* The input side of an img2img pipeline, as FluxImg2ImgPipeline does it for
 * an image already at the target size (no resampling: VaeImageProcessor's
 * resize is the identity then): rgb (H, W, Co) interleaved 8-bit, H x W the
 * current image size (li->H x li->W, else DITD_EINVAL naming both), to
 * x = 2 (u / 255) - 1 in float32 (pil_to_numpy, normalize), the VAE's
 * latent_dist.sample() (posterior noise from DITD_LATENT_POSTERIOR_STREAM
 * under seed), then (z - shift_factor) x scaling_factor: latents (Cl, h, w)
 * host f32, what ditd_gen_sample.image_latents takes. Needs a model whose row
 * has img2img (DITD_EUNSUPPORTED otherwise); the first call plans the encoder
 * (ditd_latent_image_enable_encode). Collective over the group (the
 * parallel encode, autoencoder_kl.h): every rank calls it with the same
 * image and seed and gets the same latents, bit-identical to one rank's. */
int ditd_latent_image_encode(ditd_latent_image *li, const uint8_t *rgb, int H, int W,
                             uint64_t seed, float *latents);
/* The same for input image j (0-based) of a request of several: its
 * posterior noise is elements [j C h w, (j + 1) C h w) of the request's one
 * draw (ditd_latent_image_encode is j = 0). */
int ditd_latent_image_encode_nth(ditd_latent_image *li, const uint8_t *rgb, int H, int W,
                                 uint64_t seed, int j, float *latents);

/* The reference side of FluxKontextPipeline: rgb (H, W, Co) interleaved
 * 8-bit at the size the reference is brought to (multiples of the VAE's
 * scale factor; the decode size may differ: the VAE is re-planned for the
 * larger one), x = 2 (u / 255) - 1 in float32, the VAE's latent_dist.mode()
 * (retrieve_latents with sample_mode="argmax": the mean, no draw), then
 * (z - shift_factor) x scaling_factor: latents (Cl, H / f, W / f) host f32,
 * what ditd_gen_sample.ref_latents takes. Needs a row with img2img or
 * reference. In a group: collective, as ditd_vae_encode (every rank calls it
 * with the same image and gets the same latents). */
int ditd_latent_image_encode_mode(ditd_latent_image *li, const uint8_t *rgb, int H, int W,
                                  float *latents);

/* The mask side of an inpainting pipeline, as FluxInpaintPipeline's
 * mask_processor (VaeImageProcessor: do_convert_grayscale, do_binarize, no
 * normalize) and prepare_mask_latents do it for a mask already at the
 * target size: gray (H, W) 8-bit luma (PIL's convert("L"): white repainted,
 * black kept) to m = u / 255 >= 0.5 ? 1 : 0 (float32), then
 * torch.nn.functional.interpolate(mode "nearest") to the latent grid
 * h x w: source row floor(y x (H / h)) in float32, clamped. out: (h, w)
 * f32 0/1, what ditd_gen_sample.mask_latents takes (the pipeline applies it
 * to every channel). Pure; DITD_EINVAL on sizes that do not divide down. */
int ditd_latent_mask_from_gray(const uint8_t *gray, int H, int W, int h, int w, float *out);

#endif
