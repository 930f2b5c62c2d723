/* Diffusers WanTransformer3DModel: loading and planning (the forward is
 * wan_forward.c). */
#include "engine/models/wan/wan.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/error.h"
#include "engine/io/weights.h"
#include "engine/models/orig_map.h"
#include "kernels/cpu/rope.h"

/* ---- planning: the same carve sequence runs twice (count, then hand out) ---- */

static int carve(ditd_arena *a, void **p, ditd_dtype dt, size_t n)
{
    int err;
    *p = ditd_arena_bytes(a, n * ditd_dtype_size(dt), &err);
    return err;
}

/* norm2's and the image embedder's affine LayerNorm weights as the modulate
 * op's scale: w - 1 (LN(x) (1 + (w - 1)) + b) */
static void minus_one(float *v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        v[i] -= 1.0f;
}

/* The model's weight list (engine/models/weight_list.h), written once from
 * the config and this rank's tp plan, walked for planning, loading and
 * packing; a linear whose parts are one GGML block type stays in its
 * blocks (weight_list.c). tp: attn1's q|k|v, attn2's q, k|v (and the image branch's
 * add_k|add_v) and ffn.net.0.proj column-parallel (this rank's heads and FFN
 * rows, their qk norms' slices with them); attn1/attn2.to_out.0 and
 * ffn.net.2 row-parallel (matching columns). The modulation tables, norms
 * and the image embedder's positions stay in the activation type. */
#define L1(l, n, k, ...) ditd_wl_add(wl, DITD_WL_PACK, (n), (k), &(l)->w, &(l)->b, &(l)->q, __VA_ARGS__)
#define VEC(p, n, ...) ditd_wl_add(wl, DITD_WL_VEC | DITD_WL_ACT, (n), 0, &(p), NULL, NULL, __VA_ARGS__)
#define FUSED(l, np, sfx, ...)                                                                  \
    do {                                                                                        \
        snprintf(pre, sizeof pre, __VA_ARGS__);                                                 \
        ditd_wl_rows_of(ditd_wl_add_fused(wl, DITD_WL_PACK, D, D, &(l)->w, &(l)->b, &(l)->q,    \
                                          pre, (np), (sfx)),                                    \
                        a0, A);                                                                 \
    } while (0)

