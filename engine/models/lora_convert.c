/* The community FLUX LoRA formats (engine/models/lora_convert.h): name
 * classification, the BFL / XLabs -> Diffusers module mapping, and the
 * split of fused linears into their Diffusers parts. */
#include "engine/models/lora_convert.h"

#include <ctype.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/error.h"

int ditd__lora_read_alpha(const ditd_safetensors *st, const ditd_st_tensor *al, const char *what,
                          float *alpha)
{
    int64_t one = 1;
    int err;
    if (!(al->ndim == 0 || (al->ndim == 1 && al->shape[0] == 1)))
        return ditd_err_set(DITD_ESHAPE, "tensor '%s' in %s: alpha must be one number", al->name,
                            what);
    if ((err = ditd_safetensors_read_f32(st, al->name, al->ndim, &one, alpha)))
        return err;
    if (!isfinite(*alpha))
        return ditd_err_set(DITD_EFORMAT, "tensor '%s' in %s: alpha is not finite", al->name,
                            what);
    return 0;
}

/* ---- the mapping ---- */

enum { TOP, DBL, SGL };           /* where a BFL module lives */
enum { R_BFL = 1, R_XLABS = 2 };  /* which formats a rule serves */
enum { F_SWAP = 1, F_NO_ALPHA = 2 };

typedef struct rule {
    int fmts, where;
    const char *src;       /* the BFL module, '_' for '.', after the block index */
    int n;                 /* Diffusers parts, each its target's rows of B */
    const char *dst[4];    /* after "transformer_blocks.<i>." etc. */
    int flags;
} rule;

#define QKV "attn.to_q", "attn.to_k", "attn.to_v"
#define ADD_QKV "attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj"

static const rule rules[] = {
    {R_BFL, DBL, "img_attn_qkv", 3, {QKV}, 0},
    {R_BFL, DBL, "img_attn_proj", 1, {"attn.to_out.0"}, 0},
    {R_BFL, DBL, "img_mlp_0", 1, {"ff.net.0.proj"}, 0},
    {R_BFL, DBL, "img_mlp_2", 1, {"ff.net.2"}, 0},
    {R_BFL, DBL, "img_mod_lin", 1, {"norm1.linear"}, 0},
    {R_BFL, DBL, "txt_attn_qkv", 3, {ADD_QKV}, 0},
    {R_BFL, DBL, "txt_attn_proj", 1, {"attn.to_add_out"}, 0},
    {R_BFL, DBL, "txt_mlp_0", 1, {"ff_context.net.0.proj"}, 0},
    {R_BFL, DBL, "txt_mlp_2", 1, {"ff_context.net.2"}, 0},
    {R_BFL, DBL, "txt_mod_lin", 1, {"norm1_context.linear"}, 0},
    {R_BFL, SGL, "linear1", 4, {QKV, "proj_mlp"}, 0},
    {R_BFL, SGL, "linear2", 1, {"proj_out"}, 0},
    {R_BFL, SGL, "modulation_lin", 1, {"norm.linear"}, 0},
    {R_BFL, TOP, "img_in", 1, {"x_embedder"}, 0},
    {R_BFL, TOP, "txt_in", 1, {"context_embedder"}, 0},
    {R_BFL, TOP, "time_in_in_layer", 1, {"time_text_embed.timestep_embedder.linear_1"}, 0},
    {R_BFL, TOP, "time_in_out_layer", 1, {"time_text_embed.timestep_embedder.linear_2"}, 0},
    {R_BFL, TOP, "vector_in_in_layer", 1, {"time_text_embed.text_embedder.linear_1"}, 0},
    {R_BFL, TOP, "vector_in_out_layer", 1, {"time_text_embed.text_embedder.linear_2"}, 0},
    {R_BFL, TOP, "guidance_in_in_layer", 1, {"time_text_embed.guidance_embedder.linear_1"}, 0},
    {R_BFL, TOP, "guidance_in_out_layer", 1, {"time_text_embed.guidance_embedder.linear_2"}, 0},
    /* Diffusers' converter takes these two without their alpha */
    {R_BFL, TOP, "final_layer_adaLN_modulation_1", 1, {"norm_out.linear"}, F_SWAP | F_NO_ALPHA},
    {R_BFL, TOP, "final_layer_linear", 1, {"proj_out"}, F_NO_ALPHA},
    {R_XLABS, DBL, "processor_qkv_lora1", 3, {QKV}, 0},
    {R_XLABS, DBL, "processor_proj_lora1", 1, {"attn.to_out.0"}, 0},
    {R_XLABS, DBL, "processor_qkv_lora2", 3, {ADD_QKV}, 0},
    {R_XLABS, DBL, "processor_proj_lora2", 1, {"attn.to_add_out"}, 0},
    {R_XLABS, SGL, "processor_qkv_lora", 3, {QKV}, 0},
    {R_XLABS, SGL, "processor_proj_lora", 1, {"proj_out"}, 0},
};

