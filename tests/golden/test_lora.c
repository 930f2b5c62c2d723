/* LoRA adapters against Diffusers (tools/make_lora_fixtures.py): the tiny DiT
 * fixture in DiTPipeline's loop with guidance and the assembled tiny
 * FLUX.1-dev folder (guidance embedded; true CFG once), adapters in PEFT,
 * down/up + alpha and kohya names, ranks 4 and 8, scales 1, 0.5, 0, -1, two
 * at once, some modules only: final latents within 1e-4 of Diffusers'
 * float64 run. Then a batch mixing samples with different adapter sets (and
 * none) equal to each sample run alone, the base model unchanged by a run
 * with adapters (the same bytes before and after), and the loader's
 * refusals (unknown module, wrong shape, truncated file, dtype, missing B,
 * text-encoder and other tensors, rank 0, non-finite values). */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/backend/backend.h"
#include "engine/core/error.h"
#include "engine/io/npy.h"
#include "engine/models/lora.h"
#include "engine/models/model.h"
#include "engine/pipeline/pipeline.h"
#include "tests/lora_case.h"
#include "tests/test_util.h"

#define TOL 1e-4
#define BATCH_TOL 1e-6


static float *load(const char *dir, const char *name, int64_t *shape)
{
    char path[4300];
    float *d = NULL;
    int nd;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    TU_OK(ditd_npy_read_f32(path, 4, &nd, shape, &d));
    return d;
}

static const char *lora_dir(void)
{
    static char dir[4096];
    snprintf(dir, sizeof dir, "%s/lora", tu_fixtures());
    return dir;
}

/* ---- DiT ---- */

static int dit_cases(json_t *doc, int *batch_checks)
{
    char mdir[4096];
    ditd_model_info info;
    ditd_pipeline *p = NULL;
    lc_adapters ad = {0};
    json_t *c;
    size_t k;
    int ran = 0;

    snprintf(mdir, sizeof mdir, "%s/models/tiny-p2-c1-h6", tu_fixtures());
    TU_OK(ditd_model_info_load(mdir, &info));
    TU_OK(ditd_pipeline_new(&info, &ditd_backend_cpu, 2, &p));
    if (!p)
        goto done;
    lc_open_adapters(p, json_object_get(json_object_get(doc, "adapters"), "dit"), lora_dir(),
                     &ad);
    TU_CHECK(ad.n == 3, "%d DiT adapters opened, 3 expected", ad.n);
    json_array_foreach(json_object_get(doc, "cases"), k, c) {
        if (strcmp(json_string_value(json_object_get(c, "family")), "dit"))
            continue;
        const char *name = json_string_value(json_object_get(c, "name"));
        json_t *smp = json_object_get(c, "samples"), *labels = json_object_get(c, "class_labels");
        int n = (int)json_array_size(smp);
        int64_t sn[4], so[4];
        float *noise = load(lora_dir(), json_string_value(json_object_get(c, "noise")), sn);
        float *want = load(lora_dir(), json_string_value(json_object_get(c, "out")), so);
        ditd_lora_set sets[2];
        ditd_gen_sample samples[2];
        ditd_gen_params gp = {.steps = (int)json_integer_value(json_object_get(c, "steps")),
                              .sampler = DITD_SAMPLER_FLOW_EULER};
        TU_CHECK(n >= 1 && n <= 2 && noise && want, "%s: %d samples", name, n);
        if (n < 1 || n > 2 || !noise || !want) {
            free(noise), free(want);
            continue;
        }
        size_t numel = (size_t)(sn[1] * sn[2] * sn[3]);
        for (int i = 0; i < n; i++) {
            memset(&samples[i], 0, sizeof samples[i]);
            samples[i].cond.class_id = json_integer_value(json_array_get(labels, (size_t)i));
            samples[i].guidance = (float)json_number_value(json_object_get(c, "guidance_scale"));
            lc_make_set(&ad, json_array_get(smp, (size_t)i), &sets[i]);
            samples[i].loras = sets[i].n ? &sets[i] : NULL;
        }
        float *got = calloc((size_t)n * numel, sizeof *got);
        TU_OK(ditd_pipeline_generate(p, &gp, n, samples, noise, got, NULL, NULL, NULL));
        TU_CLOSE(name, got, want, (size_t)n * numel, TOL);
        ran++;
        /* a batch of different sets: each row as that sample alone */
        for (int i = 0; n > 1 && i < n; i++) {
            float *alone = calloc(numel, sizeof *alone);
            char what[200];
            TU_OK(ditd_pipeline_generate(p, &gp, 1, &samples[i], noise + (size_t)i * numel, alone,
                                         NULL, NULL, NULL));
            snprintf(what, sizeof what, "%s: sample %d in the batch vs alone", name, i);
            TU_CLOSE(what, got + (size_t)i * numel, alone, numel, BATCH_TOL);
            (*batch_checks)++;
            free(alone);
        }
        free(got), free(noise), free(want);
    }

    /* the base model unchanged: no adapters before and after a run with them */
    {
        int64_t sn[4];
        float *noise = load(lora_dir(), "dit_r4_s1_noise.npy", sn);
        size_t numel = noise ? (size_t)(sn[1] * sn[2] * sn[3]) : 0;
        ditd_gen_params gp = {.steps = 6, .sampler = DITD_SAMPLER_FLOW_EULER};
        ditd_gen_sample s = {.cond.class_id = 3, .guidance = 4.0f};
        ditd_lora_set set = {.n = 2, .ad = {ad.dev[0], ad.dev[1]}, .weight = {1.0f, -0.5f}};
        float *a = calloc(numel + 1, sizeof *a), *b = calloc(numel + 1, sizeof *b);
        float *w = calloc(numel + 1, sizeof *w);
        if (noise && ad.n >= 2) {
            TU_OK(ditd_pipeline_generate(p, &gp, 1, &s, noise, a, NULL, NULL, NULL));
            s.loras = &set;
            TU_OK(ditd_pipeline_generate(p, &gp, 1, &s, noise, w, NULL, NULL, NULL));
            s.loras = NULL;
            TU_OK(ditd_pipeline_generate(p, &gp, 1, &s, noise, b, NULL, NULL, NULL));
            TU_CHECK(!memcmp(a, b, numel * sizeof *a),
                     "base run after a run with adapters differs from the one before");
            TU_CHECK(memcmp(a, w, numel * sizeof *a), "the adapters changed nothing");
            printf("base unchanged: %zu latents, the same bytes before and after\n", numel);
        }
        free(noise), free(a), free(b), free(w);
    }
    /* a set that cannot run here */
    {
        ditd_lora_set bad = {.n = 1, .ad = {ad.n ? ad.dev[0] : NULL}, .weight = {NAN}};
        TU_CHECK_ERR(ditd_pipeline_check_loras(p, &bad), DITD_EINVAL, "not finite");
    }
done:
    lc_free_adapters(&ad);
    ditd_pipeline_free(p);
    ditd_model_info_free(&info);
    return ran;
}

