/* AutoencoderKLWan's layers on one chunk of frames, read top to bottom as
 * Diffusers writes them (WanResidualBlock, WanAttentionBlock, WanResample,
 * the residual up/down blocks, WanDecoder3d / WanEncoder3d), for one rank's
 * band of rows.
 *
 * Tensors are chunks (T, C, rows + 2, W), frame-major: frame t is C planes,
 * each a band of rows with one halo row above and one below. Before each
 * 3x3 convolution the halo rows are filled, from the neighbouring ranks'
 * edge rows (paired send/recvs) or zeros at the image's top and bottom;
 * everything else touches only the interior. A causal convolution of
 * kernel time 3 reads, for output frame t, the frames [t - 2, t] of (its
 * cache ++ the chunk), zeros before the cache's first frame: what
 * WanCausalConv3d computes with feat_cache (the cache holds the
 * convolution's last 2 input frames, halo rows included).
 *
 * Planning: with v->planning set no op runs and no collective is called;
 * every buffer, cache and scratch records what it would need.
 */
#include <math.h>
#include <string.h>

#include "engine/core/error.h"
#include "engine/models/wan_vae/wan_vae_state.h"
#include "kernels/cpu/cpu_kernels.h"

#define WAN_SCRATCH_CAP ((size_t)8 << 20) /* im2col floats per GEMM chunk, at most */

typedef ditd__wan_vid vid;
typedef ditd__wan_geom geom;

static size_t zmax(size_t a, size_t b)
{
    return a > b ? a : b;
}

size_t ditd__wan_ps(const geom *g)
{
    return (size_t)(g->rows + 2) * (size_t)g->W;
}

static size_t fsize(const vid *x)
{
    return (size_t)x->C * ditd__wan_ps(&x->g);
}

void *ditd__wan_frame(const ditd_wan_vae *v, const vid *x, int t)
{
    if (v->planning)
        return NULL;
    return ditd_ptr_act(v->ops, v->buf[x->b], (size_t)t * fsize(x));
}

/* Row r (0: the top halo) of channel 0 of frame t. */
static void *row(const ditd_wan_vae *v, const vid *x, int t, int r)
{
    if (v->planning)
        return NULL;
    return ditd_ptr_act(v->ops, ditd__wan_frame(v, x, t), (size_t)r * x->g.W);
}

vid ditd__wan_grab(ditd_wan_vae *v, int T, int C, const geom *g)
{
    vid y = {-1, T, C, *g};
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

void ditd__wan_drop(ditd_wan_vae *v, const vid *x)
{
    v->busy &= ~(1u << x->b);
}

/* Rows per GEMM chunk: aligned, the largest divisor of the unit whose
 * im2col fits WAN_SCRATCH_CAP (per_row floats a row), so a rank computes
 * every chunk with exactly the call a single rank makes; else as many rows
 * as fit. */
static int chunk_rows(const geom *g, size_t per_row)
{
    if (!g->aligned) {
        size_t d = per_row ? WAN_SCRATCH_CAP / per_row : (size_t)g->rows;
        return d < 1 ? 1 : d > (size_t)g->rows ? g->rows : (int)d;
    }
    int d = g->unit;
    while (d > 1 && (g->unit % d || per_row * (size_t)d > WAN_SCRATCH_CAP))
        d--;
    return d;
}

/* Scratch for a conv of cin * taps inputs per output element, chunks of d rows. */
static void need_scratch(ditd_wan_vae *v, int cin, int taps, int cout, int d, int W)
{
    /* (Cin taps + Cout) W a row covers the CPU's im2col and the CUDA GEMM's output */
    if (v->planning)
        v->scratch_n = zmax(v->scratch_n, ((size_t)cin * taps + (size_t)cout) * (size_t)W * d);
}

/* ---- the halo ---- */

static int halo_fill(ditd_wan_vae *v, const vid *x)
{
    const ditd_backend_ops *ops = v->ops;
    const size_t ps = ditd__wan_ps(&x->g), W = (size_t)x->g.W, planes = (size_t)x->T * x->C;
    if (v->planning) {
        v->halo_n = zmax(v->halo_n, planes * W);
        return 0;
    }
    void *top = ditd__wan_frame(v, x, 0), *bot = row(v, x, 0, x->g.rows + 1);
    if (!x->g.par || v->P == 1) {
        ops->copy2d(top, ps, v->zeros, W, planes, W);
        ops->copy2d(bot, ps, v->zeros, W, planes, W);
        return 0;
    }
    const int up = (v->rank + v->P - 1) % v->P, dn = (v->rank + 1) % v->P, n = (int)(planes * W);
    ditd_comm_req req;
    int err;
    ops->copy2d(v->hs0, W, row(v, x, 0, 1), ps, planes, W);             /* first rows */
    ops->copy2d(v->hs1, W, row(v, x, 0, x->g.rows), ps, planes, W);     /* last rows */
    ops->sync();
    /* my first rows go up (the rank above's bottom halo); the last rank
     * receives rank 0's first rows, which it does not use */
    if ((err = ditd_comm_sendrecv_start(v->comm, ops->act_dtype, v->hs0, n, up, v->hr1, n, dn, &req)) ||
        (err = ditd_comm_wait(v->comm, &req)) ||
        (err = ditd_comm_sendrecv_start(v->comm, ops->act_dtype, v->hs1, n, dn, v->hr0, n, up, &req)) ||
        (err = ditd_comm_wait(v->comm, &req)))
        return err;
    ops->copy2d(top, ps, v->rank > 0 ? v->hr0 : v->zeros, W, planes, W);
    ops->copy2d(bot, ps, v->rank < v->P - 1 ? v->hr1 : v->zeros, W, planes, W);
    return 0;
}

/* Keeps the first error of a chunk (a collective's); the layers go on
 * without communicating and the chunk's caller returns it. */
static void keep(ditd_wan_vae *v, int err)
{
    if (err && !v->err)
        v->err = err;
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
            v->ops->copy2d(k->f[k->n], n, ditd__wan_frame(v, x, t), n, 1, n);
        k->n++;
    }
}

