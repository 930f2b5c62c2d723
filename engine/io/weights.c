/* The weight source: safetensors or GGUF behind one read interface, plus a
 * family's aliases (engine/io/weights.h).
 *
 * An alias is a list of row segments of the file's own tensors; a read of
 * it reads each segment (a slice along axis 0 of its source) into its rows
 * of the destination. A slice of an alias along axis 0 intersects the
 * segments; along another axis it reads the whole alias into a temporary
 * and cuts it (a tensor-parallel rank's columns: load time only).
 */
#include "engine/io/weights.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "engine/core/error.h"
#include "engine/core/tensor.h"
#include "kernels/cpu/dequant.h"

#define MAX_SEGS 4

typedef struct alias {
    char *name;
    int nseg;
    ditd_weight_seg seg[MAX_SEGS]; /* src owned */
    int ndim;
    int64_t shape[DITD_GGUF_MAX_DIMS];
} alias;

struct ditd_weights {
    char *path;
    ditd_safetensors *st;
    ditd_gguf *gg;
    alias *al;
    size_t nal, cap;
    int dequantize; /* DITD_WEIGHTS_DEQUANTIZE=1: nothing stays quantized */
};

/* ---- open ------------------------------------------------------------------- */

static int ends_with(const char *s, const char *suf)
{
    size_t n = strlen(s), m = strlen(suf);
    return n >= m && strcmp(s + n - m, suf) == 0;
}

/* The single *.gguf of folder `dir` into *out (malloc'd), or NULL when
 * there is none. */
static int find_gguf(const char *dir, char **out)
{
    *out = NULL;
    DIR *d = opendir(dir);
    if (!d)
        return 0;
    struct dirent *e;
    int err = 0;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.' || !ends_with(e->d_name, ".gguf"))
            continue;
        if (*out) {
            err = ditd_err_set(DITD_EFORMAT, "%s: two GGUF files (%s and %s): which one is meant?",
                               dir, strrchr(*out, '/') + 1, e->d_name);
            break;
        }
        size_t n = strlen(dir) + strlen(e->d_name) + 2;
        if (!(*out = malloc(n))) {
            err = ditd_err_set(DITD_ENOMEM, "out of memory");
            break;
        }
        snprintf(*out, n, "%s/%s", dir, e->d_name);
    }
    closedir(d);
    if (err) {
        free(*out);
        *out = NULL;
    }
    return err;
}

static int has_safetensors(const char *dir)
{
    static const char *const names[] = {"diffusion_pytorch_model.safetensors.index.json",
                                        "diffusion_pytorch_model.safetensors",
                                        "model.safetensors.index.json", "model.safetensors"};
    char p[4096];
    struct stat sb;
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, names[i]);
        if (stat(p, &sb) == 0 && S_ISREG(sb.st_mode))
            return 1;
    }
    return 0;
}

int ditd_weights_open(const char *path, ditd_weights **out)
{
    *out = NULL;
    ditd_weights *w = calloc(1, sizeof *w);
    if (!w)
        return ditd_err_set(DITD_ENOMEM, "out of memory");
    char *gguf = NULL;
    int err = 0;
    struct stat sb;
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode) && !has_safetensors(path))
        err = find_gguf(path, &gguf);
    else if (ends_with(path, ".gguf") && !(gguf = strdup(path)))
        err = ditd_err_set(DITD_ENOMEM, "out of memory");
    if (err)
        goto fail;
    if (gguf)
        err = ditd_gguf_open(gguf, &w->gg);
    else
        err = ditd_safetensors_open(path, &w->st);
    if (err)
        goto fail;
    if (!(w->path = strdup(gguf ? gguf : path))) {
        err = ditd_err_set(DITD_ENOMEM, "out of memory");
        goto fail;
    }
    free(gguf);
    const char *dq = getenv("DITD_WEIGHTS_DEQUANTIZE");
    w->dequantize = dq && strcmp(dq, "1") == 0;
    *out = w;
    return 0;
