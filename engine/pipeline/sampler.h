/* Samplers: DDIM, DPM-Solver++ 2M, flow-matching Euler and UniPC, each
 * matching its Diffusers scheduler class (DDIMScheduler,
 * DPMSolverMultistepScheduler, FlowMatchEulerDiscreteScheduler,
 * UniPCMultistepScheduler, diffusers 0.42) numerically for the config keys
 * DiT-style and Wan checkpoints use, float32 as Diffusers computes it.
 *
 * Two nouns live here (sched_config.c, sampler.c; UniPC's plan and step in
 * sampler_unipc.c). A ditd_sched_config is
 * scheduler_config.json parsed once into a typed struct (JSON stops at this
 * edge). A ditd_sampler is
 * built from a config for one (num_steps, max slots, sample size): it
 * precomputes the timesteps and every per-step coefficient, and owns the
 * multistep state of each sample slot, so the step allocates nothing.
 *
 * What it is not: the denoising loop (engine/pipeline/pipeline.h calls the model,
 * applies guidance and drops the learned sigma), or the noise generator
 * (engine/core/philox.h). Every sampler here starts from unscaled N(0, 1) noise
 * (init_noise_sigma = 1) and takes the model input unscaled
 * (scale_model_input is the identity for all three).
 *
 * Flow matching with use_dynamic_shifting runs as Diffusers' FluxPipeline
 * calls the scheduler: mu = calculate_shift(image_seq_len, ...) from the
 * config's base/max shift and sequence lengths, and set_timesteps(num_steps,
 * sigmas = np.linspace(1, 1/num_steps, num_steps), mu); the caller puts the
 * image token count in ditd_sched_config.image_seq_len.
 *
 * UniPC runs Wan's configs (prediction_type flow_prediction, use_flow_sigmas,
 * flow_shift, bh2 or bh1, order 1 or 2, predict_x0, lower_order_final,
 * disable_corrector, final_sigmas_type, shift_terminal) and the epsilon /
 * v_prediction / sample ones (predict_x0 true or false), as WanPipeline
 * calls it: set_timesteps(num_steps), the integer timesteps to the model.
 *
 * Stochastic variants (DDIM eta > 0, SDE DPM-Solver, stochastic flow
 * sampling), dynamic thresholding, trained_betas, DPM-Solver's dynamic
 * shifting and flow sigmas, UniPC's solver_p, order 3, Karras / exponential
 * / beta sigmas and dynamic shifting are refused with DITD_EUNSUPPORTED
 * naming the key and the value.
 */
#ifndef DITD_ENGINE_SAMPLER_H
#define DITD_ENGINE_SAMPLER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* the scheduler config and its enums (scheduler_config.json, typed) */
#include "engine/pipeline/sched_config.h"

/* ---- the sampler ---- */

typedef struct ditd_sampler ditd_sampler;

/* Builds a sampler for `cfg` (copied) and num_steps inference steps, with
 * state for max_slots samples of numel floats each: Diffusers'
 * set_timesteps(num_steps), done once. 1 <= num_steps <= num_train_timesteps
 * (flow, UniPC with use_flow_sigmas: <= 100000), else DITD_ERANGE. Schedules on which Diffusers itself
 * goes wrong are DITD_EUNSUPPORTED, naming the step count: a timestep
 * outside 0..num_train_timesteps-1 (trailing spacing on counts such as 61
 * of 1000, where numpy's arange yields one extra step at t = -1; leading
 * spacing plus steps_offset past the end), or a repeated first timestep
 * (DPM-Solver then starts at the wrong index and runs off its sigmas;
 * e.g. use_karras_sigmas with squaredcos_cap_v2), or flow sigmas that are
 * not finite (shift_terminal with 1 step, where Diffusers divides 0 by 0),
 * or a UniPC step whose coefficients are not finite (final_sigmas_type
 * "zero" with bh1, predict_x0 false or lower_order_final false: Diffusers'
 * last step gives NaN).
 * Flow with use_dynamic_shifting and cfg->image_seq_len < 1 is DITD_EINVAL.
 * Returns 0 and an owned *out, or DITD_EINVAL / DITD_EUNSUPPORTED /
 * DITD_ERANGE / DITD_ENOMEM. */
int ditd_sampler_new(const ditd_sched_config *cfg, int num_steps, int max_slots, size_t numel,
                     ditd_sampler **out);
void ditd_sampler_free(ditd_sampler *s);

/* The number of steps to run: num_steps, except where Diffusers' own
 * schedule has another length (DPM-Solver's trailing spacing with
 * lambda_min_clipped can give fewer). */
int ditd_sampler_num_steps(const ditd_sampler *s);

/* The timestep to pass the model at each step, num_steps() values, as
 * float (integers for DDIM and DPM-Solver, exact). Borrowed; lives as long
 * as the sampler. */
const float *ditd_sampler_timesteps(const ditd_sampler *s);

ditd_sampler_kind ditd_sampler_get_kind(const ditd_sampler *s);

/* The forward process at step `step` (0 <= step < num_steps()), for a
 * pipeline that starts from a noised clean sample (img2img): *sigma such that
 * FlowMatchEulerDiscreteScheduler.scale_noise(x0, timesteps[step], noise) is
 * sigma * noise + (1 - sigma) * x0, the schedule's float32 sigma. Only the
 * flow-matching Euler sampler has it (memoryless, so its steps may start at
 * any index, as set_begin_index allows); the others are DITD_EUNSUPPORTED
 * naming the sampler (DDIM/DPM-Solver's add_noise and a multistep solver's
 * start mid-schedule are not done). */
int ditd_sampler_scale_noise_sigma(const ditd_sampler *s, int step, float *sigma);

/* One step for the sample in `slot`: sample (numel floats) is replaced by
 * the sample of step step_index + 1, from model_output (numel floats: the
 * model's prediction of the configured type, after guidance, learned sigma
 * already dropped). x0_pred, when not NULL, receives the current prediction
 * of the clean sample (numel floats), for previews.
 *
 * A slot runs steps 0, 1, ..., num_steps() - 1 in order; step 0 starts a
 * fresh trajectory (so a slot is reused simply by starting again at 0).
 * DPM-Solver and UniPC keep the previous steps' predictions per slot, so a
 * step out of order there is DITD_EINVAL; the others are memoryless.
 *
 * Allocates nothing. Thread-safe for distinct slots (a slot's state is its
 * own); one slot is stepped by one thread at a time. The buffers must not
 * overlap. Returns 0, or DITD_EINVAL (bad index, slot or order). */
int ditd_sampler_step(ditd_sampler *s, int step_index, int slot, const float *model_output,
                      float *sample, float *x0_pred);

#endif
