/* safetensors reader: the weights of a Diffusers model, read with mmap.
 *
 * Opens one .safetensors file, a sharded checkpoint through its
 * `*.safetensors.index.json`, or a model folder that holds one of those under
 * the Diffusers or transformers name. Every header is validated before any
 * tensor is handed out (lengths, JSON, dtypes, shapes, offsets, overlaps,
 * duplicate names, the index's weight map), so a broken or hostile file gives
 * an error naming the file and the tensor, never a crash.
 *
 * What it is not: a writer, a model loader (it knows nothing of parameter
 * names or configs), or a device uploader. It converts to f32 on the host;
 * the caller decides where the numbers go.
 *
 * Threads: a ditd_safetensors is immutable once open; any number of threads
 * may find and read from it at the same time. Files are mapped read-only and
 * private; a file truncated by another process while mapped can still raise
 * SIGBUS on access, as with any mmap reader.
 *
 * Byte order: safetensors is little-endian; ditd builds only for
 * little-endian hosts.
 */
#ifndef DITD_ENGINE_SAFETENSORS_H
#define DITD_ENGINE_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

/* The dtype strings of the safetensors format. Sub-byte types (F4, F6_*)
 * are understood for validation (their tensors must cover whole bytes) but
 * cannot be read as f32. */
#define DITD_ST_DTYPE_MAP(X)      \
    X(BOOL,    "BOOL",    8)      \
    X(U8,      "U8",      8)      \
    X(I8,      "I8",      8)      \
    X(F8_E5M2, "F8_E5M2", 8)      \
    X(F8_E4M3, "F8_E4M3", 8)      \
    X(F8_E8M0, "F8_E8M0", 8)      \
    X(F4,      "F4",      4)      \
    X(F6_E2M3, "F6_E2M3", 6)      \
    X(F6_E3M2, "F6_E3M2", 6)      \
    X(I16,     "I16",     16)     \
    X(U16,     "U16",     16)     \
    X(F16,     "F16",     16)     \
    X(BF16,    "BF16",    16)     \
    X(I32,     "I32",     32)     \
    X(U32,     "U32",     32)     \
    X(F32,     "F32",     32)     \
    X(C64,     "C64",     64)     \
    X(F64,     "F64",     64)     \
    X(I64,     "I64",     64)     \
    X(U64,     "U64",     64)

typedef enum ditd_st_dtype {
#define DITD__ST_DTYPE_ENUM(name, str, bits) DITD_ST_##name,
    DITD_ST_DTYPE_MAP(DITD__ST_DTYPE_ENUM)
#undef DITD__ST_DTYPE_ENUM
    DITD_ST_DTYPE_COUNT
} ditd_st_dtype;

/* The format's spelling ("BF16"); "?" for a value outside the enum. */
const char *ditd_st_dtype_name(ditd_st_dtype t);
/* Exact, case-sensitive match of the format's spelling. 0 or DITD_EINVAL. */
int ditd_st_dtype_from_str(const char *s, ditd_st_dtype *out);
/* Bits per element (4, 6, 8, 16, 32 or 64); 0 outside the enum. */
int ditd_st_dtype_bits(ditd_st_dtype t);

#define DITD_ST_MAX_DIMS 8

typedef struct ditd_st_tensor {
    const char *name;        /* owned by the ditd_safetensors */
    ditd_st_dtype dtype;
    int ndim;                /* 0 (a scalar) .. DITD_ST_MAX_DIMS */
    int64_t shape[DITD_ST_MAX_DIMS];
    const void *data;        /* inside the mapping; any alignment */
    size_t nbytes;           /* == numel * bits / 8, checked at open */
    const char *file;        /* the file it came from, as opened */
} ditd_st_tensor;

typedef struct ditd_safetensors ditd_safetensors;

/* Opens `path`: a .safetensors file; a `*.json` index whose "weight_map"
 * names each tensor's shard (relative to the index's folder, no "..", each
 * shard opened once); or a folder, where the first that exists of
 *   diffusion_pytorch_model.safetensors.index.json,
 *   diffusion_pytorch_model.safetensors,
 *   model.safetensors.index.json, model.safetensors
 * is opened (an index before a single file, the Diffusers name before the
 * transformers one, as Diffusers chooses).
 * On success *out is owned by the caller (ditd_safetensors_free). Returns
 * DITD_ENOENT (no such file, no weights in the folder), DITD_EIO (other OS
 * errors), DITD_EFORMAT (anything wrong in a file), DITD_ENOMEM; the detail
 * names the file and, where one is at fault, the tensor. */
