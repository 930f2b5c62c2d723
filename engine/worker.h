/* The worker loop of a replica, and the transports that carry its messages.
 *
 * A worker takes Batch messages (proto/ditd.proto) from a transport, runs
 * them through the pipeline, and sends back Progress after every step (with
 * previews for samples that asked for partial images), one Result per batch
 * (raw 8-bit pixels per image, from ditd_pipeline_to_pixels) or an Error.
 * Cancel messages clear a sample's active flag at the next step boundary;
 * Shutdown ends the loop; a Heartbeat goes out every heartbeat_ms, also in
 * the middle of a batch, so liveness does not depend on the HTTP thread.
 *
 * Two transports carry the same packed Envelope bytes:
 *  - the in-process hub (single-process `ditd serve`): the front-end and
 *    each replica thread share a pair of queues; a worker's messages wake the
 *    front-end through the hub's wake callback (the server passes one that
 *    calls uv_async_send), so this module knows nothing of libuv;
 *  - MPI: rank 0 is the front-end, rank 1 + r runs replica r. On rank 0 the
 *    hub owns a thread that is the only caller of MPI after init.
 *
 * What it is not: the batcher or the router (server/), or the pipeline
 * (engine/pipeline.h). Multi-rank replicas (groups) are not here yet: a
 * replica is one rank.
 */
#ifndef DITD_ENGINE_WORKER_H
#define DITD_ENGINE_WORKER_H

#include <stddef.h>
#include <stdint.h>

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
    int replica;            /* 0..dp-1, put in every message */
    int max_batch;          /* samples per batch, 1..DITD_WORKER_MAX_BATCH */
    int threads;            /* CPU threads, <= 0: the runtime's default */
    int heartbeat_ms;       /* > 0 */
} ditd_worker_config;

/* Loads the model and serves batches until a Shutdown message or a
 * transport failure. A model that does not load is reported as an Error
 * with batch_id 0 and the function returns its code; otherwise it returns 0
 * after Shutdown. Runs on the calling thread (a replica thread in-process,
 * the main thread of a worker rank). */
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

/* MPI: rank 0 of MPI_COMM_WORLD, replicas on ranks 1..replicas. MPI must be
 * initialized (ditd_mpi_init) with at least MPI_THREAD_SERIALIZED. Starts
 * the hub's thread. DITD_EUNSUPPORTED when built without MPI. */
int ditd_hub_new_mpi(int replicas, ditd_hub_wake_fn wake, void *ud, ditd_hub **out);

/* The worker's end for replica r (in-process hubs only; borrowed, lives as
 * long as the hub). */
ditd_transport *ditd_hub_transport(ditd_hub *h, int r);

/* Queues a packed Envelope for replica r (copied). Thread-safe. */
int ditd_hub_send(ditd_hub *h, int r, const uint8_t *buf, size_t len);

/* Takes every message queued by the replicas, oldest first. Thread-safe. */
ditd_hub_msg *ditd_hub_drain(ditd_hub *h);
void ditd_hub_msg_free(ditd_hub_msg *m);

/* Stops the hub's thread (MPI) after the queued messages are sent, and frees
 * it. Replica threads must have returned from ditd_worker_run first. */
void ditd_hub_free(ditd_hub *h);

/* ---- MPI bootstrap (no-ops without MPI) ---- */

/* True when the process was started by mpirun/srun (Open MPI, MPICH, PMIx
 * environment), without initializing anything. */
int ditd_mpi_launched(void);
/* MPI_Init_thread(SERIALIZED); *rank and *size of MPI_COMM_WORLD. */
int ditd_mpi_init(int *rank, int *size);
void ditd_mpi_finalize(void);
/* The worker transport of a worker rank (talks to rank 0); owned, free(). */
int ditd_mpi_transport_new(ditd_transport **out);

#endif
