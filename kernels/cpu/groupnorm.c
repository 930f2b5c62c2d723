/* GroupNorm (+ SiLU) on the CPU in two halves, statistics and apply, so
 * that a caller holding a band of rows can all-reduce the statistics
 * between the halves (the parallel VAE decode); plus nearest upsampling and
 * the planes <-> tokens transposes (kernels/cpu/image_kernels.h).
 *
 * What it is not: the LayerNorm of cpu_kernels.h (per token, not per group).
 */
#include "kernels/cpu/image_kernels.h"

#include <math.h>

void ditd_cpu_groupnorm_stats(const float *x, size_t ps, int B, int C, int rows, int W, int G,
                              double *stats)
{
    const int cg = C / G;
#pragma omp parallel for schedule(static)
    for (int bg = 0; bg < B * G; bg++) {
        const int b = bg / G, g = bg % G;
        double s = 0.0, q = 0.0;
        for (int c = g * cg; c < (g + 1) * cg; c++) {
            const float *p = x + ((size_t)b * C + c) * ps;
            for (int r = 0; r < rows; r++) {
                const float *row = p + (size_t)r * W;
                double rs = 0.0, rq = 0.0;
                for (int i = 0; i < W; i++) {
                    const double v = row[i];
                    rs += v;
                    rq += v * v;
                }
                s += rs;
                q += rq;
            }
        }
        stats[(size_t)bg * 2] = s;
        stats[(size_t)bg * 2 + 1] = q;
    }
}

void ditd_cpu_groupnorm_apply(const float *x, size_t psx, float *y, size_t psy, int B, int C,
                              int rows, int W, int G, const float *mean, const float *rstd,
                              const float *gamma, const float *beta, int silu)
{
    const int cg = C / G;
    const size_t n = (size_t)rows * W;
#pragma omp parallel for schedule(static)
    for (int bc = 0; bc < B * C; bc++) {
        const int b = bc / C, c = bc % C, g = c / cg;
        const float m = mean[b * G + g], r = rstd[b * G + g];
        const float a = r * (gamma ? gamma[c] : 1.0f);
        const float sh = (beta ? beta[c] : 0.0f) - m * a;
        const float *xp = x + (size_t)bc * psx;
        float *yp = y + (size_t)bc * psy;
        if (silu) {
            for (size_t i = 0; i < n; i++) {
                const float v = xp[i] * a + sh;
                yp[i] = v / (1.0f + expf(-v));
            }
        } else {
            for (size_t i = 0; i < n; i++)
                yp[i] = xp[i] * a + sh;
        }
    }
}

void ditd_cpu_upsample_nearest2x(const float *x, size_t psx, float *y, size_t psy, int B, int C,
                                 int rows, int W)
{
#pragma omp parallel for schedule(static)
    for (int bc = 0; bc < B * C; bc++) {
        const float *xp = x + (size_t)bc * psx;
        float *yp = y + (size_t)bc * psy;
        for (int r = 0; r < rows; r++) {
            const float *src = xp + (size_t)r * W;
            float *d0 = yp + (size_t)(2 * r) * 2 * W, *d1 = d0 + 2 * W;
            for (int i = 0; i < W; i++) {
                d0[2 * i] = src[i];
                d0[2 * i + 1] = src[i];
            }
            for (int i = 0; i < 2 * W; i++)
                d1[i] = d0[i];
        }
    }
}

void ditd_cpu_planes_to_tokens(const float *x, size_t ps, float *t, int C, int n)
{
    enum { TB = 32 };
#pragma omp parallel for schedule(static)
    for (int i0 = 0; i0 < n; i0 += TB) {
        const int i1 = i0 + TB < n ? i0 + TB : n;
        for (int c = 0; c < C; c++) {
            const float *xp = x + (size_t)c * ps;
            for (int i = i0; i < i1; i++)
                t[(size_t)i * C + c] = xp[i];
        }
    }
}

void ditd_cpu_tokens_to_planes(const float *t, float *y, size_t ps, int C, int n, int accumulate)
{
    enum { TB = 32 };
#pragma omp parallel for schedule(static)
    for (int c0 = 0; c0 < C; c0 += TB) {
        const int c1 = c0 + TB < C ? c0 + TB : C;
        for (int i = 0; i < n; i++) {
            const float *tp = t + (size_t)i * C;
            for (int c = c0; c < c1; c++) {
                if (accumulate)
                    y[(size_t)c * ps + i] += tp[c];
                else
                    y[(size_t)c * ps + i] = tp[c];
            }
        }
    }
}
