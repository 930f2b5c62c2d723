/* AutoencoderKL compute: the decoder and the encoder read top to bottom as
 * Diffusers writes them (vae.py Encoder/Decoder, ResnetBlock2D, the
 * mid-block Attention, Upsample2D/Downsample2D), and the parallel decode.
 *
 * Every image buffer holds a band of `rows` rows of W pixels per channel,
 * with one halo row above and one below: plane stride ps = (rows + 2) W,
 * interior at row 1. Before each 3x3 convolution the halo rows are filled:
 * from the neighbouring ranks' edge rows (two paired send/recvs), or zeros
 * at the image's top and bottom (the convolution's padding). 1x1 convs,
 * GroupNorm, upsampling and the residual adds only touch the interior.
 *
 * Parallel decode (P ranks; the latent's rows in units of m rows, the
 * units split as evenly as they go, a unit is m s rows after s x upsampling):
 *   - halo rows: one per 3x3 conv from each neighbour;
 *   - GroupNorm: each rank sums each of its units per group (sum, sum of
 *     squares, in double), the partials of every unit are all-gathered and
 *     added in image order, so every rank normalizes with the same mean and
 *     variance, over the whole image (nothing of the variance is dropped);
 *   - mid-block attention: queries of the band, keys and values of the
 *     whole image (all-gathered);
 *   - the final rows are sent to the leader.
 * Bit-identical to one rank, for every G and thread count, because no
 * reduction's order depends on the band: every convolution (the mid-block
 * attention's four projections included, run as 1x1 convolutions) goes
 * through ditd_cpu_conv2d, whose per-element order is a function of the
 * layer alone (kernels/cpu/image_kernels.h), not of the rows it is given
 * nor of the threads; GroupNorm sums per unit, in image order; the
 * attention kernel computes each query alone. (Library GEMMs do not
 * promise this: OpenBLAS's Haswell sgemm changes an element's bits with
 * the GEMM's column count and thread count; docs/vae.md.)
 * A latent with fewer units than ranks (a small tile) is decoded whole on
 * every rank instead, with no communication.
 *
 * Parallel encode: the same bands, chosen at latent resolution (units of
 * one latent row by default) and scaled up by 2 per stride-2 stage, the last
 * band running to the image's bottom row (it holds the rows the stride-2
 * stages drop). Downsample2D's bottom pad row is the halo below a band (the
 * next band's first row, zeros under the image), so every band's outputs
 * are exactly its rows of the whole image's. The moments are all-gathered:
 * every rank gets the mean and the Philox draw.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/core/clock.h"
#include "engine/core/error.h"
#include "engine/core/philox.h"
#include "engine/models/vae/vae_internal.h"

#define VAE_SCRATCH_CAP ((size_t)8 << 20) /* im2col floats per GEMM chunk, at most */

/* One image's band at one scale. */
typedef struct geom {
    int rows, W;      /* this rank's rows, width */
    int H;            /* rows of the whole image at this scale */
    int par;          /* split over the group (else whole, on every rank) */
    int unit;         /* rows per unit at this scale (m at latent scale, m s after s x upsampling) */
    int u0, nu, U;    /* this band's first unit, its units, the image's units */
} geom;

static size_t ps_of(const geom *g)
{
    return (size_t)(g->rows + 2) * (size_t)g->W;
}

static void *at(const ditd_vae *v, void *p, size_t elems)
{
    return ditd_ptr_act(v->ops, p, elems);
}

static void swap(void **a, void **b)
{
    void *t = *a;
    *a = *b;
    *b = t;
}

/* ---- planning ---- */

static size_t zmax(size_t a, size_t b)
{
    return a > b ? a : b;
}

static size_t img_n(int C, int rows, int W)
{
    return (size_t)C * (size_t)(rows + 2) * (size_t)W;
}

/* im2col of a chunk, plus (for a device backend's GEMM) its output tokens:
 * (cin k k + cmax) Wo a row, at most VAE_SCRATCH_CAP when rows allow. */
static size_t conv_scratch(int cmax, int cin, int k, int rows_out, int Wo)
{
    size_t row = ((size_t)cin * k * k + (size_t)cmax) * Wo, full = row * (size_t)rows_out;
    return full < zmax(row, VAE_SCRATCH_CAP) ? full : zmax(row, VAE_SCRATCH_CAP);
}

#define VAE_MAX_UNIT 8 /* latent rows per unit, at most */
#define VAE_UNIT_COLUMNS 512 /* latent-scale GEMM columns a unit aims at (BLAS packs the weights per call) */

static int tile_latent(const ditd_vae_config *c)
{
    return (int)(c->sample_size / (double)ditd_vae_config_scale_factor(c));
}

/* The most rows a band can have at latent scale, over every unit m the
 * decode or encode may pick and every latent up to Hm rows: ceil(U / P)
 * units of a split, or a whole latent of fewer than P units (< P m rows). */
static int band_rows_max(const ditd_vae *v, int Hm)
{
    const int P = v->P;
    int rows = 0;
    for (int m = 1; m <= VAE_MAX_UNIT; m++) {
        if (v->opts.row_unit > 0 && m != (v->opts.row_unit < VAE_MAX_UNIT ? v->opts.row_unit : VAE_MAX_UNIT))
            continue;
        int U = (Hm + m - 1) / m, split = (U + P - 1) / P * m, whole = (P - 1) * m;
        int r = split > whole ? split : whole;
        if (P == 1 || r > Hm)
            r = Hm;
        rows = rows > r ? rows : r;
    }
    return rows;
}

/* An encoder band's rows at a scale of Hs image rows, s = 2^(stages left):
 * a band of at most R latent rows is R s rows, the last one up to s - 1
 * more (the rows below h s that the stride-2 stages drop). */
