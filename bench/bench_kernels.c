/* Micro-benchmark of the CPU kernels at DiT-XL/2 shapes (not a test).
 *
 *   bench_kernels [-t THREADS] [-r REPEATS]
 *   bench_kernels -a N1,N2,... [-b B] [-H H] [-d DH] [-t THREADS] [-r REPEATS]
 *
 * Times ditd_cpu_linear (M = 512 rows = batch 2 x 256 tokens; the shapes of
 * DiT-XL/2's qkv/out, fc1 and fc2 layers) and ditd_cpu_attention (B = 2,
 * H = 16, Dh = 72 at 256 and 1024 tokens) and prints the median over the
 * repeats after one warm-up call, with GFLOP/s (and the minimum, which is
 * less sensitive to other work on a shared machine). Threads default to 2 (set
 * for OpenMP and for OpenBLAS, which shares the OpenMP runtime here).
 * OPENBLAS_CORETYPE is read from the environment, as found, and printed.
 * With -a only attention runs, at each token count given (B x N queries and
 * keys, H heads of Dh), one line "attention-row N ms gflops" each, for
 * bench/attention_torch.py to set beside PyTorch's SDPA.
 */
#include "engine/core/clock.h"
#include "kernels/cpu/cpu_kernels.h"

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* OpenBLAS extensions (declared in its cblas.h; repeated here so the bench
 * does not depend on which cblas.h is first on the include path). */
void openblas_set_num_threads(int num_threads);
char *openblas_get_corename(void);
char *openblas_get_config(void);

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
        a[i] = ((float)(s >> 8) * 0x1p-24f - 0.5f) * 0.2f + 1e-3f;
    }
}

static void *xmalloc(size_t bytes)
{
    void *p = malloc(bytes);
    if (!p) {
        fprintf(stderr, "out of memory\n");
        exit(2);
    }
    memset(p, 0, bytes); /* touch every page before timing */
    return p;
}

/* Sorts t; returns the median (t[0] is then the minimum). */
static double median(double *t, int n)
{
    qsort(t, (size_t)n, sizeof *t, cmp_double);
    return n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
}

static void bench_linear(int M, int N, int K, ditd_cpu_act act, const char *name, int reps)
{
    float *x = xmalloc(sizeof(float) * (size_t)M * K);
    float *w = xmalloc(sizeof(float) * (size_t)N * K);
    float *b = xmalloc(sizeof(float) * (size_t)N);
    float *y = xmalloc(sizeof(float) * (size_t)M * N);
    fill(x, (size_t)M * K, 1);
    fill(w, (size_t)N * K, 2);
    fill(b, (size_t)N, 3);
    double *t = xmalloc(sizeof(double) * (size_t)reps);
    ditd_cpu_linear(x, (size_t)K, w, b, y, (size_t)N, M, N, K, act); /* warm-up */
    for (int r = 0; r < reps; ++r) {
        const double t0 = ditd_now_ms();
        ditd_cpu_linear(x, (size_t)K, w, b, y, (size_t)N, M, N, K, act);
        t[r] = ditd_now_ms() - t0;
    }
    const double ms = median(t, reps);
    const double gflop = 2.0 * M * N * K * 1e-9;
    printf("linear    %-9s M=%4d N=%4d K=%4d %9.3f ms %7.1f GFLOP/s   (min %8.3f ms %7.1f)\n",
           name, M, N, K, ms, gflop / (ms * 1e-3), t[0], gflop / (t[0] * 1e-3));
    free(x);
    free(w);
    free(b);
    free(y);
    free(t);
}

