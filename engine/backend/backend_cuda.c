/* The CUDA backend table: kernels/cuda behind the ops interface of
 * engine/backend/backend.h. See engine/backend/backend_cuda.h for what it owns. */
#include "engine/backend/backend_cuda.h"

#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/error.h"
#include "kernels/cpu/dequant.h"
#include "kernels/cuda/cuda_image_kernels.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/cuda_video_kernels.h"

#define GEMM_WS_BYTES ((size_t)32 << 20) /* cuBLAS's advice on Hopper */
#define GN_STATS_MAX 8192 /* doubles: (B, G, 2) GroupNorm statistics (the VAE) */

static struct {
    int ready;
    int device;
    cudaStream_t compute, comm;
    cudaEvent_t to_comm, to_compute;
    void *gemm_ws;
    ditd_cuda_gemm *gemm;
    float *stage;      /* device f32 staging for upload/download */
    double *gn_stats;  /* GN_STATS_MAX doubles: GroupNorm statistics on their way to the host */
    size_t stage_len;  /* floats */
    int err;           /* the first error since status() */
    char detail[256];
} g;

/* Keeps the first error; later ones are consequences. */
static void keep(int code, const char *what)
{
    if (!code || g.err)
        return;
    g.err = code == (int)cudaErrorMemoryAllocation ? DITD_ENOMEM : DITD_EDEVICE;
    snprintf(g.detail, sizeof g.detail, "%s: %s", what, ditd_cuda_strerror(code));
}

static int rt_check(cudaError_t rc, const char *what)
{
    if (rc == cudaSuccess)
        return 0;
    return ditd_err_set(rc == cudaErrorMemoryAllocation ? DITD_ENOMEM : DITD_EDEVICE, "%s: %s",
                        what, cudaGetErrorString(rc));
}

static ditd_cuda_act cuda_act(ditd_act a)
{
    switch (a) {
    case DITD_ACT_GELU_TANH: return DITD_CUDA_ACT_GELU_TANH;
    case DITD_ACT_SILU: return DITD_CUDA_ACT_SILU;
    case DITD_ACT_NONE: break;
    }
    return DITD_CUDA_ACT_NONE;
}

#define CS ((ditd_cuda_stream)g.compute)

/* The GEMM context's fallback hook: one line per shape that leaves
 * cuBLASLt for the slow kernel, so that a collapse in speed is said. */
static void on_gemm_fallback(void *ud, int M, int N, int K, size_t ldx, size_t ldy,
                             ditd_cuda_act act, int bias, const char *why)
{
    (void)ud;
    fprintf(stderr,
            "ditd cuda: linear M %d N %d K %d (ldx %zu, ldy %zu, %s%s) takes the slow fallback "
            "kernel: %s\n",
            M, N, K, ldx, ldy, bias ? "bias, " : "",
            act == DITD_CUDA_ACT_GELU_TANH ? "gelu_tanh"
            : act == DITD_CUDA_ACT_SILU    ? "silu"
                                           : "no activation",
            why);
}

int ditd_backend_cuda_gemm_fallbacks(void)
{
    return g.ready ? ditd_cuda_gemm_fallbacks(g.gemm) : 0;
}

/* ---- memory and transfers ---- */

/* Grows the staging buffer to n floats. Called with the largest weight at
 * load, so the hot loop's uploads (latents) never grow it. cudaFree waits
 * for the work that still reads the old one. */
static int stage_reserve(size_t n)
{
    if (n <= g.stage_len)
        return 0;
    void *p = NULL;
    cudaError_t rc;
    cudaFree(g.stage);
    g.stage = NULL;
    g.stage_len = 0;
    if ((rc = cudaMalloc(&p, n * sizeof(float))) != cudaSuccess) {
        keep((int)rc, "staging buffer");
        return (int)rc;
    }
    g.stage = p;
    g.stage_len = n;
    return 0;
}

static void cu_upload(void *dst, const float *h_src, size_t n)
{
    if (n == 0 || stage_reserve(n))
        return;
    /* from pageable memory the copy returns once h_src has been read, so
     * the caller may reuse it; the stage is reused in stream order */
    keep((int)cudaMemcpyAsync(g.stage, h_src, n * sizeof(float), cudaMemcpyHostToDevice,
                              g.compute),
         "upload");
    keep(ditd_cuda_f32_to_bf16(g.stage, dst, n, CS), "upload (f32 -> bf16)");
}