fail:
    free(gguf);
    ditd_weights_free(w);
    return err;
}

void ditd_weights_free(ditd_weights *w)
{
    if (!w)
        return;
    for (size_t i = 0; i < w->nal; i++) {
        free(w->al[i].name);
        for (int s = 0; s < w->al[i].nseg; s++)
            free((char *)w->al[i].seg[s].src);
    }
    free(w->al);
    ditd_safetensors_free(w->st);
    ditd_gguf_free(w->gg);
    free(w->path);
    free(w);
}

const char *ditd_weights_format(const ditd_weights *w)
{
    return w->gg ? "gguf" : "safetensors";
}

const char *ditd_weights_path(const ditd_weights *w)
{
    return w->path;
}

const ditd_gguf *ditd_weights_gguf(const ditd_weights *w)
{
    return w->gg;
}

const ditd_safetensors *ditd_weights_st(const ditd_weights *w)
{
    return w->st;
}

/* ---- the file's own tensors ------------------------------------------------- */

/* A raw tensor's rank and shape (PyTorch order); 0 when absent. */
static int raw_shape(const ditd_weights *w, const char *name, int *ndim, int64_t *shape)
{
    if (w->gg) {
        const ditd_gguf_tensor *t = ditd_gguf_find(w->gg, name);
        if (!t)
            return 0;
        *ndim = t->ndim;
        memcpy(shape, t->shape, sizeof t->shape);
        return 1;
    }
    const ditd_st_tensor *t = ditd_safetensors_find(w->st, name);
    if (!t || t->ndim > DITD_GGUF_MAX_DIMS)
        return 0;
    *ndim = t->ndim;
    memcpy(shape, t->shape, (size_t)t->ndim * sizeof *shape);
    return 1;
}

static int raw_read(const ditd_weights *w, const char *name, int ndim, const int64_t *shape,
                    float *dst)
{
    return w->gg ? ditd_gguf_read_f32(w->gg, name, ndim, shape, dst)
                 : ditd_safetensors_read_f32(w->st, name, ndim, shape, dst);
}

static int raw_slice(const ditd_weights *w, const char *name, int ndim, const int64_t *shape,
                     int axis, int64_t start, int64_t len, float *dst)
{
    return w->gg ? ditd_gguf_read_f32_slice(w->gg, name, ndim, shape, axis, start, len, dst)
                 : ditd_safetensors_read_f32_slice(w->st, name, ndim, shape, axis, start, len,
                                                   dst);
}

int ditd_weights_has_raw(const ditd_weights *w, const char *name)
{
    return w->gg ? ditd_gguf_find(w->gg, name) != NULL
                 : ditd_safetensors_find(w->st, name) != NULL;
}

static const alias *find_alias(const ditd_weights *w, const char *name)
{
    for (size_t i = 0; i < w->nal; i++)
        if (strcmp(w->al[i].name, name) == 0)
            return &w->al[i];
    return NULL;
}

int ditd_weights_has(const ditd_weights *w, const char *name)
{
    return ditd_weights_has_raw(w, name) || find_alias(w, name) != NULL;
}

/* ---- aliases ------------------------------------------------------------------ */

