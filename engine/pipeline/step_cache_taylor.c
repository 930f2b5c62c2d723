/* TaylorSeer's module hooks (engine/pipeline/step_cache.h): which modules
 * the identifiers hook, the schedule, the Taylor factors' update and
 * prediction, as diffusers/hooks/taylorseer_cache.py. */
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/error.h"
#include "engine/pipeline/step_cache_state.h"

/* ---- TaylorSeer's module patterns ---- */

/* re.fullmatch(pattern, name) for the simple patterns Diffusers uses:
 * POSIX extended, Python's \d read as [0-9]. */
static int full_match(const char *pat, const char *name, int *match)
{
    char buf[4 * DITD_CACHE_PATTERN_LEN + 8];
    size_t o = 0;
    regex_t re;
    buf[o++] = '^';
    buf[o++] = '(';
    for (const char *p = pat; *p && o + 8 < sizeof buf; p++) {
        if (p[0] == '\\' && p[1] == 'd') {
            memcpy(buf + o, "[0-9]", 5);
            o += 5;
            p++;
        } else {
            buf[o++] = *p;
        }
    }
    buf[o++] = ')';
    buf[o++] = '$';
    buf[o] = 0;
    if (regcomp(&re, buf, REG_EXTENDED | REG_NOSUB))
        return ditd_err_set(DITD_EINVAL, "taylorseer_cache: pattern \"%s\" is not a regular "
                                         "expression ditd reads (POSIX extended, \\d)",
                            pat);
    *match = regexec(&re, name, 0, NULL, 0) == 0;
    regfree(&re);
    return 0;
}

static int match_any(const char (*pats)[DITD_CACHE_PATTERN_LEN], int n, const char *const *dflt,
                     const char *name, int *match)
{
    int err, m = 0;
    *match = 0;
    for (int i = 0; i < n; i++) {
        if ((err = full_match(pats[i], name, &m)))
            return err;
        *match |= m;
    }
    for (; dflt && *dflt; dflt++) {
        if ((err = full_match(*dflt, name, &m)))
            return err;
        *match |= m;
    }
    return 0;
}

/* Resolves which of the family's modules are hooked, as
 * apply_taylorseer_cache: active = cache_identifiers or the attention-block
 * defaults; lite mode: blocks inactive, proj_out active. */
int ditd__step_cache_resolve_modules(ditd_step_cache *c, ditd_denoiser *d)
{
    static const char *const dflt_active[] = {"^blocks.*attn", "^transformer_blocks.*attn",
                                              "^single_transformer_blocks.*attn",
                                              "^temporal_transformer_blocks.*attn", NULL};
    static const char *const lite_active[] = {"^proj_out$", NULL};
    static const char *const lite_inactive[] = {"^[^.]*block[^.]*\\.[^.]+$", NULL};
    const ditd_cache_config *cfg = &c->cfg;
    char name[160], names[1024] = "";
    int n_active = 0, err;
    size_t used = 0;
    if (!d->family || !d->family->module_name || d->cache_modules <= 0)
        return ditd_err_set(DITD_EUNSUPPORTED, "taylorseer_cache: %s has no module hooks",
                            d->family ? d->family->class_name : "this model");
    c->np = d->cache_modules;
    c->hooked = calloc(2 * (size_t)c->np, 1);
    c->elems = calloc((size_t)c->np, sizeof(size_t));
    c->names = calloc((size_t)c->np, sizeof *c->names);
    if (!c->hooked || !c->elems || !c->names)
        return ditd_err_set(DITD_ENOMEM, "step cache modules");
    c->inactive = c->hooked + c->np;
    for (int i = 0; i < c->np; i++) {
        int act = 0, inact = 0;
        if ((err = d->family->module_name(d, i, name, sizeof name, &c->elems[i])))
            return err;
        memcpy(c->names[i], name, sizeof c->names[i]);
        if (i < 6 && used + strlen(name) + 3 < sizeof names)
            used += (size_t)snprintf(names + used, sizeof names - used, "%s%s", i ? ", " : "", name);
        if (cfg->use_lite_mode) {
            if ((err = match_any(NULL, 0, lite_inactive, name, &inact)) ||
                (err = match_any(NULL, 0, lite_active, name, &act)))
                return err;
        } else {
            if ((err = match_any(cfg->skip_predict_identifiers, cfg->n_skip_predict_identifiers,
                                 NULL, name, &inact)) ||
                (err = match_any(cfg->cache_identifiers, cfg->n_cache_identifiers,
                                 cfg->n_cache_identifiers ? NULL : dflt_active, name, &act)))
                return err;
        }
        if (!(act || inact))
            continue;
        if (!inact && c->elems[i] == 0)
            return ditd_err_set(DITD_EINVAL,
                                "taylorseer_cache: %s of %s can only be skip-predicted "
                                "(skip_predict_identifiers, use_lite_mode): its output is two "
                                "streams",
                                name, d->family->class_name);
        c->hooked[i] = 1;
        c->inactive[i] = (uint8_t)inact;
        n_active += !inact;
    }
    if (n_active == 0)
        return ditd_err_set(DITD_EINVAL,
                            "taylorseer_cache: no module of %s is predicted with these identifiers%s "
                            "(its modules: %s, ...)",
                            d->family->class_name,
                            cfg->use_lite_mode ? " (use_lite_mode predicts proj_out only)" : "",
                            names);
    return 0;
}

