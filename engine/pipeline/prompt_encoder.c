/* FluxPipeline's encode_prompt over engine/text, with the embedding cache. */
#include "engine/pipeline/prompt_encoder.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/core/error.h"
#include "engine/text/clip_text.h"
#include "engine/text/t5_encoder.h"
#include "engine/text/text_cache.h"
#include "engine/text/tokenizer.h"

#define CLIP_TOKENS 77 /* FluxPipeline: tokenizer.model_max_length, else 77 */

struct ditd_prompt_encoder {
    char key[DITD_MODEL_PATH_MAX]; /* the cache's model key: the folder */
    ditd_tokenizer *tok_clip, *tok_t5;
    ditd_clip_text *clip;
    ditd_t5_encoder *t5;
    ditd_text_cache *cache;        /* NULL: no cache */
    int clip_len, max_len;         /* CLIP tokens; longest T5 sequence */
    int Dt, Dp;
    int32_t *ids32;                /* (max(clip_len, max_len)) */
    int64_t *ids;
    float *packed;                 /* (max_len Dt + Dp): what the cache stores */
    uint64_t encodes;              /* prompts through the encoders */
    double encode_ms;
};

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* model_index.json's class for `component` ("" when it names none). */
static int component_class(const char *dir, const char *component, char *cls, size_t cap)
{
    char path[DITD_MODEL_PATH_MAX + 32];
    json_error_t jerr;
    json_t *root, *v;
    cls[0] = '\0';
    snprintf(path, sizeof path, "%s/model_index.json", dir);
    if (!(root = json_load_file(path, 0, &jerr)))
        return ditd_err_set(DITD_EFORMAT, "%s: line %d: %s", path, jerr.line, jerr.text);
    v = json_object_get(root, component);
    if (!v || !json_is_array(v) || json_array_size(v) != 2 ||
        !json_is_string(json_array_get(v, 1))) {
        json_decref(root);
        return ditd_err_set(DITD_EINVAL, "%s: names no %s component: a text model needs it", path,
                            component);
    }
    snprintf(cls, cap, "%s", json_string_value(json_array_get(v, 1)));
    json_decref(root);
    return 0;
}

static int load_encoders(ditd_prompt_encoder *e, const ditd_model_info *info,
                         const ditd_backend_ops *ops)
{
    char dir[DITD_MODEL_PATH_MAX + 32], cls[128];
    int err;
    if ((err = ditd_tokenizer_load_component(info->dir, "tokenizer", &e->tok_clip)) ||
        (err = ditd_tokenizer_load_component(info->dir, "tokenizer_2", &e->tok_t5)))
        return err;
    if (ditd_tokenizer_kind(e->tok_clip) != DITD_TOK_CLIP ||
        ditd_tokenizer_kind(e->tok_t5) != DITD_TOK_T5)
        return ditd_err_set(DITD_EUNSUPPORTED,
                            "%s: FluxPipeline takes a CLIP tokenizer/ and a T5 tokenizer_2/, not %s and %s",
                            info->dir, ditd_tok_kind_name(ditd_tokenizer_kind(e->tok_clip)),
                            ditd_tok_kind_name(ditd_tokenizer_kind(e->tok_t5)));
    if (ditd_tokenizer_model_max_length(e->tok_clip) > 0 &&
        ditd_tokenizer_model_max_length(e->tok_clip) < CLIP_TOKENS)
        e->clip_len = ditd_tokenizer_model_max_length(e->tok_clip);
    else
        e->clip_len = CLIP_TOKENS;

    if ((err = component_class(info->dir, "text_encoder", cls, sizeof cls)))
        return err;
    snprintf(dir, sizeof dir, "%s/text_encoder", info->dir);
    if ((err = ditd_clip_text_new(dir, cls, ops, 1, e->clip_len, &e->clip)))
        return err;
    if ((err = component_class(info->dir, "text_encoder_2", cls, sizeof cls)))
        return err;
    snprintf(dir, sizeof dir, "%s/text_encoder_2", info->dir);
    if ((err = ditd_t5_encoder_new(dir, cls, ops, 1, e->max_len, &e->t5)))
        return err;
    e->Dp = ditd_clip_text_config_of(e->clip)->hidden_size;
    e->Dt = ditd_t5_encoder_config_of(e->t5)->d_model;
    if (e->Dt != info->shapes.cond.text_dim || e->Dp != info->shapes.cond.pooled_dim)
        return ditd_err_set(DITD_EUNSUPPORTED,
                            "%s: the text encoders give %d (T5 d_model) and %d (CLIP hidden_size) "
                            "wide embeddings; the transformer takes %d (joint_attention_dim) and %d "
                            "(pooled_projection_dim)",
                            info->dir, e->Dt, e->Dp, info->shapes.cond.text_dim,
                            info->shapes.cond.pooled_dim);
    return 0;
}

