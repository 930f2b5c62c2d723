/* The collectives interface: public wrappers (statistics, argument checks)
 * and the "self" transport, a group of one. The MPI and NCCL transports
 * live in comm_mpi.c and comm_nccl.c. */
#include "engine/core/clock.h"
#include "engine/parallel/comm.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ditd_build_config.h"
#include "engine/core/error.h"

static const char *const coll_names[DITD_COLL_COUNT] = {
    [DITD_COLL_ALLTOALLV] = "all-to-all",
    [DITD_COLL_ALLGATHERV] = "all-gather",
    [DITD_COLL_ALLREDUCE] = "all-reduce",
    [DITD_COLL_SENDRECV] = "send/recv",
    [DITD_COLL_BCAST] = "broadcast",
};

const char *ditd_coll_name(ditd_coll k)
{
    return (unsigned)k < DITD_COLL_COUNT ? coll_names[k] : "unknown";
}

int ditd_coll_from_str(const char *s, ditd_coll *out)
{
    for (int k = 0; k < DITD_COLL_COUNT; k++) {
        if (strcmp(s, coll_names[k]) == 0) {
            *out = (ditd_coll)k;
            return 0;
        }
    }
    return ditd_err_set(DITD_EINVAL, "unknown collective \"%s\"", s);
}

static void account(ditd_comm *c, ditd_coll k, uint64_t bytes, double t0)
{
    c->stats[k].calls++;
    c->stats[k].bytes += bytes;
    c->stats[k].ms += ditd_now_ms() - t0;
}

ditd_comm *ditd__comm_alloc(const ditd_comm_ops *ops, void *impl, int rank, int size)
{
    ditd_comm *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->ops = ops;
    c->impl = impl;
    c->rank = rank;
    c->size = size;
    return c;
}

int ditd_comm_split(ditd_comm *c, int color, int key, ditd_comm **out)
{
    *out = NULL;
    return c->ops->split(c, color, key, out);
}

void ditd_comm_free(ditd_comm *c)
{
    if (!c)
        return;
    c->ops->free(c);
    free(c);
}

int ditd_comm_alltoallv(ditd_comm *c, ditd_dtype dt, const void *send, const int *scounts,
                        const int *sdispls, void *recv, const int *rcounts, const int *rdispls)
{
    double t0 = ditd_now_ms();
    uint64_t bytes = 0;
    for (int j = 0; j < c->size; j++)
        if (j != c->rank)
            bytes += (uint64_t)scounts[j] * ditd_dtype_size(dt);
    int err = c->ops->alltoallv(c, dt, send, scounts, sdispls, recv, rcounts, rdispls);
    account(c, DITD_COLL_ALLTOALLV, bytes, t0);
    return err;
}

int ditd_comm_allgatherv(ditd_comm *c, ditd_dtype dt, const void *send, void *recv,
                         const int *counts, const int *displs)
{
    double t0 = ditd_now_ms();
    uint64_t bytes = (uint64_t)counts[c->rank] * ditd_dtype_size(dt) * (uint64_t)(c->size - 1);
    int err = c->ops->allgatherv(c, dt, send, recv, counts, displs);
    account(c, DITD_COLL_ALLGATHERV, bytes, t0);
    return err;
}

int ditd_comm_allreduce_sum(ditd_comm *c, ditd_dtype dt, void *buf, size_t n)
{
    double t0 = ditd_now_ms();
    uint64_t bytes = (uint64_t)(n * ditd_dtype_size(dt)) * 2u * (uint64_t)(c->size - 1) /
                     (uint64_t)c->size;
    int err = c->ops->allreduce_sum(c, dt, buf, n);
    account(c, DITD_COLL_ALLREDUCE, bytes, t0);
    return err;
}

int ditd_comm_sendrecv_start(ditd_comm *c, ditd_dtype dt, const void *send, int scount, int dst,
                             void *recv, int rcount, int src, ditd_comm_req *req)
{
    memset(req, 0, sizeof *req);
    if (dst < 0 || dst >= c->size || src < 0 || src >= c->size || scount < 0 || rcount < 0)
        return ditd_err_set(DITD_EINVAL, "send/recv: dst %d src %d counts %d %d on %d ranks", dst,
                            src, scount, rcount, c->size);
    req->bytes = (uint64_t)scount * ditd_dtype_size(dt);
    req->active = 1;
    return c->ops->sendrecv_start(c, dt, send, scount, dst, recv, rcount, src, req);
}

int ditd_comm_wait(ditd_comm *c, ditd_comm_req *req)
{
    if (!req->active)
        return 0;
    double t0 = ditd_now_ms();
    int err = c->ops->wait(c, req);
    req->active = 0;
    account(c, DITD_COLL_SENDRECV, req->bytes, t0);
    return err;
}

int ditd_comm_bcast(ditd_comm *c, void *buf, size_t bytes, int root)
{
    if (root < 0 || root >= c->size)
        return ditd_err_set(DITD_EINVAL, "broadcast from rank %d of %d", root, c->size);
    double t0 = ditd_now_ms();
    int err = c->ops->bcast(c, buf, bytes, root);
    account(c, DITD_COLL_BCAST, c->rank == root && c->size > 1 ? bytes : 0, t0);
    return err;
}

