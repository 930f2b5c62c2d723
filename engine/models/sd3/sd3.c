/* Diffusers SD3Transformer2DModel: loading and planning (the forward is
 * sd3_forward.c). */
#include "engine/models/sd3/sd3.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/error.h"
#include "engine/io/weights.h"
#include "engine/models/orig_map.h"
#include "engine/models/weight_list.h"
#include "kernels/cpu/cpu_kernels.h"

#define TFREQ 256 /* Timesteps(num_channels=256) of CombinedTimestepTextProjEmbeddings */

/* ---- planning: the same carve sequence runs twice (count, then hand out) ---- */

static int carve(ditd_arena *a, void **p, ditd_dtype dt, size_t n)
{
    int err;
    *p = ditd_arena_bytes(a, n * ditd_dtype_size(dt), &err);
    return err;
}

/* The model's weight list (engine/models/weight_list.h), written once from
 * the config and this rank's tp plan, walked for planning, loading and
 * packing; a linear whose parts are one GGML block type stays in its
 * blocks (weight_list.c). tp: q, k, v (each attention) and ff(.context).net.0.proj
 * column-parallel (this rank's heads and MLP rows); to_out.0, to_add_out,
 * attn2.to_out.0 and ff(.context).net.2 row-parallel (matching columns). */
#define L1(l, n, k, ...) ditd_wl_add(wl, DITD_WL_PACK, (n), (k), &(l)->w, &(l)->b, &(l)->q, __VA_ARGS__)
#define VEC(p, n, ...) ditd_wl_add(wl, DITD_WL_VEC, (n), 0, &(p), NULL, NULL, __VA_ARGS__)
#define QKV(l, sfx, ...)                                                                    \
    do {                                                                                    \
        snprintf(pre, sizeof pre, __VA_ARGS__);                                             \
        ditd_wl_rows_of(ditd_wl_add_fused(wl, DITD_WL_PACK, D, D, &(l)->w, &(l)->b, &(l)->q, \
                                          pre, 3, (sfx)),                                   \
                        a0, A);                                                             \
    } while (0)

