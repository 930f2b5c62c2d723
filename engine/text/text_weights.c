/* Text-encoder weights: borrowed 16-bit matrices, GGML blocks kept for
 * linear_q, an arena for the rest. */
#include "engine/text/text_weights.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/error.h"
#include <stdint.h>

int ditd_text_weights_open(ditd_text_weights *w, const char *path, const ditd_backend_ops *ops)
{
    memset(w, 0, sizeof *w);
    w->ops = ops;
    ditd_arena_init_mem(&w->arena, ops->mem_alloc, ops->mem_free);
    int err = ditd_weights_open(path, &w->src);
    if (!err)
        w->st = ditd_weights_st(w->src);
    return err;
}

int ditd_text_weights_is_gguf(const ditd_text_weights *w)
{
    return w->src && ditd_weights_gguf(w->src) != NULL;
}

int ditd_text_weights_commit(ditd_text_weights *w)
{
    int err = ditd_arena_commit(&w->arena, w->arena.peak_plan ? w->arena.peak_plan : 64);
    if (err)
        return err;
    ditd_arena_reset(&w->arena);
    w->committed = 1;
    w->borrowed_bytes = 0;
    w->quant_bytes = 0;
    w->n_quant = 0;
    return 0;
}

void ditd_text_weights_free(ditd_text_weights *w)
{
    ditd_arena_free(&w->arena);
    ditd_weights_free(w->src);
    free(w->stage);
    memset(w, 0, sizeof *w);
}

int ditd_text_weights_has(const ditd_text_weights *w, const char *name)
{
    return ditd_weights_has(w->src, name);
}

/* A safetensors tensor checked into *out; a GGUF one checked by the
 * weight source (*out NULL: read through it). */
static int check(const ditd_text_weights *w, const char *name, int ndim, const int64_t *shape,
                 const ditd_st_tensor **out)
{
    *out = NULL;
    if (!w->st)
        return ditd_weights_check(w->src, name, ndim, shape);
    const ditd_st_tensor *t = ditd_safetensors_find(w->st, name);
    if (!t)
        return ditd_err_set(DITD_ENOENT, "checkpoint has no tensor %s", name);
    int ok = t->ndim == ndim;
    for (int i = 0; ok && i < ndim; i++)
        ok = t->shape[i] == shape[i];
    if (!ok) {
        char got[128] = "", want[128] = "";
        for (int i = 0; i < t->ndim && strlen(got) < 100; i++)
            snprintf(got + strlen(got), sizeof got - strlen(got), "%s%lld", i ? ", " : "",
                     (long long)t->shape[i]);
        for (int i = 0; i < ndim; i++)
            snprintf(want + strlen(want), sizeof want - strlen(want), "%s%lld", i ? ", " : "",
                     (long long)shape[i]);
        return ditd_err_set(DITD_ESHAPE, "%s: tensor %s has shape (%s), the config says (%s)",
                            t->file, name, got, want);
    }
    if (t->dtype != DITD_ST_F32 && t->dtype != DITD_ST_F16 && t->dtype != DITD_ST_BF16 &&
        t->dtype != DITD_ST_F64)
        return ditd_err_set(DITD_EUNSUPPORTED, "%s: tensor %s is %s (f32, f16, bf16, f64)",
                            t->file, name, ditd_st_dtype_name(t->dtype));
    *out = t;
    return 0;
}

static int stage(ditd_text_weights *w, size_t n, const char *name)
{
    if (n <= w->stage_len)
        return 0;
    float *s = realloc(w->stage, n * sizeof(float));
    if (!s)
        return ditd_err_set(DITD_ENOMEM, "staging %zu floats for %s", n, name);
    w->stage = s;
    w->stage_len = n;
    return 0;
}

/* Converts tensor `name` to f32 into the arena (act dtype on the device). */
static int convert(ditd_text_weights *w, void **dst, const char *name, int ndim,
                   const int64_t *shape, size_t n)
{
    int err;
    void *p = ditd_arena_bytes(&w->arena, n * ditd_dtype_size(w->ops->act_dtype), &err);
    if (err)
        return err;
    *dst = p;
    if (!w->committed)
        return 0;
    if ((err = stage(w, n, name)) ||
        (err = ditd_weights_read_f32(w->src, name, ndim, shape, w->stage)))
        return err;
    w->ops->upload(p, w->stage, n);
    return 0;
}

int ditd_text_weights_mat(ditd_text_weights *w, ditd_text_mat *out, const char *name,
                          int64_t rows, int64_t cols)
{
    int64_t shape[2] = {rows, cols};
    return ditd_text_weights_mat_nd(w, out, name, 2, shape);
}

