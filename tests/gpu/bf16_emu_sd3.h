/* SD3's CPU emulation of the CUDA backend's storage (no GPU needed;
 * tests/gpu/bf16_emu.h is FLUX's and Wan's, written beside it with another
 * API; one of them should go): the CPU's
 * bf16-weight table with every op's stored output (and every upload)
 * rounded to bf16 to nearest even, as the CUDA kernels round what they
 * store. What a family's GPU bounds are derived on (tests/gpu/sd3_bounds.h;
 * test_flux_bf16_emu.c carries the same wrappers for FLUX).
 * What it is not: a model of cuBLASLt's summation order or of attention's
 * bf16 P; bounds leave room for those. */
#ifndef DITD_TESTS_GPU_BF16_EMU_SD3_H
#define DITD_TESTS_GPU_BF16_EMU_SD3_H

#include <stdint.h>
#include <string.h>

#include "engine/backend/backend.h"

static const ditd_backend_ops *const EMU_W = &ditd_backend_cpu_bf16;

static inline float emu_round_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    memcpy(&f, &u, 4);
    return f;
}

/* rows x cols floats of stride ld rounded to bf16, in place */
static inline void emu_round_rows(void *p, size_t rows, size_t ld, size_t cols)
{
    float *f = p;
    for (size_t r = 0; r < rows; r++)
        for (size_t c = 0; c < cols; c++)
            f[r * ld + c] = emu_round_bf16(f[r * ld + c]);
}

static inline void emu_round_n(void *p, size_t n)
{
    emu_round_rows(p, 1, n, n);
}

static void emu_upload(void *d, const float *h, size_t n)
{
    EMU_W->upload(d, h, n);
    emu_round_n(d, n);
}

static void emu_linear(const void *x, size_t ldx, const void *w, const void *b, void *y,
                       size_t ldy, int M, int N, int K, ditd_act act)
{
    EMU_W->linear(x, ldx, w, b, y, ldy, M, N, K, act);
    emu_round_rows(y, (size_t)M, ldy, (size_t)N);
}

static void emu_act(const void *x, void *y, size_t n, ditd_act act)
{
    EMU_W->act(x, y, n, act);
    emu_round_n(y, n);
}

static void emu_add(void *y, const void *x, size_t n)
{
    EMU_W->add(y, x, n);
    emu_round_n(y, n);
}

static void emu_layernorm_modulate(const void *x, void *y, int B, int N, int D, float eps,
                                   const void *shift, const void *scale, size_t ld_mod)
{
    EMU_W->layernorm_modulate(x, y, B, N, D, eps, shift, scale, ld_mod);
    emu_round_n(y, (size_t)B * N * D);
}

static void emu_gated_residual(void *h, const void *y, int B, int N, int D, const void *gate,
                               size_t ld_gate)
{
    EMU_W->gated_residual(h, y, B, N, D, gate, ld_gate);
    emu_round_n(h, (size_t)B * N * D);
}

static void emu_attention(const void *q, size_t ldq, const void *k, size_t ldk, const void *v,
                          size_t ldv, void *o, size_t ldo, float *lse, int B, int Nq, int Nk,
                          int H, int Dh, float scale)
{
    EMU_W->attention(q, ldq, k, ldk, v, ldv, o, ldo, lse, B, Nq, Nk, H, Dh, scale);
    emu_round_rows(o, (size_t)B * Nq, ldo, (size_t)H * Dh);
}

static void emu_attention_merge(void *o_acc, size_t ldo_acc, float *lse_acc, const void *o_blk,
                                size_t ldo_blk, const float *lse_blk, int B, int Nq, int H,
                                int Dh)
{
    EMU_W->attention_merge(o_acc, ldo_acc, lse_acc, o_blk, ldo_blk, lse_blk, B, Nq, H, Dh);
    emu_round_rows(o_acc, (size_t)B * Nq, ldo_acc, (size_t)H * Dh);
}

static void emu_patch_embed(const void *x, const void *w, const void *b, const void *pos, void *y,
                            void *scratch, int B, int C, int Hi, int Wi, int p, int D)
{
    EMU_W->patch_embed(x, w, b, pos, y, scratch, B, C, Hi, Wi, p, D);
    emu_round_n(y, (size_t)B * (size_t)(Hi / p) * (size_t)(Wi / p) * (size_t)D);
}

static void emu_rmsnorm_heads(void *x, size_t ld, const void *w, int rows, int H, int Dh,
                              float eps)
{
    EMU_W->rmsnorm_heads(x, ld, w, rows, H, Dh, eps);
    emu_round_rows(x, (size_t)rows, ld, (size_t)H * Dh);
}

/* The emulated table: the ops that store a result (unpatchify and copy2d
 * move values already rounded). */
static inline ditd_backend_ops emu_bf16_table(void)
{
    ditd_backend_ops E = ditd_backend_cpu_bf16;
    E.name = "cpu-bf16-storage-emulation";
    E.upload = emu_upload;
    E.linear = emu_linear;
    E.act = emu_act;
    E.add = emu_add;
    E.layernorm_modulate = emu_layernorm_modulate;
    E.gated_residual = emu_gated_residual;
    E.attention = emu_attention;
    E.attention_merge = emu_attention_merge;
    E.patch_embed = emu_patch_embed;
    E.rmsnorm_heads = emu_rmsnorm_heads;
    return E;
}

#endif
