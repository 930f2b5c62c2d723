/* CUDA video kernels for the Wan VAE (kernels/cuda/cuda_video_kernels.h):
 * im2col over time taps + cuBLASLt for the 3-D convolution, the channel RMS
 * norm (+ SiLU), AvgDown3D and DupUp3D. Launcher + kernel + entry, as the
 * rest of kernels/cuda. */
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_video_kernels.h"

typedef struct frames {
    const bf16 *p[DITD_CUDA_CONV3D_MAX_KT];
} frames;

/* ---- conv3d ---- */

/* cols (nr Wo, Cin kT k k) for output rows [r0, r0 + nr), row-major. */
static __global__ void im2col3d_kernel(frames xf, int kT, size_t psx, bf16 *cols, int Cin, int H,
                                       int W, int k, int pad_h, int pad_w, int r0, int nr, int Wo)
{
    const size_t K = (size_t)Cin * kT * k * k, n = (size_t)nr * Wo * K;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t p = i / K, kk = i % K;
        int ci = (int)(kk / ((size_t)kT * k * k)), kt = (int)(kk / (k * k)) % kT;
        int ky = (int)(kk / k) % k, kx = (int)(kk % k);
        int iy = r0 + (int)(p / Wo) + ky - pad_h, ix = (int)(p % Wo) + kx - pad_w;
        const bf16 *x = xf.p[kt];
        cols[i] = (x && iy >= 0 && iy < H && ix >= 0 && ix < W) ? x[ci * psx + (size_t)iy * W + ix]
                                                                : __float2bfloat16_rn(0.0f);
    }
}

/* planes y (C, n) stride ps = tokens t (n, C) */
static __global__ void tok_to_planes_kernel(const bf16 *t, bf16 *y, size_t ps, int C, int n)
{
    const size_t total = (size_t)C * n;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t c = i / n, p = i % n;
        y[c * ps + p] = t[p * C + c];
    }
}

extern "C" int ditd_cuda_conv3d_frame(ditd_cuda_gemm *g, const void *const *xf, int kT, size_t psx,
                                      const void *w, const void *b, void *y, size_t psy,
                                      void *scratch, size_t scratch_n, int Cin, int H, int W,
                                      int Cout, int k, int pad_h, int pad_w, ditd_cuda_stream st)
{
    if (!g || !xf || !w || !y || !scratch || kT <= 0 || kT > DITD_CUDA_CONV3D_MAX_KT || Cin <= 0 ||
        Cout <= 0 || k <= 0 || pad_h < 0 || pad_w < 0)
        return DITD_CUDA_EINVAL;
    const int Ho = H + 2 * pad_h - k + 1, Wo = W + 2 * pad_w - k + 1;
    const size_t K = (size_t)Cin * kT * k * k, per_row = (K + (size_t)Cout) * (size_t)Wo;
    if (Ho <= 0 || Wo <= 0 || psx < (size_t)H * W || psy < (size_t)Ho * Wo || scratch_n < per_row)
        return DITD_CUDA_EINVAL;
    frames f;
    for (int i = 0; i < DITD_CUDA_CONV3D_MAX_KT; i++)
        f.p[i] = i < kT ? (const bf16 *)xf[i] : NULL;
    int chunk = (int)(scratch_n / per_row);
    chunk = chunk > Ho ? Ho : chunk;
    bf16 *cols = (bf16 *)scratch;
    for (int r0 = 0; r0 < Ho; r0 += chunk) {
        const int nr = Ho - r0 < chunk ? Ho - r0 : chunk, np = nr * Wo;
        bf16 *tok = cols + (size_t)np * K;
        im2col3d_kernel<<<ew_blocks((size_t)np * K), DITD_CUDA_EW_THREADS, 0, (cudaStream_t)st>>>(
            f, kT, psx, cols, Cin, H, W, k, pad_h, pad_w, r0, nr, Wo);
        int rc = launch_check();
        if (!rc)
            rc = ditd_cuda_linear(g, cols, K, w, b, tok, (size_t)Cout, np, Cout, (int)K,
                                  DITD_CUDA_ACT_NONE, st);
        if (rc)
            return rc;
        tok_to_planes_kernel<<<ew_blocks((size_t)np * Cout), DITD_CUDA_EW_THREADS, 0,
                               (cudaStream_t)st>>>(tok, (bf16 *)y + (size_t)r0 * Wo, psy, Cout, np);
        if ((rc = launch_check()))
            return rc;
    }
    return 0;
}

/* ---- channel RMS norm: one thread per position ---- */

static __global__ void rmsnorm_channels_kernel(const bf16 *x, size_t psx, bf16 *y, size_t psy,
                                               int C, int n, const bf16 *gamma, int silu_on)
{
    const float scale = sqrtf((float)C);
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        float ss = 0.0f;
        for (int c = 0; c < C; c++) {
            float v = ld_bf16(x + (size_t)c * psx + i);
            ss += v * v;
        }
        const float inv = 1.0f / fmaxf(sqrtf(ss), 1e-12f);
        for (int c = 0; c < C; c++) {
            float v = ld_bf16(x + (size_t)c * psx + i) * inv * scale * (gamma ? ld_bf16(gamma + c) : 1.0f);
            st_bf16(y + (size_t)c * psy + i, silu_on ? silu(v) : v);
        }
    }
}

