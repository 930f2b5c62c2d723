/* Golden: FLUX.1 transformers read from GGUF files (engine/io/gguf.c,
 * engine/io/weights.c, the BFL names of engine/models/flux/flux_bfl.c)
 * against Diffusers computed in float64 on the same weights dequantized by
 * the gguf package (tools/make_flux_gguf_fixtures.py): Q8_0 in FLUX.1's
 * original names and in Diffusers' names, Q4_K/Q5_K/Q6_K in original names
 * with ComfyUI's "model.diffusion_model." prefix. Bound: max|ours - ref| /
 * max|ref| <= 1e-4 on every output; at least 5 cases. The linears stay in
 * their GGML blocks in memory (ops->linear_q), and the forward is
 * bit-identical to the same model dequantized at load
 * (DITD_WEIGHTS_DEQUANTIZE=1), whose weights take more memory; the same on
 * the bf16 table (bf16 compute, 1e-2 against float64 as test_bf16 bounds it).
 * The same checks on FP8 safetensors checkpoints (tests/fixtures/flux_fp8,
 * tools/make_flux_fp8_fixtures.py): E4M3 with per-row `weight_scale`, E4M3
 * in BFL names with ComfyUI's per-tensor `scale_weight`, unscaled E5M2; the
 * linears keep their FP8 bytes and row scales.
 * And a DiT (DiTTransformer2DModel, tests/fixtures/gguf/dit: Q8_0 where rows
 * are whole blocks, F32 elsewhere; tools/make_gguf_fixtures.py), loaded
 * from its GGUF and dequantized at load, against Diffusers in float64 on the
 * same dequantized weights (1e-4). Also refused, naming
 * what is wrong: a config asking for a block the file lacks, a folder with
 * two GGUF files. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/backend/backend.h"
#include "engine/io/npy.h"
#include "engine/models/dit/dit.h"
#include "engine/models/flux/flux.h"
#include "tests/flux_case.h"

#define TOL 1e-4
#define MIN_CASES 5

static int run_model(const char *dir)
{
    char path[4200];
    ditd_flux_config cfg;
    int checked = 0;
    size_t i;
    json_t *c, *cases = flux_cases(dir);
    snprintf(path, sizeof path, "%s/config.json", dir);
    TU_OK(ditd_flux_config_load(path, &cfg));
    json_array_foreach(cases, i, c) {
        flux_case fc;
        ditd_flux *m = NULL;
        if (flux_case_load(dir, c, &fc) == 0)
            TU_OK(ditd_flux_new_mesh(&cfg, &ditd_backend_cpu, fc.B, fc.h, fc.w, fc.L, dir, NULL,
                                     &m));
        if (m) {
            float *got = calloc(fc.n_out, sizeof *got);
            TU_OK(ditd_flux_forward(m, fc.B, fc.x, fc.t, fc.text, fc.pooled,
                                    cfg.guidance_embeds ? fc.guidance : NULL, got));
            char what[512];
            snprintf(what, sizeof what, "%s forward[%zu] B=%d latent %dx%d text %d", dir, i, fc.B,
                     fc.h, fc.w, fc.L);
            TU_CLOSE(what, got, fc.out, fc.n_out, TOL);
            checked++;
            /* the same model dequantized at load: the same bits, more bytes */
            ditd_flux *d = NULL;
            setenv("DITD_WEIGHTS_DEQUANTIZE", "1", 1);
            TU_OK(ditd_flux_new_mesh(&cfg, &ditd_backend_cpu, fc.B, fc.h, fc.w, fc.L, dir, NULL,
                                     &d));
            unsetenv("DITD_WEIGHTS_DEQUANTIZE");
            if (d) {
                float *got_d = calloc(fc.n_out, sizeof *got_d);
                TU_OK(ditd_flux_forward(d, fc.B, fc.x, fc.t, fc.text, fc.pooled,
                                        cfg.guidance_embeds ? fc.guidance : NULL, got_d));
                TU_CHECK(memcmp(got, got_d, fc.n_out * sizeof *got) == 0,
                         "%s: kept quantized differs from dequantized at load", what);
                printf("     %d linears kept quantized: weights %zu bytes (%zu dequantized)\n",
                       m->quantized, ditd_flux_weight_bytes(m), ditd_flux_weight_bytes(d));
                TU_CHECK(m->quantized > 0 && d->quantized == 0 &&
                             ditd_flux_weight_bytes(m) < ditd_flux_weight_bytes(d),
                         "%s: %d quantized linears, %zu vs %zu bytes", what, m->quantized,
                         ditd_flux_weight_bytes(m), ditd_flux_weight_bytes(d));
                free(got_d);
                ditd_flux_free(d);
            }
            /* bf16 compute (the CPU's bf16 table): quantized linears
             * (dequantized panels rounded to bf16) bit-identical to the
             * model dequantized at load into bf16 weights */
            if (i == 0 && ditd_backend_cpu_has_bf16()) {
                ditd_flux *qb = NULL, *db = NULL;
                TU_OK(ditd_flux_new_mesh(&cfg, &ditd_backend_cpu_bf16, fc.B, fc.h, fc.w, fc.L,
                                         dir, NULL, &qb));
                setenv("DITD_WEIGHTS_DEQUANTIZE", "1", 1);
                TU_OK(ditd_flux_new_mesh(&cfg, &ditd_backend_cpu_bf16, fc.B, fc.h, fc.w, fc.L,
                                         dir, NULL, &db));
                unsetenv("DITD_WEIGHTS_DEQUANTIZE");
                if (qb && db) {
                    float *a = calloc(fc.n_out, sizeof *a), *b = calloc(fc.n_out, sizeof *b);
                    const float *g = cfg.guidance_embeds ? fc.guidance : NULL;
                    TU_OK(ditd_flux_forward(qb, fc.B, fc.x, fc.t, fc.text, fc.pooled, g, a));
                    TU_OK(ditd_flux_forward(db, fc.B, fc.x, fc.t, fc.text, fc.pooled, g, b));
                    TU_CHECK(qb->quantized > 0 && memcmp(a, b, fc.n_out * sizeof *a) == 0,
                             "%s bf16: kept quantized (%d linears) differs from dequantized at "
                             "load",
                             what, qb->quantized);
                    snprintf(what, sizeof what, "%s forward[%zu] bf16 compute", dir, i);
                    TU_CLOSE(what, a, fc.out, fc.n_out, 1e-2);
                    free(a);
                    free(b);
                }
                ditd_flux_free(qb);
                ditd_flux_free(db);
            }
            free(got);
            ditd_flux_free(m);
        }
        flux_case_free(&fc);
    }
    json_decref(cases);
    return checked;
}

