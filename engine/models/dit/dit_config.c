/* transformer/config.json -> ditd_dit_config. */
#include "engine/models/dit/dit_config.h"

#include <ctype.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "engine/core/error.h"
#include "engine/io/json_config.h"
#include "kernels/cpu/cpu_kernels.h"

/* A string key that must equal one of the accepted values (or be absent). */
static int check_str(json_t *root, const char *path, const char *key, const char *dflt,
                     const char *accepted)
{
    json_t *v = json_object_get(root, key);
    const char *s = dflt;
    if (v && !json_is_null(v)) {
        if (!json_is_string(v))
            return ditd_err_set(DITD_EFORMAT, "%s: %s must be a string", path, key);
        s = json_string_value(v);
    }
    if (strcmp(s, accepted) != 0)
        return ditd_err_set(DITD_EUNSUPPORTED, "%s: %s \"%s\" is not supported (ditd supports \"%s\")",
                            path, key, s, accepted);
    return 0;
}

int ditd_dit_config_finish(ditd_dit_config *c, const char *what)
{
    if (c->in_channels <= 0 || c->in_channels > 64)
        return ditd_err_set(DITD_EUNSUPPORTED, "%s: in_channels = %d (1..64)", what, c->in_channels);
    if (c->out_channels <= 0 || c->out_channels > 128)
        return ditd_err_set(DITD_EUNSUPPORTED, "%s: out_channels = %d (1..128)", what, c->out_channels);
    if (c->out_channels != c->in_channels && c->out_channels != 2 * c->in_channels)
        return ditd_err_set(DITD_EUNSUPPORTED,
                            "%s: out_channels = %d must equal in_channels (%d) or twice it (learned sigma)",
                            what, c->out_channels, c->in_channels);
    if (c->patch_size <= 0 || c->patch_size > 16)
        return ditd_err_set(DITD_EUNSUPPORTED, "%s: patch_size = %d (1..16)", what, c->patch_size);
    if (c->sample_size <= 0 || c->sample_size > 4096 || c->sample_size % c->patch_size)
        return ditd_err_set(DITD_EUNSUPPORTED,
                            "%s: sample_size = %d must be positive and divisible by patch_size = %d",
                            what, c->sample_size, c->patch_size);
    if (c->num_layers <= 0 || c->num_layers > 1000)
        return ditd_err_set(DITD_EUNSUPPORTED, "%s: num_layers = %d (1..1000)", what, c->num_layers);
    if (c->num_heads <= 0 || c->num_heads > 1024 || c->head_dim <= 0 || c->head_dim > 1024)
        return ditd_err_set(DITD_EUNSUPPORTED, "%s: num_attention_heads = %d, attention_head_dim = %d",
                            what, c->num_heads, c->head_dim);
    /* the attention's limit is the backend's: asked where the model loads
     * (ditd_backend_check_head_dim) */
    c->inner_dim = c->num_heads * c->head_dim;
    if (c->inner_dim % 4)
        return ditd_err_set(DITD_EUNSUPPORTED,
                            "%s: inner dim %d x %d = %d must be divisible by 4 (2-D sin-cos embedding)",
                            what, c->num_heads, c->head_dim, c->inner_dim);
    if (c->num_embeds_ada_norm <= 0 || c->num_embeds_ada_norm > 1000000)
        return ditd_err_set(DITD_EUNSUPPORTED, "%s: num_embeds_ada_norm = %d (a class-conditional DiT needs it)",
                            what, c->num_embeds_ada_norm);
    if (!(c->norm_eps > 0.0f) || c->norm_eps > 1.0f)
        return ditd_err_set(DITD_EUNSUPPORTED, "%s: norm_eps = %g", what, (double)c->norm_eps);
    c->ff_dim = 4 * c->inner_dim;
    c->learned_sigma = c->out_channels == 2 * c->in_channels;
    return 0;
}

static int config_from_json(json_t *root, const char *path, ditd_dit_config *out)
{
    int err, aff = 0;
    double eps = 1e-5;
    const char *cls;
    ditd_dit_config c;

    memset(&c, 0, sizeof c);
    if (!json_is_object(root))
        return ditd_err_set(DITD_EFORMAT, "%s: not a JSON object", path);
    cls = json_string_value(json_object_get(root, "_class_name"));
    if (cls && strcmp(cls, "DiTTransformer2DModel") != 0)
        return ditd_err_set(DITD_EUNSUPPORTED,
                            "%s: _class_name \"%s\" is not supported (DiTTransformer2DModel)", path, cls);
    /* Defaults are DiTTransformer2DModel's __init__ defaults. */
    if ((err = ditd_json_get_int(root, path, "in_channels", 4, &c.in_channels)) ||
        (err = ditd_json_get_int(root, path, "out_channels", 0, &c.out_channels)) ||
        (err = ditd_json_get_int(root, path, "sample_size", 32, &c.sample_size)) ||
        (err = ditd_json_get_int(root, path, "patch_size", 2, &c.patch_size)) ||
        (err = ditd_json_get_int(root, path, "num_layers", 28, &c.num_layers)) ||
        (err = ditd_json_get_int(root, path, "num_attention_heads", 16, &c.num_heads)) ||
        (err = ditd_json_get_int(root, path, "attention_head_dim", 72, &c.head_dim)) ||
        (err = ditd_json_get_int(root, path, "num_embeds_ada_norm", 1000, &c.num_embeds_ada_norm)) ||
        (err = ditd_json_get_bool(root, path, "attention_bias", 1, &c.attention_bias)) ||
        (err = ditd_json_get_bool(root, path, "norm_elementwise_affine", 0, &aff)) ||
        (err = ditd_json_get_number(root, path, "norm_eps", 1e-5, NULL, &eps)) ||
        (err = check_str(root, path, "norm_type", "ada_norm_zero", "ada_norm_zero")) ||
        (err = check_str(root, path, "activation_fn", "gelu-approximate", "gelu-approximate")))
        return err;
    if (c.out_channels == 0)
        c.out_channels = c.in_channels;
    if (aff)
        return ditd_err_set(DITD_EUNSUPPORTED, "%s: norm_elementwise_affine true is not supported", path);
    c.norm_eps = (float)eps;
    c.activation = DITD_ACT_GELU_TANH;
    if ((err = ditd_dit_config_finish(&c, path)))
        return err;
    *out = c;
    return 0;
}

