/* safetensors reader: mmap, validate every header, convert to f32 on read.
 *
 * File layout (https://github.com/huggingface/safetensors):
 *   u64 little-endian N | N bytes of UTF-8 JSON | data region
 * The JSON maps tensor names to {"dtype", "shape", "data_offsets": [b, e]},
 * offsets relative to the data region, plus an optional "__metadata__"
 * object of strings. We refuse what the reference implementation refuses
 * (header over 100 MB, offsets outside the data, a byte count that does not
 * match shape x dtype, arithmetic overflow) and, in addition, overlapping
 * tensors. Holes between tensors are accepted: they harm nothing here.
 *
 * Tensor names are copied out of the JSON; the JSON itself is dropped after
 * open, so an open checkpoint costs its mapping plus one small record per
 * tensor.
 */
#include "engine/io/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "engine/core/error.h"
#include "engine/core/tensor.h"
#include "kernels/cpu/dequant.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "ditd reads little-endian safetensors and needs a little-endian host"
#endif

/* The reference implementation's limit (safetensors MAX_HEADER_SIZE). */
#define ST_MAX_HEADER ((uint64_t)100000000)
/* An index is JSON text of about 100 bytes per tensor. */
#define ST_MAX_INDEX ((uint64_t)100000000)

/* Long names from a hostile header are cut in messages. */
#define NAME_FMT "%.200s"

typedef struct st_file {
    char *path;     /* as opened; what errors and tensors call it */
    void *map;      /* NULL when the bytes are borrowed (open_mem) */
    size_t map_len;
    char **meta;    /* "__metadata__": key, value, key, value, ... (copied) */
    size_t n_meta;  /* pairs */
} st_file;

struct ditd_safetensors {
    char *origin;            /* what was opened: file, index or folder */
    st_file *files;
    size_t nfiles;
    ditd_st_tensor *tensors; /* sorted by name once open */
    size_t count;
    size_t cap;
};

/* ---- dtypes ---------------------------------------------------------- */

static const char *const dtype_names[] = {
#define DITD__ST_DTYPE_STR(name, str, bits) str,
    DITD_ST_DTYPE_MAP(DITD__ST_DTYPE_STR)
#undef DITD__ST_DTYPE_STR
};

static const int dtype_bits[] = {
#define DITD__ST_DTYPE_BITS(name, str, bits) bits,
    DITD_ST_DTYPE_MAP(DITD__ST_DTYPE_BITS)
#undef DITD__ST_DTYPE_BITS
};

const char *ditd_st_dtype_name(ditd_st_dtype t)
{
    if ((unsigned)t >= DITD_ST_DTYPE_COUNT)
        return "?";
    return dtype_names[t];
}

int ditd_st_dtype_from_str(const char *s, ditd_st_dtype *out)
{
    for (int i = 0; i < DITD_ST_DTYPE_COUNT; i++) {
        if (strcmp(s, dtype_names[i]) == 0) {
            *out = (ditd_st_dtype)i;
            return 0;
        }
    }
    return DITD_EINVAL;
}

int ditd_st_dtype_bits(ditd_st_dtype t)
{
    if ((unsigned)t >= DITD_ST_DTYPE_COUNT)
        return 0;
    return dtype_bits[t];
}

/* ---- conversions ----------------------------------------------------- */

static float f32_from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

float ditd_st_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    uint32_t bits;

    if (exp == 0x1f) {               /* inf, nan (payload kept) */
        bits = sign | 0x7f800000u | (man << 13);
    } else if (exp != 0) {           /* normal: rebias 15 -> 127 */
        bits = sign | ((exp + 112u) << 23) | (man << 13);
    } else if (man == 0) {           /* signed zero */
        bits = sign;
    } else {                         /* subnormal man * 2^-24: normalise */
        uint32_t e = 113;            /* biased exponent of 2^-14 */
        while (!(man & 0x400u)) {
            man <<= 1;
            e--;
        }
        bits = sign | (e << 23) | ((man & 0x3ffu) << 13);
    }
    return f32_from_bits(bits);
}

float ditd_st_bf16_to_f32(uint16_t b)
{
    return f32_from_bits((uint32_t)b << 16);
}

/* n elements of dtype `dt` at `src` (any alignment) into dst. The caller
 * has checked that dt is one of the four float types. */
static void convert_to_f32(ditd_st_dtype dt, const uint8_t *src, size_t n, float *dst)
{
    switch (dt) {
    case DITD_ST_F32:
        memcpy(dst, src, n * sizeof(float));
        break;
    case DITD_ST_F16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, src + 2 * i, 2);
            dst[i] = ditd_st_f16_to_f32(h);
        }
        break;
    case DITD_ST_BF16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, src + 2 * i, 2);
            dst[i] = ditd_st_bf16_to_f32(h);
        }
        break;
    case DITD_ST_F64:
        /* IEEE 754 (Annex F): out-of-range values become +-inf. */
        for (size_t i = 0; i < n; i++) {
            double d;
            memcpy(&d, src + 8 * i, 8);
            dst[i] = (float)d;
        }
        break;
    case DITD_ST_F8_E4M3:
        ditd_cpu_dequant(DITD_Q_F8_E4M3, src, dst, n);
        break;
    case DITD_ST_F8_E5M2:
        ditd_cpu_dequant(DITD_Q_F8_E5M2, src, dst, n);
        break;
    default:
        break;
    }
}

