/* Unit tests of the GGUF reader (engine/io/gguf.c) and the block
 * dequantization under it (kernels/cpu/dequant.c).
 *
 *   - tests/fixtures/gguf/types.gguf (tools/make_gguf_fixtures.py, written
 *     by the gguf package's GGUFWriter): every block type ditd reads,
 *     dequantized bit for bit as gguf.quants.dequantize does (a floor on
 *     how many types were checked), slices of them, a 3-D tensor's
 *     dimension order, metadata of every value type, an unsupported type
 *     refused naming the tensor and the type; align64.gguf: a custom
 *     alignment.
 *   - files built here byte by byte: a valid one, then one broken file per
 *     rule the reader enforces (each refused naming the tensor or key at
 *     fault), every truncation of the valid file, and random byte flips
 *     (must open or fail with a detail, never crash).
 *
 * DITD_TEST_SEED=N replays the random part.
 */
#include "engine/io/gguf.h"
#include "engine/io/weights.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/error.h"
#include "kernels/cpu/dequant.h"
#include "tests/test_util.h"

static uint32_t bits_of(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* ---- the fixture files ---------------------------------------------------- */

static const char *const g_types[] = {"F32",  "F16",  "BF16", "Q4_0", "Q4_1",
                                      "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K",
                                      "Q4_K", "Q5_K", "Q6_K"};

static int bit_equal(const char *what, const float *got, const float *want, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (bits_of(got[i]) != bits_of(want[i])) {
            TU_CHECK(0, "%s: element %zu is %.9g (0x%08x), the reference %.9g (0x%08x)", what, i,
                     got[i], bits_of(got[i]), want[i], bits_of(want[i]));
            return 0;
        }
    tu_checks++;
    return 1;
}

static void test_types(void)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/gguf/types.gguf", tu_fixtures());
    ditd_gguf *g = NULL;
    TU_OK(ditd_gguf_open(path, &g));
    if (!g)
        return;
    TU_CHECK(ditd_gguf_version(g) == 3, "version %u", ditd_gguf_version(g));
    TU_CHECK(ditd_gguf_alignment(g) == 32, "alignment %zu", ditd_gguf_alignment(g));

    const int64_t shape[2] = {3, 512};
    float got[3 * 512], want[3 * 512], sl[3 * 512];
    int checked = 0;
    for (size_t i = 0; i < sizeof g_types / sizeof *g_types; i++) {
        char qn[64], rn[64];
        snprintf(qn, sizeof qn, "q.%s", g_types[i]);
        snprintf(rn, sizeof rn, "ref.%s", g_types[i]);
        const ditd_gguf_tensor *t = ditd_gguf_find(g, qn);
        ditd_gguf_type want_t;
        TU_CHECK(t && ditd_gguf_type_from_str(g_types[i], &want_t) == 0 && t->type == want_t,
                 "%s missing or of type %s", qn, t ? ditd_gguf_type_name(t->type) : "-");
        if (!t)
            continue;
        TU_CHECK(t->ne[0] == 512 && t->ne[1] == 3 && t->shape[0] == 3 && t->shape[1] == 512,
                 "%s: ne (%lld, %lld)", qn, (long long)t->ne[0], (long long)t->ne[1]);
        memset(got, 0xff, sizeof got);
        TU_OK(ditd_gguf_read_f32(g, qn, 2, shape, got));
        TU_OK(ditd_gguf_read_f32(g, rn, 2, shape, want));
        if (bit_equal(qn, got, want, 3 * 512))
            checked++;
        /* slices: rows [1, 3); columns [96, 416) (inside and across blocks) */
        TU_OK(ditd_gguf_read_f32_slice(g, qn, 2, shape, 0, 1, 2, sl));
        bit_equal("row slice", sl, want + 512, 2 * 512);
        TU_OK(ditd_gguf_read_f32_slice(g, qn, 2, shape, 1, 96, 320, sl));
        for (int r = 0; r < 3; r++)
            bit_equal("column slice", sl + r * 320, want + r * 512 + 96, 320);
    }
    printf("types dequantized bit-identically to gguf.quants.dequantize: %d\n", checked);
    TU_CHECK(checked >= 13, "only %d of 13 types checked", checked);

    /* numpy (2, 3, 64) is ggml ne (64, 3, 2) */
    const ditd_gguf_tensor *t3 = ditd_gguf_find(g, "q3.Q8_0");
    TU_CHECK(t3 && t3->ndim == 3 && t3->ne[0] == 64 && t3->ne[2] == 2 && t3->shape[0] == 2 &&
                 t3->shape[2] == 64,
             "q3.Q8_0 dims");
    const int64_t s3[3] = {2, 3, 64};
    TU_OK(ditd_gguf_read_f32(g, "q3.Q8_0", 3, s3, got));
    TU_OK(ditd_gguf_read_f32(g, "ref3.Q8_0", 3, s3, want));
    bit_equal("q3.Q8_0", got, want, 2 * 3 * 64);
    TU_OK(ditd_gguf_read_f32_slice(g, "q3.Q8_0", 3, s3, 1, 1, 2, sl));
    for (int a = 0; a < 2; a++)
        bit_equal("3-D slice", sl + a * 128, want + a * 192 + 64, 128);

    /* refusals on read */
    const int64_t su[2] = {2, 32};
    TU_CHECK_ERR(ditd_gguf_read_f32(g, "blk.unsupported", 2, su, got), DITD_EUNSUPPORTED,
                 "blk.unsupported", "IQ4_NL");
    TU_CHECK_ERR(ditd_gguf_read_f32(g, "q.Q8_0", 2, (int64_t[]){512, 3}, got), DITD_ESHAPE,
                 "q.Q8_0", "(3, 512)");
    TU_CHECK_ERR(ditd_gguf_read_f32(g, "nope", 2, shape, got), DITD_ENOENT, "nope");
    TU_CHECK_ERR(ditd_gguf_read_f32_slice(g, "q.Q8_0", 2, shape, 1, 500, 13, got), DITD_ERANGE,
                 "q.Q8_0");

    /* metadata of every type */
    int64_t v = 0;
    struct {
        const char *key;
        int64_t want;
    } ints[] = {{"test.u8", 200},           {"test.i8", -100},
                {"test.u16", 60000},        {"test.i16", -30000},
                {"test.u32", 4000000000LL}, {"test.i32", -2000000000LL},
                {"test.bool", 1},           {"test.i64", -(1LL << 62)}};
    for (size_t i = 0; i < sizeof ints / sizeof *ints; i++) {
        TU_OK(ditd_gguf_kv_int(g, ints[i].key, &v));
        TU_CHECK(v == ints[i].want, "%s = %lld, want %lld", ints[i].key, (long long)v,
                 (long long)ints[i].want);
    }
    TU_CHECK_ERR(ditd_gguf_kv_int(g, "test.u64", &v), DITD_EFORMAT, "test.u64");
    TU_CHECK_ERR(ditd_gguf_kv_int(g, "test.f32", &v), DITD_EFORMAT, "FLOAT32");
    const ditd_gguf_kv *kv = ditd_gguf_kv_find(g, "test.f64");
    double d = 0;
    if (kv)
        memcpy(&d, kv->data, 8);
    TU_CHECK(kv && kv->type == DITD_GGUF_V_FLOAT64 && d == -1.5e300, "test.f64 = %g", d);
    kv = ditd_gguf_kv_find(g, "test.f32");
    float f = 0;
    if (kv)
        memcpy(&f, kv->data, 4);
    TU_CHECK(kv && f == 0.25f, "test.f32 = %g", f);
    const char *s = ditd_gguf_kv_str(g, "test.str");
    TU_CHECK(s && strcmp(s, "FLUX.1 \xc3\xa9") == 0, "test.str = %s", s ? s : "(null)");
    TU_CHECK(ditd_gguf_kv_str(g, "general.architecture") &&
                 strcmp(ditd_gguf_kv_str(g, "general.architecture"), "ditd-test") == 0,
             "general.architecture");
    kv = ditd_gguf_kv_find(g, "test.arr_i32");
    int32_t ai[3] = {0};
    if (kv && kv->n == 3)
        memcpy(ai, kv->data, sizeof ai);
    TU_CHECK(kv && kv->type == DITD_GGUF_V_ARRAY && kv->elem_type == DITD_GGUF_V_INT32 &&
                 ai[0] == 1 && ai[1] == -2 && ai[2] == 3,
             "test.arr_i32");
    kv = ditd_gguf_kv_find(g, "test.arr_str");
    const char *want_s[] = {"a", "", "\xc3\xbc" "ber"};
    TU_CHECK(kv && kv->n == 3 && kv->elem_type == DITD_GGUF_V_STRING, "test.arr_str");
    for (uint64_t i = 0; kv && i < 3; i++) {
        const char *e = NULL;
        size_t n = 0;
        TU_OK(ditd_gguf_kv_arr_str(kv, i, &e, &n));
        TU_CHECK(e && n == strlen(want_s[i]) && memcmp(e, want_s[i], n) == 0,
                 "test.arr_str[%llu]", (unsigned long long)i);
    }
    if (kv)
        TU_CHECK_ERR(ditd_gguf_kv_arr_str(kv, 3, &s, &(size_t){0}), DITD_EINVAL, "test.arr_str");
    ditd_gguf_free(g);

    snprintf(path, sizeof path, "%s/gguf/align64.gguf", tu_fixtures());
    TU_OK(ditd_gguf_open(path, &g));
    if (!g)
        return;
    TU_CHECK(ditd_gguf_alignment(g) == 64, "alignment %zu", ditd_gguf_alignment(g));
    const int64_t sb[2] = {5, 7};
    TU_OK(ditd_gguf_read_f32(g, "b", 2, sb, got));
    TU_OK(ditd_gguf_read_f32(g, "b_ref", 2, sb, want));
    bit_equal("align64 b", got, want, 35);
    for (size_t i = 0; i < ditd_gguf_count(g); i++)
        TU_CHECK((uintptr_t)ditd_gguf_at(g, i)->offset % 64 == 0, "offset");
    ditd_gguf_free(g);
}

