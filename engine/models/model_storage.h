/* What each component of a model folder is stored as: the weights format,
 * the bytes and how many tensors of each storage type, read from the
 * files' headers (ditd_weights_open: a mapping and the header, no tensor
 * data). For `ditd bench`, the server's start-up log and GET /v1/models
 * ("storage", docs/api.md), so that a user sees a GGUF Q4_K transformer
 * and a bf16 one apart.
 *
 * What it is not: a loader, or a check that the files fit the model (the
 * loaders do that and name the tensor).
 */
#ifndef DITD_ENGINE_MODEL_STORAGE_H
#define DITD_ENGINE_MODEL_STORAGE_H

#include <stddef.h>
#include <stdint.h>

#include "engine/models/model.h"

#define DITD_STORAGE_MAX_COMPONENTS 8
#define DITD_STORAGE_MAX_TYPES 16

typedef struct ditd_storage_type {
    char name[16];   /* "Q8_0", "F32", "BF16" ... (the reader's type names) */
    int count;       /* tensors of that type */
} ditd_storage_type;

typedef struct ditd_component_storage {
    char component[32]; /* "transformer", "transformer_2", "text_encoder_2", "vae" ... */
    char format[16];    /* "gguf" or "safetensors" */
    uint64_t bytes;     /* the tensors' data */
    int tensors;
    int ntypes;         /* most tensors first; types past the 16th are counted in none */
    ditd_storage_type types[DITD_STORAGE_MAX_TYPES];
} ditd_component_storage;

typedef struct ditd_model_storage {
    int n;
    ditd_component_storage c[DITD_STORAGE_MAX_COMPONENTS];
} ditd_model_storage;

/* The storage of m's components: the transformer (its --transformer-file
 * or folder), transformer_2, each text encoder of the pipeline row (the
 * --text-encoder-2-file for text_encoder_2 when given), the image encoder
 * and the vae, in that order. A component whose weights do not open (a
 * folder with only its config.json) is left out: the loader names what is
 * missing. Never fails; out->n may be 0. */
void ditd_model_storage_read(const ditd_model_info *m, ditd_model_storage *out);

/* "gguf, 12.1 GB in 780 tensors: Q8_0 456, F32 324" into buf (cut to len). */
void ditd_component_storage_line(const ditd_component_storage *c, char *buf, size_t len);

#endif
