/* The weight list walk (engine/models/weight_list.h): a toy list over a
 * tiny safetensors file, planned (this rank's shapes), loaded (whole, a tp
 * rank's rows, two column ranges side by side, three fused parts split by
 * rows, a vector, a tp rank's slice of a vector, a vector in the activation
 * type with an edit, a (1, 3) table read as a vector) and compared value by
 * value with the file; a missing tensor and a wrong shape refused naming
 * the tensor. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/backend/backend.h"
#include "engine/core/error.h"
#include "engine/io/weights.h"
#include "engine/models/weight_list.h"
#include "tests/test_util.h"

static char dir[256];

/* a.weight (4, 6) = 0..23, a.bias (4) = 100..103, q/k/v.weight (4, 6) =
 * 1000 p + i, q/k/v.bias (4) = 2000 p + i, n.weight (3) = 7, 8, 9 */
static void write_fixture(const char *path)
{
    float data[24 + 4 + 3 * 24 + 3 * 4 + 3 + 3];
    float *d = data;
    char hdr[2048];
    size_t off = 0;
    int n = snprintf(hdr, sizeof hdr, "{");
#define T(name, shp, cnt)                                                                       \
    n += snprintf(hdr + n, sizeof hdr - (size_t)n,                                             \
                  "%s\"%s\":{\"dtype\":\"F32\",\"shape\":%s,\"data_offsets\":[%zu,%zu]}",     \
                  off ? "," : "", name, shp, off, off + (cnt) * 4);                            \
    off += (cnt) * 4
    T("a.weight", "[4,6]", 24);
    for (int i = 0; i < 24; i++)
        *d++ = (float)i;
    T("a.bias", "[4]", 4);
    for (int i = 0; i < 4; i++)
        *d++ = 100.0f + (float)i;
    const char *pn[3] = {"p.q.weight", "p.k.weight", "p.v.weight"};
    const char *pb[3] = {"p.q.bias", "p.k.bias", "p.v.bias"};
    for (int p = 0; p < 3; p++) {
        T(pn[p], "[4,6]", 24);
        for (int i = 0; i < 24; i++)
            *d++ = 1000.0f * (float)(p + 1) + (float)i;
        T(pb[p], "[4]", 4);
        for (int i = 0; i < 4; i++)
            *d++ = 2000.0f * (float)(p + 1) + (float)i;
    }
    T("n.weight", "[3]", 3);
    for (int i = 0; i < 3; i++)
        *d++ = 7.0f + (float)i;
    T("t.table", "[1,3]", 3);
    for (int i = 0; i < 3; i++)
        *d++ = 20.0f + (float)i;
#undef T
    n += snprintf(hdr + n, sizeof hdr - (size_t)n, "}");
    FILE *f = fopen(path, "wb");
    uint64_t hl = (uint64_t)n;
    fwrite(&hl, 8, 1, f);
    fwrite(hdr, 1, (size_t)n, f);
    fwrite(data, 1, off, f);
    fclose(f);
}

static void minus_one(float *v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        v[i] -= 1.0f;
}

typedef struct lin {
    void *w, *b;
    ditd_qweight q;
} lin;

