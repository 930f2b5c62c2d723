/* The tail of a video pipeline: mean_std unscale, the video VAE, 8-bit frames. */
#include "engine/pipeline/latent_video.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/error.h"
#include "engine/models/wan_vae/wan_vae.h"

struct ditd_latent_video {
    const ditd_video_vae_family *fam;
    ditd_wan_vae *vae;
    const ditd_wan_vae_config *cfg;
    int max_h, max_w;
    int leader;             /* rank 0 of the decode's group (or one rank): makes the frames */
    float *z, *px;          /* one clip: unscaled latents, decoded frames (C, F, H, W) */
    size_t cap_z, cap_px;
};

int ditd_latent_video_new(const ditd_model_info *info, const ditd_backend_ops *ops, int max_h,
                          int max_w, ditd_latent_video **out)
{
    return ditd_latent_video_new_group(info, ops, max_h, max_w, NULL, out);
}

int ditd_latent_video_new_group(const ditd_model_info *info, const ditd_backend_ops *ops,
                                int max_h, int max_w, ditd_comm *comm, ditd_latent_video **out)
{
    ditd_latent_video *lv;
    int err;
    *out = NULL;
    if (!info->pipeline || info->pipeline->unscale != DITD_LATENT_RULE_MEAN_STD)
        return ditd_err_set(DITD_EUNSUPPORTED, "%s: %s's latents are not video latents (rule %s)",
                            info->dir, info->pipeline ? info->pipeline->name : "?",
                            info->pipeline ? ditd_latent_rule_name(info->pipeline->unscale) : "?");
    if (!info->vae || !info->vae_dir[0] || !info->vae->video)
        return ditd_err_set(DITD_EUNSUPPORTED, "%s: no video VAE in vae/ (%s): the latents cannot "
                            "be decoded to frames", info->dir,
                            info->vae_class[0] ? info->vae_class : "none");
    if (!(lv = calloc(1, sizeof *lv)))
        return ditd_err_set(DITD_ENOMEM, "latent video decoder");
    lv->fam = info->vae->video;
    lv->max_h = max_h > 0 ? max_h : info->shapes.height;
    lv->max_w = max_w > 0 ? max_w : info->shapes.width;
    int group = comm && ditd_comm_size(comm) > 1;
    lv->leader = !group || ditd_comm_rank(comm) == 0;
    ditd_wan_vae_opts o = {.max_h = lv->max_h, .max_w = lv->max_w, .comm = group ? comm : NULL};
    if ((err = lv->fam->load(info->vae_dir, ops, &o, &lv->vae))) {
        free(lv);
        return err;
    }
    lv->cfg = ditd_wan_vae_config_of(lv->vae);
    int lat_c = info->pipeline->image_to_video ? info->shapes.out_channels
                                               : info->shapes.in_channels;
    if (lv->cfg->z_dim != lat_c) {
        ditd_latent_video_free(lv);
        return ditd_err_set(DITD_EUNSUPPORTED,
                            "%s: the VAE has %d latent channels, the transformer's latents %d",
                            info->vae_dir, lv->cfg->z_dim, lat_c);
    }
    *out = lv;
    return 0;
}

void ditd_latent_video_free(ditd_latent_video *lv)
{
    if (!lv)
        return;
    if (lv->vae)
        lv->fam->free(lv->vae);
    free(lv->z);
    free(lv->px);
    free(lv);
}

int ditd_latent_video_frames(const ditd_latent_video *lv, int T)
{
    return 1 + lv->cfg->scale_factor_temporal * (T - 1);
}

int ditd_latent_video_scale(const ditd_latent_video *lv) { return lv->cfg->scale_factor_spatial; }

static int grow(float **p, size_t *cap, size_t n)
{
    if (n <= *cap)
        return 0;
    float *q = realloc(*p, n * sizeof(float));
    if (!q)
        return ditd_err_set(DITD_ENOMEM, "latent video buffers (%zu values)", n);
    *p = q;
    *cap = n;
    return 0;
}

int ditd_latent_video_run(ditd_latent_video *lv, const float *latents, int B, int T, int h, int w,
                          uint8_t *out)
{
    const int C = lv->cfg->z_dim, s = lv->cfg->scale_factor_spatial;
    const int Co = lv->cfg->out_channels / (lv->cfg->patch_size * lv->cfg->patch_size);
    const int F = ditd_latent_video_frames(lv, T), H = h * s, W = w * s;
    int err;
    if (B < 1 || T < 1 || h < 1 || w < 1 || h > lv->max_h || w > lv->max_w)
        return ditd_err_set(DITD_EINVAL, "video decode of %d clips of %d x %dx%d latents (at most %dx%d)",
                            B, T, w, h, lv->max_w, lv->max_h);
    const size_t nz = (size_t)C * T * h * w, plane = (size_t)H * W;
    const size_t npx = (size_t)Co * F * plane;
    if ((err = grow(&lv->z, &lv->cap_z, nz)) ||
        (lv->leader && (err = grow(&lv->px, &lv->cap_px, npx))))
        return err;
    for (int b = 0; b < B; b++) {
        memcpy(lv->z, latents + (size_t)b * nz, nz * sizeof(float));
        ditd_wan_vae_unscale(lv->cfg, lv->z, 1, (size_t)T * h * w);
        /* collective on a group; the frames land on its leader */
        if ((err = lv->fam->decode(lv->vae, lv->z, 1, T, h, w, lv->leader ? lv->px : NULL)))
            return err;
        if (!lv->leader || !out)
            continue;
        uint8_t *o = out + (size_t)b * F * plane * Co;
        for (int f = 0; f < F; f++)
            for (size_t i = 0; i < plane; i++)
                for (int c = 0; c < Co; c++) {
                    float v = lv->px[((size_t)c * F + f) * plane + i] * 0.5f + 0.5f;
                    v = v < 0.0f ? 0.0f : v > 1.0f ? 1.0f : v;
                    o[((size_t)f * plane + i) * Co + c] = (uint8_t)nearbyintf(v * 255.0f);
                }
    }
    return 0;
}
