/* Helpers shared by the kernel tests: a seeded PRNG for fresh inputs and a
 * whole-tensor comparison that prints both sides of the worst element.
 *
 * What this is: test-only, header-only (static functions). What it is not: a
 * test framework; each test is a plain main() that returns non-zero on the
 * first family of failures it finds.
 */
#ifndef DITD_TESTS_KT_COMMON_H
#define DITD_TESTS_KT_COMMON_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

/* splitmix64: a small, well-mixed, seedable generator. */
typedef struct kt_rng {
    uint64_t s;
} kt_rng;

static inline uint64_t kt_next(kt_rng *r)
{
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform in (lo, hi), never exactly 0 (inputs are never zeros). */
static inline float kt_uniform(kt_rng *r, float lo, float hi)
{
    for (;;) {
        const double u = (double)(kt_next(r) >> 11) * 0x1.0p-53; /* [0, 1) */
        const float v = (float)(lo + (hi - lo) * u);
        if (v != 0.0f)
            return v;
    }
}

static inline void kt_fill(kt_rng *r, float *a, size_t n, float lo, float hi)
{
    for (size_t i = 0; i < n; ++i)
        a[i] = kt_uniform(r, lo, hi);
}

static inline void *kt_alloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "out of memory (%zu bytes)\n", bytes);
        exit(2);
    }
    return p;
}

/* Whole-tensor relative error max|got - ref| / max(max|ref|, floor); prints
 * the measured error, and on failure the worst index with both sides.
 * Returns 1 on failure, 0 on success. */
static inline int kt_check(const char *what, const float *got, const double *ref, size_t n,
                           double floor_, double tol)
{
    double max_ref = floor_, max_err = 0.0;
    size_t worst = 0;
    int nonfinite = 0;
    for (size_t i = 0; i < n; ++i) {
        if (fabs(ref[i]) > max_ref)
            max_ref = fabs(ref[i]);
        if (!isfinite(got[i])) {
            if (!nonfinite)
                worst = i; /* report the first non-finite value */
            nonfinite = 1;
            continue;
        }
        const double e = fabs((double)got[i] - ref[i]);
        if (!nonfinite && e > max_err) {
            max_err = e;
            worst = i;
        }
    }
    const double rel = n ? max_err / max_ref : 0.0;
    const int fail = nonfinite || !(rel <= tol);
    printf("%-58s rel err %.3e (tol %.0e)%s\n", what, rel, tol, fail ? "  FAIL" : "");
    if (fail)
        printf("    worst at index %zu: got %.9g, ref %.17g (max|ref| %.6g)\n", worst,
               (double)got[worst], ref[worst], max_ref);
    return fail;
}

#endif
