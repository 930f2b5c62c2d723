/* Step caching at run time (engine/pipeline/step_cache.h): the states per
 * sample and branch, the hooks a family calls (engine/models/denoiser.h),
 * the group-wide exchange behind First Block Cache's decision, MagCache.
 * TaylorSeer's module hooks are step_cache_taylor.c; the configs and their
 * parser step_cache_config.c. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/error.h"
#include "engine/parallel/comm.h"
#include "engine/pipeline/step_cache_state.h"

/* ---- lifetime ---- */

int ditd_step_cache_new(const ditd_backend_ops *ops, const ditd_mesh *mesh, int max_samples,
                        ditd_step_cache **out)
{
    ditd_step_cache *c = calloc(1, sizeof *c);
    if (!c)
        return ditd_err_set(DITD_ENOMEM, "step cache");
    c->ops = ops;
    c->mesh = mesh && mesh->size > 1 ? mesh : NULL;
    c->max_samples = max_samples;
    c->max_slots = 2 * max_samples;
    c->stats = calloc((size_t)max_samples, sizeof *c->stats);
    c->row_sample = malloc(3 * (size_t)c->max_slots * sizeof(int));
    c->us = calloc((size_t)c->max_slots, sizeof *c->us);
    c->dec = malloc((size_t)c->max_slots);
    if (!c->stats || !c->row_sample || !c->us || !c->dec) {
        ditd_step_cache_free(c);
        return ditd_err_set(DITD_ENOMEM, "step cache");
    }
    c->row_unit = c->row_sample + c->max_slots;
    c->row_slot = c->row_unit + c->max_slots;
    *out = c;
    return 0;
}

static void free_mem(ditd_step_cache *c)
{
    if (c->mem) {
        if (c->ops->mem_free)
            c->ops->mem_free(c->mem, c->mem_bytes);
        else
            free(c->mem);
    }
    c->mem = NULL;
    c->mem_bytes = 0;
}

static void free_plan(ditd_step_cache *c)
{
    free(c->hooked);
    free(c->names);
    c->names = NULL;
    free(c->elems);
    free(c->tbuf);
    free(c->tay);
    free(c->cal);
    free(c->tok);
    free(c->send);
    free(c->table);
    free(c->counts);
    free(c->mag);
    free(c->trace);
    free(c->trace_n);
    c->trace = NULL;
    c->trace_n = NULL;
    c->hooked = c->inactive = NULL;
    c->elems = NULL;
    c->tbuf = NULL;
    c->tay = NULL;
    c->cal = c->cal_out = NULL;
    c->tok = c->send = c->recv = c->table = NULL;
    c->counts = c->displs = NULL;
    c->mag = NULL;
}

void ditd_step_cache_free(ditd_step_cache *c)
{
    if (!c)
        return;
    ditd_step_cache_end(c);
    free_plan(c);
    free_mem(c);
    free(c->stats);
    free(c->row_sample);
    free(c->us);
    free(c->dec);
    free(c);
}

/* ---- planning ---- */

