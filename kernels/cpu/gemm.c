/* The CPU GEMM: y (M, N) = x (M, K) @ w^T (+ b), w (N, K) as nn.Linear stores
 * it, x and y f32, w and b f32 or bf16.
 *
 * Which code runs it was chosen by measurement (docs/cpu.md):
 *   - On a CPU with AVX-512 (F, BW, VL), linear layers' weights are re-laid
 *     at load (ditd_cpu_pack_weight) and run through ditd's own kernel,
 *     gemm_packed.c (bf16 also needs AVX512-BF16). This is the default; the
 *     backend asks ditd_cpu_gemm_packs before it packs or calls.
 *   - Otherwise, for weights in nn.Linear's layout (the text encoders'
 *     linear_wt, CPUs without AVX-512, DITD_CPU_GEMM=onednn or openblas to
 *     compare): oneDNN's matmul primitive, whose instruction set is picked at
 *     run time from the CPU, so its speed does not depend on an OpenBLAS
 *     environment pin such as OPENBLAS_CORETYPE. OpenBLAS's cblas_sgemm is
 *     the fallback: when ditd is built without oneDNN, with
 *     DITD_CPU_GEMM=openblas, or when oneDNN refuses a shape.
 * bf16 runs bf16 x bf16 with fp32 accumulation; x is rounded to bf16
 * (nearest-even) first, as PyTorch's bf16 matmul sees it. The packed kernel
 * and oneDNN apply the bias and the activation (GELU-tanh, SiLU) to each
 * output block inside the product; elsewhere the caller applies them.
 *
 * State: which path runs (decided once, from the CPU and DITD_CPU_GEMM); a
 * small table of oneDNN primitives, one per (dtype, M, N, K, ldx, ldy,
 * bias) met so far, built on first use (the first forward) and kept for the
 * process; a workspace for x in bf16 that grows to the largest M*K seen.
 * All behind one mutex, held while a product runs (a oneDNN primitive's
 * memory objects are part of its entry). What it is not: a GEMM for other
 * layouts.
 */
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/gemm_packed.h"

#include <assert.h>
#include <cblas.h>
#include <omp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if DITD_HAVE_DNNL
#include <oneapi/dnnl/dnnl.h>
#endif

/* ---- bf16 <-> f32 ---- */

static inline uint16_t f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    /* round to nearest, ties to even; a NaN stays a (quiet) NaN. Written
     * as a select, not a branch, so that the loops below vectorize. */
    uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    uint32_t q = (u >> 16) | 0x40u;
    return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? q : r);
}

static inline float bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Serial on purpose: a vectorized pass runs at memory speed (~0.05 ms for a
 * DiT-XL/2 activation), less than waking a team of threads costs. */
void ditd_cpu_f32_to_bf16(const float *src, uint16_t *dst, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = f32_to_bf16(src[i]);
}

void ditd_cpu_bf16_to_f32(const uint16_t *src, float *dst, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = bf16_to_f32(src[i]);
}

/* x (M, K) rows of stride ldx to a dense bf16 (M, K): once per GEMM, over
 * the threads for a token-sized x (fc2's input at DiT-XL/2 is 2.4M values). */
static void rows_to_bf16(const float *x, size_t ldx, uint16_t *xb, int M, int K)
{
#pragma omp parallel for schedule(static) if ((size_t)M * (size_t)K > 262144)
    for (int i = 0; i < M; i++) {
        const float *r = x + (size_t)i * ldx;
        uint16_t *d = xb + (size_t)i * (size_t)K;
        for (int j = 0; j < K; j++)
            d[j] = f32_to_bf16(r[j]);
    }
}

/* ---- what the CPU has ---- */

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>

