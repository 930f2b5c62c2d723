/* Times LoRA's unmerged term (the backend's lora op, docs/lora.md) beside
 * the linear it adapts, on the CPU table: median milliseconds over --reps of
 * ops->linear (packed weights, as the models run it) and of ops->lora at
 * ranks 16 and 64, for a FLUX.1-shaped linear (N = K = 3072 by default).
 * A benchmark, not a test: it asserts nothing.
 *
 *   bench_lora [--rows M] [--n N] [--k K] [--threads T] [--reps R]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/core/clock.h"
#include "engine/backend/backend.h"
#include "engine/core/philox.h"

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static float *rnd(size_t n, uint64_t id, float s)
{
    float *p = malloc(n * sizeof *p);
    if (!p) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    ditd_philox_normal(26, id, 0, n, p);
    for (size_t i = 0; i < n; i++)
        p[i] *= s;
    return p;
}

int main(int argc, char **argv)
{
    int M = 1024, N = 3072, K = 3072, threads = 0, reps = 5;
    for (int i = 1; i + 1 < argc; i += 2) {
        int v = atoi(argv[i + 1]);
        if (!strcmp(argv[i], "--rows")) M = v;
        else if (!strcmp(argv[i], "--n")) N = v;
        else if (!strcmp(argv[i], "--k")) K = v;
        else if (!strcmp(argv[i], "--threads")) threads = v;
        else if (!strcmp(argv[i], "--reps")) reps = v;
        else {
            fprintf(stderr, "usage: bench_lora [--rows M] [--n N] [--k K] [--threads T] [--reps R]\n");
            return 2;
        }
    }
    if (reps < 1 || reps > 100 || M < 1 || N < 1 || K < 1)
        return 2;
    const ditd_backend_ops *ops = &ditd_backend_cpu;
    int t = ops->set_threads(threads);
    float *x = rnd((size_t)M * K, 1, 1.0f), *w = rnd((size_t)N * K, 2, 0.02f);
    float *y = rnd((size_t)M * N, 3, 1.0f);
    if (ditd_pack_linear(ops, w, N, K))
        return 1;
    double *ms = malloc((size_t)reps * sizeof *ms), base = 0;
    printf("CPU %s, %d threads; x (%d, %d), linear (%d, %d)\n", ditd_backend_cpu_gemm_info(), t,
           M, K, N, K);
    for (int which = 0; which < 3; which++) {
        int r = which == 0 ? 0 : which == 1 ? 16 : 64;
        float *a = r ? rnd((size_t)r * K, 4, 0.02f) : NULL, *b = r ? rnd((size_t)N * r, 5, 0.02f) : NULL;
        float *tmp = r ? malloc((size_t)M * r * sizeof *tmp) : NULL;
        for (int k = 0; k <= reps; k++) {
            double t0 = ditd_now_ms();
            if (r)
                ops->lora(x, (size_t)K, a, b, 1.0f, y, (size_t)N, M, N, K, r, tmp, DITD_ACT_NONE);
            else
                ops->linear(x, (size_t)K, w, NULL, y, (size_t)N, M, N, K, DITD_ACT_NONE);
            if (k) /* the first is a warm-up */
                ms[k - 1] = ditd_now_ms() - t0;
        }
        qsort(ms, (size_t)reps, sizeof *ms, cmp);
        double med = ms[reps / 2];
        if (!r) {
            base = med;
            printf("linear            %9.3f ms  %7.1f GFLOP/s\n", med,
                   2.0 * M * N * K / med / 1e6);
        } else {
            printf("lora rank %-3d     %9.3f ms  %7.1f GFLOP/s  %5.1f%% of the linear "
                   "(flops: %.1f%%)\n",
                   r, med, 2.0 * M * (double)r * (N + K) / med / 1e6, 100 * med / base,
                   100.0 * r * (N + K) / ((double)N * K));
        }
        free(a), free(b), free(tmp);
    }
    free(x), free(w), free(y), free(ms);
    return 0;
}