static int enc_rows_bound(int R, int hmax, int s, int Hs)
{
    if (R >= hmax)
        return Hs;
    long long r = (long long)(R + 1) * s;
    return r < Hs ? (int)r : Hs;
}

static int carve(ditd_vae *v, void **p, size_t n)
{
    int err;
    *p = ditd_arena_bytes(&v->acts, n * ditd_dtype_size(v->ops->act_dtype), &err);
    return err;
}

static int carve_acts(ditd_vae *v)
{
    int err = 0;
    err |= carve(v, &v->X, v->act_n);
    err |= carve(v, &v->A, v->act_n);
    err |= carve(v, &v->Hb, v->act_n);
    err |= carve(v, &v->scratch, v->scratch_n);
    err |= carve(v, &v->zeros, v->halo_n);
    err |= carve(v, &v->hs0, v->halo_n);
    err |= carve(v, &v->hs1, v->halo_n);
    err |= carve(v, &v->hr0, v->halo_n);
    err |= carve(v, &v->hr1, v->halo_n);
    err |= carve(v, &v->q, v->tok_n);
    err |= carve(v, &v->o, v->tok_n);
    err |= carve(v, &v->k, v->tokfull_n);
    err |= carve(v, &v->v, v->tokfull_n);
    err |= carve(v, &v->pack, v->pack_n);
    err |= carve(v, &v->recv, v->pack_n);
    return err ? DITD_ENOMEM : 0;
}

int ditd__vae_plan_acts(ditd_vae *v)
{
    const ditd_vae_config *c = &v->cfg;
    const int n = c->n_blocks, top = c->block_out_channels[n - 1], f = ditd_vae_config_scale_factor(c);
    const int G = c->norm_num_groups, P = v->P;
    int Hm = v->opts.max_h, Wm = v->opts.max_w, err;

    int cmax = c->out_channels > 2 * c->latent_channels ? c->out_channels : 2 * c->latent_channels;
    for (int i = 0; i < n; i++)
        cmax = cmax > c->block_out_channels[i] ? cmax : c->block_out_channels[i];

    if (v->opts.tiling) {
        int tl = tile_latent(c);
        if (tl < 1)
            return ditd_err_set(DITD_EUNSUPPORTED, "VAE tiling: sample_size %d gives latent tiles of %d",
                                c->sample_size, tl);
        Hm = Hm < tl ? Hm : tl;
        Wm = Wm < tl ? Wm : tl;
    }
    int rows = band_rows_max(v, Hm);
    v->rows_max = rows;
    size_t act = 0, scr = 0, halo = 0;
    /* decoder */
    int Cin0 = c->latent_channels > top ? c->latent_channels : top;
    act = zmax(act, img_n(Cin0, rows, Wm));
    halo = zmax(halo, (size_t)Cin0 * Wm);
    scr = zmax(scr, conv_scratch(cmax, Cin0, 3, rows, Wm));
    int prev = top;
    for (int i = 0; i < n; i++) {
        int ch = c->block_out_channels[n - 1 - i], s = 1 << i;
        int cm = prev > ch ? prev : ch;
        act = zmax(act, img_n(cm, rows * s, Wm * s));
        halo = zmax(halo, (size_t)cm * Wm * s);
        scr = zmax(scr, conv_scratch(cmax, cm, 3, rows * s, Wm * s));
        if (i != n - 1) {
            act = zmax(act, img_n(ch, rows * 2 * s, Wm * 2 * s));
            halo = zmax(halo, (size_t)ch * Wm * 2 * s);
            scr = zmax(scr, conv_scratch(cmax, ch, 3, rows * 2 * s, Wm * 2 * s));
        }
        prev = ch;
    }
    act = zmax(act, img_n(c->out_channels, rows * f, Wm * f));
    v->tok_n = (size_t)rows * Wm * top;
    v->tokfull_n = (size_t)Hm * Wm * top;
    v->pack_n = (size_t)c->out_channels * rows * f * Wm * f;
    v->h_img_n = v->pack_n;
    /* encoder: a band of the image (split at latent resolution as the
     * decode is), or the whole image */
    if (v->has_encoder) {
        int Hi = v->opts.max_image_h, Wi = v->opts.max_image_w;
        if (Hi < 2 || Wi < 2)
            return ditd_err_set(DITD_EINVAL, "VAE encoder: image %d x %d too small", Hi, Wi);
        const int hmax = ditd_vae_latent_side(c, Hi), R = band_rows_max(v, hmax);
        v->enc_rows_max = R;
        int s = f, Ri = enc_rows_bound(R, hmax, s, Hi);
        act = zmax(act, img_n(c->in_channels, Ri, Wi));
        halo = zmax(halo, (size_t)c->in_channels * Wi);
        scr = zmax(scr, conv_scratch(cmax, c->in_channels, 3, Ri, Wi));
        prev = c->block_out_channels[0];
        for (int i = 0; i < n; i++) {
            int ch = c->block_out_channels[i], cm = prev > ch ? prev : ch;
            act = zmax(act, img_n(cm, Ri, Wi));
            halo = zmax(halo, (size_t)cm * Wi);
            scr = zmax(scr, conv_scratch(cmax, cm, 3, Ri, Wi));
            if (i != n - 1) {
                int Ho = (Hi - 2) / 2 + 1, Wo = (Wi - 2) / 2 + 1;
                if (Hi < 2 || Wi < 2)
                    return ditd_err_set(DITD_EINVAL, "VAE encoder: image %d x %d too small",
                                        v->opts.max_image_h, v->opts.max_image_w);
                s /= 2;
                int Ro = enc_rows_bound(R, hmax, s, Ho);
                scr = zmax(scr, conv_scratch(cmax, ch, 3, Ro, Wo));
                Hi = Ho;
                Wi = Wo;
                Ri = Ro;
                act = zmax(act, img_n(ch, Ri, Wi));
            }
            prev = ch;
        }
        act = zmax(act, img_n(2 * c->latent_channels, Ri, Wi));
        scr = zmax(scr, conv_scratch(cmax, top, 3, Ri, Wi));
        v->tok_n = zmax(v->tok_n, (size_t)Ri * Wi * top);
        v->tokfull_n = zmax(v->tokfull_n, (size_t)Hi * Wi * top);
        /* the moments of the whole latent, gathered on every rank */
        v->h_img_n = zmax(v->h_img_n, (size_t)2 * c->latent_channels * Hi * Wi);
        v->pack_n = zmax(v->pack_n, (size_t)2 * c->latent_channels * Hi * Wi);
    }
    v->act_n = act;
    v->scratch_n = scr;
    {
        /* statistics partials: one per unit (units are at least a latent row) */
        int nmax = Hm > v->opts.max_image_h ? Hm : v->opts.max_image_h;
        v->max_units = nmax;
    }
    v->halo_n = halo;
    if ((err = carve_acts(v)) || (err = ditd_arena_commit(&v->acts, v->acts.peak_plan)) ||
        (err = carve_acts(v)))
        return err;
    /* host side */
    v->h_stats = calloc((size_t)v->max_units * G * 2, sizeof *v->h_stats);
    v->h_stats_all = calloc((size_t)v->max_units * G * 2, sizeof *v->h_stats_all);
    v->ub = calloc((size_t)P + 1, sizeof *v->ub);
    v->h_mean = calloc((size_t)G, sizeof *v->h_mean);
    v->h_rstd = calloc((size_t)G, sizeof *v->h_rstd);
    v->h_img = malloc(v->h_img_n * sizeof *v->h_img);
    v->counts = calloc((size_t)P, sizeof *v->counts);
    v->displs = calloc((size_t)P, sizeof *v->displs);
    if (v->opts.tiling) {
        int tl = tile_latent(c), ov = (int)(tl * 0.75), ncol = (v->opts.max_w + ov - 1) / ov;
        v->h_tiles_n = (size_t)2 * ncol * c->out_channels * (size_t)(tl * f) * (tl * f);
        v->h_tiles = malloc(v->h_tiles_n * sizeof *v->h_tiles);
        v->h_img_n = zmax(v->h_img_n, (size_t)c->out_channels * tl * f * tl * f);
        v->h_img_n = zmax(v->h_img_n, (size_t)c->latent_channels * tl * tl);
        free(v->h_img);
        v->h_img = malloc(v->h_img_n * sizeof *v->h_img);
        if (!v->h_tiles || ov < 1)
            return ditd_err_set(DITD_ENOMEM, "VAE tiles");
    }
    if (!v->h_stats || !v->h_stats_all || !v->ub || !v->h_mean || !v->h_rstd || !v->h_img || !v->counts ||
        !v->displs)
        return ditd_err_set(DITD_ENOMEM, "VAE host buffers");
    return 0;
}

