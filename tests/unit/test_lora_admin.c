/* The body of POST /v1/loras (server/daemon/lora_admin.h) and the path rule
 * of run-time loads (server/common/lora_spec.h: ditd_lora_path_resolve,
 * ditd_lora_path_under) without a daemon: the bodies taken and refused
 * (with the param each refusal names), and paths in, out of and around a
 * root (relative ones, "..", links out and in, folders, missing files)
 * in a fresh temporary folder. The http suite checks the same over HTTP
 * (tests/http/test_lora_live.py). */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/core/error.h"
#include "server/common/lora_spec.h"
#include "server/daemon/lora_admin.h"

static int failures, checks;

#define CHECK(cond, ...)                                                                   \
    do {                                                                                   \
        checks++;                                                                          \
        if (!(cond)) {                                                                     \
            failures++;                                                                    \
            printf("FAIL %s:%d: ", __FILE__, __LINE__);                                    \
            printf(__VA_ARGS__);                                                           \
            printf("\n");                                                                  \
        }                                                                                  \
    } while (0)

static void test_bodies(void)
{
    static const struct { const char *body, *param; } bad[] = {
        {"", ""},
        {"{", ""},
        {"[1]", ""},
        {"\"x\"", ""},
        {"{\"path\": \"a.safetensors\"}", "name"},
        {"{\"name\": null, \"path\": \"a\"}", "name"},
        {"{\"name\": 4, \"path\": \"a\"}", "name"},
        {"{\"name\": \"\", \"path\": \"a\"}", "name"},
        {"{\"name\": \"a b\", \"path\": \"a\"}", "name"},
        {"{\"name\": \"a/b\", \"path\": \"a\"}", "name"},
        {"{\"name\": \"\\u00e9\", \"path\": \"a\"}", "name"},
        {"{\"name\": \"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\", \"path\": \"a\"}",
         "name"}, /* 64 bytes */
        {"{\"name\": \"x\"}", "path"},
        {"{\"name\": \"x\", \"path\": \"\"}", "path"},
        {"{\"name\": \"x\", \"path\": 1}", "path"},
        {"{\"name\": \"x\", \"path\": \"a\\u0000b\"}", ""}, /* jansson refuses the NUL */
        {"{\"name\": \"x\", \"path\": \"a\", \"scale\": 1}", "scale"},
        {"{\"name\": \"x\", \"name\": \"y\", \"path\": \"a\"}", ""}, /* duplicate keys */
    };
    int n = 0;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ditd_lora_admin_req r;
        ditd_api_error e;
        memset(&e, 0, sizeof e);
        int err = ditd_lora_admin_parse(bad[i].body, strlen(bad[i].body), &r, &e);
        CHECK(err == DITD_EINVAL && e.status == 400 && !strcmp(e.param, bad[i].param) &&
                  e.message[0],
              "body %s: 400 param '%s' (got %d, %d, '%s': %s)", bad[i].body, bad[i].param, err,
              e.status, e.param, e.message);
        n++;
    }
    CHECK(n == 18, "%d refused bodies checked", n);
    ditd_lora_admin_req r;
    ditd_api_error e;
    const char *ok = "{\"path\": \"sub/style v2.safetensors\", \"name\": \"style-v2.1_A\"}";
    CHECK(ditd_lora_admin_parse(ok, strlen(ok), &r, &e) == 0 && !strcmp(r.name, "style-v2.1_A") &&
              !strcmp(r.path, "sub/style v2.safetensors"),
          "a valid body: name and path as given");
    char big[2 * DITD_LORA_PATH_MAX];
    int w = snprintf(big, sizeof big, "{\"name\": \"x\", \"path\": \"");
    memset(big + w, 'p', DITD_LORA_PATH_MAX);
    strcpy(big + w + DITD_LORA_PATH_MAX, "\"}");
    CHECK(ditd_lora_admin_parse(big, strlen(big), &r, &e) == DITD_EINVAL && !strcmp(e.param, "path"),
          "a path of %d bytes: refused", DITD_LORA_PATH_MAX);
}

static void touch(const char *p)
{
    FILE *f = fopen(p, "w");
    if (f) {
        fputs("x", f);
        fclose(f);
    }
}

