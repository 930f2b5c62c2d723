/* Times the Wan transformer's forward (engine/models/wan/wan.h) on a model
 * folder: median milliseconds per forward over --reps runs after one
 * warm-up, random inputs (timing does not depend on values), and with
 * --blocks the milliseconds and GFLOP/s of one block (a forward of the
 * loaded model beside one with its blocks left out: this program sets the
 * model's num_layers to 0 for that forward and back; the blocks of a Wan
 * model are all alike) and the attention's share of it (its 4 N^2 D FLOPs
 * at the block's rate is not measured apart: the share is analytic). Under
 * mpirun (--ulysses, --ring, --tp) it also prints, per mesh axis and
 * collective, the calls and bytes ditd's comm layer counted beside the
 * analytic bytes, and for ring p2p the time rank 0 spent inside
 * collectives against the forward (what of the ring traffic the compute
 * did not hide). A benchmark, not a test: it asserts nothing.
 * bench/compare_wan.py runs it beside Diffusers; docs/wan.md has the
 * results.
 *
 *   bench_wan DIR --frames F --height H --width W --text L [--batch B] [--threads T]
 *             [--reps R] [--dtype f32|bf16] [--blocks] [--ulysses U] [--ring R]
 *             [--rotate allgather|p2p] [--tp T] [--cpu-time]
 *   (F, H, W: latent frames and size; 480x832 x 81 frames is 21 x 60 x 104)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/backend/backend.h"
#include "engine/core/error.h"
#include "engine/core/philox.h"
#include "engine/models/wan/wan.h"
#include "engine/models/wan/wan_config.h"
#include "engine/parallel/comm.h"
#include "engine/parallel/mesh.h"

#include "bench/bench_util.h"

/* FLOPs of one block (2 per multiply-add; GEMMs and the attentions'
 * products), N video tokens, L text tokens, batch B: self-attention q|k|v
 * 6ND^2, its products 4N^2D, to_out 2ND^2; cross-attention q 2ND^2, k|v of
 * the text 4LD^2, products 4NLD, to_out 2ND^2; the FFN 4NDF. */
static double flops_block(double B, double N, double L, double D, double F)
{
    return B * (12 * N * D * D + 4 * N * N * D + 4 * L * D * D + 4 * N * L * D + 4 * N * D * F);
}

/* Logical bytes rank 0 sends per block (comm.h's conventions), B rows, e
 * bytes per element, rank 0 holding n of the N video tokens (the text is
 * replicated: cross-attention sends nothing):
 *   ulysses alltoallv: q, k, v of its n tokens to the peers' heads,
 *     3 B n Hl Dh (U-1)/U, and the output of the peers' N/R - n tokens for
 *     its own heads back, B (N/R - n) (Hl/U) Dh  (Hl = H/T)
 *   ring: K and V of this ring chunk to R-1 peers, 2 B (N/R) (Hl/U) Dh
 *   tp all-reduce (payload x 2 (T-1)/T): attn1.to_out, attn2.to_out and
 *     ffn.net.2, 3 B n D (the across-heads RMSNorm's sums are small and
 *     not counted here) */
static void analytic_block(const ditd_wan_config *c, const ditd_layout *l, double B, double N,
                           double n, double e, double out[DITD_AXIS_COUNT][DITD_COLL_COUNT])
{
    double D = c->inner_dim, Dh = c->head_dim, T = l->tp, U = l->ulysses, R = l->ring;
    double Hl = (double)c->num_heads / T;
    memset(out, 0, sizeof(double) * DITD_AXIS_COUNT * DITD_COLL_COUNT);
    if (U > 1)
        out[DITD_AXIS_ULYSSES][DITD_COLL_ALLTOALLV] =
            (3 * B * n * Hl * Dh * (U - 1) / U + B * (N / R - n) * (Hl / U) * Dh) * e;
    out[DITD_AXIS_RING][l->rotate == DITD_RING_P2P ? DITD_COLL_SENDRECV : DITD_COLL_ALLGATHERV] =
        2 * B * (N / R) * (Hl / U) * Dh * (R - 1) * e;
    out[DITD_AXIS_TP][DITD_COLL_ALLREDUCE] = 3 * B * n * D * e * 2 * (T - 1) / T;
}

