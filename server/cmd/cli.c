/* Command-line helpers the subcommands share: the parallel-layout flags, the embedded default model's folder. No command
 * lives here; main.c dispatches, each command has its own file. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ditd_build_config.h"
#include "engine/core/error.h"
#include "engine/parallel/mesh.h"
#include "server/cmd/cli.h"

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
