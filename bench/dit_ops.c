/* Where a DiT forward's time goes on the CPU, op by op (not a test).
 *
 *   dit_ops [--config DiT-XL/2] [--tokens 256] [--batch 2] [--threads 2]
 *           [--dtype f32|bf16] [--iters 3]
 *
 * Runs the forward of a random-weight model through a copy of the CPU ops
 * table whose every op is wrapped with a wall-clock timer, and prints, per op
 * (the linears split by their (N, K) shape and whether M is a batch or all
 * tokens), the milliseconds per forward (median over the iterations after one
 * warm-up), the share of the forward, and for the GEMMs and the attention the
 * GFLOP/s, beside the FMA peak measured in the same process. What the ops do
 * not cover (the model's own host code) shows as "outside the ops". A
 * benchmark: it asserts nothing. docs/cpu.md says what it found.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/core/clock.h"
#include "engine/backend/backend.h"
#include "engine/core/error.h"
#include "engine/core/philox.h"
#include "engine/models/dit/dit.h"
#include "engine/models/dit/dit_config.h"

#define MAX_KEYS 48
#define MAX_ITERS 32

typedef struct op_row {
    char name[64];
    double flops;            /* per call */
    double ms[MAX_ITERS + 1]; /* per iteration, summed over calls */
    int calls;               /* over all forwards, the warm-up included */
} op_row;

static op_row g_rows[MAX_KEYS];
static int g_nrows, g_iter;
static const ditd_backend_ops *g_base;

static op_row *row(const char *name, double flops)
{
    for (int i = 0; i < g_nrows; i++)
        if (strcmp(g_rows[i].name, name) == 0)
            return &g_rows[i];
    if (g_nrows == MAX_KEYS) /* more distinct ops than a DiT has: pooled in the last row */
        return &g_rows[MAX_KEYS - 1];
    op_row *r = &g_rows[g_nrows++];
    snprintf(r->name, sizeof r->name, "%s", name);
    r->flops = flops;
    return r;
}

static void add(op_row *r, double t0)
{
    r->ms[g_iter] += ditd_now_ms() - t0;
    r->calls++;
}

static void w_linear(const void *x, size_t ldx, const void *w, const void *b, void *y, size_t ldy,
                     int M, int N, int K, ditd_act act)
{
    char name[64];
    snprintf(name, sizeof name, "linear %s M=%s N=%d K=%d", act == DITD_ACT_NONE ? "" : ditd_act_name(act),
             M <= 16 ? "B" : "tokens", N, K);
    op_row *r = row(name, 2.0 * M * N * K);
    double t0 = ditd_now_ms();
    g_base->linear(x, ldx, w, b, y, ldy, M, N, K, act);
    add(r, t0);
}

static void w_attention(const void *q, size_t ldq, const void *k, size_t ldk, const void *v,
                        size_t ldv, void *o, size_t ldo, float *lse, int B, int Nq, int Nk, int H,
                        int Dh, float scale)
{
    op_row *r = row("attention", 4.0 * B * H * (double)Nq * Nk * Dh);
    double t0 = ditd_now_ms();
    g_base->attention(q, ldq, k, ldk, v, ldv, o, ldo, lse, B, Nq, Nk, H, Dh, scale);
    add(r, t0);
}

static void w_layernorm_modulate(const void *x, void *y, int B, int N, int D, float eps,
                                 const void *shift, const void *scale, size_t ld_mod)
{
    op_row *r = row("layernorm_modulate", 0);
    double t0 = ditd_now_ms();
    g_base->layernorm_modulate(x, y, B, N, D, eps, shift, scale, ld_mod);
    add(r, t0);
}

static void w_gated_residual(void *h, const void *y, int B, int N, int D, const void *gate,
                             size_t ld_gate)
{
    op_row *r = row("gated_residual", 0);
    double t0 = ditd_now_ms();
    g_base->gated_residual(h, y, B, N, D, gate, ld_gate);
    add(r, t0);
}

static void w_act(const void *x, void *y, size_t n, ditd_act act)
{
    op_row *r = row("act (B rows)", 0);
    double t0 = ditd_now_ms();
    g_base->act(x, y, n, act);
    add(r, t0);
}

static void w_add(void *y, const void *x, size_t n)
{
    op_row *r = row("add (B rows)", 0);
    double t0 = ditd_now_ms();
    g_base->add(y, x, n);
    add(r, t0);
}

static void w_embedding(const void *table, const int64_t *h_ids, void *out, int B, int D)
{
    op_row *r = row("embedding", 0);
    double t0 = ditd_now_ms();
    g_base->embedding(table, h_ids, out, B, D);
    add(r, t0);
}

static void w_timestep_embed(const float *h_t, void *out, int B, int dim)
{
    op_row *r = row("timestep_embed", 0);
    double t0 = ditd_now_ms();
    g_base->timestep_embed(h_t, out, B, dim);
    add(r, t0);
}

static void w_patch_embed(const void *x, const void *w, const void *b, const void *pos, void *y,
                          void *scratch, int B, int C, int Hi, int Wi, int p, int D)
{
    op_row *r = row("patch_embed", 0);
    double t0 = ditd_now_ms();
    g_base->patch_embed(x, w, b, pos, y, scratch, B, C, Hi, Wi, p, D);
    add(r, t0);
}

