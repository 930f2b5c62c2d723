/* CLIPVisionConfig (image_encoder/config.json) and CLIPImageProcessor
 * (image_processor/preprocessor_config.json): readers and the preprocessing
 * (engine/vision/clip_vision.h). No weights here (the fuzz target builds it
 * alone). */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/error.h"
#include "engine/io/json_config.h"
#include "engine/vision/clip_vision.h"
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

int ditd_clip_vision_config_parse(const char *text, size_t len, const char *name,
                                  const char *class_hint, ditd_clip_vision_config *out)
{
    vision_read r = {class_hint, out};
    memset(out, 0, sizeof *out);
    return ditd_json_config_text(text, len, name, read_vision, &r);
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

int ditd_clip_image_processor_parse(const char *text, size_t len, const char *name,
                                    ditd_clip_image_processor *out)
{
    memset(out, 0, sizeof *out);
    return ditd_json_config_text(text, len, name, read_proc, out);
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
    if ((err = ditd_image_resize_filter(rgb, w, h, 3, rs, rw, rh, p->resample))) {
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

