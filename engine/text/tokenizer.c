/* The tokenizer folder reader and the encode pipeline shared by CLIP and T5
 * (see tokenizer.h): which kind, which files, the special and added tokens
 * and their normalized flags, splitting the text on added tokens, truncation,
 * bos/eos and padding. The models themselves are tokenizer_clip.c and
 * tokenizer_t5.c. */
#include "engine/text/tokenizer.h"

#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <utf8proc.h>

#include "engine/core/error.h"
#include "engine/text/tokenizer_clip.h"
#include "engine/text/tokenizer_t5.h"
#include "engine/text/vocab.h"
#include "engine/io/json_config.h"

#define MAX_ADDED 4096
#define MAX_LENGTH_CAP (1 << 20)
/* Text is normalized and encoded in chunks of about this many bytes, cut
 * before an ASCII space, so an encode that fills max_length stops early
 * (see chunk_end). */
#define CHUNK 1024

typedef struct added_tok {
    char *content;  /* as matched: normalized by the model's normalizer when `normalized` */
    size_t len;
    int32_t id;
    int normalized;
} added_tok;

struct ditd_tokenizer {
    ditd_tok_kind kind;
    ditd__clip *clip;
    ditd__t5 *t5;
    added_tok *added;
    size_t n_added;
    unsigned char first_raw[256], first_norm[256]; /* first bytes of added tokens */
    int32_t bos_id, eos_id, pad_id;
    int chunked;        /* cutting before ASCII spaces gives the same ids */
    int model_max_length;
    int32_t vocab_size;
};

static const char *const KIND_NAMES[DITD_TOK__COUNT] = {"clip", "t5"};

const char *ditd_tok_kind_name(ditd_tok_kind k)
{
    return (unsigned)k < DITD_TOK__COUNT ? KIND_NAMES[k] : "unknown";
}

int ditd_tok_kind_from_str(const char *s, ditd_tok_kind *out)
{
    static const struct { const char *name; ditd_tok_kind k; } names[] = {
        {"clip", DITD_TOK_CLIP}, {"CLIPTokenizer", DITD_TOK_CLIP}, {"CLIPTokenizerFast", DITD_TOK_CLIP},
        {"t5", DITD_TOK_T5}, {"T5Tokenizer", DITD_TOK_T5}, {"T5TokenizerFast", DITD_TOK_T5},
    };
    for (size_t i = 0; s && i < sizeof(names) / sizeof(*names); i++)
        if (strcmp(s, names[i].name) == 0) {
            *out = names[i].k;
            return 0;
        }
    return ditd_err_set(DITD_EUNSUPPORTED, "tokenizer \"%s\": expected one of clip, t5, CLIPTokenizer, "
                        "CLIPTokenizerFast, T5Tokenizer, T5TokenizerFast", s ? s : "(null)");
}

static int file_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* Loads dir/name as JSON into *out; a missing file leaves *out NULL. */
static int load_json(const char *dir, const char *name, json_t **out)
{
    char path[PATH_MAX];
    *out = NULL;
    if (snprintf(path, sizeof(path), "%s/%s", dir, name) >= (int)sizeof(path))
        return ditd_err_set(DITD_EINVAL, "%s: path too long", dir);
    if (!file_exists(path))
        return 0;
    if (!strcmp(name, "model_index.json")) { /* the folder's, parsed once for all its readers */
        int err;
        if (!(*out = ditd_json_config_get(path, NULL, &err)))
            return err;
    } else { /* a tokenizer's own files (tokens may hold NUL) */
        json_error_t je;
        *out = json_load_file(path, JSON_ALLOW_NUL, &je);
        if (!*out)
            return ditd_err_set(DITD_EFORMAT, "%s: %s (line %d)", path, je.text, je.line);
    }
    if (!json_is_object(*out)) {
        json_decref(*out);
        *out = NULL;
        return ditd_err_set(DITD_EFORMAT, "%s: not a JSON object", path);
    }
    return 0;
}

