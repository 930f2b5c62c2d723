/* LoRA adapters at run time, the scheduler's side (server/daemon/sched.h):
 * the server's adapter slots, the one load or unload under way on every
 * replica (LoraOp out, LoraDone back, its deadline, the undo of a load
 * that failed somewhere), what the replicas report (Adapters at start,
 * LoraEvents of their caches) into /metrics and GET /v1/loras, and whether
 * a request still uses an adapter. Loop thread only. Never talks HTTP: the
 * route (route_loras.c) hears the outcome through its callback.
 *
 * Why one op at a time: a load is rare and slow (a file read on every
 * rank); one at a time keeps the undo simple (the slot and the replicas'
 * answers belong to it) and the replicas' tables in one order. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/error.h"
#include "engine/models/lora.h"
#include "server/daemon/log.h"
#include "server/daemon/sched_link.h"
#include "server/daemon/sched_lora.h"
#include "server/daemon/serve.h"

enum { OP_LOAD = 1, OP_UNLOAD = 2 };

/* a slot the front-end hands out is one a replica can hold, and one the
 * metrics count */
_Static_assert(DITD_LORA_SPEC_MAX <= DITD_WORKER_MAX_LORAS, "a replica holds every slot");
_Static_assert(DITD_LORA_SPEC_MAX <= DITD_METRICS_MAX_LORAS, "the metrics count every slot");

int ditd__sched_lora_slot(const ditd_srv *s, const char *name)
{
    return name && name[0] ? ditd_lora_specs_find(&s->cfg.loras, name) : -1; /* "": a free slot's */
}

static void info_free(ditd_srv_lora *l)
{
    for (int m = 0; m < l->n_modules; m++)
        free(l->modules[m]);
    free(l->modules);
    free(l->ranks);
    memset(l, 0, sizeof *l);
}

void ditd__sched_lora_free(ditd_srv *s)
{
    for (int i = 0; i < s->cfg.loras.n; i++)
        info_free(&s->loras[i]);
}

/* What a replica said of slot k (the first report is kept: every replica
 * loads the same file). */
static void info_keep(ditd_srv *s, int r, int k, const Ditd__LoraInfo *li)
{
    ditd_srv_lora *l = &s->loras[k];
    if (l->known)
        return;
    size_t nm = li->n_modules < li->n_ranks ? li->n_modules : li->n_ranks;
    char **mods = calloc(nm + 1, sizeof *mods);
    uint32_t *ranks = calloc(nm + 1, sizeof *ranks);
    int ok = mods && ranks;
    for (size_t m = 0; ok && m < nm; m++) {
        ok = (mods[m] = strdup(li->modules[m] ? li->modules[m] : "")) != NULL;
        ranks[m] = li->ranks[m];
    }
    if (!ok) {
        for (size_t m = 0; mods && m < nm; m++)
            free(mods[m]);
        free(mods);
        free(ranks);
        ditd_log(DITD_LOG_WARN, "out of memory keeping LoRA adapter %s's modules", li->name);
        return;
    }
    *l = (ditd_srv_lora){.known = 1, .format = li->format, .max_rank = li->max_rank,
                         .n_modules = (int)nm, .modules = mods, .ranks = ranks,
                         .bytes = li->bytes};
    ditd_log(DITD_LOG_INFO, "replica %d loaded LoRA adapter %s (%s, rank %u, %d modules, %llu "
             "bytes%s)", r, li->name, ditd_lora_format_name((ditd_lora_format)li->format),
             li->max_rank, (int)nm, (unsigned long long)li->bytes,
             li->resident ? "" : ", then evicted under --lora-cache-mb");
}

void ditd__sched_lora_adapters(ditd_srv *s, int r, const Ditd__Adapters *am)
{
    for (size_t i = 0; i < am->n_loras; i++) {
        const Ditd__LoraInfo *li = am->loras[i];
        int k = ditd__sched_lora_slot(s, li->name ? li->name : "");
        if (k < 0 || !li->name || !li->name[0]) {
            ditd_log(DITD_LOG_WARN, "replica %d reported a LoRA adapter '%.64s' it was not given",
                     r, li->name ? li->name : "");
            continue;
        }
        info_keep(s, r, k, li);
    }
}

