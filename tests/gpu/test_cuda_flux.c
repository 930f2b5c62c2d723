/* GPU: the FLUX family on the CUDA backend. Exits 77 (skipped) without a GPU.
 *
 *   ops      rope and rmsnorm_heads (kernels/cuda/rope.cu) against the CPU's
 *            (kernels/cpu/rope.c) on random inputs, several shapes (odd token
 *            counts, odd strides, odd head sizes, FLUX.1-dev's 24 x 128, the
 *            fused qkv views the model passes): through the CUDA backend table
 *            (bf16 storage, the RoPE table fp32 through upload_f32, which
 *            must be exact), and through the f32 kernel entries (which check
 *            the indexing without bf16 rounding in the way).
 *   weights  every fixture model loads on the CUDA backend with its weights in
 *            device memory, as bf16: as many bytes as the CPU's bf16-weight
 *            table holds, and weights equal to its bf16 rounding of the
 *            checkpoint, bit for bit; and
 *            a bf16 copy of the checkpoint (written here) gives a forward
 *            bit-identical to the f32 checkpoint's.
 *   forward  every forward case of tests/fixtures/flux on the CUDA backend
 *            against the CPU's bf16-weight table (the same weights, f32
 *            activations) and against Diffusers' float64.
 *
 * Bounds (rel = max|gpu - ref| / max|ref|; bf16's unit roundoff 2^-9):
 *   ROPE_BF16 = 4e-3: the same bf16 x and fp32 table on both sides (the
 *     table is fp32 on every backend, as in Diffusers), fp32 arithmetic, one
 *     rounding of each output (<= 2^-9 = 1.95e-3 of it);
 *   RMS_BF16 = 4e-3: the mean square in fp32 (the CPU in double: Dh 2^-24
 *     relative at most), one rounding of x * inv * w;
 *   F32_EXACTISH = 1e-5: the f32 entries; rope differs from the CPU only by
 *     FMA contraction (a few 2^-24), rmsnorm by the fp32 vs double sum
 *     (<= Dh 2^-24 = 7.6e-6 relative on the mean square for Dh 128, halved
 *     by the square root);
 *   FLUX_FWD_ACT = 2e-2 against the bf16-weight CPU table and FLUX_FWD_REF
 *     = 1.2e-1 against float64 Diffusers (the weights' own bf16 rounding
 *     dominates that one): tests/gpu/flux_bounds.h, where they are derived
 *     from a CPU emulation of bf16 storage that test_flux_bf16_emu keeps
 *     within half of each. The first GPU run is what confirms them
 *     (docs/cuda.md). rel_l2 is printed.
 * Floors: at least OPS_MIN op comparisons and FWD_MIN forward cases. */
#include <cuda_runtime_api.h>
#include <string.h>
#include <unistd.h>

#include "engine/backend/backend.h"
#include "engine/backend/backend_cuda.h"
#include "engine/io/safetensors.h"
#include "engine/models/flux/flux.h"
#include "kernels/cpu/rope.h"
#include "kernels/cuda/cuda_kernels.h"
#include "tests/flux_case.h"
#include "tests/gpu/flux_bounds.h"
#include "tests/gpu/st_bf16_writer.h"

#define ROPE_BF16 4e-3
#define RMS_BF16 4e-3
#define F32_EXACTISH 1e-5
#define OPS_MIN 24
#define FWD_MIN 5

static const ditd_backend_ops *G;
static const ditd_backend_ops *C = &ditd_backend_cpu;
static cudaStream_t ST;
static int compared;

/* uniform in [-scale, scale) */
static float *rnd(size_t n, float scale)
{
    float *h = malloc((n ? n : 1) * sizeof *h);
    for (size_t i = 0; i < n; i++)
        h[i] = scale * (float)((double)(tu_rng() >> 11) / 4503599627370496.0 - 1.0);
    return h;
}

static float *copy(const float *h, size_t n)
{
    float *c = malloc((n ? n : 1) * sizeof *c);
    memcpy(c, h, n * sizeof *c);
    return c;
}

