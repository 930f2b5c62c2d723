/* Step caching: First Block Cache, TaylorSeer and MagCache exactly as
 * Diffusers 0.42's hooks define them (diffusers/hooks/first_block_cache.py,
 * taylorseer_cache.py, mag_cache.py), behind the family-neutral seam of
 * engine/models/denoiser.h (ditd_denoiser_cache).
 *
 *   first_block_cache  FirstBlockCacheConfig(threshold): the first block's
 *       residual r = out - in; the rest of the blocks run when
 *       mean|r - r_prev| / mean|r_prev| > threshold (r_prev: the residual
 *       of the last step that ran them), else the output is the first
 *       block's output plus the cached residual of the blocks after it.
 *   taylorseer_cache   TaylorSeerCacheConfig(cache_interval,
 *       disable_cache_before_step, disable_cache_after_step, max_order,
 *       taylor_factors_dtype, cache_identifiers, skip_predict_identifiers,
 *       use_lite_mode): the hooked modules (regular expressions over the
 *       family's module names, re.fullmatch) compute on warm-up, refresh
 *       and cool-down steps and update Taylor factors (divided differences
 *       up to max_order); on the others their output is the Taylor
 *       prediction (or zeros for a skip_predict module).
 *   mag_cache          MagCacheConfig(threshold, max_skip_steps,
 *       retention_ratio, num_inference_steps, mag_ratios, calibrate): from
 *       the per-step magnitude ratios alone, a step skips every block
 *       (output = input + the last residual of all blocks) while the
 *       accumulated error stays <= threshold, at most max_skip_steps in a
 *       row, never in the first retention_ratio of the steps; calibrate
 *       runs every block and measures the ratios.
 *
 * State: per sample and guidance branch, as the hooks keep it per cache
 * context. FluxPipeline runs its branches in cache_context("cond") and
 * ("uncond"): one state each. DiTPipeline runs [x; x] in one forward under
 * one context: a sample's conditional and unconditional rows share one
 * state (shared_branches). A batch of several samples gives each sample
 * the state it would have alone (Diffusers would pool the batch's rows).
 *
 * One decision for the whole group: the only data-dependent decision (First
 * Block Cache's relative L1) is computed from per-token float64 sums that
 * every rank of the group gathers (over sequence shards, cfg halves; tp
 * replicas send theirs and are ignored) and adds in token order, row
 * order, exactly as one rank does; the leader's decisions are broadcast.
 * MagCache and TaylorSeer decide from step counters that every rank keeps
 * alike. So every layout skips the steps one rank skips.
 *
 * Memory: buffers are planned at ditd_step_cache_begin() for the batch
 * (grown only when a batch needs more than held); the step loop allocates
 * nothing.
 *
 * What it is not: no JSON (the server maps the request's "cache" object onto
 * ditd_cache_config_set()), no model knowledge (the family's hooks and
 * module names), FasterCache and Pyramid Attention Broadcast are not here.
 */
#ifndef DITD_ENGINE_STEP_CACHE_H
#define DITD_ENGINE_STEP_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "engine/backend/backend.h"
#include "engine/models/denoiser.h"
#include "engine/parallel/mesh.h"

/* the methods and their configs */
#include "engine/pipeline/step_cache_config.h"

/* What one sample's caching did in the last ditd_step_cache run. */
typedef struct ditd_cache_stats {
    int steps;           /* steps it took part in */
    int steps_skipped;   /* steps at which none of its rows evaluated the blocks
                          * (TaylorSeer: every hooked module was predicted) */
    long evals;          /* block evaluations (TaylorSeer: hooked-module calls) */
    long evals_skipped;  /* of those, skipped (TaylorSeer: predicted) */
} ditd_cache_stats;

typedef struct ditd_step_cache ditd_step_cache;

/* A cache for up to max_samples samples of a pipeline on ops, one rank of
 * mesh (borrowed; NULL = one rank). Allocates no activation buffer yet. */
int ditd_step_cache_new(const ditd_backend_ops *ops, const ditd_mesh *mesh, int max_samples,
                        ditd_step_cache **out);
void ditd_step_cache_free(ditd_step_cache *c);

/* Starts a batch of n samples and `steps` steps with config cfg on model d:
 * checks the config against the model (its block hooks, its module names
 * for TaylorSeer's patterns), plans the buffers, resets every state, and
 * points d->cache at the hooks. shared_branches: a sample's conditional and
 * unconditional rows share one state (DiTPipeline). A refusal is the same
 * on every rank. Not collective. */
int ditd_step_cache_begin(ditd_step_cache *c, ditd_denoiser *d, const ditd_cache_config *cfg,
                          int steps, int n, int shared_branches);

/* Before a forward: rows_total forward rows of the step (both cfg halves),
 * row_sample[r] / row_branch[r] (0 conditional, 1 unconditional) for each,
 * and the rows this rank's forward runs, [r0, r0 + nr). Every rank binds
 * the whole step's rows. */
void ditd_step_cache_bind(ditd_step_cache *c, int rows_total, const int *row_sample,
                          const uint8_t *row_branch, int r0, int nr);

/* A cfg half without rows this step calls this instead of the forward, so
 * that it joins the group's exchanges. Collective as the hooks are. */
int ditd_step_cache_idle(ditd_step_cache *c);

/* After the step's forward (or idle): counts the step into the stats. */
void ditd_step_cache_step_done(ditd_step_cache *c);

/* Ends the batch: d->cache = NULL. Stats stay readable until the next begin.
 * NULL: nothing. */
void ditd_step_cache_end(ditd_step_cache *c);

/* Sample i's counts of the last batch (zeros without caching). */
void ditd_step_cache_sample_stats(const ditd_step_cache *c, int i, ditd_cache_stats *out);

/* mag_cache with calibrate: the ratios measured for sample i's branch
 * (branch 0 under shared_branches), one per step, as MagCacheBlockHook
 * prints them. *n = 0 when there are none. Borrowed until the next begin. */
const float *ditd_step_cache_calibration(const ditd_step_cache *c, int i, int branch, int *n);

/* first_block_cache: the k-th relative L1 compared for sample i's branch
 * (0 under shared_branches) since the batch began (k = 0 is the second
 * forward: the first has nothing to compare), as the group computed it
 * (*group), and as this rank's own rows and tokens alone would give it
 * (*local; NaN when it holds none): the number a rank must not decide on
 * alone. DITD_ERANGE past the last. For diagnostics and the parallel test. */
int ditd_step_cache_fbc_trace(const ditd_step_cache *c, int i, int branch, int k, double *group,
                              double *local);

#endif
