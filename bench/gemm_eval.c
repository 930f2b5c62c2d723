/* GEMM library evaluation at DiT-XL/2 shapes (not a test; prints a table).
 *
 *   gemm_eval [-t THREADS] [-r REPEATS]
 *
 * y (M, N) = x (M, K) @ w^T, w (N, K) row-major (nn.Linear), M = 512 (batch 2 x
 * 256 tokens), (N, K) of DiT-XL/2's qkv, out, fc1 and fc2 layers. Candidates:
 *   - OpenBLAS cblas_sgemm (dlopen'ed; its kernel follows OPENBLAS_CORETYPE
 *     when that is set, so the row names the core it chose);
 *   - BLIS cblas_sgemm (dlopen'ed from Debian's blis-openmp, when present);
 *   - oneDNN dnnl_sgemm and the oneDNN matmul primitive (f32, and bf16 x bf16
 *     -> f32), weights in nn.Linear's plain (N, K) layout;
 *   - ditd's packed kernel (kernels/cpu/gemm_packed.c, f32 and bf16), on the
 *     same weights re-laid once by ditd_cpu_pack_weight, as ditd loads them
 *     (the bf16 row includes rounding x to bf16 on each call, as ditd runs).
 * Beside them the FMA peak of this run (ditd_cpu_fma_peak_gflops: 24
 * independent 512-bit accumulators per thread; fewer, or 256-bit registers,
 * read about half of it here).
 * Median and minimum over the repeats after one warm-up call. The libraries
 * are loaded with dlopen so that one binary sees each with its own symbols.
 */
#include <dlfcn.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <oneapi/dnnl/dnnl.h>

#include "engine/core/clock.h"
#include "kernels/cpu/cpu_kernels.h"

typedef void (*sgemm_fn)(int order, int ta, int tb, int M, int N, int K, float alpha,
                         const float *A, int lda, const float *B, int ldb, float beta, float *C,
                         int ldc);

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void fill(float *a, size_t n, unsigned seed)
{
    unsigned s = seed * 2654435761u + 1u;
    for (size_t i = 0; i < n; ++i) {
        s = s * 1664525u + 1013904223u;
        a[i] = ((float)(s >> 8) * 0x1p-24f - 0.5f) * 0.2f;
    }
}

typedef struct shape {
    const char *name;
    int N, K;
} shape;

static const shape shapes[] = {
    {"qkv", 3456, 1152}, {"out", 1152, 1152}, {"fc1", 4608, 1152}, {"fc2", 1152, 4608},
};

enum { NSHAPES = sizeof shapes / sizeof shapes[0] };

typedef void (*run_fn)(void *ctx, int si);

static void time_row(const char *label, run_fn f, void *ctx, int M, int reps, double peak)
{
    double tot_flop = 0, tot_ms = 0;
    printf("%-42s", label);
    for (int si = 0; si < NSHAPES; si++) {
        double *t = malloc(sizeof(double) * (size_t)reps);
        f(ctx, si);
        for (int r = 0; r < reps; r++) {
            double t0 = ditd_now_ms();
            f(ctx, si);
            t[r] = ditd_now_ms() - t0;
        }
        qsort(t, (size_t)reps, sizeof *t, cmp_double);
        double flop = 2.0 * M * shapes[si].N * shapes[si].K;
        double med = t[reps / 2];
        printf(" %7.0f", flop / (med * 1e6));
        tot_flop += flop;
        tot_ms += med;
        free(t);
    }
    double g = tot_flop / (tot_ms * 1e6);
    printf(" %7.0f %5.0f%%\n", g, 100 * g / peak);
}

/* ---- BLAS through dlopen ---- */

typedef struct blas_ctx {
    sgemm_fn sgemm;
    const float *x, *w[NSHAPES];
    float *y;
    int M;
} blas_ctx;

static void run_blas(void *vc, int si)
{
    blas_ctx *c = vc;
    const shape *s = &shapes[si];
    c->sgemm(101 /* RowMajor */, 111 /* NoTrans */, 112 /* Trans */, c->M, s->N, s->K, 1.0f, c->x,
             s->K, c->w[si], s->K, 0.0f, c->y, s->N);
}

/* ---- ditd's packed kernel ---- */

typedef struct packed_ctx {
    const float *x;
    const void *w[NSHAPES]; /* packed */
    float *y;
    int M, bf16;
} packed_ctx;

static void run_packed(void *vc, int si)
{
    packed_ctx *c = vc;
    const shape *s = &shapes[si];
    ditd_cpu_gemm_packed(c->x, (size_t)s->K, c->w[si], NULL, c->bf16, c->y, (size_t)s->N, c->M,
                         s->N, s->K, DITD_CPU_ACT_NONE);
}

/* ---- oneDNN ---- */

typedef struct dnnl_ctx {
    const float *x, *w[NSHAPES];
    float *y;
    int M;
    dnnl_engine_t eng;
    dnnl_stream_t st;
    dnnl_primitive_t prim[NSHAPES];
    dnnl_memory_t src[NSHAPES], wei[NSHAPES], dst[NSHAPES];
} dnnl_ctx;

