/* The model-family seam: a second, toy denoiser family registered through
 * the interface (engine/models/denoiser.h + registry.h), without touching
 * the pipeline, the worker or the server, with toy rows of the pipeline
 * table (engine/models/pipeline_class.h) beside it, then:
 *   - the registry: the toy class found by its _class_name; a duplicate
 *     refused; an unknown class refused naming every supported class; an
 *     unknown pipeline class, and one that does not drive the toy, refused;
 *   - the model folder: shapes from the family, latent vs image size (a
 *     vae/config.json's block_out_channels gives the scale factor);
 *   - the pipeline with class conditioning and with text conditioning
 *     (prompt + negative-prompt embeddings for guidance) against a loop
 *     written here from the sampler and the toy's formula;
 *   - the worker: one Batch in, its Result's pixels equal to the pipeline's.
 * The toy's forward is analytic (no weights), so the reference is exact.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "engine/backend/backend.h"
#include "engine/core/error.h"
#include "engine/core/philox.h"
#include "engine/models/denoiser.h"
#include "engine/models/model.h"
#include "engine/models/pipeline_class.h"
#include "engine/models/registry.h"
#include "engine/pipeline/pipeline.h"
#include "engine/worker/worker.h"
#include "proto/ditd.pb-c.h"
#include "tests/test_util.h"

#define TOY_CLASS "ToyFlowTransformer"

/* ---- the toy family ---- */

typedef struct toy {
    ditd_denoiser base; /* first: the interface's */
    int calls, uncond_rows; /* what the pipeline asked for */
} toy;

static int toy_shapes(const char *dir, ditd_denoiser_shapes *out)
{
    char path[4200];
    json_error_t jerr;
    snprintf(path, sizeof path, "%s/config.json", dir);
    json_t *r = json_load_file(path, 0, &jerr);
    if (!r)
        return ditd_err_set(DITD_EFORMAT, "%s: %s", path, jerr.text);
    int C = (int)json_integer_value(json_object_get(r, "in_channels"));
    *out = (ditd_denoiser_shapes){
        .in_channels = C,
        .out_channels = 2 * C, /* a learned-sigma-like half the pipeline must drop */
        .height = (int)json_integer_value(json_object_get(r, "height")),
        .width = (int)json_integer_value(json_object_get(r, "width")),
        .heads = 2,
        .tokens = 6,
        .prefix_tokens = 0,
    };
    out->guidance_embed = json_is_true(json_object_get(r, "guidance_embed"));
    out->head_dim = (int)json_integer_value(json_object_get(r, "attention_head_dim")); /* 0: none */
    int err = ditd_cond_kind_from_str(json_string_value(json_object_get(r, "conditioning")),
                                      &out->cond.kind);
    out->cond.num_classes = (int)json_integer_value(json_object_get(r, "num_classes"));
    out->cond.text_len = (int)json_integer_value(json_object_get(r, "text_len"));
    out->cond.text_dim = (int)json_integer_value(json_object_get(r, "text_dim"));
    out->cond.pooled_dim = (int)json_integer_value(json_object_get(r, "pooled_dim"));
    json_decref(r);
    return err;
}

static int toy_load(const char *dir, const ditd_backend_ops *ops, int max_batch,
                    const ditd_mesh *mesh, ditd_denoiser **out)
{
    (void)ops;
    (void)max_batch;
    (void)mesh; /* every rank computes everything: no split */
    toy *m = calloc(1, sizeof *m);
    int err;
    if (!m)
        return DITD_ENOMEM;
    if ((err = toy_shapes(dir, &m->base.shapes))) {
        free(m);
        return err;
    }
    *out = &m->base;
    return 0;
}

/* The conditioning's contribution of one row: class c -> 0.1 (c + 1), the
 * null class K -> 0; text -> the masked mean of its sequence's first
 * feature plus the pooled vector's first; with an embedded guidance, plus
 * 0.01 x its scale. */
static double cond_value(const ditd_cond *c, int row, int embed)
{
    if (embed)
        return cond_value(c, row, 0) + 0.01 * c->guidance[row];
    if (c->shape.kind == DITD_COND_CLASS)
        return c->class_ids[row] == c->shape.num_classes ? 0.0 : 0.1 * (double)(c->class_ids[row] + 1);
    int L = c->shape.text_len, Dt = c->shape.text_dim, n = 0;
    double s = 0;
    for (int l = 0; l < L; l++)
        if (c->mask[(size_t)row * L + l]) {
            s += c->text[((size_t)row * L + l) * Dt];
            n++;
        }
    return (n ? s / n : 0.0) + (c->pooled ? c->pooled[(size_t)row * c->shape.pooled_dim] : 0.0);
}

/* out = 0.5 x + 0.001 t sin(i) + cond, per element i; the second half 1e3. */
static void toy_eval(const float *x, float t, double cv, size_t numel, float *out)
{
    for (size_t i = 0; i < numel; i++)
        out[i] = (float)(0.5 * x[i] + 0.001 * t * sin((double)i) + cv);
    for (size_t i = 0; i < numel; i++)
        out[numel + i] = 1e3f;
}

