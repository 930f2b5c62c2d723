/* GPU: the Wan family on the CUDA backend. Exits 77 (skipped) without a GPU.
 *
 *   ops      gelu_erf (kernels/cuda/elementwise.cu), row_sumsq and
 *            rmsnorm_rows (kernels/cuda/rope.cu, Wan's RMSNorm
 *            across heads) against the CPU's (kernels/cpu/rope.c) on random
 *            inputs, several shapes (odd row counts and strides, the fused
 *            qkv views the model passes, Wan 2.1 14B's 5120-wide rows, a tp
 *            slice normalized by a wider n_total): through the CUDA backend
 *            table (bf16 storage, the weight in the activation type) and
 *            through the f32 kernel entries; the entries refuse bad shapes.
 *   forward  every forward case of tests/fixtures/wan (per-frame timesteps
 *            included) on the CUDA backend against the CPU's bf16-weight
 *            table (the same weights, f32 activations) and against
 *            Diffusers' float64, the image-branch models (Wan 2.1 I2V,
 *            FLF2V: gelu_erf) included.
 *
 * Bounds (rel = max|gpu - ref| / max|ref|; bf16's unit roundoff 2^-9):
 *   RMS_BF16 = 4e-3: the sum of squares in fp32 (the CPU in double), one
 *     rounding of x * inv * w; gelu_erf the same bound (one rounding);
 *   F32_EXACTISH = 1e-5: the f32 entries, the GPU's fp32 sums against the
 *     CPU's double ones (a sum of n squares in fp32 is within about
 *     log2(n) 2^-24 relative with the tree reduction; halved by the square
 *     root); the 5120-wide rows take F32_WIDE = 1e-4 (the same bound as
 *     the bf16 entries' sums of squares, which are fp32 too);
 *   WAN_FWD_ACT, WAN_FWD_REF: tests/gpu/wan_bounds.h, derived from a CPU
 *     emulation of bf16 storage that test_wan_bf16_emu keeps within half of
 *     each. This test has not run on a GPU yet: its first run confirms them
 *     (docs/wan.md).
 * Floors: at least OPS_MIN op comparisons and FWD_MIN forward cases. */
#include <cuda_runtime_api.h>
#include <string.h>

#include "engine/backend/backend.h"
#include "engine/backend/backend_cuda.h"
#include "engine/models/wan/wan.h"
#include "kernels/cpu/rope.h"
#include "kernels/cuda/cuda_kernels.h"
#include "tests/gpu/wan_bounds.h"
#include "tests/wan_case.h"

#define RMS_BF16 4e-3
#define F32_EXACTISH 1e-5
#define F32_WIDE 1e-4
#define OPS_MIN 14
#define FWD_MIN 13

static const ditd_backend_ops *G;
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

