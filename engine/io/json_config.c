/* Typed reads of config.json keys, shared by the config readers. */
#include "engine/io/json_config.h"

#include "engine/core/error.h"

int ditd_json_get_int(json_t *root, const char *path, const char *key, int dflt, int *out)
{
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) {
        *out = dflt;
        return 0;
    }
    if (!json_is_integer(v))
        return ditd_err_set(DITD_EFORMAT, "%s: %s must be an integer", path, key);
    json_int_t i = json_integer_value(v);
    if (i < -1000000000 || i > 1000000000)
        return ditd_err_set(DITD_ERANGE, "%s: %s = %lld is out of range", path, key, (long long)i);
    *out = (int)i;
    return 0;
}

int ditd_json_get_bool(json_t *root, const char *path, const char *key, int dflt, int *out)
{
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) {
        *out = dflt;
        return 0;
    }
    if (!json_is_boolean(v))
        return ditd_err_set(DITD_EFORMAT, "%s: %s must be true or false", path, key);
    *out = json_is_true(v);
    return 0;
}

int ditd_json_get_number(json_t *root, const char *path, const char *key, double dflt, int *has,
                         double *out)
{
    json_t *v = json_object_get(root, key);
    if (has)
        *has = 0;
    *out = dflt;
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_number(v))
        return ditd_err_set(DITD_EFORMAT, "%s: %s must be a number", path, key);
    if (has)
        *has = 1;
    *out = json_number_value(v);
    return 0;
}

int ditd_json_config_file(const char *path, ditd_json_reader rd, void *out)
{
    json_error_t jerr;
    json_t *root = json_load_file(path, 0, &jerr);
    if (!root)
        return ditd_err_set(DITD_EFORMAT, "%s: line %d: %s", path, jerr.line, jerr.text);
    int err = rd(root, path, out);
    json_decref(root);
    return err;
}

int ditd_json_config_text(const char *text, size_t len, const char *name, ditd_json_reader rd,
                          void *out)
{
    json_error_t jerr;
    json_t *root = json_loadb(text, len, 0, &jerr);
    if (!root)
        return ditd_err_set(DITD_EFORMAT, "%s: line %d: %s", name, jerr.line, jerr.text);
    int err = rd(root, name, out);
    json_decref(root);
    return err;
}
