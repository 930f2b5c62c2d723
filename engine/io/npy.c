/* NumPy .npy reader and writer.
 *
 * Format (numpy/lib/format.py, "NEP 1"):
 *   "\x93NUMPY" | major u8 | minor u8 | header length (u16 LE for 1.0,
 *   u32 LE for 2.0 and 3.0) | header | data
 * The header is a Python dict literal with exactly the keys 'descr',
 * 'fortran_order' and 'shape', padded with spaces and ended by '\n'.
 * It is parsed by a small recursive-descent reader of the Python literal
 * subset numpy writes; anything else is an error, never a guess.
 */
#include "engine/io/npy.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/core/error.h"
#include "engine/io/safetensors.h" /* ditd_st_f16_to_f32 */

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "ditd reads little-endian .npy data and needs a little-endian host"
#endif

/* numpy refuses headers over 10000 bytes by default (max_header_size);
 * we allow more, but bound what a lying length can make us allocate. */
#define NPY_MAX_HEADER (1u << 20)
/* numpy 2 allows 64 dimensions. */
#define NPY_PARSE_DIMS 64

/* ---- the source: a file or a memory image ----------------------------- */

typedef struct npy_src {
    const char *name;
    const uint8_t *mem; /* memory mode when non-NULL */
    FILE *fp;           /* file mode */
    uint64_t size;      /* total bytes */
    uint64_t pos;
} npy_src;

/* Reads n bytes at the current position; "truncated" when they are not
 * there. `what` names the part being read. */
static int src_read(npy_src *s, void *dst, size_t n, const char *what)
{
    if (n > s->size - s->pos)
        return ditd_err_set(DITD_EFORMAT,
                            "%s: truncated: %s needs %zu bytes at offset %llu, the file has "
                            "%llu",
                            s->name, what, n, (unsigned long long)s->pos,
                            (unsigned long long)s->size);
    if (s->mem) {
        memcpy(dst, s->mem + s->pos, n);
    } else if (n && fread(dst, 1, n, s->fp) != n) {
        return ditd_err_set(DITD_EIO, "%s: read error: %s", s->name,
                            ferror(s->fp) ? strerror(errno) : "file shrank while reading");
    }
    s->pos += n;
    return 0;
}

/* ---- the header dict -------------------------------------------------- */

typedef enum npy_kind { NPY_F, NPY_I, NPY_U, NPY_B } npy_kind;

typedef struct npy_header {
    npy_kind kind;
    int itemsize;
    int ndim;
    int64_t shape[NPY_PARSE_DIMS];
    uint64_t numel;
} npy_header;

typedef struct lit {
    const char *p, *end;
    const char *name; /* file name, for messages */
} lit;

static void lit_ws(lit *l)
{
    while (l->p < l->end &&
           (*l->p == ' ' || *l->p == '\t' || *l->p == '\n' || *l->p == '\r' || *l->p == '\f' ||
            *l->p == '\v'))
        l->p++;
}

static int lit_fail(lit *l, const char *what)
{
    return ditd_err_set(DITD_EFORMAT, "%s: header is not a valid dict literal: %s", l->name,
                        what);
}

/* Accepts character c after optional whitespace. */
static int lit_eat(lit *l, char c)
{
    lit_ws(l);
    if (l->p < l->end && *l->p == c) {
        l->p++;
        return 1;
    }
    return 0;
}

/* A quoted string (optional u/b prefix, ' or "), without its quotes, into
 * buf (cut at cap-1; callers only compare short strings). Escapes keep the
 * escaped character. */
static int lit_string(lit *l, char *buf, size_t cap)
{
    lit_ws(l);
    if (l->p < l->end && (*l->p == 'u' || *l->p == 'b'))
        l->p++;
    if (l->p >= l->end || (*l->p != '\'' && *l->p != '"'))
        return lit_fail(l, "expected a quoted string");
    char q = *l->p++;
    size_t n = 0;
    while (l->p < l->end && *l->p != q) {
        char c = *l->p++;
        if (c == '\n')
            return lit_fail(l, "newline inside a string");
        if (c == '\\') {
            if (l->p >= l->end)
                break;
            c = *l->p++;
        }
        if (n + 1 < cap)
            buf[n++] = c;
    }
    if (l->p >= l->end)
        return lit_fail(l, "unterminated string");
    l->p++;
    buf[n] = '\0';
    return 0;
}

