/* The front-end's scheduler (server/daemon/sched.h) and job lifecycle
 * (server/daemon/job.h) without HTTP: a ditd_srv with an in-process hub whose
 * replica ends this test reads, and a job sink that records what the HTTP
 * side would hear. Covers the batcher (compatibility, the window, the
 * queue's cost order, --max-cost), a text model's batches (grouped by size
 * and max_sequence_length, carrying prompts; results of each size; the
 * heartbeats' cache counters), the replica router (least loaded, busy,
 * a stalled replica), results and drops, LoRA adapters at run time
 * (sched_lora.c: a load on every replica, its undo when one replica
 * fails, an unload, the cache's events into /metrics, a replica lost
 * mid-load), and mutated replica messages (each job still ends in at most
 * one outcome, nothing crashes; ASan and UBSan run this in CI). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/core/error.h"
#include "proto/ditd.pb-c.h"
#include "server/daemon/job.h"
#include "server/daemon/log.h"
#include "server/daemon/sched.h"
#include "server/daemon/serve.h"

static int failures, checks;

#define CHECK(cond, ...)                                                                   \
    do {                                                                                   \
        checks++;                                                                          \
        if (!(cond)) {                                                                     \
            failures++;                                                                    \
            printf("FAIL %s:%d: ", __FILE__, __LINE__);                                    \
            printf(__VA_ARGS__);                                                           \
            printf("\n");                                                                  \
        }                                                                                  \
    } while (0)

/* ---- what the HTTP side would hear */

typedef struct heard {
    int complete, failed, progress, partial;
    int last_status;
    char last_code[64];
} heard;

static heard H[64];

static heard *heard_of(ditd_job *j)
{
    return &H[j->id % 64];
}

static void on_progress(ditd_job *j, int step, int total)
{
    (void)step;
    (void)total;
    heard_of(j)->progress++;
}

static void on_partial(ditd_job *j, int image, int pi, const uint8_t *px)
{
    (void)image;
    (void)pi;
    (void)px;
    heard_of(j)->partial++;
}

static void on_complete(ditd_job *j)
{
    heard_of(j)->complete++;
    ditd_job_answered(j);
}

static void on_failed(ditd_job *j, const ditd_api_error *e)
{
    heard *h = heard_of(j);
    h->failed++;
    h->last_status = e->status;
    snprintf(h->last_code, sizeof h->last_code, "%s", e->code ? e->code : "");
    ditd_job_answered(j);
}

static const ditd_job_sink sink = {on_progress, on_partial, on_complete, on_failed};

/* ---- the harness */

static ditd_srv S;
static uv_loop_t loop;
static const char *cur; /* the case running */

static void wake_noop(void *ud)
{
    (void)ud;
}

static void srv_init(const char *name, int nrep, int max_batch, int window_ms)
{
    cur = name;
    memset(&S, 0, sizeof S);
    memset(H, 0, sizeof H);
    uv_loop_init(&loop);
    S.loop = &loop;
    uv_timer_init(&loop, &S.window);
    S.window.data = &S;
    S.cfg.max_batch = max_batch;
    S.cfg.batch_window_ms = window_ms;
    S.cfg.max_queue = 64;
    S.cfg.heartbeat_timeout_ms = 1000;
    strcpy(S.info.name, "m");
    S.info.shapes.height = S.info.shapes.width = 28; /* latents = pixels: no vae */
    S.info.shapes.in_channels = 1;
    S.info.shapes.tokens = 49;                          /* patch 4 */
    S.info.image_width = S.info.image_height = 28;
    S.info.image_channels = 1;
    S.nrep = nrep;
    S.rep = calloc((size_t)nrep, sizeof *S.rep);
    S.t_start = ditd__now();
    ditd_metrics_init(&S.m);
    if (ditd_hub_new_inproc(nrep, wake_noop, NULL, &S.hub)) {
        printf("FAIL: no hub\n");
        exit(1);
    }
    for (int r = 0; r < nrep; r++) {
        S.rep[r].ready = 1;
        S.rep[r].last_hb = ditd__now();
    }
}

static void answer(int r, const Ditd__Batch *b, int drop_slot);
static Ditd__Envelope *batch_to(int r);

/* Answers every batch sent until none is left (so every job lets go). */
static void drain_all(void)
{
    for (int again = 1; again;) {
        again = 0;
        for (int r = 0; r < S.nrep; r++) {
            Ditd__Envelope *env = batch_to(r);
            if (env) {
                S.rep[r].last_hb = ditd__now();
                answer(r, env->batch, -1);
                ditd__envelope__free_unpacked(env, NULL);
                again = 1;
            }
        }
    }
}

static void srv_free(void)
{
    drain_all();
    CHECK(S.jobs.live == 0 && S.q_len == 0, "%s: every job was freed (%d live, %d queued)", cur,
          S.jobs.live, S.q_len);
    /* drop what the replicas were sent */
    for (int r = 0; r < S.nrep; r++) {
        ditd_transport *t = ditd_hub_transport(S.hub, r);
        uint8_t *buf;
        size_t len;
        while (t->recv(t, &buf, &len, 0) == 0)
            free(buf);
    }
    ditd_hub_free(S.hub);
    uv_close((uv_handle_t *)&S.window, NULL);
    uv_run(&loop, UV_RUN_DEFAULT);
    uv_loop_close(&loop);
    free(S.rep);
}

static ditd_job *submit_ex(int n, int steps, int sampler, int *status)
{
    ditd_job *j = ditd_job_new(&S.jobs, &S, &sink, NULL);
    ditd_genreq rq = {0};
    ditd_api_error e;
    rq.n = n;
    rq.width = rq.height = 28;
    rq.steps = steps;
    rq.sampler = (ditd_sampler_kind)sampler;
    rq.guidance = 1.0f;
    rq.seed = 1;
    ditd_job_accept(j, &rq, ditd_genreq_numel(&rq, &S.info));
    *status = ditd__sched_submit(&S, j, &e);
    if (*status)
        ditd_job_refuse(j);
    return j;
}

static ditd_job *submit(int n, int steps)
{
    int st;
    ditd_job *j = submit_ex(n, steps, 0, &st);
    CHECK(st == 0, "submit n=%d steps=%d: status %d", n, steps, st);
    return j;
}

