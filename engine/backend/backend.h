/* The backend ops interface: one static const table of function pointers per
 * device (as ggml_backend_i). Model code calls ops->linear(...) and never asks
 * which device it runs on.
 *
 * Pointers are device pointers to activations of the backend's act_dtype
 * (f32 on the CPU); weights are device pointers of its weight_dtype. Offsets
 * into buffers are taken with ditd_ptr_act()/ditd_ptr_w() so model code
 * stays dtype-agnostic. Host arrays (timesteps, class ids) are named h_*.
 *
 * Layout conventions are those of kernels/cpu/cpu_kernels.h: row-major,
 * nn.Linear weights (N_out, K_in), tokens (B, N, D), attention (B, N, H, Dh)
 * rows with a leading dimension, LSE (B, H, Nq).
 *
 * Ops are asynchronous with respect to the host on devices that have
 * streams; ops->sync() waits. On the CPU every op completes before it
 * returns.
 */
#ifndef DITD_ENGINE_BACKEND_H
#define DITD_ENGINE_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "engine/core/tensor.h"

typedef enum ditd_device {
    DITD_DEVICE_CPU = 0,
    DITD_DEVICE_CUDA,
} ditd_device;

const char *ditd_device_name(ditd_device d);
int ditd_device_from_str(const char *s, ditd_device *out);

typedef enum ditd_act {
    DITD_ACT_NONE = 0,
    DITD_ACT_GELU_TANH,
    DITD_ACT_SILU,
} ditd_act;

const char *ditd_act_name(ditd_act a);
int ditd_act_from_str(const char *s, ditd_act *out);

/* Activations of the text encoders, by transformers' ACT2FN names: "gelu"
 * (erf), "gelu_new" (tanh), "quick_gelu" (x sigmoid(1.702 x)), "relu". */
typedef enum ditd_text_act {
    DITD_TEXT_ACT_NONE = 0,
    DITD_TEXT_ACT_GELU,
    DITD_TEXT_ACT_GELU_NEW,
    DITD_TEXT_ACT_QUICK_GELU,
    DITD_TEXT_ACT_RELU,
} ditd_text_act;

const char *ditd_text_act_name(ditd_text_act a);
/* 0, or DITD_EUNSUPPORTED naming s and the accepted names. */
int ditd_text_act_from_str(const char *s, ditd_text_act *out);

/* A linear layer's weight (N, K) kept quantized in memory, as a GGUF file
 * stores it (docs/quant.md): N rows of row_bytes, each K / block values in
 * GGML blocks of ggml type `type` (F32 .. Q6_K: kernels/cpu/dequant.h;
 * engine/io/gguf.h names them). `data` is the backend's memory (host on the
 * CPU: the GGUF mapping itself, or a copy). Nothing is packed or re-laid. */
typedef struct ditd_qweight {
    int type;
    int N, K;
    size_t row_bytes;
    const void *data;
    const float *scale; /* N row scales (host f32) of an FP8 weight, or NULL */
} ditd_qweight;

