/* Small helpers shared by the test programs: checks that print both sides,
 * error measures over whole tensors, the fixtures folder. Header-only so each
 * test stays one program. */
#ifndef DITD_TESTS_TEST_UTIL_H
#define DITD_TESTS_TEST_UTIL_H

#include <dirent.h>
#include <fcntl.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <spawn.h>
#include <sys/wait.h>
#include <time.h>

#include "ditd_build_config.h"
#include "engine/core/error.h"

static int tu_failures;
static int tu_checks;

#define TU_CHECK(cond, ...)                                                       \
    do {                                                                          \
        tu_checks++;                                                              \
        if (!(cond)) {                                                            \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);       \
            fprintf(stderr, __VA_ARGS__);                                         \
            fputc('\n', stderr);                                                  \
            tu_failures++;                                                        \
        }                                                                         \
    } while (0)

/* An engine call that must succeed; prints the error detail otherwise. */
#define TU_OK(call)                                                               \
    do {                                                                          \
        int tu_err_ = (call);                                                     \
        if (tu_err_) {                                                            \
            fprintf(stderr, "FAIL %s:%d: %s -> %s: %s\n", __FILE__, __LINE__,    \
                    #call, ditd_err_name(tu_err_), ditd_err_detail());            \
            tu_failures++;                                                        \
        }                                                                         \
    } while (0)

static inline int tu_has(const char *hay, const char *needle)
{
    return !needle || strstr(hay, needle) != NULL;
}

/* Runs expr (an int-returning engine call) and checks that it returns code
 * with a detail containing each of the given substrings (NULL: any). */
#define TU_CHECK_ERR(expr, code, ...)                                              \
    do {                                                                           \
        ditd_err_clear();                                                          \
        int rc_ = (expr);                                                          \
        const char *d_ = ditd_err_detail();                                        \
        const char *subs_[] = {__VA_ARGS__, NULL};                                 \
        int ok_ = rc_ == (code);                                                   \
        for (int i_ = 0; subs_[i_]; i_++)                                          \
            ok_ = ok_ && tu_has(d_, subs_[i_]);                                    \
        TU_CHECK(ok_, "%s: got %s \"%s\", want %s containing \"%s\"", #expr,       \
                 ditd_err_name(rc_), d_, ditd_err_name(code), subs_[0] ? subs_[0] : ""); \
    } while (0)

/* xorshift64*: the tests' seeded random numbers (DITD_TEST_SEED replays). */
static uint64_t tu_rng_state = 0x9e3779b97f4a7c15ull;

static inline uint64_t tu_rng(void)
{
    tu_rng_state ^= tu_rng_state >> 12;
    tu_rng_state ^= tu_rng_state << 25;
    tu_rng_state ^= tu_rng_state >> 27;
    return tu_rng_state * 2685821657736338717ull;
}

/* Seeds tu_rng from DITD_TEST_SEED, else the clock, and prints the seed so
 * a failed run can be replayed. */
static inline void tu_seed(void)
{
    const char *env = getenv("DITD_TEST_SEED");
    uint64_t seed = env ? strtoull(env, NULL, 10) : (uint64_t)time(NULL);
    tu_rng_state = seed * 0x9e3779b97f4a7c15ull + 1;
    printf("seed %llu (DITD_TEST_SEED replays)\n", (unsigned long long)seed);
}

/* Makes a fresh folder $TMPDIR/ditd-test-<what>-XXXXXX into buf; 0 or -1. */
static inline int tu_mkdtemp(char *buf, size_t len, const char *what)
{
    const char *base = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(buf, len, "%s/ditd-test-%s-XXXXXX", base, what);
    if (!mkdtemp(buf)) {
        fprintf(stderr, "mkdtemp %s failed\n", buf);
        return -1;
    }
    return 0;
}

typedef struct tu_err {
    double max_abs;    /* max |a - b| */
    double max_ref;    /* max |b| */
    double rel;        /* max_abs / max_ref: the relative error the tests bound */
    double rel_l2;     /* ||a - b|| / ||b|| */
    size_t worst;      /* index of max_abs */
    int nonfinite;     /* a has NaN or inf */
} tu_err;

static inline tu_err tu_compare(const float *a, const float *b, size_t n)
{
    tu_err e = {0};
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (!isfinite(a[i]))
            e.nonfinite = 1;
        if (d > e.max_abs || d != d) {
            e.max_abs = d;
            e.worst = i;
        }
        if (fabs((double)b[i]) > e.max_ref)
            e.max_ref = fabs((double)b[i]);
        num += d * d;
        den += (double)b[i] * b[i];
    }
    e.rel = e.max_ref > 0 ? e.max_abs / e.max_ref : e.max_abs;
    e.rel_l2 = den > 0 ? sqrt(num / den) : sqrt(num);
    if (e.nonfinite)
        e.rel = e.rel_l2 = INFINITY;
    return e;
}