static int is_f32_readable(ditd_st_dtype dt)
{
    return dt == DITD_ST_F32 || dt == DITD_ST_F16 || dt == DITD_ST_BF16 ||
           dt == DITD_ST_F64 || dt == DITD_ST_F8_E4M3 || dt == DITD_ST_F8_E5M2;
}

static int is_fp8(ditd_st_dtype dt)
{
    return dt == DITD_ST_F8_E4M3 || dt == DITD_ST_F8_E5M2;
}

/* ---- the tensor table -------------------------------------------------- */

static int st_add_file(ditd_safetensors *st, const char *path, void *map, size_t map_len)
{
    st_file *files = realloc(st->files, (st->nfiles + 1) * sizeof *files);
    if (!files)
        return ditd_err_set(DITD_ENOMEM, "%s: out of memory", path);
    st->files = files;
    char *copy = strdup(path);
    if (!copy)
        return ditd_err_set(DITD_ENOMEM, "%s: out of memory", path);
    files[st->nfiles] = (st_file){.path = copy, .map = map, .map_len = map_len};
    st->nfiles++;
    return 0;
}

static ditd_st_tensor *st_push_tensor(ditd_safetensors *st)
{
    if (st->count == st->cap) {
        size_t cap = st->cap ? 2 * st->cap : 64;
        ditd_st_tensor *t = realloc(st->tensors, cap * sizeof *t);
        if (!t)
            return NULL;
        st->tensors = t;
        st->cap = cap;
    }
    ditd_st_tensor *t = &st->tensors[st->count++];
    memset(t, 0, sizeof *t);
    return t;
}

void ditd_safetensors_free(ditd_safetensors *st)
{
    if (!st)
        return;
    for (size_t i = 0; i < st->count; i++)
        free((char *)st->tensors[i].name);
    free(st->tensors);
    for (size_t i = 0; i < st->nfiles; i++) {
        if (st->files[i].map)
            munmap(st->files[i].map, st->files[i].map_len);
        free(st->files[i].path);
        for (size_t k = 0; st->files[i].meta && st->files[i].meta[k]; k++)
            free(st->files[i].meta[k]); /* NULL-ended: a failed copy leaves no gap */
        free(st->files[i].meta);
    }
    free(st->files);
    free(st->origin);
    free(st);
}

/* ---- one header -------------------------------------------------------- */

typedef struct st_range {
    uint64_t begin, end;
    size_t tensor; /* index into st->tensors */
} st_range;

static int range_cmp(const void *a, const void *b)
{
    const st_range *x = a, *y = b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end)
        return x->end < y->end ? -1 : 1;
    return 0;
}

/* Reads a non-negative JSON integer. */
static int json_u64(const json_t *v, uint64_t *out)
{
    if (!json_is_integer(v))
        return -1;
    json_int_t i = json_integer_value(v);
    if (i < 0)
        return -1;
    *out = (uint64_t)i;
    return 0;
}

