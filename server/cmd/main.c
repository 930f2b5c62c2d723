/* ditd: one binary, subcommands serve, generate, bench. This file only
 * dispatches; each command lives in its own file. */
#include <stdio.h>
#include <string.h>

#include "ditd_build_config.h"
#include "server/cmd/cmd.h"

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
