/* Shared device helpers of kernels/cuda: bf16 load/store in fp32, the grid
 * size rule for elementwise kernels, and the launch check every entry ends
 * with. Private to kernels/cuda (not installed, not included by C). */
#ifndef DITD_KERNELS_CUDA_COMMON_CUH
#define DITD_KERNELS_CUDA_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/cuda/cuda_kernels.h"

typedef __nv_bfloat16 bf16;

static __device__ __forceinline__ float ld_bf16(const bf16 *p)
{
    return __bfloat162float(*p);
}

static __device__ __forceinline__ void st_bf16(bf16 *p, float v)
{
    *p = __float2bfloat16_rn(v);
}

static __device__ __forceinline__ float gelu_tanh(float x)
{
    const float k = 0.7978845608028654f; /* sqrt(2/pi) */
    return 0.5f * x * (1.0f + tanhf(k * (x + 0.044715f * x * x * x)));
}

static __device__ __forceinline__ float silu(float x)
{
    return x / (1.0f + expf(-x));
}

/* Threads per block and a grid for n elements, grid-stride loops inside:
 * at most 64 blocks per SM-ish worth of work (132 SMs on an H100/H200), so
 * huge n does not make huge grids. */
#define DITD_CUDA_EW_THREADS 256
static inline unsigned ew_blocks(size_t n)
{
    size_t b = (n + DITD_CUDA_EW_THREADS - 1) / DITD_CUDA_EW_THREADS;
    if (b > 8448)
        b = 8448;
    return b ? (unsigned)b : 1u;
}

/* Ends every entry that launched: the launch's own error (bad
 * configuration, no device), or 0. */
static inline int launch_check(void)
{
    return (int)cudaGetLastError();
}

#define DITD_CUDA_EINVAL ((int)cudaErrorInvalidValue)

#endif
