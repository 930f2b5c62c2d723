/* `ditd bench`: times DiT forwards (random weights for a named config, or a
 * model folder's real weights) and prints a table: median ms per forward
 * after warm-up, GFLOP/s, peak RSS, and the backend's GEMM rate at the
 * forward's own shapes. A benchmark prints; it asserts nothing. */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "engine/core/clock.h"
#include "engine/backend/backend.h"
#include "engine/parallel/comm.h"
#include "engine/models/dit/dit.h"
#include "engine/core/error.h"
#include "engine/models/model.h"
#include "engine/models/model_storage.h"
#include "engine/core/philox.h"
#include "server/cmd/cli.h"
#include "engine/worker/replica.h"
#include "server/cmd/cmd.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: ditd bench [options]\n"
            "\n"
            "  --device D       cpu or cuda (default cpu; cuda: one GPU, one rank)\n"
            "  --dtype T        CPU weights: f32, bf16 or auto (default auto: bf16 for a\n"
            "                   16-bit --model on a CPU with AVX512-BF16/AMX, else f32)\n"
            "  --config NAME    DiT-S/2, DiT-B/2, DiT-L/2, DiT-XL/2 (/4, /8): random weights\n"
            "                   (default DiT-XL/2)\n"
            "  --model DIR      a model folder instead (its real weights)\n"
            "  --transformer-file F  with --model: the transformer's weights from this\n"
            "                   .gguf or .safetensors file (docs/quant.md)\n"
            "  --text-encoder-2-file F  with --model: text_encoder_2's (a T5) from F\n"
            "  --tokens N       tokens per sample, a square grid (default 256)\n"
            "  --batch B        samples per forward (default 2)\n"
            "  --threads T      CPU threads (default: all)\n"
            "  --iters K        timed forwards (default 5)\n"
            "  --warmup W       untimed forwards first (default 1)\n"
            "  --no-gemm        skip the GEMM table\n"
            "  --vae NAME|DIR   the VAE decode instead (ditd bench --vae x --help)\n"
            "\n"
            "parallel (mpirun -np G ditd bench ..., G = C*R*U*T; one step = one forward\n"
            "of the batch, split in halves under cfg): prints per step the compute time,\n"
            "and per axis and collective the calls, time and bytes, measured and analytic:\n"
            "  --ulysses-degree U  --ring-degree R  --ring-rotate allgather|p2p\n"
            "  --tp-degree T       --cfg-degree C\n");
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
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
    fprintf(stderr, "ditd bench: %s: %s%s%s\n", what, ditd_strerror(err), *d ? ": " : "", d);
    return 1;
}

/* Times y = x @ w^T for one GEMM shape with the backend's linear (no bias,
 * no activation: BLAS alone). Buffers are the model's own activations. */
static double gemm_gflops(const ditd_backend_ops *ops, void *x, void *w, void *y, int M, int N,
                          int K, int iters)
{
    double t[16];
    if (iters > 16)
        iters = 16;
    ops->linear(x, (size_t)K, w, NULL, y, (size_t)N, M, N, K, DITD_ACT_NONE);
    for (int i = 0; i < iters; i++) {
        double t0 = ditd_now_ms();
        ops->linear(x, (size_t)K, w, NULL, y, (size_t)N, M, N, K, DITD_ACT_NONE);
        ops->sync();
        t[i] = ditd_now_ms() - t0;
    }
    return 2.0 * M * N * K / (median(t, iters) * 1e6);
}

/* ---- parallel: one group of G ranks (mpirun -np G ditd bench ...) ---- */

/* Logical bytes per step on this rank for an even split, from the model's
 * dimensions alone (the conventions of engine/parallel/comm.h), per axis and kind. */
