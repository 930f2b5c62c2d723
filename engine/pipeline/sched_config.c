/* The typed scheduler config the samplers are built from: Diffusers'
 * scheduler_config.json for DDIMScheduler, DPMSolverMultistepScheduler,
 * FlowMatchEulerDiscreteScheduler and UniPCMultistepScheduler (diffusers
 * 0.42), every key read, values
 * checked, unsupported ones refused naming key and value; the sampler names
 * (one X-macro in sampler.h); from_config conversion between classes.
 *
 * What it is not: the schedules and the steps (engine/pipeline/sampler.c).
 */
#include "engine/pipeline/sched_config.h"

#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "engine/core/error.h"
#include "engine/io/json_config.h"
#include "engine/pipeline/sched_math.h"

#define MAX_TRAIN_TIMESTEPS 100000
#define MAX_CONFIG_BYTES (1u << 20)

/* ---- enums ---------------------------------------------------------- */

#define COUNT_OF(a) ((int)(sizeof(a) / sizeof((a)[0])))

#define KIND_NAME(id, name, cls) name,
#define KIND_CLASS(id, name, cls) cls,
static const char *const kind_names[] = {DITD_SAMPLER_KIND_MAP(KIND_NAME)};
static const char *const kind_classes[] = {DITD_SAMPLER_KIND_MAP(KIND_CLASS)};
#undef KIND_NAME
#undef KIND_CLASS
static const char *const beta_names[] = {"linear", "scaled_linear", "squaredcos_cap_v2"};
static const char *const pred_names[] = {"epsilon", "sample", "v_prediction", "flow_prediction"};
static const char *const spacing_names[] = {"leading", "trailing", "linspace"};
static const char *const algo_names[] = {"dpmsolver++", "dpmsolver"};
static const char *const solver_names[] = {"midpoint", "heun", "bh1", "bh2", "logrho"};
static const char *const final_names[] = {"zero", "sigma_min"};
static const char *const time_shift_names[] = {"exponential", "linear"};

static const char *enum_name(const char *const *names, int count, int v)
{
    return v >= 0 && v < count ? names[v] : "?";
}

/* "a, b, c" of a name table, for messages. */
static const char *choices(const char *const *names, int count, char *buf, size_t len)
{
    size_t used = 0;
    buf[0] = '\0';
    for (int i = 0; i < count && used < len; i++)
        used += (size_t)snprintf(buf + used, len - used, "%s%s", i ? ", " : "", names[i]);
    return buf;
}

static int enum_find(const char *const *names, int count, const char *s)
{
    for (int i = 0; s && i < count; i++)
        if (strcmp(names[i], s) == 0)
            return i;
    return -1;
}

static int enum_from_str(const char *what, const char *const *names, int count, const char *s,
                         int *out)
{
    int v = enum_find(names, count, s);
    if (v < 0) {
        char buf[160];
        return ditd_err_set(DITD_EINVAL, "%s \"%.64s\" is not one of %s", what, s ? s : "(null)",
                            choices(names, count, buf, sizeof buf));
    }
    *out = v;
    return 0;
}

#define DEFINE_ENUM(prefix, type, what, names)                                                  \
    const char *prefix##_name(type v) { return enum_name(names, COUNT_OF(names), (int)v); }    \
    int prefix##_from_str(const char *s, type *out)                                            \
    {                                                                                          \
        int v = 0, err = enum_from_str(what, names, COUNT_OF(names), s, &v);                       \
        if (!err)                                                                              \
            *out = (type)v;                                                                    \
        return err;                                                                            \
    }

DEFINE_ENUM(ditd_sched_beta, ditd_sched_beta, "beta_schedule", beta_names)
DEFINE_ENUM(ditd_sched_prediction, ditd_sched_prediction, "prediction_type", pred_names)
DEFINE_ENUM(ditd_sched_spacing, ditd_sched_spacing, "timestep_spacing", spacing_names)
DEFINE_ENUM(ditd_sched_algorithm, ditd_sched_algorithm, "algorithm_type", algo_names)
DEFINE_ENUM(ditd_sched_solver, ditd_sched_solver, "solver_type", solver_names)
DEFINE_ENUM(ditd_sched_final_sigmas, ditd_sched_final_sigmas, "final_sigmas_type", final_names)
DEFINE_ENUM(ditd_sched_time_shift, ditd_sched_time_shift, "time_shift_type", time_shift_names)

const char *ditd_sampler_kind_name(ditd_sampler_kind k)
{
    return enum_name(kind_names, COUNT_OF(kind_names), (int)k);
}

const char *ditd_sampler_kind_list(const char *sep, char *buf, size_t cap)
{
    size_t used = 0;
    if (!cap)
        return buf;
    buf[0] = '\0';
    for (int i = 0; i < COUNT_OF(kind_names) && used < cap; i++)
        used += (size_t)snprintf(buf + used, cap - used, "%s%s", i ? sep : "", kind_names[i]);
    return buf;
}

const char *ditd_sampler_kind_class(ditd_sampler_kind k)
{
    return enum_name(kind_classes, COUNT_OF(kind_classes), (int)k);
}

