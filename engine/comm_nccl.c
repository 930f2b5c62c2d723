/* The NCCL transport of engine/comm.h: device buffers, a stream of its own.
 *
 * Ordering without host syncs: every call makes the comm stream wait for
 * what the compute stream has queued (an event), queues the NCCL work, and
 * makes the compute stream wait for it (another event). A paired send/recv
 * queues the transfer at _start and joins the compute stream only at _wait,
 * so the attention of the block in hand, queued in between on the compute
 * stream, overlaps the transfer of the next block.
 *
 * Built with the CUDA backend when nccl.h and libnccl are found; it
 * compiles here and runs on a GPU machine (tests/gpu). bcast of host bytes
 * (the group's control channel) is not NCCL's business: the mesh keeps its
 * group on MPI. */
#include "engine/comm.h"

#include <cuda_runtime.h>
#include <nccl.h>
#include <stdlib.h>
#include <string.h>

#include "engine/backend_cuda.h"
#include "engine/error.h"

typedef struct nccl_state {
    ncclComm_t comm;
    cudaStream_t stream;   /* the comm's own */
    cudaStream_t compute;  /* the backend's compute stream (borrowed; 0 = legacy) */
    cudaEvent_t before, after;
} nccl_state;

static int nccl_check(ncclResult_t rc, const char *what)
{
    if (rc == ncclSuccess)
        return 0;
    return ditd_err_set(DITD_ECOMM, "%s: %s", what, ncclGetErrorString(rc));
}

