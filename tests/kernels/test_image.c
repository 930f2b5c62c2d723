/* Kernel test: the image kernels of kernels/cpu/image_kernels.h (conv2d,
 * GroupNorm in two halves, nearest upsampling, planes <-> tokens) and the
 * attention kernel at the VAE's head size (one head of 512), each against a
 * float64 reference written here, on fresh seeded random inputs, with plane
 * strides larger than a plane (halo rows) and scratch small enough to force
 * several GEMM chunks. */
#include <math.h>
#include <omp.h>
#include <string.h>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/image_kernels.h"
#include "tests/kernels/kt_common.h"

static int test_conv(kt_rng *r, int B, int Cin, int Hx, int Wx, int Cout, int k, int s, int pt,
                     int pb, int pl, int pr, size_t scratch_rows, int bias)
{
    const int Ho = ditd_cpu_conv2d_out(Hx, pt, pb, k, s), Wo = ditd_cpu_conv2d_out(Wx, pl, pr, k, s);
    const size_t psx = (size_t)(Hx + 3) * Wx, psy = (size_t)(Ho + 2) * Wo; /* strided planes */
    float *x = kt_alloc((size_t)B * Cin * psx * sizeof *x), *w = kt_alloc((size_t)Cout * Cin * k * k * 4);
    float *b = kt_alloc((size_t)Cout * 4), *y = kt_alloc((size_t)B * Cout * psy * sizeof *y);
    size_t sn = (size_t)Cin * k * k * Wo * scratch_rows;
    float *scr = kt_alloc(sn * sizeof *scr), *got = kt_alloc((size_t)B * Cout * Ho * Wo * 4);
    double *ref = kt_alloc((size_t)B * Cout * Ho * Wo * sizeof *ref);
    kt_fill(r, x, (size_t)B * Cin * psx, -1, 1);
    kt_fill(r, w, (size_t)Cout * Cin * k * k, -1, 1);
    kt_fill(r, b, (size_t)Cout, -1, 1);
    kt_fill(r, y, (size_t)B * Cout * psy, -9, 9); /* overwritten */
    ditd_cpu_conv2d(x, psx, w, bias ? b : NULL, y, psy, scr, sn, B, Cin, Hx, Wx, Cout, k, s, pt, pb,
                    pl, pr);
    for (int bi = 0; bi < B; bi++)
        for (int co = 0; co < Cout; co++)
            for (int oy = 0; oy < Ho; oy++)
                for (int ox = 0; ox < Wo; ox++) {
                    double acc = bias ? b[co] : 0.0;
                    for (int ci = 0; ci < Cin; ci++)
                        for (int ky = 0; ky < k; ky++)
                            for (int kx = 0; kx < k; kx++) {
                                int iy = oy * s + ky - pt, ix = ox * s + kx - pl;
                                if (iy < 0 || iy >= Hx || ix < 0 || ix >= Wx)
                                    continue;
                                acc += (double)w[((co * Cin + ci) * k + ky) * k + kx] *
                                       x[(bi * Cin + ci) * psx + (size_t)iy * Wx + ix];
                            }
                    size_t o = (((size_t)bi * Cout + co) * Ho + oy) * Wo + ox;
                    ref[o] = acc;
                    got[o] = y[(bi * Cout + co) * psy + (size_t)oy * Wo + ox];
                }
    char what[128];
    snprintf(what, sizeof what, "conv2d %dx%d s%d pad(%d,%d,%d,%d) %dx%dx%d->%d chunk %zu", k, k, s, pt,
             pb, pl, pr, Cin, Hx, Wx, Cout, scratch_rows);
    int fail = kt_check(what, got, ref, (size_t)B * Cout * Ho * Wo, 1e-3, 1e-5);
    free(x), free(w), free(b), free(y), free(scr), free(got), free(ref);
    return fail;
}

/* The exactness the parallel VAE decode relies on (kernels/cpu/conv.c): a
 * 3x3 pad-1 convolution of a band of rows (with its halo rows, as a rank
 * holds it) gives, bit for bit, those rows of the whole image's; and the
 * whole image gives the same bits on 1 and on 3 threads. Bands of 1, 2, 3
 * and 5 output rows at every start row; Cin past one pass (130 > 128
 * channels of a 3x3), Cout not a multiple of the 6-channel block, widths
 * whose rows straddle the 64-pixel blocks. */
