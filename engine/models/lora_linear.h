/* A family's LoRA targets and its linear layers with adapters on them
 * (engine/models/lora.h, docs/lora.md), shared by the SD3 and Wan models:
 * the target list written at load in Diffusers' module names, and the
 * wrapper every linear of the forward goes through.
 *
 * A fused linear (to_q|to_k|to_v kept as one GEMM) is `parts` consecutive
 * targets, part i's adapter adding its term to the i-th block of N / parts
 * output columns, as FLUX does (engine/models/flux/flux_forward.c).
 *
 * Under tensor parallel each target carries this rank's slice (the
 * family's tp plan), a column-parallel linear's N and a row-parallel one's
 * K being the local ones: the adapter is cut to fit at upload
 * (ditd_lora_dev_new) and a row-parallel term is summed by the linear's own
 * all-reduce.
 *
 * What it is not: the loader or the op (lora.{h,c}, the backend's lora).
 */
#ifndef DITD_ENGINE_LORA_LINEAR_H
#define DITD_ENGINE_LORA_LINEAR_H

#include <stddef.h>

#include "engine/backend/backend.h"
#include "engine/models/lora.h"

/* A linear's place in its model's target list: 1 + its first target (0:
 * none), and how many consecutive targets share its output columns. */
typedef struct ditd_lora_slot {
    int first1, parts;
} ditd_lora_slot;

/* A model's target list while it is written (capacity cap; tp: whether
 * the model runs under tensor parallel, so cuts apply). */
typedef struct ditd_lora_list {
    ditd_lora_target *t;
    int n, cap;
    int tp;
} ditd_lora_list;

/* This rank's tp slice of a linear's targets (ditd_lora_target_slice),
 * as the model's weight list cuts the weight: DITD_LORA_WHOLE for a
 * replicated one; a fused linear's parts each take the same slice of
 * their own block. */
typedef struct ditd_lora_cut {
    ditd_lora_shard shard;
    int n_rng, off[2], len[2];
} ditd_lora_cut;

/* Appends the targets of one linear of n_out outputs and k_in inputs (the
 * whole weight's) named printf(fmt, ...) (parts > 1: "<name>.<part[i]>"
 * each n_out / parts outputs), cut as `cut` says under tp, and points
 * *slot at them. Past the capacity nothing is added and l->n still counts,
 * so a list sized too small shows as n > cap. */
void ditd_lora_list_add(ditd_lora_list *l, ditd_lora_slot *slot, ditd_lora_cut cut, int n_out,
                        int k_in, int parts, const char *const *part, const char *fmt, ...)
    __attribute__((format(printf, 8, 9)));

/* y = act(x W^T + b) for M rows that are B samples of M / B rows each
 * (W dense at w, or kept in GGML blocks when q && q->data: ops->linear_q), with
 * the adapters of sets (B entries; NULL: none) on slot's targets (N and K
 * this rank's, under tp): the linear
 * runs without act where a row adapts, the terms follow, then act (PEFT
 * wraps the Linear, not its activation). tmp: the model's planned scratch
 * (ditd_lora_tmp_floats). Queues ops only. */
void ditd_lora_linear(const ditd_backend_ops *ops, const ditd_lora_set *const *sets, int B,
                      ditd_lora_slot slot, const void *x, size_t ldx, const void *w,
                      const ditd_qweight *q, const void *b, void *y, size_t ldy, int M, int N,
                      int K, ditd_act act, float *tmp, size_t tmp_floats);

#endif
