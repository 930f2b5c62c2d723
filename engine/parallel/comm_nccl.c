/* The NCCL transport of engine/parallel/comm.h: device buffers, on the CUDA
 * backend's communication stream, with a watchdog.
 *
 * Ordering: every call makes the comm stream wait for what the compute
 * stream has queued (an event), queues the NCCL work on the comm stream,
 * and makes the compute stream wait for it (another event). A paired
 * send/recv queues the transfer at _start and joins the compute stream only
 * at _wait, so the attention of the block in hand, queued in between on the
 * compute stream, overlaps the transfer of the next block.
 *
 * Failure: communicators are non-blocking (ncclConfig_t.blocking = 0). A
 * call that NCCL answers "in progress" is polled (ncclCommGetAsyncError)
 * until it is queued, and then the call waits for the collective to finish
 * by polling its event (cudaEventQuery) and the communicator's asynchronous
 * error, against a deadline (timeout_ms, default 60 s). On an asynchronous
 * error or at the deadline the communicator is aborted (ncclCommAbort: its
 * kernels exit, so the streams drain) and the call returns DITD_ECOMM with
 * a message naming the collective; the comm then refuses every later call
 * with DITD_ECOMM. A rank whose peer died thus fails instead of hanging,
 * and the worker's fail-stop rule (DITD_ECOMM) takes the group down. The
 * abort takes the whole family with it: the bootstrapped comm and every
 * split of it (the mesh's axis comms), so that freeing the mesh does not
 * wait out the deadline in ncclCommFinalize once per comm.
 *
 * The price: each collective returns only once it has finished (one host
 * wait per collective, the p2p ring's at _wait, after the overlapped
 * attention is queued). Collectives are therefore never captured into a
 * CUDA graph (engine/models/dit/dit.c captures only forwards without collectives).
 *
 * Built with the CUDA backend when nccl.h and libnccl are found (NCCL >=
 * 2.14 for non-blocking init and ncclCommSplit); it compiles here and runs
 * on a GPU machine. bcast of host bytes (the group's control channel) is
 * not NCCL's business: the mesh keeps its group on MPI. */
#include "engine/core/clock.h"
#include "engine/parallel/comm.h"

#include <cuda_runtime.h>
#include <nccl.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/backend/backend_cuda.h"
#include "engine/core/error.h"

#if NCCL_VERSION_CODE < NCCL_VERSION(2, 14, 0)
#error "NCCL >= 2.14 is needed (non-blocking communicators, ncclCommSplit)"
#endif

typedef struct nccl_family nccl_family;

typedef struct nccl_state {
    ncclComm_t comm;       /* NULL once aborted */
    cudaStream_t stream;   /* the backend's comm stream (borrowed) */
    cudaStream_t compute;  /* the backend's compute stream (borrowed) */
    cudaEvent_t before, after;
    int timeout_ms;
    int aborted;
    nccl_family *fam;      /* the bootstrapped comm and all its splits */
    struct nccl_state *next, *prev;
} nccl_state;

/* A bootstrapped communicator and every split made from it (a mesh's axis
 * comms) fail together: once one is aborted (an asynchronous error, a
 * deadline), the others are aborted too. Otherwise each of them would,
 * when freed, wait out the full deadline in ncclCommFinalize (which waits
 * for every peer) after the peer that caused the abort is gone. One thread
 * owns them all (comm.h), so no lock. */
struct nccl_family {
    nccl_state *head;
    int aborted;
};

static void family_abort(nccl_family *f)
{
    if (!f || f->aborted)
        return;
    f->aborted = 1;
    for (nccl_state *m = f->head; m; m = m->next) {
        if (m->comm)
            ncclCommAbort(m->comm);
        m->comm = NULL;
        m->aborted = 1;
    }
}

static void family_join(nccl_family *f, nccl_state *s)
{
    s->fam = f;
    s->prev = NULL;
    s->next = f->head;
    if (f->head)
        f->head->prev = s;
    f->head = s;
    if (f->aborted && s->comm) { /* a split finished after a sibling failed */
        ncclCommAbort(s->comm);
        s->comm = NULL;
        s->aborted = 1;
    }
}

