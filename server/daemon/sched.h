/* The scheduler of `ditd serve`: the bounded queue, the batcher and replica
 * routing, and the messages to and from the replicas (proto/ditd.proto).
 * It moves jobs through server/daemon/job.h and never talks HTTP. Loop thread only.
 *
 * Batching: requests are compatible when steps, sampler, size and
 * max_sequence_length (text models) agree; the head of the queue waits at
 * most --batch-window-ms for a fuller batch, and a batch goes to the
 * least-loaded live idle replica. A text model's samples carry their prompt
 * text; the replica encodes it. */
#ifndef DITD_SERVER_SCHED_H
#define DITD_SERVER_SCHED_H

#include <stddef.h>
#include <stdint.h>

#include "proto/ditd.pb-c.h"
#include "server/daemon/genreq.h"
#include "server/daemon/job.h"

/* A request's cost: images x steps x tokens (the model's latent tokens per
 * image at the request's size, plus max_sequence_length text tokens for a
 * text model: the joint sequence). What --max-cost bounds and what orders
 * the queue. */
uint64_t ditd__sched_cost(const ditd_srv *s, const ditd_genreq *rq);
/* 0, or an HTTP status (400 over --max-cost, 429 queue full, 503 no replica
 * / draining) with *e. On 0 the queue holds a reference to the job.
 *
 * The queue's order (the fairness policy, docs/serving.md): earliest
 * deadline first, a job's deadline being its arrival plus its cost times
 * the measured seconds per unit of cost, i.e. roughly when it would finish
 * if it ran alone at once. A light request overtakes heavy ones that wait,
 * and a heavy one is never starved: lights that arrive after its deadline
 * queue behind it. Until the first batch is timed the order is arrival. */
int ditd__sched_submit(ditd_srv *s, ditd_job *j, ditd_api_error *e);
/* Forms and sends the batches that can go now. */
void ditd__sched_kick(ditd_srv *s);
/* One message from replica r (an Envelope), on the loop thread. */
void ditd__sched_on_message(ditd_srv *s, int replica, const uint8_t *buf, size_t len);
/* Takes the job out of the queue and cancels its running samples. */
void ditd__sched_withdraw(ditd_srv *s, ditd_job *j);
/* Fails the job (unless its outcome is decided): withdraws its samples,
 * then ditd_job_fail. */
void ditd__sched_fail(ditd_srv *s, ditd_job *j, int status, const char *type, const char *code,
                      const char *fmt, ...) __attribute__((format(printf, 6, 7)));
/* Replicas alive and ready (heartbeat younger than the timeout). */
int ditd__sched_replicas_up(const ditd_srv *s);
/* Replica r's heartbeat is younger than the timeout (or it is young and loading). */
int ditd__sched_replica_alive(const ditd_srv *s, int r);
int ditd__sched_running(const ditd_srv *s);
/* Seconds a 429 should ask the client to wait (1..120). */
int ditd__sched_retry_after(const ditd_srv *s);
/* Fails the batches of replicas that went silent (stalled), so their jobs
 * end instead of waiting for the request timeout. */
void ditd__sched_watch(ditd_srv *s);
/* Sends Shutdown to every replica. */
void ditd__sched_shutdown(ditd_srv *s, int now);
/* Packs env for replica r and sends it (a failure is logged). */
void ditd__sched_send(ditd_srv *s, int r, Ditd__Envelope *env);

/* LoRA adapters at run time (sched_lora.c; docs/lora.md). Slots are the
 * indexes of cfg.loras: a request names a live one (lora_names[k] set).
 *
 * ditd__sched_lora_start: a load (kind 1: the file at the resolved path,
 * named name, into a free slot kept hidden until every replica has it) or
 * an unload (kind 2: hidden at once) on every replica that serves. 0, and
 * cb(ctx) comes once it is over: 200, or the status and error (a load that
 * failed on one replica is undone on the others; the loader's message);
 * else an HTTP status now with *e: 409 another op is under way or no slot
 * is free, 404 no such adapter, 503 a replica is not ready or draining.
 * The caller checks names, paths and use first. */
typedef void (*ditd_lora_op_cb)(ditd_srv *s, void *ctx, int status, const ditd_api_error *e,
                                const char *name);
int ditd__sched_lora_start(ditd_srv *s, int kind, const char *name, const char *path,
                           ditd_lora_op_cb cb, void *ctx, ditd_api_error *e);
/* The caller of the op under way with ctx is gone: no callback. */
void ditd__sched_lora_forget(ditd_srv *s, void *ctx);
/* The slot named name (live or loading), or -1. */
int ditd__sched_lora_slot(const ditd_srv *s, const char *name);
/* Requests not yet answered that name slot k (queued, running, parsed). */
int ditd__sched_lora_in_use(const ditd_srv *s, int k);
/* Messages from replica r: its start-up adapters, a LoraDone, its cache's
 * events (counted into /metrics, its resident bytes). */
void ditd__sched_lora_adapters(ditd_srv *s, int r, const Ditd__Adapters *am);
void ditd__sched_lora_done(ditd_srv *s, int r, const Ditd__LoraDone *d);
void ditd__sched_lora_events(ditd_srv *s, int r, const Ditd__LoraEvents *le);
/* Periodic: an op whose replica failed or passed --request-timeout ends. */
void ditd__sched_lora_watch(ditd_srv *s);
/* Frees what the slots hold (at exit). */
void ditd__sched_lora_free(ditd_srv *s);

#endif