/* Validates one tensor entry and fills t (name excepted). */
static int st_parse_entry(const char *file, const char *name, const json_t *v,
                          const uint8_t *data, uint64_t data_len, ditd_st_tensor *t,
                          st_range *r)
{
    if (!json_is_object(v))
        return ditd_err_set(DITD_EFORMAT, "%s: tensor '" NAME_FMT "': entry is not a JSON object",
                            file, name);

    const json_t *jd = json_object_get(v, "dtype");
    if (!json_is_string(jd))
        return ditd_err_set(DITD_EFORMAT,
                            "%s: tensor '" NAME_FMT "': \"dtype\" missing or not a string", file,
                            name);
    if (ditd_st_dtype_from_str(json_string_value(jd), &t->dtype) != 0)
        return ditd_err_set(DITD_EFORMAT, "%s: tensor '" NAME_FMT "': unknown dtype '%.32s'",
                            file, name, json_string_value(jd));

    const json_t *js = json_object_get(v, "shape");
    if (!json_is_array(js))
        return ditd_err_set(DITD_EFORMAT,
                            "%s: tensor '" NAME_FMT "': \"shape\" missing or not an array", file,
                            name);
    size_t nd = json_array_size(js);
    if (nd > DITD_ST_MAX_DIMS)
        return ditd_err_set(DITD_EFORMAT,
                            "%s: tensor '" NAME_FMT "': shape has %zu dimensions, at most %d",
                            file, name, nd, DITD_ST_MAX_DIMS);
    t->ndim = (int)nd;
    int has_zero = 0;
    for (size_t i = 0; i < nd; i++) {
        uint64_t d;
        if (json_u64(json_array_get(js, i), &d) != 0)
            return ditd_err_set(DITD_EFORMAT,
                                "%s: tensor '" NAME_FMT
                                "': shape[%zu] is not a non-negative integer",
                                file, name, i);
        t->shape[i] = (int64_t)d;
        has_zero |= d == 0;
    }

    /* numel * bits, overflow-checked; a zero dimension makes it 0 whatever
     * the others are. */
    uint64_t nbits = 0;
    if (!has_zero) {
        uint64_t n = 1;
        for (size_t i = 0; i < nd; i++) {
            uint64_t d = (uint64_t)t->shape[i];
            if (n > UINT64_MAX / d)
                return ditd_err_set(DITD_EFORMAT,
                                    "%s: tensor '" NAME_FMT "': element count overflows", file,
                                    name);
            n *= d;
        }
        uint64_t bits = (uint64_t)ditd_st_dtype_bits(t->dtype);
        if (n > UINT64_MAX / bits)
            return ditd_err_set(DITD_EFORMAT, "%s: tensor '" NAME_FMT "': byte count overflows",
                                file, name);
        nbits = n * bits;
        if (nbits % 8 != 0)
            return ditd_err_set(DITD_EFORMAT,
                                "%s: tensor '" NAME_FMT "': %s data does not fill whole bytes",
                                file, name, ditd_st_dtype_name(t->dtype));
    }

    const json_t *jo = json_object_get(v, "data_offsets");
    uint64_t b, e;
    if (!json_is_array(jo) || json_array_size(jo) != 2 || json_u64(json_array_get(jo, 0), &b) ||
        json_u64(json_array_get(jo, 1), &e))
        return ditd_err_set(DITD_EFORMAT,
                            "%s: tensor '" NAME_FMT
                            "': \"data_offsets\" is not two non-negative integers",
                            file, name);
    if (b > e)
        return ditd_err_set(DITD_EFORMAT,
                            "%s: tensor '" NAME_FMT "': data_offsets [%llu, %llu] end before "
                            "they begin",
                            file, name, (unsigned long long)b, (unsigned long long)e);
    if (e > data_len)
        return ditd_err_set(DITD_EFORMAT,
                            "%s: tensor '" NAME_FMT "': data_offsets [%llu, %llu] beyond data "
                            "region of %llu bytes",
                            file, name, (unsigned long long)b, (unsigned long long)e,
                            (unsigned long long)data_len);
    if (e - b != nbits / 8)
        return ditd_err_set(DITD_EFORMAT,
                            "%s: tensor '" NAME_FMT "': data_offsets [%llu, %llu] hold %llu "
                            "bytes, but shape and dtype %s need %llu",
                            file, name, (unsigned long long)b, (unsigned long long)e,
                            (unsigned long long)(e - b), ditd_st_dtype_name(t->dtype),
                            (unsigned long long)(nbits / 8));

    t->data = data + b;
    t->nbytes = (size_t)(e - b);
    r->begin = b;
    r->end = e;
    return 0;
}

/* Parses the safetensors image buf[0, len) that st->files[file_idx] names,
 * appending its tensors to st. */
