/* The front-end of `ditd serve`: the state its modules share. Data only:
 * each module's functions are in its own header.
 *
 *   log.c     the log and the clock
 *   job.c     a request's states, outcome and references (the one owner)
 *   sched.c   the bounded queue, the batcher, replica routing, the worker
 *             messages (proto/ditd.proto); moves jobs through job.h
 *   http.c    our listen socket, libmicrohttpd in the loop, connection
 *             limits and read deadlines
 *   reply.c   responses, SSE streams, PNG/base64 encoding on the libuv work
 *             queue: the jobs' sink (what the HTTP side hears of a job)
 *   jobstore.c  the job store (SQLite rows, result files); jobrun.c feeds
 *             its queued jobs to the scheduler and stores their results
 *   routes.c  the route table and its dispatch (auth, 404/405/413/415), the
 *             watch; its handlers in route_info.c, route_gen.c, route_jobs.c
 *   cmd_serve.c  start-up, the libuv loop, signals, drain, shutdown; MPI
 *             worker ranks
 * Calls point down this list only (routes -> reply -> jobrun -> sched -> job -> log;
 * http is called by routes, reply and cmd_serve and calls none of them).
 *
 * Threads: everything here runs on the loop thread, except the encode work
 * (reply.c, touches only its own copy of the pixels) and the replica
 * threads of single-process mode (engine/worker/worker.h, which talk only
 * through the hub). */
#ifndef DITD_SERVER_SERVE_H
#define DITD_SERVER_SERVE_H

#include <stdint.h>
#include <uv.h>

#include "engine/models/model.h"
#include "engine/models/model_storage.h"
#include "engine/worker/worker.h"
#include "server/daemon/auth.h"
#include "server/daemon/config.h"
#include "server/daemon/genreq.h"
#include "server/daemon/http.h"
#include "server/daemon/job.h"
#include "server/daemon/metrics.h"

/* A batch on a replica, as the front-end sees it. */
typedef struct ditd_fbatch {
    uint64_t id;
    int replica;
    int n;
    int steps;
    uint64_t cost;      /* the samples' cost */
    int is_long;        /* holds long work (--long-cost): counts against --long-replicas */
    double t_start;
    ditd_job *job[DITD_WORKER_MAX_BATCH];  /* a ref each */
    int idx[DITD_WORKER_MAX_BATCH];        /* the image of the job */
} ditd_fbatch;

/* A LoRA adapter of the server (--lora, --lora-dir, POST /v1/loras), by
 * its index in cfg.loras (its slot); what a replica's Adapters message or
 * LoraDone said of it (all replicas load the same files). A slot is free
 * (cfg.loras.v[i].name ""), pending (named, a load under way: lora_names[i]
 * NULL, so no request may name it) or live (lora_names[i] set). */
typedef struct ditd_srv_lora {
    int known;          /* a replica reported it */
    uint32_t format;    /* ditd_lora_format */
    uint32_t max_rank;
    int n_modules;
    char **modules;     /* owned: the model's modules it targets */
    uint32_t *ranks;    /* owned: each module's rank */
    uint64_t bytes;
} ditd_srv_lora;

typedef struct ditd_replica {
    int ready;          /* said ready at least once */
    int failed;         /* reported an error of its own, or gone */
    double last_hb;
    ditd_fbatch *running;
    uint64_t samples;   /* total dispatched, for least-loaded routing ties */
    /* its latest heartbeat's text counters (cumulative on the replica) */
    uint64_t text_hits, text_misses, text_entries;
    double text_encode_ms;
    /* LoRA: each slot's device bytes here (0: not resident), from its
     * LoraEvents; and the adapter op under way (sched_lora.c) */
    uint64_t lora_resident[DITD_LORA_SPEC_MAX];
    int lora_wait;      /* the op went to it, no LoraDone yet */
    int lora_ok;        /* it answered the op with success */
} ditd_replica;

/* The one LoRA op (a POST or DELETE of /v1/loras) under way, and who waits
 * for it (sched_lora.c; cb is a ditd_lora_op_cb, sched.h). */
typedef struct ditd_lora_op {
    uint64_t id;        /* 0: none under way */
    int kind;           /* 1 load, 2 unload */
    int slot;
    double deadline;
    int code;           /* the first failure's DITD_E*, 0 */
    char msg[1024];     /* and its message */
    void (*cb)(ditd_srv *s, void *ctx, int status, const ditd_api_error *e, const char *name);
                        /* NULL once the caller is gone */
    void *ctx;
} ditd_lora_op;

struct ditd_srv {
    ditd_serve_config cfg;
    ditd_auth auth;
    ditd_model_info info;
    ditd_model_storage storage; /* each component's weights format and types (/v1/models) */
    ditd_sampler_kind sched_default;
    ditd_sched_config sched;    /* the folder's scheduler_config (gm.sched) */
    /* what requests are checked against: info, the aliases (--served-model-name
     * values other than the folder's name) and sched_default */
    ditd_genreq_model gm;
    const char *aliases[DITD_SERVE_MAX_NAMES];
    /* LoRA adapters: names for requests (gm.lora_names), the files for the
     * replicas, what the replicas reported */
    const char *lora_names[DITD_LORA_SPEC_MAX];
    ditd_worker_lora wloras[DITD_LORA_SPEC_MAX];
    ditd_srv_lora loras[DITD_LORA_SPEC_MAX];
    ditd_auth admin;            /* --admin-key, --admin-key-file */
    ditd_lora_op lora_op;
    uint64_t lora_op_next;
    uv_loop_t *loop;
    ditd_http http;
    uv_async_t wake;
    uv_timer_t watch;    /* 100 ms: timeouts, disconnects, keep-alives, drain */
    uv_timer_t window;   /* the batcher's wait */
    uv_signal_t sig[6];  /* TERM, INT, QUIT, HUP, USR1, USR2 */
    int nsig;
    ditd_hub *hub;
    uv_thread_t *threads; /* single-process replicas */
    ditd_worker_config *wcfg;
    int mpi;
    ditd_replica *rep;
    int nrep;
    ditd_job_list jobs;  /* every live job */
    ditd_job *q_head, *q_tail;
    int q_len;           /* jobs in the queue */
    uint64_t next_batch;
    double avg_batch_s;
    double sec_per_cost;  /* measured: batch seconds per unit of cost (0: not yet) */
    ditd_metrics m;
    struct ditd_jobrun *jobrun; /* background jobs and their store (jobrun.h; owned) */
    struct ditd_webhook *webhook; /* --webhook-url's deliveries (webhook.h; owned), or NULL */
    int draining;
    double drain_deadline;
    int aborted_left;    /* drain deadline passed, the rest got errors */
    int stopping;
    int exit_code;
    double t_start;
    long long t_wall;    /* start, Unix seconds */
};

#endif