int ditd_cpu_has_bf16_dot(void)
{
    unsigned a, b, c, d;
    /* leaf 7 subleaf 1: EAX bit 5 = AVX512_BF16; leaf 7 subleaf 0: EDX bit
     * 22 = AMX-BF16. (The OS must also enable the state: xgetbv, below.) */
    if (__get_cpuid_max(0, NULL) < 7)
        return 0;
    unsigned lo, hi;
    __cpuid(1, a, b, c, d);
    if (!(c & (1u << 27))) /* OSXSAVE */
        return 0;
    __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    int zmm_on = (lo & 0xe6u) == 0xe6u; /* XMM, YMM, opmask, ZMM state */
    __cpuid_count(7, 0, a, b, c, d);
    int amx_bf16 = (d >> 22) & 1u, avx512f = (b >> 16) & 1u;
    __cpuid_count(7, 1, a, b, c, d);
    int avx512_bf16 = (a >> 5) & 1u;
    return zmm_on && ((avx512f && avx512_bf16) || amx_bf16);
}
#else
int ditd_cpu_has_bf16_dot(void)
{
    return 0;
}
#endif

/* ---- shared state ---- */

#define SMALL_M 16 /* up to this many rows: the few-rows kernel below */

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static char g_info[512];               /* what ditd_cpu_gemm_info returns */
static uint16_t *g_xb;                 /* x in bf16 */
static size_t g_xb_len;                /* elements */
static float *g_wf;                    /* fallback: bf16 x, then w, widened */
static size_t g_wf_len;
static int g_packs_f32, g_packs_bf16;   /* the packed kernel runs linear layers */

static int grow(void **p, size_t *len, size_t n, size_t es)
{
    if (n <= *len)
        return 0;
    void *q = realloc(*p, n * es);
    if (!q)
        return -1;
    *p = q;
    *len = n;
    return 0;
}

/* ---- oneDNN ---- */

#if DITD_HAVE_DNNL

static int g_use_dnnl; /* 1 when oneDNN runs the GEMMs */

#define DNNL_SLOTS 96

typedef struct dnnl_slot {
    int used, bf16, M, N, K, bias, act;
    size_t ldx, ldy;
    dnnl_primitive_t prim;
    dnnl_memory_t src, wei, bia, dst;
} dnnl_slot;

static dnnl_engine_t g_eng;
static dnnl_stream_t g_stream;
static dnnl_slot g_slots[DNNL_SLOTS];
static char g_impl_f32[64], g_impl_bf16[64];

static const char *isa_name(dnnl_cpu_isa_t isa)
{
    switch (isa) {
    case dnnl_cpu_isa_sse41: return "sse4.1";
    case dnnl_cpu_isa_avx: return "avx";
    case dnnl_cpu_isa_avx2: return "avx2";
    case dnnl_cpu_isa_avx2_vnni: return "avx2_vnni";
    case dnnl_cpu_isa_avx512_core: return "avx512_core";
    case dnnl_cpu_isa_avx512_core_vnni: return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core_bf16: return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_amx: return "avx512_core_amx";
    default: return "other";
    }
}

static void slot_release(dnnl_slot *s)
{
    dnnl_primitive_destroy(s->prim);
    dnnl_memory_destroy(s->src);
    dnnl_memory_destroy(s->wei);
    if (s->bia)
        dnnl_memory_destroy(s->bia);
    dnnl_memory_destroy(s->dst);
    memset(s, 0, sizeof *s);
}

/* Builds the matmul for one shape into s; 0 or -1 (oneDNN refused). impl,
 * when not NULL, receives oneDNN's implementation name ("brg:avx512_core"). */
