/* Sinusoidal embeddings of Diffusers, reproduced operation by operation.
 *
 * What this is: the timestep embedding (get_timestep_embedding) and the 2-D
 * positional embedding (get_2d_sincos_pos_embed) with the same float32 /
 * float64 steps PyTorch takes, so the results agree with Diffusers to the
 * last bit or one ulp of the libm in use. What it is not: fast; the timestep
 * embedding is B x dim values per step and the positional embedding is made
 * once per resolution.
 */
#include "kernels/cpu/cpu_kernels.h"

#include <assert.h>
#include <math.h>
#include <string.h>

void ditd_cpu_timestep_embed(const float *t, float *out, int B, int dim)
{
    assert(t && out);
    assert(B >= 0 && dim >= 4 && dim % 2 == 0);

    const int half = dim / 2;
    /* Diffusers, in torch float32:
     *   exponent = -math.log(10000) * arange(half, float32)  (float32 product)
     *   exponent = exponent / (half - 1)                     (float32 quotient)
     *   emb = t[:, None].float() * exp(exponent)[None, :]
     *   emb = cat([cos(emb), sin(emb)])                      (flip_sin_to_cos) */
    const float neg_log_period = (float)-9.210340371976184; /* -ln(10000) */
    for (int i = 0; i < half; ++i) {
        const float exponent = (neg_log_period * (float)i) / (float)(half - 1);
        const float freq = expf(exponent);
        for (int b = 0; b < B; ++b) {
            const float arg = t[b] * freq;
            out[(size_t)b * dim + i] = cosf(arg);
            out[(size_t)b * dim + half + i] = sinf(arg);
        }
    }
}

/* dst[0:2Q] = [sin(pos * omega_i), cos(pos * omega_i)], i < Q, with
 * omega_i = 1 / 10000^(i / Q) in double: Diffusers'
 * get_1d_sincos_pos_embed_from_grid(2Q, pos) (pos is float32 there, promoted
 * to double by torch.outer with the float64 omega). */
static void sincos_1d(float *dst, int Q, float pos)
{
    for (int i = 0; i < Q; ++i) {
        const double omega = 1.0 / pow(10000.0, (double)i / (double)Q);
        const double a = (double)pos * omega;
        dst[i] = (float)sin(a);
        dst[Q + i] = (float)cos(a);
    }
}

/* Grid coordinate g of Diffusers, in torch float32:
 *   arange(n, float32) / (n / base_size) / interpolation_scale
 * (each division by a Python scalar rounds the scalar to float32 first). */
static float grid_coord(int i, int n, int base_size, float interpolation_scale)
{
    const float step = (float)((double)n / (double)base_size);
    return ((float)i / step) / interpolation_scale;
}

void ditd_cpu_pos_embed_2d(float *out, int D, int gh, int gw, int base_size,
                           float interpolation_scale)
{
    assert(out);
    assert(D > 0 && D % 4 == 0 && gh > 0 && gw > 0 && base_size > 0);
    assert(interpolation_scale > 0.0f);

    /* Token n = r * gw + c (row-major, as the patch embedding flattens).
     * Diffusers meshgrids (grid_w, grid_h) with indexing "xy", so the first
     * D/2 channels encode the column coordinate and the last D/2 the row. */
    const int half = D / 2, Q = D / 4;

    /* Each distinct coordinate is computed once: column halves into the
     * tokens of row 0, row halves into the tokens of column 0, then copied. */
    for (int c = 0; c < gw; ++c)
        sincos_1d(out + (size_t)c * D, Q, grid_coord(c, gw, base_size, interpolation_scale));
    for (int r = 0; r < gh; ++r)
        sincos_1d(out + (size_t)r * gw * D + half, Q,
                  grid_coord(r, gh, base_size, interpolation_scale));
#pragma omp parallel for schedule(static) if ((long)gh * gw * D > 65536)
    for (int r = 0; r < gh; ++r)
        for (int c = 0; c < gw; ++c) {
            float *dst = out + ((size_t)r * gw + c) * D;
            if (r > 0)
                memcpy(dst, out + (size_t)c * D, sizeof(float) * (size_t)half);
            if (c > 0)
                memcpy(dst + half, out + (size_t)r * gw * D + half,
                       sizeof(float) * (size_t)half);
        }
}
