/* The memory-bound kernels of the DiT forward on bf16 storage with fp32
 * arithmetic: conversions, activations, adds, embeddings, the fused
 * layernorm + adaLN modulation, the gated residual, patch embedding and
 * unpatchify, and the sampler's elementwise helpers.
 *
 * Each is launcher + static __global__ kernel + exported entry that checks
 * the shape and the launch (ggml norm.cu, llm.c layernorm.cuh). Loops are
 * grid-stride so one grid size rule fits every n. */
#include "kernels/cuda/common.cuh"

/* ---- conversions ---- */

static __global__ void f32_to_bf16_kernel(const float *src, bf16 *dst, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        st_bf16(dst + i, src[i]);
}

static __global__ void bf16_to_f32_kernel(const bf16 *src, float *dst, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        dst[i] = ld_bf16(src + i);
}

extern "C" int ditd_cuda_f32_to_bf16(const float *src, void *dst, size_t n, ditd_cuda_stream s)
{
    if (n == 0)
        return 0;
    if (!src || !dst)
        return DITD_CUDA_EINVAL;
    f32_to_bf16_kernel<<<ew_blocks(n), DITD_CUDA_EW_THREADS, 0, (cudaStream_t)s>>>(
        src, (bf16 *)dst, n);
    return launch_check();
}

extern "C" int ditd_cuda_bf16_to_f32(const void *src, float *dst, size_t n, ditd_cuda_stream s)
{
    if (n == 0)
        return 0;
    if (!src || !dst)
        return DITD_CUDA_EINVAL;
    bf16_to_f32_kernel<<<ew_blocks(n), DITD_CUDA_EW_THREADS, 0, (cudaStream_t)s>>>(
        (const bf16 *)src, dst, n);
    return launch_check();
}

/* ---- activations, add, copy ---- */

static __global__ void act_kernel(const bf16 *x, bf16 *y, size_t n, int act)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float v = ld_bf16(x + i);
        v = act == DITD_CUDA_ACT_GELU_TANH ? gelu_tanh(v) : act == DITD_CUDA_ACT_SILU ? silu(v) : v;
        st_bf16(y + i, v);
    }
}

extern "C" int ditd_cuda_act_apply(const void *x, void *y, size_t n, ditd_cuda_act act,
                                   ditd_cuda_stream s)
{
    if (n == 0)
        return 0;
    if (!x || !y || (int)act < 0 || act > DITD_CUDA_ACT_SILU)
        return DITD_CUDA_EINVAL;
    act_kernel<<<ew_blocks(n), DITD_CUDA_EW_THREADS, 0, (cudaStream_t)s>>>(
        (const bf16 *)x, (bf16 *)y, n, (int)act);
    return launch_check();
}

/* erf GELU (torch's approximate="none"), in place */
static __global__ void gelu_erf_kernel(bf16 *y, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const float v = ld_bf16(y + i);
        st_bf16(y + i, 0.5f * v * (1.0f + erff(v * 0.70710678118654752f)));
    }
}

extern "C" int ditd_cuda_gelu_erf(void *y, size_t n, ditd_cuda_stream s)
{
    if (n == 0)
        return 0;
    if (!y)
        return DITD_CUDA_EINVAL;
    gelu_erf_kernel<<<ew_blocks(n), DITD_CUDA_EW_THREADS, 0, (cudaStream_t)s>>>((bf16 *)y, n);
    return launch_check();
}

static __global__ void add_kernel(bf16 *y, const bf16 *x, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        st_bf16(y + i, ld_bf16(y + i) + ld_bf16(x + i));
}

extern "C" int ditd_cuda_add(void *y, const void *x, size_t n, ditd_cuda_stream s)
{
    if (n == 0)
        return 0;
    if (!x || !y)
        return DITD_CUDA_EINVAL;
    add_kernel<<<ew_blocks(n), DITD_CUDA_EW_THREADS, 0, (cudaStream_t)s>>>((bf16 *)y,
                                                                          (const bf16 *)x, n);
    return launch_check();
}

/* ---- step caching: y = a x + b y, per-row difference statistics ---- */

static __global__ void axpby_kernel(bf16 *y, const bf16 *x, float a, float b, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        st_bf16(y + i, (x ? a * ld_bf16(x + i) : 0.0f) + b * ld_bf16(y + i));
}

