/* The HTTP edge of `ditd serve`: libmicrohttpd driven by the libuv loop, and
 * the connections as the front-end guards them.
 *
 * ditd owns the listening socket (libmicrohttpd gets MHD_USE_NO_LISTEN_SOCKET
 * and each accepted socket through MHD_add_connection), so that:
 *   - the listen socket is always armed: a connection over the limits is
 *     accepted and answered at once with a short 503 and closed, never left
 *     in the backlog, and the next one is served as soon as a slot frees;
 *   - at --max-connections, a newcomer first takes the place of the
 *     connection that has waited longest (over a second) for a request's
 *     headers, idle or trickling: slow clients cannot hold every slot;
 *   - a client address holds at most --max-connections-per-client sockets;
 *   - reading a request has total deadlines: the headers (counted from the
 *     accept, or from the end of the previous request on a kept-alive
 *     connection) within --header-timeout, the body within --body-timeout;
 *     a byte does not reset them. A laggard gets 408 and is closed from a
 *     uv_timer (shutdown(2) on its socket, which libmicrohttpd then sees).
 * With --tls-cert/--tls-key libmicrohttpd speaks TLS (GnuTLS) on the same
 * sockets.
 *
 * libmicrohttpd runs without threads of its own (MHD_USE_EPOLL, external
 * polling): its epoll fd sits in a uv_poll, its timeout in a uv_timer, so
 * every callback runs on the loop thread. Not the routes (routes.c): the
 * request and completion callbacks are handed in at start. */
#ifndef DITD_SERVER_HTTP_H
#define DITD_SERVER_HTTP_H

#include <microhttpd.h>
#include <stdint.h>
#include <uv.h>

typedef enum ditd_http_phase {
    DITD_HTTP_HEADERS = 0,  /* reading a request's headers (or idle between requests) */
    DITD_HTTP_BODY,         /* reading its body */
    DITD_HTTP_BUSY,         /* read: handled, waiting or answering (no read deadline) */
} ditd_http_phase;
#define DITD_HTTP_PHASE_COUNT 3
const char *ditd_http_phase_name(ditd_http_phase p);
int ditd_http_phase_from_str(const char *s, ditd_http_phase *out);

/* One client connection, from accept to close. The request fields describe
 * the request in progress (HTTP/1.1: one at a time per connection) and are
 * filled by the routes. */
typedef struct ditd_http_conn {
    struct ditd_http_conn *prev, *next;
    struct MHD_Connection *mc;
    int fd;
    uint32_t peer_ip;         /* IPv4, network order */
    char peer[48];            /* "a.b.c.d:port" */
    ditd_http_phase phase;
    double t_phase;           /* when the phase began */
    int closing;              /* a deadline passed: shut down */
    uint64_t requests;
    /* the request in progress */
    double t_req;
    char method[16];
    char path[160];
    char rid[80];
    int route;                /* ditd_route */
    int status;               /* the status queued (0: none yet) */
    uint64_t bytes;           /* response body bytes */
} ditd_http_conn;

typedef struct ditd_http_config {
    const char *host;
    int port;                     /* 0: any free port */
    int max_connections;
    int max_per_client;
    double header_timeout_s;
    double body_timeout_s;
    unsigned idle_timeout_s;      /* libmicrohttpd's inactivity timeout */
    const char *tls_cert_pem;     /* both or neither; borrowed until stop */
    const char *tls_key_pem;
    MHD_AccessHandlerCallback on_request;
    MHD_RequestCompletedCallback on_completed;
    void *cls;
} ditd_http_config;

typedef struct ditd_http {
    ditd_http_config cfg;
    uv_loop_t *loop;
    struct MHD_Daemon *mhd;
    int port;                     /* the bound port */
    int listen_fd;                /* -1 once closed */
    uv_poll_t listen_poll;
    uv_poll_t mhd_poll;
    uv_timer_t mhd_timer;
    uv_timer_t sweep;             /* deadlines and lingering refusals */
    int kicked;
    int reserve_fd;               /* kept for accept(2) under EMFILE */
    ditd_http_conn *conns;
    int n_conns;
    int n_closing;                /* of them, shut and waiting for libmicrohttpd */
    ditd_http_conn *pending;      /* the one MHD_add_connection is adding */
    struct ditd_http_linger *linger;
    int n_linger;
    /* counters for /metrics */
    uint64_t refused_capacity, refused_per_client, read_timeouts, evicted;
} ditd_http;

/* Binds, listens and starts libmicrohttpd in the loop. 0, or DITD_EIO /
 * DITD_EINVAL with a detail (address in use, bad certificate). */
int ditd_http_start(ditd_http *h, uv_loop_t *loop, const ditd_http_config *c);
/* Stops accepting (the listen socket closes); connections stay. */
void ditd_http_stop_listening(ditd_http *h);
/* Stops libmicrohttpd (every suspended connection must have been resumed)
 * and closes the handles. */
void ditd_http_stop(ditd_http *h);
/* Runs libmicrohttpd soon (after a resume), outside its callbacks. */
void ditd_http_kick(ditd_http *h);

/* The connection of a libmicrohttpd connection (NULL if unknown). */
ditd_http_conn *ditd_http_conn_of(struct MHD_Connection *mc);
void ditd_http_conn_set_phase(ditd_http_conn *c, ditd_http_phase p);

#endif
