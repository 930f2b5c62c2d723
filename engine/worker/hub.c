/* The transports between the front-end and the replicas: the in-process
 * hub (a world of one) and MPI (the hub on rank 0, a leader's transport). */
#include "engine/core/clock.h"
#include "engine/worker/hub.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ditd_build_config.h"
#include "engine/core/error.h"
#include "proto/ditd.pb-c.h"

#if DITD_HAVE_MPI
#include <mpi.h>

#define DITD_TAG 7701

#endif

/* ------------------------------------------------------------------ */
/* hubs                                                                */

typedef struct msgq {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    ditd_hub_msg *head, **tail;
} msgq;

static void msgq_init(msgq *q)
{
    pthread_condattr_t ca;
    pthread_mutex_init(&q->mu, NULL);
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&q->cv, &ca);
    pthread_condattr_destroy(&ca);
    q->head = NULL;
    q->tail = &q->head;
}

static void msgq_destroy(msgq *q)
{
    ditd_hub_msg_free(q->head);
    pthread_mutex_destroy(&q->mu);
    pthread_cond_destroy(&q->cv);
}

static ditd_hub_msg *msg_new(int replica, const uint8_t *buf, size_t len)
{
    ditd_hub_msg *m = malloc(sizeof *m + len);
    if (!m)
        return NULL;
    m->next = NULL;
    m->replica = replica;
    m->len = len;
    memcpy(m->buf, buf, len);
    return m;
}

static void msgq_push(msgq *q, ditd_hub_msg *m)
{
    pthread_mutex_lock(&q->mu);
    *q->tail = m;
    q->tail = &m->next;
    pthread_cond_signal(&q->cv);
    pthread_mutex_unlock(&q->mu);
}

static ditd_hub_msg *msgq_take_all(msgq *q)
{
    ditd_hub_msg *m;
    pthread_mutex_lock(&q->mu);
    m = q->head;
    q->head = NULL;
    q->tail = &q->head;
    pthread_mutex_unlock(&q->mu);
    return m;
}

/* Pops one, waiting up to timeout_ms. */
static ditd_hub_msg *msgq_pop(msgq *q, int timeout_ms)
{
    ditd_hub_msg *m;
    struct timespec dl;
    clock_gettime(CLOCK_MONOTONIC, &dl);
    dl.tv_sec += timeout_ms / 1000;
    dl.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (dl.tv_nsec >= 1000000000L) {
        dl.tv_sec++;
        dl.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&q->mu);
    while (!q->head && timeout_ms > 0) {
        if (pthread_cond_timedwait(&q->cv, &q->mu, &dl) == ETIMEDOUT)
            break;
    }
    m = q->head;
    if (m && !(q->head = m->next))
        q->tail = &q->head;
    pthread_mutex_unlock(&q->mu);
    if (m)
        m->next = NULL;
    return m;
}

typedef struct inproc_end {
    ditd_transport base;
    ditd_hub *hub;
    int replica;
} inproc_end;

struct ditd_hub {
    int replicas;
    int mpi;
    ditd_hub_wake_fn wake;
    void *wake_ud;
    msgq in;          /* replicas -> front-end */
    msgq *out;        /* front-end -> replica r (in-process: one per replica) */
    inproc_end *ends; /* in-process */
    pthread_t thread; /* MPI */
    int group;        /* MPI: ranks per replica */
    uint8_t *bye;     /* MPI, the hub's thread only: replica r said bye */
    int nout;
    int stop;         /* MPI: guarded by out[0].mu */
};

void ditd_hub_msg_free(ditd_hub_msg *m)
{
    while (m) {
        ditd_hub_msg *n = m->next;
        free(m);
        m = n;
    }
}

static int inproc_send(ditd_transport *t, const uint8_t *buf, size_t len)
{
    inproc_end *e = (inproc_end *)t;
    ditd_hub_msg *m = msg_new(e->replica, buf, len);
    if (!m)
        return ditd_err_set(DITD_ENOMEM, "message");
    msgq_push(&e->hub->in, m);
    e->hub->wake(e->hub->wake_ud);
    return 0;
}

