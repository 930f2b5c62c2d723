/* A pipeline row's prompt recipe over engine/text, with the embedding cache. */
#include "engine/core/clock.h"
#include "engine/pipeline/prompt_encoder.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/core/error.h"
#include "engine/io/json_config.h"
#include "engine/text/clip_text.h"
#include "engine/text/t5_encoder.h"
#include "engine/text/text_cache.h"
#include "engine/text/text_lora.h"
#include "engine/text/tokenizer.h"
#include "engine/text/wan_text.h"

#define KEY_SEP '\x1e' /* between the prompts of a cache key */

/* One tokenizer + encoder of the recipe, loaded. */
typedef struct part {
    const ditd_prompt_part *pp;
    int present;              /* 0: an optional part the folder names null */
    ditd_tokenizer *tok;
    ditd_clip_text *clip;     /* DITD_PROMPT_ENC_CLIP */
    ditd_t5_encoder *t5;      /* DITD_PROMPT_ENC_T5, DITD_PROMPT_ENC_UMT5 */
    int len;                  /* its tokens; 0: max_sequence_length */
    int width;                /* its hidden width */
    int pooled_width;         /* what it adds to the pooled vector */
    float *hidden;            /* (max tokens, width) */
} part;

struct ditd_prompt_encoder {
    char key[DITD_MODEL_PATH_MAX]; /* the cache's model key: the folder */
    const ditd_backend_ops *ops;   /* the encoders' */
    const ditd_pipeline_class *pc;
    part parts[DITD_PROMPT_MAX_PARTS];
    int n_parts;
    ditd_text_cache *cache;        /* NULL: no cache */
    int max_len;                   /* longest max_sequence_length */
    int Dt, Dp;
    int32_t *ids32;                /* (longest part) */
    int64_t *ids;
    float *packed;                 /* (text_len(max_len) Dt + Dp): what the cache stores */
    char *keybuf;                  /* the prompts of a cache key */
    size_t keycap;
    uint64_t encodes;              /* prompts through the encoders */
    double encode_ms;
};

/* model_index.json's class for `component` into cls; *named 0 when the
 * index names it null or not at all. */
static int component_class(const char *dir, const char *component, char *cls, size_t cap,
                           int *named)
{
    char path[DITD_MODEL_PATH_MAX + 32];
    json_t *root, *v;
    cls[0] = '\0';
    *named = 0;
    snprintf(path, sizeof path, "%s/model_index.json", dir);
    int err;
    if (!(root = ditd_json_config_get(path, NULL, &err)))
        return err;
    v = json_object_get(root, component);
    if (v && json_is_array(v) && json_array_size(v) == 2 && json_is_string(json_array_get(v, 1))) {
        snprintf(cls, cap, "%s", json_string_value(json_array_get(v, 1)));
        *named = 1;
    } else if (v && !json_is_null(v) &&
               !(json_is_array(v) && json_array_size(v) == 2 &&
                 json_is_null(json_array_get(v, 1)))) {
        json_decref(root);
        return ditd_err_set(DITD_EFORMAT, "%s: %s must be [\"library\", \"Class\"] or null", path,
                            component);
    }
    json_decref(root);
    return 0;
}

