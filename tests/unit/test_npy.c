/* Unit tests of the .npy reader and writer (engine/io/npy.c).
 *
 * The writer's bytes are checked against the exact header numpy.save
 * writes; hand-built files cover versions 1.0/2.0/3.0, every accepted dtype,
 * the spellings of a Python dict literal numpy and older writers produce,
 * and each kind of malformed or unsupported file. Random header flips and
 * every truncation must give an error, never a crash. No Python needed.
 *
 * DITD_TEST_SEED=N replays the random part of a failed run.
 */
#include "engine/io/npy.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "engine/core/error.h"
#include "tests/test_util.h"





static char tmpdir[256];

static const char *tpath(const char *rel)
{
    static char path[4][512];
    static int k;
    k = (k + 1) % 4;
    snprintf(path[k], sizeof path[k], "%s/%s", tmpdir, rel);
    return path[k];
}

static void write_file(const char *rel, const void *p, size_t n)
{
    FILE *f = fopen(tpath(rel), "wb");
    if (!f || (n && fwrite(p, 1, n, f) != n) || fclose(f) != 0) {
        fprintf(stderr, "cannot write %s: %s\n", rel, strerror(errno));
        exit(1);
    }
}

static uint8_t *slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *p = malloc((size_t)len + 1);
    *n = fread(p, 1, (size_t)len, f);
    fclose(f);
    return p;
}

/* A .npy image: magic, version, header length, the header padded as numpy
 * pads it (unless pad == 0), then data. */
typedef struct img {
    uint8_t p[4096];
    size_t n;
} img;

static void make(img *m, int major, const char *dict, int pad, const void *data, size_t len)
{
    size_t pre = major == 1 ? 10 : 12, d = strlen(dict);
    size_t h = d;
    if (pad) {
        h = d + 1;
        h += (64 - (pre + h) % 64) % 64;
    }
    memcpy(m->p, "\x93NUMPY", 6);
    m->p[6] = (uint8_t)major;
    m->p[7] = 0;
    if (major == 1) {
        m->p[8] = (uint8_t)h;
        m->p[9] = (uint8_t)(h >> 8);
    } else {
        for (int i = 0; i < 4; i++)
            m->p[8 + i] = (uint8_t)(h >> (8 * i));
    }
    memcpy(m->p + pre, dict, d);
    if (pad) {
        memset(m->p + pre + d, ' ', h - d - 1);
        m->p[pre + h - 1] = '\n';
    }
    if (len)
        memcpy(m->p + pre + h, data, len);
    m->n = pre + h + len;
}

/* ---- writer, and round trips ---------------------------------------------- */

static void check_written(const char *rel, const char *want_dict, int ndim,
                          const int64_t *shape, const float *data, size_t numel)
{
    TU_CHECK_ERR(ditd_npy_write_f32(tpath(rel), ndim, shape, data), 0, NULL);
    size_t n = 0;
    uint8_t *b = slurp(tpath(rel), &n);
    if (!b) {
        TU_CHECK(0, "%s not written", rel);
        return;
    }
    size_t hlen = n >= 10 ? (size_t)(b[8] | b[9] << 8) : 0;
    TU_CHECK(n >= 10 && memcmp(b, "\x93NUMPY\x01\x00", 8) == 0, "%s: bad preamble", rel);
    TU_CHECK((10 + hlen) % 64 == 0 && 10 + hlen + numel * 4 == n,
          "%s: header length %zu, file %zu bytes, %zu elements", rel, hlen, n, numel);
    size_t d = strlen(want_dict);
    TU_CHECK(hlen > d && memcmp(b + 10, want_dict, d) == 0, "%s: header \"%.*s\", want \"%s\"", rel,
          (int)d, (const char *)b + 10, want_dict);
    int pad_ok = hlen > d && b[10 + hlen - 1] == '\n';
    for (size_t i = 10 + d; pad_ok && i < 10 + hlen - 1; i++)
        pad_ok = b[i] == ' ';
    TU_CHECK(pad_ok, "%s: header not padded with spaces and ended by '\\n'", rel);
    TU_CHECK(numel == 0 || memcmp(b + 10 + hlen, data, numel * 4) == 0, "%s: data differs", rel);
    free(b);

    int nd = -1;
    int64_t sh[8];
    float *got = NULL;
    TU_CHECK_ERR(ditd_npy_read_f32(tpath(rel), 8, &nd, sh, &got), 0, NULL);
    TU_CHECK(nd == ndim, "%s: ndim %d, want %d", rel, nd, ndim);
    for (int i = 0; i < ndim && nd == ndim; i++)
        TU_CHECK(sh[i] == shape[i], "%s: shape[%d] %lld, want %lld", rel, i, (long long)sh[i],
              (long long)shape[i]);
    TU_CHECK(got && (numel == 0 || memcmp(got, data, numel * 4) == 0), "%s: data read back differs",
          rel);
    free(got);
}

