/* Linear layers through cuBLASLt: bf16 operands, fp32 accumulation, the bias
 * and GELU-tanh fused into the epilogue.
 *
 * Row-major y (M, N) = x (M, K) w^T is, in cuBLAS's column-major terms,
 * Y' (N, M) = W'^T (N, K) X' (K, M) with W' = w viewed as (K, N) (ld K) and
 * X' = x viewed as (K, M) (ld ldx): transa = T, transb = N, m = N, n = M. The
 * epilogue bias is then per row of Y', i.e. per output feature, as nn.Linear.
 *
 * Descriptors live on the stack (cublasLt*Init, no heap), and the algorithm
 * for a shape is chosen once by the heuristic and cached: the hot loop makes
 * no allocation and no heuristic query. */
#include <cublasLt.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/common.cuh"

#define GEMM_CACHE 256

typedef struct gemm_key {
    int M, N, K, epi, align;
    size_t ldx, ldy;
} gemm_key;

typedef struct gemm_entry {
    gemm_key key;
    cublasLtMatmulAlgo_t algo;
    int used;
    int fallback; /* no cuBLASLt algorithm: linear_fallback */
} gemm_entry;

struct ditd_cuda_gemm {
    cublasLtHandle_t lt;
    void *ws;
    size_t ws_bytes;
    gemm_entry cache[GEMM_CACHE];
    ditd_cuda_gemm_fallback_fn on_fallback; /* told once per shape that falls back */
    void *fallback_ud;
    int fallbacks;
};

/* A shape goes to the fallback kernel for good: count it and tell the
 * owner (the kernels do not print), so that a collapse in speed is never
 * silent. */
static void fell_back(ditd_cuda_gemm *g, const gemm_key *k, ditd_cuda_act act, int bias,
                      const char *why)
{
    g->fallbacks++;
    if (g->on_fallback)
        g->on_fallback(g->fallback_ud, k->M, k->N, k->K, k->ldx, k->ldy, act, bias, why);
}

extern "C" void ditd_cuda_gemm_on_fallback(ditd_cuda_gemm *g, ditd_cuda_gemm_fallback_fn fn,
                                           void *ud)
{
    g->on_fallback = fn;
    g->fallback_ud = ud;
}

extern "C" int ditd_cuda_gemm_fallbacks(const ditd_cuda_gemm *g)
{
    return g ? g->fallbacks : 0;
}

/* The fallback for shapes no cuBLASLt algorithm takes (rows of a few bytes,
 * e.g. a 4-wide patch vector, or strides that break its alignment rules):
 * one thread an output, fp32 accumulation, same epilogue. Only tiny layers
 * end up here. */
static __global__ void linear_fallback_kernel(const bf16 *x, size_t ldx, const bf16 *w,
                                              const bf16 *b, bf16 *y, size_t ldy, int M, int N,
                                              int K, int act)
{
    const size_t total = (size_t)M * N;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        const int m = (int)(i / (size_t)N), n = (int)(i % (size_t)N);
        const bf16 *xr = x + (size_t)m * ldx, *wr = w + (size_t)n * K;
        float acc = 0.0f;
        for (int k = 0; k < K; k++)
            acc += ld_bf16(xr + k) * ld_bf16(wr + k);
        if (b)
            acc += ld_bf16(b + n);
        acc = act == DITD_CUDA_ACT_GELU_TANH ? gelu_tanh(acc)
              : act == DITD_CUDA_ACT_SILU    ? silu(acc)
                                             : acc;
        st_bf16(y + (size_t)m * ldy + n, acc);
    }
}

static int linear_fallback(const void *x, size_t ldx, const void *w, const void *b, void *y,
                           size_t ldy, int M, int N, int K, ditd_cuda_act act, cudaStream_t s)
{
    size_t total = (size_t)M * N;
    linear_fallback_kernel<<<ew_blocks(total), DITD_CUDA_EW_THREADS, 0, s>>>(
        (const bf16 *)x, ldx, (const bf16 *)w, (const bf16 *)b, (bf16 *)y, ldy, M, N, K,
        (int)act);
    return launch_check();
}

static int lt_err(cublasStatus_t st)
{
    return st == CUBLAS_STATUS_SUCCESS ? 0 : DITD_CUDA_CUBLAS_BASE + (int)st;
}

extern "C" const char *ditd_cuda_strerror(int code)
{
    if (code >= DITD_CUDA_CUBLAS_BASE)
        return cublasLtGetStatusString((cublasStatus_t)(code - DITD_CUDA_CUBLAS_BASE));
    return cudaGetErrorString((cudaError_t)code);
}

