/* Typed reads of one key of a component's config.json (jansson), with the
 * errors every config reader gives: the file and the key named, absent or
 * null taking the default. The readers (DiT, FLUX, AutoencoderKL) check
 * what each value may be themselves; this only reads.
 *
 * What it is not: no knowledge of any model's keys.
 *
 * Every component's config.json is read through one cache
 * (ditd_json_config_get), so that opening a replica parses each file once. */
#ifndef DITD_ENGINE_JSON_CONFIG_H
#define DITD_ENGINE_JSON_CONFIG_H

#include <jansson.h>
#include <stddef.h>

/* A config reader: root -> *out, errors naming `name` (the file). */
typedef int (*ditd_json_reader)(json_t *root, const char *name, void *out);

/* Rewrites a file's text before it is parsed (the scheduler config's
 * Python NaN / Infinity): a malloc'ed copy of *out_len bytes, or NULL when
 * out of memory. */
typedef char *(*ditd_json_text_filter)(const char *text, size_t len, size_t *out_len);

/* The parsed JSON file at path, from the process's cache of config files:
 * each is parsed once, whoever asks (the front-end, a replica's loaders, a
 * second replica, a restarted one), and again only when it changed on disk
 * (its device, inode, size or modification time). filter (may be NULL)
 * rewrites the text first; entries are per (path, filter). A new reference
 * (json_decref it); the root is shared: read it, never change it. NULL with
 * *err and the detail set: DITD_ENOENT ("PATH: missing"), DITD_EIO,
 * DITD_EFORMAT naming the file and line (not JSON, or over 16 MiB).
 * Thread-safe. */
json_t *ditd_json_config_get(const char *path, ditd_json_text_filter filter, int *err);
/* How many times the cache parsed path (NULL: every file) since the process
 * started or the last clear: its misses. For tests and the start-up log. */
unsigned ditd_json_config_parses(const char *path);
/* Forgets every parsed file (tests). */
void ditd_json_config_cache_clear(void);

/* Hands the root of the JSON file at path (through ditd_json_config_get) /
 * of the text (named `name` in errors) to rd. DITD_EFORMAT naming the file
 * and line when it is not JSON; else what rd returns. */
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
