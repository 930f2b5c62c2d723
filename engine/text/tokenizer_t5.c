/* T5's SentencePiece unigram model: the charsmap normalizer, the pre-
 * tokenizer and Viterbi (see tokenizer_t5.h). Also reads spiece.model with
 * protobuf-c. Not the folder reader, not added tokens or padding. */
#include "engine/text/tokenizer_t5.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "engine/core/error.h"
#include "engine/text/sentencepiece_model.pb-c.h"

struct ditd__t5 {
    ditd__vocab vocab;
    double *score;          /* by id */
    int32_t n_pieces;       /* ids 0..n_pieces-1 */
    int32_t unk_id;         /* -1: none */
    double unk_score;       /* min score - 10 */
    ditd__pairmap trie;     /* (node << 8 | byte) -> child node */
    int32_t *term;          /* node -> piece id ending here, -1 */
    size_t n_nodes, term_cap;
    /* the precompiled charsmap: NULL when the folder has none */
    uint32_t *cm_units;
    size_t cm_n_units;
    char *cm_norm;
    size_t cm_norm_len;
};

static const char META[] = "\xe2\x96\x81"; /* U+2581 */
#define K_UNK_PENALTY 10.0

int ditd__charsmap_check(const unsigned char *cm, size_t len, const char *name)
{
    if (len < 4)
        return ditd_err_set(DITD_EFORMAT, "%s: precompiled charsmap shorter than its header", name);
    uint32_t trie = (uint32_t)cm[0] | (uint32_t)cm[1] << 8 | (uint32_t)cm[2] << 16 | (uint32_t)cm[3] << 24;
    if (trie % 4 != 0 || trie > len - 4 || trie == 0)
        return ditd_err_set(DITD_EFORMAT, "%s: precompiled charsmap trie size %u does not fit %zu bytes",
                            name, trie, len);
    return 0;
}

static int set_charsmap(ditd__t5 *m, const unsigned char *cm, size_t len, const char *name)
{
    int err = ditd__charsmap_check(cm, len, name);
    if (err)
        return err;
    uint32_t trie = (uint32_t)cm[0] | (uint32_t)cm[1] << 8 | (uint32_t)cm[2] << 16 | (uint32_t)cm[3] << 24;
    m->cm_n_units = trie / 4;
    m->cm_units = malloc(trie);
    m->cm_norm_len = len - 4 - trie;
    m->cm_norm = malloc(m->cm_norm_len + 1);
    if (!m->cm_units || !m->cm_norm)
        return ditd_err_set(DITD_ENOMEM, "%s: charsmap", name);
    for (size_t i = 0; i < m->cm_n_units; i++) {
        const unsigned char *u = cm + 4 + 4 * i;
        m->cm_units[i] = (uint32_t)u[0] | (uint32_t)u[1] << 8 | (uint32_t)u[2] << 16 | (uint32_t)u[3] << 24;
    }
    memcpy(m->cm_norm, cm + 4 + trie, m->cm_norm_len);
    m->cm_norm[m->cm_norm_len] = '\0';
    return 0;
}

/* darts-clone units */
static uint32_t u_offset(uint32_t u) { return (u >> 10) << ((u & (1u << 9)) >> 6); }
static uint32_t u_label(uint32_t u) { return u & ((1u << 31) | 0xFF); }
static int u_has_leaf(uint32_t u) { return (u >> 8) & 1; }
static uint32_t u_value(uint32_t u) { return u & ((1u << 31) - 1); }

/* The replacement of the SHORTEST key that prefixes s (what tokenizers'
 * Precompiled::transform takes: results[0]), or NULL. The replacement stands
 * for the whole of s, as there. A NUL byte ends the key. */
static const char *cm_transform(const ditd__t5 *m, const unsigned char *s, size_t n, size_t *out_len)
{
    if (!m->cm_units || m->cm_n_units == 0)
        return NULL;
    size_t pos = u_offset(m->cm_units[0]);
    for (size_t i = 0; i < n; i++) {
        if (s[i] == 0)
            return NULL;
        pos ^= s[i];
        if (pos >= m->cm_n_units)
            return NULL;
        uint32_t u = m->cm_units[pos];
        if (u_label(u) != s[i])
            return NULL;
        pos ^= u_offset(u);
        if (u_has_leaf(u)) {
            if (pos >= m->cm_n_units)
                return NULL;
            size_t v = u_value(m->cm_units[pos]);
            if (v >= m->cm_norm_len)
                return NULL;
            *out_len = strlen(m->cm_norm + v);
            return m->cm_norm + v;
        }
    }
    return NULL;
}

