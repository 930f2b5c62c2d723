/* Scaled dot-product attention on the CPU, flash-style, with log-sum-exp.
 *
 * What this is: exact fp32 attention (no masking, no dropout) over
 * (B, N, H, Dh) strided activations, tiled so that a block of queries meets
 * every block of keys once with a running max and sum (online softmax), and
 * the (Nq, Nk) score matrix never exists. It also returns the log-sum-exp so
 * that partial results over disjoint key sets merge exactly (ring attention).
 * What it is not: a GEMM library. The two products per tile (S = Q K^T and
 * O += P V) are small register-blocked loop nests; BLAS is not callable here
 * since the tiles run inside an OpenMP region.
 *
 * Two paths with the same tiling: an AVX-512 one (intrinsics, compiled by
 * function attribute and chosen at run time when the CPU has AVX-512F; see
 * "The AVX-512 path" below) and the portable one (block_8x32, plain C that
 * the compiler vectorizes), taken on other CPUs or with the environment
 * variable DITD_CPU_ATTN_ISA=portable (tests, comparisons).
 *
 * Work split: one task per (batch, head, query block); each task owns its
 * tiles on its own stack and reads K/V of its head, so tasks share nothing
 * but the read-only inputs, and a task computes the same bits whichever
 * thread runs it.
 */
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/cpu_math.h"
#include "kernels/cpu/cpu_math_avx512.h"

#include <assert.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#if (defined(__GNUC__) || defined(__clang__)) && defined(__x86_64__)
#define ATT_X86 1
#include <immintrin.h>
#else
#define ATT_X86 0
#endif

enum {
    ATT_BQ = 64, /* queries per task: the vector axis of every tile */
    ATT_BK = 64, /* keys per inner tile */
    ATT_MR = 8,  /* rows of the register block */
    ATT_NR = 32, /* columns of the register block (two AVX-512 vectors) */
    ATT_MAX_DH = DITD_CPU_ATTN_MAX_DH,
    ATT_MAX_DHP = (DITD_CPU_ATTN_MAX_DH + ATT_MR - 1) / ATT_MR * ATT_MR,
};

#if defined(__clang__)
#define ATT_NOINLINE static __attribute__((noinline))
#elif defined(__GNUC__)
#define ATT_NOINLINE static __attribute__((noinline, noclone))
#else
#define ATT_NOINLINE static
#endif

/* The one inner kernel, a register block of a small GEMM:
 *   C[r, 0:32] (=|+=) sum_{k < kdim} A(r, k) * B[k, 0:32],   r < 8,
 * A(r, k) = A[r * ars + k * aks] (single elements, broadcast); B rows of 32
 * contiguous floats, row stride ldb; C row stride ldc. The 8 x 32 accumulators
 * fit in 16 AVX-512 registers; per k: 2 loads of B, 8 broadcasts, 16 FMAs.
 *
 * Out of line and not cloned on purpose: GCC 12 seeing a constant unit
 * stride for A (as in the P V product) vectorizes across the 8 rows instead
 * of the 32 columns (shuffles and 4-wide FMAs), several times slower. */
ATT_NOINLINE void block_8x32(int kdim, const float *restrict A, size_t ars, size_t aks,
                             const float *restrict B, size_t ldb, float *restrict C,
                             size_t ldc, int accumulate)
{
    float c[ATT_MR][ATT_NR];
    for (int r = 0; r < ATT_MR; ++r)
        for (int j = 0; j < ATT_NR; ++j)
            c[r][j] = accumulate ? C[(size_t)r * ldc + j] : 0.0f;
    for (int k = 0; k < kdim; ++k) {
        const float *bk = B + (size_t)k * ldb;
        for (int r = 0; r < ATT_MR; ++r) {
            const float a = A[(size_t)r * ars + (size_t)k * aks];
            for (int j = 0; j < ATT_NR; ++j)
                c[r][j] += a * bk[j];
        }
    }
    for (int r = 0; r < ATT_MR; ++r)
        for (int j = 0; j < ATT_NR; ++j)
            C[(size_t)r * ldc + j] = c[r][j];
}

/* One task: queries [i_begin, i_begin + nq) of head h in batch b, all keys.
 *
 * Every tile keeps queries on its last (vector) axis, so everything per
 * query (running max, sum, rescale) is a plain vector loop, and K and V are
 * read in place, as the broadcast operand, with no transpose:
 *   S^T (nk, BQ)   = K (nk, Dh) . (scale Q)^T (Dh, BQ)
 *   P^T            = exp(S^T - m_new)      m, l updated per query column
 *   O^T (Dh, BQ)  += V^T (Dh, nk) . P^T (nk, BQ)
 * Row blocks of 8 that would run past the last key or the last channel read
 * a zero-padded copy instead. */
