/* Webhooks (server/daemon/webhook.h): a queue the loop fills and a thread
 * that delivers it over HTTP/1.1, plain or through TLS (GnuTLS, the
 * receiver's certificate checked against the system's roots or
 * --webhook-ca, and its name against the URL's host), signed as Standard
 * Webhooks. */
#include "server/daemon/webhook.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <gnutls/crypto.h>
#include <gnutls/gnutls.h>

#include "engine/core/error.h"
#include "server/daemon/log.h"

#define HOOK_TIMEOUT_MS 10000
#define HOOK_ATTEMPTS 6 /* the first, then after 1, 2, 4, 8, 16 s */

typedef struct hook_ev {
    struct hook_ev *next;
    char id[32];       /* evt_ + 24 hex */
    char *body;        /* the event JSON, owned */
} hook_ev;

struct ditd_webhook {
    char host[256], port[8], path[1024];
    int tls;                              /* https:// */
    gnutls_certificate_credentials_t cred; /* tls: the roots the receiver is checked against */
    uint8_t key[256];
    size_t key_len;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    hook_ev *head, **tail;
    int stop;
    unsigned long long delivered, failed, dropped;
};

/* http[s]://HOST[:PORT][/PATH] into w. */
static int parse_url(ditd_webhook *w, const char *url)
{
    const char *p, *slash, *colon;
    size_t hl;
    if (!strncmp(url, "https://", 8))
        w->tls = 1;
    else if (strncmp(url, "http://", 7))
        return ditd_err_set(DITD_EINVAL, "--webhook-url %s: not an http:// or https:// URL", url);
    p = url + (w->tls ? 8 : 7);
    slash = strchr(p, '/');
    hl = slash ? (size_t)(slash - p) : strlen(p);
    colon = memchr(p, ':', hl);
    size_t name = colon ? (size_t)(colon - p) : hl;
    if (name == 0 || name >= sizeof w->host || memchr(p, '@', hl) || memchr(p, '?', hl) ||
        memchr(p, '#', hl))
        return ditd_err_set(DITD_EINVAL, "--webhook-url %s: a bad host", url);
    memcpy(w->host, p, name);
    w->host[name] = '\0';
    snprintf(w->port, sizeof w->port, w->tls ? "443" : "80");
    if (colon) {
        size_t pl = hl - name - 1;
        long v = 0;
        for (size_t i = 0; i < pl; i++) {
            if (colon[1 + i] < '0' || colon[1 + i] > '9' || pl > 5)
                return ditd_err_set(DITD_EINVAL, "--webhook-url %s: a bad port", url);
            v = v * 10 + (colon[1 + i] - '0');
        }
        if (pl == 0 || v < 1 || v > 65535)
            return ditd_err_set(DITD_EINVAL, "--webhook-url %s: a bad port", url);
        snprintf(w->port, sizeof w->port, "%ld", v);
    }
    snprintf(w->path, sizeof w->path, "%s", slash ? slash : "/");
    if (strlen(slash ? slash : "/") >= sizeof w->path || strpbrk(w->path, " \r\n"))
        return ditd_err_set(DITD_EINVAL, "--webhook-url %s: a bad path", url);
    return 0;
}

static int parse_secret(ditd_webhook *w, const char *secret)
{
    gnutls_datum_t in, out = {NULL, 0};
    if (strncmp(secret, "whsec_", 6))
        return ditd_err_set(DITD_EINVAL, "--webhook-secret: a whsec_ secret (whsec_ and base64, "
                            "as OpenAI issues them) is needed with --webhook-url");
    in.data = (unsigned char *)secret + 6;
    in.size = (unsigned)strlen(secret + 6);
    if (gnutls_base64_decode2(&in, &out) < 0 || out.size < 16 || out.size > sizeof w->key) {
        gnutls_free(out.data);
        return ditd_err_set(DITD_EINVAL, "--webhook-secret: after whsec_, base64 of 16..256 bytes");
    }
    memcpy(w->key, out.data, out.size);
    w->key_len = out.size;
    gnutls_free(out.data);
    return 0;
}

/* The roots a TLS receiver is checked against: ca_file (PEM), else the
 * system's. */