static int plan(ditd_step_cache *c, ditd_denoiser *d)
{
    const ditd_backend_ops *ops = c->ops;
    size_t es = ditd_dtype_size(ops->act_dtype), slots = (size_t)c->max_slots;
    size_t E = c->E, R = (size_t)c->R, need = 0, zmax = E;
    int tay = c->cfg.method == DITD_CACHE_TAYLORSEER, err;
    int G = c->mesh ? c->mesh->size : 1;

    free_plan(c);
    if (tay && (err = ditd__step_cache_resolve_modules(c, d)))
        return err;
    /* bytes: in, hout, res (R, E); prev_res, tail (slots, E); taylor buffers */
    need = 3 * R * E + 2 * slots * E;
    if (tay)
        for (int p = 0; p < c->np; p++)
            if (c->hooked[p]) { /* skip-predict modules keep no factors, only zeros */
                if (!c->inactive[p])
                    need += slots * (size_t)(c->cfg.max_order + 2) * c->elems[p];
                if (c->elems[p] > zmax)
                    zmax = c->elems[p];
            }
    need += zmax;
    need *= es;
    if (need > c->mem_bytes) {
        free_mem(c);
        if (ops->mem_alloc) {
            if ((err = ops->mem_alloc(&c->mem, need)))
                return err;
        } else if (!(c->mem = calloc(1, need))) {
            return ditd_err_set(DITD_ENOMEM, "step cache buffers (%zu bytes)", need);
        }
        c->mem_bytes = need;
    }
    {
        size_t o = 0;
#define CARVE(p, n) ((p) = ditd_ptr_act(ops, c->mem, o), o += (n))
        CARVE(c->in, R * E);
        CARVE(c->hout, R * E);
        CARVE(c->res, R * E);
        CARVE(c->prev_res, slots * E);
        CARVE(c->tail, slots * E);
        CARVE(c->zero, zmax);
        if (tay) {
            c->tbuf = calloc(slots * (size_t)c->np * MAX_ORDER_BUFS, sizeof(void *));
            c->tay = calloc((size_t)c->units * (size_t)c->np, sizeof(tay_state));
            if (!c->tbuf || !c->tay)
                return ditd_err_set(DITD_ENOMEM, "step cache modules");
            for (size_t s = 0; s < slots; s++)
                for (int p = 0; p < c->np; p++)
                    if (c->hooked[p] && !c->inactive[p])
                        for (int k = 0; k < c->cfg.max_order + 2; k++)
                            CARVE(c->tbuf[(s * (size_t)c->np + (size_t)p) * MAX_ORDER_BUFS + (size_t)k],
                                  c->elems[p]);
        }
#undef CARVE
    }
    /* zeros for skip_predict modules (an upload: once per batch) */
    {
        float *z = calloc(zmax, sizeof(float));
        if (!z)
            return ditd_err_set(DITD_ENOMEM, "step cache zeros");
        ops->upload(c->zero, z, zmax);
        free(z);
    }
    /* host: statistics and the exchange */
    c->rec = HDR + R * (size_t)c->N * 2;
    c->tok = malloc(R * (size_t)c->N * 4 * sizeof(double));
    c->send = malloc(c->rec * (size_t)(G + 1) * sizeof(double));
    c->table = calloc(slots * (size_t)c->N * 2, sizeof(double));
    c->counts = malloc(2 * (size_t)G * sizeof(int));
    c->cal = calloc(2 * (size_t)c->units * (size_t)(c->steps + 1), sizeof(float));
    c->mag = calloc((size_t)c->steps + 1, sizeof(float));
    c->trace = calloc((size_t)c->units * (size_t)(c->steps + 1) * 2, sizeof(double));
    c->trace_n = calloc((size_t)c->units, sizeof(int));
    if (!c->tok || !c->send || !c->table || !c->counts || !c->cal || !c->mag || !c->trace ||
        !c->trace_n)
        return ditd_err_set(DITD_ENOMEM, "step cache statistics");
    if (c->rec * (size_t)G > (size_t)0x7fffffff)
        return ditd_err_set(DITD_EINVAL, "step cache: exchange too large");
    c->recv = c->send + c->rec;
    c->cal_out = c->cal + (size_t)c->units * (size_t)(c->steps + 1);
    c->displs = c->counts + G;
    for (int g = 0; g < G; g++) {
        c->counts[g] = (int)c->rec;
        c->displs[g] = (int)(c->rec * (size_t)g);
    }
    return 0;
}

/* MagCacheConfig.__post_init__'s nearest_interp to num_inference_steps, in
 * float32 as torch computes it. */
static void plan_mag(ditd_step_cache *c)
{
    const ditd_cache_config *cfg = &c->cfg;
    int T = c->mag_steps, S = cfg->n_mag_ratios;
    if (cfg->calibrate || S == 0)
        return;
    if (S == T) {
        memcpy(c->mag, cfg->mag_ratios, (size_t)T * sizeof(float));
        return;
    }
    if (T == 1) {
        c->mag[0] = cfg->mag_ratios[S - 1];
        return;
    }
    float scale = (float)((double)(S - 1) / (double)(T - 1));
    for (int i = 0; i < T && i <= c->steps; i++) {
        long k = (long)nearbyintf((float)i * scale);
        c->mag[i] = cfg->mag_ratios[k < 0 ? 0 : k >= S ? S - 1 : k];
    }
}