static int slot_build(dnnl_slot *s, int bf16, int M, int N, int K, size_t ldx, size_t ldy,
                      int bias, int act, char *impl, size_t impl_len)
{
    dnnl_data_type_t wt = bf16 ? dnnl_bf16 : dnnl_f32;
    dnnl_memory_desc_t src_md, wei_md, bia_md, dst_md;
    dnnl_dims_t sd = {M, K}, ss = {bf16 ? K : (dnnl_dim_t)ldx, 1};
    dnnl_dims_t wd = {K, N}, ws = {1, K}; /* w^T: the (K, N) view of w (N, K) */
    dnnl_dims_t bd = {1, N}, bs = {N, 1};
    dnnl_dims_t dd = {M, N}, ds = {(dnnl_dim_t)ldy, 1};
    dnnl_matmul_desc_t md;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t po = NULL;
    memset(s, 0, sizeof *s);
    if (dnnl_memory_desc_init_by_strides(&src_md, 2, sd, wt, ss) ||
        dnnl_memory_desc_init_by_strides(&wei_md, 2, wd, wt, ws) ||
        dnnl_memory_desc_init_by_strides(&bia_md, 2, bd, wt, bs) ||
        dnnl_memory_desc_init_by_strides(&dst_md, 2, dd, dnnl_f32, ds) ||
        dnnl_matmul_desc_init(&md, &src_md, &wei_md, bias ? &bia_md : NULL, &dst_md))
        return -1;
    /* the activation as an eltwise post-op, applied to each output block
     * while it is in registers: GELU(tanh) as PyTorch's approximate='tanh',
     * SiLU as swish with alpha 1 (x sigmoid(x)) */
    if (act != DITD_CPU_ACT_NONE) {
        dnnl_alg_kind_t alg = act == DITD_CPU_ACT_GELU_TANH ? dnnl_eltwise_gelu_tanh : dnnl_eltwise_swish;
        int bad_attr = dnnl_primitive_attr_create(&attr) || dnnl_post_ops_create(&po) ||
                       dnnl_post_ops_append_eltwise(po, 1.0f, alg, 1.0f, 0.0f) ||
                       dnnl_primitive_attr_set_post_ops(attr, po);
        if (po)
            dnnl_post_ops_destroy(po);
        if (bad_attr) {
            if (attr)
                dnnl_primitive_attr_destroy(attr);
            return -1;
        }
    }
    int refused = dnnl_primitive_desc_create(&pd, &md, attr, g_eng, NULL) != dnnl_success;
    if (attr)
        dnnl_primitive_attr_destroy(attr);
    if (refused)
        return -1;
    if (impl) {
        const char *name = NULL;
        dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &name);
        snprintf(impl, impl_len, "%s", name ? name : "?");
    }
    int bad = dnnl_primitive_create(&s->prim, pd) != dnnl_success;
    dnnl_primitive_desc_destroy(pd);
    if (bad)
        return -1;
    /* handles are set per call (DNNL_MEMORY_NONE: no buffer of its own) */
    if (dnnl_memory_create(&s->src, &src_md, g_eng, DNNL_MEMORY_NONE) ||
        dnnl_memory_create(&s->wei, &wei_md, g_eng, DNNL_MEMORY_NONE) ||
        (bias && dnnl_memory_create(&s->bia, &bia_md, g_eng, DNNL_MEMORY_NONE)) ||
        dnnl_memory_create(&s->dst, &dst_md, g_eng, DNNL_MEMORY_NONE)) {
        slot_release(s);
        return -1;
    }
    s->used = 1;
    s->bf16 = bf16;
    s->M = M;
    s->N = N;
    s->K = K;
    s->ldx = ldx;
    s->ldy = ldy;
    s->bias = bias;
    s->act = act;
    return 0;
}

static int slot_run(dnnl_slot *s, const void *x, const void *w, const void *b, float *y)
{
    dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, s->src}, {DNNL_ARG_WEIGHTS, s->wei},
                               {DNNL_ARG_DST, s->dst}, {DNNL_ARG_BIAS, s->bia}};
    if (dnnl_memory_set_data_handle(s->src, (void *)x) ||
        dnnl_memory_set_data_handle(s->wei, (void *)w) ||
        dnnl_memory_set_data_handle(s->dst, y) ||
        (s->bias && dnnl_memory_set_data_handle(s->bia, (void *)b)))
        return -1;
    if (dnnl_primitive_execute(s->prim, g_stream, s->bias ? 4 : 3, args) ||
        dnnl_stream_wait(g_stream))
        return -1;
    return 0;
}

/* One GEMM through oneDNN under g_lock; -1 when oneDNN cannot run it. */
static int dnnl_run_gemm(int bf16, const void *x, size_t ldx, const void *w, const void *b, float *y,
                         size_t ldy, int M, int N, int K, int act)
{
    int bias = b != NULL, free_slot = -1;
    for (int i = 0; i < DNNL_SLOTS; i++) {
        dnnl_slot *s = &g_slots[i];
        if (!s->used) {
            if (free_slot < 0)
                free_slot = i;
            continue;
        }
        if (s->bf16 == bf16 && s->M == M && s->N == N && s->K == K && s->ldx == ldx &&
            s->ldy == ldy && s->bias == bias && s->act == act)
            return slot_run(s, x, w, b, y);
    }
    if (free_slot >= 0) {
        if (slot_build(&g_slots[free_slot], bf16, M, N, K, ldx, ldy, bias, act, NULL, 0))
            return -1;
        return slot_run(&g_slots[free_slot], x, w, b, y);
    }
    /* table full (more shapes than a model has): build, run, drop */
    dnnl_slot tmp;
    if (slot_build(&tmp, bf16, M, N, K, ldx, ldy, bias, act, NULL, 0))
        return -1;
    int err = slot_run(&tmp, x, w, b, y);
    slot_release(&tmp);
    return err;
}

