/* T5 encoder GGUFs (tools/make_gguf_t5_fixtures.py, tests/fixtures/gguf_t5):
 * llama.cpp's T5 names read as transformers', the linears kept in their
 * GGML blocks (linear_q), against transformers' T5EncoderModel in float64
 * on the gguf package's dequantized weights; the same with every weight
 * dequantized at load (DITD_WEIGHTS_DEQUANTIZE=1); the folder's own .gguf
 * and the same file named beside another folder agree bit for bit; then
 * the refusals: a file of another model (shapes, named by tensor), a GGUF
 * that is no T5, a block type ditd does not dequantize (named with the
 * tensor), a missing file. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/backend/backend.h"
#include "engine/io/npy.h"
#include "engine/text/t5_encoder.h"
#include "tests/test_util.h"

#define TOL 1e-5

static int compared;

static void *load(const char *dir, const char *file, int i64, int64_t *shape)
{
    char path[4096];
    void *d = NULL;
    int nd = 0;
    snprintf(path, sizeof path, "%s/expected/%s", dir, file);
    if (i64)
        TU_OK(ditd_npy_read_i64(path, 4, &nd, shape, (int64_t **)&d));
    else
        TU_OK(ditd_npy_read_f32(path, 4, &nd, shape, (float **)&d));
    return d;
}

/* Every case of dir's expected/ on m; out: the hidden states of the last
 * (B N D floats each, ncase of them) when non-NULL. */
static int run_cases(const char *dir, ditd_t5_encoder *m, const char *mode, float **keep_out)
{
    char path[4096], what[512];
    snprintf(path, sizeof path, "%s/expected/cases.json", dir);
    json_t *root = json_load_file(path, 0, NULL);
    TU_CHECK(root != NULL, "%s", path);
    if (!root)
        return 0;
    json_t *cases = json_object_get(root, "cases"), *c;
    size_t i;
    int n = 0;
    json_array_foreach(cases, i, c) {
        int64_t s[4];
        int B = (int)json_integer_value(json_object_get(c, "B"));
        int N = (int)json_integer_value(json_object_get(c, "N"));
        int64_t *ids = load(dir, json_string_value(json_object_get(c, "ids")), 1, s);
        float *want = load(dir, json_string_value(json_object_get(c, "hidden")), 0, s);
        size_t numel = (size_t)s[0] * (size_t)s[1] * (size_t)s[2];
        uint8_t *keep = NULL;
        json_t *mk = json_object_get(c, "mask");
        if (mk) {
            float *mf = NULL;
            int64_t ms[4];
            int nd;
            snprintf(path, sizeof path, "%s/expected/%s", dir, json_string_value(mk));
            TU_OK(ditd_npy_read_f32(path, 4, &nd, ms, &mf));
            keep = malloc((size_t)B * (size_t)N);
            for (int k = 0; mf && k < B * N; k++)
                keep[k] = mf[k] != 0.0f;
            free(mf);
        }
        float *got = calloc(numel, sizeof *got);
        if (ids && want && got) {
            TU_OK(ditd_t5_encoder_encode(m, B, N, ids, keep, got));
            snprintf(what, sizeof what, "%s case %zu%s (%s) vs transformers float64", dir, i,
                     keep ? " masked" : "", mode);
            TU_CLOSE(what, got, want, numel, TOL);
            compared++;
            n++;
        }
        if (keep_out && (size_t)n == json_array_size(cases)) {
            *keep_out = got;
            got = NULL;
        }
        free(got);
        free(keep);
        free(ids);
        free(want);
    }
    json_decref(root);
    return n;
}