static void analytic_bytes(const ditd_dit_config *c, const ditd_layout *l, int B, int N,
                           double out[DITD_AXIS_COUNT][DITD_COLL_COUNT])
{
    double L = c->num_layers, D = c->inner_dim, Dh = c->head_dim;
    double T = l->tp, U = l->ulysses, R = l->ring, C = l->cfg;
    double Hl = (double)c->num_heads / T, n = (double)N / (R * U), es = 4;
    double po = (double)c->patch_size * c->patch_size * c->out_channels;
    memset(out, 0, sizeof(double) * DITD_AXIS_COUNT * DITD_COLL_COUNT);
    /* q, k, v out and attention back: 4 (B, n, H_loc/U, Dh) slabs to each of U-1 peers */
    out[DITD_AXIS_ULYSSES][DITD_COLL_ALLTOALLV] = L * 4 * B * n * Hl * Dh * (U - 1) / U * es;
    /* K and V of this ring chunk (B, N/R, H_loc/U, Dh) to R-1 peers */
    double ring = L * 2 * B * (N / R) * (Hl / U) * Dh * (R - 1) * es;
    out[DITD_AXIS_RING][l->rotate == DITD_RING_P2P ? DITD_COLL_SENDRECV : DITD_COLL_ALLGATHERV] =
        ring;
    /* after attention out and fc2: (B, n, D) each, 2 (T-1)/T */
    out[DITD_AXIS_TP][DITD_COLL_ALLREDUCE] = L * 2 * B * n * D * es * 2 * (T - 1) / T;
    /* final tokens (B, n, p*p*Co) to the other cp ranks */
    out[DITD_AXIS_CP][DITD_COLL_ALLGATHERV] = B * n * po * es * (R * U - 1);
    /* this half's noise predictions (B, Co, S, S) to the other half */
    out[DITD_AXIS_CFG][DITD_COLL_ALLGATHERV] =
        B * (double)c->out_channels * c->sample_size * c->sample_size * es * (C - 1);
}

/* `--model DIR`: the folder opened as `ditd serve` and `ditd generate` open
 * a replica (engine/worker/replica.h; no decode, no encoders), at `tokens`
 * image tokens; the DiT it loads is the one measured (`ditd bench`
 * measures a DiTTransformer2DModel: its FLOP and byte formulas are the
 * DiT's). The pipeline's denoiser holds 2 x max_samples rows (max_samples
 * on one cfg half), so max_samples is what holds `rows`. Says why on
 * stderr when it fails. */
/* --transformer-file, --text-encoder-2-file (NULL: the folder's) */
static const char *g_transformer_file, *g_text_encoder_2_file;

static int open_model(const char *model_dir, ditd_device dev, const char *dtype, long tokens,
                      int rows, ditd_mesh *mesh, ditd_replica *rep, ditd_dit **m)
{
    ditd_replica_opts o = {.model_dir = model_dir, .device = dev, .dtype = dtype, .mesh = mesh,
                           .transformer_file = g_transformer_file,
                           .text_encoder_2_file = g_text_encoder_2_file};
    int err = ditd_replica_begin(&o, rep);
    if (err)
        return fail(model_dir, err), err;
    if (rep->info.denoiser != &ditd_dit_family) {
        err = ditd_err_set(DITD_EUNSUPPORTED, "%s is a %s; ditd bench measures %s", model_dir,
                           rep->info.denoiser_class, ditd_dit_family.class_name);
        return fail(model_dir, err), err;
    }
    if (tokens != rep->info.shapes.tokens) {
        fprintf(stderr, "ditd bench: %s runs at %d tokens; --tokens %ld differs\n", model_dir,
                rep->info.shapes.tokens, tokens);
        return DITD_EINVAL;
    }
    o.max_samples = mesh && mesh->size > 1 && mesh->layout.cfg == 2 ? rows : (rows + 1) / 2;
    if ((err = ditd_replica_load(&o, rep)))
        return fail("--model/--dtype", err), err;
    *m = (ditd_dit *)rep->pipe->den;
    return 0;
}