static int lit_word(lit *l, const char *w)
{
    size_t n = strlen(w);
    lit_ws(l);
    if ((size_t)(l->end - l->p) >= n && memcmp(l->p, w, n) == 0) {
        const char *after = l->p + n;
        /* "Truex" is a name, not True */
        if (after < l->end && (isalnum((unsigned char)*after) || *after == '_'))
            return 0;
        l->p = after;
        return 1;
    }
    return 0;
}

/* A non-negative decimal integer (Python 2's 'L' suffix allowed). */
static int lit_uint(lit *l, int64_t *out)
{
    lit_ws(l);
    if (l->p >= l->end || *l->p < '0' || *l->p > '9')
        return lit_fail(l, "shape entries must be non-negative integers");
    int64_t v = 0;
    while (l->p < l->end && *l->p >= '0' && *l->p <= '9') {
        int d = *l->p++ - '0';
        if (v > (INT64_MAX - d) / 10)
            return lit_fail(l, "shape entry too large");
        v = v * 10 + d;
    }
    if (l->p < l->end && (*l->p == 'L' || *l->p == 'l'))
        l->p++;
    *out = v;
    return 0;
}

/* A tuple of integers, as Python writes it: "()", "(3,)", "(2, 3)". A list
 * "[2, 3]" is accepted too; "(3)" is the integer 3 and is refused. */
static int lit_shape(lit *l, npy_header *h)
{
    char close;
    if (lit_eat(l, '('))
        close = ')';
    else if (lit_eat(l, '['))
        close = ']';
    else
        return lit_fail(l, "'shape' is not a tuple");
    h->ndim = 0;
    int trailing_comma = 0;
    for (;;) {
        if (lit_eat(l, close))
            break;
        if (h->ndim == NPY_PARSE_DIMS)
            return lit_fail(l, "'shape' has more than 64 entries");
        int err = lit_uint(l, &h->shape[h->ndim++]);
        if (err)
            return err;
        trailing_comma = lit_eat(l, ',');
        if (!trailing_comma) {
            if (!lit_eat(l, close))
                return lit_fail(l, "expected ',' or the end of 'shape'");
            break;
        }
    }
    if (close == ')' && h->ndim == 1 && !trailing_comma)
        return lit_fail(l, "'shape' is a parenthesised integer, not a tuple");
    return 0;
}

/* Parses a descr such as '<f4' into kind and size. */
static int parse_descr(const char *name, const char *d, npy_header *h)
{
    char order = d[0];
    if (order != '<' && order != '>' && order != '|' && order != '=')
        goto unsupported;
    char kind = d[1];
    const char *num = d + 2;
    if (!(num[0] >= '1' && num[0] <= '8') || num[1] != '\0')
        goto unsupported;
    int size = num[0] - '0';
    switch (kind) {
    case 'f':
        if (size != 2 && size != 4 && size != 8)
            goto unsupported;
        h->kind = NPY_F;
        break;
    case 'i':
        if (size != 1 && size != 2 && size != 4 && size != 8)
            goto unsupported;
        h->kind = NPY_I;
        break;
    case 'u':
        if (size != 1 && size != 2 && size != 4 && size != 8)
            goto unsupported;
        h->kind = NPY_U;
        break;
    case 'b':
        if (size != 1)
            goto unsupported;
        h->kind = NPY_B;
        break;
    default:
        goto unsupported;
    }
    if (order == '>' && size > 1)
        return ditd_err_set(DITD_EUNSUPPORTED,
                            "%s: big-endian data ('%s') is not supported; save it with "
                            "arr.astype(arr.dtype.newbyteorder('<'))",
                            name, d);
    h->itemsize = size;
    return 0;

unsupported:
    return ditd_err_set(DITD_EUNSUPPORTED,
                        "%s: dtype '%.40s' is not supported (float, int, uint or bool only)",
                        name, d);
}

