/* Diffusers SD3Transformer2DModel forward (engine/models/sd3/sd3.h): the
 * embeddings, the joint blocks (with SD3.5's QK norms and MMDiT-X's second
 * attention), the output layer. */
#include <math.h>
#include <stdlib.h>

#include "engine/core/error.h"
#include "engine/models/sd3/sd3.h"
#include "engine/parallel/comm.h"
#include "kernels/cpu/rope.h"

#define TFREQ 256      /* Timesteps(num_channels=256) */
#define SD3_EPS 1e-6f  /* every LayerNorm and RMSNorm of the model (Diffusers' fixed eps) */

static void *at(const ditd_sd3 *m, const void *p, size_t elems)
{
    return ditd_ptr_act(m->ops, p, elems);
}

/* A linear layer (dense, or kept in GGML blocks: l->q) with the rows'
 * LoRA adapters on it (engine/models/lora_linear.h): M is fwd_B samples of M / fwd_B rows. */
static void lin_b(const ditd_sd3 *m, const void *x, size_t ldx, const ditd_sd3_lin *l,
                  const void *b, void *y, size_t ldy, int M, int N, int K, ditd_act act)
{
    ditd_lora_linear(m->ops, m->base.loras, m->fwd_B, l->lora, x, ldx, l->w, &l->q, b, y, ldy, M,
                     N, K, act, m->lora_tmp, m->lora_tmp_n);
}

static void lin(const ditd_sd3 *m, const void *x, size_t ldx, const ditd_sd3_lin *l, void *y,
                size_t ldy, int M, int N, int K, ditd_act act)
{
    lin_b(m, x, ldx, l, l->b, y, ldy, M, N, K, act);
}

/* A row-parallel Linear (tp: this rank's input columns, partial sums, the
 * bias once on tp rank 0, then the all-reduce): y (M, D) from x (M, K).
 * An adapter's term (its A cut to this rank's input columns, sd3.c) joins the
 * partial sum before the all-reduce, which sums it too. */
static int row_lin(const ditd_sd3 *m, const void *x, size_t ldx, const ditd_sd3_lin *l, void *y,
                   int M, int K)
{
    int D = m->cfg.inner_dim;
    lin_b(m, x, ldx, l, m->tp_rank == 0 ? l->b : NULL, y, (size_t)D, M, D, K, DITD_ACT_NONE);
    if (m->lay.tp > 1)
        return ditd_comm_allreduce_sum(m->mesh->tp_comm, m->ops->act_dtype, y,
                                       (size_t)M * (size_t)D);
    return 0;
}

/* temb (B, D) = TimestepEmbedding(Timesteps(t)) + PixArtAlphaTextProjection(pooled)
 * (CombinedTimestepTextProjEmbeddings); svec = SiLU(temb). */
static void conditioning(ditd_sd3 *m, int B, const float *h_t)
{
    const ditd_backend_ops *ops = m->ops;
    const ditd_sd3_config *c = &m->cfg;
    int D = c->inner_dim;
    size_t BD = (size_t)B * (size_t)D;

    /* Timesteps(256, flip_sin_to_cos, downscale_freq_shift 0), in float32
     * as Diffusers computes them */
    ditd_cpu_timestep_features(h_t, m->h_freq, B, TFREQ, 0.0f);
    ops->upload(m->tfreq, m->h_freq, (size_t)B * TFREQ);
    lin(m, m->tfreq, TFREQ, &m->t1, m->tmp, (size_t)D, B, D, TFREQ, DITD_ACT_SILU);
    lin(m, m->tmp, (size_t)D, &m->t2, m->vec, (size_t)D, B, D, D, DITD_ACT_NONE);
    lin(m, m->pooled_in, (size_t)c->pooled_dim, &m->p1, m->tmp, (size_t)D, B, D, c->pooled_dim,
        DITD_ACT_SILU);
    lin(m, m->tmp, (size_t)D, &m->p2, m->svec, (size_t)D, B, D, D, DITD_ACT_NONE);
    ops->add(m->vec, m->svec, BD);
    /* every modulation reads SiLU(temb) */
    ops->act(m->vec, m->svec, BD, DITD_ACT_SILU);
}

