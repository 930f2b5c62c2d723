/* The string and pair tables, id lists, UTF-8 helpers and Unicode classes
 * under engine/text's tokenizers (see vocab.h). */
#include "engine/text/vocab.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "engine/core/error.h"

static uint64_t hash_bytes(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)s[i];
        h *= 1099511628211ull;
    }
    return h ^ (h >> 29);
}

static uint64_t hash_u64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 33);
}

int ditd__vocab_init(ditd__vocab *v, size_t expect)
{
    memset(v, 0, sizeof(*v));
    v->nslot = 16;
    while (v->nslot < 2 * expect + 2)
        v->nslot *= 2;
    v->slot = malloc(v->nslot * sizeof(*v->slot));
    if (!v->slot)
        return ditd_err_set(DITD_ENOMEM, "vocabulary of %zu entries", expect);
    memset(v->slot, 0xff, v->nslot * sizeof(*v->slot));
    v->max_id = -1;
    return 0;
}

static int vocab_grow(ditd__vocab *v)
{
    size_t ns = v->nslot * 2;
    int32_t *slot = malloc(ns * sizeof(*slot));
    if (!slot)
        return ditd_err_set(DITD_ENOMEM, "vocabulary table");
    memset(slot, 0xff, ns * sizeof(*slot));
    for (size_t i = 0; i < v->n; i++) {
        uint64_t h = hash_bytes(v->arena + v->ent[i].off, v->ent[i].len);
        size_t j = h & (ns - 1);
        while (slot[j] >= 0)
            j = (j + 1) & (ns - 1);
        slot[j] = (int32_t)i;
    }
    free(v->slot);
    v->slot = slot;
    v->nslot = ns;
    return 0;
}

int ditd__vocab_put(ditd__vocab *v, const char *s, size_t len, int32_t id)
{
    if (len > UINT32_MAX / 2 || v->n >= INT32_MAX / 4)
        return ditd_err_set(DITD_ERANGE, "vocabulary entry too long or too many entries");
    if (ditd__vocab_get(v, s, len) >= 0)
        return 1;
    if (2 * (v->n + 1) > v->nslot) {
        int err = vocab_grow(v);
        if (err)
            return err;
    }
    if (v->n == v->ent_cap) {
        size_t nc = v->ent_cap ? 2 * v->ent_cap : 1024;
        void *p = realloc(v->ent, nc * sizeof(*v->ent));
        if (!p)
            return ditd_err_set(DITD_ENOMEM, "vocabulary entries");
        v->ent = p;
        v->ent_cap = nc;
    }
    if (v->arena_len + len + 1 > v->arena_cap) {
        size_t nc = v->arena_cap ? 2 * v->arena_cap : 65536;
        while (nc < v->arena_len + len + 1)
            nc *= 2;
        if (nc > UINT32_MAX)
            return ditd_err_set(DITD_ERANGE, "vocabulary strings past 4 GiB");
        void *p = realloc(v->arena, nc);
        if (!p)
            return ditd_err_set(DITD_ENOMEM, "vocabulary strings");
        v->arena = p;
        v->arena_cap = nc;
    }
    memcpy(v->arena + v->arena_len, s, len);
    v->arena[v->arena_len + len] = '\0';
    v->ent[v->n] = (struct ditd__vocab_ent){(uint32_t)v->arena_len, (uint32_t)len, id};
    v->arena_len += len + 1;
    size_t j = hash_bytes(s, len) & (v->nslot - 1);
    while (v->slot[j] >= 0)
        j = (j + 1) & (v->nslot - 1);
    v->slot[j] = (int32_t)v->n++;
    if (id > v->max_id)
        v->max_id = id;
    return 0;
}

int32_t ditd__vocab_get(const ditd__vocab *v, const char *s, size_t len)
{
    size_t j = hash_bytes(s, len) & (v->nslot - 1);
    while (v->slot[j] >= 0) {
        const struct ditd__vocab_ent *e = &v->ent[v->slot[j]];
        if (e->len == len && memcmp(v->arena + e->off, s, len) == 0)
            return e->id;
        j = (j + 1) & (v->nslot - 1);
    }
    return -1;
}

int ditd__vocab_index(ditd__vocab *v)
{
    free(v->by_id);
    v->by_id = malloc(((size_t)v->max_id + 1) * sizeof(*v->by_id) + 1);
    if (!v->by_id)
        return ditd_err_set(DITD_ENOMEM, "vocabulary index");
    for (int32_t i = 0; i <= v->max_id; i++)
        v->by_id[i] = -1;
    for (size_t i = 0; i < v->n; i++)
        if (v->ent[i].id >= 0 && v->by_id[v->ent[i].id] < 0)
            v->by_id[v->ent[i].id] = (int32_t)i;
    return 0;
}

const char *ditd__vocab_str(const ditd__vocab *v, int32_t id, size_t *len)
{
    if (!v->by_id || id < 0 || id > v->max_id || v->by_id[id] < 0)
        return NULL;
    const struct ditd__vocab_ent *e = &v->ent[v->by_id[id]];
    if (len)
        *len = e->len;
    return v->arena + e->off;
}

void ditd__vocab_free(ditd__vocab *v)
{
    free(v->arena);
    free(v->ent);
    free(v->slot);
    free(v->by_id);
    memset(v, 0, sizeof(*v));
}

int ditd__pairmap_init(ditd__pairmap *m, size_t expect)
{
    memset(m, 0, sizeof(*m));
    m->cap = 16;
    while (m->cap < 2 * expect + 2)
        m->cap *= 2;
    m->ent = malloc(m->cap * sizeof(*m->ent));
    if (!m->ent)
        return ditd_err_set(DITD_ENOMEM, "table of %zu pairs", expect);
    for (size_t i = 0; i < m->cap; i++)
        m->ent[i].key = UINT64_MAX;
    return 0;
}

