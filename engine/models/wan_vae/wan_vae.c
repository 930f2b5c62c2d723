/* AutoencoderKLWan: parameters by their Diffusers names, loading from
 * safetensors, the family tables, and the small public helpers. The
 * compute and the activation plan are in wan_vae_forward.c.
 */
#include "engine/models/wan_vae/wan_vae.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/error.h"
#include "engine/io/safetensors.h"
#include "engine/models/wan_vae/wan_vae_state.h"

/* ---- the parameter list: every tensor with its name, shape and slot ---- */

typedef struct wparam {
    char name[160];
    int ndim;
    int64_t shape[5];
    void **slot;
    size_t numel;
} wparam;

typedef struct plist {
    wparam *p;
    int n, cap, err;
} plist;

static void add(plist *pl, const char *prefix, const char *leaf, void **slot, int ndim,
                const int64_t *shape)
{
    if (pl->err)
        return;
    if (pl->n == pl->cap) {
        int cap = pl->cap ? 2 * pl->cap : 256;
        wparam *np = realloc(pl->p, (size_t)cap * sizeof *np);
        if (!np) {
            pl->err = ditd_err_set(DITD_ENOMEM, "Wan VAE parameter list");
            return;
        }
        pl->p = np;
        pl->cap = cap;
    }
    wparam *p = &pl->p[pl->n++];
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "%s.%s", prefix, leaf);
    p->ndim = ndim;
    p->numel = 1;
    for (int i = 0; i < ndim; i++) {
        p->shape[i] = shape[i];
        p->numel *= (size_t)shape[i];
    }
    p->slot = slot;
}

/* A WanCausalConv3d (kt >= 1: weight (cout, cin, kt, k, k)) or an nn.Conv2d
 * (kt = 0: weight (cout, cin, k, k)). */
static void add_conv(plist *pl, const char *prefix, wconv *c, int cin, int cout, int kt, int k)
{
    c->cin = cin;
    c->cout = cout;
    c->kt = kt;
    c->k = k;
    int64_t w3[5] = {cout, cin, kt, k, k}, w2[4] = {cout, cin, k, k}, b[1] = {cout};
    if (kt)
        add(pl, prefix, "weight", &c->w, 5, w3);
    else
        add(pl, prefix, "weight", &c->w, 4, w2);
    add(pl, prefix, "bias", &c->b, 1, b);
}

/* WanRMS_norm gamma: (C, 1, 1, 1) for video (images=False), (C, 1, 1) for images. */
static void add_gamma(plist *pl, const char *prefix, void **slot, int C, int images)
{
    int64_t sh[4] = {C, 1, 1, 1};
    add(pl, prefix, "gamma", slot, images ? 3 : 4, sh);
}

static void add_res(plist *pl, const char *prefix, wres *r, int cin, int cout)
{
    char s[160];
    r->cin = cin;
    r->cout = cout;
    snprintf(s, sizeof s, "%s.norm1", prefix);
    add_gamma(pl, s, &r->g1, cin, 0);
    snprintf(s, sizeof s, "%s.conv1", prefix);
    add_conv(pl, s, &r->c1, cin, cout, 3, 3);
    snprintf(s, sizeof s, "%s.norm2", prefix);
    add_gamma(pl, s, &r->g2, cout, 0);
    snprintf(s, sizeof s, "%s.conv2", prefix);
    add_conv(pl, s, &r->c2, cout, cout, 3, 3);
    r->has_sc = cin != cout;
    if (r->has_sc) {
        snprintf(s, sizeof s, "%s.conv_shortcut", prefix);
        add_conv(pl, s, &r->sc, cin, cout, 1, 1);
    }
}