/* Checks rel <= tol and prints the measure either way, with the worst element. */
#define TU_CLOSE(what, a, b, n, tol)                                               \
    do {                                                                           \
        tu_err e_ = tu_compare((a), (b), (n));                                     \
        int ok_ = e_.rel <= (tol);                                                 \
        tu_checks++;                                                               \
        printf("%s %s: rel %.3g (max_abs %.3g / max_ref %.3g), rel_l2 %.3g, tol %.1g%s\n", \
               ok_ ? "ok  " : "FAIL", (what), e_.rel, e_.max_abs, e_.max_ref,      \
               e_.rel_l2, (double)(tol), ok_ ? "" : "  <--");                      \
        if (!ok_) {                                                                \
            fprintf(stderr, "  worst element %zu: got %.9g, want %.9g\n", e_.worst, \
                    (double)(a)[e_.worst], (double)(b)[e_.worst]);                 \
            tu_failures++;                                                         \
        }                                                                          \
    } while (0)

/* 8-bit pixels against a reference stored as floats (a fixture's uint8
 * image read through the .npy reader): the worst level difference, and in
 * *off how many of the n values differ at all. */
static inline int tu_pixels_worst(const uint8_t *got, const float *want, size_t n, size_t *off)
{
    int worst = 0;
    *off = 0;
    for (size_t i = 0; i < n; i++) {
        int d = abs((int)got[i] - (int)want[i]);
        worst = d > worst ? d : worst;
        *off += d != 0;
    }
    return worst;
}

static inline const char *tu_fixtures(void)
{
    const char *d = getenv("DITD_FIXTURES");
    return d && *d ? d : DITD_SOURCE_ROOT "/tests/fixtures";
}

/* Calls fn(dir, ud) for every model folder under <fixtures>/models; returns
 * how many there were. */
static inline int tu_foreach_fixture_model(void (*fn)(const char *dir, void *ud), void *ud)
{
    char dir[4096], sub[4096 + 256];
    int models = 0;
    struct dirent *e;
    DIR *d;
    snprintf(dir, sizeof dir, "%s/models", tu_fixtures());
    d = opendir(dir);
    TU_CHECK(d != NULL, "cannot open %s", dir);
    if (!d)
        return 0;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        snprintf(sub, sizeof sub, "%s/%s", dir, e->d_name);
        fn(sub, ud);
        models++;
    }
    closedir(d);
    return models;
}

extern char **environ;

/* Runs bin with args (NULL-terminated, without argv[0]), stdout to
 * /dev/null, stderr into err (cap bytes, NUL-terminated) through a file in
 * scratch_dir. The exit status, 128 + signal when killed, -1 when it could
 * not start. */
static inline int tu_spawn(const char *bin, const char *const *args, const char *scratch_dir,
                           char *err, size_t cap)
{
    char errpath[512];
    const char *argv[64];
    int n = 0, status;
    pid_t pid;
    posix_spawn_file_actions_t fa;

    argv[n++] = bin;
    while (*args && n < 62)
        argv[n++] = *args++;
    argv[n] = NULL;
    snprintf(errpath, sizeof errpath, "%s/stderr", scratch_dir);
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 2, errpath, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    if (posix_spawn(&pid, bin, &fa, NULL, (char *const *)argv, environ) != 0) {
        posix_spawn_file_actions_destroy(&fa);
        return -1;
    }
    posix_spawn_file_actions_destroy(&fa);
    waitpid(pid, &status, 0);
    FILE *f = fopen(errpath, "r");
    size_t len = f ? fread(err, 1, cap - 1, f) : 0;
    err[len] = '\0';
    if (f)
        fclose(f);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* A safetensors image in memory: the 8-byte length, header JSON (padded
 * with spaces to 8 bytes), then dlen bytes of data. Owned (free). For the
 * loaders' refusal tests, which write headers by hand. */
static inline uint8_t *tu_st_image(const char *header, const void *data, size_t dlen,
                                   size_t *len)
{
    size_t hl = strlen(header), pad = (8 - hl % 8) % 8;
    uint8_t *b = malloc(8 + hl + pad + dlen + 1);
    uint64_t h = hl + pad;
    *len = 0;
    if (!b)
        return NULL;
    memcpy(b, &h, 8);
    memcpy(b + 8, header, hl);
    memset(b + 8 + hl, ' ', pad);
    if (dlen)
        memcpy(b + 8 + hl + pad, data, dlen);
    *len = 8 + hl + pad + dlen;
    return b;
}

static inline int tu_exit(void)
{
    printf("%d checks, %d failed\n", tu_checks, tu_failures);
    return tu_failures ? 1 : 0;
}

#endif
