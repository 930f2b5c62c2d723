/* --lora NAME=PATH and --lora-dir DIR (server/common/lora_spec.h). */
#include "server/common/lora_spec.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "engine/core/error.h"

int ditd_lora_name_ok(const char *name, size_t len)
{
    if (len == 0 || len >= DITD_LORA_NAME_MAX)
        return 0;
    for (size_t i = 0; i < len; i++)
        if (!isalnum((unsigned char)name[i]) && !strchr("_-.", name[i]))
            return 0;
    return 1;
}

int ditd_lora_specs_find(const ditd_lora_specs *s, const char *name)
{
    for (int i = 0; i < s->n; i++)
        if (!strcmp(s->v[i].name, name))
            return i;
    return -1;
}

/* name[0 .. len) for path, checked. */
static int add(ditd_lora_specs *s, const char *name, size_t len, const char *path, const char *who)
{
    char nm[DITD_LORA_NAME_MAX];
    if (!ditd_lora_name_ok(name, len))
        return ditd_err_set(DITD_EINVAL, "%s: adapter name \"%.*s\" (for %s): a name is 1..%d "
                            "letters, digits, '_', '-' and '.'", who, (int)(len < 200 ? len : 200),
                            name, path, DITD_LORA_NAME_MAX - 1);
    memcpy(nm, name, len);
    nm[len] = '\0';
    int k = ditd_lora_specs_find(s, nm);
    if (k >= 0)
        return ditd_err_set(DITD_EINVAL, "%s: adapter name %s given twice (%s and %s)", who, nm,
                            s->v[k].path, path);
    if (s->n == DITD_LORA_SPEC_MAX)
        return ditd_err_set(DITD_EINVAL, "%s: more than %d adapters", who, DITD_LORA_SPEC_MAX);
    if (!*path || strlen(path) >= DITD_LORA_PATH_MAX)
        return ditd_err_set(DITD_EINVAL, "%s %s: the path is empty or over %d bytes", who, nm,
                            DITD_LORA_PATH_MAX - 1);
    strcpy(s->v[s->n].name, nm);
    strcpy(s->v[s->n].path, path);
    s->n++;
    return 0;
}

int ditd_lora_specs_add(ditd_lora_specs *s, const char *arg, const char *who)
{
    const char *eq = strchr(arg, '=');
    if (!eq || eq == arg || !eq[1])
        return ditd_err_set(DITD_EINVAL, "%s \"%s\": expected NAME=PATH", who, arg);
    return add(s, arg, (size_t)(eq - arg), eq + 1, who);
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

int ditd_lora_specs_add_dir(ditd_lora_specs *s, const char *dir, const char *who)
{
    static const char ext[] = ".safetensors";
    const size_t ne = sizeof ext - 1;
    DIR *d = opendir(dir);
    char **files = NULL;
    size_t n = 0, cap = 0;
    int err = 0;
    struct dirent *de;

    if (!d)
        return ditd_err_set(errno == ENOENT ? DITD_ENOENT : DITD_EIO, "%s %s: %s", who, dir,
                            strerror(errno));
    while ((de = readdir(d))) {
        size_t len = strlen(de->d_name);
        if (len <= ne || strcmp(de->d_name + len - ne, ext) || de->d_name[0] == '.')
            continue;
        if (n == cap) {
            char **nf = realloc(files, (cap = cap ? 2 * cap : 16) * sizeof *files);
            if (!nf) {
                err = ditd_err_set(DITD_ENOMEM, "%s %s", who, dir);
                goto done;
            }
            files = nf;
        }
        if (!(files[n] = strdup(de->d_name))) {
            err = ditd_err_set(DITD_ENOMEM, "%s %s", who, dir);
            goto done;
        }
        n++;
    }
    qsort(files, n, sizeof *files, cmp_str); /* every rank lists them alike */
    for (size_t i = 0; i < n && !err; i++) {
        char path[DITD_LORA_PATH_MAX];
        struct stat st;
        int w = snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        if (w < 0 || (size_t)w >= sizeof path) {
            err = ditd_err_set(DITD_EINVAL, "%s %s: the path of %s is over %d bytes", who, dir,
                               files[i], DITD_LORA_PATH_MAX - 1);
            break;
        }
        if (stat(path, &st) || !S_ISREG(st.st_mode))
            continue; /* a folder or a dangling link named *.safetensors */
        char w2[256];
        snprintf(w2, sizeof w2, "%s %s", who, dir);
        err = add(s, files[i], strlen(files[i]) - ne, path, w2);
    }
done:
    for (size_t i = 0; i < n; i++)
        free(files[i]);
    free(files);
    closedir(d);
    return err;
}

int ditd_lora_path_resolve(const char *base, const char *path, char *out)
{
    char joined[2 * DITD_LORA_PATH_MAX + 2];
    struct stat st;
    if (!*path)
        return ditd_err_set(DITD_EINVAL, "the path is empty");
    if (strlen(path) >= DITD_LORA_PATH_MAX)
        return ditd_err_set(DITD_EINVAL, "the path is over %d bytes", DITD_LORA_PATH_MAX - 1);
    if (path[0] != '/') {
        if (!base || !*base)
            return ditd_err_set(DITD_EINVAL, "%s: a relative path, and no folder to take it under "
                                "(--lora-root or --lora-dir)", path);
        snprintf(joined, sizeof joined, "%s/%s", base, path);
    } else {
        snprintf(joined, sizeof joined, "%s", path);
    }
    char *r = realpath(joined, NULL);
    if (!r)
        return ditd_err_set(errno == ENOENT || errno == ENOTDIR ? DITD_ENOENT : DITD_EIO, "%s: %s",
                            path, strerror(errno));
    int err = 0;
    if (strlen(r) >= DITD_LORA_PATH_MAX)
        err = ditd_err_set(DITD_EINVAL, "%s: the resolved path is over %d bytes", path,
                           DITD_LORA_PATH_MAX - 1);
    else if (stat(r, &st) || !S_ISREG(st.st_mode))
        err = ditd_err_set(DITD_EINVAL, "%s: not a regular file", path);
    else
        strcpy(out, r);
    free(r);
    return err;
}

int ditd_lora_path_under(const char *const *roots, int n, const char *resolved)
{
    for (int i = 0; i < n; i++) {
        if (!roots[i] || !*roots[i])
            continue;
        char *r = realpath(roots[i], NULL);
        if (!r)
            continue;
        size_t k = strlen(r);
        /* "/" holds everything; else the root and a '/' must begin it */
        int in = !strcmp(r, "/") || (!strncmp(resolved, r, k) && resolved[k] == '/');
        free(r);
        if (in)
            return 1;
    }
    return 0;
}
