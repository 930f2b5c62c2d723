/* Weights of a text encoder: the checkpoint's matrices kept in their stored
 * type (f32, f16, bf16) and used in place from the safetensors mapping, the
 * small tensors (norms, biases, position tables) converted to the backend's
 * activation type in one arena.
 *
 * Loading runs twice over the same list of tensors (llm.c's
 * malloc_and_point): the first pass (plan) checks every name, shape and
 * dtype and counts the arena; the second (commit) carves and reads. A
 * matrix is borrowed from the mapping when the backend computes on host
 * memory (ops->mem_alloc == NULL) and its dtype is one linear_wt takes;
 * otherwise (f64, a misaligned tensor, a device backend) it is converted
 * into the arena, as f32 host weights uploaded with ops->upload.
 *
 * What it is not: a model. It knows no parameter names.
 */
#ifndef DITD_ENGINE_TEXT_WEIGHTS_H
#define DITD_ENGINE_TEXT_WEIGHTS_H

#include <stddef.h>
#include <stdint.h>

#include "engine/backend/backend.h"
#include "engine/core/tensor.h"
#include "engine/io/safetensors.h"

/* A (rows, cols) matrix in its stored type; p borrowed from the mapping or
 * the arena. */
typedef struct ditd_text_mat {
    const void *p;
    ditd_dtype dt;
} ditd_text_mat;

typedef struct ditd_text_weights {
    const ditd_backend_ops *ops;
    ditd_safetensors *st;     /* owned; kept open while matrices are borrowed */
    ditd_arena arena;         /* small tensors and converted matrices */
    int committed;            /* 0: plan pass, 1: carve pass */
    size_t borrowed_bytes;    /* matrix bytes used in place from the mapping */
    float *stage;             /* host f32 staging */
    size_t stage_len;
} ditd_text_weights;

/* Opens the weights of a component folder (or file). 0 or the
 * safetensors error. */
int ditd_text_weights_open(ditd_text_weights *w, const char *path, const ditd_backend_ops *ops);
/* Ends the plan pass: commits the arena (0 or DITD_ENOMEM). */
int ditd_text_weights_commit(ditd_text_weights *w);
void ditd_text_weights_free(ditd_text_weights *w);

/* A 2-D matrix `name` of shape (rows, cols). Plan pass: checks, counts;
 * commit pass: points or converts. */
int ditd_text_weights_mat(ditd_text_weights *w, ditd_text_mat *out, const char *name,
                          int64_t rows, int64_t cols);
/* The same for a tensor of ndim (<= 8) dims read as the matrix (shape[0],
 * the product of the rest): a conv kernel (O, C, k, k) as (O, C k k). */
int ditd_text_weights_mat_nd(ditd_text_weights *w, ditd_text_mat *out, const char *name,
                             int ndim, const int64_t *shape);
/* A small tensor of shape (d0) (d1 == 0) or (d0, d1) as act dtype into
 * *dst (carved here). */
int ditd_text_weights_small(ditd_text_weights *w, void **dst, const char *name, int64_t d0,
                            int64_t d1);
/* A small tensor read to host f32 (h_dst, caller-owned, commit pass only;
 * the plan pass only checks it). */
int ditd_text_weights_host(ditd_text_weights *w, float *h_dst, const char *name, int64_t d0,
                           int64_t d1);
/* Activation memory from the same arena: n act elements (or bytes when
 * bytes != 0). */
int ditd_text_weights_carve(ditd_text_weights *w, void **dst, size_t n, int bytes);

/* Whether the checkpoint has `name`. */
int ditd_text_weights_has(const ditd_text_weights *w, const char *name);

#endif
