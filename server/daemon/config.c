/* `ditd serve` options: one table, flags and DITD_* variables. */
#include "server/daemon/config.h"

#include <getopt.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "engine/backend/backend.h"
#include "engine/core/error.h"
#include "engine/models/lora.h"
#include "engine/parallel/mesh.h"
#include "server/common/parse.h"
#include "server/daemon/genreq.h"
#include "server/daemon/log.h"

typedef enum { T_CACHE, T_STR, T_INT, T_LONG, T_SECS, T_BOOL, T_ROTATE, T_DEVICE, T_LOGFMT, T_LOGLVL,
               T_WDTYPE, T_NAMES, T_LORA } opt_type;

typedef struct opt {
    const char *flag;   /* without "--" */
    const char *env;
    opt_type type;
    size_t off;
    double lo, hi;      /* bounds for numbers */
    const char *def;    /* default, as text */
    const char *help;
} opt;

#define OFF(f) offsetof(ditd_serve_config, f)

static const opt opts[] = {
    {"host", "DITD_HOST", T_STR, OFF(host), 0, 0, "127.0.0.1", "address to listen on (0.0.0.0: all)"},
    {"port", "DITD_PORT", T_INT, OFF(port), 0, 65535, "8080", "TCP port (0: any free port)"},
    {"model", "DITD_MODEL", T_STR, OFF(model), 0, 0, "", "Diffusers model folder (default: the embedded model)"},
    {"transformer-file", "DITD_TRANSFORMER_FILE", T_STR, OFF(transformer_file), 0, 0, "", "the transformer's weights from this .gguf or .safetensors file instead of the model folder's transformer/ (its config.json still says the shapes; docs/quant.md)"},
    {"text-encoder-2-file", "DITD_TEXT_ENCODER_2_FILE", T_STR, OFF(text_encoder_2_file), 0, 0, "", "FLUX: the T5 encoder's weights from this .gguf (llama.cpp's T5 names or transformers') or .safetensors file instead of text_encoder_2/'s"},
    {"served-model-name", "DITD_SERVED_MODEL_NAME", T_NAMES, OFF(served_names), 0, 0, "", "extra names requests may give as \"model\" (as vLLM's; repeat the flag or separate by commas); the folder's name stays one; /v1/models lists each"},
    {"dp", "DITD_DP", T_INT, OFF(dp), 1, 1024, "1", "replicas (data parallel); under mpirun: world = 1 + dp x group"},
    {"ulysses-degree", "DITD_ULYSSES_DEGREE", T_INT, OFF(ulysses_degree), 1, 1024, "1", "context parallel (Ulysses) ranks per replica"},
    {"ring-degree", "DITD_RING_DEGREE", T_INT, OFF(ring_degree), 1, 1024, "1", "context parallel (Ring) ranks per replica"},
    {"ring-rotate", "DITD_RING_ROTATE", T_ROTATE, OFF(ring_rotate), 0, 0, "allgather", "how Ring moves K/V: allgather (as Diffusers) or p2p (send/recv ring)"},
    {"tp-degree", "DITD_TP_DEGREE", T_INT, OFF(tp_degree), 1, 1024, "1", "tensor parallel ranks per replica"},
    {"cfg-degree", "DITD_CFG_DEGREE", T_INT, OFF(cfg_degree), 1, 2, "1", "classifier-free guidance parallel (1 or 2)"},
    {"cache", "DITD_CACHE", T_CACHE, OFF(cache), 0, 0, "none", "step caching for requests that give no \"cache\": METHOD[:key=value,...], e.g. first_block_cache:threshold=0.08 (docs/caching.md)"},
    {"max-batch", "DITD_MAX_BATCH", T_INT, OFF(max_batch), 1, 256, "8", "samples per batch on a replica"},
    {"batch-window-ms", "DITD_BATCH_WINDOW_MS", T_INT, OFF(batch_window_ms), 0, 60000, "5", "how long the batcher waits to fill a batch"},
    {"max-queue", "DITD_MAX_QUEUE", T_INT, OFF(max_queue), 1, 1000000, "64", "waiting requests per model; more get 429"},
    {"max-body-bytes", "DITD_MAX_BODY_BYTES", T_LONG, OFF(max_body_bytes), 64, 1 << 30, "65536", "request body limit; larger get 413 unread"},
    {"request-timeout", "DITD_REQUEST_TIMEOUT", T_SECS, OFF(request_timeout_s), 0.001, 86400, "300", "seconds from arrival to the last byte; then 504 and cancel"},
    {"drain-timeout", "DITD_DRAIN_TIMEOUT", T_SECS, OFF(drain_timeout_s), 0, 86400, "30", "seconds SIGTERM waits for work in flight"},
    {"threads", "DITD_THREADS", T_INT, OFF(threads), 0, 1024, "0", "CPU threads per replica (0: all)"},
    {"max-connections", "DITD_MAX_CONNECTIONS", T_INT, OFF(max_connections), 1, 100000, "1024", "open HTTP connections"},
    {"sse-keepalive-ms", "DITD_SSE_KEEPALIVE_MS", T_INT, OFF(sse_keepalive_ms), 10, 3600000, "10000", "keep-alive comment period on event streams"},
    {"heartbeat-ms", "DITD_HEARTBEAT_MS", T_INT, OFF(heartbeat_ms), 10, 600000, "1000", "worker heartbeat period"},
    {"heartbeat-timeout-ms", "DITD_HEARTBEAT_TIMEOUT_MS", T_INT, OFF(heartbeat_timeout_ms), 100, 3600000, "30000", "a replica silent this long fails /healthz"},
    {"device", "DITD_DEVICE", T_DEVICE, OFF(device), 0, 0, "cpu", "where replicas run: cpu or cuda (a GPU per rank: the node-local rank's)"},
    {"dtype", "DITD_DTYPE", T_WDTYPE, OFF(weight_dtype), 0, 0, "auto", "CPU weights: f32, bf16, or auto (bf16 for a bf16 checkpoint on a CPU with AVX512-BF16/AMX; docs/cpu.md)"},
    {"comm-timeout-ms", "DITD_COMM_TIMEOUT_MS", T_INT, OFF(comm_timeout_ms), 100, 86400000, "60000", "cuda groups: a NCCL collective not done in this long aborts its communicator (the replica fails instead of hanging)"},
    {"log-requests", "DITD_LOG_REQUESTS", T_BOOL, OFF(log_requests), 0, 1, "1", "one access line per request (method, path, route, status, bytes, ms, request id, client)"},
    {"log-format", "DITD_LOG_FORMAT", T_LOGFMT, OFF(log_format), 0, 0, "text", "log lines as text or json (one object a line)"},
    {"log-level", "DITD_LOG_LEVEL", T_LOGLVL, OFF(log_level), 0, 0, "info", "least level logged: debug, info, warn, error"},
    {"log-file", "DITD_LOG_FILE", T_STR, OFF(log_file), 0, 0, "", "append the log to this file (SIGHUP reopens it) instead of stderr"},
    {"max-connections-per-client", "DITD_MAX_CONNECTIONS_PER_CLIENT", T_INT, OFF(max_per_client), 1, 100000, "256", "open HTTP connections per client address; more get 503 at once"},
    {"header-timeout", "DITD_HEADER_TIMEOUT", T_SECS, OFF(header_timeout_s), 0.1, 3600, "10", "seconds to receive a request's headers, in all (from the accept or the previous answer): then 408 and close"},
    {"body-timeout", "DITD_BODY_TIMEOUT", T_SECS, OFF(body_timeout_s), 0.1, 3600, "30", "seconds to receive a request's body, in all: then 408 and close"},
    {"idle-timeout", "DITD_IDLE_TIMEOUT", T_INT, OFF(idle_timeout_s), 1, 86400, "120", "seconds a connection may make no progress while answering (a client not reading)"},
    {"api-key", "DITD_API_KEY", T_STR, OFF(api_key), 0, 0, "", "API keys, comma-separated: requests must send Authorization: Bearer KEY (prefer the variable or a file: flags show in ps)"},
    {"api-key-file", "DITD_API_KEY_FILE", T_STR, OFF(api_key_file), 0, 0, "", "a file of API keys, one a line ('#' comments)"},
    {"metrics-auth", "DITD_METRICS_AUTH", T_BOOL, OFF(metrics_auth), 0, 1, "0", "with API keys, /metrics needs one too (/healthz, /readyz, /openapi.json stay open)"},
    {"tls-cert", "DITD_TLS_CERT", T_STR, OFF(tls_cert), 0, 0, "", "serve HTTPS: the certificate chain (PEM); with --tls-key"},
    {"pid-file", "DITD_PID_FILE", T_STR, OFF(pid_file), 0, 0, "", "the front-end (rank 0) writes its pid here: server/ditd-mpirun sends it the signals mpirun gets"},
    {"max-cost", "DITD_MAX_COST", T_LONG, OFF(max_cost), 0, 1e15, "0", "ceiling on a request's cost, images x steps x tokens (0: none); over it, 400"},
    {"tls-key", "DITD_TLS_KEY", T_STR, OFF(tls_key), 0, 0, "", "the private key (PEM) of --tls-cert"},
    {"vae-tiling", "DITD_VAE_TILING", T_BOOL, OFF(vae_tiling), 0, 1, "0", "latent models: decode tile by tile (Diffusers' enable_tiling)"},
    {"text-encoder-rank", "DITD_TEXT_ENCODER_RANK", T_INT, OFF(text_encoder_rank), 0, 4095, "0", "text models: the rank of each replica's group that runs the text encoders (0: its leader); it sends the embeddings to the group once a batch"},
    {"text-cache-entries", "DITD_TEXT_CACHE_ENTRIES", T_INT, OFF(text_cache_entries), 0, 1000000, "256", "text models: prompts whose embeddings each replica keeps (LRU; 0: no cache)"},
    {"text-cache-mb", "DITD_TEXT_CACHE_MB", T_INT, OFF(text_cache_mb), 1, 1048576, "512", "text models: MiB of embeddings each replica's cache may hold"},
    {"data-dir", "DITD_DATA_DIR", T_STR, OFF(data_dir), 0, 0, "", "background jobs: the folder of their store (SQLite, jobs.db) and results; they survive a restart. Empty: in memory, lost when the process ends"},
    {"job-ttl", "DITD_JOB_TTL", T_SECS, OFF(job_ttl_s), 0, 1e9, "86400", "background jobs: seconds a finished job (and its result) is kept, then deleted (0: until DELETE)"},
    {"long-cost", "DITD_LONG_COST", T_LONG, OFF(long_cost), 0, 1e15, "0", "a request or job costing more (images or clips x steps x tokens) is long work (0: none is); see --long-replicas"},
    {"long-replicas", "DITD_LONG_REPLICAS", T_INT, OFF(long_replicas), 0, 4096, "0", "with --long-cost, the most replicas long work may hold at once, so the rest stay free for short requests (0: any; with --dp 2, 1 keeps one replica for short work)"},
    {"webhook-url", "DITD_WEBHOOK_URL", T_STR, OFF(webhook_url), 0, 0, "", "background jobs: POST video.completed / video.failed and job.completed / job.failed events here, signed as OpenAI signs webhooks (an http:// or https:// URL; docs/api.md)"},
    {"webhook-ca", "DITD_WEBHOOK_CA", T_STR, OFF(webhook_ca), 0, 0, "", "https webhooks: the receiver's roots, a PEM file, instead of the system's"},
    {"webhook-secret", "DITD_WEBHOOK_SECRET", T_STR, OFF(webhook_secret), 0, 0, "", "the webhooks' signing secret, whsec_ and base64 (prefer the variable: flags show in ps)"},
    {"lora", "DITD_LORA", T_LORA, OFF(loras), 0, 0, "", "a LoRA adapter every replica loads at start, NAME=PATH (a .safetensors file: PEFT/Diffusers or kohya names); repeatable (the variable: comma-separated); requests name it in \"loras\" (docs/lora.md)"},
    {"lora-dir", "DITD_LORA_DIR", T_STR, OFF(lora_dir), 0, 0, "", "every *.safetensors file in this folder is an adapter too, named by its file name without .safetensors"},
    {"lora-cache-mb", "DITD_LORA_CACHE_MB", T_SECS, OFF(lora_cache_mb), 0, 1048576, "0", "MiB (fractions too: 0.5) of LoRA adapters each replica keeps on its device (an LRU: a request naming an evicted adapter reloads it from its file before its batch); 0: every adapter stays loaded"},
    {"admin-key", "DITD_ADMIN_KEY", T_STR, OFF(admin_key), 0, 0, "", "admin keys, comma-separated: POST /v1/loras and DELETE /v1/loras/NAME (loading and unloading adapters at run time) need Authorization: Bearer ADMINKEY; without one those routes answer 403 (prefer the variable or a file: flags show in ps)"},
    {"admin-key-file", "DITD_ADMIN_KEY_FILE", T_STR, OFF(admin_key_file), 0, 0, "", "a file of admin keys, one a line ('#' comments)"},
    {"lora-root", "DITD_LORA_ROOT", T_STR, OFF(lora_root), 0, 0, "", "a folder POST /v1/loras may load adapter files from (besides --lora-dir); a relative \"path\" is taken under it (else under --lora-dir)"},
    {"lora-any-path", "DITD_LORA_ANY_PATH", T_BOOL, OFF(lora_any_path), 0, 1, "0", "POST /v1/loras may load any file the server can read, not only those under --lora-root / --lora-dir"},
    {"max-loras-per-request", "DITD_MAX_LORAS_PER_REQUEST", T_INT, OFF(max_loras_per_request), 1, DITD_LORA_MAX_SET, "4", "adapters one request may name in \"loras\""},
    {"data-max-gb", "DITD_DATA_MAX_GB", T_SECS, OFF(data_max_gb), 0, 1e6, "0", "background jobs: the store's size budget in GB (1e9 bytes; 0: none); past it new jobs get 507"},
};
#define NOPTS (sizeof opts / sizeof opts[0])

