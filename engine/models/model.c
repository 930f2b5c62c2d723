/* Model folder: model_index.json, transformer/config.json, ditd.json. */
#include "engine/models/model.h"

#include <ctype.h>
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "engine/core/error.h"
#include "engine/io/json_config.h"
#include "engine/io/safetensors.h"
#include "engine/models/registry.h"
#include "engine/models/vae/autoencoder_kl.h"

static int path_join(char *dst, size_t len, const char *a, const char *b)
{
    int n = snprintf(dst, len, "%s/%s", a, b);
    if (n < 0 || (size_t)n >= len)
        return ditd_err_set(DITD_EINVAL, "path too long: %s/%s", a, b);
    return 0;
}

static int is_file(const char *p)
{
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISREG(sb.st_mode);
}

static int load_labels(ditd_model_info *m, json_t *index, const char *path)
{
    json_t *id2label = json_object_get(index, "id2label");
    const char *key;
    json_t *val;

    if (m->num_classes == 0) /* not class-conditional: no labels */
        return 0;
    m->labels = calloc((size_t)m->num_classes, sizeof *m->labels);
    if (!m->labels)
        return ditd_err_set(DITD_ENOMEM, "labels");
    if (id2label && !json_is_null(id2label)) {
        if (!json_is_object(id2label))
            return ditd_err_set(DITD_EFORMAT, "%s: id2label must be an object", path);
        json_object_foreach(id2label, key, val) {
            char *end;
            long id;
            errno = 0;
            id = strtol(key, &end, 10);
            if (errno || *end || end == key || id < 0 || id >= m->num_classes)
                return ditd_err_set(DITD_EFORMAT,
                                    "%s: id2label key \"%s\" is not a class id in 0..%d", path,
                                    key, m->num_classes - 1);
            if (!json_is_string(val))
                return ditd_err_set(DITD_EFORMAT, "%s: id2label[\"%s\"] must be a string", path, key);
            free(m->labels[id]);
            m->labels[id] = strdup(json_string_value(val));
            if (!m->labels[id])
                return ditd_err_set(DITD_ENOMEM, "labels");
        }
    }
    for (int i = 0; i < m->num_classes; i++) {
        if (!m->labels[i]) {
            char buf[32];
            snprintf(buf, sizeof buf, "class %d", i);
            if (!(m->labels[i] = strdup(buf)))
                return ditd_err_set(DITD_ENOMEM, "labels");
        }
    }
    return 0;
}

