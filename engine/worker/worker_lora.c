/* LoRA adapters on a replica (worker_state.h): its table of the adapters
 * it knows (cfg->loras at start, then LoraOp messages), which of them are
 * on the device (all of them, or under cfg->lora_cache_mb a least-recently
 * used set), each sample's set, and the events the front-end counts.
 *
 * Every rank of the group runs these functions on the same messages in the
 * same order, so the tables and the cache's choices (which adapter to
 * evict, which to reload) are the same on every rank without a word
 * between them. Where one rank can fail alone (reading a file, a device
 * allocation) the group agrees on the outcome and the ranks that
 * succeeded undo it, so no rank is left with another set.
 *
 * Not the loader (engine/models/lora.h) nor the checks of names and paths
 * (the front-end's: server/common/lora_spec.h). */
#include "engine/worker/worker_state.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/error.h"

/* The index of the adapter called name, resident or not, or -1. */
int ditd__worker_find_lora(const ditd__worker *w, const char *name)
{
    for (int k = 0; k < w->n_lora; k++)
        if (!strcmp(w->lora[k].name, name))
            return k;
    return -1;
}

/* ------------------------------------------------------------------ */
/* events                                                              */

/* The leader: what the front-end will count (a follower counts nothing). */
static void event(ditd__worker *w, const char *name, uint32_t kind, uint64_t bytes)
{
    if (!w->leader || !w->lev)
        return;
    if (w->n_lev == DITD__LORA_EVENTS)
        ditd__worker_lora_flush(w);
    ditd__lora_ev *e = &w->lev[w->n_lev++];
    snprintf(e->name, sizeof e->name, "%s", name);
    e->kind = kind;
    e->bytes = bytes;
}

/* The leader: the events so far in one LoraEvents message, sent before the
 * message they concern (a Result, an Error, a LoraDone, the first ready
 * heartbeat) so that /metrics counts them by the time the client hears. */
void ditd__worker_lora_flush(ditd__worker *w)
{
    Ditd__LoraEvent ev[DITD__LORA_EVENTS], *evp[DITD__LORA_EVENTS];
    Ditd__LoraEvents le = DITD__LORA_EVENTS__INIT;
    Ditd__Envelope env = DITD__ENVELOPE__INIT;
    if (!w->leader || !w->n_lev)
        return;
    for (int i = 0; i < w->n_lev; i++) {
        ditd__lora_event__init(&ev[i]);
        ev[i].name = w->lev[i].name;
        ev[i].kind = w->lev[i].kind;
        ev[i].bytes = w->lev[i].bytes;
        evp[i] = &ev[i];
    }
    le.n_events = (size_t)w->n_lev;
    le.events = evp;
    env.msg_case = DITD__ENVELOPE__MSG_LORA_EVENTS;
    env.lora_events = &le;
    ditd__worker_send_env(w, &env);
    w->n_lev = 0;
}

/* ------------------------------------------------------------------ */
/* the table and the device copies                                     */

/* Frees adapter k's device copy (an eviction or an unload: kind). */
static void drop_dev(ditd__worker *w, int k, uint32_t kind)
{
    ditd__wlora *a = &w->lora[k];
    if (!a->dev)
        return;
    w->lora_resident -= a->cost;
    event(w, a->name, kind, a->dev->bytes);
    ditd_lora_dev_free(a->dev);
    a->dev = NULL;
}

/* Under a budget: evicts the least recently used resident adapters that
 * were last used before keep_from (a batch being prepared has marked its
 * own with the clock's new tick), other than `except`, until `need` more
 * bytes fit. Ties go to the lower index. When nothing more may go, the
 * cache stays over the budget (a batch whose own adapters do not fit). */
static void make_room(ditd__worker *w, size_t need, uint64_t keep_from, int except)
{
    if (!w->lora_budget)
        return;
    while (w->lora_resident + need > w->lora_budget) {
        int v = -1;
        for (int k = 0; k < w->n_lora; k++)
            if (k != except && w->lora[k].dev && w->lora[k].used < keep_from &&
                (v < 0 || w->lora[k].used < w->lora[v].used))
                v = k;
        if (v < 0)
            return;
        drop_dev(w, v, DITD__LORA_EV_EVICT);
    }
}

