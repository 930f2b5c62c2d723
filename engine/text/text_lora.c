/* The text-encoder part of LoRA adapter files and the adapted linear
 * (engine/text/text_lora.h). */
#include "engine/text/text_lora.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/error.h"
#include "engine/io/safetensors.h"

enum { PART_A, PART_B, PART_ALPHA };

static const struct {
    const char *s;
    int part, kohya;
} suffixes[] = {
    {".lora_A.weight", PART_A, 0},    {".lora_B.weight", PART_B, 0},
    {".lora_down.weight", PART_A, 1}, {".lora_up.weight", PART_B, 1},
    {".alpha", PART_ALPHA, 1},
};

/* One module of one encoder while the file is read. */
typedef struct entry {
    int p, t;                        /* part, target */
    const ditd_st_tensor *part[3];   /* A, B, alpha */
    char key[160];
} entry;

static atomic_uint_fast64_t next_id = 1;

static int starts(const char *s, const char *pre)
{
    return pre && !strncmp(s, pre, strlen(pre));
}

/* kohya's spelling of a module name: '.' as '_'. */
static void kohya_name(const char *s, char *out, size_t cap)
{
    size_t i = 0;
    for (; s[i] && i + 1 < cap; i++)
        out[i] = s[i] == '.' ? '_' : s[i];
    out[i] = '\0';
}

static void list_parts(const ditd_text_lora_part *parts, int np, char *buf, size_t cap)
{
    size_t o = 0;
    buf[0] = '\0';
    for (int p = 0; p < np && o < cap; p++)
        o += (size_t)snprintf(buf + o, cap - o, "%s%s (%s)", p ? ", " : "", parts[p].component,
                              parts[p].kind);
    if (np == 0)
        snprintf(buf, cap, "none");
}

/* The part, module key and suffix of text-encoder tensor `name`; *kohya
 * set for kohya names. 0 or an error naming the tensor. */
static int split(const char *name, const char *what, const ditd_text_lora_part *parts, int np,
                 int *p_out, int *kohya, char *key, size_t cap, int *part)
{
    const char *rest = NULL;
    int p = -1;
    *kohya = starts(name, "lora_te");
    for (int i = 0; i < np && p < 0; i++) {
        if (*kohya) {
            for (int k = 0; k < 2 && p < 0; k++)
                if (starts(name, parts[i].kohya[k])) {
                    p = i;
                    rest = name + strlen(parts[i].kohya[k]);
                }
        } else {
            size_t n = strlen(parts[i].component);
            if (!strncmp(name, parts[i].component, n) && name[n] == '.') {
                p = i;
                rest = name + n + 1;
            }
        }
    }
    if (p < 0) {
        char have[256];
        list_parts(parts, np, have, sizeof have);
        if (*kohya)
            return ditd_err_set(DITD_ENOENT,
                                "tensor '%s' in %s: a kohya text-encoder name ditd does not map "
                                "to this model's text encoders (%s; lora_te1_ / lora_te_: the "
                                "first CLIP, lora_te2_: a second CLIP; kohya names for a T5 are "
                                "not read, as Diffusers' FLUX loader drops them: use PEFT names "
                                "<component>.<module>)",
                                name, what, have);
        return ditd_err_set(DITD_ENOENT,
                            "tensor '%s' in %s: names a text encoder this model does not have "
                            "(its text encoders: %s)",
                            name, what, have);
    }
    if (parts[p].refusal)
        return ditd_err_set(DITD_EUNSUPPORTED, "tensor '%s' in %s: %s: %s", name, what,
                            parts[p].component, parts[p].refusal);
    size_t n = strlen(rest), k;
    for (size_t i = 0; i < sizeof suffixes / sizeof suffixes[0]; i++) {
        k = strlen(suffixes[i].s);
        if (n <= k || strcmp(rest + n - k, suffixes[i].s))
            continue;
        if (*kohya && !suffixes[i].kohya)
            break;
        if (n - k >= cap)
            return ditd_err_set(DITD_EFORMAT, "tensor '%s' in %s: module name too long", name,
                                what);
        memcpy(key, rest, n - k);
        key[n - k] = '\0';
        *part = suffixes[i].part;
        *p_out = p;
        return 0;
    }
    return ditd_err_set(DITD_EFORMAT,
                        "tensor '%s' in %s: not a LoRA tensor ditd reads (expected "
                        "<component>.<module>.lora_A.weight / .lora_B.weight / .lora_down.weight "
                        "/ .lora_up.weight / .alpha, or kohya's lora_te1_<module>.lora_down."
                        "weight / .lora_up.weight / .alpha)",
                        name, what);
}