/* Unlinks s; frees the family with its last member. */
static void family_leave(nccl_state *s)
{
    nccl_family *f = s->fam;
    if (!f)
        return;
    if (s->prev)
        s->prev->next = s->next;
    else
        f->head = s->next;
    if (s->next)
        s->next->prev = s->prev;
    s->fam = NULL;
    if (!f->head)
        free(f);
}

/* Spins a little, then naps: a collective usually ends within
 * microseconds of the compute before it, but a stalled one must not burn
 * a core for a minute. */
static void backoff(unsigned *spins)
{
    if (++*spins < 2000) {
        sched_yield();
    } else {
        struct timespec ts = {0, 50 * 1000};
        nanosleep(&ts, NULL);
    }
}

static int cuda_check(cudaError_t rc, const char *what)
{
    if (rc == cudaSuccess)
        return 0;
    cudaGetLastError();
    return ditd_err_set(DITD_EDEVICE, "%s: %s", what, cudaGetErrorString(rc));
}

static int abort_comm(nccl_state *s)
{
    if (s->comm)
        ncclCommAbort(s->comm);
    s->comm = NULL;
    s->aborted = 1;
    family_abort(s->fam); /* and every other comm of the mesh */
    return DITD_ECOMM;
}

static int refused(const nccl_state *s, const char *what)
{
    (void)s;
    return ditd_err_set(DITD_ECOMM, "%s: the NCCL communicator was aborted after an earlier failure",
                        what);
}

/* Waits until a non-blocking call on comm is no longer in progress. 0, or
 * DITD_ECOMM (error or deadline; comm aborted when abort_s is given). */
static int settle_comm(ncclComm_t comm, ncclResult_t rc, int timeout_ms, nccl_state *abort_s,
                       const char *what)
{
    double t0 = ditd_now_ms();
    unsigned spins = 0;
    while (rc == ncclInProgress) {
        if (ditd_now_ms() - t0 > timeout_ms) {
            if (abort_s)
                abort_comm(abort_s);
            else if (comm)
                ncclCommAbort(comm);
            return ditd_err_set(DITD_ECOMM,
                                "%s: not done after %d ms (a peer rank stopped or never came?); "
                                "NCCL communicator aborted",
                                what, timeout_ms);
        }
        backoff(&spins);
        rc = ncclInProgress;
        if (comm && ncclCommGetAsyncError(comm, &rc) != ncclSuccess)
            rc = ncclInternalError;
    }
    if (rc == ncclSuccess)
        return 0;
    if (abort_s)
        abort_comm(abort_s);
    else if (comm)
        ncclCommAbort(comm);
    return ditd_err_set(DITD_ECOMM, "%s: %s; NCCL communicator aborted", what,
                        ncclGetErrorString(rc));
}

/* A call's return: queued (after polling an "in progress"), or failed. */
static int settle(nccl_state *s, ncclResult_t rc, const char *what)
{
    return settle_comm(s->comm, rc, s->timeout_ms, s, what);
}

/* Waits for ev (recorded on the comm stream after a collective) against
 * the deadline, watching the communicator's asynchronous error. While the
 * compute stream is being captured into a graph the wait is skipped (an
 * event of a capture cannot be queried); dit.c captures no collective. */
static int watch(nccl_state *s, cudaEvent_t ev, const char *what)
{
    enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    double t0 = ditd_now_ms();
    unsigned spins = 0;
    if (cudaStreamIsCapturing(s->compute, &cs) == cudaSuccess && cs != cudaStreamCaptureStatusNone)
        return 0;
    for (;;) {
        cudaError_t q = cudaEventQuery(ev);
        ncclResult_t st = ncclSuccess;
        if (q == cudaSuccess)
            return 0;
        if (q != cudaErrorNotReady) {
            cudaGetLastError();
            abort_comm(s);
            return ditd_err_set(DITD_ECOMM, "%s: %s; NCCL communicator aborted", what,
                                cudaGetErrorString(q));
        }
        if (ncclCommGetAsyncError(s->comm, &st) != ncclSuccess ||
            (st != ncclSuccess && st != ncclInProgress)) {
            abort_comm(s);
            return ditd_err_set(DITD_ECOMM, "%s: NCCL asynchronous error: %s; communicator aborted",
                                what, ncclGetErrorString(st));
        }
        if (ditd_now_ms() - t0 > s->timeout_ms) {
            abort_comm(s);
            return ditd_err_set(DITD_ECOMM,
                                "%s: not complete after %d ms (a peer rank stopped?); NCCL "
                                "communicator aborted",
                                what, s->timeout_ms);
        }
        backoff(&spins);
    }
}

