/* The bounded queue, the batcher, replica routing and the worker messages
 * (server/sched.h). Loop thread only. */
#include "server/daemon/sched.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/error.h"
#include "engine/worker/cache_msg.h"
#include "proto/ditd.pb-c.h"
#include "server/daemon/log.h"
#include "server/daemon/sched_link.h"
#include "server/daemon/sched_lora.h"
#include "server/daemon/serve.h"

int ditd__sched_running(const ditd_srv *s)
{
    int n = 0;
    for (int r = 0; r < s->nrep; r++)
        n += s->rep[r].running != NULL;
    return n;
}

int ditd__sched_retry_after(const ditd_srv *s)
{
    int up = ditd__sched_replicas_up(s);
    double per = s->avg_batch_s > 0 ? s->avg_batch_s : 1.0;
    double batches = (double)s->q_len / (double)(s->cfg.max_batch * (up ? up : 1)) + 1.0;
    int secs = (int)(per * batches + 0.999);
    return secs < 1 ? 1 : secs > 120 ? 120 : secs;
}

static void q_remove(ditd_srv *s, ditd_job *j)
{
    if (!j->in_queue)
        return;
    if (j->q_prev)
        j->q_prev->q_next = j->q_next;
    else
        s->q_head = j->q_next;
    if (j->q_next)
        j->q_next->q_prev = j->q_prev;
    else
        s->q_tail = j->q_prev;
    j->q_prev = j->q_next = NULL;
    j->in_queue = 0;
    s->q_len--;
    ditd_job_unref(j);
}

uint64_t ditd__sched_cost(const ditd_srv *s, const ditd_genreq *rq)
{
    const ditd_model_info *m = &s->info;
    uint64_t tokens = (uint64_t)(m->shapes.tokens > 0 ? m->shapes.tokens : 1);
    /* the image tokens scale with the area (shapes.tokens is the default
     * size's); a text model's joint sequence adds its T5 tokens */
    if (m->image_width > 0 && m->image_height > 0 &&
        (rq->width != m->image_width || rq->height != m->image_height))
        tokens = tokens * (uint64_t)rq->width * (uint64_t)rq->height /
                 ((uint64_t)m->image_width * (uint64_t)m->image_height);
    /* a clip: its latent frames at the size (shapes.tokens counts the
     * default clip's) */
    if (rq->frames > 0 && m->frames > 0)
        tokens = tokens * (uint64_t)ditd_model_latent_frames(m, rq->frames) /
                 (uint64_t)ditd_model_latent_frames(m, m->frames);
    tokens += (uint64_t)(rq->max_sequence_length > 0 ? rq->max_sequence_length : 0);
    return (uint64_t)rq->n * (uint64_t)rq->steps * (tokens ? tokens : 1);
}

int ditd__sched_submit(ditd_srv *s, ditd_job *j, ditd_api_error *e)
{
    j->cost = ditd__sched_cost(s, &j->rq);
    if (s->cfg.max_cost > 0 && j->cost > (uint64_t)s->cfg.max_cost)
        return ditd_api_error_set(e, 400, "invalid_request_error", "cost_too_high", "n",
                                  "the request costs %llu (n %d x num_inference_steps %d x %llu "
                                  "tokens) and this server takes at most %ld (--max-cost): ask "
                                  "for fewer images or steps",
                                  (unsigned long long)j->cost, j->rq.n, j->rq.steps,
                                  (unsigned long long)(j->cost / ((uint64_t)j->rq.n * (uint64_t)j->rq.steps)),
                                  s->cfg.max_cost);
    if (s->draining)
        return ditd_api_error_set(e, 503, "server_error", "draining", NULL,
                                  "the server is shutting down; retry on another instance");
    if (ditd__sched_replicas_up(s) == 0)
        return ditd_api_error_set(e, 503, "server_error", "no_replica", NULL,
                                  "no replica is ready to run the model");
    if (s->q_len >= s->cfg.max_queue) {
        s->m.rejected_total++;
        return ditd_api_error_set(e, 429, "rate_limit_error", "queue_full", NULL,
                                  "the queue of '%s' is full (%d requests waiting); retry later",
                                  s->info.name, s->q_len);
    }
    ditd_job_ref(j);
    j->in_queue = 1;
    j->deadline = j->t_arrive + (double)j->cost * s->sec_per_cost;
    /* in deadline order; equal deadlines keep arrival order */
    ditd_job *after = s->q_tail;
    while (after && after->deadline > j->deadline)
        after = after->q_prev;
    j->q_prev = after;
    j->q_next = after ? after->q_next : s->q_head;
    if (j->q_next)
        j->q_next->q_prev = j;
    else
        s->q_tail = j;
    if (after)
        after->q_next = j;
    else
        s->q_head = j;
    s->q_len++;
    ditd__sched_kick(s);
    return 0;
}

