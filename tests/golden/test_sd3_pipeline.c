/* StableDiffusion3Pipeline end to end against Diffusers run in float64 (the
 * fixtures of tools/make_sd3_pipeline_fixtures.py: tiny random SD3-, SD3.5-
 * and T5-less folders with the real CLIP and T5 tokenizers, assembled in the
 * build tree; the expected arrays in tests/fixtures/sd3_pipeline/expected/).
 * Everything SD3-specific comes from the pipeline table's row
 * (engine/models/pipeline_class.h); this test names no pipeline class. For
 * every case:
 *   - the prompt encoder (the row's recipe: both CLIPs' penultimate hidden
 *     states joined on channels and zero-padded, then T5 or zeros; both
 *     CLIPs' projected pooled vectors) within TEXT_TOL of Diffusers'
 *     encode_prompt, prompt_2 / prompt_3 and the negatives included;
 *   - the timesteps (the scheduler's own, shift 3) equal Diffusers';
 *   - the final latents (CFG over the negative prompt or "", skip-layer
 *     guidance where the case asks, batches, num_images_per_prompt, any size
 *     through set_size) within 1e-4 relative;
 *   - the decoded image (the shifted unscale, the 16-channel VAE) within one
 *     8-bit level.
 * At least 12 cases are checked, 2 of them with skip-layer guidance. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/backend/backend.h"
#include "engine/io/npy.h"
#include "engine/models/model.h"
#include "engine/pipeline/latent_image.h"
#include "engine/pipeline/pipeline.h"
#include "engine/pipeline/prompt_encoder.h"
#include "tests/test_util.h"

#define MIN_CASES 12
#define MIN_SLG_CASES 2
#define TEXT_TOL 5e-5 /* f32 encoders against float64 (as test_flux_pipeline.c) */
#define MAXB 4

static float *npy(const char *name, size_t *n)
{
    char path[4096];
    int64_t shape[8];
    int nd;
    float *d = NULL;
    *n = 0;
    if (!name) {
        TU_CHECK(0, "a fixture file is not named in cases.json");
        return NULL;
    }
    snprintf(path, sizeof path, "%s/sd3_pipeline/expected/%s", tu_fixtures(), name);
    if (ditd_npy_read_f32(path, 8, &nd, shape, &d)) {
        TU_CHECK(0, "%s: %s", path, ditd_err_detail());
        return NULL;
    }
    *n = 1;
    for (int i = 0; i < nd; i++)
        *n *= (size_t)shape[i];
    return d;
}

static const char *str_at(json_t *v, int i)
{
    if (json_is_string(v))
        return json_string_value(v);
    if (json_is_array(v) && json_is_string(json_array_get(v, (size_t)i)))
        return json_string_value(json_array_get(v, (size_t)i));
    return NULL;
}

static int jint(json_t *c, const char *k) { return (int)json_integer_value(json_object_get(c, k)); }
static double jnum(json_t *c, const char *k) { return json_number_value(json_object_get(c, k)); }
static const char *jstr(json_t *c, const char *k) { return json_string_value(json_object_get(c, k)); }

static ditd_prompt_texts texts(const char *a, const char *b, const char *c)
{
    ditd_prompt_texts t = {.texts = {a ? a : "", b, c}};
    for (int k = 0; k < 3; k++)
        t.lens[k] = t.texts[k] ? strlen(t.texts[k]) : 0;
    return t;
}

