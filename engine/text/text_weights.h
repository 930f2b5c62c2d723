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
 * A GGUF checkpoint (engine/io/weights.h; the encoder registers its names
 * as aliases) reads the same way, its tensors dequantized to f32 into the
 * arena, except the matrices asked for with ditd_text_weights_qmat on a
 * backend with linear_q on host memory: those keep their GGML blocks (copied
 * into the arena, the file's size) and run through ditd_text_linear.
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
#include "engine/io/weights.h"

/* A (rows, cols) matrix in its stored type; p borrowed from the mapping or
 * the arena. */
typedef struct ditd_text_mat {
    const void *p;
    ditd_dtype dt;
    ditd_qweight q;           /* q.data non-NULL: GGML blocks (p is q.data), linear_q */
} ditd_text_mat;

typedef struct ditd_text_weights {
    const ditd_backend_ops *ops;
    ditd_weights *src;        /* owned; kept open while matrices are borrowed */
    const ditd_safetensors *st; /* src's safetensors reader (NULL for GGUF), borrowed */
    ditd_arena arena;         /* small tensors and converted matrices */
    int committed;            /* 0: plan pass, 1: carve pass */
    size_t borrowed_bytes;    /* matrix bytes used in place from the mapping */
    size_t quant_bytes;       /* matrix bytes kept in GGML blocks (qmat) */
    int n_quant;
    float *stage;             /* host f32 staging */
    size_t stage_len;
} ditd_text_weights;

/* Opens the weights of a component folder (or file: .safetensors, .gguf;
 * a folder holding one .gguf and no safetensors checkpoint reads that).
 * 0 or the reader's error. */
int ditd_text_weights_open(ditd_text_weights *w, const char *path, const ditd_backend_ops *ops);
/* Whether the weights are a GGUF file (the encoder then registers its
 * aliases on w->src before the first pass). */
int ditd_text_weights_is_gguf(const ditd_text_weights *w);
/* Ends the plan pass: commits the arena (0 or DITD_ENOMEM). */
int ditd_text_weights_commit(ditd_text_weights *w);
void ditd_text_weights_free(ditd_text_weights *w);

/* A 2-D matrix `name` of shape (rows, cols). Plan pass: checks, counts;
 * commit pass: points or converts. */
int ditd_text_weights_mat(ditd_text_weights *w, ditd_text_mat *out, const char *name,
                          int64_t rows, int64_t cols);
/* ditd_text_weights_mat for a matrix that may keep its GGML blocks (a
 * GGUF checkpoint's quantized tensor, a backend with linear_q on host
 * memory): out->q set, read only through ditd_text_linear. Otherwise as
 * ditd_text_weights_mat. */
int ditd_text_weights_qmat(ditd_text_weights *w, ditd_text_mat *out, const char *name,
                           int64_t rows, int64_t cols);
/* Matrices kept in blocks / their bytes (after the commit pass). */
int ditd_text_weights_quantized(const ditd_text_weights *w, size_t *bytes);

/* y (M, N) = act(x (M, K) @ w^T + b): ops->linear_wt on a stored matrix,
 * ops->linear_q on one kept in blocks (act NONE or GELU_NEW then; the
 * loader keeps no other in blocks). scratch as linear_wt's. */
void ditd_text_linear(const ditd_backend_ops *ops, const void *x, size_t ldx,
                      const ditd_text_mat *w, const void *b, void *y, size_t ldy, int M, int N,
                      int K, ditd_text_act act, void *scratch, size_t scratch_elems);

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
