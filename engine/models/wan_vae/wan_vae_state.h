/* Inside the AutoencoderKLWan: the parameter structs and the state shared
 * by wan_vae.c (parameters, loading, the plan) and wan_vae_forward.c (the
 * chunked decode and encode). Not a public header: nothing outside
 * engine/models/wan_vae includes it.
 */
#ifndef DITD_ENGINE_WAN_VAE_STATE_H
#define DITD_ENGINE_WAN_VAE_STATE_H

#include "engine/core/tensor.h"
#include "engine/models/wan_vae/wan_vae.h"
#include "engine/parallel/comm.h"

#define WAN_MAX_RES 17 /* resnets per block: num_res_blocks + 1 <= 17 */
#define WAN_NBUF 6     /* rotating activation buffers, each one chunk at its largest */

typedef struct wconv { /* WanCausalConv3d (kt, k, k) or nn.Conv2d (kt 0: 4-D weight) */
    void *w, *b;
    int cin, cout, kt, k;
} wconv;

/* The feature cache of one causal convolution: its last (at most 2) input
 * frames, oldest first, f[0..n). */
typedef struct wcache {
    void *f[2];
    int n;
    size_t elems; /* planned frame size (C H W at that layer, the largest) */
} wcache;

typedef struct wres { /* WanResidualBlock */
    void *g1, *g2;     /* norm1.gamma, norm2.gamma (C) */
    wconv c1, c2, sc;  /* sc: conv_shortcut (1x1x1) when cin != cout */
    wcache k1, k2;
    int cin, cout, has_sc;
} wres;

typedef struct wattn { /* WanAttentionBlock: one head of C, per frame */
    void *g;            /* norm.gamma */
    wconv qkv, proj;    /* to_qkv (3C, C, 1, 1), proj (C, C, 1, 1) */
    int C;
} wattn;

enum { WS_NONE = 0, WS_UP2D, WS_UP3D, WS_DOWN2D, WS_DOWN3D };

typedef struct wsample { /* WanResample */
    int mode;
    wconv conv;    /* resample.1: Conv2d 3x3 */
    wconv time;    /* time_conv (3, 1, 1) */
    wcache tc;     /* the time convolution's cache */
    int started;   /* the first chunk went through ("Rep" / the first clone) */
} wsample;

typedef struct wblock {
    wres res[WAN_MAX_RES];
    int n_res;
    wsample rs;
    /* Wan 2.2's shortcut around the block: AvgDown3D (encoder) or DupUp3D
     * (decoder) from sc_in to sc_out channels, factors ft (time), fs (space) */
    int shortcut, sc_in, sc_out, sc_ft, sc_fs;
} wblock;

typedef struct wcoder { /* WanEncoder3d / WanDecoder3d */
    wconv conv_in;
    wcache kin;
    wblock blocks[DITD_WAN_VAE_MAX_BLOCKS];
    int n_blocks;
    wres mid0, mid1;
    wattn attn;
    void *norm_out;
    int norm_C;
    wconv conv_out;
    wcache kout;
} wcoder;

struct ditd_wan_vae {
    const ditd_backend_ops *ops;
    ditd_wan_vae_config cfg;
    ditd_wan_vae_opts opts;
    int has_dec, has_enc;
    ditd_arena weights, acts;
    wconv quant, post_quant;
    wcoder enc, dec;

    /* the group (borrowed; NULL: one rank) */
    ditd_comm *comm;
    int rank, P;
    int *ub;                       /* (P + 1) first unit of each rank's band, then U */
    int *counts, *displs;          /* (P) */
    int rows_max;                  /* a band's latent rows, at most */
    int dec_h, dec_w;              /* the largest latent one decode takes (a tile when tiled) */
    int err;                       /* the first collective's error in a chunk */

