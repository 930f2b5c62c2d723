/* GGML block dequantization, the readable reference (dequant.h).
 *
 * One function per type, one block at a time, the values in the order the
 * block stores them; each is a transcription of the gguf package's numpy
 * dequantize_blocks (gguf/quants.py), which is ggml's dequantize_row_*.
 * Layouts (bytes, in order):
 *   Q4_0  d f16 | qs[16]            x = d * (nibble - 8); low nibbles first
 *   Q4_1  d f16 | m f16 | qs[16]    x = d * nibble + m
 *   Q5_0  d f16 | qh u32 | qs[16]   x = d * ((nibble | bit << 4) - 16)
 *   Q5_1  d f16 | m f16 | qh | qs   x = d * (nibble | bit << 4) + m
 *   Q8_0  d f16 | qs[32] int8       x = q * d
 *   Q2_K  scales[16] | qs[64] | d | dmin        16 groups of 16
 *   Q3_K  hmask[32] | qs[64] | scales[12] | d  16 groups of 16, 6-bit scales
 *   Q4_K  d | dmin | scales[12] | qs[128]       8 groups of 32, 6-bit sc/min
 *   Q5_K  d | dmin | scales[12] | qh[32] | qs[128]
 *   Q6_K  ql[128] | qh[64] | scales[16] int8 | d
 * Each group's scale (d * sc) and offset (dmin * m) is an fp32 product
 * rounded once, then x = scale * q - offset, as numpy evaluates it.
 *
 * Built without -ffp-contract=fast (kernels/meson.build): GCC would fuse
 * scale * q - offset into one FMA and round once, not twice as ggml does.
 * The loops are plain enough for GCC to vectorize the 16- and 32-wide runs.
 */
#include "kernels/cpu/dequant.h"

#include <assert.h>
#include <string.h>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

enum { QK = 32, QKK = 256 };