int ditd_weights_alias(ditd_weights *w, const char *name, int nseg, const ditd_weight_seg *segs)
{
    if (nseg < 1 || nseg > MAX_SEGS)
        return ditd_err_set(DITD_EINVAL, "alias '%s': %d segments (1..%d)", name, nseg, MAX_SEGS);
    if (w->nal == w->cap) {
        size_t cap = w->cap ? 2 * w->cap : 64;
        alias *a = realloc(w->al, cap * sizeof *a);
        if (!a)
            return ditd_err_set(DITD_ENOMEM, "out of memory");
        w->al = a;
        w->cap = cap;
    }
    alias a = {0};
    int64_t rows = 0;
    for (int s = 0; s < nseg; s++) {
        int nd = 0;
        int64_t sh[DITD_GGUF_MAX_DIMS];
        if (!raw_shape(w, segs[s].src, &nd, sh))
            return ditd_err_set(DITD_EFORMAT, "%s: tensor '%s' (for '%s') not found", w->path,
                                segs[s].src, name);
        ditd_weight_seg g = segs[s];
        if (g.rows < 0 && g.r0 == 0)
            g.rows = sh[0]; /* the whole tensor */
        if (g.r0 < 0 || g.rows <= 0 || g.r0 > sh[0] || g.rows > sh[0] - g.r0)
            return ditd_err_set(DITD_EFORMAT,
                                "%s: tensor '%s' has %lld rows; '%s' needs rows [%lld, %lld)",
                                w->path, g.src, (long long)sh[0], name, (long long)g.r0,
                                (long long)(g.r0 + g.rows));
        a.seg[s] = g;
        if (s == 0) {
            a.ndim = nd;
            memcpy(a.shape, sh, sizeof sh);
        } else {
            int same = nd == a.ndim;
            for (int d = 1; same && d < nd; d++)
                same = sh[d] == a.shape[d];
            if (!same)
                return ditd_err_set(DITD_EFORMAT,
                                    "%s: '%s': tensor '%s' does not have the shape of '%s'",
                                    w->path, name, segs[s].src, segs[0].src);
        }
        rows += g.rows;
    }
    a.shape[0] = rows;
    if (!(a.name = strdup(name)))
        return ditd_err_set(DITD_ENOMEM, "out of memory");
    for (int s = 0; s < nseg; s++) {
        if (!(a.seg[s].src = strdup(segs[s].src))) { /* a.seg[s] holds the caller's until here */
            for (int u = 0; u < s; u++)
                free((char *)a.seg[u].src);
            free(a.name);
            return ditd_err_set(DITD_ENOMEM, "out of memory");
        }
    }
    a.nseg = nseg;
    w->al[w->nal++] = a;
    return 0;
}

static int alias_check(const ditd_weights *w, const alias *a, int ndim, const int64_t *shape)
{
    int same = ndim == a->ndim;
    for (int d = 0; same && d < ndim; d++)
        same = shape[d] == a->shape[d];
    if (!same) {
        char have[160], want[160];
        return ditd_err_set(DITD_ESHAPE, "tensor '%s' (from %s) has shape %s in %s, expected %s",
                            a->name, a->seg[0].src,
                            ditd_shape_str(have, sizeof have, a->ndim, a->shape), w->path,
                            ditd_shape_str(want, sizeof want, ndim, shape));
    }
    return 0;
}

/* Rows [r0, r0 + n) of alias a into dst. */
static int alias_rows(const ditd_weights *w, const alias *a, int64_t r0, int64_t n, float *dst)
{
    size_t inner = 1;
    for (int d = 1; d < a->ndim; d++)
        inner *= (size_t)a->shape[d];
    int64_t base = 0;
    for (int s = 0; s < a->nseg && n > 0; s++) {
        const ditd_weight_seg *g = &a->seg[s];
        int64_t lo = r0 > base ? r0 : base, hi = r0 + n < base + g->rows ? r0 + n : base + g->rows;
        if (lo < hi) {
            int nd = 0;
            int64_t sh[DITD_GGUF_MAX_DIMS];
            raw_shape(w, g->src, &nd, sh);
            int err = raw_slice(w, g->src, nd, sh, 0, g->r0 + (lo - base), hi - lo,
                                dst + (size_t)(lo - r0) * inner);
            if (err)
                return err;
        }
        base += g->rows;
    }
    return 0;
}

int ditd_weights_read_f32(const ditd_weights *w, const char *name, int ndim, const int64_t *shape,
                          float *dst)
{
    const alias *a = ditd_weights_has_raw(w, name) ? NULL : find_alias(w, name);
    if (!a)
        return raw_read(w, name, ndim, shape, dst);
    int err = alias_check(w, a, ndim, shape);
    return err ? err : alias_rows(w, a, 0, a->shape[0], dst);
}

