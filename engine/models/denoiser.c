/* The checks every denoiser family shares, around its table. */
#include "engine/models/denoiser.h"

#include <math.h>
#include <stddef.h>
#include <string.h>

#include "engine/core/error.h"

int ditd_denoiser_shapes_check(const ditd_denoiser_shapes *s, const char *what)
{
    if (s->in_channels <= 0 || s->out_channels <= 0)
        return ditd_err_set(DITD_EINVAL, "%s: %d input, %d output channels", what,
                            s->in_channels, s->out_channels);
    if (s->height <= 0 || s->width <= 0 || s->height > 16384 || s->width > 16384)
        return ditd_err_set(DITD_EINVAL, "%s: latent size %dx%d", what, s->width, s->height);
    if (s->frames < 0 || s->frames > 65536)
        return ditd_err_set(DITD_EINVAL, "%s: %d latent frames", what, s->frames);
    if (s->heads <= 0 || s->tokens <= 0 || s->prefix_tokens < 0)
        return ditd_err_set(DITD_EINVAL, "%s: %d heads, %d tokens, %d prefix tokens", what,
                            s->heads, s->tokens, s->prefix_tokens);
    if (s->cond.kind == DITD_COND_CLASS && s->cond.num_classes <= 0)
        return ditd_err_set(DITD_EINVAL, "%s: class-conditional with %d classes", what,
                            s->cond.num_classes);
    if (s->cond.kind == DITD_COND_TEXT && (s->cond.text_len <= 0 || s->cond.text_dim <= 0))
        return ditd_err_set(DITD_EINVAL, "%s: text conditioning (%d, %d)", what, s->cond.text_len,
                            s->cond.text_dim);
    if ((unsigned)s->cond.kind >= DITD_COND_KIND_COUNT)
        return ditd_err_set(DITD_EINVAL, "%s: conditioning kind %d", what, (int)s->cond.kind);
    return 0;
}

int ditd_denoiser_shapes_same(const ditd_denoiser_shapes *a, const ditd_denoiser_shapes *b,
                              const char *what)
{
    static const struct {
        const char *name;
        size_t off;
    } fields[] = {
#define F(x) {#x, offsetof(ditd_denoiser_shapes, x)}
        F(in_channels), F(out_channels), F(height), F(width), F(frames), F(heads), F(head_dim),
        F(tokens), F(prefix_tokens), F(guidance_embed), F(latent_multiple), F(cond.kind),
        F(cond.num_classes), F(cond.text_len), F(cond.text_dim), F(cond.pooled_dim),
#undef F
    };
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
        int va, vb;
        memcpy(&va, (const char *)a + fields[i].off, sizeof va);
        memcpy(&vb, (const char *)b + fields[i].off, sizeof vb);
        if (va != vb)
            return ditd_err_set(DITD_EUNSUPPORTED, "%s: %s %d, the first transformer's is %d", what,
                                fields[i].name, vb, va);
    }
    return 0;
}

int ditd_denoiser_load(const ditd_denoiser_family *f, const char *dir,
                       const ditd_backend_ops *ops, int max_batch, const ditd_mesh *mesh,
                       ditd_denoiser **out)
{
    return ditd_denoiser_load_file(f, dir, NULL, ops, max_batch, mesh, out);
}

int ditd_denoiser_load_file(const ditd_denoiser_family *f, const char *dir, const char *weights,
                            const ditd_backend_ops *ops, int max_batch, const ditd_mesh *mesh,
                            ditd_denoiser **out)
{
    ditd_denoiser *d = NULL;
    int err;
    *out = NULL;
    if (max_batch <= 0 || max_batch > 4096)
        return ditd_err_set(DITD_EINVAL, "max batch %d (1..4096)", max_batch);
    if (weights && weights[0] && !f->load_file)
        return ditd_err_set(DITD_EUNSUPPORTED,
                            "%s does not take its weights from a separate file yet "
                            "(--transformer-file %s): put them in %s/",
                            f->class_name, weights, dir);
    if ((err = weights && weights[0] ? f->load_file(dir, weights, ops, max_batch, mesh, &d)
                                     : f->load(dir, ops, max_batch, mesh, &d)))
        return err;
    d->family = f;
    d->max_batch = max_batch;
    d->cache = NULL; /* step caching is the pipeline's to set, per batch */
    d->loras = NULL; /* and so are the adapters of the rows */
    if (d->n_lora_targets <= 0 && !d->lora_refusal)
        d->lora_refusal = "this model family does not take LoRA adapters yet";
    if (!f->module_name)
        d->cache_modules = 0;
    if ((err = ditd_denoiser_shapes_check(&d->shapes, f->class_name))) {
        f->free(d);
        return err;
    }
    *out = d;
    return 0;
}