static int load_defaults(ditd_model_info *m)
{
    char path[DITD_MODEL_PATH_MAX];
    json_t *root, *v;
    int err = 0;

    m->default_steps = m->pipeline->default_steps;          /* the pipeline's __call__ */
    m->default_guidance = m->pipeline->default_guidance;
    m->default_sampler[0] = '\0';
    if (m->shapes.cond.kind == DITD_COND_TEXT) {
        m->max_sequence_length = m->pipeline->max_sequence_length;
        m->default_max_sequence_length = m->pipeline->default_max_sequence_length;
    }
    if ((err = path_join(path, sizeof path, m->dir, "ditd.json")))
        return err;
    if (!is_file(path))
        return 0;
    if (!(root = ditd_json_config_get(path, NULL, &err)))
        return err;
    if ((v = json_object_get(root, "num_inference_steps"))) {
        if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > 1000) {
            err = ditd_err_set(DITD_EFORMAT, "%s: num_inference_steps must be an integer in 1..1000", path);
            goto done;
        }
        m->default_steps = (int)json_integer_value(v);
    }
    if ((v = json_object_get(root, "guidance_scale"))) {
        if (!json_is_number(v) || json_number_value(v) < 0 || json_number_value(v) > 100) {
            err = ditd_err_set(DITD_EFORMAT, "%s: guidance_scale must be a number in 0..100", path);
            goto done;
        }
        m->default_guidance = (float)json_number_value(v);
    }
    if ((v = json_object_get(root, "sampler"))) {
        if (!json_is_string(v) || strlen(json_string_value(v)) >= sizeof m->default_sampler) {
            err = ditd_err_set(DITD_EFORMAT, "%s: sampler must be a short string", path);
            goto done;
        }
        strcpy(m->default_sampler, json_string_value(v));
    }
    if ((v = json_object_get(root, "max_sequence_length"))) {
        if (m->shapes.cond.kind != DITD_COND_TEXT || !json_is_integer(v) ||
            json_integer_value(v) < 1 || json_integer_value(v) > m->max_sequence_length) {
            err = ditd_err_set(DITD_EFORMAT, "%s: max_sequence_length must be an integer in 1..%d, "
                               "for a text model", path,
                               m->max_sequence_length > 0 ? m->max_sequence_length : 1);
            goto done;
        }
        m->default_max_sequence_length = (int)json_integer_value(v);
    }
    if ((v = json_object_get(root, "max_frames"))) {
        if (!m->frames || !json_is_integer(v) || json_integer_value(v) < 1 ||
            json_integer_value(v) > 4097 || json_integer_value(v) % m->frame_step != 1 % m->frame_step) {
            err = ditd_err_set(DITD_EFORMAT, "%s: max_frames must be 1 + k x %d in 1..4097, for a "
                               "video model", path, m->frame_step > 0 ? m->frame_step : 1);
            goto done;
        }
        m->max_frames = (int)json_integer_value(v);
    }
    if ((v = json_object_get(root, "num_frames"))) {
        if (!m->frames || !json_is_integer(v) || json_integer_value(v) < 1 ||
            json_integer_value(v) > m->max_frames ||
            json_integer_value(v) % m->frame_step != 1 % m->frame_step) {
            err = ditd_err_set(DITD_EFORMAT, "%s: num_frames must be 1 + k x %d in 1..%d, for a "
                               "video model", path, m->frame_step > 0 ? m->frame_step : 1,
                               m->max_frames > 0 ? m->max_frames : 1);
            goto done;
        }
        m->frames = (int)json_integer_value(v);
    }
    if ((v = json_object_get(root, "max_image_size"))) {
        if (!m->resizable || !json_is_integer(v) || json_integer_value(v) < m->min_size ||
            json_integer_value(v) > 16384 || json_integer_value(v) % m->size_multiple) {
            err = ditd_err_set(DITD_EFORMAT, "%s: max_image_size must be a multiple of %d in %d..16384, "
                               "for a model that takes any size", path,
                               m->size_multiple > 0 ? m->size_multiple : 1, m->min_size);
            goto done;
        }
        m->max_size = (int)json_integer_value(v);
    }
done:
    json_decref(root);
    return err;
}

/* A video pipeline's frames: the row's defaults, the VAE's
 * scale_factor_temporal (4 when vae/config.json has none or there is no
 * VAE, as WanPipeline), and the transformer's latent frames at the default
 * clip. */
static int load_frames(ditd_model_info *m)
{
    char cfg[DITD_MODEL_PATH_MAX + 16];
    if (m->pipeline->default_frames <= 0)
        return 0;
    m->frame_step = 4;
    if (m->vae_dir[0]) {
        json_t *root, *v;
        snprintf(cfg, sizeof cfg, "%s/config.json", m->vae_dir);
        int err;
        if (!(root = ditd_json_config_get(cfg, NULL, &err)))
            return err;
        v = json_object_get(root, "scale_factor_temporal");
        if (v && (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > 16)) {
            json_decref(root);
            return ditd_err_set(DITD_EFORMAT, "%s: scale_factor_temporal must be an integer in 1..16",
                                cfg);
        }
        if (v)
            m->frame_step = (int)json_integer_value(v);
        json_decref(root);
    }
    m->frames = ditd_model_round_frames(m, m->pipeline->default_frames);
    m->max_frames = 1 + 64 * m->frame_step;
    m->fps = m->pipeline->fps;
    return 0;
}

/* vae/config.json: the scale factor 2^(len(block_out_channels) - 1), as
 * Diffusers' pipelines compute vae_scale_factor, and the image channels.
 * Loading the VAE itself is the VAE family's business. */
