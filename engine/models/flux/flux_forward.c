/* Diffusers FluxTransformer2DModel forward (engine/models/flux/flux.h): the
 * embeddings, the double- and single-stream blocks, the output layer. */
#include <math.h>
#include <stdlib.h>

#include "engine/core/error.h"
#include "engine/models/flux/flux.h"
#include "engine/parallel/comm.h"
#include "kernels/cpu/rope.h"

#define TFREQ 256     /* Timesteps(num_channels=256) */
#define FLUX_EPS 1e-6f /* every LayerNorm and RMSNorm of the model (Diffusers' fixed eps) */

static void *at(const ditd_flux *m, const void *p, size_t elems)
{
    return ditd_ptr_act(m->ops, p, elems);
}

/* A linear layer, its weight dense or kept in GGML blocks (flux.h). */
/* With the rows' LoRA adapters on it (engine/models/lora.h): the linear
 * runs without its activation, the adapters' term follows, then the
 * activation (PEFT wraps the Linear). M is fwd_B samples of M / fwd_B rows;
 * a fused linear's parts each take their block of N / parts columns. */
static void linear_any(const ditd_flux *m, const void *x, size_t ldx, const ditd_flux_lin *l,
                       const void *b, void *y, size_t ldy, int M, int N, int K, ditd_act act)
{
    const ditd_lora_set *const *ls = m->base.loras;
    int B = m->fwd_B, touch = 0;
    for (int p = 0; ls && l->lora && p < l->lora_parts; p++)
        touch |= ditd_lora_touches(ls, B, l->lora - 1 + p);
    ditd_act a0 = touch ? DITD_ACT_NONE : act;
    if (l->q.data)
        m->ops->linear_q(x, ldx, &l->q, b, y, ldy, M, a0);
    else
        m->ops->linear(x, ldx, l->w, b, y, ldy, M, N, K, a0);
    if (!touch)
        return;
    int np = l->lora_parts, Np = N / np;
    for (int p = 0; p < np; p++) /* a fused linear has no activation */
        ditd_lora_apply(m->ops, ls, B, M / B, l->lora - 1 + p, x, ldx,
                        at(m, y, (size_t)p * (size_t)Np), ldy, Np, K, np > 1 ? DITD_ACT_NONE : act,
                        m->lora_tmp, m->lora_tmp_n);
}

static void lin(const ditd_flux *m, const void *x, size_t ldx, const ditd_flux_lin *l, void *y,
                size_t ldy, int M, int N, int K, ditd_act act)
{
    linear_any(m, x, ldx, l, l->b, y, ldy, M, N, K, act);
}

/* A row-parallel Linear (tp: this rank's input columns, partial sums, the
 * bias once on tp rank 0, then the all-reduce): y (M, D) from x (M, K). */
static int row_lin(const ditd_flux *m, const void *x, size_t ldx, const ditd_flux_lin *l, void *y,
                   int M, int K)
{
    int D = m->cfg.inner_dim;
    linear_any(m, x, ldx, l, m->tp_rank == 0 ? l->b : NULL, y, (size_t)D, M, D, K,
               DITD_ACT_NONE);
    if (m->lay.tp > 1)
        return ditd_comm_allreduce_sum(m->mesh->tp_comm, m->ops->act_dtype, y,
                                       (size_t)M * (size_t)D);
    return 0;
}

/* A TimestepEmbedding (linear_1, SiLU, linear_2) of the features in tfreq,
 * (B, 256) -> dst (B, D). */
static void timestep_embedding(ditd_flux *m, int B, const ditd_flux_lin *l1,
                               const ditd_flux_lin *l2, void *dst)
{
    int D = m->cfg.inner_dim;
    lin(m, m->tfreq, TFREQ, l1, m->tmp, (size_t)D, B, D, TFREQ, DITD_ACT_SILU);
    lin(m, m->tmp, (size_t)D, l2, dst, (size_t)D, B, D, D, DITD_ACT_NONE);
}

/* vec (B, D) = TimestepEmbedding(proj(t)) [+ GuidanceEmbedding(proj(1000 g))]
 *            + PixArtAlphaTextProjection(pooled); svec = SiLU(vec). */