static void test_write(void)
{
    /* Fresh random floats, including specials. */
    enum { N = 2 * 3 * 4 };
    float v[N];
    for (int i = 0; i < N; i++) {
        uint32_t u = (uint32_t)tu_rng();
        memcpy(&v[i], &u, 4);
    }
    v[0] = INFINITY;
    v[1] = -0.0f;
    v[2] = 1e-45f;
    int64_t s3[3] = { 2, 3, 4 };
    check_written("a.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3, 4), }", 3,
                  s3, v, N);
    int64_t s1[1] = { 5 };
    check_written("b.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (5,), }", 1, s1, v,
                  5);
    check_written("c.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (), }", 0, NULL, v,
                  1);
    int64_t s0[2] = { 0, 3 };
    check_written("d.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (0, 3), }", 2, s0,
                  NULL, 0);
    /* A long shape needs a second 64-byte block of header. */
    int64_t s8[8] = { 1, 1, 1, 1, 1, 1, 1, 7 };
    check_written("e.npy",
                  "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 1, 1, 1, 1, 1, 1, 7), }",
                  8, s8, v, 7);
    /* Overwrites, and leaves no temp files behind. */
    check_written("a.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (5,), }", 1, s1, v,
                  5);
    DIR *dir = opendir(tmpdir);
    struct dirent *de;
    while (dir && (de = readdir(dir)))
        TU_CHECK(!strstr(de->d_name, "tmp"), "temp file %s left behind", de->d_name);
    if (dir)
        closedir(dir);

    int64_t neg[1] = { -1 };
    TU_CHECK_ERR(ditd_npy_write_f32(tpath("f.npy"), 1, neg, v), DITD_EINVAL, "negative");
    TU_CHECK_ERR(ditd_npy_write_f32(tpath("f.npy"), 33, s3, v), DITD_EINVAL, NULL);
    TU_CHECK_ERR(ditd_npy_write_f32(tpath("no/such/dir/f.npy"), 1, s1, v), DITD_ENOENT,
              "no/such/dir/f.npy");
    TU_CHECK(access(tpath("f.npy"), F_OK) != 0, "f.npy written despite errors");

    /* i64 from the f32 file: integral values pass, others are refused. */
    float ints[3] = { -3.0f, 0.0f, 16777216.0f };
    int64_t s31[1] = { 3 };
    TU_CHECK_ERR(ditd_npy_write_f32(tpath("g.npy"), 1, s31, ints), 0, NULL);
    int nd;
    int64_t sh[4];
    int64_t *iv = NULL;
    TU_CHECK_ERR(ditd_npy_read_i64(tpath("g.npy"), 4, &nd, sh, &iv), 0, NULL);
    TU_CHECK(iv && iv[0] == -3 && iv[1] == 0 && iv[2] == 16777216, "i64 from f32: %lld %lld %lld",
          iv ? (long long)iv[0] : 0, iv ? (long long)iv[1] : 0, iv ? (long long)iv[2] : 0);
    free(iv);
    ints[1] = 0.5f;
    TU_CHECK_ERR(ditd_npy_write_f32(tpath("g.npy"), 1, s31, ints), 0, NULL);
    iv = NULL;
    TU_CHECK_ERR(ditd_npy_read_i64(tpath("g.npy"), 4, &nd, sh, &iv), DITD_ERANGE, "element 1 (0.5)");
    TU_CHECK(iv == NULL, "output set on failure");
    ints[1] = NAN;
    TU_CHECK_ERR(ditd_npy_write_f32(tpath("g.npy"), 1, s31, ints), 0, NULL);
    TU_CHECK_ERR(ditd_npy_read_i64(tpath("g.npy"), 4, &nd, sh, &iv), DITD_ERANGE, "element 1");
    ints[1] = 1e19f;
    TU_CHECK_ERR(ditd_npy_write_f32(tpath("g.npy"), 1, s31, ints), 0, NULL);
    TU_CHECK_ERR(ditd_npy_read_i64(tpath("g.npy"), 4, &nd, sh, &iv), DITD_ERANGE, "element 1");

    /* Capacity of the caller's shape array. */
    float *fv = NULL;
    TU_CHECK_ERR(ditd_npy_read_f32(tpath("b.npy"), 0, &nd, sh, &fv), DITD_ESHAPE,
              "1 dimensions, at most 0");
    /* A scalar needs no shape array. */
    TU_CHECK_ERR(ditd_npy_read_f32(tpath("c.npy"), 0, &nd, NULL, &fv), 0, NULL);
    TU_CHECK(nd == 0 && fv && fv[0] == v[0], "scalar read: ndim %d", nd);
    free(fv);
    fv = NULL;
    TU_CHECK_ERR(ditd_npy_read_f32(tpath("absent.npy"), 4, &nd, sh, &fv), DITD_ENOENT,
              "absent.npy");
    TU_CHECK_ERR(ditd_npy_read_f32(tmpdir, 4, &nd, sh, &fv), DITD_EIO, "not a regular file");
    TU_CHECK(fv == NULL, "output set on failure");
}