static void attention_task(const float *q, size_t ldq, const float *k, size_t ldk,
                           const float *v, size_t ldv, float *o, size_t ldo, float *lse,
                           int b, int h, int i_begin, int nq, int Nq, int Nk, int H,
                           int Dh, float scale)
{
    /* Tiles (see DITD_CPU_ATTN_MAX_DH in the header for the stack size). */
    float qt[ATT_MAX_DH * ATT_BQ];    /* (scale Q)^T, (Dh, BQ), zero past nq */
    float ot[ATT_MAX_DHP * ATT_BQ];   /* O^T, unnormalized, (Dhp, BQ) */
    float st[ATT_BK * ATT_BQ];        /* S^T, then P^T, (BK, BQ) */
    float vpad[ATT_BK * ATT_MAX_DHP]; /* V tile, zero-padded to Dhp columns */
    float kpad[ATT_MR * ATT_MAX_DH];  /* last partial block of 8 keys, padded */
    float m[ATT_BQ], l[ATT_BQ], alpha[ATT_BQ]; /* running max, sum; rescale */

    const int Dhp = (Dh + ATT_MR - 1) / ATT_MR * ATT_MR;
    const int nqb = nq > ATT_NR ? ATT_BQ : ATT_NR; /* query columns computed */
    const size_t hoff = (size_t)h * (size_t)Dh;

    for (int d = 0; d < Dh; ++d)
        for (int i = 0; i < ATT_BQ; ++i)
            qt[(size_t)d * ATT_BQ + i] =
                i < nq ? scale * q[((size_t)b * Nq + i_begin + i) * ldq + hoff + d] : 0.0f;
    for (int i = 0; i < ATT_BQ; ++i) {
        m[i] = -INFINITY;
        l[i] = 0.0f;
    }
    memset(ot, 0, sizeof(float) * (size_t)Dhp * ATT_BQ);

    for (int k0 = 0; k0 < Nk; k0 += ATT_BK) {
        const int nk = Nk - k0 < ATT_BK ? Nk - k0 : ATT_BK;
        const float *kt0 = k + ((size_t)b * Nk + k0) * ldk + hoff; /* key j: + j*ldk */
        const float *vt0 = v + ((size_t)b * Nk + k0) * ldv + hoff;

        /* S^T = K (scale Q)^T: 8 keys x 32 queries per block. */
        for (int j0 = 0; j0 < nk; j0 += ATT_MR) {
            const float *a = kt0 + (size_t)j0 * ldk;
            size_t ars = ldk;
            if (nk - j0 < ATT_MR) { /* past the last key: zero keys */
                memset(kpad, 0, sizeof(float) * ATT_MR * (size_t)Dh);
                for (int r = 0; r < nk - j0; ++r)
                    memcpy(kpad + (size_t)r * Dh, a + (size_t)r * ldk,
                           sizeof(float) * (size_t)Dh);
                a = kpad;
                ars = (size_t)Dh;
            }
            for (int i0 = 0; i0 < nqb; i0 += ATT_NR)
                block_8x32(Dh, a, ars, 1, qt + i0, ATT_BQ, st + (size_t)j0 * ATT_BQ + i0,
                           ATT_BQ, 0);
        }

        /* Online softmax down the key axis, vectorized over the nqb query
         * columns computed (columns past nq hold zero queries: finite, unused). */
        float mx[ATT_BQ];
        for (int i = 0; i < nqb; ++i)
            mx[i] = m[i];
        for (int j = 0; j < nk; ++j) {
            const float *sj = st + (size_t)j * ATT_BQ;
            for (int i = 0; i < nqb; ++i)
                mx[i] = sj[i] > mx[i] ? sj[i] : mx[i];
        }
        int rescale = 0;
        for (int i = 0; i < nqb; ++i) {
            alpha[i] = ditd__expf(m[i] - mx[i]); /* 0 on the first tile */
            rescale |= alpha[i] != 1.0f;
            m[i] = mx[i];
            l[i] *= alpha[i];
        }
        for (int j = 0; j < nk; ++j) {
            float *sj = st + (size_t)j * ATT_BQ;
            for (int i = 0; i < nqb; ++i) {
                sj[i] = ditd__expf(sj[i] - m[i]);
                l[i] += sj[i];
            }
        }
        if (rescale)
            for (int d = 0; d < Dh; ++d) {
                float *od = ot + (size_t)d * ATT_BQ;
                for (int i = 0; i < nqb; ++i)
                    od[i] *= alpha[i];
            }

        /* O^T += V^T P^T: 8 channels x 32 queries per block. */
        const float *vt = vt0;
        size_t vstride = ldv;
        if (Dhp != Dh) { /* the last block of channels would run past Dh */
            for (int j = 0; j < nk; ++j) {
                memcpy(vpad + (size_t)j * Dhp, vt0 + (size_t)j * ldv, sizeof(float) * (size_t)Dh);
                for (int d = Dh; d < Dhp; ++d)
                    vpad[(size_t)j * Dhp + d] = 0.0f;
            }
            vt = vpad;
            vstride = (size_t)Dhp;
        }
        for (int d0 = 0; d0 < Dhp; d0 += ATT_MR)
            for (int i0 = 0; i0 < nqb; i0 += ATT_NR)
                block_8x32(nk, vt + d0, 1, vstride, st + i0, ATT_BQ,
                           ot + (size_t)d0 * ATT_BQ + i0, ATT_BQ, 1);
    }

    float inv[ATT_BQ];
    for (int i = 0; i < nq; ++i) {
        inv[i] = 1.0f / l[i];
        if (lse)
            lse[((size_t)b * H + h) * Nq + i_begin + i] = m[i] + logf(l[i]);
    }
    for (int i = 0; i < nq; ++i) {
        float *dst = o + ((size_t)b * Nq + i_begin + i) * ldo + hoff;
        for (int d = 0; d < Dh; ++d)
            dst[d] = ot[(size_t)d * ATT_BQ + i] * inv[i];
    }
}

