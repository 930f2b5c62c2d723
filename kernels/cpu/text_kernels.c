/* CPU kernels for the text encoders: see text_kernels.h. */
#include "kernels/cpu/text_kernels.h"

#include <assert.h>
#include <cblas.h>
#include <float.h>
#include <math.h>
#include <string.h>

static inline float bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline float f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, u;
    if (exp == 0x1f) { /* inf, nan (payload kept) */
        u = sign | 0x7f800000u | (man << 13);
    } else if (exp != 0) {
        u = sign | ((exp + 112) << 23) | (man << 13);
    } else if (man == 0) {
        u = sign;
    } else { /* subnormal: normalise */
        int e = -1;
        do {
            man <<= 1;
            e++;
        } while (!(man & 0x400u));
        u = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3ffu) << 13);
    }
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Widens rows [r0, r0 + n) of a (rows, K) 16-bit matrix into dst (n, K). */
static void widen_rows(const void *w, ditd_cpu_wtype wt, size_t r0, int n, int K, float *dst)
{
    const uint16_t *src = (const uint16_t *)w + r0 * (size_t)K;
#pragma omp parallel for schedule(static)
    for (int r = 0; r < n; r++) {
        const uint16_t *s = src + (size_t)r * K;
        float *d = dst + (size_t)r * K;
        if (wt == DITD_CPU_W_BF16)
            for (int c = 0; c < K; c++)
                d[c] = bf16_to_f32(s[c]);
        else
            for (int c = 0; c < K; c++)
                d[c] = f16_to_f32(s[c]);
    }
}

static inline float act1(float x, ditd_cpu_tact act)
{
    switch (act) {
    case DITD_CPU_TACT_GELU:
        return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
    case DITD_CPU_TACT_GELU_TANH:
        return 0.5f * x * (1.0f + tanhf(0.79788456080286536f * (x + 0.044715f * x * x * x)));
    case DITD_CPU_TACT_QUICK_GELU:
        return x / (1.0f + expf(-1.702f * x));
    case DITD_CPU_TACT_RELU:
        return x > 0.0f ? x : 0.0f;
    case DITD_CPU_TACT_NONE:
        break;
    }
    return x;
}

void ditd_cpu_tact_apply(float *y, size_t ldy, int rows, int cols, ditd_cpu_tact act)
{
    if (act == DITD_CPU_TACT_NONE)
        return;
#pragma omp parallel for schedule(static)
    for (int r = 0; r < rows; r++) {
        float *row = y + (size_t)r * ldy;
        for (int c = 0; c < cols; c++)
            row[c] = act1(row[c], act);
    }
}

/* y[r, c] = act(y[r, c] + b[c]) over a block of columns. */
static void bias_act(float *y, size_t ldy, int rows, int cols, const float *b, ditd_cpu_tact act)
{
    if (!b) {
        ditd_cpu_tact_apply(y, ldy, rows, cols, act);
        return;
    }
#pragma omp parallel for schedule(static)
    for (int r = 0; r < rows; r++) {
        float *row = y + (size_t)r * ldy;
        for (int c = 0; c < cols; c++)
            row[c] = act1(row[c] + b[c], act);
    }
}

void ditd_cpu_linear_wt(const float *x, size_t ldx, const void *w, ditd_cpu_wtype wt,
                        const float *b, float *y, size_t ldy, int M, int N, int K,
                        ditd_cpu_tact act, float *scratch, size_t scratch_len)
{
    assert(M >= 0 && N >= 0 && K > 0 && ldx >= (size_t)K && ldy >= (size_t)N);
    if (M == 0 || N == 0)
        return;
    if (wt == DITD_CPU_W_F32) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, x, (int)ldx,
                    (const float *)w, K, 0.0f, y, (int)ldy);
    } else {
        assert(scratch && scratch_len >= (size_t)K);
        size_t panel = scratch_len / (size_t)K;
        for (size_t n0 = 0; n0 < (size_t)N; n0 += panel) {
            int n = (int)((size_t)N - n0 < panel ? (size_t)N - n0 : panel);
            widen_rows(w, wt, n0, n, K, scratch);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, n, K, 1.0f, x, (int)ldx,
                        scratch, K, 0.0f, y + n0, (int)ldy);
        }
    }
    bias_act(y, ldy, M, N, b, act);
}

