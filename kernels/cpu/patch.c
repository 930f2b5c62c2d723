/* Patch embedding and unpatchify on the CPU.
 *
 * What this is: the DiT input layer (Conv2d with kernel = stride = p, as one
 * GEMM over im2col patches) and the inverse reshuffle at the output. What it
 * is not: a general convolution (no padding, no overlap, no dilation).
 */
#include "kernels/cpu/cpu_kernels.h"

#include <assert.h>
#include <omp.h>

static void patch_embed_any(const float *x, const void *w, const void *b, int w_bf16,
                            const float *pos, float *y, float *scratch,
                            int B, int C, int Hi, int Wi, int p, int D)
{
    assert(x && w && y && scratch);
    assert(B >= 0 && C > 0 && p > 0 && D > 0);
    assert(Hi > 0 && Wi > 0 && Hi % p == 0 && Wi % p == 0);
    assert(!omp_in_parallel()); /* the GEMM library must not run inside our region */

    const int gh = Hi / p, gw = Wi / p, N = gh * gw;
    const int K = C * p * p; /* patch vector: (c, i, j), as w (D, C, p, p) */
    const long rows = (long)B * N;
    if (rows == 0)
        return;

    /* im2col: scratch (B*N, K), row t = (b, r, c) holds x[b, :, r*p:(r+1)*p,
     * c*p:(c+1)*p] flattened in (channel, row, column) order. */
#pragma omp parallel for schedule(static) if (rows * K > 16384)
    for (long t = 0; t < rows; ++t) {
        const long bb = t / N;
        const int n = (int)(t % N), r = n / gw, c = n % gw;
        float *dst = scratch + (size_t)t * K;
        for (int ch = 0; ch < C; ++ch)
            for (int i = 0; i < p; ++i) {
                const float *src =
                    x + (((size_t)bb * C + ch) * Hi + (size_t)r * p + i) * Wi + (size_t)c * p;
                for (int j = 0; j < p; ++j)
                    *dst++ = src[j];
            }
    }

    /* y (B*N, D) = patches (B*N, K) @ w(D, K)^T + bias (fused in the GEMM). */
    ditd_cpu_gemm(scratch, (size_t)K, w, b, w_bf16, y, (size_t)D, (int)rows, D, K);

    /* + pos[n] (the order of PyTorch's conv bias then pos_embed add). */
    if (!pos)
        return;
#pragma omp parallel for schedule(static) if (rows * D > 16384)
    for (long t = 0; t < rows; ++t) {
        float *yr = y + (size_t)t * D;
        const float *pr = pos + (size_t)(t % N) * D;
        for (int d = 0; d < D; ++d)
            yr[d] += pr[d];
    }
}

void ditd_cpu_patch_embed(const float *x, const float *w, const float *b,
                          const float *pos, float *y, float *scratch,
                          int B, int C, int Hi, int Wi, int p, int D)
{
    patch_embed_any(x, w, b, 0, pos, y, scratch, B, C, Hi, Wi, p, D);
}

void ditd_cpu_patch_embed_bf16(const float *x, const uint16_t *w, const uint16_t *b,
                               const float *pos, float *y, float *scratch,
                               int B, int C, int Hi, int Wi, int p, int D)
{
    patch_embed_any(x, w, b, 1, pos, y, scratch, B, C, Hi, Wi, p, D);
}

void ditd_cpu_unpatchify(const float *x, float *y, int B, int C, int h, int w, int p)
{
    assert(x && y);
    assert(B >= 0 && C > 0 && h > 0 && w > 0 && p > 0);

    const int Ho = h * p, Wo = w * p;
    const long planes = (long)B * C;
    /* y[b, c, r*p + i, s*p + j] = x[b, r*w + s, (i*p + j)*C + c] */
#pragma omp parallel for schedule(static) if (planes * Ho * Wo > 16384)
    for (long bc = 0; bc < planes; ++bc) {
        const long bb = bc / C;
        const int c = (int)(bc % C);
        float *plane = y + (size_t)bc * Ho * Wo;
        for (int yy = 0; yy < Ho; ++yy) {
            const int r = yy / p, i = yy % p;
            for (int xx = 0; xx < Wo; ++xx) {
                const int s = xx / p, j = xx % p;
                plane[(size_t)yy * Wo + xx] =
                    x[((size_t)bb * h * w + (size_t)r * w + s) * ((size_t)p * p * C) +
                      ((size_t)i * p + j) * C + c];
            }
        }
    }
}
