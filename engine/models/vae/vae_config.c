/* vae/config.json -> ditd_vae_config (AutoencoderKL's __init__ keys). */
#include "engine/models/vae/vae_config.h"

#include <jansson.h>
#include <string.h>
#include <strings.h>

#include "engine/core/error.h"
#include "engine/io/json_config.h"
#include "kernels/cpu/cpu_kernels.h"

/* An array of numbers (or null: *n = 0). */
static int get_num_array(json_t *root, const char *path, const char *key, int cap, int *n,
                         double *out)
{
    json_t *v = json_object_get(root, key);
    *n = 0;
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_array(v))
        return ditd_err_set(DITD_EFORMAT, "%s: %s must be a list of numbers", path, key);
    if ((int)json_array_size(v) > cap)
        return ditd_err_set(DITD_EUNSUPPORTED, "%s: %s has %zu entries (at most %d)", path, key,
                            json_array_size(v), cap);
    for (size_t i = 0; i < json_array_size(v); i++) {
        json_t *e = json_array_get(v, i);
        if (!json_is_number(e))
            return ditd_err_set(DITD_EFORMAT, "%s: %s[%zu] must be a number", path, key, i);
        out[i] = json_number_value(e);
    }
    *n = (int)json_array_size(v);
    return 0;
}

/* A list of block type names that must all equal `accepted`; *n = length. */
static int get_block_types(json_t *root, const char *path, const char *key, const char *accepted,
                           int *n)
{
    json_t *v = json_object_get(root, key);
    *n = -1; /* absent: the default, one block */
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_array(v))
        return ditd_err_set(DITD_EFORMAT, "%s: %s must be a list of strings", path, key);
    for (size_t i = 0; i < json_array_size(v); i++) {
        const char *s = json_string_value(json_array_get(v, i));
        if (!s)
            return ditd_err_set(DITD_EFORMAT, "%s: %s[%zu] must be a string", path, key, i);
        if (strcmp(s, accepted) != 0)
            return ditd_err_set(DITD_EUNSUPPORTED,
                                "%s: %s[%zu] \"%s\" is not supported (ditd supports \"%s\")", path,
                                key, i, s, accepted);
    }
    *n = (int)json_array_size(v);
    return 0;
}

int ditd_vae_config_finish(ditd_vae_config *c, const char *what)
{
    if (c->in_channels < 1 || c->in_channels > 16)
        return ditd_err_set(DITD_EUNSUPPORTED, "%s: in_channels = %d (1..16)", what, c->in_channels);
    if (c->out_channels < 1 || c->out_channels > 16)
        return ditd_err_set(DITD_EUNSUPPORTED, "%s: out_channels = %d (1..16)", what, c->out_channels);
    if (c->latent_channels < 1 || c->latent_channels > DITD_VAE_MAX_LATENT)
        return ditd_err_set(DITD_EUNSUPPORTED, "%s: latent_channels = %d (1..%d)", what,
                            c->latent_channels, DITD_VAE_MAX_LATENT);
    if (c->n_blocks < 1 || c->n_blocks > DITD_VAE_MAX_BLOCKS)
        return ditd_err_set(DITD_EUNSUPPORTED, "%s: block_out_channels has %d entries (1..%d)", what,
                            c->n_blocks, DITD_VAE_MAX_BLOCKS);
    if (c->layers_per_block < 1 || c->layers_per_block > 16)
        return ditd_err_set(DITD_EUNSUPPORTED, "%s: layers_per_block = %d (1..16)", what,
                            c->layers_per_block);
    if (c->norm_num_groups < 1)
        return ditd_err_set(DITD_EUNSUPPORTED, "%s: norm_num_groups = %d", what, c->norm_num_groups);
    for (int i = 0; i < c->n_blocks; i++) {
        int ch = c->block_out_channels[i];
        if (ch < 1 || ch > 4096)
            return ditd_err_set(DITD_EUNSUPPORTED, "%s: block_out_channels[%d] = %d (1..4096)", what,
                                i, ch);
        if (ch % c->norm_num_groups)
            return ditd_err_set(DITD_EUNSUPPORTED,
                                "%s: block_out_channels[%d] = %d is not divisible by norm_num_groups = %d",
                                what, i, ch, c->norm_num_groups);
    }
    /* the mid-block attention's head (block_out_channels[-1]) is checked
     * against the backend the VAE runs on, where it loads */
    if (c->sample_size < 1 || c->sample_size > 65536)
        return ditd_err_set(DITD_EUNSUPPORTED, "%s: sample_size = %d", what, c->sample_size);
    if (!(c->scaling_factor > 0.0) || c->scaling_factor > 1e6)
        return ditd_err_set(DITD_EUNSUPPORTED, "%s: scaling_factor = %g must be positive", what,
                            c->scaling_factor);
    if (c->n_latents_mean && c->n_latents_mean != c->latent_channels)
        return ditd_err_set(DITD_EUNSUPPORTED, "%s: latents_mean has %d entries, latent_channels = %d",
                            what, c->n_latents_mean, c->latent_channels);
    if (c->n_latents_std && c->n_latents_std != c->latent_channels)
        return ditd_err_set(DITD_EUNSUPPORTED, "%s: latents_std has %d entries, latent_channels = %d",
                            what, c->n_latents_std, c->latent_channels);
    return 0;
}