/* fp32 tables (the RoPE cos/sin) as they are; from pageable memory the copy
 * returns once h_src has been read */
static void cu_upload_f32(void *dst, const float *h_src, size_t n)
{
    if (n == 0)
        return;
    keep((int)cudaMemcpyAsync(dst, h_src, n * sizeof(float), cudaMemcpyHostToDevice, g.compute),
         "upload_f32");
}

static void cu_download(float *h_dst, const void *src, size_t n)
{
    if (n == 0 || stage_reserve(n))
        return;
    keep(ditd_cuda_bf16_to_f32(src, g.stage, n, CS), "download (bf16 -> f32)");
    keep((int)cudaMemcpyAsync(h_dst, g.stage, n * sizeof(float), cudaMemcpyDeviceToHost,
                              g.compute),
         "download");
    keep((int)cudaStreamSynchronize(g.compute), "download (sync)");
}

static void cu_sync(void)
{
    keep((int)cudaStreamSynchronize(g.compute), "sync");
}

static int cu_set_threads(int n)
{
    (void)n; /* the host side of this backend is one thread */
    return 1;
}

static int cu_mem_alloc(void **p, size_t bytes)
{
    void *d = NULL;
    int err;
    *p = NULL;
    if ((err = rt_check(cudaMalloc(&d, bytes ? bytes : 1), "device arena")))
        return err;
    /* zeroed like the host arenas, on the compute stream: a cudaMemset on
     * the legacy stream 0 is not ordered before the uploads that the
     * non-blocking compute stream runs next, and could land after them */
    if ((err = rt_check(cudaMemsetAsync(d, 0, bytes, g.compute), "device arena (memset)"))) {
        cudaFree(d);
        return err;
    }
    *p = d;
    return 0;
}

static void cu_mem_free(void *p, size_t bytes)
{
    (void)bytes;
    /* cudaFree waits for the device; arenas go when a model is unloaded */
    cudaFree(p);
}

static int cu_status(void)
{
    int err = g.err;
    /* a fault of the kernels' execution shows up here too */
    if (!err)
        keep((int)cudaGetLastError(), "device");
    err = g.err;
    if (err)
        ditd_err_set(err, "%s", g.detail);
    g.err = 0;
    g.detail[0] = 0;
    return err;
}

/* ---- ops ---- */

static void cu_linear(const void *x, size_t ldx, const void *w, const void *b, void *y,
                      size_t ldy, int M, int N, int K, ditd_act act)
{
    keep(ditd_cuda_linear(g.gemm, x, ldx, w, b, y, ldy, M, N, K, cuda_act(act), CS), "linear");
}

/* ---- FP8 weights (linear_q) ---- */

/* Device scratch that grows to the largest call seen: the first forward at
 * a size grows it, the steps after allocate nothing. cudaFree waits for
 * the work that still reads the old one. */
static void *grow_dev(void **p, size_t *cap, size_t bytes, const char *what)
{
    if (bytes <= *cap)
        return *p;
    cudaFree(*p);
    *p = NULL;
    *cap = 0;
    cudaError_t rc = cudaMalloc(p, bytes);
    if (rc != cudaSuccess) {
        *p = NULL;
        keep((int)rc, what);
        return NULL;
    }
    *cap = bytes;
    return *p;
}

static struct {
    void *xq, *w;
    float *xs;
    size_t xq_cap, w_cap, xs_cap;
} fp8;

static int is_fp8(int type)
{
    return type == DITD_Q_F8_E4M3 || type == DITD_Q_F8_E5M2;
}

/* FP8 with 16-byte rows (cuBLASLt's FP8 GEMM); the GGML block types
 * dequant.cu decodes (the weight dequantized to bf16 into a workspace as
 * large as the largest such weight, then the bf16 GEMM: the same bits as the
 * weight dequantized at load, at the file's memory) */
