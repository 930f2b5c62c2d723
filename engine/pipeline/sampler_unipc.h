/* UniPCMultistepScheduler's plan and step (engine/pipeline/sampler_unipc.c),
 * internal to sampler.c: ditd_sampler holds one of these for kind UNIPC and
 * forwards to it.
 */
#ifndef DITD_ENGINE_PIPELINE_SAMPLER_UNIPC_H
#define DITD_ENGINE_PIPELINE_SAMPLER_UNIPC_H

#include <stddef.h>

#include "engine/pipeline/sched_config.h"

typedef struct ditd__unipc ditd__unipc;

/* set_timesteps(num_steps) for a checked UniPC config, with state for
 * max_slots samples of numel floats. Writes the timesteps (as the model
 * gets them: integers) into timesteps (room for num_steps + 2) and their
 * count into *n. 0, DITD_EUNSUPPORTED (a schedule Diffusers gets wrong,
 * named), DITD_ENOMEM. */
int ditd__unipc_new(const ditd_sched_config *c, int num_steps, int max_slots, size_t numel,
                    float *timesteps, int *n, ditd__unipc **out);
void ditd__unipc_free(ditd__unipc *u);

/* UniPCMultistepScheduler.step for the sample in `slot` (see
 * ditd_sampler_step). 0 or DITD_EINVAL (a step out of order). */
int ditd__unipc_step(ditd__unipc *u, int step_index, int slot, const float *model_output,
                     float *sample, float *x0_pred);

#endif