static void conditioning(ditd_flux *m, int B, const float *h_t, const float *h_guidance)
{
    const ditd_backend_ops *ops = m->ops;
    const ditd_flux_config *c = &m->cfg;
    int D = c->inner_dim;
    size_t BD = (size_t)B * (size_t)D;

    /* the features of t as Diffusers computes them, in float32 (timestep
     * / 1000 * 1000 is t again); FLUX's Timesteps has downscale_freq_shift 0 */
    ditd_cpu_timestep_features(h_t, m->h_freq, B, TFREQ, 0.0f);
    ops->upload(m->tfreq, m->h_freq, (size_t)B * TFREQ);
    timestep_embedding(m, B, &m->t1, &m->t2, m->vec);
    if (c->guidance_embeds) {
        for (int b = 0; b < B; b++) { /* guidance * 1000, then float32 as time_proj does */
            float g = (float)((double)h_guidance[b] * 1000.0);
            ditd_cpu_timestep_features(&g, m->h_freq + (size_t)b * TFREQ, 1, TFREQ, 0.0f);
        }
        ops->upload(m->tfreq, m->h_freq, (size_t)B * TFREQ);
        timestep_embedding(m, B, &m->g1, &m->g2, m->svec);
        ops->add(m->vec, m->svec, BD);
    }
    lin(m, m->pooled_in, (size_t)c->pooled_dim, &m->p1, m->tmp, (size_t)D, B, D, c->pooled_dim,
        DITD_ACT_SILU);
    lin(m, m->tmp, (size_t)D, &m->p2, m->svec, (size_t)D, B, D, D, DITD_ACT_NONE);
    ops->add(m->vec, m->svec, BD);
    /* every modulation reads SiLU(vec) */
    ops->act(m->vec, m->svec, BD, DITD_ACT_SILU);
}

/* The joint attention of one block over [text; image]:
 *   q, k, v of the image tokens xn (B, Nl, D) and of the text tokens tn
 *   (B, Ll, D), each q and k RMS-normalized per head, RoPE on the image
 *   tokens (the text's ids are zeros: RoPE is the identity there), then
 *   softmax attention over all L + N tokens; outputs into the first A
 *   columns of cat (B, Nl, A + Fl) and pcat (B, Ll, A + Fl). Under tp: this
 *   rank's hc heads (A = hc Dh). One rank: the text is the attention's
 *   prefix. Under cp: this rank's [text slice; image slice] q|k|v side by
 *   side in jqkv (B, Ll + Nl, 3A), the plain split attention over every
 *   rank's, the output jo (B, Ll + Nl, A) copied back to cat and pcat. */