int ditd_safetensors_open(const char *path, ditd_safetensors **out);

/* Same checks over one safetensors image already in memory. `buf` is
 * borrowed and must outlive *out; `name` (copied) is what errors and
 * ditd_st_tensor.file call it. For tests, fuzzing, embedded weights. */
int ditd_safetensors_open_mem(const void *buf, size_t len, const char *name,
                              ditd_safetensors **out);

/* Unmaps and frees; NULL is allowed. Every pointer handed out dies here. */
void ditd_safetensors_free(ditd_safetensors *st);

/* The value of key in the (first) file's "__metadata__" object, borrowed
 * until ditd_safetensors_free; NULL when it has none. */
const char *ditd_safetensors_meta(const ditd_safetensors *st, const char *key);

/* Tensors of all shards together, sorted by name (strcmp order). */
size_t ditd_safetensors_count(const ditd_safetensors *st);
/* Borrowed; i < count. */
const ditd_st_tensor *ditd_safetensors_at(const ditd_safetensors *st, size_t i);
/* Borrowed; NULL when absent. O(log n). */
const ditd_st_tensor *ditd_safetensors_find(const ditd_safetensors *st, const char *name);

/* Reads tensor `name` as f32 into dst (numel floats, caller-owned).
 * Its shape must equal (shape[0], ..., shape[ndim-1]). F32, F16, BF16, F64 and
 * the FP8 types are converted (f16/bf16/fp8 exactly, with subnormals, inf and
 * nan; f64 rounded to nearest; FP8 then times its scale, below). Returns DITD_ENOENT (no such tensor), DITD_ESHAPE,
 * DITD_EUNSUPPORTED (another dtype), DITD_EINVAL (bad arguments). */
int ditd_safetensors_read_f32(const ditd_safetensors *st, const char *name, int ndim,
                              const int64_t *shape, float *dst);

/* As ditd_safetensors_read_f32, checked against the full shape, but copies
 * only indices [start, start+len) along `axis` (any axis < ndim) into dst,
 * contiguous, of shape full_shape with full_shape[axis] replaced by len.
 * This is how a tensor-parallel rank reads its shard of a weight: a
 * column-parallel Linear splits its (out, in) weight and its bias along
 * axis 0, a row-parallel one its weight along axis 1. DITD_EINVAL for an
 * axis >= ndim, DITD_ERANGE when the slice does not fit. */
int ditd_safetensors_read_f32_slice(const ditd_safetensors *st, const char *name, int ndim,
                                    const int64_t *full_shape, int axis, int64_t start,
                                    int64_t len, float *dst);

/* FP8 (F8_E4M3, torch's float8_e4m3fn, and F8_E5M2) tensors read as f32
 * times their scale when the file has one: `P.scale_weight` (ComfyUI's
 * scaled checkpoints: one value) or `P.weight_scale` (compressed-tensors,
 * ModelOpt: one value, or one per row, (N) or (N, 1)) beside `P.weight`;
 * one f32 multiply, as `w.float() * scale`. A block-wise scale
 * (`P.weight_scale_inv`) is refused naming the tensor (DITD_EUNSUPPORTED), a
 * scale of another shape or a non-finite one is DITD_EFORMAT.
 * ditd_safetensors_row_scales writes the scales of rows [r0, r0 + rows) of
 * such a tensor (1 where the file has none) into dst, for a reader that
 * keeps the FP8 bytes (engine/io/weights.h); DITD_EINVAL for a tensor that
 * is not FP8, DITD_ERANGE for rows outside it. */
int ditd_safetensors_row_scales(const ditd_safetensors *st, const char *name, int64_t r0,
                                int64_t rows, float *dst);

/* Exact conversions (no rounding is ever needed), exposed for other readers
 * and the CUDA backend's host side. NaN payloads are kept. */
float ditd_st_f16_to_f32(uint16_t h);
float ditd_st_bf16_to_f32(uint16_t b);

#endif