typedef struct ditd_backend_ops {
    const char *name;
    ditd_device device;
    ditd_dtype act_dtype;
    ditd_dtype weight_dtype;
    /* What the table supports (ggml's supports_op), which the checks of a
     * component that runs on it ask (ditd_backend_check_head_dim): the
     * attention kernels' largest head size. An op the table lacks is NULL. */
    int attn_max_head_dim;

    /* Memory the arena hands out is reachable by the device: on the CPU it
     * is host memory. upload/download convert from/to host f32. */
    void (*upload)(void *dst, const float *h_src, size_t n);
    void (*download)(float *h_dst, const void *src, size_t n);
    /* Weights arrive as host f32 (from the safetensors loader). */
    void (*upload_weight)(void *dst, const float *h_src, size_t n);
    void (*sync)(void);
    /* Host threads the backend may use (OpenMP and BLAS on the CPU); <= 0
     * keeps the runtime's default. Returns the number in effect. */
    int (*set_threads)(int n);

    /* y (M, N) = act(x (M, K) @ w^T + b); w (N, K); b may be NULL. */
    void (*linear)(const void *x, size_t ldx, const void *w, const void *b,
                   void *y, size_t ldy, int M, int N, int K, ditd_act act);
    /* Re-lays a linear layer's weight w (N, K), once it is wholly loaded,
     * in place into the order this backend's linear reads (the same bytes:
     * the CPU's packed panels, kernels/cpu/gemm_packed.c); NULL where linear
     * reads nn.Linear's layout as it is. Model loaders call it through
     * ditd_pack_linear for every weight they pass to linear, and then read
     * that weight only through linear (never a row of it, never another
     * op). 0, or DITD_ENOMEM (w unchanged). */
    int (*pack_linear)(void *w, int N, int K);
    /* y (M, w->N) = act(x (M, w->K) @ dequant(w)^T + b) on a quantized
     * weight, each panel dequantized into the compute type (f32 on the CPU
     * table, bf16 on its bf16 table) as the GEMM reads it; b of
     * weight_dtype or NULL. Equal to `linear` on the dequantized (rounded)
     * weight on the CPU. On CUDA the FP8 types only, through cuBLASLt's FP8
     * GEMM (x rounded to e4m3 per token: not equal, within a few percent;
     * kernels/cuda/cuda_kernels.h ditd_cuda_linear_fp8). w's data and scale
     * are in this backend's memory. NULL where the backend lacks it. */
    void (*linear_q)(const void *x, size_t ldx, const ditd_qweight *w, const void *b, void *y,
                     size_t ldy, int M, ditd_act act);
    /* Whether linear_q takes a weight of this stored type (kernels/cpu/
     * dequant.h numbers) and shape; NULL: every type ditd dequantizes. A
     * loader keeps a weight as stored only when it answers 1. */
    int (*linear_q_takes)(int type, int N, int K);
    /* n raw bytes from the host into memory the arena handed out (a stored
     * weight's bytes, its row scales as f32); NULL where that memory is the
     * host's (the loader copies directly). */
    void (*upload_bytes)(void *dst, const void *h_src, size_t n);
    /* y = act(x), elementwise; y == x allowed. */
    void (*act)(const void *x, void *y, size_t n, ditd_act act);
    /* y += x, elementwise. */
    void (*add)(void *y, const void *x, size_t n);
    /* out[b, :] = table[h_ids[b], :], table (rows, D). */
    void (*embedding)(const void *table, const int64_t *h_ids, void *out, int B, int D);
    /* out (B, dim): sinusoidal embedding of host timesteps (Diffusers). */
    void (*timestep_embed)(const float *h_t, void *out, int B, int dim);
    /* LayerNorm (no affine) then adaLN: y = LN(x) * (1 + scale) + shift. */
    void (*layernorm_modulate)(const void *x, void *y, int B, int N, int D, float eps,
                               const void *shift, const void *scale, size_t ld_mod);
    /* h += gate * y, gate rows per batch element (stride ld_gate). */
    void (*gated_residual)(void *h, const void *y, int B, int N, int D,
                           const void *gate, size_t ld_gate);
    /* o = softmax(scale q k^T) v, and the LSE (B, H, Nq, fp32) when lse != NULL. */
    void (*attention)(const void *q, size_t ldq, const void *k, size_t ldk,
                      const void *v, size_t ldv, void *o, size_t ldo, float *lse,
                      int B, int Nq, int Nk, int H, int Dh, float scale);
    /* Merge a partial attention (o_blk, lse_blk) into (o_acc, lse_acc). */
    void (*attention_merge)(void *o_acc, size_t ldo_acc, float *lse_acc,
                            const void *o_blk, size_t ldo_blk, const float *lse_blk,
                            int B, int Nq, int H, int Dh);
    /* Conv2d patch embedding (+ pos) to tokens (B, N, D). scratch: B*N*C*p*p;
     * it holds the patches (B*N, C*p*p), each in (c, i, j) order, afterwards
     * (FLUX's x_embedder adapters read them). */
    void (*patch_embed)(const void *x, const void *w, const void *b, const void *pos,
                        void *y, void *scratch, int B, int C, int Hi, int Wi, int p, int D);
    /* Tokens (B, h*w, p*p*C) to pixels (B, C, h*p, w*p). */
    void (*unpatchify)(const void *x, void *y, int B, int C, int h, int w, int p);

    /* Strided 2-D copy of rows x cols activation elements, dst and src rows
     * of stride ldd and lds elements (the packing around collectives). The
     * buffers must not overlap. */
    void (*copy2d)(void *dst, size_t ldd, const void *src, size_t lds, size_t rows,
                   size_t cols);
    /* Memory the arenas are carved from (ditd_arena_init_mem): NULL on the
     * CPU, whose arenas map host pages; device memory (zeroed) on a GPU.
     * mem_alloc returns 0 or DITD_ENOMEM / DITD_EDEVICE with the detail set;
     * called when a model loads, never in the hot loop. */
    int (*mem_alloc)(void **p, size_t bytes);
    void (*mem_free)(void *p, size_t bytes);
    /* Ops return nothing; a device backend keeps the first error it met
     * (a launch refused, a shape it cannot take, a fault seen at a sync).
     * status() returns it (0 or DITD_E*, the detail set) and clears it.
     * Callers check it after ops->sync() (or a download, which syncs). The
     * CPU backend always returns 0 (its ops assert instead). */
    int (*status)(void);

    /* ---- FLUX's attention inputs (kernels/cpu/rope.h, kernels/cuda/rope.cu);
     * NULL on a backend that lacks them: the FLUX family then refuses to load.
     * rope: x (B, N, H, Dh) rows of stride ld rotated in place, pair i of
     * token n by cos/sin (N, Dh/2), fp32 on every backend (as Diffusers keeps
     * the table), put there by upload_f32. rmsnorm_heads: x (rows, H, Dh)
     * rows of stride ld, each head RMS-normalized in place times w (Dh, a
     * weight). upload_f32: n host floats into device memory as they are
     * (no conversion to the activation type). */
    void (*rope)(void *x, size_t ld, const void *cos, const void *sin, int B, int N, int H,
                 int Dh);
    void (*rmsnorm_heads)(void *x, size_t ld, const void *w, int rows, int H, int Dh, float eps);
    void (*upload_f32)(void *dst, const float *h_src, size_t n);
    /* ---- Wan's RMSNorm across heads (kernels/cpu/rope.h, kernels/cuda/rope.cu);
     * NULL where a backend lacks them: the Wan family then refuses to load.
     * row_sumsq: ss (rows, fp32 device memory) = the sum of squares of each
     * row's n values of x (rows of stride ld). rmsnorm_rows: x <- x /
     * sqrt(ss / n_total + eps) * w in place, w (n) in the ACTIVATION type
     * (put there by upload), NULL for none; n_total the whole row's width
     * (tensor parallel: the caller all-reduces ss over the ranks holding
     * the rest of the row in between). */
    void (*row_sumsq)(const void *x, size_t ld, int rows, int n, float *ss);
    /* y = GELU(y) with erf (torch's approximate="none"), in place, n
     * activations: Wan 2.1 I2V's image embedder. NULL where a backend lacks
     * it (such a model is then refused at load). */
    void (*gelu_erf)(void *y, size_t n);
    void (*rmsnorm_rows)(void *x, size_t ld, const void *w, const float *ss, int rows, int n,
                         int n_total, float eps);

    /* ---- optional: NULL on the CPU, where the forward runs op by op ----
     *
     * The per-step arguments in device memory, so that a forward can be
     * captured once as a CUDA graph and replayed: upload_args copies B
     * timesteps and class ids from the host into d_t / d_y (device buffers
     * the caller carved from its arena), queued before the ops that read
     * them; embedding_dev / timestep_embed_dev are embedding /
     * timestep_embed reading those buffers when they run. Ids are checked
     * on the host by the caller. */
    void (*upload_args)(float *d_t, const float *h_t, int64_t *d_y, const int64_t *h_y, int B);
    void (*embedding_dev)(const void *table, const int64_t *d_ids, void *out, int B, int D);
    void (*timestep_embed_dev)(const float *d_t, void *out, int B, int dim);
    /* Stream capture: between graph_begin and graph_end every op is recorded
     * instead of run (no upload, download or sync in between); graph_end
     * instantiates it (*g owned, graph_free); graph_launch queues one
     * replay. 0 or DITD_E*; graph_begin returns DITD_EUNSUPPORTED when
     * graphs are turned off (DITD_CUDA_GRAPHS=0), and the caller runs the
     * ops directly. */
    int (*graph_begin)(void);
    int (*graph_end)(void **g);
    int (*graph_launch)(void *g);
    void (*graph_free)(void *g);

    /* ---- text encoders (engine/text): NULL where a backend lacks them ----
     *
     * linear_wt: y (M, N) = act(x (M, K) @ w^T + b) with w (N, K) kept in
     * its stored type wdt (F32, F16 or BF16) and widened inside the GEMM,
     * panel by panel, through `scratch` (scratch_elems act elements, at
     * least K); b (N) act dtype or NULL. */
    void (*linear_wt)(const void *x, size_t ldx, const void *w, ditd_dtype wdt, const void *b,
                      void *y, size_t ldy, int M, int N, int K, ditd_text_act act,
                      void *scratch, size_t scratch_elems);
    /* y *= x, elementwise. */
    void (*mul)(void *y, const void *x, size_t n);
    /* out[i, :] = table[h_ids[i], :], table (rows, D) stored as wdt. */
    void (*embedding_wt)(const void *table, ditd_dtype wdt, const int64_t *h_ids, void *out,
                         int n, int D);
    /* LayerNorm with affine g, b (D) (either may be NULL), y may alias x. */
    void (*layernorm_affine)(const void *x, void *y, int rows, int D, float eps, const void *g,
                             const void *b);
    /* T5LayerNorm: y = w * x / sqrt(mean(x^2) + eps), y may alias x. */
    void (*rmsnorm)(const void *x, void *y, int rows, int D, float eps, const void *w);
    /* Self-attention of B sequences of N tokens, transformers' eager math:
     * scores scale q.k + rel[h, j - i + N - 1] (rel (H, 2N - 1) or NULL),
     * masked (causal j > i, or keep[b, j] == 0, keep (B, N) bytes or NULL)
     * to the most negative finite value, softmax, times v. Layouts as
     * attention; scratch: N * N act elements. */
    void (*attention_masked)(const void *q, size_t ldq, const void *k, size_t ldk,
                             const void *v, size_t ldv, void *o, size_t ldo, int B, int N,
                             int H, int Dh, float scale, const void *rel, const uint8_t *keep,
                             int causal, void *scratch);
    /* y (rows, cols), rows of stride ldy, = act(y): the activation a
     * linear_wt would fuse, run on its own after a LoRA adapter's term is
     * added to that linear's output (engine/text/text_lora.h). */
    void (*act_text)(void *y, size_t ldy, int rows, int cols, ditd_text_act act);
    /* ---- images (the VAE; kernels/cpu/image_kernels.h has the layouts) ----
     * NULL on a backend that does not have them yet; the VAE refuses to
     * load there. x is (B, C, rows, W) with plane stride ps (elements). */
    /* nn.Conv2d, any k, stride s, zero pads; scratch >= Cin*k*k*Wo elements. */
    void (*conv2d)(const void *x, size_t psx, const void *w, const void *b, void *y,
                   size_t psy, void *scratch, size_t scratch_n, int B, int Cin, int Hx,
                   int Wx, int Cout, int k, int s, int pad_t, int pad_b, int pad_l, int pad_r);
    /* GroupNorm statistics of the given rows, host doubles (B, G, {sum, sum of
     * squares}); waits for the device. */
    void (*groupnorm_stats)(const void *x, size_t ps, int B, int C, int rows, int W, int G,
                            double *h_stats);
    /* GroupNorm apply (+ SiLU): h_mean, h_rstd host (B, G); y may alias x. */
    void (*groupnorm_apply)(const void *x, size_t psx, void *y, size_t psy, int B, int C,
                            int rows, int W, int G, const float *h_mean, const float *h_rstd,
                            const void *gamma, const void *beta, int silu);
    void (*upsample_nearest2x)(const void *x, size_t psx, void *y, size_t psy, int B, int C,
                               int rows, int W);
    /* One image: planes (C, n) stride ps <-> tokens (n, C). */
    void (*planes_to_tokens)(const void *x, size_t ps, void *t, int C, int n);
    void (*tokens_to_planes)(const void *t, void *y, size_t ps, int C, int n, int accumulate);

    /* ---- video (the Wan VAE; kernels/cpu/video_kernels.h has the layouts) ----
     * NULL on a backend (or weight type) that does not have them yet; the
     * Wan VAE refuses to load there. A frame is C planes of H x W with
     * plane stride ps; xf is a host array of device frame pointers, one
     * per time tap, NULL standing for a frame of zeros. */
    /* One output frame of nn.Conv3d (spatial stride 1, zero pad_h rows
     * above and below, pad_w columns left and right) from the kT frames its
     * taps read; w (Cout, Cin, kT, k, k); scratch >= the backend's row need
     * (CPU: Cin kT k k Wo, CUDA: (Cin kT k k + Cout) Wo elements). */
    void (*conv3d_frame)(const void *const *xf, int kT, size_t psx, const void *w, const void *b,
                         void *y, size_t psy, void *scratch, size_t scratch_n, int Cin, int H,
                         int W, int Cout, int k, int pad_h, int pad_w);
    /* WanRMS_norm over the C channels of n positions (+ SiLU); gamma (C), a
     * weight; y may alias x. */
    void (*rmsnorm_channels)(const void *x, size_t psx, void *y, size_t psy, int C, int n,
                             const void *gamma, int silu);
    /* AvgDown3D from ft frames / DupUp3D's output frame t ft + a from one
     * frame; accumulate adds to y (the residual shortcuts). */
    void (*avgdown3d_frame)(const void *const *xf, size_t psx, int Cin, int H, int W, int Cout,
                            int ft, int fs, void *y, size_t psy, int accumulate);
    void (*dupup3d_frame)(const void *x, size_t psx, int Cin, int H, int W, int Cout, int ft,
                          int fs, int a, void *y, size_t psy, int accumulate);
    /* ---- step caching (engine/pipeline/step_cache.c); NULL where a
     * backend lacks them (a cache then refuses to start) ----
     * row_diff_stats: per row r of a, b (rows, D) activations, into host
     * doubles h_out[4r..4r+3] = sum |a - b|, sum |b|, sum a^2, sum b^2 (b
     * NULL: sum a^2 only), float64 sums whose order depends on D only (the
     * same per row however the rows are split); waits for the device. */
    void (*row_diff_stats)(const void *a, const void *b, int rows, int D, double *h_out);
    /* y = a x + b y over n activations (x NULL: y = b y); round_bf16: the
     * result rounded to bfloat16 (a no-op where activations are bf16). */
    void (*axpby)(void *y, const void *x, float a, float b, size_t n, int round_bf16);
    /* ---- LoRA adapters, unmerged (engine/models/lora.h, docs/lora.md);
     * NULL where a backend lacks it (adapters are then refused) ----
     * y (M, N) rows of stride ldy = act(y + s (x A^T) B^T): x (M, K) rows
     * of stride ldx, A (r, K) and B (N, r) in the ACTIVATION type (put there
     * by upload), tmp M * r floats of fp32 device scratch. The activation a
     * linear would fuse comes after the adapter's term: the caller runs the
     * linear without it and passes it here. r == 0 or s == 0: y = act(y)
     * only (rows of a batch that carry no adapter on this layer). */
    void (*lora)(const void *x, size_t ldx, const void *a, const void *b, float s, void *y,
                 size_t ldy, int M, int N, int K, int r, float *tmp, ditd_act act);
} ditd_backend_ops;