/* ---- hand-built files ---------------------------------------------------- */

static void read_mem_f32(const img *m, const char *what, int want_ndim, const int64_t *want_shape,
                         const float *want, size_t n)
{
    int nd = -1;
    int64_t sh[8];
    float *got = NULL;
    ditd_err_clear();
    int rc = ditd_npy_read_f32_mem(m->p, m->n, what, 8, &nd, sh, &got);
    TU_CHECK(rc == 0, "%s: %s %s", what, ditd_err_name(rc), ditd_err_detail());
    if (rc)
        return;
    TU_CHECK(nd == want_ndim, "%s: ndim %d, want %d", what, nd, want_ndim);
    for (int i = 0; i < nd && nd == want_ndim; i++)
        TU_CHECK(sh[i] == want_shape[i], "%s: shape[%d] %lld, want %lld", what, i,
              (long long)sh[i], (long long)want_shape[i]);
    for (size_t i = 0; i < n; i++)
        TU_CHECK(memcmp(&got[i], &want[i], 4) == 0, "%s: [%zu] = %.9g, want %.9g", what, i, got[i],
              want[i]);
    free(got);
}

static void test_dtypes(void)
{
    img m;
    int64_t s3[1] = { 3 }, s23[2] = { 2, 3 };

    double f8[3] = { 0.1, -1e300, 2.5 };
    make(&m, 2, "{'descr': '<f8', 'fortran_order': False, 'shape': (3,), }", 1, f8, 24);
    read_mem_f32(&m, "v2 <f8", 1, s3, (float[]){ 0.1f, -INFINITY, 2.5f }, 3);

    int64_t i8[3] = { -5, 1 << 24, 7 };
    make(&m, 3, "{'descr': '<i8', 'fortran_order': False, 'shape': (3,), }", 1, i8, 24);
    read_mem_f32(&m, "v3 <i8", 1, s3, (float[]){ -5.0f, 16777216.0f, 7.0f }, 3);
    int nd;
    int64_t sh[8], *iv = NULL;
    TU_CHECK_ERR(ditd_npy_read_i64_mem(m.p, m.n, "v3 <i8", 8, &nd, sh, &iv), 0, NULL);
    TU_CHECK(iv && iv[0] == -5 && iv[1] == 1 << 24 && iv[2] == 7, "i64 read of <i8 wrong");
    free(iv);

    int32_t i4[6] = { 1, -2, 3, -4, 5, 2147483647 };
    make(&m, 1, "{'descr': '<i4', 'fortran_order': False, 'shape': (2, 3), }", 1, i4, 24);
    read_mem_f32(&m, "<i4", 2, s23, (float[]){ 1, -2, 3, -4, 5, 2147483648.0f }, 6);

    uint8_t u1[3] = { 0, 128, 255 };
    make(&m, 1, "{'descr': '|u1', 'fortran_order': False, 'shape': (3,), }", 1, u1, 3);
    read_mem_f32(&m, "|u1", 1, s3, (float[]){ 0, 128, 255 }, 3);
    iv = NULL;
    TU_CHECK_ERR(ditd_npy_read_i64_mem(m.p, m.n, "|u1", 8, &nd, sh, &iv), 0, NULL);
    TU_CHECK(iv && iv[2] == 255, "|u1 as i64");
    free(iv);

    uint16_t f2[3] = { 0x3c00, 0x0001, 0xfc00 };
    make(&m, 1, "{'descr': '<f2', 'fortran_order': False, 'shape': (3,), }", 1, f2, 6);
    read_mem_f32(&m, "<f2", 1, s3, (float[]){ 1.0f, 0x1p-24f, -INFINITY }, 3);

    uint8_t b1[3] = { 0, 1, 2 };
    make(&m, 1, "{'descr': '|b1', 'fortran_order': False, 'shape': (3,), }", 1, b1, 3);
    read_mem_f32(&m, "|b1", 1, s3, (float[]){ 0, 1, 1 }, 3);

    int8_t i1[3] = { -128, 0, 127 };
    make(&m, 1, "{'descr': '|i1', 'fortran_order': False, 'shape': (3,), }", 1, i1, 3);
    read_mem_f32(&m, "|i1", 1, s3, (float[]){ -128, 0, 127 }, 3);

    uint64_t u8[3] = { 1, 0, UINT64_MAX };
    make(&m, 1, "{'descr': '<u8', 'fortran_order': False, 'shape': (3,), }", 1, u8, 24);
    read_mem_f32(&m, "<u8", 1, s3, (float[]){ 1, 0, 18446744073709551616.0f }, 3);
    TU_CHECK_ERR(ditd_npy_read_i64_mem(m.p, m.n, "<u8", 8, &nd, sh, &iv), DITD_ERANGE,
              "element 2");

    /* Spellings: double quotes, other key order, no trailing comma, no
     * padding, Python 2's long suffix, a list for the shape, '=' order,
     * a scalar, trailing bytes after the data (numpy ignores them). */
    float f4[6] = { 1, 2, 3, 4, 5, 6 };
    make(&m, 1, "{\"shape\": (2,3), \"fortran_order\": False, \"descr\": \"<f4\"}", 0, f4, 24);
    read_mem_f32(&m, "quotes", 2, s23, f4, 6);
    make(&m, 1, "{'descr':'=f4','fortran_order':False,'shape':(2L, 3L)}\n", 0, f4, 24);
    read_mem_f32(&m, "long suffix", 2, s23, f4, 6);
    make(&m, 1, "{u'descr': u'<f4', 'fortran_order': False, 'shape': [2, 3], }", 1, f4, 24);
    read_mem_f32(&m, "list shape", 2, s23, f4, 6);
    make(&m, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (), }", 1, f4, 24);
    read_mem_f32(&m, "scalar + trailing bytes", 0, NULL, f4, 1);
    /* Fortran order is the same layout when one dimension exceeds 1. */
    int64_t s16[2] = { 1, 6 };
    make(&m, 1, "{'descr': '<f4', 'fortran_order': True, 'shape': (1, 6), }", 1, f4, 24);
    read_mem_f32(&m, "fortran (1, 6)", 2, s16, f4, 6);

    /* Files on disk take the same paths. */
    make(&m, 2, "{'descr': '<f8', 'fortran_order': False, 'shape': (3,), }", 1, f8, 24);
    write_file("v2.npy", m.p, m.n);
    float *fv = NULL;
    TU_CHECK_ERR(ditd_npy_read_f32(tpath("v2.npy"), 4, &nd, sh, &fv), 0, NULL);
    TU_CHECK(fv && nd == 1 && sh[0] == 3 && fv[0] == 0.1f && fv[2] == 2.5f, "v2.npy read wrong");
    free(fv);
    make(&m, 1, "{'descr': '<i8', 'fortran_order': False, 'shape': (3,), }", 1, i8, 24);
    write_file("i8.npy", m.p, m.n);
    iv = NULL;
    TU_CHECK_ERR(ditd_npy_read_i64(tpath("i8.npy"), 4, &nd, sh, &iv), 0, NULL);
    TU_CHECK(iv && iv[0] == -5 && iv[2] == 7, "i8.npy read wrong");
    free(iv);
}

