/* CPU kernels of step caching (engine/pipeline/step_cache.c): the per-row
 * statistics a cache compares, and the one elementwise update its
 * residuals and Taylor factors need.
 *
 * What this is: pure functions over caller-owned float buffers, OpenMP on
 * the outer loop. What it is not: no allocation, no communication, no
 * model knowledge, no decision (the caller sums the rows and compares).
 */
#ifndef DITD_KERNELS_CPU_STEP_CACHE_H
#define DITD_KERNELS_CPU_STEP_CACHE_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* For each of `rows` rows of D floats (a (rows, D) row-major block of a and
 * of b): out[4r + 0] = sum |a - b|, out[4r + 1] = sum |b|, out[4r + 2] =
 * sum a^2, out[4r + 3] = sum b^2, each summed in float64 in column order.
 * b may be NULL: then only out[4r + 2] is meaningful (the others are 0).
 * A row's sums do not depend on how many rows a call has, so splitting the
 * rows over ranks gives the same numbers per row. */
void ditd_cpu_row_diff_stats(const float *a, const float *b, int rows, int D, double *out);

/* y = a * x + b * y over n floats (x may be NULL: y = b * y). With
 * round_bf16 the result is rounded to bfloat16 (nearest-even) and kept in
 * float, as torch's .to(torch.bfloat16) followed by .to(torch.float32). */
void ditd_cpu_axpby(float *y, const float *x, float a, float b, size_t n, int round_bf16);

#ifdef __cplusplus
}
#endif

#endif
