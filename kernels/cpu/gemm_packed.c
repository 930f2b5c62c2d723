/* ditd's own GEMM for linear layers on AVX-512 CPUs, on weights re-laid
 * once, at load, into the order its micro-kernel reads them.
 *
 *   y (M, N) = act(x (M, K) @ w^T + b),  w packed from nn.Linear's (N, K).
 *
 * Why our own: a library GEMM (oneDNN, OpenBLAS) is handed w in nn.Linear's
 * layout on every call and copies it into its own panel order each time;
 * at DiT-XL/2's shapes (M = 512 tokens) oneDNN's f32 matmul runs at 84-85%
 * of the FMA peak, 82-85% inside a forward. Packing the weights once and
 * keeping each 64-column panel in L2 while every 6-row block of x streams
 * past it reaches 92-94% alone and 88-91% inside the forward (docs/cpu.md
 * has the tables).
 *
 * The packed layout has exactly the bytes of the original, so packing is in
 * place and a model's memory does not grow:
 *   - f32: the N columns of w^T are cut into panels of PK_NR = 64 (the last
 *     one narrower, nw = N mod 64); panel p starts at element p * 64 * K and
 *     holds its nw columns row by row over k: element (k, j) at k * nw + j.
 *   - bf16: the same panels, each holding pairs of k (what one AVX512-BF16
 *     dot product takes): element (k, j) for k < K & ~1 at
 *     (k / 2) * 2 nw + 2 j + (k & 1); an odd K's last k after them, at
 *     (K - 1) nw + j.
 *
 * The micro-kernel holds a 6 x 64 block of y in 24 zmm registers and, per k,
 * loads 4 vectors of the panel and broadcasts 6 values of x: 24 FMAs (f32) or
 * 24 bf16 dot products of two k (bf16, x rounded to bf16 first, fp32 sums).
 * The bias and the activation are applied to the block right after its
 * store, while it is in L1 (the epilogue). Work is split over OpenMP threads
 * by (panel, row range) items, one contiguous range per thread walked panel
 * by panel (each panel read from memory once), and a thread done with its
 * range helps drain the others' (run, below).
 *
 * Quantized weights (GGML blocks, ditd__cpu_gemm_packed_q_run) are not
 * packed at load: each work item dequantizes its panel's rows, one k pass
 * at a time, into a per-thread buffer laid out exactly as a packed panel
 * (f32, or bf16 pairs rounded from the f32 value), and the same
 * micro-kernels read it. So the product equals, bit for bit, the packed
 * GEMM on the dequantized (and, for bf16, rounded) weights.
 *
 * What it is not: a GEMM for arbitrary layouts, or for CPUs without
 * AVX-512F (there gemm.c's library path runs and nothing is packed; bf16
 * also needs AVX512-BF16). Whether packing is on is decided once per
 * process (gemm.c, ditd_cpu_gemm_packs).
 */
#include "kernels/cpu/gemm_packed.h"
#include "kernels/cpu/cpu_math_avx512.h"
#include "kernels/cpu/dequant.h"

#include <assert.h>
#include <immintrin.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

enum {
    PK_MR = 6,           /* rows of x per micro-kernel call */
    PK_NV = 4,           /* 16-float vectors per panel row */
    PK_NR = 16 * PK_NV,  /* columns per panel */
    PK_KC_F32 = 2048,    /* k per pass, f32: a panel block of 512 KiB stays in L2 */
    PK_KC_BF16 = 4096,   /* the same bytes in bf16 */
};

#define PK_TARGET_F32 __attribute__((target("avx512f,avx512bw,avx512vl")))
#define PK_TARGET_BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
#define PK_INLINE static inline __attribute__((always_inline))

/* ---- packing (plain C: once per weight, at load) ---- */

static size_t panel_width(int N, int p)
{
    int rest = N - p * PK_NR;
    return (size_t)(rest < PK_NR ? rest : PK_NR);
}

/* Transposes in tiles of 64 k (PK_KB) x the panel's columns, which fit in
 * L1 on both sides: a plain column walk would touch a new line of the
 * destination on every element (~1 GB/s; tiled, several times that). */
enum { PK_KB = 64 };

