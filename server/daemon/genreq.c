/* POST /v1/images/generations bodies into typed requests (server/genreq.h):
 * the JSON is read here and nowhere else. Not the scheduler's business
 * (batching, cost) nor the HTTP framing's. */
#include "server/daemon/genreq.h"
#include "server/daemon/image_json.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "engine/core/error.h"
#include "server/common/image_in.h"

/* a 400 naming the field (api_error.h) */
#define bad(...) ditd_api_bad(__VA_ARGS__)

size_t ditd_utf8_seq(const unsigned char *p, size_t n)
{
    unsigned c = p[0];
    size_t len;
    unsigned min;
    if (c < 0x80)
        return 1;
    if (c >= 0xc2 && c <= 0xdf)
        len = 2, min = 0x80;
    else if (c >= 0xe0 && c <= 0xef)
        len = 3, min = 0x800;
    else if (c >= 0xf0 && c <= 0xf4)
        len = 4, min = 0x10000;
    else
        return 0;
    if (len > n)
        return 0;
    unsigned cp = c & (0xff >> (len + 1));
    for (size_t i = 1; i < len; i++) {
        if ((p[i] & 0xc0) != 0x80)
            return 0;
        cp = cp << 6 | (p[i] & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
        return 0;
    return len;
}

void ditd_utf8_clean(char *s)
{
    size_t n = strlen(s), i = 0;
    while (i < n) {
        size_t k = ditd_utf8_seq((const unsigned char *)s + i, n - i);
        if (k) {
            i += k;
        } else {
            s[i++] = '?';
        }
    }
}

char *ditd_api_error_json(const ditd_api_error *e)
{
    /* a message may quote the client's bytes, cut anywhere: JSON takes
     * UTF-8 only */
    char msg[sizeof e->message], param[sizeof e->param];
    snprintf(msg, sizeof msg, "%s", e->message);
    snprintf(param, sizeof param, "%s", e->param);
    ditd_utf8_clean(msg);
    ditd_utf8_clean(param);
    json_t *root = json_pack("{s:{s:s,s:s,s:o,s:s}}", "error", "message", msg, "type",
                             e->type ? e->type : "server_error", "param",
                             param[0] ? json_string(param) : json_null(), "code",
                             e->code ? e->code : "internal_error");
    char *s;
    if (!root)
        return NULL;
    s = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    return s;
}


/* "valid classes: 0 "tee", 1 "trouser", ..." appended to a message */
static void list_classes(const ditd_model_info *m, char *dst, size_t len)
{
    size_t at = strlen(dst);
    at += (size_t)snprintf(dst + at, at < len ? len - at : 0, "; valid classes:");
    for (int i = 0; i < m->num_classes && at < len; i++) {
        if (i == 40) {
            snprintf(dst + at, len - at, " ... (%d in all, or a number 0..%d)", m->num_classes,
                     m->num_classes - 1);
            return;
        }
        at += (size_t)snprintf(dst + at, len - at, "%s %d \"%s\"", i ? "," : "", i, m->labels[i]);
    }
}

static int get_int(json_t *root, const char *key, long lo, long hi, long *out, int *given,
                   ditd_api_error *e)
{
    json_t *v = json_object_get(root, key);
    *given = 0;
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi)
        return bad(e, key, "'%s' must be an integer in %ld..%ld", key, lo, hi);
    *out = (long)json_integer_value(v);
    *given = 1;
    return 0;
}

/* A dimension of "WxH": 1..65535 in plain decimal digits (no sign, blank
 * or leading zero), ended by `end`; -1 otherwise. */
static int parse_dim(const char *p, char end)
{
    long v = 0;
    int n = 0;
    if (*p == '0')
        return -1;
    for (; *p >= '0' && *p <= '9'; p++, n++) {
        if (n >= 5)
            return -1;
        v = v * 10 + (*p - '0');
    }
    return n && *p == end && v <= 65535 ? (int)v : -1;
}

static int get_str(json_t *root, const char *key, const char **out, ditd_api_error *e)
{
    json_t *v = json_object_get(root, key);
    *out = NULL;
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_string(v))
        return bad(e, key, "'%s' must be a string", key);
    *out = json_string_value(v);
    return 0;
}

int ditd_genreq_model_named(const ditd_genreq_model *gm, const char *name)
{
    if (!strcmp(name, gm->info->name))
        return 1;
    for (int i = 0; i < gm->n_aliases; i++)
        if (!strcmp(name, gm->aliases[i]))
            return 1;
    return 0;
}

void ditd_genreq_free(ditd_genreq *r)
{
    free(r->image);
    free(r->mask);
    free(r->last_image);
    r->image = r->mask = r->last_image = NULL;
    free(r->prompt);
    free(r->negative_prompt);
    r->prompt = r->negative_prompt = NULL;
    for (int k = 0; k < 2; k++) {
        free(r->prompt_23[k]);
        free(r->negative_23[k]);
        r->prompt_23[k] = r->negative_23[k] = NULL;
    }
}