/* Whether two requests ask for the same skip-layer guidance (it is one
 * forward for the whole batch). */
static int same_slg(const ditd_genreq *a, const ditd_genreq *b)
{
    if (a->n_skip_layers != b->n_skip_layers)
        return 0;
    if (a->n_skip_layers == 0)
        return 1;
    return a->slg_scale == b->slg_scale && a->slg_start == b->slg_start &&
           a->slg_stop == b->slg_stop &&
           memcmp(a->skip_layers, b->skip_layers, (size_t)a->n_skip_layers * sizeof(int)) == 0;
}

/* One batch runs one size (and clip length), step count, sampler, T5
 * length, skip-layer guidance, step caching and edit strength (0: no
 * edit; the schedule is truncated for the whole batch), and an edit's one
 * reference size (FluxKontextPipeline: image_w x image_h; 0 for img2img). */
static int compatible(const ditd_job *a, const ditd_job *b)
{
    return a->rq.steps == b->rq.steps && a->rq.sampler == b->rq.sampler &&
           a->rq.width == b->rq.width && a->rq.height == b->rq.height &&
           a->rq.frames == b->rq.frames &&
           a->rq.max_sequence_length == b->rq.max_sequence_length && same_slg(&a->rq, &b->rq) &&
           ditd_cache_config_equal(&a->rq.cache, &b->rq.cache) && a->rq.strength == b->rq.strength &&
           (!a->rq.edit || (a->rq.image_w == b->rq.image_w && a->rq.image_h == b->rq.image_h));
}

/* The idle replica with the least work: fewest samples served breaks ties,
 * so replicas share the load. -1 when none is free. */
static int pick_replica(const ditd_srv *s)
{
    int best = -1;
    for (int r = 0; r < s->nrep; r++) {
        if (!ditd__sched_replica_up(s, r) || s->rep[r].running)
            continue;
        if (best < 0 || s->rep[r].samples < s->rep[best].samples)
            best = r;
    }
    return best;
}

/* Long work (a job over --long-cost) holds at most --long-replicas
 * replicas at once; the others stay free for short requests. */
static int is_long(const ditd_srv *s, const ditd_job *j)
{
    return s->cfg.long_cost > 0 && j->cost > (uint64_t)s->cfg.long_cost;
}

static int long_full(const ditd_srv *s)
{
    int n = 0;
    if (s->cfg.long_cost <= 0 || s->cfg.long_replicas <= 0)
        return 0;
    for (int r = 0; r < s->nrep; r++)
        n += s->rep[r].running && s->rep[r].running->is_long;
    return n >= s->cfg.long_replicas;
}

static void on_window(uv_timer_t *t)
{
    ditd__sched_kick(t->data);
}