static void pack_f32(float *w, const float *src, int N, int K)
{
    const int P = (N + PK_NR - 1) / PK_NR;
#pragma omp parallel for schedule(static) if ((size_t)N * (size_t)K > 65536)
    for (int p = 0; p < P; p++) {
        size_t nw = panel_width(N, p);
        float *d = w + (size_t)p * PK_NR * (size_t)K;
        for (int k0 = 0; k0 < K; k0 += PK_KB) {
            int k1 = K - k0 > PK_KB ? k0 + PK_KB : K;
            for (size_t j = 0; j < nw; j++) {
                const float *r = src + ((size_t)p * PK_NR + j) * (size_t)K;
                for (int k = k0; k < k1; k++)
                    d[(size_t)k * nw + j] = r[k];
            }
        }
    }
}

static void pack_bf16(uint16_t *w, const uint16_t *src, int N, int K)
{
    const int P = (N + PK_NR - 1) / PK_NR, K2 = K & ~1;
#pragma omp parallel for schedule(static) if ((size_t)N * (size_t)K > 65536)
    for (int p = 0; p < P; p++) {
        size_t nw = panel_width(N, p);
        uint16_t *d = w + (size_t)p * PK_NR * (size_t)K;
        for (int k0 = 0; k0 < K2; k0 += PK_KB) { /* PK_KB is even */
            int k1 = K2 - k0 > PK_KB ? k0 + PK_KB : K2;
            for (size_t j = 0; j < nw; j++) {
                const uint16_t *r = src + ((size_t)p * PK_NR + j) * (size_t)K;
                for (int k = k0; k < k1; k++)
                    d[(size_t)(k / 2) * 2 * nw + 2 * j + (size_t)(k & 1)] = r[k];
            }
        }
        if (K2 < K)
            for (size_t j = 0; j < nw; j++)
                d[(size_t)K2 * nw + j] = src[((size_t)p * PK_NR + j) * (size_t)K + (size_t)K2];
    }
}

int ditd__cpu_pack_in_place(void *w, int w_bf16, int N, int K)
{
    assert(w && N > 0 && K > 0);
    size_t n = (size_t)N * (size_t)K, es = w_bf16 ? 2 : 4;
    void *src = malloc(n * es);
    if (!src)
        return -1;
    memcpy(src, w, n * es);
    if (w_bf16)
        pack_bf16(w, src, N, K);
    else
        pack_f32(w, src, N, K);
    free(src);
    return 0;
}

/* ---- the activations, 16 lanes at a time (exp: cpu_math_avx512.h) ---- */

/* x sigmoid(z) = x / (1 + exp(-z)) */
PK_INLINE PK_TARGET_F32 __m512 times_sigmoid16(__m512 x, __m512 z)
{
    __m512 e = ditd__exp16(_mm512_sub_ps(_mm512_setzero_ps(), z));
    return _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
}

/* GELU(tanh) as x sigmoid(2 u), u = sqrt(2/pi) (x + 0.044715 x^3); SiLU as
 * x sigmoid(x): linear.c's formulas. */
PK_INLINE PK_TARGET_F32 __m512 act16(__m512 x, ditd_cpu_act act)
{
    if (act == DITD_CPU_ACT_GELU_TANH) {
        __m512 x3 = _mm512_mul_ps(_mm512_mul_ps(x, x), x);
        __m512 u = _mm512_mul_ps(_mm512_set1_ps(0.7978845608028654f),
                                 _mm512_fmadd_ps(_mm512_set1_ps(0.044715f), x3, x));
        return times_sigmoid16(x, _mm512_add_ps(u, u));
    }
    if (act == DITD_CPU_ACT_SILU)
        return times_sigmoid16(x, x);
    return x;
}

/* ---- the micro-kernels ----
 *
 * One block: rows [0, mr) of x (a, row stride lda) times k in [k0, k1) of
 * one panel (b: the panel's start, nw columns, nv = ceil(nw / 16) vectors,
 * the last one masked by `last`), into c (row stride ldc). acc: add to c
 * (a later k pass); fin: the last pass, where the bias (f32 or bf16, NULL
 * for none) and act are applied. mr and nv are constants at every call
 * (the dispatch below), so the loops unroll into registers. */

