/* Unit tests of the Philox generator and its Gaussian noise (engine/core/philox.c).
 *
 * - Philox 4x32-10 against Random123's known-answer vectors (kat_vectors).
 * - ditd_philox_normal against values pinned by an independent Python
 *   implementation of the header's definition
 *   (tools/make_sampler_fixtures.py -> tests/fixtures/samplers/index.json).
 * - Slices equal the whole, at every alignment and at offsets past 2^32.
 * - Moments of 10^6 samples (mean, variance, skewness, kurtosis, lag-1
 *   correlation), overall and per lane, within 5 standard errors.
 * - Different seeds and samples (low and high words) give different noise.
 */
#include "engine/core/philox.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "ditd_build_config.h"
#include "engine/core/error.h"
#include "tests/test_util.h"


static uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static void test_kat(void)
{
    static const struct {
        uint32_t ctr[4], key[2], out[4];
    } kat[] = {
        {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
        {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
         {0xffffffff, 0xffffffff},
         {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
        {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
         {0xa4093822, 0x299f31d0},
         {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
    };
    for (size_t i = 0; i < sizeof kat / sizeof kat[0]; i++) {
        uint32_t out[4];
        ditd_philox4x32_10(kat[i].ctr, kat[i].key, out);
        for (int w = 0; w < 4; w++)
            TU_CHECK(out[w] == kat[i].out[w], "kat %zu word %d: got %08" PRIx32 ", want %08" PRIx32,
                  i, w, out[w], kat[i].out[w]);
        /* out may alias ctr */
        uint32_t io[4];
        memcpy(io, kat[i].ctr, sizeof io);
        ditd_philox4x32_10(io, kat[i].key, io);
        TU_CHECK(!memcmp(io, kat[i].out, sizeof io), "kat %zu in place", i);
    }
}

/* Values pinned by the independent Python implementation. */
static void test_pinned(void)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/samplers/index.json", tu_fixtures());
    json_error_t jerr;
    json_t *root = json_load_file(path, 0, &jerr);
    TU_CHECK(root != NULL, "%s: %s", path, jerr.text);
    if (!root)
        return;
    const json_t *ph = json_object_get(root, "philox");
    size_t i;
    const json_t *v;
    json_array_foreach(json_object_get(ph, "kat"), i, v) {
        uint32_t ctr[4], key[2], want[4], out[4];
        for (int w = 0; w < 4; w++) {
            ctr[w] = (uint32_t)json_integer_value(json_array_get(json_object_get(v, "ctr"), w));
            want[w] = (uint32_t)json_integer_value(json_array_get(json_object_get(v, "out"), w));
        }
        for (int w = 0; w < 2; w++)
            key[w] = (uint32_t)json_integer_value(json_array_get(json_object_get(v, "key"), w));
        ditd_philox4x32_10(ctr, key, out);
        TU_CHECK(!memcmp(out, want, sizeof out), "fixture kat %zu", i);
    }
    size_t npinned = 0;
    json_array_foreach(json_object_get(ph, "normal"), i, v) {
        uint64_t seed = strtoull(json_string_value(json_object_get(v, "seed")), NULL, 16);
        uint64_t sample = strtoull(json_string_value(json_object_get(v, "sample")), NULL, 16);
        uint64_t offset = strtoull(json_string_value(json_object_get(v, "offset")), NULL, 16);
        const json_t *bits = json_object_get(v, "bits");
        size_t n = json_array_size(bits);
        float out[64];
        TU_CHECK(n > 0 && n <= 64, "pinned %zu: %zu values", i, n);
        if (n == 0 || n > 64)
            continue;
        ditd_philox_normal(seed, sample, offset, n, out);
        for (size_t k = 0; k < n; k++) {
            uint32_t want = (uint32_t)json_integer_value(json_array_get(bits, k));
            TU_CHECK(f32_bits(out[k]) == want,
                  "seed %" PRIx64 " sample %" PRIx64 " element %" PRIu64 ": got %.9g (%08" PRIx32
                  "), Python %08" PRIx32,
                  seed, sample, offset + k, out[k], f32_bits(out[k]), want);
        }
        npinned += n;
    }
    TU_CHECK(npinned >= 30, "only %zu pinned values", npinned);
    json_decref(root);
}

static void test_slices(void)
{
    enum { WHOLE = 1003 };
    static float whole[WHOLE], part[WHOLE];
    const uint64_t seeds[] = {12345, 0xfedcba9876543210ull};
    const uint64_t bases[] = {0, (1ull << 32) - 7, (1ull << 34) + 1};
    for (int si = 0; si < 2; si++) {
        for (int bi = 0; bi < 3; bi++) {
            const uint64_t base = bases[bi];
            ditd_philox_normal(seeds[si], 3, base, WHOLE, whole);
            for (size_t a = 0; a < 24; a++) {
                for (size_t len = 0; len < 19 && a + len <= WHOLE; len++) {
                    part[len] = -12345.0f; /* sentinel: n must bound the writes */
                    ditd_philox_normal(seeds[si], 3, base + a, len, part);
                    TU_CHECK(!memcmp(part, whole + a, len * sizeof(float)),
                          "seed %d base %" PRIu64 " slice [%zu, +%zu) differs", si, base, a, len);
                    TU_CHECK(part[len] == -12345.0f, "wrote past n = %zu", len);
                }
            }
            /* A long unaligned slice. */
            ditd_philox_normal(seeds[si], 3, base + 5, WHOLE - 9, part);
            TU_CHECK(!memcmp(part, whole + 5, (WHOLE - 9) * sizeof(float)), "long slice");
        }
    }
}

static void test_moments(void)
{
    enum { N = 1000000 };
    float *x = malloc(sizeof(float) * N);
    TU_CHECK(x != NULL, "malloc");
    if (!x)
        return;
    ditd_philox_normal(7, 0, 0, N, x);
    /* overall, then each lane (element index mod 4: cos / sin of two pairs) */
    for (int lane = -1; lane < 4; lane++) {
        double s1 = 0, s2 = 0, s3 = 0, s4 = 0, lag = 0;
        size_t n = 0;
        for (size_t i = 0; i < N; i++) {
            if (lane >= 0 && (int)(i % 4) != lane)
                continue;
            double v = x[i];
            s1 += v;
            s2 += v * v;
            s3 += v * v * v;
            s4 += v * v * v * v;
            if (i + 1 < N)
                lag += v * x[i + 1];
            n++;
        }
        double mean = s1 / n, var = s2 / n - mean * mean;
        double skew = (s3 / n) / pow(var, 1.5), kurt = (s4 / n) / (var * var);
        double corr = lag / n;
        /* 5 standard errors of each estimate under N(0, 1) */
        double se = 5.0 / sqrt((double)n);
        TU_CHECK(fabs(mean) < se, "lane %d mean %g (bound %g)", lane, mean, se);
        TU_CHECK(fabs(var - 1) < se * sqrt(2.0), "lane %d variance %g", lane, var);
        TU_CHECK(fabs(skew) < se * sqrt(6.0), "lane %d skewness %g", lane, skew);
        TU_CHECK(fabs(kurt - 3) < se * sqrt(96.0), "lane %d kurtosis %g", lane, kurt);
        TU_CHECK(fabs(corr) < se, "lane %d lag-1 correlation %g", lane, corr);
    }
    /* tails: P(|z| > 3) = 0.0026998 */
    size_t tail = 0;
    for (size_t i = 0; i < N; i++)
        tail += fabsf(x[i]) > 3.0f;
    double p = (double)tail / N, sp = sqrt(0.0026998 * (1 - 0.0026998) / N);
    TU_CHECK(fabs(p - 0.0026998) < 5 * sp, "P(|z| > 3) = %g", p);
    free(x);
}

static int count_equal(const float *a, const float *b, size_t n)
{
    int eq = 0;
    for (size_t i = 0; i < n; i++)
        eq += a[i] == b[i];
    return eq;
}

static void test_streams_differ(void)
{
    enum { N = 256 };
    float ref[N], other[N];
    const uint64_t seed = 0x0123456789abcdefull, sample = 5;
    ditd_philox_normal(seed, sample, 0, N, ref);
    const struct {
        uint64_t seed, sample;
        const char *what;
    } variants[] = {
        {seed + 1, sample, "seed + 1"},
        {seed ^ (1ull << 40), sample, "seed high word"},
        {seed, sample + 1, "sample + 1"},
        {seed, sample | (1ull << 33), "sample high word"},
        {sample, seed, "seed and sample swapped"},
    };
    for (size_t v = 0; v < sizeof variants / sizeof variants[0]; v++) {
        ditd_philox_normal(variants[v].seed, variants[v].sample, 0, N, other);
        int eq = count_equal(ref, other, N);
        TU_CHECK(eq <= 1, "%s: %d of %d values equal", variants[v].what, eq, N);
    }
    /* a slice of the stream at element 2^32 * 4 is not the start again */
    ditd_philox_normal(seed, sample, 1ull << 34, N, other);
    TU_CHECK(count_equal(ref, other, N) <= 1, "counter high word ignored");
    /* n = 0 writes nothing */
    other[0] = 42.0f;
    ditd_philox_normal(seed, sample, 3, 0, other);
    TU_CHECK(other[0] == 42.0f, "n = 0 wrote");
}

int main(void)
{
    test_kat();
    test_pinned();
    test_slices();
    test_moments();
    test_streams_differ();
    return tu_exit();
}
