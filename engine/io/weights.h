/* A model component's weights, whatever file holds them: the seam between
 * the family loaders and the readers.
 *
 * Opens safetensors (engine/io/safetensors.h: a file, an index, a folder)
 * or GGUF (engine/io/gguf.h: a .gguf file, or a folder that holds exactly
 * one .gguf and no safetensors checkpoint), and reads any tensor as f32 by
 * the name the family asks for: GGUF block types are dequantized exactly as
 * ggml does. A family whose checkpoints come in another naming (FLUX.1's
 * original BFL names, as the widely shared GGUF conversions keep them)
 * registers aliases: a Diffusers name made of row ranges of the file's
 * tensors (a fused qkv cut into to_q / to_k / to_v, the final layer's
 * [shift; scale] swapped into [scale; shift]), the way Diffusers'
 * single-file conversion maps them.
 *
 * A family that keeps weights quantized in memory asks ditd_weights_quant
 * for a tensor's storage and copies its block rows (ditd_weights_rows).
 *
 * What it is not: a name mapper that guesses (aliases are what the family
 * registers, nothing else), a writer, or an uploader. Immutable once the
 * aliases are in: any number of threads may read.
 */
#ifndef DITD_ENGINE_WEIGHTS_H
#define DITD_ENGINE_WEIGHTS_H

#include <stddef.h>
#include <stdint.h>

#include "engine/io/gguf.h"
#include "engine/io/safetensors.h"

typedef struct ditd_weights ditd_weights;

/* Opens `path`: a .gguf file; a folder holding a safetensors checkpoint
 * (ditd_safetensors_open's names, chosen first) or else exactly one *.gguf;
 * anything else as ditd_safetensors_open does. *out owned (ditd_weights_free).
 * Errors as the readers'; a folder with two .gguf files is DITD_EFORMAT
 * naming both. */
int ditd_weights_open(const char *path, ditd_weights **out);
void ditd_weights_free(ditd_weights *w);

/* "safetensors" or "gguf". The file (or folder) opened, borrowed. */
const char *ditd_weights_format(const ditd_weights *w);
const char *ditd_weights_path(const ditd_weights *w);
/* The reader underneath (NULL for the other format); borrowed. */
const ditd_gguf *ditd_weights_gguf(const ditd_weights *w);
const ditd_safetensors *ditd_weights_st(const ditd_weights *w);

/* Whether the file holds `name` itself (not an alias). */
int ditd_weights_has_raw(const ditd_weights *w, const char *name);
/* Whether `name` can be read: the file's own, or an alias. */
int ditd_weights_has(const ditd_weights *w, const char *name);

/* One piece of an alias: rows [r0, r0 + rows) of the file's tensor `src`
 * (r0 = 0, rows = -1: all of it). */
typedef struct ditd_weight_seg {
    const char *src;
    int64_t r0, rows;
} ditd_weight_seg;

/* Registers `name` as the concatenation by rows (axis 0) of 1 to 4
 * segments (copied). Every segment's tensor must exist, its rows fit and
 * its other dimensions agree: DITD_EFORMAT naming the alias and the
 * segment. DITD_ENOMEM. */
int ditd_weights_alias(ditd_weights *w, const char *name, int nseg, const ditd_weight_seg *segs);

/* As ditd_safetensors_read_f32 / _read_f32_slice, for the file's own
 * tensors and aliases alike (the same errors: ENOENT, ESHAPE, EUNSUPPORTED
 * naming the tensor and its type, ERANGE). */
int ditd_weights_read_f32(const ditd_weights *w, const char *name, int ndim, const int64_t *shape,
                          float *dst);
int ditd_weights_read_f32_slice(const ditd_weights *w, const char *name, int ndim,
                                const int64_t *full_shape, int axis, int64_t start, int64_t len,
                                float *dst);

/* Whether ditd_weights_read_f32(name, ndim, shape) would read: 0, or its
 * error without reading (DITD_ENOENT, DITD_ESHAPE naming the tensor and
 * both shapes, DITD_EUNSUPPORTED naming the tensor and a GGML type ditd
 * does not dequantize). A loader's plan pass asks it. */
int ditd_weights_check(const ditd_weights *w, const char *name, int ndim, const int64_t *shape);

/* A 2-D tensor (N, K) (own or alias) that ditd computes with as the file
 * stores it: GGML blocks in a GGUF file, or the 8-bit floats of an FP8
 * safetensors checkpoint (F8_E4M3 / F8_E5M2: *type DITD_Q_F8_E4M3 /
 * DITD_Q_F8_E5M2 of kernels/cpu/dequant.h, one byte a value, with its rows'
 * scales from ditd_weights_row_scales): 1 with *type and *row_bytes when
 * every segment is one such type (F32, F16 and BF16 tensors are not
 * "quantized": they answer 0, and load as floats). 0 otherwise, when the
 * shape differs, and always when the environment has
 * DITD_WEIGHTS_DEQUANTIZE=1 (read at open: every weight dequantized at
 * load, to compare or where memory is plentiful). */
int ditd_weights_quant(const ditd_weights *w, const char *name, int64_t N, int64_t K, int *type,
                       size_t *row_bytes);
/* Copies the stored rows [r0, r0 + rows) of such a tensor into dst
 * (rows * row_bytes bytes). 0, DITD_ERANGE, DITD_EINVAL (not quantized). */
int ditd_weights_rows(const ditd_weights *w, const char *name, int64_t r0, int64_t rows,
                      void *dst);
/* The scales of rows [r0, r0 + rows) of such a tensor into dst: an FP8
 * tensor's (engine/io/safetensors.h: one per tensor repeated, or one per
 * row; 1 where the file has none), 1 for GGML blocks (their scales are in
 * the blocks). Errors as ditd_weights_rows, and the scale's (EFORMAT,
 * EUNSUPPORTED for block-wise scales). */
int ditd_weights_row_scales(const ditd_weights *w, const char *name, int64_t r0, int64_t rows,
                            float *dst);
/* A stored type's block (values, bytes) and name ("Q4_K", "F8_E4M3"), for
 * loaders' plans and messages. */
int ditd_weights_type_block(int type, int *elems, int *bytes);
const char *ditd_weights_type_name(int type);
/* 1 for the FP8 types (whose rows carry scales), else 0. */
int ditd_weights_fp8_type(int type);

/* One line for logs and `ditd bench`: the format, the bytes and how many
 * tensors of each storage type, most first ("gguf, 12.1 GB in 780 tensors:
 * Q8_0 456, F32 324"), into buf (NUL-terminated, cut to len). */
void ditd_weights_summary(const ditd_weights *w, char *buf, size_t len);

#endif
