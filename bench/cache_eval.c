/* Step caching on a class-conditional model (the embedded fashion-dit): N
 * images per class, one image per batch (as one request), with and without
 * each cache given on the command line; writes every run's 8-bit pixels as
 * float .npy (classes, N, H, W) for tools/eval_cache.py, which scores them
 * with the project's classifier, and prints per run: wall and CPU time
 * (the CPU time is what a shared machine measures fairly), steps and
 * block evaluations skipped. DITD_CACHE_EVAL_BATCH=B runs B images of a
 * class per batch instead (each keeps its own state: the blocks run when
 * any of them computes). DITD_CACHE_EVAL_NOISE=FILE.npy gives the initial
 * latents, float32 (classes, N, C, H, W) (image j of class c is row c N + j),
 * instead of each seed's noise: tools/bench_cache.py hands the same noise to
 * Diffusers. Not a test.
 *
 *   cache_eval MODEL_DIR OUT_PREFIX N SEED STEPS GUIDANCE SPEC...
 *     SPEC: "none" or a --cache specification (engine/pipeline/step_cache.h);
 *     writes OUT_PREFIX<k>.npy for the k-th SPEC; a mag_cache calibrate run
 *     prints the ratios (mean over the images) for mag_ratios=. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/backend/backend.h"
#include "engine/core/error.h"
#include "engine/io/npy.h"
#include "engine/models/model.h"
#include "engine/pipeline/pipeline.h"
#include "engine/pipeline/step_cache.h"

#define BMAX 16

static double now(int cpu)
{
    struct timespec ts;
    clock_gettime(cpu ? CLOCK_PROCESS_CPUTIME_ID : CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* s as the inside of a JSON string (backslashes and quotes escaped) */
static void json_str(const char *s)
{
    for (; *s; s++) {
        if (*s == '\\' || *s == '"')
            putchar('\\');
        putchar(*s);
    }
}