int ditd_denoiser_forward(ditd_denoiser *d, int B, const void *x, const float *t,
                          const ditd_cond *cond, void *out)
{
    if (B <= 0 || B > d->max_batch || B > cond->max_rows)
        return ditd_err_set(DITD_EINVAL, "batch %d outside 1..%d", B,
                            d->max_batch < cond->max_rows ? d->max_batch : cond->max_rows);
    if (cond->shape.kind != d->shapes.cond.kind)
        return ditd_err_set(DITD_EINVAL, "%s takes %s conditioning, not %s", d->family->class_name,
                            ditd_cond_kind_name(d->shapes.cond.kind),
                            ditd_cond_kind_name(cond->shape.kind));
    for (int i = 0; i < B; i++)
        if (!isfinite(t[i]))
            return ditd_err_set(DITD_EINVAL, "timestep of sample %d is not finite", i);
    return d->family->forward(d, B, x, t, cond, out);
}

void ditd_denoiser_free(ditd_denoiser *d)
{
    if (d)
        d->family->free(d);
}

int ditd_denoiser_set_size(ditd_denoiser *d, int height, int width, int text_len)
{
    const ditd_denoiser_shapes *s = &d->shapes;
    int err;
    if (!d->family->set_size) {
        if (height == s->height && width == s->width &&
            (s->cond.kind != DITD_COND_TEXT || text_len == s->cond.text_len))
            return 0;
        return ditd_err_set(DITD_EUNSUPPORTED, "%s runs at latent size %dx%d only, not %dx%d",
                            d->family->class_name, s->width, s->height, width, height);
    }
    if ((err = d->family->set_size(d, height, width, text_len)))
        return err;
    return ditd_denoiser_shapes_check(s, d->family->class_name);
}

int ditd_denoiser_set_video_size(ditd_denoiser *d, int frames, int height, int width,
                                 int text_len)
{
    int err;
    if (!d->family->set_video_size) {
        if (frames <= 1)
            return ditd_denoiser_set_size(d, height, width, text_len);
        return ditd_err_set(DITD_EUNSUPPORTED, "%s is an image model: %d frames",
                            d->family->class_name, frames);
    }
    if ((err = d->family->set_video_size(d, frames, height, width, text_len)))
        return err;
    return ditd_denoiser_shapes_check(&d->shapes, d->family->class_name);
}

int ditd_denoiser_set_reference(ditd_denoiser *d, int ref_height, int ref_width)
{
    int err;
    if (!d->family->set_reference) {
        if (ref_height == 0 && ref_width == 0)
            return 0;
        return ditd_err_set(DITD_EUNSUPPORTED, "%s takes no reference image latents",
                            d->family->class_name);
    }
    if ((err = d->family->set_reference(d, ref_height, ref_width)))
        return err;
    return ditd_denoiser_shapes_check(&d->shapes, d->family->class_name);
}

static size_t frames_of(const ditd_denoiser_shapes *s)
{
    return s->frames > 1 ? (size_t)s->frames : 1;
}

size_t ditd_denoiser_numel_in(const ditd_denoiser_shapes *s)
{
    return (size_t)s->in_channels * frames_of(s) * (size_t)s->height * (size_t)s->width;
}

size_t ditd_denoiser_numel_out(const ditd_denoiser_shapes *s)
{
    return (size_t)s->out_channels * frames_of(s) * (size_t)s->height * (size_t)s->width;
}
