/* transformer/config.json -> ditd_wan_config (WanTransformer3DModel). */
#include "engine/models/wan/wan_config.h"

#include <jansson.h>
#include <string.h>

#include "engine/core/error.h"
#include "engine/io/json_config.h"
#include "kernels/cpu/cpu_kernels.h"

static int get_patch(json_t *root, const char *path, ditd_wan_config *c)
{
    json_t *v = json_object_get(root, "patch_size"), *e;
    int p[3] = {1, 2, 2};
    size_t i;
    if (v && !json_is_null(v)) {
        if (!json_is_array(v) || json_array_size(v) != 3)
            return ditd_err_set(DITD_EFORMAT,
                                "%s: patch_size must be a list of 3 integers (t, h, w)", path);
        json_array_foreach(v, i, e) {
            if (!json_is_integer(e) || json_integer_value(e) < 1 || json_integer_value(e) > 64)
                return ditd_err_set(DITD_EFORMAT, "%s: patch_size[%zu] must be an integer in 1..64",
                                    path, i);
            p[i] = (int)json_integer_value(e);
        }
    }
    c->patch_t = p[0];
    c->patch_h = p[1];
    c->patch_w = p[2];
    return 0;
}

/* qk_norm: a string or null. Diffusers 0.42 builds norm_q / norm_k as
 * RMSNorm(inner_dim) whatever the value (WanTransformerBlock takes it and
 * does not use it), so every value means rms_norm_across_heads here too. */
static int get_qk_norm(json_t *root, const char *path)
{
    json_t *v = json_object_get(root, "qk_norm");
    if (v && !json_is_null(v) && !json_is_string(v))
        return ditd_err_set(DITD_EFORMAT, "%s: qk_norm must be a string or null", path);
    return 0;
}

/* An optional integer key (absent or null: 0). */
static int get_opt_int(json_t *root, const char *path, const char *key, int *out)
{
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) {
        *out = 0;
        return 0;
    }
    if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > 65536)
        return ditd_err_set(DITD_EFORMAT, "%s: %s must be null or an integer in 1..65536", path,
                            key);
    *out = (int)json_integer_value(v);
    return 0;
}

static int finish(ditd_wan_config *c, const char *what)
{
    if (c->patch_t != 1 || c->patch_h != c->patch_w)
        return ditd_err_set(DITD_EUNSUPPORTED,
                            "%s: patch_size = [%d, %d, %d] is not supported (a temporal patch of 1 and a square spatial patch: every Wan checkpoint has [1, 2, 2])",
                            what, c->patch_t, c->patch_h, c->patch_w);
    if (c->num_heads <= 0 || c->num_heads > 1024)
        return ditd_err_set(DITD_EUNSUPPORTED, "%s: num_attention_heads = %d (1..1024)", what,
                            c->num_heads);
    if (c->head_dim < 6 || c->head_dim % 2 || c->head_dim > DITD_CPU_ATTN_MAX_DH)
        return ditd_err_set(DITD_EUNSUPPORTED,
                            "%s: attention_head_dim = %d (even, 6..%d: three RoPE axes and the attention kernels' limit)",
                            what, c->head_dim, DITD_CPU_ATTN_MAX_DH);
    if (c->in_channels <= 0 || c->in_channels > 4096)
        return ditd_err_set(DITD_EUNSUPPORTED, "%s: in_channels = %d (1..4096)", what,
                            c->in_channels);
    if (c->out_channels == 0)
        c->out_channels = c->in_channels; /* Diffusers: out_channels or in_channels */
    if (c->out_channels < 0 || c->out_channels > 4096)
        return ditd_err_set(DITD_EUNSUPPORTED, "%s: out_channels = %d (1..4096)", what,
                            c->out_channels);
    if (c->text_dim <= 0 || c->text_dim > 65536)
        return ditd_err_set(DITD_EUNSUPPORTED, "%s: text_dim = %d (1..65536)", what, c->text_dim);
    if (c->freq_dim <= 0 || c->freq_dim % 2 || c->freq_dim > 65536)
        return ditd_err_set(DITD_EUNSUPPORTED, "%s: freq_dim = %d (even, 2..65536)", what,
                            c->freq_dim);
    if (c->ffn_dim <= 0 || c->ffn_dim > 1 << 20)
        return ditd_err_set(DITD_EUNSUPPORTED, "%s: ffn_dim = %d (1..1048576)", what, c->ffn_dim);
    if (c->num_layers <= 0 || c->num_layers > 1000)
        return ditd_err_set(DITD_EUNSUPPORTED, "%s: num_layers = %d (1..1000)", what,
                            c->num_layers);
    if (!(c->eps > 0.0f && c->eps < 1.0f))
        return ditd_err_set(DITD_EUNSUPPORTED, "%s: eps = %g (0 < eps < 1)", what, (double)c->eps);
    if (c->rope_max_seq_len <= 0 || c->rope_max_seq_len > 1 << 20)
        return ditd_err_set(DITD_EUNSUPPORTED, "%s: rope_max_seq_len = %d (1..1048576)", what,
                            c->rope_max_seq_len);
    if ((long long)c->num_heads * c->head_dim > 65536)
        return ditd_err_set(DITD_EUNSUPPORTED,
                            "%s: num_attention_heads x attention_head_dim = %lld (at most 65536)",
                            what, (long long)c->num_heads * c->head_dim);
    c->inner_dim = c->num_heads * c->head_dim;
    /* the image branch (Wan 2.1 I2V / FLF2V): the image embedder's output
     * (D wide) is what attn2.add_k_proj reads, and WanAttnProcessor splits
     * the context only when add_k_proj exists, so both or neither */
    if ((c->image_dim > 0) != (c->added_kv_proj_dim > 0))
        return ditd_err_set(DITD_EUNSUPPORTED,
                            "%s: image_dim = %d with added_kv_proj_dim = %d is not supported (both set, or neither: the image embedder feeds attn2.add_k_proj / add_v_proj)",
                            what, c->image_dim, c->added_kv_proj_dim);
    if (c->added_kv_proj_dim && c->added_kv_proj_dim != c->inner_dim)
        return ditd_err_set(DITD_EUNSUPPORTED,
                            "%s: added_kv_proj_dim = %d must equal the inner dim %d (the image embedder's output width)",
                            what, c->added_kv_proj_dim, c->inner_dim);
    if (c->pos_embed_seq_len && (!c->image_dim || c->pos_embed_seq_len % 2))
        return ditd_err_set(DITD_EUNSUPPORTED,
                            "%s: pos_embed_seq_len = %d needs image_dim and an even count (two images' tokens, FLF2V)",
                            what, c->pos_embed_seq_len);
    c->image_len = !c->image_dim ? 0 : c->pos_embed_seq_len ? c->pos_embed_seq_len
                                                             : DITD_WAN_CLIP_TOKENS;
    /* WanRotaryPosEmbed: h_dim = w_dim = 2 * (Dh // 6), t_dim the rest */
    c->rope_h = c->rope_w = 2 * (c->head_dim / 6);
    c->rope_t = c->head_dim - c->rope_h - c->rope_w;
    return 0;
}