static void reset_states(ditd_step_cache *c)
{
    for (int u = 0; u < c->units; u++) {
        memset(&c->us[u], 0, sizeof c->us[u]);
        c->us[u].acc_ratio = 1.0f;
    }
    if (c->tay)
        for (size_t i = 0; i < (size_t)c->units * (size_t)c->np; i++)
            c->tay[i] = (tay_state){-1, -1, 0, 1};
    memset(c->stats, 0, (size_t)c->max_samples * sizeof *c->stats);
    if (c->trace_n)
        memset(c->trace_n, 0, (size_t)c->units * sizeof(int));
}

static int h_blocks_begin(void *ctx, const ditd_cache_streams *s, int *run);
static int h_first_block_done(void *ctx, const ditd_cache_streams *s, int *run);
static int h_blocks_end(void *ctx, const ditd_cache_streams *s);

int ditd_step_cache_begin(ditd_step_cache *c, ditd_denoiser *d, const ditd_cache_config *cfg,
                          int steps, int n, int shared_branches)
{
    int err;
    ditd_step_cache_end(c);
    memset(c->stats, 0, (size_t)c->max_samples * sizeof *c->stats);
    if (!cfg || cfg->method == DITD_CACHE_NONE)
        return 0;
    if ((err = ditd_cache_config_check(cfg)))
        return err;
    if (n < 1 || n > c->max_samples)
        return ditd_err_set(DITD_EINVAL, "step cache: %d samples (1..%d)", n, c->max_samples);
    if (!c->ops->row_diff_stats || !c->ops->axpby)
        return ditd_err_set(DITD_EUNSUPPORTED, "%s: backend %s has no step-caching ops",
                            ditd_cache_method_name(cfg->method), c->ops->name);
    if (cfg->method != DITD_CACHE_TAYLORSEER && d->cache_blocks < 2)
        return ditd_err_set(DITD_EUNSUPPORTED, "%s needs a model with block hooks and at least "
                                               "two blocks (%s: %d)",
                            ditd_cache_method_name(cfg->method),
                            d->family ? d->family->class_name : "model", d->cache_blocks);
    c->cfg = *cfg;
    c->den = d;
    c->n = n;
    c->steps = steps;
    c->shared = shared_branches;
    c->units = shared_branches ? n : 2 * n;
    c->L = d->cache_blocks;
    c->N = d->shapes.tokens;
    c->E = d->cache_img_elems;
    c->R = d->max_batch;
    c->mag_steps = cfg->num_inference_steps > 0 ? cfg->num_inference_steps : steps;
    c->retention_step = (int)(cfg->retention_ratio * (double)c->mag_steps + 0.5);
    if ((err = plan(c, d)))
        return err;
    plan_mag(c);
    reset_states(c);
    int tay = cfg->method == DITD_CACHE_TAYLORSEER;
    c->hooks = (ditd_denoiser_cache){c, h_blocks_begin, h_first_block_done, h_blocks_end,
                                     tay ? ditd__step_cache_module_begin : NULL,
                                     tay ? ditd__step_cache_module_end : NULL,
                                     tay ? ditd__step_cache_module_begin_parts : NULL,
                                     tay ? ditd__step_cache_module_end_parts : NULL};
    d->cache = &c->hooks;
    return 0;
}

void ditd_step_cache_end(ditd_step_cache *c)
{
    if (!c)
        return;
    if (c->den)
        c->den->cache = NULL;
    c->den = NULL;
}

void ditd_step_cache_bind(ditd_step_cache *c, int rows_total, const int *row_sample,
                          const uint8_t *row_branch, int r0, int nr)
{
    c->rows = rows_total;
    c->r0 = r0;
    c->nr = nr;
    for (int u = 0; u < c->units; u++) {
        c->us[u].present = 0;
        c->us[u].calls = c->us[u].preds = 0;
    }
    for (int r = 0; r < rows_total; r++) {
        int i = row_sample[r], b = row_branch[r];
        c->row_sample[r] = i;
        c->row_slot[r] = 2 * i + b;
        c->row_unit[r] = c->shared ? i : 2 * i + b;
        c->us[c->row_unit[r]].present = 1;
    }
}

/* ---- the group's exchange ---- */

/* The gathered per-token statistics: every rank contributes its rows'
 * tokens (quantities q0, q1 of the 4 row_diff_stats gives) and gets the
 * whole (rows, N, 2) table, assembled in token order (tp replicas ignored).
 * On one rank the same assembly: the sums that follow are the same. */
