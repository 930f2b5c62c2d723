/* Step caching configs (engine/pipeline/step_cache.h): Diffusers' config
 * fields by name, the METHOD[:key=value,...] parser, checks. No state. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/error.h"
#include "engine/pipeline/step_cache_config.h"

static const char *const method_names[] = {"none", "first_block_cache", "taylorseer_cache",
                                           "mag_cache"};

const char *ditd_cache_method_name(ditd_cache_method m)
{
    return (unsigned)m < 4 ? method_names[m] : "unknown";
}

int ditd_cache_method_from_str(const char *s, ditd_cache_method *out)
{
    for (int i = 0; i < 4; i++)
        if (strcmp(s, method_names[i]) == 0) {
            *out = (ditd_cache_method)i;
            return 0;
        }
    return ditd_err_set(DITD_EINVAL,
                        "cache method \"%s\" (none, first_block_cache, taylorseer_cache, mag_cache)",
                        s);
}

/* diffusers.hooks.mag_cache.FLUX_MAG_RATIOS */
static const float flux_mag_ratios[28] = {
    1.0f,     1.21094f, 1.11719f, 1.07812f, 1.0625f,  1.03906f, 1.03125f,
    1.03906f, 1.02344f, 1.03125f, 1.02344f, 0.98047f, 1.01562f, 1.00781f,
    1.0f,     1.00781f, 1.0f,     1.00781f, 1.0f,     1.0f,     0.99609f,
    0.99609f, 0.98047f, 0.98828f, 0.96484f, 0.95703f, 0.93359f, 0.89062f,
};

void ditd_cache_config_default(ditd_cache_method m, ditd_cache_config *c)
{
    memset(c, 0, sizeof *c);
    c->method = m;
    c->threshold = m == DITD_CACHE_MAG ? 0.06 : m == DITD_CACHE_FIRST_BLOCK ? 0.05 : 0.0;
    c->cache_interval = 5;
    c->disable_cache_before_step = 3;
    c->disable_cache_after_step = -1;
    c->max_order = 1;
    c->taylor_factors_dtype = DITD_DTYPE_BF16;
    c->max_skip_steps = 3;
    c->retention_ratio = 0.2;
    c->num_inference_steps = 0;
    if (m == DITD_CACHE_NONE)
        memset(c, 0, sizeof *c);
}

/* ---- values ---- */

static int parse_double(const char *key, const char *v, double *out)
{
    char *end;
    errno = 0;
    double d = strtod(v, &end);
    if (end == v || *end || errno || !isfinite(d))
        return ditd_err_set(DITD_EINVAL, "cache field %s: \"%s\" is not a number", key, v);
    *out = d;
    return 0;
}

static int parse_int(const char *key, const char *v, int *out)
{
    char *end;
    errno = 0;
    long l = strtol(v, &end, 10);
    if (end == v || *end || errno || l < -1000000 || l > 1000000)
        return ditd_err_set(DITD_EINVAL, "cache field %s: \"%s\" is not an integer", key, v);
    *out = (int)l;
    return 0;
}

static int parse_bool(const char *key, const char *v, int *out)
{
    if (!strcmp(v, "true") || !strcmp(v, "True") || !strcmp(v, "1")) {
        *out = 1;
        return 0;
    }
    if (!strcmp(v, "false") || !strcmp(v, "False") || !strcmp(v, "0")) {
        *out = 0;
        return 0;
    }
    return ditd_err_set(DITD_EINVAL, "cache field %s: \"%s\" is not true or false", key, v);
}

/* Which method's config has `key` (0 when none does). */
static int key_of(ditd_cache_method m, const char *key)
{
    static const char *const fbc[] = {"threshold", NULL};
    static const char *const tay[] = {"cache_interval", "disable_cache_before_step",
                                      "disable_cache_after_step", "max_order",
                                      "taylor_factors_dtype", "skip_predict_identifiers",
                                      "cache_identifiers", "use_lite_mode", NULL};
    static const char *const mag[] = {"threshold", "max_skip_steps", "retention_ratio",
                                      "num_inference_steps", "mag_ratios", "calibrate", NULL};
    const char *const *k = m == DITD_CACHE_FIRST_BLOCK ? fbc
                           : m == DITD_CACHE_TAYLORSEER ? tay
                           : m == DITD_CACHE_MAG        ? mag
                                                        : NULL;
    for (; k && *k; k++)
        if (!strcmp(*k, key))
            return 1;
    return 0;
}

