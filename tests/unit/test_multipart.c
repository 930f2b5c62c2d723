/* multipart/form-data (server/daemon/multipart.c): the boundary from
 * Content-Type in its spellings, a form as curl and browsers send it for
 * /v1/images/edits (image[] repeated, a mask, text fields, binary data with
 * CR/LF and NUL inside), and every refusal with its message. */
#include "server/daemon/multipart.h"
#include "tests/test_util.h"

static int n_refused;

#define REFUSED(ct, body, len, lim, ...)                                                   \
    do {                                                                                   \
        ditd_multipart_form f_;                                                            \
        TU_CHECK_ERR(ditd_multipart_parse((ct), (const uint8_t *)(body), (len), (lim), &f_), \
                     DITD_EINVAL, __VA_ARGS__);                                            \
        TU_CHECK(f_.parts == NULL && f_.n_parts == 0, "form left after a refusal");        \
        n_refused++;                                                                       \
    } while (0)

static void test_boundary(void)
{
    char b[80];
    TU_OK(ditd_multipart_boundary("multipart/form-data; boundary=abc123", b, sizeof b));
    TU_CHECK(strcmp(b, "abc123") == 0, "got %s", b);
    TU_OK(ditd_multipart_boundary("Multipart/Form-Data;charset=utf-8;BOUNDARY=\"a b:c\"", b, sizeof b));
    TU_CHECK(strcmp(b, "a b:c") == 0, "got %s", b);
    TU_OK(ditd_multipart_boundary("multipart/form-data; boundary=------------------------d74496d66958873e",
                                  b, sizeof b));
    TU_CHECK(strcmp(b, "------------------------d74496d66958873e") == 0, "got %s", b);
    TU_CHECK_ERR(ditd_multipart_boundary("application/json", b, sizeof b), DITD_EINVAL,
                 "not multipart/form-data");
    TU_CHECK_ERR(ditd_multipart_boundary("multipart/form-dataX; boundary=a", b, sizeof b), DITD_EINVAL,
                 "not multipart/form-data");
    TU_CHECK_ERR(ditd_multipart_boundary("multipart/form-data", b, sizeof b), DITD_EINVAL,
                 "no boundary parameter");
    TU_CHECK_ERR(ditd_multipart_boundary("multipart/form-data; boundary=", b, sizeof b), DITD_EINVAL,
                 "empty boundary");
    TU_CHECK_ERR(ditd_multipart_boundary("multipart/form-data; boundary=\"abc", b, sizeof b), DITD_EINVAL,
                 "unterminated");
    TU_CHECK_ERR(ditd_multipart_boundary("multipart/form-data; boundary=a\x01z", b, sizeof b), DITD_EINVAL,
                 "not allowed (0x01)");
    char longb[200];
    snprintf(longb, sizeof longb, "multipart/form-data; boundary=%071d", 7);
    TU_CHECK_ERR(ditd_multipart_boundary(longb, b, sizeof b), DITD_EINVAL, "longer than 70");
    snprintf(longb, sizeof longb, "multipart/form-data; boundary=%070d", 7);
    TU_OK(ditd_multipart_boundary(longb, b, sizeof b));
    TU_CHECK(strlen(b) == 70, "70-character boundary: %zu", strlen(b));
    TU_CHECK_ERR(ditd_multipart_boundary(NULL, b, sizeof b), DITD_EINVAL, "no Content-Type");
}

static const char CT[] = "multipart/form-data; boundary=XyZ";