static int joint_attention(ditd_flux *m, int B, const ditd_flux_lin *qkv, const ditd_flux_lin *pqkv,
                           const void *nq, const void *nk, const void *pnq, const void *pnk)
{
    const ditd_backend_ops *ops = m->ops;
    const ditd_flux_config *c = &m->cfg;
    int D = c->inner_dim, H = m->hc, Dh = c->head_dim, Nl = m->n_loc, L = m->l_loc, A = m->A;
    size_t ld3 = 3 * (size_t)A, ldc = (size_t)A + (size_t)m->fc, half = (size_t)Dh / 2;
    float eps = FLUX_EPS;
    int err;

    lin(m, m->xn, (size_t)D, qkv, m->qkv, ld3, B * Nl, 3 * A, D, DITD_ACT_NONE);
    ops->rmsnorm_heads(m->qkv, ld3, nq, B * Nl, H, Dh, eps);
    ops->rmsnorm_heads(at(m, m->qkv, (size_t)A), ld3, nk, B * Nl, H, Dh, eps);
    if (L > 0) {
        lin(m, m->tn, (size_t)D, pqkv, m->pqkv, ld3, B * L, 3 * A, D, DITD_ACT_NONE);
        ops->rmsnorm_heads(m->pqkv, ld3, pnq, B * L, H, Dh, eps);
        ops->rmsnorm_heads(at(m, m->pqkv, (size_t)A), ld3, pnk, B * L, H, Dh, eps);
    }
    /* this rank's image tokens take their own rows of the table */
    const float *cs = (const float *)m->rope_cos + (size_t)m->tok0 * half; /* fp32 */
    const float *sn = (const float *)m->rope_sin + (size_t)m->tok0 * half;
    ops->rope(m->qkv, ld3, cs, sn, B, Nl, H, Dh);
    ops->rope(at(m, m->qkv, (size_t)A), ld3, cs, sn, B, Nl, H, Dh);
    if (m->lay.ring * m->lay.ulysses == 1)
        return ditd_cp_attention_run(m->cpa, B, m->qkv, at(m, m->qkv, (size_t)A),
                                     at(m, m->qkv, 2 * (size_t)A), ld3, m->cat, ldc, m->pqkv,
                                     at(m, m->pqkv, (size_t)A), at(m, m->pqkv, 2 * (size_t)A),
                                     ld3, m->pcat, ldc);
    size_t J = (size_t)L + (size_t)Nl, Lz = (size_t)L, Nz = (size_t)Nl;
    for (size_t b = 0; b < (size_t)B; b++) {
        if (L > 0)
            ops->copy2d(at(m, m->jqkv, b * J * ld3), ld3, at(m, m->pqkv, b * Lz * ld3), ld3, Lz,
                        ld3);
        ops->copy2d(at(m, m->jqkv, (b * J + Lz) * ld3), ld3, at(m, m->qkv, b * Nz * ld3), ld3, Nz,
                    ld3);
    }
    if ((err = ditd_cp_attention_run(m->cpa, B, m->jqkv, at(m, m->jqkv, (size_t)A),
                                     at(m, m->jqkv, 2 * (size_t)A), ld3, m->jo, (size_t)A, NULL,
                                     NULL, NULL, 0, NULL, 0)))
        return err;
    for (size_t b = 0; b < (size_t)B; b++) {
        if (L > 0)
            ops->copy2d(at(m, m->pcat, b * Lz * ldc), ldc, at(m, m->jo, b * J * (size_t)A),
                        (size_t)A, Lz, (size_t)A);
        ops->copy2d(at(m, m->cat, b * Nz * ldc), ldc, at(m, m->jo, (b * J + Lz) * (size_t)A),
                    (size_t)A, Nz, (size_t)A);
    }
    return 0;
}

/* h (B, n, D) += gate * FF(LN(h) (1 + scale) + shift), FF = Linear(F -> D)
 * . GELU(tanh) . Linear(D -> F) (tp: this rank's Fl columns, all-reduced);
 * mod (B, 6D) holds shift, scale, gate at 3D, 4D, 5D; xn and hid ((B, n, Fl)
 * of row stride A + Fl) are scratch. */
static int mlp(ditd_flux *m, int B, int n, void *h, void *xn, void *hid, const void *mod,
                const ditd_flux_lin *f1, const ditd_flux_lin *f2)
{
    const ditd_backend_ops *ops = m->ops;
    int D = m->cfg.inner_dim, F = m->fc, err;
    size_t ld6 = 6 * (size_t)D, ldc = (size_t)m->A + (size_t)F;
    ops->layernorm_modulate(h, xn, B, n, D, FLUX_EPS, at(m, mod, 3 * (size_t)D),
                            at(m, mod, 4 * (size_t)D), ld6);
    lin(m, xn, (size_t)D, f1, hid, ldc, B * n, F, D, DITD_ACT_GELU_TANH);
    if ((err = row_lin(m, hid, ldc, f2, xn, B * n, F)))
        return err;
    ops->gated_residual(h, xn, B, n, D, at(m, mod, 5 * (size_t)D), ld6);
    return 0;
}

/* TaylorSeer's hooks around module id (flux_denoiser.c) of parts pt */
static int mod_begin(const ditd_denoiser_cache *cc, int id, const ditd_cache_part *pt, int n,
                     int *pred)
{
    *pred = 0;
    return cc && cc->module_begin_parts ? cc->module_begin_parts(cc->ctx, id, pt, n, pred) : 0;
}

