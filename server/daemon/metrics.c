/* Front-end metrics in Prometheus text format, plus the operator series
 * (ditd_build_info, ditd_model_load_seconds, process_*). Not a metrics
 * library: the series are the ones docs/serving.md lists. */
#include "server/daemon/metrics.h"

#include <dirent.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "ditd_build_config.h"

extern const char ditd_build_commit[]; /* build_commit.c, made by meson's vcs_tag */

static const double lat_bounds[] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300};
static const double step_bounds[] = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};
static const double size_bounds[] = {1, 2, 4, 8, 16, 32, 64, 128, 256};
static const double job_bounds[] = {0.1, 0.5, 1, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600};

const char *ditd_route_name(ditd_route r)
{
    static const char *names[] = {"/v1/images/generations", "/v1/models", "/healthz", "/readyz",
                                  "/metrics", "/openapi.json", "other", "/", "/v1/jobs",
                                  "/v1/videos", "/v1/loras", "/v1/images/edits"};
    return (unsigned)r < DITD_ROUTE_COUNT ? names[r] : "?";
}

static void hist_init(ditd_hist *h, const double *b, int nb)
{
    *h = (ditd_hist){.bounds = b, .nb = nb}; /* not memset: GCC's UBSan build warns on it */
}

void ditd_metrics_init(ditd_metrics *m)
{
    *m = (ditd_metrics){0};
    hist_init(&m->latency, lat_bounds, (int)(sizeof lat_bounds / sizeof lat_bounds[0]));
    hist_init(&m->queue_time, lat_bounds, (int)(sizeof lat_bounds / sizeof lat_bounds[0]));
    hist_init(&m->step_time, step_bounds, (int)(sizeof step_bounds / sizeof step_bounds[0]));
    hist_init(&m->batch_size, size_bounds, (int)(sizeof size_bounds / sizeof size_bounds[0]));
    for (int k = 0; k < 2; k++) {
        hist_init(&m->job_wait[k], job_bounds, (int)(sizeof job_bounds / sizeof job_bounds[0]));
        hist_init(&m->job_run[k], job_bounds, (int)(sizeof job_bounds / sizeof job_bounds[0]));
    }
}

void ditd_hist_observe(ditd_hist *h, double v)
{
    int i = 0;
    while (i < h->nb && v > h->bounds[i])
        i++;
    h->counts[i]++;
    h->sum += v;
    h->count++;
}

/* The first line of `path` that starts with `key`, its value after the
 * colon, trimmed, into out (left alone when there is none). */
static void proc_field(const char *path, const char *key, char *out, size_t cap)
{
    char line[512];
    FILE *f = fopen(path, "r");
    if (!f)
        return;
    while (fgets(line, sizeof line, f)) {
        char *colon = strchr(line, ':');
        if (strncmp(line, key, strlen(key)) != 0 || !colon)
            continue;
        colon++;
        while (*colon == ' ' || *colon == '\t')
            colon++;
        colon[strcspn(colon, "\n")] = 0;
        snprintf(out, cap, "%s", colon);
        break;
    }
    fclose(f);
}

void ditd_metrics_set_backend(ditd_metrics *m, const char *backend)
{
    snprintf(m->backend, sizeof m->backend, "%s", backend);
    snprintf(m->device, sizeof m->device, "unknown");
    if (!strcmp(backend, "cpu")) {
        proc_field("/proc/cpuinfo", "model name", m->device, sizeof m->device);
        return;
    }
    /* the first GPU the driver lists (rank 0 under mpirun never opens one) */
    DIR *d = opendir("/proc/driver/nvidia/gpus");
    struct dirent *e;
    while (d && (e = readdir(d))) {
        char path[512];
        if (e->d_name[0] == '.')
            continue;
        snprintf(path, sizeof path, "/proc/driver/nvidia/gpus/%s/information", e->d_name);
        proc_field(path, "Model", m->device, sizeof m->device);
        break;
    }
    if (d)
        closedir(d);
}

