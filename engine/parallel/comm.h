/* The collectives interface: what the parallel plans need to move tensors
 * between the ranks of a worker group, behind one table of function
 * pointers per transport (as engine/backend/backend.h is per device).
 *
 *   MPI   (engine/parallel/comm_mpi.c)  host buffers: the CPU backend, CI, tests.
 *   NCCL  (engine/parallel/comm_nccl.c) device buffers, on the CUDA backend's
 *                              comm stream; bootstrapped over MPI
 *                              (ncclGetUniqueId + MPI_Bcast), sub-groups
 *                              with ncclCommSplit; non-blocking, with a
 *                              watchdog (a deadline, then ncclCommAbort).
 *   self  (engine/parallel/comm.c)      a group of one, no MPI: every collective is
 *                              a copy (the embedded single-process server).
 *
 * Model code calls ditd_comm_*() and never asks which transport it has: the
 * buffers are the backend's activation buffers, which is exactly what the
 * transport matching that backend expects.
 *
 * What it is not: no process management, no fault tolerance (fail-stop: an
 * MPI error aborts the job, a NCCL one returns DITD_ECOMM, see DESIGN.md), no tags or matching beyond the
 * paired send/recv the ring needs.
 *
 * Counts and displacements are in elements of the given dtype and are ints
 * (the MPI limit). Every rank of a communicator must call its collectives
 * in the same order with consistent counts; the plans guarantee it by
 * deriving every count from the batch they were given.
 *
 * Threads: a ditd_comm belongs to one thread (the group's worker thread).
 *
 * Statistics: every call through the public wrappers is counted per kind
 * (calls, logical bytes, wall milliseconds spent inside the call), for
 * `ditd bench`. "Logical bytes" follow the nccl-tests bus-bytes convention,
 * so they do not depend on the algorithm the library picks:
 *   alltoallv   bytes this rank sends to the other ranks (not to itself)
 *   allgatherv  this rank's block x (P - 1)
 *   allreduce   payload x 2 (P - 1) / P
 *   sendrecv    bytes sent; its time is the wait (the exposed part)
 *   bcast       payload on the root, 0 elsewhere
 */
#ifndef DITD_ENGINE_COMM_H
#define DITD_ENGINE_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "engine/core/tensor.h"

typedef enum ditd_coll {
    DITD_COLL_ALLTOALLV = 0,
    DITD_COLL_ALLGATHERV,
    DITD_COLL_ALLREDUCE,
    DITD_COLL_SENDRECV,
    DITD_COLL_BCAST,
    DITD_COLL_COUNT
} ditd_coll;

const char *ditd_coll_name(ditd_coll k);
int ditd_coll_from_str(const char *s, ditd_coll *out);

typedef struct ditd_comm_stat {
    uint64_t calls;
    uint64_t bytes;   /* logical bytes, see above */
    double ms;        /* wall time inside the calls */
} ditd_comm_stat;

/* An outstanding paired send/recv (ditd_comm_sendrecv_start). Opaque to
 * callers; lives on the caller's stack or in its plan. */
typedef struct ditd_comm_req {
    uint64_t bytes;
    int active;
    uint8_t impl[32];
} ditd_comm_req;

typedef struct ditd_comm ditd_comm;

/* One transport. impl is the transport's own state. All entries return 0 or
 * a DITD_E* code. */
typedef struct ditd_comm_ops {
    const char *name;
    int (*split)(ditd_comm *c, int color, int key, ditd_comm **out);
    void (*free)(ditd_comm *c);
    int (*alltoallv)(ditd_comm *c, ditd_dtype dt, const void *send, const int *scounts,
                     const int *sdispls, void *recv, const int *rcounts, const int *rdispls);
    int (*allgatherv)(ditd_comm *c, ditd_dtype dt, const void *send, void *recv,
                      const int *counts, const int *displs);
    int (*allreduce_sum)(ditd_comm *c, ditd_dtype dt, void *buf, size_t n);
    int (*sendrecv_start)(ditd_comm *c, ditd_dtype dt, const void *send, int scount, int dst,
                          void *recv, int rcount, int src, ditd_comm_req *req);
    int (*wait)(ditd_comm *c, ditd_comm_req *req);
    int (*bcast)(ditd_comm *c, void *buf, size_t bytes, int root);
    int (*barrier)(ditd_comm *c);
    /* optional (NULL: bcast): see ditd_comm_bcast_lazy */
    int (*bcast_lazy)(ditd_comm *c, void *buf, size_t bytes, int root, int nap_us);
} ditd_comm_ops;

struct ditd_comm {
    const ditd_comm_ops *ops;
    void *impl;
    int rank, size;
    ditd_comm_stat stats[DITD_COLL_COUNT];
};

/* ---- creation ---- */

/* A group of one without MPI: collectives are copies. Owned. */
int ditd_comm_self_new(ditd_comm **out);

/* 1 when this binary was built with MPI (DITD_HAVE_MPI). */
int ditd_comm_have_mpi(void);

/* Initializes MPI once per process (MPI_Init_thread, SERIALIZED: any one
 * thread at a time may call MPI, as `ditd serve`'s front-end hub thread
 * does) when it is not yet; later calls are no-ops. DITD_ECOMM when the
 * library gives a lower thread level; DITD_EUNSUPPORTED without MPI. It
 * asks for MULTIPLE, which the ring's progress thread needs (comm_mpi.c). */
int ditd_comm_mpi_init(int *argc, char ***argv);
/* Finalizes MPI when ditd_comm_mpi_init() initialized it (stopping the
 * progress thread first). */
