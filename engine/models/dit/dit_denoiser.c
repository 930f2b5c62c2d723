/* DiTTransformer2DModel as a denoiser family: the table the registry hands
 * out. It maps the interface onto engine/models/dit/dit.h (class ids from the
 * conditioning rows); the model itself lives in dit.c. */
#include <stdio.h>

#include "engine/core/error.h"
#include "engine/models/dit/dit.h"

static int config_at(const char *dir, ditd_dit_config *c)
{
    char path[4200];
    if (snprintf(path, sizeof path, "%s/config.json", dir) >= (int)sizeof path)
        return ditd_err_set(DITD_EINVAL, "path too long: %s", dir);
    return ditd_dit_config_load(path, c);
}

static int dit_shapes(const char *dir, ditd_denoiser_shapes *out)
{
    ditd_dit_config c;
    int err = config_at(dir, &c);
    if (!err)
        ditd_dit_config_shapes(&c, out);
    return err;
}

/* dir's config; the weights from `weights` (a file or dir itself) */
static int dit_load_file(const char *dir, const char *weights, const ditd_backend_ops *ops,
                         int max_batch, const ditd_mesh *mesh, ditd_denoiser **out)
{
    ditd_dit_config c;
    ditd_dit *m;
    int err;
    if ((err = config_at(dir, &c)) ||
        (err = ditd_dit_new_mesh(&c, ops, max_batch, weights, mesh, &m)))
        return err;
    m->base.family = &ditd_dit_family;
    /* step caching: every block under the block hooks; per block three
     * modules (itself, attn1, ff), each (n_loc, D) per row */
    m->base.cache_blocks = c.num_layers;
    m->base.cache_modules = 3 * c.num_layers;
    m->base.cache_img_elems = (size_t)m->n_loc * (size_t)c.inner_dim;
    *out = &m->base;
    return 0;
}

static int dit_load(const char *dir, const ditd_backend_ops *ops, int max_batch,
                    const ditd_mesh *mesh, ditd_denoiser **out)
{
    return dit_load_file(dir, dir, ops, max_batch, mesh, out);
}

static int dit_forward(ditd_denoiser *d, int B, const void *x, const float *t,
                       const ditd_cond *cond, void *out)
{
    return ditd_dit_forward((ditd_dit *)d, B, x, t, cond->class_ids, out);
}

/* Module 3l is transformer_blocks.l, 3l + 1 its attn1, 3l + 2 its ff
 * (Diffusers' BasicTransformerBlock names); each writes (n_loc, D) a row. */
static int dit_module_name(const ditd_denoiser *d, int id, char *buf, size_t cap, size_t *elems)
{
    static const char *const sub[3] = {"", ".attn1", ".ff"};
    if (id < 0 || id >= d->cache_modules)
        return DITD_ERANGE;
    snprintf(buf, cap, "transformer_blocks.%d%s", id / 3, sub[id % 3]);
    *elems = d->cache_img_elems;
    return 0;
}

static void dit_free(ditd_denoiser *d)
{
    ditd_dit_free((ditd_dit *)d);
}

const ditd_denoiser_family ditd_dit_family = {
    .class_name = "DiTTransformer2DModel",
    .shapes = dit_shapes,
    .load = dit_load,
    .load_file = dit_load_file,
    .forward = dit_forward,
    .free = dit_free,
    .module_name = dit_module_name,
};
