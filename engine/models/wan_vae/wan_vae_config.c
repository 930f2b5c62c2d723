/* vae/config.json -> ditd_wan_vae_config (AutoencoderKLWan's __init__ keys). */
#include "engine/models/wan_vae/wan_vae_config.h"

#include <jansson.h>
#include <math.h>
#include <string.h>

#include "engine/core/error.h"
#include "engine/io/json_config.h"

/* AutoencoderKLWan's defaults (Wan 2.1's published statistics). */
static const double default_mean[16] = {-0.7571, -0.7089, -0.9113, 0.1075, -0.1745, 0.9653,
                                        -0.1517, 1.5508,  0.4134,  -0.0715, 0.5517, -0.3632,
                                        -0.1922, -0.9497, 0.2503,  -0.2921};
static const double default_std[16] = {2.8184, 1.4541, 2.3275, 2.6558, 1.2196, 1.7708,
                                       2.6052, 2.0743, 3.2687, 2.1526, 2.8652, 1.5579,
                                       1.6382, 1.1253, 2.8251, 1.9160};

static int get_num_list(json_t *root, const char *path, const char *key, int cap, int *n,
                        double *out, int *given)
{
    json_t *v = json_object_get(root, key);
    *given = v && !json_is_null(v);
    if (!*given)
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

static int get_int_list(json_t *root, const char *path, const char *key, int cap, int *n, int *out)
{
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v))
        return 0; /* the default stays */
    if (!json_is_array(v) || json_array_size(v) == 0)
        return ditd_err_set(DITD_EFORMAT, "%s: %s must be a non-empty list of integers", path, key);
    if ((int)json_array_size(v) > cap)
        return ditd_err_set(DITD_EUNSUPPORTED, "%s: %s has %zu entries (at most %d)", path, key,
                            json_array_size(v), cap);
    for (size_t i = 0; i < json_array_size(v); i++) {
        json_t *e = json_array_get(v, i);
        if (!json_is_integer(e) || json_integer_value(e) < 1 || json_integer_value(e) > 64)
            return ditd_err_set(DITD_EFORMAT, "%s: %s[%zu] must be an integer in 1..64", path, key, i);
        out[i] = (int)json_integer_value(e);
    }
    *n = (int)json_array_size(v);
    return 0;
}

static int get_bool_list(json_t *root, const char *path, const char *key, int cap, int *n, int *out)
{
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_array(v))
        return ditd_err_set(DITD_EFORMAT, "%s: %s must be a list of booleans", path, key);
    if ((int)json_array_size(v) > cap)
        return ditd_err_set(DITD_EUNSUPPORTED, "%s: %s has %zu entries (at most %d)", path, key,
                            json_array_size(v), cap);
    for (size_t i = 0; i < json_array_size(v); i++) {
        json_t *e = json_array_get(v, i);
        if (!json_is_boolean(e))
            return ditd_err_set(DITD_EFORMAT, "%s: %s[%zu] must be true or false", path, key, i);
        out[i] = json_is_true(e);
    }
    *n = (int)json_array_size(v);
    return 0;
}

/* An integer or null (null: *out = dflt_null). */
static int get_int_or_null(json_t *root, const char *path, const char *key, int dflt, int dflt_null,
                           int *out)
{
    json_t *v = json_object_get(root, key);
    if (v && json_is_null(v)) {
        *out = dflt_null;
        return 0;
    }
    return ditd_json_get_int(root, path, key, dflt, out);
}

int ditd_wan_vae_config_time_factor(const ditd_wan_vae_config *c)
{
    int k = 0;
    for (int i = 0; i < c->n_mult - 1; i++)
        k += c->temperal_downsample[i] != 0;
    return 1 << k;
}

int ditd_wan_vae_config_scale_factor(const ditd_wan_vae_config *c)
{
    return (1 << (c->n_mult - 1)) * c->patch_size;
}

int ditd_wan_vae_config_frames(const ditd_wan_vae_config *c, int T)
{
    return T < 1 ? 0 : 1 + ditd_wan_vae_config_time_factor(c) * (T - 1);
}

