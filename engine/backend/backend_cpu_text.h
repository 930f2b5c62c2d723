/* The CPU backend's text-encoder ops (kernels/cpu/text_kernels.c
 * underneath), entries of ditd_backend_cpu. Cross-file internals of the CPU
 * backend; model code reaches them through the ops table only. */
#ifndef DITD_ENGINE_BACKEND_CPU_TEXT_H
#define DITD_ENGINE_BACKEND_CPU_TEXT_H

#include "engine/backend/backend.h"

void ditd__cpu_linear_wt(const void *x, size_t ldx, const void *w, ditd_dtype wdt, const void *b,
                         void *y, size_t ldy, int M, int N, int K, ditd_text_act act,
                         void *scratch, size_t scratch_elems);
void ditd__cpu_mul(void *y, const void *x, size_t n);
void ditd__cpu_embedding_wt(const void *table, ditd_dtype wdt, const int64_t *h_ids, void *out,
                            int n, int D);
void ditd__cpu_layernorm_affine(const void *x, void *y, int rows, int D, float eps, const void *g,
                                const void *b);
void ditd__cpu_rmsnorm(const void *x, void *y, int rows, int D, float eps, const void *w);
void ditd__cpu_attention_masked(const void *q, size_t ldq, const void *k, size_t ldk,
                                const void *v, size_t ldv, void *o, size_t ldo, int B, int N,
                                int H, int Dh, float scale, const void *rel, const uint8_t *keep,
                                int causal, void *scratch);

void ditd__cpu_act_text(void *y, size_t ldy, int rows, int cols, ditd_text_act act);

#endif