/* The next message replica r was sent, unpacked (NULL: none). */
static Ditd__Envelope *sent_to(int r)
{
    ditd_transport *t = ditd_hub_transport(S.hub, r);
    uint8_t *buf;
    size_t len;
    if (t->recv(t, &buf, &len, 0))
        return NULL;
    Ditd__Envelope *env = ditd__envelope__unpack(NULL, len, buf);
    free(buf);
    return env;
}

/* The next Batch sent to r, skipping other messages (NULL: none). */
static Ditd__Envelope *batch_to(int r)
{
    Ditd__Envelope *env;
    while ((env = sent_to(r))) {
        if (env->msg_case == DITD__ENVELOPE__MSG_BATCH)
            return env;
        ditd__envelope__free_unpacked(env, NULL);
    }
    return NULL;
}

static void deliver(int r, Ditd__Envelope *env)
{
    size_t len = ditd__envelope__get_packed_size(env);
    uint8_t *buf = malloc(len ? len : 1);
    ditd__envelope__pack(env, buf);
    ditd__sched_on_message(&S, r, buf, len);
    free(buf);
}

/* Replica r answers batch b: every slot with pixels, or dropped when
 * `drop_slot` names it. */
static void answer(int r, const Ditd__Batch *b, int drop_slot)
{
    static uint8_t px[28 * 28];
    Ditd__Envelope env = DITD__ENVELOPE__INIT;
    Ditd__Result res = DITD__RESULT__INIT;
    Ditd__Image im[DITD_WORKER_MAX_BATCH], *imp[DITD_WORKER_MAX_BATCH];
    for (size_t i = 0; i < b->n_samples; i++) {
        ditd__image__init(&im[i]);
        im[i].slot = (uint32_t)i;
        if ((int)i == drop_slot) {
            im[i].canceled = 1;
        } else {
            im[i].pixels.data = px;
            im[i].pixels.len = sizeof px;
        }
        imp[i] = &im[i];
    }
    res.batch_id = b->batch_id;
    res.width = res.height = 28;
    res.channels = 1;
    res.n_images = b->n_samples;
    res.images = imp;
    env.msg_case = DITD__ENVELOPE__MSG_RESULT;
    env.result = &res;
    deliver(r, &env);
}

/* Lets go of the test's reference (the connection's, in the server). */
static void release(ditd_job **jobs, int n)
{
    for (int i = 0; i < n; i++) {
        if (!ditd_job_terminal(jobs[i]))
            ditd__sched_fail(&S, jobs[i], 503, "server_error", "test_end", "test end");
        ditd_job_unref(jobs[i]);
    }
}

/* ---- cases */

/* Step caching: requests with different caching are batched apart; the
 * batch carries the config exactly; the Result's per-slot counts reach the
 * jobs and the metrics. */
static ditd_job *submit_cache(const char *spec)
{
    ditd_job *j = ditd_job_new(&S.jobs, &S, &sink, NULL);
    ditd_genreq rq = {0};
    ditd_api_error e;
    rq.n = 1;
    rq.width = rq.height = 28;
    rq.steps = 4;
    rq.guidance = 1.0f;
    rq.seed = 1;
    CHECK(ditd_cache_config_parse(spec, &rq.cache) == 0, "spec %s", spec);
    ditd_job_accept(j, &rq, ditd_genreq_numel(&rq, &S.info));
    CHECK(ditd__sched_submit(&S, j, &e) == 0, "submit %s", spec);
    return j;
}

static void test_cache_batches(void)
{
    static uint8_t px[28 * 28];
    srv_init("cache", 1, 4, 0);
    ditd_fbatch busy = {0};
    S.rep[0].running = &busy;
    ditd_job *j[4] = {submit_cache("first_block_cache:threshold=0.2"), submit_cache("none"),
                      submit_cache("first_block_cache:threshold=0.2"),
                      submit_cache("first_block_cache:threshold=0.30000000000000004")};
    S.rep[0].running = NULL;
    ditd__sched_kick(&S);
    Ditd__Envelope *env = batch_to(0);
    CHECK(env && env->batch->n_samples == 2 && env->batch->cache &&
              env->batch->cache->method == DITD_CACHE_FIRST_BLOCK &&
              env->batch->cache->threshold == 0.2,
          "the same caching shares a batch, carried exactly (%zu samples, threshold %.17g)",
          env ? env->batch->n_samples : 0,
          env && env->batch->cache ? env->batch->cache->threshold : -1.0);
    if (env) {
        Ditd__Envelope out = DITD__ENVELOPE__INIT;
        Ditd__Result res = DITD__RESULT__INIT;
        Ditd__Image im[2], *imp[2];
        Ditd__CacheStats cs[2], *csp[2];
        for (int i = 0; i < 2; i++) {
            ditd__image__init(&im[i]);
            im[i].slot = (uint32_t)i;
            im[i].pixels.data = px;
            im[i].pixels.len = sizeof px;
            imp[i] = &im[i];
            ditd__cache_stats__init(&cs[i]);
            cs[i].slot = (uint32_t)i;
            cs[i].steps = 4;
            cs[i].steps_skipped = (uint32_t)(1 + i);
            cs[i].evals = 8;
            cs[i].evals_skipped = (uint64_t)(1 + i);
            csp[i] = &cs[i];
        }
        res.batch_id = env->batch->batch_id;
        res.width = res.height = 28;
        res.channels = 1;
        res.n_images = 2;
        res.images = imp;
        res.n_cache = 2;
        res.cache = csp;
        out.msg_case = DITD__ENVELOPE__MSG_RESULT;
        out.result = &res;
        deliver(0, &out);
        ditd__envelope__free_unpacked(env, NULL);
    }
    CHECK(j[0]->cache_steps == 4 && j[0]->cache_steps_skipped == 1 && j[2]->cache_steps_skipped == 2 &&
              j[2]->cache_evals_skipped == 2,
          "each job has its slot's counts (%ld %ld %ld)", j[0]->cache_steps,
          j[0]->cache_steps_skipped, j[2]->cache_steps_skipped);
    CHECK(S.m.cache_steps_skipped == 3 && S.m.cache_steps_computed == 5 &&
              S.m.cache_evals_skipped == 3 && S.m.cache_evals_computed == 13,
          "metrics: steps %llu computed %llu skipped, evals %llu / %llu",
          (unsigned long long)S.m.cache_steps_computed, (unsigned long long)S.m.cache_steps_skipped,
          (unsigned long long)S.m.cache_evals_computed, (unsigned long long)S.m.cache_evals_skipped);
    for (int k = 0; k < 2; k++) {
        env = batch_to(0);
        int none = k == 0;
        CHECK(env && env->batch->n_samples == 1 &&
                  (none ? env->batch->cache == NULL
                        : env->batch->cache && env->batch->cache->threshold == 0.30000000000000004),
              "%s goes alone", none ? "no caching" : "another threshold");
        if (env) {
            answer(0, env->batch, -1);
            ditd__envelope__free_unpacked(env, NULL);
        }
    }
    release(j, 4);
    srv_free();
}

