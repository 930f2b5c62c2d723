/* Samplers matching Diffusers' DDIMScheduler, DPMSolverMultistepScheduler
 * and FlowMatchEulerDiscreteScheduler (diffusers 0.42, torch 2.x), built
 * from the typed config of engine/pipeline/sched_config.c; UniPC's plan and
 * step are in sampler_unipc.c, behind the same ditd_sampler.
 *
 * Numerics: Diffusers keeps its schedules in float32 tensors and computes
 * every per-step coefficient as float32 0-dim tensor arithmetic; the
 * timestep schedules come from numpy in float64. We mirror each of those
 * dtype choices, operation by operation, so that the coefficients are the
 * same floats and the elementwise update rounds the same way. The places
 * where that matters are marked "Diffusers:". Elementwise expressions are
 * written one rounding per statement, so that a compiler that contracts
 * a*b+c within an expression (clang's default) cannot fuse them either.
 *
 * The only known source of difference: torch evaluates log/exp of a float32
 * tensor with its own vector math (MKL or Sleef, within 1 ulp), we with
 * libm's logf/expf, so a DPM-Solver coefficient can differ by an ulp.
 */
#include "engine/pipeline/sampler.h"

#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/error.h"
#include "engine/pipeline/sched_math.h"
#include "engine/pipeline/sampler_unipc.h"

#define MAX_FLOW_STEPS 100000


/* ---- the sampler ---------------------------------------------------------- */

/* Per-step coefficients, floats as Diffusers computes them. */
typedef struct step_coef {
    /* DDIM: sqrt(a_t), sqrt(1 - a_t), sqrt(a_prev), sqrt(1 - a_prev - std^2) */
    float sa, sb, sa_prev, sdir;
    /* DPM: model output -> x0 (or eps): alpha_s0, sigma_s0; update: order,
     * c1 * sample - c2 * D0 (+/-) c3 * D1 with D1 = inv_r0 * (m0 - m1) */
    float alpha_s, sigma_s;
    int order;
    float c1, c2, c3, inv_r0;
    /* flow: sigma and sigma_next - sigma */
    float sigma, dt;
} step_coef;

struct ditd_sampler {
    ditd_sched_config cfg;
    int n;               /* steps in the schedule */
    int max_slots;
    size_t numel;
    float *timesteps;    /* n */
    step_coef *coef;     /* n */
    /* DPM-Solver: two prediction buffers per slot (previous, current). */
    float *state;        /* max_slots * 2 * numel */
    int *which;          /* per slot: which half of state holds the previous */
    int *last;           /* per slot: the last step taken, -1 none */
    ditd__unipc *unipc;  /* UniPC: its coefficients and per-slot state */
};

static int check_steps(const ditd_sched_config *c, int num_steps)
{
    int hi = c->kind == DITD_SAMPLER_FLOW_EULER || (c->kind == DITD_SAMPLER_UNIPC && c->use_flow_sigmas)
                 ? MAX_FLOW_STEPS
                 : c->num_train_timesteps;
    if (num_steps < 1 || num_steps > hi)
        return ditd_err_set(DITD_ERANGE, "%s: num_inference_steps %d is out of range 1..%d",
                            c->source, num_steps, hi);
    return 0;
}

static int bad_timestep(const ditd_sched_config *c, int num_steps, long long t)
{
    return ditd_err_set(DITD_EUNSUPPORTED,
                        "%s: timestep_spacing \"%s\" (steps_offset %d) with %d steps gives "
                        "timestep %lld, outside 0..%d: choose another step count",
                        c->source, ditd_sched_spacing_name(c->timestep_spacing), c->steps_offset,
                        num_steps, t, c->num_train_timesteps - 1);
}