int ditd__pairmap_put(ditd__pairmap *m, uint64_t key, int32_t v1, int32_t v2)
{
    if (2 * (m->n + 1) > m->cap) {
        ditd__pairmap g;
        int err = ditd__pairmap_init(&g, m->cap);
        if (err)
            return err;
        for (size_t i = 0; i < m->cap; i++)
            if (m->ent[i].key != UINT64_MAX)
                ditd__pairmap_put(&g, m->ent[i].key, m->ent[i].v1, m->ent[i].v2);
        free(m->ent);
        *m = g;
    }
    size_t j = hash_u64(key) & (m->cap - 1);
    while (m->ent[j].key != UINT64_MAX) {
        if (m->ent[j].key == key)
            return 1;
        j = (j + 1) & (m->cap - 1);
    }
    m->ent[j] = (struct ditd__pair_ent){key, v1, v2};
    m->n++;
    return 0;
}

const struct ditd__pair_ent *ditd__pairmap_get(const ditd__pairmap *m, uint64_t key)
{
    size_t j = hash_u64(key) & (m->cap - 1);
    while (m->ent[j].key != UINT64_MAX) {
        if (m->ent[j].key == key)
            return &m->ent[j];
        j = (j + 1) & (m->cap - 1);
    }
    return NULL;
}

void ditd__pairmap_free(ditd__pairmap *m)
{
    free(m->ent);
    memset(m, 0, sizeof(*m));
}

int ditd__buf_put(ditd__buf *b, const void *s, size_t n)
{
    if (b->n + n + 1 > b->cap) {
        size_t nc = b->cap ? 2 * b->cap : 256;
        while (nc < b->n + n + 1)
            nc *= 2;
        void *p = realloc(b->p, nc);
        if (!p)
            return ditd_err_set(DITD_ENOMEM, "text buffer of %zu bytes", nc);
        b->p = p;
        b->cap = nc;
    }
    if (n)
        memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
    return 0;
}

void ditd__buf_free(ditd__buf *b)
{
    free(b->p);
    memset(b, 0, sizeof(*b));
}

int ditd__utf8_put(int32_t cp, char *out)
{
    unsigned char *o = (unsigned char *)out;
    if (cp < 0x80) { o[0] = (unsigned char)cp; return 1; }
    if (cp < 0x800) { o[0] = 0xC0 | (cp >> 6); o[1] = 0x80 | (cp & 0x3F); return 2; }
    if (cp < 0x10000) {
        o[0] = 0xE0 | (cp >> 12); o[1] = 0x80 | ((cp >> 6) & 0x3F); o[2] = 0x80 | (cp & 0x3F);
        return 3;
    }
    o[0] = 0xF0 | (cp >> 18); o[1] = 0x80 | ((cp >> 12) & 0x3F);
    o[2] = 0x80 | ((cp >> 6) & 0x3F); o[3] = 0x80 | (cp & 0x3F);
    return 4;
}

long ditd__utf8_check(const char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s + i,
                                              (utf8proc_ssize_t)(n - i > 4 ? 4 : n - i), &cp);
        if (k <= 0)
            return (long)i;
        i += (size_t)k;
    }
    return -1;
}

int ditd__uc_is_space(int32_t cp)
{
    if ((cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85)
        return 1;
    if (cp < 0xA0)
        return 0;
    utf8proc_category_t c = utf8proc_category(cp);
    return c == UTF8PROC_CATEGORY_ZS || c == UTF8PROC_CATEGORY_ZL || c == UTF8PROC_CATEGORY_ZP;
}

int ditd__uc_is_letter(int32_t cp)
{
    if (cp < 0x80)
        return (cp | 0x20) >= 'a' && (cp | 0x20) <= 'z';
    utf8proc_category_t c = utf8proc_category(cp);
    return c >= UTF8PROC_CATEGORY_LU && c <= UTF8PROC_CATEGORY_LO;
}

int ditd__uc_is_number(int32_t cp)
{
    if (cp < 0x80)
        return cp >= '0' && cp <= '9';
    utf8proc_category_t c = utf8proc_category(cp);
    return c >= UTF8PROC_CATEGORY_ND && c <= UTF8PROC_CATEGORY_NO;
}

int ditd__read_file(const char *path, char **data, size_t *len)
{
    *data = NULL;
    *len = 0;
    FILE *f = fopen(path, "rb");
    if (!f)
        return ditd_err_set(errno == ENOENT ? DITD_ENOENT : DITD_EIO, "%s: %s", path, strerror(errno));
    int err = 0;
    char *buf = NULL;
    if (fseek(f, 0, SEEK_END) != 0) {
        err = ditd_err_set(DITD_EIO, "%s: cannot seek", path);
        goto fail;
    }
    long sz = ftell(f);
    if (sz < 0 || fseek(f, 0, SEEK_SET) != 0) {
        err = ditd_err_set(DITD_EIO, "%s: cannot size", path);
        goto fail;
    }
    buf = malloc((size_t)sz + 1);
    if (!buf) {
        err = ditd_err_set(DITD_ENOMEM, "%s: %ld bytes", path, sz);
        goto fail;
    }
    if (fread(buf, 1, (size_t)sz, f) != (size_t)sz) {
        err = ditd_err_set(DITD_EIO, "%s: short read", path);
        goto fail;
    }
    buf[sz] = '\0';
    fclose(f);
    *data = buf;
    *len = (size_t)sz;
    return 0;
fail:
    free(buf);
    fclose(f);
    return err;
}
