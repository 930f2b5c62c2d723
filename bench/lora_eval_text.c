/* LoRA adapters on a text-conditioned model (a FluxPipeline folder): the
 * same prompt embeddings and initial latents through ditd's pipeline with
 * each adapter mix given on the command line, timed; one rank, float32.
 * tools/bench_lora_flux.py hands the same inputs to Diffusers. Not a test.
 *
 *   lora_eval_text MODEL_DIR IN_DIR OUT_PREFIX STEPS GUIDANCE REPEAT
 *                  [--lora NAME=PATH]... SPEC...
 *
 * IN_DIR holds noise.npy (N, C, h, w) float32 latents, emb.npy (N, T, Dt)
 * and pooled.npy (N, Dp). A SPEC is one batch: its samples separated by
 * ';', each sample's adapters by '+', each NAME or NAME:SCALE, '-' for a
 * sample without adapters. "-" is the base model, "a" one adapter, "a+b"
 * two on one image, "a;b;c;d" a batch of four images each with its own
 * adapter (images 0..3 of IN_DIR). The specs run REPEAT rounds, interleaved
 * within a round (load on a shared machine falls on all of them alike).
 * OUT_PREFIX<k>.npy gets spec k's final latents of the first round, and a
 * JSON line per spec gives the wall and CPU seconds of each round (the
 * denoising loop only), the samples and the steps. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/backend/backend.h"
#include "engine/core/error.h"
#include "engine/io/npy.h"
#include "engine/models/lora.h"
#include "engine/models/model.h"
#include "engine/pipeline/pipeline.h"

#define MAX_SPECS 16
#define MAX_ROUNDS 16
#define MAX_LORAS 8
#define MAX_BATCH 4

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

typedef struct spec {
    int n;                             /* samples in the batch */
    ditd_lora_set set[MAX_BATCH];
} spec;

/* The adapters loaded for the model, by name. */
typedef struct loaded {
    int n;
    char name[MAX_LORAS][64];
    ditd_lora_dev *dev[MAX_LORAS];
} loaded;

/* One sample's "a+b:0.5" (or "-") into s. */
static int parse_sample(const loaded *ld, char *txt, ditd_lora_set *s)
{
    memset(s, 0, sizeof *s);
    if (!strcmp(txt, "-"))
        return 0;
    for (char *save = NULL, *tok = strtok_r(txt, "+", &save); tok;
         tok = strtok_r(NULL, "+", &save)) {
        char *colon = strchr(tok, ':');
        float w = 1.0f;
        if (colon) {
            *colon = 0;
            w = (float)atof(colon + 1);
        }
        int k = 0;
        while (k < ld->n && strcmp(ld->name[k], tok))
            k++;
        if (k == ld->n || s->n == DITD_LORA_MAX_SET) {
            fprintf(stderr, "adapter '%s': not given with --lora (or too many)\n", tok);
            return -1;
        }
        s->ad[s->n] = ld->dev[k];
        s->weight[s->n++] = w;
    }
    return 0;
}

static int parse_spec(const loaded *ld, const char *arg, spec *sp)
{
    char buf[512];
    snprintf(buf, sizeof buf, "%s", arg);
    sp->n = 0;
    for (char *save = NULL, *tok = strtok_r(buf, ";", &save); tok;
         tok = strtok_r(NULL, ";", &save)) {
        if (sp->n == MAX_BATCH || parse_sample(ld, tok, &sp->set[sp->n])) {
            fprintf(stderr, "spec '%s': at most %d samples\n", arg, MAX_BATCH);
            return -1;
        }
        sp->n++;
    }
    return sp->n ? 0 : -1;
}