size_t ditd_genreq_numel(const ditd_genreq *r, const ditd_model_info *m)
{
    return (size_t)m->image_channels * (size_t)r->width * (size_t)r->height *
           (size_t)(r->frames > 0 ? r->frames : 1);
}

/* A text field of a text model: a string of at most
 * DITD_GENREQ_MAX_PROMPT_BYTES bytes (jansson has checked it is UTF-8
 * without NUL), copied into *out (NULL when absent and not required). */
static int get_text(json_t *root, const char *key, int required, char **out, ditd_api_error *e)
{
    json_t *v = json_object_get(root, key);
    *out = NULL;
    if (!v || json_is_null(v)) {
        if (required)
            return bad(e, key, "'%s' is required: the text to draw (this model is text-conditioned)", key);
        return 0;
    }
    if (!json_is_string(v))
        return bad(e, key, "'%s' must be a string (UTF-8 text)", key);
    size_t n = json_string_length(v);
    if (n > DITD_GENREQ_MAX_PROMPT_BYTES)
        return bad(e, key, "'%s' is %zu bytes; the limit is %d bytes of UTF-8 (the text encoders "
                   "read at most max_sequence_length tokens of it)", key, n,
                   DITD_GENREQ_MAX_PROMPT_BYTES);
    if (!(*out = strdup(json_string_value(v)))) {
        ditd_api_error_set(e, 500, "server_error", "internal_error", NULL, "out of memory");
        return DITD_ENOMEM;
    }
    return 0;
}

static int get_number(json_t *root, const char *key, double lo, double hi, float *out,
                      ditd_api_error *e)
{
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_number(v) || !(json_number_value(v) >= lo && json_number_value(v) <= hi))
        return bad(e, key, "'%s' must be a number in %g..%g", key, lo, hi);
    *out = (float)json_number_value(v);
    return 0;
}

/* The class of a class-conditional model: class_label (wins) or the prompt. */
static int get_class(json_t *root, const ditd_model_info *m, ditd_genreq *r, ditd_api_error *e)
{
    json_t *v;
    const char *prompt;
    int id;
    if ((v = json_object_get(root, "class_label")) && !json_is_null(v)) {
        if (json_is_integer(v)) {
            if (json_integer_value(v) < 0 || json_integer_value(v) >= m->num_classes) {
                bad(e, "class_label", "class_label %lld is outside 0..%d",
                    (long long)json_integer_value(v), m->num_classes - 1);
                list_classes(m, e->message, sizeof e->message);
                return DITD_EINVAL;
            }
            r->class_id = json_integer_value(v);
            return 0;
        }
        if (json_is_string(v)) {
            if (ditd_model_class_from_str(m, json_string_value(v), &id)) {
                bad(e, "class_label", "unknown class '%s'", json_string_value(v));
                list_classes(m, e->message, sizeof e->message);
                return DITD_EINVAL;
            }
            r->class_id = id;
            return 0;
        }
        return bad(e, "class_label", "'class_label' must be an integer or a label");
    }
    if (get_str(root, "prompt", &prompt, e))
        return DITD_EINVAL;
    if (!prompt) {
        bad(e, "prompt", "'prompt' is required: it names a class of this class-conditional model (or give 'class_label')");
        list_classes(m, e->message, sizeof e->message);
        return DITD_EINVAL;
    }
    /* the prompt names a class, trimmed of surrounding blanks */
    char word[256];
    size_t a = 0, b = strlen(prompt);
    while (a < b && (prompt[a] == ' ' || prompt[a] == '\t' || prompt[a] == '\n'))
        a++;
    while (b > a && (prompt[b - 1] == ' ' || prompt[b - 1] == '\t' || prompt[b - 1] == '\n' || prompt[b - 1] == '.'))
        b--;
    if (b - a >= sizeof word || ditd_model_class_from_str(m, (snprintf(word, sizeof word, "%.*s", (int)(b - a), prompt + a), word), &id)) {
        bad(e, "prompt", "'%.200s' names no class of '%s' (a class-conditional model: the prompt is a class label or number)",
            prompt, m->name);
        list_classes(m, e->message, sizeof e->message);
        return DITD_EINVAL;
    }
    r->class_id = id;
    return 0;
}

/* A field the model's pipeline does not take: refused by name. */
static int not_taken(json_t *root, const char *key, const ditd_model_info *m, const char *what,
                     ditd_api_error *e)
{
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v))
        return 0;
    return bad(e, key, "'%s' is not taken by '%s' (%s): %s", key, m->name, m->pipeline->name, what);
}