static int config_from_json(json_t *root, const char *path, ditd_vae_config *out)
{
    ditd_vae_config c;
    int err, has_scaling, nd, nu;
    const char *cls, *act = "silu";
    json_t *v;

    memset(&c, 0, sizeof c);
    if (!json_is_object(root))
        return ditd_err_set(DITD_EFORMAT, "%s: not a JSON object", path);
    cls = json_string_value(json_object_get(root, "_class_name"));
    if (cls && strcmp(cls, "AutoencoderKL") != 0)
        return ditd_err_set(DITD_EUNSUPPORTED, "%s: _class_name \"%s\" is not supported (AutoencoderKL)",
                            path, cls);
    /* Defaults are AutoencoderKL.__init__'s. */
    if ((err = ditd_json_get_int(root, path, "in_channels", 3, &c.in_channels)) ||
        (err = ditd_json_get_int(root, path, "out_channels", 3, &c.out_channels)) ||
        (err = ditd_json_get_int(root, path, "latent_channels", 4, &c.latent_channels)) ||
        (err = ditd_json_get_int(root, path, "layers_per_block", 1, &c.layers_per_block)) ||
        (err = ditd_json_get_int(root, path, "norm_num_groups", 32, &c.norm_num_groups)) ||
        (err = ditd_json_get_number(root, path, "scaling_factor", 0.18215, &has_scaling, &c.scaling_factor)) ||
        (err = ditd_json_get_number(root, path, "shift_factor", 0.0, &c.has_shift_factor, &c.shift_factor)) ||
        (err = get_num_array(root, path, "latents_mean", DITD_VAE_MAX_LATENT, &c.n_latents_mean,
                             c.latents_mean)) ||
        (err = get_num_array(root, path, "latents_std", DITD_VAE_MAX_LATENT, &c.n_latents_std,
                             c.latents_std)) ||
        (err = ditd_json_get_bool(root, path, "force_upcast", 1, &c.force_upcast)) ||
        (err = ditd_json_get_bool(root, path, "use_quant_conv", 1, &c.use_quant_conv)) ||
        (err = ditd_json_get_bool(root, path, "use_post_quant_conv", 1, &c.use_post_quant_conv)) ||
        (err = ditd_json_get_bool(root, path, "mid_block_add_attention", 1, &c.mid_block_add_attention)) ||
        (err = get_block_types(root, path, "down_block_types", "DownEncoderBlock2D", &nd)) ||
        (err = get_block_types(root, path, "up_block_types", "UpDecoderBlock2D", &nu)))
        return err;
    (void)has_scaling; /* absent: the class default */
    if ((v = json_object_get(root, "act_fn")) && !json_is_null(v)) {
        if (!json_is_string(v))
            return ditd_err_set(DITD_EFORMAT, "%s: act_fn must be a string", path);
        act = json_string_value(v);
    }
    if (strcmp(act, "silu") != 0 && strcmp(act, "swish") != 0)
        return ditd_err_set(DITD_EUNSUPPORTED, "%s: act_fn \"%s\" is not supported (silu, swish)", path,
                            act);
    /* sample_size: an int, or [h, w] (equal sides only: the tiles are square) */
    c.sample_size = 32;
    if ((v = json_object_get(root, "sample_size")) && !json_is_null(v)) {
        if (json_is_integer(v)) {
            if ((err = ditd_json_get_int(root, path, "sample_size", 32, &c.sample_size)))
                return err;
        } else if (json_is_array(v) && json_array_size(v) == 2 &&
                   json_is_integer(json_array_get(v, 0)) && json_is_integer(json_array_get(v, 1))) {
            json_int_t a = json_integer_value(json_array_get(v, 0));
            json_int_t b = json_integer_value(json_array_get(v, 1));
            if (a != b)
                return ditd_err_set(DITD_EUNSUPPORTED, "%s: sample_size [%lld, %lld]: only square tiles",
                                    path, (long long)a, (long long)b);
            if (a < 1 || a > 65536)
                return ditd_err_set(DITD_ERANGE, "%s: sample_size = %lld", path, (long long)a);
            c.sample_size = (int)a;
        } else {
            return ditd_err_set(DITD_EFORMAT, "%s: sample_size must be an integer or [h, w]", path);
        }
    }
    /* block_out_channels (default (64,)) */
    v = json_object_get(root, "block_out_channels");
    if (!v || json_is_null(v)) {
        c.n_blocks = 1;
        c.block_out_channels[0] = 64;
    } else {
        if (!json_is_array(v) || json_array_size(v) == 0)
            return ditd_err_set(DITD_EFORMAT, "%s: block_out_channels must be a non-empty list", path);
        if (json_array_size(v) > DITD_VAE_MAX_BLOCKS)
            return ditd_err_set(DITD_EUNSUPPORTED, "%s: block_out_channels has %zu entries (1..%d)",
                                path, json_array_size(v), DITD_VAE_MAX_BLOCKS);
        c.n_blocks = (int)json_array_size(v);
        for (int i = 0; i < c.n_blocks; i++) {
            json_t *e = json_array_get(v, (size_t)i);
            if (!json_is_integer(e))
                return ditd_err_set(DITD_EFORMAT, "%s: block_out_channels[%d] must be an integer", path, i);
            json_int_t ch = json_integer_value(e);
            if (ch < 1 || ch > 4096)
                return ditd_err_set(DITD_EUNSUPPORTED, "%s: block_out_channels[%d] = %lld (1..4096)",
                                    path, i, (long long)ch);
            c.block_out_channels[i] = (int)ch;
        }
    }
    if (nd < 0)
        nd = 1;
    if (nu < 0)
        nu = 1;
    if (nd != c.n_blocks)
        return ditd_err_set(DITD_EUNSUPPORTED,
                            "%s: down_block_types has %d entries, block_out_channels %d (one block per width)",
                            path, nd, c.n_blocks);
    if (nu != c.n_blocks)
        return ditd_err_set(DITD_EUNSUPPORTED,
                            "%s: up_block_types has %d entries, block_out_channels %d (one block per width)",
                            path, nu, c.n_blocks);
    if ((err = ditd_vae_config_finish(&c, path)))
        return err;
    *out = c;
    return 0;
}

