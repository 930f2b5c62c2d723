/* Diffusers WanTransformer3DModel forward (engine/models/wan/wan.h): the
 * embeddings, the blocks, the output layer. */
#include <math.h>
#include <stdlib.h>

#include "engine/core/error.h"
#include "engine/models/wan/wan.h"
#include "engine/parallel/comm.h"
#include "kernels/cpu/rope.h"

static void *at(const ditd_wan *m, const void *p, size_t elems)
{
    return ditd_ptr_act(m->ops, p, elems);
}

/* A linear layer (dense, or kept in GGML blocks: l->q) with the rows'
 * LoRA adapters on it (engine/models/lora_linear.h): M is fwd_B samples of
 * M / fwd_B rows (tokens, text or image tokens, or the modulation rows: 1
 * or F a sample). */
static void lin_b(const ditd_wan *m, const void *x, size_t ldx, const ditd_wan_lin *l,
                  const void *b, void *y, size_t ldy, int M, int N, int K, ditd_act act)
{
    ditd_lora_linear(m->ops, m->base.loras, m->fwd_B, l->lora, x, ldx, l->w, &l->q, b, y, ldy, M,
                     N, K, act, m->lora_tmp, m->lora_tmp_n);
}

static void lin(const ditd_wan *m, const void *x, size_t ldx, const ditd_wan_lin *l, void *y,
                size_t ldy, int M, int N, int K, ditd_act act)
{
    lin_b(m, x, ldx, l, l->b, y, ldy, M, N, K, act);
}

/* A row-parallel Linear (tp: this rank's input columns, partial sums, the
 * bias once on tp rank 0, then the all-reduce): y (M, D) from x (M, K).
 * An adapter's term (its A cut to this rank's input columns, wan.c) joins the
 * partial sum before the all-reduce, which sums it too. */
static int row_lin(const ditd_wan *m, const void *x, size_t ldx, const ditd_wan_lin *l, void *y,
                   int M, int K)
{
    int D = m->cfg.inner_dim;
    lin_b(m, x, ldx, l, m->tp_rank == 0 ? l->b : NULL, y, (size_t)D, M, D, K, DITD_ACT_NONE);
    if (m->lay.tp > 1)
        return ditd_comm_allreduce_sum(m->mesh->tp_comm, m->ops->act_dtype, y,
                                       (size_t)M * (size_t)D);
    return 0;
}

/* qk_norm rms_norm_across_heads: torch.nn.RMSNorm(inner_dim) over each of
 * `rows` rows of this rank's A columns of x (stride ld), weight w (A). Under
 * tp the row's other heads live on the other tp ranks: the sums of squares
 * are all-reduced first, so the norm is over all D values exactly. */
static int rms_across(const ditd_wan *m, void *x, size_t ld, int rows, const void *w)
{
    int err;
    m->ops->row_sumsq(x, ld, rows, m->A, m->ss);
    if (m->lay.tp > 1 &&
        (err = ditd_comm_allreduce_sum(m->mesh->tp_comm, DITD_DTYPE_F32, m->ss, (size_t)rows)))
        return err;
    m->ops->rmsnorm_rows(x, ld, w, m->ss, rows, m->A, m->cfg.inner_dim, m->cfg.eps);
    return 0;
}

/* The modulation rows: per sample (pf = 0: row b) or per (sample, frame)
 * (pf: row b F + f, Wan 2.2's expand_timesteps). mod rows of stride ldm;
 * column blocks i of D. */

