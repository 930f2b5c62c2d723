/* WanImageToVideoPipeline's image inputs: an input image (and optionally a
 * last image, FLF2V) -> the condition the transformer reads after the
 * latents on channels, and the image encoder's embeddings.
 *
 * As Diffusers 0.42 computes them (pipelines/wan/pipeline_wan_i2v.py):
 *   - video_processor.preprocess(image, height, width): PIL's lanczos
 *     resize to the clip's W x H when the size differs (image_resize.h,
 *     bit-exact), x / 255 in float32, 2x - 1;
 *   - prepare_latents: the video [image, zeros x (N - 1)] (FLF2V: [image,
 *     zeros x (N - 2), last]) through AutoencoderKLWan.encode, the mean
 *     (sample_mode "argmax"), (z - latents_mean) x (1 / latents_std); the
 *     mask: 1 on the first pixel frame (and the last one for FLF2V),
 *     the first repeated scale_factor_temporal times, viewed as
 *     (scale_factor_temporal, T, h, w); the condition is [mask; latents];
 *   - encode_image (a transformer with an image branch): CLIPImageProcessor
 *     on the image as given, CLIPVisionModel's hidden_states[-2]
 *     (engine/vision/clip_vision.h); FLF2V: both images, their tokens one
 *     after the other.
 * With expand_timesteps (Wan 2.2 TI2V-5B) the condition is the image's
 * scaled latents alone, (z_dim, 1, h, w): the pipeline puts them in the
 * first latent frame of every forward and of the result, that frame's
 * timestep 0 (ditd_cond.t_frames), as the pipeline's first_frame_mask does.
 * Memory: the VAE's encoder and the CLIP tower are planned at load for
 * clips up to max_w x max_h; a clip's buffers grow between calls.
 * What it is not: the denoising loop (the pipeline reads what this makes
 * through ditd_gen_sample.video_cond / image_embeds), an image decoder.
 */
#ifndef DITD_ENGINE_IMAGE_COND_H
#define DITD_ENGINE_IMAGE_COND_H

#include <stddef.h>
#include <stdint.h>

#include "engine/backend/backend.h"
#include "engine/models/model.h"

typedef struct ditd_image_cond ditd_image_cond;

/* For a folder whose row has image_to_video: loads vae/'s encoder for
 * clips up to max_w x max_h pixels, and image_encoder/ + image_processor/
 * when the transformer has an image branch. DITD_EUNSUPPORTED on another
 * row. Owned: ditd_image_cond_free. */
int ditd_image_cond_new(const ditd_model_info *info, const ditd_backend_ops *ops, int max_w,
                        int max_h, ditd_image_cond **out);
void ditd_image_cond_free(ditd_image_cond *ic);

/* Values of the condition of a clip of `frames` pixel frames at W x H:
 * cond_channels x latent frames x (H / s) x (W / s). */
size_t ditd_image_cond_numel(const ditd_image_cond *ic, int frames, int W, int H);
/* Values of the embeddings (Li x Di; 0 without an image branch). */
size_t ditd_image_cond_embeds_numel(const ditd_image_cond *ic);

/* rgb (ih, iw, 3) bytes (and last (lh, lw, 3) or NULL) -> cond
 * (ditd_image_cond_numel) and, with an image branch, embeds
 * (ditd_image_cond_embeds_numel; NULL otherwise), host f32. frames is the
 * rounded count (1 + k scale_factor_temporal; at least 2 with last).
 * 0, DITD_EINVAL naming the size or count, or the models' errors. */
int ditd_image_cond_run(ditd_image_cond *ic, const uint8_t *rgb, int iw, int ih,
                        const uint8_t *last, int lw, int lh, int frames, int W, int H,
                        float *cond, float *embeds);

#endif