/* DDIMScheduler.set_timesteps. ts has room for num_steps + 1. */
static int ddim_timesteps(const ditd_sched_config *c, int num_steps, long long *ts, int *n_out,
                          double *tmp)
{
    const int N = c->num_train_timesteps;
    int n = num_steps;
    switch (c->timestep_spacing) {
    case DITD_SCHED_SPACING_LINSPACE:
        np_linspace(0, N - 1, num_steps, tmp);
        for (int i = 0; i < n; i++)
            ts[i] = (long long)np_round(tmp[num_steps - 1 - i]);
        break;
    case DITD_SCHED_SPACING_LEADING: {
        const int ratio = N / num_steps;
        for (int i = 0; i < n; i++)
            ts[i] = (long long)(num_steps - 1 - i) * ratio + c->steps_offset;
        break;
    }
    case DITD_SCHED_SPACING_TRAILING: {
        const double ratio = (double)N / num_steps;
        long len = np_arange_len(N, 0, -ratio);
        if (len > num_steps + 1)
            return ditd_err_set(DITD_EINTERNAL, "trailing schedule length %ld", len);
        np_arange(N, -ratio, len, tmp);
        n = (int)len;
        for (int i = 0; i < n; i++)
            ts[i] = (long long)np_round(tmp[i]) - 1;
        break;
    }
    }
    for (int i = 0; i < n; i++)
        if (ts[i] < 0 || ts[i] >= N)
            return bad_timestep(c, num_steps, ts[i]);
    *n_out = n;
    return 0;
}

static int ddim_plan(ditd_sampler *s, int num_steps, const float *ac, long long *ts)
{
    const ditd_sched_config *c = &s->cfg;
    const int N = c->num_train_timesteps;
    const float final_ac = c->set_alpha_to_one ? 1.0f : ac[0];
    for (int i = 0; i < s->n; i++) {
        step_coef *k = &s->coef[i];
        /* Diffusers: prev_timestep = t - N // num_inference_steps, whatever
         * the spacing (so not always the next timestep of the schedule). */
        long long t = ts[i], prev = t - N / num_steps;
        float a_t = ac[t];
        float a_prev = prev >= 0 ? ac[prev] : final_ac;
        float beta_t = 1.0f - a_t;
        float beta_prev = 1.0f - a_prev;
        /* _get_variance and std_dev_t = eta * sqrt(variance), eta = 0: kept
         * so that a NaN variance poisons the step exactly as in Diffusers. */
        float variance = (beta_prev / beta_t) * (1.0f - a_t / a_prev);
        float std = 0.0f * sqrtf(variance);
        k->sa = sqrtf(a_t);
        k->sb = sqrtf(beta_t);
        k->sa_prev = sqrtf(a_prev);
        k->sdir = sqrtf((1.0f - a_prev) - std * std);
        s->timesteps[i] = (float)t;
    }
    return 0;
}

/* DPMSolverMultistepScheduler._sigma_to_t for one sigma (numpy): log_sigmas
 * is float32, the rest float64, except (low - high), a float32 difference. */
static double dpm_sigma_to_t(double sigma, const float *log_sigmas, int N)
{
    double log_sigma = log(sigma > 1e-10 ? sigma : 1e-10);
    /* low_idx = argmax(cumsum(dists >= 0)), clipped to N - 2 */
    long cs = 0, best = -1;
    int low = 0;
    for (int i = 0; i < N; i++) {
        cs += (log_sigma - (double)log_sigmas[i]) >= 0;
        if (cs > best) {
            best = cs;
            low = i;
        }
    }
    if (low > N - 2)
        low = N - 2;
    const int high = low + 1;
    const float l = log_sigmas[low], h = log_sigmas[high];
    double w = ((double)l - log_sigma) / (double)(float)(l - h);
    w = w < 0 ? 0 : (w > 1 ? 1 : w);
    return (1 - w) * low + w * high;
}

