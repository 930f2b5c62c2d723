/* WanImageToVideoPipeline's condition and image embeddings. */
#include "engine/pipeline/image_cond.h"

#include <stdlib.h>
#include <string.h>

#include "engine/core/error.h"
#include "engine/models/wan_vae/wan_vae.h"
#include "engine/vision/clip_vision.h"
#include "engine/core/image_resize.h"

struct ditd_image_cond {
    const ditd_video_vae_family *fam;
    ditd_wan_vae *vae;
    const ditd_wan_vae_config *cfg;
    int max_w, max_h, mask_c, lat_c;
    int first_frame;                 /* expand_timesteps (TI2V-5B): the image's latents only */
    ditd_clip_vision *clip;          /* NULL without an image branch */
    ditd_clip_image_processor proc;
    int li, di;                      /* the transformer's image tokens and width */
    float *video, *z, *px;           /* (3, N, H, W), (z, T, h, w), (2, 3, S, S) */
    size_t cap_video, cap_z;
    uint8_t *rs;                     /* one resized image (H, W, 3) */
};

int ditd_image_cond_new(const ditd_model_info *info, const ditd_backend_ops *ops, int max_w,
                        int max_h, ditd_image_cond **out)
{
    ditd_image_cond *ic;
    int err;
    *out = NULL;
    if (!info->pipeline || !info->pipeline->image_to_video)
        return ditd_err_set(DITD_EUNSUPPORTED, "%s: %s takes no input image", info->dir,
                            info->pipeline ? info->pipeline->name : "?");
    if (!info->vae || !info->vae->video || !info->vae_dir[0])
        return ditd_err_set(DITD_EUNSUPPORTED, "%s: no video VAE to encode the input image",
                            info->dir);
    if (max_w < 1 || max_h < 1)
        return ditd_err_set(DITD_EINVAL, "image condition for %dx%d clips", max_w, max_h);
    if (!(ic = calloc(1, sizeof *ic)))
        return ditd_err_set(DITD_ENOMEM, "image condition");
    ic->fam = info->vae->video;
    ic->max_w = max_w;
    ic->max_h = max_h;
    ic->first_frame = info->expand_timesteps;
    ic->mask_c = ic->first_frame ? 0 : info->frame_step;
    ic->lat_c = info->shapes.out_channels;
    ic->li = info->shapes.cond.image_len;
    ic->di = info->shapes.cond.image_dim;
    ditd_wan_vae_opts o = {.max_video_h = max_h, .max_video_w = max_w};
    if ((err = ic->fam->load(info->vae_dir, ops, &o, &ic->vae)))
        goto fail;
    ic->cfg = ditd_wan_vae_config_of(ic->vae);
    if (ic->di > 0) {
        if ((err = ditd_clip_image_processor_load(info->image_processor_config, &ic->proc)) ||
            (err = ditd_clip_vision_new(info->image_encoder_dir, NULL, ops, 2, &ic->clip)))
            goto fail;
        const ditd_clip_vision_config *c = ditd_clip_vision_config_of(ic->clip);
        int S = c->image_size, n = ditd_clip_vision_tokens(ic->clip);
        if (c->hidden_size != ic->di || (ic->li != n && ic->li != 2 * n)) {
            err = ditd_err_set(DITD_EUNSUPPORTED, "%s: the image encoder gives %d tokens of %d; "
                               "the transformer takes %d of %d (image_dim, pos_embed_seq_len)",
                               info->image_encoder_dir, n, c->hidden_size, ic->li, ic->di);
            goto fail;
        }
        int pw, ph;
        ditd_clip_image_processor_out_size(&ic->proc, S, S, &pw, &ph);
        if (!ic->proc.do_center_crop || ic->proc.crop_w != S || ic->proc.crop_h != S) {
            err = ditd_err_set(DITD_EUNSUPPORTED, "%s: the processor makes %dx%d pixels, the "
                               "encoder takes %dx%d (do_center_crop with crop_size = image_size)",
                               info->image_processor_config, ic->proc.crop_w, ic->proc.crop_h,
                               S, S);
            goto fail;
        }
        if (!(ic->px = malloc((size_t)2 * c->num_channels * S * S * sizeof(float)))) {
            err = ditd_err_set(DITD_ENOMEM, "image encoder pixels");
            goto fail;
        }
    }
    if (!(ic->rs = malloc((size_t)max_w * max_h * 3))) {
        err = ditd_err_set(DITD_ENOMEM, "image condition buffers");
        goto fail;
    }
    *out = ic;
    return 0;
fail:
    ditd_image_cond_free(ic);
    return err;
}

void ditd_image_cond_free(ditd_image_cond *ic)
{
    if (!ic)
        return;
    if (ic->vae)
        ic->fam->free(ic->vae);
    ditd_clip_vision_free(ic->clip);
    free(ic->video);
    free(ic->z);
    free(ic->px);
    free(ic->rs);
    free(ic);
}

static int latent_frames(const ditd_image_cond *ic, int frames)
{
    return (frames - 1) / ic->cfg->scale_factor_temporal + 1;
}

size_t ditd_image_cond_numel(const ditd_image_cond *ic, int frames, int W, int H)
{
    int s = ic->cfg->scale_factor_spatial, T = ic->first_frame ? 1 : latent_frames(ic, frames);
    return (size_t)(ic->mask_c + ic->lat_c) * T * (H / s) * (W / s);
}

size_t ditd_image_cond_embeds_numel(const ditd_image_cond *ic)
{
    return ic->clip ? (size_t)ic->li * ic->di : 0;
}

