/* The tail of a latent pipeline: its unscale rule, VAE decode, 8-bit pixels. */
#include "engine/pipeline/latent_image.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/error.h"
#include "engine/pipeline/pipeline.h"

int ditd_latent_image_new(const ditd_model_info *info, const ditd_backend_ops *ops,
                          ditd_comm *group, int tiling, ditd_latent_image **out)
{
    char dir[DITD_MODEL_PATH_MAX + 8];
    ditd_latent_image *li;
    int err;

    *out = NULL;
    if (!(li = calloc(1, sizeof *li)))
        return ditd_err_set(DITD_ENOMEM, "latent decoder");
    if (!info->vae || !info->vae_dir[0]) {
        free(li);
        return ditd_err_set(DITD_EUNSUPPORTED, "%s: no vae/config.json: the latents cannot be decoded",
                            info->dir);
    }
    if (info->pipeline->unscale == DITD_LATENT_RULE_MEAN_STD || info->frames > 0) {
        free(li);
        return ditd_err_set(DITD_EUNSUPPORTED,
                            "%s: %s makes video latents: they decode to frames through "
                            "engine/pipeline/latent_video.h, not as an image",
                            info->dir, info->pipeline->name);
    }
    li->rule = info->pipeline->unscale;
    snprintf(dir, sizeof dir, "%s", info->vae_dir);
    /* edits encode as the img2img row: (z - shift_factor) x scaling_factor, the
     * shifted rule's inverse (FLUX's and SD3's rows); a reference row
     * (FluxKontextPipeline) the same way */
    li->img2img = (info->pipeline->img2img != NULL &&
                   info->pipeline->img2img->unscale == DITD_LATENT_RULE_SHIFTED) ||
                  (info->pipeline->reference && info->pipeline->unscale == DITD_LATENT_RULE_SHIFTED);
    ditd_vae_opts o = {.max_h = info->shapes.height, .max_w = info->shapes.width,
                       .tiling = tiling, .comm = group};
    if ((err = info->vae->load(dir, ops, &o, &li->vae))) {
        free(li);
        return err;
    }
    const ditd_vae_config *c = ditd_vae_config_of(li->vae);
    const int f = ditd_vae_config_scale_factor(c);
    if (c->latent_channels != info->shapes.in_channels) {
        ditd_latent_image_free(li);
        return ditd_err_set(DITD_EUNSUPPORTED,
                            "%s: the VAE has %d latent channels, the transformer's in_channels is %d",
                            dir, c->latent_channels, info->shapes.in_channels);
    }
    li->Cl = c->latent_channels;
    li->h = li->max_h = info->shapes.height;
    li->w = li->max_w = info->shapes.width;
    li->Co = c->out_channels;
    li->H = li->h * f;
    li->W = li->w * f;
    snprintf(li->dir, sizeof li->dir, "%s", dir);
    li->family = info->vae;
    li->ops = ops;
    li->group = group;
    li->tiling = tiling;
    li->z = malloc((size_t)li->Cl * li->h * li->w * sizeof *li->z);
    li->img = malloc((size_t)li->Co * li->H * li->W * sizeof *li->img);
    if (!li->z || !li->img) {
        ditd_latent_image_free(li);
        return ditd_err_set(DITD_ENOMEM, "latent decoder buffers");
    }
    *out = li;
    return 0;
}

/* The VAE again, planned for latents up to mh x mw (and images of that size
 * when the encoder is on); the old one stays on failure. */
static int reload(ditd_latent_image *li, int mh, int mw)
{
    const int f = ditd_vae_config_scale_factor(ditd_vae_config_of(li->vae));
    ditd_vae_opts o = {.max_h = mh, .max_w = mw, .tiling = li->tiling, .comm = li->group};
    if (li->encoder) {
        o.max_image_h = mh * f;
        o.max_image_w = mw * f;
    }
    ditd_vae *v = NULL;
    float *z = malloc((size_t)li->Cl * mh * mw * sizeof *z);
    float *img = malloc((size_t)li->Co * mh * f * mw * f * sizeof *img);
    int err = !z || !img ? ditd_err_set(DITD_ENOMEM, "latent decoder buffers for %dx%d", mh, mw)
                         : li->family->load(li->dir, li->ops, &o, &v);
    if (err) {
        free(z);
        free(img);
        return err;
    }
    ditd_vae_free(li->vae);
    free(li->z);
    free(li->img);
    li->vae = v;
    li->z = z;
    li->img = img;
    li->max_h = mh;
    li->max_w = mw;
    return 0;
}