static void test_compatibility(void)
{
    srv_init("compatibility", 1, 4, 0);
    /* the replica is busy: all three queue */
    ditd_fbatch busy = {0};
    S.rep[0].running = &busy;
    ditd_job *j[3] = {submit(1, 4), submit(1, 8), submit(1, 4)};
    CHECK(batch_to(0) == NULL, "a busy replica gets no batch");
    S.rep[0].running = NULL;
    ditd__sched_kick(&S);
    Ditd__Envelope *env = batch_to(0);
    CHECK(env && env->batch->n_samples == 2 && env->batch->steps == 4,
          "compatible requests (same steps) share a batch: %zu samples, steps %u",
          env ? env->batch->n_samples : 0, env ? env->batch->steps : 0);
    if (env) {
        CHECK(env->batch->samples[0]->request_id == j[0]->id &&
                  env->batch->samples[1]->request_id == j[2]->id,
              "the batch holds the first and third requests");
        answer(0, env->batch, -1);
        ditd__envelope__free_unpacked(env, NULL);
    }
    CHECK(heard_of(j[0])->complete == 1 && heard_of(j[2])->complete == 1, "both completed");
    env = batch_to(0);
    CHECK(env && env->batch->n_samples == 1 && env->batch->steps == 8,
          "the incompatible one goes next, alone");
    if (env) {
        answer(0, env->batch, 0);
        ditd__envelope__free_unpacked(env, NULL);
    }
    CHECK(heard_of(j[1])->failed == 1 && heard_of(j[1])->last_status == 500,
          "a dropped image fails its request with 500 (got %d)", heard_of(j[1])->last_status);
    release(j, 3);
    srv_free();
}

static void test_window(void)
{
    srv_init("window", 1, 4, 150);
    ditd_job *j[3];
    j[0] = submit(1, 4);
    CHECK(batch_to(0) == NULL, "a lone small request waits for the window");
    double t0 = ditd__now();
    uv_run(&loop, UV_RUN_DEFAULT); /* the window timer */
    double dt = ditd__now() - t0;
    Ditd__Envelope *env = batch_to(0);
    CHECK(env && env->batch->n_samples == 1 && dt > 0.1 && dt < 1.0,
          "after the window (%.3f s) it goes alone", dt);
    if (env) {
        answer(0, env->batch, -1);
        ditd__envelope__free_unpacked(env, NULL);
    }
    /* a full batch does not wait */
    j[1] = submit(2, 4);
    j[2] = submit(2, 4);
    env = batch_to(0);
    CHECK(env && env->batch->n_samples == 4, "a full batch (max 4) leaves at once");
    if (env) {
        answer(0, env->batch, -1);
        ditd__envelope__free_unpacked(env, NULL);
    }
    CHECK(heard_of(j[1])->complete == 1 && heard_of(j[2])->complete == 1, "both completed");
    release(j, 3);
    srv_free();
}

static void test_least_loaded(void)
{
    srv_init("least loaded", 3, 2, 0);
    S.rep[0].samples = 5;
    S.rep[1].samples = 2;
    S.rep[2].samples = 9;
    ditd_job *j[3] = {submit(2, 4), submit(2, 5), submit(2, 6)};
    Ditd__Envelope *e1 = batch_to(1), *e0 = batch_to(0), *e2 = batch_to(2);
    CHECK(e1 && e1->batch->steps == 4, "the first batch goes to the least loaded replica (1)");
    CHECK(e0 && e0->batch->steps == 5, "the second to the next least loaded idle one (0)");
    CHECK(e2 && e2->batch->steps == 6, "the third to the last idle one (2)");
    if (e0 && e1 && e2) {
        answer(0, e0->batch, -1);
        answer(1, e1->batch, -1);
        answer(2, e2->batch, -1);
    }
    for (int i = 0; i < 3; i++)
        CHECK(heard_of(j[i])->complete == 1, "request %d completed", i);
    ditd__envelope__free_unpacked(e0, NULL);
    ditd__envelope__free_unpacked(e1, NULL);
    ditd__envelope__free_unpacked(e2, NULL);
    release(j, 3);
    srv_free();
}

/* --long-cost / --long-replicas: with two replicas and one for long work,
 * a second long job waits while a short one takes the free replica; it
 * runs when the first long one is done. Without the limit it runs at once. */
static void long_work(int limit)
{
    srv_init(limit ? "long work, one replica" : "long work, no limit", 2, 4, 0);
    S.cfg.long_cost = 1000;   /* 2 x 20 steps x 49 tokens = 1960: long; 1 x 4 x 49: short */
    S.cfg.long_replicas = limit;
    ditd_job *a = submit(2, 20);
    Ditd__Envelope *ea = batch_to(0), *ea1 = ea ? NULL : batch_to(1);
    int ra = ea ? 0 : 1;
    if (!ea)
        ea = ea1;
    CHECK(ea && ea->batch->steps == 20, "%s: the first long job runs", cur);
    ditd_job *b = submit(2, 21);
    Ditd__Envelope *eb = batch_to(1 - ra);
    if (limit) {
        CHECK(eb == NULL, "%s: a second long job waits (one replica for long work)", cur);
        ditd_job *c = submit(1, 4);
        Ditd__Envelope *ec = batch_to(1 - ra);
        CHECK(ec && ec->batch->steps == 4, "%s: a short job takes the free replica", cur);
        if (ec)
            answer(1 - ra, ec->batch, -1);
        CHECK(heard_of(c)->complete == 1, "%s: the short job completed", cur);
        ditd__envelope__free_unpacked(ec, NULL);
        CHECK(batch_to(1 - ra) == NULL, "%s: the long job still waits for the long replica", cur);
        if (ea)
            answer(ra, ea->batch, -1);
        Ditd__Envelope *e0 = batch_to(0), *e1 = batch_to(1);
        eb = e0 ? e0 : e1;
        CHECK(eb && eb->batch->steps == 21 && !(e0 && e1),
              "%s: when the first is done, the second long job runs", cur);
        if (eb)
            answer(e0 ? 0 : 1, eb->batch, -1);
        release(&c, 1);
    } else {
        CHECK(eb && eb->batch->steps == 21, "%s: the second long job runs at once", cur);
        if (ea)
            answer(ra, ea->batch, -1);
        if (eb)
            answer(1 - ra, eb->batch, -1);
    }
    CHECK(heard_of(a)->complete == 1 && heard_of(b)->complete == 1, "%s: both long jobs completed",
          cur);
    ditd__envelope__free_unpacked(ea, NULL);
    ditd__envelope__free_unpacked(eb, NULL);
    ditd_job *jobs[2] = {a, b};
    release(jobs, 2);
    srv_free();
}

