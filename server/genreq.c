/* POST /v1/images/generations bodies into typed requests. */
#include "server/genreq.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "engine/core/error.h"

int ditd_api_error_set(ditd_api_error *e, int status, const char *type, const char *code,
                       const char *param, const char *fmt, ...)
{
    va_list ap;
    e->status = status;
    e->type = type;
    e->code = code;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return status;
}

char *ditd_api_error_json(const ditd_api_error *e)
{
    json_t *root = json_pack("{s:{s:s,s:s,s:o,s:s}}", "error", "message", e->message, "type",
                             e->type ? e->type : "server_error", "param",
                             e->param[0] ? json_string(e->param) : json_null(), "code",
                             e->code ? e->code : "internal_error");
    char *s;
    if (!root)
        return NULL;
    s = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    return s;
}

static int bad(ditd_api_error *e, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int bad(ditd_api_error *e, const char *param, const char *fmt, ...)
{
    va_list ap;
    e->status = 400;
    e->type = "invalid_request_error";
    e->code = "invalid_value";
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return DITD_EINVAL;
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

int ditd_genreq_parse(const char *body, size_t len, const ditd_model_info *m,
                      ditd_sampler_kind sched_default, ditd_genreq *r, ditd_api_error *e)
{
    json_error_t jerr;
    json_t *root, *v;
    const char *s, *prompt;
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
    /* model: absent means the served one */
    if (get_str(root, "model", &s, e))
        goto done;
    if (s && strcmp(s, m->name) != 0) {
        ditd_api_error_set(e, 404, "invalid_request_error", "model_not_found", "model",
                           "The model '%s' does not exist; this server has '%s'", s, m->name);
        err = DITD_ENOENT;
        goto done;
    }
    /* n */
    r->n = 1;
    if (get_int(root, "n", 1, DITD_GENREQ_MAX_N, &l, &given, e))
        goto done;
    if (given)
        r->n = (int)l;
    /* size: "WxH" the model makes, or "auto" */
    r->width = r->height = m->image_size;
    if (get_str(root, "size", &s, e))
        goto done;
    if (s && strcmp(s, "auto") != 0) {
        int w = 0, h = 0, used = 0;
        if (sscanf(s, "%dx%d%n", &w, &h, &used) != 2 || s[used] != '\0' || w <= 0 || h <= 0) {
            bad(e, "size", "'size' must be \"WIDTHxHEIGHT\" (this model: \"%dx%d\"), got \"%s\"",
                m->image_size, m->image_size, s);
            goto done;
        }
        if (w != m->image_size || h != m->image_size) {
            bad(e, "size", "size \"%s\" is not supported by '%s'; supported: \"%dx%d\"", s, m->name,
                m->image_size, m->image_size);
            goto done;
        }
    }
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
    if ((v = json_object_get(root, "guidance_scale")) && !json_is_null(v)) {
        if (!json_is_number(v) || !(json_number_value(v) >= 0 && json_number_value(v) <= 100)) {
            bad(e, "guidance_scale", "'guidance_scale' must be a number in 0..100");
            goto done;
        }
        r->guidance = (float)json_number_value(v);
    }
    r->sampler = sched_default;
    if (m->default_sampler[0])
        ditd_sampler_kind_from_str(m->default_sampler, &r->sampler);
    if (get_str(root, "sampler", &s, e))
        goto done;
    if (s && ditd_sampler_kind_from_str(s, &r->sampler)) {
        bad(e, "sampler", "unknown sampler '%s'; supported: 'ddim', 'dpmpp-2m', 'flow-euler'", s);
        goto done;
    }
    /* class: class_label wins over the prompt */
    if ((v = json_object_get(root, "class_label")) && !json_is_null(v)) {
        int id;
        if (json_is_integer(v)) {
            if (json_integer_value(v) < 0 || json_integer_value(v) >= m->num_classes) {
                bad(e, "class_label", "class_label %lld is outside 0..%d",
                    (long long)json_integer_value(v), m->num_classes - 1);
                list_classes(m, e->message, sizeof e->message);
                goto done;
            }
            r->class_id = json_integer_value(v);
        } else if (json_is_string(v)) {
            if (ditd_model_class_from_str(m, json_string_value(v), &id)) {
                bad(e, "class_label", "unknown class '%s'", json_string_value(v));
                list_classes(m, e->message, sizeof e->message);
                goto done;
            }
            r->class_id = id;
        } else {
            bad(e, "class_label", "'class_label' must be an integer or a label");
            goto done;
        }
    } else {
        int id;
        if (get_str(root, "prompt", &prompt, e))
            goto done;
        if (!prompt) {
            bad(e, "prompt", "'prompt' is required: it names a class of this class-conditional model (or give 'class_label')");
            list_classes(m, e->message, sizeof e->message);
            goto done;
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
            goto done;
        }
        r->class_id = id;
    }
    err = 0;
done:
    json_decref(root);
    ditd_err_clear();
    return err;
}