static void refusals(void)
{
    char dir[4096], path[4200];
    ditd_flux_config cfg;
    ditd_flux *m = NULL;
    snprintf(dir, sizeof dir, "%s/flux_gguf/q8_0", tu_fixtures());
    snprintf(path, sizeof path, "%s/config.json", dir);
    TU_OK(ditd_flux_config_load(path, &cfg));
    /* one single block more than the file holds */
    cfg.num_single_layers++;
    TU_CHECK_ERR(ditd_flux_new_mesh(&cfg, &ditd_backend_cpu, 1, 8, 8, 6, dir, NULL, &m),
                 DITD_ENOENT, "single_transformer_blocks.2.");
    cfg.num_single_layers--;
    /* and one fewer: the file's extra block is refused */
    cfg.num_single_layers--;
    TU_CHECK_ERR(ditd_flux_new_mesh(&cfg, &ditd_backend_cpu, 1, 8, 8, 6, dir, NULL, &m),
                 DITD_EFORMAT, "single_transformer_blocks.1.", "num_single_layers 1");
    cfg.num_single_layers++;
    /* two GGUF files in one folder */
    char tmp[512];
    if (tu_mkdtemp(tmp, sizeof tmp, "flux-gguf") == 0) {
        char a[700], b[700];
        snprintf(path, sizeof path, "%s/q8_0.gguf", dir);
        snprintf(a, sizeof a, "%s/a.gguf", tmp);
        snprintf(b, sizeof b, "%s/b.gguf", tmp);
        TU_CHECK(symlink(path, a) == 0 && symlink(path, b) == 0, "symlinks in %s", tmp);
        TU_CHECK_ERR(ditd_flux_new_mesh(&cfg, &ditd_backend_cpu, 1, 8, 8, 6, tmp, NULL, &m),
                     DITD_EFORMAT, "two GGUF files", ".gguf");
        /* the file itself, named directly, loads */
        TU_OK(ditd_flux_new_mesh(&cfg, &ditd_backend_cpu, 1, 8, 8, 6, a, NULL, &m));
        ditd_flux_free(m);
        unlink(a);
        unlink(b);
        rmdir(tmp);
    }
}

