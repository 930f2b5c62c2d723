/* The runner of stored jobs: between the job store (jobstore.h) and the
 * scheduler (sched.h). It validates and stores a new background job, feeds
 * queued rows to the scheduler as ordinary jobs (job.h) with a sink of its
 * own, moves each row through in_progress (with its progress in percent) to
 * completed (its PNGs written to the store off the loop, before the row
 * says so) or failed, cancels a deleted job at the next step boundary,
 * deletes expired jobs (--job-ttl) and keeps the disk budget
 * (--data-max-gb).
 *
 * At most one stored job per replica is handed to the scheduler at a time,
 * so that a thousand stored jobs neither fill the request queue (429 for
 * everyone) nor starve synchronous requests: the scheduler's earliest-
 * deadline order decides between the one handed over and the requests.
 *
 * On a drain (SIGTERM) the jobs it handed over are stopped at their next
 * step and go back to queued: they run again, from their first step, after
 * the restart (docs/serving.md says why). Loop thread only. */
#ifndef DITD_SERVER_DAEMON_JOBRUN_H
#define DITD_SERVER_DAEMON_JOBRUN_H

#include <stddef.h>

#include "server/daemon/genreq.h"
#include "server/daemon/job.h"
#include "server/daemon/jobstore.h"

typedef struct ditd_srv ditd_srv;

#define DITD_JOBRUN_MAX_INFLIGHT 64

typedef struct ditd_jobrun {
    ditd_jobstore *st;
    double ttl_s;                 /* --job-ttl; 0: kept until deleted */
    long long max_bytes;          /* --data-max-gb in bytes; 0: no budget */
    int max_inflight;
    ditd_job *fl[DITD_JOBRUN_MAX_INFLIGHT]; /* handed to the scheduler: a ref each */
    int n_fl;
    int n_writing;                /* results being written */
    double next_sweep;
    double next_claim_warn;       /* the next "queued jobs cannot start" warning */
    int drained;
    /* counters for /metrics */
    unsigned long long created, completed, failed, deleted, expired, refused_full;
} ditd_jobrun;

/* Opens the store (--data-dir, "" in memory) and logs what recovery did.
 * 0 or DITD_EIO with a detail. */
int ditd_jobrun_open(ditd_srv *s);
void ditd_jobrun_close(ditd_srv *s);

/* A new background job for owner: 0 with *row filled (queued), or an HTTP
 * status with *e (400 bad request, 404 model, 507 over the disk budget,
 * 500). kind "image": a generation body (len bytes, JSON), its PNGs the
 * outputs; kind "video": a POST /v1/videos body as JSON (route_videos.c
 * turns a form into one), its outputs the MP4 (output 0) and the first
 * frame as a PNG (output 1, the thumbnail). */
int ditd_jobrun_create(ditd_srv *s, const char *owner, const char *kind, const char *body,
                       size_t len, ditd_jrow *row, ditd_api_error *e);
/* Deletes the job: a running one stops at its next step boundary. */
int ditd_jobrun_delete(ditd_srv *s, const char *id);
/* Periodic (the 100 ms watch): hands queued rows over, marks dispatched
 * ones in_progress, expires old ones, and on a drain stops and requeues. */
void ditd_jobrun_watch(ditd_srv *s);

#endif
