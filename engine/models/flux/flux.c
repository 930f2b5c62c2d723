/* Diffusers FluxTransformer2DModel: loading and planning (the forward is
 * flux_forward.c). */
#include "engine/models/flux/flux.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/error.h"
#include "engine/io/weights.h"
#include "engine/models/weight_list.h"
#include "kernels/cpu/rope.h"

#define TFREQ 256 /* Timesteps(num_channels=256) of CombinedTimestep*TextProjEmbeddings */

/* ---- planning: the same carve sequence runs twice (count, then hand out) ---- */

static int carve(ditd_arena *a, void **p, ditd_dtype dt, size_t n)
{
    int err;
    *p = ditd_arena_bytes(a, n * ditd_dtype_size(dt), &err);
    return err;
}

/* The model's weight list (engine/models/weight_list.h), written once from
 * the config and this rank's tp plan, walked for planning, loading and
 * packing. Column-parallel (DITD_WL_ROWS): q|k|v and the MLP up
 * projections; row-parallel (DITD_WL_COLS): to_out.0, to_add_out, the MLP
 * down projections and the single blocks' proj_out in its two packed
 * input blocks [attention | MLP]. */
#define L1(l, fl, n, k, ...) ditd_wl_add(wl, (fl), (n), (k), &(l)->w, &(l)->b, &(l)->q, __VA_ARGS__)
#define VEC(p, n, ...) ditd_wl_add(wl, DITD_WL_VEC, (n), 0, &(p), NULL, NULL, __VA_ARGS__)

