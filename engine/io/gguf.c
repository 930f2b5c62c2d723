/* GGUF reader: mmap, validate everything, dequantize to f32 on read.
 *
 * File layout (ggml docs/gguf.md), little-endian:
 *   "GGUF" | u32 version | u64 tensor_count | u64 kv_count
 *   kv_count x  { string key | u32 value_type | value }
 *   tensor_count x { string name | u32 n_dims | u64 ne[n_dims] | u32 type | u64 offset }
 *   padding to general.alignment (default 32) | data section
 * A string is u64 length + bytes (no terminator); an array is u32 element
 * type + u64 count + elements (ggml refuses arrays of arrays, and so do we).
 *
 * What we refuse, beyond a read past the end: version other than 2 or 3; a
 * count that could not fit in what is left of the file (before any
 * allocation, so a hostile count costs nothing); duplicate keys or tensor
 * names; a name with a NUL byte; a BOOL other than 0 or 1; an alignment
 * that is not a UINT32 power of two; 0 or more than 4 dimensions, a
 * negative dimension or an element count over INT64_MAX; an unknown type
 * number; ne[0] not a multiple of the type's block; an offset that is not a
 * multiple of the alignment or runs past the end; overlapping tensors.
 * (ggml also asks that tensors be packed in order; holes are harmless here.)
 *
 * Keys and names are copied out; tensor data and array elements stay in
 * the mapping.
 */
#include "engine/io/gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/core/error.h"
#include "engine/core/tensor.h"
#include "kernels/cpu/dequant.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "ditd reads little-endian GGUF and needs a little-endian host"
#endif

#define NAME_FMT "%.200s"
#define GGUF_DEFAULT_ALIGNMENT 32

struct ditd_gguf {
    char *path;
    void *map; /* NULL when the bytes are borrowed */
    size_t map_len;
    uint32_t version;
    size_t alignment;
    ditd_gguf_kv *kvs;     /* file order */
    size_t nkv;
    size_t *kv_sorted;     /* indices of kvs sorted by key */
    ditd_gguf_tensor *tensors; /* sorted by name once open */
    size_t count;
};

/* ---- types ------------------------------------------------------------- */

typedef struct type_row {
    const char *name;
    int num, elems, bytes;
} type_row;

static const type_row g_types[] = {
#define DITD__GGUF_TYPE_ROW(name, num, elems, bytes) {#name, num, elems, bytes},
    DITD_GGUF_TYPE_MAP(DITD__GGUF_TYPE_ROW)
#undef DITD__GGUF_TYPE_ROW
};

static const type_row *type_row_of(int num)
{
    for (size_t i = 0; i < sizeof g_types / sizeof *g_types; i++)
        if (g_types[i].num == num)
            return &g_types[i];
    return NULL;
}

const char *ditd_gguf_type_name(ditd_gguf_type t)
{
    const type_row *r = type_row_of((int)t);
    return r ? r->name : "?";
}

int ditd_gguf_type_from_str(const char *s, ditd_gguf_type *out)
{
    for (size_t i = 0; i < sizeof g_types / sizeof *g_types; i++)
        if (strcmp(s, g_types[i].name) == 0) {
            *out = (ditd_gguf_type)g_types[i].num;
            return 0;
        }
    return DITD_EINVAL;
}

int ditd_gguf_type_block(ditd_gguf_type t, int *elems, int *bytes)
{
    const type_row *r = type_row_of((int)t);
    if (!r)
        return 0;
    if (elems)
        *elems = r->elems;
    if (bytes)
        *bytes = r->bytes;
    return 1;
}

int ditd_gguf_type_supported(ditd_gguf_type t)
{
    return ditd_cpu_dequant_block((int)t, NULL, NULL);
}

static const char *const g_vt_names[] = {
#define DITD__GGUF_VT_STR(name, num, size) [num] = #name,
    DITD_GGUF_VALUE_MAP(DITD__GGUF_VT_STR)
#undef DITD__GGUF_VT_STR
};

static const int g_vt_size[] = {
#define DITD__GGUF_VT_SIZE(name, num, size) [num] = size,
    DITD_GGUF_VALUE_MAP(DITD__GGUF_VT_SIZE)
#undef DITD__GGUF_VT_SIZE
};

const char *ditd_gguf_vtype_name(ditd_gguf_vtype t)
{
    return (unsigned)t < DITD_GGUF_V_COUNT ? g_vt_names[t] : "?";
}