PK_INLINE PK_TARGET_F32 __m512 bias16(const void *bias, int bias_bf16, size_t j, __mmask16 m)
{
    if (!bias)
        return _mm512_setzero_ps();
    if (bias_bf16) {
        __m256i h = _mm256_maskz_loadu_epi16(m, (const uint16_t *)bias + j);
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
    return _mm512_maskz_loadu_ps(m, (const float *)bias + j);
}

/* The bias and the activation over a stored block (mr rows of nw floats,
 * in L1 as it was just written): out of line, run once per block on its
 * last k pass. */
static PK_TARGET_F32 void epilogue(float *c, size_t ldc, int mr, size_t nw, const void *bias,
                                   int bias_bf16, ditd_cpu_act act)
{
    for (size_t j = 0; j < nw; j += 16) {
        __mmask16 m = nw - j >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (nw - j)) - 1);
        __m512 bv = bias16(bias, bias_bf16, j, m);
        for (int i = 0; i < mr; i++) {
            float *ci = c + (size_t)i * ldc + j;
            __m512 t = _mm512_add_ps(_mm512_maskz_loadu_ps(m, ci), bv);
            _mm512_mask_storeu_ps(ci, m, act16(t, act));
        }
    }
}

/* The block's store: r (+ c on a later k pass), then on the last pass the
 * epilogue. Written out in each kernel as a macro whose loops are small
 * enough for GCC to unroll early, so that r is only ever indexed by
 * constants and lives in registers (indexed by a loop that stays a loop,
 * r is kept in memory and every k stores the 24 accumulators to the
 * stack). */
#define PK_STORE_BLOCK(MR, NV, bias_bf16) \
    for (int i = 0; i < MR; i++)                                                                   \
        for (int v = 0; v < NV; v++) {                                                             \
            __mmask16 m = v == NV - 1 ? last : (__mmask16)0xffff;                                 \
            float *ci = c + (size_t)i * ldc + (size_t)v * 16;                                      \
            __m512 t = r[i][v];                                                                    \
            if (acc)                                                                               \
                t = _mm512_add_ps(t, _mm512_maskz_loadu_ps(m, ci));                                \
            _mm512_mask_storeu_ps(ci, m, t);                                                       \
        }                                                                                          \
    if (fin && (bias || act != DITD_CPU_ACT_NONE))                                                 \
        epilogue(c, ldc, MR, nw, bias, bias_bf16, act);

/* The kernels' bodies, as macros over literal MR and NV. Written so that
 * GCC 12 keeps the accumulators r in registers (checked in the object
 * code): every index of r a literal after early unrolling, and the panel's
 * last vector loaded by its own statement, masked only in the instances
 * for a panel whose width is not a multiple of 16 (with a masked load in
 * the loop GCC stores all of r on every k: those rare tail panels run
 * slower, the full ones at full speed). In scope: last, a, lda, b, nw, k0,
 * k1, c, ldc, acc, fin, bias, act (and K for bf16). */
#define PK_F32_BODY(MR, NV, MASKED) \
    __m512 r[MR][NV];                                                                              \
    for (int i = 0; i < MR; i++)                                                                   \
        for (int v = 0; v < NV; v++)                                                               \
            r[i][v] = _mm512_setzero_ps();                                                         \
    const float *bk = b + (size_t)k0 * nw;                                                         \
    for (int k = k0; k < k1; k++, bk += nw) {                                                      \
        __m512 bv[NV];                                                                             \
        for (int v = 0; v < NV - 1; v++)                                                           \
            bv[v] = _mm512_loadu_ps(bk + 16 * v);                                                  \
        bv[NV - 1] = MASKED ? _mm512_maskz_loadu_ps(last, bk + 16 * (NV - 1))                      \
                            : _mm512_loadu_ps(bk + 16 * (NV - 1));                                 \
        for (int i = 0; i < MR; i++) {                                                             \
            __m512 av = _mm512_set1_ps(a[(size_t)i * lda + (size_t)k]);                            \
            for (int v = 0; v < NV; v++)                                                           \
                r[i][v] = _mm512_fmadd_ps(av, bv[v], r[i][v]);                                     \
        }                                                                                          \
    }                                                                                              \
    PK_STORE_BLOCK(MR, NV, 0)

/* bf16: a is x in bf16, dense rows of K; k0 even. Pairs of k by one
 * vdpbf16ps; an odd K's last k (k1 == K odd) as the pair (value, 0). */
