/* Step caching's config in the Batch message (engine/worker/cache_msg.h):
 * field for field, both ways. Not the parsing of people's text (that is
 * ditd_cache_config_parse and the server's JSON). */
#include "engine/worker/cache_msg.h"

#include <stdio.h>
#include <string.h>

#include "engine/core/error.h"

void ditd_cache_msg_from_config(const ditd_cache_config *c, Ditd__CacheConfig *m,
                                char *ids[2 * DITD_CACHE_MAX_PATTERNS])
{
    ditd__cache_config__init(m);
    m->method = (uint32_t)c->method;
    m->threshold = c->threshold;
    m->cache_interval = c->cache_interval;
    m->disable_cache_before_step = c->disable_cache_before_step;
    m->disable_cache_after_step = c->disable_cache_after_step;
    m->max_order = c->max_order;
    m->taylor_factors_dtype = (uint32_t)c->taylor_factors_dtype;
    for (int i = 0; i < c->n_cache_identifiers; i++)
        ids[i] = (char *)c->cache_identifiers[i];
    for (int i = 0; i < c->n_skip_predict_identifiers; i++)
        ids[DITD_CACHE_MAX_PATTERNS + i] = (char *)c->skip_predict_identifiers[i];
    m->n_cache_identifiers = (size_t)c->n_cache_identifiers;
    m->cache_identifiers = ids;
    m->n_skip_predict_identifiers = (size_t)c->n_skip_predict_identifiers;
    m->skip_predict_identifiers = ids + DITD_CACHE_MAX_PATTERNS;
    m->use_lite_mode = c->use_lite_mode != 0;
    m->max_skip_steps = c->max_skip_steps;
    m->retention_ratio = c->retention_ratio;
    m->num_inference_steps = c->num_inference_steps;
    m->n_mag_ratios = (size_t)c->n_mag_ratios;
    m->mag_ratios = (float *)c->mag_ratios;
    m->calibrate = c->calibrate != 0;
}

static int copy_patterns(char dst[][DITD_CACHE_PATTERN_LEN], int *n, char *const *src, size_t ns,
                         const char *key)
{
    if (ns > DITD_CACHE_MAX_PATTERNS)
        return ditd_err_set(DITD_EINVAL, "cache: %s: %zu patterns (at most %d)", key, ns,
                            DITD_CACHE_MAX_PATTERNS);
    for (size_t i = 0; i < ns; i++) {
        if (strlen(src[i]) >= DITD_CACHE_PATTERN_LEN)
            return ditd_err_set(DITD_EINVAL, "cache: %s[%zu]: longer than %d bytes", key, i,
                                DITD_CACHE_PATTERN_LEN - 1);
        snprintf(dst[i], DITD_CACHE_PATTERN_LEN, "%s", src[i]);
    }
    *n = (int)ns;
    return 0;
}

int ditd_cache_msg_to_config(const Ditd__CacheConfig *m, ditd_cache_config *out)
{
    int err;
    ditd_cache_config_default(DITD_CACHE_NONE, out);
    if (!m || m->method == DITD_CACHE_NONE)
        return 0;
    if (m->method > DITD_CACHE_MAG)
        return ditd_err_set(DITD_EINVAL, "cache: method %u is not a ditd_cache_method", m->method);
    out->method = (ditd_cache_method)m->method;
    out->threshold = m->threshold;
    out->cache_interval = m->cache_interval;
    out->disable_cache_before_step = m->disable_cache_before_step;
    out->disable_cache_after_step = m->disable_cache_after_step;
    out->max_order = m->max_order;
    if (m->taylor_factors_dtype != DITD_DTYPE_BF16 && m->taylor_factors_dtype != DITD_DTYPE_F32 &&
        out->method == DITD_CACHE_TAYLORSEER)
        return ditd_err_set(DITD_EINVAL, "cache: taylor_factors_dtype %u (bfloat16 or float32)",
                            m->taylor_factors_dtype);
    out->taylor_factors_dtype = (ditd_dtype)m->taylor_factors_dtype;
    if ((err = copy_patterns(out->cache_identifiers, &out->n_cache_identifiers,
                             m->cache_identifiers, m->n_cache_identifiers, "cache_identifiers")) ||
        (err = copy_patterns(out->skip_predict_identifiers, &out->n_skip_predict_identifiers,
                             m->skip_predict_identifiers, m->n_skip_predict_identifiers,
                             "skip_predict_identifiers")))
        return err;
    out->use_lite_mode = m->use_lite_mode;
    out->max_skip_steps = m->max_skip_steps;
    out->retention_ratio = m->retention_ratio;
    out->num_inference_steps = m->num_inference_steps;
    if (m->n_mag_ratios > DITD_CACHE_MAX_RATIOS)
        return ditd_err_set(DITD_EINVAL, "cache: mag_ratios: %zu values (at most %d)",
                            m->n_mag_ratios, DITD_CACHE_MAX_RATIOS);
    out->n_mag_ratios = (int)m->n_mag_ratios;
    if (m->n_mag_ratios)
        memcpy(out->mag_ratios, m->mag_ratios, m->n_mag_ratios * sizeof(float));
    out->calibrate = m->calibrate;
    return ditd_cache_config_check(out);
}