static int cuda_check(cudaError_t rc, const char *what)
{
    if (rc == cudaSuccess)
        return 0;
    return ditd_err_set(DITD_EDEVICE, "%s: %s", what, cudaGetErrorString(rc));
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
static int enter(nccl_state *s)
{
    int err = cuda_check(cudaEventRecord(s->before, s->compute), "cudaEventRecord");
    return err ? err : cuda_check(cudaStreamWaitEvent(s->stream, s->before, 0), "cudaStreamWaitEvent");
}

/* compute stream waits for the comm stream's queued work */
static int leave(nccl_state *s)
{
    int err = cuda_check(cudaEventRecord(s->after, s->stream), "cudaEventRecord");
    return err ? err : cuda_check(cudaStreamWaitEvent(s->compute, s->after, 0), "cudaStreamWaitEvent");
}

static int wrap(ncclComm_t comm, cudaStream_t compute, ditd_comm **out);

static int n_split(ditd_comm *c, int color, int key, ditd_comm **out)
{
    nccl_state *s = c->impl;
    ncclComm_t child = NULL;
    int err = nccl_check(ncclCommSplit(s->comm, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key,
                                       &child, NULL),
                         "ncclCommSplit");
    if (err || color < 0 || !child)
        return err;
    return wrap(child, s->compute, out);
}

static void n_free(ditd_comm *c)
{
    nccl_state *s = c->impl;
    ncclCommDestroy(s->comm);
    cudaEventDestroy(s->before);
    cudaEventDestroy(s->after);
    cudaStreamDestroy(s->stream);
    free(s);
}

static int n_alltoallv(ditd_comm *c, ditd_dtype dt, const void *send, const int *scounts,
                       const int *sdispls, void *recv, const int *rcounts, const int *rdispls)
{
    nccl_state *s = c->impl;
    ncclDataType_t t = ncclFloat32;
    size_t es = ditd_dtype_size(dt);
    int err = nccl_type(dt, &t);
    if (err || (err = enter(s)))
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
    if ((err = nccl_check(ncclGroupEnd(), "all-to-all")))
        return err;
    return leave(s);
}

static int n_allgatherv(ditd_comm *c, ditd_dtype dt, const void *send, void *recv,
                        const int *counts, const int *displs)
{
    nccl_state *s = c->impl;
    ncclDataType_t t = ncclFloat32;
    size_t es = ditd_dtype_size(dt);
    int err = nccl_type(dt, &t);
    if (err || (err = enter(s)))
        return err;
    /* uneven counts: one broadcast per root, grouped */
    ncclGroupStart();
    for (int j = 0; j < c->size; j++) {
        char *dst = (char *)recv + (size_t)displs[j] * es;
        const void *src = j == c->rank && send ? send : dst;
        if (counts[j])
            ncclBroadcast(src, dst, (size_t)counts[j], t, j, s->comm, s->stream);
    }
    if ((err = nccl_check(ncclGroupEnd(), "all-gather")))
        return err;
    return leave(s);
}

static int n_allreduce(ditd_comm *c, ditd_dtype dt, void *buf, size_t n)
{
    nccl_state *s = c->impl;
    ncclDataType_t t = ncclFloat32;
    int err = nccl_type(dt, &t);
    if (err || (err = enter(s)))
        return err;
    if ((err = nccl_check(ncclAllReduce(buf, buf, n, t, ncclSum, s->comm, s->stream),
                          "ncclAllReduce")))
        return err;
    return leave(s);
}

static int n_sendrecv_start(ditd_comm *c, ditd_dtype dt, const void *send, int scount, int dst,
                            void *recv, int rcount, int src, ditd_comm_req *req)
{
    nccl_state *s = c->impl;
    ncclDataType_t t = ncclFloat32;
    (void)req;
    int err = nccl_type(dt, &t);
    if (err || (err = enter(s)))
        return err;
    ncclGroupStart();
    if (scount)
        ncclSend(send, (size_t)scount, t, dst, s->comm, s->stream);
    if (rcount)
        ncclRecv(recv, (size_t)rcount, t, src, s->comm, s->stream);
    return nccl_check(ncclGroupEnd(), "send/recv");
}

static int n_wait(ditd_comm *c, ditd_comm_req *req)
{
    (void)req;
    return leave(c->impl);
}

static int n_bcast(ditd_comm *c, void *buf, size_t bytes, int root)
{
    nccl_state *s = c->impl;
    int err = enter(s);
    if (err)
        return err;
    if ((err = nccl_check(ncclBroadcast(buf, buf, bytes, ncclUint8, root, s->comm, s->stream),
                          "ncclBroadcast")))
        return err;
    return leave(s);
}

static int n_barrier(ditd_comm *c)
{
    nccl_state *s = c->impl;
    return cuda_check(cudaStreamSynchronize(s->stream), "cudaStreamSynchronize");
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

static int wrap(ncclComm_t comm, cudaStream_t compute, ditd_comm **out)
{
    int rank = 0, size = 0, err;
    nccl_state *s = calloc(1, sizeof *s);
    if (!s) {
        ncclCommDestroy(comm);
        return ditd_err_set(DITD_ENOMEM, "comm");
    }
    s->comm = comm;
    s->compute = compute;
    if ((err = cuda_check(cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking),
                          "cudaStreamCreate")) ||
        (err = cuda_check(cudaEventCreateWithFlags(&s->before, cudaEventDisableTiming),
                          "cudaEventCreate")) ||
        (err = cuda_check(cudaEventCreateWithFlags(&s->after, cudaEventDisableTiming),
                          "cudaEventCreate"))) {
        ncclCommDestroy(comm);
        free(s);
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

int ditd_comm_nccl_new(ditd_comm *parent, int device, ditd_comm **out)
{
    ncclUniqueId id;
    ncclComm_t comm;
    int err;

    *out = NULL;
    if ((err = cuda_check(cudaSetDevice(device), "cudaSetDevice")))
        return err;
    if (ditd_comm_rank(parent) == 0 && (err = nccl_check(ncclGetUniqueId(&id), "ncclGetUniqueId")))
        return err;
    /* the bootstrap: the id travels over the parent (MPI) */
    if ((err = ditd_comm_bcast(parent, &id, sizeof id, 0)))
        return err;
    if ((err = nccl_check(ncclCommInitRank(&comm, ditd_comm_size(parent), id,
                                           ditd_comm_rank(parent)),
                          "ncclCommInitRank")))
        return err;
    /* collectives wait on the backend's compute stream (events order the
     * two), so a collective never races the op that produced its input */
    return wrap(comm, (cudaStream_t)ditd_backend_cuda_compute_stream(), out);
}