static int bad_key(const ditd_cache_config *c, const char *key)
{
    return ditd_err_set(DITD_EINVAL, "cache field \"%s\" is not a field of %s%s", key,
                        ditd_cache_method_name(c->method),
                        c->method == DITD_CACHE_FIRST_BLOCK ? " (threshold)"
                        : c->method == DITD_CACHE_TAYLORSEER
                            ? " (cache_interval, disable_cache_before_step, disable_cache_after_step, "
                              "max_order, taylor_factors_dtype, skip_predict_identifiers, "
                              "cache_identifiers, use_lite_mode)"
                        : c->method == DITD_CACHE_MAG
                            ? " (threshold, max_skip_steps, retention_ratio, num_inference_steps, "
                              "mag_ratios, calibrate)"
                            : "");
}

int ditd_cache_config_set_floats(ditd_cache_config *c, const char *key, const double *v, int n)
{
    if (strcmp(key, "mag_ratios") || c->method != DITD_CACHE_MAG)
        return bad_key(c, key);
    if (n < 1 || n > DITD_CACHE_MAX_RATIOS)
        return ditd_err_set(DITD_EINVAL, "cache field mag_ratios: %d values (1..%d)", n,
                            DITD_CACHE_MAX_RATIOS);
    for (int i = 0; i < n; i++) {
        if (!isfinite(v[i]))
            return ditd_err_set(DITD_EINVAL, "cache field mag_ratios: value %d is not finite", i);
        c->mag_ratios[i] = (float)v[i]; /* torch.tensor(list): float32 */
    }
    c->n_mag_ratios = n;
    return 0;
}

int ditd_cache_config_set_list(ditd_cache_config *c, const char *key, const char *const *items,
                               int n)
{
    if (!key_of(c->method, key))
        return bad_key(c, key);
    if (!strcmp(key, "mag_ratios")) {
        double v[DITD_CACHE_MAX_RATIOS];
        if (n == 1 && !strcmp(items[0], "FLUX")) {
            memcpy(c->mag_ratios, flux_mag_ratios, sizeof flux_mag_ratios);
            c->n_mag_ratios = 28;
            return 0;
        }
        if (n < 1 || n > DITD_CACHE_MAX_RATIOS)
            return ditd_err_set(DITD_EINVAL, "cache field mag_ratios: %d values (1..%d)", n,
                                DITD_CACHE_MAX_RATIOS);
        for (int i = 0; i < n; i++) {
            int err = parse_double(key, items[i], &v[i]);
            if (err)
                return err;
        }
        return ditd_cache_config_set_floats(c, key, v, n);
    }
    if (!strcmp(key, "cache_identifiers") || !strcmp(key, "skip_predict_identifiers")) {
        int active = key[0] == 'c';
        char(*dst)[DITD_CACHE_PATTERN_LEN] =
            active ? c->cache_identifiers : c->skip_predict_identifiers;
        if (n < 0 || n > DITD_CACHE_MAX_PATTERNS)
            return ditd_err_set(DITD_EINVAL, "cache field %s: %d patterns (at most %d)", key, n,
                                DITD_CACHE_MAX_PATTERNS);
        for (int i = 0; i < n; i++) {
            size_t len = strlen(items[i]);
            if (len == 0 || len >= DITD_CACHE_PATTERN_LEN)
                return ditd_err_set(DITD_EINVAL, "cache field %s: pattern %d has %zu characters "
                                                 "(1..%d)",
                                    key, i, len, DITD_CACHE_PATTERN_LEN - 1);
            memcpy(dst[i], items[i], len + 1);
        }
        *(active ? &c->n_cache_identifiers : &c->n_skip_predict_identifiers) = n;
        return 0;
    }
    if (n != 1)
        return ditd_err_set(DITD_EINVAL, "cache field %s takes one value, not %d", key, n);
    return ditd_cache_config_set(c, key, items[0]);
}

