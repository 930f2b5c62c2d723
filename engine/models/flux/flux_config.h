/* The typed configuration of a Diffusers FluxTransformer2DModel, read once
 * from transformer/config.json. JSON stops here: the model sees only this
 * struct.
 *
 * Every key of FluxTransformer2DModel.__init__ is read (patch_size,
 * in_channels, out_channels, num_layers, num_single_layers,
 * attention_head_dim, num_attention_heads, joint_attention_dim,
 * pooled_projection_dim, guidance_embeds, axes_dims_rope), with Diffusers'
 * defaults (FLUX.1-dev's sizes). Supported: patch_size 1 (every FLUX.1
 * checkpoint: the pipeline's 2x2 packing is the patchify), in_channels a
 * multiple of 4 (packed 2x2), out_channels = in_channels, three RoPE axes
 * summing to attention_head_dim. Anything else is refused naming the key
 * and the value.
 *
 * What it is not: no weights, no request sizes (the latent size and the
 * text length are the loader's, engine/models/flux/flux.h).
 */
#ifndef DITD_ENGINE_FLUX_CONFIG_H
#define DITD_ENGINE_FLUX_CONFIG_H

#include <stddef.h>

#define DITD_FLUX_AXES 3

typedef struct ditd_flux_config {
    int patch_size;           /* 1 */
    int in_channels;          /* packed channels: 4 x the latent's C (64 for FLUX.1) */
    int out_channels;         /* packed, = in_channels */
    int num_layers;           /* double-stream blocks */
    int num_single_layers;    /* single-stream blocks */
    int head_dim;             /* Dh = attention_head_dim */
    int num_heads;            /* H = num_attention_heads */
    int joint_attention_dim;  /* Dt: the T5 sequence embedding's width */
    int pooled_dim;           /* Dp: the CLIP pooled vector's width */
    int guidance_embeds;      /* FLUX.1-dev: guidance is an input of the model */
    int axes_dims[DITD_FLUX_AXES]; /* RoPE channels per id axis (sum = Dh) */
    /* derived */
    int inner_dim;            /* D = H * Dh */
    int mlp_dim;              /* F = 4D (FeedForward and the single blocks' proj_mlp) */
    int latent_channels;      /* C = in_channels / 4, what the pipeline sees */
} ditd_flux_config;

/* Reads and checks transformer/config.json. Errors name the file, key and
 * value. */
int ditd_flux_config_load(const char *path, ditd_flux_config *out);

/* The same over text in memory; `name` stands for the path in messages. */
int ditd_flux_config_parse(const char *text, size_t len, const char *name, ditd_flux_config *out);

/* Fills the derived fields and checks the numbers; `what` names the config. */
int ditd_flux_config_finish(ditd_flux_config *c, const char *what);

#endif