void ditd__sched_lora_events(ditd_srv *s, int r, const Ditd__LoraEvents *le)
{
    for (size_t i = 0; i < le->n_events; i++) {
        const Ditd__LoraEvent *ev = le->events[i];
        int k = ev->name && ev->name[0] ? ditd__sched_lora_slot(s, ev->name) : -1;
        if (k < 0 || k >= DITD_METRICS_MAX_LORAS)
            continue; /* an adapter already forgotten (an undone load) */
        switch (ev->kind) {
        case 1: /* load */
            s->m.lora_loads[k]++;
            s->rep[r].lora_resident[k] = ev->bytes;
            break;
        case 2:
            s->m.lora_hits[k]++;
            break;
        case 3:
            s->m.lora_misses[k]++;
            break;
        case 4: /* evict */
            s->m.lora_evictions[k]++;
            s->rep[r].lora_resident[k] = 0;
            break;
        case 5: /* unload */
            s->rep[r].lora_resident[k] = 0;
            break;
        default:
            break;
        }
    }
}

int ditd__sched_lora_in_use(const ditd_srv *s, int k)
{
    int n = 0;
    for (const ditd_job *j = s->jobs.head; j; j = j->all_next) {
        if (ditd_job_terminal(j))
            continue; /* a batch of it may still run: the replica runs the op after it */
        for (int a = 0; a < j->rq.n_loras; a++)
            n += j->rq.lora_idx[a] == k;
    }
    return n;
}

/* A free slot for name (path resolved), hidden from requests until its
 * load is done; -1 when all DITD_LORA_SPEC_MAX are taken. Its counters
 * start at 0. */
static int reserve(ditd_srv *s, const char *name, const char *path)
{
    ditd_lora_specs *ls = &s->cfg.loras;
    int k = 0;
    while (k < ls->n && ls->v[k].name[0])
        k++;
    if (k == ls->n) {
        if (ls->n == DITD_LORA_SPEC_MAX)
            return -1;
        ls->n++;
        s->gm.n_loras = ls->n;
    }
    snprintf(ls->v[k].name, sizeof ls->v[k].name, "%s", name);
    snprintf(ls->v[k].path, sizeof ls->v[k].path, "%s", path);
    s->lora_names[k] = NULL;
    info_free(&s->loras[k]);
    if (k < DITD_METRICS_MAX_LORAS)
        s->m.lora_rows[k] = s->m.lora_loads[k] = s->m.lora_hits[k] = s->m.lora_misses[k] =
            s->m.lora_evictions[k] = 0;
    for (int r = 0; r < s->nrep; r++)
        s->rep[r].lora_resident[k] = 0;
    return k;
}

/* Slot k is free again (its series leave /metrics). */
static void release(ditd_srv *s, int k)
{
    ditd_lora_specs *ls = &s->cfg.loras;
    ls->v[k].name[0] = ls->v[k].path[0] = '\0';
    s->lora_names[k] = NULL;
    info_free(&s->loras[k]);
    for (int r = 0; r < s->nrep; r++)
        s->rep[r].lora_resident[k] = 0;
    while (ls->n > 0 && !ls->v[ls->n - 1].name[0])
        ls->n--;
    s->gm.n_loras = ls->n;
}

static void send_op(ditd_srv *s, int r, uint64_t id, int kind, const char *name,
                    const char *path)
{
    Ditd__Envelope env = DITD__ENVELOPE__INIT;
    Ditd__LoraOp op = DITD__LORA_OP__INIT;
    op.op_id = id;
    op.kind = (uint32_t)kind;
    op.name = (char *)name;
    op.path = (char *)(path ? path : "");
    env.msg_case = DITD__ENVELOPE__MSG_LORA_OP;
    env.lora_op = &op;
    ditd__sched_send(s, r, &env);
}

