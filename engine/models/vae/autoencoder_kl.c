/* AutoencoderKL: parameters by their Diffusers names, loading (safetensors
 * or random), the arena plans, and the small public helpers. The compute is
 * in vae_forward.c.
 */
#include "engine/models/vae/autoencoder_kl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/error.h"
#include "engine/core/philox.h"
#include "engine/io/safetensors.h"
#include "engine/models/vae/vae_internal.h"

/* ---- the parameter list: every tensor with its name, shape and slot ---- */

typedef struct vparam {
    char name[160];
    char alt[160];     /* the deprecated attention name, or "" */
    int ndim;
    int64_t shape[4];
    void **slot;
    int kind;          /* 0 weight, 1 norm gamma, 2 bias / norm beta */
    size_t numel, fan_in;
} vparam;

typedef struct plist {
    vparam *p;
    int n, cap;
    int err;
} plist;

static void add(plist *pl, const char *prefix, const char *leaf, const char *alt_leaf, void **slot,
                int kind, int ndim, int64_t d0, int64_t d1, int64_t d2, int64_t d3)
{
    if (pl->err)
        return;
    if (pl->n == pl->cap) {
        int cap = pl->cap ? 2 * pl->cap : 256;
        vparam *np = realloc(pl->p, (size_t)cap * sizeof *np);
        if (!np) {
            pl->err = ditd_err_set(DITD_ENOMEM, "VAE parameter list");
            return;
        }
        pl->p = np;
        pl->cap = cap;
    }
    vparam *p = &pl->p[pl->n++];
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "%s%s", prefix, leaf);
    if (alt_leaf)
        snprintf(p->alt, sizeof p->alt, "%s%s", prefix, alt_leaf);
    p->ndim = ndim;
    p->shape[0] = d0;
    p->shape[1] = d1;
    p->shape[2] = d2;
    p->shape[3] = d3;
    p->numel = 1;
    for (int i = 0; i < ndim; i++)
        p->numel *= (size_t)p->shape[i];
    p->fan_in = ndim > 1 ? p->numel / (size_t)d0 : 1;
    p->slot = slot;
    p->kind = kind;
}

static void add_conv(plist *pl, const char *prefix, vconv *c, int cin, int cout, int k)
{
    char pre[160];
    c->cin = cin;
    c->cout = cout;
    c->k = k;
    snprintf(pre, sizeof pre, "%s.", prefix);
    add(pl, pre, "weight", NULL, &c->w, 0, 4, cout, cin, k, k);
    add(pl, pre, "bias", NULL, &c->b, 2, 1, cout, 0, 0, 0);
}

static void add_norm(plist *pl, const char *prefix, vnorm *n, int C)
{
    char pre[160];
    n->C = C;
    snprintf(pre, sizeof pre, "%s.", prefix);
    add(pl, pre, "weight", NULL, &n->g, 1, 1, C, 0, 0, 0);
    add(pl, pre, "bias", NULL, &n->b, 2, 1, C, 0, 0, 0);
}

static void add_res(plist *pl, const char *prefix, vres *r, int cin, int cout)
{
    char s[160];
    snprintf(s, sizeof s, "%s.norm1", prefix);
    add_norm(pl, s, &r->n1, cin);
    snprintf(s, sizeof s, "%s.conv1", prefix);
    add_conv(pl, s, &r->c1, cin, cout, 3);
    snprintf(s, sizeof s, "%s.norm2", prefix);
    add_norm(pl, s, &r->n2, cout);
    snprintf(s, sizeof s, "%s.conv2", prefix);
    add_conv(pl, s, &r->c2, cout, cout, 3);
    r->has_sc = cin != cout;
    if (r->has_sc) {
        snprintf(s, sizeof s, "%s.conv_shortcut", prefix);
        add_conv(pl, s, &r->sc, cin, cout, 1);
    }
}

static void add_attn(plist *pl, const char *prefix, vattn *a, int C)
{
    char s[160];
    static const struct {
        const char *leaf, *alt;
    } names[4] = {{"to_q", "query"}, {"to_k", "key"}, {"to_v", "value"}, {"to_out.0", "proj_attn"}};
    void **w[4] = {&a->wq, &a->wk, &a->wv, &a->wo}, **b[4] = {&a->bq, &a->bk, &a->bv, &a->bo};
    a->C = C;
    snprintf(s, sizeof s, "%s.group_norm", prefix);
    add_norm(pl, s, &a->n, C);
    for (int i = 0; i < 4; i++) {
        char pre[160], lw[64], lb[64], aw[64], ab[64];
        snprintf(pre, sizeof pre, "%s.", prefix);
        snprintf(lw, sizeof lw, "%s.weight", names[i].leaf);
        snprintf(lb, sizeof lb, "%s.bias", names[i].leaf);
        snprintf(aw, sizeof aw, "%s.weight", names[i].alt);
        snprintf(ab, sizeof ab, "%s.bias", names[i].alt);
        add(pl, pre, lw, aw, w[i], 0, 2, C, C, 0, 0);
        add(pl, pre, lb, ab, b[i], 2, 1, C, 0, 0, 0);
    }
}

