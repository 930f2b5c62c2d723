/* `ditd bench --vae NAME|DIR`: times the AutoencoderKL decode (random
 * weights for a published config, or a vae/ folder's weights) and prints
 * median ms per image, GFLOP/s and peak RSS. Under mpirun the decode runs
 * on all G ranks (the exact parallel decode) and the leader prints compute
 * and communication time and, per collective, calls and bytes measured
 * beside the analytic count. With --steps K and a DiT config it also prints
 * the end-to-end split for one image: K DiT forwards (CFG-doubled batch of
 * 2, random weights) and the decode. With --encode it times the encoder
 * instead (on the group under mpirun), printing each rank's time and peak
 * RSS. A benchmark prints; it asserts nothing.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "engine/core/clock.h"
#include "engine/backend/backend.h"
#include "engine/core/error.h"
#include "engine/core/philox.h"
#include "engine/models/dit/dit.h"
#include "engine/models/vae/autoencoder_kl.h"
#include "engine/parallel/comm.h"
#include "server/cmd/cli.h"
#include "server/cmd/cmd.h"

static double cpu_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double peak_rss_mib(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_maxrss / 1024.0;
}

static int fail(const char *what, int err)
{
    const char *d = ditd_err_detail();
    fprintf(stderr, "ditd bench --vae: %s: %s%s%s\n", what, ditd_strerror(err), *d ? ": " : "", d);
    return 1;
}

/* What the leader's band moves in one decode of an h x w latent split in
 * units of m rows over P ranks (the logical bytes of engine/parallel/comm.h):
 * two halo rows sent per 3x3 conv, the GroupNorm partials of its units, its
 * K and V rows to the P - 1 others. The final gather: the leader sends
 * nothing. */
static void analytic(const ditd_vae_config *c, int h, int w, int m, int P, double *halo_b,
                     double *halo_calls, double *ag_b, double *ag_calls)
{
    const int n = c->n_blocks, top = c->block_out_channels[n - 1], G = c->norm_num_groups;
    const int U = (h + m - 1) / m, u0 = 0, u1 = U / P; /* the leader's units: floor(U / P) */
    int rows = (u1 - u0) * m;
    double halo = 0, hc = 0, ag = 0, ac = 0;
    (void)u0;
#define CONV(cin, W) (halo += 2.0 * (cin) * (W) * 4, hc += 2)
#define NORM() (ag += (double)(u1 - u0) * 2 * G * 8 * (P - 1), ac += 1)
    CONV(c->latent_channels, w);
    for (int r = 0; r < 2; r++) {
        NORM(), CONV(top, w), NORM(), CONV(top, w);
        if (r == 0 && c->mid_block_add_attention) {
            NORM();
            ag += 2.0 * rows * w * top * 4 * (P - 1), ac += 2;
        }
    }
    int prev = top, s = 1;
    for (int i = 0; i < n; i++) {
        int ch = c->block_out_channels[n - 1 - i];
        for (int j = 0; j <= c->layers_per_block; j++) {
            NORM(), CONV(j == 0 ? prev : ch, w * s), NORM(), CONV(ch, w * s);
        }
        if (i != n - 1) {
            s *= 2;
            CONV(ch, w * s);
        }
        prev = ch;
    }
    NORM(), CONV(c->block_out_channels[0], w * s);
#undef CONV
#undef NORM
    *halo_b = halo;
    *halo_calls = hc + (P - 1); /* + the leader's receives of the final rows */
    *ag_b = ag;
    *ag_calls = ac;
}

/* --encode: the encoder on a size x size image (Philox noise in [-1, 1])
 * with a posterior draw; per rank: median wall ms, process CPU ms, peak
 * RSS, the communication time of the last run, all printed by the leader. */
