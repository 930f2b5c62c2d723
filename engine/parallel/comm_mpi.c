/* The MPI transport of engine/parallel/comm.h: host buffers, blocking collectives,
 * non-blocking paired send/recv for the p2p ring. Errors stay fatal (MPI's
 * default handler): a broken link takes the group down, as DESIGN.md's
 * fail-stop asks.
 *
 * Progress: Open MPI's shared-memory transport moves a large message only
 * while some thread is inside an MPI call on each side (the pipeline of
 * fragments advances in MPI_Test/MPI_Wait), so a paired send/recv posted
 * before the attention of the block in hand did not advance until the wait
 * after it, and the ring's overlap was partial. A progress thread (one per
 * process, started on first use, when MPI gives MPI_THREAD_MULTIPLE) owns
 * the outstanding send/recv between start and wait: it tests it with short
 * naps (DITD_MPI_PROGRESS_US, default 20 us) so the transfer runs while the
 * caller computes, and tests it without naps once the caller waits.
 * DITD_MPI_PROGRESS=0 turns it off (the wait then drives the transfer, as
 * before). docs/cpu.md. */
#include "engine/parallel/comm.h"

#include <limits.h>
#include <mpi.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/core/error.h"

typedef struct mpi_state {
    MPI_Comm comm;
} mpi_state;

static int we_initialized;
static int g_thread_multiple; /* MPI gave MPI_THREAD_MULTIPLE */

/* ---- the progress thread ---- */

static struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t thread;
    int started, disabled; /* disabled: off by environment or unavailable */
    int active;            /* the thread owns r[] */
    int hurry;             /* the caller waits: no naps */
    int done;              /* r[] completed; the caller collects */
    int quit;
    int err;               /* MPI_Testall's return code */
    int nap_us;
    MPI_Request r[2];
} g_prog = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};

static void *progress_main(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&g_prog.mu);
    for (;;) {
        while (!g_prog.active && !g_prog.quit)
            pthread_cond_wait(&g_prog.cv, &g_prog.mu);
        if (g_prog.quit)
            break;
        pthread_mutex_unlock(&g_prog.mu);
        int flag = 0;
        int rc = MPI_Testall(2, g_prog.r, &flag, MPI_STATUSES_IGNORE);
        pthread_mutex_lock(&g_prog.mu);
        if (flag || rc != MPI_SUCCESS) {
            g_prog.err = rc;
            g_prog.active = 0;
            g_prog.done = 1;
            pthread_cond_broadcast(&g_prog.cv);
            continue;
        }
        if (!g_prog.hurry) {
            struct timespec nap = {0, (long)g_prog.nap_us * 1000L};
            pthread_mutex_unlock(&g_prog.mu);
            nanosleep(&nap, NULL);
            pthread_mutex_lock(&g_prog.mu);
        }
    }
    pthread_mutex_unlock(&g_prog.mu);
    return NULL;
}

/* Whether the progress thread runs (starting it on first call). Caller
 * holds g_prog.mu. */
static int progress_ready(void)
{
    if (g_prog.started)
        return 1;
    if (g_prog.disabled)
        return 0;
    const char *off = getenv("DITD_MPI_PROGRESS");
    const char *us = getenv("DITD_MPI_PROGRESS_US");
    g_prog.nap_us = us && atoi(us) >= 0 && atoi(us) <= 100000 ? atoi(us) : 20;
    int level = 0;
    MPI_Query_thread(&level);
    if (level >= MPI_THREAD_MULTIPLE)
        g_thread_multiple = 1;
    if (!g_thread_multiple || (off && strcmp(off, "0") == 0) ||
        pthread_create(&g_prog.thread, NULL, progress_main, NULL) != 0) {
        g_prog.disabled = 1;
        return 0;
    }
    g_prog.started = 1;
    return 1;
}

static void progress_stop(void)
{
    pthread_mutex_lock(&g_prog.mu);
    int started = g_prog.started;
    g_prog.quit = 1;
    pthread_cond_broadcast(&g_prog.cv);
    pthread_mutex_unlock(&g_prog.mu);
    if (started)
        pthread_join(g_prog.thread, NULL);
    g_prog.started = g_prog.quit = g_prog.active = g_prog.done = 0;
}

/* How many waits found their transfer already complete (the overlap). */
static uint64_t g_waits, g_waits_ready;

void ditd_comm_mpi_wait_stats(uint64_t *waits, uint64_t *ready, int reset)
{
    pthread_mutex_lock(&g_prog.mu);
    if (waits)
        *waits = g_waits;
    if (ready)
        *ready = g_waits_ready;
    if (reset)
        g_waits = g_waits_ready = 0;
    pthread_mutex_unlock(&g_prog.mu);
}

int ditd_comm_mpi_progress_thread(void)
{
    pthread_mutex_lock(&g_prog.mu);
    int on = progress_ready();
    pthread_mutex_unlock(&g_prog.mu);
    return on;
}