/* Probes the implementations oneDNN picks for a DiT-sized shape, for the
 * info line. */
static void dnnl_probe(void)
{
    dnnl_slot s;
    snprintf(g_impl_f32, sizeof g_impl_f32, "refused");
    snprintf(g_impl_bf16, sizeof g_impl_bf16, "refused");
    if (!slot_build(&s, 0, 512, 1152, 1152, 1152, 1152, 1, 0, g_impl_f32, sizeof g_impl_f32))
        slot_release(&s);
    if (!slot_build(&s, 1, 512, 1152, 1152, 1152, 1152, 1, 0, g_impl_bf16, sizeof g_impl_bf16))
        slot_release(&s);
}

#endif /* DITD_HAVE_DNNL */

/* DITD_CPU_GEMM: unset or "ditd" (the default choice), "onednn",
 * "openblas", or a value ditd does not know (the library runs; the info
 * line names the value). */
typedef enum gemm_want { WANT_DITD, WANT_ONEDNN, WANT_OPENBLAS, WANT_UNKNOWN } gemm_want;

static gemm_want want_of(const char *s)
{
    if (!s || !*s || strcmp(s, "ditd") == 0)
        return WANT_DITD;
    if (strcmp(s, "onednn") == 0)
        return WANT_ONEDNN;
    return strcmp(s, "openblas") == 0 ? WANT_OPENBLAS : WANT_UNKNOWN;
}

static void gemm_init(void)
{
    const char *env = getenv("DITD_CPU_GEMM");
    const gemm_want want = want_of(env);
    const int force_blas = want == WANT_OPENBLAS;
    char blas[96], packed[192];
    /* the packed kernel's instruction sets, asked of the CPU */
    const int avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                       __builtin_cpu_supports("avx512vl");
    g_packs_f32 = want == WANT_DITD && avx512;
    g_packs_bf16 = g_packs_f32 && __builtin_cpu_supports("avx512bf16");
    snprintf(blas, sizeof blas, "OpenBLAS %s", openblas_get_corename());
    if (g_packs_f32)
        snprintf(packed, sizeof packed, "linear layers: ditd's packed kernel (f32 avx512 fma%s); ",
                 g_packs_bf16 ? ", bf16 avx512_bf16" : "; bf16 through the library");
    else if (want == WANT_UNKNOWN)
        snprintf(packed, sizeof packed,
                 "linear layers: the library (DITD_CPU_GEMM=\"%.32s\" is none of ditd, onednn, "
                 "openblas); ", env);
    else
        snprintf(packed, sizeof packed, "linear layers: the library (%s); ",
                 want == WANT_DITD ? "no AVX-512 for the packed kernel" : "DITD_CPU_GEMM set");
#if DITD_HAVE_DNNL
    if (!force_blas && dnnl_engine_create(&g_eng, dnnl_cpu, 0) == dnnl_success &&
        dnnl_stream_create(&g_stream, g_eng, dnnl_stream_default_flags) == dnnl_success) {
        const dnnl_version_t *v = dnnl_version();
        g_use_dnnl = 1;
        dnnl_probe();
        snprintf(g_info, sizeof g_info,
                 "%soneDNN %d.%d.%d, cpu isa %s; f32 %s, bf16 %s; M <= %d rows: ditd's own kernel",
                 packed, v->major, v->minor, v->patch, isa_name(dnnl_get_effective_cpu_isa()),
                 g_impl_f32, g_impl_bf16, SMALL_M);
        return;
    }
#endif
    snprintf(g_info, sizeof g_info,
             "%s%s (%s); bf16 weights widened to f32; M <= %d rows: ditd's own kernel",
             packed, blas, force_blas ? "DITD_CPU_GEMM=openblas"
                              : DITD_HAVE_DNNL ? "oneDNN did not start" : "built without oneDNN",
             SMALL_M);
}