static int load_part(ditd_prompt_encoder *e, part *p, const ditd_model_info *info,
                     const ditd_backend_ops *ops)
{
    const ditd_prompt_part *pp = p->pp;
    const ditd_tok_kind want = pp->kind == DITD_PROMPT_ENC_CLIP ? DITD_TOK_CLIP : DITD_TOK_T5;
    char dir[DITD_MODEL_PATH_MAX + 32], cls[128];
    int err, named;

    if ((err = component_class(info->dir, pp->encoder, cls, sizeof cls, &named)))
        return err;
    if (!named) {
        if (pp->optional)
            return 0; /* present = 0: its sequence is zeros */
        return ditd_err_set(DITD_EINVAL, "%s/model_index.json: names no %s component: %s needs it",
                            info->dir, pp->encoder, e->pc->name);
    }
    p->present = 1;
    if ((err = ditd_tokenizer_load_component(info->dir, pp->tokenizer, &p->tok)))
        return err;
    if (ditd_tokenizer_kind(p->tok) != want)
        return ditd_err_set(DITD_EUNSUPPORTED, "%s: %s takes a %s %s/, not %s", info->dir,
                            e->pc->name, ditd_tok_kind_name(want), pp->tokenizer,
                            ditd_tok_kind_name(ditd_tokenizer_kind(p->tok)));
    p->len = pp->tokens;
    int mml = ditd_tokenizer_model_max_length(p->tok);
    if (p->len > 0 && mml > 0 && mml < p->len) {
        /* a pooled-only CLIP runs at the tokenizer's shorter length (as
         * FluxPipeline's tokenizer_max_length); a sequence part's length is
         * the table's, which the transformer's text length counts on */
        if (pp->seq != DITD_PROMPT_SEQ_NONE)
            return ditd_err_set(DITD_EUNSUPPORTED,
                                "%s/%s: model_max_length %d: %s joins %d tokens of it", info->dir,
                                pp->tokenizer, mml, e->pc->name, p->len);
        p->len = mml;
    }
    snprintf(dir, sizeof dir, "%s/%s", info->dir, pp->encoder);
    int max_tokens = p->len > 0 ? p->len : e->max_len;
    if (pp->kind == DITD_PROMPT_ENC_CLIP) {
        if ((err = ditd_clip_text_new(dir, cls, ops, 1, max_tokens, &p->clip)))
            return err;
        p->width = ditd_clip_text_config_of(p->clip)->hidden_size;
        if (pp->pooled == DITD_PROMPT_POOLED_PROJECTED) {
            if (!ditd_clip_text_has_projection(p->clip))
                return ditd_err_set(DITD_EUNSUPPORTED,
                                    "%s: %s takes the projected text_embeds of a "
                                    "CLIPTextModelWithProjection; this one has no text_projection",
                                    dir, e->pc->name);
            p->pooled_width = ditd_clip_text_config_of(p->clip)->projection_dim;
        } else if (pp->pooled == DITD_PROMPT_POOLED_POOLER) {
            p->pooled_width = p->width;
        }
    } else {
        if (pp->pooled != DITD_PROMPT_POOLED_NONE)
            return ditd_err_set(DITD_EINVAL, "%s: a T5 part has no pooled output", e->pc->name);
        /* --text-encoder-2-file: FLUX's T5 weights from a file beside the folder */
        const char *wfile =
            strcmp(pp->encoder, "text_encoder_2") == 0 ? info->text_encoder_2_file : NULL;
        if ((err = ditd_t5_encoder_new_file(dir, wfile, cls, ops, 1, max_tokens, &p->t5)))
            return err;
        p->width = ditd_t5_encoder_config_of(p->t5)->d_model;
    }
    if (pp->seq != DITD_PROMPT_SEQ_NONE &&
        !(p->hidden = malloc((size_t)max_tokens * (size_t)p->width * sizeof(float))))
        return ditd_err_set(DITD_ENOMEM, "prompt encoder buffers");
    return 0;
}

/* The joined widths against the transformer's. */
static int check_widths(const ditd_prompt_encoder *e, const ditd_model_info *info)
{
    int pooled = 0;
    for (int g = 0; g < DITD_PROMPT_MAX_PARTS; g++) {
        int w = 0, len = -1, t5 = 0;
        char names[256] = "";
        size_t nl = 0;
        for (int i = 0; i < e->n_parts; i++) {
            const part *p = &e->parts[i];
            if (p->pp->seq == DITD_PROMPT_SEQ_NONE || p->pp->seq_group != g)
                continue;
            if (len >= 0 && p->pp->tokens != len)
                return ditd_err_set(DITD_EINVAL, "%s: the parts of sequence group %d differ in length",
                                    e->pc->name, g);
            len = p->pp->tokens;
            if (p->present) {
                t5 = t5 || p->t5 != NULL;
                w += p->width;
                int n = snprintf(names + nl, sizeof names - nl, "%s%s %d", nl ? " + " : "",
                                 p->pp->encoder, p->width);
                if (n > 0 && nl + (size_t)n < sizeof names)
                    nl += (size_t)n;
            }
        }
        /* a T5 part is the transformer's width itself (the pipelines
         * concatenate it on the sequence); CLIP parts are padded to it */
        if (w > e->Dt || (t5 && w != e->Dt))
            return ditd_err_set(DITD_EUNSUPPORTED,
                                "%s: the text encoders give %s wide hidden states; the transformer "
                                "takes %d (joint_attention_dim)",
                                info->dir, names, e->Dt);
    }
    for (int i = 0; i < e->n_parts; i++)
        pooled += e->parts[i].pooled_width;
    if (pooled != e->Dp)
        return ditd_err_set(DITD_EUNSUPPORTED,
                            "%s: the text encoders give a %d wide pooled vector; the transformer "
                            "takes %d (pooled_projection_dim)",
                            info->dir, pooled, e->Dp);
    return 0;
}