/* The target of `key` in part pp, or -1: the name as given or without
 * pp's optional prefix; kohya names compared with '_' for '.'. */
static int find_target(const ditd_text_lora_part *pp, const char *key, int kohya)
{
    char kp[64], want[sizeof ((ditd_lora_target *)0)->name];
    if (pp->optional_prefix) {
        if (kohya) {
            kohya_name(pp->optional_prefix, kp, sizeof kp);
            if (starts(key, kp))
                key += strlen(kp);
        } else if (starts(key, pp->optional_prefix)) {
            key += strlen(pp->optional_prefix);
        }
    }
    for (int t = 0; t < pp->n_targets; t++) {
        const char *nm = pp->targets[t].name;
        if (kohya) {
            kohya_name(nm, want, sizeof want);
            nm = want;
        }
        if (!strcmp(key, nm))
            return t;
    }
    return -1;
}

static int cmp_mod(const void *a, const void *b)
{
    const ditd_lora_module *x = a, *y = b;
    return (x->target > y->target) - (x->target < y->target);
}

/* Reads and uploads the modules of part p (ents of that part). */
static int load_part(const ditd_safetensors *st, const char *what, const char *name,
                     const ditd_text_lora_part *pp, const entry *ents, int ne, int p,
                     ditd_text_lora *tl)
{
    ditd_lora l = {.name = (char *)name, .format = tl->format};
    int n = 0, err = 0;
    for (int j = 0; j < ne; j++)
        n += ents[j].p == p;
    if (n == 0)
        return 0;
    if (!(l.mod = calloc((size_t)n, sizeof *l.mod)))
        return ditd_err_set(DITD_ENOMEM, "%s", what);
    for (int j = 0; j < ne; j++) {
        if (ents[j].p != p)
            continue;
        ditd_lora_module *m = &l.mod[l.n_mod++];
        m->target = ents[j].t;
        if ((err = ditd__lora_read_module(st, ents[j].key, ents[j].part[PART_A],
                                          ents[j].part[PART_B], ents[j].part[PART_ALPHA],
                                          &pp->targets[ents[j].t], what, m)))
            goto done;
        if (m->rank > l.max_rank)
            l.max_rank = m->rank;
    }
    qsort(l.mod, (size_t)l.n_mod, sizeof *l.mod, cmp_mod);
    if ((err = ditd_lora_dev_new(&l, pp->ops, pp->targets, pp->n_targets, &tl->dev[p]))) {
        char why[512];
        snprintf(why, sizeof why, "%s", ditd_err_detail());
        err = ditd_err_set(err, "%s: %s: %s", what, pp->component, why);
        goto done;
    }
    tl->n_mod[p] = l.n_mod;
    tl->bytes += tl->dev[p]->bytes;
    if (l.max_rank > tl->max_rank)
        tl->max_rank = l.max_rank;
done:
    for (int i = 0; i < l.n_mod; i++) {
        free(l.mod[i].a);
        free(l.mod[i].b);
    }
    free(l.mod);
    return err;
}

