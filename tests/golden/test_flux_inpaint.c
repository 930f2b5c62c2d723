/* FluxInpaintPipeline end to end against Diffusers run in float64 (the
 * fixtures of tools/make_flux_inpaint_fixtures.py on the tiny FLUX.1 folders
 * of tests/fixtures/flux_pipeline; the expected arrays in
 * tests/fixtures/flux_inpaint/). Images and masks are at the target size,
 * so no resampling is involved; Diffusers' random draws were made ditd's,
 * so every case runs from its seed alone. For every case:
 *   - the mask on the latent grid (ditd_latent_mask_from_gray: gray, binarize
 *     at 0.5, nearest) equals Diffusers' mask_processor + prepare_mask_latents
 *     exactly (masks with holes off the 8-pixel grid, stripes, levels 127 and
 *     128 at the threshold);
 *   - the image latents within 1e-4 relative;
 *   - the final latents (strength 0.3 / 0.6 / 0.75 / 1.0, true CFG, a batch
 *     of two, dev and schnell) within 1e-4 relative;
 *   - the decoded images within one 8-bit level.
 * The batch case runs on a folder whose model_index.json says
 * FluxInpaintPipeline, the others on FluxPipeline folders (whose row names
 * FluxInpaintPipeline for masked edits). One case's image (40x24) and mask
 * (75x45) are of other sizes than its output: resized by ditd_image_resize,
 * byte for byte the processors' PIL Lanczos. At least 6 cases are checked, and
 * the refusals too. */
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
#include "engine/pipeline/latent_image.h"
#include "engine/pipeline/pipeline.h"
#include "engine/pipeline/prompt_encoder.h"
#include "tests/flux_edit_case.h"
#include "tests/test_util.h"

#define MIN_CASES 6
static int resized; /* inputs (image, mask) of another size than the output */
#define MAXB 2

static void *npy(const char *name, size_t *n, int u8)
{
    return edit_npy("flux_inpaint", name, n, u8);
}

