/* Philox 4x32-10 and Box-Muller Gaussian noise; see philox.h for the
 * definition that every backend reproduces. */
#include "engine/core/philox.h"

#include <math.h>

#define TWO_PI 6.283185307179586 /* the double nearest 2 pi, as in the header */
#define TWO_POW_M32 (1.0 / 4294967296.0)

static inline void mulhilo32(uint32_t a, uint32_t b, uint32_t *hi, uint32_t *lo)
{
    uint64_t p = (uint64_t)a * (uint64_t)b;
    *hi = (uint32_t)(p >> 32);
    *lo = (uint32_t)p;
}

void ditd_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4])
{
    uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
    uint32_t k0 = key[0], k1 = key[1];
    for (int round = 0; round < 10; round++) {
        if (round > 0) {
            k0 += DITD_PHILOX_W0;
            k1 += DITD_PHILOX_W1;
        }
        uint32_t hi0, lo0, hi1, lo1;
        mulhilo32(DITD_PHILOX_M0, c0, &hi0, &lo0);
        mulhilo32(DITD_PHILOX_M1, c2, &hi1, &lo1);
        c0 = hi1 ^ c1 ^ k0;
        c1 = lo1;
        c2 = hi0 ^ c3 ^ k1;
        c3 = lo0;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

/* The four normals of block j: z[lane] for elements 4j .. 4j+3. */
static void normal_block(const uint32_t key[2], uint64_t j, uint64_t sample, float z[4])
{
    uint32_t ctr[4] = {(uint32_t)j, (uint32_t)(j >> 32), (uint32_t)sample,
                       (uint32_t)(sample >> 32)};
    uint32_t x[4];
    ditd_philox4x32_10(ctr, key, x);
    for (int p = 0; p < 2; p++) {
        double u1 = ((double)x[2 * p] + 0.5) * TWO_POW_M32;
        double u2 = ((double)x[2 * p + 1] + 0.5) * TWO_POW_M32;
        double r = sqrt(-2.0 * log(u1));
        double t = TWO_PI * u2;
        z[2 * p] = (float)(r * cos(t));
        z[2 * p + 1] = (float)(r * sin(t));
    }
}

void ditd_philox_normal(uint64_t seed, uint64_t sample, uint64_t offset, size_t n, float *out)
{
    const uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    size_t i = 0;
    float z[4];

    /* A leading partial block when offset is not a multiple of 4. */
    unsigned lane = (unsigned)(offset & 3u);
    if (n > 0 && lane != 0) {
        normal_block(key, offset >> 2, sample, z);
        for (; lane < 4 && i < n; lane++)
            out[i++] = z[lane];
    }
    /* Whole blocks, then a trailing partial one. */
    while (i < n) {
        uint64_t e = offset + i;
        normal_block(key, e >> 2, sample, z);
        size_t take = n - i < 4 ? n - i : 4;
        for (size_t k = 0; k < take; k++)
            out[i + k] = z[k];
        i += take;
    }
}