static int load_vae(ditd_model_info *m)
{
    char cfg[DITD_MODEL_PATH_MAX];
    int err = 0;

    m->vae_scale = 1;
    m->image_channels = m->shapes.in_channels;
    if (m->needs_vae) {
        if ((err = path_join(m->vae_dir, sizeof m->vae_dir, m->dir, "vae")) ||
            (err = path_join(cfg, sizeof cfg, m->vae_dir, "config.json")))
            return err;
        if (!is_file(cfg)) { /* the latents can still be saved; decoding is refused */
            m->vae_dir[0] = '\0';
            m->vae_scale = m->image_width = m->image_height = m->image_channels = 0;
            return 0;
        }
        const void *fam;
        ditd_vae_config vc;
        if ((err = ditd_registry_config_class(cfg, m->vae_class, sizeof m->vae_class)))
            return err;
        if ((err = ditd_registry_find(DITD_COMPONENT_VAE, m->vae_class, &fam))) {
            char d[600];
            snprintf(d, sizeof d, "%s", ditd_err_detail());
            return ditd_err_set(err, "%s: %s", cfg, d);
        }
        m->vae = fam;
        /* the whole config is checked here, so a bad one fails at start-up */
        if ((err = m->vae->config_load(cfg, &vc)))
            return err;
        /* image-to-video: the latents are the transformer's output channels,
         * the rest of its input is the condition */
        int lat_c = m->pipeline->image_to_video ? m->shapes.out_channels : m->shapes.in_channels;
        if (vc.latent_channels != lat_c)
            return ditd_err_set(DITD_EUNSUPPORTED,
                                "%s: the VAE has %d latent channels, the transformer's %s is %d",
                                cfg, vc.latent_channels,
                                m->pipeline->image_to_video ? "out_channels" : "in_channels",
                                lat_c);
        m->vae_scale = ditd_vae_config_scale_factor(&vc);
        m->image_channels = vc.out_channels;
    }
    m->image_width = m->shapes.width * m->vae_scale;
    m->image_height = m->shapes.height * m->vae_scale;
    /* sizes: any multiple of size_multiple for a family with set_size */
    m->resizable = m->denoiser->set_size && m->shapes.latent_multiple > 0 && m->vae_scale > 0;
    if (m->resizable) {
        m->size_multiple = m->shapes.latent_multiple * m->vae_scale;
        m->min_size = m->size_multiple;
        m->max_size = DITD_MODEL_MAX_IMAGE_SIZE; /* ditd.json may change it */
    } else {
        m->size_multiple = 0;
        m->min_size = m->image_width < m->image_height ? m->image_width : m->image_height;
        m->max_size = m->image_width > m->image_height ? m->image_width : m->image_height;
    }
    return 0;
}

/* A component entry of model_index.json: ["library", "Class"] is present,
 * null or absent is not; anything else is refused naming it. */
static int component_present(json_t *index, const char *name, const char *path, int *present)
{
    json_t *v = json_object_get(index, name);
    *present = 0;
    if (!v || json_is_null(v))
        return 0;
    /* [null, null]: how save_pretrained writes a component passed as None */
    if (json_is_array(v) && json_array_size(v) == 2 && json_is_null(json_array_get(v, 0)) &&
        json_is_null(json_array_get(v, 1)))
        return 0;
    if (!json_is_array(v) || json_array_size(v) != 2 || !json_is_string(json_array_get(v, 1)))
        return ditd_err_set(DITD_EFORMAT, "%s: %s must be [\"library\", \"Class\"] or null", path,
                            name);
    *present = 1;
    return 0;
}

/* The second expert (Wan 2.2 A14B; ditd_model_info's transformer_2_dir,
 * boundary_ratio) and expand_timesteps, after the first transformer is
 * known. */
