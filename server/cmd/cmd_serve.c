/* `ditd serve`: start-up, the libuv loop, signals and drain; under mpirun,
 * the worker ranks too: rank 0 is the front-end, ranks 1.. form dp groups
 * of G = cfg x ring x ulysses x tp contiguous ranks (engine/worker/worker.h
 * runs them).
 *
 * The HTTP edge (server/daemon/http.h) runs inside the loop, so every HTTP
 * callback runs on the loop thread. Replica messages arrive through the
 * hub and a uv_async.
 *
 * Signals (docs/serving.md): SIGTERM, SIGINT and SIGQUIT drain (a second
 * one stops at once); SIGHUP reopens --log-file; SIGUSR1 logs a status
 * line; SIGUSR2 is logged and ignored. Only SIGKILL loses work. */
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include "engine/parallel/comm.h"
#include "engine/core/error.h"
#include "engine/io/video_mp4.h"
#include "engine/parallel/mesh.h"
#include "engine/pipeline/pipeline.h"
#include "server/cmd/cli.h"
#include "server/cmd/cmd.h"
#include "server/daemon/jobrun.h"
#include "server/daemon/log.h"
#include "server/daemon/routes.h"
#include "server/daemon/sched.h"
#include "server/daemon/serve.h"
#include "server/daemon/webhook.h"

/* ---- replicas ---- */

static void hub_wake(void *ud)
{
    uv_async_send(ud);
}

static void on_wake(uv_async_t *a)
{
    ditd_srv *s = a->data;
    ditd_hub_msg *m;
    if (!s->hub)
        return;
    m = ditd_hub_drain(s->hub);
    for (ditd_hub_msg *p = m; p; p = p->next)
        ditd__sched_on_message(s, p->replica, p->buf, p->len);
    ditd_hub_msg_free(m);
}

typedef struct thread_arg {
    ditd_worker_config cfg;
    ditd_transport *t;
} thread_arg;

static void replica_main(void *arg)
{
    thread_arg *a = arg;
    ditd_worker_run(&a->cfg, a->t);
}

/* ---- shutdown ---- */

static void close_all(ditd_srv *s);

static void stop_now(ditd_srv *s)
{
    if (s->stopping)
        return;
    s->stopping = 1;
    ditd_log(DITD_LOG_INFO, "stopping the replicas");
    ditd__sched_shutdown(s, 1);
    close_all(s);
    uv_stop(s->loop); /* serve_front() joins the replicas, then closes the wake handle */
}

static void on_watch(uv_timer_t *t)
{
    ditd_srv *s = t->data;
    double now = ditd__now();
    ditd__jobs_watch(s);
    ditd__sched_watch(s);
    ditd_jobrun_watch(s);
    /* fail-stop: every replica failed */
    int alive = 0;
    for (int r = 0; r < s->nrep; r++)
        alive += !s->rep[r].failed;
    if (!alive && !s->stopping) {
        ditd_log(DITD_LOG_INFO, "no replica left; exiting");
        s->exit_code = 1;
        for (ditd_job *j = s->jobs.head; j; j = j->all_next)
            ditd__sched_fail(s, j, 503, "server_error", "no_replica", "no replica is left");
        s->draining = 1;
        s->drain_deadline = now;
    }
    if (!s->draining || s->stopping)
        return;
    int open = 0;
    for (ditd_job *j = s->jobs.head; j; j = j->all_next)
        open += j->state != DITD_JOB_BODY && !ditd_job_terminal(j);
    if (open && now >= s->drain_deadline && !s->aborted_left) {
        ditd_log(DITD_LOG_INFO, "drain deadline: %d request(s) get an error", open);
        s->aborted_left = 1;
        ditd_job *next;
        for (ditd_job *j = s->jobs.head; j; j = next) {
            next = j->all_next;
            if (j->state != DITD_JOB_BODY)
                ditd__sched_fail(s, j, 503, "server_error", "draining",
                                 "the server shut down before the request finished (--drain-timeout)");
        }
        return;
    }
    /* done when every answer is out (jobs freed), or 5 s after the deadline */
    if (s->jobs.live == 0 || now >= s->drain_deadline + 5.0)
        stop_now(s);
}

