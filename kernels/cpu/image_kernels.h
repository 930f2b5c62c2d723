/* CPU kernels over images in NCHW planes: the convolutions, GroupNorm,
 * nearest upsampling and layout transposes an AutoencoderKL needs.
 *
 * What this is: pure functions over caller-owned float buffers, fp32, with
 * OpenMP on the outer loops and GEMMs through BLAS. What it is not: no
 * allocation (scratch comes from the caller), no communication, no model
 * knowledge. Nothing here includes engine/ or server/.
 *
 * Layout: an image x is (B, C, rows, W) where each channel is a plane of
 * `rows` rows of W floats; consecutive planes are `ps` floats apart (the
 * "plane stride", >= rows * W), so a plane can sit inside a larger buffer
 * (a buffer with halo rows above and below, as the parallel decode keeps).
 * Batch b starts at b * C * ps.
 *
 * Threading: as kernels/cpu/cpu_kernels.h (BLAS is called outside OpenMP
 * regions; callers must not call these from inside their own region).
 */
#ifndef DITD_KERNELS_CPU_IMAGE_KERNELS_H
#define DITD_KERNELS_CPU_IMAGE_KERNELS_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A 2-D convolution (PyTorch nn.Conv2d, dilation 1, groups 1):
 *   x: (B, Cin, Hx, Wx), plane stride psx; w: (Cout, Cin, k, k); b: (Cout) or NULL;
 *   zero padding pad_t/pad_b rows and pad_l/pad_r columns around x;
 *   y: (B, Cout, Ho, Wo), plane stride psy, Ho = (Hx + pad_t + pad_b - k) / s + 1,
 *   Wo likewise.
 * Computed by ditd's direct kernel (kernels/cpu/conv.c: AVX-512 or
 * portable C; DITD_CPU_CONV=gemm selects the im2col + sgemm reference). Each
 * output element's reduction order depends on (Cin, k, s, pads) alone, not
 * on the rows given or the thread count: a band of rows computes the bits
 * the whole image does. Scratch: none for s == 1 with Wo == Wx (the 3x3 pad
 * 1 and 1x1 convolutions; scratch may be NULL); other shapes (stride 2) go
 * through im2col in chunks of output rows and need scratch_n >=
 * Cin * k * k * Wo floats (one output row); more scratch, more rows a chunk. */
void ditd_cpu_conv2d(const float *x, size_t psx, const float *w, const float *b, float *y,
                     size_t psy, float *scratch, size_t scratch_n, int B, int Cin, int Hx,
                     int Wx, int Cout, int k, int s, int pad_t, int pad_b, int pad_l, int pad_r);

/* Which code runs ditd_cpu_conv2d in this process, in words (static string). */
const char *ditd_cpu_conv2d_info(void);

/* Output rows of ditd_cpu_conv2d (and columns, with the column pads). */
static inline int ditd_cpu_conv2d_out(int n, int pad_a, int pad_b, int k, int s)
{
    return (n + pad_a + pad_b - k) / s + 1;
}

/* GroupNorm, statistics half: for each (b, g) over the group's channels
 * C / G and the given rows, stats[(b * G + g) * 2 + 0] = sum(x) and
 * [.. + 1] = sum(x^2), accumulated in double (each row summed, then the
 * rows in order). The element count is (C / G) * rows * W. C % G == 0. */
void ditd_cpu_groupnorm_stats(const float *x, size_t ps, int B, int C, int rows, int W, int G,
                              double *stats);

/* GroupNorm, apply half: y = (x - mean[b, g]) * rstd[b, g] * gamma[c] + beta[c],
 * then SiLU when silu != 0. mean, rstd: (B, G) float; gamma, beta: (C) or
 * NULL (1, 0). y may alias x (same ps). */
void ditd_cpu_groupnorm_apply(const float *x, size_t psx, float *y, size_t psy, int B, int C,
                              int rows, int W, int G, const float *mean, const float *rstd,
                              const float *gamma, const float *beta, int silu);

/* Nearest-neighbour upsampling by 2 (F.interpolate scale_factor=2, "nearest"):
 *   x: (B, C, rows, W) plane stride psx; y: (B, C, 2 rows, 2 W) plane stride psy. */
void ditd_cpu_upsample_nearest2x(const float *x, size_t psx, float *y, size_t psy, int B, int C,
                                 int rows, int W);

/* Layout transposes between planes and tokens, for one image:
 *   planes (C, n) with plane stride ps  <->  tokens (n, C) row-major.
 * to_tokens: t[i, c] = x[c * ps + i]. from_tokens: y[c * ps + i] (+)= t[i, c]
 * (accumulate != 0 adds: the residual of an attention block). */
void ditd_cpu_planes_to_tokens(const float *x, size_t ps, float *t, int C, int n);
void ditd_cpu_tokens_to_planes(const float *t, float *y, size_t ps, int C, int n, int accumulate);

#ifdef __cplusplus
}
#endif

#endif