static int toy_forward(ditd_denoiser *d, int B, const void *x, const float *t,
                       const ditd_cond *cond, void *out)
{
    toy *m = (toy *)d;
    size_t numel = ditd_denoiser_numel_in(&d->shapes);
    m->calls++;
    for (int b = 0; b < B; b++) {
        if (cond->shape.kind == DITD_COND_CLASS && cond->class_ids[b] == cond->shape.num_classes)
            m->uncond_rows++;
        toy_eval((const float *)x + (size_t)b * numel, t[b],
                 cond_value(cond, b, d->shapes.guidance_embed), numel,
                 (float *)out + (size_t)b * 2 * numel);
    }
    return 0;
}

static void toy_free(ditd_denoiser *d)
{
    free(d);
}

static const ditd_denoiser_family toy_family = {
    .class_name = TOY_CLASS,
    .shapes = toy_shapes,
    .load = toy_load,
    .forward = toy_forward,
    .free = toy_free,
};

/* ---- a model folder ---- */

static void write_file(const char *dir, const char *name, const char *text)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    TU_CHECK(f != NULL, "cannot write %s", path);
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

static void make_model_g(const char *dir, const char *cls, const char *cond, const char *sched,
                         int guidance_embed);

static void make_model(const char *dir, const char *cls, const char *cond, const char *sched)
{
    make_model_g(dir, cls, cond, sched, 0);
}

static void make_model_g(const char *dir, const char *cls, const char *cond, const char *sched,
                         int guidance_embed)
{
    char sub[4200], cfg[1024];
    snprintf(sub, sizeof sub, "%s/transformer", dir);
    TU_CHECK(mkdir(sub, 0700) == 0, "mkdir %s", sub);
    snprintf(sub, sizeof sub, "%s/scheduler", dir);
    TU_CHECK(mkdir(sub, 0700) == 0, "mkdir %s", sub);
    char index[512];
    snprintf(index, sizeof index,
             "{\"_class_name\": \"%s\", \"transformer\": [\"test\", \"x\"], "
             "\"scheduler\": [\"diffusers\", \"x\"], \"id2label\": {\"0\": \"zero\", \"1\": \"one\", "
             "\"2\": \"two\"}}",
             strcmp(cond, "text") == 0 ? "ToyTextPipeline" : "ToyPipeline");
    write_file(dir, "model_index.json", index);
    snprintf(cfg, sizeof cfg,
             "{\"_class_name\": \"%s\", \"in_channels\": 2, \"height\": 6, \"width\": 5, "
             "\"conditioning\": \"%s\", \"num_classes\": 3, \"text_len\": 4, \"text_dim\": 3, "
             "\"pooled_dim\": 2, \"guidance_embed\": %s}",
             cls, cond, guidance_embed ? "true" : "false");
    write_file(dir, "transformer/config.json", cfg);
    write_file(dir, "scheduler/scheduler_config.json", sched);
}

static const char *const sched_flow =
    "{\"_class_name\": \"FlowMatchEulerDiscreteScheduler\", \"num_train_timesteps\": 1000, \"shift\": 1.0}";
static const char *const sched_ddim =
    "{\"_class_name\": \"DDIMScheduler\", \"num_train_timesteps\": 1000, \"beta_schedule\": "
    "\"linear\", \"clip_sample\": false, \"prediction_type\": \"epsilon\"}";

/* ---- the reference loop: sampler + toy formula + guidance ---- */

static void reference(const ditd_model_info *info, ditd_sampler_kind kind, int steps, int n,
                      const ditd_gen_sample *smp, const double *cv, const double *cv_unc,
                      float *out)
{
    ditd_sched_config base, cfg;
    ditd_sampler *s = NULL;
    size_t numel = ditd_denoiser_numel_in(&info->shapes);
    float *e = malloc(2 * numel * sizeof(float)), *u = malloc(2 * numel * sizeof(float));
    TU_OK(ditd_sched_config_load(info->scheduler_config, &base));
    TU_OK(ditd_sched_config_convert(&base, kind, &cfg));
    TU_OK(ditd_sampler_new(&cfg, steps, n, numel, &s));
    if (!s)
        goto done;
    const float *ts = ditd_sampler_timesteps(s);
    for (int i = 0; i < n; i++) {
        float *x = out + (size_t)i * numel;
        ditd_philox_normal(smp[i].seed, smp[i].index, 0, numel, x);
        for (int k = 0; k < ditd_sampler_num_steps(s); k++) {
            toy_eval(x, ts[k], cv[i], numel, e);
            if (smp[i].guidance > 1.0f && !info->shapes.guidance_embed) {
                toy_eval(x, ts[k], cv_unc[i], numel, u);
                for (size_t j = 0; j < numel; j++)
                    e[j] = u[j] + smp[i].guidance * (e[j] - u[j]);
            }
            TU_OK(ditd_sampler_step(s, k, i, e, x, NULL));
        }
    }
done:
    ditd_sampler_free(s);
    free(e);
    free(u);
}

/* ---- a transport for the worker: one batch, then shutdown ---- */

typedef struct test_transport {
    ditd_transport t;
    uint8_t *batch;
    size_t batch_len;
    int sent_batch, got_result, sent_shutdown;
    Ditd__Result *result; /* unpacked, owned */
    Ditd__Envelope *result_env;
    int errors;
} test_transport;

