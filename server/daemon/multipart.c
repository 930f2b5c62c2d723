/* multipart/form-data over an in-memory body: delimiter search with memmem,
 * one header block per part, Content-Disposition parameters parsed by hand. */
#include "server/daemon/multipart.h"

#include <ctype.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "engine/core/error.h"

#define BOUNDARY_MAX 70

void ditd_multipart_limits_default(ditd_multipart_limits *lim)
{
    lim->max_parts = DITD_MULTIPART_MAX_PARTS_DEFAULT;
    lim->max_header_bytes = DITD_MULTIPART_MAX_HEADER_DEFAULT;
    lim->max_part_bytes = DITD_MULTIPART_MAX_PART_DEFAULT;
}

/* RFC 2046 bchars (the boundary's alphabet) */
static int is_bchar(int c)
{
    return isalnum(c) || strchr("'()+_,-./:=? ", c) != NULL;
}

int ditd_multipart_boundary(const char *ct, char *out, size_t cap)
{
    static const char type[] = "multipart/form-data";
    if (!ct)
        return ditd_err_set(DITD_EINVAL, "multipart: no Content-Type");
    while (*ct == ' ' || *ct == '\t')
        ct++;
    if (strncasecmp(ct, type, sizeof type - 1) != 0 ||
        (ct[sizeof type - 1] && ct[sizeof type - 1] != ';' && ct[sizeof type - 1] != ' '))
        return ditd_err_set(DITD_EINVAL, "multipart: Content-Type is not multipart/form-data");
    const char *p = ct + sizeof type - 1;
    while (*p) {
        while (*p == ';' || *p == ' ' || *p == '\t')
            p++;
        const char *key = p;
        while (*p && *p != '=' && *p != ';')
            p++;
        size_t klen = (size_t)(p - key);
        while (klen && (key[klen - 1] == ' ' || key[klen - 1] == '\t'))
            klen--;
        if (*p != '=') {
            continue;
        }
        p++;
        while (*p == ' ' || *p == '\t')
            p++;
        char val[BOUNDARY_MAX + 2];
        size_t vlen = 0;
        int too_long = 0;
        if (*p == '"') {
            p++;
            while (*p && *p != '"') {
                if (*p == '\\' && p[1])
                    p++;
                if (vlen < BOUNDARY_MAX + 1)
                    val[vlen++] = *p;
                else
                    too_long = 1;
                p++;
            }
            if (*p != '"')
                return ditd_err_set(DITD_EINVAL, "multipart: unterminated quoted parameter in Content-Type");
            p++;
        } else {
            while (*p && *p != ';' && *p != ' ' && *p != '\t') {
                if (vlen < BOUNDARY_MAX + 1)
                    val[vlen++] = *p;
                else
                    too_long = 1;
                p++;
            }
        }
        val[vlen] = '\0';
        if (klen == 8 && strncasecmp(key, "boundary", 8) == 0) {
            if (vlen == 0)
                return ditd_err_set(DITD_EINVAL, "multipart: empty boundary in Content-Type");
            if (too_long || vlen > BOUNDARY_MAX)
                return ditd_err_set(DITD_EINVAL, "multipart: boundary longer than %d characters",
                                    BOUNDARY_MAX);
            for (size_t i = 0; i < vlen; i++)
                if (!is_bchar((unsigned char)val[i]))
                    return ditd_err_set(DITD_EINVAL,
                                        "multipart: boundary has a character not allowed (0x%02x)",
                                        (unsigned char)val[i]);
            if (val[vlen - 1] == ' ')
                return ditd_err_set(DITD_EINVAL, "multipart: boundary ends in a space");
            if (vlen + 1 > cap)
                return ditd_err_set(DITD_EINVAL, "multipart: boundary buffer too small");
            memcpy(out, val, vlen + 1);
            return 0;
        }
    }
    return ditd_err_set(DITD_EINVAL, "multipart: Content-Type has no boundary parameter");
}

static char *dup_n(const char *s, size_t n)
{
    char *d = malloc(n + 1);
    if (d) {
        memcpy(d, s, n);
        d[n] = '\0';
    }
    return d;
}

/* One parameter value of Content-Disposition: quoted-string (with \ escapes)
 * or token; *pp advanced past it. NULL with *bad set on a malformed value. */
static char *param_value(const char **pp, const char *end, int *bad)
{
    const char *p = *pp;
    char *v;
    if (p < end && *p == '"') {
        p++;
        v = malloc((size_t)(end - p) + 1);
        if (!v)
            return NULL;
        size_t n = 0;
        while (p < end && *p != '"') {
            if (*p == '\\' && p + 1 < end)
                p++;
            v[n++] = *p++;
        }
        if (p >= end) {
            free(v);
            *bad = 1;
            return NULL;
        }
        p++;
        v[n] = '\0';
    } else {
        const char *s = p;
        while (p < end && *p != ';' && *p != ' ' && *p != '\t')
            p++;
        v = dup_n(s, (size_t)(p - s));
    }
    *pp = p;
    return v;
}

