/* A family's weight list: every tensor a transformer loads, written once
 * and walked for planning, loading and packing (as engine/text/
 * text_weights.h walks the text encoders' list twice, and llm.c's
 * malloc_and_point).
 *
 * An entry is one Linear ("<name>.weight" (rows, cols) and "<name>.bias"
 * (rows)), possibly the row concatenation of up to three parts of the file
 * (q|k|v fused), or one vector "<name>" (rows) (a norm's weight). Its TP
 * split says what this rank keeps of each part: DITD_WL_ROWS (a
 * column-parallel layer: rows [r0, r0 + rn) of the weight and the bias),
 * DITD_WL_COLS (a row-parallel layer: up to two column ranges of the
 * weight side by side, the whole bias), or all of it. The walks:
 *   ditd_wl_plan  carves each entry's memory from the weight arena (run
 *                 once to count and once to hand out, as the arena wants);
 *                 a Linear kept in GGML blocks (when `src` says so and the
 *                 backend has linear_q on the CPU) gets its block rows;
 *   ditd_wl_load  reads every entry (unless DITD_WL_OWN_LOAD: the family
 *                 loads it itself), each tensor's name and shape checked
 *                 by the reader, which names the tensor it refuses;
 *   ditd_wl_pack  re-lays every DITD_WL_PACK Linear for the backend
 *                 (backend.h pack_linear) and counts the quantized ones.
 *
 * What it is not: it knows no family; the family builds its list from its
 * config and its tp plan (ditd_wl_add*), walks it, and keeps its own
 * parameter struct (the entries point into it).
 */
#ifndef DITD_ENGINE_MODELS_WEIGHT_LIST_H
#define DITD_ENGINE_MODELS_WEIGHT_LIST_H

#include <stddef.h>
#include <stdint.h>

#include "engine/backend/backend.h"
#include "engine/core/tensor.h"

struct ditd_weights;

typedef enum ditd_wl_split {
    DITD_WL_WHOLE = 0, /* every rank all of it */
    DITD_WL_ROWS,      /* column-parallel: rows [r0, r0 + rn) of each part and its bias */
    DITD_WL_COLS,      /* row-parallel: weight columns c0[i] + [0, cn[i]), i < ncols; whole bias */
} ditd_wl_split;

enum {
    DITD_WL_PACK = 1,     /* passed to linear: packed for the backend */
    DITD_WL_DENSE = 2,    /* never kept in GGML blocks (a conv weight, a re-laid one) */
    DITD_WL_OWN_LOAD = 4, /* carved and packed by the walk, loaded by the family */
    DITD_WL_VEC = 8,      /* one vector "<name>" (rows), no bias; DITD_WL_ROWS keeps a
                           * slice of it (a tp rank's heads of a norm) */
    DITD_WL_ACT = 16,     /* a vector kept in the activation type (ops->upload), not the
                           * weight type: what the forward reads as an activation */
};

/* An edit of a vector's values as read, before the upload (a norm weight w
 * stored as w - 1 for the modulate op, say). */
typedef void (*ditd_wl_fix)(float *v, size_t n);

typedef struct ditd_wl_entry {
    char name[3][160];    /* the parts' names (without ".weight"/".bias") */
    int nparts;           /* 1..3 */
    int flags;
    int64_t rows, cols;   /* one part's shape in the file (cols 0 for a vector) */
    ditd_wl_split split;
    int64_t r0, rn;       /* DITD_WL_ROWS */
    int ncols;            /* DITD_WL_COLS: 1 or 2 ranges */
    int64_t c0[2], cn[2];
    void **w, **b;        /* where the carved weight and bias go (b NULL: no bias) */
    ditd_qweight *q;      /* NULL: never quantized */
    int nd;               /* a vector's shape in the file when it is not (rows): nd dims of
                           * shape (their product rows; ditd_wl_vec_shape); 0: (rows) */
    int64_t shape[4];
    ditd_wl_fix fix;      /* a vector's edit (ditd_wl_vec_fix), or NULL */
} ditd_wl_entry;

typedef struct ditd_wl {
    ditd_wl_entry *e;
    int n, cap;
    int err;              /* a failed add (ENOMEM, a name too long): the walks refuse */
    int tp;               /* the tp degree the splits are of (the family's; 0 or 1:
                           * none): named when a split would cut GGML blocks */
} ditd_wl;

/* This rank's shape of an entry: (N, K) of what is carved. */
int64_t ditd_wl_rows(const ditd_wl_entry *e);
int64_t ditd_wl_cols(const ditd_wl_entry *e);

/* Adds a Linear of nparts parts (names printf'd from fmt with `layer`;
 * nparts > 1: fmt holds "%d" then "%s", the part suffixes in parts[]), or
 * returns the entry so the caller can set its split. NULL (and l->err) on
 * failure; later walks refuse. */
ditd_wl_entry *ditd_wl_add(ditd_wl *l, int flags, int64_t rows, int64_t cols, void **w, void **b,
                           ditd_qweight *q, const char *fmt, ...)
    __attribute__((format(printf, 8, 9)));
/* A fused Linear: parts names = prefix + "." + suffix[i]. */
ditd_wl_entry *ditd_wl_add_fused(ditd_wl *l, int flags, int64_t rows, int64_t cols, void **w,
                                 void **b, ditd_qweight *q, const char *prefix, int nparts,
                                 const char *const *suffix);
/* Splits: rows [r0, r0 + rn) / one or two column ranges. e may be NULL (a
 * failed add; nothing done). */
void ditd_wl_rows_of(ditd_wl_entry *e, int64_t r0, int64_t rn);
/* A vector's file shape (nd <= 4 dims whose product is its rows: a (1, 6, D)
 * table read as 6D values; whole reads only) and its edit. e may be NULL. */
void ditd_wl_vec_shape(ditd_wl_entry *e, int nd, const int64_t *shape);
void ditd_wl_vec_fix(ditd_wl_entry *e, ditd_wl_fix fix);
void ditd_wl_cols_of(ditd_wl_entry *e, int ncols, const int64_t *c0, const int64_t *cn);
void ditd_wl_free(ditd_wl *l);

/* Carves every entry from `a` (weight_dtype, or the blocks of a Linear that
 * stays quantized: src non-NULL, ops->linear_q on the CPU, every part in
 * one GGML type, each column range made of whole blocks). 0 or ENOMEM. */
int ditd_wl_plan(const ditd_wl *l, ditd_arena *a, const ditd_backend_ops *ops,
                 const struct ditd_weights *src);
/* Reads every entry but the DITD_WL_OWN_LOAD ones from st. 0 or the
 * reader's error (naming the tensor). */
int ditd_wl_load(const ditd_wl *l, const struct ditd_weights *st, const ditd_backend_ops *ops);
/* Packs the DITD_WL_PACK entries; *quantized += those kept in blocks. */
int ditd_wl_pack(const ditd_wl *l, const ditd_backend_ops *ops, int *quantized);

#endif
