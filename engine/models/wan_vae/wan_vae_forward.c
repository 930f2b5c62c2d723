/* AutoencoderKLWan: the plan, the chunked decode (on one rank or a whole
 * worker group) and the chunked encode. The layers are in wan_vae_ops.c.
 *
 * The plan: ditd__wan_vae_plan runs one decode chunk and one encode chunk
 * at their largest (the second chunk: most frames; the planned sizes; the
 * largest band) with v->planning set: no op runs, every buffer, cache and
 * scratch records what it would need, and the arena is carved from those
 * numbers. The code that plans is the code that runs.
 *
 * Parallel decode (P ranks; the latent's rows in units of m rows, the units
 * split as evenly as they go, a unit is m s rows after s x upsampling):
 * one halo row per 3x3 convolution from each neighbour, the per-frame
 * attention on the whole frame (gathered), the frames gathered at the end.
 * The RMS norms are per position: no statistics travel. Every GEMM runs on
 * chunks of rows aligned to the whole image (a divisor of the unit), so the
 * result is bit-identical to one rank's. A latent with fewer units than
 * ranks is decoded whole on every rank, with no communication.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/error.h"
#include "engine/core/philox.h"
#include "engine/models/wan_vae/wan_vae_state.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/text_kernels.h"

#define WAN_MAX_UNIT 8       /* latent rows per unit, at most */
#define WAN_UNIT_COLUMNS 512 /* latent-scale GEMM columns a unit aims at */

typedef ditd__wan_vid vid;
typedef ditd__wan_geom geom;

static size_t zmax(size_t a, size_t b)
{
    return a > b ? a : b;
}

/* Latent rows per unit: enough that a latent-scale GEMM has about 512
 * columns (opts.row_unit overrides). The same for every G. */
static int unit_rows(const ditd_wan_vae *v, int w)
{
    int m = v->opts.row_unit > 0 ? v->opts.row_unit : (WAN_UNIT_COLUMNS + w - 1) / w;
    return m < 1 ? 1 : m > WAN_MAX_UNIT ? WAN_MAX_UNIT : m;
}

/* The bands of an h x w latent: U units of m rows, split as evenly as units
 * allow; rank r has units [ub[r], ub[r + 1]). Split only when every rank
 * gets a unit. */
static geom bands(ditd_wan_vae *v, int h, int w)
{
    const int m = unit_rows(v, w), U = (h + m - 1) / m;
    geom g = {0};
    g.par = v->P > 1 && U >= v->P;
    g.aligned = 1;
    g.unit = m;
    g.U = U;
    g.H = h;
    g.W = w;
    for (int r = 0; r <= v->P; r++)
        v->ub[r] = g.par ? (int)((long long)U * r / v->P) : (r ? U : 0);
    const int me = g.par ? v->rank : 0;
    g.u0 = v->ub[me];
    g.nu = v->ub[me + 1] - v->ub[me];
    const int r0 = g.u0 * m, r1 = (g.u0 + g.nu) * m;
    g.rows = (r1 < h ? r1 : h) - r0;
    return g;
}

/* The largest band a decode can have at latent scale, over every unit m it
 * may pick for latents up to h rows: ceil(U / P) units of a split, or a
 * whole latent of fewer than P units (< P m rows). */
static int rows_max(const ditd_wan_vae *v, int h)
{
    int rows = 0;
    for (int m = 1; m <= WAN_MAX_UNIT; m++) {
        if (v->opts.row_unit > 0 &&
            m != (v->opts.row_unit < WAN_MAX_UNIT ? v->opts.row_unit : WAN_MAX_UNIT))
            continue;
        int U = (h + m - 1) / m, split = (U + v->P - 1) / v->P * m, whole = (v->P - 1) * m;
        int r = split > whole ? split : whole;
        if (v->P == 1 || r > h)
            r = h;
        rows = rows > r ? rows : r;
    }
    return rows;
}

/* ---- the plan ---- */

static int carve(ditd_wan_vae *v, void **p, size_t n)
{
    int err = 0;
    *p = n ? ditd_arena_bytes(&v->acts, n * ditd_dtype_size(v->ops->act_dtype), &err) : NULL;
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
    err |= carve(v, &v->zeros, v->halo_n);
    if (v->P > 1) {
        err |= carve(v, &v->hs0, v->halo_n) | carve(v, &v->hs1, v->halo_n);
        err |= carve(v, &v->hr0, v->halo_n) | carve(v, &v->hr1, v->halo_n);
    }
    err |= carve(v, &v->pack, v->pack_n);
    err |= carve(v, &v->gath, v->full_n);
    if (v->has_dec)
        err |= ditd__wan_carve_coder(v, &v->dec);
    if (v->has_enc)
        err |= ditd__wan_carve_coder(v, &v->enc);
    return err ? DITD_ENOMEM : 0;
}

/* One decode chunk's band (the latent frame of z already in x) through
 * post_quant_conv and the decoder; the caller drops what it returns. */