static int dpm_plan(ditd_sampler *s, int num_steps, const float *ac, long long *ts, double *tmp,
                    float *sig_all, float *sigmas)
{
    const ditd_sched_config *c = &s->cfg;
    const int N = c->num_train_timesteps;
    float *acm = sig_all; /* reuse: alphas_cumprod with the zero-SNR fix */
    for (int i = 0; i < N; i++)
        acm[i] = ac[i];
    if (c->rescale_betas_zero_snr)
        acm[N - 1] = 0x1p-24f; /* Diffusers: so that the last sigma stays finite */

    /* last_timestep: lambda_min_clipped cuts the noisiest end. */
    int clipped = 0;
    if (c->lambda_min_clipped > -INFINITY) {
        /* searchsorted(flip(lambda_t), lambda_min_clipped), left side */
        while (clipped < N) {
            float a = sqrtf(acm[N - 1 - clipped]), sg = sqrtf(1.0f - acm[N - 1 - clipped]);
            /* torch.searchsorted compares in float32 */
            if (dpm_lambda(a, sg) >= (float)c->lambda_min_clipped)
                break;
            clipped++;
        }
    }
    const int last = N - clipped;

    int n = num_steps;
    switch (c->timestep_spacing) {
    case DITD_SCHED_SPACING_LINSPACE:
        np_linspace(0, last - 1, num_steps + 1, tmp);
        for (int i = 0; i < n; i++)
            ts[i] = (long long)np_round(tmp[num_steps - i]);
        break;
    case DITD_SCHED_SPACING_LEADING: {
        const long long ratio = last / (num_steps + 1);
        for (int i = 0; i < n; i++)
            ts[i] = (long long)(num_steps - i) * ratio + c->steps_offset;
        break;
    }
    case DITD_SCHED_SPACING_TRAILING: {
        const double ratio = (double)N / num_steps;
        long len = np_arange_len(last, 0, -ratio);
        if (len > num_steps + 1)
            return ditd_err_set(DITD_EINTERNAL, "trailing schedule length %ld", len);
        np_arange(last, -ratio, len, tmp);
        n = (int)len;
        for (int i = 0; i < n; i++)
            ts[i] = (long long)np_round(tmp[i]) - 1;
        break;
    }
    }
    if (n < 1)
        return bad_timestep(c, num_steps, 0);

    /* sigmas of the training schedule, float32: ((1 - ac) / ac) ** 0.5 */
    for (int i = 0; i < N; i++)
        sig_all[i] = sqrtf((1.0f - acm[i]) / acm[i]);

    if (c->use_karras_sigmas) {
        /* Karras et al. (2022) rho = 7 ramp between the ends of the training
         * sigmas (or the config's sigma_min / sigma_max), in float64. */
        float *log_sigmas = (float *)(tmp + (num_steps + 2));
        for (int i = 0; i < N; i++)
            log_sigmas[i] = logf(sig_all[i]);
        const double rho = 7.0;
        double smin = c->has_sigma_min ? c->sigma_min : (double)sig_all[0];
        double smax = c->has_sigma_max ? c->sigma_max : (double)sig_all[N - 1];
        double min_inv = pow(smin, 1 / rho), max_inv = pow(smax, 1 / rho);
        n = num_steps; /* Diffusers: the ramp has num_inference_steps points */
        np_linspace(0, 1, n, tmp);
        for (int i = 0; i < n; i++) {
            double sg = pow(max_inv + tmp[i] * (min_inv - max_inv), rho);
            double t = dpm_sigma_to_t(sg, log_sigmas, N);
            /* Diffusers: rounded, except for squaredcos_cap_v2, where the
             * cast to int64 truncates. */
            ts[i] = c->beta_schedule != DITD_SCHED_BETA_SQUAREDCOS_CAP_V2 ? (long long)np_round(t)
                                                                          : (long long)t;
            sigmas[i] = (float)sg;
        }
    } else {
        /* np.interp at integer timesteps: the training sigma itself,
         * clamped at the ends. */
        for (int i = 0; i < n; i++) {
            long long t = ts[i] < 0 ? 0 : (ts[i] > N - 1 ? N - 1 : ts[i]);
            sigmas[i] = sig_all[t];
        }
    }
    sigmas[n] = c->final_sigmas_type == DITD_SCHED_FINAL_SIGMA_MIN ? sig_all[0] : 0.0f;

    for (int i = 0; i < n; i++)
        if (ts[i] < 0 || ts[i] >= N)
            return bad_timestep(c, num_steps, ts[i]);
    /* Diffusers starts at the second occurrence of a repeated first
     * timestep (index_for_timestep): refuse such a degenerate schedule. */
    for (int i = 1; i < n; i++)
        if (ts[i] == ts[0])
            return ditd_err_set(DITD_EUNSUPPORTED,
                                "%s: %d steps repeat timestep %lld (too many steps for "
                                "timestep_spacing \"%s\")",
                                c->source, num_steps, ts[0],
                                ditd_sched_spacing_name(c->timestep_spacing));
    s->n = n;

    const bool pp = c->algorithm_type == DITD_SCHED_ALGO_DPMSOLVER_PP;
    for (int i = 0; i < n; i++) {
        step_coef *k = &s->coef[i];
        s->timesteps[i] = (float)ts[i];

        /* Which order this step uses (DPMSolverMultistepScheduler.step):
         * lower_order_nums counts the steps done, up to solver_order. */
        const bool final_low = i == n - 1 && (c->euler_at_final || (c->lower_order_final && n < 15) ||
                                              c->final_sigmas_type == DITD_SCHED_FINAL_ZERO);
        const int lower_order_nums = i < c->solver_order ? i : c->solver_order;
        k->order = (c->solver_order == 1 || lower_order_nums < 1 || final_low) ? 1 : 2;

        float alpha_t, sigma_t, alpha_s0, sigma_s0, alpha_s1, sigma_s1;
        dpm_alpha_sigma(sigmas[i + 1], &alpha_t, &sigma_t);
        dpm_alpha_sigma(sigmas[i], &alpha_s0, &sigma_s0);
        k->alpha_s = alpha_s0;
        k->sigma_s = sigma_s0;
        const float lambda_t = dpm_lambda(alpha_t, sigma_t);
        const float lambda_s0 = dpm_lambda(alpha_s0, sigma_s0);
        const float h = lambda_t - lambda_s0;
        if (pp) {
            k->c1 = sigma_t / sigma_s0;
            k->c2 = alpha_t * (expf(-h) - 1.0f);
        } else {
            k->c1 = alpha_t / alpha_s0;
            k->c2 = sigma_t * (expf(h) - 1.0f);
        }
        k->c3 = 0.0f;
        k->inv_r0 = 0.0f;
        if (k->order == 2) {
            dpm_alpha_sigma(sigmas[i - 1], &alpha_s1, &sigma_s1);
            const float lambda_s1 = dpm_lambda(alpha_s1, sigma_s1);
            const float h_0 = lambda_s0 - lambda_s1;
            const float r0 = h_0 / h;
            k->inv_r0 = 1.0f / r0;
            if (c->solver_type == DITD_SCHED_SOLVER_MIDPOINT)
                k->c3 = 0.5f * k->c2; /* subtracted */
            else if (pp)
                k->c3 = alpha_t * ((expf(-h) - 1.0f) / h + 1.0f); /* added */
            else
                k->c3 = sigma_t * ((expf(h) - 1.0f) / h - 1.0f); /* subtracted */
        }
    }
    return 0;
}

