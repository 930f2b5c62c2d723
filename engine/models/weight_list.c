/* A family's weight list walked for planning, loading and packing
 * (weight_list.h). */
#include "engine/models/weight_list.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/error.h"
#include "engine/io/weights.h"

int64_t ditd_wl_rows(const ditd_wl_entry *e)
{
    return (e->split == DITD_WL_ROWS ? e->rn : e->rows) * e->nparts;
}

int64_t ditd_wl_cols(const ditd_wl_entry *e)
{
    if (e->split != DITD_WL_COLS)
        return e->cols;
    int64_t k = 0;
    for (int i = 0; i < e->ncols; i++)
        k += e->cn[i];
    return k;
}

static ditd_wl_entry *grow(ditd_wl *l)
{
    if (l->err)
        return NULL;
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 64;
        ditd_wl_entry *e = realloc(l->e, (size_t)cap * sizeof *e);
        if (!e) {
            l->err = ditd_err_set(DITD_ENOMEM, "weight list of %d entries", cap);
            return NULL;
        }
        l->e = e;
        l->cap = cap;
    }
    ditd_wl_entry *e = &l->e[l->n++];
    memset(e, 0, sizeof *e);
    return e;
}

static ditd_wl_entry *fill(ditd_wl_entry *e, int flags, int64_t rows, int64_t cols, void **w,
                           void **b, ditd_qweight *q)
{
    e->flags = flags;
    e->rows = rows;
    e->cols = flags & DITD_WL_VEC ? 0 : cols;
    e->w = w;
    e->b = flags & DITD_WL_VEC ? NULL : b;
    e->q = flags & (DITD_WL_VEC | DITD_WL_DENSE) ? NULL : q;
    if (e->q)
        memset(e->q, 0, sizeof *e->q);
    return e;
}

ditd_wl_entry *ditd_wl_add(ditd_wl *l, int flags, int64_t rows, int64_t cols, void **w, void **b,
                           ditd_qweight *q, const char *fmt, ...)
{
    ditd_wl_entry *e = grow(l);
    if (!e)
        return NULL;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(e->name[0], sizeof e->name[0], fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof e->name[0]) {
        l->err = ditd_err_set(DITD_EINVAL, "weight name too long: %s", e->name[0]);
        return NULL;
    }
    e->nparts = 1;
    return fill(e, flags, rows, cols, w, b, q);
}

ditd_wl_entry *ditd_wl_add_fused(ditd_wl *l, int flags, int64_t rows, int64_t cols, void **w,
                                 void **b, ditd_qweight *q, const char *prefix, int nparts,
                                 const char *const *suffix)
{
    if (nparts < 1 || nparts > 3) {
        if (!l->err)
            l->err = ditd_err_set(DITD_EINVAL, "%s: %d fused parts (1..3)", prefix, nparts);
        return NULL;
    }
    ditd_wl_entry *e = grow(l);
    if (!e)
        return NULL;
    for (int i = 0; i < nparts; i++) {
        int n = snprintf(e->name[i], sizeof e->name[i], "%s.%s", prefix, suffix[i]);
        if (n < 0 || (size_t)n >= sizeof e->name[i]) {
            l->err = ditd_err_set(DITD_EINVAL, "weight name too long: %s", e->name[i]);
            return NULL;
        }
    }
    e->nparts = nparts;
    return fill(e, flags, rows, cols, w, b, q);
}

void ditd_wl_rows_of(ditd_wl_entry *e, int64_t r0, int64_t rn)
{
    if (!e)
        return;
    e->split = DITD_WL_ROWS;
    e->r0 = r0;
    e->rn = rn;
}

void ditd_wl_vec_shape(ditd_wl_entry *e, int nd, const int64_t *shape)
{
    if (!e || nd < 1 || nd > 4)
        return;
    e->nd = nd;
    memcpy(e->shape, shape, (size_t)nd * sizeof *shape);
}

void ditd_wl_vec_fix(ditd_wl_entry *e, ditd_wl_fix fix)
{
    if (e)
        e->fix = fix;
}