static int st_parse(ditd_safetensors *st, size_t file_idx, const uint8_t *buf, size_t len)
{
    const char *file = st->files[file_idx].path;
    int err;

    if (len < 8)
        return ditd_err_set(DITD_EFORMAT,
                            "%s: file is %zu bytes, shorter than the 8-byte header length", file,
                            len);
    uint64_t n;
    memcpy(&n, buf, 8);
    if (n > ST_MAX_HEADER)
        return ditd_err_set(DITD_EFORMAT,
                            "%s: header length %llu exceeds the limit of %llu bytes", file,
                            (unsigned long long)n, (unsigned long long)ST_MAX_HEADER);
    if (n > len - 8)
        return ditd_err_set(DITD_EFORMAT,
                            "%s: header length %llu runs past the end of the %zu-byte file",
                            file, (unsigned long long)n, len);
    if (n == 0 || buf[8] != '{')
        return ditd_err_set(DITD_EFORMAT, "%s: header does not start with '{'", file);

    json_error_t jerr;
    json_t *root = json_loadb((const char *)buf + 8, (size_t)n, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return ditd_err_set(DITD_EFORMAT, "%s: header is not valid JSON: %s (at byte %d)",
                            file, jerr.text, jerr.position);
    if (!json_is_object(root)) {
        err = ditd_err_set(DITD_EFORMAT, "%s: header is not a JSON object", file);
        goto fail_root;
    }

    const uint8_t *data = buf + 8 + n;
    uint64_t data_len = len - 8 - n;
    size_t ntensors = json_object_size(root);
    st_range *ranges = malloc((ntensors ? ntensors : 1) * sizeof *ranges);
    if (!ranges) {
        err = ditd_err_set(DITD_ENOMEM, "%s: out of memory", file);
        goto fail_root;
    }
    size_t nranges = 0;

    const char *key;
    json_t *v;
    json_object_foreach(root, key, v) {
        if (strcmp(key, "__metadata__") == 0) {
            const char *mk;
            json_t *mv;
            if (!json_is_object(v)) {
                err = ditd_err_set(DITD_EFORMAT, "%s: \"__metadata__\" is not a JSON object",
                                   file);
                goto fail_ranges;
            }
            st_file *sf = &st->files[file_idx];
            if (!(sf->meta = calloc(2 * json_object_size(v) + 1, sizeof *sf->meta))) {
                err = ditd_err_set(DITD_ENOMEM, "%s: out of memory", file);
                goto fail_ranges;
            }
            json_object_foreach(v, mk, mv) {
                if (!json_is_string(mv)) {
                    err = ditd_err_set(DITD_EFORMAT,
                                       "%s: \"__metadata__\" value '" NAME_FMT
                                       "' is not a string",
                                       file, mk);
                    goto fail_ranges;
                }
                if (!(sf->meta[2 * sf->n_meta] = strdup(mk)) ||
                    !(sf->meta[2 * sf->n_meta + 1] = strdup(json_string_value(mv)))) {
                    err = ditd_err_set(DITD_ENOMEM, "%s: out of memory", file);
                    goto fail_ranges;
                }
                sf->n_meta++;
            }
            continue;
        }
        ditd_st_tensor tmp;
        memset(&tmp, 0, sizeof tmp);
        st_range r;
        err = st_parse_entry(file, key, v, data, data_len, &tmp, &r);
        if (err)
            goto fail_ranges;
        ditd_st_tensor *t = st_push_tensor(st);
        if (!t) {
            err = ditd_err_set(DITD_ENOMEM, "%s: out of memory", file);
            goto fail_ranges;
        }
        *t = tmp;
        t->file = file;
        t->name = strdup(key);
        if (!t->name) {
            st->count--;
            err = ditd_err_set(DITD_ENOMEM, "%s: out of memory", file);
            goto fail_ranges;
        }
        r.tensor = st->count - 1;
        ranges[nranges++] = r;
    }

    /* Overlaps: sorted by start, every non-empty range must begin at or
     * after the furthest end seen so far. */
    qsort(ranges, nranges, sizeof *ranges, range_cmp);
    uint64_t far = 0;
    size_t far_idx = 0;
    for (size_t i = 0; i < nranges; i++) {
        if (ranges[i].begin == ranges[i].end)
            continue;
        if (ranges[i].begin < far) {
            const ditd_st_tensor *a = &st->tensors[far_idx];
            const ditd_st_tensor *b = &st->tensors[ranges[i].tensor];
            err = ditd_err_set(DITD_EFORMAT,
                               "%s: tensors '" NAME_FMT "' and '" NAME_FMT
                               "' overlap in the data region (at byte %llu)",
                               file, a->name, b->name, (unsigned long long)ranges[i].begin);
            goto fail_ranges;
        }
        far = ranges[i].end;
        far_idx = ranges[i].tensor;
    }

    free(ranges);
    json_decref(root);
    return 0;

fail_ranges:
    free(ranges);
fail_root:
    json_decref(root);
    return err;
}

/* ---- files ------------------------------------------------------------- */

static int os_err(int e)
{
    if (e == ENOENT || e == ENOTDIR)
        return DITD_ENOENT;
    if (e == ENOMEM)
        return DITD_ENOMEM;
    return DITD_EIO;
}

/* Maps `path` and parses it into st. */
static int st_open_file(ditd_safetensors *st, const char *path)
{
    int err;
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
    if (len < 8) {
        err = ditd_err_set(DITD_EFORMAT,
                           "%s: file is %zu bytes, shorter than the 8-byte header length", path,
                           len);
        goto fail_fd;
    }
    void *map = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) {
        err = ditd_err_set(os_err(errno), "%s: mmap: %s", path, strerror(errno));
        goto fail_fd;
    }
    close(fd);

    err = st_add_file(st, path, map, len);
    if (err) {
        munmap(map, len);
        return err;
    }
    return st_parse(st, st->nfiles - 1, map, len);

fail_fd:
    close(fd);
    return err;
}