static int grow(float **p, size_t *cap, size_t n)
{
    if (n <= *cap)
        return 0;
    float *q = realloc(*p, n * sizeof(float));
    if (!q)
        return ditd_err_set(DITD_ENOMEM, "image condition buffers (%zu values)", n);
    *p = q;
    *cap = n;
    return 0;
}

/* VideoProcessor.preprocess of one image into pixel frame f of video
 * (3, N, H, W): lanczos to W x H, x / 255 (float32), 2x - 1. */
static int put_frame(ditd_image_cond *ic, const uint8_t *rgb, int iw, int ih, int f, int N,
                     int W, int H)
{
    int err;
    if ((err = ditd_image_resize(rgb, iw, ih, 3, ic->rs, W, H)))
        return err;
    size_t plane = (size_t)W * H;
    for (int c = 0; c < 3; c++) {
        float *o = ic->video + ((size_t)c * N + f) * plane;
        for (size_t i = 0; i < plane; i++) {
            float v = (float)ic->rs[i * 3 + c] / 255.0f;
            o[i] = 2.0f * v - 1.0f;
        }
    }
    return 0;
}

int ditd_image_cond_run(ditd_image_cond *ic, const uint8_t *rgb, int iw, int ih,
                        const uint8_t *last, int lw, int lh, int frames, int W, int H,
                        float *cond, float *embeds)
{
    const int st = ic->cfg->scale_factor_temporal, s = ic->cfg->scale_factor_spatial;
    int err;
    if (!rgb || iw < 1 || ih < 1 || (last && (lw < 1 || lh < 1)))
        return ditd_err_set(DITD_EINVAL, "image: no pixels (%dx%d)", iw, ih);
    if (W < 1 || H < 1 || W > ic->max_w || H > ic->max_h || W % s || H % s)
        return ditd_err_set(DITD_EINVAL, "image condition for a %dx%d clip (multiples of %d, at "
                            "most %dx%d)", W, H, s, ic->max_w, ic->max_h);
    if (frames < 1 || (frames - 1) % st || (last && frames < 2))
        return ditd_err_set(DITD_EINVAL, "image condition for %d frames (1 + k x %d%s)", frames,
                            st, last ? ", at least 2 with a last image" : "");
    if (ic->clip && !embeds)
        return ditd_err_set(DITD_EINVAL, "image condition: the transformer needs image embeddings");
    if (ic->first_frame && last)
        return ditd_err_set(DITD_EINVAL, "a last image with expand_timesteps (TI2V-5B takes the "
                            "first frame only)");
    /* TI2V-5B: the image alone is encoded (prepare_latents' video_condition = image) */
    const int nf = ic->first_frame ? 1 : frames;
    int T = latent_frames(ic, nf), h = H / s, w = W / s;
    size_t plane = (size_t)W * H, nvid = (size_t)3 * nf * plane, lat_plane = (size_t)h * w;
    if ((err = grow(&ic->video, &ic->cap_video, nvid)) ||
        (err = grow(&ic->z, &ic->cap_z, (size_t)ic->cfg->z_dim * T * lat_plane)))
        return err;
    // the video [image, zeros..., (last)] (3, N, H, W) in [-1, 1]
    memset(ic->video, 0, nvid * sizeof(float));
    if ((err = put_frame(ic, rgb, iw, ih, 0, nf, W, H)) ||
        (last && (err = put_frame(ic, last, lw, lh, nf - 1, nf, W, H))))
        return err;
    // the VAE's mean, scaled: (z - mean) x (1 / std)
    if ((err = ic->fam->encode(ic->vae, ic->video, 1, nf, H, W, 0, ic->z, NULL)))
        return err;
    ditd_wan_vae_scale(ic->cfg, ic->z, 1, (size_t)T * lat_plane);
    if (ic->first_frame) {
        memcpy(cond, ic->z, (size_t)ic->cfg->z_dim * lat_plane * sizeof(float));
        return 0;
    }
    // [mask (st, T, h, w); latents (z, T, h, w)]: mask channel k of latent frame t is pixel
    // frame 0 for t = 0, else 1 + st (t - 1) + k; 1 on the first (and the last) frame
    for (int k = 0; k < st; k++)
        for (int t = 0; t < T; t++) {
            int pf = t == 0 ? 0 : 1 + st * (t - 1) + k;
            float v = pf == 0 || (last && pf == frames - 1) ? 1.0f : 0.0f;
            float *o = cond + ((size_t)k * T + t) * lat_plane;
            for (size_t i = 0; i < lat_plane; i++)
                o[i] = v;
        }
    memcpy(cond + (size_t)st * T * lat_plane, ic->z,
           (size_t)ic->cfg->z_dim * T * lat_plane * sizeof(float));
    if (!ic->clip)
        return 0;
    // CLIPImageProcessor + CLIPVisionModel hidden_states[-2], per image, tokens side by side
    const ditd_clip_vision_config *c = ditd_clip_vision_config_of(ic->clip);
    size_t npx = (size_t)c->num_channels * c->image_size * c->image_size;
    int nimg = last ? 2 : 1, n = ditd_clip_vision_tokens(ic->clip);
    if (nimg * n != ic->li)
        return ditd_err_set(DITD_EINVAL, "the transformer takes %d image tokens: %s", ic->li,
                            last ? "it has no pos_embed for a last image (FLF2V)"
                                 : "it needs a last image too (FLF2V)");
    if ((err = ditd_clip_image_preprocess(&ic->proc, rgb, iw, ih, ic->px)) ||
        (last && (err = ditd_clip_image_preprocess(&ic->proc, last, lw, lh, ic->px + npx))))
        return err;
    return ditd_clip_vision_encode(ic->clip, nimg, ic->px, -2, embeds);
}