static const char *sig_name(int signum)
{
    switch (signum) {
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    case SIGQUIT: return "SIGQUIT";
    case SIGHUP: return "SIGHUP";
    case SIGUSR1: return "SIGUSR1";
    case SIGUSR2: return "SIGUSR2";
    default: return "signal";
    }
}

static void on_signal(uv_signal_t *sig, int signum)
{
    ditd_srv *s = sig->data;
    if (signum == SIGHUP) {
        if (ditd_log_reopen())
            ditd_log(DITD_LOG_ERROR, "SIGHUP: %s", ditd_err_detail());
        else
            ditd_log(DITD_LOG_INFO, "SIGHUP: log reopened%s",
                     s->cfg.log_file[0] ? "" : " (stderr: nothing to do)");
        return;
    }
    if (signum == SIGUSR1) {
        int waiting = 0;
        for (ditd_job *j = s->jobs.head; j; j = j->all_next)
            waiting += j->state == DITD_JOB_WAITING;
        ditd_log(DITD_LOG_INFO,
                 "SIGUSR1: status: %d request(s) in flight, %d queued, %d batch(es) running, "
                 "%d/%d replica(s) up, %d connection(s)%s",
                 waiting, s->q_len, ditd__sched_running(s), ditd__sched_replicas_up(s), s->nrep,
                 s->http.n_conns, s->draining ? ", draining" : "");
        return;
    }
    if (signum == SIGUSR2) {
        ditd_log(DITD_LOG_INFO, "SIGUSR2: ignored");
        return;
    }
    if (s->draining) {
        ditd_log(DITD_LOG_WARN, "%s again: stopping now", sig_name(signum));
        s->drain_deadline = ditd__now();
        return;
    }
    s->draining = 1;
    s->drain_deadline = ditd__now() + s->cfg.drain_timeout_s;
    ditd_log(DITD_LOG_INFO, "%s: draining (readiness fails, new work gets 503, %g s for work in flight)",
             sig_name(signum), s->cfg.drain_timeout_s);
    ditd__sched_kick(s); /* the batcher stops waiting for fuller batches */
}

static void close_all(ditd_srv *s)
{
    /* every suspended connection must be resumed before the HTTP edge stops */
    for (ditd_job *j = s->jobs.head; j; j = j->all_next) {
        if (j->conn && j->suspended) {
            j->suspended = 0;
            MHD_resume_connection(j->conn);
        }
    }
    ditd_http_stop(&s->http);
    uv_close((uv_handle_t *)&s->watch, NULL);
    uv_close((uv_handle_t *)&s->window, NULL);
    for (int i = 0; i < s->nsig; i++)
        uv_close((uv_handle_t *)&s->sig[i], NULL);
    /* the wake handle stays open until the replicas have stopped: see
     * serve_front() */
}

/* Reads a whole PEM file for libmicrohttpd. */
static char *read_pem(const char *path)
{
    FILE *f = fopen(path, "rb");
    char *buf = NULL;
    long n = 0;
    if (!f) {
        ditd_err_set(DITD_EIO, "%s: %s", path, strerror(errno));
        return NULL;
    }
    if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) > 0 && n < (1 << 22) &&
        fseek(f, 0, SEEK_SET) == 0 && (buf = malloc((size_t)n + 1)) &&
        fread(buf, 1, (size_t)n, f) == (size_t)n) {
        buf[n] = '\0';
    } else {
        free(buf);
        buf = NULL;
        ditd_err_set(DITD_EIO, "%s: cannot read it (empty, over 4 MiB, or unreadable)", path);
    }
    fclose(f);
    return buf;
}

/* As many descriptors as the hard limit allows: each connection is one. */
static void raise_nofile(const ditd_serve_config *c)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
        rl.rlim_cur < (rlim_t)c->max_connections + 64)
        ditd_log(DITD_LOG_WARN,
                 "--max-connections %d is near the descriptor limit %llu (ulimit -n): past it, "
                 "clients get 503", c->max_connections, (unsigned long long)rl.rlim_cur);
}