static int mod_end(const ditd_denoiser_cache *cc, int id, const ditd_cache_part *pt, int n)
{
    return cc && cc->module_end_parts ? cc->module_end_parts(cc->ctx, id, pt, n) : 0;
}

/* FluxTransformerBlock: each stream its own adaLN-Zero modulation
 * [shift, scale, gate] x (attention, MLP), one joint attention. Its attn
 * (TaylorSeer's module id) returns the image and text outputs of to_out /
 * to_add_out, before the gates: xn (B, Nl, D) and tn (B, L, D). */
static int double_block(ditd_flux *m, const ditd_flux_double *b, int B,
                        const ditd_denoiser_cache *cc, int id)
{
    const ditd_backend_ops *ops = m->ops;
    int D = m->cfg.inner_dim, Nl = m->n_loc, L = m->l_loc, A = m->A;
    size_t ld6 = 6 * (size_t)D, ldc = (size_t)A + (size_t)m->fc;
    int err;

    /* L = 0 (a cp rank with no text token): its text stream is skipped */
    lin(m, m->svec, (size_t)D, &b->ada, m->mod, ld6, B, 6 * D, D, DITD_ACT_NONE);
    lin(m, m->svec, (size_t)D, &b->ada_c, m->mod_c, ld6, B, 6 * D, D, DITD_ACT_NONE);
    ops->layernorm_modulate(m->img, m->xn, B, Nl, D, FLUX_EPS, m->mod, at(m, m->mod, (size_t)D), ld6);
    if (L > 0)
        ops->layernorm_modulate(m->txt, m->tn, B, L, D, FLUX_EPS, m->mod_c,
                                at(m, m->mod_c, (size_t)D), ld6);
    ditd_cache_part pt[2] = {{m->xn, Nl, D, (size_t)D}, {m->tn, L, D, (size_t)D}};
    int pred;
    if ((err = mod_begin(cc, id, pt, 2, &pred)))
        return err;
    if (!pred) {
        if ((err = joint_attention(m, B, &b->qkv, &b->qkv_c, b->nq, b->nk, b->nq_c, b->nk_c)))
            return err;
        /* to_out.0 / to_add_out */
        if ((err = row_lin(m, m->cat, ldc, &b->out, m->xn, B * Nl, A)) ||
            (L > 0 && (err = row_lin(m, m->pcat, ldc, &b->out_c, m->tn, B * L, A))) ||
            (err = mod_end(cc, id, pt, 2)))
            return err;
    }
    /* gated into each stream */
    ops->gated_residual(m->img, m->xn, B, Nl, D, at(m, m->mod, 2 * (size_t)D), ld6);
    if (L > 0)
        ops->gated_residual(m->txt, m->tn, B, L, D, at(m, m->mod_c, 2 * (size_t)D), ld6);
    /* the MLPs (hidden in the MLP columns of cat / pcat) */
    if ((err = mlp(m, B, Nl, m->img, m->xn, at(m, m->cat, (size_t)A), m->mod, &b->ff1, &b->ff2)))
        return err;
    if (L == 0)
        return 0;
    return mlp(m, B, L, m->txt, m->tn, at(m, m->pcat, (size_t)A), m->mod_c, &b->ff1_c, &b->ff2_c);
}

/* FluxSingleTransformerBlock over [text; image] (kept as two buffers, the
 * same weights on both): x = LN(h) (1 + scale) + shift;
 * h += gate * proj_out([Attn(x) | GELU(proj_mlp(x))]). Its attn
 * (TaylorSeer's module id) returns the attention of [text; image]: the
 * first A columns of pcat (B, L) and cat (B, Nl). */