/* y = LN(x) (1 + mod[scale_i]) + mod[shift_i] over this rank's tokens */
static void modulate(const ditd_wan *m, int B, int pf, const void *x, void *y, const void *mod,
                     size_t ldm, int shift_i, int scale_i)
{
    const ditd_backend_ops *ops = m->ops;
    size_t D = (size_t)m->cfg.inner_dim;
    if (!pf) {
        ops->layernorm_modulate(x, y, B, m->n_loc, (int)D, m->cfg.eps, at(m, mod, shift_i * D),
                                at(m, mod, scale_i * D), ldm);
        return;
    }
    int P = m->P, t0 = m->tok0, t1 = m->tok0 + m->n_loc;
    for (int b = 0; b < B; b++)
        for (int f = t0 / P; f * P < t1; f++) {
            int s0 = f * P > t0 ? f * P : t0, s1 = (f + 1) * P < t1 ? (f + 1) * P : t1;
            size_t off = ((size_t)b * (size_t)m->n_loc + (size_t)(s0 - t0)) * D;
            const void *row = at(m, mod, ((size_t)b * (size_t)m->F + (size_t)f) * ldm);
            ops->layernorm_modulate(at(m, x, off), at(m, y, off), 1, s1 - s0, (int)D, m->cfg.eps,
                                    at(m, row, shift_i * D), at(m, row, scale_i * D), ldm);
        }
}

/* h += mod[gate_i] * y over this rank's tokens */
static void gated(const ditd_wan *m, int B, int pf, void *h, const void *y, const void *mod,
                  size_t ldm, int gate_i)
{
    const ditd_backend_ops *ops = m->ops;
    size_t D = (size_t)m->cfg.inner_dim;
    if (!pf) {
        ops->gated_residual(h, y, B, m->n_loc, (int)D, at(m, mod, gate_i * D), ldm);
        return;
    }
    int P = m->P, t0 = m->tok0, t1 = m->tok0 + m->n_loc;
    for (int b = 0; b < B; b++)
        for (int f = t0 / P; f * P < t1; f++) {
            int s0 = f * P > t0 ? f * P : t0, s1 = (f + 1) * P < t1 ? (f + 1) * P : t1;
            size_t off = ((size_t)b * (size_t)m->n_loc + (size_t)(s0 - t0)) * D;
            const void *row = at(m, mod, ((size_t)b * (size_t)m->F + (size_t)f) * ldm);
            ops->gated_residual(at(m, h, off), at(m, y, off), 1, s1 - s0, (int)D,
                                at(m, row, gate_i * D), ldm);
        }
}

/* condition_embedder over R modulation rows of host timesteps m->h_t:
 * temb (R, D) = time_embedder(features), tp6 (R, 6D) = time_proj(SiLU(temb)),
 * mod_out (R, 2D) = [shift, scale] = scale_shift_table + temb. */
static void time_embedding(ditd_wan *m, int R)
{
    const ditd_backend_ops *ops = m->ops;
    const ditd_wan_config *c = &m->cfg;
    int D = c->inner_dim, Fq = c->freq_dim;
    size_t Dz = (size_t)D;

    /* Timesteps(flip_sin_to_cos=True, downscale_freq_shift=0), float32 */
    ditd_cpu_timestep_features(m->h_t, m->h_freq, R, Fq, 0.0f);
    ops->upload(m->tfreq, m->h_freq, (size_t)R * (size_t)Fq);
    lin(m, m->tfreq, (size_t)Fq, &m->t1, m->stemb, Dz, R, D, Fq, DITD_ACT_SILU);
    lin(m, m->stemb, Dz, &m->t2, m->temb, Dz, R, D, D, DITD_ACT_NONE);
    ops->act(m->temb, m->stemb, (size_t)R * Dz, DITD_ACT_SILU);
    lin(m, m->stemb, Dz, &m->tproj, m->tp6, 6 * Dz, R, 6 * D, D, DITD_ACT_NONE);
    ops->copy2d(m->mod_out, 2 * Dz, m->temb, Dz, (size_t)R, Dz);
    ops->copy2d(at(m, m->mod_out, Dz), 2 * Dz, m->temb, Dz, (size_t)R, Dz);
    for (size_t r = 0; r < (size_t)R; r++)
        ops->add(at(m, m->mod_out, r * 2 * Dz), m->sst_out, 2 * Dz);
}