static void weight_list(ditd_sd3 *m, ditd_wl *wl)
{
    const ditd_sd3_config *c = &m->cfg;
    int64_t D = c->inner_dim, FF = c->mlp_dim, Dh = c->head_dim, p = c->patch_size;
    int64_t A = m->A, a0 = (int64_t)m->h0 * Dh, F = m->fc, f0 = m->f0; /* this tp rank's */
    int qk = c->qk_norm == DITD_SD3_QK_RMS;
    static const char *const qkv[3] = {"to_q", "to_k", "to_v"};
    static const char *const qkv_c[3] = {"add_q_proj", "add_k_proj", "add_v_proj"};
    char pre[160];

    /* a (D, C, p, p) conv weight: read by load_weights, never packed */
    ditd_wl_add(wl, DITD_WL_DENSE | DITD_WL_OWN_LOAD, D, c->in_channels * p * p, &m->patch_w,
                &m->patch_b, NULL, "pos_embed.proj");
    L1(&m->ctx_emb, D, c->joint_attention_dim, "context_embedder");
    L1(&m->t1, D, TFREQ, "time_text_embed.timestep_embedder.linear_1");
    L1(&m->t2, D, D, "time_text_embed.timestep_embedder.linear_2");
    L1(&m->p1, D, c->pooled_dim, "time_text_embed.text_embedder.linear_1");
    L1(&m->p2, D, D, "time_text_embed.text_embedder.linear_2");
    L1(&m->norm_out, 2 * D, D, "norm_out.linear");
    /* proj_out's rows are (dy, dx, c) already: the unpatchify op's order */
    L1(&m->proj, p * p * c->out_channels, D, "proj_out");
    for (int l = 0; l < c->num_layers; l++) {
        ditd_sd3_block *b = &m->blk[l];
        L1(&b->ada, (b->dual ? 9 : 6) * D, D, "transformer_blocks.%d.norm1.linear", l);
        L1(&b->ada_c, (b->pre_only ? 2 : 6) * D, D, "transformer_blocks.%d.norm1_context.linear",
           l);
        QKV(&b->qkv, qkv, "transformer_blocks.%d.attn", l);
        QKV(&b->qkv_c, qkv_c, "transformer_blocks.%d.attn", l);
        if (qk) {
            VEC(b->nq, Dh, "transformer_blocks.%d.attn.norm_q.weight", l);
            VEC(b->nk, Dh, "transformer_blocks.%d.attn.norm_k.weight", l);
            VEC(b->nq_c, Dh, "transformer_blocks.%d.attn.norm_added_q.weight", l);
            VEC(b->nk_c, Dh, "transformer_blocks.%d.attn.norm_added_k.weight", l);
        }
        ditd_wl_cols_of(L1(&b->out, D, D, "transformer_blocks.%d.attn.to_out.0", l), 1, &a0, &A);
        ditd_wl_rows_of(L1(&b->ff1, FF, D, "transformer_blocks.%d.ff.net.0.proj", l), f0, F);
        ditd_wl_cols_of(L1(&b->ff2, D, FF, "transformer_blocks.%d.ff.net.2", l), 1, &f0, &F);
        if (!b->pre_only) {
            ditd_wl_cols_of(L1(&b->out_c, D, D, "transformer_blocks.%d.attn.to_add_out", l), 1,
                            &a0, &A);
            ditd_wl_rows_of(L1(&b->ff1_c, FF, D, "transformer_blocks.%d.ff_context.net.0.proj", l),
                            f0, F);
            ditd_wl_cols_of(L1(&b->ff2_c, D, FF, "transformer_blocks.%d.ff_context.net.2", l), 1,
                            &f0, &F);
        }
        if (b->dual) {
            QKV(&b->qkv2, qkv, "transformer_blocks.%d.attn2", l);
            ditd_wl_cols_of(L1(&b->out2, D, D, "transformer_blocks.%d.attn2.to_out.0", l), 1, &a0,
                            &A);
            if (qk) {
                VEC(b->nq2, Dh, "transformer_blocks.%d.attn2.norm_q.weight", l);
                VEC(b->nk2, Dh, "transformer_blocks.%d.attn2.norm_k.weight", l);
            }
        }
    }
}
#undef L1
#undef VEC
#undef QKV

/* The linears an adapter may target (engine/models/lora_linear.h), every
 * nn.Linear of SD3Transformer2DModel in Diffusers' module names: the
 * embedders, each block's norm1(_context).linear, attn's to_q/k/v and
 * add_q/k/v_proj (fused: a part each), to_out.0, to_add_out, attn2's
 * (MMDiT-X), the FFNs, norm_out.linear and proj_out (its rows are
 * Diffusers' order, so B adds to them as they are). Under tp each with this
 * rank's slice as weight_list cuts it: the q/k/v parts and ff(_context).
 * net.0 by outputs (heads, MLP columns), to_out.0 / to_add_out /
 * attn2.to_out.0 and ff(_context).net.2 by inputs. None on a backend
 * without the lora op (base.lora_refusal). */
#define ADD(l, cut, n, k, parts, part, ...) \
    ditd_lora_list_add(t, &(l)->lora, (cut), (n), (k), (parts), (part), __VA_ARGS__)