static inline float f16(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    uint32_t bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (man << 13);
    } else if (exp != 0) {
        bits = sign | ((exp + 112u) << 23) | (man << 13);
    } else if (man == 0) {
        bits = sign;
    } else { /* subnormal: normalise */
        uint32_t e = 113;
        while (!(man & 0x400u)) {
            man <<= 1;
            e--;
        }
        bits = sign | (e << 23) | ((man & 0x3ffu) << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static void deq_q4_0(const uint8_t *b, float *y)
{
    const float d = f16(b);
    const uint8_t *qs = b + 2;
    for (int l = 0; l < 16; l++) {
        y[l] = d * (float)((int)(qs[l] & 0xf) - 8);
        y[l + 16] = d * (float)((int)(qs[l] >> 4) - 8);
    }
}

static void deq_q4_1(const uint8_t *b, float *y)
{
    const float d = f16(b), m = f16(b + 2);
    const uint8_t *qs = b + 4;
    for (int l = 0; l < 16; l++) {
        float p0 = d * (float)(qs[l] & 0xf), p1 = d * (float)(qs[l] >> 4);
        y[l] = p0 + m;
        y[l + 16] = p1 + m;
    }
}

static void deq_q5_0(const uint8_t *b, float *y)
{
    const float d = f16(b);
    uint32_t qh;
    memcpy(&qh, b + 2, 4);
    const uint8_t *qs = b + 6;
    for (int l = 0; l < 16; l++) {
        int q0 = (qs[l] & 0xf) | (int)(((qh >> l) & 1u) << 4);
        int q1 = (qs[l] >> 4) | (int)(((qh >> (l + 16)) & 1u) << 4);
        y[l] = d * (float)(q0 - 16);
        y[l + 16] = d * (float)(q1 - 16);
    }
}

static void deq_q5_1(const uint8_t *b, float *y)
{
    const float d = f16(b), m = f16(b + 2);
    uint32_t qh;
    memcpy(&qh, b + 4, 4);
    const uint8_t *qs = b + 8;
    for (int l = 0; l < 16; l++) {
        int q0 = (qs[l] & 0xf) | (int)(((qh >> l) & 1u) << 4);
        int q1 = (qs[l] >> 4) | (int)(((qh >> (l + 16)) & 1u) << 4);
        float p0 = d * (float)q0, p1 = d * (float)q1;
        y[l] = p0 + m;
        y[l + 16] = p1 + m;
    }
}

static void deq_q8_0(const uint8_t *b, float *y)
{
    const float d = f16(b);
    const int8_t *qs = (const int8_t *)(b + 2);
    for (int l = 0; l < QK; l++)
        y[l] = (float)qs[l] * d;
}

static void deq_q2_k(const uint8_t *b, float *y)
{
    const uint8_t *scales = b, *qs = b + 16;
    const float d = f16(b + 80), dmin = f16(b + 82);
    /* value e = h*128 + s*32 + l: (qs[h*32 + l] >> 2s) & 3, group e / 16 */
    for (int h = 0; h < 2; h++)
        for (int s = 0; s < 4; s++)
            for (int half = 0; half < 2; half++) {
                const int g = h * 8 + s * 2 + half;
                const float dl = d * (float)(scales[g] & 0xf), ml = dmin * (float)(scales[g] >> 4);
                const uint8_t *q = qs + h * 32 + half * 16;
                float *o = y + h * 128 + s * 32 + half * 16;
                for (int l = 0; l < 16; l++) {
                    float p = dl * (float)((q[l] >> (2 * s)) & 3);
                    o[l] = p - ml;
                }
            }
}

static void deq_q3_k(const uint8_t *b, float *y)
{
    const uint8_t *hmask = b, *qs = b + 32, *sc = b + 96;
    const float d = f16(b + 108);
    float dl[16];
    for (int i = 0; i < 16; i++) {
        int lo = i < 8 ? (sc[i] & 0xf) : (sc[i - 8] >> 4);
        int hi = (sc[8 + i % 4] >> (2 * (i / 4))) & 3;
        dl[i] = d * (float)((int8_t)(uint8_t)(lo | (hi << 4)) - 32);
    }
    /* value e = h*128 + s*32 + l: low bits (qs[h*32 + l] >> 2s) & 3, high
     * bit (hmask[l] >> (e / 32)) & 1 (set: no offset; clear: -4) */
    for (int h = 0; h < 2; h++)
        for (int s = 0; s < 4; s++) {
            const int bit = h * 4 + s;
            const uint8_t *q = qs + h * 32;
            float *o = y + h * 128 + s * 32;
            for (int l = 0; l < 32; l++) {
                int ql = (q[l] >> (2 * s)) & 3;
                int qh = ((hmask[l] >> bit) & 1) ^ 1;
                o[l] = dl[(h * 128 + s * 32 + l) / 16] * (float)(ql - (qh << 2));
            }
        }
}

/* Q4_K / Q5_K: the 8 6-bit scales and mins packed in 12 bytes. */
static void scale_min_k4(const uint8_t *s, int *sc, int *mn)
{
    for (int j = 0; j < 4; j++) {
        sc[j] = s[j] & 0x3f;
        mn[j] = s[4 + j] & 0x3f;
        sc[4 + j] = (s[8 + j] & 0xf) | ((s[j] >> 2) & 0x30);
        mn[4 + j] = (s[8 + j] >> 4) | ((s[4 + j] >> 2) & 0x30);
    }
}

static void deq_q4_k(const uint8_t *b, float *y)
{
    const float d = f16(b), dmin = f16(b + 2);
    const uint8_t *qs = b + 16;
    int sc[8], mn[8];
    scale_min_k4(b + 4, sc, mn);
    /* value e: chunk c = e / 64 of 32 bytes, nibble (e / 32) % 2, group e / 32 */
    for (int g = 0; g < 8; g++) {
        const float dl = d * (float)sc[g], ml = dmin * (float)mn[g];
        const uint8_t *q = qs + (g / 2) * 32;
        const int shift = 4 * (g % 2);
        for (int l = 0; l < 32; l++) {
            float p = dl * (float)((q[l] >> shift) & 0xf);
            y[g * 32 + l] = p - ml;
        }
    }
}

static void deq_q5_k(const uint8_t *b, float *y)
{
    const float d = f16(b), dmin = f16(b + 2);
    const uint8_t *qh = b + 16, *qs = b + 48;
    int sc[8], mn[8];
    scale_min_k4(b + 4, sc, mn);
    for (int g = 0; g < 8; g++) {
        const float dl = d * (float)sc[g], ml = dmin * (float)mn[g];
        const uint8_t *q = qs + (g / 2) * 32;
        const int shift = 4 * (g % 2);
        for (int l = 0; l < 32; l++) {
            int v = ((q[l] >> shift) & 0xf) | (((qh[l] >> g) & 1) << 4);
            float p = dl * (float)v;
            y[g * 32 + l] = p - ml;
        }
    }
}

static void deq_q6_k(const uint8_t *b, float *y)
{
    const int8_t *sc = (const int8_t *)(b + 192);
    const float d = f16(b + 208);
    /* ggml's order: per half h, four runs of 32 values (ql low nibbles of
     * bytes 0..31 and 32..63, then their high nibbles), each with 2 bits of
     * qh[l] (bits 0-1, 2-3, 4-5, 6-7); group scale per 16 values */
    for (int h = 0; h < 2; h++) {
        const uint8_t *ql = b + h * 64, *qh = b + 128 + h * 32;
        float dl[8];
        for (int i = 0; i < 8; i++)
            dl[i] = d * (float)sc[h * 8 + i];
        float *o = y + h * 128;
        for (int l = 0; l < 32; l++) {
            const int is = l / 16;
            int q1 = ((ql[l] & 0xf) | ((qh[l] & 3) << 4)) - 32;
            int q2 = ((ql[l + 32] & 0xf) | (((qh[l] >> 2) & 3) << 4)) - 32;
            int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
            int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
            o[l] = dl[is] * (float)q1;
            o[l + 32] = dl[is + 2] * (float)q2;
            o[l + 64] = dl[is + 4] * (float)q3;
            o[l + 96] = dl[is + 6] * (float)q4;
        }
    }
}

/* d[k * ldd + i] = t[i][k] for i < 16, k < 16: a 16 x 16 transpose (rows
 * of t 256 floats apart). Moves bits only. */
static inline void transpose16(const float *t, float *d, size_t ldd)
{
#if defined(__AVX512F__)
    __m512 r[16], u[16];
    for (int i = 0; i < 16; i++)
        r[i] = _mm512_loadu_ps(t + (size_t)i * 256);
    /* 32-bit, 64-bit, then 128-bit and 256-bit lane interleaves */
    for (int i = 0; i < 16; i += 2) {
        u[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        u[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        r[i] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(u[i]), _mm512_castps_pd(u[i + 2])));
        r[i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(u[i]), _mm512_castps_pd(u[i + 2])));
        r[i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(u[i + 1]), _mm512_castps_pd(u[i + 3])));
        r[i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(u[i + 1]), _mm512_castps_pd(u[i + 3])));
    }
    /* r[4q + c] now holds, in each 128-bit lane L, the 4 values of column
     * 4L + c' of rows 4q..4q+3 (c' = 0, 1, 2, 3 for c = 0, 1, 2, 3) */
    for (int q = 0; q < 4; q += 2)
        for (int c = 0; c < 4; c++) {
            __m512 a = r[4 * q + c], b = r[4 * (q + 1) + c];
            u[4 * q + c] = _mm512_shuffle_f32x4(a, b, 0x88);      /* lanes 0,2 of a, 0,2 of b */
            u[4 * (q + 1) + c] = _mm512_shuffle_f32x4(a, b, 0xdd); /* lanes 1,3 of a, 1,3 of b */
        }
    for (int c = 0; c < 4; c++)
        for (int h = 0; h < 2; h++) {
            __m512 a = u[h * 4 + c], b = u[8 + h * 4 + c];
            __m512 lo = _mm512_shuffle_f32x4(a, b, 0x88), hi = _mm512_shuffle_f32x4(a, b, 0xdd);
            r[(h ? 4 : 0) + c] = lo;
            r[(h ? 12 : 8) + c] = hi;
        }
    for (int k = 0; k < 16; k++)
        _mm512_storeu_ps(d + (size_t)k * ldd, r[k]);
