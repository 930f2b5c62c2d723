/* Internal to kernels/cpu (ditd__ prefix): the packed-weight GEMM of
 * gemm_packed.c, called by gemm.c, which decides whether it runs
 * (ditd_cpu_gemm_packs) and converts x to bf16 for it.
 */
#ifndef DITD_KERNELS_CPU_GEMM_PACKED_H
#define DITD_KERNELS_CPU_GEMM_PACKED_H

#include "kernels/cpu/cpu_kernels.h"

/* Re-lays w (N, K), f32 or bf16 in nn.Linear's layout, in place into the
 * packed layout gemm_packed.c describes (the same bytes). 0, or -1 when the
 * temporary copy of w cannot be had (w is then unchanged). */
int ditd__cpu_pack_in_place(void *w, int w_bf16, int N, int K);

/* y (M, N) = act(x @ w^T + b) on a packed w: x f32 rows of stride ldx
 * (w_bf16 = 0) or bf16 dense (M, K) rows (w_bf16 = 1); b f32 or bf16 as w,
 * or NULL. Needs AVX-512F/BW/VL (and AVX512-BF16 for bf16): the caller
 * checks. Runs over the OpenMP threads; call it outside a parallel region. */
void ditd__cpu_gemm_packed_run(const void *x, size_t ldx, const void *wp, const void *b,
                               int w_bf16, float *y, size_t ldy, int M, int N, int K,
                               ditd_cpu_act act);

/* As ditd__cpu_gemm_packed_run on a quantized w (N rows of row_bytes at
 * qw, type qtype of kernels/cpu/dequant.h, K a multiple of its block; scale:
 * N row scales or NULL), each panel dequantized as it is read
 * (gemm_packed.c): bit-identical to the packed product on the dequantized
 * w (bf16: rounded to bf16). Not reentrant (per-thread
 * buffers kept between calls: the caller serializes). 0, or -1 when the
 * buffers cannot be had (y untouched). */
int ditd__cpu_gemm_packed_q_run(const void *x, size_t ldx, const void *qw, int qtype,
                                size_t row_bytes, const float *scale, const void *b, int bf16,
                                float *y, size_t ldy, int M, int N, int K, ditd_cpu_act act);

#endif