/* skip_guidance_layers (block indices) and their scale, start, stop. */
static int get_skip_layers(json_t *root, const ditd_model_info *m, ditd_genreq *r,
                           ditd_api_error *e)
{
    const ditd_pipeline_class *pc = m->pipeline;
    json_t *v = json_object_get(root, "skip_guidance_layers");
    r->slg_scale = pc->slg_scale;
    r->slg_start = pc->slg_start;
    r->slg_stop = pc->slg_stop;
    if (!(pc->request & DITD_REQ_SKIP_LAYERS)) {
        static const char *const keys[] = {"skip_guidance_layers", "skip_layer_guidance_scale",
                                           "skip_layer_guidance_start", "skip_layer_guidance_stop"};
        for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
            if (not_taken(root, keys[i], m, "it has no skip-layer guidance", e))
                return DITD_EINVAL;
        return 0;
    }
    if (v && !json_is_null(v)) {
        if (!json_is_array(v) || json_array_size(v) > DITD_MAX_SKIP_LAYERS)
            return bad(e, "skip_guidance_layers", "'skip_guidance_layers' must be an array of at "
                       "most %d block indices", DITD_MAX_SKIP_LAYERS);
        for (size_t i = 0; i < json_array_size(v); i++) {
            json_t *x = json_array_get(v, i);
            if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) > 1000)
                return bad(e, "skip_guidance_layers", "'skip_guidance_layers'[%zu] must be a block "
                           "index in 0..1000", i);
            r->skip_layers[r->n_skip_layers++] = (int)json_integer_value(x);
        }
    }
    if (get_number(root, "skip_layer_guidance_scale", 0, 100, &r->slg_scale, e) ||
        get_number(root, "skip_layer_guidance_start", 0, 1, &r->slg_start, e) ||
        get_number(root, "skip_layer_guidance_stop", 0, 1, &r->slg_stop, e))
        return DITD_EINVAL;
    return 0;
}

/* The prompts, negative prompts, true CFG, T5 length and skip-layer
 * guidance of a text model, as its pipeline row takes them. */
static int get_text_fields(json_t *root, const ditd_model_info *m, ditd_genreq *r,
                           ditd_api_error *e)
{
    static const char *const p23[2] = {"prompt_2", "prompt_3"};
    static const char *const n23[2] = {"negative_prompt_2", "negative_prompt_3"};
    const ditd_pipeline_class *pc = m->pipeline;
    const int prompts = ditd_pipeline_class_prompts(pc);
    json_t *v;
    long l;
    int given, err;
    if ((v = json_object_get(root, "class_label")) && !json_is_null(v))
        return bad(e, "class_label", "'class_label' is for class-conditional models; '%s' is "
                   "text-conditioned: describe the image in 'prompt'", m->name);
    if ((err = get_text(root, "prompt", 1, &r->prompt, e)))
        return err;
    if (!(pc->request & DITD_REQ_NEGATIVE_PROMPT)) {
        if (not_taken(root, "negative_prompt", m, "it runs no unconditional pass", e))
            return DITD_EINVAL;
    } else if ((err = get_text(root, "negative_prompt", 0, &r->negative_prompt, e))) {
        return err;
    }
    for (int k = 0; k < 2; k++) {
        if (k + 1 >= prompts) {
            if (not_taken(root, p23[k], m, "its text encoders all read 'prompt'", e) ||
                not_taken(root, n23[k], m, "its text encoders all read 'negative_prompt'", e))
                return DITD_EINVAL;
            continue;
        }
        if ((err = get_text(root, p23[k], 0, &r->prompt_23[k], e)) ||
            ((pc->request & DITD_REQ_NEGATIVE_PROMPT) &&
             (err = get_text(root, n23[k], 0, &r->negative_23[k], e))))
            return err;
    }
    r->true_cfg = 1.0f; /* FluxPipeline's: no unconditional pass */
    if (!(pc->request & DITD_REQ_TRUE_CFG)) {
        if (not_taken(root, "true_cfg_scale", m, "it guides with guidance_scale", e))
            return DITD_EINVAL;
    } else if (get_number(root, "true_cfg_scale", 0, 100, &r->true_cfg, e)) {
        return DITD_EINVAL;
    }
    if (get_skip_layers(root, m, r, e))
        return DITD_EINVAL;
    r->max_sequence_length = m->default_max_sequence_length;
    if (get_int(root, "max_sequence_length", 1, m->max_sequence_length, &l, &given, e))
        return DITD_EINVAL;
    if (given)
        r->max_sequence_length = (int)l;
    return 0;
}

/* One field of "cache" (not "method") onto the config. The JSON type each
 * field takes (proto/openapi.json) is checked here: numbers go on exactly
 * (%.17g reads back the same double), booleans, null where the Diffusers
 * field is Optional, strings, arrays of strings or of numbers. A name no
 * config has goes to ditd_cache_config_set, which names it. */
enum { CF_NUM, CF_INT, CF_INT_OR_NULL, CF_BOOL, CF_DTYPE, CF_PATTERNS, CF_RATIOS };
static const struct {
    const char *key;
    int kind;
} cache_fields[] = {
    {"threshold", CF_NUM},          {"cache_interval", CF_INT},
    {"disable_cache_before_step", CF_INT}, {"disable_cache_after_step", CF_INT_OR_NULL},
    {"max_order", CF_INT},          {"taylor_factors_dtype", CF_DTYPE},
    {"cache_identifiers", CF_PATTERNS}, {"skip_predict_identifiers", CF_PATTERNS},
    {"use_lite_mode", CF_BOOL},     {"max_skip_steps", CF_INT},
    {"retention_ratio", CF_NUM},    {"num_inference_steps", CF_INT},
    {"mag_ratios", CF_RATIOS},      {"calibrate", CF_BOOL},
};

