/* RoPE, per-head RMSNorm and their tables (kernels/cpu/rope.h). */
#include "kernels/cpu/rope.h"

#include <math.h>

void ditd_cpu_rope(float *x, size_t ld, const float *cos, const float *sin, int B, int N, int H,
                   int Dh)
{
    int half = Dh / 2;
    long rows = (long)B * N;
#pragma omp parallel for schedule(static)
    for (long r = 0; r < rows; r++) {
        long n = r % N;
        const float *c = cos + n * half, *s = sin + n * half;
        float *row = x + (size_t)r * ld;
        for (int h = 0; h < H; h++) {
            float *v = row + (size_t)h * Dh;
            for (int i = 0; i < half; i++) {
                float a = v[2 * i], b = v[2 * i + 1];
                v[2 * i] = a * c[i] - b * s[i];
                v[2 * i + 1] = b * c[i] + a * s[i];
            }
        }
    }
}

void ditd_cpu_rope_table(const float *ids, int N, int n_axes, const int *dims, double theta,
                         float *cos_out, float *sin_out)
{
    int half = 0;
    for (int a = 0; a < n_axes; a++)
        half += dims[a] / 2;
    for (int n = 0; n < N; n++) {
        int j0 = 0;
        for (int a = 0; a < n_axes; a++) {
            double pos = (double)ids[(size_t)n * n_axes + a];
            for (int j = 0; j < dims[a] / 2; j++) {
                /* 1 / theta^(2j / dim), as torch: arange(0, dim, 2) / dim */
                double f = 1.0 / pow(theta, (double)(2 * j) / (double)dims[a]);
                double ang = pos * f;
                cos_out[(size_t)n * half + j0 + j] = (float)cos(ang);
                sin_out[(size_t)n * half + j0 + j] = (float)sin(ang);
            }
            j0 += dims[a] / 2;
        }
    }
}

void ditd_cpu_rmsnorm_heads(float *x, size_t ld, const float *w, int rows, int H, int Dh,
                            float eps)
{
#pragma omp parallel for schedule(static)
    for (long r = 0; r < (long)rows; r++) {
        float *row = x + (size_t)r * ld;
        for (int h = 0; h < H; h++) {
            float *v = row + (size_t)h * Dh;
            double ss = 0.0;
            for (int i = 0; i < Dh; i++)
                ss += (double)v[i] * v[i];
            float inv = (float)(1.0 / sqrt(ss / Dh + (double)eps));
            for (int i = 0; i < Dh; i++)
                v[i] = v[i] * inv * (w ? w[i] : 1.0f);
        }
    }
}

void ditd_cpu_row_sumsq(const float *x, size_t ld, int rows, int n, float *ss)
{
#pragma omp parallel for schedule(static)
    for (long r = 0; r < (long)rows; r++) {
        const float *v = x + (size_t)r * ld;
        double acc = 0.0;
        for (int j = 0; j < n; j++)
            acc += (double)v[j] * v[j];
        ss[r] = (float)acc;
    }
}

void ditd_cpu_rmsnorm_rows(float *x, size_t ld, const float *w, const float *ss, int rows, int n,
                           int n_total, float eps)
{
#pragma omp parallel for schedule(static)
    for (long r = 0; r < (long)rows; r++) {
        float *v = x + (size_t)r * ld;
        float inv = (float)(1.0 / sqrt((double)ss[r] / n_total + (double)eps));
        for (int j = 0; j < n; j++)
            v[j] = v[j] * inv * (w ? w[j] : 1.0f);
    }
}

void ditd_cpu_timestep_features(const float *t, float *out, int B, int dim, float shift)
{
    int half = dim / 2;
    for (int b = 0; b < B; b++) {
        for (int i = 0; i < half; i++) {
            float e = -logf(10000.0f) * (float)i / ((float)half - shift);
            float arg = t[b] * expf(e);
            out[(size_t)b * dim + i] = cosf(arg);
            out[(size_t)b * dim + half + i] = sinf(arg);
        }
    }
}
