/* LoRA adapters, unmerged (docs/lora.md): the file loader, the adapter on a
 * model's device, and the per-row application inside a linear layer.
 *
 * A linear y = x W^T + b with adapters computes
 *     y = x W^T + b + sum_i w_i s_i (x A_i^T) B_i^T
 * for the adapters i its row carries, w_i the request's weight (Diffusers'
 * set_adapters adapter_weights), s_i = alpha_i / rank_i when the file gives
 * alpha, else 1 (PEFT's and Diffusers' scaling). W is never changed: a row
 * without adapters gets exactly the base model's numbers.
 *
 * Files (safetensors, read through engine/io/safetensors.h):
 *   Diffusers / PEFT: [transformer. | base_model.model.]<module>.lora_A.weight
 *     (rank, in) and .lora_B.weight (out, rank), or .lora_down.weight /
 *     .lora_up.weight, each optionally with <module>.alpha;
 *   kohya: lora_unet_<module with '.' written '_'>.lora_down.weight,
 *     .lora_up.weight, .alpha, resolved against the model's module names.
 * <module> is a Diffusers module name of the model ("transformer_blocks.0.
 * attn1.to_q"): the model lists the linears adapters may target
 * (ditd_lora_target). A module the model lacks, a shape that does not fit,
 * a dtype other than F32 / F16 / BF16 / F64, a non-finite value, a tensor of
 * another kind (text encoder, DoRA, conv) or a malformed file is refused
 * naming the tensor.
 *
 *   FLUX's community formats (kohya over BFL names, BFL / ComfyUI, XLabs)
 *   as Diffusers converts them: engine/models/lora_convert.h.
 * What it is not: no merge into base weights, no text-encoder adapters, no
 * cache of adapters.
 *
 * Threads: a ditd_lora and a ditd_lora_dev are immutable once made; a
 * ditd_lora_dev is used by the one thread that runs its model's forward.
 */
#ifndef DITD_ENGINE_LORA_H
#define DITD_ENGINE_LORA_H

#include <stddef.h>

#include "engine/backend/backend.h"

/* Adapters one sample may carry at once. */
#define DITD_LORA_MAX_SET 8
/* Ranks taken (PEFT's r); more is refused as a malformed file. */
#define DITD_LORA_MAX_RANK 1024

typedef enum ditd_lora_format {
    DITD_LORA_FORMAT_PEFT = 0, /* Diffusers / PEFT names (ai-toolkit's too) */
    DITD_LORA_FORMAT_KOHYA,    /* lora_unet_<Diffusers module> */
    /* FLUX's community formats (engine/models/lora_convert.h) */
    DITD_LORA_FORMAT_KOHYA_BFL, /* lora_unet_<BFL module> (sd-scripts) */
    DITD_LORA_FORMAT_BFL,       /* diffusion_model.<BFL module> (ComfyUI) */
    DITD_LORA_FORMAT_XLABS,     /* double_blocks.<i>.processor.qkv_lora1... */
} ditd_lora_format;

const char *ditd_lora_format_name(ditd_lora_format f);
int ditd_lora_format_from_str(const char *s, ditd_lora_format *out);

/* What of a target's weight this rank holds under tensor parallel (the
 * weight list's ditd_wl_rows_of / ditd_wl_cols_of, weight_list.h). */
typedef enum ditd_lora_shard {
    DITD_LORA_WHOLE = 0, /* replicated, or no tp */
    DITD_LORA_OUT_SLICE, /* column-parallel: outputs [off[0], off[0] + len[0]): B's rows */
    DITD_LORA_IN_SLICE,  /* row-parallel: inputs in n_rng ranges, in this order: A's columns */
} ditd_lora_shard;

/* One linear of a model that an adapter may target: its Diffusers module
 * name and its whole weight's (n_out, k_in), the shape a file's A and B
 * fit; under tp the slice this rank computes. A row-parallel slice's
 * partial term (x_s A_s^T) B^T is summed by the linear's own all-reduce,
 * so adapters add no collective. row_groups g > 1: the model keeps output
 * row c g + q at q (n_out / g) + c (FLUX's proj_out, g = 4), and B's rows
 * are re-laid so when the file is read (before any tp slice). */
typedef struct ditd_lora_target {
    char name[120];
    int n_out, k_in;
    ditd_lora_shard shard;
    int n_rng;           /* 1 or 2 (DITD_LORA_IN_SLICE) */
    int off[2], len[2];
    int row_groups;
} ditd_lora_target;

/* Sets t's slice (shard DITD_LORA_OUT_SLICE: n_rng 1). */
void ditd_lora_target_slice(ditd_lora_target *t, ditd_lora_shard shard, int n_rng,
                            const int *off, const int *len);