extern "C" int ditd_cuda_axpby(void *y, const void *x, float a, float b, size_t n,
                               ditd_cuda_stream s)
{
    if (n == 0)
        return 0;
    if (!y)
        return DITD_CUDA_EINVAL;
    axpby_kernel<<<ew_blocks(n), DITD_CUDA_EW_THREADS, 0, (cudaStream_t)s>>>(
        (bf16 *)y, (const bf16 *)x, a, b, n);
    return launch_check();
}

#define RDS_THREADS 256

static __global__ void row_diff_stats_kernel(const bf16 *a, const bf16 *b, int D, double *out)
{
    __shared__ double sh[4][RDS_THREADS];
    const size_t r = blockIdx.x;
    const bf16 *pa = a + r * (size_t)D, *pb = b ? b + r * (size_t)D : NULL;
    double l1d = 0.0, l1b = 0.0, qa = 0.0, qb = 0.0;
    for (int i = threadIdx.x; i < D; i += RDS_THREADS) {
        double va = ld_bf16(pa + i);
        qa += va * va;
        if (pb) {
            double vb = ld_bf16(pb + i);
            l1d += fabs(va - vb);
            l1b += fabs(vb);
            qb += vb * vb;
        }
    }
    sh[0][threadIdx.x] = l1d;
    sh[1][threadIdx.x] = l1b;
    sh[2][threadIdx.x] = qa;
    sh[3][threadIdx.x] = qb;
    __syncthreads();
    for (int w = RDS_THREADS / 2; w > 0; w /= 2) {
        if ((int)threadIdx.x < w)
            for (int k = 0; k < 4; k++)
                sh[k][threadIdx.x] += sh[k][threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x < 4)
        out[4 * r + threadIdx.x] = sh[threadIdx.x][0];
}

extern "C" int ditd_cuda_row_diff_stats(const void *a, const void *b, int rows, int D,
                                        double *d_out, ditd_cuda_stream s)
{
    if (rows < 0 || D <= 0 || !a || !d_out)
        return rows == 0 ? 0 : DITD_CUDA_EINVAL;
    if (rows == 0)
        return 0;
    row_diff_stats_kernel<<<rows, RDS_THREADS, 0, (cudaStream_t)s>>>((const bf16 *)a,
                                                                     (const bf16 *)b, D, d_out);
    return launch_check();
}

extern "C" int ditd_cuda_copy2d(void *dst, size_t ldd, const void *src, size_t lds, size_t rows,
                                size_t cols, size_t es, ditd_cuda_stream s)
{
    if (rows == 0 || cols == 0)
        return 0;
    if (!dst || !src || ldd < cols || lds < cols || es == 0)
        return DITD_CUDA_EINVAL;
    return (int)cudaMemcpy2DAsync(dst, ldd * es, src, lds * es, cols * es, rows,
                                  cudaMemcpyDeviceToDevice, (cudaStream_t)s);
}

/* ---- embeddings: host arguments travel by value, 256 per launch ---- */

#define ARG_CHUNK 256

typedef struct ids_chunk {
    int64_t id[ARG_CHUNK];
} ids_chunk;

typedef struct t_chunk {
    float t[ARG_CHUNK];
} t_chunk;

static __global__ void embedding_kernel(const bf16 *table, ids_chunk ids, bf16 *out, int D)
{
    const bf16 *src = table + (size_t)ids.id[blockIdx.x] * D;
    bf16 *dst = out + (size_t)blockIdx.x * D;
    for (int d = threadIdx.x; d < D; d += blockDim.x)
        dst[d] = src[d];
}

extern "C" int ditd_cuda_embedding(const void *table, const int64_t *h_ids, void *out, int B,
                                   int D, ditd_cuda_stream s)
{
    if (B < 0 || D <= 0 || !table || !out || (B && !h_ids))
        return DITD_CUDA_EINVAL;
    for (int b0 = 0; b0 < B; b0 += ARG_CHUNK) {
        int nb = B - b0 < ARG_CHUNK ? B - b0 : ARG_CHUNK;
        ids_chunk c;
        for (int i = 0; i < ARG_CHUNK; i++)
            c.id[i] = i < nb ? h_ids[b0 + i] : 0;
        for (int i = 0; i < nb; i++)
            if (c.id[i] < 0)
                return DITD_CUDA_EINVAL;
        embedding_kernel<<<nb, 128, 0, (cudaStream_t)s>>>((const bf16 *)table, c,
                                                          (bf16 *)out + (size_t)b0 * D, D);
        int err = launch_check();
        if (err)
            return err;
    }
    return 0;
}

/* Diffusers' float32 steps, as ditd_cpu_timestep_embed (accurate expf,
 * cosf, sinf: this file is built without fast math). */
static __global__ void timestep_kernel(t_chunk t, bf16 *out, int dim)
{
    const int half = dim / 2, b = blockIdx.x;
    const float neg_log_period = (float)-9.210340371976184; /* -ln(10000) */
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        const float exponent = (neg_log_period * (float)i) / (float)(half - 1);
        const float arg = t.t[b] * expf(exponent);
        st_bf16(out + (size_t)b * dim + i, cosf(arg));
        st_bf16(out + (size_t)b * dim + half + i, sinf(arg));
    }
}