const char *ditd_cpu_gemm_info(void)
{
    pthread_once(&g_once, gemm_init);
    return g_info;
}

int ditd_cpu_gemm_packs(int w_bf16)
{
    pthread_once(&g_once, gemm_init);
    return w_bf16 ? g_packs_bf16 : g_packs_f32;
}

int ditd_cpu_pack_weight(void *w, int w_bf16, int N, int K)
{
    assert(w && N > 0 && K > 0);
    if (!ditd_cpu_gemm_packs(w_bf16))
        return 0;
    return ditd__cpu_pack_in_place(w, w_bf16, N, K);
}

/* Adds b (f32 or bf16) to every row of y. */
static void add_bias(float *y, size_t ldy, const void *b, int bf16, int M, int N)
{
#pragma omp parallel for schedule(static) if ((size_t)M * (size_t)N > 16384)
    for (int i = 0; i < M; i++) {
        float *r = y + (size_t)i * ldy;
        if (bf16)
            for (int j = 0; j < N; j++)
                r[j] += bf16_to_f32(((const uint16_t *)b)[j]);
        else
            for (int j = 0; j < N; j++)
                r[j] += ((const float *)b)[j];
    }
}

/* ---- few rows: our own kernel ----
 *
 * With M <= SMALL_M rows (DiT's timestep and adaLN linears run at M = batch)
 * the GEMM is a pass over the weights, bound by memory. oneDNN's matmul
 * repacks the whole (N, K) weight for its micro-kernel on every call, and
 * that repack costs 10-20x the pass itself at M = 2; OpenBLAS is not much
 * better. This kernel reads each weight row once, for all M rows, with 16
 * independent fp32 partial sums per dot product (vectorized by the
 * compiler; fp32 products of bf16 operands are exact). */
static inline float dot_f32(const float *a, const float *b, int K)
{
    float acc[16] = {0};
    int k = 0;
    for (; k + 16 <= K; k += 16)
        for (int l = 0; l < 16; l++)
            acc[l] += a[k + l] * b[k + l];
    for (int l = 0; k + l < K; l++)
        acc[l] += a[k + l] * b[k + l];
    float s = 0;
    for (int l = 0; l < 16; l++)
        s += acc[l];
    return s;
}

static inline float dot_bf16(const uint16_t *a, const uint16_t *b, int K)
{
    float acc[16] = {0};
    int k = 0;
    for (; k + 16 <= K; k += 16)
        for (int l = 0; l < 16; l++)
            acc[l] += bf16_to_f32(a[k + l]) * bf16_to_f32(b[k + l]);
    for (int l = 0; k + l < K; l++)
        acc[l] += bf16_to_f32(a[k + l]) * bf16_to_f32(b[k + l]);
    float s = 0;
    for (int l = 0; l < 16; l++)
        s += acc[l];
    return s;
}

/* x: f32 rows of stride ldx (w_bf16 = 0) or dense bf16 (M, K) (w_bf16 = 1). */
static void small_m_gemm(const void *x, size_t ldx, const void *w, const void *b, int w_bf16,
                         float *y, size_t ldy, int M, int N, int K)
{
#pragma omp parallel for schedule(static) if ((size_t)N * (size_t)K > 65536)
    for (int n = 0; n < N; n++) {
        float bias = 0;
        if (b)
            bias = w_bf16 ? bf16_to_f32(((const uint16_t *)b)[n]) : ((const float *)b)[n];
        for (int m = 0; m < M; m++) {
            float d = w_bf16 ? dot_bf16((const uint16_t *)x + (size_t)m * (size_t)K,
                                        (const uint16_t *)w + (size_t)n * (size_t)K, K)
                             : dot_f32((const float *)x + (size_t)m * ldx,
                                       (const float *)w + (size_t)n * (size_t)K, K);
            y[(size_t)m * ldy + (size_t)n] = d + bias;
        }
    }
}

/* The CPU ops have no error path (backend.h: they assert); a workspace the
 * size of one activation that cannot be had is treated the same way. */