extern "C" int ditd_cuda_gemm_new(void *workspace, size_t ws_bytes, ditd_cuda_gemm **out)
{
    ditd_cuda_gemm *g = (ditd_cuda_gemm *)calloc(1, sizeof *g);
    int err;
    *out = NULL;
    if (!g)
        return (int)cudaErrorMemoryAllocation;
    if ((err = lt_err(cublasLtCreate(&g->lt)))) {
        free(g);
        return err;
    }
    g->ws = workspace;
    g->ws_bytes = workspace ? ws_bytes : 0;
    *out = g;
    return 0;
}

extern "C" void ditd_cuda_gemm_free(ditd_cuda_gemm *g)
{
    if (!g)
        return;
    cublasLtDestroy(g->lt);
    free(g);
}

/* The largest power of two (<= 256) dividing the address: what the
 * heuristic may assume about a pointer. */
static uint32_t align_of(const void *p)
{
    uintptr_t a = (uintptr_t)p;
    uint32_t al = 256;
    while (al > 2 && (a & (al - 1)))
        al >>= 1;
    return al;
}

static int key_eq(const gemm_key *a, const gemm_key *b)
{
    return a->M == b->M && a->N == b->N && a->K == b->K && a->epi == b->epi &&
           a->align == b->align && a->ldx == b->ldx && a->ldy == b->ldy;
}

static unsigned key_hash(const gemm_key *k)
{
    uint64_t h = 1469598103934665603ull;
    const uint64_t v[7] = {(uint64_t)k->M, (uint64_t)k->N, (uint64_t)k->K, (uint64_t)k->epi,
                           (uint64_t)k->align, (uint64_t)k->ldx, (uint64_t)k->ldy};
    for (int i = 0; i < 7; i++)
        h = (h ^ v[i]) * 1099511628211ull;
    return (unsigned)(h % GEMM_CACHE);
}