void ditd__sched_kick(ditd_srv *s)
{
    double now = ditd__now();
    while (s->q_head && !s->stopping) {
        int r = pick_replica(s);
        if (r < 0)
            return;
        ditd_job *head = s->q_head;
        /* long work past its replicas waits: the first short job in the
         * queue's order goes instead */
        int full = long_full(s);
        while (head && full && is_long(s, head))
            head = head->q_next;
        if (!head)
            return;
        int avail = 0;
        for (ditd_job *j = head; j && avail < s->cfg.max_batch; j = j->q_next)
            if (compatible(head, j) && !(full && is_long(s, j)))
                avail += j->rq.n - j->dispatched;
        double waited = now - head->t_arrive;
        double window = s->cfg.batch_window_ms / 1000.0;
        if (avail < s->cfg.max_batch && waited < window && !s->draining) {
            uv_timer_start(&s->window, on_window, (uint64_t)((window - waited) * 1000.0) + 1, 0);
            return;
        }

        ditd_fbatch *b = calloc(1, sizeof *b);
        Ditd__Sample smp[DITD_WORKER_MAX_BATCH], *smpp[DITD_WORKER_MAX_BATCH];
        char *lnames[DITD_WORKER_MAX_BATCH][DITD_LORA_MAX_SET]; /* borrowed names */
        if (!b) {
            ditd_log(DITD_LOG_INFO, "out of memory building a batch");
            return;
        }
        b->id = ++s->next_batch;
        b->replica = r;
        b->steps = head->rq.steps;
        b->t_start = now;
        ditd_job *j = head;
        while (j && b->n < s->cfg.max_batch) {
            ditd_job *next = j->q_next;
            if (!compatible(head, j) || (full && is_long(s, j))) {
                j = next;
                continue;
            }
            b->is_long |= is_long(s, j);
            if (j->dispatched == 0) {
                j->t_dispatch = now;
                ditd_hist_observe(&s->m.queue_time, now - j->t_arrive);
            }
            while (j->dispatched < j->rq.n && b->n < s->cfg.max_batch) {
                int i = b->n++;
                b->cost += j->cost / (uint64_t)j->rq.n;
                ditd__sample__init(&smp[i]);
                smp[i].request_id = j->id;
                smp[i].seed = j->rq.seed;
                smp[i].index = (uint64_t)j->dispatched;
                smp[i].class_id = j->rq.class_id;
                smp[i].guidance = j->rq.guidance;
                smp[i].partial_images = j->rq.stream ? (uint32_t)j->rq.partial_images : 0;
                if (j->rq.prompt) /* text models; borrowed until the batch is packed */
                    smp[i].prompt = j->rq.prompt;
                if (j->rq.negative_prompt)
                    smp[i].negative_prompt = j->rq.negative_prompt;
                if (j->rq.prompt_23[0])
                    smp[i].prompt_2 = j->rq.prompt_23[0];
                if (j->rq.prompt_23[1])
                    smp[i].prompt_3 = j->rq.prompt_23[1];
                if (j->rq.negative_23[0])
                    smp[i].negative_prompt_2 = j->rq.negative_23[0];
                if (j->rq.negative_23[1])
                    smp[i].negative_prompt_3 = j->rq.negative_23[1];
                /* whether the unconditional pass runs is the pipeline
                 * row's rule, on the worker (FluxPipeline: a negative
                 * prompt given, "" counts) */
                smp[i].has_negative = j->rq.negative_prompt != NULL;
                smp[i].true_cfg = j->rq.true_cfg;
                smp[i].has_guidance_2 = j->rq.has_guidance_2 != 0;
                smp[i].guidance_2 = j->rq.guidance_2;
                /* its adapters: samples with different ones share the batch
                 * (each row carries its own set, engine/models/lora.h) */
                for (int k = 0; k < j->rq.n_loras; k++)
                    lnames[i][k] = (char *)s->gm.lora_names[j->rq.lora_idx[k]];
                smp[i].n_lora_names = smp[i].n_lora_scales = (size_t)j->rq.n_loras;
                smp[i].lora_names = lnames[i];
                smp[i].lora_scales = j->rq.lora_scale;
                if (j->rq.image && j->rq.image_w > 0) { /* image-to-video: its own size */
                    const size_t ni = (size_t)j->rq.image_w * (size_t)j->rq.image_h * 3;
                    /* a Kontext edit's references: output `dispatched` takes
                     * reference dispatched % k (Diffusers' image list) */
                    const int kr = j->rq.edit && j->rq.n_images > 1 ? j->rq.n_images : 1;
                    smp[i].image.data = j->rq.image + (size_t)(j->dispatched % kr) * ni;
                    smp[i].image.len = ni;
                    smp[i].image_width = (uint32_t)j->rq.image_w;
                    smp[i].image_height = (uint32_t)j->rq.image_h;
                    if (j->rq.last_image) { /* FLF2V: its last frame, borrowed likewise */
                        smp[i].last_image.data = j->rq.last_image;
                        smp[i].last_image.len = (size_t)j->rq.last_w * (size_t)j->rq.last_h * 3;
                        smp[i].last_image_width = (uint32_t)j->rq.last_w;
                        smp[i].last_image_height = (uint32_t)j->rq.last_h;
                    }
                } else if (j->rq.image) { /* an edit: borrowed until the batch is packed */
                    /* output `dispatched` of the request edits image
                     * dispatched % k (Diffusers' image list; the request's
                     * outputs may span batches, the index is the request's) */
                    size_t np = (size_t)j->rq.width * (size_t)j->rq.height;
                    const uint8_t *im, *mk;
                    int jj;
                    ditd_genreq_edit_input(&j->rq, j->dispatched, &im, &mk, &jj);
                    smp[i].image.data = (uint8_t *)im;
                    smp[i].image.len = np * 3;
                    smp[i].image_index = (uint32_t)jj;
                    if (mk) {
                        smp[i].mask.data = (uint8_t *)mk;
                        smp[i].mask.len = np;
                    }
                }
                smpp[i] = &smp[i];
                b->job[i] = j;
                b->idx[i] = j->dispatched;
                j->loc[j->dispatched].batch = b->id;
                j->loc[j->dispatched].replica = r;
                j->loc[j->dispatched].slot = i;
                ditd_job_ref(j);
                j->dispatched++;
            }
            if (j->dispatched == j->rq.n)
                q_remove(s, j);
            j = next;
        }
        Ditd__Envelope env = DITD__ENVELOPE__INIT;
        Ditd__Batch bm = DITD__BATCH__INIT;
        bm.batch_id = b->id;
        bm.model = s->info.name;
        bm.width = (uint32_t)head->rq.width;
        bm.height = (uint32_t)head->rq.height;
        bm.steps = (uint32_t)b->steps;
        bm.sampler = (uint32_t)head->rq.sampler;
        bm.max_sequence_length = (uint32_t)head->rq.max_sequence_length;
        bm.num_frames = (uint32_t)head->rq.frames;
        bm.strength = head->rq.strength;
        uint32_t skip[DITD_MAX_SKIP_LAYERS];
        for (int i = 0; i < head->rq.n_skip_layers; i++)
            skip[i] = (uint32_t)head->rq.skip_layers[i];
        bm.n_skip_layers = (size_t)head->rq.n_skip_layers;
        bm.skip_layers = skip;
        bm.slg_scale = head->rq.slg_scale;
        bm.slg_start = head->rq.slg_start;
        bm.slg_stop = head->rq.slg_stop;
        Ditd__CacheConfig cm;
        char *cids[2 * DITD_CACHE_MAX_PATTERNS];
        if (head->rq.cache.method != DITD_CACHE_NONE) {
            ditd_cache_msg_from_config(&head->rq.cache, &cm, cids);
            bm.cache = &cm;
        }
        bm.n_samples = (size_t)b->n;
        bm.samples = smpp;
        env.msg_case = DITD__ENVELOPE__MSG_BATCH;
        env.batch = &bm;
        s->rep[r].running = b;
        s->rep[r].samples += (uint64_t)b->n;
        if (r < DITD_METRICS_MAX_REPLICAS) {
            s->m.replica_batches[r]++;
            s->m.replica_samples[r] += (uint64_t)b->n;
        }
        ditd_hist_observe(&s->m.batch_size, b->n);
        ditd__sched_send(s, r, &env);
        now = ditd__now();
    }
}