static int cu_linear_q_takes(int type, int N, int K)
{
    int elems = 0, bytes = 0;
    if (is_fp8(type))
        return K % 16 == 0 && N % 8 == 0;
    return type != DITD_Q_F32 && type != DITD_Q_F16 && type != DITD_Q_BF16 &&
           ditd_cpu_dequant_block(type, &elems, &bytes) && N > 0 && K % elems == 0;
}

static void cu_linear_q(const void *x, size_t ldx, const ditd_qweight *w, const void *b, void *y,
                        size_t ldy, int M, ditd_act act)
{
    const int N = w->N, K = w->K, e5m2 = w->type == DITD_Q_F8_E5M2;
    if (M <= 0)
        return;
    if (!cu_linear_q_takes(w->type, N, K)) {
        keep((int)cudaErrorInvalidValue, "linear_q: a stored type or shape it does not take");
        return;
    }
    if (!is_fp8(w->type)) { /* GGML blocks: dequantize, then the bf16 GEMM */
        void *wd = grow_dev(&fp8.w, &fp8.w_cap, (size_t)N * (size_t)K * 2, "linear_q (blocks)");
        if (!wd)
            return;
        int rc = ditd_cuda_dequant_bf16(w->type, w->data, w->row_bytes, N, K, wd, (size_t)K, CS);
        if (!rc)
            rc = ditd_cuda_linear(g.gemm, x, ldx, wd, b, y, ldy, M, N, K, cuda_act(act), CS);
        keep(rc, "linear_q (blocks)");
        return;
    }
    void *xq = grow_dev(&fp8.xq, &fp8.xq_cap, (size_t)M * (size_t)K, "linear_q (fp8 x)");
    float *xs = grow_dev((void **)&fp8.xs, &fp8.xs_cap, (size_t)M * sizeof(float),
                         "linear_q (fp8 x scales)");
    if (!xq || !xs)
        return;
    int rc = ditd_cuda_linear_fp8(g.gemm, e5m2, x, ldx, w->data, w->scale, b, y, ldy, M, N, K,
                                  cuda_act(act), xq, xs, CS);
    if (rc == DITD_CUDA_EUNSUPPORTED) {
        /* no FP8 GEMM here (not Hopper, or the shape): the weight in bf16,
         * then the bf16 GEMM (weight-only, the CPU's values) */
        void *wd = grow_dev(&fp8.w, &fp8.w_cap, (size_t)N * (size_t)K * 2, "linear_q (fp8 w)");
        if (!wd)
            return;
        rc = ditd_cuda_dequant_fp8_bf16(w->data, e5m2, w->scale, N, K, wd, CS);
        if (!rc)
            rc = ditd_cuda_linear(g.gemm, x, ldx, wd, b, y, ldy, M, N, K, cuda_act(act), CS);
    }
    keep(rc, "linear_q (fp8)");
}

static void cu_upload_bytes(void *dst, const void *h_src, size_t n)
{
    if (n)
        keep((int)cudaMemcpyAsync(dst, h_src, n, cudaMemcpyHostToDevice, g.compute),
             "upload (bytes)");
}

static void cu_act(const void *x, void *y, size_t n, ditd_act act)
{
    keep(ditd_cuda_act_apply(x, y, n, cuda_act(act), CS), "act");
}

static void cu_add(void *y, const void *x, size_t n)
{
    keep(ditd_cuda_add(y, x, n, CS), "add");
}

static void cu_embedding(const void *table, const int64_t *h_ids, void *out, int B, int D)
{
    keep(ditd_cuda_embedding(table, h_ids, out, B, D, CS), "embedding");
}

static void cu_timestep_embed(const float *h_t, void *out, int B, int dim)
{
    keep(ditd_cuda_timestep_embed(h_t, out, B, dim, CS), "timestep_embed");
}

static void cu_layernorm_modulate(const void *x, void *y, int B, int N, int D, float eps,
                                  const void *shift, const void *scale, size_t ld_mod)
{
    keep(ditd_cuda_layernorm_modulate(x, y, B, N, D, eps, shift, scale, ld_mod, CS),
         "layernorm_modulate");
}

static void cu_gated_residual(void *h, const void *y, int B, int N, int D, const void *gate,
                              size_t ld_gate)
{
    keep(ditd_cuda_gated_residual(h, y, B, N, D, gate, ld_gate, CS), "gated_residual");
}

