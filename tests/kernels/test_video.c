/* Kernel test: the video kernels of kernels/cpu/video_kernels.h (one
 * output frame of a 3-D convolution with NULL taps, separate row and column
 * pads, halo-row inputs and small scratch; the channel RMS norm with and
 * without SiLU; AvgDown3D and DupUp3D, accumulating), each against a
 * float64 reference written here (direct loops over the definitions in
 * Diffusers' autoencoder_kl_wan.py), on fresh seeded random inputs. */
#include <math.h>
#include <string.h>

#include "kernels/cpu/video_kernels.h"
#include "tests/kernels/kt_common.h"

/* kT frames (Cin, H, W) plane stride ps (> H W), tap `null_tap` NULL (zeros). */
static int test_conv3d(kt_rng *r, int Cin, int H, int W, int Cout, int kT, int k, int pad_h,
                       int pad_w, int null_tap, size_t scratch_rows)
{
    const int Ho = H + 2 * pad_h - k + 1, Wo = W + 2 * pad_w - k + 1;
    const size_t psx = (size_t)(H + 1) * W, psy = (size_t)(Ho + 3) * Wo;
    const size_t nw = (size_t)Cout * Cin * kT * k * k;
    float *x[4], *w = kt_alloc(nw * 4), *b = kt_alloc((size_t)Cout * 4);
    float *y = kt_alloc((size_t)Cout * psy * 4), *got = kt_alloc((size_t)Cout * Ho * Wo * 4);
    const size_t sn = ditd_cpu_conv3d_scratch_row(Cin, kT, k, Wo) * scratch_rows;
    float *scr = sn ? kt_alloc(sn * 4) : NULL;
    double *ref = kt_alloc((size_t)Cout * Ho * Wo * sizeof *ref);
    const float *xf[4];
    for (int j = 0; j < kT; j++) {
        x[j] = kt_alloc((size_t)Cin * psx * 4);
        kt_fill(r, x[j], (size_t)Cin * psx, -1, 1);
        xf[j] = j == null_tap ? NULL : x[j];
    }
    kt_fill(r, w, nw, -1, 1);
    kt_fill(r, b, (size_t)Cout, -1, 1);
    kt_fill(r, y, (size_t)Cout * psy, -9, 9); /* overwritten */
    ditd_cpu_conv3d_frame(xf, kT, psx, w, b, y, psy, scr, sn, Cin, H, W, Cout, k, pad_h, pad_w);
    for (int co = 0; co < Cout; co++)
        for (int oy = 0; oy < Ho; oy++)
            for (int ox = 0; ox < Wo; ox++) {
                double acc = b[co];
                for (int ci = 0; ci < Cin; ci++)
                    for (int kt = 0; kt < kT; kt++)
                        for (int ky = 0; ky < k; ky++)
                            for (int kx = 0; kx < k; kx++) {
                                int iy = oy + ky - pad_h, ix = ox + kx - pad_w;
                                if (!xf[kt] || iy < 0 || iy >= H || ix < 0 || ix >= W)
                                    continue;
                                acc += (double)w[(((size_t)co * Cin + ci) * kT + kt) * k * k +
                                                 ky * k + kx] *
                                       xf[kt][ci * psx + (size_t)iy * W + ix];
                            }
                size_t o = ((size_t)co * Ho + oy) * Wo + ox;
                ref[o] = acc;
                got[o] = y[co * psy + (size_t)oy * Wo + ox];
            }
    char what[160];
    snprintf(what, sizeof what, "conv3d %dx%dx%d pad(%d,%d) %dx%dx%d->%d null tap %d chunk %zu", kT, k,
             k, pad_h, pad_w, Cin, H, W, Cout, null_tap, scratch_rows);
    int fail = kt_check(what, got, ref, (size_t)Cout * Ho * Wo, 1e-3, 1e-5);
    for (int j = 0; j < kT; j++)
        free(x[j]);
    free(w), free(b), free(y), free(got), free(scr), free(ref);
    return fail;
}

