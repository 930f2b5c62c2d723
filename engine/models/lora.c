/* LoRA adapters (engine/models/lora.h): the safetensors adapter loader,
 * the upload to a model's device and the per-row application. */
#include "engine/models/lora.h"

#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/error.h"
#include "engine/io/safetensors.h"
#include "engine/models/lora_convert.h"

const char *ditd_lora_format_name(ditd_lora_format f)
{
    switch (f) {
    case DITD_LORA_FORMAT_PEFT: return "peft";
    case DITD_LORA_FORMAT_KOHYA: return "kohya";
    case DITD_LORA_FORMAT_KOHYA_BFL: return "kohya-bfl";
    case DITD_LORA_FORMAT_BFL: return "bfl";
    case DITD_LORA_FORMAT_XLABS: return "xlabs";
    }
    return "unknown";
}

int ditd_lora_format_from_str(const char *s, ditd_lora_format *out)
{
    static const ditd_lora_format all[] = {DITD_LORA_FORMAT_PEFT, DITD_LORA_FORMAT_KOHYA,
                                           DITD_LORA_FORMAT_KOHYA_BFL, DITD_LORA_FORMAT_BFL,
                                           DITD_LORA_FORMAT_XLABS};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (!strcmp(s, ditd_lora_format_name(all[i]))) {
            *out = all[i];
            return 0;
        }
    return ditd_err_set(DITD_EINVAL,
                        "unknown LoRA format \"%s\" (peft, kohya, kohya-bfl, bfl, xlabs)", s);
}

/* ---- parsing the names ---- */

enum { PART_A, PART_B, PART_ALPHA };

/* One module of the file while it is read: its tensors by part. */
typedef struct entry {
    char key[160];                 /* the module as the file spells it (no prefix, no suffix) */
    const ditd_st_tensor *part[3]; /* A, B, alpha */
    int target;
} entry;

typedef struct suffix {
    const char *s;
    int part;
    int kohya; /* the spelling kohya files use */
} suffix;

static const suffix suffixes[] = {
    {".lora_A.weight", PART_A, 0},    {".lora_B.weight", PART_B, 0},
    {".lora_down.weight", PART_A, 1}, {".lora_up.weight", PART_B, 1},
    {".alpha", PART_ALPHA, 1},
};

static int ends_with(const char *s, size_t n, const char *suf, size_t *cut)
{
    size_t k = strlen(suf);
    if (n <= k || memcmp(s + n - k, suf, k))
        return 0;
    *cut = n - k;
    return 1;
}

static int starts_with(const char *s, const char *pre)
{
    return !strncmp(s, pre, strlen(pre));
}

int ditd_lora_is_text_encoder_tensor(const char *name)
{
    return starts_with(name, "lora_te") || starts_with(name, "text_encoder");
}

/* Splits a tensor name into (format, module key, part); the detail names
 * the tensor when it is not an adapter tensor this loader reads. 1: a
 * text-encoder tensor the caller leaves to engine/text (skip_te). */
static int split_name(const char *name, const char *what, int skip_te, ditd_lora_format *fmt,
                      char *key, size_t cap, int *part)
{
    const char *rest = name;
    if (starts_with(name, "lora_unet_")) {
        *fmt = DITD_LORA_FORMAT_KOHYA;
        rest = name + strlen("lora_unet_");
    } else if (ditd_lora_is_text_encoder_tensor(name)) {
        if (skip_te)
            return 1;
        return ditd_err_set(DITD_EUNSUPPORTED,
                            "tensor '%s' in %s: a text-encoder LoRA, and this model has no text "
                            "encoder to apply it to (docs/lora.md)",
                            name, what);
    } else {
        *fmt = DITD_LORA_FORMAT_PEFT;
        if (starts_with(name, "transformer."))
            rest = name + strlen("transformer.");
        else if (starts_with(name, "base_model.model."))
            rest = name + strlen("base_model.model.");
    }
    size_t n = strlen(rest), cut = 0;
    for (size_t i = 0; i < sizeof suffixes / sizeof suffixes[0]; i++) {
        const suffix *s = &suffixes[i];
        if (!ends_with(rest, n, s->s, &cut))
            continue;
        if (*fmt == DITD_LORA_FORMAT_KOHYA && !s->kohya)
            break;
        if (cut >= cap)
            return ditd_err_set(DITD_EFORMAT, "tensor '%s' in %s: module name too long", name,
                                what);
        memcpy(key, rest, cut);
        key[cut] = '\0';
        *part = s->part;
        return 0;
    }
    return ditd_err_set(DITD_EFORMAT,
                        "tensor '%s' in %s: not a LoRA tensor ditd reads (expected "
                        "[transformer.]<module>.lora_A.weight / .lora_B.weight / "
                        ".lora_down.weight / .lora_up.weight / .alpha, or kohya's "
                        "lora_unet_<module>.lora_down.weight / .lora_up.weight / .alpha)",
                        name, what);
}

