/* The front-end's links to its replicas (serve.h's ditd_replica): whether
 * one is alive, and sending it a message. Shared by the scheduler
 * (sched.c) and the LoRA operations (sched_lora.c). Loop thread only. */
#ifndef DITD_SERVER_SCHED_LINK_H
#define DITD_SERVER_SCHED_LINK_H

#include "proto/ditd.pb-c.h"
#include "server/daemon/job.h"

/* Replica r's heartbeat is younger than the timeout (or it is young and loading). */
int ditd__sched_replica_alive(const ditd_srv *s, int r);
/* Replica r is ready and its heartbeat younger than the timeout. */
int ditd__sched_replica_up(const ditd_srv *s, int r);
/* Replicas alive and ready (heartbeat younger than the timeout). */
int ditd__sched_replicas_up(const ditd_srv *s);
/* Packs env for replica r and sends it (a failure is logged). */
void ditd__sched_send(ditd_srv *s, int r, Ditd__Envelope *env);

#endif