/* BFL module names start so (in the '_' spelling) */
static const char *const bfl_heads[] = {"double_blocks_", "single_blocks_", "img_in", "txt_in",
                                        "time_in_", "vector_in_", "guidance_in_",
                                        "final_layer_"};

static int starts_with(const char *s, const char *pre)
{
    return !strncmp(s, pre, strlen(pre));
}

/* s with every '.' written '_' (cap > 0). */
static void underscored(const char *s, size_t n, char *out, size_t cap)
{
    size_t i = 0;
    for (; i < n && s[i] && i + 1 < cap; i++)
        out[i] = s[i] == '.' ? '_' : s[i];
    out[i] = '\0';
}

static int is_bfl_module(const char *s)
{
    char u[64];
    underscored(s, strlen(s), u, sizeof u);
    for (size_t i = 0; i < sizeof bfl_heads / sizeof bfl_heads[0]; i++)
        if (starts_with(u, bfl_heads[i]))
            return 1;
    return 0;
}

static const char *after_prefix(const char *name)
{
    if (starts_with(name, "diffusion_model."))
        return name + strlen("diffusion_model.");
    if (starts_with(name, "base_model.model."))
        return name + strlen("base_model.model.");
    return name;
}

/* The community format a tensor name is in, or DITD_LORA_FORMAT_PEFT for
 * the names lora.c reads (and for names of no format: lora.c refuses them). */
static ditd_lora_format classify(const char *name)
{
    if (starts_with(name, "lora_unet_"))
        return is_bfl_module(name + strlen("lora_unet_")) ? DITD_LORA_FORMAT_KOHYA_BFL
                                                          : DITD_LORA_FORMAT_PEFT;
    const char *rest = after_prefix(name);
    if ((starts_with(rest, "double_blocks.") || starts_with(rest, "single_blocks.")) &&
        strstr(rest, ".processor."))
        return DITD_LORA_FORMAT_XLABS;
    if (is_bfl_module(rest))
        return DITD_LORA_FORMAT_BFL;
    return DITD_LORA_FORMAT_PEFT;
}

ditd_lora_format ditd_lora_convert_detect(const ditd_safetensors *st,
                                          const ditd_lora_target *targets, int nt)
{
    size_t n = ditd_safetensors_count(st);
    int flux = 0;
    for (int i = 0; i < nt && !flux; i++)
        flux = starts_with(targets[i].name, "single_transformer_blocks.");
    if (!flux) /* SD3's original names share final_layer / x_embedder with FLUX's */
        return DITD_LORA_FORMAT_PEFT;
    for (size_t i = 0; i < n; i++) {
        ditd_lora_format f = classify(ditd_safetensors_at(st, i)->name);
        if (f != DITD_LORA_FORMAT_PEFT)
            return f;
    }
    return DITD_LORA_FORMAT_PEFT;
}

/* ---- reading ---- */

enum { PART_A, PART_B, PART_ALPHA };

typedef struct suffix {
    const char *s;
    int part, fmts;
    int down; /* the lora_down spelling (kohya's) */
} suffix;

static const suffix suffixes[] = {
    {".lora_down.weight", PART_A, R_BFL, 1},  {".lora_up.weight", PART_B, R_BFL, 1},
    {".lora_A.weight", PART_A, R_BFL, 0},     {".lora_B.weight", PART_B, R_BFL, 0},
    {".alpha", PART_ALPHA, R_BFL, -1},        {".down.weight", PART_A, R_XLABS, -1},
    {".up.weight", PART_B, R_XLABS, -1},
};

/* One BFL / XLabs module of the file while it is read. */
typedef struct src {
    char key[96];                  /* the module, '_' spelling, with its block */
    const rule *r;
    int blk;
    const ditd_st_tensor *part[3]; /* A, B, alpha */
} src;

