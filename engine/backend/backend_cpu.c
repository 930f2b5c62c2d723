/* The CPU backends: fp32 activations, kernels/cpu underneath; two tables,
 * fp32 weights (ditd_backend_cpu) and bf16 weights (ditd_backend_cpu_bf16:
 * half the memory, bf16 x bf16 -> fp32 GEMMs; norms, attention, softmax
 * statistics and the sampler stay fp32). docs/cpu.md. */
#include "engine/backend/backend.h"

#include <cblas.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/backend/backend_cpu_text.h"
#include "engine/core/error.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/step_cache.h"
#include "kernels/cpu/image_kernels.h"
#include "kernels/cpu/rope.h"
#include "kernels/cpu/video_kernels.h"
#include "kernels/cpu/text_kernels.h"

const char *ditd_device_name(ditd_device d)
{
    switch (d) {
    case DITD_DEVICE_CPU: return "cpu";
    case DITD_DEVICE_CUDA: return "cuda";
    }
    return "unknown";
}

int ditd_device_from_str(const char *s, ditd_device *out)
{
    if (strcmp(s, "cpu") == 0) {
        *out = DITD_DEVICE_CPU;
        return 0;
    }
    if (strcmp(s, "cuda") == 0) {
        *out = DITD_DEVICE_CUDA;
        return 0;
    }
    return ditd_err_set(DITD_EINVAL, "unknown device \"%s\" (cpu, cuda)", s);
}

const char *ditd_act_name(ditd_act a)
{
    switch (a) {
    case DITD_ACT_NONE: return "none";
    case DITD_ACT_GELU_TANH: return "gelu-approximate";
    case DITD_ACT_SILU: return "silu";
    }
    return "unknown";
}

int ditd_act_from_str(const char *s, ditd_act *out)
{
    static const ditd_act all[] = {DITD_ACT_NONE, DITD_ACT_GELU_TANH, DITD_ACT_SILU};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        if (strcmp(s, ditd_act_name(all[i])) == 0) {
            *out = all[i];
            return 0;
        }
    }
    return ditd_err_set(DITD_EUNSUPPORTED,
                        "activation \"%s\" is not supported (gelu-approximate, silu)", s);
}

static ditd_cpu_act cpu_act(ditd_act a)
{
    switch (a) {
    case DITD_ACT_GELU_TANH: return DITD_CPU_ACT_GELU_TANH;
    case DITD_ACT_SILU: return DITD_CPU_ACT_SILU;
    case DITD_ACT_NONE: break;
    }
    return DITD_CPU_ACT_NONE;
}

static void cpu_upload(void *dst, const float *h_src, size_t n)
{
    if (dst != h_src)
        memcpy(dst, h_src, n * sizeof(float));
}

static void cpu_download(float *h_dst, const void *src, size_t n)
{
    if (h_dst != src)
        memcpy(h_dst, src, n * sizeof(float));
}

/* bf16 weights: the loader hands over f32, kept rounded to nearest-even
 * (exact for a bf16 checkpoint). */
static void cpu_upload_weight_bf16(void *dst, const float *h_src, size_t n)
{
    ditd_cpu_f32_to_bf16(h_src, dst, n);
}

static void cpu_sync(void)
{
}

static int cpu_set_threads(int n)
{
    if (n > 0) {
        omp_set_num_threads(n);
        openblas_set_num_threads(n);
    }
    return omp_get_max_threads();
}

/* Linear layers: on packed weights where this CPU runs ditd's packed
 * kernel (kernels/cpu/gemm_packed.c; decided once per process, so a weight
 * packed at load is read packed), else through the library. */
static void linear_any(const void *x, size_t ldx, const void *w, const void *b, int bf16,
                       void *y, size_t ldy, int M, int N, int K, ditd_act act)
{
    if (ditd_cpu_gemm_packs(bf16))
        ditd_cpu_gemm_packed(x, ldx, w, b, bf16, y, ldy, M, N, K, cpu_act(act));
    else if (bf16)
        ditd_cpu_linear_bf16(x, ldx, w, b, y, ldy, M, N, K, cpu_act(act));
    else
        ditd_cpu_linear(x, ldx, w, b, y, ldy, M, N, K, cpu_act(act));
}