int main(void)
{
    const ditd_backend_ops *ops = &ditd_backend_cpu;
    char path[512];
    if (tu_mkdtemp(dir, sizeof dir, "weight_list"))
        return 1;
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    write_fixture(path);
    ditd_weights *st = NULL;
    TU_OK(ditd_weights_open(path, &st));

    lin whole, rows, cols, fused;
    void *vec, *vslice, *vact, *vtab;
    ditd_wl wl = {0};
    const int64_t c0[2] = {1, 4}, cn[2] = {2, 1};
    ditd_wl_add(&wl, 0, 4, 6, &whole.w, &whole.b, &whole.q, "a");
    ditd_wl_rows_of(ditd_wl_add(&wl, 0, 4, 6, &rows.w, &rows.b, &rows.q, "a"), 1, 2);
    ditd_wl_cols_of(ditd_wl_add(&wl, 0, 4, 6, &cols.w, &cols.b, &cols.q, "a"), 2, c0, cn);
    ditd_wl_rows_of(ditd_wl_add_fused(&wl, 0, 4, 6, &fused.w, &fused.b, &fused.q, "p", 3,
                                      (const char *const[]){"q", "k", "v"}),
                    3, 1);
    ditd_wl_add(&wl, DITD_WL_VEC, 3, 0, &vec, NULL, NULL, "n.weight");
    ditd_wl_rows_of(ditd_wl_add(&wl, DITD_WL_VEC, 3, 0, &vslice, NULL, NULL, "n.weight"), 1, 2);
    ditd_wl_vec_fix(ditd_wl_add(&wl, DITD_WL_VEC | DITD_WL_ACT, 3, 0, &vact, NULL, NULL, "n.weight"),
                    minus_one);
    ditd_wl_vec_shape(ditd_wl_add(&wl, DITD_WL_VEC | DITD_WL_ACT, 3, 0, &vtab, NULL, NULL, "t.table"),
                      2, (const int64_t[]){1, 3});
    TU_CHECK(wl.n == 8 && !wl.err, "8 entries listed (%d, err %d)", wl.n, wl.err);
    /* this rank's shapes */
    const int64_t want_nk[4][2] = {{4, 6}, {2, 6}, {4, 3}, {3, 6}};
    int checked = 0;
    for (int i = 0; i < 4; i++, checked++)
        TU_CHECK(ditd_wl_rows(&wl.e[i]) == want_nk[i][0] && ditd_wl_cols(&wl.e[i]) == want_nk[i][1],
                 "entry %d: (%lld, %lld), want (%lld, %lld)", i, (long long)ditd_wl_rows(&wl.e[i]),
                 (long long)ditd_wl_cols(&wl.e[i]), (long long)want_nk[i][0],
                 (long long)want_nk[i][1]);

    ditd_arena a;
    ditd_arena_init_mem(&a, ops->mem_alloc, ops->mem_free);
    TU_OK(ditd_wl_plan(&wl, &a, ops, st));
    /* weights + biases + the vector, all f32 */
    size_t floats = (24 + 4) + (12 + 2) + (12 + 4) + (18 + 3) + 3 + 2 + 3 + 3;
    TU_CHECK(a.peak_plan >= floats * 4, "planned %zu bytes < %zu", a.peak_plan, floats * 4);
    TU_OK(ditd_arena_commit(&a, a.peak_plan));
    TU_OK(ditd_wl_plan(&wl, &a, ops, st));
    TU_OK(ditd_wl_load(&wl, st, ops));

    const float *w = whole.w, *b = whole.b;
    for (int i = 0; i < 24; i++, checked++)
        TU_CHECK(w[i] == (float)i, "whole w[%d] = %g", i, (double)w[i]);
    for (int i = 0; i < 4; i++, checked++)
        TU_CHECK(b[i] == 100.0f + (float)i, "whole b[%d] = %g", i, (double)b[i]);
    w = rows.w;
    b = rows.b;
    for (int i = 0; i < 12; i++, checked++) /* rows 1, 2 */
        TU_CHECK(w[i] == (float)(6 + i), "rows w[%d] = %g", i, (double)w[i]);
    for (int i = 0; i < 2; i++, checked++)
        TU_CHECK(b[i] == 101.0f + (float)i, "rows b[%d] = %g", i, (double)b[i]);
    w = cols.w;
    b = cols.b;
    for (int r = 0; r < 4; r++) { /* columns 1, 2 then 4 of each row; the whole bias */
        const int want[3] = {6 * r + 1, 6 * r + 2, 6 * r + 4};
        for (int j = 0; j < 3; j++, checked++)
            TU_CHECK(w[r * 3 + j] == (float)want[j], "cols w[%d][%d] = %g, want %d", r, j,
                     (double)w[r * 3 + j], want[j]);
        TU_CHECK(b[r] == 100.0f + (float)r, "cols b[%d] = %g", r, (double)b[r]);
        checked++;
    }
    w = fused.w;
    b = fused.b;
    for (int p = 0; p < 3; p++) { /* row 3 of q, k, v */
        for (int j = 0; j < 6; j++, checked++)
            TU_CHECK(w[p * 6 + j] == 1000.0f * (float)(p + 1) + (float)(18 + j),
                     "fused part %d w[%d] = %g", p, j, (double)w[p * 6 + j]);
        TU_CHECK(b[p] == 2000.0f * (float)(p + 1) + 3.0f, "fused part %d bias = %g", p,
                 (double)b[p]);
        checked++;
    }
    for (int i = 0; i < 3; i++, checked++)
        TU_CHECK(((const float *)vec)[i] == 7.0f + (float)i, "vec[%d]", i);
    for (int i = 0; i < 2; i++, checked++) /* rows 1, 2 of n.weight */
        TU_CHECK(((const float *)vslice)[i] == 8.0f + (float)i, "vector slice [%d] = %g", i,
                 (double)((const float *)vslice)[i]);
    for (int i = 0; i < 3; i++, checked++) /* the CPU table's activations are f32 too */
        TU_CHECK(((const float *)vact)[i] == 6.0f + (float)i, "vector edited [%d] = %g", i,
                 (double)((const float *)vact)[i]);
    for (int i = 0; i < 3; i++, checked++)
        TU_CHECK(((const float *)vtab)[i] == 20.0f + (float)i, "(1, 3) table [%d] = %g", i,
                 (double)((const float *)vtab)[i]);
    TU_CHECK(checked >= 94, "%d values checked", checked);
    int quantized = 0;
    for (int i = 0; i < 4; i++)
        wl.e[i].flags |= DITD_WL_PACK;
    TU_OK(ditd_wl_pack(&wl, ops, &quantized));
    TU_CHECK(quantized == 0, "%d quantized linears in a float file", quantized);
    ditd_arena_free(&a);
    ditd_wl_free(&wl);

    /* refusals name the tensor */
    static const struct {
        const char *name;
        int64_t rows, cols;
        const char *says;
    } bad[] = {
        {"zz", 4, 6, "zz.weight"},
        {"a", 5, 6, "a.weight"},
        {"a", 4, 7, "a.weight"},
        {"t.table", 3, 0, "t.table"}, /* (1, 3) in the file, (3) asked */
    };
    int refused = 0;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        lin x;
        ditd_wl_add(&wl, bad[i].cols ? 0 : DITD_WL_VEC, bad[i].rows, bad[i].cols, &x.w, &x.b, &x.q,
                    "%s", bad[i].name);
        ditd_arena_init_mem(&a, ops->mem_alloc, ops->mem_free);
        TU_OK(ditd_wl_plan(&wl, &a, ops, st));
        TU_OK(ditd_arena_commit(&a, a.peak_plan));
        TU_OK(ditd_wl_plan(&wl, &a, ops, st));
        int err = ditd_wl_load(&wl, st, ops);
        const char *msg = ditd_err_detail();
        TU_CHECK(err != 0 && msg && tu_has(msg, bad[i].says), "%s (%lld, %lld): err %d, \"%s\"",
                 bad[i].name, (long long)bad[i].rows, (long long)bad[i].cols, err, msg ? msg : "");
        if (err)
            printf("refused: %s\n", msg);
        refused += err != 0;
        ditd_arena_free(&a);
        ditd_wl_free(&wl);
    }
    TU_CHECK(refused == 4, "%d of 4 refused", refused);
    ditd_weights_free(st);
    remove(path);
    rmdir(dir);
    printf("weight list: %d values checked, %d refusals\n", checked, refused);
    return tu_exit();
}