static int exchange(ditd_step_cache *c, int tok0, int n_img, int q0, int q1)
{
    double *rec = c->send;
    int tp_rank = c->mesh ? c->mesh->tp_rank : 0, G = c->mesh ? c->mesh->size : 1, err;
    rec[0] = tok0;
    rec[1] = n_img;
    rec[2] = c->r0;
    rec[3] = c->nr;
    rec[4] = tp_rank;
    rec[5] = 1;
    for (int lr = 0; lr < c->nr; lr++)
        for (int t = 0; t < n_img; t++) {
            const double *s = c->tok + ((size_t)lr * (size_t)n_img + (size_t)t) * 4;
            double *o = rec + HDR + ((size_t)lr * (size_t)n_img + (size_t)t) * 2;
            o[0] = s[q0];
            o[1] = s[q1];
        }
    const double *all = rec;
    if (c->mesh) {
        memcpy(c->recv + c->rec * (size_t)c->mesh->rank, rec, c->rec * sizeof(double));
        if ((err = ditd_comm_allgatherv(c->mesh->group, DITD_DTYPE_I64, NULL, c->recv, c->counts,
                                        c->displs)))
            return err;
        all = c->recv;
    }
    for (int g = 0; g < G; g++) {
        const double *h = all + c->rec * (size_t)g;
        int t0 = (int)h[0], nt = (int)h[1], rr0 = (int)h[2], rn = (int)h[3];
        if (h[4] != 0 || h[5] != 1)
            continue;
        for (int lr = 0; lr < rn; lr++)
            memcpy(c->table + ((size_t)(rr0 + lr) * (size_t)c->N + (size_t)t0) * 2,
                   h + HDR + (size_t)lr * (size_t)nt * 2, (size_t)nt * 2 * sizeof(double));
    }
    return 0;
}

/* First Block Cache's decision for every unit of the step, from the table:
 * mean|r - r_prev| / mean|r_prev| > threshold, summed row by row, token by
 * token (the layout does not enter). The leader's decisions are broadcast. */
static int fbc_decide(ditd_step_cache *c, int D)
{
    int err;
    for (int u = 0; u < c->units; u++) {
        unit_state *st = &c->us[u];
        if (!st->present)
            continue;
        if (!st->has_prev) {
            c->dec[u] = 1;
            continue;
        }
        double s1 = 0.0, s2 = 0.0;
        long cnt = 0;
        for (int r = 0; r < c->rows; r++) {
            if (c->row_unit[r] != u)
                continue;
            const double *t = c->table + (size_t)r * (size_t)c->N * 2;
            for (int k = 0; k < c->N; k++) {
                s1 += t[2 * k];
                s2 += t[2 * k + 1];
            }
            cnt += (long)c->N * D;
        }
        double absmean = s1 / (double)cnt, prev = s2 / (double)cnt;
        c->dec[u] = absmean / prev > c->cfg.threshold;
        /* the trace: the group's ratio, and what this rank's own rows and
         * tokens alone would give (the decision a rank must not take alone) */
        double l1 = 0.0, l2 = 0.0;
        int nt = 0;
        for (int lr = 0; lr < c->nr; lr++)
            if (c->row_unit[c->r0 + lr] == u)
                for (int k = 0; k < c->n_img; k++) {
                    const double *t = c->tok + ((size_t)lr * (size_t)c->n_img + (size_t)k) * 4;
                    l1 += t[0];
                    l2 += t[1];
                    nt++;
                }
        if (c->trace_n[u] <= c->steps) {
            double *tr = c->trace + ((size_t)u * (size_t)(c->steps + 1) + (size_t)c->trace_n[u]) * 2;
            tr[0] = absmean / prev;
            tr[1] = nt ? l1 / l2 : NAN;
            c->trace_n[u]++;
        }
    }
    if (c->mesh && (err = ditd_mesh_bcast(c->mesh, c->dec, (size_t)c->units)))
        return err;
    for (int u = 0; u < c->units; u++)
        if (c->us[u].present) {
            c->us[u].compute = c->dec[u];
            if (c->dec[u])
                c->us[u].has_prev = 1;
        }
    return 0;
}

static int local_any_compute(const ditd_step_cache *c)
{
    for (int lr = 0; lr < c->nr; lr++)
        if (c->us[c->row_unit[c->r0 + lr]].compute)
            return 1;
    return 0;
}