/* Cancels the job's samples still running, and takes it out of the queue. */
void ditd__sched_withdraw(ditd_srv *s, ditd_job *j)
{
    q_remove(s, j);
    for (int r = 0; r < s->nrep; r++) {
        ditd_fbatch *b = s->rep[r].running;
        uint32_t slots[DITD_GENREQ_MAX_N];
        size_t ns = 0;
        if (!b)
            continue;
        for (int i = 0; i < j->dispatched; i++)
            if (j->loc[i].batch == b->id && j->loc[i].replica == r)
                slots[ns++] = (uint32_t)j->loc[i].slot;
        if (!ns)
            continue;
        Ditd__Envelope env = DITD__ENVELOPE__INIT;
        Ditd__Cancel c = DITD__CANCEL__INIT;
        c.batch_id = b->id;
        c.n_slots = ns;
        c.slots = slots;
        env.msg_case = DITD__ENVELOPE__MSG_CANCEL;
        env.cancel = &c;
        ditd__sched_send(s, r, &env);
        s->m.canceled_total += ns;
    }
}

void ditd__sched_fail(ditd_srv *s, ditd_job *j, int status, const char *type, const char *code,
                      const char *fmt, ...)
{
    ditd_api_error e;
    va_list ap;
    if (ditd_job_terminal(j))
        return;
    e.status = status;
    e.type = type;
    e.code = code;
    e.param[0] = '\0';
    va_start(ap, fmt);
    vsnprintf(e.message, sizeof e.message, fmt, ap);
    va_end(ap);
    ditd__sched_withdraw(s, j);
    ditd_job_fail(j, &e);
}

void ditd__sched_shutdown(ditd_srv *s, int now)
{
    for (int r = 0; r < s->nrep; r++) {
        Ditd__Envelope env = DITD__ENVELOPE__INIT;
        Ditd__Shutdown sd = DITD__SHUTDOWN__INIT;
        sd.now = now;
        env.msg_case = DITD__ENVELOPE__MSG_SHUTDOWN;
        env.shutdown = &sd;
        ditd__sched_send(s, r, &env);
    }
}

