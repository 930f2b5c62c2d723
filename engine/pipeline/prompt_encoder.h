/* A text model's prompt encoder, as its Diffusers pipeline encodes a
 * prompt: the tokenizers and text encoders its pipeline row's recipe names
 * (engine/models/pipeline_class.h), run once per prompt (not per step), their
 * outputs joined as the recipe says, with a bounded LRU cache of the
 * results. The recipes built in:
 *
 *   FluxPipeline: CLIP's pooler_output at 77 tokens is the pooled vector;
 *     T5's last_hidden_state at max_sequence_length (prompt_2) the sequence.
 *   StableDiffusion3Pipeline: both CLIPs' hidden_states[-2] at 77 tokens
 *     joined on channels and zero-padded to the transformer's width, then
 *     T5's last_hidden_state at max_sequence_length (prompt_3; zeros when
 *     the folder has no text_encoder_3); the pooled vector is both CLIPs'
 *     projected text_embeds.
 *
 * No encoder gets an attention mask (the pipelines pass none): the padding
 * is attended to, as in Diffusers.
 *
 * LoRA adapters on the encoders (engine/text/text_lora.h): an adapter
 * file's text-encoder part is opened against this recipe's encoders
 * (ditd_prompt_encoder_lora_open) and a prompt is encoded with its own set
 * and weights (ditd_prompt_encoder_encode_lora); the base weights are never
 * changed.
 *
 * The cache is keyed by (model folder, prompts, max_sequence_length, the
 * adapters that change a number: each one's load id and exact weight, in
 * order) and holds sequence and pooled vector together; its bounds are the
 * caller's. A hit returns the very floats the encoders gave (bit for bit).
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
#include "engine/text/text_lora.h"

typedef struct ditd_prompt_encoder ditd_prompt_encoder;

typedef struct ditd_prompt_encoder_opts {
    int max_sequence_length; /* the longest T5 sequence asked for (1..the pipeline's) */
    size_t cache_entries;    /* LRU bounds; 0 entries: no cache */
    size_t cache_bytes;
} ditd_prompt_encoder_opts;

typedef struct ditd_prompt_stats {
    uint64_t encodes;        /* prompts through the encoders */
    uint64_t hits, misses;   /* cache */
    uint64_t entries;        /* cache, now */
    double encode_ms;        /* time in tokenizers and encoders, since start */
} ditd_prompt_stats;

/* Up to three prompts, as the pipelines take prompt, prompt_2, prompt_3 (or
 * the negative ones): texts[k] with lens[k] bytes; an absent (NULL) or empty
 * texts[k] for k > 0 falls back to texts[0] ("prompt_2 or prompt"). */
typedef struct ditd_prompt_texts {
    const char *texts[3];
    size_t lens[3];
} ditd_prompt_texts;

/* Loads the text components of info's folder (a text model: its
 * shapes.cond.kind is DITD_COND_TEXT) as its pipeline row's recipe names
 * them, on the CPU backend `ops`. The joined widths must be the
 * transformer's (the sequence's cond.text_dim, the pooled vector's
 * cond.pooled_dim): refused naming the encoders and the transformer's keys
 * otherwise. *out owned: ditd_prompt_encoder_free. */
int ditd_prompt_encoder_new(const ditd_model_info *info, const ditd_backend_ops *ops,
                            const ditd_prompt_encoder_opts *opts, ditd_prompt_encoder **out);
void ditd_prompt_encoder_free(ditd_prompt_encoder *e);

/* Widths of the outputs: Dt and Dp. */
int ditd_prompt_encoder_text_dim(const ditd_prompt_encoder *e);
int ditd_prompt_encoder_pooled_dim(const ditd_prompt_encoder *e);
/* Tokens of the sequence at max_sequence_length L (FLUX: L; SD3: 77 + L). */
int ditd_prompt_encoder_text_len(const ditd_prompt_encoder *e, int max_sequence_length);

/* Encodes the prompts at max_sequence_length L (1..the opts' maximum): seq
 * (text_len(L), Dt) and pooled (Dp), host f32, caller's. From the cache when
 * it holds the key. 0, DITD_EINVAL (invalid UTF-8, L out of range; named),
 * or an encoder's error. */
int ditd_prompt_encoder_encode_n(ditd_prompt_encoder *e, const ditd_prompt_texts *t,
                                 int max_sequence_length, float *seq, float *pooled);
/* The same with the text encoders' LoRA adapters of the prompt (loras NULL
 * or empty: none; each adapter opened by ditd_prompt_encoder_lora_open on
 * this encoder). */
int ditd_prompt_encoder_encode_lora(ditd_prompt_encoder *e, const ditd_prompt_texts *t,
                                    int max_sequence_length, const ditd_text_lora_set *loras,
                                    float *seq, float *pooled);
/* The same with one text for every encoder. */
int ditd_prompt_encoder_encode(ditd_prompt_encoder *e, const char *text, size_t len,
                               int max_sequence_length, float *seq, float *pooled);

/* The text-encoder part of the adapter file `path` for this recipe's
 * encoders (ditd_text_lora_open: PEFT names <component>.<module>, kohya
 * lora_te1_ / lora_te_ for the first CLIP, lora_te2_ for a second; a UMT5
 * or a component the folder lacks is refused naming the tensor). A file
 * without text-encoder tensors gives an adapter touching nothing. *out
 * owned (ditd_text_lora_free), to be used with this encoder only. */
int ditd_prompt_encoder_lora_open(const ditd_prompt_encoder *e, const char *path,
                                  const char *name, ditd_text_lora **out);

void ditd_prompt_encoder_stats(const ditd_prompt_encoder *e, ditd_prompt_stats *out);

#endif