static int inproc_recv(ditd_transport *t, uint8_t **buf, size_t *len, int timeout_ms)
{
    inproc_end *e = (inproc_end *)t;
    ditd_hub_msg *m = msgq_pop(&e->hub->out[e->replica], timeout_ms);
    if (!m)
        return DITD_ETIMEDOUT;
    if (!(*buf = malloc(m->len ? m->len : 1))) {
        free(m);
        return ditd_err_set(DITD_ENOMEM, "message");
    }
    memcpy(*buf, m->buf, m->len);
    *len = m->len;
    free(m);
    return 0;
}

static int hub_alloc(int replicas, ditd_hub_wake_fn wake, void *ud, int nout, ditd_hub **out)
{
    ditd_hub *h = NULL;
    if (replicas < 1 || replicas > 4096)
        return ditd_err_set(DITD_EINVAL, "%d replicas", replicas);
    if (!(h = calloc(1, sizeof *h)))
        return ditd_err_set(DITD_ENOMEM, "hub");
    h->replicas = replicas;
    h->wake = wake;
    h->wake_ud = ud;
    msgq_init(&h->in);
    h->out = calloc((size_t)nout, sizeof *h->out);
    if (!h->out) {
        msgq_destroy(&h->in);
        free(h);
        return ditd_err_set(DITD_ENOMEM, "hub");
    }
    h->nout = nout;
    for (int i = 0; i < nout; i++)
        msgq_init(&h->out[i]);
    *out = h;
    return 0;
}

int ditd_hub_new_inproc(int replicas, ditd_hub_wake_fn wake, void *ud, ditd_hub **out)
{
    ditd_hub *h = NULL;
    int err;
    if ((err = hub_alloc(replicas, wake, ud, replicas, &h)))
        return err;
    if (!(h->ends = calloc((size_t)replicas, sizeof *h->ends))) {
        ditd_hub_free(h);
        return ditd_err_set(DITD_ENOMEM, "hub");
    }
    for (int r = 0; r < replicas; r++) {
        h->ends[r].base.send = inproc_send;
        h->ends[r].base.recv = inproc_recv;
        h->ends[r].hub = h;
        h->ends[r].replica = r;
    }
    *out = h;
    return 0;
}

ditd_transport *ditd_hub_transport(ditd_hub *h, int r)
{
    if (!h->ends || r < 0 || r >= h->replicas)
        return NULL;
    return &h->ends[r].base;
}

int ditd_hub_send(ditd_hub *h, int r, const uint8_t *buf, size_t len)
{
    ditd_hub_msg *m;
    if (r < 0 || r >= h->replicas)
        return ditd_err_set(DITD_EINVAL, "replica %d of %d", r, h->replicas);
    if (!(m = msg_new(r, buf, len)))
        return ditd_err_set(DITD_ENOMEM, "message");
    msgq_push(&h->out[h->mpi ? 0 : r], m);
    return 0;
}

ditd_hub_msg *ditd_hub_drain(ditd_hub *h)
{
    return msgq_take_all(&h->in);
}

/* ------------------------------------------------------------------ */
/* MPI                                                                 */

#if DITD_HAVE_MPI

static void sleep_us(long us)
{
    struct timespec ts = {0, us * 1000L};
    nanosleep(&ts, NULL);
}

static int mpi_send(ditd_transport *t, const uint8_t *buf, size_t len)
{
    (void)t;
    if (len > (size_t)0x7fffffff)
        return ditd_err_set(DITD_ECOMM, "message of %zu bytes", len);
    /* blocking is fine here: the hub on rank 0 always receives */
    if (MPI_Send(buf, (int)len, MPI_BYTE, 0, DITD_TAG, MPI_COMM_WORLD) != MPI_SUCCESS)
        return ditd_err_set(DITD_ECOMM, "MPI_Send to rank 0");
    return 0;
}