static int load_experts(ditd_model_info *m, json_t *index, const char *path)
{
    char cfg[DITD_MODEL_PATH_MAX + 16], cls[128];
    json_t *br = json_object_get(index, "boundary_ratio"), *et;
    int has2, err;

    m->transformer_2_dir[0] = '\0';
    m->boundary_ratio = -1.0;
    if ((err = component_present(index, "transformer_2", path, &has2)))
        return err;
    if (br && !json_is_null(br)) {
        if (!json_is_number(br) || !(json_number_value(br) > 0.0) || json_number_value(br) > 1.0)
            return ditd_err_set(DITD_EFORMAT, "%s: boundary_ratio must be a number in (0, 1] or null",
                                path);
        m->boundary_ratio = json_number_value(br);
    }
    if ((et = json_object_get(index, "expand_timesteps")) && !json_is_null(et)) {
        if (!json_is_boolean(et))
            return ditd_err_set(DITD_EFORMAT, "%s: expand_timesteps must be true or false", path);
        if (json_is_true(et) && m->pipeline->default_frames <= 0)
            return ditd_err_set(DITD_EUNSUPPORTED, "%s: expand_timesteps: %s is not a video pipeline",
                                path, m->pipeline->name);
        m->expand_timesteps = json_is_true(et);
    }
    if (m->boundary_ratio > 0 && !has2)
        return ditd_err_set(DITD_EUNSUPPORTED,
                            "%s: boundary_ratio %g names a second expert, but transformer_2 is absent",
                            path, m->boundary_ratio);
    if (!has2)
        return 0;
    if (m->pipeline->max_experts < 2)
        return ditd_err_set(DITD_EUNSUPPORTED, "%s: transformer_2: %s drives one transformer", path,
                            m->pipeline->name);
    if (m->boundary_ratio < 0) /* WanPipeline: no boundary, transformer_2 never runs */
        return 0;
    if ((err = path_join(m->transformer_2_dir, sizeof m->transformer_2_dir, m->dir, "transformer_2")))
        return err;
    snprintf(cfg, sizeof cfg, "%s/config.json", m->transformer_2_dir);
    if (!is_file(cfg))
        return ditd_err_set(DITD_ENOENT, "%s: missing (model_index.json names transformer_2)", cfg);
    if ((err = ditd_registry_config_class(cfg, cls, sizeof cls)))
        return err;
    if (strcmp(cls, m->denoiser_class) != 0)
        return ditd_err_set(DITD_EUNSUPPORTED, "%s: _class_name %s, transformer/ is %s: two experts "
                            "must be one class", cfg, cls, m->denoiser_class);
    ditd_denoiser_shapes s2;
    if ((err = m->denoiser->shapes(m->transformer_2_dir, &s2)) ||
        (err = ditd_denoiser_shapes_check(&s2, cfg)))
        return err;
    return ditd_denoiser_shapes_same(&m->shapes, &s2, cfg);
}

/* WanImageToVideoPipeline's inputs: the condition's channels (4 mask
 * channels, scale_factor_temporal of them, then the VAE's z_dim), and the
 * image encoder and processor a transformer with an image branch needs. */