/* q, k of rows (B*n, 3A) RMS-normalized per head (qk_norm "rms_norm"). */
static void qk_norm(const ditd_sd3 *m, void *qkv, int rows, const void *nq, const void *nk)
{
    size_t ld3 = 3 * (size_t)m->A;
    if (!nq)
        return;
    m->ops->rmsnorm_heads(qkv, ld3, nq, rows, m->hc, m->cfg.head_dim, SD3_EPS);
    m->ops->rmsnorm_heads(at(m, qkv, (size_t)m->A), ld3, nk, rows, m->hc, m->cfg.head_dim, SD3_EPS);
}

/* JointAttnProcessor2_0 of one block, up to the output projections:
 *   q, k, v (B, Nl, 3A) of the image tokens xn and (B, Ll, 3A) of the text
 *   tokens tn, q and k RMS-normalized per head under qk_norm, softmax
 *   attention over all N + L tokens; outputs into the first A columns of
 *   cat (B, Nl, A + Fl) and pcat (B, Ll, A + Fl). Under tp: this rank's hc
 *   heads (A = hc Dh). One rank: the text is the attention's prefix (Diffusers
 *   concatenates [image; text]; attention does not see the order). Under
 *   cp: this rank's [text slice; image slice] side by side in jqkv
 *   (B, Ll + Nl, 3A), the split attention over every rank's, the output jo
 *   (B, Ll + Nl, A) copied back to cat and pcat. */
static int joint_attention(ditd_sd3 *m, int B, const ditd_sd3_block *b)
{
    const ditd_backend_ops *ops = m->ops;
    int D = m->cfg.inner_dim, Nl = m->n_loc, L = m->l_loc, A = m->A;
    size_t ld3 = 3 * (size_t)A, ldc = (size_t)A + (size_t)m->fc;
    int err;

    lin(m, m->xn, (size_t)D, &b->qkv, m->qkv, ld3, B * Nl, 3 * A, D, DITD_ACT_NONE);
    qk_norm(m, m->qkv, B * Nl, b->nq, b->nk);
    if (L > 0) {
        lin(m, m->tn, (size_t)D, &b->qkv_c, m->pqkv, ld3, B * L, 3 * A, D, DITD_ACT_NONE);
        qk_norm(m, m->pqkv, B * L, b->nq_c, b->nk_c);
    }
    if (m->lay.ring * m->lay.ulysses == 1)
        return ditd_cp_attention_run(m->cpa, B, m->qkv, at(m, m->qkv, (size_t)A),
                                     at(m, m->qkv, 2 * (size_t)A), ld3, m->cat, ldc, m->pqkv,
                                     at(m, m->pqkv, (size_t)A), at(m, m->pqkv, 2 * (size_t)A),
                                     ld3, m->pcat, ldc);
    size_t J = (size_t)L + (size_t)Nl, Lz = (size_t)L, Nz = (size_t)Nl;
    for (size_t s = 0; s < (size_t)B; s++) {
        if (L > 0)
            ops->copy2d(at(m, m->jqkv, s * J * ld3), ld3, at(m, m->pqkv, s * Lz * ld3), ld3, Lz,
                        ld3);
        ops->copy2d(at(m, m->jqkv, (s * J + Lz) * ld3), ld3, at(m, m->qkv, s * Nz * ld3), ld3, Nz,
                    ld3);
    }
    if ((err = ditd_cp_attention_run(m->cpa, B, m->jqkv, at(m, m->jqkv, (size_t)A),
                                     at(m, m->jqkv, 2 * (size_t)A), ld3, m->jo, (size_t)A, NULL,
                                     NULL, NULL, 0, NULL, 0)))
        return err;
    for (size_t s = 0; s < (size_t)B; s++) {
        if (L > 0)
            ops->copy2d(at(m, m->pcat, s * Lz * ldc), ldc, at(m, m->jo, s * J * (size_t)A),
                        (size_t)A, Lz, (size_t)A);
        ops->copy2d(at(m, m->cat, s * Nz * ldc), ldc, at(m, m->jo, (s * J + Lz) * (size_t)A),
                    (size_t)A, Nz, (size_t)A);
    }
    return 0;
}

