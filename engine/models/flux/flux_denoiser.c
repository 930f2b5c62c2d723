/* FluxTransformer2DModel as a denoiser family: the table the registry hands
 * out. It maps the interface onto engine/models/flux/flux.h (text sequence,
 * pooled vector and guidance from the conditioning rows); the model lives
 * in flux.c and flux_forward.c.
 *
 * Size: the table loads FLUX at FluxPipeline's defaults, a 128x128 latent
 * (1024x1024 pixels) and 512 text tokens (DITD_FLUX_DEFAULT_*); set_size
 * re-plans it for another latent size or text length (docs/flux.md). */
#include <stdio.h>

#include "engine/core/error.h"
#include "engine/models/flux/flux.h"

static int config_at(const char *dir, ditd_flux_config *c)
{
    char path[4200];
    if (snprintf(path, sizeof path, "%s/config.json", dir) >= (int)sizeof path)
        return ditd_err_set(DITD_EINVAL, "path too long: %s", dir);
    return ditd_flux_config_load(path, c);
}

static int flux_shapes(const char *dir, ditd_denoiser_shapes *out)
{
    ditd_flux_config c;
    int err = config_at(dir, &c);
    if (!err)
        ditd_flux_shapes(&c, DITD_FLUX_DEFAULT_LATENT, DITD_FLUX_DEFAULT_LATENT,
                         DITD_FLUX_DEFAULT_TEXT_LEN, out);
    return err;
}

/* step caching: every block (double, then single) under the block hooks;
 * a row of the image stream is this rank's n_loc tokens of D */
static void cache_plan(ditd_flux *m)
{
    m->base.cache_blocks = m->cfg.num_layers + m->cfg.num_single_layers;
    m->base.cache_img_elems = (size_t)m->n_loc * (size_t)m->cfg.inner_dim;
    /* each block and its attn, then proj_out */
    m->base.cache_modules = 2 * m->base.cache_blocks + 1;
}

/* TaylorSeer's modules, in named_modules() order: block b is module 2b, its
 * attn 2b + 1 (b < num_layers: transformer_blocks.b, else
 * single_transformer_blocks.(b - num_layers)), then proj_out. A row's
 * elements on this rank: a block returns both streams ((l_loc + n_loc, D));
 * a double block's attn the image and text outputs of to_out / to_add_out
 * ((n_loc + l_loc, D)); a single block's attn the attention of [text;
 * image] before its proj_out ((l_loc + n_loc, A): this rank's heads under
 * tp); proj_out (n_loc, 4C). */
static int flux_module_name(const ditd_denoiser *d, int id, char *buf, size_t cap, size_t *elems)
{
    const ditd_flux *m = (const ditd_flux *)d;
    int nd = m->cfg.num_layers, b = id / 2;
    size_t tok = (size_t)m->n_loc + (size_t)m->l_loc;
    if (id < 0 || id >= d->cache_modules)
        return DITD_ERANGE;
    if (b >= d->cache_blocks) {
        snprintf(buf, cap, "proj_out");
        *elems = (size_t)m->n_loc * (size_t)m->cfg.out_channels;
        return 0;
    }
    snprintf(buf, cap, "%s.%d%s", b < nd ? "transformer_blocks" : "single_transformer_blocks",
             b < nd ? b : b - nd, id % 2 ? ".attn" : "");
    *elems = tok * (size_t)(id % 2 && b >= nd ? m->A : m->cfg.inner_dim);
    return 0;
}

/* dir's config; the weights from `weights` (a file or dir itself) */
static int flux_load_file(const char *dir, const char *weights, const ditd_backend_ops *ops,
                          int max_batch, const ditd_mesh *mesh, ditd_denoiser **out)
{
    ditd_flux_config c;
    ditd_flux *m;
    int err;
    if ((err = config_at(dir, &c)) ||
        (err = ditd_flux_new_mesh(&c, ops, max_batch, DITD_FLUX_DEFAULT_LATENT,
                                  DITD_FLUX_DEFAULT_LATENT, DITD_FLUX_DEFAULT_TEXT_LEN, weights,
                                  mesh, &m)))
        return err;
    m->base.family = &ditd_flux_family;
    cache_plan(m);
    *out = &m->base;
    return 0;
}

static int flux_load(const char *dir, const ditd_backend_ops *ops, int max_batch,
                     const ditd_mesh *mesh, ditd_denoiser **out)
{
    return flux_load_file(dir, dir, ops, max_batch, mesh, out);
}

static int flux_forward(ditd_denoiser *d, int B, const void *x, const float *t,
                        const ditd_cond *cond, void *out)
{
    ditd_flux *m = (ditd_flux *)d;
    const ditd_cond_shape *s = &cond->shape;
    if (s->kind != DITD_COND_TEXT || s->text_len != m->L ||
        s->text_dim != m->cfg.joint_attention_dim || s->pooled_dim != m->cfg.pooled_dim ||
        !cond->pooled)
        return ditd_err_set(DITD_EINVAL,
                            "FLUX takes text (%d tokens of %d) and a pooled vector of %d, not (%d, %d, %d)",
                            m->L, m->cfg.joint_attention_dim, m->cfg.pooled_dim, s->text_len,
                            s->text_dim, s->pooled_dim);
    return ditd_flux_forward(m, B, x, t, cond->text, cond->pooled,
                             m->cfg.guidance_embeds ? cond->guidance : NULL, out);
}

static int flux_set_size(ditd_denoiser *d, int height, int width, int text_len)
{
    int err = ditd_flux_set_size((ditd_flux *)d, height, width, text_len);
    cache_plan((ditd_flux *)d);
    return err;
}

static int flux_set_reference(ditd_denoiser *d, int ref_height, int ref_width)
{
    int err = ditd_flux_set_reference((ditd_flux *)d, ref_height, ref_width);
    cache_plan((ditd_flux *)d);
    return err;
}

static void flux_free(ditd_denoiser *d)
{
    ditd_flux_free((ditd_flux *)d);
}

const ditd_denoiser_family ditd_flux_family = {
    .class_name = "FluxTransformer2DModel",
    .shapes = flux_shapes,
    .load = flux_load,
    .load_file = flux_load_file,
    .forward = flux_forward,
    .free = flux_free,
    .set_size = flux_set_size,
    .module_name = flux_module_name,
    .set_reference = flux_set_reference,
};