/* Appends the comma-separated names of val: each 1..255 bytes of
 * printable ASCII or UTF-8 (no blanks at its ends, no control bytes). */
static int add_names(ditd_serve_config *c, const char *val, const char *who)
{
    if (!*val)
        return ditd_err_set(DITD_EINVAL, "%s: an empty model name", who);
    while (*val) {
        size_t n = strcspn(val, ",");
        const char *p = val;
        while (n && (*p == ' ' || *p == '\t'))
            p++, n--;
        while (n && (p[n - 1] == ' ' || p[n - 1] == '\t'))
            n--;
        if (!n)
            return ditd_err_set(DITD_EINVAL, "%s: an empty model name in \"%s\"", who, val);
        if (n >= DITD_SERVE_NAME_MAX)
            return ditd_err_set(DITD_EINVAL, "%s: a model name is %zu bytes; at most %d", who, n,
                                DITD_SERVE_NAME_MAX - 1);
        for (size_t i = 0, k; i < n; i += k) {
            k = ditd_utf8_seq((const unsigned char *)p + i, n - i);
            if (!k || (unsigned char)p[i] < 0x20 || p[i] == 0x7f)
                return ditd_err_set(DITD_EINVAL, "%s: a model name must be UTF-8 text without "
                                    "control bytes", who);
        }
        int dup = 0;
        for (int i = 0; i < c->n_served_names; i++)
            dup |= strlen(c->served_names[i]) == n && !strncmp(c->served_names[i], p, n);
        if (!dup) {
            if (c->n_served_names >= DITD_SERVE_MAX_NAMES)
                return ditd_err_set(DITD_EINVAL, "%s: more than %d model names", who,
                                    DITD_SERVE_MAX_NAMES);
            memcpy(c->served_names[c->n_served_names], p, n);
            c->served_names[c->n_served_names++][n] = '\0';
        }
        val += strcspn(val, ",");
        if (*val == ',' && !*++val)
            return ditd_err_set(DITD_EINVAL, "%s: an empty model name after the last comma", who);
    }
    return 0;
}