/* The sigmas of FluxPipeline's call (pipeline_sigmas) with use_dynamic_shifting: mu from
 * calculate_shift (float64, Python floats), sigmas = np.linspace(1,
 * 1/num_steps, num_steps) cast to float32, then time_shift(mu, 1, sigmas),
 * which numpy computes in float32 (the Python float e^mu or mu rounds to
 * float32 first; (1/t - 1) ** 1.0 is 1/t - 1 exactly). */
static void flow_dynamic_sigmas(const ditd_sched_config *c, int num_steps, double *tmp, float *sig)
{
    const double m = (c->max_shift - c->base_shift) /
                     (double)(c->max_image_seq_len - c->base_image_seq_len);
    const double b = c->base_shift - m * c->base_image_seq_len;
    const double mu = c->image_seq_len * m + b;
    const float k = c->time_shift_type == DITD_SCHED_TIME_SHIFT_EXPONENTIAL ? (float)exp(mu)
                                                                            : (float)mu;
    np_linspace(1.0, 1.0 / num_steps, num_steps, tmp);
    for (int i = 0; i < num_steps; i++) {
        float t = (float)tmp[i];
        float x = 1.0f / t - 1.0f;
        float d = k + x;
        sig[i] = k / d;
    }
}

/* The sigmas of a pipeline that hands the scheduler no sigmas
 * (StableDiffusion3Pipeline and its edit pipelines) with
 * use_dynamic_shifting: __init__ leaves its float32 sigmas N/N .. 1/N
 * unshifted, so sigma_max 1 and sigma_min float32(1/N); set_timesteps takes
 * np.linspace(sigma_max N, sigma_min N, num_steps) / N and time_shift(mu,
 * 1, sigmas), all in float64 (numpy float64 arrays, math.exp(mu)), then
 * stretch_shift_to_terminal in float64, and casts to float32 once. mu as
 * calculate_shift (the pipeline's image tokens). */