static int tt_send(ditd_transport *t, const uint8_t *buf, size_t len)
{
    test_transport *tt = (test_transport *)t;
    Ditd__Envelope *env = ditd__envelope__unpack(NULL, len, buf);
    if (!env)
        return DITD_ECOMM;
    if (env->msg_case == DITD__ENVELOPE__MSG_RESULT && !tt->result_env) {
        tt->result_env = env;
        tt->result = env->result;
        tt->got_result = 1;
        return 0;
    }
    if (env->msg_case == DITD__ENVELOPE__MSG_ERROR) {
        fprintf(stderr, "worker error: %s\n", env->error->message);
        tt->errors++;
        tt->got_result = 1;
    }
    ditd__envelope__free_unpacked(env, NULL);
    return 0;
}

static int tt_recv(ditd_transport *t, uint8_t **buf, size_t *len, int timeout_ms)
{
    test_transport *tt = (test_transport *)t;
    Ditd__Envelope env = DITD__ENVELOPE__INIT;
    Ditd__Shutdown sd = DITD__SHUTDOWN__INIT;
    if (!tt->sent_batch) {
        tt->sent_batch = 1;
        *buf = malloc(tt->batch_len);
        memcpy(*buf, tt->batch, tt->batch_len);
        *len = tt->batch_len;
        return 0;
    }
    if (tt->got_result && !tt->sent_shutdown) {
        tt->sent_shutdown = 1;
        env.msg_case = DITD__ENVELOPE__MSG_SHUTDOWN;
        env.shutdown = &sd;
        *len = ditd__envelope__get_packed_size(&env);
        *buf = malloc(*len);
        ditd__envelope__pack(&env, *buf);
        return 0;
    }
    if (timeout_ms > 0)
        usleep(1000);
    return DITD_ETIMEDOUT;
}

static void worker_batch(const char *dir, const ditd_model_info *info, const ditd_gen_sample *smp,
                         int n, int steps, ditd_sampler_kind kind, const float *lat)
{
    Ditd__Envelope env = DITD__ENVELOPE__INIT;
    Ditd__Batch b = DITD__BATCH__INIT;
    Ditd__Sample s[4], *sp[4];
    for (int i = 0; i < n; i++) {
        ditd__sample__init(&s[i]);
        s[i].seed = smp[i].seed;
        s[i].index = smp[i].index;
        s[i].class_id = smp[i].cond.class_id;
        s[i].guidance = smp[i].guidance;
        sp[i] = &s[i];
    }
    b.batch_id = 7;
    b.model = (char *)info->name;
    b.width = (uint32_t)info->image_width;
    b.height = (uint32_t)info->image_height;
    b.steps = (uint32_t)steps;
    b.sampler = (uint32_t)kind;
    b.n_samples = (size_t)n;
    b.samples = sp;
    env.msg_case = DITD__ENVELOPE__MSG_BATCH;
    env.batch = &b;
    test_transport tt = {.t = {tt_send, tt_recv}};
    tt.batch_len = ditd__envelope__get_packed_size(&env);
    tt.batch = malloc(tt.batch_len);
    ditd__envelope__pack(&env, tt.batch);

    ditd_worker_config wc = {.model_dir = dir, .max_batch = 4, .threads = 1, .heartbeat_ms = 1000};
    TU_OK(ditd_worker_run(&wc, &tt.t));
    TU_CHECK(tt.result && tt.errors == 0, "worker: a result and no error");
    if (tt.result) {
        size_t numel = ditd_denoiser_numel_in(&info->shapes);
        uint8_t *want = malloc(numel);
        TU_CHECK(tt.result->width == (uint32_t)info->image_width &&
                     tt.result->height == (uint32_t)info->image_height &&
                     tt.result->channels == (uint32_t)info->image_channels &&
                     tt.result->n_images == (size_t)n,
                 "worker result %ux%u x%u, %zu images", tt.result->width, tt.result->height,
                 tt.result->channels, tt.result->n_images);
        for (size_t i = 0; i < tt.result->n_images && i < (size_t)n; i++) {
            ditd_pipeline_to_pixels(lat + i * numel, info->shapes.in_channels, info->shapes.height,
                                    info->shapes.width, want);
            TU_CHECK(tt.result->images[i]->pixels.len == numel &&
                         memcmp(tt.result->images[i]->pixels.data, want, numel) == 0,
                     "worker image %zu: the pipeline's pixels", i);
        }
        free(want);
        ditd__envelope__free_unpacked(tt.result_env, NULL);
    }
    free(tt.batch);
}

/* ---- the toy pipelines: rows of the pipeline table, registered ---- */

static const ditd_pipeline_class toy_pipeline = {
    .name = "ToyPipeline",
    .transformers = {TOY_CLASS, NULL},
    .cond = DITD_COND_CLASS,
    .guidance = DITD_GUIDANCE_CFG,
    .unscale = DITD_LATENT_RULE_DIT,
    .default_steps = 25,
    .default_guidance = 4.0f,
};

/* text: the test hands the pipeline embeddings itself (no recipe) */
static const ditd_pipeline_class toy_text_pipeline = {
    .name = "ToyTextPipeline",
    .transformers = {TOY_CLASS, NULL},
    .cond = DITD_COND_TEXT,
    .guidance = DITD_GUIDANCE_CFG,
    .unscale = DITD_LATENT_RULE_SHIFTED,
    .default_steps = 7,
    .default_guidance = 3.0f,
    .default_max_sequence_length = 4,
    .max_sequence_length = 4,
    .request = DITD_REQ_NEGATIVE_PROMPT | DITD_REQ_MAX_SEQUENCE,
};

/* ---- the tests ---- */

