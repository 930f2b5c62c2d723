/* FluxKontextPipeline's denoising loop on a model folder (a
 * FluxKontextPipeline folder): given prompt embeddings, initial noise and a
 * reference's latents, timed per step and per request; one rank, float32.
 * tools/bench_kontext_flux.py hands the same inputs to Diffusers. Not a test.
 *
 *   kontext_eval MODEL_DIR IN_DIR OUT.npy STEPS GUIDANCE REPEAT
 *
 * IN_DIR holds noise.npy (1, C, h, w), ref.npy (1, C, rh, rw) (the
 * reference's latents, as ditd_gen_sample.ref_latents takes them), emb.npy
 * (1, T, Dt) and pooled.npy (1, Dp). OUT.npy gets the final latents of the
 * first round; one JSON line per round gives the request's wall seconds (the
 * denoising loop: every step's forward on [noise tokens, reference tokens],
 * the sampler) and each step's. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/backend/backend.h"
#include "engine/core/error.h"
#include "engine/io/npy.h"
#include "engine/models/model.h"
#include "engine/pipeline/pipeline.h"

#define MAX_STEPS 64

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
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

typedef struct clock_steps {
    double last, step[MAX_STEPS];
    int n;
} clock_steps;

static int on_step(void *ud, int step, int total, const float *x0, uint8_t *active)
{
    clock_steps *c = ud;
    double t = now();
    (void)total, (void)x0, (void)active;
    if (step - 1 < MAX_STEPS)
        c->step[step - 1] = t - c->last;
    c->last = t;
    c->n = step;
    return 0;
}

int main(int argc, char **argv)
{
    if (argc != 7) {
        fprintf(stderr, "usage: %s MODEL_DIR IN_DIR OUT.npy STEPS GUIDANCE REPEAT\n", argv[0]);
        return 2;
    }
    const char *dir = argv[1], *in = argv[2], *out_path = argv[3];
    int steps = atoi(argv[4]), rounds = atoi(argv[6]);
    float guidance = (float)atof(argv[5]);
    if (steps < 1 || steps > MAX_STEPS || rounds < 1) {
        fprintf(stderr, "STEPS 1..%d, REPEAT >= 1\n", MAX_STEPS);
        return 2;
    }
    int64_t sn[4], sr[4], se[4], sp[4];
    float *noise = load(in, "noise.npy", 4, sn), *ref = load(in, "ref.npy", 4, sr),
          *emb = load(in, "emb.npy", 3, se), *pooled = load(in, "pooled.npy", 2, sp);
    if (!noise || !ref || !emb || !pooled || sn[0] != 1 || sr[0] != 1 || sr[1] != sn[1])
        return 2;
    const int h = (int)sn[2], w = (int)sn[3], T = (int)se[1];
    const size_t numel = (size_t)sn[1] * (size_t)h * (size_t)w;
    ditd_model_info info;
    ditd_pipeline *p = NULL;
    if (ditd_model_info_load(dir, &info) || ditd_pipeline_new(&info, &ditd_backend_cpu, 1, &p) ||
        ditd_pipeline_set_size(p, h, w, T) ||
        ditd_pipeline_set_reference(p, (int)sr[2], (int)sr[3])) {
        fprintf(stderr, "%s: %s\n", dir, ditd_err_detail());
        return 1;
    }
    float *out = malloc(numel * sizeof *out);
    if (!out)
        return 1;
    ditd_text_embeds te = {.seq = emb, .pooled = pooled};
    ditd_gen_sample smp = {.guidance = guidance, .ref_latents = ref};
    smp.cond.prompt = &te;
    ditd_gen_params gp = {.steps = steps, .sampler = p->sched_base.kind};
    for (int r = 0; r < rounds; r++) {
        clock_steps cs = {.last = now()};
        double t0 = cs.last;
        if (ditd_pipeline_generate(p, &gp, 1, &smp, noise, out, NULL, on_step, &cs)) {
            fprintf(stderr, "generate: %s\n", ditd_err_detail());
            return 1;
        }
        double wall = now() - t0;
        if (r == 0) {
            int64_t shape[4] = {1, sn[1], h, w};
            if (ditd_npy_write_f32(out_path, 4, shape, out)) {
                fprintf(stderr, "%s: %s\n", out_path, ditd_err_detail());
                return 1;
            }
        }
        printf("{\"round\": %d, \"wall_s\": %.6f, \"steps_s\": [", r, wall);
        for (int i = 0; i < cs.n && i < MAX_STEPS; i++)
            printf("%s%.6f", i ? ", " : "", cs.step[i]);
        printf("]}\n");
        fflush(stdout);
    }
    ditd_pipeline_free(p);
    ditd_model_info_free(&info);
    free(out), free(noise), free(ref), free(emb), free(pooled);
    return 0;
}
