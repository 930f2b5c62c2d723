/* The typed scheduler config (sched_config.c): scheduler_config.json
 * parsed once into ditd_sched_config (JSON stops at this edge), its enums
 * with their names, and the checks a sampler of each kind makes. The
 * samplers built from it: sampler.h.
 *
 * What it is not: the sampler (sampler.h), the schedule arithmetic shared
 * by the samplers (sched_math.h). */
#ifndef DITD_ENGINE_SCHED_CONFIG_H
#define DITD_ENGINE_SCHED_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- enums: each has _name() (static string, "?" if out of range) and
 * _from_str() (0, or DITD_EINVAL naming the string and the choices) ---- */

/* The samplers, listed once: enum id, name, Diffusers class. The enum,
 * _name, _class, _from_str, ditd_sampler_kind_list (CLI usage, the
 * server's messages and /v1/models) all come from this table; the unit
 * test checks proto/openapi.json's enum against it. DDIM runs eta = 0. */
#define DITD_SAMPLER_KIND_MAP(X)                                    \
    X(DDIM, "ddim", "DDIMScheduler")                                \
    X(DPMPP_2M, "dpmpp-2m", "DPMSolverMultistepScheduler")          \
    X(FLOW_EULER, "flow-euler", "FlowMatchEulerDiscreteScheduler")  \
    X(UNIPC, "unipc", "UniPCMultistepScheduler")

typedef enum ditd_sampler_kind {
#define DITD__SAMPLER_ENUM(id, name, cls) DITD_SAMPLER_##id,
    DITD_SAMPLER_KIND_MAP(DITD__SAMPLER_ENUM)
#undef DITD__SAMPLER_ENUM
} ditd_sampler_kind;
#define DITD__SAMPLER_ONE(id, name, cls) +1
#define DITD_SAMPLER_KIND_COUNT (0 DITD_SAMPLER_KIND_MAP(DITD__SAMPLER_ONE))

const char *ditd_sampler_kind_name(ditd_sampler_kind k);
/* The names joined by sep ("ddim | dpmpp-2m | flow-euler | unipc" for " | "), into
 * buf (cap bytes); returns buf. */
const char *ditd_sampler_kind_list(const char *sep, char *buf, size_t cap);
/* Accepts the names, the aliases "dpm++2m", "dpmsolver++" and "euler-flow",
 * and the Diffusers class names ("DDIMScheduler", ...). */
int ditd_sampler_kind_from_str(const char *s, ditd_sampler_kind *out);
/* The Diffusers class: "DDIMScheduler", ... */
const char *ditd_sampler_kind_class(ditd_sampler_kind k);

typedef enum ditd_sched_beta {
    DITD_SCHED_BETA_LINEAR = 0,        /* "linear" */
    DITD_SCHED_BETA_SCALED_LINEAR,     /* "scaled_linear" */
    DITD_SCHED_BETA_SQUAREDCOS_CAP_V2, /* "squaredcos_cap_v2" */
} ditd_sched_beta;
const char *ditd_sched_beta_name(ditd_sched_beta v);
int ditd_sched_beta_from_str(const char *s, ditd_sched_beta *out);

typedef enum ditd_sched_prediction {
    DITD_SCHED_PRED_EPSILON = 0, /* "epsilon" */
    DITD_SCHED_PRED_SAMPLE,      /* "sample" */
    DITD_SCHED_PRED_V,           /* "v_prediction" */
    DITD_SCHED_PRED_FLOW,        /* "flow_prediction": UniPC only (x0 = x - sigma * v) */
} ditd_sched_prediction;
const char *ditd_sched_prediction_name(ditd_sched_prediction v);
int ditd_sched_prediction_from_str(const char *s, ditd_sched_prediction *out);

typedef enum ditd_sched_spacing {
    DITD_SCHED_SPACING_LEADING = 0, /* "leading" */
    DITD_SCHED_SPACING_TRAILING,    /* "trailing" */
    DITD_SCHED_SPACING_LINSPACE,    /* "linspace" */
} ditd_sched_spacing;
const char *ditd_sched_spacing_name(ditd_sched_spacing v);
int ditd_sched_spacing_from_str(const char *s, ditd_sched_spacing *out);

/* DPM-Solver algorithm_type. The SDE variants are refused, and so is
 * "deis" (which Diffusers rewrites to "dpmsolver++" after refusing it with
 * final_sigmas_type "zero"). */