int ditd_prompt_encoder_new(const ditd_model_info *info, const ditd_backend_ops *ops,
                            const ditd_prompt_encoder_opts *opts, ditd_prompt_encoder **out)
{
    ditd_prompt_encoder *e;
    int err;
    *out = NULL;
    if (info->shapes.cond.kind != DITD_COND_TEXT || !info->pipeline ||
        info->pipeline->n_parts == 0)
        return ditd_err_set(DITD_EINVAL, "%s: a class-conditional model has no prompt encoder",
                            info->dir);
    if (opts->max_sequence_length < 1 ||
        opts->max_sequence_length > info->pipeline->max_sequence_length)
        return ditd_err_set(DITD_EINVAL, "max_sequence_length %d (1..%d)",
                            opts->max_sequence_length, info->pipeline->max_sequence_length);
    if (!(e = calloc(1, sizeof *e)))
        return ditd_err_set(DITD_ENOMEM, "prompt encoder");
    snprintf(e->key, sizeof e->key, "%s", info->dir);
    e->ops = ops;
    e->pc = info->pipeline;
    e->max_len = opts->max_sequence_length;
    e->Dt = info->shapes.cond.text_dim;
    e->Dp = info->shapes.cond.pooled_dim;
    e->n_parts = e->pc->n_parts;
    size_t longest = (size_t)e->max_len;
    for (int i = 0; i < e->n_parts; i++) {
        e->parts[i].pp = &e->pc->parts[i];
        if ((err = load_part(e, &e->parts[i], info, ops)))
            goto fail;
        if ((size_t)e->parts[i].len > longest)
            longest = (size_t)e->parts[i].len;
    }
    if ((err = check_widths(e, info)))
        goto fail;
    if (opts->cache_entries > 0 &&
        (err = ditd_text_cache_new(opts->cache_entries, opts->cache_bytes ? opts->cache_bytes : 1,
                                   &e->cache)))
        goto fail;
    e->ids32 = malloc(longest * sizeof *e->ids32);
    e->ids = malloc(longest * sizeof *e->ids);
    e->packed = malloc(((size_t)ditd_prompt_encoder_text_len(e, e->max_len) * (size_t)e->Dt +
                        (size_t)e->Dp) * sizeof(float));
    if (!e->ids32 || !e->ids || !e->packed) {
        err = ditd_err_set(DITD_ENOMEM, "prompt encoder buffers");
        goto fail;
    }
    *out = e;
    return 0;
fail:
    ditd_prompt_encoder_free(e);
    return err;
}

void ditd_prompt_encoder_free(ditd_prompt_encoder *e)
{
    if (!e)
        return;
    for (int i = 0; i < e->n_parts; i++) {
        ditd_tokenizer_free(e->parts[i].tok);
        ditd_clip_text_free(e->parts[i].clip);
        ditd_t5_encoder_free(e->parts[i].t5);
        free(e->parts[i].hidden);
    }
    ditd_text_cache_free(e->cache);
    free(e->ids32);
    free(e->ids);
    free(e->packed);
    free(e->keybuf);
    free(e);
}

