/* GGML block types, dequantized to f32 on the CPU exactly as ggml (and the
 * gguf package's numpy `gguf.quants.dequantize`) does it, bit for bit.
 *
 * A quantized tensor is rows of blocks: each block holds `elems` values in
 * `bytes` bytes (Q8_0: 32 values in 34 bytes, a fp16 scale and 32 int8); a
 * row of K values is K / elems blocks. The arithmetic is ggml's: fp16 scales
 * widened exactly, then fp32 products and sums, one rounding each, never
 * fused (this file is compiled with -ffp-contract=off: an FMA would change
 * the last bit of d * q - m).
 *
 * Types are named by their ggml numbers (the GGUF tensor-info type field),
 * so that readers of ggml files pass the number through. Two more are not
 * ggml's: the 8-bit floats of FP8 checkpoints (safetensors F8_E4M3, i.e.
 * torch's float8_e4m3fn, and F8_E5M2), one value a byte, widened exactly
 * (every such value is an f32), then multiplied by their row's scale when
 * the file has one (one f32 rounding, as `w.float() * scale`); their numbers
 * lie outside ggml's range, which the GGUF reader refuses. What it is not: a
 * quantizer, a reader of files (engine/io/gguf.c validates them), or a
 * GEMM (gemm_packed.c dequantizes panels through ditd_cpu_dequant_rows).
 */
#ifndef DITD_KERNELS_CPU_DEQUANT_H
#define DITD_KERNELS_CPU_DEQUANT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The ggml type numbers this file dequantizes. */
enum {
    DITD_Q_F32 = 0,
    DITD_Q_F16 = 1,
    DITD_Q_Q4_0 = 2,
    DITD_Q_Q4_1 = 3,
    DITD_Q_Q5_0 = 6,
    DITD_Q_Q5_1 = 7,
    DITD_Q_Q8_0 = 8,
    DITD_Q_Q2_K = 10,
    DITD_Q_Q3_K = 11,
    DITD_Q_Q4_K = 12,
    DITD_Q_Q5_K = 13,
    DITD_Q_Q6_K = 14,
    DITD_Q_BF16 = 30,
    /* not ggml types (ggml has none for FP8): safetensors' F8_E4M3 / F8_E5M2 */
    DITD_Q_F8_E4M3 = 1000,
    DITD_Q_F8_E5M2 = 1001,
};

/* The type's name as files write it ("Q8_0", "F8_E4M3"), or NULL. */
const char *ditd_cpu_dequant_name(int type);

/* 1 for the 8-bit float types (which may carry a scale per row), else 0. */
int ditd_cpu_dequant_is_fp8(int type);

/* 1 when `type` is one of the above, else 0. *elems and *bytes (either may
 * be NULL) get the block's values and size; unsupported types leave them. */
int ditd_cpu_dequant_block(int type, int *elems, int *bytes);

/* dst[0, n) := the n values at src (any alignment), n a multiple of the
 * type's block elems, src the start of a block. `type` must be supported
 * (asserted). Single-threaded: callers split rows over their own threads. */
void ditd_cpu_dequant(int type, const void *src, float *dst, size_t n);

/* The weight rows [n0, n0 + rows) and values [k0, k1) of a quantized
 * (N, K) matrix (row r at src + r * row_bytes; k0, k1 multiples of the
 * block elems, or k1 == K) into dst, value (r - n0, k) at
 * dst[(k - k0) * ldd + (r - n0)] when `transpose`, else at
 * dst[(r - n0) * ldd + (k - k0)]. scale (N floats, indexed by r; NULL:
 * none) multiplies row r's values: the FP8 types' per-row (or per-tensor,
 * repeated) scales. For the packed GEMM's panels. */
void ditd_cpu_dequant_rows(int type, const void *src, size_t row_bytes, const float *scale,
                           int n0, int rows, int k0, int k1, float *dst, size_t ldd,
                           int transpose);

#ifdef __cplusplus
}
#endif

#endif
