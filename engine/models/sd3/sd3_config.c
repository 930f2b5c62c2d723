/* transformer/config.json -> ditd_sd3_config (SD3Transformer2DModel). */
#include "engine/models/sd3/sd3_config.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "engine/core/error.h"
#include "engine/io/json_config.h"
#include "kernels/cpu/cpu_kernels.h"

const char *ditd_sd3_qk_norm_name(ditd_sd3_qk_norm q)
{
    return q == DITD_SD3_QK_RMS ? "rms_norm" : "none";
}

int ditd_sd3_qk_norm_from_str(const char *s, ditd_sd3_qk_norm *out)
{
    if (s && strcmp(s, "none") == 0) {
        *out = DITD_SD3_QK_NONE;
        return 0;
    }
    if (s && strcmp(s, "rms_norm") == 0) {
        *out = DITD_SD3_QK_RMS;
        return 0;
    }
    return ditd_err_set(DITD_EUNSUPPORTED,
                        "qk_norm = \"%s\" is not supported (null or \"rms_norm\", as SD3 and SD3.5 use)",
                        s ? s : "(null)");
}

static int get_qk_norm(json_t *root, const char *path, ditd_sd3_qk_norm *out)
{
    json_t *v = json_object_get(root, "qk_norm");
    *out = DITD_SD3_QK_NONE;
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_string(v))
        return ditd_err_set(DITD_EFORMAT, "%s: qk_norm must be null or a string", path);
    /* "none" is this struct's name for null, not a value Diffusers takes */
    if (strcmp(json_string_value(v), "none") == 0 ||
        ditd_sd3_qk_norm_from_str(json_string_value(v), out)) {
        char d[400];
        snprintf(d, sizeof d, "%s", json_string_value(v));
        return ditd_err_set(DITD_EUNSUPPORTED,
                            "%s: qk_norm = \"%s\" is not supported (null or \"rms_norm\", as SD3 and SD3.5 use)",
                            path, d);
    }
    return 0;
}

/* out_channels: absent = 16 (the __init__ default), null = in_channels. */
static int get_out_channels(json_t *root, const char *path, int *out)
{
    json_t *v = json_object_get(root, "out_channels");
    if (v && json_is_null(v)) {
        *out = 0; /* in_channels, filled by _finish */
        return 0;
    }
    return ditd_json_get_int(root, path, "out_channels", 16, out);
}

/* dual_attention_layers: a list of block indices into idx (n of them),
 * checked against num_layers in _finish. */
static int get_dual(json_t *root, const char *path, int *idx, int *n)
{
    json_t *v = json_object_get(root, "dual_attention_layers"), *e;
    size_t i;
    *n = 0;
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_array(v))
        return ditd_err_set(DITD_EFORMAT,
                            "%s: dual_attention_layers must be a list of block indices", path);
    if (json_array_size(v) > DITD_SD3_MAX_LAYERS)
        return ditd_err_set(DITD_EUNSUPPORTED,
                            "%s: dual_attention_layers has %zu entries (at most %d)", path,
                            json_array_size(v), DITD_SD3_MAX_LAYERS);
    json_array_foreach(v, i, e) {
        if (!json_is_integer(e))
            return ditd_err_set(DITD_EFORMAT, "%s: dual_attention_layers[%zu] must be an integer",
                                path, i);
        json_int_t k = json_integer_value(e);
        if (k < 0 || k >= DITD_SD3_MAX_LAYERS)
            return ditd_err_set(DITD_EUNSUPPORTED,
                                "%s: dual_attention_layers[%zu] = %lld is not a block index",
                                path, i, (long long)k);
        idx[(*n)++] = (int)k;
    }
    return 0;
}