static int test_rmsnorm(kt_rng *r, int C, int n, int silu)
{
    const size_t ps = (size_t)n + 5;
    float *x = kt_alloc((size_t)C * ps * 4), *y = kt_alloc((size_t)C * ps * 4), *g = kt_alloc((size_t)C * 4);
    float *got = kt_alloc((size_t)C * n * 4);
    double *ref = kt_alloc((size_t)C * n * sizeof *ref);
    kt_fill(r, x, (size_t)C * ps, -2, 2);
    kt_fill(r, g, (size_t)C, 0.5f, 1.5f);
    for (int c = 0; c < C; c++) /* one position of zeros: the 1e-12 floor */
        x[(size_t)c * ps + 3] = 0.0f;
    ditd_cpu_rmsnorm_channels(x, ps, y, ps, C, n, g, silu);
    for (int i = 0; i < n; i++) {
        double ss = 0;
        for (int c = 0; c < C; c++)
            ss += (double)x[c * ps + i] * x[c * ps + i];
        double d = sqrt(ss) > 1e-12 ? sqrt(ss) : 1e-12;
        for (int c = 0; c < C; c++) {
            double v = x[c * ps + i] / d * sqrt((double)C) * g[c];
            ref[(size_t)c * n + i] = silu ? v / (1 + exp(-v)) : v;
            got[(size_t)c * n + i] = y[c * ps + i];
        }
    }
    char what[96];
    snprintf(what, sizeof what, "rmsnorm_channels C %d n %d%s", C, n, silu ? " + silu" : "");
    int fail = kt_check(what, got, ref, (size_t)C * n, 1e-3, 1e-5);
    free(x), free(y), free(g), free(got), free(ref);
    return fail;
}

/* AvgDown3D(Cin, Cout, ft, fs) from ft frames (the first NULL when pad0) and
 * DupUp3D(Cin, Cout, ft, fs) at time slot a, both onto random y. */