static void flow_dynamic_own_sigmas(const ditd_sched_config *c, int num_steps, double *tmp,
                                    float *sig)
{
    const int N = c->num_train_timesteps;
    const double m = (c->max_shift - c->base_shift) /
                     (double)(c->max_image_seq_len - c->base_image_seq_len);
    const double b = c->base_shift - m * c->base_image_seq_len;
    const double mu = c->image_seq_len * m + b;
    const double k = c->time_shift_type == DITD_SCHED_TIME_SHIFT_EXPONENTIAL ? exp(mu) : mu;
    const double sigma_min = (double)(1.0f / (float)N);
    np_linspace(1.0 * N, sigma_min * N, num_steps, tmp);
    for (int i = 0; i < num_steps; i++) {
        double t = tmp[i] / N;
        tmp[i] = k / (k + (1.0 / t - 1.0));
    }
    if (c->has_shift_terminal && c->shift_terminal != 0) {
        const double scale = (1 - tmp[num_steps - 1]) / (1 - c->shift_terminal);
        for (int i = 0; i < num_steps; i++)
            tmp[i] = 1 - ((1 - tmp[i]) / scale);
    }
    for (int i = 0; i < num_steps; i++)
        sig[i] = (float)tmp[i];
}

/* sig: num_steps floats of scratch. */
static int flow_plan(ditd_sampler *s, int num_steps, double *tmp, float *sig)
{
    const ditd_sched_config *c = &s->cfg;
    const int N = c->num_train_timesteps;
    const float fN = (float)N;

    if (c->use_dynamic_shifting && !c->pipeline_sigmas) {
        flow_dynamic_own_sigmas(c, num_steps, tmp, sig);
    } else if (c->use_dynamic_shifting) {
        flow_dynamic_sigmas(c, num_steps, tmp, sig);
        if (c->has_shift_terminal && c->shift_terminal != 0) {
            /* stretch_shift_to_terminal, in float32 as numpy runs it on
             * float32 sigmas */
            const float scale = (1.0f - sig[num_steps - 1]) / (float)(1 - c->shift_terminal);
            for (int i = 0; i < num_steps; i++) {
                float omz = 1.0f - sig[i];
                float q = omz / scale;
                sig[i] = 1.0f - q;
            }
        }
    } else if (c->pipeline_sigmas) {
        /* set_timesteps(sigmas=np.linspace(1, 1/steps)): the float32 array
         * shifted in float32 (numpy keeps float32 with Python scalars),
         * then stretched to shift_terminal in float32 */
        const float shift_f = (float)c->shift, shift_m1 = (float)(c->shift - 1.0);
        np_linspace(1.0, 1.0 / num_steps, num_steps, tmp);
        for (int i = 0; i < num_steps; i++) {
            float sg = (float)tmp[i];
            float num = shift_f * sg, den = 1.0f + shift_m1 * sg;
            sig[i] = num / den;
        }
        if (c->has_shift_terminal && c->shift_terminal != 0) {
            const float scale = (1.0f - sig[num_steps - 1]) / (float)(1 - c->shift_terminal);
            for (int i = 0; i < num_steps; i++) {
                float omz = 1.0f - sig[i];
                float q = omz / scale;
                sig[i] = 1.0f - q;
            }
        }
    } else {
        /* __init__: timesteps N..1 (float32), sigmas = timesteps / N,
         * shifted in float32 (static shift): only the ends are used, as
         * sigma_max and sigma_min. */
        const float shift_f = (float)c->shift, shift_m1 = (float)(c->shift - 1.0);
        float ends[2];
        for (int j = 0; j < 2; j++) {
            float sg = (float)(j ? 1 : N) / fN;
            ends[j] = (shift_f * sg) / (1.0f + shift_m1 * sg);
        }
        const double sigma_max = ends[0], sigma_min = ends[1];

        /* set_timesteps, in float64: the shift is applied a second time,
         * as Diffusers does. */
        np_linspace(sigma_max * N, sigma_min * N, num_steps, tmp);
        for (int i = 0; i < num_steps; i++) {
            double sg = tmp[i] / N;
            tmp[i] = c->shift * sg / (1 + (c->shift - 1) * sg);
        }
        if (c->has_shift_terminal && c->shift_terminal != 0) {
            /* stretch_shift_to_terminal */
            const double scale = (1 - tmp[num_steps - 1]) / (1 - c->shift_terminal);
            for (int i = 0; i < num_steps; i++)
                tmp[i] = 1 - ((1 - tmp[i]) / scale);
        }
        for (int i = 0; i < num_steps; i++)
            sig[i] = (float)tmp[i];
    }
    for (int i = 0; i < num_steps; i++)
        if (!isfinite(sig[i]))
            return ditd_err_set(DITD_EUNSUPPORTED,
                                "%s: %d steps give sigma %g at step %d (shift_terminal %g, "
                                "use_dynamic_shifting %s, image_seq_len %d)",
                                c->source, num_steps, (double)sig[i], i,
                                c->has_shift_terminal ? c->shift_terminal : 0.0,
                                c->use_dynamic_shifting ? "true" : "false", c->image_seq_len);
    s->n = num_steps;
    for (int i = 0; i < num_steps; i++) {
        float sg = sig[i];
        float next = i + 1 < num_steps ? sig[i + 1] : 0.0f;
        s->timesteps[i] = sg * fN;
        s->coef[i].sigma = sg;
        s->coef[i].dt = next - sg;
    }
    return 0;
}