int ditd__sched_lora_start(ditd_srv *s, int kind, const char *name, const char *path,
                           ditd_lora_op_cb cb, void *ctx, ditd_api_error *e)
{
    ditd_lora_op *op = &s->lora_op;
    int n = 0, k;
    if (op->id)
        return ditd_api_error_set(e, 409, "invalid_request_error", "lora_busy", NULL,
                                  "another adapter %s is under way (%s); retry when it ends",
                                  op->kind == OP_LOAD ? "load" : "unload",
                                  s->cfg.loras.v[op->slot].name);
    if (s->draining)
        return ditd_api_error_set(e, 503, "server_error", "draining", NULL,
                                  "the server is shutting down");
    /* every replica that serves must take it (a failed one serves nothing) */
    for (int r = 0; r < s->nrep; r++) {
        if (s->rep[r].failed)
            continue;
        if (!s->rep[r].ready || !ditd__sched_replica_alive(s, r))
            return ditd_api_error_set(e, 503, "server_error", "no_replica", NULL,
                                      "replica %d is not ready (still loading, or silent): "
                                      "every replica must take the adapter; retry", r);
        n++;
    }
    if (!n)
        return ditd_api_error_set(e, 503, "server_error", "no_replica", NULL,
                                  "no replica is ready");
    if (kind == OP_LOAD) {
        if ((k = reserve(s, name, path)) < 0)
            return ditd_api_error_set(e, 409, "invalid_request_error", "too_many_loras", "name",
                                      "the server holds %d adapters, the most it takes; "
                                      "DELETE one first", DITD_LORA_SPEC_MAX);
    } else {
        k = ditd__sched_lora_slot(s, name);
        if (k < 0 || !s->lora_names[k])
            return ditd_api_error_set(e, 404, "invalid_request_error", "lora_not_found", NULL,
                                      "no LoRA adapter '%s'", name);
        s->lora_names[k] = NULL; /* no new request may name it */
    }
    memset(op, 0, sizeof *op);
    op->id = ++s->lora_op_next;
    op->kind = kind;
    op->slot = k;
    op->deadline = ditd__now() + s->cfg.request_timeout_s;
    op->cb = cb;
    op->ctx = ctx;
    for (int r = 0; r < s->nrep; r++) {
        s->rep[r].lora_ok = 0;
        s->rep[r].lora_wait = !s->rep[r].failed;
        if (s->rep[r].lora_wait)
            send_op(s, r, op->id, kind, name, path);
    }
    ditd_log(DITD_LOG_INFO, "LoRA adapter %s: %s on %d replica%s%s%s", name,
             kind == OP_LOAD ? "loading" : "unloading", n, n == 1 ? "" : "s",
             kind == OP_LOAD ? " from " : "", kind == OP_LOAD ? path : "");
    return 0;
}

void ditd__sched_lora_forget(ditd_srv *s, void *ctx)
{
    if (s->lora_op.id && s->lora_op.ctx == ctx) {
        s->lora_op.cb = NULL;
        s->lora_op.ctx = NULL;
    }
}

