/* Typed reads of one key of a component's config.json (jansson), with the
 * errors every config reader gives: the file and the key named, absent or
 * null taking the default. The readers (DiT, FLUX, AutoencoderKL) check
 * what each value may be themselves; this only reads.
 *
 * What it is not: no knowledge of any model's keys. */
#ifndef DITD_ENGINE_JSON_CONFIG_H
#define DITD_ENGINE_JSON_CONFIG_H

#include <jansson.h>
#include <stddef.h>

/* A config reader: root -> *out, errors naming `name` (the file). */
typedef int (*ditd_json_reader)(json_t *root, const char *name, void *out);

/* Parses the JSON file at path / the text (named `name` in errors) and hands
 * its root to rd. DITD_EFORMAT naming the file and line when it is not
 * JSON; else what rd returns. */
int ditd_json_config_file(const char *path, ditd_json_reader rd, void *out);
int ditd_json_config_text(const char *text, size_t len, const char *name, ditd_json_reader rd,
                          void *out);

/* An integer within +-1e9 (DITD_EFORMAT when not an integer, DITD_ERANGE
 * outside). */
int ditd_json_get_int(json_t *root, const char *path, const char *key, int dflt, int *out);

/* true or false (DITD_EFORMAT otherwise). */
int ditd_json_get_bool(json_t *root, const char *path, const char *key, int dflt, int *out);

/* A number (DITD_EFORMAT otherwise); *has (may be NULL) says whether the
 * key was given. */
int ditd_json_get_number(json_t *root, const char *path, const char *key, double dflt, int *has,
                         double *out);

#endif
