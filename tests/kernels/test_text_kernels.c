/* The text-encoder kernels (kernels/cpu/text_kernels.c) against float64
 * references written here, on fresh seeded inputs: the 16-bit-weight linear
 * over several widening panels (f32, f16, bf16 weights, strided rows, bias,
 * every activation), the masked attention with a relative bias, causal and
 * padding masks (a fully masked row included), RMSNorm, and the embedding
 * gather from 16-bit tables. Bound: relative 1e-5 (max error over max |ref|). */
#include <float.h>
#include <string.h>
#include <time.h>

#include "kernels/cpu/text_kernels.h"
#include "tests/kernels/kt_common.h"

static int fails;

static uint16_t to_bf16(float f) /* round to nearest even */
{
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static float from_bf16(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* f32 -> f16 for values in the normal range and zero (the test's inputs),
 * round to nearest even; and back, exactly, with the reference formula. */
static uint16_t to_f16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000u;
    int e = (int)((u >> 23) & 0xff) - 127 + 15;
    uint32_t man = u & 0x7fffffu;
    if (e <= 0)
        return (uint16_t)sign;
    uint32_t h = sign | ((uint32_t)e << 10) | (man >> 13);
    uint32_t rest = man & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u)))
        h++;
    return (uint16_t)h;
}

static double from_f16(uint16_t h)
{
    int e = (h >> 10) & 0x1f, m = h & 0x3ff;
    double v = e ? ldexp(1.0 + m / 1024.0, e - 15) : ldexp(m / 1024.0, -14);
    return (h & 0x8000) ? -v : v;
}

static double act_ref(double x, ditd_cpu_tact a)
{
    switch (a) {
    case DITD_CPU_TACT_GELU: return 0.5 * x * (1.0 + erf(x / sqrt(2.0)));
    case DITD_CPU_TACT_GELU_TANH:
        return 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
    case DITD_CPU_TACT_QUICK_GELU: return x / (1.0 + exp(-1.702 * x));
    case DITD_CPU_TACT_RELU: return x > 0 ? x : 0;
    case DITD_CPU_TACT_NONE: break;
    }
    return x;
}

static void test_linear(kt_rng *r, ditd_cpu_wtype wt, int M, int N, int K, size_t ldx, size_t ldy,
                        int bias, ditd_cpu_tact act, size_t scratch_rows)
{
    float *x = kt_alloc((size_t)M * ldx * sizeof(float));
    float *wf = kt_alloc((size_t)N * K * sizeof(float));
    uint16_t *wh = kt_alloc((size_t)N * K * sizeof(uint16_t));
    double *wd = kt_alloc((size_t)N * K * sizeof(double));
    float *b = kt_alloc((size_t)N * sizeof(float));
    float *y = kt_alloc((size_t)M * ldy * sizeof(float));
    float *got = kt_alloc((size_t)M * N * sizeof(float));
    double *ref = kt_alloc((size_t)M * N * sizeof(double));
    size_t slen = scratch_rows * (size_t)K;
    float *scratch = kt_alloc(slen * sizeof(float));
    kt_fill(r, x, (size_t)M * ldx, -1.0f, 1.0f);
    kt_fill(r, wf, (size_t)N * K, -0.5f, 0.5f);
    kt_fill(r, b, (size_t)N, -0.3f, 0.3f);
    for (size_t i = 0; i < (size_t)N * K; i++) {
        if (wt == DITD_CPU_W_BF16) {
            wh[i] = to_bf16(wf[i]);
            wd[i] = from_bf16(wh[i]);
        } else if (wt == DITD_CPU_W_F16) {
            wh[i] = to_f16(wf[i]);
            wd[i] = from_f16(wh[i]);
        } else {
            wd[i] = wf[i];
        }
    }
    for (size_t i = 0; i < (size_t)M * ldy; i++)
        y[i] = 7.0f; /* columns past N must stay */
    ditd_cpu_linear_wt(x, ldx, wt == DITD_CPU_W_F32 ? (const void *)wf : (const void *)wh, wt,
                       bias ? b : NULL, y, ldy, M, N, K, act, scratch, slen);
    int kept = 1;
    for (int i = 0; i < M; i++) {
        for (int n = 0; n < N; n++) {
            double s = bias ? b[n] : 0.0;
            for (int k = 0; k < K; k++)
                s += (double)x[(size_t)i * ldx + k] * wd[(size_t)n * K + k];
            ref[(size_t)i * N + n] = act_ref(s, act);
            got[(size_t)i * N + n] = y[(size_t)i * ldy + n];
        }
        for (size_t n = (size_t)N; n < ldy; n++)
            kept &= y[(size_t)i * ldy + n] == 7.0f;
    }
    char what[160];
    snprintf(what, sizeof what, "linear_wt w%d M=%d N=%d K=%d ldy=%zu bias=%d act=%d panel=%zu", (int)wt,
             M, N, K, ldy, bias, (int)act, scratch_rows);
    fails += kt_check(what, got, ref, (size_t)M * N, 1e-3, 1e-5);
    if (!kept) {
        fprintf(stderr, "FAIL %s: wrote past N in a strided row\n", what);
        fails++;
    }
    free(x), free(wf), free(wh), free(wd), free(b), free(y), free(got), free(ref), free(scratch);
}