extern const ditd_backend_ops ditd_backend_cpu;
/* The CPU with bf16 weights (f32 activations; docs/cpu.md). */
extern const ditd_backend_ops ditd_backend_cpu_bf16;

/* The table of ops's device whose weights are `wt`: ops itself when it
 * already is, the CPU's f32 or bf16 table; NULL with the detail set when the
 * device has no such table (CUDA keeps bf16). Borrowed. */
const ditd_backend_ops *ditd_backend_with_dtype(const ditd_backend_ops *ops, ditd_dtype wt);

/* One line naming the CPU GEMM library, the instruction set it runs and its
 * f32 and bf16 kernels (for the start-up log and `ditd bench`). Static. */
const char *ditd_backend_cpu_gemm_info(void);
/* Whether this CPU computes bf16 dot products in hardware (AVX512-BF16 or
 * AMX): where bf16 weights are the default for 16-bit checkpoints. */
int ditd_backend_cpu_has_bf16(void);

/* ops->pack_linear(w, N, K) where the backend has it, else 0. */
int ditd_pack_linear(const ditd_backend_ops *ops, void *w, int N, int K);
/* The CPU's FMA peak in GFLOP/s with `threads` threads, measured for about
 * `seconds` (24 independent 512-bit accumulators per thread; *bits = 512, or
 * 256 without AVX-512). For benchmarks. */
