/* Timestep and 2-D positional embeddings against values computed with
 * Diffusers, and against float64 references.
 *
 * The hardcoded values below were produced with diffusers 0.42.1 and torch
 * 2.15.0 (CPU) by:
 *   get_timestep_embedding(torch.tensor([0., 1., 17.5, 250., 999.]), 256,
 *                          flip_sin_to_cos=True, downscale_freq_shift=1)
 *   get_2d_sincos_pos_embed(D, (gh, gw), base_size=base,
 *                           interpolation_scale=interp, output_type="pt").float()
 * printed with "%.9g".
 *
 * Tolerances, per element:
 *   timestep vs Diffusers: |t| f_i 2^-22 + 2^-23. The frequency f_i is a
 *     float32 exp; torch's vectorized exp and libm's correctly rounded expf
 *     differ by one ulp for some i (i = 4 at dim 256), and t * f_i carries
 *     that ulp into the argument: up to 6e-5 at t = 999. Elsewhere the match
 *     is within an ulp.
 *   timestep vs float64: |t| f_i (2 + |e_i|) 2^-22 + 2^-22, e_i the exponent
 *     (float32 rounding of exponent, frequency and argument, propagated).
 *   pos embed vs Diffusers: 1.2e-7 (one float ulp at 1; exact in practice).
 *   pos embed vs float64 (exact grid coordinate g): g omega_i 2^-22 + 2^-23
 *     (Diffusers rounds g to float32 before the float64 sin/cos).
 */
#include "kernels/cpu/cpu_kernels.h"
#include "tests/kernels/kt_common.h"

#include <string.h>

typedef struct entry {
    int row, col;
    float value;
} entry;

static const float ts_t[5] = {0.0f, 1.0f, 17.5f, 250.0f, 999.0f};
static const entry ts_diffusers[] = {
    {1, 0, 0.540302336f}, {1, 1, 0.59779793f}, {1, 4, 0.732916951f}, {1, 37, 0.997666061f},
    {1, 64, 0.999953508f}, {1, 127, 1.0f}, {1, 128, 0.841470957f}, {1, 129, 0.801646829f},
    {1, 132, 0.680318117f}, {1, 165, 0.0682822168f}, {1, 192, 0.00964373443f}, {1, 255, 9.99999902e-05f},
    {2, 0, 0.219439968f}, {2, 1, -0.843073189f}, {2, 4, 0.864284396f}, {2, 37, 0.36620459f},
    {2, 64, 0.985792458f}, {2, 127, 0.99999845f}, {2, 128, -0.975625992f}, {2, 129, -0.537798882f},
    {2, 132, 0.503003478f}, {2, 165, 0.930534363f}, {2, 192, 0.16796796f}, {2, 255, 0.00174999889f},
    {3, 0, 0.240988299f}, {3, 1, 0.999443114f}, {3, 4, 0.124065176f}, {3, 37, -0.193680748f},
    {3, 64, -0.744759798f}, {3, 127, 0.999687493f}, {3, 128, -0.970528007f}, {3, 129, 0.0333679095f},
    {3, 132, -0.992274046f}, {3, 165, -0.981064618f}, {3, 192, 0.667332649f}, {3, 255, 0.0249973927f},
    {4, 0, 0.999649823f}, {4, 1, 0.699215829f}, {4, 4, 0.968757272f}, {4, 37, 0.661500096f},
    {4, 64, -0.978142917f}, {4, 127, 0.995014131f}, {4, 128, -0.0264607519f}, {4, 129, -0.714910626f},
    {4, 132, -0.24801071f}, {4, 165, -0.749945104f}, {4, 192, -0.207933873f}, {4, 255, 0.0997339115f},
};

typedef struct pos_case {
    int D, gh, gw, base;
    float interp;
    entry e[6]; /* {token, channel, value} */
} pos_case;