static void weight_list(ditd_wan *m, ditd_wl *wl)
{
    const ditd_wan_config *c = &m->cfg;
    int64_t D = c->inner_dim, FF = c->ffn_dim, p = c->patch_h, Di = c->image_dim;
    int64_t A = m->A, a0 = (int64_t)m->h0 * c->head_dim, F = m->fc, f0 = m->f0; /* this tp rank's */
    static const char *const qkv[3] = {"to_q", "to_k", "to_v"};
    static const char *const kvi[2] = {"add_k_proj", "add_v_proj"};
    const int64_t s2[3] = {1, 2, D}, s6[3] = {1, 6, D};
    char pre[160];

    /* a (D, C, 1, p, p) conv weight: read by load_weights, never packed */
    ditd_wl_add(wl, DITD_WL_DENSE | DITD_WL_OWN_LOAD, D, (int64_t)c->in_channels * p * p,
                &m->patch.w, &m->patch.b, NULL, "patch_embedding");
    L1(&m->t1, D, c->freq_dim, "condition_embedder.time_embedder.linear_1");
    L1(&m->t2, D, D, "condition_embedder.time_embedder.linear_2");
    L1(&m->tproj, 6 * D, D, "condition_embedder.time_proj");
    L1(&m->x1, D, c->text_dim, "condition_embedder.text_embedder.linear_1");
    L1(&m->x2, D, D, "condition_embedder.text_embedder.linear_2");
    ditd_wl_vec_shape(VEC(m->sst_out, 2 * D, "scale_shift_table"), 3, s2);
    /* proj_out rows are (dt, dy, dx, c) with dt = 1: the unpatchify op's order */
    L1(&m->proj, p * p * c->out_channels, D, "proj_out");
    if (Di) {
        const char *ie = "condition_embedder.image_embedder";
        ditd_wl_vec_fix(VEC(m->ie_n1w, Di, "%s.norm1.weight", ie), minus_one);
        VEC(m->ie_n1b, Di, "%s.norm1.bias", ie);
        L1(&m->ie_ff1, Di, Di, "%s.ff.net.0.proj", ie);
        L1(&m->ie_ff2, D, Di, "%s.ff.net.2", ie);
        ditd_wl_vec_fix(VEC(m->ie_n2w, D, "%s.norm2.weight", ie), minus_one);
        VEC(m->ie_n2b, D, "%s.norm2.bias", ie);
        if (c->pos_embed_seq_len) {
            const int64_t sp[3] = {1, c->pos_embed_seq_len, Di};
            ditd_wl_vec_shape(VEC(m->ie_pos, c->pos_embed_seq_len * Di, "%s.pos_embed", ie), 3, sp);
        }
    }
    for (int l = 0; l < c->num_layers; l++) {
        ditd_wan_block *b = &m->blk[l];
        ditd_wl_vec_shape(VEC(b->sst, 6 * D, "blocks.%d.scale_shift_table", l), 3, s6);
        FUSED(&b->qkv, 3, qkv, "blocks.%d.attn1", l);
        ditd_wl_rows_of(VEC(b->nq1, D, "blocks.%d.attn1.norm_q.weight", l), a0, A);
        ditd_wl_rows_of(VEC(b->nk1, D, "blocks.%d.attn1.norm_k.weight", l), a0, A);
        ditd_wl_cols_of(L1(&b->out1, D, D, "blocks.%d.attn1.to_out.0", l), 1, &a0, &A);
        if (c->cross_attn_norm) {
            ditd_wl_vec_fix(VEC(b->n2w, D, "blocks.%d.norm2.weight", l), minus_one);
            VEC(b->n2b, D, "blocks.%d.norm2.bias", l);
        }
        ditd_wl_rows_of(L1(&b->q2, D, D, "blocks.%d.attn2.to_q", l), a0, A);
        FUSED(&b->kv2, 2, qkv + 1, "blocks.%d.attn2", l);
        ditd_wl_rows_of(VEC(b->nq2, D, "blocks.%d.attn2.norm_q.weight", l), a0, A);
        ditd_wl_rows_of(VEC(b->nk2, D, "blocks.%d.attn2.norm_k.weight", l), a0, A);
        if (Di) {
            FUSED(&b->kvi, 2, kvi, "blocks.%d.attn2", l);
            ditd_wl_rows_of(VEC(b->nki, D, "blocks.%d.attn2.norm_added_k.weight", l), a0, A);
        }
        ditd_wl_cols_of(L1(&b->out2, D, D, "blocks.%d.attn2.to_out.0", l), 1, &a0, &A);
        ditd_wl_rows_of(L1(&b->ff1, FF, D, "blocks.%d.ffn.net.0.proj", l), f0, F);
        ditd_wl_cols_of(L1(&b->ff2, D, FF, "blocks.%d.ffn.net.2", l), 1, &f0, &F);
    }
}
#undef L1
#undef VEC
#undef FUSED

/* The linears an adapter may target (engine/models/lora_linear.h), every
 * nn.Linear of WanTransformer3DModel in Diffusers' module names: the
 * condition embedder's (time_embedder, time_proj, text_embedder, and with an
 * image branch image_embedder.ff), each block's attn1 to_q/k/v (fused: a
 * part each) and to_out.0, attn2's to_q, to_k/v (fused), add_k/v_proj
 * (image branch), to_out.0, the FFN, and proj_out (rows in Diffusers'
 * order). Under tp each with this rank's slice as weight_list cuts it: the
 * attentions' q / k / v parts and ffn.net.0 by outputs (heads, FFN
 * columns), the to_out.0s and ffn.net.2 by inputs. None on a backend
 * without the lora op (base.lora_refusal). */
#define ADD(l, cut, n, k, parts, part, ...) \
    ditd_lora_list_add(t, &(l)->lora, (cut), (n), (k), (parts), (part), __VA_ARGS__)