static int dit_gguf(void)
{
    char dir[4096], path[4200];
    ditd_dit_config cfg;
    json_error_t jerr;
    int checked = 0;
    snprintf(dir, sizeof dir, "%s/gguf/dit", tu_fixtures());
    snprintf(path, sizeof path, "%s/config.json", dir);
    TU_OK(ditd_dit_config_load(path, &cfg));
    snprintf(path, sizeof path, "%s/expected/cases.json", dir);
    json_t *root = json_load_file(path, 0, &jerr), *c;
    TU_CHECK(root != NULL, "%s: %s", path, jerr.text);
    size_t i;
    json_array_foreach(json_object_get(root, "forward"), i, c) {
        float *x = NULL, *t = NULL, *want = NULL;
        int64_t *y = NULL, sx[4], s1[4], so[4];
        int nd;
        const char *keys[3] = {"x", "t", "out"};
        float **dst[3] = {&x, &t, &want};
        int64_t *shp[3] = {sx, s1, so};
        for (int k = 0; k < 3; k++) {
            snprintf(path, sizeof path, "%s/expected/%s", dir,
                     json_string_value(json_object_get(c, keys[k])));
            TU_OK(ditd_npy_read_f32(path, 4, &nd, shp[k], dst[k]));
        }
        snprintf(path, sizeof path, "%s/expected/%s", dir,
                 json_string_value(json_object_get(c, "y")));
        TU_OK(ditd_npy_read_i64(path, 4, &nd, s1, &y));
        ditd_dit *m = NULL;
        if (x && t && want && y)
            TU_OK(ditd_dit_new(&cfg, &ditd_backend_cpu, (int)sx[0], dir, &m));
        if (m) {
            size_t n = (size_t)(so[0] * so[1] * so[2] * so[3]);
            float *got = calloc(n, sizeof *got);
            TU_OK(ditd_dit_forward(m, (int)sx[0], x, t, y, got));
            char what[512];
            snprintf(what, sizeof what, "%s forward[%zu] B=%lld", dir, i, (long long)sx[0]);
            TU_CLOSE(what, got, want, n, TOL);
            checked++;
            free(got);
            ditd_dit_free(m);
        }
        free(x);
        free(t);
        free(want);
        free(y);
    }
    json_decref(root);
    return checked;
}

int main(void)
{
    static const char *const models[] = {"q8_0", "q8_0-diffusers", "q4_k"};
    static const char *const fp8[] = {"e4m3-row", "e4m3-scaled", "e5m2"};
    char dir[4096];
    int cases = 0, fp8_cases = 0;
    for (size_t i = 0; i < sizeof models / sizeof *models; i++) {
        snprintf(dir, sizeof dir, "%s/flux_gguf/%s", tu_fixtures(), models[i]);
        cases += run_model(dir);
    }
    TU_CHECK(cases >= MIN_CASES, "FLUX GGUF cases checked: %d (at least %d)", cases, MIN_CASES);
    for (size_t i = 0; i < sizeof fp8 / sizeof *fp8; i++) {
        snprintf(dir, sizeof dir, "%s/flux_fp8/%s", tu_fixtures(), fp8[i]);
        fp8_cases += run_model(dir);
    }
    TU_CHECK(fp8_cases >= 4, "FLUX FP8 cases checked: %d (at least 4)", fp8_cases);
    refusals();
    TU_CHECK(dit_gguf() >= 2, "DiT GGUF cases");
    return tu_exit();
}
