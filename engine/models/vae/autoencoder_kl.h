/* Diffusers AutoencoderKL: the decoder (latents -> pixels) and the encoder
 * (pixels -> the latent distribution's mean, and a Philox-sampled draw).
 *
 * What this is: the model of diffusers.models.autoencoders.AutoencoderKL,
 * with its parameter names, loaded from a vae/ folder (config.json +
 * safetensors in f32, f16 or bf16), computed op by op on a backend
 * (engine/backend/backend.h). The decode can run on the G ranks of a worker
 * group at once, exactly: each rank holds a band of rows (split at latent
 * resolution), 3x3 convolutions exchange one halo row with the neighbours,
 * GroupNorm statistics are summed over the group in float64, the mid-block
 * attention reads the keys and values of the whole image, and the leader
 * gathers the final rows. The result is bit-identical to the one-rank decode.
 * The encode runs on the group the same way (its stride-2 downsamples take
 * the next band's first row as their bottom pad), every rank getting the
 * latents.
 *
 * What it is not: a pipeline. Scaling the latents (DiTPipeline divides by
 * scaling_factor; SD3/FLUX add shift_factor back after that) and turning pixels
 * into bytes are the caller's rule; see ditd_vae_unscale_dit().
 *
 * Memory: every activation is planned at load for the largest latent
 * (max_h x max_w, or one tile when tiling) and carved from one arena;
 * decode and encode allocate nothing. Batches are decoded one image after
 * another in the same buffers.
 *
 * Threads: one ditd_vae belongs to one thread (and its group's comm).
 */
#ifndef DITD_ENGINE_AUTOENCODER_KL_H
#define DITD_ENGINE_AUTOENCODER_KL_H

#include <stdint.h>

#include "engine/backend/backend.h"
#include "engine/models/vae/vae_config.h"
#include "engine/parallel/comm.h"

typedef struct ditd_vae ditd_vae;

typedef struct ditd_vae_opts {
    int max_h, max_w;          /* largest latent decoded (rows, columns) */
    int max_image_h, max_image_w; /* largest image encoded; 0: no encoder buffers */
    /* Diffusers' enable_tiling(): latents larger than one tile
     * (sample_size / scale factor) are decoded tile by tile, overlapping by
     * 1/4 and blended, as AutoencoderKL.tiled_decode; buffers are planned
     * for one tile. */
    int tiling;
    /* The group the decode runs on (borrowed; NULL or size 1: one rank).
     * Every rank of it calls ditd_vae_decode with the same arguments. */
    ditd_comm *comm;
    /* Latent rows per unit of the band split (and of every GEMM chunk);
     * 0: enough for about 512 columns (1..8). The decode's bits depend on
     * it, never on G. */
    int row_unit;
} ditd_vae_opts;

/* A VAE family as the registry (engine/models/registry.h) hands it out for
 * vae/config.json's _class_name: its config reader and loader. The decode
 * and encode below are the same for every class this table stands for.
 * Built in: ditd_autoencoder_kl_family ("AutoencoderKL"). */
struct ditd_video_vae_family; /* engine/models/wan_vae/wan_vae.h */
typedef struct ditd_vae_family {
    const char *class_name;
    int (*config_load)(const char *path, ditd_vae_config *out);
    int (*load)(const char *dir, const ditd_backend_ops *ops, const struct ditd_vae_opts *opts,
                ditd_vae **out);
    /* A video VAE (AutoencoderKLWan): its own config, load, decode and
     * encode over frames; config_load above then gives the image-side
     * summary (latent channels, pixel channels, scale factor) and load
     * refuses. NULL for an image VAE. */
    const struct ditd_video_vae_family *video;
} ditd_vae_family;
extern const ditd_vae_family ditd_autoencoder_kl_family;

/* Loads vae/ (config.json and the weights) for `ops`. Owned: ditd_vae_free.
 * DITD_EUNSUPPORTED when the backend lacks the image ops; errors name the
 * file, the key or the tensor. */
int ditd_vae_load(const char *dir, const ditd_backend_ops *ops, const ditd_vae_opts *opts,
                  ditd_vae **out);

/* The same with random weights for a config (benchmarks): each weight
 * N(0, 1/fan_in) from Philox(seed), norms gamma 1 + N(0, 0.1^2), biases
 * N(0, 0.1^2). */