int ditd_sampler_kind_from_str(const char *s, ditd_sampler_kind *out)
{
    static const struct {
        const char *name;
        ditd_sampler_kind kind;
    } aliases[] = {
        {"dpm++2m", DITD_SAMPLER_DPMPP_2M},
        {"dpmsolver++", DITD_SAMPLER_DPMPP_2M},
        {"euler-flow", DITD_SAMPLER_FLOW_EULER},
    };
    int v = enum_find(kind_names, COUNT_OF(kind_names), s);
    if (v < 0)
        v = enum_find(kind_classes, COUNT_OF(kind_classes), s);
    for (int i = 0; v < 0 && s && i < COUNT_OF(aliases); i++)
        if (strcmp(aliases[i].name, s) == 0)
            v = (int)aliases[i].kind;
    if (v < 0) {
        char list[256];
        return ditd_err_set(DITD_EINVAL,
                            "sampler \"%.64s\" is not one of %s (or the aliases dpm++2m, "
                            "dpmsolver++, euler-flow, or a Diffusers class name)",
                            s ? s : "(null)", ditd_sampler_kind_list(", ", list, sizeof list));
    }
    *out = (ditd_sampler_kind)v;
    return 0;
}

/* ---- config keys ------------------------------------------------------ */

/* Which classes read a key (bits of ditd_sampler_kind); 0 = none: a key
 * Diffusers only keeps in the config (sigma_min / sigma_max), which
 * DPM-Solver's Karras conversion looks up with hasattr(). */
#define C_DDIM (1u << DITD_SAMPLER_DDIM)
#define C_DPM (1u << DITD_SAMPLER_DPMPP_2M)
#define C_FLOW (1u << DITD_SAMPLER_FLOW_EULER)
#define C_UNIPC (1u << DITD_SAMPLER_UNIPC)
#define C_VP (C_DDIM | C_DPM | C_UNIPC) /* the classes with a beta schedule */

typedef enum key_type {
    T_INT,       /* int */
    T_NUM,       /* double; also Python's NaN / Infinity / -Infinity */
    T_BOOL,      /* bool */
    T_OFF,       /* bool that must stay false; null reads as false */
    T_NOTNULL,   /* bool "a value other than null was given"; must stay false */
    T_OPTNUM,    /* has-flag + double; null clears the flag */
    T_ENUM,      /* enum, through parse_enum() */
    T_INTLIST,   /* a list of up to 32 integers; off2 holds the count */
} key_type;

typedef struct key_def {
    const char *name;
    key_type type;
    unsigned classes;
    size_t off, size;   /* the field */
    size_t off2, size2; /* the has-flag of T_OPTNUM */
} key_def;

#define F(field) offsetof(ditd_sched_config, field), sizeof(((ditd_sched_config *)0)->field), 0, 0
#define F2(has, field)                                                                         \
    offsetof(ditd_sched_config, field), sizeof(((ditd_sched_config *)0)->field),               \
        offsetof(ditd_sched_config, has), sizeof(((ditd_sched_config *)0)->has)

enum {
    K_NUM_TRAIN, K_BETA_START, K_BETA_END, K_BETA_SCHEDULE, K_TRAINED_BETAS, K_RESCALE,
    K_PREDICTION, K_SPACING, K_STEPS_OFFSET, K_THRESHOLDING, K_CLIP_SAMPLE, K_CLIP_RANGE,
    K_SET_ALPHA_ONE, K_SOLVER_ORDER, K_ALGORITHM, K_SOLVER_TYPE, K_LOWER_ORDER_FINAL,
    K_EULER_AT_FINAL, K_KARRAS, K_EXP_SIGMAS, K_BETA_SIGMAS, K_LU_LAMBDAS, K_FLOW_SIGMAS,
    K_FINAL_SIGMAS, K_LAMBDA_MIN_CLIPPED, K_VARIANCE_TYPE, K_DYNAMIC_SHIFTING, K_SHIFT,
    K_SHIFT_TERMINAL, K_INVERT_SIGMAS, K_STOCHASTIC, K_SIGMA_MIN, K_SIGMA_MAX, K_BASE_SHIFT,
    K_MAX_SHIFT, K_BASE_SEQ_LEN, K_MAX_SEQ_LEN, K_TIME_SHIFT, K_PREDICT_X0, K_FLOW_SHIFT,
    K_DISABLE_CORRECTOR, K_SOLVER_P, K__COUNT
};

