/* The subcommands of the ditd binary. Each takes main's argc/argv after the
 * subcommand name (argv[0] is the subcommand) and returns the process exit
 * status. Only main() exits. */
#ifndef DITD_SERVER_CMD_H
#define DITD_SERVER_CMD_H

int ditd_cmd_generate(int argc, char **argv);
int ditd_cmd_bench(int argc, char **argv);
/* `ditd bench --vae ...`: the VAE decode (server/cmd_bench_vae.c). */
int ditd_cmd_bench_vae(int argc, char **argv);
/* `ditd serve`: the HTTP front-end and its replicas (server/cmd_serve.c). */
int ditd_cmd_serve(int argc, char **argv);

/* Parses a whole decimal integer / float with bounds; 0 or DITD_EINVAL with
 * a detail naming `what`. */
int ditd_parse_long(const char *s, long lo, long hi, const char *what, long *out);
int ditd_parse_double(const char *s, double lo, double hi, const char *what, double *out);

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