/* --lora NAME=PATH: opened and uploaded for p's denoiser. */
static int add_lora(ditd_pipeline *p, loaded *ld, const char *arg)
{
    const char *eq = strchr(arg, '=');
    ditd_lora *l = NULL;
    if (!eq || eq == arg || (size_t)(eq - arg) >= sizeof ld->name[0] || ld->n == MAX_LORAS) {
        fprintf(stderr, "--lora %s: NAME=PATH (at most %d)\n", arg, MAX_LORAS);
        return -1;
    }
    snprintf(ld->name[ld->n], sizeof ld->name[0], "%.*s", (int)(eq - arg), arg);
    if (ditd_lora_open(eq + 1, ld->name[ld->n], p->den->lora_targets, p->den->n_lora_targets,
                       &l) ||
        ditd_lora_dev_new(l, p->ops, p->den->lora_targets, p->den->n_lora_targets,
                          &ld->dev[ld->n])) {
        fprintf(stderr, "--lora %s: %s\n", arg, ditd_err_detail());
        ditd_lora_free(l);
        return -1;
    }
    ditd_lora_free(l);
    ld->n++;
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 8) {
        fprintf(stderr, "usage: %s MODEL_DIR IN_DIR OUT_PREFIX STEPS GUIDANCE REPEAT "
                        "[--lora NAME=PATH]... SPEC...\n", argv[0]);
        return 2;
    }
    const char *dir = argv[1], *in = argv[2], *prefix = argv[3];
    int steps = atoi(argv[4]), rounds = atoi(argv[6]);
    float guidance = (float)atof(argv[5]);
    if (rounds < 1 || rounds > MAX_ROUNDS || steps < 1) {
        fprintf(stderr, "STEPS >= 1, REPEAT 1..%d\n", MAX_ROUNDS);
        return 2;
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
        ditd_pipeline_new(&info, &ditd_backend_cpu, MAX_BATCH, &p) ||
        ditd_pipeline_set_size(p, h, w, T)) {
        fprintf(stderr, "%s: %s\n", dir, ditd_err_detail());
        return 1;
    }
    loaded ld = {0};
    spec specs[MAX_SPECS];
    const char *spec_arg[MAX_SPECS];
    int ns = 0;
    for (int i = 7; i < argc; i++) {
        if (!strcmp(argv[i], "--lora") && i + 1 < argc) {
            if (add_lora(p, &ld, argv[++i]))
                return 2;
        } else if (ns == MAX_SPECS || parse_spec(&ld, argv[i], &specs[ns])) {
            fprintf(stderr, "spec '%s' refused (at most %d specs)\n", argv[i], MAX_SPECS);
            return 2;
        } else if (specs[ns].n > N) {
            fprintf(stderr, "spec '%s': %d samples, IN_DIR has %d\n", argv[i], specs[ns].n, N);
            return 2;
        } else {
            spec_arg[ns++] = argv[i];
        }
    }
    if (!ns) {
        fprintf(stderr, "no SPEC\n");
        return 2;
    }
    float *lat = malloc((size_t)MAX_BATCH * numel * sizeof(float));
    float *keep = malloc((size_t)ns * MAX_BATCH * numel * sizeof(float));
    ditd_text_embeds te[MAX_BATCH];
    double wall[MAX_SPECS][MAX_ROUNDS], cpu[MAX_SPECS][MAX_ROUNDS];
    ditd_gen_params gp = {.steps = steps, .sampler = p->sched_base.kind};
    if (!lat || !keep)
        return 1;
    for (int i = 0; i < MAX_BATCH && i < N; i++) {
        te[i].seq = emb + (size_t)i * (size_t)T * (size_t)se[2];
        te[i].pooled = pooled + (size_t)i * (size_t)sp[1];
    }
    for (int r = 0; r < rounds; r++)
        for (int k = 0; k < ns; k++) {
            ditd_gen_sample smp[MAX_BATCH];
            for (int i = 0; i < specs[k].n; i++) {
                memset(&smp[i], 0, sizeof smp[i]);
                smp[i].guidance = guidance;
                smp[i].true_cfg = 1.0f;
                smp[i].cond.prompt = &te[i];
                smp[i].loras = specs[k].set[i].n ? &specs[k].set[i] : NULL;
            }
            double t0 = now(0), c0 = now(1);
            if (ditd_pipeline_generate(p, &gp, specs[k].n, smp, noise, lat, NULL, NULL, NULL)) {
                fprintf(stderr, "%s: %s\n", spec_arg[k], ditd_err_detail());
                return 1;
            }
            wall[k][r] = now(0) - t0;
            cpu[k][r] = now(1) - c0;
            if (r == 0)
                memcpy(keep + (size_t)k * MAX_BATCH * numel, lat,
                       (size_t)specs[k].n * numel * sizeof(float));
        }
    for (int k = 0; k < ns; k++) {
        char path[4096];
        int64_t shape[4] = {specs[k].n, C, h, w};
        snprintf(path, sizeof path, "%s%d.npy", prefix, k);
        if (ditd_npy_write_f32(path, 4, shape, keep + (size_t)k * MAX_BATCH * numel)) {
            fprintf(stderr, "%s: %s\n", path, ditd_err_detail());
            return 1;
        }
        printf("{\"spec\": \"%s\", \"file\": \"%s\", \"samples\": %d, \"steps\": %d, \"wall_s\": [",
               spec_arg[k], path, specs[k].n, steps);
        for (int r = 0; r < rounds; r++)
            printf("%s%.4f", r ? ", " : "", wall[k][r]);
        printf("], \"cpu_s\": [");
        for (int r = 0; r < rounds; r++)
            printf("%s%.4f", r ? ", " : "", cpu[k][r]);
        printf("]}\n");
        fflush(stdout);
    }
    for (int i = 0; i < ld.n; i++)
        ditd_lora_dev_free(ld.dev[i]);
    free(lat);
    free(keep);
    free(noise);
    free(emb);
    free(pooled);
    ditd_pipeline_free(p);
    ditd_model_info_free(&info);
    return 0;
}