#else
    for (int k = 0; k < 16; k++)
        for (int i = 0; i < 16; i++)
            d[(size_t)k * ldd + (size_t)i] = t[(size_t)i * 256 + (size_t)k];
#endif
}

typedef void (*deq_fn)(const uint8_t *, float *);

typedef struct qtype_info {
    int type, elems, bytes;
    deq_fn fn; /* NULL: an element type, converted below */
} qtype_info;

static const qtype_info g_types[] = {
    {DITD_Q_F32, 1, 4, NULL},        {DITD_Q_F16, 1, 2, NULL},
    {DITD_Q_BF16, 1, 2, NULL},       {DITD_Q_Q4_0, QK, 18, deq_q4_0},
    {DITD_Q_Q4_1, QK, 20, deq_q4_1}, {DITD_Q_Q5_0, QK, 22, deq_q5_0},
    {DITD_Q_Q5_1, QK, 24, deq_q5_1}, {DITD_Q_Q8_0, QK, 34, deq_q8_0},
    {DITD_Q_Q2_K, QKK, 84, deq_q2_k}, {DITD_Q_Q3_K, QKK, 110, deq_q3_k},
    {DITD_Q_Q4_K, QKK, 144, deq_q4_k}, {DITD_Q_Q5_K, QKK, 176, deq_q5_k},
    {DITD_Q_Q6_K, QKK, 210, deq_q6_k},
    {DITD_Q_F8_E4M3, 1, 1, NULL},    {DITD_Q_F8_E5M2, 1, 1, NULL},
};