static int str_cmp(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static int tensor_cmp(const void *a, const void *b)
{
    return strcmp(((const ditd_st_tensor *)a)->name, ((const ditd_st_tensor *)b)->name);
}

/* Sorts the table by name and refuses a name held twice (across shards;
 * inside one header the JSON parser already refused it). */
static int st_finish(ditd_safetensors *st)
{
    if (st->count > 1)
        qsort(st->tensors, st->count, sizeof *st->tensors, tensor_cmp);
    for (size_t i = 1; i < st->count; i++) {
        const ditd_st_tensor *a = &st->tensors[i - 1], *b = &st->tensors[i];
        if (strcmp(a->name, b->name) == 0)
            return ditd_err_set(DITD_EFORMAT, "tensor '" NAME_FMT "' appears in both %s and %s",
                                a->name, a->file, b->file);
    }
    return 0;
}

/* A shard name from an index must stay inside the index's folder. */
static int shard_name_ok(const char *s)
{
    if (s[0] == '\0' || s[0] == '/')
        return 0;
    const char *p = s;
    while (*p) {
        const char *slash = strchr(p, '/');
        size_t n = slash ? (size_t)(slash - p) : strlen(p);
        if (n == 2 && p[0] == '.' && p[1] == '.')
            return 0;
        if (!slash)
            break;
        p = slash + 1;
    }
    /* A trailing '/' would name a folder. */
    return s[strlen(s) - 1] != '/';
}

/* Reads a whole (small) text file into a malloc'd buffer. */
static int read_text(const char *path, uint64_t limit, char **out, size_t *out_len)
{
    int err;
    FILE *f = fopen(path, "rb");
    if (!f)
        return ditd_err_set(os_err(errno), "%s: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fileno(f), &sb) != 0) {
        err = ditd_err_set(os_err(errno), "%s: %s", path, strerror(errno));
        goto fail_file;
    }
    if (!S_ISREG(sb.st_mode)) {
        err = ditd_err_set(DITD_EIO, "%s: not a regular file", path);
        goto fail_file;
    }
    if ((uint64_t)sb.st_size > limit) {
        err = ditd_err_set(DITD_EFORMAT, "%s: %lld bytes, more than an index may hold (%llu)",
                           path, (long long)sb.st_size, (unsigned long long)limit);
        goto fail_file;
    }
    size_t len = (size_t)sb.st_size;
    char *buf = malloc(len ? len : 1);
    if (!buf) {
        err = ditd_err_set(DITD_ENOMEM, "%s: out of memory", path);
        goto fail_file;
    }
    if (fread(buf, 1, len, f) != len) {
        err = ditd_err_set(DITD_EIO, "%s: short read", path);
        free(buf);
        goto fail_file;
    }
    fclose(f);
    *out = buf;
    *out_len = len;
    return 0;

fail_file:
    fclose(f);
    return err;
}

static char *path_join(const char *dir, size_t dir_len, const char *name)
{
    size_t n = strlen(name);
    char *p = malloc(dir_len + 1 + n + 1);
    if (!p)
        return NULL;
    memcpy(p, dir, dir_len);
    p[dir_len] = '/';
    memcpy(p + dir_len + 1, name, n + 1);
    return p;
}

/* Opens every shard an index names, then checks that each tensor of its
 * weight map lives in the shard the map says. */
static int st_open_index(ditd_safetensors *st, const char *path)
{
    char *text = NULL;
    size_t text_len = 0;
    int err = read_text(path, ST_MAX_INDEX, &text, &text_len);
    if (err)
        return err;

    json_error_t jerr;
    json_t *root = json_loadb(text, text_len, JSON_REJECT_DUPLICATES, &jerr);
    free(text);
    if (!root)
        return ditd_err_set(DITD_EFORMAT, "%s: not valid JSON: %s (line %d, column %d)", path,
                            jerr.text, jerr.line, jerr.column);

    const json_t *map = json_is_object(root) ? json_object_get(root, "weight_map") : NULL;
    if (!json_is_object(map)) {
        err = ditd_err_set(DITD_EFORMAT, "%s: no \"weight_map\" object", path);
        goto fail_root;
    }
    size_t nmap = json_object_size(map);
    if (nmap == 0) {
        err = ditd_err_set(DITD_EFORMAT, "%s: \"weight_map\" is empty", path);
        goto fail_root;
    }

    /* The distinct shard names, sorted; shard i becomes st->files[base+i]. */
    const char **shards = malloc(nmap * sizeof *shards);
    if (!shards) {
        err = ditd_err_set(DITD_ENOMEM, "%s: out of memory", path);
        goto fail_root;
    }
    size_t nshards = 0;
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)map, key, v) {
        if (!json_is_string(v)) {
            err = ditd_err_set(DITD_EFORMAT,
                               "%s: weight_map entry for tensor '" NAME_FMT
                               "' is not a string",
                               path, key);
            goto fail_shards;
        }
        const char *s = json_string_value(v);
        if (!shard_name_ok(s)) {
            err = ditd_err_set(DITD_EFORMAT,
                               "%s: tensor '" NAME_FMT "' maps to shard '" NAME_FMT
                               "', which is not a relative path inside the index's folder",
                               path, key, s);
            goto fail_shards;
        }
        shards[nshards++] = s;
    }
    qsort(shards, nshards, sizeof *shards, str_cmp);
    size_t u = 0;
    for (size_t i = 0; i < nshards; i++)
        if (u == 0 || strcmp(shards[u - 1], shards[i]) != 0)
            shards[u++] = shards[i];
    nshards = u;

    const char *slash = strrchr(path, '/');
    const char *dir = slash ? path : ".";
    size_t dir_len = slash ? (size_t)(slash - path) : 1;
    if (slash == path)
        dir_len = 0; /* "/x.json": the shard is "/shard" */
    size_t base = st->nfiles;
    for (size_t i = 0; i < nshards; i++) {
        char *sp = path_join(dir, dir_len, shards[i]);
        if (!sp) {
            err = ditd_err_set(DITD_ENOMEM, "%s: out of memory", path);
            goto fail_shards;
        }
        err = st_open_file(st, sp);
        free(sp);
        if (err)
            goto fail_shards;
        /* st_open_file adds the file before parsing, so files stay 1:1. */
    }
    err = st_finish(st);
    if (err)
        goto fail_shards;

    json_object_foreach((json_t *)map, key, v) {
        const char *s = json_string_value(v);
        const char **hit = bsearch(&s, shards, nshards, sizeof *shards, str_cmp);
        const char *want = st->files[base + (size_t)(hit - shards)].path;
        const ditd_st_tensor *t = ditd_safetensors_find(st, key);
        if (!t) {
            err = ditd_err_set(DITD_EFORMAT,
                               "%s: tensor '" NAME_FMT "' is mapped to %s, which lacks it", path,
                               key, want);
            goto fail_shards;
        }
        if (t->file != want) {
            err = ditd_err_set(DITD_EFORMAT,
                               "%s: tensor '" NAME_FMT "' is mapped to %s but found in %s",
                               path, key, want, t->file);
            goto fail_shards;
        }
    }

    free(shards);
    json_decref(root);
    return 0;