/* Every replica answered (or was given up on): the outcome. */
static void finish(ditd_srv *s)
{
    ditd_lora_op *op = &s->lora_op;
    ditd_api_error e;
    int status = 200, k = op->slot;
    char name[DITD_LORA_NAME_MAX];
    for (int r = 0; r < s->nrep; r++)
        if (s->rep[r].lora_wait)
            return;
    snprintf(name, sizeof name, "%s", s->cfg.loras.v[k].name);
    memset(&e, 0, sizeof e);
    if (op->kind == OP_LOAD && !op->code) {
        s->lora_names[k] = s->cfg.loras.v[k].name; /* requests may name it now */
        ditd_log(DITD_LOG_INFO, "LoRA adapter %s loaded on every replica", name);
    } else if (op->kind == OP_LOAD) {
        /* undo it where it loaded (a replica that timed out too: its late
         * load runs before this unload) */
        for (int r = 0; r < s->nrep; r++)
            if (s->rep[r].lora_ok || (op->code == DITD_ETIMEDOUT && !s->rep[r].failed))
                send_op(s, r, 0, OP_UNLOAD, name, NULL);
        release(s, k);
        int http = ditd_err_http_status(op->code);
        if (op->code == DITD_ETIMEDOUT)
            status = ditd_api_error_set(&e, 504, "server_error", "timeout", NULL, "%s", op->msg);
        else if (http == 503)
            status = ditd_api_error_set(&e, 503, "server_error", "unavailable", NULL, "%s",
                                        op->msg);
        else if (http >= 500)
            status = ditd_api_error_set(&e, 500, "server_error", "internal_error", NULL, "%s",
                                        op->msg);
        else /* the file: what the loader refused, naming the tensor */
            status = ditd_api_error_set(&e, 400, "invalid_request_error", "invalid_lora", "path",
                                        "%s", op->msg);
        ditd_log(DITD_LOG_WARN, "LoRA adapter %s not loaded: %s", name, op->msg);
    } else {
        release(s, k);
        ditd_log(DITD_LOG_INFO, "LoRA adapter %s unloaded from every replica", name);
    }
    ditd_lora_op_cb cb = op->cb;
    void *ctx = op->ctx;
    memset(op, 0, sizeof *op);
    if (cb)
        cb(s, ctx, status, &e, name);
}

/* Replica r gives no answer to the op (failed, silent, too late). */
static void give_up(ditd_srv *s, int r, int code, const char *why)
{
    ditd_lora_op *op = &s->lora_op;
    s->rep[r].lora_wait = 0;
    if (op->kind == OP_LOAD && !op->code) {
        op->code = code;
        snprintf(op->msg, sizeof op->msg, "replica %d: %s", r, why);
    }
}

void ditd__sched_lora_done(ditd_srv *s, int r, const Ditd__LoraDone *d)
{
    ditd_lora_op *op = &s->lora_op;
    if (!op->id || d->op_id != op->id || !s->rep[r].lora_wait) {
        if (d->op_id && d->code) /* an undo's, or an op given up on */
            ditd_log(DITD_LOG_INFO, "replica %d: LoRA op %llu: %s", r,
                     (unsigned long long)d->op_id, d->message ? d->message : "");
        return;
    }
    s->rep[r].lora_wait = 0;
    /* an unload of what a replica does not hold leaves it as wanted */
    if (!d->code || (op->kind == OP_UNLOAD && d->code == DITD_ENOENT)) {
        s->rep[r].lora_ok = 1;
        if (op->kind == OP_LOAD && d->info)
            info_keep(s, r, op->slot, d->info);
    } else if (!op->code) {
        op->code = d->code;
        snprintf(op->msg, sizeof op->msg, "%s", d->message ? d->message : "");
        if (s->nrep > 1) { /* which replica, when there are several */
            char m[sizeof op->msg];
            snprintf(m, sizeof m, "replica %d: %s", r, op->msg);
            memcpy(op->msg, m, sizeof m);
        }
    }
    finish(s);
}

void ditd__sched_lora_watch(ditd_srv *s)
{
    ditd_lora_op *op = &s->lora_op;
    if (!op->id)
        return;
    double now = ditd__now();
    int any = 0;
    for (int r = 0; r < s->nrep; r++) {
        if (!s->rep[r].lora_wait)
            continue;
        any = 1;
        if (s->rep[r].failed || !ditd__sched_replica_alive(s, r))
            give_up(s, r, DITD_EUNAVAIL, "the replica failed during the adapter's load");
        else if (now > op->deadline)
            give_up(s, r, DITD_ETIMEDOUT, "no answer within --request-timeout");
    }
    if (any)
        finish(s);
}