static int check(const ditd_wan_vae_config *c, const char *path)
{
    const int n = c->n_mult, p2 = c->patch_size * c->patch_size;
    int k = 0;
    if (c->base_dim < 1 || c->base_dim > 4096)
        return ditd_err_set(DITD_EUNSUPPORTED, "%s: base_dim = %d (1..4096)", path, c->base_dim);
    if (c->decoder_base_dim < 1 || c->decoder_base_dim > 4096)
        return ditd_err_set(DITD_EUNSUPPORTED, "%s: decoder_base_dim = %d (1..4096)", path,
                            c->decoder_base_dim);
    if (c->z_dim < 1 || c->z_dim > DITD_WAN_VAE_MAX_Z)
        return ditd_err_set(DITD_EUNSUPPORTED, "%s: z_dim = %d (1..%d)", path, c->z_dim,
                            DITD_WAN_VAE_MAX_Z);
    if (n < 1)
        return ditd_err_set(DITD_EUNSUPPORTED, "%s: dim_mult is empty", path);
    if (c->num_res_blocks < 1 || c->num_res_blocks > 16)
        return ditd_err_set(DITD_EUNSUPPORTED, "%s: num_res_blocks = %d (1..16)", path,
                            c->num_res_blocks);
    for (int i = 0; i < n - 1; i++)
        k += c->temperal_downsample[i] != 0;
    if (k > 2)
        return ditd_err_set(DITD_EUNSUPPORTED,
                            "%s: temperal_downsample has %d temporal downsamples (at most 2: "
                            "the encoder's chunks of 4 frames)", path, k);
    if (c->patch_size < 1 || c->patch_size > 8)
        return ditd_err_set(DITD_EUNSUPPORTED, "%s: patch_size = %d (null or 1..8)", path,
                            c->patch_size);
    if (c->in_channels < 1 || c->in_channels > 256 || c->in_channels % p2)
        return ditd_err_set(DITD_EUNSUPPORTED,
                            "%s: in_channels = %d (1..256, a multiple of patch_size^2 = %d)", path,
                            c->in_channels, p2);
    if (c->out_channels < 1 || c->out_channels > 256 || c->out_channels % p2)
        return ditd_err_set(DITD_EUNSUPPORTED,
                            "%s: out_channels = %d (1..256, a multiple of patch_size^2 = %d)", path,
                            c->out_channels, p2);
    if (c->n_latents_mean != c->z_dim)
        return ditd_err_set(DITD_EUNSUPPORTED, "%s: latents_mean has %d entries, z_dim = %d", path,
                            c->n_latents_mean, c->z_dim);
    if (c->n_latents_std != c->z_dim)
        return ditd_err_set(DITD_EUNSUPPORTED, "%s: latents_std has %d entries, z_dim = %d", path,
                            c->n_latents_std, c->z_dim);
    for (int i = 0; i < c->z_dim; i++)
        if (!(c->latents_std[i] != 0.0) || !isfinite(c->latents_std[i]))
            return ditd_err_set(DITD_EUNSUPPORTED, "%s: latents_std[%d] = %g", path, i,
                                c->latents_std[i]);
    if (c->scale_factor_temporal != (1 << k))
        return ditd_err_set(DITD_EUNSUPPORTED,
                            "%s: scale_factor_temporal = %d, but temperal_downsample gives %d", path,
                            c->scale_factor_temporal, 1 << k);
    if (c->scale_factor_spatial != ditd_wan_vae_config_scale_factor(c))
        return ditd_err_set(DITD_EUNSUPPORTED,
                            "%s: scale_factor_spatial = %d, but dim_mult and patch_size give %d", path,
                            c->scale_factor_spatial, ditd_wan_vae_config_scale_factor(c));
    if (c->is_residual) {
        /* AvgDown3D / DupUp3D: channels times the factor divisible */
        for (int i = 0; i < n; i++) {
            int in = c->base_dim * (i ? c->dim_mult[i - 1] : 1), out = c->base_dim * c->dim_mult[i];
            int down = i != n - 1, ft = down && c->temperal_downsample[i] ? 2 : 1, fs = down ? 2 : 1;
            if ((in * ft * fs * fs) % out)
                return ditd_err_set(DITD_EUNSUPPORTED,
                                    "%s: down block %d: %d channels x factor %d not divisible by %d "
                                    "(base_dim %d, dim_mult)", path, i, in, ft * fs * fs, out,
                                    c->base_dim);
        }
        for (int i = 0; i < n - 1; i++) {
            int d = c->decoder_base_dim;
            int in = d * (i ? c->dim_mult[n - i] : c->dim_mult[n - 1]), out = d * c->dim_mult[n - 1 - i];
            int ft = c->temperal_downsample[n - 2 - i] ? 2 : 1;
            if ((out * ft * 4) % in)
                return ditd_err_set(DITD_EUNSUPPORTED,
                                    "%s: up block %d: %d channels x factor %d not divisible by %d "
                                    "(decoder_base_dim %d, dim_mult)", path, i, out, ft * 4, in, d);
        }
    }
    return 0;
}

