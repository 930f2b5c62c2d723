/* A text model's prompt encoder, as its Diffusers pipeline encodes a
 * prompt: the tokenizers and text encoders the model folder names, run
 * once per prompt (not per step), with a bounded LRU cache of the results.
 *
 * FluxPipeline (the one text pipeline today), its encode_prompt:
 *   tokenizer   + text_encoder   (CLIPTextModel): 77 tokens, padded and
 *                truncated; its pooler_output is the pooled vector (Dp)
 *   tokenizer_2 + text_encoder_2 (T5EncoderModel): max_sequence_length
 *                tokens; its last_hidden_state is the sequence (L, Dt)
 * Neither encoder gets an attention mask (the pipeline passes none): the
 * padding is attended to, as in Diffusers. Another pipeline class is
 * refused by name.
 *
 * The cache is keyed by (model folder, prompt, max_sequence_length) and
 * holds sequence and pooled vector together; its bounds are the caller's.
 * A hit returns the very floats the encoders gave (bit for bit).
 *
 * What it is not: the tokenizers or encoders (engine/text), the placement
 * on a rank (engine/worker: the text-encoder rank runs this and broadcasts
 * the embeddings to its group), or thread-safe: one thread owns it.
 */
#ifndef DITD_ENGINE_PROMPT_ENCODER_H
#define DITD_ENGINE_PROMPT_ENCODER_H

#include <stddef.h>
#include <stdint.h>

#include "engine/backend/backend.h"
#include "engine/models/model.h"

typedef struct ditd_prompt_encoder ditd_prompt_encoder;

typedef struct ditd_prompt_encoder_opts {
    int max_sequence_length; /* the longest T5 sequence asked for (1..512) */
    size_t cache_entries;    /* LRU bounds; 0 entries: no cache */
    size_t cache_bytes;
} ditd_prompt_encoder_opts;

typedef struct ditd_prompt_stats {
    uint64_t encodes;        /* prompts through the encoders */
    uint64_t hits, misses;   /* cache */
    uint64_t entries;        /* cache, now */
    double encode_ms;        /* time in tokenizers and encoders, since start */
} ditd_prompt_stats;

/* Loads the text components of info's folder (a text model: its
 * shapes.cond.kind is DITD_COND_TEXT) on the CPU backend `ops`. The
 * encoders' widths must be the transformer's (T5 d_model =
 * joint_attention_dim = cond.text_dim, CLIP hidden = cond.pooled_dim):
 * refused naming both otherwise. *out owned: ditd_prompt_encoder_free. */
int ditd_prompt_encoder_new(const ditd_model_info *info, const ditd_backend_ops *ops,
                            const ditd_prompt_encoder_opts *opts, ditd_prompt_encoder **out);
void ditd_prompt_encoder_free(ditd_prompt_encoder *e);

/* Widths of the outputs: Dt and Dp. */
int ditd_prompt_encoder_text_dim(const ditd_prompt_encoder *e);
int ditd_prompt_encoder_pooled_dim(const ditd_prompt_encoder *e);

/* Encodes `len` bytes of UTF-8 text at max_sequence_length L (1..the
 * opts' maximum): seq (L, Dt) and pooled (Dp), host f32, caller's. From
 * the cache when it holds the key. 0, DITD_EINVAL (invalid UTF-8, L out of
 * range; named), or an encoder's error. */
int ditd_prompt_encoder_encode(ditd_prompt_encoder *e, const char *text, size_t len,
                               int max_sequence_length, float *seq, float *pooled);

void ditd_prompt_encoder_stats(const ditd_prompt_encoder *e, ditd_prompt_stats *out);

#endif