static int lora_targets(ditd_sd3 *m)
{
    const ditd_sd3_config *c = &m->cfg;
    int D = c->inner_dim, FF = c->mlp_dim, Co = c->patch_size * c->patch_size * c->out_channels;
    int a0 = m->h0 * c->head_dim;
    static const char *const qkv[3] = {"to_q", "to_k", "to_v"};
    static const char *const qkv_c[3] = {"add_q_proj", "add_k_proj", "add_v_proj"};
    const ditd_lora_cut all = {DITD_LORA_WHOLE, 0, {0, 0}, {0, 0}};
    const ditd_lora_cut heads = {DITD_LORA_OUT_SLICE, 1, {a0, 0}, {m->A, 0}};
    const ditd_lora_cut mlp = {DITD_LORA_OUT_SLICE, 1, {m->f0, 0}, {m->fc, 0}};
    const ditd_lora_cut heads_in = {DITD_LORA_IN_SLICE, 1, {a0, 0}, {m->A, 0}};
    const ditd_lora_cut mlp_in = {DITD_LORA_IN_SLICE, 1, {m->f0, 0}, {m->fc, 0}};
    ditd_lora_list *t = &m->lora;
    if (!m->ops->lora) {
        m->base.lora_refusal = "this backend has no LoRA op";
        return 0;
    }
    t->tp = m->lay.tp;
    t->cap = 7 + 18 * c->num_layers; /* a dual block: 18 */
    if (!(t->t = calloc((size_t)t->cap, sizeof *t->t)))
        return ditd_err_set(DITD_ENOMEM, "LoRA targets");
    ADD(&m->ctx_emb, all, D, c->joint_attention_dim, 1, NULL, "context_embedder");
    ADD(&m->t1, all, D, TFREQ, 1, NULL, "time_text_embed.timestep_embedder.linear_1");
    ADD(&m->t2, all, D, D, 1, NULL, "time_text_embed.timestep_embedder.linear_2");
    ADD(&m->p1, all, D, c->pooled_dim, 1, NULL, "time_text_embed.text_embedder.linear_1");
    ADD(&m->p2, all, D, D, 1, NULL, "time_text_embed.text_embedder.linear_2");
    ADD(&m->norm_out, all, 2 * D, D, 1, NULL, "norm_out.linear");
    ADD(&m->proj, all, Co, D, 1, NULL, "proj_out");
    for (int l = 0; l < c->num_layers; l++) {
        ditd_sd3_block *b = &m->blk[l];
        ADD(&b->ada, all, (b->dual ? 9 : 6) * D, D, 1, NULL, "transformer_blocks.%d.norm1.linear",
            l);
        ADD(&b->ada_c, all, (b->pre_only ? 2 : 6) * D, D, 1, NULL,
            "transformer_blocks.%d.norm1_context.linear", l);
        ADD(&b->qkv, heads, 3 * D, D, 3, qkv, "transformer_blocks.%d.attn", l);
        ADD(&b->qkv_c, heads, 3 * D, D, 3, qkv_c, "transformer_blocks.%d.attn", l);
        ADD(&b->out, heads_in, D, D, 1, NULL, "transformer_blocks.%d.attn.to_out.0", l);
        ADD(&b->ff1, mlp, FF, D, 1, NULL, "transformer_blocks.%d.ff.net.0.proj", l);
        ADD(&b->ff2, mlp_in, D, FF, 1, NULL, "transformer_blocks.%d.ff.net.2", l);
        if (!b->pre_only) { /* context_pre_only: no to_add_out, no ff_context */
            ADD(&b->out_c, heads_in, D, D, 1, NULL, "transformer_blocks.%d.attn.to_add_out", l);
            ADD(&b->ff1_c, mlp, FF, D, 1, NULL, "transformer_blocks.%d.ff_context.net.0.proj", l);
            ADD(&b->ff2_c, mlp_in, D, FF, 1, NULL, "transformer_blocks.%d.ff_context.net.2", l);
        }
        if (b->dual) {
            ADD(&b->qkv2, heads, 3 * D, D, 3, qkv, "transformer_blocks.%d.attn2", l);
            ADD(&b->out2, heads_in, D, D, 1, NULL, "transformer_blocks.%d.attn2.to_out.0", l);
        }
    }
    if (t->n > t->cap)
        return ditd_err_set(DITD_EINVAL, "SD3 LoRA targets: %d listed, room for %d", t->n, t->cap);
    m->base.lora_targets = t->t;
    m->base.n_lora_targets = t->n;
    return 0;
}
#undef ADD