static int test_conv_bands(kt_rng *r, int Cin, int H, int W, int Cout)
{
    const size_t ps = (size_t)(H + 2) * W, n = (size_t)Cout * H * W;
    float *x = kt_alloc((size_t)Cin * ps * 4), *w = kt_alloc((size_t)Cout * Cin * 9 * 4);
    float *b = kt_alloc((size_t)Cout * 4), *whole = kt_alloc((size_t)Cout * ps * 4);
    float *again = kt_alloc((size_t)Cout * ps * 4), *band = kt_alloc((size_t)Cout * ps * 4);
    kt_fill(r, x, (size_t)Cin * ps, -1, 1);
    for (int c = 0; c < Cin; c++) { /* zero halo rows: the image's padding */
        memset(x + (size_t)c * ps, 0, (size_t)W * 4);
        memset(x + (size_t)c * ps + (size_t)(H + 1) * W, 0, (size_t)W * 4);
    }
    kt_fill(r, w, (size_t)Cout * Cin * 9, -1, 1);
    kt_fill(r, b, (size_t)Cout, -1, 1);
    /* scratch for the whole image's im2col: DITD_CPU_CONV=gemm then runs
     * im2col + sgemm, whose bits are not band- or thread-invariant */
    const size_t sn = (size_t)Cin * 9 * W * H;
    float *scr = kt_alloc(sn * 4);
    const int t0 = omp_get_max_threads();
    omp_set_num_threads(1);
    ditd_cpu_conv2d(x, ps, w, b, whole + W, ps, scr, sn, 1, Cin, H + 2, W, Cout, 3, 1, 0, 0, 1, 1);
    omp_set_num_threads(3);
    ditd_cpu_conv2d(x, ps, w, b, again + W, ps, scr, sn, 1, Cin, H + 2, W, Cout, 3, 1, 0, 0, 1, 1);
    omp_set_num_threads(t0);
    size_t bad = 0, bands = 0;
    for (size_t c = 0; c < (size_t)Cout; c++)
        bad += memcmp(whole + c * ps + W, again + c * ps + W, (size_t)H * W * 4) != 0;
    static const int sizes[] = {1, 2, 3, 5};
    for (int si = 0; si < 4; si++)
        for (int r0 = 0; r0 + sizes[si] <= H; r0++) {
            const int nr = sizes[si];
            /* the band: its rows and one halo row each side, planes of stride (nr + 2) W */
            const size_t bps = (size_t)(nr + 2) * W;
            float *bx = kt_alloc((size_t)Cin * bps * 4), *by = band;
            for (int c = 0; c < Cin; c++)
                memcpy(bx + (size_t)c * bps, x + (size_t)c * ps + (size_t)r0 * W, bps * 4);
            ditd_cpu_conv2d(bx, bps, w, b, by, bps, scr, sn, 1, Cin, nr + 2, W, Cout, 3, 1, 0, 0, 1,
                            1);
            for (size_t c = 0; c < (size_t)Cout; c++)
                bad += memcmp(by + c * bps, whole + c * ps + (size_t)(r0 + 1) * W,
                              (size_t)nr * W * 4) != 0;
            bands++;
            free(bx);
        }
    printf("conv2d bands of a %dx%dx%d->%d image: %zu bands, 1 vs 3 threads: %s\n", Cin, H, W, Cout,
           bands, bad ? "NOT bit-identical" : "bit-identical");
    (void)n;
    free(x), free(w), free(b), free(whole), free(again), free(band), free(scr);
    return bad != 0 || bands < 10;
}