/* ---- ops on chunks ---- */

/* WanCausalConv3d of x into a new chunk (kernel (kt, k, k), k 1 or 3 with
 * zero padding k / 2: the halo rows vertically); with a cache (kernel time
 * 3, time padding 2) the frames before x come from it, then zeros; without,
 * frame by frame. Drops x unless keep_x. */
vid ditd__wan_cconv(ditd_wan_vae *v, const wconv *c, wcache *k, vid *x, int keep_x)
{
    const ditd_backend_ops *ops = v->ops;
    const size_t ps = ditd__wan_ps(&x->g), W = (size_t)x->g.W;
    const int halo = c->k == 3;
    vid y = ditd__wan_grab(v, x->T, c->cout, &x->g);
    const int d = chunk_rows(&x->g, (size_t)c->cin * c->kt * c->k * c->k * W);
    need_scratch(v, c->cin, c->kt * c->k * c->k, c->cout, d, x->g.W);
    if (halo)
        keep(v, halo_fill(v, x));
    for (int t = 0; t < x->T && !v->planning; t++) {
        const void *fr[3] = {NULL, NULL, NULL};
        for (int j = 0; j < c->kt; j++) {
            int s = t - (c->kt - 1) + j; /* frame index in x; < 0: the cache, then zeros */
            if (s >= 0)
                fr[j] = ditd__wan_frame(v, x, s);
            else if (k && k->n + s >= 0)
                fr[j] = k->f[k->n + s];
        }
        for (int r0 = 0; r0 < x->g.rows; r0 += d) {
            const int nr = x->g.rows - r0 < d ? x->g.rows - r0 : d;
            const void *xf[3] = {NULL, NULL, NULL};
            for (int j = 0; j < c->kt; j++)
                xf[j] = fr[j] ? ditd_ptr_act(ops, fr[j], (size_t)(r0 + !halo) * W) : NULL;
            ops->conv3d_frame(xf, c->kt, ps, c->w, c->b, row(v, &y, t, 1 + r0), ps, v->scratch,
                              v->scratch_n, c->cin, halo ? nr + 2 : nr, x->g.W, c->cout, c->k, 0,
                              c->k / 2);
        }
    }
    if (k)
        cache_push(v, k, x);
    if (!keep_x)
        ditd__wan_drop(v, x);
    return y;
}