/* ---- the halo and the collectives ---- */

static int halo_fill(ditd_vae *v, void *x, int C, const geom *g)
{
    const ditd_backend_ops *ops = v->ops;
    const size_t ps = ps_of(g), W = (size_t)g->W;
    void *top = x, *bot = at(v, x, (size_t)(g->rows + 1) * W);
    if (!g->par || v->P == 1) {
        ops->copy2d(top, ps, v->zeros, W, (size_t)C, W);
        ops->copy2d(bot, ps, v->zeros, W, (size_t)C, W);
        return 0;
    }
    const int up = (v->rank + v->P - 1) % v->P, dn = (v->rank + 1) % v->P, n = C * g->W;
    ditd_comm_req req;
    int err;
    double t0;
    ops->copy2d(v->hs0, W, at(v, x, W), ps, (size_t)C, W);                     /* first row */
    ops->copy2d(v->hs1, W, at(v, x, (size_t)g->rows * W), ps, (size_t)C, W);   /* last row */
    ops->sync();
    t0 = ditd_now_ms();
    /* my first row goes up (the rank above's bottom halo); the last rank
     * receives rank 0's first row, which it does not use */
    if ((err = ditd_comm_sendrecv_start(v->comm, ops->act_dtype, v->hs0, n, up, v->hr1, n, dn, &req)) ||
        (err = ditd_comm_wait(v->comm, &req)) ||
        (err = ditd_comm_sendrecv_start(v->comm, ops->act_dtype, v->hs1, n, dn, v->hr0, n, up, &req)) ||
        (err = ditd_comm_wait(v->comm, &req)))
        return err;
    v->st.comm_ms += ditd_now_ms() - t0;
    ops->copy2d(top, ps, v->rank > 0 ? v->hr0 : v->zeros, W, (size_t)C, W);
    ops->copy2d(bot, ps, v->rank < v->P - 1 ? v->hr1 : v->zeros, W, (size_t)C, W);
    return 0;
}

/* GroupNorm (+ SiLU) of the interior of x into y's interior. The sums
 * are taken per unit of rows (double), the units' partials of the whole
 * image gathered, and added in image order: the mean and variance of the
 * whole image, with the same bits on every rank and for every G. */
