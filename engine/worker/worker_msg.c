/* A worker's messages to the front-end (the leader's; a follower says
 * nothing), one that comes while a batch runs, and the group's agreement
 * on an outcome (worker_state.h). */
#include "engine/worker/worker_state.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/error.h"

int ditd__worker_send_env(ditd__worker *w, Ditd__Envelope *env)
{
    if (!w->t) /* a follower says nothing */
        return 0;
    env->replica = (uint32_t)w->cfg->replica; /* before sizing: it is encoded when non-zero */
    size_t len = ditd__envelope__get_packed_size(env);
    uint8_t stackbuf[512];
    uint8_t *buf = len <= sizeof stackbuf ? stackbuf : malloc(len);
    int err;
    if (!buf)
        return ditd_err_set(DITD_ENOMEM, "message of %zu bytes", len);
    ditd__envelope__pack(env, buf);
    err = w->t->send(w->t, buf, len);
    if (buf != stackbuf)
        free(buf);
    if (err)
        w->comm_err = err;
    return err;
}

void ditd__worker_heartbeat(ditd__worker *w, bool ready)
{
    Ditd__Envelope env = DITD__ENVELOPE__INIT;
    Ditd__Heartbeat hb = DITD__HEARTBEAT__INIT;
    hb.replica = (uint32_t)w->cfg->replica;
    hb.seq = ++w->hb_seq;
    hb.ready = ready;
    hb.running_batch = w->batch ? w->batch->batch_id : 0;
    hb.max_batch = (uint32_t)w->cfg->max_batch;
    hb.ranks = w->mesh ? (uint32_t)w->mesh->size : 1;
    hb.text_cache_hits = w->pstats.hits;
    hb.text_cache_misses = w->pstats.misses;
    hb.text_cache_entries = w->pstats.entries;
    hb.text_encode_ms = w->pstats.encode_ms;
    env.msg_case = DITD__ENVELOPE__MSG_HEARTBEAT;
    env.heartbeat = &hb;
    ditd__worker_send_env(w, &env);
    w->next_hb = ditd_now_ms() + w->cfg->heartbeat_ms;
}

void ditd__worker_error(ditd__worker *w, uint64_t batch_id, int code, const char *msg)
{
    Ditd__Envelope env = DITD__ENVELOPE__INIT;
    Ditd__Error e = DITD__ERROR__INIT;
    e.batch_id = batch_id;
    e.code = code;
    e.message = (char *)msg;
    env.msg_case = DITD__ENVELOPE__MSG_ERROR;
    env.error = &e;
    ditd__worker_send_env(w, &env);
}

/* The outcome of a LoraOp (info: what a load loaded, or NULL). */
void ditd__worker_lora_done(ditd__worker *w, uint64_t op_id, int code, const char *msg,
                            Ditd__LoraInfo *info)
{
    Ditd__Envelope env = DITD__ENVELOPE__INIT;
    Ditd__LoraDone d = DITD__LORA_DONE__INIT;
    d.op_id = op_id;
    d.code = code;
    d.message = (char *)(msg ? msg : "");
    d.info = info;
    env.msg_case = DITD__ENVELOPE__MSG_LORA_DONE;
    env.lora_done = &d;
    ditd__worker_send_env(w, &env);
}

/* A message that arrives while a batch runs: cancel and shutdown act now,
 * a batch or a LoraOp waits its turn. Takes ownership of buf. */
void ditd__worker_handle_async(ditd__worker *w, uint8_t *buf, size_t len)
{
    Ditd__Envelope *env = ditd__envelope__unpack(NULL, len, buf);
    if (!env) {
        free(buf);
        return;
    }
    switch (env->msg_case) {
    case DITD__ENVELOPE__MSG_CANCEL:
        if (w->batch && env->cancel->batch_id == w->batch->batch_id) {
            size_t n = w->batch->n_samples;
            if (env->cancel->n_slots == 0)
                memset(w->active, 0, n);
            for (size_t i = 0; i < env->cancel->n_slots; i++)
                if (env->cancel->slots[i] < n)
                    w->active[env->cancel->slots[i]] = 0;
        }
        free(buf);
        break;
    case DITD__ENVELOPE__MSG_SHUTDOWN:
        w->stop = true;
        w->stop_now = w->stop_now || env->shutdown->now;
        free(buf);
        break;
    case DITD__ENVELOPE__MSG_BATCH:
    case DITD__ENVELOPE__MSG_LORA_OP: { /* an adapter op waits for the batch, as a batch does */
        pending *p = malloc(sizeof *p);
        if (!p) {
            if (env->msg_case == DITD__ENVELOPE__MSG_BATCH)
                ditd__worker_error(w, env->batch->batch_id, DITD_ENOMEM, "worker queue");
            else
                ditd__worker_lora_done(w, env->lora_op->op_id, DITD_ENOMEM, "worker queue", NULL);
            free(buf);
            break;
        }
        p->next = NULL;
        p->buf = buf;
        p->len = len;
        *w->queued_tail = p;
        w->queued_tail = &p->next;
        break;
    }
    default:
        free(buf);
        break;
    }
    ditd__envelope__free_unpacked(env, NULL);
}

/* Whether every rank of the group succeeded (its start, a LoRA load):
 * each says, all learn who did not. msg names the ranks. */
int ditd__worker_group_agree(ditd__worker *w, int err, char *msg, size_t cap)
{
    if (!ditd__worker_in_group(w))
        return err;
    int G = w->mesh->size, bad = 0, e2;
    float *f = calloc((size_t)G, sizeof *f);
    char *at = msg;
    if (!f) { /* cannot even agree: fail-stop */
        w->group_err = DITD_ECOMM;
        return ditd_err_set(DITD_ENOMEM, "the group's agreement");
    }
    f[w->mesh->rank] = err ? 1.0f : 0.0f;
    if ((e2 = ditd_comm_allreduce_sum(ditd_mesh_comm(w->mesh, DITD_AXIS_GROUP), DITD_DTYPE_F32, f,
                                      (size_t)G))) {
        free(f);
        w->group_err = DITD_ECOMM;
        return e2;
    }
    at += snprintf(at, cap, "group rank(s)");
    for (int g = 0; g < G; g++) {
        if (f[g] > 0.5f) {
            bad++;
            if ((size_t)(at - msg) + 16 < cap)
                at += snprintf(at, cap - (size_t)(at - msg), " %d", g);
        }
    }
    if ((size_t)(at - msg) + 40 < cap)
        snprintf(at, cap - (size_t)(at - msg), " of %d failed (see their logs)", G);
    free(f);
    if (bad && !err)
        err = ditd_err_set(DITD_EUNAVAIL, "%s", msg);
    return err;
}