static void cpu_linear(const void *x, size_t ldx, const void *w, const void *b, void *y,
                       size_t ldy, int M, int N, int K, ditd_act act)
{
    linear_any(x, ldx, w, b, 0, y, ldy, M, N, K, act);
}

static void cpu_linear_bf16(const void *x, size_t ldx, const void *w, const void *b, void *y,
                            size_t ldy, int M, int N, int K, ditd_act act)
{
    linear_any(x, ldx, w, b, 1, y, ldy, M, N, K, act);
}

/* A quantized weight: kernels/cpu/linear_q.c. The CPU ops have no error
 * path (they assert); a panel buffer that cannot be had is treated so. */
static void linear_q_any(const void *x, size_t ldx, const ditd_qweight *w, const void *b,
                         int bf16, void *y, size_t ldy, int M, ditd_act act)
{
    const ditd_cpu_qweight q = {.type = w->type, .N = w->N, .K = w->K,
                                .row_bytes = w->row_bytes, .data = w->data,
                                .scale = w->scale};
    if (ditd_cpu_linear_q(x, ldx, &q, b, bf16, y, ldy, M, cpu_act(act))) {
        fprintf(stderr, "ditd: out of memory for a (%d, %d) quantized linear's panels\n", w->N,
                w->K);
        abort();
    }
}

static void cpu_linear_q(const void *x, size_t ldx, const ditd_qweight *w, const void *b,
                         void *y, size_t ldy, int M, ditd_act act)
{
    linear_q_any(x, ldx, w, b, 0, y, ldy, M, act);
}

static void cpu_linear_q_bf16(const void *x, size_t ldx, const ditd_qweight *w, const void *b,
                              void *y, size_t ldy, int M, ditd_act act)
{
    linear_q_any(x, ldx, w, b, 1, y, ldy, M, act);
}

static int pack_any(void *w, int bf16, int N, int K)
{
    if (ditd_cpu_pack_weight(w, bf16, N, K))
        return ditd_err_set(DITD_ENOMEM, "packing a (%d, %d) linear weight: no memory for its copy",
                            N, K);
    return 0;
}

static int cpu_pack_linear(void *w, int N, int K)
{
    return pack_any(w, 0, N, K);
}

static int cpu_pack_linear_bf16(void *w, int N, int K)
{
    return pack_any(w, 1, N, K);
}

static void cpu_lora(const void *x, size_t ldx, const void *a, const void *b, float s, void *y,
                     size_t ldy, int M, int N, int K, int r, float *tmp, ditd_act act)
{
    ditd_cpu_lora(x, ldx, a, b, s, y, ldy, M, N, K, r, tmp, cpu_act(act));
}

static void cpu_act_apply(const void *x, void *y, size_t n, ditd_act act)
{
    if (x != y)
        memcpy(y, x, n * sizeof(float));
    ditd_cpu_act_apply(y, n, cpu_act(act));
}

static void cpu_add(void *y, const void *x, size_t n)
{
    float *fy = y;
    const float *fx = x;
    for (size_t i = 0; i < n; i++)
        fy[i] += fx[i];
}

static void cpu_embedding(const void *table, const int64_t *h_ids, void *out, int B, int D)
{
    for (int b = 0; b < B; b++)
        memcpy((float *)out + (size_t)b * D, (const float *)table + (size_t)h_ids[b] * D,
               (size_t)D * sizeof(float));
}

static void cpu_embedding_bf16(const void *table, const int64_t *h_ids, void *out, int B, int D)
{
    for (int b = 0; b < B; b++)
        ditd_cpu_bf16_to_f32((const uint16_t *)table + (size_t)h_ids[b] * D,
                             (float *)out + (size_t)b * D, (size_t)D);
}