static int bench_encode(ditd_vae *v, ditd_comm *world, int rank, int P, int nth, const char *name,
                        int size, long warmup, long iters, double load_ms)
{
    const ditd_vae_config *c = ditd_vae_config_of(v);
    const int hl = ditd_vae_latent_side(c, size);
    const size_t xn = (size_t)c->in_channels * size * size, ln = (size_t)c->latent_channels * hl * hl;
    float *x = malloc(xn * sizeof *x), *mean = malloc(ln * sizeof *mean), *draw = malloc(ln * sizeof *draw);
    double *t = calloc((size_t)iters, sizeof *t), *tc = calloc((size_t)iters, sizeof *tc);
    int64_t mine[4], *all = calloc((size_t)P * 4, sizeof *all);
    int *cnt = calloc((size_t)P, sizeof *cnt), *dsp = calloc((size_t)P, sizeof *dsp), err, rc = 1;
    ditd_vae_stats st = {0};
    if (!x || !mean || !draw || !t || !tc || !all || !cnt || !dsp) {
        fail("buffers", DITD_ENOMEM);
        goto out;
    }
    ditd_philox_normal(7, 1, 0, xn, x);
    for (size_t i = 0; i < xn; i++)
        x[i] = x[i] < -2.0f ? -1.0f : x[i] > 2.0f ? 1.0f : 0.5f * x[i];
    for (long i = 0; i < warmup + iters; i++) {
        if (world)
            ditd_comm_barrier(world);
        double t0 = ditd_now_ms(), c0 = cpu_ms();
        if ((err = ditd_vae_encode(v, x, 1, size, size, 5, mean, draw))) {
            fail("encoding", err);
            goto out;
        }
        if (i >= warmup) {
            t[i - warmup] = ditd_now_ms() - t0;
            tc[i - warmup] = cpu_ms() - c0;
            st = ditd_vae_last_stats(v);
        }
    }
    qsort(t, (size_t)iters, sizeof *t, cmp_double);
    qsort(tc, (size_t)iters, sizeof *tc, cmp_double);
    mine[0] = (int64_t)(iters % 2 ? t[iters / 2] : 0.5 * (t[iters / 2 - 1] + t[iters / 2]));
    mine[1] = (int64_t)(iters % 2 ? tc[iters / 2] : 0.5 * (tc[iters / 2 - 1] + tc[iters / 2]));
    mine[2] = (int64_t)(peak_rss_mib() + 0.5);
    mine[3] = (int64_t)st.comm_ms;
    for (int r = 0; r < P; r++) {
        cnt[r] = 4;
        dsp[r] = 4 * r;
    }
    if (world && (err = ditd_comm_allgatherv(world, DITD_DTYPE_I64, mine, all, cnt, dsp))) {
        fail("gathering the numbers", err);
        goto out;
    }
    if (!world)
        memcpy(all, mine, sizeof mine);
    if (rank == 0) {
        printf("vae encode  %-14s %4dx%-4d -> latent %dx%dx%d  ranks %d  threads %d a rank  load %.0f ms\n",
               name, size, size, c->latent_channels, hl, hl, P, nth, load_ms);
        printf("  %-5s %12s %14s %15s %14s\n", "rank", "wall ms", "CPU ms", "comm ms (last)", "peak RSS MiB");
        for (int r = 0; r < P; r++)
            printf("  %-5d %12lld %14lld %15lld %14lld\n", r, (long long)all[4 * r], (long long)all[4 * r + 1],
                   (long long)all[4 * r + 3], (long long)all[4 * r + 2]);
    }
    rc = 0;
out:
    free(x);
    free(mean);
    free(draw);
    free(t);
    free(tc);
    free(all);
    free(cnt);
    free(dsp);
    return rc;
}