static void test_registry(const char *tmp)
{
    const void *f = NULL;
    char dir[4200];
    TU_OK(ditd_registry_find(DITD_COMPONENT_TRANSFORMER, "DiTTransformer2DModel", &f));
    TU_CHECK_ERR(ditd_registry_find(DITD_COMPONENT_TRANSFORMER, TOY_CLASS, &f), DITD_EUNSUPPORTED,
                 TOY_CLASS, "DiTTransformer2DModel");
    TU_OK(ditd_registry_add(DITD_COMPONENT_TRANSFORMER, TOY_CLASS, &toy_family));
    TU_OK(ditd_registry_find(DITD_COMPONENT_TRANSFORMER, TOY_CLASS, &f));
    TU_CHECK(f == &toy_family, "the registry hands back the toy's table");
    TU_CHECK_ERR(ditd_registry_add(DITD_COMPONENT_TRANSFORMER, TOY_CLASS, &toy_family), DITD_EINVAL,
                 "already");
    TU_CHECK_ERR(ditd_registry_find(DITD_COMPONENT_VAE, TOY_CLASS, &f), DITD_EUNSUPPORTED, "vae");
    /* the toy pipelines: found by name once registered, their rules asked */
    const ditd_pipeline_class *pc = NULL;
    TU_CHECK_ERR(ditd_registry_find_pipeline("ToyPipeline", &pc), DITD_EUNSUPPORTED, "ToyPipeline",
                 "DiTPipeline, FluxPipeline, StableDiffusion3Pipeline");
    TU_OK(ditd_registry_add(DITD_COMPONENT_PIPELINE, "ToyPipeline", &toy_pipeline));
    TU_OK(ditd_registry_add(DITD_COMPONENT_PIPELINE, "ToyTextPipeline", &toy_text_pipeline));
    TU_OK(ditd_registry_find_pipeline("ToyPipeline", &pc));
    TU_CHECK(pc == &toy_pipeline, "the registry hands back the toy pipeline's row");
    TU_OK(ditd_pipeline_class_check(pc, TOY_CLASS, DITD_COND_CLASS));
    TU_CHECK_ERR(ditd_pipeline_class_check(pc, "DiTTransformer2DModel", DITD_COND_CLASS),
                 DITD_EUNSUPPORTED, "ToyPipeline drives " TOY_CLASS);
    TU_CHECK_ERR(ditd_pipeline_class_check(pc, TOY_CLASS, DITD_COND_TEXT), DITD_EUNSUPPORTED,
                 "class conditioning");
    /* the rules, for each built-in row */
    TU_CHECK(ditd_pipeline_class_text_len(&ditd_pipeline_flux, 256) == 256 &&
                 ditd_pipeline_class_text_len(&ditd_pipeline_sd3, 256) == 77 + 256 &&
                 ditd_pipeline_class_text_len(&ditd_pipeline_dit, 256) == 0,
             "text lengths: flux %d, sd3 %d", ditd_pipeline_class_text_len(&ditd_pipeline_flux, 256),
             ditd_pipeline_class_text_len(&ditd_pipeline_sd3, 256));
    TU_CHECK(ditd_pipeline_class_prompts(&ditd_pipeline_flux) == 2 &&
                 ditd_pipeline_class_prompts(&ditd_pipeline_sd3) == 3 &&
                 ditd_pipeline_class_prompts(&ditd_pipeline_dit) == 0,
             "prompt counts");
    /* guidance: DiT/SD3 run the pass on guidance_scale > 1 (not when the
     * model embeds it); FLUX on true_cfg > 1 with a negative prompt only */
    TU_CHECK(ditd_pipeline_class_cfg_scale(&ditd_pipeline_sd3, 7.0f, 1.0f, 0, 0) == 7.0f &&
                 ditd_pipeline_class_cfg_scale(&ditd_pipeline_sd3, 1.0f, 5.0f, 1, 0) == 0.0f &&
                 ditd_pipeline_class_cfg_scale(&ditd_pipeline_dit, 4.0f, 1.0f, 0, 1) == 0.0f &&
                 ditd_pipeline_class_cfg_scale(&ditd_pipeline_flux, 3.5f, 4.0f, 1, 1) == 4.0f &&
                 ditd_pipeline_class_cfg_scale(&ditd_pipeline_flux, 3.5f, 4.0f, 0, 1) == 0.0f &&
                 ditd_pipeline_class_cfg_scale(&ditd_pipeline_flux, 3.5f, 1.0f, 1, 0) == 0.0f,
             "the guidance rules");
    TU_CHECK(ditd_pipeline_class_needs_negative(&ditd_pipeline_sd3, 7.0f, 1.0f, 0, 0) &&
                 !ditd_pipeline_class_needs_negative(&ditd_pipeline_dit, 4.0f, 1.0f, 0, 0) &&
                 !ditd_pipeline_class_needs_negative(&ditd_pipeline_flux, 3.5f, 4.0f, 0, 1),
             "which samples encode a negative prompt");
    /* WanPipeline: one UMT5 sequence of L, no pooled vector, CFG on
     * guidance_scale > 1 ("" as the negative), 81 frames at 16 fps */
    TU_CHECK(ditd_pipeline_class_text_len(&ditd_pipeline_wan, 512) == 512 &&
                 ditd_pipeline_class_prompts(&ditd_pipeline_wan) == 1 &&
                 ditd_pipeline_class_cfg_scale(&ditd_pipeline_wan, 5.0f, 1.0f, 0, 0) == 5.0f &&
                 ditd_pipeline_class_needs_negative(&ditd_pipeline_wan, 5.0f, 1.0f, 0, 0) &&
                 !ditd_pipeline_class_needs_negative(&ditd_pipeline_wan, 1.0f, 1.0f, 1, 0) &&
                 ditd_pipeline_wan.default_frames == 81 && ditd_pipeline_wan.fps == 16 &&
                 ditd_pipeline_wan.parts[0].kind == DITD_PROMPT_ENC_UMT5,
             "WanPipeline's row");
    for (int k = 0; k < DITD_GUIDANCE_KIND_COUNT; k++) {
        ditd_guidance_kind g;
        TU_OK(ditd_guidance_kind_from_str(ditd_guidance_kind_name((ditd_guidance_kind)k), &g));
        TU_CHECK(g == (ditd_guidance_kind)k, "guidance kind %d round trip", k);
    }
    {   /* backend capabilities: a head size the backend's attention does not
         * take is refused where the model loads, before any weight, naming
         * the device and its limit (the CUDA table is asked without a GPU) */
        char hdir[4300], cfg[1024];
        ditd_model_info hi;
        ditd_pipeline *hp = NULL;
        snprintf(hdir, sizeof hdir, "%s/big-heads", tmp);
        TU_CHECK(mkdir(hdir, 0700) == 0, "mkdir %s", hdir);
        make_model(hdir, TOY_CLASS, "class", sched_flow);
        snprintf(cfg, sizeof cfg,
                 "{\"_class_name\": \"%s\", \"in_channels\": 2, \"height\": 6, \"width\": 5, "
                 "\"conditioning\": \"class\", \"num_classes\": 3, \"attention_head_dim\": 1024}",
                 TOY_CLASS);
        write_file(hdir, "transformer/config.json", cfg);
        TU_OK(ditd_model_info_load(hdir, &hi));
        TU_CHECK_ERR(ditd_pipeline_new(&hi, &ditd_backend_cpu, 1, &hp), DITD_EUNSUPPORTED,
                     "attention_head_dim = 1024", "the cpu backend", "1..512");
        TU_CHECK(hp == NULL, "nothing loaded");
        const ditd_backend_ops *cu = ditd_backend_table(DITD_DEVICE_CUDA);
        if (cu) {
            snprintf(cfg, sizeof cfg,
                     "{\"_class_name\": \"%s\", \"in_channels\": 2, \"height\": 6, \"width\": 5, "
                     "\"conditioning\": \"class\", \"num_classes\": 3, \"attention_head_dim\": 256}",
                     TOY_CLASS);
            write_file(hdir, "transformer/config.json", cfg);
            ditd_model_info_free(&hi);
            TU_OK(ditd_model_info_load(hdir, &hi));
            TU_CHECK_ERR(ditd_pipeline_new(&hi, cu, 1, &hp), DITD_EUNSUPPORTED,
                         "attention_head_dim = 256", "the cuda backend", "1..128");
            TU_OK(ditd_backend_check_head_dim(&ditd_backend_cpu, 256, "256 on the cpu"));
        } else {
            printf("the cuda backend is not built in: its head-size refusal is not checked here\n");
        }
        ditd_model_info_free(&hi);
    }
    {   /* model folders: an unknown pipeline class, and one that drives another transformer */
        char pdir[4300];
        ditd_model_info pi;
        snprintf(pdir, sizeof pdir, "%s/foo-pipeline", tmp);
        TU_CHECK(mkdir(pdir, 0700) == 0, "mkdir %s", pdir);
        make_model(pdir, TOY_CLASS, "class", sched_flow);
        write_file(pdir, "model_index.json",
                   "{\"_class_name\": \"FooPipeline\", \"transformer\": [\"test\", \"x\"]}");
        TU_CHECK_ERR(ditd_model_info_load(pdir, &pi), DITD_EUNSUPPORTED, "FooPipeline",
                     "DiTPipeline, FluxPipeline, StableDiffusion3Pipeline, WanPipeline, "
                     "WanImageToVideoPipeline, FluxImg2ImgPipeline, FluxInpaintPipeline, "
                     "StableDiffusion3Img2ImgPipeline, StableDiffusion3InpaintPipeline, "
                     "FluxKontextPipeline, ToyPipeline");
        write_file(pdir, "model_index.json",
                   "{\"_class_name\": \"DiTPipeline\", \"transformer\": [\"test\", \"x\"]}");
        TU_CHECK_ERR(ditd_model_info_load(pdir, &pi), DITD_EUNSUPPORTED,
                     "DiTPipeline drives DiTTransformer2DModel, not a " TOY_CLASS);
        write_file(pdir, "model_index.json", "{\"transformer\": [\"test\", \"x\"]}");
        TU_CHECK_ERR(ditd_model_info_load(pdir, &pi), DITD_EFORMAT, "_class_name");
    }

    /* a folder with an unknown transformer class: refused at load, naming the supported */
    snprintf(dir, sizeof dir, "%s/unknown", tmp);
    TU_CHECK(mkdir(dir, 0700) == 0, "mkdir %s", dir);
    make_model(dir, "NoSuchTransformer2DModel", "text", sched_flow);
    ditd_model_info info;
    TU_CHECK_ERR(ditd_model_info_load(dir, &info), DITD_EUNSUPPORTED, "NoSuchTransformer2DModel",
                 "DiTTransformer2DModel, FluxTransformer2DModel, SD3Transformer2DModel, "
                 "WanTransformer3DModel, " TOY_CLASS);
    /* enums round-trip; bad shapes and conditioning refused with their numbers */
    for (int k = 0; k < DITD_COND_KIND_COUNT; k++) {
        ditd_cond_kind v;
        TU_OK(ditd_cond_kind_from_str(ditd_cond_kind_name((ditd_cond_kind)k), &v));
        TU_CHECK((int)v == k, "cond kind round trip %d", k);
    }
    for (int k = 0; k < DITD_COMPONENT_COUNT; k++) {
        ditd_component v;
        TU_OK(ditd_component_from_str(ditd_component_name((ditd_component)k), &v));
        TU_CHECK((int)v == k, "component round trip %d", k);
    }
    ditd_cond cd;
    ditd_cond_shape bad_text = {.kind = DITD_COND_TEXT, .text_len = 0, .text_dim = 8};
    TU_CHECK_ERR(ditd_cond_init(&cd, &bad_text, 4), DITD_EINVAL, "text conditioning (0, 8)");
    ditd_cond_shape no_class = {.kind = DITD_COND_CLASS, .num_classes = 0};
    TU_CHECK_ERR(ditd_cond_init(&cd, &no_class, 4), DITD_EINVAL, "0 classes");
    ditd_denoiser_shapes bs = {.in_channels = 4, .out_channels = 4, .height = 8, .width = 8,
                               .heads = 0, .tokens = 16,
                               .cond = {.kind = DITD_COND_CLASS, .num_classes = 10}};
    TU_CHECK_ERR(ditd_denoiser_shapes_check(&bs, "toy"), DITD_EINVAL, "toy", "0 heads");
    bs.heads = 2;
    bs.out_channels = 0;
    TU_CHECK_ERR(ditd_denoiser_shapes_check(&bs, "toy"), DITD_EINVAL, "4 input, 0 output");
    /* fewer output than input channels: a condition concatenated on
     * channels (Wan 2.2 I2V: 36 in, 16 out) */
    bs.out_channels = 3;
    TU_OK(ditd_denoiser_shapes_check(&bs, "toy"));
    /* frames: counted by numel when > 1, refused when negative */
    bs.frames = 5;
    TU_CHECK(ditd_denoiser_numel_in(&bs) == 5 * 4 * 8 * 8 && ditd_denoiser_numel_out(&bs) == 5 * 3 * 8 * 8,
             "numel counts frames");
    bs.frames = 1;
    TU_CHECK(ditd_denoiser_numel_in(&bs) == 4 * 8 * 8, "one frame is an image");
    bs.frames = -1;
    TU_CHECK_ERR(ditd_denoiser_shapes_check(&bs, "toy"), DITD_EINVAL, "-1 latent frames");
    ditd_component c;
    TU_OK(ditd_component_from_str("vae", &c));
    TU_CHECK(c == DITD_COMPONENT_VAE && !strcmp(ditd_component_name(c), "vae"), "component names");
    TU_CHECK_ERR(ditd_component_from_str("unet", &c), DITD_EINVAL, "unet");
}