/* ---- hand-made files ---------------------------------------------------- */

typedef struct buf {
    uint8_t p[8192];
    size_t n;
} buf;

static void put(buf *b, const void *v, size_t n)
{
    memcpy(b->p + b->n, v, n);
    b->n += n;
}
static void u32(buf *b, uint32_t v) { put(b, &v, 4); }
static void u64(buf *b, uint64_t v) { put(b, &v, 8); }
static void str(buf *b, const char *s)
{
    u64(b, strlen(s));
    put(b, s, strlen(s));
}

/* What the valid file holds, and knobs that break one thing each. */
typedef struct spec {
    uint32_t version;
    uint64_t nt, nkv;       /* as written (counts) */
    uint32_t align_type;    /* general.alignment's value type */
    uint32_t align;         /* 0: no general.alignment key */
    const char *name_a, *name_b;
    uint32_t ndim_a;
    uint64_t ne0_a, ne1_a;
    uint32_t type_a;
    uint64_t off_a, off_b;
    int dup_key, nested_array, bad_bool;
    uint64_t str_len_override; /* nonzero: the string value's declared length */
} spec;

static spec valid_spec(void)
{
    return (spec){.version = 3, .nt = 2, .nkv = 3, .align_type = DITD_GGUF_V_UINT32, .align = 32,
                  .name_a = "w", .name_b = "bias", .ndim_a = 2, .ne0_a = 64, .ne1_a = 2,
                  .type_a = DITD_GGUF_Q8_0, .off_a = 0, .off_b = 160};
}

