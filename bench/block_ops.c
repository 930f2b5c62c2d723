/* Where one FLUX double / single block's or one SD3 joint block's time goes
 * on the CPU, op by op (a benchmark, not a test: it asserts nothing).
 *
 *   block_ops flux|sd3 DIR --height H --width W --text L [--threads T]
 *             [--dtype f32|bf16] [--iters K] [--cpu-time]
 *   (DIR: a FluxTransformer2DModel / SD3Transformer2DModel folder, config.json +
 *    safetensors; H, W: the latent size)
 *
 * The model is loaded through a copy of the CPU ops table whose every op the
 * blocks call is wrapped with a wall-clock timer, keyed by the op and its
 * shape (a linear by M, N, K and its activation; an attention by its query
 * and key lengths). Each iteration runs one forward per mode: FLUX "double"
 * (the double blocks only, num_single_layers set to 0), "single", and "none"
 * (no block: embeddings and the output layer); SD3 "block 0" (every block but
 * 0 skipped, skip-layer list), "block 1" and "none". A block's row is the
 * mode's time for that key less the none mode's (so the embeddings and the
 * output layer drop out), median over the iterations after one warm-up; a
 * GEMM's and an attention's GFLOP/s is its FLOPs (2 per multiply-add) over
 * that. What the ops do not cover (the model's own host code) shows as
 * "outside the ops". The whole block beside the table: the mode's forward
 * less the none forward. docs/flux.md and docs/sd3.md say what it found.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/backend/backend.h"
#include "engine/core/error.h"
#include "engine/core/philox.h"
#include "engine/models/flux/flux.h"
#include "engine/models/flux/flux_config.h"
#include "engine/models/sd3/sd3.h"
#include "engine/models/sd3/sd3_config.h"

static double clock_ms(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* --cpu-time: the process's CPU time (every thread's) divided by the
 * threads, i.e. wall time as if the process had its cores to itself; on a
 * machine shared by more runnable threads than cores this is far less noisy
 * than wall time (it still counts an OpenMP thread spinning at a barrier,
 * and a co-runner's cache traffic still slows an op down). */
static int g_cpu_time, g_threads = 1;

static double op_ms(void)
{
    if (g_cpu_time)
        return clock_ms(CLOCK_PROCESS_CPUTIME_ID) / g_threads;
    return clock_ms(CLOCK_MONOTONIC);
}

#define MAX_KEYS 96
#define MAX_ITERS 16
#define NMODES 3

typedef struct op_row {
    char name[72];
    double flops;                    /* per call */
    double ms[NMODES][MAX_ITERS + 1]; /* per mode and iteration, summed over calls */
    int calls[NMODES];               /* per forward of the mode (the last one) */
    int cur_calls;
} op_row;

static op_row g_rows[MAX_KEYS];
static int g_nrows, g_iter, g_mode;
static const ditd_backend_ops *g_base;

static op_row *row(const char *name, double flops)
{
    for (int i = 0; i < g_nrows; i++)
        if (strcmp(g_rows[i].name, name) == 0)
            return &g_rows[i];
    if (g_nrows == MAX_KEYS) /* more distinct ops than a block has: pooled in the last row */
        return &g_rows[MAX_KEYS - 1];
    op_row *r = &g_rows[g_nrows++];
    snprintf(r->name, sizeof r->name, "%s", name);
    r->flops = flops;
    return r;
}

static void add(op_row *r, double t0)
{
    r->ms[g_mode][g_iter] += op_ms() - t0;
    r->cur_calls++;
}

static void w_linear(const void *x, size_t ldx, const void *w, const void *b, void *y, size_t ldy,
                     int M, int N, int K, ditd_act act)
{
    char name[72];
    snprintf(name, sizeof name, "linear%s%s M=%d N=%d K=%d", act == DITD_ACT_NONE ? "" : " ",
             act == DITD_ACT_NONE ? "" : ditd_act_name(act), M, N, K);
    op_row *r = row(name, 2.0 * M * N * K);
    double t0 = op_ms();
    g_base->linear(x, ldx, w, b, y, ldy, M, N, K, act);
    add(r, t0);
}

