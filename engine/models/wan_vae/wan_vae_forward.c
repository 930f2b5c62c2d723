/* AutoencoderKLWan compute: the decoder and the encoder read top to bottom
 * as Diffusers writes them (WanDecoder3d / WanEncoder3d, WanResidualBlock,
 * WanAttentionBlock, WanResample, the residual up/down blocks), one chunk
 * of frames at a time, and the activation plan.
 *
 * Tensors are chunks (T, C, H, W), frame-major: frame t is C contiguous
 * planes of H W floats, so per-frame ops (the spatial resamplers, the
 * attention) take frames as a batch and a causal convolution reads its
 * frames through pointers. A causal convolution of kernel time 3 reads, for
 * output frame t, the frames [t - 2, t] of (its cache ++ the chunk), and
 * zeros before the cache's first frame: what WanCausalConv3d computes with
 * feat_cache (the cache holds the convolution's last 2 input frames).
 *
 * The plan: ditd__wan_vae_plan runs one decode chunk and one encode chunk
 * at their largest (the second chunk: most frames; the planned sizes) with
 * v->planning set: no op runs, every buffer, cache and scratch records
 * what it would need, and the arena is carved from those numbers. The
 * code that plans is the code that runs.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/error.h"
#include "engine/core/philox.h"
#include "engine/models/wan_vae/wan_vae_internal.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/text_kernels.h"

#define WAN_SCRATCH_CAP ((size_t)8 << 20) /* im2col floats per GEMM chunk, at most */

typedef struct vid { /* a chunk in buf[b]: (T, C, H, W) */
    int b, T, C, H, W;
} vid;

static size_t zmax(size_t a, size_t b)
{
    return a > b ? a : b;
}

static size_t fsize(const vid *x)
{
    return (size_t)x->C * x->H * x->W;
}

/* Frame t of x (NULL while planning). */
static void *fr(const ditd_wan_vae *v, const vid *x, int t)
{
    if (v->planning)
        return NULL;
    return ditd_ptr_act(v->ops, v->buf[x->b], (size_t)t * fsize(x));
}

/* A free buffer for a chunk (T, C, H, W). */
static vid grab(ditd_wan_vae *v, int T, int C, int H, int W)
{
    vid y = {-1, T, C, H, W};
    for (int i = 0; i < WAN_NBUF; i++)
        if (!(v->busy & (1u << i))) {
            y.b = i;
            break;
        }
    if (y.b < 0) { /* a bug: the forward holds at most WAN_NBUF chunks */
        v->bug = 1;
        y.b = 0;
    }
    v->busy |= 1u << y.b;
    if (v->planning)
        v->act_n = zmax(v->act_n, (size_t)T * fsize(&y));
    return y;
}

static void drop(ditd_wan_vae *v, const vid *x)
{
    v->busy &= ~(1u << x->b);
}

static void need_scratch(ditd_wan_vae *v, int cin, int taps, int cout, int rows, int W)
{
    /* (Cin taps + Cout) W a row covers the CPU's im2col and the CUDA GEMM's output */
    size_t row = ((size_t)cin * taps + (size_t)cout) * (size_t)W, full = row * (size_t)rows;
    if (v->planning)
        v->scratch_n = zmax(v->scratch_n, full < zmax(row, WAN_SCRATCH_CAP) ? full
                                                                            : zmax(row, WAN_SCRATCH_CAP));
}

/* ---- the feature cache ---- */

static void cache_need(ditd_wan_vae *v, wcache *k, size_t elems)
{
    if (v->planning)
        k->elems = zmax(k->elems, elems);
}

/* After a convolution read (cache ++ x): keep the last two input frames. */
static void cache_push(ditd_wan_vae *v, wcache *k, const vid *x)
{
    const size_t n = fsize(x);
    cache_need(v, k, n);
    for (int t = x->T >= 2 ? x->T - 2 : 0; t < x->T; t++) {
        if (k->n == 2) { /* drop the oldest: rotate the slots */
            void *f0 = k->f[0];
            k->f[0] = k->f[1];
            k->f[1] = f0;
            k->n = 1;
        }
        if (!v->planning)
            v->ops->copy2d(k->f[k->n], n, fr(v, x, t), n, 1, n);
        k->n++;
    }
}

/* ---- ops on chunks ---- */