/* TaylorSeerCacheHook._measure_should_compute for one state */
static int tay_should_compute(const ditd_cache_config *cfg, tay_state *t)
{
    t->current_step += 1;
    int s = t->current_step, k = cfg->cache_interval;
    int m = ((s - cfg->disable_cache_before_step - 1) % k + k) % k; /* Python's % */
    return s < cfg->disable_cache_before_step || m == 0 ||
           (cfg->disable_cache_after_step >= 0 && s >= cfg->disable_cache_after_step);
}

static void **tbufs(const ditd_step_cache *c, int slot, int id)
{
    return c->tbuf + ((size_t)slot * (size_t)c->np + (size_t)id) * MAX_ORDER_BUFS;
}

/* One forward row lr of a module's parts to or from flat (the row's
 * elements, the parts one after the other): a module's outputs as its
 * factors keep them. */
static void parts_row_io(const ditd_step_cache *c, const ditd_cache_part *pt, int n, size_t lr,
                         void *flat, int to_flat)
{
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        size_t T = (size_t)pt[i].tokens, C = (size_t)pt[i].cols;
        if (T == 0)
            continue;
        void *p = ditd_ptr_act(c->ops, pt[i].ptr, lr * T * pt[i].ld);
        void *f = ditd_ptr_act(c->ops, flat, off);
        if (to_flat)
            c->ops->copy2d(f, C, p, pt[i].ld, T, C);
        else
            c->ops->copy2d(p, pt[i].ld, f, C, T, C);
        off += T * C;
    }
}

/* the row's parts are one contiguous run: the factors can be read and
 * written there in place */
static void *parts_flat(const ditd_step_cache *c, const ditd_cache_part *pt, int n, size_t lr)
{
    if (n != 1 || ((size_t)pt[0].cols != pt[0].ld && pt[0].tokens > 1))
        return NULL;
    return ditd_ptr_act(c->ops, pt[0].ptr, lr * (size_t)pt[0].tokens * pt[0].ld);
}

/* TaylorSeerState.predict into forward row lr of the module's parts */
static int tay_predict_row(ditd_step_cache *c, int id, const tay_state *t, int slot,
                           const ditd_cache_part *pt, int n, size_t lr)
{
    const ditd_backend_ops *ops = c->ops;
    size_t E = c->elems[id];
    if (t->last_update_step < 0)
        return ditd_err_set(DITD_EINVAL, "taylorseer_cache: cannot predict without a prior update "
                                         "(step %d)",
                            t->current_step);
    if (c->inactive[id]) { /* zeros; a module of no elements: the family zeroes its outputs */
        if (E)
            parts_row_io(c, pt, n, lr, c->zero, 0);
        return 0;
    }
    void **f = tbufs(c, slot, id);
    void *flat = parts_flat(c, pt, n, lr), *out = flat ? flat : f[c->cfg.max_order + 1];
    int off = t->current_step - t->last_update_step;
    double coeff = 1.0;
    copy_row(c, out, f[0], E);
    for (int o = 1; o < t->orders; o++) {
        coeff = coeff * off / o; /* step_offset**order / factorial(order) */
        ops->axpby(out, f[o], (float)coeff, 1.0f, E, 0);
    }
    if (!flat) /* the spare factor buffer holds nothing between updates */
        parts_row_io(c, pt, n, lr, out, 0);
    return 0;
}

/* the parts' elements per row must be what module_name said */
static int check_parts(const ditd_step_cache *c, int id, const ditd_cache_part *pt, int n)
{
    size_t e = 0;
    for (int i = 0; i < n; i++)
        e += (size_t)pt[i].tokens * (size_t)pt[i].cols;
    if (n < 1 || n > 2 || e != c->elems[id])
        return ditd_err_set(DITD_EINVAL,
                            "taylorseer_cache: %s gave %d parts of %zu elements a row, planned %zu",
                            c->names[id], n, e, c->elems[id]);
    return 0;
}

int ditd__step_cache_module_begin_parts(void *ctx, int id, const ditd_cache_part *pt, int n,
                                        int *predicted)
{
    ditd_step_cache *c = ctx;
    int err;
    *predicted = 0;
    if (id < 0 || id >= c->np || !c->hooked[id])
        return 0;
    if (c->elems[id] && (err = check_parts(c, id, pt, n)))
        return err;
    for (int u = 0; u < c->units; u++)
        if (c->us[u].present) {
            tay_state *t = &c->tay[(size_t)u * (size_t)c->np + (size_t)id];
            t->compute = (uint8_t)tay_should_compute(&c->cfg, t);
            c->us[u].calls++;
            c->us[u].preds += !t->compute;
        }
    for (int lr = 0; lr < c->nr; lr++)
        if (c->tay[(size_t)c->row_unit[c->r0 + lr] * (size_t)c->np + (size_t)id].compute)
            return 0;
    for (int lr = 0; lr < c->nr; lr++) {
        int g = c->r0 + lr;
        if ((err = tay_predict_row(c, id, &c->tay[(size_t)c->row_unit[g] * (size_t)c->np + (size_t)id],
                                   c->row_slot[g], pt, n, (size_t)lr)))
            return err;
    }
    *predicted = 1;
    return c->ops->status();
}