    /* the plan: a dry run of one chunk at its largest records what it needs */
    int planning;
    size_t act_n, scratch_n, tok_n, qkv_n, score_n, halo_n, pack_n, full_n;
    void *zeros, *hs0, *hs1, *hr0, *hr1; /* halo rows (halo_n): zeros, sent, received */
    void *pack, *gath;             /* a band packed (pack_n); the whole image gathered (full_n) */
    void *buf[WAN_NBUF];
    unsigned busy;                 /* bit i: buf[i] holds a live tensor */
    int bug;                       /* the forward ran out of buffers (a bug) */
    void *scratch;                 /* im2col (scratch_n) */
    void *qkv, *tq, *tk, *tv, *to; /* one frame's attention: (3C, N) planes; (N, C) tokens */
    void *score;                   /* (N, N) scores for heads above the fused kernel's */
    float *h_frame;                /* one frame on the host (patchify / unpatchify) */
    size_t h_frame_n;
    float *h_tiles;                /* tiling: two rows of decoded tiles, every frame */
    size_t h_tiles_n, tile_n;      /* floats of both rows; of one tile */
    int tile_cols;                 /* tiles in a row, at most */
};

/* A chunk's geometry: a band of `rows` rows of W columns of an image of H
 * rows (the whole image when !par), with one halo row above and one below
 * in every plane (plane stride (rows + 2) W, the interior at row 1). The
 * rows are counted in units of `unit` rows: the band is units [u0, u0 +
 * nu) of the image's U. aligned: every GEMM runs on chunks of rows that
 * divide the unit (the decode: its bits then depend on the unit only,
 * never on the group's size). */
typedef struct ditd__wan_geom {
    int rows, W, H;
    int par, aligned;
    int unit, u0, nu, U;
} ditd__wan_geom;

/* A chunk (T, C, geometry) in buf[b], frame-major: frame t is C planes. */
typedef struct ditd__wan_vid {
    int b, T, C;
    ditd__wan_geom g;
} ditd__wan_vid;

/* wan_vae_ops.c: the layers, one chunk at a time */
ditd__wan_vid ditd__wan_grab(ditd_wan_vae *v, int T, int C, const ditd__wan_geom *g);
void ditd__wan_drop(ditd_wan_vae *v, const ditd__wan_vid *x);
void *ditd__wan_frame(const ditd_wan_vae *v, const ditd__wan_vid *x, int t); /* row 0 (halo) */
size_t ditd__wan_ps(const ditd__wan_geom *g);                                /* (rows + 2) W */
ditd__wan_vid ditd__wan_cconv(ditd_wan_vae *v, const wconv *c, wcache *k, ditd__wan_vid *x,
                              int keep_x);
ditd__wan_vid ditd__wan_decoder_chunk(ditd_wan_vae *v, ditd__wan_vid x, int first);
ditd__wan_vid ditd__wan_encoder_chunk(ditd_wan_vae *v, ditd__wan_vid x);
void ditd__wan_reset_coder(wcoder *c);
int ditd__wan_carve_coder(ditd_wan_vae *v, wcoder *c);

/* wan_vae_forward.c */
int ditd__wan_vae_plan(ditd_wan_vae *v);

/* Receives decoded frame f (C, hh, ww) on the host: before unpatchify and
 * the clamp. Returns 0 or an error. */
typedef int (*ditd__wan_frame_sink)(void *ctx, int f, const float *frame, int C, int hh, int ww);

/* Decodes the window [i0, i0 + h) x [j0, j0 + w) of the latent z
 * (z_dim, T, hz, wz) as one clip (the caches cleared first), handing every
 * frame to sink in order. */
int ditd__wan_vae_decode_clip(ditd_wan_vae *v, const float *z, int T, int hz, int wz, int i0,
                              int j0, int h, int w, ditd__wan_frame_sink sink, void *ctx);

/* Rows [y0, y0 + nh) x columns [x0, x0 + nw) of a decoded frame src
 * (out_channels, hh, ww), unpatchified and clamped, into frame f of out
 * (C, F, Ho, Wo) at (y0 p, x0 p). */
void ditd__wan_vae_put_frame(const ditd_wan_vae_config *c, const float *src, int hh, int ww,
                             int y0, int x0, int nh, int nw, float *out, int F, int f, int Ho,
                             int Wo);

/* wan_vae_tiled.c: Diffusers' enable_tiling() */
int ditd__wan_vae_tile_latent(const ditd_wan_vae *v, int width); /* tile_sample_min // ratio */
int ditd__wan_vae_tiled(const ditd_wan_vae *v, int h, int w);    /* decode this latent tiled? */
int ditd__wan_vae_plan_tiles(ditd_wan_vae *v);                   /* host rows of tiles */
int ditd__wan_vae_decode_tiled(ditd_wan_vae *v, const float *z, int T, int h, int w, float *out);

#endif