static void test_form(void)
{
    /* binary data holding CR LF, "--XyZ" without the CR LF before it, and NUL */
    static const char png1[] = "\x89PNG\r\n\x1a\n--XyZ\0\r\n-\r\n--XyZ";
    const size_t png1_len = sizeof png1 - 1 - 7; /* stop before the real delimiter text */
    char body[1024];
    size_t n = 0;
#define ADD(s, l) (memcpy(body + n, (s), (l)), n += (l))
#define ADDS(s) ADD(s, strlen(s))
    ADDS("preamble to ignore\r\n--XyZ\r\n");
    ADDS("Content-Disposition: form-data; name=\"image[]\"; filename=\"a.png\"\r\n");
    ADDS("Content-Type: image/png\r\n\r\n");
    ADD(png1, png1_len);
    ADDS("\r\n--XyZ\r\n");
    ADDS("content-disposition: form-data; filename=\"b \\\"q\\\".webp\"; name=image[]\r\n\r\n");
    ADDS("WEBPDATA");
    ADDS("\r\n--XyZ  \r\n"); /* transport padding after a delimiter */
    ADDS("Content-Disposition: form-data; name=\"prompt\"\r\n\r\n");
    ADDS("a cat\r\non two lines");
    ADDS("\r\n--XyZ\r\n");
    ADDS("Content-Disposition: form-data; name=\"empty\"\r\nContent-Transfer-Encoding: binary\r\n\r\n");
    ADDS("\r\n--XyZ--\r\nepilogue ignored\r\n--XyZ\r\n");
    ditd_multipart_form f;
    TU_OK(ditd_multipart_parse(CT, (const uint8_t *)body, n, NULL, &f));
    TU_CHECK(f.n_parts == 4, "%d parts", f.n_parts);
    TU_CHECK(ditd_multipart_count(&f, "image[]") == 2, "image[] x%d", ditd_multipart_count(&f, "image[]"));
    const ditd_multipart_part *a = ditd_multipart_find(&f, "image[]", 0);
    const ditd_multipart_part *b = ditd_multipart_find(&f, "image[]", 1);
    const ditd_multipart_part *p = ditd_multipart_find(&f, "prompt", 0);
    const ditd_multipart_part *e = ditd_multipart_find(&f, "empty", 0);
    TU_CHECK(a && b && p && e && !ditd_multipart_find(&f, "image[]", 2) && !ditd_multipart_find(&f, "mask", 0),
             "find");
    if (a && b && p && e) {
        TU_CHECK(a->len == png1_len && memcmp(a->data, png1, png1_len) == 0, "image 0: %zu bytes, want %zu",
                 a->len, png1_len);
        TU_CHECK(a->filename && strcmp(a->filename, "a.png") == 0, "filename %s", a->filename);
        TU_CHECK(a->content_type && strcmp(a->content_type, "image/png") == 0, "type %s", a->content_type);
        TU_CHECK(b->filename && strcmp(b->filename, "b \"q\".webp") == 0, "filename %s", b->filename);
        TU_CHECK(!b->content_type, "b has a content type");
        TU_CHECK(b->len == 8 && memcmp(b->data, "WEBPDATA", 8) == 0, "b: %zu bytes", b->len);
        TU_CHECK(p->len == 19 && memcmp(p->data, "a cat\r\non two lines", 19) == 0, "prompt %.*s",
                 (int)p->len, (const char *)p->data);
        TU_CHECK(!p->filename, "prompt has a filename");
        TU_CHECK(e->len == 0, "empty: %zu bytes", e->len);
    }
    ditd_multipart_free(&f);

    /* limits */
    ditd_multipart_limits lim;
    ditd_multipart_limits_default(&lim);
    lim.max_parts = 3;
    REFUSED(CT, body, n, &lim, "more than 3 parts");
    ditd_multipart_limits_default(&lim);
    lim.max_part_bytes = 18;
    REFUSED(CT, body, n, &lim, "part 2 (\"prompt\"): 19 bytes, over the limit of 18");
    ditd_multipart_limits_default(&lim);
    lim.max_header_bytes = 40;
    REFUSED(CT, body, n, &lim, "part 0: headers over 40 bytes");

    /* every truncation of the body is refused, never read past */
    int n_cut = 0;
    size_t close_at = (size_t)((const char *)memmem(body, n, "--XyZ--", 7) - body) + 7; /* the body is whole from here */
    for (size_t cut = 0; cut < close_at; cut++) {
        char *c = malloc(cut ? cut : 1);
        memcpy(c, body, cut);
        ditd_multipart_form g;
        int rc = ditd_multipart_parse(CT, (const uint8_t *)c, cut, NULL, &g);
        TU_CHECK(rc == DITD_EINVAL && g.n_parts == 0, "cut at %zu: rc %d, %d parts", cut, rc, g.n_parts);
        n_cut++;
        free(c);
    }
    TU_CHECK(n_cut > 300, "%d truncations", n_cut);
#undef ADDS
#undef ADD
}

