/* The CUDA backend: bf16 activations and weights (converted at upload), fp32
 * accumulation and statistics, kernels/cuda underneath, one compute stream
 * and one communication stream per process, ordered by events.
 *
 * What it is not: the collectives (engine/parallel/comm_nccl.c runs them, on the
 * stream this backend hands out), or the model (engine/models/dit/dit.c calls the ops
 * table and never asks which device it is on).
 *
 * State: one set per process (the device current when the backend is first
 * got, streams, the cuBLASLt context and its workspace, a staging buffer for
 * f32 <-> bf16 transfers). A worker rank drives one GPU from one thread, so
 * the ops are not thread-safe, like the model they serve.
 *
 * Only in builds with the CUDA backend (DITD_HAVE_CUDA).
 */
#ifndef DITD_ENGINE_BACKEND_CUDA_H
#define DITD_ENGINE_BACKEND_CUDA_H

#include <stddef.h>

#include "engine/backend/backend.h"

/* The CUDA ops table, initialized on first use on the current device
 * (cudaSetDevice before, e.g. to the local rank); NULL with the detail set
 * (DITD_EDEVICE) when there is no usable GPU or the initialization fails.
 * Borrowed; lives until ditd_backend_cuda_shutdown(). */
const ditd_backend_ops *ditd_backend_cuda_get(void);
/* The table itself, without touching the device: for capability questions. */
const ditd_backend_ops *ditd_backend_cuda_table(void);

/* Releases the streams, the cuBLASLt context and the staging buffers (not
 * the arenas: their owners free them first). Safe when never initialized. */
void ditd_backend_cuda_shutdown(void);

/* Chooses this process's GPU before the backend is first got:
 * cudaSetDevice(local_rank modulo the GPU count). Returns the device
 * ordinal, or a negative DITD_E* with the detail set (no GPU; or the
 * backend already runs on another device). */
int ditd_backend_cuda_select(int local_rank);

/* The device the backend runs on (the current one before it is got). */
int ditd_backend_cuda_device(void);

/* 1 when a GPU is there to use (cudaGetDeviceCount > 0), else 0; for tests
 * that skip (exit 77) without one. Does not initialize the backend. */
int ditd_backend_cuda_available(void);

/* The compute stream and the communication stream (cudaStream_t), for the
 * NCCL transport. NULL before initialization. */
void *ditd_backend_cuda_compute_stream(void);
void *ditd_backend_cuda_comm_stream(void);

/* Event ordering between the two streams, without a host sync:
 * comm_begin: the comm stream waits for everything queued on compute so far;
 * comm_end: the compute stream waits for everything queued on comm so far.
 * 0 or DITD_EDEVICE. */
int ditd_backend_cuda_comm_begin(void);
int ditd_backend_cuda_comm_end(void);

/* How many GEMM shapes took the slow fallback kernel instead of cuBLASLt
 * so far (each is also said once on stderr), for checks. */
int ditd_backend_cuda_gemm_fallbacks(void);

/* 1 when p is device memory (cudaPointerGetAttributes), for checks. */
int ditd_backend_cuda_is_device_ptr(const void *p);

/* ---- CUDA graphs: capture the compute stream once per shape, replay ----
 *
 * Between capture_begin and capture_end every op queues into a graph
 * instead of running. Ops that read host arguments (embedding,
 * timestep_embed) bake their values into the graph, and upload/download
 * cannot be captured: a captured forward must take its timesteps and labels
 * from device memory that is written before each replay. */
typedef struct ditd_cuda_graph ditd_cuda_graph;

int ditd_backend_cuda_capture_begin(void);
/* Ends the capture and instantiates it; *out owned. */
int ditd_backend_cuda_capture_end(ditd_cuda_graph **out);
/* Queues one replay on the compute stream. */
int ditd_backend_cuda_graph_launch(ditd_cuda_graph *g);
void ditd_backend_cuda_graph_free(ditd_cuda_graph *g);

#endif
