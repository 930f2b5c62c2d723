/* CPU compute kernels: fp32 activations (weights f32 or bf16), OpenMP on the
 * outer loops, GEMMs through a library (oneDNN or OpenBLAS, gemm.c).
 *
 * What this is: pure functions over caller-owned float buffers. What it is not:
 * no allocation policy (scratch comes from the caller), no communication, no
 * model knowledge. Nothing here includes engine/ or server/.
 *
 * Layout conventions (row-major everywhere):
 *   - a "linear" weight is PyTorch's nn.Linear layout, W (N_out, K_in), so
 *     y = x @ W^T + b;
 *   - token activations are (B, N, D) contiguous, i.e. (rows = B*N, D);
 *   - attention Q/K/V/O are (B, N, H, Dh) inside rows of stride ld (>= H*Dh),
 *     which is exactly the output of a to_q/to_k/to_v linear (ld = H*Dh), or a
 *     view into a fused QKV buffer (ld = 3*H*Dh);
 *   - the log-sum-exp of attention is (B, H, Nq), natural log, of the scaled
 *     scores.
 *
 * Threading: every function may use OpenMP internally; BLAS is called outside
 * OpenMP parallel regions (one threading runtime, see README). Callers must
 * not call these from inside their own parallel region.
 */
#ifndef DITD_KERNELS_CPU_KERNELS_H
#define DITD_KERNELS_CPU_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Activation fused after a linear layer. */
typedef enum ditd_cpu_act {
    DITD_CPU_ACT_NONE = 0,
    DITD_CPU_ACT_GELU_TANH, /* 0.5x(1+tanh(sqrt(2/pi)(x+0.044715x^3))) */
    DITD_CPU_ACT_SILU,
} ditd_cpu_act;

/* y (M, N) = act(x (M, K) @ w^T + b); w is (N, K); b may be NULL.
 * ldx/ldy are row strides of x and y in elements (>= K, >= N). */
void ditd_cpu_linear(const float *x, size_t ldx, const float *w, const float *b,
                     float *y, size_t ldy, int M, int N, int K, ditd_cpu_act act);

/* As ditd_cpu_linear with bf16 weights and bias (w (N, K), b (N) or NULL):
 * x is rounded to bf16 (nearest-even), the products are bf16 x bf16 summed
 * in fp32, y stays f32; bias and activation in f32. */
void ditd_cpu_linear_bf16(const float *x, size_t ldx, const uint16_t *w, const uint16_t *b,
                          float *y, size_t ldy, int M, int N, int K, ditd_cpu_act act);

/* The GEMM under both (kernels/cpu/gemm.c): y (M, N) = x @ w^T (+ b), w and
 * b f32 (w_bf16 = 0) or bf16 (w_bf16 = 1, x rounded to bf16 first). oneDNN
 * matmul with the bias fused when built with it, else (or with
 * DITD_CPU_GEMM=openblas in the environment) OpenBLAS sgemm. Serialized by
 * one lock (the library uses every thread). */
void ditd_cpu_gemm(const float *x, size_t ldx, const void *w, const void *b, int w_bf16, float *y,
                   size_t ldy, int M, int N, int K);

/* As ditd_cpu_gemm, and act fused into oneDNN's matmul as a post-op where
 * oneDNN runs the product (M > 16 rows). Returns 1 when act was applied, 0
 * when the caller still has to apply it (few rows, OpenBLAS). */
int ditd_cpu_gemm_act(const float *x, size_t ldx, const void *w, const void *b, int w_bf16,
                      float *y, size_t ldy, int M, int N, int K, ditd_cpu_act act);

/* Linear layers on packed weights (kernels/cpu/gemm_packed.c): on a CPU
 * with AVX-512 (F, BW, VL; bf16 also AVX512-BF16), unless DITD_CPU_GEMM
 * names a library (onednn, openblas), a linear weight is re-laid once, in
 * place and in the same bytes, by ditd_cpu_pack_weight, and every product
 * with it goes through ditd_cpu_gemm_packed. ditd_cpu_gemm_packs(w_bf16)
 * says whether that is so in this process (decided once); where it is not,
 * ditd_cpu_pack_weight leaves w as it is and returns 0, and w stays in
 * nn.Linear's layout for ditd_cpu_linear. ditd_cpu_pack_weight returns -1
 * when its temporary copy of w cannot be allocated (w unchanged). */
int ditd_cpu_gemm_packs(int w_bf16);
int ditd_cpu_pack_weight(void *w, int w_bf16, int N, int K);
/* y (M, N) = act(x (M, K) @ w^T + b) for a packed w, f32 (w_bf16 = 0) or
 * bf16 (x rounded to bf16 first, fp32 sums); b as w's type, or NULL. Bias
 * and activation applied inside. */