void ditd_metrics_replica_ready(ditd_metrics *m, int replica, double seconds)
{
    if (replica >= 0 && replica < DITD_METRICS_MAX_REPLICAS && m->load_s[replica] == 0)
        m->load_s[replica] = seconds > 0 ? seconds : 1e-9;
}

void ditd_metrics_count_request(ditd_metrics *m, ditd_route route, int status)
{
    for (int i = 0; i < m->n_by_status; i++) {
        if (m->by_status[i].route == route && m->by_status[i].status == status) {
            m->by_status[i].n++;
            return;
        }
    }
    if (m->n_by_status < (int)(sizeof m->by_status / sizeof m->by_status[0])) {
        m->by_status[m->n_by_status].route = route;
        m->by_status[m->n_by_status].status = status;
        m->by_status[m->n_by_status].n = 1;
        m->n_by_status++;
    }
}

typedef struct sbuf {
    char *p;
    size_t len, cap;
    int oom;
} sbuf;

static void put(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(sbuf *b, const char *fmt, ...)
{
    va_list ap;
    for (;;) {
        size_t room = b->cap - b->len;
        va_start(ap, fmt);
        int n = vsnprintf(b->p ? b->p + b->len : NULL, b->p ? room : 0, fmt, ap);
        va_end(ap);
        if (n < 0 || b->oom)
            return;
        if (b->p && (size_t)n < room) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = (b->cap ? b->cap * 2 : 4096) + (size_t)n;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
}

/* One series of a histogram (its HELP and TYPE written once, before). */
static void hist_series(sbuf *b, const char *name, const char *labels, const ditd_hist *h)
{
    uint64_t cum = 0;
    for (int i = 0; i < h->nb; i++) {
        cum += h->counts[i];
        put(b, "%s_bucket{%s%sle=\"%g\"} %llu\n", name, labels, *labels ? "," : "", h->bounds[i],
            (unsigned long long)cum);
    }
    cum += h->counts[h->nb];
    put(b, "%s_bucket{%s%sle=\"+Inf\"} %llu\n", name, labels, *labels ? "," : "", (unsigned long long)cum);
    put(b, "%s_sum{%s} %.9g\n%s_count{%s} %llu\n", name, labels, h->sum, name, labels,
        (unsigned long long)h->count);
}

static void hist(sbuf *b, const char *name, const char *help, const char *labels, const ditd_hist *h)
{
    put(b, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    hist_series(b, name, labels, h);
}

/* A label value as Prometheus text wants it: backslash, quote, newline escaped. */
static void label_value(char *out, size_t cap, const char *v)
{
    size_t k = 0;
    for (; *v && k + 3 < cap; v++) {
        if (*v == '\\' || *v == '"' || *v == '\n')
            out[k++] = '\\';
        out[k++] = *v == '\n' ? 'n' : *v;
    }
    out[k] = 0;
}

/* process_* as the Prometheus client libraries name them, from /proc/self. */
static void process_metrics(sbuf *b)
{
    long page = sysconf(_SC_PAGESIZE), tick = sysconf(_SC_CLK_TCK);
    unsigned long long vm_pages = 0, rss_pages = 0, start_ticks = 0;
    struct rusage ru;
    struct rlimit rl;
    FILE *f;
    char line[1024];

    if (getrusage(RUSAGE_SELF, &ru) == 0)
        put(b, "# HELP process_cpu_seconds_total User and system CPU time, all threads.\n"
               "# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total %.6f\n",
            (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + (double)ru.ru_stime.tv_sec +
                ru.ru_stime.tv_usec / 1e6);
    if ((f = fopen("/proc/self/statm", "r"))) {
        if (fscanf(f, "%llu %llu", &vm_pages, &rss_pages) == 2)
            put(b, "# HELP process_resident_memory_bytes Resident set size.\n"
                   "# TYPE process_resident_memory_bytes gauge\nprocess_resident_memory_bytes %llu\n"
                   "# HELP process_virtual_memory_bytes Virtual memory size.\n"
                   "# TYPE process_virtual_memory_bytes gauge\nprocess_virtual_memory_bytes %llu\n",
                rss_pages * (unsigned long long)page, vm_pages * (unsigned long long)page);
        fclose(f);
    }
    DIR *d = opendir("/proc/self/fd");
    if (d) {
        int n = -1; /* the DIR's own fd is listed too */
        struct dirent *e;
        while ((e = readdir(d)))
            n += e->d_name[0] != '.';
        closedir(d);
        put(b, "# HELP process_open_fds Open file descriptors.\n# TYPE process_open_fds gauge\n"
               "process_open_fds %d\n", n);
    }
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
        put(b, "# HELP process_max_fds The file descriptor limit.\n# TYPE process_max_fds gauge\n"
               "process_max_fds %llu\n", (unsigned long long)rl.rlim_cur);
    /* start time: field 22 of /proc/self/stat (ticks since boot) + btime */
    if ((f = fopen("/proc/self/stat", "r"))) {
        if (fgets(line, sizeof line, f)) {
            char *p = strrchr(line, ')'); /* the command name may hold spaces */
            for (int field = 2; p && field < 22; field++)
                p = strchr(p + 1, ' ');
            if (p)
                start_ticks = strtoull(p + 1, NULL, 10);
        }
        fclose(f);
    }
    unsigned long long btime = 0;
    if (start_ticks && (f = fopen("/proc/stat", "r"))) {
        while (fgets(line, sizeof line, f))
            if (sscanf(line, "btime %llu", &btime) == 1)
                break;
        fclose(f);
    }
    if (btime && tick > 0)
        put(b, "# HELP process_start_time_seconds Start time, Unix seconds.\n"
               "# TYPE process_start_time_seconds gauge\nprocess_start_time_seconds %.2f\n",
            (double)btime + (double)start_ticks / (double)tick);
}

char *ditd_metrics_render(const ditd_metrics *m, const ditd_metrics_gauges *g, size_t *len)
{
    sbuf b = {0};
    char ml[300];
    /* a label value escapes \\, \" and newlines (the model's name is its
     * folder's and may hold them) */
    size_t at = (size_t)snprintf(ml, sizeof ml, "model=\"");
    for (const char *c = g->model; *c && at + 4 < sizeof ml; c++) {
        if (*c == '\\' || *c == '"' || *c == '\n')
            ml[at++] = '\\';
        ml[at++] = *c == '\n' ? 'n' : *c;
    }
    ml[at++] = '"';
    ml[at] = '\0';

    put(&b, "# HELP ditd_http_requests_total HTTP requests answered, by route and status.\n"
            "# TYPE ditd_http_requests_total counter\n");
    for (int i = 0; i < m->n_by_status; i++)
        put(&b, "ditd_http_requests_total{route=\"%s\",status=\"%d\"} %llu\n",
            ditd_route_name(m->by_status[i].route), m->by_status[i].status,
            (unsigned long long)m->by_status[i].n);
    hist(&b, "ditd_request_duration_seconds",
         "End-to-end latency of image generations, arrival to response.", ml, &m->latency);
    hist(&b, "ditd_queue_time_seconds", "Time a request waited before its batch started.", ml,
         &m->queue_time);
    hist(&b, "ditd_step_duration_seconds", "Duration of one denoising step of a batch.", ml,
         &m->step_time);
    hist(&b, "ditd_batch_size", "Samples per dispatched batch.", ml, &m->batch_size);
    for (int w = 0; w < 2; w++) {
        const char *name = w ? "ditd_job_run_seconds" : "ditd_job_wait_seconds";
        put(&b, "# HELP %s Background jobs: %s.\n# TYPE %s histogram\n", name,
            w ? "started to their result stored" : "created to started", name);
        for (int k = 0; k < 2; k++) {
            char kl[600];
            snprintf(kl, sizeof kl, "%s,kind=\"%s\"", ml, k ? "video" : "image");
            hist_series(&b, name, kl, w ? &m->job_run[k] : &m->job_wait[k]);
        }
    }
    put(&b, "# HELP ditd_queue_depth Requests waiting for a replica.\n# TYPE ditd_queue_depth gauge\n"
            "ditd_queue_depth{%s} %d\n", ml, g->queue_depth);
    put(&b, "# HELP ditd_running_batches Batches running on replicas.\n# TYPE ditd_running_batches gauge\n"
            "ditd_running_batches{%s} %d\n", ml, g->running_batches);
    put(&b, "# HELP ditd_inflight_requests Accepted generation requests not yet answered.\n"
            "# TYPE ditd_inflight_requests gauge\nditd_inflight_requests %d\n", g->inflight_requests);
    put(&b, "# HELP ditd_replicas Replicas configured.\n# TYPE ditd_replicas gauge\nditd_replicas %d\n",
        g->replicas);
    put(&b, "# HELP ditd_replicas_up Replicas ready with a recent heartbeat.\n# TYPE ditd_replicas_up gauge\n"
            "ditd_replicas_up %d\n", g->replicas_up);
    put(&b, "# HELP ditd_draining 1 after SIGTERM/SIGINT.\n# TYPE ditd_draining gauge\nditd_draining %d\n",
        g->draining);
    put(&b, "# HELP ditd_images_total Images generated.\n# TYPE ditd_images_total counter\n"
            "ditd_images_total{%s} %llu\n", ml, (unsigned long long)m->images_total);
    put(&b, "# HELP ditd_lora_adapters LoRA adapters the server knows (--lora, --lora-dir, POST /v1/loras).\n"
            "# TYPE ditd_lora_adapters gauge\nditd_lora_adapters{%s} %d\n", ml, g->loras_loaded);
    put(&b, "# HELP ditd_lora_resident_bytes Device bytes of the LoRA adapters on the replicas now, summed over replicas (one rank's copy each).\n"
            "# TYPE ditd_lora_resident_bytes gauge\nditd_lora_resident_bytes{%s} %llu\n", ml,
        (unsigned long long)g->lora_resident_bytes);
    static const struct { const char *name, *help; size_t off; } lora_series[] = {
        {"ditd_lora_rows_total", "Images (rows of a batch) made carrying each LoRA adapter.",
         offsetof(ditd_metrics, lora_rows)},
        {"ditd_lora_loads_total", "LoRA adapter uploads to a replica's device (at start, POST /v1/loras, a cache miss).",
         offsetof(ditd_metrics, lora_loads)},
        {"ditd_lora_cache_hits_total", "Batches naming a LoRA adapter that found it on the device.",
         offsetof(ditd_metrics, lora_hits)},
        {"ditd_lora_cache_misses_total", "Batches naming a LoRA adapter that had to load it first (--lora-cache-mb).",
         offsetof(ditd_metrics, lora_misses)},
        {"ditd_lora_evictions_total", "LoRA adapters evicted from a replica's device to make room (--lora-cache-mb).",
         offsetof(ditd_metrics, lora_evictions)},
    };
    for (size_t k = 0; k < sizeof lora_series / sizeof lora_series[0]; k++) {
        const uint64_t *v = (const uint64_t *)((const char *)m + lora_series[k].off);
        put(&b, "# HELP %s %s\n# TYPE %s counter\n", lora_series[k].name, lora_series[k].help,
            lora_series[k].name);
        /* adapter names are letters, digits, '_', '-', '.': nothing to escape */
        for (int i = 0; i < g->n_loras && i < DITD_METRICS_MAX_LORAS; i++)
            if (g->lora_names[i])
                put(&b, "%s{%s,adapter=\"%s\"} %llu\n", lora_series[k].name, ml,
                    g->lora_names[i], (unsigned long long)v[i]);
    }
    put(&b, "# HELP ditd_canceled_samples_total Samples dropped (client gone, timeout, drain).\n"
            "# TYPE ditd_canceled_samples_total counter\nditd_canceled_samples_total{%s} %llu\n", ml,
        (unsigned long long)m->canceled_total);
    put(&b, "# HELP ditd_rejected_total Requests refused with 429 (queue full).\n"
            "# TYPE ditd_rejected_total counter\nditd_rejected_total{%s} %llu\n", ml,
        (unsigned long long)m->rejected_total);
    put(&b, "# HELP ditd_timeouts_total Requests that hit --request-timeout.\n"
            "# TYPE ditd_timeouts_total counter\nditd_timeouts_total{%s} %llu\n", ml,
        (unsigned long long)m->timeouts_total);
    put(&b, "# HELP ditd_cache_steps_total Denoising steps of images made with step caching, "
            "computed (the blocks ran) or skipped.\n# TYPE ditd_cache_steps_total counter\n"
            "ditd_cache_steps_total{%s,outcome=\"computed\"} %llu\n"
            "ditd_cache_steps_total{%s,outcome=\"skipped\"} %llu\n",
        ml, (unsigned long long)m->cache_steps_computed, ml,
        (unsigned long long)m->cache_steps_skipped);
    put(&b, "# HELP ditd_cache_block_evals_total Block evaluations (TaylorSeer: hooked-module calls) "
            "of images made with step caching, computed or skipped.\n"
            "# TYPE ditd_cache_block_evals_total counter\n"
            "ditd_cache_block_evals_total{%s,outcome=\"computed\"} %llu\n"
            "ditd_cache_block_evals_total{%s,outcome=\"skipped\"} %llu\n",
        ml, (unsigned long long)m->cache_evals_computed, ml,
        (unsigned long long)m->cache_evals_skipped);
    put(&b, "# HELP ditd_text_cache_hits_total Prompts whose embeddings came from a replica's cache.\n"
            "# TYPE ditd_text_cache_hits_total counter\nditd_text_cache_hits_total{%s} %llu\n", ml,
        (unsigned long long)g->text_cache_hits);
    put(&b, "# HELP ditd_text_cache_misses_total Prompts a replica's text encoders had to encode.\n"
            "# TYPE ditd_text_cache_misses_total counter\nditd_text_cache_misses_total{%s} %llu\n", ml,
        (unsigned long long)g->text_cache_misses);
    put(&b, "# HELP ditd_text_cache_entries Prompt embeddings held in the replicas' caches.\n"
            "# TYPE ditd_text_cache_entries gauge\nditd_text_cache_entries{%s} %llu\n", ml,
        (unsigned long long)g->text_cache_entries);
    put(&b, "# HELP ditd_text_encode_seconds_total Time the replicas spent in their text encoders.\n"
            "# TYPE ditd_text_encode_seconds_total counter\nditd_text_encode_seconds_total{%s} %.6f\n",
        ml, g->text_encode_s);
    put(&b, "# HELP ditd_replica_batches_total Batches run, by replica.\n"
            "# TYPE ditd_replica_batches_total counter\n");
    for (int r = 0; r < g->replicas && r < DITD_METRICS_MAX_REPLICAS; r++)
        put(&b, "ditd_replica_batches_total{replica=\"%d\"} %llu\n", r,
            (unsigned long long)m->replica_batches[r]);
    put(&b, "# HELP ditd_replica_samples_total Samples run, by replica.\n"
            "# TYPE ditd_replica_samples_total counter\n");
    for (int r = 0; r < g->replicas && r < DITD_METRICS_MAX_REPLICAS; r++)
        put(&b, "ditd_replica_samples_total{replica=\"%d\"} %llu\n", r,
            (unsigned long long)m->replica_samples[r]);
    put(&b, "# HELP ditd_http_connections Open client connections.\n"
            "# TYPE ditd_http_connections gauge\nditd_http_connections %d\n", g->connections);
    put(&b, "# HELP ditd_http_connections_refused_total Connections answered 503 at once, by reason.\n"
            "# TYPE ditd_http_connections_refused_total counter\n"
            "ditd_http_connections_refused_total{reason=\"capacity\"} %llu\n"
            "ditd_http_connections_refused_total{reason=\"per_client\"} %llu\n",
        (unsigned long long)g->refused_capacity, (unsigned long long)g->refused_per_client);
    put(&b, "# HELP ditd_http_read_timeouts_total Connections closed for a header or body deadline.\n"
            "# TYPE ditd_http_read_timeouts_total counter\nditd_http_read_timeouts_total %llu\n",
        (unsigned long long)g->read_timeouts);
    put(&b, "# HELP ditd_http_evicted_total Connections waiting for headers closed at the limit for a newcomer.\n"
            "# TYPE ditd_http_evicted_total counter\nditd_http_evicted_total %llu\n",
        (unsigned long long)g->evicted);
    static const char *const jstates[] = {"queued", "in_progress", "completed", "failed"};
    put(&b, "# HELP ditd_jobs Background jobs in the store, by status.\n# TYPE ditd_jobs gauge\n");
    for (int i = 0; i < 4; i++)
        put(&b, "ditd_jobs{status=\"%s\"} %lld\n", jstates[i], g->jobs[i]);
    put(&b, "# HELP ditd_job_store_bytes Bytes the job store holds: results, database, WAL.\n"
            "# TYPE ditd_job_store_bytes gauge\nditd_job_store_bytes %lld\n", g->store_bytes);
    put(&b, "# HELP ditd_jobs_created_total Background jobs accepted.\n"
            "# TYPE ditd_jobs_created_total counter\nditd_jobs_created_total %llu\n", g->jobs_created);
    put(&b, "# HELP ditd_jobs_expired_total Finished jobs deleted by --job-ttl.\n"
            "# TYPE ditd_jobs_expired_total counter\nditd_jobs_expired_total %llu\n", g->jobs_expired);
    put(&b, "# HELP ditd_jobs_deleted_total Jobs deleted by DELETE /v1/jobs/{id}.\n"
            "# TYPE ditd_jobs_deleted_total counter\nditd_jobs_deleted_total %llu\n", g->jobs_deleted);
    put(&b, "# HELP ditd_jobs_refused_storage_total New jobs refused with 507 (--data-max-gb).\n"
            "# TYPE ditd_jobs_refused_storage_total counter\nditd_jobs_refused_storage_total %llu\n",
        g->jobs_refused_full);
    put(&b, "# HELP ditd_webhooks_total Webhook events (--webhook-url): delivered, or dropped after "
            "the last retry.\n# TYPE ditd_webhooks_total counter\n"
            "ditd_webhooks_total{outcome=\"delivered\"} %llu\nditd_webhooks_total{outcome=\"dropped\"} %llu\n",
        g->hooks_delivered, g->hooks_dropped);
    put(&b, "# HELP ditd_webhook_failed_attempts_total Webhook deliveries that got no 2xx (each retried).\n"
            "# TYPE ditd_webhook_failed_attempts_total counter\nditd_webhook_failed_attempts_total %llu\n",
        g->hooks_failed);
    char dev[2 * sizeof m->device], com[128];
    label_value(dev, sizeof dev, m->device[0] ? m->device : "unknown");
    label_value(com, sizeof com, ditd_build_commit);
    put(&b, "# HELP ditd_build_info The build and what it serves on; the value is 1.\n"
            "# TYPE ditd_build_info gauge\n"
            "ditd_build_info{version=\"%s\",commit=\"%s\",backend=\"%s\",device=\"%s\"} 1\n",
        DITD_VERSION, com, m->backend[0] ? m->backend : "cpu", dev);
    put(&b, "# HELP ditd_model_load_seconds Seconds from start until the replica reported its model "
            "loaded.\n# TYPE ditd_model_load_seconds gauge\n");
    for (int r = 0; r < g->replicas && r < DITD_METRICS_MAX_REPLICAS; r++)
        if (m->load_s[r] > 0)
            put(&b, "ditd_model_load_seconds{%s,replica=\"%d\"} %.6f\n", ml, r, m->load_s[r]);
    process_metrics(&b);
    if (b.oom) {
        free(b.p);
        return NULL;
    }
    *len = b.len;
    return b.p;
}