static int test_shortcuts(kt_rng *r, int Cin, int H, int W, int Cout, int ft, int fs, int pad0)
{
    const size_t ps = (size_t)H * W, n = (size_t)Cin * ps;
    const int Ho = H / fs, Wo = W / fs, factor = ft * fs * fs, group = Cin * factor / Cout;
    float *x[2] = {kt_alloc(n * 4), kt_alloc(n * 4)};
    const float *xf[2] = {pad0 ? NULL : x[0], x[1]};
    kt_fill(r, x[0], n, -1, 1);
    kt_fill(r, x[1], n, -1, 1);
    float *y = kt_alloc((size_t)Cout * Ho * Wo * 4);
    double *ref = kt_alloc((size_t)Cout * Ho * Wo * sizeof *ref);
    kt_fill(r, y, (size_t)Cout * Ho * Wo, -1, 1);
    for (size_t i = 0; i < (size_t)Cout * Ho * Wo; i++)
        ref[i] = y[i];
    ditd_cpu_avgdown3d_frame(xf + (2 - ft), ps, Cin, H, W, Cout, ft, fs, y, (size_t)Ho * Wo, 1);
    /* the definition: view (C, T', ft, H', fs, W', fs), permute to (C, ft, fs, fs, ...),
     * channels c factor + a fs fs + p fs + q, mean over groups of `group` */
    for (int o = 0; o < Cout; o++)
        for (int h = 0; h < Ho; h++)
            for (int w = 0; w < Wo; w++) {
                double s = 0;
                for (int gi = 0; gi < group; gi++) {
                    int j = o * group + gi, c = j / factor, rr = j % factor;
                    int a = rr / (fs * fs), p = (rr / fs) % fs, q = rr % fs;
                    const float *f = xf[2 - ft + a];
                    if (f)
                        s += f[c * ps + (size_t)(h * fs + p) * W + w * fs + q];
                }
                ref[((size_t)o * Ho + h) * Wo + w] += s / group;
            }
    char what[128];
    snprintf(what, sizeof what, "avgdown3d %d->%d ft %d fs %d%s", Cin, Cout, ft, fs,
             pad0 ? " (time padding)" : "");
    int fail = kt_check(what, y, ref, (size_t)Cout * Ho * Wo, 1e-3, 1e-6);
    free(y), free(ref);
    /* DupUp3D(Cout -> Cin) back up: repeats = Cin factor / Cout */
    const int Cu = Cin, rep = Cu * factor / Cout, Hu = Ho * fs, Wu = Wo * fs;
    float *xs = kt_alloc((size_t)Cout * Ho * Wo * 4), *u = kt_alloc((size_t)Cu * Hu * Wu * 4);
    double *uref = kt_alloc((size_t)Cu * Hu * Wu * sizeof *uref);
    kt_fill(r, xs, (size_t)Cout * Ho * Wo, -1, 1);
    kt_fill(r, u, (size_t)Cu * Hu * Wu, -1, 1);
    for (size_t i = 0; i < (size_t)Cu * Hu * Wu; i++)
        uref[i] = u[i];
    const int a = ft - 1;
    ditd_cpu_dupup3d_frame(xs, (size_t)Ho * Wo, Cout, Ho, Wo, Cu, ft, fs, a, u, (size_t)Hu * Wu, 1);
    for (int o = 0; o < Cu; o++)
        for (int y2 = 0; y2 < Hu; y2++)
            for (int x2 = 0; x2 < Wu; x2++) {
                /* repeat_interleave: channel j of the repeated tensor is x[j / rep] */
                int j = o * factor + a * fs * fs + (y2 % fs) * fs + x2 % fs;
                uref[((size_t)o * Hu + y2) * Wu + x2] +=
                    xs[(size_t)(j / rep) * Ho * Wo + (size_t)(y2 / fs) * Wo + x2 / fs];
            }
    snprintf(what, sizeof what, "dupup3d %d->%d ft %d fs %d slot %d", Cout, Cu, ft, fs, a);
    fail |= kt_check(what, u, uref, (size_t)Cu * Hu * Wu, 1e-3, 1e-6);
    free(x[0]), free(x[1]), free(xs), free(u), free(uref);
    return fail;
}

int main(void)
{
    kt_rng r = {0x5eed0fae6ull};
    int fail = 0, cases = 0;
    /* WanCausalConv3d 3x3x3: zero taps (the causal padding), chunks of 1, 2 and all rows */
    fail |= test_conv3d(&r, 5, 7, 9, 6, 3, 3, 1, 1, 0, 1), cases++;
    fail |= test_conv3d(&r, 4, 6, 5, 3, 3, 3, 1, 1, 1, 2), cases++;
    fail |= test_conv3d(&r, 3, 4, 11, 7, 3, 3, 1, 1, -1, 100), cases++;
    /* halo form: rows come with the input, no row padding */
    fail |= test_conv3d(&r, 4, 8, 6, 5, 3, 3, 0, 1, -1, 3), cases++;
    /* time convolutions (3, 1, 1) and 1x1x1 */
    fail |= test_conv3d(&r, 6, 5, 7, 12, 3, 1, 0, 0, 2, 2), cases++;
    fail |= test_conv3d(&r, 9, 5, 6, 7, 1, 1, 0, 0, -1, 0), cases++;
    fail |= test_rmsnorm(&r, 12, 300, 1), cases++;
    fail |= test_rmsnorm(&r, 5, 17, 0), cases++;
    fail |= test_shortcuts(&r, 8, 6, 10, 16, 2, 2, 1), cases++;
    fail |= test_shortcuts(&r, 16, 4, 6, 16, 2, 2, 0), cases++;
    fail |= test_shortcuts(&r, 8, 6, 4, 8, 1, 2, 0), cases++;
    printf("%d cases, %s\n", cases, fail ? "FAILED" : "all ok");
    return fail || cases < 11;
}
