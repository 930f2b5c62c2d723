/* FluxImg2ImgPipeline end to end against Diffusers run in float64 (the
 * fixtures of tools/make_flux_img2img_fixtures.py on the tiny FLUX.1 folders
 * of tests/fixtures/flux_pipeline, assembled in the build tree; the expected
 * arrays in tests/fixtures/flux_img2img/). Input images are at the target
 * size, so no resampling is involved. Diffusers' two random draws were made
 * ditd's (the posterior from DITD_LATENT_POSTERIOR_STREAM, the initial noise
 * from each image's stream), so every case runs from its seed alone.
 * For every case:
 *   - ditd_pipeline_strength_start gives Diffusers' t_start, and the kept
 *     timesteps equal Diffusers';
 *   - the image latents (VAE posterior draw, (z - shift) x scale) within 1e-4
 *     relative;
 *   - the final latents (strength 0.3 / 0.5 / 0.6 / 0.75 / 1.0, true CFG, a
 *     batch of two from one image, an image list of two with n = 2 and n = 4
 *     (output i from image i % 2, image j's posterior draw at offset j C h w),
 *     dev and schnell) within 1e-4 relative;
 *   - the decoded images within one 8-bit level.
 * One case runs on a folder whose model_index.json says FluxImg2ImgPipeline,
 * the others on the FluxPipeline folders (whose row names
 * FluxImg2ImgPipeline for edits). At least 8 cases are checked (2 of them
 * image lists), and the
 * refusals (strength out of range, an image without strength, another
 * sampler, a row without img2img) are checked too. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/backend/backend.h"
#include "engine/core/error.h"
#include "engine/io/npy.h"
#include "engine/models/model.h"
#include "engine/models/registry.h"
#include "engine/pipeline/edit_images.h"
#include "engine/pipeline/latent_image.h"
#include "engine/pipeline/pipeline.h"
#include "engine/pipeline/prompt_encoder.h"
#include "tests/flux_edit_case.h"
#include "tests/test_util.h"

#define MIN_CASES 8
#define MIN_LIST_CASES 2 /* of them with an image list (k = 2; n = 2 and n = 4) */
#define MAXB 4

static int n_list_cases;

static void *npy(const char *name, size_t *n, int u8)
{
    return edit_npy("flux_img2img", name, n, u8);
}