/* Device bf16 copy of h; h becomes the rounded values both sides use. */
static void *dev_bf16(float *h, size_t n)
{
    void *d = NULL;
    TU_OK(G->mem_alloc(&d, n * 2));
    G->upload(d, h, n);
    G->download(h, d, n);
    TU_OK(G->status());
    return d;
}

static float *down_bf16(const void *d, size_t n)
{
    float *h = malloc((n ? n : 1) * sizeof *h);
    G->download(h, d, n);
    TU_OK(G->status());
    return h;
}

static float *dev_f32(const float *h, size_t n)
{
    float *d = NULL;
    TU_CHECK(cudaMalloc((void **)&d, n * sizeof(float)) == cudaSuccess, "cudaMalloc");
    TU_CHECK(cudaMemcpyAsync(d, h, n * sizeof(float), cudaMemcpyHostToDevice, ST) == cudaSuccess,
             "upload f32");
    return d;
}

static float *down_f32(const float *d, size_t n)
{
    float *h = malloc((n ? n : 1) * sizeof *h);
    TU_CHECK(cudaMemcpyAsync(h, d, n * sizeof(float), cudaMemcpyDeviceToHost, ST) == cudaSuccess &&
                 cudaStreamSynchronize(ST) == cudaSuccess,
             "download f32");
    return h;
}

/* Compares the H*Dh values of every row (stride ld) at column offset off;
 * elements between the rows must be untouched (equal to `orig`). */
static void close_rows(const char *what, const float *got, const float *want, const float *orig,
                       size_t rows, size_t ld, size_t off, size_t width, double tol)
{
    size_t n = rows * width, untouched = 1;
    float *g = malloc(n * sizeof *g), *w = malloc(n * sizeof *w);
    for (size_t r = 0; r < rows; r++) {
        memcpy(g + r * width, got + r * ld + off, width * sizeof *g);
        memcpy(w + r * width, want + r * ld + off, width * sizeof *w);
        for (size_t c = 0; c < ld; c++)
            if ((c < off || c >= off + width) && memcmp(&got[r * ld + c], &orig[r * ld + c], 4))
                untouched = 0;
    }
    TU_CLOSE(what, g, w, n, tol);
    TU_CHECK(untouched, "%s: wrote outside its H*Dh columns", what);
    compared++;
    free(g), free(w);
}

/* ---- rope ---- */

/* x (B, N, H, Dh) at column `off` of rows of stride ld (the model's fused
 * qkv: off 0 for q, A for k, ld 3A); the table of N tokens of FLUX ids. */