static int cache_field(ditd_cache_config *c, const char *key, json_t *v, ditd_api_error *e)
{
    char param[64], text[64];
    int kind = -1, err = 0;
    snprintf(param, sizeof param, "cache.%s", key);
    for (size_t i = 0; i < sizeof cache_fields / sizeof cache_fields[0]; i++)
        if (!strcmp(cache_fields[i].key, key))
            kind = cache_fields[i].kind;
    if (kind < 0) /* not a field of any method: the config's message lists the method's */
        err = ditd_cache_config_set(c, key, "0");
    else if (kind == CF_NUM || kind == CF_INT || kind == CF_INT_OR_NULL) {
        if (kind == CF_INT_OR_NULL && json_is_null(v)) {
            err = ditd_cache_config_set(c, key, "None");
        } else if (!json_is_number(v)) {
            return bad(e, param, "'%s' must be %s", param,
                       kind == CF_NUM ? "a number" : kind == CF_INT ? "an integer"
                                                                    : "an integer or null");
        } else {
            if (json_is_integer(v))
                snprintf(text, sizeof text, "%lld", (long long)json_integer_value(v));
            else
                snprintf(text, sizeof text, "%.17g", json_real_value(v));
            err = ditd_cache_config_set(c, key, text);
        }
    } else if (kind == CF_BOOL) {
        if (!json_is_boolean(v))
            return bad(e, param, "'%s' must be true or false", param);
        err = ditd_cache_config_set(c, key, json_is_true(v) ? "true" : "false");
    } else if (kind == CF_DTYPE) {
        if (!json_is_string(v))
            return bad(e, param, "'%s' must be a string (\"bfloat16\" or \"float32\")", param);
        err = ditd_cache_config_set(c, key, json_string_value(v));
    } else if (kind == CF_PATTERNS) {
        const char *items[DITD_CACHE_MAX_PATTERNS];
        size_t n;
        if (json_is_null(v))
            return ditd_cache_config_set_list(c, key, items, 0) ? bad(e, param, "'%s': %s", param,
                                                                      ditd_err_detail())
                                                                : 0;
        if (!json_is_array(v) || (n = json_array_size(v)) > DITD_CACHE_MAX_PATTERNS)
            return bad(e, param, "'%s' must be an array of at most %d regular expressions, or null",
                       param, DITD_CACHE_MAX_PATTERNS);
        for (size_t i = 0; i < n; i++) {
            if (!json_is_string(json_array_get(v, i)))
                return bad(e, param, "'%s'[%zu] must be a string", param, i);
            items[i] = json_string_value(json_array_get(v, i));
        }
        err = ditd_cache_config_set_list(c, key, items, (int)n);
    } else { /* CF_RATIOS: numbers, or "FLUX" */
        size_t n;
        if (json_is_string(v) && !strcmp(json_string_value(v), "FLUX")) {
            err = ditd_cache_config_set(c, key, "FLUX");
        } else if (!json_is_array(v) || (n = json_array_size(v)) > DITD_CACHE_MAX_RATIOS) {
            return bad(e, param, "'%s' must be an array of at most %d numbers, or \"FLUX\"", param,
                       DITD_CACHE_MAX_RATIOS);
        } else {
            double *vals = malloc((n ? n : 1) * sizeof *vals);
            if (!vals)
                return ditd_api_error_set(e, 500, "server_error", "internal_error", NULL,
                                          "out of memory"), DITD_ENOMEM;
            for (size_t i = 0; i < n; i++) {
                if (!json_is_number(json_array_get(v, i))) {
                    free(vals);
                    return bad(e, param, "'%s'[%zu] must be a number", param, i);
                }
                vals[i] = json_number_value(json_array_get(v, i));
            }
            err = ditd_cache_config_set_floats(c, key, vals, (int)n);
            free(vals);
        }
    }
    if (err)
        return bad(e, param, "'%s': %s", param, ditd_err_detail());
    return 0;
}

/* "cache": {"method": ..., <the Diffusers config's fields>} (null or
 * method "none": off), else the server's default. */