fail_shards:
    free(shards);
fail_root:
    json_decref(root);
    return err;
}

static int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

static int st_new(const char *origin, ditd_safetensors **out)
{
    ditd_safetensors *st = calloc(1, sizeof *st);
    if (!st)
        return ditd_err_set(DITD_ENOMEM, "out of memory");
    st->origin = strdup(origin);
    if (!st->origin) {
        free(st);
        return ditd_err_set(DITD_ENOMEM, "out of memory");
    }
    *out = st;
    return 0;
}

int ditd_safetensors_open(const char *path, ditd_safetensors **out)
{
    static const char *const candidates[] = {
        "diffusion_pytorch_model.safetensors.index.json",
        "diffusion_pytorch_model.safetensors",
        "model.safetensors.index.json",
        "model.safetensors",
    };
    ditd_safetensors *st = NULL;
    char *chosen = NULL;
    int err;

    *out = NULL;
    struct stat sb;
    if (stat(path, &sb) != 0)
        return ditd_err_set(os_err(errno), "%s: %s", path, strerror(errno));
    if (S_ISDIR(sb.st_mode)) {
        size_t dl = strlen(path);
        while (dl > 1 && path[dl - 1] == '/')
            dl--;
        for (size_t i = 0; i < sizeof candidates / sizeof *candidates && !chosen; i++) {
            char *p = path_join(path, dl, candidates[i]);
            if (!p)
                return ditd_err_set(DITD_ENOMEM, "out of memory");
            struct stat cs;
            if (stat(p, &cs) == 0 && S_ISREG(cs.st_mode))
                chosen = p;
            else
                free(p);
        }
        if (!chosen)
            return ditd_err_set(DITD_ENOENT,
                                "%s: no %s, %s, %s or %s in this folder", path, candidates[1],
                                candidates[0], candidates[3], candidates[2]);
        path = chosen;
    }

    err = st_new(path, &st);
    if (err)
        goto fail_chosen;
    if (ends_with(path, ".json")) {
        err = st_open_index(st, path);
    } else {
        err = st_open_file(st, path);
        if (!err)
            err = st_finish(st);
    }
    if (err)
        goto fail_st;
    free(chosen);
    *out = st;
    return 0;

fail_st:
    ditd_safetensors_free(st);
fail_chosen:
    free(chosen);
    return err;
}

int ditd_safetensors_open_mem(const void *buf, size_t len, const char *name,
                              ditd_safetensors **out)
{
    ditd_safetensors *st = NULL;
    *out = NULL;
    if (!name)
        name = "<memory>";
    int err = st_new(name, &st);
    if (err)
        return err;
    err = st_add_file(st, name, NULL, 0);
    if (err)
        goto fail_st;
    err = st_parse(st, 0, buf, len);
    if (err)
        goto fail_st;
    err = st_finish(st);
    if (err)
        goto fail_st;
    *out = st;
    return 0;

fail_st:
    ditd_safetensors_free(st);
    return err;
}