/* "w": Q8_0 (2, 64) = 4 blocks of 34 = 136 bytes at off_a; "bias": F32 (2)
 * at off_b. Metadata: general.alignment, a string, an array of u8. */
static void build(buf *b, const spec *s)
{
    b->n = 0;
    put(b, "GGUF", 4);
    u32(b, s->version);
    u64(b, s->nt);
    u64(b, s->nkv + (uint64_t)(s->dup_key || s->nested_array || s->bad_bool));
    str(b, "general.alignment");
    u32(b, s->align_type);
    if (s->align_type == DITD_GGUF_V_UINT8) {
        uint8_t a = (uint8_t)s->align;
        put(b, &a, 1);
    } else {
        u32(b, s->align);
    }
    str(b, "general.name");
    u32(b, DITD_GGUF_V_STRING);
    if (s->str_len_override) {
        u64(b, s->str_len_override);
        put(b, "tiny", 4);
    } else {
        str(b, "tiny");
    }
    str(b, "test.arr");
    u32(b, DITD_GGUF_V_ARRAY);
    u32(b, DITD_GGUF_V_UINT8);
    u64(b, 3);
    put(b, "\x01\x02\x03", 3);
    if (s->dup_key) {
        str(b, "general.name");
        u32(b, DITD_GGUF_V_UINT8);
        put(b, "\x01", 1);
    }
    if (s->nested_array) {
        str(b, "test.nested");
        u32(b, DITD_GGUF_V_ARRAY);
        u32(b, DITD_GGUF_V_ARRAY);
        u64(b, 0);
    }
    if (s->bad_bool) {
        str(b, "test.flag");
        u32(b, DITD_GGUF_V_BOOL);
        put(b, "\x02", 1);
    }
    str(b, s->name_a);
    u32(b, s->ndim_a);
    u64(b, s->ne0_a);
    for (uint32_t d = 1; d < s->ndim_a; d++)
        u64(b, s->ne1_a);
    u32(b, s->type_a);
    u64(b, s->off_a);
    str(b, s->name_b);
    u32(b, 1);
    u64(b, 2);
    u32(b, DITD_GGUF_F32);
    u64(b, s->off_b);
    while (b->n % 32)
        b->p[b->n++] = 0;
    size_t data = b->n;
    memset(b->p + data, 0, 192);
    for (int i = 0; i < 4; i++) { /* scale 1.0 (fp16 0x3c00), q = i*32 + l - 64 */
        uint8_t *blk = b->p + data + i * 34;
        blk[0] = 0x00;
        blk[1] = 0x3c;
        for (int l = 0; l < 32; l++)
            blk[2 + l] = (uint8_t)(int8_t)(i * 32 + l - 64);
    }
    float bias[2] = {0.5f, -2.0f};
    memcpy(b->p + data + 160, bias, 8);
    b->n = data + 168; /* ends with bias: every truncation cuts a tensor */
}

