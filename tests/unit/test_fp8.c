/* FP8 weights (F8_E4M3, torch's float8_e4m3fn, and F8_E5M2) in safetensors
 * files, against torch (tests/fixtures/flux_fp8/values.safetensors, written
 * by tools/make_flux_fp8_fixtures.py):
 *
 *   - every one of the 256 bytes of each type read as f32 equal to torch's
 *     float() bit for bit (NaNs as NaNs), through the reader and through
 *     the kernels' dequantization;
 *   - a weight with per-row scales (BF16 `weight_scale` (N, 1)) and one with
 *     a per-tensor scale (ComfyUI's `scale_weight`) equal to torch's
 *     q.float() * s bit for bit, whole and sliced along both axes;
 *   - the weights seam keeping them as stored (type, row bytes, rows, row
 *     scales), and DITD_WEIGHTS_DEQUANTIZE=1 turning that off;
 *   - refused, naming the tensor: block-wise scales (`weight_scale_inv`), a
 *     scale of another shape, of an integer dtype, a non-finite scale.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/io/safetensors.h"
#include "engine/io/weights.h"
#include "kernels/cpu/dequant.h"
#include "tests/test_util.h"

static int same_bits(float a, float b)
{
    return (isnan(a) && isnan(b)) || memcmp(&a, &b, sizeof a) == 0;
}

static void check_equal(const char *what, const float *got, const float *want, size_t n)
{
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < n; i++)
        if (!same_bits(got[i], want[i]) && !bad++)
            first = i;
    TU_CHECK(bad == 0, "%s: %zu of %zu values differ, first [%zu] %.9g vs %.9g", what, bad, n,
             first, (double)got[first], (double)want[first]);
}

static void values(const char *path)
{
    ditd_safetensors *st = NULL;
    TU_OK(ditd_safetensors_open(path, &st));
    if (!st)
        return;
    const int64_t n256[1] = {256}, rc[2] = {5, 7};
    float got[256], want[256];
    static const struct {
        const char *name, *ref;
        int type;
    } types[] = {{"e4m3", "e4m3_f32", DITD_Q_F8_E4M3}, {"e5m2", "e5m2_f32", DITD_Q_F8_E5M2}};
    for (int i = 0; i < 2; i++) {
        TU_OK(ditd_safetensors_read_f32(st, types[i].name, 1, n256, got));
        TU_OK(ditd_safetensors_read_f32(st, types[i].ref, 1, n256, want));
        check_equal(types[i].name, got, want, 256);
        const ditd_st_tensor *t = ditd_safetensors_find(st, types[i].name);
        if (t) {
            ditd_cpu_dequant(types[i].type, t->data, got, 256);
            check_equal("kernels' dequantization", got, want, 256);
        }
    }
    /* scaled weights, whole and sliced */
    static const char *const scaled[][2] = {{"row.weight", "row_f32"}, {"one.weight", "one_f32"}};
    for (int i = 0; i < 2; i++) {
        float w[35], ref[35], part[35];
        TU_OK(ditd_safetensors_read_f32(st, scaled[i][0], 2, rc, w));
        TU_OK(ditd_safetensors_read_f32(st, scaled[i][1], 2, rc, ref));
        check_equal(scaled[i][0], w, ref, 35);
        TU_OK(ditd_safetensors_read_f32_slice(st, scaled[i][0], 2, rc, 0, 1, 3, part));
        check_equal("rows [1, 4)", part, ref + 7, 21);
        TU_OK(ditd_safetensors_read_f32_slice(st, scaled[i][0], 2, rc, 1, 2, 4, part));
        float cols[20];
        for (int r = 0; r < 5; r++)
            memcpy(cols + 4 * r, ref + 7 * r + 2, 4 * sizeof(float));
        check_equal("columns [2, 6)", part, cols, 20);
    }
    ditd_safetensors_free(st);

    /* the seam: kept as stored, with the rows' scales */
    ditd_weights *w = NULL;
    TU_OK(ditd_weights_open(path, &w));
    if (!w)
        return;
    int type = -1;
    size_t rb = 0;
    TU_CHECK(ditd_weights_quant(w, "row.weight", 5, 7, &type, &rb) == 1 &&
                 type == DITD_Q_F8_E4M3 && rb == 7,
             "row.weight kept as F8_E4M3 rows of 7 bytes (type %d, %zu)", type, rb);
    TU_CHECK(!ditd_weights_quant(w, "row.weight", 5, 8, &type, &rb), "another K is not it");
    TU_CHECK(!ditd_weights_quant(w, "row_f32", 5, 7, &type, &rb), "F32 is not stored FP8");
    uint8_t bytes[14];
    float sc[5], ref[35], deq[14];
    TU_OK(ditd_weights_rows(w, "row.weight", 1, 2, bytes));
    TU_OK(ditd_weights_row_scales(w, "row.weight", 0, 5, sc));
    TU_OK(ditd_weights_read_f32(w, "row_f32", 2, rc, ref));
    ditd_cpu_dequant_rows(DITD_Q_F8_E4M3, bytes, 7, sc + 1, 0, 2, 0, 7, deq, 7, 0);
    check_equal("rows [1, 3) dequantized with their scales", deq, ref + 7, 14);
    TU_OK(ditd_weights_row_scales(w, "one.weight", 2, 3, sc));
    TU_CHECK(sc[0] == sc[1] && sc[1] == sc[2] && sc[0] != 1.0f,
             "a per-tensor scale repeated on every row (%g %g %g)", (double)sc[0], (double)sc[1],
             (double)sc[2]);
    TU_CHECK_ERR(ditd_weights_rows(w, "row.weight", 4, 2, bytes), DITD_ERANGE, "row.weight");
    TU_CHECK_ERR(ditd_weights_rows(w, "row_f32", 0, 1, bytes), DITD_EINVAL, "row_f32");
    char line[256];
    ditd_weights_summary(w, line, sizeof line);
    printf("     %s\n", line);
    TU_CHECK(tu_has(line, "F8_E4M3 3") && tu_has(line, "F8_E5M2 1"), "summary names FP8: %s",
             line);
    ditd_weights_free(w);
    setenv("DITD_WEIGHTS_DEQUANTIZE", "1", 1);
    TU_OK(ditd_weights_open(path, &w));
    unsetenv("DITD_WEIGHTS_DEQUANTIZE");
    TU_CHECK(w && !ditd_weights_quant(w, "row.weight", 5, 7, &type, &rb),
             "DITD_WEIGHTS_DEQUANTIZE=1 keeps nothing as FP8");
    ditd_weights_free(w);
}

