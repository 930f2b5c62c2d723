/* API keys (server/daemon/auth.h). */
#include "server/daemon/auth.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "engine/core/error.h"

static int add(ditd_auth *a, const char *k, size_t n, const char *where)
{
    while (n && (k[n - 1] == ' ' || k[n - 1] == '\t' || k[n - 1] == '\r' || k[n - 1] == '\n'))
        n--;
    while (n && (*k == ' ' || *k == '\t')) {
        k++;
        n--;
    }
    if (!n)
        return 0;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)k[i] <= 0x20 || (unsigned char)k[i] >= 0x7f)
            return ditd_err_set(DITD_EINVAL, "%s: an API key holds a blank or a non-ASCII byte", where);
    char **p = realloc(a->keys, (size_t)(a->n + 1) * sizeof *p);
    if (!p)
        return DITD_ENOMEM;
    a->keys = p;
    if (!(a->keys[a->n] = strndup(k, n)))
        return DITD_ENOMEM;
    a->n++;
    return 0;
}

int ditd_auth_load(ditd_auth *a, const char *csv, const char *path)
{
    int err;
    if (csv) {
        for (const char *p = csv; *p;) {
            size_t n = strcspn(p, ",");
            if ((err = add(a, p, n, "--api-key")))
                return err;
            p += n;
            if (*p == ',')
                p++;
        }
    }
    if (path && *path) {
        FILE *f = fopen(path, "r");
        char line[4096];
        int before = a->n;
        if (!f)
            return ditd_err_set(DITD_EIO, "--api-key-file %s: %s", path, strerror(errno));
        while (fgets(line, sizeof line, f)) {
            const char *p = line;
            while (*p == ' ' || *p == '\t')
                p++;
            if (*p == '#')
                continue;
            if ((err = add(a, p, strlen(p), path))) {
                fclose(f);
                return err;
            }
        }
        fclose(f);
        if (a->n == before)
            return ditd_err_set(DITD_EINVAL, "--api-key-file %s holds no key", path);
    }
    return 0;
}

void ditd_auth_free(ditd_auth *a)
{
    for (int i = 0; i < a->n; i++)
        free(a->keys[i]);
    free(a->keys);
    a->keys = NULL;
    a->n = 0;
}

/* Equal in time independent of where they differ (the lengths may show). */
static int same(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    unsigned char d = (unsigned char)(la != lb);
    for (size_t i = 0; i < la; i++)
        d |= (unsigned char)(a[i] ^ b[i < lb ? i : 0]);
    return d == 0;
}

int ditd_auth_match(const ditd_auth *a, const char *h)
{
    int hit = -1;
    if (!h)
        return -1;
    while (*h == ' ')
        h++;
    if (strncasecmp(h, "Bearer", 6) != 0 || (h[6] != ' ' && h[6] != '\t'))
        return -1;
    h += 6;
    while (*h == ' ' || *h == '\t')
        h++;
    char key[4096];
    size_t n = strcspn(h, " \t\r\n");
    if (n == 0 || n >= sizeof key)
        return -1;
    memcpy(key, h, n);
    key[n] = '\0';
    for (int i = 0; i < a->n; i++) /* every key compared: the time says nothing */
        if (same(key, a->keys[i]) && hit < 0)
            hit = i;
    return hit;
}

int ditd_auth_check(const ditd_auth *a, const char *h)
{
    return ditd_auth_match(a, h) >= 0;
}
