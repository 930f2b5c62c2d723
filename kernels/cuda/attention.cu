/* Flash attention forward for DiT shapes, and the log-sum-exp merge of
 * partial results (ring attention).
 *
 * The forward is FlashAttention-2's loop (Dao, 2023) on mma.sync
 * m16n8k16 bf16 tensor-core instructions: a block of 4 warps takes 64 query
 * rows of one (batch, head), each warp 16 rows; K/V go through shared memory
 * 64 keys at a time; S = Q K^T stays in registers, the running max and sum
 * are fp32, P is rounded to bf16 and fed straight back as the A operand of
 * P V (the accumulator layout of m16n8 is the A layout of m16k16, two n-tiles
 * a k-step). The head dimension is padded with zeros to 32, 64, 80 or 128
 * (DiT's 72 -> 80), so any Dh <= 128 and any Nq, Nk work; Q/K/V rows are
 * strided (views into a fused QKV buffer). The LSE (B, H, Nq) is written in
 * fp32, natural log, for ditd_cuda_attention_merge.
 *
 * Fragment layouts (PTX ISA, "Matrix fragments for mma.m16n8k16"), lane =
 * 4 g + t:
 *   A (16x16, row): a0 = (g, 2t..2t+1), a1 = (g+8, 2t..), a2 = (g, 2t+8..),
 *                   a3 = (g+8, 2t+8..)           [row, k], two bf16 a register
 *   B (16x8, col):  b0 = (k 2t..2t+1, n g), b1 = (k 2t+8.., n g)
 *   C (16x8, f32):  c0,c1 = (g, 2t..2t+1), c2,c3 = (g+8, 2t..2t+1)
 * Shared memory holds K as [key][d] and V transposed, [d][key], so that
 * every fragment is one 32-bit load; rows are padded by 16 bytes, which
 * makes the 8 rows x 4 words a fragment load touches fall in 32 banks.
 *
 * Not done yet (performance, not correctness): cp.async double buffering of
 * K/V, wgmma (sm_90a). See docs/cuda.md. */
#include <math.h>

#include "kernels/cuda/common.cuh"

#define ATT_BM 64      /* query rows per block */
#define ATT_BN 64      /* keys per tile */
#define ATT_WARPS 4
#define ATT_THREADS (ATT_WARPS * 32)
#define ATT_PAD 8      /* bf16 elements of padding per shared row */

