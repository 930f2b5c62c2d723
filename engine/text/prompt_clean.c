/* Python's html.unescape and WanPipeline's prompt_clean. */
#include "engine/text/prompt_clean.h"

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

/* Unicode White_Space: what \s matches in the `regex` module that
 * pipeline_wan.py imports as re (not U+001C..U+001F, which the standard
 * library's re and str.isspace also take). */
static int ws_space(uint32_t c)
{
    return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
           c == 0x205F || c == 0x3000;
}

/* Python's str.isspace, which str.strip() takes: White_Space plus the
 * separators U+001C..U+001F. */
static int py_space(uint32_t c) { return ws_space(c) || (c >= 0x1C && c <= 0x1F); }

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
    // whitespace_clean: regex.sub(r"\s+", " ", text).strip(). Both strips
    // take str.isspace; the collapse only turns runs of White_Space into one
    // space, so stripping once at the end gives the same text.
    const unsigned char *s = (const unsigned char *)(b.p ? b.p : "");
    size_t first = 0, last = 0; /* [first, last): the text past the strip, in b */
    int seen = 0;
    for (size_t i = 0; i < b.n;) {
        uint32_t cp;
        size_t k = utf8_next(s, i, b.n, &cp);
        if (!py_space(cp)) {
            if (!seen)
                first = i;
            seen = 1;
            last = i + k;
        }
        i += k;
    }
    for (size_t i = first; i < last;) {
        uint32_t cp;
        size_t k = utf8_next(s, i, last, &cp);
        if (ws_space(cp)) {
            size_t j = i + k;
            while (j < last && (k = utf8_next(s, j, last, &cp)) && ws_space(cp))
                j += k;
            put(&c, " ", 1);
            i = j;
        } else {
            put(&c, s + i, k);
            i += k;
        }
    }
    free(b.p);
    return finish(&c, out, out_len);
}
