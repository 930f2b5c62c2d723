/* CUDA compute kernels: bf16 activations and weights, fp32 accumulation and
 * statistics, sm_90 (plus PTX). The GPU twin of kernels/cpu/cpu_kernels.h.
 *
 * What this is: launchers over caller-owned device buffers, each queued on
 * the caller's stream; the layouts are exactly those of cpu_kernels.h
 * (row-major, nn.Linear weights (N, K), tokens (B, N, D), attention
 * (B, N, H, Dh) rows with a leading dimension, LSE (B, H, Nq) natural log).
 * What it is not: no allocation policy (workspaces come from the caller), no
 * communication, no model knowledge. Nothing here includes engine/.
 *
 * C callable: bf16 buffers are `void *` (2 bytes an element, the bit pattern
 * of __nv_bfloat16), fp32 buffers are `float *`. Streams are the runtime's
 * cudaStream_t, spelled as its struct so that this header needs no CUDA
 * header (NULL is the legacy default stream).
 *
 * Errors: every entry returns 0 (cudaSuccess) or a cudaError_t /
 * cublasStatus_t-derived code (see ditd_cuda_strerror): shapes it refuses
 * give cudaErrorInvalidValue (1) without launching; a launch error is read
 * back with cudaGetLastError right after the launch. Work is asynchronous:
 * an error of the kernel's execution shows up at the next synchronizing
 * call, as with any CUDA work.
 *
 * Threads: entries are reentrant except ditd_cuda_linear, which uses the
 * cuBLASLt context it is given (one per thread, see below).
 */
#ifndef DITD_KERNELS_CUDA_KERNELS_H
#define DITD_KERNELS_CUDA_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct CUstream_st;
typedef struct CUstream_st *ditd_cuda_stream;

typedef enum ditd_cuda_act {
    DITD_CUDA_ACT_NONE = 0,
    DITD_CUDA_ACT_GELU_TANH, /* 0.5x(1+tanh(sqrt(2/pi)(x+0.044715x^3))) */
    DITD_CUDA_ACT_SILU,
} ditd_cuda_act;

/* Codes beyond the CUDA runtime's: cuBLAS statuses are returned as
 * DITD_CUDA_CUBLAS_BASE + status. */
#define DITD_CUDA_CUBLAS_BASE 100000
/* A shape or device an entry does not take (the caller has another path):
 * cudaErrorNotSupported's number. */
#define DITD_CUDA_EUNSUPPORTED 801

/* A message for any code an entry returned. Static string. */
const char *ditd_cuda_strerror(int code);

/* ---- GEMM (cuBLASLt) ---- */

/* One cuBLASLt handle, its workspace and a cache of chosen algorithms per
 * shape (the heuristic runs once per shape, never again in the hot loop).
 * Owned by one thread. */
typedef struct ditd_cuda_gemm ditd_cuda_gemm;

/* workspace: device memory of ws_bytes (32 MiB is what cuBLAS recommends on
 * Hopper), owned by the caller, alive as long as the context. */
int ditd_cuda_gemm_new(void *workspace, size_t ws_bytes, ditd_cuda_gemm **out);
void ditd_cuda_gemm_free(ditd_cuda_gemm *g);

/* Shapes no cuBLASLt algorithm takes run on a plain fp32-accumulating kernel
 * (fine for a 4-wide patch vector, a collapse in speed for a DiT layer). fn
 * is called once per shape (per cached (shape, strides, alignment), at the
 * call that decides it) with a static reason; NULL: nobody is told.
 * ditd_cuda_gemm_fallbacks counts those shapes. */
typedef void (*ditd_cuda_gemm_fallback_fn)(void *ud, int M, int N, int K, size_t ldx,
                                           size_t ldy, ditd_cuda_act act, int bias,
                                           const char *why);
void ditd_cuda_gemm_on_fallback(ditd_cuda_gemm *g, ditd_cuda_gemm_fallback_fn fn, void *ud);
int ditd_cuda_gemm_fallbacks(const ditd_cuda_gemm *g);

/* y (M, N) = act(x (M, K) @ w^T + b), bf16 in and out, fp32 accumulation
 * and epilogue. w (N, K) row-major; b (N) bf16 or NULL. ldx >= K, ldy >= N
 * in elements. Bias and GELU-tanh are fused into cuBLASLt's epilogue; SiLU
 * is one elementwise pass after it. M, N, K > 0 (M == 0 is a no-op). */
int ditd_cuda_linear(ditd_cuda_gemm *g, const void *x, size_t ldx, const void *w,
                     const void *b, void *y, size_t ldy, int M, int N, int K,
                     ditd_cuda_act act, ditd_cuda_stream s);