/* MagCacheHeadHook's decision for one state (before its head block). */
static void mag_decide(ditd_step_cache *c, unit_state *st)
{
    const ditd_cache_config *cfg = &c->cfg;
    st->compute = 1;
    if (cfg->calibrate)
        return;
    int cur = st->step_index;
    float scale = cur >= c->mag_steps ? 1.0f : c->mag[cur];
    if (cur >= c->retention_step) {
        st->acc_ratio *= scale;
        st->acc_steps += 1;
        st->acc_err += fabsf(1.0f - st->acc_ratio);
        if (st->has_prev && st->acc_err <= (float)cfg->threshold &&
            st->acc_steps <= cfg->max_skip_steps) {
            st->compute = 0;
        } else {
            st->acc_ratio = 1.0f;
            st->acc_steps = 0;
            st->acc_err = 0.0f;
        }
    }
}

/* MagCacheBlockHook._advance_step */
static void mag_advance(ditd_step_cache *c, int u)
{
    unit_state *st = &c->us[u];
    st->step_index += 1;
    if (st->step_index >= c->mag_steps) {
        if (c->cfg.calibrate) { /* printed by Diffusers, kept here */
            size_t w = (size_t)(c->steps + 1);
            memcpy(c->cal_out + (size_t)u * w, c->cal + (size_t)u * w,
                   (size_t)st->n_cal * sizeof(float));
            st->n_cal_out = st->n_cal;
        }
        st->step_index = 0;
        st->acc_ratio = 1.0f;
        st->acc_steps = 0;
        st->acc_err = 0.0f;
        st->has_prev = 0;
        st->n_cal = 0;
    }
}

/* ---- the hooks ---- */

static int h_blocks_begin(void *ctx, const ditd_cache_streams *s, int *run)
{
    ditd_step_cache *c = ctx;
    const ditd_backend_ops *ops = c->ops;
    size_t E = (size_t)s->n_img * (size_t)s->D;
    *run = 1;
    if (s->B != c->nr || E != c->E)
        return ditd_err_set(DITD_EINTERNAL, "step cache: forward of %d rows x %zu (bound %d x %zu)",
                            s->B, E, c->nr, c->E);
    if (c->cfg.method == DITD_CACHE_TAYLORSEER)
        return 0;
    /* the head block's input: fbc's residual, mag's residual of all blocks */
    copy_row(c, c->in, s->img, (size_t)s->B * E);
    if (c->cfg.method != DITD_CACHE_MAG)
        return 0;
    for (int u = 0; u < c->units; u++)
        if (c->us[u].present)
            mag_decide(c, &c->us[u]);
    if (local_any_compute(c))
        return 0;
    /* every row skips: output = input + previous residual */
    for (int lr = 0; lr < s->B; lr++)
        ops->add(cache_row(c, s->img, (size_t)lr, E), cache_row(c, c->prev_res, (size_t)c->row_slot[c->r0 + lr], E),
                 E);
    for (int u = 0; u < c->units; u++)
        if (c->us[u].present)
            mag_advance(c, u);
    *run = 0;
    return ops->status();
}

static int h_first_block_done(void *ctx, const ditd_cache_streams *s, int *run)
{
    ditd_step_cache *c = ctx;
    const ditd_backend_ops *ops = c->ops;
    size_t E = c->E;
    int err;
    *run = 1;
    if (c->cfg.method != DITD_CACHE_FIRST_BLOCK)
        return 0;
    /* r = out - in; its statistics against r_prev (units that have one) */
    for (int lr = 0; lr < s->B; lr++) {
        int g = c->r0 + lr;
        void *r = cache_row(c, c->res, (size_t)lr, E);
        copy_row(c, r, cache_row(c, s->img, (size_t)lr, E), E);
        ops->axpby(r, cache_row(c, c->in, (size_t)lr, E), -1.0f, 1.0f, E, 0);
        double *t = c->tok + (size_t)lr * (size_t)s->n_img * 4;
        if (c->us[c->row_unit[g]].has_prev)
            ops->row_diff_stats(r, cache_row(c, c->prev_res, (size_t)c->row_slot[g], E), s->n_img, s->D, t);
        else
            memset(t, 0, (size_t)s->n_img * 4 * sizeof(double));
    }
    c->n_img = s->n_img;
    if ((err = ops->status()) || (err = exchange(c, s->tok0, s->n_img, 0, 1)) ||
        (err = fbc_decide(c, s->D)))
        return err;
    /* computing rows keep r as r_prev; every row keeps the head's output */
    copy_row(c, c->hout, s->img, (size_t)s->B * E);
    for (int lr = 0; lr < s->B; lr++) {
        int g = c->r0 + lr;
        if (c->us[c->row_unit[g]].compute)
            copy_row(c, cache_row(c, c->prev_res, (size_t)c->row_slot[g], E), cache_row(c, c->res, (size_t)lr, E),
                     E);
    }
    if (local_any_compute(c))
        return ops->status();
    for (int lr = 0; lr < s->B; lr++) /* output = head output + the tail's residual */
        ops->add(cache_row(c, s->img, (size_t)lr, E), cache_row(c, c->tail, (size_t)c->row_slot[c->r0 + lr], E),
                 E);
    *run = 0;
    return ops->status();
}