/* One module of an adapter file, host f32. */
typedef struct ditd_lora_module {
    int target;      /* index into the target list it was opened against */
    int rank;
    int n_out, k_in; /* the target's */
    float scale;     /* alpha / rank, or 1 without alpha */
    float *a;        /* (rank, k_in) lora_A / lora_down */
    float *b;        /* (n_out, rank) lora_B / lora_up */
} ditd_lora_module;

typedef struct ditd_lora {
    char *name;                  /* the adapter's name (--lora NAME=PATH) */
    ditd_lora_format format;
    int n_mod;
    ditd_lora_module *mod;       /* sorted by target */
    int max_rank;
} ditd_lora;

/* Reads the adapter file `path` (a .safetensors file) named `name` (copied)
 * for a model whose linears are targets[0 .. n_targets). *out owned
 * (ditd_lora_free). Errors: DITD_ENOENT / DITD_EIO (the file), DITD_EFORMAT
 * (not an adapter: a tensor name it does not know, a module missing its A
 * or B, a rank out of 1..DITD_LORA_MAX_RANK, non-finite values),
 * DITD_ENOENT naming a module the model lacks, DITD_ESHAPE naming the
 * tensor, its shape and the module's, DITD_EUNSUPPORTED (another dtype; no
 * targets: the model takes no adapters), DITD_ENOMEM; the detail names the
 * file and the tensor. */
int ditd_lora_open(const char *path, const char *name, const ditd_lora_target *targets,
                   int n_targets, ditd_lora **out);
/* The same over a safetensors image in memory (borrowed for the call);
 * `what` names it in errors. For tests and fuzzing. */
int ditd_lora_open_mem(const void *buf, size_t len, const char *what, const char *name,
                       const ditd_lora_target *targets, int n_targets, ditd_lora **out);
void ditd_lora_free(ditd_lora *l);

/* An adapter on a model's device: per target, A and B in the backend's
 * activation type (t[i].rank 0: the adapter leaves target i alone). Made
 * when an adapter is loaded, never in the step loop. */
typedef struct ditd_lora_dev_mod {
    const void *a, *b;
    int rank;
    float scale;
} ditd_lora_dev_mod;

typedef struct ditd_lora_dev {
    const ditd_backend_ops *ops;
    char *name;
    int n_targets;
    ditd_lora_dev_mod *t;        /* (n_targets) */
    int max_rank;
    void *mem;                   /* every A and B, one allocation */
    size_t bytes;
} ditd_lora_dev;

/* Uploads l for a model on ops with targets[0 .. n_targets) (those l was
 * opened against), each module cut to its target's tp slice. *out owned
 * (ditd_lora_dev_free); l may be freed afterwards. DITD_EUNSUPPORTED when
 * ops has no lora op; DITD_ENOMEM / DITD_EDEVICE. */
int ditd_lora_dev_new(const ditd_lora *l, const ditd_backend_ops *ops,
                      const ditd_lora_target *targets, int n_targets, ditd_lora_dev **out);
void ditd_lora_dev_free(ditd_lora_dev *d);

/* What one sample carries: adapters (borrowed) and their weights. */
typedef struct ditd_lora_set {
    int n;
    const ditd_lora_dev *ad[DITD_LORA_MAX_SET];
    float weight[DITD_LORA_MAX_SET];
} ditd_lora_set;

/* Whether any of the B samples' sets (sets NULL: none; a NULL entry: no
 * adapter) touches target t. */
int ditd_lora_touches(const ditd_lora_set *const *sets, int B, int t);

/* The adapters' term on a linear's output, the linear having run WITHOUT
 * its activation act: y (B * rows, N) rows of stride ldy = act(y + sum of
 * the terms of each sample's adapters on target t), x (B * rows, K) rows of
 * stride ldx, sample b's rows [b rows, (b + 1) rows). Consecutive samples
 * with the same set run as one group. tmp: tmp_floats fp32 device floats of
 * scratch, at least DITD_LORA_MAX_RANK (row blocks are cut to fit).
 * Queues ops only (no allocation, no sync). */
void ditd_lora_apply(const ditd_backend_ops *ops, const ditd_lora_set *const *sets, int B,
                     int rows, int t, const void *x, size_t ldx, void *y, size_t ldy, int N,
                     int K, ditd_act act, float *tmp, size_t tmp_floats);

/* The scratch a model plans for ditd_lora_apply: rows_max (its largest M)
 * times a rank of 64, at least DITD_LORA_MAX_RANK floats. */
size_t ditd_lora_tmp_floats(size_t rows_max);

#endif