void ditd_cpu_mul(float *y, const float *x, size_t n)
{
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++)
        y[i] *= x[i];
}

void ditd_cpu_embedding_wt(const void *table, ditd_cpu_wtype wt, const int64_t *ids,
                           float *out, int n, int D)
{
    for (int i = 0; i < n; i++) {
        float *d = out + (size_t)i * D;
        if (wt == DITD_CPU_W_F32) {
            memcpy(d, (const float *)table + (size_t)ids[i] * D, (size_t)D * sizeof(float));
            continue;
        }
        const uint16_t *s = (const uint16_t *)table + (size_t)ids[i] * D;
        for (int c = 0; c < D; c++)
            d[c] = wt == DITD_CPU_W_BF16 ? bf16_to_f32(s[c]) : f16_to_f32(s[c]);
    }
}

void ditd_cpu_rmsnorm(const float *x, float *y, int rows, int D, float eps, const float *w)
{
#pragma omp parallel for schedule(static)
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * D;
        float *yr = y + (size_t)r * D;
        double ss = 0.0;
        for (int c = 0; c < D; c++)
            ss += (double)xr[c] * xr[c];
        float inv = (float)(1.0 / sqrt(ss / D + (double)eps));
        for (int c = 0; c < D; c++)
            yr[c] = w[c] * (xr[c] * inv);
    }
}

void ditd_cpu_attention_masked(const float *q, size_t ldq, const float *k, size_t ldk,
                               const float *v, size_t ldv, float *o, size_t ldo, int B, int N,
                               int H, int Dh, float scale, const float *rel,
                               const uint8_t *keep, int causal, float *scratch)
{
    assert(N > 0 && N <= DITD_CPU_MASKED_ATTN_MAX_N && H > 0 && Dh > 0 && scratch);
    const size_t R = 2 * (size_t)N - 1;
    float *S = scratch; /* (N, N) scores, then probabilities */
    for (int b = 0; b < B; b++) {
        const uint8_t *kp = keep ? keep + (size_t)b * N : NULL;
        for (int h = 0; h < H; h++) {
            const size_t row0 = (size_t)b * N, col = (size_t)h * Dh;
            // S = scale * Q_h K_h^T, (N, N)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, N, Dh, scale,
                        q + row0 * ldq + col, (int)ldq, k + row0 * ldk + col, (int)ldk, 0.0f, S, N);
#pragma omp parallel for schedule(static)
            for (int i = 0; i < N; i++) {
                float *s = S + (size_t)i * N;
                const float *rb = rel ? rel + (size_t)h * R + (size_t)(N - 1 - i) : NULL;
                float mx = -FLT_MAX;
                for (int j = 0; j < N; j++) {
                    if ((causal && j > i) || (kp && !kp[j]))
                        s[j] = -FLT_MAX;
                    else if (rb)
                        s[j] += rb[j];
                    if (s[j] > mx)
                        mx = s[j];
                }
                float sum = 0.0f;
                for (int j = 0; j < N; j++) {
                    s[j] = expf(s[j] - mx);
                    sum += s[j];
                }
                const float inv = 1.0f / sum;
                for (int j = 0; j < N; j++)
                    s[j] *= inv;
            }
            // O_h = P V_h, (N, Dh) into rows of o
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, Dh, N, 1.0f, S, N,
                        v + row0 * ldv + col, (int)ldv, 0.0f, o + row0 * ldo + col, (int)ldo);
        }
    }
}
