/* The typed configuration of a Diffusers SD3Transformer2DModel (Stable
 * Diffusion 3 and 3.5), read once from transformer/config.json. JSON stops
 * here: the model sees only this struct.
 *
 * Every key of SD3Transformer2DModel.__init__ is read (sample_size,
 * patch_size, in_channels, num_layers, attention_head_dim,
 * num_attention_heads, joint_attention_dim, caption_projection_dim,
 * pooled_projection_dim, out_channels, pos_embed_max_size,
 * dual_attention_layers, qk_norm), with Diffusers' defaults (SD3-medium's
 * sizes). Supported: qk_norm null or "rms_norm" (SD3.5); dual_attention_layers
 * a list of block indices in [0, num_layers) (SD3.5-medium's MMDiT-X);
 * pos_embed_max_size set (every SD3 checkpoint: the positional table is
 * cropped to the latent's patch grid); caption_projection_dim equal to the
 * inner dimension (num_attention_heads * attention_head_dim), which the
 * blocks need (Diffusers would fail at the first block otherwise). Anything
 * else is refused naming the key and the value.
 *
 * What it is not: no weights, no request sizes (the latent size and the
 * text length are the loader's, engine/models/sd3/sd3.h).
 */
#ifndef DITD_ENGINE_SD3_CONFIG_H
#define DITD_ENGINE_SD3_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#define DITD_SD3_MAX_LAYERS 1000

typedef enum ditd_sd3_qk_norm {
    DITD_SD3_QK_NONE = 0, /* qk_norm null (SD3) */
    DITD_SD3_QK_RMS,      /* "rms_norm": per-head RMSNorm of q, k, added q, added k (SD3.5) */
} ditd_sd3_qk_norm;

typedef struct ditd_sd3_config {
    int sample_size;          /* the training latent size: the default size, and
                                 the positional table's base_size = sample_size / p */
    int patch_size;           /* p */
    int in_channels;          /* C of the latent */
    int out_channels;         /* Co (null: in_channels) */
    int num_layers;           /* joint blocks; the last is context_pre_only */
    int head_dim;             /* Dh = attention_head_dim */
    int num_heads;            /* H = num_attention_heads */
    int joint_attention_dim;  /* Dt: the text sequence's width (CLIP-L|G + T5) */
    int caption_projection_dim; /* context_embedder's output, = D */
    int pooled_dim;           /* Dp: the pooled CLIP vectors' width */
    int pos_embed_max_size;   /* M: the positional table is an M x M patch grid */
    ditd_sd3_qk_norm qk_norm;
    uint8_t dual[DITD_SD3_MAX_LAYERS]; /* 1: block l has attn2 (dual_attention_layers) */
    int n_dual;               /* blocks with attn2 */
    /* derived */
    int inner_dim;            /* D = H * Dh */
    int mlp_dim;              /* F = 4D (FeedForward, gelu-tanh) */
} ditd_sd3_config;

/* Reads and checks transformer/config.json. Errors name the file, key and
 * value. */
int ditd_sd3_config_load(const char *path, ditd_sd3_config *out);

/* The same over text in memory; `name` stands for the path in messages. */
int ditd_sd3_config_parse(const char *text, size_t len, const char *name, ditd_sd3_config *out);

/* Fills the derived fields and checks the numbers; `what` names the config. */
int ditd_sd3_config_finish(ditd_sd3_config *c, const char *what);

/* "none" or "rms_norm" (the config's null is "none"). */
const char *ditd_sd3_qk_norm_name(ditd_sd3_qk_norm q);
/* 0, or DITD_EUNSUPPORTED naming s and the accepted names. */
int ditd_sd3_qk_norm_from_str(const char *s, ditd_sd3_qk_norm *out);

#endif