static int load_image_cond(ditd_model_info *m, json_t *index, const char *path)
{
    int enc, proc, err;
    m->cond_channels = m->last_image = 0;
    m->image_encoder_dir[0] = m->image_processor_config[0] = '\0';
    if (!m->pipeline->image_to_video)
        return 0;
    char tcfg[DITD_MODEL_PATH_MAX + 16];
    snprintf(tcfg, sizeof tcfg, "%s/config.json", m->transformer_dir);
    m->cond_channels = m->shapes.in_channels - m->shapes.out_channels;
    if (!m->vae_dir[0])
        return ditd_err_set(DITD_ENOENT, "%s: %s needs vae/ to encode the input image", path,
                            m->pipeline->name);
    if (m->expand_timesteps) { /* TI2V-5B: the image's latents replace the first frame */
        if (m->cond_channels != 0)
            return ditd_err_set(DITD_EUNSUPPORTED, "%s: expand_timesteps: the image replaces the "
                                "first latent frame, so in_channels (%d) must equal out_channels "
                                "(%d)", tcfg, m->shapes.in_channels, m->shapes.out_channels);
        return 0;
    }
    if (m->cond_channels != m->frame_step + m->shapes.out_channels)
        return ditd_err_set(DITD_EUNSUPPORTED,
                            "%s: in_channels %d: %s concatenates %d mask channels and %d image "
                            "latent channels to the %d latent ones (in_channels %d)", tcfg,
                            m->shapes.in_channels, m->pipeline->name, m->frame_step,
                            m->shapes.out_channels, m->shapes.out_channels,
                            m->frame_step + 2 * m->shapes.out_channels);
    if ((err = component_present(index, "image_encoder", path, &enc)) ||
        (err = component_present(index, "image_processor", path, &proc)))
        return err;
    if (m->shapes.cond.image_dim <= 0) /* Wan 2.2 I2V: the encoder is not called */
        return 0;
    if (!enc || !proc)
        return ditd_err_set(DITD_ENOENT, "%s: the transformer has an image branch (image_dim %d) "
                            "but model_index.json names no %s", path, m->shapes.cond.image_dim,
                            !enc ? "image_encoder" : "image_processor");
    if ((err = path_join(m->image_encoder_dir, sizeof m->image_encoder_dir, m->dir,
                         "image_encoder")) ||
        (err = path_join(m->image_processor_config, sizeof m->image_processor_config, m->dir,
                         "image_processor/preprocessor_config.json")))
        return err;
    char ecfg[DITD_MODEL_PATH_MAX + 16];
    snprintf(ecfg, sizeof ecfg, "%s/config.json", m->image_encoder_dir);
    if (!is_file(ecfg))
        return ditd_err_set(DITD_ENOENT, "%s: missing (model_index.json names image_encoder)", ecfg);
    if (!is_file(m->image_processor_config))
        return ditd_err_set(DITD_ENOENT, "%s: missing (model_index.json names image_processor)",
                            m->image_processor_config);
    /* the encoder's tokens per image, (S / p)^2 + 1 (its class token), as
     * the tower counts them (engine/vision/clip_vision.c, which checks its
     * whole config when it loads; only the two sizes are read here, with
     * CLIPVisionConfig's defaults, so that this layer needs no vision
     * code); twice that is FLF2V. Any other count is the image condition's
     * to refuse at load. */
    json_t *root = ditd_json_config_get(ecfg, NULL, &err);
    int size = 0, patch = 0;
    if (!root)
        return err;
    err = ditd_json_get_int(root, ecfg, "image_size", 224, &size);
    if (!err)
        err = ditd_json_get_int(root, ecfg, "patch_size", 32, &patch);
    json_decref(root);
    if (err)
        return err;
    const int side = patch > 0 && size > 0 ? size / patch : 0;
    m->last_image = side > 0 && m->shapes.cond.image_len == 2 * (side * side + 1);
    return 0;
}