/* MMDiT-X's attn2 (dual blocks): self attention of the image tokens alone on
 * xn2 = LN(img) (1 + scale_msa2) + shift_msa2, q and k normalized under
 * qk_norm; img += gate_msa2 * to_out(attn2). Under cp the image tokens'
 * plain split (cpa2). */
static int self_attention2(ditd_sd3 *m, int B, const ditd_sd3_block *b, size_t ldm)
{
    int D = m->cfg.inner_dim, Nl = m->n_loc, A = m->A, err;
    size_t ld3 = 3 * (size_t)A, ldc = (size_t)A + (size_t)m->fc;
    lin(m, m->xn2, (size_t)D, &b->qkv2, m->qkv, ld3, B * Nl, 3 * A, D, DITD_ACT_NONE);
    qk_norm(m, m->qkv, B * Nl, b->nq2, b->nk2);
    if ((err = ditd_cp_attention_run(m->cpa2, B, m->qkv, at(m, m->qkv, (size_t)A),
                                     at(m, m->qkv, 2 * (size_t)A), ld3, m->cat, ldc, NULL, NULL,
                                     NULL, 0, NULL, 0)) ||
        (err = row_lin(m, m->cat, ldc, &b->out2, m->xn, B * Nl, A)))
        return err;
    m->ops->gated_residual(m->img, m->xn, B, Nl, D, at(m, m->mod, 8 * (size_t)D), ldm);
    return 0;
}

/* h (B, n, D) += gate * FF(LN(h) (1 + scale) + shift), FF = Linear(F -> D)
 * . GELU(tanh) . Linear(D -> F) (tp: this rank's Fl columns, all-reduced);
 * mod (B, ldm) holds shift, scale, gate at 3D, 4D, 5D; xn and hid ((B, n, Fl)
 * of row stride A + Fl) are scratch. With cc, FF is TaylorSeer's module id
 * (sd3_denoiser.c: ff or ff_context): its output (B, n, D) in xn, before the
 * gate, or as the cache predicts it. */
/* TaylorSeer's hooks around module id (sd3_denoiser.c) of parts pt */
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

static int mlp(ditd_sd3 *m, int B, int n, void *h, void *xn, void *hid, const void *mod,
               size_t ldm, const ditd_sd3_lin *f1, const ditd_sd3_lin *f2,
               const ditd_denoiser_cache *cc, int id)
{
    const ditd_backend_ops *ops = m->ops;
    int D = m->cfg.inner_dim, F = m->fc, err, pred = 0;
    size_t ldc = (size_t)m->A + (size_t)F;
    ops->layernorm_modulate(h, xn, B, n, D, SD3_EPS, at(m, mod, 3 * (size_t)D),
                            at(m, mod, 4 * (size_t)D), ldm);
    if (cc && cc->module_begin && (err = cc->module_begin(cc->ctx, id, xn, &pred)))
        return err;
    if (!pred) {
        lin(m, xn, (size_t)D, f1, hid, ldc, B * n, F, D, DITD_ACT_GELU_TANH);
        if ((err = row_lin(m, hid, ldc, f2, xn, B * n, F)) ||
            (cc && cc->module_end && (err = cc->module_end(cc->ctx, id, xn))))
            return err;
    }
    ops->gated_residual(h, xn, B, n, D, at(m, mod, 5 * (size_t)D), ldm);
    return 0;
}

