/* Command-line helpers the subcommands share (server/cmd/cli.c). */
#ifndef DITD_SERVER_CLI_H
#define DITD_SERVER_CLI_H

#include "server/common/parse.h" /* ditd_parse_long, ditd_parse_double */

/* The layout flags `generate` and `bench` share (getopt_long entries with
 * codes DITD_OPT_LAYOUT..+4) and their parser: returns 1 when c was one of
 * them (then *err is 0 or DITD_EINVAL naming the flag), 0 otherwise. */
#define DITD_OPT_LAYOUT 900
#define DITD_LAYOUT_LONGOPTS                                                   \
    {"ulysses-degree", required_argument, 0, DITD_OPT_LAYOUT},                 \
    {"ring-degree", required_argument, 0, DITD_OPT_LAYOUT + 1},                \
    {"ring-rotate", required_argument, 0, DITD_OPT_LAYOUT + 2},                \
    {"tp-degree", required_argument, 0, DITD_OPT_LAYOUT + 3},                  \
    {"cfg-degree", required_argument, 0, DITD_OPT_LAYOUT + 4}
struct ditd_layout;
int ditd_layout_option(int c, const char *arg, struct ditd_layout *l, int *err);

/* The folder of the embedded default model, when it exists. */
const char *ditd_default_model_dir(void);

#endif
