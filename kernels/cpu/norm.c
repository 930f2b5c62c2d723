/* Row-wise normalizations and the adaLN-Zero elementwise ops on the CPU.
 *
 * What this is: LayerNorm (plain, affine, or followed by adaLN shift/scale)
 * and the gated residual add, one OpenMP loop over rows each. What it is not:
 * anything that reduces across rows or owns memory.
 *
 * Statistics: two passes per row (mean, then the mean of squared deviations,
 * biased as PyTorch's LayerNorm), accumulated in double so that the mean and
 * variance are exact to float precision whatever D is; the normalization
 * itself is in float. This costs nothing measurable: the rows are in L1.
 */
#include "kernels/cpu/cpu_kernels.h"

#include <assert.h>
#include <math.h>

/* mean and 1/sqrt(var + eps) of x[0:D]. */
static void row_stats(const float *x, int D, float eps, float *mean, float *rstd)
{
    double s = 0.0;
#pragma omp simd reduction(+ : s)
    for (int j = 0; j < D; ++j)
        s += (double)x[j];
    const double mu = s / D;
    double ss = 0.0;
#pragma omp simd reduction(+ : ss)
    for (int j = 0; j < D; ++j) {
        const double d = (double)x[j] - mu;
        ss += d * d;
    }
    *mean = (float)mu;
    *rstd = (float)(1.0 / sqrt(ss / D + (double)eps));
}

void ditd_cpu_layernorm_modulate(const float *x, float *y, int B, int N, int D,
                                 float eps, const float *shift, const float *scale,
                                 size_t ld_mod)
{
    assert(x && y);
    assert(B >= 0 && N >= 0 && D > 0 && eps >= 0.0f);
    assert((shift == NULL) == (scale == NULL));
    assert(!shift || ld_mod >= (size_t)D);

    const long rows = (long)B * N;
#pragma omp parallel for schedule(static) if (rows * D > 16384)
    for (long r = 0; r < rows; ++r) {
        const float *xr = x + (size_t)r * D;
        float *yr = y + (size_t)r * D;
        float mean, rstd;
        row_stats(xr, D, eps, &mean, &rstd);
        if (shift) {
            const size_t b = (size_t)(r / N);
            const float *sh = shift + b * ld_mod;
            const float *sc = scale + b * ld_mod;
            for (int j = 0; j < D; ++j)
                yr[j] = (xr[j] - mean) * rstd * (1.0f + sc[j]) + sh[j];
        } else {
            for (int j = 0; j < D; ++j)
                yr[j] = (xr[j] - mean) * rstd;
        }
    }
}

void ditd_cpu_layernorm_affine(const float *x, float *y, int rows, int D, float eps,
                               const float *g, const float *beta)
{
    assert(x && y);
    assert(rows >= 0 && D > 0 && eps >= 0.0f);

#pragma omp parallel for schedule(static) if ((long)rows * D > 16384)
    for (int r = 0; r < rows; ++r) {
        const float *xr = x + (size_t)r * D;
        float *yr = y + (size_t)r * D;
        float mean, rstd;
        row_stats(xr, D, eps, &mean, &rstd);
        for (int j = 0; j < D; ++j) {
            float t = (xr[j] - mean) * rstd;
            t = g ? t * g[j] : t;
            yr[j] = beta ? t + beta[j] : t;
        }
    }
}

void ditd_cpu_gated_residual(float *h, const float *y, int B, int N, int D,
                             const float *gate, size_t ld_gate)
{
    assert(h && y && gate);
    assert(B >= 0 && N >= 0 && D > 0 && ld_gate >= (size_t)D);

    const long rows = (long)B * N;
#pragma omp parallel for schedule(static) if (rows * D > 16384)
    for (long r = 0; r < rows; ++r) {
        float *hr = h + (size_t)r * D;
        const float *yr = y + (size_t)r * D;
        const float *gr = gate + (size_t)(r / N) * ld_gate;
        for (int j = 0; j < D; ++j)
            hr[j] += gr[j] * yr[j];
    }
}