double ditd_backend_cpu_fma_peak(int threads, double seconds, int *bits);
/* The table a --dtype choice gives: want "f32" or "bf16" (or NULL / "auto":
 * on the CPU, bf16 for a bf16 checkpoint `ckpt` where the CPU has bf16 dot
 * products, else f32, f16 checkpoints included (f16 -> bf16 is lossy);
 * other devices keep their own). NULL with the detail
 * set for a dtype the device cannot keep. Borrowed. */
const ditd_backend_ops *ditd_backend_for_weights(const ditd_backend_ops *ops, const char *want,
                                                 ditd_dtype ckpt);

/* Whether ops's attention takes heads of head_dim: 0, or DITD_EUNSUPPORTED
 * naming `what` (e.g. "transformer/config.json: attention_head_dim"), the
 * device and its limit. For start-up checks; touches no device. */
int ditd_backend_check_head_dim(const ditd_backend_ops *ops, int head_dim, const char *what);

/* The built-in table of a device, for capability questions only (the
 * device is not opened: run on ditd_backend_open's), or NULL with a detail
 * when the device is not built into this binary. */
const ditd_backend_ops *ditd_backend_table(ditd_device d);

/* The table for a device, or NULL (with a detail) when not built in. */
const ditd_backend_ops *ditd_backend_get(ditd_device d);

/* This process's rank on its node, for choosing its GPU: the launcher's
 * OMPI_COMM_WORLD_LOCAL_RANK, else 0 (not under mpirun). */
int ditd_backend_local_rank(void);

/* Whether the device can be used here, without initializing it: 0, or
 * DITD_EUNSUPPORTED (not built into this binary) / DITD_EDEVICE (no GPU)
 * with a detail that names the device. For start-up checks. */
int ditd_backend_check(ditd_device d);

/* The table a worker rank runs on: for CUDA, first cudaSetDevice(local
 * rank modulo the node's GPU count) (ditd_backend_local_rank), then the
 * backend on that device. NULL with the detail set (naming the device)
 * when it cannot be used; the CPU never fails. Borrowed. */
const ditd_backend_ops *ditd_backend_open(ditd_device d);

static inline void *ditd_ptr_act(const ditd_backend_ops *ops, const void *p, size_t elems)
{
    return (uint8_t *)p + elems * ditd_dtype_size(ops->act_dtype);
}

static inline void *ditd_ptr_w(const ditd_backend_ops *ops, const void *p, size_t elems)
{
    return (uint8_t *)p + elems * ditd_dtype_size(ops->weight_dtype);
}

#endif