int ditd__t5_normalize(const ditd__t5 *m, const char *s, size_t n, ditd__buf *out)
{
    int err = 0;
    size_t i = 0;
    while (i < n) {
        /* one extended grapheme cluster [i, j) */
        int32_t prev, cp;
        utf8proc_int32_t state = 0;
        size_t j = i + (size_t)ditd__utf8_next(s + i, n - i, &prev);
        while (j < n) {
            int l = ditd__utf8_next(s + j, n - j, &cp);
            if (utf8proc_grapheme_break_stateful(prev, cp, &state))
                break;
            prev = cp;
            j += (size_t)l;
        }
        size_t rl;
        const char *r = j - i < 6 ? cm_transform(m, (const unsigned char *)s + i, j - i, &rl) : NULL;
        if (r) {
            if ((err = ditd__buf_put(out, r, rl)))
                return err;
        } else {
            for (size_t k = i; k < j;) {
                int32_t c;
                int l = ditd__utf8_next(s + k, j - k, &c);
                r = cm_transform(m, (const unsigned char *)s + k, (size_t)l, &rl);
                if ((err = r ? ditd__buf_put(out, r, rl) : ditd__buf_put(out, s + k, (size_t)l)))
                    return err;
                k += (size_t)l;
            }
        }
        i = j;
    }
    return 0;
}

/* --- pieces */
static int t5_new(size_t expect, ditd__t5 **out)
{
    ditd__t5 *m = calloc(1, sizeof(*m));
    if (!m)
        return ditd_err_set(DITD_ENOMEM, "T5 tokenizer");
    int err = ditd__vocab_init(&m->vocab, expect);
    if (!err)
        err = ditd__pairmap_init(&m->trie, 8 * expect);
    m->score = malloc((expect + 1) * sizeof(*m->score));
    m->term_cap = 1024;
    m->term = malloc(m->term_cap * sizeof(*m->term));
    if (!err && (!m->score || !m->term))
        err = ditd_err_set(DITD_ENOMEM, "T5 tokenizer of %zu pieces", expect);
    if (err) {
        ditd__t5_free(m);
        return err;
    }
    m->n_nodes = 1;
    m->term[0] = -1;
    m->unk_id = -1;
    *out = m;
    return 0;
}

static int add_piece(ditd__t5 *m, const char *p, size_t len, double score, size_t cap, const char *name)
{
    int32_t id = m->n_pieces;
    if ((size_t)id >= cap)
        return ditd_err_set(DITD_EINTERNAL, "%s: piece table overflow", name);
    /* An empty piece (google/umt5's vocabulary has two) keeps its id and
     * score (the unknown score counts it, as tokenizers' Unigram does) but
     * matches nothing: it stays out of the trie. */
    if (len > 0 && ditd__utf8_check(p, len) >= 0)
        return ditd_err_set(DITD_EFORMAT, "%s: piece %d is not UTF-8", name, id);
    if (!isfinite(score))
        return ditd_err_set(DITD_EFORMAT, "%s: piece %d has a score that is not finite", name, id);
    int r = ditd__vocab_put(&m->vocab, p, len, id);
    if (r < 0)
        return r;
    m->score[id] = score;
    m->n_pieces++;
    if (r == 1 || len == 0)
        return 0; /* a repeated piece: the trie keeps the first; an empty one: none */
    size_t node = 0;
    for (size_t i = 0; i < len; i++) {
        uint64_t key = ((uint64_t)node << 8) | (unsigned char)p[i];
        const struct ditd__pair_ent *e = ditd__pairmap_get(&m->trie, key);
        if (e) {
            node = (size_t)e->v1;
            continue;
        }
        if (m->n_nodes == m->term_cap) {
            void *q = realloc(m->term, 2 * m->term_cap * sizeof(*m->term));
            if (!q)
                return ditd_err_set(DITD_ENOMEM, "%s: piece trie", name);
            m->term = q;
            m->term_cap *= 2;
        }
        if (m->n_nodes >= INT32_MAX)
            return ditd_err_set(DITD_ERANGE, "%s: piece trie too large", name);
        int err = ditd__pairmap_put(&m->trie, key, (int32_t)m->n_nodes, 0);
        if (err < 0)
            return err;
        m->term[m->n_nodes] = -1;
        node = m->n_nodes++;
    }
    if (m->term[node] < 0)
        m->term[node] = id;
    return 0;
}

/* The unknown id transformers 5's T5Tokenizer gives its Unigram model. */
#define TF5_T5_UNK_ID 2

