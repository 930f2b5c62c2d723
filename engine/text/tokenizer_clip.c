/* CLIP byte-level BPE: the model half of the CLIP tokenizer (see
 * tokenizer_clip.h). Not the folder reader, not added tokens or padding. */
#include "engine/text/tokenizer_clip.h"

#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "engine/core/error.h"

struct ditd__clip {
    ditd__vocab vocab;
    ditd__pairmap merges;      /* (id_a << 32 | id_b) -> (rank, id of a+b) */
    int32_t byte_id[256];      /* the byte's printable code point */
    int32_t byte_end_id[256];  /* the same followed by "</w>" */
    int32_t unk_id;            /* -1: none */
};

static const char EOW[] = "</w>";

/* GPT-2's byte -> printable code point table (bytes_to_unicode). */
static int32_t byte_cp(int b)
{
    if ((b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF))
        return b;
    int n = 0;
    for (int x = 0; x < b; x++)
        if (!((x >= '!' && x <= '~') || (x >= 0xA1 && x <= 0xAC) || (x >= 0xAE && x <= 0xFF)))
            n++;
    return 256 + n;
}

static int clip_new(ditd__clip **out)
{
    ditd__clip *m = calloc(1, sizeof(*m));
    if (!m)
        return ditd_err_set(DITD_ENOMEM, "CLIP tokenizer");
    int err = ditd__vocab_init(&m->vocab, 50000);
    if (!err)
        err = ditd__pairmap_init(&m->merges, 50000);
    if (err) {
        ditd__clip_free(m);
        return err;
    }
    *out = m;
    return 0;
}

/* After the vocabulary: the per-byte ids and the unknown token. */
static int clip_finish(ditd__clip *m, const char *unk, const char *name)
{
    for (int b = 0; b < 256; b++) {
        char s[8];
        int k = ditd__utf8_put(byte_cp(b), s);
        m->byte_id[b] = ditd__vocab_get(&m->vocab, s, (size_t)k);
        memcpy(s + k, EOW, 4);
        m->byte_end_id[b] = ditd__vocab_get(&m->vocab, s, (size_t)k + 4);
    }
    m->unk_id = unk ? ditd__vocab_get(&m->vocab, unk, strlen(unk)) : -1;
    for (int b = 0; b < 256; b++)
        if ((m->byte_id[b] < 0 || m->byte_end_id[b] < 0) && m->unk_id < 0)
            return ditd_err_set(DITD_EFORMAT, "%s: byte 0x%02x has no token and there is no unknown token",
                                name, b);
    return ditd__vocab_index(&m->vocab);
}

static int add_merge(ditd__clip *m, const char *a, size_t na, const char *b, size_t nb, int32_t rank,
                     const char *name)
{
    int32_t ia = ditd__vocab_get(&m->vocab, a, na), ib = ditd__vocab_get(&m->vocab, b, nb);
    char stack[256];
    char *ab = na + nb <= sizeof(stack) ? stack : malloc(na + nb);
    if (!ab)
        return ditd_err_set(DITD_ENOMEM, "merge");
    memcpy(ab, a, na);
    memcpy(ab + na, b, nb);
    int32_t iab = ditd__vocab_get(&m->vocab, ab, na + nb);
    if (ab != stack)
        free(ab);
    if (ia < 0 || ib < 0 || iab < 0)
        return ditd_err_set(DITD_EFORMAT, "%s: merge %d (\"%.*s\" \"%.*s\") names a token not in the vocabulary",
                            name, rank + 1, (int)(na > 40 ? 40 : na), a, (int)(nb > 40 ? 40 : nb), b);
    int r = ditd__pairmap_put(&m->merges, ((uint64_t)(uint32_t)ia << 32) | (uint32_t)ib, rank, iab);
    return r < 0 ? r : 0; /* a repeated pair keeps its first (lowest) rank, as tokenizers does */
}