static int get_cache(json_t *root, const ditd_genreq_model *gm, ditd_genreq *r, ditd_api_error *e)
{
    json_t *v = json_object_get(root, "cache"), *mv, *x;
    const char *key;
    ditd_cache_method m;
    if (!v) {
        if (gm->cache_default)
            r->cache = *gm->cache_default;
        else
            ditd_cache_config_default(DITD_CACHE_NONE, &r->cache);
        return 0;
    }
    ditd_cache_config_default(DITD_CACHE_NONE, &r->cache);
    if (json_is_null(v))
        return 0;
    if (!json_is_object(v))
        return bad(e, "cache", "'cache' must be an object {\"method\": \"first_block_cache\" | "
                   "\"taylorseer_cache\" | \"mag_cache\" | \"none\", <its fields>} or null");
    mv = json_object_get(v, "method");
    if (!mv || !json_is_string(mv))
        return bad(e, "cache.method", "'cache.method' must be a string: \"first_block_cache\", "
                   "\"taylorseer_cache\", \"mag_cache\" or \"none\"");
    if (ditd_cache_method_from_str(json_string_value(mv), &m))
        return bad(e, "cache.method", "'cache.method': %s", ditd_err_detail());
    ditd_cache_config_default(m, &r->cache);
    json_object_foreach(v, key, x) {
        if (!strcmp(key, "method"))
            continue;
        if (m == DITD_CACHE_NONE) {
            char param[64];
            snprintf(param, sizeof param, "cache.%s", key);
            return bad(e, param, "'%s': cache method \"none\" takes no fields", param);
        }
        if (cache_field(&r->cache, key, x, e))
            return DITD_EINVAL;
    }
    if (ditd_cache_config_check(&r->cache)) {
        /* a range: name the request's field the check names */
        char param[64] = "cache";
        json_object_foreach(v, key, x) {
            if (strcmp(key, "method") != 0 && strstr(ditd_err_detail(), key)) {
                snprintf(param, sizeof param, "cache.%s", key);
                break;
            }
        }
        return bad(e, param, "'%s': %s", param, ditd_err_detail());
    }
    return 0;
}

/* "loras": [{"name": NAME, "scale": S}, ...] (null or absent: none): each
 * name one of the server's adapters, at most once; scale a number in
 * [-10, 10] (default 1, Diffusers' adapter_weights). */
static int get_loras(json_t *root, const ditd_genreq_model *gm, ditd_genreq *r, ditd_api_error *e)
{
    json_t *v = json_object_get(root, "loras"), *it, *x;
    size_t i;
    r->n_loras = 0;
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_array(v))
        return bad(e, "loras", "'loras' must be an array of {\"name\": ..., \"scale\": ...}");
    if (json_array_size(v) > (size_t)gm->max_loras)
        return bad(e, "loras", "'loras' names %zu adapters; at most %d per request "
                   "(--max-loras-per-request)", json_array_size(v), gm->max_loras);
    json_array_foreach(v, i, it) {
        char param[64];
        const char *key;
        int k;
        snprintf(param, sizeof param, "loras[%zu]", i);
        if (!json_is_object(it))
            return bad(e, param, "'%s' must be an object {\"name\": ..., \"scale\": ...}", param);
        json_object_foreach(it, key, x)
            if (strcmp(key, "name") && strcmp(key, "scale")) {
                char kp[64];
                snprintf(kp, sizeof kp, "loras[%zu].%.32s", i, key);
                ditd_utf8_clean(kp);
                return bad(e, kp, "'%s': unknown field (an entry has \"name\" and \"scale\")", kp);
            }
        snprintf(param, sizeof param, "loras[%zu].name", i);
        x = json_object_get(it, "name");
        if (!json_is_string(x))
            return bad(e, param, "'%s' must be a string: an adapter of GET /v1/loras", param);
        const char *name = json_string_value(x);
        char shown[80];
        snprintf(shown, sizeof shown, "%.64s", name);
        ditd_utf8_clean(shown);
        /* a NULL name is a free slot (an adapter unloaded, or one loading) */
        for (k = 0; k < gm->n_loras && (!gm->lora_names[k] || strcmp(gm->lora_names[k], name)); k++)
            ;
        if (k == gm->n_loras) {
            bad(e, param, "'%s': unknown LoRA adapter '%s'; ", param, shown);
            size_t at = strlen(e->message);
            int listed = 0;
            for (int a = 0; a < gm->n_loras && at < sizeof e->message; a++)
                if (gm->lora_names[a])
                    at += (size_t)snprintf(e->message + at, sizeof e->message - at, "%s'%s'",
                                           listed++ ? ", " : "this server has ", gm->lora_names[a]);
            if (!listed)
                snprintf(e->message + at, sizeof e->message - at,
                         "this server has none (ditd serve --lora NAME=PATH)");
            return DITD_EINVAL;
        }
        for (int a = 0; a < r->n_loras; a++)
            if (r->lora_idx[a] == k)
                return bad(e, param, "'%s': adapter '%s' is named twice", param, shown);
        float sc = 1.0f;
        snprintf(param, sizeof param, "loras[%zu].scale", i);
        x = json_object_get(it, "scale");
        if (x && !json_is_null(x)) {
            if (!json_is_number(x) || !(json_number_value(x) >= -10 && json_number_value(x) <= 10))
                return bad(e, param, "'%s' must be a number in -10..10", param);
            sc = (float)json_number_value(x);
        }
        r->lora_idx[r->n_loras] = k;
        r->lora_scale[r->n_loras++] = sc;
    }
    return 0;
}