/* ---- The AVX-512 path -------------------------------------------------
 *
 * The same scheme as attention_task (queries on the vector axis, keys and
 * channels broadcast, online softmax per key tile), written with intrinsics
 * so that nothing depends on what the vectorizer makes of it:
 *   - a register block of ATT_R rows (keys for S, channels for O) x NV
 *     vectors of 16 queries (NV <= 4: 64 queries) whose accumulators stay
 *     in registers over the whole contraction (Dh for S, the key tile for
 *     O); a channel tail (Dh not a multiple of ATT_R) takes a smaller block
 *     and the last partial block of keys a full one over zero-padded keys,
 *     so Dh needs no padding and no mask;
 *   - the running max of a tile taken from the S accumulators as they are
 *     stored, the exp 16-wide in base 2 (ditd__exp16, cpu_math_avx512.h), and the rescale of O by
 *     alpha folded into the load of the O accumulators;
 *   - key tiles of ATT_BK6 = 96 keys (whole register blocks); K and V a
 *     tile ahead, and the next task's rows, fetched into L2 while the
 *     current tile computes (see attention_run512);
 *   - Q^T in and O^T out through 16 x 16 register transposes.
 * Compiled for AVX-512F by function attribute and chosen at run time
 * (__builtin_cpu_supports), so a build without -march=native still has it
 * and a CPU without it takes the portable path above. */
#if ATT_X86

enum {
    ATT_R = 6,             /* rows of the register block */
    ATT_NV = ATT_BQ / 16,  /* query vectors per task */
    ATT_BK6 = 96,          /* keys per tile, a multiple of ATT_R */
};

/* The rows of the task a thread runs next, to prefetch (nq = 0: none). */
typedef struct att_next {
    const float *q0; /* its first query row at the head's offset; rows ldq apart */
    float *o0;       /* its first output row, likewise; rows ldo apart */
    const float *k0, *v0; /* its first key and value rows, likewise */
    int nq;
    int fetch_kv; /* whether its K and V need fetching (see attention_run512) */
} att_next;

_Static_assert(ATT_BK6 % ATT_R == 0, "a key tile is whole register blocks");

#define ATT_AVX512_INLINE static inline __attribute__((target("avx512f"), always_inline))

