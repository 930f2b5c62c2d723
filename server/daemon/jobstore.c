/* The job store: SQLite rows and result files (server/daemon/jobstore.h).
 * Loop thread only, except ditd_jobstore_write_file. */
#include "server/daemon/jobstore.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/core/error.h"
#include "server/daemon/log.h"

struct ditd_jobstore {
    sqlite3 *db;
    char dir[4096];            /* "" in memory */
    char results[4200];        /* dir/results */
};

static const char *const status_names[] = {"queued", "in_progress", "completed", "failed"};

const char *ditd_jstatus_name(ditd_jstatus s)
{
    return (unsigned)s < DITD_JS_COUNT ? status_names[s] : "?";
}

int ditd_jstatus_from_str(const char *t, ditd_jstatus *out)
{
    for (int i = 0; i < DITD_JS_COUNT; i++)
        if (t && !strcmp(t, status_names[i])) {
            *out = (ditd_jstatus)i;
            return 0;
        }
    return DITD_EINVAL;
}

/* A row's status (only this file writes them: an unknown one is a store
 * from elsewhere, shown failed). */
static ditd_jstatus status_of(const char *t)
{
    ditd_jstatus st = DITD_JS_FAILED;
    ditd_jstatus_from_str(t, &st);
    return st;
}

static const char schema[] =
    "CREATE TABLE IF NOT EXISTS jobs("
    " seq INTEGER PRIMARY KEY AUTOINCREMENT,"
    " id TEXT NOT NULL UNIQUE,"
    " kind TEXT NOT NULL,"
    " owner TEXT NOT NULL,"
    " model TEXT NOT NULL,"
    " status TEXT NOT NULL,"
    " progress INTEGER NOT NULL DEFAULT 0,"
    " claimed INTEGER NOT NULL DEFAULT 0,"
    " request TEXT NOT NULL,"
    " size TEXT NOT NULL DEFAULT '',"
    " created_at INTEGER NOT NULL,"
    " started_at INTEGER NOT NULL DEFAULT 0,"
    " completed_at INTEGER NOT NULL DEFAULT 0,"
    " expires_at INTEGER NOT NULL DEFAULT 0,"
    " n_outputs INTEGER NOT NULL DEFAULT 0,"
    " bytes INTEGER NOT NULL DEFAULT 0,"
    " attempts INTEGER NOT NULL DEFAULT 0,"
    " error_code TEXT NOT NULL DEFAULT '',"
    " error_message TEXT NOT NULL DEFAULT '');"
    "CREATE INDEX IF NOT EXISTS jobs_owner ON jobs(owner, seq);"
    "CREATE INDEX IF NOT EXISTS jobs_queue ON jobs(status, claimed, seq);"
    "CREATE INDEX IF NOT EXISTS jobs_expiry ON jobs(expires_at) WHERE expires_at > 0;"
    "CREATE TABLE IF NOT EXISTS blobs(id TEXT NOT NULL, idx INTEGER NOT NULL,"
    " data BLOB NOT NULL, PRIMARY KEY(id, idx));";

#define COLS                                                                                     \
    "id, kind, owner, model, status, progress, created_at, started_at, completed_at, "           \
    "expires_at, n_outputs, bytes, attempts, error_code, error_message, size, request"

static int db_err(ditd_jobstore *st, const char *what)
{
    return ditd_err_set(DITD_EIO, "job store %s: %s: %s", st->dir[0] ? st->dir : "(memory)", what,
                        sqlite3_errmsg(st->db));
}

static int exec(ditd_jobstore *st, const char *sql)
{
    char *msg = NULL;
    if (sqlite3_exec(st->db, sql, NULL, NULL, &msg) != SQLITE_OK) {
        int err = ditd_err_set(DITD_EIO, "job store %s: %s", st->dir[0] ? st->dir : "(memory)",
                               msg ? msg : "?");
        sqlite3_free(msg);
        return err;
    }
    return 0;
}

/* A prepared statement with text arguments (NULL: SQL NULL), as many as
 * given; NULL on error (logged into the detail). */