/* ---- start-up ---- */

/* What can refuse the start, before any collective: the layout against the
 * world and the model, the address, the model folder. Every rank decides
 * the same from the same flags and folder, so a refusal leaves no rank
 * waiting (and the ranks agree on it afterwards in case one could not read
 * the folder). G is the ranks per replica. */
static int check_start(const ditd_serve_config *c, const ditd_layout *l, const char *model_dir,
                       int world, int mpi, int rank)
{
    long g = (long)c->ulysses_degree * c->ring_degree * c->tp_degree * c->cfg_degree;
    struct in_addr addr;
    ditd_model_info info;
    ditd_sched_config sc;
    int err;

    if ((err = ditd_layout_check(l, (int)g)))
        return err;
    if (!mpi && g != 1)
        return ditd_err_set(DITD_EINVAL,
                            "--ulysses-degree %d x --ring-degree %d x --tp-degree %d x --cfg-degree %d "
                            "= %ld ranks per replica: multi-rank replicas run under mpirun "
                            "(mpirun -np %ld ditd serve --dp %d ..., rank 0 is the front-end)",
                            c->ulysses_degree, c->ring_degree, c->tp_degree, c->cfg_degree, g,
                            1 + c->dp * g, c->dp);
    if (mpi && world != 1 + c->dp * g)
        return ditd_err_set(DITD_EINVAL,
                            "the MPI world has %d ranks; --dp %d with %ld rank(s) per replica "
                            "(ulysses %d x ring %d x tp %d x cfg %d) needs 1 + %d x %ld = %ld "
                            "(rank 0 is the front-end)",
                            world, c->dp, g, c->ulysses_degree, c->ring_degree, c->tp_degree,
                            c->cfg_degree, c->dp, g, 1 + c->dp * g);
    if (inet_pton(AF_INET, c->host, &addr) != 1)
        return ditd_err_set(DITD_EINVAL, "--host %s is not an IPv4 address", c->host);
    /* the device, on the ranks that run a replica (not rank 0 under MPI):
     * refused here, at start-up, rather than by every replica later */
    if (c->device != DITD_DEVICE_CPU) {
        if (!mpi && c->dp > 1)
            return ditd_err_set(DITD_EINVAL,
                                "--device %s --dp %d: one replica per process on a GPU (the "
                                "backend is one per process); run them under mpirun "
                                "(mpirun -np %d ditd serve --dp %d --device %s)",
                                ditd_device_name((ditd_device)c->device), c->dp, 1 + c->dp,
                                c->dp, ditd_device_name((ditd_device)c->device));
        if ((!mpi || rank > 0) && (err = ditd_backend_check((ditd_device)c->device)))
            return err;
    }
    /* adapter files: readable here (the replicas read them, and refuse a
     * bad one naming it) */
    for (int i = 0; i < c->loras.n; i++)
        if (access(c->loras.v[i].path, R_OK))
            return ditd_err_set(errno == ENOENT ? DITD_ENOENT : DITD_EIO, "--lora %s=%s: %s",
                                c->loras.v[i].name, c->loras.v[i].path, strerror(errno));
    {
        struct stat st;
        if (c->lora_root[0] && (stat(c->lora_root, &st) || !S_ISDIR(st.st_mode)))
            return ditd_err_set(DITD_EINVAL, "--lora-root %s: not a folder", c->lora_root);
    }
    if ((err = ditd_model_info_load(model_dir, &info))) {
        char d[512];
        snprintf(d, sizeof d, "%s", ditd_err_detail());
        return ditd_err_set(err, "%s: %s", model_dir, d);
    }
    /* --transformer-file / --text-encoder-2-file: there, and taken by the model */
    if ((err = ditd_model_info_set_files(&info, c->transformer_file, c->text_encoder_2_file))) {
        ditd_model_info_free(&info);
        return err;
    }
    if (info.frames > 0 && !ditd_video_mp4_available()) { /* before any replica loads it */
        err = ditd_err_set(DITD_EUNSUPPORTED,
                           "%s is a video model (%s): /v1/videos writes MP4 through FFmpeg's "
                           "libraries, and this ditd was built without them "
                           "(deploy/install-deps.sh installs them; rebuild)", info.name,
                           info.pipeline->name);
        ditd_model_info_free(&info);
        return err;
    }
    if (!(err = ditd_sched_config_load(info.scheduler_config, &sc)) && info.needs_vae &&
        !info.vae_dir[0])
        err = ditd_err_set(DITD_ENOENT, "%s is a latent model without vae/config.json", model_dir);
    if (!err && g > 1 &&
        (err = ditd_layout_check_attention(l, info.shapes.heads, info.shapes.tokens))) {
        char d[512];
        snprintf(d, sizeof d, "%s", ditd_err_detail());
        err = ditd_err_set(err, "the layout cannot run %s (%d heads, %d tokens): %s", info.name,
                           info.shapes.heads, info.shapes.tokens, d);
    }
    ditd_model_info_free(&info);
    return err;
}