/* kohya's spelling of a Diffusers module name: every '.' an '_'. */
static void kohya_name(const char *name, char *out, size_t cap)
{
    size_t i = 0;
    for (; name[i] && i + 1 < cap; i++)
        out[i] = name[i] == '.' ? '_' : name[i];
    out[i] = '\0';
}

static int find_target(const char *key, ditd_lora_format fmt, const ditd_lora_target *t, int nt,
                       char (*kohya)[sizeof t->name])
{
    for (int i = 0; i < nt; i++)
        if (!strcmp(key, fmt == DITD_LORA_FORMAT_KOHYA ? kohya[i] : t[i].name))
            return i;
    return -1;
}

static int readable(const ditd_st_tensor *t, const char *what)
{
    switch (t->dtype) {
    case DITD_ST_F32: case DITD_ST_F16: case DITD_ST_BF16: case DITD_ST_F64:
        return 0;
    default:
        return ditd_err_set(DITD_EUNSUPPORTED,
                            "tensor '%s' in %s: dtype %s (LoRA tensors are read from F32, F16, "
                            "BF16 or F64)",
                            t->name, what, ditd_st_dtype_name(t->dtype));
    }
}

static int all_finite(const float *v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!isfinite(v[i]))
            return 0;
    return 1;
}

static void shape_str(const ditd_st_tensor *t, char *buf, size_t cap)
{
    size_t o = (size_t)snprintf(buf, cap, "(");
    for (int i = 0; i < t->ndim && o < cap; i++)
        o += (size_t)snprintf(buf + o, cap - o, i ? ", %lld" : "%lld", (long long)t->shape[i]);
    if (o < cap)
        snprintf(buf + o, cap - o, ")");
}

static int cmp_mod(const void *a, const void *b)
{
    const ditd_lora_module *x = a, *y = b;
    return (x->target > y->target) - (x->target < y->target);
}

int ditd__lora_read_module(const ditd_safetensors *st, const char *key, const ditd_st_tensor *A,
                           const ditd_st_tensor *B, const ditd_st_tensor *al,
                           const ditd_lora_target *tg, const char *what, ditd_lora_module *m)
{
    int err;
    if (!A || !B)
        return ditd_err_set(DITD_EFORMAT, "%s: module '%s' has %s but no %s", what, key,
                            (A ? A : B ? B : al)->name, !A ? "lora_A / lora_down" : "lora_B / lora_up");
    if ((err = readable(A, what)) || (err = readable(B, what)) || (al && (err = readable(al, what))))
        return err;
    if (A->ndim != 2)
        return ditd_err_set(DITD_ESHAPE, "tensor '%s' in %s: %d dimensions, a linear's LoRA A is "
                                         "(rank, %d)",
                            A->name, what, A->ndim, tg->k_in);
    int64_t r = A->shape[0];
    if (r < 1 || r > DITD_LORA_MAX_RANK)
        return ditd_err_set(DITD_EFORMAT, "tensor '%s' in %s: rank %lld outside 1..%d", A->name,
                            what, (long long)r, DITD_LORA_MAX_RANK);
    if (A->shape[1] != tg->k_in)
        return ditd_err_set(DITD_ESHAPE,
                            "tensor '%s' in %s: shape (%lld, %lld), but module %s takes %d inputs: "
                            "expected (%lld, %d)",
                            A->name, what, (long long)A->shape[0], (long long)A->shape[1],
                            tg->name, tg->k_in, (long long)r, tg->k_in);
    if (B->ndim != 2 || B->shape[0] != tg->n_out || B->shape[1] != r) {
        char sh[96];
        shape_str(B, sh, sizeof sh);
        return ditd_err_set(DITD_ESHAPE,
                            "tensor '%s' in %s: shape %s, but module %s has %d outputs and the "
                            "adapter rank %lld: expected (%d, %lld)",
                            B->name, what, sh, tg->name, tg->n_out, (long long)r, tg->n_out,
                            (long long)r);
    }
    m->rank = (int)r;
    m->n_out = tg->n_out;
    m->k_in = tg->k_in;
    m->scale = 1.0f;
    if (al) {
        float alpha;
        if ((err = ditd__lora_read_alpha(st, al, what, &alpha)))
            return err;
        m->scale = alpha / (float)r; /* PEFT's scaling = lora_alpha / r */
    }
    size_t na = (size_t)r * (size_t)tg->k_in, nb = (size_t)tg->n_out * (size_t)r;
    m->a = malloc(na * sizeof(float));
    m->b = malloc(nb * sizeof(float));
    if (!m->a || !m->b)
        return ditd_err_set(DITD_ENOMEM, "%s: module %s", what, tg->name);
    if ((err = ditd_safetensors_read_f32(st, A->name, 2, A->shape, m->a)) ||
        (err = ditd_safetensors_read_f32(st, B->name, 2, B->shape, m->b)))
        return err;
    if (!all_finite(m->a, na))
        return ditd_err_set(DITD_EFORMAT, "tensor '%s' in %s: not finite", A->name, what);
    if (!all_finite(m->b, nb))
        return ditd_err_set(DITD_EFORMAT, "tensor '%s' in %s: not finite", B->name, what);
    return 0;
}