int ditd_sampler_new(const ditd_sched_config *cfg, int num_steps, int max_slots, size_t numel,
                     ditd_sampler **out)
{
    int err;
    if (max_slots < 1 || numel < 1)
        return ditd_err_set(DITD_EINVAL, "sampler: max_slots %d, numel %zu", max_slots, numel);
    if ((err = ditd_sched_config_check(cfg)) || (err = check_steps(cfg, num_steps)))
        return err;
    if (cfg->kind == DITD_SAMPLER_FLOW_EULER && cfg->use_dynamic_shifting && cfg->image_seq_len < 1)
        return ditd_err_set(DITD_EINVAL,
                            "%s: use_dynamic_shifting true needs the image sequence length "
                            "(image_seq_len %d)",
                            cfg->source, cfg->image_seq_len);

    ditd_sampler *s = calloc(1, sizeof *s);
    if (!s)
        return ditd_err_set(DITD_ENOMEM, "sampler: out of memory");
    s->cfg = *cfg;
    s->max_slots = max_slots;
    s->numel = numel;

    /* Planning scratch, freed below: betas, alphas_cumprod, training
     * sigmas (N floats each), int64 timesteps and float64 temporaries. */
    const size_t N = (size_t)cfg->num_train_timesteps;
    const size_t nsteps = (size_t)num_steps + 2;
    float *fscratch = malloc(sizeof(float) * (3 * N + nsteps));
    long long *ts = malloc(sizeof(long long) * nsteps);
    double *tmp = malloc(sizeof(double) * nsteps + sizeof(float) * N);
    s->timesteps = malloc(sizeof(float) * nsteps);
    s->coef = calloc(nsteps, sizeof(step_coef));
    if (!fscratch || !ts || !tmp || !s->timesteps || !s->coef) {
        err = ditd_err_set(DITD_ENOMEM, "sampler: out of memory");
        goto fail_scratch;
    }
    float *betas = fscratch, *ac = betas + N, *sig_all = ac + N, *sigmas = sig_all + N;

    switch (cfg->kind) {
    case DITD_SAMPLER_DDIM:
        ditd__sched_alphas_cumprod(cfg, betas, ac);
        if (!(err = ddim_timesteps(cfg, num_steps, ts, &s->n, tmp)))
            err = ddim_plan(s, num_steps, ac, ts);
        break;
    case DITD_SAMPLER_DPMPP_2M:
        ditd__sched_alphas_cumprod(cfg, betas, ac);
        err = dpm_plan(s, num_steps, ac, ts, tmp, sig_all, sigmas);
        break;
    case DITD_SAMPLER_FLOW_EULER:
        err = flow_plan(s, num_steps, tmp, sigmas);
        break;
    case DITD_SAMPLER_UNIPC:
        err = ditd__unipc_new(cfg, num_steps, max_slots, numel, s->timesteps, &s->n, &s->unipc);
        break;
    }
    if (err)
        goto fail_scratch;

    if (cfg->kind == DITD_SAMPLER_DPMPP_2M) {
        if (numel > SIZE_MAX / sizeof(float) / 2 / (size_t)max_slots) {
            err = ditd_err_set(DITD_ENOMEM, "sampler: %d slots of %zu floats", max_slots, numel);
            goto fail_scratch;
        }
        s->state = malloc(sizeof(float) * 2 * numel * (size_t)max_slots);
        s->which = calloc((size_t)max_slots, sizeof(int));
        s->last = malloc(sizeof(int) * (size_t)max_slots);
        if (!s->state || !s->which || !s->last) {
            err = ditd_err_set(DITD_ENOMEM, "sampler: out of memory for %d slots of %zu floats",
                               max_slots, numel);
            goto fail_scratch;
        }
        for (int i = 0; i < max_slots; i++)
            s->last[i] = -1;
    }
    free(tmp);
    free(ts);
    free(fscratch);
    *out = s;
    return 0;

fail_scratch:
    free(tmp);
    free(ts);
    free(fscratch);
    ditd_sampler_free(s);
    return err;
}