static const key_def keys[K__COUNT] = {
    [K_NUM_TRAIN] = {"num_train_timesteps", T_INT, C_VP | C_FLOW, F(num_train_timesteps)},
    [K_BETA_START] = {"beta_start", T_NUM, C_VP, F(beta_start)},
    [K_BETA_END] = {"beta_end", T_NUM, C_VP, F(beta_end)},
    [K_BETA_SCHEDULE] = {"beta_schedule", T_ENUM, C_VP, F(beta_schedule)},
    [K_TRAINED_BETAS] = {"trained_betas", T_NOTNULL, C_VP, F(trained_betas)},
    [K_RESCALE] = {"rescale_betas_zero_snr", T_BOOL, C_VP, F(rescale_betas_zero_snr)},
    [K_PREDICTION] = {"prediction_type", T_ENUM, C_VP, F(prediction_type)},
    [K_SPACING] = {"timestep_spacing", T_ENUM, C_VP, F(timestep_spacing)},
    [K_STEPS_OFFSET] = {"steps_offset", T_INT, C_VP, F(steps_offset)},
    [K_THRESHOLDING] = {"thresholding", T_OFF, C_VP, F(thresholding)},
    [K_CLIP_SAMPLE] = {"clip_sample", T_BOOL, C_DDIM, F(clip_sample)},
    [K_CLIP_RANGE] = {"clip_sample_range", T_NUM, C_DDIM, F(clip_sample_range)},
    [K_SET_ALPHA_ONE] = {"set_alpha_to_one", T_BOOL, C_DDIM, F(set_alpha_to_one)},
    [K_SOLVER_ORDER] = {"solver_order", T_INT, C_DPM | C_UNIPC, F(solver_order)},
    [K_ALGORITHM] = {"algorithm_type", T_ENUM, C_DPM, F(algorithm_type)},
    [K_SOLVER_TYPE] = {"solver_type", T_ENUM, C_DPM | C_UNIPC, F(solver_type)},
    [K_LOWER_ORDER_FINAL] = {"lower_order_final", T_BOOL, C_DPM | C_UNIPC, F(lower_order_final)},
    [K_EULER_AT_FINAL] = {"euler_at_final", T_BOOL, C_DPM, F(euler_at_final)},
    [K_KARRAS] = {"use_karras_sigmas", T_BOOL, C_DPM | C_FLOW | C_UNIPC, F(use_karras_sigmas)},
    [K_EXP_SIGMAS] = {"use_exponential_sigmas", T_OFF, C_DPM | C_FLOW | C_UNIPC,
                      F(use_exponential_sigmas)},
    [K_BETA_SIGMAS] = {"use_beta_sigmas", T_OFF, C_DPM | C_FLOW | C_UNIPC, F(use_beta_sigmas)},
    [K_LU_LAMBDAS] = {"use_lu_lambdas", T_OFF, C_DPM, F(use_lu_lambdas)},
    [K_FLOW_SIGMAS] = {"use_flow_sigmas", T_BOOL, C_DPM | C_UNIPC, F(use_flow_sigmas)},
    [K_FINAL_SIGMAS] = {"final_sigmas_type", T_ENUM, C_DPM | C_UNIPC, F(final_sigmas_type)},
    [K_LAMBDA_MIN_CLIPPED] = {"lambda_min_clipped", T_NUM, C_DPM, F(lambda_min_clipped)},
    [K_VARIANCE_TYPE] = {"variance_type", T_NOTNULL, C_DPM, F(variance_type)},
    [K_DYNAMIC_SHIFTING] = {"use_dynamic_shifting", T_OFF, C_DPM | C_FLOW | C_UNIPC,
                            F(use_dynamic_shifting)},
    [K_SHIFT] = {"shift", T_NUM, C_FLOW, F(shift)},
    [K_SHIFT_TERMINAL] = {"shift_terminal", T_OPTNUM, C_FLOW | C_UNIPC,
                          F2(has_shift_terminal, shift_terminal)},
    [K_INVERT_SIGMAS] = {"invert_sigmas", T_OFF, C_FLOW, F(invert_sigmas)},
    [K_STOCHASTIC] = {"stochastic_sampling", T_OFF, C_FLOW, F(stochastic_sampling)},
    [K_SIGMA_MIN] = {"sigma_min", T_OPTNUM, 0, F2(has_sigma_min, sigma_min)},
    [K_SIGMA_MAX] = {"sigma_max", T_OPTNUM, 0, F2(has_sigma_max, sigma_max)},
    [K_BASE_SHIFT] = {"base_shift", T_OPTNUM, C_FLOW, F2(has_base_shift, base_shift)},
    [K_MAX_SHIFT] = {"max_shift", T_OPTNUM, C_FLOW, F2(has_max_shift, max_shift)},
    [K_BASE_SEQ_LEN] = {"base_image_seq_len", T_INT, C_FLOW, F(base_image_seq_len)},
    [K_MAX_SEQ_LEN] = {"max_image_seq_len", T_INT, C_FLOW, F(max_image_seq_len)},
    [K_TIME_SHIFT] = {"time_shift_type", T_ENUM, C_FLOW | C_UNIPC, F(time_shift_type)},
    [K_PREDICT_X0] = {"predict_x0", T_BOOL, C_UNIPC, F(predict_x0)},
    [K_FLOW_SHIFT] = {"flow_shift", T_NUM, C_UNIPC, F(flow_shift)},
    [K_DISABLE_CORRECTOR] = {"disable_corrector", T_INTLIST, C_UNIPC,
                             F2(n_disable_corrector, disable_corrector)},
    [K_SOLVER_P] = {"solver_p", T_NOTNULL, C_UNIPC, F(solver_p)},
};

#define KEY_BIT(k) ((uint64_t)1 << (k))