void ditd_wl_cols_of(ditd_wl_entry *e, int ncols, const int64_t *c0, const int64_t *cn)
{
    if (!e)
        return;
    e->split = DITD_WL_COLS;
    e->ncols = ncols < 1 ? 1 : ncols > 2 ? 2 : ncols;
    for (int i = 0; i < e->ncols; i++) {
        e->c0[i] = c0[i];
        e->cn[i] = cn[i];
    }
}

void ditd_wl_free(ditd_wl *l)
{
    free(l->e);
    memset(l, 0, sizeof *l);
}

/* ---- planning ---- */

/* Whether e stays in its GGML blocks (1, and then e->q but data set), or
 * loads as floats (0). A tp rank's columns that would cut a block are
 * refused (DITD_EUNSUPPORTED naming the tensor, its type, the block width,
 * the split and the tp degree): a quantized checkpoint is there to save
 * memory, and dequantizing that layer on every rank behind the user's back
 * would cost 4-8x of it; DITD_WEIGHTS_DEQUANTIZE=1 (nothing stays in
 * blocks) or a tp degree whose cuts fall on block edges loads it. */
static int quant_plan(const ditd_wl *l, const ditd_wl_entry *e, const ditd_backend_ops *ops,
                      const struct ditd_weights *src)
{
    if (!e->q || !src || !ops->linear_q)
        return 0;
    int type = -1;
    size_t rb = 0;
    for (int i = 0; i < e->nparts; i++) {
        char name[192];
        int t;
        size_t r;
        snprintf(name, sizeof name, "%s.weight", e->name[i]);
        if (!ditd_weights_quant(src, name, e->rows, e->cols, &t, &r) || (type >= 0 && t != type))
            return 0;
        type = t;
        rb = r;
    }
    if (e->split == DITD_WL_COLS) {
        int elems = 0, bytes = 0;
        ditd_weights_type_block(type, &elems, &bytes);
        rb = 0;
        for (int i = 0; i < e->ncols; i++) {
            if (e->c0[i] % elems || e->cn[i] % elems) {
                const int64_t bad = e->c0[i] % elems ? e->c0[i] : e->cn[i];
                return ditd_err_set(
                    DITD_EUNSUPPORTED,
                    "%s.weight (%lld x %lld) is %s, blocks of %d values: tensor parallel %d "
                    "gives this rank its columns [%lld, %lld), and %lld is not a multiple of "
                    "%d (a split must not cut a block); choose a tp degree that splits on "
                    "block edges, or set DITD_WEIGHTS_DEQUANTIZE=1 to load every weight as "
                    "floats",
                    e->name[0], (long long)e->rows, (long long)e->cols,
                    ditd_weights_type_name(type), elems, l->tp > 1 ? l->tp : 1,
                    (long long)e->c0[i], (long long)(e->c0[i] + e->cn[i]), (long long)bad,
                    elems);
            }
            rb += (size_t)(e->cn[i] / elems) * (size_t)bytes;
        }
    }
    if (ops->linear_q_takes && !ops->linear_q_takes(type, (int)ditd_wl_rows(e), (int)ditd_wl_cols(e)))
        return 0; /* this backend computes with it as floats (loaded so) */
    *e->q = (ditd_qweight){.type = type,
                           .N = (int)ditd_wl_rows(e),
                           .K = (int)ditd_wl_cols(e),
                           .row_bytes = rb};
    return 1;
}

int ditd_wl_plan(const ditd_wl *l, ditd_arena *a, const ditd_backend_ops *ops,
                 const struct ditd_weights *src)
{
    if (l->err)
        return l->err;
    size_t ws = ditd_dtype_size(ops->weight_dtype);
    int err = 0, e1;
    for (int i = 0; i < l->n; i++) {
        const ditd_wl_entry *e = &l->e[i];
        size_t N = (size_t)ditd_wl_rows(e), K = (size_t)ditd_wl_cols(e);
        if (e->flags & DITD_WL_VEC) {
            size_t es = e->flags & DITD_WL_ACT ? ditd_dtype_size(ops->act_dtype) : ws;
            *e->w = ditd_arena_bytes(a, N * es, &e1);
            err |= e1;
            continue;
        }
        int qp = quant_plan(l, e, ops, src);
        if (qp < 0)
            return qp;
        if (qp) {
            *e->w = ditd_arena_bytes(a, N * e->q->row_bytes, &e1);
            e->q->data = *e->w;
            /* FP8 rows carry a scale each (1 where the file has none) */
            if (ditd_weights_fp8_type(e->q->type)) {
                e->q->scale = ditd_arena_bytes(a, N * sizeof(float), &e1);
                err |= e1;
            }
        } else {
            if (e->q)
                memset(e->q, 0, sizeof *e->q);
            *e->w = ditd_arena_bytes(a, N * K * ws, &e1);
        }
        err |= e1;
        if (e->b) {
            *e->b = ditd_arena_bytes(a, N * ws, &e1);
            err |= e1;
        }
    }
    return err ? DITD_ENOMEM : 0;
}

