/* GGUF reader: the quantized checkpoints of the ggml world, read with mmap.
 *
 * Opens one .gguf file (format version 2 or 3: the same little-endian
 * layout; version 1's 32-bit counts are refused) and validates all of it
 * before anything is handed out: the header, every metadata key and value
 * (all thirteen value types, arrays of them, strings), general.alignment,
 * every tensor info (name, dimensions, type, offset) and the data section,
 * each length, count and offset checked against the file's size with
 * overflow-safe arithmetic. A broken or hostile file gives DITD_EFORMAT
 * naming the file and the key or tensor at fault, never a crash.
 *
 * Tensor types are ggml's (GGML_TYPE_*): the reader knows every type's
 * block size, so a file holding types ditd cannot compute with still opens
 * and lists; reading such a tensor is refused naming the tensor and the
 * type. Types it dequantizes (kernels/cpu/dequant.h): F32, F16, BF16, Q4_0,
 * Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K.
 *
 * Shapes: GGUF stores ggml's ne[] (ne[0] the fastest-varying dimension);
 * ditd_gguf_tensor.shape is PyTorch's order (reversed), so an nn.Linear
 * weight (N, K) has shape {N, K} and ne {K, N}, and each of its N rows is
 * K / block_elems blocks.
 *
 * What it is not: a writer, a model loader (it knows nothing of parameter
 * names; engine/io/weights.h maps them), or a device uploader.
 *
 * Threads: a ditd_gguf is immutable once open; any number of threads may
 * read from it. Files are mapped read-only and private; a file truncated by
 * another process while mapped can still raise SIGBUS, as with any mmap
 * reader.
 */
#ifndef DITD_ENGINE_GGUF_H
#define DITD_ENGINE_GGUF_H

#include <stddef.h>
#include <stdint.h>

/* ggml's tensor types: name, number, block elems, block bytes. The holes
 * (4, 5: the removed Q4_2/Q4_3; 31-33: removed Q4_0_4_4 and kin) are not
 * types any file may use. */
#define DITD_GGUF_TYPE_MAP(X)      \
    X(F32, 0, 1, 4)                \
    X(F16, 1, 1, 2)                \
    X(Q4_0, 2, 32, 18)             \
    X(Q4_1, 3, 32, 20)             \
    X(Q5_0, 6, 32, 22)             \
    X(Q5_1, 7, 32, 24)             \
    X(Q8_0, 8, 32, 34)             \
    X(Q8_1, 9, 32, 36)             \
    X(Q2_K, 10, 256, 84)           \
    X(Q3_K, 11, 256, 110)          \
    X(Q4_K, 12, 256, 144)          \
    X(Q5_K, 13, 256, 176)          \
    X(Q6_K, 14, 256, 210)          \
    X(Q8_K, 15, 256, 292)          \
    X(IQ2_XXS, 16, 256, 66)        \
    X(IQ2_XS, 17, 256, 74)         \
    X(IQ3_XXS, 18, 256, 98)        \
    X(IQ1_S, 19, 256, 50)          \
    X(IQ4_NL, 20, 32, 18)          \
    X(IQ3_S, 21, 256, 110)         \
    X(IQ2_S, 22, 256, 82)          \
    X(IQ4_XS, 23, 256, 136)        \
    X(I8, 24, 1, 1)                \
    X(I16, 25, 1, 2)               \
    X(I32, 26, 1, 4)               \
    X(I64, 27, 1, 8)               \
    X(F64, 28, 1, 8)               \
    X(IQ1_M, 29, 256, 56)          \
    X(BF16, 30, 1, 2)              \
    X(TQ1_0, 34, 256, 54)          \
    X(TQ2_0, 35, 256, 66)          \
    X(MXFP4, 39, 32, 17)           \
    X(NVFP4, 40, 64, 36)           \
    X(Q1_0, 41, 128, 18)

typedef enum ditd_gguf_type {
#define DITD__GGUF_TYPE_ENUM(name, num, elems, bytes) DITD_GGUF_##name = num,
    DITD_GGUF_TYPE_MAP(DITD__GGUF_TYPE_ENUM)
#undef DITD__GGUF_TYPE_ENUM
} ditd_gguf_type;

/* "Q4_K"; "?" for a number that is no type. */
const char *ditd_gguf_type_name(ditd_gguf_type t);
/* Exact, case-sensitive. 0 or DITD_EINVAL. */
int ditd_gguf_type_from_str(const char *s, ditd_gguf_type *out);
/* 1 and the block's values and bytes for a known type; 0 otherwise. */
int ditd_gguf_type_block(ditd_gguf_type t, int *elems, int *bytes);
/* Whether ditd dequantizes the type (the list above). */
int ditd_gguf_type_supported(ditd_gguf_type t);

/* Metadata value types (GGUF_TYPE_*). */
#define DITD_GGUF_VALUE_MAP(X) \
    X(UINT8, 0, 1)             \
    X(INT8, 1, 1)              \
    X(UINT16, 2, 2)            \
    X(INT16, 3, 2)             \
    X(UINT32, 4, 4)            \
    X(INT32, 5, 4)             \
    X(FLOAT32, 6, 4)           \
    X(BOOL, 7, 1)              \
    X(STRING, 8, 0)            \
    X(ARRAY, 9, 0)             \
    X(UINT64, 10, 8)           \
    X(INT64, 11, 8)            \
    X(FLOAT64, 12, 8)

typedef enum ditd_gguf_vtype {
#define DITD__GGUF_VT_ENUM(name, num, size) DITD_GGUF_V_##name = num,
    DITD_GGUF_VALUE_MAP(DITD__GGUF_VT_ENUM)
#undef DITD__GGUF_VT_ENUM
    DITD_GGUF_V_COUNT
} ditd_gguf_vtype;