/* One FP8 weight w.weight (2, 2) and a scale tensor in a file of its own;
 * reading the weight must fail with code naming what. */
static void refuse(const char *dir, const char *scale_json, const void *scale, size_t sbytes,
                   int code, const char *what)
{
    char header[512], path[600];
    uint8_t data[64] = {0x38, 0x40, 0xb8, 0x30}; /* 1, 2, -1, 0.5 in E4M3 */
    memcpy(data + 4, scale, sbytes);
    snprintf(header, sizeof header,
             "{\"w.weight\":{\"dtype\":\"F8_E4M3\",\"shape\":[2,2],\"data_offsets\":[0,4]},%s}",
             scale_json);
    size_t len;
    uint8_t *img = tu_st_image(header, data, 4 + sbytes, &len);
    snprintf(path, sizeof path, "%s/w.safetensors", dir);
    FILE *f = fopen(path, "wb");
    TU_CHECK(f && img && fwrite(img, 1, len, f) == len, "writing %s", path);
    if (f)
        fclose(f);
    free(img);
    ditd_safetensors *st = NULL;
    TU_OK(ditd_safetensors_open(path, &st));
    const int64_t shape[2] = {2, 2};
    float out[4];
    if (st)
        TU_CHECK_ERR(ditd_safetensors_read_f32(st, "w.weight", 2, shape, out), code, "w.weight",
                     what);
    ditd_safetensors_free(st);
    unlink(path);
}

static void refusals(void)
{
    char dir[512];
    if (tu_mkdtemp(dir, sizeof dir, "fp8") != 0)
        return;
    const float two[3] = {2.0f, 2.0f, 2.0f}, nan1 = NAN;
    const int32_t i1 = 2;
    refuse(dir, "\"w.weight_scale_inv\":{\"dtype\":\"F32\",\"shape\":[1,1],\"data_offsets\":[4,8]}",
           two, 4, DITD_EUNSUPPORTED, "block-wise");
    refuse(dir, "\"w.weight_scale\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[4,16]}",
           two, 12, DITD_EFORMAT, "w.weight_scale");
    refuse(dir, "\"w.scale_weight\":{\"dtype\":\"I32\",\"shape\":[],\"data_offsets\":[4,8]}", &i1,
           4, DITD_EFORMAT, "I32");
    refuse(dir, "\"w.weight_scale\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[4,8]}",
           &nan1, 4, DITD_EFORMAT, "not finite");
    rmdir(dir);
}

int main(void)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/flux_fp8/values.safetensors", tu_fixtures());
    values(path);
    refusals();
    TU_CHECK(tu_checks >= 25, "FP8 checks run: %d", tu_checks);
    return tu_exit();
}
