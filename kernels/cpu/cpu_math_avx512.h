/* AVX-512 versions of cpu_math.h's helpers, 16 lanes at a time, for the
 * kernels' intrinsics paths (attention.c, gemm_packed.c). Internal to
 * kernels/cpu (ditd__ prefix); each function is compiled for AVX-512F by its
 * own target attribute, so a caller needs no -march flag, only a runtime
 * check that the CPU has AVX-512F.
 */
#ifndef DITD_KERNELS_CPU_MATH_AVX512_H
#define DITD_KERNELS_CPU_MATH_AVX512_H

#include <immintrin.h>

/* exp(x), 16 lanes, in base 2: 2^(x log2 e) = 2^n 2^f, n = round(x log2 e),
 * |f| <= 1/2, 2^f by Cephes' exp2f polynomial (relative error ~2e-7, as
 * ditd__expf), 2^n by vscalefps (exact). As ditd__expf: lanes below -87.33
 * (2^-126), -inf included, give 0; above 88 the result is exp(88) (~1.65e38)
 * instead of growing to +inf; a NaN stays NaN. 12 operations. */
static inline __attribute__((target("avx512f"), always_inline)) __m512 ditd__exp16(__m512 x)
{
    /* min(88, x) returns x where x is NaN (vminps gives its second operand) */
    const __m512 xc = _mm512_min_ps(_mm512_set1_ps(88.0f), x);
    const __m512 t = _mm512_mul_ps(xc, _mm512_set1_ps(1.44269504088896341f));
    const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 f = _mm512_sub_ps(t, n);
    __m512 p = _mm512_set1_ps(1.535336188319500e-4f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.339887440266574e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.618437357674640e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.550332471162809e-2f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.402264791363012e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.931472028550421e-1f));
    const __m512 y = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    return _mm512_maskz_scalef_ps(_mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.33f), _CMP_NLT_UQ), y,
                                  n);
}

#endif