extern "C" int ditd_cuda_linear(ditd_cuda_gemm *g, const void *x, size_t ldx, const void *w,
                                const void *b, void *y, size_t ldy, int M, int N, int K,
                                ditd_cuda_act act, ditd_cuda_stream s)
{
    if (!g || M < 0 || N <= 0 || K <= 0 || ldx < (size_t)K || ldy < (size_t)N)
        return DITD_CUDA_EINVAL;
    if (M == 0)
        return 0;
    cudaStream_t st = (cudaStream_t)s;
    cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_DEFAULT;
    if (act == DITD_CUDA_ACT_GELU_TANH)
        epi = b ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_GELU;
    else if (b)
        epi = CUBLASLT_EPILOGUE_BIAS;

    cublasLtMatmulDescOpaque_t desc;
    cublasLtMatrixLayoutOpaque_t la, lb, lc;
    int err;
    if ((err = lt_err(cublasLtMatmulDescInit(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F))))
        return err;
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    cudaDataType_t bias_t = CUDA_R_16BF;
    if ((err = lt_err(cublasLtMatmulDescSetAttribute(&desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta,
                                                     sizeof ta))) ||
        (err = lt_err(cublasLtMatmulDescSetAttribute(&desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb,
                                                     sizeof tb))) ||
        (err = lt_err(cublasLtMatmulDescSetAttribute(&desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi,
                                                     sizeof epi))))
        return err;
    if (b && ((err = lt_err(cublasLtMatmulDescSetAttribute(&desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                          &b, sizeof b))) ||
              (err = lt_err(cublasLtMatmulDescSetAttribute(
                   &desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_t, sizeof bias_t)))))
        return err;
    /* A = W' (K, N) ld K, transposed; B = X' (K, M) ld ldx; C = D = Y' (N, M) ld ldy */
    if ((err = lt_err(cublasLtMatrixLayoutInit(&la, CUDA_R_16BF, (uint64_t)K, (uint64_t)N,
                                               (int64_t)K))) ||
        (err = lt_err(cublasLtMatrixLayoutInit(&lb, CUDA_R_16BF, (uint64_t)K, (uint64_t)M,
                                               (int64_t)ldx))) ||
        (err = lt_err(cublasLtMatrixLayoutInit(&lc, CUDA_R_16BF, (uint64_t)N, (uint64_t)M,
                                               (int64_t)ldy))))
        return err;

    uint32_t al_w = align_of(w), al_x = align_of(x), al_y = align_of(y);
    gemm_key key = {M, N, K, (int)epi, (int)(al_w | al_x << 9 | al_y << 18), ldx, ldy};
    unsigned h = key_hash(&key), slot = h;
    gemm_entry *e = NULL;
    for (unsigned i = 0; i < GEMM_CACHE; i++) {
        gemm_entry *c = &g->cache[(h + i) % GEMM_CACHE];
        if (!c->used || key_eq(&c->key, &key)) {
            e = c;
            slot = (h + i) % GEMM_CACHE;
            break;
        }
    }
    if (!e) /* full: evict the home slot (a server sees a handful of shapes) */
        e = &g->cache[slot], e->used = 0;
    if (!e->used) {
        cublasLtMatmulPreferenceOpaque_t pref;
        cublasLtMatmulHeuristicResult_t res;
        int found = 0;
        uint64_t ws = g->ws_bytes;
        if ((err = lt_err(cublasLtMatmulPreferenceInit(&pref))) ||
            (err = lt_err(cublasLtMatmulPreferenceSetAttribute(
                 &pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws))) ||
            (err = lt_err(cublasLtMatmulPreferenceSetAttribute(
                 &pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_w, sizeof al_w))) ||
            (err = lt_err(cublasLtMatmulPreferenceSetAttribute(
                 &pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_x, sizeof al_x))) ||
            (err = lt_err(cublasLtMatmulPreferenceSetAttribute(
                 &pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_y, sizeof al_y))) ||
            (err = lt_err(cublasLtMatmulPreferenceSetAttribute(
                 &pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_y, sizeof al_y))))
            return err;
        cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(g->lt, &desc, &la, &lb, &lc, &lc,
                                                           &pref, 1, &res, &found);
        if (hs != CUBLAS_STATUS_SUCCESS && hs != CUBLAS_STATUS_NOT_SUPPORTED)
            return lt_err(hs);
        e->key = key;
        e->fallback = hs != CUBLAS_STATUS_SUCCESS || found < 1;
        if (!e->fallback)
            e->algo = res.algo;
        e->used = 1;
        if (e->fallback)
            fell_back(g, &key, act, b != NULL,
                      hs != CUBLAS_STATUS_SUCCESS ? "the heuristic answered NOT_SUPPORTED"
                                                  : "the heuristic found no algorithm");
    }
    if (e->fallback)
        return linear_fallback(x, ldx, w, b, y, ldy, M, N, K, act, st);
    const float alpha = 1.0f, beta = 0.0f;
    cublasStatus_t ms = cublasLtMatmul(g->lt, &desc, &alpha, w, &la, x, &lb, &beta, y, &lc, y,
                                       &lc, &e->algo, g->ws, g->ws_bytes, st);
    if (ms == CUBLAS_STATUS_NOT_SUPPORTED) { /* the algorithm refused: never again */
        e->fallback = 1;
        fell_back(g, &key, act, b != NULL, "cublasLtMatmul refused the heuristic's algorithm");
        return linear_fallback(x, ldx, w, b, y, ldy, M, N, K, act, st);
    }
    if ((err = lt_err(ms)))
        return err;
    if (act == DITD_CUDA_ACT_SILU) {
        /* no SiLU epilogue in cuBLASLt: one pass over the rows it wrote */
        if (ldy == (size_t)N)
            return ditd_cuda_act_apply(y, y, (size_t)M * (size_t)N, act, s);
        for (int r = 0; r < M; r++) { /* strided output: row by row (rare: not in DiT) */
            bf16 *row = (bf16 *)y + (size_t)r * ldy;
            if ((err = ditd_cuda_act_apply(row, row, (size_t)N, act, s)))
                return err;
        }
    }
    return launch_check();
}

/* ---- FP8 weights (e4m3 / e5m2) through cuBLASLt's FP8 GEMM ----
 *
 * Each row of x is quantized to e4m3 with its own scale (amax / 448, the
 * largest finite e4m3; 1 for a zero row), then one cuBLASLt FP8 GEMM on
 * Hopper: A = the weight's FP8 bytes, B = the quantized x, both with
 * outer-vector fp32 scales (the weight's per-row scales, x's per-token
 * ones), bf16 out with the bias (and GELU) fused. The rounding of x to
 * e4m3 (3 mantissa bits) is this path's error against the CPU's weight-only
 * dequantization: a few percent per product, averaging over K. */

#include <cuda_fp8.h>

