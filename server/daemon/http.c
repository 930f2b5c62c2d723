/* The HTTP edge: our listen socket, libmicrohttpd in the libuv loop, limits
 * and read deadlines (server/daemon/http.h). Loop thread only. */
#include "server/daemon/http.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "engine/core/error.h"
#include "server/daemon/log.h"

static const char *const phase_names[] = {"headers", "body", "busy"};

const char *ditd_http_phase_name(ditd_http_phase p)
{
    return (unsigned)p < DITD_HTTP_PHASE_COUNT ? phase_names[p] : "?";
}

int ditd_http_phase_from_str(const char *s, ditd_http_phase *out)
{
    for (int i = 0; i < DITD_HTTP_PHASE_COUNT; i++)
        if (!strcmp(s, phase_names[i])) {
            *out = (ditd_http_phase)i;
            return 0;
        }
    return DITD_EINVAL;
}

/* A refused or timed-out socket: its short answer is written, our side is
 * shut for writing, and what the client still sends is read away until it
 * closes (or 2 s pass), so that the answer is not lost to a reset. */
typedef struct ditd_http_linger {
    struct ditd_http_linger *next;
    int fd;
    double until;
} ditd_http_linger;

#define LINGER_MAX 4096
#define LINGER_S 2.0

/* ---------------------------------------------------------------- MHD */

static void mhd_run(ditd_http *h);

static void on_mhd_timer(uv_timer_t *t)
{
    mhd_run(t->data);
}

static void on_mhd_poll(uv_poll_t *p, int status, int events)
{
    (void)status;
    (void)events;
    mhd_run(p->data);
}

void ditd_http_kick(ditd_http *h)
{
    if (!h->mhd)
        return;
    h->kicked = 1;
    uv_timer_start(&h->mhd_timer, on_mhd_timer, 0, 0);
}

static void mhd_run(ditd_http *h)
{
    MHD_UNSIGNED_LONG_LONG to;
    if (!h->mhd)
        return;
    h->kicked = 0;
    MHD_run(h->mhd);
    if (h->kicked)
        uv_timer_start(&h->mhd_timer, on_mhd_timer, 0, 0);
    else if (MHD_get_timeout(h->mhd, &to) == MHD_YES)
        uv_timer_start(&h->mhd_timer, on_mhd_timer, to, 0);
    else
        uv_timer_stop(&h->mhd_timer);
}

/* libmicrohttpd's own messages (mostly a client gone mid-answer) join our
 * log, in its format, at debug level: our errors say what matters. */
static void mhd_logger(void *cls, const char *fmt, va_list ap)
{
    char msg[1024];
    (void)cls;
    vsnprintf(msg, sizeof msg, fmt, ap);
    ditd_log(DITD_LOG_DEBUG, "libmicrohttpd: %s", msg);
}

/* ---------------------------------------------------------------- connections */

static void notify_connection(void *cls, struct MHD_Connection *mc, void **socket_context,
                              enum MHD_ConnectionNotificationCode code)
{
    ditd_http *h = cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        ditd_http_conn *c = h->pending;
        h->pending = NULL;
        if (!c)
            return;
        c->mc = mc;
        *socket_context = c;
        return;
    }
    ditd_http_conn *c = *socket_context;
    if (!c)
        return;
    *socket_context = NULL;
    if (c->prev)
        c->prev->next = c->next;
    else
        h->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    h->n_conns--;
    h->n_closing -= c->closing;
    free(c);
}

ditd_http_conn *ditd_http_conn_of(struct MHD_Connection *mc)
{
    const union MHD_ConnectionInfo *ci =
        mc ? MHD_get_connection_info(mc, MHD_CONNECTION_INFO_SOCKET_CONTEXT) : NULL;
    return ci ? ci->socket_context : NULL;
}

void ditd_http_conn_set_phase(ditd_http_conn *c, ditd_http_phase p)
{
    if (!c || c->phase == p)
        return;
    c->phase = p;
    c->t_phase = ditd__now();
}

static void linger_add(ditd_http *h, int fd)
{
    ditd_http_linger *l;
    shutdown(fd, SHUT_WR);
    if (h->n_linger >= LINGER_MAX || !(l = malloc(sizeof *l))) {
        close(fd);
        return;
    }
    l->fd = fd;
    l->until = ditd__now() + LINGER_S;
    l->next = h->linger;
    h->linger = l;
    h->n_linger++;
}

