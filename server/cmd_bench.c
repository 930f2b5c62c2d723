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

#include "engine/backend.h"
#include "engine/dit.h"
#include "engine/error.h"
#include "engine/model.h"
#include "engine/philox.h"
#include "server/cmd.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: ditd bench [options]\n"
            "\n"
            "  --config NAME    DiT-S/2, DiT-B/2, DiT-L/2, DiT-XL/2 (/4, /8): random weights\n"
            "                   (default DiT-XL/2)\n"
            "  --model DIR      a model folder instead (its real weights)\n"
            "  --tokens N       tokens per sample, a square grid (default 256)\n"
            "  --batch B        samples per forward (default 2)\n"
            "  --threads T      CPU threads (default: all)\n"
            "  --iters K        timed forwards (default 5)\n"
            "  --warmup W       untimed forwards first (default 1)\n"
            "  --no-gemm        skip the GEMM table\n");
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
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
        double t0 = now_ms();
        ops->linear(x, (size_t)K, w, NULL, y, (size_t)N, M, N, K, DITD_ACT_NONE);
        ops->sync();
        t[i] = now_ms() - t0;
    }
    return 2.0 * M * N * K / (median(t, iters) * 1e6);
}

int ditd_cmd_bench(int argc, char **argv)
{
    enum { O_CONFIG = 256, O_MODEL, O_TOKENS, O_BATCH, O_THREADS, O_ITERS, O_WARMUP, O_NOGEMM };
    static const struct option opts[] = {
        {"config", required_argument, 0, O_CONFIG},   {"model", required_argument, 0, O_MODEL},
        {"tokens", required_argument, 0, O_TOKENS},   {"batch", required_argument, 0, O_BATCH},
        {"threads", required_argument, 0, O_THREADS}, {"iters", required_argument, 0, O_ITERS},
        {"warmup", required_argument, 0, O_WARMUP},   {"no-gemm", no_argument, 0, O_NOGEMM},
        {"help", no_argument, 0, 'h'},                {0, 0, 0, 0}};
    const char *config = "DiT-XL/2", *model_dir = NULL;
    long tokens = 256, batch = 2, threads = 0, iters = 5, warmup = 1;
    int c, err, do_gemm = 1, rc = 1;

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
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
        if (err) {
            fprintf(stderr, "ditd bench: %s\n", ditd_err_detail());
            return 2;
        }
    }

    const ditd_backend_ops *ops = ditd_backend_get(DITD_DEVICE_CPU);
    ditd_dit_config cfg;
    ditd_model_info info;
    ditd_dit *m = NULL;
    long side = lround(sqrt((double)tokens));
    int have_info = 0;

    if (side * side != tokens) {
        fprintf(stderr, "ditd bench: --tokens %ld is not a square grid (256 = 16 x 16)\n", tokens);
        return 2;
    }
    int nthreads = ops->set_threads((int)threads);
    if (model_dir) {
        if ((err = ditd_model_info_load(model_dir, &info)))
            return fail(model_dir, err);
        have_info = 1;
        cfg = info.dit;
        if (side * cfg.patch_size != cfg.sample_size) {
            fprintf(stderr, "ditd bench: %s runs at %d tokens (sample_size %d, patch %d); --tokens %ld differs\n",
                    model_dir, (cfg.sample_size / cfg.patch_size) * (cfg.sample_size / cfg.patch_size),
                    cfg.sample_size, cfg.patch_size, tokens);
            goto done;
        }
        err = ditd_dit_new(&cfg, ops, (int)batch, info.transformer_dir, &m);
    } else {
        if ((err = ditd_dit_config_named(config, 2 * (int)side, &cfg)))
            return fail("--config", err);
        if (side * cfg.patch_size != cfg.sample_size) {
            cfg.sample_size = (int)side * cfg.patch_size;
            if ((err = ditd_dit_config_finish(&cfg, config)))
                return fail("--config", err);
        }
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
    for (long i = 0; i < warmup; i++) {
        if ((err = ditd_dit_forward(m, (int)batch, hx, ht, hy, out))) {
            fail("forward", err);
            goto done_bufs;
        }
    }
    for (long i = 0; i < iters; i++) {
        double t0 = now_ms();
        ditd_dit_forward(m, (int)batch, hx, ht, hy, out);
        ops->sync();
        times[i] = now_ms() - t0;
    }
    double flops = ditd_dit_config_flops(&cfg, (int)batch, m->N);
    double lo = times[0], hi = times[0];
    for (long i = 1; i < iters; i++) {
        lo = times[i] < lo ? times[i] : lo;
        hi = times[i] > hi ? times[i] : hi;
    }
    double med = median(times, (int)iters);
    printf("| model | backend | tokens | batch | threads | params (M) | ms/forward (median) | min | max | GFLOP/s | peak RSS (MiB) |\n");
    printf("|---|---|---|---|---|---|---|---|---|---|---|\n");
    printf("| %s | %s | %d | %ld | %d | %.1f | %.1f | %.1f | %.1f | %.1f | %.0f |\n",
           model_dir ? model_dir : config, ops->name, m->N, batch, nthreads,
           ditd_dit_config_params(&cfg) / 1e6, med, lo, hi, flops / (med * 1e6), peak_rss_mib());

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
    rc = 0;
done_bufs:
    free(hx);
    free(ht);
    free(hy);
    free(out);
    free(times);
done:
    ditd_dit_free(m);
    if (have_info)
        ditd_model_info_free(&info);
    return rc;
}