/* WanImageEmbedding: im_ctx (B, Li, D) = LN2(FF(LN1(image [+ pos_embed])))
 * with FeedForward(mult 1, GELU erf): net.0.proj (Di, Di), net.2 (D, Di);
 * FP32LayerNorm's eps 1e-5. Every rank the whole image context. */
static void image_embedding(ditd_wan *m, int B, const float *h_image)
{
    const ditd_backend_ops *ops = m->ops;
    const ditd_wan_config *c = &m->cfg;
    int D = c->inner_dim, Di = c->image_dim, Li = m->Li, M = B * Li;
    size_t Dz = (size_t)Di;
    ops->upload(m->im_in, h_image, (size_t)M * Dz);
    if (c->pos_embed_seq_len)
        for (size_t b = 0; b < (size_t)B; b++)
            ops->add(at(m, m->im_in, b * (size_t)Li * Dz), m->ie_pos, (size_t)Li * Dz);
    /* LN(x) w + b as LN(x) (1 + (w - 1)) + b, one modulation row for all */
    ops->layernorm_modulate(m->im_in, m->im_h, 1, M, Di, 1e-5f, m->ie_n1b, m->ie_n1w, Dz);
    lin(m, m->im_h, Dz, &m->ie_ff1, m->im_in, Dz, M, Di, Di, DITD_ACT_NONE);
    ops->gelu_erf(m->im_in, (size_t)M * Dz);
    lin(m, m->im_in, Dz, &m->ie_ff2, m->im_ctx, (size_t)D, M, D, Di, DITD_ACT_NONE);
    ops->layernorm_modulate(m->im_ctx, m->im_ctx, 1, M, D, 1e-5f, m->ie_n2b, m->ie_n2w,
                            (size_t)D);
}

/* TaylorSeer's module hooks (engine/models/denoiser.h): module id's output
 * into out, or as the cache predicts it (*pred = 1: do not run it). */
static int mod_begin(const ditd_wan *m, int id, void *out, int *pred)
{
    const ditd_denoiser_cache *cc = m->base.cache;
    *pred = 0;
    return cc && cc->module_begin ? cc->module_begin(cc->ctx, id, out, pred) : 0;
}

static int mod_end(const ditd_wan *m, int id, const void *out)
{
    const ditd_denoiser_cache *cc = m->base.cache;
    return cc && cc->module_end ? cc->module_end(cc->ctx, id, out) : 0;
}

/* attn1 of block b, module id (xn: its input, norm1's modulated x; output
 * into xn, before the gate): q, k RMS-normalized across heads, RoPE, the cp
 * attention, to_out */
static int self_attention(ditd_wan *m, const ditd_wan_block *b, int B, int id)
{
    const ditd_backend_ops *ops = m->ops;
    const ditd_wan_config *c = &m->cfg;
    int D = c->inner_dim, Nl = m->n_loc, A = m->A, Dh = c->head_dim, M = B * Nl, err;
    size_t Dz = (size_t)D, ld3 = 3 * (size_t)A, half = (size_t)Dh / 2;
    lin(m, m->xn, Dz, &b->qkv, m->qkv, ld3, M, 3 * A, D, DITD_ACT_NONE);
    if ((err = rms_across(m, m->qkv, ld3, M, b->nq1)) ||
        (err = rms_across(m, at(m, m->qkv, (size_t)A), ld3, M, b->nk1)))
        return err;
    const float *cs = (const float *)m->rope_cos + (size_t)m->tok0 * half; /* fp32 */
    const float *sn = (const float *)m->rope_sin + (size_t)m->tok0 * half;
    ops->rope(m->qkv, ld3, cs, sn, B, Nl, m->hc, Dh);
    ops->rope(at(m, m->qkv, (size_t)A), ld3, cs, sn, B, Nl, m->hc, Dh);
    if ((err = ditd_cp_attention_run(m->cpa, B, m->qkv, at(m, m->qkv, (size_t)A),
                                     at(m, m->qkv, 2 * (size_t)A), ld3, m->ao, (size_t)A, NULL,
                                     NULL, NULL, 0, NULL, 0)) ||
        (err = row_lin(m, m->ao, (size_t)A, &b->out1, m->xn, M, A)))
        return err;
    return mod_end(m, id, m->xn);
}