static void linger_sweep(ditd_http *h, int all)
{
    double now = ditd__now();
    char buf[4096];
    for (ditd_http_linger **pp = &h->linger; *pp;) {
        ditd_http_linger *l = *pp;
        ssize_t n = 1;
        int done = all || now >= l->until;
        while (!done && (n = recv(l->fd, buf, sizeof buf, MSG_DONTWAIT)) > 0)
            ;
        if (!done && (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)))
            done = 1;
        if (done) {
            close(l->fd);
            *pp = l->next;
            free(l);
            h->n_linger--;
        } else {
            pp = &l->next;
        }
    }
}

/* A complete HTTP/1.1 answer written straight to a socket that
 * libmicrohttpd has not answered on. Best effort: the socket is
 * non-blocking and the answer small. */
static void raw_answer(int fd, int status, const char *reason, const char *code, const char *msg)
{
    char body[512], head[512];
    int bl = snprintf(body, sizeof body,
                      "{\"error\":{\"message\":\"%s\",\"type\":\"server_error\",\"param\":null,\"code\":\"%s\"}}",
                      msg, code);
    int hl = snprintf(head, sizeof head,
                      "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
                      "Connection: close\r\nServer: ditd/0.1\r\n%s\r\n",
                      status, reason, bl, status == 503 ? "Retry-After: 1\r\n" : "");
    struct iovec iov[2] = {{head, (size_t)hl}, {body, (size_t)bl}};
    struct msghdr mh = {.msg_iov = iov, .msg_iovlen = 2};
    ssize_t w = sendmsg(fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
    (void)w;
}

static void refuse(ditd_http *h, int fd, const char *code, const char *msg)
{
    /* over TLS no plain text can be written before a handshake: close */
    if (h->cfg.tls_cert_pem) {
        close(fd);
        return;
    }
    raw_answer(fd, 503, "Service Unavailable", code, msg);
    linger_add(h, fd);
}

/* Shuts a connection that has not begun an answer: a 408 when it began a
 * request (over TLS none: no plain text), then shutdown(2), which
 * libmicrohttpd sees and closes. */
static void shut_reader(ditd_http *h, ditd_http_conn *c, const char *why)
{
    c->closing = 1;
    h->n_closing++;
    if (!h->cfg.tls_cert_pem && (c->phase == DITD_HTTP_BODY || c->requests == 0))
        raw_answer(c->fd, 408, "Request Timeout", "request_timeout", why);
    shutdown(c->fd, SHUT_RDWR);
}

/* At the limit: the connection that has waited longest for a request's
 * headers (over a second: fresh ones are legitimate clients mid-send), or
 * NULL. */
static ditd_http_conn *oldest_reader(ditd_http *h, double now)
{
    ditd_http_conn *best = NULL;
    for (ditd_http_conn *c = h->conns; c; c = c->next)
        if (!c->closing && c->phase == DITD_HTTP_HEADERS && now - c->t_phase > 1.0 &&
            (!best || c->t_phase < best->t_phase))
            best = c;
    return best;
}

static int per_client(const ditd_http *h, uint32_t ip)
{
    int n = 0;
    for (const ditd_http_conn *c = h->conns; c; c = c->next)
        n += c->peer_ip == ip;
    return n;
}

static void on_listen(uv_poll_t *p, int status, int events)
{
    ditd_http *h = p->data;
    (void)status;
    (void)events;
    for (int k = 0; k < 256 && h->listen_fd >= 0; k++) {
        struct sockaddr_in sa;
        socklen_t sl = sizeof sa;
        int fd = accept4(h->listen_fd, (struct sockaddr *)&sa, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EMFILE || errno == ENFILE) {
                /* out of descriptors: free the reserve to take the client
                 * off the backlog with an answer, then keep it again */
                if (h->reserve_fd >= 0) {
                    close(h->reserve_fd);
                    h->reserve_fd = -1;
                    fd = accept4(h->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
                    if (fd >= 0) {
                        if (!h->cfg.tls_cert_pem)
                            raw_answer(fd, 503, "Service Unavailable", "at_capacity",
                                       "the server is out of file descriptors; retry later");
                        close(fd);
                        h->refused_capacity++;
                    }
                    h->reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
                }
                ditd_log(DITD_LOG_WARN, "accept: out of file descriptors (%d connections open)", h->n_conns);
                return;
            }
            if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR && errno != ECONNABORTED)
                ditd_log(DITD_LOG_WARN, "accept: %s", strerror(errno));
            return;
        }
        if (sa.sin_family != AF_INET) {
            close(fd);
            continue;
        }
        ditd_http_conn *old;
        if (h->n_conns - h->n_closing >= h->cfg.max_connections &&
            (old = oldest_reader(h, ditd__now()))) {
            h->evicted++;
            ditd_log(DITD_LOG_DEBUG, "connection %s: waited %.1f s for headers at the limit; "
                     "closed for a newcomer", old->peer, ditd__now() - old->t_phase);
            shut_reader(h, old, "the server is at its connection limit and this connection "
                                "sent no request in time");
        }
        if (h->n_conns - h->n_closing >= h->cfg.max_connections) {
            h->refused_capacity++;
            refuse(h, fd, "at_capacity",
                   "the server is at its connection limit (--max-connections); retry later");
            continue;
        }
        if (per_client(h, sa.sin_addr.s_addr) >= h->cfg.max_per_client) {
            h->refused_per_client++;
            refuse(h, fd, "too_many_connections",
                   "this client address has too many open connections "
                   "(--max-connections-per-client); reuse them (keep-alive) or retry later");
            continue;
        }
        ditd_http_conn *c = calloc(1, sizeof *c);
        if (!c) {
            close(fd);
            continue;
        }
        char ip[INET_ADDRSTRLEN] = "?";
        inet_ntop(AF_INET, &sa.sin_addr, ip, sizeof ip);
        snprintf(c->peer, sizeof c->peer, "%s:%u", ip, (unsigned)ntohs(sa.sin_port));
        c->fd = fd;
        c->peer_ip = sa.sin_addr.s_addr;
        c->phase = DITD_HTTP_HEADERS;
        c->t_phase = ditd__now();
        c->next = h->conns;
        if (h->conns)
            h->conns->prev = c;
        h->conns = c;
        h->n_conns++;
        h->pending = c;
        if (MHD_add_connection(h->mhd, fd, (const struct sockaddr *)&sa, sl) != MHD_YES) {
            /* libmicrohttpd closed the socket. Without STARTED the record
             * is ours to free; after it, CLOSED frees it (or has) */
            if (h->pending == c) {
                h->pending = NULL;
                if (c->prev)
                    c->prev->next = c->next;
                else
                    h->conns = c->next;
                if (c->next)
                    c->next->prev = c->prev;
                h->n_conns--;
                free(c);
            }
        }
        h->pending = NULL;
    }
    ditd_http_kick(h);
}