static int vocab_from_json(ditd__clip *m, const json_t *obj, const char *name)
{
    if (!json_is_object(obj))
        return ditd_err_set(DITD_EFORMAT, "%s: the vocabulary is not a JSON object", name);
    const char *key;
    json_t *val;
    json_object_foreach((json_t *)obj, key, val) {
        if (!json_is_integer(val) || json_integer_value(val) < 0 || json_integer_value(val) > 0x7fffffff)
            return ditd_err_set(DITD_EFORMAT, "%s: vocabulary entry \"%.40s\" is not an id", name, key);
        int err = ditd__vocab_put(&m->vocab, key, strlen(key), (int32_t)json_integer_value(val));
        if (err < 0)
            return err;
    }
    if (m->vocab.n == 0)
        return ditd_err_set(DITD_EFORMAT, "%s: empty vocabulary", name);
    return 0;
}

int ditd__clip_load_files(const char *vocab_path, const char *merges_path, const char *unk,
                          ditd__clip **out)
{
    ditd__clip *m = NULL;
    char *text = NULL;
    size_t len;
    json_t *vj = NULL;
    int err = clip_new(&m);
    if (err)
        return err;
    json_error_t je;
    vj = json_load_file(vocab_path, 0, &je);
    if (!vj) {
        err = ditd_err_set(DITD_EFORMAT, "%s: %s (line %d)", vocab_path, je.text, je.line);
        goto fail;
    }
    if ((err = vocab_from_json(m, vj, vocab_path)))
        goto fail;
    if ((err = ditd__read_file(merges_path, &text, &len)))
        goto fail;
    if (ditd__utf8_check(text, len) >= 0) {
        err = ditd_err_set(DITD_EFORMAT, "%s: not valid UTF-8", merges_path);
        goto fail;
    }
    /* One merge per line, "a b"; a first line "#version..." is skipped. */
    int32_t rank = 0;
    size_t i = 0;
    int line = 0;
    while (i < len) {
        size_t e = i;
        while (e < len && text[e] != '\n')
            e++;
        size_t le = e;
        if (le > i && text[le - 1] == '\r')
            le--;
        line++;
        if (!(line == 1 && le - i >= 8 && memcmp(text + i, "#version", 8) == 0) && le > i) {
            const char *sp = memchr(text + i, ' ', le - i);
            if (!sp || sp == text + i || sp + 1 == text + le || memchr(sp + 1, ' ', (size_t)(text + le - sp - 1))) {
                err = ditd_err_set(DITD_EFORMAT, "%s:%d: a merge is two tokens separated by one space",
                                   merges_path, line);
                goto fail;
            }
            if ((err = add_merge(m, text + i, (size_t)(sp - (text + i)), sp + 1, (size_t)(text + le - sp - 1),
                                 rank++, merges_path)))
                goto fail;
        }
        i = e + 1;
    }
    if ((err = clip_finish(m, unk, vocab_path)))
        goto fail;
    free(text);
    json_decref(vj);
    *out = m;
    return 0;
fail:
    free(text);
    json_decref(vj);
    ditd__clip_free(m);
    return err;
}

