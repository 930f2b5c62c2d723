/* Tensors and the per-rank arena. */
#include "engine/core/tensor.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "engine/core/error.h"

static const char *const dtype_names[] = {
    [DITD_DTYPE_F32] = "f32",
    [DITD_DTYPE_F16] = "f16",
    [DITD_DTYPE_BF16] = "bf16",
    [DITD_DTYPE_I64] = "i64",
};

const char *ditd_dtype_name(ditd_dtype t)
{
    if ((unsigned)t < sizeof dtype_names / sizeof dtype_names[0])
        return dtype_names[t];
    return "unknown";
}

int ditd_dtype_from_str(const char *s, ditd_dtype *out)
{
    for (size_t i = 0; i < sizeof dtype_names / sizeof dtype_names[0]; i++) {
        if (strcmp(s, dtype_names[i]) == 0) {
            *out = (ditd_dtype)i;
            return 0;
        }
    }
    return ditd_err_set(DITD_EINVAL, "unknown dtype \"%s\" (f32, f16, bf16, i64)", s);
}

size_t ditd_dtype_size(ditd_dtype t)
{
    switch (t) {
    case DITD_DTYPE_F32: return 4;
    case DITD_DTYPE_F16: return 2;
    case DITD_DTYPE_BF16: return 2;
    case DITD_DTYPE_I64: return 8;
    }
    return 0;
}

int64_t ditd_tensor_numel(const ditd_tensor *t)
{
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++)
        n *= t->shape[i];
    return n;
}

const char *ditd_tensor_shape_str(const ditd_tensor *t, char *buf, size_t len)
{
    size_t at = 0;
    at += (size_t)snprintf(buf + at, len - at, "(");
    for (int i = 0; i < t->ndim && at < len; i++)
        at += (size_t)snprintf(buf + at, len - at, i ? ", %lld" : "%lld",
                               (long long)t->shape[i]);
    if (at < len)
        snprintf(buf + at, len - at, ")");
    return buf;
}

const char *ditd_shape_str(char *buf, size_t len, int ndim, const int64_t *shape)
{
    size_t o = 0;
    buf[0] = '\0';
    o += (size_t)snprintf(buf + o, len - o, "(");
    for (int i = 0; i < ndim && o < len; i++)
        o += (size_t)snprintf(buf + o, len - o, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (o < len)
        snprintf(buf + o, len - o, ndim == 1 ? ",)" : ")");
    return buf;
}

void ditd_arena_init(ditd_arena *a)
{
    memset(a, 0, sizeof *a);
}

void ditd_arena_init_mem(ditd_arena *a, int (*mem_alloc)(void **p, size_t bytes),
                         void (*mem_free)(void *p, size_t bytes))
{
    memset(a, 0, sizeof *a);
    a->mem_alloc = mem_alloc;
    a->mem_free = mem_free;
}

void ditd_arena_free(ditd_arena *a)
{
    int (*mem_alloc)(void **, size_t) = a->mem_alloc;
    void (*mem_free)(void *, size_t) = a->mem_free;
    if (a->base) {
        if (mem_free)
            mem_free(a->base, a->size);
        else
            munmap(a->base, a->size);
    }
    memset(a, 0, sizeof *a);
    a->mem_alloc = mem_alloc;
    a->mem_free = mem_free;
}

int ditd_arena_commit(ditd_arena *a, size_t bytes)
{
    long page = sysconf(_SC_PAGESIZE);
    size_t ps = page > 0 ? (size_t)page : 4096;
    if (a->committed)
        return ditd_err_set(DITD_EINVAL, "arena committed twice");
    if (bytes == 0)
        bytes = ps;
    bytes = (bytes + ps - 1) / ps * ps;
    if (a->mem_alloc) {
        /* device memory: zeroed by the backend, no page faults to take */
        void *d = NULL;
        int err = a->mem_alloc(&d, bytes);
        if (err)
            return err;
        a->base = d;
        a->size = bytes;
        a->used = 0;
        a->committed = 1;
        return 0;
    }
    /* MAP_POPULATE takes every page fault now, in the kernel, not in the
     * hot loop; the memset afterwards is cheap and keeps valgrind quiet. */
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (p == MAP_FAILED)
        return ditd_err_set(DITD_ENOMEM, "arena: cannot map %zu bytes", bytes);
    memset(p, 0, bytes);
    a->base = p;
    a->size = bytes;
    a->used = 0;
    a->committed = 1;
    return 0;
}

void ditd_arena_reset(ditd_arena *a)
{
    if (a->used > a->peak_plan)
        a->peak_plan = a->used;
    a->used = 0;
}

void *ditd_arena_bytes(ditd_arena *a, size_t bytes, int *err)
{
    size_t at = (a->used + DITD_ARENA_ALIGN - 1) / DITD_ARENA_ALIGN * DITD_ARENA_ALIGN;
    *err = 0;
    if (!a->committed) {
        a->used = at + bytes;
        if (a->used > a->peak_plan)
            a->peak_plan = a->used;
        return NULL;
    }
    if (at + bytes > a->size || at + bytes < at) {
        *err = ditd_err_set(DITD_ENOMEM, "arena: %zu bytes requested, %zu of %zu left",
                            bytes, a->size - (at < a->size ? at : a->size), a->size);
        return NULL;
    }
    a->used = at + bytes;
    return a->base + at;
}

int ditd_arena_tensor(ditd_arena *a, ditd_tensor *t, ditd_dtype dtype, int ndim,
                      const int64_t *shape)
{
    int err;
    if (ndim < 0 || ndim > DITD_MAX_DIMS)
        return ditd_err_set(DITD_EINVAL, "tensor with %d dims (at most %d)", ndim, DITD_MAX_DIMS);
    memset(t, 0, sizeof *t);
    t->dtype = dtype;
    t->ndim = ndim;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0)
            return ditd_err_set(DITD_EINVAL, "negative tensor dimension %lld", (long long)shape[i]);
        t->shape[i] = shape[i];
    }
    t->data = ditd_arena_bytes(a, (size_t)ditd_tensor_numel(t) * ditd_dtype_size(dtype), &err);
    return err;
}