static void cu_attention(const void *q, size_t ldq, const void *k, size_t ldk, const void *v,
                         size_t ldv, void *o, size_t ldo, float *lse, int B, int Nq, int Nk,
                         int H, int Dh, float scale)
{
    keep(ditd_cuda_attention(q, ldq, k, ldk, v, ldv, o, ldo, lse, B, Nq, Nk, H, Dh, scale, CS),
         "attention");
}

static void cu_attention_merge(void *o_acc, size_t ldo_acc, float *lse_acc, const void *o_blk,
                               size_t ldo_blk, const float *lse_blk, int B, int Nq, int H, int Dh)
{
    keep(ditd_cuda_attention_merge(o_acc, ldo_acc, lse_acc, o_blk, ldo_blk, lse_blk, B, Nq, H,
                                   Dh, CS),
         "attention_merge");
}

static void cu_patch_embed(const void *x, const void *w, const void *b, const void *pos, void *y,
                           void *scratch, int B, int C, int Hi, int Wi, int p, int D)
{
    keep(ditd_cuda_patch_embed(g.gemm, x, w, b, pos, y, scratch, B, C, Hi, Wi, p, D, CS),
         "patch_embed");
}

static void cu_unpatchify(const void *x, void *y, int B, int C, int h, int w, int p)
{
    keep(ditd_cuda_unpatchify(x, y, B, C, h, w, p, CS), "unpatchify");
}

static void cu_copy2d(void *dst, size_t ldd, const void *src, size_t lds, size_t rows,
                      size_t cols)
{
    keep(ditd_cuda_copy2d(dst, ldd, src, lds, rows, cols, 2, CS), "copy2d");
}

/* ---- FLUX's attention inputs (kernels/cuda/rope.cu) ---- */

static void cu_rope(void *x, size_t ld, const void *cos, const void *sin, int B, int N, int H,
                    int Dh)
{
    keep(ditd_cuda_rope(x, ld, (const float *)cos, (const float *)sin, B, N, H, Dh, CS), "rope");
}

static void cu_rmsnorm_heads(void *x, size_t ld, const void *w, int rows, int H, int Dh, float eps)
{
    keep(ditd_cuda_rmsnorm_heads(x, ld, w, rows, H, Dh, eps, CS), "rmsnorm_heads");
}

static void cu_row_sumsq(const void *x, size_t ld, int rows, int n, float *ss)
{
    keep(ditd_cuda_row_sumsq(x, ld, rows, n, ss, CS), "row_sumsq");
}

static void cu_gelu_erf(void *y, size_t n)
{
    keep(ditd_cuda_gelu_erf(y, n, CS), "gelu_erf");
}

static void cu_rmsnorm_rows(void *x, size_t ld, const void *w, const float *ss, int rows, int n,
                            int n_total, float eps)
{
    keep(ditd_cuda_rmsnorm_rows(x, ld, w, ss, rows, n, n_total, eps, CS), "rmsnorm_rows");
}

/* ---- per-step arguments in device memory (for graphs) ---- */

static void cu_upload_args(float *d_t, const float *h_t, int64_t *d_y, const int64_t *h_y, int B)
{
    if (B <= 0)
        return;
    /* pageable sources: each copy returns once its source has been read,
     * and runs in stream order after the replay that read the last values */
    keep((int)cudaMemcpyAsync(d_t, h_t, (size_t)B * sizeof *h_t, cudaMemcpyHostToDevice,
                              g.compute),
         "upload_args (timesteps)");
    keep((int)cudaMemcpyAsync(d_y, h_y, (size_t)B * sizeof *h_y, cudaMemcpyHostToDevice,
                              g.compute),
         "upload_args (class ids)");
}

static void cu_embedding_dev(const void *table, const int64_t *d_ids, void *out, int B, int D)
{
    keep(ditd_cuda_embedding_dev(table, d_ids, out, B, D, CS), "embedding_dev");
}

static void cu_timestep_embed_dev(const float *d_t, void *out, int B, int dim)
{
    keep(ditd_cuda_timestep_embed_dev(d_t, out, B, dim, CS), "timestep_embed_dev");
}