/* The value of PEFT's rank_pattern / alpha_pattern (a JSON object) for
 * module `mod`: the first key that is mod or a '.'-aligned suffix of it, as
 * peft.utils.get_pattern_key matches (its keys are regular expressions: a
 * key with other metacharacters than '.' is refused). NULL: none. */
static json_t *pattern_value(json_t *pat, const char *mod, const char *what, int *err)
{
    const char *k;
    json_t *v;
    size_t ml = strlen(mod);
    json_object_foreach(pat, k, v) {
        size_t kl = strlen(k);
        if (strpbrk(k, "[]()*+?^$|\\{}")) {
            *err = ditd_err_set(DITD_EUNSUPPORTED, "%s: lora_adapter_metadata pattern '%.120s' is "
                                "a regular expression ditd does not match", what, k);
            return NULL;
        }
        if (kl <= ml && !strcmp(mod + ml - kl, k) && (kl == ml || mod[ml - kl - 1] == '.'))
            return v;
    }
    return NULL;
}

/* A Diffusers-saved adapter's LoraConfig (safetensors metadata
 * "lora_adapter_metadata": JSON of "transformer.r", ".lora_alpha",
 * ".use_rslora", ".rank_pattern", ".alpha_pattern"), which Diffusers'
 * load_lora_weights builds its PEFT config from instead of the tensors:
 * each module's scale is alpha / r (alpha / sqrt(r) with rsLoRA), r and
 * alpha from the patterns where a key matches, and a module whose rank is
 * not the config's is refused (PEFT could not load it). No such metadata,
 * or none for the transformer: the scales stay as read. */
