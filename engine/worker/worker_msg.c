/* A worker's messages to the front-end (the leader's; a follower says
 * nothing), and one that comes while a batch runs (worker_state.h). */
#include "engine/worker/worker_state.h"

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

/* A message that arrives while a batch runs: cancel and shutdown act now,
 * a batch waits its turn. Takes ownership of buf. */
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
    case DITD__ENVELOPE__MSG_BATCH: {
        pending *p = malloc(sizeof *p);
        if (!p) {
            ditd__worker_error(w, env->batch->batch_id, DITD_ENOMEM, "worker queue");
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
