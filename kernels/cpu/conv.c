/* 2-D convolution on the CPU: im2col in chunks of output rows, then one
 * sgemm per chunk (kernels/cpu/image_kernels.h).
 *
 * What this is: PyTorch nn.Conv2d (dilation 1, groups 1) for the kernel
 * sizes an AutoencoderKL uses (3x3 pad 1, 3x3 stride 2, 1x1), written once
 * for any k, s and asymmetric zero padding. What it is not: Winograd or a
 * direct convolution; the GEMM does the arithmetic, BLAS does the GEMM.
 *
 * Numerics: each output element is bias + one BLAS dot product over
 * (Cin, ky, kx) in that order, whatever chunk of rows it falls in, so a
 * rank that computes a band of rows gets the bits a single rank gets.
 */
#include "kernels/cpu/image_kernels.h"

#include <assert.h>
#include <cblas.h>
#include <string.h>

/* col (Cin*k*k, n_rows*Wo) for output rows [r0, r0 + n_rows). */
static void im2col(const float *x, size_t psx, float *col, int Cin, int Hx, int Wx, int k, int s,
                   int pad_t, int pad_l, int r0, int n_rows, int Wo)
{
    const int K = Cin * k * k;
    const size_t ncol = (size_t)n_rows * Wo;
#pragma omp parallel for schedule(static)
    for (int kk = 0; kk < K; kk++) {
        const int ci = kk / (k * k), ky = (kk / k) % k, kx = kk % k;
        const float *xp = x + (size_t)ci * psx;
        float *cp = col + (size_t)kk * ncol;
        for (int r = 0; r < n_rows; r++) {
            const int iy = (r0 + r) * s + ky - pad_t;
            float *dst = cp + (size_t)r * Wo;
            if (iy < 0 || iy >= Hx) {
                memset(dst, 0, (size_t)Wo * sizeof *dst);
                continue;
            }
            const float *src = xp + (size_t)iy * Wx;
            if (s == 1) {
                /* ix = ox + kx - pad_l: a shifted copy with zeros at the ends */
                int lo = pad_l - kx, hi = Wx + pad_l - kx; /* ox range reading inside */
                if (lo < 0)
                    lo = 0;
                if (hi > Wo)
                    hi = Wo;
                if (hi < lo)
                    hi = lo;
                for (int ox = 0; ox < lo; ox++)
                    dst[ox] = 0.0f;
                if (hi > lo)
                    memcpy(dst + lo, src + lo + kx - pad_l, (size_t)(hi - lo) * sizeof *dst);
                for (int ox = hi; ox < Wo; ox++)
                    dst[ox] = 0.0f;
            } else {
                for (int ox = 0; ox < Wo; ox++) {
                    const int ix = ox * s + kx - pad_l;
                    dst[ox] = (ix >= 0 && ix < Wx) ? src[ix] : 0.0f;
                }
            }
        }
    }
}

static void fill_bias(float *y, size_t psy, const float *b, int Cout, size_t off, size_t n)
{
#pragma omp parallel for schedule(static)
    for (int co = 0; co < Cout; co++) {
        float *p = y + (size_t)co * psy + off;
        const float v = b ? b[co] : 0.0f;
        for (size_t i = 0; i < n; i++)
            p[i] = v;
    }
}

void ditd_cpu_conv2d(const float *x, size_t psx, const float *w, const float *b, float *y,
                     size_t psy, float *scratch, size_t scratch_n, int B, int Cin, int Hx,
                     int Wx, int Cout, int k, int s, int pad_t, int pad_b, int pad_l, int pad_r)
{
    const int Ho = ditd_cpu_conv2d_out(Hx, pad_t, pad_b, k, s);
    const int Wo = ditd_cpu_conv2d_out(Wx, pad_l, pad_r, k, s);
    const int K = Cin * k * k;
    assert(Ho > 0 && Wo > 0 && psy >= (size_t)Ho * Wo && psx >= (size_t)Hx * Wx);

    for (int bi = 0; bi < B; bi++) {
        const float *xb = x + (size_t)bi * Cin * psx;
        float *yb = y + (size_t)bi * Cout * psy;
        if (k == 1 && s == 1 && pad_t == 0 && pad_b == 0 && pad_l == 0 && pad_r == 0) {
            /* (Cout, HW) = w (Cout, Cin) . x (Cin, HW): no copy at all */
            fill_bias(yb, psy, b, Cout, 0, (size_t)Ho * Wo);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, Cout, Ho * Wo, Cin, 1.0f, w,
                        Cin, xb, (int)psx, 1.0f, yb, (int)psy);
            continue;
        }
        assert(scratch && scratch_n >= (size_t)K * Wo);
        int chunk = (int)(scratch_n / ((size_t)K * Wo));
        if (chunk > Ho)
            chunk = Ho;
        for (int r0 = 0; r0 < Ho; r0 += chunk) {
            const int nr = Ho - r0 < chunk ? Ho - r0 : chunk;
            const int ncol = nr * Wo;
            im2col(xb, psx, scratch, Cin, Hx, Wx, k, s, pad_t, pad_l, r0, nr, Wo);
            fill_bias(yb, psy, b, Cout, (size_t)r0 * Wo, (size_t)ncol);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, Cout, ncol, K, 1.0f, w, K,
                        scratch, ncol, 1.0f, yb + (size_t)r0 * Wo, (int)psy);
        }
    }
}