static void weight_list(ditd_flux *m, ditd_wl *wl)
{
    const ditd_flux_config *c = &m->cfg;
    int64_t D = c->inner_dim, Dh = c->head_dim, FF = c->mlp_dim;
    int64_t A = m->A, F = m->fc, a0 = (int64_t)m->h0 * Dh, f0 = m->f0; /* this tp rank's */
    const int P = DITD_WL_PACK;
    static const char *const qkv[3] = {"to_q", "to_k", "to_v"};
    static const char *const qkv_c[3] = {"add_q_proj", "add_k_proj", "add_v_proj"};
    char pre[160];

    L1(&m->x_emb, DITD_WL_DENSE, D, c->in_channels, "x_embedder");
    L1(&m->ctx_emb, P, D, c->joint_attention_dim, "context_embedder");
    L1(&m->t1, P, D, TFREQ, "time_text_embed.timestep_embedder.linear_1");
    L1(&m->t2, P, D, D, "time_text_embed.timestep_embedder.linear_2");
    if (c->guidance_embeds) {
        L1(&m->g1, P, D, TFREQ, "time_text_embed.guidance_embedder.linear_1");
        L1(&m->g2, P, D, D, "time_text_embed.guidance_embedder.linear_2");
    }
    L1(&m->p1, P, D, c->pooled_dim, "time_text_embed.text_embedder.linear_1");
    L1(&m->p2, P, D, D, "time_text_embed.text_embedder.linear_2");
    L1(&m->norm_out, P, 2 * D, D, "norm_out.linear");
    /* rows re-laid at load (load_proj) */
    L1(&m->proj, P | DITD_WL_DENSE | DITD_WL_OWN_LOAD, c->out_channels, D,
       "proj_out");
    for (int l = 0; l < c->num_layers; l++) {
        ditd_flux_double *b = &m->dbl[l];
        L1(&b->ada, P, 6 * D, D, "transformer_blocks.%d.norm1.linear", l);
        L1(&b->ada_c, P, 6 * D, D, "transformer_blocks.%d.norm1_context.linear", l);
        snprintf(pre, sizeof pre, "transformer_blocks.%d.attn", l);
        ditd_wl_rows_of(ditd_wl_add_fused(wl, P, D, D, &b->qkv.w, &b->qkv.b, &b->qkv.q, pre, 3, qkv),
                        a0, A);
        ditd_wl_rows_of(ditd_wl_add_fused(wl, P, D, D, &b->qkv_c.w, &b->qkv_c.b, &b->qkv_c.q, pre,
                                          3, qkv_c),
                        a0, A);
        VEC(b->nq, Dh, "transformer_blocks.%d.attn.norm_q.weight", l);
        VEC(b->nk, Dh, "transformer_blocks.%d.attn.norm_k.weight", l);
        VEC(b->nq_c, Dh, "transformer_blocks.%d.attn.norm_added_q.weight", l);
        VEC(b->nk_c, Dh, "transformer_blocks.%d.attn.norm_added_k.weight", l);
        ditd_wl_cols_of(L1(&b->out, P, D, D, "transformer_blocks.%d.attn.to_out.0", l), 1, &a0, &A);
        ditd_wl_cols_of(L1(&b->out_c, P, D, D, "transformer_blocks.%d.attn.to_add_out", l), 1, &a0,
                        &A);
        ditd_wl_rows_of(L1(&b->ff1, P, FF, D, "transformer_blocks.%d.ff.net.0.proj", l), f0, F);
        ditd_wl_cols_of(L1(&b->ff2, P, D, FF, "transformer_blocks.%d.ff.net.2", l), 1, &f0, &F);
        ditd_wl_rows_of(L1(&b->ff1_c, P, FF, D, "transformer_blocks.%d.ff_context.net.0.proj", l),
                        f0, F);
        ditd_wl_cols_of(L1(&b->ff2_c, P, D, FF, "transformer_blocks.%d.ff_context.net.2", l), 1,
                        &f0, &F);
    }
    for (int l = 0; l < c->num_single_layers; l++) {
        ditd_flux_single *b = &m->sgl[l];
        L1(&b->ada, P, 3 * D, D, "single_transformer_blocks.%d.norm.linear", l);
        snprintf(pre, sizeof pre, "single_transformer_blocks.%d.attn", l);
        ditd_wl_rows_of(ditd_wl_add_fused(wl, P, D, D, &b->qkv.w, &b->qkv.b, &b->qkv.q, pre, 3, qkv),
                        a0, A);
        VEC(b->nq, Dh, "single_transformer_blocks.%d.attn.norm_q.weight", l);
        VEC(b->nk, Dh, "single_transformer_blocks.%d.attn.norm_k.weight", l);
        ditd_wl_rows_of(L1(&b->mlp, P, FF, D, "single_transformer_blocks.%d.proj_mlp", l), f0, F);
        /* (D, D + FF) in the file; this rank's attention then MLP columns */
        const int64_t c0[2] = {a0, D + f0}, cn[2] = {A, F};
        ditd_wl_cols_of(L1(&b->out, P, D, D + FF, "single_transformer_blocks.%d.proj_out", l), 2,
                        c0, cn);
    }
}
#undef L1
#undef VEC

/* This rank's tp slice of the next lora_add's targets (lora_targets). */
typedef struct lora_cut {
    ditd_lora_shard shard;
    int n_rng, off[2], len[2];
} lora_cut;

static const lora_cut WHOLE = {DITD_LORA_WHOLE, 0, {0, 0}, {0, 0}};

/* One LoRA target (parts > 1: name.<part[i]> for each of the fused parts,
 * each n_out / parts outputs), cut as `cut` says (a fused part: its own
 * block's slice). */
static void lora_add(ditd_flux *m, ditd_flux_lin *l, lora_cut cut, int n_out, int k_in,
                     int parts, const char *const *part, const char *fmt, ...)
{
    char name[sizeof m->lora_t->name];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    l->lora = m->n_lora_t + 1;
    l->lora_parts = parts;
    for (int i = 0; i < parts; i++) {
        ditd_lora_target *t = &m->lora_t[m->n_lora_t++];
        if (parts > 1)
            snprintf(t->name, sizeof t->name, "%s.%s", name, part[i]);
        else
            snprintf(t->name, sizeof t->name, "%s", name);
        t->n_out = n_out / parts;
        t->k_in = k_in;
        if (m->lay.tp > 1)
            ditd_lora_target_slice(t, cut.shard, cut.n_rng, cut.off, cut.len);
    }
}