int ditd__clip_load_json(const json_t *model, const char *name, const char *unk, ditd__clip **out)
{
    ditd__clip *m = NULL;
    int err = clip_new(&m);
    if (err)
        return err;
    const json_t *eow = json_object_get(model, "end_of_word_suffix");
    const json_t *pre = json_object_get(model, "continuing_subword_prefix");
    /* transformers 5's CLIPTokenizer rebuilds the BPE with "</w>", no prefix
     * and no dropout whatever the file says; a file that names another
     * suffix or a prefix does not belong to this vocabulary: refused. */
    if (eow && !json_is_null(eow) && (!json_is_string(eow) || strcmp(json_string_value(eow), EOW) != 0)) {
        err = ditd_err_set(DITD_EUNSUPPORTED, "%s: model.end_of_word_suffix must be \"</w>\" (CLIP)", name);
        goto fail;
    }
    if (pre && !json_is_null(pre) && (!json_is_string(pre) || json_string_value(pre)[0])) {
        err = ditd_err_set(DITD_EUNSUPPORTED, "%s: model.continuing_subword_prefix must be empty (CLIP)", name);
        goto fail;
    }
    if ((err = vocab_from_json(m, json_object_get(model, "vocab"), name)))
        goto fail;
    const json_t *merges = json_object_get(model, "merges");
    if (!json_is_array(merges)) {
        err = ditd_err_set(DITD_EFORMAT, "%s: model.merges is not an array", name);
        goto fail;
    }
    for (size_t r = 0; r < json_array_size(merges); r++) {
        const json_t *mg = json_array_get(merges, r);
        const char *a, *b;
        size_t na, nb;
        if (json_is_string(mg)) { /* "a b" */
            a = json_string_value(mg);
            const char *sp = strchr(a, ' ');
            if (!sp || strchr(sp + 1, ' ')) {
                err = ditd_err_set(DITD_EFORMAT, "%s: merge %zu is not \"a b\"", name, r);
                goto fail;
            }
            na = (size_t)(sp - a);
            b = sp + 1;
            nb = strlen(b);
        } else if (json_is_array(mg) && json_array_size(mg) == 2 && json_is_string(json_array_get(mg, 0))
                   && json_is_string(json_array_get(mg, 1))) {
            a = json_string_value(json_array_get(mg, 0));
            b = json_string_value(json_array_get(mg, 1));
            na = json_string_length(json_array_get(mg, 0));
            nb = json_string_length(json_array_get(mg, 1));
        } else {
            err = ditd_err_set(DITD_EFORMAT, "%s: merge %zu is neither \"a b\" nor [a, b]", name, r);
            goto fail;
        }
        if ((err = add_merge(m, a, na, b, nb, (int32_t)r, name)))
            goto fail;
    }
    if ((err = clip_finish(m, unk, name)))
        goto fail;
    *out = m;
    return 0;
fail:
    ditd__clip_free(m);
    return err;
}

void ditd__clip_free(ditd__clip *m)
{
    if (!m)
        return;
    ditd__vocab_free(&m->vocab);
    ditd__pairmap_free(&m->merges);
    free(m);
}

const ditd__vocab *ditd__clip_vocab(const ditd__clip *m) { return &m->vocab; }

int ditd__clip_normalize(const char *s, size_t n, ditd__buf *out)
{
    if (n == 0)
        return 0;
    utf8proc_uint8_t *nfc = NULL;
    utf8proc_ssize_t k = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &nfc,
                                      UTF8PROC_STABLE | UTF8PROC_COMPOSE);
    if (k < 0)
        return ditd_err_set(k == UTF8PROC_ERROR_NOMEM ? DITD_ENOMEM : DITD_EINVAL, "NFC: %s",
                            utf8proc_errmsg(k));
    int err = 0;
    size_t i = 0;
    while (i < (size_t)k) {
        int32_t cp;
        i += (size_t)ditd__utf8_next((const char *)nfc + i, (size_t)k - i, &cp);
        char o[8];
        int ol;
        if (ditd__uc_is_space(cp)) {
            while (i < (size_t)k) {
                int32_t c2;
                int l2 = ditd__utf8_next((const char *)nfc + i, (size_t)k - i, &c2);
                if (!ditd__uc_is_space(c2))
                    break;
                i += (size_t)l2;
            }
            o[0] = ' ';
            ol = 1;
        } else if (cp == 0x130) { /* the one unconditional multi-code-point lowercase */
            ol = ditd__utf8_put('i', o);
            ol += ditd__utf8_put(0x307, o + ol);
        } else {
            ol = ditd__utf8_put(utf8proc_tolower(cp), o);
        }
        if ((err = ditd__buf_put(out, o, (size_t)ol)))
            break;
    }
    free(nfc);
    return err;
}

