/* Benchmark, not a test (it asserts nothing): the FLUX transformer's forward
 * on the CUDA backend at FLUX.1-dev's width (hidden 3072, 24 heads x 128, T5
 * 4096, CLIP 768, guidance embeds) and reduced depth, at 1024x1024 (a 128x128
 * latent: 4096 image tokens) with 512 text tokens, batch 1 (options change
 * them). Random bf16 weights are written to a temporary checkpoint first
 * (tests/gpu/st_bf16_writer.h), for three models: 1 double block, 1 single
 * block, and one of each; their times give ms per double block, per single
 * block and for the rest (embedders, norm_out, proj_out, the uploads), and
 * from those a projection of the full model (19 double + 38 single blocks),
 * printed as a projection.
 *
 *   bench_cuda_flux [--latent S] [--text L] [--batch B] [--iters N] [--warmup W]
 *
 * FLOPs counted per block: 24 D^2 T (the linears: qkv 3 D^2, out D^2, the
 * MLP 8 D^2 per token in a double block; qkv 3 D^2, proj_mlp 4 D^2,
 * proj_out 5 D^2 in a single one) + 4 T^2 D (QK^T and PV), T = image + text
 * tokens; the adaLN linears (batch rows only) are left out. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "engine/backend/backend.h"
#include "engine/backend/backend_cuda.h"
#include "engine/core/error.h"
#include "engine/models/flux/flux.h"
#include "tests/gpu/st_bf16_writer.h"

typedef struct spec {
    st_entry *e;
    size_t n, cap;
} spec;

static int add(spec *s, const char *name, int64_t d0, int64_t d1)
{
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 256;
        st_entry *e = realloc(s->e, cap * sizeof *e);
        if (!e)
            return -1;
        s->e = e;
        s->cap = cap;
    }
    st_entry *e = &s->e[s->n++];
    memset(e, 0, sizeof *e);
    snprintf(e->name, sizeof e->name, "%s", name);
    e->nd = d1 > 0 ? 2 : 1;
    e->shape[0] = d0;
    e->shape[1] = d1 > 0 ? d1 : 0;
    return 0;
}

static int lin(spec *s, const char *pre, int64_t n, int64_t k)
{
    char name[160];
    snprintf(name, sizeof name, "%s.weight", pre);
    if (add(s, name, n, k))
        return -1;
    snprintf(name, sizeof name, "%s.bias", pre);
    return add(s, name, n, 0);
}

/* The tensors of FluxTransformer2DModel with config c (engine/models/flux/flux.c's names). */
static int flux_tensors(const ditd_flux_config *c, spec *s)
{
    int64_t D = c->inner_dim, F = c->mlp_dim, Dh = c->head_dim;
    char p[160];
    int err = 0;
    err |= lin(s, "x_embedder", D, c->in_channels);
    err |= lin(s, "context_embedder", D, c->joint_attention_dim);
    err |= lin(s, "time_text_embed.timestep_embedder.linear_1", D, 256);
    err |= lin(s, "time_text_embed.timestep_embedder.linear_2", D, D);
    if (c->guidance_embeds) {
        err |= lin(s, "time_text_embed.guidance_embedder.linear_1", D, 256);
        err |= lin(s, "time_text_embed.guidance_embedder.linear_2", D, D);
    }
    err |= lin(s, "time_text_embed.text_embedder.linear_1", D, c->pooled_dim);
    err |= lin(s, "time_text_embed.text_embedder.linear_2", D, D);
    err |= lin(s, "norm_out.linear", 2 * D, D);
    err |= lin(s, "proj_out", c->out_channels, D);
    for (int l = 0; l < c->num_layers; l++) {
        static const char *const lins[][2] = {
            {"norm1.linear", "6"}, {"norm1_context.linear", "6"}, {"attn.to_q", "1"},
            {"attn.to_k", "1"}, {"attn.to_v", "1"}, {"attn.add_q_proj", "1"},
            {"attn.add_k_proj", "1"}, {"attn.add_v_proj", "1"}, {"attn.to_out.0", "1"},
            {"attn.to_add_out", "1"}};
        for (size_t j = 0; j < sizeof lins / sizeof lins[0]; j++) {
            snprintf(p, sizeof p, "transformer_blocks.%d.%s", l, lins[j][0]);
            err |= lin(s, p, atoi(lins[j][1]) * D, D);
        }
        static const char *const norms[] = {"norm_q", "norm_k", "norm_added_q", "norm_added_k"};
        for (size_t j = 0; j < 4; j++) {
            snprintf(p, sizeof p, "transformer_blocks.%d.attn.%s.weight", l, norms[j]);
            err |= add(s, p, Dh, 0);
        }
        static const char *const ffs[] = {"ff", "ff_context"};
        for (size_t j = 0; j < 2; j++) {
            snprintf(p, sizeof p, "transformer_blocks.%d.%s.net.0.proj", l, ffs[j]);
            err |= lin(s, p, F, D);
            snprintf(p, sizeof p, "transformer_blocks.%d.%s.net.2", l, ffs[j]);
            err |= lin(s, p, D, F);
        }
    }
    for (int l = 0; l < c->num_single_layers; l++) {
        snprintf(p, sizeof p, "single_transformer_blocks.%d.norm.linear", l);
        err |= lin(s, p, 3 * D, D);
        static const char *const qkv[] = {"to_q", "to_k", "to_v"};
        for (size_t j = 0; j < 3; j++) {
            snprintf(p, sizeof p, "single_transformer_blocks.%d.attn.%s", l, qkv[j]);
            err |= lin(s, p, D, D);
        }
        snprintf(p, sizeof p, "single_transformer_blocks.%d.attn.norm_q.weight", l);
        err |= add(s, p, Dh, 0);
        snprintf(p, sizeof p, "single_transformer_blocks.%d.attn.norm_k.weight", l);
        err |= add(s, p, Dh, 0);
        snprintf(p, sizeof p, "single_transformer_blocks.%d.proj_mlp", l);
        err |= lin(s, p, F, D);
        snprintf(p, sizeof p, "single_transformer_blocks.%d.proj_out", l);
        err |= lin(s, p, D, D + F);
    }
    return err ? -1 : 0;
}

