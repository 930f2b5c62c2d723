/* The subcommands of the ditd binary. Each takes main's argc/argv after the
 * subcommand name (argv[0] is the subcommand) and returns the process exit
 * status. Only main() exits. */
#ifndef DITD_SERVER_CMD_H
#define DITD_SERVER_CMD_H

int ditd_cmd_generate(int argc, char **argv);
int ditd_cmd_bench(int argc, char **argv);
/* `ditd encode`: token ids to text-encoder embeddings (server/cmd/cmd_encode.c). */
int ditd_cmd_encode(int argc, char **argv);
/* `ditd bench --vae ...`: the VAE decode (server/cmd/cmd_bench_vae.c). */
int ditd_cmd_bench_vae(int argc, char **argv);
/* `ditd serve`: the HTTP front-end and its replicas (server/cmd/cmd_serve.c). */
int ditd_cmd_serve(int argc, char **argv);

#endif