/* ---- FLUX ---- */

/* One batch of three samples of the same prompt and noise carrying f4, f8k
 * at 0.5 and no adapter (different sets, so three groups in every adapted
 * linear), then each alone: the rows as their solo runs within BATCH_TOL.
 * Returns the rows checked. */
static int flux_batch(ditd_pipeline *p, const lc_adapters *ad, const ditd_gen_sample *like,
                      const ditd_gen_params *gp, const float *noise, size_t numel)
{
    int f4 = -1, f8k = -1, rows = 0;
    for (int k = 0; k < ad->n; k++) {
        f4 = strcmp(ad->name[k], "f4") ? f4 : k;
        f8k = strcmp(ad->name[k], "f8k") ? f8k : k;
    }
    TU_CHECK(f4 >= 0 && f8k >= 0, "FLUX batch: f4 and f8k opened");
    if (f4 < 0 || f8k < 0)
        return 0;
    ditd_lora_set sets[2] = {{.n = 1, .ad = {ad->dev[f4]}, .weight = {1.0f}},
                             {.n = 1, .ad = {ad->dev[f8k]}, .weight = {0.5f}}};
    ditd_gen_sample smp[3] = {*like, *like, *like};
    smp[0].loras = &sets[0];
    smp[1].loras = &sets[1];
    smp[2].loras = NULL;
    float *in = malloc(3 * numel * sizeof *in), *got = calloc(3 * numel, sizeof *got);
    float *alone = calloc(numel, sizeof *alone);
    for (int i = 0; in && i < 3; i++)
        memcpy(in + (size_t)i * numel, noise, numel * sizeof *in);
    if (in && got && alone) {
        TU_OK(ditd_pipeline_generate(p, gp, 3, smp, in, got, NULL, NULL, NULL));
        for (int i = 0; i < 3; i++) {
            char what[200];
            TU_OK(ditd_pipeline_generate(p, gp, 1, &smp[i], noise, alone, NULL, NULL, NULL));
            snprintf(what, sizeof what, "FLUX batch {f4, 0.5 f8k, none}: sample %d vs alone", i);
            TU_CLOSE(what, got + (size_t)i * numel, alone, numel, BATCH_TOL);
            rows++;
        }
    }
    free(in), free(got), free(alone);
    return rows;
}