/* "size": "WxH" in pixels (the image, not the latents), or "auto". A fixed
 * model makes its one size; a resizable one any multiple of size_multiple
 * within [min_size, max_size] per side. */
static int get_size(json_t *root, const ditd_model_info *m, ditd_genreq *r, ditd_api_error *e)
{
    const char *s;
    r->width = m->image_width;
    r->height = m->image_height;
    if (get_str(root, "size", &s, e))
        return DITD_EINVAL;
    if (!s || !strcmp(s, "auto"))
        return 0;
    int w = parse_dim(&s[0], 'x'), h = w > 0 ? parse_dim(strchr(s, 'x') + 1, '\0') : -1;
    if (w <= 0 || h <= 0)
        return bad(e, "size", "'size' must be \"WIDTHxHEIGHT\" (this model: \"%dx%d\"), got \"%s\"",
                   m->image_width, m->image_height, s);
    if (ditd_model_check_size(m, w, h))
        return bad(e, "size", "%s", ditd_err_detail());
    r->width = w;
    r->height = h;
    return 0;
}

static int parse(const char *body, size_t len, const ditd_genreq_model *gm, int video,
                 ditd_genreq *r, ditd_api_error *e);

int ditd_genreq_parse(const char *body, size_t len, const ditd_genreq_model *gm,
                      ditd_genreq *r, ditd_api_error *e)
{
    return parse(body, len, gm, 0, r, e);
}

void ditd_genreq_seconds(const ditd_genreq *r, char *out, size_t n)
{
    snprintf(out, n, "%g", r->fps > 0 ? (double)r->frames / (double)r->fps : 0.0);
}

/* An image-to-video frame (input_reference, last_frame_reference): v
 * decoded under the default limits into *rgb, (h, w, 3) 8-bit RGB at its
 * own size (owned). Errors name field. */
static int get_frame(json_t *v, const char *field, uint8_t **rgb, int *w, int *h,
                     ditd_api_error *e)
{
    ditd_image im;
    int err = ditd_genreq_json_image(v, field, NULL, &im, e);
    if (err)
        return err;
    const size_t np = (size_t)im.width * (size_t)im.height;
    if (!(*rgb = malloc(np * 3))) {
        ditd_image_free(&im);
        ditd_api_error_set(e, 500, "server_error", "internal_error", NULL, "out of memory");
        return DITD_ENOMEM;
    }
    for (size_t i = 0; i < np; i++) /* PIL's convert("RGB"): alpha dropped */
        memcpy(*rgb + 3 * i, im.pixels + (size_t)im.channels * i, 3);
    *w = im.width;
    *h = im.height;
    ditd_image_free(&im);
    return 0;
}