/* Parses the header text [p, end) into h. */
static int parse_header(const char *name, const char *p, const char *end, npy_header *h)
{
    lit l = { p, end, name };
    int have_descr = 0, have_order = 0, have_shape = 0, fortran = 0;
    char descr[64] = "";
    int err;

    if (!lit_eat(&l, '{'))
        return lit_fail(&l, "does not start with '{'");
    for (;;) {
        if (lit_eat(&l, '}'))
            break;
        char key[32];
        err = lit_string(&l, key, sizeof key);
        if (err)
            return err;
        if (!lit_eat(&l, ':'))
            return lit_fail(&l, "expected ':' after a key");
        if (strcmp(key, "descr") == 0 && !have_descr) {
            lit_ws(&l);
            if (l.p < l.end && (*l.p == '[' || *l.p == '{'))
                return ditd_err_set(DITD_EUNSUPPORTED,
                                    "%s: structured dtypes are not supported", name);
            err = lit_string(&l, descr, sizeof descr);
            if (err)
                return err;
            have_descr = 1;
        } else if (strcmp(key, "fortran_order") == 0 && !have_order) {
            if (lit_word(&l, "True"))
                fortran = 1;
            else if (!lit_word(&l, "False"))
                return lit_fail(&l, "'fortran_order' is not True or False");
            have_order = 1;
        } else if (strcmp(key, "shape") == 0 && !have_shape) {
            err = lit_shape(&l, h);
            if (err)
                return err;
            have_shape = 1;
        } else {
            return ditd_err_set(DITD_EFORMAT, "%s: header has an unknown or repeated key '%s'",
                                name, key);
        }
        if (!lit_eat(&l, ',')) {
            if (!lit_eat(&l, '}'))
                return lit_fail(&l, "expected ',' or '}'");
            break;
        }
    }
    lit_ws(&l);
    if (l.p != l.end)
        return lit_fail(&l, "text after the closing '}'");
    if (!have_descr || !have_order || !have_shape)
        return ditd_err_set(DITD_EFORMAT, "%s: header lacks '%s'", name,
                            !have_descr ? "descr" : !have_order ? "fortran_order" : "shape");

    err = parse_descr(name, descr, h);
    if (err)
        return err;

    uint64_t n = 1;
    int has_zero = 0;
    for (int i = 0; i < h->ndim; i++)
        has_zero |= h->shape[i] == 0;
    for (int i = 0; i < h->ndim && !has_zero; i++) {
        uint64_t d = (uint64_t)h->shape[i];
        if (n > UINT64_MAX / d || n * d > UINT64_MAX / (uint64_t)h->itemsize)
            return ditd_err_set(DITD_EFORMAT, "%s: shape's element count overflows", name);
        n *= d;
    }
    h->numel = has_zero ? 0 : n;

    /* Fortran and C order agree when at most one dimension exceeds 1. */
    int big = 0;
    for (int i = 0; i < h->ndim; i++)
        big += h->shape[i] > 1;
    if (fortran && big > 1)
        return ditd_err_set(DITD_EUNSUPPORTED,
                            "%s: Fortran-order (column-major) data is not supported; save "
                            "np.ascontiguousarray(arr)",
                            name);
    return 0;
}

/* Reads the preamble and header, leaving the source at the data. */
static int read_header(npy_src *s, npy_header *h)
{
    uint8_t pre[12];
    int err = src_read(s, pre, 8, "the magic and version");
    if (err)
        return err;
    if (memcmp(pre, "\x93NUMPY", 6) != 0)
        return ditd_err_set(DITD_EFORMAT, "%s: not a .npy file (bad magic)", s->name);
    int major = pre[6], minor = pre[7];
    if (major < 1 || major > 3 || minor != 0)
        return ditd_err_set(DITD_EFORMAT, "%s: unknown .npy format version %d.%d", s->name,
                            major, minor);
    uint32_t hlen;
    if (major == 1) {
        err = src_read(s, pre + 8, 2, "the header length");
        hlen = (uint32_t)pre[8] | (uint32_t)pre[9] << 8;
    } else {
        err = src_read(s, pre + 8, 4, "the header length");
        hlen = (uint32_t)pre[8] | (uint32_t)pre[9] << 8 | (uint32_t)pre[10] << 16 |
               (uint32_t)pre[11] << 24;
    }
    if (err)
        return err;
    if (hlen > NPY_MAX_HEADER)
        return ditd_err_set(DITD_EFORMAT, "%s: header length %u exceeds the limit of %u",
                            s->name, hlen, NPY_MAX_HEADER);
    char *text = malloc((size_t)hlen + 1);
    if (!text)
        return ditd_err_set(DITD_ENOMEM, "%s: out of memory", s->name);
    err = src_read(s, text, hlen, "the header");
    if (err)
        goto done;
    text[hlen] = '\0';
    if (memchr(text, '\0', hlen)) {
        err = ditd_err_set(DITD_EFORMAT, "%s: header contains a NUL byte", s->name);
        goto done;
    }
    err = parse_header(s->name, text, text + hlen, h);
done:
    free(text);
    return err;
}