static int flux_cases(json_t *doc, int *batch_checks)
{
    char mdir[4096], edir[4096], fpath[4300];
    ditd_model_info info;
    ditd_pipeline *p = NULL;
    lc_adapters ad = {0};
    json_error_t jerr;
    json_t *c, *fdoc = NULL;
    size_t k;
    int ran = 0;

    snprintf(mdir, sizeof mdir, "%s/dev", FLUX_PIPELINE_DIR);
    snprintf(edir, sizeof edir, "%s/flux_pipeline/expected", tu_fixtures());
    snprintf(fpath, sizeof fpath, "%s/cases.json", edir);
    fdoc = json_load_file(fpath, 0, &jerr);
    TU_CHECK(fdoc != NULL, "%s: %s", fpath, jerr.text);
    TU_OK(ditd_model_info_load(mdir, &info));
    TU_OK(ditd_pipeline_new(&info, &ditd_backend_cpu, 3, &p));
    if (!p || !fdoc)
        goto done;
    lc_open_adapters(p, json_object_get(json_object_get(doc, "adapters"), "flux"), lora_dir(),
                     &ad);
    TU_CHECK(ad.n == 3, "%d FLUX adapters opened, 3 expected", ad.n);
    json_array_foreach(json_object_get(doc, "cases"), k, c) {
        if (strcmp(json_string_value(json_object_get(c, "family")), "flux"))
            continue;
        const char *name = json_string_value(json_object_get(c, "name"));
        json_t *fc = NULL, *e;
        size_t j;
        json_array_foreach(json_object_get(fdoc, "cases"), j, e)
            if (!strcmp(json_string_value(json_object_get(e, "name")),
                        json_string_value(json_object_get(c, "flux_case"))))
                fc = e;
        TU_CHECK(fc != NULL, "%s: flux case", name);
        if (!fc)
            continue;
        int64_t sh[4], sn[4], so[4];
        float *emb = load(edir, json_string_value(json_object_get(fc, "prompt_embeds")), sh);
        float *pool = load(edir, json_string_value(json_object_get(fc, "pooled")), sh);
        float *noise = load(edir, json_string_value(json_object_get(fc, "noise")), sn);
        float *want = load(lora_dir(), json_string_value(json_object_get(c, "out")), so);
        float *nemb = NULL, *npool = NULL;
        float true_cfg = (float)json_number_value(json_object_get(fc, "true_cfg_scale"));
        if (true_cfg > 1) {
            nemb = load(edir, json_string_value(json_object_get(fc, "negative_prompt_embeds")), sh);
            npool = load(edir, json_string_value(json_object_get(fc, "negative_pooled")), sh);
        }
        TU_OK(ditd_pipeline_set_size(p, (int)json_integer_value(json_object_get(fc, "latent_height")),
                                     (int)json_integer_value(json_object_get(fc, "latent_width")),
                                     (int)json_integer_value(json_object_get(fc, "max_sequence_length"))));
        ditd_text_embeds te[2] = {{.seq = emb, .pooled = pool}, {.seq = nemb, .pooled = npool}};
        ditd_lora_set set;
        lc_make_set(&ad, json_array_get(json_object_get(c, "samples"), 0), &set);
        ditd_gen_sample smp = {.guidance = (float)json_number_value(json_object_get(fc, "guidance_scale")),
                               .true_cfg = true_cfg, .loras = &set};
        smp.cond.prompt = &te[0];
        smp.cond.negative = nemb ? &te[1] : NULL;
        ditd_gen_params gp = {.steps = (int)json_integer_value(json_object_get(fc, "num_inference_steps")),
                              .sampler = p->sched_base.kind};
        if (emb && pool && noise && want && sn[0] == 1) {
            size_t numel = (size_t)(sn[1] * sn[2] * sn[3]);
            float *got = calloc(numel, sizeof *got);
            TU_OK(ditd_pipeline_generate(p, &gp, 1, &smp, noise, got, NULL, NULL, NULL));
            TU_CLOSE(name, got, want, numel, TOL);
            ran++;
            free(got);
        }
        if (!strcmp(name, "flux_r4_s1") && emb && pool && noise && sn[0] == 1)
            *batch_checks += flux_batch(p, &ad, &smp, &gp, noise, (size_t)(sn[1] * sn[2] * sn[3]));
        free(emb), free(pool), free(noise), free(want), free(nemb), free(npool);
    }
done:
    lc_free_adapters(&ad);
    json_decref(fdoc);
    ditd_pipeline_free(p);
    ditd_model_info_free(&info);
    return ran;
}