static void test_long_work(void)
{
    long_work(0);
    long_work(1);
}

static void test_stalled(void)
{
    srv_init("stalled", 2, 2, 0);
    S.rep[0].samples = 0;
    S.rep[1].samples = 10;
    ditd_job *j[2];
    j[0] = submit(2, 4); /* to replica 0 */
    Ditd__Envelope *e0 = batch_to(0);
    CHECK(e0 != NULL, "replica 0 got the first batch");
    /* replica 0 goes silent past the heartbeat timeout */
    S.rep[0].last_hb = ditd__now() - 2.0;
    CHECK(ditd__sched_replica_alive(&S, 0) == 0 && ditd__sched_replica_alive(&S, 1) == 1,
          "the silent replica is not alive, the other is");
    ditd__sched_watch(&S);
    CHECK(heard_of(j[0])->failed == 1 && heard_of(j[0])->last_status == 503 &&
              !strcmp(heard_of(j[0])->last_code, "replica_stalled"),
          "its running request fails with 503 replica_stalled (got %d %s)",
          heard_of(j[0])->last_status, heard_of(j[0])->last_code);
    j[1] = submit(2, 4);
    Ditd__Envelope *e1 = batch_to(1);
    CHECK(e1 != NULL && batch_to(0) == NULL, "new work goes around the stalled replica");
    if (e1)
        answer(1, e1->batch, -1);
    CHECK(heard_of(j[1])->complete == 1, "and completes there");
    /* the stalled one answers late: ignored, no second outcome */
    if (e0)
        answer(0, e0->batch, -1);
    CHECK(heard_of(j[0])->complete == 0 && heard_of(j[0])->failed == 1,
          "a late answer of the stalled replica changes nothing");
    ditd__envelope__free_unpacked(e0, NULL);
    ditd__envelope__free_unpacked(e1, NULL);
    release(j, 2);
    srv_free();
}

static void test_cost_order(void)
{
    srv_init("cost order", 1, 8, 0);
    ditd_fbatch busy = {0};
    S.rep[0].running = &busy;
    S.sec_per_cost = 1e-4; /* measured: 0.1 ms per unit */
    ditd_job *j[3];
    j[0] = submit(8, 100); /* cost 8 x 100 x 49 */
    j[1] = submit(8, 100);
    j[2] = submit(1, 3);   /* cost 147: arrives last, deadline first */
    CHECK(S.q_head == j[2] && S.q_tail == j[1], "the light request heads the queue");
    S.rep[0].running = NULL;
    ditd__sched_kick(&S);
    Ditd__Envelope *env = batch_to(0);
    CHECK(env && env->batch->steps == 3, "it runs first");
    if (env) {
        answer(0, env->batch, -1);
        ditd__envelope__free_unpacked(env, NULL);
    }
    env = batch_to(0);
    CHECK(env && env->batch->samples[0]->request_id == j[0]->id, "then the heavy ones, in arrival order");
    if (env)
        answer(0, env->batch, -1);
    ditd__envelope__free_unpacked(env, NULL);
    CHECK(ditd__sched_cost(&S, &j[0]->rq) == 8ull * 100 * 49, "cost = n x steps x tokens");
    release(j, 3);
    /* a ceiling */
    S.cfg.max_cost = 1000;
    int st;
    ditd_job *k = submit_ex(1, 30, 0, &st); /* 1470 */
    CHECK(st == 400, "over --max-cost: 400 (got %d)", st);
    release(&k, 1);
    srv_free();
}

/* A text model (FLUX-like: any multiple of 16 in 16..256, 8x VAE, 2x2
 * patches): a request of its own size, T5 length and prompts. */
static ditd_job *submit_text(int n, int w, int h, int msl, const char *prompt, const char *neg,
                             float true_cfg)
{
    ditd_job *j = ditd_job_new(&S.jobs, &S, &sink, NULL);
    ditd_genreq rq = {0};
    ditd_api_error e;
    rq.n = n;
    rq.width = w;
    rq.height = h;
    rq.steps = 4;
    rq.sampler = DITD_SAMPLER_FLOW_EULER;
    rq.guidance = 3.5f;
    rq.seed = 7;
    rq.prompt = strdup(prompt);
    rq.negative_prompt = neg ? strdup(neg) : NULL;
    rq.true_cfg = true_cfg;
    rq.max_sequence_length = msl;
    CHECK(ditd_job_accept(j, &rq, ditd_genreq_numel(&rq, &S.info)) == 0, "accept");
    int st = ditd__sched_submit(&S, j, &e);
    CHECK(st == 0, "submit a text request %dx%d: status %d", w, h, st);
    if (st)
        ditd_job_refuse(j);
    return j;
}

/* Replica r answers a text batch: RGB images of the batch's size. */
static void answer_sized(int r, const Ditd__Batch *b)
{
    size_t numel = 3 * (size_t)b->width * b->height;
    uint8_t *px = calloc(numel, 1);
    Ditd__Envelope env = DITD__ENVELOPE__INIT;
    Ditd__Result res = DITD__RESULT__INIT;
    Ditd__Image im[DITD_WORKER_MAX_BATCH], *imp[DITD_WORKER_MAX_BATCH];
    for (size_t i = 0; i < b->n_samples; i++) {
        ditd__image__init(&im[i]);
        im[i].slot = (uint32_t)i;
        im[i].pixels.data = px;
        im[i].pixels.len = numel;
        imp[i] = &im[i];
    }
    res.batch_id = b->batch_id;
    res.width = b->width;
    res.height = b->height;
    res.channels = 3;
    res.n_images = b->n_samples;
    res.images = imp;
    env.msg_case = DITD__ENVELOPE__MSG_RESULT;
    env.result = &res;
    deliver(r, &env);
    free(px);
}