static int mpi_probe_recv(int src, uint8_t **buf, size_t *len, int *from)
{
    MPI_Status st;
    int flag = 0, count = 0;
    if (MPI_Iprobe(src, DITD_TAG, MPI_COMM_WORLD, &flag, &st) != MPI_SUCCESS)
        return ditd_err_set(DITD_ECOMM, "MPI_Iprobe");
    if (!flag)
        return DITD_ETIMEDOUT;
    MPI_Get_count(&st, MPI_BYTE, &count);
    if (!(*buf = malloc(count > 0 ? (size_t)count : 1)))
        return ditd_err_set(DITD_ENOMEM, "message");
    if (MPI_Recv(*buf, count, MPI_BYTE, st.MPI_SOURCE, DITD_TAG, MPI_COMM_WORLD,
                 MPI_STATUS_IGNORE) != MPI_SUCCESS) {
        free(*buf);
        return ditd_err_set(DITD_ECOMM, "MPI_Recv from rank %d", st.MPI_SOURCE);
    }
    *len = (size_t)count;
    if (from)
        *from = st.MPI_SOURCE;
    return 0;
}

static int mpi_recv(ditd_transport *t, uint8_t **buf, size_t *len, int timeout_ms)
{
    double dl = ditd_now_ms() + timeout_ms;
    (void)t;
    for (;;) {
        int err = mpi_probe_recv(0, buf, len, NULL);
        if (err != DITD_ETIMEDOUT || ditd_now_ms() >= dl)
            return err;
        sleep_us(500);
    }
}

int ditd_mpi_transport_new(ditd_transport **out)
{
    ditd_transport *t = calloc(1, sizeof *t);
    if (!t)
        return ditd_err_set(DITD_ENOMEM, "transport");
    t->send = mpi_send;
    t->recv = mpi_recv;
    *out = t;
    return 0;
}

/* A worker's last message: a Heartbeat with ready = false. */
static int is_bye(const uint8_t *buf, size_t len)
{
    int bye = 0;
    if (len > 64) /* a heartbeat is a few bytes; a result is not read here */
        return 0;
    Ditd__Envelope *env = ditd__envelope__unpack(NULL, len, buf);
    if (env) {
        bye = env->msg_case == DITD__ENVELOPE__MSG_HEARTBEAT && !env->heartbeat->ready;
        ditd__envelope__free_unpacked(env, NULL);
    }
    return bye;
}

/* The hub's thread: the only caller of MPI on rank 0 while the hub lives.
 * Starts sends of what the loop queued (MPI_Isend: it never blocks, so a
 * replica blocked sending it a large result is always received), receives
 * what the replicas sent, and naps 0.5 ms when there was nothing to do.
 * After stop: goes on until its sends are done and every replica said bye
 * (or 30 s). */
