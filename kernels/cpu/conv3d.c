/* 3-D convolution on the CPU, one output frame at a time: im2col over the
 * time taps in chunks of output rows, then one sgemm per chunk
 * (kernels/cpu/video_kernels.h).
 *
 * What this is: PyTorch nn.Conv3d (dilation 1, groups 1, spatial stride 1)
 * for the kernels an AutoencoderKLWan uses (3x3x3 pad 1, 3x1x1, 1x1x1),
 * written once for any kT and odd k. The caller picks the kT frames each
 * output frame reads, so the causal time padding, the time stride and the
 * feature cache between chunks stay outside (NULL frames are zeros). What
 * it is not: Winograd or a direct convolution; the GEMM does the
 * arithmetic, BLAS does the GEMM.
 *
 * Numerics: each output element is bias + one BLAS dot product over
 * (Cin, kT, ky, kx) in that order, whatever chunk of rows it falls in.
 */
#include "kernels/cpu/video_kernels.h"

#include <assert.h>
#include <cblas.h>
#include <string.h>

/* col (Cin kT k k, nr Wo) for output rows [r0, r0 + nr). */
static void im2col3d(const float *const *xf, int kT, size_t psx, float *col, int Cin, int H, int W,
                     int k, int pad_h, int pad_w, int r0, int nr, int Wo)
{
    const int K = Cin * kT * k * k;
    const size_t ncol = (size_t)nr * Wo;
#pragma omp parallel for schedule(static) if ((size_t)K * ncol >= DITD_CPU_VIDEO_OMP_MIN)
    for (int kk = 0; kk < K; kk++) {
        const int ci = kk / (kT * k * k), kt = (kk / (k * k)) % kT, ky = (kk / k) % k, kx = kk % k;
        float *cp = col + (size_t)kk * ncol;
        if (!xf[kt]) {
            memset(cp, 0, ncol * sizeof *cp);
            continue;
        }
        const float *xp = xf[kt] + (size_t)ci * psx;
        /* output column ox reads input column ox + kx - pad_w: inside for ox in [lo, hi) */
        int lo = pad_w - kx, hi = W + pad_w - kx;
        lo = lo < 0 ? 0 : lo;
        hi = hi > Wo ? Wo : hi;
        hi = hi < lo ? lo : hi;
        for (int r = 0; r < nr; r++) {
            const int iy = r0 + r + ky - pad_h;
            float *dst = cp + (size_t)r * Wo;
            if (iy < 0 || iy >= H) {
                memset(dst, 0, (size_t)Wo * sizeof *dst);
                continue;
            }
            const float *src = xp + (size_t)iy * W;
            for (int ox = 0; ox < lo; ox++)
                dst[ox] = 0.0f;
            if (hi > lo)
                memcpy(dst + lo, src + lo + kx - pad_w, (size_t)(hi - lo) * sizeof *dst);
            for (int ox = hi; ox < Wo; ox++)
                dst[ox] = 0.0f;
        }
    }
}

static void fill_bias(float *y, size_t psy, const float *b, int Cout, size_t off, size_t n)
{
#pragma omp parallel for schedule(static) if ((size_t)Cout * n >= DITD_CPU_VIDEO_OMP_MIN)
    for (int co = 0; co < Cout; co++) {
        float *p = y + (size_t)co * psy + off;
        const float v = b ? b[co] : 0.0f;
        for (size_t i = 0; i < n; i++)
            p[i] = v;
    }
}

void ditd_cpu_conv3d_frame(const float *const *xf, int kT, size_t psx, const float *w,
                           const float *b, float *y, size_t psy, float *scratch, size_t scratch_n,
                           int Cin, int H, int W, int Cout, int k, int pad_h, int pad_w)
{
    const int Ho = H + 2 * pad_h - k + 1, Wo = W + 2 * pad_w - k + 1;
    const int K = Cin * kT * k * k;
    assert(kT >= 1 && k >= 1 && Ho > 0 && Wo > 0 && psx >= (size_t)H * W &&
           psy >= (size_t)Ho * Wo);

    if (k == 1 && kT == 1) {
        /* (Cout, HW) = w (Cout, Cin) . x (Cin, HW): no copy at all */
        fill_bias(y, psy, b, Cout, 0, (size_t)Ho * Wo);
        if (xf[0])
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, Cout, Ho * Wo, Cin, 1.0f, w,
                        Cin, xf[0], (int)psx, 1.0f, y, (int)psy);
        return;
    }
    assert(scratch && scratch_n >= (size_t)K * Wo);
    int chunk = (int)(scratch_n / ((size_t)K * Wo));
    chunk = chunk > Ho ? Ho : chunk;
    for (int r0 = 0; r0 < Ho; r0 += chunk) {
        const int nr = Ho - r0 < chunk ? Ho - r0 : chunk, ncol = nr * Wo;
        im2col3d(xf, kT, psx, scratch, Cin, H, W, k, pad_h, pad_w, r0, nr, Wo);
        fill_bias(y, psy, b, Cout, (size_t)r0 * Wo, (size_t)ncol);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, Cout, ncol, K, 1.0f, w, K, scratch,
                    ncol, 1.0f, y + (size_t)r0 * Wo, (int)psy);
    }
}
