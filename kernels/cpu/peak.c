/* The machine's FMA peak, measured: what `ditd bench` divides its GFLOP/s
 * by. 24 independent accumulators per thread (enough to cover the FMA
 * latency times the number of FMA pipes on current cores; fewer read about
 * half the peak), in 512-bit registers where the CPU has AVX-512, else
 * 256-bit, one OpenMP thread per requested thread; the best of ~10 ms
 * samples.
 *
 * What it is not: a GEMM or a model of the memory system; it measures the
 * arithmetic ceiling at the clock the machine runs now.
 */
#include "kernels/cpu/cpu_kernels.h"

#include <immintrin.h>
#include <omp.h>
#include <time.h>

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

#define FMA24(T, fma)                                                                              \
    do {                                                                                           \
        F(0); F(1); F(2); F(3); F(4); F(5); F(6); F(7); F(8); F(9); F(10); F(11);                 \
        F(12); F(13); F(14); F(15); F(16); F(17); F(18); F(19); F(20); F(21); F(22); F(23);       \
    } while (0)

/* Returns the sum of the accumulators so the loop cannot be dropped. */
__attribute__((target("avx512f"))) static float chains512(long rounds)
{
    __m512 a[24];
    const __m512 m = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-6f);
    for (int i = 0; i < 24; i++)
        a[i] = _mm512_set1_ps((float)i);
    for (long r = 0; r < rounds; r++) {
#define F(i) a[i] = _mm512_fmadd_ps(a[i], m, c)
        FMA24(__m512, _mm512_fmadd_ps);
#undef F
    }
    __m512 s = a[0];
    for (int i = 1; i < 24; i++)
        s = _mm512_add_ps(s, a[i]);
    return _mm512_reduce_add_ps(s);
}

__attribute__((target("avx2,fma"))) static float chains256(long rounds)
{
    __m256 a[24];
    const __m256 m = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-6f);
    for (int i = 0; i < 24; i++)
        a[i] = _mm256_set1_ps((float)i);
    for (long r = 0; r < rounds; r++) {
#define F(i) a[i] = _mm256_fmadd_ps(a[i], m, c)
        FMA24(__m256, _mm256_fmadd_ps);
#undef F
    }
    __m256 s = a[0];
    for (int i = 1; i < 24; i++)
        s = _mm256_add_ps(s, a[i]);
    float v[8];
    _mm256_storeu_ps(v, s);
    return v[0] + v[1] + v[2] + v[3] + v[4] + v[5] + v[6] + v[7];
}

double ditd_cpu_fma_peak_gflops(int threads, double seconds, int *bits)
{
    const int w512 = __builtin_cpu_supports("avx512f");
    const int lanes = w512 ? 16 : 8;
    const long rounds = 2000000; /* 24 * 2e6 FMAs per thread: ~10 ms a sample */
    if (threads < 1)
        threads = omp_get_max_threads();
    if (bits)
        *bits = lanes * 32;
    if (!w512 && !__builtin_cpu_supports("fma"))
        return 0;
    /* the best of ~10 ms samples: the ceiling of the machine as it is
     * clocked now. (A median of short samples on a shared machine measures
     * the other tenants: a parallel region waits for its slowest thread.) */
    double best = 0, t_end = now_s() + seconds;
    volatile float sink = 0;
    do {
        double t0 = now_s();
        float s = 0;
#pragma omp parallel num_threads(threads) reduction(+ : s)
        s += w512 ? chains512(rounds) : chains256(rounds);
        double dt = now_s() - t0;
        sink += s;
        double g = 2.0 * lanes * 24.0 * (double)rounds * threads / (dt * 1e9);
        if (g > best)
            best = g;
    } while (now_s() < t_end);
    (void)sink;
    return best;
}