/* One case on folder dir; 1 when it was checked to the end. */
static int run_case(json_t *c, const char *dir, const char *want_class)
{
    char what[512];
    const char *name = jstr(c, "name"), *prompt = jstr(c, "prompt"), *neg = jstr(c, "negative_prompt");
    int B = jint(c, "batch"), L = jint(c, "max_sequence_length");
    int lh = jint(c, "latent_height"), lw = jint(c, "latent_width");
    int H = jint(c, "height"), W = jint(c, "width"), steps = jint(c, "num_inference_steps");
    double strength = jnum(c, "strength");
    float g = (float)jnum(c, "guidance_scale"), tcfg = (float)jnum(c, "true_cfg_scale");
    uint64_t seed = (uint64_t)json_integer_value(json_object_get(c, "seed"));
    size_t n_img, n_il, n_fin, n_out;
    uint8_t *img = npy(jstr(c, "image_u8"), &n_img, 1);
    size_t n_m8, n_ml;
    uint8_t *m8 = npy(jstr(c, "mask_u8"), &n_m8, 1);
    float *ml_ref = npy(jstr(c, "mask_latents"), &n_ml, 0), *ml = NULL;
    float *want_px = npy(jstr(c, "out_u8"), &n_out, 0);
    float *il_ref = npy(jstr(c, "image_latents"), &n_il, 0);
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

    if (!img || !m8 || !ml_ref || !want_px || !il_ref || !fin || B < 1 || B > MAXB || !prompt)
        goto out;
    /* an image and a mask of other sizes: PIL's Lanczos to H x W (the mask as
     * L, before its binarize), byte for byte the processors' */
    const int IH = json_object_get(c, "input_height") ? jint(c, "input_height") : H;
    const int IW = json_object_get(c, "input_width") ? jint(c, "input_width") : W;
    const int MH = json_object_get(c, "mask_height") ? jint(c, "mask_height") : H;
    const int MW = json_object_get(c, "mask_width") ? jint(c, "mask_width") : W;
    TU_CHECK(n_m8 == (size_t)MH * MW && n_ml == (size_t)lh * lw && n_img == (size_t)IH * IW * 3,
             "%s: mask fixture sizes", name);
    if (n_m8 != (size_t)MH * MW || n_ml != (size_t)lh * lw || n_img != (size_t)IH * IW * 3)
        goto out;
    if (MH != H || MW != W) {
        if (!(m8 = edit_resize_check("flux_inpaint", c, "mask_resized_u8", m8, MW, MH, 1, W, H)))
            goto out;
        resized++;
    }
    if (IH != H || IW != W) {
        if (!(img = edit_resize_check("flux_inpaint", c, "image_resized_u8", img, IW, IH, 3, W, H)))
            goto out;
        n_img = (size_t)H * W * 3;
        resized++;
    }
    /* the mask on the latent grid: exactly Diffusers' (0 or 1 everywhere) */
    ml = malloc(n_ml * sizeof *ml);
    if (!ml)
        goto out;
    TU_OK(ditd_latent_mask_from_gray(m8, H, W, lh, lw, ml));
    int same = 0, ones = 0;
    for (size_t i = 0; i < n_ml; i++) {
        same += ml[i] == ml_ref[i];
        ones += ml[i] == 1.0f;
    }
    TU_CHECK(same == (int)n_ml && ones == jint(c, "repainted") && ones > 0 && ones < (int)n_ml,
             "%s: mask on the latent grid %dx%d: %d of %zu equal Diffusers', %d repainted (%d)",
             name, lw, lh, same, n_ml, ones, jint(c, "repainted"));
    TU_CHECK(n_img == (size_t)H * W * 3 && n_il == (size_t)16 * lh * lw &&
                 n_fin == (size_t)B * 16 * lh * lw && n_out == (size_t)B * H * W * 3,
             "%s: fixture sizes", name);
    if (n_img != (size_t)H * W * 3 || n_il != (size_t)16 * lh * lw || n_fin != (size_t)B * n_il ||
        n_out != (size_t)B * n_img)
        goto out;
    int t_start = -1;
    TU_OK(ditd_pipeline_strength_start(steps, strength, &t_start));
    TU_CHECK(t_start == jint(c, "t_start"), "%s: t_start %d, Diffusers' get_timesteps %d", name,
             t_start, jint(c, "t_start"));

    TU_OK(ditd_model_info_load(dir, &info));
    if (!info.pipeline)
        goto out;
    TU_CHECK(strcmp(info.pipeline->name, want_class) == 0 && info.pipeline->inpaint &&
                 strcmp(info.pipeline->inpaint->name, "FluxInpaintPipeline") == 0,
             "%s: %s folder's row %s, masked edits by %s", name, want_class, info.pipeline->name,
             info.pipeline->inpaint ? info.pipeline->inpaint->name : "(none)");

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
    TU_OK(ditd_latent_image_encode(li, img, H, W, seed, il));
    TU_CHECK(li->encoder, "%s: the encoder is planned after the first encode", name);
    snprintf(what, sizeof what, "%s: image latents (1, 16, %d, %d)", name, lh, lw);
    TU_CLOSE(what, il, il_ref, n_il, 1e-4);

    /* the loop from the seed */
    TU_OK(ditd_pipeline_new(&info, &ditd_backend_cpu, B, &p));
    if (!p)
        goto out;
    TU_OK(ditd_pipeline_set_size(p, lh, lw, L));
    for (int b = 0; b < B; b++) {
        smp[b] = (ditd_gen_sample){.seed = seed, .index = (uint64_t)b, .guidance = g,
                                   .true_cfg = tcfg, .image_latents = il, .mask_latents = ml};
        smp[b].cond.prompt = &te[0];
        if (use_neg)
            smp[b].cond.negative = &te[1];
    }
    ditd_gen_params gp = {.steps = steps, .sampler = p->sched_base.kind, .strength = strength};
    out = malloc(n_fin * sizeof *out);
    if (!out)
        goto out;
    TU_OK(ditd_pipeline_generate(p, &gp, B, smp, NULL, out, NULL, NULL, NULL));
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
    printf("ok   %s (%s): images %dx%d x%d within %d level(s)\n", name, want_class, W, H, B, worst);
    done = 1;
out:
    ditd_latent_image_free(li);
    ditd_pipeline_free(p);
    ditd_prompt_encoder_free(pe);
    if (info.dir[0])
        ditd_model_info_free(&info);
    free(img), free(m8), free(ml_ref), free(ml), free(want_px), free(il_ref), free(fin);
    free(seq), free(pooled), free(il), free(out), free(pix);
    return done;
}