static void add_mid(plist *pl, const char *prefix, wcoder *c, int C)
{
    char s[160];
    snprintf(s, sizeof s, "%s.mid_block.resnets.0", prefix);
    add_res(pl, s, &c->mid0, C, C);
    c->attn.C = C;
    snprintf(s, sizeof s, "%s.mid_block.attentions.0.norm", prefix);
    add_gamma(pl, s, &c->attn.g, C, 1);
    snprintf(s, sizeof s, "%s.mid_block.attentions.0.to_qkv", prefix);
    add_conv(pl, s, &c->attn.qkv, C, 3 * C, 0, 1);
    snprintf(s, sizeof s, "%s.mid_block.attentions.0.proj", prefix);
    add_conv(pl, s, &c->attn.proj, C, C, 0, 1);
    snprintf(s, sizeof s, "%s.mid_block.resnets.1", prefix);
    add_res(pl, s, &c->mid1, C, C);
}

/* WanResample's parameters under `prefix` (…resample.1, …time_conv). */
static void add_sample(plist *pl, const char *prefix, wsample *rs, int mode, int dim, int up_out)
{
    char s[160];
    rs->mode = mode;
    snprintf(s, sizeof s, "%s.resample.1", prefix);
    if (mode == WS_UP2D || mode == WS_UP3D)
        add_conv(pl, s, &rs->conv, dim, up_out, 0, 3);
    else
        add_conv(pl, s, &rs->conv, dim, dim, 0, 3);
    snprintf(s, sizeof s, "%s.time_conv", prefix);
    if (mode == WS_UP3D)
        add_conv(pl, s, &rs->time, dim, 2 * dim, 3, 1);
    else if (mode == WS_DOWN3D)
        add_conv(pl, s, &rs->time, dim, dim, 3, 1);
}

static void add_encoder(plist *pl, const ditd_wan_vae_config *c, wcoder *e)
{
    const int n = c->n_mult, d = c->base_dim;
    char s[160];
    int flat = 0; /* Wan 2.1: one flat list of layers */
    add_conv(pl, "encoder.conv_in", &e->conv_in, c->in_channels, d, 3, 3);
    e->n_blocks = n;
    int in = d;
    for (int i = 0; i < n; i++) {
        wblock *b = &e->blocks[i];
        const int out = d * c->dim_mult[i], down = i != n - 1;
        const int mode = !down ? WS_NONE : c->temperal_downsample[i] ? WS_DOWN3D : WS_DOWN2D;
        b->n_res = c->num_res_blocks;
        for (int j = 0; j < b->n_res; j++) {
            if (c->is_residual)
                snprintf(s, sizeof s, "encoder.down_blocks.%d.resnets.%d", i, j);
            else
                snprintf(s, sizeof s, "encoder.down_blocks.%d", flat++);
            add_res(pl, s, &b->res[j], j == 0 ? in : out, out);
        }
        if (mode != WS_NONE) {
            if (c->is_residual)
                snprintf(s, sizeof s, "encoder.down_blocks.%d.downsampler", i);
            else
                snprintf(s, sizeof s, "encoder.down_blocks.%d", flat++);
            add_sample(pl, s, &b->rs, mode, out, out);
        }
        if (c->is_residual) { /* AvgDown3D(in, out, factor_t, factor_s) around the block */
            b->shortcut = 1;
            b->sc_in = in;
            b->sc_out = out;
            b->sc_ft = mode == WS_DOWN3D ? 2 : 1;
            b->sc_fs = down ? 2 : 1;
        }
        in = out;
    }
    add_mid(pl, "encoder", e, in);
    e->norm_C = in;
    add_gamma(pl, "encoder.norm_out", &e->norm_out, in, 0);
    add_conv(pl, "encoder.conv_out", &e->conv_out, in, 2 * c->z_dim, 3, 3);
}

