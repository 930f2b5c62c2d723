/* transformers CLIPVisionModel forward to a hidden state; CLIPImageProcessor. */
#include "engine/vision/clip_vision.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/error.h"
#include "engine/io/json_config.h"
#include "engine/text/clip_layers.h"
#include "engine/text/text_weights.h"
#include "kernels/cpu/text_kernels.h"

/* ---- config.json ---- */

/* keys that do not change the hidden states (training, metadata) */
static const char *const vision_ignored[] = {
    "_name_or_path", "architectures", "attention_dropout", "dropout", "initializer_factor",
    "initializer_range", "model_type", "torch_dtype", "dtype", "transformers_version",
    "projection_dim", "output_hidden_states", "output_attentions", "return_dict",
    "use_return_dict", "chunk_size_feed_forward", "is_encoder_decoder", "id2label", "label2id",
    "problem_type", "tie_word_embeddings", "_attn_implementation_autoset", NULL};
static const char *const vision_used[] = {
    "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_channels",
    "image_size", "patch_size", "hidden_act", "layer_norm_eps", NULL};

static int listed(const char *const *l, const char *k)
{
    for (; *l; l++)
        if (strcmp(*l, k) == 0)
            return 1;
    return 0;
}

typedef struct vision_read {
    const char *class_hint;
    ditd_clip_vision_config *c;
} vision_read;

static int read_vision(json_t *root, const char *path, void *ud)
{
    vision_read *r = ud;
    ditd_clip_vision_config *c = r->c;
    const char *key;
    json_t *v;
    double eps;
    int err;
    if (!json_is_object(root))
        return ditd_err_set(DITD_EFORMAT, "%s: not a JSON object", path);
    json_object_foreach(root, key, v) {
        if (!listed(vision_used, key) && !listed(vision_ignored, key))
            return ditd_err_set(DITD_EUNSUPPORTED, "%s: key \"%s\" is not a CLIPVisionConfig key "
                                "ditd knows", path, key);
    }
    const char *cls = r->class_hint;
    json_t *arch = json_object_get(root, "architectures");
    if (arch && json_is_array(arch) && json_array_size(arch) == 1 &&
        json_is_string(json_array_get(arch, 0))) {
        const char *a = json_string_value(json_array_get(arch, 0));
        if (cls && strcmp(cls, a) != 0)
            return ditd_err_set(DITD_EUNSUPPORTED, "%s: architectures says %s, model_index.json %s",
                                path, a, cls);
        cls = a;
    }
    if (cls && strcmp(cls, "CLIPVisionModel") && strcmp(cls, "CLIPVisionModelWithProjection"))
        return ditd_err_set(DITD_EUNSUPPORTED, "%s: %s is not a CLIP vision model "
                            "(CLIPVisionModel, CLIPVisionModelWithProjection)", path, cls);
    c->with_projection = cls && strcmp(cls, "CLIPVisionModelWithProjection") == 0;
    if ((err = ditd_json_get_int(root, path, "hidden_size", 768, &c->hidden_size)) ||
        (err = ditd_json_get_int(root, path, "intermediate_size", 3072, &c->intermediate_size)) ||
        (err = ditd_json_get_int(root, path, "num_hidden_layers", 12, &c->num_layers)) ||
        (err = ditd_json_get_int(root, path, "num_attention_heads", 12, &c->num_heads)) ||
        (err = ditd_json_get_int(root, path, "num_channels", 3, &c->num_channels)) ||
        (err = ditd_json_get_int(root, path, "image_size", 224, &c->image_size)) ||
        (err = ditd_json_get_int(root, path, "patch_size", 32, &c->patch_size)) ||
        (err = ditd_json_get_number(root, path, "layer_norm_eps", 1e-5, NULL, &eps)))
        return err;
    c->eps = (float)eps;
    json_t *act = json_object_get(root, "hidden_act");
    const char *as = act && json_is_string(act) ? json_string_value(act) : "quick_gelu";
    if (act && !json_is_null(act) && !json_is_string(act))
        return ditd_err_set(DITD_EFORMAT, "%s: hidden_act must be a string", path);
    if (strcmp(as, "none") == 0 || ditd_text_act_from_str(as, &c->act))
        return ditd_err_set(DITD_EUNSUPPORTED, "%s: hidden_act \"%s\" is not supported "
                            "(quick_gelu, gelu, gelu_new, relu)", path, as);
#define POS(k, x, hi)                                                                         \
    if ((x) < 1 || (x) > (hi))                                                                \
    return ditd_err_set(DITD_ERANGE, "%s: %s %d (1..%d)", path, k, (x), (hi))
    POS("hidden_size", c->hidden_size, 1 << 16);
    POS("intermediate_size", c->intermediate_size, 1 << 18);
    POS("num_hidden_layers", c->num_layers, 1024);
    POS("num_attention_heads", c->num_heads, 1024);
    POS("num_channels", c->num_channels, 4);
    POS("image_size", c->image_size, 4096);
    POS("patch_size", c->patch_size, 4096);
#undef POS
    if (c->hidden_size % c->num_heads)
        return ditd_err_set(DITD_EINVAL, "%s: hidden_size %d is not a multiple of "
                            "num_attention_heads %d", path, c->hidden_size, c->num_heads);
    if (c->image_size % c->patch_size)
        return ditd_err_set(DITD_EINVAL, "%s: image_size %d is not a multiple of patch_size %d",
                            path, c->image_size, c->patch_size);
    int n = (c->image_size / c->patch_size) * (c->image_size / c->patch_size) + 1;
    if (n > DITD_CPU_MASKED_ATTN_MAX_N)
        return ditd_err_set(DITD_EUNSUPPORTED, "%s: %d tokens (image_size / patch_size squared + "
                            "1; at most %d)", path, n, DITD_CPU_MASKED_ATTN_MAX_N);
    if (!(c->eps > 0.0f))
        return ditd_err_set(DITD_ERANGE, "%s: layer_norm_eps %g", path, eps);
    return 0;
}