int ditd_gguf_vtype_from_str(const char *s, ditd_gguf_vtype *out)
{
    for (int i = 0; i < DITD_GGUF_V_COUNT; i++)
        if (strcmp(s, g_vt_names[i]) == 0) {
            *out = (ditd_gguf_vtype)i;
            return 0;
        }
    return DITD_EINVAL;
}

/* ---- the cursor ---------------------------------------------------------- */

typedef struct cursor {
    const uint8_t *buf;
    size_t len, pos;
    const char *file;
} cursor;

static size_t left(const cursor *c)
{
    return c->len - c->pos;
}

/* Reads n bytes into dst, or says what was being read when the file ends. */
static int take(cursor *c, void *dst, size_t n, const char *what, const char *whose)
{
    if (n > left(c))
        return ditd_err_set(DITD_EFORMAT,
                            "%s: %s%s" NAME_FMT "%s needs %zu bytes at offset %zu, but the "
                            "%zu-byte file ends first",
                            c->file, what, whose ? " of '" : "", whose ? whose : "",
                            whose ? "'" : "", n, c->pos, c->len);
    memcpy(dst, c->buf + c->pos, n);
    c->pos += n;
    return 0;
}

static int skip(cursor *c, uint64_t n, const char *what, const char *whose)
{
    if (n > left(c))
        return ditd_err_set(DITD_EFORMAT,
                            "%s: %s%s" NAME_FMT "%s needs %llu bytes at offset %zu, but the "
                            "%zu-byte file ends first",
                            c->file, what, whose ? " of '" : "", whose ? whose : "",
                            whose ? "'" : "", (unsigned long long)n, c->pos, c->len);
    c->pos += (size_t)n;
    return 0;
}

/* A string: its bytes stay in the buffer (*s, *n). */
static int take_str(cursor *c, const uint8_t **s, uint64_t *n, const char *what,
                    const char *whose)
{
    int err = take(c, n, 8, what, whose);
    if (err)
        return err;
    *s = c->buf + c->pos;
    return skip(c, *n, what, whose);
}

/* An owned, NUL-terminated copy of a name; refuses an inner NUL. */
static int name_copy(const cursor *c, const uint8_t *s, uint64_t n, const char *what,
                     char **out)
{
    if (memchr(s, 0, (size_t)n))
        return ditd_err_set(DITD_EFORMAT, "%s: a %s at offset %zu contains a NUL byte", c->file,
                            what, (size_t)(s - c->buf));
    char *p = malloc((size_t)n + 1);
    if (!p)
        return ditd_err_set(DITD_ENOMEM, "%s: out of memory", c->file);
    memcpy(p, s, (size_t)n);
    p[n] = '\0';
    *out = p;
    return 0;
}

/* ---- metadata -------------------------------------------------------------- */

/* One value of scalar type vt at the cursor; checks BOOL. */
static int take_scalar(cursor *c, ditd_gguf_vtype vt, const char *key)
{
    const uint8_t *p = c->buf + c->pos;
    int err = skip(c, (uint64_t)g_vt_size[vt], "the value", key);
    if (!err && vt == DITD_GGUF_V_BOOL && *p > 1)
        err = ditd_err_set(DITD_EFORMAT, "%s: key '" NAME_FMT "': BOOL value %u is not 0 or 1",
                           c->file, key, *p);
    return err;
}

