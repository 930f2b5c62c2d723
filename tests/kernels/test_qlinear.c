/* Linear layers on quantized weights (kernels/cpu/linear_q.c, the packed
 * GEMM's dequantizing panels in gemm_packed.c), for every GGML type ditd
 * reads and the FP8 types (with random row scales), in f32 and bf16 compute:
 *
 *   - bit-identical to the same CPU path on the dequantized weights (the
 *     packed kernel on the dequantized, packed w; or, where the packed
 *     kernel does not run, e.g. DITD_CPU_GEMM=openblas, ditd_cpu_linear /
 *     ditd_cpu_linear_bf16 on them): the arithmetic is the same, so any
 *     difference is a wrong panel, block or k pass;
 *   - within 1e-5 relative of a float64 product of the same (dequantized,
 *     for bf16 rounded) operands.
 * Weights are random GGML blocks (random quants and scale bytes, finite
 * fp16 super-scales); shapes cut panels (N = 150: two full panels and a
 * tail of 22), k passes (K = 2304 > the f32 pass of 2048) and row blocks
 * (M = 40, 5, 1); bias and GELU/SiLU fused on some. A floor on the cases.
 */
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/dequant.h"
#include "tests/kernels/kt_common.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const struct {
    const char *name;
    int type;
    int f16_at[2]; /* byte offsets of the block's fp16 scales (-1: none) */
} g_types[] = {
    {"F32", DITD_Q_F32, {-1, -1}},   {"F16", DITD_Q_F16, {-1, -1}},
    {"BF16", DITD_Q_BF16, {-1, -1}}, {"Q4_0", DITD_Q_Q4_0, {0, -1}},
    {"Q4_1", DITD_Q_Q4_1, {0, 2}},   {"Q5_0", DITD_Q_Q5_0, {0, -1}},
    {"Q5_1", DITD_Q_Q5_1, {0, 2}},   {"Q8_0", DITD_Q_Q8_0, {0, -1}},
    {"Q2_K", DITD_Q_Q2_K, {80, 82}}, {"Q3_K", DITD_Q_Q3_K, {108, -1}},
    {"Q4_K", DITD_Q_Q4_K, {0, 2}},   {"Q5_K", DITD_Q_Q5_K, {0, 2}},
    {"Q6_K", DITD_Q_Q6_K, {208, -1}},
    {"F8_E4M3", DITD_Q_F8_E4M3, {-1, -1}}, {"F8_E5M2", DITD_Q_F8_E5M2, {-1, -1}},
};

static kt_rng g_rng = {0x5eed25};

/* A finite fp16 of magnitude ~2^-7 .. 2^-3. */
static uint16_t rand_f16(void)
{
    uint16_t e = (uint16_t)(8 + kt_next(&g_rng) % 5); /* biased exponent 8..12 */
    return (uint16_t)((kt_next(&g_rng) & 1) << 15 | e << 10 | (kt_next(&g_rng) & 0x3ff));
}

static uint8_t *rand_weight(int type, int f16_at[2], int N, int K, size_t *row_bytes)
{
    int elems, bytes;
    ditd_cpu_dequant_block(type, &elems, &bytes);
    *row_bytes = (size_t)(K / elems) * (size_t)bytes;
    size_t nb = *row_bytes * (size_t)N;
    uint8_t *w = kt_alloc(nb);
    for (size_t i = 0; i < nb; i++)
        w[i] = (uint8_t)kt_next(&g_rng);
    if (type == DITD_Q_F32) {
        float *f = (float *)w;
        kt_fill(&g_rng, f, nb / 4, -1.0f, 1.0f);
    } else if (ditd_cpu_dequant_is_fp8(type)) {
        /* finite 8-bit floats of magnitude ~2^-6 .. 2^1 (subnormals and
         * zeros included for E4M3's exponent 0) */
        const int e4 = type == DITD_Q_F8_E4M3;
        for (size_t i = 0; i < nb; i++) {
            unsigned e = e4 ? (unsigned)(kt_next(&g_rng) % 9) : 9u + (unsigned)(kt_next(&g_rng) % 8);
            unsigned m = (unsigned)kt_next(&g_rng) & (e4 ? 7u : 3u);
            w[i] = (uint8_t)((kt_next(&g_rng) & 1) << 7 | e << (e4 ? 3 : 2) | m);
        }
    } else if (type == DITD_Q_F16 || type == DITD_Q_BF16) {
        for (size_t i = 0; i < nb / 2; i++) {
            uint16_t h = type == DITD_Q_F16 ? rand_f16()
                                            : (uint16_t)(0x3c00u + (kt_next(&g_rng) & 0x3ff)) ^
                                                  (uint16_t)((kt_next(&g_rng) & 1) << 15);
            memcpy(w + 2 * i, &h, 2);
        }
    } else {
        for (size_t b = 0; b < nb / (size_t)bytes; b++)
            for (int s = 0; s < 2; s++)
                if (f16_at[s] >= 0) {
                    uint16_t h = rand_f16();
                    memcpy(w + b * (size_t)bytes + f16_at[s], &h, 2);
                }
    }
    return w;
}