static void w_attention(const void *q, size_t ldq, const void *k, size_t ldk, const void *v,
                        size_t ldv, void *o, size_t ldo, float *lse, int B, int Nq, int Nk, int H,
                        int Dh, float scale)
{
    char name[72];
    snprintf(name, sizeof name, "attention Nq=%d Nk=%d", Nq, Nk);
    op_row *r = row(name, 4.0 * B * H * (double)Nq * Nk * Dh);
    double t0 = op_ms();
    g_base->attention(q, ldq, k, ldk, v, ldv, o, ldo, lse, B, Nq, Nk, H, Dh, scale);
    add(r, t0);
}

static void w_attention_merge(void *o_acc, size_t ldo_acc, float *lse_acc, const void *o_blk,
                              size_t ldo_blk, const float *lse_blk, int B, int Nq, int H, int Dh)
{
    char name[72];
    snprintf(name, sizeof name, "attention_merge Nq=%d", Nq);
    op_row *r = row(name, 0);
    double t0 = op_ms();
    g_base->attention_merge(o_acc, ldo_acc, lse_acc, o_blk, ldo_blk, lse_blk, B, Nq, H, Dh);
    add(r, t0);
}

static void w_layernorm_modulate(const void *x, void *y, int B, int N, int D, float eps,
                                 const void *shift, const void *scale, size_t ld_mod)
{
    char name[72];
    snprintf(name, sizeof name, "layernorm_modulate N=%d", N);
    op_row *r = row(name, 0);
    double t0 = op_ms();
    g_base->layernorm_modulate(x, y, B, N, D, eps, shift, scale, ld_mod);
    add(r, t0);
}

static void w_gated_residual(void *h, const void *y, int B, int N, int D, const void *gate,
                             size_t ld_gate)
{
    char name[72];
    snprintf(name, sizeof name, "gated_residual N=%d", N);
    op_row *r = row(name, 0);
    double t0 = op_ms();
    g_base->gated_residual(h, y, B, N, D, gate, ld_gate);
    add(r, t0);
}

static void w_rope(void *x, size_t ld, const void *cos, const void *sin, int B, int N, int H,
                   int Dh)
{
    char name[72];
    snprintf(name, sizeof name, "rope N=%d", N);
    op_row *r = row(name, 0);
    double t0 = op_ms();
    g_base->rope(x, ld, cos, sin, B, N, H, Dh);
    add(r, t0);
}

static void w_rmsnorm_heads(void *x, size_t ld, const void *w, int rows, int H, int Dh, float eps)
{
    char name[72];
    snprintf(name, sizeof name, "rmsnorm_heads rows=%d", rows);
    op_row *r = row(name, 0);
    double t0 = op_ms();
    g_base->rmsnorm_heads(x, ld, w, rows, H, Dh, eps);
    add(r, t0);
}

static void w_copy2d(void *dst, size_t ldd, const void *src, size_t lds, size_t rows, size_t cols)
{
    char name[72];
    snprintf(name, sizeof name, "copy2d %zux%zu", rows, cols);
    op_row *r = row(name, 0);
    double t0 = op_ms();
    g_base->copy2d(dst, ldd, src, lds, rows, cols);
    add(r, t0);
}

static void w_act(const void *x, void *y, size_t n, ditd_act act)
{
    op_row *r = row("act", 0);
    double t0 = op_ms();
    g_base->act(x, y, n, act);
    add(r, t0);
}