/* ---- conversions ------------------------------------------------------ */

/* Element i of raw data of kind/itemsize as a double (exact for every
 * supported type but 64-bit integers, which round like (float) would). */
static double load_f64(const npy_header *h, const uint8_t *p)
{
    switch (h->kind) {
    case NPY_F:
        if (h->itemsize == 2) {
            uint16_t v;
            memcpy(&v, p, 2);
            return ditd_st_f16_to_f32(v);
        } else if (h->itemsize == 4) {
            float v;
            memcpy(&v, p, 4);
            return v;
        } else {
            double v;
            memcpy(&v, p, 8);
            return v;
        }
    case NPY_B:
        return *p != 0;
    default:
        break;
    }
    return 0.0;
}

static int64_t load_i(const npy_header *h, const uint8_t *p)
{
    switch (h->itemsize) {
    case 1: { int8_t v; memcpy(&v, p, 1); return v; }
    case 2: { int16_t v; memcpy(&v, p, 2); return v; }
    case 4: { int32_t v; memcpy(&v, p, 4); return v; }
    default: { int64_t v; memcpy(&v, p, 8); return v; }
    }
}

static uint64_t load_u(const npy_header *h, const uint8_t *p)
{
    switch (h->itemsize) {
    case 1: return *p;
    case 2: { uint16_t v; memcpy(&v, p, 2); return v; }
    case 4: { uint32_t v; memcpy(&v, p, 4); return v; }
    default: { uint64_t v; memcpy(&v, p, 8); return v; }
    }
}

static void to_f32(const npy_header *h, const uint8_t *raw, float *out)
{
    size_t n = (size_t)h->numel, sz = (size_t)h->itemsize;
    if (h->kind == NPY_F && sz == 4) {
        memcpy(out, raw, n * 4);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        const uint8_t *p = raw + i * sz;
        if (h->kind == NPY_I)
            out[i] = (float)load_i(h, p);
        else if (h->kind == NPY_U)
            out[i] = (float)load_u(h, p);
        else
            out[i] = (float)load_f64(h, p);
    }
}

static int to_i64(const char *name, const npy_header *h, const uint8_t *raw, int64_t *out)
{
    size_t n = (size_t)h->numel, sz = (size_t)h->itemsize;
    for (size_t i = 0; i < n; i++) {
        const uint8_t *p = raw + i * sz;
        if (h->kind == NPY_I) {
            out[i] = load_i(h, p);
        } else if (h->kind == NPY_U) {
            uint64_t u = load_u(h, p);
            if (u > (uint64_t)INT64_MAX)
                return ditd_err_set(DITD_ERANGE,
                                    "%s: element %zu (%llu) does not fit in int64", name, i,
                                    (unsigned long long)u);
            out[i] = (int64_t)u;
        } else {
            double d = load_f64(h, p);
            /* [-2^63, 2^63) and integral; NaN fails both comparisons. */
            if (!(d >= -9223372036854775808.0 && d < 9223372036854775808.0) || d != floor(d))
                return ditd_err_set(DITD_ERANGE,
                                    "%s: element %zu (%g) is not an integer in int64's range",
                                    name, i, d);
            out[i] = (int64_t)d;
        }
    }
    return 0;
}

/* ---- readers ---------------------------------------------------------- */

/* Parses, checks the shape against max_ndim and the size against the
 * source, reads and converts to i64 (want_i64) or f32. */