static int bench_group(const ditd_layout *layout, const char *model_dir, const char *config,
                       long tokens, long batch, long threads, long iters, long warmup,
                       const char *dtype)
{
    const ditd_backend_ops *ops = ditd_backend_get(DITD_DEVICE_CPU);
    ditd_comm *world = NULL;
    ditd_mesh *mesh = NULL;
    ditd_dit_config cfg;
    ditd_replica rep = {0}; /* --model: the folder's replica, which owns m */
    ditd_dit *m = NULL;
    int err, rc = 1;
    long side = lround(sqrt((double)tokens));
    float *hx = NULL, *out = NULL, *ht = NULL;
    int64_t *hy = NULL;
    double *steps = NULL, stat_ms[DITD_AXIS_COUNT][DITD_COLL_COUNT] = {{0}};
    uint64_t stat_bytes[DITD_AXIS_COUNT][DITD_COLL_COUNT] = {{0}};
    uint64_t stat_calls[DITD_AXIS_COUNT][DITD_COLL_COUNT] = {{0}};

    if ((err = ditd_comm_mpi_init(NULL, NULL)) || (err = ditd_comm_mpi_world(&world)))
        return fail("MPI", err);
    if ((err = ditd_mesh_new(world, layout, &mesh))) {
        fail("layout", err);
        rc = 2;
        goto done;
    }
    int leader = ditd_mesh_is_leader(mesh);
    if (side * side != tokens) {
        if (leader)
            fprintf(stderr, "ditd bench: --tokens %ld is not a square grid\n", tokens);
        rc = 2;
        goto done;
    }
    if (batch % layout->cfg) {
        if (leader)
            fprintf(stderr, "ditd bench: --batch %ld does not split into %d cfg halves\n", batch,
                    layout->cfg);
        rc = 2;
        goto done;
    }
    int B = (int)batch / layout->cfg;
    int nthreads = ops->set_threads((int)threads);
    if (model_dir) {
        if ((err = open_model(model_dir, DITD_DEVICE_CPU, dtype, tokens, B, mesh, &rep, &m)))
            goto done;
        cfg = m->cfg;
        ops = m->ops;
    } else {
        if ((err = ditd_dit_config_named(config, 2 * (int)side, &cfg))) {
            fail("--config", err);
            goto done;
        }
        if (side * cfg.patch_size != cfg.sample_size) {
            cfg.sample_size = (int)side * cfg.patch_size;
            if ((err = ditd_dit_config_finish(&cfg, config))) {
                fail("--config", err);
                goto done;
            }
        }
        if (!(ops = ditd_backend_for_weights(ops, dtype, DITD_DTYPE_F32))) {
            fail("--dtype", DITD_EINVAL);
            goto done;
        }
        err = ditd_dit_new_random_mesh(&cfg, ops, B, 1234, mesh, &m);
    }
    if (err) {
        fail("model", err);
        goto done;
    }
    size_t numel = (size_t)cfg.in_channels * (size_t)cfg.sample_size * (size_t)cfg.sample_size;
    size_t numel_out = (size_t)cfg.out_channels * (size_t)cfg.sample_size * (size_t)cfg.sample_size;
    hx = malloc((size_t)batch * numel * sizeof *hx);
    out = malloc((size_t)batch * numel_out * sizeof *out);
    ht = malloc((size_t)batch * sizeof *ht);
    hy = malloc((size_t)batch * sizeof *hy);
    steps = malloc((size_t)iters * sizeof *steps);
    if (!hx || !out || !ht || !hy || !steps) {
        fprintf(stderr, "ditd bench: out of memory\n");
        goto done;
    }
    ditd_philox_normal(7, 0, 0, (size_t)batch * numel, hx);
    for (long i = 0; i < batch; i++) {
        ht[i] = (float)(999 - 37 * i % 1000);
        hy[i] = (int64_t)(i * 7 % cfg.num_embeds_ada_norm);
    }
    int half = mesh->cfg_rank, r0 = half * B;
    int counts[2] = {(int)((size_t)B * numel_out), (int)((size_t)B * numel_out)};
    int displs[2] = {0, counts[0]};
    uint64_t waits = 0, waits_ready = 0;
    for (long it = -warmup; it < iters; it++) {
        if (it == 0)
            ditd_comm_mpi_wait_stats(NULL, NULL, 1);
        ditd_mesh_stats_reset(mesh);
        ditd_comm_barrier(mesh->group);
        double t0 = ditd_now_ms();
        if ((err = ditd_dit_forward(m, B, hx + (size_t)r0 * numel, ht + r0, hy + r0,
                                    out + (size_t)r0 * numel_out))) {
            fail("forward", err);
            goto done;
        }
        if (layout->cfg > 1 &&
            (err = ditd_comm_allgatherv(mesh->cfg_comm, DITD_DTYPE_F32, NULL, out, counts, displs)))
            goto done;
        ops->sync();
        double t = ditd_now_ms() - t0;
        if (it < 0)
            continue;
        steps[it] = t;
        for (int a = 0; a < DITD_AXIS_COUNT; a++) {
            const ditd_comm_stat *st = ditd_comm_stats(ditd_mesh_comm(mesh, (ditd_mesh_axis)a));
            for (int k = 0; k < DITD_COLL_COUNT; k++) {
                stat_ms[a][k] += st[k].ms;
                stat_bytes[a][k] += st[k].bytes;
                stat_calls[a][k] += st[k].calls;
            }
        }
    }
    ditd_comm_mpi_wait_stats(&waits, &waits_ready, 1);
    double comm_ms = 0, an[DITD_AXIS_COUNT][DITD_COLL_COUNT];
    for (int a = 0; a < DITD_AXIS_COUNT; a++)
        for (int k = 0; k < DITD_COLL_COUNT; k++)
            comm_ms += stat_ms[a][k] / (double)iters;
    double med = median(steps, (int)iters);
    analytic_bytes(&cfg, layout, B, m->N, an);
    if (leader) {
        printf("| model | tokens | batch | layout | ranks | threads/rank | ms/step (median) | compute ms | comm ms (mean) |\n");
        printf("|---|---|---|---|---|---|---|---|---|\n");
        printf("| %s | %d | %ld | cfg %d x ring %d (%s) x ulysses %d x tp %d | %d | %d | %.1f | %.1f | %.1f |\n",
               model_dir ? model_dir : config, m->N, batch, layout->cfg, layout->ring,
               ditd_ring_rotate_name(layout->rotate), layout->ulysses, layout->tp, mesh->size,
               nthreads, med, med - comm_ms, comm_ms);
        printf("\n| axis | collective | calls/step | ms/step | MB/step measured | MB/step analytic |\n");
        printf("|---|---|---|---|---|---|\n");
        for (int a = 0; a < DITD_AXIS_COUNT; a++)
            for (int k = 0; k < DITD_COLL_COUNT; k++) {
                if (!stat_calls[a][k] && an[a][k] == 0)
                    continue;
                printf("| %s | %s | %.0f | %.2f | %.3f | %.3f |\n",
                       ditd_mesh_axis_name((ditd_mesh_axis)a), ditd_coll_name((ditd_coll)k),
                       (double)stat_calls[a][k] / (double)iters, stat_ms[a][k] / (double)iters,
                       (double)stat_bytes[a][k] / (double)iters / 1e6, an[a][k] / 1e6);
            }
        printf("\n(rank 0's view; bytes are logical bytes sent by this rank, see engine/parallel/comm.h)\n");
    }
    /* the ring's p2p transfers alone, same sizes and count, nothing to hide
     * them behind: what share of them the forward hid (docs/cpu.md) */
    uint64_t rc_calls = stat_calls[DITD_AXIS_RING][DITD_COLL_SENDRECV];
    if (layout->ring > 1 && layout->rotate == DITD_RING_P2P && rc_calls > 0) {
        size_t n = (size_t)(stat_bytes[DITD_AXIS_RING][DITD_COLL_SENDRECV] / rc_calls) / sizeof(float);
        float *sb = calloc(n ? n : 1, sizeof *sb), *rb = calloc(n ? n : 1, sizeof *rb);
        double *bare = malloc((size_t)iters * sizeof *bare);
        ditd_comm *rcomm = mesh->ring_comm;
        int per_step = (int)(rc_calls / (uint64_t)iters);
        if (!sb || !rb || !bare) {
            fprintf(stderr, "ditd bench: out of memory\n");
            free(sb), free(rb), free(bare);
            goto done;
        }
        for (long it = 0; it < iters && !err; it++) {
            ditd_comm_barrier(rcomm);
            double t0 = ditd_now_ms();
            for (int k = 0; k < per_step && !err; k++) {
                ditd_comm_req req;
                err = ditd_comm_sendrecv_start(rcomm, DITD_DTYPE_F32, sb, (int)n,
                                               (rcomm->rank + 1) % rcomm->size, rb, (int)n,
                                               (rcomm->rank + rcomm->size - 1) % rcomm->size, &req);
                if (!err)
                    err = ditd_comm_wait(rcomm, &req);
            }
            bare[it] = ditd_now_ms() - t0;
        }
        double exposed = stat_ms[DITD_AXIS_RING][DITD_COLL_SENDRECV] / (double)iters;
        double alone = err ? 0 : median(bare, (int)iters);
        if (leader && !err)
            printf("\nring p2p (rank 0): %d transfers/step of %.2f MB, progress thread %s\n"
                   "| transfers complete when the wait began (hidden) | ms/step in the waits (mean; "
                   "includes waiting for a slower peer) | ms/step of the same transfers alone "
                   "(median) |\n|---|---|---|\n| %llu of %llu (%.0f%%) | %.1f | %.1f |\n",
                   per_step, n * sizeof(float) / 1e6,
                   ditd_comm_mpi_progress_thread() ? "on"
                                                   : "off (DITD_MPI_PROGRESS=0 or no MPI_THREAD_MULTIPLE)",
                   (unsigned long long)waits_ready, (unsigned long long)waits,
                   waits ? 100.0 * (double)waits_ready / (double)waits : 0.0, exposed, alone);
        free(sb), free(rb), free(bare);
        if (err) {
            fail("ring transfer", err);
            goto done;
        }
    }
    rc = 0;
done:
    free(hx);
    free(out);
    free(ht);
    free(hy);
    free(steps);
    if (!rep.pipe) /* else the replica's */
        ditd_dit_free(m);
    ditd_replica_close(&rep);
    ditd_mesh_free(mesh);
    ditd_comm_free(world);
    ditd_comm_mpi_finalize();
    return rc;
}