void ditd_sched_config_init(ditd_sched_config *c, ditd_sampler_kind kind)
{
    memset(c, 0, sizeof *c);
    c->kind = kind;
    snprintf(c->source, sizeof c->source, "%s", ditd_sampler_kind_class(kind));
    c->num_train_timesteps = 1000;
    c->beta_start = 0.0001;
    c->beta_end = 0.02;
    c->beta_schedule = DITD_SCHED_BETA_LINEAR;
    c->prediction_type = DITD_SCHED_PRED_EPSILON;
    /* Diffusers: DDIM defaults to "leading", DPM-Solver to "linspace". */
    c->timestep_spacing =
        kind == DITD_SAMPLER_DDIM ? DITD_SCHED_SPACING_LEADING : DITD_SCHED_SPACING_LINSPACE;
    c->steps_offset = 0;
    c->clip_sample = true;
    c->clip_sample_range = 1.0;
    c->set_alpha_to_one = true;
    c->solver_order = 2;
    c->algorithm_type = DITD_SCHED_ALGO_DPMSOLVER_PP;
    c->solver_type = kind == DITD_SAMPLER_UNIPC ? DITD_SCHED_SOLVER_BH2 : DITD_SCHED_SOLVER_MIDPOINT;
    c->predict_x0 = true;
    c->use_flow_sigmas = false;
    c->flow_shift = 1.0;
    c->lower_order_final = true;
    c->euler_at_final = false;
    c->use_karras_sigmas = false;
    c->final_sigmas_type = DITD_SCHED_FINAL_ZERO;
    c->lambda_min_clipped = -INFINITY;
    c->shift = 1.0;
    c->has_base_shift = c->has_max_shift = true;
    c->base_shift = 0.5;
    c->max_shift = 1.15;
    c->base_image_seq_len = 256;
    c->max_image_seq_len = 4096;
    c->time_shift_type = DITD_SCHED_TIME_SHIFT_EXPONENTIAL;
}

/* Remembers that key k held a value ditd cannot take, with its text. */
static void mark_bad(ditd_sched_config *c, int k, const json_t *v)
{
    c->bad |= KEY_BIT(k);
    for (int i = 0; i < COUNT_OF(c->bad_text); i++) {
        if (c->bad_text[i][0] == '\0') {
            char *txt = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
            snprintf(c->bad_text[i], sizeof c->bad_text[i], "%s %.48s%s", keys[k].name,
                     txt ? txt : "?", txt && strlen(txt) > 48 ? "..." : "");
            free(txt);
            return;
        }
    }
}

static bool parse_enum(int k, const char *s, ditd_sched_config *c)
{
    int v;
    switch (k) {
    case K_BETA_SCHEDULE:
        if ((v = enum_find(beta_names, COUNT_OF(beta_names), s)) < 0)
            return false;
        c->beta_schedule = (ditd_sched_beta)v;
        return true;
    case K_PREDICTION:
        if ((v = enum_find(pred_names, COUNT_OF(pred_names), s)) < 0)
            return false;
        c->prediction_type = (ditd_sched_prediction)v;
        return true;
    case K_SPACING:
        if ((v = enum_find(spacing_names, COUNT_OF(spacing_names), s)) < 0)
            return false;
        c->timestep_spacing = (ditd_sched_spacing)v;
        return true;
    case K_ALGORITHM:
        if ((v = enum_find(algo_names, COUNT_OF(algo_names), s)) < 0)
            return false;
        c->algorithm_type = (ditd_sched_algorithm)v;
        return true;
    case K_SOLVER_TYPE:
        if ((v = enum_find(solver_names, COUNT_OF(solver_names), s)) < 0)
            return false;
        c->solver_type = (ditd_sched_solver)v;
        return true;
    case K_FINAL_SIGMAS:
        if ((v = enum_find(final_names, COUNT_OF(final_names), s)) < 0)
            return false;
        c->final_sigmas_type = (ditd_sched_final_sigmas)v;
        return true;
    case K_TIME_SHIFT:
        if ((v = enum_find(time_shift_names, COUNT_OF(time_shift_names), s)) < 0)
            return false;
        c->time_shift_type = (ditd_sched_time_shift)v;
        return true;
    default:
        return false;
    }
}

/* A JSON number, or one of the strings our pre-pass made of Python's bare
 * NaN / Infinity / -Infinity. */
static bool json_to_double(const json_t *v, double *out)
{
    if (json_is_number(v)) {
        *out = json_number_value(v);
        return true;
    }
    if (json_is_string(v)) {
        const char *s = json_string_value(v);
        if (!strcmp(s, "Infinity")) *out = INFINITY;
        else if (!strcmp(s, "-Infinity")) *out = -INFINITY;
        else if (!strcmp(s, "NaN")) *out = NAN;
        else return false;
        return true;
    }
    return false;
}

/* Reads one known key into c; a value of the wrong type or outside the
 * enum is marked bad (an error only for a kind that reads the key). */