static int graphs_enabled(void)
{
    static int on = -1;
    if (on < 0) {
        const char *v = getenv("DITD_CUDA_GRAPHS");
        on = !(v && (!strcmp(v, "0") || !strcmp(v, "off") || !strcmp(v, "false")));
    }
    return on;
}

static int cu_graph_begin(void)
{
    if (!graphs_enabled())
        return DITD_EUNSUPPORTED; /* no detail: the caller runs the ops directly */
    return ditd_backend_cuda_capture_begin();
}

static int cu_graph_end(void **out)
{
    ditd_cuda_graph *cg = NULL;
    int err = ditd_backend_cuda_capture_end(&cg);
    *out = cg;
    return err;
}

static int cu_graph_launch(void *cg)
{
    return ditd_backend_cuda_graph_launch(cg);
}

static void cu_graph_free(void *cg)
{
    ditd_backend_cuda_graph_free(cg);
}

/* ---- images (the VAE) ---- */

static void cu_conv2d(const void *x, size_t psx, const void *w, const void *b, void *y, size_t psy,
                      void *scratch, size_t scratch_n, int B, int Cin, int Hx, int Wx, int Cout,
                      int k, int s, int pad_t, int pad_b, int pad_l, int pad_r)
{
    keep(ditd_cuda_conv2d(g.gemm, x, psx, w, b, y, psy, scratch, scratch_n, B, Cin, Hx, Wx, Cout, k,
                          s, pad_t, pad_b, pad_l, pad_r, CS),
         "conv2d");
}

static void cu_groupnorm_stats(const void *x, size_t ps, int B, int C, int rows, int W, int G,
                               double *h_stats)
{
    size_t n = (size_t)B * G * 2;
    if (n > GN_STATS_MAX) {
        keep((int)cudaErrorInvalidValue, "groupnorm_stats: too many groups");
        return;
    }
    keep(ditd_cuda_groupnorm_stats(x, ps, B, C, rows, W, G, g.gn_stats, CS), "groupnorm_stats");
    keep((int)cudaMemcpyAsync(h_stats, g.gn_stats, n * sizeof(double), cudaMemcpyDeviceToHost,
                              g.compute),
         "groupnorm_stats copy");
    keep((int)cudaStreamSynchronize(g.compute), "groupnorm_stats sync");
}

/* Step caching: the statistics go to the host in chunks through the
 * GroupNorm buffer (GN_STATS_MAX / 4 rows at a time), so nothing is
 * allocated per call. */
static void cu_row_diff_stats(const void *a, const void *b, int rows, int D, double *h_out)
{
    const int chunk = GN_STATS_MAX / 4;
    for (int r0 = 0; r0 < rows; r0 += chunk) {
        int nr = rows - r0 < chunk ? rows - r0 : chunk;
        size_t off = (size_t)r0 * (size_t)D;
        keep(ditd_cuda_row_diff_stats((const uint16_t *)a + off,
                                      b ? (const uint16_t *)b + off : NULL, nr, D,
                                      g.gn_stats, CS),
             "row_diff_stats");
        keep((int)cudaMemcpyAsync(h_out + 4 * (size_t)r0, g.gn_stats,
                                  4 * (size_t)nr * sizeof(double), cudaMemcpyDeviceToHost,
                                  g.compute),
             "row_diff_stats copy");
        keep((int)cudaStreamSynchronize(g.compute), "row_diff_stats sync");
    }
}

static void cu_axpby(void *y, const void *x, float a, float b, size_t n, int round_bf16)
{
    (void)round_bf16; /* activations are bf16 already */
    keep(ditd_cuda_axpby(y, x, a, b, n, CS), "axpby");
}

static void cu_lora(const void *x, size_t ldx, const void *a, const void *b, float s, void *y,
                    size_t ldy, int M, int N, int K, int r, float *tmp, ditd_act act)
{
    keep(ditd_cuda_lora(x, ldx, a, b, s, y, ldy, M, N, K, r, tmp, cuda_act(act), CS), "lora");
}

static void cu_groupnorm_apply(const void *x, size_t psx, void *y, size_t psy, int B, int C,
                               int rows, int W, int G, const float *h_mean, const float *h_rstd,
                               const void *gamma, const void *beta, int silu)
{
    keep(ditd_cuda_groupnorm_apply(x, psx, y, psy, B, C, rows, W, G, h_mean, h_rstd, gamma, beta,
                                   silu, CS),
         "groupnorm_apply");
}

