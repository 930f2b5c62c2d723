/* `ditd serve` options: every one a flag and a DITD_* environment variable
 * (a flag wins over the variable, the variable over the default). One table
 * in config.c gives each its name, variable, default and help, so --help
 * and the docs cannot drift from the parser.
 *
 * This is not the model's settings (engine/models/model.h) nor the request's
 * (server/daemon/genreq.h). */
#ifndef DITD_SERVER_CONFIG_H
#define DITD_SERVER_CONFIG_H

#include <stdio.h>

#include "engine/pipeline/step_cache.h"
#include "server/common/lora_spec.h"

#define DITD_SERVE_MAX_NAMES 16   /* --served-model-name values */
#define DITD_SERVE_NAME_MAX 256   /* bytes of one, with the NUL */

typedef struct ditd_serve_config {
    char host[256];
    int port;
    char model[4096];           /* "" = the embedded default */
    /* weights files for transformer/ and text_encoder_2/ ("" = the
     * folder's; ditd_model_info_set_files) */
    char transformer_file[4096];
    char text_encoder_2_file[4096];
    /* extra names a request's "model" may use (--served-model-name,
     * repeatable, or comma-separated; DITD_SERVED_MODEL_NAME) */
    char served_names[DITD_SERVE_MAX_NAMES][DITD_SERVE_NAME_MAX];
    int n_served_names;
    int dp;                     /* replicas */
    int ulysses_degree, ring_degree, tp_degree, cfg_degree;
    int ring_rotate;            /* ditd_ring_rotate */
    ditd_cache_config cache;    /* --cache: step caching of requests without "cache" */
    int max_batch;              /* samples per batch */
    int batch_window_ms;
    int max_queue;              /* waiting requests per model */
    long max_body_bytes;
    double request_timeout_s;
    double drain_timeout_s;
    int threads;                /* CPU threads per replica, 0 = all */
    int max_connections;
    int sse_keepalive_ms;
    int heartbeat_ms;
    int heartbeat_timeout_ms;   /* /healthz fails when a replica is silent this long */
    int log_requests;
    int device;                 /* ditd_device: where the replicas run */
    int weight_dtype;           /* ditd_dtype of CPU weights (f32, bf16), -1: auto */
    int comm_timeout_ms;        /* NCCL watchdog: a collective's deadline */
    /* the HTTP edge (server/daemon/http.h) */
    int max_per_client;         /* open connections per client address */
    double header_timeout_s;    /* total, from accept or the previous answer */
    double body_timeout_s;      /* total, from the end of the headers */
    int idle_timeout_s;         /* libmicrohttpd's inactivity timeout */
    char api_key[4096];         /* comma-separated keys ("" none) */
    char api_key_file[4096];
    int metrics_auth;           /* /metrics needs a key too */
    char tls_cert[4096];        /* PEM files; both or neither */
    char tls_key[4096];
    int log_format;             /* ditd_log_format */
    int log_level;              /* ditd_log_level */
    long max_cost;              /* n x steps x tokens per request; 0 = no ceiling */
    char pid_file[4096];        /* the front-end writes its pid here ("" none) */
    char log_file[4096];        /* "" = stderr */
    int vae_tiling;             /* latent models: tiled VAE decode */
    int text_encoder_rank;      /* text models: group rank of the encoders */
    int text_cache_entries;     /* text models: LRU of prompt embeddings, per replica */
    int text_cache_mb;
    /* background jobs (server/daemon/jobrun.h) */
    char data_dir[4096];        /* the job store's folder ("" in memory) */
    double job_ttl_s;           /* a finished job is deleted this long after it ended (0: never) */
    double data_max_gb;         /* the store's budget, GB (0: none); past it new jobs get 507 */
    long long_cost;             /* a job costing more is long work (0: none is) */
    int long_replicas;          /* the most replicas long work holds at once (0: any) */
    char webhook_url[2048];     /* background jobs' end events (webhook.h); "" none */
    char webhook_secret[512];   /* whsec_... */
    char webhook_ca[1024];      /* https webhooks: a PEM file of roots; "" the system's */
    /* LoRA adapters every replica loads at start (docs/lora.md): --lora
     * NAME=PATH (repeatable; DITD_LORA: comma-separated), then the files
     * of --lora-dir, which parse() lists into loras */
    ditd_lora_specs loras;
    char lora_dir[4096];
    int max_loras_per_request;  /* a request's "loras", 1..DITD_LORA_MAX_SET */
    double lora_cache_mb;       /* MiB of adapters resident per replica (0: all) */
    /* loading and unloading adapters at run time (POST / DELETE /v1/loras):
     * the admin keys, and the folders a file may come from */
    char admin_key[4096];
    char admin_key_file[4096];
    char lora_root[4096];
    int lora_any_path;
} ditd_serve_config;

/* Defaults, then DITD_* variables, then flags (argv as main gives it after
 * "serve"). Returns 0; 1 when --help printed the options (exit 0); or
 * DITD_EINVAL with a detail naming the flag or variable (exit 2). */
int ditd_serve_config_parse(ditd_serve_config *c, int argc, char **argv);

/* The option table as `ditd serve --help` prints it. */
void ditd_serve_config_usage(FILE *f);

#endif