static int meta_scales(const ditd_safetensors *st, const char *what,
                       const ditd_lora_target *targets, ditd_lora *l)
{
    const char *raw = ditd_safetensors_meta(st, "lora_adapter_metadata");
    json_error_t jerr;
    int err = 0;
    if (!raw)
        return 0;
    json_t *root = json_loads(raw, 0, &jerr);
    if (!json_is_object(root)) {
        json_decref(root);
        return ditd_err_set(DITD_EFORMAT, "%s: lora_adapter_metadata is not a JSON object", what);
    }
    json_t *r = json_object_get(root, "transformer.r");
    json_t *alpha = json_object_get(root, "transformer.lora_alpha");
    json_t *rs = json_object_get(root, "transformer.use_rslora");
    json_t *rp = json_object_get(root, "transformer.rank_pattern");
    json_t *ap = json_object_get(root, "transformer.alpha_pattern");
    if (!r && !alpha)
        goto done; /* another component's config only */
    if (!json_is_integer(r) || !json_is_number(alpha) || (rs && !json_is_boolean(rs)) ||
        (rp && !json_is_object(rp) && !json_is_null(rp)) ||
        (ap && !json_is_object(ap) && !json_is_null(ap))) {
        err = ditd_err_set(DITD_EFORMAT, "%s: lora_adapter_metadata: transformer.r, "
                           "transformer.lora_alpha (numbers) and the patterns (objects) expected",
                           what);
        goto done;
    }
    for (int i = 0; i < l->n_mod && !err; i++) {
        ditd_lora_module *m = &l->mod[i];
        const char *mod = targets[m->target].name;
        json_t *rv = json_is_object(rp) ? pattern_value(rp, mod, what, &err) : NULL;
        json_t *av = !err && json_is_object(ap) ? pattern_value(ap, mod, what, &err) : NULL;
        if (err)
            break;
        json_int_t rank = json_integer_value(rv && json_is_integer(rv) ? rv : r);
        double a = json_number_value(av && json_is_number(av) ? av : alpha);
        if (rank != m->rank) {
            err = ditd_err_set(DITD_ESHAPE, "%s: module %s has rank %d, its "
                               "lora_adapter_metadata says r = %lld", what, mod, m->rank,
                               (long long)rank);
            break;
        }
        if (!isfinite(a)) {
            err = ditd_err_set(DITD_EFORMAT, "%s: lora_adapter_metadata alpha of %s is not "
                               "finite", what, mod);
            break;
        }
        m->scale = (float)(json_is_true(rs) ? a / sqrt((double)rank) : a / (double)rank);
    }
done:
    json_decref(root);
    return err;
}

static int from_st(const ditd_safetensors *st, const char *what, const char *name,
                   const ditd_lora_target *targets, int nt, int skip_te, ditd_lora **out)
{
    size_t n = ditd_safetensors_count(st);
    entry *ents = NULL;
    char (*kohya)[sizeof targets->name] = NULL;
    ditd_lora *l = NULL;
    int ne = 0, err = 0, seen = 0;
    ditd_lora_format fmt0 = DITD_LORA_FORMAT_PEFT;

    if (nt <= 0)
        return ditd_err_set(DITD_EUNSUPPORTED, "%s: this model takes no LoRA adapters", what);
    if (n == 0)
        return ditd_err_set(DITD_EFORMAT, "%s: no tensors, not a LoRA adapter", what);
    if (!(ents = calloc(n, sizeof *ents)) || !(kohya = malloc((size_t)nt * sizeof *kohya)) ||
        !(l = calloc(1, sizeof *l))) {
        err = ditd_err_set(DITD_ENOMEM, "%s", what);
        goto done;
    }
    for (int i = 0; i < nt; i++)
        kohya_name(targets[i].name, kohya[i], sizeof kohya[i]);
    if ((fmt0 = ditd_lora_convert_detect(st, targets, nt)) != DITD_LORA_FORMAT_PEFT) {
        /* FLUX's community names (lora_convert.h) */
        if (!(l->name = strdup(name))) {
            err = ditd_err_set(DITD_ENOMEM, "%s", what);
            goto done;
        }
        if ((err = ditd_lora_convert_read(st, what, fmt0, targets, nt, skip_te, l)))
            goto done;
        goto read;
    }

    for (size_t i = 0; i < n; i++) {
        const ditd_st_tensor *t = ditd_safetensors_at(st, i);
        ditd_lora_format fmt = DITD_LORA_FORMAT_PEFT;
        char key[sizeof ents->key];
        int part = PART_A;
        if ((err = split_name(t->name, what, skip_te, &fmt, key, sizeof key, &part)) > 0) {
            err = 0; /* the text encoders' part (engine/text/text_lora.h) */
            if (!seen) /* a file of only those: their format */
                fmt0 = starts_with(t->name, "lora_te") ? DITD_LORA_FORMAT_KOHYA
                                                       : DITD_LORA_FORMAT_PEFT;
            continue;
        }
        if (err)
            goto done;
        if (!seen++)
            fmt0 = fmt;
        else if (fmt != fmt0) {
            err = ditd_err_set(DITD_EFORMAT, "tensor '%s' in %s: %s names in a %s file", t->name,
                               what, ditd_lora_format_name(fmt), ditd_lora_format_name(fmt0));
            goto done;
        }
        int tg = find_target(key, fmt, targets, nt, kohya);
        if (tg < 0) {
            err = ditd_err_set(DITD_ENOENT,
                               "tensor '%s' in %s: the model has no linear module '%s'%s", t->name,
                               what, key,
                               fmt == DITD_LORA_FORMAT_KOHYA ? " (kohya name, '_' for '.')" : "");
            goto done;
        }
        int j = ne - 1;
        while (j >= 0 && ents[j].target != tg)
            j--;
        if (j < 0) {
            j = ne++;
            snprintf(ents[j].key, sizeof ents[j].key, "%s", key);
            ents[j].target = tg;
        }
        if (ents[j].part[part]) {
            err = ditd_err_set(DITD_EFORMAT, "tensor '%s' in %s: module %s already has '%s'",
                               t->name, what, targets[tg].name, ents[j].part[part]->name);
            goto done;
        }
        ents[j].part[part] = t;
    }

    if (!(l->mod = calloc(ne ? (size_t)ne : 1, sizeof *l->mod)) || !(l->name = strdup(name))) {
        err = ditd_err_set(DITD_ENOMEM, "%s", what);
        goto done;
    }
    l->format = fmt0;
    for (int j = 0; j < ne; j++) {
        ditd_lora_module *m = &l->mod[l->n_mod++];
        m->target = ents[j].target;
        if ((err = ditd__lora_read_module(st, ents[j].key, ents[j].part[PART_A],
                                          ents[j].part[PART_B], ents[j].part[PART_ALPHA],
                                          &targets[ents[j].target], what, m)))
            goto done;
        if (m->rank > l->max_rank)
            l->max_rank = m->rank;
    }
    if ((err = meta_scales(st, what, targets, l)))
        goto done;
read:
    if ((err = ditd__lora_relay_rows(l, targets, what)))
        goto done;
    qsort(l->mod, (size_t)l->n_mod, sizeof *l->mod, cmp_mod);
    *out = l;
    l = NULL;
done:
    ditd_lora_free(l);
    free(kohya);
    free(ents);
    return err;
}