static void test_class_pipeline(const char *tmp)
{
    char dir[4200];
    ditd_model_info info;
    ditd_pipeline *p = NULL;
    snprintf(dir, sizeof dir, "%s/toy-class", tmp);
    TU_CHECK(mkdir(dir, 0700) == 0, "mkdir %s", dir);
    make_model(dir, TOY_CLASS, "class", sched_ddim);
    TU_OK(ditd_model_info_load(dir, &info));
    TU_CHECK(info.denoiser == &toy_family && info.num_classes == 3, "toy found, 3 classes");
    TU_CHECK(info.vae_scale == 1 && info.image_width == 5 && info.image_height == 6 &&
                 info.image_channels == 2,
             "pixel space: image %dx%d x%d, scale %d", info.image_width, info.image_height,
             info.image_channels, info.vae_scale);
    TU_OK(ditd_pipeline_new(&info, &ditd_backend_cpu, 4, &p));
    if (!p)
        goto done;
    ditd_gen_sample smp[3] = {
        {.seed = 5, .index = 0, .cond = {.class_id = 2}, .guidance = 3.0f},
        {.seed = 5, .index = 1, .cond = {.class_id = 0}, .guidance = 1.0f},
        {.seed = 9, .index = 0, .cond = {.class_id = 1}, .guidance = 1.5f},
    };
    double cv[3] = {0.3, 0.1, 0.2}, unc[3] = {0, 0, 0};
    ditd_gen_params gp = {.steps = 6, .sampler = DITD_SAMPLER_DDIM};
    size_t numel = ditd_denoiser_numel_in(&info.shapes);
    float *got = malloc(3 * numel * sizeof(float)), *want = malloc(3 * numel * sizeof(float));
    TU_OK(ditd_pipeline_generate(p, &gp, 3, smp, NULL, got, NULL, NULL, NULL));
    reference(&info, gp.sampler, gp.steps, 3, smp, cv, unc, want);
    TU_CLOSE("toy class pipeline (ddim, guidance 3, 1, 1.5)", got, want, 3 * numel, 1e-6);
    toy *m = (toy *)p->den;
    TU_CHECK(m->calls == 6 && m->uncond_rows == 12, "toy forward: %d calls, %d null-class rows",
             m->calls, m->uncond_rows);
    /* a class out of range is refused before any forward */
    smp[0].cond.class_id = 3;
    TU_CHECK_ERR(ditd_pipeline_generate(p, &gp, 1, smp, NULL, got, NULL, NULL, NULL), DITD_EINVAL,
                 "class 3");
    smp[0].cond.class_id = 2;
    ditd_pipeline_free(p);
    p = NULL;
    /* the worker runs the toy family too: same pixels */
    worker_batch(dir, &info, smp, 3, gp.steps, gp.sampler, want);
    free(got);
    free(want);
done:
    ditd_model_info_free(&info);
}