/* The names ditd_lora_format_name gives, spelled here so that lora.c uses
 * this file and not the other way round. */
static const char *fmt_name(ditd_lora_format f)
{
    switch (f) {
    case DITD_LORA_FORMAT_KOHYA_BFL: return "kohya-bfl";
    case DITD_LORA_FORMAT_BFL: return "bfl";
    case DITD_LORA_FORMAT_XLABS: return "xlabs";
    default: return "Diffusers / PEFT";
    }
}

/* Parses a tensor name of format fmt into (module key, rule, block, part). */
static int parse(const char *name, const char *what, ditd_lora_format fmt, int *down_seen,
                 src *s, int *part)
{
    int fm = fmt == DITD_LORA_FORMAT_XLABS ? R_XLABS : R_BFL;
    const char *rest = fmt == DITD_LORA_FORMAT_KOHYA_BFL ? name + strlen("lora_unet_")
                                                         : after_prefix(name);
    size_t n = strlen(rest), cut = 0;
    const suffix *sf = NULL;
    for (size_t i = 0; i < sizeof suffixes / sizeof suffixes[0]; i++) {
        size_t k = strlen(suffixes[i].s);
        if ((suffixes[i].fmts & fm) && n > k && !strcmp(rest + n - k, suffixes[i].s)) {
            sf = &suffixes[i];
            cut = n - k;
            break;
        }
    }
    /* kohya spells down / up only */
    if (sf && fmt == DITD_LORA_FORMAT_KOHYA_BFL && sf->down == 0)
        sf = NULL;
    if (!sf)
        return ditd_err_set(DITD_EFORMAT,
                            "tensor '%s' in %s: not a LoRA tensor ditd reads in a %s file "
                            "(expected <module>%s)",
                            name, what, fmt_name(fmt),
                            fm == R_XLABS ? ".down.weight / .up.weight"
                            : fmt == DITD_LORA_FORMAT_KOHYA_BFL
                                ? ".lora_down.weight / .lora_up.weight / .alpha"
                                : ".lora_A.weight / .lora_B.weight (or .lora_down / .lora_up) "
                                  "/ .alpha");
    if (sf->down >= 0) {
        int bit = sf->down ? 1 : 2;
        if (*down_seen & ~bit & 3)
            return ditd_err_set(DITD_EFORMAT,
                                "tensor '%s' in %s: lora_A / lora_B and lora_down / lora_up "
                                "spellings mixed in one file",
                                name, what);
        *down_seen |= bit;
    }
    *part = sf->part;
    if (cut >= sizeof s->key)
        return ditd_err_set(DITD_EFORMAT, "tensor '%s' in %s: module name too long", name, what);
    underscored(rest, cut, s->key, sizeof s->key);

    const char *m = s->key;
    int where = TOP;
    s->blk = -1;
    if (starts_with(m, "double_blocks_") || starts_with(m, "single_blocks_")) {
        where = m[0] == 'd' ? DBL : SGL;
        m += strlen("double_blocks_");
        char *end = NULL;
        long b = isdigit((unsigned char)*m) ? strtol(m, &end, 10) : -1;
        if (b < 0 || b > 100000 || !end || *end != '_')
            return ditd_err_set(DITD_EFORMAT, "tensor '%s' in %s: no block number in '%s'", name,
                                what, s->key);
        s->blk = (int)b;
        m = end + 1;
    }
    for (size_t i = 0; i < sizeof rules / sizeof rules[0]; i++)
        if ((rules[i].fmts & fm) && rules[i].where == where && !strcmp(rules[i].src, m)) {
            s->r = &rules[i];
            return 0;
        }
    return ditd_err_set(DITD_EFORMAT,
                        "tensor '%s' in %s: '%s' is not a FLUX module ditd maps in %s names "
                        "(docs/lora.md lists them)",
                        name, what, s->key, fmt_name(fmt));
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

static int find_target(const ditd_lora_target *t, int nt, const char *name)
{
    for (int i = 0; i < nt; i++)
        if (!strcmp(t[i].name, name))
            return i;
    return -1;
}

static int all_finite(const float *v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!isfinite(v[i]))
            return 0;
    return 1;
}

/* Whether B (rows, r) is block-diagonal over the parts' rows: part j only
 * in rank columns [j r/n, (j+1) r/n). Diffusers' test (exact zeros). */