static void test_refusals(void)
{
#define R(body, ...) REFUSED(CT, body, sizeof body - 1, NULL, __VA_ARGS__)
    REFUSED("application/json", "{}", 2, NULL, "not multipart/form-data");
    REFUSED("multipart/form-data", "--x\r\n", 5, NULL, "no boundary parameter");
    R("", "empty body");
    R("no delimiter at all", "no boundary line (--XyZ)");
    R("--XyZ--", "no parts");
    R("--XyZ\r\nContent-Disposition: form-data; name=\"a\"\r\n\r\nabc", "truncated body in part 0 (\"a\")");
    R("--XyZ\r\nContent-Disposition: form-data; name=\"a\"\r\n", "truncated body in the headers of part 0");
    R("--XyZ\r\nContent-Disposition: form-data; name=\"a\"\r\n\r\nabc\r\n--XyZ", "truncated body after part 1");
    R("--XyZ\r\nContent-Disposition: form-data; filename=\"x.png\"\r\n\r\nabc\r\n--XyZ--", "part 0 has no name");
    R("--XyZ\r\nContent-Disposition: form-data; name=\"\"\r\n\r\nabc\r\n--XyZ--", "part 0 has an empty name");
    R("--XyZ\r\nContent-Type: text/plain\r\n\r\nabc\r\n--XyZ--", "part 0 has no Content-Disposition");
    R("--XyZ\r\n\r\nabc\r\n--XyZ--", "part 0 has no Content-Disposition");
    R("--XyZ\r\nContent-Disposition: attachment; name=\"a\"\r\n\r\nabc\r\n--XyZ--", "not form-data");
    R("--XyZ\r\nContent-Disposition: form-data; name=\"a\r\n\r\nabc\r\n--XyZ--", "unterminated quoted");
    R("--XyZ\r\nContent-Disposition: form-data; name=a; name=b\r\n\r\nabc\r\n--XyZ--", "name given twice");
    R("--XyZ\r\nContent-Disposition: form-data; name=a\r\nBogus\r\n\r\nabc\r\n--XyZ--", "without a colon");
    R("--XyZ\r\nContent-Disposition: form-data;\r\n name=a\r\n\r\nabc\r\n--XyZ--", "folded");
    R("--XyZ\r\nContent-Disposition: form-data; name=a\r\nContent-Transfer-Encoding: base64\r\n\r\nabc\r\n--XyZ--",
      "Content-Transfer-Encoding base64 is not accepted");
    R("--XyZ\r\nContent-Disposition: form-data; name=a\r\n\r\nabc\r\n--XyZjunk\r\n", "not followed by CRLF");
    R("--XyZ\r\nContent-Disposition: form-data; name=a\r\n\r\nabc\r\n--XyZ\r\nContent-Disposition: form-data; name=b\r\n\r\n",
      "truncated body in part 1 (\"b\")");
#undef R
    TU_CHECK(n_refused == 23, "%d refusals checked, want 23", n_refused);
}

int main(void)
{
    test_boundary();
    test_form();
    test_refusals();
    printf("%d checks, %d failures (%d refusals)\n", tu_checks, tu_failures, n_refused);
    return tu_failures ? 1 : 0;
}
