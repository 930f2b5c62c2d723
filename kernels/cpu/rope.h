/* CPU kernels of the FLUX family's attention inputs: rotary position
 * embedding (RoPE, Diffusers' use_real / repeat_interleave_real form), the
 * per-head RMSNorm of q and k, and the two host-side tables they need
 * (the RoPE cos/sin per token, the sinusoidal timestep features with a
 * free downscale_freq_shift).
 *
 * What it is: pure functions over caller-owned float buffers, f32, OpenMP
 * on the outer loop. What it is not: no model knowledge (which ids a token
 * has is the caller's), no allocation. Nothing here includes engine/.
 */
#ifndef DITD_KERNELS_CPU_ROPE_H
#define DITD_KERNELS_CPU_ROPE_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* In place, x: (B, N, H, Dh) rows of stride ld (one token's H*Dh values):
 * each pair (x[2i], x[2i+1]) of every head rotated by the token's angle i:
 *   x[2i]   <- x[2i] cos[n, i] - x[2i+1] sin[n, i]
 *   x[2i+1] <- x[2i+1] cos[n, i] + x[2i] sin[n, i]
 * cos, sin: (N, Dh/2). Dh even. (Diffusers apply_rotary_emb, use_real=True,
 * use_real_unbind_dim=-1, with cos/sin before repeat_interleave.) */
void ditd_cpu_rope(float *x, size_t ld, const float *cos, const float *sin, int B, int N, int H,
                   int Dh);

/* The RoPE table of N tokens with n_axes position ids each (ids (N, n_axes),
 * float as Diffusers' ids.float()): axis a takes dims[a] of the head's Dh =
 * sum(dims) channels, pair j of the axis has the angle
 *   pos[n, a] * theta^(-2j / dims[a])          (computed in double)
 * cos, sin: (N, Dh/2) float (Diffusers FluxPosEmbed: get_1d_rotary_pos_embed
 * per axis, freqs in float64, cast to float32, concatenated). dims even. */
void ditd_cpu_rope_table(const float *ids, int N, int n_axes, const int *dims, double theta,
                         float *cos, float *sin);

/* In place RMSNorm over each head's Dh values, x: (rows, H, Dh) rows of
 * stride ld: x <- x / sqrt(mean(x^2) + eps) * w, w (Dh) (torch.nn.RMSNorm;
 * the mean accumulated in double). */
void ditd_cpu_rmsnorm_heads(float *x, size_t ld, const float *w, int rows, int H, int Dh,
                            float eps);

/* RMSNorm of whole rows whose statistics may span several ranks (Wan's
 * qk_norm "rms_norm_across_heads": one RMSNorm over all heads' H*Dh values
 * of a token, the heads split over tensor-parallel ranks). Two steps, the
 * caller summing ss over the ranks in between:
 *   row_sumsq:    ss[r] = sum_j x[r, j]^2 over this rank's n columns
 *                 (accumulated in double, stored as float);
 *   rmsnorm_rows: x[r, j] <- x[r, j] / sqrt(ss[r] / n_total + eps) * w[j],
 *                 w (n) this rank's slice of the weight (NULL: none), n_total
 *                 the whole row's width (torch.nn.RMSNorm over n_total).
 * x: (rows, n) rows of stride ld, in place. */
void ditd_cpu_row_sumsq(const float *x, size_t ld, int rows, int n, float *ss);
void ditd_cpu_rmsnorm_rows(float *x, size_t ld, const float *w, const float *ss, int rows, int n,
                           int n_total, float eps);

/* Sinusoidal timestep features as Diffusers get_timestep_embedding with
 * flip_sin_to_cos=True, scale 1, max_period 1e4 and the given
 * downscale_freq_shift (FLUX: 0, DiT: 1), in float32 as Diffusers computes
 * them: f_i = exp(-ln(1e4) i / (half - shift)), out[b] = [cos(t_b f_i), sin(t_b f_i)].
 * out: (B, dim), dim even. */
void ditd_cpu_timestep_features(const float *t, float *out, int B, int dim, float shift);

#ifdef __cplusplus
}
#endif

#endif