static int mag_calibrate(ditd_step_cache *c, const ditd_cache_streams *s)
{
    const ditd_backend_ops *ops = c->ops;
    size_t E = c->E, w = (size_t)(c->steps + 1);
    int err;
    for (int lr = 0; lr < s->B; lr++) {
        int g = c->r0 + lr;
        double *t = c->tok + (size_t)lr * (size_t)s->n_img * 4;
        ops->row_diff_stats(cache_row(c, c->res, (size_t)lr, E),
                            c->us[c->row_unit[g]].has_prev
                                ? cache_row(c, c->prev_res, (size_t)c->row_slot[g], E)
                                : NULL,
                            s->n_img, s->D, t);
    }
    if ((err = ops->status()) || (err = exchange(c, s->tok0, s->n_img, 2, 3)))
        return err;
    for (int u = 0; u < c->units; u++) {
        unit_state *st = &c->us[u];
        double ratio = 1.0, sum = 0.0;
        long cnt = 0;
        if (!st->present)
            continue;
        if (st->has_prev) {
            for (int r = 0; r < c->rows; r++) {
                if (c->row_unit[r] != u)
                    continue;
                const double *t = c->table + (size_t)r * (size_t)c->N * 2;
                for (int k = 0; k < c->N; k++)
                    sum += sqrt(t[2 * k]) / (sqrt(t[2 * k + 1]) + 1e-8);
                cnt += c->N;
            }
            ratio = sum / (double)cnt;
        }
        if (st->n_cal < (int)w)
            c->cal[(size_t)u * w + (size_t)st->n_cal++] = (float)ratio;
    }
    return 0;
}

static int h_blocks_end(void *ctx, const ditd_cache_streams *s)
{
    ditd_step_cache *c = ctx;
    const ditd_backend_ops *ops = c->ops;
    size_t E = c->E;
    int err;
    if (c->cfg.method == DITD_CACHE_TAYLORSEER)
        return 0;
    if (c->cfg.method == DITD_CACHE_FIRST_BLOCK) {
        for (int lr = 0; lr < s->B; lr++) {
            int g = c->r0 + lr;
            void *img = cache_row(c, s->img, (size_t)lr, E), *tail = cache_row(c, c->tail, (size_t)c->row_slot[g], E);
            const void *ho = cache_row(c, c->hout, (size_t)lr, E);
            if (c->us[c->row_unit[g]].compute) { /* tail residual = out - head output */
                copy_row(c, tail, img, E);
                ops->axpby(tail, ho, -1.0f, 1.0f, E, 0);
            } else { /* computed for another state's sake: this one's cached value */
                copy_row(c, img, ho, E);
                ops->add(img, tail, E);
            }
        }
        return ops->status();
    }
    /* mag: residual of all blocks = out - head input, for computing rows */
    for (int lr = 0; lr < s->B; lr++) {
        int g = c->r0 + lr;
        void *img = cache_row(c, s->img, (size_t)lr, E), *pr = cache_row(c, c->prev_res, (size_t)c->row_slot[g], E);
        const void *in = cache_row(c, c->in, (size_t)lr, E);
        if (c->us[c->row_unit[g]].compute) {
            void *r = cache_row(c, c->res, (size_t)lr, E);
            copy_row(c, r, img, E);
            ops->axpby(r, in, -1.0f, 1.0f, E, 0);
        } else {
            copy_row(c, img, in, E);
            ops->add(img, pr, E);
        }
    }
    if (c->cfg.calibrate && (err = mag_calibrate(c, s)))
        return err;
    for (int lr = 0; lr < s->B; lr++) {
        int g = c->r0 + lr;
        if (c->us[c->row_unit[g]].compute)
            copy_row(c, cache_row(c, c->prev_res, (size_t)c->row_slot[g], E), cache_row(c, c->res, (size_t)lr, E),
                     E);
    }
    for (int u = 0; u < c->units; u++)
        if (c->us[u].present) {
            if (c->us[u].compute)
                c->us[u].has_prev = 1;
            mag_advance(c, u);
        }
    return ops->status();
}

