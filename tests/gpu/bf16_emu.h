/* A CPU emulation of the CUDA backend's storage, for the bound checks that
 * run without a GPU (tests/gpu/test_flux_bf16_emu.c, test_wan_bf16_emu.c, test_sd3_bf16_emu.c):
 * the CPU's bf16-weight table with every op's output (and every upload)
 * rounded to bf16 to nearest even, as the CUDA kernels round what they
 * store. bf16_emu_table(&E) fills E; unpatchify and copy2d move values
 * already rounded, row_sumsq's sums stay fp32 as on the GPU. What it is
 * not: a model of the GPU's summation order or of attention's bf16 P. */
#ifndef DITD_TESTS_GPU_BF16_EMU_H
#define DITD_TESTS_GPU_BF16_EMU_H

#include <stdint.h>
#include <string.h>

#include "engine/backend/backend.h"

static const ditd_backend_ops *const W = &ditd_backend_cpu_bf16;

static float round_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    memcpy(&f, &u, 4);
    return f;
}

/* rows x cols floats of stride ld rounded to bf16, in place */
static void round_rows(void *p, size_t rows, size_t ld, size_t cols)
{
    float *f = p;
    for (size_t r = 0; r < rows; r++)
        for (size_t c = 0; c < cols; c++)
            f[r * ld + c] = round_bf16(f[r * ld + c]);
}

static void round_n(void *p, size_t n)
{
    round_rows(p, 1, n, n);
}

static void e_upload(void *d, const float *h, size_t n)
{
    W->upload(d, h, n);
    round_n(d, n);
}

static void e_linear(const void *x, size_t ldx, const void *w, const void *b, void *y, size_t ldy,
                     int M, int N, int K, ditd_act act)
{
    W->linear(x, ldx, w, b, y, ldy, M, N, K, act);
    round_rows(y, (size_t)M, ldy, (size_t)N);
}

static void e_act(const void *x, void *y, size_t n, ditd_act act)
{
    W->act(x, y, n, act);
    round_n(y, n);
}

static void e_add(void *y, const void *x, size_t n)
{
    W->add(y, x, n);
    round_n(y, n);
}

static void e_layernorm_modulate(const void *x, void *y, int B, int N, int D, float eps,
                                 const void *shift, const void *scale, size_t ld_mod)
{
    W->layernorm_modulate(x, y, B, N, D, eps, shift, scale, ld_mod);
    round_n(y, (size_t)B * N * D);
}

static void e_gated_residual(void *h, const void *y, int B, int N, int D, const void *gate,
                             size_t ld_gate)
{
    W->gated_residual(h, y, B, N, D, gate, ld_gate);
    round_n(h, (size_t)B * N * D);
}

static void e_attention(const void *q, size_t ldq, const void *k, size_t ldk, const void *v,
                        size_t ldv, void *o, size_t ldo, float *lse, int B, int Nq, int Nk, int H,
                        int Dh, float scale)
{
    W->attention(q, ldq, k, ldk, v, ldv, o, ldo, lse, B, Nq, Nk, H, Dh, scale);
    round_rows(o, (size_t)B * Nq, ldo, (size_t)H * Dh);
}

static void e_attention_merge(void *o_acc, size_t ldo_acc, float *lse_acc, const void *o_blk,
                              size_t ldo_blk, const float *lse_blk, int B, int Nq, int H, int Dh)
{
    W->attention_merge(o_acc, ldo_acc, lse_acc, o_blk, ldo_blk, lse_blk, B, Nq, H, Dh);
    round_rows(o_acc, (size_t)B * Nq, ldo_acc, (size_t)H * Dh);
}

static void e_patch_embed(const void *x, const void *w, const void *b, const void *pos, void *y,
                          void *scratch, int B, int C, int Hi, int Wi, int p, int D)
{
    W->patch_embed(x, w, b, pos, y, scratch, B, C, Hi, Wi, p, D);
    round_n(y, (size_t)B * (size_t)(Hi / p) * (size_t)(Wi / p) * (size_t)D);
}

static void e_rope(void *x, size_t ld, const void *cos, const void *sin, int B, int N, int H,
                   int Dh)
{
    W->rope(x, ld, cos, sin, B, N, H, Dh);
    round_rows(x, (size_t)B * N, ld, (size_t)H * Dh);
}

static void e_rmsnorm_heads(void *x, size_t ld, const void *w, int rows, int H, int Dh, float eps)
{
    W->rmsnorm_heads(x, ld, w, rows, H, Dh, eps);
    round_rows(x, (size_t)rows, ld, (size_t)H * Dh);
}

static void e_rmsnorm_rows(void *x, size_t ld, const void *w, const float *ss, int rows, int n,
                           int n_total, float eps)
{
    W->rmsnorm_rows(x, ld, w, ss, rows, n, n_total, eps);
    round_rows(x, (size_t)rows, ld, (size_t)n);
}

static void e_gelu_erf(void *y, size_t n)
{
    W->gelu_erf(y, n);
    round_n(y, n);
}

static inline void bf16_emu_table(ditd_backend_ops *E)
{
    *E = ditd_backend_cpu_bf16;
    E->name = "cpu-bf16-storage-emulation";
    E->upload = e_upload;
    E->linear = e_linear;
    E->act = e_act;
    E->add = e_add;
    E->layernorm_modulate = e_layernorm_modulate;
    E->gated_residual = e_gated_residual;
    E->attention = e_attention;
    E->attention_merge = e_attention_merge;
    E->patch_embed = e_patch_embed;
    E->rope = e_rope;
    E->rmsnorm_heads = e_rmsnorm_heads;
    E->rmsnorm_rows = e_rmsnorm_rows;
    E->gelu_erf = e_gelu_erf;
}

#endif
