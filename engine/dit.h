/* Diffusers DiTTransformer2DModel (Peebles & Xie, adaLN-Zero), forward only.
 *
 * The model reads like the paper: patch embedding plus 2-D sin-cos positions,
 * num_layers blocks (adaLN-Zero modulation from timestep + class embedding,
 * self-attention, MLP, each gated into the residual), the final adaLN layer
 * and unpatchify. Parameter names and numerics follow Diffusers, so a
 * checkpoint Diffusers loads gives the same tensors here.
 *
 * What it is not: no sampler, no guidance, no file format knowledge beyond
 * asking the safetensors reader for named tensors.
 *
 * Memory: the weights and every activation buffer for max_batch samples at
 * the model's sample_size are planned and allocated once in ditd_dit_new();
 * ditd_dit_forward() allocates nothing.
 */
#ifndef DITD_ENGINE_DIT_H
#define DITD_ENGINE_DIT_H

#include <stdint.h>

#include "engine/backend.h"
#include "engine/dit_config.h"
#include "engine/tensor.h"

typedef struct ditd_dit_block {
    /* norm1.emb: CombinedTimestepLabelEmbeddings (each block has its own) */
    void *t1_w, *t1_b;   /* (D, E), (D)  timestep_embedder.linear_1 */
    void *t2_w, *t2_b;   /* (D, D), (D)  timestep_embedder.linear_2 */
    void *cls;           /* (K + 1, D)   class_embedder.embedding_table */
    void *ada_w, *ada_b; /* (6D, D), (6D) norm1.linear */
    void *qkv_w, *qkv_b; /* (3D, D), (3D) to_q, to_k, to_v fused by rows; b may be NULL */
    void *o_w, *o_b;     /* (D, D), (D)  attn1.to_out.0 */
    void *ff1_w, *ff1_b; /* (F, D), (F)  ff.net.0.proj */
    void *ff2_w, *ff2_b; /* (D, F), (D)  ff.net.2 */
} ditd_dit_block;

typedef struct ditd_dit {
    ditd_dit_config cfg;
    const ditd_backend_ops *ops;
    int max_batch;
    int gh, gw, N;          /* token grid and count at sample_size */

    ditd_arena weights;
    ditd_arena acts;

    void *patch_w, *patch_b; /* (D, C, p, p), (D) */
    void *pos;               /* (N, D) 2-D sin-cos, computed at load */
    void *out1_w, *out1_b;   /* (2D, D), (2D) proj_out_1 */
    void *out2_w, *out2_b;   /* (p*p*Co, D), (p*p*Co) proj_out_2 */
    ditd_dit_block *blocks;  /* num_layers */

    /* activations, for max_batch samples */
    void *h;        /* (B, N, D) residual stream */
    void *xn;       /* (B, N, D) normalized + modulated */
    void *qkv;      /* (B, N, 3D) */
    void *att;      /* (B, N, D) attention output (heads concatenated) */
    void *ff;       /* (B, N, F) */
    void *tfreq;    /* (B, E) sinusoidal timestep features */
    void *temb;     /* (B, D) */
    void *cond;     /* (B, D) conditioning of the current block */
    void *cond0;    /* (B, D) block 0's conditioning, reused by the final layer */
    void *mod;      /* (B, 6D) adaLN-Zero shift/scale/gate x 2 */
    void *scratch;  /* (B, N, C*p*p) im2col for the patch embedding */
    void *tok_out;  /* (B, N, p*p*Co) */
} ditd_dit;

/* Creates a model with weights from a safetensors checkpoint (a file, an
 * index, or a folder: see engine/safetensors.h). *out is owned: free with
 * ditd_dit_free(). Errors name the file, tensor and shapes. */
int ditd_dit_new(const ditd_dit_config *cfg, const ditd_backend_ops *ops, int max_batch,
                 const char *weights_path, ditd_dit **out);

/* Same, with random weights (std 0.02 normal, biases small) from the Philox
 * generator: what `ditd bench` runs for the named configs. */
int ditd_dit_new_random(const ditd_dit_config *cfg, const ditd_backend_ops *ops, int max_batch,
                        uint64_t seed, ditd_dit **out);

void ditd_dit_free(ditd_dit *m);

/* One forward: out (B, Co, S, S) = DiT(x (B, C, S, S), h_t (B), h_y (B)).
 * x and out are backend buffers (host memory on the CPU); h_t and h_y are host
 * arrays. Class ids are in [0, K], K being the null class. B <= max_batch.
 * Returns DITD_EINVAL for a class id out of range or a non-finite timestep. */
int ditd_dit_forward(ditd_dit *m, int B, const void *x, const float *h_t, const int64_t *h_y,
                     void *out);

/* Bytes held by the weight and activation arenas. */
size_t ditd_dit_weight_bytes(const ditd_dit *m);
size_t ditd_dit_act_bytes(const ditd_dit *m);

#endif