int main(void)
{
    const ditd_backend_ops *cpu = &ditd_backend_cpu;
    static const char *const models[] = {"t5-q8_0", "t5-q4_k", "t5-relu"};
    char dir[4096], file[4200], other[4096];
    int models_run = 0;
    cpu->set_threads(2);
    for (size_t k = 0; k < sizeof models / sizeof *models; k++) {
        ditd_t5_encoder *m = NULL;
        size_t qbytes = 0;
        float *a = NULL, *b = NULL;
        snprintf(dir, sizeof dir, "%s/gguf_t5/%s", tu_fixtures(), models[k]);
        snprintf(file, sizeof file, "%s/%s.gguf", dir, models[k]);
        /* the folder's own .gguf (no safetensors beside it) */
        TU_OK(ditd_t5_encoder_new(dir, NULL, cpu, 2, 12, &m));
        if (!m)
            continue;
        int nq = ditd_t5_encoder_quantized(m, &qbytes);
        const ditd_t5_config *c = ditd_t5_encoder_config_of(m);
        /* q, k, v, o, wi_1, wo and (gated gelu) wi_0 per block; relu's wi is dequantized */
        int want_q = c->num_layers * (c->gated ? 7 : 5);
        const size_t hidden = 2 * 12 * (size_t)c->d_model; /* c is m's: read before the free */
        TU_CHECK(nq == want_q && qbytes > 0,
                 "%s: %d linears kept in GGML blocks (%zu bytes), expected %d", models[k], nq,
                 qbytes, want_q);
        printf("%s: %d linears kept quantized, %zu bytes; arena %zu bytes\n", models[k], nq,
               qbytes, ditd_t5_encoder_arena_bytes(m));
        int n = run_cases(dir, m, "kept quantized", &a);
        ditd_t5_encoder_free(m);
        m = NULL;
        /* the same file named (--text-encoder-2-file) beside the same config */
        TU_OK(ditd_t5_encoder_new_file(dir, file, NULL, cpu, 2, 12, &m));
        if (m) {
            run_cases(dir, m, "named file", &b);
            if (a && b)
                TU_CHECK(memcmp(a, b, hidden * sizeof *a) == 0,
                         "%s: the folder's .gguf and the named file differ", models[k]);
            ditd_t5_encoder_free(m);
            m = NULL;
        }
        /* every weight dequantized at load: no blocks kept, the same numbers */
        setenv("DITD_WEIGHTS_DEQUANTIZE", "1", 1);
        TU_OK(ditd_t5_encoder_new(dir, NULL, cpu, 2, 12, &m));
        unsetenv("DITD_WEIGHTS_DEQUANTIZE");
        if (m) {
            TU_CHECK(ditd_t5_encoder_quantized(m, NULL) == 0,
                     "%s: DITD_WEIGHTS_DEQUANTIZE=1 kept %d linears quantized", models[k],
                     ditd_t5_encoder_quantized(m, NULL));
            run_cases(dir, m, "dequantized at load", NULL);
            ditd_t5_encoder_free(m);
        }
        free(a);
        free(b);
        models_run += n >= 2;
    }
    TU_CHECK(models_run == 3 && compared >= 18,
             "T5 GGUF cases: %d models, %d comparisons (want 3 and 18)", models_run, compared);

    /* refusals */
    ditd_t5_encoder *m = NULL;
    snprintf(dir, sizeof dir, "%s/gguf_t5/t5-q4_k", tu_fixtures());
    snprintf(file, sizeof file, "%s/gguf_t5/t5-q8_0/t5-q8_0.gguf", tu_fixtures());
    /* another model's file: its tensors do not have this config's shapes */
    TU_CHECK_ERR(ditd_t5_encoder_new_file(dir, file, NULL, cpu, 1, 8, &m), DITD_ESHAPE,
                 "shared.weight");
    TU_CHECK(m == NULL, "a refused load hands out no model");
    /* a FLUX transformer GGUF as the T5 */
    snprintf(file, sizeof file, "%s/flux_gguf/q8_0/q8_0.gguf", tu_fixtures());
    TU_CHECK_ERR(ditd_t5_encoder_new_file(dir, file, NULL, cpu, 1, 8, &m), DITD_EFORMAT,
                 "general.architecture is \"flux\"");
    /* a block type ditd does not dequantize: named with the tensor */
    snprintf(other, sizeof other, "%s/gguf_t5/t5-relu", tu_fixtures());
    snprintf(file, sizeof file, "%s/gguf_t5/t5-relu-iq4_nl.gguf", tu_fixtures());
    TU_CHECK_ERR(ditd_t5_encoder_new_file(other, file, NULL, cpu, 1, 8, &m), DITD_EUNSUPPORTED,
                 "enc.blk.1.attn_k.weight");
    TU_CHECK(strstr(ditd_err_detail(), "IQ4_NL") != NULL, "the type is named: %s",
             ditd_err_detail());
    /* a missing file */
    snprintf(file, sizeof file, "%s/gguf_t5/no-such.gguf", tu_fixtures());
    TU_CHECK_ERR(ditd_t5_encoder_new_file(dir, file, NULL, cpu, 1, 8, &m), DITD_ENOENT,
                 "no-such.gguf");
    return tu_exit();
}
