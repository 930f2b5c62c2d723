/* UniPCMultistepScheduler (diffusers 0.42, torch 2.x): the B(h) predictor
 * (UniP) and corrector (UniC) of orders 1 and 2, data (predict_x0) or noise
 * prediction, bh1 or bh2, on the VP sigmas of a beta schedule or on flow
 * sigmas (use_flow_sigmas: 1 -> 0 shifted by flow_shift, alpha = 1 -
 * sigma), as Wan configures it.
 *
 * Numerics as sampler.c's: the schedule in float64 as numpy computes it,
 * then float32; every coefficient as torch's float32 0-dim arithmetic, one
 * rounding per statement; the elementwise update in the same order as the
 * tensor expressions. The one linear solve (the order-2 corrector's 2x2
 * system, torch.linalg.solve) follows reference LAPACK's sgetrf2 + sgetrs
 * (partial pivoting, the pivot's reciprocal scaling the column); torch's
 * LAPACK may round that solve differently by an ulp.
 *
 * State per sample slot: the converted model outputs of the last two steps
 * and the sample the last predictor started from (3 x numel floats). The
 * step is one pass over the elements: convert, correct, predict.
 *
 * What it is not: the config reader (sched_config.c) or the other samplers.
 */
#include "engine/pipeline/sampler_unipc.h"

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/error.h"
#include "engine/pipeline/sched_math.h"

#define MAX_FLOW_STEPS 100000

typedef struct uni_step {
    float a, s, sig;           /* alpha_t, sigma_t, sigma of this step: the output's conversion */
    int p;                     /* predictor order: c1 x - c2 m0 - c3 (0.5 (m1 - m0) / rk) */
    float pc1, pc2, pc3, prk;
    int q;                     /* corrector order, 0 when it does not run */
    float cc1, cc2, cc3, crk, rho0, rho1;
} uni_step;

struct ditd__unipc {
    ditd_sched_config cfg;
    int n, max_slots;
    size_t numel;
    uni_step *st;              /* n */
    float *state;              /* per slot: m1 (previous output), m2 (the one before), last sample */
    int *last;                 /* per slot: the last step taken, -1 none */
};

static void alpha_sigma(const ditd_sched_config *c, float sigma, float *a, float *s)
{
    if (c->use_flow_sigmas) {
        *a = 1.0f - sigma;
        *s = sigma;
    } else {
        dpm_alpha_sigma(sigma, a, s);
    }
}

static float lambda_of(const ditd_sched_config *c, float sigma)
{
    float a, s;
    alpha_sigma(c, sigma, &a, &s);
    return dpm_lambda(a, s);
}

/* The terms both updates share, from sigma_s0 to sigma_t: hh (-h for data
 * prediction), h_phi_1 = expm1(hh), B(h), and c1 x - c2 m0 with the c3 of
 * the B(h) term. */
typedef struct bh_terms {
    float h, hh, h_phi_1, b_h, lambda_s0, c1, c2, c3;
} bh_terms;

static bh_terms bh(const ditd_sched_config *c, float sigma_t, float sigma_s0)
{
    bh_terms t;
    float a_t, s_t, a_0, s_0;
    alpha_sigma(c, sigma_t, &a_t, &s_t);
    alpha_sigma(c, sigma_s0, &a_0, &s_0);
    const float lambda_t = dpm_lambda(a_t, s_t);
    t.lambda_s0 = dpm_lambda(a_0, s_0);
    t.h = lambda_t - t.lambda_s0;
    t.hh = c->predict_x0 ? -t.h : t.h;
    t.h_phi_1 = expm1f(t.hh);
    t.b_h = c->solver_type == DITD_SCHED_SOLVER_BH1 ? t.hh : expm1f(t.hh);
    if (c->predict_x0) {
        t.c1 = s_t / s_0;
        t.c2 = a_t * t.h_phi_1;
        t.c3 = a_t * t.b_h;
    } else {
        t.c1 = a_t / a_0;
        t.c2 = s_t * t.h_phi_1;
        t.c3 = s_t * t.b_h;
    }
    return t;
}