int ditd_clip_vision_config_load(const char *path, const char *class_hint,
                                 ditd_clip_vision_config *out)
{
    vision_read r = {class_hint, out};
    memset(out, 0, sizeof *out);
    return ditd_json_config_file(path, read_vision, &r);
}

/* ---- preprocessor_config.json ---- */

static const char *const proc_ignored[] = {"image_processor_type", "processor_class",
                                           "feature_extractor_type", "do_convert_rgb", NULL};
static const char *const proc_used[] = {"do_resize", "size", "resample", "do_center_crop",
                                        "crop_size", "do_rescale", "rescale_factor",
                                        "do_normalize", "image_mean", "image_std", NULL};

/* {"shortest_edge": n} or {"height": h, "width": w} or an integer: 0, 1 when
 * absent (the caller's default), or a negative error */
static int read_size(json_t *root, const char *path, const char *key, int *edge, int *h, int *w)
{
    json_t *v = json_object_get(root, key);
    *edge = *h = *w = 0;
    if (!v || json_is_null(v))
        return 1; /* absent: the caller's default */
    if (json_is_integer(v)) {
        *h = *w = (int)json_integer_value(v);
    } else if (json_is_object(v)) {
        json_t *se = json_object_get(v, "shortest_edge"), *hh = json_object_get(v, "height"),
               *ww = json_object_get(v, "width");
        if (se && json_is_integer(se) && !hh && !ww && json_object_size(v) == 1)
            *edge = (int)json_integer_value(se);
        else if (!se && hh && ww && json_is_integer(hh) && json_is_integer(ww) &&
                 json_object_size(v) == 2) {
            *h = (int)json_integer_value(hh);
            *w = (int)json_integer_value(ww);
        } else {
            return ditd_err_set(DITD_EUNSUPPORTED, "%s: %s must be {\"shortest_edge\": n} or "
                                 "{\"height\": h, \"width\": w}", path, key);
        }
    } else {
        return ditd_err_set(DITD_EFORMAT, "%s: %s must be an object or an integer", path, key);
    }
    int big = *edge > *h ? *edge : *h;
    if (*w > big)
        big = *w;
    if (big > 16384 || *edge < 0 || *h < 0 || *w < 0 || (!*edge && (*h < 1 || *w < 1)))
        return ditd_err_set(DITD_ERANGE, "%s: %s out of range (1..16384)", path, key);
    return 0;
}