/* What adapter l (uploaded as d) counts against the budget: its device
 * bytes; under tensor parallel, where a rank holds a slice whose size may
 * differ from another rank's, the whole adapter's A and B in the
 * activation type instead, so that every rank of the group counts the
 * same and evicts alike. */
static size_t cache_bytes(const ditd__worker *w, const ditd_lora *l, const ditd_lora_dev *d)
{
    if (!w->mesh || w->mesh->layout.tp <= 1)
        return d->bytes;
    size_t es = ditd_dtype_size(w->rep.pipe->ops->act_dtype), n = 0;
    for (int m = 0; m < l->n_mod; m++)
        n += (size_t)l->mod[m].rank * ((size_t)l->mod[m].k_in + (size_t)l->mod[m].n_out) * es;
    return n;
}

/* Reads adapter k's file and uploads it; the leader keeps the host copy
 * when keep_host (its modules go into a report). */
static int upload(ditd__worker *w, int k, int keep_host)
{
    const ditd_denoiser *den = w->rep.pipe->den;
    ditd__wlora *a = &w->lora[k];
    ditd_lora *l = NULL;
    ditd_lora_dev *d = NULL;
    int err;
    if (den->n_lora_targets <= 0)
        return ditd_err_set(DITD_EUNSUPPORTED, "%s=%s: %s", a->name, a->path, den->lora_refusal);
    if ((err = ditd_lora_open(a->path, a->name, den->lora_targets, den->n_lora_targets, &l)) ||
        (err = ditd_lora_dev_new(l, w->rep.pipe->ops, den->lora_targets, den->n_lora_targets,
                                   &d))) {
        char why[768];
        snprintf(why, sizeof why, "%s", ditd_err_detail());
        ditd_lora_free(l);
        return ditd_err_set(err, "%s=%s: %s", a->name, a->path, why);
    }
    a->dev = d;
    a->bytes = d->bytes;
    a->cost = cache_bytes(w, l, d);
    w->lora_resident += a->cost;
    event(w, a->name, DITD__LORA_EV_LOAD, d->bytes);
    if (keep_host && w->leader) {
        ditd_lora_free(a->host);
        a->host = l;
    } else {
        ditd_lora_free(l);
    }
    return 0;
}

/* A new entry at the end of the table (nothing on the device yet). */
static int add_entry(ditd__worker *w, const char *name, const char *path)
{
    size_t n = strlen(name);
    if (n == 0 || n >= sizeof w->lora[0].name)
        return ditd_err_set(DITD_EINVAL, "adapter name of %zu bytes (1..%zu)", n,
                            sizeof w->lora[0].name - 1);
    if (ditd__worker_find_lora(w, name) >= 0)
        return ditd_err_set(DITD_EINVAL, "adapter %s is loaded already", name);
    if (w->n_lora == DITD_WORKER_MAX_LORAS)
        return ditd_err_set(DITD_EINVAL, "adapter %s: the replica holds %d adapters, the most it "
                            "takes", name, DITD_WORKER_MAX_LORAS);
    ditd__wlora *a = &w->lora[w->n_lora];
    memset(a, 0, sizeof *a);
    memcpy(a->name, name, n + 1);
    if (!(a->path = strdup(path)))
        return ditd_err_set(DITD_ENOMEM, "adapter %s", name);
    w->n_lora++;
    return 0;
}

/* Takes adapter k out of the table (its device copy freed: kind). */
static void remove_entry(ditd__worker *w, int k, uint32_t kind)
{
    drop_dev(w, k, kind);
    ditd_lora_free(w->lora[k].host);
    free(w->lora[k].path);
    memmove(&w->lora[k], &w->lora[k + 1], (size_t)(w->n_lora - k - 1) * sizeof *w->lora);
    w->n_lora--;
}