/* A special token in a config: "text" or {"content": "text", "normalized": b}. */
static const char *token_text(const json_t *v, int *normalized)
{
    if (json_is_string(v))
        return json_string_value(v);
    if (json_is_object(v) && json_is_string(json_object_get(v, "content"))) {
        const json_t *n = json_object_get(v, "normalized");
        if (normalized && json_is_boolean(n))
            *normalized = json_is_true(n);
        return json_string_value(json_object_get(v, "content"));
    }
    return NULL;
}

static int32_t model_id(const ditd_tokenizer *t, const char *s, size_t n)
{
    const ditd__vocab *v = t->kind == DITD_TOK_CLIP ? ditd__clip_vocab(t->clip) : ditd__t5_vocab(t->t5);
    return ditd__vocab_get(v, s, n);
}

static int normalize(const ditd_tokenizer *t, const char *s, size_t n, ditd__buf *out)
{
    return t->kind == DITD_TOK_CLIP ? ditd__clip_normalize(s, n, out) : ditd__t5_normalize(t->t5, s, n, out);
}

static added_tok *find_added(const ditd_tokenizer *t, const char *s)
{
    for (size_t i = 0; i < t->n_added; i++)
        if (strcmp(t->added[i].content, s) == 0)
            return &t->added[i];
    return NULL;
}

/* Adds an added token unless its text is there already (the first source
 * wins: added_tokens_decoder, then tokenizer.json, then the special-token
 * entries). id < 0: the vocabulary's id. normalized < 0: false. */
static int add_token(ditd_tokenizer *t, const char *s, int64_t id, int normalized, const char *where)
{
    if (!s || !*s)
        return ditd_err_set(DITD_EFORMAT, "%s: an added token is empty", where);
    size_t n = strlen(s);
    if (ditd__utf8_check(s, n) >= 0)
        return ditd_err_set(DITD_EFORMAT, "%s: added token is not UTF-8", where);
    if (find_added(t, s))
        return 0;
    if (id < 0)
        id = model_id(t, s, n);
    if (id < 0 || id > INT32_MAX - 1)
        return ditd_err_set(DITD_EFORMAT, "%s: special token \"%.60s\" has no id in the vocabulary", where, s);
    if (t->n_added >= MAX_ADDED)
        return ditd_err_set(DITD_ERANGE, "%s: more than %d added tokens", where, MAX_ADDED);
    if (t->n_added % 64 == 0) {
        void *p = realloc(t->added, (t->n_added + 64) * sizeof(*t->added));
        if (!p)
            return ditd_err_set(DITD_ENOMEM, "added tokens");
        t->added = p;
    }
    added_tok *a = &t->added[t->n_added];
    a->content = strdup(s);
    if (!a->content)
        return ditd_err_set(DITD_ENOMEM, "added tokens");
    a->len = n;
    a->id = (int32_t)id;
    a->normalized = normalized > 0;
    t->n_added++;
    return 0;
}

/* Each `key` of cfg (bos_token, ...): its text, and its normalized flag
 * when given as an object. */
static const char *cfg_token(const json_t *cfg, const json_t *stm, const char *key, const char *dflt,
                             int *normalized)
{
    const char *s = dflt;
    const char *v;
    if (cfg && (v = token_text(json_object_get(cfg, key), normalized)))
        s = v;
    if (stm && (v = token_text(json_object_get(stm, key), normalized)))
        s = v;
    return s;
}

static int add_token_list(ditd_tokenizer *t, const json_t *list, const char *where)
{
    for (size_t i = 0; i < json_array_size(list); i++) {
        int norm = -1;
        const char *s = token_text(json_array_get(list, i), &norm);
        if (!s)
            return ditd_err_set(DITD_EFORMAT, "%s: additional special token %zu is not text", where, i);
        int err = add_token(t, s, -1, norm, where);
        if (err)
            return err;
    }
    return 0;
}

