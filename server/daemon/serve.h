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

/* A LoRA adapter of the server (--lora, --lora-dir), by its index in
 * cfg.loras; what a replica's Adapters message said of it (all replicas
 * load the same files). */
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
} ditd_replica;

struct ditd_srv {
    ditd_serve_config cfg;
    ditd_auth auth;
    ditd_model_info info;
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
