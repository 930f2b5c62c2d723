/* Diffusers AutoencoderKLWan (Wan 2.1 and Wan 2.2): the video decoder
 * (latents -> frames) and encoder (frames -> the latent distribution).
 *
 * What this is: the model of diffusers.models.autoencoders.
 * autoencoder_kl_wan, with its parameter names, loaded from a vae/ folder
 * (config.json + safetensors in f32, f16 or bf16), computed op by op on a
 * backend (engine/backend/backend.h) the way Diffusers runs it: causal 3-D
 * convolutions with their feature cache (the last CACHE_T = 2 input frames
 * of every causal convolution carried from one chunk to the next), channel
 * RMS norms, the 2-D/3-D resamplers with their time convolutions, the
 * per-frame attention of the mid block, the chunked decode (the first
 * latent frame, then one latent frame at a time, each giving
 * scale_factor_temporal frames) and the chunked encode (the first frame,
 * then 4 at a time), Wan 2.2's residual blocks (AvgDown3D / DupUp3D
 * shortcuts) and its patchify / unpatchify (patch_size), the decoder's clamp
 * to [-1, 1].
 *
 * Tiled decode (Diffusers' enable_tiling) is an option (opts.tiling).
 *
 * The decode can run on the G ranks of a worker group at once, exactly
 * (opts.comm): bands of rows with halo rows per 3x3 convolution, the
 * per-frame attention on the gathered frame; bit-identical to one rank.
 *
 * What it is not: a pipeline (WanPipeline's latents_mean / latents_std rule
 * is ditd_wan_vae_unscale below; pixels to bytes are the caller's), a tiled
 * or a parallel encoder: one rank encodes a clip.
 *
 * Memory: every activation and every feature cache is planned at load for
 * the largest latent (opts.max_h x opts.max_w) and the largest video
 * (max_video_h x max_video_w), carved from one arena; decode and encode
 * allocate nothing, whatever the number of frames (the chunks reuse the
 * same buffers). Batches run one clip after another.
 *
 * Threads: one ditd_wan_vae belongs to one thread.
 */
#ifndef DITD_ENGINE_WAN_VAE_H
#define DITD_ENGINE_WAN_VAE_H

#include <stdint.h>

#include "engine/backend/backend.h"
#include "engine/parallel/comm.h"
#include "engine/models/vae/autoencoder_kl.h"
#include "engine/models/wan_vae/wan_vae_config.h"

typedef struct ditd_wan_vae ditd_wan_vae;

typedef struct ditd_wan_vae_opts {
    int max_h, max_w;             /* largest latent decoded (rows, columns); 0: no decoder */
    int max_video_h, max_video_w; /* largest video encoded (pixels); 0: no encoder */
    /* Diffusers' enable_tiling(tile_sample_min_height, ..._width,
     * tile_sample_stride_height, ..._width) (0: its defaults 256, 256, 192,
     * 192): a latent wider or taller than a tile (tile_sample_min //
     * scale_factor_spatial) is decoded as AutoencoderKLWan.tiled_decode
     * does, tile by tile (every frame of a tile, then the next), each
     * blended with the tile above and the one to the left and cropped to
     * the stride. Device buffers are planned for one tile; two rows of
     * decoded tiles of up to max_frames latent frames stay on the host. */
    int tiling;
    int tile_sample_min_h, tile_sample_min_w, tile_sample_stride_h, tile_sample_stride_w;
    int max_frames;
    /* The mid-block attention through scores in memory (attention_masked:
     * N x N floats per frame) for every head size, not only for heads
     * above the fused kernel's DITD_CPU_ATTN_MAX_DH (Wan 2.2's decoder, a
     * head of 1024): for tests of that path on small configs. */
    int gemm_attention;
    /* The group the decode runs on (borrowed; NULL or size 1: one rank).
     * Every rank of it calls ditd_wan_vae_decode with the same arguments;
     * each holds a band of rows (split at latent resolution in units of
     * row_unit rows), every 3x3 convolution exchanges one halo row with the
     * neighbours, the per-frame attention reads the whole frame (gathered),
     * the leader gathers the frames. Bit-identical to one rank's decode. */
    ditd_comm *comm;
    /* Latent rows per unit of the band split (and of every GEMM chunk);
     * 0: enough for about 512 columns (1..8). The decode's bits depend on
     * it, never on the group's size. */
    int row_unit;
} ditd_wan_vae_opts;