int ditd_prompt_encoder_new(const ditd_model_info *info, const ditd_backend_ops *ops,
                            const ditd_prompt_encoder_opts *opts, ditd_prompt_encoder **out)
{
    ditd_prompt_encoder *e;
    int err;
    *out = NULL;
    if (info->shapes.cond.kind != DITD_COND_TEXT)
        return ditd_err_set(DITD_EINVAL, "%s: a class-conditional model has no prompt encoder",
                            info->dir);
    if (strcmp(info->pipeline_class, "FluxPipeline") != 0)
        return ditd_err_set(DITD_EUNSUPPORTED,
                            "%s: pipeline \"%s\": ditd encodes prompts as FluxPipeline does only",
                            info->dir, info->pipeline_class);
    if (opts->max_sequence_length < 1 || opts->max_sequence_length > DITD_MODEL_MAX_SEQUENCE_LENGTH)
        return ditd_err_set(DITD_EINVAL, "max_sequence_length %d (1..%d)",
                            opts->max_sequence_length, DITD_MODEL_MAX_SEQUENCE_LENGTH);
    if (!(e = calloc(1, sizeof *e)))
        return ditd_err_set(DITD_ENOMEM, "prompt encoder");
    snprintf(e->key, sizeof e->key, "%s", info->dir);
    e->max_len = opts->max_sequence_length;
    if ((err = load_encoders(e, info, ops)))
        goto fail;
    if (opts->cache_entries > 0 &&
        (err = ditd_text_cache_new(opts->cache_entries, opts->cache_bytes ? opts->cache_bytes : 1,
                                   &e->cache)))
        goto fail;
    size_t n = (size_t)(e->clip_len > e->max_len ? e->clip_len : e->max_len);
    e->ids32 = malloc(n * sizeof *e->ids32);
    e->ids = malloc(n * sizeof *e->ids);
    e->packed = malloc(((size_t)e->max_len * (size_t)e->Dt + (size_t)e->Dp) * sizeof(float));
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
    ditd_tokenizer_free(e->tok_clip);
    ditd_tokenizer_free(e->tok_t5);
    ditd_clip_text_free(e->clip);
    ditd_t5_encoder_free(e->t5);
    ditd_text_cache_free(e->cache);
    free(e->ids32);
    free(e->ids);
    free(e->packed);
    free(e);
}

int ditd_prompt_encoder_text_dim(const ditd_prompt_encoder *e) { return e->Dt; }
int ditd_prompt_encoder_pooled_dim(const ditd_prompt_encoder *e) { return e->Dp; }

/* text -> N ids of `tok`, padded and truncated as the pipelines call it */
static int tokenize(ditd_prompt_encoder *e, const ditd_tokenizer *tok, const char *text,
                    size_t len, int N)
{
    int err = ditd_tokenizer_encode(tok, text, len, N, e->ids32, NULL, NULL);
    if (err)
        return err;
    for (int i = 0; i < N; i++)
        e->ids[i] = e->ids32[i];
    return 0;
}

int ditd_prompt_encoder_encode(ditd_prompt_encoder *e, const char *text, size_t len, int L,
                               float *seq, float *pooled)
{
    const size_t nseq = (size_t)L * (size_t)e->Dt;
    const float *hit;
    size_t n;
    int err;
    if (L < 1 || L > e->max_len)
        return ditd_err_set(DITD_EINVAL, "max_sequence_length %d (1..%d)", L, e->max_len);
    /* the cache keys on C strings: a prompt with a NUL byte is never cached
     * (nor one whose key finds no memory); it counts the hits and misses */
    char *key = e->cache && memchr(text, '\0', len) == NULL ? strndup(text, len) : NULL;
    if (key && ditd_text_cache_get(e->cache, e->key, key, L, &hit, &n) &&
        n == nseq + (size_t)e->Dp) {
        memcpy(seq, hit, nseq * sizeof(float));
        memcpy(pooled, hit + nseq, (size_t)e->Dp * sizeof(float));
        free(key);
        return 0;
    }
    double t0 = now_ms();
    ditd_clip_text_out co = {.pooled = pooled};
    if ((err = tokenize(e, e->tok_clip, text, len, e->clip_len)) ||
        (err = ditd_clip_text_encode(e->clip, 1, e->clip_len, e->ids, NULL, &co)) ||
        (err = tokenize(e, e->tok_t5, text, len, L)) ||
        (err = ditd_t5_encoder_encode(e->t5, 1, L, e->ids, NULL, seq))) {
        free(key);
        return err;
    }
    e->encodes++;
    e->encode_ms += now_ms() - t0;
    if (key) { /* the cache stores sequence and pooled vector as one value */
        memcpy(e->packed, seq, nseq * sizeof(float));
        memcpy(e->packed + nseq, pooled, (size_t)e->Dp * sizeof(float));
        /* a put that finds no memory only loses the entry */
        ditd_text_cache_put(e->cache, e->key, key, L, e->packed, nseq + (size_t)e->Dp);
        free(key);
    }
    return 0;
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
