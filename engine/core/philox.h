/* Philox 4x32-10, the counter-based generator of Salmon, Moraes, Dror and
 * Shaw ("Parallel random numbers: as easy as 1, 2, 3", SC'11; Random123),
 * and the Gaussian noise ditd draws from it.
 *
 * Why counter-based: the noise of a request must be a pure function of
 * (seed, sample, element index), so that any rank of any layout, and any
 * backend, can produce any slice of any sample's noise and get exactly the
 * values a single rank would have produced for the whole (DESIGN.md,
 * Determinism). There is no generator state to carry or to split.
 *
 * What it is not: a general RNG library, or cryptographic.
 *
 * Thread-safe: pure functions, no state.
 */
#ifndef DITD_ENGINE_PHILOX_H
#define DITD_ENGINE_PHILOX_H

#include <stddef.h>
#include <stdint.h>

/* Philox4x32 constants (Random123 philox.h). */
#define DITD_PHILOX_M0 0xD2511F53u /* multiplier applied to ctr[0] */
#define DITD_PHILOX_M1 0xCD9E8D57u /* multiplier applied to ctr[2] */
#define DITD_PHILOX_W0 0x9E3779B9u /* key[0] bump (golden ratio) */
#define DITD_PHILOX_W1 0xBB67AE85u /* key[1] bump (sqrt(3) - 1) */

/* One block of Philox 4x32 with 10 rounds: out = philox4x32_10(ctr, key),
 * bit-identical to Random123's philox4x32(ctr, key) (tested against its
 * known-answer vectors). A round, with (hi, lo) the 64-bit product split:
 *   (hi0, lo0) = M0 * ctr[0]; (hi1, lo1) = M1 * ctr[2];
 *   ctr = { hi1 ^ ctr[1] ^ key[0], lo1, hi0 ^ ctr[3] ^ key[1], lo0 }
 * and before every round but the first: key[0] += W0, key[1] += W1.
 * `out` may alias `ctr`. */
void ditd_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);

/* Standard normal noise: out[i] (0 <= i < n) is element e = offset + i of
 * sample `sample` under `seed`, a pure function of (seed, sample, e). So
 * ditd_philox_normal(s, k, a, n, out) equals elements [a, a + n) of
 * ditd_philox_normal(s, k, 0, a + n, whole), for any a and n.
 *
 * The definition, exactly (for other implementations, e.g. the CUDA one):
 *   j      = e / 4 (integer division), lane = e % 4
 *   key    = { (uint32)seed, (uint32)(seed >> 32) }
 *   ctr    = { (uint32)j, (uint32)(j >> 32), (uint32)sample, (uint32)(sample >> 32) }
 *   x[0..4) = ditd_philox4x32_10(ctr, key)
 *   in double precision, for the pair p = lane / 2 (lanes 0,1 -> p = 0;
 *   lanes 2,3 -> p = 1):
 *     u1 = ((double)x[2p]     + 0.5) * 2^-32      in (0, 1), never 0 or 1
 *     u2 = ((double)x[2p + 1] + 0.5) * 2^-32
 *     r  = sqrt(-2.0 * log(u1))
 *     t  = 6.283185307179586 * u2                 (the double nearest 2 pi)
 *     lane even: z = r * cos(t);  lane odd: z = r * sin(t)
 *   out = (float)z, rounded to nearest.
 * Libm differences across platforms can move a double result by an ulp,
 * which changes the float only in rare ties; the CPU reference is glibc.
 *
 * Cost: one Philox block per 4 elements; n may be 0. */
void ditd_philox_normal(uint64_t seed, uint64_t sample, uint64_t offset, size_t n, float *out);

#endif