static void check_rope(int B, int N, int H, int Dh, size_t ld, size_t off)
{
    char what[200];
    size_t half = (size_t)Dh / 2, rows = (size_t)B * N, nx = rows * ld, nt = (size_t)N * half;
    float *x = rnd(nx, 2.0f), *ids = malloc((size_t)N * 3 * sizeof *ids);
    float *cs = malloc(2 * nt * sizeof *cs);
    /* axes as FLUX's split: a quarter, a quarter, a half of the pairs */
    int d0 = 2 * (int)(half / 4), d1 = 2 * (int)(half / 4), dims[3] = {d0, d1, Dh - d0 - d1};
    for (int n = 0; n < N; n++) {
        ids[n * 3] = 0.0f;
        ids[n * 3 + 1] = (float)(n / 7);
        ids[n * 3 + 2] = (float)(n % 7 + n / 50);
    }
    ditd_cpu_rope_table(ids, N, 3, dims, 10000.0, cs, cs + nt);

    /* the table through upload_f32 (fp32 on every backend): exact */
    float *dcs = NULL;
    TU_CHECK(cudaMalloc((void **)&dcs, 2 * nt * sizeof(float)) == cudaSuccess, "cudaMalloc");
    G->upload_f32(dcs, cs, 2 * nt);
    TU_OK(G->status());
    float *back = down_f32(dcs, 2 * nt);
    TU_CHECK(!memcmp(back, cs, 2 * nt * sizeof *cs), "upload_f32: the table comes back bit for bit");
    free(back);

    /* (1) the backend table, bf16 x: the same rounded x and fp32 table on both sides */
    void *dx = dev_bf16(x, nx);
    float *orig = copy(x, nx), *ref = copy(x, nx);
    C->rope(ref + off, ld, cs, cs + nt, B, N, H, Dh);
    G->rope(ditd_ptr_act(G, dx, off), ld, dcs, dcs + nt, B, N, H, Dh);
    float *got = down_bf16(dx, nx);
    snprintf(what, sizeof what, "rope bf16 B %d N %d H %d Dh %d ld %zu off %zu", B, N, H, Dh, ld,
             off);
    close_rows(what, got, ref, orig, rows, ld, off, (size_t)H * Dh, ROPE_BF16);
    free(ref), free(got);

    /* (2) the f32 kernel entry: the indexing without bf16 in the way */
    float *fx = dev_f32(orig, nx);
    ref = copy(orig, nx);
    ditd_cpu_rope(ref + off, ld, cs, cs + nt, B, N, H, Dh);
    TU_CHECK(ditd_cuda_rope_f32(fx + off, ld, dcs, dcs + nt, B, N, H, Dh, (ditd_cuda_stream)ST) ==
                 0,
             "ditd_cuda_rope_f32");
    got = down_f32(fx, nx);
    snprintf(what, sizeof what, "rope f32 B %d N %d H %d Dh %d ld %zu off %zu", B, N, H, Dh, ld,
             off);
    close_rows(what, got, ref, orig, rows, ld, off, (size_t)H * Dh, F32_EXACTISH);
    free(ref), free(got);

    G->mem_free(dx, 0);
    cudaFree(fx), cudaFree(dcs);
    free(x), free(ids), free(cs), free(orig);
}

/* ---- rmsnorm_heads ---- */

static void check_rmsnorm(int rows, int H, int Dh, size_t ld, size_t off, int weighted)
{
    char what[200];
    size_t nx = (size_t)rows * ld;
    float *x = rnd(nx, 3.0f), *w = rnd((size_t)Dh, 1.5f);
    for (size_t i = 0; i < nx; i += 5)
        x[i] += 1.0f; /* a mean square away from 1/3 */
    void *dx = dev_bf16(x, nx), *dw = dev_bf16(w, (size_t)Dh);
    float *orig = copy(x, nx), *ref = copy(x, nx);
    C->rmsnorm_heads(ref + off, ld, weighted ? w : NULL, rows, H, Dh, 1e-6f);
    G->rmsnorm_heads(ditd_ptr_act(G, dx, off), ld, weighted ? dw : NULL, rows, H, Dh, 1e-6f);
    float *got = down_bf16(dx, nx);
    snprintf(what, sizeof what, "rmsnorm_heads bf16 rows %d H %d Dh %d ld %zu off %zu%s", rows, H,
             Dh, ld, off, weighted ? "" : " no weight");
    close_rows(what, got, ref, orig, (size_t)rows, ld, off, (size_t)H * Dh, RMS_BF16);
    free(ref), free(got);

    float *fx = dev_f32(orig, nx), *fw = dev_f32(w, (size_t)Dh);
    ref = copy(orig, nx);
    ditd_cpu_rmsnorm_heads(ref + off, ld, weighted ? w : NULL, rows, H, Dh, 1e-6f);
    TU_CHECK(ditd_cuda_rmsnorm_heads_f32(fx + off, ld, weighted ? fw : NULL, rows, H, Dh, 1e-6f,
                                         (ditd_cuda_stream)ST) == 0,
             "ditd_cuda_rmsnorm_heads_f32");
    got = down_f32(fx, nx);
    snprintf(what, sizeof what, "rmsnorm_heads f32 rows %d H %d Dh %d ld %zu off %zu%s", rows, H,
             Dh, ld, off, weighted ? "" : " no weight");
    close_rows(what, got, ref, orig, (size_t)rows, ld, off, (size_t)H * Dh, F32_EXACTISH);
    free(ref), free(got);

    G->mem_free(dx, 0), G->mem_free(dw, 0);
    cudaFree(fx), cudaFree(fw);
    free(x), free(w), free(orig);
}

