/* ditd_cpu_lora (kernels/cpu/lora.c) against a float64 reference:
 * y = act(y0 + s (x A^T) B^T) on strided rows, the activation after the
 * adapter's term, columns past N untouched, r = 0 and s = 0 the activation
 * alone. Tolerance: whole-tensor 2e-6 (fp32 sgemm over K <= 3072, then a
 * rank <= 64 product; GELU's own fp32 error, test_linear.c, is below it). */
#include "kernels/cpu/cpu_kernels.h"
#include "tests/kernels/kt_common.h"

static double ref_act(double x, ditd_cpu_act act)
{
    if (act == DITD_CPU_ACT_GELU_TANH)
        return 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
    if (act == DITD_CPU_ACT_SILU)
        return x / (1.0 + exp(-x));
    return x;
}

static int check(kt_rng *rng, int M, int N, int K, int r, size_t pad_x, size_t pad_y, float s,
                 ditd_cpu_act act)
{
    const size_t ldx = (size_t)K + pad_x, ldy = (size_t)N + pad_y;
    float *x = kt_alloc(sizeof(float) * (size_t)M * ldx);
    float *a = kt_alloc(sizeof(float) * (size_t)(r ? r : 1) * K);
    float *b = kt_alloc(sizeof(float) * (size_t)N * (r ? r : 1));
    float *y = kt_alloc(sizeof(float) * (size_t)M * ldy);
    float *tmp = kt_alloc(sizeof(float) * (size_t)M * (r ? r : 1));
    float *got = kt_alloc(sizeof(float) * (size_t)M * N);
    double *ref = kt_alloc(sizeof(double) * (size_t)M * N);
    kt_fill(rng, x, (size_t)M * ldx, -1.0f, 1.0f);
    kt_fill(rng, a, (size_t)(r ? r : 1) * K, -1.0f / sqrtf((float)K), 1.0f / sqrtf((float)K));
    kt_fill(rng, b, (size_t)N * (r ? r : 1), -0.3f, 0.3f);
    kt_fill(rng, y, (size_t)M * ldy, -2.0f, 2.0f);
    float *y0 = kt_alloc(sizeof(float) * (size_t)M * ldy);
    for (size_t i = 0; i < (size_t)M * ldy; i++)
        y0[i] = y[i];

    ditd_cpu_lora(x, ldx, a, b, s, y, ldy, M, N, K, r, tmp, act);

    int fail = 0;
    double *t = kt_alloc(sizeof(double) * (size_t)(r ? r : 1));
    for (int i = 0; i < M; i++) {
        for (int q = 0; q < r; q++) { /* (x A^T)[i, q] */
            t[q] = 0;
            for (int k = 0; k < K; k++)
                t[q] += (double)x[(size_t)i * ldx + k] * a[(size_t)q * K + k];
        }
        for (int j = 0; j < N; j++) {
            double v = y0[(size_t)i * ldy + j];
            for (int q = 0; q < r; q++)
                v += s * t[q] * b[(size_t)j * r + q];
            ref[(size_t)i * N + j] = ref_act(v, act);
            got[(size_t)i * N + j] = y[(size_t)i * ldy + j];
        }
        for (size_t j = (size_t)N; j < ldy; j++)
            if (y[(size_t)i * ldy + j] != y0[(size_t)i * ldy + j]) {
                printf("    row %d: column %zu past N changed\n", i, j);
                fail = 1;
            }
    }
    char what[160];
    snprintf(what, sizeof what, "lora M=%d N=%d K=%d r=%d ldx=%zu ldy=%zu s=%g act=%d", M, N, K,
             r, ldx, ldy, (double)s, (int)act);
    fail |= kt_check(what, got, ref, (size_t)M * N, 0.0, 2e-6);
    free(x), free(a), free(b), free(y), free(y0), free(tmp), free(got), free(ref), free(t);
    return fail;
}

int main(void)
{
    kt_rng rng = {0x5eed0026u};
    int fail = 0;
    const ditd_cpu_act acts[] = {DITD_CPU_ACT_NONE, DITD_CPU_ACT_GELU_TANH, DITD_CPU_ACT_SILU};
    for (int i = 0; i < 3; i++) {
        fail |= check(&rng, 49, 48, 48, 4, 0, 96, 1.0f, acts[i]);    /* to_q of a fused qkv */
        fail |= check(&rng, 130, 192, 48, 8, 5, 3, -0.5f, acts[i]);  /* fc1, strided */
        fail |= check(&rng, 2, 288, 48, 16, 0, 0, 2.0f, acts[i]);    /* adaLN rows */
        fail |= check(&rng, 17, 40, 24, 0, 0, 0, 1.0f, acts[i]);     /* act alone */
        fail |= check(&rng, 17, 40, 24, 4, 0, 0, 0.0f, acts[i]);     /* scale 0 */
    }
    fail |= check(&rng, 256, 3072, 3072, 64, 0, 0, 0.75f, DITD_CPU_ACT_NONE);
    printf(fail ? "test_lora_kernel: FAILED\n" : "test_lora_kernel: ok\n");
    return fail;
}