static void test_attention(kt_rng *r, int B, int N, int H, int Dh, int use_rel, int causal,
                           int use_keep, float scale)
{
    size_t ld = 3 * (size_t)H * Dh + 5, ldo = (size_t)H * Dh + 3;
    float *qkv = kt_alloc((size_t)B * N * ld * sizeof(float));
    float *o = kt_alloc((size_t)B * N * ldo * sizeof(float));
    float *rel = kt_alloc((size_t)H * (2 * N - 1) * sizeof(float));
    uint8_t *keep = kt_alloc((size_t)B * N);
    float *got = kt_alloc((size_t)B * N * H * Dh * sizeof(float));
    double *ref = kt_alloc((size_t)B * N * H * Dh * sizeof(double));
    double *p = kt_alloc((size_t)N * sizeof(double));
    kt_fill(r, qkv, (size_t)B * N * ld, -1.5f, 1.5f);
    kt_fill(r, rel, (size_t)H * (2 * N - 1), -2.0f, 2.0f);
    for (int b = 0; b < B; b++)
        for (int j = 0; j < N; j++) /* b = 1: only the last half attends; b = 2: none */
            keep[(size_t)b * N + j] = b == 0 || (b == 1 && j >= N / 2);
    const float *q = qkv, *k = qkv + (size_t)H * Dh, *v = qkv + 2 * (size_t)H * Dh;
    float *scratch = kt_alloc((size_t)N * N * sizeof(float));
    ditd_cpu_attention_masked(q, ld, k, ld, v, ld, o, ldo, B, N, H, Dh, scale, use_rel ? rel : NULL,
                              use_keep ? keep : NULL, causal, scratch);
    free(scratch);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int i = 0; i < N; i++) {
                double mx = -INFINITY, sum = 0;
                int any = 0;
                for (int j = 0; j < N; j++) {
                    int masked = (causal && j > i) || (use_keep && !keep[(size_t)b * N + j]);
                    double s = 0;
                    for (int d = 0; d < Dh; d++)
                        s += (double)q[((size_t)b * N + i) * ld + (size_t)h * Dh + d] *
                             k[((size_t)b * N + j) * ld + (size_t)h * Dh + d];
                    s = scale * s + (use_rel ? rel[(size_t)h * (2 * N - 1) + (size_t)(j - i + N - 1)] : 0);
                    p[j] = masked ? -INFINITY : s;
                    any |= !masked;
                    if (p[j] > mx)
                        mx = p[j];
                }
                for (int j = 0; j < N; j++) { /* a fully masked row: uniform, as + finfo.min */
                    p[j] = any ? exp(p[j] - mx) : 1.0;
                    sum += p[j];
                }
                for (int d = 0; d < Dh; d++) {
                    double acc = 0;
                    for (int j = 0; j < N; j++)
                        acc += p[j] / sum * v[((size_t)b * N + j) * ld + (size_t)h * Dh + d];
                    size_t at = (((size_t)b * N + i) * H + h) * Dh + d;
                    ref[at] = acc;
                    got[at] = o[((size_t)b * N + i) * ldo + (size_t)h * Dh + d];
                }
            }
    char what[160];
    snprintf(what, sizeof what, "attention_masked B=%d N=%d H=%d Dh=%d rel=%d causal=%d keep=%d", B, N, H,
             Dh, use_rel, causal, use_keep);
    fails += kt_check(what, got, ref, (size_t)B * N * H * Dh, 1e-3, 1e-5);
    free(qkv), free(o), free(rel), free(keep), free(got), free(ref), free(p);
}

