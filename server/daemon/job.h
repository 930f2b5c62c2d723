/* A job: one accepted (or arriving) image-generation request, the one
 * object the HTTP side (routes.c) and the scheduler (sched.c) share. This
 * module owns its life: the states it moves through, its outcome, its
 * reference count, and the list of live jobs. It calls neither side: the
 * HTTP side gives each job a sink (a table of callbacks, as libuv's close
 * callbacks) that hears progress, partial images, the result and the error;
 * the scheduler moves the job through these functions and keeps its own
 * fields (queue links, sample placement) in the job.
 *
 * Life:      BODY --accept--> WAITING --answered--> ANSWERED
 *              \--refuse (4xx/5xx before acceptance)-----^
 * Outcome:   NONE -> RESULT (every image back) | ERROR | CANCELED (client gone)
 *            decided once ("terminal"): every accepted job ends in exactly
 *            one result or one error, never both, never none. The only
 *            exception is a RESULT whose encoding failed: it becomes an ERROR
 *            before any of it reached the client (ditd_job_fail_encode).
 *
 * References: the HTTP connection holds one, the queue one, each batch slot
 * one, each encode work one, a stream's response one. The job is freed on the
 * loop thread when the last lets go. Loop thread only. */
#ifndef DITD_SERVER_JOB_H
#define DITD_SERVER_JOB_H

#include <microhttpd.h>
#include <stddef.h>
#include <stdint.h>

#include "server/daemon/genreq.h"

typedef struct ditd_srv ditd_srv;
typedef struct ditd_job ditd_job;

typedef enum ditd_job_state {
    DITD_JOB_BODY = 0,   /* reading the body */
    DITD_JOB_WAITING,    /* accepted: queued, running or encoding */
    DITD_JOB_ANSWERED,   /* the final answer is handed to the connection */
} ditd_job_state;
#define DITD_JOB_STATE_COUNT 3
const char *ditd_job_state_name(ditd_job_state s);
int ditd_job_state_from_str(const char *s, ditd_job_state *out);

typedef enum ditd_job_outcome {
    DITD_JOB_PENDING = 0,
    DITD_JOB_RESULT,
    DITD_JOB_ERROR,
    DITD_JOB_CANCELED,   /* the client went away; nothing is answered */
} ditd_job_outcome;
#define DITD_JOB_OUTCOME_COUNT 4
const char *ditd_job_outcome_name(ditd_job_outcome o);
int ditd_job_outcome_from_str(const char *s, ditd_job_outcome *out);

/* What the HTTP side hears. Each is called on the loop thread with the job
 * alive; none may free it (take a ref to keep it past the call). */
typedef struct ditd_job_sink {
    /* streaming jobs only, before the outcome */
    void (*progress)(ditd_job *j, int step, int total);
    void (*partial)(ditd_job *j, int image, int partial_index, const uint8_t *pixels);
    /* the outcome became RESULT: every image is in j->pixels */
    void (*complete)(ditd_job *j);
    /* the outcome became ERROR */
    void (*failed)(ditd_job *j, const ditd_api_error *e);
} ditd_job_sink;

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
    char rid[80];                 /* request id: the client's X-Request-Id or ours */
    ditd_srv *s;                  /* borrowed; not used by job.c */
    const ditd_job_sink *sink;
    struct ditd_job_list *list;
    ditd_job *all_prev, *all_next;
    ditd_job_state state;
    ditd_job_outcome outcome;
    ditd_genreq rq;
    double t_arrive, t_dispatch;
    size_t numel;                 /* values per image (channels x the request's size) */
    uint8_t *pixels;              /* n x numel, as results arrive */
    int finished;                 /* samples back (done or dropped) */
    int channels;
    /* step caching: the sums over the request's images back so far */
    long cache_steps, cache_steps_skipped, cache_evals, cache_evals_skipped;

    /* the scheduler's (sched.c) */
    uint64_t cost;                /* n x steps x tokens */
    double deadline;              /* the queue's order: arrival + cost x seconds per unit */
    int in_queue;
    ditd_job *q_prev, *q_next;
    int dispatched;               /* samples handed to batches */
    struct { uint64_t batch; int replica; int slot; } loc[DITD_GENREQ_MAX_N];

    /* a stored (background) job's (jobrun.c): no connection, no
     * --request-timeout, progress heard whatever stream says */
    int background;
    char store_id[40];
    int store_running;            /* the row says in_progress */
    int store_pct;                /* the progress the row has */
    double store_t;               /* when the row's progress was written */
    long long store_created;      /* the row's created_at (wall s) */
    double store_started;         /* when it started here (ditd__now), 0: not yet */
    int store_done;               /* its outcome reached the store: the runner lets go */

    /* the HTTP side's (routes.c) */
    struct MHD_Connection *conn;  /* NULL once libmicrohttpd is done with it */
    int suspended;
    int want_png;
    struct MHD_Response *resp;    /* answer to queue when resumed */
    size_t resp_len;
    int resp_status;
    int probed;                   /* a half-close probe was written (routes.c) */
    int http10;                   /* the request was HTTP/1.0: no probe (no 1xx answer) */
    int status;                   /* the status sent, for metrics and the log */
    ditd_sse_ev *ev_head, **ev_tail;
    char *out;
    size_t out_len, out_off, out_cap;
    int stream_end;
    double next_keepalive;
};