int ditd_prompt_encoder_text_dim(const ditd_prompt_encoder *e) { return e->Dt; }
int ditd_prompt_encoder_pooled_dim(const ditd_prompt_encoder *e) { return e->Dp; }

int ditd_prompt_encoder_text_len(const ditd_prompt_encoder *e, int L)
{
    return ditd_pipeline_class_text_len(e->pc, L);
}

/* The text part k reads: texts[k] unless absent or empty, else texts[0]. */
static void pick(const ditd_prompt_texts *t, int k, const char **s, size_t *n)
{
    if (k > 0 && k < 3 && t->texts[k] && t->lens[k] > 0) {
        *s = t->texts[k];
        *n = t->lens[k];
    } else {
        *s = t->texts[0] ? t->texts[0] : "";
        *n = t->texts[0] ? t->lens[0] : 0;
    }
}

/* The cache key of the prompts the parts read: the first prompt alone when
 * every part reads it, else the distinct ones joined by KEY_SEP. NULL (no
 * caching) for a prompt holding a NUL byte or the separator, or no memory. */
static const char *cache_key(ditd_prompt_encoder *e, const ditd_prompt_texts *t,
                             const ditd_text_lora_set *loras)
{
    const char *s[3];
    size_t n[3], total = 0;
    const int nl = loras ? loras->n : 0;
    int prompts = ditd_pipeline_class_prompts(e->pc), alone = 1;
    for (int k = 0; k < prompts && k < 3; k++) {
        pick(t, k, &s[k], &n[k]);
        if (memchr(s[k], '\0', n[k]) || memchr(s[k], KEY_SEP, n[k]))
            return NULL;
        alone = alone && (n[k] == n[0] && memcmp(s[k], s[0], n[k]) == 0);
        total += n[k] + 1;
    }
    if (alone)
        prompts = 1;
    total += 8 + (size_t)nl * 48; /* the adapters: KEY_SEP "lora" then id*weight each */
    if (total + 1 > e->keycap) {
        char *nb = realloc(e->keybuf, total + 1);
        if (!nb)
            return NULL;
        e->keybuf = nb;
        e->keycap = total + 1;
    }
    size_t off = 0;
    for (int k = 0; k < prompts; k++) {
        if (k)
            e->keybuf[off++] = KEY_SEP;
        memcpy(e->keybuf + off, s[k], n[k]);
        off += n[k];
    }
    /* the adapters that change a number, in the order they are summed; the
     * weight exactly (%a); an adapter by its load id, never its name (a
     * name may be loaded again with another file) */
    int tagged = 0;
    for (int i = 0; i < nl; i++) {
        if (loras->weight[i] == 0.0f || !ditd_text_lora_any(loras->ad[i]))
            continue;
        if (!tagged++)
            off += (size_t)snprintf(e->keybuf + off, e->keycap - off, "%clora", KEY_SEP);
        off += (size_t)snprintf(e->keybuf + off, e->keycap - off, "|%llu*%a",
                                (unsigned long long)loras->ad[i]->id, (double)loras->weight[i]);
    }
    e->keybuf[off] = '\0';
    return e->keybuf;
}

/* WanPipeline's _get_t5_prompt_embeds for one prompt of len bytes: cleaned,
 * N tokens with the attention mask, the padded rows zeroed (the prompt
 * needs a NUL end: ditd_wan_prompt_embeds takes C strings; a prompt holding
 * a NUL byte is refused). */
static int run_umt5(part *p, const char *text, size_t len, int N)
{
    if (memchr(text, '\0', len))
        return ditd_err_set(DITD_EINVAL, "a prompt for %s holds a NUL byte", p->pp->encoder);
    char *z = malloc(len + 1);
    if (!z)
        return ditd_err_set(DITD_ENOMEM, "prompt of %zu bytes", len);
    memcpy(z, text, len);
    z[len] = '\0';
    const char *one = z;
    int err = ditd_wan_prompt_embeds(p->t5, p->tok, 1, &one, N, p->hidden, NULL);
    free(z);
    return err;
}