static const qtype_info *info_of(int type)
{
    for (size_t i = 0; i < sizeof g_types / sizeof *g_types; i++)
        if (g_types[i].type == type)
            return &g_types[i];
    return NULL;
}

const char *ditd_cpu_dequant_name(int type)
{
    switch (type) {
    case DITD_Q_F32: return "F32";
    case DITD_Q_F16: return "F16";
    case DITD_Q_BF16: return "BF16";
    case DITD_Q_Q4_0: return "Q4_0";
    case DITD_Q_Q4_1: return "Q4_1";
    case DITD_Q_Q5_0: return "Q5_0";
    case DITD_Q_Q5_1: return "Q5_1";
    case DITD_Q_Q8_0: return "Q8_0";
    case DITD_Q_Q2_K: return "Q2_K";
    case DITD_Q_Q3_K: return "Q3_K";
    case DITD_Q_Q4_K: return "Q4_K";
    case DITD_Q_Q5_K: return "Q5_K";
    case DITD_Q_Q6_K: return "Q6_K";
    case DITD_Q_F8_E4M3: return "F8_E4M3";
    case DITD_Q_F8_E5M2: return "F8_E5M2";
    default: return NULL;
    }
}

int ditd_cpu_dequant_is_fp8(int type)
{
    return type == DITD_Q_F8_E4M3 || type == DITD_Q_F8_E5M2;
}

/* float8_e4m3fn: 1 sign, 4 exponent (bias 7), 3 mantissa bits; no
 * infinities, S.1111.111 is NaN; exponent 0 is subnormal (m x 2^-9). */
