/* WanPipeline's text side (diffusers 0.42, pipelines/wan/pipeline_wan.py):
 * prompt_clean, and _get_t5_prompt_embeds as __call__ runs it (the prompt
 * cleaned, tokenized to max_sequence_length with padding="max_length" and
 * truncation, encoded by the UMT5 encoder with the attention mask, then the
 * rows past each prompt's token count set to zero).
 *
 * prompt_clean is basic_clean + whitespace_clean: html.unescape twice,
 * strip, every run of whitespace (Python's str.isspace set, as re's \s
 * matches on str) to one space, strip. basic_clean also calls
 * ftfy.fix_text when ftfy is installed; ditd does not repair mojibake, so
 * ditd's ids equal Diffusers' run without ftfy, and with it on every prompt
 * ftfy leaves unchanged (docs/text.md).
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

/* Python's html.unescape of len bytes of UTF-8 (NUL bytes are text): named
 * references (HTML5's, the longest prefix when none matches whole), decimal
 * and hex references with html's replacements. Appends to a malloc'd,
 * NUL-terminated *out of *out_len bytes (owned). 0, DITD_EINVAL (invalid
 * UTF-8, naming the byte offset), DITD_ENOMEM. */
int ditd_html_unescape(const char *text, size_t len, char **out, size_t *out_len);

/* WanPipeline's prompt_clean without ftfy (see above). *out owned, as
 * ditd_html_unescape. */
int ditd_wan_prompt_clean(const char *text, size_t len, char **out, size_t *out_len);

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