/* Every live job, newest first. */
typedef struct ditd_job_list {
    ditd_job *head;
    int live;
    uint64_t next_id;
    uint64_t next_rid;
    uint64_t epoch;               /* makes request ids unique across restarts */
} ditd_job_list;

/* A request id into out (n bytes): the client's (given, from X-Request-Id)
 * when it is 1..79 printable ASCII bytes without blanks or quotes, else a
 * new one, "req-<epoch>-<n>". */
void ditd_job_make_rid(ditd_job_list *l, const char *given, char *out, size_t n);

/* A new job in BODY with one reference (the caller's). rid: its request id
 * (ditd_job_make_rid), or NULL to make one. NULL on out of memory. */
ditd_job *ditd_job_new(ditd_job_list *l, ditd_srv *s, const ditd_job_sink *sink, const char *rid);
void ditd_job_ref(ditd_job *j);
/* Drops a reference; the last frees the job and everything it owns. */
void ditd_job_unref(ditd_job *j);

/* BODY -> WAITING with the validated request; allocates the images'
 * buffer (numel values each). On 0 the job steals the request's strings
 * (prompts: freed with the job); on DITD_ENOMEM they stay the caller's. */
int ditd_job_accept(ditd_job *j, const ditd_genreq *rq, size_t numel);
/* -> ANSWERED with outcome ERROR, the sink not told (the caller answers):
 * refused before acceptance, or by the scheduler right after it (nothing
 * of it is out). */
void ditd_job_refuse(ditd_job *j);
/* The final answer is out (or given to the connection). */
void ditd_job_answered(ditd_job *j);

static inline int ditd_job_terminal(const ditd_job *j)
{
    return j->outcome != DITD_JOB_PENDING;
}

/* The outcome becomes ERROR and the sink hears it. Returns 1, or 0 (nothing
 * done) when the outcome was already decided. Does not touch the scheduler:
 * callers that may have samples out go through ditd__sched_fail. */
int ditd_job_fail(ditd_job *j, const ditd_api_error *e);
/* A RESULT whose encoding failed becomes an ERROR (sink->failed). */
void ditd_job_fail_encode(ditd_job *j, const ditd_api_error *e);
/* The client is gone: outcome CANCELED, state ANSWERED, the sink hears
 * nothing. Returns 1 when that decided the outcome. */
int ditd_job_cancel(ditd_job *j);

/* A sample came back: with pixels (numel values), or dropped (pixels NULL:
 * only counted; the scheduler fails the job). When every one is back with
 * pixels the outcome becomes RESULT (sink->complete). */
void ditd_job_sample_back(ditd_job *j, int index, const uint8_t *pixels, int channels);
/* Progress of a streaming or background job; ignored once terminal or for
 * a plain request. */
void ditd_job_progress(ditd_job *j, int step, int total);
void ditd_job_partial(ditd_job *j, int image, int partial_index, const uint8_t *pixels);

#endif
