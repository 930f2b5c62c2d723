/* Step caching on a text-conditioned model (a FluxPipeline folder): the
 * same prompt embeddings and initial latents through ditd's pipeline with
 * each cache given on the command line, one image per batch (as one
 * request), on one rank or as one rank of a group (the layout flags of
 * tests/mpi/mpi_args.h under mpirun: the path `mpirun -np 2 ditd generate
 * --ulysses-degree 2` takes). tools/bench_cache_flux.py hands the same
 * inputs to Diffusers' hooks. Not a test.
 *
 *   cache_eval_text MODEL_DIR IN_DIR OUT_PREFIX STEPS GUIDANCE REPEAT
 *                   [--ulysses U --ring R --tp T --cfg C --rotate M] SPEC...
 *
 * IN_DIR holds noise.npy (N, C, h, w) float32 latents, emb.npy (N, T, Dt)
 * and pooled.npy (N, Dp). Every SPEC ("none" or a --cache specification)
 * runs the N images, REPEAT rounds, the specs interleaved within a round
 * (load on a shared machine falls on all of them alike). Rank 0 writes
 * OUT_PREFIX<k>.npy, the final latents (N, C, h, w) of spec k's first
 * round), and prints a JSON line per spec: the wall and (rank 0's) CPU
 * seconds of each round (the denoising loops only), steps and block
 * evaluations skipped. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/backend/backend.h"
#include "engine/core/error.h"
#include "engine/io/npy.h"
#include "engine/models/model.h"
#include "engine/parallel/comm.h"
#include "engine/parallel/mesh.h"
#include "engine/pipeline/pipeline.h"
#include "engine/pipeline/step_cache.h"
#include "tests/mpi/mpi_args.h"

#define MAX_SPECS 16
#define MAX_ROUNDS 16

static double now(int cpu)
{
    struct timespec ts;
    clock_gettime(cpu ? CLOCK_PROCESS_CPUTIME_ID : CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static float *load(const char *dir, const char *name, int want_nd, int64_t *sh)
{
    char path[4200];
    float *d = NULL;
    int nd = 0;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    if (ditd_npy_read_f32(path, 4, &nd, sh, &d) || nd != want_nd) {
        fprintf(stderr, "%s: %s\n", path, nd != want_nd ? "wrong rank" : ditd_err_detail());
        free(d);
        return NULL;
    }
    return d;
}

int main(int argc, char **argv)
{
    if (argc < 8) {
        fprintf(stderr, "usage: %s MODEL_DIR IN_DIR OUT_PREFIX STEPS GUIDANCE REPEAT "
                        "[layout] SPEC...\n", argv[0]);
        return 2;
    }
    const char *dir = argv[1], *in = argv[2], *prefix = argv[3];
    int steps = atoi(argv[4]), rounds = atoi(argv[6]);
    float guidance = (float)atof(argv[5]);
    /* the layout flags, then the specs */
    const char *specs[MAX_SPECS];
    char *largv[16] = {argv[0]};
    int ns = 0, nl = 1;
    for (int i = 7; i < argc; i++) {
        if (argv[i][0] == '-' && argv[i][1] == '-' && i + 1 < argc && nl + 2 < 16) {
            largv[nl++] = argv[i];
            largv[nl++] = argv[++i];
        } else if (ns < MAX_SPECS) {
            specs[ns++] = argv[i];
        }
    }
    ditd_layout l = DITD_LAYOUT_SINGLE;
    if (tm_parse_layout(nl, largv, &l, NULL, NULL))
        return 2;
    if (rounds < 1 || rounds > MAX_ROUNDS || ns == 0) {
        fprintf(stderr, "REPEAT 1..%d and at least one SPEC\n", MAX_ROUNDS);
        return 2;
    }
    ditd_comm *world = NULL;
    ditd_mesh *mesh = NULL;
    int rank = 0, G = l.cfg * l.ring * l.ulysses * l.tp;
    if (G > 1) {
        if (ditd_comm_mpi_init(&argc, &argv) || ditd_comm_mpi_world(&world) ||
            ditd_mesh_new(world, &l, &mesh)) {
            fprintf(stderr, "group: %s\n", ditd_err_detail());
            return 1;
        }
        rank = ditd_comm_rank(world);
    }
    int64_t sn[4], se[4], sp[4];
    float *noise = load(in, "noise.npy", 4, sn), *emb = load(in, "emb.npy", 3, se),
          *pooled = load(in, "pooled.npy", 2, sp);
    if (!noise || !emb || !pooled || se[0] != sn[0] || sp[0] != sn[0])
        return 2;
    int N = (int)sn[0], C = (int)sn[1], h = (int)sn[2], w = (int)sn[3], T = (int)se[1];
    size_t numel = (size_t)C * (size_t)h * (size_t)w;
    ditd_model_info info;
    ditd_pipeline *p = NULL;
    if (ditd_model_info_load(dir, &info) ||
        (mesh ? ditd_pipeline_new_group(&info, &ditd_backend_cpu, 1, mesh, &p)
              : ditd_pipeline_new(&info, &ditd_backend_cpu, 1, &p)) ||
        ditd_pipeline_set_size(p, h, w, T)) {
        fprintf(stderr, "%s: %s\n", dir, ditd_err_detail());
        return 1;
    }
    ditd_cache_config cfg[MAX_SPECS];
    for (int k = 0; k < ns; k++)
        if (ditd_cache_config_parse(specs[k], &cfg[k])) {
            fprintf(stderr, "%s: %s\n", specs[k], ditd_err_detail());
            return 2;
        }
    float *lat = malloc(numel * sizeof(float));
    float *keep = malloc((size_t)ns * (size_t)N * numel * sizeof(float));
    double wall[MAX_SPECS][MAX_ROUNDS], cpu[MAX_SPECS][MAX_ROUNDS];
    long st_sk[MAX_SPECS] = {0}, st[MAX_SPECS] = {0}, ev[MAX_SPECS] = {0}, ev_sk[MAX_SPECS] = {0};
    ditd_gen_params gp = {.steps = steps, .sampler = p->sched_base.kind};
    for (int r = 0; r < rounds; r++)
        for (int k = 0; k < ns; k++) {
            if (ditd_pipeline_set_cache(p, &cfg[k])) {
                fprintf(stderr, "%s: %s\n", specs[k], ditd_err_detail());
                return 2;
            }
            wall[k][r] = cpu[k][r] = 0;
            for (int i = 0; i < N; i++) {
                ditd_text_embeds te = {.seq = emb + (size_t)i * (size_t)T * (size_t)se[2],
                                       .pooled = pooled + (size_t)i * (size_t)sp[1]};
                ditd_gen_sample smp = {.guidance = guidance, .true_cfg = 1.0f};
                smp.cond.prompt = &te;
                double t0 = now(0), c0 = now(1);
                if (ditd_pipeline_generate(p, &gp, 1, &smp, noise + (size_t)i * numel, lat, NULL,
                                           NULL, NULL)) {
                    fprintf(stderr, "%s: %s\n", specs[k], ditd_err_detail());
                    return 1;
                }
                wall[k][r] += now(0) - t0;
                cpu[k][r] += now(1) - c0;
                if (r == 0) {
                    ditd_cache_stats cs;
                    ditd_pipeline_cache_stats(p, 0, &cs);
                    st[k] += cs.steps, st_sk[k] += cs.steps_skipped;
                    ev[k] += cs.evals, ev_sk[k] += cs.evals_skipped;
                    memcpy(keep + ((size_t)k * N + (size_t)i) * numel, lat, numel * sizeof(float));
                }
            }
        }
    for (int k = 0; k < ns && rank == 0; k++) {
        char path[4096];
        int64_t shape[4] = {N, C, h, w};
        snprintf(path, sizeof path, "%s%d.npy", prefix, k);
        if (ditd_npy_write_f32(path, 4, shape, keep + (size_t)k * N * numel)) {
            fprintf(stderr, "%s: %s\n", path, ditd_err_detail());
            return 1;
        }
        printf("{\"spec_index\": %d, \"file\": \"%s\", \"ranks\": %d, \"wall_s\": [", k, path, G);
        for (int r = 0; r < rounds; r++)
            printf("%s%.4f", r ? ", " : "", wall[k][r]);
        printf("], \"cpu_s\": [");
        for (int r = 0; r < rounds; r++)
            printf("%s%.4f", r ? ", " : "", cpu[k][r]);
        printf("], \"images\": %d, \"steps\": %ld, \"steps_skipped\": %ld, \"evals\": %ld, "
               "\"evals_skipped\": %ld}\n",
               N, st[k], st_sk[k], ev[k], ev_sk[k]);
        fflush(stdout);
    }
    free(lat);
    free(keep);
    free(noise);
    free(emb);
    free(pooled);
    ditd_pipeline_free(p);
    ditd_model_info_free(&info);
    if (mesh)
        ditd_mesh_free(mesh);
    if (world) {
        ditd_comm_free(world);
        ditd_comm_mpi_finalize();
    }
    return 0;
}