/* --- BPE over one word (a byte string), heap of candidate merges ordered
 * (rank, position), as tokenizers' Word::merge_all. */
typedef struct sym { int32_t id, prev, next, alive; } sym;
typedef struct cand { int32_t rank, pos, new_id; } cand;

static int cand_less(const cand *a, const cand *b)
{
    return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

static void heap_push(cand *h, size_t *n, cand c)
{
    size_t i = (*n)++;
    h[i] = c;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!cand_less(&h[i], &h[p]))
            break;
        cand t = h[i]; h[i] = h[p]; h[p] = t;
        i = p;
    }
}

static cand heap_pop(cand *h, size_t *n)
{
    cand top = h[0];
    h[0] = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, s = i;
        if (l < *n && cand_less(&h[l], &h[s])) s = l;
        if (r < *n && cand_less(&h[r], &h[s])) s = r;
        if (s == i)
            break;
        cand t = h[i]; h[i] = h[s]; h[s] = t;
        i = s;
    }
    return top;
}

static const struct ditd__pair_ent *merge_of(const ditd__clip *m, int32_t a, int32_t b)
{
    return ditd__pairmap_get(&m->merges, ((uint64_t)(uint32_t)a << 32) | (uint32_t)b);
}

/* Scratch for one word: symbols and the heap (each merge pushes at most two
 * candidates, so 3n bounds the heap). */
typedef struct scratch { sym *s; cand *h; size_t cap; } scratch;

static int bpe_word(const ditd__clip *m, const unsigned char *w, size_t n, scratch *sc, ditd__ids *ids)
{
    if (n == 0)
        return 0;
    if (n > sc->cap) {
        size_t nc = n < 64 ? 64 : n;
        free(sc->s);
        free(sc->h);
        sc->s = malloc(nc * sizeof(*sc->s));
        sc->h = malloc(3 * nc * sizeof(*sc->h));
        sc->cap = nc;
        if (!sc->s || !sc->h) {
            sc->cap = 0;
            return ditd_err_set(DITD_ENOMEM, "BPE scratch for a %zu-byte word", n);
        }
    }
    sym *s = sc->s;
    size_t ns = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t id = i + 1 == n ? m->byte_end_id[w[i]] : m->byte_id[w[i]];
        if (id < 0)
            id = m->unk_id;
        s[ns] = (sym){id, (int32_t)ns - 1, (int32_t)ns + 1, 1};
        ns++;
    }
    s[ns - 1].next = -1;
    size_t nh = 0;
    for (size_t i = 0; i + 1 < ns; i++) {
        const struct ditd__pair_ent *e = merge_of(m, s[i].id, s[i + 1].id);
        if (e)
            heap_push(sc->h, &nh, (cand){e->v1, (int32_t)i, e->v2});
    }
    while (nh > 0) {
        cand top = heap_pop(sc->h, &nh);
        sym *cur = &s[top.pos];
        if (!cur->alive || cur->next < 0)
            continue;
        sym *right = &s[cur->next];
        const struct ditd__pair_ent *e = merge_of(m, cur->id, right->id);
        if (!e || e->v2 != top.new_id)
            continue; /* stale */
        cur->id = top.new_id;
        right->alive = 0;
        cur->next = right->next;
        if (right->next >= 0)
            s[right->next].prev = top.pos;
        if (cur->prev >= 0) {
            const struct ditd__pair_ent *p = merge_of(m, s[cur->prev].id, cur->id);
            if (p)
                heap_push(sc->h, &nh, (cand){p->v1, cur->prev, p->v2});
        }
        if (cur->next >= 0) {
            const struct ditd__pair_ent *q = merge_of(m, cur->id, s[cur->next].id);
            if (q)
                heap_push(sc->h, &nh, (cand){q->v1, top.pos, q->v2});
        }
    }
    for (int32_t i = 0; i >= 0; i = s[i].next)
        if (s[i].id >= 0)
            ditd__ids_push(ids, s[i].id);
    return 0;
}

