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
#include "server/daemon/sched_link.h"
#include "server/daemon/sched_lora.h"

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
int ditd__sched_running(const ditd_srv *s);
/* Seconds a 429 should ask the client to wait (1..120). */
int ditd__sched_retry_after(const ditd_srv *s);
/* Fails the batches of replicas that went silent (stalled), so their jobs
 * end instead of waiting for the request timeout. */
void ditd__sched_watch(ditd_srv *s);
/* Sends Shutdown to every replica. */
void ditd__sched_shutdown(ditd_srv *s, int now);

#endif