/* The same with an FP8 weight: w (N, K) bytes of e4m3 (e5m2 = 0) or e5m2,
 * w_scale (N) fp32 device (each weight row's scale). Each row of x is
 * quantized to e4m3 with its own scale (amax / 448) into xq (M x K bytes)
 * and xs (M floats), caller-owned device scratch; then cuBLASLt's FP8 GEMM
 * with outer-vector scales on both operands, bias / GELU fused. x's
 * rounding to e4m3 is this path's error (a few percent a product, averaged
 * over K). DITD_CUDA_EUNSUPPORTED, with nothing written to y, when K is not
 * a multiple of 16, w or y is not 16-byte aligned, ldy is not a multiple
 * of 8, or cuBLASLt has no FP8 algorithm for the shape (not Hopper): the
 * caller then dequantizes (ditd_cuda_dequant_fp8_bf16) and runs
 * ditd_cuda_linear. */
int ditd_cuda_linear_fp8(ditd_cuda_gemm *g, int e5m2, const void *x, size_t ldx, const void *w,
                         const float *w_scale, const void *b, void *y, size_t ldy, int M, int N,
                         int K, ditd_cuda_act act, void *xq, float *xs, ditd_cuda_stream s);
/* out (N, K) bf16 = the FP8 weight's values times its rows' scales (NULL:
 * none), rounded to nearest even: the CPU's weight-only dequantization. */
int ditd_cuda_dequant_fp8_bf16(const void *w, int e5m2, const float *w_scale, int N, int K,
                               void *out, ditd_cuda_stream s);

/* ---- conversions and elementwise (bf16 storage, fp32 arithmetic) ---- */

/* dst (bf16) = round-to-nearest-even(src (f32)), n elements. */
int ditd_cuda_f32_to_bf16(const float *src, void *dst, size_t n, ditd_cuda_stream s);
/* dst (f32) = src (bf16), exact. */
int ditd_cuda_bf16_to_f32(const void *src, float *dst, size_t n, ditd_cuda_stream s);
/* y = act(x), y == x allowed. */
int ditd_cuda_act_apply(const void *x, void *y, size_t n, ditd_cuda_act act, ditd_cuda_stream s);
/* y = 0.5 y (1 + erf(y / sqrt 2)) in place (torch GELU, approximate="none"):
 * Wan 2.1 I2V's image embedder. */
int ditd_cuda_gelu_erf(void *y, size_t n, ditd_cuda_stream s);
/* y += x. */
int ditd_cuda_add(void *y, const void *x, size_t n, ditd_cuda_stream s);
/* Step caching (engine/pipeline/step_cache.c): y = a x + b y over n
 * elements (x NULL: y = b y), fp32 arithmetic, stored bf16. */
int ditd_cuda_axpby(void *y, const void *x, float a, float b, size_t n, ditd_cuda_stream s);

/* LoRA (kernels/cuda/lora.cu): y (M, N) bf16 rows of stride ldy = act(y + s
 * (x A^T) B^T), x (M, K) rows of stride ldx, A (r, K), B (N, r) bf16; tmp
 * (M * r) fp32 device scratch. r == 0 or s == 0: y = act(y) only. */
int ditd_cuda_lora(const void *x, size_t ldx, const void *a, const void *b, float s, void *y,
                   size_t ldy, int M, int N, int K, int r, float *tmp, ditd_cuda_act act,
                   ditd_cuda_stream st);
/* Per row of a and b (rows, D) bf16: d_out[4r..4r+3] = sum |a - b|, sum |b|,
 * sum a^2, sum b^2 in float64, one block per row and a fixed reduction
 * tree (the same bits every run); b NULL: only sum a^2. d_out device. */
int ditd_cuda_row_diff_stats(const void *a, const void *b, int rows, int D, double *d_out,
                             ditd_cuda_stream s);
/* Strided 2-D copy of rows x cols elements of es bytes (cudaMemcpy2DAsync,
 * device to device); ldd/lds in elements. */
int ditd_cuda_copy2d(void *dst, size_t ldd, const void *src, size_t lds, size_t rows,
                     size_t cols, size_t es, ditd_cuda_stream s);

/* ---- embeddings ---- */

/* out[b, :] = table[h_ids[b], :]; table (rows, D) bf16; h_ids host memory,
 * read now (passed to the kernel by value, 256 ids a launch). */
int ditd_cuda_embedding(const void *table, const int64_t *h_ids, void *out, int B, int D,
                        ditd_cuda_stream s);