static void parse_key(int k, const json_t *v, ditd_sched_config *c)
{
    const key_def *kd = &keys[k];
    char *field = (char *)c + kd->off;
    double d;
    c->given |= KEY_BIT(k);
    switch (kd->type) {
    case T_INT:
        if (json_is_integer(v) && json_integer_value(v) >= -MAX_TRAIN_TIMESTEPS &&
            json_integer_value(v) <= MAX_TRAIN_TIMESTEPS) {
            *(int *)field = (int)json_integer_value(v);
            return;
        }
        if (json_is_real(v)) {
            d = json_real_value(v);
            if (d == floor(d) && fabs(d) <= MAX_TRAIN_TIMESTEPS) {
                *(int *)field = (int)d;
                return;
            }
        }
        break;
    case T_NUM:
        if (json_to_double(v, &d)) {
            *(double *)field = d;
            return;
        }
        break;
    case T_BOOL:
        if (json_is_boolean(v)) {
            *(bool *)field = json_is_true(v);
            return;
        }
        break;
    case T_OFF:
        if (json_is_boolean(v) || json_is_null(v)) {
            *(bool *)field = json_is_true(v);
            return;
        }
        break;
    case T_NOTNULL:
        *(bool *)field = !json_is_null(v);
        return;
    case T_OPTNUM:
        if (json_is_null(v)) {
            *(bool *)((char *)c + kd->off2) = false;
            return;
        }
        if (json_to_double(v, &d)) {
            *(double *)field = d;
            *(bool *)((char *)c + kd->off2) = true;
            return;
        }
        break;
    case T_ENUM:
        if (json_is_string(v) && parse_enum(k, json_string_value(v), c))
            return;
        break;
    case T_INTLIST: {
        int *list = (int *)field, *count = (int *)((char *)c + kd->off2);
        const size_t cap = kd->size / sizeof(int);
        if (!json_is_array(v) || json_array_size(v) > cap)
            break;
        size_t i;
        const json_t *e;
        json_array_foreach(v, i, e) {
            if (!json_is_integer(e) || json_integer_value(e) < -MAX_TRAIN_TIMESTEPS ||
                json_integer_value(e) > MAX_TRAIN_TIMESTEPS)
                goto bad;
            list[i] = (int)json_integer_value(e);
        }
        *count = (int)json_array_size(v);
        return;
    }
    }
bad:
    mark_bad(c, k, v);
}

/* ---- checks ----------------------------------------------------------- */

static const char *bad_value_text(const ditd_sched_config *c, int k)
{
    size_t n = strlen(keys[k].name);
    for (int i = 0; i < COUNT_OF(c->bad_text); i++)
        if (!strncmp(c->bad_text[i], keys[k].name, n) && c->bad_text[i][n] == ' ')
            return c->bad_text[i];
    return keys[k].name;
}

static const char *key_choices(int k, char *buf, size_t len)
{
    switch (k) {
    case K_BETA_SCHEDULE: return choices(beta_names, COUNT_OF(beta_names), buf, len);
    case K_PREDICTION: return choices(pred_names, COUNT_OF(pred_names), buf, len);
    case K_SPACING: return choices(spacing_names, COUNT_OF(spacing_names), buf, len);
    case K_ALGORITHM: return "dpmsolver++, dpmsolver";
    case K_SOLVER_TYPE: return "midpoint, heun (DPM-Solver); bh1, bh2 (UniPC); logrho";
    case K_FINAL_SIGMAS: return choices(final_names, COUNT_OF(final_names), buf, len);
    case K_TIME_SHIFT: return choices(time_shift_names, COUNT_OF(time_shift_names), buf, len);
    default: break;
    }
    switch (keys[k].type) {
    case T_INT: return "an integer";
    case T_NUM: return "a number";
    case T_BOOL: return "true, false";
    case T_OFF: return "false";
    case T_NOTNULL: return "null";
    case T_OPTNUM: return "a number or null";
    case T_INTLIST: return "a list of at most 32 integers";
    default: return "?";
    }
}

static int unsupported(const ditd_sched_config *c, const char *what, const char *supported)
{
    return ditd_err_set(DITD_EUNSUPPORTED, "%s: %s is not supported by %s (%s)", c->source, what,
                        ditd_sampler_kind_class(c->kind), supported);
}