static int config_from_json(json_t *root, const char *path, ditd_wan_vae_config *out)
{
    ditd_wan_vae_config c;
    int err, given_m, given_s, nt = -1;
    const char *cls;
    json_t *v;

    memset(&c, 0, sizeof c);
    if (!json_is_object(root))
        return ditd_err_set(DITD_EFORMAT, "%s: not a JSON object", path);
    cls = json_string_value(json_object_get(root, "_class_name"));
    if (cls && strcmp(cls, "AutoencoderKLWan") != 0)
        return ditd_err_set(DITD_EUNSUPPORTED,
                            "%s: _class_name \"%s\" is not supported (AutoencoderKLWan)", path, cls);
    /* defaults: AutoencoderKLWan.__init__'s */
    c.n_mult = 4;
    c.dim_mult[0] = 1;
    c.dim_mult[1] = 2;
    c.dim_mult[2] = 4;
    c.dim_mult[3] = 4;
    c.temperal_downsample[0] = 0;
    c.temperal_downsample[1] = 1;
    c.temperal_downsample[2] = 1;
    if ((err = ditd_json_get_int(root, path, "base_dim", 96, &c.base_dim)) ||
        (err = get_int_or_null(root, path, "decoder_base_dim", -1, -1, &c.decoder_base_dim)) ||
        (err = ditd_json_get_int(root, path, "z_dim", 16, &c.z_dim)) ||
        (err = get_int_list(root, path, "dim_mult", DITD_WAN_VAE_MAX_BLOCKS, &c.n_mult, c.dim_mult)) ||
        (err = ditd_json_get_int(root, path, "num_res_blocks", 2, &c.num_res_blocks)) ||
        (err = get_bool_list(root, path, "temperal_downsample", DITD_WAN_VAE_MAX_BLOCKS, &nt,
                             c.temperal_downsample)) ||
        (err = ditd_json_get_number(root, path, "dropout", 0.0, NULL, &c.dropout)) ||
        (err = get_num_list(root, path, "latents_mean", DITD_WAN_VAE_MAX_Z, &c.n_latents_mean,
                            c.latents_mean, &given_m)) ||
        (err = get_num_list(root, path, "latents_std", DITD_WAN_VAE_MAX_Z, &c.n_latents_std,
                            c.latents_std, &given_s)) ||
        (err = ditd_json_get_bool(root, path, "is_residual", 0, &c.is_residual)) ||
        (err = ditd_json_get_int(root, path, "in_channels", 3, &c.in_channels)) ||
        (err = ditd_json_get_int(root, path, "out_channels", 3, &c.out_channels)) ||
        (err = get_int_or_null(root, path, "patch_size", 1, 1, &c.patch_size)) ||
        (err = get_int_or_null(root, path, "scale_factor_temporal", 4, -1, &c.scale_factor_temporal)) ||
        (err = get_int_or_null(root, path, "scale_factor_spatial", 8, -1, &c.scale_factor_spatial)))
        return err;
    if (c.decoder_base_dim < 0)
        c.decoder_base_dim = c.base_dim;
    if (nt < 0)
        nt = 3; /* the default list */
    if (nt != c.n_mult - 1)
        return ditd_err_set(DITD_EUNSUPPORTED,
                            "%s: temperal_downsample has %d entries, dim_mult %d (one per "
                            "downsampling block: len(dim_mult) - 1)", path, nt, c.n_mult);
    for (int i = nt; i < DITD_WAN_VAE_MAX_BLOCKS; i++)
        c.temperal_downsample[i] = 0;
    if (!given_m) {
        c.n_latents_mean = 16;
        memcpy(c.latents_mean, default_mean, sizeof default_mean);
    }
    if (!given_s) {
        c.n_latents_std = 16;
        memcpy(c.latents_std, default_std, sizeof default_std);
    }
    if ((v = json_object_get(root, "attn_scales")) && !json_is_null(v)) {
        if (!json_is_array(v))
            return ditd_err_set(DITD_EFORMAT, "%s: attn_scales must be a list", path);
        if (json_array_size(v) != 0)
            return ditd_err_set(DITD_EUNSUPPORTED,
                                "%s: attn_scales has %zu entries (ditd supports [], as every "
                                "published Wan VAE: no attention in the encoder's down blocks)",
                                path, json_array_size(v));
    }
    if (c.scale_factor_temporal < 0) /* null: what the network gives */
        c.scale_factor_temporal = ditd_wan_vae_config_time_factor(&c);
    if (c.scale_factor_spatial < 0)
        c.scale_factor_spatial = ditd_wan_vae_config_scale_factor(&c);
    if ((err = check(&c, path)))
        return err;
    *out = c;
    return 0;
}