static int parse_kv(ditd_gguf *g, cursor *c, size_t i)
{
    ditd_gguf_kv *kv = &g->kvs[i];
    const uint8_t *s;
    uint64_t n = 0;
    uint32_t vt = 0;
    char where[48];
    snprintf(where, sizeof where, "metadata entry %zu", i);
    int err = take_str(c, &s, &n, "the key", NULL);
    if (err)
        return ditd_err_set(err, "%s: %s: %s", c->file, where, ditd_err_detail());
    if ((err = name_copy(c, s, n, "metadata key", (char **)&kv->key)))
        return err;
    const char *key = kv->key;
    if ((err = take(c, &vt, 4, "the value type", key)))
        return err;
    if (vt >= DITD_GGUF_V_COUNT)
        return ditd_err_set(DITD_EFORMAT, "%s: key '" NAME_FMT "': unknown value type %u",
                            c->file, key, vt);
    kv->type = (ditd_gguf_vtype)vt;
    kv->n = 1;
    kv->data = c->buf + c->pos;
    if (vt == DITD_GGUF_V_STRING) {
        if ((err = take_str(c, &s, &n, "the string value", key)))
            return err;
        char *v = malloc((size_t)n + 1);
        if (!v)
            return ditd_err_set(DITD_ENOMEM, "%s: out of memory", c->file);
        memcpy(v, s, (size_t)n);
        v[n] = '\0';
        kv->str = v;
        kv->str_len = (size_t)n;
        return 0;
    }
    if (vt != DITD_GGUF_V_ARRAY)
        return take_scalar(c, kv->type, key);

    uint32_t et = 0;
    if ((err = take(c, &et, 4, "the array's element type", key)) ||
        (err = take(c, &kv->n, 8, "the array's length", key)))
        return err;
    if (et >= DITD_GGUF_V_COUNT)
        return ditd_err_set(DITD_EFORMAT, "%s: key '" NAME_FMT "': unknown array element type %u",
                            c->file, key, et);
    if (et == DITD_GGUF_V_ARRAY)
        return ditd_err_set(DITD_EFORMAT, "%s: key '" NAME_FMT "': arrays of arrays are not GGUF",
                            c->file, key);
    kv->elem_type = (ditd_gguf_vtype)et;
    kv->data = c->buf + c->pos;
    if (et == DITD_GGUF_V_STRING) {
        /* each element is at least its 8-byte length */
        if (kv->n > left(c) / 8)
            return ditd_err_set(DITD_EFORMAT,
                                "%s: key '" NAME_FMT "': %llu strings cannot fit in the %zu bytes "
                                "left",
                                c->file, key, (unsigned long long)kv->n, left(c));
        uint64_t *offs = malloc((size_t)(kv->n ? kv->n : 1) * sizeof *offs);
        if (!offs)
            return ditd_err_set(DITD_ENOMEM, "%s: out of memory", c->file);
        kv->str_offs = offs;
        const size_t start = c->pos;
        for (uint64_t j = 0; j < kv->n; j++) {
            offs[j] = c->pos - start;
            if ((err = take_str(c, &s, &n, "an array string", key)))
                return err;
        }
        return 0;
    }
    uint64_t es = (uint64_t)g_vt_size[et];
    if (kv->n > left(c) / es)
        return ditd_err_set(DITD_EFORMAT,
                            "%s: key '" NAME_FMT "': %llu %s elements run past the end of the "
                            "file (%zu bytes left)",
                            c->file, key, (unsigned long long)kv->n, g_vt_names[et], left(c));
    if (et == DITD_GGUF_V_BOOL) {
        for (uint64_t j = 0; j < kv->n; j++)
            if (c->buf[c->pos + j] > 1)
                return ditd_err_set(DITD_EFORMAT,
                                    "%s: key '" NAME_FMT "': BOOL element %llu is %u, not 0 or 1",
                                    c->file, key, (unsigned long long)j, c->buf[c->pos + j]);
    }
    c->pos += (size_t)(kv->n * es);
    return 0;
}

static const ditd_gguf *g_sort_ctx; /* qsort has no context argument */

static int kv_idx_cmp(const void *a, const void *b)
{
    return strcmp(g_sort_ctx->kvs[*(const size_t *)a].key,
                  g_sort_ctx->kvs[*(const size_t *)b].key);
}

/* ---- tensors --------------------------------------------------------------- */

