/* The prompt-embedding LRU cache (engine/text/text_cache.c) against a
 * reference LRU written here as a plain array: random gets and puts over a
 * small key space (model, prompt, max length all part of the key), values of
 * random sizes, both bounds (entries, bytes) binding. Every get must agree
 * on hit or miss and on the value; the counters must match. */
#include "engine/text/text_cache.h"
#include "tests/test_util.h"

#define KEYS 24
#define MAXE 7
#define MAXB (200 * sizeof(float))

typedef struct ref_entry {
    int key;
    size_t n;
    float v[256];
} ref_entry;

static ref_entry ref[KEYS]; /* [0] most recent */
static int nref;
static size_t ref_bytes;
static uint64_t ref_evictions;

static void key_of(int k, char *model, char *prompt, int *len)
{
    /* model, prompt and length each vary: keys equal only when all three do */
    snprintf(model, 16, "m%d", k % 2);
    snprintf(prompt, 32, k / 4 == 0 ? "" : "a prompt %d", k / 4);
    *len = 77 + (k / 2 % 2) * 435;
}

static int ref_find(int k)
{
    for (int i = 0; i < nref; i++)
        if (ref[i].key == k)
            return i;
    return -1;
}

static void ref_touch(int i)
{
    ref_entry e = ref[i];
    memmove(&ref[1], &ref[0], (size_t)i * sizeof ref[0]);
    ref[0] = e;
}

static void ref_put(int k, const float *v, size_t n)
{
    if (n * sizeof(float) > MAXB)
        return;
    int i = ref_find(k);
    if (i >= 0) {
        ref_bytes -= ref[i].n * sizeof(float);
        memmove(&ref[i], &ref[i + 1], (size_t)(nref - i - 1) * sizeof ref[0]);
        nref--;
    }
    memmove(&ref[1], &ref[0], (size_t)nref * sizeof ref[0]);
    ref[0].key = k;
    ref[0].n = n;
    memcpy(ref[0].v, v, n * sizeof(float));
    nref++;
    ref_bytes += n * sizeof(float);
    while (nref > MAXE || ref_bytes > MAXB) {
        ref_bytes -= ref[nref - 1].n * sizeof(float);
        nref--;
        ref_evictions++;
    }
}

int main(void)
{
    ditd_text_cache *c = NULL;
    uint64_t hits = 0, misses = 0;
    tu_seed();
    TU_CHECK_ERR(ditd_text_cache_new(0, 10, &c), DITD_EINVAL, "0 entries");
    TU_OK(ditd_text_cache_new(MAXE, MAXB, &c));
    if (!c)
        return tu_exit();
    int ops = 20000, mismatches = 0;
    for (int t = 0; t < ops; t++) {
        int k = (int)(tu_rng() % KEYS);
        char model[16], prompt[32];
        int len;
        key_of(k, model, prompt, &len);
        if (tu_rng() % 3) {
            const float *d = NULL;
            size_t n = 0;
            int hit = ditd_text_cache_get(c, model, prompt, len, &d, &n);
            int i = ref_find(k);
            int ok = hit == (i >= 0) && (!hit || (n == ref[i].n && memcmp(d, ref[i].v, n * sizeof(float)) == 0));
            if (!ok && mismatches++ < 5)
                fprintf(stderr, "op %d get key %d: cache hit %d n %zu, reference %d\n", t, k, hit, n, i);
            if (i >= 0) {
                ref_touch(i);
                hits++;
            } else {
                misses++;
            }
        } else {
            float v[256];
            /* 0..79 floats, and now and then 210: over the byte bound, not kept */
            size_t n = tu_rng() % 50 ? (size_t)(tu_rng() % 80) : 210;
            for (size_t j = 0; j < n; j++)
                v[j] = (float)(tu_rng() % 1000) + 0.5f;
            TU_OK(ditd_text_cache_put(c, model, prompt, len, v, n));
            ref_put(k, v, n);
        }
    }
    TU_CHECK(mismatches == 0, "%d of %d operations disagree with the reference LRU", mismatches, ops);
    ditd_text_cache_stats st;
    ditd_text_cache_stats_get(c, &st);
    TU_CHECK(st.hits == hits && st.misses == misses && st.evictions == ref_evictions &&
                 st.entries == (uint64_t)nref && st.bytes == ref_bytes,
             "stats hits %llu/%llu misses %llu/%llu evictions %llu/%llu entries %llu/%d bytes %llu/%zu",
             (unsigned long long)st.hits, (unsigned long long)hits, (unsigned long long)st.misses,
             (unsigned long long)misses, (unsigned long long)st.evictions, (unsigned long long)ref_evictions,
             (unsigned long long)st.entries, nref, (unsigned long long)st.bytes, ref_bytes);
    TU_CHECK(hits > 1000 && misses > 1000 && ref_evictions > 100, "the run exercised hits %llu, misses %llu, "
             "evictions %llu", (unsigned long long)hits, (unsigned long long)misses,
             (unsigned long long)ref_evictions);
    printf("%d operations: %llu hits, %llu misses, %llu evictions\n", ops, (unsigned long long)hits,
           (unsigned long long)misses, (unsigned long long)ref_evictions);
    ditd_text_cache_free(c);
    return tu_exit();
}