int ditd_sd3_config_finish(ditd_sd3_config *c, const char *what)
{
    if (c->patch_size <= 0 || c->patch_size > 16)
        return ditd_err_set(DITD_EUNSUPPORTED, "%s: patch_size = %d (1..16)", what, c->patch_size);
    if (c->in_channels <= 0 || c->in_channels > 1024)
        return ditd_err_set(DITD_EUNSUPPORTED, "%s: in_channels = %d (1..1024)", what,
                            c->in_channels);
    if (c->out_channels == 0)
        c->out_channels = c->in_channels; /* Diffusers: out_channels or in_channels */
    if (c->out_channels < 0 || c->out_channels > 1024)
        return ditd_err_set(DITD_EUNSUPPORTED, "%s: out_channels = %d (1..1024)", what,
                            c->out_channels);
    if (c->num_layers <= 0 || c->num_layers > DITD_SD3_MAX_LAYERS)
        return ditd_err_set(DITD_EUNSUPPORTED, "%s: num_layers = %d (1..%d)", what, c->num_layers,
                            DITD_SD3_MAX_LAYERS);
    if (c->num_heads <= 0 || c->num_heads > 1024)
        return ditd_err_set(DITD_EUNSUPPORTED, "%s: num_attention_heads = %d (1..1024)", what,
                            c->num_heads);
    /* the attention's limit is the backend's (ditd_backend_check_head_dim, at load) */
    if (c->head_dim <= 0 || c->head_dim > 65536)
        return ditd_err_set(DITD_EUNSUPPORTED, "%s: attention_head_dim = %d (1..65536)", what,
                            c->head_dim);
    int D = c->num_heads * c->head_dim;
    if (D % 4)
        return ditd_err_set(DITD_EUNSUPPORTED,
                            "%s: num_attention_heads x attention_head_dim = %d must be a multiple of 4 (the 2-D sincos positional embedding)",
                            what, D);
    if (c->caption_projection_dim != D)
        return ditd_err_set(DITD_EUNSUPPORTED,
                            "%s: caption_projection_dim = %d is not supported (the joint blocks need num_attention_heads x attention_head_dim = %d)",
                            what, c->caption_projection_dim, D);
    if (c->joint_attention_dim <= 0 || c->joint_attention_dim > 65536)
        return ditd_err_set(DITD_EUNSUPPORTED, "%s: joint_attention_dim = %d (1..65536)", what,
                            c->joint_attention_dim);
    if (c->pooled_dim <= 0 || c->pooled_dim > 65536)
        return ditd_err_set(DITD_EUNSUPPORTED, "%s: pooled_projection_dim = %d (1..65536)", what,
                            c->pooled_dim);
    if (c->pos_embed_max_size <= 0 || c->pos_embed_max_size > 4096)
        return ditd_err_set(DITD_EUNSUPPORTED,
                            "%s: pos_embed_max_size = %d is not supported (1..4096; every SD3 checkpoint sets it)",
                            what, c->pos_embed_max_size);
    if (c->sample_size < c->patch_size || c->sample_size > 65536)
        return ditd_err_set(DITD_EUNSUPPORTED, "%s: sample_size = %d (patch_size = %d..65536)",
                            what, c->sample_size, c->patch_size);
    if ((unsigned)c->qk_norm > DITD_SD3_QK_RMS)
        return ditd_err_set(DITD_EUNSUPPORTED, "%s: qk_norm %d", what, (int)c->qk_norm);
    c->n_dual = 0;
    for (int l = 0; l < DITD_SD3_MAX_LAYERS; l++) {
        if (c->dual[l] && l >= c->num_layers)
            return ditd_err_set(DITD_EUNSUPPORTED,
                                "%s: dual_attention_layers names block %d, but num_layers = %d",
                                what, l, c->num_layers);
        c->n_dual += c->dual[l] != 0;
    }
    c->inner_dim = D;
    c->mlp_dim = 4 * D;
    return 0;
}

static int config_from_json(json_t *root, const char *path, ditd_sd3_config *out)
{
    ditd_sd3_config c;
    int idx[DITD_SD3_MAX_LAYERS];
    int err, n_idx = 0;
    memset(&c, 0, sizeof c);
    if (!json_is_object(root))
        return ditd_err_set(DITD_EFORMAT, "%s: not a JSON object", path);
    const char *cls = json_string_value(json_object_get(root, "_class_name"));
    if (cls && strcmp(cls, "SD3Transformer2DModel") != 0)
        return ditd_err_set(DITD_EUNSUPPORTED,
                            "%s: _class_name \"%s\" is not supported (SD3Transformer2DModel)", path,
                            cls);
    /* Defaults are SD3Transformer2DModel.__init__'s. */
    if ((err = ditd_json_get_int(root, path, "sample_size", 128, &c.sample_size)) ||
        (err = ditd_json_get_int(root, path, "patch_size", 2, &c.patch_size)) ||
        (err = ditd_json_get_int(root, path, "in_channels", 16, &c.in_channels)) ||
        (err = get_out_channels(root, path, &c.out_channels)) ||
        (err = ditd_json_get_int(root, path, "num_layers", 18, &c.num_layers)) ||
        (err = ditd_json_get_int(root, path, "attention_head_dim", 64, &c.head_dim)) ||
        (err = ditd_json_get_int(root, path, "num_attention_heads", 18, &c.num_heads)) ||
        (err = ditd_json_get_int(root, path, "joint_attention_dim", 4096, &c.joint_attention_dim)) ||
        (err = ditd_json_get_int(root, path, "caption_projection_dim", 1152,
                                 &c.caption_projection_dim)) ||
        (err = ditd_json_get_int(root, path, "pooled_projection_dim", 2048, &c.pooled_dim)) ||
        (err = ditd_json_get_int(root, path, "pos_embed_max_size", 0, &c.pos_embed_max_size)) ||
        (err = get_qk_norm(root, path, &c.qk_norm)) || (err = get_dual(root, path, idx, &n_idx)))
        return err;
    /* pos_embed_max_size: absent is the __init__ default 96; null is "none" (refused) */
    json_t *pm = json_object_get(root, "pos_embed_max_size");
    if (!pm)
        c.pos_embed_max_size = 96;
    for (int i = 0; i < n_idx; i++)
        c.dual[idx[i]] = 1;
    if ((err = ditd_sd3_config_finish(&c, path)))
        return err;
    *out = c;
    return 0;
}

static int read_json(json_t *root, const char *name, void *out)
{
    return config_from_json(root, name, out);
}

int ditd_sd3_config_load(const char *path, ditd_sd3_config *out)
{
    return ditd_json_config_file(path, read_json, out);
}

int ditd_sd3_config_parse(const char *text, size_t len, const char *name, ditd_sd3_config *out)
{
    return ditd_json_config_text(text, len, name, read_json, out);
}