/* WanCausalConv3d of x into a new chunk; with a cache (kernel time 3, time
 * padding 2) the frames before x come from it, then zeros; without (1x1x1)
 * frame by frame. Drops x unless keep_x. */
static vid cconv(ditd_wan_vae *v, const wconv *c, wcache *k, vid *x, int keep_x)
{
    const ditd_backend_ops *ops = v->ops;
    const int pad = c->k / 2;
    vid y = grab(v, x->T, c->cout, x->H, x->W);
    need_scratch(v, c->cin, c->kt * c->k * c->k, c->cout, x->H, x->W);
    for (int t = 0; t < x->T && !v->planning; t++) {
        const void *xf[3] = {NULL, NULL, NULL};
        for (int j = 0; j < c->kt; j++) {
            int s = t - (c->kt - 1) + j; /* frame index in x; < 0: the cache, then zeros */
            if (s >= 0)
                xf[j] = fr(v, x, s);
            else if (k && k->n + s >= 0)
                xf[j] = k->f[k->n + s];
        }
        ops->conv3d_frame(xf, c->kt, (size_t)x->H * x->W, c->w, c->b, fr(v, &y, t),
                          (size_t)x->H * x->W, v->scratch, v->scratch_n, c->cin, x->H, x->W,
                          c->cout, c->k, pad);
    }
    if (k)
        cache_push(v, k, x);
    if (!keep_x)
        drop(v, x);
    return y;
}

/* WanRMS_norm (+ SiLU) of every frame of x into a new chunk. */
static vid rmsnorm(ditd_wan_vae *v, const void *gamma, const vid *x, int silu)
{
    vid y = grab(v, x->T, x->C, x->H, x->W);
    const size_t n = (size_t)x->H * x->W;
    for (int t = 0; t < x->T && !v->planning; t++)
        v->ops->rmsnorm_channels(fr(v, x, t), n, fr(v, &y, t), n, x->C, (int)n, gamma, silu);
    return y;
}

/* WanResidualBlock: x -> conv_shortcut(x) + conv2(silu(norm2(conv1(silu(norm1(x)))))). */
static vid resnet(ditd_wan_vae *v, wres *r, vid x)
{
    vid h = x; /* the shortcut */
    if (r->has_sc)
        h = cconv(v, &r->sc, NULL, &x, 1);
    vid a = rmsnorm(v, r->g1, &x, 1);
    if (r->has_sc)
        drop(v, &x);
    vid b = cconv(v, &r->c1, &r->k1, &a, 0);
    vid c = rmsnorm(v, r->g2, &b, 1);
    drop(v, &b);
    vid d = cconv(v, &r->c2, &r->k2, &c, 0);
    if (!v->planning)
        v->ops->add(fr(v, &d, 0), fr(v, &h, 0), (size_t)d.T * fsize(&d));
    drop(v, &h);
    return d;
}

/* WanAttentionBlock, frame by frame: x += proj(attention(qkv(norm(x)))),
 * one head of C over the frame's H W positions. */
static void attention(ditd_wan_vae *v, const wattn *a, vid *x)
{
    const ditd_backend_ops *ops = v->ops;
    const int C = a->C, N = x->H * x->W;
    const float scale = (float)(1.0 / sqrt((double)C));
    vid nrm = grab(v, 1, C, x->H, x->W);
    if (v->planning) {
        v->qkv_n = zmax(v->qkv_n, (size_t)3 * C * N);
        v->tok_n = zmax(v->tok_n, (size_t)C * N);
        if (C > DITD_CPU_ATTN_MAX_DH || v->opts.gemm_attention)
            v->score_n = zmax(v->score_n, (size_t)N * N);
    }
    for (int t = 0; t < x->T && !v->planning; t++) {
        void *xt = fr(v, x, t), *nt = fr(v, &nrm, 0);
        const void *one[1] = {nt};
        ops->rmsnorm_channels(xt, (size_t)N, nt, (size_t)N, C, N, a->g, 0);
        one[0] = nt;
        ops->conv3d_frame(one, 1, (size_t)N, a->qkv.w, a->qkv.b, v->qkv, (size_t)N, NULL, 0, C,
                          x->H, x->W, 3 * C, 1, 0);                       /* (3C, N) */
        ops->planes_to_tokens(v->qkv, (size_t)N, v->tq, C, N);            /* (N, C) each */
        ops->planes_to_tokens(ditd_ptr_act(ops, v->qkv, (size_t)C * N), (size_t)N, v->tk, C, N);
        ops->planes_to_tokens(ditd_ptr_act(ops, v->qkv, (size_t)2 * C * N), (size_t)N, v->tv, C, N);
        if (C <= DITD_CPU_ATTN_MAX_DH && !v->opts.gemm_attention)
            ops->attention(v->tq, C, v->tk, C, v->tv, C, v->to, C, NULL, 1, N, N, 1, C, scale);
        else
            ops->attention_masked(v->tq, C, v->tk, C, v->tv, C, v->to, C, 1, N, 1, C, scale, NULL,
                                  NULL, 0, v->score);
        ops->tokens_to_planes(v->to, nt, (size_t)N, C, N, 0);
        one[0] = nt;
        ops->conv3d_frame(one, 1, (size_t)N, a->proj.w, a->proj.b, v->qkv, (size_t)N, NULL, 0, C,
                          x->H, x->W, C, 1, 0);
        ops->add(xt, v->qkv, (size_t)C * N);
    }
    drop(v, &nrm);
}

