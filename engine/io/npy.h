/* NumPy .npy files: the exchange format of `ditd generate --latents` and
 * `--save-latents`, so a run can start from the noise Diffusers used and its
 * result be compared with numpy.
 *
 * Reads format versions 1.0, 2.0 and 3.0 holding one little-endian, C-order
 * array of a plain numeric dtype (f2, f4, f8, i1, i2, i4, i8, u1, u2, u4, u8,
 * b1), converting to f32 or i64. Writes version 1.0, '<f4', C order, as
 * numpy.save does. The header dict is a Python literal; it is parsed here
 * (not eval'd, not JSON), strictly enough that a malformed one is an error.
 *
 * What it is not: .npz, pickled object arrays, structured dtypes,
 * big-endian or Fortran-order data (all refused with an error naming the
 * file and what is wrong; Fortran order is read when at most one dimension
 * exceeds 1, where it is the same layout as C order). Bytes after the first array are ignored, as
 * numpy.load ignores them.
 *
 * Thread-safe: no shared state (errors go to the per-thread detail).
 */
#ifndef DITD_ENGINE_NPY_H
#define DITD_ENGINE_NPY_H

#include <stddef.h>
#include <stdint.h>

/* numpy's own limit (NPY_MAXDIMS in numpy 1.x). */
#define DITD_NPY_MAX_DIMS 32

/* Reads the array in `path` as f32. `shape` has room for max_ndim entries
 * (0 <= max_ndim); on success *ndim and shape[0..*ndim) hold its shape and
 * *data a malloc'd buffer of numel floats (at least 1 byte even when numel
 * is 0) that the caller frees. Integers convert to the nearest float; f8 is
 * rounded to nearest. Returns DITD_ENOENT / DITD_EIO (OS errors),
 * DITD_EFORMAT (malformed or truncated), DITD_EUNSUPPORTED (a well-formed
 * file ditd does not read: big-endian, Fortran order, other dtypes),
 * DITD_ESHAPE (more than max_ndim dimensions), DITD_ENOMEM. On error the
 * outputs are untouched. */
int ditd_npy_read_f32(const char *path, int max_ndim, int *ndim, int64_t *shape,
                      float **data);

/* As ditd_npy_read_f32, into int64_t. Integer and bool dtypes convert
 * exactly (a u8 value above INT64_MAX is DITD_ERANGE); float values must be
 * integral and in range, else DITD_ERANGE naming the element. */
int ditd_npy_read_i64(const char *path, int max_ndim, int *ndim, int64_t *shape,
                      int64_t **data);

/* The same two over a file image in memory (`buf` borrowed, `name` is what
 * errors call it). For tests and fuzzing. */
int ditd_npy_read_f32_mem(const void *buf, size_t len, const char *name, int max_ndim,
                          int *ndim, int64_t *shape, float **data);
int ditd_npy_read_i64_mem(const void *buf, size_t len, const char *name, int max_ndim,
                          int *ndim, int64_t *shape, int64_t **data);

/* Writes data (numel floats, C order) to `path` as a version 1.0 '<f4'
 * file that numpy.load reads: header padded with spaces to a multiple of 64
 * bytes and ending in '\n'. 0 <= ndim <= DITD_NPY_MAX_DIMS, shape entries
 * >= 0. Replaces an existing file; a failed write removes what it wrote.
 * Returns DITD_EINVAL, DITD_EIO (naming the path and errno's text). */
int ditd_npy_write_f32(const char *path, int ndim, const int64_t *shape, const float *data);

#endif