int ditd_weights_read_f32_slice(const ditd_weights *w, const char *name, int ndim,
                                const int64_t *full_shape, int axis, int64_t start, int64_t len,
                                float *dst)
{
    const alias *a = ditd_weights_has_raw(w, name) ? NULL : find_alias(w, name);
    if (!a)
        return raw_slice(w, name, ndim, full_shape, axis, start, len, dst);
    int err = alias_check(w, a, ndim, full_shape);
    if (err)
        return err;
    if (axis < 0 || axis >= ndim)
        return ditd_err_set(DITD_EINVAL, "tensor '%s': slice axis %d of a %d-D tensor", name,
                            axis, ndim);
    if (start < 0 || len < 0 || start > a->shape[axis] || len > a->shape[axis] - start)
        return ditd_err_set(DITD_ERANGE, "tensor '%s': slice [%lld, %lld) of axis %d (size %lld)",
                            name, (long long)start, (long long)(start + len), axis,
                            (long long)a->shape[axis]);
    if (axis == 0)
        return alias_rows(w, a, start, len, dst);
    size_t outer = 1, inner = 1, full = (size_t)a->shape[axis], numel = 1;
    for (int d = 0; d < ndim; d++)
        numel *= (size_t)a->shape[d];
    for (int d = 0; d < axis; d++)
        outer *= (size_t)a->shape[d];
    for (int d = axis + 1; d < ndim; d++)
        inner *= (size_t)a->shape[d];
    float *tmp = malloc((numel ? numel : 1) * sizeof *tmp);
    if (!tmp)
        return ditd_err_set(DITD_ENOMEM, "tensor '%s': %zu floats", name, numel);
    if (!(err = alias_rows(w, a, 0, a->shape[0], tmp)))
        for (size_t o = 0; o < outer; o++)
            memcpy(dst + o * (size_t)len * inner, tmp + (o * full + (size_t)start) * inner,
                   (size_t)len * inner * sizeof *tmp);
    free(tmp);
    return err;
}

int ditd_weights_check(const ditd_weights *w, const char *name, int ndim, const int64_t *shape)
{
    const alias *a = ditd_weights_has_raw(w, name) ? NULL : find_alias(w, name);
    int nd = 0, err;
    int64_t sh[DITD_GGUF_MAX_DIMS];
    if (a) {
        if ((err = alias_check(w, a, ndim, shape)))
            return err;
    } else {
        if (!raw_shape(w, name, &nd, sh))
            return ditd_err_set(DITD_ENOENT, "tensor '%s' not found in %s", name, w->path);
        int same = nd == ndim;
        for (int d = 0; same && d < ndim; d++)
            same = sh[d] == shape[d];
        if (!same) {
            char have[160], want[160];
            return ditd_err_set(DITD_ESHAPE, "tensor '%s' has shape %s in %s, expected %s", name,
                                ditd_shape_str(have, sizeof have, nd, sh), w->path,
                                ditd_shape_str(want, sizeof want, ndim, shape));
        }
    }
    if (!w->gg)
        return 0;
    for (int s = 0; s < (a ? a->nseg : 1); s++) {
        const char *src = a ? a->seg[s].src : name;
        const ditd_gguf_tensor *t = ditd_gguf_find(w->gg, src);
        if (t && !ditd_gguf_type_supported(t->type))
            return ditd_err_set(DITD_EUNSUPPORTED,
                                "tensor '%s'%s%s%s in %s has ggml type %s, which ditd does not "
                                "dequantize (it reads F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, "
                                "Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K)",
                                src, a ? " (for '" : "", a ? name : "", a ? "')" : "", w->path,
                                ditd_gguf_type_name(t->type));
    }
    return 0;
}

/* ---- quantized storage ------------------------------------------------------ */

static int is_block_type(int type)
{
    return type != DITD_Q_F32 && type != DITD_Q_F16 && type != DITD_Q_BF16 &&
           ditd_cpu_dequant_block(type, NULL, NULL);
}