static int carve_acts(ditd_sd3 *m)
{
    const ditd_sd3_config *c = &m->cfg;
    size_t B = (size_t)m->max_batch, N = (size_t)m->N, Nl = (size_t)m->n_loc, L = (size_t)m->l_loc;
    size_t D = (size_t)c->inner_dim, A = (size_t)m->A, F = (size_t)m->fc;
    size_t p = (size_t)c->patch_size;
    size_t Ci = (size_t)c->in_channels * p * p, Co = (size_t)c->out_channels * p * p;
    ditd_dtype at = m->ops->act_dtype;
    ditd_arena *a = &m->acts;
    int err = 0;

    err |= carve(a, &m->pos, at, N * D);
    err |= carve(a, &m->img, at, B * Nl * D) | carve(a, &m->txt, at, B * L * D);
    err |= carve(a, &m->xn, at, B * Nl * D) | carve(a, &m->tn, at, B * L * D);
    if (c->n_dual)
        err |= carve(a, &m->xn2, at, B * Nl * D);
    err |= carve(a, &m->qkv, at, B * Nl * 3 * A) | carve(a, &m->pqkv, at, B * L * 3 * A);
    err |= carve(a, &m->cat, at, B * Nl * (A + F)) | carve(a, &m->pcat, at, B * L * (A + F));
    err |= carve(a, &m->text_in, at, B * L * (size_t)c->joint_attention_dim);
    err |= carve(a, &m->pooled_in, at, B * (size_t)c->pooled_dim);
    err |= carve(a, &m->tfreq, at, B * TFREQ);
    err |= carve(a, &m->tmp, at, B * D) | carve(a, &m->vec, at, B * D);
    err |= carve(a, &m->svec, at, B * D);
    err |= carve(a, &m->mod, at, B * 9 * D) | carve(a, &m->mod_c, at, B * 6 * D);
    err |= carve(a, &m->scratch, at, B * N * Ci);
    err |= carve(a, &m->tok_out, at, B * N * Co);
    if (m->lora.n) { /* LoRA's rank-r scratch, fp32: the largest M is B Nl or B Ll */
        m->lora_tmp_n = ditd_lora_tmp_floats(B * (Nl > L ? Nl : L));
        err |= carve(a, (void **)&m->lora_tmp, DITD_DTYPE_F32, m->lora_tmp_n);
    }
    if (m->lay.ring * m->lay.ulysses > 1) {
        err |= carve(a, &m->embed, at, B * N * D);
        err |= carve(a, &m->tok_loc, at, B * Nl * Co);
        err |= carve(a, &m->tok_gath, at, B * N * Co);
        err |= carve(a, &m->jqkv, at, B * (L + Nl) * 3 * A);
        err |= carve(a, &m->jo, at, B * (L + Nl) * A);
    }
    return err ? DITD_ENOMEM : 0;
}

/* pos (N, D) := the positional table's (gh, gw) window, centred as
 * PatchEmbed.cropped_pos_embed: top = (M - gh) / 2, left = (M - gw) / 2;
 * window token (r, c) is table token (top + r) M + left + c. From the
 * checkpoint: one slice of gw tokens per window row. Computed: Diffusers'
 * first D/2 channels encode the column, the last D/2 the row, each a
 * function of its own coordinate on the M grid alone. */
static int crop_pos(ditd_sd3 *m)
{
    size_t M = (size_t)m->cfg.pos_embed_max_size, D = (size_t)m->cfg.inner_dim;
    size_t gh = (size_t)m->gh, gw = (size_t)m->gw, half = D / 2;
    size_t top = (M - gh) / 2, left = (M - gw) / 2;
    int64_t shape[3] = {1, (int64_t)(M * M), (int64_t)D};
    float *win = malloc(gh * gw * D * sizeof(float));
    int err = 0;
    if (!win)
        return ditd_err_set(DITD_ENOMEM, "SD3 positional window %zux%zu", gw, gh);
    for (size_t r = 0; r < gh && !err; r++) {
        float *dst = win + r * gw * D;
        if (m->pos_w) {
            err = ditd_weights_read_f32_slice(m->pos_w, m->pos_name, 3, shape, 1,
                                              (int64_t)((top + r) * M + left), (int64_t)gw, dst);
            continue;
        }
        for (size_t c = 0; c < gw; c++) {
            memcpy(dst + c * D, m->pos_cols + (left + c) * D, half * sizeof(float));
            memcpy(dst + c * D + half, m->pos_rows + (top + r) * D + half, half * sizeof(float));
        }
    }
    if (!err)
        m->ops->upload(m->pos, win, gh * gw * D);
    free(win);
    return err;
}

