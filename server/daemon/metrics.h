/* Prometheus metrics of the front-end: counters and histograms updated on
 * the loop thread (no locks: one owner), rendered as text for GET /metrics.
 * Gauges (queue depth, running batches, replicas up) are read from the
 * scheduler when rendering, so they cannot drift.
 *
 * Not a general metrics library: the series are the ones docs/serving.md
 * lists. */
#ifndef DITD_SERVER_METRICS_H
#define DITD_SERVER_METRICS_H

#include <stddef.h>
#include <stdint.h>

#define DITD_HIST_BUCKETS 16

typedef struct ditd_hist {
    const double *bounds;     /* upper bounds, seconds (or samples) */
    int nb;
    uint64_t counts[DITD_HIST_BUCKETS + 1]; /* the last is +Inf */
    double sum;
    uint64_t count;
} ditd_hist;

typedef enum ditd_route {
    DITD_ROUTE_GENERATIONS = 0,
    DITD_ROUTE_MODELS,
    DITD_ROUTE_HEALTHZ,
    DITD_ROUTE_READYZ,
    DITD_ROUTE_METRICS,
    DITD_ROUTE_OPENAPI,
    DITD_ROUTE_OTHER,
    DITD_ROUTE_PAGE,
    DITD_ROUTE_JOBS,          /* /v1/jobs and /v1/jobs/{id}... */
    DITD_ROUTE_VIDEOS,        /* /v1/videos and /v1/videos/{id}... */
    DITD_ROUTE_LORAS,         /* /v1/loras */
    DITD_ROUTE_EDITS,         /* /v1/images/edits */
} ditd_route;
#define DITD_ROUTE_COUNT 12
const char *ditd_route_name(ditd_route r);

#define DITD_METRICS_MAX_REPLICAS 64
#define DITD_METRICS_MAX_LORAS 64 /* DITD_LORA_SPEC_MAX */

typedef struct ditd_metrics {
    struct { ditd_route route; int status; uint64_t n; } by_status[96];
    int n_by_status;
    ditd_hist latency;        /* generations, arrival to last byte queued */
    ditd_hist queue_time;     /* arrival to dispatch */
    ditd_hist step_time;      /* one denoising step of a batch */
    ditd_hist batch_size;     /* samples per batch */
    ditd_hist job_wait[2];    /* background jobs [image, video]: created to started, s */
    ditd_hist job_run[2];     /* started to its result stored, s */
    uint64_t images_total;
    uint64_t canceled_total;  /* samples dropped: disconnect, timeout */
    uint64_t rejected_total;  /* 429 */
    uint64_t timeouts_total;
    /* step caching, over the images made with a cache: denoising steps
     * and block evaluations computed and skipped */
    uint64_t cache_steps_computed, cache_steps_skipped;
    uint64_t cache_evals_computed, cache_evals_skipped;
    uint64_t replica_batches[DITD_METRICS_MAX_REPLICAS];
    uint64_t replica_samples[DITD_METRICS_MAX_REPLICAS];
    /* LoRA adapters (docs/lora.md), by the server's index of each: the
     * images (rows of a batch) made carrying it */
    uint64_t lora_rows[DITD_METRICS_MAX_LORAS];
    /* and what the replicas' adapter caches did with it, summed over the
     * replicas (LoraEvents): uploads to a device (start, POST /v1/loras, a
     * miss), batches that found it resident or not, evictions */
    uint64_t lora_loads[DITD_METRICS_MAX_LORAS];
    uint64_t lora_hits[DITD_METRICS_MAX_LORAS];
    uint64_t lora_misses[DITD_METRICS_MAX_LORAS];
    uint64_t lora_evictions[DITD_METRICS_MAX_LORAS];
    /* operator series: ditd_build_info, ditd_model_load_seconds */
    char backend[16];         /* "cpu", "cuda" */
    char device[128];         /* what it runs on: the CPU or GPU model */
    double load_s[DITD_METRICS_MAX_REPLICAS]; /* start to first "ready"; 0: not yet */
} ditd_metrics;

void ditd_metrics_init(ditd_metrics *m);
void ditd_hist_observe(ditd_hist *h, double v);
void ditd_metrics_count_request(ditd_metrics *m, ditd_route route, int status);
/* The serving backend for ditd_build_info (ditd_device_name: "cpu",
 * "cuda"); the device label is looked up here, once: the CPU model from
 * /proc/cpuinfo, the GPU model from the NVIDIA driver's /proc entries,
 * "unknown" when neither says. Call after ditd_metrics_init. */
void ditd_metrics_set_backend(ditd_metrics *m, const char *backend);
/* A replica said ready for the first time, `seconds` after the front-end
 * started: its model load time as an operator sees it (start-up included). */
void ditd_metrics_replica_ready(ditd_metrics *m, int replica, double seconds);

/* The live gauges the scheduler knows. */
typedef struct ditd_metrics_gauges {
    const char *model;
    int queue_depth;
    int running_batches;
    int replicas;
    int replicas_up;
    int inflight_requests;
    int draining;
    /* the HTTP edge (server/daemon/http.h) */
    int connections;
    uint64_t refused_capacity, refused_per_client, read_timeouts, evicted;
    /* text models: the replicas' prompt-embedding caches and encoders,
     * summed over their latest heartbeats (0 for class models) */
    uint64_t text_cache_hits, text_cache_misses, text_cache_entries;
    double text_encode_s;
    /* background jobs (server/daemon/jobrun.h): rows by status (queued,
     * in_progress, completed, failed), the store's bytes, and the
     * runner's counters */
    long long jobs[4];
    long long store_bytes;
    unsigned long long jobs_created, jobs_expired, jobs_deleted, jobs_refused_full;
    /* webhooks (webhook.h): events delivered, failed attempts, events dropped */
    unsigned long long hooks_delivered, hooks_failed, hooks_dropped;
    /* LoRA adapters: their names by slot (m->lora_rows; NULL: a free
     * slot, skipped), how many are known, and the device bytes resident,
     * summed over the replicas (one rank's copy each) */
    const char *const *lora_names;
    int n_loras;
    int loras_loaded;
    uint64_t lora_resident_bytes;
} ditd_metrics_gauges;

/* Prometheus text exposition (version 0.0.4), malloc'd; NULL on OOM.
 * Also renders the process_* series of this process (RSS, fds, CPU time),
 * read from /proc/self at each call. */
char *ditd_metrics_render(const ditd_metrics *m, const ditd_metrics_gauges *g, size_t *len);

#endif