static void test_text_pipeline(const char *tmp)
{
    char dir[4200];
    ditd_model_info info;
    ditd_pipeline *p = NULL;
    snprintf(dir, sizeof dir, "%s/toy-text", tmp);
    TU_CHECK(mkdir(dir, 0700) == 0, "mkdir %s", dir);
    make_model(dir, TOY_CLASS, "text", sched_flow);
    /* a latent model: vae/config.json's 4 blocks give the scale factor 8 */
    char vdir[4300];
    snprintf(vdir, sizeof vdir, "%s/vae", dir);
    TU_CHECK(mkdir(vdir, 0700) == 0, "mkdir %s", vdir);
    write_file(vdir, "config.json",
               "{\"_class_name\": \"AutoencoderKL\", \"block_out_channels\": [8, 16, 16, 32], "
               "\"down_block_types\": [\"DownEncoderBlock2D\", \"DownEncoderBlock2D\", "
               "\"DownEncoderBlock2D\", \"DownEncoderBlock2D\"], \"up_block_types\": "
               "[\"UpDecoderBlock2D\", \"UpDecoderBlock2D\", \"UpDecoderBlock2D\", "
               "\"UpDecoderBlock2D\"], \"latent_channels\": 2, \"norm_num_groups\": 8, "
               "\"out_channels\": 3}");
    write_file(dir, "model_index.json",
               "{\"_class_name\": \"ToyTextPipeline\", \"transformer\": [\"test\", \"x\"], "
               "\"vae\": [\"diffusers\", \"AutoencoderKL\"], \"scheduler\": [\"diffusers\", \"x\"]}");
    TU_OK(ditd_model_info_load(dir, &info));
    TU_CHECK(info.shapes.cond.kind == DITD_COND_TEXT && info.num_classes == 0 && info.needs_vae,
             "text toy: kind %s, %d classes", ditd_cond_kind_name(info.shapes.cond.kind),
             info.num_classes);
    TU_CHECK(info.vae_scale == 8 && info.image_width == 40 && info.image_height == 48 &&
                 info.image_channels == 3 && info.shapes.width == 5 && info.shapes.height == 6,
             "latent 5x6 -> image %dx%d x%d (scale %d)", info.image_width, info.image_height,
             info.image_channels, info.vae_scale);
    {   /* a vae class the registry does not have: refused naming the supported one */
        char bdir[4300], bv[4400];
        ditd_model_info bi;
        snprintf(bdir, sizeof bdir, "%s/toy-badvae", tmp);
        TU_CHECK(mkdir(bdir, 0700) == 0, "mkdir %s", bdir);
        make_model(bdir, TOY_CLASS, "text", sched_flow);
        snprintf(bv, sizeof bv, "%s/vae", bdir);
        TU_CHECK(mkdir(bv, 0700) == 0, "mkdir %s", bv);
        write_file(bv, "config.json", "{\"_class_name\": \"AutoencoderTiny\"}");
        write_file(bdir, "model_index.json",
                   "{\"_class_name\": \"ToyTextPipeline\", \"transformer\": [\"test\", \"x\"], "
                   "\"vae\": [\"diffusers\", \"AutoencoderTiny\"], \"scheduler\": [\"diffusers\", \"x\"]}");
        int e = ditd_model_info_load(bdir, &bi);
        TU_CHECK(e == DITD_EUNSUPPORTED && strstr(ditd_err_detail(), "AutoencoderTiny") &&
                     strstr(ditd_err_detail(), "AutoencoderKL"),
                 "unknown vae class: %s (%s)", ditd_err_name(e), ditd_err_detail());
        if (!e)
            ditd_model_info_free(&bi);
    }
    {   /* the same model_index without vae/: loads (latents can be saved), no image size */
        char ndir[4300];
        ditd_model_info ni;
        snprintf(ndir, sizeof ndir, "%s/toy-novae", tmp);
        TU_CHECK(mkdir(ndir, 0700) == 0, "mkdir %s", ndir);
        make_model(ndir, TOY_CLASS, "text", sched_flow);
        write_file(ndir, "model_index.json",
                   "{\"_class_name\": \"ToyTextPipeline\", \"transformer\": [\"test\", \"x\"], "
                   "\"vae\": [\"diffusers\", \"AutoencoderKL\"], \"scheduler\": [\"diffusers\", \"x\"]}");
        TU_OK(ditd_model_info_load(ndir, &ni));
        TU_CHECK(ni.needs_vae && ni.vae_scale == 0 && ni.image_width == 0 && ni.image_height == 0 &&
                     ni.vae_dir[0] == '\0' && ni.shapes.width == 5,
                 "no vae/: scale %d, image %dx%d", ni.vae_scale, ni.image_width, ni.image_height);
        ditd_model_info_free(&ni);
    }
    TU_OK(ditd_pipeline_new(&info, &ditd_backend_cpu, 2, &p));
    if (!p)
        goto done;
    /* two prompts' embeddings, a negative one; mask drops a token */
    float seq[2][4 * 3], neg[4 * 3], pooled[2][2] = {{0.25f, 9}, {-0.5f, 9}}, npool[2] = {0.125f, 9};
    uint8_t mask[4] = {1, 1, 0, 1};
    for (int i = 0; i < 12; i++) {
        seq[0][i] = 0.01f * (float)(i + 1);
        seq[1][i] = -0.02f * (float)i;
        neg[i] = 0.005f * (float)(12 - i);
    }
    ditd_text_embeds e0 = {seq[0], mask, pooled[0]}, e1 = {seq[1], NULL, pooled[1]};
    ditd_text_embeds en = {neg, NULL, npool};
    ditd_gen_sample smp[2] = {
        {.seed = 3, .index = 0, .cond = {.prompt = &e0, .negative = &en}, .guidance = 4.0f},
        {.seed = 4, .index = 0, .cond = {.prompt = &e1}, .guidance = 1.0f},
    };
    /* the toy's conditioning values, by hand */
    double cv[2] = {(0.01 * 1 + 0.01 * 4 + 0.01 * 10) / 3 + 0.25, (0 - 0.06 - 0.12 - 0.18) / 4 - 0.5};
    double unc[2] = {(0.005 * 12 + 0.005 * 9 + 0.005 * 6 + 0.005 * 3) / 4 + 0.125, 0};
    ditd_gen_params gp = {.steps = 5, .sampler = DITD_SAMPLER_FLOW_EULER};
    size_t numel = ditd_denoiser_numel_in(&info.shapes);
    float got[2 * 60], want[2 * 60];
    TU_CHECK(numel == 60, "numel %zu", numel);
    TU_OK(ditd_pipeline_generate(p, &gp, 2, smp, NULL, got, NULL, NULL, NULL));
    reference(&info, gp.sampler, gp.steps, 2, smp, cv, unc, want);
    TU_CLOSE("toy text pipeline (flow-euler, negative prompt)", got, want, 2 * numel, 1e-5);
    /* guidance without a negative embedding: refused naming it */
    smp[1].guidance = 2.0f;
    TU_CHECK_ERR(ditd_pipeline_generate(p, &gp, 2, smp, NULL, got, NULL, NULL, NULL), DITD_EINVAL,
                 "negative");
    /* no prompt at all */
    smp[1].cond.prompt = NULL;
    TU_CHECK_ERR(ditd_pipeline_generate(p, &gp, 2, smp, NULL, got, NULL, NULL, NULL), DITD_EINVAL,
                 "prompt");
    ditd_pipeline_free(p);
done:
    ditd_model_info_free(&info);
}