int main(int argc, char **argv)
{
    if (argc < 8) {
        fprintf(stderr, "usage: %s MODEL_DIR OUT_PREFIX N SEED STEPS GUIDANCE SPEC...\n", argv[0]);
        return 2;
    }
    const char *dir = argv[1], *prefix = argv[2];
    int N = atoi(argv[3]), steps = atoi(argv[5]);
    uint64_t seed = strtoull(argv[4], NULL, 10);
    float guidance = (float)atof(argv[6]);
    ditd_model_info info;
    ditd_pipeline *p = NULL;
    if (ditd_model_info_load(dir, &info) ||
        ditd_pipeline_new(&info, &ditd_backend_cpu, BMAX, &p)) {
        fprintf(stderr, "%s: %s\n", dir, ditd_err_detail());
        return 1;
    }
    int K = info.num_classes > 0 ? info.num_classes : 10;
    int C = p->shapes.in_channels, H = p->shapes.height, W = p->shapes.width;
    size_t numel = (size_t)C * H * W;
    const char *be = getenv("DITD_CACHE_EVAL_BATCH");
    int Bt = be ? atoi(be) : 1;
    if (Bt < 1 || Bt > BMAX || N % Bt) {
        fprintf(stderr, "DITD_CACHE_EVAL_BATCH %d: 1..%d, dividing N\n", Bt, BMAX);
        return 2;
    }
    float *lat = malloc(BMAX * numel * sizeof(float)), *pix = malloc((size_t)K * N * H * W * sizeof(float));
    uint8_t *u8 = malloc(numel);
    float *noise = NULL;
    const char *nf = getenv("DITD_CACHE_EVAL_NOISE");
    if (nf) {
        int64_t sh[5];
        int nd = 0;
        if (ditd_npy_read_f32(nf, 5, &nd, sh, &noise)) {
            fprintf(stderr, "%s: %s\n", nf, ditd_err_detail());
            return 1;
        }
        if (nd != 5 || sh[0] != K || sh[1] != N || sh[2] * sh[3] * sh[4] != (int64_t)numel) {
            fprintf(stderr, "%s: want (%d, %d, %d, %d, %d)\n", nf, K, N, C, H, W);
            return 2;
        }
    }
    ditd_gen_sample smp[BMAX];
    for (int k = 7; k < argc; k++) {
        ditd_cache_config cfg;
        if (ditd_cache_config_parse(argv[k], &cfg)) {
            fprintf(stderr, "%s: %s\n", argv[k], ditd_err_detail());
            return 2;
        }
        ditd_gen_params gp = {.steps = steps, .sampler = p->sched_base.kind};
        if (ditd_pipeline_set_cache(p, &cfg)) {
            fprintf(stderr, "%s: %s\n", argv[k], ditd_err_detail());
            return 2;
        }
        long ev = 0, ev_sk = 0, st = 0, st_sk = 0;
        double *cal = calloc((size_t)steps + 1, sizeof(double));
        int ncal = 0;
        double t0 = now(0), c0 = now(1);
        for (int c = 0; c < K; c++)
            for (int j0 = 0; j0 < N; j0 += Bt) {
                for (int b = 0; b < Bt; b++) {
                    smp[b] = (ditd_gen_sample){.seed = seed + (uint64_t)(j0 + b), .index = 0,
                                               .guidance = guidance};
                    smp[b].cond.class_id = c;
                }
                const float *x0 = noise ? noise + ((size_t)c * (size_t)N + (size_t)j0) * numel : NULL;
                if (ditd_pipeline_generate(p, &gp, Bt, smp, x0, lat, NULL, NULL, NULL)) {
                    fprintf(stderr, "%s: %s\n", argv[k], ditd_err_detail());
                    return 1;
                }
                for (int b = 0; b < Bt; b++) {
                    ditd_cache_stats cs;
                    ditd_pipeline_cache_stats(p, b, &cs);
                    int nr = 0; /* mag_cache calibrate: the mean ratio per step over the images */
                    const float *r = ditd_step_cache_calibration(p->scache, b, 0, &nr);
                    for (int q = 0; q < nr && q <= steps; q++)
                        cal[q] += r[q] / (double)(K * N);
                    ncal = nr;
                    ev += cs.evals, ev_sk += cs.evals_skipped, st += cs.steps,
                        st_sk += cs.steps_skipped;
                    ditd_pipeline_to_pixels(lat + (size_t)b * numel, C, H, W, u8);
                    for (size_t i = 0; i < (size_t)H * W; i++) /* first channel */
                        pix[((size_t)c * N + (size_t)(j0 + b)) * H * W + i] = u8[i * (size_t)C];
                }
            }
        double wall = now(0) - t0, cpu = now(1) - c0;
        char path[4096];
        int64_t shape[4] = {K, N, H, W};
        snprintf(path, sizeof path, "%s%d.npy", prefix, k - 7);
        if (ditd_npy_write_f32(path, 4, shape, pix)) {
            fprintf(stderr, "%s: %s\n", path, ditd_err_detail());
            return 1;
        }
        printf("{\"spec\": \"");
        json_str(argv[k]);
        printf("\", \"file\": \"%s\", \"wall_s\": %.4f, \"cpu_s\": %.4f, \"images\": %d, "
               "\"steps\": %ld, \"steps_skipped\": %ld, \"evals\": %ld, \"evals_skipped\": %ld, "
               "\"calibration\": [",
               path, wall, cpu, K * N, st, st_sk, ev, ev_sk);
        for (int q = 0; q < ncal; q++)
            printf("%s%.6f", q ? ", " : "", cal[q]);
        printf("]}\n");
        free(cal);
        fflush(stdout);
    }
    free(noise);
    free(lat);
    free(pix);
    free(u8);
    ditd_pipeline_free(p);
    ditd_model_info_free(&info);
    return 0;
}