/* Code point at s[i] (i < n), its length in *l. */
static int32_t cp_at(const char *s, size_t n, size_t i, int *l)
{
    int32_t cp;
    *l = ditd__utf8_next(s + i, n - i, &cp);
    return cp;
}

static int is_other(int32_t cp)
{
    return !ditd__uc_is_space(cp) && !ditd__uc_is_letter(cp) && !ditd__uc_is_number(cp);
}

static const char *const CONTRACTIONS[] = {"'s", "'t", "'re", "'ve", "'m", "'ll", "'d"};

static size_t contraction_at(const char *s, size_t n, size_t i)
{
    for (size_t c = 0; c < sizeof(CONTRACTIONS) / sizeof(*CONTRACTIONS); c++) {
        size_t cl = strlen(CONTRACTIONS[c]);
        if (n - i >= cl && memcmp(s + i, CONTRACTIONS[c], cl) == 0)
            return cl;
    }
    return 0;
}

/* Length of the match of a run of one class starting at i. */
static size_t run_of(const char *s, size_t n, size_t i, int (*cls)(int32_t))
{
    size_t j = i;
    while (j < n) {
        int l;
        int32_t cp = cp_at(s, n, j, &l);
        if (!cls(cp))
            break;
        j += (size_t)l;
    }
    return j - i;
}

/* ByteLevel's own split of one CLIP pre-token (GPT-2's pattern without the
 * whitespace alternatives: a pre-token holds no whitespace), then BPE. */
static int bytelevel_words(const ditd__clip *m, const char *t, size_t n, scratch *sc, ditd__ids *ids)
{
    size_t i = 0;
    while (i < n && !ditd__ids_full(ids)) {
        size_t k = contraction_at(t, n, i);
        int l;
        int32_t cp = cp_at(t, n, i, &l);
        if (!k) {
            if (ditd__uc_is_letter(cp))
                k = run_of(t, n, i, ditd__uc_is_letter);
            else if (ditd__uc_is_number(cp))
                k = run_of(t, n, i, ditd__uc_is_number);
            else if (is_other(cp))
                k = run_of(t, n, i, is_other);
            else
                k = (size_t)l; /* not reached: no whitespace here */
        }
        int err = bpe_word(m, (const unsigned char *)t + i, k, sc, ids);
        if (err)
            return err;
        i += k;
    }
    return 0;
}

int ditd__clip_encode(const ditd__clip *m, const char *s, size_t n, ditd__ids *ids)
{
    static const char SOT[] = "<|startoftext|>", EOT[] = "<|endoftext|>";
    scratch sc = {0};
    int err = 0;
    size_t i = 0;
    while (i < n && !ditd__ids_full(ids)) {
        size_t k = 0;
        int l;
        int32_t cp = cp_at(s, n, i, &l);
        if (n - i >= sizeof(SOT) - 1 && memcmp(s + i, SOT, sizeof(SOT) - 1) == 0)
            k = sizeof(SOT) - 1;
        else if (n - i >= sizeof(EOT) - 1 && memcmp(s + i, EOT, sizeof(EOT) - 1) == 0)
            k = sizeof(EOT) - 1;
        else if ((k = contraction_at(s, n, i)))
            ;
        else if (ditd__uc_is_letter(cp))
            k = run_of(s, n, i, ditd__uc_is_letter);
        else if (ditd__uc_is_number(cp))
            k = (size_t)l;
        else if (is_other(cp))
            k = run_of(s, n, i, is_other);
        if (k == 0) { /* whitespace: not part of any pre-token */
            i += (size_t)l;
            continue;
        }
        if ((err = bytelevel_words(m, s + i, k, &sc, ids)))
            break;
        i += k;
    }
    free(sc.s);
    free(sc.h);
    return err;
}