/* ---- loading ---- */

typedef struct stager {
    float *p;
    size_t cap;
} stager;

static float *room(stager *s, size_t n, const char *name, int *err)
{
    if (n > s->cap) {
        float *p = realloc(s->p, n * sizeof(float));
        if (!p) {
            *err = ditd_err_set(DITD_ENOMEM, "staging %zu floats for %s", n, name);
            return NULL;
        }
        s->p = p;
        s->cap = n;
    }
    return s->p;
}

/* Of the file's (d0[, d1]) tensor `name`, [start, start + len) along axis
 * into buf (whole when it is all of it). */
static int read_part(const struct ditd_weights *st, const char *name, int64_t d0, int64_t d1,
                     int axis, int64_t start, int64_t len, float *buf)
{
    int64_t shape[2] = {d0, d1};
    int nd = d1 > 0 ? 2 : 1;
    if (start == 0 && len == shape[axis])
        return ditd_weights_read_f32(st, name, nd, shape, buf);
    return ditd_weights_read_f32_slice(st, name, nd, shape, axis, start, len, buf);
}

/* A weight kept in its blocks under a column split: every row's block
 * columns of each range side by side into dst. */
static int qcols(const struct ditd_weights *st, const char *name, const ditd_wl_entry *e,
                 void *dst)
{
    int type, elems = 0, bytes = 0;
    size_t rb;
    if (!ditd_weights_quant(st, name, e->rows, e->cols, &type, &rb))
        return ditd_err_set(DITD_EINTERNAL, "%s: no longer in GGML blocks", name);
    ditd_weights_type_block(type, &elems, &bytes);
    uint8_t *tmp = malloc((size_t)e->rows * rb);
    if (!tmp)
        return ditd_err_set(DITD_ENOMEM, "staging %s", name);
    int err = ditd_weights_rows(st, name, 0, e->rows, tmp);
    uint8_t *o = dst;
    for (int64_t r = 0; !err && r < e->rows; r++)
        for (int i = 0; i < e->ncols; i++) {
            size_t n = (size_t)(e->cn[i] / elems) * (size_t)bytes;
            memcpy(o, tmp + (size_t)r * rb + (size_t)(e->c0[i] / elems) * (size_t)bytes, n);
            o += n;
        }
    free(tmp);
    return err;
}

