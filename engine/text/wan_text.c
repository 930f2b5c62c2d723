/* WanPipeline's prompt_clean and _get_t5_prompt_embeds. */
#include "engine/text/wan_text.h"

#include <stdlib.h>
#include <string.h>

#include "engine/core/error.h"
#include "engine/text/html_entities.h"

/* ---- a growing byte buffer ---- */

typedef struct wbuf {
    char *p;
    size_t n, cap;
    int oom;
} wbuf;

static void put(wbuf *b, const void *s, size_t n)
{
    if (b->oom)
        return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->n + n + 1)
            cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
}

static void put_cp(wbuf *b, uint32_t c)
{
    char u[4];
    size_t n;
    if (c < 0x80) {
        u[0] = (char)c;
        n = 1;
    } else if (c < 0x800) {
        u[0] = (char)(0xC0 | (c >> 6));
        u[1] = (char)(0x80 | (c & 0x3F));
        n = 2;
    } else if (c < 0x10000) {
        u[0] = (char)(0xE0 | (c >> 12));
        u[1] = (char)(0x80 | ((c >> 6) & 0x3F));
        u[2] = (char)(0x80 | (c & 0x3F));
        n = 3;
    } else {
        u[0] = (char)(0xF0 | (c >> 18));
        u[1] = (char)(0x80 | ((c >> 12) & 0x3F));
        u[2] = (char)(0x80 | ((c >> 6) & 0x3F));
        u[3] = (char)(0x80 | (c & 0x3F));
        n = 4;
    }
    put(b, u, n);
}

static int finish(wbuf *b, char **out, size_t *out_len)
{
    if (!b->oom && !b->p)
        put(b, "", 0);
    if (b->oom) {
        free(b->p);
        return ditd_err_set(DITD_ENOMEM, "prompt text: out of memory");
    }
    *out = b->p;
    *out_len = b->n;
    return 0;
}

/* One code point of valid UTF-8 at s[i..n): its length, or 0 if invalid
 * (overlong forms, surrogates and values past U+10FFFF included). */
static size_t utf8_next(const unsigned char *s, size_t i, size_t n, uint32_t *cp)
{
    unsigned c = s[i];
    size_t len;
    uint32_t v, min;
    if (c < 0x80) {
        *cp = c;
        return 1;
    } else if ((c & 0xE0) == 0xC0) {
        len = 2, v = c & 0x1F, min = 0x80;
    } else if ((c & 0xF0) == 0xE0) {
        len = 3, v = c & 0x0F, min = 0x800;
    } else if ((c & 0xF8) == 0xF0) {
        len = 4, v = c & 0x07, min = 0x10000;
    } else {
        return 0;
    }
    if (n - i < len)
        return 0;
    for (size_t k = 1; k < len; k++) {
        if ((s[i + k] & 0xC0) != 0x80)
            return 0;
        v = (v << 6) | (s[i + k] & 0x3F);
    }
    if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF))
        return 0;
    *cp = v;
    return len;
}

static int check_utf8(const char *text, size_t len)
{
    uint32_t cp;
    for (size_t i = 0; i < len;) {
        size_t k = utf8_next((const unsigned char *)text, i, len, &cp);
        if (!k)
            return ditd_err_set(DITD_EINVAL, "prompt: invalid UTF-8 at byte %zu", i);
        i += k;
    }
    return 0;
}

/* ---- html.unescape ---- */