static vid mid_block(ditd_wan_vae *v, wcoder *cd, vid x)
{
    x = resnet(v, &cd->mid0, x);
    attention(v, &cd->attn, &x);
    return resnet(v, &cd->mid1, x);
}

/* nn.Conv2d 3x3 of every frame (stride s; pads t, b, l, r) into a new chunk. */
static vid conv2d_frames(ditd_wan_vae *v, const wconv *c, vid *x, int s, int pt, int pb, int pl,
                         int pr)
{
    const int Ho = (x->H + pt + pb - 3) / s + 1, Wo = (x->W + pl + pr - 3) / s + 1;
    vid y = grab(v, x->T, c->cout, Ho, Wo);
    need_scratch(v, c->cin, 9, c->cout, Ho, Wo);
    if (!v->planning)
        v->ops->conv2d(fr(v, x, 0), (size_t)x->H * x->W, c->w, c->b, fr(v, &y, 0),
                       (size_t)Ho * Wo, v->scratch, v->scratch_n, x->T, c->cin, x->H, x->W,
                       c->cout, 3, s, pt, pb, pl, pr);
    drop(v, x);
    return y;
}

/* WanResample, decoder side: upsample3d's time convolution (from the
 * second chunk on: each frame becomes two, the conv's channel halves), then
 * per frame nearest-exact x2 (nearest, at scale 2) and a 3x3 conv. */
static vid upsample(ditd_wan_vae *v, wsample *rs, vid x)
{
    if (rs->mode == WS_UP3D) {
        if (!rs->started) {
            rs->started = 1; /* feat_cache "Rep": the first chunk keeps its frames */
        } else {
            x = cconv(v, &rs->time, &rs->tc, &x, 0); /* (T, 2C) = (2T, C): frame 2t, 2t + 1 */
            x.T *= 2;
            x.C /= 2;
        }
    }
    vid u = grab(v, x.T, x.C, 2 * x.H, 2 * x.W);
    if (!v->planning)
        v->ops->upsample_nearest2x(fr(v, &x, 0), (size_t)x.H * x.W, fr(v, &u, 0),
                                   (size_t)u.H * u.W, x.T, x.C, x.H, x.W);
    drop(v, &x);
    return conv2d_frames(v, &rs->conv, &u, 1, 1, 1, 1, 1);
}

/* WanResample, encoder side: per frame ZeroPad2d (0, 1, 0, 1) and a 3x3
 * stride-2 conv; downsample3d then (from the second chunk on) a stride-2
 * time convolution over (the last frame of the chunk before ++ x). */