static __device__ __forceinline__ void mma_bf16(float c[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                                uint32_t a3, uint32_t b0, uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

static __device__ __forceinline__ uint32_t pack_bf16(float lo, float hi)
{
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *(uint32_t *)&v;
}

static __device__ __forceinline__ uint32_t lds32(const bf16 *p)
{
    return *(const uint32_t *)p;
}

/* Copies rows [r0, r0 + R) of a (rows, Dh) strided matrix into a shared tile
 * [R][DP + PAD], zero outside (rows >= nrows, columns >= Dh). transpose:
 * the tile is [DP][R + PAD] instead. vec: Dh, ld and the base are multiples
 * of 8 elements (16 bytes), so whole 16-byte chunks move. */
template <int DP, int R, bool TRANSPOSE>
static __device__ __forceinline__ void load_tile(bf16 *sm, const bf16 *g, size_t ld, int r0,
                                                 int nrows, int Dh, bool vec)
{
    const bf16 zero = __float2bfloat16_rn(0.0f);
    if (vec) {
        constexpr int CH = DP / 8; /* 16-byte chunks per row */
        for (int i = threadIdx.x; i < R * CH; i += ATT_THREADS) {
            const int r = i / CH, c = (i % CH) * 8;
            uint4 v = make_uint4(0, 0, 0, 0);
            if (r0 + r < nrows && c < Dh)
                v = *(const uint4 *)(g + (size_t)(r0 + r) * ld + c);
            if (!TRANSPOSE) {
                *(uint4 *)(sm + r * (DP + ATT_PAD) + c) = v;
            } else {
                const bf16 *e = (const bf16 *)&v;
#pragma unroll
                for (int k = 0; k < 8; k++)
                    sm[(c + k) * (R + ATT_PAD) + r] = e[k];
            }
        }
    } else {
        for (int i = threadIdx.x; i < R * DP; i += ATT_THREADS) {
            const int r = i / DP, c = i % DP;
            bf16 v = zero;
            if (r0 + r < nrows && c < Dh)
                v = g[(size_t)(r0 + r) * ld + c];
            if (!TRANSPOSE)
                sm[r * (DP + ATT_PAD) + c] = v;
            else
                sm[c * (R + ATT_PAD) + r] = v;
        }
    }
}

template <int DP>
static __global__ void __launch_bounds__(ATT_THREADS)
flash_fwd_kernel(const bf16 *q, size_t ldq, const bf16 *k, size_t ldk, const bf16 *v, size_t ldv,
                 bf16 *o, size_t ldo, float *lse, int Nq, int Nk, int H, int Dh, float scale_log2,
                 bool vec)
{
    /* K tile [BN][DP+PAD] (the Q tile uses it first), V^T tile [DP][BN+PAD] */
    __shared__ __align__(16) bf16 ks[ATT_BN * (DP + ATT_PAD)];
    __shared__ __align__(16) bf16 vt[DP * (ATT_BN + ATT_PAD)];
    static_assert(ATT_BM == ATT_BN, "the Q tile lives in the K tile's memory");

    const int m0 = blockIdx.x * ATT_BM, h = blockIdx.y, b = blockIdx.z;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const bf16 *qb = q + (size_t)b * Nq * ldq + (size_t)h * Dh;
    const bf16 *kb = k + (size_t)b * Nk * ldk + (size_t)h * Dh;
    const bf16 *vb = v + (size_t)b * Nk * ldv + (size_t)h * Dh;
    constexpr int KS = DP / 16; /* k-steps over the head dimension */
    constexpr int DN = DP / 8;  /* n-tiles of the output */
    constexpr int SN = ATT_BN / 8; /* n-tiles of S */
    constexpr int QS = DP + ATT_PAD, VS = ATT_BN + ATT_PAD;

    /* Q fragments, once: rows r0 = warp*16 + g and r0 + 8 */
    load_tile<DP, ATT_BM, false>(ks, qb, ldq, m0, Nq, Dh, vec);
    __syncthreads();
    uint32_t qf[KS][4];
    {
        const bf16 *r0 = ks + (warp * 16 + g) * QS, *r1 = r0 + 8 * QS;
#pragma unroll
        for (int kk = 0; kk < KS; kk++) {
            qf[kk][0] = lds32(r0 + 16 * kk + 2 * t);
            qf[kk][1] = lds32(r1 + 16 * kk + 2 * t);
            qf[kk][2] = lds32(r0 + 16 * kk + 8 + 2 * t);
            qf[kk][3] = lds32(r1 + 16 * kk + 8 + 2 * t);
        }
    }

    float acc[DN][4];
#pragma unroll
    for (int dn = 0; dn < DN; dn++)
        acc[dn][0] = acc[dn][1] = acc[dn][2] = acc[dn][3] = 0.0f;
    float mx[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}; /* rows g, g+8 (log2 units) */

    for (int n0 = 0; n0 < Nk; n0 += ATT_BN) {
        __syncthreads(); /* everyone is done with the previous tile (and the Q tile) */
        load_tile<DP, ATT_BN, false>(ks, kb, ldk, n0, Nk, Dh, vec);
        load_tile<DP, ATT_BN, true>(vt, vb, ldv, n0, Nk, Dh, vec);
        __syncthreads();

        /* S (16 x 64) = Q K^T for this warp's rows */
        float s[SN][4];
#pragma unroll
        for (int j = 0; j < SN; j++) {
            s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
            const bf16 *kr = ks + (8 * j + g) * QS;
#pragma unroll
            for (int kk = 0; kk < KS; kk++)
                mma_bf16(s[j], qf[kk][0], qf[kk][1], qf[kk][2], qf[kk][3],
                         lds32(kr + 16 * kk + 2 * t), lds32(kr + 16 * kk + 8 + 2 * t));
        }

        /* scale into log2 units, mask keys past Nk, the new running max */
        float tmax[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int j = 0; j < SN; j++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int key = n0 + 8 * j + 2 * t + (e & 1);
                s[j][e] = key < Nk ? s[j][e] * scale_log2 : -INFINITY;
                tmax[e >> 1] = fmaxf(tmax[e >> 1], s[j][e]);
            }
        }
        float alpha[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            tmax[r] = fmaxf(tmax[r], __shfl_xor_sync(0xffffffffu, tmax[r], 1));
            tmax[r] = fmaxf(tmax[r], __shfl_xor_sync(0xffffffffu, tmax[r], 2));
            const float mnew = fmaxf(mx[r], tmax[r]); /* finite: a tile has a key < Nk */
            alpha[r] = exp2f(mx[r] - mnew);           /* 0 on the first tile */
            mx[r] = mnew;
            l[r] *= alpha[r];
        }
#pragma unroll
        for (int dn = 0; dn < DN; dn++) {
            acc[dn][0] *= alpha[0];
            acc[dn][1] *= alpha[0];
            acc[dn][2] *= alpha[1];
            acc[dn][3] *= alpha[1];
        }
        /* P = 2^(S - max), fp32 sums; then P (bf16) V */
#pragma unroll
        for (int j = 0; j < SN; j++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                s[j][e] = exp2f(s[j][e] - mx[e >> 1]);
                l[e >> 1] += s[j][e];
            }
        }
#pragma unroll
        for (int kk = 0; kk < ATT_BN / 16; kk++) {
            const uint32_t a0 = pack_bf16(s[2 * kk][0], s[2 * kk][1]);
            const uint32_t a1 = pack_bf16(s[2 * kk][2], s[2 * kk][3]);
            const uint32_t a2 = pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]);
            const uint32_t a3 = pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
            for (int dn = 0; dn < DN; dn++) {
                const bf16 *vr = vt + (8 * dn + g) * VS + 16 * kk;
                mma_bf16(acc[dn], a0, a1, a2, a3, lds32(vr + 2 * t), lds32(vr + 8 + 2 * t));
            }
        }
    }

    /* normalize and store; the quad holds the row's partial sums */
