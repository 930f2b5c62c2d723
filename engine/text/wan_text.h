/* WanPipeline's text side (diffusers 0.42, pipelines/wan/pipeline_wan.py):
 * _get_t5_prompt_embeds as __call__ runs it (the prompt
 * cleaned, tokenized to max_sequence_length with padding="max_length" and
 * truncation, encoded by the UMT5 encoder with the attention mask, then the
 * rows past each prompt's token count set to zero).
 *
 * prompt_clean is engine/text/prompt_clean.h.
 *
 * What it is not: the tokenizer (engine/text/tokenizer.h), the encoder
 * (engine/text/t5_encoder.h), negative prompts or CFG (the Wan recipe).
 */
#ifndef DITD_ENGINE_TEXT_WAN_TEXT_H
#define DITD_ENGINE_TEXT_WAN_TEXT_H

#include <stddef.h>
#include <stdint.h>

#include "engine/text/t5_encoder.h"
#include "engine/text/tokenizer.h"

/* The encoder on B rows of N ids with their mask (1 text, 0 padding; not
 * NULL), then every row where keep is 0 zeroed: (B, N, D) into out. As
 * ditd_t5_encoder_encode otherwise (sizes, ids). The mask must be 1s then
 * 0s per row, as the tokenizer pads (DITD_EINVAL otherwise): the pipeline
 * keeps the first sum(mask) rows, not the masked ones. */
int ditd_wan_text_encode(ditd_t5_encoder *m, int B, int N, const int64_t *ids, const uint8_t *keep,
                         float *out);

/* _get_t5_prompt_embeds for B prompts (NUL-terminated UTF-8): cleaned,
 * tokenized to max_len (the pipeline's max_sequence_length, 512), encoded,
 * zeroed past each prompt's tokens: (B, max_len, D) into out; seq_lens (B)
 * the token counts (may be NULL). The encoder must have been made for B x
 * max_len. Allocates its scratch per call (prompts are encoded once per
 * request, outside the denoising loop). */
int ditd_wan_prompt_embeds(ditd_t5_encoder *m, const ditd_tokenizer *tok, int B,
                           const char *const *prompts, int max_len, float *out, int *seq_lens);

#endif
