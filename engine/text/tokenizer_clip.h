/* CLIP's byte-level BPE, as transformers 5's CLIPTokenizer builds it on the
 * `tokenizers` library: normalizer NFC -> \s+ to " " -> lowercase; the
 * pre-tokenizer pattern
 *   <\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+
 * (matches kept, the rest dropped), then ByteLevel (GPT-2's pattern again,
 * bytes to printable code points), then BPE with the end-of-word suffix
 * "</w>", lowest merge rank first. Unicode classes and NFC from utf8proc.
 *
 * Internal to engine/text: tokenizer.c reads the folder, splits out added
 * tokens and adds bos/eos/padding; this file is the model only.
 */
#ifndef DITD_ENGINE_TEXT_TOKENIZER_CLIP_H
#define DITD_ENGINE_TEXT_TOKENIZER_CLIP_H

#include <jansson.h>

#include "engine/text/vocab.h"

typedef struct ditd__clip ditd__clip;

/* From vocab.json + merges.txt (the hub layout). `unk` names the unknown
 * token (CLIP: "<|endoftext|>"). */
int ditd__clip_load_files(const char *vocab_path, const char *merges_path, const char *unk,
                          ditd__clip **out);
/* From tokenizer.json's "model" object (type BPE). `name` is for messages. */
int ditd__clip_load_json(const json_t *model, const char *name, const char *unk, ditd__clip **out);
void ditd__clip_free(ditd__clip *m);

const ditd__vocab *ditd__clip_vocab(const ditd__clip *m);

/* The normalizer on valid UTF-8: NFC, runs of White_Space to one space,
 * lowercase (Rust's char::to_lowercase: full mapping). Appends to out. */
int ditd__clip_normalize(const char *s, size_t n, ditd__buf *out);

/* Pre-tokenizes normalized text and appends the BPE ids; stops once ids is
 * full. Thread-safe (reads m only). */
int ditd__clip_encode(const ditd__clip *m, const char *s, size_t n, ditd__ids *ids);

#endif
