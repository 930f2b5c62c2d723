/* ditd-launch: the small process-control pieces a container needs around
 * `ditd serve`, so that images and pods need no shell, no sshd and no curl.
 *
 *   ditd-launch run [--lws-slots S] -- CMD...
 *       PID 1 of a container: runs CMD (ditd serve, or mpirun ... ditd serve),
 *       reaps orphans, and turns SIGTERM/SIGINT into a SIGTERM for MPI rank 0
 *       (the front-end, which drains) instead of for mpirun (which would
 *       abort the job). Exits with CMD's status. With --lws-slots it first
 *       writes an Open MPI hostfile for a LeaderWorkerSet group (leader
 *       first, S+1 slots: rank 0 + S ranks; each worker S slots) from
 *       LWS_LEADER_ADDRESS and LWS_GROUP_SIZE, and points mpirun at it.
 *   ditd-launch hostfile --slots S
 *       prints that hostfile (to check a group's layout).
 *   ditd-launch agent [--listen ADDR] [--port P]
 *       a worker pod's main process: runs the commands mpirun's launcher
 *       sends (Open MPI's orted) for clients holding the shared token.
 *       SIGTERM waits for the commands it runs: the leader ends them.
 *   ditd-launch rsh HOST WORD...
 *       Open MPI's plm_rsh_agent on the leader, in place of ssh: sends the
 *       words (one command line, as ssh would) to HOST's agent, relays the
 *       output, exits with the remote status.
 *   ditd-launch probe [PATH]
 *       HTTP GET http://127.0.0.1:$DITD_PORT PATH (default /healthz): exit 0
 *       on a 2xx answer, 1 otherwise. The image's HEALTHCHECK.
 *
 * The token is the first line of the file $DITD_LAUNCH_TOKEN_FILE (a
 * Kubernetes Secret); the agent refuses to start without one. The port is
 * --port, else $DITD_LAUNCH_PORT, else 7070. Not a general remote shell: one
 * command per connection, stdin closed, stdout and stderr merged.
 *
 * Wire format, after the client sends "TOKEN\nCOMMAND\n": frames of one
 * byte kind ('o' output, 'x' exit status), four bytes big-endian length,
 * then the payload (for 'x': the status as a decimal string). */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_CMD 65536

static volatile sig_atomic_t got_term;
static void on_term(int sig)
{
    (void)sig;
    got_term++;
}

static void usage(void)
{
    fprintf(stderr, "usage: ditd-launch run [--lws-slots S] -- CMD...\n"
                    "       ditd-launch hostfile --slots S\n"
                    "       ditd-launch agent [--listen ADDR] [--port P]\n"
                    "       ditd-launch rsh HOST WORD...\n"
                    "       ditd-launch probe [PATH]\n");
}