/* attn2 of block b, module id: src (norm2(x), or x) to the whole text
 * (every rank holds it) and, with an image branch, to the image context;
 * no RoPE; output into xn */
static int cross_attention(ditd_wan *m, const ditd_wan_block *b, int B, const void *src, int id)
{
    const ditd_backend_ops *ops = m->ops;
    const ditd_wan_config *c = &m->cfg;
    int D = c->inner_dim, Nl = m->n_loc, L = m->L, A = m->A, Dh = c->head_dim, M = B * Nl, err;
    size_t Dz = (size_t)D, ld3 = 3 * (size_t)A;
    lin(m, src, Dz, &b->q2, m->qkv, ld3, M, A, D, DITD_ACT_NONE);
    lin(m, m->ctx, Dz, &b->kv2, m->kv, 2 * (size_t)A, B * L, 2 * A, D, DITD_ACT_NONE);
    if ((err = rms_across(m, m->qkv, ld3, M, b->nq2)) ||
        (err = rms_across(m, m->kv, 2 * (size_t)A, B * L, b->nk2)))
        return err;
    ops->attention(m->qkv, ld3, m->kv, 2 * (size_t)A, at(m, m->kv, (size_t)A), 2 * (size_t)A,
                   m->ao, (size_t)A, NULL, B, Nl, L, m->hc, Dh, 1.0f / sqrtf((float)Dh));
    if (c->image_dim) { /* the same q against the image context, added */
        size_t ld2 = 2 * (size_t)A;
        lin(m, m->im_ctx, Dz, &b->kvi, m->kvim, ld2, B * m->Li, 2 * A, D, DITD_ACT_NONE);
        if ((err = rms_across(m, m->kvim, ld2, B * m->Li, b->nki)))
            return err;
        ops->attention(m->qkv, ld3, m->kvim, ld2, at(m, m->kvim, (size_t)A), ld2, m->aoi,
                       (size_t)A, NULL, B, Nl, m->Li, m->hc, Dh, 1.0f / sqrtf((float)Dh));
        ops->add(m->ao, m->aoi, (size_t)M * (size_t)A);
    }
    if ((err = row_lin(m, m->ao, (size_t)A, &b->out2, m->xn, M, A)))
        return err;
    return mod_end(m, id, m->xn);
}

/* WanTransformerBlock l over this rank's tokens img (B, Nl, D); R modulation
 * rows (pf: per frame). Its modules for TaylorSeer (wan_denoiser.c): 4l the
 * block (img), 4l + 1 attn1, 4l + 2 attn2, 4l + 3 ffn (each its output in xn,
 * before the gate / residual, as the Diffusers modules return it). */