static MPI_Datatype mpi_type(ditd_dtype dt)
{
    switch (dt) {
    case DITD_DTYPE_F32: return MPI_FLOAT;
    case DITD_DTYPE_F16:
    case DITD_DTYPE_BF16: return MPI_UINT16_T; /* moved, never reduced */
    case DITD_DTYPE_I64: return MPI_INT64_T;
    }
    return MPI_BYTE;
}

static MPI_Comm comm_of(const ditd_comm *c)
{
    return ((const mpi_state *)c->impl)->comm;
}

static int check(int rc, const char *what)
{
    if (rc == MPI_SUCCESS)
        return 0;
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    return ditd_err_set(DITD_ECOMM, "%s: %.*s", what, len, msg);
}

static int wrap(MPI_Comm comm, ditd_comm **out);

static int mpi_split(ditd_comm *c, int color, int key, ditd_comm **out)
{
    MPI_Comm child;
    int err = check(MPI_Comm_split(comm_of(c), color < 0 ? MPI_UNDEFINED : color, key, &child),
                    "MPI_Comm_split");
    if (err)
        return err;
    if (child == MPI_COMM_NULL)
        return 0;
    return wrap(child, out);
}

static void mpi_free(ditd_comm *c)
{
    mpi_state *s = c->impl;
    int fin = 0;
    MPI_Finalized(&fin);
    if (!fin)
        MPI_Comm_free(&s->comm);
    free(s);
}

static int mpi_alltoallv(ditd_comm *c, ditd_dtype dt, const void *send, const int *scounts,
                         const int *sdispls, void *recv, const int *rcounts, const int *rdispls)
{
    MPI_Datatype t = mpi_type(dt);
    return check(MPI_Alltoallv(send, scounts, sdispls, t, recv, rcounts, rdispls, t, comm_of(c)),
                 "MPI_Alltoallv");
}

static int mpi_allgatherv(ditd_comm *c, ditd_dtype dt, const void *send, void *recv,
                          const int *counts, const int *displs)
{
    MPI_Datatype t = mpi_type(dt);
    return check(MPI_Allgatherv(send ? send : MPI_IN_PLACE, send ? counts[c->rank] : 0, t, recv,
                                counts, displs, t, comm_of(c)),
                 "MPI_Allgatherv");
}

static int mpi_allreduce(ditd_comm *c, ditd_dtype dt, void *buf, size_t n)
{
    if (dt != DITD_DTYPE_F32)
        return ditd_err_set(DITD_EUNSUPPORTED, "MPI all-reduce of %s", ditd_dtype_name(dt));
    /* counts are ints: reduce in chunks past 2^31 elements */
    for (size_t at = 0; at < n;) {
        size_t k = n - at > (size_t)1 << 30 ? (size_t)1 << 30 : n - at;
        int err = check(MPI_Allreduce(MPI_IN_PLACE, (float *)buf + at, (int)k, MPI_FLOAT, MPI_SUM,
                                      comm_of(c)),
                        "MPI_Allreduce");
        if (err)
            return err;
        at += k;
    }
    return 0;
}

