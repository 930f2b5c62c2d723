/* The FLUX family's attention inputs on the GPU: rotary position embedding
 * (RoPE) and the per-head RMSNorm of q and k, the twins of ditd_cpu_rope and
 * ditd_cpu_rmsnorm_heads (kernels/cpu/rope.h), on bf16 storage (the CUDA
 * backend's activations) or f32, arithmetic and statistics in fp32.
 *
 * What it is not: the RoPE table (built on the host in double by
 * ditd_cpu_rope_table and uploaded once per size, kept in fp32 as Diffusers
 * keeps it, whatever x's storage), or any model knowledge.
 *
 * Layout (cuda_kernels.h): x (B, N, H, Dh) rows of stride ld elements, one
 * row per token; both ops work in place, so q and k of a fused qkv buffer
 * are normalized and rotated where the projection wrote them. */
#include "kernels/cuda/common.cuh"

/* Loads and stores of either storage type, in fp32. */
static __device__ __forceinline__ float ld_any(const bf16 *p)
{
    return ld_bf16(p);
}

static __device__ __forceinline__ float ld_any(const float *p)
{
    return *p;
}

static __device__ __forceinline__ void st_any(bf16 *p, float v)
{
    st_bf16(p, v);
}

static __device__ __forceinline__ void st_any(float *p, float v)
{
    *p = v;
}

/* ---- RoPE: one thread per (token, head, pair) ---- */

template <typename T>
static __global__ void rope_kernel(T *x, size_t ld, const float *cos_t, const float *sin_t,
                                   size_t pairs, int N, int H, int half)
{
    for (size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x; idx < pairs;
         idx += (size_t)gridDim.x * blockDim.x) {
        const int i = (int)(idx % (size_t)half);
        const size_t rh = idx / (size_t)half; /* row * H + h */
        const int h = (int)(rh % (size_t)H);
        const size_t row = rh / (size_t)H; /* b * N + n */
        const size_t n = row % (size_t)N;
        T *v = x + row * ld + (size_t)h * (size_t)(2 * half) + 2 * (size_t)i;
        const float c = cos_t[n * (size_t)half + i];
        const float s = sin_t[n * (size_t)half + i];
        const float a = ld_any(v), b = ld_any(v + 1);
        /* Diffusers apply_rotary_emb (use_real, unbind_dim -1): out =
         * (x.float() cos + rotate(x).float() sin).to(x.dtype), rotate(a, b)
         * = (-b, a) */
        st_any(v, a * c - b * s);
        st_any(v + 1, b * c + a * s);
    }
}

template <typename T>
static int rope_launch(void *x, size_t ld, const float *cos_t, const float *sin_t, int B, int N,
                       int H, int Dh, ditd_cuda_stream s)
{
    if (B < 0 || N < 0 || H <= 0 || Dh <= 0 || Dh % 2 || !x || !cos_t || !sin_t ||
        ld < (size_t)H * (size_t)Dh)
        return DITD_CUDA_EINVAL;
    const size_t pairs = (size_t)B * (size_t)N * (size_t)H * (size_t)(Dh / 2);
    if (pairs == 0)
        return 0;
    rope_kernel<T><<<ew_blocks(pairs), DITD_CUDA_EW_THREADS, 0, (cudaStream_t)s>>>(
        (T *)x, ld, cos_t, sin_t, pairs, N, H, Dh / 2);
    return launch_check();
}

extern "C" int ditd_cuda_rope(void *x, size_t ld, const float *cos_t, const float *sin_t, int B,
                              int N, int H, int Dh, ditd_cuda_stream s)
{
    return rope_launch<bf16>(x, ld, cos_t, sin_t, B, N, H, Dh, s);
}

extern "C" int ditd_cuda_rope_f32(float *x, size_t ld, const float *cos_t, const float *sin_t,
                                  int B, int N, int H, int Dh, ditd_cuda_stream s)
{
    return rope_launch<float>(x, ld, cos_t, sin_t, B, N, H, Dh, s);
}

/* ---- RMSNorm per head: one warp per (row, head) ---- */

#define RMS_WARPS 4

static __device__ __forceinline__ float rms_warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

template <typename T>
static __global__ void __launch_bounds__(RMS_WARPS * 32)
rmsnorm_heads_kernel(T *x, size_t ld, const T *w, size_t units, int H, int Dh, float eps)
{
    const int lane = threadIdx.x & 31;
    const size_t unit = (size_t)blockIdx.x * RMS_WARPS + (threadIdx.x >> 5); /* row * H + h */
    if (unit >= units)
        return;
    T *v = x + (unit / (size_t)H) * ld + (unit % (size_t)H) * (size_t)Dh;
    /* the mean square in fp32 (torch.nn.RMSNorm / Diffusers RMSNorm:
     * hidden_states.to(float32).pow(2).mean(-1)) */
    float ss = 0.0f;
    for (int d = lane; d < Dh; d += 32) {
        const float a = ld_any(v + d);
        ss += a * a;
    }
    ss = rms_warp_sum(ss);
    const float inv = rsqrtf(ss / (float)Dh + eps);
    for (int d = lane; d < Dh; d += 32) {
        const float y = ld_any(v + d) * inv;
        st_any(v + d, w ? y * ld_any(w + d) : y);
    }
}

