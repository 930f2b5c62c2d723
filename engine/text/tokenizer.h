/* Text tokenizers read from the tokenizer folder of a Diffusers model
 * (tokenizer/, tokenizer_2/, ...): CLIP byte-level BPE and T5 SentencePiece
 * unigram, giving the same ids as transformers 5's CLIPTokenizer and
 * T5Tokenizer as the Diffusers pipelines call them (padding="max_length",
 * truncation=True). Both folder layouts: the hub's (vocab.json + merges.txt;
 * spiece.model and/or tokenizer.json; tokenizer_config.json,
 * special_tokens_map.json) and what transformers 5 saves (tokenizer.json +
 * tokenizer_config.json). See docs/text.md.
 *
 * Not here: the text encoders (engine/text/clip*, t5*), decoding ids back to
 * text, pairs of sequences, BPE dropout, byte fallback.
 */
#ifndef DITD_ENGINE_TEXT_TOKENIZER_H
#define DITD_ENGINE_TEXT_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

typedef enum ditd_tok_kind {
    DITD_TOK_CLIP = 0, /* CLIPTokenizer(Fast): BPE, <|startoftext|> ... <|endoftext|> */
    DITD_TOK_T5,       /* T5Tokenizer(Fast): unigram, ... </s> */
    DITD_TOK__COUNT
} ditd_tok_kind;

/* "clip", "t5". */
const char *ditd_tok_kind_name(ditd_tok_kind k);
/* Accepts the names above and transformers' class names (CLIPTokenizer,
 * CLIPTokenizerFast, T5Tokenizer, T5TokenizerFast). */
int ditd_tok_kind_from_str(const char *s, ditd_tok_kind *out);

typedef struct ditd_tokenizer ditd_tokenizer;

/* Loads the tokenizer in folder `dir`. The kind comes from
 * tokenizer_config.json's tokenizer_class, else tokenizer.json's model type,
 * else the files present. Returns owned in *out; errors name the file and
 * what is wrong. */
int ditd_tokenizer_load(const char *dir, ditd_tokenizer **out);

/* Loads the tokenizer a Diffusers model folder names: model_index.json's
 * entry `component` (e.g. "tokenizer_2": ["transformers", "T5TokenizerFast"])
 * must name a supported class; the folder model_dir/component is loaded and
 * must be of that kind. */
int ditd_tokenizer_load_component(const char *model_dir, const char *component, ditd_tokenizer **out);

/* Encodes `len` bytes of UTF-8 text (NUL bytes are text too) as the pipelines
 * do: special tokens in the text are recognised, the content is truncated to
 * max_length minus the special tokens, bos (CLIP) and eos are added, then
 * padded to max_length with the pad id. Writes max_length ids and (when mask
 * is not NULL) max_length mask values (1 for real tokens, 0 for padding), and
 * the count of real tokens in *n_tokens (may be NULL). Invalid UTF-8 is refused (DITD_EINVAL naming the
 * byte offset). Work is linear in the text up to the point where max_length
 * tokens are filled. Thread-safe: any number of threads may encode with one
 * tokenizer at once (it is read-only after load). */
int ditd_tokenizer_encode(const ditd_tokenizer *t, const char *text, size_t len, int max_length,
                          int32_t *ids, int32_t *mask, int *n_tokens);

ditd_tok_kind ditd_tokenizer_kind(const ditd_tokenizer *t);
/* Special ids; -1 where the kind has none (T5 has no bos). */
int32_t ditd_tokenizer_bos_id(const ditd_tokenizer *t);
int32_t ditd_tokenizer_eos_id(const ditd_tokenizer *t);
int32_t ditd_tokenizer_pad_id(const ditd_tokenizer *t);
/* tokenizer_config.json's model_max_length (CLIP 77, T5 512), or 0. */
int ditd_tokenizer_model_max_length(const ditd_tokenizer *t);
/* Largest id + 1 (added tokens included). */
int32_t ditd_tokenizer_vocab_size(const ditd_tokenizer *t);
/* The string of an id (borrowed), or NULL. */
const char *ditd_tokenizer_token(const ditd_tokenizer *t, int32_t id);

void ditd_tokenizer_free(ditd_tokenizer *t);

#endif