/* Loads vae/ (config.json and the weights) for `ops` (the CPU backend with
 * f32 weights: DITD_EUNSUPPORTED elsewhere, naming the backend). Owned:
 * ditd_wan_vae_free. Errors name the file, the key or the tensor. */
int ditd_wan_vae_load(const char *dir, const ditd_backend_ops *ops, const ditd_wan_vae_opts *opts,
                      ditd_wan_vae **out);
void ditd_wan_vae_free(ditd_wan_vae *v);

/* Borrowed. */
const ditd_wan_vae_config *ditd_wan_vae_config_of(const ditd_wan_vae *v);

/* Decodes B latents z (B, z_dim, T, h, w), host f32, as
 * AutoencoderKLWan.decode (post_quant_conv, the chunked decoder,
 * unpatchify, clamp): frames (B, C, F, h s, w s), host f32, with
 * F = 1 + scale_factor_temporal (T - 1), s the spatial scale factor and C
 * the pixel channels (out_channels / patch_size^2). h <= max_h, w <= max_w,
 * any T >= 1. In a group: collective; z is read on every rank, frames
 * written on the leader (group rank 0) only (others may pass NULL). */
int ditd_wan_vae_decode(ditd_wan_vae *v, const float *z, int B, int T, int h, int w,
                        float *frames);

/* Encodes B videos x (B, C, F, H, W), host f32 in [-1, 1], as
 * AutoencoderKLWan.encode (patchify, the chunked encoder, quant_conv):
 * mean (B, z_dim, T, h, w) of the latent distribution with T =
 * ditd_wan_vae_encode_frames(F) (frames past the last whole chunk of 4 are
 * dropped, as Diffusers drops them) and h, w from ditd_wan_vae_latent_side; when sample != NULL a draw
 * mean + exp(logvar / 2) n, logvar clamped to [-30, 20], n clip b's
 * ditd_philox_normal(seed, b, 0, z_dim T h w). H <= max_video_h,
 * W <= max_video_w; a residual VAE needs H and W multiples of the scale
 * factor (Diffusers' AvgDown3D cannot take others). */
int ditd_wan_vae_encode(ditd_wan_vae *v, const float *x, int B, int F, int H, int W,
                        uint64_t seed, float *mean, float *sample);

/* ditd_wan_vae_encode_frames, ditd_wan_vae_latent_side: wan_vae_config.h */

/* WanPipeline's rule before decoding, in float32 as it computes it:
 * latents = latents / (1 / std[c]) + mean[c] (the reciprocal a float32
 * tensor), in place over (B, z_dim, T, h, w) with n_per_channel = T h w. */
void ditd_wan_vae_unscale(const ditd_wan_vae_config *c, float *latents, int B,
                          size_t n_per_channel);
/* The inverse WanImageToVideoPipeline applies to encoded latents:
 * latents = (latents - mean[c]) * (1 / std[c]). */
void ditd_wan_vae_scale(const ditd_wan_vae_config *c, float *latents, int B, size_t n_per_channel);

/* A video VAE's entry points (ditd_vae_family.video), the functions above. */
typedef struct ditd_video_vae_family {
    int (*config_load)(const char *path, ditd_wan_vae_config *out);
    int (*load)(const char *dir, const ditd_backend_ops *ops, const ditd_wan_vae_opts *opts,
                ditd_wan_vae **out);
    int (*decode)(ditd_wan_vae *v, const float *z, int B, int T, int h, int w, float *frames);
    int (*encode)(ditd_wan_vae *v, const float *x, int B, int F, int H, int W, uint64_t seed,
                  float *mean, float *sample);
    void (*free)(ditd_wan_vae *v);
} ditd_video_vae_family;

/* The VAE table for vae/config.json's "AutoencoderKLWan" (registry.c):
 * config_load gives the image-side summary the model folder checks
 * (ditd_wan_vae_config_summary); load (the image VAE's ditd_vae) is refused
 * with a message naming the video entry points; .video holds them. */
extern const ditd_vae_family ditd_autoencoder_kl_wan_family;

#endif