static int npy_read(npy_src *s, int max_ndim, int *ndim, int64_t *shape, void **data,
                    int want_i64)
{
    npy_header h;
    int err = read_header(s, &h);
    if (err)
        return err;
    if (h.ndim > max_ndim)
        return ditd_err_set(DITD_ESHAPE, "%s: array has %d dimensions, at most %d expected",
                            s->name, h.ndim, max_ndim);
    uint64_t nbytes = h.numel * (uint64_t)h.itemsize;
    if (nbytes > s->size - s->pos)
        return ditd_err_set(DITD_EFORMAT,
                            "%s: truncated: shape and dtype need %llu data bytes, the file has "
                            "%llu after the header",
                            s->name, (unsigned long long)nbytes,
                            (unsigned long long)(s->size - s->pos));
    size_t elem = want_i64 ? 8 : 4;
    if (h.numel > SIZE_MAX / elem)
        return ditd_err_set(DITD_ENOMEM, "%s: array too large", s->name);

    void *out = malloc(h.numel ? (size_t)h.numel * elem : 1);
    if (!out)
        return ditd_err_set(DITD_ENOMEM, "%s: out of memory for %llu elements", s->name,
                            (unsigned long long)h.numel);
    /* A memory image converts from where it lies; a file is read straight
     * into the output when its bytes already are the output's, else into
     * a staging buffer that is converted. */
    const uint8_t *raw;
    uint8_t *staging = NULL;
    int direct = (size_t)h.itemsize == elem &&
                 ((!want_i64 && h.kind == NPY_F) || (want_i64 && h.kind == NPY_I));
    if (s->mem) {
        raw = s->mem + s->pos;
    } else {
        if (!direct) {
            staging = malloc(nbytes ? (size_t)nbytes : 1);
            if (!staging) {
                err = ditd_err_set(DITD_ENOMEM, "%s: out of memory", s->name);
                goto fail_out;
            }
        }
        err = src_read(s, direct ? out : staging, (size_t)nbytes, "the data");
        if (err)
            goto fail_staging;
        raw = direct ? out : staging;
    }
    if (raw != out) {
        if (want_i64)
            err = to_i64(s->name, &h, raw, out);
        else
            to_f32(&h, raw, out);
        if (err)
            goto fail_staging;
    }
    free(staging);
    *ndim = h.ndim;
    if (h.ndim) /* shape may be NULL when max_ndim is 0 */
        memcpy(shape, h.shape, (size_t)h.ndim * sizeof *shape);
    *data = out;
    return 0;

fail_staging:
    free(staging);
fail_out:
    free(out);
    return err;
}

static int npy_read_file(const char *path, int max_ndim, int *ndim, int64_t *shape,
                         void **data, int want_i64)
{
    int err;
    FILE *f = fopen(path, "rb");
    if (!f)
        return ditd_err_set(errno == ENOENT || errno == ENOTDIR ? DITD_ENOENT : DITD_EIO,
                            "%s: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fileno(f), &sb) != 0) {
        err = ditd_err_set(DITD_EIO, "%s: %s", path, strerror(errno));
        goto done;
    }
    if (!S_ISREG(sb.st_mode)) {
        err = ditd_err_set(DITD_EIO, "%s: not a regular file", path);
        goto done;
    }
    npy_src s = { path, NULL, f, (uint64_t)sb.st_size, 0 };
    err = npy_read(&s, max_ndim, ndim, shape, data, want_i64);
done:
    fclose(f);
    return err;
}

static int check_args(const char *name, int max_ndim, const int *ndim, const int64_t *shape,
                      const void *data)
{
    if (max_ndim < 0 || !ndim || (max_ndim > 0 && !shape) || !data)
        return ditd_err_set(DITD_EINVAL, "%s: bad arguments to the .npy reader", name);
    return 0;
}

int ditd_npy_read_f32(const char *path, int max_ndim, int *ndim, int64_t *shape,
                      float **data)
{
    void *d;
    int err = check_args(path, max_ndim, ndim, shape, data);
    if (err)
        return err;
    err = npy_read_file(path, max_ndim, ndim, shape, &d, 0);
    if (!err)
        *data = d;
    return err;
}

int ditd_npy_read_i64(const char *path, int max_ndim, int *ndim, int64_t *shape,
                      int64_t **data)
{
    void *d;
    int err = check_args(path, max_ndim, ndim, shape, data);
    if (err)
        return err;
    err = npy_read_file(path, max_ndim, ndim, shape, &d, 1);
    if (!err)
        *data = d;
    return err;
}

/* The two in-memory readers: one body, as_i64 picks the conversion. */
static int read_mem(const void *buf, size_t len, const char *name, int max_ndim, int *ndim,
                    int64_t *shape, void **data, int as_i64)
{
    if (!name)
        name = "<memory>";
    int err = check_args(name, max_ndim, ndim, shape, data);
    if (err)
        return err;
    npy_src s = { name, buf ? buf : (const void *)"", NULL, buf ? len : 0, 0 };
    void *d;
    err = npy_read(&s, max_ndim, ndim, shape, &d, as_i64);
    if (!err)
        *data = d;
    return err;
}