static int nccl_type(ditd_dtype dt, ncclDataType_t *out)
{
    switch (dt) {
    case DITD_DTYPE_F32: *out = ncclFloat32; return 0;
    case DITD_DTYPE_F16: *out = ncclFloat16; return 0;
    case DITD_DTYPE_BF16: *out = ncclBfloat16; return 0;
    case DITD_DTYPE_I64: *out = ncclInt64; return 0;
    }
    return ditd_err_set(DITD_EUNSUPPORTED, "NCCL dtype %d", (int)dt);
}

/* comm stream waits for the compute stream's queued work */
static int enter(nccl_state *s, const char *what)
{
    if (s->aborted)
        return refused(s, what);
    int err = cuda_check(cudaEventRecord(s->before, s->compute), "cudaEventRecord");
    return err ? err : cuda_check(cudaStreamWaitEvent(s->stream, s->before, 0), "cudaStreamWaitEvent");
}

/* compute stream waits for the comm stream's queued work */
static int join(nccl_state *s)
{
    int err = cuda_check(cudaEventRecord(s->after, s->stream), "cudaEventRecord");
    return err ? err : cuda_check(cudaStreamWaitEvent(s->compute, s->after, 0), "cudaStreamWaitEvent");
}

/* join, then wait for the collective under the watchdog */
static int leave(nccl_state *s, const char *what)
{
    int err = join(s);
    return err ? err : watch(s, s->after, what);
}

static ncclConfig_t nb_config(void)
{
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    return cfg;
}

static int wrap(ncclComm_t comm, cudaStream_t stream, cudaStream_t compute, int timeout_ms,
                nccl_family *fam, ditd_comm **out);

static int n_split(ditd_comm *c, int color, int key, ditd_comm **out)
{
    nccl_state *s = c->impl;
    ncclConfig_t cfg = nb_config();
    ncclComm_t child = NULL;
    int err;
    if (s->aborted)
        return refused(s, "ncclCommSplit");
    ncclResult_t rc = ncclCommSplit(s->comm, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &child,
                                    &cfg);
    /* the parent's part of the split, then the child's initialization */
    if ((err = settle(s, rc, "ncclCommSplit")))
        return err;
    if (color < 0 || !child)
        return 0;
    if ((err = settle_comm(child, ncclInProgress, s->timeout_ms, NULL, "ncclCommSplit (child)"))) {
        abort_comm(s); /* fail-stop: the mesh will not come up; free it fast */
        return err;
    }
    return wrap(child, s->stream, s->compute, s->timeout_ms, s->fam, out);
}

static void n_free(ditd_comm *c)
{
    nccl_state *s = c->impl;
    if (s->comm) {
        /* flush, then destroy; a comm that cannot flush is aborted (and
         * with it the rest of its family, which then frees at once) */
        if (settle_comm(s->comm, ncclCommFinalize(s->comm), s->timeout_ms, s, "ncclCommFinalize") == 0)
            ncclCommDestroy(s->comm);
        s->comm = NULL;
    }
    family_leave(s);
    if (s->before)
        cudaEventDestroy(s->before);
    if (s->after)
        cudaEventDestroy(s->after);
    free(s);
}