static void batch_done(ditd_srv *s, ditd_fbatch *b)
{
    double dt = ditd__now() - b->t_start;
    s->avg_batch_s = s->avg_batch_s > 0 ? 0.8 * s->avg_batch_s + 0.2 * dt : dt;
    if (b->n > 0 && b->cost > 0) {
        double spc = dt / (double)b->cost;
        s->sec_per_cost = s->sec_per_cost > 0 ? 0.8 * s->sec_per_cost + 0.2 * spc : spc;
    }
    for (int i = 0; i < b->n; i++)
        ditd_job_unref(b->job[i]);
    if (s->rep[b->replica].running == b)
        s->rep[b->replica].running = NULL;
    free(b);
}

static ditd_fbatch *find_batch(ditd_srv *s, int r, uint64_t id)
{
    if (r < 0 || r >= s->nrep || !s->rep[r].running || s->rep[r].running->id != id)
        return NULL;
    return s->rep[r].running;
}

static void fail_batch(ditd_srv *s, ditd_fbatch *b, int code, const char *msg)
{
    int status = ditd_err_http_status(code);
    if (status < 500 && code != DITD_EINVAL)
        status = 500;
    for (int i = 0; i < b->n; i++) {
        ditd_job *j = b->job[i];
        if (!ditd_job_terminal(j)) {
            if (status == 503)
                ditd__sched_fail(s, j, 503, "server_error", "unavailable", "%s", msg);
            else
                ditd__sched_fail(s, j, status, status == 400 ? "invalid_request_error" : "server_error",
                                 status == 400 ? "invalid_value" : "internal_error",
                                 "generation failed (request %s): %s", j->rid, msg);
            if (status >= 500)
                ditd_log(DITD_LOG_INFO, "request %s: batch %llu on replica %d failed: %s", j->rid,
                          (unsigned long long)b->id, b->replica, msg);
        }
    }
    batch_done(s, b);
}

