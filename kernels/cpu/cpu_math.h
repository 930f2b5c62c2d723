/* Scalar math helpers shared by the CPU kernels, written so that GCC and clang
 * vectorize them inside simple loops (no calls into libm, no branches that
 * if-conversion cannot remove).
 *
 * What this is: internal to kernels/cpu (ditd__ prefix). What it is not: a
 * general libm replacement; each helper states its range and accuracy.
 */
#ifndef DITD_KERNELS_CPU_MATH_H
#define DITD_KERNELS_CPU_MATH_H

#include <stdint.h>
#include <string.h>

/* exp(x) for float x, vectorizable.
 * Accuracy: within 2 ulp of expf on [-87.33, 88]. Below -87.33 (where the
 * result would be subnormal) it returns 0; above 88 it returns exp(88)
 * (~1.65e38) instead of growing to +inf. Both are harmless in the only uses:
 * softmax weights exp(s - max) <= 1 and sigmoid denominators 1 + exp(-z).
 * Method (Cephes expf): x = n ln2 + r, |r| <= ln2/2, exp(r) by a degree-6
 * polynomial, 2^n built in the exponent bits. */
static inline float ditd__expf(float x)
{
    const float lo = -87.33f, hi = 88.0f;
    float xc = x < lo ? lo : x;
    xc = xc > hi ? hi : xc;
    /* n = round(xc / ln2) by the 1.5 * 2^23 trick (round to nearest even). */
    const float magic = 12582912.0f;
    float n = (xc * 1.44269504088896341f + magic) - magic;
    /* r = xc - n ln2, ln2 split in a part with few bits (exact product) and
     * a correction. */
    float r = xc - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    float y = p * (r * r) + r + 1.0f;
    /* 2^n, n in [-126, 127]: a normal float with biased exponent n + 127. */
    uint32_t bits = (uint32_t)((int32_t)n + 127) << 23;
    float s;
    memcpy(&s, &bits, sizeof s);
    y = y * s;
    return x < lo ? 0.0f : y;
}

/* 1 / (1 + exp(-z)), vectorizable; relative error a few ulp for all z
 * (for z < -88 the result is ~6e-39 instead of smaller). */
static inline float ditd__sigmoidf(float z)
{
    return 1.0f / (1.0f + ditd__expf(-z));
}

#endif