static void test_text_batches(void)
{
    srv_init("text batches", 1, 8, 0);
    S.info.shapes.cond.kind = DITD_COND_TEXT;
    S.info.shapes.height = S.info.shapes.width = 4; /* 32x32 px: 2x2 patches, 4 tokens */
    S.info.shapes.in_channels = 16;
    S.info.shapes.tokens = 4;
    S.info.image_width = S.info.image_height = 32;
    S.info.image_channels = 3;
    S.info.vae_scale = 8;
    S.info.resizable = 1;
    S.info.size_multiple = 16;
    S.info.min_size = 16;
    S.info.max_size = 256;
    S.info.max_sequence_length = S.info.default_max_sequence_length = 512;
    ditd_fbatch busy = {0};
    S.rep[0].running = &busy; /* they queue, then leave in compatible groups */
    ditd_job *j[5];
    j[0] = submit_text(2, 32, 32, 512, "a red fox", NULL, 1.0f);
    j[1] = submit_text(1, 48, 32, 512, "a blue bird", "blurry", 4.0f);
    j[2] = submit_text(1, 32, 32, 77, "a cat", NULL, 1.0f);
    j[3] = submit_text(1, 32, 32, 512, "\xe7\x8c\xab, \xc3\xa9t\xc3\xa9", "", 1.5f);
    j[4] = submit_text(1, 48, 32, 512, "a fox", NULL, 1.0f);
    CHECK(ditd__sched_cost(&S, &j[0]->rq) == 2ull * 4 * (4 + 512),
          "a text request's cost counts its joint sequence: %llu",
          (unsigned long long)ditd__sched_cost(&S, &j[0]->rq));
    CHECK(ditd__sched_cost(&S, &j[1]->rq) == 1ull * 4 * (6 + 512),
          "and its size's image tokens (48x32: 6): %llu",
          (unsigned long long)ditd__sched_cost(&S, &j[1]->rq));
    S.rep[0].running = NULL;
    ditd__sched_kick(&S);
    /* 32x32 / 512: j0 (2 images) and j3; then 48x32: j1 and j4; then 32x32 / 77: j2 */
    struct { int w, h, msl, n; uint64_t first, last; } want[3] = {
        {32, 32, 512, 3, j[0]->id, j[3]->id}, {48, 32, 512, 2, j[1]->id, j[4]->id},
        {32, 32, 77, 1, j[2]->id, j[2]->id}};
    for (int k = 0; k < 3; k++) {
        Ditd__Envelope *env = batch_to(0);
        CHECK(env != NULL, "text batch %d sent", k);
        if (!env)
            break;
        Ditd__Batch *b = env->batch;
        CHECK((int)b->width == want[k].w && (int)b->height == want[k].h &&
                  (int)b->max_sequence_length == want[k].msl && (int)b->n_samples == want[k].n,
              "batch %d: %ux%u, max_sequence_length %u, %zu samples (want %dx%d, %d, %d)", k,
              b->width, b->height, b->max_sequence_length, b->n_samples, want[k].w, want[k].h,
              want[k].msl, want[k].n);
        CHECK(b->n_samples > 0 && b->samples[0]->request_id == want[k].first &&
                  b->samples[b->n_samples - 1]->request_id == want[k].last,
              "batch %d holds the requests of its group, in queue order", k);
        for (size_t i = 0; i < b->n_samples; i++) {
            ditd_job *o = NULL;
            for (int q = 0; q < 5; q++)
                if (j[q]->id == b->samples[i]->request_id)
                    o = j[q];
            CHECK(o && !strcmp(b->samples[i]->prompt, o->rq.prompt) &&
                      !strcmp(b->samples[i]->negative_prompt,
                              o->rq.negative_prompt ? o->rq.negative_prompt : "") &&
                      b->samples[i]->true_cfg == o->rq.true_cfg,
                  "batch %d sample %zu carries its request's prompt \"%s\", negative prompt and "
                  "true_cfg %g", k, i, b->samples[i]->prompt, (double)b->samples[i]->true_cfg);
        }
        answer_sized(0, b);
        ditd__envelope__free_unpacked(env, NULL);
    }
    for (int i = 0; i < 5; i++)
        CHECK(heard_of(j[i])->complete == 1 && j[i]->numel == 3u * j[i]->rq.width * j[i]->rq.height,
              "text request %d completed with %dx%d RGB images", i, j[i]->rq.width, j[i]->rq.height);
    /* an image of another size than the request's is a drop, not a copy */
    ditd_job *k = submit_text(1, 48, 48, 512, "a fox", NULL, 1.0f);
    Ditd__Envelope *env = batch_to(0);
    if (env) {
        env->batch->width = 32; /* the replica answers 32x32 */
        env->batch->height = 32;
        answer_sized(0, env->batch);
        ditd__envelope__free_unpacked(env, NULL);
    }
    CHECK(heard_of(k)->failed == 1 && heard_of(k)->last_status == 500,
          "an image of the wrong size fails its request with 500 (got %d)", heard_of(k)->last_status);
    /* heartbeats: each replica's latest counters are kept */
    Ditd__Envelope hb = DITD__ENVELOPE__INIT;
    Ditd__Heartbeat h = DITD__HEARTBEAT__INIT;
    h.ready = 1;
    h.text_cache_hits = 5;
    h.text_cache_misses = 3;
    h.text_cache_entries = 3;
    h.text_encode_ms = 12.5;
    hb.msg_case = DITD__ENVELOPE__MSG_HEARTBEAT;
    hb.heartbeat = &h;
    deliver(0, &hb);
    h.text_cache_hits = 7;
    deliver(0, &hb);
    CHECK(S.rep[0].text_hits == 7 && S.rep[0].text_misses == 3 && S.rep[0].text_entries == 3 &&
              S.rep[0].text_encode_ms == 12.5,
          "the latest heartbeat's text counters are kept (hits %llu)",
          (unsigned long long)S.rep[0].text_hits);
    release(j, 5);
    release(&k, 1);
    srv_free();
}

