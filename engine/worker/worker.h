/* The worker loop of a replica (the transports that carry its messages:
 * engine/worker/hub.h).
 *
 * A worker takes Batch messages (proto/ditd.proto) from a transport, encodes
 * a text model's prompts once per batch (on the text-encoder rank, which
 * broadcasts the embeddings to its group; engine/pipeline/prompt_encoder.h),
 * re-plans the pipeline for the batch's size when the model takes any size,
 * runs the batch through the pipeline, and sends back Progress after every step (with
 * previews for samples that asked for partial images), one Result per batch
 * (raw 8-bit pixels per image, from ditd_pipeline_to_pixels) or an Error.
 * LoraOp messages load or unload a LoRA adapter on every rank between batches.
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
 * What it is not: the batcher or the router (server/), the pipeline
 * (engine/pipeline/pipeline.h), or MPI start-up (engine/parallel/comm.h: ditd_comm_mpi_init).
 */
#ifndef DITD_ENGINE_WORKER_H
#define DITD_ENGINE_WORKER_H

#include <stddef.h>
#include <stdint.h>

#include "engine/parallel/mesh.h"
#include "engine/worker/hub.h"

#define DITD_WORKER_MAX_BATCH 256
#define DITD_WORKER_MAX_LORAS 64   /* adapters a replica knows (the server's DITD_LORA_SPEC_MAX) */

/* A LoRA adapter file the replica loads at start (docs/lora.md). */
typedef struct ditd_worker_lora {
    const char *name;       /* what batches call it (Sample.lora_names) */
    const char *path;       /* a .safetensors adapter */
} ditd_worker_lora;

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
    int vae_tiling;         /* latent models: tiled VAE decode (Diffusers' enable_tiling) */
    int weight_dtype;       /* ditd_dtype of CPU weights (F32, BF16); -1: auto, by
                             * the checkpoint (ditd_backend_for_weights) */
    /* Text models: the group rank that loads the text encoders and encodes
     * each batch's prompts once (0: the leader), then broadcasts the
     * embeddings to the group; the LRU cache of prompt embeddings there
     * (0 entries: none). */
    int text_encoder_rank;
    int text_cache_entries;
    int text_cache_mb;
    /* LoRA adapters every rank loads and uploads at start, before the
     * replica says ready (borrowed for the call); a file that does not
     * load fails the start naming it. The leader then sends an Adapters
     * message; batches name them per sample. LoraOp messages load and
     * unload more at run time (at most DITD_WORKER_MAX_LORAS in all). */
    const ditd_worker_lora *loras;
    int n_loras;
    /* MiB of adapters kept on the device (an LRU: a batch naming an evicted
     * adapter reloads it from its file first); 0: every adapter stays. */
    double lora_cache_mb;
    /* --transformer-file / --text-encoder-2-file (ditd_model_info_set_files;
     * NULL: the folder's), borrowed for the call */
    const char *transformer_file, *text_encoder_2_file;
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

#endif