/* Runs part p on its prompt: hidden (len, width) when it joins the sequence,
 * and its pooled vector at pooled. */
static int run_part(ditd_prompt_encoder *e, part *p, const char *text, size_t len, int L,
                    const ditd_lora_set *ls, float *pooled)
{
    const int N = p->len > 0 ? p->len : L;
    const ditd_lora_set *const sets[1] = {ls};
    if (p->pp->kind == DITD_PROMPT_ENC_UMT5)
        return run_umt5(p, text, len, N); /* adapters refused at open */
    int err = ditd_tokenizer_encode(p->tok, text, len, N, e->ids32, NULL, NULL);
    if (err)
        return err;
    for (int i = 0; i < N; i++)
        e->ids[i] = e->ids32[i];
    if (p->t5)
        return ditd_t5_encoder_encode_lora(p->t5, 1, N, e->ids, NULL, ls ? sets : NULL,
                                           p->hidden);
    ditd_clip_text_out co = {0};
    if (p->pp->seq == DITD_PROMPT_SEQ_LAST)
        co.last = p->hidden;
    else if (p->pp->seq == DITD_PROMPT_SEQ_PENULTIMATE) {
        co.hidden_index = -2;
        co.hidden = p->hidden;
    }
    if (p->pp->pooled == DITD_PROMPT_POOLED_POOLER)
        co.pooled = pooled;
    else if (p->pp->pooled == DITD_PROMPT_POOLED_PROJECTED)
        co.text_embeds = pooled;
    return ditd_clip_text_encode_lora(p->clip, 1, N, e->ids, NULL, ls ? sets : NULL, &co);
}

/* The recipe's join: the sequence groups one after the other, each group's
 * parts side by side on channels, zero-padded to Dt; pooled vectors in part
 * order. */
static int encode_parts(ditd_prompt_encoder *e, const ditd_prompt_texts *t, int L,
                        const ditd_text_lora_set *loras, float *seq, float *pooled)
{
    const size_t Dt = (size_t)e->Dt;
    int row = 0, err;
    size_t poff = 0;
    for (int i = 0; i < e->n_parts; i++) {
        part *p = &e->parts[i];
        const char *s;
        size_t n;
        ditd_lora_set ls;
        pick(t, p->pp->prompt, &s, &n);
        int adapted = ditd_text_lora_set_part(loras, i, &ls);
        if (p->present && (err = run_part(e, p, s, n, L, adapted ? &ls : NULL, pooled + poff)))
            return err;
        poff += (size_t)p->pooled_width;
    }
    for (int g = 0; g < DITD_PROMPT_MAX_PARTS; g++) {
        int glen = -1;
        size_t c0 = 0;
        for (int i = 0; i < e->n_parts; i++) {
            const part *p = &e->parts[i];
            if (p->pp->seq == DITD_PROMPT_SEQ_NONE || p->pp->seq_group != g)
                continue;
            glen = p->pp->tokens > 0 ? p->pp->tokens : L;
            if (!p->present)
                continue;
            for (int r = 0; r < glen; r++)
                memcpy(seq + (size_t)(row + r) * Dt + c0, p->hidden + (size_t)r * p->width,
                       (size_t)p->width * sizeof(float));
            c0 += (size_t)p->width;
        }
        if (glen < 0)
            continue;
        for (int r = 0; r < glen; r++) /* the pad channels (all of an absent part's) */
            memset(seq + (size_t)(row + r) * Dt + c0, 0, (Dt - c0) * sizeof(float));
        row += glen;
    }
    return 0;
}

int ditd_prompt_encoder_encode_n(ditd_prompt_encoder *e, const ditd_prompt_texts *t, int L,
                                 float *seq, float *pooled)
{
    return ditd_prompt_encoder_encode_lora(e, t, L, NULL, seq, pooled);
}