static int read_json(json_t *root, const char *name, void *out)
{
    return config_from_json(root, name, out);
}

int ditd_wan_vae_config_load(const char *path, ditd_wan_vae_config *out)
{
    return ditd_json_config_file(path, read_json, out);
}

int ditd_wan_vae_config_parse(const char *text, size_t len, const char *name,
                              ditd_wan_vae_config *out)
{
    return ditd_json_config_text(text, len, name, read_json, out);
}

int ditd_wan_vae_config_summary(const char *path, ditd_vae_config *out)
{
    ditd_wan_vae_config w;
    int err = ditd_wan_vae_config_load(path, &w);
    if (err)
        return err;
    const int p2 = w.patch_size * w.patch_size, f = ditd_wan_vae_config_scale_factor(&w);
    int nb = 1;
    while ((1 << (nb - 1)) < f)
        nb++;
    if ((1 << (nb - 1)) != f || nb > DITD_VAE_MAX_BLOCKS)
        return ditd_err_set(DITD_EUNSUPPORTED, "%s: spatial scale %d", path, f);
    memset(out, 0, sizeof *out);
    out->in_channels = w.in_channels / p2;
    out->out_channels = w.out_channels / p2;
    out->latent_channels = w.z_dim;
    out->n_blocks = nb;
    for (int i = 0; i < nb; i++)
        out->block_out_channels[i] = w.decoder_base_dim * w.dim_mult[i < w.n_mult ? i : w.n_mult - 1];
    out->layers_per_block = w.num_res_blocks;
    out->norm_num_groups = 1;
    out->sample_size = 256;
    out->scaling_factor = 1.0;
    out->n_latents_mean = out->n_latents_std = w.z_dim;
    memcpy(out->latents_mean, w.latents_mean, sizeof(double) * (size_t)w.z_dim);
    memcpy(out->latents_std, w.latents_std, sizeof(double) * (size_t)w.z_dim);
    return 0;
}

int ditd_wan_vae_latent_side(const ditd_wan_vae_config *c, int side)
{
    side /= c->patch_size;
    for (int i = 0; i < c->n_mult - 1; i++)
        side = (side + 1 - 3) / 2 + 1; /* ZeroPad2d (0, 1), k 3, stride 2 */
    return side;
}

int ditd_wan_vae_encode_frames(const ditd_wan_vae_config *c, int F)
{
    /* the first frame, then chunks of 4 frames, 4 / time_factor latent frames each */
    return F < 1 ? 0 : 1 + (F - 1) / 4 * (4 / ditd_wan_vae_config_time_factor(c));
}
