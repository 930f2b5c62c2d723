/* SD3Transformer2DModel as a denoiser family: the table the registry hands
 * out. It maps the interface onto engine/models/sd3/sd3.h (text sequence
 * and pooled vector from the conditioning rows, the forward's skip-layer
 * list from ditd_cond.skip_layers); the model lives in sd3.c and
 * sd3_forward.c.
 *
 * Size: the table loads SD3 at the config's sample_size (128 for SD3 and
 * SD3.5: 1024x1024 pixels) and StableDiffusion3Pipeline's 77 + 256 text
 * tokens (DITD_SD3_DEFAULT_TEXT_LEN); set_size re-plans it for another
 * latent size or text length (docs/sd3.md). */
#include <stdio.h>

#include "engine/core/error.h"
#include "engine/models/sd3/sd3.h"

static int config_at(const char *dir, ditd_sd3_config *c)
{
    char path[4200];
    if (snprintf(path, sizeof path, "%s/config.json", dir) >= (int)sizeof path)
        return ditd_err_set(DITD_EINVAL, "path too long: %s", dir);
    return ditd_sd3_config_load(path, c);
}

/* The default latent size: sample_size, as a multiple of patch_size within
 * the positional table. */
static int default_latent(const ditd_sd3_config *c)
{
    int p = c->patch_size, s = c->sample_size / p * p, lim = c->pos_embed_max_size * p;
    return s < lim ? s : lim;
}

static int sd3_shapes(const char *dir, ditd_denoiser_shapes *out)
{
    ditd_sd3_config c;
    int err = config_at(dir, &c);
    if (!err)
        ditd_sd3_shapes(&c, default_latent(&c), default_latent(&c), DITD_SD3_DEFAULT_TEXT_LEN,
                        out);
    return err;
}

/* step caching: the joint blocks under the block hooks; a row of the image
 * stream is this rank's n_loc tokens of D. TaylorSeer's modules: each
 * block, its attn, its ff and (but the last, context_pre_only block)
 * ff_context. */
static void cache_plan(ditd_sd3 *m)
{
    m->base.cache_blocks = m->cfg.num_layers;
    m->base.cache_modules = 4 * m->cfg.num_layers - 1;
    m->base.cache_img_elems = (size_t)m->n_loc * (size_t)m->cfg.inner_dim;
}

/* In named_modules() order, block l's modules are 4l transformer_blocks.l
 * (it returns both streams, (l_loc + n_loc, D) a row), 4l + 1 its attn (the
 * image and text outputs of to_out / to_add_out, the same size), 4l + 2 its
 * ff ((n_loc, D)) and 4l + 3 its ff_context ((l_loc, D); a cp rank without
 * text tokens never runs it and plans one token's room, as 0 would mean a
 * module that can only be skip-predicted). The last block is
 * context_pre_only: its text output is None (the block) or read by nothing
 * (attn), so only its image output is kept: (n_loc, D). */
static int sd3_module_name(const ditd_denoiser *d, int id, char *buf, size_t cap, size_t *elems)
{
    static const char *const sub[4] = {"", ".attn", ".ff", ".ff_context"};
    const ditd_sd3 *m = (const ditd_sd3 *)d;
    int l = id / 4, k = id % 4, last = l == m->cfg.num_layers - 1;
    size_t D = (size_t)m->cfg.inner_dim;
    if (id < 0 || id >= d->cache_modules)
        return DITD_ERANGE;
    snprintf(buf, cap, "transformer_blocks.%d%s", l, sub[k]);
    if (k == 3)
        *elems = (size_t)(m->l_loc > 0 ? m->l_loc : 1) * D;
    else if (k == 2 || last)
        *elems = d->cache_img_elems;
    else
        *elems = ((size_t)m->n_loc + (size_t)m->l_loc) * D;
    return 0;
}

/* dir gives config.json; the weights come from `weights` (a .gguf or
 * .safetensors file, --transformer-file) or dir itself. */
static int sd3_load_file(const char *dir, const char *weights, const ditd_backend_ops *ops,
                         int max_batch, const ditd_mesh *mesh, ditd_denoiser **out)
{
    ditd_sd3_config c;
    ditd_sd3 *m;
    int err;
    if ((err = config_at(dir, &c)) ||
        (err = ditd_sd3_new_mesh(&c, ops, max_batch, default_latent(&c), default_latent(&c),
                                 DITD_SD3_DEFAULT_TEXT_LEN, weights, mesh, &m)))
        return err;
    m->base.family = &ditd_sd3_family;
    cache_plan(m);
    *out = &m->base;
    return 0;
}

static int sd3_load(const char *dir, const ditd_backend_ops *ops, int max_batch,
                    const ditd_mesh *mesh, ditd_denoiser **out)
{
    return sd3_load_file(dir, dir, ops, max_batch, mesh, out);
}

static int sd3_forward(ditd_denoiser *d, int B, const void *x, const float *t,
                       const ditd_cond *cond, void *out)
{
    ditd_sd3 *m = (ditd_sd3 *)d;
    const ditd_cond_shape *s = &cond->shape;
    if (s->kind != DITD_COND_TEXT || s->text_len != m->L ||
        s->text_dim != m->cfg.joint_attention_dim || s->pooled_dim != m->cfg.pooled_dim ||
        !cond->pooled)
        return ditd_err_set(DITD_EINVAL,
                            "SD3 takes text (%d tokens of %d) and a pooled vector of %d, not (%d, %d, %d)",
                            m->L, m->cfg.joint_attention_dim, m->cfg.pooled_dim, s->text_len,
                            s->text_dim, s->pooled_dim);
    return ditd_sd3_forward(m, B, x, t, cond->text, cond->pooled, cond->skip_layers,
                            cond->n_skip_layers, out);
}

static int sd3_set_size(ditd_denoiser *d, int height, int width, int text_len)
{
    int err = ditd_sd3_set_size((ditd_sd3 *)d, height, width, text_len);
    cache_plan((ditd_sd3 *)d);
    return err;
}

static void sd3_free(ditd_denoiser *d)
{
    ditd_sd3_free((ditd_sd3 *)d);
}

const ditd_denoiser_family ditd_sd3_family = {
    .class_name = "SD3Transformer2DModel",
    .shapes = sd3_shapes,
    .load = sd3_load,
    .load_file = sd3_load_file,
    .forward = sd3_forward,
    .free = sd3_free,
    .set_size = sd3_set_size,
    .module_name = sd3_module_name,
};