template <typename T>
static int rmsnorm_heads_launch(void *x, size_t ld, const void *w, int rows, int H, int Dh,
                                float eps, ditd_cuda_stream s)
{
    if (rows < 0 || H <= 0 || Dh <= 0 || !x || ld < (size_t)H * (size_t)Dh || !(eps >= 0.0f))
        return DITD_CUDA_EINVAL;
    const size_t units = (size_t)rows * (size_t)H;
    if (units == 0)
        return 0;
    const size_t blocks = (units + RMS_WARPS - 1) / RMS_WARPS;
    if (blocks > 0x7fffffffu)
        return DITD_CUDA_EINVAL;
    rmsnorm_heads_kernel<T><<<(unsigned)blocks, RMS_WARPS * 32, 0, (cudaStream_t)s>>>(
        (T *)x, ld, (const T *)w, units, H, Dh, eps);
    return launch_check();
}

extern "C" int ditd_cuda_rmsnorm_heads(void *x, size_t ld, const void *w, int rows, int H, int Dh,
                                       float eps, ditd_cuda_stream s)
{
    return rmsnorm_heads_launch<bf16>(x, ld, w, rows, H, Dh, eps, s);
}

extern "C" int ditd_cuda_rmsnorm_heads_f32(float *x, size_t ld, const float *w, int rows, int H,
                                           int Dh, float eps, ditd_cuda_stream s)
{
    return rmsnorm_heads_launch<float>(x, ld, w, rows, H, Dh, eps, s);
}

/* ---- RMSNorm across heads: one block of 256 threads per row ---- */

#define ROWS_THREADS 256

template <typename T>
static __global__ void __launch_bounds__(ROWS_THREADS)
row_sumsq_kernel(const T *x, size_t ld, int n, float *ss)
{
    __shared__ float part[ROWS_THREADS / 32];
    const T *v = x + (size_t)blockIdx.x * ld;
    float acc = 0.0f;
    for (int j = threadIdx.x; j < n; j += ROWS_THREADS) {
        const float a = ld_any(v + j);
        acc += a * a;
    }
    acc = rms_warp_sum(acc);
    if ((threadIdx.x & 31) == 0)
        part[threadIdx.x >> 5] = acc;
    __syncthreads();
    if (threadIdx.x < 32) {
        float t = threadIdx.x < ROWS_THREADS / 32 ? part[threadIdx.x] : 0.0f;
        t = rms_warp_sum(t);
        if (threadIdx.x == 0)
            ss[blockIdx.x] = t;
    }
}

template <typename T>
static __global__ void __launch_bounds__(ROWS_THREADS)
rmsnorm_rows_kernel(T *x, size_t ld, const T *w, const float *ss, int n, int n_total, float eps)
{
    T *v = x + (size_t)blockIdx.x * ld;
    const float inv = rsqrtf(ss[blockIdx.x] / (float)n_total + eps);
    for (int j = threadIdx.x; j < n; j += ROWS_THREADS) {
        const float y = ld_any(v + j) * inv;
        st_any(v + j, w ? y * ld_any(w + j) : y);
    }
}

template <typename T>
static int row_sumsq_launch(const void *x, size_t ld, int rows, int n, float *ss,
                            ditd_cuda_stream s)
{
    if (rows < 0 || n <= 0 || !x || !ss || ld < (size_t)n || rows > 0x7fffffff)
        return DITD_CUDA_EINVAL;
    if (rows == 0)
        return 0;
    row_sumsq_kernel<T><<<(unsigned)rows, ROWS_THREADS, 0, (cudaStream_t)s>>>((const T *)x, ld,
                                                                              n, ss);
    return launch_check();
}

template <typename T>
static int rmsnorm_rows_launch(void *x, size_t ld, const void *w, const float *ss, int rows,
                               int n, int n_total, float eps, ditd_cuda_stream s)
{
    if (rows < 0 || n <= 0 || n_total < n || !x || !ss || ld < (size_t)n || !(eps >= 0.0f))
        return DITD_CUDA_EINVAL;
    if (rows == 0)
        return 0;
    rmsnorm_rows_kernel<T><<<(unsigned)rows, ROWS_THREADS, 0, (cudaStream_t)s>>>(
        (T *)x, ld, (const T *)w, ss, n, n_total, eps);
    return launch_check();
}

extern "C" int ditd_cuda_row_sumsq(const void *x, size_t ld, int rows, int n, float *ss,
                                   ditd_cuda_stream s)
{
    return row_sumsq_launch<bf16>(x, ld, rows, n, ss, s);
}

extern "C" int ditd_cuda_rmsnorm_rows(void *x, size_t ld, const void *w, const float *ss,
                                      int rows, int n, int n_total, float eps, ditd_cuda_stream s)
{
    return rmsnorm_rows_launch<bf16>(x, ld, w, ss, rows, n, n_total, eps, s);
}

extern "C" int ditd_cuda_row_sumsq_f32(const float *x, size_t ld, int rows, int n, float *ss,
                                       ditd_cuda_stream s)
{
    return row_sumsq_launch<float>(x, ld, rows, n, ss, s);
}

extern "C" int ditd_cuda_rmsnorm_rows_f32(float *x, size_t ld, const float *w, const float *ss,
                                          int rows, int n, int n_total, float eps,
                                          ditd_cuda_stream s)
{
    return rmsnorm_rows_launch<float>(x, ld, w, ss, rows, n, n_total, eps, s);
}
