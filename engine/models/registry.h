/* The registry of model families, keyed on each component's Diffusers
 * `_class_name` (the "_class_name" of <component>/config.json):
 *
 *     transformer/    denoisers   (engine/models/denoiser.h tables)
 *     vae/            VAEs        (engine/models/vae*, their own tables)
 *     text_encoder*   text encoders (engine/text, later)
 *     model_index.json  pipelines  (engine/models/pipeline_class.h rows)
 *
 * The built-in families are listed once, in registry.c; a test or an
 * embedding program may add its own with ditd_registry_add() at start-up
 * (before any model loads: the registry takes no lock). An unknown class is
 * refused at load naming the classes that are supported.
 *
 * What it is not: no loading; the registry hands back the family's table.
 */
#ifndef DITD_ENGINE_REGISTRY_H
#define DITD_ENGINE_REGISTRY_H

#include <stddef.h>

typedef enum ditd_component {
    DITD_COMPONENT_TRANSFORMER = 0, /* "transformer" */
    DITD_COMPONENT_VAE,             /* "vae" */
    DITD_COMPONENT_TEXT_ENCODER,    /* "text_encoder" */
    DITD_COMPONENT_PIPELINE,        /* "pipeline": model_index.json's class */
} ditd_component;
#define DITD_COMPONENT_COUNT 4

const char *ditd_component_name(ditd_component c);
int ditd_component_from_str(const char *s, ditd_component *out);

/* Adds a family: `table` (borrowed, static) is what ditd_registry_find
 * returns for (component, class_name); for a transformer it is a
 * `const ditd_denoiser_family *`, for a pipeline a `const
 * ditd_pipeline_class *`. DITD_EINVAL when the class is already
 * there, DITD_ERANGE when the table is full. */
int ditd_registry_add(ditd_component c, const char *class_name, const void *table);

/* The table for (component, class_name), or DITD_EUNSUPPORTED with a
 * detail naming the class and the supported ones. */
int ditd_registry_find(ditd_component c, const char *class_name, const void **out);

/* The pipeline table's row (engine/models/pipeline_class.h) for
 * model_index.json's class `name`: the built-in ones and those registered.
 * DITD_EUNSUPPORTED naming it and the known ones otherwise. */
struct ditd_pipeline_class;
int ditd_registry_find_pipeline(const char *name, const struct ditd_pipeline_class **out);

/* The supported classes of a component, ", "-separated into buf. */
void ditd_registry_list(ditd_component c, char *buf, size_t cap);

/* _class_name of the config.json at `path` into out (cap bytes). Errors:
 * DITD_ENOENT, DITD_EFORMAT (not JSON, no string _class_name), naming the
 * file. */
int ditd_registry_config_class(const char *path, char *out, size_t cap);

/* ditd_registry_config_class + ditd_registry_find on <dir>/config.json. */
int ditd_registry_find_dir(ditd_component c, const char *dir, const void **out);

#endif