static int test_groupnorm(kt_rng *r, int B, int C, int rows, int W, int G, int silu)
{
    const size_t ps = (size_t)(rows + 2) * W, n = (size_t)B * C * ps;
    float *x = kt_alloc(n * 4), *y = kt_alloc(n * 4), *g = kt_alloc((size_t)C * 4), *be = kt_alloc((size_t)C * 4);
    float *mean = kt_alloc((size_t)B * G * 4), *rstd = kt_alloc((size_t)B * G * 4);
    double *st = kt_alloc((size_t)B * G * 2 * sizeof *st);
    float *got = kt_alloc((size_t)B * C * rows * W * 4);
    double *ref = kt_alloc((size_t)B * C * rows * W * sizeof *ref), *sref = kt_alloc((size_t)B * G * 2 * 8);
    float *sgot = kt_alloc((size_t)B * G * 2 * 4);
    double *sref_d = sref;
    kt_fill(r, x, n, -2, 3);
    kt_fill(r, g, (size_t)C, 0.5f, 1.5f);
    kt_fill(r, be, (size_t)C, -0.5f, 0.5f);
    ditd_cpu_groupnorm_stats(x, ps, B, C, rows, W, G, st);
    const int cg = C / G;
    const double cnt = (double)cg * rows * W;
    for (int b = 0; b < B; b++)
        for (int gi = 0; gi < G; gi++) {
            double s1 = 0, s2 = 0;
            for (int c = gi * cg; c < (gi + 1) * cg; c++)
                for (size_t i = 0; i < (size_t)rows * W; i++) {
                    double v = x[(b * C + c) * ps + i];
                    s1 += v;
                    s2 += v * v;
                }
            sref_d[(b * G + gi) * 2] = s1;
            sref_d[(b * G + gi) * 2 + 1] = s2;
            sgot[(b * G + gi) * 2] = (float)st[(b * G + gi) * 2];
            sgot[(b * G + gi) * 2 + 1] = (float)st[(b * G + gi) * 2 + 1];
            double m = s1 / cnt, var = s2 / cnt - m * m;
            mean[b * G + gi] = (float)m;
            rstd[b * G + gi] = (float)(1.0 / sqrt(var + 1e-6));
            for (int c = gi * cg; c < (gi + 1) * cg; c++)
                for (size_t i = 0; i < (size_t)rows * W; i++) {
                    double v = (x[(b * C + c) * ps + i] - m) / sqrt(var + 1e-6) * g[c] + be[c];
                    if (silu)
                        v = v / (1.0 + exp(-v));
                    ref[((size_t)b * C + c) * rows * W + i] = v;
                }
        }
    int fail = kt_check("groupnorm stats (sum, sum of squares)", sgot, sref, (size_t)B * G * 2, 1.0, 1e-7);
    ditd_cpu_groupnorm_apply(x, ps, y, ps, B, C, rows, W, G, mean, rstd, g, be, silu);
    for (int bc = 0; bc < B * C; bc++)
        memcpy(got + (size_t)bc * rows * W, y + bc * ps, (size_t)rows * W * 4);
    char what[96];
    snprintf(what, sizeof what, "groupnorm apply%s (%d, %d, %d, %d) G=%d", silu ? " + silu" : "", B, C,
             rows, W, G);
    fail |= kt_check(what, got, ref, (size_t)B * C * rows * W, 1.0, 2e-6);
    /* in place */
    ditd_cpu_groupnorm_apply(x, ps, x, ps, B, C, rows, W, G, mean, rstd, g, be, silu);
    for (int bc = 0; bc < B * C; bc++)
        memcpy(got + (size_t)bc * rows * W, x + bc * ps, (size_t)rows * W * 4);
    fail |= kt_check("groupnorm apply in place", got, ref, (size_t)B * C * rows * W, 1.0, 2e-6);
    free(x), free(y), free(g), free(be), free(mean), free(rstd), free(st), free(got), free(ref),
        free(sref), free(sgot);
    return fail;
}

static int test_upsample_transpose(kt_rng *r)
{
    const int B = 2, C = 5, R = 3, W = 7;
    const size_t psx = (size_t)(R + 2) * W, psy = (size_t)(2 * R + 2) * 2 * W;
    float *x = kt_alloc((size_t)B * C * psx * 4), *y = kt_alloc((size_t)B * C * psy * 4);
    int fail = 0;
    kt_fill(r, x, (size_t)B * C * psx, -1, 1);
    ditd_cpu_upsample_nearest2x(x, psx, y, psy, B, C, R, W);
    for (int bc = 0; bc < B * C; bc++)
        for (int i = 0; i < 2 * R; i++)
            for (int j = 0; j < 2 * W; j++)
                if (y[bc * psy + (size_t)i * 2 * W + j] != x[bc * psx + (size_t)(i / 2) * W + j / 2])
                    fail = 1;
    printf("%-58s %s\n", "upsample nearest x2 (2, 5, 3, 7), strided", fail ? "FAIL" : "exact");
    /* planes (C, n) stride ps <-> tokens (n, C) */
    const int n = R * W;
    float *t = kt_alloc((size_t)n * C * 4), *z = kt_alloc((size_t)C * psx * 4);
    ditd_cpu_planes_to_tokens(x, psx, t, C, n);
    int bad = 0;
    for (int i = 0; i < n; i++)
        for (int c = 0; c < C; c++)
            bad |= t[(size_t)i * C + c] != x[c * psx + i];
    memcpy(z, x, (size_t)C * psx * 4);
    ditd_cpu_tokens_to_planes(t, z, psx, C, n, 1); /* z = 2 x on the planes */
    for (int c = 0; c < C; c++)
        for (int i = 0; i < n; i++)
            bad |= z[c * psx + i] != 2.0f * x[c * psx + i];
    ditd_cpu_tokens_to_planes(t, z, psx, C, n, 0);
    for (int c = 0; c < C; c++)
        for (int i = 0; i < n; i++)
            bad |= z[c * psx + i] != x[c * psx + i];
    printf("%-58s %s\n", "planes <-> tokens (copy, accumulate)", bad ? "FAIL" : "exact");
    free(x), free(y), free(t), free(z);
    return fail | bad;
}

