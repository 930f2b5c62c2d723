/* The tables under the tokenizers: a string -> id map (the vocabulary) and an
 * integer-pair -> value map (BPE merges, trie edges), both open addressing,
 * built once at load and read-only after, so any number of threads may look
 * up at once. Also the growing id list an encode fills, and the UTF-8 and
 * Unicode-class helpers both tokenizers share (classes from utf8proc).
 *
 * Internal to engine/text (ditd__ names); not a general container library.
 */
#ifndef DITD_ENGINE_TEXT_VOCAB_H
#define DITD_ENGINE_TEXT_VOCAB_H

#include <stddef.h>
#include <stdint.h>

typedef struct ditd__vocab {
    char *arena;        /* the strings, back to back */
    size_t arena_len, arena_cap;
    struct ditd__vocab_ent { uint32_t off, len; int32_t id; } *ent;
    size_t n, ent_cap;
    int32_t *slot;      /* index into ent, -1 empty; power-of-two size */
    size_t nslot;
    int32_t max_id;
    int32_t *by_id;     /* id -> ent index, -1 none (max_id + 1 long) */
} ditd__vocab;

int ditd__vocab_init(ditd__vocab *v, size_t expect);
/* Adds s -> id. A string already present keeps its first id and returns 1
 * (the callers decide whether that is an error). */
int ditd__vocab_put(ditd__vocab *v, const char *s, size_t len, int32_t id);
/* The id of s, or -1. */
int32_t ditd__vocab_get(const ditd__vocab *v, const char *s, size_t len);
/* Builds the id -> string index; call once after the last put. */
int ditd__vocab_index(ditd__vocab *v);
/* The string of id (borrowed) and its length, or NULL. */
const char *ditd__vocab_str(const ditd__vocab *v, int32_t id, size_t *len);
void ditd__vocab_free(ditd__vocab *v);

/* (a, b) -> (value1, value2), keys of 64 bits. */
typedef struct ditd__pairmap {
    struct ditd__pair_ent { uint64_t key; int32_t v1, v2; } *ent;
    size_t n, cap; /* cap a power of two; key UINT64_MAX marks empty */
} ditd__pairmap;

int ditd__pairmap_init(ditd__pairmap *m, size_t expect);
/* Inserts or keeps the first value; returns 1 when the key was there. */
int ditd__pairmap_put(ditd__pairmap *m, uint64_t key, int32_t v1, int32_t v2);
/* Pointer to the entry's values, or NULL. */
const struct ditd__pair_ent *ditd__pairmap_get(const ditd__pairmap *m, uint64_t key);
void ditd__pairmap_free(ditd__pairmap *m);

/* The ids of one encode: at most `limit` are kept; encoders stop early once
 * full (truncation keeps the left part, so the rest of the text cannot
 * change what is kept). */
typedef struct ditd__ids {
    int32_t *v;
    size_t n, limit;
} ditd__ids;

static inline int ditd__ids_full(const ditd__ids *ids) { return ids->n >= ids->limit; }
static inline void ditd__ids_push(ditd__ids *ids, int32_t id)
{
    if (ids->n < ids->limit)
        ids->v[ids->n++] = id;
}

/* A growable byte string. */
typedef struct ditd__buf { char *p; size_t n, cap; } ditd__buf;
int ditd__buf_put(ditd__buf *b, const void *s, size_t n);
void ditd__buf_free(ditd__buf *b);

/* Decodes one UTF-8 code point at s[0..n) (n > 0) of already validated text;
 * returns its length. */
static inline int ditd__utf8_next(const char *s, size_t n, int32_t *cp)
{
    const unsigned char *u = (const unsigned char *)s;
    (void)n;
    if (u[0] < 0x80) { *cp = u[0]; return 1; }
    if (u[0] < 0xE0) { *cp = ((u[0] & 0x1F) << 6) | (u[1] & 0x3F); return 2; }
    if (u[0] < 0xF0) { *cp = ((u[0] & 0x0F) << 12) | ((u[1] & 0x3F) << 6) | (u[2] & 0x3F); return 3; }
    *cp = ((u[0] & 0x07) << 18) | ((u[1] & 0x3F) << 12) | ((u[2] & 0x3F) << 6) | (u[3] & 0x3F);
    return 4;
}
/* Encodes cp into out (4 bytes room); returns the length. */
int ditd__utf8_put(int32_t cp, char *out);
/* Byte offset of the first invalid UTF-8 sequence in s, or -1 when s is
 * valid (overlongs, surrogates and code points past U+10FFFF are invalid). */
long ditd__utf8_check(const char *s, size_t n);

/* Unicode classes as the tokenizers' regexes (Oniguruma) see them:
 * White_Space (\s, and Rust's char::is_whitespace), \p{L}, \p{N}. */
int ditd__uc_is_space(int32_t cp);
int ditd__uc_is_letter(int32_t cp);
int ditd__uc_is_number(int32_t cp);

/* Whole file into a malloc'd, NUL-terminated buffer. ENOENT -> DITD_ENOENT. */
int ditd__read_file(const char *path, char **data, size_t *len);

#endif