/* One case on folder dir; 1 when it was checked to the end. */
static int run_case(json_t *c, const char *dir, const char *want_class)
{
    char what[512];
    const char *name = jstr(c, "name"), *prompt = jstr(c, "prompt"), *neg = jstr(c, "negative_prompt");
    int B = jint(c, "batch"), L = jint(c, "max_sequence_length");
    json_t *kv = json_object_get(c, "n_images");
    const int K = kv ? (int)json_integer_value(kv) : 1; /* the image list's length */
    int lh = jint(c, "latent_height"), lw = jint(c, "latent_width");
    int H = jint(c, "height"), W = jint(c, "width"), steps = jint(c, "num_inference_steps");
    double strength = jnum(c, "strength");
    float g = (float)jnum(c, "guidance_scale"), tcfg = (float)jnum(c, "true_cfg_scale");
    uint64_t seed = (uint64_t)json_integer_value(json_object_get(c, "seed"));
    size_t n_img, n_il, n_ts, n_fin, n_out;
    uint8_t *img = npy(jstr(c, "image_u8"), &n_img, 1);
    float *want_px = npy(jstr(c, "out_u8"), &n_out, 0);
    float *il_ref = npy(jstr(c, "image_latents"), &n_il, 0), *ts = npy(jstr(c, "timesteps"), &n_ts, 0);
    float *fin = npy(jstr(c, "final_latents"), &n_fin, 0);
    ditd_model_info info;
    ditd_prompt_encoder *pe = NULL;
    ditd_pipeline *p = NULL;
    ditd_latent_image *li = NULL;
    float *seq = NULL, *pooled = NULL, *il = NULL, *out = NULL;
    uint8_t *pix = NULL;
    ditd_text_embeds te[2];
    ditd_gen_sample smp[MAXB];
    int done = 0;
    memset(&info, 0, sizeof info);
    memset(smp, 0, sizeof smp);

    if (!img || !want_px || !il_ref || !ts || !fin || B < 1 || B > MAXB || !prompt || K < 1 ||
        K > B)
        goto out;
    const size_t npx = (size_t)H * W * 3, nl = (size_t)16 * lh * lw;
    TU_CHECK(n_img == (size_t)K * npx && n_il == (size_t)K * nl && n_fin == (size_t)B * nl &&
                 n_out == (size_t)B * npx,
             "%s: fixture sizes", name);
    if (n_img != (size_t)K * npx || n_il != (size_t)K * nl || n_fin != (size_t)B * nl ||
        n_out != (size_t)B * npx)
        goto out;
    TU_OK(ditd_edit_images_check(B, K, 0));
    int t_start = -1;
    TU_OK(ditd_pipeline_strength_start(steps, strength, &t_start));
    TU_CHECK(t_start == jint(c, "t_start"), "%s: t_start %d, Diffusers' get_timesteps %d", name,
             t_start, jint(c, "t_start"));

    TU_OK(ditd_model_info_load(dir, &info));
    if (!info.pipeline)
        goto out;
    TU_CHECK(strcmp(info.pipeline->name, want_class) == 0 && info.pipeline->img2img &&
                 strcmp(info.pipeline->img2img->name, "FluxImg2ImgPipeline") == 0,
             "%s: %s folder's row %s, edits by %s", name, want_class, info.pipeline->name,
             info.pipeline->img2img ? info.pipeline->img2img->name : "(none)");

    /* prompt (and the negative one with true CFG) */
    int use_neg = tcfg > 1.0f && neg;
    if (edit_encode_prompts(&info, L, prompt, use_neg ? neg : NULL, &pe, &seq, &pooled, te))
        goto out;

    /* the image's latents: one encode per request, shared by its images */
    TU_OK(ditd_latent_image_new(&info, &ditd_backend_cpu, NULL, 0, &li));
    if (!li)
        goto out;
    TU_OK(ditd_latent_image_set_size(li, lh, lw));
    il = malloc(n_il * sizeof *il);
    if (!il)
        goto out;
    TU_CHECK(li->img2img && !li->encoder, "%s: the encoder is off until an image comes", name);
    /* image j of the list: its part of the request's one posterior draw */
    for (int j = 0; j < K; j++)
        TU_OK(ditd_latent_image_encode_nth(li, img + (size_t)j * npx, H, W, seed, j,
                                           il + (size_t)j * nl));
    TU_CHECK(li->encoder, "%s: the encoder is planned after the first encode", name);
    snprintf(what, sizeof what, "%s: image latents (%d, 16, %d, %d)", name, K, lh, lw);
    TU_CLOSE(what, il, il_ref, n_il, 1e-4);

    /* the loop from the seed */
    TU_OK(ditd_pipeline_new(&info, &ditd_backend_cpu, B, &p));
    if (!p)
        goto out;
    TU_OK(ditd_pipeline_set_size(p, lh, lw, L));
    for (int b = 0; b < B; b++) {
        smp[b] = (ditd_gen_sample){.seed = seed, .index = (uint64_t)b, .guidance = g,
                                   .true_cfg = tcfg,
                                   .image_latents = il + (size_t)ditd_edit_image_of(b, K) * nl};
        smp[b].cond.prompt = &te[0];
        if (use_neg)
            smp[b].cond.negative = &te[1];
    }
    ditd_gen_params gp = {.steps = steps, .sampler = p->sched_base.kind, .strength = strength};
    out = malloc(n_fin * sizeof *out);
    if (!out)
        goto out;
    TU_OK(ditd_pipeline_generate(p, &gp, B, smp, NULL, out, NULL, NULL, NULL));
    if (p->sampler && t_start >= 0 && ditd_sampler_num_steps(p->sampler) - t_start == (int)n_ts) {
        const float *t = ditd_sampler_timesteps(p->sampler) + t_start;
        int same = 0;
        for (size_t i = 0; i < n_ts; i++)
            same += t[i] == ts[i];
        TU_CHECK(same == (int)n_ts, "%s: kept timesteps equal Diffusers' (%d of %zu)", name, same,
                 n_ts);
    } else {
        TU_CHECK(0, "%s: %zu kept timesteps, ditd %d - %d", name, n_ts,
                 p->sampler ? ditd_sampler_num_steps(p->sampler) : -1, t_start);
    }
    snprintf(what, sizeof what, "%s: final latents (%d, 16, %d, %d), strength %g, %d of %d steps",
             name, B, lh, lw, strength, steps - t_start, steps);
    TU_CLOSE(what, out, fin, n_fin, 1e-4);

    /* the decoded images */
    pix = malloc(n_out);
    if (!pix)
        goto out;
    TU_OK(ditd_latent_image_run(li, out, B, NULL, pix));
    size_t off;
    int worst = tu_pixels_worst(pix, want_px, n_out, &off);
    TU_CHECK(worst <= 1, "%s: images %dx%d: worst %d levels (%zu of %zu off by one)", name, W, H,
             worst, off, n_out);
    printf("ok   %s (%s): images %dx%d x%d from %d input image(s) within %d level(s)\n", name,
           want_class, W, H, B, K, worst);
    n_list_cases += K > 1;
    done = 1;
out:
    ditd_latent_image_free(li);
    ditd_pipeline_free(p);
    ditd_prompt_encoder_free(pe);
    if (info.dir[0])
        ditd_model_info_free(&info);
    free(img), free(want_px), free(il_ref), free(ts), free(fin);
    free(seq), free(pooled), free(il), free(out), free(pix);
    return done;
}

