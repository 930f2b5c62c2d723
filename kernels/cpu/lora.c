/* LoRA's low-rank term added to a linear layer's output (unmerged adapters,
 * docs/lora.md): y = act(y + s (x A^T) B^T). The two thin products go to
 * BLAS; the activation that the linear would have fused comes after the
 * adapter's term, as in PEFT (the adapter wraps the Linear, the activation
 * follows the module).
 *
 * What it is not: no adapter bookkeeping (engine/models/lora.c decides which
 * rows carry which adapter) and no merge into the base weight. */
#include <cblas.h>

#include "kernels/cpu/cpu_kernels.h"

void ditd_cpu_lora(const float *x, size_t ldx, const float *a, const float *b, float s, float *y,
                   size_t ldy, int M, int N, int K, int r, float *tmp, ditd_cpu_act act)
{
    if (M <= 0 || N <= 0)
        return;
    if (r > 0 && s != 0.0f) {
        /* tmp (M, r) = x (M, K) A^T, A (r, K) */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, r, K, 1.0f, x, (int)ldx, a, K,
                    0.0f, tmp, r);
        /* y (M, N) += s tmp B^T, B (N, r) */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, r, s, tmp, r, b, r, 1.0f, y,
                    (int)ldy);
    }
    if (act == DITD_CPU_ACT_NONE)
        return;
    if (ldy == (size_t)N) {
        ditd_cpu_act_apply(y, (size_t)M * (size_t)N, act);
        return;
    }
#pragma omp parallel for schedule(static) if (M > 64)
    for (int m = 0; m < M; m++)
        ditd_cpu_act_apply(y + (size_t)m * ldy, (size_t)N, act);
}