static int t5_finish(ditd__t5 *m, int64_t unk_id, const char *name)
{
    if (m->n_pieces == 0)
        return ditd_err_set(DITD_EFORMAT, "%s: no pieces", name);
    if (unk_id >= m->n_pieces)
        return ditd_err_set(DITD_EFORMAT, "%s: unk_id %lld is past the %d pieces", name, (long long)unk_id,
                            m->n_pieces);
    m->unk_id = unk_id < 0 ? -1 : (int32_t)unk_id;
    double mn = INFINITY;
    for (int32_t i = 0; i < m->n_pieces; i++)
        if (m->score[i] < mn)
            mn = m->score[i];
    m->unk_score = mn - K_UNK_PENALTY;
    return ditd__vocab_index(&m->vocab);
}

static int b64_value(unsigned char c)
{
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
}

static size_t b64_decode(const char *s, size_t n, unsigned char *out, int *ok)
{
    size_t o = 0;
    uint32_t acc = 0;
    int bits = 0;
    *ok = 1;
    for (size_t i = 0; i < n; i++) {
        if (s[i] == '=')
            break;
        int v = b64_value((unsigned char)s[i]);
        if (v < 0) {
            *ok = 0;
            return 0;
        }
        acc = (acc << 6) | (uint32_t)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            out[o++] = (unsigned char)(acc >> bits);
        }
    }
    return o;
}

static const json_t *find_precompiled(const json_t *norm)
{
    if (!json_is_object(norm))
        return NULL;
    const char *t = json_string_value(json_object_get(norm, "type"));
    if (t && strcmp(t, "Precompiled") == 0)
        return json_object_get(norm, "precompiled_charsmap");
    if (t && strcmp(t, "Sequence") == 0) {
        const json_t *seq = json_object_get(norm, "normalizers");
        for (size_t i = 0; i < json_array_size(seq); i++) {
            const json_t *r = find_precompiled(json_array_get(seq, i));
            if (r)
                return r;
        }
    }
    return NULL;
}

int ditd__t5_load_json(const json_t *model, const json_t *normalizer, const char *name, ditd__t5 **out)
{
    const json_t *vocab = json_object_get(model, "vocab");
    if (!json_is_array(vocab) || json_array_size(vocab) == 0)
        return ditd_err_set(DITD_EFORMAT, "%s: model.vocab is not a list of [piece, score]", name);
    const json_t *bf = json_object_get(model, "byte_fallback");
    if (json_is_true(bf))
        return ditd_err_set(DITD_EUNSUPPORTED, "%s: unigram byte_fallback is not supported", name);
    size_t n = json_array_size(vocab);
    ditd__t5 *m = NULL;
    unsigned char *cm = NULL;
    int err = t5_new(n, &m);
    if (err)
        return err;
    for (size_t i = 0; i < n; i++) {
        const json_t *e = json_array_get(vocab, i);
        const json_t *p = json_array_get(e, 0), *sc = json_array_get(e, 1);
        if (!json_is_array(e) || json_array_size(e) != 2 || !json_is_string(p) || !json_is_number(sc)) {
            err = ditd_err_set(DITD_EFORMAT, "%s: model.vocab[%zu] is not [piece, score]", name, i);
            goto fail;
        }
        if ((err = add_piece(m, json_string_value(p), json_string_length(p), json_number_value(sc), n, name)))
            goto fail;
    }
    const json_t *unk = json_object_get(model, "unk_id");
    if (unk && !json_is_null(unk) && !json_is_integer(unk)) {
        err = ditd_err_set(DITD_EFORMAT, "%s: model.unk_id is not an integer", name);
        goto fail;
    }
    /* transformers 5's T5Tokenizer builds its Unigram with unk_id=2 whatever
     * the file says (google/umt5's says 3, "<unk>"; id 2 is "<s>"): unknown
     * characters become id 2 there, and so here (docs/text.md) */
    (void)unk;
    if ((err = t5_finish(m, TF5_T5_UNK_ID, name)))
        goto fail;
    const json_t *pc = find_precompiled(normalizer);
    if (pc) {
        if (!json_is_string(pc)) {
            err = ditd_err_set(DITD_EFORMAT, "%s: precompiled_charsmap is not a string", name);
            goto fail;
        }
        size_t l = json_string_length(pc);
        cm = malloc(l / 4 * 3 + 4);
        if (!cm) {
            err = ditd_err_set(DITD_ENOMEM, "%s: charsmap", name);
            goto fail;
        }
        int ok;
        size_t cl = b64_decode(json_string_value(pc), l, cm, &ok);
        if (!ok) {
            err = ditd_err_set(DITD_EFORMAT, "%s: precompiled_charsmap is not base64", name);
            goto fail;
        }
        if (cl > 0 && (err = set_charsmap(m, cm, cl, name)))
            goto fail;
    }
    free(cm);
    *out = m;
    return 0;
fail:
    free(cm);
    ditd__t5_free(m);
    return err;
}

