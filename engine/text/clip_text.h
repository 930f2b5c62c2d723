/* transformers' CLIPTextModel and CLIPTextModelWithProjection, forward only:
 * token + position embeddings, pre-LN encoder layers with causal
 * self-attention (q/k/v/out projections with biases, scale Dh^-1/2) and an
 * MLP (fc1, quick_gelu or gelu, fc2), the final LayerNorm, the pooled output
 * at the end-of-text token, and for WithProjection the text_projection.
 *
 * Numbers are transformers' (eager attention) in f32 on the CPU backend;
 * weights stay in their stored f32/f16/bf16 (engine/text/text_weights.h).
 * Parameter names are transformers': with the "text_model." prefix (hub
 * checkpoints, WithProjection) or without (CLIPTextModel as transformers 5
 * saves it).
 *
 * What it is not: a tokenizer, a vision tower, or thread-safe: one encoder
 * is used by one thread at a time.
 */
#ifndef DITD_ENGINE_CLIP_TEXT_H
#define DITD_ENGINE_CLIP_TEXT_H

#include <stddef.h>
#include <stdint.h>

#include "engine/backend/backend.h"
#include "engine/models/lora.h"
#include "engine/text/text_config.h"

typedef struct ditd_clip_text ditd_clip_text;

/* Loads a text_encoder/ folder (config.json + model.safetensors, or a
 * sharded index) for batches of up to max_batch sequences of up to
 * max_tokens tokens (<= max_position_embeddings; 0 takes that maximum).
 * class_hint: model_index.json's class for the component, or NULL. *out
 * owned (ditd_clip_text_free). Errors name the file, tensor or key. */
int ditd_clip_text_new(const char *dir, const char *class_hint, const ditd_backend_ops *ops,
                       int max_batch, int max_tokens, ditd_clip_text **out);
void ditd_clip_text_free(ditd_clip_text *m);

const ditd_clip_text_config *ditd_clip_text_config_of(const ditd_clip_text *m);
int ditd_clip_text_has_projection(const ditd_clip_text *m);
/* Bytes of matrices used in place from the checkpoint's mapping, and of the
 * model's own arena (small weights, converted matrices, activations). */
size_t ditd_clip_text_borrowed_bytes(const ditd_clip_text *m);
size_t ditd_clip_text_arena_bytes(const ditd_clip_text *m);

/* Which of transformers' outputs to return; any pointer may be NULL. All
 * host f32, caller-owned. */
typedef struct ditd_clip_text_out {
    /* hidden_states[hidden_index] (B, N, D): 0 is the embeddings, i the
     * output of layer i (before the final LayerNorm); negative counts from
     * the end, as Python does (-1: the last layer, -2: SD3's penultimate). */
    int hidden_index;
    float *hidden;
    float *last;      /* last_hidden_state (B, N, D): after final_layer_norm */
    float *pooled;    /* pooler_output (B, D): last at the end-of-text token */
    float *text_embeds; /* (B, P): pooled @ text_projection^T (WithProjection) */
} ditd_clip_text_out;

/* Encodes B sequences of N token ids (B, N), host. keep: (B, N) attention
 * mask (1 attend, 0 padding) or NULL (all 1, as Diffusers calls CLIP).
 * 0, DITD_EINVAL (B, N out of the planned range, hidden_index out of range,
 * text_embeds without a projection), DITD_ERANGE (an id outside the
 * vocabulary, naming it). */
int ditd_clip_text_encode(ditd_clip_text *m, int B, int N, const int64_t *ids,
                          const uint8_t *keep, const ditd_clip_text_out *out);
/* The same with LoRA adapters: loras[b] sequence b's set (over ditd_lora_dev
 * uploaded for this model's targets; NULL entries or loras NULL: none). A
 * sequence's numbers do not depend on the other sequences' sets. */
int ditd_clip_text_encode_lora(ditd_clip_text *m, int B, int N, const int64_t *ids,
                               const uint8_t *keep, const ditd_lora_set *const *loras,
                               const ditd_clip_text_out *out);
/* The linears a LoRA adapter may target (engine/text/text_lora.h): per
 * layer l "encoder.layers.<l>.self_attn.{q,k,v,out}_proj", ".mlp.fc1",
 * ".mlp.fc2" (transformers' module names without "text_model."), then
 * "text_projection" (WithProjection). Borrowed, *n of them. */
const ditd_lora_target *ditd_clip_text_lora_targets(const ditd_clip_text *m, int *n);

#endif