int ditd_model_info_load(const char *dir, ditd_model_info *out)
{
    ditd_model_info *m = out;
    char path[DITD_MODEL_PATH_MAX], cfg[DITD_MODEL_PATH_MAX];
    json_t *index = NULL, *vae;
    const char *base;
    int err;

    memset(m, 0, sizeof *m);
    if (strlen(dir) >= sizeof m->dir)
        return ditd_err_set(DITD_EINVAL, "model path too long");
    strcpy(m->dir, dir);
    while (strlen(m->dir) > 1 && m->dir[strlen(m->dir) - 1] == '/')
        m->dir[strlen(m->dir) - 1] = '\0';
    base = strrchr(m->dir, '/');
    base = base ? base + 1 : m->dir;
    if (strlen(base) >= sizeof m->name)
        return ditd_err_set(DITD_EINVAL, "model folder name too long: %s", base);
    memcpy(m->name, base, strlen(base) + 1);

    if ((err = path_join(path, sizeof path, m->dir, "model_index.json")))
        return err;
    if (!is_file(path))
        return ditd_err_set(DITD_ENOENT, "%s: no model_index.json (not a Diffusers model folder)", m->dir);
    if (!(index = ditd_json_config_get(path, NULL, &err)))
        return err;
    if (!json_is_object(index)) {
        err = ditd_err_set(DITD_EFORMAT, "%s: not a JSON object", path);
        goto fail;
    }
    json_t *pc = json_object_get(index, "_class_name");
    if (!json_is_string(pc) || strlen(json_string_value(pc)) >= sizeof m->pipeline_class) {
        err = ditd_err_set(DITD_EFORMAT, "%s: no \"_class_name\" string (the pipeline class)", path);
        goto fail;
    }
    snprintf(m->pipeline_class, sizeof m->pipeline_class, "%s", json_string_value(pc));
    if ((err = ditd_registry_find_pipeline(m->pipeline_class, &m->pipeline))) {
        char d[600];
        snprintf(d, sizeof d, "%s", ditd_err_detail());
        err = ditd_err_set(err, "%s: %s", path, d);
        goto fail;
    }
    /* A component entry is ["library", "Class"]; null means absent. */
    vae = json_object_get(index, "vae");
    m->needs_vae = vae && json_is_array(vae) && json_array_size(vae) == 2 &&
                   json_is_string(json_array_get(vae, 1));

    if ((err = path_join(m->transformer_dir, sizeof m->transformer_dir, m->dir, "transformer")) ||
        (err = path_join(cfg, sizeof cfg, m->transformer_dir, "config.json")) ||
        (err = path_join(m->scheduler_config, sizeof m->scheduler_config, m->dir,
                         "scheduler/scheduler_config.json")))
        goto fail;
    if (!is_file(cfg)) {
        err = ditd_err_set(DITD_ENOENT, "%s: missing", cfg);
        goto fail;
    }
    if (!is_file(m->scheduler_config)) {
        err = ditd_err_set(DITD_ENOENT, "%s: missing", m->scheduler_config);
        goto fail;
    }
    if ((err = ditd_registry_config_class(cfg, m->denoiser_class, sizeof m->denoiser_class)))
        goto fail;
    const void *fam;
    if ((err = ditd_registry_find(DITD_COMPONENT_TRANSFORMER, m->denoiser_class, &fam))) {
        char d[600];
        snprintf(d, sizeof d, "%s", ditd_err_detail());
        err = ditd_err_set(err, "%s: %s", cfg, d);
        goto fail;
    }
    m->denoiser = fam;
    if ((err = m->denoiser->shapes(m->transformer_dir, &m->shapes)) ||
        (err = ditd_denoiser_shapes_check(&m->shapes, cfg)))
        goto fail;
    if ((err = ditd_pipeline_class_check(m->pipeline, m->denoiser_class, m->shapes.cond.kind))) {
        char d[600];
        snprintf(d, sizeof d, "%s", ditd_err_detail());
        err = ditd_err_set(err, "%s: %s", path, d);
        goto fail;
    }
    if ((err = load_experts(m, index, path)) || (err = load_vae(m)) || (err = load_frames(m)) ||
        (err = load_image_cond(m, index, path)))
        goto fail;
    m->num_classes = m->shapes.cond.kind == DITD_COND_CLASS ? m->shapes.cond.num_classes : 0;
    if ((err = load_labels(m, index, path)) || (err = load_defaults(m)))
        goto fail;
    json_decref(index);
    return 0;
fail:
    json_decref(index);
    ditd_model_info_free(m);
    return err;
}

void ditd_model_info_free(ditd_model_info *m)
{
    if (m->labels) {
        for (int i = 0; i < m->num_classes; i++)
            free(m->labels[i]);
        free(m->labels);
    }
    m->labels = NULL;
}

int ditd_model_checkpoint_dtype(const char *weights_path, ditd_dtype *out)
{
    ditd_safetensors *st;
    size_t n = strlen(weights_path);
    *out = DITD_DTYPE_F32;
    if (n >= 5 && strcmp(weights_path + n - 5, ".gguf") == 0)
        return 0;
    int err = ditd_safetensors_open(weights_path, &st);
    if (err == DITD_ENOENT) /* no checkpoint: its family says what it lacks when it loads */
        return 0;
    if (err)
        return err;
    const ditd_st_tensor *big = NULL;
    for (size_t i = 0; i < ditd_safetensors_count(st); i++) {
        const ditd_st_tensor *t = ditd_safetensors_at(st, i);
        if (!big || t->nbytes > big->nbytes)
            big = t;
    }
    if (big && big->dtype == DITD_ST_BF16)
        *out = DITD_DTYPE_BF16;
    else if (big && big->dtype == DITD_ST_F16)
        *out = DITD_DTYPE_F16;
    ditd_safetensors_free(st);
    return 0;
}