static void add_decoder(plist *pl, const ditd_wan_vae_config *c, wcoder *dc)
{
    const int n = c->n_mult, d = c->decoder_base_dim;
    int dims[DITD_WAN_VAE_MAX_BLOCKS + 1];
    char s[160];
    dims[0] = d * c->dim_mult[n - 1];
    for (int i = 0; i < n; i++)
        dims[i + 1] = d * c->dim_mult[n - 1 - i];
    add_conv(pl, "decoder.conv_in", &dc->conv_in, c->z_dim, dims[0], 3, 3);
    add_mid(pl, "decoder", dc, dims[0]);
    dc->n_blocks = n;
    for (int i = 0; i < n; i++) {
        wblock *b = &dc->blocks[i];
        int in = dims[i];
        const int out = dims[i + 1], up = i != n - 1;
        /* temperal_upsample = temperal_downsample[::-1] */
        const int tup = up && c->temperal_downsample[n - 2 - i];
        const int mode = !up ? WS_NONE : tup ? WS_UP3D : WS_UP2D;
        if (i > 0 && !c->is_residual)
            in = in / 2; /* Wan 2.1: the upsampler before halved the width */
        b->n_res = c->num_res_blocks + 1;
        for (int j = 0; j < b->n_res; j++) {
            snprintf(s, sizeof s, "decoder.up_blocks.%d.resnets.%d", i, j);
            add_res(pl, s, &b->res[j], j == 0 ? in : out, out);
        }
        if (mode != WS_NONE) {
            if (c->is_residual)
                snprintf(s, sizeof s, "decoder.up_blocks.%d.upsampler", i);
            else
                snprintf(s, sizeof s, "decoder.up_blocks.%d.upsamplers.0", i);
            add_sample(pl, s, &b->rs, mode, out, c->is_residual ? out : out / 2);
        }
        if (c->is_residual && up) { /* DupUp3D(in, out, factor_t, 2) around the block */
            b->shortcut = 1;
            b->sc_in = in;
            b->sc_out = out;
            b->sc_ft = tup ? 2 : 1;
            b->sc_fs = 2;
        }
    }
    dc->norm_C = dims[n];
    add_gamma(pl, "decoder.norm_out", &dc->norm_out, dims[n], 0);
    add_conv(pl, "decoder.conv_out", &dc->conv_out, dims[n], c->out_channels, 3, 3);
}

static void build_params(ditd_wan_vae *v, plist *pl)
{
    const ditd_wan_vae_config *c = &v->cfg;
    memset(pl, 0, sizeof *pl);
    if (v->has_enc) {
        add_encoder(pl, c, &v->enc);
        add_conv(pl, "quant_conv", &v->quant, 2 * c->z_dim, 2 * c->z_dim, 1, 1);
    }
    if (v->has_dec) {
        add_conv(pl, "post_quant_conv", &v->post_quant, c->z_dim, c->z_dim, 1, 1);
        add_decoder(pl, c, &v->dec);
    }
}

/* ---- weights ---- */

static int carve_weights(ditd_wan_vae *v, const plist *pl)
{
    int err = 0;
    for (int i = 0; i < pl->n && !err; i++)
        *pl->p[i].slot = ditd_arena_bytes(&v->weights,
                                          pl->p[i].numel * ditd_dtype_size(v->ops->weight_dtype), &err);
    return err;
}

static int fill_weights(ditd_wan_vae *v, const plist *pl, const ditd_safetensors *st)
{
    size_t maxn = 0;
    int err = 0;
    for (int i = 0; i < pl->n; i++)
        maxn = pl->p[i].numel > maxn ? pl->p[i].numel : maxn;
    float *stage = malloc(maxn * sizeof *stage);
    if (!stage)
        return ditd_err_set(DITD_ENOMEM, "Wan VAE weight staging (%zu floats)", maxn);
    for (int i = 0; i < pl->n && !err; i++) {
        const wparam *p = &pl->p[i];
        if (!ditd_safetensors_find(st, p->name))
            err = ditd_err_set(DITD_ENOENT, "%s: no tensor %s",
                               ditd_safetensors_count(st) ? ditd_safetensors_at(st, 0)->file
                                                          : "weights",
                               p->name);
        else
            err = ditd_safetensors_read_f32(st, p->name, p->ndim, p->shape, stage);
        if (!err)
            v->ops->upload_weight(*p->slot, stage, p->numel);
    }
    free(stage);
    return err;
}

