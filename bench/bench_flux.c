/* Times the FLUX transformer's forward (engine/models/flux/flux.h) on a model
 * folder: median milliseconds per forward over --reps runs after one
 * warm-up, with random inputs (timing does not depend on values), and with
 * --blocks the milliseconds and GFLOP/s of one double and one single block.
 * Under mpirun (a layout: --ulysses, --ring, --tp) it also prints, per mesh
 * axis and collective, the calls and bytes ditd's comm layer counted
 * (engine/parallel/comm.h's statistics) beside the analytic bytes. A
 * benchmark, not a test: it asserts nothing. bench/compare_flux.py runs it
 * beside Diffusers on the same folder; docs/flux.md has the formulas.
 *
 *   bench_flux DIR --height H --width W --text L [--batch B] [--threads T] [--reps R]
 *              [--blocks] [--ulysses U] [--ring R] [--rotate allgather|p2p] [--tp T]
 *   (H, W: latent size, even; the image is 8x that)
 *
 * Per block (--blocks): the engine times whole forwards only, so each rep
 * runs four forwards of the same loaded model with the block counts the
 * forward loops over (m->cfg.num_layers, num_single_layers) set by this
 * program: as loaded (the whole forward), double blocks only, single
 * blocks only, none (embeddings and output layer). A double block's time
 * is (double only - none) / num_layers, a single's likewise. The weights
 * of the skipped blocks stay loaded; nothing else changes.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/backend/backend.h"
#include "engine/core/error.h"
#include "engine/core/philox.h"
#include "engine/models/flux/flux.h"
#include "engine/parallel/comm.h"
#include "engine/parallel/mesh.h"

#include "bench/bench_util.h"

enum { MODE_FULL, MODE_DOUBLE, MODE_SINGLE, MODE_NONE, MODE_COUNT };
static const char *const mode_name[MODE_COUNT] = {"forward", "double only", "single only", "none"};

/* FLOPs of one block over S = N + L tokens, batch B (2 per multiply-add;
 * GEMMs and the attention's two products only: norms, RoPE, GELU, softmax
 * and the residual adds are not counted):
 *   double: qkv 6SD^2 + attention 4S^2D + out 2SD^2 + MLP 4SDF, plus the two
 *           modulations 2*(2*6D^2) per sample
 *   single: qkv 6SD^2 + attention 4S^2D + proj_mlp 2SDF + proj_out 2SD(D+F),
 *           plus the modulation 2*3D^2 per sample
 * With F = 4D both are 24SD^2 + 4S^2D (+ the modulations). */
static double flops_double(double B, double S, double D, double F)
{
    return B * (6 * S * D * D + 4 * S * S * D + 2 * S * D * D + 4 * S * D * F + 24 * D * D);
}

static double flops_single(double B, double S, double D, double F)
{
    return B * (6 * S * D * D + 4 * S * S * D + 2 * S * D * F + 2 * S * D * (D + F) + 6 * D * D);
}

/* Logical bytes one rank sends (engine/parallel/comm.h's conventions) in one
 * double or single block (both have one joint attention) for an even split
 * of the N image + L text tokens over the cp ranks (each rank holds its
 * [text slice; image slice], as Diffusers' Flux _cp_plan; one rank and tp
 * alone keep the whole text), es bytes per element, per axis and
 * collective. The attention (cp_attention.c, split mode), S = N + L:
 *   ulysses alltoallv: q, k, v to the peers' heads and the output back,
 *     4 B n (H/T) Dh (U-1)/U,  n = S/(R U)
 *   ring: K and V of this ring chunk to R-1 peers, 2 B (S/R) (H/T)/U Dh
 *     (allgatherv, or sendrecv under p2p)
 * Tensor parallel all-reduces (payload x 2 (T-1)/T): double block
 *   to_out + ff.net.2 on the image tokens and to_add_out +
 *   ff_context.net.2 on the text tokens; single block proj_out on both
 *   (B, n, D) in all. */