/* Sizes do not break the queue's fairness: a light request of another size
 * overtakes a heavy one that waits; lights that arrive after the heavy
 * one's deadline queue behind it, and may only ride along in a batch that
 * leaves anyway (a light head's, up to --max-batch): the heavy one goes
 * next, before the lights left over. */
static void test_text_fairness(void)
{
    srv_init("text fairness", 1, 4, 0);
    S.info.shapes.cond.kind = DITD_COND_TEXT;
    S.info.shapes.height = S.info.shapes.width = 4;
    S.info.shapes.in_channels = 16;
    S.info.shapes.tokens = 4;
    S.info.image_width = S.info.image_height = 32;
    S.info.image_channels = 3;
    S.info.vae_scale = 8;
    S.info.resizable = 1;
    S.info.size_multiple = 16;
    S.info.min_size = 16;
    S.info.max_size = 256;
    S.info.max_sequence_length = S.info.default_max_sequence_length = 512;
    ditd_fbatch busy = {0};
    S.rep[0].running = &busy;
    S.sec_per_cost = 1e-6; /* heavy: 4 x 4 x (256 + 512) units, ~12 ms */
    ditd_job *j[6];
    j[0] = submit_text(4, 256, 256, 512, "heavy", NULL, 1.0f);
    j[1] = submit_text(1, 32, 32, 16, "light early", NULL, 1.0f);
    CHECK(S.q_head == j[1], "a light request of another size overtakes a heavy one that waits");
    usleep(30000); /* past the heavy one's deadline */
    for (int i = 2; i < 6; i++)
        j[i] = submit_text(1, 32, 32, 16, "light late", NULL, 1.0f);
    CHECK(S.q_head == j[1] && S.q_head->q_next == j[0] && S.q_tail == j[5],
          "lights arriving after the heavy one's deadline queue behind it");
    S.rep[0].running = NULL;
    ditd__sched_kick(&S);
    /* (side, samples, first request) of each batch, in turn */
    struct { int side, n; ditd_job *first; } order[3] = {{32, 4, j[1]}, {256, 4, j[0]}, {32, 1, j[5]}};
    for (int k = 0; k < 3; k++) {
        Ditd__Envelope *env = batch_to(0);
        CHECK(env && (int)env->batch->width == order[k].side && (int)env->batch->n_samples == order[k].n &&
                  env->batch->samples[0]->request_id == order[k].first->id,
              "batch %d: %dx%d with %d sample(s) (got %ux%u, %zu)", k, order[k].side, order[k].side,
              order[k].n, env ? env->batch->width : 0, env ? env->batch->height : 0,
              env ? env->batch->n_samples : 0);
        if (!env)
            break;
        answer_sized(0, env->batch);
        ditd__envelope__free_unpacked(env, NULL);
    }
    for (int i = 0; i < 6; i++)
        CHECK(heard_of(j[i])->complete == 1, "request %d completed", i);
    release(j, 6);
    srv_free();
}

/* Mutated replica messages: nothing crashes, no job hears two outcomes. */
static void test_mutated_messages(void)
{
    srv_init("mutated messages", 1, 4, 0);
    ditd_job *j[4];
    ditd_fbatch busy = {0};
    S.rep[0].running = &busy; /* they queue, then leave as one batch */
    for (int i = 0; i < 4; i++)
        j[i] = submit(1, 4);
    S.rep[0].running = NULL;
    ditd__sched_kick(&S);
    Ditd__Envelope *env = batch_to(0);
    CHECK(env && env->batch->n_samples == 4, "one batch of four");
    uint64_t bid = env ? env->batch->batch_id : 0;
    ditd__envelope__free_unpacked(env, NULL);
    /* a valid Progress with a preview and a Result, packed, then mutated */
    static uint8_t px[28 * 28];
    Ditd__Envelope pe = DITD__ENVELOPE__INIT, re = DITD__ENVELOPE__INIT;
    Ditd__Progress pr = DITD__PROGRESS__INIT;
    Ditd__Preview pv = DITD__PREVIEW__INIT, *pvp = &pv;
    Ditd__Result res = DITD__RESULT__INIT;
    Ditd__Image im[4], *imp[4];
    pv.slot = 1;
    pv.pixels.data = px;
    pv.pixels.len = sizeof px;
    pr.batch_id = bid;
    pr.step = 1;
    pr.total = 4;
    pr.n_previews = 1;
    pr.previews = &pvp;
    pe.msg_case = DITD__ENVELOPE__MSG_PROGRESS;
    pe.progress = &pr;
    for (int i = 0; i < 4; i++) {
        ditd__image__init(&im[i]);
        im[i].slot = (uint32_t)i;
        im[i].pixels.data = px;
        im[i].pixels.len = sizeof px;
        imp[i] = &im[i];
    }
    res.batch_id = bid;
    res.channels = 1;
    res.n_images = 4;
    res.images = imp;
    re.msg_case = DITD__ENVELOPE__MSG_RESULT;
    re.result = &res;
    uint8_t pbuf[2048], rbuf[8192], m[8192];
    size_t pl = ditd__envelope__pack(&pe, pbuf), rl = ditd__envelope__pack(&re, rbuf);
    uint64_t x = 0x9e3779b97f4a7c15ull;
    int n = 0;
    for (int it = 0; it < 3000; it++) {
        const uint8_t *src = it & 1 ? rbuf : pbuf;
        size_t len = it & 1 ? rl : pl;
        memcpy(m, src, len);
        for (int k = 0; k < 1 + it % 4; k++) { /* xorshift: flip, cut or grow */
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            size_t at = (size_t)(x % len);
            switch ((x >> 32) % 3) {
            case 0: m[at] ^= (uint8_t)(1u << ((x >> 40) % 8)); break;
            case 1: len = at + 1; break;
            default: m[at] = (uint8_t)(x >> 48); break;
            }
        }
        ditd__sched_on_message(&S, 0, m, len);
        n++;
    }
    for (int i = 0; i < 4; i++) {
        heard *h = heard_of(j[i]);
        CHECK(h->complete + h->failed <= 1, "request %d heard %d results and %d errors", i, h->complete,
              h->failed);
    }
    CHECK(n == 3000, "3000 mutated messages handled");
    /* the real result still lands where nothing was decided */
    ditd__sched_on_message(&S, 0, rbuf, rl);
    int decided = 0;
    for (int i = 0; i < 4; i++)
        decided += ditd_job_terminal(j[i]);
    CHECK(decided == 4, "after the real result every request has its outcome (%d)", decided);
    release(j, 4);
    srv_free();
}

