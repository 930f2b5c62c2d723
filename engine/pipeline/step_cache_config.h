/* Step caching's configuration (step_cache_config.c): the methods, their
 * Diffusers configs (FirstBlockCacheConfig, TaylorSeerCacheConfig,
 * MagCacheConfig) as one typed struct, parsed from the command line's
 * spec or set field by field from the request's "cache" object, checked
 * and compared. The caching itself: step_cache.h. */
#ifndef DITD_ENGINE_STEP_CACHE_CONFIG_H
#define DITD_ENGINE_STEP_CACHE_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "engine/core/tensor.h" /* ditd_dtype */

typedef enum ditd_cache_method {
    DITD_CACHE_NONE = 0,
    DITD_CACHE_FIRST_BLOCK, /* "first_block_cache" */
    DITD_CACHE_TAYLORSEER,  /* "taylorseer_cache" */
    DITD_CACHE_MAG,         /* "mag_cache" */
} ditd_cache_method;

const char *ditd_cache_method_name(ditd_cache_method m);
/* "none", "first_block_cache", "taylorseer_cache", "mag_cache";
 * DITD_EINVAL naming s and the accepted names otherwise. */
int ditd_cache_method_from_str(const char *s, ditd_cache_method *out);

#define DITD_CACHE_MAX_PATTERNS 8
#define DITD_CACHE_PATTERN_LEN 128
#define DITD_CACHE_MAX_RATIOS 1000

/* The Diffusers configs' fields, by their names. Plain data (no pointers):
 * copy it, compare it with ditd_cache_config_equal(). */
typedef struct ditd_cache_config {
    ditd_cache_method method;
    /* first_block_cache: threshold (0.05); mag_cache: threshold (0.06) */
    double threshold;
    /* taylorseer_cache */
    int cache_interval;             /* 5 */
    int disable_cache_before_step;  /* 3 */
    int disable_cache_after_step;   /* -1: None */
    int max_order;                  /* 1 */
    ditd_dtype taylor_factors_dtype; /* bfloat16 (Diffusers' default) or float32 */
    int n_cache_identifiers, n_skip_predict_identifiers; /* 0: None */
    char cache_identifiers[DITD_CACHE_MAX_PATTERNS][DITD_CACHE_PATTERN_LEN];
    char skip_predict_identifiers[DITD_CACHE_MAX_PATTERNS][DITD_CACHE_PATTERN_LEN];
    int use_lite_mode;              /* 0 */
    /* mag_cache */
    int max_skip_steps;             /* 3 */
    double retention_ratio;         /* 0.2 */
    int num_inference_steps;        /* 0: the batch's steps (Diffusers' default is 28) */
    int n_mag_ratios;               /* 0: None */
    float mag_ratios[DITD_CACHE_MAX_RATIOS];
    int calibrate;                  /* 0 */
} ditd_cache_config;

/* Diffusers' defaults for method m (NONE: everything zero). */
void ditd_cache_config_default(ditd_cache_method m, ditd_cache_config *c);

/* One field by its Diffusers name, value as text: numbers, "true"/"false",
 * "None" (disable_cache_after_step), "float32"/"bfloat16" (also
 * "torch.float32", "torch.bfloat16"; float64 is taken as float32, the
 * widest ditd keeps), lists (mag_ratios, cache_identifiers,
 * skip_predict_identifiers) separated by ';', and mag_ratios "FLUX"
 * (diffusers.hooks.mag_cache.FLUX_MAG_RATIOS). A key the method's config
 * does not have, or a bad value, is DITD_EINVAL naming both. */
int ditd_cache_config_set(ditd_cache_config *c, const char *key, const char *value);
/* The same for a list given as items (the server's JSON arrays). */
int ditd_cache_config_set_list(ditd_cache_config *c, const char *key, const char *const *items,
                               int n);
int ditd_cache_config_set_floats(ditd_cache_config *c, const char *key, const double *v, int n);

/* "METHOD[:key=value,...]" (the command line's --cache): "none" or a
 * method name, then its fields; e.g. "first_block_cache:threshold=0.08",
 * "mag_cache:mag_ratios=FLUX,threshold=0.1". Checked as
 * ditd_cache_config_check. DITD_EINVAL naming the part that is wrong. */
int ditd_cache_config_parse(const char *spec, ditd_cache_config *out);

/* The ranges Diffusers' code relies on: threshold >= 0, cache_interval >= 1,
 * max_order 0..8, disable_cache_before_step >= 0, ... ; mag_cache needs
 * mag_ratios or calibrate, as MagCacheConfig.__post_init__. DITD_EINVAL. */
int ditd_cache_config_check(const ditd_cache_config *c);

/* 1 when a and b configure the same caching (the batcher keeps requests
 * with different caching apart). */
int ditd_cache_config_equal(const ditd_cache_config *a, const ditd_cache_config *b);

/* "first_block_cache:threshold=0.05" etc., for logs; truncated to cap. */
void ditd_cache_config_format(const ditd_cache_config *c, char *buf, size_t cap);

#endif