/* What is refused, and how: 1 when every refusal was checked. */
static int refusals(void)
{
    char dir[4096];
    int checks = 0;
    float m[4];
    const uint8_t gray[16] = {127, 0, 128, 0, 0, 0, 0, 0, 255, 0, 200, 0, 0, 0, 0, 0};
    TU_OK(ditd_latent_mask_from_gray(gray, 4, 4, 2, 2, m));
    TU_CHECK(m[0] == 0.0f && m[1] == 1.0f && m[2] == 1.0f && m[3] == 1.0f,
             "binarize at 0.5: 127 kept, 128 repainted (%g %g %g %g)", m[0], m[1], m[2], m[3]);
    TU_CHECK(ditd_latent_mask_from_gray(gray, 4, 4, 8, 2, m) == DITD_EINVAL,
             "a latent grid larger than the mask refused");
    checks += 2;
    TU_CHECK(ditd_pipeline_dit.inpaint == NULL && ditd_pipeline_flux.inpaint == &ditd_pipeline_flux_inpaint &&
                 ditd_pipeline_flux_img2img.inpaint == &ditd_pipeline_flux_inpaint &&
                 ditd_pipeline_flux_inpaint.img2img == &ditd_pipeline_flux_img2img &&
                 ditd_pipeline_flux_inpaint.default_strength == 0.6 &&
                 ditd_pipeline_flux_inpaint.default_steps == 28 &&
                 ditd_pipeline_flux_inpaint.default_guidance == 7.0f,
             "the rows' inpaint and FluxInpaintPipeline's defaults");
    const ditd_pipeline_class *pc = NULL;
    TU_OK(ditd_registry_find_pipeline("FluxInpaintPipeline", &pc));
    TU_CHECK(pc == &ditd_pipeline_flux_inpaint, "the registry finds FluxInpaintPipeline");
    checks += 2;

    snprintf(dir, sizeof dir, "%s/schnell", FLUX_PIPELINE_DIR);
    ditd_model_info info;
    memset(&info, 0, sizeof info);
    ditd_pipeline *p = NULL;
    TU_OK(ditd_model_info_load(dir, &info));
    TU_OK(ditd_pipeline_new(&info, &ditd_backend_cpu, 1, &p));
    if (p) {
        const int n = 16 * 8 * 8, L = 8, Dt = 6, Dp = 6;
        TU_OK(ditd_pipeline_set_size(p, 8, 8, L));
        float *lat = calloc((size_t)n, sizeof *lat), *o = calloc((size_t)n, sizeof *o);
        float *mk = calloc(64, sizeof *mk);
        float *sq = calloc((size_t)L * Dt, sizeof *sq), *pv = calloc(Dp, sizeof *pv);
        for (int i = 0; i < n; i++)
            lat[i] = 0.01f * (float)(i % 17) - 0.05f;
        for (int i = 0; i < 64; i++)
            mk[i] = (float)(i % 3 == 0);
        ditd_text_embeds te = {.seq = sq, .pooled = pv};
        ditd_gen_sample s = {.seed = 3, .mask_latents = mk};
        s.cond.prompt = &te;
        ditd_gen_params gp = {.steps = 4, .sampler = p->sched_base.kind, .strength = 0.0};
        int err = ditd_pipeline_generate(p, &gp, 1, &s, NULL, o, NULL, NULL, NULL);
        TU_CHECK(err == DITD_EINVAL && strstr(ditd_err_detail(), "no strength"),
                 "a mask without strength: %d %s", err, ditd_err_detail());
        gp.strength = 0.5;
        err = ditd_pipeline_generate(p, &gp, 1, &s, NULL, o, NULL, NULL, NULL);
        TU_CHECK(err == DITD_EINVAL && strstr(ditd_err_detail(), "no input image"),
                 "a mask without an image: %d %s", err, ditd_err_detail());
        /* the kept cells end as the image's latents exactly (the last blend) */
        s.image_latents = lat;
        TU_OK(ditd_pipeline_generate(p, &gp, 1, &s, NULL, o, NULL, NULL, NULL));
        int kept = 0, eq = 0;
        for (int c = 0; c < 16; c++)
            for (int j = 0; j < 64; j++)
                if (mk[j] == 0.0f) {
                    kept++;
                    eq += o[c * 64 + j] == lat[c * 64 + j];
                }
        TU_CHECK(kept > 0 && eq == kept, "kept latents are the image's: %d of %d", eq, kept);
        checks += 3;
        free(lat), free(o), free(mk), free(sq), free(pv);
    }
    ditd_pipeline_free(p);
    if (info.dir[0])
        ditd_model_info_free(&info);
    return checks == 7;
}

int main(void)
{
    char path[4096], i2i[4096];
    json_error_t jerr;
    json_t *root, *cases, *c;
    size_t i;
    int checked = 0, on_i2i = 0;

    ditd_backend_cpu.set_threads(1);
    snprintf(path, sizeof path, "%s/flux_inpaint/expected/cases.json", tu_fixtures());
    root = json_load_file(path, 0, &jerr);
    TU_CHECK(root != NULL, "%s: %s", path, jerr.text);
    const char *ps = json_string_value(json_object_get(root, "posterior_stream"));
    TU_CHECK(ps && strtoull(ps, NULL, 16) == DITD_LATENT_POSTERIOR_STREAM,
             "the fixtures' posterior stream %s is ditd's", ps ? ps : "(none)");
    TU_CHECK(edit_folder_make(i2i, sizeof i2i, "flux-inpaint", "FluxInpaintPipeline") == 0,
             "a FluxInpaintPipeline folder in %s", i2i);
    cases = json_object_get(root, "cases");
    json_array_foreach(cases, i, c) {
        char dir[4096];
        const char *name = jstr(c, "name");
        int img2img_class = name && strstr(name, "batch2") != NULL;
        snprintf(dir, sizeof dir, "%s/%s", FLUX_PIPELINE_DIR, jstr(c, "folder"));
        int ok = run_case(c, img2img_class ? i2i : dir,
                          img2img_class ? "FluxInpaintPipeline" : "FluxPipeline");
        checked += ok;
        on_i2i += ok && img2img_class;
    }
    edit_folder_rm(i2i);
    TU_CHECK(checked >= MIN_CASES, "FluxInpaintPipeline cases checked to the end: %d (at least %d)",
             checked, MIN_CASES);
    TU_CHECK(resized >= 2, "inputs of another size resized: %d (an image and a mask)", resized);
    TU_CHECK(on_i2i >= 1, "cases on a FluxInpaintPipeline folder: %d", on_i2i);
    TU_CHECK(refusals(), "every refusal checked");
    json_decref(root);
    return tu_exit();
}