static int single_block(ditd_flux *m, const ditd_flux_single *b, int B,
                        const ditd_denoiser_cache *cc, int id)
{
    const ditd_backend_ops *ops = m->ops;
    int D = m->cfg.inner_dim, F = m->fc, Nl = m->n_loc, L = m->l_loc, A = m->A;
    size_t ld3 = 3 * (size_t)D, ldc = (size_t)A + (size_t)F;
    int err;

    lin(m, m->svec, (size_t)D, &b->ada, m->mod, ld3, B, 3 * D, D, DITD_ACT_NONE);
    ops->layernorm_modulate(m->img, m->xn, B, Nl, D, FLUX_EPS, m->mod, at(m, m->mod, (size_t)D), ld3);
    if (L > 0)
        ops->layernorm_modulate(m->txt, m->tn, B, L, D, FLUX_EPS, m->mod, at(m, m->mod, (size_t)D),
                                ld3);
    lin(m, m->xn, (size_t)D, &b->mlp, at(m, m->cat, (size_t)A), ldc, B * Nl, F, D,
        DITD_ACT_GELU_TANH);
    if (L > 0)
        lin(m, m->tn, (size_t)D, &b->mlp, at(m, m->pcat, (size_t)A), ldc, B * L, F, D,
            DITD_ACT_GELU_TANH);
    ditd_cache_part pt[2] = {{m->pcat, L, A, ldc}, {m->cat, Nl, A, ldc}};
    int pred;
    if ((err = mod_begin(cc, id, pt, 2, &pred)))
        return err;
    if (!pred && ((err = joint_attention(m, B, &b->qkv, &b->qkv, b->nq, b->nk, b->nq, b->nk)) ||
                  (err = mod_end(cc, id, pt, 2))))
        return err;
    /* proj_out over [attention | MLP] (tp: this rank's columns of both) */
    if ((err = row_lin(m, m->cat, ldc, &b->out, m->xn, B * Nl, A + F)))
        return err;
    ops->gated_residual(m->img, m->xn, B, Nl, D, at(m, m->mod, 2 * (size_t)D), ld3);
    if (L > 0) {
        if ((err = row_lin(m, m->pcat, ldc, &b->out, m->tn, B * L, A + F)))
            return err;
        ops->gated_residual(m->txt, m->tn, B, L, D, at(m, m->mod, 2 * (size_t)D), ld3);
    }
    return 0;
}

