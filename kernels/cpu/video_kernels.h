/* CPU kernels over video frames: the causal 3-D convolution, the channel
 * RMS norm and the residual shortcuts (AvgDown3D, DupUp3D) of Diffusers'
 * AutoencoderKLWan.
 *
 * What this is: pure functions over caller-owned float buffers, fp32, with
 * OpenMP on the outer loops and GEMMs through BLAS. What it is not: no
 * allocation (scratch comes from the caller), no feature cache (the caller
 * hands each call the frames it reads), no model knowledge.
 *
 * Layout: a frame is C planes of H rows of W floats, consecutive planes ps
 * floats apart (ps >= H W). Functions that read several frames take an
 * array of frame pointers, one per time tap, where NULL stands for a frame
 * of zeros (the causal padding), so a caller never copies frames to line
 * them up in time.
 *
 * Threading: as kernels/cpu/image_kernels.h (BLAS is called outside OpenMP
 * regions; callers must not call these from inside their own region).
 */
#ifndef DITD_KERNELS_CPU_VIDEO_KERNELS_H
#define DITD_KERNELS_CPU_VIDEO_KERNELS_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Elements of work below which a kernel runs on the calling thread: an
 * OpenMP team costs a fork and a barrier, which on a loaded machine (or a
 * small frame) is worth more than a loop of under a millisecond. */
#define DITD_CPU_VIDEO_OMP_MIN ((size_t)1 << 20)

/* One output frame of nn.Conv3d (dilation 1, groups 1, spatial stride 1):
 *   xf[0..kT): the kT input frames the kernel's time taps read, oldest
 *              first, each (Cin, H, W) with plane stride psx, NULL = zeros;
 *   w: (Cout, Cin, kT, k, k); b: (Cout) or NULL;
 *   pad_h, pad_w: zero rows above and below, zero columns left and right
 *   (a caller whose frames carry halo rows passes pad_h 0);
 *   y: (Cout, Ho, Wo) plane stride psy, Ho = H + 2 pad_h - k + 1,
 *   Wo = W + 2 pad_w - k + 1.
 * Time padding and stride are the caller's (it chooses the frames). Computed
 * as im2col + sgemm in chunks of output rows, K = Cin kT k k in the order
 * of w; scratch must hold scratch_n >= K Wo floats (one output row); more
 * takes more rows per GEMM. A 1x1x1 convolution needs no scratch. Each
 * output element is bias + one BLAS dot product over (Cin, kT, k, k). */
void ditd_cpu_conv3d_frame(const float *const *xf, int kT, size_t psx, const float *w,
                           const float *b, float *y, size_t psy, float *scratch, size_t scratch_n,
                           int Cin, int H, int W, int Cout, int k, int pad_h, int pad_w);

/* Scratch floats ditd_cpu_conv3d_frame needs for at least one output row. */
static inline size_t ditd_cpu_conv3d_scratch_row(int Cin, int kT, int k, int Wo)
{
    return (k == 1 && kT == 1) ? 0 : (size_t)Cin * kT * k * k * (size_t)Wo;
}

/* WanRMS_norm over channels, at each of n positions (one frame's pixels):
 *   y[c, i] = x[c, i] / max(||x[:, i]||_2, 1e-12) * sqrt(C) * gamma[c],
 * then SiLU when silu != 0 (F.normalize(x, dim=1) * scale * gamma). The
 * squares are summed in double. gamma (C) or NULL (ones); y may alias x
 * (same ps). */
void ditd_cpu_rmsnorm_channels(const float *x, size_t psx, float *y, size_t psy, int C, int n,
                               const float *gamma, int silu);

/* One output frame of AvgDown3D(Cin, Cout, ft, fs): the ft input frames
 * xf[0..ft) (NULL = zeros: the time padding), each (Cin, H, W) plane
 * stride psx, H and W multiples of fs, into y (Cout, H / fs, W / fs) plane
 * stride psy: with factor = ft fs fs, group = Cin factor / Cout, channel
 * j = c factor + a fs fs + p fs + q of the unshuffled tensor is
 * xf[a][c][h fs + p][w fs + q], and y[o] is the mean of channels
 * [o group, (o + 1) group). accumulate != 0 adds y's old values
 * (x + avg_shortcut(x_copy)). */
void ditd_cpu_avgdown3d_frame(const float *const *xf, size_t psx, int Cin, int H, int W, int Cout,
                              int ft, int fs, float *y, size_t psy, int accumulate);

/* Output frame t ft + a of DupUp3D(Cin, Cout, ft, fs) for input frame x
 * (Cin, H, W) plane stride psx: with factor = ft fs fs and repeats =
 * Cout factor / Cin, y[o][h fs + p][w fs + q] = x[(o factor + a fs fs + p fs
 * + q) / repeats][h][w]; y (Cout, H fs, W fs) plane stride psy;
 * accumulate != 0 adds to y. */
void ditd_cpu_dupup3d_frame(const float *x, size_t psx, int Cin, int H, int W, int Cout, int ft,
                            int fs, int a, float *y, size_t psy, int accumulate);

#ifdef __cplusplus
}
#endif

#endif
