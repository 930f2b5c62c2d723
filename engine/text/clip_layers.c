/* CLIPEncoderLayer: weights and forward, shared by the text and vision towers. */
#include "engine/text/clip_layers.h"

#include <math.h>
#include <stdio.h>

#include "kernels/cpu/text_kernels.h"

int ditd__clip_layer_walk(ditd_text_weights *w, ditd__clip_layer *y, const char *p, int l,
                          int64_t D, int64_t F)
{
    char name[256];
    int err;
#define N_(sfx) (snprintf(name, sizeof name, "%sencoder.layers.%d.%s", p, l, sfx), name)
#define MAT(dst, r, c, sfx)                                                \
    if ((err = ditd_text_weights_mat(w, &(dst), N_(sfx), (r), (c))))      \
    return err
#define SMALL(dst, d0, sfx)                                                \
    if ((err = ditd_text_weights_small(w, &(dst), N_(sfx), (d0), 0)))     \
    return err
    SMALL(y->ln1_g, D, "layer_norm1.weight");
    SMALL(y->ln1_b, D, "layer_norm1.bias");
    MAT(y->q, D, D, "self_attn.q_proj.weight");
    SMALL(y->q_b, D, "self_attn.q_proj.bias");
    MAT(y->k, D, D, "self_attn.k_proj.weight");
    SMALL(y->k_b, D, "self_attn.k_proj.bias");
    MAT(y->v, D, D, "self_attn.v_proj.weight");
    SMALL(y->v_b, D, "self_attn.v_proj.bias");
    MAT(y->o, D, D, "self_attn.out_proj.weight");
    SMALL(y->o_b, D, "self_attn.out_proj.bias");
    SMALL(y->ln2_g, D, "layer_norm2.weight");
    SMALL(y->ln2_b, D, "layer_norm2.bias");
    MAT(y->fc1, F, D, "mlp.fc1.weight");
    SMALL(y->fc1_b, F, "mlp.fc1.bias");
    MAT(y->fc2, D, F, "mlp.fc2.weight");
    SMALL(y->fc2_b, D, "mlp.fc2.bias");
#undef MAT
#undef SMALL
#undef N_
    return 0;
}

int ditd__clip_bufs_carve(ditd_text_weights *w, ditd__clip_bufs *b, size_t BN, int max_N,
                          int64_t D, int64_t F, int64_t kmax)
{
    size_t Fmax = (size_t)(F > D ? F : D);
    if ((size_t)kmax > Fmax)
        Fmax = (size_t)kmax;
    int err;
    b->scratch_elems = (size_t)DITD_CPU_WT_PANEL * Fmax;
    if ((err = ditd_text_weights_carve(w, &b->h, BN * D, 0)) ||
        (err = ditd_text_weights_carve(w, &b->xn, BN * D, 0)) ||
        (err = ditd_text_weights_carve(w, &b->qkv, BN * 3 * D, 0)) ||
        (err = ditd_text_weights_carve(w, &b->att, BN * D, 0)) ||
        (err = ditd_text_weights_carve(w, &b->ff, BN * F, 0)) ||
        (err = ditd_text_weights_carve(w, &b->tmp, BN * D, 0)) ||
        (err = ditd_text_weights_carve(w, &b->scratch, b->scratch_elems, 0)) ||
        (err = ditd_text_weights_carve(w, &b->att_scratch, (size_t)max_N * (size_t)max_N, 0)))
        return err;
    return 0;
}

void ditd__clip_layer_targets(ditd_lora_target *t, int l, int D, int F)
{
    static const char *const sfx[DITD__CLIP_T_PER_LAYER] = {
        "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.out_proj",
        "mlp.fc1",          "mlp.fc2"};
    for (int i = 0; i < DITD__CLIP_T_PER_LAYER; i++) {
        snprintf(t[i].name, sizeof t[i].name, "encoder.layers.%d.%s", l, sfx[i]);
        t[i].n_out = i == DITD__CLIP_T_FC1 ? F : D;
        t[i].k_in = i == DITD__CLIP_T_FC2 ? F : D;
    }
}

void ditd__clip_layer_forward(const ditd_backend_ops *ops, const ditd__clip_layer *y,
                              const ditd__clip_bufs *b, int B, int N, int D, int F, int H,
                              float eps, ditd_text_act act, const uint8_t *keep, int causal,
                              const ditd_text_lora_run *lo, int t0)
{
    const int Dh = D / H;
    const size_t BN = (size_t)B * (size_t)N, ld3 = 3 * (size_t)D;
    const float scale = 1.0f / sqrtf((float)Dh);
    const ditd_text_lora_run none = {.B = B, .rows = N};
    if (!lo)
        lo = &none;
#define LIN(x, ldx, w, bias, yy, ldy, n, k, a, t)                                             \
    ditd_text_lora_linear(ops, lo, t0 + (t), x, ldx, &(w), bias, yy, ldy, n, k, a, b->scratch, \
                          b->scratch_elems)
    // self-attention block: h += out_proj(attn(LN1(h)))
    ops->layernorm_affine(b->h, b->xn, (int)BN, D, eps, y->ln1_g, y->ln1_b);
    LIN(b->xn, D, y->q, y->q_b, b->qkv, ld3, D, D, DITD_TEXT_ACT_NONE, DITD__CLIP_T_Q);
    LIN(b->xn, D, y->k, y->k_b, ditd_ptr_act(ops, b->qkv, D), ld3, D, D, DITD_TEXT_ACT_NONE,
        DITD__CLIP_T_K);
    LIN(b->xn, D, y->v, y->v_b, ditd_ptr_act(ops, b->qkv, 2 * (size_t)D), ld3, D, D,
        DITD_TEXT_ACT_NONE, DITD__CLIP_T_V);
    // (B, N, H, Dh) views into qkv rows of 3D
    ops->attention_masked(b->qkv, ld3, ditd_ptr_act(ops, b->qkv, D), ld3,
                          ditd_ptr_act(ops, b->qkv, 2 * (size_t)D), ld3, b->att, D, B, N, H, Dh,
                          scale, NULL, keep, causal, b->att_scratch);
    LIN(b->att, D, y->o, y->o_b, b->tmp, D, D, D, DITD_TEXT_ACT_NONE, DITD__CLIP_T_O);
    ops->add(b->h, b->tmp, BN * D);
    // MLP block: h += fc2(act(fc1(LN2(h))))
    ops->layernorm_affine(b->h, b->xn, (int)BN, D, eps, y->ln2_g, y->ln2_b);
    LIN(b->xn, D, y->fc1, y->fc1_b, b->ff, F, F, D, act, DITD__CLIP_T_FC1);
    LIN(b->ff, F, y->fc2, y->fc2_b, b->tmp, D, D, F, DITD_TEXT_ACT_NONE, DITD__CLIP_T_FC2);
#undef LIN
    ops->add(b->h, b->tmp, BN * D);
}