#define PK_BF16_BODY(MR, NV, MASKED) \
    __m512 r[MR][NV];                                                                              \
    for (int i = 0; i < MR; i++)                                                                   \
        for (int v = 0; v < NV; v++)                                                               \
            r[i][v] = _mm512_setzero_ps();                                                         \
    const int k2 = k1 & ~1;                                                                        \
    const uint16_t *bk = b + (size_t)k0 * nw;                                                      \
    for (int k = k0; k < k2; k += 2, bk += 2 * nw) {                                               \
        __m512bh bv[NV];                                                                           \
        for (int v = 0; v < NV - 1; v++)                                                           \
            bv[v] = (__m512bh)_mm512_loadu_si512(bk + 32 * v);                                     \
        bv[NV - 1] = (__m512bh)(MASKED ? _mm512_maskz_loadu_epi32(last, bk + 32 * (NV - 1))       \
                                       : _mm512_loadu_si512(bk + 32 * (NV - 1)));                  \
        for (int i = 0; i < MR; i++) {                                                             \
            uint32_t pair;                                                                         \
            memcpy(&pair, a + (size_t)i * lda + (size_t)k, sizeof pair);                           \
            __m512bh av = (__m512bh)_mm512_set1_epi32((int)pair);                                  \
            for (int v = 0; v < NV; v++)                                                           \
                r[i][v] = _mm512_dpbf16_ps(r[i][v], av, bv[v]);                                   \
        }                                                                                          \
    }                                                                                              \
    if (k2 < k1) { /* odd K: its last k, stored unpaired after the pairs */                       \
        const uint16_t *bl = b + (size_t)(K - 1) * nw;                                             \
        __m512bh bv[NV];                                                                           \
        for (int v = 0; v < NV; v++)                                                               \
            bv[v] = (__m512bh)_mm512_cvtepu16_epi32(                                               \
                _mm256_maskz_loadu_epi16(v == NV - 1 ? last : (__mmask16)0xffff, bl + 16 * v));   \
        for (int i = 0; i < MR; i++) {                                                             \
            __m512bh av = (__m512bh)_mm512_set1_epi32((int)a[(size_t)i * lda + (size_t)k2]);       \
            for (int v = 0; v < NV; v++)                                                           \
                r[i][v] = _mm512_dpbf16_ps(r[i][v], av, bv[v]);                                   \
        }                                                                                          \
    }                                                                                              \
    PK_STORE_BLOCK(MR, NV, 1)

/* One instance per (mr, nv, masked). */
#define PK_CASES_NV(F, MR, MASKED)                                                                 \
    F(MR, 1, MASKED) F(MR, 2, MASKED) F(MR, 3, MASKED) F(MR, 4, MASKED)
#define PK_CASES_MR(F, MASKED)                                                                     \
    PK_CASES_NV(F, 1, MASKED) PK_CASES_NV(F, 2, MASKED) PK_CASES_NV(F, 3, MASKED)                 \
    PK_CASES_NV(F, 4, MASKED) PK_CASES_NV(F, 5, MASKED) PK_CASES_NV(F, 6, MASKED)
#define PK_CASES(F) PK_CASES_MR(F, 0) PK_CASES_MR(F, 1)

typedef struct pk_job {
    const void *a;       /* x: f32 rows of stride lda, or bf16 dense */
    size_t lda;
    const void *w;       /* packed; NULL for a quantized weight */
    const void *qw;      /* quantized: N rows of q_row_bytes, ggml type qtype */
    size_t q_row_bytes;
    int qtype;
    const float *qscale; /* the rows' scales (FP8), or NULL */
    void *const *scratch; /* quantized: per thread, one panel (PK_NR x K) + f32 rows */
    const void *bias;
    float *y;
    size_t ldy;
    int M, N, K, bf16;
    ditd_cpu_act act;
} pk_job;

#define PK_F32_FN(MR, NV, MASKED)                                                                  \
    static PK_TARGET_F32 void ukr_f32_##MR##_##NV##_##MASKED(                                      \
        const pk_job *j, __mmask16 last, int m0, const float *b, size_t nw, int k0, int k1,       \
        float *c, const void *bias)                                                                \
    {                                                                                              \
        const size_t lda = j->lda, ldc = j->ldy;                                                   \
        const float *a = (const float *)j->a + (size_t)m0 * lda;                                   \
        const int acc = k0 > 0, fin = k1 == j->K;                                                  \
        const ditd_cpu_act act = j->act;                                                           \
        PK_F32_BODY(MR, NV, MASKED)                                                                \
    }
