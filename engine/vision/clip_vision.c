/* transformers CLIPVisionModel forward to a hidden state; CLIPImageProcessor. */
#include "engine/vision/clip_vision.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/error.h"
#include "engine/text/clip_layers.h"
#include "engine/text/text_weights.h"
#include "kernels/cpu/text_kernels.h"

/* ---- the tower ---- */

struct ditd_clip_vision {
    ditd_clip_vision_config cfg;
    const ditd_backend_ops *ops;
    int max_batch, n_patch, n_tok, kdim; /* patches a side squared, + 1, C p p */
    ditd_text_weights w;
    const char *prefix;                  /* "vision_model." (hub checkpoints) or "" (transformers 5) */
    ditd_text_mat patch;                 /* (D, C p p) */
    void *cls, *pos;                     /* (D), (N, D) */
    void *pre_g, *pre_b;                 /* pre_layrnorm (D) */
    ditd__clip_layer *layers;
    ditd__clip_bufs b;
    void *cols;                          /* (B Np, C p p) act: the patches */
    float *h_cols;                       /* host staging of cols */
};

const ditd_clip_vision_config *ditd_clip_vision_config_of(const ditd_clip_vision *m)
{
    return &m->cfg;
}

int ditd_clip_vision_tokens(const ditd_clip_vision *m) { return m->n_tok; }

static int walk(ditd_clip_vision *m)
{
    const ditd_clip_vision_config *c = &m->cfg;
    ditd_text_weights *w = &m->w;
    int64_t D = c->hidden_size, F = c->intermediate_size;
    int64_t pshape[4] = {D, c->num_channels, c->patch_size, c->patch_size};
    size_t BN = (size_t)m->max_batch * (size_t)m->n_tok;
    char name[256];
    const char *p = m->prefix;
    int err;
#define N_(sfx) (snprintf(name, sizeof name, "%s%s", p, sfx), name)
    if ((err = ditd_text_weights_mat_nd(w, &m->patch, N_("embeddings.patch_embedding.weight"), 4,
                                        pshape)) ||
        (err = ditd_text_weights_small(w, &m->cls, N_("embeddings.class_embedding"), D, 0)) ||
        (err = ditd_text_weights_small(w, &m->pos, N_("embeddings.position_embedding.weight"),
                                       m->n_tok, D)) ||
        (err = ditd_text_weights_small(w, &m->pre_g, N_("pre_layrnorm.weight"), D, 0)) ||
        (err = ditd_text_weights_small(w, &m->pre_b, N_("pre_layrnorm.bias"), D, 0)))
        return err;
#undef N_
    for (int l = 0; l < c->num_layers; l++)
        if ((err = ditd__clip_layer_walk(w, &m->layers[l], p, l, D, F)))
            return err;
    size_t ncols = (size_t)m->max_batch * m->n_patch * m->kdim;
    if ((err = ditd__clip_bufs_carve(w, &m->b, BN, m->n_tok, D, F, m->kdim)) ||
        (err = ditd_text_weights_carve(w, &m->cols, ncols, 0)))
        return err;
    return 0;
}

int ditd_clip_vision_new(const char *dir, const char *class_hint, const ditd_backend_ops *ops,
                         int max_batch, ditd_clip_vision **out)
{
    char path[4096];
    ditd_clip_vision *m;
    int err;
    *out = NULL;
    if (!ops->linear_wt || !ops->layernorm_affine || !ops->attention_masked || !ops->copy2d)
        return ditd_err_set(DITD_EUNSUPPORTED, "the %s backend has no text-encoder ops (the CLIP "
                            "vision tower runs on them)", ops->name);
    if (max_batch < 1 || max_batch > 4096)
        return ditd_err_set(DITD_EINVAL, "%s: batch %d (1..4096)", dir, max_batch);
    if (!(m = calloc(1, sizeof *m)))
        return ditd_err_set(DITD_ENOMEM, "CLIP vision model");
    snprintf(path, sizeof path, "%s/config.json", dir);
    if ((err = ditd_clip_vision_config_load(path, class_hint, &m->cfg)))
        goto fail;
    const ditd_clip_vision_config *c = &m->cfg;
    int side = c->image_size / c->patch_size;
    m->ops = ops;
    m->max_batch = max_batch;
    m->n_patch = side * side;
    m->n_tok = m->n_patch + 1;
    m->kdim = c->num_channels * c->patch_size * c->patch_size;
    if (m->kdim > DITD_CPU_WT_PANEL * 1024) {
        err = ditd_err_set(DITD_EUNSUPPORTED, "%s: patch of %d values", path, m->kdim);
        goto fail;
    }
    if (!(m->layers = calloc((size_t)c->num_layers, sizeof *m->layers)) ||
        !(m->h_cols = malloc((size_t)max_batch * m->n_patch * m->kdim * sizeof(float)))) {
        err = ditd_err_set(DITD_ENOMEM, "CLIP vision buffers");
        goto fail;
    }
    if ((err = ditd_text_weights_open(&m->w, dir, ops)))
        goto fail;
    m->prefix = ditd_text_weights_has(&m->w, "vision_model.embeddings.patch_embedding.weight")
                    ? "vision_model."
                    : "";
    if (c->num_channels != 3) {
        err = ditd_err_set(DITD_EUNSUPPORTED, "%s: num_channels %d (CLIPImageProcessor makes RGB)",
                           path, c->num_channels);
        goto fail;
    }
    if ((err = walk(m)) || (err = ditd_text_weights_commit(&m->w)) || (err = walk(m)))
        goto fail;
    *out = m;
    return 0;
fail:
    ditd_clip_vision_free(m);
    return err;
}