static int set(ditd_serve_config *c, const opt *o, const char *val, const char *who)
{
    char *dst = (char *)c + o->off;
    long l;
    double d;
    int err;
    switch (o->type) {
    case T_CACHE:
        if ((err = ditd_cache_config_parse(val, (ditd_cache_config *)dst))) {
            char why[512];
            snprintf(why, sizeof why, "%s", ditd_err_detail());
            return ditd_err_set(err, "%s: %s", who, why);
        }
        return 0;
    case T_STR:
        if (strlen(val) >= (o->off == OFF(host) ? sizeof c->host : sizeof c->model))
            return ditd_err_set(DITD_EINVAL, "%s: value too long", who);
        strcpy(dst, val);
        return 0;
    case T_INT:
    case T_LONG:
        if ((err = ditd_parse_long(val, (long)o->lo, (long)o->hi, who, &l)))
            return err;
        if (o->type == T_INT)
            *(int *)dst = (int)l;
        else
            *(long *)dst = l;
        return 0;
    case T_SECS:
        if ((err = ditd_parse_double(val, o->lo, o->hi, who, &d)))
            return err;
        *(double *)dst = d;
        return 0;
    case T_ROTATE: {
        ditd_ring_rotate r;
        if (ditd_ring_rotate_from_str(val, &r))
            return ditd_err_set(DITD_EINVAL, "%s: \"%s\" is not allgather or p2p", who, val);
        *(int *)dst = (int)r;
        return 0;
    }
    case T_DEVICE: {
        ditd_device d;
        if (ditd_device_from_str(val, &d))
            return ditd_err_set(DITD_EINVAL, "%s: \"%s\" is not cpu or cuda", who, val);
        *(int *)dst = (int)d;
        return 0;
    }
    case T_LOGFMT: {
        ditd_log_format f;
        if (ditd_log_format_from_str(val, &f))
            return ditd_err_set(DITD_EINVAL, "%s: \"%s\" is not text or json", who, val);
        *(int *)dst = (int)f;
        return 0;
    }
    case T_LOGLVL: {
        ditd_log_level l;
        if (ditd_log_level_from_str(val, &l))
            return ditd_err_set(DITD_EINVAL, "%s: \"%s\" is not debug, info, warn or error", who, val);
        *(int *)dst = (int)l;
        return 0;
    }
    case T_WDTYPE: {
        ditd_dtype t;
        if (!strcmp(val, "auto"))
            *(int *)dst = -1;
        else if (!ditd_dtype_from_str(val, &t) && (t == DITD_DTYPE_F32 || t == DITD_DTYPE_BF16))
            *(int *)dst = (int)t;
        else
            return ditd_err_set(DITD_EINVAL, "%s: \"%s\" is not f32, bf16 or auto", who, val);
        return 0;
    }
    case T_NAMES:
        return add_names(c, val, who);
    case T_LORA: {
        /* a flag gives one NAME=PATH (a path may hold commas); the
         * variable a comma-separated list */
        if (strncmp(who, "--", 2))
            for (const char *p = val; *p;) {
                char one[DITD_LORA_NAME_MAX + DITD_LORA_PATH_MAX + 2];
                size_t n = strcspn(p, ",");
                int err2;
                if (n >= sizeof one)
                    return ditd_err_set(DITD_EINVAL, "%s: an entry is over %zu bytes", who,
                                        sizeof one - 1);
                memcpy(one, p, n);
                one[n] = '\0';
                if ((err2 = ditd_lora_specs_add(&c->loras, one, who)))
                    return err2;
                p += n;
                p += *p == ',';
            }
        else
            return ditd_lora_specs_add(&c->loras, val, who);
        return 0;
    }
    case T_BOOL:
        if (!strcmp(val, "1") || !strcmp(val, "true") || !strcmp(val, "yes") || !strcmp(val, "on"))
            *(int *)dst = 1;
        else if (!strcmp(val, "0") || !strcmp(val, "false") || !strcmp(val, "no") || !strcmp(val, "off") || !*val)
            *(int *)dst = 0;
        else
            return ditd_err_set(DITD_EINVAL, "%s: \"%s\" is not a boolean (1/0, true/false)", who, val);
        return 0;
    }
    return DITD_EINTERNAL;
}

