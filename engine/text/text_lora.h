/* LoRA adapters on the text encoders (CLIP, T5), unmerged (docs/lora.md,
 * "Text encoders"): the text-encoder part of an adapter file, read and
 * uploaded per encoder, and the adapted linear an encoder's forward calls.
 *
 * One adapter file may carry a transformer part and text-encoder parts; the
 * transformer part is ditd_lora_open_transformer's (engine/models/lora.h),
 * the rest is read here, by prefix:
 *   Diffusers / PEFT: <component>.<module>.lora_A.weight / .lora_B.weight
 *     (or .lora_down / .lora_up), optional <component>.<module>.alpha, where
 *     <component> is the pipeline folder's ("text_encoder", "text_encoder_2",
 *     ...) and <module> the encoder's module name as transformers names it
 *     (a CLIP's with or without "text_model.", as Diffusers strips it for
 *     transformers 5's flattened CLIPTextModel);
 *   kohya: lora_te1_<module with '_'> / lora_te_ (the first CLIP),
 *     lora_te2_ (a second CLIP, SD3), with .lora_down / .lora_up / .alpha.
 * A tensor for a component the model lacks, a module its encoder lacks, a
 * shape that does not fit, or a kohya name for a T5 (Diffusers' FLUX loader
 * drops those keys; ditd refuses rather than ignore part of a file) is
 * refused naming the tensor.
 *
 * y = act(x W^T + b + sum_i w_i s_i (x A_i^T) B_i^T) per sequence of a
 * batch, each sequence with its own set (ditd_lora_set over the encoder's
 * ditd_lora_dev): W is never changed; a linear no sequence adapts runs
 * exactly the base op (its activation fused).
 *
 * What it is not: the encoders (engine/text/clip_text.h, t5_encoder.h own
 * their target lists), the prompt recipe (engine/pipeline/prompt_encoder.h
 * builds each prompt's sets), UMT5 / Wan (no targets), or thread-safe
 * beyond immutability: a ditd_text_lora is read-only once made.
 */
#ifndef DITD_ENGINE_TEXT_LORA_H
#define DITD_ENGINE_TEXT_LORA_H

#include <stddef.h>
#include <stdint.h>

#include "engine/backend/backend.h"
#include "engine/models/lora.h"
#include "engine/text/text_weights.h"

/* Text encoders one pipeline has at most (SD3: three). */
#define DITD_TEXT_LORA_MAX_PARTS 3

/* One text encoder a file's tensors may name. */
typedef struct ditd_text_lora_part {
    const char *component;           /* "text_encoder", ...: PEFT names' prefix */
    const char *kind;                /* "CLIP", "T5": for messages */
    const char *kohya[2];            /* kohya prefixes ("lora_te1_", "lora_te_"), NULL: none */
    const char *optional_prefix;     /* a module prefix a name may carry or not ("text_model.") */
    const ditd_lora_target *targets; /* the encoder's linears (names without optional_prefix) */
    int n_targets;
    const ditd_backend_ops *ops;     /* the encoder's backend (needs ops->lora) */
    const char *refusal;             /* non-NULL: a tensor naming this part is refused so */
} ditd_text_lora_part;

typedef struct ditd_text_lora {
    char *name;
    uint64_t id;                     /* unique in the process: what a cache key names */
    ditd_lora_format format;
    int n_parts;                     /* as the parts opened against */
    ditd_lora_dev *dev[DITD_TEXT_LORA_MAX_PARTS]; /* NULL: the file leaves part p alone */
    int n_mod[DITD_TEXT_LORA_MAX_PARTS];
    int max_rank;
    size_t bytes;
} ditd_text_lora;

/* Reads the text-encoder tensors (ditd_lora_is_text_encoder_tensor) of the
 * adapter file `path` for the encoders parts[0 .. n_parts), uploads them,
 * and ignores the rest of the file (the transformer's part). A file with
 * none gives an adapter with every dev NULL. *out owned
 * (ditd_text_lora_free). Errors as ditd_lora_open's, naming the file and
 * the tensor. */
int ditd_text_lora_open(const char *path, const char *name, const ditd_text_lora_part *parts,
                        int n_parts, ditd_text_lora **out);
/* The same over a safetensors image in memory (borrowed for the call). */
int ditd_text_lora_open_mem(const void *buf, size_t len, const char *what, const char *name,
                            const ditd_text_lora_part *parts, int n_parts,
                            ditd_text_lora **out);
void ditd_text_lora_free(ditd_text_lora *t);

/* Whether the adapter has any module on any encoder. */
int ditd_text_lora_any(const ditd_text_lora *t);

/* What one prompt carries: text adapters (borrowed) and their weights
 * (Diffusers' set_adapters adapter_weights). */
typedef struct ditd_text_lora_set {
    int n;
    const ditd_text_lora *ad[DITD_LORA_MAX_SET];
    float weight[DITD_LORA_MAX_SET];
} ditd_text_lora_set;

/* Part p's ditd_lora_set of s (the adapters with a module on p and a
 * non-zero weight, in s's order) into *out; 0 when none. */
int ditd_text_lora_set_part(const ditd_text_lora_set *s, int p, ditd_lora_set *out);

/* One encoder's forward: B sequences of `rows` rows (tokens; 1 for a
 * pooled projection), sets[b] the set of sequence b (sets NULL, or an
 * entry NULL: none); tmp the encoder's planned scratch
 * (ditd_lora_tmp_floats of its rows). */
typedef struct ditd_text_lora_run {
    const ditd_lora_set *const *sets;
    int B, rows;
    float *tmp;
    size_t tmp_floats;
} ditd_text_lora_run;

/* The linear y (B rows, N) = act(x (B rows, K) @ w^T + b) of target t plus
 * each sequence's adapters on t; where none touches t, exactly ditd_text_linear
 * (engine/text/text_weights.h: a GGUF T5's quantized linears too).
 * Queues ops only; no allocation. */
void ditd_text_lora_linear(const ditd_backend_ops *ops, const ditd_text_lora_run *r, int t,
                           const void *x, size_t ldx, const ditd_text_mat *w, const void *bias,
                           void *y, size_t ldy, int N, int K, ditd_text_act act, void *scratch,
                           size_t scratch_elems);

#endif
