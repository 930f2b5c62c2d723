/* GPU check of the GGML block dequantization (kernels/cuda/dequant.cu)
 * against gguf.quants.dequantize: every type of tests/fixtures/gguf/
 * types.gguf uploaded as its blocks, dequantized on the device to f32
 * (bit-identical to the reference, as the CPU's) and to bf16 (bit-identical
 * to the reference rounded to nearest even), a floor on the types checked;
 * an unsupported type refused without a launch. Then the CUDA backend's
 * linear_q on the same blocks (kept as stored, dequantized into a workspace
 * per call, then the bf16 GEMM) against the CPU's linear_q in f32: within
 * 8e-3 of the largest output (bf16 compute, as the linear check). Exits 77
 * (skipped) without a GPU.
 */
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/backend/backend.h"
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
    /* linear_q on the blocks, kept as stored */
    const ditd_backend_ops *G = ditd_backend_get(DITD_DEVICE_CUDA), *C = &ditd_backend_cpu;
    enum { M = 5 };
    static float x[M * K], yc[M * R], yg[M * R];
    for (int i = 0; i < M * K; i++)
        x[i] = (float)((i * 7919) % 2001 - 1000) / 1000.0f;
    static const char *const lq[] = {"Q8_0", "Q4_K", "Q6_K", "Q5_0"};
    int lq_ok = 0;
    void *dx = NULL, *dy = NULL;
    TU_CHECK(G && G->linear_q && G->linear_q_takes, "the CUDA table has linear_q");
    if (G && G->linear_q && G->mem_alloc(&dx, (size_t)M * K * 2) == 0 &&
        G->mem_alloc(&dy, (size_t)M * R * 2) == 0) {
        G->upload(dx, x, (size_t)M * K);
        for (size_t i = 0; dq && i < sizeof lq / sizeof *lq; i++) {
            char qn[32];
            snprintf(qn, sizeof qn, "q.%s", lq[i]);
            const ditd_gguf_tensor *t = ditd_gguf_find(g, qn);
            if (!t)
                continue;
            cudaMemcpy(dq, t->data, t->nbytes, cudaMemcpyHostToDevice);
            ditd_qweight qc = {.type = (int)t->type, .N = R, .K = K, .row_bytes = t->row_bytes,
                               .data = t->data};
            ditd_qweight qg = qc;
            qg.data = dq;
            TU_CHECK(G->linear_q_takes(qc.type, R, K), "%s: linear_q takes it", qn);
            C->linear_q(x, K, &qc, NULL, yc, R, M, DITD_ACT_NONE);
            G->linear_q(dx, K, &qg, NULL, dy, R, M, DITD_ACT_NONE);
            G->download(yg, dy, (size_t)M * R);
            TU_OK(G->status());
            tu_err e = tu_compare(yg, yc, (size_t)M * R);
            printf("%s linear_q %s M %d N %d K %d: rel %.3g (tol 8e-3)\n", e.rel <= 8e-3 ? "ok  " : "FAIL",
                   lq[i], M, R, K, e.rel);
            TU_CHECK(e.rel <= 8e-3, "%s: CUDA linear_q vs the CPU's: rel %g", qn, e.rel);
            lq_ok += e.rel <= 8e-3;
        }
    }
    TU_CHECK(lq_ok >= 4, "linear_q on blocks checked for %d of 4 types", lq_ok);
    if (G && dx)
        G->mem_free(dx, 0);
    if (G && dy)
        G->mem_free(dy, 0);
    cudaFree(dq);
    cudaFree(dout);
    ditd_gguf_free(g);
    return tu_exit();
}