/* Content-Disposition: form-data; name="..."; filename="..." */
static int parse_disposition(const char *p, const char *end, int idx, ditd_multipart_part *part)
{
    while (p < end && (*p == ' ' || *p == '\t'))
        p++;
    if ((size_t)(end - p) < 9 || strncasecmp(p, "form-data", 9) != 0 ||
        (p + 9 < end && p[9] != ';' && p[9] != ' ' && p[9] != '\t'))
        return ditd_err_set(DITD_EINVAL, "multipart: part %d: Content-Disposition is not form-data",
                            idx);
    p += 9;
    while (p < end) {
        while (p < end && (*p == ';' || *p == ' ' || *p == '\t'))
            p++;
        if (p >= end)
            break;
        const char *key = p;
        while (p < end && *p != '=' && *p != ';')
            p++;
        size_t klen = (size_t)(p - key);
        while (klen && (key[klen - 1] == ' ' || key[klen - 1] == '\t'))
            klen--;
        if (p >= end || *p != '=')
            continue; /* a bare token: nothing of ours */
        p++;
        while (p < end && (*p == ' ' || *p == '\t'))
            p++;
        int bad = 0;
        char *v = param_value(&p, end, &bad);
        if (!v)
            return bad ? ditd_err_set(DITD_EINVAL,
                                      "multipart: part %d: unterminated quoted parameter in "
                                      "Content-Disposition", idx)
                       : ditd_err_set(DITD_ENOMEM, "multipart: part %d", idx);
        char **slot = NULL;
        if (klen == 4 && strncasecmp(key, "name", 4) == 0)
            slot = &part->name;
        else if (klen == 8 && strncasecmp(key, "filename", 8) == 0)
            slot = &part->filename;
        if (slot && *slot) {
            free(v);
            return ditd_err_set(DITD_EINVAL, "multipart: part %d: %.*s given twice", idx,
                                (int)klen, key);
        }
        if (slot)
            *slot = v;
        else
            free(v);
    }
    return 0;
}

/* The header block of one part: lines "Name: value" ending in CRLF. */
static int parse_headers(const char *h, size_t len, int idx, ditd_multipart_part *part)
{
    const char *p = h, *end = h + len;
    int have_disp = 0;
    while (p < end) {
        const char *eol = memmem(p, (size_t)(end - p), "\r\n", 2);
        const char *le = eol ? eol : end;
        if (le == p) { /* an empty line inside the block cannot happen: the block ends at CRLFCRLF */
            p = le + 2;
            continue;
        }
        if (*p == ' ' || *p == '\t')
            return ditd_err_set(DITD_EINVAL, "multipart: part %d: folded header lines are not accepted",
                                idx);
        const char *colon = memchr(p, ':', (size_t)(le - p));
        if (!colon)
            return ditd_err_set(DITD_EINVAL, "multipart: part %d: header line without a colon", idx);
        size_t nlen = (size_t)(colon - p);
        const char *v = colon + 1;
        while (v < le && (*v == ' ' || *v == '\t'))
            v++;
        const char *ve = le;
        while (ve > v && (ve[-1] == ' ' || ve[-1] == '\t'))
            ve--;
        for (const char *q = v; q < ve; q++)
            if (*q == '\0')
                return ditd_err_set(DITD_EINVAL, "multipart: part %d: NUL in a header", idx);
        if (nlen == 19 && strncasecmp(p, "Content-Disposition", 19) == 0) {
            if (have_disp)
                return ditd_err_set(DITD_EINVAL, "multipart: part %d: two Content-Disposition headers",
                                    idx);
            have_disp = 1;
            int rc = parse_disposition(v, ve, idx, part);
            if (rc)
                return rc;
        } else if (nlen == 12 && strncasecmp(p, "Content-Type", 12) == 0) {
            if (part->content_type)
                return ditd_err_set(DITD_EINVAL, "multipart: part %d: two Content-Type headers", idx);
            part->content_type = dup_n(v, (size_t)(ve - v));
            if (!part->content_type)
                return ditd_err_set(DITD_ENOMEM, "multipart: part %d", idx);
        } else if (nlen == 25 && strncasecmp(p, "Content-Transfer-Encoding", 25) == 0) {
            size_t vl = (size_t)(ve - v);
            if (!((vl == 4 && strncasecmp(v, "7bit", 4) == 0) ||
                  (vl == 4 && strncasecmp(v, "8bit", 4) == 0) ||
                  (vl == 6 && strncasecmp(v, "binary", 6) == 0)))
                return ditd_err_set(DITD_EINVAL,
                                    "multipart: part %d: Content-Transfer-Encoding %.*s is not accepted",
                                    idx, (int)(vl > 32 ? 32 : vl), v);
        }
        p = eol ? eol + 2 : end;
    }
    if (!have_disp)
        return ditd_err_set(DITD_EINVAL, "multipart: part %d has no Content-Disposition", idx);
    if (!part->name)
        return ditd_err_set(DITD_EINVAL, "multipart: part %d has no name", idx);
    if (!part->name[0])
        return ditd_err_set(DITD_EINVAL, "multipart: part %d has an empty name", idx);
    return 0;
}

