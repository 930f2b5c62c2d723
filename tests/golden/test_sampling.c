/* Golden: full sampling (10 steps, with and without guidance) for every
 * fixture model and sampler against a float64 Diffusers run of the
 * DiTPipeline loop (tools/make_fixtures.py), from the same initial noise.
 * Bounds: the sampler's timesteps equal Diffusers' (1e-6 relative); the
 * final latents within relative error max|ours - ref| / max|ref| <= 1e-4. */
#include <jansson.h>

#include "engine/backend/backend.h"
#include "engine/models/model.h"
#include "engine/io/npy.h"
#include "engine/pipeline/pipeline.h"
#include "tests/test_util.h"

#define TOL 1e-4

static float *load_f32(const char *dir, json_t *c, const char *key, int64_t *shape, int *nd)
{
    char path[4096];
    float *d = NULL;
    const char *f = json_string_value(json_object_get(c, key));
    if (!f)
        return NULL;
    snprintf(path, sizeof path, "%s/expected/%s", dir, f);
    TU_OK(ditd_npy_read_f32(path, 4, nd, shape, &d));
    return d;
}

static void run_model(const char *dir, void *ud)
{
    int *cases_run = ud;
    char path[4096];
    json_error_t jerr;
    ditd_model_info info;
    ditd_pipeline *p = NULL;
    json_t *cases, *c;
    size_t i;

    snprintf(path, sizeof path, "%s/expected/cases.json", dir);
    cases = json_load_file(path, 0, &jerr);
    TU_CHECK(cases != NULL, "%s: %s", path, jerr.text);
    if (!cases)
        return;
    TU_OK(ditd_model_info_load(dir, &info));
    TU_OK(ditd_pipeline_new(&info, &ditd_backend_cpu, 2, &p));
    if (!p)
        goto done;
    json_array_foreach(json_object_get(cases, "sampling"), i, c) {
        int nd, ndts;
        int64_t sn[4], so[4], sts[4];
        float *noise = load_f32(dir, c, "noise", sn, &nd);
        float *want = load_f32(dir, c, "out", so, &nd);
        float *want_ts = load_f32(dir, c, "timesteps", sts, &ndts);
        json_t *labels = json_object_get(c, "class_labels");
        const char *sampler = json_string_value(json_object_get(c, "sampler"));
        ditd_gen_params gp = {
            .steps = (int)json_integer_value(json_object_get(c, "steps")),
        };
        float guidance = (float)json_number_value(json_object_get(c, "guidance_scale"));
        ditd_gen_sample samples[2] = {0};
        int n = (int)json_array_size(labels);
        char what[512];

        TU_CHECK(n >= 1 && n <= 2, "%d labels", n);
        TU_OK(ditd_sampler_kind_from_str(sampler, &gp.sampler));
        if (!noise || !want || n < 1 || n > 2)
            goto next;
        for (int k = 0; k < n; k++) {
            samples[k].seed = 0;
            samples[k].index = (uint64_t)k;
            samples[k].cond.class_id = json_integer_value(json_array_get(labels, (size_t)k));
            samples[k].guidance = guidance;
        }
        size_t numel = (size_t)(sn[1] * sn[2] * sn[3]);
        float *got = calloc((size_t)n * numel, sizeof *got);
        TU_OK(ditd_pipeline_generate(p, &gp, n, samples, noise, got, NULL, NULL, NULL));
        snprintf(what, sizeof what, "%s %s guidance %g, %d steps", info.name, sampler,
                 (double)guidance, gp.steps);
        if (want_ts && p->sampler) {
            const float *ts = ditd_sampler_timesteps(p->sampler);
            int ns = ditd_sampler_num_steps(p->sampler);
            TU_CHECK(sts[0] == ns, "%s: %lld timesteps in fixture, %d here", what, (long long)sts[0], ns);
            for (int k = 0; k < ns && k < sts[0]; k++)
                TU_CHECK(fabs(ts[k] - want_ts[k]) <= 1e-6 * fabs(want_ts[k]) + 1e-6,
                         "%s: timestep %d: %.9g vs %.9g", what, k, (double)ts[k], (double)want_ts[k]);
        }
        TU_CLOSE(what, got, want, (size_t)n * numel, TOL);
        (*cases_run)++;
        free(got);
    next:
        free(noise);
        free(want);
        free(want_ts);
    }
done:
    ditd_pipeline_free(p);
    ditd_model_info_free(&info);
    json_decref(cases);
}

int main(void)
{
    int cases = 0;
    tu_foreach_fixture_model(run_model, &cases);
    TU_CHECK(cases >= 16, "ran %d sampling cases (4 models x 4 expected)", cases);
    return tu_exit();
}