static float *dev_f32(const float *h, size_t n)
{
    float *d = NULL;
    TU_CHECK(cudaMalloc((void **)&d, (n ? n : 1) * sizeof(float)) == cudaSuccess, "cudaMalloc");
    if (d && n)
        TU_CHECK(cudaMemcpyAsync(d, h, n * sizeof(float), cudaMemcpyHostToDevice, ST) ==
                     cudaSuccess,
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

/* Compares the n values at column off of every row (stride ld); the other
 * columns must be untouched (equal to orig). */
static void close_rows(const char *what, const float *got, const float *want, const float *orig,
                       size_t rows, size_t ld, size_t off, size_t n, double tol)
{
    size_t untouched = 1;
    size_t cap = rows * n > 0 ? rows * n : 1;
    float *g = malloc(cap * sizeof *g), *w = malloc(cap * sizeof *w);
    for (size_t r = 0; r < rows; r++) {
        memcpy(g + r * n, got + r * ld + off, n * sizeof *g);
        memcpy(w + r * n, want + r * ld + off, n * sizeof *w);
        for (size_t c = 0; c < ld; c++)
            if ((c < off || c >= off + n) && memcmp(&got[r * ld + c], &orig[r * ld + c], 4))
                untouched = 0;
    }
    TU_CLOSE(what, g, w, rows * n, tol);
    TU_CHECK(untouched, "%s: wrote outside its %zu columns", what, n);
    compared++;
    free(g), free(w);
}

/* rows x n at column off of rows of stride ld, weight (n) or none,
 * normalized over n_total >= n (a tp rank's slice: the sums of squares are
 * those of its own columns here, scaled as if the row were n_total wide). */
static void check_rows(int rows, int n, int n_total, size_t ld, size_t off, int weighted)
{
    char what[200];
    size_t nx = (size_t)rows * ld;
    float *x = rnd(nx, 3.0f), *w = rnd((size_t)n, 1.5f);
    for (size_t i = 0; i < nx; i += 7)
        x[i] += 1.0f;
    void *dx = dev_bf16(x, nx), *dw = dev_bf16(w, (size_t)n);
    float *orig = copy(x, nx), *ref = copy(x, nx), *ss = malloc((size_t)rows * sizeof *ss);
    float *dss = NULL;
    TU_CHECK(cudaMalloc((void **)&dss, (size_t)(rows ? rows : 1) * sizeof(float)) == cudaSuccess,
             "cudaMalloc ss");

    /* the table: bf16 storage */
    ditd_cpu_row_sumsq(ref + off, ld, rows, n, ss);
    ditd_cpu_rmsnorm_rows(ref + off, ld, weighted ? w : NULL, ss, rows, n, n_total, 1e-6f);
    G->row_sumsq(ditd_ptr_act(G, dx, off), ld, rows, n, dss);
    G->rmsnorm_rows(ditd_ptr_act(G, dx, off), ld, weighted ? dw : NULL, dss, rows, n, n_total,
                    1e-6f);
    float *got = malloc(nx * sizeof *got);
    G->download(got, dx, nx);
    TU_OK(G->status());
    snprintf(what, sizeof what, "rmsnorm_rows bf16 rows %d n %d of %d ld %zu off %zu%s", rows, n,
             n_total, ld, off, weighted ? "" : " no weight");
    close_rows(what, got, ref, orig, (size_t)rows, ld, off, (size_t)n, RMS_BF16);
    /* the sums of squares themselves, in fp32 */
    float *gss = down_f32(dss, (size_t)rows);
    snprintf(what, sizeof what, "row_sumsq bf16 rows %d n %d", rows, n);
    TU_CLOSE(what, gss, ss, (size_t)rows, n > 1000 ? F32_WIDE : F32_EXACTISH);
    compared++;
    free(got), free(gss), free(ref);

    /* the f32 entries */
    float *fx = dev_f32(orig, nx), *fw = dev_f32(w, (size_t)n);
    ref = copy(orig, nx);
    ditd_cpu_row_sumsq(ref + off, ld, rows, n, ss);
    ditd_cpu_rmsnorm_rows(ref + off, ld, weighted ? w : NULL, ss, rows, n, n_total, 1e-6f);
    TU_CHECK(ditd_cuda_row_sumsq_f32(fx + off, ld, rows, n, dss, (ditd_cuda_stream)ST) == 0 &&
                 ditd_cuda_rmsnorm_rows_f32(fx + off, ld, weighted ? fw : NULL, dss, rows, n,
                                            n_total, 1e-6f, (ditd_cuda_stream)ST) == 0,
             "the f32 entries");
    got = down_f32(fx, nx);
    snprintf(what, sizeof what, "rmsnorm_rows f32 rows %d n %d of %d ld %zu off %zu%s", rows, n,
             n_total, ld, off, weighted ? "" : " no weight");
    close_rows(what, got, ref, orig, (size_t)rows, ld, off, (size_t)n,
               n > 1000 ? F32_WIDE : F32_EXACTISH);
    free(ref), free(got);

    G->mem_free(dx, 0), G->mem_free(dw, 0);
    cudaFree(fx), cudaFree(fw), cudaFree(dss);
    free(x), free(w), free(orig), free(ss);
}

/* gelu_erf (Wan 2.1 I2V's image embedder) on bf16 storage against the
 * CPU's, in place: one rounding of the output. */
static void check_gelu(size_t n)
{
    char what[120];
    float *x = rnd(n, 6.0f);
    void *dx = dev_bf16(x, n);
    float *ref = copy(x, n), *got = malloc(n * sizeof *got);
    ditd_backend_cpu.gelu_erf(ref, n);
    G->gelu_erf(dx, n);
    G->download(got, dx, n);
    TU_OK(G->status());
    snprintf(what, sizeof what, "gelu_erf bf16 n %zu", n);
    TU_CLOSE(what, got, ref, n, RMS_BF16);
    compared++;
    G->mem_free(dx, 0);
    free(x), free(ref), free(got);
}

static void check_ops(void)
{
    check_gelu(1);
    check_gelu(257 * 1280 + 3);
    /* the tiny fixtures: 2 heads x 16 (A 32), fused qkv ld 96, q and k views */
    check_rows(37, 32, 32, 96, 0, 1);
    check_rows(37, 32, 32, 96, 32, 1);
    /* cross-attention's k of the fused kv (ld 2A), no weight */
    check_rows(9, 72, 72, 144, 0, 0);
    /* a tp slice: 3 of 6 heads x 12, normalized as 72 wide */
    check_rows(13, 36, 72, 3 * 36 + 5, 3, 1);
    /* odd everything; one column */
    check_rows(5, 1, 3, 2, 1, 1);
    /* Wan 2.1 14B: 40 heads x 128 = 5120, the k view of the fused qkv */
    check_rows(300, 5120, 5120, 3 * 5120, 5120, 1);
    /* refusals, without launching */
    float *d = NULL;
    TU_CHECK(cudaMalloc((void **)&d, 64 * sizeof(float)) == cudaSuccess, "cudaMalloc");
    TU_CHECK(ditd_cuda_row_sumsq(d, 4, 2, 8, d, (ditd_cuda_stream)ST) != 0, "row_sumsq: ld < n");
    TU_CHECK(ditd_cuda_row_sumsq(NULL, 8, 2, 8, d, (ditd_cuda_stream)ST) != 0, "row_sumsq: no x");
    TU_CHECK(ditd_cuda_rmsnorm_rows(d, 8, NULL, d, 2, 8, 4, 1e-6f, (ditd_cuda_stream)ST) != 0,
             "rmsnorm_rows: n_total < n");
    TU_CHECK(ditd_cuda_rmsnorm_rows(d, 8, NULL, NULL, 2, 8, 8, 1e-6f, (ditd_cuda_stream)ST) != 0,
             "rmsnorm_rows: no ss");
    TU_CHECK(ditd_cuda_rmsnorm_rows(d, 8, NULL, d, 0, 8, 8, 1e-6f, (ditd_cuda_stream)ST) == 0,
             "rmsnorm_rows: zero rows is a no-op");
    cudaFree(d);
}

static int run_model(const char *dir)
{
    char path[4200], what[600];
    ditd_wan_config cfg;
    int checked = 0;
    size_t i;
    json_t *c, *cases = wan_cases(dir);
    snprintf(path, sizeof path, "%s/config.json", dir);
    TU_OK(ditd_wan_config_load(path, &cfg));
    json_array_foreach(cases, i, c) {
        wan_case wc;
        ditd_wan *mc = NULL, *mg = NULL;
        void *dx = NULL, *dout = NULL;
        if (wan_case_load(dir, c, &wc) != 0)
            goto next;
        TU_OK(ditd_wan_new_mesh(&cfg, &ditd_backend_cpu_bf16, wc.B, wc.F, wc.h, wc.w, wc.L, dir,
                                NULL, &mc));
        TU_OK(ditd_wan_new_mesh(&cfg, G, wc.B, wc.F, wc.h, wc.w, wc.L, dir, NULL, &mg));
        if (!mc || !mg)
            goto next;
        if (i == 0)
            TU_CHECK(ditd_backend_cuda_is_device_ptr(mg->patch.w) &&
                         ditd_backend_cuda_is_device_ptr(mg->blk[0].sst),
                     "%s: weights in device memory", dir);
        size_t nin = (size_t)wc.B * cfg.in_channels * wc.F * wc.h * wc.w;
        float *ref = calloc(wc.n_out, sizeof *ref), *got = calloc(wc.n_out, sizeof *got);
        TU_OK(ditd_wan_forward(mc, wc.B, wc.x, wc.t, wc.t_frames, wc.text, wc.image, ref));
        TU_OK(G->mem_alloc(&dx, nin * 2));
        TU_OK(G->mem_alloc(&dout, wc.n_out * 2));
        if (dx && dout) {
            G->upload(dx, wc.x, nin);
            TU_OK(ditd_wan_forward(mg, wc.B, dx, wc.t, wc.t_frames, wc.text, wc.image, dout));
            G->download(got, dout, wc.n_out);
            TU_OK(G->status());
            snprintf(what, sizeof what,
                     "cuda %s forward[%zu] B=%d %d frames of %dx%d text %d vs float64 Diffusers", dir,
                     i, wc.B, wc.F, wc.w, wc.h, wc.L);
            TU_CLOSE(what, got, wc.out, wc.n_out, WAN_FWD_REF);
            snprintf(what, sizeof what, "cuda %s forward[%zu] vs the CPU's bf16-weight table", dir,
                     i);
            TU_CLOSE(what, got, ref, wc.n_out, WAN_FWD_ACT);
            checked++;
        }
        free(ref), free(got);
    next:
        if (dx)
            G->mem_free(dx, 0);
        if (dout)
            G->mem_free(dout, 0);
        ditd_wan_free(mc);
        ditd_wan_free(mg);
        wan_case_free(&wc);
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
    TU_CHECK(G->rope && G->row_sumsq && G->rmsnorm_rows && G->upload_f32,
             "the CUDA table has rope, row_sumsq, rmsnorm_rows and upload_f32");
    ST = (cudaStream_t)ditd_backend_cuda_compute_stream();
    check_ops();
    TU_OK(G->status());
    TU_CHECK(compared >= OPS_MIN, "checked %d op comparisons (at least %d)", compared, OPS_MIN);
    for (int m = 0; m < WAN_MODELS; m++) {
        snprintf(dir, sizeof dir, "%s/wan/%s", tu_fixtures(), wan_models[m]);
        cases += run_model(dir);
    }
    TU_CHECK(cases >= FWD_MIN, "checked %d Wan forward cases (at least %d)", cases, FWD_MIN);
    ditd_backend_cuda_shutdown();
    return tu_exit();
}
