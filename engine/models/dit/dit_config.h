/* The typed configuration of a Diffusers DiTTransformer2DModel, read once from
 * transformer/config.json. JSON stops here: the model sees only this struct.
 *
 * Supported: norm_type "ada_norm_zero", activation_fn "gelu-approximate",
 * norm_elementwise_affine false (what every DiT checkpoint uses). Anything
 * else is refused with a detail naming the key and the value.
 */
#ifndef DITD_ENGINE_DIT_CONFIG_H
#define DITD_ENGINE_DIT_CONFIG_H

#include "engine/backend/backend.h"
#include "engine/models/denoiser.h"

typedef struct ditd_dit_config {
    int in_channels;          /* C */
    int out_channels;         /* Co: C, or 2C with learned sigma */
    int sample_size;          /* S: latent side the model was trained at */
    int patch_size;           /* p */
    int num_layers;
    int num_heads;            /* H */
    int head_dim;             /* Dh */
    int num_embeds_ada_norm;  /* K classes; K is the null class id */
    int attention_bias;       /* to_q/to_k/to_v have biases */
    float norm_eps;           /* eps of norm3 (the MLP's LayerNorm) */
    ditd_act activation;      /* of the MLP */
    /* derived */
    int inner_dim;            /* D = H * Dh */
    int ff_dim;               /* F = 4D */
    int learned_sigma;        /* out_channels == 2 * in_channels */
} ditd_dit_config;

/* Reads and checks transformer/config.json. Errors name the file and key. */
int ditd_dit_config_load(const char *path, ditd_dit_config *out);

/* The same over text in memory; `name` stands for the path in messages. */
int ditd_dit_config_parse(const char *text, size_t len, const char *name, ditd_dit_config *out);

/* Fills derived fields and checks the numbers (positive, D % 4 == 0 for the
 * 2-D sin-cos embedding, ...). Used by the loader and by `ditd bench` for
 * the named configs. */
int ditd_dit_config_finish(ditd_dit_config *c, const char *what);

/* The DiT paper's sizes (DiT-S/2, B/2, L/2, XL/2 and the /4, /8 patch
 * variants), with 1000 classes, learned sigma, 4 latent channels and the
 * given latent side. Name is case-insensitive, e.g. "DiT-XL/2". */
int ditd_dit_config_named(const char *name, int sample_size, ditd_dit_config *out);

/* The shapes the config gives the denoiser interface: latent C x S x S,
 * Co, H heads, N = (S/p)^2 tokens, class conditioning with K classes. */
void ditd_dit_config_shapes(const ditd_dit_config *c, ditd_denoiser_shapes *out);

/* Parameter count of the transformer. */
long long ditd_dit_config_params(const ditd_dit_config *c);

/* Multiply-add FLOPs (x2) of one forward for B samples at N tokens. */
double ditd_dit_config_flops(const ditd_dit_config *c, int B, int N);

#endif
