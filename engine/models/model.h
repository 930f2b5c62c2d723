/* A model folder in Diffusers layout, as users have it on disk:
 *   model_index.json            pipeline class, components, id2label
 *   transformer/config.json     + *.safetensors (single or sharded)
 *   scheduler/scheduler_config.json
 *   vae/                        latent models only
 *   ditd.json                   optional: ditd's default generation settings
 *                               {"num_inference_steps", "guidance_scale", "sampler"}
 *
 * This module reads the folder's small JSON files into typed fields; it
 * does not load weights (engine/models/dit.h) or build samplers (engine/pipeline/sampler.h).
 */
#ifndef DITD_ENGINE_MODEL_H
#define DITD_ENGINE_MODEL_H

#include <stdint.h>

#include "engine/models/dit_config.h"

#define DITD_MODEL_PATH_MAX 4096

typedef struct ditd_model_info {
    char dir[DITD_MODEL_PATH_MAX];
    char name[256];              /* the folder's base name: the API's model id */
    char transformer_dir[DITD_MODEL_PATH_MAX];
    char scheduler_config[DITD_MODEL_PATH_MAX];
    ditd_dit_config dit;
    int needs_vae;               /* model_index.json names a vae component */
    int image_size;              /* pixels a side: sample_size x the VAE's scale factor */
    int image_channels;          /* the VAE's out_channels, or the transformer's;
                                  * both 0 for a latent model without vae/ */
    int num_classes;             /* K = dit.num_embeds_ada_norm */
    char **labels;               /* K entries (id2label; "class N" when absent), owned */
    /* defaults for requests that give none (ditd.json, else built-in) */
    int default_steps;
    float default_guidance;
    char default_sampler[32];    /* "" = the scheduler_config's own class */
} ditd_model_info;

/* Reads the folder. Errors name the file and key. *out is owned: release
 * with ditd_model_info_free(). */
int ditd_model_info_load(const char *dir, ditd_model_info *out);
void ditd_model_info_free(ditd_model_info *m);

/* Class id from a request's words: a number "0".."K-1", or a label from
 * id2label (case-insensitive; a label with commas has each part as a
 * synonym, as DiTPipeline.get_label_ids). DITD_EINVAL when none matches. */
int ditd_model_class_from_str(const ditd_model_info *m, const char *s, int *out);

#endif