static int check_backend(const ditd_backend_ops *ops)
{
    if (ops->device != DITD_DEVICE_CPU || ops->weight_dtype != DITD_DTYPE_F32)
        return ditd_err_set(DITD_EUNSUPPORTED,
                            "the Wan VAE runs on the cpu backend with f32 weights for now (the %s "
                            "backend has its conv3d kernels, not yet the mid-block attention's "
                            "head of 384 or more)",
                            ops->name);
    if (!ops->conv3d_frame || !ops->rmsnorm_channels || !ops->avgdown3d_frame ||
        !ops->dupup3d_frame || !ops->conv2d || !ops->upsample_nearest2x ||
        !ops->planes_to_tokens || !ops->tokens_to_planes || !ops->attention_masked)
        return ditd_err_set(DITD_EUNSUPPORTED, "the %s backend has no Wan VAE kernels yet",
                            ops->name);
    return 0;
}

int ditd_wan_vae_load(const char *dir, const ditd_backend_ops *ops, const ditd_wan_vae_opts *opts,
                      ditd_wan_vae **out)
{
    char path[4200];
    ditd_wan_vae *v = NULL;
    ditd_safetensors *st = NULL;
    plist pl = {0};
    int err;

    *out = NULL;
    if ((err = check_backend(ops)))
        return err;
    if (opts->max_h < 0 || opts->max_w < 0 || opts->max_h > 4096 || opts->max_w > 4096 ||
        (opts->max_h > 0) != (opts->max_w > 0))
        return ditd_err_set(DITD_EINVAL, "Wan VAE: largest latent %d x %d", opts->max_h, opts->max_w);
    if (opts->max_video_h < 0 || opts->max_video_w < 0 || opts->max_video_h > 32768 ||
        opts->max_video_w > 32768 || (opts->max_video_h > 0) != (opts->max_video_w > 0))
        return ditd_err_set(DITD_EINVAL, "Wan VAE: largest video %d x %d", opts->max_video_h,
                            opts->max_video_w);
    if (!opts->max_h && !opts->max_video_h)
        return ditd_err_set(DITD_EINVAL, "Wan VAE: neither a latent nor a video size to plan for");
    if (snprintf(path, sizeof path, "%s/config.json", dir) >= (int)sizeof path)
        return ditd_err_set(DITD_EINVAL, "path too long: %s", dir);
    if (!(v = calloc(1, sizeof *v)))
        return ditd_err_set(DITD_ENOMEM, "Wan VAE");
    v->ops = ops;
    v->opts = *opts;
    v->comm = opts->comm;
    v->has_dec = opts->max_h > 0;
    v->has_enc = opts->max_video_h > 0;
    ditd_arena_init_mem(&v->weights, ops->mem_alloc, ops->mem_free);
    ditd_arena_init_mem(&v->acts, ops->mem_alloc, ops->mem_free);
    if ((err = ditd_wan_vae_config_load(path, &v->cfg)))
        goto fail;
    if (v->has_enc && v->cfg.is_residual) {
        const int f = ditd_wan_vae_config_scale_factor(&v->cfg);
        if (opts->max_video_h % f || opts->max_video_w % f) {
            err = ditd_err_set(DITD_EINVAL,
                               "Wan VAE: largest video %d x %d is not a multiple of the scale "
                               "factor %d (the residual encoder's AvgDown3D needs it)",
                               opts->max_video_h, opts->max_video_w, f);
            goto fail;
        }
    }
    if ((err = ditd_safetensors_open(dir, &st)))
        goto fail;
    build_params(v, &pl);
    if ((err = pl.err) || (err = carve_weights(v, &pl)) ||
        (err = ditd_arena_commit(&v->weights, v->weights.peak_plan ? v->weights.peak_plan
                                                                  : v->weights.used)))
        goto fail;
    ditd_arena_reset(&v->weights);
    /* the largest latent one decode takes: the whole one, or a tile at most */
    v->dec_h = v->opts.max_h;
    v->dec_w = v->opts.max_w;
    if (v->opts.tiling) {
        int th = ditd__wan_vae_tile_latent(v, 0), tw = ditd__wan_vae_tile_latent(v, 1);
        v->dec_h = v->dec_h < th ? v->dec_h : th;
        v->dec_w = v->dec_w < tw ? v->dec_w : tw;
    }
    if ((err = carve_weights(v, &pl)) || (err = fill_weights(v, &pl, st)) ||
        (err = ditd__wan_vae_plan(v)) ||
        (v->has_dec && v->opts.tiling && (err = ditd__wan_vae_plan_tiles(v))))
        goto fail;
    free(pl.p);
    ditd_safetensors_free(st);
    *out = v;
    return 0;
fail:
    free(pl.p);
    ditd_safetensors_free(st);
    ditd_wan_vae_free(v);
    return err;
}