static void cpu_timestep_embed(const float *h_t, void *out, int B, int dim)
{
    ditd_cpu_timestep_embed(h_t, out, B, dim);
}

static void cpu_layernorm_modulate(const void *x, void *y, int B, int N, int D, float eps,
                                   const void *shift, const void *scale, size_t ld_mod)
{
    ditd_cpu_layernorm_modulate(x, y, B, N, D, eps, shift, scale, ld_mod);
}

static void cpu_gated_residual(void *h, const void *y, int B, int N, int D,
                               const void *gate, size_t ld_gate)
{
    ditd_cpu_gated_residual(h, y, B, N, D, gate, ld_gate);
}

static void cpu_attention(const void *q, size_t ldq, const void *k, size_t ldk,
                          const void *v, size_t ldv, void *o, size_t ldo, float *lse,
                          int B, int Nq, int Nk, int H, int Dh, float scale)
{
    ditd_cpu_attention(q, ldq, k, ldk, v, ldv, o, ldo, lse, B, Nq, Nk, H, Dh, scale);
}

static void cpu_attention_merge(void *o_acc, size_t ldo_acc, float *lse_acc,
                                const void *o_blk, size_t ldo_blk, const float *lse_blk,
                                int B, int Nq, int H, int Dh)
{
    ditd_cpu_attention_merge(o_acc, ldo_acc, lse_acc, o_blk, ldo_blk, lse_blk, B, Nq, H, Dh);
}

static void cpu_patch_embed(const void *x, const void *w, const void *b, const void *pos,
                            void *y, void *scratch, int B, int C, int Hi, int Wi, int p, int D)
{
    ditd_cpu_patch_embed(x, w, b, pos, y, scratch, B, C, Hi, Wi, p, D);
}

static void cpu_patch_embed_bf16(const void *x, const void *w, const void *b, const void *pos,
                                 void *y, void *scratch, int B, int C, int Hi, int Wi, int p,
                                 int D)
{
    ditd_cpu_patch_embed_bf16(x, w, b, pos, y, scratch, B, C, Hi, Wi, p, D);
}

static void cpu_unpatchify(const void *x, void *y, int B, int C, int h, int w, int p)
{
    ditd_cpu_unpatchify(x, y, B, C, h, w, p);
}

static void cpu_copy2d(void *dst, size_t ldd, const void *src, size_t lds, size_t rows,
                       size_t cols)
{
    const size_t es = sizeof(float);
    if (ldd == cols && lds == cols) {
        memcpy(dst, src, rows * cols * es);
        return;
    }
    for (size_t r = 0; r < rows; r++)
        memcpy((char *)dst + r * ldd * es, (const char *)src + r * lds * es, cols * es);
}

static void cpu_conv2d(const void *x, size_t psx, const void *w, const void *b, void *y,
                       size_t psy, void *scratch, size_t scratch_n, int B, int Cin, int Hx,
                       int Wx, int Cout, int k, int s, int pad_t, int pad_b, int pad_l, int pad_r)
{
    ditd_cpu_conv2d(x, psx, w, b, y, psy, scratch, scratch_n, B, Cin, Hx, Wx, Cout, k, s, pad_t,
                    pad_b, pad_l, pad_r);
}

static void cpu_groupnorm_stats(const void *x, size_t ps, int B, int C, int rows, int W, int G,
                                double *h_stats)
{
    ditd_cpu_groupnorm_stats(x, ps, B, C, rows, W, G, h_stats);
}

static void cpu_groupnorm_apply(const void *x, size_t psx, void *y, size_t psy, int B, int C,
                                int rows, int W, int G, const float *h_mean, const float *h_rstd,
                                const void *gamma, const void *beta, int silu)
{
    ditd_cpu_groupnorm_apply(x, psx, y, psy, B, C, rows, W, G, h_mean, h_rstd, gamma, beta, silu);
}

