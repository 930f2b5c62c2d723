/* CUDA image kernels for the VAE (kernels/cuda/cuda_image_kernels.h):
 * im2col + cuBLASLt convolution, GroupNorm statistics (double) and apply
 * (+ SiLU), nearest x2 upsampling, planes <-> tokens. Launcher + kernel +
 * entry, as the rest of kernels/cuda. */
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_image_kernels.h"

/* ---- conv2d ---- */

/* cols (nr Wo, Cin k k) for output rows [r0, r0 + nr), row-major. */
static __global__ void im2col_kernel(const bf16 *x, size_t psx, bf16 *cols, int Cin, int Hx, int Wx,
                                     int k, int s, int pad_t, int pad_l, int r0, int nr, int Wo)
{
    const size_t K = (size_t)Cin * k * k, n = (size_t)nr * Wo * K;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t p = i / K, kk = i % K;
        int ci = (int)(kk / (k * k)), ky = (int)(kk / k) % k, kx = (int)(kk % k);
        int oy = r0 + (int)(p / Wo), ox = (int)(p % Wo);
        int iy = oy * s + ky - pad_t, ix = ox * s + kx - pad_l;
        cols[i] = (iy >= 0 && iy < Hx && ix >= 0 && ix < Wx) ? x[ci * psx + (size_t)iy * Wx + ix]
                                                             : __float2bfloat16_rn(0.0f);
    }
}

/* planes y (C, n) stride ps (+)= tokens t (n, C) */
static __global__ void tokens_to_planes_kernel(const bf16 *t, bf16 *y, size_t ps, int C, int n,
                                               int accumulate)
{
    const size_t total = (size_t)C * n;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t c = i / n, p = i % n;
        float v = ld_bf16(t + p * C + c);
        bf16 *d = y + c * ps + p;
        st_bf16(d, accumulate ? ld_bf16(d) + v : v);
    }
}

static __global__ void planes_to_tokens_kernel(const bf16 *x, size_t ps, bf16 *t, int C, int n)
{
    const size_t total = (size_t)C * n;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t p = i / C, c = i % C;
        t[i] = x[c * ps + p];
    }
}

extern "C" int ditd_cuda_conv2d(ditd_cuda_gemm *g, const void *x, size_t psx, const void *w,
                                const void *b, void *y, size_t psy, void *scratch,
                                size_t scratch_n, int B, int Cin, int Hx, int Wx, int Cout, int k,
                                int s, int pad_t, int pad_b, int pad_l, int pad_r,
                                ditd_cuda_stream st)
{
    if (!g || !x || !w || !y || !scratch || B < 0 || Cin <= 0 || Cout <= 0 || k <= 0 || s <= 0)
        return DITD_CUDA_EINVAL;
    const int Ho = (Hx + pad_t + pad_b - k) / s + 1, Wo = (Wx + pad_l + pad_r - k) / s + 1;
    const size_t K = (size_t)Cin * k * k, per_row = (K + (size_t)Cout) * (size_t)Wo;
    if (Ho <= 0 || Wo <= 0 || psx < (size_t)Hx * Wx || psy < (size_t)Ho * Wo || scratch_n < per_row)
        return DITD_CUDA_EINVAL;
    int chunk = (int)(scratch_n / per_row);
    chunk = chunk > Ho ? Ho : chunk;
    bf16 *cols = (bf16 *)scratch;
    for (int bi = 0; bi < B; bi++) {
        const bf16 *xb = (const bf16 *)x + (size_t)bi * Cin * psx;
        bf16 *yb = (bf16 *)y + (size_t)bi * Cout * psy;
        for (int r0 = 0; r0 < Ho; r0 += chunk) {
            const int nr = Ho - r0 < chunk ? Ho - r0 : chunk, np = nr * Wo;
            bf16 *tok = cols + (size_t)np * K;
            im2col_kernel<<<ew_blocks((size_t)np * K), DITD_CUDA_EW_THREADS, 0, (cudaStream_t)st>>>(
                xb, psx, cols, Cin, Hx, Wx, k, s, pad_t, pad_l, r0, nr, Wo);
            int rc = launch_check();
            if (!rc)
                rc = ditd_cuda_linear(g, cols, K, w, b, tok, (size_t)Cout, np, Cout, (int)K,
                                      DITD_CUDA_ACT_NONE, st);
            if (rc)
                return rc;
            tokens_to_planes_kernel<<<ew_blocks((size_t)np * Cout), DITD_CUDA_EW_THREADS, 0,
                                      (cudaStream_t)st>>>(tok, yb + (size_t)r0 * Wo, psy, Cout, np, 0);
            if ((rc = launch_check()))
                return rc;
        }
    }
    return 0;
}

/* ---- GroupNorm ---- */

#define GN_THREADS 256