/* Shapes the kernels must refuse, without launching. */
static void check_refusals(void)
{
    void *d = NULL;
    TU_OK(G->mem_alloc(&d, 4096));
    TU_CHECK(ditd_cuda_rope(d, 16, d, d, 1, 2, 1, 7, (ditd_cuda_stream)ST) != 0, "rope: odd Dh");
    TU_CHECK(ditd_cuda_rope(d, 15, d, d, 1, 2, 1, 16, (ditd_cuda_stream)ST) != 0, "rope: ld < H Dh");
    TU_CHECK(ditd_cuda_rmsnorm_heads(d, 8, d, 2, 2, 8, 1e-6f, (ditd_cuda_stream)ST) != 0,
             "rmsnorm_heads: ld < H Dh");
    TU_CHECK(ditd_cuda_rmsnorm_heads(NULL, 8, d, 2, 1, 8, 1e-6f, (ditd_cuda_stream)ST) != 0,
             "rmsnorm_heads: no x");
    TU_CHECK(ditd_cuda_rope(d, 16, d, d, 0, 2, 1, 16, (ditd_cuda_stream)ST) == 0 &&
                 ditd_cuda_rmsnorm_heads(d, 16, d, 0, 1, 16, 1e-6f, (ditd_cuda_stream)ST) == 0,
             "empty shapes are no-ops");
    G->mem_free(d, 0);
}

static void check_ops(void)
{
    /* the tiny fixtures' shapes: 2 heads x 16, fused qkv (ld 3A), q and k */
    check_rope(1, 16, 2, 16, 96, 0);
    check_rope(2, 6, 2, 16, 96, 32);
    /* odd token counts and strides, Dh 2 (one pair), Dh 56 (odd pair count) */
    check_rope(2, 37, 3, 8, 3 * 24 + 5, 3);
    check_rope(1, 9, 1, 2, 3, 1);
    check_rope(3, 11, 5, 56, 5 * 56, 0);
    /* FLUX.1-dev: 24 heads x 128, fused qkv, the k view */
    check_rope(1, 300, 24, 128, 3 * 3072, 3072);
    check_rmsnorm(16, 2, 16, 96, 0, 1);
    check_rmsnorm(12, 2, 16, 96, 32, 1);
    check_rmsnorm(37, 3, 7, 3 * 21 + 2, 1, 1);
    check_rmsnorm(5, 4, 33, 4 * 33, 0, 0);
    check_rmsnorm(9, 2, 200, 401, 0, 1);
    check_rmsnorm(300, 24, 128, 3 * 3072, 3072, 1);
    check_refusals();
}

/* ---- the model ---- */

/* A weight on the device against the same tensor of the CPU's bf16-weight
 * model (the checkpoint rounded to nearest even by the CPU): equal bit for
 * bit. */
static void same_weight(const char *what, const void *dw, const void *hw, size_t n)
{
    uint16_t *got = malloc(n * 2);
    size_t bad = 0;
    TU_CHECK(cudaMemcpyAsync(got, dw, n * 2, cudaMemcpyDeviceToHost, ST) == cudaSuccess &&
                 cudaStreamSynchronize(ST) == cudaSuccess,
             "download %s", what);
    for (size_t i = 0; i < n; i++)
        bad += got[i] != ((const uint16_t *)hw)[i];
    TU_CHECK(bad == 0, "%s: %zu of %zu bf16 elements differ from the CPU's rounding of the checkpoint",
             what, bad, n);
    free(got);
}

static int fill_from(size_t i, const st_entry *e, float *buf, size_t numel, void *ud)
{
    (void)i, (void)numel;
    return ditd_safetensors_read_f32(ud, e->name, e->nd, e->shape, buf);
}

/* A bf16 copy of dir's checkpoint (every tensor rounded to nearest even, as
 * torch's .to(torch.bfloat16)) at tmp/diffusion_pytorch_model.safetensors. */