int ditd_vae_new_random(const ditd_vae_config *cfg, const ditd_backend_ops *ops,
                        const ditd_vae_opts *opts, uint64_t seed, ditd_vae **out);

void ditd_vae_free(ditd_vae *v);

/* Borrowed. */
const ditd_vae_config *ditd_vae_config_of(const ditd_vae *v);

/* Decodes B latents z (B, Cl, h, w), host f32, exactly as AutoencoderKL.decode
 * (post_quant_conv, decoder; tiled when opts.tiling and the latent is larger
 * than a tile): pixels (B, out_channels, h*f, w*f), host f32, f the scale
 * factor. In a group: collective; z is read on every rank, pixels written on
 * the leader (group rank 0) only (others may pass NULL). h <= max_h,
 * w <= max_w (any size when tiling), and h >= the group size. */
int ditd_vae_decode(ditd_vae *v, const float *z, int B, int h, int w, float *pixels);

/* Encodes B images x (B, in_channels, H, W), host f32 in [-1, 1], as
 * AutoencoderKL.encode: when mean != NULL the latent distribution's mean
 * (B, Cl, h, w) (h = H / f rounded down at each downsample; it is also
 * latent_dist.mode(), the "argmax" Kontext takes), and when sample != NULL
 * a draw mean + exp(logvar / 2) * n, logvar clamped to [-30, 20], n image
 * b's ditd_philox_normal(seed, b, 0, Cl*h*w). Needs opts.max_image_h/w at
 * load. In a group: collective, exactly as the decode is (rows split at
 * latent resolution, halos, GroupNorm statistics summed in float64 in image
 * order, the mid-block attention over the whole latent): every rank calls it
 * with the same arguments, reads x, and gets the same mean and draw,
 * bit-identical to one rank's. Every downsample needs 2 x 2 pixels or more. */
int ditd_vae_encode(ditd_vae *v, const float *x, int B, int H, int W, uint64_t seed, float *mean,
                    float *sample);

/* The same with the draw of image b from the noise stream `stream + b`,
 * starting at element `offset`: n = ditd_philox_normal(seed, stream + b,
 * offset, Cl*h*w) (ditd_vae_encode is stream 0, offset 0). The img2img
 * pipelines draw from a stream of their own (DITD_LATENT_POSTERIOR_STREAM,
 * engine/pipeline/latent_image.h) so that the posterior draw is not the
 * initial noise of any image; the offset places input image j of a request
 * in the one batched draw (j x Cl h w, as torch's latent_dist.sample of a
 * batch of images). */
int ditd_vae_encode_stream(ditd_vae *v, const float *x, int B, int H, int W, uint64_t seed,
                           uint64_t stream, uint64_t offset, float *mean, float *sample);


/* DiTPipeline's rule before decoding: z = (1 / scaling_factor) * latents, in
 * float32, in place (n floats). shift_factor is not applied (DiTPipeline
 * ignores it; the SD3/FLUX pipelines add it after unscaling, below). */
void ditd_vae_unscale_dit(const ditd_vae_config *c, float *latents, size_t n);
/* FluxPipeline's and StableDiffusion3Pipeline's rule:
 * latents = latents / scaling_factor + shift_factor (float32, the factors
 * rounded to float first, as a float32 tensor op with a Python float does;
 * no shift_factor: + 0). */
void ditd_vae_unscale_shifted(const ditd_vae_config *c, float *latents, size_t n);
/* Its inverse, as the img2img pipelines' _encode_vae_image:
 * latents = (latents - shift_factor) x scaling_factor (float32, the factors
 * rounded to float as above; no shift_factor: - 0). */
void ditd_vae_scale_shifted(const ditd_vae_config *c, float *latents, size_t n);

/* Statistics of the last decode or encode on this rank: milliseconds in
 * compute and in collectives (the comm's own counters hold calls and
 * bytes), and how many ranks the image was split over (1: whole on this
 * rank, as a latent smaller than the group is). */
typedef struct ditd_vae_stats {
    double compute_ms, comm_ms;
    int ranks;
} ditd_vae_stats;
ditd_vae_stats ditd_vae_last_stats(const ditd_vae *v);

#endif