int ditd__t5_load_spm(const void *data, size_t len, const char *name, int extra_ids, ditd__t5 **out)
{
    if (extra_ids < 0 || extra_ids > 100000)
        return ditd_err_set(DITD_ERANGE, "%s: extra_ids %d", name, extra_ids);
    DitdSpm__ModelProto *mp = ditd_spm__model_proto__unpack(NULL, len, data);
    if (!mp)
        return ditd_err_set(DITD_EFORMAT, "%s: not a SentencePiece model (protobuf does not parse)", name);
    ditd__t5 *m = NULL;
    int err = 0;
    const DitdSpm__TrainerSpec *ts = mp->trainer_spec;
    if (ts && ts->has_model_type && ts->model_type != DITD_SPM__TRAINER_SPEC__MODEL_TYPE__UNIGRAM) {
        err = ditd_err_set(DITD_EUNSUPPORTED, "%s: model_type %d; only UNIGRAM (1) is supported", name,
                           (int)ts->model_type);
        goto fail;
    }
    if (ts && ts->byte_fallback) {
        err = ditd_err_set(DITD_EUNSUPPORTED, "%s: byte_fallback is not supported", name);
        goto fail;
    }
    if (mp->n_pieces == 0) {
        err = ditd_err_set(DITD_EFORMAT, "%s: no pieces", name);
        goto fail;
    }
    size_t total = mp->n_pieces + (size_t)extra_ids;
    if ((err = t5_new(total, &m)))
        goto fail;
    for (size_t i = 0; i < mp->n_pieces; i++) {
        const char *p = mp->pieces[i]->piece;
        if (!p) {
            err = ditd_err_set(DITD_EFORMAT, "%s: piece %zu has no text", name, i);
            goto fail;
        }
        if ((err = add_piece(m, p, strlen(p), (double)mp->pieces[i]->score, total, name)))
            goto fail;
    }
    for (int i = extra_ids - 1; i >= 0; i--) {
        char s[32];
        int k = snprintf(s, sizeof(s), "<extra_id_%d>", i);
        if ((err = add_piece(m, s, (size_t)k, 0.0, total, name)))
            goto fail;
    }
    /* the file's unk_id is ignored as in ditd__t5_load_json */
    if ((err = t5_finish(m, TF5_T5_UNK_ID, name)))
        goto fail;
    const DitdSpm__NormalizerSpec *ns = mp->normalizer_spec;
    if (ns && ns->has_precompiled_charsmap && ns->precompiled_charsmap.len > 0)
        if ((err = set_charsmap(m, ns->precompiled_charsmap.data, ns->precompiled_charsmap.len, name)))
            goto fail;
    ditd_spm__model_proto__free_unpacked(mp, NULL);
    *out = m;
    return 0;
fail:
    ditd_spm__model_proto__free_unpacked(mp, NULL);
    ditd__t5_free(m);
    return err;
}

void ditd__t5_free(ditd__t5 *m)
{
    if (!m)
        return;
    ditd__vocab_free(&m->vocab);
    ditd__pairmap_free(&m->trie);
    free(m->score);
    free(m->term);
    free(m->cm_units);
    free(m->cm_norm);
    free(m);
}

const ditd__vocab *ditd__t5_vocab(const ditd__t5 *m) { return &m->vocab; }
int32_t ditd__t5_unk_id(const ditd__t5 *m) { return m->unk_id; }

/* --- Viterbi over one piece, as tokenizers' Unigram::encode_optimized */
typedef struct node { double score; int64_t start; int32_t id; } node;
typedef struct vscratch { node *best; size_t cap; } vscratch;