static int parse_tensor_info(cursor *c, size_t i, ditd_gguf_tensor *t)
{
    const uint8_t *s;
    uint64_t n = 0;
    uint32_t nd = 0, type = 0;
    char where[48];
    snprintf(where, sizeof where, "tensor info %zu", i);
    int err = take_str(c, &s, &n, "the name", NULL);
    if (err)
        return ditd_err_set(err, "%s: %s: %s", c->file, where, ditd_err_detail());
    if ((err = name_copy(c, s, n, "tensor name", (char **)&t->name)))
        return err;
    const char *name = t->name;
    if ((err = take(c, &nd, 4, "the dimension count", name)))
        return err;
    if (nd == 0 || nd > DITD_GGUF_MAX_DIMS)
        return ditd_err_set(DITD_EFORMAT, "%s: tensor '" NAME_FMT "': %u dimensions, not 1..%d",
                            c->file, name, nd, DITD_GGUF_MAX_DIMS);
    t->ndim = (int)nd;
    for (int d = 0; d < DITD_GGUF_MAX_DIMS; d++)
        t->ne[d] = 1;
    for (uint32_t d = 0; d < nd; d++) {
        uint64_t v = 0;
        if ((err = take(c, &v, 8, "a dimension", name)))
            return err;
        if (v > (uint64_t)INT64_MAX)
            return ditd_err_set(DITD_EFORMAT, "%s: tensor '" NAME_FMT "': dimension %u is %llu",
                                c->file, name, d, (unsigned long long)v);
        t->ne[d] = (int64_t)v;
    }
    if ((err = take(c, &type, 4, "the type", name)) ||
        (err = take(c, &t->offset, 8, "the offset", name)))
        return err;
    int elems, bytes;
    if (!ditd_gguf_type_block((ditd_gguf_type)type, &elems, &bytes))
        return ditd_err_set(DITD_EFORMAT, "%s: tensor '" NAME_FMT "': unknown ggml type %u",
                            c->file, name, type);
    t->type = (ditd_gguf_type)type;
    for (int d = 0; d < t->ndim; d++)
        t->shape[d] = t->ne[t->ndim - 1 - d];
    for (int d = t->ndim; d < DITD_GGUF_MAX_DIMS; d++)
        t->shape[d] = 1;
    if (t->ne[0] % elems != 0)
        return ditd_err_set(DITD_EFORMAT,
                            "%s: tensor '" NAME_FMT "': rows of %lld values are not whole %s "
                            "blocks of %d",
                            c->file, name, (long long)t->ne[0], ditd_gguf_type_name(t->type),
                            elems);
    /* bytes = ne0 / elems * bytes * ne1 * ne2 * ne3; numel <= INT64_MAX as
     * ggml asks; every product overflow-checked */
    uint64_t numel = 1, nb = (uint64_t)(t->ne[0] / elems) * (uint64_t)bytes;
    int zero = 0;
    for (int d = 0; d < t->ndim; d++)
        zero |= t->ne[d] == 0;
    for (int d = 0; d < t->ndim && !zero; d++) {
        uint64_t v = (uint64_t)t->ne[d];
        if (numel > (uint64_t)INT64_MAX / v)
            return ditd_err_set(DITD_EFORMAT,
                                "%s: tensor '" NAME_FMT "': element count overflows", c->file,
                                name);
        numel *= v;
        if (d > 0) {
            if (nb > UINT64_MAX / v)
                return ditd_err_set(DITD_EFORMAT, "%s: tensor '" NAME_FMT "': byte count overflows",
                                    c->file, name);
            nb *= v;
        }
    }
    if (zero)
        nb = 0;
    if (nb > SIZE_MAX)
        return ditd_err_set(DITD_EFORMAT, "%s: tensor '" NAME_FMT "': %llu bytes", c->file, name,
                            (unsigned long long)nb);
    t->nbytes = (size_t)nb;
    t->row_bytes = (size_t)(t->ne[0] / elems) * (size_t)bytes;
    return 0;
}

static int tensor_cmp(const void *a, const void *b)
{
    return strcmp(((const ditd_gguf_tensor *)a)->name, ((const ditd_gguf_tensor *)b)->name);
}

typedef struct span {
    uint64_t begin, end;
    size_t idx;
} span;