/* Rank 0 (or the whole world of one): the front-end until it drains or
 * stops. Returns the exit code, or -1 when it failed before the replicas
 * could be told to stop (under MPI they would wait for it forever). */
static int serve_front(ditd_srv *s, const char *model_dir, int group_size)
{
    int err;
    uv_loop_t *loop = uv_default_loop();
    thread_arg *targs = NULL;
    char *tls_cert = NULL, *tls_key = NULL;

    s->loop = loop;
    s->t_start = ditd__now();
    s->t_wall = (long long)time(NULL);
    s->jobs.epoch = (uint64_t)s->t_wall;
    ditd_metrics_init(&s->m);
    ditd_metrics_set_backend(&s->m, ditd_device_name((ditd_device)s->cfg.device));
    if ((err = ditd_log_open((ditd_log_level)s->cfg.log_level, (ditd_log_format)s->cfg.log_format,
                             s->cfg.log_file))) {
        fprintf(stderr, "ditd serve: %s\n", ditd_err_detail());
        return -1;
    }
    if ((err = ditd_auth_load(&s->auth, s->cfg.api_key, s->cfg.api_key_file))) {
        ditd_log(DITD_LOG_ERROR, "%s", ditd_err_detail());
        goto fail_log;
    }
    if ((err = ditd_auth_load(&s->admin, s->cfg.admin_key, s->cfg.admin_key_file))) {
        ditd_log(DITD_LOG_ERROR, "--admin-key: %s", ditd_err_detail());
        goto fail_log;
    }
    if (s->cfg.tls_cert[0] &&
        (!(tls_cert = read_pem(s->cfg.tls_cert)) || !(tls_key = read_pem(s->cfg.tls_key)))) {
        ditd_log(DITD_LOG_ERROR, "--tls-cert/--tls-key: %s", ditd_err_detail());
        goto fail_log;
    }
    raise_nofile(&s->cfg);
    if ((err = ditd_model_info_load(model_dir, &s->info))) {
        ditd_log(DITD_LOG_ERROR, "%s: %s", model_dir, ditd_err_detail());
        goto fail_log;
    }
    /* the files beside the folder (checked before the front-end started),
     * so that the storage named below is what the replicas load */
    if ((err = ditd_model_info_set_files(&s->info, s->cfg.transformer_file,
                                         s->cfg.text_encoder_2_file))) {
        ditd_log(DITD_LOG_ERROR, "%s", ditd_err_detail());
        goto fail_info;
    }
    ditd_model_storage_read(&s->info, &s->storage);
    {
        ditd_sched_config *sc = &s->sched;
        if ((err = ditd_sched_config_load(s->info.scheduler_config, sc))) {
            fprintf(stderr, "ditd serve: %s\n", ditd_err_detail());
            goto fail_info;
        }
        s->sched_default = sc->kind;
        if (s->info.default_sampler[0])
            ditd_sampler_kind_from_str(s->info.default_sampler, &s->sched_default);
    }
    if (s->info.needs_vae && !s->info.vae_dir[0]) {
        fprintf(stderr, "ditd serve: %s is a latent model without vae/config.json\n", model_dir);
        goto fail_info;
    }
    /* the names a request may give: the folder's, then the aliases */
    s->gm.info = &s->info;
    s->gm.sched_default = s->sched_default;
    s->gm.sched = &s->sched;
    s->gm.cache_default = s->cfg.cache.method != DITD_CACHE_NONE ? &s->cfg.cache : NULL;
    s->gm.aliases = s->aliases;
    for (int i = 0; i < s->cfg.n_served_names; i++)
        if (strcmp(s->cfg.served_names[i], s->info.name) != 0)
            s->aliases[s->gm.n_aliases++] = s->cfg.served_names[i];
    /* the LoRA adapters requests may name; the replicas load the files */
    for (int i = 0; i < s->cfg.loras.n; i++) {
        s->lora_names[i] = s->cfg.loras.v[i].name;
        s->wloras[i] = (ditd_worker_lora){s->cfg.loras.v[i].name, s->cfg.loras.v[i].path};
    }
    s->gm.lora_names = s->lora_names;
    s->gm.n_loras = s->cfg.loras.n;
    s->gm.max_loras = s->cfg.max_loras_per_request;
    s->nrep = s->cfg.dp;
    if (!(s->rep = calloc((size_t)s->nrep, sizeof *s->rep)))
        goto fail_info;

    if ((err = ditd_webhook_open(s->cfg.webhook_url, s->cfg.webhook_secret, s->cfg.webhook_ca,
                                 &s->webhook))) {
        ditd_log(DITD_LOG_ERROR, "%s", ditd_err_detail());
        goto fail_rep;
    }
    if ((err = ditd_jobrun_open(s))) {
        ditd_log(DITD_LOG_ERROR, "%s", ditd_err_detail());
        ditd_jobrun_close(s);
        goto fail_rep;
    }

    uv_async_init(loop, &s->wake, on_wake);
    s->wake.data = s;
    if (s->mpi)
        err = ditd_hub_new_mpi(s->nrep, group_size, hub_wake, &s->wake, &s->hub);
    else
        err = ditd_hub_new_inproc(s->nrep, hub_wake, &s->wake, &s->hub);
    if (err) {
        fprintf(stderr, "ditd serve: %s\n", ditd_err_detail());
        goto fail_async;
    }
    if (!s->mpi) {
        targs = calloc((size_t)s->nrep, sizeof *targs);
        s->threads = calloc((size_t)s->nrep, sizeof *s->threads);
        if (!targs || !s->threads)
            goto fail_hub;
        for (int r = 0; r < s->nrep; r++) {
            targs[r].cfg.model_dir = s->info.dir;
            targs[r].cfg.transformer_file = s->cfg.transformer_file;
            targs[r].cfg.text_encoder_2_file = s->cfg.text_encoder_2_file;
            targs[r].cfg.replica = r;
            targs[r].cfg.max_batch = s->cfg.max_batch;
            targs[r].cfg.threads = s->cfg.threads;
            targs[r].cfg.heartbeat_ms = s->cfg.heartbeat_ms;
            targs[r].cfg.device = s->cfg.device;
            targs[r].cfg.comm_timeout_ms = s->cfg.comm_timeout_ms;
            targs[r].cfg.vae_tiling = s->cfg.vae_tiling;
            targs[r].cfg.weight_dtype = s->cfg.weight_dtype;
            targs[r].cfg.text_encoder_rank = s->cfg.text_encoder_rank;
            targs[r].cfg.text_cache_entries = s->cfg.text_cache_entries;
            targs[r].cfg.text_cache_mb = s->cfg.text_cache_mb;
            targs[r].cfg.loras = s->wloras;
            targs[r].cfg.n_loras = s->cfg.loras.n;
            targs[r].cfg.lora_cache_mb = s->cfg.lora_cache_mb;
            targs[r].t = ditd_hub_transport(s->hub, r);
            uv_thread_options_t to = {UV_THREAD_HAS_STACK_SIZE, 8u << 20};
            if (uv_thread_create_ex(&s->threads[r], &to, replica_main, &targs[r])) {
                fprintf(stderr, "ditd serve: cannot start replica thread %d\n", r);
                goto fail_hub;
            }
        }
    }

    {
        ditd_http_config hc = {s->cfg.host, s->cfg.port, s->cfg.max_connections,
                               s->cfg.max_per_client, s->cfg.header_timeout_s,
                               s->cfg.body_timeout_s, (unsigned)s->cfg.idle_timeout_s, tls_cert,
                               tls_key, ditd__on_request, ditd__on_completed, s};
        if ((err = ditd_http_start(&s->http, loop, &hc))) {
            ditd_log(DITD_LOG_ERROR, "%s", ditd_err_detail());
            s->exit_code = 1;
            ditd__sched_shutdown(s, 1);
            goto join;
        }
    }
    uv_timer_init(loop, &s->watch);
    s->watch.data = s;
    uv_timer_start(&s->watch, on_watch, 100, 100);
    uv_timer_init(loop, &s->window);
    s->window.data = s;
    {
        static const int sigs[] = {SIGTERM, SIGINT, SIGQUIT, SIGHUP, SIGUSR1, SIGUSR2};
        for (int i = 0; i < 6; i++) {
            uv_signal_init(loop, &s->sig[i]);
            s->sig[i].data = s;
            uv_signal_start(&s->sig[i], on_signal, sigs[i]);
        }
        s->nsig = 6;
    }
    signal(SIGPIPE, SIG_IGN);

    ditd_log(DITD_LOG_INFO, "listening on %s://%s:%d (model %s, %d replica%s%s, max batch %d, pid %d)",
              tls_cert ? "https" : "http", s->cfg.host, s->http.port, s->info.name, s->nrep, s->nrep == 1 ? "" : "s",
              s->mpi ? " over MPI" : "", s->cfg.max_batch, (int)getpid());
    if (s->cfg.device == DITD_DEVICE_CPU) /* which library and ISA run the GEMMs (docs/cpu.md) */
        ditd_log(DITD_LOG_INFO, "cpu GEMMs (this host): %s", ditd_backend_cpu_gemm_info());
    for (int i = 0; i < s->storage.n; i++) { /* GGUF Q4_K and bf16 told apart */
        char line[512];
        ditd_component_storage_line(&s->storage.c[i], line, sizeof line);
        ditd_log(DITD_LOG_INFO, "storage: %s: %s", s->storage.c[i].component, line);
    }
    if (s->cfg.pid_file[0]) {
        FILE *pf = fopen(s->cfg.pid_file, "w");
        if (!pf || fprintf(pf, "%d\n", (int)getpid()) < 0)
            ditd_log(DITD_LOG_WARN, "--pid-file %s: %s", s->cfg.pid_file, strerror(errno));
        if (pf)
            fclose(pf);
    }
    /* where a supervisor looks first, whatever the log's file or level */
    if (s->cfg.log_file[0] || s->cfg.log_level > DITD_LOG_INFO)
        fprintf(stderr, "ditd serve: listening on %s://%s:%d (log in %s, pid %d)\n",
                tls_cert ? "https" : "http", s->cfg.host, s->http.port,
                s->cfg.log_file[0] ? s->cfg.log_file : "stderr", (int)getpid());
    uv_run(loop, UV_RUN_DEFAULT);

join:
    /* the replicas got Shutdown; wait for them, still draining their
     * messages so none blocks */
    if (!s->mpi && s->threads) {
        for (int r = 0; r < s->nrep; r++)
            uv_thread_join(&s->threads[r]);
    }
    /* Under MPI the hub's thread sends the Shutdowns, then waits for every
     * replica's bye (each leader broadcasts the end to its group first);
     * it may wake the loop until then, so the wake handle closes after. */
    ditd_hub_free(s->hub);
    s->hub = NULL;
    uv_close((uv_handle_t *)&s->wake, NULL);
    uv_run(loop, UV_RUN_DEFAULT);
    free(targs);
    free(s->threads);
    ditd_jobrun_close(s);
    ditd_webhook_close(s->webhook);
    free(s->rep);
    ditd__sched_lora_free(s);
    uv_loop_close(loop);
    ditd_model_info_free(&s->info);
    ditd_auth_free(&s->auth);
    ditd_auth_free(&s->admin);
    free(tls_cert);
    free(tls_key);
    if (s->cfg.pid_file[0])
        unlink(s->cfg.pid_file);
    ditd_log(DITD_LOG_INFO, "stopped");
    ditd_log_close();
    return s->exit_code;

fail_hub:
    ditd__sched_shutdown(s, 1);
    if (s->threads)
        for (int r = 0; r < s->nrep; r++)
            if (s->threads[r])
                uv_thread_join(&s->threads[r]);
    ditd_hub_free(s->hub);
    s->hub = NULL;
fail_async:
    uv_close((uv_handle_t *)&s->wake, NULL);
    uv_run(loop, UV_RUN_DEFAULT);
    free(targs);
    free(s->threads);
    ditd_jobrun_close(s);
fail_rep:
    ditd_webhook_close(s->webhook);
    s->webhook = NULL;
    free(s->rep);
fail_info:
    ditd_model_info_free(&s->info);
fail_log:
    ditd_auth_free(&s->auth);
    ditd_auth_free(&s->admin);
    free(tls_cert);
    free(tls_key);
    ditd_log_close();
    return -1;
}