static float bf16_val(float f)
{
    uint16_t h;
    ditd_cpu_f32_to_bf16(&f, &h, 1);
    float r;
    ditd_cpu_bf16_to_f32(&h, &r, 1);
    return r;
}

static double act_d(double v, ditd_cpu_act act)
{
    if (act == DITD_CPU_ACT_GELU_TANH)
        return 0.5 * v * (1.0 + tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)));
    if (act == DITD_CPU_ACT_SILU)
        return v / (1.0 + exp(-v));
    return v;
}

/* One case; returns 1 on failure. */
static int one_case(int ti, int bf16, int M, int N, int K, int with_bias, ditd_cpu_act act)
{
    int type = g_types[ti].type, f16_at[2] = {g_types[ti].f16_at[0], g_types[ti].f16_at[1]};
    size_t rb;
    uint8_t *wq = rand_weight(type, f16_at, N, K, &rb);
    const size_t ldx = (size_t)K + 3, ldy = (size_t)N + 5;
    float *x = kt_alloc((size_t)M * ldx * sizeof *x);
    kt_fill(&g_rng, x, (size_t)M * ldx, -1.0f, 1.0f);
    float *wd = kt_alloc((size_t)N * K * sizeof *wd);
    /* an FP8 weight's rows carry scales (as the checkpoints' weight_scale) */
    float *scale = NULL;
    if (ditd_cpu_dequant_is_fp8(type)) {
        scale = kt_alloc((size_t)N * sizeof *scale);
        kt_fill(&g_rng, scale, (size_t)N, 0.25f, 2.0f);
    }
    for (int n = 0; n < N; n++) {
        ditd_cpu_dequant(type, wq + (size_t)n * rb, wd + (size_t)n * K, (size_t)K);
        for (int k = 0; scale && k < K; k++)
            wd[(size_t)n * K + k] *= scale[n];
    }
    float bias_f[256];
    uint16_t bias_h[256];
    kt_fill(&g_rng, bias_f, (size_t)N, -0.5f, 0.5f);
    ditd_cpu_f32_to_bf16(bias_f, bias_h, (size_t)N);
    const void *b = !with_bias ? NULL : bf16 ? (const void *)bias_h : (const void *)bias_f;

    float *y = kt_alloc((size_t)M * ldy * sizeof *y), *y_ref = kt_alloc((size_t)M * ldy * sizeof *y);
    for (size_t i = 0; i < (size_t)M * ldy; i++)
        y[i] = y_ref[i] = 1234.5f;
    ditd_cpu_qweight qw = {.type = type, .N = N, .K = K, .row_bytes = rb, .data = wq,
                           .scale = scale};
    int rc = ditd_cpu_linear_q(x, ldx, &qw, b, bf16, y, ldy, M, act);

    /* the same path on the dequantized weight */
    void *wref;
    if (bf16) {
        uint16_t *wb = kt_alloc((size_t)N * K * 2);
        ditd_cpu_f32_to_bf16(wd, wb, (size_t)N * K);
        wref = wb;
    } else {
        wref = kt_alloc((size_t)N * K * 4);
        memcpy(wref, wd, (size_t)N * K * 4);
    }
    if (ditd_cpu_gemm_packs(bf16)) {
        ditd_cpu_pack_weight(wref, bf16, N, K);
        ditd_cpu_gemm_packed(x, ldx, wref, b, bf16, y_ref, ldy, M, N, K, act);
    } else if (bf16) {
        ditd_cpu_linear_bf16(x, ldx, wref, b, y_ref, ldy, M, N, K, act);
    } else {
        ditd_cpu_linear(x, ldx, wref, b, y_ref, ldy, M, N, K, act);
    }
    int same = rc == 0, first = -1;
    for (int m = 0; m < M && same; m++)
        for (int n = 0; n < N; n++)
            if (memcmp(&y[(size_t)m * ldy + n], &y_ref[(size_t)m * ldy + n], 4) != 0) {
                same = 0;
                first = m * N + n;
                break;
            }
    for (int m = 0; m < M; m++) /* y's padding untouched */
        for (size_t n = (size_t)N; n < ldy; n++)
            same &= y[(size_t)m * ldy + n] == 1234.5f;

    /* float64 of the same operands */
    double *y64 = kt_alloc((size_t)M * N * sizeof *y64);
    float *yd = kt_alloc((size_t)M * N * sizeof *yd);
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            double s = 0;
            for (int k = 0; k < K; k++) {
                float xv = x[(size_t)m * ldx + k], wv = wd[(size_t)n * K + k];
                if (bf16) {
                    xv = bf16_val(xv);
                    wv = bf16_val(wv);
                }
                s += (double)xv * wv;
            }
            if (with_bias)
                s += bf16 ? (double)bf16_val(bias_f[n]) : (double)bias_f[n];
            y64[(size_t)m * N + n] = act_d(s, act);
            yd[(size_t)m * N + n] = y[(size_t)m * ldy + n];
        }
    char what[128];
    snprintf(what, sizeof what, "%s %s M=%d N=%d K=%d%s%s", g_types[ti].name,
             bf16 ? "bf16" : "f32", M, N, K, with_bias ? " +b" : "",
             act == DITD_CPU_ACT_GELU_TANH ? " gelu" : act == DITD_CPU_ACT_SILU ? " silu" : "");
    int fail = kt_check(what, yd, y64, (size_t)M * N, 1e-3, 1e-5);
    if (!same) {
        printf("    FAIL: not bit-identical to the path on the dequantized weight (rc %d)", rc);
        if (first >= 0)
            printf(", first at (%d, %d): %.9g vs %.9g", first / N, first % N,
                   (double)y[(size_t)(first / N) * ldy + first % N],
                   (double)y_ref[(size_t)(first / N) * ldy + first % N]);
        printf("\n");
        fail = 1;
    }
    free(wq);
    free(scale);
    free(x);
    free(wd);
    free(y);
    free(y_ref);
    free(wref);
    free(y64);
    free(yd);
    return fail;
}

int main(void)
{
    printf("packed kernel: f32 %s, bf16 %s\n", ditd_cpu_gemm_packs(0) ? "yes" : "no",
           ditd_cpu_gemm_packs(1) ? "yes" : "no");
    int fails = 0, cases = 0;
    const int nt = (int)(sizeof g_types / sizeof *g_types);
    for (int ti = 0; ti < nt; ti++)
        for (int bf16 = 0; bf16 < 2; bf16++) {
            fails += one_case(ti, bf16, 40, 150, 2304, 1, DITD_CPU_ACT_NONE);
            fails += one_case(ti, bf16, 5, 64, 256, ti % 2, DITD_CPU_ACT_GELU_TANH);
            fails += one_case(ti, bf16, 1, 22, 512, 1, DITD_CPU_ACT_SILU);
            cases += 3;
        }
    printf("%d cases over %d types, %d failed\n", cases, nt, fails);
    if (cases < 15 * 2 * 3) {
        printf("FAIL: only %d cases\n", cases);
        return 1;
    }
    return fails ? 1 : 0;
}