/* In-register transpose: r[i][j] -> r[j][i]. */
ATT_AVX512_INLINE void transpose16(__m512 r[16])
{
    __m512 t[16], u[16];
    for (int i = 0; i < 8; ++i) {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; ++i) {
        u[4 * i + 0] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
        u[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
        u[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
        u[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
    }
    for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 4; ++j) {
            t[8 * i + j] = _mm512_shuffle_f32x4(u[8 * i + j], u[8 * i + 4 + j], 0x88);
            t[8 * i + 4 + j] = _mm512_shuffle_f32x4(u[8 * i + j], u[8 * i + 4 + j], 0xDD);
        }
    for (int j = 0; j < 8; ++j) {
        r[j] = _mm512_shuffle_f32x4(t[j], t[8 + j], 0x88);
        r[8 + j] = _mm512_shuffle_f32x4(t[j], t[8 + j], 0xDD);
    }
}

static inline __mmask16 lanes_below(int n)
{
    return n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1u);
}

/* Prefetch the cache lines of rows [0, n) of Dh floats at p + r * ld: into
 * L1 (l1) or L2, for reading or writing (w). The rows of a head are
 * scattered one per (B, N) row of the activations, which the hardware
 * prefetchers do not follow. */
ATT_AVX512_INLINE void prefetch_rows(const float *p, size_t ld, int n, int Dh, int l1, int w)
{
    for (int r = 0; r < n; ++r) {
        const uintptr_t a = (uintptr_t)(p + (size_t)r * ld);
        const uintptr_t last = (a + sizeof(float) * (size_t)Dh - 1) & ~(uintptr_t)63;
        for (uintptr_t line = a & ~(uintptr_t)63; line <= last; line += 64) {
            const char *c = (const char *)line;
            if (l1)
                _mm_prefetch(c, _MM_HINT_T0);
            else if (w)
                __builtin_prefetch(c, 1, 2);
            else
                _mm_prefetch(c, _MM_HINT_T1);
        }
    }
}

/* qt[d, i] = scale Q[i, d] for d < Dh, i < 16 NV (zero for i >= nq): query
 * i at q0 + i * ldq. 16 x 16 blocks through registers. */
ATT_AVX512_INLINE void load_qt(const int NV, const float *q0, size_t ldq, int nq, int Dh,
                               float scale, float *qt)
{
    const __m512 sc = _mm512_set1_ps(scale);
    for (int g = 0; g < NV; ++g)
        for (int c0 = 0; c0 < Dh; c0 += 16) {
            const __mmask16 cm = lanes_below(Dh - c0);
            __m512 r[16];
            for (int t = 0; t < 16; ++t)
                r[t] = 16 * g + t < nq
                           ? _mm512_mul_ps(sc, _mm512_maskz_loadu_ps(
                                                   cm, q0 + (size_t)(16 * g + t) * ldq + c0))
                           : _mm512_setzero_ps();
            transpose16(r);
            for (int t = 0; t < 16 && c0 + t < Dh; ++t)
                _mm512_store_ps(qt + (size_t)(c0 + t) * ATT_BQ + 16 * g, r[t]);
        }
}

/* O[i, d] = ot[d, i] / l[i] for i < nq, d < Dh: query i at o0 + i * ldo.
 * ot has Dh rounded up to 16 rows (those past Dh are read, never stored). */
ATT_AVX512_INLINE void store_o(const int NV, const float *ot, const float *l, float *o0,
                               size_t ldo, int nq, int Dh)
{
    for (int g = 0; g < NV; ++g)
        for (int c0 = 0; c0 < Dh; c0 += 16) {
            const __mmask16 cm = lanes_below(Dh - c0);
            __m512 r[16];
            for (int t = 0; t < 16; ++t)
                r[t] = _mm512_load_ps(ot + (size_t)(c0 + t) * ATT_BQ + 16 * g);
            transpose16(r);
            for (int t = 0; t < 16 && 16 * g + t < nq; ++t)
                _mm512_mask_storeu_ps(o0 + (size_t)(16 * g + t) * ldo + c0, cm,
                                      _mm512_mul_ps(r[t], _mm512_set1_ps(1.0f / l[16 * g + t])));
        }
}

/* S^T rows [0, R) of a tile (R keys x NV query vectors):
 *   st[r, :] = sum_{d < Dh} K[r, d] qt[d, :],   mx = max(mx, st[r, :]) for r < nmax.
 * K row r at k + r * ldk. */
ATT_AVX512_INLINE void s_rows(const int R, const int NV, int Dh, const float *k, size_t ldk,
                              const float *qt, float *st, __m512 *mx, int nmax)
{
    __m512 c[ATT_R][ATT_NV];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
        for (int u = 0; u < NV; ++u)
            c[r][u] = _mm512_setzero_ps();
    for (int d = 0; d < Dh; ++d) {
        __m512 qv[ATT_NV];
#pragma GCC unroll 4
        for (int u = 0; u < NV; ++u)
            qv[u] = _mm512_load_ps(qt + (size_t)d * ATT_BQ + 16 * u);
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
            const __m512 a = _mm512_set1_ps(k[(size_t)r * ldk + d]);
#pragma GCC unroll 4
            for (int u = 0; u < NV; ++u)
                c[r][u] = _mm512_fmadd_ps(a, qv[u], c[r][u]);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
        for (int u = 0; u < NV; ++u) {
            _mm512_store_ps(st + (size_t)r * ATT_BQ + 16 * u, c[r][u]);
            if (r < nmax)
                mx[u] = _mm512_max_ps(mx[u], c[r][u]);
        }
}

/* O^T rows [0, R) (R channels x NV query vectors) over one key tile:
 *   ot[r, :] = init + sum_{j < nk} V[j, r] pt[j, :],
 * init 0 (mode 0), ot[r, :] (mode 1) or ot[r, :] * alpha (mode 2). V row j
 * at v + j * ldv. */
ATT_AVX512_INLINE void pv_rows(const int R, const int NV, int nk, const float *v, size_t ldv,
                               const float *pt, float *ot, const __m512 *alpha, int mode)
{
    __m512 c[ATT_R][ATT_NV];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
        for (int u = 0; u < NV; ++u) {
            if (mode == 0)
                c[r][u] = _mm512_setzero_ps();
            else {
                c[r][u] = _mm512_load_ps(ot + (size_t)r * ATT_BQ + 16 * u);
                if (mode == 2)
                    c[r][u] = _mm512_mul_ps(c[r][u], alpha[u]);
            }
        }
    for (int j = 0; j < nk; ++j) {
        const float *vj = v + (size_t)j * ldv;
        __m512 p[ATT_NV];
#pragma GCC unroll 4
        for (int u = 0; u < NV; ++u)
            p[u] = _mm512_load_ps(pt + (size_t)j * ATT_BQ + 16 * u);
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
            const __m512 a = _mm512_set1_ps(vj[r]);
#pragma GCC unroll 4
            for (int u = 0; u < NV; ++u)
                c[r][u] = _mm512_fmadd_ps(a, p[u], c[r][u]);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
        for (int u = 0; u < NV; ++u)
            _mm512_store_ps(ot + (size_t)r * ATT_BQ + 16 * u, c[r][u]);
}

/* Online softmax over one tile of S^T (nk keys x NV query vectors) whose
 * max down the keys, with the running max m, is mx: alpha = exp(m - mx),
 * m = mx, l = alpha l + sum_j P^T[j], P^T = exp(S^T - m) in place. Returns
 * whether any alpha differs from 1. */
ATT_AVX512_INLINE int softmax_tile(const int NV, int nk, float *st, const __m512 *mx, __m512 *m,
                                   __m512 *l, __m512 *alpha)
{
    __mmask16 changed = 0;
    for (int u = 0; u < NV; ++u) {
        alpha[u] = ditd__exp16(_mm512_sub_ps(m[u], mx[u])); /* 0 on the first tile */
        changed |= _mm512_cmp_ps_mask(alpha[u], _mm512_set1_ps(1.0f), _CMP_NEQ_UQ);
        m[u] = mx[u];
        l[u] = _mm512_mul_ps(l[u], alpha[u]);
    }
    for (int j = 0; j < nk; ++j)
#pragma GCC unroll 4
        for (int u = 0; u < NV; ++u) {
            float *sj = st + (size_t)j * ATT_BQ + 16 * u;
            const __m512 p = ditd__exp16(_mm512_sub_ps(_mm512_load_ps(sj), m[u]));
            _mm512_store_ps(sj, p);
            l[u] = _mm512_add_ps(l[u], p);
        }
    return changed != 0;
}

/* The row tail of a tile (0 < R < ATT_R) with a constant R. */
#define ATT_ROW_TAIL(R, CALL)                                                                      \
    switch (R) {                                                                                   \
    case 1: CALL(1); break;                                                                        \
    case 2: CALL(2); break;                                                                        \
    case 3: CALL(3); break;                                                                        \
    case 4: CALL(4); break;                                                                        \
    case 5: CALL(5); break;                                                                        \
    default: break;                                                                                \
    }

/* One task (as attention_task) with NV = ceil(nq / 16) query vectors. */
ATT_AVX512_INLINE void task512(const int NV, const float *q, size_t ldq, const float *k,
                               size_t ldk, const float *v, size_t ldv, float *o, size_t ldo,
                               float *lse, int b, int h, int i_begin, int nq, int Nq, int Nk,
                               int H, int Dh, float scale, int fetch_kv, const att_next *next)
{
    _Alignas(64) float qt[ATT_MAX_DH * ATT_BQ]; /* (scale Q)^T, (Dh, BQ), zero past nq */
    _Alignas(64) float ot[ATT_MAX_DH * ATT_BQ]; /* O^T unnormalized, (Dh16, BQ) */
    _Alignas(64) float st[ATT_BK6 * ATT_BQ];    /* S^T, then P^T, (BK6, BQ) */
    _Alignas(64) float kpad[ATT_R * ATT_MAX_DH]; /* a last partial block of keys */
    _Alignas(64) float mb[ATT_BQ], lb[ATT_BQ];
    const int Dh16 = (Dh + 15) / 16 * 16;
    const size_t hoff = (size_t)h * (size_t)Dh;
    const float *q0 = q + ((size_t)b * Nq + i_begin) * ldq + hoff; /* query i: + i*ldq */

    /* qt = (scale Q)^T, 16 x 16 blocks (all rows requested first: they are
     * in L2 unless this is a thread's first task); rows of ot past Dh (read
     * by the last transpose out, never stored) zeroed. */
    prefetch_rows(q0, ldq, nq, Dh, 1, 0);
    load_qt(NV, q0, ldq, nq, Dh, scale, qt);
    for (int d = Dh; d < Dh16; ++d)
        memset(ot + (size_t)d * ATT_BQ, 0, sizeof(float) * ATT_BQ);

    __m512 m[ATT_NV], l[ATT_NV];
    for (int u = 0; u < NV; ++u) {
        m[u] = _mm512_set1_ps(-INFINITY);
        l[u] = _mm512_setzero_ps();
    }
    /* The next task's query and output rows go into L2 a few per register
     * block of S, spread over this task (a burst of ~600 prefetches would
     * stall on the cache's miss queue). */
    const int nqn = next->nq;
    const int qn_step = nqn > 0 ? (nqn * ATT_R + Nk - 1) / (Nk > 0 ? Nk : 1) + 1 : 0;
    int qn_done = 0;

    for (int k0 = 0; k0 < Nk; k0 += ATT_BK6) {
        const int nk = Nk - k0 < ATT_BK6 ? Nk - k0 : ATT_BK6;
        const float *kt0 = k + ((size_t)b * Nk + k0) * ldk + hoff; /* key j: + j*ldk */
        const float *vt0 = v + ((size_t)b * Nk + k0) * ldv + hoff;

        /* S^T = K (scale Q)^T and its max down the keys. Meanwhile the
         * next tile's K and V (or those of the next task's first tile) are
         * fetched into L2, six rows per register block. */
        const float *kn = NULL, *vn = NULL;
        int nkn = 0;
        if (k0 + nk < Nk && fetch_kv) {
            kn = kt0 + (size_t)nk * ldk;
            vn = vt0 + (size_t)nk * ldv;
            nkn = Nk - k0 - nk < ATT_BK6 ? Nk - k0 - nk : ATT_BK6;
        } else if (k0 + nk >= Nk && next->nq > 0 && next->fetch_kv) {
            kn = next->k0;
            vn = next->v0;
            nkn = Nk < ATT_BK6 ? Nk : ATT_BK6;
        }
        __m512 mx[ATT_NV];
        for (int u = 0; u < NV; ++u)
            mx[u] = m[u];
        int j0 = 0;
        for (; j0 + ATT_R <= nk; j0 += ATT_R) {
            s_rows(ATT_R, NV, Dh, kt0 + (size_t)j0 * ldk, ldk, qt, st + (size_t)j0 * ATT_BQ, mx,
                   ATT_R);
            if (j0 < nkn) {
                const int np = nkn - j0 < ATT_R ? nkn - j0 : ATT_R;
                prefetch_rows(kn + (size_t)j0 * ldk, ldk, np, Dh, 0, 0);
                prefetch_rows(vn + (size_t)j0 * ldv, ldv, np, Dh, 0, 0);
            }
            if (qn_done < nqn) {
                const int np = nqn - qn_done < qn_step ? nqn - qn_done : qn_step;
                prefetch_rows(next->q0 + (size_t)qn_done * ldq, ldq, np, Dh, 0, 0);
                prefetch_rows(next->o0 + (size_t)qn_done * ldo, ldo, np, Dh, 0, 1);
                qn_done += np;
            }
        }
        if (j0 < nk) {
            /* The last rt < ATT_R keys as a full block over zero-padded
             * keys (a smaller block runs at about half the FMA rate): the
             * rows past nk are stored (st has room: nk <= ATT_BK6, a
             * multiple of ATT_R), left out of the max, never read. */
            const int rt = nk - j0;
            for (int r = 0; r < ATT_R; ++r) {
                if (r < rt)
                    memcpy(kpad + (size_t)r * Dh, kt0 + (size_t)(j0 + r) * ldk,
                           sizeof(float) * (size_t)Dh);
                else
                    memset(kpad + (size_t)r * Dh, 0, sizeof(float) * (size_t)Dh);
            }
            s_rows(ATT_R, NV, Dh, kpad, (size_t)Dh, qt, st + (size_t)j0 * ATT_BQ, mx, rt);
        }
        if (j0 < nkn) {
            prefetch_rows(kn + (size_t)j0 * ldk, ldk, nkn - j0, Dh, 0, 0);
            prefetch_rows(vn + (size_t)j0 * ldv, ldv, nkn - j0, Dh, 0, 0);
        }

        /* Online softmax: rescale factors, P^T = exp(S^T - m), sums. */
        __m512 alpha[ATT_NV];
        const int changed = softmax_tile(NV, nk, st, mx, m, l, alpha);

        /* O^T = alpha O^T + V^T P^T. */
        const int mode = k0 == 0 ? 0 : changed ? 2 : 1;
        int d0 = 0;
        for (; d0 + ATT_R <= Dh; d0 += ATT_R)
            pv_rows(ATT_R, NV, nk, vt0 + d0, ldv, st, ot + (size_t)d0 * ATT_BQ, alpha, mode);
#define ATT_PV_TAIL(R) pv_rows(R, NV, nk, vt0 + d0, ldv, st, ot + (size_t)d0 * ATT_BQ, alpha, mode)
        ATT_ROW_TAIL(Dh - d0, ATT_PV_TAIL)
#undef ATT_PV_TAIL
    }

    if (qn_done < nqn) {
        prefetch_rows(next->q0 + (size_t)qn_done * ldq, ldq, nqn - qn_done, Dh, 0, 0);
        prefetch_rows(next->o0 + (size_t)qn_done * ldo, ldo, nqn - qn_done, Dh, 0, 1);
    }

    /* o = O / l, transposed back; lse = m + log l. */
    for (int u = 0; u < NV; ++u) {
        _mm512_store_ps(mb + 16 * u, m[u]);
        _mm512_store_ps(lb + 16 * u, l[u]);
    }
    if (lse)
        for (int i = 0; i < nq; ++i)
            lse[((size_t)b * H + h) * Nq + i_begin + i] = mb[i] + logf(lb[i]);
    float *o0 = o + ((size_t)b * Nq + i_begin) * ldo + hoff;
    store_o(NV, ot, lb, o0, ldo, nq, Dh);
}

__attribute__((target("avx512f"))) static void
attention_task512(const float *q, size_t ldq, const float *k, size_t ldk, const float *v,
                  size_t ldv, float *o, size_t ldo, float *lse, int b, int h, int i_begin,
                  int nq, int Nq, int Nk, int H, int Dh, float scale, int fetch_kv,
                  const att_next *next)
{
#define ATT_TASK(NV)                                                                               \
    task512(NV, q, ldq, k, ldk, v, ldv, o, ldo, lse, b, h, i_begin, nq, Nq, Nk, H, Dh, scale,     \
            fetch_kv, next)
    switch ((nq + 15) / 16) {
    case 1: ATT_TASK(1); break;
    case 2: ATT_TASK(2); break;
    case 3: ATT_TASK(3); break;
    default: ATT_TASK(4); break;
    }
#undef ATT_TASK
}

/* The tasks of the AVX-512 path, t = (b H + h) nqt + query block, cut into
 * one contiguous range per thread. A thread takes the tasks of its own range
 * from the front, then helps drain the other ranges through the same atomic
 * counters, so a thread slowed down by other work on the machine does not
 * hold up the call (as schedule(dynamic) would not). Its next task is then
 * known in advance (the next of its range, unless another thread took it),
 * and its queries and output rows, scattered over 64 rows of the
 * activations, are fetched while the current task computes: read in place
 * they cost 10-15% of the time at DiT-XL/2's shape. Each task computes
 * the same bits whichever thread runs it.
 *
 * K and V are fetched ahead (a tile ahead, and the next task's first tile)
 * only where they are not in this thread's L2 already: for a new head, or
 * when a head's K and V fill more than 3/4 of the L2 (sysconf; 256 KiB if
 * unknown); the query blocks of a head follow each other in a range, so
 * below that the second to last of them find K and V in L2, and the
 * prefetches (5% of the time at 256 tokens) would only repeat what is
 * there. */
static void attention_run512(const float *q, size_t ldq, const float *k, size_t ldk,
                             const float *v, size_t ldv, float *o, size_t ldo, float *lse, int B,
                             int Nq, int Nk, int H, int Dh, float scale, long ntasks)
{
    enum { ATT_MAX_PARTS = 64 };
    struct {
        _Alignas(64) long next; /* the range's next unclaimed task */
    } part[ATT_MAX_PARTS];
    (void)B;
    const int nqt = (Nq + ATT_BQ - 1) / ATT_BQ;
    long l2 = 0; /* bytes, 0 if unknown */
#ifdef _SC_LEVEL2_CACHE_SIZE
    l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
#endif
    const double kv_resident = l2 > 0 ? 0.75 * (double)l2 : 256.0 * 1024;
    const int kv_big = 2.0 * Nk * Dh * sizeof(float) > kv_resident;
    int nparts = omp_get_max_threads();
    nparts = nparts < 1 ? 1 : nparts > ATT_MAX_PARTS ? ATT_MAX_PARTS : nparts;
    for (int p = 0; p < nparts; ++p)
        part[p].next = ntasks * p / nparts;

#pragma omp parallel
    {
        const int me = omp_get_thread_num() % nparts;
        long last_bh = -1; /* the (b, h) of this thread's previous task */
        for (int s = 0; s < nparts; ++s) {
            const int p = (me + s) % nparts;
            const long end = ntasks * (p + 1) / nparts;
            for (;;) {
                const long t = __atomic_fetch_add(&part[p].next, 1, __ATOMIC_RELAXED);
                if (t >= end)
                    break;
                const int qb = (int)(t % nqt), h = (int)(t / nqt % H), b = (int)(t / nqt / H);
                const int i_begin = qb * ATT_BQ;
                const int nq = Nq - i_begin < ATT_BQ ? Nq - i_begin : ATT_BQ;
                const long bh = t / nqt;
                att_next next = {NULL, NULL, NULL, NULL, 0, 0};
                if (s == 0 && t + 1 < end) {
                    const long tn = t + 1;
                    const int qn = (int)(tn % nqt), hn = (int)(tn / nqt % H);
                    const int bn = (int)(tn / nqt / H), in = qn * ATT_BQ;
                    const size_t rown = (size_t)bn * Nq + in, hoffn = (size_t)hn * Dh;
                    next.q0 = q + rown * ldq + hoffn;
                    next.o0 = o + rown * ldo + hoffn;
                    next.k0 = k + (size_t)bn * Nk * ldk + hoffn;
                    next.v0 = v + (size_t)bn * Nk * ldv + hoffn;
                    next.nq = Nq - in < ATT_BQ ? Nq - in : ATT_BQ;
                    next.fetch_kv = kv_big || tn / nqt != bh;
                }
                attention_task512(q, ldq, k, ldk, v, ldv, o, ldo, lse, b, h, i_begin, nq, Nq,
                                  Nk, H, Dh, scale, kv_big || bh != last_bh, &next);
                last_bh = bh;
            }
        }
    }
}

#endif /* ATT_X86 */


/* The AVX-512 path where the CPU has it, unless DITD_CPU_ATTN_ISA=portable
 * (for tests and comparisons). */
static int use_avx512(void)
{
#if ATT_X86
    const char *isa = getenv("DITD_CPU_ATTN_ISA");
    if (isa && !strcmp(isa, "portable"))
        return 0;
    return __builtin_cpu_supports("avx512f");
#else
    return 0;
#endif
}

void ditd_cpu_attention(const float *q, size_t ldq, const float *k, size_t ldk,
                        const float *v, size_t ldv, float *o, size_t ldo, float *lse,
                        int B, int Nq, int Nk, int H, int Dh, float scale)
{
    assert(q && k && v && o);
    assert(B >= 0 && Nq >= 0 && Nk >= 0 && H > 0);
    assert(Dh > 0 && Dh <= DITD_CPU_ATTN_MAX_DH);
    const size_t row = (size_t)H * (size_t)Dh;
    assert(ldq >= row && ldk >= row && ldv >= row && ldo >= row);
    assert(isfinite(scale));

    if (Nk == 0) {
        /* Attention over no keys: the empty result that merges as a no-op. */
        for (int b = 0; b < B; ++b)
            for (int i = 0; i < Nq; ++i) {
                memset(o + ((size_t)b * Nq + i) * ldo, 0, sizeof(float) * row);
                for (int h = 0; h < H; ++h)
                    if (lse)
                        lse[((size_t)b * H + h) * Nq + i] = -INFINITY;
            }
        return;
    }

    const int nqt = (Nq + ATT_BQ - 1) / ATT_BQ;
    const long ntasks = (long)B * H * nqt;
#if ATT_X86
    if (use_avx512()) {
        attention_run512(q, ldq, k, ldk, v, ldv, o, ldo, lse, B, Nq, Nk, H, Dh, scale, ntasks);
        return;
    }
#endif
#pragma omp parallel for schedule(dynamic, 1)
    for (long t = 0; t < ntasks; ++t) {
        const int qt = (int)(t % nqt);
        const int h = (int)(t / nqt % H);
        const int b = (int)(t / nqt / H);
        const int i_begin = qt * ATT_BQ;
        const int nq = Nq - i_begin < ATT_BQ ? Nq - i_begin : ATT_BQ;
        attention_task(q, ldq, k, ldk, v, ldv, o, ldo, lse, b, h, i_begin, nq, Nq, Nk,
                       H, Dh, scale);
    }
}

void ditd_cpu_attention_merge(float *o_acc, size_t ldo_acc, float *lse_acc,
                              const float *o_blk, size_t ldo_blk, const float *lse_blk,
                              int B, int Nq, int H, int Dh)
{
    assert(o_acc && lse_acc && o_blk && lse_blk);
    assert(B >= 0 && Nq >= 0 && H > 0 && Dh > 0);
    assert(ldo_acc >= (size_t)H * Dh && ldo_blk >= (size_t)H * Dh);

    const long rows = (long)B * Nq;
#pragma omp parallel for schedule(static) if (rows * H * Dh > 16384)
    for (long r = 0; r < rows; ++r) {
        const long b = r / Nq, i = r % Nq;
        for (int h = 0; h < H; ++h) {
            float *la = lse_acc + ((size_t)b * H + h) * Nq + i;
            const float lb = lse_blk[((size_t)b * H + h) * Nq + i];
            const float mx = *la > lb ? *la : lb;
            if (mx == -INFINITY)
                continue; /* both empty */
            const float wa = expf(*la - mx), wb = expf(lb - mx); /* one of them is 1 */
            const float inv = 1.0f / (wa + wb);
            float *oa = o_acc + (size_t)r * ldo_acc + (size_t)h * Dh;
            const float *ob = o_blk + (size_t)r * ldo_blk + (size_t)h * Dh;
            const float ca = wa * inv, cb = wb * inv;
            for (int d = 0; d < Dh; ++d)
                oa[d] = ca * oa[d] + cb * ob[d];
            *la = mx + logf(wa + wb);
        }
    }
}