#pragma unroll
    for (int r = 0; r < 2; r++) {
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int row = m0 + warp * 16 + g + 8 * r;
        if (row >= Nq)
            continue;
        const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f; /* Nk == 0: o = 0 */
        bf16 *orow = o + ((size_t)b * Nq + row) * ldo + (size_t)h * Dh;
#pragma unroll
        for (int dn = 0; dn < DN; dn++) {
            const int c = 8 * dn + 2 * t;
            if (c < Dh)
                st_bf16(orow + c, acc[dn][2 * r] * inv);
            if (c + 1 < Dh)
                st_bf16(orow + c + 1, acc[dn][2 * r + 1] * inv);
        }
        if (lse && t == 0)
            lse[((size_t)b * H + h) * Nq + row] =
                l[r] > 0.0f ? (mx[r] + log2f(l[r])) * 0.6931471805599453f : -INFINITY;
    }
}

template <int DP>
static int launch_flash(const bf16 *q, size_t ldq, const bf16 *k, size_t ldk, const bf16 *v,
                        size_t ldv, bf16 *o, size_t ldo, float *lse, int B, int Nq, int Nk, int H,
                        int Dh, float scale, bool vec, cudaStream_t s)
{
    dim3 grid((unsigned)((Nq + ATT_BM - 1) / ATT_BM), (unsigned)H, (unsigned)B);
    flash_fwd_kernel<DP><<<grid, ATT_THREADS, 0, s>>>(q, ldq, k, ldk, v, ldv, o, ldo, lse, Nq, Nk,
                                                      H, Dh, scale * 1.4426950408889634f, vec);
    return launch_check();
}

static bool aligned16(const void *p)
{
    return ((uintptr_t)p & 15u) == 0;
}