/* Diffusers' get_timestep_embedding (flip_sin_to_cos, shift 1), as
 * ditd_cpu_timestep_embed, in fp32, stored bf16. h_t host memory, read now. */
int ditd_cuda_timestep_embed(const float *h_t, void *out, int B, int dim, ditd_cuda_stream s);

/* As the two above, with the ids / timesteps in device memory (B of them,
 * read when the kernel runs, so a captured CUDA graph replays with whatever
 * was uploaded there before the launch). The ids are not range-checked on
 * the device: the caller checked them on the host. */
int ditd_cuda_embedding_dev(const void *table, const int64_t *d_ids, void *out, int B, int D,
                            ditd_cuda_stream s);
int ditd_cuda_timestep_embed_dev(const float *d_t, void *out, int B, int dim, ditd_cuda_stream s);

/* ---- norms ---- */

/* y = LN(x) * (1 + scale[b]) + shift[b] as ditd_cpu_layernorm_modulate
 * (shift/scale bf16 rows of stride ld_mod, both NULL for a plain LN);
 * statistics in fp32, two passes (mean, centered variance). y may alias x. */
int ditd_cuda_layernorm_modulate(const void *x, void *y, int B, int N, int D, float eps,
                                 const void *shift, const void *scale, size_t ld_mod,
                                 ditd_cuda_stream s);
/* h[b, n, :] += gate[b, :] * y[b, n, :]. */
int ditd_cuda_gated_residual(void *h, const void *y, int B, int N, int D, const void *gate,
                             size_t ld_gate, ditd_cuda_stream s);

/* ---- the FLUX family's attention inputs (rope.cu) ----
 *
 * As ditd_cpu_rope / ditd_cpu_rmsnorm_heads (kernels/cpu/rope.h), in place,
 * fp32 arithmetic; bf16 storage, or f32 with the _f32 entries.
 * rope: x (B, N, H, Dh) rows of stride ld >= H*Dh, pair i of head h of
 * token n rotated by cos/sin (N, Dh/2), fp32 for either storage of x:
 *   x[2i] <- x[2i] c - x[2i+1] s,  x[2i+1] <- x[2i+1] c + x[2i] s.
 * Dh even and > 0. */
int ditd_cuda_rope(void *x, size_t ld, const float *cos_t, const float *sin_t, int B, int N, int H,
                   int Dh, ditd_cuda_stream s);
int ditd_cuda_rope_f32(float *x, size_t ld, const float *cos_t, const float *sin_t, int B, int N,
                       int H, int Dh, ditd_cuda_stream s);
/* rmsnorm_heads: x (rows, H, Dh) rows of stride ld >= H*Dh, each head's Dh
 * values x <- x / sqrt(mean(x^2) + eps) * w, w (Dh) or NULL (no weight);
 * the mean square in fp32, one rounding of the output. eps >= 0. */
int ditd_cuda_rmsnorm_heads(void *x, size_t ld, const void *w, int rows, int H, int Dh, float eps,
                            ditd_cuda_stream s);
int ditd_cuda_rmsnorm_heads_f32(float *x, size_t ld, const float *w, int rows, int H, int Dh,
                                float eps, ditd_cuda_stream s);

/* ---- Wan's RMSNorm across heads (rope.cu) ----
 *
 * As ditd_cpu_row_sumsq / ditd_cpu_rmsnorm_rows (kernels/cpu/rope.h):
 * x (rows, n) rows of stride ld >= n; ss (rows) fp32; w (n) of x's storage
 * or NULL. Statistics in fp32. The caller may sum ss over ranks between
 * the two (tensor parallel over heads). */
int ditd_cuda_row_sumsq(const void *x, size_t ld, int rows, int n, float *ss, ditd_cuda_stream s);
int ditd_cuda_rmsnorm_rows(void *x, size_t ld, const void *w, const float *ss, int rows, int n,
                           int n_total, float eps, ditd_cuda_stream s);
int ditd_cuda_row_sumsq_f32(const float *x, size_t ld, int rows, int n, float *ss,
                            ditd_cuda_stream s);
int ditd_cuda_rmsnorm_rows_f32(float *x, size_t ld, const float *w, const float *ss, int rows,
                               int n, int n_total, float eps, ditd_cuda_stream s);

/* ---- GGML block dequantization (dequant.cu) ----
 * rows x K values of a quantized matrix (row r at src + r * row_bytes,
 * K / block values per row, ggml type numbers as kernels/cpu/dequant.h)
 * into dst (rows of ldd >= K elements), f32 or bf16 (rounded to nearest
 * even from the f32 value). Bit-identical to ditd_cpu_dequant. An
 * unsupported type, K not a multiple of the block, or a row_bytes too
 * small: cudaErrorInvalidValue, nothing launched. */