/* WanRMS_norm (+ SiLU) of every frame of x into a new chunk. */
static vid rmsnorm(ditd_wan_vae *v, const void *gamma, const vid *x, int silu)
{
    vid y = ditd__wan_grab(v, x->T, x->C, &x->g);
    const size_t ps = ditd__wan_ps(&x->g);
    for (int t = 0; t < x->T && !v->planning; t++)
        v->ops->rmsnorm_channels(row(v, x, t, 1), ps, row(v, &y, t, 1), ps, x->C,
                                 x->g.rows * x->g.W, gamma, silu);
    return y;
}

/* y += x over every frame's interior. */
static void add(ditd_wan_vae *v, const vid *y, const vid *x)
{
    if (!v->planning)
        v->ops->add(ditd__wan_frame(v, y, 0), ditd__wan_frame(v, x, 0), (size_t)y->T * fsize(y));
}

/* WanResidualBlock: x -> conv_shortcut(x) + conv2(silu(norm2(conv1(silu(norm1(x)))))). */
static vid resnet(ditd_wan_vae *v, wres *r, vid x)
{
    vid h = x; /* the shortcut */
    if (r->has_sc)
        h = ditd__wan_cconv(v, &r->sc, NULL, &x, 1);
    vid a = rmsnorm(v, r->g1, &x, 1);
    if (r->has_sc)
        ditd__wan_drop(v, &x);
    vid b = ditd__wan_cconv(v, &r->c1, &r->k1, &a, 0);
    vid c = rmsnorm(v, r->g2, &b, 1);
    ditd__wan_drop(v, &b);
    vid d = ditd__wan_cconv(v, &r->c2, &r->k2, &c, 0);
    add(v, &d, &h);
    ditd__wan_drop(v, &h);
    return d;
}

/* The whole image's geometry (not split) of g. */
static geom whole(const geom *g)
{
    geom w = *g;
    w.par = 0;
    w.rows = g->H;
    w.u0 = 0;
    w.nu = w.U;
    return w;
}

/* Frame t of x (a band) into frame 0 of the whole-image chunk f: every
 * rank's interior rows all-gathered. */
static int gather_frame(ditd_wan_vae *v, const vid *x, int t, const vid *f)
{
    const ditd_backend_ops *ops = v->ops;
    const size_t W = (size_t)x->g.W, band = (size_t)x->g.rows * W;
    const int C = x->C;
    int err;
    if (v->planning) {
        v->pack_n = zmax(v->pack_n, (size_t)C * band);
        v->full_n = zmax(v->full_n, (size_t)C * x->g.H * W);
        return 0;
    }
    ops->copy2d(v->pack, band, row(v, x, t, 1), ditd__wan_ps(&x->g), (size_t)C, band);
    for (int r = 0; r < v->P; r++) {
        int a = v->ub[r] * x->g.unit, e = v->ub[r + 1] * x->g.unit;
        e = e < x->g.H ? e : x->g.H;
        v->counts[r] = C * (e - a) * x->g.W;
        v->displs[r] = C * a * x->g.W;
    }
    ops->sync();
    if ((err = ditd_comm_allgatherv(v->comm, ops->act_dtype, v->pack, v->gath, v->counts,
                                    v->displs)))
        return err;
    /* rank r's block (C, rows_r, W) at displs[r] -> rows [a, e) of each plane */
    for (int r = 0; r < v->P; r++) {
        int a = v->ub[r] * x->g.unit, e = v->ub[r + 1] * x->g.unit;
        e = e < x->g.H ? e : x->g.H;
        const size_t n = (size_t)(e - a) * W;
        ops->copy2d(row(v, f, 0, 1 + a), ditd__wan_ps(&f->g),
                    ditd_ptr_act(ops, v->gath, (size_t)v->displs[r]), n, (size_t)C, n);
    }
    return 0;
}

/* WanAttentionBlock on frame t of the whole-image chunk x: x += proj(
 * attention(qkv(norm(x)))), one head of C over the frame's H W positions. */