int ditd_cache_config_set(ditd_cache_config *c, const char *key, const char *v)
{
    double d = 0.0;
    int err;
    if (!key_of(c->method, key))
        return bad_key(c, key);
    if (!strcmp(key, "mag_ratios") || !strcmp(key, "cache_identifiers") ||
        !strcmp(key, "skip_predict_identifiers")) {
        /* a ';'-separated list */
        char buf[8192], *items[DITD_CACHE_MAX_RATIOS], *save = NULL;
        int n = 0;
        if (strlen(v) >= sizeof buf)
            return ditd_err_set(DITD_EINVAL, "cache field %s: value too long", key);
        strcpy(buf, v);
        for (char *t = strtok_r(buf, ";", &save); t; t = strtok_r(NULL, ";", &save)) {
            if (n == DITD_CACHE_MAX_RATIOS)
                return ditd_err_set(DITD_EINVAL, "cache field %s: too many values", key);
            items[n++] = t;
        }
        if (n == 0 && strcmp(key, "mag_ratios"))
            return ditd_cache_config_set_list(c, key, NULL, 0);
        return ditd_cache_config_set_list(c, key, (const char *const *)items, n);
    }
    if (!strcmp(key, "threshold") || !strcmp(key, "retention_ratio")) {
        if ((err = parse_double(key, v, &d)))
            return err;
        *(key[0] == 't' ? &c->threshold : &c->retention_ratio) = d;
        return 0;
    }
    if (!strcmp(key, "use_lite_mode"))
        return parse_bool(key, v, &c->use_lite_mode);
    if (!strcmp(key, "calibrate"))
        return parse_bool(key, v, &c->calibrate);
    if (!strcmp(key, "taylor_factors_dtype")) {
        const char *t = strncmp(v, "torch.", 6) ? v : v + 6;
        if (!strcmp(t, "bfloat16"))
            c->taylor_factors_dtype = DITD_DTYPE_BF16;
        else if (!strcmp(t, "float32") || !strcmp(t, "float64"))
            c->taylor_factors_dtype = DITD_DTYPE_F32;
        else
            return ditd_err_set(DITD_EINVAL,
                                "cache field taylor_factors_dtype: \"%s\" (bfloat16, float32)", v);
        return 0;
    }
    if (!strcmp(key, "disable_cache_after_step") && (!strcmp(v, "None") || !strcmp(v, "null"))) {
        c->disable_cache_after_step = -1;
        return 0;
    }
    int *dst = !strcmp(key, "cache_interval")              ? &c->cache_interval
               : !strcmp(key, "disable_cache_before_step") ? &c->disable_cache_before_step
               : !strcmp(key, "disable_cache_after_step")  ? &c->disable_cache_after_step
               : !strcmp(key, "max_order")                 ? &c->max_order
               : !strcmp(key, "max_skip_steps")            ? &c->max_skip_steps
                                                           : &c->num_inference_steps;
    return parse_int(key, v, dst);
}

int ditd_cache_config_parse(const char *spec, ditd_cache_config *out)
{
    char buf[8192], *colon, *save = NULL;
    ditd_cache_method m;
    int err;
    if (!spec || strlen(spec) >= sizeof buf)
        return ditd_err_set(DITD_EINVAL, "cache: no specification, or one too long");
    strcpy(buf, spec);
    if ((colon = strchr(buf, ':')))
        *colon = 0;
    if ((err = ditd_cache_method_from_str(buf, &m)))
        return err;
    ditd_cache_config_default(m, out);
    if (colon && m == DITD_CACHE_NONE && colon[1])
        return ditd_err_set(DITD_EINVAL, "cache none takes no fields (\"%s\")", colon + 1);
    for (char *kv = colon ? strtok_r(colon + 1, ",", &save) : NULL; kv;
         kv = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(kv, '=');
        if (!eq || eq == kv)
            return ditd_err_set(DITD_EINVAL, "cache %s: \"%s\" is not key=value",
                                ditd_cache_method_name(m), kv);
        *eq = 0;
        if ((err = ditd_cache_config_set(out, kv, eq + 1)))
            return err;
    }
    return ditd_cache_config_check(out);
}

int ditd_cache_config_check(const ditd_cache_config *c)
{
    switch (c->method) {
    case DITD_CACHE_NONE:
        return 0;
    case DITD_CACHE_FIRST_BLOCK:
        if (!(c->threshold >= 0))
            return ditd_err_set(DITD_EINVAL, "first_block_cache threshold %g (>= 0)", c->threshold);
        return 0;
    case DITD_CACHE_TAYLORSEER:
        if (c->cache_interval < 1)
            return ditd_err_set(DITD_EINVAL, "taylorseer_cache cache_interval %d (>= 1)",
                                c->cache_interval);
        if (c->disable_cache_before_step < 0)
            return ditd_err_set(DITD_EINVAL, "taylorseer_cache disable_cache_before_step %d (>= 0)",
                                c->disable_cache_before_step);
        if (c->disable_cache_after_step < -1)
            return ditd_err_set(DITD_EINVAL,
                                "taylorseer_cache disable_cache_after_step %d (>= 0, or None)",
                                c->disable_cache_after_step);
        if (c->max_order < 0 || c->max_order > 8)
            return ditd_err_set(DITD_EINVAL, "taylorseer_cache max_order %d (0..8)", c->max_order);
        /* step 0 would be predicted before anything was computed: Diffusers
         * raises "Cannot predict without prior initialization/update" */
        if (c->disable_cache_before_step == 0 && c->cache_interval > 1 &&
            c->disable_cache_after_step != 0)
            return ditd_err_set(DITD_EINVAL, "taylorseer_cache: disable_cache_before_step 0 with "
                                             "cache_interval %d predicts step 0 before any step "
                                             "was computed",
                                c->cache_interval);
        return 0;
    case DITD_CACHE_MAG:
        if (!(c->threshold >= 0))
            return ditd_err_set(DITD_EINVAL, "mag_cache threshold %g (>= 0)", c->threshold);
        if (c->max_skip_steps < 0)
            return ditd_err_set(DITD_EINVAL, "mag_cache max_skip_steps %d (>= 0)",
                                c->max_skip_steps);
        if (!(c->retention_ratio >= 0 && c->retention_ratio <= 1))
            return ditd_err_set(DITD_EINVAL, "mag_cache retention_ratio %g (0..1)",
                                c->retention_ratio);
        if (c->num_inference_steps < 0 || c->num_inference_steps > 1000)
            return ditd_err_set(DITD_EINVAL, "mag_cache num_inference_steps %d (1..1000, or 0: "
                                             "the request's)",
                                c->num_inference_steps);
        if (c->n_mag_ratios == 0 && !c->calibrate)
            return ditd_err_set(DITD_EINVAL,
                                "mag_cache: mag_ratios must be given (they are model-dependent: "
                                "measure them with calibrate=true; FLUX for FLUX.1's)");
        return 0;
    }
    return ditd_err_set(DITD_EINVAL, "cache method %d", (int)c->method);
}