/* A worker rank: one rank of replica (rank - 1) / G. Returns the exit code;
 * *abandon when the rank left its group out of step (no MPI_Finalize then:
 * the process ends with an error and mpirun takes the job down). */
static int serve_worker(ditd_srv *s, const char *model_dir, const ditd_layout *l, int rank,
                        ditd_comm *group, int *abandon)
{
    ditd_mesh *mesh = NULL;
    ditd_transport *t = NULL;
    int err, G = ditd_layout_size(l);

    /* It stops when the front-end says so (after its drain), so the SIGTERM
     * that mpirun forwards to every rank must not end it first. */
    signal(SIGTERM, SIG_IGN);
    signal(SIGINT, SIG_IGN);
    signal(SIGQUIT, SIG_IGN);
    signal(SIGHUP, SIG_IGN);
    signal(SIGUSR1, SIG_IGN); /* mpirun forwards SIGUSR1/2 to every rank */
    signal(SIGUSR2, SIG_IGN);
    ditd_worker_config wc = {model_dir, NULL, (rank - 1) / G, s->cfg.max_batch, s->cfg.threads,
                             s->cfg.heartbeat_ms, s->cfg.device, s->cfg.comm_timeout_ms,
                             s->cfg.vae_tiling,
                             s->cfg.weight_dtype,
                             s->cfg.text_encoder_rank,
                             s->cfg.text_cache_entries,
                             s->cfg.text_cache_mb, s->wloras, s->cfg.loras.n,
                             s->cfg.lora_cache_mb, s->cfg.transformer_file,
                             s->cfg.text_encoder_2_file};
    for (int i = 0; i < s->cfg.loras.n; i++)
        s->wloras[i] = (ditd_worker_lora){s->cfg.loras.v[i].name, s->cfg.loras.v[i].path};
    /* the mesh refuses a bad layout on every rank alike, before any split */
    if ((err = ditd_mesh_new(group, l, &mesh))) {
        fprintf(stderr, "ditd serve: rank %d: %s\n", rank, ditd_err_detail());
        return 2;
    }
    wc.mesh = mesh;
    if (ditd_mesh_is_leader(mesh) && (err = ditd_mpi_transport_new(&t))) {
        /* a leader without a transport cannot tell its group: fail-stop */
        fprintf(stderr, "ditd serve: rank %d: %s\n", rank, ditd_err_detail());
        *abandon = 1;
        ditd_mesh_free(mesh);
        return 1;
    }
    if (G > 1 || getenv("DITD_LOG_RANKS"))
        fprintf(stderr, "ditd serve: rank %d (pid %d): replica %d, group rank %d of %d%s\n", rank,
                (int)getpid(), wc.replica, mesh->rank, G, t ? " (leader)" : "");
    err = ditd_worker_run(&wc, t);
    if (err) {
        fprintf(stderr, "ditd serve: rank %d: %s\n", rank, ditd_err_detail());
        *abandon = err == DITD_ECOMM;
    }
    free(t);
    ditd_mesh_free(mesh);
    return err ? 1 : 0;
}

