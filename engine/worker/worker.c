/* The worker loop of a replica (its transports: engine/worker/hub.c). */
#include "engine/worker/worker_state.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/error.h"

/* The leader: tells the group what comes next. A failure here leaves the
 * group out of step (fail-stop). */
static int group_send(ditd__worker *w, uint32_t kind, uint8_t *buf, size_t len)
{
    group_hdr h = {kind, 0, (uint64_t)len};
    size_t n = len;
    int err;
    if (!ditd__worker_in_group(w))
        return 0;
    if (!(err = ditd_mesh_bcast_lazy(w->mesh, &h, sizeof h, GROUP_NAP_US)) && kind == GROUP_BATCH)
        err = ditd_mesh_bcast_var(w->mesh, buf, len, &n);
    if (err)
        w->group_err = err;
    return err;
}

/* A follower: waits (napping) for the leader's word; a batch lands in
 * w->gbuf[0..*len). */
static int group_recv(ditd__worker *w, uint32_t *kind, size_t *len)
{
    group_hdr h;
    int err;
    if ((err = ditd_mesh_bcast_lazy(w->mesh, &h, sizeof h, GROUP_NAP_US)))
        return err;
    *kind = h.kind;
    if (h.kind != GROUP_BATCH)
        return 0;
    if (h.len > w->gcap) {
        /* the leader sends the bytes whatever we do: no way back into step */
        uint8_t *nb = h.len <= SIZE_MAX ? realloc(w->gbuf, (size_t)h.len) : NULL;
        if (!nb)
            return ditd_err_set(DITD_ENOMEM, "group message of %llu bytes",
                                (unsigned long long)h.len);
        w->gbuf = nb;
        w->gcap = (size_t)h.len;
    }
    *len = (size_t)h.len;
    return ditd_mesh_bcast_var(w->mesh, w->gbuf, w->gcap, len);
}

/* The leader: one message outside a batch (a batch or a LoraOp goes to the
 * group first). Takes ownership of buf. */
static void handle_idle(ditd__worker *w, uint8_t *buf, size_t len)
{
    Ditd__Envelope *env = ditd__envelope__unpack(NULL, len, buf);
    if (!env) {
        free(buf);
        return;
    }
    switch (env->msg_case) {
    case DITD__ENVELOPE__MSG_BATCH:
        if (!ditd__worker_batch_ok(w, env->batch))
            break;
        if (group_send(w, GROUP_BATCH, buf, len)) {
            ditd__worker_error(w, env->batch->batch_id, DITD_EUNAVAIL,
                               "the replica's group failed");
            break;
        }
        ditd__worker_run_batch(w, env->batch);
        break;
    case DITD__ENVELOPE__MSG_LORA_OP:
        if (group_send(w, GROUP_BATCH, buf, len)) {
            ditd__worker_lora_done(w, env->lora_op->op_id, DITD_EUNAVAIL,
                                   "the replica's group failed", NULL);
            break;
        }
        ditd__worker_lora_op(w, env->lora_op);
        break;
    case DITD__ENVELOPE__MSG_SHUTDOWN:
        w->stop = true;
        break;
    default: /* a cancel for a batch that is over */
        break;
    }
    ditd__envelope__free_unpacked(env, NULL);
    free(buf);
}

static void leader_loop(ditd__worker *w)
{
    ditd_transport *t = w->t;
    int err;

    ditd__worker_heartbeat(w, true);
    while (!w->stop && !w->comm_err && !w->group_err) {
        uint8_t *buf = NULL;
        size_t len = 0;
        if (w->queued) {
            pending *p = w->queued;
            if (!(w->queued = p->next))
                w->queued_tail = &w->queued;
            handle_idle(w, p->buf, p->len);
            free(p);
            continue;
        }
        int wait = (int)(w->next_hb - ditd_now_ms());
        err = t->recv(t, &buf, &len, wait > 0 ? wait : 0);
        if (err == DITD_ETIMEDOUT) {
            ditd__worker_heartbeat(w, true);
            continue;
        }
        if (err) {
            w->comm_err = err;
            break;
        }
        handle_idle(w, buf, len);
    }
    if (!w->group_err)
        group_send(w, GROUP_SHUTDOWN, NULL, 0);
    while (w->queued) { /* batches never started: tell the front-end */
        pending *p = w->queued;
        Ditd__Envelope *env = ditd__envelope__unpack(NULL, p->len, p->buf);
        if (env && env->msg_case == DITD__ENVELOPE__MSG_BATCH)
            ditd__worker_error(w, env->batch->batch_id, DITD_EUNAVAIL,
                               "the replica is shutting down");
        if (env)
            ditd__envelope__free_unpacked(env, NULL);
        w->queued = p->next;
        free(p->buf);
        free(p);
    }
    w->queued_tail = &w->queued;
}