/* The VAE mid-block attention: one head of Dh = 512 (the kernel's largest). */
static int test_attention_512(kt_rng *r)
{
    const int Nq = 37, Nk = 53, Dh = DITD_CPU_ATTN_MAX_DH;
    float *q = kt_alloc((size_t)Nq * Dh * 4), *k = kt_alloc((size_t)Nk * Dh * 4);
    float *v = kt_alloc((size_t)Nk * Dh * 4), *o = kt_alloc((size_t)Nq * Dh * 4);
    double *ref = kt_alloc((size_t)Nq * Dh * 8), *s = kt_alloc((size_t)Nk * 8);
    const float scale = 1.0f / sqrtf((float)Dh);
    kt_fill(r, q, (size_t)Nq * Dh, -1, 1);
    kt_fill(r, k, (size_t)Nk * Dh, -1, 1);
    kt_fill(r, v, (size_t)Nk * Dh, -1, 1);
    ditd_cpu_attention(q, Dh, k, Dh, v, Dh, o, Dh, NULL, 1, Nq, Nk, 1, Dh, scale);
    for (int i = 0; i < Nq; i++) {
        double mx = -INFINITY, sum = 0;
        for (int j = 0; j < Nk; j++) {
            double d = 0;
            for (int e = 0; e < Dh; e++)
                d += (double)q[i * Dh + e] * k[j * Dh + e];
            s[j] = d * scale;
            mx = s[j] > mx ? s[j] : mx;
        }
        for (int j = 0; j < Nk; j++)
            sum += (s[j] = exp(s[j] - mx));
        for (int e = 0; e < Dh; e++) {
            double acc = 0;
            for (int j = 0; j < Nk; j++)
                acc += s[j] * v[j * Dh + e];
            ref[i * Dh + e] = acc / sum;
        }
    }
    int fail = kt_check("attention one head, Dh 512 (the VAE mid block)", o, ref, (size_t)Nq * Dh, 1e-3, 1e-5);
    free(q), free(k), free(v), free(o), free(ref), free(s);
    return fail;
}

int main(void)
{
    kt_rng r = {0x5eed0fae5ull};
    int fail = 0, cases = 0;
    /* 3x3 pad 1 (the VAE's), odd sizes, chunks of 1, 2 and all rows */
    fail |= test_conv(&r, 2, 5, 7, 9, 6, 3, 1, 1, 1, 1, 1, 1, 1), cases++;
    fail |= test_conv(&r, 1, 8, 6, 5, 4, 3, 1, 1, 1, 1, 1, 2, 1), cases++;
    fail |= test_conv(&r, 1, 3, 4, 11, 7, 3, 1, 1, 1, 1, 1, 100, 0), cases++;
    /* halo form: rows come with the input, no row padding */
    fail |= test_conv(&r, 1, 4, 8, 6, 5, 3, 1, 0, 0, 1, 1, 3, 1), cases++;
    /* Downsample2D: pad (0, 1, 0, 1), stride 2, even and odd sides */
    fail |= test_conv(&r, 1, 6, 10, 14, 6, 3, 2, 0, 1, 0, 1, 2, 1), cases++;
    fail |= test_conv(&r, 2, 3, 9, 7, 4, 3, 2, 0, 1, 0, 1, 1, 1), cases++;
    /* 1x1 (post_quant_conv, conv_shortcut): no scratch at all */
    fail |= test_conv(&r, 2, 9, 5, 6, 7, 1, 1, 0, 0, 0, 0, 0, 1), cases++;
    /* past one pass of channels (130 > 128 of a 3x3; 1x1: 1200 > 1152),
     * Cout tails, rows straddling 64-pixel blocks */
    fail |= test_conv(&r, 1, 130, 5, 23, 13, 3, 1, 1, 1, 1, 1, 0, 1), cases++;
    fail |= test_conv(&r, 1, 1200, 3, 70, 7, 1, 1, 0, 0, 0, 0, 0, 1), cases++;
    fail |= test_conv_bands(&r, 130, 7, 23, 13), cases++;
    fail |= test_conv_bands(&r, 9, 9, 70, 8), cases++;
    fail |= test_groupnorm(&r, 2, 12, 5, 7, 4, 1), cases++;
    fail |= test_groupnorm(&r, 1, 32, 3, 9, 32, 0), cases++;
    fail |= test_upsample_transpose(&r), cases++;
    fail |= test_attention_512(&r), cases++;
    printf("%d cases, %s\n", cases, fail ? "FAILED" : "all ok");
    return fail || cases < 15;
}