/* JointTransformerBlock. norm1 (AdaLayerNormZero, or SD35AdaLayerNormZeroX
 * in a dual block): mod (B, 6D | 9D) = Linear(SiLU(temb)) = [shift_msa,
 * scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp (, shift_msa2,
 * scale_msa2, gate_msa2)]; norm1_context: the same 6 for the text, or in the
 * context_pre_only block AdaLayerNormContinuous's [scale, shift]. Then
 *   img += gate_msa * to_out(attn_img);  (dual) img += gate_msa2 * attn2(...)
 *   img += gate_mlp * FF(LN(img) (1 + scale_mlp) + shift_mlp)
 *   (not pre_only) txt likewise with to_add_out and ff_context.
 * cc: the step cache's hooks of this forward (NULL: none, as under a
 * skip-layer guidance forward); attn, ff and ff_context are its modules
 * 4l + 1, 4l + 2, 4l + 3 (attn: to_out's xn (B, Nl, D) and, but in the
 * context_pre_only block, to_add_out's tn (B, L, D), before the gates). */
static int joint_block(ditd_sd3 *m, int l, const ditd_sd3_block *b, int B,
                       const ditd_denoiser_cache *cc)
{
    const ditd_backend_ops *ops = m->ops;
    int D = m->cfg.inner_dim, Nl = m->n_loc, L = m->l_loc, A = m->A;
    size_t ldm = (size_t)(b->dual ? 9 : 6) * (size_t)D, ldmc = (size_t)(b->pre_only ? 2 : 6) * D;
    size_t ldc = (size_t)A + (size_t)m->fc;
    int err;

    lin(m, m->svec, (size_t)D, &b->ada, m->mod, ldm, B, (int)ldm, D, DITD_ACT_NONE);
    lin(m, m->svec, (size_t)D, &b->ada_c, m->mod_c, ldmc, B, (int)ldmc, D, DITD_ACT_NONE);
    ops->layernorm_modulate(m->img, m->xn, B, Nl, D, SD3_EPS, m->mod, at(m, m->mod, (size_t)D),
                            ldm);
    if (b->dual)
        ops->layernorm_modulate(m->img, m->xn2, B, Nl, D, SD3_EPS, at(m, m->mod, 6 * (size_t)D),
                                at(m, m->mod, 7 * (size_t)D), ldm);
    /* L = 0 (a cp rank with no text token): its text stream is skipped */
    if (L > 0 && b->pre_only) /* [scale, shift] */
        ops->layernorm_modulate(m->txt, m->tn, B, L, D, SD3_EPS, at(m, m->mod_c, (size_t)D),
                                m->mod_c, ldmc);
    else if (L > 0)
        ops->layernorm_modulate(m->txt, m->tn, B, L, D, SD3_EPS, m->mod_c,
                                at(m, m->mod_c, (size_t)D), ldmc);
    ditd_cache_part pt[2] = {{m->xn, Nl, D, (size_t)D}, {m->tn, b->pre_only ? 0 : L, D, (size_t)D}};
    int pred;
    if ((err = mod_begin(cc, 4 * l + 1, pt, 2, &pred)))
        return err;
    if (!pred) {
        if ((err = joint_attention(m, B, b)))
            return err;
        /* to_out.0; the text's to_add_out, before attn2 reuses cat (pcat is
         * its own) */
        if ((err = row_lin(m, m->cat, ldc, &b->out, m->xn, B * Nl, A)) ||
            (!b->pre_only && L > 0 &&
             (err = row_lin(m, m->pcat, ldc, &b->out_c, m->tn, B * L, A))) ||
            (err = mod_end(cc, 4 * l + 1, pt, 2)))
            return err;
    }
    /* gated into the streams */
    ops->gated_residual(m->img, m->xn, B, Nl, D, at(m, m->mod, 2 * (size_t)D), ldm);
    if (!b->pre_only && L > 0)
        ops->gated_residual(m->txt, m->tn, B, L, D, at(m, m->mod_c, 2 * (size_t)D), ldmc);
    if (b->dual && (err = self_attention2(m, B, b, ldm)))
        return err;
    /* the MLPs (hidden in the MLP columns of cat / pcat) */
    if ((err = mlp(m, B, Nl, m->img, m->xn, at(m, m->cat, (size_t)A), m->mod, ldm, &b->ff1,
                   &b->ff2, cc, 4 * l + 2)))
        return err;
    if (b->pre_only || L == 0)
        return 0; /* the last block's text is not used again */
    return mlp(m, B, L, m->txt, m->tn, at(m, m->pcat, (size_t)A), m->mod_c, ldmc, &b->ff1_c,
               &b->ff2_c, cc, 4 * l + 3);
}