/* The parallel plan and the activations for the current (h, w, L): the
 * split of the text and image tokens, the attentions, every buffer, the
 * cropped positional table. Run at load and again by ditd_sd3_set_size. */
static int plan_acts(ditd_sd3 *m)
{
    const ditd_sd3_config *c = &m->cfg;
    int err;
    ditd_cp_attention_free(m->cpa);
    ditd_cp_attention_free(m->cpa2);
    m->cpa = m->cpa2 = NULL;
    ditd_arena_free(&m->acts);
    int RU = m->lay.ring * m->lay.ulysses;
    if (RU > 1) {
        /* the joint attention over every cp rank's [text slice; image
         * slice], no prefix; each rank's text slice leads (FLUX's plan) */
        int s = m->mesh->ring_rank * m->lay.ulysses + m->mesh->ulysses_rank, toff, tcnt;
        for (int j = 0; j < RU; j++) {
            ditd_split(m->N, RU, j, &m->ioff[j], &m->icnt[j]);
            ditd_split(m->L, RU, j, &toff, &tcnt);
            m->jcnt[j] = tcnt + m->icnt[j];
            m->jlead[j] = tcnt;
            if (j == s) {
                m->txt0 = toff;
                m->l_loc = tcnt;
            }
        }
        if ((err = ditd_cp_attention_new_counts(m->ops, m->mesh, m->max_batch, m->jcnt, m->jlead,
                                                m->hc, c->head_dim, &m->cpa)))
            goto fail;
        m->n_loc = m->icnt[s];
        m->tok0 = m->ioff[s];
    } else {
        /* one rank (or tp alone): the whole text is the attention's prefix */
        if ((err = ditd_cp_attention_new(m->ops, m->mesh, m->max_batch, m->N, m->L, m->hc,
                                         c->head_dim, &m->cpa)))
            goto fail;
        m->n_loc = m->cpa->n_loc;
        m->tok0 = m->cpa->tok0;
        m->l_loc = m->L;
        m->txt0 = 0;
    }
    /* attn2: the image tokens alone, split as the joint attention splits them */
    if (c->n_dual) {
        if ((err = ditd_cp_attention_new(m->ops, m->mesh, m->max_batch, m->N, 0, m->hc,
                                         c->head_dim, &m->cpa2)))
            goto fail;
        if (m->cpa2->n_loc != m->n_loc || m->cpa2->tok0 != m->tok0) {
            err = ditd_err_set(DITD_EINVAL,
                               "SD3 attn2's image split [%d, +%d) is not the joint one [%d, +%d)",
                               m->cpa2->tok0, m->cpa2->n_loc, m->tok0, m->n_loc);
            goto fail;
        }
    }
    if ((err = carve_acts(m)) || (err = ditd_arena_commit(&m->acts, m->acts.peak_plan)) ||
        (err = carve_acts(m)) || (err = crop_pos(m)))
        goto fail;
    return 0;
fail:
    /* no half plan: the forward refuses until a set_size succeeds */
    ditd_cp_attention_free(m->cpa);
    ditd_cp_attention_free(m->cpa2);
    m->cpa = m->cpa2 = NULL;
    return err;
}