/* ---- FP8 scales ----------------------------------------------------------- */

/* An FP8 weight `P.weight` may come with its scale, as the FP8 checkpoints
 * store them: ComfyUI's scaled files `P.scale_weight` (one value), the
 * compressed-tensors / ModelOpt / vLLM layout `P.weight_scale` (one value,
 * or one per row: (N), (N, 1)). The stored value is the FP8 value times the
 * scale. Block-wise scales (`P.weight_scale_inv`, 128 x 128 tiles) are not
 * read: such a tensor is refused by name rather than read unscaled. */
static int fp8_scales(const ditd_safetensors *st, const char *name, const ditd_st_tensor *t,
                      int64_t r0, int64_t rows, float *dst)
{
    static const char *const suffixes[] = {"scale_weight", "weight_scale", "weight_scale_inv"};
    size_t nl = strlen(name);
    int base = (int)(nl > 7 && !strcmp(name + nl - 7, ".weight") ? nl - 7 : nl);
    const ditd_st_tensor *s = NULL;
    char sn[512];
    int which;
    for (which = 0; which < 3; which++) {
        if (snprintf(sn, sizeof sn, "%.*s.%s", base, name, suffixes[which]) >= (int)sizeof sn)
            return ditd_err_set(DITD_EINVAL, "tensor name '%s' too long", name);
        if ((s = ditd_safetensors_find(st, sn)))
            break;
    }
    for (int64_t r = 0; r < rows; r++)
        dst[r] = 1.0f;
    if (!s)
        return 0;
    if (which == 2)
        return ditd_err_set(DITD_EUNSUPPORTED,
                            "tensor '%s' in %s has block-wise scales ('%s'); ditd reads FP8 "
                            "weights with one scale per tensor or per row",
                            name, t->file, sn);
    int64_t n = 1;
    for (int d = 0; d < s->ndim; d++)
        n *= s->shape[d];
    const int64_t trows = t->ndim > 0 ? t->shape[0] : 1;
    int per_row = n == trows && n > 1 && (s->ndim == 1 || (s->ndim == 2 && s->shape[1] == 1));
    if (!is_f32_readable(s->dtype) || is_fp8(s->dtype) || (n != 1 && !per_row)) {
        char have[160];
        return ditd_err_set(DITD_EFORMAT,
                            "scale '%s' of FP8 tensor '%s' (%lld rows) in %s: %s %s is neither "
                            "one value nor one per row",
                            sn, name, (long long)trows, s->file, ditd_st_dtype_name(s->dtype),
                            ditd_shape_str(have, sizeof have, s->ndim, s->shape));
    }
    size_t es = (size_t)ditd_st_dtype_bits(s->dtype) / 8;
    if (per_row) {
        convert_to_f32(s->dtype, (const uint8_t *)s->data + (size_t)r0 * es, (size_t)rows, dst);
    } else {
        float v;
        convert_to_f32(s->dtype, s->data, 1, &v);
        for (int64_t r = 0; r < rows; r++)
            dst[r] = v;
    }
    for (int64_t r = 0; r < rows; r++)
        if (!isfinite(dst[r]))
            return ditd_err_set(DITD_EFORMAT, "scale '%s' of FP8 tensor '%s' in %s is not finite",
                                sn, name, s->file);
    return 0;
}

/* Multiplies what was read of FP8 tensor t, rows [r0, r0 + rows), each
 * `per` consecutive values of dst one row, by the rows' scales. */
static int fp8_apply_scales(const ditd_safetensors *st, const char *name,
                            const ditd_st_tensor *t, int64_t r0, int64_t rows, float *dst,
                            size_t per)
{
    if (rows <= 0)
        return 0;
    float *sc = malloc((size_t)rows * sizeof *sc);
    if (!sc)
        return ditd_err_set(DITD_ENOMEM, "scales of '%s'", name);
    int err = fp8_scales(st, name, t, r0, rows, sc);
    for (int64_t r = 0; !err && r < rows; r++)
        if (sc[r] != 1.0f)
            for (size_t i = 0; i < per; i++)
                dst[(size_t)r * per + i] *= sc[r];
    free(sc);
    return err;
}

/* ---- lookups and reads ------------------------------------------------- */

size_t ditd_safetensors_count(const ditd_safetensors *st)
{
    return st->count;
}

const ditd_st_tensor *ditd_safetensors_at(const ditd_safetensors *st, size_t i)
{
    return i < st->count ? &st->tensors[i] : NULL;
}