void ditd_cpu_gemm_packed(const float *x, size_t ldx, const void *wp, const void *b, int w_bf16,
                          float *y, size_t ldy, int M, int N, int K, ditd_cpu_act act);

/* A linear weight (N, K) kept quantized in memory: N rows of row_bytes,
 * each K / block values in GGML blocks of ggml type `type`
 * (kernels/cpu/dequant.h), as a GGUF file stores an nn.Linear weight.
 * Borrowed memory; nothing is re-laid. */
typedef struct ditd_cpu_qweight {
    int type;
    int N, K;
    size_t row_bytes;
    const void *data;
    const float *scale; /* N row scales (FP8 types), or NULL */
} ditd_cpu_qweight;

/* y (M, N) = act(x @ dequant(w)^T + b), computed in f32 (bf16 = 0; b f32)
 * or bf16 (bf16 = 1: x and the dequantized w rounded to bf16, fp32 sums; b
 * bf16), b may be NULL. On the packed kernel's CPUs each 64-row panel is
 * dequantized as it is read, and y equals ditd_cpu_gemm_packed on the
 * dequantized (rounded) weight bit for bit; elsewhere the whole weight is
 * dequantized into a workspace kept for the process (kernels/cpu/
 * linear_q.c). Calls are serialized. 0, or -1 out of memory (y untouched). */
int ditd_cpu_linear_q(const float *x, size_t ldx, const ditd_cpu_qweight *w, const void *b,
                      int bf16, float *y, size_t ldy, int M, ditd_cpu_act act);

/* One line naming the GEMM library, the CPU's instruction set as the library
 * sees it and the kernels it picked for f32 and bf16 ("oneDNN 2.6.3, cpu isa
 * avx512_core_bf16; f32 brg:avx512_core, bf16 brg:avx512_core_bf16").
 * Static storage; the first call initializes the library. */
const char *ditd_cpu_gemm_info(void);

/* f32 <-> bf16 (round to nearest even; NaN stays NaN). */
void ditd_cpu_f32_to_bf16(const float *src, uint16_t *dst, size_t n);
void ditd_cpu_bf16_to_f32(const uint16_t *src, float *dst, size_t n);

/* Whether this CPU has AVX512-BF16 or AMX-BF16 (bf16 dot products in
 * hardware): where bf16 weights run at about twice the f32 rate. */
int ditd_cpu_has_bf16_dot(void);

/* The FMA peak of `threads` threads (<= 0: OpenMP's default) in GFLOP/s:
 * 24 independent accumulator chains per thread, 512-bit where the CPU has
 * AVX-512 (*bits = 512) else 256-bit (*bits = 256); the best of the
 * samples (about 10 ms each) taken during `seconds`. 0 without FMA. kernels/cpu/peak.c. */
double ditd_cpu_fma_peak_gflops(int threads, double seconds, int *bits);

/* y = act(x), elementwise, in place allowed. */
void ditd_cpu_act_apply(float *y, size_t n, ditd_cpu_act act);

/* LoRA (kernels/cpu/lora.c): y (M, N), rows of stride ldy, = act(y + s (x
 * A^T) B^T) with x (M, K) rows of stride ldx, A (r, K), B (N, r); tmp holds
 * M * r floats. r == 0 or s == 0: y = act(y) only. The activation comes
 * after the adapter's term (PEFT wraps the Linear, not its activation). */
void ditd_cpu_lora(const float *x, size_t ldx, const float *a, const float *b, float s, float *y,
                   size_t ldy, int M, int N, int K, int r, float *tmp, ditd_cpu_act act);

/* Row-wise LayerNorm without affine, then adaLN modulation:
 *   y[b, n, :] = (x - mean) / sqrt(var + eps) * (1 + scale[b, :]) + shift[b, :]
 * x, y: (B, N, D), y may alias x. shift/scale: rows of D for each b with row
 * stride ld_mod (so they can point into a fused (B, 6D) modulation buffer).
 * shift == NULL and scale == NULL gives a plain (non-affine) layernorm.
 * Statistics per row in two passes (mean, then centered biased variance),
 * accumulated in double; the normalization itself is in float. */
void ditd_cpu_layernorm_modulate(const float *x, float *y, int B, int N, int D,
                                 float eps, const float *shift, const float *scale,
                                 size_t ld_mod);

/* Affine LayerNorm (elementwise_affine=True): y = norm(x) * g + beta.
 * x, y: (rows, D), y may alias x; g, beta: (D), either may be NULL (1, 0). */
void ditd_cpu_layernorm_affine(const float *x, float *y, int rows, int D, float eps,
                               const float *g, const float *beta);

/* Gated residual: h[b, n, :] += gate[b, :] * y[b, n, :]. gate rows stride ld_gate. */
void ditd_cpu_gated_residual(float *h, const float *y, int B, int N, int D,
                             const float *gate, size_t ld_gate);