static int load_entry(const ditd_wl_entry *e, const struct ditd_weights *st,
                      const ditd_backend_ops *ops, stager *s, stager *s2)
{
    char name[192];
    int err = 0;
    if (e->flags & DITD_WL_VEC) {
        int64_t r0 = e->split == DITD_WL_ROWS ? e->r0 : 0, rn = ditd_wl_rows(e);
        float *buf = room(s, (size_t)e->rows, e->name[0], &err);
        if (!buf)
            return err;
        if (e->nd > 0)
            err = ditd_weights_read_f32(st, e->name[0], e->nd, e->shape, buf);
        else
            err = read_part(st, e->name[0], e->rows, 0, 0, r0, rn, buf);
        if (err)
            return err;
        if (e->fix)
            e->fix(buf, (size_t)rn);
        if (e->flags & DITD_WL_ACT)
            ops->upload(*e->w, buf, (size_t)rn);
        else
            ops->upload_weight(*e->w, buf, (size_t)rn);
        return 0;
    }
    int64_t pn = ditd_wl_rows(e) / e->nparts, K = ditd_wl_cols(e);
    for (int j = 0; j < e->nparts; j++) {
        const char *pre = e->name[j];
        int quant = e->q && e->q->data;
        void *w = quant ? (void *)((uint8_t *)*e->w + (size_t)(j * pn) * e->q->row_bytes)
                        : ditd_ptr_w(ops, *e->w, (size_t)(j * pn * K));
        void *b = e->b ? ditd_ptr_w(ops, *e->b, (size_t)(j * pn)) : NULL;
        snprintf(name, sizeof name, "%s.weight", pre);
        if (quant) {
            /* into the arena directly, or staged on the host for a device's */
            const size_t nb = (size_t)pn * e->q->row_bytes;
            void *to = w;
            if (ops->upload_bytes && !(to = room(s, (nb + 3) / 4, name, &err)))
                return err;
            err = e->split == DITD_WL_COLS ? qcols(st, name, e, to)
                  : e->split == DITD_WL_ROWS ? ditd_weights_rows(st, name, e->r0, e->rn, to)
                                             : ditd_weights_rows(st, name, 0, e->rows, to);
            if (!err && ops->upload_bytes)
                ops->upload_bytes(w, to, nb);
            /* the part's rows' scales: a row split's own rows, else all */
            if (!err && e->q->scale) {
                float *sc = (float *)e->q->scale + j * pn;
                if (ops->upload_bytes && !(sc = room(s2, (size_t)pn, name, &err)))
                    return err;
                err = ditd_weights_row_scales(st, name, e->split == DITD_WL_ROWS ? e->r0 : 0, pn,
                                              sc);
                if (!err && ops->upload_bytes)
                    ops->upload_bytes((float *)e->q->scale + j * pn, sc, (size_t)pn * sizeof *sc);
            }
        } else if (e->split == DITD_WL_COLS) {
            float *all = room(s, (size_t)(pn * K), name, &err);
            int64_t at = 0;
            for (int i = 0; all && !err && i < e->ncols; i++) {
                float *part = room(s2, (size_t)(e->rows * e->cn[i]), name, &err);
                if (!part || (err = read_part(st, name, e->rows, e->cols, 1, e->c0[i], e->cn[i],
                                              part)))
                    break;
                for (int64_t r = 0; r < e->rows; r++)
                    memcpy(all + r * K + at, part + r * e->cn[i], (size_t)e->cn[i] * sizeof(float));
                at += e->cn[i];
            }
            if (all && !err)
                ops->upload_weight(w, all, (size_t)(pn * K));
        } else {
            int64_t r0 = e->split == DITD_WL_ROWS ? e->r0 : 0;
            float *buf = room(s, (size_t)(pn * K), name, &err);
            if (buf && !(err = read_part(st, name, e->rows, e->cols, 0, r0, pn, buf)))
                ops->upload_weight(w, buf, (size_t)(pn * K));
        }
        if (err)
            return err;
        if (!b)
            continue;
        snprintf(name, sizeof name, "%s.bias", pre);
        int64_t r0 = e->split == DITD_WL_ROWS ? e->r0 : 0;
        float *buf = room(s, (size_t)pn, name, &err);
        if (!buf || (err = read_part(st, name, e->rows, 0, 0, r0, pn, buf)))
            return err;
        ops->upload_weight(b, buf, (size_t)pn);
    }
    return 0;
}

int ditd_wl_load(const ditd_wl *l, const struct ditd_weights *st, const ditd_backend_ops *ops)
{
    if (l->err)
        return l->err;
    stager s = {0}, s2 = {0};
    int err = 0;
    for (int i = 0; !err && i < l->n; i++)
        if (!(l->e[i].flags & DITD_WL_OWN_LOAD))
            err = load_entry(&l->e[i], st, ops, &s, &s2);
    free(s.p);
    free(s2.p);
    return err;
}

int ditd_wl_pack(const ditd_wl *l, const ditd_backend_ops *ops, int *quantized)
{
    if (l->err)
        return l->err;
    for (int i = 0; i < l->n; i++) {
        const ditd_wl_entry *e = &l->e[i];
        if (!(e->flags & DITD_WL_PACK))
            continue;
        if (e->q && e->q->data) {
            if (quantized)
                (*quantized)++;
            continue;
        }
        int err = ditd_pack_linear(ops, *e->w, (int)ditd_wl_rows(e), (int)ditd_wl_cols(e));
        if (err)
            return err;
    }
    return 0;
}