static uint64_t rng = 0x243f6a8885a308d3ull;

static float uniform(void) /* [-1, 1) */
{
    uint64_t z = (rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return (float)((double)((z ^ (z >> 31)) >> 11) / 4503599627370496.0 - 1.0);
}

/* weights U(-1, 1) / sqrt(fan_in), biases U(-0.1, 0.1), RMSNorm weights 1 */
static int fill_random(size_t i, const st_entry *e, float *buf, size_t numel, void *ud)
{
    (void)i, (void)ud;
    int norm = e->nd == 1 && strstr(e->name, ".norm_") != NULL; /* attn.norm_q.weight, ... */
    float scale = e->nd == 2 ? 1.0f / sqrtf((float)e->shape[1]) : 0.1f;
    for (size_t j = 0; j < numel; j++)
        buf[j] = norm ? 1.0f : scale * uniform();
    return 0;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Median ms per forward of a model with (dbl, sgl) blocks; < 0 on failure. */
static double time_model(const ditd_backend_ops *G, const char *tmp, int dbl, int sgl, int S,
                         int L, int B, int iters, int warmup)
{
    char json[256], path[600];
    ditd_flux_config c;
    spec s = {0};
    ditd_flux *m = NULL;
    void *dx = NULL, *dout = NULL;
    float *x = NULL, *text = NULL, *pooled = NULL, *t = NULL, *g = NULL;
    double *ms = calloc((size_t)iters, sizeof *ms), med = -1.0;
    int n = snprintf(json, sizeof json,
                     "{\"num_layers\": %d, \"num_single_layers\": %d, \"guidance_embeds\": true}",
                     dbl, sgl);
    snprintf(path, sizeof path, "%s/diffusion_pytorch_model.safetensors", tmp);
    double t0 = now_s();
    if (!ms || ditd_flux_config_parse(json, (size_t)n, "bench", &c) || flux_tensors(&c, &s) ||
        st_write_bf16(path, s.e, s.n, fill_random, NULL))
        goto out;
    double t1 = now_s();
    if (ditd_flux_new_mesh(&c, G, B, S, S, L, tmp, NULL, &m))
        goto out;
    double t2 = now_s();
    size_t nx = (size_t)B * c.latent_channels * S * S;
    size_t nt = (size_t)B * L * c.joint_attention_dim, np = (size_t)B * c.pooled_dim;
    if (!(x = malloc(nx * sizeof *x)) || !(text = malloc(nt * sizeof *text)) ||
        !(pooled = malloc(np * sizeof *pooled)) || !(t = malloc((size_t)B * sizeof *t)) ||
        !(g = malloc((size_t)B * sizeof *g)) || G->mem_alloc(&dx, nx * 2) ||
        G->mem_alloc(&dout, nx * 2))
        goto out;
    for (size_t i = 0; i < nx; i++)
        x[i] = uniform();
    for (size_t i = 0; i < nt; i++)
        text[i] = uniform();
    for (size_t i = 0; i < np; i++)
        pooled[i] = uniform();
    for (int b = 0; b < B; b++)
        t[b] = 500.0f, g[b] = 3.5f;
    G->upload(dx, x, nx);
    for (int it = -warmup; it < iters; it++) {
        G->sync();
        double a = now_s();
        if (ditd_flux_forward(m, B, dx, t, text, pooled, g, dout))
            goto out;
        G->sync();
        if (G->status())
            goto out;
        if (it >= 0)
            ms[it] = 1e3 * (now_s() - a);
    }
    qsort(ms, (size_t)iters, sizeof *ms, cmp_d);
    med = ms[iters / 2];
    printf("  %d double + %d single: %.3f ms/forward (median of %d; min %.3f, max %.3f); "
           "checkpoint %.2f GB written in %.1f s, loaded in %.1f s\n",
           dbl, sgl, med, iters, ms[0], ms[iters - 1], (double)ditd_flux_weight_bytes(m) / 1e9,
           t1 - t0, t2 - t1);
out:
    if (med < 0)
        fprintf(stderr, "bench_cuda_flux: %d double + %d single: %s\n", dbl, sgl,
                ditd_err_detail());
    if (dx)
        G->mem_free(dx, 0);
    if (dout)
        G->mem_free(dout, 0);
    ditd_flux_free(m);
    remove(path);
    free(s.e), free(ms), free(x), free(text), free(pooled), free(t), free(g);
    return med;
}

int main(int argc, char **argv)
{
    int S = 128, L = 512, B = 1, iters = 10, warmup = 2;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int *dst = !strcmp(a, "--latent") ? &S
                   : !strcmp(a, "--text") ? &L
                   : !strcmp(a, "--batch") ? &B
                   : !strcmp(a, "--iters") ? &iters
                   : !strcmp(a, "--warmup") ? &warmup
                                            : NULL;
        if (!dst || i + 1 >= argc || (*dst = atoi(argv[++i])) < (dst == &warmup ? 0 : 1)) {
            fprintf(stderr, "usage: bench_cuda_flux [--latent S] [--text L] [--batch B] "
                            "[--iters N] [--warmup W]\n");
            return 2;
        }
    }
    if (!ditd_backend_cuda_available()) {
        printf("no CUDA device: skipped\n");
        return 77;
    }
    const ditd_backend_ops *G = ditd_backend_get(DITD_DEVICE_CUDA);
    if (!G) {
        fprintf(stderr, "bench_cuda_flux: %s\n", ditd_err_detail());
        return 1;
    }
    char tmp[512];
    const char *base = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(tmp, sizeof tmp, "%s/ditd-bench-flux-XXXXXX", base);
    if (!mkdtemp(tmp)) {
        fprintf(stderr, "bench_cuda_flux: cannot make %s\n", tmp);
        return 1;
    }
    const double D = 3072, N = (double)(S / 2) * (S / 2), T = N + L;
    const double gflop_block = B * (24 * D * D * T + 4 * T * T * D) / 1e9;
    printf("bench_cuda_flux: FLUX.1-dev width (D 3072, 24 x 128, T5 4096, CLIP 768, guidance), "
           "latent %dx%d: %.0f image + %d text tokens, batch %d; bf16 weights and activations\n",
           S, S, N, L, B);
    double t10 = time_model(G, tmp, 1, 0, S, L, B, iters, warmup);
    double t01 = time_model(G, tmp, 0, 1, S, L, B, iters, warmup);
    double t11 = time_model(G, tmp, 1, 1, S, L, B, iters, warmup);
    rmdir(tmp);
    if (t10 < 0 || t01 < 0 || t11 < 0)
        return 1;
    double rest = t10 + t01 - t11, dbl = t10 - rest, sgl = t01 - rest;
    printf("| part | ms | GFLOP | TFLOP/s |\n| --- | --- | --- | --- |\n");
    printf("| double block | %.3f | %.0f | %.1f |\n", dbl, gflop_block, gflop_block / dbl);
    printf("| single block | %.3f | %.0f | %.1f |\n", sgl, gflop_block, gflop_block / sgl);
    printf("| embedders, norm_out, proj_out, uploads | %.3f | - | - |\n", rest);
    double step = 19 * dbl + 38 * sgl + rest;
    printf("projection (not measured): FLUX.1-dev, 19 double + 38 single blocks = %.1f ms per "
           "forward, 28 steps = %.2f s per image on this GPU\n",
           step, 28 * step / 1e3);
    ditd_backend_cuda_shutdown();
    return 0;
}