static int write_bf16_copy(const char *dir, const char *tmp)
{
    ditd_safetensors *st = NULL;
    char path[4200];
    int err = ditd_safetensors_open(dir, &st);
    if (err)
        return err;
    size_t n = ditd_safetensors_count(st);
    st_entry *e = calloc(n, sizeof *e);
    for (size_t i = 0; e && i < n; i++) {
        const ditd_st_tensor *t = ditd_safetensors_at(st, i);
        snprintf(e[i].name, sizeof e[i].name, "%s", t->name);
        e[i].nd = t->ndim;
        for (int d = 0; d < t->ndim && d < 2; d++)
            e[i].shape[d] = t->shape[d];
        TU_CHECK(t->ndim >= 1 && t->ndim <= 2, "%s: %d dims", t->name, t->ndim);
    }
    snprintf(path, sizeof path, "%s/diffusion_pytorch_model.safetensors", tmp);
    if (!e || st_write_bf16(path, e, n, fill_from, st))
        err = ditd_err_set(DITD_EIO, "cannot write %s", path);
    free(e);
    ditd_safetensors_free(st);
    return err;
}

/* The same forward from a bf16 checkpoint: the CUDA backend keeps bf16
 * weights, so the f32 checkpoint (rounded at upload) and its bf16 copy
 * (exact) give the same device weights and the same output, bit for bit. */
static void bf16_checkpoint(const char *dir, const ditd_flux_config *cfg, const flux_case *fc,
                            const void *dx, const float *got_f32)
{
    char tmp[512], path[700];
    ditd_flux *m = NULL;
    void *dout = NULL;
    if (tu_mkdtemp(tmp, sizeof tmp, "flux-bf16"))
        return;
    TU_OK(write_bf16_copy(dir, tmp));
    TU_OK(ditd_flux_new_mesh(cfg, G, fc->B, fc->h, fc->w, fc->L, tmp, NULL, &m));
    TU_OK(G->mem_alloc(&dout, fc->n_out * 2));
    if (m && dout) {
        float *got = calloc(fc->n_out, sizeof *got);
        TU_OK(ditd_flux_forward(m, fc->B, dx, fc->t, fc->text, fc->pooled,
                                cfg->guidance_embeds ? fc->guidance : NULL, dout));
        G->download(got, dout, fc->n_out);
        TU_OK(G->status());
        TU_CHECK(!memcmp(got, got_f32, fc->n_out * sizeof *got),
                 "%s: the bf16 checkpoint's forward on CUDA equals the f32 checkpoint's, bit for bit",
                 dir);
        printf("ok   %s: bf16 checkpoint on CUDA, forward bit-identical to the f32 one\n", dir);
        free(got);
    }
    if (dout)
        G->mem_free(dout, 0);
    ditd_flux_free(m);
    snprintf(path, sizeof path, "%s/diffusion_pytorch_model.safetensors", tmp);
    remove(path);
    rmdir(tmp);
}

