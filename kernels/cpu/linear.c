/* Linear layers and activations on the CPU: one GEMM with the bias fused
 * into it (kernels/cpu/gemm.c: oneDNN, or OpenBLAS), then the activation in
 * one OpenMP pass over the output rows.
 *
 * What this is not: a GEMM. The matrix product is the library's; it is
 * called outside any OpenMP parallel region so that it and our kernels share
 * one threading runtime (libgomp: Debian's libopenblas0-openmp and libdnnl2
 * both use it) and never oversubscribe.
 */
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/cpu_math.h"

#include <assert.h>
#include <math.h>
#include <omp.h>

/* GELU, tanh approximation, as PyTorch's F.gelu(approximate='tanh'):
 *   0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3).
 * Computed through the identity 0.5 (1 + tanh(u)) = 1 / (1 + exp(-2u)), which
 * has no cancellation for negative x and needs only exp. */
static inline float gelu_tanh(float x)
{
    const float k_beta = 0.7978845608028654f; /* sqrt(2/pi) */
    const float k_kappa = 0.044715f;
    float u = k_beta * (x + k_kappa * x * x * x);
    return x * ditd__sigmoidf(2.0f * u);
}

/* SiLU: x * sigmoid(x). */
static inline float silu(float x)
{
    return x * ditd__sigmoidf(x);
}

/* y[0:n] = act(y[0:n] + b[0:n]) for one row; b may be NULL. The switch is
 * outside the loops so each loop is a plain vectorizable one. */
static void bias_act_row(float *y, const float *b, int n, ditd_cpu_act act)
{
    switch (act) {
    case DITD_CPU_ACT_NONE:
        if (b) {
            for (int j = 0; j < n; ++j)
                y[j] += b[j];
        }
        break;
    case DITD_CPU_ACT_GELU_TANH:
        if (b) {
            for (int j = 0; j < n; ++j)
                y[j] = gelu_tanh(y[j] + b[j]);
        } else {
            for (int j = 0; j < n; ++j)
                y[j] = gelu_tanh(y[j]);
        }
        break;
    case DITD_CPU_ACT_SILU:
        if (b) {
            for (int j = 0; j < n; ++j)
                y[j] = silu(y[j] + b[j]);
        } else {
            for (int j = 0; j < n; ++j)
                y[j] = silu(y[j]);
        }
        break;
    }
}

static void linear_any(const float *x, size_t ldx, const void *w, const void *b, int w_bf16,
                       float *y, size_t ldy, int M, int N, int K, ditd_cpu_act act)
{
    assert(x && w && y);
    assert(M >= 0 && N > 0 && K > 0);
    assert(ldx >= (size_t)K && ldy >= (size_t)N);
    assert(act == DITD_CPU_ACT_NONE || act == DITD_CPU_ACT_GELU_TANH ||
           act == DITD_CPU_ACT_SILU);
    assert(!omp_in_parallel()); /* the GEMM library must not run inside our region */
    if (M == 0)
        return;

    /* y = x @ w^T + b: x (M, K) row-major, w (N, K) row-major used transposed;
     * the activation fused into the GEMM where the library runs it */
    if (ditd_cpu_gemm_act(x, ldx, w, b, w_bf16, y, ldy, M, N, K, act) || act == DITD_CPU_ACT_NONE)
        return;
#pragma omp parallel for schedule(static) if ((size_t)M * (size_t)N > 16384)
    for (int i = 0; i < M; ++i)
        bias_act_row(y + (size_t)i * ldy, NULL, N, act);
}

void ditd_cpu_linear(const float *x, size_t ldx, const float *w, const float *b,
                     float *y, size_t ldy, int M, int N, int K, ditd_cpu_act act)
{
    linear_any(x, ldx, w, b, 0, y, ldy, M, N, K, act);
}

void ditd_cpu_linear_bf16(const float *x, size_t ldx, const uint16_t *w, const uint16_t *b,
                          float *y, size_t ldy, int M, int N, int K, ditd_cpu_act act)
{
    linear_any(x, ldx, w, b, 1, y, ldy, M, N, K, act);
}

void ditd_cpu_act_apply(float *y, size_t n, ditd_cpu_act act)
{
    assert(y || n == 0);
    assert(act == DITD_CPU_ACT_NONE || act == DITD_CPU_ACT_GELU_TANH ||
           act == DITD_CPU_ACT_SILU);
    if (act == DITD_CPU_ACT_NONE || n == 0)
        return;
    /* Chunks of 4096 elements: big enough to amortize the loop, small enough
     * to spread over threads; the tail chunk is shorter. */
    const size_t chunk = 4096;
    const long nchunks = (long)((n + chunk - 1) / chunk);
#pragma omp parallel for schedule(static) if (nchunks > 4)
    for (long c = 0; c < nchunks; ++c) {
        size_t off = (size_t)c * chunk;
        size_t len = n - off < chunk ? n - off : chunk;
        bias_act_row(y + off, NULL, (int)len, act);
    }
}