static int from_st(const ditd_safetensors *st, const char *what, const char *name,
                   const ditd_text_lora_part *parts, int np, ditd_text_lora **out)
{
    size_t n = ditd_safetensors_count(st);
    entry *ents = NULL;
    ditd_text_lora *tl = NULL;
    int ne = 0, err = 0, seen = 0, kohya0 = 0;

    if (np < 0 || np > DITD_TEXT_LORA_MAX_PARTS)
        return ditd_err_set(DITD_EINVAL, "%s: %d text encoders", what, np);
    if (!(ents = calloc(n ? n : 1, sizeof *ents)) || !(tl = calloc(1, sizeof *tl)) ||
        !(tl->name = strdup(name))) {
        err = ditd_err_set(DITD_ENOMEM, "%s", what);
        goto done;
    }
    tl->n_parts = np;
    for (size_t i = 0; i < n; i++) {
        const ditd_st_tensor *t = ditd_safetensors_at(st, i);
        char key[sizeof ents->key];
        int p = 0, kohya = 0, part = PART_A;
        if (!ditd_lora_is_text_encoder_tensor(t->name))
            continue; /* the transformer's part: ditd_lora_open_transformer */
        if ((err = split(t->name, what, parts, np, &p, &kohya, key, sizeof key, &part)))
            goto done;
        if (!seen++)
            kohya0 = kohya;
        else if (kohya != kohya0) {
            err = ditd_err_set(DITD_EFORMAT, "tensor '%s' in %s: %s names in a %s file", t->name,
                               what, kohya ? "kohya" : "peft", kohya0 ? "kohya" : "peft");
            goto done;
        }
        int tg = find_target(&parts[p], key, kohya);
        if (tg < 0) {
            err = ditd_err_set(DITD_ENOENT,
                               "tensor '%s' in %s: %s (%s) has no linear module '%s'%s", t->name,
                               what, parts[p].component, parts[p].kind, key,
                               kohya ? " (kohya name, '_' for '.')" : "");
            goto done;
        }
        int j = ne - 1;
        while (j >= 0 && !(ents[j].p == p && ents[j].t == tg))
            j--;
        if (j < 0) {
            j = ne++;
            ents[j].p = p;
            ents[j].t = tg;
            snprintf(ents[j].key, sizeof ents[j].key, "%s.%s", parts[p].component, key);
        }
        if (ents[j].part[part]) {
            err = ditd_err_set(DITD_EFORMAT, "tensor '%s' in %s: module %s already has '%s'",
                               t->name, what, ents[j].key, ents[j].part[part]->name);
            goto done;
        }
        ents[j].part[part] = t;
    }
    tl->format = kohya0 ? DITD_LORA_FORMAT_KOHYA : DITD_LORA_FORMAT_PEFT;
    for (int p = 0; p < np; p++)
        if ((err = load_part(st, what, name, &parts[p], ents, ne, p, tl)))
            goto done;
    tl->id = atomic_fetch_add(&next_id, 1);
    *out = tl;
    tl = NULL;
done:
    ditd_text_lora_free(tl);
    free(ents);
    return err;
}

int ditd_text_lora_open_mem(const void *buf, size_t len, const char *what, const char *name,
                            const ditd_text_lora_part *parts, int n_parts,
                            ditd_text_lora **out)
{
    ditd_safetensors *st;
    int err = ditd_safetensors_open_mem(buf, len, what, &st);
    if (err)
        return err;
    err = from_st(st, what, name, parts, n_parts, out);
    ditd_safetensors_free(st);
    return err;
}

int ditd_text_lora_open(const char *path, const char *name, const ditd_text_lora_part *parts,
                        int n_parts, ditd_text_lora **out)
{
    ditd_safetensors *st;
    int err = ditd_safetensors_open(path, &st);
    if (err)
        return err;
    err = from_st(st, path, name, parts, n_parts, out);
    ditd_safetensors_free(st);
    return err;
}

void ditd_text_lora_free(ditd_text_lora *t)
{
    if (!t)
        return;
    for (int p = 0; p < DITD_TEXT_LORA_MAX_PARTS; p++)
        ditd_lora_dev_free(t->dev[p]);
    free(t->name);
    free(t);
}

int ditd_text_lora_any(const ditd_text_lora *t)
{
    for (int p = 0; t && p < t->n_parts; p++)
        if (t->dev[p])
            return 1;
    return 0;
}

void ditd_text_lora_linear(const ditd_backend_ops *ops, const ditd_text_lora_run *r, int t,
                           const void *x, size_t ldx, const ditd_text_mat *w, const void *bias,
                           void *y, size_t ldy, int N, int K, ditd_text_act act, void *scratch,
                           size_t scratch_elems)
{
    const int M = r->B * r->rows;
    if (!ditd_lora_touches(r->sets, r->B, t)) { /* the base op, activation fused */
        ditd_text_linear(ops, x, ldx, w, bias, y, ldy, M, N, K, act, scratch, scratch_elems);
        return;
    }
    // y = x W^T + b; y += each sequence's terms; then the activation (PEFT
    // wraps the nn.Linear, not the activation after it)
    ditd_text_linear(ops, x, ldx, w, bias, y, ldy, M, N, K, DITD_TEXT_ACT_NONE, scratch,
                     scratch_elems);
    ditd_lora_apply(ops, r->sets, r->B, r->rows, t, x, ldx, y, ldy, N, K, DITD_ACT_NONE, r->tmp,
                    r->tmp_floats);
    if (act != DITD_TEXT_ACT_NONE)
        ops->act_text(y, ldy, M, N, act);
}

int ditd_text_lora_set_part(const ditd_text_lora_set *s, int p, ditd_lora_set *out)
{
    out->n = 0;
    for (int i = 0; s && i < s->n; i++)
        if (p < s->ad[i]->n_parts && s->ad[i]->dev[p] && s->weight[i] != 0.0f) {
            out->ad[out->n] = s->ad[i]->dev[p];
            out->weight[out->n++] = s->weight[i];
        }
    return out->n;
}