typedef enum ditd_sched_algorithm {
    DITD_SCHED_ALGO_DPMSOLVER_PP = 0, /* "dpmsolver++": data prediction */
    DITD_SCHED_ALGO_DPMSOLVER,        /* "dpmsolver": noise prediction */
} ditd_sched_algorithm;
const char *ditd_sched_algorithm_name(ditd_sched_algorithm v);
int ditd_sched_algorithm_from_str(const char *s, ditd_sched_algorithm *out);

/* solver_type. DPM-Solver takes midpoint and heun and, as Diffusers'
 * __init__ does, rewrites the UniPC / DEIS names (bh1, bh2, logrho) to
 * midpoint; UniPC takes bh1 and bh2 and rewrites midpoint, heun and logrho
 * to bh2 (at _load and _convert). */
typedef enum ditd_sched_solver {
    DITD_SCHED_SOLVER_MIDPOINT = 0, /* "midpoint" */
    DITD_SCHED_SOLVER_HEUN,         /* "heun" */
    DITD_SCHED_SOLVER_BH1,          /* "bh1": B(h) = h */
    DITD_SCHED_SOLVER_BH2,          /* "bh2": B(h) = e^h - 1 */
    DITD_SCHED_SOLVER_LOGRHO,       /* "logrho": DEIS's, rewritten by both */
} ditd_sched_solver;
const char *ditd_sched_solver_name(ditd_sched_solver v);
int ditd_sched_solver_from_str(const char *s, ditd_sched_solver *out);

typedef enum ditd_sched_final_sigmas {
    DITD_SCHED_FINAL_ZERO = 0,  /* "zero": the last step lands on sigma 0 */
    DITD_SCHED_FINAL_SIGMA_MIN, /* "sigma_min": on the training sigma at t = 0 */
} ditd_sched_final_sigmas;
const char *ditd_sched_final_sigmas_name(ditd_sched_final_sigmas v);
int ditd_sched_final_sigmas_from_str(const char *s, ditd_sched_final_sigmas *out);

/* FlowMatchEulerDiscreteScheduler time_shift_type (dynamic shifting only). */
typedef enum ditd_sched_time_shift {
    DITD_SCHED_TIME_SHIFT_EXPONENTIAL = 0, /* "exponential": e^mu / (e^mu + (1/t - 1)) */
    DITD_SCHED_TIME_SHIFT_LINEAR,          /* "linear": mu / (mu + (1/t - 1)) */
} ditd_sched_time_shift;
const char *ditd_sched_time_shift_name(ditd_sched_time_shift v);
int ditd_sched_time_shift_from_str(const char *s, ditd_sched_time_shift *out);

/* ---- the typed scheduler config ---- */

/* Every key any of the three classes reads, with that class's default when
 * the file does not set it. A field only matters to the kinds that read it
 * (noted on the right); the others carry it, as Diffusers' config carries
 * keys of compatible classes, so _convert() can hand it on. */
