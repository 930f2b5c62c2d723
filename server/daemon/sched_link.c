/* The links to the replicas (server/daemon/sched_link.h). Loop thread only. */
#include "server/daemon/sched_link.h"

#include <stdlib.h>

#include "engine/core/error.h"
#include "server/daemon/log.h"
#include "server/daemon/serve.h"

int ditd__sched_replica_up(const ditd_srv *s, int r)
{
    const ditd_replica *p = &s->rep[r];
    return p->ready && !p->failed &&
           ditd__now() - p->last_hb < s->cfg.heartbeat_timeout_ms / 1000.0;
}

int ditd__sched_replica_alive(const ditd_srv *s, int r)
{
    const ditd_replica *p = &s->rep[r];
    double now = ditd__now();
    if (p->failed)
        return 0;
    /* one still loading its model is alive while it is young */
    if (!p->ready)
        return now - s->t_start < s->cfg.heartbeat_timeout_ms / 1000.0;
    return now - p->last_hb < s->cfg.heartbeat_timeout_ms / 1000.0;
}

int ditd__sched_replicas_up(const ditd_srv *s)
{
    int n = 0;
    for (int r = 0; r < s->nrep; r++)
        n += ditd__sched_replica_up(s, r);
    return n;
}

void ditd__sched_send(ditd_srv *s, int r, Ditd__Envelope *env)
{
    env->replica = (uint32_t)r; /* before sizing: it is encoded when non-zero */
    size_t len = ditd__envelope__get_packed_size(env);
    uint8_t *buf = malloc(len ? len : 1);
    if (!buf) {
        ditd_log(DITD_LOG_INFO, "out of memory sending to replica %d", r);
        return;
    }
    ditd__envelope__pack(env, buf);
    if (ditd_hub_send(s->hub, r, buf, len))
        ditd_log(DITD_LOG_INFO, "sending to replica %d: %s", r, ditd_err_detail());
    free(buf);
}
