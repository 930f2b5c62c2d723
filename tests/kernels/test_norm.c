/* LayerNorm (+ adaLN modulate), affine LayerNorm and the gated residual
 * against float64 references.
 *
 * Inputs carry a common offset (rows with mean ~ 3 and spread ~ 1), which is
 * where a one-pass variance would lose digits.
 * Tolerances (whole tensor, max|got - ref| / max|ref|):
 *   layernorm, modulate, affine: 1e-6; gated residual: 2e-7 (one fma).
 */
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/rope.h"
#include "tests/kernels/kt_common.h"

#include <string.h>

static void ref_ln_row(const float *x, int D, double eps, double *y)
{
    double s = 0.0;
    for (int j = 0; j < D; ++j)
        s += x[j];
    const double mu = s / D;
    double ss = 0.0;
    for (int j = 0; j < D; ++j)
        ss += (x[j] - mu) * (x[j] - mu);
    const double rstd = 1.0 / sqrt(ss / D + eps);
    for (int j = 0; j < D; ++j)
        y[j] = (x[j] - mu) * rstd;
}

static int check_modulate(kt_rng *rng, int B, int N, int D, int modulate, int in_place)
{
    const float eps = 1e-6f;
    const size_t n = (size_t)B * N * D, ld_mod = 6 * (size_t)D; /* fused (B, 6D) */
    float *x = kt_alloc(sizeof(float) * n);
    float *y = kt_alloc(sizeof(float) * n);
    float *mod = kt_alloc(sizeof(float) * (size_t)B * ld_mod);
    double *ref = kt_alloc(sizeof(double) * n);
    kt_fill(rng, x, n, 2.0f, 4.0f);
    kt_fill(rng, mod, (size_t)B * ld_mod, -1.0f, 1.0f);
    const float *shift = modulate ? mod + 0 * (size_t)D : NULL;
    const float *scale = modulate ? mod + 1 * (size_t)D : NULL;

    for (int b = 0; b < B; ++b)
        for (int i = 0; i < N; ++i) {
            const size_t r = (size_t)b * N + i;
            double *yr = ref + r * D;
            ref_ln_row(x + r * D, D, eps, yr);
            if (modulate)
                for (int j = 0; j < D; ++j)
                    yr[j] = yr[j] * (1.0 + (double)scale[(size_t)b * ld_mod + j]) +
                            (double)shift[(size_t)b * ld_mod + j];
        }
    float *out = y;
    if (in_place) {
        out = x;
        ditd_cpu_layernorm_modulate(x, x, B, N, D, eps, shift, scale, ld_mod);
    } else {
        ditd_cpu_layernorm_modulate(x, y, B, N, D, eps, shift, scale, ld_mod);
    }
    char what[160];
    snprintf(what, sizeof what, "layernorm%s B=%d N=%d D=%d%s", modulate ? "_modulate" : "",
             B, N, D, in_place ? " in place" : "");
    const int fail = kt_check(what, out, ref, n, 0.0, 1e-6);
    free(x);
    free(y);
    free(mod);
    free(ref);
    return fail;
}

static int check_affine(kt_rng *rng, int rows, int D, int with_g, int with_beta)
{
    const float eps = 1e-5f;
    const size_t n = (size_t)rows * D;
    float *x = kt_alloc(sizeof(float) * n);
    float *y = kt_alloc(sizeof(float) * n);
    float *g = kt_alloc(sizeof(float) * (size_t)D);
    float *beta = kt_alloc(sizeof(float) * (size_t)D);
    double *ref = kt_alloc(sizeof(double) * n);
    kt_fill(rng, x, n, -5.0f, 1.0f);
    kt_fill(rng, g, (size_t)D, 0.5f, 1.5f);
    kt_fill(rng, beta, (size_t)D, -1.0f, 1.0f);
    for (int r = 0; r < rows; ++r) {
        double *yr = ref + (size_t)r * D;
        ref_ln_row(x + (size_t)r * D, D, eps, yr);
        for (int j = 0; j < D; ++j)
            yr[j] = yr[j] * (with_g ? (double)g[j] : 1.0) + (with_beta ? (double)beta[j] : 0.0);
    }
    ditd_cpu_layernorm_affine(x, y, rows, D, eps, with_g ? g : NULL, with_beta ? beta : NULL);
    char what[160];
    snprintf(what, sizeof what, "layernorm_affine rows=%d D=%d g=%d beta=%d", rows, D, with_g,
             with_beta);
    const int fail = kt_check(what, y, ref, n, 0.0, 1e-6);
    free(x);
    free(y);
    free(g);
    free(beta);
    free(ref);
    return fail;
}

static int check_gated(kt_rng *rng, int B, int N, int D)
{
    const size_t n = (size_t)B * N * D, ld_gate = 6 * (size_t)D;
    float *h = kt_alloc(sizeof(float) * n);
    float *y = kt_alloc(sizeof(float) * n);
    float *mod = kt_alloc(sizeof(float) * (size_t)B * ld_gate);
    double *ref = kt_alloc(sizeof(double) * n);
    kt_fill(rng, h, n, -2.0f, 2.0f);
    kt_fill(rng, y, n, -2.0f, 2.0f);
    kt_fill(rng, mod, (size_t)B * ld_gate, -1.0f, 1.0f);
    const float *gate = mod + 2 * (size_t)D;
    for (size_t r = 0; r < (size_t)B * N; ++r)
        for (int j = 0; j < D; ++j)
            ref[r * D + j] = (double)h[r * D + j] +
                             (double)gate[(r / N) * ld_gate + j] * (double)y[r * D + j];
    ditd_cpu_gated_residual(h, y, B, N, D, gate, ld_gate);
    char what[160];
    snprintf(what, sizeof what, "gated_residual B=%d N=%d D=%d", B, N, D);
    const int fail = kt_check(what, h, ref, n, 0.0, 2e-7);
    free(h);
    free(y);
    free(mod);
    free(ref);
    return fail;
}

