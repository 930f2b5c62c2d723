/* transformers' CLIPVisionModel (and CLIPVisionModelWithProjection's
 * tower) forward up to a chosen hidden state, and CLIPImageProcessor's
 * preprocessing, as WanImageToVideoPipeline.encode_image calls them:
 * image_encoder(**image_processor(images=image), output_hidden_states=
 * True).hidden_states[-2].
 *
 * The tower: patch embedding (Conv2d C -> D, kernel = stride = patch,
 * no bias), the class token, absolute position embeddings, pre_layrnorm,
 * then CLIPEncoderLayers (engine/text/clip_layers.h, shared with the text
 * tower; attention unmasked). hidden_states[0] is the output of
 * pre_layrnorm, hidden_states[i] that of layer i; only the layers up to the
 * one asked for run (Wan asks for -2: all but the last). post_layernorm
 * and the projection only touch the pooled output, which Wan does not use:
 * not computed. Numbers are transformers' eager ones in f32 on the
 * backend's text ops; weights in their stored f32/f16/bf16.
 *
 * The processor (preprocessor_config.json): convert to RGB (the caller
 * passes RGB), resize (shortest_edge, or height x width) with PIL's
 * filter (engine/core/image_resize.h, bit-exact), center crop, rescale
 * (x as double times rescale_factor, then float32, as numpy), normalize
 * ((x - mean) / std in float32), channels first.
 *
 * The readers and the preprocessing are engine/vision/clip_vision_config.c,
 * the tower engine/vision/clip_vision.c.
 * What it is not: interpolate_pos_encoding (the input is the config's
 * image_size square), a tokenizer, thread-safe (one thread at a time).
 */
#ifndef DITD_ENGINE_CLIP_VISION_H
#define DITD_ENGINE_CLIP_VISION_H

#include <stddef.h>
#include <stdint.h>

#include "engine/backend/backend.h"
#include "engine/core/image_resize.h"

typedef struct ditd_clip_vision_config {
    int hidden_size;       /* D */
    int intermediate_size; /* F */
    int num_layers;        /* L */
    int num_heads;         /* H */
    int num_channels;      /* C of the pixels (3) */
    int image_size;        /* S: the square the tower takes */
    int patch_size;        /* p: S / p patches a side */
    ditd_text_act act;     /* hidden_act */
    float eps;             /* layer_norm_eps */
    int with_projection;   /* CLIPVisionModelWithProjection (the projection is unused) */
} ditd_clip_vision_config;

/* config.json -> the config; every key used or listed as not changing the
 * hidden states; others refused naming the file and the key. class_hint
 * (model_index.json's class) may be NULL. */
int ditd_clip_vision_config_load(const char *path, const char *class_hint,
                                 ditd_clip_vision_config *out);
/* The same over a JSON text in memory; `name` is what errors call it. */
int ditd_clip_vision_config_parse(const char *text, size_t len, const char *name,
                                  const char *class_hint, ditd_clip_vision_config *out);

typedef struct ditd_clip_image_processor {
    int do_resize;
    int shortest_edge;          /* > 0: resize so that the short side is this ... */
    int size_h, size_w;         /* ... else to size_h x size_w */
    ditd_resample resample;
    int do_center_crop;
    int crop_h, crop_w;
    int do_rescale;
    double rescale_factor;
    int do_normalize;
    float mean[3], std[3];
} ditd_clip_image_processor;

/* preprocessor_config.json (CLIPImageProcessor) -> the steps. Errors name
 * the file and the key. */
int ditd_clip_image_processor_load(const char *path, ditd_clip_image_processor *out);
int ditd_clip_image_processor_parse(const char *text, size_t len, const char *name,
                                    ditd_clip_image_processor *out);

/* The size after the processor's resize and crop for a w x h image. */
void ditd_clip_image_processor_out_size(const ditd_clip_image_processor *p, int w, int h,
                                        int *ow, int *oh);

/* rgb (h, w, 3) bytes -> pixel_values (3, oh, ow) f32 host (the size of
 * ditd_clip_image_processor_out_size). DITD_EINVAL for a crop larger than
 * the resized image (transformers pads; not taken), naming both. */
int ditd_clip_image_preprocess(const ditd_clip_image_processor *p, const uint8_t *rgb, int w,
                               int h, float *out);

typedef struct ditd_clip_vision ditd_clip_vision;

/* Loads an image_encoder/ folder (config.json + model.safetensors or a
 * sharded index) for batches of up to max_batch images. Owned:
 * ditd_clip_vision_free. Errors name the file, tensor or key. */
int ditd_clip_vision_new(const char *dir, const char *class_hint, const ditd_backend_ops *ops,
                         int max_batch, ditd_clip_vision **out);
void ditd_clip_vision_free(ditd_clip_vision *m);
const ditd_clip_vision_config *ditd_clip_vision_config_of(const ditd_clip_vision *m);
/* Tokens of a hidden state: (S / p)^2 + 1 (257 for ViT-H/14 at 224). */
int ditd_clip_vision_tokens(const ditd_clip_vision *m);

/* B images pixel_values (B, C, S, S) host f32 -> hidden_states[index]
 * (B, N, D) host f32 (index from the end when negative, as Python: -2 is
 * Wan's). 0, DITD_EINVAL (B or index out of range). */
int ditd_clip_vision_encode(ditd_clip_vision *m, int B, const float *pixels, int hidden_index,
                            float *hidden);

#endif
