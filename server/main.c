/* ditd: one binary, subcommands serve, generate, bench. This file only
 * dispatches; each command lives in its own file. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ditd_build_config.h"
#include "engine/core/error.h"
#include "engine/parallel/mesh.h"
#include "server/cmd.h"

int ditd_parse_long(const char *s, long lo, long hi, const char *what, long *out)
{
    char *end;
    long v;
    errno = 0;
    v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        return ditd_err_set(DITD_EINVAL, "%s: \"%s\" is not an integer in %ld..%ld", what, s, lo, hi);
    *out = v;
    return 0;
}

int ditd_parse_double(const char *s, double lo, double hi, const char *what, double *out)
{
    char *end;
    double v;
    errno = 0;
    v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= lo && v <= hi))
        return ditd_err_set(DITD_EINVAL, "%s: \"%s\" is not a number in %g..%g", what, s, lo, hi);
    *out = v;
    return 0;
}

int ditd_layout_option(int c, const char *arg, ditd_layout *l, int *err)
{
    static const char *const flags[] = {"--ulysses-degree", "--ring-degree", NULL, "--tp-degree",
                                        "--cfg-degree"};
    int *deg[] = {&l->ulysses, &l->ring, NULL, &l->tp, &l->cfg};
    int k = c - DITD_OPT_LAYOUT;
    long v = 1;
    *err = 0;
    if (k < 0 || k > 4)
        return 0;
    if (k == 2) {
        *err = ditd_ring_rotate_from_str(arg, &l->rotate);
        return 1;
    }
    if (!(*err = ditd_parse_long(arg, 1, k == 4 ? 2 : 4096, flags[k], &v)))
        *deg[k] = (int)v;
    return 1;
}

const char *ditd_default_model_dir(void)
{
    static char path[4096];
    const char *env = getenv("DITD_MODEL");
    struct stat sb;
    if (env && *env)
        return env;
    snprintf(path, sizeof path, "%s/models/fashion-dit", DITD_SOURCE_ROOT);
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode))
        return path;
    return NULL;
}

static void usage(FILE *f)
{
    fprintf(f,
            "ditd %s: a server for Diffusion Transformers\n"
            "\n"
            "usage: ditd <command> [options]\n"
            "\n"
            "commands:\n"
            "  serve      the HTTP server (OpenAI images API); under mpirun, with replicas\n"
            "  generate   generate images to PNG files, no server\n"
            "  bench      time DiT forwards for a named config or a model folder\n"
            "  encode     text-encoder embeddings of token ids (parity checks)\n"
            "\n"
            "`ditd <command> --help` lists a command's options.\n",
            DITD_VERSION);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (strcmp(argv[1], "serve") == 0)
        return ditd_cmd_serve(argc - 1, argv + 1);
    if (strcmp(argv[1], "generate") == 0)
        return ditd_cmd_generate(argc - 1, argv + 1);
    if (strcmp(argv[1], "bench") == 0)
        return ditd_cmd_bench(argc - 1, argv + 1);
    if (strcmp(argv[1], "encode") == 0)
        return ditd_cmd_encode(argc - 1, argv + 1);
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 ||
        strcmp(argv[1], "help") == 0) {
        usage(stdout);
        return 0;
    }
    if (strcmp(argv[1], "--version") == 0) {
        printf("ditd %s\n", DITD_VERSION);
        return 0;
    }
    fprintf(stderr, "ditd: unknown command \"%s\"\n\n", argv[1]);
    usage(stderr);
    return 2;
}