/* torch.linalg.solve of [[1, 1], [rk, 1]] x = [b0, b1] in float32, as
 * reference LAPACK: sgetrf2 (pivot the larger of |1|, |rk|, the first on
 * ties; scale by the pivot's reciprocal; update), sgetrs (forward with the
 * unit lower factor, back with the upper one, dividing by the diagonal). */
static void solve2(float rk, float b0, float b1, float *x0, float *x1)
{
    float a11 = 1.0f, a12 = 1.0f, a21 = rk, a22 = 1.0f, y0 = b0, y1 = b1;
    if (fabsf(rk) > 1.0f) {
        a11 = rk, a21 = 1.0f;
        y0 = b1, y1 = b0;
    }
    const float inv = 1.0f / a11;
    const float l21 = a21 * inv;
    const float t = l21 * a12;
    const float u22 = a22 - t;
    const float ly = y0 * l21;
    y1 = y1 - ly;
    *x1 = y1 / u22;
    const float uy = *x1 * a12;
    y0 = y0 - uy;
    *x0 = y0 / a11;
}

static bool finite_nonzero(float v) { return v != 0.0f && !isnan(v); }

static int not_finite(const ditd_sched_config *c, int num_steps, int i, const char *what)
{
    return ditd_err_set(DITD_EUNSUPPORTED,
                        "%s: %d steps: the %s of step %d is not finite (final_sigmas_type \"%s\", "
                        "solver_type \"%s\", predict_x0 %s, lower_order_final %s): Diffusers' "
                        "step gives NaN here",
                        c->source, num_steps, what, i, ditd_sched_final_sigmas_name(c->final_sigmas_type),
                        ditd_sched_solver_name(c->solver_type), c->predict_x0 ? "true" : "false",
                        c->lower_order_final ? "true" : "false");
}