/* ---- the pipeline's side ---- */

int ditd_step_cache_idle(ditd_step_cache *c)
{
    int err;
    if (!c->den || !c->mesh)
        return 0;
    c->nr = 0;
    if (c->cfg.method == DITD_CACHE_FIRST_BLOCK) {
        if ((err = exchange(c, 0, 0, 0, 1)) || (err = fbc_decide(c, 1)))
            return err;
    }
    if (c->cfg.method == DITD_CACHE_MAG) {
        /* the other half's states advance as its forward advances them */
        for (int u = 0; u < c->units; u++)
            if (c->us[u].present) {
                mag_decide(c, &c->us[u]);
                if (c->us[u].compute)
                    c->us[u].has_prev = 1;
                mag_advance(c, u);
            }
        if (c->cfg.calibrate)
            return exchange(c, 0, 0, 2, 3);
    }
    if (c->cfg.method == DITD_CACHE_TAYLORSEER)
        ditd__step_cache_module_idle(c);
    return 0;
}

void ditd_step_cache_step_done(ditd_step_cache *c)
{
    if (!c->den)
        return;
    for (int i = 0; i < c->n; i++) {
        int seen = 0, skipped = 1;
        for (int b = 0; b < 2; b++) {
            int u = c->shared ? i : 2 * i + b;
            unit_state *st = &c->us[u];
            if (!st->present || (c->shared && b == 1))
                continue;
            seen = 1;
            if (c->cfg.method == DITD_CACHE_TAYLORSEER) {
                c->stats[i].evals += st->calls;
                c->stats[i].evals_skipped += st->preds;
                skipped &= st->calls > 0 && st->preds == st->calls;
            } else {
                int sk = !st->compute;
                c->stats[i].evals += c->L;
                c->stats[i].evals_skipped +=
                    sk ? (c->cfg.method == DITD_CACHE_MAG ? c->L : c->L - 1) : 0;
                skipped &= sk;
            }
        }
        if (seen) {
            c->stats[i].steps++;
            c->stats[i].steps_skipped += skipped;
        }
    }
}

void ditd_step_cache_sample_stats(const ditd_step_cache *c, int i, ditd_cache_stats *out)
{
    memset(out, 0, sizeof *out);
    if (c && i >= 0 && i < c->max_samples)
        *out = c->stats[i];
}

const float *ditd_step_cache_calibration(const ditd_step_cache *c, int i, int branch, int *n)
{
    *n = 0;
    if (!c || !c->cal || c->cfg.method != DITD_CACHE_MAG || !c->cfg.calibrate || i < 0 ||
        i >= c->n)
        return NULL;
    int u = c->shared ? i : 2 * i + (branch != 0);
    size_t w = (size_t)(c->steps + 1);
    if (c->us[u].n_cal_out > 0) {
        *n = c->us[u].n_cal_out;
        return c->cal_out + (size_t)u * w;
    }
    *n = c->us[u].n_cal;
    return c->cal + (size_t)u * w;
}

int ditd_step_cache_fbc_trace(const ditd_step_cache *c, int i, int branch, int k, double *group,
                              double *local)
{
    if (!c || !c->trace || c->cfg.method != DITD_CACHE_FIRST_BLOCK || i < 0 || i >= c->n)
        return DITD_ERANGE;
    int u = c->shared ? i : 2 * i + (branch != 0);
    if (k < 0 || k >= c->trace_n[u])
        return DITD_ERANGE;
    const double *tr = c->trace + ((size_t)u * (size_t)(c->steps + 1) + (size_t)k) * 2;
    *group = tr[0];
    *local = tr[1];
    return 0;
}