static sqlite3_stmt *prep(ditd_jobstore *st, const char *sql)
{
    sqlite3_stmt *q = NULL;
    if (sqlite3_prepare_v2(st->db, sql, -1, &q, NULL) != SQLITE_OK) {
        db_err(st, sql);
        return NULL;
    }
    return q;
}

static void copy(char *dst, size_t n, const unsigned char *src)
{
    snprintf(dst, n, "%s", src ? (const char *)src : "");
}

static void read_row(sqlite3_stmt *q, ditd_jrow *r, int with_request)
{
    memset(r, 0, sizeof *r);
    copy(r->id, sizeof r->id, sqlite3_column_text(q, 0));
    copy(r->kind, sizeof r->kind, sqlite3_column_text(q, 1));
    copy(r->owner, sizeof r->owner, sqlite3_column_text(q, 2));
    copy(r->model, sizeof r->model, sqlite3_column_text(q, 3));
    r->status = status_of((const char *)sqlite3_column_text(q, 4));
    r->progress = sqlite3_column_int(q, 5);
    r->created_at = sqlite3_column_int64(q, 6);
    r->started_at = sqlite3_column_int64(q, 7);
    r->completed_at = sqlite3_column_int64(q, 8);
    r->expires_at = sqlite3_column_int64(q, 9);
    r->n_outputs = sqlite3_column_int(q, 10);
    r->bytes = sqlite3_column_int64(q, 11);
    r->attempts = sqlite3_column_int(q, 12);
    copy(r->error_code, sizeof r->error_code, sqlite3_column_text(q, 13));
    copy(r->error_message, sizeof r->error_message, sqlite3_column_text(q, 14));
    copy(r->size, sizeof r->size, sqlite3_column_text(q, 15));
    if (with_request) {
        const unsigned char *t = sqlite3_column_text(q, 16);
        r->request = strdup(t ? (const char *)t : "{}");
    }
}

void ditd_jrow_free(ditd_jrow *r)
{
    free(r->request);
    r->request = NULL;
}

/* ------------------------------------------------------------------ */
/* files                                                               */

static int fsync_path(const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_DIRECTORY);
    int rc;
    if (fd < 0)
        return -1;
    rc = fsync(fd);
    close(fd);
    return rc;
}

/* Removes dir/<name> and what it holds (one level: a job's folder). */
static void remove_job_dir(const char *results, const char *name)
{
    char path[4400], f[4700];
    DIR *d;
    snprintf(path, sizeof path, "%s/%s", results, name);
    if ((d = opendir(path))) {
        struct dirent *e;
        while ((e = readdir(d)))
            if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
                snprintf(f, sizeof f, "%s/%s", path, e->d_name);
                unlink(f);
            }
        closedir(d);
    }
    rmdir(path);
}

int ditd_jobstore_write_file(const char *dir, const char *id, int index, const char *ext,
                             const uint8_t *data, size_t len)
{
    char jd[4400], tmp[4500], fin[4500];
    int fd, e;
    snprintf(jd, sizeof jd, "%s/results/%s", dir, id);
    if (mkdir(jd, 0755)) {
        if (errno != EEXIST)
            return ditd_err_set(DITD_EIO, "%s: %s", jd, strerror(errno));
    } else {
        char rd[4200];
        snprintf(rd, sizeof rd, "%s/results", dir);
        fsync_path(rd); /* the new folder's entry, before a file in it counts */
    }
    snprintf(tmp, sizeof tmp, "%s/.%d.%s.tmp", jd, index, ext);
    snprintf(fin, sizeof fin, "%s/%d.%s", jd, index, ext);
    if ((fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)) < 0)
        return ditd_err_set(DITD_EIO, "%s: %s", tmp, strerror(errno));
    for (size_t off = 0; off < len;) {
        ssize_t w = write(fd, data + off, len - off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            e = w < 0 ? errno : ENOSPC;
            goto fail;
        }
        off += (size_t)w;
    }
    if (fsync(fd)) {
        e = errno;
        goto fail;
    }
    close(fd);
    if (rename(tmp, fin)) {
        e = errno;
        unlink(tmp);
        return ditd_err_set(DITD_EIO, "%s: %s", fin, strerror(e));
    }
    fsync_path(jd);
    return 0;
