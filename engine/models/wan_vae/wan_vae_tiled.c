/* AutoencoderKLWan.tiled_decode (Diffusers' enable_tiling): the latent cut
 * into tiles of tile_sample_min // ratio latent rows/columns every
 * tile_sample_stride // ratio, each tile decoded as a whole clip (every
 * frame, the caches cleared per tile), blended with the tile above and the
 * tile to the left over tile_sample_min - tile_sample_stride pixels
 * (before unpatchify: both over patch_size), cropped to the stride and
 * concatenated, then unpatchified and clamped. Tiles are blended in place
 * in the order Diffusers blends them, so a tile blends with neighbours that
 * are already blended; two rows of decoded tiles are kept on the host.
 */
#include <stdlib.h>
#include <string.h>

#include "engine/core/error.h"
#include "engine/models/wan_vae/wan_vae_state.h"

typedef struct tiling {
    int tl_h, tl_w;       /* latent tile: tile_sample_min // ratio */
    int ts_h, ts_w;       /* latent stride: tile_sample_stride // ratio */
    int crop_h, crop_w;   /* decoded pixels kept per tile (before unpatchify) */
    int blend_h, blend_w; /* blend extents (before unpatchify) */
    int up;               /* the decoder's spatial factor: 2^(n_mult - 1) */
} tiling;

static void tiling_of(const ditd_wan_vae *v, tiling *t)
{
    const ditd_wan_vae_config *c = &v->cfg;
    const ditd_wan_vae_opts *o = &v->opts;
    const int ratio = c->scale_factor_spatial, p = c->patch_size;
    const int min_h = o->tile_sample_min_h > 0 ? o->tile_sample_min_h : 256;
    const int min_w = o->tile_sample_min_w > 0 ? o->tile_sample_min_w : 256;
    const int st_h = o->tile_sample_stride_h > 0 ? o->tile_sample_stride_h : 192;
    const int st_w = o->tile_sample_stride_w > 0 ? o->tile_sample_stride_w : 192;
    t->tl_h = min_h / ratio;
    t->tl_w = min_w / ratio;
    t->ts_h = st_h / ratio;
    t->ts_w = st_w / ratio;
    if (p > 1) {
        t->crop_h = st_h / p;
        t->crop_w = st_w / p;
        t->blend_h = min_h / p - t->crop_h;
        t->blend_w = min_w / p - t->crop_w;
    } else {
        t->crop_h = st_h;
        t->crop_w = st_w;
        t->blend_h = min_h - st_h;
        t->blend_w = min_w - st_w;
    }
    t->up = 1 << (c->n_mult - 1);
}

int ditd__wan_vae_tile_latent(const ditd_wan_vae *v, int width)
{
    tiling t;
    tiling_of(v, &t);
    return width ? t.tl_w : t.tl_h;
}

int ditd__wan_vae_tiled(const ditd_wan_vae *v, int h, int w)
{
    tiling t;
    if (!v->opts.tiling)
        return 0;
    tiling_of(v, &t);
    return w > t.tl_w || h > t.tl_h;
}

int ditd__wan_vae_plan_tiles(ditd_wan_vae *v)
{
    const ditd_wan_vae_config *c = &v->cfg;
    tiling t;
    tiling_of(v, &t);
    if (t.tl_h < 1 || t.tl_w < 1 || t.ts_h < 1 || t.ts_w < 1 || t.crop_h < 1 || t.crop_w < 1)
        return ditd_err_set(DITD_EUNSUPPORTED,
                            "Wan VAE tiling: tiles of %d x %d latents every %d x %d (the sample "
                            "sizes must be at least scale_factor_spatial = %d)",
                            t.tl_h, t.tl_w, t.ts_h, t.ts_w, c->scale_factor_spatial);
    if (v->opts.max_frames < 1 || v->opts.max_frames > 4096)
        return ditd_err_set(DITD_EINVAL, "Wan VAE tiling: max_frames = %d (1..4096)",
                            v->opts.max_frames);
    const int F = ditd_wan_vae_config_frames(c, v->opts.max_frames);
    v->tile_cols = (v->opts.max_w + t.ts_w - 1) / t.ts_w;
    v->tile_n = (size_t)F * c->out_channels * (size_t)(t.tl_h * t.up) * (size_t)(t.tl_w * t.up);
    v->h_tiles_n = 2 * (size_t)v->tile_cols * v->tile_n;
    if (!(v->h_tiles = malloc(v->h_tiles_n * sizeof *v->h_tiles)))
        return ditd_err_set(DITD_ENOMEM, "Wan VAE tiles (%zu floats)", v->h_tiles_n);
    return 0;
}

typedef struct tile_sink {
    float *tile; /* (F, C, ph, pw) */
} tile_sink;

static int put_tile(void *ctx, int f, const float *frame, int C, int hh, int ww)
{
    tile_sink *s = ctx;
    const size_t n = (size_t)C * hh * ww;
    memcpy(s->tile + (size_t)f * n, frame, n * sizeof *frame);
    return 0;
}