static int n_alltoallv(ditd_comm *c, ditd_dtype dt, const void *send, const int *scounts,
                       const int *sdispls, void *recv, const int *rcounts, const int *rdispls)
{
    nccl_state *s = c->impl;
    ncclDataType_t t = ncclFloat32;
    size_t es = ditd_dtype_size(dt);
    int err = nccl_type(dt, &t);
    if (err || (err = enter(s, "all-to-all")))
        return err;
    ncclGroupStart();
    for (int j = 0; j < c->size; j++) {
        if (scounts[j])
            ncclSend((const char *)send + (size_t)sdispls[j] * es, (size_t)scounts[j], t, j,
                     s->comm, s->stream);
        if (rcounts[j])
            ncclRecv((char *)recv + (size_t)rdispls[j] * es, (size_t)rcounts[j], t, j, s->comm,
                     s->stream);
    }
    if ((err = settle(s, ncclGroupEnd(), "all-to-all")))
        return err;
    return leave(s, "all-to-all");
}

static int n_allgatherv(ditd_comm *c, ditd_dtype dt, const void *send, void *recv,
                        const int *counts, const int *displs)
{
    nccl_state *s = c->impl;
    ncclDataType_t t = ncclFloat32;
    size_t es = ditd_dtype_size(dt);
    int err = nccl_type(dt, &t);
    if (err || (err = enter(s, "all-gather")))
        return err;
    /* uneven counts: one broadcast per root, grouped */
    ncclGroupStart();
    for (int j = 0; j < c->size; j++) {
        char *dst = (char *)recv + (size_t)displs[j] * es;
        const void *src = j == c->rank && send ? send : dst;
        if (counts[j])
            ncclBroadcast(src, dst, (size_t)counts[j], t, j, s->comm, s->stream);
    }
    if ((err = settle(s, ncclGroupEnd(), "all-gather")))
        return err;
    return leave(s, "all-gather");
}

static int n_allreduce(ditd_comm *c, ditd_dtype dt, void *buf, size_t n)
{
    nccl_state *s = c->impl;
    ncclDataType_t t = ncclFloat32;
    int err = nccl_type(dt, &t);
    if (err || (err = enter(s, "ncclAllReduce")))
        return err;
    if ((err = settle(s, ncclAllReduce(buf, buf, n, t, ncclSum, s->comm, s->stream),
                      "ncclAllReduce")))
        return err;
    return leave(s, "ncclAllReduce");
}

static int n_sendrecv_start(ditd_comm *c, ditd_dtype dt, const void *send, int scount, int dst,
                            void *recv, int rcount, int src, ditd_comm_req *req)
{
    nccl_state *s = c->impl;
    ncclDataType_t t = ncclFloat32;
    (void)req;
    int err = nccl_type(dt, &t);
    if (err || (err = enter(s, "send/recv")))
        return err;
    ncclGroupStart();
    if (scount)
        ncclSend(send, (size_t)scount, t, dst, s->comm, s->stream);
    if (rcount)
        ncclRecv(recv, (size_t)rcount, t, src, s->comm, s->stream);
    /* queued; the wait (and the watchdog) is at n_wait */
    return settle(s, ncclGroupEnd(), "send/recv");
}

static int n_wait(ditd_comm *c, ditd_comm_req *req)
{
    nccl_state *s = c->impl;
    (void)req;
    if (s->aborted)
        return refused(s, "send/recv");
    return leave(s, "send/recv");
}

static int n_bcast(ditd_comm *c, void *buf, size_t bytes, int root)
{
    nccl_state *s = c->impl;
    int err = enter(s, "ncclBroadcast");
    if (err)
        return err;
    if ((err = settle(s, ncclBroadcast(buf, buf, bytes, ncclUint8, root, s->comm, s->stream),
                      "ncclBroadcast")))
        return err;
    return leave(s, "ncclBroadcast");
}

static int n_barrier(ditd_comm *c)
{
    nccl_state *s = c->impl;
    int err;
    if (s->aborted)
        return refused(s, "barrier");
    /* the work queued on the comm stream so far, under the watchdog */
    if ((err = cuda_check(cudaEventRecord(s->after, s->stream), "cudaEventRecord")))
        return err;
    return watch(s, s->after, "barrier");
}

static const ditd_comm_ops nccl_ops = {
    .name = "nccl",
    .split = n_split,
    .free = n_free,
    .alltoallv = n_alltoallv,
    .allgatherv = n_allgatherv,
    .allreduce_sum = n_allreduce,
    .sendrecv_start = n_sendrecv_start,
    .wait = n_wait,
    .bcast = n_bcast,
    .barrier = n_barrier,
};

