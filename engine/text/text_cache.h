/* A bounded LRU cache of prompt embeddings, keyed by (model, prompt, max
 * length): a repeated prompt skips the text encoder. Values are float
 * arrays the caller packs (sequence embeddings, pooled vector, ...); the
 * cache copies them in and hands out borrowed pointers.
 *
 * Bounds: at most max_entries entries and max_bytes bytes of values; a put
 * evicts least-recently-used entries until both hold; a value larger than
 * max_bytes alone is not kept.
 *
 * Threads: one owner thread calls get/put (the rank that runs the
 * encoders); ditd_text_cache_stats may be called from any thread (the
 * counters are atomics), for /metrics.
 *
 * What it is not: an encoder or a tokenizer; it never looks inside a value.
 */
#ifndef DITD_ENGINE_TEXT_CACHE_H
#define DITD_ENGINE_TEXT_CACHE_H

#include <stddef.h>
#include <stdint.h>

typedef struct ditd_text_cache ditd_text_cache;

typedef struct ditd_text_cache_stats {
    uint64_t hits, misses, evictions;
    uint64_t entries, bytes;
} ditd_text_cache_stats;

/* max_entries >= 1, max_bytes >= 1. *out owned (ditd_text_cache_free).
 * 0, DITD_EINVAL, DITD_ENOMEM. */
int ditd_text_cache_new(size_t max_entries, size_t max_bytes, ditd_text_cache **out);
void ditd_text_cache_free(ditd_text_cache *c);

/* Looks up the key; a hit marks it most recently used and returns 1 with
 * *data (borrowed: valid until the next put or free) and *n floats; a miss
 * returns 0. Counts the hit or the miss. */
int ditd_text_cache_get(ditd_text_cache *c, const char *model, const char *prompt,
                        int max_length, const float **data, size_t *n);

/* Copies n floats under the key (replacing a value already there), then
 * evicts LRU entries until the bounds hold. 0, or DITD_ENOMEM (the cache
 * is unchanged). A value over max_bytes is not stored (returns 0). */
int ditd_text_cache_put(ditd_text_cache *c, const char *model, const char *prompt,
                        int max_length, const float *data, size_t n);

void ditd_text_cache_stats_get(const ditd_text_cache *c, ditd_text_cache_stats *out);

#endif