/* The forward's ops in order; arguments checked by ditd_flux_forward. */
static int forward_ops(ditd_flux *m, int B, const void *x, const float *h_t, const float *h_text,
                       const float *h_pooled, const float *h_guidance, void *out)
{
    const ditd_backend_ops *ops = m->ops;
    const ditd_flux_config *c = &m->cfg;
    int D = c->inner_dim, N = m->NT, Nl = m->n_loc, L = m->l_loc, Co = c->out_channels;
    int C = c->latent_channels, cp = m->lay.ring * m->lay.ulysses > 1;
    int err;

    /* x_embedder on the 2x2-packed latents = a stride-2 patch embedding:
     * x (B, C, h, w) -> img (B, N, D); under cp every rank embeds the whole
     * image (cheap) and keeps its own tokens */
    void *emb = cp ? m->embed : m->img;
    if (m->Nr == 0) {
        ops->patch_embed(x, m->x_emb.w, m->x_emb.b, NULL, emb, m->scratch, B, C, m->h, m->w, 2, D);
        /* x_embedder's adapters: the op leaves its patches (B N, 4C) in scratch,
         * each in the packed latents' (c, dy, dx) order, which is the Linear's
         * input Diffusers' LoRA sees */
        if (m->x_emb.lora && ditd_lora_touches(m->base.loras, B, m->x_emb.lora - 1))
            ditd_lora_apply(ops, m->base.loras, B, N, m->x_emb.lora - 1, m->scratch,
                            4 * (size_t)C, emb, (size_t)D, D, 4 * C, DITD_ACT_NONE, m->lora_tmp,
                            m->lora_tmp_n);
    } else {
        /* a reference (Kontext): row b of x is [latents (C, h, w); reference
         * (C, rh, rw)], each packed and embedded by x_embedder into the row's
         * image stream, the reference's tokens after the latents' */
        size_t xs = (size_t)C * ((size_t)m->h * m->w + (size_t)m->rh * m->rw);
        for (int b = 0; b < B; b++)
            for (int part = 0; part < 2; part++) {
                const void *xp = at(m, x, (size_t)b * xs + (part ? (size_t)C * m->h * m->w : 0));
                void *ep = at(m, emb, ((size_t)b * N + (part ? (size_t)m->N : 0)) * (size_t)D);
                int ph = part ? m->rh : m->h, pw = part ? m->rw : m->w;
                int nt = part ? m->Nr : m->N;
                ops->patch_embed(xp, m->x_emb.w, m->x_emb.b, NULL, ep, m->scratch, 1, C, ph, pw,
                                 2, D);
                if (m->x_emb.lora && m->base.loras &&
                    ditd_lora_touches(m->base.loras + b, 1, m->x_emb.lora - 1))
                    ditd_lora_apply(ops, m->base.loras + b, 1, nt, m->x_emb.lora - 1, m->scratch,
                                    4 * (size_t)C, ep, (size_t)D, D, 4 * C, DITD_ACT_NONE,
                                    m->lora_tmp, m->lora_tmp_n);
            }
    }
    if (cp)
        for (size_t b = 0; b < (size_t)B; b++) /* (B, Nl, D) */
            ops->copy2d(at(m, m->img, b * (size_t)Nl * D), (size_t)D,
                        at(m, m->embed, (b * (size_t)N + (size_t)m->tok0) * D), (size_t)D,
                        (size_t)Nl, (size_t)D);
    /* context_embedder: text (B, Ll, Dt) -> txt (B, Ll, D), this rank's text
     * tokens [txt0, txt0 + Ll) of each sample (all of them on one rank) */
    size_t Dt = (size_t)c->joint_attention_dim;
    if (L == m->L)
        ops->upload(m->text_in, h_text, (size_t)B * (size_t)L * Dt);
    else
        for (size_t b = 0; b < (size_t)B && L > 0; b++)
            ops->upload(at(m, m->text_in, b * (size_t)L * Dt),
                        h_text + (b * (size_t)m->L + (size_t)m->txt0) * Dt, (size_t)L * Dt);
    if (L > 0)
        lin(m, m->text_in, Dt, &m->ctx_emb, m->txt, (size_t)D, B * L, D, c->joint_attention_dim,
            DITD_ACT_NONE);
    ops->upload(m->pooled_in, h_pooled, (size_t)B * (size_t)c->pooled_dim);
    conditioning(m, B, h_t, h_guidance);

    /* the blocks: double-stream, then single-stream, as one list for step
     * caching's block hooks (engine/models/denoiser.h): Diffusers' hooks take
     * transformer_blocks.0 as the head, single_transformer_blocks.-1 as the tail */
    const ditd_denoiser_cache *cc = m->base.cache;
    ditd_cache_streams cs = {B, m->img, Nl, m->tok0, m->txt, L, D};
    int run = 1, nb = c->num_layers + c->num_single_layers;
    if (cc && (err = cc->blocks_begin(cc->ctx, &cs, &run)))
        return err;
    for (int l = 0; run && l < nb; l++) {
        /* TaylorSeer's module hooks (flux_denoiser.c): block l is module 2l
         * (it returns both streams: (encoder_hidden_states, hidden_states)),
         * its attn 2l + 1 */
        ditd_cache_part pt[2] = {{m->txt, L, D, (size_t)D}, {m->img, Nl, D, (size_t)D}};
        int pred;
        if ((err = mod_begin(cc, 2 * l, pt, 2, &pred)))
            return err;
        if (!pred && ((err = l < c->num_layers
                                 ? double_block(m, &m->dbl[l], B, cc, 2 * l + 1)
                                 : single_block(m, &m->sgl[l - c->num_layers], B, cc, 2 * l + 1)) ||
                      (err = mod_end(cc, 2 * l, pt, 2))))
            return err;
        if (l == 0 && cc && (err = cc->first_block_done(cc->ctx, &cs, &run)))
            return err;
        if (run && l == nb - 1 && cc && (err = cc->blocks_end(cc->ctx, &cs)))
            return err;
    }

    /* norm_out (AdaLayerNormContinuous): [scale, shift] = Linear(SiLU(vec));
     * tokens (B, Nl, 4Co) = proj_out(LN(img) (1 + scale) + shift) */
    lin(m, m->svec, (size_t)D, &m->norm_out, m->mod, 2 * (size_t)D, B, 2 * D, D, DITD_ACT_NONE);
    ops->layernorm_modulate(m->img, m->xn, B, Nl, D, FLUX_EPS, at(m, m->mod, (size_t)D), m->mod,
                            2 * (size_t)D);
    /* proj_out, or TaylorSeer's prediction of it (module 2 nb: use_lite_mode) */
    void *tok = cp ? m->tok_loc : m->tok_out;
    int pred = 0;
    if (cc && cc->module_begin && (err = cc->module_begin(cc->ctx, 2 * nb, tok, &pred)))
        return err;
    if (!pred) {
        lin(m, m->xn, (size_t)D, &m->proj, tok, (size_t)Co, B * Nl, Co, D, DITD_ACT_NONE);
        if (cc && cc->module_end && (err = cc->module_end(cc->ctx, 2 * nb, tok)))
            return err;
    }
    if (cp) { /* gather the image tokens: cp rank s's block is (B, N_s, 4Co) */
        int RU = m->lay.ring * m->lay.ulysses;
        const int *cnt = m->icnt, *off = m->ioff;
        for (int s = 0; s < RU; s++) {
            m->cnt_a[s] = B * cnt[s] * Co;
            m->dsp_a[s] = B * off[s] * Co;
        }
        if ((err = ditd_comm_allgatherv(m->mesh->cp_comm, ops->act_dtype, m->tok_loc, m->tok_gath,
                                        m->cnt_a, m->dsp_a)))
            return err;
        for (int s = 0; s < RU; s++)
            for (size_t b = 0; b < (size_t)B; b++)
                ops->copy2d(at(m, m->tok_out, (b * (size_t)N + (size_t)off[s]) * (size_t)Co),
                            (size_t)Co,
                            at(m, m->tok_gath,
                               (size_t)m->dsp_a[s] + b * (size_t)cnt[s] * (size_t)Co),
                            (size_t)Co, (size_t)cnt[s], (size_t)Co);
    }
    /* unpack: (B, N, 2*2*C) in (dy, dx, c) order -> (B, C, h, w); with a
     * reference the latents' N tokens of each row (noise_pred[:, :N]) */
    if (m->Nr == 0)
        ops->unpatchify(m->tok_out, out, B, Co / 4, m->gh, m->gw, 2);
    else
        for (size_t b = 0; b < (size_t)B; b++)
            ops->unpatchify(at(m, m->tok_out, b * (size_t)N * (size_t)Co),
                            at(m, out, b * (size_t)m->N * (size_t)Co), 1, Co / 4, m->gh, m->gw,
                            2);
    return ops->status();
}