/* The stored type of the file's 2-D tensor `src` when ditd computes with
 * it kept as it is (a GGML block type, or an FP8 type of a safetensors
 * file), with its row bytes and rows; -1 otherwise. */
static int stored_type(const ditd_weights *w, const char *src, int64_t K, size_t *row_bytes,
                       int64_t *rows)
{
    if (w->gg) {
        const ditd_gguf_tensor *t = ditd_gguf_find(w->gg, src);
        if (!t || t->ndim != 2 || t->shape[1] != K || !is_block_type((int)t->type))
            return -1;
        *row_bytes = t->row_bytes;
        *rows = t->shape[0];
        return (int)t->type;
    }
    const ditd_st_tensor *t = ditd_safetensors_find(w->st, src);
    if (!t || t->ndim != 2 || t->shape[1] != K ||
        (t->dtype != DITD_ST_F8_E4M3 && t->dtype != DITD_ST_F8_E5M2))
        return -1;
    *row_bytes = (size_t)K;
    *rows = t->shape[0];
    return t->dtype == DITD_ST_F8_E4M3 ? DITD_Q_F8_E4M3 : DITD_Q_F8_E5M2;
}

int ditd_weights_quant(const ditd_weights *w, const char *name, int64_t N, int64_t K, int *type,
                       size_t *row_bytes)
{
    if (w->dequantize)
        return 0;
    const alias *a = ditd_weights_has_raw(w, name) ? NULL : find_alias(w, name);
    const ditd_weight_seg self = {name, 0, N};
    const ditd_weight_seg *segs = a ? a->seg : &self;
    int nseg = a ? a->nseg : 1, t0 = -1;
    size_t rb = 0;
    int64_t rows = 0;
    for (int s = 0; s < nseg; s++) {
        int64_t n;
        int t = stored_type(w, segs[s].src, K, &rb, &n);
        if (t < 0 || (s > 0 && t != t0))
            return 0;
        t0 = t;
        rows += a ? segs[s].rows : n;
    }
    if (rows != N)
        return 0;
    *type = t0;
    *row_bytes = rb;
    return 1;
}

/* The segments of `name` (an alias's, or the tensor itself), with rows. */
static int stored_segs(const ditd_weights *w, const char *name, ditd_weight_seg *self,
                       const ditd_weight_seg **segs, int *nseg, size_t *rb, int64_t *total)
{
    const alias *a = ditd_weights_has_raw(w, name) ? NULL : find_alias(w, name);
    const char *first = a ? a->seg[0].src : name;
    int nd = 0;
    int64_t n, sh[DITD_GGUF_MAX_DIMS];
    if (!raw_shape(w, first, &nd, sh) || nd != 2 || stored_type(w, first, sh[1], rb, &n) < 0)
        return ditd_err_set(DITD_EINVAL, "tensor '%s' is not stored in GGML blocks or FP8", name);
    *self = (ditd_weight_seg){name, 0, n};
    *segs = a ? a->seg : self;
    *nseg = a ? a->nseg : 1;
    *total = 0;
    for (int s = 0; s < *nseg; s++)
        *total += (*segs)[s].rows;
    return 0;
}

int ditd_weights_rows(const ditd_weights *w, const char *name, int64_t r0, int64_t rows,
                      void *dst)
{
    ditd_weight_seg self;
    const ditd_weight_seg *segs;
    int nseg;
    size_t rb;
    int64_t total, base = 0;
    int err = stored_segs(w, name, &self, &segs, &nseg, &rb, &total);
    if (err)
        return err;
    if (r0 < 0 || rows < 0 || r0 > total || rows > total - r0)
        return ditd_err_set(DITD_ERANGE, "tensor '%s': rows [%lld, %lld) of %lld", name,
                            (long long)r0, (long long)(r0 + rows), (long long)total);
    for (int s = 0; s < nseg; s++) {
        const uint8_t *data;
        if (w->gg)
            data = ditd_gguf_find(w->gg, segs[s].src)->data;
        else
            data = ditd_safetensors_find(w->st, segs[s].src)->data;
        int64_t lo = r0 > base ? r0 : base;
        int64_t hi = r0 + rows < base + segs[s].rows ? r0 + rows : base + segs[s].rows;
        if (lo < hi)
            memcpy((uint8_t *)dst + (size_t)(lo - r0) * rb,
                   data + (size_t)(segs[s].r0 + lo - base) * rb, (size_t)(hi - lo) * rb);
        base += segs[s].rows;
    }
    return 0;
}