static void cu_upsample_nearest2x(const void *x, size_t psx, void *y, size_t psy, int B, int C,
                                  int rows, int W)
{
    keep(ditd_cuda_upsample_nearest2x(x, psx, y, psy, B, C, rows, W, CS), "upsample_nearest2x");
}

static void cu_planes_to_tokens(const void *x, size_t ps, void *t, int C, int n)
{
    keep(ditd_cuda_planes_to_tokens(x, ps, t, C, n, CS), "planes_to_tokens");
}

static void cu_tokens_to_planes(const void *t, void *y, size_t ps, int C, int n, int accumulate)
{
    keep(ditd_cuda_tokens_to_planes(t, y, ps, C, n, accumulate, CS), "tokens_to_planes");
}

/* ---- video (the Wan VAE) ---- */

static void cu_conv3d_frame(const void *const *xf, int kT, size_t psx, const void *w, const void *b,
                            void *y, size_t psy, void *scratch, size_t scratch_n, int Cin, int H,
                            int W, int Cout, int k, int pad_h, int pad_w)
{
    keep(ditd_cuda_conv3d_frame(g.gemm, xf, kT, psx, w, b, y, psy, scratch, scratch_n, Cin, H, W,
                                Cout, k, pad_h, pad_w, CS),
         "conv3d_frame");
}

static void cu_rmsnorm_channels(const void *x, size_t psx, void *y, size_t psy, int C, int n,
                                const void *gamma, int silu)
{
    keep(ditd_cuda_rmsnorm_channels(x, psx, y, psy, C, n, gamma, silu, CS), "rmsnorm_channels");
}

static void cu_avgdown3d_frame(const void *const *xf, size_t psx, int Cin, int H, int W, int Cout,
                               int ft, int fs, void *y, size_t psy, int accumulate)
{
    keep(ditd_cuda_avgdown3d_frame(xf, psx, Cin, H, W, Cout, ft, fs, y, psy, accumulate, CS),
         "avgdown3d_frame");
}

static void cu_dupup3d_frame(const void *x, size_t psx, int Cin, int H, int W, int Cout, int ft,
                             int fs, int a, void *y, size_t psy, int accumulate)
{
    keep(ditd_cuda_dupup3d_frame(x, psx, Cin, H, W, Cout, ft, fs, a, y, psy, accumulate, CS),
         "dupup3d_frame");
}

static const ditd_backend_ops cuda_ops = {
    .name = "cuda",
    .device = DITD_DEVICE_CUDA,
    .act_dtype = DITD_DTYPE_BF16,
    .weight_dtype = DITD_DTYPE_BF16,
    .attn_max_head_dim = DITD_CUDA_ATTN_MAX_DH,
    .upload = cu_upload,
    .download = cu_download,
    .upload_weight = cu_upload,
    .sync = cu_sync,
    .set_threads = cu_set_threads,
    .linear = cu_linear,
    .linear_q = cu_linear_q,
    .linear_q_takes = cu_linear_q_takes,
    .upload_bytes = cu_upload_bytes,
    .act = cu_act,
    .add = cu_add,
    .embedding = cu_embedding,
    .timestep_embed = cu_timestep_embed,
    .layernorm_modulate = cu_layernorm_modulate,
    .gated_residual = cu_gated_residual,
    .attention = cu_attention,
    .attention_merge = cu_attention_merge,
    .patch_embed = cu_patch_embed,
    .unpatchify = cu_unpatchify,
    .copy2d = cu_copy2d,
    .mem_alloc = cu_mem_alloc,
    .mem_free = cu_mem_free,
    .status = cu_status,
    .upload_args = cu_upload_args,
    .embedding_dev = cu_embedding_dev,
    .timestep_embed_dev = cu_timestep_embed_dev,
    .graph_begin = cu_graph_begin,
    .graph_end = cu_graph_end,
    .graph_launch = cu_graph_launch,
    .graph_free = cu_graph_free,
    .conv2d = cu_conv2d,
    .groupnorm_stats = cu_groupnorm_stats,
    .row_diff_stats = cu_row_diff_stats,
    .axpby = cu_axpby,
    .lora = cu_lora,
    .groupnorm_apply = cu_groupnorm_apply,
    .upsample_nearest2x = cu_upsample_nearest2x,
    .planes_to_tokens = cu_planes_to_tokens,
    .tokens_to_planes = cu_tokens_to_planes,
    .rope = cu_rope,
    .rmsnorm_heads = cu_rmsnorm_heads,
    .row_sumsq = cu_row_sumsq,
    .gelu_erf = cu_gelu_erf,
    .rmsnorm_rows = cu_rmsnorm_rows,
    .upload_f32 = cu_upload_f32,
    .conv3d_frame = cu_conv3d_frame,
    .rmsnorm_channels = cu_rmsnorm_channels,
    .avgdown3d_frame = cu_avgdown3d_frame,
    .dupup3d_frame = cu_dupup3d_frame,
};

