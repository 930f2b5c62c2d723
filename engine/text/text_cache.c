/* LRU cache of prompt embeddings: a chained hash table over the keys and a
 * doubly linked recency list through the same entries. */
#include "engine/text/text_cache.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/error.h"

typedef struct entry {
    struct entry *next_hash;
    struct entry *prev, *next; /* recency: head = most recent */
    uint64_t hash;
    char *key;                 /* model \0 prompt \0, then the length */
    size_t key_len;
    float *data;
    size_t n;
} entry;

struct ditd_text_cache {
    entry **buckets;
    size_t nbuckets;
    entry *head, *tail;
    size_t max_entries, max_bytes;
    size_t entries, bytes;
    _Atomic uint64_t hits, misses, evictions, a_entries, a_bytes;
};

/* The key as bytes: model, NUL, prompt, NUL, max_length (4 bytes). */
static char *make_key(const char *model, const char *prompt, int max_length, size_t *len)
{
    size_t a = strlen(model), b = strlen(prompt);
    *len = a + 1 + b + 1 + sizeof max_length;
    char *k = malloc(*len);
    if (!k)
        return NULL;
    memcpy(k, model, a + 1);
    memcpy(k + a + 1, prompt, b + 1);
    memcpy(k + a + b + 2, &max_length, sizeof max_length);
    return k;
}

static uint64_t fnv1a(const char *p, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)p[i];
        h *= 1099511628211ull;
    }
    return h;
}

int ditd_text_cache_new(size_t max_entries, size_t max_bytes, ditd_text_cache **out)
{
    if (max_entries == 0 || max_bytes == 0 || max_entries > (1u << 24))
        return ditd_err_set(DITD_EINVAL, "text cache: %zu entries, %zu bytes (at least 1 each, "
                                         "at most 16M entries)",
                            max_entries, max_bytes);
    ditd_text_cache *c = calloc(1, sizeof *c);
    if (!c)
        return ditd_err_set(DITD_ENOMEM, "text cache");
    c->nbuckets = 16;
    while (c->nbuckets < max_entries)
        c->nbuckets <<= 1;
    c->buckets = calloc(c->nbuckets, sizeof *c->buckets);
    if (!c->buckets) {
        free(c);
        return ditd_err_set(DITD_ENOMEM, "text cache table");
    }
    c->max_entries = max_entries;
    c->max_bytes = max_bytes;
    *out = c;
    return 0;
}

static void unlink_lru(ditd_text_cache *c, entry *e)
{
    if (e->prev)
        e->prev->next = e->next;
    else
        c->head = e->next;
    if (e->next)
        e->next->prev = e->prev;
    else
        c->tail = e->prev;
    e->prev = e->next = NULL;
}

static void push_front(ditd_text_cache *c, entry *e)
{
    e->prev = NULL;
    e->next = c->head;
    if (c->head)
        c->head->prev = e;
    c->head = e;
    if (!c->tail)
        c->tail = e;
}

static entry **find_slot(ditd_text_cache *c, const char *key, size_t len, uint64_t h)
{
    entry **p = &c->buckets[h & (c->nbuckets - 1)];
    while (*p && !((*p)->hash == h && (*p)->key_len == len && memcmp((*p)->key, key, len) == 0))
        p = &(*p)->next_hash;
    return p;
}

/* Removes e from both structures and frees it. */
static void drop(ditd_text_cache *c, entry *e)
{
    entry **p = find_slot(c, e->key, e->key_len, e->hash);
    *p = e->next_hash;
    unlink_lru(c, e);
    c->entries--;
    c->bytes -= e->n * sizeof(float);
    free(e->key);
    free(e->data);
    free(e);
}

static void publish(ditd_text_cache *c)
{
    atomic_store(&c->a_entries, (uint64_t)c->entries);
    atomic_store(&c->a_bytes, (uint64_t)c->bytes);
}

void ditd_text_cache_free(ditd_text_cache *c)
{
    if (!c)
        return;
    while (c->head)
        drop(c, c->head);
    free(c->buckets);
    free(c);
}

int ditd_text_cache_get(ditd_text_cache *c, const char *model, const char *prompt,
                        int max_length, const float **data, size_t *n)
{
    size_t len;
    char *key = make_key(model, prompt, max_length, &len);
    if (!key) { /* no memory for the probe: a miss */
        atomic_fetch_add(&c->misses, 1);
        return 0;
    }
    entry *e = *find_slot(c, key, len, fnv1a(key, len));
    free(key);
    if (!e) {
        atomic_fetch_add(&c->misses, 1);
        return 0;
    }
    unlink_lru(c, e);
    push_front(c, e);
    atomic_fetch_add(&c->hits, 1);
    *data = e->data;
    *n = e->n;
    return 1;
}

int ditd_text_cache_put(ditd_text_cache *c, const char *model, const char *prompt,
                        int max_length, const float *data, size_t n)
{
    size_t len, bytes = n * sizeof(float);
    if (bytes > c->max_bytes)
        return 0;
    entry *e = calloc(1, sizeof *e);
    float *copy = malloc(bytes ? bytes : 1);
    char *key = make_key(model, prompt, max_length, &len);
    if (!e || !copy || !key) {
        free(e);
        free(copy);
        free(key);
        return ditd_err_set(DITD_ENOMEM, "text cache entry of %zu floats", n);
    }
    memcpy(copy, data, bytes);
    uint64_t h = fnv1a(key, len);
    entry *old = *find_slot(c, key, len, h);
    if (old)
        drop(c, old);
    e->hash = h;
    e->key = key;
    e->key_len = len;
    e->data = copy;
    e->n = n;
    entry **slot = &c->buckets[h & (c->nbuckets - 1)];
    e->next_hash = *slot;
    *slot = e;
    push_front(c, e);
    c->entries++;
    c->bytes += bytes;
    while (c->entries > c->max_entries || c->bytes > c->max_bytes) {
        drop(c, c->tail);
        atomic_fetch_add(&c->evictions, 1);
    }
    publish(c);
    return 0;
}

void ditd_text_cache_stats_get(const ditd_text_cache *c, ditd_text_cache_stats *out)
{
    ditd_text_cache *m = (ditd_text_cache *)c; /* atomics are read-only here */
    out->hits = atomic_load(&m->hits);
    out->misses = atomic_load(&m->misses);
    out->evictions = atomic_load(&m->evictions);
    out->entries = atomic_load(&m->a_entries);
    out->bytes = atomic_load(&m->a_bytes);
}