/* The clip fields of a video body (the rest is parse's). */
static int get_video(json_t *root, const ditd_model_info *m, ditd_genreq *r, ditd_api_error *e)
{
    static const char *const image_only[] = {"n", "response_format", "output_format", "stream",
                                             "partial_images", "background"};
    json_t *v;
    long l;
    int given;
    for (size_t i = 0; i < sizeof image_only / sizeof image_only[0]; i++)
        if ((v = json_object_get(root, image_only[i])) && !json_is_null(v))
            return bad(e, image_only[i], "'%s' is for images; a video job makes one clip, "
                       "polled at /v1/videos/{id}", image_only[i]);
    int i2v = m->pipeline->image_to_video;
    v = json_object_get(root, "input_reference");
    if (v && !json_is_null(v) && !i2v)
        return bad(e, "input_reference", "'input_reference' (image-to-video) is for an "
                   "image-to-video model: '%s' is %s (text-to-video); send the prompt alone",
                   m->name, m->pipeline->name);
    if (i2v) { /* WanImageToVideoPipeline: every clip starts from an image */
        if (!v || json_is_null(v))
            return bad(e, "input_reference", "'%s' is %s (image-to-video): every clip starts "
                       "from an image; give 'input_reference' (a PNG, JPEG or WebP: a file part "
                       "of the form, or base64 or a data URL in JSON)", m->name,
                       m->pipeline->name);
        int err = get_frame(v, "input_reference", &r->image, &r->image_w, &r->image_h, e);
        if (err)
            return err;
    }
    /* FLF2V: a last frame as well, ditd's field (OpenAI's API has none) */
    v = json_object_get(root, "last_frame_reference");
    if (v && !json_is_null(v) && !m->last_image)
        return bad(e, "last_frame_reference", "'last_frame_reference' (the last frame, "
                   "first-last-frame-to-video) is for an FLF2V model: '%s' is %s (%s), whose "
                   "transformer takes no last frame", m->name, m->pipeline->name,
                   i2v ? "image-to-video from the first frame alone" : "text-to-video");
    if (m->last_image) {
        if (!v || json_is_null(v))
            return bad(e, "last_frame_reference", "'%s' is first-last-frame-to-video (FLF2V): "
                       "every clip ends on a given image too; give 'last_frame_reference' (a "
                       "PNG, JPEG or WebP, in the forms of 'input_reference')", m->name);
        int err = get_frame(v, "last_frame_reference", &r->last_image, &r->last_w, &r->last_h,
                            e);
        if (err)
            return err;
    }
    r->fps = m->fps;
    if (get_int(root, "fps", 1, 120, &l, &given, e))
        return DITD_EINVAL;
    if (given)
        r->fps = (int)l;
    /* frames: num_frames, else seconds (OpenAI sends a string: "4") */
    int n = m->frames;
    json_t *sec = json_object_get(root, "seconds");
    if (get_int(root, "num_frames", 1, 100000, &l, &given, e))
        return DITD_EINVAL;
    if (given && sec && !json_is_null(sec))
        return bad(e, "seconds", "give 'seconds' or 'num_frames', not both");
    if (given) {
        n = (int)l;
    } else if (sec && !json_is_null(sec)) {
        double d = -1;
        char *end = NULL;
        if (json_is_number(sec))
            d = json_number_value(sec);
        else if (json_is_string(sec) && json_string_length(sec) > 0 && json_string_length(sec) < 32)
            d = strtod(json_string_value(sec), &end);
        if ((end && *end) || !(d > 0) || d > 3600)
            return bad(e, "seconds", "'seconds' must be a positive number of seconds (a string "
                       "such as \"4\" or a number), at most %g here",
                       (double)(m->max_frames - 1) / (double)r->fps);
        n = (int)(d * (double)r->fps + 0.5) + 1;
    }
    if (ditd_model_check_frames(m, n))
        return bad(e, given ? "num_frames" : sec && !json_is_null(sec) ? "seconds" : "num_frames",
                   "%s", ditd_err_detail());
    r->frames = ditd_model_round_frames(m, n);
    if (m->last_image && r->frames < 2) /* the last frame is not the first */
        return bad(e, given ? "num_frames" : sec && !json_is_null(sec) ? "seconds" : "num_frames",
                   "'%s' is FLF2V: a clip from its first to its last frame has at least %d "
                   "frames", m->name, 1 + m->frame_step);
    if ((v = json_object_get(root, "guidance_scale_2")) && !json_is_null(v)) {
        if (!m->transformer_2_dir[0])
            return bad(e, "guidance_scale_2", "'guidance_scale_2' is the second expert's scale; "
                       "'%s' has one transformer", m->name);
        if (get_number(root, "guidance_scale_2", 0, 100, &r->guidance_2, e))
            return DITD_EINVAL;
        r->has_guidance_2 = 1;
    }
    return 0;
}

int ditd_genreq_parse_video(const char *body, size_t len, const ditd_genreq_model *gm,
                            ditd_genreq *r, ditd_api_error *e)
{
    return parse(body, len, gm, 1, r, e);
}