int ditd_flux_forward(ditd_flux *m, int B, const void *x, const float *h_t, const float *h_text,
                      const float *h_pooled, const float *h_guidance, void *out)
{
    if (!m->cpa)
        return ditd_err_set(DITD_EINVAL, "FLUX model has no activations (a set_size failed): set a size again");
    if (B <= 0 || B > m->max_batch)
        return ditd_err_set(DITD_EINVAL, "batch %d outside 1..%d", B, m->max_batch);
    if (!h_text || !h_pooled)
        return ditd_err_set(DITD_EINVAL, "FLUX needs the text sequence and the pooled vector");
    if (m->cfg.guidance_embeds && !h_guidance)
        return ditd_err_set(DITD_EINVAL,
                            "this FLUX model embeds guidance (guidance_embeds): a guidance scale per row is needed");
    for (int i = 0; i < B; i++) {
        if (!isfinite(h_t[i]))
            return ditd_err_set(DITD_EINVAL, "timestep of sample %d is not finite", i);
        if (m->cfg.guidance_embeds && !isfinite(h_guidance[i]))
            return ditd_err_set(DITD_EINVAL, "guidance scale of sample %d is not finite", i);
    }
    m->fwd_B = B;
    return forward_ops(m, B, x, h_t, h_text, h_pooled, h_guidance, out);
}