int ditd_cache_config_equal(const ditd_cache_config *a, const ditd_cache_config *b)
{
    if (a->method != b->method)
        return 0;
    switch (a->method) {
    case DITD_CACHE_NONE:
        return 1;
    case DITD_CACHE_FIRST_BLOCK:
        return a->threshold == b->threshold;
    case DITD_CACHE_TAYLORSEER:
        if (a->cache_interval != b->cache_interval ||
            a->disable_cache_before_step != b->disable_cache_before_step ||
            a->disable_cache_after_step != b->disable_cache_after_step ||
            a->max_order != b->max_order || a->taylor_factors_dtype != b->taylor_factors_dtype ||
            a->use_lite_mode != b->use_lite_mode ||
            a->n_cache_identifiers != b->n_cache_identifiers ||
            a->n_skip_predict_identifiers != b->n_skip_predict_identifiers)
            return 0;
        for (int i = 0; i < a->n_cache_identifiers; i++)
            if (strcmp(a->cache_identifiers[i], b->cache_identifiers[i]))
                return 0;
        for (int i = 0; i < a->n_skip_predict_identifiers; i++)
            if (strcmp(a->skip_predict_identifiers[i], b->skip_predict_identifiers[i]))
                return 0;
        return 1;
    case DITD_CACHE_MAG:
        return a->threshold == b->threshold && a->max_skip_steps == b->max_skip_steps &&
               a->retention_ratio == b->retention_ratio &&
               a->num_inference_steps == b->num_inference_steps && a->calibrate == b->calibrate &&
               a->n_mag_ratios == b->n_mag_ratios &&
               !memcmp(a->mag_ratios, b->mag_ratios, (size_t)a->n_mag_ratios * sizeof(float));
    }
    return 0;
}

void ditd_cache_config_format(const ditd_cache_config *c, char *buf, size_t cap)
{
    switch (c->method) {
    case DITD_CACHE_FIRST_BLOCK:
        snprintf(buf, cap, "first_block_cache:threshold=%g", c->threshold);
        return;
    case DITD_CACHE_TAYLORSEER:
        snprintf(buf, cap,
                 "taylorseer_cache:cache_interval=%d,disable_cache_before_step=%d,"
                 "disable_cache_after_step=%d,max_order=%d,taylor_factors_dtype=%s,"
                 "use_lite_mode=%s,cache_identifiers=%d patterns,skip_predict_identifiers=%d "
                 "patterns",
                 c->cache_interval, c->disable_cache_before_step, c->disable_cache_after_step,
                 c->max_order, c->taylor_factors_dtype == DITD_DTYPE_BF16 ? "bfloat16" : "float32",
                 c->use_lite_mode ? "true" : "false", c->n_cache_identifiers,
                 c->n_skip_predict_identifiers);
        return;
    case DITD_CACHE_MAG:
        snprintf(buf, cap,
                 "mag_cache:threshold=%g,max_skip_steps=%d,retention_ratio=%g,"
                 "num_inference_steps=%d,mag_ratios=%d values,calibrate=%s",
                 c->threshold, c->max_skip_steps, c->retention_ratio, c->num_inference_steps,
                 c->n_mag_ratios, c->calibrate ? "true" : "false");
        return;
    default:
        snprintf(buf, cap, "none");
    }
}
