/* The typed configuration of a Diffusers AutoencoderKLWan (Wan 2.1 and 2.2),
 * read once from vae/config.json. JSON stops here: the VAE sees only this
 * struct.
 *
 * Every key AutoencoderKLWan.__init__ accepts is read, with its defaults:
 * base_dim, decoder_base_dim, z_dim, dim_mult, num_res_blocks, attn_scales,
 * temperal_downsample, dropout, latents_mean, latents_std, is_residual,
 * in_channels, out_channels, patch_size, scale_factor_temporal,
 * scale_factor_spatial. Refused, naming the key and the value: a non-empty
 * attn_scales (no published Wan VAE has encoder attention; ditd does not
 * build it), more than two temporal downsamples (Diffusers' chunks of 4
 * frames cannot take them), a temperal_downsample whose length is not
 * len(dim_mult) - 1, channels that patch_size or the residual shortcuts
 * cannot divide, scale factors that disagree with the network they name.
 * dropout is read and ignored (inference). Keys the class does not know
 * are ignored, as Diffusers ignores them.
 */
#ifndef DITD_ENGINE_WAN_VAE_CONFIG_H
#define DITD_ENGINE_WAN_VAE_CONFIG_H

#include <stddef.h>

#include "engine/models/vae/vae_config.h"

#define DITD_WAN_VAE_MAX_BLOCKS 6
#define DITD_WAN_VAE_MAX_Z 64

typedef struct ditd_wan_vae_config {
    int base_dim;                 /* encoder width unit */
    int decoder_base_dim;         /* decoder width unit (base_dim when null) */
    int z_dim;                    /* latent channels: 16 (Wan 2.1), 48 (Wan 2.2) */
    int n_mult;                   /* len(dim_mult) */
    int dim_mult[DITD_WAN_VAE_MAX_BLOCKS];
    int num_res_blocks;
    int temperal_downsample[DITD_WAN_VAE_MAX_BLOCKS]; /* n_mult - 1 entries */
    double dropout;               /* read; inference ignores it */
    int n_latents_mean, n_latents_std; /* z_dim each (the class defaults when absent) */
    double latents_mean[DITD_WAN_VAE_MAX_Z], latents_std[DITD_WAN_VAE_MAX_Z];
    int is_residual;              /* Wan 2.2: residual down/up blocks */
    int in_channels, out_channels; /* after patchify (12 for Wan 2.2) */
    int patch_size;               /* 1 when null */
    int scale_factor_temporal, scale_factor_spatial;
} ditd_wan_vae_config;

/* Reads and checks vae/config.json. Errors name the file and key. */
int ditd_wan_vae_config_load(const char *path, ditd_wan_vae_config *out);

/* The same over text in memory; `name` stands for the path in messages. */
int ditd_wan_vae_config_parse(const char *text, size_t len, const char *name,
                              ditd_wan_vae_config *out);

/* Temporal downsamples (0..2): frames per latent frame after the first. */
int ditd_wan_vae_config_time_factor(const ditd_wan_vae_config *c);

/* Latent frames of an encoded video of F frames: 1 + ((F - 1) / 4)
 * (4 / scale_factor_temporal), the first frame then whole chunks of 4. */
int ditd_wan_vae_encode_frames(const ditd_wan_vae_config *c, int F);

/* Latent side of a video side (the encoder's floor halvings after patchify). */
int ditd_wan_vae_latent_side(const ditd_wan_vae_config *c, int side);
/* Pixels per latent pixel along a side: 2^(n_mult - 1) * patch_size. */
int ditd_wan_vae_config_scale_factor(const ditd_wan_vae_config *c);
/* Video frames of T latent frames: 1 + time_factor (T - 1). */
int ditd_wan_vae_config_frames(const ditd_wan_vae_config *c, int T);

/* The image-side summary the model folder reads for every VAE class
 * (engine/models/model.c): latent_channels = z_dim, in/out_channels the
 * pixel channels (in_channels / patch^2), n_blocks with 2^(n_blocks - 1)
 * the spatial scale factor, block_out_channels the decoder's widths from
 * the bottom (so the numbers are the network's), latents_mean/std, the
 * scaling_factor 1. This is what the ditd_vae_family table's config_load
 * gives for "AutoencoderKLWan". */
int ditd_wan_vae_config_summary(const char *path, ditd_vae_config *out);

#endif