static int block_diagonal(const float *b, int r, int n, const int *rows)
{
    if (n < 2 || r % n)
        return 0;
    int rj = r / n;
    size_t row = 0;
    for (int j = 0; j < n; j++)
        for (int i = 0; i < rows[j]; i++, row++)
            for (int c = 0; c < r; c++)
                if (c / rj != j && b[row * (size_t)r + (size_t)c] != 0.0f)
                    return 0;
    return 1;
}

/* Reads source module s into its parts' modules appended to l. */
static int read_src(const ditd_safetensors *st, const src *s, const char *what,
                    ditd_lora_format fmt, const ditd_lora_target *tg, int nt, int *owner,
                    ditd_lora *l)
{
    const ditd_st_tensor *A = s->part[PART_A], *B = s->part[PART_B], *al = s->part[PART_ALPHA];
    const rule *r = s->r;
    int t[4] = {0}, rows[4] = {0}, sum = 0, err;
    char full[4][160];

    if (!A || !B)
        return ditd_err_set(DITD_EFORMAT, "%s: module '%s' has %s but no %s", what, s->key,
                            (A ? A : B ? B : al)->name, !A ? "down (A) matrix" : "up (B) matrix");
    const char *named = A->name;
    for (int j = 0; j < r->n; j++) {
        if (r->where == DBL)
            snprintf(full[j], sizeof full[j], "transformer_blocks.%d.%s", s->blk, r->dst[j]);
        else if (r->where == SGL)
            snprintf(full[j], sizeof full[j], "single_transformer_blocks.%d.%s", s->blk,
                     r->dst[j]);
        else
            snprintf(full[j], sizeof full[j], "%s", r->dst[j]);
        if ((t[j] = find_target(tg, nt, full[j])) < 0)
            return ditd_err_set(DITD_ENOENT,
                                "tensor '%s' in %s: %s module '%s' is the model's '%s', which it "
                                "does not have",
                                named, what, fmt_name(fmt), s->key, full[j]);
        if (owner[t[j]] >= 0)
            return ditd_err_set(DITD_EFORMAT, "tensor '%s' in %s: module %s already given", named,
                                what, full[j]);
        rows[j] = tg[t[j]].n_out;
        sum += rows[j];
        if (tg[t[j]].k_in != tg[t[0]].k_in)
            return ditd_err_set(DITD_EINTERNAL, "%s: the parts of %s differ in inputs", what,
                                s->key);
    }
    int K = tg[t[0]].k_in;
    if ((err = readable(A, what)) || (err = readable(B, what)) || (al && (err = readable(al, what))))
        return err;
    if (A->ndim != 2)
        return ditd_err_set(DITD_ESHAPE, "tensor '%s' in %s: %d dimensions, a linear's LoRA A is "
                                         "(rank, %d)",
                            A->name, what, A->ndim, K);
    int64_t rk = A->shape[0];
    if (rk < 1 || rk > DITD_LORA_MAX_RANK)
        return ditd_err_set(DITD_EFORMAT, "tensor '%s' in %s: rank %lld outside 1..%d", A->name,
                            what, (long long)rk, DITD_LORA_MAX_RANK);
    if (A->shape[1] != K)
        return ditd_err_set(DITD_ESHAPE,
                            "tensor '%s' in %s: shape (%lld, %lld), but module %s%s takes %d "
                            "inputs: expected (%lld, %d)",
                            A->name, what, (long long)A->shape[0], (long long)A->shape[1],
                            full[0], r->n > 1 ? " (and the other parts)" : "", K, (long long)rk,
                            K);
    if (B->ndim != 2 || B->shape[0] != sum || B->shape[1] != rk) {
        char sh[64] = "(";
        for (int i = 0; i < B->ndim && i < 4; i++)
            snprintf(sh + strlen(sh), sizeof sh - strlen(sh), i ? ", %lld" : "%lld",
                     (long long)B->shape[i]);
        return ditd_err_set(DITD_ESHAPE,
                            "tensor '%s' in %s: shape %s), but %s maps to %d module%s with %d "
                            "outputs in all and the adapter rank is %lld: expected (%d, %lld)",
                            B->name, what, sh, s->key, r->n, r->n > 1 ? "s" : "", sum,
                            (long long)rk, sum, (long long)rk);
    }
    int R = (int)rk;
    float scale = 1.0f;
    if (al) {
        float alpha;
        if ((err = ditd__lora_read_alpha(st, al, what, &alpha)))
            return err;
        if (!(r->flags & F_NO_ALPHA))
            scale = alpha / (float)R;
    }
    size_t na = (size_t)R * (size_t)K, nb = (size_t)sum * (size_t)R;
    float *a = malloc(na * sizeof *a), *b = malloc(nb * sizeof *b);
    if (!a || !b) {
        err = ditd_err_set(DITD_ENOMEM, "%s: module %s", what, s->key);
        goto done;
    }
    if ((err = ditd_safetensors_read_f32(st, A->name, 2, A->shape, a)) ||
        (err = ditd_safetensors_read_f32(st, B->name, 2, B->shape, b)))
        goto done;
    if (!all_finite(a, na) || !all_finite(b, nb)) {
        err = ditd_err_set(DITD_EFORMAT, "tensor '%s' in %s: not finite",
                           all_finite(a, na) ? B->name : A->name, what);
        goto done;
    }
    /* sd-scripts' split q|k|v: A and B split by rank (Diffusers, kohya path) */
    int split = fmt != DITD_LORA_FORMAT_XLABS && block_diagonal(b, R, r->n, rows);
    int rj = split ? R / r->n : R;
    size_t row0 = 0;
    for (int j = 0; j < r->n; j++) {
        ditd_lora_module *m = &l->mod[l->n_mod];
        memset(m, 0, sizeof *m);
        m->target = t[j];
        m->rank = rj;
        m->n_out = rows[j];
        m->k_in = K;
        m->scale = scale;
        m->a = malloc((size_t)rj * (size_t)K * sizeof *m->a);
        m->b = malloc((size_t)rows[j] * (size_t)rj * sizeof *m->b);
        l->n_mod++;
        if (!m->a || !m->b) {
            err = ditd_err_set(DITD_ENOMEM, "%s: module %s", what, full[j]);
            goto done;
        }
        size_t c0 = split ? (size_t)j * (size_t)rj : 0;
        memcpy(m->a, a + c0 * (size_t)K, (size_t)rj * (size_t)K * sizeof *m->a);
        for (int i = 0; i < rows[j]; i++) {
            /* norm_out: BFL's (shift, scale) halves are Diffusers' (scale, shift) */
            int src_row = i;
            if (r->flags & F_SWAP)
                src_row = (i + rows[j] / 2) % rows[j];
            memcpy(m->b + (size_t)i * (size_t)rj,
                   b + (row0 + (size_t)src_row) * (size_t)R + c0, (size_t)rj * sizeof *m->b);
        }
        row0 += (size_t)rows[j];
        owner[t[j]] = 1;
        if (rj > l->max_rank)
            l->max_rank = rj;
    }
done:
    free(a);
    free(b);
    return err;
}