static int groupnorm(ditd_vae *v, const vnorm *nm, void *x, void *y, const geom *g, int silu)
{
    const int G = v->cfg.norm_num_groups, C = nm->C;
    const size_t ps = ps_of(g), W = (size_t)g->W;
    double *part = v->h_stats, *all = v->h_stats;
    int err;

    /* the band's last unit takes the rows left (fewer than a unit at the
     * decode's bottom; a few more in the encoder, whose image rows below
     * h x 2^stages belong to the last latent row's unit) */
    for (int k = 0; k < g->nu; k++) {
        int r0 = k * g->unit, nr = k == g->nu - 1 ? g->rows - r0 : g->unit;
        v->ops->groupnorm_stats(at(v, x, (size_t)(1 + r0) * W), ps, 1, C, nr, g->W, G,
                                part + (size_t)k * 2 * G);
    }
    if (g->par && v->P > 1) {
        /* doubles travel as 8-byte integers, untouched */
        for (int r = 0; r < v->P; r++) {
            v->counts[r] = 2 * G * (v->ub[r + 1] - v->ub[r]);
            v->displs[r] = 2 * G * v->ub[r];
        }
        double t0 = ditd_now_ms();
        if ((err = ditd_comm_allgatherv(v->comm, DITD_DTYPE_I64, part, v->h_stats_all, v->counts,
                                        v->displs)))
            return err;
        v->st.comm_ms += ditd_now_ms() - t0;
        all = v->h_stats_all;
    }
    const double cnt = (double)(C / G) * g->H * g->W;
    for (int i = 0; i < G; i++) {
        double sum = 0.0, sq = 0.0;
        for (int k = 0; k < g->U; k++) {
            sum += all[(size_t)k * 2 * G + 2 * i];
            sq += all[(size_t)k * 2 * G + 2 * i + 1];
        }
        double mean = sum / cnt, var = sq / cnt - mean * mean;
        if (var < 0.0)
            var = 0.0;
        v->h_mean[i] = (float)mean;
        v->h_rstd[i] = (float)(1.0 / sqrt(var + VAE_GN_EPS));
    }
    v->ops->groupnorm_apply(at(v, x, W), ps, at(v, y, W), ps, 1, C, g->rows, g->W, G, v->h_mean,
                            v->h_rstd, nm->g, nm->b, silu);
    return 0;
}

/* 3x3, stride 1, pad 1: interior of x -> interior of y, the band in one
 * call (its halo rows are the padding, or the neighbours' rows). */
static int conv3(ditd_vae *v, const vconv *cv, void *x, void *y, const geom *g)
{
    int err = halo_fill(v, x, cv->cin, g);
    if (err)
        return err;
    const size_t ps = ps_of(g);
    v->ops->conv2d(x, ps, cv->w, cv->b, at(v, y, (size_t)g->W), ps, v->scratch, v->scratch_n, 1,
                   cv->cin, g->rows + 2, g->W, cv->cout, 3, 1, 0, 0, 1, 1);
    return 0;
}

/* 1x1 (w (cout, cin), b): interior of x -> interior of y, the band in one call. */
static void conv1x1(ditd_vae *v, const void *w, const void *b, int cin, int cout, void *x, void *y,
                    const geom *g)
{
    const size_t ps = ps_of(g), W = (size_t)g->W;
    v->ops->conv2d(at(v, x, W), ps, w, b, at(v, y, W), ps, v->scratch, v->scratch_n, 1, cin, g->rows,
                   g->W, cout, 1, 1, 0, 0, 0, 0);
}

static void conv1(ditd_vae *v, const vconv *cv, void *x, void *y, const geom *g)
{
    conv1x1(v, cv->w, cv->b, cv->cin, cv->cout, x, y, g);
}

/* ResnetBlock2D (no time embedding, output_scale_factor 1):
 *   out = shortcut(x) + conv2(silu(norm2(conv1(silu(norm1(x))))))
 * x in *X; the result ends in *X. */
static int resnet(ditd_vae *v, const vres *r, const geom *g)
{
    const size_t n = (size_t)r->c2.cout * ps_of(g);
    int err;
    if ((err = groupnorm(v, &r->n1, v->X, v->A, g, 1)) || (err = conv3(v, &r->c1, v->A, v->Hb, g)) ||
        (err = groupnorm(v, &r->n2, v->Hb, v->A, g, 1)) || (err = conv3(v, &r->c2, v->A, v->Hb, g)))
        return err;
    if (r->has_sc) {
        conv1(v, &r->sc, v->X, v->A, g);
        v->ops->add(v->A, v->Hb, n);
        swap(&v->X, &v->A);
    } else {
        v->ops->add(v->X, v->Hb, n);
    }
    return 0;
}

/* The mid-block Attention: one head of C = Dh, group_norm first, residual
 * added, rescale_output_factor 1. Queries are this band's tokens; keys and
 * values those of the whole image. to_q/k/v/out run as 1x1 convolutions on
 * planes (an nn.Linear over the pixels is one), then transposed: the
 * convolution's exactness over bands covers them. */