static void w_add(void *y, const void *x, size_t n)
{
    op_row *r = row("add", 0);
    double t0 = op_ms();
    g_base->add(y, x, n);
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
    const char *family = argc > 1 ? argv[1] : "", *dir = NULL, *dtype = "f32";
    int h = 64, w = 64, L = 512, threads = 2, iters = 3, rc = 1, sd3;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : "";
        if (strcmp(a, "--height") == 0) h = atoi(v), i++;
        else if (strcmp(a, "--width") == 0) w = atoi(v), i++;
        else if (strcmp(a, "--text") == 0) L = atoi(v), i++;
        else if (strcmp(a, "--threads") == 0) threads = atoi(v), i++;
        else if (strcmp(a, "--iters") == 0) iters = atoi(v), i++;
        else if (strcmp(a, "--dtype") == 0) dtype = v, i++;
        else if (strcmp(a, "--cpu-time") == 0) g_cpu_time = 1;
        else if (a[0] != '-' && !dir) dir = a;
        else dir = NULL, i = argc;
    }
    sd3 = strcmp(family, "sd3") == 0;
    if ((!sd3 && strcmp(family, "flux") != 0) || !dir || iters < 1 || iters > MAX_ITERS) {
        fprintf(stderr, "usage: block_ops flux|sd3 DIR --height H --width W --text L [--threads T] "
                        "[--dtype f32|bf16] [--iters 1..%d] [--cpu-time]\n", MAX_ITERS);
        return 2;
    }
    const ditd_backend_ops *base = ditd_backend_for_weights(&ditd_backend_cpu, dtype, DITD_DTYPE_F32);
    if (!base) {
        fprintf(stderr, "block_ops: %s\n", ditd_err_detail());
        return 2;
    }
    g_base = base;
    ditd_backend_ops ops = *base;
    ops.linear = w_linear;
    ops.attention = w_attention;
    ops.attention_merge = w_attention_merge;
    ops.layernorm_modulate = w_layernorm_modulate;
    ops.gated_residual = w_gated_residual;
    ops.rope = w_rope;
    ops.rmsnorm_heads = w_rmsnorm_heads;
    ops.copy2d = w_copy2d;
    ops.act = w_act;
    ops.add = w_add;
    int nt = ops.set_threads(threads);
    g_threads = nt > 0 ? nt : 1;

    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    ditd_flux_config fc;
    ditd_sd3_config sc;
    ditd_flux *fm = NULL;
    ditd_sd3 *sm = NULL;
    int err = sd3 ? ditd_sd3_config_load(path, &sc) : ditd_flux_config_load(path, &fc);
    if (!err)
        err = sd3 ? ditd_sd3_new_mesh(&sc, &ops, 1, h, w, L, dir, NULL, &sm)
                  : ditd_flux_new_mesh(&fc, &ops, 1, h, w, L, dir, NULL, &fm);
    if (err) {
        fprintf(stderr, "block_ops: %s\n", ditd_err_detail());
        return 1;
    }
    int C = sd3 ? sc.in_channels : fc.latent_channels, Dt = sd3 ? sc.joint_attention_dim
                                                                : fc.joint_attention_dim;
    int Dp = sd3 ? sc.pooled_dim : fc.pooled_dim, Co = sd3 ? sc.out_channels : fc.latent_channels;
    int N = sd3 ? sm->N : fm->N;
    size_t nx = (size_t)C * h * w, no = (size_t)Co * h * w, nt_ = (size_t)L * Dt;
    float *x = malloc(nx * sizeof *x), *out = malloc((no > nx ? no : nx) * sizeof *out);
    float *text = malloc(nt_ * sizeof *text), *pooled = malloc((size_t)Dp * sizeof *pooled);
    float t = 500.0f, g = 3.5f;
    double total[NMODES][MAX_ITERS + 1];
    if (!x || !out || !text || !pooled) {
        fprintf(stderr, "block_ops: out of memory for the inputs\n");
        goto done;
    }
    ditd_philox_normal(1, 0, 0, nx, x);
    ditd_philox_normal(1, 1, 0, nt_, text);
    ditd_philox_normal(1, 2, 0, (size_t)Dp, pooled);
    int nd = sd3 ? 0 : fc.num_layers, ns = sd3 ? 0 : fc.num_single_layers;
    int nl = sd3 ? sc.num_layers : 0;
    if (sd3 && nl != 2) {
        fprintf(stderr, "block_ops sd3: the folder must have 2 joint blocks (it has %d)\n", nl);
        goto done;
    }
    if (!sd3 && (nd < 1 || ns < 1)) {
        fprintf(stderr, "block_ops flux: the folder needs a double and a single block\n");
        goto done;
    }
    static const char *const flux_modes[NMODES] = {"double", "single", "none"};
    static const char *const sd3_modes[NMODES] = {"block 0 (joint)", "block 1 (context_pre_only)",
                                                  "none"};
    for (int it = 0; it <= iters; it++)
        for (int md = 0; md < NMODES; md++) {
            g_iter = it, g_mode = md;
            for (int i = 0; i < g_nrows; i++)
                g_rows[i].ms[md][it] = 0, g_rows[i].cur_calls = 0;
            double t0 = op_ms();
            if (sd3) {
                static const int skip_for[NMODES][2] = {{1, 0}, {0, 1}, {0, 1}};
                err = ditd_sd3_forward(sm, 1, x, &t, text, pooled, skip_for[md], md == 2 ? 2 : 1,
                                       out);
            } else {
                fm->cfg.num_layers = md == 0 ? nd : 0;
                fm->cfg.num_single_layers = md == 1 ? ns : 0;
                err = ditd_flux_forward(fm, 1, x, &t, text, pooled, fc.guidance_embeds ? &g : NULL,
                                        out);
            }
            if (err) {
                fprintf(stderr, "block_ops: %s\n", ditd_err_detail());
                goto done;
            }
            total[md][it] = op_ms() - t0;
            for (int i = 0; i < g_nrows; i++)
                g_rows[i].calls[md] = g_rows[i].cur_calls;
        }
    if (!sd3)
        fm->cfg.num_layers = nd, fm->cfg.num_single_layers = ns;

    int D = sd3 ? sc.inner_dim : fc.inner_dim;
    printf("%s: D %d, %d image + %d text tokens, %d threads, %s weights, median of %d iterations "
           "after a warm-up, %s\n", sd3 ? "SD3" : "FLUX", D, N, L, nt, dtype, iters,
           g_cpu_time ? "process CPU time / threads" : "wall time");
    const char *const *names = sd3 ? sd3_modes : flux_modes;
    double none_med = median(total[2] + 1, iters);
    for (int md = 0; md < 2; md++) {
        double blk = median(total[md] + 1, iters) - none_med, in_ops = 0, gemm = 0, gemm_f = 0;
        printf("\n%s: %.1f ms per block (its forward less the bare forward)\n\n", names[md], blk);
        printf("| op | calls | ms | share | GFLOP/s |\n|---|---|---|---|---|\n");
        for (int i = 0; i < g_nrows; i++) {
            op_row *r = &g_rows[i];
            int calls = r->calls[md] - r->calls[2];
            if (calls <= 0)
                continue;
            double d[MAX_ITERS];
            for (int it = 1; it <= iters; it++)
                d[it - 1] = r->ms[md][it] - r->ms[2][it];
            double ms = median(d, iters);
            in_ops += ms;
            printf("| %s | %d | %.1f | %.1f%% |", r->name, calls, ms, 100.0 * ms / blk);
            if (r->flops > 0) {
                printf(" %.1f |\n", r->flops * calls / ms / 1e6);
                if (strncmp(r->name, "linear", 6) == 0)
                    gemm += ms, gemm_f += r->flops * calls;
            } else {
                printf(" |\n");
            }
        }
        printf("| outside the ops | | %.1f | %.1f%% | |\n", blk - in_ops, 100.0 * (blk - in_ops) / blk);
        printf("| (all linears) | | %.1f | %.1f%% | %.1f |\n", gemm, 100.0 * gemm / blk,
               gemm > 0 ? gemm_f / gemm / 1e6 : 0);
    }
    rc = 0;
done:
    free(x);
    free(out);
    free(text);
    free(pooled);
    ditd_flux_free(fm);
    ditd_sd3_free(sm);
    return rc;
}