int ditd_comm_bcast_lazy(ditd_comm *c, void *buf, size_t bytes, int root, int nap_us)
{
    if (root < 0 || root >= c->size)
        return ditd_err_set(DITD_EINVAL, "broadcast from rank %d of %d", root, c->size);
    if (!c->ops->bcast_lazy)
        return c->ops->bcast(c, buf, bytes, root);
    return c->ops->bcast_lazy(c, buf, bytes, root, nap_us > 0 ? nap_us : 1);
}

int ditd_comm_barrier(ditd_comm *c)
{
    return c->ops->barrier(c);
}

const ditd_comm_stat *ditd_comm_stats(const ditd_comm *c)
{
    return c->stats;
}

void ditd_comm_stats_reset(ditd_comm *c)
{
    memset(c->stats, 0, sizeof c->stats);
}

/* ---- self: a group of one ---- */

static int self_split(ditd_comm *c, int color, int key, ditd_comm **out)
{
    (void)c;
    (void)key;
    if (color < 0)
        return 0;
    return ditd_comm_self_new(out);
}

static void self_free(ditd_comm *c)
{
    (void)c;
}

static int self_alltoallv(ditd_comm *c, ditd_dtype dt, const void *send, const int *scounts,
                          const int *sdispls, void *recv, const int *rcounts, const int *rdispls)
{
    size_t es = ditd_dtype_size(dt);
    (void)c;
    if (scounts[0] != rcounts[0])
        return ditd_err_set(DITD_EINVAL, "all-to-all on one rank: send %d, recv %d", scounts[0],
                            rcounts[0]);
    memcpy((char *)recv + (size_t)rdispls[0] * es, (const char *)send + (size_t)sdispls[0] * es,
           (size_t)scounts[0] * es);
    return 0;
}

static int self_allgatherv(ditd_comm *c, ditd_dtype dt, const void *send, void *recv,
                           const int *counts, const int *displs)
{
    size_t es = ditd_dtype_size(dt);
    (void)c;
    if (send)
        memmove((char *)recv + (size_t)displs[0] * es, send, (size_t)counts[0] * es);
    return 0;
}

static int self_allreduce(ditd_comm *c, ditd_dtype dt, void *buf, size_t n)
{
    (void)c;
    (void)dt;
    (void)buf;
    (void)n;
    return 0;
}

static int self_sendrecv_start(ditd_comm *c, ditd_dtype dt, const void *send, int scount,
                               int dst, void *recv, int rcount, int src, ditd_comm_req *req)
{
    (void)c;
    (void)dst;
    (void)src;
    (void)req;
    if (scount != rcount)
        return ditd_err_set(DITD_EINVAL, "send/recv to self: send %d, recv %d", scount, rcount);
    memmove(recv, send, (size_t)scount * ditd_dtype_size(dt));
    return 0;
}

static int self_wait(ditd_comm *c, ditd_comm_req *req)
{
    (void)c;
    (void)req;
    return 0;
}

static int self_bcast(ditd_comm *c, void *buf, size_t bytes, int root)
{
    (void)c;
    (void)buf;
    (void)bytes;
    (void)root;
    return 0;
}

static int self_barrier(ditd_comm *c)
{
    (void)c;
    return 0;
}

static const ditd_comm_ops self_ops = {
    .name = "self",
    .split = self_split,
    .free = self_free,
    .alltoallv = self_alltoallv,
    .allgatherv = self_allgatherv,
    .allreduce_sum = self_allreduce,
    .sendrecv_start = self_sendrecv_start,
    .wait = self_wait,
    .bcast = self_bcast,
    .barrier = self_barrier,
};

int ditd_comm_self_new(ditd_comm **out)
{
    *out = ditd__comm_alloc(&self_ops, NULL, 0, 1);
    return *out ? 0 : ditd_err_set(DITD_ENOMEM, "comm");
}

#if !DITD_HAVE_MPI
int ditd_comm_have_mpi(void)
{
    return 0;
}

int ditd_comm_mpi_init(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    return ditd_err_set(DITD_EUNSUPPORTED, "this ditd was built without MPI");
}

void ditd_comm_mpi_finalize(void)
{
}

int ditd_comm_mpi_progress_thread(void)
{
    return 0;
}

void ditd_comm_mpi_wait_stats(uint64_t *waits, uint64_t *ready, int reset)
{
    (void)reset;
    if (waits)
        *waits = 0;
    if (ready)
        *ready = 0;
}

int ditd_comm_launched_by_mpi(void)
{
    return 0;
}

int ditd_comm_mpi_world(ditd_comm **out)
{
    *out = NULL;
    return ditd_err_set(DITD_EUNSUPPORTED, "this ditd was built without MPI");
}
#endif

#if !DITD_HAVE_NCCL
int ditd_comm_nccl_new(ditd_comm *parent, int device, ditd_comm **out)
{
    (void)parent;
    (void)device;
    *out = NULL;
    return ditd_err_set(DITD_EUNSUPPORTED, "this ditd was built without NCCL");
}
#endif