/* set_timesteps: the int64 timesteps and the float32 sigmas (n + 1). */
static int schedule(const ditd_sched_config *c, int num_steps, long long *ts, float *sig, double *tmp,
                    int *n_out)
{
    const int N = c->num_train_timesteps;
    int n = num_steps;
    if (c->use_flow_sigmas) {
        /* np.linspace(1, 1 / N, steps + 1)[:-1], shifted, stretched to
         * shift_terminal, the first nudged off 1, all in float64 */
        np_linspace(1.0, 1.0 / N, num_steps + 1, tmp);
        for (int i = 0; i < n; i++) {
            const double num = c->flow_shift * tmp[i];
            const double den0 = (c->flow_shift - 1) * tmp[i];
            const double den = 1 + den0;
            tmp[i] = num / den;
        }
        if (c->has_shift_terminal && c->shift_terminal != 0) {
            const double one_minus_last = 1 - tmp[n - 1];
            const double scale = one_minus_last / (1 - c->shift_terminal);
            for (int i = 0; i < n; i++) {
                const double omz = 1 - tmp[i];
                const double q = omz / scale;
                tmp[i] = 1 - q;
            }
        }
        if (fabs(tmp[0] - 1) < 1e-6)
            tmp[0] -= 1e-6;
        for (int i = 0; i < n; i++) {
            const double t = tmp[i] * N;
            if (!isfinite(tmp[i]) || !(t > -9.2e18 && t < 9.2e18))
                return ditd_err_set(DITD_EUNSUPPORTED, "%s: %d steps give sigma %g at step %d",
                                    c->source, num_steps, tmp[i], i);
            ts[i] = (long long)t; /* numpy's astype(int64): toward zero */
            sig[i] = (float)tmp[i];
        }
        sig[n] = c->final_sigmas_type == DITD_SCHED_FINAL_SIGMA_MIN ? (float)tmp[n - 1] : 0.0f;
    } else {
        float *betas = malloc(sizeof(float) * 2 * (size_t)N);
        if (!betas)
            return ditd_err_set(DITD_ENOMEM, "sampler: out of memory");
        float *ac = betas + N;
        ditd__sched_alphas_cumprod(c, betas, ac);
        if (c->rescale_betas_zero_snr)
            ac[N - 1] = 0x1p-24f; /* Diffusers: so that the last sigma stays finite */
        switch (c->timestep_spacing) {
        case DITD_SCHED_SPACING_LINSPACE:
            np_linspace(0, N - 1, num_steps + 1, tmp);
            for (int i = 0; i < n; i++)
                ts[i] = (long long)np_round(tmp[num_steps - i]);
            break;
        case DITD_SCHED_SPACING_LEADING: {
            const long long ratio = N / (num_steps + 1);
            for (int i = 0; i < n; i++)
                ts[i] = (long long)(num_steps - i) * ratio + c->steps_offset;
            break;
        }
        case DITD_SCHED_SPACING_TRAILING: {
            const double ratio = (double)N / num_steps;
            long len = np_arange_len(N, 0, -ratio);
            if (len > num_steps + 1) {
                free(betas);
                return ditd_err_set(DITD_EINTERNAL, "trailing schedule length %ld", len);
            }
            np_arange(N, -ratio, len, tmp);
            n = (int)len;
            for (int i = 0; i < n; i++)
                ts[i] = (long long)np_round(tmp[i]) - 1;
            break;
        }
        }
        for (int i = 0; i < n; i++)
            if (ts[i] < 0 || ts[i] >= N) {
                long long t = ts[i];
                free(betas);
                return ditd_err_set(DITD_EUNSUPPORTED,
                                    "%s: timestep_spacing \"%s\" (steps_offset %d) with %d steps "
                                    "gives timestep %lld, outside 0..%d: choose another step count",
                                    c->source, ditd_sched_spacing_name(c->timestep_spacing),
                                    c->steps_offset, num_steps, t, N - 1);
            }
        /* the training sigmas ((1 - ac) / ac) ** 0.5 in float32, read at the
         * (integer) timesteps by np.interp */
        for (int i = 0; i < n; i++) {
            const float a = ac[ts[i]];
            sig[i] = sqrtf((1.0f - a) / a);
        }
        sig[n] = c->final_sigmas_type == DITD_SCHED_FINAL_SIGMA_MIN ? sqrtf((1.0f - ac[0]) / ac[0])
                                                                    : 0.0f;
        free(betas);
    }
    if (n < 1)
        return ditd_err_set(DITD_EUNSUPPORTED, "%s: %d steps give an empty schedule", c->source,
                            num_steps);
    /* Diffusers starts at the second occurrence of a repeated first
     * timestep (index_for_timestep) */
    for (int i = 1; i < n; i++)
        if (ts[i] == ts[0])
            return ditd_err_set(DITD_EUNSUPPORTED,
                                "%s: %d steps repeat the first timestep %lld (Diffusers then starts "
                                "at the second): choose fewer steps",
                                c->source, num_steps, ts[0]);
    *n_out = n;
    return 0;
}

static bool corrector_disabled(const ditd_sched_config *c, int i)
{
    for (int k = 0; k < c->n_disable_corrector; k++)
        if (c->disable_corrector[k] == i)
            return true;
    return false;
}