/* req->impl: the two requests, then whether the progress thread owns them. */
static int mpi_sendrecv_start(ditd_comm *c, ditd_dtype dt, const void *send, int scount, int dst,
                              void *recv, int rcount, int src, ditd_comm_req *req)
{
    MPI_Request r[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
    MPI_Datatype t = mpi_type(dt);
    int owned = 0;
    _Static_assert(sizeof r + sizeof owned <= sizeof req->impl,
                   "MPI_Request x 2 and a flag fit ditd_comm_req");
    int err = check(MPI_Irecv(recv, rcount, t, src, 0, comm_of(c), &r[0]), "MPI_Irecv");
    if (!err)
        err = check(MPI_Isend(send, scount, t, dst, 0, comm_of(c), &r[1]), "MPI_Isend");
    if (!err) {
        /* hand the pair to the progress thread when it is free (one
         * outstanding pair at a time: the ring's; any other waits as before) */
        pthread_mutex_lock(&g_prog.mu);
        if (progress_ready() && !g_prog.active && !g_prog.done) {
            memcpy(g_prog.r, r, sizeof r);
            g_prog.hurry = 0;
            g_prog.active = 1;
            owned = 1;
            pthread_cond_broadcast(&g_prog.cv);
        }
        pthread_mutex_unlock(&g_prog.mu);
    }
    memcpy(req->impl, r, sizeof r);
    memcpy(req->impl + sizeof r, &owned, sizeof owned);
    return err;
}

static int mpi_wait(ditd_comm *c, ditd_comm_req *req)
{
    MPI_Request r[2];
    int owned;
    (void)c;
    memcpy(r, req->impl, sizeof r);
    memcpy(&owned, req->impl + sizeof r, sizeof owned);
    if (owned) {
        pthread_mutex_lock(&g_prog.mu);
        g_waits++;
        g_waits_ready += (uint64_t)g_prog.done;
        g_prog.hurry = 1;
        while (!g_prog.done)
            pthread_cond_wait(&g_prog.cv, &g_prog.mu);
        g_prog.done = 0;
        int rc = g_prog.err;
        pthread_mutex_unlock(&g_prog.mu);
        return check(rc, "MPI_Testall (progress thread)");
    }
    /* one test first, only to count whether the transfer was done by now */
    int flag = 0, err = check(MPI_Testall(2, r, &flag, MPI_STATUSES_IGNORE), "MPI_Testall");
    pthread_mutex_lock(&g_prog.mu);
    g_waits++;
    g_waits_ready += (uint64_t)(flag != 0);
    pthread_mutex_unlock(&g_prog.mu);
    if (err || flag)
        return err;
    return check(MPI_Waitall(2, r, MPI_STATUSES_IGNORE), "MPI_Waitall");
}

static int mpi_bcast(ditd_comm *c, void *buf, size_t bytes, int root)
{
    for (size_t at = 0; at < bytes || (bytes == 0 && at == 0);) {
        size_t k = bytes - at > (size_t)1 << 30 ? (size_t)1 << 30 : bytes - at;
        int err = check(MPI_Bcast((char *)buf + at, (int)k, MPI_BYTE, root, comm_of(c)),
                        "MPI_Bcast");
        if (err || bytes == 0)
            return err;
        at += k;
    }
    return 0;
}

/* Posts the broadcast, then tests it with naps: an idle rank waiting here
 * costs no CPU (a blocking MPI_Bcast polls at full speed). */
static int mpi_bcast_lazy(ditd_comm *c, void *buf, size_t bytes, int root, int nap_us)
{
    MPI_Request r;
    int done = 0, err;
    struct timespec nap = {nap_us / 1000000, (long)(nap_us % 1000000) * 1000L};
    if (bytes > (size_t)INT_MAX)
        return ditd_err_set(DITD_EINVAL, "lazy broadcast of %zu bytes", bytes);
    if ((err = check(MPI_Ibcast(buf, (int)bytes, MPI_BYTE, root, comm_of(c), &r), "MPI_Ibcast")))
        return err;
    for (;;) {
        if ((err = check(MPI_Test(&r, &done, MPI_STATUS_IGNORE), "MPI_Test")) || done)
            return err;
        nanosleep(&nap, NULL);
    }
}

static int mpi_barrier(ditd_comm *c)
{
    return check(MPI_Barrier(comm_of(c)), "MPI_Barrier");
}

static const ditd_comm_ops mpi_ops = {
    .name = "mpi",
    .split = mpi_split,
    .free = mpi_free,
    .alltoallv = mpi_alltoallv,
    .allgatherv = mpi_allgatherv,
    .allreduce_sum = mpi_allreduce,
    .sendrecv_start = mpi_sendrecv_start,
    .wait = mpi_wait,
    .bcast = mpi_bcast,
    .barrier = mpi_barrier,
    .bcast_lazy = mpi_bcast_lazy,
};

static int wrap(MPI_Comm comm, ditd_comm **out)
{
    int rank, size;
    mpi_state *s = malloc(sizeof *s);
    if (!s) {
        MPI_Comm_free(&comm);
        return ditd_err_set(DITD_ENOMEM, "comm");
    }
    s->comm = comm;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    *out = ditd__comm_alloc(&mpi_ops, s, rank, size);
    if (!*out) {
        MPI_Comm_free(&comm);
        free(s);
        return ditd_err_set(DITD_ENOMEM, "comm");
    }
    return 0;
}

int ditd_comm_have_mpi(void)
{
    return 1;
}

int ditd_comm_mpi_init(int *argc, char ***argv)
{
    int inited = 0, provided;
    MPI_Initialized(&inited);
    if (inited)
        return 0;
    /* MULTIPLE where MPI gives it (the progress thread tests a send/recv
     * while this thread may call MPI for something else); SERIALIZED is
     * enough without the progress thread */
    if (MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS)
        return ditd_err_set(DITD_ECOMM, "MPI_Init_thread failed");
    we_initialized = 1;
    g_thread_multiple = provided >= MPI_THREAD_MULTIPLE;
    if (provided < MPI_THREAD_SERIALIZED)
        return ditd_err_set(DITD_ECOMM, "MPI gives thread level %d, ditd needs SERIALIZED (%d)",
                            provided, MPI_THREAD_SERIALIZED);
    return 0;
}

void ditd_comm_mpi_finalize(void)
{
    int fin = 0;
    progress_stop();
    MPI_Finalized(&fin);
    if (we_initialized && !fin)
        MPI_Finalize();
    we_initialized = 0;
}

int ditd_comm_launched_by_mpi(void)
{
    static const char *vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK",
                                 "MPI_LOCALNRANKS"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
        if (getenv(vars[i]))
            return 1;
    return 0;
}

int ditd_comm_mpi_world(ditd_comm **out)
{
    MPI_Comm dup;
    int inited = 0;
    *out = NULL;
    MPI_Initialized(&inited);
    if (!inited)
        return ditd_err_set(DITD_EINVAL, "MPI is not initialized (ditd_comm_mpi_init)");
    int err = check(MPI_Comm_dup(MPI_COMM_WORLD, &dup), "MPI_Comm_dup");
    return err ? err : wrap(dup, out);
}
