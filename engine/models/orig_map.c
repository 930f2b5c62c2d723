/* A family's original names onto Diffusers' ones, recorded and checked
 * (orig_map.h). */
#include "engine/models/orig_map.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/error.h"

static size_t n_raw(const ditd_weights *w)
{
    return ditd_weights_gguf(w) ? ditd_gguf_count(ditd_weights_gguf(w))
                                : ditd_safetensors_count(ditd_weights_st(w));
}

static const char *raw_name(const ditd_weights *w, size_t i)
{
    return ditd_weights_gguf(w) ? ditd_gguf_at(ditd_weights_gguf(w), i)->name
                                : ditd_safetensors_at(ditd_weights_st(w), i)->name;
}

int ditd_orig_map_init(ditd_orig_map *m, ditd_weights *w, const char *pre)
{
    memset(m, 0, sizeof *m);
    m->w = w;
    m->pre = pre;
    m->scope = pre;
    if (!(m->used = calloc(n_raw(w) + 1, 1)))
        return m->err = ditd_err_set(DITD_ENOMEM, "out of memory");
    return 0;
}

void ditd_orig_map_free(ditd_orig_map *m)
{
    free(m->p);
    free(m->used);
    memset(m, 0, sizeof *m);
}

int ditd_orig_map_has(const ditd_orig_map *m, const char *name)
{
    char s[256];
    snprintf(s, sizeof s, "%s%s", m->pre, name);
    return ditd_weights_has_raw(m->w, s);
}

/* The file's tensor `name` marked read (a linear scan per mapping: a
 * model's few thousand names, once at load). */
static void mark(ditd_orig_map *m, const char *name)
{
    size_t n = n_raw(m->w);
    for (size_t i = 0; i < n; i++)
        if (strcmp(raw_name(m->w, i), name) == 0) {
            m->used[i] = 1;
            return;
        }
}

void ditd_orig_map_seg(ditd_orig_map *m, const char *dst, int nseg, const ditd_weight_seg *segs)
{
    if (m->err)
        return;
    char src[2][256];
    ditd_weight_seg g[2];
    if (nseg < 1 || nseg > 2) {
        m->err = ditd_err_set(DITD_EINVAL, "%s: %d segments (1..2)", dst, nseg);
        return;
    }
    for (int s = 0; s < nseg; s++) {
        snprintf(src[s], sizeof src[s], "%s%s", m->pre, segs[s].src);
        g[s] = (ditd_weight_seg){src[s], segs[s].r0, segs[s].rows};
        if (!ditd_weights_has_raw(m->w, src[s])) {
            m->err = ditd_err_set(DITD_EFORMAT,
                                  "%s: tensor '%s' (for '%s') not found: the file is in the "
                                  "original names, and this one is missing",
                                  ditd_weights_path(m->w), src[s], dst);
            return;
        }
    }
    /* the same name, whole: the file's own tensor reads as it is */
    int same = nseg == 1 && g[0].r0 == 0 && g[0].rows < 0 && strcmp(src[0], dst) == 0;
    if (!same && (m->err = ditd_weights_alias(m->w, dst, nseg, g)))
        return;
    for (int s = 0; s < nseg; s++)
        mark(m, src[s]);
    if (m->n == m->cap) {
        int cap = m->cap ? 2 * m->cap : 256;
        ditd_orig_pair *p = realloc(m->p, (size_t)cap * sizeof *p);
        if (!p) {
            m->err = ditd_err_set(DITD_ENOMEM, "out of memory");
            return;
        }
        m->p = p;
        m->cap = cap;
    }
    ditd_orig_pair *p = &m->p[m->n++];
    snprintf(p->dst, sizeof p->dst, "%s", dst);
    snprintf(p->src, sizeof p->src, "%s", src[0]);
}

void ditd_orig_map_one(ditd_orig_map *m, const char *dst, const char *src)
{
    ditd_weight_seg g = {src, 0, -1};
    ditd_orig_map_seg(m, dst, 1, &g);
}

void ditd_orig_map_lin(ditd_orig_map *m, const char *dst, const char *src, int64_t r0,
                       int64_t rows)
{
    char d[200], s[200];
    snprintf(d, sizeof d, "%s.weight", dst);
    snprintf(s, sizeof s, "%s.weight", src);
    ditd_orig_map_seg(m, d, 1, &(ditd_weight_seg){s, r0, rows});
    snprintf(d, sizeof d, "%s.bias", dst);
    snprintf(s, sizeof s, "%s.bias", src);
    ditd_orig_map_seg(m, d, 1, &(ditd_weight_seg){s, r0, rows});
}

/* Whether the weight list reads tensor `name`. */
static int list_reads(const ditd_wl *l, const char *name)
{
    char s[200];
    for (int i = 0; i < l->n; i++) {
        const ditd_wl_entry *e = &l->e[i];
        if (e->flags & DITD_WL_VEC) {
            if (strcmp(e->name[0], name) == 0)
                return 1;
            continue;
        }
        for (int j = 0; j < e->nparts; j++) {
            snprintf(s, sizeof s, "%s.weight", e->name[j]);
            if (strcmp(s, name) == 0)
                return 1;
            snprintf(s, sizeof s, "%s.bias", e->name[j]);
            if (e->b && strcmp(s, name) == 0)
                return 1;
        }
    }
    return 0;
}

int ditd_orig_map_check(const ditd_orig_map *m, const ditd_wl *l, const char *const *also,
                        const char *cls)
{
    if (m->err)
        return m->err;
    if (l->err)
        return l->err;
    size_t n = n_raw(m->w);
    size_t ns = strlen(m->scope);
    for (size_t i = 0; i < n; i++)
        if (!m->used[i] && strncmp(raw_name(m->w, i), m->scope, ns) == 0)
            return ditd_err_set(DITD_EFORMAT,
                                "%s: tensor '%s' is not a parameter of %s in its original names "
                                "(Diffusers' single-file conversion maps no such name)",
                                ditd_weights_path(m->w), raw_name(m->w, i), cls);
    for (int i = 0; i < m->n; i++) {
        int ok = list_reads(l, m->p[i].dst);
        for (int k = 0; !ok && also && also[k]; k++)
            ok = strcmp(also[k], m->p[i].dst) == 0;
        if (!ok)
            return ditd_err_set(DITD_EFORMAT,
                                "%s: tensor '%s' (read as '%s') is not a parameter of this %s "
                                "(its config.json has no such layer)",
                                ditd_weights_path(m->w), m->p[i].src, m->p[i].dst, cls);
    }
    return 0;
}