static int plan(ditd__unipc *u, int num_steps, const float *sig)
{
    const ditd_sched_config *c = &u->cfg;
    const int n = u->n, order = c->solver_order;
    for (int i = 0; i < n; i++) {
        uni_step *k = &u->st[i];
        alpha_sigma(c, sig[i], &k->a, &k->s);
        k->sig = sig[i];
        /* UniPCMultistepScheduler.step: the order of this step's predictor,
         * warmed up by lower_order_nums and lowered near the end */
        const int lower_order_nums = i < order ? i : order;
        int p = c->lower_order_final ? (order < n - i ? order : n - i) : order;
        k->p = p < lower_order_nums + 1 ? p : lower_order_nums + 1;

        // predictor (UniP), sigmas[i] -> sigmas[i + 1]
        bh_terms t = bh(c, sig[i + 1], sig[i]);
        k->pc1 = t.c1;
        k->pc2 = t.c2;
        k->pc3 = t.c3; /* Diffusers multiplies it even by a zero pred_res */
        if (!isfinite(k->pc1) || !isfinite(k->pc2) || !isfinite(k->pc3))
            return not_finite(c, num_steps, i, "predictor");
        k->prk = 0.0f;
        if (k->p == 2) {
            const float lambda_s1 = lambda_of(c, sig[i - 1]);
            const float d = lambda_s1 - t.lambda_s0;
            k->prk = d / t.h;
            if (!finite_nonzero(k->prk))
                return not_finite(c, num_steps, i, "predictor's r_k");
        }

        // corrector (UniC) of this step's sample, sigmas[i - 1] -> sigmas[i], at the
        // order the previous predictor ran
        k->q = i > 0 && !corrector_disabled(c, i - 1) ? u->st[i - 1].p : 0;
        if (!k->q)
            continue;
        t = bh(c, sig[i], sig[i - 1]);
        k->cc1 = t.c1;
        k->cc2 = t.c2;
        k->cc3 = t.c3;
        k->crk = 0.0f;
        k->rho0 = 0.0f;
        if (k->q == 1) {
            k->rho1 = 0.5f;
        } else {
            const float lambda_s1 = lambda_of(c, sig[i - 2]);
            const float d = lambda_s1 - t.lambda_s0;
            k->crk = d / t.h;
            /* b_i = h_phi_k * i! / B(h), h_phi_k = h_phi_{k-1} / hh - 1 / (k)! */
            const float q1 = t.h_phi_1 / t.hh;
            const float phi_k1 = q1 - 1.0f;
            const float p1 = phi_k1 * 1.0f;
            const float b0 = p1 / t.b_h;
            const float q2 = phi_k1 / t.hh;
            const float phi_k2 = q2 - 0.5f;
            const float p2 = phi_k2 * 2.0f;
            const float b1 = p2 / t.b_h;
            solve2(k->crk, b0, b1, &k->rho0, &k->rho1);
            if (!finite_nonzero(k->crk) || !isfinite(k->rho0))
                return not_finite(c, num_steps, i, "corrector's r_k");
        }
        if (!isfinite(k->cc1) || !isfinite(k->cc2) || !isfinite(k->cc3) || !isfinite(k->rho1))
            return not_finite(c, num_steps, i, "corrector");
    }
    return 0;
}

int ditd__unipc_new(const ditd_sched_config *c, int num_steps, int max_slots, size_t numel,
                    float *timesteps, int *n, ditd__unipc **out)
{
    int err;
    ditd__unipc *u = calloc(1, sizeof *u);
    long long *ts = malloc(sizeof(long long) * ((size_t)num_steps + 2));
    float *sig = malloc(sizeof(float) * ((size_t)num_steps + 2));
    double *tmp = calloc((size_t)num_steps + 2, sizeof(double));
    if (!u || !ts || !sig || !tmp) {
        err = ditd_err_set(DITD_ENOMEM, "sampler: out of memory");
        goto fail;
    }
    u->cfg = *c;
    u->max_slots = max_slots;
    u->numel = numel;
    if ((err = schedule(c, num_steps, ts, sig, tmp, &u->n)))
        goto fail;
    u->st = calloc((size_t)u->n, sizeof *u->st);
    if (!u->st) {
        err = ditd_err_set(DITD_ENOMEM, "sampler: out of memory");
        goto fail;
    }
    if ((err = plan(u, num_steps, sig)))
        goto fail;
    if (numel > SIZE_MAX / sizeof(float) / 3 / (size_t)max_slots) {
        err = ditd_err_set(DITD_ENOMEM, "sampler: %d slots of %zu floats", max_slots, numel);
        goto fail;
    }
    u->state = malloc(sizeof(float) * 3 * numel * (size_t)max_slots);
    u->last = malloc(sizeof(int) * (size_t)max_slots);
    if (!u->state || !u->last) {
        err = ditd_err_set(DITD_ENOMEM, "sampler: out of memory for %d slots of %zu floats",
                           max_slots, numel);
        goto fail;
    }
    for (int i = 0; i < max_slots; i++)
        u->last[i] = -1;
    for (int i = 0; i < u->n; i++)
        timesteps[i] = (float)ts[i];
    *n = u->n;
    free(ts);
    free(sig);
    free(tmp);
    *out = u;
    return 0;
fail:
    free(ts);
    free(sig);
    free(tmp);
    ditd__unipc_free(u);
    return err;
}