static void add_mid(plist *pl, const char *prefix, vcoder *c, int C, int attn)
{
    char s[160];
    snprintf(s, sizeof s, "%s.mid_block.resnets.0", prefix);
    add_res(pl, s, &c->mid0, C, C);
    if (attn) {
        snprintf(s, sizeof s, "%s.mid_block.attentions.0", prefix);
        add_attn(pl, s, &c->attn, C);
    }
    snprintf(s, sizeof s, "%s.mid_block.resnets.1", prefix);
    add_res(pl, s, &c->mid1, C, C);
}

static void add_decoder(plist *pl, const ditd_vae_config *cfg, vcoder *d)
{
    const int n = cfg->n_blocks, top = cfg->block_out_channels[n - 1];
    char s[160];
    add_conv(pl, "decoder.conv_in", &d->conv_in, cfg->latent_channels, top, 3);
    add_mid(pl, "decoder", d, top, cfg->mid_block_add_attention);
    int prev = top;
    for (int i = 0; i < n; i++) {
        vblock *b = &d->blocks[i];
        int ch = cfg->block_out_channels[n - 1 - i];
        b->n_res = cfg->layers_per_block + 1;
        for (int j = 0; j < b->n_res; j++) {
            snprintf(s, sizeof s, "decoder.up_blocks.%d.resnets.%d", i, j);
            add_res(pl, s, &b->res[j], j == 0 ? prev : ch, ch);
        }
        b->has_sample = i != n - 1;
        if (b->has_sample) {
            snprintf(s, sizeof s, "decoder.up_blocks.%d.upsamplers.0.conv", i);
            add_conv(pl, s, &b->sample, ch, ch, 3);
        }
        prev = ch;
    }
    add_norm(pl, "decoder.conv_norm_out", &d->norm_out, cfg->block_out_channels[0]);
    add_conv(pl, "decoder.conv_out", &d->conv_out, cfg->block_out_channels[0], cfg->out_channels, 3);
}

static void add_encoder(plist *pl, const ditd_vae_config *cfg, vcoder *e)
{
    const int n = cfg->n_blocks, top = cfg->block_out_channels[n - 1];
    char s[160];
    add_conv(pl, "encoder.conv_in", &e->conv_in, cfg->in_channels, cfg->block_out_channels[0], 3);
    int prev = cfg->block_out_channels[0];
    for (int i = 0; i < n; i++) {
        vblock *b = &e->blocks[i];
        int ch = cfg->block_out_channels[i];
        b->n_res = cfg->layers_per_block;
        for (int j = 0; j < b->n_res; j++) {
            snprintf(s, sizeof s, "encoder.down_blocks.%d.resnets.%d", i, j);
            add_res(pl, s, &b->res[j], j == 0 ? prev : ch, ch);
        }
        b->has_sample = i != n - 1;
        if (b->has_sample) {
            snprintf(s, sizeof s, "encoder.down_blocks.%d.downsamplers.0.conv", i);
            add_conv(pl, s, &b->sample, ch, ch, 3);
        }
        prev = ch;
    }
    add_mid(pl, "encoder", e, top, cfg->mid_block_add_attention);
    add_norm(pl, "encoder.conv_norm_out", &e->norm_out, top);
    add_conv(pl, "encoder.conv_out", &e->conv_out, top, 2 * cfg->latent_channels, 3);
}

static void build_params(ditd_vae *v, plist *pl)
{
    const ditd_vae_config *c = &v->cfg;
    memset(pl, 0, sizeof *pl);
    if (c->use_post_quant_conv)
        add_conv(pl, "post_quant_conv", &v->post_quant, c->latent_channels, c->latent_channels, 1);
    add_decoder(pl, c, &v->dec);
    if (v->has_encoder) {
        add_encoder(pl, c, &v->enc);
        if (c->use_quant_conv)
            add_conv(pl, "quant_conv", &v->quant, 2 * c->latent_channels, 2 * c->latent_channels, 1);
    }
}