static void part_free(ditd_multipart_part *p)
{
    free(p->name);
    free(p->filename);
    free(p->content_type);
    memset(p, 0, sizeof *p);
}

void ditd_multipart_free(ditd_multipart_form *form)
{
    if (!form)
        return;
    for (int i = 0; i < form->n_parts; i++)
        part_free(&form->parts[i]);
    free(form->parts);
    form->parts = NULL;
    form->n_parts = 0;
}

int ditd_multipart_parse(const char *content_type, const uint8_t *body, size_t len,
                         const ditd_multipart_limits *lim, ditd_multipart_form *form)
{
    ditd_multipart_limits def;
    char bnd[BOUNDARY_MAX + 1];
    char delim[BOUNDARY_MAX + 5]; /* "\r\n--" boundary */
    int rc;

    memset(form, 0, sizeof *form);
    if (!lim) {
        ditd_multipart_limits_default(&def);
        lim = &def;
    }
    if ((rc = ditd_multipart_boundary(content_type, bnd, sizeof bnd)))
        return rc;
    size_t blen = strlen(bnd);
    memcpy(delim, "\r\n--", 4);
    memcpy(delim + 4, bnd, blen);
    size_t dlen = blen + 4;
    const char *b = (const char *)body, *end = b + len;
    if (!body || len == 0)
        return ditd_err_set(DITD_EINVAL, "multipart: empty body");

    /* the first delimiter: at the very start, or after a preamble */
    const char *p;
    if (len >= dlen - 2 && memcmp(b, delim + 2, dlen - 2) == 0) {
        p = b + dlen - 2;
    } else {
        const char *f = memmem(b, len, delim, dlen);
        if (!f)
            return ditd_err_set(DITD_EINVAL, "multipart: body has no boundary line (--%s)", bnd);
        p = f + dlen;
    }
    int cap = 0;
    for (;;) {
        /* after a delimiter: "--" closes the body; else optional LWSP and CRLF */
        if (end - p >= 2 && p[0] == '-' && p[1] == '-')
            break;
        while (p < end && (*p == ' ' || *p == '\t'))
            p++;
        if (end - p < 2) {
            rc = ditd_err_set(DITD_EINVAL, "multipart: truncated body after part %d (no closing boundary)",
                              form->n_parts);
            goto fail;
        }
        if (p[0] != '\r' || p[1] != '\n') {
            rc = ditd_err_set(DITD_EINVAL, "multipart: boundary line of part %d not followed by CRLF",
                              form->n_parts);
            goto fail;
        }
        p += 2;
        int idx = form->n_parts;
        if (idx >= lim->max_parts) {
            rc = ditd_err_set(DITD_EINVAL, "multipart: more than %d parts", lim->max_parts);
            goto fail;
        }
        if (idx == cap) {
            int nc = cap ? cap * 2 : 8;
            ditd_multipart_part *np = realloc(form->parts, sizeof *np * (size_t)nc);
            if (!np) {
                rc = ditd_err_set(DITD_ENOMEM, "multipart: %d parts", nc);
                goto fail;
            }
            form->parts = np;
            cap = nc;
        }
        ditd_multipart_part *part = &form->parts[idx];
        memset(part, 0, sizeof *part);
        form->n_parts++;
        /* the header block ends at CRLFCRLF, or at CRLF at once (no headers) */
        const char *hend;
        size_t hlen;
        if (end - p >= 2 && p[0] == '\r' && p[1] == '\n') {
            hend = p;
            hlen = 0;
        } else {
            size_t look = (size_t)(end - p);
            if (look > lim->max_header_bytes + 4)
                look = lim->max_header_bytes + 4;
            hend = memmem(p, look, "\r\n\r\n", 4);
            if (!hend) {
                if ((size_t)(end - p) > lim->max_header_bytes + 4)
                    rc = ditd_err_set(DITD_EINVAL, "multipart: part %d: headers over %zu bytes", idx,
                                      lim->max_header_bytes);
                else
                    rc = ditd_err_set(DITD_EINVAL, "multipart: truncated body in the headers of part %d",
                                      idx);
                goto fail;
            }
            hlen = (size_t)(hend - p);
            hend += 2;
        }
        if (hlen > lim->max_header_bytes) {
            rc = ditd_err_set(DITD_EINVAL, "multipart: part %d: headers over %zu bytes", idx,
                              lim->max_header_bytes);
            goto fail;
        }
        if ((rc = parse_headers(p, hlen, idx, part)))
            goto fail;
        const char *data = hend + 2;
        const char *next = memmem(data, (size_t)(end - data), delim, dlen);
        if (!next) {
            rc = ditd_err_set(DITD_EINVAL, "multipart: truncated body in part %d (\"%s\"): no boundary after its data",
                              idx, part->name);
            goto fail;
        }
        size_t dl = (size_t)(next - data);
        if (dl > lim->max_part_bytes) {
            rc = ditd_err_set(DITD_EINVAL, "multipart: part %d (\"%s\"): %zu bytes, over the limit of %zu",
                              idx, part->name, dl, lim->max_part_bytes);
            goto fail;
        }
        part->data = (const uint8_t *)data;
        part->len = dl;
        p = next + dlen;
    }
    if (form->n_parts == 0)
        return ditd_err_set(DITD_EINVAL, "multipart: body has no parts");
    return 0; /* anything after the closing delimiter is the epilogue: ignored */
fail:
    ditd_multipart_free(form);
    return rc;
}