static int run_model(const char *dir)
{
    char path[4200], what[600];
    ditd_flux_config cfg;
    int checked = 0;
    size_t i;
    json_t *c, *cases = flux_cases(dir);
    snprintf(path, sizeof path, "%s/config.json", dir);
    TU_OK(ditd_flux_config_load(path, &cfg));
    json_array_foreach(cases, i, c) {
        flux_case fc;
        ditd_flux *mc = NULL, *mg = NULL;
        void *dx = NULL, *dout = NULL;
        if (flux_case_load(dir, c, &fc) != 0)
            goto next;
        TU_OK(ditd_flux_new_mesh(&cfg, &ditd_backend_cpu_bf16, fc.B, fc.h, fc.w, fc.L, dir, NULL,
                                 &mc));
        TU_OK(ditd_flux_new_mesh(&cfg, G, fc.B, fc.h, fc.w, fc.L, dir, NULL, &mg));
        if (!mc || !mg)
            goto next;
        if (i == 0) { /* the weights: device memory, bf16, the checkpoint's */
            size_t D = (size_t)cfg.inner_dim;
            TU_CHECK(ditd_backend_cuda_is_device_ptr(mg->x_emb.w) &&
                         ditd_backend_cuda_is_device_ptr(mg->proj.w),
                     "%s: weights in device memory", dir);
            TU_CHECK(ditd_flux_weight_bytes(mg) == ditd_flux_weight_bytes(mc),
                     "%s: weights %zu bytes on the GPU, %zu in the CPU's bf16 table", dir,
                     ditd_flux_weight_bytes(mg), ditd_flux_weight_bytes(mc));
            same_weight("x_embedder.weight", mg->x_emb.w, mc->x_emb.w,
                        D * (size_t)cfg.in_channels);
            if (cfg.num_layers > 0) {
                same_weight("transformer_blocks.0.ff.net.0.proj.weight", mg->dbl[0].ff1.w,
                            mc->dbl[0].ff1.w, (size_t)cfg.mlp_dim * D);
                same_weight("transformer_blocks.0.attn.norm_q.weight", mg->dbl[0].nq,
                            mc->dbl[0].nq, (size_t)cfg.head_dim);
            }
            same_weight("proj_out.weight", mg->proj.w, mc->proj.w,
                        (size_t)cfg.out_channels * D);
        }
        size_t nin = (size_t)fc.B * (size_t)cfg.latent_channels * fc.h * fc.w;
        TU_CHECK(fc.n_out == nin, "%s: out size", dir);
        float *ref = calloc(fc.n_out, sizeof *ref), *got = calloc(fc.n_out, sizeof *got);
        const float *gd = cfg.guidance_embeds ? fc.guidance : NULL;
        TU_OK(ditd_flux_forward(mc, fc.B, fc.x, fc.t, fc.text, fc.pooled, gd, ref));
        TU_OK(G->mem_alloc(&dx, nin * 2));
        TU_OK(G->mem_alloc(&dout, fc.n_out * 2));
        if (dx && dout) {
            G->upload(dx, fc.x, nin);
            TU_OK(ditd_flux_forward(mg, fc.B, dx, fc.t, fc.text, fc.pooled, gd, dout));
            G->download(got, dout, fc.n_out);
            TU_OK(G->status());
            snprintf(what, sizeof what, "cuda %s forward[%zu] B=%d latent %dx%d text %d vs float64 Diffusers",
                     dir, i, fc.B, fc.h, fc.w, fc.L);
            TU_CLOSE(what, got, fc.out, fc.n_out, FLUX_FWD_REF);
            snprintf(what, sizeof what, "cuda %s forward[%zu] vs the CPU's bf16-weight table", dir,
                     i);
            TU_CLOSE(what, got, ref, fc.n_out, FLUX_FWD_ACT);
            checked++;
            if (i == 0)
                bf16_checkpoint(dir, &cfg, &fc, dx, got);
        }
        free(ref), free(got);
    next:
        if (dx)
            G->mem_free(dx, 0);
        if (dout)
            G->mem_free(dout, 0);
        ditd_flux_free(mc);
        ditd_flux_free(mg);
        flux_case_free(&fc);
    }
    json_decref(cases);
    return checked;
}

int main(void)
{
    char dir[4096];
    int cases = 0;
    if (!ditd_backend_cuda_available()) {
        printf("no CUDA device: skipped\n");
        return 77;
    }
    tu_seed();
    G = ditd_backend_get(DITD_DEVICE_CUDA);
    TU_CHECK(G != NULL, "CUDA backend: %s", ditd_err_detail());
    if (!G)
        return tu_exit();
    TU_CHECK(G->rope && G->rmsnorm_heads && G->upload_f32,
             "the CUDA table has rope, rmsnorm_heads and upload_f32");
    ST = (cudaStream_t)ditd_backend_cuda_compute_stream();
    check_ops();
    TU_OK(G->status());
    TU_CHECK(compared >= OPS_MIN, "checked %d op comparisons (at least %d)", compared, OPS_MIN);
    for (int m = 0; m < FLUX_MODELS; m++) {
        snprintf(dir, sizeof dir, "%s/flux/%s", tu_fixtures(), flux_models[m]);
        cases += run_model(dir);
    }
    TU_CHECK(cases >= FWD_MIN, "checked %d FLUX forward cases (at least %d)", cases, FWD_MIN);
    ditd_backend_cuda_shutdown();
    return tu_exit();
}