static void cpu_upsample_nearest2x(const void *x, size_t psx, void *y, size_t psy, int B, int C,
                                   int rows, int W)
{
    ditd_cpu_upsample_nearest2x(x, psx, y, psy, B, C, rows, W);
}

static void cpu_planes_to_tokens(const void *x, size_t ps, void *t, int C, int n)
{
    ditd_cpu_planes_to_tokens(x, ps, t, C, n);
}

static void cpu_tokens_to_planes(const void *t, void *y, size_t ps, int C, int n, int accumulate)
{
    ditd_cpu_tokens_to_planes(t, y, ps, C, n, accumulate);
}

static void cpu_rope(void *x, size_t ld, const void *cos, const void *sin, int B, int N, int H,
                     int Dh)
{
    ditd_cpu_rope(x, ld, cos, sin, B, N, H, Dh);
}

static void cpu_rmsnorm_heads(void *x, size_t ld, const void *w, int rows, int H, int Dh, float eps)
{
    ditd_cpu_rmsnorm_heads(x, ld, w, rows, H, Dh, eps);
}

static void cpu_row_sumsq(const void *x, size_t ld, int rows, int n, float *ss)
{
    ditd_cpu_row_sumsq(x, ld, rows, n, ss);
}

/* the text kernels' erf GELU (torch "gelu"), in chunks an int counts */
static void cpu_gelu_erf(void *y, size_t n)
{
    for (size_t i = 0; i < n; i += (size_t)1 << 30) {
        size_t k = n - i < (size_t)1 << 30 ? n - i : (size_t)1 << 30;
        ditd_cpu_tact_apply((float *)y + i, k, 1, (int)k, DITD_CPU_TACT_GELU);
    }
}

static void cpu_rmsnorm_rows(void *x, size_t ld, const void *w, const float *ss, int rows, int n,
                             int n_total, float eps)
{
    ditd_cpu_rmsnorm_rows(x, ld, w, ss, rows, n, n_total, eps);
}

/* The bf16 table's: w (Dh) is a weight (backend.h), so bf16 here; widened
 * before the f32 kernel reads it. Reading it as f32 (the f32 table's op)
 * took FLUX's QK-norm gains from the wrong bytes. Dh is at most
 * DITD_CPU_ATTN_MAX_DH (flux_config refuses more). */
static void cpu_rmsnorm_heads_bf16(void *x, size_t ld, const void *w, int rows, int H, int Dh,
                                   float eps)
{
    float wf[DITD_CPU_ATTN_MAX_DH];
    if (Dh <= 0 || Dh > DITD_CPU_ATTN_MAX_DH)
        return;
    if (w)
        ditd_cpu_bf16_to_f32(w, wf, (size_t)Dh);
    ditd_cpu_rmsnorm_heads(x, ld, w ? wf : NULL, rows, H, Dh, eps);
}

static void cpu_row_diff_stats(const void *a, const void *b, int rows, int D, double *h_out)
{
    ditd_cpu_row_diff_stats(a, b, rows, D, h_out);
}

static void cpu_axpby(void *y, const void *x, float a, float b, size_t n, int round_bf16)
{
    ditd_cpu_axpby(y, x, a, b, n, round_bf16);
}

static int cpu_status(void)
{
    return 0;
}

/* ---- video (the Wan VAE): f32 weights only (the bf16 table has none) ---- */

static void cpu_conv3d_frame(const void *const *xf, int kT, size_t psx, const void *w,
                             const void *b, void *y, size_t psy, void *scratch, size_t scratch_n,
                             int Cin, int H, int W, int Cout, int k, int pad_h, int pad_w)
{
    ditd_cpu_conv3d_frame((const float *const *)xf, kT, psx, w, b, y, psy, scratch, scratch_n, Cin,
                          H, W, Cout, k, pad_h, pad_w);
}

static void cpu_rmsnorm_channels(const void *x, size_t psx, void *y, size_t psy, int C, int n,
                                 const void *gamma, int silu)
{
    ditd_cpu_rmsnorm_channels(x, psx, y, psy, C, n, gamma, silu);
}