static int open_cred(ditd_webhook *w, const char *ca_file)
{
    int n;
    if (gnutls_certificate_allocate_credentials(&w->cred) < 0)
        return ditd_err_set(DITD_ENOMEM, "webhook TLS credentials");
    n = ca_file && *ca_file
            ? gnutls_certificate_set_x509_trust_file(w->cred, ca_file, GNUTLS_X509_FMT_PEM)
            : gnutls_certificate_set_x509_system_trust(w->cred);
    if (n <= 0) {
        gnutls_certificate_free_credentials(w->cred);
        w->cred = NULL;
        if (ca_file && *ca_file)
            return ditd_err_set(DITD_EINVAL, "--webhook-ca %s: no certificate read (%s)", ca_file,
                                n < 0 ? gnutls_strerror(n) : "empty");
        return ditd_err_set(DITD_EINVAL, "--webhook-url https://...: the system has no trusted "
                            "roots (%s); give --webhook-ca FILE",
                            n < 0 ? gnutls_strerror(n) : "none found");
    }
    return 0;
}

/* A connected socket to the receiver (blocking, each read and write
 * bounded by HOOK_TIMEOUT_MS), or -1. */
static int dial(const ditd_webhook *w)
{
    struct addrinfo hints, *res = NULL;
    int fd = -1;
    memset(&hints, 0, sizeof hints);
    hints.ai_socktype = SOCK_STREAM;
    if (getaddrinfo(w->host, w->port, &hints, &res))
        return -1;
    for (struct addrinfo *a = res; a && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
        if (fd < 0)
            continue;
        if (connect(fd, a->ai_addr, a->ai_addrlen) && errno != EINPROGRESS) {
            close(fd);
            fd = -1;
            continue;
        }
        struct pollfd pf = {fd, POLLOUT, 0};
        int soerr = 0;
        socklen_t sl = sizeof soerr;
        if (poll(&pf, 1, HOOK_TIMEOUT_MS) != 1 || getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) ||
            soerr) {
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(res);
    if (fd >= 0) {
        struct timeval tv = {HOOK_TIMEOUT_MS / 1000, 0};
        int fl = fcntl(fd, F_GETFL);
        if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) ||
            setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) ||
            setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv)) {
            close(fd);
            fd = -1;
        }
    }
    return fd;
}

/* One connection to the receiver: the socket, and the TLS session over it
 * for https://. */
typedef struct conn {
    int fd;
    gnutls_session_t tls;
} conn;

/* Whether host is an IP literal (no SNI then: RFC 6066). */
static int is_ip(const char *host)
{
    unsigned char buf[16];
    return inet_pton(AF_INET, host, buf) == 1 || inet_pton(AF_INET6, host, buf) == 1;
}

/* Opens c to w's receiver: 0, or -1 (logged once per attempt at debug). */
static int conn_open(const ditd_webhook *w, conn *c)
{
    int r;
    c->tls = NULL;
    if ((c->fd = dial(w)) < 0)
        return -1;
    if (!w->tls)
        return 0;
    if (gnutls_init(&c->tls, GNUTLS_CLIENT) < 0)
        goto fail;
    if (gnutls_set_default_priority(c->tls) < 0 ||
        gnutls_credentials_set(c->tls, GNUTLS_CRD_CERTIFICATE, w->cred) < 0 ||
        (!is_ip(w->host) &&
         gnutls_server_name_set(c->tls, GNUTLS_NAME_DNS, w->host, strlen(w->host)) < 0))
        goto fail;
    /* the chain against the roots, and the certificate's names against the host */
    gnutls_session_set_verify_cert(c->tls, w->host, 0);
    gnutls_transport_set_int(c->tls, c->fd);
    gnutls_handshake_set_timeout(c->tls, HOOK_TIMEOUT_MS);
    do
        r = gnutls_handshake(c->tls);
    while (r < 0 && !gnutls_error_is_fatal(r));
    if (r < 0) {
        ditd_log(DITD_LOG_WARN, "webhook to https://%s:%s: TLS: %s", w->host, w->port,
                 gnutls_strerror(r));
        goto fail;
    }
    return 0;
fail:
    if (c->tls)
        gnutls_deinit(c->tls);
    c->tls = NULL;
    close(c->fd);
    c->fd = -1;
    return -1;
}

static void conn_close(conn *c)
{
    if (c->tls) {
        gnutls_bye(c->tls, GNUTLS_SHUT_WR);
        gnutls_deinit(c->tls);
    }
    if (c->fd >= 0)
        close(c->fd);
}

/* Whether a failed call m of c may be tried again: EINTR, or GnuTLS's
 * E_INTERRUPTED / E_AGAIN (which it answers on a blocking socket too: a
 * TLS 1.3 session ticket read and no data yet, or the socket's timeout),
 * until HOOK_TIMEOUT_MS have passed since t0. */
