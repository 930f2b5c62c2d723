/* The Gaussian noise of engine/core/philox.h on the GPU: Philox 4x32-10 and
 * Box-Muller in double, the definition written in that header, step by step.
 * One thread per Philox block (4 elements). */
#include "kernels/cuda/common.cuh"

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

static __device__ __forceinline__ void philox4x32_10(uint32_t c[4], uint32_t k0, uint32_t k1)
{
#pragma unroll
    for (int round = 0; round < 10; round++) {
        if (round > 0) {
            k0 += PHILOX_W0;
            k1 += PHILOX_W1;
        }
        uint32_t hi0 = __umulhi(PHILOX_M0, c[0]), lo0 = PHILOX_M0 * c[0];
        uint32_t hi1 = __umulhi(PHILOX_M1, c[2]), lo1 = PHILOX_M1 * c[2];
        uint32_t n0 = hi1 ^ c[1] ^ k0, n2 = hi0 ^ c[3] ^ k1;
        c[0] = n0;
        c[1] = lo1;
        c[2] = n2;
        c[3] = lo0;
    }
}

static __global__ void philox_normal_kernel(uint32_t k0, uint32_t k1, uint64_t sample,
                                            uint64_t offset, size_t n, uint64_t j0,
                                            uint64_t nblocks, float *out)
{
    const double two_pi = 6.283185307179586;
    const double two_pow_m32 = 1.0 / 4294967296.0;
    for (uint64_t t = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; t < nblocks;
         t += (uint64_t)gridDim.x * blockDim.x) {
        uint64_t j = j0 + t;
        uint32_t x[4] = {(uint32_t)j, (uint32_t)(j >> 32), (uint32_t)sample,
                         (uint32_t)(sample >> 32)};
        philox4x32_10(x, k0, k1);
#pragma unroll
        for (int p = 0; p < 2; p++) {
            double u1 = ((double)x[2 * p] + 0.5) * two_pow_m32;
            double u2 = ((double)x[2 * p + 1] + 0.5) * two_pow_m32;
            double r = sqrt(-2.0 * log(u1));
            double th = two_pi * u2;
            double sn, cs;
            sincos(th, &sn, &cs);
            float z[2] = {(float)(r * cs), (float)(r * sn)};
#pragma unroll
            for (int q = 0; q < 2; q++) {
                uint64_t e = 4 * j + (uint64_t)(2 * p + q);
                if (e >= offset && e - offset < (uint64_t)n)
                    out[e - offset] = z[q];
            }
        }
    }
}

extern "C" int ditd_cuda_philox_normal(uint64_t seed, uint64_t sample, uint64_t offset, size_t n,
                                       float *out, ditd_cuda_stream s)
{
    if (n == 0)
        return 0;
    if (!out)
        return DITD_CUDA_EINVAL;
    uint64_t j0 = offset >> 2, j1 = (offset + n - 1) >> 2, nb = j1 - j0 + 1;
    philox_normal_kernel<<<ew_blocks((size_t)nb), DITD_CUDA_EW_THREADS, 0, (cudaStream_t)s>>>(
        (uint32_t)seed, (uint32_t)(seed >> 32), sample, offset, n, j0, nb, out);
    return launch_check();
}