static int read_json(json_t *root, const char *name, void *out)
{
    return config_from_json(root, name, out);
}

int ditd_dit_config_load(const char *path, ditd_dit_config *out)
{
    return ditd_json_config_file(path, read_json, out);
}

int ditd_dit_config_parse(const char *text, size_t len, const char *name, ditd_dit_config *out)
{
    return ditd_json_config_text(text, len, name, read_json, out);
}

int ditd_dit_config_named(const char *name, int sample_size, ditd_dit_config *out)
{
    static const struct {
        const char *size;
        int layers, heads;
    } sizes[] = {{"S", 12, 6}, {"B", 12, 12}, {"L", 24, 16}, {"XL", 28, 16}};
    char sz[8];
    int patch;
    ditd_dit_config c;

    if (strncasecmp(name, "DiT-", 4) != 0 ||
        sscanf(name + 4, "%7[A-Za-z]/%d", sz, &patch) != 2)
        return ditd_err_set(DITD_EINVAL, "unknown config \"%s\" (DiT-S/2, DiT-B/2, DiT-L/2, DiT-XL/2, /4, /8)",
                            name);
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        if (strcasecmp(sz, sizes[i].size) != 0)
            continue;
        memset(&c, 0, sizeof c);
        c.in_channels = 4;
        c.out_channels = 8;
        c.sample_size = sample_size;
        c.patch_size = patch;
        c.num_layers = sizes[i].layers;
        c.num_heads = sizes[i].heads;
        /* DiT-S/B/L/XL widths are 384/768/1024/1152 = heads x 64, x 64, x 64, x 72. */
        c.head_dim = strcasecmp(sz, "XL") == 0 ? 72 : 64;
        c.num_embeds_ada_norm = 1000;
        c.attention_bias = 1;
        c.norm_eps = 1e-5f;
        c.activation = DITD_ACT_GELU_TANH;
        int err = ditd_dit_config_finish(&c, name);
        if (err)
            return err;
        *out = c;
        return 0;
    }
    return ditd_err_set(DITD_EINVAL, "unknown config \"%s\" (DiT-S/2, DiT-B/2, DiT-L/2, DiT-XL/2)", name);
}

long long ditd_dit_config_params(const ditd_dit_config *c)
{
    long long D = c->inner_dim, F = c->ff_dim, p = c->patch_size;
    long long per_block = (256 * D + D) + (D * D + D) + (long long)(c->num_embeds_ada_norm + 1) * D +
                          (6 * D * D + 6 * D) + 3 * (D * D + (c->attention_bias ? D : 0)) +
                          (D * D + D) + (F * D + F) + (D * F + D);
    return c->num_layers * per_block + (D * c->in_channels * p * p + D) + (2 * D * D + 2 * D) +
           (p * p * c->out_channels * D + p * p * c->out_channels);
}

double ditd_dit_config_flops(const ditd_dit_config *c, int B, int N)
{
    double D = c->inner_dim, F = c->ff_dim, p = c->patch_size, T = (double)B * N;
    double per_block = 2.0 * T * (3 * D * D + D * D + 2 * D * F) /* qkv, out, mlp */
                       + 2.0 * 2.0 * B * (double)N * N * D      /* qk^T and pv */
                       + 2.0 * B * (256 * D + D * D + 6 * D * D); /* embeddings, adaLN */
    return c->num_layers * per_block + 2.0 * T * D * c->in_channels * p * p +
           2.0 * B * 2 * D * D + 2.0 * T * p * p * c->out_channels * D;
}

void ditd_dit_config_shapes(const ditd_dit_config *c, ditd_denoiser_shapes *out)
{
    int g = c->sample_size / c->patch_size;
    *out = (ditd_denoiser_shapes){
        .in_channels = c->in_channels,
        .out_channels = c->out_channels,
        .height = c->sample_size,
        .width = c->sample_size,
        .heads = c->num_heads,
        .head_dim = c->head_dim,
        .tokens = g * g,
        .prefix_tokens = 0,
        .cond = {.kind = DITD_COND_CLASS, .num_classes = c->num_embeds_ada_norm},
    };
}