static vid downsample(ditd_wan_vae *v, wsample *rs, vid x)
{
    x = conv2d_frames(v, &rs->conv, &x, 2, 0, 1, 0, 1);
    if (rs->mode != WS_DOWN3D)
        return x;
    const size_t n = fsize(&x);
    wcache *k = &rs->tc;
    cache_need(v, k, n);
    if (!rs->started) { /* the first chunk passes; its last frame is kept */
        rs->started = 1;
    } else {
        const int To = (x.T + 1 - 3) / 2 + 1;
        const wconv *c = &rs->time;
        vid y = grab(v, To, c->cout, x.H, x.W);
        need_scratch(v, c->cin, 3, c->cout, x.H, x.W);
        for (int t = 0; t < To && !v->planning; t++) {
            const void *xf[3];
            for (int j = 0; j < 3; j++) {
                int s = 2 * t + j - 1; /* -1: the cached frame */
                xf[j] = s < 0 ? k->f[0] : fr(v, &x, s);
            }
            v->ops->conv3d_frame(xf, 3, (size_t)x.H * x.W, c->w, c->b, fr(v, &y, t),
                                 (size_t)x.H * x.W, v->scratch, v->scratch_n, c->cin, x.H, x.W,
                                 c->cout, 1, 0);
        }
        if (!v->planning)
            v->ops->copy2d(k->f[0], n, fr(v, &x, x.T - 1), n, 1, n);
        drop(v, &x);
        return y;
    }
    if (!v->planning)
        v->ops->copy2d(k->f[0], n, fr(v, &x, x.T - 1), n, 1, n);
    k->n = 1;
    return x;
}

/* AvgDown3D(x_copy) added to y: the time padding (zeros in front) makes
 * x_copy's frames a multiple of ft. */
static void avgdown_add(ditd_wan_vae *v, const wblock *b, const vid *xc, vid *y)
{
    const int ft = b->sc_ft, pad = (ft - xc->T % ft) % ft;
    for (int t = 0; t < y->T && !v->planning; t++) {
        const void *xf[2] = {NULL, NULL};
        for (int a = 0; a < ft; a++) {
            int s = t * ft + a - pad;
            xf[a] = s >= 0 ? fr(v, xc, s) : NULL;
        }
        v->ops->avgdown3d_frame(xf, (size_t)xc->H * xc->W, xc->C, xc->H, xc->W, y->C, ft, b->sc_fs,
                                fr(v, y, t), (size_t)y->H * y->W, 1);
    }
}

/* DupUp3D(x_copy) added to y; in the first chunk only the last of each
 * frame's ft copies (first_chunk drops factor_t - 1 frames). */
static void dupup_add(ditd_wan_vae *v, const wblock *b, const vid *xc, vid *y, int first)
{
    const int ft = b->sc_ft, skip = first ? ft - 1 : 0;
    for (int t = 0; t < y->T && !v->planning; t++) {
        const int o = t + skip; /* output frame o = s ft + a of the duplicated chunk */
        v->ops->dupup3d_frame(fr(v, xc, o / ft), (size_t)xc->H * xc->W, xc->C, xc->H, xc->W, y->C,
                              ft, b->sc_fs, o % ft, fr(v, y, t), (size_t)y->H * y->W, 1);
    }
}

/* ---- the decoder and the encoder, one chunk ---- */

static vid decoder_chunk(ditd_wan_vae *v, vid x, int first)
{
    wcoder *d = &v->dec;
    x = cconv(v, &d->conv_in, &d->kin, &x, 0);
    x = mid_block(v, d, x);
    for (int i = 0; i < d->n_blocks; i++) {
        wblock *b = &d->blocks[i];
        vid xc = x;
        int keep = b->shortcut;
        if (keep) { /* x_copy: the block's input, kept for the shortcut */
            xc = grab(v, x.T, x.C, x.H, x.W);
            if (!v->planning)
                v->ops->copy2d(fr(v, &xc, 0), 1, fr(v, &x, 0), 1, 1, (size_t)x.T * fsize(&x));
        }
        for (int j = 0; j < b->n_res; j++)
            x = resnet(v, &b->res[j], x);
        if (b->rs.mode != WS_NONE)
            x = upsample(v, &b->rs, x);
        if (keep) {
            dupup_add(v, b, &xc, &x, first);
            drop(v, &xc);
        }
    }
    vid n = rmsnorm(v, d->norm_out, &x, 1);
    drop(v, &x);
    return cconv(v, &d->conv_out, &d->kout, &n, 0);
}