/* Tensors Diffusers' kohya / ComfyUI path purges when all zero ("ineffective")
 * and otherwise drops unapplied: full-weight differences. ditd skips the zero
 * ones (the same numbers) and refuses the others (they cannot be honoured). */
static int zero_diff(const ditd_safetensors *st, const ditd_st_tensor *t, const char *what,
                     int *skip)
{
    size_t n = 1;
    *skip = 0;
    if (!strstr(t->name, ".diff"))
        return 0;
    int err = readable(t, what);
    if (err)
        return err;
    for (int i = 0; i < t->ndim; i++)
        n *= (size_t)t->shape[i];
    float *v = malloc((n ? n : 1) * sizeof *v);
    if (!v)
        return ditd_err_set(DITD_ENOMEM, "%s", what);
    err = ditd_safetensors_read_f32(st, t->name, t->ndim, t->shape, v);
    for (size_t i = 0; !err && i < n; i++)
        if (v[i] != 0.0f)
            err = ditd_err_set(DITD_EUNSUPPORTED,
                               "tensor '%s' in %s: a full-weight difference (.diff / .diff_b), "
                               "which ditd does not apply (Diffusers drops it too)",
                               t->name, what);
    free(v);
    *skip = !err;
    return err;
}

int ditd_lora_convert_read(const ditd_safetensors *st, const char *what, ditd_lora_format fmt,
                           const ditd_lora_target *targets, int nt, int skip_te, ditd_lora *l)
{
    size_t n = ditd_safetensors_count(st);
    src *srcs = calloc(n ? n : 1, sizeof *srcs);
    int *owner = malloc((size_t)(nt > 0 ? nt : 1) * sizeof *owner);
    int ns = 0, err = 0, down_seen = 0;
    size_t cap = 0;

    l->format = fmt;
    if (!srcs || !owner) {
        err = ditd_err_set(DITD_ENOMEM, "%s", what);
        goto done;
    }
    for (int i = 0; i < nt; i++)
        owner[i] = -1;
    for (size_t i = 0; i < n; i++) {
        const ditd_st_tensor *t = ditd_safetensors_at(st, i);
        ditd_lora_format f = classify(t->name);
        int part = PART_A, skip = 0;
        src s;
        memset(&s, 0, sizeof s);
        if ((fmt == DITD_LORA_FORMAT_KOHYA_BFL || fmt == DITD_LORA_FORMAT_BFL) &&
            (err = zero_diff(st, t, what, &skip)))
            goto done;
        if (skip)
            continue;
        if (starts_with(t->name, "lora_te") || starts_with(t->name, "text_encoder")) {
            if (skip_te) /* the text encoders' part (engine/text/text_lora.h) */
                continue;
            err = ditd_err_set(DITD_EUNSUPPORTED,
                               "tensor '%s' in %s: a text-encoder LoRA, and this model has no "
                               "text encoder to apply it to",
                               t->name, what);
            goto done;
        }
        if (strstr(t->name, "query_norm.scale") || strstr(t->name, "key_norm.scale")) {
            err = ditd_err_set(DITD_EUNSUPPORTED,
                               "tensor '%s' in %s: a FLUX Control LoRA (norm scales, a wider "
                               "x_embedder), which ditd does not apply",
                               t->name, what);
            goto done;
        }
        if (f != fmt) {
            err = ditd_err_set(DITD_EFORMAT, "tensor '%s' in %s: %s names in a %s file",
                               t->name, what,
                               f != DITD_LORA_FORMAT_PEFT        ? fmt_name(f)
                               : starts_with(t->name, "lora_unet_") ? "kohya (Diffusers modules)"
                                                                    : "Diffusers / PEFT (or unknown)",
                               fmt_name(fmt));
            goto done;
        }
        if ((err = parse(t->name, what, fmt, &down_seen, &s, &part)))
            goto done;
        int j = 0;
        while (j < ns && strcmp(srcs[j].key, s.key))
            j++;
        if (j == ns)
            srcs[ns++] = s;
        if (srcs[j].part[part]) {
            err = ditd_err_set(DITD_EFORMAT, "tensor '%s' in %s: module %s already has '%s'",
                               t->name, what, s.key, srcs[j].part[part]->name);
            goto done;
        }
        srcs[j].part[part] = t;
    }
    if (ns == 0) {
        err = ditd_err_set(DITD_EFORMAT, "%s: no LoRA tensors", what);
        goto done;
    }
    for (int j = 0; j < ns; j++)
        cap += (size_t)srcs[j].r->n;
    if (!(l->mod = calloc(cap, sizeof *l->mod))) {
        err = ditd_err_set(DITD_ENOMEM, "%s", what);
        goto done;
    }
    for (int j = 0; j < ns && !err; j++)
        err = read_src(st, &srcs[j], what, fmt, targets, nt, owner, l);
done:
    free(owner);
    free(srcs);
    return err;
}

int ditd__lora_relay_rows(ditd_lora *l, const ditd_lora_target *targets, const char *what)
{
    for (int i = 0; i < l->n_mod; i++) {
        ditd_lora_module *m = &l->mod[i];
        int g = targets[m->target].row_groups;
        if (g <= 1 || m->n_out % g)
            continue;
        size_t r = (size_t)m->rank, C = (size_t)(m->n_out / g);
        float *nb = malloc((size_t)m->n_out * r * sizeof *nb);
        if (!nb)
            return ditd_err_set(DITD_ENOMEM, "%s: module %s", what, targets[m->target].name);
        for (size_t o = 0; o < (size_t)m->n_out; o++) /* o = c g + q -> q C + c */
            memcpy(nb + ((o % (size_t)g) * C + o / (size_t)g) * r, m->b + o * r,
                   r * sizeof *nb);
        free(m->b);
        m->b = nb;
    }
    return 0;
}