int ditd_latent_image_set_size(ditd_latent_image *li, int h, int w)
{
    const int f = ditd_vae_config_scale_factor(ditd_vae_config_of(li->vae));
    if (h < 1 || w < 1)
        return ditd_err_set(DITD_EINVAL, "latent size %dx%d", h, w);
    if (h > li->max_h || w > li->max_w) {
        int err = reload(li, h > li->max_h ? h : li->max_h, w > li->max_w ? w : li->max_w);
        if (err)
            return err;
    }
    li->h = h;
    li->w = w;
    li->H = h * f;
    li->W = w * f;
    return 0;
}

int ditd_latent_image_enable_encode(ditd_latent_image *li)
{
    if (li->encoder)
        return 0;
    if (!li->img2img)
        return ditd_err_set(DITD_EUNSUPPORTED, "%s: the pipeline takes no input image (img2img "
                            "is done for the shifted latent rule: FLUX, SD3)", li->dir);
    li->encoder = 1;
    int err = reload(li, li->max_h, li->max_w);
    if (err)
        li->encoder = 0;
    return err;
}

void ditd_latent_image_free(ditd_latent_image *li)
{
    if (!li)
        return;
    ditd_vae_free(li->vae);
    free(li->z);
    free(li->img);
    free(li);
}

int ditd_latent_image_run(ditd_latent_image *li, const float *latents, int n,
                          const uint8_t *active, uint8_t *pixels)
{
    return ditd_latent_image_run_as(li, li->rule, latents, n, active, pixels);
}

int ditd_latent_image_run_as(ditd_latent_image *li, ditd_latent_rule rule, const float *latents,
                             int n, const uint8_t *active, uint8_t *pixels)
{
    if (rule != DITD_LATENT_RULE_SHIFTED && rule != DITD_LATENT_RULE_DIT)
        return ditd_err_set(DITD_EUNSUPPORTED, "latent rule %s: not an image decode",
                            ditd_latent_rule_name(rule));
    const size_t zn = (size_t)li->Cl * li->h * li->w, pn = (size_t)li->Co * li->H * li->W;
    for (int i = 0; i < n; i++) {
        if (active && !active[i])
            continue;
        memcpy(li->z, latents + (size_t)i * zn, zn * sizeof *li->z);
        if (rule == DITD_LATENT_RULE_SHIFTED)
            ditd_vae_unscale_shifted(ditd_vae_config_of(li->vae), li->z, zn);
        else
            ditd_vae_unscale_dit(ditd_vae_config_of(li->vae), li->z, zn);
        int err = ditd_vae_decode(li->vae, li->z, 1, li->h, li->w, pixels ? li->img : NULL);
        if (err)
            return err;
        if (pixels)
            ditd_pipeline_to_pixels(li->img, li->Co, li->H, li->W, pixels + (size_t)i * pn);
    }
    return 0;
}

int ditd_latent_image_encode(ditd_latent_image *li, const uint8_t *rgb, int H, int W,
                             uint64_t seed, float *latents)
{
    return ditd_latent_image_encode_nth(li, rgb, H, W, seed, 0, latents);
}

