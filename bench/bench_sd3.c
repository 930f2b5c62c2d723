/* Times the SD3 transformer's forward (engine/models/sd3/sd3.h) on a model
 * folder: median milliseconds per forward over --reps runs after one
 * warm-up, random inputs (timing does not depend on values), and with
 * --blocks the milliseconds and GFLOP/s of one joint block and of the last
 * (context_pre_only) block. Under mpirun (a layout: --ulysses, --ring,
 * --tp, --cfg) it also prints, per mesh axis and collective, the calls and
 * bytes ditd's comm layer counted (engine/parallel/comm.h's statistics)
 * beside the analytic bytes. A benchmark, not a test: it asserts nothing.
 * bench/compare_sd3.py runs it beside Diffusers on the same folder;
 * docs/sd3.md has the formulas and the results.
 *
 *   bench_sd3 DIR --height H --width W --text L [--batch B] [--threads T] [--reps R]
 *             [--dtype f32|bf16] [--blocks] [--ulysses U] [--ring R]
 *             [--rotate allgather|p2p] [--tp T] [--cfg 2] [--cpu-time]
 *   (H, W: latent size, multiples of the patch; the image is 8x that)
 *
 * --cfg 2 is the pipeline's layout (engine/pipeline/pipeline.c
 * run_forwards): the batch B (the conditional and unconditional rows of
 * classifier-free guidance) is halved, cfg rank 0 runs the first B/2 rows
 * and rank 1 the rest, then the outputs are all-gathered over the cfg axis;
 * this program does the same around each forward (the gather is timed with
 * it and counted on the cfg axis).
 *
 * Per block (--blocks): the engine times whole forwards only, so each rep
 * runs four forwards of the loaded model with a skip-layer list (the
 * forward's own skip_layers) set by this program: none skipped (the whole
 * forward), all but the first block, all but the last, all (embeddings and
 * output layer). A joint block is (first only - all skipped), the last
 * block (last only - all skipped).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/backend/backend.h"
#include "engine/core/error.h"
#include "engine/core/philox.h"
#include "engine/models/sd3/sd3.h"
#include "engine/models/sd3/sd3_config.h"
#include "engine/parallel/comm.h"
#include "engine/parallel/mesh.h"

#include "bench/bench_util.h"

enum { MODE_FULL, MODE_FIRST, MODE_LAST, MODE_NONE, MODE_COUNT };
static const char *const mode_name[MODE_COUNT] = {"forward", "first block only", "last block only",
                                                  "no block"};

/* FLOPs of one block, N image + L text tokens, S = N + L, batch B (2 per
 * multiply-add; GEMMs and the attention's two products only):
 *   joint: norm1 + norm1_context 2 (6D + 6D) D per sample, q|k|v of both
 *          streams 6SD^2, attention 4S^2D, to_out + to_add_out 2SD^2,
 *          ff + ff_context 4SDF = 24SD^2 + 4S^2D + 24D^2 (F = 4D)
 *   last (context_pre_only): norm1 12D^2 + norm1_context (2D) 4D^2, q|k|v
 *          6SD^2, attention 4S^2D, to_out 2ND^2, ff 4NDF */
static double flops_joint(double B, double N, double L, double D, double F)
{
    double S = N + L;
    return B * (24 * D * D + 6 * S * D * D + 4 * S * S * D + 2 * S * D * D + 4 * S * D * F);
}

static double flops_last(double B, double N, double L, double D, double F)
{
    double S = N + L;
    return B * (16 * D * D + 6 * S * D * D + 4 * S * S * D + 2 * N * D * D + 4 * N * D * F);
}

/* Logical bytes rank 0 sends (comm.h's conventions) per block, B the rows
 * this rank's forward runs, e bytes per element, the text split over the cp
 * ranks with the image: rank 0 holds nl image + ll text tokens (n = nl + ll;
 * an odd count leaves the ranks one token apart, so rank 0's own counts are
 * used, not S / (R U)). The attention:
 *   ulysses alltoallv: q, k, v of its n tokens to the peers' heads,
 *     3 B n Hl Dh (U-1)/U, and the output of the peers' S/R - n tokens for
 *     its own heads back, B (S/R - n) (Hl/U) Dh  (Hl = H/T)
 *   ring: K and V of this ring chunk to R-1 peers, 2 B (S/R) (Hl/U) Dh
 * tp all-reduces (payload x 2 (T-1)/T): joint block to_out + ff.net.2 of
 * the image and to_add_out + ff_context.net.2 of the text, 2 B n D in all;
 * the last block to_out + ff.net.2 of the image only, 2 B nl D. */