/* ---- weights ---- */

static int carve_weights(ditd_vae *v, const plist *pl)
{
    int err = 0;
    for (int i = 0; i < pl->n && !err; i++)
        *pl->p[i].slot = ditd_arena_bytes(&v->weights,
                                          pl->p[i].numel * ditd_dtype_size(v->ops->weight_dtype), &err);
    return err;
}

/* The tensor for p: its name, else the deprecated attention name; a linear
 * weight may also be stored as a 1x1 conv (C, C, 1, 1). */
static int read_param(const ditd_safetensors *st, const vparam *p, float *dst)
{
    const char *name = p->name;
    const ditd_st_tensor *t = ditd_safetensors_find(st, name);
    if (!t && p->alt[0] && (t = ditd_safetensors_find(st, p->alt)))
        name = p->alt;
    if (!t)
        return ditd_err_set(DITD_ENOENT, "%s: no tensor %s", ditd_safetensors_count(st) ?
                            ditd_safetensors_at(st, 0)->file : "weights", p->name);
    if (p->ndim == 2 && t->ndim == 4 && t->shape[2] == 1 && t->shape[3] == 1) {
        int64_t sh[4] = {p->shape[0], p->shape[1], 1, 1};
        return ditd_safetensors_read_f32(st, name, 4, sh, dst);
    }
    return ditd_safetensors_read_f32(st, name, p->ndim, p->shape, dst);
}

static int fill_weights(ditd_vae *v, const plist *pl, const ditd_safetensors *st, uint64_t seed)
{
    size_t maxn = 0;
    int err = 0;
    for (int i = 0; i < pl->n; i++)
        if (pl->p[i].numel > maxn)
            maxn = pl->p[i].numel;
    float *stage = malloc(maxn * sizeof *stage);
    if (!stage)
        return ditd_err_set(DITD_ENOMEM, "VAE weight staging (%zu floats)", maxn);
    for (int i = 0; i < pl->n && !err; i++) {
        const vparam *p = &pl->p[i];
        if (st) {
            err = read_param(st, p, stage);
        } else {
            /* random: weights N(0, 1/fan_in), gammas 1 + N(0, 0.01), biases N(0, 0.01) */
            ditd_philox_normal(seed, (uint64_t)i, 0, p->numel, stage);
            float sc = p->kind == 0 ? (float)(1.0 / sqrt((double)p->fan_in)) : 0.1f;
            for (size_t j = 0; j < p->numel; j++)
                stage[j] = stage[j] * sc + (p->kind == 1 ? 1.0f : 0.0f);
        }
        if (!err)
            v->ops->upload_weight(*p->slot, stage, p->numel);
    }
    free(stage);
    return err;
}

static int check_backend(const ditd_backend_ops *ops, const ditd_vae_config *cfg)
{
    int err;
    if (ops->device != DITD_DEVICE_CPU)
        return ditd_err_set(DITD_EUNSUPPORTED,
                            "the VAE runs on the cpu backend for now (the %s backend has its image "
                            "kernels, not yet the mid-block attention's head of 512 or the decode's "
                            "collectives on device memory)",
                            ops->name);
    if (!ops->conv2d || !ops->groupnorm_stats || !ops->groupnorm_apply || !ops->upsample_nearest2x ||
        !ops->planes_to_tokens || !ops->tokens_to_planes)
        return ditd_err_set(DITD_EUNSUPPORTED, "the %s backend has no VAE kernels yet", ops->name);
    if (cfg->mid_block_add_attention &&
        (err = ditd_backend_check_head_dim(ops, cfg->block_out_channels[cfg->n_blocks - 1],
                                           "the mid-block attention's head (block_out_channels[-1])")))
        return err;
    return 0;
}