static void test_paths(void)
{
    char tmp[PATH_MAX], p[PATH_MAX], root[PATH_MAX], other[PATH_MAX];
    char out[DITD_LORA_PATH_MAX];
    /* a fresh folder under $TMPDIR (mkdtemp fills the X's) */
    snprintf(tmp, sizeof tmp, "%s/ditd-test-lora-paths-XXXXXX",
             getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(tmp)) {
        CHECK(0, "mkdtemp");
        return;
    }
    char *rt = realpath(tmp, NULL); /* /tmp may itself be a link */
    snprintf(root, sizeof root, "%s/root", rt);
    snprintf(other, sizeof other, "%s/rootx", rt); /* a sibling whose name starts like the root */
    mkdir(root, 0755);
    mkdir(other, 0755);
    snprintf(p, sizeof p, "%s/sub", root);
    mkdir(p, 0755);
    snprintf(p, sizeof p, "%s/a.safetensors", root);
    touch(p);
    snprintf(p, sizeof p, "%s/sub/b.safetensors", root);
    touch(p);
    snprintf(p, sizeof p, "%s/o.safetensors", other);
    touch(p);
    snprintf(p, sizeof p, "%s/out.safetensors", rt);
    touch(p);
    char target[PATH_MAX];
    snprintf(target, sizeof target, "%s/out.safetensors", rt);
    snprintf(p, sizeof p, "%s/link-out.safetensors", root);
    CHECK(symlink(target, p) == 0, "a link out of the root");
    snprintf(target, sizeof target, "%s/a.safetensors", root);
    snprintf(p, sizeof p, "%s/link-in.safetensors", other);
    CHECK(symlink(target, p) == 0, "a link into the root");
    const char *roots[] = {root, NULL, ""};

    static const struct { const char *path; int abs, err, under; } cases[] = {
        {"a.safetensors", 0, 0, 1},
        {"sub/b.safetensors", 0, 0, 1},
        {"./sub/../a.safetensors", 0, 0, 1},
        {"/root/a.safetensors", 1, 0, 1},
        {"../out.safetensors", 0, 0, 0},
        {"sub/../../out.safetensors", 0, 0, 0},
        {"link-out.safetensors", 0, 0, 0},
        {"/rootx/o.safetensors", 1, 0, 0},
        {"/rootx/link-in.safetensors", 1, 0, 1},
        {"/out.safetensors", 1, 0, 0},
        {"nope.safetensors", 0, DITD_ENOENT, 0},
        {"a.safetensors/x", 0, DITD_ENOENT, 0},
        {"sub", 0, DITD_EINVAL, 0},
        {"/root", 1, DITD_EINVAL, 0},
    };
    int n = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char given[PATH_MAX];
        if (cases[i].abs)
            snprintf(given, sizeof given, "%s%s", rt, cases[i].path);
        else
            snprintf(given, sizeof given, "%s", cases[i].path);
        int err = ditd_lora_path_resolve(root, given, out);
        CHECK(err == cases[i].err, "%s: resolve %d, want %d (%s)", given, err, cases[i].err,
              err ? ditd_err_detail() : out);
        if (err)
            CHECK(strstr(ditd_err_detail(), given) != NULL, "%s: the error names it: %s", given,
                  ditd_err_detail());
        if (!err && !cases[i].err) {
            CHECK(out[0] == '/' && !strstr(out, "/./") && !strstr(out, "/../"),
                  "%s resolves to %s", given, out);
            CHECK(ditd_lora_path_under(roots, 3, out) == cases[i].under, "%s (%s): under the "
                  "root %d, want %d", given, out, !cases[i].under, cases[i].under);
        }
        n++;
    }
    CHECK(n == 14, "%d paths checked", n);
    CHECK(ditd_lora_path_resolve(NULL, "a.safetensors", out) == DITD_EINVAL &&
              strstr(ditd_err_detail(), "relative"),
          "a relative path without a base: refused");
    CHECK(ditd_lora_path_resolve(root, "", out) == DITD_EINVAL, "an empty path: refused");
    const char *slash[] = {"/"};
    snprintf(p, sizeof p, "%s/out.safetensors", rt);
    CHECK(ditd_lora_path_under(slash, 1, p) == 1, "the root / holds everything");
    const char *gone[] = {"/nonexistent-ditd-root"};
    CHECK(ditd_lora_path_under(gone, 1, p) == 0, "a root that does not resolve holds nothing");
    char cmd[PATH_MAX + 16];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", rt);
    if (system(cmd) != 0)
        printf("note: could not remove %s\n", rt);
    free(rt);
}

int main(void)
{
    test_bodies();
    test_paths();
    printf("%d checks, %d failed\n", checks, failures);
    if (checks < 50) {
        printf("FAIL: only %d checks ran\n", checks);
        return 1;
    }
    return failures ? 1 : 0;
}