/* One case; 1 when checked to the end (*slg: 1 when it ran skip-layer guidance). */
static int run_case(json_t *c, int *slg)
{
    char dir[4096], what[512];
    const char *name = jstr(c, "name");
    json_t *prompts = json_object_get(c, "prompts"), *negs = json_object_get(c, "negative_prompts");
    int B = jint(c, "batch"), nb = (int)json_array_size(prompts);
    int per = jint(c, "num_images_per_prompt") > 0 ? jint(c, "num_images_per_prompt") : 1;
    int L = jint(c, "max_sequence_length"), T = jint(c, "text_len");
    int lh = jint(c, "latent_height"), lw = jint(c, "latent_width");
    int steps = jint(c, "num_inference_steps");
    int cfg = json_is_true(json_object_get(c, "cfg_used"));
    float g = (float)jnum(c, "guidance_scale");
    json_t *skip = json_object_get(c, "skip_guidance_layers");
    int done = 0;
    size_t n_emb, n_pool, n_noise, n_fin, n_img, n_ts, n_nemb = 0, n_npool = 0;

    snprintf(dir, sizeof dir, "%s/%s", SD3_PIPELINE_DIR, jstr(c, "folder"));
    float *emb = npy(jstr(c, "prompt_embeds"), &n_emb), *pool = npy(jstr(c, "pooled"), &n_pool);
    float *noise = npy(jstr(c, "noise"), &n_noise), *fin = npy(jstr(c, "final_latents"), &n_fin);
    float *img = npy(jstr(c, "image_u8"), &n_img), *ts = npy(jstr(c, "timesteps"), &n_ts);
    float *nemb = cfg ? npy(jstr(c, "negative_prompt_embeds"), &n_nemb) : NULL;
    float *npool = cfg ? npy(jstr(c, "negative_pooled"), &n_npool) : NULL;
    ditd_model_info info;
    ditd_prompt_encoder *pe = NULL;
    ditd_pipeline *p = NULL;
    ditd_latent_image *li = NULL;
    float *seq = NULL, *pooled = NULL, *out = NULL;
    uint8_t *pix = NULL;
    ditd_text_embeds te[2 * MAXB];
    ditd_gen_sample smp[MAXB];
    memset(&info, 0, sizeof info);

    TU_CHECK(B == nb * per && B >= 1 && B <= MAXB, "%s: %d images of %d prompts x %d", name, B, nb,
             per);
    if (!emb || !pool || !noise || !fin || !img || !ts || (cfg && (!nemb || !npool)) || B > MAXB ||
        B < 1 || B != nb * per)
        goto out;
    TU_OK(ditd_model_info_load(dir, &info));
    if (!info.pipeline)
        goto out;
    TU_CHECK(ditd_pipeline_class_text_len(info.pipeline, L) == T,
             "%s: the row's text length at L %d: %d, Diffusers %d", name, L,
             ditd_pipeline_class_text_len(info.pipeline, L), T);
    ditd_prompt_encoder_opts o = {.max_sequence_length = L};
    TU_OK(ditd_prompt_encoder_new(&info, &ditd_backend_cpu, &o, &pe));
    if (!pe)
        goto out;
    const int Dt = ditd_prompt_encoder_text_dim(pe), Dp = ditd_prompt_encoder_pooled_dim(pe);
    TU_CHECK(ditd_prompt_encoder_text_len(pe, L) == T && n_emb == (size_t)B * T * Dt &&
                 n_pool == (size_t)B * Dp && n_noise == (size_t)B * 16 * lh * lw && n_fin == n_noise &&
                 (!cfg || (n_nemb == n_emb && n_npool == n_pool)),
             "%s: fixture sizes (%zu, %zu, %zu) for B %d T %d Dt %d Dp %d", name, n_emb, n_pool,
             n_noise, B, T, Dt, Dp);
    if (n_emb != (size_t)B * T * Dt || n_pool != (size_t)B * Dp || n_noise != n_fin ||
        (cfg && (n_nemb != n_emb || n_npool != n_pool)))
        goto out;
    seq = malloc(2 * (size_t)B * T * Dt * sizeof *seq);
    pooled = malloc(2 * (size_t)B * Dp * sizeof *pooled);
    if (!seq || !pooled)
        goto out;

    /* sample b is prompt b / per; the negative prompt defaults to "" (SD3
     * runs the unconditional pass whenever guidance_scale > 1) */
    for (int b = 0; b < B; b++) {
        const char *pr = str_at(prompts, b / per), *ng = str_at(negs, b / per);
        float *s = seq + (size_t)b * T * Dt, *pv = pooled + (size_t)b * Dp;
        ditd_prompt_texts pt = texts(pr, jstr(c, "prompt_2"), jstr(c, "prompt_3"));
        TU_OK(ditd_prompt_encoder_encode_n(pe, &pt, L, s, pv));
        te[b] = (ditd_text_embeds){.seq = s, .pooled = pv};
        smp[b] = (ditd_gen_sample){.seed = 0, .index = (uint64_t)b, .guidance = g, .true_cfg = 1.0f};
        smp[b].cond.prompt = &te[b];
        TU_CHECK(ditd_pipeline_class_needs_negative(info.pipeline, g, 1.0f, ng != NULL, 0) == cfg,
                 "%s: the row's rule says the negative pass %s", name, cfg ? "runs" : "does not run");
        if (cfg) {
            float *ns = seq + (size_t)(B + b) * T * Dt, *np_ = pooled + (size_t)(B + b) * Dp;
            ditd_prompt_texts nt = texts(ng, jstr(c, "negative_prompt_2"), jstr(c, "negative_prompt_3"));
            TU_OK(ditd_prompt_encoder_encode_n(pe, &nt, L, ns, np_));
            te[B + b] = (ditd_text_embeds){.seq = ns, .pooled = np_};
            smp[b].cond.negative = &te[B + b];
        }
    }
    snprintf(what, sizeof what, "%s: prompt_embeds (%d, %d, %d)", name, B, T, Dt);
    TU_CLOSE(what, seq, emb, n_emb, TEXT_TOL);
    snprintf(what, sizeof what, "%s: pooled (%d, %d)", name, B, Dp);
    TU_CLOSE(what, pooled, pool, n_pool, TEXT_TOL);
    if (cfg) {
        snprintf(what, sizeof what, "%s: negative_prompt_embeds", name);
        TU_CLOSE(what, seq + (size_t)B * T * Dt, nemb, n_nemb, TEXT_TOL);
        snprintf(what, sizeof what, "%s: negative_pooled", name);
        TU_CLOSE(what, pooled + (size_t)B * Dp, npool, n_npool, TEXT_TOL);
    }

    TU_OK(ditd_pipeline_new(&info, &ditd_backend_cpu, B, &p));
    if (!p)
        goto out;
    TU_OK(ditd_pipeline_set_size(p, lh, lw, T));
    ditd_gen_params gp = {.steps = steps, .sampler = p->sched_base.kind};
    if (json_is_array(skip) && json_array_size(skip) > 0) {
        for (size_t i = 0; i < json_array_size(skip) && i < DITD_MAX_SKIP_LAYERS; i++)
            gp.skip_layers[gp.n_skip_layers++] = (int)json_integer_value(json_array_get(skip, i));
        gp.slg_scale = (float)jnum(c, "skip_layer_guidance_scale");
        gp.slg_start = (float)jnum(c, "skip_layer_guidance_start");
        gp.slg_stop = (float)jnum(c, "skip_layer_guidance_stop");
        *slg = 1;
    }
    out = malloc(n_fin * sizeof *out);
    if (!out)
        goto out;
    TU_OK(ditd_pipeline_generate(p, &gp, B, smp, noise, out, NULL, NULL, NULL));
    TU_CHECK(p->sampler && ditd_sampler_num_steps(p->sampler) == (int)n_ts, "%s: %zu timesteps",
             name, n_ts);
    if (p->sampler && ditd_sampler_num_steps(p->sampler) == (int)n_ts) {
        const float *t = ditd_sampler_timesteps(p->sampler);
        int same = 0;
        for (size_t i = 0; i < n_ts; i++)
            same += t[i] == ts[i];
        TU_CHECK(same == (int)n_ts, "%s: timesteps equal Diffusers' (%d of %zu; first %.9g vs %.9g)",
                 name, same, n_ts, (double)t[0], (double)ts[0]);
    }
    snprintf(what, sizeof what, "%s: final latents (%d, 16, %d, %d), %d steps%s", name, B, lh, lw,
             steps, gp.n_skip_layers ? ", skip-layer guidance" : "");
    TU_CLOSE(what, out, fin, n_fin, 1e-4);

    TU_OK(ditd_latent_image_new(&info, &ditd_backend_cpu, NULL, 0, &li));
    if (!li)
        goto out;
    TU_OK(ditd_latent_image_set_size(li, lh, lw));
    size_t pn = (size_t)li->Co * li->H * li->W;
    TU_CHECK(n_img == (size_t)B * pn, "%s: image %zu values, ditd %zu", name, n_img, (size_t)B * pn);
    if (n_img != (size_t)B * pn)
        goto out;
    pix = malloc(n_img);
    if (!pix)
        goto out;
    TU_OK(ditd_latent_image_run(li, out, B, NULL, pix));
    size_t off;
    int worst = tu_pixels_worst(pix, img, n_img, &off);
    TU_CHECK(worst <= 1, "%s: image %dx%d: worst %d levels (%zu of %zu values off by one)", name,
             li->W, li->H, worst, off, n_img);
    printf("ok   %s: image %dx%d x%d within %d level(s) (%zu of %zu off)\n", name, li->W, li->H, B,
           worst, off, n_img);
    done = 1;
out:
    ditd_latent_image_free(li);
    ditd_pipeline_free(p);
    ditd_prompt_encoder_free(pe);
    if (info.dir[0])
        ditd_model_info_free(&info);
    free(emb), free(pool), free(noise), free(fin), free(img), free(ts), free(nemb), free(npool);
    free(seq), free(pooled), free(out), free(pix);
    return done;
}

int main(void)
{
    char path[4096];
    json_error_t jerr;
    json_t *root, *cases, *c;
    size_t i;
    int checked = 0, slg = 0;

    ditd_backend_cpu.set_threads(1);
    snprintf(path, sizeof path, "%s/sd3_pipeline/expected/cases.json", tu_fixtures());
    root = json_load_file(path, 0, &jerr);
    TU_CHECK(root != NULL, "%s: %s", path, jerr.text);
    cases = json_object_get(root, "cases");
    json_array_foreach(cases, i, c) {
        int s = 0;
        if (run_case(c, &s)) {
            checked++;
            slg += s;
        }
    }
    TU_CHECK(checked >= MIN_CASES, "StableDiffusion3Pipeline cases checked to the end: %d (at least %d)",
             checked, MIN_CASES);
    TU_CHECK(slg >= MIN_SLG_CASES, "skip-layer guidance cases: %d (at least %d)", slg, MIN_SLG_CASES);
    json_decref(root);
    return tu_exit();
}