static int vae_build(const ditd_vae_config *cfg, const ditd_backend_ops *ops,
                     const ditd_vae_opts *opts, const ditd_safetensors *st, uint64_t seed,
                     ditd_vae **out)
{
    ditd_vae *v;
    plist pl;
    int err;

    *out = NULL;
    if ((err = check_backend(ops, cfg)))
        return err;
    if (opts->max_h < 1 || opts->max_w < 1 || opts->max_h > 16384 || opts->max_w > 16384)
        return ditd_err_set(DITD_EINVAL, "VAE: largest latent %d x %d", opts->max_h, opts->max_w);
    if (opts->max_image_h < 0 || opts->max_image_w < 0 || opts->max_image_h > 65536 ||
        opts->max_image_w > 65536)
        return ditd_err_set(DITD_EINVAL, "VAE: largest image %d x %d", opts->max_image_h,
                            opts->max_image_w);
    if (!(v = calloc(1, sizeof *v)))
        return ditd_err_set(DITD_ENOMEM, "VAE");
    v->ops = ops;
    v->cfg = *cfg;
    v->opts = *opts;
    v->has_encoder = opts->max_image_h > 0 && opts->max_image_w > 0;
    v->comm = opts->comm;
    v->rank = v->comm ? ditd_comm_rank(v->comm) : 0;
    v->P = v->comm ? ditd_comm_size(v->comm) : 1;
    ditd_arena_init_mem(&v->weights, ops->mem_alloc, ops->mem_free);
    ditd_arena_init_mem(&v->acts, ops->mem_alloc, ops->mem_free);
    build_params(v, &pl);
    if ((err = pl.err))
        goto fail;
    if ((err = carve_weights(v, &pl)) ||
        (err = ditd_arena_commit(&v->weights, v->weights.peak_plan ? v->weights.peak_plan
                                                                  : v->weights.used)))
        goto fail;
    ditd_arena_reset(&v->weights);
    if ((err = carve_weights(v, &pl)) || (err = fill_weights(v, &pl, st, seed)) ||
        (err = ditd__vae_plan_acts(v)))
        goto fail;
    free(pl.p);
    *out = v;
    return 0;
fail:
    free(pl.p);
    ditd_vae_free(v);
    return err;
}

int ditd_vae_load(const char *dir, const ditd_backend_ops *ops, const ditd_vae_opts *opts,
                  ditd_vae **out)
{
    char path[4200];
    ditd_vae_config cfg;
    ditd_safetensors *st = NULL;
    int err;

    *out = NULL;
    if (snprintf(path, sizeof path, "%s/config.json", dir) >= (int)sizeof path)
        return ditd_err_set(DITD_EINVAL, "path too long: %s", dir);
    if ((err = ditd_vae_config_load(path, &cfg)))
        return err;
    if ((err = ditd_safetensors_open(dir, &st)))
        return err;
    err = vae_build(&cfg, ops, opts, st, 0, out);
    ditd_safetensors_free(st);
    return err;
}

int ditd_vae_new_random(const ditd_vae_config *cfg, const ditd_backend_ops *ops,
                        const ditd_vae_opts *opts, uint64_t seed, ditd_vae **out)
{
    ditd_vae_config c = *cfg;
    int err = ditd_vae_config_finish(&c, "VAE config");
    if (err)
        return err;
    return vae_build(&c, ops, opts, NULL, seed, out);
}

void ditd_vae_free(ditd_vae *v)
{
    if (!v)
        return;
    ditd_arena_free(&v->weights);
    ditd_arena_free(&v->acts);
    free(v->h_stats);
    free(v->h_stats_all);
    free(v->h_mean);
    free(v->h_rstd);
    free(v->h_img);
    free(v->h_tiles);
    free(v->counts);
    free(v->displs);
    free(v->ub);
    free(v);
}

const ditd_vae_config *ditd_vae_config_of(const ditd_vae *v)
{
    return &v->cfg;
}

void ditd_vae_unscale_dit(const ditd_vae_config *c, float *latents, size_t n)
{
    /* 1 / scaling_factor * latents: the Python float, then a float32 multiply */
    const float inv = (float)(1.0 / c->scaling_factor);
    for (size_t i = 0; i < n; i++)
        latents[i] = inv * latents[i];
}

void ditd_vae_unscale_shifted(const ditd_vae_config *c, float *latents, size_t n)
{
    const float sf = (float)c->scaling_factor;
    const float shift = c->has_shift_factor ? (float)c->shift_factor : 0.0f;
    for (size_t i = 0; i < n; i++)
        latents[i] = latents[i] / sf + shift;
}

void ditd_vae_scale_shifted(const ditd_vae_config *c, float *latents, size_t n)
{
    const float sf = (float)c->scaling_factor;
    const float shift = c->has_shift_factor ? (float)c->shift_factor : 0.0f;
    for (size_t i = 0; i < n; i++)
        latents[i] = (latents[i] - shift) * sf;
}

ditd_vae_stats ditd_vae_last_stats(const ditd_vae *v)
{
    return v->st;
}

const ditd_vae_family ditd_autoencoder_kl_family = {
    .class_name = "AutoencoderKL",
    .config_load = ditd_vae_config_load,
    .load = ditd_vae_load,
};