static void run_dnnl_sgemm(void *vc, int si)
{
    dnnl_ctx *c = vc;
    const shape *s = &shapes[si];
    dnnl_sgemm('N', 'T', c->M, s->N, s->K, 1.0f, c->x, s->K, c->w[si], s->K, 0.0f, c->y, s->N);
}

static void run_dnnl_matmul(void *vc, int si)
{
    dnnl_ctx *c = vc;
    dnnl_exec_arg_t args[3] = {{DNNL_ARG_SRC, c->src[si]},
                               {DNNL_ARG_WEIGHTS, c->wei[si]},
                               {DNNL_ARG_DST, c->dst[si]}};
    dnnl_primitive_execute(c->prim[si], c->st, 3, args);
    dnnl_stream_wait(c->st);
}

#define CK(x)                                                                                      \
    do {                                                                                           \
        dnnl_status_t s_ = (x);                                                                    \
        if (s_ != dnnl_success) {                                                                  \
            fprintf(stderr, "%s: %d\n", #x, (int)s_);                                              \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

/* Builds one matmul per shape; dt is the src/weights type (f32 or bf16),
 * dst always f32. xs/ws point to buffers of that type. */
static int dnnl_build(dnnl_ctx *c, dnnl_data_type_t dt, void *xs, void *const *ws, char *impl,
                      size_t impl_len)
{
    for (int si = 0; si < NSHAPES; si++) {
        const shape *s = &shapes[si];
        dnnl_memory_desc_t src_md, wei_md, dst_md;
        dnnl_dims_t sd = {c->M, s->K}, ss = {s->K, 1};
        dnnl_dims_t wd = {s->K, s->N}, wsd = {1, s->K}; /* w^T: (K, N) view of (N, K) */
        dnnl_dims_t dd = {c->M, s->N}, ds = {s->N, 1};
        CK(dnnl_memory_desc_init_by_strides(&src_md, 2, sd, dt, ss));
        CK(dnnl_memory_desc_init_by_strides(&wei_md, 2, wd, dt, wsd));
        CK(dnnl_memory_desc_init_by_strides(&dst_md, 2, dd, dnnl_f32, ds));
        dnnl_matmul_desc_t md;
        CK(dnnl_matmul_desc_init(&md, &src_md, &wei_md, NULL, &dst_md));
        dnnl_primitive_desc_t pd;
        CK(dnnl_primitive_desc_create(&pd, &md, NULL, c->eng, NULL));
        const char *info = NULL;
        dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &info);
        if (si == 0)
            snprintf(impl, impl_len, "%s", info ? info : "?");
        CK(dnnl_primitive_create(&c->prim[si], pd));
        dnnl_primitive_desc_destroy(pd);
        CK(dnnl_memory_create(&c->src[si], &src_md, c->eng, xs));
        CK(dnnl_memory_create(&c->wei[si], &wei_md, c->eng, ws[si]));
        CK(dnnl_memory_create(&c->dst[si], &dst_md, c->eng, c->y));
    }
    return 0;
}

static void dnnl_release(dnnl_ctx *c)
{
    for (int si = 0; si < NSHAPES; si++) {
        dnnl_primitive_destroy(c->prim[si]);
        dnnl_memory_destroy(c->src[si]);
        dnnl_memory_destroy(c->wei[si]);
        dnnl_memory_destroy(c->dst[si]);
    }
}

static uint16_t to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fff + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

static const char *isa_name(dnnl_cpu_isa_t isa)
{
    switch (isa) {
    case dnnl_cpu_isa_avx2: return "avx2";
    case dnnl_cpu_isa_avx2_vnni: return "avx2_vnni";
    case dnnl_cpu_isa_avx512_core: return "avx512_core";
    case dnnl_cpu_isa_avx512_core_vnni: return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core_bf16: return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_amx: return "avx512_core_amx";
    default: return "other";
    }
}

int main(int argc, char **argv)
{
    int threads = 2, reps = 9, M = 512;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "-t"))
            threads = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "-r"))
            reps = atoi(argv[i + 1]);
    }
    omp_set_num_threads(threads);
    const char *ct = getenv("OPENBLAS_CORETYPE");
    printf("gemm_eval: M=%d, %d threads, %d repeats (median GFLOP/s), OPENBLAS_CORETYPE=%s\n", M,
           threads, reps, ct ? ct : "(unset)");
    double peak = ditd_cpu_fma_peak_gflops(threads, 1.0, NULL);
    printf("FMA peak (24 x zmm accumulators, %d threads): %.0f GFLOP/s\n", threads, peak);
    printf("%-42s", "library");
    for (int si = 0; si < NSHAPES; si++)
        printf(" %7s", shapes[si].name);
    printf(" %7s %6s\n", "all", "peak");

    size_t maxw = 0;
    for (int si = 0; si < NSHAPES; si++)
        if ((size_t)shapes[si].N * shapes[si].K > maxw)
            maxw = (size_t)shapes[si].N * shapes[si].K;
    float *x = aligned_alloc(64, (size_t)M * 4608 * 4);
    float *y = aligned_alloc(64, (size_t)M * 4608 * 4);
    fill(x, (size_t)M * 4608, 1);
    memset(y, 0, (size_t)M * 4608 * 4);
    float *w[NSHAPES];
    for (int si = 0; si < NSHAPES; si++) {
        size_t n = (size_t)shapes[si].N * shapes[si].K;
        w[si] = aligned_alloc(64, (n * 4 + 63) / 64 * 64);
        fill(w[si], n, 10 + si);
    }

    static const struct {
        const char *label, *path, *set_threads;
    } libs[] = {
        {"openblas", "/usr/lib/x86_64-linux-gnu/openblas-openmp/libopenblas.so.0",
         "openblas_set_num_threads"},
        {"blis", "/usr/lib/x86_64-linux-gnu/blis-openmp/libblis.so.4", "bli_thread_set_num_threads"},
    };
    for (size_t li = 0; li < sizeof libs / sizeof libs[0]; li++) {
        void *h = dlopen(libs[li].path, RTLD_NOW | RTLD_LOCAL);
        if (!h) {
            printf("%-42s (not installed)\n", libs[li].label);
            continue;
        }
        /* POSIX's idiom for function pointers from dlsym (ISO C has no cast) */
        blas_ctx c = {.x = x, .y = y, .M = M};
        *(void **)&c.sgemm = dlsym(h, "cblas_sgemm");
        void (*st)(int);
        *(void **)&st = dlsym(h, libs[li].set_threads);
        if (st)
            st(threads);
        char label[64];
        char *(*corename)(void);
        *(void **)&corename = dlsym(h, "openblas_get_corename");
        snprintf(label, sizeof label, "%s%s%s%s", libs[li].label, corename ? " (" : "",
                 corename ? corename() : "", corename ? ")" : "");
        memcpy(c.w, w, sizeof w);
        time_row(label, run_blas, &c, M, reps, peak);
    }

    dnnl_ctx c = {.x = x, .y = y, .M = M};
    memcpy(c.w, w, sizeof w);
    if (dnnl_engine_create(&c.eng, dnnl_cpu, 0) || dnnl_stream_create(&c.st, c.eng, dnnl_stream_default_flags))
        return 1;
    char label[64], impl[64];
    snprintf(label, sizeof label, "onednn sgemm (%s)", isa_name(dnnl_get_effective_cpu_isa()));
    time_row(label, run_dnnl_sgemm, &c, M, reps, peak);
    if (dnnl_build(&c, dnnl_f32, x, (void *const *)w, impl, sizeof impl))
        return 1;
    snprintf(label, sizeof label, "onednn matmul f32 (%s)", impl);
    time_row(label, run_dnnl_matmul, &c, M, reps, peak);
    dnnl_release(&c);

    uint16_t *xb = aligned_alloc(64, (size_t)M * 4608 * 2), *wb[NSHAPES];
    for (size_t i = 0; i < (size_t)M * 4608; i++)
        xb[i] = to_bf16(x[i]);
    for (int si = 0; si < NSHAPES; si++) {
        size_t n = (size_t)shapes[si].N * shapes[si].K;
        wb[si] = aligned_alloc(64, (n * 2 + 63) / 64 * 64);
        for (size_t i = 0; i < n; i++)
            wb[si][i] = to_bf16(w[si][i]);
    }
    if (dnnl_build(&c, dnnl_bf16, xb, (void *const *)wb, impl, sizeof impl))
        return 1;
    snprintf(label, sizeof label, "onednn matmul bf16 (%s)", impl);
    time_row(label, run_dnnl_matmul, &c, M, reps, peak);
    dnnl_release(&c);

    for (int bf16 = 0; bf16 < 2; bf16++) {
        if (!ditd_cpu_gemm_packs(bf16)) {
            printf("%-42s (this CPU does not run it)\n",
                   bf16 ? "ditd packed bf16" : "ditd packed f32");
            continue;
        }
        packed_ctx pc = {.x = x, .y = y, .M = M, .bf16 = bf16};
        for (int si = 0; si < NSHAPES; si++) {
            size_t n = (size_t)shapes[si].N * shapes[si].K, es = bf16 ? 2 : 4;
            void *copy = aligned_alloc(64, (n * es + 63) / 64 * 64);
            memcpy(copy, bf16 ? (void *)wb[si] : (void *)w[si], n * es);
            if (ditd_cpu_pack_weight(copy, bf16, shapes[si].N, shapes[si].K))
                return 1;
            pc.w[si] = copy;
        }
        time_row(bf16 ? "ditd packed bf16 (avx512_bf16, 6x64)" : "ditd packed f32 (avx512, 6x64)",
                 run_packed, &pc, M, reps, peak);
        for (int si = 0; si < NSHAPES; si++)
            free((void *)pc.w[si]);
    }
    return 0;
}