int ditd_lora_open_mem(const void *buf, size_t len, const char *what, const char *name,
                       const ditd_lora_target *targets, int n_targets, ditd_lora **out)
{
    ditd_safetensors *st;
    int err = ditd_safetensors_open_mem(buf, len, what, &st);
    if (err)
        return err;
    err = from_st(st, what, name, targets, n_targets, 0, out);
    ditd_safetensors_free(st);
    return err;
}

static int open_file(const char *path, const char *name, const ditd_lora_target *targets,
                     int n_targets, int skip_te, ditd_lora **out)
{
    ditd_safetensors *st;
    int err = ditd_safetensors_open(path, &st);
    if (err)
        return err;
    err = from_st(st, path, name, targets, n_targets, skip_te, out);
    ditd_safetensors_free(st);
    return err;
}

int ditd_lora_open(const char *path, const char *name, const ditd_lora_target *targets,
                   int n_targets, ditd_lora **out)
{
    return open_file(path, name, targets, n_targets, 0, out);
}

int ditd_lora_open_transformer(const char *path, const char *name,
                               const ditd_lora_target *targets, int n_targets, ditd_lora **out)
{
    return open_file(path, name, targets, n_targets, 1, out);
}

void ditd_lora_free(ditd_lora *l)
{
    if (!l)
        return;
    for (int i = 0; i < l->n_mod; i++) {
        free(l->mod[i].a);
        free(l->mod[i].b);
    }
    free(l->mod);
    free(l->name);
    free(l);
}

/* ---- on the device ---- */

#define ALIGN 256

static size_t up(size_t n)
{
    return (n + ALIGN - 1) / ALIGN * ALIGN;
}

void ditd_lora_target_slice(ditd_lora_target *t, ditd_lora_shard shard, int n_rng,
                            const int *off, const int *len)
{
    t->shard = shard;
    t->n_rng = shard == DITD_LORA_WHOLE ? 0 : n_rng;
    for (int i = 0; i < t->n_rng && i < 2; i++) {
        t->off[i] = off[i];
        t->len[i] = len[i];
    }
}

