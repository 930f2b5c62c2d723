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
 *
 * Parallel (ditd_dit_new_mesh): the ranks of a mesh (engine/parallel/mesh.h) run one
 * forward together, SPMD, and every rank ends with the whole output.
 *   - tp: Megatron. to_q/k/v and ff.net.0 split by output rows (heads, F
 *     columns), to_out.0 and ff.net.2 by input columns; one all-reduce after
 *     each of those two (the bias added once, on tp rank 0). Each rank reads
 *     only its slices from the safetensors mmap. Heads and F split as evenly
 *     as they go. Embeddings, adaLN and the final layer are replicated.
 *   - ring x ulysses (context parallel): the sequence (N tokens) is split
 *     over the R*U ranks after patch embedding (cp rank s = r*U + u holds
 *     tokens ditd_split(N, R*U, s)), every token-wise layer runs on local
 *     tokens, and the final layer's tokens are all-gathered before
 *     unpatchify (p*p*Co numbers per token rather than D).
 *     The attention itself (Ulysses, Ring allgather/p2p, USP) is the
 *     shared module engine/parallel/cp_attention.h, on this rank's H_loc
 *     heads.
 *   - with no mesh (or a mesh of one) the forward is exactly the
 *     single-rank one, op for op.
 */
#ifndef DITD_ENGINE_DIT_H
#define DITD_ENGINE_DIT_H

#include <stdint.h>

#include "engine/backend/backend.h"
#include "engine/models/dit/dit_config.h"
#include "engine/models/weight_list.h"
#include "engine/parallel/cp_attention.h"
#include "engine/parallel/mesh.h"
#include "engine/core/tensor.h"

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

/* One captured forward (backends with graphs): replayed while the batch
 * size, x and out are those it was captured with. */
typedef struct ditd_dit_graph {
    void *exec;       /* ops->graph_end's, NULL until captured */
    const void *x;
    void *out;
    int runs;         /* forwards of this B run op by op (the first warms up) */
} ditd_dit_graph;

typedef struct ditd_dit {
    ditd_denoiser base;     /* first: a ditd_dit is a denoiser (dit_denoiser.c) */
    ditd_dit_config cfg;
    const ditd_backend_ops *ops;
    int max_batch;
    int gh, gw, N;          /* token grid and count at sample_size */

    ditd_arena weights;
    ditd_arena acts;
    ditd_wl wl;             /* the weight list (engine/models/weight_list.h) */

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

    /* Parallel plan; with no mesh: one rank, n_loc = N, hc = H, fc = F.
     * Under a mesh the activations above hold local shapes: h, xn
     * (B, N_loc, D), qkv (B, N_loc, 3 H_loc Dh), att (B, N_loc, H_loc Dh),
     * ff (B, N_loc, F_loc). */
    const ditd_mesh *mesh;  /* borrowed; NULL = one rank */
    ditd_layout lay;
    int tp_rank;
    int hc, h0;             /* H_loc heads of this tp rank, from head h0 */
    int fc, f0;             /* F_loc MLP columns of this tp rank */
    int n_loc, tok0;        /* N_loc tokens of this cp rank, from token tok0 */
    ditd_cp_attention *cpa; /* the attention over the split sequence (engine/parallel) */
    const int *tok_cnt, *tok_off; /* (R*U) tokens per cp rank (cpa's) */
    int *cnt_a, *dsp_a;     /* (R*U) counts of the final gather */
    /* context-parallel buffers (empty without cp) */
    void *embed;            /* (B, N, D) patch embedding of the whole image */
    void *tok_loc;          /* (B, N_loc, p*p*Co) */
    void *tok_gath;         /* (B*N, p*p*Co) rank blocks before reordering */

    /* Backends with ops->upload_args (CUDA): the per-step arguments in the
     * activation arena, (B) each, written before every forward; and, when
     * the forward has no collective (no tp, ring or ulysses), one captured
     * graph per batch size B, graphs[B] (max_batch + 1). NULL otherwise. */
    float *d_t;
    int64_t *d_y;
    ditd_dit_graph *graphs;

    /* LoRA (engine/models/lora.h): the linears an adapter may target, in
     * the order of DITD_DIT_LORA_* per block then proj_out_1, proj_out_2;
     * none under tp (A and B would have to split with their weight). The
     * rank-r scratch (fp32, lora_tmp_n floats) in the activation arena. */
    ditd_lora_target *lora_t;
    int n_lora_t;
    float *lora_tmp;
    size_t lora_tmp_n;
} ditd_dit;

