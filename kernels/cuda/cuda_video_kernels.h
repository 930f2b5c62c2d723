/* CUDA video kernels for the Wan VAE: the GPU twins of
 * kernels/cpu/video_kernels.h (same layouts: frames of C planes with plane
 * stride ps, frame pointer arrays with NULL for zeros), bf16 storage, fp32
 * arithmetic.
 *
 * What this is: launchers over caller-owned device buffers on the caller's
 * stream, returning 0 or a CUDA error code (cudaErrorInvalidValue for
 * shapes they refuse, without launching), as kernels/cuda/cuda_kernels.h.
 * What it is not: no allocation, no feature cache, no model knowledge.
 */
#ifndef DITD_KERNELS_CUDA_VIDEO_KERNELS_H
#define DITD_KERNELS_CUDA_VIDEO_KERNELS_H

#include <stddef.h>

#include "kernels/cuda/cuda_kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DITD_CUDA_CONV3D_MAX_KT 4 /* time taps (frame pointers passed by value) */

/* One output frame of nn.Conv3d as ditd_cpu_conv3d_frame: per chunk of
 * output rows an im2col kernel writes cols (rows Wo, Cin kT k k) into
 * scratch, one cuBLASLt GEMM with the bias fused gives (rows Wo, Cout)
 * after it, and a transpose writes the planes. scratch: (Cin kT k k + Cout)
 * Wo elements per output row, at least one row. */
int ditd_cuda_conv3d_frame(ditd_cuda_gemm *g, const void *const *xf, int kT, size_t psx,
                           const void *w, const void *b, void *y, size_t psy, void *scratch,
                           size_t scratch_n, int Cin, int H, int W, int Cout, int k, int pad_h,
                           int pad_w, ditd_cuda_stream st);

/* WanRMS_norm over channels at n positions (+ SiLU); gamma (C) or NULL. */
int ditd_cuda_rmsnorm_channels(const void *x, size_t psx, void *y, size_t psy, int C, int n,
                               const void *gamma, int silu, ditd_cuda_stream st);

/* AvgDown3D / DupUp3D, one output frame, as the CPU kernels. */
int ditd_cuda_avgdown3d_frame(const void *const *xf, size_t psx, int Cin, int H, int W, int Cout,
                              int ft, int fs, void *y, size_t psy, int accumulate,
                              ditd_cuda_stream st);
int ditd_cuda_dupup3d_frame(const void *x, size_t psx, int Cin, int H, int W, int Cout, int ft,
                            int fs, int a, void *y, size_t psy, int accumulate,
                            ditd_cuda_stream st);

#ifdef __cplusplus
}
#endif

#endif