static int span_cmp(const void *a, const void *b)
{
    const span *x = a, *y = b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

/* ---- the whole file ------------------------------------------------------- */

static int parse(ditd_gguf *g, const uint8_t *buf, size_t len)
{
    cursor c = {.buf = buf, .len = len, .pos = 0, .file = g->path};
    char magic[4];
    uint64_t nt, nkv;
    int err;
    if (len < 24)
        return ditd_err_set(DITD_EFORMAT, "%s: %zu bytes, shorter than GGUF's 24-byte header",
                            g->path, len);
    take(&c, magic, 4, "", NULL);
    if (memcmp(magic, "GGUF", 4) != 0)
        return ditd_err_set(DITD_EFORMAT, "%s: not a GGUF file (magic %02x %02x %02x %02x)",
                            g->path, (uint8_t)magic[0], (uint8_t)magic[1], (uint8_t)magic[2],
                            (uint8_t)magic[3]);
    take(&c, &g->version, 4, "", NULL);
    if (g->version != 2 && g->version != 3)
        return ditd_err_set(DITD_EFORMAT, "%s: GGUF version %u; ditd reads versions 2 and 3",
                            g->path, g->version);
    take(&c, &nt, 8, "", NULL);
    take(&c, &nkv, 8, "", NULL);
    /* a key is >= 12 bytes (length + type), a tensor info >= 32 */
    if (nkv > left(&c) / 12)
        return ditd_err_set(DITD_EFORMAT, "%s: %llu metadata entries cannot fit in %zu bytes",
                            g->path, (unsigned long long)nkv, left(&c));
    if (nt > left(&c) / 32)
        return ditd_err_set(DITD_EFORMAT, "%s: %llu tensor infos cannot fit in %zu bytes",
                            g->path, (unsigned long long)nt, left(&c));

    g->kvs = calloc(nkv ? nkv : 1, sizeof *g->kvs);
    g->kv_sorted = malloc((nkv ? nkv : 1) * sizeof *g->kv_sorted);
    g->tensors = calloc(nt ? nt : 1, sizeof *g->tensors);
    if (!g->kvs || !g->kv_sorted || !g->tensors)
        return ditd_err_set(DITD_ENOMEM, "%s: out of memory", g->path);
    for (size_t i = 0; i < nkv; i++) {
        g->nkv = i + 1; /* freed up to here on failure */
        if ((err = parse_kv(g, &c, i)))
            return err;
    }
    for (size_t i = 0; i < nkv; i++)
        g->kv_sorted[i] = i;
    g_sort_ctx = g;
    qsort(g->kv_sorted, nkv, sizeof *g->kv_sorted, kv_idx_cmp);
    for (size_t i = 1; i < nkv; i++)
        if (strcmp(g->kvs[g->kv_sorted[i - 1]].key, g->kvs[g->kv_sorted[i]].key) == 0)
            return ditd_err_set(DITD_EFORMAT, "%s: metadata key '" NAME_FMT "' appears twice",
                                g->path, g->kvs[g->kv_sorted[i]].key);

    g->alignment = GGUF_DEFAULT_ALIGNMENT;
    const ditd_gguf_kv *al = ditd_gguf_kv_find(g, "general.alignment");
    if (al) {
        uint32_t a = 0;
        if (al->type == DITD_GGUF_V_UINT32)
            memcpy(&a, al->data, 4);
        if (al->type != DITD_GGUF_V_UINT32 || a == 0 || (a & (a - 1)) != 0)
            return ditd_err_set(DITD_EFORMAT,
                                "%s: general.alignment must be a UINT32 power of two (it is %s "
                                "%u)",
                                g->path, g_vt_names[al->type], a);
        g->alignment = a;
    }

    for (size_t i = 0; i < nt; i++) {
        g->count = i + 1;
        if ((err = parse_tensor_info(&c, i, &g->tensors[i])))
            return err;
    }
    /* the data section: the header's end, padded to the alignment */
    size_t data_start = c.pos + (g->alignment - c.pos % g->alignment) % g->alignment;
    uint64_t data_len = data_start <= len ? (uint64_t)(len - data_start) : 0;
    span *spans = malloc((nt ? nt : 1) * sizeof *spans);
    if (!spans)
        return ditd_err_set(DITD_ENOMEM, "%s: out of memory", g->path);
    size_t ns = 0;
    for (size_t i = 0; i < nt; i++) {
        ditd_gguf_tensor *t = &g->tensors[i];
        if (t->offset % g->alignment != 0) {
            err = ditd_err_set(DITD_EFORMAT,
                               "%s: tensor '" NAME_FMT "': offset %llu is not a multiple of the "
                               "alignment %zu",
                               g->path, t->name, (unsigned long long)t->offset, g->alignment);
            goto fail_spans;
        }
        if (t->offset > data_len || t->nbytes > data_len - t->offset) {
            err = ditd_err_set(DITD_EFORMAT,
                               "%s: tensor '" NAME_FMT "': %zu bytes at offset %llu run past the "
                               "end of the %llu-byte data section",
                               g->path, t->name, t->nbytes, (unsigned long long)t->offset,
                               (unsigned long long)data_len);
            goto fail_spans;
        }
        t->data = buf + data_start + t->offset;
        if (t->nbytes)
            spans[ns++] = (span){t->offset, t->offset + t->nbytes, i};
    }
    qsort(spans, ns, sizeof *spans, span_cmp);
    for (size_t i = 1; i < ns; i++)
        if (spans[i].begin < spans[i - 1].end) {
            err = ditd_err_set(DITD_EFORMAT,
                               "%s: tensors '" NAME_FMT "' and '" NAME_FMT "' overlap in the data "
                               "section (at offset %llu)",
                               g->path, g->tensors[spans[i - 1].idx].name,
                               g->tensors[spans[i].idx].name, (unsigned long long)spans[i].begin);
            goto fail_spans;
        }
    free(spans);
    qsort(g->tensors, nt, sizeof *g->tensors, tensor_cmp);
    for (size_t i = 1; i < nt; i++)
        if (strcmp(g->tensors[i - 1].name, g->tensors[i].name) == 0)
            return ditd_err_set(DITD_EFORMAT, "%s: tensor '" NAME_FMT "' appears twice", g->path,
                                g->tensors[i].name);
    return 0;

fail_spans:
    free(spans);
    return err;
}

void ditd_gguf_free(ditd_gguf *g)
{
    if (!g)
        return;
    for (size_t i = 0; i < g->nkv; i++) {
        free((char *)g->kvs[i].key);
        free((char *)g->kvs[i].str);
        free((uint64_t *)g->kvs[i].str_offs);
    }
    free(g->kvs);
    free(g->kv_sorted);
    for (size_t i = 0; i < g->count; i++)
        free((char *)g->tensors[i].name);
    free(g->tensors);
    if (g->map)
        munmap(g->map, g->map_len);
    free(g->path);
    free(g);
}

static int gguf_new(const char *path, ditd_gguf **out)
{
    ditd_gguf *g = calloc(1, sizeof *g);
    if (!g || !(g->path = strdup(path))) {
        free(g);
        return ditd_err_set(DITD_ENOMEM, "out of memory");
    }
    *out = g;
    return 0;
}

static int os_err(int e)
{
    if (e == ENOENT || e == ENOTDIR)
        return DITD_ENOENT;
    if (e == ENOMEM)
        return DITD_ENOMEM;
    return DITD_EIO;
}

int ditd_gguf_open(const char *path, ditd_gguf **out)
{
    ditd_gguf *g = NULL;
    int err;
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return ditd_err_set(os_err(errno), "%s: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        err = ditd_err_set(os_err(errno), "%s: %s", path, strerror(errno));
        goto fail_fd;
    }
    if (!S_ISREG(sb.st_mode)) {
        err = ditd_err_set(DITD_EIO, "%s: not a regular file", path);
        goto fail_fd;
    }
    if ((uint64_t)sb.st_size > SIZE_MAX) {
        err = ditd_err_set(DITD_EIO, "%s: file too large to map", path);
        goto fail_fd;
    }
    size_t len = (size_t)sb.st_size;
    if (len < 24) {
        err = ditd_err_set(DITD_EFORMAT, "%s: %zu bytes, shorter than GGUF's 24-byte header",
                           path, len);
        goto fail_fd;
    }
    if ((err = gguf_new(path, &g)))
        goto fail_fd;
    void *map = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) {
        err = ditd_err_set(os_err(errno), "%s: mmap: %s", path, strerror(errno));
        goto fail_g;
    }
    close(fd);
    fd = -1;
    g->map = map;
    g->map_len = len;
    if ((err = parse(g, map, len)))
        goto fail_g;
    *out = g;
    return 0;

fail_g:
    ditd_gguf_free(g);
fail_fd:
    if (fd >= 0)
        close(fd);
    return err;
}

