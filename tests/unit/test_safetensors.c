/* Unit tests of the safetensors reader (engine/io/safetensors.c).
 *
 * Every file is built here, byte by byte, in a fresh temp folder: good files
 * of every float dtype (values checked bit for bit against independent
 * references), sharded checkpoints, slices, and broken files for each rule
 * the reader enforces, plus every truncation of a valid file and random byte
 * flips in a header. No Python, no fixtures.
 *
 * DITD_TEST_SEED=N replays the random part of a failed run.
 */
#include "engine/io/safetensors.h"

#include <errno.h>
#include <ftw.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "engine/core/error.h"
#include "tests/test_util.h"




static uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

#define CHECK_BITS(got, want)                                                       \
    do {                                                                            \
        float g_ = (got), w_ = (want);                                              \
        TU_CHECK(f32_bits(g_) == f32_bits(w_), "%s = %.9g (0x%08x), want %.9g (0x%08x)", \
              #got, g_, f32_bits(g_), w_, f32_bits(w_));                           \
    } while (0)

/* ---- building files --------------------------------------------------- */

typedef struct bytes {
    uint8_t *p;
    size_t n;
} bytes;

/* u64 header length | header | data. */
static bytes st_image(const char *header, const void *data, size_t data_len)
{
    size_t h = strlen(header);
    bytes b = { malloc(8 + h + data_len + 1), 8 + h + data_len };
    uint64_t n = h;
    memcpy(b.p, &n, 8);
    memcpy(b.p + 8, header, h);
    if (data_len)
        memcpy(b.p + 8 + h, data, data_len);
    return b;
}

static char tmpdir[256];

static void write_file(const char *rel, const void *p, size_t n)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", tmpdir, rel);
    FILE *f = fopen(path, "wb");
    if (!f || (n && fwrite(p, 1, n, f) != n) || fclose(f) != 0) {
        fprintf(stderr, "cannot write %s: %s\n", path, strerror(errno));
        exit(1);
    }
}

static void write_text(const char *rel, const char *s)
{
    write_file(rel, s, strlen(s));
}

static const char *tpath(const char *rel)
{
    static char path[4][512];
    static int k;
    k = (k + 1) % 4;
    snprintf(path[k], sizeof path[k], "%s/%s", tmpdir, rel);
    return path[k];
}

static void mkdir_rel(const char *rel)
{
    if (mkdir(tpath(rel), 0755) != 0) {
        fprintf(stderr, "mkdir %s: %s\n", tpath(rel), strerror(errno));
        exit(1);
    }
}

static int rm_one(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(p);
}