static void bench_attention(int B, int N, int H, int Dh, int reps)
{
    /* Q, K, V as views into one fused (B, N, 3*H*Dh) projection output. */
    const size_t ld = 3 * (size_t)H * Dh, HD = (size_t)H * Dh;
    float *qkv = xmalloc(sizeof(float) * (size_t)B * N * ld);
    float *o = xmalloc(sizeof(float) * (size_t)B * N * HD);
    float *lse = xmalloc(sizeof(float) * (size_t)B * H * N);
    fill(qkv, (size_t)B * N * ld, 4);
    double *t = xmalloc(sizeof(double) * (size_t)reps);
    const float scale = 1.0f / sqrtf((float)Dh);
    ditd_cpu_attention(qkv, ld, qkv + HD, ld, qkv + 2 * HD, ld, o, HD, lse, B, N, N, H, Dh,
                       scale);
    for (int r = 0; r < reps; ++r) {
        const double t0 = ditd_now_ms();
        ditd_cpu_attention(qkv, ld, qkv + HD, ld, qkv + 2 * HD, ld, o, HD, lse, B, N, N, H, Dh,
                           scale);
        t[r] = ditd_now_ms() - t0;
    }
    const double ms = median(t, reps);
    const double gflop = 4.0 * B * H * (double)N * N * Dh * 1e-9; /* QK^T and PV */
    printf("attention B=%d N=%4d H=%d Dh=%d          %9.3f ms %7.1f GFLOP/s   (min %8.3f ms %7.1f)\n",
           B, N, H, Dh, ms, gflop / (ms * 1e-3), t[0], gflop / (t[0] * 1e-3));
    free(qkv);
    free(o);
    free(lse);
    free(t);
}

int main(int argc, char **argv)
{
    int threads = 2, reps = 15, ab = 1, ah = 16, ad = 72;
    const char *alist = NULL;
    for (int i = 1; i < argc; ++i) {
        if (!strcmp(argv[i], "-t") && i + 1 < argc)
            threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-r") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-a") && i + 1 < argc)
            alist = argv[++i];
        else if (!strcmp(argv[i], "-b") && i + 1 < argc)
            ab = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-H") && i + 1 < argc)
            ah = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-d") && i + 1 < argc)
            ad = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: %s [-t THREADS] [-r REPEATS]\n", argv[0]);
            return 2;
        }
    }
    if (threads < 1 || reps < 1) {
        fprintf(stderr, "threads and repeats must be >= 1\n");
        return 2;
    }
    omp_set_num_threads(threads);
    openblas_set_num_threads(threads);
    const char *ct = getenv("OPENBLAS_CORETYPE");
    printf("threads %d, repeats %d (median), OPENBLAS_CORETYPE=%s, OpenBLAS core %s\n", threads,
           reps, ct ? ct : "(unset)", openblas_get_corename());
    printf("OpenBLAS config: %s\n", openblas_get_config());

    if (alist) {
        if (ab < 1 || ah < 1 || ad < 1 || ad > DITD_CPU_ATTN_MAX_DH) {
            fprintf(stderr, "-b, -H >= 1; 1 <= -d <= %d\n", DITD_CPU_ATTN_MAX_DH);
            return 2;
        }
        for (const char *p = alist; *p;) {
            char *end;
            long n = strtol(p, &end, 10);
            if (end == p || n < 1 || n > 1 << 20) {
                fprintf(stderr, "-a: token counts, comma separated\n");
                return 2;
            }
            bench_attention(ab, (int)n, ah, ad, reps);
            p = *end == ',' ? end + 1 : end;
        }
        return 0;
    }
    const int M = 512; /* batch 2 x 256 tokens */
    bench_linear(M, 1152, 1152, DITD_CPU_ACT_NONE, "attn_out", reps);
    bench_linear(M, 3456, 1152, DITD_CPU_ACT_NONE, "qkv", reps);
    bench_linear(M, 4608, 1152, DITD_CPU_ACT_GELU_TANH, "fc1+gelu", reps);
    bench_linear(M, 1152, 4608, DITD_CPU_ACT_NONE, "fc2", reps);
    bench_attention(2, 256, 16, 72, reps);
    bench_attention(2, 1024, 16, 72, reps);
    return 0;
}
