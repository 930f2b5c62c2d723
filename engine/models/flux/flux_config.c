/* transformer/config.json -> ditd_flux_config (FluxTransformer2DModel). */
#include "engine/models/flux/flux_config.h"

#include <jansson.h>
#include <string.h>

#include "engine/core/error.h"
#include "engine/io/json_config.h"
#include "kernels/cpu/cpu_kernels.h"

static int get_axes(json_t *root, const char *path, int *dims)
{
    static const int dflt[DITD_FLUX_AXES] = {16, 56, 56};
    json_t *v = json_object_get(root, "axes_dims_rope"), *e;
    size_t i;
    if (!v || json_is_null(v)) {
        memcpy(dims, dflt, sizeof dflt);
        return 0;
    }
    if (!json_is_array(v) || json_array_size(v) != DITD_FLUX_AXES)
        return ditd_err_set(DITD_EUNSUPPORTED,
                            "%s: axes_dims_rope must be a list of %d integers (one per id axis)",
                            path, DITD_FLUX_AXES);
    json_array_foreach(v, i, e) {
        if (!json_is_integer(e) || json_integer_value(e) <= 0 || json_integer_value(e) > 4096 ||
            json_integer_value(e) % 2)
            return ditd_err_set(DITD_EUNSUPPORTED,
                                "%s: axes_dims_rope[%zu] must be a positive even integer", path, i);
        dims[i] = (int)json_integer_value(e);
    }
    return 0;
}

int ditd_flux_config_finish(ditd_flux_config *c, const char *what)
{
    if (c->patch_size != 1)
        return ditd_err_set(DITD_EUNSUPPORTED,
                            "%s: patch_size = %d is not supported (FLUX.1 uses 1: the pipeline's 2x2 packing is the patchify)",
                            what, c->patch_size);
    if (c->in_channels <= 0 || c->in_channels > 1024 || c->in_channels % 4)
        return ditd_err_set(DITD_EUNSUPPORTED,
                            "%s: in_channels = %d must be a positive multiple of 4 (2x2-packed latent channels)",
                            what, c->in_channels);
    if (c->out_channels == 0)
        c->out_channels = c->in_channels; /* Diffusers: out_channels or in_channels */
    if (c->out_channels != c->in_channels)
        return ditd_err_set(DITD_EUNSUPPORTED,
                            "%s: out_channels = %d is not supported (must equal in_channels = %d)",
                            what, c->out_channels, c->in_channels);
    if (c->num_layers < 0 || c->num_layers > 1000 || c->num_single_layers < 0 ||
        c->num_single_layers > 1000 || c->num_layers + c->num_single_layers == 0)
        return ditd_err_set(DITD_EUNSUPPORTED,
                            "%s: num_layers = %d, num_single_layers = %d (0..1000 each, not both 0)",
                            what, c->num_layers, c->num_single_layers);
    if (c->num_heads <= 0 || c->num_heads > 1024)
        return ditd_err_set(DITD_EUNSUPPORTED, "%s: num_attention_heads = %d (1..1024)", what,
                            c->num_heads);
    /* the attention's limit is the backend's (ditd_backend_check_head_dim, at load) */
    if (c->head_dim <= 0 || c->head_dim % 2 || c->head_dim > 65536)
        return ditd_err_set(DITD_EUNSUPPORTED, "%s: attention_head_dim = %d (even, 2..65536)", what,
                            c->head_dim);
    int sum = 0;
    for (int a = 0; a < DITD_FLUX_AXES; a++)
        sum += c->axes_dims[a];
    if (sum != c->head_dim)
        return ditd_err_set(DITD_EUNSUPPORTED,
                            "%s: axes_dims_rope [%d, %d, %d] sums to %d, not attention_head_dim = %d",
                            what, c->axes_dims[0], c->axes_dims[1], c->axes_dims[2], sum,
                            c->head_dim);
    if (c->joint_attention_dim <= 0 || c->joint_attention_dim > 65536)
        return ditd_err_set(DITD_EUNSUPPORTED, "%s: joint_attention_dim = %d (1..65536)", what,
                            c->joint_attention_dim);
    if (c->pooled_dim <= 0 || c->pooled_dim > 65536)
        return ditd_err_set(DITD_EUNSUPPORTED, "%s: pooled_projection_dim = %d (1..65536)", what,
                            c->pooled_dim);
    c->inner_dim = c->num_heads * c->head_dim;
    c->mlp_dim = 4 * c->inner_dim;
    c->latent_channels = c->in_channels / 4;
    return 0;
}

static int config_from_json(json_t *root, const char *path, ditd_flux_config *out)
{
    ditd_flux_config c;
    int err;
    memset(&c, 0, sizeof c);
    if (!json_is_object(root))
        return ditd_err_set(DITD_EFORMAT, "%s: not a JSON object", path);
    const char *cls = json_string_value(json_object_get(root, "_class_name"));
    if (cls && strcmp(cls, "FluxTransformer2DModel") != 0)
        return ditd_err_set(DITD_EUNSUPPORTED,
                            "%s: _class_name \"%s\" is not supported (FluxTransformer2DModel)", path,
                            cls);
    /* Defaults are FluxTransformer2DModel.__init__'s. */
    if ((err = ditd_json_get_int(root, path, "patch_size", 1, &c.patch_size)) ||
        (err = ditd_json_get_int(root, path, "in_channels", 64, &c.in_channels)) ||
        (err = ditd_json_get_int(root, path, "out_channels", 0, &c.out_channels)) ||
        (err = ditd_json_get_int(root, path, "num_layers", 19, &c.num_layers)) ||
        (err = ditd_json_get_int(root, path, "num_single_layers", 38, &c.num_single_layers)) ||
        (err = ditd_json_get_int(root, path, "attention_head_dim", 128, &c.head_dim)) ||
        (err = ditd_json_get_int(root, path, "num_attention_heads", 24, &c.num_heads)) ||
        (err = ditd_json_get_int(root, path, "joint_attention_dim", 4096, &c.joint_attention_dim)) ||
        (err = ditd_json_get_int(root, path, "pooled_projection_dim", 768, &c.pooled_dim)) ||
        (err = ditd_json_get_bool(root, path, "guidance_embeds", 0, &c.guidance_embeds)) ||
        (err = get_axes(root, path, c.axes_dims)) || (err = ditd_flux_config_finish(&c, path)))
        return err;
    *out = c;
    return 0;
}

static int read_json(json_t *root, const char *name, void *out)
{
    return config_from_json(root, name, out);
}

int ditd_flux_config_load(const char *path, ditd_flux_config *out)
{
    return ditd_json_config_file(path, read_json, out);
}

int ditd_flux_config_parse(const char *text, size_t len, const char *name, ditd_flux_config *out)
{
    return ditd_json_config_text(text, len, name, read_json, out);
}