static const char *entity(const char *name, size_t n)
{
    size_t lo = 0, hi = DITD__HTML_ENTITY_COUNT;
    if (n > DITD__HTML_ENTITY_MAX_NAME)
        return NULL;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        const char *e = ditd__html_entities[mid].name;
        size_t en = strlen(e);
        int c = memcmp(e, name, en < n ? en : n);
        if (c == 0)
            c = en < n ? -1 : (en > n ? 1 : 0);
        if (c == 0)
            return ditd__html_entities[mid].utf8;
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

/* html._replace_charref for a number (saturated past U+10FFFF). */
static void charref(wbuf *b, uint64_t num)
{
    size_t ni = sizeof ditd__html_invalid_charrefs / sizeof ditd__html_invalid_charrefs[0];
    size_t nc = sizeof ditd__html_invalid_codepoints / sizeof ditd__html_invalid_codepoints[0];
    for (size_t i = 0; i < ni; i++)
        if (ditd__html_invalid_charrefs[i][0] == num) {
            put_cp(b, ditd__html_invalid_charrefs[i][1]);
            return;
        }
    if ((num >= 0xD800 && num <= 0xDFFF) || num > 0x10FFFF) {
        put_cp(b, 0xFFFD);
        return;
    }
    for (size_t i = 0; i < nc; i++)
        if (ditd__html_invalid_codepoints[i] == num)
            return;
    put_cp(b, (uint32_t)num);
}

static int is_digit(unsigned char c) { return c >= '0' && c <= '9'; }

static int hex_value(unsigned char c)
{
    if (is_digit(c))
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* Python's html._charref: &(#[0-9]+;?|#[xX][0-9a-fA-F]+;?|[^\t\n\f <&#;]{1,32};?)
 * at s[i] == '&', replaced as _replace_charref does; returns the bytes
 * consumed (1 when nothing matches: the '&' is kept). s is valid UTF-8. */
static size_t one_ref(wbuf *b, const unsigned char *s, size_t i, size_t n)
{
    size_t j = i + 1;
    if (j < n && s[j] == '#') {
        size_t k = j + 1;
        int hex = k < n && (s[k] == 'x' || s[k] == 'X');
        size_t d = hex ? k + 1 : k, e = d;
        uint64_t num = 0;
        while (e < n && (hex ? hex_value(s[e]) >= 0 : is_digit(s[e]))) {
            num = num * (hex ? 16 : 10) + (uint64_t)(hex ? hex_value(s[e]) : s[e] - '0');
            if (num > 0x10FFFF)
                num = 0x110000; /* saturate: past the last code point either way */
            e++;
        }
        if (e == d) { /* "&#" without digits: no match */
            put(b, "&", 1);
            return 1;
        }
        charref(b, num);
        return e + (e < n && s[e] == ';') - i;
    }
    size_t e = j;
    int cps = 0;
    while (e < n && cps < 32) {
        uint32_t cp;
        size_t k = utf8_next(s, e, n, &cp);
        if (cp == '\t' || cp == '\n' || cp == '\f' || cp == ' ' || cp == '<' || cp == '&' ||
            cp == '#' || cp == ';')
            break;
        e += k;
        cps++;
    }
    if (cps == 0) {
        put(b, "&", 1);
        return 1;
    }
    size_t end = e + (e < n && s[e] == ';');
    const char *name = (const char *)s + j;
    size_t len = end - j;
    const char *v = entity(name, len);
    if (v) {
        put(b, v, strlen(v));
        return end - i;
    }
    /* the longest prefix that is a name (names are ASCII, so a byte prefix) */
    for (size_t x = len - 1; x >= 2 && x < len; x--) {
        v = entity(name, x);
        if (v) {
            put(b, v, strlen(v));
            put(b, name + x, len - x);
            return end - i;
        }
    }
    put(b, "&", 1);
    put(b, name, len);
    return end - i;
}

static void unescape_into(wbuf *b, const char *text, size_t len)
{
    const unsigned char *s = (const unsigned char *)text;
    size_t i = 0;
    while (i < len) {
        const unsigned char *amp = memchr(s + i, '&', len - i);
        size_t stop = amp ? (size_t)(amp - s) : len;
        put(b, s + i, stop - i);
        i = stop;
        if (i < len)
            i += one_ref(b, s, i, len);
    }
}

int ditd_html_unescape(const char *text, size_t len, char **out, size_t *out_len)
{
    wbuf b = {0};
    int err = check_utf8(text, len);
    if (err)
        return err;
    unescape_into(&b, text, len);
    return finish(&b, out, out_len);
}

/* ---- whitespace ---- */

/* Python's str.isspace (Unicode White_Space plus the separators
 * U+001C..U+001F), which is what re's \s and str.strip() take. */
static int py_space(uint32_t c)
{
    return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
           c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 ||
           c == 0x202F || c == 0x205F || c == 0x3000;
}

int ditd_wan_prompt_clean(const char *text, size_t len, char **out, size_t *out_len)
{
    wbuf a = {0}, b = {0}, c = {0};
    int err = check_utf8(text, len);
    if (err)
        return err;
    // basic_clean: html.unescape(html.unescape(text)).strip() (no ftfy)
    unescape_into(&a, text, len);
    if (!a.oom)
        unescape_into(&b, a.p ? a.p : "", a.n);
    free(a.p);
    if (b.oom) {
        free(b.p);
        return ditd_err_set(DITD_ENOMEM, "prompt text: out of memory");
    }
    // whitespace_clean: re.sub(r"\s+", " ", text).strip(); the strip of
    // basic_clean before it changes nothing the second strip does not
    const unsigned char *s = (const unsigned char *)(b.p ? b.p : "");
    int pending = 0;
    for (size_t i = 0; i < b.n;) {
        uint32_t cp;
        size_t k = utf8_next(s, i, b.n, &cp);
        if (py_space(cp)) {
            pending = c.n > 0;
        } else {
            if (pending)
                put(&c, " ", 1);
            pending = 0;
            put(&c, s + i, k);
        }
        i += k;
    }
    free(b.p);
    return finish(&c, out, out_len);
}

/* ---- the embeddings ---- */

int ditd_wan_text_encode(ditd_t5_encoder *m, int B, int N, const int64_t *ids, const uint8_t *keep,
                         float *out)
{
    if (!keep)
        return ditd_err_set(DITD_EINVAL, "Wan text encode: the attention mask is required");
    for (int b = 0; b < B; b++)
        for (int t = 1; t < N; t++)
            if (keep[(size_t)b * N + t] && !keep[(size_t)b * N + t - 1])
                return ditd_err_set(DITD_EINVAL, "Wan text encode: row %d's mask has a 1 at %d after "
                                                 "a 0 (the tokenizer pads at the end)",
                                    b, t);
    int err = ditd_t5_encoder_encode(m, B, N, ids, keep, out);
    if (err)
        return err;
    // pipeline_wan.py: u[:seq_len], then zeros up to max_sequence_length
    const size_t D = (size_t)ditd_t5_encoder_config_of(m)->d_model;
    for (size_t i = 0; i < (size_t)B * (size_t)N; i++)
        if (!keep[i])
            memset(out + i * D, 0, D * sizeof(float));
    return 0;
}

int ditd_wan_prompt_embeds(ditd_t5_encoder *m, const ditd_tokenizer *tok, int B,
                           const char *const *prompts, int max_len, float *out, int *seq_lens)
{
    if (B <= 0 || max_len <= 0)
        return ditd_err_set(DITD_EINVAL, "Wan prompt embeds: %d prompts, max_sequence_length %d", B,
                            max_len);
    const size_t BN = (size_t)B * (size_t)max_len;
    int32_t *ids32 = malloc(BN * sizeof *ids32), *mask32 = malloc(BN * sizeof *mask32);
    int64_t *ids = malloc(BN * sizeof *ids);
    uint8_t *keep = malloc(BN);
    int err = 0;
    if (!ids32 || !mask32 || !ids || !keep) {
        err = ditd_err_set(DITD_ENOMEM, "Wan prompt embeds: %d x %d tokens", B, max_len);
        goto fail;
    }
    for (int b = 0; b < B; b++) {
        char *clean = NULL;
        size_t clen = 0;
        int nt = 0;
        if ((err = ditd_wan_prompt_clean(prompts[b], strlen(prompts[b]), &clean, &clen)))
            goto fail;
        err = ditd_tokenizer_encode(tok, clean, clen, max_len, ids32 + (size_t)b * max_len,
                                    mask32 + (size_t)b * max_len, &nt);
        free(clean);
        if (err)
            goto fail;
        if (seq_lens)
            seq_lens[b] = nt;
    }
    for (size_t i = 0; i < BN; i++) {
        ids[i] = ids32[i];
        keep[i] = mask32[i] != 0;
    }
    err = ditd_wan_text_encode(m, B, max_len, ids, keep, out);
fail:
    free(ids32);
    free(mask32);
    free(ids);
    free(keep);
    return err;
}
