/* The worker loop of a replica, and the transports that carry its messages.
 *
 * A worker takes Batch messages (proto/ditd.proto) from a transport, runs
 * them through the pipeline, and sends back Progress after every step (with
 * previews for samples that asked for partial images), one Result per batch
 * (raw 8-bit pixels per image, from ditd_pipeline_to_pixels) or an Error.
 * Cancel messages clear a sample's active flag at the next step boundary;
 * Shutdown ends the loop; a Heartbeat goes out every heartbeat_ms, also in
 * the middle of a batch, so liveness does not depend on the HTTP thread.
 * The last message of a worker is a Heartbeat with ready = false ("bye").
 *
 * A replica is a worker group (engine/parallel/mesh.h): G ranks that run each batch
 * together, SPMD. Its leader (group rank 0) alone has a transport: it takes
 * the front-end's messages, broadcasts each batch (the packed Envelope as it
 * came) and the end of the loop to its group, runs the step callback
 * (progress, cancels as active flags, shutdown as the stop flag, which the
 * pipeline broadcasts after every step) and sends the results. The other
 * ranks (followers) wait for the leader's word with naps, not spinning
 * (ditd_mesh_bcast_lazy), and run what it broadcasts. A replica of one
 * rank has no mesh.
 *
 * Two transports carry the same packed Envelope bytes:
 *  - the in-process hub (single-process `ditd serve`): the front-end and
 *    each replica thread share a pair of queues; a worker's messages wake the
 *    front-end through the hub's wake callback (the server passes one that
 *    calls uv_async_send), so this module knows nothing of libuv;
 *  - MPI: rank 0 is the front-end; replica r is the G ranks 1 + r G ..
 *    (r + 1) G, its leader 1 + r G. On rank 0 the hub owns a thread that is
 *    the only caller of MPI while the hub lives (MPI_THREAD_SERIALIZED); on
 *    a worker rank the worker loop's thread is the only one.
 *
 * What it is not: the batcher or the router (server/), the pipeline
 * (engine/pipeline/pipeline.h), or MPI start-up (engine/parallel/comm.h: ditd_comm_mpi_init).
 */
#ifndef DITD_ENGINE_WORKER_H
#define DITD_ENGINE_WORKER_H

#include <stddef.h>
#include <stdint.h>

#include "engine/parallel/mesh.h"

#define DITD_WORKER_MAX_BATCH 256

/* The worker's end of a transport. */
typedef struct ditd_transport ditd_transport;
struct ditd_transport {
    /* Sends one packed Envelope to the front-end; buf is borrowed. */
    int (*send)(ditd_transport *t, const uint8_t *buf, size_t len);
    /* Receives one packed Envelope from the front-end: *buf is owned
     * (free()). Waits at most timeout_ms (0: do not wait). Returns 0, or
     * DITD_ETIMEDOUT when nothing came, or DITD_ECOMM. */
    int (*recv)(ditd_transport *t, uint8_t **buf, size_t *len, int timeout_ms);
};

typedef struct ditd_worker_config {
    const char *model_dir;  /* Diffusers folder; borrowed for the call */
    ditd_mesh *mesh;        /* the replica's group, borrowed; NULL: one rank; on
                             * cuda its axis comms become NCCL ones here */
    int replica;            /* 0..dp-1, put in every message */
    int max_batch;          /* samples per batch, 1..DITD_WORKER_MAX_BATCH */
    int threads;            /* CPU threads, <= 0: the runtime's default */
    int heartbeat_ms;       /* > 0 */
    int device;             /* ditd_device (0: the CPU); CUDA: the local rank's GPU
                             * (ditd_backend_open), a NCCL mesh for a group */
    int comm_timeout_ms;    /* NCCL watchdog per collective; <= 0: the default */
    int weight_dtype;       /* ditd_dtype of CPU weights (F32, BF16); -1: auto, by
                             * the checkpoint (ditd_backend_for_weights) */
} ditd_worker_config;

/* Loads the model and serves batches until a Shutdown message or a
 * failure. t is the leader's transport, borrowed; NULL on the other ranks
 * of a group. In a group every rank calls this (collective over the mesh).
 * Returns:
 *   0 after Shutdown (on every rank of the group: the leader broadcasts it);
 *   DITD_ECOMM when this rank lost its transport or its group and cannot
 *     stay in step: fail-stop, the caller ends the process with an error
 *     (under MPI without MPI_Finalize, so mpirun takes the job down);
 *   another code when the replica did not start (a rank could not load the
 *     model: the group agrees on it, so every rank returns it, and the
 *     leader reports it as an Error with batch_id 0).
 * Runs on the calling thread (a replica thread in-process, the main thread
 * of a worker rank), which must be the only one using the mesh. */
int ditd_worker_run(const ditd_worker_config *cfg, ditd_transport *t);

/* ---- the front-end's side: a hub of replicas ---- */

typedef struct ditd_hub ditd_hub;

/* A message from a replica: owned by the caller of _drain (free the list
 * with ditd_hub_msg_free). */
typedef struct ditd_hub_msg {
    struct ditd_hub_msg *next;
    int replica;
    size_t len;
    uint8_t buf[];
} ditd_hub_msg;

/* Called on the thread that queued a message from a replica, to wake the
 * front-end's loop; must be thread-safe and must not block. */
typedef void (*ditd_hub_wake_fn)(void *ud);

/* In-process: replicas run on threads that the caller starts with
 * ditd_hub_transport(hub, r) as their transport. */
int ditd_hub_new_inproc(int replicas, ditd_hub_wake_fn wake, void *ud, ditd_hub **out);

/* MPI: rank 0 of MPI_COMM_WORLD; replica r is world ranks 1 + r x
 * group_size .. (r + 1) x group_size, and its leader, the first, is the one
 * the hub talks to. MPI must be initialized (ditd_comm_mpi_init, thread
 * level SERIALIZED); from here until ditd_hub_free() returns, the hub's
 * thread is the only caller of MPI in this process. It never blocks in MPI
 * (sends are MPI_Isend), so a replica sending a large result never waits
 * on a hub that is sending it a batch. DITD_EUNSUPPORTED without MPI. */
int ditd_hub_new_mpi(int replicas, int group_size, ditd_hub_wake_fn wake, void *ud,
                     ditd_hub **out);

/* The worker's end for replica r (in-process hubs only; borrowed, lives as
 * long as the hub). */
ditd_transport *ditd_hub_transport(ditd_hub *h, int r);

/* Queues a packed Envelope for replica r (copied). Thread-safe. */
int ditd_hub_send(ditd_hub *h, int r, const uint8_t *buf, size_t len);

/* Takes every message queued by the replicas, oldest first. Thread-safe. */
ditd_hub_msg *ditd_hub_drain(ditd_hub *h);
void ditd_hub_msg_free(ditd_hub_msg *m);

/* Frees the hub. In-process: replica threads must have returned from
 * ditd_worker_run first. MPI: the hub's thread sends what is queued (the
 * Shutdowns), then keeps receiving (and dropping) until every replica has
 * said bye or 30 s have passed, so no worker is left blocked in a send;
 * then it stops. The wake callback may run until this returns. */
void ditd_hub_free(ditd_hub *h);

/* ---- MPI (DITD_EUNSUPPORTED without it) ---- */

/* The transport of a group leader's rank (talks to rank 0 of
 * MPI_COMM_WORLD); owned, free(). MPI initialized: ditd_comm_mpi_init. */
int ditd_mpi_transport_new(ditd_transport **out);

#endif
