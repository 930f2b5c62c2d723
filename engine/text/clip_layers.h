/* The encoder layer transformers' CLIPTextModel and CLIPVisionModel share
 * (CLIPEncoderLayer): pre-LN self-attention (q/k/v/out projections with
 * biases, scale Dh^-1/2; causal for text, full for vision) and an MLP
 * (fc1, its activation, fc2), each added to the residual.
 *
 * Internal to engine/text and engine/vision (ditd__ names): the weight
 * walk of one layer (plan, then carve: engine/text/text_weights.h) and its
 * forward over planned activation buffers. What it is not: embeddings, the
 * final norms or pooling (each model's own).
 */
#ifndef DITD_ENGINE_CLIP_LAYERS_H
#define DITD_ENGINE_CLIP_LAYERS_H

#include <stddef.h>
#include <stdint.h>

#include "engine/backend/backend.h"
#include "engine/text/text_lora.h"
#include "engine/text/text_weights.h"

typedef struct ditd__clip_layer {
    void *ln1_g, *ln1_b, *ln2_g, *ln2_b;            /* (D) */
    ditd_text_mat q, k, v, o;                       /* (D, D) */
    void *q_b, *k_b, *v_b, *o_b;                    /* (D) */
    ditd_text_mat fc1, fc2;                         /* (F, D), (D, F) */
    void *fc1_b, *fc2_b;                            /* (F), (D) */
} ditd__clip_layer;

/* Activations of one forward, (B N, ...) rows, carved by the model. */
typedef struct ditd__clip_bufs {
    void *h;            /* (BN, D) the residual stream, updated in place */
    void *xn, *att, *tmp; /* (BN, D) */
    void *qkv;          /* (BN, 3D) */
    void *ff;           /* (BN, F) */
    void *scratch;      /* linear_wt's panel scratch, scratch_elems */
    size_t scratch_elems;
    void *att_scratch;  /* (N, N) scores */
} ditd__clip_bufs;

/* Layer l's tensors "<prefix>encoder.layers.<l>.{layer_norm1, self_attn.
 * {q,k,v,out}_proj, layer_norm2, mlp.fc1, mlp.fc2}.{weight,bias}" with
 * width D and MLP width F. 0 or the weights' error (naming the tensor). */
int ditd__clip_layer_walk(ditd_text_weights *w, ditd__clip_layer *y, const char *prefix, int l,
                          int64_t D, int64_t F);

/* Carves the buffers for B N rows (panel scratch for the widest of D, F
 * and kmax, another GEMM's K). */
int ditd__clip_bufs_carve(ditd_text_weights *w, ditd__clip_bufs *b, size_t BN, int max_N,
                          int64_t D, int64_t F, int64_t kmax);

/* LoRA targets of one layer, in this order from the layer's first index. */
enum {
    DITD__CLIP_T_Q, DITD__CLIP_T_K, DITD__CLIP_T_V, DITD__CLIP_T_O, DITD__CLIP_T_FC1,
    DITD__CLIP_T_FC2, DITD__CLIP_T_PER_LAYER
};
/* Layer l's targets' names ("encoder.layers.<l>.self_attn.q_proj", ...)
 * and shapes into t[0 .. DITD__CLIP_T_PER_LAYER). */
void ditd__clip_layer_targets(ditd_lora_target *t, int l, int D, int F);

/* h += attn(LN1(h)); h += fc2(act(fc1(LN2(h)))) over B sequences of N.
 * keep: (B, N) attention mask or NULL; causal: text's mask. lo: the
 * sequences' LoRA adapters (lo->B == B, lo->rows == N; sets NULL: none),
 * this layer's targets from t0. */
void ditd__clip_layer_forward(const ditd_backend_ops *ops, const ditd__clip_layer *y,
                              const ditd__clip_bufs *b, int B, int N, int D, int F, int H,
                              float eps, ditd_text_act act, const uint8_t *keep, int causal,
                              const ditd_text_lora_run *lo, int t0);

#endif