/* The linears an adapter may target, in Diffusers' module names, with
 * this rank's tp slices as weight_list cuts them; none on a backend
 * without the lora op (base.lora_refusal). */
static int lora_targets(ditd_flux *m)
{
    const ditd_flux_config *c = &m->cfg;
    int D = c->inner_dim, FF = c->mlp_dim, a0 = m->h0 * c->head_dim;
    static const char *const qkv[3] = {"to_q", "to_k", "to_v"};
    static const char *const qkv_c[3] = {"add_q_proj", "add_k_proj", "add_v_proj"};
    const lora_cut heads = {DITD_LORA_OUT_SLICE, 1, {a0, 0}, {m->A, 0}};
    const lora_cut mlp = {DITD_LORA_OUT_SLICE, 1, {m->f0, 0}, {m->fc, 0}};
    const lora_cut heads_in = {DITD_LORA_IN_SLICE, 1, {a0, 0}, {m->A, 0}};
    const lora_cut mlp_in = {DITD_LORA_IN_SLICE, 1, {m->f0, 0}, {m->fc, 0}};
    /* the single blocks' proj_out reads [attention | MLP] */
    const lora_cut cat_in = {DITD_LORA_IN_SLICE, 2, {a0, D + m->f0}, {m->A, m->fc}};
    if (!m->ops->lora) {
        m->base.lora_refusal = "this backend has no LoRA op";
        return 0;
    }
    size_t n = 10 + 14 * (size_t)c->num_layers + 6 * (size_t)c->num_single_layers;
    if (!(m->lora_t = calloc(n, sizeof *m->lora_t)))
        return ditd_err_set(DITD_ENOMEM, "LoRA targets");
    /* x_embedder runs as a patch embedding: its term reads the op's patches
     * (flux_forward.c); replicated under tp */
    lora_add(m, &m->x_emb, WHOLE, D, c->in_channels, 1, NULL, "x_embedder");
    lora_add(m, &m->ctx_emb, WHOLE, D, c->joint_attention_dim, 1, NULL, "context_embedder");
    lora_add(m, &m->t1, WHOLE, D, TFREQ, 1, NULL, "time_text_embed.timestep_embedder.linear_1");
    lora_add(m, &m->t2, WHOLE, D, D, 1, NULL, "time_text_embed.timestep_embedder.linear_2");
    if (c->guidance_embeds) {
        lora_add(m, &m->g1, WHOLE, D, TFREQ, 1, NULL, "time_text_embed.guidance_embedder.linear_1");
        lora_add(m, &m->g2, WHOLE, D, D, 1, NULL, "time_text_embed.guidance_embedder.linear_2");
    }
    lora_add(m, &m->p1, WHOLE, D, c->pooled_dim, 1, NULL, "time_text_embed.text_embedder.linear_1");
    lora_add(m, &m->p2, WHOLE, D, D, 1, NULL, "time_text_embed.text_embedder.linear_2");
    lora_add(m, &m->norm_out, WHOLE, 2 * D, D, 1, NULL, "norm_out.linear");
    /* proj_out's rows are re-laid at load (load_proj): B's rows follow */
    lora_add(m, &m->proj, WHOLE, c->out_channels, D, 1, NULL, "proj_out");
    m->lora_t[m->n_lora_t - 1].row_groups = 4;
    for (int l = 0; l < c->num_layers; l++) {
        ditd_flux_double *b = &m->dbl[l];
        lora_add(m, &b->ada, WHOLE, 6 * D, D, 1, NULL, "transformer_blocks.%d.norm1.linear", l);
        lora_add(m, &b->ada_c, WHOLE, 6 * D, D, 1, NULL,
                 "transformer_blocks.%d.norm1_context.linear", l);
        lora_add(m, &b->qkv, heads, 3 * D, D, 3, qkv, "transformer_blocks.%d.attn", l);
        lora_add(m, &b->qkv_c, heads, 3 * D, D, 3, qkv_c, "transformer_blocks.%d.attn", l);
        lora_add(m, &b->out, heads_in, D, D, 1, NULL, "transformer_blocks.%d.attn.to_out.0", l);
        lora_add(m, &b->out_c, heads_in, D, D, 1, NULL, "transformer_blocks.%d.attn.to_add_out", l);
        lora_add(m, &b->ff1, mlp, FF, D, 1, NULL, "transformer_blocks.%d.ff.net.0.proj", l);
        lora_add(m, &b->ff2, mlp_in, D, FF, 1, NULL, "transformer_blocks.%d.ff.net.2", l);
        lora_add(m, &b->ff1_c, mlp, FF, D, 1, NULL,
                 "transformer_blocks.%d.ff_context.net.0.proj", l);
        lora_add(m, &b->ff2_c, mlp_in, D, FF, 1, NULL, "transformer_blocks.%d.ff_context.net.2", l);
    }
    for (int l = 0; l < c->num_single_layers; l++) {
        ditd_flux_single *b = &m->sgl[l];
        lora_add(m, &b->ada, WHOLE, 3 * D, D, 1, NULL,
                 "single_transformer_blocks.%d.norm.linear", l);
        lora_add(m, &b->qkv, heads, 3 * D, D, 3, qkv, "single_transformer_blocks.%d.attn", l);
        lora_add(m, &b->mlp, mlp, FF, D, 1, NULL, "single_transformer_blocks.%d.proj_mlp", l);
        lora_add(m, &b->out, cat_in, D, D + FF, 1, NULL,
                 "single_transformer_blocks.%d.proj_out", l);
    }
    m->base.lora_targets = m->lora_t;
    m->base.n_lora_targets = m->n_lora_t;
    return 0;
}