void ditd_clip_vision_free(ditd_clip_vision *m)
{
    if (!m)
        return;
    if (m->w.src)
        ditd_text_weights_free(&m->w);
    free(m->layers);
    free(m->h_cols);
    free(m);
}

int ditd_clip_vision_encode(ditd_clip_vision *m, int B, const float *pixels, int hidden_index,
                            float *hidden)
{
    const ditd_clip_vision_config *c = &m->cfg;
    const ditd_backend_ops *ops = m->ops;
    const int D = c->hidden_size, F = c->intermediate_size, L = c->num_layers, N = m->n_tok;
    const int S = c->image_size, p = c->patch_size, side = S / p, Cc = c->num_channels;
    const size_t BN = (size_t)B * N;
    int hidx = hidden_index < 0 ? hidden_index + L + 1 : hidden_index;
    if (B < 1 || B > m->max_batch)
        return ditd_err_set(DITD_EINVAL, "CLIP vision encode: batch %d (1..%d)", B, m->max_batch);
    if (hidx < 0 || hidx > L)
        return ditd_err_set(DITD_EINVAL, "CLIP vision encode: hidden_index %d (the model has %d "
                            "hidden states)", hidden_index, L + 1);
    // patches (B, Np, C p p), ordered (c, ky, kx) as the Conv2d kernel
    for (int b = 0; b < B; b++)
        for (int py = 0; py < side; py++)
            for (int px = 0; px < side; px++) {
                float *r = m->h_cols + (((size_t)b * side + py) * side + px) * m->kdim;
                for (int ch = 0; ch < Cc; ch++)
                    for (int ky = 0; ky < p; ky++)
                        memcpy(r + ((size_t)ch * p + ky) * p,
                               pixels + (((size_t)b * Cc + ch) * S + (size_t)py * p + ky) * S +
                                   (size_t)px * p,
                               (size_t)p * sizeof(float));
            }
    ops->upload(m->cols, m->h_cols, (size_t)B * m->n_patch * m->kdim);
    // patch embedding (B Np, D) into tmp, then h = [class; patches] + positions
    ops->linear_wt(m->cols, (size_t)m->kdim, m->patch.p, m->patch.dt, NULL, m->b.tmp, (size_t)D,
                   B * m->n_patch, D, m->kdim, DITD_TEXT_ACT_NONE, m->b.scratch,
                   m->b.scratch_elems);
    for (int b = 0; b < B; b++) {
        void *hb = ditd_ptr_act(ops, m->b.h, (size_t)b * N * D);
        ops->copy2d(hb, D, m->cls, D, 1, (size_t)D);
        ops->copy2d(ditd_ptr_act(ops, hb, (size_t)D), D,
                    ditd_ptr_act(ops, m->b.tmp, (size_t)b * m->n_patch * D), D,
                    (size_t)m->n_patch, (size_t)D);
        ops->add(hb, m->pos, (size_t)N * D);
    }
    // pre_layrnorm: hidden_states[0]
    ops->layernorm_affine(m->b.h, m->b.h, (int)BN, D, c->eps, m->pre_g, m->pre_b);
    for (int l = 0; l < hidx; l++)
        ditd__clip_layer_forward(ops, &m->layers[l], &m->b, B, N, D, F, c->num_heads, c->eps,
                                 c->act, NULL, 0, NULL, 0);
    ops->download(hidden, m->b.h, BN * D);
    return ops->status();
}