#define PK_BF16_FN(MR, NV, MASKED)                                                                 \
    static PK_TARGET_BF16 void ukr_bf16_##MR##_##NV##_##MASKED(                                    \
        const pk_job *j, __mmask16 last, int m0, const uint16_t *b, size_t nw, int k0, int k1,    \
        float *c, const void *bias)                                                                \
    {                                                                                              \
        const int K = j->K;                                                                        \
        const size_t lda = (size_t)K, ldc = j->ldy;                                                \
        const uint16_t *a = (const uint16_t *)j->a + (size_t)m0 * lda;                            \
        const int acc = k0 > 0, fin = k1 == K;                                                     \
        const ditd_cpu_act act = j->act;                                                           \
        PK_BF16_BODY(MR, NV, MASKED)                                                               \
    }
PK_CASES(PK_F32_FN)
PK_CASES(PK_BF16_FN)

typedef void (*ukr_f32_fn)(const pk_job *, __mmask16, int, const float *, size_t, int, int,
                           float *, const void *);
typedef void (*ukr_bf16_fn)(const pk_job *, __mmask16, int, const uint16_t *, size_t, int, int,
                            float *, const void *);
#define PK_F32_ENTRY(MR, NV, MASKED) [MASKED][MR - 1][NV - 1] = ukr_f32_##MR##_##NV##_##MASKED,
#define PK_BF16_ENTRY(MR, NV, MASKED) [MASKED][MR - 1][NV - 1] = ukr_bf16_##MR##_##NV##_##MASKED,
static const ukr_f32_fn g_ukr_f32[2][PK_MR][PK_NV] = {PK_CASES(PK_F32_ENTRY)};
static const ukr_bf16_fn g_ukr_bf16[2][PK_MR][PK_NV] = {PK_CASES(PK_BF16_ENTRY)};

/* The weights a product reads come from memory once per forward (a DiT's
 * weights do not fit in any cache): while a k pass of a panel runs over its
 * row blocks, the block of weights the next pass will read (the panel's
 * next k range, else the next panel's first) is prefetched into L2, a slice
 * before each row block, so that the first row block of every pass does
 * not wait on DRAM. */
static void prefetch_slice(const char *p, size_t bytes, int slice, int slices)
{
    size_t lo = bytes * (size_t)slice / (size_t)slices;
    size_t hi = bytes * (size_t)(slice + 1) / (size_t)slices;
    for (size_t o = lo & ~(size_t)63; o < hi; o += 64)
        _mm_prefetch(p + o, _MM_HINT_T1);
}

/* f32 -> bf16, nearest even, as gemm.c's f32_to_bf16 (a NaN stays NaN). */
static inline uint16_t bf16_round(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    uint32_t q = (u >> 16) | 0x40u;
    return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? q : r);
}

/* A quantized weight's panel p, k in [k0, k1), into pan (the panel's
 * packed layout over the whole K; only these k are written): dequantized
 * to f32 rows by k (k * nw + j), or through tmp (kc x nw f32) into bf16
 * pairs ((k / 2) * 2 nw + 2 j + (k & 1); K is a multiple of the block, so
 * even, and k0 is even). */
static void dequant_panel(const pk_job *j, int p, size_t nw, int k0, int k1, void *pan, float *tmp)
{
    const int n0 = p * PK_NR;
    if (!j->bf16) {
        ditd_cpu_dequant_rows(j->qtype, j->qw, j->q_row_bytes, j->qscale, n0, (int)nw, k0, k1,
                              (float *)pan + (size_t)k0 * nw, nw, 1);
        return;
    }
    ditd_cpu_dequant_rows(j->qtype, j->qw, j->q_row_bytes, j->qscale, n0, (int)nw, k0, k1, tmp, nw, 1);
    uint16_t *d = (uint16_t *)pan + (size_t)k0 * nw;
    for (int k = 0; k < k1 - k0; k += 2) {
        const float *t0 = tmp + (size_t)k * nw, *t1 = t0 + nw;
        uint16_t *dk = d + (size_t)k * nw;
        for (size_t c = 0; c < nw; c++) {
            dk[2 * c] = bf16_round(t0[c]);
            dk[2 * c + 1] = bf16_round(t1[c]);
        }
    }
}