static const pos_case pos_diffusers[] = {
    {1152, 16, 16, 16, 1.0f, {{255, 1151, 0.999998808f}, {1, 1, 0.824051321f},
                              {16, 577, 0.824051321f}, {131, 290, -0.946860075f},
                              {254, 865, -0.380851746f}, {17, 575, 1.0f}}},
    {64, 24, 10, 10, 1.0f, {{239, 63, 0.999998569f}, {1, 1, 0.533168435f},
                            {10, 33, 0.232170805f}, {123, 18, 0.582753599f},
                            {238, 49, 0.626235485f}, {11, 31, 1.0f}}},
    {32, 7, 5, 16, 1.5f, {{34, 31, 0.999995828f}, {1, 1, 0.624600053f},
                          {5, 17, 0.463437825f}, {20, 10, 1.0f},
                          {33, 25, -0.968821526f}, {6, 15, 0.999999762f}}},
    {48, 12, 20, 16, 0.7f, {{239, 47, 0.999989808f}, {1, 1, 0.505936503f},
                            {20, 25, 0.773352444f}, {123, 14, 0.739369154f},
                            {238, 37, -0.955201685f}, {21, 23, 0.99999994f}}},
};

static int check_timestep_diffusers(void)
{
    const int dim = 256, half = dim / 2;
    float out[5 * 256];
    ditd_cpu_timestep_embed(ts_t, out, 5, dim);
    int fail = 0;
    double worst = 0.0;
    /* t = 0: cos = 1, sin = 0 exactly. */
    for (int i = 0; i < dim; ++i)
        if (out[i] != (i < half ? 1.0f : 0.0f)) {
            printf("    timestep t=0 [%d]: got %.9g\n", i, (double)out[i]);
            fail = 1;
        }
    for (size_t n = 0; n < sizeof ts_diffusers / sizeof ts_diffusers[0]; ++n) {
        const entry e = ts_diffusers[n];
        const int i = e.col % half;
        const double f = exp(-log(10000.0) * i / (half - 1));
        const double tol = fabs((double)ts_t[e.row]) * f * 0x1p-22 + 0x1p-23;
        const double got = out[(size_t)e.row * dim + e.col];
        const double err = fabs(got - (double)e.value);
        if (err > worst)
            worst = err;
        if (!(err <= tol)) {
            printf("    timestep t=%g [%d]: got %.9g, diffusers %.9g (tol %.2e)\n",
                   (double)ts_t[e.row], e.col, got, (double)e.value, tol);
            fail = 1;
        }
    }
    printf("%-58s max abs err %.3e%s\n", "timestep_embed dim=256 vs diffusers", worst,
           fail ? "  FAIL" : "");
    return fail;
}

static int check_timestep_f64(kt_rng *rng, int B, int dim)
{
    const int half = dim / 2;
    float *t = kt_alloc(sizeof(float) * (size_t)B);
    float *out = kt_alloc(sizeof(float) * (size_t)B * dim);
    kt_fill(rng, t, (size_t)B, 0.0f, 1000.0f);
    t[0] = 999.0f;
    ditd_cpu_timestep_embed(t, out, B, dim);
    int fail = 0;
    double worst = 0.0;
    for (int b = 0; b < B; ++b)
        for (int i = 0; i < half; ++i) {
            const double e = -log(10000.0) * i / (half - 1);
            const double f = exp(e);
            const double arg = (double)t[b] * f;
            const double tol = fabs((double)t[b]) * f * (2.0 + fabs(e)) * 0x1p-22 + 0x1p-22;
            const double rc = cos(arg), rs = sin(arg);
            const double gc = out[(size_t)b * dim + i], gs = out[(size_t)b * dim + half + i];
            const double err = fmax(fabs(gc - rc), fabs(gs - rs));
            if (err / tol > worst)
                worst = err / tol;
            if (!(err <= tol) && !fail) {
                printf("    timestep t=%.9g i=%d: got (%.9g, %.9g), ref (%.17g, %.17g), tol %.2e\n",
                       (double)t[b], i, gc, gs, rc, rs, tol);
                fail = 1;
            }
        }
    char what[120];
    snprintf(what, sizeof what, "timestep_embed B=%d dim=%d vs float64", B, dim);
    printf("%-58s max err/tol %.3f%s\n", what, worst, fail ? "  FAIL" : "");
    free(t);
    free(out);
    return fail;
}