static int read_triple(json_t *root, const char *path, const char *key, const double *dflt,
                       float *out)
{
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) {
        for (int i = 0; i < 3; i++)
            out[i] = (float)dflt[i];
        return 0;
    }
    if (json_is_number(v)) {
        for (int i = 0; i < 3; i++)
            out[i] = (float)json_number_value(v);
        return 0;
    }
    if (!json_is_array(v) || json_array_size(v) != 3)
        return ditd_err_set(DITD_EFORMAT, "%s: %s must be a number or 3 numbers", path, key);
    for (int i = 0; i < 3; i++) {
        json_t *e = json_array_get(v, (size_t)i);
        if (!json_is_number(e))
            return ditd_err_set(DITD_EFORMAT, "%s: %s[%d] is not a number", path, key, i);
        out[i] = (float)json_number_value(e); /* np.array(mean, dtype=float32) */
    }
    return 0;
}

static int read_proc(json_t *root, const char *path, void *ud)
{
    static const double clip_mean[3] = {0.48145466, 0.4578275, 0.40821073};
    static const double clip_std[3] = {0.26862954, 0.26130258, 0.27577711};
    ditd_clip_image_processor *p = ud;
    const char *key;
    json_t *v;
    int err, code, r;
    if (!json_is_object(root))
        return ditd_err_set(DITD_EFORMAT, "%s: not a JSON object", path);
    json_object_foreach(root, key, v) {
        if (!listed(proc_used, key) && !listed(proc_ignored, key))
            return ditd_err_set(DITD_EUNSUPPORTED, "%s: key \"%s\" is not a CLIPImageProcessor "
                                "setting ditd knows", path, key);
    }
    json_t *t = json_object_get(root, "image_processor_type");
    if (t && json_is_string(t) && strcmp(json_string_value(t), "CLIPImageProcessor") &&
        strcmp(json_string_value(t), "CLIPImageProcessorPil") &&
        strcmp(json_string_value(t), "CLIPImageProcessorFast"))
        return ditd_err_set(DITD_EUNSUPPORTED, "%s: image_processor_type %s (CLIPImageProcessor)",
                            path, json_string_value(t));
    if ((err = ditd_json_get_bool(root, path, "do_resize", 1, &p->do_resize)) ||
        (err = ditd_json_get_bool(root, path, "do_center_crop", 1, &p->do_center_crop)) ||
        (err = ditd_json_get_bool(root, path, "do_rescale", 1, &p->do_rescale)) ||
        (err = ditd_json_get_bool(root, path, "do_normalize", 1, &p->do_normalize)) ||
        (err = ditd_json_get_number(root, path, "rescale_factor", 1.0 / 255.0, NULL,
                                    &p->rescale_factor)) ||
        (err = ditd_json_get_int(root, path, "resample", 3, &code)) ||
        (err = ditd_resample_from_pil(code, &p->resample)) ||
        (err = read_triple(root, path, "image_mean", clip_mean, p->mean)) ||
        (err = read_triple(root, path, "image_std", clip_std, p->std)))
        return err;
    if ((r = read_size(root, path, "size", &p->shortest_edge, &p->size_h, &p->size_w)) < 0)
        return r;
    if (r > 0)
        p->shortest_edge = 224;
    int e;
    if ((r = read_size(root, path, "crop_size", &e, &p->crop_h, &p->crop_w)) < 0)
        return r;
    if (r > 0)
        p->crop_h = p->crop_w = 224;
    else if (e)
        return ditd_err_set(DITD_EUNSUPPORTED, "%s: crop_size must be {\"height\", \"width\"}", path);
    for (int i = 0; i < 3; i++)
        if (!(p->std[i] != 0.0f) || !isfinite(p->std[i]) || !isfinite(p->mean[i]))
            return ditd_err_set(DITD_ERANGE, "%s: image_std[%d] %g / image_mean[%d] %g", path, i,
                                (double)p->std[i], i, (double)p->mean[i]);
    if (!isfinite(p->rescale_factor) || !(p->rescale_factor > 0))
        return ditd_err_set(DITD_ERANGE, "%s: rescale_factor %g", path, p->rescale_factor);
    return 0;
}