/* Rows [m0, m1) of panel p, every k pass. */
static void run_item(const pk_job *j, int p, int m0, int m1)
{
    const size_t nw = panel_width(j->N, p), es = j->bf16 ? 2 : 4;
    const int nv = (int)((nw + 15) / 16);
    const int masked = nw % 16 != 0;
    const __mmask16 last = (__mmask16)(masked ? (1u << (nw % 16)) - 1 : 0xffffu);
    const size_t off = (size_t)p * PK_NR * (size_t)j->K;
    const int P = (j->N + PK_NR - 1) / PK_NR;
    const int blocks = (m1 - m0 + PK_MR - 1) / PK_MR;
    float *yp = j->y + (size_t)p * PK_NR;
    const void *bias = !j->bias ? NULL
                       : j->bf16 ? (const void *)((const uint16_t *)j->bias + (size_t)p * PK_NR)
                                 : (const void *)((const float *)j->bias + (size_t)p * PK_NR);
    const int kc = j->bf16 ? PK_KC_BF16 : PK_KC_F32;
    /* a quantized weight: this thread's panel buffer, read as if packed */
    void *const qbuf = j->qw ? j->scratch[omp_get_thread_num()] : NULL;
    const char *const panel = qbuf ? (const char *)qbuf : (const char *)j->w + off * es;
    float *const qtmp = qbuf ? (float *)((char *)qbuf + (size_t)PK_NR * (size_t)j->K * es) : NULL;
    for (int k0 = 0; k0 < j->K; k0 += kc) {
        int k1 = j->K - k0 > kc ? k0 + kc : j->K;
        if (qbuf)
            dequant_panel(j, p, nw, k0, k1, qbuf, qtmp);
        /* the next pass's weights: [k1, k1 + kc) of this panel, or the
         * next panel's first kc rows (nothing after the last panel) */
        const char *next = NULL;
        size_t next_bytes = 0;
        if (qbuf) {
            /* nothing packed to prefetch: the quantized rows are read once */
        } else if (k1 < j->K) {
            int k2 = j->K - k1 > kc ? k1 + kc : j->K;
            next = (const char *)j->w + (off + (size_t)k1 * nw) * es;
            next_bytes = (size_t)(k2 - k1) * nw * es;
        } else if (p + 1 < P) {
            size_t nw1 = panel_width(j->N, p + 1);
            next = (const char *)j->w + (off + (size_t)PK_NR * (size_t)j->K) * es;
            next_bytes = (size_t)(j->K < kc ? j->K : kc) * nw1 * es;
        }
        int blk = 0;
        for (int m = m0; m < m1; m += PK_MR, blk++) {
            int mr = m1 - m < PK_MR ? m1 - m : PK_MR;
            float *c = yp + (size_t)m * j->ldy;
            if (next)
                prefetch_slice(next, next_bytes, blk, blocks);
            /* the next block's rows of y, for writing: in a forward they
             * are far from the core (the weights streamed through since
             * the buffer was last used), and the block's store of 24 lines
             * would otherwise wait on them */
            if (m + PK_MR < m1)
                for (int i = 0; i < PK_MR && m + PK_MR + i < m1; i++)
                    for (size_t o = 0; o < nw; o += 16)
                        __builtin_prefetch(c + (size_t)(PK_MR + i) * j->ldy + o, 1, 3);
            if (j->bf16)
                g_ukr_bf16[masked][mr - 1][nv - 1](j, last, m, (const uint16_t *)panel, nw, k0,
                                                   k1, c, bias);
            else
                g_ukr_f32[masked][mr - 1][nv - 1](j, last, m, (const float *)panel, nw, k0, k1,
                                                  c, bias);
        }
    }
}

/* Items: P panels times R row ranges (multiples of PK_MR rows), R chosen so
 * that every thread gets several items, cut into one contiguous range of
 * items per thread, panel-major. A thread takes the items of its own range
 * from the front, then helps drain the other ranges through the same atomic
 * counters (as attention.c's AVX-512 path does), so that a thread slowed
 * down by other work on the machine does not hold up the whole product; the
 * next-panel prefetch of run_item stays right as long as a range is walked
 * from its front. Which thread computes an item changes no bit of y. */