const ditd_multipart_part *ditd_multipart_find(const ditd_multipart_form *form, const char *name,
                                               int nth)
{
    for (int i = 0; form && i < form->n_parts; i++)
        if (strcmp(form->parts[i].name, name) == 0 && nth-- == 0)
            return &form->parts[i];
    return NULL;
}

int ditd_multipart_count(const ditd_multipart_form *form, const char *name)
{
    int n = 0;
    for (int i = 0; form && i < form->n_parts; i++)
        n += strcmp(form->parts[i].name, name) == 0;
    return n;
}

static int listed(const char *const *list, const char *name)
{
    for (; list && *list; list++)
        if (!strcmp(*list, name))
            return 1;
    return 0;
}

json_t *ditd_multipart_to_json(const ditd_multipart_form *form, const char *const *ints,
                               const char *const *nums, const char *const *objs, char *field,
                               size_t n)
{
    json_t *o = json_object();
    if (n)
        field[0] = '\0';
    if (!o) {
        ditd_err_set(DITD_ENOMEM, "the form as JSON");
        return NULL;
    }
    for (int i = 0; i < form->n_parts; i++) {
        const ditd_multipart_part *p = &form->parts[i];
        json_t *v = NULL;
        const char *why = NULL;
        json_t *prev = json_object_get(o, p->name);
        if (prev && !(p->filename && json_is_true(prev))) {
            why = "is given twice";
        } else if (p->filename) {
            if (prev)
                continue; /* a list of files (`image[]` repeated): the caller reads them */
            v = json_true();
        } else if (memchr(p->data, '\0', p->len)) {
            why = "holds a NUL byte";
        } else {
            char *txt = malloc(p->len + 1);
            if (!txt) {
                json_decref(o);
                ditd_err_set(DITD_ENOMEM, "form field %s", p->name);
                return NULL;
            }
            memcpy(txt, p->data, p->len);
            txt[p->len] = '\0';
            char *end = NULL;
            if (p->len && listed(ints, p->name)) {
                long long l = strtoll(txt, &end, 10);
                if (!*end)
                    v = json_integer((json_int_t)l);
            } else if (p->len && listed(nums, p->name)) {
                double d = strtod(txt, &end);
                if (!*end)
                    v = json_real(d);
            } else if (listed(objs, p->name)) {
                if (!(v = json_loads(txt, JSON_REJECT_DUPLICATES, NULL)))
                    why = "is not JSON";
            }
            if (!v && !why && !(v = json_stringn(txt, p->len)))
                why = "is not valid UTF-8 text";
            free(txt);
        }
        if (why) {
            json_decref(v);
            json_decref(o);
            if (n)
                snprintf(field, n, "%s", p->name);
            ditd_err_set(DITD_EINVAL, "'%s' %s", p->name, why);
            return NULL;
        }
        if (json_object_set_new(o, p->name, v)) { /* jansson takes UTF-8 keys only */
            json_decref(o);
            if (n)
                snprintf(field, n, "%s", p->name);
            ditd_err_set(DITD_EINVAL, "a field's name is not valid UTF-8");
            return NULL;
        }
    }
    return o;
}