static vid decode_chunk(ditd_wan_vae *v, vid x, int first)
{
    x = ditd__wan_cconv(v, &v->post_quant, NULL, &x, 0);
    return ditd__wan_decoder_chunk(v, x, first);
}

/* The frames of a decoded chunk gathered (the output frames, packed
 * (T, C, rows, W) per rank), for the leader: planned sizes. */
static void plan_gather(ditd_wan_vae *v, const vid *y)
{
    v->pack_n = zmax(v->pack_n, (size_t)y->T * y->C * y->g.rows * y->g.W);
    v->full_n = zmax(v->full_n, (size_t)y->T * y->C * y->g.H * y->g.W);
}

int ditd__wan_vae_plan(ditd_wan_vae *v)
{
    const ditd_wan_vae_config *c = &v->cfg;
    const int p = c->patch_size;
    int err;

    v->rank = v->comm ? ditd_comm_rank(v->comm) : 0;
    v->P = v->comm ? ditd_comm_size(v->comm) : 1;
    v->ub = calloc((size_t)v->P + 1, sizeof *v->ub);
    v->counts = calloc((size_t)v->P, sizeof *v->counts);
    v->displs = calloc((size_t)v->P, sizeof *v->displs);
    if (!v->ub || !v->counts || !v->displs)
        return ditd_err_set(DITD_ENOMEM, "Wan VAE group tables");
    v->planning = 1;
    if (v->has_dec) {
        const int h = v->dec_h, w = v->dec_w; /* the largest latent one decode takes */
        if (h * w > DITD_CPU_MASKED_ATTN_MAX_N &&
            (v->dec.attn.C > DITD_CPU_ATTN_MAX_DH || v->opts.gemm_attention))
            return ditd_err_set(DITD_EUNSUPPORTED,
                                "Wan VAE: a %d x %d latent is %d positions per frame; the decoder's "
                                "attention head of %d takes at most %d", h, w, h * w, v->dec.attn.C,
                                DITD_CPU_MASKED_ATTN_MAX_N);
        v->rows_max = rows_max(v, h);
        /* two chunks: the first, then one as large as any later one; the
         * largest band, split when there is a group (the gathers planned) */
        for (int first = 1; first >= 0; first--) {
            geom g = bands(v, h, w);
            g.rows = v->rows_max;
            g.par = v->P > 1;
            vid z = ditd__wan_grab(v, 1, c->z_dim, &g);
            vid y = decode_chunk(v, z, first);
            plan_gather(v, &y);
            ditd__wan_drop(v, &y);
        }
        v->h_frame_n = zmax(v->h_frame_n, (size_t)c->out_channels * h * w *
                                              (size_t)(1 << (c->n_mult - 1)) * (1 << (c->n_mult - 1)));
        v->h_frame_n = zmax(v->h_frame_n, (size_t)c->z_dim * h * w);
        ditd__wan_reset_coder(&v->dec);
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
            geom g = {.rows = H, .W = W, .H = H, .unit = H, .nu = 1, .U = 1};
            vid x = ditd__wan_grab(v, T, c->in_channels, &g);
            vid y = ditd__wan_encoder_chunk(v, x);
            y = ditd__wan_cconv(v, &v->quant, NULL, &y, 0);
            ditd__wan_drop(v, &y);
        }
        v->h_frame_n = zmax(v->h_frame_n, (size_t)c->in_channels * H * W);
        v->h_frame_n = zmax(v->h_frame_n, (size_t)2 * c->z_dim * h * w);
        ditd__wan_reset_coder(&v->enc);
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
    return 0;
}

/* ---- decode ---- */

/* Frame k of the decoded chunk y (a band) onto the leader's host frame
 * (C, H, W): packed, all-gathered, laid out. Every rank calls it. */
static int gather_out(ditd_wan_vae *v, const vid *y, int k)
{
    const ditd_backend_ops *ops = v->ops;
    const size_t W = (size_t)y->g.W, band = (size_t)y->g.rows * W;
    const int C = y->C;
    int err;
    ops->copy2d(v->pack, band, ditd_ptr_act(ops, ditd__wan_frame(v, y, k), W), ditd__wan_ps(&y->g),
                (size_t)C, band);
    for (int r = 0; r < v->P; r++) {
        int a = v->ub[r] * y->g.unit, e = v->ub[r + 1] * y->g.unit;
        e = e < y->g.H ? e : y->g.H;
        v->counts[r] = C * (e - a) * y->g.W;
        v->displs[r] = C * a * y->g.W;
    }
    ops->sync();
    if ((err = ditd_comm_allgatherv(v->comm, ops->act_dtype, v->pack, v->gath, v->counts,
                                    v->displs)))
        return err;
    for (int r = 0; r < v->P && v->rank == 0; r++) {
        int a = v->ub[r] * y->g.unit, e = v->ub[r + 1] * y->g.unit;
        e = e < y->g.H ? e : y->g.H;
        const size_t n = (size_t)(e - a) * W;
        for (int ch = 0; ch < C; ch++)
            ops->download(v->h_frame + ((size_t)ch * y->g.H + a) * W,
                          ditd_ptr_act(ops, v->gath, (size_t)v->displs[r] + ch * n), n);
    }
    return 0;
}