static int again(const conn *c, ssize_t m, const struct timespec *t0)
{
    struct timespec t;
    if (!(c->tls ? m == GNUTLS_E_INTERRUPTED || m == GNUTLS_E_AGAIN : errno == EINTR))
        return 0;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (t.tv_sec - t0->tv_sec) * 1000L + (t.tv_nsec - t0->tv_nsec) / 1000000L <
           HOOK_TIMEOUT_MS;
}

/* All of buf: 0, or -1 (an error, or HOOK_TIMEOUT_MS without progress). */
static int conn_send(conn *c, const char *buf, size_t len)
{
    struct timespec t0;
    size_t off = 0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    while (off < len) {
        ssize_t m = c->tls ? gnutls_record_send(c->tls, buf + off, len - off)
                           : send(c->fd, buf + off, len - off, MSG_NOSIGNAL);
        if (m < 0 && again(c, m, &t0))
            continue;
        if (m <= 0)
            return -1;
        off += (size_t)m;
        clock_gettime(CLOCK_MONOTONIC, &t0);
    }
    return 0;
}

/* Up to len bytes: how many, 0 at the end, -1 on an error or a timeout. */
static ssize_t conn_recv(conn *c, char *buf, size_t len)
{
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        ssize_t m = c->tls ? gnutls_record_recv(c->tls, buf, len) : recv(c->fd, buf, len, 0);
        if (m >= 0)
            return m;
        if (!again(c, m, &t0))
            return -1;
    }
}

/* One attempt: 0 on a 2xx answer; the status (or -1) otherwise. */
static int post(ditd_webhook *w, const hook_ev *e)
{
    char ts[24], head[2048], sig[128];
    long long now = (long long)time(NULL);
    size_t blen = strlen(e->body);
    snprintf(ts, sizeof ts, "%lld", now);
    /* the signed content: id "." timestamp "." body */
    size_t sl = strlen(e->id) + strlen(ts) + blen + 2;
    char *signed_ = malloc(sl + 1);
    uint8_t mac[32];
    if (!signed_)
        return -1;
    snprintf(signed_, sl + 1, "%s.%s.%s", e->id, ts, e->body);
    int bad = gnutls_hmac_fast(GNUTLS_MAC_SHA256, w->key, w->key_len, signed_, sl, mac);
    free(signed_);
    gnutls_datum_t md = {mac, sizeof mac}, b64 = {NULL, 0};
    if (bad || gnutls_base64_encode2(&md, &b64) < 0)
        return -1;
    snprintf(sig, sizeof sig, "v1,%.*s", (int)b64.size, (const char *)b64.data);
    gnutls_free(b64.data);
    int status = -1;
    int n = snprintf(head, sizeof head,
                     "POST %s HTTP/1.1\r\nHost: %s:%s\r\nUser-Agent: ditd\r\n"
                     "Content-Type: application/json\r\nContent-Length: %zu\r\n"
                     "webhook-id: %s\r\nwebhook-timestamp: %s\r\nwebhook-signature: %s\r\n"
                     "Connection: close\r\n\r\n",
                     w->path, w->host, w->port, blen, e->id, ts, sig);
    conn c;
    if (conn_open(w, &c))
        return -1;
    if (conn_send(&c, head, (size_t)n) || conn_send(&c, e->body, blen))
        goto done;
    /* the status line is all we read */
    char resp[64];
    size_t got = 0;
    while (got < sizeof resp - 1 && !memchr(resp, '\n', got)) {
        ssize_t m = conn_recv(&c, resp + got, sizeof resp - 1 - got);
        if (m <= 0)
            break;
        got += (size_t)m;
    }
    resp[got] = '\0';
    if (!strncmp(resp, "HTTP/1.", 7) && got >= 12)
        status = atoi(resp + 9);
done:
    conn_close(&c);
    return status >= 200 && status < 300 ? 0 : status;
}

