/* GPU check of the GGML block dequantization (kernels/cuda/dequant.cu)
 * against gguf.quants.dequantize: every type of tests/fixtures/gguf/
 * types.gguf uploaded as its blocks, dequantized on the device to f32
 * (bit-identical to the reference, as the CPU's) and to bf16 (bit-identical
 * to the reference rounded to nearest even), a floor on the types checked;
 * an unsupported type refused without a launch. Exits 77 (skipped) without
 * a GPU.
 */
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/backend/backend_cuda.h"
#include "engine/io/gguf.h"
#include "kernels/cuda/cuda_kernels.h"
#include "tests/test_util.h"

static uint16_t to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16); /* finite inputs */
}

int main(void)
{
    if (!ditd_backend_cuda_available()) {
        printf("no CUDA device: skipped\n");
        return 77;
    }
    static const char *const types[] = {"F32",  "F16",  "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1",
                                        "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"};
    char path[4096];
    snprintf(path, sizeof path, "%s/gguf/types.gguf", tu_fixtures());
    ditd_gguf *g = NULL;
    TU_OK(ditd_gguf_open(path, &g));
    if (!g)
        return tu_exit();
    enum { R = 3, K = 512 };
    const int64_t shape[2] = {R, K};
    static float ref[R * K], got[R * K];
    static uint16_t gotb[R * K];
    void *dq = NULL, *dout = NULL;
    TU_CHECK(cudaMalloc(&dq, 1 << 16) == cudaSuccess && cudaMalloc(&dout, R * K * 4) == cudaSuccess,
             "cudaMalloc");
    int checked = 0;
    for (size_t i = 0; dq && dout && i < sizeof types / sizeof *types; i++) {
        char qn[32], rn[32];
        snprintf(qn, sizeof qn, "q.%s", types[i]);
        snprintf(rn, sizeof rn, "ref.%s", types[i]);
        const ditd_gguf_tensor *t = ditd_gguf_find(g, qn);
        TU_CHECK(t != NULL, "%s missing", qn);
        if (!t)
            continue;
        TU_OK(ditd_gguf_read_f32(g, rn, 2, shape, ref));
        cudaMemcpy(dq, t->data, t->nbytes, cudaMemcpyHostToDevice);
        int rc = ditd_cuda_dequant_f32((int)t->type, dq, t->row_bytes, R, K, dout, K, NULL);
        TU_CHECK(rc == 0, "%s: dequant_f32 -> %d", qn, rc);
        cudaMemcpy(got, dout, sizeof got, cudaMemcpyDeviceToHost);
        int ok = memcmp(got, ref, sizeof got) == 0;
        for (int j = 0; !ok && j < R * K; j++)
            if (memcmp(&got[j], &ref[j], 4)) {
                TU_CHECK(0, "%s f32: element %d is %.9g, the reference %.9g", qn, j, got[j], ref[j]);
                break;
            }
        rc = ditd_cuda_dequant_bf16((int)t->type, dq, t->row_bytes, R, K, dout, K, NULL);
        TU_CHECK(rc == 0, "%s: dequant_bf16 -> %d", qn, rc);
        cudaMemcpy(gotb, dout, sizeof gotb, cudaMemcpyDeviceToHost);
        int okb = 1;
        for (int j = 0; okb && j < R * K; j++)
            if (gotb[j] != to_bf16(ref[j])) {
                TU_CHECK(0, "%s bf16: element %d is 0x%04x, want 0x%04x", qn, j, gotb[j],
                         to_bf16(ref[j]));
                okb = 0;
            }
        checked += ok && okb;
    }
    printf("types dequantized on the GPU bit-identically: %d\n", checked);
    TU_CHECK(checked >= 13, "only %d of 13 types", checked);
    const ditd_gguf_tensor *u = ditd_gguf_find(g, "blk.unsupported");
    TU_CHECK(u && ditd_cuda_dequant_f32((int)u->type, dq, u->row_bytes, 2, 32, dout, 32, NULL) != 0,
             "IQ4_NL refused");
    cudaFree(dq);
    cudaFree(dout);
    ditd_gguf_free(g);
    return tu_exit();
}