static int attention(ditd_vae *v, const vattn *a, const geom *g)
{
    const ditd_backend_ops *ops = v->ops;
    const int C = a->C, nl = g->rows * g->W, N = g->H * g->W;
    const size_t ps = ps_of(g);
    int err, off = 0;

    if ((err = groupnorm(v, &a->n, v->X, v->A, g, 0)))
        return err;
    if (g->par && v->P > 1) {
        for (int r = 0; r < v->P; r++) {
            int a0 = v->ub[r] * g->unit, a1 = v->ub[r + 1] * g->unit;
            a1 = a1 < g->H ? a1 : g->H;
            v->counts[r] = (a1 - a0) * g->W * C;
            v->displs[r] = a0 * g->W * C;
        }
        off = v->displs[v->rank];
    }
    void *kl = at(v, v->k, (size_t)off), *vl = at(v, v->v, (size_t)off);
    void *dst[3] = {v->q, kl, vl};
    const void *w3[3] = {a->wq, a->wk, a->wv}, *b3[3] = {a->bq, a->bk, a->bv};
    for (int i = 0; i < 3; i++) {
        conv1x1(v, w3[i], b3[i], C, C, v->A, v->Hb, g);
        ops->planes_to_tokens(at(v, v->Hb, (size_t)g->W), ps, dst[i], C, nl); /* (nl, C) */
    }
    if (g->par && v->P > 1) {
        ops->sync();
        double t0 = ditd_now_ms();
        if ((err = ditd_comm_allgatherv(v->comm, ops->act_dtype, NULL, v->k, v->counts, v->displs)) ||
            (err = ditd_comm_allgatherv(v->comm, ops->act_dtype, NULL, v->v, v->counts, v->displs)))
            return err;
        v->st.comm_ms += ditd_now_ms() - t0;
    }
    ops->attention(v->q, C, v->k, C, v->v, C, v->o, C, NULL, 1, nl, N, 1, C,
                   (float)(1.0 / sqrt((double)C)));                                /* (nl, C) */
    ops->tokens_to_planes(v->o, at(v, v->Hb, (size_t)g->W), ps, C, nl, 0);
    conv1x1(v, a->wo, a->bo, C, C, v->Hb, v->A, g);
    ops->add(v->X, v->A, (size_t)C * ps);                                         /* x += attn */
    return 0;
}

static int mid_block(ditd_vae *v, const vcoder *cd, const geom *g)
{
    int err;
    if ((err = resnet(v, &cd->mid0, g)))
        return err;
    if (v->cfg.mid_block_add_attention && (err = attention(v, &cd->attn, g)))
        return err;
    return resnet(v, &cd->mid1, g);
}

/* ---- decode ---- */

/* Latent rows per unit: enough that a latent-scale GEMM has about 512
 * columns (opts.row_unit overrides). The same for every G. */
static int unit_rows(const ditd_vae *v, int w)
{
    int m = v->opts.row_unit > 0 ? v->opts.row_unit : (VAE_UNIT_COLUMNS + w - 1) / w;
    return m < 1 ? 1 : m > VAE_MAX_UNIT ? VAE_MAX_UNIT : m;
}

/* The bands: U units of m rows, split as evenly as units allow; rank r has
 * units [ub[r], ub[r + 1]). Split only when every rank gets a unit. */
static void bands(ditd_vae *v, int h, int m, geom *g)
{
    const int U = (h + m - 1) / m;
    g->par = v->P > 1 && U >= v->P;
    g->unit = m;
    g->U = U;
    g->W = 0;
    g->H = h;
    for (int r = 0; r <= v->P; r++)
        v->ub[r] = g->par ? (int)((long long)U * r / v->P) : (r ? U : 0);
    int me = g->par ? v->rank : 0;
    g->u0 = v->ub[me];
    g->nu = v->ub[me + 1] - v->ub[me];
    int r0 = g->u0 * m, r1 = (g->u0 + g->nu) * m;
    g->rows = (r1 < h ? r1 : h) - r0;
}

/* Decodes one latent z (Cl, h, w), host, post_quant_conv included; the
 * leader (or every rank, when not split) gets the image (Co, h f, w f) in out. */
static int decode_one(ditd_vae *v, const float *z, int h, int w, float *out)
{
    const ditd_vae_config *c = &v->cfg;
    const ditd_backend_ops *ops = v->ops;
    const vcoder *d = &v->dec;
    const int n = c->n_blocks, Cl = c->latent_channels;
    int err;
    geom g;

    bands(v, h, unit_rows(v, w), &g);
    g.W = w;
    v->st.ranks = g.par ? v->P : 1;
    if (g.rows > v->rows_max) /* a bug, not bad input: the plan covers every band */
        return ditd_err_set(DITD_EINTERNAL, "VAE band of %d rows, planned %d", g.rows, v->rows_max);
    const int r0 = g.u0 * g.unit;
    /* the band of z into X's interior */
    for (int ci = 0; ci < Cl; ci++)
        ops->upload(at(v, v->X, (size_t)ci * ps_of(&g) + (size_t)w), z + ((size_t)ci * h + r0) * w,
                    (size_t)g.rows * w);
    if (c->use_post_quant_conv) {
        conv1(v, &v->post_quant, v->X, v->A, &g);
        swap(&v->X, &v->A);
    }
    if ((err = conv3(v, &d->conv_in, v->X, v->A, &g)))
        return err;
    swap(&v->X, &v->A);
    if ((err = mid_block(v, d, &g)))
        return err;
    for (int i = 0; i < n; i++) {
        const vblock *b = &d->blocks[i];
        for (int j = 0; j < b->n_res; j++)
            if ((err = resnet(v, &b->res[j], &g)))
                return err;
        if (b->has_sample) {
            /* Upsample2D: nearest x2, then a 3x3 conv */
            geom g2 = g;
            g2.rows *= 2;
            g2.W *= 2;
            g2.H *= 2;
            g2.unit *= 2;
            ops->upsample_nearest2x(at(v, v->X, (size_t)g.W), ps_of(&g), at(v, v->A, (size_t)g2.W),
                                    ps_of(&g2), 1, b->sample.cin, g.rows, g.W);
            g = g2;
            if ((err = conv3(v, &b->sample, v->A, v->Hb, &g)))
                return err;
            swap(&v->X, &v->Hb);
        }
    }
    if ((err = groupnorm(v, &d->norm_out, v->X, v->A, &g, 1)) ||
        (err = conv3(v, &d->conv_out, v->A, v->Hb, &g)))
        return err;
    /* the band, packed (Co, rows, W), then to the leader */
    const int Co = c->out_channels;
    const size_t bandn = (size_t)g.rows * g.W;
    ops->copy2d(v->pack, bandn, at(v, v->Hb, (size_t)g.W), ps_of(&g), (size_t)Co, bandn);
    if (!g.par) {
        if (out)
            ops->download(out, v->pack, (size_t)Co * bandn);
        return ops->status();
    }
    ops->sync();
    if (v->rank == 0) {
        for (int r = 0; r < v->P; r++) {
            int a = v->ub[r] * g.unit, e = v->ub[r + 1] * g.unit;
            e = e < g.H ? e : g.H;
            size_t rn = (size_t)(e - a) * g.W;
            if (r == 0) {
                ops->download(v->h_img, v->pack, (size_t)Co * rn);
            } else {
                ditd_comm_req req;
                double t0 = ditd_now_ms();
                if ((err = ditd_comm_sendrecv_start(v->comm, ops->act_dtype, v->pack, 0, r, v->recv,
                                                    (int)((size_t)Co * rn), r, &req)) ||
                    (err = ditd_comm_wait(v->comm, &req)))
                    return err;
                v->st.comm_ms += ditd_now_ms() - t0;
                ops->download(v->h_img, v->recv, (size_t)Co * rn);
            }
            if (out)
                for (int ci = 0; ci < Co; ci++)
                    memcpy(out + ((size_t)ci * g.H + (size_t)a) * g.W, v->h_img + ci * rn,
                           rn * sizeof *out);
        }
    } else {
        ditd_comm_req req;
        double t0 = ditd_now_ms();
        if ((err = ditd_comm_sendrecv_start(v->comm, ops->act_dtype, v->pack, (int)((size_t)Co * bandn),
                                            0, v->recv, 0, 0, &req)) ||
            (err = ditd_comm_wait(v->comm, &req)))
            return err;
        v->st.comm_ms += ditd_now_ms() - t0;
    }
    return ops->status();
}