static int block(ditd_wan *m, int l, const ditd_wan_block *b, int B, int R, int pf)
{
    const ditd_backend_ops *ops = m->ops;
    const ditd_wan_config *c = &m->cfg;
    int D = c->inner_dim, Nl = m->n_loc, Fl = m->fc, M = B * Nl, err, pred;
    size_t Dz = (size_t)D, ld6 = 6 * Dz;

    if ((err = mod_begin(m, 4 * l, m->img, &pred)) || pred)
        return err;
    /* [shift, scale, gate, c_shift, c_scale, c_gate] = scale_shift_table + timestep_proj */
    ops->copy2d(m->mod, ld6, m->tp6, ld6, (size_t)R, ld6);
    for (size_t r = 0; r < (size_t)R; r++)
        ops->add(at(m, m->mod, r * ld6), b->sst, ld6);

    /* self-attention, gated */
    modulate(m, B, pf, m->img, m->xn, m->mod, ld6, 0, 1);
    if ((err = mod_begin(m, 4 * l + 1, m->xn, &pred)))
        return err;
    if (!pred && (err = self_attention(m, b, B, 4 * l + 1)))
        return err;
    gated(m, B, pf, m->img, m->xn, m->mod, ld6, 2);

    /* cross-attention of norm2(x) to the whole text (every rank holds it),
     * no RoPE, plain residual */
    const void *src = m->img;
    if (c->cross_attn_norm) { /* LN(x) w + b as LN(x) (1 + (w - 1)) + b, one row for all */
        ops->layernorm_modulate(m->img, m->xn, 1, M, D, c->eps, b->n2b, b->n2w, Dz);
        src = m->xn;
    }
    if ((err = mod_begin(m, 4 * l + 2, m->xn, &pred)))
        return err;
    if (!pred && (err = cross_attention(m, b, B, src, 4 * l + 2)))
        return err;
    ops->add(m->img, m->xn, (size_t)M * Dz);

    /* FFN: GELU(tanh) between net.0.proj and net.2, gated */
    modulate(m, B, pf, m->img, m->xn, m->mod, ld6, 3, 4);
    if ((err = mod_begin(m, 4 * l + 3, m->xn, &pred)))
        return err;
    if (!pred) {
        lin(m, m->xn, Dz, &b->ff1, m->hid, (size_t)Fl, M, Fl, D, DITD_ACT_GELU_TANH);
        if ((err = row_lin(m, m->hid, (size_t)Fl, &b->ff2, m->xn, M, Fl)) ||
            (err = mod_end(m, 4 * l + 3, m->xn)))
            return err;
    }
    gated(m, B, pf, m->img, m->xn, m->mod, ld6, 5);
    return mod_end(m, 4 * l, m->img);
}