/* Wan's RMSNorm across heads (kernels/cpu/rope.h): rows of stride ld at
 * column off, against a float64 torch.nn.RMSNorm over n columns; then the
 * same rows split into `parts` column slices (tp ranks), each slice's
 * row_sumsq summed before rmsnorm_rows with n_total = n, as the Wan model
 * all-reduces them: equal to the whole row's norm. */
static int check_rms_rows(kt_rng *rng, int rows, int n, size_t ld, size_t off, int parts)
{
    const float eps = 1e-6f;
    const size_t nx = (size_t)rows * ld;
    float *x = kt_alloc(sizeof(float) * nx), *y = kt_alloc(sizeof(float) * nx);
    float *w = kt_alloc(sizeof(float) * (size_t)n), *ss = kt_alloc(sizeof(float) * (size_t)rows);
    float *part = kt_alloc(sizeof(float) * (size_t)rows);
    double *ref = kt_alloc(sizeof(double) * (size_t)rows * n);
    float *got = kt_alloc(sizeof(float) * (size_t)rows * n);
    kt_fill(rng, x, nx, -3.0f, 2.0f);
    kt_fill(rng, w, (size_t)n, 0.5f, 1.5f);
    for (int r = 0; r < rows; ++r) {
        const float *v = x + (size_t)r * ld + off;
        double acc = 0.0;
        for (int j = 0; j < n; ++j)
            acc += (double)v[j] * v[j];
        const double inv = 1.0 / sqrt(acc / n + eps);
        for (int j = 0; j < n; ++j)
            ref[(size_t)r * n + j] = (double)v[j] * inv * (double)w[j];
    }
    memcpy(y, x, sizeof(float) * nx);
    ditd_cpu_row_sumsq(y + off, ld, rows, n, ss);
    ditd_cpu_rmsnorm_rows(y + off, ld, w, ss, rows, n, n, eps);
    int untouched = 1;
    for (int r = 0; r < rows; ++r) {
        memcpy(got + (size_t)r * n, y + (size_t)r * ld + off, sizeof(float) * (size_t)n);
        for (size_t c = 0; c < ld; ++c)
            if ((c < off || c >= off + (size_t)n) && y[r * ld + c] != x[r * ld + c])
                untouched = 0;
    }
    char what[160];
    snprintf(what, sizeof what, "rmsnorm_rows rows=%d n=%d ld=%zu off=%zu", rows, n, ld, off);
    int fail = kt_check(what, got, ref, (size_t)rows * n, 0.0, 1e-6);
    if (!untouched) {
        printf("%s: wrote outside its columns\n", what);
        fail = 1;
    }
    /* the tp split: slices [c0, c0 + cn), their sums added, then each scaled */
    memcpy(y, x, sizeof(float) * nx);
    memset(ss, 0, sizeof(float) * (size_t)rows);
    for (int p = 0; p < parts; ++p) {
        const int c0 = n * p / parts, cn = n * (p + 1) / parts - c0;
        ditd_cpu_row_sumsq(y + off + c0, ld, rows, cn, part);
        for (int r = 0; r < rows; ++r)
            ss[r] += part[r];
    }
    for (int p = 0; p < parts; ++p) {
        const int c0 = n * p / parts, cn = n * (p + 1) / parts - c0;
        ditd_cpu_rmsnorm_rows(y + off + c0, ld, w + c0, ss, rows, cn, n, eps);
    }
    for (int r = 0; r < rows; ++r)
        memcpy(got + (size_t)r * n, y + (size_t)r * ld + off, sizeof(float) * (size_t)n);
    snprintf(what, sizeof what, "rmsnorm_rows rows=%d n=%d in %d slices (tp)", rows, n, parts);
    fail |= kt_check(what, got, ref, (size_t)rows * n, 0.0, 1e-6);
    free(x), free(y), free(w), free(ss), free(part), free(ref), free(got);
    return fail;
}

int main(void)
{
    kt_rng rng = {0x5eed0003u};
    int fail = 0;
    const int shapes[][3] = {{2, 49, 1152}, {1, 1, 8}, {3, 50, 72}, {2, 256, 1152}, {1, 7, 13}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; ++s) {
        const int B = shapes[s][0], N = shapes[s][1], D = shapes[s][2];
        fail |= check_modulate(&rng, B, N, D, 1, 0);
        fail |= check_modulate(&rng, B, N, D, 1, 1);
        fail |= check_modulate(&rng, B, N, D, 0, 0);
        fail |= check_affine(&rng, B * N, D, 1, 1);
        fail |= check_gated(&rng, B, N, D);
    }
    fail |= check_affine(&rng, 5, 64, 0, 1);
    fail |= check_affine(&rng, 5, 64, 1, 0);
    fail |= check_affine(&rng, 5, 64, 0, 0);
    fail |= check_rms_rows(&rng, 37, 32, 96, 32, 2);
    fail |= check_rms_rows(&rng, 5, 72, 72, 0, 3);
    fail |= check_rms_rows(&rng, 9, 5120, 3 * 5120 + 3, 5120, 4);
    fail |= check_rms_rows(&rng, 3, 7, 11, 1, 7);
    printf(fail ? "test_norm: FAILED\n" : "test_norm: ok\n");
    return fail;
}