static int carve_acts(ditd_flux *m)
{
    const ditd_flux_config *c = &m->cfg;
    size_t B = (size_t)m->max_batch, N = (size_t)m->NT, Nl = (size_t)m->n_loc, L = (size_t)m->l_loc;
    size_t Np = (size_t)(m->N > m->Nr ? m->N : m->Nr); /* the largest one packing */
    size_t D = (size_t)c->inner_dim, Dh = (size_t)c->head_dim;
    size_t A = (size_t)m->A, F = (size_t)m->fc;
    size_t Ci = (size_t)c->in_channels, Co = (size_t)c->out_channels;
    ditd_dtype at = m->ops->act_dtype;
    ditd_arena *a = &m->acts;
    int err = 0;

    err |= carve(a, &m->img, at, B * Nl * D) | carve(a, &m->txt, at, B * L * D);
    err |= carve(a, &m->xn, at, B * Nl * D) | carve(a, &m->tn, at, B * L * D);
    err |= carve(a, &m->qkv, at, B * Nl * 3 * A) | carve(a, &m->pqkv, at, B * L * 3 * A);
    err |= carve(a, &m->cat, at, B * Nl * (A + F)) | carve(a, &m->pcat, at, B * L * (A + F));
    err |= carve(a, &m->text_in, at, B * L * (size_t)c->joint_attention_dim);
    err |= carve(a, &m->pooled_in, at, B * (size_t)c->pooled_dim);
    err |= carve(a, &m->tfreq, at, B * TFREQ);
    err |= carve(a, &m->tmp, at, B * D) | carve(a, &m->vec, at, B * D);
    err |= carve(a, &m->svec, at, B * D);
    err |= carve(a, &m->mod, at, B * 6 * D) | carve(a, &m->mod_c, at, B * 6 * D);
    /* the RoPE table stays fp32 on every backend, as Diffusers keeps it */
    err |= carve(a, &m->rope_cos, DITD_DTYPE_F32, N * Dh / 2) |
           carve(a, &m->rope_sin, DITD_DTYPE_F32, N * Dh / 2);
    err |= carve(a, &m->scratch, at, B * Np * Ci);
    err |= carve(a, &m->tok_out, at, B * N * Co);
    if (m->n_lora_t) { /* LoRA's rank-r scratch, fp32 */
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

/* The RoPE table of the image tokens: ids (0, row, col) of each packed
 * token, as FluxPipeline._prepare_latent_image_ids; then a reference's
 * (1, row, col) over its own grid (FluxKontextPipeline.prepare_latents:
 * image_ids[..., 0] = 1). */
static int rope_tables(ditd_flux *m)
{
    size_t N = (size_t)m->NT, half = (size_t)m->cfg.head_dim / 2;
    float *ids = malloc(N * 3 * sizeof(float));
    float *cs = malloc(2 * N * half * sizeof(float));
    if (!ids || !cs) {
        free(ids);
        free(cs);
        return ditd_err_set(DITD_ENOMEM, "RoPE table of %zu tokens", N);
    }
    for (int r = 0; r < m->gh; r++)
        for (int col = 0; col < m->gw; col++) {
            float *id = ids + ((size_t)r * (size_t)m->gw + (size_t)col) * 3;
            id[0] = 0.0f;
            id[1] = (float)r;
            id[2] = (float)col;
        }
    for (int r = 0; r < m->rgh; r++)
        for (int col = 0; col < m->rgw; col++) {
            float *id = ids + ((size_t)m->N + (size_t)r * (size_t)m->rgw + (size_t)col) * 3;
            id[0] = 1.0f;
            id[1] = (float)r;
            id[2] = (float)col;
        }
    ditd_cpu_rope_table(ids, (int)N, DITD_FLUX_AXES, m->cfg.axes_dims, 10000.0, cs, cs + N * half);
    m->ops->upload_f32(m->rope_cos, cs, N * half);
    m->ops->upload_f32(m->rope_sin, cs + N * half, N * half);
    free(ids);
    free(cs);
    return 0;
}

/* The parallel plan and the activations for the current (h, w, L): the
 * split of the text and image tokens, the attention, every buffer, the RoPE table.
 * Run at load and again by ditd_flux_set_size (the old ones freed first). */
static int plan_acts(ditd_flux *m)
{
    const ditd_flux_config *c = &m->cfg;
    int err;
    ditd_cp_attention_free(m->cpa);
    m->cpa = NULL;
    ditd_arena_free(&m->acts);
    int RU = m->lay.ring * m->lay.ulysses;
    if (RU > 1) {
        /* the joint attention over every cp rank's [text slice; image slice],
         * no prefix (Diffusers' _cp_plan splits both streams) */
        int s = m->mesh->ring_rank * m->lay.ulysses + m->mesh->ulysses_rank, toff, tcnt;
        for (int j = 0; j < RU; j++) {
            ditd_split(m->NT, RU, j, &m->ioff[j], &m->icnt[j]);
            ditd_split(m->L, RU, j, &toff, &tcnt);
            m->jcnt[j] = tcnt + m->icnt[j];
            m->jlead[j] = tcnt;
            if (j == s) {
                m->txt0 = toff;
                m->l_loc = tcnt;
            }
        }
        /* lead: each rank's text slice comes first (ulysses alone then
         * attends segment-wise, the bits of one rank's text prefix path) */
        if ((err = ditd_cp_attention_new_counts(m->ops, m->mesh, m->max_batch, m->jcnt, m->jlead,
                                                m->hc, c->head_dim, &m->cpa)))
            return err;
        m->n_loc = m->icnt[s];
        m->tok0 = m->ioff[s];
    } else {
        /* one rank (or tp alone): the whole text is the attention's prefix */
        if ((err = ditd_cp_attention_new(m->ops, m->mesh, m->max_batch, m->NT, m->L, m->hc,
                                         c->head_dim, &m->cpa)))
            return err;
        m->n_loc = m->cpa->n_loc;
        m->tok0 = m->cpa->tok0;
        m->l_loc = m->L;
        m->txt0 = 0;
    }
    if ((err = carve_acts(m)) || (err = ditd_arena_commit(&m->acts, m->acts.peak_plan)) ||
        (err = carve_acts(m)))
        return err;
    return rope_tables(m);
}

static int plan(ditd_flux *m, const ditd_mesh *mesh)
{
    int err;
    m->mesh = mesh && mesh->size > 1 ? mesh : NULL;
    m->lay = m->mesh ? mesh->layout : DITD_LAYOUT_SINGLE;
    if (m->mesh && (err = ditd_layout_check_attention(&m->lay, m->cfg.num_heads, m->NT)))
        return err;
    /* tp: this rank's heads and MLP columns, as evenly as they go */
    m->tp_rank = m->mesh ? mesh->tp_rank : 0;
    ditd_split(m->cfg.num_heads, m->lay.tp, m->tp_rank, &m->h0, &m->hc);
    ditd_split(m->cfg.mlp_dim, m->lay.tp, m->tp_rank, &m->f0, &m->fc);
    m->A = m->hc * m->cfg.head_dim;
    int RU = m->lay.ring * m->lay.ulysses;
    if (!(m->cnt_a = calloc(6 * (size_t)RU, sizeof(int))) ||
        !(m->h_freq = malloc((size_t)m->max_batch * TFREQ * sizeof(float))))
        return ditd_err_set(DITD_ENOMEM, "FLUX plan");
    m->dsp_a = m->cnt_a + RU;
    m->icnt = m->dsp_a + RU;
    m->ioff = m->icnt + RU;
    m->jcnt = m->ioff + RU;
    m->jlead = m->jcnt + RU;
    m->wl.tp = m->lay.tp; /* named by a split that would cut GGML blocks */
    weight_list(m, &m->wl);
    if ((err = ditd_wl_plan(&m->wl, &m->weights, m->ops, m->src)) ||
        (err = ditd_arena_commit(&m->weights, m->weights.peak_plan)) ||
        (err = ditd_wl_plan(&m->wl, &m->weights, m->ops, m->src)) || (err = lora_targets(m)))
        return err;
    return plan_acts(m);
}

/* (height, width, text_len) checked; m's sizes and shapes set to them. */
static int set_sizes(ditd_flux *m, int height, int width, int text_len)
{
    if (height <= 0 || width <= 0 || height % 2 || width % 2 || height > 16384 || width > 16384)
        return ditd_err_set(DITD_EINVAL,
                            "FLUX latent size %dx%d: width and height must be positive and even (2x2 packing)",
                            width, height);
    if (text_len <= 0 || text_len > 65536)
        return ditd_err_set(DITD_EINVAL, "FLUX text length %d (1..65536)", text_len);
    m->h = height;
    m->w = width;
    m->gh = height / 2;
    m->gw = width / 2;
    m->N = m->gh * m->gw;
    m->L = text_len;
    m->NT = m->N + m->Nr;
    ditd_flux_shapes(&m->cfg, height, width, text_len, &m->base.shapes);
    m->base.shapes.ref_height = m->rh;
    m->base.shapes.ref_width = m->rw;
    return 0;
}

int ditd_flux_set_size(ditd_flux *m, int height, int width, int text_len)
{
    int err;
    if (m->cpa && height == m->h && width == m->w && text_len == m->L)
        return 0;
    /* the layout against the new token count first: a refusal leaves the
     * model as it was */
    if (m->mesh && (err = ditd_layout_check_attention(&m->lay, m->cfg.num_heads,
                                                      (height / 2) * (width / 2) + m->Nr)))
        return err;
    if ((err = set_sizes(m, height, width, text_len)))
        return err;
    return plan_acts(m);
}

int ditd_flux_set_reference(ditd_flux *m, int ref_height, int ref_width)
{
    int err;
    if (m->cpa && ref_height == m->rh && ref_width == m->rw)
        return 0;
    if (ref_height < 0 || ref_width < 0 || ref_height % 2 || ref_width % 2 ||
        ref_height > 16384 || ref_width > 16384 || (!ref_height != !ref_width))
        return ditd_err_set(DITD_EINVAL, "FLUX reference latents %dx%d: both even and positive "
                            "(2x2 packing), or 0x0 for none", ref_width, ref_height);
    int nr = (ref_height / 2) * (ref_width / 2);
    if (m->mesh && (err = ditd_layout_check_attention(&m->lay, m->cfg.num_heads, m->N + nr)))
        return err;
    m->rh = ref_height;
    m->rw = ref_width;
    m->rgh = ref_height / 2;
    m->rgw = ref_width / 2;
    m->Nr = nr;
    if ((err = set_sizes(m, m->h, m->w, m->L)))
        return err;
    return plan_acts(m);
}

void ditd_flux_free(ditd_flux *m)
{
    if (!m)
        return;
    ditd_wl_free(&m->wl);
    ditd_arena_free(&m->weights);
    ditd_arena_free(&m->acts);
    ditd_cp_attention_free(m->cpa);
    free(m->dbl);
    free(m->sgl);
    free(m->cnt_a);
    free(m->h_freq);
    free(m->lora_t);
    free(m);
}

size_t ditd_flux_weight_bytes(const ditd_flux *m)
{
    return m->weights.size;
}

size_t ditd_flux_act_bytes(const ditd_flux *m)
{
    return m->acts.size + (m->cpa ? ditd_cp_attention_bytes(m->cpa) : 0);
}

void ditd_flux_shapes(const ditd_flux_config *c, int height, int width, int text_len,
                      ditd_denoiser_shapes *out)
{
    memset(out, 0, sizeof *out);
    out->in_channels = c->latent_channels;
    out->out_channels = c->out_channels / 4;
    out->height = height;
    out->width = width;
    out->heads = c->num_heads;
    out->head_dim = c->head_dim;
    out->tokens = (height / 2) * (width / 2);
    out->prefix_tokens = text_len;
    out->guidance_embed = c->guidance_embeds;
    out->latent_multiple = 2; /* 2x2 packing */
    out->cond.kind = DITD_COND_TEXT;
    out->cond.text_len = text_len;
    out->cond.text_dim = c->joint_attention_dim;
    out->cond.pooled_dim = c->pooled_dim;
}

/* ---- loading ---- */

/* proj_out: rows (c, dy, dx) -> (dy, dx, c), the unpatchify op's order. */
static int load_proj(ditd_flux *m, const ditd_weights *st)
{
    int64_t Co = m->cfg.out_channels, D = m->cfg.inner_dim, C = Co / 4;
    float *src = malloc((size_t)(Co * D) * sizeof(float));
    float *tmp = malloc((size_t)(Co * D) * sizeof(float));
    int err;
    if (!src || !tmp) {
        err = ditd_err_set(DITD_ENOMEM, "proj_out");
        goto out;
    }
    if ((err = ditd_weights_read_f32(st, "proj_out.weight", 2, (int64_t[]){Co, D}, src)))
        goto out;
    for (int64_t r = 0; r < Co; r++) /* r = ch*4 + q, q = dy*2 + dx */
        memcpy(tmp + ((r % 4) * C + r / 4) * D, src + r * D, (size_t)D * sizeof(float));
    m->ops->upload_weight(m->proj.w, tmp, (size_t)(Co * D));
    if ((err = ditd_weights_read_f32(st, "proj_out.bias", 1, (int64_t[]){Co}, src)))
        goto out;
    for (int64_t r = 0; r < Co; r++)
        tmp[(r % 4) * C + r / 4] = src[r];
    m->ops->upload_weight(m->proj.b, tmp, (size_t)Co);
out:
    free(src);
    free(tmp);
    return err;
}

static int load_weights(ditd_flux *m, const ditd_weights *st)
{
    const ditd_flux_config *c = &m->cfg;
    char name[160];
    int err;
    if (!c->guidance_embeds &&
        ditd_weights_has(st, "time_text_embed.guidance_embedder.linear_1.weight"))
        return ditd_err_set(DITD_EFORMAT,
                            "checkpoint has time_text_embed.guidance_embedder but config says guidance_embeds false");
    if ((err = ditd_wl_load(&m->wl, st, m->ops)) || (err = load_proj(m, st)))
        return err;
    /* more blocks in the checkpoint than the config says would silently
     * drop layers: refuse */
    snprintf(name, sizeof name, "transformer_blocks.%d.norm1.linear.weight", c->num_layers);
    if (ditd_weights_has(st, name))
        return ditd_err_set(DITD_EFORMAT, "checkpoint has %s but config says num_layers %d", name,
                            c->num_layers);
    snprintf(name, sizeof name, "single_transformer_blocks.%d.norm.linear.weight",
             c->num_single_layers);
    if (ditd_weights_has(st, name))
        return ditd_err_set(DITD_EFORMAT,
                            "checkpoint has %s but config says num_single_layers %d", name,
                            c->num_single_layers);
    return 0;
}

int ditd_flux_new_mesh(const ditd_flux_config *cfg, const ditd_backend_ops *ops, int max_batch,
                       int height, int width, int text_len, const char *weights_path,
                       const ditd_mesh *mesh, ditd_flux **out)
{
    ditd_weights *st = NULL;
    ditd_flux *m;
    int bfl = 0;
    int err;

    if (max_batch <= 0 || max_batch > 4096)
        return ditd_err_set(DITD_EINVAL, "max batch %d (1..4096)", max_batch);
    if (!ops->rope || !ops->rmsnorm_heads || !ops->upload_f32)
        return ditd_err_set(DITD_EUNSUPPORTED,
                            "FluxTransformer2DModel needs the rope, rmsnorm_heads and upload_f32 ops, which the %s backend lacks yet",
                            ops->name);
    if (!(m = calloc(1, sizeof *m)))
        return ditd_err_set(DITD_ENOMEM, "FLUX model");
    m->cfg = *cfg;
    m->ops = ops;
    m->max_batch = max_batch;
    m->base.max_batch = max_batch;
    ditd_arena_init_mem(&m->weights, ops->mem_alloc, ops->mem_free);
    ditd_arena_init_mem(&m->acts, ops->mem_alloc, ops->mem_free);
    m->dbl = calloc((size_t)cfg->num_layers + 1, sizeof *m->dbl);
    m->sgl = calloc((size_t)cfg->num_single_layers + 1, sizeof *m->sgl);
    if (!m->dbl || !m->sgl) {
        err = ditd_err_set(DITD_ENOMEM, "FLUX blocks");
        goto fail;
    }
    /* the weights first: which linears stay quantized decides their sizes */
    if ((err = ditd_weights_open(weights_path, &st)) ||
        (err = ditd_flux_alias_bfl(st, cfg, &bfl)))
        goto fail;
    m->src = st;
    if ((err = set_sizes(m, height, width, text_len)) || (err = plan(m, mesh)) ||
        (err = load_weights(m, st)) ||
        (err = ditd_wl_pack(&m->wl, m->ops, &m->quantized)))
        goto fail;
    m->src = NULL;
    ditd_wl_free(&m->wl); /* the list is the loading's; the forward reads m */
    ditd_weights_free(st);
    *out = m;
    return 0;
fail:
    ditd_weights_free(st);
    ditd_flux_free(m);
    return err;
}
