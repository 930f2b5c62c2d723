/* CPU kernels for the text encoders (CLIP, T5): a linear layer whose weight
 * stays in its stored 16-bit type and is widened to f32 one panel at a time,
 * the activations those models use, RMSNorm, an embedding gather from a
 * 16-bit table, and self-attention over a short sequence with a causal mask,
 * a key padding mask and an additive relative-position bias.
 *
 * What this is: pure functions over caller-owned buffers, fp32 arithmetic,
 * OpenMP on the outer loops, GEMMs through BLAS. What it is not: no
 * allocation (scratch comes from the caller), no model knowledge. The
 * general kernels (linear, attention with LSE) are in cpu_kernels.h.
 *
 * Layouts as cpu_kernels.h: row-major, nn.Linear weights (N_out, K_in),
 * tokens (B, N, D), attention rows (B, N, H, Dh) with a row stride.
 */
#ifndef DITD_KERNELS_TEXT_KERNELS_H
#define DITD_KERNELS_TEXT_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* How a weight is stored in memory. */
typedef enum ditd_cpu_wtype {
    DITD_CPU_W_F32 = 0,
    DITD_CPU_W_F16,
    DITD_CPU_W_BF16,
} ditd_cpu_wtype;

/* Activations of the text encoders (transformers' ACT2FN names):
 *   GELU       "gelu":       0.5 x (1 + erf(x / sqrt 2))
 *   GELU_TANH  "gelu_new":   0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
 *   QUICK_GELU "quick_gelu": x * sigmoid(1.702 x)
 *   RELU       "relu":       max(x, 0) */
typedef enum ditd_cpu_tact {
    DITD_CPU_TACT_NONE = 0,
    DITD_CPU_TACT_GELU,
    DITD_CPU_TACT_GELU_TANH,
    DITD_CPU_TACT_QUICK_GELU,
    DITD_CPU_TACT_RELU,
} ditd_cpu_tact;

/* Rows of f32 scratch ditd_cpu_linear_wt widens at a time. */
#define DITD_CPU_WT_PANEL 256

/* y (M, N) = act(x (M, K) @ w^T + b), w (N, K) stored as wt; b (N) f32 or
 * NULL. An f32 w goes straight to sgemm; a 16-bit w is widened to f32 in
 * panels of scratch_len / K rows (at least one row: scratch_len >= K) into
 * `scratch`, each panel one sgemm. ldx, ldy: row strides in elements. */
void ditd_cpu_linear_wt(const float *x, size_t ldx, const void *w, ditd_cpu_wtype wt,
                        const float *b, float *y, size_t ldy, int M, int N, int K,
                        ditd_cpu_tact act, float *scratch, size_t scratch_len);

/* y[r, c] = act(y[r, c]) for rows x cols with row stride ldy. */
void ditd_cpu_tact_apply(float *y, size_t ldy, int rows, int cols, ditd_cpu_tact act);

/* y[i] *= x[i]. */
void ditd_cpu_mul(float *y, const float *x, size_t n);

/* out[i, :] = table[ids[i], :] widened to f32; table (rows, D) stored as wt.
 * ids are checked by the caller. */
void ditd_cpu_embedding_wt(const void *table, ditd_cpu_wtype wt, const int64_t *ids,
                           float *out, int n, int D);

/* T5LayerNorm: y = w * x / sqrt(mean(x^2) + eps), no mean, no bias; the mean
 * of squares accumulated in double. x, y: (rows, D), y may alias x; w (D). */
void ditd_cpu_rmsnorm(const float *x, float *y, int rows, int D, float eps, const float *w);

/* Longest sequence ditd_cpu_attention_masked takes. */
#define DITD_CPU_MASKED_ATTN_MAX_N 4096

/* Self-attention over one short sequence per batch element, as transformers'
 * eager attention computes it:
 *   s[i, j] = scale * q_i . k_j + rel[h, j - i + N - 1]   (rel may be NULL)
 *   s[i, j] = -FLT_MAX where causal && j > i, or keep[b, j] == 0
 *   o_i = softmax_j(s[i, :]) v
 * q, k, v, o: (B, N, H, Dh) with row strides ldq, ldk, ldv, ldo; rel: the
 * relative-position bias (H, 2N - 1) (T5's buckets, looked up by the
 * caller); keep: (B, N) or NULL. A masked score is the most negative float
 * rather than -inf, so a row whose keys are all masked averages all of v,
 * exactly what adding torch.finfo(dtype).min gives. 0 < N <=
 * DITD_CPU_MASKED_ATTN_MAX_N. Per (b, h): one sgemm for the scores into
 * scratch (N * N floats), the softmax rows in OpenMP, one sgemm for P V. */
void ditd_cpu_attention_masked(const float *q, size_t ldq, const float *k, size_t ldk,
                               const float *v, size_t ldv, float *o, size_t ldo, int B, int N,
                               int H, int Dh, float scale, const float *rel,
                               const uint8_t *keep, int causal, float *scratch);

#ifdef __cplusplus
}
#endif

#endif