/* ---- refusals ---- */

static const ditd_lora_target targets[] = {
    {.name = "transformer_blocks.0.attn1.to_q", .n_out = 3, .k_in = 2},
    {.name = "transformer_blocks.0.ff.net.0.proj", .n_out = 4, .k_in = 2},
};

/* Opens an adapter of module m's A (r, k) and B (n, r), F32, with `extra`
 * header entries; returns the error (0: opened, then freed). */
static int try_open(const char *header, const float *data, size_t dlen, int truncate)
{
    size_t len;
    uint8_t *img = tu_st_image(header, data, dlen, &len);
    ditd_lora *l = NULL;
    int err = ditd_lora_open_mem(img, truncate ? len - 4 : len, "test.safetensors", "t", targets,
                                 2, &l);
    TU_CHECK(err ? l == NULL : l != NULL, "an error leaves no adapter");
    ditd_lora_free(l);
    free(img);
    return err;
}

static void refusals(void)
{
    float d[64];
    for (int i = 0; i < 64; i++)
        d[i] = 0.01f * (float)(i + 1);
    const char *good = "{\"transformer.transformer_blocks.0.attn1.to_q.lora_A.weight\":"
                       "{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]},"
                       "\"transformer.transformer_blocks.0.attn1.to_q.lora_B.weight\":"
                       "{\"dtype\":\"F32\",\"shape\":[3,2],\"data_offsets\":[16,40]}}";
    TU_OK(try_open(good, d, 40, 0));
    /* a Diffusers-saved file's LoraConfig (lora_adapter_metadata): alpha / r,
     * the patterns per module, rsLoRA's alpha / sqrt(r); a rank the config
     * does not give refused */
    {
        static const char *const meta[] = {
            "{\\\"transformer.r\\\": 2, \\\"transformer.lora_alpha\\\": 8}",
            "{\\\"transformer.r\\\": 4, \\\"transformer.lora_alpha\\\": 8, "
            "\\\"transformer.rank_pattern\\\": {\\\"attn1.to_q\\\": 2}, "
            "\\\"transformer.alpha_pattern\\\": {\\\"blocks.0.attn1.to_q\\\": 5, "
            "\\\"0.attn1.to_q\\\": 3}}", /* the first key is no '.'-aligned suffix */
            "{\\\"transformer.r\\\": 2, \\\"transformer.lora_alpha\\\": 4, "
            "\\\"transformer.use_rslora\\\": true}",
            "{\\\"text_encoder.r\\\": 2, \\\"text_encoder.lora_alpha\\\": 64}",
            "{\\\"transformer.r\\\": 4, \\\"transformer.lora_alpha\\\": 8}",
            "{\\\"transformer.r\\\": 2, \\\"transformer.lora_alpha\\\": 8, "
            "\\\"transformer.alpha_pattern\\\": {\\\"to_[qk]\\\": 3}}",
        };
        const float want[] = {4.0f, 1.5f, 4.0f / sqrtf(2.0f), 1.0f, 0.0f, 0.0f};
        const int code[] = {0, 0, 0, 0, DITD_ESHAPE, DITD_EUNSUPPORTED};
        int ok = 0;
        for (int i = 0; i < 6; i++) {
            char h[1400];
            snprintf(h, sizeof h,
                     "{\"__metadata__\":{\"lora_adapter_metadata\":\"%s\"},%s", meta[i],
                     good + 1);
            size_t len;
            uint8_t *img = tu_st_image(h, d, 40, &len);
            ditd_lora *l = NULL;
            int err = ditd_lora_open_mem(img, len, "meta.safetensors", "m", targets, 2, &l);
            TU_CHECK(err == code[i], "metadata %d: error %d (want %d): %s", i, err, code[i],
                     err ? ditd_err_detail() : "");
            if (!code[i] && l) {
                TU_CHECK(l->n_mod == 1 && fabsf(l->mod[0].scale - want[i]) < 1e-6f,
                         "metadata %d: scale %g, want %g", i, l->mod[0].scale, want[i]);
                ok++;
            }
            ditd_lora_free(l);
            free(img);
        }
        TU_CHECK(ok == 4, "%d metadata scales checked", ok);
    }
    /* kohya names with alpha: scale alpha / rank */
    {
        const char *h = "{\"lora_unet_transformer_blocks_0_ff_net_0_proj.alpha\":"
                        "{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]},"
                        "\"lora_unet_transformer_blocks_0_ff_net_0_proj.lora_down.weight\":"
                        "{\"dtype\":\"F32\",\"shape\":[1,2],\"data_offsets\":[4,12]},"
                        "\"lora_unet_transformer_blocks_0_ff_net_0_proj.lora_up.weight\":"
                        "{\"dtype\":\"F32\",\"shape\":[4,1],\"data_offsets\":[12,28]}}";
        float k[7] = {3.0f, 1, 2, 1, 2, 3, 4};
        size_t len;
        uint8_t *img = tu_st_image(h, k, sizeof k, &len);
        ditd_lora *l = NULL;
        TU_OK(ditd_lora_open_mem(img, len, "kohya", "k", targets, 2, &l));
        TU_CHECK(l && l->format == DITD_LORA_FORMAT_KOHYA && l->n_mod == 1 &&
                     l->mod[0].target == 1 && l->mod[0].rank == 1 && l->mod[0].scale == 3.0f,
                 "kohya adapter read as (format, modules, target, rank, scale)");
        ditd_lora_free(l);
        free(img);
    }
    TU_CHECK_ERR(try_open("{\"transformer.transformer_blocks.0.attn1.to_k.lora_A.weight\":"
                          "{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]}}",
                          d, 16, 0),
                 DITD_ENOENT, "no linear module 'transformer_blocks.0.attn1.to_k'");
    TU_CHECK(tu_has(ditd_err_detail(), "transformer.transformer_blocks.0.attn1.to_k.lora_A.weight"),
             "the unknown module's tensor is named: %s", ditd_err_detail());
    TU_CHECK_ERR(try_open("{\"transformer.transformer_blocks.0.attn1.to_q.lora_A.weight\":"
                          "{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},"
                          "\"transformer.transformer_blocks.0.attn1.to_q.lora_B.weight\":"
                          "{\"dtype\":\"F32\",\"shape\":[3,2],\"data_offsets\":[24,48]}}",
                          d, 48, 0),
                 DITD_ESHAPE, "to_q.lora_A.weight", "expected (2, 2)");
    TU_CHECK(tu_has(ditd_err_detail(), "to_q.lora_A.weight") && tu_has(ditd_err_detail(), "(2, 2)"),
             "the shape refusal names the tensor and the shape expected: %s", ditd_err_detail());
    TU_CHECK_ERR(try_open("{\"transformer.transformer_blocks.0.attn1.to_q.lora_A.weight\":"
                          "{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]},"
                          "\"transformer.transformer_blocks.0.attn1.to_q.lora_B.weight\":"
                          "{\"dtype\":\"F32\",\"shape\":[4,2],\"data_offsets\":[16,48]}}",
                          d, 48, 0),
                 DITD_ESHAPE, "to_q.lora_B.weight", "expected (3, 2)");
    TU_CHECK_ERR(try_open(good, d, 40, 1), DITD_EFORMAT, "beyond data region");
    TU_CHECK_ERR(try_open("{\"transformer.transformer_blocks.0.attn1.to_q.lora_A.weight\":"
                          "{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]}}",
                          d, 16, 0),
                 DITD_EFORMAT, "no lora_B");
    TU_CHECK_ERR(try_open("{\"transformer.transformer_blocks.0.attn1.to_q.lora_A.weight\":"
                          "{\"dtype\":\"I32\",\"shape\":[2,2],\"data_offsets\":[0,16]},"
                          "\"transformer.transformer_blocks.0.attn1.to_q.lora_B.weight\":"
                          "{\"dtype\":\"F32\",\"shape\":[3,2],\"data_offsets\":[16,40]}}",
                          d, 40, 0),
                 DITD_EUNSUPPORTED, "dtype I32");
    TU_CHECK(tu_has(ditd_err_detail(), "lora_A.weight") && tu_has(ditd_err_detail(), "I32"),
             "the dtype refusal names the tensor and its dtype: %s", ditd_err_detail());
    TU_CHECK_ERR(try_open("{\"lora_te_text_model_encoder_layers_0_mlp_fc1.lora_down.weight\":"
                          "{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]}}",
                          d, 16, 0),
                 DITD_EUNSUPPORTED, "text-encoder");
    TU_CHECK_ERR(try_open("{\"transformer.transformer_blocks.0.attn1.to_q.lora_magnitude_vector\":"
                          "{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,12]}}",
                          d, 12, 0),
                 DITD_EFORMAT, "lora_magnitude_vector", "not a LoRA tensor");
    TU_CHECK_ERR(try_open("{\"transformer.transformer_blocks.0.attn1.to_q.lora_A.weight\":"
                          "{\"dtype\":\"F32\",\"shape\":[0,2],\"data_offsets\":[0,0]},"
                          "\"transformer.transformer_blocks.0.attn1.to_q.lora_B.weight\":"
                          "{\"dtype\":\"F32\",\"shape\":[3,0],\"data_offsets\":[0,0]}}",
                          d, 0, 0),
                 DITD_EFORMAT, "rank 0 outside");
    TU_CHECK_ERR(try_open("{\"transformer.transformer_blocks.0.attn1.to_q.lora_A.weight\":"
                          "{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]},"
                          "\"transformer_blocks.0.attn1.to_q.lora_A.weight\":"
                          "{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[16,32]}}",
                          d, 32, 0),
                 DITD_EFORMAT, "already has");
    TU_CHECK_ERR(try_open("{\"transformer.transformer_blocks.0.attn1.to_q.lora_A.weight\":"
                          "{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]},"
                          "\"lora_unet_transformer_blocks_0_attn1_to_q.lora_up.weight\":"
                          "{\"dtype\":\"F32\",\"shape\":[3,2],\"data_offsets\":[16,40]}}",
                          d, 40, 0),
                 DITD_EFORMAT, "peft names in a kohya file");
    TU_CHECK_ERR(try_open("{}", d, 0, 0), DITD_EFORMAT, "no tensors");
    {
        float nan_d[10];
        memcpy(nan_d, d, sizeof nan_d);
        nan_d[5] = NAN;
        TU_CHECK_ERR(try_open(good, nan_d, 40, 0), DITD_EFORMAT, "lora_B.weight", "not finite");
    }
    {
        ditd_lora *l = NULL;
        char path[4300];
        snprintf(path, sizeof path, "%s/no-such-adapter.safetensors", lora_dir());
        TU_CHECK_ERR(ditd_lora_open(path, "x", targets, 2, &l), DITD_ENOENT, "no-such-adapter");
        snprintf(path, sizeof path, "%s/dit_r4_peft.safetensors", lora_dir());
        TU_CHECK_ERR(ditd_lora_open(path, "x", targets, 0, &l), DITD_EUNSUPPORTED,
                     "takes no LoRA adapters");
        /* the DiT adapter against the FLUX-named targets: unknown modules */
        TU_CHECK_ERR(ditd_lora_open(path, "x", targets, 2, &l), DITD_ENOENT,
                     "proj_out_1");
    }
}

int main(void)
{
    char path[4300];
    json_error_t jerr;
    int batch_checks = 0;
    snprintf(path, sizeof path, "%s/cases.json", lora_dir());
    json_t *doc = json_load_file(path, 0, &jerr);
    TU_CHECK(doc != NULL, "%s: %s", path, jerr.text);
    if (!doc)
        return tu_exit();
    int dit = dit_cases(doc, &batch_checks), flux = flux_cases(doc, &batch_checks);
    json_decref(doc);
    refusals();
    printf("cases: %d DiT, %d FLUX against Diffusers; %d batch rows against alone\n", dit, flux,
           batch_checks);
    TU_CHECK(dit >= 9 && flux >= 6 && batch_checks >= 7,
             "checked %d DiT, %d FLUX cases and %d batch rows (want 9, 6, 7)", dit, flux,
             batch_checks);
    return tu_exit();
}