const char *ditd_gguf_vtype_name(ditd_gguf_vtype t);
int ditd_gguf_vtype_from_str(const char *s, ditd_gguf_vtype *out);

/* One metadata entry. Scalars: `data` points at the value in the mapping
 * (n = 1). Strings: `str` is an owned NUL-terminated copy of `str_len`
 * bytes (which may hold a NUL of their own). Arrays: elem_type, n elements
 * at `data`; an array of strings is read with ditd_gguf_kv_arr_str. */
typedef struct ditd_gguf_kv {
    const char *key;          /* owned by the ditd_gguf */
    ditd_gguf_vtype type;
    ditd_gguf_vtype elem_type; /* ARRAY only */
    uint64_t n;
    const void *data;         /* in the mapping; any alignment */
    const char *str;          /* STRING only */
    size_t str_len;
    const uint64_t *str_offs; /* array of STRING: element j's length at data + str_offs[j] */
} ditd_gguf_kv;

/* ggml's own limit is 4, but the gguf package writes any rank, and the
 * shared Wan / HunyuanVideo GGUFs carry their 5-D patch-embedding conv
 * (ComfyUI-GGUF's fix_5d_tensors adds it back as F32 after quantizing). */
#define DITD_GGUF_MAX_DIMS 5

typedef struct ditd_gguf_tensor {
    const char *name;        /* owned by the ditd_gguf */
    ditd_gguf_type type;
    int ndim;                /* 1 .. DITD_GGUF_MAX_DIMS */
    int64_t ne[DITD_GGUF_MAX_DIMS];    /* ggml order; 1 beyond ndim */
    int64_t shape[DITD_GGUF_MAX_DIMS]; /* PyTorch order: shape[i] = ne[ndim-1-i] */
    const void *data;        /* inside the mapping, aligned to the file's alignment */
    size_t nbytes;           /* blocks * block bytes, checked at open */
    size_t row_bytes;        /* bytes of one row of ne[0] values */
    uint64_t offset;         /* from the start of the data section */
} ditd_gguf_tensor;

typedef struct ditd_gguf ditd_gguf;

/* Opens the .gguf file `path`. On success *out is owned by the caller
 * (ditd_gguf_free). DITD_ENOENT, DITD_EIO, DITD_EFORMAT (the detail names
 * the file and the key or tensor), DITD_ENOMEM. */
int ditd_gguf_open(const char *path, ditd_gguf **out);

/* The same checks over an image in memory; `buf` is borrowed and must
 * outlive *out; `name` is what errors call it. For tests and fuzzing. */
int ditd_gguf_open_mem(const void *buf, size_t len, const char *name, ditd_gguf **out);

/* Unmaps and frees; NULL allowed. Every pointer handed out dies here. */
void ditd_gguf_free(ditd_gguf *g);

/* What it was opened as; borrowed. */
const char *ditd_gguf_path(const ditd_gguf *g);
uint32_t ditd_gguf_version(const ditd_gguf *g);
/* general.alignment, or the default 32. */
size_t ditd_gguf_alignment(const ditd_gguf *g);

/* Metadata in file order; find is O(log n). Borrowed; NULL when absent. */
size_t ditd_gguf_kv_count(const ditd_gguf *g);
const ditd_gguf_kv *ditd_gguf_kv_at(const ditd_gguf *g, size_t i);
const ditd_gguf_kv *ditd_gguf_kv_find(const ditd_gguf *g, const char *key);
/* An integer-typed entry (any width or sign, or BOOL) as int64; 0, or
 * DITD_ENOENT / DITD_EFORMAT (not an integer, or a UINT64 above INT64_MAX). */
int ditd_gguf_kv_int(const ditd_gguf *g, const char *key, int64_t *out);
/* A STRING entry's text; NULL when absent or not a string. Borrowed. */
const char *ditd_gguf_kv_str(const ditd_gguf *g, const char *key);
/* Element i of an array of strings: *s (in the mapping, not terminated)
 * and *len. 0, or DITD_EINVAL (not a string array, i out of range). */
int ditd_gguf_kv_arr_str(const ditd_gguf_kv *kv, uint64_t i, const char **s, size_t *len);

/* Tensors sorted by name (strcmp order); find is O(log n). Borrowed. */
size_t ditd_gguf_count(const ditd_gguf *g);
const ditd_gguf_tensor *ditd_gguf_at(const ditd_gguf *g, size_t i);
const ditd_gguf_tensor *ditd_gguf_find(const ditd_gguf *g, const char *name);

/* Tensor `name` dequantized to f32 into dst (numel floats), its PyTorch
 * shape equal to (shape[0], ..., shape[ndim-1]). DITD_ENOENT, DITD_ESHAPE,
 * DITD_EUNSUPPORTED (a type ditd does not dequantize: the detail names the
 * tensor and the type), DITD_EINVAL. Bit-identical to gguf.quants.dequantize. */
int ditd_gguf_read_f32(const ditd_gguf *g, const char *name, int ndim, const int64_t *shape,
                       float *dst);

/* As ditd_gguf_read_f32, but only indices [start, start + len) along `axis`
 * (PyTorch order), contiguous in dst; as ditd_safetensors_read_f32_slice.
 * Along the last axis (within a row of blocks) any range works: the row is
 * dequantized whole, then cut. */
int ditd_gguf_read_f32_slice(const ditd_gguf *g, const char *name, int ndim,
                             const int64_t *full_shape, int axis, int64_t start, int64_t len,
                             float *dst);

#endif