static void rm_tree(const char *p)
{
    nftw(p, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

/* xorshift64*: the random part of the tests. */

/* Reads every tensor that converts, as a user of the reader would; used
 * on files that opened despite mutations. */
static void read_all(const ditd_safetensors *st)
{
    for (size_t i = 0; i < ditd_safetensors_count(st); i++) {
        const ditd_st_tensor *t = ditd_safetensors_at(st, i);
        size_t numel = 1;
        for (int d = 0; d < t->ndim; d++)
            numel *= (size_t)t->shape[d];
        if (t->nbytes == 0)
            numel = 0;
        float *dst = malloc(numel * sizeof(float) + 1);
        int rc = ditd_safetensors_read_f32(st, t->name, t->ndim, t->shape, dst);
        TU_CHECK(rc == 0 || rc == DITD_EUNSUPPORTED, "read_f32(%s) = %s %s", t->name,
              ditd_err_name(rc), ditd_err_detail());
        if (rc == 0 && t->ndim > 0 && t->shape[0] > 1)
            rc = ditd_safetensors_read_f32_slice(st, t->name, t->ndim, t->shape, 0, 1,
                                                 t->shape[0] - 1, dst);
        TU_CHECK(rc == 0 || rc == DITD_EUNSUPPORTED, "slice(%s) = %s %s", t->name,
              ditd_err_name(rc), ditd_err_detail());
        free(dst);
    }
}

/* ---- dtypes and conversions ------------------------------------------- */

static void test_dtype_names(void)
{
    for (int i = 0; i < DITD_ST_DTYPE_COUNT; i++) {
        ditd_st_dtype t;
        const char *name = ditd_st_dtype_name((ditd_st_dtype)i);
        TU_CHECK(ditd_st_dtype_from_str(name, &t) == 0 && t == (ditd_st_dtype)i,
              "round trip of %s gave %d, want %d", name, (int)t, i);
        int bits = ditd_st_dtype_bits((ditd_st_dtype)i);
        TU_CHECK(bits == 4 || bits == 6 || bits == 8 || bits == 16 || bits == 32 || bits == 64,
              "%s has %d bits", name, bits);
    }
    ditd_st_dtype t;
    TU_CHECK(ditd_st_dtype_from_str("f32", &t) == DITD_EINVAL, "lower case f32 accepted");
    TU_CHECK(ditd_st_dtype_from_str("", &t) == DITD_EINVAL, "empty dtype accepted");
    TU_CHECK(strcmp(ditd_st_dtype_name((ditd_st_dtype)999), "?") == 0, "name of 999 is %s",
          ditd_st_dtype_name((ditd_st_dtype)999));
    TU_CHECK(ditd_st_dtype_bits(DITD_ST_BF16) == 16 && ditd_st_dtype_bits(DITD_ST_F64) == 64,
          "bits of BF16 %d, F64 %d", ditd_st_dtype_bits(DITD_ST_BF16),
          ditd_st_dtype_bits(DITD_ST_F64));
}

/* All 65536 halves against a float64 reference built from the definition
 * (sign, 5-bit exponent with bias 15, 10-bit fraction). */
static void test_f16_exhaustive(void)
{
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        uint32_t s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
        float got = ditd_st_f16_to_f32((uint16_t)h);
        if (e == 31) {
            uint32_t want = (s << 31) | 0x7f800000u | (m << 13);
            if (f32_bits(got) != want && bad++ < 5)
                TU_CHECK(0, "f16 0x%04x -> 0x%08x, want 0x%08x", h, f32_bits(got), want);
            continue;
        }
        double v = e == 0 ? ldexp((double)m, -24) : ldexp((double)(1024 + m), (int)e - 25);
        float want = (float)(s ? -v : v); /* exact: every half is a float */
        if (f32_bits(got) != f32_bits(want) && bad++ < 5)
            TU_CHECK(0, "f16 0x%04x -> %.9g (0x%08x), want %.9g", h, got, f32_bits(got), want);
    }
    TU_CHECK(bad == 0, "%d of 65536 f16 values wrong", bad);
    /* Landmarks, in numbers a reader can check. */
    CHECK_BITS(ditd_st_f16_to_f32(0x3c00), 1.0f);
    CHECK_BITS(ditd_st_f16_to_f32(0xc000), -2.0f);
    CHECK_BITS(ditd_st_f16_to_f32(0x7bff), 65504.0f);
    CHECK_BITS(ditd_st_f16_to_f32(0x0001), 5.9604644775390625e-08f);
    CHECK_BITS(ditd_st_f16_to_f32(0x03ff), 6.0975551605224609375e-05f);
    CHECK_BITS(ditd_st_f16_to_f32(0x0400), 6.103515625e-05f);
    CHECK_BITS(ditd_st_f16_to_f32(0x3555), 0.333251953125f);
    CHECK_BITS(ditd_st_f16_to_f32(0x8000), -0.0f);
    CHECK_BITS(ditd_st_f16_to_f32(0x7c00), INFINITY);
    CHECK_BITS(ditd_st_f16_to_f32(0xfc00), -INFINITY);
    TU_CHECK(isnan(ditd_st_f16_to_f32(0x7e00)), "0x7e00 is not nan");
}

static void test_bf16_exhaustive(void)
{
    int bad = 0;
    for (uint32_t b = 0; b < 65536; b++) {
        uint32_t s = b >> 15, e = (b >> 7) & 255, m = b & 127;
        float got = ditd_st_bf16_to_f32((uint16_t)b);
        if (e == 255) {
            uint32_t want = (s << 31) | 0x7f800000u | (m << 16);
            if (f32_bits(got) != want && bad++ < 5)
                TU_CHECK(0, "bf16 0x%04x -> 0x%08x, want 0x%08x", b, f32_bits(got), want);
            continue;
        }
        double v = e == 0 ? ldexp((double)m, -133) : ldexp((double)(128 + m), (int)e - 134);
        float want = (float)(s ? -v : v);
        if (f32_bits(got) != f32_bits(want) && bad++ < 5)
            TU_CHECK(0, "bf16 0x%04x -> %.9g, want %.9g", b, got, want);
    }
    TU_CHECK(bad == 0, "%d of 65536 bf16 values wrong", bad);
    CHECK_BITS(ditd_st_bf16_to_f32(0x3f80), 1.0f);
    CHECK_BITS(ditd_st_bf16_to_f32(0x4049), 3.140625f);
    CHECK_BITS(ditd_st_bf16_to_f32(0x0001), 9.18354961579912115600575419705e-41f);
}

/* ---- a good file with every convertible dtype ------------------------- */

/* Data region, deliberately misaligned: a 3-byte U8 tensor first. */
typedef struct good_file {
    uint8_t data[256];
    size_t len;
    char header[2048];
} good_file;

static void put(good_file *g, const void *p, size_t n, size_t *b, size_t *e)
{
    *b = g->len;
    memcpy(g->data + g->len, p, n);
    g->len += n;
    *e = g->len;
}

static void build_good(good_file *g)
{
    size_t b[9], e[9];
    g->len = 0;
    uint8_t u8[3] = { 1, 2, 255 };
    put(g, u8, sizeof u8, &b[0], &e[0]);
    float f32[6] = { 1.5f, -2.25f, 3e-40f, INFINITY, -0.0f, 1e38f };
    put(g, f32, sizeof f32, &b[1], &e[1]);
    uint16_t f16[6] = { 0x3c00, 0x0001, 0x03ff, 0x7c00, 0xfc00, 0x7e00 };
    put(g, f16, sizeof f16, &b[2], &e[2]);
    uint16_t bf[6] = { 0x3f80, 0x0001, 0x807f, 0x7f80, 0xff80, 0x7fc0 };
    put(g, bf, sizeof bf, &b[3], &e[3]);
    double f64[3] = { 0.1, 1e300, -1e-320 };
    put(g, f64, sizeof f64, &b[4], &e[4]);
    int32_t i32[2] = { 7, -7 };
    put(g, i32, sizeof i32, &b[5], &e[5]);
    float sc = 42.0f;
    put(g, &sc, 4, &b[6], &e[6]);
    b[7] = e[7] = g->len; /* empty (0, 4) */
    /* 4 F4 values pack into 2 bytes */
    uint8_t f4[2] = { 0x12, 0x34 };
    put(g, f4, 2, &b[8], &e[8]);
    snprintf(g->header, sizeof g->header,
             "{\"__metadata__\":{\"format\":\"pt\"},"
             "\"u8\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[%zu,%zu]},"
             "\"w32\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[%zu,%zu]},"
             "\"w16\":{\"dtype\":\"F16\",\"shape\":[2,3],\"data_offsets\":[%zu,%zu]},"
             "\"wbf\":{\"dtype\":\"BF16\",\"shape\":[6],\"data_offsets\":[%zu,%zu]},"
             "\"w64\":{\"dtype\":\"F64\",\"shape\":[3],\"data_offsets\":[%zu,%zu]},"
             "\"i32\":{\"dtype\":\"I32\",\"shape\":[2],\"data_offsets\":[%zu,%zu]},"
             "\"scalar\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[%zu,%zu]},"
             "\"empty\":{\"dtype\":\"F32\",\"shape\":[0,4],\"data_offsets\":[%zu,%zu]},"
             "\"f4\":{\"dtype\":\"F4\",\"shape\":[4],\"data_offsets\":[%zu,%zu]}}   ",
             b[0], e[0], b[1], e[1], b[2], e[2], b[3], e[3], b[4], e[4], b[5], e[5], b[6], e[6],
             b[7], e[7], b[8], e[8]);
}

static void check_good(const ditd_safetensors *st, const char *file)
{
    float out[8];
    TU_CHECK(ditd_safetensors_count(st) == 9, "count %zu, want 9", ditd_safetensors_count(st));
    /* Sorted by name. */
    for (size_t i = 1; i < ditd_safetensors_count(st); i++)
        TU_CHECK(strcmp(ditd_safetensors_at(st, i - 1)->name, ditd_safetensors_at(st, i)->name) < 0,
              "at(%zu) = %s not after %s", i, ditd_safetensors_at(st, i)->name,
              ditd_safetensors_at(st, i - 1)->name);
    TU_CHECK(ditd_safetensors_at(st, 9) == NULL, "at(count) is not NULL");

    const ditd_st_tensor *t = ditd_safetensors_find(st, "w16");
    TU_CHECK(t && t->dtype == DITD_ST_F16 && t->ndim == 2 && t->shape[0] == 2 && t->shape[1] == 3 &&
              t->nbytes == 12 && strcmp(t->file, file) == 0,
          "w16 record wrong (file %s, want %s)", t ? t->file : "-", file);
    t = ditd_safetensors_find(st, "u8");
    TU_CHECK(t && ((const uint8_t *)t->data)[2] == 255, "u8 data wrong");

    int64_t s23[2] = { 2, 3 }, s6[1] = { 6 }, s3[1] = { 3 };
    TU_CHECK_ERR(ditd_safetensors_read_f32(st, "w32", 2, s23, out), 0, NULL);
    CHECK_BITS(out[0], 1.5f);
    CHECK_BITS(out[1], -2.25f);
    CHECK_BITS(out[2], 3e-40f);
    CHECK_BITS(out[3], INFINITY);
    CHECK_BITS(out[4], -0.0f);
    CHECK_BITS(out[5], 1e38f);

    TU_CHECK_ERR(ditd_safetensors_read_f32(st, "w16", 2, s23, out), 0, NULL);
    CHECK_BITS(out[0], 1.0f);
    CHECK_BITS(out[1], 5.9604644775390625e-08f);   /* smallest subnormal, 2^-24 */
    CHECK_BITS(out[2], 6.0975551605224609375e-05f); /* largest subnormal */
    CHECK_BITS(out[3], INFINITY);
    CHECK_BITS(out[4], -INFINITY);
    TU_CHECK(isnan(out[5]), "w16[5] = %g, want nan", out[5]);

    TU_CHECK_ERR(ditd_safetensors_read_f32(st, "wbf", 1, s6, out), 0, NULL);
    CHECK_BITS(out[0], 1.0f);
    CHECK_BITS(out[1], 9.18354961579912115600575419705e-41f); /* 2^-133 */
    CHECK_BITS(out[2], -0x1.fcp-127f); /* -(127/128) 2^-126, subnormal */
    CHECK_BITS(out[3], INFINITY);
    CHECK_BITS(out[4], -INFINITY);
    TU_CHECK(isnan(out[5]), "wbf[5] = %g, want nan", out[5]);

    TU_CHECK_ERR(ditd_safetensors_read_f32(st, "w64", 1, s3, out), 0, NULL);
    CHECK_BITS(out[0], 0.1f);
    CHECK_BITS(out[1], INFINITY);
    CHECK_BITS(out[2], -0.0f);

    TU_CHECK_ERR(ditd_safetensors_read_f32(st, "scalar", 0, NULL, out), 0, NULL);
    CHECK_BITS(out[0], 42.0f);
    int64_t s04[2] = { 0, 4 };
    TU_CHECK_ERR(ditd_safetensors_read_f32(st, "empty", 2, s04, out), 0, NULL);

    int64_t s2[1] = { 2 }, s4[1] = { 4 }, s32[2] = { 3, 2 };
    TU_CHECK_ERR(ditd_safetensors_read_f32(st, "i32", 1, s2, out), DITD_EUNSUPPORTED, "I32");
    TU_CHECK_ERR(ditd_safetensors_read_f32(st, "f4", 1, s4, out), DITD_EUNSUPPORTED, "F4");
    TU_CHECK_ERR(ditd_safetensors_read_f32(st, "w32", 2, s32, out), DITD_ESHAPE,
              "tensor 'w32' has shape (2, 3) in");
    TU_CHECK_ERR(ditd_safetensors_read_f32(st, "w32", 2, s32, out), DITD_ESHAPE,
              "expected (3, 2)");
    TU_CHECK_ERR(ditd_safetensors_read_f32(st, "w32", 1, s6, out), DITD_ESHAPE,
              "expected (6,)");
    TU_CHECK_ERR(ditd_safetensors_read_f32(st, "w32", 2, s32, out), DITD_ESHAPE, file);
    TU_CHECK_ERR(ditd_safetensors_read_f32(st, "nope.weight", 2, s23, out), DITD_ENOENT,
              "tensor 'nope.weight' not found in");
    TU_CHECK_ERR(ditd_safetensors_read_f32(st, "nope.weight", 2, s23, out), DITD_ENOENT, file);
    TU_CHECK_ERR(ditd_safetensors_read_f32(st, "w32", 9, s23, out), DITD_EINVAL, NULL);
    TU_CHECK(ditd_safetensors_find(st, "w3") == NULL && ditd_safetensors_find(st, "") == NULL,
          "find of absent names");
}

static void test_good_file(void)
{
    good_file g;
    build_good(&g);
    bytes img = st_image(g.header, g.data, g.len);
    write_file("good.safetensors", img.p, img.n);

    ditd_safetensors *st = NULL;
    TU_CHECK_ERR(ditd_safetensors_open(tpath("good.safetensors"), &st), 0, NULL);
    if (st)
        check_good(st, tpath("good.safetensors"));
    ditd_safetensors_free(st);

    /* The same bytes shifted by one, so no tensor is aligned in memory. */
    uint8_t *shifted = malloc(img.n + 1);
    memcpy(shifted + 1, img.p, img.n);
    st = NULL;
    TU_CHECK_ERR(ditd_safetensors_open_mem(shifted + 1, img.n, "mem.safetensors", &st), 0, NULL);
    if (st)
        check_good(st, "mem.safetensors");
    ditd_safetensors_free(st);
    free(shifted);
    ditd_safetensors_free(NULL);

    /* Every truncation is an error, in memory and on disk. */
    int bad = 0;
    for (size_t n = 0; n < img.n; n++) {
        st = NULL;
        int rc = ditd_safetensors_open_mem(img.p, n, "cut", &st);
        if ((rc != DITD_EFORMAT || st != NULL) && bad++ < 5)
            TU_CHECK(0, "prefix of %zu bytes: %s %s", n, ditd_err_name(rc), ditd_err_detail());
        ditd_safetensors_free(st);
    }
    for (size_t n = 0; n < img.n; n += 7) {
        write_file("cut.safetensors", img.p, n);
        st = NULL;
        int rc = ditd_safetensors_open(tpath("cut.safetensors"), &st);
        if ((rc != DITD_EFORMAT || st != NULL) && bad++ < 5)
            TU_CHECK(0, "file of %zu bytes: %s %s", n, ditd_err_name(rc), ditd_err_detail());
        ditd_safetensors_free(st);
    }
    TU_CHECK(bad == 0, "%d truncations not refused", bad);
    free(img.p);
}

/* ---- many tensors: lookup --------------------------------------------- */

static void test_many(void)
{
    enum { N = 3000 };
    size_t cap = (size_t)N * 96 + 16;
    char *h = malloc(cap);
    float *data = malloc(N * sizeof(float));
    int *perm = malloc(N * sizeof(int));
    for (int i = 0; i < N; i++)
        perm[i] = i;
    for (int i = N - 1; i > 0; i--) { /* header order unrelated to names */
        int j = (int)(tu_rng() % (uint64_t)(i + 1)), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    size_t o = (size_t)snprintf(h, cap, "{");
    for (int k = 0; k < N; k++) {
        int i = perm[k];
        data[k] = (float)i + 0.5f;
        o += (size_t)snprintf(h + o, cap - o,
                              "%s\"blocks.%d.attn.to_q.weight\":{\"dtype\":\"F32\",\"shape\":[1],"
                              "\"data_offsets\":[%d,%d]}",
                              k ? "," : "", i, 4 * k, 4 * k + 4);
    }
    snprintf(h + o, cap - o, "}");
    bytes img = st_image(h, data, N * sizeof(float));
    ditd_safetensors *st = NULL;
    TU_CHECK_ERR(ditd_safetensors_open_mem(img.p, img.n, "many", &st), 0, NULL);
    if (st) {
        TU_CHECK(ditd_safetensors_count(st) == N, "count %zu", ditd_safetensors_count(st));
        int bad = 0;
        for (int i = 0; i < N; i++) {
            char name[64];
            float v = -1;
            int64_t s1[1] = { 1 };
            snprintf(name, sizeof name, "blocks.%d.attn.to_q.weight", i);
            int rc = ditd_safetensors_read_f32(st, name, 1, s1, &v);
            if ((rc != 0 || v != (float)i + 0.5f) && bad++ < 5)
                TU_CHECK(0, "%s read %s %g, want %g", name, ditd_err_name(rc), v, (float)i + 0.5f);
        }
        TU_CHECK(bad == 0, "%d lookups wrong", bad);
        TU_CHECK(ditd_safetensors_find(st, "blocks.3000.attn.to_q.weight") == NULL, "phantom");
    }
    ditd_safetensors_free(st);
    free(img.p);
    free(h);
    free(data);
    free(perm);
}

/* ---- slices ------------------------------------------------------------ */

/* Reference: the slice taken out of a full read, by index arithmetic. */
static void ref_slice(const float *full, int ndim, const int64_t *shape, int axis,
                      int64_t start, int64_t len, float *out)
{
    int64_t outer = 1, inner = 1;
    for (int i = 0; i < axis; i++)
        outer *= shape[i];
    for (int i = axis + 1; i < ndim; i++)
        inner *= shape[i];
    size_t k = 0;
    for (int64_t o = 0; o < outer; o++)
        for (int64_t a = start; a < start + len; a++)
            for (int64_t i = 0; i < inner; i++)
                out[k++] = full[(o * shape[axis] + a) * inner + i];
}

static void test_slices(void)
{
    /* m: F32 (4, 6), m[r][c] = 10r + c; q: BF16 (2, 3, 2, 2) random bf16;
     * h: F16 (5,) */
    float m[24];
    for (int r = 0; r < 4; r++)
        for (int c = 0; c < 6; c++)
            m[r * 6 + c] = (float)(10 * r + c);
    uint16_t q[24], hv[5] = { 0x3c00, 0x4000, 0x4200, 0x4400, 0x4500 };
    for (int i = 0; i < 24; i++)
        q[i] = (uint16_t)((tu_rng() & 0x7fff) % 0x7f00 | ((tu_rng() & 1) << 15));
    uint8_t data[96 + 48 + 10 + 1];
    memcpy(data + 1, m, 96); /* unaligned on purpose */
    memcpy(data + 97, q, 48);
    memcpy(data + 145, hv, 10);
    const char *hdr =
        "{\"pad\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
        "\"m\":{\"dtype\":\"F32\",\"shape\":[4,6],\"data_offsets\":[1,97]},"
        "\"q\":{\"dtype\":\"BF16\",\"shape\":[2,3,2,2],\"data_offsets\":[97,145]},"
        "\"h\":{\"dtype\":\"F16\",\"shape\":[5],\"data_offsets\":[145,155]}}";
    bytes img = st_image(hdr, data, sizeof data);
    ditd_safetensors *st = NULL;
    TU_CHECK_ERR(ditd_safetensors_open_mem(img.p, img.n, "slices", &st), 0, NULL);
    if (!st) {
        free(img.p);
        return;
    }
    float out[24], want[24], full[24];
    int64_t ms[2] = { 4, 6 };

    TU_CHECK_ERR(ditd_safetensors_read_f32_slice(st, "m", 2, ms, 0, 1, 2, out), 0, NULL);
    for (int r = 0; r < 2; r++)
        for (int c = 0; c < 6; c++)
            CHECK_BITS(out[r * 6 + c], (float)(10 * (r + 1) + c));
    TU_CHECK_ERR(ditd_safetensors_read_f32_slice(st, "m", 2, ms, 1, 2, 3, out), 0, NULL);
    for (int r = 0; r < 4; r++)
        for (int c = 0; c < 3; c++)
            CHECK_BITS(out[r * 3 + c], (float)(10 * r + c + 2));

    /* Every slice of every axis of the 4-D bf16 tensor and the 1-D f16 one,
     * against the reference. */
    const char *names[2] = { "q", "h" };
    int ndims[2] = { 4, 1 };
    int64_t shapes[2][4] = { { 2, 3, 2, 2 }, { 5 } };
    int bad = 0;
    for (int t = 0; t < 2; t++) {
        TU_CHECK_ERR(ditd_safetensors_read_f32(st, names[t], ndims[t], shapes[t], full), 0, NULL);
        for (int axis = 0; axis < ndims[t]; axis++)
            for (int64_t s = 0; s <= shapes[t][axis]; s++)
                for (int64_t len = 0; s + len <= shapes[t][axis]; len++) {
                    int rc = ditd_safetensors_read_f32_slice(st, names[t], ndims[t], shapes[t],
                                                             axis, s, len, out);
                    ref_slice(full, ndims[t], shapes[t], axis, s, len, want);
                    size_t n = 1;
                    for (int i = 0; i < ndims[t]; i++)
                        n *= (size_t)(i == axis ? len : shapes[t][i]);
                    if ((rc != 0 || memcmp(out, want, n * sizeof(float)) != 0) && bad++ < 5)
                        TU_CHECK(0, "%s axis %d [%lld, +%lld): %s", names[t], axis, (long long)s,
                              (long long)len, ditd_err_name(rc));
                }
    }
    TU_CHECK(bad == 0, "%d slices differ from the reference", bad);
    CHECK_BITS(full[4], 5.0f);

    TU_CHECK_ERR(ditd_safetensors_read_f32_slice(st, "m", 2, ms, 2, 0, 1, out), DITD_EINVAL,
              "axis 2");
    TU_CHECK_ERR(ditd_safetensors_read_f32_slice(st, "m", 2, ms, -1, 0, 1, out), DITD_EINVAL,
              NULL);
    TU_CHECK_ERR(ditd_safetensors_read_f32_slice(st, "m", 2, ms, 1, 4, 3, out), DITD_ERANGE,
              "size 6");
    TU_CHECK_ERR(ditd_safetensors_read_f32_slice(st, "m", 2, ms, 0, -1, 1, out), DITD_ERANGE,
              NULL);
    TU_CHECK_ERR(ditd_safetensors_read_f32_slice(st, "m", 2, ms, 0, 1, INT64_MAX, out),
              DITD_ERANGE, NULL);
    int64_t bad_shape[2] = { 4, 12 };
    TU_CHECK_ERR(ditd_safetensors_read_f32_slice(st, "m", 2, bad_shape, 1, 0, 6, out), DITD_ESHAPE,
              "expected (4, 12)");
    int64_t ps[1] = { 1 };
    TU_CHECK_ERR(ditd_safetensors_read_f32_slice(st, "pad", 1, ps, 0, 0, 1, out),
              DITD_EUNSUPPORTED, "U8");
    ditd_safetensors_free(st);
    free(img.p);
}

/* ---- broken headers ---------------------------------------------------- */

typedef struct broken {
    const char *header;
    size_t data_len;
    const char *want; /* substring of the detail */
} broken;

#define T1(dt, shape, offs) "{\"t\":{\"dtype\":\"" dt "\",\"shape\":" shape ",\"data_offsets\":" offs "}}"

static const broken broken_headers[] = {
    { "[1,2]", 0, "does not start with '{'" },
    { " {}", 0, "does not start with '{'" },
    { "{abc", 0, "not valid JSON" },
    { "{\"t\":1", 0, "not valid JSON" },
    { "{}x", 0, "not valid JSON" },
    { "{\"a\\u0000b\":{}}", 0, "not valid JSON" },
    { "{\"\xff\xfe\":{}}", 0, "not valid JSON" },
    { "{\"__metadata__\":[1]}", 0, "\"__metadata__\" is not a JSON object" },
    { "{\"__metadata__\":{\"format\":1}}", 0, "value 'format' is not a string" },
    { "{\"t\":5}", 0, "tensor 't': entry is not a JSON object" },
    { "{\"t\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "\"dtype\" missing" },
    { T1("F128", "[1]", "[0,4]"), 4, "unknown dtype 'F128'" },
    { T1("f32", "[1]", "[0,4]"), 4, "unknown dtype 'f32'" },
    { "{\"t\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4, "\"shape\" missing" },
    { T1("F32", "4", "[0,4]"), 4, "\"shape\" missing or not an array" },
    { T1("F32", "[-1]", "[0,4]"), 4, "shape[0] is not a non-negative integer" },
    { T1("F32", "[1.0]", "[0,4]"), 4, "shape[0] is not a non-negative integer" },
    { T1("F32", "[1,\"2\"]", "[0,8]"), 8, "shape[1] is not" },
    { T1("F32", "[1,1,1,1,1,1,1,1,1]", "[0,4]"), 4, "9 dimensions, at most 8" },
    { T1("F32", "[4294967296,4294967296,4294967296]", "[0,4]"), 4, "element count overflows" },
    { T1("F64", "[2305843009213693952,2]", "[0,4]"), 4, "overflows" },
    { T1("F64", "[99999999999999999999]", "[0,4]"), 4, "not valid JSON" },
    { T1("F4", "[3]", "[0,2]"), 2, "does not fill whole bytes" },
    { "{\"t\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, "\"data_offsets\" is not two" },
    { T1("F32", "[1]", "[0]"), 4, "\"data_offsets\" is not two" },
    { T1("F32", "[1]", "[0,4,8]"), 8, "\"data_offsets\" is not two" },
    { T1("F32", "[1]", "[-4,0]"), 4, "\"data_offsets\" is not two" },
    { T1("F32", "[1]", "[\"0\",4]"), 4, "\"data_offsets\" is not two" },
    { T1("F32", "[1]", "{\"a\":0}"), 4, "\"data_offsets\" is not two" },
    { T1("F32", "[1]", "[8,4]"), 8, "data_offsets [8, 4] end before they begin" },
    { T1("F32", "[1]", "[0,4]"), 3, "data_offsets [0, 4] beyond data region of 3 bytes" },
    { T1("F32", "[1]", "[0,18446744073709551615]"), 4, "not valid JSON" },
    { T1("F32", "[1]", "[0,9223372036854775807]"), 4, "beyond data region" },
    { T1("F32", "[2]", "[0,4]"), 4, "hold 4 bytes, but shape and dtype F32 need 8" },
    { T1("F16", "[2,3]", "[0,8]"), 8, "need 12" },
    { T1("F32", "[]", "[0,0]"), 4, "need 4" },
    { T1("F32", "[0]", "[0,4]"), 4, "need 0" },
    { "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
      "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
      12, "tensors 'a' and 'b' overlap" },
    { "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
      "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
      16, "overlap" },
    { "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
      "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
      4, "overlap" },
    { "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
      "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
      8, "duplicate" },
    { "{\"proj_out_2.weight\":{\"dtype\":\"F32\",\"shape\":[2499997],"
      "\"data_offsets\":[10,9999999]}}",
      4096, "tensor 'proj_out_2.weight': data_offsets [10, 9999999] beyond data region of 4096 "
            "bytes" },
};

static const char *const ok_headers[] = {
    "{}",
    "{}        ",
    "{\"__metadata__\":{}}",
    "{\"__metadata__\":{\"a\":\"b\",\"c\":\"\"}}",
    /* a hole between tensors, and a zero-size tensor inside another's range */
    ("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
     "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]},"
     "\"z\":{\"dtype\":\"F32\",\"shape\":[3,0],\"data_offsets\":[2,2]}}"),
    /* unknown keys in an entry are ignored, as the reference reader does */
    "{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8],\"extra\":[1]}}",
    /* zero dimension with huge others: numel 0, no overflow */
    ("{\"e\":{\"dtype\":\"F64\",\"shape\":[0,4294967296,4294967296,4294967296],"
     "\"data_offsets\":[12,12]}}"),
    "{\"\":{\"dtype\":\"BOOL\",\"shape\":[1],\"data_offsets\":[0,1]}}",
};

static void test_broken(void)
{
    uint8_t zeros[4096] = { 0 };
    for (size_t i = 0; i < sizeof broken_headers / sizeof *broken_headers; i++) {
        const broken *b = &broken_headers[i];
        bytes img = st_image(b->header, zeros, b->data_len);
        ditd_safetensors *st = NULL;
        ditd_err_clear();
        int rc = ditd_safetensors_open_mem(img.p, img.n, "transformer/bad.safetensors", &st);
        const char *d = ditd_err_detail();
        TU_CHECK(rc == DITD_EFORMAT && st == NULL && strstr(d, b->want) &&
                  strncmp(d, "transformer/bad.safetensors: ", 29) == 0,
              "header #%zu %s:\n    got %s \"%s\"\n    want EFORMAT \"transformer/bad.safetensors: "
              "...%s...\"",
              i, b->header, ditd_err_name(rc), d, b->want);
        ditd_safetensors_free(st);
        free(img.p);
    }
    for (size_t i = 0; i < sizeof ok_headers / sizeof *ok_headers; i++) {
        bytes img = st_image(ok_headers[i], zeros, 12);
        ditd_safetensors *st = NULL;
        TU_CHECK_ERR(ditd_safetensors_open_mem(img.p, img.n, "ok", &st), 0, NULL);
        if (st)
            read_all(st);
        ditd_safetensors_free(st);
        free(img.p);
    }

    /* The length prefix itself. */
    uint8_t raw[32] = { 0 };
    ditd_safetensors *st = NULL;
    TU_CHECK_ERR(ditd_safetensors_open_mem(raw, 5, "tiny", &st), DITD_EFORMAT,
              "tiny: file is 5 bytes, shorter than the 8-byte header length");
    uint64_t n = 1000;
    memcpy(raw, &n, 8);
    memcpy(raw + 8, "{}", 2);
    TU_CHECK_ERR(ditd_safetensors_open_mem(raw, 32, "lying", &st), DITD_EFORMAT,
              "header length 1000 runs past the end of the 32-byte file");
    n = 200000000;
    memcpy(raw, &n, 8);
    TU_CHECK_ERR(ditd_safetensors_open_mem(raw, 32, "huge", &st), DITD_EFORMAT,
              "header length 200000000 exceeds the limit");
    n = UINT64_MAX;
    memcpy(raw, &n, 8);
    TU_CHECK_ERR(ditd_safetensors_open_mem(raw, 32, "max", &st), DITD_EFORMAT, "exceeds the limit");
    n = 0;
    memcpy(raw, &n, 8);
    TU_CHECK_ERR(ditd_safetensors_open_mem(raw, 8, "zero", &st), DITD_EFORMAT,
              "does not start with '{'");
    TU_CHECK(st == NULL, "st set on failure");

    /* On disk: short files, missing files, folders. */
    write_file("short.safetensors", "abc", 3);
    TU_CHECK_ERR(ditd_safetensors_open(tpath("short.safetensors"), &st), DITD_EFORMAT,
              "short.safetensors: file is 3 bytes");
    write_file("empty.safetensors", "", 0);
    TU_CHECK_ERR(ditd_safetensors_open(tpath("empty.safetensors"), &st), DITD_EFORMAT,
              "file is 0 bytes");
    TU_CHECK_ERR(ditd_safetensors_open(tpath("absent.safetensors"), &st), DITD_ENOENT,
              "absent.safetensors");
    mkdir_rel("nothing");
    TU_CHECK_ERR(ditd_safetensors_open(tpath("nothing"), &st), DITD_ENOENT,
              "no diffusion_pytorch_model.safetensors");
    TU_CHECK(st == NULL, "st set on failure");
}

/* Random byte flips in the header of a valid file: every outcome is an
 * error or a file whose tensors all read; nothing crashes (ASan watches). */
static void test_flips(void)
{
    good_file g;
    build_good(&g);
    bytes img = st_image(g.header, g.data, g.len);
    size_t hend = 8 + strlen(g.header);
    uint8_t *mut = malloc(img.n);
    int opened = 0;
    for (int it = 0; it < 20000; it++) {
        memcpy(mut, img.p, img.n);
        int flips = 1 + (int)(tu_rng() % 4);
        for (int k = 0; k < flips; k++) {
            size_t at = (size_t)(tu_rng() % hend);
            if (tu_rng() % 2)
                mut[at] ^= (uint8_t)(1u << (tu_rng() % 8));
            else
                mut[at] = "0123456789{}[]\",:-eE. \\ZF"[tu_rng() % 25];
        }
        ditd_safetensors *st = NULL;
        int rc = ditd_safetensors_open_mem(mut, img.n, "flip", &st);
        TU_CHECK((rc == 0) == (st != NULL), "rc %d with st %p", rc, (void *)st);
        if (rc != 0) {
            TU_CHECK(rc == DITD_EFORMAT && strncmp(ditd_err_detail(), "flip: ", 6) == 0,
                  "flip: %s \"%s\"", ditd_err_name(rc), ditd_err_detail());
        } else {
            opened++;
            read_all(st);
        }
        ditd_safetensors_free(st);
    }
    TU_CHECK(opened > 0 && opened < 20000, "%d of 20000 mutants opened", opened);
    printf("byte flips: %d of 20000 mutants still valid, all read\n", opened);
    free(mut);
    free(img.p);
}

/* ---- sharded checkpoints and folders ------------------------------------ */

static void write_st(const char *rel, const char *header, const void *data, size_t n)
{
    bytes img = st_image(header, data, n);
    write_file(rel, img.p, img.n);
    free(img.p);
}

static void test_sharded(void)
{
    ditd_safetensors *st = NULL;
    float a[4] = { 1, 2, 3, 4 }, b[2] = { 5, 6 };
    uint16_t c[3] = { 0x3c00, 0x4000, 0x4200 };
    mkdir_rel("sharded");
    write_st("sharded/diffusion_pytorch_model-00001-of-00002.safetensors",
             "{\"pos_embed.proj.weight\":{\"dtype\":\"F32\",\"shape\":[2,2],"
             "\"data_offsets\":[0,16]},"
             "\"pos_embed.proj.bias\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[16,24]}}",
             (float[]){ 1, 2, 3, 4, 5, 6 }, 24);
    write_st("sharded/diffusion_pytorch_model-00002-of-00002.safetensors",
             "{\"proj_out_2.weight\":{\"dtype\":\"F16\",\"shape\":[3],\"data_offsets\":[0,6]}}", c,
             6);
    write_text("sharded/diffusion_pytorch_model.safetensors.index.json",
               "{\"metadata\":{\"total_size\":30},\"weight_map\":{"
               "\"pos_embed.proj.weight\":\"diffusion_pytorch_model-00001-of-00002.safetensors\","
               "\"pos_embed.proj.bias\":\"diffusion_pytorch_model-00001-of-00002.safetensors\","
               "\"proj_out_2.weight\":\"diffusion_pytorch_model-00002-of-00002.safetensors\"}}");
    /* A single file beside the index: the index wins. */
    write_st("sharded/diffusion_pytorch_model.safetensors",
             "{\"single\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", a, 4);

    const char *paths[2] = { tpath("sharded"),
                             tpath("sharded/diffusion_pytorch_model.safetensors.index.json") };
    for (int k = 0; k < 2; k++) {
        st = NULL;
        TU_CHECK_ERR(ditd_safetensors_open(paths[k], &st), 0, NULL);
        if (!st)
            continue;
        TU_CHECK(ditd_safetensors_count(st) == 3, "count %zu", ditd_safetensors_count(st));
        TU_CHECK(ditd_safetensors_find(st, "single") == NULL, "the single file was opened");
        float out[4];
        int64_t s22[2] = { 2, 2 }, s2[1] = { 2 }, s3[1] = { 3 };
        TU_CHECK_ERR(ditd_safetensors_read_f32(st, "pos_embed.proj.weight", 2, s22, out), 0, NULL);
        CHECK_BITS(out[3], 4.0f);
        TU_CHECK_ERR(ditd_safetensors_read_f32(st, "pos_embed.proj.bias", 1, s2, out), 0, NULL);
        CHECK_BITS(out[0], 5.0f);
        CHECK_BITS(out[1], 6.0f);
        TU_CHECK_ERR(ditd_safetensors_read_f32(st, "proj_out_2.weight", 1, s3, out), 0, NULL);
        CHECK_BITS(out[2], 3.0f);
        const ditd_st_tensor *t = ditd_safetensors_find(st, "proj_out_2.weight");
        TU_CHECK(t && strstr(t->file, "sharded/diffusion_pytorch_model-00002-of-00002.safetensors"),
              "file of proj_out_2.weight: %s", t ? t->file : "-");
        TU_CHECK_ERR(ditd_safetensors_read_f32(st, "pos_embed.proj.bias", 1, s3, out), DITD_ESHAPE,
                  "00001-of-00002.safetensors, expected (3,)");
        TU_CHECK_ERR(ditd_safetensors_read_f32(st, "pos_embed.proj.w", 1, s3, out), DITD_ENOENT,
                  "tensor 'pos_embed.proj.w' not found in");
        TU_CHECK_ERR(ditd_safetensors_read_f32(st, "pos_embed.proj.w", 1, s3, out), DITD_ENOENT,
                  "sharded/diffusion_pytorch_model.safetensors.index.json");
        ditd_safetensors_free(st);
    }

    /* transformers names, and a trailing slash. */
    mkdir_rel("tf");
    write_st("tf/model.safetensors",
             "{\"w\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[0,4]}}",
             (uint16_t[]){ 0x3f80, 0xbf80 }, 4);
    st = NULL;
    TU_CHECK_ERR(ditd_safetensors_open(tpath("tf/"), &st), 0, NULL);
    if (st) {
        const ditd_st_tensor *t = ditd_safetensors_find(st, "w");
        TU_CHECK(t && strstr(t->file, "tf/model.safetensors") && !strstr(t->file, "tf//"),
              "file %s", t ? t->file : "-");
    }
    ditd_safetensors_free(st);
    /* Diffusers name preferred over transformers name. */
    write_st("tf/diffusion_pytorch_model.safetensors",
             "{\"d\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", b, 4);
    st = NULL;
    TU_CHECK_ERR(ditd_safetensors_open(tpath("tf"), &st), 0, NULL);
    TU_CHECK(st && ditd_safetensors_find(st, "d") && !ditd_safetensors_find(st, "w"),
          "diffusion_pytorch_model.safetensors not preferred");
    ditd_safetensors_free(st);

    /* Broken indexes. */
    static const struct {
        const char *index;
        int code;
        const char *want;
    } bad[] = {
        { "{\"weight_map\":{\"missing\":\"s1.safetensors\"}}", DITD_EFORMAT,
          "tensor 'missing' is mapped to" },
        { "{\"weight_map\":{\"x\":\"s2.safetensors\"}}", DITD_EFORMAT,
          "tensor 'x' is mapped to" },
        { "{\"weight_map\":{\"x\":\"s1.safetensors\",\"y\":\"s1.safetensors\"}}", DITD_EFORMAT,
          "tensor 'y' is mapped to" },
        { "{\"weight_map\":{\"x\":\"s1.safetensors\",\"y\":\"s2.safetensors\"}}", 0, NULL },
        { "{\"weight_map\":{\"x\":\"../s1.safetensors\"}}", DITD_EFORMAT,
          "not a relative path inside" },
        { "{\"weight_map\":{\"x\":\"sub/../../s1.safetensors\"}}", DITD_EFORMAT,
          "not a relative path inside" },
        { "{\"weight_map\":{\"x\":\"/etc/passwd\"}}", DITD_EFORMAT, "not a relative path" },
        { "{\"weight_map\":{\"x\":\"\"}}", DITD_EFORMAT, "not a relative path" },
        { "{\"weight_map\":{\"x\":\"sub/\"}}", DITD_EFORMAT, "not a relative path" },
        { "{\"weight_map\":{\"x\":\"..\"}}", DITD_EFORMAT, "not a relative path" },
        { "{\"weight_map\":{\"x\":3}}", DITD_EFORMAT, "weight_map entry for tensor 'x'" },
        { "{\"weight_map\":{}}", DITD_EFORMAT, "\"weight_map\" is empty" },
        { "{\"weight_map\":[]}", DITD_EFORMAT, "no \"weight_map\" object" },
        { "{\"metadata\":{}}", DITD_EFORMAT, "no \"weight_map\" object" },
        { "[]", DITD_EFORMAT, "no \"weight_map\" object" },
        { "{\"weight_map\":{\"x\":\"s1.safetensors\"", DITD_EFORMAT, "not valid JSON" },
        { "{\"weight_map\":{\"x\":\"s1.safetensors\",\"x\":\"s2.safetensors\"}}", DITD_EFORMAT,
          "duplicate" },
        { "{\"weight_map\":{\"x\":\"absent.safetensors\"}}", DITD_ENOENT,
          "absent.safetensors" },
        { "{\"weight_map\":{\"x\":\"dup.safetensors\",\"y\":\"s2.safetensors\"}}", DITD_EFORMAT,
          "appears in both" },
        { "{\"weight_map\":{\"x\":\"broken.safetensors\"}}", DITD_EFORMAT,
          "broken.safetensors: tensor 'x': data_offsets [0, 8] beyond data region of 4" },
    };
    mkdir_rel("idx");
    write_st("idx/s1.safetensors",
             "{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", a, 4);
    write_st("idx/s2.safetensors",
             "{\"y\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", b, 4);
    write_st("idx/dup.safetensors",
             "{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
             "\"y\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", a, 8);
    write_st("idx/broken.safetensors",
             "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", a, 4);
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        write_text("idx/model.safetensors.index.json", bad[i].index);
        st = NULL;
        ditd_err_clear();
        int rc = ditd_safetensors_open(tpath("idx"), &st);
        const char *d = ditd_err_detail();
        TU_CHECK(rc == bad[i].code && (rc != 0) == (st == NULL) &&
                  (!bad[i].want || strstr(d, bad[i].want)),
              "index #%zu %s:\n    got %s \"%s\"\n    want %s \"...%s...\"", i, bad[i].index,
              ditd_err_name(rc), d, ditd_err_name(bad[i].code), bad[i].want ? bad[i].want : "");
        if (rc == DITD_EFORMAT)
            TU_CHECK(strstr(d, ".safetensors"), "detail names no file: %s", d);
        ditd_safetensors_free(st);
    }
}

int main(void)
{
    tu_seed();
    if (tu_mkdtemp(tmpdir, sizeof tmpdir, "st"))
        return 1;

    test_dtype_names();
    test_f16_exhaustive();
    test_bf16_exhaustive();
    test_good_file();
    test_many();
    test_slices();
    test_broken();
    test_flips();
    test_sharded();

    rm_tree(tmpdir);
    return tu_exit();
}