int ditd_gguf_open_mem(const void *buf, size_t len, const char *name, ditd_gguf **out)
{
    ditd_gguf *g = NULL;
    *out = NULL;
    int err = gguf_new(name ? name : "<memory>", &g);
    if (err)
        return err;
    if ((err = parse(g, buf, len))) {
        ditd_gguf_free(g);
        return err;
    }
    *out = g;
    return 0;
}

/* ---- lookups --------------------------------------------------------------- */

const char *ditd_gguf_path(const ditd_gguf *g)
{
    return g->path;
}

uint32_t ditd_gguf_version(const ditd_gguf *g)
{
    return g->version;
}

size_t ditd_gguf_alignment(const ditd_gguf *g)
{
    return g->alignment;
}

size_t ditd_gguf_kv_count(const ditd_gguf *g)
{
    return g->nkv;
}

const ditd_gguf_kv *ditd_gguf_kv_at(const ditd_gguf *g, size_t i)
{
    return i < g->nkv ? &g->kvs[i] : NULL;
}

const ditd_gguf_kv *ditd_gguf_kv_find(const ditd_gguf *g, const char *key)
{
    size_t lo = 0, hi = g->nkv;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        const ditd_gguf_kv *kv = &g->kvs[g->kv_sorted[mid]];
        int c = strcmp(kv->key, key);
        if (c == 0)
            return kv;
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

int ditd_gguf_kv_int(const ditd_gguf *g, const char *key, int64_t *out)
{
    const ditd_gguf_kv *kv = ditd_gguf_kv_find(g, key);
    if (!kv)
        return ditd_err_set(DITD_ENOENT, "%s: no metadata key '%s'", g->path, key);
    const uint8_t *p = kv->data;
    switch (kv->type) {
    case DITD_GGUF_V_UINT8:
    case DITD_GGUF_V_BOOL:
        *out = p[0];
        return 0;
    case DITD_GGUF_V_INT8:
        *out = (int8_t)p[0];
        return 0;
    case DITD_GGUF_V_UINT16: {
        uint16_t v;
        memcpy(&v, p, 2);
        *out = v;
        return 0;
    }
    case DITD_GGUF_V_INT16: {
        int16_t v;
        memcpy(&v, p, 2);
        *out = v;
        return 0;
    }
    case DITD_GGUF_V_UINT32: {
        uint32_t v;
        memcpy(&v, p, 4);
        *out = v;
        return 0;
    }
    case DITD_GGUF_V_INT32: {
        int32_t v;
        memcpy(&v, p, 4);
        *out = v;
        return 0;
    }
    case DITD_GGUF_V_INT64:
        memcpy(out, p, 8);
        return 0;
    case DITD_GGUF_V_UINT64: {
        uint64_t v = 0;
        memcpy(&v, p, 8);
        if (v <= (uint64_t)INT64_MAX) {
            *out = (int64_t)v;
            return 0;
        }
        return ditd_err_set(DITD_EFORMAT, "%s: key '%s' is %llu, beyond int64", g->path, key,
                            (unsigned long long)v);
    }
    default:
        return ditd_err_set(DITD_EFORMAT, "%s: key '%s' is %s, not an integer", g->path, key,
                            g_vt_names[kv->type]);
    }
}

const char *ditd_gguf_kv_str(const ditd_gguf *g, const char *key)
{
    const ditd_gguf_kv *kv = ditd_gguf_kv_find(g, key);
    return kv && kv->type == DITD_GGUF_V_STRING ? kv->str : NULL;
}

int ditd_gguf_kv_arr_str(const ditd_gguf_kv *kv, uint64_t i, const char **s, size_t *len)
{
    if (kv->type != DITD_GGUF_V_ARRAY || kv->elem_type != DITD_GGUF_V_STRING || i >= kv->n)
        return ditd_err_set(DITD_EINVAL, "key '%s': element %llu of a %s", kv->key,
                            (unsigned long long)i, g_vt_names[kv->type]);
    const uint8_t *p = (const uint8_t *)kv->data + kv->str_offs[i];
    uint64_t n = 0;
    memcpy(&n, p, 8); /* checked against the file at open */
    *s = (const char *)p + 8;
    *len = (size_t)n;
    return 0;
}

size_t ditd_gguf_count(const ditd_gguf *g)
{
    return g->count;
}

const ditd_gguf_tensor *ditd_gguf_at(const ditd_gguf *g, size_t i)
{
    return i < g->count ? &g->tensors[i] : NULL;
}

const ditd_gguf_tensor *ditd_gguf_find(const ditd_gguf *g, const char *name)
{
    size_t lo = 0, hi = g->count;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(g->tensors[mid].name, name);
        if (c == 0)
            return &g->tensors[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

/* ---- reads ------------------------------------------------------------------ */

static int lookup(const ditd_gguf *g, const char *name, int ndim, const int64_t *shape,
                  const ditd_gguf_tensor **out)
{
    if (ndim < 1 || ndim > DITD_GGUF_MAX_DIMS || !shape)
        return ditd_err_set(DITD_EINVAL, "tensor '%s': expected rank %d is not 1..%d", name,
                            ndim, DITD_GGUF_MAX_DIMS);
    const ditd_gguf_tensor *t = ditd_gguf_find(g, name);
    if (!t)
        return ditd_err_set(DITD_ENOENT, "tensor '%s' not found in %s", name, g->path);
    int same = t->ndim == ndim;
    for (int i = 0; same && i < ndim; i++)
        same = t->shape[i] == shape[i];
    if (!same) {
        char have[160], want[160];
        return ditd_err_set(DITD_ESHAPE, "tensor '%s' has shape %s in %s, expected %s", name,
                            ditd_shape_str(have, sizeof have, t->ndim, t->shape), g->path,
                            ditd_shape_str(want, sizeof want, ndim, shape));
    }
    if (!ditd_gguf_type_supported(t->type))
        return ditd_err_set(DITD_EUNSUPPORTED,
                            "tensor '%s' in %s has ggml type %s, which ditd does not dequantize "
                            "(it reads F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, "
                            "Q4_K, Q5_K, Q6_K)",
                            name, g->path, ditd_gguf_type_name(t->type));
    *out = t;
    return 0;
}

/* Rows [r0, r0 + n) of t (rows of ne[0] values) into dst, over the threads. */
static void dequant_rows(const ditd_gguf_tensor *t, size_t r0, size_t n, float *dst)
{
    const size_t ne0 = (size_t)t->ne[0];
#pragma omp parallel for schedule(static) if (n * ne0 > 65536)
    for (size_t r = 0; r < n; r++)
        ditd_cpu_dequant((int)t->type, (const uint8_t *)t->data + (r0 + r) * t->row_bytes,
                         dst + r * ne0, ne0);
}

int ditd_gguf_read_f32(const ditd_gguf *g, const char *name, int ndim, const int64_t *shape,
                       float *dst)
{
    const ditd_gguf_tensor *t;
    int err = lookup(g, name, ndim, shape, &t);
    if (err)
        return err;
    if (t->nbytes)
        dequant_rows(t, 0, t->nbytes / t->row_bytes, dst);
    return 0;
}

int ditd_gguf_read_f32_slice(const ditd_gguf *g, const char *name, int ndim,
                             const int64_t *full_shape, int axis, int64_t start, int64_t len,
                             float *dst)
{
    const ditd_gguf_tensor *t;
    int err = lookup(g, name, ndim, full_shape, &t);
    if (err)
        return err;
    if (axis < 0 || axis >= ndim)
        return ditd_err_set(DITD_EINVAL, "tensor '%s': slice axis %d of a %d-D tensor", name,
                            axis, ndim);
    if (start < 0 || len < 0 || start > t->shape[axis] || len > t->shape[axis] - start)
        return ditd_err_set(DITD_ERANGE,
                            "tensor '%s': slice [%lld, %lld + %lld) of axis %d outside its "
                            "size %lld",
                            name, (long long)start, (long long)start, (long long)len, axis,
                            (long long)t->shape[axis]);
    if (t->nbytes == 0 || len == 0)
        return 0;
    /* no zero dimension: every partial product is <= numel, checked at open */
    size_t outer = 1, inner = 1, full = (size_t)t->shape[axis];
    for (int i = 0; i < axis; i++)
        outer *= (size_t)t->shape[i];
    for (int i = axis + 1; i < ndim; i++)
        inner *= (size_t)t->shape[i];
    const size_t ne0 = (size_t)t->ne[0];
    if (axis < ndim - 1) { /* whole rows: inner is a multiple of ne0 */
        size_t rows = (size_t)len * inner / ne0;
        for (size_t o = 0; o < outer; o++)
            dequant_rows(t, (o * full + (size_t)start) * inner / ne0, rows,
                         dst + o * (size_t)len * inner);
        return 0;
    }
    /* within rows: each row whole, then its [start, start + len) */
    float *row = malloc(ne0 * sizeof *row);
    if (!row)
        return ditd_err_set(DITD_ENOMEM, "tensor '%s': a row of %zu floats", name, ne0);
    for (size_t o = 0; o < outer; o++) {
        ditd_cpu_dequant((int)t->type, (const uint8_t *)t->data + o * t->row_bytes, row, ne0);
        memcpy(dst + o * (size_t)len, row + start, (size_t)len * sizeof *row);
    }
    free(row);
    return 0;
}