int ditd_sched_config_check(const ditd_sched_config *c)
{
    char what[128], buf[128];
    if ((unsigned)c->kind >= DITD_SAMPLER_KIND_COUNT)
        return ditd_err_set(DITD_EINVAL, "%s: sampler kind %d", c->source, (int)c->kind);
    const unsigned cls = 1u << c->kind;

    for (int k = 0; k < K__COUNT; k++) {
        if (!(keys[k].classes & cls))
            continue;
        if (c->bad & KEY_BIT(k))
            return unsupported(c, bad_value_text(c, k), key_choices(k, buf, sizeof buf));
        /* Keys that must keep their default. */
        bool on = (keys[k].type == T_OFF || keys[k].type == T_NOTNULL) &&
                  *(const bool *)((const char *)c + keys[k].off) &&
                  !(k == K_DYNAMIC_SHIFTING && c->kind == DITD_SAMPLER_FLOW_EULER);
        if (on) {
            snprintf(what, sizeof what, "%s %s", keys[k].name,
                     keys[k].type == T_OFF ? "true" : "(not null)");
            return unsupported(c, what, key_choices(k, buf, sizeof buf));
        }
    }

#define RANGE(cond, k, fmt, val, supported)                                                    \
    do {                                                                                       \
        if (!(cond)) {                                                                         \
            snprintf(what, sizeof what, "%s " fmt, keys[k].name, val);                         \
            return unsupported(c, what, supported);                                            \
        }                                                                                      \
    } while (0)

    int lo = c->kind == DITD_SAMPLER_FLOW_EULER ? 1 : 2;
    RANGE(c->num_train_timesteps >= lo && c->num_train_timesteps <= MAX_TRAIN_TIMESTEPS,
          K_NUM_TRAIN, "%d", c->num_train_timesteps,
          c->kind == DITD_SAMPLER_FLOW_EULER ? "1..100000" : "2..100000");

    if (c->kind != DITD_SAMPLER_FLOW_EULER) {
        if (c->beta_schedule != DITD_SCHED_BETA_SQUAREDCOS_CAP_V2) {
            RANGE(c->beta_start >= 0 && c->beta_start < 1, K_BETA_START, "%g", c->beta_start,
                  "0 <= beta_start < 1");
            RANGE(c->beta_end >= 0 && c->beta_end < 1, K_BETA_END, "%g", c->beta_end,
                  "0 <= beta_end < 1");
        }
        RANGE(c->steps_offset >= 0 && c->steps_offset < c->num_train_timesteps, K_STEPS_OFFSET,
              "%d", c->steps_offset, "0 <= steps_offset < num_train_timesteps");
    }
    if ((c->kind == DITD_SAMPLER_DDIM || c->kind == DITD_SAMPLER_DPMPP_2M) &&
        c->prediction_type == DITD_SCHED_PRED_FLOW)
        return unsupported(c, "prediction_type \"flow_prediction\"",
                           c->kind == DITD_SAMPLER_DDIM
                               ? "epsilon, sample, v_prediction"
                               : "epsilon, sample, v_prediction; flow_prediction needs "
                                 "use_flow_sigmas, which ditd's DPM-Solver does not run");
    if (c->kind == DITD_SAMPLER_DDIM && c->clip_sample)
        RANGE(c->clip_sample_range > 0 && isfinite(c->clip_sample_range), K_CLIP_RANGE, "%g",
              c->clip_sample_range, "a finite number > 0");
    if (c->kind == DITD_SAMPLER_DPMPP_2M) {
        RANGE(c->solver_order == 1 || c->solver_order == 2, K_SOLVER_ORDER, "%d", c->solver_order,
              "1, 2");
        if (c->use_flow_sigmas)
            return unsupported(c, "use_flow_sigmas true", "false");
        RANGE(c->solver_type == DITD_SCHED_SOLVER_MIDPOINT || c->solver_type == DITD_SCHED_SOLVER_HEUN,
              K_SOLVER_TYPE, "\"%s\"", ditd_sched_solver_name(c->solver_type), "midpoint, heun");
        RANGE(!isnan(c->lambda_min_clipped), K_LAMBDA_MIN_CLIPPED, "%g", c->lambda_min_clipped,
              "a number");
        if (c->algorithm_type == DITD_SCHED_ALGO_DPMSOLVER &&
            c->final_sigmas_type == DITD_SCHED_FINAL_ZERO)
            return unsupported(c, "final_sigmas_type \"zero\" with algorithm_type \"dpmsolver\"",
                               "sigma_min");
        if (c->use_karras_sigmas && c->has_sigma_min)
            RANGE(c->sigma_min > 0 && isfinite(c->sigma_min), K_SIGMA_MIN, "%g", c->sigma_min,
                  "a finite number > 0");
        if (c->use_karras_sigmas && c->has_sigma_max)
            RANGE(c->sigma_max > 0 && isfinite(c->sigma_max), K_SIGMA_MAX, "%g", c->sigma_max,
                  "a finite number > 0");
    }
    if (c->kind == DITD_SAMPLER_FLOW_EULER) {
        RANGE(c->shift > 0 && isfinite(c->shift), K_SHIFT, "%g", c->shift, "a finite number > 0");
        if (c->has_shift_terminal)
            RANGE(c->shift_terminal >= 0 && c->shift_terminal < 1, K_SHIFT_TERMINAL, "%g",
                  c->shift_terminal, "null or 0 <= shift_terminal < 1");
        if (c->use_karras_sigmas)
            return unsupported(c, "use_karras_sigmas true", "false");
        if (c->use_dynamic_shifting) {
            /* Diffusers takes these as they come (null fails in
             * calculate_shift; equal lengths divide by zero). */
            RANGE(c->has_base_shift && isfinite(c->base_shift), K_BASE_SHIFT, "%s",
                  c->has_base_shift ? "(not finite)" : "null",
                  "a finite number with use_dynamic_shifting true");
            RANGE(c->has_max_shift && isfinite(c->max_shift), K_MAX_SHIFT, "%s",
                  c->has_max_shift ? "(not finite)" : "null",
                  "a finite number with use_dynamic_shifting true");
            RANGE(c->max_image_seq_len != c->base_image_seq_len, K_MAX_SEQ_LEN, "%d",
                  c->max_image_seq_len, "a length other than base_image_seq_len");
        }
    }
    if (c->kind == DITD_SAMPLER_UNIPC) {
        RANGE(c->solver_order == 1 || c->solver_order == 2, K_SOLVER_ORDER, "%d", c->solver_order,
              "1, 2");
        RANGE(c->solver_type == DITD_SCHED_SOLVER_BH1 || c->solver_type == DITD_SCHED_SOLVER_BH2,
              K_SOLVER_TYPE, "\"%s\"", ditd_sched_solver_name(c->solver_type), "bh1, bh2");
        if (c->use_karras_sigmas)
            return unsupported(c, "use_karras_sigmas true", "false");
        if (c->prediction_type == DITD_SCHED_PRED_FLOW && !c->predict_x0)
            return unsupported(c, "prediction_type \"flow_prediction\" with predict_x0 false",
                               "predict_x0 true; Diffusers raises here too");
        if (c->has_shift_terminal && !c->use_flow_sigmas)
            return unsupported(c, "shift_terminal without use_flow_sigmas",
                               "null; Diffusers raises here too");
        if (c->use_flow_sigmas) {
            RANGE(c->flow_shift > 0 && isfinite(c->flow_shift), K_FLOW_SHIFT, "%g", c->flow_shift,
                  "a finite number > 0");
            if (c->has_shift_terminal)
                RANGE(c->shift_terminal >= 0 && c->shift_terminal < 1, K_SHIFT_TERMINAL, "%g",
                      c->shift_terminal, "null or 0 <= shift_terminal < 1");
        }
    }
#undef RANGE
    return 0;
}

