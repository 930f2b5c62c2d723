/* Typed reads of config.json keys, shared by the config readers. */
#include "engine/io/json_config.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "engine/core/error.h"

#define MAX_CONFIG_BYTES (16u << 20)

/* One parsed file: what it was when parsed (st_dev, st_ino, size, mtime). */
typedef struct cfg_entry {
    struct cfg_entry *next;
    char *path;
    ditd_json_text_filter filter;
    dev_t dev;
    ino_t ino;
    off_t size;
    struct timespec mtime;
    json_t *root;
    unsigned parses;
} cfg_entry;

static pthread_mutex_t cache_mu = PTHREAD_MUTEX_INITIALIZER;
static cfg_entry *cache;

/* The file's bytes (at most MAX_CONFIG_BYTES), NUL-terminated, or NULL with
 * *err set. */
static char *read_file(const char *path, size_t *len, int *err)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        *err = ditd_err_set(errno == ENOENT ? DITD_ENOENT : DITD_EIO, "%s: %s", path,
                            errno == ENOENT ? "missing" : strerror(errno));
        return NULL;
    }
    char *buf = malloc(MAX_CONFIG_BYTES + 1);
    size_t n = buf ? fread(buf, 1, MAX_CONFIG_BYTES + 1, f) : 0;
    if (!buf)
        *err = ditd_err_set(DITD_ENOMEM, "%s: out of memory", path);
    else if (ferror(f))
        *err = ditd_err_set(DITD_EIO, "%s: read error", path);
    else if (n > MAX_CONFIG_BYTES)
        *err = ditd_err_set(DITD_EFORMAT, "%s: larger than %u bytes", path, MAX_CONFIG_BYTES);
    else
        *err = 0;
    fclose(f);
    if (*err) {
        free(buf);
        return NULL;
    }
    buf[n] = '\0';
    *len = n;
    return buf;
}

static json_t *parse_file(const char *path, ditd_json_text_filter filter, int *err)
{
    size_t len = 0, flen = 0;
    char *text = read_file(path, &len, err), *ftext = NULL;
    json_error_t jerr;
    json_t *root;
    if (!text)
        return NULL;
    if (filter && !(ftext = filter(text, len, &flen))) {
        free(text);
        *err = ditd_err_set(DITD_ENOMEM, "%s: out of memory", path);
        return NULL;
    }
    root = json_loadb(ftext ? ftext : text, ftext ? flen : len, 0, &jerr);
    free(ftext);
    free(text);
    if (!root)
        *err = ditd_err_set(DITD_EFORMAT, "%s: line %d: %s", path, jerr.line, jerr.text);
    return root;
}

static int same_file(const cfg_entry *e, const struct stat *st)
{
    return e->dev == st->st_dev && e->ino == st->st_ino && e->size == st->st_size &&
           e->mtime.tv_sec == st->st_mtim.tv_sec && e->mtime.tv_nsec == st->st_mtim.tv_nsec;
}

json_t *ditd_json_config_get(const char *path, ditd_json_text_filter filter, int *err)
{
    struct stat st;
    cfg_entry *e;
    json_t *root;
    if (stat(path, &st) != 0) {
        *err = ditd_err_set(errno == ENOENT ? DITD_ENOENT : DITD_EIO, "%s: %s", path,
                            errno == ENOENT ? "missing" : strerror(errno));
        return NULL;
    }
    pthread_mutex_lock(&cache_mu);
    for (e = cache; e; e = e->next)
        if (e->filter == filter && !strcmp(e->path, path))
            break;
    if (e && e->root && same_file(e, &st)) {
        root = json_incref(e->root);
        pthread_mutex_unlock(&cache_mu);
        *err = 0;
        return root;
    }
    /* parsed under the lock: two replicas starting at once parse it once */
    root = parse_file(path, filter, err);
    if (root && !e && (e = calloc(1, sizeof *e))) { /* new: at the head */
        if (!(e->path = strdup(path))) {
            free(e);
            e = NULL;
        } else {
            e->filter = filter;
            e->next = cache;
            cache = e;
        }
    }
    if (root && e) { /* what the file was when parsed (else it is parsed each time) */
        e->dev = st.st_dev;
        e->ino = st.st_ino;
        e->size = st.st_size;
        e->mtime = st.st_mtim;
        json_decref(e->root);
        e->root = json_incref(root);
        e->parses++;
    }
    pthread_mutex_unlock(&cache_mu);
    return root;
}

unsigned ditd_json_config_parses(const char *path)
{
    unsigned n = 0;
    pthread_mutex_lock(&cache_mu);
    for (cfg_entry *e = cache; e; e = e->next)
        if (!path || !strcmp(e->path, path))
            n += e->parses;
    pthread_mutex_unlock(&cache_mu);
    return n;
}

void ditd_json_config_cache_clear(void)
{
    pthread_mutex_lock(&cache_mu);
    while (cache) {
        cfg_entry *e = cache;
        cache = e->next;
        json_decref(e->root);
        free(e->path);
        free(e);
    }
    pthread_mutex_unlock(&cache_mu);
}

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
    int err;
    json_t *root = ditd_json_config_get(path, NULL, &err);
    if (!root)
        return err;
    err = rd(root, path, out);
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