/* Closes the readers that passed their deadline. */
static void on_sweep(uv_timer_t *t)
{
    ditd_http *h = t->data;
    double now = ditd__now();
    int shut = 0;
    for (ditd_http_conn *c = h->conns; c; c = c->next) {
        double limit = c->phase == DITD_HTTP_HEADERS ? h->cfg.header_timeout_s
                       : c->phase == DITD_HTTP_BODY  ? h->cfg.body_timeout_s
                                                      : 0;
        if (c->closing || limit <= 0 || now - c->t_phase < limit)
            continue;
        h->read_timeouts++;
        /* a connection idle between requests just closes; one that began a
         * request hears why */
        shut_reader(h, c, c->phase == DITD_HTTP_BODY
                              ? "the request body was not received in time (--body-timeout)"
                              : "the request headers were not received in time (--header-timeout)");
        ditd_log(DITD_LOG_DEBUG, "connection %s: %s deadline passed; closing", c->peer,
                 ditd_http_phase_name(c->phase));
        shut = 1;
    }
    linger_sweep(h, 0);
    if (shut)
        ditd_http_kick(h);
}

/* ---------------------------------------------------------------- start, stop */

static int listen_on(const char *host, int port, int *out_fd, int *out_port)
{
    struct sockaddr_in sa;
    socklen_t sl = sizeof sa;
    int one = 1, fd;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)port);
    if (inet_pton(AF_INET, host, &sa.sin_addr) != 1)
        return ditd_err_set(DITD_EINVAL, "--host %s is not an IPv4 address", host);
    if ((fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0)) < 0)
        return ditd_err_set(DITD_EIO, "socket: %s", strerror(errno));
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) || listen(fd, 1024) ||
        getsockname(fd, (struct sockaddr *)&sa, &sl)) {
        int e = errno;
        close(fd);
        return ditd_err_set(DITD_EIO, "cannot listen on %s:%d: %s", host, port, strerror(e));
    }
    *out_fd = fd;
    *out_port = ntohs(sa.sin_port);
    return 0;
}

