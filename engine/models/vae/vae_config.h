/* The typed configuration of a Diffusers AutoencoderKL, read once from
 * vae/config.json. JSON stops here: the VAE sees only this struct.
 *
 * Every key AutoencoderKL.__init__ accepts is read, with its defaults.
 * Supported: down blocks "DownEncoderBlock2D", up blocks "UpDecoderBlock2D"
 * (one per block_out_channels entry), act_fn "silu" (or its alias "swish").
 * Anything else is refused with a detail naming the key and the value.
 * Keys the class does not know are ignored, as Diffusers ignores them.
 */
#ifndef DITD_ENGINE_VAE_CONFIG_H
#define DITD_ENGINE_VAE_CONFIG_H

#include <stddef.h>

#define DITD_VAE_MAX_BLOCKS 8
#define DITD_VAE_MAX_LATENT 64 /* latent_channels at most */

typedef struct ditd_vae_config {
    int in_channels;             /* image channels (3) */
    int out_channels;            /* image channels out (3) */
    int latent_channels;         /* Cl: 4 (SD, DiT) or 16 (SD3, FLUX) */
    int n_blocks;                /* len(block_out_channels) */
    int block_out_channels[DITD_VAE_MAX_BLOCKS];
    int layers_per_block;        /* resnets per down block; the up blocks have one more */
    int norm_num_groups;
    int sample_size;             /* image side of a tile (tiled decode) */
    double scaling_factor;
    int has_shift_factor;
    double shift_factor;         /* SD3/FLUX; DiTPipeline ignores it */
    int n_latents_mean, n_latents_std; /* 0 or latent_channels */
    double latents_mean[DITD_VAE_MAX_LATENT], latents_std[DITD_VAE_MAX_LATENT];
    int force_upcast;            /* read; ditd computes in f32 anyway */
    int use_quant_conv;
    int use_post_quant_conv;
    int mid_block_add_attention;
} ditd_vae_config;

/* Reads and checks vae/config.json. Errors name the file and key. */
int ditd_vae_config_load(const char *path, ditd_vae_config *out);

/* The same over text in memory; `name` stands for the path in messages. */
int ditd_vae_config_parse(const char *text, size_t len, const char *name, ditd_vae_config *out);

/* Checks the numbers (positive, groups dividing every width, ...). */
int ditd_vae_config_finish(ditd_vae_config *c, const char *what);

/* Pixels per latent pixel along a side: 2^(n_blocks - 1), as the pipelines'
 * vae_scale_factor (never a fixed 8). */
int ditd_vae_config_scale_factor(const ditd_vae_config *c);

/* Latent side for an image side: the encoder's chain of floor halvings. */
int ditd_vae_latent_side(const ditd_vae_config *c, int image_side);

/* The published configs with their real sizes (weights random or loaded
 * elsewhere): "sd-vae-ft-ema" (SD 1.x/DiT, 4 latent channels) and
 * "flux-vae" (SD3/FLUX.1, 16 latent channels). Name case-insensitive. */
int ditd_vae_config_named(const char *name, ditd_vae_config *out);

/* Multiply-add FLOPs (x2) of one decode of an h x w latent (one image). */
double ditd_vae_config_decode_flops(const ditd_vae_config *c, int h, int w);

#endif