static int plan(ditd_sd3 *m, const ditd_mesh *mesh)
{
    int err;
    m->mesh = mesh && mesh->size > 1 ? mesh : NULL;
    m->lay = m->mesh ? mesh->layout : DITD_LAYOUT_SINGLE;
    if (m->mesh && (err = ditd_layout_check_attention(&m->lay, m->cfg.num_heads, m->N)))
        return err;
    /* tp: this rank's heads and MLP columns, as evenly as they go */
    m->tp_rank = m->mesh ? mesh->tp_rank : 0;
    ditd_split(m->cfg.num_heads, m->lay.tp, m->tp_rank, &m->h0, &m->hc);
    ditd_split(m->cfg.mlp_dim, m->lay.tp, m->tp_rank, &m->f0, &m->fc);
    m->A = m->hc * m->cfg.head_dim;
    int RU = m->lay.ring * m->lay.ulysses;
    if (!(m->cnt_a = calloc(6 * (size_t)RU, sizeof(int))) ||
        !(m->h_freq = malloc((size_t)m->max_batch * TFREQ * sizeof(float))))
        return ditd_err_set(DITD_ENOMEM, "SD3 plan");
    m->dsp_a = m->cnt_a + RU;
    m->icnt = m->dsp_a + RU;
    m->ioff = m->icnt + RU;
    m->jcnt = m->ioff + RU;
    m->jlead = m->jcnt + RU;
    m->wl.tp = m->lay.tp; /* named by a split that would cut GGML blocks */
    weight_list(m, &m->wl);
    if ((err = ditd_wl_plan(&m->wl, &m->weights, m->ops, m->src)) ||
        (err = ditd_arena_commit(&m->weights, m->weights.peak_plan)) ||
        (err = ditd_wl_plan(&m->wl, &m->weights, m->ops, m->src)))
        return err;
    return lora_targets(m);
}

/* (height, width, text_len) checked; m's sizes and shapes set to them. */
static int check_sizes(const ditd_sd3_config *c, int height, int width, int text_len)
{
    int p = c->patch_size, lim = c->pos_embed_max_size * p;
    if (height <= 0 || width <= 0 || height % p || width % p || height > lim || width > lim)
        return ditd_err_set(DITD_EINVAL,
                            "SD3 latent size %dx%d: width and height must be positive multiples of patch_size %d, at most pos_embed_max_size x patch_size = %d",
                            width, height, p, lim);
    if (text_len <= 0 || text_len > 65536)
        return ditd_err_set(DITD_EINVAL, "SD3 text length %d (1..65536)", text_len);
    return 0;
}

static void set_sizes(ditd_sd3 *m, int height, int width, int text_len)
{
    m->h = height;
    m->w = width;
    m->gh = height / m->cfg.patch_size;
    m->gw = width / m->cfg.patch_size;
    m->N = m->gh * m->gw;
    m->L = text_len;
    ditd_sd3_shapes(&m->cfg, height, width, text_len, &m->base.shapes);
}

int ditd_sd3_set_size(ditd_sd3 *m, int height, int width, int text_len)
{
    int err;
    if (m->cpa && height == m->h && width == m->w && text_len == m->L)
        return 0;
    /* every check first: a refusal leaves the model as it was */
    if ((err = check_sizes(&m->cfg, height, width, text_len)))
        return err;
    int p = m->cfg.patch_size;
    if (m->mesh && (err = ditd_layout_check_attention(&m->lay, m->cfg.num_heads,
                                                      (height / p) * (width / p))))
        return err;
    set_sizes(m, height, width, text_len);
    return plan_acts(m);
}

void ditd_sd3_free(ditd_sd3 *m)
{
    if (!m)
        return;
    ditd_arena_free(&m->weights);
    ditd_arena_free(&m->acts);
    ditd_cp_attention_free(m->cpa);
    ditd_cp_attention_free(m->cpa2);
    ditd_weights_free(m->pos_w);
    ditd_wl_free(&m->wl);
    free(m->pos_cols);
    free(m->pos_rows);
    free(m->blk);
    free(m->cnt_a);
    free(m->h_freq);
    free(m->lora.t);
    free(m);
}

size_t ditd_sd3_weight_bytes(const ditd_sd3 *m)
{
    return m->weights.size;
}

