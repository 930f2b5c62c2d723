/* CUDA image kernels for the VAE: the GPU twins of kernels/cpu/image_kernels.h
 * (same layouts: images (B, C, rows, W) with plane stride ps), bf16 storage,
 * fp32 arithmetic, double for the GroupNorm statistics.
 *
 * What this is: launchers over caller-owned device buffers on the caller's
 * stream, returning 0 or a CUDA error code (cudaErrorInvalidValue for shapes
 * they refuse, without launching), as kernels/cuda/cuda_kernels.h. What it
 * is not: no allocation, no communication, no model knowledge.
 */
#ifndef DITD_KERNELS_CUDA_IMAGE_KERNELS_H
#define DITD_KERNELS_CUDA_IMAGE_KERNELS_H

#include <stddef.h>

#include "kernels/cuda/cuda_kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* nn.Conv2d as ditd_cpu_conv2d: per chunk of output rows, an im2col kernel
 * writes cols (rows Wo, Cin k k) into scratch, one cuBLASLt GEMM with the
 * bias fused gives (rows Wo, Cout) after it, and a transpose writes the
 * planes. scratch: (Cin k k + Cout) Wo elements per output row, at least
 * one row. */
int ditd_cuda_conv2d(ditd_cuda_gemm *g, const void *x, size_t psx, const void *w, const void *b,
                     void *y, size_t psy, void *scratch, size_t scratch_n, int B, int Cin, int Hx,
                     int Wx, int Cout, int k, int s, int pad_t, int pad_b, int pad_l, int pad_r,
                     ditd_cuda_stream st);

/* GroupNorm statistics: d_stats (B, G, 2) device doubles, sum and sum of squares. */
int ditd_cuda_groupnorm_stats(const void *x, size_t ps, int B, int C, int rows, int W, int G,
                              double *d_stats, ditd_cuda_stream st);

#define DITD_CUDA_GN_MAX_BG 128 /* B * G the apply kernel takes (passed by value) */

/* GroupNorm apply (+ SiLU): h_mean, h_rstd host (B, G), read now (by value). */
int ditd_cuda_groupnorm_apply(const void *x, size_t psx, void *y, size_t psy, int B, int C,
                              int rows, int W, int G, const float *h_mean, const float *h_rstd,
                              const void *gamma, const void *beta, int silu, ditd_cuda_stream st);

int ditd_cuda_upsample_nearest2x(const void *x, size_t psx, void *y, size_t psy, int B, int C,
                                 int rows, int W, ditd_cuda_stream st);

/* One image: planes (C, n) stride ps <-> tokens (n, C); accumulate adds. */
int ditd_cuda_planes_to_tokens(const void *x, size_t ps, void *t, int C, int n,
                               ditd_cuda_stream st);
int ditd_cuda_tokens_to_planes(const void *t, void *y, size_t ps, int C, int n, int accumulate,
                               ditd_cuda_stream st);

#ifdef __cplusplus
}
#endif

#endif