static void attention_frame(ditd_wan_vae *v, const wattn *a, const vid *x, int t, const vid *nrm)
{
    const ditd_backend_ops *ops = v->ops;
    const int C = a->C, N = x->g.rows * x->g.W;
    const size_t ps = ditd__wan_ps(&x->g);
    const float scale = (float)(1.0 / sqrt((double)C));
    if (v->planning) {
        v->qkv_n = zmax(v->qkv_n, (size_t)3 * C * N);
        v->tok_n = zmax(v->tok_n, (size_t)C * N);
        if (C > DITD_CPU_ATTN_MAX_DH || v->opts.gemm_attention)
            v->score_n = zmax(v->score_n, (size_t)N * N);
        return;
    }
    void *xt = row(v, x, t, 1), *nt = row(v, nrm, 0, 1);
    const void *one[1] = {nt};
    ops->rmsnorm_channels(xt, ps, nt, ps, C, N, a->g, 0);
    ops->conv3d_frame(one, 1, ps, a->qkv.w, a->qkv.b, v->qkv, (size_t)N, NULL, 0, C, x->g.rows,
                      x->g.W, 3 * C, 1, 0, 0);                            /* (3C, N) */
    ops->planes_to_tokens(v->qkv, (size_t)N, v->tq, C, N);                /* (N, C) each */
    ops->planes_to_tokens(ditd_ptr_act(ops, v->qkv, (size_t)C * N), (size_t)N, v->tk, C, N);
    ops->planes_to_tokens(ditd_ptr_act(ops, v->qkv, (size_t)2 * C * N), (size_t)N, v->tv, C, N);
    if (C <= DITD_CPU_ATTN_MAX_DH && !v->opts.gemm_attention)
        ops->attention(v->tq, C, v->tk, C, v->tv, C, v->to, C, NULL, 1, N, N, 1, C, scale);
    else
        ops->attention_masked(v->tq, C, v->tk, C, v->tv, C, v->to, C, 1, N, 1, C, scale, NULL, NULL,
                              0, v->score);
    ops->tokens_to_planes(v->to, nt, ps, C, N, 0);
    ops->conv3d_frame(one, 1, ps, a->proj.w, a->proj.b, v->qkv, (size_t)N, NULL, 0, C, x->g.rows,
                      x->g.W, C, 1, 0, 0);
    /* x += proj, row by row of the interior (planes of stride ps vs N) */
    for (int c = 0; c < C; c++)
        ops->add(ditd_ptr_act(ops, xt, (size_t)c * ps), ditd_ptr_act(ops, v->qkv, (size_t)c * N),
                 (size_t)N);
}

/* WanAttentionBlock, frame by frame, on the whole frame: a band is gathered
 * first, attended whole on every rank (the same calls as one rank's), and
 * its rows kept. */
static void attention(ditd_wan_vae *v, const wattn *a, vid *x)
{
    geom wg = whole(&x->g);
    vid nrm = ditd__wan_grab(v, 1, a->C, &wg);
    if (!x->g.par || v->P == 1) {
        for (int t = 0; t < x->T; t++)
            attention_frame(v, a, x, t, &nrm);
        ditd__wan_drop(v, &nrm);
        return;
    }
    vid f = ditd__wan_grab(v, 1, a->C, &wg);
    for (int t = 0; t < x->T; t++) {
        keep(v, gather_frame(v, x, t, &f));
        attention_frame(v, a, &f, 0, &nrm);
        if (!v->planning) /* my rows back */
            v->ops->copy2d(row(v, x, t, 1), ditd__wan_ps(&x->g),
                           row(v, &f, 0, 1 + x->g.u0 * x->g.unit), ditd__wan_ps(&wg), (size_t)a->C,
                           (size_t)x->g.rows * x->g.W);
    }
    ditd__wan_drop(v, &f);
    ditd__wan_drop(v, &nrm);
}

static vid mid_block(ditd_wan_vae *v, wcoder *cd, vid x)
{
    x = resnet(v, &cd->mid0, x);
    attention(v, &cd->attn, &x);
    return resnet(v, &cd->mid1, x);
}

/* nn.Conv2d 3x3 stride 1 pad 1 of every frame into a new chunk (halo rows
 * for the vertical padding), in aligned chunks of rows. */
