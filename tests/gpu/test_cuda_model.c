/* GPU: the whole model on the CUDA backend. For every fixture model,
 *   - each forward case against the float64 Diffusers reference in the
 *     fixture: rel = max|gpu - ref| / max|ref| <= FWD;
 *   - each sampling case (10 steps, the fixture's sampler and guidance,
 *     from the fixture's noise) against the CPU backend's sampling of the
 *     same case: rel <= SAMPLE on the final latents.
 * Exits 77 without a GPU.
 *
 * Bounds: bf16 activations and weights carry a relative rounding of 2^-9
 * per op; through a few blocks of a tiny DiT the forward's error stays near
 * 1e-2 of the output's range (FWD = 3e-2 leaves room, rel_l2 is printed).
 * Sampling feeds each step's error into the next; ten steps of DDIM /
 * DPM-Solver++ / flow Euler contract more than they amplify, SAMPLE = 5e-2.
 * These are the stated bounds; the first GPU run is what confirms them
 * (docs/cuda.md). A failed comparison's arrays are written as .npy to
 * DITD_TEST_OUT (else $OUT) when set. */
#include <jansson.h>
#include <sys/stat.h>

#include "engine/backend/backend.h"
#include "engine/backend/backend_cuda.h"
#include "engine/models/dit/dit.h"
#include "engine/models/model.h"
#include "engine/io/npy.h"
#include "engine/pipeline/pipeline.h"
#include "tests/test_util.h"

#define FWD 3e-2
#define SAMPLE 5e-2

static const ditd_backend_ops *G;

/* A failed comparison's arrays as .npy (got, want) in DITD_TEST_OUT, else
 * $OUT, when set: the kit's output folder. */
static void dump_failed(const char *what, const float *got, const float *want, int nd,
                        const int64_t *shape, double tol)
{
    const char *dir = getenv("DITD_TEST_OUT");
    char path[4096], name[256];
    size_t n = 1, j = 0;
    if (!dir || !*dir)
        dir = getenv("OUT");
    if (!dir || !*dir)
        return;
    for (int i = 0; i < nd; i++)
        n *= (size_t)shape[i];
    if (tu_compare(got, want, n).rel <= tol)
        return;
    mkdir(dir, 0777);
    for (const char *p = what; *p && j + 1 < sizeof name; p++)
        name[j++] = (char)(((*p | 32) >= 'a' && (*p | 32) <= 'z') || (*p >= '0' && *p <= '9') ? *p : '_');
    name[j] = 0;
    for (int k = 0; k < 2; k++) {
        snprintf(path, sizeof path, "%s/%s.%s.npy", dir, name, k ? "want" : "got");
        if (ditd_npy_write_f32(path, nd, shape, k ? want : got))
            fprintf(stderr, "  (could not write %s: %s)\n", path, ditd_err_detail());
        else
            fprintf(stderr, "  wrote %s\n", path);
    }
}

static float *load_f32(const char *dir, const char *file, int64_t *shape, int *nd)
{
    char path[4096];
    float *d = NULL;
    if (!file)
        return NULL;
    snprintf(path, sizeof path, "%s/expected/%s", dir, file);
    TU_OK(ditd_npy_read_f32(path, 4, nd, shape, &d));
    return d;
}

static void forward_cases(const char *dir, const ditd_model_info *info, json_t *cases)
{
    json_t *c;
    size_t i;
    json_array_foreach(json_object_get(cases, "forward"), i, c) {
        int nd, ndt, ndy, ndo;
        int64_t sx[4], st[4], sy[4], so[4];
        char path[4096], what[512];
        float *x = load_f32(dir, json_string_value(json_object_get(c, "x")), sx, &nd);
        float *t = load_f32(dir, json_string_value(json_object_get(c, "t")), st, &ndt);
        float *want = load_f32(dir, json_string_value(json_object_get(c, "out")), so, &ndo);
        int64_t *y = NULL;
        ditd_dit *m = NULL;
        void *dx = NULL, *dout = NULL;
        snprintf(path, sizeof path, "%s/expected/%s", dir,
                 json_string_value(json_object_get(c, "y")));
        TU_OK(ditd_npy_read_i64(path, 4, &ndy, sy, &y));
        if (!x || !t || !want || !y)
            goto next;
        int B = (int)sx[0];
        size_t nin = (size_t)(sx[0] * sx[1] * sx[2] * sx[3]);
        size_t nout = (size_t)(so[0] * so[1] * so[2] * so[3]);
        ditd_dit_config dcfg;
        snprintf(path, sizeof path, "%s/config.json", info->transformer_dir);
        TU_OK(ditd_dit_config_load(path, &dcfg));
        TU_OK(ditd_dit_new(&dcfg, G, B, info->transformer_dir, &m));
        if (!m)
            goto next;
        if (!ditd_backend_cuda_is_device_ptr(m->h)) {
            TU_CHECK(0, "%s: the model's arenas are host memory: engine/models/dit/dit.c must commit them "
                        "through ops->mem_alloc (ditd_arena_init_mem), see docs/cuda.md",
                     info->name);
            goto next;
        }
        TU_OK(G->mem_alloc(&dx, nin * 2));
        TU_OK(G->mem_alloc(&dout, nout * 2));
        if (!dx || !dout)
            goto next;
        G->upload(dx, x, nin);
        float *got = calloc(nout, sizeof *got);
        TU_OK(ditd_dit_forward(m, B, dx, t, y, dout));
        G->download(got, dout, nout);
        TU_OK(G->status());
        snprintf(what, sizeof what, "cuda %s forward[%zu] B=%d vs float64 Diffusers", info->name,
                 i, B);
        TU_CLOSE(what, got, want, nout, FWD);
        dump_failed(what, got, want, ndo, so, FWD);
        free(got);
    next:
        if (dx)
            G->mem_free(dx, 0);
        if (dout)
            G->mem_free(dout, 0);
        ditd_dit_free(m);
        free(x), free(t), free(want), free(y);
    }
}