extern "C" int ditd_cuda_timestep_embed(const float *h_t, void *out, int B, int dim,
                                        ditd_cuda_stream s)
{
    if (B < 0 || dim < 4 || dim % 2 || !out || (B && !h_t))
        return DITD_CUDA_EINVAL;
    for (int b0 = 0; b0 < B; b0 += ARG_CHUNK) {
        int nb = B - b0 < ARG_CHUNK ? B - b0 : ARG_CHUNK;
        t_chunk c;
        for (int i = 0; i < ARG_CHUNK; i++)
            c.t[i] = i < nb ? h_t[b0 + i] : 0.0f;
        timestep_kernel<<<nb, 128, 0, (cudaStream_t)s>>>(c, (bf16 *)out + (size_t)b0 * dim, dim);
        int err = launch_check();
        if (err)
            return err;
    }
    return 0;
}

/* ---- the same two with their arguments in device memory (CUDA graphs:
 * a captured launch must not bake per-step values into its parameters) ---- */

static __global__ void embedding_dev_kernel(const bf16 *table, const int64_t *ids, bf16 *out,
                                            int D)
{
    const bf16 *src = table + (size_t)ids[blockIdx.x] * D;
    bf16 *dst = out + (size_t)blockIdx.x * D;
    for (int d = threadIdx.x; d < D; d += blockDim.x)
        dst[d] = src[d];
}

extern "C" int ditd_cuda_embedding_dev(const void *table, const int64_t *d_ids, void *out, int B,
                                       int D, ditd_cuda_stream s)
{
    if (B < 0 || D <= 0 || !table || !out || (B && !d_ids))
        return DITD_CUDA_EINVAL;
    if (B == 0)
        return 0;
    embedding_dev_kernel<<<B, 128, 0, (cudaStream_t)s>>>((const bf16 *)table, d_ids,
                                                         (bf16 *)out, D);
    return launch_check();
}

static __global__ void timestep_dev_kernel(const float *t, bf16 *out, int dim)
{
    const int half = dim / 2, b = blockIdx.x;
    const float neg_log_period = (float)-9.210340371976184; /* -ln(10000) */
    const float tb = t[b];
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        const float exponent = (neg_log_period * (float)i) / (float)(half - 1);
        const float arg = tb * expf(exponent);
        st_bf16(out + (size_t)b * dim + i, cosf(arg));
        st_bf16(out + (size_t)b * dim + half + i, sinf(arg));
    }
}

extern "C" int ditd_cuda_timestep_embed_dev(const float *d_t, void *out, int B, int dim,
                                            ditd_cuda_stream s)
{
    if (B < 0 || dim < 4 || dim % 2 || !out || (B && !d_t))
        return DITD_CUDA_EINVAL;
    if (B == 0)
        return 0;
    timestep_dev_kernel<<<B, 128, 0, (cudaStream_t)s>>>(d_t, (bf16 *)out, dim);
    return launch_check();
}

/* ---- layernorm + adaLN modulate: one warp per row ---- */

#define LN_WARPS 4

static __device__ __forceinline__ float warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

static __global__ void __launch_bounds__(LN_WARPS * 32)
layernorm_modulate_kernel(const bf16 *x, bf16 *y, int rows, int N, int D, float eps,
                          const bf16 *shift, const bf16 *scale, size_t ld_mod)
{
    const int lane = threadIdx.x & 31;
    const int row = blockIdx.x * LN_WARPS + (threadIdx.x >> 5);
    if (row >= rows)
        return;
    const bf16 *xr = x + (size_t)row * D;
    bf16 *yr = y + (size_t)row * D;
    const size_t b = (size_t)(row / N);
    /* two passes in fp32: mean, then the centered (biased) variance */
    float sum = 0.0f;
    for (int d = lane; d < D; d += 32)
        sum += ld_bf16(xr + d);
    const float mean = warp_sum(sum) / (float)D;
    float sq = 0.0f;
    for (int d = lane; d < D; d += 32) {
        float c = ld_bf16(xr + d) - mean;
        sq += c * c;
    }
    const float rstd = rsqrtf(warp_sum(sq) / (float)D + eps);
    const bf16 *sh = shift ? shift + b * ld_mod : NULL;
    const bf16 *sc = scale ? scale + b * ld_mod : NULL;
    for (int d = lane; d < D; d += 32) {
        float v = (ld_bf16(xr + d) - mean) * rstd;
        if (sc)
            v = v * (1.0f + ld_bf16(sc + d));
        if (sh)
            v = v + ld_bf16(sh + d);
        st_bf16(yr + d, v);
    }
}

