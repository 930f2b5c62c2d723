/* libFuzzer target: the GGUF reader and every read path.
 *
 * The input is one GGUF image, opened from memory. When it opens, every
 * metadata entry is walked (string arrays element by element), and every
 * tensor is looked up by name, checked to lie inside the input, and read as
 * f32 (whole, then a slice along the first and the last axis) when its type
 * is one ditd dequantizes and it is small enough to allocate, so offsets,
 * shapes and dequantization that passed validation are exercised, not only
 * the parser. Built as a real fuzzer with clang (tests/fuzz/meson.build)
 * and, with any compiler, into a driver that replays corpus/gguf in the
 * 'fuzz' test suite.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/error.h"
#include "engine/io/gguf.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void read_one(const ditd_gguf *g, const ditd_gguf_tensor *t)
{
    size_t numel = 1;
    for (int d = 0; d < t->ndim; d++)
        numel *= (size_t)t->shape[d];
    if (numel > (1u << 22))
        return;
    float *dst = malloc(numel * sizeof(float) + 1);
    if (!dst)
        return;
    if (ditd_gguf_read_f32(g, t->name, t->ndim, t->shape, dst) == 0) {
        int last = t->ndim - 1;
        ditd_gguf_read_f32_slice(g, t->name, t->ndim, t->shape, 0, t->shape[0] / 2,
                                 t->shape[0] - t->shape[0] / 2, dst);
        ditd_gguf_read_f32_slice(g, t->name, t->ndim, t->shape, last, t->shape[last] / 3,
                                 t->shape[last] / 2, dst);
    } else if (ditd_gguf_type_supported(t->type)) {
        abort(); /* a supported tensor of its own shape must read */
    }
    free(dst);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ditd_gguf *g = NULL;
    if (ditd_gguf_open_mem(data, size, "fuzz.gguf", &g) != 0) {
        if (g || ditd_err_detail()[0] == '\0')
            abort(); /* an error must leave no object and say why */
        return 0;
    }
    for (size_t i = 0; i < ditd_gguf_kv_count(g); i++) {
        const ditd_gguf_kv *kv = ditd_gguf_kv_at(g, i);
        if (ditd_gguf_kv_find(g, kv->key) != kv)
            abort();
        int64_t v;
        (void)ditd_gguf_kv_int(g, kv->key, &v);
        if (kv->type == DITD_GGUF_V_ARRAY && kv->elem_type == DITD_GGUF_V_STRING)
            for (uint64_t j = 0; j < kv->n; j++) {
                const char *s;
                size_t n;
                if (ditd_gguf_kv_arr_str(kv, j, &s, &n) != 0 || (const uint8_t *)s < data ||
                    (const uint8_t *)s + n > data + size)
                    abort();
            }
    }
    for (size_t i = 0; i < ditd_gguf_count(g); i++) {
        const ditd_gguf_tensor *t = ditd_gguf_at(g, i);
        if (ditd_gguf_find(g, t->name) != t)
            abort();
        const uint8_t *p = t->data;
        if (t->nbytes && (p < data || p + t->nbytes > data + size))
            abort(); /* a view outside the input */
        read_one(g, t);
    }
    ditd_gguf_free(g);
    return 0;
}
