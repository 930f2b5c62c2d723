/* What numpy and torch compute, operation by operation, for the schedules
 * of engine/pipeline/sampler.c and sampler_unipc.c (internal to them; see
 * sampler.c's header on why every dtype choice is mirrored), and the
 * training schedule both build.
 */
#ifndef DITD_ENGINE_PIPELINE_SCHED_MATH_H
#define DITD_ENGINE_PIPELINE_SCHED_MATH_H

#include <math.h>

#include "engine/pipeline/sched_config.h"

/* torch.linspace(start, end, steps, dtype=float32) on CPU (ATen
 * linspace_kernel): float step, the first half counted from start and the
 * second from end, each a*b+c contracted to one fma by the compiler. */
static inline void torch_linspace_f32(float start, float end, int steps, float *out)
{
    if (steps == 1) {
        out[0] = start;
        return;
    }
    const float step = (end - start) / (float)(steps - 1);
    const int halfway = steps / 2;
    for (int i = 0; i < steps; i++)
        out[i] = i < halfway ? fmaf(step, (float)i, start)
                             : fmaf(-step, (float)(steps - i - 1), end);
}

/* numpy.linspace(start, stop, num) in float64: i * step + start, the last
 * value set to stop exactly. */
static inline void np_linspace(double start, double stop, int num, double *out)
{
    const int div = num - 1;
    const double delta = stop - start;
    if (div > 0) {
        const double step = delta / div;
        for (int i = 0; i < num; i++)
            out[i] = (step == 0 ? ((double)i / div) * delta : (double)i * step) + start;
        out[num - 1] = stop;
    } else if (num == 1) {
        out[0] = 0.0 * delta + start;
    }
}

/* The length of numpy.arange(start, stop, step) for float arguments. */
static inline long np_arange_len(double start, double stop, double step)
{
    double l = ceil((stop - start) / step);
    return l > 0 ? (long)l : 0;
}

/* numpy.arange(start, stop, step) values for float arguments: the second
 * value is start + step, the rest start + i * (second - start) (numpy's
 * DOUBLE_fill). */
static inline void np_arange(double start, double step, long len, double *out)
{
    if (len < 1)
        return;
    out[0] = start;
    if (len < 2)
        return;
    out[1] = start + step;
    const double delta = out[1] - start;
    for (long i = 2; i < len; i++)
        out[i] = start + (double)i * delta;
}

/* numpy.round: half to even (the default rounding mode). */
static inline double np_round(double x) { return nearbyint(x); }

/* betas -> alphas_cumprod (float32), as DDIMScheduler / DPMSolverMultistep /
 * UniPCMultistep __init__: betas and ac have num_train_timesteps entries. */
void ditd__sched_alphas_cumprod(const ditd_sched_config *c, float *betas, float *ac);

/* DPM-Solver's and UniPC's _sigma_to_alpha_sigma_t for a VP sigma:
 * alpha_t = 1 / ((sigma**2 + 1) ** 0.5); sigma_t = sigma * alpha_t (float32) */
static inline void dpm_alpha_sigma(float sigma, float *alpha, float *sig)
{
    *alpha = 1.0f / sqrtf(sigma * sigma + 1.0f);
    *sig = sigma * *alpha;
}

/* lambda_t = log(alpha_t) - log(sigma_t), float32 */
static inline float dpm_lambda(float alpha, float sig) { return logf(alpha) - logf(sig); }

#endif