static int lora_targets(ditd_wan *m)
{
    const ditd_wan_config *c = &m->cfg;
    int D = c->inner_dim, FF = c->ffn_dim, Di = c->image_dim, a0 = m->h0 * c->head_dim;
    int Co = c->patch_h * c->patch_w * c->out_channels;
    static const char *const qkv[3] = {"to_q", "to_k", "to_v"};
    static const char *const kvi[2] = {"add_k_proj", "add_v_proj"};
    const ditd_lora_cut all = {DITD_LORA_WHOLE, 0, {0, 0}, {0, 0}};
    const ditd_lora_cut heads = {DITD_LORA_OUT_SLICE, 1, {a0, 0}, {m->A, 0}};
    const ditd_lora_cut ffn = {DITD_LORA_OUT_SLICE, 1, {m->f0, 0}, {m->fc, 0}};
    const ditd_lora_cut heads_in = {DITD_LORA_IN_SLICE, 1, {a0, 0}, {m->A, 0}};
    const ditd_lora_cut ffn_in = {DITD_LORA_IN_SLICE, 1, {m->f0, 0}, {m->fc, 0}};
    ditd_lora_list *t = &m->lora;
    if (!m->ops->lora) {
        m->base.lora_refusal = "this backend has no LoRA op";
        return 0;
    }
    t->tp = m->lay.tp;
    t->cap = 8 + 12 * c->num_layers;
    if (!(t->t = calloc((size_t)t->cap, sizeof *t->t)))
        return ditd_err_set(DITD_ENOMEM, "LoRA targets");
    ADD(&m->t1, all, D, c->freq_dim, 1, NULL, "condition_embedder.time_embedder.linear_1");
    ADD(&m->t2, all, D, D, 1, NULL, "condition_embedder.time_embedder.linear_2");
    ADD(&m->tproj, all, 6 * D, D, 1, NULL, "condition_embedder.time_proj");
    ADD(&m->x1, all, D, c->text_dim, 1, NULL, "condition_embedder.text_embedder.linear_1");
    ADD(&m->x2, all, D, D, 1, NULL, "condition_embedder.text_embedder.linear_2");
    if (Di) {
        ADD(&m->ie_ff1, all, Di, Di, 1, NULL, "condition_embedder.image_embedder.ff.net.0.proj");
        ADD(&m->ie_ff2, all, D, Di, 1, NULL, "condition_embedder.image_embedder.ff.net.2");
    }
    ADD(&m->proj, all, Co, D, 1, NULL, "proj_out");
    for (int l = 0; l < c->num_layers; l++) {
        ditd_wan_block *b = &m->blk[l];
        ADD(&b->qkv, heads, 3 * D, D, 3, qkv, "blocks.%d.attn1", l);
        ADD(&b->out1, heads_in, D, D, 1, NULL, "blocks.%d.attn1.to_out.0", l);
        ADD(&b->q2, heads, D, D, 1, NULL, "blocks.%d.attn2.to_q", l);
        ADD(&b->kv2, heads, 2 * D, D, 2, qkv + 1, "blocks.%d.attn2", l);
        if (Di)
            ADD(&b->kvi, heads, 2 * D, D, 2, kvi, "blocks.%d.attn2", l);
        ADD(&b->out2, heads_in, D, D, 1, NULL, "blocks.%d.attn2.to_out.0", l);
        ADD(&b->ff1, ffn, FF, D, 1, NULL, "blocks.%d.ffn.net.0.proj", l);
        ADD(&b->ff2, ffn_in, D, FF, 1, NULL, "blocks.%d.ffn.net.2", l);
    }
    if (t->n > t->cap)
        return ditd_err_set(DITD_EINVAL, "Wan LoRA targets: %d listed, room for %d", t->n, t->cap);
    m->base.lora_targets = t->t;
    m->base.n_lora_targets = t->n;
    return 0;
}
#undef ADD