/* A block's LoRA targets, in this order (block l's are at l * DITD_DIT_LORA_PER_BLOCK). */
enum {
    DITD_DIT_LORA_T1 = 0,  /* norm1.emb.timestep_embedder.linear_1 (SiLU after) */
    DITD_DIT_LORA_T2,      /* norm1.emb.timestep_embedder.linear_2 */
    DITD_DIT_LORA_ADA,     /* norm1.linear */
    DITD_DIT_LORA_Q,       /* attn1.to_q, to_k, to_v: column blocks of the fused qkv */
    DITD_DIT_LORA_K,
    DITD_DIT_LORA_V,
    DITD_DIT_LORA_O,       /* attn1.to_out.0 */
    DITD_DIT_LORA_FF1,     /* ff.net.0.proj (GELU after) */
    DITD_DIT_LORA_FF2,     /* ff.net.2 */
    DITD_DIT_LORA_PER_BLOCK
};

/* Creates a model with weights from a safetensors checkpoint (a file, an
 * index, or a folder: see engine/io/safetensors.h) or a GGUF file (or a
 * folder holding one: engine/io/weights.h), dequantized at load. *out is owned: free with
 * ditd_dit_free(). Errors name the file, tensor and shapes. */
int ditd_dit_new(const ditd_dit_config *cfg, const ditd_backend_ops *ops, int max_batch,
                 const char *weights_path, ditd_dit **out);


/* Same, with random weights (std 0.02 normal, biases small) from the Philox
 * generator: what `ditd bench` runs for the named configs. */
int ditd_dit_new_random(const ditd_dit_config *cfg, const ditd_backend_ops *ops, int max_batch,
                        uint64_t seed, ditd_dit **out);

/* As ditd_dit_new / ditd_dit_new_random, one rank of a mesh (borrowed;
 * must outlive the model; NULL = one rank). The layout is checked against
 * the model first (ditd_layout_check_attention: every rank refuses the same
 * layout, before any collective); under tp each rank reads, or draws, only
 * its own slices (random weights are slices of the single-rank streams, so
 * every layout runs the same model). Not collective. */
int ditd_dit_new_mesh(const ditd_dit_config *cfg, const ditd_backend_ops *ops, int max_batch,
                      const char *weights_path, const ditd_mesh *mesh, ditd_dit **out);
int ditd_dit_new_random_mesh(const ditd_dit_config *cfg, const ditd_backend_ops *ops,
                             int max_batch, uint64_t seed, const ditd_mesh *mesh, ditd_dit **out);

void ditd_dit_free(ditd_dit *m);

/* One forward: out (B, Co, S, S) = DiT(x (B, C, S, S), h_t (B), h_y (B)).
 * x and out are backend buffers (host memory on the CPU); h_t and h_y are host
 * arrays. Class ids are in [0, K], K being the null class. B <= max_batch.
 * Returns DITD_EINVAL for a class id out of range or a non-finite timestep.
 * Under a mesh: collective over the model's cp and tp ranks (the cfg axis
 * is the caller's), which must all pass the same B, x, h_t and h_y; every
 * one of them gets the whole out. Input errors are found before any
 * collective, so they too are the same on every rank.
 * On a backend with graphs (CUDA) and a forward without collectives, the
 * second forward of a batch size is captured and later ones with the same
 * (B, x, out) replay it (DITD_CUDA_GRAPHS=0 turns that off); h_t and h_y
 * are uploaded to device buffers first, so replays see each step's. */
int ditd_dit_forward(ditd_dit *m, int B, const void *x, const float *h_t, const int64_t *h_y,
                     void *out);

/* The family table of DiTTransformer2DModel (engine/models/dit/dit_denoiser.c):
 * its load makes a ditd_dit whose base is a complete ditd_denoiser (a
 * ditd_dit made by ditd_dit_new* directly has base.shapes but no family). */
extern const ditd_denoiser_family ditd_dit_family;

/* Bytes held by the weight and activation arenas. */
size_t ditd_dit_weight_bytes(const ditd_dit *m);
size_t ditd_dit_act_bytes(const ditd_dit *m);

#endif