static void *need(void **p, size_t *len, size_t n, size_t es)
{
    if (grow(p, len, n, es)) {
        fprintf(stderr, "ditd_cpu_gemm: out of memory for a %zu-byte workspace\n", n * es);
        abort();
    }
    return *p;
}

int ditd_cpu_gemm_act(const float *x, size_t ldx, const void *w, const void *b, int w_bf16,
                      float *y, size_t ldy, int M, int N, int K, ditd_cpu_act act)
{
    assert(x && w && y);
    assert(M >= 0 && N > 0 && K > 0);
    assert(ldx >= (size_t)K && ldy >= (size_t)N);
    assert(!omp_in_parallel()); /* the libraries must not run inside our region */
    if (M == 0)
        return 1;
    pthread_once(&g_once, gemm_init);
    pthread_mutex_lock(&g_lock);
    const size_t mk = (size_t)M * (size_t)K;
    int ok = 0;
    if (w_bf16)
        rows_to_bf16(x, ldx, need((void **)&g_xb, &g_xb_len, mk, sizeof *g_xb), M, K);
    if (M <= SMALL_M) {
        small_m_gemm(w_bf16 ? (const void *)g_xb : x, w_bf16 ? (size_t)K : ldx, w, b, w_bf16, y,
                     ldy, M, N, K);
        pthread_mutex_unlock(&g_lock);
        return 0;
    }
#if DITD_HAVE_DNNL
    /* with the activation fused; if oneDNN refuses that, without it */
    if (g_use_dnnl && act != DITD_CPU_ACT_NONE &&
        dnnl_run_gemm(w_bf16, w_bf16 ? (const void *)g_xb : x, w_bf16 ? (size_t)K : ldx, w, b, y,
                      ldy, M, N, K, (int)act) == 0) {
        pthread_mutex_unlock(&g_lock);
        return 1;
    }
    if (g_use_dnnl)
        ok = dnnl_run_gemm(w_bf16, w_bf16 ? (const void *)g_xb : x, w_bf16 ? (size_t)K : ldx, w, b, y,
                           ldy, M, N, K, 0) == 0;
#endif
    if (!ok && !w_bf16) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, x, (int)ldx, w, K,
                    0.0f, y, (int)ldy);
    } else if (!ok) {
        /* the same products in f32: bf16 x and w widened (exactly), f32
         * accumulation; one workspace holds x then w */
        size_t nw = (size_t)N * (size_t)K;
        float *ws = need((void **)&g_wf, &g_wf_len, mk + nw, sizeof *g_wf);
        ditd_cpu_bf16_to_f32(g_xb, ws, mk);
        ditd_cpu_bf16_to_f32(w, ws + mk, nw);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, ws, K, ws + mk, K,
                    0.0f, y, (int)ldy);
    }
    if (!ok && b)
        add_bias(y, ldy, b, w_bf16, M, N);
    pthread_mutex_unlock(&g_lock);
    return act == DITD_CPU_ACT_NONE;
}

void ditd_cpu_gemm(const float *x, size_t ldx, const void *w, const void *b, int w_bf16, float *y,
                   size_t ldy, int M, int N, int K)
{
    (void)ditd_cpu_gemm_act(x, ldx, w, b, w_bf16, y, ldy, M, N, K, DITD_CPU_ACT_NONE);
}

void ditd_cpu_gemm_packed(const float *x, size_t ldx, const void *wp, const void *b, int w_bf16,
                          float *y, size_t ldy, int M, int N, int K, ditd_cpu_act act)
{
    assert(x && wp && y);
    assert(M >= 0 && N > 0 && K > 0);
    assert(ldx >= (size_t)K && ldy >= (size_t)N);
    assert(!omp_in_parallel());
    assert(ditd_cpu_gemm_packs(w_bf16));
    if (M == 0)
        return;
    pthread_mutex_lock(&g_lock);
    const void *a = x;
    if (w_bf16) {
        uint16_t *xb = need((void **)&g_xb, &g_xb_len, (size_t)M * (size_t)K, sizeof *g_xb);
        rows_to_bf16(x, ldx, xb, M, K);
        a = xb;
        ldx = (size_t)K;
    }
    ditd__cpu_gemm_packed_run(a, ldx, wp, b, w_bf16, y, ldy, M, N, K, act);
    pthread_mutex_unlock(&g_lock);
}