static void analytic_block(const ditd_flux_config *c, const ditd_layout *l, int single, double B,
                           double N, double L, double es,
                           double out[DITD_AXIS_COUNT][DITD_COLL_COUNT])
{
    double D = c->inner_dim, Dh = c->head_dim, T = l->tp, U = l->ulysses, R = l->ring;
    double Hl = (double)c->num_heads / T, S = N + L, n = S / (R * U);
    memset(out, 0, sizeof(double) * DITD_AXIS_COUNT * DITD_COLL_COUNT);
    out[DITD_AXIS_ULYSSES][DITD_COLL_ALLTOALLV] = 4 * B * n * Hl * Dh * (U - 1) / U * es;
    out[DITD_AXIS_RING][l->rotate == DITD_RING_P2P ? DITD_COLL_SENDRECV : DITD_COLL_ALLGATHERV] =
        2 * B * (S / R) * (Hl / U) * Dh * (R - 1) * es;
    out[DITD_AXIS_TP][DITD_COLL_ALLREDUCE] = (single ? 1 : 2) * B * n * D * es * 2 * (T - 1) / T;
}

int main(int argc, char **argv)
{
    const char *dir = NULL;
    int h = 64, w = 64, L = 512, B = 1, threads = 0, reps = 3, blocks = 0, rc = 1, use_mpi;
    ditd_layout lay = DITD_LAYOUT_SINGLE;
    ditd_comm *world = NULL;
    ditd_mesh *mesh = NULL;
    ditd_flux *m = NULL;
    float *x = NULL, *out = NULL, *text = NULL, *pooled = NULL, *t = NULL, *g = NULL;
    double *ms = NULL;

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int v = i + 1 < argc ? atoi(argv[i + 1]) : 0;
        if (strcmp(a, "--height") == 0) h = v, i++;
        else if (strcmp(a, "--width") == 0) w = v, i++;
        else if (strcmp(a, "--text") == 0) L = v, i++;
        else if (strcmp(a, "--batch") == 0) B = v, i++;
        else if (strcmp(a, "--threads") == 0) threads = v, i++;
        else if (strcmp(a, "--reps") == 0) reps = v, i++;
        else if (strcmp(a, "--ulysses") == 0) lay.ulysses = v, i++;
        else if (strcmp(a, "--ring") == 0) lay.ring = v, i++;
        else if (strcmp(a, "--tp") == 0) lay.tp = v, i++;
        else if (strcmp(a, "--blocks") == 0) blocks = 1;
        else if (strcmp(a, "--rotate") == 0 && i + 1 < argc) {
            if (ditd_ring_rotate_from_str(argv[++i], &lay.rotate)) {
                fprintf(stderr, "--rotate %s: not allgather or p2p\n", argv[i]);
                return 2;
            }
        } else if (a[0] != '-' && !dir) dir = a;
        else {
            fprintf(stderr, "unknown argument %s\n", a);
            return 2;
        }
    }
    if (!dir || reps < 1 || reps > 100) {
        fprintf(stderr, "usage: bench_flux DIR --height H --width W --text L [--batch B] [--threads T] "
                        "[--reps R] [--blocks] [--ulysses U] [--ring R] [--rotate allgather|p2p] [--tp T]\n");
        return 2;
    }
    use_mpi = ditd_layout_size(&lay) > 1 || ditd_comm_launched_by_mpi();
    if (use_mpi) {
        int err = ditd_comm_mpi_init(&argc, &argv);
        if (!err)
            err = ditd_comm_mpi_world(&world);
        if (!err)
            err = ditd_mesh_new(world, &lay, &mesh);
        if (err) {
            fprintf(stderr, "bench_flux: %s\n", ditd_err_detail());
            goto done;
        }
    }
    int leader = !mesh || ditd_mesh_is_leader(mesh);
    const ditd_backend_ops *ops = &ditd_backend_cpu;
    int nt = ops->set_threads(threads);
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    ditd_flux_config cfg;
    if (ditd_flux_config_load(path, &cfg) ||
        ditd_flux_new_mesh(&cfg, ops, B, h, w, L, dir, mesh, &m)) {
        fprintf(stderr, "bench_flux: %s\n", ditd_err_detail());
        goto done;
    }
    size_t nx = (size_t)B * (size_t)cfg.latent_channels * (size_t)h * (size_t)w;
    size_t ntext = (size_t)B * (size_t)L * (size_t)cfg.joint_attention_dim;
    x = malloc(nx * sizeof *x), out = malloc(nx * sizeof *out);
    text = malloc(ntext * sizeof *text), pooled = malloc((size_t)B * cfg.pooled_dim * sizeof *pooled);
    t = malloc((size_t)B * sizeof *t), g = malloc((size_t)B * sizeof *g);
    ms = malloc((size_t)MODE_COUNT * (size_t)reps * sizeof *ms);
    if (!x || !out || !text || !pooled || !t || !g || !ms) {
        fprintf(stderr, "bench_flux: out of memory\n");
        goto done;
    }
    ditd_philox_normal(1, 0, 0, nx, x);
    ditd_philox_normal(1, 1, 0, ntext, text);
    ditd_philox_normal(1, 2, 0, (size_t)B * cfg.pooled_dim, pooled);
    for (int b = 0; b < B; b++) {
        t[b] = 500.0f;
        g[b] = 3.5f;
    }

    int nd = cfg.num_layers, ns = cfg.num_single_layers, nmodes = blocks ? MODE_COUNT : 1;
    bench_stats st[MODE_COUNT];
    double comm_ms[MODE_COUNT] = {0};
    for (int r = -1; r < reps; r++)
        for (int md = 0; md < nmodes; md++) {
            m->cfg.num_layers = md == MODE_FULL || md == MODE_DOUBLE ? nd : 0;
            m->cfg.num_single_layers = md == MODE_FULL || md == MODE_SINGLE ? ns : 0;
            if (mesh) {
                ditd_mesh_stats_reset(mesh);
                ditd_comm_barrier(mesh->group);
            }
            double t0 = bench_now_ms();
            int err = ditd_flux_forward(m, B, x, t, text, pooled, cfg.guidance_embeds ? g : NULL, out);
            if (!err)
                err = ops->status();
            if (err) {
                fprintf(stderr, "bench_flux: %s\n", ditd_err_detail());
                goto done;
            }
            double dt = bench_now_ms() - t0;
            if (r < 0)
                continue;
            ms[md * reps + r] = dt;
            stats_take(mesh, &st[md]); /* every rep sends the same bytes */
            comm_ms[md] += st[md].ms / reps;
        }
    m->cfg.num_layers = nd;
    m->cfg.num_single_layers = ns;

    double med[MODE_COUNT] = {0};
    for (int md = 0; md < nmodes; md++)
        med[md] = median(ms + md * reps, reps);
    int R = lay.ring, U = lay.ulysses;
    if (leader) {
        printf("ditd flux: D %d, %d double + %d single blocks, latent %dx%d (%d image + %d text tokens), "
               "batch %d, %d threads x %d ranks (ulysses %d, ring %d %s, tp %d): median %.1f ms per "
               "forward (%d reps)\n",
               cfg.inner_dim, nd, ns, w, h, m->N, L, B, nt, mesh ? mesh->size : 1, U, R,
               ditd_ring_rotate_name(lay.rotate), lay.tp, med[MODE_FULL], reps);
        printf("rank 0 memory: weights %.1f MB, activations %.1f MB (planned arenas, %s)\n",
               (double)ditd_flux_weight_bytes(m) / 1e6, (double)ditd_flux_act_bytes(m) / 1e6,
               ditd_dtype_name(ops->act_dtype));
        if (mesh)
            printf("rank 0 inside collectives: %.1f ms per forward (mean)\n", comm_ms[MODE_FULL]);
    }
    if (blocks && leader) {
        double S = (double)m->N + L, D = cfg.inner_dim, F = cfg.mlp_dim;
        double fd = flops_double(B, S, D, F), fs = flops_single(B, S, D, F);
        double td = nd ? (med[MODE_DOUBLE] - med[MODE_NONE]) / nd : 0;
        double ts = ns ? (med[MODE_SINGLE] - med[MODE_NONE]) / ns : 0;
        printf("\n| forwards | ms (median of %d) |\n|---|---|\n", reps);
        for (int md = 0; md < MODE_COUNT; md++)
            printf("| %s | %.1f |\n", mode_name[md], med[md]);
        printf("\n| block | GFLOP (analytic) | ms | GFLOP/s (all ranks) |\n|---|---|---|---|\n");
        printf("| double | %.1f | %.1f | %.1f |\n| single | %.1f | %.1f | %.1f |\n", fd / 1e9, td,
               td > 0 ? fd / td / 1e6 : 0, fs / 1e9, ts, ts > 0 ? fs / ts / 1e6 : 0);
        /* for bench/compare_flux.py */
        printf("\nblock ms: double %.2f single %.2f\n", td, ts);
    }
    if (mesh && leader) {
        /* per block: the double-only (single-only) forward's bytes minus the
         * bare forward's; measured from the last rep of each */
        double es = (double)ditd_dtype_size(ops->act_dtype);
        double an_d[DITD_AXIS_COUNT][DITD_COLL_COUNT], an_s[DITD_AXIS_COUNT][DITD_COLL_COUNT];
        analytic_block(&cfg, &lay, 0, B, m->N, L, es, an_d);
        analytic_block(&cfg, &lay, 1, B, m->N, L, es, an_s);
        double an_final = (double)B * ((double)m->N / (R * U)) * cfg.out_channels * es * (R * U - 1);
        printf("\n| axis | collective | calls/forward | MB/forward measured | MB/forward analytic |%s\n",
               blocks ? " MB/double block measured | analytic | MB/single block measured | analytic |" : "");
        printf("|---|---|---|---|---|%s\n", blocks ? "---|---|---|---|" : "");
        for (int a = 0; a < DITD_AXIS_COUNT; a++)
            for (int k = 0; k < DITD_COLL_COUNT; k++) {
                double an = nd * an_d[a][k] + ns * an_s[a][k];
                if (a == DITD_AXIS_CP && k == DITD_COLL_ALLGATHERV)
                    an += an_final;
                if (!st[MODE_FULL].calls[a][k] && an == 0)
                    continue;
                printf("| %s | %s | %llu | %.3f | %.3f |", ditd_mesh_axis_name((ditd_mesh_axis)a),
                       ditd_coll_name((ditd_coll)k),
                       (unsigned long long)st[MODE_FULL].calls[a][k],
                       (double)st[MODE_FULL].bytes[a][k] / 1e6, an / 1e6);
                if (blocks) {
                    double base = (double)st[MODE_NONE].bytes[a][k];
                    printf(" %.3f | %.3f | %.3f | %.3f |",
                           nd ? ((double)st[MODE_DOUBLE].bytes[a][k] - base) / nd / 1e6 : 0,
                           an_d[a][k] / 1e6,
                           ns ? ((double)st[MODE_SINGLE].bytes[a][k] - base) / ns / 1e6 : 0,
                           an_s[a][k] / 1e6);
                }
                printf("\n");
            }
        printf("\n(rank 0's logical bytes sent, engine/parallel/comm.h; %.0f bytes per element)\n", es);
    }
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
    ditd_mesh_free(mesh);
    ditd_comm_free(world);
    if (use_mpi)
        ditd_comm_mpi_finalize();
    return rc;
}