static vid conv2d_frames(ditd_wan_vae *v, const wconv *c, vid *x)
{
    const size_t ps = ditd__wan_ps(&x->g), W = (size_t)x->g.W;
    vid y = ditd__wan_grab(v, x->T, c->cout, &x->g);
    const int d = chunk_rows(&x->g, (size_t)c->cin * 9 * W);
    need_scratch(v, c->cin, 9, c->cout, d, x->g.W);
    keep(v, halo_fill(v, x));
    for (int r0 = 0; r0 < x->g.rows && !v->planning; r0 += d) {
        const int nr = x->g.rows - r0 < d ? x->g.rows - r0 : d;
        v->ops->conv2d(row(v, x, 0, r0), ps, c->w, c->b, row(v, &y, 0, 1 + r0), ps, v->scratch,
                       v->scratch_n, x->T, c->cin, nr + 2, x->g.W, c->cout, 3, 1, 0, 0, 1, 1);
    }
    ditd__wan_drop(v, x);
    return y;
}

/* x2 along rows and columns: the band, the image and the unit double. */
static geom doubled(const geom *g)
{
    geom u = *g;
    u.rows *= 2;
    u.W *= 2;
    u.H *= 2;
    u.unit *= 2;
    return u;
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
            x = ditd__wan_cconv(v, &rs->time, &rs->tc, &x, 0); /* (T, 2C) = (2T, C) */
            x.T *= 2;
            x.C /= 2;
        }
    }
    geom ug = doubled(&x.g);
    vid u = ditd__wan_grab(v, x.T, x.C, &ug);
    if (!v->planning)
        v->ops->upsample_nearest2x(row(v, &x, 0, 1), ditd__wan_ps(&x.g), row(v, &u, 0, 1),
                                   ditd__wan_ps(&ug), x.T * x.C, 1, x.g.rows, x.g.W);
    ditd__wan_drop(v, &x);
    return conv2d_frames(v, &rs->conv, &u);
}

/* WanResample, encoder side (one rank, whole frames): per frame ZeroPad2d
 * (0, 1, 0, 1) and a 3x3 stride-2 conv; downsample3d then (from the second
 * chunk on) a stride-2 time convolution over (the last frame of the chunk
 * before ++ x). */
static vid downsample(ditd_wan_vae *v, wsample *rs, vid x)
{
    const wconv *c = &rs->conv;
    geom g2 = x.g;
    g2.rows = g2.H = (x.g.rows + 1 - 3) / 2 + 1;
    g2.W = (x.g.W + 1 - 3) / 2 + 1;
    g2.unit = g2.rows;
    vid y = ditd__wan_grab(v, x.T, c->cout, &g2);
    need_scratch(v, c->cin, 9, c->cout, chunk_rows(&g2, (size_t)c->cin * 9 * g2.W), g2.W);
    if (!v->planning)
        v->ops->conv2d(row(v, &x, 0, 1), ditd__wan_ps(&x.g), c->w, c->b, row(v, &y, 0, 1),
                       ditd__wan_ps(&g2), v->scratch, v->scratch_n, x.T, c->cin, x.g.rows, x.g.W,
                       c->cout, 3, 2, 0, 1, 0, 1);
    ditd__wan_drop(v, &x);
    x = y;
    if (rs->mode != WS_DOWN3D)
        return x;
    const size_t n = fsize(&x), ps = ditd__wan_ps(&x.g);
    wcache *k = &rs->tc;
    cache_need(v, k, n);
    if (!rs->started) { /* the first chunk passes; its last frame is kept */
        rs->started = 1;
    } else {
        const int To = (x.T + 1 - 3) / 2 + 1;
        const wconv *tc = &rs->time;
        y = ditd__wan_grab(v, To, tc->cout, &x.g);
        need_scratch(v, tc->cin, 3, tc->cout, x.g.rows, x.g.W);
        for (int t = 0; t < To && !v->planning; t++) {
            const void *xf[3];
            for (int j = 0; j < 3; j++) {
                int s = 2 * t + j - 1; /* -1: the cached frame */
                xf[j] = ditd_ptr_act(v->ops, s < 0 ? k->f[0] : ditd__wan_frame(v, &x, s),
                                     (size_t)x.g.W);
            }
            v->ops->conv3d_frame(xf, 3, ps, tc->w, tc->b, row(v, &y, t, 1), ps, v->scratch,
                                 v->scratch_n, tc->cin, x.g.rows, x.g.W, tc->cout, 1, 0, 0);
        }
        if (!v->planning)
            v->ops->copy2d(k->f[0], n, ditd__wan_frame(v, &x, x.T - 1), n, 1, n);
        ditd__wan_drop(v, &x);
        return y;
    }
    if (!v->planning)
        v->ops->copy2d(k->f[0], n, ditd__wan_frame(v, &x, x.T - 1), n, 1, n);
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
            xf[a] = s >= 0 ? row(v, xc, s, 1) : NULL;
        }
        v->ops->avgdown3d_frame(xf, ditd__wan_ps(&xc->g), xc->C, xc->g.rows, xc->g.W, y->C, ft,
                                b->sc_fs, row(v, y, t, 1), ditd__wan_ps(&y->g), 1);
    }
}