static void *hub_thread(void *arg)
{
    ditd_hub *h = arg;
    ditd_hub_msg **sent = NULL; /* in flight, with their requests */
    MPI_Request *req = NULL;
    int nsent = 0, cap = 0, byes = 0;
    double stop_at = 0;
    for (;;) {
        int stop, busy = 0;
        ditd_hub_msg *m;
        pthread_mutex_lock(&h->out[0].mu);
        stop = h->stop;
        m = h->out[0].head;
        h->out[0].head = NULL;
        h->out[0].tail = &h->out[0].head;
        pthread_mutex_unlock(&h->out[0].mu);
        while (m) {
            ditd_hub_msg *n = m->next;
            if (nsent == cap) {
                int nc = cap ? 2 * cap : 16;
                ditd_hub_msg **ns = realloc(sent, (size_t)nc * sizeof *ns);
                MPI_Request *nr = ns ? realloc(req, (size_t)nc * sizeof *nr) : NULL;
                if (ns)
                    sent = ns;
                if (nr)
                    req = nr;
                if (!ns || !nr) { /* no memory to track it: send it blocking */
                    MPI_Send(m->buf, (int)m->len, MPI_BYTE, 1 + m->replica * h->group, DITD_TAG,
                             MPI_COMM_WORLD);
                    free(m);
                    m = n;
                    continue;
                }
                cap = nc;
            }
            MPI_Isend(m->buf, (int)m->len, MPI_BYTE, 1 + m->replica * h->group, DITD_TAG,
                      MPI_COMM_WORLD, &req[nsent]);
            sent[nsent++] = m;
            m = n;
            busy = 1;
        }
        for (int i = 0; i < nsent;) {
            int done = 0;
            MPI_Test(&req[i], &done, MPI_STATUS_IGNORE);
            if (!done) {
                i++;
                continue;
            }
            free(sent[i]);
            sent[i] = sent[--nsent];
            req[i] = req[nsent];
        }
        for (int k = 0; k < 64; k++) {
            uint8_t *buf = NULL;
            size_t len = 0;
            int from = 0, r;
            if (mpi_probe_recv(MPI_ANY_SOURCE, &buf, &len, &from))
                break;
            r = (from - 1) / h->group;
            if (r >= 0 && r < h->replicas && !h->bye[r] && is_bye(buf, len)) {
                h->bye[r] = 1;
                byes++;
            }
            ditd_hub_msg *im = msg_new(r, buf, len);
            free(buf);
            if (im)
                msgq_push(&h->in, im);
            busy = 1;
        }
        if (stop) {
            if (stop_at == 0)
                stop_at = ditd_now_ms();
            if (nsent == 0 && byes == h->replicas)
                break;
            if (ditd_now_ms() - stop_at > 30e3) {
                fprintf(stderr, "ditd hub: %d of %d replica(s) did not say bye, %d send(s) "
                        "pending; stopping anyway\n", h->replicas - byes, h->replicas, nsent);
                break; /* what is still in flight is left to MPI_Finalize / the exit */
            }
        }
        if (busy)
            h->wake(h->wake_ud);
        else
            sleep_us(500);
    }
    if (nsent == 0) {
        free(sent);
        free(req);
    }
    return NULL;
}

int ditd_hub_new_mpi(int replicas, int group_size, ditd_hub_wake_fn wake, void *ud,
                     ditd_hub **out)
{
    ditd_hub *h = NULL;
    int err;
    if (group_size < 1 || (long)replicas * group_size + 1 > 1L << 24)
        return ditd_err_set(DITD_EINVAL, "%d replicas of %d ranks", replicas, group_size);
    if ((err = hub_alloc(replicas, wake, ud, 1, &h)))
        return err;
    h->group = group_size;
    if (!(h->bye = calloc((size_t)replicas, sizeof *h->bye))) {
        ditd_hub_free(h);
        return ditd_err_set(DITD_ENOMEM, "hub");
    }
    h->mpi = 1;
    if (pthread_create(&h->thread, NULL, hub_thread, h)) {
        h->mpi = 0; /* no thread to join */
        ditd_hub_free(h);
        return ditd_err_set(DITD_EINTERNAL, "hub thread");
    }
    *out = h;
    return 0;
}

#else

int ditd_mpi_transport_new(ditd_transport **out)
{
    *out = NULL;
    return ditd_err_set(DITD_EUNSUPPORTED, "ditd was built without MPI");
}
int ditd_hub_new_mpi(int replicas, int group_size, ditd_hub_wake_fn wake, void *ud,
                     ditd_hub **out)
{
    (void)replicas, (void)group_size, (void)wake, (void)ud;
    *out = NULL;
    return ditd_err_set(DITD_EUNSUPPORTED, "ditd was built without MPI");
}

#endif

void ditd_hub_free(ditd_hub *h)
{
    if (!h)
        return;
#if DITD_HAVE_MPI
    if (h->mpi) {
        pthread_mutex_lock(&h->out[0].mu);
        h->stop = 1;
        pthread_mutex_unlock(&h->out[0].mu);
        pthread_join(h->thread, NULL);
    }
#endif
    msgq_destroy(&h->in);
    for (int i = 0; i < h->nout; i++)
        msgq_destroy(&h->out[i]);
    free(h->out);
    free(h->ends);
    free(h->bye);
    free(h);
}