void ditd_sampler_free(ditd_sampler *s)
{
    if (!s)
        return;
    free(s->timesteps);
    free(s->coef);
    free(s->state);
    free(s->which);
    free(s->last);
    ditd__unipc_free(s->unipc);
    free(s);
}

int ditd_sampler_num_steps(const ditd_sampler *s) { return s->n; }

const float *ditd_sampler_timesteps(const ditd_sampler *s) { return s->timesteps; }

ditd_sampler_kind ditd_sampler_get_kind(const ditd_sampler *s) { return s->cfg.kind; }

int ditd_sampler_scale_noise_sigma(const ditd_sampler *s, int step, float *sigma)
{
    if (s->cfg.kind != DITD_SAMPLER_FLOW_EULER)
        return ditd_err_set(DITD_EUNSUPPORTED,
                            "%s: starting from a noised image (img2img) needs the flow-euler "
                            "sampler, not %s",
                            s->cfg.source, ditd_sampler_kind_name(s->cfg.kind));
    if (step < 0 || step >= s->n)
        return ditd_err_set(DITD_EINVAL, "sampler step %d: out of range (%d steps)", step, s->n);
    *sigma = s->coef[step].sigma;
    return 0;
}

/* DDIMScheduler.step with eta = 0, element by element in float32. */
static void ddim_step(const ditd_sampler *s, const step_coef *k, const float *m, float *x,
                      float *x0_out)
{
    const ditd_sched_config *c = &s->cfg;
    const float r = (float)c->clip_sample_range;
    for (size_t i = 0; i < s->numel; i++) {
        float x0, eps, t1, t2;
        switch (c->prediction_type) {
        case DITD_SCHED_PRED_EPSILON:
            t1 = k->sb * m[i];
            t2 = x[i] - t1;
            x0 = t2 / k->sa;
            eps = m[i];
            break;
        case DITD_SCHED_PRED_SAMPLE:
            x0 = m[i];
            t1 = k->sa * x0;
            t2 = x[i] - t1;
            eps = t2 / k->sb;
            break;
        default: /* v_prediction */
            t1 = k->sa * x[i];
            t2 = k->sb * m[i];
            x0 = t1 - t2;
            t1 = k->sa * m[i];
            t2 = k->sb * x[i];
            eps = t1 + t2;
            break;
        }
        if (c->clip_sample)
            x0 = x0 < -r ? -r : (x0 > r ? r : x0); /* NaN stays NaN, as torch.clamp */
        t1 = k->sdir * eps;
        t2 = k->sa_prev * x0;
        x[i] = t2 + t1;
        if (x0_out)
            x0_out[i] = x0;
    }
}

/* DPMSolverMultistepScheduler.convert_model_output: x0 (dpmsolver++) or
 * epsilon (dpmsolver); and the x0 of either for previews. */