enum { PK_MAX_PARTS = 64 };

static void run(const pk_job *j)
{
    const int P = (j->N + PK_NR - 1) / PK_NR;
    const int blocks = (j->M + PK_MR - 1) / PK_MR;
    const int T = omp_get_max_threads();
    int R = 1;
    if (P < 4 * T)
        R = (4 * T + P - 1) / P;
    if (R > blocks)
        R = blocks;
    const long items = (long)P * R;
    const int par = (double)j->M * j->N * j->K > 2e5 && T > 1;
    struct {
        _Alignas(64) long next; /* the range's next unclaimed item */
    } part[PK_MAX_PARTS];
    int nparts = par ? T : 1;
    nparts = nparts > PK_MAX_PARTS ? PK_MAX_PARTS : nparts;
    for (int q = 0; q < nparts; q++)
        part[q].next = items * q / nparts;
#pragma omp parallel if (par)
    {
        const int me = omp_get_thread_num() % nparts;
        for (int s = 0; s < nparts; s++) {
            const int q = (me + s) % nparts;
            const long end = items * (q + 1) / nparts;
            for (;;) {
                const long it = __atomic_fetch_add(&part[q].next, 1, __ATOMIC_RELAXED);
                if (it >= end)
                    break;
                int p = (int)(it / R), r = (int)(it % R);
                int m0 = (int)((long)blocks * r / R) * PK_MR;
                int m1 = (int)((long)blocks * (r + 1) / R) * PK_MR;
                run_item(j, p, m0, m1 < j->M ? m1 : j->M);
            }
        }
    }
}

void ditd__cpu_gemm_packed_run(const void *x, size_t ldx, const void *wp, const void *b,
                              int w_bf16, float *y, size_t ldy, int M, int N, int K,
                              ditd_cpu_act act)
{
    pk_job j = {.a = x, .lda = ldx, .w = wp, .bias = b, .y = y, .ldy = ldy,
                .M = M, .N = N, .K = K, .bf16 = w_bf16, .act = act};
    run(&j);
}

/* Per thread: one panel over the whole K in the compute type, then (bf16)
 * kc x PK_NR floats of dequantized rows. Grown, never shrunk; the caller
 * serializes calls (gemm.c's lock). */
static void **g_qscratch;
static size_t g_qscratch_bytes;
static int g_qscratch_threads;

int ditd__cpu_gemm_packed_q_run(const void *x, size_t ldx, const void *qw, int qtype,
                                size_t row_bytes, const float *scale, const void *b, int bf16,
                                float *y, size_t ldy, int M, int N, int K, ditd_cpu_act act)
{
    const int T = omp_get_max_threads();
    const size_t es = bf16 ? 2 : 4;
    const size_t bytes = (size_t)PK_NR * (size_t)K * es +
                         (bf16 ? (size_t)PK_KC_BF16 * PK_NR * sizeof(float) : 0);
    if (T > g_qscratch_threads || bytes > g_qscratch_bytes) {
        for (int t = 0; t < g_qscratch_threads; t++)
            free(g_qscratch[t]);
        free(g_qscratch);
        g_qscratch_threads = 0;
        g_qscratch_bytes = 0;
        g_qscratch = calloc((size_t)T, sizeof *g_qscratch);
        if (!g_qscratch)
            return -1;
        for (int t = 0; t < T; t++)
            if (!(g_qscratch[t] = aligned_alloc(64, (bytes + 63) & ~(size_t)63))) {
                for (int u = 0; u < t; u++)
                    free(g_qscratch[u]);
                free(g_qscratch);
                g_qscratch = NULL;
                return -1;
            }
        g_qscratch_threads = T;
        g_qscratch_bytes = bytes;
    }
    pk_job j = {.a = x, .lda = ldx, .w = NULL, .qw = qw, .q_row_bytes = row_bytes,
                .qtype = qtype, .qscale = scale, .scratch = g_qscratch, .bias = b, .y = y, .ldy = ldy,
                .M = M, .N = N, .K = K, .bf16 = bf16, .act = act};
    run(&j);
    return 0;
}