extern "C" int ditd_cuda_layernorm_modulate(const void *x, void *y, int B, int N, int D,
                                            float eps, const void *shift, const void *scale,
                                            size_t ld_mod, ditd_cuda_stream s)
{
    if (B < 0 || N < 0 || D <= 0 || !x || !y || ((shift || scale) && ld_mod < (size_t)D))
        return DITD_CUDA_EINVAL;
    int rows = B * N;
    if (rows == 0)
        return 0;
    layernorm_modulate_kernel<<<(rows + LN_WARPS - 1) / LN_WARPS, LN_WARPS * 32, 0,
                                (cudaStream_t)s>>>((const bf16 *)x, (bf16 *)y, rows, N, D, eps,
                                                   (const bf16 *)shift, (const bf16 *)scale,
                                                   ld_mod);
    return launch_check();
}

/* ---- gated residual ---- */

static __global__ void gated_residual_kernel(bf16 *h, const bf16 *y, size_t n, size_t ND, int D,
                                             const bf16 *gate, size_t ld_gate)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t b = i / ND, d = i % (size_t)D;
        st_bf16(h + i, ld_bf16(h + i) + ld_bf16(gate + b * ld_gate + d) * ld_bf16(y + i));
    }
}

extern "C" int ditd_cuda_gated_residual(void *h, const void *y, int B, int N, int D,
                                        const void *gate, size_t ld_gate, ditd_cuda_stream s)
{
    if (B < 0 || N < 0 || D <= 0 || !h || !y || !gate || ld_gate < (size_t)D)
        return DITD_CUDA_EINVAL;
    size_t ND = (size_t)N * (size_t)D, n = (size_t)B * ND;
    if (n == 0)
        return 0;
    gated_residual_kernel<<<ew_blocks(n), DITD_CUDA_EW_THREADS, 0, (cudaStream_t)s>>>(
        (bf16 *)h, (const bf16 *)y, n, ND, D, (const bf16 *)gate, ld_gate);
    return launch_check();
}

/* ---- patches ---- */

static __global__ void im2col_kernel(const bf16 *x, bf16 *cols, size_t n, int C, int Hi, int Wi,
                                     int p)
{
    const int gw = Wi / p, N = (Hi / p) * gw, K = C * p * p;
    for (size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x; idx < n;
         idx += (size_t)gridDim.x * blockDim.x) {
        size_t t = idx / (size_t)K;
        int k = (int)(idx % (size_t)K);
        size_t bb = t / (size_t)N;
        int nn = (int)(t % (size_t)N), r = nn / gw, c = nn % gw;
        int ch = k / (p * p), i = (k / p) % p, j = k % p;
        cols[idx] = x[((bb * C + ch) * Hi + (size_t)r * p + i) * Wi + (size_t)c * p + j];
    }
}

extern "C" int ditd_cuda_im2col(const void *x, void *cols, int B, int C, int Hi, int Wi, int p,
                                ditd_cuda_stream s)
{
    if (!x || !cols || B < 0 || C <= 0 || p <= 0 || Hi <= 0 || Wi <= 0 || Hi % p || Wi % p)
        return DITD_CUDA_EINVAL;
    size_t n = (size_t)B * (size_t)(Hi / p) * (size_t)(Wi / p) * (size_t)C * (size_t)(p * p);
    if (n == 0)
        return 0;
    im2col_kernel<<<ew_blocks(n), DITD_CUDA_EW_THREADS, 0, (cudaStream_t)s>>>(
        (const bf16 *)x, (bf16 *)cols, n, C, Hi, Wi, p);
    return launch_check();
}

static __global__ void add_rows_kernel(bf16 *y, const bf16 *pos, size_t n, size_t ND)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        st_bf16(y + i, ld_bf16(y + i) + ld_bf16(pos + i % ND));
}