/* Diffusers' __init__ rewrites solver_type names of the other multistep
 * solvers: DPM-Solver takes bh1 / bh2 / logrho as midpoint, UniPC takes
 * midpoint / heun / logrho as bh2 (what from_config between them gives). */
static void normalize(ditd_sched_config *c)
{
    if (c->kind == DITD_SAMPLER_DPMPP_2M && c->solver_type != DITD_SCHED_SOLVER_MIDPOINT &&
        c->solver_type != DITD_SCHED_SOLVER_HEUN)
        c->solver_type = DITD_SCHED_SOLVER_MIDPOINT;
    if (c->kind == DITD_SAMPLER_UNIPC && c->solver_type != DITD_SCHED_SOLVER_BH1 &&
        c->solver_type != DITD_SCHED_SOLVER_BH2)
        c->solver_type = DITD_SCHED_SOLVER_BH2;
}

/* ---- parsing ------------------------------------------------------------ */

/* Python's json writes NaN, Infinity and -Infinity bare (Diffusers saves
 * "lambda_min_clipped": -Infinity); jansson refuses them. Outside strings,
 * quote them, so they parse as strings that json_to_double() reads.
 * Returns a malloc'd NUL-terminated copy, or NULL on OOM. */
static char *quote_python_specials(const char *text, size_t len, size_t *out_len)
{
    static const char *const words[] = {"-Infinity", "Infinity", "NaN"};
    char *out = malloc(len * 2 + 1); /* each word grows by 2 chars, and is >= 3 long */
    if (!out)
        return NULL;
    size_t o = 0;
    bool in_str = false;
    for (size_t i = 0; i < len;) {
        char ch = text[i];
        if (in_str) {
            out[o++] = ch;
            i++;
            if (ch == '\\' && i < len)
                out[o++] = text[i++];
            else if (ch == '"')
                in_str = false;
            continue;
        }
        if (ch == '"') {
            in_str = true;
            out[o++] = text[i++];
            continue;
        }
        bool done = false;
        for (int w = 0; w < COUNT_OF(words) && !done; w++) {
            size_t wl = strlen(words[w]);
            if (len - i >= wl && !memcmp(text + i, words[w], wl)) {
                out[o++] = '"';
                memcpy(out + o, words[w], wl);
                o += wl;
                out[o++] = '"';
                i += wl;
                done = true;
            }
        }
        if (!done)
            out[o++] = text[i++];
    }
    out[o] = '\0';
    *out_len = o;
    return out;
}

static int from_root(json_t *root, const char *name, ditd_sched_config *out);

int ditd_sched_config_parse(const char *text, size_t len, const char *name, ditd_sched_config *out)
{
    int err;
    json_error_t jerr;
    size_t qlen;
    char *q = quote_python_specials(text, len, &qlen);
    if (!q)
        return ditd_err_set(DITD_ENOMEM, "%s: out of memory", name);
    json_t *root = json_loadb(q, qlen, 0, &jerr);
    free(q);
    if (!root)
        return ditd_err_set(DITD_EFORMAT, "%s: line %d: %s", name, jerr.line, jerr.text);
    err = from_root(root, name, out);
    json_decref(root);
    return err;
}

/* The scheduler's keys from the parsed file (shared: read only). */
static int from_root(json_t *root, const char *name, ditd_sched_config *out)
{
    if (!json_is_object(root))
        return ditd_err_set(DITD_EFORMAT, "%s: not a JSON object", name);

    const json_t *cls = json_object_get(root, "_class_name");
    ditd_sampler_kind kind = DITD_SAMPLER_DDIM;
    int v = json_is_string(cls)
                ? enum_find(kind_classes, COUNT_OF(kind_classes), json_string_value(cls))
                : -1;
    if (v < 0) {
        char *txt = cls ? json_dumps(cls, JSON_ENCODE_ANY) : NULL;
        int err = ditd_err_set(DITD_EUNSUPPORTED,
                               "%s: _class_name %.80s is not supported (DDIMScheduler, "
                               "DPMSolverMultistepScheduler, FlowMatchEulerDiscreteScheduler, "
                               "UniPCMultistepScheduler)",
                               name, txt ? txt : "(missing)");
        free(txt);
        return err;
    }
    kind = (ditd_sampler_kind)v;

    ditd_sched_config_init(out, kind);
    snprintf(out->source, sizeof out->source, "%s", name);
    for (int k = 0; k < K__COUNT; k++) {
        const json_t *val = json_object_get(root, keys[k].name);
        if (val)
            parse_key(k, val, out);
    }
    normalize(out);
    return ditd_sched_config_check(out);
}

