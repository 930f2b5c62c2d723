/* The model-family registry: built-in families plus those added at start-up. */
#include "engine/models/registry.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "engine/core/error.h"
#include "engine/io/json_config.h"
#include "engine/models/denoiser.h"
#include "engine/models/pipeline_class.h"
#include "engine/models/vae/autoencoder_kl.h"
#include "engine/models/wan_vae/wan_vae.h"

extern const ditd_denoiser_family ditd_dit_family; /* engine/models/dit/dit_denoiser.c */
extern const ditd_denoiser_family ditd_flux_family; /* engine/models/flux/flux_denoiser.c */
extern const ditd_denoiser_family ditd_sd3_family; /* engine/models/sd3/sd3_denoiser.c */
extern const ditd_denoiser_family ditd_wan_family;  /* engine/models/wan/wan_denoiser.c */

typedef struct entry {
    ditd_component comp;
    const char *class_name;
    const void *table;
} entry;

/* The built-in families, one line each. */
static const entry builtin[] = {
    {DITD_COMPONENT_TRANSFORMER, "DiTTransformer2DModel", &ditd_dit_family},
    {DITD_COMPONENT_TRANSFORMER, "FluxTransformer2DModel", &ditd_flux_family},
    {DITD_COMPONENT_TRANSFORMER, "SD3Transformer2DModel", &ditd_sd3_family},
    {DITD_COMPONENT_TRANSFORMER, "WanTransformer3DModel", &ditd_wan_family},
    {DITD_COMPONENT_VAE, "AutoencoderKL", &ditd_autoencoder_kl_family},
    {DITD_COMPONENT_PIPELINE, "DiTPipeline", &ditd_pipeline_dit},
    {DITD_COMPONENT_PIPELINE, "FluxPipeline", &ditd_pipeline_flux},
    {DITD_COMPONENT_PIPELINE, "StableDiffusion3Pipeline", &ditd_pipeline_sd3},
    {DITD_COMPONENT_PIPELINE, "WanPipeline", &ditd_pipeline_wan},
    {DITD_COMPONENT_PIPELINE, "WanImageToVideoPipeline", &ditd_pipeline_wan_i2v},
    {DITD_COMPONENT_PIPELINE, "FluxImg2ImgPipeline", &ditd_pipeline_flux_img2img},
    {DITD_COMPONENT_PIPELINE, "FluxInpaintPipeline", &ditd_pipeline_flux_inpaint},
    {DITD_COMPONENT_PIPELINE, "StableDiffusion3Img2ImgPipeline", &ditd_pipeline_sd3_img2img},
    {DITD_COMPONENT_PIPELINE, "StableDiffusion3InpaintPipeline", &ditd_pipeline_sd3_inpaint},
    {DITD_COMPONENT_PIPELINE, "FluxKontextPipeline", &ditd_pipeline_flux_kontext},
    {DITD_COMPONENT_VAE, "AutoencoderKLWan", &ditd_autoencoder_kl_wan_family},
};

#define EXTRA_MAX 16
static entry extra[EXTRA_MAX];
static int n_extra;

static const char *const comp_names[DITD_COMPONENT_COUNT] = {"transformer", "vae", "text_encoder",
                                                             "pipeline"};

const char *ditd_component_name(ditd_component c)
{
    return (unsigned)c < DITD_COMPONENT_COUNT ? comp_names[c] : "?";
}

int ditd_component_from_str(const char *s, ditd_component *out)
{
    for (int i = 0; i < DITD_COMPONENT_COUNT; i++) {
        if (s && strcasecmp(s, comp_names[i]) == 0) {
            *out = (ditd_component)i;
            return 0;
        }
    }
    return ditd_err_set(DITD_EINVAL, "component \"%s\" (transformer, vae, text_encoder, pipeline)",
                        s ? s : "(null)");
}