void ditd_comm_mpi_finalize(void);
/* 1 when a paired send/recv (ditd_comm_sendrecv_start) is driven by the
 * progress thread between start and wait (MPI at MPI_THREAD_MULTIPLE and
 * DITD_MPI_PROGRESS not 0), starting it; 0 when the wait drives it. */
int ditd_comm_mpi_progress_thread(void);
/* Paired send/recv waits in this process so far, and how many of them found
 * the transfer already complete (hidden behind the caller's compute);
 * reset != 0 zeroes both after reading. For benchmarks. */
void ditd_comm_mpi_wait_stats(uint64_t *waits, uint64_t *ready, int reset);
/* 1 when the process looks started by mpirun/srun (the launcher's rank
 * variables are set): then the commands initialize MPI themselves. */
int ditd_comm_launched_by_mpi(void);

/* MPI_COMM_WORLD (duplicated) as an owned ditd_comm. Needs
 * ditd_comm_mpi_init() first. */
int ditd_comm_mpi_world(ditd_comm **out);

/* NCCL over the ranks of `parent` (an MPI comm): rank 0 makes the unique
 * id, MPI broadcasts it, each rank binds to device `device`. Needs the CUDA
 * backend open (ditd_backend_open). Tensors must be device buffers;
 * collectives run on the backend's communication stream, ordered against
 * its compute stream by events, and the call returns once they have
 * finished, watched against a deadline: a collective that fails
 * asynchronously or is not done in time aborts the communicator
 * (ncclCommAbort) and returns DITD_ECOMM (so does every later call on it).
 * Splits inherit the deadline. DITD_EUNSUPPORTED when built without NCCL. */
int ditd_comm_nccl_new(ditd_comm *parent, int device, ditd_comm **out);

#define DITD_NCCL_DEFAULT_TIMEOUT_MS 60000

/* As ditd_comm_nccl_new with the watchdog's deadline per call (timeout_ms
 * <= 0: DITD_NCCL_DEFAULT_TIMEOUT_MS; it bounds the initialization too);
 * device < 0: the CUDA backend's. Only in builds with NCCL
 * (DITD_HAVE_NCCL); ditd_mesh_use_nccl() is the way in for model code. */
int ditd_comm_nccl_new_opts(ditd_comm *parent, int device, int timeout_ms, ditd_comm **out);

/* Collective over c: ranks with the same color form a new communicator,
 * ordered by key (ties by rank in c). color < 0: this rank joins none and
 * *out is NULL. The child is owned and independent of c's lifetime. */
int ditd_comm_split(ditd_comm *c, int color, int key, ditd_comm **out);

void ditd_comm_free(ditd_comm *c);

static inline int ditd_comm_rank(const ditd_comm *c) { return c->rank; }
static inline int ditd_comm_size(const ditd_comm *c) { return c->size; }

/* ---- collectives ---- */

/* All-to-all with uneven counts: rank i sends scounts[j] elements from
 * send + sdispls[j] to rank j, which receives them at recv + rdispls[i]
 * (rcounts[i] elements). send and recv must not overlap. */
int ditd_comm_alltoallv(ditd_comm *c, ditd_dtype dt, const void *send, const int *scounts,
                        const int *sdispls, void *recv, const int *rcounts, const int *rdispls);

/* All-gather with uneven counts: rank i's counts[i] elements land at
 * recv + displs[i] on every rank. send == NULL is "in place": this rank's
 * block is already at recv + displs[rank]. */
int ditd_comm_allgatherv(ditd_comm *c, ditd_dtype dt, const void *send, void *recv,
                         const int *counts, const int *displs);

/* In-place sum over the ranks; every rank gets the same bits. */
int ditd_comm_allreduce_sum(ditd_comm *c, ditd_dtype dt, void *buf, size_t n);

/* Starts sending scount elements to dst and receiving rcount from src, and
 * returns at once; ditd_comm_wait() completes both. Neither buffer may be
 * touched (send: written; recv: read or written) until then. One request
 * in flight per comm at a time. */
int ditd_comm_sendrecv_start(ditd_comm *c, ditd_dtype dt, const void *send, int scount, int dst,
                             void *recv, int rcount, int src, ditd_comm_req *req);
int ditd_comm_wait(ditd_comm *c, ditd_comm_req *req);

/* bytes from root to every rank (host memory for MPI and self; for NCCL a
 * device buffer). */
int ditd_comm_bcast(ditd_comm *c, void *buf, size_t bytes, int root);

int ditd_comm_barrier(ditd_comm *c);

/* A broadcast of host memory for a message that may be long in coming (an
 * idle worker group waiting for its next batch): the waiting ranks check
 * for it every nap_us microseconds and sleep in between, instead of
 * spinning inside the library (MPI_Ibcast + MPI_Test). Every rank of c
 * must call this, not ditd_comm_bcast, for the same message: the two do
 * not match. Not counted in the statistics (its time is mostly waiting).
 * Transports without it (NCCL) use their plain broadcast. */
int ditd_comm_bcast_lazy(ditd_comm *c, void *buf, size_t bytes, int root, int nap_us);

/* ---- statistics ---- */

/* Borrowed; DITD_COLL_COUNT entries. */
const ditd_comm_stat *ditd_comm_stats(const ditd_comm *c);
void ditd_comm_stats_reset(ditd_comm *c);

/* For transports: a comm handle with the given table and state. */
ditd_comm *ditd__comm_alloc(const ditd_comm_ops *ops, void *impl, int rank, int size);

#endif
