/* Inside the AutoencoderKL: the parameter structs and the state shared by
 * autoencoder_kl.c (loading, planning) and vae_forward.c (decode, encode).
 * Not a public header: nothing outside engine/models/vae includes it.
 */
#ifndef DITD_ENGINE_VAE_INTERNAL_H
#define DITD_ENGINE_VAE_INTERNAL_H

#include "engine/core/tensor.h"
#include "engine/models/vae/autoencoder_kl.h"

#define VAE_MAX_RES 17 /* resnets per block: layers_per_block + 1 <= 17 */
#define VAE_GN_EPS 1e-6 /* every GroupNorm of the AutoencoderKL (resnet_eps) */

typedef struct vconv {
    void *w, *b; /* (cout, cin, k, k), (cout) */
    int cin, cout, k;
} vconv;

typedef struct vnorm {
    void *g, *b; /* (C), (C) */
    int C;
} vnorm;

typedef struct vres { /* ResnetBlock2D without time embedding */
    vnorm n1, n2;
    vconv c1, c2, sc; /* sc: conv_shortcut (1x1) when cin != cout */
    int has_sc;
} vres;

typedef struct vattn { /* the mid-block Attention: one head of C */
    vnorm n;
    void *wq, *bq, *wk, *bk, *wv, *bv, *wo, *bo; /* nn.Linear (C, C), (C): run as 1x1 convs */
    int C;
} vattn;

typedef struct vblock { /* UpDecoderBlock2D / DownEncoderBlock2D */
    vres res[VAE_MAX_RES];
    int n_res;
    vconv sample; /* upsamplers.0.conv / downsamplers.0.conv */
    int has_sample;
} vblock;

typedef struct vcoder { /* Encoder or Decoder */
    vconv conv_in;
    vblock blocks[DITD_VAE_MAX_BLOCKS];
    vres mid0, mid1;
    vattn attn;
    vnorm norm_out;
    vconv conv_out;
} vcoder;

struct ditd_vae {
    const ditd_backend_ops *ops;
    ditd_vae_config cfg;
    ditd_vae_opts opts;
    int has_encoder;
    ditd_arena weights, acts;
    vconv quant, post_quant;
    vcoder enc, dec;

    /* the group */
    ditd_comm *comm;
    int rank, P;

    /* activations of one image (band of rows plus a halo row above and below) */
    size_t act_n, scratch_n, halo_n, tok_n, tokfull_n, pack_n;
    void *X, *A, *Hb;          /* three rotating image buffers (act_n) */
    void *scratch;             /* im2col (scratch_n) */
    void *zeros;               /* halo_n zeros (image edges) */
    void *hs0, *hs1, *hr0, *hr1; /* halo send/recv rows (halo_n) */
    void *q, *o;               /* tokens of this band (tok_n) */
    void *k, *v;               /* keys, values of the whole image (tokfull_n) */
    void *pack, *recv;         /* final rows (pack_n) */
    /* host */
    double *h_stats, *h_stats_all; /* (G, 2), (P, G, 2) */
    float *h_mean, *h_rstd;        /* (G) */
    float *h_img;                  /* one image on the host (decode out / encode in) */
    size_t h_img_n;
    float *h_tiles;                /* two rows of decoded tiles (tiling) */
    size_t h_tiles_n;
    int *counts, *displs;          /* (P) */
    int *ub;                       /* (P + 1) first unit of each rank's band, then U */
    int max_units;
    int rows_max;                  /* a band's rows at latent scale, at most */
    int enc_rows_max;              /* the same for the encoder's latent */

    ditd_vae_stats st;
};

/* vae_forward.c */
int ditd__vae_plan_acts(ditd_vae *v);

#endif