static const entry *lookup(ditd_component c, const char *class_name)
{
    for (size_t i = 0; i < sizeof builtin / sizeof builtin[0]; i++)
        if (builtin[i].comp == c && strcmp(builtin[i].class_name, class_name) == 0)
            return &builtin[i];
    for (int i = 0; i < n_extra; i++)
        if (extra[i].comp == c && strcmp(extra[i].class_name, class_name) == 0)
            return &extra[i];
    return NULL;
}

int ditd_registry_add(ditd_component c, const char *class_name, const void *table)
{
    if ((unsigned)c >= DITD_COMPONENT_COUNT || !class_name || !*class_name || !table)
        return ditd_err_set(DITD_EINVAL, "registry: a family needs a component, a class and a table");
    if (lookup(c, class_name))
        return ditd_err_set(DITD_EINVAL, "registry: %s class %s is already registered",
                            ditd_component_name(c), class_name);
    if (n_extra == EXTRA_MAX)
        return ditd_err_set(DITD_ERANGE, "registry: full (%d added families)", EXTRA_MAX);
    extra[n_extra++] = (entry){c, class_name, table};
    return 0;
}

static void append(char *buf, size_t cap, size_t *len, const char *s)
{
    int n = snprintf(buf + *len, cap - *len, "%s%s", *len ? ", " : "", s);
    if (n > 0)
        *len = *len + (size_t)n < cap ? *len + (size_t)n : cap - 1;
}

void ditd_registry_list(ditd_component c, char *buf, size_t cap)
{
    size_t len = 0;
    if (!cap)
        return;
    buf[0] = '\0';
    for (size_t i = 0; i < sizeof builtin / sizeof builtin[0]; i++)
        if (builtin[i].comp == c)
            append(buf, cap, &len, builtin[i].class_name);
    for (int i = 0; i < n_extra; i++)
        if (extra[i].comp == c)
            append(buf, cap, &len, extra[i].class_name);
    if (!len)
        snprintf(buf, cap, "none yet");
}

int ditd_registry_find(ditd_component c, const char *class_name, const void **out)
{
    const entry *e = class_name ? lookup(c, class_name) : NULL;
    if (!e) {
        char list[512];
        ditd_registry_list(c, list, sizeof list);
        return ditd_err_set(DITD_EUNSUPPORTED, "%s class \"%s\" is not supported (supported: %s)",
                            ditd_component_name(c), class_name ? class_name : "(none)", list);
    }
    *out = e->table;
    return 0;
}

int ditd_registry_find_pipeline(const char *name, const ditd_pipeline_class **out)
{
    const void *t;
    int err = ditd_registry_find(DITD_COMPONENT_PIPELINE, name && *name ? name : "(none)", &t);
    if (!err)
        *out = t;
    return err;
}

int ditd_registry_config_class(const char *path, char *out, size_t cap)
{
    int err;
    json_t *root = ditd_json_config_get(path, NULL, &err);
    if (!root)
        return err; /* DITD_ENOENT "PATH: missing", or where it is not JSON */
    const char *cls = json_string_value(json_object_get(root, "_class_name"));
    if (!cls)
        err = ditd_err_set(DITD_EFORMAT, "%s: no \"_class_name\" string", path);
    else if (strlen(cls) >= cap)
        err = ditd_err_set(DITD_EFORMAT, "%s: _class_name too long", path);
    else
        memcpy(out, cls, strlen(cls) + 1);
    json_decref(root);
    return err;
}

int ditd_registry_find_dir(ditd_component c, const char *dir, const void **out)
{
    char path[4200], cls[128];
    int err;
    if (snprintf(path, sizeof path, "%s/config.json", dir) >= (int)sizeof path)
        return ditd_err_set(DITD_EINVAL, "path too long: %s", dir);
    if ((err = ditd_registry_config_class(path, cls, sizeof cls)))
        return err;
    if ((err = ditd_registry_find(c, cls, out))) {
        char d[600];
        snprintf(d, sizeof d, "%s", ditd_err_detail());
        return ditd_err_set(err, "%s: %s", path, d);
    }
    return 0;
}
