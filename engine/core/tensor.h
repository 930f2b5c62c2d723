/* Tensors (a typed view: data, dtype, shape) and the per-rank arena that
 * owns their memory.
 *
 * The arena is the "allocate once, carve many" of the engine: the model plans
 * every buffer when it loads (weights, activations for the largest batch and
 * token count it will see), the arena allocates one aligned block, touches it
 * once (page faults are expensive here), and hands out views. Nothing is
 * freed piecemeal; the denoising loop allocates nothing.
 *
 * Not thread-safe: an arena belongs to one model on one rank.
 */
#ifndef DITD_ENGINE_TENSOR_H
#define DITD_ENGINE_TENSOR_H

#include <stddef.h>
#include <stdint.h>

#include "engine/core/shapes.h"

typedef enum ditd_dtype {
    DITD_DTYPE_F32 = 0,
    DITD_DTYPE_F16,
    DITD_DTYPE_BF16,
    DITD_DTYPE_I64,
} ditd_dtype;

const char *ditd_dtype_name(ditd_dtype t);
int ditd_dtype_from_str(const char *s, ditd_dtype *out);
size_t ditd_dtype_size(ditd_dtype t);

typedef struct ditd_tensor {
    void *data;               /* borrowed from an arena (or the caller) */
    ditd_dtype dtype;
    int ndim;
    int64_t shape[DITD_MAX_DIMS];
} ditd_tensor;

/* Number of elements; 1 for ndim == 0. */
int64_t ditd_tensor_numel(const ditd_tensor *t);
/* "(2, 49, 384)" into buf; returns buf. */
const char *ditd_tensor_shape_str(const ditd_tensor *t, char *buf, size_t len);
/* ndim sizes as Python prints a shape: "(384, 96)", "(384,)", "()"; into
 * buf (len bytes, cut when short), which it returns. For file readers'
 * messages. */
const char *ditd_shape_str(char *buf, size_t len, int ndim, const int64_t *shape);

/* The arena works in two passes over the same plan: first with
 * ditd_arena_plan() (reserve sizes, no memory), then ditd_arena_commit()
 * allocates the total once and ditd_arena_alloc() replays the same sequence,
 * handing out memory. A planned arena can also be used directly: commit with
 * an explicit size, then alloc. */
typedef struct ditd_arena {
    uint8_t *base;
    size_t size;      /* committed bytes */
    size_t used;      /* bytes handed out (or planned, before commit) */
    size_t peak_plan; /* the largest planned total */
    int committed;
    /* Where commit takes its memory: NULL/NULL maps host pages (the CPU);
     * a device backend's ops->mem_alloc/mem_free otherwise. */
    int (*mem_alloc)(void **p, size_t bytes);
    void (*mem_free)(void *p, size_t bytes);
} ditd_arena;

#define DITD_ARENA_ALIGN 64

void ditd_arena_init(ditd_arena *a);
/* As ditd_arena_init, committing through mem_alloc (which returns zeroed
 * memory, or an error) and freeing through mem_free; both NULL is exactly
 * ditd_arena_init. Pass a backend's ops->mem_alloc and ops->mem_free. The
 * hooks survive ditd_arena_free (the arena can be committed again). */
void ditd_arena_init_mem(ditd_arena *a, int (*mem_alloc)(void **p, size_t bytes),
                         void (*mem_free)(void *p, size_t bytes));
void ditd_arena_free(ditd_arena *a);
/* Allocates `bytes` (rounded up to a page) once and touches every page. */
int ditd_arena_commit(ditd_arena *a, size_t bytes);
/* Rewinds the bump pointer to 0 (plan pass -> alloc pass). */
void ditd_arena_reset(ditd_arena *a);
/* Carves a tensor. Before commit it only counts (t->data = NULL); after
 * commit it returns DITD_ENOMEM when the plan is exceeded. ndim <= 4. */
int ditd_arena_tensor(ditd_arena *a, ditd_tensor *t, ditd_dtype dtype, int ndim,
                      const int64_t *shape);
/* Raw bytes, aligned to DITD_ARENA_ALIGN; NULL (with *err) before commit. */
void *ditd_arena_bytes(ditd_arena *a, size_t bytes, int *err);

#endif