/* AutoencoderKL.tiled_decode: tiles of tl latent rows/columns every ov =
 * int(tl * 0.75), each decoded whole, blended with the tile above and the
 * tile to the left over blend = int(T / 4) pixels (T = sample_size), then
 * cropped to T - blend. Two rows of tiles are kept. */
static int decode_tiled(ditd_vae *v, const float *z, int h, int w, float *out)
{
    const ditd_vae_config *c = &v->cfg;
    const int f = ditd_vae_config_scale_factor(c), Co = c->out_channels, Cl = c->latent_channels;
    const int tl = tile_latent(c), ov = (int)(tl * 0.75), T = c->sample_size;
    const int blend = (int)(T * 0.25), limit = T - blend, tp = tl * f;
    const int ncol = (w + ov - 1) / ov;
    const size_t tsz = (size_t)Co * tp * tp;
    const int Ho = h * f, Wo = w * f;
    float *zt = v->h_img; /* reused: a tile of latents fits in an image tile */
    int err, orow = 0;

    if ((size_t)2 * ncol * tsz > v->h_tiles_n)
        return ditd_err_set(DITD_EINVAL, "VAE tiling: latent width %d above the planned %d", w,
                            v->opts.max_w);
    /* the crops must cover the image exactly (they do when T = tl f) */
    {
        int sh = 0, sw = 0;
        for (int i = 0; i < h; i += ov)
            sh += ((h - i < tl ? h - i : tl) * f < limit) ? (h - i < tl ? h - i : tl) * f : limit;
        for (int j = 0; j < w; j += ov)
            sw += ((w - j < tl ? w - j : tl) * f < limit) ? (w - j < tl ? w - j : tl) * f : limit;
        if (sh != Ho || sw != Wo)
            return ditd_err_set(DITD_EUNSUPPORTED,
                                "VAE tiling: sample_size %d does not tile a %d x %d latent evenly",
                                T, h, w);
    }
    for (int ti = 0, i = 0; i < h; i += ov, ti++) {
        float *rowt = v->h_tiles + (size_t)(ti & 1) * ncol * tsz;
        float *prevt = v->h_tiles + (size_t)((ti + 1) & 1) * ncol * tsz;
        const int th = h - i < tl ? h - i : tl, ph = th * f;
        int ocol = 0;
        for (int tj = 0, j = 0; j < w; j += ov, tj++) {
            const int tw = w - j < tl ? w - j : tl, pw = tw * f;
            float *tile = rowt + (size_t)tj * tsz; /* (Co, ph, pw) */
            for (int ci = 0; ci < Cl; ci++)
                for (int r = 0; r < th; r++)
                    memcpy(zt + ((size_t)ci * th + r) * tw, z + ((size_t)ci * h + i + r) * w + j,
                           (size_t)tw * sizeof *zt);
            if ((err = decode_one(v, zt, th, tw, tile)))
                return err;
            /* decode_one may have run split (the leader alone holds the tile):
             * every rank then blends, only the leader's bits matter */
            if (ti > 0) {
                /* the tile above has the same width */
                const int ahp = (h - (i - ov) < tl ? h - (i - ov) : tl) * f;
                const float *above = prevt + (size_t)tj * tsz;
                int be = blend < ahp ? blend : ahp;
                be = be < ph ? be : ph;
                for (int ci = 0; ci < Co; ci++)
                    for (int y = 0; y < be; y++) {
                        const float wa = (float)(1.0 - (double)y / be), wb = (float)((double)y / be);
                        const float *ar = above + ((size_t)ci * ahp + (ahp - be + y)) * pw;
                        float *br = tile + ((size_t)ci * ph + y) * pw;
                        for (int x = 0; x < pw; x++)
                            br[x] = ar[x] * wa + br[x] * wb;
                    }
            }
            if (tj > 0) {
                const float *left = rowt + (size_t)(tj - 1) * tsz;
                const int lpw = (w - (j - ov) < tl ? w - (j - ov) : tl) * f;
                int be = blend < lpw ? blend : lpw;
                be = be < pw ? be : pw;
                for (int ci = 0; ci < Co; ci++)
                    for (int y = 0; y < ph; y++) {
                        const float *ar = left + ((size_t)ci * ph + y) * lpw;
                        float *br = tile + ((size_t)ci * ph + y) * pw;
                        for (int x = 0; x < be; x++) {
                            const float wa = (float)(1.0 - (double)x / be), wb = (float)((double)x / be);
                            br[x] = ar[lpw - be + x] * wa + br[x] * wb;
                        }
                    }
            }
            const int ch = ph < limit ? ph : limit, cw = pw < limit ? pw : limit;
            if (out)
                for (int ci = 0; ci < Co; ci++)
                    for (int y = 0; y < ch; y++)
                        memcpy(out + ((size_t)ci * Ho + orow + y) * Wo + ocol,
                               tile + ((size_t)ci * ph + y) * pw, (size_t)cw * sizeof *out);
            ocol += cw;
        }
        orow += ph < limit ? ph : limit;
    }
    return 0;
}