/* ---- LoRA adapters at run time (sched_lora.c) */

static struct { int calls, status; char msg[1024], name[64], param[64]; } op_heard;

static void op_cb(ditd_srv *s, void *ctx, int status, const ditd_api_error *e, const char *name)
{
    (void)s;
    (void)ctx;
    op_heard.calls++;
    op_heard.status = status;
    snprintf(op_heard.msg, sizeof op_heard.msg, "%s", status == 200 ? "" : e->message);
    snprintf(op_heard.param, sizeof op_heard.param, "%s", status == 200 ? "" : e->param);
    snprintf(op_heard.name, sizeof op_heard.name, "%s", name);
}

/* The next LoraOp sent to r (other messages skipped), or NULL. */
static Ditd__Envelope *op_to(int r)
{
    Ditd__Envelope *env;
    while ((env = sent_to(r))) {
        if (env->msg_case == DITD__ENVELOPE__MSG_LORA_OP)
            return env;
        ditd__envelope__free_unpacked(env, NULL);
    }
    return NULL;
}

static void lora_done(int r, uint64_t id, int code, const char *msg, uint64_t bytes)
{
    Ditd__Envelope env = DITD__ENVELOPE__INIT;
    Ditd__LoraDone d = DITD__LORA_DONE__INIT;
    Ditd__LoraInfo li = DITD__LORA_INFO__INIT;
    char *mods[1] = {"transformer_blocks.0.attn1.to_q"};
    uint32_t ranks[1] = {4};
    d.op_id = id;
    d.code = code;
    d.message = (char *)msg;
    if (!code) {
        li.name = "x";
        li.max_rank = 4;
        li.n_modules = li.n_ranks = 1;
        li.modules = mods;
        li.ranks = ranks;
        li.bytes = bytes;
        li.resident = 1;
        d.info = &li;
    }
    env.msg_case = DITD__ENVELOPE__MSG_LORA_DONE;
    env.lora_done = &d;
    deliver(r, &env);
}

static void lora_events(int r, const char *name, const uint32_t *kinds, int n, uint64_t bytes)
{
    Ditd__Envelope env = DITD__ENVELOPE__INIT;
    Ditd__LoraEvents le = DITD__LORA_EVENTS__INIT;
    Ditd__LoraEvent ev[8], *evp[8];
    for (int i = 0; i < n; i++) {
        ditd__lora_event__init(&ev[i]);
        ev[i].name = (char *)name;
        ev[i].kind = kinds[i];
        ev[i].bytes = bytes;
        evp[i] = &ev[i];
    }
    le.n_events = (size_t)n;
    le.events = evp;
    env.msg_case = DITD__ENVELOPE__MSG_LORA_EVENTS;
    env.lora_events = &le;
    deliver(r, &env);
}