extern "C" int ditd_cuda_rmsnorm_channels(const void *x, size_t psx, void *y, size_t psy, int C,
                                          int n, const void *gamma, int silu_on,
                                          ditd_cuda_stream st)
{
    if (!x || !y || C <= 0 || n < 0)
        return DITD_CUDA_EINVAL;
    if (n == 0)
        return 0;
    rmsnorm_channels_kernel<<<ew_blocks((size_t)n), DITD_CUDA_EW_THREADS, 0, (cudaStream_t)st>>>(
        (const bf16 *)x, psx, (bf16 *)y, psy, C, n, (const bf16 *)gamma, silu_on);
    return launch_check();
}

/* ---- AvgDown3D / DupUp3D: one thread per output element ---- */

static __global__ void avgdown3d_kernel(frames xf, size_t psx, int Cin, int H, int W, int Cout,
                                        int ft, int fs, bf16 *y, size_t psy, int accumulate)
{
    const int factor = ft * fs * fs, group = Cin * factor / Cout, Ho = H / fs, Wo = W / fs;
    const size_t total = (size_t)Cout * Ho * Wo;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        int o = (int)(i / ((size_t)Ho * Wo)), h = (int)(i / Wo % Ho), w = (int)(i % Wo);
        float s = 0.0f;
        for (int gi = 0; gi < group; gi++) {
            int j = o * group + gi, c = j / factor, r = j % factor;
            int a = r / (fs * fs), p = (r / fs) % fs, q = r % fs;
            if (xf.p[a])
                s += ld_bf16(xf.p[a] + (size_t)c * psx + (size_t)(h * fs + p) * W + w * fs + q);
        }
        bf16 *d = y + (size_t)o * psy + (size_t)h * Wo + w;
        float v = s / (float)group;
        st_bf16(d, accumulate ? ld_bf16(d) + v : v);
    }
}

extern "C" int ditd_cuda_avgdown3d_frame(const void *const *xf, size_t psx, int Cin, int H, int W,
                                         int Cout, int ft, int fs, void *y, size_t psy,
                                         int accumulate, ditd_cuda_stream st)
{
    if (!xf || !y || Cin <= 0 || Cout <= 0 || ft <= 0 || ft > DITD_CUDA_CONV3D_MAX_KT || fs <= 0 ||
        H % fs || W % fs || (Cin * ft * fs * fs) % Cout)
        return DITD_CUDA_EINVAL;
    frames f;
    for (int i = 0; i < DITD_CUDA_CONV3D_MAX_KT; i++)
        f.p[i] = i < ft ? (const bf16 *)xf[i] : NULL;
    avgdown3d_kernel<<<ew_blocks((size_t)Cout * (H / fs) * (W / fs)), DITD_CUDA_EW_THREADS, 0,
                       (cudaStream_t)st>>>(f, psx, Cin, H, W, Cout, ft, fs, (bf16 *)y, psy,
                                           accumulate);
    return launch_check();
}

static __global__ void dupup3d_kernel(const bf16 *x, size_t psx, int Cin, int H, int W, int Cout,
                                      int ft, int fs, int a, bf16 *y, size_t psy, int accumulate)
{
    const int factor = ft * fs * fs, repeats = Cout * factor / Cin, Ho = H * fs, Wo = W * fs;
    const size_t total = (size_t)Cout * Ho * Wo;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        int o = (int)(i / ((size_t)Ho * Wo)), oy = (int)(i / Wo % Ho), ox = (int)(i % Wo);
        int p = oy % fs, q = ox % fs;
        int c = (o * factor + a * fs * fs + p * fs + q) / repeats;
        float v = ld_bf16(x + (size_t)c * psx + (size_t)(oy / fs) * W + ox / fs);
        bf16 *d = y + (size_t)o * psy + (size_t)oy * Wo + ox;
        st_bf16(d, accumulate ? ld_bf16(d) + v : v);
    }
}

extern "C" int ditd_cuda_dupup3d_frame(const void *x, size_t psx, int Cin, int H, int W, int Cout,
                                       int ft, int fs, int a, void *y, size_t psy, int accumulate,
                                       ditd_cuda_stream st)
{
    if (!x || !y || Cin <= 0 || Cout <= 0 || ft <= 0 || fs <= 0 || a < 0 || a >= ft ||
        (Cout * ft * fs * fs) % Cin)
        return DITD_CUDA_EINVAL;
    dupup3d_kernel<<<ew_blocks((size_t)Cout * H * fs * W * fs), DITD_CUDA_EW_THREADS, 0,
                     (cudaStream_t)st>>>((const bf16 *)x, psx, Cin, H, W, Cout, ft, fs, a,
                                         (bf16 *)y, psy, accumulate);
    return launch_check();
}