static void *deliver(void *arg)
{
    ditd_webhook *w = arg;
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (!w->head && !w->stop)
            pthread_cond_wait(&w->cv, &w->mu);
        if (!w->head)
            break;
        hook_ev *e = w->head;
        int ok = 0, last = -1;
        for (int a = 0; a < HOOK_ATTEMPTS && !ok && !w->stop; a++) {
            if (a > 0) { /* backoff 1, 2, 4, 8, 16 s; a stop cuts it short */
                struct timespec until;
                clock_gettime(CLOCK_REALTIME, &until);
                until.tv_sec += 1 << (a - 1);
                while (!w->stop && pthread_cond_timedwait(&w->cv, &w->mu, &until) != ETIMEDOUT)
                    ;
                if (w->stop)
                    break;
            }
            pthread_mutex_unlock(&w->mu);
            last = post(w, e);
            pthread_mutex_lock(&w->mu);
            ok = last == 0;
            if (!ok)
                w->failed++;
        }
        w->head = e->next;
        if (!w->head)
            w->tail = &w->head;
        if (ok) {
            w->delivered++;
        } else {
            w->dropped++;
            ditd_log(DITD_LOG_WARN, "webhook %s to %s://%s:%s%s dropped (%s, last answer %d)", e->id,
                     w->tls ? "https" : "http", w->host, w->port, w->path,
                     w->stop ? "the server stops" : "6 attempts", last);
        }
        free(e->body);
        free(e);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

int ditd_webhook_open(const char *url, const char *secret, const char *ca_file,
                      ditd_webhook **out)
{
    ditd_webhook *w;
    int err;
    *out = NULL;
    if (!url || !*url) {
        if (secret && *secret)
            return ditd_err_set(DITD_EINVAL, "--webhook-secret without --webhook-url");
        if (ca_file && *ca_file)
            return ditd_err_set(DITD_EINVAL, "--webhook-ca without --webhook-url");
        return 0;
    }
    if (!(w = calloc(1, sizeof *w)))
        return ditd_err_set(DITD_ENOMEM, "webhooks");
    if ((err = parse_url(w, url)) || (err = parse_secret(w, secret ? secret : ""))) {
        free(w);
        return err;
    }
    if (!w->tls && ca_file && *ca_file) {
        free(w);
        return ditd_err_set(DITD_EINVAL, "--webhook-ca with an http:// --webhook-url");
    }
    if (w->tls && (err = open_cred(w, ca_file))) {
        free(w);
        return err;
    }
    w->tail = &w->head;
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    if (pthread_create(&w->thread, NULL, deliver, w)) {
        pthread_mutex_destroy(&w->mu);
        pthread_cond_destroy(&w->cv);
        if (w->cred)
            gnutls_certificate_free_credentials(w->cred);
        free(w);
        return ditd_err_set(DITD_ENOMEM, "the webhook thread");
    }
    *out = w;
    return 0;
}

void ditd_webhook_close(ditd_webhook *w)
{
    if (!w)
        return;
    pthread_mutex_lock(&w->mu);
    w->stop = 1;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    pthread_join(w->thread, NULL);
    for (hook_ev *e = w->head, *n; e; e = n) {
        n = e->next;
        ditd_log(DITD_LOG_WARN, "webhook %s dropped: the server stops", e->id);
        free(e->body);
        free(e);
    }
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
    if (w->cred)
        gnutls_certificate_free_credentials(w->cred);
    free(w);
}

void ditd_webhook_emit(ditd_webhook *w, const char *type, const char *object_id)
{
    uint8_t rnd[12];
    hook_ev *e;
    if (!w || !(e = calloc(1, sizeof *e)))
        return;
    if (gnutls_rnd(GNUTLS_RND_NONCE, rnd, sizeof rnd))
        memset(rnd, 0, sizeof rnd);
    int n = snprintf(e->id, sizeof e->id, "evt_");
    for (size_t i = 0; i < sizeof rnd; i++)
        n += snprintf(e->id + n, sizeof e->id - (size_t)n, "%02x", rnd[i]);
    size_t cap = strlen(object_id) + strlen(type) + 160;
    if (!(e->body = malloc(cap))) {
        free(e);
        return;
    }
    /* type and id are ditd's own ASCII (no escaping needed) */
    snprintf(e->body, cap,
             "{\"id\":\"%s\",\"object\":\"event\",\"created_at\":%lld,\"type\":\"%s\","
             "\"data\":{\"id\":\"%s\"}}",
             e->id, (long long)time(NULL), type, object_id);
    pthread_mutex_lock(&w->mu);
    *w->tail = e;
    w->tail = &e->next;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

void ditd_webhook_counts(ditd_webhook *w, unsigned long long *delivered,
                         unsigned long long *failed_attempts, unsigned long long *dropped)
{
    *delivered = *failed_attempts = *dropped = 0;
    if (!w)
        return;
    pthread_mutex_lock(&w->mu);
    *delivered = w->delivered;
    *failed_attempts = w->failed;
    *dropped = w->dropped;
    pthread_mutex_unlock(&w->mu);
}
