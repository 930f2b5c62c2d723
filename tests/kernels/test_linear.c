/* ditd_cpu_linear and ditd_cpu_act_apply against a float64 reference.
 *
 * Tolerances (whole-tensor max|got - ref| / max|ref|):
 *   linear, any activation: 2e-6 (fp32 sgemm over K <= 4608 random terms);
 *   activations alone, elementwise |got - ref| <= tol * max(|ref|, 1e-3) on
 *   inputs in [-30, 30]: SiLU 4e-7 (a few ulps), GELU 2e-6 (the float32
 *   argument u = sqrt(2/pi)(x + 0.044715x^3) carries its rounding into
 *   exp(-2u), amplified by |2u|; PyTorch's own fp32 GELU-tanh measures
 *   1.5e-4 by this metric near x = -5, where 1 + tanh(u) cancels).
 */
#include "kernels/cpu/cpu_kernels.h"
#include "tests/kernels/kt_common.h"

#include <string.h>

static double ref_act(double x, ditd_cpu_act act)
{
    switch (act) {
    case DITD_CPU_ACT_GELU_TANH: {
        /* PyTorch F.gelu(approximate='tanh') */
        const double k_beta = sqrt(2.0 / M_PI), k_kappa = 0.044715;
        return 0.5 * x * (1.0 + tanh(k_beta * (x + k_kappa * x * x * x)));
    }
    case DITD_CPU_ACT_SILU:
        return x / (1.0 + exp(-x));
    case DITD_CPU_ACT_NONE:
        break;
    }
    return x;
}

static const char *act_name(ditd_cpu_act act)
{
    return act == DITD_CPU_ACT_GELU_TANH ? "gelu_tanh" : act == DITD_CPU_ACT_SILU ? "silu" : "none";
}

static int check_linear(kt_rng *rng, int M, int N, int K, size_t pad_x, size_t pad_y,
                        int with_bias, ditd_cpu_act act)
{
    const size_t ldx = (size_t)K + pad_x, ldy = (size_t)N + pad_y;
    float *x = kt_alloc(sizeof(float) * (size_t)M * ldx);
    float *w = kt_alloc(sizeof(float) * (size_t)N * K);
    float *b = kt_alloc(sizeof(float) * (size_t)N);
    float *y = kt_alloc(sizeof(float) * (size_t)M * ldy);
    float *got = kt_alloc(sizeof(float) * (size_t)M * N);
    double *ref = kt_alloc(sizeof(double) * (size_t)M * N);
    kt_fill(rng, x, (size_t)M * ldx, -1.0f, 1.0f);
    /* Weights scaled like a trained layer (std ~ 1/sqrt(K)) so that the
     * activations see pre-activations of order 1, where they bend. */
    const float ws = 1.7f / sqrtf((float)K);
    kt_fill(rng, w, (size_t)N * K, -ws, ws);
    kt_fill(rng, b, (size_t)N, -0.5f, 0.5f);
    const float sentinel = 12345.0f;
    for (size_t i = 0; i < (size_t)M * ldy; ++i)
        y[i] = sentinel;

    ditd_cpu_linear(x, ldx, w, with_bias ? b : NULL, y, ldy, M, N, K, act);

    int fail = 0;
    for (int i = 0; i < M; ++i) {
        for (int j = 0; j < N; ++j) {
            double s = with_bias ? (double)b[j] : 0.0;
            for (int k = 0; k < K; ++k)
                s += (double)x[(size_t)i * ldx + k] * (double)w[(size_t)j * K + k];
            ref[(size_t)i * N + j] = ref_act(s, act);
            got[(size_t)i * N + j] = y[(size_t)i * ldy + j];
        }
        for (size_t j = (size_t)N; j < ldy; ++j)
            if (y[(size_t)i * ldy + j] != sentinel) {
                printf("    row %d: padding column %zu overwritten\n", i, j);
                fail = 1;
            }
    }
    char what[160];
    snprintf(what, sizeof what, "linear M=%d N=%d K=%d ldx=%zu ldy=%zu bias=%d %s", M, N, K,
             ldx, ldy, with_bias, act_name(act));
    fail |= kt_check(what, got, ref, (size_t)M * N, 0.0, 2e-6);
    free(x);
    free(w);
    free(b);
    free(y);
    free(got);
    free(ref);
    return fail;
}

static int check_act(kt_rng *rng, size_t n, ditd_cpu_act act)
{
    const double tol = act == DITD_CPU_ACT_GELU_TANH ? 2e-6 : 4e-7;
    float *y = kt_alloc(sizeof(float) * n);
    float *x = kt_alloc(sizeof(float) * n);
    kt_fill(rng, x, n, -30.0f, 30.0f);
    /* plus a few fixed points: tiny, moderate, and far in both tails */
    const float fixed[] = {1e-6f, -1e-6f, 0.5f, -0.5f, 3.0f, -3.0f, 10.0f, -10.0f, 87.0f, -87.0f, 100.0f, -100.0f};
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0] && i < n; ++i)
        x[i] = fixed[i];
    memcpy(y, x, sizeof(float) * n);
    ditd_cpu_act_apply(y, n, act);
    int fail = 0;
    double worst_rel = 0.0;
    for (size_t i = 0; i < n; ++i) {
        const double r = ref_act((double)x[i], act);
        const double e = fabs((double)y[i] - r);
        const double den = fabs(r) > 1e-3 ? fabs(r) : 1e-3;
        if (e / den > worst_rel)
            worst_rel = e / den;
        if (!(e <= tol * den)) {
            if (!fail)
                printf("    act %s at %zu: x=%.9g got %.9g ref %.17g\n", act_name(act), i,
                       (double)x[i], (double)y[i], r);
            fail = 1;
        }
    }
    printf("%-58s elementwise rel err %.3e (tol %.0e)%s\n", act_name(act), worst_rel, tol,
           fail ? "  FAIL" : "");
    free(x);
    free(y);
    return fail;
}

int main(void)
{
    kt_rng rng = {0x5eed0001u};
    int fail = 0;
    const ditd_cpu_act acts[] = {DITD_CPU_ACT_NONE, DITD_CPU_ACT_GELU_TANH, DITD_CPU_ACT_SILU};
    for (int a = 0; a < 3; ++a) {
        fail |= check_linear(&rng, 49, 50, 72, 0, 0, 1, acts[a]);
        fail |= check_linear(&rng, 1, 1, 1, 0, 0, 1, acts[a]);
        fail |= check_linear(&rng, 50, 33, 8, 3, 5, 0, acts[a]);
        fail |= check_linear(&rng, 2, 6912, 1152, 0, 0, 1, acts[a]);
    }
    fail |= check_linear(&rng, 64, 96, 4608, 0, 7, 1, DITD_CPU_ACT_NONE);
    fail |= check_linear(&rng, 130, 200, 1152, 16, 16, 1, DITD_CPU_ACT_GELU_TANH);
    fail |= check_linear(&rng, 0, 16, 16, 0, 0, 1, DITD_CPU_ACT_GELU_TANH); /* empty */
    for (int a = 0; a < 3; ++a) {
        fail |= check_act(&rng, 100003, acts[a]);
        fail |= check_act(&rng, 7, acts[a]);
    }
    printf(fail ? "test_linear: FAILED\n" : "test_linear: ok\n");
    return fail;
}