static vid encoder_chunk(ditd_wan_vae *v, vid x)
{
    wcoder *e = &v->enc;
    x = cconv(v, &e->conv_in, &e->kin, &x, 0);
    for (int i = 0; i < e->n_blocks; i++) {
        wblock *b = &e->blocks[i];
        vid xc = x;
        if (b->shortcut) {
            xc = grab(v, x.T, x.C, x.H, x.W);
            if (!v->planning)
                v->ops->copy2d(fr(v, &xc, 0), 1, fr(v, &x, 0), 1, 1, (size_t)x.T * fsize(&x));
        }
        for (int j = 0; j < b->n_res; j++)
            x = resnet(v, &b->res[j], x);
        if (b->rs.mode != WS_NONE)
            x = downsample(v, &b->rs, x);
        if (b->shortcut) {
            avgdown_add(v, b, &xc, &x);
            drop(v, &xc);
        }
    }
    x = mid_block(v, e, x);
    vid n = rmsnorm(v, e->norm_out, &x, 1);
    drop(v, &x);
    return cconv(v, &e->conv_out, &e->kout, &n, 0);
}

/* Every cache and resampler as before a clip (clear_cache). */
static void reset_coder(wcoder *c)
{
    c->kin.n = c->kout.n = 0;
    c->mid0.k1.n = c->mid0.k2.n = c->mid1.k1.n = c->mid1.k2.n = 0;
    for (int i = 0; i < c->n_blocks; i++) {
        wblock *b = &c->blocks[i];
        for (int j = 0; j < b->n_res; j++)
            b->res[j].k1.n = b->res[j].k2.n = 0;
        b->rs.tc.n = 0;
        b->rs.started = 0;
    }
}

/* ---- the plan ---- */

static int carve(ditd_wan_vae *v, void **p, size_t n)
{
    int err = 0;
    *p = n ? ditd_arena_bytes(&v->acts, n * ditd_dtype_size(v->ops->act_dtype), &err) : NULL;
    return err;
}

static int carve_cache(ditd_wan_vae *v, wcache *k)
{
    return carve(v, &k->f[0], k->elems) | carve(v, &k->f[1], k->elems);
}

static int carve_coder(ditd_wan_vae *v, wcoder *c)
{
    int err = carve_cache(v, &c->kin) | carve_cache(v, &c->kout);
    wres *mids[2] = {&c->mid0, &c->mid1};
    for (int i = 0; i < 2; i++)
        err |= carve_cache(v, &mids[i]->k1) | carve_cache(v, &mids[i]->k2);
    for (int i = 0; i < c->n_blocks; i++) {
        wblock *b = &c->blocks[i];
        for (int j = 0; j < b->n_res; j++)
            err |= carve_cache(v, &b->res[j].k1) | carve_cache(v, &b->res[j].k2);
        err |= carve_cache(v, &b->rs.tc);
    }
    return err;
}

static int carve_acts(ditd_wan_vae *v)
{
    int err = 0;
    for (int i = 0; i < WAN_NBUF; i++)
        err |= carve(v, &v->buf[i], v->act_n);
    err |= carve(v, &v->scratch, v->scratch_n);
    err |= carve(v, &v->qkv, v->qkv_n);
    err |= carve(v, &v->tq, v->tok_n) | carve(v, &v->tk, v->tok_n) | carve(v, &v->tv, v->tok_n);
    err |= carve(v, &v->to, v->tok_n);
    err |= carve(v, &v->score, v->score_n);
    if (v->has_dec)
        err |= carve_coder(v, &v->dec);
    if (v->has_enc)
        err |= carve_coder(v, &v->enc);
    return err ? DITD_ENOMEM : 0;
}