/* What is refused, and how: 1 when every refusal was checked. */
static int refusals(void)
{
    char dir[4096];
    int t = 0, checks = 0;
    snprintf(dir, sizeof dir, "%s/schnell", FLUX_PIPELINE_DIR);
    TU_CHECK(ditd_pipeline_strength_start(4, 0.0, &t) == DITD_EINVAL, "strength 0 refused");
    TU_CHECK(ditd_pipeline_strength_start(4, 1.5, &t) == DITD_EINVAL, "strength 1.5 refused");
    TU_CHECK(ditd_pipeline_strength_start(4, NAN, &t) == DITD_EINVAL, "strength NaN refused");
    TU_CHECK(ditd_pipeline_strength_start(4, 1e-20, &t) == DITD_EINVAL &&
                 strstr(ditd_err_detail(), "leaves 0 of 4"),
             "strength 1e-20 of 4 steps leaves none: %s", ditd_err_detail());
    /* Python floats: 10 x 0.3 = 3 exactly, so 7 steps are skipped (float32's
     * 0.3 would skip 6) */
    TU_CHECK(ditd_pipeline_strength_start(10, 0.3, &t) == 0 && t == 7, "10 x 0.3: t_start %d", t);
    checks += 5;
    TU_CHECK(ditd_pipeline_dit.img2img == NULL && ditd_pipeline_flux.img2img == &ditd_pipeline_flux_img2img &&
                 ditd_pipeline_flux_img2img.img2img == &ditd_pipeline_flux_img2img &&
                 ditd_pipeline_flux_img2img.default_strength == 0.6,
             "the rows' img2img");
    const ditd_pipeline_class *pc = NULL;
    TU_OK(ditd_registry_find_pipeline("FluxImg2ImgPipeline", &pc));
    TU_CHECK(pc == &ditd_pipeline_flux_img2img, "the registry finds FluxImg2ImgPipeline");
    checks += 2;

    ditd_model_info info;
    memset(&info, 0, sizeof info);
    ditd_pipeline *p = NULL;
    TU_OK(ditd_model_info_load(dir, &info));
    TU_OK(ditd_pipeline_new(&info, &ditd_backend_cpu, 1, &p));
    if (p) {
        const int n = 16 * 8 * 8, L = 8, Dt = 6, Dp = 6;
        TU_OK(ditd_pipeline_set_size(p, 8, 8, L));
        float *lat = calloc((size_t)n, sizeof *lat), *o = calloc((size_t)n, sizeof *o);
        float *sq = calloc((size_t)L * Dt, sizeof *sq), *pv = calloc(Dp, sizeof *pv);
        for (int i = 0; i < n; i++)
            lat[i] = 0.01f * (float)(i % 17) - 0.05f;
        for (int i = 0; i < L * Dt; i++)
            sq[i] = 0.1f * (float)(i % 5);
        ditd_text_embeds te = {.seq = sq, .pooled = pv};
        ditd_gen_sample s = {.seed = 3, .image_latents = lat};
        s.cond.prompt = &te;
        ditd_gen_params gp = {.steps = 4, .sampler = p->sched_base.kind, .strength = 0.0};
        int err = ditd_pipeline_generate(p, &gp, 1, &s, NULL, o, NULL, NULL, NULL);
        TU_CHECK(err == DITD_EINVAL && strstr(ditd_err_detail(), "no strength"),
                 "an image without strength: %d %s", err, ditd_err_detail());
        s.image_latents = NULL;
        gp.strength = 0.5;
        err = ditd_pipeline_generate(p, &gp, 1, &s, NULL, o, NULL, NULL, NULL);
        TU_CHECK(err == DITD_EINVAL && strstr(ditd_err_detail(), "no input image"),
                 "strength without an image: %d %s", err, ditd_err_detail());
        s.image_latents = lat;
        gp.sampler = DITD_SAMPLER_DPMPP_2M;
        err = ditd_pipeline_generate(p, &gp, 1, &s, NULL, o, NULL, NULL, NULL);
        TU_CHECK(err == DITD_EUNSUPPORTED && strstr(ditd_err_detail(), "flow-euler"),
                 "img2img on dpmpp-2m: %d %s", err, ditd_err_detail());
        gp.sampler = p->sched_base.kind;
        TU_OK(ditd_pipeline_generate(p, &gp, 1, &s, NULL, o, NULL, NULL, NULL));
        checks += 4;
        free(lat), free(o), free(sq), free(pv);
    }
    ditd_pipeline_free(p);
    if (info.dir[0])
        ditd_model_info_free(&info);
    return checks == 11;
}