/* A family that embeds the guidance scale (FLUX.1-dev's way): no
 * unconditional pass, the scale reaches the forward in cond.guidance. */
static void test_guidance_embed(const char *tmp)
{
    char dir[4200];
    ditd_model_info info;
    ditd_pipeline *p = NULL;
    snprintf(dir, sizeof dir, "%s/toy-embed", tmp);
    TU_CHECK(mkdir(dir, 0700) == 0, "mkdir %s", dir);
    make_model_g(dir, TOY_CLASS, "class", sched_flow, 1);
    TU_OK(ditd_model_info_load(dir, &info));
    TU_CHECK(info.shapes.guidance_embed == 1, "guidance_embed read");
    TU_OK(ditd_pipeline_new(&info, &ditd_backend_cpu, 2, &p));
    if (!p)
        goto done;
    ditd_gen_sample smp[2] = {
        {.seed = 1, .index = 0, .cond = {.class_id = 1}, .guidance = 3.5f},
        {.seed = 2, .index = 0, .cond = {.class_id = 0}, .guidance = 1.0f},
    };
    double cv[2] = {0.2 + 0.035, 0.1 + 0.01}, unc[2] = {0, 0};
    ditd_gen_params gp = {.steps = 4, .sampler = DITD_SAMPLER_FLOW_EULER};
    size_t numel = ditd_denoiser_numel_in(&info.shapes);
    float got[2 * 60], want[2 * 60];
    TU_OK(ditd_pipeline_generate(p, &gp, 2, smp, NULL, got, NULL, NULL, NULL));
    reference(&info, gp.sampler, gp.steps, 2, smp, cv, unc, want);
    TU_CLOSE("toy embedded guidance (no unconditional pass)", got, want, 2 * numel, 1e-6);
    toy *m = (toy *)p->den;
    TU_CHECK(m->calls == 4 && m->uncond_rows == 0, "embedded guidance: %d calls, %d null rows",
             m->calls, m->uncond_rows);
    ditd_pipeline_free(p);
done:
    ditd_model_info_free(&info);
}

int main(void)
{
    char tmp[512], cmd[600];
    if (tu_mkdtemp(tmp, sizeof tmp, "family"))
        return 1;
    ditd_backend_cpu.set_threads(1);
    test_registry(tmp);
    test_class_pipeline(tmp);
    test_text_pipeline(tmp);
    test_guidance_embed(tmp);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    TU_CHECK(system(cmd) == 0, "cleanup");
    return tu_exit();
}