static void analytic_block(const ditd_sd3_config *c, const ditd_layout *l, int last, double B,
                           double N, double L, double nl, double ll, double e,
                           double out[DITD_AXIS_COUNT][DITD_COLL_COUNT])
{
    double D = c->inner_dim, Dh = c->head_dim, T = l->tp, U = l->ulysses, R = l->ring;
    double Hl = (double)c->num_heads / T, S = N + L, n = nl + ll;
    memset(out, 0, sizeof(double) * DITD_AXIS_COUNT * DITD_COLL_COUNT);
    if (U > 1)
        out[DITD_AXIS_ULYSSES][DITD_COLL_ALLTOALLV] =
            (3 * B * n * Hl * Dh * (U - 1) / U + B * (S / R - n) * (Hl / U) * Dh) * e;
    out[DITD_AXIS_RING][l->rotate == DITD_RING_P2P ? DITD_COLL_SENDRECV : DITD_COLL_ALLGATHERV] =
        2 * B * (S / R) * (Hl / U) * Dh * (R - 1) * e;
    out[DITD_AXIS_TP][DITD_COLL_ALLREDUCE] = 2 * B * (last ? nl : n) * D * e * 2 * (T - 1) / T;
}

int main(int argc, char **argv)
{
    const char *dir = NULL, *dtype = "f32";
    int h = 128, w = 128, L = 333, B = 1, threads = 0, reps = 3, blocks = 0, rc = 1, use_mpi;
    ditd_layout lay = DITD_LAYOUT_SINGLE;
    ditd_comm *world = NULL;
    ditd_mesh *mesh = NULL;
    ditd_sd3 *m = NULL;
    float *x = NULL, *text = NULL, *pooled = NULL, *t = NULL, *hout = NULL;
    void *out = NULL;
    int *skip = NULL;
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
        else if (strcmp(a, "--dtype") == 0 && i + 1 < argc) dtype = argv[++i];
        else if (strcmp(a, "--ulysses") == 0) lay.ulysses = v, i++;
        else if (strcmp(a, "--ring") == 0) lay.ring = v, i++;
        else if (strcmp(a, "--tp") == 0) lay.tp = v, i++;
        else if (strcmp(a, "--cfg") == 0) lay.cfg = v, i++;
        else if (strcmp(a, "--blocks") == 0) blocks = 1;
        else if (strcmp(a, "--cpu-time") == 0) g_cpu_time = 1;
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
    if (!dir || reps < 1 || reps > 100 || B < 1 || lay.cfg < 1 || lay.cfg > 2 ||
        B % lay.cfg != 0) {
        fprintf(stderr, "usage: bench_sd3 DIR --height H --width W --text L [--batch B] "
                        "[--threads T] [--reps R] [--dtype f32|bf16] [--blocks] [--ulysses U] "
                        "[--ring R] [--rotate allgather|p2p] [--tp T] [--cfg 2 (B even)] "
                        "[--cpu-time (one rank)]\n");
        return 2;
    }
    use_mpi = ditd_layout_size(&lay) > 1 || ditd_comm_launched_by_mpi();
    if (use_mpi && g_cpu_time) {
        fprintf(stderr, "bench_sd3: --cpu-time is for one rank (a rank in a collective spins)\n");
        return 2;
    }
    if (use_mpi) {
        int err = ditd_comm_mpi_init(&argc, &argv);
        if (!err)
            err = ditd_comm_mpi_world(&world);
        if (!err)
            err = ditd_mesh_new(world, &lay, &mesh);
        if (err) {
            fprintf(stderr, "bench_sd3: %s\n", ditd_err_detail());
            goto done;
        }
    }
    int leader = !mesh || ditd_mesh_is_leader(mesh);
    const ditd_backend_ops *ops = ditd_backend_for_weights(&ditd_backend_cpu, dtype, DITD_DTYPE_F32);
    if (!ops) {
        fprintf(stderr, "bench_sd3: %s\n", ditd_err_detail());
        goto done;
    }
    int nt = ops->set_threads(threads);
    g_threads = nt > 0 ? nt : 1;
    int Bl = B / lay.cfg, r0 = mesh ? mesh->cfg_rank * Bl : 0; /* this cfg rank's rows */
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    ditd_sd3_config cfg;
    if (ditd_sd3_config_load(path, &cfg) ||
        ditd_sd3_new_mesh(&cfg, ops, Bl, h, w, L, dir, mesh, &m)) {
        fprintf(stderr, "bench_sd3: %s\n", ditd_err_detail());
        goto done;
    }
    int nl = cfg.num_layers;
    size_t nx = (size_t)cfg.in_channels * (size_t)h * (size_t)w;
    size_t no = (size_t)cfg.out_channels * (size_t)h * (size_t)w;
    size_t ntext = (size_t)L * (size_t)cfg.joint_attention_dim;
    x = malloc((size_t)B * nx * sizeof *x), hout = malloc((size_t)B * no * sizeof *hout);
    text = malloc((size_t)B * ntext * sizeof *text);
    pooled = malloc((size_t)B * cfg.pooled_dim * sizeof *pooled);
    t = malloc((size_t)B * sizeof *t), skip = malloc((size_t)nl * sizeof *skip);
    ms = malloc((size_t)MODE_COUNT * (size_t)reps * sizeof *ms);
    if (!x || !hout || !text || !pooled || !t || !skip || !ms) {
        fprintf(stderr, "bench_sd3: out of memory\n");
        goto done;
    }
    /* the input and the output of the whole batch in the activation type
     * (CPU backend: host memory); the output is the cfg gather's buffer */
    out = malloc((size_t)B * no * ditd_dtype_size(ops->act_dtype));
    void *xin = malloc((size_t)B * nx * ditd_dtype_size(ops->act_dtype));
    if (!out || !xin) {
        free(xin);
        fprintf(stderr, "bench_sd3: out of memory\n");
        goto done;
    }
    ditd_philox_normal(1, 0, 0, (size_t)B * nx, x);
    ditd_philox_normal(1, 1, 0, (size_t)B * ntext, text);
    ditd_philox_normal(1, 2, 0, (size_t)B * cfg.pooled_dim, pooled);
    ops->upload(xin, x, (size_t)B * nx);
    for (int b = 0; b < B; b++)
        t[b] = 500.0f;

    int nmodes = blocks ? MODE_COUNT : 1;
    bench_stats st[MODE_COUNT];
    double comm_ms[MODE_COUNT] = {0};
    size_t es = ditd_dtype_size(ops->act_dtype);
    for (int r = -1; r < reps; r++)
        for (int md = 0; md < nmodes; md++) {
            int ns = 0;
            for (int l = 0; l < nl; l++)
                if (md == MODE_NONE || (md == MODE_FIRST && l != 0) ||
                    (md == MODE_LAST && l != nl - 1))
                    skip[ns++] = l;
            if (mesh) {
                ditd_mesh_stats_reset(mesh);
                ditd_comm_barrier(mesh->group);
            }
            double t0 = bench_now_ms();
            int err = ditd_sd3_forward(m, Bl, (char *)xin + (size_t)r0 * nx * es, t + r0,
                                       text + (size_t)r0 * ntext,
                                       pooled + (size_t)r0 * cfg.pooled_dim, skip, ns,
                                       (char *)out + (size_t)r0 * no * es);
            if (!err)
                err = ops->status();
            if (!err && lay.cfg > 1) { /* the pipeline's gather of the two halves */
                int counts[2] = {(int)((size_t)Bl * no), (int)((size_t)Bl * no)};
                int displs[2] = {0, counts[0]};
                err = ditd_comm_allgatherv(mesh->cfg_comm, ops->act_dtype, NULL, out, counts,
                                           displs);
            }
            if (err) {
                fprintf(stderr, "bench_sd3: %s\n", ditd_err_detail());
                free(xin);
                goto done;
            }
            double dt = bench_now_ms() - t0;
            if (r < 0)
                continue;
            ms[md * reps + r] = dt;
            stats_take(mesh, &st[md]); /* every rep sends the same bytes */
            comm_ms[md] += st[md].ms / reps;
        }
    free(xin);
    ops->download(hout, out, (size_t)B * no);

    double med[MODE_COUNT] = {0};
    for (int md = 0; md < nmodes; md++)
        med[md] = median(ms + md * reps, reps);
    int R = lay.ring, U = lay.ulysses;
    if (leader) {
        printf("ditd sd3: D %d (%d heads x %d), %d blocks, latent %dx%d (%d image + %d text tokens), "
               "batch %d (%d per cfg rank), %s weights, %d threads x %d ranks (cfg %d, ulysses %d, "
               "ring %d %s, tp %d): median %.1f ms per forward (%d reps, %s)\n",
               cfg.inner_dim, cfg.num_heads, cfg.head_dim, nl, w, h, m->N, L, B, Bl, dtype, nt,
               mesh ? mesh->size : 1, lay.cfg, U, R, ditd_ring_rotate_name(lay.rotate), lay.tp,
               med[MODE_FULL], reps, g_cpu_time ? "process CPU time / threads" : "wall time");
        printf("rank 0 memory: weights %.1f MB, activations %.1f MB (planned arenas, %s)\n",
               (double)ditd_sd3_weight_bytes(m) / 1e6, (double)ditd_sd3_act_bytes(m) / 1e6,
               ditd_dtype_name(ops->act_dtype));
        if (mesh)
            printf("rank 0 inside collectives: %.1f ms per forward (mean)\n", comm_ms[MODE_FULL]);
    }
    if (blocks && leader) {
        double N = m->N, D = cfg.inner_dim, F = cfg.mlp_dim;
        double fj = flops_joint(B, N, L, D, F), fl = flops_last(B, N, L, D, F);
        double tj = med[MODE_FIRST] - med[MODE_NONE], tl = med[MODE_LAST] - med[MODE_NONE];
        printf("\n| forwards | ms (median of %d) |\n|---|---|\n", reps);
        for (int md = 0; md < MODE_COUNT; md++)
            printf("| %s | %.1f |\n", mode_name[md], med[md]);
        printf("\n| block | GFLOP (analytic, batch %d) | ms | GFLOP/s (all ranks) |\n"
               "|---|---|---|---|\n", B);
        printf("| joint | %.1f | %.1f | %.1f |\n| last (context_pre_only) | %.1f | %.1f | %.1f |\n",
               fj / 1e9, tj, tj > 0 ? fj / tj / 1e6 : 0, fl / 1e9, tl, tl > 0 ? fl / tl / 1e6 : 0);
        /* for bench/compare_sd3.py */
        printf("\nblock ms: joint %.2f last %.2f\n", tj, tl);
    }
    if (mesh && leader) {
        /* per block: the first-only (last-only) forward's bytes minus the
         * bare forward's; measured from the last rep of each */
        double e = (double)es;
        double an_j[DITD_AXIS_COUNT][DITD_COLL_COUNT], an_l[DITD_AXIS_COUNT][DITD_COLL_COUNT];
        analytic_block(&cfg, &lay, 0, Bl, m->N, L, m->n_loc, m->l_loc, e, an_j);
        analytic_block(&cfg, &lay, 1, Bl, m->N, L, m->n_loc, m->l_loc, e, an_l);
        int p = cfg.patch_size;
        /* the proj_out tokens gathered over the cp ranks: rank 0's block to
         * the R U - 1 others */
        double an_final = (double)Bl * (double)m->n_loc * p * p * cfg.out_channels * e * (R * U - 1);
        double an_cfg = (double)Bl * (double)no * e * (lay.cfg - 1);
        printf("\n| axis | collective | calls/forward | MB/forward measured | MB/forward analytic |%s\n",
               blocks ? " MB/joint block measured | analytic | MB/last block measured | analytic |" : "");
        printf("|---|---|---|---|---|%s\n", blocks ? "---|---|---|---|" : "");
        for (int a = 0; a < DITD_AXIS_COUNT; a++)
            for (int k = 0; k < DITD_COLL_COUNT; k++) {
                double an = (nl - 1) * an_j[a][k] + an_l[a][k];
                if (a == DITD_AXIS_CP && k == DITD_COLL_ALLGATHERV)
                    an += an_final;
                if (a == DITD_AXIS_CFG && k == DITD_COLL_ALLGATHERV)
                    an += an_cfg;
                if (!st[MODE_FULL].calls[a][k] && an == 0)
                    continue;
                printf("| %s | %s | %llu | %.3f | %.3f |", ditd_mesh_axis_name((ditd_mesh_axis)a),
                       ditd_coll_name((ditd_coll)k),
                       (unsigned long long)st[MODE_FULL].calls[a][k],
                       (double)st[MODE_FULL].bytes[a][k] / 1e6, an / 1e6);
                if (blocks) {
                    double base = (double)st[MODE_NONE].bytes[a][k];
                    printf(" %.3f | %.3f | %.3f | %.3f |",
                           ((double)st[MODE_FIRST].bytes[a][k] - base) / 1e6, an_j[a][k] / 1e6,
                           ((double)st[MODE_LAST].bytes[a][k] - base) / 1e6, an_l[a][k] / 1e6);
                }
                printf("\n");
            }
        printf("\n(rank 0's logical bytes sent, engine/parallel/comm.h; %.0f bytes per element)\n", e);
    }
    rc = 0;
done:
    free(x);
    free(hout);
    free(out);
    free(text);
    free(pooled);
    free(t);
    free(skip);
    free(ms);
    ditd_sd3_free(m);
    ditd_mesh_free(mesh);
    ditd_comm_free(world);
    if (use_mpi)
        ditd_comm_mpi_finalize();
    return rc;
}