size_t ditd_sd3_act_bytes(const ditd_sd3 *m)
{
    return m->acts.size + (m->cpa ? ditd_cp_attention_bytes(m->cpa) : 0) +
           (m->cpa2 ? ditd_cp_attention_bytes(m->cpa2) : 0);
}

void ditd_sd3_shapes(const ditd_sd3_config *c, int height, int width, int text_len,
                     ditd_denoiser_shapes *out)
{
    int p = c->patch_size;
    memset(out, 0, sizeof *out);
    out->in_channels = c->in_channels;
    out->out_channels = c->out_channels;
    out->height = height;
    out->width = width;
    out->heads = c->num_heads;
    out->head_dim = c->head_dim;
    out->tokens = (height / p) * (width / p);
    out->prefix_tokens = text_len;
    out->guidance_embed = 0; /* classifier-free guidance */
    out->latent_multiple = p;
    out->cond.kind = DITD_COND_TEXT;
    out->cond.text_len = text_len;
    out->cond.text_dim = c->joint_attention_dim;
    out->cond.pooled_dim = c->pooled_dim;
}

/* ---- loading ---- */

/* a tensor the config says the checkpoint must not have */
#define ABSENT(why, ...)                                                                   \
    do {                                                                                   \
        snprintf(name, sizeof name, __VA_ARGS__);                                          \
        if (ditd_weights_has(w, name))                                                     \
            return ditd_err_set(DITD_EFORMAT, "checkpoint has %s but %s", name, (why));    \
    } while (0)

/* The positional table's source: the checkpoint's persistent buffer
 * pos_embed.pos_embed (1, M*M, D) when it has one (its shape checked here,
 * the checkpoint kept open for set_size's windows; `raw` is its name in the
 * file: read by that name, a window slice goes straight to the file's
 * tensor rather than through an alias), else what PatchEmbed
 * computes (get_2d_sincos_pos_embed over the M x M grid, base_size =
 * sample_size / patch_size, interpolation_scale 1): the column halves of
 * one table row and the row halves of one table column, which give every
 * token's. *st is taken (NULL after) when kept. */
static int pos_source(ditd_sd3 *m, ditd_weights **w, const char *raw)
{
    const ditd_sd3_config *c = &m->cfg;
    int M = c->pos_embed_max_size, D = c->inner_dim, base = c->sample_size / c->patch_size;
    if (ditd_weights_has_raw(*w, raw)) {
        int64_t shape[3] = {1, (int64_t)M * M, D};
        if (ditd_weights_check(*w, raw, 3, shape))
            return ditd_err_set(DITD_EFORMAT,
                                "tensor '%s' is not (1, %d, %d): pos_embed_max_size %d, inner dim %d",
                                raw, M * M, D, M, D);
        snprintf(m->pos_name, sizeof m->pos_name, "%s", raw);
        m->pos_w = *w;
        *w = NULL;
        return 0;
    }
    if (!(m->pos_cols = malloc((size_t)M * (size_t)D * sizeof(float))) ||
        !(m->pos_rows = malloc((size_t)M * (size_t)D * sizeof(float))))
        return ditd_err_set(DITD_ENOMEM, "SD3 positional table halves");
    ditd_cpu_pos_embed_2d(m->pos_cols, D, 1, M, base, 1.0f); /* token c: column c's half first */
    ditd_cpu_pos_embed_2d(m->pos_rows, D, M, 1, base, 1.0f); /* token r: row r's half second */
    return 0;
}