static void cpu_avgdown3d_frame(const void *const *xf, size_t psx, int Cin, int H, int W, int Cout,
                                int ft, int fs, void *y, size_t psy, int accumulate)
{
    ditd_cpu_avgdown3d_frame((const float *const *)xf, psx, Cin, H, W, Cout, ft, fs, y, psy,
                             accumulate);
}

static void cpu_dupup3d_frame(const void *x, size_t psx, int Cin, int H, int W, int Cout, int ft,
                              int fs, int a, void *y, size_t psy, int accumulate)
{
    ditd_cpu_dupup3d_frame(x, psx, Cin, H, W, Cout, ft, fs, a, y, psy, accumulate);
}

const ditd_backend_ops ditd_backend_cpu = {
    .name = "cpu",
    .device = DITD_DEVICE_CPU,
    .attn_max_head_dim = DITD_CPU_ATTN_MAX_DH,
    .act_dtype = DITD_DTYPE_F32,
    .weight_dtype = DITD_DTYPE_F32,
    .upload = cpu_upload,
    .download = cpu_download,
    .upload_weight = cpu_upload,
    .sync = cpu_sync,
    .set_threads = cpu_set_threads,
    .linear = cpu_linear,
    .pack_linear = cpu_pack_linear,
    .linear_q = cpu_linear_q,
    .act = cpu_act_apply,
    .add = cpu_add,
    .embedding = cpu_embedding,
    .timestep_embed = cpu_timestep_embed,
    .layernorm_modulate = cpu_layernorm_modulate,
    .gated_residual = cpu_gated_residual,
    .attention = cpu_attention,
    .attention_merge = cpu_attention_merge,
    .patch_embed = cpu_patch_embed,
    .unpatchify = cpu_unpatchify,
    .copy2d = cpu_copy2d,
    .mem_alloc = NULL, /* arenas map host pages (engine/core/tensor.c) */
    .mem_free = NULL,
    .status = cpu_status,
    /* text encoders: engine/backend/backend_cpu_text.c */
    .linear_wt = ditd__cpu_linear_wt,
    .mul = ditd__cpu_mul,
    .embedding_wt = ditd__cpu_embedding_wt,
    .layernorm_affine = ditd__cpu_layernorm_affine,
    .rmsnorm = ditd__cpu_rmsnorm,
    .attention_masked = ditd__cpu_attention_masked,
    .act_text = ditd__cpu_act_text,
    .conv2d = cpu_conv2d,
    .groupnorm_stats = cpu_groupnorm_stats,
    .groupnorm_apply = cpu_groupnorm_apply,
    .upsample_nearest2x = cpu_upsample_nearest2x,
    .planes_to_tokens = cpu_planes_to_tokens,
    .tokens_to_planes = cpu_tokens_to_planes,
    .rope = cpu_rope,
    .rmsnorm_heads = cpu_rmsnorm_heads,
    .row_sumsq = cpu_row_sumsq,
    .rmsnorm_rows = cpu_rmsnorm_rows,
    .gelu_erf = cpu_gelu_erf,
    .upload_f32 = cpu_upload, /* activations are f32 here */
    .conv3d_frame = cpu_conv3d_frame,
    .rmsnorm_channels = cpu_rmsnorm_channels,
    .avgdown3d_frame = cpu_avgdown3d_frame,
    .dupup3d_frame = cpu_dupup3d_frame,
    .row_diff_stats = cpu_row_diff_stats,
    .axpby = cpu_axpby,
    .lora = cpu_lora,
};