int main(void)
{
    char path[4096], i2i[4096];
    json_error_t jerr;
    json_t *root, *cases, *c;
    size_t i;
    int checked = 0, on_i2i = 0;

    ditd_backend_cpu.set_threads(1);
    snprintf(path, sizeof path, "%s/flux_img2img/expected/cases.json", tu_fixtures());
    root = json_load_file(path, 0, &jerr);
    TU_CHECK(root != NULL, "%s: %s", path, jerr.text);
    const char *ps = json_string_value(json_object_get(root, "posterior_stream"));
    TU_CHECK(ps && strtoull(ps, NULL, 16) == DITD_LATENT_POSTERIOR_STREAM,
             "the fixtures' posterior stream %s is ditd's", ps ? ps : "(none)");
    TU_CHECK(edit_folder_make(i2i, sizeof i2i, "flux-img2img", "FluxImg2ImgPipeline") ==
                 0, "a FluxImg2ImgPipeline folder in %s", i2i);
    cases = json_object_get(root, "cases");
    json_array_foreach(cases, i, c) {
        char dir[4096];
        const char *name = jstr(c, "name");
        int img2img_class = name && strstr(name, "batch2") != NULL;
        snprintf(dir, sizeof dir, "%s/%s", FLUX_PIPELINE_DIR, jstr(c, "folder"));
        int ok = run_case(c, img2img_class ? i2i : dir,
                          img2img_class ? "FluxImg2ImgPipeline" : "FluxPipeline");
        checked += ok;
        on_i2i += ok && img2img_class;
    }
    edit_folder_rm(i2i);
    TU_CHECK(checked >= MIN_CASES, "FluxImg2ImgPipeline cases checked to the end: %d (at least %d)",
             checked, MIN_CASES);
    TU_CHECK(on_i2i >= 1, "cases on a FluxImg2ImgPipeline folder: %d", on_i2i);
    TU_CHECK(n_list_cases >= MIN_LIST_CASES, "image-list cases checked: %d (at least %d)",
             n_list_cases, MIN_LIST_CASES);
    /* Diffusers' rule for an image list: n a multiple of the images */
    TU_CHECK(ditd_edit_images_check(3, 2, 0) == DITD_EINVAL && strstr(ditd_err_detail(), "n = 3") &&
                 strstr(ditd_err_detail(), "image"),
             "n 3 from 2 images refused naming n and image: %s", ditd_err_detail());
    TU_CHECK(ditd_edit_images_check(1, 2, 0) == DITD_EINVAL, "n 1 from 2 images refused");
    TU_CHECK(ditd_edit_images_check(4, 2, 3) == DITD_EINVAL && strstr(ditd_err_detail(), "mask"),
             "3 masks for 2 images refused naming mask");
    TU_CHECK(ditd_edit_images_check(4, 2, 1) == 0 && ditd_edit_images_check(4, 2, 2) == 0 &&
                 ditd_edit_image_of(3, 2) == 1 && ditd_edit_image_of(2, 2) == 0 &&
                 ditd_edit_mask_of(3, 1) == 0,
             "the image list's assignment: output i from image i %% k");
    TU_CHECK(ditd_edit_images_check(17, 17, 0) == DITD_EINVAL, "17 images refused");
    TU_CHECK(refusals(), "every refusal checked");
    json_decref(root);
    return tu_exit();
}