void ditd__worker_lora_free(ditd__worker *w)
{
    while (w->lora && w->n_lora > 0)
        remove_entry(w, w->n_lora - 1, DITD__LORA_EV_UNLOAD);
    free(w->lora);
    free(w->lev);
    w->lora = NULL;
    w->lev = NULL;
    w->n_lev = 0;
}

/* Every rank: reads and uploads cfg->loras for the denoiser, in order;
 * under a budget the older ones are evicted as later ones come (each file
 * is read once here, so a bad one fails the start whatever the budget).
 * The leader keeps the host copies for its Adapters message. A file that
 * does not load is named, with the loader's reason. */
int ditd__worker_lora_init(ditd__worker *w)
{
    const ditd_worker_config *cfg = w->cfg;
    const ditd_denoiser *den = w->rep.pipe->den;
    int err;
    /* at least one byte: a budget under an adapter still evicts the others */
    w->lora_budget = cfg->lora_cache_mb > 0 ? (size_t)(cfg->lora_cache_mb * 1048576.0) + 1 : 0;
    w->lora = calloc(DITD_WORKER_MAX_LORAS, sizeof *w->lora);
    w->lev = w->leader ? calloc(DITD__LORA_EVENTS, sizeof *w->lev) : NULL;
    if (!w->lora || (w->leader && !w->lev))
        return ditd_err_set(DITD_ENOMEM, "the LoRA table");
    if (cfg->n_loras <= 0)
        return 0;
    if (den->n_lora_targets <= 0)
        return ditd_err_set(DITD_EUNSUPPORTED, "--lora %s=%s: %s", cfg->loras[0].name,
                            cfg->loras[0].path, den->lora_refusal);
    for (int i = 0; i < cfg->n_loras; i++) {
        int k = -1;
        if (!(err = add_entry(w, cfg->loras[i].name, cfg->loras[i].path))) {
            k = w->n_lora - 1;
            w->lora[k].used = ++w->lora_clock;
            err = upload(w, k, 1);
        }
        if (err) {
            char why[1024];
            snprintf(why, sizeof why, "%s", ditd_err_detail());
            return ditd_err_set(err, "--lora %s", why);
        }
        make_room(w, 0, w->lora[k].used, k);
    }
    return 0;
}

/* ------------------------------------------------------------------ */
/* a batch                                                             */

/* Every rank, before a batch: the batch's adapters on the device. Each
 * adapter the batch names counts once, a hit when resident, else a miss:
 * the misses' room is made first (least recently used adapters the batch
 * does not name go, by the sizes their first load measured: the same
 * choice on every rank; a cache left over the budget by the batch before
 * comes back under here too), then their files are read again. When a
 * rank fails to load one, the group agrees and every rank frees what this
 * batch loaded; the batch then fails naming the file. Between batches,
 * never in the step loop. */
int ditd__worker_lora_prepare(ditd__worker *w, const Ditd__Batch *b)
{
    int need[DITD_WORKER_MAX_LORAS], n_need = 0, loaded[DITD_WORKER_MAX_LORAS], n_loaded = 0;
    int n_miss = 0, err = 0;
    uint8_t in[DITD_WORKER_MAX_LORAS] = {0};
    size_t miss_bytes = 0;
    for (size_t i = 0; i < b->n_samples; i++)
        for (size_t j = 0; j < b->samples[i]->n_lora_names; j++) {
            int k = ditd__worker_find_lora(w, b->samples[i]->lora_names[j]);
            if (k >= 0 && !in[k]) { /* unknown: set_loras names it */
                in[k] = 1;
                need[n_need++] = k;
            }
        }
    if (!n_need)
        return 0;
    uint64_t now = ++w->lora_clock;
    for (int i = 0; i < n_need; i++) {
        ditd__wlora *a = &w->lora[need[i]];
        a->used = now;
        event(w, a->name, a->dev ? DITD__LORA_EV_HIT : DITD__LORA_EV_MISS, 0);
        if (!a->dev) {
            n_miss++;
            miss_bytes += a->cost;
        }
    }
    /* over the budget (a batch before whose adapters did not fit): back
     * under it, by what this batch does not name */
    make_room(w, miss_bytes, now, -1);
    if (!n_miss)
        return 0;
    for (int i = 0; i < n_need && !err; i++)
        if (!w->lora[need[i]].dev && !(err = upload(w, need[i], 0)))
            loaded[n_loaded++] = need[i];
    /* every rank had the same misses: the group agrees on the loads */
    char who[256];
    int own = err;
    err = ditd__worker_group_agree(w, err, who, sizeof who);
    if (err) {
        char why[1024];
        snprintf(why, sizeof why, "%s", own ? ditd_err_detail() : who);
        for (int i = 0; i < n_loaded; i++)
            drop_dev(w, loaded[i], DITD__LORA_EV_UNLOAD);
        err = ditd_err_set(err, "loading the batch's LoRA adapter %s", why);
    }
    return err;
}