/* The (rows, cols) of module m's A and B on this rank: its target's slice. */
static void dev_shape(const ditd_lora_module *m, const ditd_lora_target *t, size_t *k_loc,
                      size_t *n_loc)
{
    *k_loc = (size_t)m->k_in;
    *n_loc = (size_t)m->n_out;
    if (t->shard == DITD_LORA_OUT_SLICE)
        *n_loc = (size_t)t->len[0];
    if (t->shard == DITD_LORA_IN_SLICE) {
        *k_loc = 0;
        for (int r = 0; r < t->n_rng; r++)
            *k_loc += (size_t)t->len[r];
    }
}

/* Whether t's slice lies inside its weight. */
static int slice_ok(const ditd_lora_target *t)
{
    int whole = t->shard == DITD_LORA_OUT_SLICE ? t->n_out : t->k_in;
    if (t->shard == DITD_LORA_WHOLE)
        return 1;
    if (t->n_rng < 1 || t->n_rng > (t->shard == DITD_LORA_OUT_SLICE ? 1 : 2))
        return 0;
    for (int r = 0; r < t->n_rng; r++)
        if (t->off[r] < 0 || t->len[r] < 0 || t->off[r] > whole - t->len[r])
            return 0;
    return 1;
}

/* Module m's A and B cut to its target's slice into a (rank, k_loc) and b
 * (n_loc, rank), host f32: A's columns of the ranges in order (row-
 * parallel), B's rows of the range (column-parallel). */
static void dev_slice(const ditd_lora_module *m, const ditd_lora_target *t, float *a, float *b)
{
    size_t k = (size_t)m->k_in, r = (size_t)m->rank;
    if (t->shard != DITD_LORA_IN_SLICE) {
        memcpy(a, m->a, r * k * sizeof *a);
    } else {
        size_t o = 0;
        for (size_t i = 0; i < r; i++)
            for (int g = 0; g < t->n_rng; g++) {
                memcpy(a + o, m->a + i * k + (size_t)t->off[g], (size_t)t->len[g] * sizeof *a);
                o += (size_t)t->len[g];
            }
    }
    if (t->shard != DITD_LORA_OUT_SLICE)
        memcpy(b, m->b, (size_t)m->n_out * r * sizeof *b);
    else
        memcpy(b, m->b + (size_t)t->off[0] * r, (size_t)t->len[0] * r * sizeof *b);
}

int ditd_lora_dev_new(const ditd_lora *l, const ditd_backend_ops *ops,
                      const ditd_lora_target *targets, int n_targets, ditd_lora_dev **out)
{
    size_t es = ditd_dtype_size(ops->act_dtype), bytes = 0, stage = 0;
    ditd_lora_dev *d;
    float *ha = NULL, *hb = NULL;
    int err;
    if (!ops->lora)
        return ditd_err_set(DITD_EUNSUPPORTED, "LoRA adapter %s: the %s backend has no LoRA op",
                            l->name, ops->name);
    for (int i = 0; i < l->n_mod; i++) {
        const ditd_lora_module *m = &l->mod[i];
        if (m->target < 0 || m->target >= n_targets || !slice_ok(&targets[m->target]) ||
            targets[m->target].n_out != m->n_out || targets[m->target].k_in != m->k_in)
            return ditd_err_set(DITD_EINVAL, "LoRA adapter %s: opened for another model",
                                l->name);
        size_t k_loc, n_loc;
        dev_shape(m, &targets[m->target], &k_loc, &n_loc);
        bytes += up((size_t)m->rank * k_loc * es) + up(n_loc * (size_t)m->rank * es);
        size_t st = (size_t)m->rank * ((size_t)m->k_in > (size_t)m->n_out ? (size_t)m->k_in
                                                                          : (size_t)m->n_out);
        stage = st > stage ? st : stage;
    }
    if (!(d = calloc(1, sizeof *d)) || !(d->t = calloc((size_t)n_targets, sizeof *d->t)) ||
        !(d->name = strdup(l->name)) || !(ha = malloc((stage ? stage : 1) * sizeof *ha)) ||
        !(hb = malloc((stage ? stage : 1) * sizeof *hb))) {
        err = ditd_err_set(DITD_ENOMEM, "LoRA adapter %s", l->name);
        goto fail;
    }
    d->ops = ops;
    d->n_targets = n_targets;
    d->max_rank = l->max_rank;
    d->bytes = bytes;
    if (ops->mem_alloc) {
        if ((err = ops->mem_alloc(&d->mem, bytes)))
            goto fail;
    } else if (!(d->mem = aligned_alloc(ALIGN, bytes ? bytes : ALIGN))) {
        err = ditd_err_set(DITD_ENOMEM, "LoRA adapter %s: %zu bytes", l->name, bytes);
        goto fail;
    }
    size_t off = 0;
    for (int i = 0; i < l->n_mod; i++) {
        const ditd_lora_module *m = &l->mod[i];
        const ditd_lora_target *tg = &targets[m->target];
        ditd_lora_dev_mod *t = &d->t[m->target];
        size_t k_loc, n_loc;
        dev_shape(m, tg, &k_loc, &n_loc);
        size_t na = (size_t)m->rank * k_loc, nb = n_loc * (size_t)m->rank;
        void *a = (uint8_t *)d->mem + off;
        off += up(na * es);
        void *b = (uint8_t *)d->mem + off;
        off += up(nb * es);
        dev_slice(m, tg, ha, hb);
        ops->upload(a, ha, na);
        ops->upload(b, hb, nb); /* returns once ha, hb are read: they are reused */
        t->a = a;
        t->b = b;
        t->rank = m->rank;
        t->scale = m->scale;
    }
    if (ops->status && (err = ops->status()))
        goto fail;
    free(ha);
    free(hb);
    *out = d;
    return 0;
fail:
    free(ha);
    free(hb);
    ditd_lora_dev_free(d);
    return err;
}