/* Takes comm (an initialized one: destroyed on failure). fam: the family
 * of the comm it was split from, NULL for a bootstrapped one (a new family). */
static int wrap(ncclComm_t comm, cudaStream_t stream, cudaStream_t compute, int timeout_ms,
                nccl_family *fam, ditd_comm **out)
{
    int rank = 0, size = 0, err;
    nccl_state *s = calloc(1, sizeof *s);
    if (!s || (!fam && !(fam = calloc(1, sizeof *fam)))) {
        free(s);
        ncclCommAbort(comm);
        return ditd_err_set(DITD_ENOMEM, "comm");
    }
    s->comm = comm;
    family_join(fam, s);
    s->stream = stream;
    s->compute = compute;
    s->timeout_ms = timeout_ms;
    if ((err = cuda_check(cudaEventCreateWithFlags(&s->before, cudaEventDisableTiming),
                          "cudaEventCreate")) ||
        (err = cuda_check(cudaEventCreateWithFlags(&s->after, cudaEventDisableTiming),
                          "cudaEventCreate"))) {
        n_free(&(ditd_comm){.impl = s});
        return err;
    }
    ncclCommUserRank(comm, &rank);
    ncclCommCount(comm, &size);
    *out = ditd__comm_alloc(&nccl_ops, s, rank, size);
    if (!*out) {
        n_free(&(ditd_comm){.impl = s});
        return ditd_err_set(DITD_ENOMEM, "comm");
    }
    return 0;
}

int ditd_comm_nccl_new_opts(ditd_comm *parent, int device, int timeout_ms, ditd_comm **out)
{
    ncclUniqueId id;
    ncclComm_t comm = NULL;
    ncclConfig_t cfg = nb_config();
    cudaStream_t stream = (cudaStream_t)ditd_backend_cuda_comm_stream();
    cudaStream_t compute = (cudaStream_t)ditd_backend_cuda_compute_stream();
    int err;

    *out = NULL;
    if (timeout_ms <= 0)
        timeout_ms = DITD_NCCL_DEFAULT_TIMEOUT_MS;
    if (!stream || !compute)
        return ditd_err_set(DITD_EINVAL, "NCCL needs the CUDA backend open first (ditd_backend_open)");
    if (device < 0)
        device = ditd_backend_cuda_device();
    if ((err = cuda_check(cudaSetDevice(device), "cudaSetDevice")))
        return err;
    memset(&id, 0, sizeof id);
    if (ditd_comm_rank(parent) == 0 && ncclGetUniqueId(&id) != ncclSuccess)
        /* the others wait in the broadcast: send them the zero id, which
         * their init refuses, so every rank fails rather than hangs */
        err = ditd_err_set(DITD_ECOMM, "ncclGetUniqueId failed");
    /* the bootstrap: the id travels over the parent (MPI) */
    int berr = ditd_comm_bcast(parent, &id, sizeof id, 0);
    if (err || berr)
        return err ? err : berr;
    /* non-blocking: init returns "in progress"; poll it to the deadline */
    ncclResult_t rc = ncclCommInitRankConfig(&comm, ditd_comm_size(parent), id,
                                             ditd_comm_rank(parent), &cfg);
    if (rc != ncclSuccess && rc != ncclInProgress) {
        if (comm)
            ncclCommAbort(comm);
        return ditd_err_set(DITD_ECOMM, "ncclCommInitRankConfig: %s", ncclGetErrorString(rc));
    }
    if ((err = settle_comm(comm, rc, timeout_ms, NULL, "ncclCommInitRankConfig")))
        return err;
    /* collectives run on the backend's comm stream and wait on its compute
     * stream (events order the two), so a collective never races the op
     * that produced its input */
    return wrap(comm, stream, compute, timeout_ms, NULL, out);
}

int ditd_comm_nccl_new(ditd_comm *parent, int device, ditd_comm **out)
{
    return ditd_comm_nccl_new_opts(parent, device, 0, out);
}