int ditd_cmd_bench_vae(int argc, char **argv)
{
    enum { O_VAE = 256, O_SIZE, O_THREADS, O_ITERS, O_WARMUP, O_TILING, O_UNIT, O_STEPS, O_CONFIG,
           O_ENCODE };
    static const struct option opts[] = {
        {"vae", required_argument, 0, O_VAE},         {"size", required_argument, 0, O_SIZE},
        {"threads", required_argument, 0, O_THREADS}, {"iters", required_argument, 0, O_ITERS},
        {"warmup", required_argument, 0, O_WARMUP},   {"vae-tiling", no_argument, 0, O_TILING},
        {"row-unit", required_argument, 0, O_UNIT},   {"steps", required_argument, 0, O_STEPS},
        {"config", required_argument, 0, O_CONFIG},   {"encode", no_argument, 0, O_ENCODE},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0}};
    const char *vae_name = NULL, *dit_name = "DiT-XL/2";
    long size = 256, threads = 0, iters = 3, warmup = 1, unit = 0, steps = 0;
    int c, err = 0, tiling = 0, encode = 0, rc = 1, mpi = ditd_comm_launched_by_mpi(), rank = 0, P = 1;
    ditd_comm *world = NULL;
    ditd_vae *v = NULL;
    ditd_vae_config cfg;
    float *z = NULL, *img = NULL;
    double *t = NULL, *tc = NULL;

    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case O_VAE: vae_name = optarg; break;
        case O_SIZE: err = ditd_parse_long(optarg, 8, 16384, "--size", &size); break;
        case O_THREADS: err = ditd_parse_long(optarg, 1, 1024, "--threads", &threads); break;
        case O_ITERS: err = ditd_parse_long(optarg, 1, 1000, "--iters", &iters); break;
        case O_WARMUP: err = ditd_parse_long(optarg, 0, 1000, "--warmup", &warmup); break;
        case O_TILING: tiling = 1; break;
        case O_UNIT: err = ditd_parse_long(optarg, 0, 8, "--row-unit", &unit); break;
        case O_STEPS: err = ditd_parse_long(optarg, 0, 1000, "--steps", &steps); break;
        case O_CONFIG: dit_name = optarg; break;
        case O_ENCODE: encode = 1; break;
        case 'h':
            printf("usage: ditd bench --vae sd-vae-ft-ema|flux-vae|DIR [--size PIXELS] [--threads T]\n"
                   "       [--iters K] [--warmup W] [--vae-tiling] [--row-unit M]\n"
                   "       [--steps K --config DiT-XL/2]   (end to end: K forwards + the decode)\n"
                   "       [--encode]   (the encoder: a --size image to its latent distribution)\n"
                   "  under mpirun -np G: the parallel decode (or encode) on G ranks\n");
            return 0;
        default: return 2;
        }
        if (err) {
            fprintf(stderr, "ditd bench: %s\n", ditd_err_detail());
            return 2;
        }
    }
    if (mpi) {
        if ((err = ditd_comm_mpi_init(&argc, &argv)) || (err = ditd_comm_mpi_world(&world)))
            return fail("MPI", err);
        rank = ditd_comm_rank(world);
        P = ditd_comm_size(world);
    }
    const ditd_backend_ops *ops = &ditd_backend_cpu;
    int nth = ops->set_threads((int)threads);
    if ((err = ditd_vae_config_named(vae_name, &cfg))) {
        char path[4200];
        snprintf(path, sizeof path, "%s/config.json", vae_name);
        if ((err = ditd_vae_config_load(path, &cfg))) {
            fail(vae_name, err);
            goto done;
        }
    }
    const int f = ditd_vae_config_scale_factor(&cfg), h = (int)size / f;
    ditd_vae_opts o = {.max_h = h, .max_w = h, .tiling = tiling, .comm = P > 1 ? world : NULL,
                       .row_unit = (int)unit};
    if (encode) {
        o.max_h = o.max_w = 1; /* no decode: its buffers planned for a 1 x 1 latent */
        o.max_image_h = o.max_image_w = (int)size;
        o.tiling = 0;
    }
    double t0 = ditd_now_ms();
    err = ditd_vae_config_named(vae_name, &cfg) == 0
              ? ditd_vae_new_random(&cfg, ops, &o, 42, &v)
              : ditd_vae_load(vae_name, ops, &o, &v);
    if (err) {
        fail("loading", err);
        goto done;
    }
    double load_ms = ditd_now_ms() - t0;
    size_t zn = (size_t)cfg.latent_channels * h * h, pn = (size_t)cfg.out_channels * h * f * h * f;
    z = malloc(zn * sizeof *z);
    img = rank == 0 ? malloc(pn * sizeof *img) : NULL;
    t = calloc((size_t)iters, sizeof *t);
    tc = calloc((size_t)iters, sizeof *tc);
    if (!z || (rank == 0 && !img) || !t || !tc) {
        fail("buffers", DITD_ENOMEM);
        goto done;
    }
    ditd_philox_normal(7, 0, 0, zn, z);
    if (encode) {
        rc = bench_encode(v, world, rank, P, nth, vae_name, (int)size, warmup, iters, load_ms);
        goto done;
    }
    ditd_vae_stats st = {0};
    for (long i = 0; i < warmup + iters; i++) {
        if (world)
            ditd_comm_barrier(world);
        if (world)
            ditd_comm_stats_reset(world);
        t0 = ditd_now_ms();
        double c0 = cpu_ms();
        if ((err = ditd_vae_decode(v, z, 1, h, h, img))) {
            fail("decoding", err);
            goto done;
        }
        if (i >= warmup) {
            t[i - warmup] = ditd_now_ms() - t0;
            tc[i - warmup] = cpu_ms() - c0;
            st = ditd_vae_last_stats(v);
        }
    }
    qsort(t, (size_t)iters, sizeof *t, cmp_double);
    double med = iters % 2 ? t[iters / 2] : 0.5 * (t[iters / 2 - 1] + t[iters / 2]);
    qsort(tc, (size_t)iters, sizeof *tc, cmp_double);
    double cmed = iters % 2 ? tc[iters / 2] : 0.5 * (tc[iters / 2 - 1] + tc[iters / 2]);
    double fl = ditd_vae_config_decode_flops(&cfg, h, h);
    if (rank == 0) {
        printf("vae decode  %-14s %4ldx%-4ld latent %dx%dx%d  ranks %d  threads %d%s\n", vae_name, size,
               size, cfg.latent_channels, h, h, P, nth, tiling ? "  tiled" : "");
        printf("  median %.1f ms (min %.1f, %ld iters)  %.1f GFLOP/s  load %.0f ms  peak RSS %.0f MiB (rank 0)\n",
               med, t[0], iters, fl / (med * 1e6), load_ms, peak_rss_mib());
        printf("  process CPU time per decode: median %.1f ms (all threads; on a shared machine the\n"
               "  less noisy measure of the work done)\n", cmed);
    }
    if (P > 1) {
        const ditd_comm_stat *cs = ditd_comm_stats(world);
        double hb, hc, ab, ac;
        int m = unit > 0 ? (int)unit : (512 + h - 1) / h;
        m = m > 8 ? 8 : m;
        analytic(&cfg, h, h, m, P, &hb, &hc, &ab, &ac);
        if (rank == 0) {
            printf("  rank 0: compute %.1f ms, communication %.1f ms (last run; unit %d latent rows)\n",
                   st.compute_ms, st.comm_ms, m);
            printf("  %-11s %8s %12s   %8s %12s\n", "collective", "calls", "bytes", "analytic", "bytes");
            printf("  %-11s %8llu %12llu   %8.0f %12.0f\n", "sendrecv",
                   (unsigned long long)cs[DITD_COLL_SENDRECV].calls,
                   (unsigned long long)cs[DITD_COLL_SENDRECV].bytes, hc, hb);
            printf("  %-11s %8llu %12llu   %8.0f %12.0f\n", "allgatherv",
                   (unsigned long long)cs[DITD_COLL_ALLGATHERV].calls,
                   (unsigned long long)cs[DITD_COLL_ALLGATHERV].bytes, ac, ab);
        }
    }
    if (steps > 0 && rank == 0 && P == 1) {
        /* end to end for one image with guidance: K forwards of a batch of 2 */
        ditd_dit_config dc;
        ditd_dit *m = NULL;
        if ((err = ditd_dit_config_named(dit_name, h, &dc)) ||
            (err = ditd_dit_new_random(&dc, ops, 2, 1, &m))) {
            fail(dit_name, err);
            goto done;
        }
        size_t xn = (size_t)dc.in_channels * h * h, on = (size_t)dc.out_channels * h * h;
        float *x = malloc(2 * xn * sizeof *x), *y = malloc(2 * on * sizeof *y), ht[2] = {500, 500};
        int64_t hy[2] = {207, 1000};
        ditd_philox_normal(9, 0, 0, 2 * xn, x);
        ditd_dit_forward(m, 2, x, ht, hy, y); /* warm-up */
        t0 = ditd_now_ms();
        for (long s = 0; s < steps; s++)
            ditd_dit_forward(m, 2, x, ht, hy, y);
        double den = ditd_now_ms() - t0;
        printf("end to end  %s-%d + %s, %ld steps, guidance (batch 2): denoising %.0f ms (%.0f ms/step), "
               "decoding %.0f ms, %.0f ms per image\n",
               dit_name, (int)size, vae_name, steps, den, den / steps, med, den + med);
        free(x);
        free(y);
        ditd_dit_free(m);
    }
    rc = 0;
done:
    ditd_vae_free(v);
    free(z);
    free(img);
    free(t);
    free(tc);
    ditd_comm_free(world);
    if (mpi)
        ditd_comm_mpi_finalize();
    return rc;
}