static void sampling_cases(const char *dir, const ditd_model_info *info, json_t *cases)
{
    ditd_pipeline *pc = NULL, *pg = NULL;
    json_t *c;
    size_t i;
    TU_OK(ditd_pipeline_new(info, &ditd_backend_cpu, 2, &pc));
    TU_OK(ditd_pipeline_new(info, G, 2, &pg));
    if (!pc || !pg)
        goto done;
    if (!ditd_backend_cuda_is_device_ptr(pg->model_in)) {
        TU_CHECK(0, "%s: the pipeline's model input is host memory: engine/pipeline/pipeline.c must take "
                    "model_in/model_out from ops->mem_alloc, see docs/cuda.md",
                 info->name);
        goto done;
    }
    json_array_foreach(json_object_get(cases, "sampling"), i, c) {
        int nd;
        int64_t sn[4];
        float *noise = load_f32(dir, json_string_value(json_object_get(c, "noise")), sn, &nd);
        json_t *labels = json_object_get(c, "class_labels");
        ditd_gen_params gp = {.steps = (int)json_integer_value(json_object_get(c, "steps"))};
        float guidance = (float)json_number_value(json_object_get(c, "guidance_scale"));
        ditd_gen_sample samples[2] = {0};
        int n = (int)json_array_size(labels);
        char what[512];
        TU_OK(ditd_sampler_kind_from_str(json_string_value(json_object_get(c, "sampler")),
                                         &gp.sampler));
        if (!noise || n < 1 || n > 2) {
            free(noise);
            continue;
        }
        for (int k = 0; k < n; k++) {
            samples[k].seed = 0;
            samples[k].index = (uint64_t)k;
            samples[k].cond.class_id = json_integer_value(json_array_get(labels, (size_t)k));
            samples[k].guidance = guidance;
        }
        size_t numel = (size_t)(sn[1] * sn[2] * sn[3]);
        float *ref = calloc((size_t)n * numel, sizeof *ref);
        float *got = calloc((size_t)n * numel, sizeof *got);
        TU_OK(ditd_pipeline_generate(pc, &gp, n, samples, noise, ref, NULL, NULL, NULL));
        TU_OK(ditd_pipeline_generate(pg, &gp, n, samples, noise, got, NULL, NULL, NULL));
        TU_OK(G->status());
        snprintf(what, sizeof what, "cuda %s %s guidance %g, %d steps vs cpu", info->name,
                 ditd_sampler_kind_name(gp.sampler), (double)guidance, gp.steps);
        TU_CLOSE(what, got, ref, (size_t)n * numel, SAMPLE);
        int64_t sh[4] = {n, sn[1], sn[2], sn[3]};
        dump_failed(what, got, ref, 4, sh, SAMPLE);
        free(noise), free(ref), free(got);
    }
done:
    ditd_pipeline_free(pc);
    ditd_pipeline_free(pg);
}

static void run_model(const char *dir, void *ud)
{
    char path[4096];
    json_error_t jerr;
    ditd_model_info info;
    json_t *cases;
    (void)ud;
    snprintf(path, sizeof path, "%s/expected/cases.json", dir);
    cases = json_load_file(path, 0, &jerr);
    TU_CHECK(cases != NULL, "%s: %s", path, jerr.text);
    if (!cases)
        return;
    TU_OK(ditd_model_info_load(dir, &info));
    forward_cases(dir, &info, cases);
    sampling_cases(dir, &info, cases);
    ditd_model_info_free(&info);
    json_decref(cases);
}

int main(void)
{
    if (!ditd_backend_cuda_available()) {
        printf("no CUDA device: skipped\n");
        return 77;
    }
    G = ditd_backend_get(DITD_DEVICE_CUDA);
    TU_CHECK(G != NULL, "CUDA backend: %s", ditd_err_detail());
    if (!G)
        return tu_exit();
    int models = tu_foreach_fixture_model(run_model, NULL);
    TU_CHECK(models >= 4, "found %d fixture models", models);
    ditd_backend_cuda_shutdown();
    return tu_exit();
}
