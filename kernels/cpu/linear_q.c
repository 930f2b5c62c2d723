/* Linear layers on weights kept quantized in memory (GGML blocks, or the
 * 8-bit floats of FP8 checkpoints with their row scales):
 *
 *   y (M, N) = act(x (M, K) @ dequant(w)^T + b)
 *
 * in the compute type the caller names: f32, or bf16 (x and the
 * dequantized w rounded to bf16, fp32 sums), which is Diffusers' GGUF path
 * (dequantize to compute_dtype, then matmul) with ggml's dequantization.
 *
 * Where the packed GEMM runs (AVX-512, ditd_cpu_gemm_packs), each panel of
 * 64 weight rows is dequantized as the GEMM reads it (gemm_packed.c), so
 * the weights stay in their blocks: memory is the file's size, and the
 * result is bit-identical to the packed product on the dequantized weights.
 * Elsewhere the whole weight is dequantized into a workspace that lives
 * for the process (as big as the largest weight seen), then the library
 * GEMM runs: correct, but it holds one weight in full precision.
 *
 * What it is not: an int8 dot-product path (Q8_0 x int8 activations, as
 * ggml's CPU backend has): the products here are exactly those of the
 * float weights. State: a lock serializes calls (the per-thread panel
 * buffers, the bf16 copy of x, the fallback workspace).
 */
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/dequant.h"
#include "kernels/cpu/gemm_packed.h"

#include <assert.h>
#include <omp.h>
#include <pthread.h>
#include <stdlib.h>

static pthread_mutex_t g_qlock = PTHREAD_MUTEX_INITIALIZER;
static uint16_t *g_xb;   /* x in bf16 */
static size_t g_xb_len;
static void *g_ws;       /* fallback: the whole weight dequantized */
static size_t g_ws_len;

static int grow(void **p, size_t *len, size_t bytes)
{
    if (bytes <= *len)
        return 0;
    void *q = realloc(*p, bytes);
    if (!q)
        return -1;
    *p = q;
    *len = bytes;
    return 0;
}

int ditd_cpu_linear_q(const float *x, size_t ldx, const ditd_cpu_qweight *w, const void *b,
                      int bf16, float *y, size_t ldy, int M, ditd_cpu_act act)
{
    assert(x && w && w->data && y);
    const int N = w->N, K = w->K;
    int elems = 0, bytes = 0;
    assert(ditd_cpu_dequant_block(w->type, &elems, &bytes));
    assert(N > 0 && K > 0 && K % elems == 0);
    assert(w->row_bytes >= (size_t)(K / elems) * (size_t)bytes);
    assert(ldx >= (size_t)K && ldy >= (size_t)N && M >= 0);
    assert(!omp_in_parallel());
    if (M == 0)
        return 0;
    int err = 0;
    pthread_mutex_lock(&g_qlock);
    if (ditd_cpu_gemm_packs(bf16)) {
        const void *a = x;
        if (bf16) {
            if (grow((void **)&g_xb, &g_xb_len, (size_t)M * (size_t)K * sizeof *g_xb)) {
                err = -1;
                goto out;
            }
            for (int m = 0; m < M; m++)
                ditd_cpu_f32_to_bf16(x + (size_t)m * ldx, g_xb + (size_t)m * (size_t)K,
                                     (size_t)K);
            a = g_xb;
            ldx = (size_t)K;
        }
        err = ditd__cpu_gemm_packed_q_run(a, ldx, w->data, w->type, w->row_bytes, w->scale, b,
                                          bf16, y, ldy, M, N, K, act);
        goto out;
    }
    /* no packed kernel: the whole weight in the compute type, then the library */
    const size_t nk = (size_t)N * (size_t)K;
    if (grow(&g_ws, &g_ws_len, nk * sizeof(float) + (bf16 ? nk * sizeof(uint16_t) : 0))) {
        err = -1;
        goto out;
    }
    float *wf = g_ws;
#pragma omp parallel for schedule(static) if (nk > 65536)
    for (int n = 0; n < N; n++)
        ditd_cpu_dequant_rows(w->type, w->data, w->row_bytes, w->scale, n, 1, 0, K,
                              wf + (size_t)n * (size_t)K, (size_t)K, 0);
    if (bf16) {
        uint16_t *wb = (uint16_t *)(wf + nk);
        ditd_cpu_f32_to_bf16(wf, wb, nk);
        ditd_cpu_linear_bf16(x, ldx, wb, b, y, ldy, M, N, K, act);
    } else {
        ditd_cpu_linear(x, ldx, wf, b, y, ldy, M, N, K, act);
    }
out:
    pthread_mutex_unlock(&g_qlock);
    return err;
}
