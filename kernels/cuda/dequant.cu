/* GGML block dequantization on the GPU: the twin of kernels/cpu/dequant.c,
 * bit for bit (every product and sum rounded on its own: __fmul_rn and
 * __fsub_rn / __fadd_rn, which nvcc never fuses into an FMA, where a plain
 * d * q - m would be).
 *
 * One thread per output value: value e of block b of row r decodes its own
 * quant and its group's scale from the block's bytes (a few byte loads; the
 * block is in L1 for its neighbours). Output f32 or bf16 (rounded to
 * nearest even from the f32 value, as the CPU's f32 -> bf16), rows of ldd
 * elements. For a dequantizing GEMM (dequantize a weight panel into a
 * workspace, then cuBLASLt), or for a load-time conversion.
 *
 * Types: the ggml numbers of kernels/cpu/dequant.h (F32, F16, BF16, Q4_0,
 * Q4_1, Q5_0, Q5_1, Q8_0, Q2_K .. Q6_K); another is refused with
 * cudaErrorInvalidValue before any launch.
 */
#include "kernels/cuda/common.cuh"

#include <cuda_fp16.h>

enum {
    T_F32 = 0, T_F16 = 1, T_Q4_0 = 2, T_Q4_1 = 3, T_Q5_0 = 6, T_Q5_1 = 7, T_Q8_0 = 8,
    T_Q2_K = 10, T_Q3_K = 11, T_Q4_K = 12, T_Q5_K = 13, T_Q6_K = 14, T_BF16 = 30,
};

static __device__ __forceinline__ float f16_at(const uint8_t *p)
{
    __half_raw h;
    h.x = (unsigned short)(p[0] | (p[1] << 8));
    return __half2float(__half(h)); /* exact */
}

static __device__ __forceinline__ void k4_scale_min(const uint8_t *s, int g, int *sc, int *mn)
{
    if (g < 4) {
        *sc = s[g] & 0x3f;
        *mn = s[4 + g] & 0x3f;
    } else {
        *sc = (s[4 + g] & 0xf) | ((s[g - 4] >> 2) & 0x30);
        *mn = (s[4 + g] >> 4) | ((s[g] >> 2) & 0x30);
    }
}

/* Value e (0 .. elems-1) of the block at b. */
template <int T>
static __device__ __forceinline__ float deq_value(const uint8_t *b, int e)
{
    if (T == T_F32) {
        float f;
        memcpy(&f, b, 4);
        return f;
    } else if (T == T_F16) {
        return f16_at(b);
    } else if (T == T_BF16) {
        return __uint_as_float((unsigned)(b[0] | (b[1] << 8)) << 16);
    } else if (T == T_Q4_0) {
        int q = e < 16 ? (b[2 + e] & 0xf) : (b[2 + e - 16] >> 4);
        return __fmul_rn(f16_at(b), (float)(q - 8));
    } else if (T == T_Q4_1) {
        int q = e < 16 ? (b[4 + e] & 0xf) : (b[4 + e - 16] >> 4);
        return __fadd_rn(__fmul_rn(f16_at(b), (float)q), f16_at(b + 2));
    } else if (T == T_Q5_0) {
        unsigned qh = b[2] | (b[3] << 8) | (b[4] << 16) | ((unsigned)b[5] << 24);
        int lo = e < 16 ? (b[6 + e] & 0xf) : (b[6 + e - 16] >> 4);
        int q = lo | (int)(((qh >> e) & 1u) << 4);
        return __fmul_rn(f16_at(b), (float)(q - 16));
    } else if (T == T_Q5_1) {
        unsigned qh = b[4] | (b[5] << 8) | (b[6] << 16) | ((unsigned)b[7] << 24);
        int lo = e < 16 ? (b[8 + e] & 0xf) : (b[8 + e - 16] >> 4);
        int q = lo | (int)(((qh >> e) & 1u) << 4);
        return __fadd_rn(__fmul_rn(f16_at(b), (float)q), f16_at(b + 2));
    } else if (T == T_Q8_0) {
        return __fmul_rn((float)(int8_t)b[2 + e], f16_at(b));
    } else if (T == T_Q2_K) {
        int h = e / 128, s = (e % 128) / 32, l = e % 32, g = e / 16;
        float dl = __fmul_rn(f16_at(b + 80), (float)(b[g] & 0xf));
        float ml = __fmul_rn(f16_at(b + 82), (float)(b[g] >> 4));
        int q = (b[16 + h * 32 + l] >> (2 * s)) & 3;
        return __fsub_rn(__fmul_rn(dl, (float)q), ml);
    } else if (T == T_Q3_K) {
        const uint8_t *sc = b + 96;
        int i = e / 16;
        int lo = i < 8 ? (sc[i] & 0xf) : (sc[i - 8] >> 4);
        int hi = (sc[8 + i % 4] >> (2 * (i / 4))) & 3;
        float dl = __fmul_rn(f16_at(b + 108), (float)((int)(int8_t)(uint8_t)(lo | (hi << 4)) - 32));
        int h = e / 128, s = (e % 128) / 32, l = e % 32;
        int ql = (b[32 + h * 32 + l] >> (2 * s)) & 3;
        int qh = ((b[l] >> (e / 32)) & 1) ^ 1;
        return __fmul_rn(dl, (float)(ql - (qh << 2)));
    } else if (T == T_Q4_K || T == T_Q5_K) {
        int g = e / 32, l = e % 32, sc, mn;
        k4_scale_min(b + 4, g, &sc, &mn);
        float dl = __fmul_rn(f16_at(b), (float)sc), ml = __fmul_rn(f16_at(b + 2), (float)mn);
        const uint8_t *qs = b + (T == T_Q4_K ? 16 : 48);
        int q = (qs[(g / 2) * 32 + l] >> (4 * (g % 2))) & 0xf;
        if (T == T_Q5_K)
            q |= ((b[16 + l] >> g) & 1) << 4;
        return __fsub_rn(__fmul_rn(dl, (float)q), ml);
    } else { /* Q6_K */
        int h = e / 128, r = e % 128;
        int lo = (b[h * 64 + r % 64] >> (4 * (r / 64))) & 0xf;
        int hi = (b[128 + h * 32 + r % 32] >> (2 * (r / 32))) & 3;
        float dl = __fmul_rn(f16_at(b + 208), (float)(int8_t)b[192 + e / 16]);
        return __fmul_rn(dl, (float)((lo | (hi << 4)) - 32));
    }
}