int ditd_weights_row_scales(const ditd_weights *w, const char *name, int64_t r0, int64_t rows,
                            float *dst)
{
    ditd_weight_seg self;
    const ditd_weight_seg *segs;
    int nseg;
    size_t rb;
    int64_t total, base = 0;
    int err = stored_segs(w, name, &self, &segs, &nseg, &rb, &total);
    if (err)
        return err;
    if (r0 < 0 || rows < 0 || r0 > total || rows > total - r0)
        return ditd_err_set(DITD_ERANGE, "tensor '%s': rows [%lld, %lld) of %lld", name,
                            (long long)r0, (long long)(r0 + rows), (long long)total);
    for (int64_t r = 0; r < rows; r++)
        dst[r] = 1.0f;
    if (w->gg)
        return 0;
    for (int s = 0; !err && s < nseg; s++) {
        int64_t lo = r0 > base ? r0 : base;
        int64_t hi = r0 + rows < base + segs[s].rows ? r0 + rows : base + segs[s].rows;
        if (lo < hi)
            err = ditd_safetensors_row_scales(w->st, segs[s].src, segs[s].r0 + lo - base,
                                              hi - lo, dst + (lo - r0));
        base += segs[s].rows;
    }
    return err;
}

int ditd_weights_type_block(int type, int *elems, int *bytes)
{
    return ditd_cpu_dequant_block(type, elems, bytes);
}

int ditd_weights_fp8_type(int type)
{
    return ditd_cpu_dequant_is_fp8(type);
}

const char *ditd_weights_type_name(int type)
{
    const char *n = ditd_cpu_dequant_name(type);
    return n ? n : "unknown";
}

void ditd_weights_summary(const ditd_weights *w, char *buf, size_t len)
{
    enum { MAXT = 64 };
    const char *names[MAXT];
    size_t counts[MAXT], nt = 0, ntensors = 0;
    double bytes = 0;
    size_t n = w->gg ? ditd_gguf_count(w->gg) : ditd_safetensors_count(w->st);
    for (size_t i = 0; i < n; i++) {
        const char *tn;
        if (w->gg) {
            const ditd_gguf_tensor *t = ditd_gguf_at(w->gg, i);
            tn = ditd_gguf_type_name(t->type);
            bytes += (double)t->nbytes;
        } else {
            const ditd_st_tensor *t = ditd_safetensors_at(w->st, i);
            tn = ditd_st_dtype_name(t->dtype);
            bytes += (double)t->nbytes;
        }
        size_t k = 0;
        while (k < nt && strcmp(names[k], tn) != 0)
            k++;
        if (k == nt && nt < MAXT) {
            names[nt] = tn;
            counts[nt++] = 0;
        }
        if (k < nt)
            counts[k]++;
        ntensors++;
    }
    size_t o = (size_t)snprintf(buf, len, "%s, %.1f %s in %zu tensors", ditd_weights_format(w),
                                bytes >= 1e9 ? bytes / 1e9 : bytes / 1e6, bytes >= 1e9 ? "GB" : "MB",
                                ntensors);
    for (size_t shown = 0; shown < nt && o < len; shown++) {
        size_t best = 0; /* the most common type not yet shown */
        for (size_t k = 1; k < nt; k++)
            if (counts[k] > counts[best])
                best = k;
        o += (size_t)snprintf(buf + o, len - o, "%s %s %zu", shown ? "," : ":", names[best],
                              counts[best]);
        counts[best] = 0;
        if (o >= len)
            break;
    }
}
