/* T5's SentencePiece unigram model as transformers 5's T5Tokenizer builds it
 * on the `tokenizers` library: the precompiled charsmap normalizer
 * (SentencePiece's double-array trie, applied per extended grapheme cluster
 * the way tokenizers' Precompiled does), WhitespaceSplit, Metaspace ("▁",
 * prepended to every word, split before every "▁"), then Viterbi over the
 * pieces (scores as doubles, unknown characters at min score - 10, runs of
 * unknowns fused). The pieces come from tokenizer.json or spiece.model.
 *
 * Internal to engine/text: tokenizer.c reads the folder, splits out added
 * tokens and adds </s> and padding; this file is the model only.
 */
#ifndef DITD_ENGINE_TEXT_TOKENIZER_T5_H
#define DITD_ENGINE_TEXT_TOKENIZER_T5_H

#include <jansson.h>

#include "engine/text/vocab.h"

typedef struct ditd__t5 ditd__t5;

/* From tokenizer.json's "model" (type Unigram) and "normalizer" (only its
 * Precompiled charsmap is used, as transformers 5 does). */
int ditd__t5_load_json(const json_t *model, const json_t *normalizer, const char *name, ditd__t5 **out);
/* From a spiece.model image; extra_ids sentinels <extra_id_N> are appended
 * after the pieces in reverse order, score 0 (as T5Tokenizer does). */
int ditd__t5_load_spm(const void *data, size_t len, const char *name, int extra_ids, ditd__t5 **out);
void ditd__t5_free(ditd__t5 *m);

const ditd__vocab *ditd__t5_vocab(const ditd__t5 *m);
int32_t ditd__t5_unk_id(const ditd__t5 *m);

/* The charsmap normalizer on valid UTF-8; appends to out. */
int ditd__t5_normalize(const ditd__t5 *m, const char *s, size_t n, ditd__buf *out);
/* WhitespaceSplit + Metaspace + Viterbi on normalized text; appends ids,
 * stops once full. Thread-safe (reads m only). */
int ditd__t5_encode(const ditd__t5 *m, const char *s, size_t n, ditd__ids *ids);

/* Checks a precompiled charsmap image (trie size, bounds); exposed for the
 * fuzz target. */
int ditd__charsmap_check(const unsigned char *cm, size_t len, const char *name);

#endif