void ditd_wan_vae_free(ditd_wan_vae *v)
{
    if (!v)
        return;
    ditd_arena_free(&v->weights);
    ditd_arena_free(&v->acts);
    free(v->h_frame);
    free(v->h_tiles);
    free(v->ub);
    free(v->counts);
    free(v->displs);
    free(v);
}

const ditd_wan_vae_config *ditd_wan_vae_config_of(const ditd_wan_vae *v)
{
    return &v->cfg;
}

void ditd_wan_vae_unscale(const ditd_wan_vae_config *c, float *latents, int B, size_t n_per_channel)
{
    for (int b = 0; b < B; b++)
        for (int ch = 0; ch < c->z_dim; ch++) {
            /* latents_std = 1.0 / tensor(std) (float32), then latents / latents_std + mean */
            const float inv = 1.0f / (float)c->latents_std[ch], mean = (float)c->latents_mean[ch];
            float *p = latents + ((size_t)b * c->z_dim + ch) * n_per_channel;
            for (size_t i = 0; i < n_per_channel; i++)
                p[i] = p[i] / inv + mean;
        }
}

void ditd_wan_vae_scale(const ditd_wan_vae_config *c, float *latents, int B, size_t n_per_channel)
{
    for (int b = 0; b < B; b++)
        for (int ch = 0; ch < c->z_dim; ch++) {
            const float inv = 1.0f / (float)c->latents_std[ch], mean = (float)c->latents_mean[ch];
            float *p = latents + ((size_t)b * c->z_dim + ch) * n_per_channel;
            for (size_t i = 0; i < n_per_channel; i++)
                p[i] = (p[i] - mean) * inv;
        }
}

/* ---- the tables ---- */

static int image_load_refused(const char *dir, const ditd_backend_ops *ops,
                              const ditd_vae_opts *opts, ditd_vae **out)
{
    (void)ops;
    (void)opts;
    *out = NULL;
    return ditd_err_set(DITD_EUNSUPPORTED,
                        "%s: AutoencoderKLWan is a video VAE: it decodes frames through its "
                        "family's .video entry points (ditd_wan_vae_load), not as an image VAE",
                        dir);
}

static const ditd_video_vae_family wan_video = {
    .config_load = ditd_wan_vae_config_load,
    .load = ditd_wan_vae_load,
    .decode = ditd_wan_vae_decode,
    .encode = ditd_wan_vae_encode,
    .free = ditd_wan_vae_free,
};

const ditd_vae_family ditd_autoencoder_kl_wan_family = {
    .class_name = "AutoencoderKLWan",
    .config_load = ditd_wan_vae_config_summary,
    .load = image_load_refused,
    .video = &wan_video,
};