void ditd_serve_config_usage(FILE *f)
{
    fprintf(f, "usage: ditd serve [options]\n"
               "       mpirun -np 1+D ditd serve --dp D [options]\n"
               "\n"
               "Serves the OpenAI-style images API over HTTP. Every option can also be\n"
               "set by its environment variable; a flag wins over the variable.\n\n");
    for (size_t i = 0; i < NOPTS; i++) {
        char left[64];
        snprintf(left, sizeof left, "--%s%s", opts[i].flag, opts[i].type == T_BOOL ? "[=BOOL]" : " V");
        fprintf(f, "  %-26s %s\n  %-26s env %s, default %s\n", left, opts[i].help, "", opts[i].env,
                *opts[i].def ? opts[i].def : "(none)");
    }
    fprintf(f, "  %-26s this text\n", "-h, --help");
}

int ditd_serve_config_parse(ditd_serve_config *c, int argc, char **argv)
{
    struct option lo[NOPTS + 2];
    char who[96];
    int ch, err, idx;

    memset(c, 0, sizeof *c);
    for (size_t i = 0; i < NOPTS; i++)
        if (opts[i].type != T_NAMES && opts[i].type != T_LORA && (err = set(c, &opts[i], opts[i].def, opts[i].flag)))
            return err;
    for (size_t i = 0; i < NOPTS; i++) {
        const char *v = getenv(opts[i].env);
        if (!v || (!*v && opts[i].type != T_STR))
            continue;
        if ((err = set(c, &opts[i], v, opts[i].env)))
            return err;
    }
    for (size_t i = 0; i < NOPTS; i++) {
        lo[i].name = opts[i].flag;
        lo[i].has_arg = opts[i].type == T_BOOL ? optional_argument : required_argument;
        lo[i].flag = NULL;
        lo[i].val = 1000 + (int)i;
    }
    lo[NOPTS] = (struct option){"help", no_argument, NULL, 'h'};
    lo[NOPTS + 1] = (struct option){0, 0, 0, 0};
    optind = 1;
    opterr = 0;
    int names_flagged = 0; /* the first --served-model-name replaces the variable's */
    int loras_flagged = 0; /* and the first --lora DITD_LORA's */
    while ((ch = getopt_long(argc, argv, "h", lo, &idx)) != -1) {
        if (ch == 'h') {
            ditd_serve_config_usage(stdout);
            return 1;
        }
        if (ch < 1000 || ch >= 1000 + (int)NOPTS)
            return ditd_err_set(DITD_EINVAL, "unknown or incomplete option \"%s\" (see --help)",
                                argv[optind - 1]);
        const opt *o = &opts[ch - 1000];
        snprintf(who, sizeof who, "--%s", o->flag);
        if (o->type == T_NAMES && !names_flagged++)
            c->n_served_names = 0;
        if (o->type == T_LORA && !loras_flagged++)
            c->loras.n = 0;
        if ((err = set(c, o, optarg ? optarg : "1", who)))
            return err;
    }
    if (optind < argc)
        return ditd_err_set(DITD_EINVAL, "unexpected argument \"%s\"", argv[optind]);
    if (c->lora_dir[0] && (err = ditd_lora_specs_add_dir(&c->loras, c->lora_dir, "--lora-dir")))
        return err;
    if (!c->tls_cert[0] != !c->tls_key[0])
        return ditd_err_set(DITD_EINVAL, "--tls-cert and --tls-key go together (got only %s)",
                            c->tls_cert[0] ? "--tls-cert" : "--tls-key");
    return 0;
}
