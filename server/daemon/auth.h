/* API keys at the edge: the keys `ditd serve` accepts, and the check of an
 * Authorization header as the OpenAI clients send it ("Bearer KEY").
 *
 * Keys come from --api-key / DITD_API_KEY (one, or several separated by
 * commas) and --api-key-file (one per line; blank lines and lines starting
 * with '#' are skipped). No keys: authentication is off. The comparison
 * takes the same time whatever the key's first wrong byte. Not a user
 * store: keys carry no names, scopes or quotas. */
#ifndef DITD_SERVER_AUTH_H
#define DITD_SERVER_AUTH_H

typedef struct ditd_auth {
    char **keys;
    int n;
} ditd_auth;

/* Adds the keys of csv (may be NULL or "") and of the file path (may be
 * NULL or ""). 0, or DITD_EINVAL / DITD_EIO / DITD_ENOMEM with a detail. */
int ditd_auth_load(ditd_auth *a, const char *csv, const char *path);
void ditd_auth_free(ditd_auth *a);
static inline int ditd_auth_enabled(const ditd_auth *a)
{
    return a->n > 0;
}
/* 1 when the header (NULL when absent) carries one of the keys. */
int ditd_auth_check(const ditd_auth *a, const char *authorization);
/* The index of the key the header carries, or -1. */
int ditd_auth_match(const ditd_auth *a, const char *authorization);

#endif