static void w_unpatchify(const void *x, void *y, int B, int C, int h, int w, int p)
{
    op_row *r = row("unpatchify", 0);
    double t0 = ditd_now_ms();
    g_base->unpatchify(x, y, B, C, h, w, p);
    add(r, t0);
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(const double *v, int n)
{
    double t[MAX_ITERS];
    memcpy(t, v, (size_t)n * sizeof *t);
    qsort(t, (size_t)n, sizeof *t, cmp);
    return n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
}

int main(int argc, char **argv)
{
    const char *config = "DiT-XL/2", *dtype = "f32";
    int tokens = 256, B = 2, threads = 2, iters = 3, rc = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : "";
        if (strcmp(a, "--config") == 0) config = v, i++;
        else if (strcmp(a, "--dtype") == 0) dtype = v, i++;
        else if (strcmp(a, "--tokens") == 0) tokens = atoi(v), i++;
        else if (strcmp(a, "--batch") == 0) B = atoi(v), i++;
        else if (strcmp(a, "--threads") == 0) threads = atoi(v), i++;
        else if (strcmp(a, "--iters") == 0) iters = atoi(v), i++;
        else {
            fprintf(stderr, "usage: dit_ops [--config NAME] [--tokens N] [--batch B] [--threads T] "
                            "[--dtype f32|bf16] [--iters K]\n");
            return 2;
        }
    }
    int side = (int)lround(sqrt((double)tokens));
    if (side * side != tokens || B < 1 || B > 64 || iters < 1 || iters > MAX_ITERS) {
        fprintf(stderr, "dit_ops: --tokens must be a square, --iters 1..%d, --batch 1..64\n", MAX_ITERS);
        return 2;
    }
    const ditd_backend_ops *base = ditd_backend_for_weights(&ditd_backend_cpu, dtype, DITD_DTYPE_F32);
    if (!base) {
        fprintf(stderr, "dit_ops: %s\n", ditd_err_detail());
        return 2;
    }
    g_base = base;
    ditd_backend_ops ops = *base;
    ops.linear = w_linear;
    ops.attention = w_attention;
    ops.layernorm_modulate = w_layernorm_modulate;
    ops.gated_residual = w_gated_residual;
    ops.act = w_act;
    ops.add = w_add;
    ops.embedding = w_embedding;
    ops.timestep_embed = w_timestep_embed;
    ops.patch_embed = w_patch_embed;
    ops.unpatchify = w_unpatchify;
    int nt = ops.set_threads(threads);

    ditd_dit_config cfg;
    ditd_dit *m = NULL;
    if (ditd_dit_config_named(config, 2 * side, &cfg)) {
        fprintf(stderr, "dit_ops: %s\n", ditd_err_detail());
        return 2;
    }
    if (side * cfg.patch_size != cfg.sample_size) {
        cfg.sample_size = side * cfg.patch_size;
        if (ditd_dit_config_finish(&cfg, config)) {
            fprintf(stderr, "dit_ops: %s\n", ditd_err_detail());
            return 2;
        }
    }
    if (ditd_dit_new_random(&cfg, &ops, B, 1234, &m)) {
        fprintf(stderr, "dit_ops: %s\n", ditd_err_detail());
        return 1;
    }
    size_t nx = (size_t)B * cfg.in_channels * cfg.sample_size * cfg.sample_size;
    size_t no = (size_t)B * cfg.out_channels * cfg.sample_size * cfg.sample_size;
    float *x = malloc(nx * sizeof *x), *out = malloc(no * sizeof *out), t[64];
    int64_t y[64];
    double total[MAX_ITERS + 1] = {0};
    if (!x || !out) {
        fprintf(stderr, "dit_ops: out of memory for the input and output\n");
        goto done;
    }
    ditd_philox_normal(7, 0, 0, nx, x);
    for (int b = 0; b < B; b++) {
        t[b] = 500.0f;
        y[b] = b % 1000;
    }
    double peak = ditd_backend_cpu_fma_peak(nt, 0.2, NULL);
    for (int it = 0; it <= iters; it++) {
        g_iter = it;
        for (int i = 0; i < g_nrows; i++)
            g_rows[i].ms[it] = 0;
        double t0 = ditd_now_ms();
        if (ditd_dit_forward(m, B, x, t, y, out)) {
            fprintf(stderr, "dit_ops: %s\n", ditd_err_detail());
            goto done;
        }
        total[it] = ditd_now_ms() - t0;
    }
    double peak2 = ditd_backend_cpu_fma_peak(nt, 0.2, NULL);
    if (peak2 > peak)
        peak = peak2;
    double tot = median(total + 1, iters), flops = ditd_dit_config_flops(&cfg, B, m->N), in_ops = 0;
    printf("%s, %d tokens, batch %d, %d threads, %s weights; FMA peak %.1f GFLOP/s\n", config,
           m->N, B, nt, dtype, peak);
    printf("forward: %.1f ms (median of %d), %.1f GFLOP/s, %.0f%% of peak\n\n", tot, iters,
           flops / tot / 1e6, 100.0 * flops / tot / 1e6 / peak);
    printf("| op | ms/forward | share | GFLOP/s | %% of peak |\n|---|---|---|---|---|\n");
    for (int i = 0; i < g_nrows; i++) {
        op_row *r = &g_rows[i];
        double ms = median(r->ms + 1, iters);
        in_ops += ms;
        printf("| %s | %.2f | %.1f%% |", r->name, ms, 100.0 * ms / tot);
        if (r->flops > 0) {
            int calls = r->calls / (iters + 1);
            double gf = r->flops * calls / ms / 1e6;
            printf(" %.1f (%d calls) | %.0f%% |\n", gf, calls, 100.0 * gf / peak);
        } else {
            printf(" | |\n");
        }
    }
    printf("| outside the ops | %.2f | %.1f%% | | |\n", tot - in_ops, 100.0 * (tot - in_ops) / tot);
    rc = 0;
done:
    free(x);
    free(out);
    ditd_dit_free(m);
    return rc;
}