static __global__ void quant_rows_e4m3_kernel(const bf16 *x, size_t ldx, int K,
                                              __nv_fp8_e4m3 *xq, float *xs)
{
    const int m = blockIdx.x;
    const bf16 *r = x + (size_t)m * ldx;
    float a = 0.0f;
    for (int k = threadIdx.x; k < K; k += blockDim.x)
        a = fmaxf(a, fabsf(ld_bf16(r + k)));
    __shared__ float red[32];
    for (int o = 16; o > 0; o >>= 1)
        a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, o));
    if ((threadIdx.x & 31) == 0)
        red[threadIdx.x >> 5] = a;
    __syncthreads();
    if (threadIdx.x < 32) {
        a = threadIdx.x < (blockDim.x + 31) / 32 ? red[threadIdx.x] : 0.0f;
        for (int o = 16; o > 0; o >>= 1)
            a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, o));
        if (threadIdx.x == 0)
            red[0] = a;
    }
    __syncthreads();
    const float s = red[0] > 0.0f ? red[0] / 448.0f : 1.0f;
    if (threadIdx.x == 0)
        xs[m] = s;
    for (int k = threadIdx.x; k < K; k += blockDim.x)
        xq[(size_t)m * K + k] = __nv_fp8_e4m3(__fdiv_rn(ld_bf16(r + k), s));
}

/* w (N, K) FP8 rows times their scales, to bf16 rows of K: the fallback's
 * weight-only dequantization (the CPU's values, rounded to bf16). */
static __global__ void dequant_fp8_kernel(const uint8_t *w, int e5m2, const float *ws, int N,
                                          int K, bf16 *out)
{
    const size_t total = (size_t)N * K;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        float v;
        if (e5m2) {
            __nv_fp8_e5m2 q;
            q.__x = w[i];
            v = (float)q;
        } else {
            __nv_fp8_e4m3 q;
            q.__x = w[i];
            v = (float)q;
        }
        st_bf16(out + i, ws ? __fmul_rn(v, ws[i / (size_t)K]) : v);
    }
}

extern "C" int ditd_cuda_dequant_fp8_bf16(const void *w, int e5m2, const float *w_scale, int N,
                                          int K, void *out, ditd_cuda_stream s)
{
    if (!w || !out || N <= 0 || K <= 0)
        return DITD_CUDA_EINVAL;
    const size_t total = (size_t)N * K;
    dequant_fp8_kernel<<<ew_blocks(total), DITD_CUDA_EW_THREADS, 0, (cudaStream_t)s>>>(
        (const uint8_t *)w, e5m2, w_scale, N, K, (bf16 *)out);
    return launch_check();
}

