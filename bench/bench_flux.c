/* Times the FLUX transformer's forward (engine/models/flux.h) on a model
 * folder: median milliseconds per forward over --reps runs after one
 * warm-up, with random inputs (timing does not depend on values). A
 * benchmark, not a test: it asserts nothing. bench/compare_flux.py runs it
 * beside Diffusers on the same folder.
 *
 *   bench_flux DIR --height H --width W --text L [--batch B] [--threads T] [--reps R]
 *   (H, W: latent size, even; the image is 8x that)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/backend/backend.h"
#include "engine/core/error.h"
#include "engine/core/philox.h"
#include "engine/models/flux.h"

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    const char *dir = NULL;
    int h = 64, w = 64, L = 512, B = 1, threads = 0, reps = 3, rc = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int v = i + 1 < argc ? atoi(argv[i + 1]) : 0;
        if (strcmp(a, "--height") == 0) h = v, i++;
        else if (strcmp(a, "--width") == 0) w = v, i++;
        else if (strcmp(a, "--text") == 0) L = v, i++;
        else if (strcmp(a, "--batch") == 0) B = v, i++;
        else if (strcmp(a, "--threads") == 0) threads = v, i++;
        else if (strcmp(a, "--reps") == 0) reps = v, i++;
        else if (a[0] != '-' && !dir) dir = a;
        else {
            fprintf(stderr, "unknown argument %s\n", a);
            return 2;
        }
    }
    if (!dir || reps < 1 || reps > 100) {
        fprintf(stderr, "usage: bench_flux DIR --height H --width W --text L [--batch B] [--threads T] [--reps R]\n");
        return 2;
    }
    const ditd_backend_ops *ops = &ditd_backend_cpu;
    int nt = ops->set_threads(threads);
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    ditd_flux_config cfg;
    ditd_flux *m = NULL;
    if (ditd_flux_config_load(path, &cfg) ||
        ditd_flux_new_mesh(&cfg, ops, B, h, w, L, dir, NULL, &m)) {
        fprintf(stderr, "bench_flux: %s\n", ditd_err_detail());
        return 1;
    }
    size_t nx = (size_t)B * (size_t)cfg.latent_channels * (size_t)h * (size_t)w;
    size_t ntext = (size_t)B * (size_t)L * (size_t)cfg.joint_attention_dim;
    float *x = malloc(nx * sizeof *x), *out = malloc(nx * sizeof *out);
    float *text = malloc(ntext * sizeof *text), *pooled = malloc((size_t)B * cfg.pooled_dim * sizeof *pooled);
    float *t = malloc((size_t)B * sizeof *t), *g = malloc((size_t)B * sizeof *g);
    double *ms = malloc((size_t)reps * sizeof *ms);
    if (!x || !out || !text || !pooled || !t || !g || !ms)
        goto done;
    ditd_philox_normal(1, 0, 0, nx, x);
    ditd_philox_normal(1, 1, 0, ntext, text);
    ditd_philox_normal(1, 2, 0, (size_t)B * cfg.pooled_dim, pooled);
    for (int b = 0; b < B; b++) {
        t[b] = 500.0f;
        g[b] = 3.5f;
    }
    for (int r = -1; r < reps; r++) {
        double t0 = now_ms();
        if (ditd_flux_forward(m, B, x, t, text, pooled, cfg.guidance_embeds ? g : NULL, out)) {
            fprintf(stderr, "bench_flux: %s\n", ditd_err_detail());
            goto done;
        }
        if (r >= 0)
            ms[r] = now_ms() - t0;
    }
    qsort(ms, (size_t)reps, sizeof *ms, cmp);
    printf("ditd flux: D %d, %d double + %d single blocks, latent %dx%d (%d image + %d text tokens), "
           "batch %d, %d threads: median %.1f ms per forward (%d reps)\n",
           cfg.inner_dim, cfg.num_layers, cfg.num_single_layers, w, h, m->N, L, B, nt,
           ms[reps / 2], reps);
    rc = 0;
done:
    free(x);
    free(out);
    free(text);
    free(pooled);
    free(t);
    free(g);
    free(ms);
    ditd_flux_free(m);
    return rc;
}