static int config_from_json(json_t *root, const char *path, ditd_wan_config *out)
{
    ditd_wan_config c;
    double eps;
    int err;
    memset(&c, 0, sizeof c);
    if (!json_is_object(root))
        return ditd_err_set(DITD_EFORMAT, "%s: not a JSON object", path);
    const char *cls = json_string_value(json_object_get(root, "_class_name"));
    if (cls && strcmp(cls, "WanTransformer3DModel") != 0)
        return ditd_err_set(DITD_EUNSUPPORTED,
                            "%s: _class_name \"%s\" is not supported (WanTransformer3DModel)", path,
                            cls);
    /* Defaults are WanTransformer3DModel.__init__'s. */
    if ((err = get_patch(root, path, &c)) ||
        (err = ditd_json_get_int(root, path, "num_attention_heads", 40, &c.num_heads)) ||
        (err = ditd_json_get_int(root, path, "attention_head_dim", 128, &c.head_dim)) ||
        (err = ditd_json_get_int(root, path, "in_channels", 16, &c.in_channels)) ||
        (err = ditd_json_get_int(root, path, "out_channels", 16, &c.out_channels)) ||
        (err = ditd_json_get_int(root, path, "text_dim", 4096, &c.text_dim)) ||
        (err = ditd_json_get_int(root, path, "freq_dim", 256, &c.freq_dim)) ||
        (err = ditd_json_get_int(root, path, "ffn_dim", 13824, &c.ffn_dim)) ||
        (err = ditd_json_get_int(root, path, "num_layers", 40, &c.num_layers)) ||
        (err = ditd_json_get_bool(root, path, "cross_attn_norm", 1, &c.cross_attn_norm)) ||
        (err = get_qk_norm(root, path)) ||
        (err = ditd_json_get_number(root, path, "eps", 1e-6, NULL, &eps)) ||
        (err = get_opt_int(root, path, "image_dim", &c.image_dim)) ||
        (err = get_opt_int(root, path, "added_kv_proj_dim", &c.added_kv_proj_dim)) ||
        (err = get_opt_int(root, path, "pos_embed_seq_len", &c.pos_embed_seq_len)) ||
        (err = ditd_json_get_int(root, path, "rope_max_seq_len", 1024, &c.rope_max_seq_len)))
        return err;
    /* out_channels: absent is __init__'s 16, null (or 0) is in_channels
     * (Diffusers: out_channels or in_channels) */
    if (json_is_null(json_object_get(root, "out_channels")))
        c.out_channels = 0;
    c.eps = (float)eps;
    if ((err = finish(&c, path)))
        return err;
    *out = c;
    return 0;
}

static int read_json(json_t *root, const char *name, void *out)
{
    return config_from_json(root, name, out);
}

int ditd_wan_config_load(const char *path, ditd_wan_config *out)
{
    return ditd_json_config_file(path, read_json, out);
}

int ditd_wan_config_parse(const char *text, size_t len, const char *name, ditd_wan_config *out)
{
    return ditd_json_config_text(text, len, name, read_json, out);
}