static int read_added(ditd_tokenizer *t, const json_t *cfg, const json_t *stm, const json_t *tj,
                      const char *dir)
{
    int err;
    const json_t *dec = cfg ? json_object_get(cfg, "added_tokens_decoder") : NULL;
    if (dec && json_is_object(dec)) {
        const char *key;
        json_t *v;
        json_object_foreach((json_t *)dec, key, v) {
            char *end;
            long id = strtol(key, &end, 10);
            int norm = 0;
            const char *s = token_text(v, &norm);
            if (*end || id < 0 || id > INT32_MAX - 1 || !s)
                return ditd_err_set(DITD_EFORMAT, "%s/tokenizer_config.json: added_tokens_decoder entry \"%.20s\"",
                                    dir, key);
            if ((err = add_token(t, s, id, norm, "tokenizer_config.json")))
                return err;
        }
    }
    const json_t *at = tj ? json_object_get(tj, "added_tokens") : NULL;
    for (size_t i = 0; i < json_array_size(at); i++) {
        const json_t *v = json_array_get(at, i);
        int norm = 0;
        const char *s = token_text(v, &norm);
        const json_t *id = json_object_get(v, "id");
        if (!s || !json_is_integer(id))
            return ditd_err_set(DITD_EFORMAT, "%s/tokenizer.json: added_tokens[%zu] has no content or id", dir, i);
        if ((err = add_token(t, s, json_integer_value(id), norm, "tokenizer.json")))
            return err;
    }
    /* the special tokens of the kind, as the transformers classes default them */
    const char *keys[4], *dflt[4];
    int nk = 0;
    if (t->kind == DITD_TOK_CLIP) {
        keys[nk] = "bos_token", dflt[nk++] = "<|startoftext|>";
        keys[nk] = "eos_token", dflt[nk++] = "<|endoftext|>";
        keys[nk] = "unk_token", dflt[nk++] = "<|endoftext|>";
        keys[nk] = "pad_token", dflt[nk++] = "<|endoftext|>";
    } else {
        keys[nk] = "eos_token", dflt[nk++] = "</s>";
        keys[nk] = "unk_token", dflt[nk++] = "<unk>";
        keys[nk] = "pad_token", dflt[nk++] = "<pad>";
    }
    for (int k = 0; k < nk; k++) {
        int norm = -1;
        const char *s = cfg_token(cfg, stm, keys[k], dflt[k], &norm);
        char where[64];
        snprintf(where, sizeof(where), "%s %s", dir, keys[k]);
        if ((err = add_token(t, s, -1, norm, where)))
            return err;
        int32_t id = find_added(t, s)->id;
        if (strcmp(keys[k], "bos_token") == 0) t->bos_id = id;
        if (strcmp(keys[k], "eos_token") == 0) t->eos_id = id;
        if (strcmp(keys[k], "pad_token") == 0) t->pad_id = id;
    }
    if (t->kind == DITD_TOK_T5) {
        const char *lists[] = {"additional_special_tokens", "extra_special_tokens"};
        for (int i = 0; i < 2; i++) {
            if (cfg && (err = add_token_list(t, json_object_get(cfg, lists[i]), "tokenizer_config.json")))
                return err;
            if (stm && (err = add_token_list(t, json_object_get(stm, lists[i]), "special_tokens_map.json")))
                return err;
        }
        const json_t *ex = cfg ? json_object_get(cfg, "extra_ids") : NULL;
        long extra = json_is_integer(ex) ? (long)json_integer_value(ex) : 100;
        for (long i = 0; i < extra && i < MAX_ADDED; i++) {
            char s[32];
            snprintf(s, sizeof(s), "<extra_id_%ld>", i);
            if (model_id(t, s, strlen(s)) >= 0 && (err = add_token(t, s, -1, 0, "extra_ids")))
                return err;
        }
    }
    /* normalized tokens match the normalized text: normalize their text */
    for (size_t i = 0; i < t->n_added; i++) {
        added_tok *a = &t->added[i];
        if (a->normalized) {
            ditd__buf b = {0};
            if ((err = normalize(t, a->content, a->len, &b))) {
                ditd__buf_free(&b);
                return err;
            }
            if (b.n == 0) { /* normalizes to nothing: can never match */
                ditd__buf_free(&b);
                a->len = 0;
                continue;
            }
            free(a->content);
            a->content = b.p;
            a->len = b.n;
        }
        if (a->len)
            (a->normalized ? t->first_norm : t->first_raw)[(unsigned char)a->content[0]] = 1;
        if (a->id + 1 > t->vocab_size)
            t->vocab_size = a->id + 1;
    }
    return 0;
}

