/* Scaled dot-product attention on the CPU, flash-style, with log-sum-exp.
 *
 * What this is: exact fp32 attention (no masking, no dropout) over
 * (B, N, H, Dh) strided activations, tiled so that a block of queries meets
 * every block of keys once with a running max and sum (online softmax), and
 * the (Nq, Nk) score matrix never exists. It also returns the log-sum-exp so
 * that partial results over disjoint key sets merge exactly (ring attention).
 * What it is not: a GEMM library. The two products per tile (S = Q K^T and
 * O += P V) go through one small register-blocked loop nest (block_8x32)
 * written so that the compiler vectorizes it; BLAS is not callable here
 * since the tiles run inside an OpenMP region.
 *
 * Work split: one OpenMP task per (batch, head, query block); each task owns
 * its tiles on its own stack and reads K/V of its head, so tasks share
 * nothing but the read-only inputs.
 */
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/cpu_math.h"

#include <assert.h>
#include <math.h>
#include <omp.h>
#include <string.h>

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