extern "C" int ditd_cuda_add_rows(void *y, const void *pos, int B, int N, int D,
                                  ditd_cuda_stream s)
{
    if (!y || !pos || B < 0 || N < 0 || D <= 0)
        return DITD_CUDA_EINVAL;
    size_t ND = (size_t)N * (size_t)D, n = (size_t)B * ND;
    if (n == 0)
        return 0;
    add_rows_kernel<<<ew_blocks(n), DITD_CUDA_EW_THREADS, 0, (cudaStream_t)s>>>(
        (bf16 *)y, (const bf16 *)pos, n, ND);
    return launch_check();
}

extern "C" int ditd_cuda_patch_embed(ditd_cuda_gemm *g, const void *x, const void *w,
                                     const void *b, const void *pos, void *y, void *scratch,
                                     int B, int C, int Hi, int Wi, int p, int D,
                                     ditd_cuda_stream s)
{
    int err;
    if (!w || !y || !scratch || D <= 0)
        return DITD_CUDA_EINVAL;
    if ((err = ditd_cuda_im2col(x, scratch, B, C, Hi, Wi, p, s)))
        return err;
    int N = (Hi / p) * (Wi / p), K = C * p * p;
    if ((err = ditd_cuda_linear(g, scratch, (size_t)K, w, b, y, (size_t)D, B * N, D, K,
                                DITD_CUDA_ACT_NONE, s)))
        return err;
    return pos ? ditd_cuda_add_rows(y, pos, B, N, D, s) : 0;
}

static __global__ void unpatchify_kernel(const bf16 *x, bf16 *y, size_t n, int C, int h, int w,
                                         int p)
{
    const int Ho = h * p, Wo = w * p;
    for (size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x; idx < n;
         idx += (size_t)gridDim.x * blockDim.x) {
        int xx = (int)(idx % (size_t)Wo);
        int yy = (int)((idx / (size_t)Wo) % (size_t)Ho);
        size_t bc = idx / ((size_t)Wo * Ho);
        int c = (int)(bc % (size_t)C);
        size_t bb = bc / (size_t)C;
        int r = yy / p, i = yy % p, sx = xx / p, j = xx % p;
        y[idx] = x[(bb * h * w + (size_t)r * w + sx) * ((size_t)p * p * C) +
                   ((size_t)i * p + j) * C + c];
    }
}

extern "C" int ditd_cuda_unpatchify(const void *x, void *y, int B, int C, int h, int w, int p,
                                    ditd_cuda_stream s)
{
    if (!x || !y || B < 0 || C <= 0 || h <= 0 || w <= 0 || p <= 0)
        return DITD_CUDA_EINVAL;
    size_t n = (size_t)B * C * (size_t)h * p * (size_t)w * p;
    if (n == 0)
        return 0;
    unpatchify_kernel<<<ew_blocks(n), DITD_CUDA_EW_THREADS, 0, (cudaStream_t)s>>>(
        (const bf16 *)x, (bf16 *)y, n, C, h, w, p);
    return launch_check();
}

/* ---- sampler helpers (fp32 state) ---- */

static __global__ void guidance_kernel(const bf16 *cond, const bf16 *unc, float g, float *out,
                                       size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float u = ld_bf16(unc + i);
        out[i] = u + g * (ld_bf16(cond + i) - u);
    }
}

extern "C" int ditd_cuda_guidance(const void *cond, const void *unc, float g, float *out,
                                  size_t n, ditd_cuda_stream s)
{
    if (n == 0)
        return 0;
    if (!cond || !unc || !out)
        return DITD_CUDA_EINVAL;
    guidance_kernel<<<ew_blocks(n), DITD_CUDA_EW_THREADS, 0, (cudaStream_t)s>>>(
        (const bf16 *)cond, (const bf16 *)unc, g, out, n);
    return launch_check();
}

static __global__ void lincomb_kernel(float *x, float a, const float *m, float b,
                                      const float *prev, float c, float clip, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float v = a * x[i] + b * m[i];
        if (prev)
            v += c * prev[i];
        if (clip > 0.0f)
            v = fminf(fmaxf(v, -clip), clip);
        x[i] = v;
    }
}

extern "C" int ditd_cuda_lincomb(float *x, float a, const float *m, float b, const float *prev,
                                 float c, float clip, size_t n, ditd_cuda_stream s)
{
    if (n == 0)
        return 0;
    if (!x || !m)
        return DITD_CUDA_EINVAL;
    lincomb_kernel<<<ew_blocks(n), DITD_CUDA_EW_THREADS, 0, (cudaStream_t)s>>>(x, a, m, b, prev,
                                                                              c, clip, n);
    return launch_check();
}