static int carve_acts(ditd_wan *m)
{
    const ditd_wan_config *c = &m->cfg;
    size_t B = (size_t)m->max_batch, N = (size_t)m->N, Nl = (size_t)m->n_loc, L = (size_t)m->L;
    size_t D = (size_t)c->inner_dim, A = (size_t)m->A, F = (size_t)m->fc;
    size_t BF = B * (size_t)m->F, pp = (size_t)c->patch_h * (size_t)c->patch_w;
    size_t Co = pp * (size_t)c->out_channels, half = (size_t)c->head_dim / 2;
    ditd_dtype at = m->ops->act_dtype;
    ditd_arena *a = &m->acts;
    int err = 0;

    err |= carve(a, &m->img, at, B * Nl * D) | carve(a, &m->xn, at, B * Nl * D);
    err |= carve(a, &m->qkv, at, B * Nl * 3 * A) | carve(a, &m->ao, at, B * Nl * A);
    err |= carve(a, &m->hid, at, B * Nl * F);
    err |= carve(a, &m->text_in, at, B * L * (size_t)c->text_dim);
    err |= carve(a, &m->ctx, at, B * L * D) | carve(a, &m->ctx_h, at, B * L * D);
    err |= carve(a, &m->kv, at, B * L * 2 * A);
    if (c->image_dim) {
        size_t Li = (size_t)m->Li, Di = (size_t)c->image_dim;
        err |= carve(a, &m->im_in, at, B * Li * Di) | carve(a, &m->im_h, at, B * Li * Di);
        err |= carve(a, &m->im_ctx, at, B * Li * D) | carve(a, &m->kvim, at, B * Li * 2 * A);
        err |= carve(a, &m->aoi, at, B * Nl * A);
    }
    size_t ssr = Nl > L ? Nl : L; /* rows of any qk_norm: tokens, text or image */
    ssr = ssr > (size_t)m->Li ? ssr : (size_t)m->Li;
    err |= carve(a, (void **)&m->ss, DITD_DTYPE_F32, B * ssr);
    err |= carve(a, &m->tfreq, at, BF * (size_t)c->freq_dim);
    err |= carve(a, &m->temb, at, BF * D) | carve(a, &m->stemb, at, BF * D);
    err |= carve(a, &m->tp6, at, BF * 6 * D) | carve(a, &m->mod, at, BF * 6 * D);
    err |= carve(a, &m->mod_out, at, BF * 2 * D);
    /* the RoPE table stays fp32 on every backend, as Diffusers keeps it */
    err |= carve(a, &m->rope_cos, DITD_DTYPE_F32, N * half) |
           carve(a, &m->rope_sin, DITD_DTYPE_F32, N * half);
    err |= carve(a, &m->scratch, at, B * N * (size_t)c->in_channels * pp);
    err |= carve(a, &m->tok_out, at, B * N * Co);
    if (m->lora.n) { /* LoRA's rank-r scratch, fp32: the largest M of a linear */
        size_t rows = ssr > (size_t)m->F ? ssr : (size_t)m->F; /* tokens, text, image, frames */
        m->lora_tmp_n = ditd_lora_tmp_floats(B * rows);
        err |= carve(a, (void **)&m->lora_tmp, DITD_DTYPE_F32, m->lora_tmp_n);
    }
    if (m->lay.ring * m->lay.ulysses > 1) {
        err |= carve(a, &m->embed, at, B * N * D);
        err |= carve(a, &m->tok_loc, at, B * Nl * Co);
        err |= carve(a, &m->tok_gath, at, B * N * Co);
    }
    return err ? DITD_ENOMEM : 0;
}

/* WanRotaryPosEmbed's table: token (f, row, col) takes positions (f, row,
 * col) on the axes of t, h and w channels (get_1d_rotary_pos_embed per axis
 * in float64, concatenated). */
static int rope_tables(ditd_wan *m)
{
    size_t N = (size_t)m->N, half = (size_t)m->cfg.head_dim / 2;
    int dims[3] = {m->cfg.rope_t, m->cfg.rope_h, m->cfg.rope_w};
    float *ids = malloc(N * 3 * sizeof(float));
    float *cs = malloc(2 * N * half * sizeof(float));
    if (!ids || !cs) {
        free(ids);
        free(cs);
        return ditd_err_set(DITD_ENOMEM, "RoPE table of %zu tokens", N);
    }
    for (size_t n = 0; n < N; n++) {
        size_t f = n / (size_t)m->P, r = (n % (size_t)m->P) / (size_t)m->gw;
        ids[n * 3 + 0] = (float)f;
        ids[n * 3 + 1] = (float)r;
        ids[n * 3 + 2] = (float)(n % (size_t)m->gw);
    }
    ditd_cpu_rope_table(ids, (int)N, 3, dims, 10000.0, cs, cs + N * half);
    m->ops->upload_f32(m->rope_cos, cs, N * half);
    m->ops->upload_f32(m->rope_sin, cs + N * half, N * half);
    free(ids);
    free(cs);
    return 0;
}

/* The split of the video tokens, the attention, every buffer, the RoPE
 * table, for the current (F, h, w, L). At load and again by
 * ditd_wan_set_size (the old ones freed first). */