int ditd_vae_decode(ditd_vae *v, const float *z, int B, int h, int w, float *pixels)
{
    const ditd_vae_config *c = &v->cfg;
    const int f = ditd_vae_config_scale_factor(c), tl = tile_latent(c);
    const size_t zn = (size_t)c->latent_channels * h * w,
                 pn = (size_t)c->out_channels * (size_t)h * f * (size_t)w * f;
    const int tiled = v->opts.tiling && (h > tl || w > tl);
    double t0 = ditd_now_ms();
    int err = 0;

    if (B < 1 || h < 1 || w < 1)
        return ditd_err_set(DITD_EINVAL, "VAE decode: %d latents of %d x %d", B, h, w);
    if (!tiled && (h > v->opts.max_h || w > v->opts.max_w))
        return ditd_err_set(DITD_EINVAL, "VAE decode: latent %d x %d above the planned %d x %d", h, w,
                            v->opts.max_h, v->opts.max_w);
    if (tiled && w > v->opts.max_w)
        return ditd_err_set(DITD_EINVAL, "VAE decode: latent width %d above the planned %d", w,
                            v->opts.max_w);
    memset(&v->st, 0, sizeof v->st);
    for (int b = 0; b < B && !err; b++) {
        float *out = pixels && v->rank == 0 ? pixels + (size_t)b * pn : NULL;
        err = tiled ? decode_tiled(v, z + (size_t)b * zn, h, w, out)
                    : decode_one(v, z + (size_t)b * zn, h, w, out);
    }
    v->st.compute_ms = ditd_now_ms() - t0 - v->st.comm_ms;
    return err;
}

/* ---- encode ---- */

/* The encoder's band at a scale of Hs x Ws (s = 2^(stride-2 stages left)),
 * from the bands of the latent (lat): units of lat->unit s rows, the last
 * band reaching the image's bottom row. Every band but the last has an even
 * number of rows before each stride-2 stage, so its outputs are exactly
 * rows [a / 2, e / 2) of the whole image's. */
static void enc_geom(const geom *lat, int s, int Hs, int Ws, geom *g)
{
    *g = *lat;
    g->unit = lat->unit * s;
    g->H = Hs;
    g->W = Ws;
    const int a = lat->u0 * g->unit;
    const int e = lat->u0 + lat->nu == lat->U ? Hs : (lat->u0 + lat->nu) * g->unit;
    g->rows = e - a;
}

/* The moments (2 Cl, h, w) of the whole latent on every rank, in v->pack:
 * each rank's band packed, all-gathered into v->recv (rank by rank), laid
 * out again by channel. Not split: the band is the latent. */
static int enc_moments(ditd_vae *v, void *y, const geom *g, int C)
{
    const ditd_backend_ops *ops = v->ops;
    const size_t bandn = (size_t)g->rows * g->W, hw = (size_t)g->H * g->W;
    int err;
    ops->copy2d(v->pack, bandn, at(v, y, (size_t)g->W), ps_of(g), (size_t)C, bandn);
    if (!g->par || v->P == 1)
        return 0;
    for (int r = 0; r < v->P; r++) {
        int a = v->ub[r] * g->unit, e = v->ub[r + 1] * g->unit;
        e = e < g->H ? e : g->H;
        v->counts[r] = C * (e - a) * g->W;
        v->displs[r] = C * a * g->W;
    }
    ops->sync();
    double t0 = ditd_now_ms();
    if ((err = ditd_comm_allgatherv(v->comm, ops->act_dtype, v->pack, v->recv, v->counts, v->displs)))
        return err;
    v->st.comm_ms += ditd_now_ms() - t0;
    for (int r = 0; r < v->P; r++) {
        size_t a = (size_t)v->displs[r] / (size_t)C, rn = (size_t)v->counts[r] / (size_t)C;
        ops->copy2d(at(v, v->pack, a), hw, at(v, v->recv, (size_t)v->displs[r]), rn, (size_t)C, rn);
    }
    return 0;
}

int ditd_vae_encode(ditd_vae *v, const float *x, int B, int H, int W, uint64_t seed, float *mean,
                    float *sample)
{
    return ditd_vae_encode_stream(v, x, B, H, W, seed, 0, 0, mean, sample);
}