int main(int argc, char **argv)
{
    const char *dir = NULL, *dtype = "f32";
    int F = 21, h = 60, w = 104, L = 512, B = 1, threads = 0, reps = 3, blocks = 0, rc = 1;
    ditd_layout lay = DITD_LAYOUT_SINGLE;
    ditd_comm *world = NULL;
    ditd_mesh *mesh = NULL;
    ditd_wan *m = NULL;
    float *x = NULL, *text = NULL, *t = NULL;
    void *xin = NULL, *out = NULL;
    double *ms = NULL;

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int v = i + 1 < argc ? atoi(argv[i + 1]) : 0;
        if (strcmp(a, "--frames") == 0) F = v, i++;
        else if (strcmp(a, "--height") == 0) h = v, i++;
        else if (strcmp(a, "--width") == 0) w = v, i++;
        else if (strcmp(a, "--text") == 0) L = v, i++;
        else if (strcmp(a, "--batch") == 0) B = v, i++;
        else if (strcmp(a, "--threads") == 0) threads = v, i++;
        else if (strcmp(a, "--reps") == 0) reps = v, i++;
        else if (strcmp(a, "--dtype") == 0 && i + 1 < argc) dtype = argv[++i];
        else if (strcmp(a, "--ulysses") == 0) lay.ulysses = v, i++;
        else if (strcmp(a, "--ring") == 0) lay.ring = v, i++;
        else if (strcmp(a, "--tp") == 0) lay.tp = v, i++;
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
    if (!dir || reps < 1 || reps > 100 || B < 1 || F < 1 || h < 1 || w < 1 || L < 1) {
        fprintf(stderr, "usage: bench_wan DIR --frames F --height H --width W --text L [--batch B] "
                        "[--threads T] [--reps R] [--dtype f32|bf16] [--blocks] [--ulysses U] "
                        "[--ring R] [--rotate allgather|p2p] [--tp T] [--cpu-time (one rank)]\n");
        return 2;
    }
    int use_mpi = ditd_layout_size(&lay) > 1 || ditd_comm_launched_by_mpi();
    if (use_mpi && g_cpu_time) {
        fprintf(stderr, "bench_wan: --cpu-time is for one rank (a rank in a collective spins)\n");
        return 2;
    }
    if (use_mpi) {
        int err = ditd_comm_mpi_init(&argc, &argv);
        if (!err)
            err = ditd_comm_mpi_world(&world);
        if (!err)
            err = ditd_mesh_new(world, &lay, &mesh);
        if (err) {
            fprintf(stderr, "bench_wan: %s\n", ditd_err_detail());
            goto done;
        }
    }
    int leader = !mesh || ditd_mesh_is_leader(mesh);
    const ditd_backend_ops *ops = ditd_backend_for_weights(&ditd_backend_cpu, dtype, DITD_DTYPE_F32);
    if (!ops) {
        fprintf(stderr, "bench_wan: %s\n", ditd_err_detail());
        goto done;
    }
    int nt = ops->set_threads(threads);
    g_threads = nt > 0 ? nt : 1;
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    ditd_wan_config cfg;
    if (ditd_wan_config_load(path, &cfg) ||
        ditd_wan_new_mesh(&cfg, ops, B, F, h, w, L, dir, mesh, &m)) {
        fprintf(stderr, "bench_wan: %s\n", ditd_err_detail());
        goto done;
    }
    size_t es = ditd_dtype_size(ops->act_dtype);
    size_t nx = (size_t)cfg.in_channels * F * h * w, no = (size_t)cfg.out_channels * F * h * w;
    size_t ntext = (size_t)L * (size_t)cfg.text_dim;
    x = malloc((size_t)B * nx * sizeof *x);
    text = malloc((size_t)B * ntext * sizeof *text);
    t = malloc((size_t)B * sizeof *t);
    ms = malloc(2 * (size_t)reps * sizeof *ms);
    xin = malloc((size_t)B * nx * es);
    out = malloc((size_t)B * no * es);
    if (!x || !text || !t || !ms || !xin || !out) {
        fprintf(stderr, "bench_wan: out of memory\n");
        goto done;
    }
    ditd_philox_normal(1, 0, 0, (size_t)B * nx, x);
    ditd_philox_normal(1, 1, 0, (size_t)B * ntext, text);
    ops->upload(xin, x, (size_t)B * nx);
    for (int b = 0; b < B; b++)
        t[b] = 500.0f;

    const int nl = cfg.num_layers, nmodes = blocks ? 2 : 1; /* 0: the forward, 1: no block */
    bench_stats st[2];
    double comm_ms[2] = {0};
    for (int r = -1; r < reps; r++)
        for (int md = 0; md < nmodes; md++) {
            m->cfg.num_layers = md ? 0 : nl;
            if (mesh) {
                ditd_mesh_stats_reset(mesh);
                ditd_comm_barrier(mesh->group);
            }
            double t0 = bench_now_ms();
            int err = ditd_wan_forward(m, B, xin, t, NULL, text, NULL, out);
            if (!err)
                err = ops->status();
            m->cfg.num_layers = nl;
            if (err) {
                fprintf(stderr, "bench_wan: %s\n", ditd_err_detail());
                goto done;
            }
            double dt = bench_now_ms() - t0;
            if (r < 0)
                continue;
            ms[md * reps + r] = dt;
            stats_take(mesh, &st[md]); /* every rep sends the same bytes */
            comm_ms[md] += st[md].ms / reps;
        }
    double med[2] = {median(ms, reps), blocks ? median(ms + reps, reps) : 0};
    if (leader) {
        double N = m->N, D = cfg.inner_dim;
        printf("ditd wan: D %d (%d heads x %d), FFN %d, %d blocks, latent %d x %dx%d (%d tokens) + "
               "%d text tokens, batch %d, %s weights, %d threads x %d ranks (ulysses %d, ring %d %s, "
               "tp %d): median %.1f ms per forward (%d reps, %s)\n",
               cfg.inner_dim, cfg.num_heads, cfg.head_dim, cfg.ffn_dim, nl, F, w, h, m->N, L, B,
               dtype, nt, mesh ? mesh->size : 1, lay.ulysses, lay.ring,
               ditd_ring_rotate_name(lay.rotate), lay.tp, med[0], reps,
               g_cpu_time ? "process CPU time / threads" : "wall time");
        printf("rank 0 memory: weights %.1f MB, activations %.1f MB (planned arenas, %s)\n",
               (double)ditd_wan_weight_bytes(m) / 1e6, (double)ditd_wan_act_bytes(m) / 1e6,
               ditd_dtype_name(ops->act_dtype));
        if (blocks) {
            double fb = flops_block(B, N, L, D, cfg.ffn_dim), tb = (med[0] - med[1]) / nl;
            double fa = B * (4 * N * N * D);
            printf("\n| block | GFLOP (analytic, batch %d) | ms | GFLOP/s (all ranks) | attention's "
                   "share of the FLOPs |\n|---|---|---|---|---|\n", B);
            printf("| one of %d | %.1f | %.1f | %.1f | %.0f %% |\n", nl, fb / 1e9, tb,
                   tb > 0 ? fb / tb / 1e6 : 0, 100 * fa / fb);
            printf("\n(no-block forward: %.1f ms)\nblock ms: %.2f\n", med[1], tb); /* compare_wan.py */
        }
        if (mesh) {
            double an[DITD_AXIS_COUNT][DITD_COLL_COUNT];
            analytic_block(&cfg, &lay, B, N, m->n_loc, (double)es, an);
            printf("\nrank 0 inside collectives: %.1f ms of the %.1f ms forward (mean)%s\n",
                   comm_ms[0], med[0],
                   lay.ring > 1 && lay.rotate == DITD_RING_P2P
                       ? " (ring p2p: the time a rank waits for a chunk the compute did not hide)"
                       : "");
            printf("\n| axis | collective | calls/forward | MB/forward measured | MB per block "
                   "analytic x %d blocks |\n|---|---|---|---|---|\n", nl);
            for (int a = 0; a < DITD_AXIS_COUNT; a++)
                for (int k = 0; k < DITD_COLL_COUNT; k++) {
                    double anf = nl * an[a][k];
                    if (!st[0].calls[a][k] && anf == 0)
                        continue;
                    printf("| %s | %s | %llu | %.3f | %.3f |\n", ditd_mesh_axis_name((ditd_mesh_axis)a),
                           ditd_coll_name((ditd_coll)k), (unsigned long long)st[0].calls[a][k],
                           (double)st[0].bytes[a][k] / 1e6, anf / 1e6);
                }
            printf("\n(rank 0's logical bytes sent, engine/parallel/comm.h; the final gather of the "
                   "output tokens is in the measured column only)\n");
        }
    }
    rc = 0;
done:
    free(x);
    free(text);
    free(t);
    free(ms);
    free(xin);
    free(out);
    ditd_wan_free(m);
    ditd_mesh_free(mesh);
    ditd_comm_free(world);
    if (use_mpi)
        ditd_comm_mpi_finalize();
    return rc;
}