static int plan_acts(ditd_wan *m)
{
    int err, RU = m->lay.ring * m->lay.ulysses;
    ditd_cp_attention_free(m->cpa);
    m->cpa = NULL;
    ditd_arena_free(&m->acts);
    if ((err = ditd_cp_attention_new(m->ops, m->mesh, m->max_batch, m->N, 0, m->hc,
                                     m->cfg.head_dim, &m->cpa)))
        return err;
    m->n_loc = m->cpa->n_loc;
    m->tok0 = m->cpa->tok0;
    for (int j = 0; j < RU; j++)
        ditd_split(m->N, RU, j, &m->ioff[j], &m->icnt[j]);
    if ((err = carve_acts(m)) || (err = ditd_arena_commit(&m->acts, m->acts.peak_plan)) ||
        (err = carve_acts(m)))
        goto fail;
    if ((err = rope_tables(m)))
        goto fail;
    return 0;
fail:
    ditd_cp_attention_free(m->cpa);
    m->cpa = NULL;
    return err;
}

/* (frames, height, width, text_len) checked against the patch and the
 * RoPE; m's sizes and shapes set to them when `set`. */
static int check_sizes(const ditd_wan_config *c, int frames, int height, int width, int text_len)
{
    int p = c->patch_h, R = c->rope_max_seq_len;
    if (frames <= 0 || height <= 0 || width <= 0 || frames > 65536 || height > 16384 ||
        width > 16384 || height % p || width % p)
        return ditd_err_set(DITD_EINVAL,
                            "Wan latents of %d frames of %dx%d: positive, width and height multiples of the patch %d",
                            frames, width, height, p);
    if (frames > R || height / p > R || width / p > R)
        return ditd_err_set(DITD_EINVAL,
                            "Wan latents of %d frames of %dx%d patches: each at most rope_max_seq_len = %d",
                            frames, width / p, height / p, R);
    if ((long long)frames * (height / p) * (width / p) > (1 << 30))
        return ditd_err_set(DITD_EINVAL, "Wan latents of %d frames of %dx%d: too many tokens",
                            frames, width, height);
    if (text_len <= 0 || text_len > 65536)
        return ditd_err_set(DITD_EINVAL, "Wan text length %d (1..65536)", text_len);
    if (c->image_dim && text_len != DITD_WAN_IMAGE_TEXT_LEN)
        return ditd_err_set(DITD_EINVAL,
                            "Wan text length %d: a model with an image branch (image_dim) takes %d text tokens (WanAttnProcessor splits the context there)",
                            text_len, DITD_WAN_IMAGE_TEXT_LEN);
    return 0;
}

static void set_sizes(ditd_wan *m, int frames, int height, int width, int text_len)
{
    int p = m->cfg.patch_h;
    m->F = frames;
    m->h = height;
    m->w = width;
    m->gh = height / p;
    m->gw = width / p;
    m->P = m->gh * m->gw;
    m->N = frames * m->P;
    m->L = text_len;
    ditd_wan_shapes(&m->cfg, frames, height, width, text_len, &m->base.shapes);
}

static int plan(ditd_wan *m, const ditd_mesh *mesh)
{
    int err;
    m->mesh = mesh && mesh->size > 1 ? mesh : NULL;
    m->lay = m->mesh ? mesh->layout : DITD_LAYOUT_SINGLE;
    if (m->mesh && (err = ditd_layout_check_attention(&m->lay, m->cfg.num_heads, m->N)))
        return err;
    /* tp: this rank's heads and FFN columns, as evenly as they go */
    m->tp_rank = m->mesh ? mesh->tp_rank : 0;
    ditd_split(m->cfg.num_heads, m->lay.tp, m->tp_rank, &m->h0, &m->hc);
    ditd_split(m->cfg.ffn_dim, m->lay.tp, m->tp_rank, &m->f0, &m->fc);
    m->A = m->hc * m->cfg.head_dim;
    int RU = m->lay.ring * m->lay.ulysses;
    if (!(m->cnt_a = calloc(4 * (size_t)RU, sizeof(int))))
        return ditd_err_set(DITD_ENOMEM, "Wan plan");
    m->dsp_a = m->cnt_a + RU;
    m->icnt = m->dsp_a + RU;
    m->ioff = m->icnt + RU;
    m->wl.tp = m->lay.tp; /* named by a split that would cut GGML blocks */
    weight_list(m, &m->wl);
    if ((err = ditd_wl_plan(&m->wl, &m->weights, m->ops, m->src)) ||
        (err = ditd_arena_commit(&m->weights, m->weights.peak_plan)) ||
        (err = ditd_wl_plan(&m->wl, &m->weights, m->ops, m->src)))
        return err;
    return lora_targets(m);
}