/* DupUp3D(x_copy) added to y; in the first chunk only the last of each
 * frame's ft copies (first_chunk drops factor_t - 1 frames). */
static void dupup_add(ditd_wan_vae *v, const wblock *b, const vid *xc, vid *y, int first)
{
    const int ft = b->sc_ft, skip = first ? ft - 1 : 0;
    for (int t = 0; t < y->T && !v->planning; t++) {
        const int o = t + skip; /* output frame o = s ft + a of the duplicated chunk */
        v->ops->dupup3d_frame(row(v, xc, o / ft, 1), ditd__wan_ps(&xc->g), xc->C, xc->g.rows,
                              xc->g.W, y->C, ft, b->sc_fs, o % ft, row(v, y, t, 1),
                              ditd__wan_ps(&y->g), 1);
    }
}

/* x_copy: the block's input, kept for a residual shortcut. */
static vid copy_of(ditd_wan_vae *v, const vid *x)
{
    vid xc = ditd__wan_grab(v, x->T, x->C, &x->g);
    if (!v->planning)
        v->ops->copy2d(ditd__wan_frame(v, &xc, 0), 1, ditd__wan_frame(v, x, 0), 1, 1,
                       (size_t)x->T * fsize(x));
    return xc;
}

/* ---- the decoder and the encoder, one chunk ---- */

vid ditd__wan_decoder_chunk(ditd_wan_vae *v, vid x, int first)
{
    wcoder *d = &v->dec;
    x = ditd__wan_cconv(v, &d->conv_in, &d->kin, &x, 0);
    x = mid_block(v, d, x);
    for (int i = 0; i < d->n_blocks; i++) {
        wblock *b = &d->blocks[i];
        vid xc = x;
        if (b->shortcut)
            xc = copy_of(v, &x);
        for (int j = 0; j < b->n_res; j++)
            x = resnet(v, &b->res[j], x);
        if (b->rs.mode != WS_NONE)
            x = upsample(v, &b->rs, x);
        if (b->shortcut) {
            dupup_add(v, b, &xc, &x, first);
            ditd__wan_drop(v, &xc);
        }
    }
    vid n = rmsnorm(v, d->norm_out, &x, 1);
    ditd__wan_drop(v, &x);
    return ditd__wan_cconv(v, &d->conv_out, &d->kout, &n, 0);
}

vid ditd__wan_encoder_chunk(ditd_wan_vae *v, vid x)
{
    wcoder *e = &v->enc;
    x = ditd__wan_cconv(v, &e->conv_in, &e->kin, &x, 0);
    for (int i = 0; i < e->n_blocks; i++) {
        wblock *b = &e->blocks[i];
        vid xc = x;
        if (b->shortcut)
            xc = copy_of(v, &x);
        for (int j = 0; j < b->n_res; j++)
            x = resnet(v, &b->res[j], x);
        if (b->rs.mode != WS_NONE)
            x = downsample(v, &b->rs, x);
        if (b->shortcut) {
            avgdown_add(v, b, &xc, &x);
            ditd__wan_drop(v, &xc);
        }
    }
    x = mid_block(v, e, x);
    vid n = rmsnorm(v, e->norm_out, &x, 1);
    ditd__wan_drop(v, &x);
    return ditd__wan_cconv(v, &e->conv_out, &e->kout, &n, 0);
}

/* Every cache and resampler as before a clip (clear_cache). */
void ditd__wan_reset_coder(wcoder *c)
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

int ditd__wan_carve_coder(ditd_wan_vae *v, wcoder *c)
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