const ditd_st_tensor *ditd_safetensors_find(const ditd_safetensors *st, const char *name)
{
    size_t lo = 0, hi = st->count;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(st->tensors[mid].name, name);
        if (c == 0)
            return &st->tensors[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

/* Finds `name`, checks its shape against the caller's and that it reads as
 * f32. */
static int st_lookup(const ditd_safetensors *st, const char *name, int ndim,
                     const int64_t *shape, const ditd_st_tensor **out)
{
    if (ndim < 0 || ndim > DITD_ST_MAX_DIMS || (ndim > 0 && !shape))
        return ditd_err_set(DITD_EINVAL, "tensor '%s': expected rank %d is not 0..%d", name,
                            ndim, DITD_ST_MAX_DIMS);
    const ditd_st_tensor *t = ditd_safetensors_find(st, name);
    if (!t)
        return ditd_err_set(DITD_ENOENT, "tensor '%s' not found in %s", name, st->origin);
    int same = t->ndim == ndim;
    for (int i = 0; same && i < ndim; i++)
        same = t->shape[i] == shape[i];
    if (!same) {
        char have[160], want[160];
        return ditd_err_set(DITD_ESHAPE, "tensor '%s' has shape %s in %s, expected %s", name,
                            ditd_shape_str(have, sizeof have, t->ndim, t->shape), t->file,
                            ditd_shape_str(want, sizeof want, ndim, shape));
    }
    if (!is_f32_readable(t->dtype))
        return ditd_err_set(DITD_EUNSUPPORTED,
                            "tensor '%s' in %s has dtype %s; only F32, F16, BF16, F64, "
                            "F8_E4M3 and F8_E5M2 convert to f32",
                            name, t->file, ditd_st_dtype_name(t->dtype));
    *out = t;
    return 0;
}

int ditd_safetensors_read_f32(const ditd_safetensors *st, const char *name, int ndim,
                              const int64_t *shape, float *dst)
{
    const ditd_st_tensor *t;
    int err = st_lookup(st, name, ndim, shape, &t);
    if (err)
        return err;
    size_t esize = (size_t)ditd_st_dtype_bits(t->dtype) / 8;
    convert_to_f32(t->dtype, t->data, t->nbytes / esize, dst);
    if (is_fp8(t->dtype) && t->nbytes) {
        const int64_t rows = t->ndim > 0 ? t->shape[0] : 1;
        return fp8_apply_scales(st, name, t, 0, rows, dst, t->nbytes / (size_t)rows);
    }
    return 0;
}

int ditd_safetensors_read_f32_slice(const ditd_safetensors *st, const char *name, int ndim,
                                    const int64_t *full_shape, int axis, int64_t start,
                                    int64_t len, float *dst)
{
    const ditd_st_tensor *t;
    int err = st_lookup(st, name, ndim, full_shape, &t);
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

    size_t esize = (size_t)ditd_st_dtype_bits(t->dtype) / 8;
    if (t->nbytes == 0 || len == 0)
        return 0;
    /* With no zero dimension every partial product is <= numel, which the
     * open checked against the file size: nothing below overflows. */
    size_t outer = 1, inner = 1;
    for (int i = 0; i < axis; i++)
        outer *= (size_t)t->shape[i];
    for (int i = axis + 1; i < ndim; i++)
        inner *= (size_t)t->shape[i];
    size_t full = (size_t)t->shape[axis];
    size_t run = (size_t)len * inner;
    const uint8_t *src = t->data;
    for (size_t o = 0; o < outer; o++) {
        const uint8_t *s = src + ((o * full + (size_t)start) * inner) * esize;
        convert_to_f32(t->dtype, s, run, dst + o * run);
    }
    if (!is_fp8(t->dtype))
        return 0;
    /* the rows are axis 0: a slice of them, or every row cut along another
     * axis (then row o / (the outer dimensions after the first) of the runs) */
    if (axis == 0)
        return fp8_apply_scales(st, name, t, start, len, dst, run / (size_t)len);
    return fp8_apply_scales(st, name, t, 0, t->shape[0], dst,
                            outer / (size_t)t->shape[0] * run);
}

int ditd_safetensors_row_scales(const ditd_safetensors *st, const char *name, int64_t r0,
                                int64_t rows, float *dst)
{
    const ditd_st_tensor *t = ditd_safetensors_find(st, name);
    if (!t || t->ndim < 1 || !is_fp8(t->dtype))
        return ditd_err_set(DITD_EINVAL, "tensor '%s' is not an F8_E4M3 / F8_E5M2 matrix", name);
    if (r0 < 0 || rows < 0 || r0 > t->shape[0] || rows > t->shape[0] - r0)
        return ditd_err_set(DITD_ERANGE, "tensor '%s': rows [%lld, %lld) of %lld", name,
                            (long long)r0, (long long)(r0 + rows), (long long)t->shape[0]);
    return fp8_scales(st, name, t, r0, rows, dst);
}

const char *ditd_safetensors_meta(const ditd_safetensors *st, const char *key)
{
    if (!st || !st->nfiles)
        return NULL;
    const st_file *f = &st->files[0];
    for (size_t k = 0; k < f->n_meta; k++)
        if (!strcmp(f->meta[2 * k], key))
            return f->meta[2 * k + 1];
    return NULL;
}
