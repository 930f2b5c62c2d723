/* The job store of `ditd serve`: asynchronous jobs as rows of one SQLite
 * table (WAL journal) in --data-dir/jobs.db, their results as files beside
 * it (--data-dir/results/<id>-<index>.<ext>) written atomically (temporary
 * file, fsync, rename, fsync of the folder) before the row says completed.
 * Without a folder the database is in memory and results are rows of a
 * second table: the same code, nothing survives the process.
 *
 * A row is a kind ("image"; "video": its request is a POST /v1/videos body,
 * its outputs 0.mp4 and the thumbnail 1.png), an
 * owner (the SHA-256 of the API key that made it), a status, the request to
 * run (JSON, with the seed fixed at creation so a re-run makes the same
 * result), timestamps and an error.
 *
 * Recovery (ditd_jobstore_open), for a store a killed process left behind:
 * the claims are cleared; a job found in_progress ran when the process died:
 * it goes back to queued (it restarts from its first step) unless that has
 * now happened DITD_JOBSTORE_MAX_ATTEMPTS times, then it is failed with the
 * reason; temporary files, files of no completed job, and completed jobs
 * whose files are gone (failed, "result_lost") are cleaned up.
 *
 * Not the runner (jobrun.h: what feeds queued rows to the scheduler) nor
 * HTTP (route_jobs.c). Loop thread only, except ditd_jobstore_write_file. */
#ifndef DITD_SERVER_DAEMON_JOBSTORE_H
#define DITD_SERVER_DAEMON_JOBSTORE_H

#include <stddef.h>
#include <stdint.h>

#define DITD_JOBSTORE_MAX_ATTEMPTS 3
#define DITD_JOBSTORE_MAX_LIST 100

typedef enum ditd_jstatus {
    DITD_JS_QUEUED = 0,
    DITD_JS_RUNNING,      /* "in_progress" */
    DITD_JS_COMPLETED,
    DITD_JS_FAILED,
} ditd_jstatus;     /* a deleted job is gone: no "cancelled" row */
#define DITD_JS_COUNT 4
const char *ditd_jstatus_name(ditd_jstatus s);
int ditd_jstatus_from_str(const char *s, ditd_jstatus *out);

typedef struct ditd_jrow {
    char id[40];              /* "job_" + 24 hex */
    char kind[16];            /* "image", "video" */
    char owner[65];
    char model[256];
    ditd_jstatus status;
    int progress;             /* percent */
    long long created_at, started_at, completed_at, expires_at; /* Unix s; 0: not yet */
    int n_outputs;            /* result files */
    long long bytes;          /* their size */
    int attempts;             /* runs a process death interrupted */
    char error_code[64];
    char error_message[512];
    char size[32];            /* "WxH" */
    char *request;            /* the request JSON (owned), when asked for */
} ditd_jrow;

typedef struct ditd_jobstore ditd_jobstore;

/* What recovery did (ditd_jobstore_open). */
typedef struct ditd_jobstore_recovery {
    int requeued, failed, lost, orphans_removed;
} ditd_jobstore_recovery;

/* Opens (creating) the store in dir, or in memory when dir is NULL or "".
 * 0, or DITD_EIO with a detail naming the file. */
int ditd_jobstore_open(const char *dir, ditd_jobstore **out, ditd_jobstore_recovery *rec);
void ditd_jobstore_close(ditd_jobstore *st);
int ditd_jobstore_persistent(const ditd_jobstore *st);

/* A new queued row: r's kind, owner, model, size, created_at and request
 * (the caller keeps it); fills r->id. 0 or DITD_EIO. */
int ditd_jobstore_insert(ditd_jobstore *st, ditd_jrow *r);
/* The row id, when owner matches (NULL: any owner). DITD_ENOENT when none.
 * with_request: r->request is set (free it with ditd_jrow_free). */
int ditd_jobstore_get(ditd_jobstore *st, const char *id, const char *owner, ditd_jrow *r,
                      int with_request);
void ditd_jrow_free(ditd_jrow *r);
/* A page of owner's rows (NULL: all) of one kind (NULL: every kind) in
 * creation order (desc: newest first), after the row `after` (NULL: from
 * the start). *n rows (at most limit <= DITD_JOBSTORE_MAX_LIST) into rows;
 * *more when others follow. DITD_ENOENT when `after` is not one of those. */
int ditd_jobstore_list(ditd_jobstore *st, const char *owner, const char *kind, const char *after,
                       int limit, int desc, ditd_jrow *rows, int *n, int *more);
/* The oldest queued, unclaimed row, claimed (with its request). DITD_ENOENT
 * when none. */
int ditd_jobstore_claim_next(ditd_jobstore *st, ditd_jrow *r);
/* Gives a claim back (the scheduler could not take it now). */
int ditd_jobstore_unclaim(ditd_jobstore *st, const char *id);
/* Status changes. running: started_at = now (once). progress: percent. */
int ditd_jobstore_set_running(ditd_jobstore *st, const char *id, long long now);
int ditd_jobstore_set_progress(ditd_jobstore *st, const char *id, int percent);
/* Back to queued, unclaimed (a drain stopped it: it runs again). */
int ditd_jobstore_requeue(ditd_jobstore *st, const char *id);
int ditd_jobstore_set_completed(ditd_jobstore *st, const char *id, int n_outputs, long long bytes,
                                long long now, long long expires_at);
int ditd_jobstore_set_failed(ditd_jobstore *st, const char *id, const char *code,
                             const char *message, long long now, long long expires_at);
/* The row and its files. */
int ditd_jobstore_delete(ditd_jobstore *st, const char *id);
/* Deletes the terminal rows (and files) whose expires_at has passed;
 * *n how many. */
int ditd_jobstore_expire(ditd_jobstore *st, long long now, int *n);

/* Results. write_file: the bytes to dir's results/<id>-<index>.<ext>
 * atomically; any thread (it touches no database). put_blob: the same for
 * an in-memory store, loop thread. read: malloc'd bytes. */
int ditd_jobstore_write_file(const char *dir, const char *id, int index, const char *ext,
                             const uint8_t *data, size_t len);
int ditd_jobstore_put_blob(ditd_jobstore *st, const char *id, int index, const uint8_t *data,
                           size_t len);
int ditd_jobstore_read(ditd_jobstore *st, const char *id, int index, const char *ext,
                       uint8_t **data, size_t *len);
/* Removes a job's result files (an in-memory store: its blobs). */
void ditd_jobstore_remove_files(ditd_jobstore *st, const char *id);
const char *ditd_jobstore_dir(const ditd_jobstore *st);

/* Finished rows without an expiry (failed by recovery, or finished under
 * --job-ttl 0) get completed_at + ttl_s; *n how many. */
int ditd_jobstore_expire_unset(ditd_jobstore *st, long long ttl_s, int *n);

/* For /metrics and the disk budget: rows by status, and the bytes the store
 * holds (the results plus the database and its WAL). */
int ditd_jobstore_counts(ditd_jobstore *st, long long counts[DITD_JS_COUNT]);
long long ditd_jobstore_bytes(ditd_jobstore *st);

#endif