static int viterbi(const ditd__t5 *m, const char *p, size_t n, vscratch *vs, ditd__ids *ids)
{
    if (n + 1 > vs->cap) {
        free(vs->best);
        vs->cap = n + 1 < 256 ? 256 : n + 1;
        vs->best = malloc(vs->cap * sizeof(*vs->best));
        if (!vs->best) {
            vs->cap = 0;
            return ditd_err_set(DITD_ENOMEM, "Viterbi lattice of %zu bytes", n);
        }
    }
    node *best = vs->best;
    for (size_t i = 0; i <= n; i++)
        best[i] = (node){0.0, -1, -1};
    for (size_t st = 0; st < n;) {
        double base = best[st].score;
        int32_t cp;
        size_t mblen = (size_t)ditd__utf8_next(p + st, n - st, &cp);
        int single = 0;
        size_t nd = 0;
        for (size_t k = st; k < n; k++) {
            const struct ditd__pair_ent *e = ditd__pairmap_get(&m->trie, ((uint64_t)nd << 8) | (unsigned char)p[k]);
            if (!e)
                break;
            nd = (size_t)e->v1;
            int32_t id = m->term[nd];
            if (id < 0)
                continue;
            size_t kp = k + 1;
            double cand = m->score[id] + base;
            if (best[kp].start < 0 || cand > best[kp].score)
                best[kp] = (node){cand, (int64_t)st, id};
            if (kp - st == mblen)
                single = 1;
        }
        if (!single) {
            if (m->unk_id < 0)
                return ditd_err_set(DITD_EINVAL, "a character has no piece and the model has no unknown token");
            size_t kp = st + mblen;
            double cand = m->unk_score + base;
            if (best[kp].start < 0 || cand > best[kp].score)
                best[kp] = (node){cand, (int64_t)st, m->unk_id};
        }
        st += mblen;
    }
    /* backtrack into (start, end, id) triples, reusing the lattice's tail:
     * count first, then fill from the right */
    size_t count = 0;
    for (size_t e = n; e > 0; e = (size_t)best[e].start)
        count++;
    int32_t stackbuf[128];
    size_t *bounds = NULL;
    int32_t *tid = count <= 64 ? stackbuf : NULL;
    size_t sbounds[65];
    bounds = count <= 64 ? sbounds : malloc((count + 1) * sizeof(*bounds));
    if (!tid)
        tid = malloc(count * sizeof(*tid));
    if (!bounds || !tid) {
        if (bounds != sbounds)
            free(bounds);
        if (tid != stackbuf)
            free(tid);
        return ditd_err_set(DITD_ENOMEM, "Viterbi path of %zu tokens", count);
    }
    size_t c = count;
    bounds[count] = n;
    for (size_t e = n; e > 0; e = (size_t)best[e].start) {
        c--;
        bounds[c] = (size_t)best[e].start;
        tid[c] = best[e].id;
    }
    for (size_t i = 0; i < count && !ditd__ids_full(ids);) {
        if (m->unk_id >= 0 && tid[i] == m->unk_id) { /* fuse a run of unknowns */
            size_t j = i;
            while (j + 1 < count && tid[j + 1] == m->unk_id)
                j++;
            int32_t id = ditd__vocab_get(&m->vocab, p + bounds[i], bounds[j + 1] - bounds[i]);
            ditd__ids_push(ids, id >= 0 ? id : m->unk_id);
            i = j + 1;
        } else {
            int32_t id = ditd__vocab_get(&m->vocab, p + bounds[i], bounds[i + 1] - bounds[i]);
            ditd__ids_push(ids, id >= 0 ? id : tid[i]);
            i++;
        }
    }
    if (bounds != sbounds)
        free(bounds);
    if (tid != stackbuf)
        free(tid);
    return 0;
}

int ditd__t5_encode(const ditd__t5 *m, const char *s, size_t n, ditd__ids *ids)
{
    vscratch vs = {0};
    ditd__buf piece = {0};
    int err = 0;
    size_t i = 0;
    while (i < n && !ditd__ids_full(ids)) {
        int32_t cp;
        int l = ditd__utf8_next(s + i, n - i, &cp);
        if (ditd__uc_is_space(cp)) {
            i += (size_t)l;
            continue;
        }
        size_t j = i; /* the word [i, j) */
        while (j < n) {
            l = ditd__utf8_next(s + j, n - j, &cp);
            if (ditd__uc_is_space(cp))
                break;
            j += (size_t)l;
        }
        /* Metaspace: U+2581 before the word unless it starts with one,
         * then a new piece before every U+2581 */
        piece.n = 0;
        if (!(j - i >= 3 && memcmp(s + i, META, 3) == 0))
            err = ditd__buf_put(&piece, META, 3);
        if (!err)
            err = ditd__buf_put(&piece, s + i, j - i);
        for (size_t a = 0; !err && a < piece.n && !ditd__ids_full(ids);) {
            size_t b = a + 3;
            while (b < piece.n && !(piece.n - b >= 3 && memcmp(piece.p + b, META, 3) == 0))
                b++;
            err = viterbi(m, piece.p + a, b - a, &vs, ids);
            a = b;
        }
        if (err)
            goto done;
        i = j;
    }
done:
    free(vs.best);
    ditd__buf_free(&piece);
    return err;
}