static void follower_loop(ditd__worker *w)
{
    for (;;) {
        uint32_t kind = 0;
        size_t len = 0;
        int err = group_recv(w, &kind, &len);
        if (err) {
            fprintf(stderr, "ditd worker: replica %d, group rank %d: %s: %s\n", w->cfg->replica,
                    w->mesh->rank, ditd_strerror(err), ditd_err_detail());
            w->group_err = err;
            return;
        }
        if (kind != GROUP_BATCH)
            return; /* GROUP_SHUTDOWN */
        Ditd__Envelope *env = ditd__envelope__unpack(NULL, len, w->gbuf);
        if (!env || (env->msg_case != DITD__ENVELOPE__MSG_BATCH &&
                     env->msg_case != DITD__ENVELOPE__MSG_LORA_OP)) {
            /* the leader forwards only batches and LoRA ops it unpacked: a broken group */
            fprintf(stderr, "ditd worker: replica %d, group rank %d: a group message of %zu "
                    "bytes is not a batch\n", w->cfg->replica, w->mesh->rank, len);
            if (env)
                ditd__envelope__free_unpacked(env, NULL);
            w->group_err = DITD_ECOMM;
            return;
        }
        if (env->msg_case == DITD__ENVELOPE__MSG_LORA_OP)
            ditd__worker_lora_op(w, env->lora_op);
        else
            ditd__worker_run_batch(w, env->batch);
        ditd__envelope__free_unpacked(env, NULL);
        if (w->group_err)
            return;
    }
}

int ditd_worker_run(const ditd_worker_config *cfg, ditd_transport *t)
{
    ditd__worker *w = calloc(1, sizeof *w);
    char msg[1024] = "", who[256] = "";
    int err = 0, own;

    if (!w)
        return DITD_ENOMEM;
    w->cfg = cfg;
    w->t = t;
    w->mesh = cfg->mesh;
    w->leader = !cfg->mesh || ditd_mesh_is_leader(cfg->mesh);
    w->queued_tail = &w->queued;
    if (w->leader != (t != NULL)) {
        free(w);
        return ditd_err_set(DITD_EINVAL, "a transport on the leader and only there");
    }

    /* Every step runs on every rank, whatever failed before it, so that
     * all reach ditd__worker_group_agree() (no rank may leave the others in a
     * collective). */
    if (cfg->max_batch < 1 || cfg->max_batch > DITD_WORKER_MAX_BATCH || cfg->heartbeat_ms <= 0)
        err = ditd_err_set(DITD_EINVAL, "max batch %d (1..%d), heartbeat %d ms", cfg->max_batch,
                           DITD_WORKER_MAX_BATCH, cfg->heartbeat_ms);
    /* the replica: the device (for CUDA this rank's GPU, on this thread,
     * before anything touches it; a group on GPUs moves its axis
     * collectives to NCCL), the folder, the pipeline, the tail that decodes
     * on the whole group, and a text model's encoders on the text rank */
    const char *dtype =
        cfg->weight_dtype < 0 ? "auto" : ditd_dtype_name((ditd_dtype)cfg->weight_dtype);
    ditd_replica_opts ro = {
        .model_dir = cfg->model_dir,
        .transformer_file = cfg->transformer_file,
        .text_encoder_2_file = cfg->text_encoder_2_file,
        .device = (ditd_device)cfg->device,
        .dtype = dtype,
        .max_samples = cfg->max_batch,
        .mesh = cfg->mesh,
        .comm_timeout_ms = cfg->comm_timeout_ms,
        .decode = DITD_REPLICA_DECODE,
        .vae_tiling = cfg->vae_tiling,
        .text = 1,
        .text_rank = cfg->text_encoder_rank,
        .text_opts = {
            .max_sequence_length = 0, /* the folder's longest */
            .cache_entries = cfg->text_cache_entries > 0 ? (size_t)cfg->text_cache_entries : 0,
            .cache_bytes = (size_t)(cfg->text_cache_mb > 0 ? cfg->text_cache_mb : 1) << 20,
        },
    };
    if (!err)
        err = ditd_replica_open(&ro, &w->rep);
    if (!err) {
        w->frames = w->rep.info.frames; /* a clip's default frames; 0 for images */
        w->rep.ops->set_threads(cfg->threads);
        err = ditd__worker_plan_buffers(w);
    }
    if (!err && w->rep.info.shapes.cond.kind == DITD_COND_TEXT)
        err = ditd__worker_text_init(w);
    if (!err)
        err = ditd__worker_lora_init(w);
    if (err) /* the caller logs this rank's own reason (ditd_err_detail) */
        snprintf(msg, sizeof msg, "%s: %s", ditd_strerror(err), ditd_err_detail());
    own = err;
    err = ditd__worker_group_agree(w, err, who, sizeof who);
    if (err) {
        if (w->leader && !w->group_err) {
            char full[1400];
            /* the leader's own reason, or which ranks of its group failed */
            snprintf(full, sizeof full, "replica %d: %s", cfg->replica, own ? msg : who);
            ditd__worker_error(w, 0, err, full);
        }
        goto done;
    }

    if (w->leader && cfg->n_loras > 0) {
        ditd__worker_send_adapters(w); /* before the first ready heartbeat */
        ditd__worker_lora_flush(w);    /* the start's loads (and evictions) */
    }
    if (w->leader)
        leader_loop(w);
    else
        follower_loop(w);
    err = w->group_err ? DITD_ECOMM : w->comm_err ? DITD_ECOMM : 0;
    if (err)
        ditd_err_set(err, "replica %d: %s", cfg->replica,
                     w->group_err ? "the group fell out of step"
                                  : "the transport to the front-end failed");
done:
    if (w->leader && !w->comm_err)
        ditd__worker_heartbeat(w, false); /* bye */
    free(w->gbuf);
    ditd__worker_lora_free(w);
    free(w->emb);
    free(w->te);
    free(w->pix);
    free(w->out);
    free(w->img_lat);
    free(w->mask_lat);
    free(w->x0_keep);
    free(w->ref_lat);
    free(w->i2v_cond);
    free(w->i2v_emb);
    ditd_replica_close(&w->rep);
    free(w);
    return err;
}
