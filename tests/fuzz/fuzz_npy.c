/* libFuzzer target: the .npy reader (preamble, header dict literal, dtype,
 * shape, data), through both the f32 and the i64 conversion. */
#include <stdint.h>
#include <stdlib.h>

#include "engine/core/error.h"
#include "engine/io/npy.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    int ndim = -1;
    int64_t shape[8];
    float *f = NULL;
    int64_t *i = NULL;

    if (ditd_npy_read_f32_mem(data, size, "fuzz.npy", 8, &ndim, shape, &f) == 0) {
        if (!f || ndim < 0 || ndim > 8)
            abort();
        free(f);
    } else if (f || ditd_err_detail()[0] == '\0') {
        abort();
    }
    if (ditd_npy_read_i64_mem(data, size, "fuzz.npy", 8, &ndim, shape, &i) == 0)
        free(i);
    else if (i)
        abort();
    return 0;
}