static int check_pos(const pos_case *pc)
{
    const int D = pc->D, gh = pc->gh, gw = pc->gw, N = gh * gw, Q = D / 4;
    float *out = kt_alloc(sizeof(float) * (size_t)N * D);
    ditd_cpu_pos_embed_2d(out, D, gh, gw, pc->base, pc->interp);
    int fail = 0;
    double worst = 0.0;
    for (int n = 0; n < 6; ++n) {
        const entry e = pc->e[n];
        const double err = fabs((double)out[(size_t)e.row * D + e.col] - (double)e.value);
        if (err > worst)
            worst = err;
        if (!(err <= 1.2e-7)) {
            printf("    pos token %d channel %d: got %.9g, diffusers %.9g\n", e.row, e.col,
                   (double)out[(size_t)e.row * D + e.col], (double)e.value);
            fail = 1;
        }
    }
    char what[160];
    snprintf(what, sizeof what, "pos_embed_2d D=%d %dx%d base=%d interp=%g vs diffusers", D, gh,
             gw, pc->base, (double)pc->interp);
    printf("%-58s max abs err %.3e%s\n", what, worst, fail ? "  FAIL" : "");

    /* float64: token n = (r, c); channels [0, D/2) encode c, [D/2, D) r. */
    double worst_rel = 0.0;
    int fail64 = 0;
    for (int r = 0; r < gh; ++r)
        for (int c = 0; c < gw; ++c)
            for (int half = 0; half < 2; ++half) {
                const int idx = half ? r : c, len = half ? gh : gw;
                const double g = (double)idx * pc->base / len / (double)pc->interp;
                for (int i = 0; i < Q; ++i) {
                    const double omega = pow(10000.0, -(double)i / Q);
                    const double tol = g * omega * 0x1p-22 + 0x1p-23;
                    const float *o = out + ((size_t)r * gw + c) * D + (size_t)half * (D / 2);
                    const double es = fabs((double)o[i] - sin(g * omega));
                    const double ec = fabs((double)o[Q + i] - cos(g * omega));
                    const double err = fmax(es, ec);
                    if (err / tol > worst_rel)
                        worst_rel = err / tol;
                    if (!(err <= tol) && !fail64) {
                        printf("    pos (r=%d, c=%d) %s i=%d: got (%.9g, %.9g) ref (%.17g, %.17g)\n",
                               r, c, half ? "row half" : "col half", i, (double)o[i],
                               (double)o[Q + i], sin(g * omega), cos(g * omega));
                        fail64 = 1;
                    }
                }
            }
    snprintf(what, sizeof what, "pos_embed_2d D=%d %dx%d base=%d interp=%g vs float64", D, gh,
             gw, pc->base, (double)pc->interp);
    printf("%-58s max err/tol %.3f%s\n", what, worst_rel, fail64 ? "  FAIL" : "");
    free(out);
    return fail | fail64;
}

int main(void)
{
    kt_rng rng = {0x5eed0005u};
    int fail = 0;
    fail |= check_timestep_diffusers();
    fail |= check_timestep_f64(&rng, 7, 256);
    fail |= check_timestep_f64(&rng, 3, 320);
    fail |= check_timestep_f64(&rng, 2, 8);
    for (size_t i = 0; i < sizeof pos_diffusers / sizeof pos_diffusers[0]; ++i)
        fail |= check_pos(&pos_diffusers[i]);
    printf(fail ? "test_embed: FAILED\n" : "test_embed: ok\n");
    return fail;
}