int ditd_cuda_dequant_f32(int type, const void *src, size_t row_bytes, int rows, int K,
                          float *dst, size_t ldd, ditd_cuda_stream s);
int ditd_cuda_dequant_bf16(int type, const void *src, size_t row_bytes, int rows, int K,
                           void *dst, size_t ldd, ditd_cuda_stream s);

/* ---- attention ---- */

/* Largest head dimension ditd_cuda_attention takes (tiles padded to 32, 64,
 * 80 or 128). */
#define DITD_CUDA_ATTN_MAX_DH 128

/* Flash attention forward (bf16 mma.sync, fp32 softmax statistics), exactly
 * the contract of ditd_cpu_attention: q (B, Nq, H, Dh) rows of stride ldq,
 * k/v (B, Nk, H, Dh) strides ldk/ldv, o (B, Nq, H, Dh) stride ldo,
 * lse (B, H, Nq) fp32 natural log, or NULL. Nk == 0: o = 0, lse = -inf.
 * 0 < Dh <= DITD_CUDA_ATTN_MAX_DH; any Nq, Nk. */
int ditd_cuda_attention(const void *q, size_t ldq, const void *k, size_t ldk, const void *v,
                        size_t ldv, void *o, size_t ldo, float *lse, int B, int Nq, int Nk,
                        int H, int Dh, float scale, ditd_cuda_stream s);

/* Merge (o_blk, lse_blk) into (o_acc, lse_acc) by log-sum-exp, as
 * ditd_cpu_attention_merge (fp32 weights, bf16 outputs). */
int ditd_cuda_attention_merge(void *o_acc, size_t ldo_acc, float *lse_acc, const void *o_blk,
                              size_t ldo_blk, const float *lse_blk, int B, int Nq, int H,
                              int Dh, ditd_cuda_stream s);

/* ---- patches ---- */

/* im2col of ditd_cpu_patch_embed: x (B, C, Hi, Wi) -> cols (B*N, C*p*p),
 * patch vector in (c, i, j) order. */
int ditd_cuda_im2col(const void *x, void *cols, int B, int C, int Hi, int Wi, int p,
                     ditd_cuda_stream s);
/* y[b, n, :] += pos[n, :], y (B, N, D). */
int ditd_cuda_add_rows(void *y, const void *pos, int B, int N, int D, ditd_cuda_stream s);
/* Patch embedding: im2col into scratch (B*N*C*p*p), one GEMM with the bias
 * fused, + pos (N, D) when not NULL. As ditd_cpu_patch_embed. */
int ditd_cuda_patch_embed(ditd_cuda_gemm *g, const void *x, const void *w, const void *b,
                          const void *pos, void *y, void *scratch, int B, int C, int Hi,
                          int Wi, int p, int D, ditd_cuda_stream s);
/* As ditd_cpu_unpatchify: x (B, h*w, p*p*C), per-token (p, q, c) ->
 * y (B, C, h*p, w*p). */
int ditd_cuda_unpatchify(const void *x, void *y, int B, int C, int h, int w, int p,
                         ditd_cuda_stream s);

/* ---- noise and sampler helpers ---- */

/* The Gaussian noise of engine/core/philox.h, element by element the same
 * definition (Philox 4x32-10, Box-Muller in double): out[i] is element
 * offset + i of (seed, sample). fp32 out. CUDA's double log/sin/cos may
 * differ from glibc by an ulp, which changes the float only in rare ties. */
int ditd_cuda_philox_normal(uint64_t seed, uint64_t sample, uint64_t offset, size_t n,
                            float *out, ditd_cuda_stream s);

/* Classifier-free guidance, fp32 out from bf16 model rows:
 *   out[i] = unc[i] + g * (cond[i] - unc[i]), i < n. */
int ditd_cuda_guidance(const void *cond, const void *unc, float g, float *out, size_t n,
                       ditd_cuda_stream s);
/* The linear update every sampler step here is made of (fp32 state):
 *   x[i] = a * x[i] + b * m[i] + c * prev[i]  (prev may be NULL, then c = 0),
 *   then clamped to [-clip, clip] when clip > 0. */
int ditd_cuda_lincomb(float *x, float a, const float *m, float b, const float *prev, float c,
                      float clip, size_t n, ditd_cuda_stream s);

#ifdef __cplusplus
}
#endif

#endif