static void test_lora_ops(void)
{
    srv_init("lora ops", 2, 4, 0);
    S.cfg.request_timeout_s = 60;
    ditd_api_error e;
    int slot;
    memset(&op_heard, 0, sizeof op_heard);

    /* a load that replica 1 refuses: undone on replica 0, the slot freed */
    CHECK(ditd__sched_lora_start(&S, 1, "x", "/a/x.safetensors", op_cb, &S, &e) == 0,
          "a load starts");
    slot = ditd__sched_lora_slot(&S, "x");
    CHECK(slot == 0 && S.lora_names[0] == NULL && S.gm.n_loras == 1,
          "its slot is reserved and hidden from requests (slot %d)", slot);
    Ditd__Envelope *o0 = op_to(0), *o1 = op_to(1);
    CHECK(o0 && o1 && o0->lora_op->kind == 1 && !strcmp(o0->lora_op->name, "x") &&
              !strcmp(o1->lora_op->path, "/a/x.safetensors") &&
              o0->lora_op->op_id == o1->lora_op->op_id,
          "every replica got the LoraOp load");
    uint64_t id = o0 ? o0->lora_op->op_id : 0;
    CHECK(ditd__sched_lora_start(&S, 1, "y", "/a/y", op_cb, &S, &e) == 409 &&
              !strcmp(e.code, "lora_busy"),
          "a second op while one is under way: 409 lora_busy");
    uint32_t load_ev[1] = {1};
    lora_events(0, "x", load_ev, 1, 1000);
    lora_done(0, id, 0, "", 1000);
    CHECK(op_heard.calls == 0 && S.rep[0].lora_resident[0] == 1000,
          "one replica answered: still waiting (%d calls)", op_heard.calls);
    lora_done(1, id, DITD_ESHAPE, "x=/a/x.safetensors: tensor 'a.lora_A.weight' ...", 0);
    CHECK(op_heard.calls == 1 && op_heard.status == 400 && !strcmp(op_heard.param, "path") &&
              strstr(op_heard.msg, "replica 1: x=/a/x.safetensors: tensor 'a.lora_A.weight'"),
          "replica 1 refused: 400 naming the replica and the loader's message (%d %s)",
          op_heard.status, op_heard.msg);
    Ditd__Envelope *u0 = op_to(0), *u1 = op_to(1);
    CHECK(u0 && u0->lora_op->kind == 2 && !strcmp(u0->lora_op->name, "x") && !u1,
          "the undo: an unload to replica 0 (which loaded it) only");
    CHECK(ditd__sched_lora_slot(&S, "x") < 0 && S.cfg.loras.n == 0 && S.gm.n_loras == 0 &&
              S.rep[0].lora_resident[0] == 0,
          "the slot is free again, nothing resident");
    ditd__envelope__free_unpacked(o0, NULL);
    ditd__envelope__free_unpacked(o1, NULL);
    ditd__envelope__free_unpacked(u0, NULL);
    if (u1)
        ditd__envelope__free_unpacked(u1, NULL);

    /* a load both take: live */
    CHECK(ditd__sched_lora_start(&S, 1, "x", "/a/x.safetensors", op_cb, &S, &e) == 0,
          "the load again");
    o0 = op_to(0);
    id = o0 ? o0->lora_op->op_id : 0;
    ditd__envelope__free_unpacked(o0, NULL);
    lora_done(0, id, 0, "", 1000);
    lora_done(1, id, 0, "", 1000);
    CHECK(op_heard.calls == 2 && op_heard.status == 200 && S.lora_names[0] &&
              !strcmp(S.lora_names[0], "x") && S.loras[0].known && S.loras[0].n_modules == 1 &&
              S.loras[0].bytes == 1000,
          "both replicas loaded it: 200, requests may name it, its modules kept");
    lora_done(1, id, 0, "", 1000); /* a stale answer changes nothing */
    CHECK(op_heard.calls == 2, "a stale LoraDone is ignored");

    /* the cache's events */
    uint32_t evs[6] = {3, 1, 2, 2, 4, 5};
    lora_events(0, "x", evs, 5, 1000);
    lora_events(1, "x", evs + 5, 1, 1000);
    lora_events(1, "nope", evs, 6, 1000);
    CHECK(S.m.lora_misses[0] == 1 && S.m.lora_loads[0] == 1 && S.m.lora_hits[0] == 2 &&
              S.m.lora_evictions[0] == 1 && S.rep[0].lora_resident[0] == 0 &&
              S.rep[1].lora_resident[0] == 0,
          "events: 1 miss, 1 load, 2 hits, 1 eviction; unknown names ignored");

    /* an unload refused while a request names it; then done */
    ditd_fbatch busy = {0};
    S.rep[0].running = S.rep[1].running = &busy; /* it stays queued */
    ditd_job *j = submit(1, 4);
    j->rq.n_loras = 1;
    j->rq.lora_idx[0] = 0;
    CHECK(ditd__sched_lora_in_use(&S, 0) == 1, "a queued request names x");
    j->rq.n_loras = 0;
    CHECK(ditd__sched_lora_in_use(&S, 0) == 0, "then none");
    release(&j, 1);
    S.rep[0].running = S.rep[1].running = NULL;
    CHECK(ditd__sched_lora_start(&S, 2, "x", NULL, op_cb, &S, &e) == 0 && !S.lora_names[0],
          "an unload starts; x is hidden at once");
    o0 = op_to(0);
    id = o0 ? o0->lora_op->op_id : 0;
    ditd__envelope__free_unpacked(o0, NULL);
    lora_done(0, id, 0, "", 0);
    lora_done(1, id, DITD_ENOENT, "not loaded", 0);
    CHECK(op_heard.calls == 3 && op_heard.status == 200 && !strcmp(op_heard.name, "x") &&
              ditd__sched_lora_slot(&S, "x") < 0,
          "unloaded (a replica without it counts as done)");
    CHECK(ditd__sched_lora_start(&S, 2, "x", NULL, op_cb, &S, &e) == 404, "unload again: 404");

    /* a replica lost during a load: the load fails and is undone */
    CHECK(ditd__sched_lora_start(&S, 1, "z", "/a/z", op_cb, &S, &e) == 0, "a load of z");
    o0 = op_to(0);
    id = o0 ? o0->lora_op->op_id : 0;
    ditd__envelope__free_unpacked(o0, NULL);
    lora_done(0, id, 0, "", 10);
    S.rep[1].failed = 1;
    ditd__sched_lora_watch(&S);
    CHECK(op_heard.calls == 4 && op_heard.status == 503 && strstr(op_heard.msg, "replica 1") &&
              ditd__sched_lora_slot(&S, "z") < 0,
          "replica 1 failed mid-load: 503 naming it, z undone (%d %s)", op_heard.status,
          op_heard.msg);
    u0 = op_to(0);
    CHECK(u0 && u0->lora_op->kind == 2, "the undo went to replica 0");
    if (u0)
        ditd__envelope__free_unpacked(u0, NULL);
    /* the caller gone: no callback, the op still ends */
    CHECK(ditd__sched_lora_start(&S, 1, "w", "/a/w", op_cb, &S, &e) == 0, "a load of w");
    ditd__sched_lora_forget(&S, &S);
    o0 = op_to(0);
    id = o0 ? o0->lora_op->op_id : 0;
    ditd__envelope__free_unpacked(o0, NULL);
    lora_done(0, id, 0, "", 10);
    CHECK(op_heard.calls == 4 && S.lora_names[0] && !strcmp(S.lora_names[0], "w") &&
              !S.lora_op.id,
          "a caller gone hears nothing; w is live (only replica 0 serves)");

    /* mutated LoraDone / LoraEvents messages: nothing crashes */
    uint8_t buf[512], m[512];
    Ditd__Envelope env = DITD__ENVELOPE__INIT;
    Ditd__LoraEvents le = DITD__LORA_EVENTS__INIT;
    Ditd__LoraEvent ev = DITD__LORA_EVENT__INIT, *evp = &ev;
    ev.name = "w";
    ev.kind = 1;
    ev.bytes = 7;
    le.n_events = 1;
    le.events = &evp;
    env.msg_case = DITD__ENVELOPE__MSG_LORA_EVENTS;
    env.lora_events = &le;
    size_t len0 = ditd__envelope__pack(&env, buf);
    uint64_t x = 0x2545f4914f6cdd1dull;
    for (int it = 0; it < 2000; it++) {
        size_t len = len0;
        memcpy(m, buf, len);
        for (int k = 0; k < 1 + it % 3; k++) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            m[x % len] ^= (uint8_t)(1u << ((x >> 40) % 8));
        }
        ditd__sched_on_message(&S, 0, m, len);
    }
    CHECK(1, "2000 mutated LoraEvents handled");
    ditd__sched_lora_free(&S);
    srv_free();
}

int main(void)
{
    ditd_log_open(DITD_LOG_ERROR, DITD_LOG_TEXT, NULL); /* quiet */
    test_compatibility();
    test_cache_batches();
    test_window();
    test_least_loaded();
    test_long_work();
    test_stalled();
    test_cost_order();
    test_text_batches();
    test_text_fairness();
    test_mutated_messages();
    test_lora_ops();
    printf("%d checks, %d failed\n", checks, failures);
    if (checks < 30) {
        printf("FAIL: only %d checks ran\n", checks);
        return 1;
    }
    return failures ? 1 : 0;
}