int ditd_npy_read_f32_mem(const void *buf, size_t len, const char *name, int max_ndim,
                          int *ndim, int64_t *shape, float **data)
{
    return read_mem(buf, len, name, max_ndim, ndim, shape, (void **)data, 0);
}

int ditd_npy_read_i64_mem(const void *buf, size_t len, const char *name, int max_ndim,
                          int *ndim, int64_t *shape, int64_t **data)
{
    return read_mem(buf, len, name, max_ndim, ndim, shape, (void **)data, 1);
}

/* ---- writer ----------------------------------------------------------- */

/* Writes everything or fails with errno set. */
static int write_all(int fd, const void *buf, size_t n)
{
    const uint8_t *p = buf;
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

int ditd_npy_write_f32(const char *path, int ndim, const int64_t *shape, const float *data)
{
    static atomic_uint seq;
    if (ndim < 0 || ndim > DITD_NPY_MAX_DIMS || (ndim > 0 && !shape))
        return ditd_err_set(DITD_EINVAL, "%s: cannot write a %d-D array", path, ndim);

    /* The dict exactly as numpy.save writes it. */
    char hdr[128 + 24 * DITD_NPY_MAX_DIMS];
    size_t o = (size_t)snprintf(hdr, sizeof hdr,
                                "{'descr': '<f4', 'fortran_order': False, 'shape': (");
    uint64_t numel = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0)
            return ditd_err_set(DITD_EINVAL, "%s: shape[%d] = %lld is negative", path, i,
                                (long long)shape[i]);
        o += (size_t)snprintf(hdr + o, sizeof hdr - o, "%s%lld", i ? ", " : "",
                              (long long)shape[i]);
    }
    for (int i = 0; i < ndim; i++) {
        uint64_t d = (uint64_t)shape[i];
        if (d && numel > SIZE_MAX / 4 / d)
            return ditd_err_set(DITD_EINVAL, "%s: array too large", path);
        numel *= d;
    }
    o += (size_t)snprintf(hdr + o, sizeof hdr - o, "%s), }", ndim == 1 ? "," : "");
    /* 10 bytes of preamble + dict + padding + '\n' is a multiple of 64. */
    size_t total = 10 + o + 1;
    size_t pad = (64 - total % 64) % 64;
    memset(hdr + o, ' ', pad);
    o += pad;
    hdr[o++] = '\n';
    uint8_t pre[10] = { 0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (uint8_t)(o & 0xff),
                        (uint8_t)(o >> 8) };
    if (numel && !data)
        return ditd_err_set(DITD_EINVAL, "%s: no data to write", path);

    /* Write beside the target and rename, so readers never see half a
     * file; a device or pipe (say /dev/stdout) is written in place. */
    struct stat sb;
    int in_place = stat(path, &sb) == 0 && !S_ISREG(sb.st_mode);
    size_t plen = strlen(path);
    char *tmp = malloc(plen + 48);
    if (!tmp)
        return ditd_err_set(DITD_ENOMEM, "%s: out of memory", path);
    if (in_place)
        memcpy(tmp, path, plen + 1);
    else
        snprintf(tmp, plen + 48, "%s.tmp-%ld-%u", path, (long)getpid(),
                 atomic_fetch_add(&seq, 1u));
    int fd = in_place ? open(path, O_WRONLY | O_CLOEXEC)
                      : open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    int err;
    if (fd < 0) {
        err = ditd_err_set(errno == ENOENT || errno == ENOTDIR ? DITD_ENOENT : DITD_EIO,
                           "%s: %s", path, strerror(errno));
        goto fail_tmp;
    }
    if (write_all(fd, pre, sizeof pre) || write_all(fd, hdr, o) ||
        write_all(fd, data, (size_t)numel * 4)) {
        err = ditd_err_set(DITD_EIO, "%s: write: %s", path, strerror(errno));
        close(fd);
        goto fail_unlink;
    }
    if (close(fd) != 0) {
        err = ditd_err_set(DITD_EIO, "%s: close: %s", path, strerror(errno));
        goto fail_unlink;
    }
    if (!in_place && rename(tmp, path) != 0) {
        err = ditd_err_set(DITD_EIO, "%s: rename: %s", path, strerror(errno));
        goto fail_unlink;
    }
    free(tmp);
    return 0;

fail_unlink:
    if (!in_place)
        unlink(tmp);
fail_tmp:
    free(tmp);
    return err;
}