/* The host buffers that follow the frame count (B F rows). */
static int plan_host(ditd_wan *m)
{
    size_t BF = (size_t)m->max_batch * (size_t)m->F;
    float *f = realloc(m->h_freq, BF * (size_t)m->cfg.freq_dim * sizeof(float));
    if (f)
        m->h_freq = f;
    float *t = f ? realloc(m->h_t, BF * sizeof(float)) : NULL;
    if (t)
        m->h_t = t;
    return f && t ? 0 : ditd_err_set(DITD_ENOMEM, "Wan timestep features");
}

int ditd_wan_set_size(ditd_wan *m, int frames, int height, int width, int text_len)
{
    int err, p = m->cfg.patch_h;
    if (m->cpa && frames == m->F && height == m->h && width == m->w && text_len == m->L)
        return 0;
    /* every check first: a refusal leaves the model as it was */
    if ((err = check_sizes(&m->cfg, frames, height, width, text_len)))
        return err;
    if (m->mesh && (err = ditd_layout_check_attention(&m->lay, m->cfg.num_heads,
                                                      frames * (height / p) * (width / p))))
        return err;
    set_sizes(m, frames, height, width, text_len);
    if ((err = plan_host(m)))
        return err;
    return plan_acts(m);
}

void ditd_wan_free(ditd_wan *m)
{
    if (!m)
        return;
    ditd_arena_free(&m->weights);
    ditd_arena_free(&m->acts);
    ditd_cp_attention_free(m->cpa);
    ditd_wl_free(&m->wl);
    free(m->blk);
    free(m->cnt_a);
    free(m->h_freq);
    free(m->h_t);
    free(m->lora.t);
    free(m);
}

size_t ditd_wan_weight_bytes(const ditd_wan *m)
{
    return m->weights.size;
}

size_t ditd_wan_act_bytes(const ditd_wan *m)
{
    return m->acts.size + (m->cpa ? ditd_cp_attention_bytes(m->cpa) : 0);
}

void ditd_wan_shapes(const ditd_wan_config *c, int frames, int height, int width, int text_len,
                     ditd_denoiser_shapes *out)
{
    memset(out, 0, sizeof *out);
    out->in_channels = c->in_channels;
    out->out_channels = c->out_channels;
    out->height = height;
    out->width = width;
    out->frames = frames;
    out->heads = c->num_heads;
    out->tokens = frames * (height / c->patch_h) * (width / c->patch_w);
    out->prefix_tokens = 0; /* the text is cross-attended, outside the split */
    out->latent_multiple = c->patch_h;
    out->cond.kind = DITD_COND_TEXT;
    out->cond.text_len = text_len;
    out->cond.text_dim = c->text_dim;
    out->cond.pooled_dim = 0;
    out->cond.image_len = c->image_len;
    out->cond.image_dim = c->image_dim;
}

/* ---- loading ---- */

/* a tensor the config says the checkpoint must not have */
#define ABSENT(why, ...)                                                                   \
    do {                                                                                   \
        snprintf(name, sizeof name, __VA_ARGS__);                                          \
        if (ditd_weights_has(w, name))                                                     \
            return ditd_err_set(DITD_EFORMAT, "checkpoint has %s but %s", name, (why));    \
    } while (0)

/* The patch embedding (a conv weight, the list's own-load entry), then the
 * list; the tensors the config rules out are refused, naming them. */