/* The same table with bf16 weights: only the ops that read weights differ. */
const ditd_backend_ops ditd_backend_cpu_bf16 = {
    .name = "cpu-bf16",
    .device = DITD_DEVICE_CPU,
    .attn_max_head_dim = DITD_CPU_ATTN_MAX_DH,
    .act_dtype = DITD_DTYPE_F32,
    .weight_dtype = DITD_DTYPE_BF16,
    .upload = cpu_upload,
    .download = cpu_download,
    .upload_weight = cpu_upload_weight_bf16,
    .sync = cpu_sync,
    .set_threads = cpu_set_threads,
    .linear = cpu_linear_bf16,
    .pack_linear = cpu_pack_linear_bf16,
    .linear_q = cpu_linear_q_bf16,
    .act = cpu_act_apply,
    .add = cpu_add,
    .embedding = cpu_embedding_bf16,
    .timestep_embed = cpu_timestep_embed,
    .layernorm_modulate = cpu_layernorm_modulate,
    .gated_residual = cpu_gated_residual,
    .attention = cpu_attention,
    .attention_merge = cpu_attention_merge,
    .patch_embed = cpu_patch_embed_bf16,
    .unpatchify = cpu_unpatchify,
    .copy2d = cpu_copy2d,
    .mem_alloc = NULL,
    .mem_free = NULL,
    .status = cpu_status,
    /* FLUX's: rope reads activations and the fp32 table, as the f32
     * table's; rmsnorm_heads reads a bf16 weight */
    .rope = cpu_rope,
    .rmsnorm_heads = cpu_rmsnorm_heads_bf16,
    .row_sumsq = cpu_row_sumsq,        /* activations stay f32: the f32 table's */
    .rmsnorm_rows = cpu_rmsnorm_rows,
    .gelu_erf = cpu_gelu_erf,
    .upload_f32 = cpu_upload,
    .row_diff_stats = cpu_row_diff_stats,
    .axpby = cpu_axpby,
    .lora = cpu_lora,
};

const char *ditd_backend_cpu_gemm_info(void)
{
    return ditd_cpu_gemm_info();
}

int ditd_backend_cpu_has_bf16(void)
{
    return ditd_cpu_has_bf16_dot();
}

const ditd_backend_ops *ditd_backend_with_dtype(const ditd_backend_ops *ops, ditd_dtype wt)
{
    if (ops->weight_dtype == wt)
        return ops;
    if (ops->device == DITD_DEVICE_CPU && wt == DITD_DTYPE_F32)
        return &ditd_backend_cpu;
    if (ops->device == DITD_DEVICE_CPU && wt == DITD_DTYPE_BF16)
        return &ditd_backend_cpu_bf16;
    ditd_err_set(DITD_EUNSUPPORTED, "--dtype %s: the %s backend keeps %s weights", ditd_dtype_name(wt),
                 ditd_device_name(ops->device), ditd_dtype_name(ops->weight_dtype));
    return NULL;
}

double ditd_backend_cpu_fma_peak(int threads, double seconds, int *bits)
{
    return ditd_cpu_fma_peak_gflops(threads, seconds, bits);
}

const ditd_backend_ops *ditd_backend_for_weights(const ditd_backend_ops *ops, const char *want,
                                                 ditd_dtype ckpt)
{
    ditd_dtype wt;
    if (want && strcmp(want, "auto") != 0) {
        if (ditd_dtype_from_str(want, &wt) || (wt != DITD_DTYPE_F32 && wt != DITD_DTYPE_BF16)) {
            ditd_err_set(DITD_EINVAL, "--dtype \"%s\": f32, bf16 or auto", want);
            return NULL;
        }
        return ditd_backend_with_dtype(ops, wt);
    }
    if (ops->device != DITD_DEVICE_CPU)
        return ops;
    /* auto: a bf16 checkpoint stays bf16 where the CPU has bf16 dot
     * products (lossless, half the memory). f16 checkpoints run f32: f16
     * to bf16 drops 3 mantissa bits, a change of numerics that a user asks
     * for with --dtype bf16, not one made for them. f32 checkpoints, and
     * CPUs without bf16 dot products, run f32. */
    if (ckpt == DITD_DTYPE_BF16 && ditd_cpu_has_bf16_dot())
        return &ditd_backend_cpu_bf16;
    return &ditd_backend_cpu;
}