typedef struct ditd_sched_config {
    ditd_sampler_kind kind;          /* from _class_name */
    char source[160];                /* the file (or name) it came from, for messages */

    int num_train_timesteps;         /* all */
    double beta_start, beta_end;     /* ddim, dpm */
    ditd_sched_beta beta_schedule;   /* ddim, dpm */
    bool rescale_betas_zero_snr;     /* ddim, dpm */
    ditd_sched_prediction prediction_type; /* ddim, dpm */
    ditd_sched_spacing timestep_spacing;   /* ddim (leading), dpm (linspace) */
    int steps_offset;                /* ddim, dpm */
    bool clip_sample;                /* ddim (true) */
    double clip_sample_range;        /* ddim */
    bool set_alpha_to_one;           /* ddim */
    int solver_order;                /* dpm, unipc: 1 or 2 */
    ditd_sched_algorithm algorithm_type;   /* dpm */
    ditd_sched_solver solver_type;   /* dpm (midpoint), unipc (bh2) */
    bool lower_order_final;          /* dpm, unipc */
    bool euler_at_final;             /* dpm */
    bool use_karras_sigmas;          /* dpm (flow, unipc refuse true) */
    ditd_sched_final_sigmas final_sigmas_type; /* dpm, unipc */
    bool predict_x0;                 /* unipc: data prediction (true) or noise */
    bool use_flow_sigmas;            /* unipc: sigmas 1 -> 0 shifted by flow_shift, alpha = 1 - sigma
                                      * (dpm refuses true) */
    double flow_shift;               /* unipc with use_flow_sigmas */
    int n_disable_corrector;         /* unipc: steps whose corrector is skipped: */
    int disable_corrector[32];       /* the corrector of step i runs unless i - 1 is listed */
    double lambda_min_clipped;       /* dpm, -INFINITY by default */
    bool has_sigma_min, has_sigma_max; /* dpm karras: optional sigma bounds */
    double sigma_min, sigma_max;
    double shift;                    /* flow */
    bool has_shift_terminal;         /* flow, unipc (use_flow_sigmas): shift_terminal not null */
    double shift_terminal;
    /* flow, read only with use_dynamic_shifting true (the shift above is
     * then unused): mu = calculate_shift(image_seq_len, base_image_seq_len,
     * max_image_seq_len, base_shift, max_shift), a line through
     * (base_image_seq_len, base_shift) and (max_image_seq_len, max_shift). */
    bool has_base_shift, has_max_shift; /* not null (Diffusers allows null) */
    double base_shift, max_shift;    /* 0.5, 1.15 */
    int base_image_seq_len, max_image_seq_len; /* 256, 4096 */
    ditd_sched_time_shift time_shift_type; /* "exponential" */
    /* Not from the file: the caller sets it before ditd_sampler_new. The
     * denoiser's image token count (FLUX: (latent_h / 2) * (latent_w / 2));
     * needed (>= 1) by flow with use_dynamic_shifting, ignored otherwise.
     * 0 after _init / _load; _convert keeps base's. */
    int image_seq_len;
    /* Not from the file either: the pipeline passes its own sigmas, as
     * FluxPipeline does for every flow config (np.linspace(1, 1/steps,
     * steps), then the scheduler's static shift or time shift); false: the
     * scheduler's own set_timesteps(num_steps). Dynamic shifting always
     * takes the pipeline's sigmas. false after _init / _load. */
    bool pipeline_sigmas;

    /* Keys whose value must keep its default (true / non-null refused):
     * trained_betas, thresholding, use_exponential_sigmas, use_beta_sigmas,
     * use_lu_lambdas, variance_type, use_dynamic_shifting (except for flow,
     * which runs it), invert_sigmas, stochastic_sampling, solver_p. */
    bool trained_betas, thresholding, use_exponential_sigmas, use_beta_sigmas,
        use_lu_lambdas, variance_type, use_dynamic_shifting,
        invert_sigmas, stochastic_sampling, solver_p;

    /* Opaque bookkeeping for _convert() and the checks: which keys the file
     * set (Diffusers' config minus its _use_default_values), which held a
     * value ditd cannot take, and that value's text. */
    uint64_t given, bad;
    char bad_text[4][72];
} ditd_sched_config;

/* The defaults of `kind`'s Diffusers class (its __init__ signature). */
void ditd_sched_config_init(ditd_sched_config *c, ditd_sampler_kind kind);

/* Parses scheduler_config.json at `path`: _class_name picks the kind (an
 * unknown or missing class is DITD_EUNSUPPORTED naming it); keys the kind
 * reads are checked now, other known keys are kept for _convert(), unknown
 * keys are ignored (as Diffusers ignores them). Python's JSON extensions
 * NaN, Infinity and -Infinity are accepted as numbers (Diffusers writes
 * "lambda_min_clipped": -Infinity). Errors: DITD_ENOENT / DITD_EIO (the
 * file), DITD_EFORMAT (not a JSON object), DITD_EUNSUPPORTED (a class or
 * value ditd does not support; the detail names the file, the key, the
 * value and what is supported). On error *out is undefined. */
int ditd_sched_config_load(const char *path, ditd_sched_config *out);

/* The same over text in memory; `name` stands for the path in messages. */
int ditd_sched_config_parse(const char *text, size_t len, const char *name,
                            ditd_sched_config *out);

/* Diffusers' Target.from_config(base.config): the keys the base file set
 * that `kind`'s class also reads carry over, every other key takes the
 * target class's default (a key base only defaulted does not carry: the
 * DDIM default timestep_spacing "leading" does not reach a DPM-Solver,
 * which keeps its "linspace"). Checks the result for `kind`
 * (DITD_EUNSUPPORTED as _load). `out` may equal `base`. */
int ditd_sched_config_convert(const ditd_sched_config *base, ditd_sampler_kind kind,
                              ditd_sched_config *out);

/* Checks that `c` is something a sampler of c->kind can run (the same check
 * _load and _convert make; for configs built by hand). */
int ditd_sched_config_check(const ditd_sched_config *c);

#endif