/* Whether normalizing and encoding the text in pieces cut just before an
 * ASCII space gives the ids of the whole. It does when (1) the normalizer
 * leaves " " alone and never joins across it: NFC cannot (U+0020 is a
 * starter that composes with nothing), lowercase and the whitespace rule are
 * per character or per run (the run's remainder still separates), and the
 * charsmap works per grapheme cluster, which ends before a space unless the
 * character before is a Prepend (chunk_end avoids that); (2) the pre-
 * tokenizers split at whitespace (both do); (3) no added token matched on
 * normalized text contains whitespace. */
static int set_chunked(ditd_tokenizer *t)
{
    ditd__buf b = {0};
    int err = normalize(t, " ", 1, &b);
    if (err)
        return err;
    t->chunked = b.n == 1 && b.p[0] == ' ';
    ditd__buf_free(&b);
    for (size_t i = 0; i < t->n_added && t->chunked; i++) {
        const added_tok *a = &t->added[i];
        for (size_t k = 0; a->normalized && k < a->len;) {
            int32_t cp;
            k += (size_t)ditd__utf8_next(a->content + k, a->len - k, &cp);
            if (ditd__uc_is_space(cp))
                t->chunked = 0;
        }
    }
    return 0;
}

/* The end of the chunk that starts at `from`: the first ASCII space at or
 * after from + CHUNK whose preceding code point is not a grapheme Prepend,
 * else n. */
static size_t chunk_end(const ditd_tokenizer *t, const char *s, size_t from, size_t n)
{
    if (!t->chunked || n - from <= CHUNK)
        return n;
    for (size_t i = from + CHUNK; i < n; i++) {
        if (s[i] != ' ')
            continue;
        size_t j = i - 1;
        while (j > from && ((unsigned char)s[j] & 0xC0) == 0x80)
            j--;
        int32_t cp;
        ditd__utf8_next(s + j, i - j, &cp);
        if (utf8proc_get_property(cp)->boundclass != UTF8PROC_BOUNDCLASS_PREPEND)
            return i;
    }
    return n;
}

static int pick_kind(const char *dir, const json_t *cfg, const json_t *tj, ditd_tok_kind *kind)
{
    const json_t *cls = cfg ? json_object_get(cfg, "tokenizer_class") : NULL;
    if (json_is_string(cls)) {
        int err = ditd_tok_kind_from_str(json_string_value(cls), kind);
        if (err)
            return ditd_err_set(err, "%s/tokenizer_config.json: tokenizer_class \"%s\" is not supported "
                                "(CLIPTokenizer, T5Tokenizer and their Fast forms are)", dir, json_string_value(cls));
        return 0;
    }
    const char *type = tj ? json_string_value(json_object_get(json_object_get(tj, "model"), "type")) : NULL;
    if (type && strcmp(type, "BPE") == 0) { *kind = DITD_TOK_CLIP; return 0; }
    if (type && strcmp(type, "Unigram") == 0) { *kind = DITD_TOK_T5; return 0; }
    if (type)
        return ditd_err_set(DITD_EUNSUPPORTED, "%s/tokenizer.json: model type %s (BPE or Unigram)", dir, type);
    char p[PATH_MAX];
    snprintf(p, sizeof(p), "%s/merges.txt", dir);
    if (file_exists(p)) { *kind = DITD_TOK_CLIP; return 0; }
    snprintf(p, sizeof(p), "%s/spiece.model", dir);
    if (file_exists(p)) { *kind = DITD_TOK_T5; return 0; }
    return ditd_err_set(DITD_ENOENT, "%s: no tokenizer files (tokenizer.json, vocab.json + merges.txt, "
                        "or spiece.model)", dir);
}