int ditd__wan_vae_plan(ditd_wan_vae *v)
{
    const ditd_wan_vae_config *c = &v->cfg;
    const int p = c->patch_size;
    int err;

    v->planning = 1;
    if (v->has_dec) {
        int h = v->opts.max_h, w = v->opts.max_w;
        if (v->opts.tiling) { /* a tile at most */
            h = h < ditd__wan_vae_tile_latent(v, 0) ? h : ditd__wan_vae_tile_latent(v, 0);
            w = w < ditd__wan_vae_tile_latent(v, 1) ? w : ditd__wan_vae_tile_latent(v, 1);
        }
        if (h * w > DITD_CPU_MASKED_ATTN_MAX_N &&
            (v->dec.attn.C > DITD_CPU_ATTN_MAX_DH || v->opts.gemm_attention))
            return ditd_err_set(DITD_EUNSUPPORTED,
                                "Wan VAE: a %d x %d latent is %d positions per frame; the decoder's "
                                "attention head of %d takes at most %d", h, w, h * w, v->dec.attn.C,
                                DITD_CPU_MASKED_ATTN_MAX_N);
        /* two chunks: the first, then one as large as any later one */
        for (int first = 1; first >= 0; first--) {
            vid z = grab(v, 1, c->z_dim, h, w);
            z = cconv(v, &v->post_quant, NULL, &z, 0);
            vid y = decoder_chunk(v, z, first);
            drop(v, &y);
        }
        v->h_frame_n = zmax(v->h_frame_n, (size_t)c->out_channels * h * w *
                                              (size_t)(1 << (c->n_mult - 1)) * (1 << (c->n_mult - 1)));
        v->h_frame_n = zmax(v->h_frame_n, (size_t)c->z_dim * h * w);
        reset_coder(&v->dec);
    }
    if (v->has_enc) {
        const int H = v->opts.max_video_h / p, W = v->opts.max_video_w / p;
        const int h = ditd_wan_vae_latent_side(c, v->opts.max_video_h);
        const int w = ditd_wan_vae_latent_side(c, v->opts.max_video_w);
        if (h < 1 || w < 1)
            return ditd_err_set(DITD_EINVAL, "Wan VAE encoder: video %d x %d too small",
                                v->opts.max_video_h, v->opts.max_video_w);
        if (h * w > DITD_CPU_MASKED_ATTN_MAX_N &&
            (v->enc.attn.C > DITD_CPU_ATTN_MAX_DH || v->opts.gemm_attention))
            return ditd_err_set(DITD_EUNSUPPORTED,
                                "Wan VAE: a %d x %d latent is %d positions per frame; the encoder's "
                                "attention head of %d takes at most %d", h, w, h * w, v->enc.attn.C,
                                DITD_CPU_MASKED_ATTN_MAX_N);
        for (int T = 1; T <= 4; T += 3) {
            vid x = grab(v, T, c->in_channels, H, W);
            vid y = encoder_chunk(v, x);
            y = cconv(v, &v->quant, NULL, &y, 0);
            drop(v, &y);
        }
        v->h_frame_n = zmax(v->h_frame_n, (size_t)c->in_channels * H * W);
        v->h_frame_n = zmax(v->h_frame_n, (size_t)2 * c->z_dim * h * w);
        reset_coder(&v->enc);
    }
    v->planning = 0;
    v->busy = 0;
    if (v->bug)
        return ditd_err_set(DITD_EINTERNAL, "Wan VAE: the forward holds more than %d chunks",
                            WAN_NBUF);
    if ((err = carve_acts(v)) || (err = ditd_arena_commit(&v->acts, v->acts.peak_plan)))
        return err;
    ditd_arena_reset(&v->acts);
    if ((err = carve_acts(v)))
        return err;
    if (!(v->h_frame = malloc(v->h_frame_n * sizeof *v->h_frame)))
        return ditd_err_set(DITD_ENOMEM, "Wan VAE host frame (%zu floats)", v->h_frame_n);
    return v->has_dec && v->opts.tiling ? ditd__wan_vae_plan_tiles(v) : 0;
}

/* ---- decode ---- */

int ditd__wan_vae_decode_clip(ditd_wan_vae *v, const float *z, int T, int hz, int wz, int i0,
                              int j0, int h, int w, ditd__wan_frame_sink sink, void *ctx)
{
    const ditd_wan_vae_config *c = &v->cfg;
    const ditd_backend_ops *ops = v->ops;
    int f0 = 0, err;

    reset_coder(&v->dec);
    v->busy = 0;
    for (int t = 0; t < T; t++) {
        /* latent frame t of the window: (z_dim, h, w) from (z_dim, T, hz, wz) */
        vid x = grab(v, 1, c->z_dim, h, w);
        for (int ch = 0; ch < c->z_dim; ch++)
            for (int r = 0; r < h; r++)
                memcpy(v->h_frame + ((size_t)ch * h + r) * w,
                       z + (((size_t)ch * T + t) * hz + i0 + r) * wz + j0, (size_t)w * sizeof *z);
        ops->upload(fr(v, &x, 0), v->h_frame, (size_t)c->z_dim * h * w);
        x = cconv(v, &v->post_quant, NULL, &x, 0);
        vid y = decoder_chunk(v, x, t == 0);
        for (int k = 0; k < y.T; k++, f0++) {
            ops->download(v->h_frame, fr(v, &y, k), fsize(&y));
            if ((err = ops->status()) || (err = sink(ctx, f0, v->h_frame, y.C, y.H, y.W)))
                return err;
        }
        drop(v, &y);
    }
    if (f0 != ditd_wan_vae_config_frames(c, T))
        return ditd_err_set(DITD_EINTERNAL, "Wan VAE decode: %d frames, expected %d", f0,
                            ditd_wan_vae_config_frames(c, T));
    return 0;
}