int ditd_text_weights_mat_nd(ditd_text_weights *w, ditd_text_mat *out, const char *name,
                             int ndim, const int64_t *shape)
{
    const ditd_st_tensor *t = NULL;
    int64_t rows = shape[0], cols = 1;
    int err;
    for (int i = 1; i < ndim; i++)
        cols *= shape[i];
    memset(out, 0, sizeof *out);
    if ((err = check(w, name, ndim, shape, &t)))
        return err;
    if (!t) { /* GGUF: dequantized into the arena */
        void *p = NULL;
        if ((err = convert(w, &p, name, ndim, shape, (size_t)rows * (size_t)cols)))
            return err;
        out->p = p;
        out->dt = w->ops->act_dtype;
        return 0;
    }
    ditd_dtype dt = t->dtype == DITD_ST_F32 ? DITD_DTYPE_F32
                    : t->dtype == DITD_ST_F16 ? DITD_DTYPE_F16 : DITD_DTYPE_BF16;
    size_t es = ditd_dtype_size(dt);
    int in_place = !w->ops->mem_alloc && t->dtype != DITD_ST_F64 &&
                   (uintptr_t)t->data % es == 0;
    if (in_place) {
        out->p = t->data;
        out->dt = dt;
        w->borrowed_bytes += t->nbytes;
        return 0;
    }
    void *p = NULL;
    if ((err = convert(w, &p, name, ndim, shape, (size_t)rows * (size_t)cols)))
        return err;
    out->p = p;
    out->dt = w->ops->act_dtype;
    return 0;
}

int ditd_text_weights_qmat(ditd_text_weights *w, ditd_text_mat *out, const char *name,
                           int64_t rows, int64_t cols)
{
    int type = 0, err;
    size_t rb = 0;
    if (w->st || !w->ops->linear_q || w->ops->mem_alloc || rows > INT32_MAX || cols > INT32_MAX ||
        !ditd_weights_quant(w->src, name, rows, cols, &type, &rb))
        return ditd_text_weights_mat(w, out, name, rows, cols);
    void *p = ditd_arena_bytes(&w->arena, (size_t)rows * rb, &err);
    if (err)
        return err;
    if (w->committed && (err = ditd_weights_rows(w->src, name, 0, rows, p)))
        return err;
    memset(out, 0, sizeof *out);
    out->p = p;
    out->dt = w->ops->act_dtype;
    out->q = (ditd_qweight){.type = type, .N = (int)rows, .K = (int)cols, .row_bytes = rb,
                            .data = p};
    w->quant_bytes += (size_t)rows * rb;
    w->n_quant++;
    return 0;
}

int ditd_text_weights_quantized(const ditd_text_weights *w, size_t *bytes)
{
    if (bytes)
        *bytes = w->quant_bytes;
    return w->n_quant;
}

void ditd_text_linear(const ditd_backend_ops *ops, const void *x, size_t ldx,
                      const ditd_text_mat *w, const void *b, void *y, size_t ldy, int M, int N,
                      int K, ditd_text_act act, void *scratch, size_t scratch_elems)
{
    if (!w->q.data) {
        ops->linear_wt(x, ldx, w->p, w->dt, b, y, ldy, M, N, K, act, scratch, scratch_elems);
        return;
    }
    assert(w->q.N == N && w->q.K == K);
    assert(act == DITD_TEXT_ACT_NONE || act == DITD_TEXT_ACT_GELU_NEW);
    ops->linear_q(x, ldx, &w->q, b, y, ldy, M,
                  act == DITD_TEXT_ACT_GELU_NEW ? DITD_ACT_GELU_TANH : DITD_ACT_NONE);
}

int ditd_text_weights_small(ditd_text_weights *w, void **dst, const char *name, int64_t d0,
                            int64_t d1)
{
    int64_t shape[2] = {d0, d1};
    int nd = d1 ? 2 : 1;
    const ditd_st_tensor *t = NULL;
    int err;
    if ((err = check(w, name, nd, shape, &t)))
        return err;
    return convert(w, dst, name, nd, shape, (size_t)d0 * (size_t)(d1 ? d1 : 1));
}

int ditd_text_weights_host(ditd_text_weights *w, float *h_dst, const char *name, int64_t d0,
                           int64_t d1)
{
    int64_t shape[2] = {d0, d1};
    int nd = d1 ? 2 : 1;
    const ditd_st_tensor *t = NULL;
    int err;
    if ((err = check(w, name, nd, shape, &t)) || !w->committed)
        return err;
    return ditd_weights_read_f32(w->src, name, nd, shape, h_dst);
}

int ditd_text_weights_carve(ditd_text_weights *w, void **dst, size_t n, int bytes)
{
    int err;
    *dst = ditd_arena_bytes(&w->arena, bytes ? n : n * ditd_dtype_size(w->ops->act_dtype), &err);
    return err;
}