/* One block per (b, g): sum and sum of squares in double. */
static __global__ void gn_stats_kernel(const bf16 *x, size_t ps, int C, int rows, int W, int G,
                                       double *stats)
{
    __shared__ double s1[GN_THREADS], s2[GN_THREADS];
    const int bg = blockIdx.x, b = bg / G, g = bg % G, cg = C / G;
    const size_t n = (size_t)rows * W, total = (size_t)cg * n;
    double a = 0.0, q = 0.0;
    for (size_t i = threadIdx.x; i < total; i += blockDim.x) {
        size_t c = i / n, p = i % n;
        double v = ld_bf16(x + ((size_t)b * C + (size_t)g * cg + c) * ps + p);
        a += v;
        q += v * v;
    }
    s1[threadIdx.x] = a;
    s2[threadIdx.x] = q;
    __syncthreads();
    for (int o = blockDim.x / 2; o > 0; o /= 2) {
        if ((int)threadIdx.x < o) {
            s1[threadIdx.x] += s1[threadIdx.x + o];
            s2[threadIdx.x] += s2[threadIdx.x + o];
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        stats[(size_t)bg * 2] = s1[0];
        stats[(size_t)bg * 2 + 1] = s2[0];
    }
}

extern "C" int ditd_cuda_groupnorm_stats(const void *x, size_t ps, int B, int C, int rows, int W,
                                         int G, double *d_stats, ditd_cuda_stream st)
{
    if (!x || !d_stats || B < 0 || C <= 0 || G <= 0 || C % G || rows < 0 || W <= 0 ||
        ps < (size_t)rows * W)
        return DITD_CUDA_EINVAL;
    if (B == 0)
        return 0;
    gn_stats_kernel<<<B * G, GN_THREADS, 0, (cudaStream_t)st>>>((const bf16 *)x, ps, C, rows, W, G,
                                                                d_stats);
    return launch_check();
}

typedef struct gn_params {
    float mean[DITD_CUDA_GN_MAX_BG], rstd[DITD_CUDA_GN_MAX_BG];
} gn_params;

static __global__ void gn_apply_kernel(const bf16 *x, size_t psx, bf16 *y, size_t psy, int C,
                                       size_t n, int G, gn_params p, const bf16 *gamma,
                                       const bf16 *beta, int silu_on, size_t total)
{
    const int cg = C / G;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t bc = i / n, e = i % n;
        int b = (int)(bc / C), c = (int)(bc % C), bg = b * G + c / cg;
        float a = p.rstd[bg] * (gamma ? ld_bf16(gamma + c) : 1.0f);
        float sh = (beta ? ld_bf16(beta + c) : 0.0f) - p.mean[bg] * a;
        float v = ld_bf16(x + bc * psx + e) * a + sh;
        st_bf16(y + bc * psy + e, silu_on ? silu(v) : v);
    }
}

extern "C" int ditd_cuda_groupnorm_apply(const void *x, size_t psx, void *y, size_t psy, int B,
                                         int C, int rows, int W, int G, const float *h_mean,
                                         const float *h_rstd, const void *gamma, const void *beta,
                                         int silu_on, ditd_cuda_stream st)
{
    if (!x || !y || !h_mean || !h_rstd || B < 0 || C <= 0 || G <= 0 || C % G || rows < 0 ||
        W <= 0 || B * G > DITD_CUDA_GN_MAX_BG)
        return DITD_CUDA_EINVAL;
    const size_t n = (size_t)rows * W, total = (size_t)B * C * n;
    if (total == 0)
        return 0;
    gn_params p;
    for (int i = 0; i < B * G; i++) {
        p.mean[i] = h_mean[i];
        p.rstd[i] = h_rstd[i];
    }
    gn_apply_kernel<<<ew_blocks(total), DITD_CUDA_EW_THREADS, 0, (cudaStream_t)st>>>(
        (const bf16 *)x, psx, (bf16 *)y, psy, C, n, G, p, (const bf16 *)gamma, (const bf16 *)beta,
        silu_on, total);
    return launch_check();
}

/* ---- upsample, transposes ---- */

static __global__ void upsample2x_kernel(const bf16 *x, size_t psx, bf16 *y, size_t psy, int rows,
                                         int W, size_t total)
{
    const size_t per = (size_t)4 * rows * W;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t bc = i / per, e = i % per;
        size_t oy = e / (2 * (size_t)W), ox = e % (2 * (size_t)W);
        y[bc * psy + e] = x[bc * psx + (oy / 2) * W + ox / 2];
    }
}

extern "C" int ditd_cuda_upsample_nearest2x(const void *x, size_t psx, void *y, size_t psy, int B,
                                            int C, int rows, int W, ditd_cuda_stream st)
{
    if (!x || !y || B < 0 || C < 0 || rows < 0 || W <= 0 || psx < (size_t)rows * W ||
        psy < (size_t)4 * rows * W)
        return DITD_CUDA_EINVAL;
    const size_t total = (size_t)B * C * 4 * rows * W;
    if (total == 0)
        return 0;
    upsample2x_kernel<<<ew_blocks(total), DITD_CUDA_EW_THREADS, 0, (cudaStream_t)st>>>(
        (const bf16 *)x, psx, (bf16 *)y, psy, rows, W, total);
    return launch_check();
}

extern "C" int ditd_cuda_planes_to_tokens(const void *x, size_t ps, void *t, int C, int n,
                                          ditd_cuda_stream st)
{
    if (!x || !t || C <= 0 || n < 0 || ps < (size_t)n)
        return DITD_CUDA_EINVAL;
    if (n == 0)
        return 0;
    planes_to_tokens_kernel<<<ew_blocks((size_t)C * n), DITD_CUDA_EW_THREADS, 0, (cudaStream_t)st>>>(
        (const bf16 *)x, ps, (bf16 *)t, C, n);
    return launch_check();
}

extern "C" int ditd_cuda_tokens_to_planes(const void *t, void *y, size_t ps, int C, int n,
                                          int accumulate, ditd_cuda_stream st)
{
    if (!t || !y || C <= 0 || n < 0 || ps < (size_t)n)
        return DITD_CUDA_EINVAL;
    if (n == 0)
        return 0;
    tokens_to_planes_kernel<<<ew_blocks((size_t)C * n), DITD_CUDA_EW_THREADS, 0, (cudaStream_t)st>>>(
        (const bf16 *)t, (bf16 *)y, ps, C, n, accumulate);
    return launch_check();
}