/* TaylorSeerState.update for one row's features (slot's factors), the
 * divided differences computed in place with one spare buffer. */
static void tay_update_row(ditd_step_cache *c, int id, const tay_state *t, int slot,
                           const ditd_cache_part *pt, int n, size_t lr)
{
    const ditd_backend_ops *ops = c->ops;
    size_t E = c->elems[id];
    if (c->inactive[id]) /* only its shapes are recorded */
        return;
    void **f = tbufs(c, slot, id);
    int K = c->cfg.max_order, spare = K + 1, m = 0;
    void *cur = f[spare];
    parts_row_io(c, pt, n, lr, cur, 1); /* new_factors[0] = features */
    if (!c->inactive[id] && t->last_update_step >= 0) {
        float inv = 1.0f / (float)(t->current_step - t->last_update_step);
        for (int j = 0; j < K && j < t->orders; j++) {
            /* f[j] = (new_j - prev_j) / delta; then f[j] <-> cur */
            ops->axpby(f[j], cur, inv, -inv, E, 0);
            void *tmp = f[j];
            f[j] = cur;
            cur = tmp;
            m = j + 1;
        }
    }
    /* cur holds new_m: it becomes f[m], f[m]'s old buffer the spare */
    void *old = f[m];
    f[m] = cur;
    f[spare] = old;
    if (c->cfg.taylor_factors_dtype == DITD_DTYPE_BF16)
        for (int o = 0; o <= m; o++)
            ops->axpby(f[o], NULL, 0.0f, 1.0f, E, 1);
}

int ditd__step_cache_module_end_parts(void *ctx, int id, const ditd_cache_part *pt, int n)
{
    ditd_step_cache *c = ctx;
    int err;
    if (id < 0 || id >= c->np || !c->hooked[id])
        return 0;
    for (int lr = 0; lr < c->nr; lr++) {
        int g = c->r0 + lr;
        tay_state *t = &c->tay[(size_t)c->row_unit[g] * (size_t)c->np + (size_t)id];
        if (t->compute)
            tay_update_row(c, id, t, c->row_slot[g], pt, n, (size_t)lr);
        else if ((err = tay_predict_row(c, id, t, c->row_slot[g], pt, n, (size_t)lr)))
            return err;
    }
    for (int u = 0; u < c->units; u++)
        if (c->us[u].present) {
            tay_state *t = &c->tay[(size_t)u * (size_t)c->np + (size_t)id];
            if (!t->compute)
                continue;
            int orders = 1;
            if (!c->inactive[id] && t->last_update_step >= 0)
                orders = t->orders + 1 < c->cfg.max_order + 1 ? t->orders + 1 : c->cfg.max_order + 1;
            t->orders = orders;
            t->last_update_step = t->current_step;
        }
    return c->ops->status();
}

/* a module of one contiguous output: (B, elems) */
static ditd_cache_part one_part(const ditd_step_cache *c, int id, const void *out)
{
    size_t E = id >= 0 && id < c->np ? c->elems[id] : 0;
    return (ditd_cache_part){(void *)out, 1, (int)E, E};
}

int ditd__step_cache_module_begin(void *ctx, int id, void *out, int *predicted)
{
    ditd_cache_part pt = one_part(ctx, id, out);
    return ditd__step_cache_module_begin_parts(ctx, id, &pt, 1, predicted);
}

int ditd__step_cache_module_end(void *ctx, int id, const void *out)
{
    ditd_cache_part pt = one_part(ctx, id, out);
    return ditd__step_cache_module_end_parts(ctx, id, &pt, 1);
}

void ditd__step_cache_module_idle(ditd_step_cache *c)
{
    for (int u = 0; u < c->units; u++) {
        const char *skip = NULL; /* a predicted module: its submodules are not called */
        size_t skip_len = 0;
        if (!c->us[u].present)
            continue;
        for (int id = 0; id < c->np; id++) {
            if (skip && !strncmp(c->names[id], skip, skip_len) && c->names[id][skip_len] == '.')
                continue;
            skip = NULL;
            if (!c->hooked[id])
                continue;
            tay_state *t = &c->tay[(size_t)u * (size_t)c->np + (size_t)id];
            t->compute = (uint8_t)tay_should_compute(&c->cfg, t);
            c->us[u].calls++;
            c->us[u].preds += !t->compute;
            if (t->compute) {
                int orders = 1;
                if (!c->inactive[id] && t->last_update_step >= 0)
                    orders = t->orders + 1 < c->cfg.max_order + 1 ? t->orders + 1
                                                                  : c->cfg.max_order + 1;
                t->orders = orders;
                t->last_update_step = t->current_step;
            } else {
                skip = c->names[id];
                skip_len = strlen(skip);
            }
        }
    }
}