static int load_weights(ditd_sd3 *m, const ditd_weights *w)
{
    const ditd_sd3_config *c = &m->cfg;
    int64_t D = c->inner_dim, p = c->patch_size;
    char name[160];
    int err;
    {
        int64_t shape[4] = {D, c->in_channels, p, p};
        size_t n = (size_t)(D * c->in_channels * p * p);
        float *buf = malloc((n > (size_t)D ? n : (size_t)D) * sizeof(float));
        if (!buf)
            return ditd_err_set(DITD_ENOMEM, "pos_embed.proj");
        if (!(err = ditd_weights_read_f32(w, "pos_embed.proj.weight", 4, shape, buf))) {
            m->ops->upload_weight(m->patch_w, buf, n);
            if (!(err = ditd_weights_read_f32(w, "pos_embed.proj.bias", 1, &D, buf)))
                m->ops->upload_weight(m->patch_b, buf, (size_t)D);
        }
        free(buf);
        if (err)
            return err;
    }
    if ((err = ditd_wl_load(&m->wl, w, m->ops)))
        return err;
    for (int l = 0; l < c->num_layers; l++) {
        if (c->qk_norm != DITD_SD3_QK_RMS)
            ABSENT("config says qk_norm null", "transformer_blocks.%d.attn.norm_q.weight", l);
        if (!m->blk[l].dual)
            ABSENT("config's dual_attention_layers does not list that block",
                   "transformer_blocks.%d.attn2.to_q.weight", l);
    }
    /* more blocks in the checkpoint than the config says would silently
     * drop layers: refuse */
    ABSENT("config says num_layers fewer", "transformer_blocks.%d.norm1.linear.weight",
           c->num_layers);
    return 0;
}
#undef ABSENT

int ditd_sd3_new_mesh(const ditd_sd3_config *cfg, const ditd_backend_ops *ops, int max_batch,
                      int height, int width, int text_len, const char *weights_path,
                      const ditd_mesh *mesh, ditd_sd3 **out)
{
    ditd_weights *st = NULL;
    ditd_orig_map orig = {0};
    char pos_raw[64] = "pos_embed.pos_embed";
    ditd_sd3 *m;
    int is_orig = 0;
    int err;

    if (max_batch <= 0 || max_batch > 4096)
        return ditd_err_set(DITD_EINVAL, "max batch %d (1..4096)", max_batch);
    if (cfg->qk_norm == DITD_SD3_QK_RMS && !ops->rmsnorm_heads)
        return ditd_err_set(DITD_EUNSUPPORTED,
                            "SD3Transformer2DModel with qk_norm rms_norm needs the rmsnorm_heads op, which the %s backend lacks",
                            ops->name);
    if ((err = check_sizes(cfg, height, width, text_len)))
        return err;
    if (!(m = calloc(1, sizeof *m)))
        return ditd_err_set(DITD_ENOMEM, "SD3 model");
    m->cfg = *cfg;
    m->ops = ops;
    m->max_batch = max_batch;
    m->base.max_batch = max_batch;
    ditd_arena_init_mem(&m->weights, ops->mem_alloc, ops->mem_free);
    ditd_arena_init_mem(&m->acts, ops->mem_alloc, ops->mem_free);
    if (!(m->blk = calloc((size_t)cfg->num_layers, sizeof *m->blk))) {
        err = ditd_err_set(DITD_ENOMEM, "SD3 blocks");
        goto fail;
    }
    for (int l = 0; l < cfg->num_layers; l++) {
        m->blk[l].pre_only = l == cfg->num_layers - 1;
        m->blk[l].dual = cfg->dual[l];
    }
    set_sizes(m, height, width, text_len);
    /* the weights first (which linears stay quantized decides their
     * sizes), and the positional table's source before the activations:
     * plan_acts crops the table */
    if ((err = ditd_weights_open(weights_path, &st)) ||
        (err = ditd_sd3_alias_orig(st, cfg, &orig, &is_orig)))
        goto fail;
    m->src = st;
    if ((err = plan(m, mesh)))
        goto fail;
    if (is_orig) {
        static const char *const also[] = {"pos_embed.pos_embed", NULL};
        if ((err = ditd_orig_map_check(&orig, &m->wl, also, "SD3Transformer2DModel")))
            goto fail;
        snprintf(pos_raw, sizeof pos_raw, "%spos_embed", orig.pre);
    }
    if ((err = load_weights(m, st)) || (err = ditd_wl_pack(&m->wl, m->ops, &m->quantized)) ||
        (err = pos_source(m, &st, pos_raw)) || (err = plan_acts(m)))
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
    ditd_sd3_free(m);
    return err;
}