static void expect_refused(const char *what, const spec *s, const char *sub1, const char *sub2)
{
    buf b;
    build(&b, s);
    ditd_gguf *g = NULL;
    TU_CHECK_ERR(ditd_gguf_open_mem(b.p, b.n, "made.gguf", &g), DITD_EFORMAT, "made.gguf", sub1,
                 sub2);
    TU_CHECK(g == NULL, "%s: an object left behind", what);
    ditd_gguf_free(g);
}

static void test_made(void)
{
    buf b;
    spec s = valid_spec();
    build(&b, &s);
    ditd_gguf *g = NULL;
    TU_OK(ditd_gguf_open_mem(b.p, b.n, "made.gguf", &g));
    if (g) {
        float w[128], bias[2];
        TU_OK(ditd_gguf_read_f32(g, "w", 2, (int64_t[]){2, 64}, w));
        int ok = 1;
        for (int i = 0; i < 128; i++)
            ok &= w[i] == (float)(i - 64);
        TU_CHECK(ok, "w values");
        TU_OK(ditd_gguf_read_f32(g, "bias", 1, (int64_t[]){2}, bias));
        TU_CHECK(bias[0] == 0.5f && bias[1] == -2.0f, "bias %g %g", bias[0], bias[1]);
        TU_CHECK(ditd_gguf_count(g) == 2 && strcmp(ditd_gguf_at(g, 0)->name, "bias") == 0,
                 "sorted by name");
        ditd_gguf_free(g);
    }

    spec t;
#define BROKEN(field, value, sub1, sub2) \
    (t = valid_spec(), t.field = (value), expect_refused(#field, &t, sub1, sub2))
    BROKEN(off_a, 1ull << 40, "'w'", "past the end");
    BROKEN(off_a, UINT64_MAX - 31, "'w'", "past the end");
    BROKEN(off_a, 8, "'w'", "alignment");
    BROKEN(off_b, 128, "overlap", "'bias'");
    BROKEN(ne1_a, 1ull << 62, "'w'", NULL);
    BROKEN(ne1_a, UINT64_MAX, "'w'", "dimension");
    BROKEN(ne0_a, 33, "'w'", "Q8_0 blocks");
    BROKEN(type_a, 99, "'w'", "unknown ggml type 99");
    BROKEN(type_a, 4, "'w'", "unknown ggml type 4");
    BROKEN(ndim_a, 6, "'w'", "dimensions");
    BROKEN(ndim_a, 0, "'w'", "dimensions");
    BROKEN(align, 3, "general.alignment", "power of two");
    BROKEN(align, 0, "general.alignment", NULL);
    BROKEN(align_type, DITD_GGUF_V_UINT8, "general.alignment", "UINT8");
    BROKEN(version, 1, "version 1", NULL);
    BROKEN(nt, 1ull << 60, "tensor infos cannot fit", NULL);
    BROKEN(nkv, 1ull << 60, "metadata entries cannot fit", NULL);
    BROKEN(name_b, "w", "'w'", "twice");
    BROKEN(dup_key, 1, "general.name", "twice");
    BROKEN(nested_array, 1, "test.nested", "arrays of arrays");
    BROKEN(bad_bool, 1, "test.flag", "BOOL");
    BROKEN(str_len_override, 1ull << 50, "general.name", "ends first");
    BROKEN(str_len_override, UINT64_MAX, "general.name", "ends first");
#undef BROKEN
    /* bad magic */
    build(&b, &s);
    b.p[0] = 'X';
    TU_CHECK_ERR(ditd_gguf_open_mem(b.p, b.n, "made.gguf", &g), DITD_EFORMAT, "not a GGUF");

    /* every truncation fails, with a detail */
    buf full;
    build(&full, &s);
    int refused = 0;
    for (size_t n = 0; n < full.n; n++) {
        ditd_err_clear();
        int rc = ditd_gguf_open_mem(full.p, n, "cut.gguf", &g);
        refused += rc == DITD_EFORMAT && g == NULL && ditd_err_detail()[0] != '\0';
        if (rc == 0)
            ditd_gguf_free(g);
    }
    TU_CHECK(refused == (int)full.n, "%d of %zu truncations refused", refused, full.n);

    /* random byte flips in the header: open or refuse with a detail */
    int flips = 0, opened = 0;
    for (int i = 0; i < 3000; i++) {
        build(&b, &s);
        int k = 1 + (int)(tu_rng() % 4);
        for (int j = 0; j < k; j++)
            b.p[tu_rng() % 200] ^= (uint8_t)(1u << (tu_rng() % 8));
        ditd_err_clear();
        int rc = ditd_gguf_open_mem(b.p, b.n, "flip.gguf", &g);
        if (rc == 0) {
            opened++;
            for (size_t t = 0; t < ditd_gguf_count(g); t++) {
                const ditd_gguf_tensor *x = ditd_gguf_at(g, t);
                TU_CHECK((const uint8_t *)x->data + x->nbytes <= b.p + b.n, "view outside");
            }
            ditd_gguf_free(g);
        } else {
            flips += ditd_err_detail()[0] != '\0' && g == NULL;
        }
    }
    TU_CHECK(flips + opened == 3000, "flips: %d refused with a detail, %d opened", flips, opened);
    printf("byte flips: %d refused, %d opened\n", flips, opened);
}

/* The dequantizer's block table and its row-panel helper. */
static void test_dequant_rows(void)
{
    int e = 0, by = 0;
    TU_CHECK(ditd_cpu_dequant_block(DITD_Q_Q4_K, &e, &by) && e == 256 && by == 144, "Q4_K block");
    TU_CHECK(!ditd_cpu_dequant_block(20, NULL, NULL), "IQ4_NL is not dequantized");
    /* 3 rows of 64 Q8_0 values; transpose a k range [32, 64) of rows 1..2 */
    uint8_t q[3 * 2 * 34];
    for (int i = 0; i < 6; i++) {
        q[i * 34] = 0x00;
        q[i * 34 + 1] = 0x38; /* 0.5 */
        for (int l = 0; l < 32; l++)
            q[i * 34 + 2 + l] = (uint8_t)(int8_t)(i * 7 + l - 50);
    }
    float t[32 * 2], full[3 * 64];
    ditd_cpu_dequant(DITD_Q_Q8_0, q, full, 3 * 64);
    ditd_cpu_dequant_rows(DITD_Q_Q8_0, q, 68, NULL, 1, 2, 32, 64, t, 2, 1);
    int ok = 1;
    for (int k = 0; k < 32; k++)
        for (int r = 0; r < 2; r++)
            ok &= t[k * 2 + r] == full[(1 + r) * 64 + 32 + k];
    TU_CHECK(ok, "transposed rows");
}

/* The weight source over a GGUF file: aliases (row segments of the file's
 * tensors), their reads and slices, the quantized-storage queries. */
static void test_weights(void)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/gguf", tu_fixtures());
    ditd_weights *w = NULL;
    TU_CHECK_ERR(ditd_weights_open(path, &w), DITD_EFORMAT, "two GGUF files");
    snprintf(path, sizeof path, "%s/gguf/types.gguf", tu_fixtures());
    TU_OK(ditd_weights_open(path, &w));
    if (!w)
        return;
    TU_CHECK(strcmp(ditd_weights_format(w), "gguf") == 0 && ditd_weights_gguf(w), "format");
    /* (4, 512): rows 1..2 of the Q8_0 tensor, then row 0 and 2 of Q4_K */
    const ditd_weight_seg segs[3] = {{"q.Q8_0", 1, 2}, {"q.Q4_K", 0, 1}, {"q.Q4_K", 2, 1}};
    TU_OK(ditd_weights_alias(w, "cat", 3, segs));
    const ditd_weight_seg whole = {"q.Q8_0", 0, -1};
    TU_OK(ditd_weights_alias(w, "all", 1, &whole));
    static float a[3 * 512], b[3 * 512], got[4 * 512], want[4 * 512];
    const int64_t s3[2] = {3, 512}, s4[2] = {4, 512};
    TU_OK(ditd_weights_read_f32(w, "ref.Q8_0", 2, s3, a));
    TU_OK(ditd_weights_read_f32(w, "ref.Q4_K", 2, s3, b));
    memcpy(want, a + 512, 2 * 512 * sizeof *a);
    memcpy(want + 1024, b, 512 * sizeof *b);
    memcpy(want + 1536, b + 1024, 512 * sizeof *b);
    TU_OK(ditd_weights_read_f32(w, "cat", 2, s4, got));
    bit_equal("alias cat", got, want, 4 * 512);
    TU_OK(ditd_weights_read_f32_slice(w, "cat", 2, s4, 0, 1, 2, got));
    bit_equal("alias row slice", got, want + 512, 2 * 512);
    TU_OK(ditd_weights_read_f32_slice(w, "cat", 2, s4, 1, 100, 200, got));
    for (int r = 0; r < 4; r++)
        bit_equal("alias column slice", got + r * 200, want + r * 512 + 100, 200);
    TU_OK(ditd_weights_read_f32(w, "all", 2, s3, got));
    bit_equal("alias all", got, a, 3 * 512);
    TU_CHECK_ERR(ditd_weights_read_f32(w, "cat", 2, s3, got), DITD_ESHAPE, "cat", "(4, 512)");
    TU_CHECK(ditd_weights_has(w, "cat") && !ditd_weights_has_raw(w, "cat"), "has");
    /* refused aliases */
    const ditd_weight_seg past = {"q.Q8_0", 2, 2}, none = {"nope", 0, 1},
                          other[2] = {{"q.Q8_0", 0, 1}, {"q3.Q8_0", 0, 1}};
    TU_CHECK_ERR(ditd_weights_alias(w, "x", 1, &past), DITD_EFORMAT, "q.Q8_0", "'x'");
    TU_CHECK_ERR(ditd_weights_alias(w, "x", 1, &none), DITD_EFORMAT, "nope", "'x'");
    TU_CHECK_ERR(ditd_weights_alias(w, "x", 2, other), DITD_EFORMAT, "q3.Q8_0");
    /* quantized storage: Q8_0 and its alias yes, F16 and mixed types no */
    int type = -1;
    size_t rb = 0;
    TU_CHECK(ditd_weights_quant(w, "q.Q8_0", 3, 512, &type, &rb) && type == DITD_GGUF_Q8_0 &&
                 rb == 16 * 34,
             "quant Q8_0: type %d, row bytes %zu", type, rb);
    TU_CHECK(ditd_weights_quant(w, "all", 3, 512, &type, &rb), "quant alias");
    TU_CHECK(!ditd_weights_quant(w, "q.F16", 3, 512, &type, &rb), "F16 is not blocks");
    TU_CHECK(!ditd_weights_quant(w, "cat", 4, 512, &type, &rb), "mixed types");
    TU_CHECK(!ditd_weights_quant(w, "q.Q8_0", 3, 256, &type, &rb), "wrong K");
    uint8_t rows[2 * 16 * 34];
    const ditd_gguf_tensor *t = ditd_gguf_find(ditd_weights_gguf(w), "q.Q8_0");
    TU_OK(ditd_weights_rows(w, "all", 1, 2, rows));
    TU_CHECK(t && memcmp(rows, (const uint8_t *)t->data + rb, 2 * rb) == 0, "rows copied");
    TU_CHECK_ERR(ditd_weights_rows(w, "all", 2, 2, rows), DITD_ERANGE, "all");
    char line[256];
    ditd_weights_summary(w, line, sizeof line);
    printf("summary: %s\n", line);
    TU_CHECK(strncmp(line, "gguf, 0.1 MB in 29 tensors: F32 15,", 35) == 0 &&
                 strstr(line, "Q4_K 1") && strstr(line, "IQ4_NL 1"),
             "summary: %s", line);
    ditd_weights_free(w);
}

int main(void)
{
    tu_seed();
    test_types();
    test_made();
    test_dequant_rows();
    test_weights();
    return tu_exit();
}