int ditd_http_start(ditd_http *h, uv_loop_t *loop, const ditd_http_config *c)
{
    int err;
    unsigned flags = MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG |
                     MHD_USE_NO_LISTEN_SOCKET;
    memset(h, 0, sizeof *h);
    h->cfg = *c;
    h->loop = loop;
    h->listen_fd = -1;
    h->reserve_fd = -1;
    if (c->tls_cert_pem)
        flags |= MHD_USE_TLS;
    if ((err = listen_on(c->host, c->port, &h->listen_fd, &h->port)))
        return err;
    /* libmicrohttpd's own limit is above ours: ours answers first */
    h->mhd = c->tls_cert_pem
        ? MHD_start_daemon(flags, 0, NULL, NULL, c->on_request, c->cls,
                           MHD_OPTION_EXTERNAL_LOGGER, mhd_logger, NULL,
                           MHD_OPTION_NOTIFY_COMPLETED, c->on_completed, c->cls,
                           MHD_OPTION_NOTIFY_CONNECTION, notify_connection, h,
                           MHD_OPTION_CONNECTION_LIMIT, (unsigned)c->max_connections + 16,
                           MHD_OPTION_CONNECTION_TIMEOUT, c->idle_timeout_s,
                           MHD_OPTION_HTTPS_MEM_CERT, c->tls_cert_pem,
                           MHD_OPTION_HTTPS_MEM_KEY, c->tls_key_pem, MHD_OPTION_END)
        : MHD_start_daemon(flags, 0, NULL, NULL, c->on_request, c->cls,
                           MHD_OPTION_EXTERNAL_LOGGER, mhd_logger, NULL,
                           MHD_OPTION_NOTIFY_COMPLETED, c->on_completed, c->cls,
                           MHD_OPTION_NOTIFY_CONNECTION, notify_connection, h,
                           MHD_OPTION_CONNECTION_LIMIT, (unsigned)c->max_connections + 16,
                           MHD_OPTION_CONNECTION_TIMEOUT, c->idle_timeout_s, MHD_OPTION_END);
    if (!h->mhd) {
        close(h->listen_fd);
        h->listen_fd = -1;
        return ditd_err_set(DITD_EINVAL, "libmicrohttpd did not start%s",
                            c->tls_cert_pem ? " (is the TLS certificate or key invalid?)" : "");
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(h->mhd, MHD_DAEMON_INFO_EPOLL_FD);
    h->reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    uv_poll_init(loop, &h->mhd_poll, di->epoll_fd);
    h->mhd_poll.data = h;
    uv_poll_start(&h->mhd_poll, UV_READABLE, on_mhd_poll);
    uv_timer_init(loop, &h->mhd_timer);
    h->mhd_timer.data = h;
    uv_timer_init(loop, &h->sweep);
    h->sweep.data = h;
    uv_timer_start(&h->sweep, on_sweep, 100, 100);
    uv_poll_init(loop, &h->listen_poll, h->listen_fd);
    h->listen_poll.data = h;
    uv_poll_start(&h->listen_poll, UV_READABLE, on_listen);
    mhd_run(h);
    return 0;
}

static void on_listen_closed(uv_handle_t *hd)
{
    ditd_http *h = hd->data;
    if (h->listen_fd >= 0)
        close(h->listen_fd);
    h->listen_fd = -1;
}

void ditd_http_stop_listening(ditd_http *h)
{
    if (h->listen_fd < 0 || uv_is_closing((uv_handle_t *)&h->listen_poll))
        return;
    uv_poll_stop(&h->listen_poll);
    uv_close((uv_handle_t *)&h->listen_poll, on_listen_closed);
}

void ditd_http_stop(ditd_http *h)
{
    if (!h->mhd)
        return;
    ditd_http_stop_listening(h);
    uv_poll_stop(&h->mhd_poll);
    MHD_run(h->mhd);
    MHD_stop_daemon(h->mhd);
    h->mhd = NULL;
    linger_sweep(h, 1);
    if (h->reserve_fd >= 0)
        close(h->reserve_fd);
    h->reserve_fd = -1;
    uv_close((uv_handle_t *)&h->mhd_poll, NULL);
    uv_close((uv_handle_t *)&h->mhd_timer, NULL);
    uv_close((uv_handle_t *)&h->sweep, NULL);
}