static __device__ __forceinline__ void st_out(float *p, float v)
{
    *p = v;
}

static __device__ __forceinline__ void st_out(bf16 *p, float v)
{
    *p = __float2bfloat16_rn(v);
}

template <int T, int ELEMS, int BYTES, typename O>
static __global__ void dequant_kernel(const uint8_t *src, size_t row_bytes, size_t n, int K, O *dst,
                                      size_t ldd)
{
    for (size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x; idx < n;
         idx += (size_t)gridDim.x * blockDim.x) {
        const size_t r = idx / (size_t)K;
        const int k = (int)(idx % (size_t)K);
        const uint8_t *b = src + r * row_bytes + (size_t)(k / ELEMS) * BYTES;
        st_out(dst + r * ldd + k, deq_value<T>(b, k % ELEMS));
    }
}

template <typename O>
static int dequant_launch(int type, const void *src, size_t row_bytes, int rows, int K, O *dst,
                          size_t ldd, ditd_cuda_stream s)
{
    if (!src || !dst || rows < 0 || K <= 0 || ldd < (size_t)K)
        return DITD_CUDA_EINVAL;
    const size_t n = (size_t)rows * (size_t)K;
    if (n == 0)
        return 0;
    const unsigned g = ew_blocks(n);
    const uint8_t *sp = (const uint8_t *)src;
    cudaStream_t st = (cudaStream_t)s;
#define DQ_CASE(T, E, B)                                                                          \
    case T:                                                                                       \
        if (K % E != 0 || row_bytes < (size_t)(K / E) * B)                                        \
            return DITD_CUDA_EINVAL;                                                              \
        dequant_kernel<T, E, B, O><<<g, DITD_CUDA_EW_THREADS, 0, st>>>(sp, row_bytes, n, K, dst,  \
                                                                     ldd);                        \
        break;
    switch (type) {
        DQ_CASE(T_F32, 1, 4)
        DQ_CASE(T_F16, 1, 2)
        DQ_CASE(T_BF16, 1, 2)
        DQ_CASE(T_Q4_0, 32, 18)
        DQ_CASE(T_Q4_1, 32, 20)
        DQ_CASE(T_Q5_0, 32, 22)
        DQ_CASE(T_Q5_1, 32, 24)
        DQ_CASE(T_Q8_0, 32, 34)
        DQ_CASE(T_Q2_K, 256, 84)
        DQ_CASE(T_Q3_K, 256, 110)
        DQ_CASE(T_Q4_K, 256, 144)
        DQ_CASE(T_Q5_K, 256, 176)
        DQ_CASE(T_Q6_K, 256, 210)
    default:
        return DITD_CUDA_EINVAL;
    }
#undef DQ_CASE
    return launch_check();
}

extern "C" int ditd_cuda_dequant_f32(int type, const void *src, size_t row_bytes, int rows, int K,
                                     float *dst, size_t ldd, ditd_cuda_stream s)
{
    return dequant_launch<float>(type, src, row_bytes, rows, K, dst, ldd, s);
}

extern "C" int ditd_cuda_dequant_bf16(int type, const void *src, size_t row_bytes, int rows, int K,
                                      void *dst, size_t ldd, ditd_cuda_stream s)
{
    return dequant_launch<bf16>(type, src, row_bytes, rows, K, (bf16 *)dst, ldd, s);
}
