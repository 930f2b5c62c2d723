/* LoRA's low-rank term on a linear layer's output (kernels/cpu/lora.c is the
 * reference): y = act(y + s (x A^T) B^T), bf16 x, A, B and y, fp32 products
 * and the rank-r intermediate in fp32. Two kernels: the down projection (one
 * block per row, a warp per rank column, lanes over K) and the up projection
 * with the add and the activation (a thread per output element, r products).
 * Ranks are small (4 .. 256): neither product is worth a cuBLASLt call per
 * adapter. */
#include "kernels/cuda/common.cuh"

#define LORA_THREADS 256
#define LORA_WARPS (LORA_THREADS / 32)

/* tmp[m, j] = sum_k x[m, k] A[j, k] */
static __global__ void lora_down_kernel(const bf16 *x, size_t ldx, const bf16 *a, int K, int r,
                                        float *tmp)
{
    const size_t m = blockIdx.x;
    const int warp = (int)threadIdx.x / 32, lane = (int)threadIdx.x % 32;
    const bf16 *xr = x + m * ldx;
    for (int j = warp; j < r; j += LORA_WARPS) {
        const bf16 *ar = a + (size_t)j * (size_t)K;
        float acc = 0.0f;
        for (int k = lane; k < K; k += 32)
            acc += ld_bf16(xr + k) * ld_bf16(ar + k);
        for (int o = 16; o > 0; o /= 2)
            acc += __shfl_down_sync(0xffffffffu, acc, o);
        if (lane == 0)
            tmp[m * (size_t)r + (size_t)j] = acc;
    }
}

/* y[m, n] = act(y[m, n] + s sum_j tmp[m, j] B[n, j]); r == 0: act only */
static __global__ void lora_up_kernel(const float *tmp, const bf16 *b, float s, bf16 *y,
                                      size_t ldy, int M, int N, int r, int act)
{
    const size_t total = (size_t)M * (size_t)N;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        const size_t m = i / (size_t)N, n = i % (size_t)N;
        bf16 *py = y + m * ldy + n;
        float v = ld_bf16(py);
        if (r > 0) {
            const float *t = tmp + m * (size_t)r;
            const bf16 *br = b + n * (size_t)r;
            float acc = 0.0f;
            for (int j = 0; j < r; j++)
                acc += t[j] * ld_bf16(br + j);
            v += s * acc;
        }
        if (act == DITD_CUDA_ACT_GELU_TANH)
            v = gelu_tanh(v);
        else if (act == DITD_CUDA_ACT_SILU)
            v = silu(v);
        st_bf16(py, v);
    }
}

extern "C" int ditd_cuda_lora(const void *x, size_t ldx, const void *a, const void *b, float s,
                              void *y, size_t ldy, int M, int N, int K, int r, float *tmp,
                              ditd_cuda_act act, ditd_cuda_stream st)
{
    if (M == 0 || N == 0)
        return 0;
    if (M < 0 || N < 0 || r < 0 || !y || ldy < (size_t)N || (int)act < 0 ||
        act > DITD_CUDA_ACT_SILU)
        return DITD_CUDA_EINVAL;
    if (s == 0.0f)
        r = 0;
    if (r > 0 && (!x || !a || !b || !tmp || K <= 0 || ldx < (size_t)K))
        return DITD_CUDA_EINVAL;
    cudaStream_t cs = (cudaStream_t)st;
    if (r > 0) {
        lora_down_kernel<<<(unsigned)M, LORA_THREADS, 0, cs>>>((const bf16 *)x, ldx,
                                                              (const bf16 *)a, K, r, tmp);
        int err = launch_check();
        if (err)
            return err;
    }
    const size_t total = (size_t)M * (size_t)N;
    lora_up_kernel<<<ew_blocks(total), DITD_CUDA_EW_THREADS, 0, cs>>>(
        tmp, (const bf16 *)b, s, (bf16 *)y, ldy, M, N, r, (int)act);
    return launch_check();
}