static int load_weights(ditd_wan *m, const ditd_weights *w)
{
    const ditd_wan_config *c = &m->cfg;
    int64_t D = c->inner_dim, p = c->patch_h, C = c->in_channels;
    char name[192];
    int err;

    /* an image branch in the checkpoint the config does not declare */
    if (!c->image_dim && (ditd_weights_has(w, "condition_embedder.image_embedder.norm1.weight") ||
                          ditd_weights_has(w, "blocks.0.attn2.add_k_proj.weight")))
        return ditd_err_set(DITD_EFORMAT,
                            "the checkpoint has an image branch (condition_embedder.image_embedder, attn2.add_k_proj) but the config has no image_dim");
    if (c->image_dim && !c->pos_embed_seq_len)
        ABSENT("config has no pos_embed_seq_len", "condition_embedder.image_embedder.pos_embed");
    {
        int64_t shape[5] = {D, C, 1, p, p};
        size_t n = (size_t)(D * C * p * p);
        float *buf = malloc((n > (size_t)D ? n : (size_t)D) * sizeof(float));
        if (!buf)
            return ditd_err_set(DITD_ENOMEM, "patch_embedding");
        if (!(err = ditd_weights_read_f32(w, "patch_embedding.weight", 5, shape, buf))) {
            m->ops->upload_weight(m->patch.w, buf, n);
            if (!(err = ditd_weights_read_f32(w, "patch_embedding.bias", 1, &D, buf)))
                m->ops->upload_weight(m->patch.b, buf, (size_t)D);
        }
        free(buf);
        if (err)
            return err;
    }
    if ((err = ditd_wl_load(&m->wl, w, m->ops)))
        return err;
    for (int l = 0; l < c->num_layers && !c->cross_attn_norm; l++)
        ABSENT("config says cross_attn_norm false", "blocks.%d.norm2.weight", l);
    /* more blocks in the checkpoint than the config says would silently
     * drop layers: refuse */
    char why[48];
    snprintf(why, sizeof why, "config says num_layers %d", c->num_layers);
    ABSENT(why, "blocks.%d.scale_shift_table", c->num_layers);
    return 0;
}
#undef ABSENT

int ditd_wan_new_mesh(const ditd_wan_config *cfg, const ditd_backend_ops *ops, int max_batch,
                      int frames, int height, int width, int text_len, const char *weights_path,
                      const ditd_mesh *mesh, ditd_wan **out)
{
    ditd_weights *st = NULL;
    ditd_orig_map orig = {0};
    ditd_wan *m;
    int is_orig = 0;
    int err;

    if (max_batch <= 0 || max_batch > 4096)
        return ditd_err_set(DITD_EINVAL, "max batch %d (1..4096)", max_batch);
    if (!ops->rope || !ops->row_sumsq || !ops->rmsnorm_rows || !ops->upload_f32)
        return ditd_err_set(DITD_EUNSUPPORTED,
                            "WanTransformer3DModel needs the rope, row_sumsq, rmsnorm_rows and upload_f32 ops, which the %s backend lacks",
                            ops->name);
    if (cfg->image_dim && !ops->gelu_erf)
        return ditd_err_set(DITD_EUNSUPPORTED,
                            "a WanTransformer3DModel with an image branch (image_dim = %d) needs the gelu_erf op, which the %s backend lacks",
                            cfg->image_dim, ops->name);
    if ((err = check_sizes(cfg, frames, height, width, text_len)))
        return err;
    if (!(m = calloc(1, sizeof *m)))
        return ditd_err_set(DITD_ENOMEM, "Wan model");
    m->cfg = *cfg;
    m->ops = ops;
    m->Li = cfg->image_len;
    m->max_batch = max_batch;
    m->base.max_batch = max_batch;
    ditd_arena_init_mem(&m->weights, ops->mem_alloc, ops->mem_free);
    ditd_arena_init_mem(&m->acts, ops->mem_alloc, ops->mem_free);
    if (!(m->blk = calloc((size_t)cfg->num_layers, sizeof *m->blk))) {
        err = ditd_err_set(DITD_ENOMEM, "Wan blocks");
        goto fail;
    }
    set_sizes(m, frames, height, width, text_len);
    /* the weights first: which linears stay quantized decides their sizes */
    if ((err = ditd_weights_open(weights_path, &st)) ||
        (err = ditd_wan_alias_orig(st, &orig, &is_orig)))
        goto fail;
    m->src = st;
    if ((err = plan(m, mesh)) || (err = plan_host(m)) || (err = plan_acts(m)))
        goto fail;
    if (is_orig && (err = ditd_orig_map_check(&orig, &m->wl, NULL, "WanTransformer3DModel")))
        goto fail;
    if ((err = load_weights(m, st)) || (err = ditd_wl_pack(&m->wl, m->ops, &m->quantized)))
        goto fail;
    m->src = NULL;
    ditd_wl_free(&m->wl); /* the list is the loading's; the forward reads m */
    ditd_orig_map_free(&orig);
    ditd_weights_free(st);
    *out = m;
    return 0;
fail:
    ditd_orig_map_free(&orig);
    ditd_weights_free(st);
    ditd_wan_free(m);
    return err;
}