void ditd__wan_vae_put_frame(const ditd_wan_vae_config *c, const float *src, int hh, int ww,
                             int y0, int x0, int nh, int nw, float *out, int F, int f, int Ho,
                             int Wo)
{
    const int p = c->patch_size, Cp = c->out_channels / (p * p);
    for (int ch = 0; ch < Cp; ch++)
        for (int r = 0; r < nh * p; r++)
            for (int q = 0; q < nw * p; q++) {
                /* channel ch p^2 + (q % p) p + r % p at (r / p, q / p) */
                const int sc = ch * p * p + (q % p) * p + r % p;
                float val = src[((size_t)sc * hh + r / p) * ww + q / p];
                val = val < -1.0f ? -1.0f : val > 1.0f ? 1.0f : val;
                out[(((size_t)ch * F + f) * Ho + (size_t)y0 * p + r) * Wo + (size_t)x0 * p + q] = val;
            }
}

typedef struct whole_sink {
    const ditd_wan_vae_config *c;
    float *out;
    int F, Ho, Wo;
} whole_sink;

/* A whole-latent decode's frame: unpatchify, clamp, into (C, F, H, W). */
static int put_whole(void *ctx, int f, const float *frame, int C, int hh, int ww)
{
    const whole_sink *s = ctx;
    (void)C;
    ditd__wan_vae_put_frame(s->c, frame, hh, ww, 0, 0, hh, ww, s->out, s->F, f, s->Ho, s->Wo);
    return 0;
}

int ditd_wan_vae_decode(ditd_wan_vae *v, const float *z, int B, int T, int h, int w, float *frames)
{
    const ditd_wan_vae_config *c = &v->cfg;
    const int p = c->patch_size, s = ditd_wan_vae_config_scale_factor(c), Cp = c->out_channels / (p * p);
    const int F = ditd_wan_vae_config_frames(c, T), Ho = h * s, Wo = w * s;
    const size_t zn = (size_t)c->z_dim * T * h * w, fn = (size_t)Cp * F * Ho * Wo;
    int err;

    if (!v->has_dec)
        return ditd_err_set(DITD_EINVAL, "Wan VAE decode: loaded without a decoder (max_h/w)");
    if (B < 1 || T < 1 || h < 1 || w < 1 || h > v->opts.max_h || w > v->opts.max_w)
        return ditd_err_set(DITD_EINVAL,
                            "Wan VAE decode: %d latents of %d frames of %d x %d (planned up to %d x %d)",
                            B, T, h, w, v->opts.max_h, v->opts.max_w);
    if (ditd__wan_vae_tiled(v, h, w) && T > v->opts.max_frames)
        return ditd_err_set(DITD_EINVAL, "Wan VAE tiled decode: %d latent frames (planned up to %d)",
                            T, v->opts.max_frames);
    for (int bi = 0; bi < B; bi++) {
        const float *zb = z + (size_t)bi * zn;
        float *ob = frames + (size_t)bi * fn;
        if (ditd__wan_vae_tiled(v, h, w)) {
            err = ditd__wan_vae_decode_tiled(v, zb, T, h, w, ob);
        } else {
            whole_sink ws = {c, ob, F, Ho, Wo};
            err = ditd__wan_vae_decode_clip(v, zb, T, h, w, 0, 0, h, w, put_whole, &ws);
        }
        if (err)
            return err;
    }
    return 0;
}

/* ---- encode ---- */