int ditd_cmd_bench(int argc, char **argv)
{
    enum { O_CONFIG = 256, O_MODEL, O_TOKENS, O_BATCH, O_THREADS, O_ITERS, O_WARMUP, O_NOGEMM, O_DEVICE,
           O_DTYPE, O_TFILE, O_TE2FILE };
    static const struct option opts[] = {
        {"config", required_argument, 0, O_CONFIG},   {"model", required_argument, 0, O_MODEL},
        {"tokens", required_argument, 0, O_TOKENS},   {"batch", required_argument, 0, O_BATCH},
        {"threads", required_argument, 0, O_THREADS}, {"iters", required_argument, 0, O_ITERS},
        {"warmup", required_argument, 0, O_WARMUP},   {"no-gemm", no_argument, 0, O_NOGEMM},
        {"help", no_argument, 0, 'h'},
        DITD_LAYOUT_LONGOPTS,
        {"device", required_argument, 0, O_DEVICE},
        {"dtype", required_argument, 0, O_DTYPE},
        {"transformer-file", required_argument, 0, O_TFILE},
        {"text-encoder-2-file", required_argument, 0, O_TE2FILE},
        {0, 0, 0, 0}};
    ditd_layout layout = DITD_LAYOUT_SINGLE;
    const char *config = "DiT-XL/2", *model_dir = NULL, *dtype = "auto";
    long tokens = 256, batch = 2, threads = 0, iters = 5, warmup = 1;
    int c, err, do_gemm = 1, rc = 1;
    ditd_device device = DITD_DEVICE_CPU;

    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--vae") == 0 || strncmp(argv[i], "--vae=", 6) == 0)
            return ditd_cmd_bench_vae(argc, argv);
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        err = 0;
        switch (c) {
        case O_CONFIG: config = optarg; break;
        case O_MODEL: model_dir = optarg; break;
        case O_TOKENS: err = ditd_parse_long(optarg, 1, 1 << 20, "--tokens", &tokens); break;
        case O_BATCH: err = ditd_parse_long(optarg, 1, 1024, "--batch", &batch); break;
        case O_THREADS: err = ditd_parse_long(optarg, 1, 1024, "--threads", &threads); break;
        case O_ITERS: err = ditd_parse_long(optarg, 1, 1000, "--iters", &iters); break;
        case O_WARMUP: err = ditd_parse_long(optarg, 0, 1000, "--warmup", &warmup); break;
        case O_NOGEMM: do_gemm = 0; break;
        case O_DEVICE: err = ditd_device_from_str(optarg, &device); break;
        case O_DTYPE: dtype = optarg; break;
        case O_TFILE: g_transformer_file = optarg; break;
        case O_TE2FILE: g_text_encoder_2_file = optarg; break;
        case 'h': usage(stdout); return 0;
        default:
            if (ditd_layout_option(c, optarg, &layout, &err))
                break;
            usage(stderr);
            return 2;
        }
        if (err) {
            fprintf(stderr, "ditd bench: %s\n", ditd_err_detail());
            return 2;
        }
    }

    if (ditd_comm_launched_by_mpi() || ditd_layout_size(&layout) > 1) {
        if (device != DITD_DEVICE_CPU) {
            fprintf(stderr, "ditd bench: --device %s runs one rank (the parallel bench is CPU "
                            "only for now)\n", ditd_device_name(device));
            return 2;
        }
        return bench_group(&layout, model_dir, config, tokens, batch, threads, iters, warmup,
                           dtype);
    }

    const ditd_backend_ops *ops = ditd_backend_get(device);
    if (!ops)
        return fail("--device", DITD_EUNSUPPORTED);
    ditd_dit_config cfg;
    ditd_replica rep = {0}; /* --model: the folder's replica, which owns m */
    ditd_dit *m = NULL;
    long side = lround(sqrt((double)tokens));

    if (side * side != tokens) {
        fprintf(stderr, "ditd bench: --tokens %ld is not a square grid (256 = 16 x 16)\n", tokens);
        return 2;
    }
    int nthreads = ops->set_threads((int)threads);
    if (model_dir) {
        if ((err = open_model(model_dir, device, dtype, tokens, (int)batch, NULL, &rep, &m)))
            goto done;
        cfg = m->cfg;
        ops = m->ops;
    } else {
        if ((err = ditd_dit_config_named(config, 2 * (int)side, &cfg)))
            return fail("--config", err);
        if (side * cfg.patch_size != cfg.sample_size) {
            cfg.sample_size = (int)side * cfg.patch_size;
            if ((err = ditd_dit_config_finish(&cfg, config)))
                return fail("--config", err);
        }
        if (!(ops = ditd_backend_for_weights(ops, dtype, DITD_DTYPE_F32)))
            return fail("--dtype", DITD_EINVAL);
        err = ditd_dit_new_random(&cfg, ops, (int)batch, 1234, &m);
    }
    if (err) {
        fail("model", err);
        goto done;
    }

    size_t numel = (size_t)cfg.in_channels * (size_t)cfg.sample_size * (size_t)cfg.sample_size;
    size_t numel_out = (size_t)cfg.out_channels * (size_t)cfg.sample_size * (size_t)cfg.sample_size;
    float *hx = malloc((size_t)batch * numel * sizeof *hx);
    float *ht = malloc((size_t)batch * sizeof *ht);
    int64_t *hy = malloc((size_t)batch * sizeof *hy);
    float *out = malloc((size_t)batch * numel_out * sizeof *out);
    double *times = malloc((size_t)iters * sizeof *times);
    if (!hx || !ht || !hy || !out || !times) {
        fprintf(stderr, "ditd bench: out of memory\n");
        goto done_bufs;
    }
    ditd_philox_normal(7, 0, 0, (size_t)batch * numel, hx);
    for (long i = 0; i < batch; i++) {
        ht[i] = (float)(999 - 37 * i % 1000);
        hy[i] = (int64_t)(i * 7 % cfg.num_embeds_ada_norm);
    }
    /* the model's input and output in the backend's memory (host on the CPU) */
    void *x_in = hx, *y_out = out;
    if (ops->mem_alloc) {
        if (!m->acts.mem_alloc) {
            fprintf(stderr, "ditd bench: the model's arenas are host memory; --device %s needs "
                            "engine/models/dit/dit.c to commit them through ops->mem_alloc (docs/cuda.md)\n",
                    ops->name);
            goto done_bufs;
        }
        x_in = y_out = NULL;
        if ((err = ops->mem_alloc(&x_in, (size_t)batch * numel * ditd_dtype_size(ops->act_dtype))) ||
            (err = ops->mem_alloc(&y_out,
                                  (size_t)batch * numel_out * ditd_dtype_size(ops->act_dtype)))) {
            fail("device buffers", err);
            goto done_dev;
        }
        ops->upload(x_in, hx, (size_t)batch * numel);
    }
    for (long i = 0; i < warmup; i++) {
        if ((err = ditd_dit_forward(m, (int)batch, x_in, ht, hy, y_out))) {
            fail("forward", err);
            goto done_dev;
        }
    }
    ops->sync();
    if ((err = ops->status())) {
        fail("forward", err);
        goto done_dev;
    }
    /* the CPU's FMA peak (the best of its samples), measured now and again
     * after the forwards (the clock of a shared machine moves): the larger
     * is the ceiling. Set beside the median forward and the fastest one. */
    int peak_bits = 0;
    double peak = 0;
    if (ops->device == DITD_DEVICE_CPU)
        peak = ditd_backend_cpu_fma_peak(nthreads, 1.0, &peak_bits);
    for (long i = 0; i < iters; i++) {
        double t0 = ditd_now_ms();
        ditd_dit_forward(m, (int)batch, x_in, ht, hy, y_out);
        ops->sync();
        times[i] = ditd_now_ms() - t0;
    }
    if ((err = ops->status())) {
        fail("forward", err);
        goto done_dev;
    }
    if (ops->device == DITD_DEVICE_CPU) {
        double p2 = ditd_backend_cpu_fma_peak(nthreads, 1.0, &peak_bits);
        peak = p2 > peak ? p2 : peak;
    }
    double flops = ditd_dit_config_flops(&cfg, (int)batch, m->N);
    double lo = times[0], hi = times[0];
    for (long i = 1; i < iters; i++) {
        lo = times[i] < lo ? times[i] : lo;
        hi = times[i] > hi ? times[i] : hi;
    }
    double med = median(times, (int)iters);
    if (ops->device == DITD_DEVICE_CPU) {
        const char *ct = getenv("OPENBLAS_CORETYPE");
        printf("GEMM: %s\n", ditd_backend_cpu_gemm_info());
        printf("FMA peak: %.1f GFLOP/s (%d threads, 24 independent %d-bit accumulators each, "
               "measured before and after the forwards); OPENBLAS_CORETYPE=%s\n\n",
               peak, nthreads, peak_bits, ct ? ct : "(unset)");
    }
    double gf = flops / (med * 1e6);
    double gf_best = flops / (lo * 1e6);
    printf("| model | backend | weights | tokens | batch | threads | params (M) | ms/forward (median) | min | max | GFLOP/s | %% of FMA peak | GFLOP/s (fastest) | %% of peak (fastest) | peak RSS (MiB) |\n");
    printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    printf("| %s | %s | %s | %d | %ld | %d | %.1f | %.1f | %.1f | %.1f | %.1f | %.0f%% | %.1f | %.0f%% | %.0f |\n",
           model_dir ? model_dir : config, ops->name, ditd_dtype_name(ops->weight_dtype), m->N,
           batch, nthreads, ditd_dit_config_params(&cfg) / 1e6, med, lo, hi, gf,
           peak > 0 ? 100 * gf / peak : 0.0, gf_best, peak > 0 ? 100 * gf_best / peak : 0.0,
           peak_rss_mib());
    if (model_dir) { /* what the weights are stored as: a GGUF Q4_K and a bf16 told apart */
        ditd_model_storage st;
        char line[512];
        ditd_model_storage_read(&rep.info, &st);
        printf("\n");
        for (int i = 0; i < st.n; i++) {
            ditd_component_storage_line(&st.c[i], line, sizeof line);
            printf("storage: %s: %s\n", st.c[i].component, line);
        }
    }

    if (do_gemm) {
        /* The forward's GEMMs: M = B*N rows; buffers reused from the model. */
        int D = cfg.inner_dim, F = cfg.ff_dim, M = (int)batch * m->N;
        struct {
            const char *what;
            void *x, *w, *y;
            int N, K;
        } g[] = {
            {"qkv", m->xn, m->blocks[0].qkv_w, m->qkv, 3 * D, D},
            {"attn out", m->att, m->blocks[0].o_w, m->xn, D, D},
            {"mlp fc1", m->xn, m->blocks[0].ff1_w, m->ff, F, D},
            {"mlp fc2", m->ff, m->blocks[0].ff2_w, m->xn, D, F},
        };
        printf("\n| GEMM | M | N | K | GFLOP/s (backend linear, no epilogue) |\n|---|---|---|---|---|\n");
        for (size_t i = 0; i < sizeof g / sizeof g[0]; i++)
            printf("| %s | %d | %d | %d | %.1f |\n", g[i].what, M, g[i].N, g[i].K,
                   gemm_gflops(ops, g[i].x, g[i].w, g[i].y, M, g[i].N, g[i].K, 5));
    }
    rc = ops->status() ? 1 : 0;
done_dev:
    if (ops->mem_free && x_in != hx) {
        if (x_in)
            ops->mem_free(x_in, 0);
        if (y_out)
            ops->mem_free(y_out, 0);
    }
done_bufs:
    free(hx);
    free(ht);
    free(hy);
    free(out);
    free(times);
done:
    if (!rep.pipe) /* else the replica's */
        ditd_dit_free(m);
    ditd_replica_close(&rep);
    return rc;
}