static int skipped(const int *skip, int n_skip, int l)
{
    for (int i = 0; i < n_skip; i++)
        if (skip[i] == l)
            return 1;
    return 0;
}

/* The forward's ops in order; arguments checked by ditd_sd3_forward. */
static int forward_ops(ditd_sd3 *m, int B, const void *x, const float *h_t, const float *h_text,
                       const float *h_pooled, const int *skip, int n_skip, void *out)
{
    const ditd_backend_ops *ops = m->ops;
    const ditd_sd3_config *c = &m->cfg;
    int D = c->inner_dim, N = m->N, Nl = m->n_loc, L = m->l_loc, p = c->patch_size;
    int Co = c->out_channels * p * p, cp = m->lay.ring * m->lay.ulysses > 1;
    int err;

    /* pos_embed: x (B, C, h, w) -> img (B, N, D) = conv_p(x) + pos (the
     * cropped table); under cp every rank embeds the whole image (cheap)
     * and keeps its own tokens */
    ops->patch_embed(x, m->patch_w, m->patch_b, m->pos, cp ? m->embed : m->img, m->scratch, B,
                     c->in_channels, m->h, m->w, p, D);
    if (cp)
        for (size_t s = 0; s < (size_t)B; s++) /* (B, Nl, D) */
            ops->copy2d(at(m, m->img, s * (size_t)Nl * D), (size_t)D,
                        at(m, m->embed, (s * (size_t)N + (size_t)m->tok0) * D), (size_t)D,
                        (size_t)Nl, (size_t)D);
    /* context_embedder: text (B, Ll, Dt) -> txt (B, Ll, D), this rank's text
     * tokens [txt0, txt0 + Ll) of each sample (all of them on one rank) */
    size_t Dt = (size_t)c->joint_attention_dim;
    if (L == m->L)
        ops->upload(m->text_in, h_text, (size_t)B * (size_t)L * Dt);
    else
        for (size_t s = 0; s < (size_t)B && L > 0; s++)
            ops->upload(at(m, m->text_in, s * (size_t)L * Dt),
                        h_text + (s * (size_t)m->L + (size_t)m->txt0) * Dt, (size_t)L * Dt);
    if (L > 0)
        lin(m, m->text_in, Dt, &m->ctx_emb, m->txt, (size_t)D, B * L, D, c->joint_attention_dim,
            DITD_ACT_NONE);
    ops->upload(m->pooled_in, h_pooled, (size_t)B * (size_t)c->pooled_dim);
    conditioning(m, B, h_t);

    /* the joint blocks, less those skip-layer guidance skips; step caching's
     * block hooks (engine/models/denoiser.h) around them as Diffusers' hooks
     * take transformer_blocks.0 as the head and transformer_blocks.-1 as the
     * tail (a skip-layer forward runs without a cache: the pipeline's rows
     * for it stay outside the cache's) */
    const ditd_denoiser_cache *cc = n_skip > 0 ? NULL : m->base.cache;
    ditd_cache_streams cs = {B, m->img, Nl, m->tok0, m->txt, L, D};
    int run = 1;
    if (cc && (err = cc->blocks_begin(cc->ctx, &cs, &run)))
        return err;
    for (int l = 0; run && l < c->num_layers; l++) {
        /* TaylorSeer's module 4l: the block, returning (encoder_hidden_states,
         * hidden_states); the last one's text is None: not kept */
        int last = l == c->num_layers - 1, pred;
        ditd_cache_part pt[2] = {{m->txt, last ? 0 : L, D, (size_t)D}, {m->img, Nl, D, (size_t)D}};
        if (!skipped(skip, n_skip, l) &&
            ((err = mod_begin(cc, 4 * l, pt, 2, &pred)) ||
             (!pred && ((err = joint_block(m, l, &m->blk[l], B, cc)) ||
                        (err = mod_end(cc, 4 * l, pt, 2))))))
            return err;
        if (l == 0 && cc && (err = cc->first_block_done(cc->ctx, &cs, &run)))
            return err;
        if (run && l == c->num_layers - 1 && cc && (err = cc->blocks_end(cc->ctx, &cs)))
            return err;
    }

    /* norm_out (AdaLayerNormContinuous): [scale, shift] = Linear(SiLU(temb));
     * tokens (B, Nl, p p Co) = proj_out(LN(img) (1 + scale) + shift) */
    lin(m, m->svec, (size_t)D, &m->norm_out, m->mod, 2 * (size_t)D, B, 2 * D, D, DITD_ACT_NONE);
    ops->layernorm_modulate(m->img, m->xn, B, Nl, D, SD3_EPS, at(m, m->mod, (size_t)D), m->mod,
                            2 * (size_t)D);
    lin(m, m->xn, (size_t)D, &m->proj, cp ? m->tok_loc : m->tok_out, (size_t)Co, B * Nl, Co, D,
        DITD_ACT_NONE);
    if (cp) { /* gather the image tokens: cp rank s's block is (B, N_s, p p Co) */
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
            for (size_t q = 0; q < (size_t)B; q++)
                ops->copy2d(at(m, m->tok_out, (q * (size_t)N + (size_t)off[s]) * (size_t)Co),
                            (size_t)Co,
                            at(m, m->tok_gath,
                               (size_t)m->dsp_a[s] + q * (size_t)cnt[s] * (size_t)Co),
                            (size_t)Co, (size_t)cnt[s], (size_t)Co);
    }
    /* unpatchify: (B, N, p p Co) in (dy, dx, c) order -> (B, Co, h, w) */
    ops->unpatchify(m->tok_out, out, B, c->out_channels, m->gh, m->gw, p);
    return ops->status();
}