int ditd_vae_encode_stream(ditd_vae *v, const float *x, int B, int H, int W, uint64_t seed,
                           uint64_t stream, uint64_t offset, float *mean, float *sample)
{
    const ditd_vae_config *c = &v->cfg;
    const ditd_backend_ops *ops = v->ops;
    const vcoder *e = &v->enc;
    const int n = c->n_blocks, Cl = c->latent_channels, f = ditd_vae_config_scale_factor(c);
    double t0 = ditd_now_ms();
    int err = 0;

    if (!v->has_encoder)
        return ditd_err_set(DITD_EINVAL, "VAE encode: loaded without encoder (max_image_h/w)");
    if (B < 1 || H < 1 || W < 1 || H > v->opts.max_image_h || W > v->opts.max_image_w)
        return ditd_err_set(DITD_EINVAL, "VAE encode: %d images of %d x %d (planned up to %d x %d)", B,
                            H, W, v->opts.max_image_h, v->opts.max_image_w);
    /* Downsample2D's 3x3 stride-2 convolution needs 2 rows and columns
     * after its (0, 1) pad (PyTorch refuses a smaller input too) */
    for (int i = 0, hs = H, ws = W; i < n - 1; i++, hs /= 2, ws /= 2)
        if (hs < 2 || ws < 2)
            return ditd_err_set(DITD_EINVAL, "VAE encode: image %d x %d: downsample %d of %d gets "
                                "%d x %d pixels (at least 2 x 2 needed)", W, H, i + 1, n - 1, ws, hs);
    const int h = ditd_vae_latent_side(c, H), w = ditd_vae_latent_side(c, W);
    const size_t ln = (size_t)Cl * h * w;
    /* Units of one latent row unless opts.row_unit says otherwise (the
     * decode's ~512 columns a unit served the old GEMM path): every latent
     * of at least G rows splits, as evenly as rows go. A function of the
     * image alone, never of G, like the decode's. */
    geom lat;
    bands(v, h, v->opts.row_unit > 0 ? unit_rows(v, w) : 1, &lat);
    lat.W = w;
    if (lat.rows > v->enc_rows_max) /* a bug, not bad input: the plan covers every band */
        return ditd_err_set(DITD_EINTERNAL, "VAE encoder band of %d latent rows, planned %d", lat.rows,
                            v->enc_rows_max);
    memset(&v->st, 0, sizeof v->st);
    v->st.ranks = lat.par ? v->P : 1;
    for (int b = 0; b < B; b++) {
        int s = f, Hs = H, Ws = W;
        geom g;
        enc_geom(&lat, s, Hs, Ws, &g);
        const size_t r0 = (size_t)g.u0 * (size_t)g.unit;
        for (int ci = 0; ci < c->in_channels; ci++)
            ops->upload(at(v, v->X, (size_t)ci * ps_of(&g) + (size_t)W),
                        x + (((size_t)b * c->in_channels + ci) * H + r0) * W, (size_t)g.rows * W);
        if ((err = conv3(v, &e->conv_in, v->X, v->A, &g)))
            return err;
        swap(&v->X, &v->A);
        for (int i = 0; i < n; i++) {
            const vblock *bl = &e->blocks[i];
            for (int j = 0; j < bl->n_res; j++)
                if ((err = resnet(v, &bl->res[j], &g)))
                    return err;
            if (bl->has_sample) {
                /* Downsample2D(padding=0): pad (0, 1, 0, 1) with zeros, 3x3
                 * stride 2. The bottom pad row is the halo below the band:
                 * the next band's first row, or zeros under the image. */
                geom g2;
                s /= 2;
                Hs = (Hs - 2) / 2 + 1;
                Ws = (Ws - 2) / 2 + 1;
                enc_geom(&lat, s, Hs, Ws, &g2);
                if ((g.rows + 1 - 3) / 2 + 1 != g2.rows) /* a bug: the bands keep even rows */
                    return ditd_err_set(DITD_EINTERNAL, "VAE encoder: a band of %d rows to %d", g.rows,
                                        g2.rows);
                if ((err = halo_fill(v, v->X, bl->sample.cin, &g)))
                    return err;
                ops->conv2d(at(v, v->X, (size_t)g.W), ps_of(&g), bl->sample.w, bl->sample.b,
                            at(v, v->A, (size_t)g2.W), ps_of(&g2), v->scratch, v->scratch_n, 1,
                            bl->sample.cin, g.rows + 1, g.W, bl->sample.cout, 3, 2, 0, 0, 0, 1);
                g = g2;
                swap(&v->X, &v->A);
            }
        }
        if ((err = mid_block(v, e, &g)) || (err = groupnorm(v, &e->norm_out, v->X, v->A, &g, 1)) ||
            (err = conv3(v, &e->conv_out, v->A, v->Hb, &g)))
            return err;
        if (c->use_quant_conv) {
            conv1(v, &v->quant, v->Hb, v->A, &g);
            swap(&v->A, &v->Hb);
        }
        /* moments (2 Cl, h, w): mean, then logvar; the same on every rank */
        if ((err = enc_moments(v, v->Hb, &g, 2 * Cl)))
            return err;
        ops->download(v->h_img, v->pack, 2 * ln);
        if ((err = ops->status()))
            return err;
        if (mean)
            memcpy(mean + (size_t)b * ln, v->h_img, ln * sizeof *mean);
        if (sample) {
            float *sp = sample + (size_t)b * ln;
            ditd_philox_normal(seed, stream + (uint64_t)b, offset, ln, sp);
            for (size_t i = 0; i < ln; i++) {
                float lv = v->h_img[ln + i];
                lv = lv < -30.0f ? -30.0f : lv > 20.0f ? 20.0f : lv;
                sp[i] = v->h_img[i] + expf(0.5f * lv) * sp[i];
            }
        }
    }
    v->st.compute_ms = ditd_now_ms() - t0 - v->st.comm_ms;
    return 0;
}