/* ---- malformed and unsupported files ------------------------------------- */

typedef struct bad {
    const char *dict;
    int code;
    const char *want;
} bad;

static const bad bad_dicts[] = {
    { "", DITD_EFORMAT, "does not start with '{'" },
    { "['descr']", DITD_EFORMAT, "does not start with '{'" },
    { "{'descr': '<f4', 'fortran_order': False}", DITD_EFORMAT, "lacks 'shape'" },
    { "{'fortran_order': False, 'shape': (3,)}", DITD_EFORMAT, "lacks 'descr'" },
    { "{'descr': '<f4', 'shape': (3,)}", DITD_EFORMAT, "lacks 'fortran_order'" },
    { "{'descr': '<f4', 'fortran_order': False, 'shape': (3,), 'x': 1}", DITD_EFORMAT,
      "unknown or repeated key 'x'" },
    { "{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (3,)}", DITD_EFORMAT,
      "repeated key 'descr'" },
    { "{'descr': '<f4', 'fortran_order': False, 'shape': (3)}", DITD_EFORMAT,
      "parenthesised integer" },
    { "{'descr': '<f4', 'fortran_order': False, 'shape': 3}", DITD_EFORMAT, "not a tuple" },
    { "{'descr': '<f4', 'fortran_order': False, 'shape': (-3,)}", DITD_EFORMAT,
      "non-negative integers" },
    { "{'descr': '<f4', 'fortran_order': False, 'shape': (3.0,)}", DITD_EFORMAT, "expected ','" },
    { "{'descr': '<f4', 'fortran_order': False, 'shape': (3,,)}", DITD_EFORMAT,
      "non-negative integers" },
    { "{'descr': '<f4', 'fortran_order': False, 'shape': (3,}", DITD_EFORMAT,
      "non-negative integers" },
    { "{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,)}", DITD_EFORMAT,
      "too large" },
    { "{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296)}",
      DITD_EFORMAT, "overflows" },
    { "{'descr': '<f4', 'fortran_order': 0, 'shape': (3,)}", DITD_EFORMAT, "True or False" },
    { "{'descr': '<f4', 'fortran_order': Falsey, 'shape': (3,)}", DITD_EFORMAT, "True or False" },
    { "{'descr': '<f4' 'fortran_order': False, 'shape': (3,)}", DITD_EFORMAT,
      "expected ',' or '}'" },
    { "{'descr' '<f4', 'fortran_order': False, 'shape': (3,)}", DITD_EFORMAT, "expected ':'" },
    { "{descr: '<f4', 'fortran_order': False, 'shape': (3,)}", DITD_EFORMAT, "quoted string" },
    { "{'descr: '<f4', 'fortran_order': False, 'shape': (3,)}", DITD_EFORMAT, NULL },
    { "{'descr': '<f4, 'fortran_order': False, 'shape': (3,)}", DITD_EFORMAT, NULL },
    { "{'descr': '<f4', 'fortran_order': False, 'shape': (3,)", DITD_EFORMAT,
      "expected ',' or '}'" },
    { "{'descr': '<f4', 'fortran_order': False, 'shape': (3,)} x", DITD_EFORMAT,
      "text after the closing '}'" },
    { "{'descr': '<f4', 'fortran_order': False, 'shape': (3,)}}", DITD_EFORMAT,
      "text after the closing '}'" },
    { "{'descr': '>f4', 'fortran_order': False, 'shape': (3,)}", DITD_EUNSUPPORTED,
      "big-endian data ('>f4')" },
    { "{'descr': '<c8', 'fortran_order': False, 'shape': (3,)}", DITD_EUNSUPPORTED,
      "dtype '<c8' is not supported" },
    { "{'descr': '|O', 'fortran_order': False, 'shape': (3,)}", DITD_EUNSUPPORTED, "'|O'" },
    { "{'descr': '<U5', 'fortran_order': False, 'shape': (3,)}", DITD_EUNSUPPORTED, "'<U5'" },
    { "{'descr': '<f16', 'fortran_order': False, 'shape': (3,)}", DITD_EUNSUPPORTED, "'<f16'" },
    { "{'descr': '<f3', 'fortran_order': False, 'shape': (3,)}", DITD_EUNSUPPORTED, "'<f3'" },
    { "{'descr': '', 'fortran_order': False, 'shape': (3,)}", DITD_EUNSUPPORTED, "''" },
    { "{'descr': [('x', '<f4')], 'fortran_order': False, 'shape': (3,)}", DITD_EUNSUPPORTED,
      "structured dtypes" },
    { "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3)}", DITD_EUNSUPPORTED,
      "Fortran-order" },
    { "{'descr': '<f4', 'fortran_order': False, 'shape': (1,1,1,1,1,1,1,1,1)}", DITD_ESHAPE,
      "9 dimensions, at most 8" },
    { "{'descr': '<f4', 'fortran_order': False, 'shape': (100,)}", DITD_EFORMAT,
      "truncated: shape and dtype need 400 data bytes" },
};