int ditd_tokenizer_load(const char *dir, ditd_tokenizer **out)
{
    json_t *cfg = NULL, *stm = NULL, *tj = NULL;
    char *spm = NULL;
    char p1[PATH_MAX], p2[PATH_MAX];
    ditd_tokenizer *t = calloc(1, sizeof(*t));
    int err = 0;
    *out = NULL;
    if (!t)
        return ditd_err_set(DITD_ENOMEM, "tokenizer");
    t->bos_id = t->eos_id = t->pad_id = -1;
    if (strlen(dir) > PATH_MAX - 64) {
        err = ditd_err_set(DITD_EINVAL, "%.64s...: path too long", dir);
        goto fail;
    }
    if ((err = load_json(dir, "tokenizer_config.json", &cfg)) || (err = load_json(dir, "special_tokens_map.json", &stm))
        || (err = load_json(dir, "tokenizer.json", &tj)))
        goto fail;
    if ((err = pick_kind(dir, cfg, tj, &t->kind)))
        goto fail;
    const json_t *mml = cfg ? json_object_get(cfg, "model_max_length") : NULL;
    if (json_is_integer(mml) && json_integer_value(mml) > 0 && json_integer_value(mml) < MAX_LENGTH_CAP)
        t->model_max_length = (int)json_integer_value(mml);
    snprintf(p1, sizeof(p1), "%s/tokenizer.json", dir);
    const json_t *model = tj ? json_object_get(tj, "model") : NULL;
    if (tj && !json_is_object(model)) {
        err = ditd_err_set(DITD_EFORMAT, "%s: no model object", p1);
        goto fail;
    }
    if (t->kind == DITD_TOK_CLIP) {
        int unk_norm = 0;
        const char *unk = cfg_token(cfg, stm, "unk_token", "<|endoftext|>", &unk_norm);
        if (tj) {
            const char *type = json_string_value(json_object_get(model, "type"));
            if (!type || strcmp(type, "BPE") != 0) {
                err = ditd_err_set(DITD_EFORMAT, "%s: model type is not BPE (CLIP)", p1);
                goto fail;
            }
            err = ditd__clip_load_json(model, p1, unk, &t->clip);
        } else {
            snprintf(p1, sizeof(p1), "%s/vocab.json", dir);
            snprintf(p2, sizeof(p2), "%s/merges.txt", dir);
            if (!file_exists(p1) || !file_exists(p2)) {
                err = ditd_err_set(DITD_ENOENT, "%s: CLIP needs tokenizer.json or vocab.json + merges.txt", dir);
                goto fail;
            }
            err = ditd__clip_load_files(p1, p2, unk, &t->clip);
        }
        if (err)
            goto fail;
        t->vocab_size = ditd__clip_vocab(t->clip)->max_id + 1;
    } else {
        if (tj) {
            const char *type = json_string_value(json_object_get(model, "type"));
            if (!type || strcmp(type, "Unigram") != 0) {
                err = ditd_err_set(DITD_EFORMAT, "%s: model type is not Unigram (T5)", p1);
                goto fail;
            }
            err = ditd__t5_load_json(model, json_object_get(tj, "normalizer"), p1, &t->t5);
        } else {
            size_t len;
            snprintf(p1, sizeof(p1), "%s/spiece.model", dir);
            const json_t *ex = cfg ? json_object_get(cfg, "extra_ids") : NULL;
            long extra = json_is_integer(ex) ? (long)json_integer_value(ex) : 100;
            if (extra < 0 || extra > MAX_ADDED) {
                err = ditd_err_set(DITD_ERANGE, "%s/tokenizer_config.json: extra_ids %ld", dir, extra);
                goto fail;
            }
            if (!(err = ditd__read_file(p1, &spm, &len)))
                err = ditd__t5_load_spm(spm, len, p1, (int)extra, &t->t5);
        }
        if (err)
            goto fail;
        t->vocab_size = ditd__t5_vocab(t->t5)->max_id + 1;
    }
    if ((err = read_added(t, cfg, stm, tj, dir)))
        goto fail;
    if ((err = set_chunked(t)))
        goto fail;
    if ((t->kind == DITD_TOK_CLIP && t->bos_id < 0) || t->eos_id < 0 || t->pad_id < 0) {
        err = ditd_err_set(DITD_EFORMAT, "%s: missing bos, eos or pad token", dir);
        goto fail;
    }
    free(spm);
    json_decref(cfg);
    json_decref(stm);
    json_decref(tj);
    *out = t;
    return 0;
fail:
    free(spm);
    json_decref(cfg);
    json_decref(stm);
    json_decref(tj);
    ditd_tokenizer_free(t);
    return err;
}