extern "C" int ditd_cuda_linear_fp8(ditd_cuda_gemm *g, int e5m2, const void *x, size_t ldx,
                                    const void *w, const float *w_scale, const void *b, void *y,
                                    size_t ldy, int M, int N, int K, ditd_cuda_act act,
                                    void *xq, float *xs, ditd_cuda_stream s)
{
    if (!g || !w || !w_scale || !xq || !xs || M < 0 || N <= 0 || K <= 0 || ldx < (size_t)K ||
        ldy < (size_t)N)
        return DITD_CUDA_EINVAL;
    if (M == 0)
        return 0;
    /* FP8 GEMMs want 16-byte rows (K % 16) and 16-byte aligned operands */
    if (K % 16 || ldy % 8 || align_of(w) < 16 || align_of(y) < 16)
        return DITD_CUDA_EUNSUPPORTED;
    cudaStream_t st = (cudaStream_t)s;
    quant_rows_e4m3_kernel<<<M, 256, 0, st>>>((const bf16 *)x, ldx, K, (__nv_fp8_e4m3 *)xq, xs);
    int err = launch_check();
    if (err)
        return err;

    cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_DEFAULT;
    if (act == DITD_CUDA_ACT_GELU_TANH)
        epi = b ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_GELU;
    else if (b)
        epi = CUBLASLT_EPILOGUE_BIAS;
    cublasLtMatmulDescOpaque_t desc;
    cublasLtMatrixLayoutOpaque_t la, lb, lc;
    if ((err = lt_err(cublasLtMatmulDescInit(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F))))
        return err;
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    cudaDataType_t bias_t = CUDA_R_16BF;
    cublasLtMatmulMatrixScale_t vec = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
    if ((err = lt_err(cublasLtMatmulDescSetAttribute(&desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta,
                                                     sizeof ta))) ||
        (err = lt_err(cublasLtMatmulDescSetAttribute(&desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb,
                                                     sizeof tb))) ||
        (err = lt_err(cublasLtMatmulDescSetAttribute(&desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi,
                                                     sizeof epi))) ||
        (err = lt_err(cublasLtMatmulDescSetAttribute(&desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE,
                                                     &vec, sizeof vec))) ||
        (err = lt_err(cublasLtMatmulDescSetAttribute(&desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE,
                                                     &vec, sizeof vec))) ||
        (err = lt_err(cublasLtMatmulDescSetAttribute(&desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                                                     &w_scale, sizeof w_scale))) ||
        (err = lt_err(cublasLtMatmulDescSetAttribute(&desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                                                     &xs, sizeof xs))))
        return err;
    if (b && ((err = lt_err(cublasLtMatmulDescSetAttribute(&desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                          &b, sizeof b))) ||
              (err = lt_err(cublasLtMatmulDescSetAttribute(
                   &desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_t, sizeof bias_t)))))
        return err;
    /* A = W' (K, N) ld K transposed, B = Xq' (K, M) ld K, C = D = Y' (N, M) ld ldy */
    if ((err = lt_err(cublasLtMatrixLayoutInit(&la, e5m2 ? CUDA_R_8F_E5M2 : CUDA_R_8F_E4M3,
                                               (uint64_t)K, (uint64_t)N, (int64_t)K))) ||
        (err = lt_err(cublasLtMatrixLayoutInit(&lb, CUDA_R_8F_E4M3, (uint64_t)K, (uint64_t)M,
                                               (int64_t)K))) ||
        (err = lt_err(cublasLtMatrixLayoutInit(&lc, CUDA_R_16BF, (uint64_t)N, (uint64_t)M,
                                               (int64_t)ldy))))
        return err;

    uint32_t al_w = align_of(w), al_x = align_of(xq), al_y = align_of(y);
    /* the FP8 shapes share the cache, told apart by the epilogue's high bits */
    gemm_key key = {M, N, K, (int)epi | (e5m2 ? 2 : 1) << 24, (int)(al_w | al_x << 9 | al_y << 18),
                    (size_t)K, ldy};
    unsigned h = key_hash(&key), slot = h;
    gemm_entry *e = NULL;
    for (unsigned i = 0; i < GEMM_CACHE; i++) {
        gemm_entry *c = &g->cache[(h + i) % GEMM_CACHE];
        if (!c->used || key_eq(&c->key, &key)) {
            e = c;
            slot = (h + i) % GEMM_CACHE;
            break;
        }
    }
    if (!e)
        e = &g->cache[slot], e->used = 0;
    if (!e->used) {
        cublasLtMatmulPreferenceOpaque_t pref;
        cublasLtMatmulHeuristicResult_t res;
        int found = 0;
        uint64_t ws = g->ws_bytes;
        if ((err = lt_err(cublasLtMatmulPreferenceInit(&pref))) ||
            (err = lt_err(cublasLtMatmulPreferenceSetAttribute(
                 &pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws))))
            return err;
        cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(g->lt, &desc, &la, &lb, &lc, &lc,
                                                           &pref, 1, &res, &found);
        if (hs != CUBLAS_STATUS_SUCCESS && hs != CUBLAS_STATUS_NOT_SUPPORTED)
            return lt_err(hs);
        e->key = key;
        e->fallback = hs != CUBLAS_STATUS_SUCCESS || found < 1;
        if (!e->fallback)
            e->algo = res.algo;
        e->used = 1;
        if (e->fallback)
            fell_back(g, &key, act, b != NULL, "no cuBLASLt FP8 algorithm for this shape");
    }
    if (e->fallback)
        return DITD_CUDA_EUNSUPPORTED; /* the caller dequantizes and runs the bf16 GEMM */
    const float alpha = 1.0f, beta = 0.0f;
    cublasStatus_t ms = cublasLtMatmul(g->lt, &desc, &alpha, w, &la, xq, &lb, &beta, y, &lc, y,
                                       &lc, &e->algo, g->ws, g->ws_bytes, st);
    if (ms == CUBLAS_STATUS_NOT_SUPPORTED) {
        e->fallback = 1;
        fell_back(g, &key, act, b != NULL, "cublasLtMatmul refused the FP8 algorithm");
        return DITD_CUDA_EUNSUPPORTED;
    }
    if ((err = lt_err(ms)))
        return err;
    if (act == DITD_CUDA_ACT_SILU) {
        for (int r = 0; r < M; r++) {
            bf16 *row = (bf16 *)y + (size_t)r * ldy;
            if ((err = ditd_cuda_act_apply(row, row, (size_t)N, act, s)))
                return err;
        }
    }
    return launch_check();
}