static void test_malformed(void)
{
    img m;
    float data[16] = { 0 };
    int nd;
    int64_t sh[8];
    float *fv = NULL;
    for (size_t i = 0; i < sizeof bad_dicts / sizeof *bad_dicts; i++) {
        make(&m, 1, bad_dicts[i].dict, 1, data, sizeof data);
        ditd_err_clear();
        int rc = ditd_npy_read_f32_mem(m.p, m.n, "latents.npy", 8, &nd, sh, &fv);
        const char *d = ditd_err_detail();
        TU_CHECK(rc == bad_dicts[i].code && tu_has(d, bad_dicts[i].want) &&
                  strncmp(d, "latents.npy: ", 13) == 0,
              "dict #%zu %s\n    got %s \"%s\"\n    want %s \"latents.npy: ...%s...\"", i,
              bad_dicts[i].dict, ditd_err_name(rc), d, ditd_err_name(bad_dicts[i].code),
              bad_dicts[i].want ? bad_dicts[i].want : "");
        TU_CHECK(fv == NULL, "output set on failure");
    }

    /* The preamble. */
    make(&m, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }", 1, data, 12);
    m.p[0] = 0x92;
    TU_CHECK_ERR(ditd_npy_read_f32_mem(m.p, m.n, "x.npy", 8, &nd, sh, &fv), DITD_EFORMAT,
              "x.npy: not a .npy file (bad magic)");
    m.p[0] = 0x93;
    m.p[6] = 4;
    TU_CHECK_ERR(ditd_npy_read_f32_mem(m.p, m.n, "x.npy", 8, &nd, sh, &fv), DITD_EFORMAT,
              "unknown .npy format version 4.0");
    m.p[6] = 1;
    m.p[7] = 1;
    TU_CHECK_ERR(ditd_npy_read_f32_mem(m.p, m.n, "x.npy", 8, &nd, sh, &fv), DITD_EFORMAT,
              "version 1.1");
    m.p[7] = 0;
    m.p[8] = 0xff;
    m.p[9] = 0xff;
    TU_CHECK_ERR(ditd_npy_read_f32_mem(m.p, m.n, "x.npy", 8, &nd, sh, &fv), DITD_EFORMAT,
              "truncated: the header needs 65535 bytes");
    make(&m, 2, "{}", 0, NULL, 0);
    m.p[11] = 0x7f;
    TU_CHECK_ERR(ditd_npy_read_f32_mem(m.p, m.n, "x.npy", 8, &nd, sh, &fv), DITD_EFORMAT,
              "exceeds the limit");
    make(&m, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }", 1, data, 12);
    m.p[10 + 16] = '\0'; /* the space after "'<f4'," */
    TU_CHECK_ERR(ditd_npy_read_f32_mem(m.p, m.n, "x.npy", 8, &nd, sh, &fv), DITD_EFORMAT,
              "header contains a NUL byte");
    TU_CHECK_ERR(ditd_npy_read_f32_mem(NULL, 0, NULL, 8, &nd, sh, &fv), DITD_EFORMAT,
              "<memory>: truncated");
    TU_CHECK_ERR(ditd_npy_read_f32_mem(m.p, m.n, "x.npy", -1, &nd, sh, &fv), DITD_EINVAL, NULL);

    /* Every truncation of a valid file, in memory and on disk. */
    make(&m, 1, "{'descr': '<f8', 'fortran_order': False, 'shape': (2, 2), }", 1, data, 32);
    int badn = 0;
    for (size_t n = 0; n < m.n; n++) {
        int rc = ditd_npy_read_f32_mem(m.p, n, "cut", 8, &nd, sh, &fv);
        if (rc != DITD_EFORMAT && badn++ < 5)
            TU_CHECK(0, "prefix %zu: %s %s", n, ditd_err_name(rc), ditd_err_detail());
        write_file("cut.npy", m.p, n);
        int64_t *iv = NULL;
        rc = ditd_npy_read_i64(tpath("cut.npy"), 8, &nd, sh, &iv);
        if ((rc != DITD_EFORMAT || iv) && badn++ < 5)
            TU_CHECK(0, "file prefix %zu: %s %s", n, ditd_err_name(rc), ditd_err_detail());
    }
    TU_CHECK(badn == 0, "%d truncations not refused", badn);
    TU_CHECK(fv == NULL, "output set on failure");
}