int ditd__wan_vae_decode_clip(ditd_wan_vae *v, const float *z, int T, int hz, int wz, int i0,
                              int j0, int h, int w, ditd__wan_frame_sink sink, void *ctx)
{
    const ditd_wan_vae_config *c = &v->cfg;
    const ditd_backend_ops *ops = v->ops;
    int f0 = 0, err;

    ditd__wan_reset_coder(&v->dec);
    v->busy = 0;
    v->err = 0;
    const geom g = bands(v, h, w);
    const int r0 = g.u0 * g.unit;
    if (g.rows > v->rows_max) /* a bug, not bad input: the plan covers every band */
        return ditd_err_set(DITD_EINTERNAL, "Wan VAE band of %d rows, planned %d", g.rows,
                            v->rows_max);
    for (int t = 0; t < T; t++) {
        /* this band's rows of latent frame t of the window, (z_dim, rows, w) */
        vid x = ditd__wan_grab(v, 1, c->z_dim, &g);
        for (int ch = 0; ch < c->z_dim; ch++)
            for (int r = 0; r < g.rows; r++)
                memcpy(v->h_frame + ((size_t)ch * g.rows + r) * w,
                       z + (((size_t)ch * T + t) * hz + i0 + r0 + r) * wz + j0,
                       (size_t)w * sizeof *z);
        for (int ch = 0; ch < c->z_dim; ch++)
            ops->upload(ditd_ptr_act(ops, ditd__wan_frame(v, &x, 0),
                                     (size_t)ch * ditd__wan_ps(&g) + (size_t)w),
                        v->h_frame + (size_t)ch * g.rows * w, (size_t)g.rows * w);
        vid y = decode_chunk(v, x, t == 0);
        if (v->err)
            return v->err;
        for (int k = 0; k < y.T; k++, f0++) {
            if (y.g.par) {
                if ((err = gather_out(v, &y, k)))
                    return err;
            } else if (v->rank == 0) {
                for (int ch = 0; ch < y.C; ch++)
                    ops->download(v->h_frame + (size_t)ch * y.g.rows * y.g.W,
                                  ditd_ptr_act(ops, ditd__wan_frame(v, &y, k),
                                               (size_t)ch * ditd__wan_ps(&y.g) + (size_t)y.g.W),
                                  (size_t)y.g.rows * y.g.W);
            }
            if ((err = ops->status()))
                return err;
            if (v->rank == 0 && (err = sink(ctx, f0, v->h_frame, y.C, y.g.H, y.g.W)))
                return err;
        }
        ditd__wan_drop(v, &y);
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
        ditd__wan_reset_coder(&v->enc);
        v->busy = 0;
        v->err = 0;
        const geom g = {.rows = Hp, .W = Wp, .H = Hp, .unit = Hp, .nu = 1, .U = 1};
        const size_t ps = ditd__wan_ps(&g), hwp = (size_t)Hp * Wp;
        for (int k = 0; k < 1 + (F - 1) / 4; k++) {
            const int f0 = k == 0 ? 0 : 1 + 4 * (k - 1), nf = k == 0 ? 1 : 4;
            vid in = ditd__wan_grab(v, nf, c->in_channels, &g);
            for (int f = 0; f < nf; f++) {
                /* patchify: channel ch p^2 + (q % p) p + r % p at (r / p, q / p) */
                for (int ch = 0; ch < Cp; ch++)
                    for (int r = 0; r < H; r++)
                        for (int q = 0; q < W; q++) {
                            const int dst = ch * p * p + (q % p) * p + r % p;
                            v->h_frame[((size_t)dst * Hp + r / p) * Wp + q / p] =
                                xb[(((size_t)ch * F + f0 + f) * H + r) * W + q];
                        }
                for (int ch = 0; ch < c->in_channels; ch++)
                    ops->upload(ditd_ptr_act(ops, ditd__wan_frame(v, &in, f), ch * ps + (size_t)Wp),
                                v->h_frame + ch * hwp, hwp);
            }
            vid y = ditd__wan_encoder_chunk(v, in);
            y = ditd__wan_cconv(v, &v->quant, NULL, &y, 0); /* (T', 2 Z, h, w) */
            const size_t yps = ditd__wan_ps(&y.g);
            for (int t = 0; t < y.T; t++, t_out++) {
                if (t_out >= T)
                    return ditd_err_set(DITD_EINTERNAL, "Wan VAE encode: too many latent frames");
                for (int ch = 0; ch < 2 * Z; ch++)
                    ops->download(v->h_frame + ch * hw,
                                  ditd_ptr_act(ops, ditd__wan_frame(v, &y, t), ch * yps + (size_t)w),
                                  hw);
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
            ditd__wan_drop(v, &y);
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
