/* The tail of a video pipeline (WanPipeline): its unscale rule, the video
 * VAE's decode, 8-bit frames.
 *
 * What it is: for a model folder whose pipeline row unscales with
 * DITD_LATENT_RULE_MEAN_STD and whose vae/ is a video VAE (the family's
 * .video entry points: AutoencoderKLWan), the final latents (B, C, T, h, w)
 * -> latents x latents_std + latents_mean (ditd_wan_vae_unscale, as
 * WanPipeline computes it) -> the VAE's chunked decode -> frames
 * (B, F, H, W, 3) bytes, round((x / 2 + 0.5) clamped to [0, 1] x 255) ties
 * to even, as VideoProcessor.postprocess_video(output_type="np") then x 255
 * rounded.
 * What it is not: the image tail (latent_image.h), a video file writer.
 * On a group (ditd_latent_video_new_group) the VAE decodes on every rank,
 * each a band of rows (the Wan VAE's own split, bit-identical to one rank),
 * and the leader alone makes the frames.
 * Memory: the VAE is planned at load for max_h x max_w latents; the host
 * buffers grow on the first clip of a larger size (between batches).
 */
#ifndef DITD_ENGINE_LATENT_VIDEO_H
#define DITD_ENGINE_LATENT_VIDEO_H

#include <stddef.h>
#include <stdint.h>

#include "engine/backend/backend.h"
#include "engine/models/model.h"
#include "engine/parallel/comm.h"

typedef struct ditd_latent_video ditd_latent_video;

/* Loads info's vae/ for latents up to max_h x max_w (0: the folder's
 * default size). DITD_EUNSUPPORTED when the row's rule is not mean_std or
 * the VAE is not a video VAE, naming them. Owned: ditd_latent_video_free. */
int ditd_latent_video_new(const ditd_model_info *info, const ditd_backend_ops *ops, int max_h,
                          int max_w, ditd_latent_video **out);
/* The same for the G ranks of comm (borrowed; NULL or a group of one: one
 * rank): every rank calls ditd_latent_video_run with the same latents; out
 * is written on the group's rank 0 only (others may pass NULL). */
int ditd_latent_video_new_group(const ditd_model_info *info, const ditd_backend_ops *ops,
                                int max_h, int max_w, ditd_comm *comm, ditd_latent_video **out);
void ditd_latent_video_free(ditd_latent_video *lv);

/* Frames of a clip of T latent frames: 1 + scale_factor_temporal (T - 1). */
int ditd_latent_video_frames(const ditd_latent_video *lv, int T);
/* The spatial scale factor (pixels per latent row). */
int ditd_latent_video_scale(const ditd_latent_video *lv);

/* Decodes B clips of latents (B, C, T, h, w) (not changed) into out
 * (B, F, h s, w s, 3) bytes, F = ditd_latent_video_frames(T). */
int ditd_latent_video_run(ditd_latent_video *lv, const float *latents, int B, int T, int h, int w,
                          uint8_t *out);

#endif
