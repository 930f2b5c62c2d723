/* A text encoder's config.json (text_encoder/, text_encoder_2/, ...) -> the typed config of a CLIP, T5 or
 * UMT5 text encoder, as transformers' CLIPTextConfig / T5Config / UMT5Config read it.
 *
 * Every key of the file is accounted for: it is either used (read and
 * range-checked), or listed here as not changing what the encoder computes
 * (dropout, initialisation, generation and decoder settings, metadata). A
 * key ditd does not know, or a value it does not support, is refused with
 * the key and the value named: a config that would change the numbers in a
 * way ditd cannot follow never loads silently.
 *
 * What it is not: a weight loader (clip_text.c, t5_encoder.c) or a
 * tokenizer config reader.
 */
#ifndef DITD_ENGINE_TEXT_CONFIG_H
#define DITD_ENGINE_TEXT_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "engine/backend/backend.h"

/* The transformers class, as "architectures" (or model_index.json) names it. */
typedef enum ditd_text_arch {
    DITD_TEXT_CLIP = 0,   /* CLIPTextModel */
    DITD_TEXT_CLIP_PROJ,  /* CLIPTextModelWithProjection */
    DITD_TEXT_T5,         /* T5EncoderModel */
    DITD_TEXT_UMT5,       /* UMT5EncoderModel: T5 with a relative bias in every layer */
} ditd_text_arch;

const char *ditd_text_arch_name(ditd_text_arch a);
/* 0 or DITD_EUNSUPPORTED naming s and the accepted classes. */
int ditd_text_arch_from_str(const char *s, ditd_text_arch *out);

typedef struct ditd_clip_text_config {
    int vocab_size;
    int hidden_size;          /* D */
    int intermediate_size;    /* F */
    int projection_dim;       /* P: text_projection (WithProjection only) */
    int num_layers;           /* L: num_hidden_layers */
    int num_heads;            /* H; head dim D / H */
    int max_positions;        /* max_position_embeddings: longest sequence */
    ditd_text_act act;        /* hidden_act */
    float eps;                /* layer_norm_eps */
    int64_t eos_token_id;     /* pooled output: first position of this id ... */
    int legacy_argmax;        /* ... or, when eos_token_id == 2, argmax of the ids */
    int64_t bos_token_id, pad_token_id; /* not used by the model; for display */
} ditd_clip_text_config;

typedef struct ditd_t5_config {
    int vocab_size;
    int d_model;              /* D */
    int d_kv;                 /* Dh (inner dim H * Dh may differ from D) */
    int d_ff;                 /* F */
    int num_layers;           /* L */
    int num_heads;            /* H */
    int num_buckets;          /* relative_attention_num_buckets */
    int max_distance;         /* relative_attention_max_distance */
    int gated;                /* feed_forward_proj "gated-..." */
    int bias_per_layer;       /* UMT5: every block has its own relative_attention_bias;
                               * T5: block 0's is shared by all */
    ditd_text_act act;        /* its activation ("gated-gelu": gelu_new) */
    float eps;                /* layer_norm_epsilon */
    int64_t pad_token_id, eos_token_id; /* not used by the encoder; for display */
} ditd_t5_config;

typedef struct ditd_text_config {
    ditd_text_arch arch;
    ditd_clip_text_config clip; /* arch CLIP, CLIP_PROJ */
    ditd_t5_config t5;          /* arch T5, UMT5 */
} ditd_text_config;

/* Reads a config.json. class_hint (model_index.json's class for this
 * component) may be NULL; when given it must agree with "architectures".
 * 0, DITD_EIO/DITD_EFORMAT (unreadable, not JSON, a key of the wrong type),
 * DITD_EUNSUPPORTED/DITD_ERANGE (a key or value ditd does not take); the
 * detail names the file, the key and the value. */
int ditd_text_config_load(const char *path, const char *class_hint, ditd_text_config *out);
/* Same over a JSON text in memory; `name` is what errors call it. */
int ditd_text_config_parse(const char *text, size_t len, const char *name, const char *class_hint,
                           ditd_text_config *out);

#endif