int ditd_tokenizer_load_component(const char *model_dir, const char *component, ditd_tokenizer **out)
{
    json_t *idx = NULL;
    char dir[PATH_MAX];
    *out = NULL;
    int err = load_json(model_dir, "model_index.json", &idx);
    if (err)
        return err;
    if (!idx)
        return ditd_err_set(DITD_ENOENT, "%s: no model_index.json", model_dir);
    const json_t *e = json_object_get(idx, component);
    const char *cls = json_string_value(json_array_get(e, 1));
    ditd_tok_kind want;
    if (!e || json_is_null(json_array_get(e, 1))) {
        err = ditd_err_set(DITD_ENOENT, "%s/model_index.json: no component \"%s\"", model_dir, component);
    } else if (!json_is_array(e) || json_array_size(e) != 2 || !cls) {
        err = ditd_err_set(DITD_EFORMAT, "%s/model_index.json: \"%s\" is not [library, class]", model_dir,
                           component);
    } else if (ditd_tok_kind_from_str(cls, &want) != 0) {
        err = ditd_err_set(DITD_EUNSUPPORTED, "%s/model_index.json: %s is a %s; supported tokenizers: "
                           "CLIPTokenizer(Fast), T5Tokenizer(Fast)", model_dir, component, cls);
    } else if (strchr(component, '/') || strcmp(component, "..") == 0 || strcmp(component, ".") == 0) {
        err = ditd_err_set(DITD_EINVAL, "component \"%s\" is not a folder name", component);
    } else if (snprintf(dir, sizeof(dir), "%s/%s", model_dir, component) >= (int)sizeof(dir)) {
        err = ditd_err_set(DITD_EINVAL, "%s: path too long", model_dir);
    } else if (!(err = ditd_tokenizer_load(dir, out)) && ditd_tokenizer_kind(*out) != want) {
        err = ditd_err_set(DITD_EFORMAT, "%s: model_index.json says %s, the folder holds a %s tokenizer", dir,
                           cls, ditd_tok_kind_name(ditd_tokenizer_kind(*out)));
        ditd_tokenizer_free(*out);
        *out = NULL;
    }
    json_decref(idx);
    return err;
}

void ditd_tokenizer_free(ditd_tokenizer *t)
{
    if (!t)
        return;
    ditd__clip_free(t->clip);
    ditd__t5_free(t->t5);
    for (size_t i = 0; i < t->n_added; i++)
        free(t->added[i].content);
    free(t->added);
    free(t);
}

/* The leftmost, then longest, added token (of the normalized or the raw set)
 * in s[from, n): its start, length and id; 0 when none. */
static int next_added(const ditd_tokenizer *t, int normalized, const char *s, size_t from, size_t n,
                      size_t *at, size_t *len, int32_t *id)
{
    const unsigned char *first = normalized ? t->first_norm : t->first_raw;
    for (size_t i = from; i < n; i++) {
        if (!first[(unsigned char)s[i]])
            continue;
        size_t best = 0;
        for (size_t k = 0; k < t->n_added; k++) {
            const added_tok *a = &t->added[k];
            if (a->normalized != normalized || a->len == 0 || a->len > n - i || a->len <= best)
                continue;
            if (memcmp(s + i, a->content, a->len) == 0) {
                best = a->len;
                *id = a->id;
            }
        }
        if (best) {
            *at = i;
            *len = best;
            return 1;
        }
    }
    return 0;
}

static int model_encode(const ditd_tokenizer *t, const char *s, size_t n, ditd__ids *ids)
{
    return t->kind == DITD_TOK_CLIP ? ditd__clip_encode(t->clip, s, n, ids) : ditd__t5_encode(t->t5, s, n, ids);
}