/* Every rank: sample i's adapter set from its message (batch_ok checked
 * the names on the leader; prepare put them on the device). */
int ditd__worker_set_loras(ditd__worker *w, int i, const Ditd__Sample *sm)
{
    ditd_lora_set *ls = &w->lsets[i];
    ls->n = 0;
    w->samples[i].loras = NULL;
    if (!sm->n_lora_names)
        return 0;
    if (sm->n_lora_names != sm->n_lora_scales || sm->n_lora_names > DITD_LORA_MAX_SET)
        return ditd_err_set(DITD_EINVAL, "sample %d: LoRA names and scales do not pair", i);
    for (size_t k = 0; k < sm->n_lora_names; k++) {
        int a = ditd__worker_find_lora(w, sm->lora_names[k]);
        if (a < 0 || !w->lora[a].dev)
            return ditd_err_set(DITD_EINVAL, "sample %d: LoRA adapter '%.64s' is not %s", i,
                                sm->lora_names[k], a < 0 ? "known" : "on the device");
        ls->ad[ls->n] = w->lora[a].dev;
        ls->weight[ls->n++] = sm->lora_scales[k];
    }
    w->samples[i].loras = ls;
    return 0;
}

/* ------------------------------------------------------------------ */
/* reports                                                             */

/* Adapter k as a LoraInfo (its modules from the leader's host copy, when
 * it still has one); mods and ranks are the arrays the caller frees. */
static int fill_info(const ditd__worker *w, int k, Ditd__LoraInfo *li, char ***mods,
                     uint32_t **ranks)
{
    const ditd_denoiser *den = w->rep.pipe->den;
    const ditd__wlora *a = &w->lora[k];
    const ditd_lora *l = a->host;
    ditd__lora_info__init(li);
    li->name = (char *)a->name;
    li->bytes = a->bytes;
    li->resident = a->dev != NULL;
    *mods = NULL;
    *ranks = NULL;
    if (!l)
        return 0;
    li->format = (uint32_t)l->format;
    li->max_rank = (uint32_t)l->max_rank;
    *mods = calloc((size_t)l->n_mod + 1, sizeof **mods);
    *ranks = calloc((size_t)l->n_mod + 1, sizeof **ranks);
    if (!*mods || !*ranks)
        return DITD_ENOMEM;
    for (int m = 0; m < l->n_mod; m++) {
        (*mods)[m] = (char *)den->lora_targets[l->mod[m].target].name;
        (*ranks)[m] = (uint32_t)l->mod[m].rank;
    }
    li->n_modules = li->n_ranks = (size_t)l->n_mod;
    li->modules = *mods;
    li->ranks = *ranks;
    return 0;
}

/* The leader, once after start-up: what it loaded, for GET /v1/loras;
 * then the host copies go. */