/* Random flips in the header: an error or a good read, never a crash. */
static void test_flips(void)
{
    img m, mut;
    float data[6] = { 1, 2, 3, 4, 5, 6 };
    make(&m, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", 1, data, 24);
    int ok = 0;
    for (int it = 0; it < 20000; it++) {
        mut = m;
        int flips = 1 + (int)(tu_rng() % 3);
        for (int k = 0; k < flips; k++) {
            size_t at = (size_t)(tu_rng() % 80);
            if (tu_rng() % 2)
                mut.p[at] ^= (uint8_t)(1u << (tu_rng() % 8));
            else
                mut.p[at] = (uint8_t)"0123456789(){}[],:' \"<>|=fiubTrueFalseL"[tu_rng() % 40];
        }
        int nd;
        int64_t sh[8];
        float *fv = NULL;
        int64_t *iv = NULL;
        int rc = ditd_npy_read_f32_mem(mut.p, mut.n, "flip", 8, &nd, sh, &fv);
        TU_CHECK(rc == 0 || rc == DITD_EFORMAT || rc == DITD_EUNSUPPORTED || rc == DITD_ESHAPE,
              "flip: %s %s", ditd_err_name(rc), ditd_err_detail());
        TU_CHECK((rc == 0) == (fv != NULL), "rc %d with data %p", rc, (void *)fv);
        ok += rc == 0;
        free(fv);
        rc = ditd_npy_read_i64_mem(mut.p, mut.n, "flip", 8, &nd, sh, &iv);
        free(iv);
    }
    printf("header flips: %d of 20000 mutants still valid\n", ok);
}

int main(void)
{
    tu_seed();
    if (tu_mkdtemp(tmpdir, sizeof tmpdir, "npy"))
        return 1;

    test_write();
    test_dtypes();
    test_malformed();
    test_flips();

    const char *files[] = { "a.npy", "b.npy", "c.npy", "d.npy", "e.npy", "g.npy", "v2.npy",
                            "i8.npy", "cut.npy" };
    for (size_t i = 0; i < sizeof files / sizeof *files; i++)
        unlink(tpath(files[i]));
    if (rmdir(tmpdir) != 0)
        fprintf(stderr, "warning: %s not removed: %s\n", tmpdir, strerror(errno));
    return tu_exit();
}