static int read_json(json_t *root, const char *name, void *out)
{
    return config_from_json(root, name, out);
}

int ditd_vae_config_load(const char *path, ditd_vae_config *out)
{
    return ditd_json_config_file(path, read_json, out);
}

int ditd_vae_config_parse(const char *text, size_t len, const char *name, ditd_vae_config *out)
{
    return ditd_json_config_text(text, len, name, read_json, out);
}

int ditd_vae_latent_side(const ditd_vae_config *c, int image_side)
{
    for (int i = 0; i < c->n_blocks - 1; i++)
        image_side = (image_side + 1 - 3) / 2 + 1; /* pad (0, 1), k 3, stride 2 */
    return image_side;
}

int ditd_vae_config_scale_factor(const ditd_vae_config *c)
{
    return 1 << (c->n_blocks - 1);
}

int ditd_vae_config_named(const char *name, ditd_vae_config *out)
{
    ditd_vae_config c;
    memset(&c, 0, sizeof c);
    c.in_channels = c.out_channels = 3;
    c.n_blocks = 4;
    c.block_out_channels[0] = 128;
    c.block_out_channels[1] = 256;
    c.block_out_channels[2] = 512;
    c.block_out_channels[3] = 512;
    c.layers_per_block = 2;
    c.norm_num_groups = 32;
    c.force_upcast = 1;
    c.mid_block_add_attention = 1;
    if (strcasecmp(name, "sd-vae-ft-ema") == 0 || strcasecmp(name, "sd-vae-ft-mse") == 0) {
        c.latent_channels = 4;
        c.sample_size = 256;
        c.scaling_factor = 0.18215;
        c.use_quant_conv = c.use_post_quant_conv = 1;
    } else if (strcasecmp(name, "flux-vae") == 0) {
        c.latent_channels = 16;
        c.sample_size = 1024;
        c.scaling_factor = 0.3611;
        c.has_shift_factor = 1;
        c.shift_factor = 0.1159;
    } else {
        return ditd_err_set(DITD_EINVAL, "unknown VAE config \"%s\" (sd-vae-ft-ema, sd-vae-ft-mse, flux-vae)",
                            name);
    }
    int err = ditd_vae_config_finish(&c, name);
    if (!err)
        *out = c;
    return err;
}

static double conv_flops(int cin, int cout, int k, double hw)
{
    return 2.0 * cin * cout * k * k * hw;
}

static double resnet_flops(int cin, int cout, double hw)
{
    return conv_flops(cin, cout, 3, hw) + conv_flops(cout, cout, 3, hw) +
           (cin != cout ? conv_flops(cin, cout, 1, hw) : 0.0);
}

double ditd_vae_config_decode_flops(const ditd_vae_config *c, int h, int w)
{
    const int top = c->block_out_channels[c->n_blocks - 1];
    double hw = (double)h * w, f = 0.0;
    if (c->use_post_quant_conv)
        f += conv_flops(c->latent_channels, c->latent_channels, 1, hw);
    f += conv_flops(c->latent_channels, top, 3, hw);
    f += 2.0 * resnet_flops(top, top, hw);
    if (c->mid_block_add_attention)
        f += 4.0 * 2.0 * top * top * hw + 2.0 * 2.0 * hw * hw * top;
    int prev = top;
    for (int i = 0; i < c->n_blocks; i++) {
        int ch = c->block_out_channels[c->n_blocks - 1 - i];
        for (int j = 0; j <= c->layers_per_block; j++) {
            f += resnet_flops(prev, ch, hw);
            prev = ch;
        }
        if (i != c->n_blocks - 1) {
            hw *= 4.0;
            f += conv_flops(ch, ch, 3, hw);
        }
    }
    return f + conv_flops(c->block_out_channels[0], c->out_channels, 3, hw);
}