/* Largest head dimension ditd_cpu_attention accepts. Its tiles are sized for
 * it and live on the stack of each OpenMP thread: about 430 KiB (glibc and
 * libgomp threads get 8 MiB by default; OMP_STACKSIZE must not go below
 * 1M). */
#define DITD_CPU_ATTN_MAX_DH 512 /* the VAE mid-block: one head of 512 */

/* Attention with log-sum-exp output.
 *   q: (B, Nq, H, Dh) row stride ldq; k, v: (B, Nk, H, Dh) row strides ldk, ldv;
 *   o: (B, Nq, H, Dh) row stride ldo; lse: (B, H, Nq) or NULL.
 *   o = softmax(scale * q k^T) v, lse = log(sum exp(scale * q k^T)).
 * Tiled and numerically stable (running max); scratch is internal stack/tile
 * storage, no heap allocation. 0 < Dh <= DITD_CPU_ATTN_MAX_DH.
 * Nk == 0 gives o = 0 and lse = -INFINITY (the empty result, which
 * ditd_cpu_attention_merge treats as a no-op). */
void ditd_cpu_attention(const float *q, size_t ldq, const float *k, size_t ldk,
                        const float *v, size_t ldv, float *o, size_t ldo, float *lse,
                        int B, int Nq, int Nk, int H, int Dh, float scale);

/* Merge a partial attention result into an accumulator by log-sum-exp:
 *   given (o_acc, lse_acc) and (o_blk, lse_blk) over disjoint key sets,
 *   o_acc <- (e^{lse_acc} o_acc + e^{lse_blk} o_blk) / (e^{lse_acc} + e^{lse_blk})
 *   lse_acc <- log(e^{lse_acc} + e^{lse_blk}).
 * Layouts as ditd_cpu_attention. lse_acc = -INFINITY means "empty". */
void ditd_cpu_attention_merge(float *o_acc, size_t ldo_acc, float *lse_acc,
                              const float *o_blk, size_t ldo_blk, const float *lse_blk,
                              int B, int Nq, int H, int Dh);

/* Patch embedding (Conv2d, kernel = stride = p, with bias) flattened to tokens:
 *   x: (B, C, Hi, Wi) NCHW, Hi % p == Wi % p == 0; w: (D, C, p, p); b: (D) or NULL;
 *   y: (B, N, D), N = (Hi/p)*(Wi/p), tokens in row-major (h, w) order;
 *   pos: (N, D) added after, or NULL.
 * scratch: at least B*N*C*p*p floats (im2col). */
void ditd_cpu_patch_embed(const float *x, const float *w, const float *b,
                          const float *pos, float *y, float *scratch,
                          int B, int C, int Hi, int Wi, int p, int D);

/* As ditd_cpu_patch_embed with bf16 w and b (the GEMM of ditd_cpu_linear_bf16). */
void ditd_cpu_patch_embed_bf16(const float *x, const uint16_t *w, const uint16_t *b,
                               const float *pos, float *y, float *scratch,
                               int B, int C, int Hi, int Wi, int p, int D);

/* Unpatchify: x: (B, N, p*p*C) with per-token layout (p, q, c), N = h*w;
 * y: (B, C, h*p, w*p) NCHW. (Diffusers: reshape(h,w,p,p,c), "nhwpqc->nchpwq".) */
void ditd_cpu_unpatchify(const float *x, float *y, int B, int C, int h, int w, int p);

/* Sinusoidal timestep embedding, Diffusers get_timestep_embedding with
 * flip_sin_to_cos=True, downscale_freq_shift=1, scale=1, max_period=10000:
 *   out[b, :] = [cos(t_b * f_i), sin(t_b * f_i)], f_i = exp(-ln(1e4) * i / (half - 1)),
 *   i in [0, half), half = dim/2. out: (B, dim). dim even. */
void ditd_cpu_timestep_embed(const float *t, float *out, int B, int dim);

/* 2-D sin-cos positional embedding, Diffusers get_2d_sincos_pos_embed with
 * grid (gh, gw), base_size, interpolation_scale; computed in double, stored
 * as float. out: (gh*gw, D); D % 4 == 0. Token n = r*gw + c; channels
 * [0, D/2) encode the column c, [D/2, D) the row r (Diffusers' order), each
 * as [sin(g*omega_i), cos(g*omega_i)], omega_i = 10000^(-i/(D/4)), with the
 * float32 grid coordinate g = i / (n / base_size) / interpolation_scale.
 * DiT's PatchEmbed uses base_size = sample_size / patch_size and
 * interpolation_scale = 1. */
void ditd_cpu_pos_embed_2d(float *out, int D, int gh, int gw, int base_size,
                           float interpolation_scale);

#ifdef __cplusplus
}
#endif

#endif