void ditd__worker_send_adapters(ditd__worker *w)
{
    Ditd__Envelope env = DITD__ENVELOPE__INIT;
    Ditd__Adapters am = DITD__ADAPTERS__INIT;
    Ditd__LoraInfo *li = calloc((size_t)w->n_lora + 1, sizeof *li);
    Ditd__LoraInfo **lip = calloc((size_t)w->n_lora + 1, sizeof *lip);
    char ***mods = calloc((size_t)w->n_lora + 1, sizeof *mods);
    uint32_t **ranks = calloc((size_t)w->n_lora + 1, sizeof *ranks);
    int ok = li && lip && mods && ranks;
    for (int i = 0; ok && i < w->n_lora; i++) {
        ok = !fill_info(w, i, &li[i], &mods[i], &ranks[i]);
        lip[i] = &li[i];
    }
    if (ok) {
        am.n_loras = (size_t)w->n_lora;
        am.loras = lip;
        env.msg_case = DITD__ENVELOPE__MSG_ADAPTERS;
        env.adapters = &am;
        ditd__worker_send_env(w, &env);
    }
    for (int i = 0; i < w->n_lora; i++) {
        if (mods)
            free(mods[i]);
        if (ranks)
            free(ranks[i]);
        ditd_lora_free(w->lora[i].host);
        w->lora[i].host = NULL;
    }
    free(mods);
    free(ranks);
    free(lip);
    free(li);
}

/* ------------------------------------------------------------------ */
/* run-time loads and unloads                                          */

/* Every rank of the group, between batches: a LoraOp. A load adds the
 * adapter and uploads it; then the group agrees, and when a rank failed
 * the others take it out again (the leader's answer carries the loader's
 * message, or names the ranks that failed). Only once all agree does the
 * cache evict to fit it, so the ranks evict alike. An unload frees it.
 * The leader answers with a LoraDone (after the events). */
void ditd__worker_lora_op(ditd__worker *w, const Ditd__LoraOp *op)
{
    const char *name = op->name ? op->name : "", *path = op->path ? op->path : "";
    char msg[1024] = "", who[256];
    int err = 0, own, k = -1;
    Ditd__LoraInfo li, *lip = NULL;
    char **mods = NULL;
    uint32_t *ranks = NULL;

    if (op->kind == 1) {
        const ditd_denoiser *den = w->rep.pipe->den;
        if (den->n_lora_targets <= 0)
            err = ditd_err_set(DITD_EUNSUPPORTED, "%s=%s: %s", name, path, den->lora_refusal);
        else if (!(err = add_entry(w, name, path))) {
            k = w->n_lora - 1;
            w->lora[k].used = ++w->lora_clock;
            if ((err = upload(w, k, 1))) {
                snprintf(msg, sizeof msg, "%s", ditd_err_detail());
                remove_entry(w, k, DITD__LORA_EV_UNLOAD); /* nothing on the device */
                k = -1;
            }
        }
        if (err && !msg[0])
            snprintf(msg, sizeof msg, "%s", ditd_err_detail());
        own = err;
        err = ditd__worker_group_agree(w, err, who, sizeof who);
        if (err && !own) { /* another rank failed: undo ours */
            snprintf(msg, sizeof msg, "%s=%s: %s", name, path, who);
            remove_entry(w, k, DITD__LORA_EV_UNLOAD);
            k = -1;
        }
        if (err && !w->leader)
            fprintf(stderr, "ditd worker: replica %d, group rank %d: LoRA load: %s\n",
                    w->cfg->replica, w->mesh ? w->mesh->rank : 0, msg);
        if (!err) {
            make_room(w, 0, w->lora[k].used, k);
            if (w->leader && !fill_info(w, k, &li, &mods, &ranks))
                lip = &li;
        }
    } else if (op->kind == 2) {
        if ((k = ditd__worker_find_lora(w, name)) < 0) {
            err = DITD_ENOENT;
            snprintf(msg, sizeof msg, "adapter %.64s is not loaded on this replica", name);
        } else {
            remove_entry(w, k, DITD__LORA_EV_UNLOAD);
            k = -1;
        }
    } else {
        err = DITD_EINVAL;
        snprintf(msg, sizeof msg, "LoRA op kind %u (1 load, 2 unload)", op->kind);
    }
    if (w->leader) {
        ditd__worker_lora_flush(w);
        ditd__worker_lora_done(w, op->op_id, err, msg, lip);
    }
    free(mods);
    free(ranks);
    if (k >= 0) { /* its modules are reported: the host copy goes */
        ditd_lora_free(w->lora[k].host);
        w->lora[k].host = NULL;
    }
}
