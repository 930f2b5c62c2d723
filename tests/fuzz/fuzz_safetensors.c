/* libFuzzer target: the safetensors header parser and every read path.
 *
 * The input is one safetensors image, opened from memory. When it opens,
 * every tensor is looked up by name and read as f32 (whole, then a slice
 * along the first and the last axis), so offsets, shapes and conversions
 * that passed validation are exercised, not only the parser. Built as a
 * real fuzzer with clang (tests/fuzz/meson.build) and, with any compiler,
 * into a driver that replays corpus/safetensors in the 'fuzz' test suite.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/error.h"
#include "engine/io/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void read_one(const ditd_safetensors *st, const ditd_st_tensor *t)
{
    size_t numel = t->nbytes ? 1 : 0;
    for (int d = 0; d < t->ndim; d++)
        numel *= (size_t)t->shape[d];
    float *dst = malloc(numel * sizeof(float) + 1);
    if (!dst)
        return;
    if (ditd_safetensors_read_f32(st, t->name, t->ndim, t->shape, dst) == 0 && t->ndim > 0) {
        int last = t->ndim - 1;
        ditd_safetensors_read_f32_slice(st, t->name, t->ndim, t->shape, 0, t->shape[0] / 2,
                                        t->shape[0] - t->shape[0] / 2, dst);
        ditd_safetensors_read_f32_slice(st, t->name, t->ndim, t->shape, last,
                                        t->shape[last] / 3, t->shape[last] / 2, dst);
    }
    free(dst);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ditd_safetensors *st = NULL;
    if (ditd_safetensors_open_mem(data, size, "fuzz.safetensors", &st) != 0) {
        if (st || ditd_err_detail()[0] == '\0')
            abort(); /* an error must leave no object and say why */
        return 0;
    }
    for (size_t i = 0; i < ditd_safetensors_count(st); i++) {
        const ditd_st_tensor *t = ditd_safetensors_at(st, i);
        if (ditd_safetensors_find(st, t->name) != t)
            abort();
        const uint8_t *p = t->data;
        if (t->nbytes && (p < data || p + t->nbytes > data + size))
            abort(); /* a view outside the input */
        read_one(st, t);
    }
    ditd_safetensors_free(st);
    return 0;
}