int ditd_sd3_forward(ditd_sd3 *m, int B, const void *x, const float *h_t, const float *h_text,
                     const float *h_pooled, const int *skip, int n_skip, void *out)
{
    if (!m->cpa)
        return ditd_err_set(DITD_EINVAL, "SD3 model has no activations (a set_size failed): set a size again");
    if (B <= 0 || B > m->max_batch)
        return ditd_err_set(DITD_EINVAL, "batch %d outside 1..%d", B, m->max_batch);
    if (!h_text || !h_pooled)
        return ditd_err_set(DITD_EINVAL, "SD3 needs the text sequence and the pooled vector");
    if (n_skip < 0 || (n_skip > 0 && !skip))
        return ditd_err_set(DITD_EINVAL, "SD3 skip layers: %d given without a list", n_skip);
    for (int i = 0; i < n_skip; i++)
        if (skip[i] < 0 || skip[i] >= m->cfg.num_layers)
            return ditd_err_set(DITD_EINVAL, "SD3 skip layer %d outside 0..%d (num_layers %d)",
                                skip[i], m->cfg.num_layers - 1, m->cfg.num_layers);
    for (int i = 0; i < B; i++)
        if (!isfinite(h_t[i]))
            return ditd_err_set(DITD_EINVAL, "timestep of sample %d is not finite", i);
    m->fwd_B = B;
    return forward_ops(m, B, x, h_t, h_text, h_pooled, skip, n_skip, out);
}
