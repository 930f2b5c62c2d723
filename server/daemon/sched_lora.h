/* LoRA adapters at run time in the front-end (sched_lora.c; docs/lora.md):
 * loads and unloads on every replica, the slots requests name, and the
 * replicas' adapter messages. Loop thread only. */
#ifndef DITD_SERVER_SCHED_LORA_H
#define DITD_SERVER_SCHED_LORA_H

#include "proto/ditd.pb-c.h"
#include "server/daemon/api_error.h"
#include "server/daemon/job.h"

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