void ditd__unipc_free(ditd__unipc *u)
{
    if (!u)
        return;
    free(u->st);
    free(u->state);
    free(u->last);
    free(u);
}

int ditd__unipc_step(ditd__unipc *u, int step_index, int slot, const float *model_output,
                     float *sample, float *x0_pred)
{
    if (step_index > 0 && u->last[slot] != step_index - 1)
        return ditd_err_set(DITD_EINVAL,
                            "sampler slot %d: step %d after step %d (UniPC steps run in order "
                            "from 0)",
                            slot, step_index, u->last[slot]);
    const ditd_sched_config *c = &u->cfg;
    const uni_step *k = &u->st[step_index];
    float *m1 = u->state + (size_t)slot * 3 * u->numel, *m2 = m1 + u->numel, *last = m2 + u->numel;
    const bool x0 = c->predict_x0;
    for (size_t e = 0; e < u->numel; e++) {
        const float x_in = sample[e], mo = model_output[e];
        float mc, t1, t2;
        // convert_model_output, at sigmas[i]
        switch (c->prediction_type) {
        case DITD_SCHED_PRED_EPSILON:
            if (x0) {
                t1 = k->s * mo;
                t2 = x_in - t1;
                mc = t2 / k->a;
            } else {
                mc = mo;
            }
            break;
        case DITD_SCHED_PRED_SAMPLE:
            if (x0) {
                mc = mo;
            } else {
                t1 = k->a * mo;
                t2 = x_in - t1;
                mc = t2 / k->s;
            }
            break;
        case DITD_SCHED_PRED_V:
            if (x0) {
                t1 = k->a * x_in;
                t2 = k->s * mo;
                mc = t1 - t2;
            } else {
                t1 = k->a * mo;
                t2 = k->s * x_in;
                mc = t1 + t2;
            }
            break;
        default: /* flow_prediction (data prediction only) */
            t1 = k->sig * mo;
            mc = x_in - t1;
            break;
        }
        float x = x_in;
        // UniC: x = c1 x_last - c2 m0 - c3 (rho0 D1 + rho1 (mc - m0))
        if (k->q) {
            const float m0 = m1[e];
            t1 = k->cc1 * last[e];
            t2 = k->cc2 * m0;
            const float xt_ = t1 - t2;
            const float d1_t = mc - m0;
            const float r1 = k->rho1 * d1_t;
            float inner;
            if (k->q == 2) {
                const float d = m2[e] - m0;
                const float d1 = d / k->crk;
                const float corr = k->rho0 * d1;
                inner = corr + r1;
            } else {
                inner = r1 + 0.0f; /* Diffusers: corr_res = 0 (an int) + ... */
            }
            t2 = k->cc3 * inner;
            x = xt_ - t2;
        }
        // UniP: c1 x - c2 mc - c3 (0.5 (m1 - mc) / rk)
        t1 = k->pc1 * x;
        t2 = k->pc2 * mc;
        const float xt_ = t1 - t2;
        float r;
        if (k->p == 2) {
            const float d = m1[e] - mc;
            const float d1 = d / k->prk;
            const float pr = 0.5f * d1;
            r = k->pc3 * pr;
        } else {
            r = k->pc3 * 0.0f; /* Diffusers: alpha_t * B_h * 0 */
        }
        if (x0_pred) {
            if (x0 || c->prediction_type == DITD_SCHED_PRED_SAMPLE) {
                x0_pred[e] = x0 ? mc : mo;
            } else if (c->prediction_type == DITD_SCHED_PRED_EPSILON) {
                /* noise prediction: the data prediction of the same output */
                t1 = k->s * mo;
                t2 = x_in - t1;
                x0_pred[e] = t2 / k->a;
            } else { /* v_prediction */
                t1 = k->a * x_in;
                t2 = k->s * mo;
                x0_pred[e] = t1 - t2;
            }
        }
        last[e] = x;
        m2[e] = m1[e];
        m1[e] = mc;
        sample[e] = xt_ - r;
    }
    u->last[slot] = step_index;
    return 0;
}
