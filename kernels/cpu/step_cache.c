/* CPU kernels of step caching: per-row statistics and y = a x + b y. */
#include "kernels/cpu/step_cache.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

void ditd_cpu_row_diff_stats(const float *a, const float *b, int rows, int D, double *out)
{
#pragma omp parallel for schedule(static)
    for (int r = 0; r < rows; r++) {
        const float *pa = a + (size_t)r * (size_t)D;
        const float *pb = b ? b + (size_t)r * (size_t)D : NULL;
        double l1d = 0.0, l1b = 0.0, qa = 0.0, qb = 0.0;
        for (int i = 0; i < D; i++) {
            const double va = pa[i];
            qa += va * va;
            if (pb) {
                const double vb = pb[i];
                l1d += fabs(va - vb);
                l1b += fabs(vb);
                qb += vb * vb;
            }
        }
        out[4 * (size_t)r + 0] = l1d;
        out[4 * (size_t)r + 1] = l1b;
        out[4 * (size_t)r + 2] = qa;
        out[4 * (size_t)r + 3] = qb;
    }
}

/* float -> bfloat16 -> float, nearest-even (NaN kept a NaN) */
static float round_bf16(float v)
{
    uint32_t u;
    memcpy(&u, &v, 4);
    if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu)) {
        u |= 0x00400000u;
    } else {
        u += 0x7fffu + ((u >> 16) & 1u);
    }
    u &= 0xffff0000u;
    memcpy(&v, &u, 4);
    return v;
}

void ditd_cpu_axpby(float *y, const float *x, float a, float b, size_t n, int round)
{
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        float v = x ? a * x[i] + b * y[i] : b * y[i];
        y[i] = round ? round_bf16(v) : v;
    }
}