void ditd__sched_on_message(ditd_srv *s, int r, const uint8_t *buf, size_t len)
{
    Ditd__Envelope *env = ditd__envelope__unpack(NULL, len, buf);
    ditd_fbatch *b;
    if (!env) {
        char hex[64] = "";
        for (size_t i = 0; i < len && i < 16; i++)
            snprintf(hex + 3 * i, 4, "%02x ", buf[i]);
        ditd_log(DITD_LOG_INFO, "replica %d sent a message that does not unpack (%zu bytes: %s)", r, len, hex);
        return;
    }
    if (r < 0 || r >= s->nrep) {
        ditd__envelope__free_unpacked(env, NULL);
        return;
    }
    s->rep[r].last_hb = ditd__now();
    switch (env->msg_case) {
    case DITD__ENVELOPE__MSG_HEARTBEAT:
        /* cumulative on the replica: the latest one is its total */
        s->rep[r].text_hits = env->heartbeat->text_cache_hits;
        s->rep[r].text_misses = env->heartbeat->text_cache_misses;
        s->rep[r].text_entries = env->heartbeat->text_cache_entries;
        s->rep[r].text_encode_ms = env->heartbeat->text_encode_ms;
        if (env->heartbeat->ready && !s->rep[r].ready) {
            s->rep[r].ready = 1;
            ditd_metrics_replica_ready(&s->m, r, ditd__now() - s->t_start);
            ditd_log(DITD_LOG_INFO, "replica %d ready (max batch %u, %u rank%s)", r, env->heartbeat->max_batch,
                      env->heartbeat->ranks, env->heartbeat->ranks == 1 ? "" : "s");
        }
        break;
    case DITD__ENVELOPE__MSG_ADAPTERS:
        ditd__sched_lora_adapters(s, r, env->adapters);
        break;
    case DITD__ENVELOPE__MSG_LORA_DONE:
        ditd__sched_lora_done(s, r, env->lora_done);
        break;
    case DITD__ENVELOPE__MSG_LORA_EVENTS:
        ditd__sched_lora_events(s, r, env->lora_events);
        break;
    case DITD__ENVELOPE__MSG_PROGRESS: {
        Ditd__Progress *p = env->progress;
        if (!(b = find_batch(s, r, p->batch_id)))
            break;
        ditd_hist_observe(&s->m.step_time, p->step_ms / 1000.0);
        ditd_job *last = NULL;
        for (int i = 0; i < b->n; i++) {
            ditd_job *j = b->job[i];
            if (j == last)
                continue;
            last = j;
            ditd_job_progress(j, (int)p->step, (int)p->total);
        }
        for (size_t k = 0; k < p->n_previews; k++) {
            Ditd__Preview *pv = p->previews[k];
            if (pv->slot >= (uint32_t)b->n || pv->pixels.len != b->job[pv->slot]->numel)
                continue;
            ditd_job_partial(b->job[pv->slot], b->idx[pv->slot], (int)pv->partial_index,
                             pv->pixels.data);
        }
        break;
    }
    case DITD__ENVELOPE__MSG_RESULT: {
        Ditd__Result *res = env->result;
        if (!(b = find_batch(s, r, res->batch_id)))
            break;
        for (size_t k = 0; k < res->n_cache; k++) { /* before the images complete the jobs */
            const Ditd__CacheStats *cs = res->cache[k];
            if (cs->slot >= (uint32_t)b->n)
                continue;
            ditd_job *j = b->job[cs->slot];
            j->cache_steps += (long)cs->steps;
            j->cache_steps_skipped += (long)cs->steps_skipped;
            j->cache_evals += (long)cs->evals;
            j->cache_evals_skipped += (long)cs->evals_skipped;
            s->m.cache_steps_computed += cs->steps - cs->steps_skipped;
            s->m.cache_steps_skipped += cs->steps_skipped;
            s->m.cache_evals_computed += cs->evals - cs->evals_skipped;
            s->m.cache_evals_skipped += cs->evals_skipped;
        }
        for (size_t k = 0; k < res->n_images; k++) {
            Ditd__Image *im = res->images[k];
            if (im->slot >= (uint32_t)b->n)
                continue;
            ditd_job *j = b->job[im->slot];
            int dropped = im->canceled || im->pixels.len != j->numel;
            int was = ditd_job_terminal(j);
            if (!dropped && !was) {
                s->m.images_total++;
                for (int k = 0; k < j->rq.n_loras; k++)
                    if (j->rq.lora_idx[k] < DITD_METRICS_MAX_LORAS)
                        s->m.lora_rows[j->rq.lora_idx[k]]++;
            }
            ditd_job_sample_back(j, b->idx[im->slot], dropped ? NULL : im->pixels.data,
                                 (int)res->channels);
            if (dropped && !was)
                ditd__sched_fail(s, j, 500, "server_error", "internal_error",
                                 "image %d was dropped by the replica (request %s)",
                                 b->idx[im->slot], j->rid);
        }
        batch_done(s, b);
        break;
    }
    case DITD__ENVELOPE__MSG_ERROR: {
        Ditd__Error *e = env->error;
        if (e->batch_id == 0) {
            ditd_log(DITD_LOG_ERROR, "replica %d failed: %s", r, e->message);
            s->rep[r].failed = 1;
            if (s->rep[r].running)
                fail_batch(s, s->rep[r].running, DITD_EUNAVAIL, "the replica failed");
            break;
        }
        if ((b = find_batch(s, r, e->batch_id)))
            fail_batch(s, b, e->code, e->message);
        break;
    }
    default:
        break;
    }
    ditd__envelope__free_unpacked(env, NULL);
    ditd__sched_kick(s);
}

void ditd__sched_watch(ditd_srv *s)
{
    double now = ditd__now();
    ditd__sched_lora_watch(s);
    for (int r = 0; r < s->nrep; r++) {
        ditd_replica *p = &s->rep[r];
        ditd_fbatch *b = p->running;
        if (!b || p->failed || now - p->last_hb < s->cfg.heartbeat_timeout_ms / 1000.0)
            continue;
        /* stalled: its jobs end now; the batch stays with the replica
         * (and the replica is not routed to) until it answers or fails */
        int open = 0;
        for (int i = 0; i < b->n; i++)
            open += !ditd_job_terminal(b->job[i]);
        if (!open)
            continue;
        ditd_log(DITD_LOG_WARN, "replica %d: no heartbeat for %.1f s with batch %llu running; "
                 "its requests get 503", r, now - p->last_hb, (unsigned long long)b->id);
        for (int i = 0; i < b->n; i++)
            ditd__sched_fail(s, b->job[i], 503, "server_error", "replica_stalled",
                             "replica %d stopped answering (no heartbeat for %.1f s); retry", r,
                             now - p->last_hb);
    }
}