static void test_rmsnorm(kt_rng *r, int rows, int D)
{
    float *x = kt_alloc((size_t)rows * D * sizeof(float)), *w = kt_alloc((size_t)D * sizeof(float));
    float *y = kt_alloc((size_t)rows * D * sizeof(float));
    double *ref = kt_alloc((size_t)rows * D * sizeof(double));
    kt_fill(r, x, (size_t)rows * D, -3.0f, 3.0f);
    kt_fill(r, w, (size_t)D, 0.5f, 1.5f);
    for (int i = 0; i < rows; i++) {
        double ss = 0;
        for (int c = 0; c < D; c++)
            ss += (double)x[(size_t)i * D + c] * x[(size_t)i * D + c];
        for (int c = 0; c < D; c++)
            ref[(size_t)i * D + c] = w[c] * x[(size_t)i * D + c] / sqrt(ss / D + 1e-6);
    }
    ditd_cpu_rmsnorm(x, y, rows, D, 1e-6f, w);
    fails += kt_check("rmsnorm", y, ref, (size_t)rows * D, 1e-3, 1e-5);
    ditd_cpu_rmsnorm(x, x, rows, D, 1e-6f, w); /* in place */
    fails += kt_check("rmsnorm in place", x, ref, (size_t)rows * D, 1e-3, 1e-5);
    free(x), free(w), free(y), free(ref);
}

static void test_embedding(kt_rng *r)
{
    enum { V = 37, D = 13, n = 9 };
    float t[V * D], out[n * D];
    uint16_t th[V * D];
    double ref[n * D];
    int64_t ids[n];
    kt_fill(r, t, V * D, -4.0f, 4.0f);
    for (int i = 0; i < n; i++)
        ids[i] = (int64_t)(kt_next(r) % V);
    for (int wt = 0; wt < 3; wt++) {
        for (int i = 0; i < V * D; i++)
            th[i] = wt == DITD_CPU_W_BF16 ? to_bf16(t[i]) : to_f16(t[i]);
        for (int i = 0; i < n; i++)
            for (int c = 0; c < D; c++) {
                size_t s = (size_t)ids[i] * D + c;
                ref[i * D + c] = wt == DITD_CPU_W_F32 ? t[s] : wt == DITD_CPU_W_BF16 ? from_bf16(th[s]) : from_f16(th[s]);
            }
        ditd_cpu_embedding_wt(wt == DITD_CPU_W_F32 ? (const void *)t : (const void *)th, (ditd_cpu_wtype)wt, ids,
                              out, n, D);
        /* widening is exact */
        fails += kt_check(wt == 0 ? "embedding f32" : wt == 1 ? "embedding f16" : "embedding bf16", out, ref,
                          n * D, 1.0, 0.0);
    }
}

int main(void)
{
    const char *env = getenv("DITD_TEST_SEED");
    uint64_t seed = env ? strtoull(env, NULL, 10) : (uint64_t)time(NULL);
    printf("seed %llu (DITD_TEST_SEED replays)\n", (unsigned long long)seed);
    kt_rng r = {seed};
    int tests = 0;
    for (int wt = 0; wt < 3; wt++)
        for (int a = 0; a <= DITD_CPU_TACT_RELU; a++, tests++)
            /* N = 70 over panels of 16 rows: 5 panels, the last partial */
            test_linear(&r, (ditd_cpu_wtype)wt, 9, 70, 48, 48, 70 + (a % 2) * 5, a % 2, (ditd_cpu_tact)a, 16);
    test_linear(&r, DITD_CPU_W_BF16, 33, 300, 64, 70, 301, 1, DITD_CPU_TACT_NONE, DITD_CPU_WT_PANEL);
    test_linear(&r, DITD_CPU_W_F16, 5, 3, 20, 20, 3, 0, DITD_CPU_TACT_GELU, 1); /* one row per panel */
    tests += 2;
    for (int c = 0; c < 8; c++, tests++)
        test_attention(&r, 3, 11, 3, 7, c & 1, (c >> 1) & 1, (c >> 2) & 1, c & 1 ? 1.0f : 0.377f);
    test_attention(&r, 1, 77, 5, 16, 0, 1, 0, 0.25f);
    tests++;
    test_rmsnorm(&r, 7, 33);
    test_embedding(&r);
    tests += 3;
    /* f16 widening of the edge cases: subnormals, the largest, inf, -0 */
    {
        const uint16_t h[6] = {0x0001, 0x03ff, 0x8200, 0x7bff, 0x7c00, 0x8000};
        const double want[6] = {ldexp(1, -24), ldexp(1023, -24), -ldexp(512, -24), 65504.0, INFINITY, -0.0};
        int64_t id0 = 0;
        float got[6];
        ditd_cpu_embedding_wt(h, DITD_CPU_W_F16, &id0, got, 1, 6);
        int bad = 0;
        for (int i = 0; i < 6; i++)
            bad += (double)got[i] != want[i] || !signbit(got[i]) != !signbit(want[i]);
        printf("f16 edge cases: %d wrong\n", bad);
        fails += bad != 0;
        tests++;
    }
    printf("%d kernel cases, %d failed\n", tests, fails);
    return fails ? 1 : tests < 30;
}