int ditd_cmd_serve(int argc, char **argv)
{
    ditd_srv *s = calloc(1, sizeof *s);
    int err, rank = 0, world_size = 1, rc, abandon = 0;
    ditd_comm *world = NULL, *group = NULL;
    const char *model_dir;

    if (!s) {
        fprintf(stderr, "ditd serve: out of memory\n");
        return 1;
    }
    err = ditd_serve_config_parse(&s->cfg, argc, argv);
    if (err == 1) {
        free(s);
        return 0;
    }
    if (err) {
        fprintf(stderr, "ditd serve: %s\n", ditd_err_detail());
        free(s);
        return 2;
    }
    model_dir = s->cfg.model[0] ? s->cfg.model : ditd_default_model_dir();
    if (!model_dir) {
        fprintf(stderr, "ditd serve: no --model given and no embedded default model (models/fashion-dit)\n");
        free(s);
        return 2;
    }
    ditd_layout layout = {s->cfg.cfg_degree, s->cfg.ring_degree, s->cfg.ulysses_degree,
                          s->cfg.tp_degree, (ditd_ring_rotate)s->cfg.ring_rotate, 1};
    if (ditd_comm_launched_by_mpi()) {
        /* one MPI init for the process, thread level SERIALIZED: on rank 0
         * the main thread calls MPI until the hub's thread starts and after
         * it stops, the hub's thread in between; on worker ranks only the
         * main thread (the worker loop) does */
        if ((err = ditd_comm_mpi_init(NULL, NULL)) || (err = ditd_comm_mpi_world(&world))) {
            fprintf(stderr, "ditd serve: %s\n", ditd_err_detail());
            free(s);
            return 1; /* without MPI_Finalize: mpirun ends the job */
        }
        rank = ditd_comm_rank(world);
        world_size = ditd_comm_size(world);
        s->mpi = world_size > 1;
    }

    /* Every rank checks, then all agree (a rank that could not read the
     * model folder must not leave the others in a collective). */
    err = check_start(&s->cfg, &layout, model_dir, world_size, s->mpi, rank);
    if (err && s->mpi)
        fprintf(stderr, "ditd serve: rank %d: %s\n", rank, ditd_err_detail());
    else if (err)
        fprintf(stderr, "ditd serve: %s\n", ditd_err_detail());
    if (s->mpi) {
        float bad = err ? 1.0f : 0.0f;
        if (ditd_comm_allreduce_sum(world, DITD_DTYPE_F32, &bad, 1)) {
            fprintf(stderr, "ditd serve: rank %d: %s\n", rank, ditd_err_detail());
            rc = 1;
            abandon = 1;
            goto done;
        }
        if (bad > 0.5f && !err) {
            fprintf(stderr, "ditd serve: rank %d: %g other rank(s) refused to start\n", rank,
                    (double)bad);
            err = DITD_EINVAL;
        }
    }
    if (err) {
        rc = 2;
        goto done;
    }
    if (s->mpi) {
        /* the front-end joins no group: replica r is ranks 1 + r G .. */
        int G = ditd_layout_size(&layout);
        if ((err = ditd_comm_split(world, rank == 0 ? -1 : (rank - 1) / G, rank, &group))) {
            fprintf(stderr, "ditd serve: rank %d: %s\n", rank, ditd_err_detail());
            rc = 1;
            abandon = 1;
            goto done;
        }
    }
    if (rank > 0) {
        rc = serve_worker(s, model_dir, &layout, rank, group, &abandon);
    } else {
        rc = serve_front(s, model_dir, ditd_layout_size(&layout));
        /* failed before the hub could tell the replicas: they would wait */
        abandon = s->mpi && rc < 0;
        rc = rc < 0 ? 1 : rc;
    }
done:
    if (abandon) {
        /* fail-stop: no MPI_Finalize (it would wait for ranks that wait for
         * us); the exit code makes mpirun end the job */
        free(s);
        return rc ? rc : 1;
    }
    ditd_comm_free(group);
    ditd_comm_free(world);
    if (world)
        ditd_comm_mpi_finalize();
    free(s);
    return rc;
}