void ditd_lora_dev_free(ditd_lora_dev *d)
{
    if (!d)
        return;
    if (d->mem) {
        if (d->ops->mem_free)
            d->ops->mem_free(d->mem, d->bytes);
        else
            free(d->mem);
    }
    free(d->t);
    free(d->name);
    free(d);
}

/* ---- applying ---- */

static int set_touches(const ditd_lora_set *s, int t)
{
    if (!s)
        return 0;
    for (int i = 0; i < s->n; i++)
        if (s->ad[i]->t[t].rank > 0 && s->weight[i] != 0.0f)
            return 1;
    return 0;
}

int ditd_lora_touches(const ditd_lora_set *const *sets, int B, int t)
{
    if (!sets)
        return 0;
    for (int b = 0; b < B; b++)
        if (set_touches(sets[b], t))
            return 1;
    return 0;
}

size_t ditd_lora_tmp_floats(size_t rows_max)
{
    size_t n = rows_max * 64;
    return n < DITD_LORA_MAX_RANK ? DITD_LORA_MAX_RANK : n;
}

void ditd_lora_apply(const ditd_backend_ops *ops, const ditd_lora_set *const *sets, int B,
                     int rows, int t, const void *x, size_t ldx, void *y, size_t ldy, int N,
                     int K, ditd_act act, float *tmp, size_t tmp_floats)
{
    for (int b0 = 0; b0 < B;) {
        const ditd_lora_set *s = sets ? sets[b0] : NULL;
        int b1 = b0 + 1;
        while (b1 < B && (sets ? sets[b1] : NULL) == s)
            b1++;
        size_t r0 = (size_t)b0 * (size_t)rows, nr = (size_t)(b1 - b0) * (size_t)rows;
        int last = -1;
        for (int i = 0; s && i < s->n; i++)
            if (s->ad[i]->t[t].rank > 0 && s->weight[i] != 0.0f)
                last = i;
        if (last < 0 && act != DITD_ACT_NONE) /* this group's rows: the activation only */
            ops->lora(NULL, 0, NULL, NULL, 0.0f, ditd_ptr_act(ops, y, r0 * ldy), ldy, (int)nr, N,
                      K, 0, NULL, act);
        for (int i = 0; i <= last; i++) {
            const ditd_lora_dev_mod *m = &s->ad[i]->t[t];
            if (m->rank == 0 || s->weight[i] == 0.0f)
                continue;
            size_t chunk = tmp_floats / (size_t)m->rank;
            for (size_t c = 0; c < nr; c += chunk) {
                size_t mr = nr - c < chunk ? nr - c : chunk;
                ops->lora(ditd_ptr_act(ops, x, (r0 + c) * ldx), ldx, m->a, m->b,
                          s->weight[i] * m->scale, ditd_ptr_act(ops, y, (r0 + c) * ldy), ldy,
                          (int)mr, N, K, m->rank, tmp, i == last ? act : DITD_ACT_NONE);
            }
        }
        b0 = b1;
    }
}