static int write_all(int fd, const void *p, size_t n)
{
    const char *c = p;
    while (n) {
        ssize_t w = write(fd, c, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        c += w;
        n -= (size_t)w;
    }
    return 0;
}

static int read_all(int fd, void *p, size_t n)
{
    char *c = p;
    while (n) {
        ssize_t r = read(fd, c, n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return -1;
        c += r;
        n -= (size_t)r;
    }
    return 0;
}

static int port_of(const char *opt)
{
    const char *p = opt ? opt : getenv("DITD_LAUNCH_PORT");
    int v = p ? atoi(p) : 7070;
    return v > 0 && v < 65536 ? v : -1;
}

/* The token: the first line of $DITD_LAUNCH_TOKEN_FILE, at least 16 bytes. */
static int read_token(char *out, size_t cap)
{
    const char *path = getenv("DITD_LAUNCH_TOKEN_FILE");
    FILE *f;
    if (!path || !*path) {
        fprintf(stderr, "ditd-launch: DITD_LAUNCH_TOKEN_FILE is not set (a file with a shared secret)\n");
        return -1;
    }
    if (!(f = fopen(path, "r")) || !fgets(out, (int)cap, f)) {
        fprintf(stderr, "ditd-launch: cannot read the token from %s: %s\n", path, strerror(errno));
        if (f)
            fclose(f);
        return -1;
    }
    fclose(f);
    out[strcspn(out, "\r\n")] = 0;
    if (strlen(out) < 16) {
        fprintf(stderr, "ditd-launch: the token in %s is shorter than 16 characters\n", path);
        return -1;
    }
    return 0;
}

/* ------------------------------------------------------------------ */
/* hostfile                                                            */

/* LWS names pods <lws>-<group> (the leader) and <lws>-<group>-<i>
 * (workers), all in the subdomain the leader's address carries:
 * LWS_LEADER_ADDRESS=ditd-0.ditd.ns -> worker i is ditd-0-i.ditd.ns. */
static int lws_hostfile(FILE *out, int slots)
{
    const char *leader = getenv("LWS_LEADER_ADDRESS"), *size_s = getenv("LWS_GROUP_SIZE");
    int size = size_s ? atoi(size_s) : 0;
    if (!leader || !*leader || size < 1) {
        fprintf(stderr, "ditd-launch: LWS_LEADER_ADDRESS and LWS_GROUP_SIZE (>= 1) are needed "
                        "(set by LeaderWorkerSet)\n");
        return -1;
    }
    if (slots < 1) {
        fprintf(stderr, "ditd-launch: --slots must be >= 1\n");
        return -1;
    }
    size_t first = strcspn(leader, ".");
    fprintf(out, "%s slots=%d\n", leader, slots + 1);
    for (int i = 1; i < size; i++)
        fprintf(out, "%.*s-%d%s slots=%d\n", (int)first, leader, i, leader + first, slots);
    return 0;
}

/* ------------------------------------------------------------------ */
/* run                                                                 */

/* Whether pid's environment holds OMPI_COMM_WORLD_RANK=0 (Open MPI puts
 * the rank in every rank's environment). */
static int is_rank0(pid_t pid)
{
    static char buf[1 << 16];
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/environ", (int)pid);
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    for (ssize_t i = 0; n > 0 && i < n;) {
        const char *v = buf + i;
        size_t len = strnlen(v, (size_t)(n - i));
        if (len == 22 && !memcmp(v, "OMPI_COMM_WORLD_RANK=0", 22))
            return 1;
        i += (ssize_t)len + 1;
    }
    return 0;
}

/* The pid of MPI rank 0 among the descendants of root (mpirun), or 0.
 * Only descendants: another job's rank 0 on the same machine is not ours. */
static pid_t find_rank0(pid_t root)
{
    enum { MAXP = 1 << 16 };
    static pid_t pid[MAXP], ppid[MAXP];
    static unsigned char mine[MAXP];
    int n = 0;
    DIR *d = opendir("/proc");
    struct dirent *e;
    while (d && n < MAXP && (e = readdir(d))) {
        char path[64], line[512];
        pid_t p = (pid_t)atoi(e->d_name);
        if (p <= 0)
            continue;
        snprintf(path, sizeof path, "/proc/%d/stat", (int)p);
        FILE *f = fopen(path, "r");
        if (!f)
            continue;
        char *close_paren = fgets(line, sizeof line, f) ? strrchr(line, ')') : NULL;
        fclose(f);
        int pp;
        if (!close_paren || sscanf(close_paren + 1, " %*c %d", &pp) != 1)
            continue;
        pid[n] = p;
        ppid[n] = (pid_t)pp;
        mine[n] = p == root;
        n++;
    }
    if (d)
        closedir(d);
    for (int changed = 1; changed;) { /* mark descendants until nothing changes */
        changed = 0;
        for (int i = 0; i < n; i++) {
            if (mine[i])
                continue;
            for (int j = 0; j < n; j++) {
                if (mine[j] && pid[j] == ppid[i]) {
                    mine[i] = 1;
                    changed = 1;
                    break;
                }
            }
        }
    }
    for (int i = 0; i < n; i++)
        if (mine[i] && is_rank0(pid[i]))
            return pid[i];
    return 0;
}

static int cmd_run(int argc, char **argv)
{
    int slots = 0, i = 0;
    for (; i < argc && strcmp(argv[i], "--"); i++) {
        if (!strcmp(argv[i], "--lws-slots") && i + 1 < argc)
            slots = atoi(argv[++i]);
        else {
            usage();
            return 2;
        }
    }
    if (i + 1 >= argc) {
        usage();
        return 2;
    }
    char **cmd = argv + i + 1;
    if (slots) {
        const char *dir = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
        char path[512];
        snprintf(path, sizeof path, "%s/ditd-hostfile", dir);
        FILE *f = fopen(path, "w");
        if (!f) {
            fprintf(stderr, "ditd-launch: %s: %s\n", path, strerror(errno));
            return 1;
        }
        int bad = lws_hostfile(f, slots);
        fclose(f);
        if (bad)
            return 1;
        setenv("OMPI_MCA_orte_default_hostfile", path, 1);
    }

    struct sigaction sa = {.sa_handler = on_term};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    pid_t child = fork();
    if (child < 0) {
        perror("ditd-launch: fork");
        return 1;
    }
    if (child == 0) {
        signal(SIGTERM, SIG_DFL);
        signal(SIGINT, SIG_DFL);
        execvp(cmd[0], cmd);
        fprintf(stderr, "ditd-launch: %s: %s\n", cmd[0], strerror(errno));
        _exit(127);
    }
    int forwarded = 0;
    for (;;) {
        int st;
        pid_t p = waitpid(-1, &st, 0); /* PID 1 reaps orphans too */
        if (p == child)
            return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        if (p < 0 && errno != EINTR)
            return 1;
        while (forwarded < got_term) {
            /* the front-end drains on SIGTERM; mpirun would abort the job.
             * Without MPI (or before rank 0 exists) the child gets it. */
            pid_t r0 = find_rank0(child);
            pid_t to = r0 ? r0 : child;
            fprintf(stderr, "ditd-launch: SIGTERM -> %s (pid %d)\n", r0 ? "MPI rank 0" : cmd[0], (int)to);
            kill(to, SIGTERM);
            forwarded++;
        }
    }
}

/* ------------------------------------------------------------------ */
/* agent (worker pods) and rsh (the leader's plm_rsh_agent)            */

static int send_frame(int fd, char kind, const void *p, uint32_t n)
{
    unsigned char h[5] = {(unsigned char)kind, (unsigned char)(n >> 24), (unsigned char)(n >> 16),
                          (unsigned char)(n >> 8), (unsigned char)n};
    return write_all(fd, h, 5) || (n && write_all(fd, p, n)) ? -1 : 0;
}

/* Reads one line (up to cap-1 bytes) byte by byte: the command follows. */
static int read_line(int fd, char *out, size_t cap)
{
    size_t k = 0;
    while (k + 1 < cap) {
        char c;
        if (read_all(fd, &c, 1))
            return -1;
        if (c == '\n') {
            out[k] = 0;
            return 0;
        }
        out[k++] = c;
    }
    return -1;
}

/* Token comparison in time independent of where the strings differ. */
static int same_token(const char *a, const char *b)
{
    size_t na = strlen(a), nb = strlen(b);
    unsigned char d = (unsigned char)(na != nb);
    for (size_t i = 0; i < na && i < nb; i++)
        d |= (unsigned char)(a[i] ^ b[i]);
    return d == 0;
}

/* One connection, in its own process: check the token, run the command
 * under /bin/sh (as sshd would), relay its output, send its status. A
 * client that goes away takes the command's process group with it. */
static void serve_conn(int fd, const char *token)
{
    static char cmd[MAX_CMD];
    char tok[256];
    int pipefd[2];
    struct timeval tv = {10, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    if (read_line(fd, tok, sizeof tok) || !same_token(tok, token)) {
        fprintf(stderr, "ditd-launch agent: a client with a wrong token\n");
        send_frame(fd, 'x', "126", 3);
        return;
    }
    if (read_line(fd, cmd, sizeof cmd))
        return;
    tv.tv_sec = 0;
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    if (pipe(pipefd))
        return;
    pid_t pid = fork();
    if (pid == 0) {
        int null = open("/dev/null", O_RDONLY);
        setpgid(0, 0);
        dup2(null, 0);
        dup2(pipefd[1], 1);
        dup2(pipefd[1], 2);
        close(pipefd[0]);
        close(pipefd[1]);
        close(fd);
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    close(pipefd[1]);
    if (pid < 0)
        return;
    setpgid(pid, pid);
    struct pollfd pf[2] = {{.fd = pipefd[0], .events = POLLIN}, {.fd = fd, .events = POLLIN}};
    char buf[16384];
    int out_open = 1;
    while (out_open) {
        if (poll(pf, 2, -1) < 0) {
            if (errno == EINTR)
                continue;
            break;
        }
        if (pf[1].revents) { /* the client sent nothing more: it is gone */
            kill(-pid, SIGKILL);
            break;
        }
        if (pf[0].revents) {
            ssize_t n = read(pipefd[0], buf, sizeof buf);
            if (n <= 0)
                out_open = 0;
            else if (send_frame(fd, 'o', buf, (uint32_t)n)) {
                kill(-pid, SIGKILL);
                break;
            }
        }
    }
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    char code[16];
    int n = snprintf(code, sizeof code, "%d", WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
    send_frame(fd, 'x', code, (uint32_t)n);
}

static int cmd_agent(int argc, char **argv)
{
    const char *listen_addr = "0.0.0.0", *port_s = NULL;
    char token[256];
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--listen") && i + 1 < argc)
            listen_addr = argv[++i];
        else if (!strcmp(argv[i], "--port") && i + 1 < argc)
            port_s = argv[++i];
        else {
            usage();
            return 2;
        }
    }
    int port = port_of(port_s);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)(port > 0 ? port : 0))};
    if (port < 0 || inet_pton(AF_INET, listen_addr, &sa.sin_addr) != 1) {
        fprintf(stderr, "ditd-launch agent: bad --listen %s or port\n", listen_addr);
        return 2;
    }
    if (read_token(token, sizeof token))
        return 1;
    int ls = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;
    setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (ls < 0 || bind(ls, (struct sockaddr *)&sa, sizeof sa) || listen(ls, 16)) {
        fprintf(stderr, "ditd-launch agent: %s:%d: %s\n", listen_addr, port, strerror(errno));
        return 1;
    }
    struct sigaction act = {.sa_handler = on_term};
    sigemptyset(&act.sa_mask);
    sigaction(SIGTERM, &act, NULL);
    sigaction(SIGINT, &act, NULL);
    signal(SIGPIPE, SIG_IGN);
    fprintf(stderr, "ditd-launch agent: listening on %s:%d (pid %d)\n", listen_addr, port, (int)getpid());
    int children = 0;
    for (;;) {
        int st;
        pid_t p;
        while ((p = waitpid(-1, &st, WNOHANG)) > 0)
            children -= children > 0;
        /* a pod stop: the leader ends the commands we run (its drain);
         * leave once they are gone */
        if (got_term && children == 0) {
            fprintf(stderr, "ditd-launch agent: SIGTERM, nothing running: exit\n");
            return 0;
        }
        struct pollfd pf = {.fd = ls, .events = POLLIN};
        if (poll(&pf, 1, 200) <= 0 || got_term)
            continue;
        int fd = accept4(ls, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0)
            continue;
        pid_t h = fork();
        if (h == 0) {
            signal(SIGTERM, SIG_IGN);
            signal(SIGINT, SIG_IGN);
            close(ls);
            serve_conn(fd, token);
            _exit(0);
        }
        if (h > 0)
            children++;
        close(fd);
    }
}

static int cmd_rsh(int argc, char **argv)
{
    char token[256];
    static char cmd[MAX_CMD];
    size_t len = 0;
    int i = 0;
    /* ssh-style options Open MPI may pass before the host are not ours */
    while (i < argc && argv[i][0] == '-')
        i++;
    if (argc - i < 2) {
        usage();
        return 2;
    }
    const char *host = argv[i++];
    for (; i < argc; i++) {
        size_t n = strlen(argv[i]);
        if (len + n + 2 > sizeof cmd || strchr(argv[i], '\n')) {
            fprintf(stderr, "ditd-launch rsh: the command is too long or holds a newline\n");
            return 2;
        }
        if (len)
            cmd[len++] = ' ';
        memcpy(cmd + len, argv[i], n);
        len += n;
    }
    cmd[len++] = '\n';
    if (read_token(token, sizeof token))
        return 255;
    char port[16];
    snprintf(port, sizeof port, "%d", port_of(NULL));
    /* the worker pods start with the leader: retry until the agent answers */
    int fd = -1;
    const char *retry_s = getenv("DITD_LAUNCH_CONNECT_TIMEOUT");
    double deadline = (double)time(NULL) + (retry_s ? atof(retry_s) : 300);
    while (fd < 0) {
        struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *res = NULL;
        if (getaddrinfo(host, port, &hints, &res) == 0) {
            for (struct addrinfo *a = res; a && fd < 0; a = a->ai_next) {
                fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, 0);
                if (fd >= 0 && connect(fd, a->ai_addr, a->ai_addrlen)) {
                    close(fd);
                    fd = -1;
                }
            }
            freeaddrinfo(res);
        }
        if (fd < 0) {
            if ((double)time(NULL) > deadline) {
                fprintf(stderr, "ditd-launch rsh: no agent at %s:%s\n", host, port);
                return 255;
            }
            usleep(500000);
        }
    }
    size_t tl = strlen(token);
    token[tl] = '\n';
    if (write_all(fd, token, tl + 1) || write_all(fd, cmd, len)) {
        fprintf(stderr, "ditd-launch rsh: %s: send failed\n", host);
        return 255;
    }
    for (;;) {
        unsigned char h[5];
        static char buf[1 << 16];
        if (read_all(fd, h, 5)) {
            fprintf(stderr, "ditd-launch rsh: %s closed the connection\n", host);
            return 255;
        }
        uint32_t n = (uint32_t)h[1] << 24 | (uint32_t)h[2] << 16 | (uint32_t)h[3] << 8 | h[4];
        if (n >= sizeof buf || read_all(fd, buf, n))
            return 255;
        if (h[0] == 'x') {
            buf[n] = 0;
            return atoi(buf);
        }
        write_all(1, buf, n);
    }
}