int ditd_wan_vae_encode(ditd_wan_vae *v, const float *x, int B, int F, int H, int W,
                        uint64_t seed, float *mean, float *sample)
{
    const ditd_wan_vae_config *c = &v->cfg;
    const ditd_backend_ops *ops = v->ops;
    const int p = c->patch_size, Cp = c->in_channels / (p * p), Z = c->z_dim;
    const int s = ditd_wan_vae_config_scale_factor(c);
    const int T = ditd_wan_vae_encode_frames(c, F), Hp = H / p, Wp = W / p;
    int err;

    if (!v->has_enc)
        return ditd_err_set(DITD_EINVAL, "Wan VAE encode: loaded without an encoder (max_video_h/w)");
    if (B < 1 || F < 1 || H < 1 || W < 1 || H > v->opts.max_video_h || W > v->opts.max_video_w)
        return ditd_err_set(DITD_EINVAL,
                            "Wan VAE encode: %d videos of %d frames of %d x %d (planned up to %d x %d)",
                            B, F, H, W, v->opts.max_video_h, v->opts.max_video_w);
    if (H % p || W % p)
        return ditd_err_set(DITD_EINVAL, "Wan VAE encode: %d x %d is not a multiple of patch_size %d",
                            H, W, p);
    if (c->is_residual && (H % s || W % s))
        return ditd_err_set(DITD_EINVAL,
                            "Wan VAE encode: %d x %d is not a multiple of the scale factor %d (the "
                            "residual encoder's AvgDown3D needs it)", H, W, s);
    const int h = ditd_wan_vae_latent_side(c, H), w = ditd_wan_vae_latent_side(c, W);
    if (h < 1 || w < 1)
        return ditd_err_set(DITD_EINVAL, "Wan VAE encode: %d x %d too small", H, W);
    const size_t ln = (size_t)Z * T * h * w, hw = (size_t)h * w;
    for (int bi = 0; bi < B; bi++) {
        const float *xb = x + (size_t)bi * Cp * F * H * W;
        float *mb = mean + (size_t)bi * ln;
        int t_out = 0;
        reset_coder(&v->enc);
        v->busy = 0;
        for (int k = 0; k < 1 + (F - 1) / 4; k++) {
            const int f0 = k == 0 ? 0 : 1 + 4 * (k - 1), nf = k == 0 ? 1 : 4;
            vid in = grab(v, nf, c->in_channels, Hp, Wp);
            for (int f = 0; f < nf; f++) {
                /* patchify: channel ch p^2 + (q % p) p + r % p at (r / p, q / p) */
                for (int ch = 0; ch < Cp; ch++)
                    for (int r = 0; r < H; r++)
                        for (int q = 0; q < W; q++) {
                            const int dst = ch * p * p + (q % p) * p + r % p;
                            v->h_frame[((size_t)dst * Hp + r / p) * Wp + q / p] =
                                xb[(((size_t)ch * F + f0 + f) * H + r) * W + q];
                        }
                ops->upload(fr(v, &in, f), v->h_frame, fsize(&in));
            }
            vid y = encoder_chunk(v, in);
            y = cconv(v, &v->quant, NULL, &y, 0); /* (T', 2 Z, h, w) */
            for (int t = 0; t < y.T; t++, t_out++) {
                if (t_out >= T)
                    return ditd_err_set(DITD_EINTERNAL, "Wan VAE encode: too many latent frames");
                ops->download(v->h_frame, fr(v, &y, t), fsize(&y));
                for (int ch = 0; ch < Z; ch++) {
                    memcpy(mb + ((size_t)ch * T + t_out) * hw, v->h_frame + (size_t)ch * hw,
                           hw * sizeof *mb);
                    if (sample) {
                        /* keep logvar in the sample buffer for now */
                        memcpy(sample + (size_t)bi * ln + ((size_t)ch * T + t_out) * hw,
                               v->h_frame + (size_t)(Z + ch) * hw, hw * sizeof *mb);
                    }
                }
            }
            drop(v, &y);
        }
        if (t_out != T)
            return ditd_err_set(DITD_EINTERNAL, "Wan VAE encode: %d latent frames, expected %d",
                                t_out, T);
        if (sample) {
            float *sb = sample + (size_t)bi * ln;
            float *n = v->h_frame; /* the noise in pieces of one frame's size */
            const size_t piece = v->h_frame_n;
            for (size_t i0 = 0; i0 < ln; i0 += piece) {
                const size_t m = ln - i0 < piece ? ln - i0 : piece;
                ditd_philox_normal(seed, (uint64_t)bi, i0, m, n);
                for (size_t i = 0; i < m; i++) {
                    float lv = sb[i0 + i];
                    lv = lv < -30.0f ? -30.0f : lv > 20.0f ? 20.0f : lv;
                    sb[i0 + i] = mb[i0 + i] + expf(0.5f * lv) * n[i];
                }
            }
        }
    }
    if ((err = ops->status()))
        return err;
    return 0;
}
