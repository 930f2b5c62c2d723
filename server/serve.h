/* The front-end of `ditd serve`: its state and the pieces that share it.
 * Internal to server/ (cross-file names are ditd__*).
 *
 *   cmd_serve.c  start-up, the libuv loop, libmicrohttpd driven by it,
 *                signals, drain, shutdown; MPI worker ranks
 *   routes.c     HTTP routes, responses, SSE streams, PNG/base64 encoding on
 *                the libuv work queue
 *   sched.c      the bounded queue, the batcher, replica routing, and the
 *                worker messages (proto/ditd.proto)
 *
 * Threads: everything here runs on the loop thread, except the encode work
 * (routes.c, touches only its own copy of the pixels) and the replica
 * threads of single-process mode (engine/worker/worker.h, which talk only through
 * the hub). A job is reference-counted: the HTTP connection holds one, the
 * queue one, each batch slot one, each encode work one; it is freed on the
 * loop thread when the last lets go.
 */
#ifndef DITD_SERVER_SERVE_H
#define DITD_SERVER_SERVE_H

#include <microhttpd.h>
#include <stdint.h>
#include <uv.h>

#include "engine/models/model.h"
#include "engine/worker/worker.h"
#include "server/config.h"
#include "server/genreq.h"
#include "server/metrics.h"

typedef struct ditd_srv ditd_srv;
typedef struct ditd_job ditd_job;

typedef enum ditd_job_state {
    DITD_JOB_BODY = 0,   /* reading the body */
    DITD_JOB_WAITING,    /* accepted: queued or running */
    DITD_JOB_ANSWERED,   /* a final answer is decided (response or end of stream) */
} ditd_job_state;

/* One SSE event in order; image events wait for their encode work. */
typedef struct ditd_sse_ev {
    struct ditd_sse_ev *next;
    int ready;
    int end;             /* the end of the stream (after the event's text) */
    char *text;          /* owned */
    size_t len;
} ditd_sse_ev;

struct ditd_job {
    int refs;
    uint64_t id;
    char rid[32];                 /* request id, in X-Request-Id and logs */
    ditd_srv *s;
    ditd_job *all_prev, *all_next; /* every live job */

    /* HTTP side */
    struct MHD_Connection *conn;  /* NULL once libmicrohttpd is done with it */
    int suspended;
    int want_png;
    char *body;
    size_t body_len, body_cap;
    struct MHD_Response *resp;    /* answer to queue when resumed */
    int resp_status;
    int status;                   /* the status sent, for metrics */

    /* the request */
    ditd_job_state state;
    ditd_genreq rq;
    double t_arrive, t_dispatch;
    int in_queue;
    ditd_job *q_prev, *q_next;
    int dispatched;               /* samples handed to batches */
    int finished;                 /* samples back (done or dropped) */
    int terminal;                 /* a result or an error is decided */
    uint8_t *pixels;              /* n x (H, W, C), as results arrive */
    int channels;
    struct { uint64_t batch; int replica; int slot; } loc[DITD_GENREQ_MAX_N];

    /* SSE */
    ditd_sse_ev *ev_head, **ev_tail;
    char *out;
    size_t out_len, out_off, out_cap;
    int stream_end;
    double next_keepalive;
    int partials_sent;
};

/* A batch on a replica, as the front-end sees it. */
typedef struct ditd_fbatch {
    uint64_t id;
    int replica;
    int n;
    int steps;
    double t_start;
    ditd_job *job[DITD_WORKER_MAX_BATCH];  /* a ref each */
    int idx[DITD_WORKER_MAX_BATCH];        /* the image of the job */
} ditd_fbatch;

typedef struct ditd_replica {
    int ready;          /* said ready at least once */
    int failed;         /* reported an error of its own, or gone */
    double last_hb;
    ditd_fbatch *running;
    uint64_t samples;   /* total dispatched, for least-loaded routing ties */
} ditd_replica;

struct ditd_srv {
    ditd_serve_config cfg;
    ditd_model_info info;
    ditd_sampler_kind sched_default;
    size_t numel;        /* C*S*S pixels per image */
    uv_loop_t *loop;
    struct MHD_Daemon *mhd;
    int port;
    uv_poll_t mhd_poll;
    uv_timer_t mhd_timer;
    int mhd_kick;
    uv_async_t wake;
    uv_timer_t watch;    /* 100 ms: timeouts, disconnects, keep-alives, drain */
    uv_timer_t window;   /* the batcher's wait */
    uv_signal_t sigterm, sigint;
    ditd_hub *hub;
    uv_thread_t *threads; /* single-process replicas */
    ditd_worker_config *wcfg;
    int mpi;
    ditd_replica *rep;
    int nrep;
    ditd_job *all;       /* every live job */
    int jobs_live;
    ditd_job *q_head, *q_tail;
    int q_len;           /* jobs in the queue */
    uint64_t next_job, next_batch;
    double avg_batch_s;
    ditd_metrics m;
    int draining;
    double drain_deadline;
    int aborted_left;    /* drain deadline passed, the rest got errors */
    int stopping;
    int exit_code;
    double t_start;
    long long t_wall;    /* start, Unix seconds */
};

double ditd__now(void);
void ditd__log(ditd_srv *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* jobs (routes.c) */
ditd_job *ditd__job_new(ditd_srv *s, struct MHD_Connection *conn);
void ditd__job_ref(ditd_job *j);
void ditd__job_unref(ditd_job *j);
/* Every sample is back: encode and answer. */
void ditd__job_complete(ditd_job *j);
/* A final error for the job (status, OpenAI code, message): answered now,
 * its samples are canceled on the replicas. No-op if already terminal. */
void ditd__job_fail(ditd_job *j, int status, const char *type, const char *code,
                    const char *fmt, ...) __attribute__((format(printf, 5, 6)));
/* Stream events (routes.c) */
void ditd__job_progress(ditd_job *j, int step, int total, double elapsed_ms);
void ditd__job_partial(ditd_job *j, int image, int partial_index, const uint8_t *pixels);
/* libmicrohttpd callbacks (routes.c) */
enum MHD_Result ditd__on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                 const char *method, const char *version, const char *upload,
                                 size_t *upload_size, void **ctx);
void ditd__on_completed(void *cls, struct MHD_Connection *conn, void **ctx,
                        enum MHD_RequestTerminationCode toe);
/* Wakes libmicrohttpd soon (after a resume), outside its callbacks. */
void ditd__mhd_kick(ditd_srv *s);
/* Resumes a suspended job's connection. */
void ditd__job_resume(ditd_job *j);
/* Periodic: timeouts, disconnected waiters, keep-alives. */
void ditd__jobs_watch(ditd_srv *s);

/* scheduling (sched.c) */
/* 0, or an HTTP status (429 queue full, 503 no replica / draining) with *e. */
int ditd__sched_submit(ditd_srv *s, ditd_job *j, ditd_api_error *e);
void ditd__sched_kick(ditd_srv *s);
void ditd__sched_on_message(ditd_srv *s, int replica, const uint8_t *buf, size_t len);
/* Takes the job out of the queue and cancels its running samples. */
void ditd__sched_withdraw(ditd_srv *s, ditd_job *j);
int ditd__sched_replicas_up(const ditd_srv *s);
int ditd__sched_running(const ditd_srv *s);
int ditd__sched_retry_after(const ditd_srv *s);
/* Sends Shutdown to every replica. */
void ditd__sched_shutdown(ditd_srv *s, int now);

#endif