fail:
    close(fd);
    unlink(tmp);
    return ditd_err_set(DITD_EIO, "%s: %s", fin, strerror(e));
}

int ditd_jobstore_put_blob(ditd_jobstore *st, const char *id, int index, const uint8_t *data,
                           size_t len)
{
    sqlite3_stmt *q = prep(st, "INSERT OR REPLACE INTO blobs(id, idx, data) VALUES(?, ?, ?)");
    int rc;
    if (!q)
        return DITD_EIO;
    sqlite3_bind_text(q, 1, id, -1, SQLITE_STATIC);
    sqlite3_bind_int(q, 2, index);
    sqlite3_bind_blob64(q, 3, data, len, SQLITE_STATIC);
    rc = sqlite3_step(q);
    sqlite3_finalize(q);
    return rc == SQLITE_DONE ? 0 : db_err(st, "storing a result");
}

int ditd_jobstore_read(ditd_jobstore *st, const char *id, int index, const char *ext,
                       uint8_t **data, size_t *len)
{
    *data = NULL;
    *len = 0;
    if (!st->dir[0]) {
        sqlite3_stmt *q = prep(st, "SELECT data FROM blobs WHERE id = ? AND idx = ?");
        int rc;
        if (!q)
            return DITD_EIO;
        sqlite3_bind_text(q, 1, id, -1, SQLITE_STATIC);
        sqlite3_bind_int(q, 2, index);
        rc = sqlite3_step(q);
        if (rc == SQLITE_ROW) {
            size_t n = (size_t)sqlite3_column_bytes(q, 0);
            *data = malloc(n ? n : 1);
            if (*data) {
                memcpy(*data, sqlite3_column_blob(q, 0), n);
                *len = n;
            }
        }
        sqlite3_finalize(q);
        if (rc != SQLITE_ROW)
            return ditd_err_set(DITD_ENOENT, "job %s has no output %d", id, index);
        return *data ? 0 : DITD_ENOMEM;
    }
    char path[4500];
    snprintf(path, sizeof path, "%s/%s/%d.%s", st->results, id, index, ext);
    FILE *f = fopen(path, "rb");
    if (!f)
        return ditd_err_set(errno == ENOENT ? DITD_ENOENT : DITD_EIO, "%s: %s", path,
                            strerror(errno));
    struct stat sb;
    if (fstat(fileno(f), &sb) || !(*data = malloc(sb.st_size ? (size_t)sb.st_size : 1))) {
        fclose(f);
        return DITD_ENOMEM;
    }
    *len = fread(*data, 1, (size_t)sb.st_size, f);
    fclose(f);
    if (*len != (size_t)sb.st_size) {
        free(*data);
        *data = NULL;
        return ditd_err_set(DITD_EIO, "%s: short read", path);
    }
    return 0;
}

void ditd_jobstore_remove_files(ditd_jobstore *st, const char *id)
{
    if (st->dir[0]) {
        remove_job_dir(st->results, id);
        return;
    }
    sqlite3_stmt *q = prep(st, "DELETE FROM blobs WHERE id = ?");
    if (q) {
        sqlite3_bind_text(q, 1, id, -1, SQLITE_STATIC);
        sqlite3_step(q);
        sqlite3_finalize(q);
    }
}

const char *ditd_jobstore_dir(const ditd_jobstore *st)
{
    return st->dir;
}

int ditd_jobstore_persistent(const ditd_jobstore *st)
{
    return st->dir[0] != 0;
}

/* ------------------------------------------------------------------ */
/* open and recovery                                                   */

/* A completed job's outputs are all there: PNGs, or a clip's MP4 (output
 * 0) and thumbnail PNG (jobrun.h). */