int ditd_prompt_encoder_encode_lora(ditd_prompt_encoder *e, const ditd_prompt_texts *t, int L,
                                    const ditd_text_lora_set *loras, float *seq, float *pooled)
{
    const size_t nseq = (size_t)ditd_prompt_encoder_text_len(e, L) * (size_t)e->Dt;
    const float *hit;
    size_t n;
    int err;
    if (L < 1 || L > e->max_len)
        return ditd_err_set(DITD_EINVAL, "max_sequence_length %d (1..%d)", L, e->max_len);
    /* the cache keys on C strings: prompts it cannot key are never cached
     * (nor those whose key finds no memory); it counts the hits and misses */
    const char *key = e->cache ? cache_key(e, t, loras) : NULL;
    if (key && ditd_text_cache_get(e->cache, e->key, key, L, &hit, &n) &&
        n == nseq + (size_t)e->Dp) {
        memcpy(seq, hit, nseq * sizeof(float));
        memcpy(pooled, hit + nseq, (size_t)e->Dp * sizeof(float));
        return 0;
    }
    double t0 = ditd_now_ms();
    if ((err = encode_parts(e, t, L, loras, seq, pooled)))
        return err;
    e->encodes++;
    e->encode_ms += ditd_now_ms() - t0;
    if (key) { /* the cache stores sequence and pooled vector as one value */
        memcpy(e->packed, seq, nseq * sizeof(float));
        memcpy(e->packed + nseq, pooled, (size_t)e->Dp * sizeof(float));
        /* a put that finds no memory only loses the entry */
        ditd_text_cache_put(e->cache, e->key, key, L, e->packed, nseq + (size_t)e->Dp);
    }
    return 0;
}

int ditd_prompt_encoder_encode(ditd_prompt_encoder *e, const char *text, size_t len, int L,
                               float *seq, float *pooled)
{
    ditd_prompt_texts t = {.texts = {text}, .lens = {len}};
    return ditd_prompt_encoder_encode_n(e, &t, L, seq, pooled);
}

void ditd_prompt_encoder_stats(const ditd_prompt_encoder *e, ditd_prompt_stats *out)
{
    *out = (ditd_prompt_stats){.encodes = e->encodes, .encode_ms = e->encode_ms};
    if (e->cache) {
        ditd_text_cache_stats cs;
        ditd_text_cache_stats_get(e->cache, &cs);
        out->hits = cs.hits;
        out->misses = cs.misses;
        out->entries = cs.entries;
    }
}

int ditd_prompt_encoder_lora_open(const ditd_prompt_encoder *e, const char *path,
                                  const char *name, ditd_text_lora **out)
{
    ditd_text_lora_part parts[DITD_TEXT_LORA_MAX_PARTS];
    int clips = 0;
    if (e->n_parts > DITD_TEXT_LORA_MAX_PARTS)
        return ditd_err_set(DITD_EUNSUPPORTED, "%s: %d text encoders", e->pc->name, e->n_parts);
    for (int i = 0; i < e->n_parts; i++) {
        const part *p = &e->parts[i];
        ditd_text_lora_part *q = &parts[i];
        *q = (ditd_text_lora_part){.component = p->pp->encoder, .ops = e->ops};
        if (p->clip) {
            /* kohya: lora_te1_ (or SD's lora_te_) the first CLIP, lora_te2_ the second */
            static const char *const k1[2] = {"lora_te1_", "lora_te_"}, *const k2[2] = {"lora_te2_", NULL};
            q->kind = "CLIP";
            q->kohya[0] = clips ? k2[0] : k1[0];
            q->kohya[1] = clips ? k2[1] : k1[1];
            q->optional_prefix = "text_model.";
            q->targets = ditd_clip_text_lora_targets(p->clip, &q->n_targets);
            clips++;
        } else if (p->t5 && p->pp->kind == DITD_PROMPT_ENC_T5) {
            q->kind = "T5";
            q->targets = ditd_t5_encoder_lora_targets(p->t5, &q->n_targets);
        } else if (p->t5) {
            q->kind = "UMT5";
            q->refusal = "LoRA adapters on a UMT5 encoder are not supported yet";
        } else {
            q->kind = "absent";
            q->refusal = "the model folder has no such component (model_index.json names it null)";
        }
    }
    return ditd_text_lora_open(path, name, parts, e->n_parts, out);
}