extern "C" int ditd_cuda_attention(const void *q, size_t ldq, const void *k, size_t ldk,
                                   const void *v, size_t ldv, void *o, size_t ldo, float *lse,
                                   int B, int Nq, int Nk, int H, int Dh, float scale,
                                   ditd_cuda_stream s)
{
    if (!q || !k || !v || !o || B < 0 || Nq < 0 || Nk < 0 || H <= 0 || Dh <= 0 ||
        Dh > DITD_CUDA_ATTN_MAX_DH || B > 65535 || H > 65535)
        return DITD_CUDA_EINVAL;
    const size_t hd = (size_t)H * Dh;
    if (ldq < hd || ldk < hd || ldv < hd || ldo < hd)
        return DITD_CUDA_EINVAL;
    if (B == 0 || Nq == 0)
        return 0;
    const bool vec = Dh % 8 == 0 && ldq % 8 == 0 && ldk % 8 == 0 && ldv % 8 == 0 &&
                     aligned16(q) && aligned16(k) && aligned16(v);
    const bf16 *Q = (const bf16 *)q, *K = (const bf16 *)k, *V = (const bf16 *)v;
    bf16 *O = (bf16 *)o;
    cudaStream_t st = (cudaStream_t)s;
    if (Dh <= 32)
        return launch_flash<32>(Q, ldq, K, ldk, V, ldv, O, ldo, lse, B, Nq, Nk, H, Dh, scale, vec, st);
    if (Dh <= 64)
        return launch_flash<64>(Q, ldq, K, ldk, V, ldv, O, ldo, lse, B, Nq, Nk, H, Dh, scale, vec, st);
    if (Dh <= 80)
        return launch_flash<80>(Q, ldq, K, ldk, V, ldv, O, ldo, lse, B, Nq, Nk, H, Dh, scale, vec, st);
    return launch_flash<128>(Q, ldq, K, ldk, V, ldv, O, ldo, lse, B, Nq, Nk, H, Dh, scale, vec, st);
}

/* ---- merge: one warp per (b, n, h) row ---- */

static __global__ void attention_merge_kernel(bf16 *o_acc, size_t ldo_acc, float *lse_acc,
                                              const bf16 *o_blk, size_t ldo_blk,
                                              const float *lse_blk, int B, int Nq, int H, int Dh)
{
    const int lane = threadIdx.x & 31;
    const size_t wid = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) >> 5;
    const size_t rows = (size_t)B * Nq * H;
    if (wid >= rows)
        return;
    const int h = (int)(wid % (size_t)H);
    const size_t r = wid / (size_t)H; /* b * Nq + i */
    const size_t b = r / (size_t)Nq, i = r % (size_t)Nq;
    float *la = lse_acc + (b * H + h) * Nq + i;
    const float a = *la, lb = lse_blk[(b * H + h) * Nq + i];
    __syncwarp();
    const float mx = fmaxf(a, lb);
    if (mx == -INFINITY)
        return; /* both empty */
    const float wa = expf(a - mx), wb = expf(lb - mx), inv = 1.0f / (wa + wb);
    const float ca = wa * inv, cb = wb * inv;
    bf16 *oa = o_acc + r * ldo_acc + (size_t)h * Dh;
    const bf16 *ob = o_blk + r * ldo_blk + (size_t)h * Dh;
    for (int d = lane; d < Dh; d += 32)
        st_bf16(oa + d, ca * ld_bf16(oa + d) + cb * ld_bf16(ob + d));
    if (lane == 0)
        *la = mx + logf(wa + wb);
}

extern "C" int ditd_cuda_attention_merge(void *o_acc, size_t ldo_acc, float *lse_acc,
                                         const void *o_blk, size_t ldo_blk, const float *lse_blk,
                                         int B, int Nq, int H, int Dh, ditd_cuda_stream s)
{
    if (!o_acc || !lse_acc || !o_blk || !lse_blk || B < 0 || Nq < 0 || H <= 0 || Dh <= 0 ||
        ldo_acc < (size_t)H * Dh || ldo_blk < (size_t)H * Dh)
        return DITD_CUDA_EINVAL;
    size_t rows = (size_t)B * Nq * H;
    if (rows == 0)
        return 0;
    const int threads = 256;
    size_t blocks = (rows * 32 + threads - 1) / threads;
    attention_merge_kernel<<<(unsigned)blocks, threads, 0, (cudaStream_t)s>>>(
        (bf16 *)o_acc, ldo_acc, lse_acc, (const bf16 *)o_blk, ldo_blk, lse_blk, B, Nq, H, Dh);
    return launch_check();
}