/* The forward's ops in order; arguments checked by ditd_wan_forward. */
static int forward_ops(ditd_wan *m, int B, const void *x, const float *h_t,
                       const float *h_t_frames, const float *h_text, const float *h_image,
                       void *out)
{
    const ditd_backend_ops *ops = m->ops;
    const ditd_wan_config *c = &m->cfg;
    int D = c->inner_dim, N = m->N, Nl = m->n_loc, L = m->L, p = c->patch_h;
    int Co = p * p * c->out_channels, cp = m->lay.ring * m->lay.ulysses > 1;
    int pf = h_t_frames != NULL, R = pf ? B * m->F : B, err;
    size_t Dz = (size_t)D, Dt = (size_t)c->text_dim;

    /* patch_embedding, Conv3d (1, p, p) stride (1, p, p): per frame a 2-D
     * patch embedding; x (B, C, F, h, w) is the image (B, C, F h, w) whose
     * patches never cross a frame, tokens (f, row, col). Under cp every
     * rank embeds the whole video (cheap) and keeps its own tokens. */
    ops->patch_embed(x, m->patch.w, m->patch.b, NULL, cp ? m->embed : m->img, m->scratch, B,
                     c->in_channels, m->F * m->h, m->w, p, D);
    if (cp)
        for (size_t b = 0; b < (size_t)B; b++) /* (B, Nl, D) */
            ops->copy2d(at(m, m->img, b * (size_t)Nl * Dz), Dz,
                        at(m, m->embed, (b * (size_t)N + (size_t)m->tok0) * Dz), Dz, (size_t)Nl,
                        Dz);

    /* the timesteps of the modulation rows: t (B), or t_frames (B, F) */
    for (int r = 0; r < R; r++)
        m->h_t[r] = pf ? h_t_frames[r] : h_t[r];
    time_embedding(m, R);

    /* text_embedder (PixArtAlphaTextProjection, GELU-tanh): the whole text
     * on every rank */
    ops->upload(m->text_in, h_text, (size_t)B * (size_t)L * Dt);
    lin(m, m->text_in, Dt, &m->x1, m->ctx_h, Dz, B * L, D, c->text_dim, DITD_ACT_GELU_TANH);
    lin(m, m->ctx_h, Dz, &m->x2, m->ctx, Dz, B * L, D, D, DITD_ACT_NONE);

    if (c->image_dim)
        image_embedding(m, B, h_image);

    /* the blocks; step caching's block hooks (engine/models/denoiser.h)
     * around them as Diffusers' hooks take blocks.0 as the head and
     * blocks.-1 as the tail. The text context is an input of every block,
     * not a stream they change: only the video stream is kept. */
    const ditd_denoiser_cache *cc = m->base.cache;
    ditd_cache_streams cs = {B, m->img, Nl, m->tok0, NULL, 0, D};
    int run = 1;
    if (cc && (err = cc->blocks_begin(cc->ctx, &cs, &run)))
        return err;
    for (int l = 0; run && l < c->num_layers; l++) {
        if ((err = block(m, l, &m->blk[l], B, R, pf)))
            return err;
        if (l == 0 && cc && (err = cc->first_block_done(cc->ctx, &cs, &run)))
            return err;
        if (run && l == c->num_layers - 1 && cc && (err = cc->blocks_end(cc->ctx, &cs)))
            return err;
    }

    /* norm_out (no affine) with [shift, scale] = scale_shift_table + temb,
     * proj_out: tokens (B, Nl, p p Co), or TaylorSeer's prediction of them
     * (module 4 num_layers: use_lite_mode) */
    void *tok = cp ? m->tok_loc : m->tok_out;
    int pred;
    modulate(m, B, pf, m->img, m->xn, m->mod_out, 2 * Dz, 0, 1);
    if ((err = mod_begin(m, 4 * c->num_layers, tok, &pred)))
        return err;
    if (!pred) {
        lin(m, m->xn, Dz, &m->proj, tok, (size_t)Co, B * Nl, Co, D, DITD_ACT_NONE);
        if ((err = mod_end(m, 4 * c->num_layers, tok)))
            return err;
    }
    if (cp) { /* gather the tokens: cp rank s's block is (B, N_s, p p Co) */
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
    /* unpatchify: (B, F gh gw, p p Co) in (dy, dx, c) order -> (B, Co, F h, w)
     * = (B, Co, F, h, w) */
    ops->unpatchify(m->tok_out, out, B, c->out_channels, m->F * m->gh, m->gw, p);
    return ops->status();
}

int ditd_wan_forward(ditd_wan *m, int B, const void *x, const float *h_t,
                     const float *h_t_frames, const float *h_text, const float *h_image,
                     void *out)
{
    if (!m->cpa)
        return ditd_err_set(DITD_EINVAL,
                            "Wan model has no activations (a set_size failed): set a size again");
    if (B <= 0 || B > m->max_batch)
        return ditd_err_set(DITD_EINVAL, "batch %d outside 1..%d", B, m->max_batch);
    if (!h_text)
        return ditd_err_set(DITD_EINVAL, "Wan needs the text sequence");
    if (!h_t_frames && !h_t)
        return ditd_err_set(DITD_EINVAL, "Wan needs timesteps");
    if (m->cfg.image_dim && !h_image)
        return ditd_err_set(DITD_EINVAL,
                            "this Wan model has an image branch (image_dim = %d): it needs the CLIP image embeddings (%d tokens)",
                            m->cfg.image_dim, m->Li);
    if (!m->cfg.image_dim && h_image)
        return ditd_err_set(DITD_EINVAL, "this Wan model has no image branch (image_dim)");
    for (int i = 0; i < B; i++) {
        if (h_t_frames) {
            for (int f = 0; f < m->F; f++)
                if (!isfinite(h_t_frames[(size_t)i * (size_t)m->F + (size_t)f]))
                    return ditd_err_set(DITD_EINVAL,
                                        "timestep of sample %d, frame %d is not finite", i, f);
        } else if (!isfinite(h_t[i])) {
            return ditd_err_set(DITD_EINVAL, "timestep of sample %d is not finite", i);
        }
    }
    m->fwd_B = B;
    return forward_ops(m, B, x, h_t, h_t_frames, h_text, h_image, out);
}
