/* WanTransformer3DModel as a denoiser family: the table the registry hands
 * out. It maps the interface onto engine/models/wan/wan.h (the text
 * sequence from the conditioning rows, per-frame timesteps from
 * cond->t_frames when the pipeline gives them); the model lives in wan.c
 * and wan_forward.c.
 *
 * Size: the table loads Wan at WanPipeline's Wan 2.1 defaults, 21 latent
 * frames of 60x104 (81 frames of 480x832) and 512 text tokens
 * (DITD_WAN_DEFAULT_*); set_video_size re-plans it for another clip or text
 * length, set_size for another frame size at the same frame count
 * (docs/wan.md). */
#include <stdio.h>

#include "engine/core/error.h"
#include "engine/models/wan/wan.h"

static int config_at(const char *dir, ditd_wan_config *c)
{
    char path[4200];
    if (snprintf(path, sizeof path, "%s/config.json", dir) >= (int)sizeof path)
        return ditd_err_set(DITD_EINVAL, "path too long: %s", dir);
    return ditd_wan_config_load(path, c);
}

static int wan_shapes(const char *dir, ditd_denoiser_shapes *out)
{
    ditd_wan_config c;
    int err = config_at(dir, &c);
    if (!err)
        ditd_wan_shapes(&c, DITD_WAN_DEFAULT_FRAMES, DITD_WAN_DEFAULT_HEIGHT,
                        DITD_WAN_DEFAULT_WIDTH, DITD_WAN_DEFAULT_TEXT_LEN, out);
    return err;
}

/* step caching: the blocks under the block hooks (Diffusers' hooks find
 * the ModuleList `blocks`: head blocks.0, tail blocks.-1; a WanTransformerBlock
 * returns the video stream only); a row of it is this rank's n_loc tokens
 * of D. Per block four modules for TaylorSeer (the block, attn1, attn2,
 * ffn), each (n_loc, D) per row, then proj_out. */
static void cache_plan(ditd_wan *m)
{
    m->base.cache_blocks = m->cfg.num_layers;
    m->base.cache_modules = 4 * m->cfg.num_layers + 1;
    m->base.cache_img_elems = (size_t)m->n_loc * (size_t)m->cfg.inner_dim;
}

/* Module 4l is blocks.l, 4l + 1 its attn1, 4l + 2 attn2, 4l + 3 ffn
 * (WanTransformerBlock's names in named_modules()); the last proj_out
 * ((n_loc, p p Co) a row; the lite mode predicts it) */
static int wan_module_name(const ditd_denoiser *d, int id, char *buf, size_t cap, size_t *elems)
{
    static const char *const sub[4] = {"", ".attn1", ".attn2", ".ffn"};
    const ditd_wan *m = (const ditd_wan *)d;
    if (id < 0 || id >= d->cache_modules)
        return DITD_ERANGE;
    if (id == 4 * m->cfg.num_layers) {
        snprintf(buf, cap, "proj_out");
        *elems = (size_t)m->n_loc * (size_t)m->cfg.patch_h * (size_t)m->cfg.patch_w *
                 (size_t)m->cfg.out_channels;
        return 0;
    }
    snprintf(buf, cap, "blocks.%d%s", id / 4, sub[id % 4]);
    *elems = d->cache_img_elems;
    return 0;
}

/* dir gives config.json; the weights come from `weights` (a .gguf or
 * .safetensors file, --transformer-file) or dir itself. */
static int wan_load_file(const char *dir, const char *weights, const ditd_backend_ops *ops,
                         int max_batch, const ditd_mesh *mesh, ditd_denoiser **out)
{
    ditd_wan_config c;
    ditd_wan *m;
    int err;
    if ((err = config_at(dir, &c)) ||
        (err = ditd_wan_new_mesh(&c, ops, max_batch, DITD_WAN_DEFAULT_FRAMES,
                                 DITD_WAN_DEFAULT_HEIGHT, DITD_WAN_DEFAULT_WIDTH,
                                 DITD_WAN_DEFAULT_TEXT_LEN, weights, mesh, &m)))
        return err;
    m->base.family = &ditd_wan_family;
    cache_plan(m);
    *out = &m->base;
    return 0;
}

static int wan_load(const char *dir, const ditd_backend_ops *ops, int max_batch,
                    const ditd_mesh *mesh, ditd_denoiser **out)
{
    return wan_load_file(dir, dir, ops, max_batch, mesh, out);
}

static int wan_forward(ditd_denoiser *d, int B, const void *x, const float *t,
                       const ditd_cond *cond, void *out)
{
    ditd_wan *m = (ditd_wan *)d;
    const ditd_cond_shape *s = &cond->shape;
    if (s->kind != DITD_COND_TEXT || s->text_len != m->L || s->text_dim != m->cfg.text_dim)
        return ditd_err_set(DITD_EINVAL, "Wan takes text (%d tokens of %d), not (%d, %d)", m->L,
                            m->cfg.text_dim, s->text_len, s->text_dim);
    if (cond->t_frames && cond->t_frames_n != m->F)
        return ditd_err_set(DITD_EINVAL,
                            "per-frame timesteps for %d frames, but the model runs at %d",
                            cond->t_frames_n, m->F);
    if (cond->image && (cond->image_len != m->Li || cond->image_dim != m->cfg.image_dim))
        return ditd_err_set(DITD_EINVAL,
                            "image embeddings of %d tokens of %d, but the model takes %d of %d",
                            cond->image_len, cond->image_dim, m->Li, m->cfg.image_dim);
    return ditd_wan_forward(m, B, x, t, cond->t_frames, cond->text, cond->image, out);
}

static int wan_set_video_size(ditd_denoiser *d, int frames, int height, int width, int text_len)
{
    int err = ditd_wan_set_size((ditd_wan *)d, frames, height, width, text_len);
    cache_plan((ditd_wan *)d);
    return err;
}

static int wan_set_size(ditd_denoiser *d, int height, int width, int text_len)
{
    ditd_wan *m = (ditd_wan *)d;
    int err = ditd_wan_set_size(m, m->F, height, width, text_len);
    cache_plan(m);
    return err;
}

static void wan_free(ditd_denoiser *d)
{
    ditd_wan_free((ditd_wan *)d);
}

const ditd_denoiser_family ditd_wan_family = {
    .class_name = "WanTransformer3DModel",
    .shapes = wan_shapes,
    .load = wan_load,
    .load_file = wan_load_file,
    .forward = wan_forward,
    .free = wan_free,
    .set_size = wan_set_size,
    .set_video_size = wan_set_video_size,
    .module_name = wan_module_name,
};