int ditd_latent_image_encode_nth(ditd_latent_image *li, const uint8_t *rgb, int H, int W,
                                 uint64_t seed, int j, float *latents)
{
    if (j < 0)
        return ditd_err_set(DITD_EINVAL, "input image %d", j);
    int err = ditd_latent_image_enable_encode(li); /* may reload the VAE */
    if (err)
        return err;
    const ditd_vae_config *c = ditd_vae_config_of(li->vae);
    if (H != li->H || W != li->W)
        return ditd_err_set(DITD_EINVAL, "input image %dx%d: the request is %dx%d (resampling the "
                            "image to the size is not done yet)", W, H, li->W, li->H);
    if (c->in_channels != li->Co)
        return ditd_err_set(DITD_EUNSUPPORTED, "%s: the VAE takes %d channels, the images have %d",
                            li->dir, c->in_channels, li->Co);
    /* VaeImageProcessor: numpy float32 u / 255, then torch 2 x - 1 (float32) */
    const size_t hw = (size_t)H * W;
    float *x = li->img; /* (Co, H, W): the decode's buffer, free between decodes */
    for (int ch = 0; ch < li->Co; ch++)
        for (size_t i = 0; i < hw; i++) {
            float u = (float)rgb[i * (size_t)li->Co + (size_t)ch] / 255.0f;
            x[(size_t)ch * hw + i] = 2.0f * u - 1.0f;
        }
    /* input image j's part of the request's one posterior draw */
    const uint64_t off = (uint64_t)j * (uint64_t)li->Cl * (uint64_t)li->h * (uint64_t)li->w;
    err = ditd_vae_encode_stream(li->vae, x, 1, H, W, seed, DITD_LATENT_POSTERIOR_STREAM, off,
                                 li->z, latents);
    if (err)
        return err;
    /* _encode_vae_image: (z - shift_factor) * scaling_factor */
    ditd_vae_scale_shifted(c, latents, (size_t)li->Cl * li->h * li->w);
    return 0;
}

int ditd_latent_image_encode_mode(ditd_latent_image *li, const uint8_t *rgb, int H, int W,
                                  float *latents)
{
    int err = ditd_latent_image_enable_encode(li);
    if (err)
        return err;
    const int f = ditd_vae_config_scale_factor(ditd_vae_config_of(li->vae));
    if (H <= 0 || W <= 0 || H % f || W % f)
        return ditd_err_set(DITD_EINVAL, "reference image %dx%d: a multiple of the VAE's %d", W,
                            H, f);
    const int h = H / f, w = W / f;
    if ((h > li->max_h || w > li->max_w) &&
        (err = reload(li, h > li->max_h ? h : li->max_h, w > li->max_w ? w : li->max_w)))
        return err;
    const ditd_vae_config *c = ditd_vae_config_of(li->vae);
    if (c->in_channels != li->Co)
        return ditd_err_set(DITD_EUNSUPPORTED, "%s: the VAE takes %d channels, the images have %d",
                            li->dir, c->in_channels, li->Co);
    const size_t hw = (size_t)H * W;
    float *x = li->img; /* planned for max_h x max_w latents' images */
    for (int ch = 0; ch < li->Co; ch++)
        for (size_t i = 0; i < hw; i++) {
            float u = (float)rgb[i * (size_t)li->Co + (size_t)ch] / 255.0f;
            x[(size_t)ch * hw + i] = 2.0f * u - 1.0f;
        }
    /* retrieve_latents(sample_mode="argmax"): latent_dist.mode(), the mean */
    if ((err = ditd_vae_encode(li->vae, x, 1, H, W, 0, latents, NULL)))
        return err;
    ditd_vae_scale_shifted(c, latents, (size_t)li->Cl * h * w);
    return 0;
}

int ditd_latent_mask_from_gray(const uint8_t *gray, int H, int W, int h, int w, float *out)
{
    if (H <= 0 || W <= 0 || h <= 0 || w <= 0 || h > H || w > W)
        return ditd_err_set(DITD_EINVAL, "mask %dx%d to a latent grid of %dx%d", W, H, w, h);
    /* upsample_nearest2d: scale = (float)in / out, src = min(floor(dst * scale), in - 1) */
    const float sy = (float)H / (float)h, sx = (float)W / (float)w;
    for (int y = 0; y < h; y++) {
        int yy = (int)floorf((float)y * sy);
        yy = yy < H - 1 ? yy : H - 1;
        for (int x = 0; x < w; x++) {
            int xx = (int)floorf((float)x * sx);
            xx = xx < W - 1 ? xx : W - 1;
            float u = (float)gray[(size_t)yy * (size_t)W + (size_t)xx] / 255.0f;
            out[(size_t)y * (size_t)w + (size_t)x] = u < 0.5f ? 0.0f : 1.0f; /* binarize */
        }
    }
    return 0;
}