/* One stretch of raw text between non-normalized added tokens, chunk by
 * chunk: normalize, split on the normalized added tokens, encode the rest
 * with the model; stop once ids is full. */
static int encode_segment(const ditd_tokenizer *t, const char *s, size_t n, ditd__buf *norm, ditd__ids *ids)
{
    for (size_t c0 = 0; c0 < n && !ditd__ids_full(ids);) {
        size_t c1 = chunk_end(t, s, c0, n);
        norm->n = 0;
        int err = normalize(t, s + c0, c1 - c0, norm);
        if (err)
            return err;
        size_t i = 0;
        while (i < norm->n && !ditd__ids_full(ids)) {
            size_t at = norm->n, len = 0;
            int32_t id = -1;
            int found = next_added(t, 1, norm->p, i, norm->n, &at, &len, &id);
            if ((err = model_encode(t, norm->p + i, at - i, ids)))
                return err;
            if (found)
                ditd__ids_push(ids, id);
            i = at + len;
        }
        c0 = c1;
    }
    return 0;
}

int ditd_tokenizer_encode(const ditd_tokenizer *t, const char *text, size_t len, int max_length,
                          int32_t *ids, int32_t *mask, int *n_tokens)
{
    int n_special = t->kind == DITD_TOK_CLIP ? 2 : 1;
    if (max_length < n_special || max_length > MAX_LENGTH_CAP)
        return ditd_err_set(DITD_ERANGE, "max_length %d: must be in [%d, %d] for a %s tokenizer", max_length,
                            n_special, MAX_LENGTH_CAP, ditd_tok_kind_name(t->kind));
    if (!text && len)
        return ditd_err_set(DITD_EINVAL, "text is NULL");
    long bad = text ? ditd__utf8_check(text, len) : -1;
    if (bad >= 0)
        return ditd_err_set(DITD_EINVAL, "prompt is not valid UTF-8 (byte %ld of %zu)", bad, len);
    int off = t->kind == DITD_TOK_CLIP ? 1 : 0;
    ditd__ids c = {ids + off, 0, (size_t)(max_length - n_special)};
    ditd__buf norm = {0};
    int err = 0;
    size_t pos = 0;
    while (pos < len && !ditd__ids_full(&c)) {
        size_t at = len, alen = 0;
        int32_t id = -1;
        int found = next_added(t, 0, text, pos, len, &at, &alen, &id);
        if (at > pos && (err = encode_segment(t, text + pos, at - pos, &norm, &c)))
            break;
        if (found)
            ditd__ids_push(&c, id);
        pos = at + alen;
    }
    ditd__buf_free(&norm);
    if (err)
        return err;
    int n = 0;
    if (t->kind == DITD_TOK_CLIP)
        ids[n++] = t->bos_id;
    n += (int)c.n;
    ids[n++] = t->eos_id;
    for (int i = 0; i < max_length; i++) {
        if (i >= n)
            ids[i] = t->pad_id;
        if (mask)
            mask[i] = i < n;
    }
    if (n_tokens)
        *n_tokens = n;
    return 0;
}

ditd_tok_kind ditd_tokenizer_kind(const ditd_tokenizer *t) { return t->kind; }
int32_t ditd_tokenizer_bos_id(const ditd_tokenizer *t) { return t->bos_id; }
int32_t ditd_tokenizer_eos_id(const ditd_tokenizer *t) { return t->eos_id; }
int32_t ditd_tokenizer_pad_id(const ditd_tokenizer *t) { return t->pad_id; }
int ditd_tokenizer_model_max_length(const ditd_tokenizer *t) { return t->model_max_length; }
int32_t ditd_tokenizer_vocab_size(const ditd_tokenizer *t) { return t->vocab_size; }

const char *ditd_tokenizer_token(const ditd_tokenizer *t, int32_t id)
{
    for (size_t i = 0; i < t->n_added; i++)
        if (t->added[i].id == id && !t->added[i].normalized)
            return t->added[i].content;
    const ditd__vocab *v = t->kind == DITD_TOK_CLIP ? ditd__clip_vocab(t->clip) : ditd__t5_vocab(t->t5);
    return ditd__vocab_str(v, id, NULL);
}