/* ---- lifetime ---- */

int ditd_backend_cuda_available(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError(); /* not sticky: clear it */
        return 0;
    }
    return n > 0;
}

int ditd_backend_cuda_select(int local_rank)
{
    int n = 0, dev;
    cudaError_t rc;
    if ((rc = cudaGetDeviceCount(&n)) != cudaSuccess || n == 0) {
        cudaGetLastError();
        return ditd_err_set(DITD_EDEVICE, "no CUDA device%s%s", rc != cudaSuccess ? ": " : "",
                            rc != cudaSuccess ? cudaGetErrorString(rc) : "");
    }
    dev = (local_rank < 0 ? 0 : local_rank) % n;
    if (g.ready) {
        if (g.device != dev)
            return ditd_err_set(DITD_EINVAL,
                                "the CUDA backend already runs on device %d (local rank %d wants %d)",
                                g.device, local_rank, dev);
        return dev;
    }
    if ((rc = cudaSetDevice(dev)) != cudaSuccess) {
        cudaGetLastError();
        return ditd_err_set(DITD_EDEVICE, "cudaSetDevice(%d): %s", dev, cudaGetErrorString(rc));
    }
    return dev;
}

int ditd_backend_cuda_device(void)
{
    int d = 0;
    if (g.ready)
        return g.device;
    if (cudaGetDevice(&d) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return d;
}

void ditd_backend_cuda_shutdown(void)
{
    if (!g.ready)
        return;
    cudaStreamSynchronize(g.compute);
    cudaStreamSynchronize(g.comm);
    ditd_cuda_gemm_free(g.gemm);
    cudaFree(g.gemm_ws);
    cudaFree(g.stage);
    cudaFree(g.gn_stats);
    cudaEventDestroy(g.to_comm);
    cudaEventDestroy(g.to_compute);
    cudaStreamDestroy(g.compute);
    cudaStreamDestroy(g.comm);
    memset(&g, 0, sizeof g);
}

const ditd_backend_ops *ditd_backend_cuda_table(void)
{
    return &cuda_ops;
}

const ditd_backend_ops *ditd_backend_cuda_get(void)
{
    int n = 0, err, code;
    cudaError_t rc;
    if (g.ready)
        return &cuda_ops;
    if ((rc = cudaGetDeviceCount(&n)) != cudaSuccess || n == 0) {
        ditd_err_set(DITD_EDEVICE, "no CUDA device%s%s", rc != cudaSuccess ? ": " : "",
                     rc != cudaSuccess ? cudaGetErrorString(rc) : "");
        cudaGetLastError();
        return NULL;
    }
    if ((err = rt_check(cudaGetDevice(&g.device), "cudaGetDevice")) ||
        (err = rt_check(cudaStreamCreateWithFlags(&g.compute, cudaStreamNonBlocking),
                        "compute stream")) ||
        (err = rt_check(cudaStreamCreateWithFlags(&g.comm, cudaStreamNonBlocking),
                        "comm stream")) ||
        (err = rt_check(cudaEventCreateWithFlags(&g.to_comm, cudaEventDisableTiming), "event")) ||
        (err = rt_check(cudaEventCreateWithFlags(&g.to_compute, cudaEventDisableTiming),
                        "event")) ||
        (err = rt_check(cudaMalloc(&g.gemm_ws, GEMM_WS_BYTES), "cuBLASLt workspace")) ||
        (err = rt_check(cudaMalloc((void **)&g.gn_stats, GN_STATS_MAX * sizeof(double)),
                        "GroupNorm statistics")))
        goto fail;
    if ((code = ditd_cuda_gemm_new(g.gemm_ws, GEMM_WS_BYTES, &g.gemm))) {
        ditd_err_set(DITD_EDEVICE, "cuBLASLt: %s", ditd_cuda_strerror(code));
        goto fail;
    }
    ditd_cuda_gemm_on_fallback(g.gemm, on_gemm_fallback, NULL);
    g.ready = 1;
    return &cuda_ops;
fail:
    g.ready = 1; /* so that shutdown releases what was made */
    ditd_backend_cuda_shutdown();
    return NULL;
}

void *ditd_backend_cuda_compute_stream(void)
{
    return g.ready ? (void *)g.compute : NULL;
}

void *ditd_backend_cuda_comm_stream(void)
{
    return g.ready ? (void *)g.comm : NULL;
}

int ditd_backend_cuda_comm_begin(void)
{
    int err = rt_check(cudaEventRecord(g.to_comm, g.compute), "cudaEventRecord");
    return err ? err : rt_check(cudaStreamWaitEvent(g.comm, g.to_comm, 0), "cudaStreamWaitEvent");
}

int ditd_backend_cuda_comm_end(void)
{
    int err = rt_check(cudaEventRecord(g.to_compute, g.comm), "cudaEventRecord");
    return err ? err
               : rt_check(cudaStreamWaitEvent(g.compute, g.to_compute, 0), "cudaStreamWaitEvent");
}

int ditd_backend_cuda_is_device_ptr(const void *p)
{
    struct cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return a.type == cudaMemoryTypeDevice;
}

/* ---- graphs ---- */

struct ditd_cuda_graph {
    cudaGraph_t graph;
    cudaGraphExec_t exec;
};

/* A failed capture call also leaves its error as the runtime's last error
 * (not sticky); it is cleared here, so that the next status() after the
 * caller turned graphs off does not report it again. */
static int capture_check(cudaError_t rc, const char *what)
{
    if (rc == cudaSuccess)
        return 0;
    cudaGetLastError();
    return rt_check(rc, what);
}

int ditd_backend_cuda_capture_begin(void)
{
    if (!g.ready)
        return ditd_err_set(DITD_EINVAL, "CUDA backend not initialized");
    return capture_check(cudaStreamBeginCapture(g.compute, cudaStreamCaptureModeThreadLocal),
                         "cudaStreamBeginCapture");
}

int ditd_backend_cuda_capture_end(ditd_cuda_graph **out)
{
    ditd_cuda_graph *cg;
    cudaGraph_t graph = NULL;
    int err;
    *out = NULL;
    if ((err = capture_check(cudaStreamEndCapture(g.compute, &graph), "cudaStreamEndCapture"))) {
        g.err = 0; /* the ops' errors inside the capture are its consequences */
        g.detail[0] = 0;
        if (graph)
            cudaGraphDestroy(graph);
        return err;
    }
    if (g.err) { /* an op failed while capturing: the graph is incomplete */
        cudaGraphDestroy(graph);
        cudaGetLastError();
        return cu_status();
    }
    if (!(cg = calloc(1, sizeof *cg))) {
        cudaGraphDestroy(graph);
        return ditd_err_set(DITD_ENOMEM, "graph");
    }
    cg->graph = graph;
    if ((err = capture_check(cudaGraphInstantiate(&cg->exec, graph, 0), "cudaGraphInstantiate"))) {
        cudaGraphDestroy(graph);
        free(cg);
        return err;
    }
    *out = cg;
    return 0;
}

int ditd_backend_cuda_graph_launch(ditd_cuda_graph *cg)
{
    return rt_check(cudaGraphLaunch(cg->exec, g.compute), "cudaGraphLaunch");
}

void ditd_backend_cuda_graph_free(ditd_cuda_graph *cg)
{
    if (!cg)
        return;
    cudaGraphExecDestroy(cg->exec);
    cudaGraphDestroy(cg->graph);
    free(cg);
}
