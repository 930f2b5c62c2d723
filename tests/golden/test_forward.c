/* Golden: the DiT forward of every fixture model against Diffusers (float64
 * reference made by tools/make_fixtures.py). Bound: relative error
 * max|ours - ref| / max|ref| <= 1e-5 on every output tensor. */
#include <jansson.h>
#include <string.h>

#include "engine/backend/backend.h"
#include "engine/models/dit/dit.h"
#include "engine/models/model.h"
#include "engine/io/npy.h"
#include "tests/test_util.h"

#define TOL 1e-5

static float *load_f32(const char *dir, const char *file, int64_t *shape, int *nd)
{
    char path[4096];
    float *d = NULL;
    snprintf(path, sizeof path, "%s/expected/%s", dir, file);
    TU_OK(ditd_npy_read_f32(path, 4, nd, shape, &d));
    return d;
}

static void run_model(const char *dir, void *ud)
{
    char path[4096];
    json_error_t jerr;
    ditd_model_info info;
    json_t *cases, *fwd, *c;
    size_t i;

    (void)ud;
    snprintf(path, sizeof path, "%s/expected/cases.json", dir);
    cases = json_load_file(path, 0, &jerr);
    TU_CHECK(cases != NULL, "%s: %s", path, jerr.text);
    if (!cases)
        return;
    TU_OK(ditd_model_info_load(dir, &info));
    fwd = json_object_get(cases, "forward");
    json_array_foreach(fwd, i, c) {
        int nd, ndt, ndy, ndo;
        int64_t sx[4], st[4], sy[4], so[4];
        float *x = load_f32(dir, json_string_value(json_object_get(c, "x")), sx, &nd);
        float *t = load_f32(dir, json_string_value(json_object_get(c, "t")), st, &ndt);
        float *want = load_f32(dir, json_string_value(json_object_get(c, "out")), so, &ndo);
        int64_t *y = NULL;
        snprintf(path, sizeof path, "%s/expected/%s", dir, json_string_value(json_object_get(c, "y")));
        TU_OK(ditd_npy_read_i64(path, 4, &ndy, sy, &y));
        if (!x || !t || !want || !y)
            goto next;
        int B = (int)sx[0];
        /* through the family seam: the registry's table, class ids as
         * conditioning rows */
        ditd_denoiser *m = NULL;
        ditd_cond cond;
        TU_CHECK(info.denoiser == &ditd_dit_family, "%s: registry gives %s", info.name,
                 info.denoiser ? info.denoiser->class_name : "none");
        TU_OK(ditd_denoiser_load(info.denoiser, info.transformer_dir, &ditd_backend_cpu, B, NULL, &m));
        TU_OK(ditd_cond_init(&cond, &info.shapes.cond, B));
        if (m && cond.class_ids) {
            TU_CHECK(ndo == 4 && so[0] == B && so[1] == m->shapes.out_channels, "out shape");
            size_t n = (size_t)(so[0] * so[1] * so[2] * so[3]);
            float *got = calloc(n, sizeof *got);
            memcpy(cond.class_ids, y, (size_t)B * sizeof *y);
            TU_OK(ditd_denoiser_forward(m, B, x, t, &cond, got));
            char what[512];
            snprintf(what, sizeof what, "%s forward[%zu] B=%d", info.name, i, B);
            TU_CLOSE(what, got, want, n, TOL);
            free(got);
        }
        ditd_denoiser_free(m);
        ditd_cond_free(&cond);
    next:
        free(x);
        free(t);
        free(want);
        free(y);
    }
    ditd_model_info_free(&info);
    json_decref(cases);
}

int main(void)
{
    int models = tu_foreach_fixture_model(run_model, NULL);
    TU_CHECK(models >= 4, "found %d fixture models", models);
    return tu_exit();
}