static int parse(const char *body, size_t len, const ditd_genreq_model *gm, int video,
                 ditd_genreq *r, ditd_api_error *e)
{
    const ditd_model_info *m = gm->info;
    int text = m->shapes.cond.kind == DITD_COND_TEXT;
    json_error_t jerr;
    json_t *root, *v;
    const char *s;
    long l;
    int given, err = DITD_EINVAL;

    memset(r, 0, sizeof *r);
    root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        bad(e, NULL, "the body is not valid JSON: %s (line %d, column %d)", jerr.text, jerr.line,
            jerr.column);
        return DITD_EINVAL;
    }
    if (!json_is_object(root)) {
        bad(e, NULL, "the body must be a JSON object");
        goto done;
    }
    /* model: absent means the served one; an alias reaches it too */
    if (get_str(root, "model", &s, e))
        goto done;
    if (s && !ditd_genreq_model_named(gm, s)) {
        ditd_api_error_set(e, 404, "invalid_request_error", "model_not_found", "model",
                           "The model '%s' does not exist; this server has '%s'", s, m->name);
        for (int i = 0; i < gm->n_aliases; i++) {
            size_t at = strlen(e->message);
            snprintf(e->message + at, sizeof e->message - at, "%s'%s'",
                     i ? ", " : " (also named ", gm->aliases[i]);
        }
        if (gm->n_aliases) {
            size_t at = strlen(e->message);
            snprintf(e->message + at, sizeof e->message - at, ")");
        }
        err = DITD_ENOENT;
        goto done;
    }
    /* a clip or an image: each has its endpoint */
    if (!video && m->frames > 0) {
        bad(e, "model", "'%s' is a video model (%s): create clips with POST /v1/videos", m->name,
            m->pipeline->name);
        goto done;
    }
    if (video && m->frames <= 0) {
        bad(e, "model", "'%s' is an image model: POST /v1/images/generations", m->name);
        goto done;
    }
    if (video && get_video(root, m, r, e))
        goto done;
    /* an edit's fields on a generation: the client means the other endpoint
     * (editreq.c takes them off before it calls this parser) */
    static const char *const edit_only[] = {"image", "images", "mask", "strength"};
    for (size_t i = 0; i < sizeof edit_only / sizeof edit_only[0]; i++)
        if ((v = json_object_get(root, edit_only[i])) && !json_is_null(v)) {
            bad(e, edit_only[i], "'%s' is for image edits: POST /v1/images/edits", edit_only[i]);
            goto done;
        }
    /* n */
    r->n = 1;
    if (get_int(root, "n", 1, DITD_GENREQ_MAX_N, &l, &given, e))
        goto done;
    if (given)
        r->n = (int)l;
    if (get_size(root, m, r, e))
        goto done;
    /* response_format, output_format */
    if (get_str(root, "response_format", &s, e))
        goto done;
    if (s && strcmp(s, "b64_json") != 0) {
        bad(e, "response_format",
            strcmp(s, "url") == 0
                ? "response_format 'url' is not supported: ditd keeps no image store; use 'b64_json' (or Accept: image/png)"
                : "response_format must be 'b64_json'");
        goto done;
    }
    if (get_str(root, "output_format", &s, e))
        goto done;
    if (s && strcmp(s, "png") != 0) {
        bad(e, "output_format", "output_format '%s' is not supported; supported: 'png'", s);
        goto done;
    }
    /* stream, partial_images */
    if ((v = json_object_get(root, "stream")) && !json_is_null(v)) {
        if (!json_is_boolean(v)) {
            bad(e, "stream", "'stream' must be a boolean");
            goto done;
        }
        r->stream = json_is_true(v);
    }
    if (get_int(root, "partial_images", 0, 3, &l, &given, e))
        goto done;
    r->partial_images = given ? (int)l : 0;
    if (get_str(root, "user", &s, e))
        goto done;
    /* seed */
    if (get_int(root, "seed", 0, INT64_MAX, &l, &given, e))
        goto done;
    if (given) {
        r->seed = (uint64_t)l;
        r->seed_given = 1;
    } else {
        uint64_t rnd = 0;
        if (getrandom(&rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd)
            rnd = (uint64_t)(uintptr_t)&rnd ^ (uint64_t)len;
        r->seed = rnd & (uint64_t)INT64_MAX; /* fits a JSON integer */
    }
    /* steps, guidance, sampler */
    r->steps = m->default_steps;
    if (get_int(root, "num_inference_steps", 1, 1000, &l, &given, e))
        goto done;
    if (given)
        r->steps = (int)l;
    r->guidance = m->default_guidance;
    if (get_number(root, "guidance_scale", 0, 100, &r->guidance, e))
        goto done;
    r->sampler = gm->sched_default;
    if (m->default_sampler[0])
        ditd_sampler_kind_from_str(m->default_sampler, &r->sampler);
    if (get_str(root, "sampler", &s, e))
        goto done;
    if (s && ditd_sampler_kind_from_str(s, &r->sampler)) {
        char list[256];
        bad(e, "sampler", "unknown sampler '%s'; supported: %s", s,
            ditd_sampler_kind_list(", ", list, sizeof list));
        goto done;
    }
    /* the conditioning: a class, or text */
    if (text) {
        if ((err = get_text_fields(root, m, r, e)))
            goto done;
    } else {
        static const char *const text_only[] = {
            "negative_prompt",   "true_cfg_scale",    "max_sequence_length",
            "prompt_2",          "prompt_3",          "negative_prompt_2",
            "negative_prompt_3", "skip_guidance_layers"};
        for (size_t i = 0; i < sizeof text_only / sizeof text_only[0]; i++)
            if ((v = json_object_get(root, text_only[i])) && !json_is_null(v)) {
                bad(e, text_only[i], "'%s' is for text models; '%s' is class-conditional (its "
                    "prompt names a class)", text_only[i], m->name);
                goto done;
            }
        if (get_class(root, m, r, e))
            goto done;
    }
    if ((err = get_cache(root, gm, r, e)))
        goto done;
    if ((err = get_loras(root, gm, r, e)))
        goto done;
    if (gm->sched) { /* the sampler's schedule for these steps, built as a replica builds it */
        ditd_sched_config sc;
        ditd_sampler *smp = NULL;
        err = ditd_sched_config_convert(gm->sched, r->sampler, &sc);
        if (!err) {
            sc.image_seq_len = m->shapes.tokens;
            sc.pipeline_sigmas = m->pipeline->pipeline_sigmas;
            err = ditd_sampler_new(&sc, r->steps, 1, 1, &smp);
        }
        ditd_sampler_free(smp);
        if (err) {
            bad(e, "num_inference_steps", "num_inference_steps %d with %s: %s", r->steps,
                ditd_sampler_kind_name(r->sampler), ditd_err_detail());
            err = DITD_EINVAL;
            goto done;
        }
    }
    err = 0;
done:
    if (err)
        ditd_genreq_free(r);
    json_decref(root);
    ditd_err_clear();
    return err;
}