int ditd_clip_image_processor_load(const char *path, ditd_clip_image_processor *out)
{
    memset(out, 0, sizeof *out);
    return ditd_json_config_file(path, read_proc, out);
}

/* transformers' get_resize_output_image_size(default_to_square=False) */
static void resized(const ditd_clip_image_processor *p, int w, int h, int *rw, int *rh)
{
    *rw = w;
    *rh = h;
    if (!p->do_resize)
        return;
    if (p->shortest_edge > 0) {
        int s = w <= h ? w : h, l = w <= h ? h : w;
        int ns = p->shortest_edge, nl = (int)((double)ns * l / s); /* int(new_short * long / short) */
        *rw = w <= h ? ns : nl;
        *rh = w <= h ? nl : ns;
    } else {
        *rw = p->size_w;
        *rh = p->size_h;
    }
}

void ditd_clip_image_processor_out_size(const ditd_clip_image_processor *p, int w, int h,
                                        int *ow, int *oh)
{
    resized(p, w, h, ow, oh);
    if (p->do_center_crop) {
        *ow = p->crop_w;
        *oh = p->crop_h;
    }
}

int ditd_clip_image_preprocess(const ditd_clip_image_processor *p, const uint8_t *rgb, int w,
                               int h, float *out)
{
    int rw, rh, err;
    if (w < 1 || h < 1)
        return ditd_err_set(DITD_EINVAL, "image of %dx%d pixels", w, h);
    resized(p, w, h, &rw, &rh);
    if (rw < 1 || rh < 1)
        return ditd_err_set(DITD_EINVAL, "a %dx%d image resizes to %dx%d", w, h, rw, rh);
    int top = 0, left = 0, ow = rw, oh = rh;
    if (p->do_center_crop) {
        if (p->crop_w > rw || p->crop_h > rh)
            return ditd_err_set(DITD_EINVAL, "image_processor: crop_size %dx%d is larger than the "
                                "resized image %dx%d (padding is not supported)", p->crop_w,
                                p->crop_h, rw, rh);
        top = (rh - p->crop_h) / 2;
        left = (rw - p->crop_w) / 2;
        ow = p->crop_w;
        oh = p->crop_h;
    }
    uint8_t *rs = malloc((size_t)rw * rh * 3);
    if (!rs)
        return ditd_err_set(DITD_ENOMEM, "image_processor buffer");
    if ((err = ditd_image_resize(rgb, w, h, 3, rs, rw, rh, p->resample))) {
        free(rs);
        return err;
    }
    size_t plane = (size_t)ow * oh;
    for (int y = 0; y < oh; y++)
        for (int x = 0; x < ow; x++)
            for (int c = 0; c < 3; c++) {
                uint8_t b = rs[((size_t)(y + top) * rw + x + left) * 3 + c];
                /* numpy: image.astype(float64) * scale, then float32 */
                float v = p->do_rescale ? (float)((double)b * p->rescale_factor) : (float)b;
                if (p->do_normalize)
                    v = (v - p->mean[c]) / p->std[c];
                out[(size_t)c * plane + (size_t)y * ow + x] = v;
            }
    free(rs);
    return 0;
}

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
    if (m->w.st)
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
                                 c->act, NULL, 0);
    ops->download(hidden, m->b.h, BN * D);
    return ops->status();
}