static void dpm_convert(const ditd_sampler *s, const step_coef *k, const float *m, const float *x,
                        float *out, float *x0_out)
{
    const ditd_sched_config *c = &s->cfg;
    const bool pp = c->algorithm_type == DITD_SCHED_ALGO_DPMSOLVER_PP;
    for (size_t i = 0; i < s->numel; i++) {
        float v, t1, t2;
        switch (c->prediction_type) {
        case DITD_SCHED_PRED_EPSILON:
            if (pp) {
                t1 = k->sigma_s * m[i];
                t2 = x[i] - t1;
                v = t2 / k->alpha_s;
            } else {
                v = m[i];
            }
            break;
        case DITD_SCHED_PRED_SAMPLE:
            if (pp) {
                v = m[i];
            } else {
                t1 = k->alpha_s * m[i];
                t2 = x[i] - t1;
                v = t2 / k->sigma_s;
            }
            break;
        default: /* v_prediction */
            if (pp) {
                t1 = k->alpha_s * x[i];
                t2 = k->sigma_s * m[i];
                v = t1 - t2;
            } else {
                t1 = k->alpha_s * m[i];
                t2 = k->sigma_s * x[i];
                v = t1 + t2;
            }
            break;
        }
        out[i] = v;
        if (x0_out) {
            if (pp) {
                x0_out[i] = v;
            } else {
                t1 = k->sigma_s * v;
                t2 = x[i] - t1;
                x0_out[i] = t2 / k->alpha_s;
            }
        }
    }
}

static void dpm_update(const ditd_sampler *s, const step_coef *k, const float *m0,
                       const float *m1, float *x)
{
    const bool pp = s->cfg.algorithm_type == DITD_SCHED_ALGO_DPMSOLVER_PP;
    const bool add_d1 = pp && s->cfg.solver_type == DITD_SCHED_SOLVER_HEUN;
    for (size_t i = 0; i < s->numel; i++) {
        float a = k->c1 * x[i];
        float b = k->c2 * m0[i];
        float r = a - b;
        if (k->order == 2) {
            float d = m0[i] - m1[i];
            float d1 = k->inv_r0 * d;
            float e = k->c3 * d1;
            r = add_d1 ? r + e : r - e;
        }
        x[i] = r;
    }
}

int ditd_sampler_step(ditd_sampler *s, int step_index, int slot, const float *model_output,
                      float *sample, float *x0_pred)
{
    if (step_index < 0 || step_index >= s->n || slot < 0 || slot >= s->max_slots)
        return ditd_err_set(DITD_EINVAL, "sampler step %d slot %d: out of range (%d steps, %d slots)",
                            step_index, slot, s->n, s->max_slots);
    const step_coef *k = &s->coef[step_index];
    switch (s->cfg.kind) {
    case DITD_SAMPLER_DDIM:
        ddim_step(s, k, model_output, sample, x0_pred);
        return 0;
    case DITD_SAMPLER_DPMPP_2M: {
        if (step_index > 0 && s->last[slot] != step_index - 1)
            return ditd_err_set(DITD_EINVAL,
                                "sampler slot %d: step %d after step %d (DPM-Solver steps run "
                                "in order from 0)",
                                slot, step_index, s->last[slot]);
        float *base = s->state + (size_t)slot * 2 * s->numel;
        const int prev_half = s->which[slot];
        float *prev = base + (size_t)prev_half * s->numel;
        float *cur = base + (size_t)(prev_half ^ 1) * s->numel;
        dpm_convert(s, k, model_output, sample, cur, x0_pred);
        dpm_update(s, k, cur, prev, sample);
        s->which[slot] = prev_half ^ 1;
        s->last[slot] = step_index;
        return 0;
    }
    case DITD_SAMPLER_UNIPC:
        return ditd__unipc_step(s->unipc, step_index, slot, model_output, sample, x0_pred);
    case DITD_SAMPLER_FLOW_EULER:
        for (size_t i = 0; i < s->numel; i++) {
            float m = model_output[i];
            if (x0_pred) {
                float t = k->sigma * m;
                x0_pred[i] = sample[i] - t;
            }
            float t = k->dt * m;
            sample[i] = sample[i] + t;
        }
        return 0;
    }
    return ditd_err_set(DITD_EINTERNAL, "sampler kind %d", (int)s->cfg.kind);
}