/* Through the config cache (engine/io/json_config.h): a folder's scheduler
 * config is parsed once, however many pipelines read it. */
int ditd_sched_config_load(const char *path, ditd_sched_config *out)
{
    int err;
    json_t *root = ditd_json_config_get(path, quote_python_specials, &err);
    if (!root)
        return err;
    err = from_root(root, path, out);
    json_decref(root);
    return err;
}

int ditd_sched_config_convert(const ditd_sched_config *base, ditd_sampler_kind kind,
                              ditd_sched_config *out)
{
    if ((unsigned)kind >= DITD_SAMPLER_KIND_COUNT)
        return ditd_err_set(DITD_EINVAL, "sampler kind %d", (int)kind);
    ditd_sched_config b = *base; /* out may alias base */
    ditd_sched_config_init(out, kind);
    snprintf(out->source, sizeof out->source, "%.100s (as %s)", b.source,
             ditd_sampler_kind_class(kind));
    /* Diffusers: from_config drops the keys in _use_default_values and keeps
     * every other key of the base config (those of the target's __init__ as
     * arguments, the rest as hidden config), so what the file set carries,
     * and what base only defaulted becomes the target's default. */
    for (int k = 0; k < K__COUNT; k++) {
        if (!(b.given & KEY_BIT(k)))
            continue;
        memcpy((char *)out + keys[k].off, (const char *)&b + keys[k].off, keys[k].size);
        if (keys[k].size2)
            memcpy((char *)out + keys[k].off2, (const char *)&b + keys[k].off2, keys[k].size2);
    }
    out->given = b.given;
    out->bad = b.bad;
    out->image_seq_len = b.image_seq_len;
    out->pipeline_sigmas = b.pipeline_sigmas;
    memcpy(out->bad_text, b.bad_text, sizeof out->bad_text);
    normalize(out);
    return ditd_sched_config_check(out);
}

/* betas -> alphas_cumprod, as the VP schedulers' __init__ (sched_math.h) */
void ditd__sched_alphas_cumprod(const ditd_sched_config *c, float *betas, float *ac)
{
    const int N = c->num_train_timesteps;
    switch (c->beta_schedule) {
    case DITD_SCHED_BETA_LINEAR:
        torch_linspace_f32((float)c->beta_start, (float)c->beta_end, N, betas);
        break;
    case DITD_SCHED_BETA_SCALED_LINEAR:
        /* Diffusers: linspace(beta_start**0.5, beta_end**0.5) ** 2, the
         * square roots in Python floats. */
        torch_linspace_f32((float)pow(c->beta_start, 0.5), (float)pow(c->beta_end, 0.5), N, betas);
        for (int i = 0; i < N; i++)
            betas[i] = betas[i] * betas[i];
        break;
    case DITD_SCHED_BETA_SQUAREDCOS_CAP_V2:
        /* Diffusers: betas_for_alpha_bar, Python floats, then float32. */
        for (int i = 0; i < N; i++) {
            double t1 = (double)i / N, t2 = (double)(i + 1) / N;
            double a1 = pow(cos((t1 + 0.008) / 1.008 * M_PI / 2), 2);
            double a2 = pow(cos((t2 + 0.008) / 1.008 * M_PI / 2), 2);
            double b = 1 - a2 / a1;
            betas[i] = (float)(b < 0.999 ? b : 0.999);
        }
        break;
    }
    /* torch.cumprod on CPU accumulates in double and stores float. */
#define CUMPROD(src_expr)                                                                      \
    do {                                                                                       \
        double acc = 1.0;                                                                      \
        for (int i = 0; i < N; i++) {                                                          \
            acc *= (double)(float)(src_expr);                                                  \
            ac[i] = (float)acc;                                                                \
        }                                                                                      \
    } while (0)

    if (c->rescale_betas_zero_snr) {
        /* Diffusers: rescale_zero_terminal_snr, all float32. */
        CUMPROD(1.0f - betas[i]);
        float *s = ac;
        for (int i = 0; i < N; i++)
            s[i] = sqrtf(ac[i]);
        const float s0 = s[0], sT = s[N - 1];
        const float scale = s0 / (s0 - sT);
        for (int i = 0; i < N; i++) {
            s[i] = s[i] - sT;
            s[i] = s[i] * scale;
        }
        float prev = s[0] * s[0];
        betas[0] = 1.0f - prev;
        for (int i = 1; i < N; i++) {
            float ab = s[i] * s[i];
            betas[i] = 1.0f - ab / prev;
            prev = ab;
        }
    }
    CUMPROD(1.0f - betas[i]);
#undef CUMPROD
}