static int outputs_present(ditd_jobstore *st, const char *id, int n, const char *kind)
{
    char path[4500];
    struct stat sb;
    int video = kind && !strcmp(kind, "video");
    for (int i = 0; i < n; i++) {
        snprintf(path, sizeof path, "%s/%s/%d.%s", st->results, id, i,
                 video && i == 0 ? "mp4" : "png");
        if (stat(path, &sb) || !S_ISREG(sb.st_mode))
            return 0;
    }
    return 1;
}

static int count_changes(ditd_jobstore *st, const char *sql, int *n)
{
    int err = exec(st, sql);
    if (!err && n)
        *n += sqlite3_changes(st->db);
    return err;
}

static int recover(ditd_jobstore *st, ditd_jobstore_recovery *rec)
{
    int err;
    char sql[512];
    if ((err = exec(st, "UPDATE jobs SET claimed = 0 WHERE claimed != 0")))
        return err;
    /* running when the process died: again, or failed after too many */
    snprintf(sql, sizeof sql,
             "UPDATE jobs SET status = 'failed', claimed = 0, attempts = attempts + 1,"
             " error_code = 'interrupted', completed_at = strftime('%%s','now'),"
             " error_message = 'the server stopped while this job ran, %d times; it is not run"
             " again' WHERE status = 'in_progress' AND attempts + 1 >= %d",
             DITD_JOBSTORE_MAX_ATTEMPTS, DITD_JOBSTORE_MAX_ATTEMPTS);
    if ((err = count_changes(st, sql, &rec->failed)))
        return err;
    if ((err = count_changes(st,
                             "UPDATE jobs SET status = 'queued', progress = 0, started_at = 0,"
                             " attempts = attempts + 1 WHERE status = 'in_progress'",
                             &rec->requeued)))
        return err;
    if (!st->dir[0])
        return 0;
    /* completed rows whose files are gone */
    sqlite3_stmt *q = prep(st, "SELECT id, n_outputs, kind FROM jobs WHERE status = 'completed'");
    if (!q)
        return DITD_EIO;
    char (*lost)[40] = NULL;
    int nl = 0, cap = 0;
    while (sqlite3_step(q) == SQLITE_ROW) {
        const char *id = (const char *)sqlite3_column_text(q, 0);
        if (outputs_present(st, id, sqlite3_column_int(q, 1), (const char *)sqlite3_column_text(q, 2)))
            continue;
        if (nl == cap) {
            void *p = realloc(lost, (size_t)(cap = cap ? 2 * cap : 16) * sizeof *lost);
            if (!p)
                break; /* the rest is found at the next start */
            lost = p;
        }
        snprintf(lost[nl++], sizeof lost[0], "%s", id);
    }
    sqlite3_finalize(q);
    for (int i = 0; i < nl; i++) {
        ditd_jobstore_set_failed(st, lost[i], "result_lost",
                                 "the job completed but its result files are gone", 0, 0);
        rec->lost++;
    }
    free(lost);
    /* folders of no completed job, and temporary files */
    DIR *d = opendir(st->results);
    if (!d)
        return ditd_err_set(DITD_EIO, "%s: %s", st->results, strerror(errno));
    sqlite3_stmt *is = prep(st, "SELECT 1 FROM jobs WHERE id = ? AND status = 'completed'");
    struct dirent *e;
    while (is && (e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        sqlite3_reset(is);
        sqlite3_bind_text(is, 1, e->d_name, -1, SQLITE_TRANSIENT);
        if (sqlite3_step(is) != SQLITE_ROW) {
            remove_job_dir(st->results, e->d_name);
            char p[4400];
            snprintf(p, sizeof p, "%s/%s", st->results, e->d_name);
            unlink(p); /* a stray file, not a folder */
            rec->orphans_removed++;
            continue;
        }
        /* a completed job's folder: only its outputs */
        char jd[4400];
        snprintf(jd, sizeof jd, "%s/%s", st->results, e->d_name);
        DIR *j = opendir(jd);
        struct dirent *f;
        while (j && (f = readdir(j)))
            if (f->d_name[0] == '.' && strcmp(f->d_name, ".") && strcmp(f->d_name, "..")) {
                char p[4700];
                snprintf(p, sizeof p, "%s/%s", jd, f->d_name);
                unlink(p);
                rec->orphans_removed++;
            }
        if (j)
            closedir(j);
    }
    sqlite3_finalize(is);
    closedir(d);
    fsync_path(st->results);
    return 0;
}

int ditd_jobstore_open(const char *dir, ditd_jobstore **out, ditd_jobstore_recovery *rec)
{
    ditd_jobstore *st = calloc(1, sizeof *st);
    ditd_jobstore_recovery dummy;
    char path[4200];
    int err;
    if (!rec)
        rec = &dummy;
    memset(rec, 0, sizeof *rec);
    if (!st)
        return DITD_ENOMEM;
    if (dir && dir[0]) {
        snprintf(st->dir, sizeof st->dir, "%s", dir);
        snprintf(st->results, sizeof st->results, "%s/results", dir);
        if ((mkdir(dir, 0755) && errno != EEXIST) || (mkdir(st->results, 0755) && errno != EEXIST)) {
            err = ditd_err_set(DITD_EIO, "--data-dir %s: %s", dir, strerror(errno));
            free(st);
            return err;
        }
        snprintf(path, sizeof path, "%s/jobs.db", dir);
    } else {
        snprintf(path, sizeof path, ":memory:");
    }
    if (sqlite3_open_v2(path, &st->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX,
                        NULL) != SQLITE_OK) {
        err = ditd_err_set(DITD_EIO, "--data-dir: cannot open %s: %s", path,
                           st->db ? sqlite3_errmsg(st->db) : "out of memory");
        goto fail;
    }
    sqlite3_busy_timeout(st->db, 5000);
    /* WAL: a reader never blocks the writer. synchronous=NORMAL: a commit
     * survives the process's death (SIGKILL); a power cut may lose the last
     * commits, which leaves a finished job in_progress (it runs again) and
     * its fsynced files orphans (recovery removes them): never a row that
     * says completed without its files */
    if ((err = exec(st, st->dir[0] ? "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;" : "")) ||
        (err = exec(st, schema)) || (err = exec(st, "PRAGMA user_version=1;")))
        goto fail;
    if ((err = recover(st, rec)))
        goto fail;
    *out = st;
    return 0;
fail:
    if (st->db)
        sqlite3_close(st->db);
    free(st);
    return err;
}

void ditd_jobstore_close(ditd_jobstore *st)
{
    if (!st)
        return;
    if (st->dir[0])
        exec(st, "PRAGMA wal_checkpoint(TRUNCATE);");
    sqlite3_close(st->db);
    free(st);
}

/* ------------------------------------------------------------------ */
/* rows                                                                */

int ditd_jobstore_insert(ditd_jobstore *st, ditd_jrow *r)
{
    unsigned char rnd[12];
    static const char hex[] = "0123456789abcdef";
    if (getrandom(rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd)
        return ditd_err_set(DITD_EIO, "getrandom: %s", strerror(errno));
    memcpy(r->id, "job_", 4);
    for (int i = 0; i < 12; i++) {
        r->id[4 + 2 * i] = hex[rnd[i] >> 4];
        r->id[5 + 2 * i] = hex[rnd[i] & 15];
    }
    r->id[28] = 0;
    sqlite3_stmt *q = prep(st, "INSERT INTO jobs(id, kind, owner, model, status, request, size,"
                               " created_at) VALUES(?, ?, ?, ?, 'queued', ?, ?, ?)");
    int rc;
    if (!q)
        return DITD_EIO;
    sqlite3_bind_text(q, 1, r->id, -1, SQLITE_STATIC);
    sqlite3_bind_text(q, 2, r->kind, -1, SQLITE_STATIC);
    sqlite3_bind_text(q, 3, r->owner, -1, SQLITE_STATIC);
    sqlite3_bind_text(q, 4, r->model, -1, SQLITE_STATIC);
    sqlite3_bind_text(q, 5, r->request ? r->request : "{}", -1, SQLITE_STATIC);
    sqlite3_bind_text(q, 6, r->size, -1, SQLITE_STATIC);
    sqlite3_bind_int64(q, 7, r->created_at);
    rc = sqlite3_step(q);
    sqlite3_finalize(q);
    r->status = DITD_JS_QUEUED;
    return rc == SQLITE_DONE ? 0 : db_err(st, "adding a job");
}

int ditd_jobstore_get(ditd_jobstore *st, const char *id, const char *owner, ditd_jrow *r,
                      int with_request)
{
    sqlite3_stmt *q = prep(st, "SELECT " COLS " FROM jobs WHERE id = ? AND (?2 IS NULL OR owner = ?2)");
    int rc;
    if (!q)
        return DITD_EIO;
    sqlite3_bind_text(q, 1, id, -1, SQLITE_STATIC);
    if (owner)
        sqlite3_bind_text(q, 2, owner, -1, SQLITE_STATIC);
    rc = sqlite3_step(q);
    if (rc == SQLITE_ROW)
        read_row(q, r, with_request);
    sqlite3_finalize(q);
    if (rc == SQLITE_ROW)
        return 0;
    return rc == SQLITE_DONE ? DITD_ENOENT : db_err(st, "reading a job");
}

int ditd_jobstore_list(ditd_jobstore *st, const char *owner, const char *kind, const char *after,
                       int limit, int desc, ditd_jrow *rows, int *n, int *more)
{
    long long from = desc ? INT64_MAX : 0;
    int rc;
    *n = 0;
    *more = 0;
    if (limit < 1)
        limit = 1;
    if (limit > DITD_JOBSTORE_MAX_LIST)
        limit = DITD_JOBSTORE_MAX_LIST;
    if (after) {
        sqlite3_stmt *q = prep(st, "SELECT seq FROM jobs WHERE id = ? AND (?2 IS NULL OR owner = ?2)"
                                   " AND (?3 IS NULL OR kind = ?3)");
        if (!q)
            return DITD_EIO;
        sqlite3_bind_text(q, 1, after, -1, SQLITE_STATIC);
        if (owner)
            sqlite3_bind_text(q, 2, owner, -1, SQLITE_STATIC);
        if (kind)
            sqlite3_bind_text(q, 3, kind, -1, SQLITE_STATIC);
        rc = sqlite3_step(q);
        if (rc == SQLITE_ROW)
            from = sqlite3_column_int64(q, 0);
        sqlite3_finalize(q);
        if (rc != SQLITE_ROW)
            return DITD_ENOENT;
    }
    sqlite3_stmt *q = prep(st, desc ? "SELECT " COLS " FROM jobs WHERE (?1 IS NULL OR owner = ?1)"
                                      " AND (?4 IS NULL OR kind = ?4)"
                                      " AND seq < ?2 ORDER BY seq DESC LIMIT ?3"
                                    : "SELECT " COLS " FROM jobs WHERE (?1 IS NULL OR owner = ?1)"
                                      " AND (?4 IS NULL OR kind = ?4)"
                                      " AND seq > ?2 ORDER BY seq ASC LIMIT ?3");
    if (!q)
        return DITD_EIO;
    if (owner)
        sqlite3_bind_text(q, 1, owner, -1, SQLITE_STATIC);
    if (kind)
        sqlite3_bind_text(q, 4, kind, -1, SQLITE_STATIC);
    sqlite3_bind_int64(q, 2, from);
    sqlite3_bind_int(q, 3, limit + 1);
    while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
        if (*n == limit) {
            *more = 1;
            break;
        }
        read_row(q, &rows[(*n)++], 0);
    }
    sqlite3_finalize(q);
    return rc == SQLITE_ROW || rc == SQLITE_DONE ? 0 : db_err(st, "listing jobs");
}

int ditd_jobstore_claim_next(ditd_jobstore *st, ditd_jrow *r)
{
    sqlite3_stmt *q = prep(st, "SELECT " COLS " FROM jobs WHERE status = 'queued' AND claimed = 0"
                               " ORDER BY seq LIMIT 1");
    int rc;
    if (!q)
        return DITD_EIO;
    rc = sqlite3_step(q);
    if (rc == SQLITE_ROW)
        read_row(q, r, 1);
    sqlite3_finalize(q);
    if (rc != SQLITE_ROW)
        return rc == SQLITE_DONE ? DITD_ENOENT : db_err(st, "reading the queue");
    if (!(q = prep(st, "UPDATE jobs SET claimed = 1 WHERE id = ?"))) {
        ditd_jrow_free(r);
        return DITD_EIO;
    }
    sqlite3_bind_text(q, 1, r->id, -1, SQLITE_STATIC);
    rc = sqlite3_step(q);
    sqlite3_finalize(q);
    if (rc != SQLITE_DONE) {
        ditd_jrow_free(r);
        return db_err(st, "claiming a job");
    }
    return 0;
}


static int run_update(ditd_jobstore *st, sqlite3_stmt *q, const char *what)
{
    int rc;
    if (!q)
        return DITD_EIO;
    rc = sqlite3_step(q);
    sqlite3_finalize(q);
    return rc == SQLITE_DONE ? 0 : db_err(st, what);
}

int ditd_jobstore_unclaim(ditd_jobstore *st, const char *id)
{
    sqlite3_stmt *q = prep(st, "UPDATE jobs SET claimed = 0 WHERE id = ?");
    if (q)
        sqlite3_bind_text(q, 1, id, -1, SQLITE_STATIC);
    return run_update(st, q, "giving a claim back");
}

int ditd_jobstore_set_running(ditd_jobstore *st, const char *id, long long now)
{
    sqlite3_stmt *q = prep(st, "UPDATE jobs SET status = 'in_progress',"
                               " started_at = CASE WHEN started_at = 0 THEN ? ELSE started_at END"
                               " WHERE id = ? AND status = 'queued'");
    if (q) {
        sqlite3_bind_int64(q, 1, now);
        sqlite3_bind_text(q, 2, id, -1, SQLITE_STATIC);
    }
    return run_update(st, q, "starting a job");
}

int ditd_jobstore_set_progress(ditd_jobstore *st, const char *id, int percent)
{
    sqlite3_stmt *q = prep(st, "UPDATE jobs SET progress = ? WHERE id = ? AND status = 'in_progress'");
    if (q) {
        sqlite3_bind_int(q, 1, percent);
        sqlite3_bind_text(q, 2, id, -1, SQLITE_STATIC);
    }
    return run_update(st, q, "a job's progress");
}

int ditd_jobstore_requeue(ditd_jobstore *st, const char *id)
{
    sqlite3_stmt *q = prep(st, "UPDATE jobs SET status = 'queued', claimed = 0, progress = 0,"
                               " started_at = 0 WHERE id = ? AND status IN ('queued', 'in_progress')");
    if (q)
        sqlite3_bind_text(q, 1, id, -1, SQLITE_STATIC);
    return run_update(st, q, "queueing a job again");
}

int ditd_jobstore_set_completed(ditd_jobstore *st, const char *id, int n_outputs, long long bytes,
                                long long now, long long expires_at)
{
    sqlite3_stmt *q = prep(st, "UPDATE jobs SET status = 'completed', claimed = 0, progress = 100,"
                               " n_outputs = ?, bytes = ?, completed_at = ?, expires_at = ?"
                               " WHERE id = ?");
    if (q) {
        sqlite3_bind_int(q, 1, n_outputs);
        sqlite3_bind_int64(q, 2, bytes);
        sqlite3_bind_int64(q, 3, now);
        sqlite3_bind_int64(q, 4, expires_at);
        sqlite3_bind_text(q, 5, id, -1, SQLITE_STATIC);
    }
    return run_update(st, q, "completing a job");
}

int ditd_jobstore_set_failed(ditd_jobstore *st, const char *id, const char *code,
                             const char *message, long long now, long long expires_at)
{
    sqlite3_stmt *q = prep(st, "UPDATE jobs SET status = 'failed', claimed = 0, n_outputs = 0,"
                               " bytes = 0, error_code = ?, error_message = ?,"
                               " completed_at = CASE WHEN ? > 0 THEN ? ELSE strftime('%s','now') END,"
                               " expires_at = ? WHERE id = ?");
    if (q) {
        sqlite3_bind_text(q, 1, code, -1, SQLITE_STATIC);
        sqlite3_bind_text(q, 2, message, -1, SQLITE_STATIC);
        sqlite3_bind_int64(q, 3, now);
        sqlite3_bind_int64(q, 4, now);
        sqlite3_bind_int64(q, 5, expires_at);
        sqlite3_bind_text(q, 6, id, -1, SQLITE_STATIC);
    }
    return run_update(st, q, "failing a job");
}

int ditd_jobstore_delete(ditd_jobstore *st, const char *id)
{
    sqlite3_stmt *q = prep(st, "DELETE FROM jobs WHERE id = ?");
    int err;
    if (q)
        sqlite3_bind_text(q, 1, id, -1, SQLITE_STATIC);
    /* the row first: a crash between the two leaves files recovery removes */
    if ((err = run_update(st, q, "deleting a job")))
        return err;
    ditd_jobstore_remove_files(st, id);
    return 0;
}

int ditd_jobstore_expire(ditd_jobstore *st, long long now, int *n)
{
    char ids[256][40];
    int k = 0, rc;
    *n = 0;
    sqlite3_stmt *q = prep(st, "SELECT id FROM jobs WHERE expires_at > 0 AND expires_at <= ?"
                               " AND status IN ('completed', 'failed') LIMIT 256");
    if (!q)
        return DITD_EIO;
    sqlite3_bind_int64(q, 1, now);
    while ((rc = sqlite3_step(q)) == SQLITE_ROW)
        copy(ids[k++], sizeof ids[0], sqlite3_column_text(q, 0));
    sqlite3_finalize(q);
    for (int i = 0; i < k; i++)
        if (!ditd_jobstore_delete(st, ids[i]))
            (*n)++;
    return 0;
}

int ditd_jobstore_expire_unset(ditd_jobstore *st, long long ttl_s, int *n)
{
    sqlite3_stmt *q = prep(st, "UPDATE jobs SET expires_at = completed_at + ? WHERE expires_at = 0"
                               " AND status IN ('completed', 'failed')");
    int err;
    if (q)
        sqlite3_bind_int64(q, 1, ttl_s);
    err = run_update(st, q, "setting expiry");
    if (!err && n)
        *n = sqlite3_changes(st->db);
    return err;
}

int ditd_jobstore_counts(ditd_jobstore *st, long long counts[DITD_JS_COUNT])
{
    sqlite3_stmt *q = prep(st, "SELECT status, count(*) FROM jobs GROUP BY status");
    memset(counts, 0, sizeof(long long) * DITD_JS_COUNT);
    if (!q)
        return DITD_EIO;
    while (sqlite3_step(q) == SQLITE_ROW)
        counts[status_of((const char *)sqlite3_column_text(q, 0))] += sqlite3_column_int64(q, 1);
    sqlite3_finalize(q);
    return 0;
}

long long ditd_jobstore_bytes(ditd_jobstore *st)
{
    long long total = 0;
    sqlite3_stmt *q = prep(st, "SELECT coalesce(sum(bytes), 0) FROM jobs");
    if (q && sqlite3_step(q) == SQLITE_ROW)
        total = sqlite3_column_int64(q, 0);
    sqlite3_finalize(q);
    if (st->dir[0]) {
        static const char *const files[] = {"jobs.db", "jobs.db-wal", "jobs.db-shm"};
        for (int i = 0; i < 3; i++) {
            char p[4200];
            struct stat sb;
            snprintf(p, sizeof p, "%s/%s", st->dir, files[i]);
            if (!stat(p, &sb))
                total += (long long)sb.st_size;
        }
    }
    return total;
}