static inline float f8_e4m3(uint8_t b)
{
    const uint32_t s = (uint32_t)(b >> 7) << 31, e = (b >> 3) & 15u, m = b & 7u;
    uint32_t u;
    if (e == 15 && m == 7) {
        u = s | 0x7fc00000u;
    } else if (e == 0) {
        float f = (float)m * 0x1p-9f; /* exact: m < 8 */
        memcpy(&u, &f, 4);
        u |= s;
    } else {
        u = s | ((e + 120u) << 23) | (m << 20);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* float8_e5m2: 1 sign, 5 exponent (bias 15), 2 mantissa bits, IEEE-like:
 * exponent 31 is infinity (m 0) or NaN; exponent 0 subnormal (m x 2^-16). */
static inline float f8_e5m2(uint8_t b)
{
    const uint32_t s = (uint32_t)(b >> 7) << 31, e = (b >> 2) & 31u, m = b & 3u;
    uint32_t u;
    if (e == 31) {
        u = s | 0x7f800000u | (m ? 0x400000u : 0u);
    } else if (e == 0) {
        float f = (float)m * 0x1p-16f;
        memcpy(&u, &f, 4);
        u |= s;
    } else {
        u = s | ((e + 112u) << 23) | (m << 21);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

int ditd_cpu_dequant_block(int type, int *elems, int *bytes)
{
    const qtype_info *t = info_of(type);
    if (!t)
        return 0;
    if (elems)
        *elems = t->elems;
    if (bytes)
        *bytes = t->bytes;
    return 1;
}

void ditd_cpu_dequant(int type, const void *src, float *dst, size_t n)
{
    const qtype_info *t = info_of(type);
    assert(t && n % (size_t)t->elems == 0);
    const uint8_t *s = src;
    switch (type) {
    case DITD_Q_F32:
        memcpy(dst, s, n * 4);
        return;
    case DITD_Q_F16:
        for (size_t i = 0; i < n; i++)
            dst[i] = f16(s + 2 * i);
        return;
    case DITD_Q_BF16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, s + 2 * i, 2);
            uint32_t u = (uint32_t)h << 16;
            memcpy(&dst[i], &u, 4);
        }
        return;
    case DITD_Q_F8_E4M3:
        for (size_t i = 0; i < n; i++)
            dst[i] = f8_e4m3(s[i]);
        return;
    case DITD_Q_F8_E5M2:
        for (size_t i = 0; i < n; i++)
            dst[i] = f8_e5m2(s[i]);
        return;
    default:
        break;
    }
    /* one loop per type, so that each block function is inlined into it */
    const size_t nb = n / (size_t)t->elems;
#define DQ_LOOP(T, fn)                                                          \
    case T:                                                                     \
        for (size_t i = 0; i < nb; i++)                                         \
            fn(s + i * (size_t)t->bytes, dst + i * (size_t)t->elems);           \
        return;
    switch (type) {
        DQ_LOOP(DITD_Q_Q4_0, deq_q4_0)
        DQ_LOOP(DITD_Q_Q4_1, deq_q4_1)
        DQ_LOOP(DITD_Q_Q5_0, deq_q5_0)
        DQ_LOOP(DITD_Q_Q5_1, deq_q5_1)
        DQ_LOOP(DITD_Q_Q8_0, deq_q8_0)
        DQ_LOOP(DITD_Q_Q2_K, deq_q2_k)
        DQ_LOOP(DITD_Q_Q3_K, deq_q3_k)
        DQ_LOOP(DITD_Q_Q4_K, deq_q4_k)
        DQ_LOOP(DITD_Q_Q5_K, deq_q5_k)
        DQ_LOOP(DITD_Q_Q6_K, deq_q6_k)
    default:
        t->fn(s, dst); /* not reached: every block type is above */
    }
#undef DQ_LOOP
}

static void scale_values(float *v, size_t n, float s)
{
    for (size_t i = 0; i < n; i++)
        v[i] *= s;
}

void ditd_cpu_dequant_rows(int type, const void *src, size_t row_bytes, const float *scale,
                           int n0, int rows, int k0, int k1, float *dst, size_t ldd,
                           int transpose)
{
    const qtype_info *t = info_of(type);
    assert(t && k0 % t->elems == 0 && k1 > k0);
    const size_t skip = (size_t)(k0 / t->elems) * (size_t)t->bytes;
    const size_t n = (size_t)(k1 - k0);
    if (!transpose) {
        for (int r = 0; r < rows; r++) {
            ditd_cpu_dequant(type, (const uint8_t *)src + (size_t)(n0 + r) * row_bytes + skip,
                             dst + (size_t)r * ldd, n);
            if (scale)
                scale_values(dst + (size_t)r * ldd, n, scale[n0 + r]);
        }
        return;
    }
    /* transposed (a panel's rows are its columns): 16 rows x 256 values at
     * a time through L1, then each k's 16 values stored side by side (one
     * cache line), not one strided store per value */
    enum { TR = 16, CH = 256 }; /* CH: a multiple of every block's elems */
    float tmp[TR][CH];
    for (int r0 = 0; r0 < rows; r0 += TR) {
        const int nr = rows - r0 < TR ? rows - r0 : TR;
        for (size_t c = 0; c < n; c += CH) {
            const size_t m = n - c < CH ? n - c : CH;
            for (int i = 0; i < nr; i++) {
                ditd_cpu_dequant(type,
                                 (const uint8_t *)src + (size_t)(n0 + r0 + i) * row_bytes + skip +
                                     c / (size_t)t->elems * (size_t)t->bytes,
                                 tmp[i], m);
                if (scale)
                    scale_values(tmp[i], m, scale[n0 + r0 + i]);
            }
            float *d = dst + c * ldd + (size_t)r0;
            if (nr == TR && m % 16 == 0) {
                for (size_t k = 0; k < m; k += 16)
                    transpose16(&tmp[0][k], d + k * ldd, ldd);
            } else {
                for (size_t k = 0; k < m; k++)
                    for (int i = 0; i < nr; i++)
                        d[k * ldd + (size_t)i] = tmp[i][k];
            }
        }
    }
}