int ditd__wan_vae_decode_tiled(ditd_wan_vae *v, const float *z, int T, int h, int w, float *out)
{
    const ditd_wan_vae_config *c = &v->cfg;
    const int C = c->out_channels, F = ditd_wan_vae_config_frames(c, T);
    const int s = ditd_wan_vae_config_scale_factor(c), Ho = h * s, Wo = w * s;
    tiling t;
    int err, orow = 0;

    tiling_of(v, &t);
    const int ncol = (w + t.ts_w - 1) / t.ts_w, sample_h = h * t.up, sample_w = w * t.up;
    if (ncol > v->tile_cols)
        return ditd_err_set(DITD_EINVAL, "Wan VAE tiling: latent width %d above the planned %d", w,
                            v->opts.max_w);
    for (int ti = 0, i = 0; i < h; i += t.ts_h, ti++) {
        float *rowt = v->h_tiles + (size_t)(ti & 1) * v->tile_cols * v->tile_n;
        float *prevt = v->h_tiles + (size_t)((ti + 1) & 1) * v->tile_cols * v->tile_n;
        const int th = h - i < t.tl_h ? h - i : t.tl_h, ph = th * t.up;
        int ocol = 0;
        for (int tj = 0, j = 0; j < w; j += t.ts_w, tj++) {
            const int tw = w - j < t.tl_w ? w - j : t.tl_w, pw = tw * t.up;
            const size_t fn = (size_t)C * ph * pw; /* one frame of this tile */
            tile_sink ts = {rowt + (size_t)tj * v->tile_n};
            if ((err = ditd__wan_vae_decode_clip(v, z, T, h, w, i, j, th, tw, put_tile, &ts)))
                return err;
            float *tile = ts.tile;
            if (v->rank != 0) /* only the leader holds the frames (the others decoded with it) */
                continue;
            if (ti > 0) { /* blend_v with the tile above (same width) */
                const int ah = (h - (i - t.ts_h) < t.tl_h ? h - (i - t.ts_h) : t.tl_h) * t.up;
                const float *above = prevt + (size_t)tj * v->tile_n;
                int be = t.blend_h < ah ? t.blend_h : ah;
                be = be < ph ? be : ph;
                for (int f = 0; f < F; f++)
                    for (int ch = 0; ch < C; ch++)
                        for (int y = 0; y < be; y++) {
                            const float wa = (float)(1.0 - (double)y / be), wb = (float)((double)y / be);
                            const float *ar = above + (((size_t)f * C + ch) * ah + (ah - be + y)) * pw;
                            float *br = tile + (((size_t)f * C + ch) * ph + y) * pw;
                            for (int x = 0; x < pw; x++)
                                br[x] = ar[x] * wa + br[x] * wb;
                        }
            }
            if (tj > 0) { /* blend_h with the tile to the left (same height) */
                const int lw = (w - (j - t.ts_w) < t.tl_w ? w - (j - t.ts_w) : t.tl_w) * t.up;
                const float *left = rowt + (size_t)(tj - 1) * v->tile_n;
                int be = t.blend_w < lw ? t.blend_w : lw;
                be = be < pw ? be : pw;
                for (int f = 0; f < F; f++)
                    for (int ch = 0; ch < C; ch++)
                        for (int y = 0; y < ph; y++) {
                            const float *ar = left + (((size_t)f * C + ch) * ph + y) * lw;
                            float *br = tile + (((size_t)f * C + ch) * ph + y) * pw;
                            for (int x = 0; x < be; x++) {
                                const float wa = (float)(1.0 - (double)x / be);
                                const float wb = (float)((double)x / be);
                                br[x] = ar[lw - be + x] * wa + br[x] * wb;
                            }
                        }
            }
            /* the crop, where it falls inside the sample */
            int ch_ = ph < t.crop_h ? ph : t.crop_h, cw = pw < t.crop_w ? pw : t.crop_w;
            int nh = orow + ch_ > sample_h ? sample_h - orow : ch_;
            int nw = ocol + cw > sample_w ? sample_w - ocol : cw;
            if (nh > 0 && nw > 0)
                for (int f = 0; f < F; f++)
                    ditd__wan_vae_put_frame(c, tile + (size_t)f * fn, ph, pw, orow, ocol, nh, nw,
                                            out, F, f, Ho, Wo);
            ocol += cw;
        }
        orow += ph < t.crop_h ? ph : t.crop_h;
    }
    return 0;
}

/* ---- the decode entry: the whole latent, or tile by tile ---- */

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
    if (v->rank == 0 && !frames)
        return ditd_err_set(DITD_EINVAL, "Wan VAE decode: no output on the leader");
    for (int bi = 0; bi < B; bi++) {
        const float *zb = z + (size_t)bi * zn;
        float *ob = v->rank == 0 ? frames + (size_t)bi * fn : NULL;
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