/* ------------------------------------------------------------------ */
/* probe                                                               */

static int cmd_probe(int argc, char **argv)
{
    const char *path = argc > 0 ? argv[0] : "/healthz";
    const char *port_s = getenv("DITD_PORT");
    int port = port_s ? atoi(port_s) : 8080;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    char req[512], resp[64] = "";
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct timeval tv = {3, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    if (port <= 0 || port > 65535 || connect(fd, (struct sockaddr *)&sa, sizeof sa)) {
        fprintf(stderr, "ditd-launch probe: 127.0.0.1:%d: %s\n", port, strerror(errno));
        return 1;
    }
    int n = snprintf(req, sizeof req, "GET %s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n", path);
    if (write_all(fd, req, (size_t)n) || read(fd, resp, sizeof resp - 1) < 12) {
        fprintf(stderr, "ditd-launch probe: no answer from 127.0.0.1:%d\n", port);
        return 1;
    }
    close(fd);
    int ok = !strncmp(resp, "HTTP/1.", 7) && resp[9] == '2';
    if (!ok)
        fprintf(stderr, "ditd-launch probe: %.*s\n", (int)strcspn(resp, "\r\n"), resp);
    return ok ? 0 : 1;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage();
        return 2;
    }
    if (!strcmp(argv[1], "run"))
        return cmd_run(argc - 2, argv + 2);
    if (!strcmp(argv[1], "agent"))
        return cmd_agent(argc - 2, argv + 2);
    if (!strcmp(argv[1], "rsh"))
        return cmd_rsh(argc - 2, argv + 2);
    if (!strcmp(argv[1], "probe"))
        return cmd_probe(argc - 2, argv + 2);
    if (!strcmp(argv[1], "hostfile")) {
        if (argc != 4 || strcmp(argv[2], "--slots")) {
            usage();
            return 2;
        }
        return lws_hostfile(stdout, atoi(argv[3])) ? 1 : 0;
    }
    usage();
    return 2;
}
