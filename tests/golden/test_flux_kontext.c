/* FluxKontextPipeline end to end against Diffusers run in float64 (the
 * fixtures of tools/make_flux_kontext_fixtures.py on the tiny FLUX.1-dev
 * folder of tests/fixtures/flux_pipeline under a model_index.json naming
 * FluxKontextPipeline; the expected arrays in tests/fixtures/flux_kontext/).
 * The references are at the size the pipeline brings them to, so no
 * resampling is involved; Diffusers' one random draw (the initial noise) was
 * made ditd's, so every case runs from its seed alone. For every case:
 *   - the output size from the request's and max_area
 *     (ditd_pipeline_class_area_size) and the reference's size
 *     (ditd_pipeline_class_reference_size, _auto_resize on and off) equal
 *     Diffusers';
 *   - each reference's latents (the VAE's mode, (z - shift) x scale) within
 *     1e-4 relative;
 *   - the timesteps equal Diffusers' (mu from the noise tokens alone);
 *   - the final latents within 1e-4 relative, the decoded images within one
 *     8-bit level: a reference of the output's aspect ratio, one of another,
 *     one reference for two images, two references for two images (per-sample
 *     ref_latents), true CFG, a megapixel reference at a preferred resolution
 *     (_auto_resize), no reference (text-to-image at max_area).
 * At least 7 cases are checked; then the refusals (a reference on a row
 * without one, strength with a reference, a sample without its reference,
 * step caching, odd sizes). */
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

#define MIN_CASES 7
#define MAXB 2

static void *npy(const char *name, size_t *n, int u8)
{
    return edit_npy("flux_kontext", name, n, u8);
}

/* Reference k of case c at its full size (the stored pixels, each repeated
 * in an upscale x upscale block as np.kron): (H, W, 3), or NULL. */
static uint8_t *ref_pixels(json_t *r, int *H, int *W)
{
    size_t n;
    int up = jint(r, "upscale");
    *H = jint(r, "height");
    *W = jint(r, "width");
    uint8_t *small = npy(jstr(r, "u8"), &n, 1);
    if (!small || up < 1 || n != (size_t)(*H / up) * (*W / up) * 3) {
        free(small);
        return NULL;
    }
    uint8_t *big = malloc((size_t)*H * *W * 3);
    const int sw = *W / up;
    for (int y = 0; big && y < *H; y++)
        for (int x = 0; x < *W; x++)
            memcpy(big + ((size_t)y * *W + x) * 3, small + ((size_t)(y / up) * sw + x / up) * 3, 3);
    free(small);
    return big;
}

/* One case on folder dir; 1 when it was checked to the end. */
static int run_case(json_t *c, const char *dir)
{
    char what[512];
    const char *name = jstr(c, "name"), *prompt = jstr(c, "prompt"), *neg = jstr(c, "negative_prompt");
    int B = jint(c, "batch"), L = jint(c, "max_sequence_length");
    int lh = jint(c, "latent_height"), lw = jint(c, "latent_width");
    int H = jint(c, "height"), W = jint(c, "width"), steps = jint(c, "num_inference_steps");
    int rh_px = jint(c, "ref_height"), rw_px = jint(c, "ref_width");
    float g = (float)jnum(c, "guidance_scale"), tcfg = (float)jnum(c, "true_cfg_scale");
    uint64_t seed = (uint64_t)json_integer_value(json_object_get(c, "seed"));
    json_t *refs = json_object_get(c, "refs");
    const int K = (int)json_array_size(refs);
    size_t n_ts, n_fin, n_out, n_rl = 0;
    float *want_px = npy(jstr(c, "out_u8"), &n_out, 0);
    float *ts = npy(jstr(c, "timesteps"), &n_ts, 0), *fin = npy(jstr(c, "final_latents"), &n_fin, 0);
    float *rl_ref = K ? npy(jstr(c, "ref_latents"), &n_rl, 0) : NULL;
    ditd_model_info info;
    ditd_prompt_encoder *pe = NULL;
    ditd_pipeline *p = NULL;
    ditd_latent_image *li = NULL;
    float *seq = NULL, *pooled = NULL, *rl = NULL, *out = NULL;
    uint8_t *pix = NULL;
    ditd_text_embeds te[2];
    ditd_gen_sample smp[MAXB];
    int done = 0;
    memset(&info, 0, sizeof info);
    memset(smp, 0, sizeof smp);

    if (!want_px || !ts || !fin || (K && !rl_ref) || B < 1 || B > MAXB || K > B || !prompt)
        goto out;
    TU_CHECK(n_fin == (size_t)B * 16 * lh * lw && n_out == (size_t)B * H * W * 3,
             "%s: fixture sizes", name);
    if (n_fin != (size_t)B * 16 * lh * lw || n_out != (size_t)B * H * W * 3)
        goto out;

    TU_OK(ditd_model_info_load(dir, &info));
    if (!info.pipeline)
        goto out;
    const ditd_pipeline_class *pc = info.pipeline;
    TU_CHECK(pc == &ditd_pipeline_flux_kontext && pc->reference && pc->default_max_area == 1048576 &&
                 pc->auto_resize && !pc->img2img && !pc->inpaint,
             "%s: the folder's row is FluxKontextPipeline (%s)", name, pc->name);
    const int vs = info.vae_scale;
    /* the sizes, by ditd's rules */
    int ow = 0, oh = 0;
    TU_OK(ditd_pipeline_class_area_size((long)jint(c, "max_area"), jint(c, "request_width"),
                                        jint(c, "request_height"), 2 * vs, &ow, &oh));
    TU_CHECK(ow == W && oh == H, "%s: output %dx%d from %dx%d at max_area %d, Diffusers' %dx%d", name,
             ow, oh, jint(c, "request_width"), jint(c, "request_height"), jint(c, "max_area"), W, H);

    int use_neg = tcfg > 1.0f && neg;
    if (edit_encode_prompts(&info, L, prompt, use_neg ? neg : NULL, &pe, &seq, &pooled, te))
        goto out;

    TU_OK(ditd_latent_image_new(&info, &ditd_backend_cpu, NULL, 0, &li));
    if (!li)
        goto out;
    TU_OK(ditd_latent_image_set_size(li, lh, lw));
    const int rlh = rh_px / vs, rlw = rw_px / vs;
    const size_t per_ref = (size_t)16 * rlh * rlw;
    if (K) {
        TU_CHECK(n_rl == (size_t)K * per_ref, "%s: reference latents' size", name);
        if (n_rl != (size_t)K * per_ref || !(rl = malloc(n_rl * sizeof *rl)))
            goto out;
    }
    for (int k = 0; k < K; k++) {
        int rH, rW, sw = 0, sh = 0;
        uint8_t *px = ref_pixels(json_array_get(refs, (size_t)k), &rH, &rW);
        TU_CHECK(px != NULL, "%s: reference %d", name, k);
        if (!px)
            goto out;
        TU_OK(ditd_pipeline_class_reference_size(json_is_true(json_object_get(c, "auto_resize")), rW,
                                                 rH, vs, &sw, &sh));
        TU_CHECK(sw == rw_px && sh == rh_px, "%s: reference %dx%d brought to %dx%d, Diffusers' %dx%d",
                 name, rW, rH, sw, sh, rw_px, rh_px);
        int err = ditd_latent_image_encode_mode(li, px, rH, rW, rl + (size_t)k * per_ref);
        free(px);
        TU_OK(err);
        if (err)
            goto out;
    }
    if (K) {
        snprintf(what, sizeof what, "%s: reference latents (%d, 16, %d, %d)", name, K, rlh, rlw);
        TU_CLOSE(what, rl, rl_ref, n_rl, 1e-4);
    }

    TU_OK(ditd_pipeline_new(&info, &ditd_backend_cpu, B, &p));
    if (!p)
        goto out;
    TU_OK(ditd_pipeline_set_size(p, lh, lw, L));
    TU_OK(ditd_pipeline_set_reference(p, K ? rlh : 0, K ? rlw : 0));
    for (int b = 0; b < B; b++) {
        /* Diffusers' image list: image b % K (one image: every sample) */
        smp[b] = (ditd_gen_sample){.seed = seed, .index = (uint64_t)b, .guidance = g,
                                   .true_cfg = tcfg,
                                   .ref_latents = K ? rl + (size_t)(b % K) * per_ref : NULL};
        smp[b].cond.prompt = &te[0];
        if (use_neg)
            smp[b].cond.negative = &te[1];
    }
    ditd_gen_params gp = {.steps = steps, .sampler = p->sched_base.kind};
    out = malloc(n_fin * sizeof *out);
    if (!out)
        goto out;
    TU_OK(ditd_pipeline_generate(p, &gp, B, smp, NULL, out, NULL, NULL, NULL));
    if (p->sampler && ditd_sampler_num_steps(p->sampler) == (int)n_ts) {
        const float *t = ditd_sampler_timesteps(p->sampler);
        int same = 0;
        for (size_t i = 0; i < n_ts; i++)
            same += t[i] == ts[i];
        TU_CHECK(same == (int)n_ts, "%s: timesteps equal Diffusers' (%d of %zu)", name, same, n_ts);
    } else {
        TU_CHECK(0, "%s: %zu timesteps, ditd %d", name, n_ts,
                 p->sampler ? ditd_sampler_num_steps(p->sampler) : -1);
    }
    snprintf(what, sizeof what, "%s: final latents (%d, 16, %d, %d), %d reference(s) %dx%d", name,
             B, lh, lw, K, rw_px, rh_px);
    TU_CLOSE(what, out, fin, n_fin, 1e-4);

    pix = malloc(n_out);
    if (!pix)
        goto out;
    TU_OK(ditd_latent_image_run(li, out, B, NULL, pix));
    size_t off;
    int worst = tu_pixels_worst(pix, want_px, n_out, &off);
    TU_CHECK(worst <= 1, "%s: images %dx%d: worst %d levels (%zu of %zu off by one)", name, W, H,
             worst, off, n_out);
    printf("ok   %s: %dx%d x%d, %d reference(s) %dx%d, images within %d level(s)\n", name, W, H, B,
           K, rw_px, rh_px, worst);
    done = 1;
out:
    ditd_latent_image_free(li);
    ditd_pipeline_free(p);
    ditd_prompt_encoder_free(pe);
    if (info.dir[0])
        ditd_model_info_free(&info);
    free(want_px), free(ts), free(fin), free(rl_ref);
    free(seq), free(pooled), free(rl), free(out), free(pix);
    return done;
}

/* What is refused, and how: 1 when every refusal was checked. */
static int refusals(const char *kontext_dir)
{
    char dir[4096];
    int checks = 0, w = 0, h = 0, err;
    /* the size rules */
    TU_CHECK(ditd_pipeline_class_area_size(1048576, 1024, 1024, 16, &w, &h) == 0 && w == 1024 &&
                 h == 1024, "1024x1024 at 1024**2: %dx%d", w, h);
    TU_CHECK(ditd_pipeline_class_area_size(1048576, 512, 768, 16, &w, &h) == 0 && w == 832 &&
                 h == 1248, "512x768 at 1024**2: %dx%d (round(836.1), round(1254.1), down to 16)", w,
             h);
    TU_CHECK(ditd_pipeline_class_area_size(0, 64, 64, 16, &w, &h) == DITD_EINVAL,
             "max_area 0 refused");
    TU_CHECK(ditd_pipeline_class_area_size(16, 4096, 16, 16, &w, &h) == DITD_EINVAL &&
                 strstr(ditd_err_detail(), "leaves"), "a size that leaves nothing: %s",
             ditd_err_detail());
    TU_CHECK(ditd_pipeline_class_reference_size(1, 1000, 1000, 8, &w, &h) == 0 && w == 1024 &&
                 h == 1024, "a square reference to 1024x1024: %dx%d", w, h);
    TU_CHECK(ditd_pipeline_class_reference_size(1, 3000, 1000, 8, &w, &h) == 0 && w == 1568 &&
                 h == 672, "3:1 to 1568x672: %dx%d", w, h);
    TU_CHECK(ditd_pipeline_class_reference_size(0, 100, 60, 8, &w, &h) == 0 && w == 96 && h == 48,
             "100x60 without auto_resize: %dx%d (down to 8, then 16)", w, h);
    TU_CHECK(ditd_pipeline_class_reference_size(0, 12, 40, 8, &w, &h) == DITD_EINVAL,
             "a reference under 16 pixels a side refused: %s", ditd_err_detail());
    checks += 8;
    const ditd_pipeline_class *pc = NULL;
    TU_OK(ditd_registry_find_pipeline("FluxKontextPipeline", &pc));
    TU_CHECK(pc == &ditd_pipeline_flux_kontext && pc->default_steps == 28 &&
                 pc->default_guidance == 3.5f && !ditd_pipeline_flux.reference,
             "the registry finds FluxKontextPipeline; its defaults");
    checks++;

    /* a reference on FluxPipeline's row */
    ditd_model_info info;
    ditd_pipeline *p = NULL;
    memset(&info, 0, sizeof info);
    snprintf(dir, sizeof dir, "%s/dev", FLUX_PIPELINE_DIR);
    TU_OK(ditd_model_info_load(dir, &info));
    TU_OK(ditd_pipeline_new(&info, &ditd_backend_cpu, 1, &p));
    if (p) {
        err = ditd_pipeline_set_reference(p, 4, 4);
        TU_CHECK(err == DITD_EINVAL && strstr(ditd_err_detail(), "no reference"),
                 "a reference on FluxPipeline: %d %s", err, ditd_err_detail());
        checks++;
    }
    ditd_pipeline_free(p);
    p = NULL;
    ditd_model_info_free(&info);

    memset(&info, 0, sizeof info);
    TU_OK(ditd_model_info_load(kontext_dir, &info));
    TU_OK(ditd_pipeline_new(&info, &ditd_backend_cpu, 1, &p));
    if (p) {
        const int n = 16 * 8 * 8, nr = 16 * 4 * 6, L = 8, Dt = 6, Dp = 6;
        TU_OK(ditd_pipeline_set_size(p, 8, 8, L));
        err = ditd_pipeline_set_reference(p, 3, 4);
        TU_CHECK(err == DITD_EINVAL && strstr(ditd_err_detail(), "even"),
                 "an odd reference size: %d %s", err, ditd_err_detail());
        TU_OK(ditd_pipeline_set_reference(p, 4, 6));
        TU_CHECK(p->numel_ref == (size_t)nr && p->numel == (size_t)n &&
                     p->numel_in == (size_t)(n + nr) && p->shapes.tokens == 16,
                 "a reference's sizes: numel %zu, ref %zu, tokens %d (the noise tokens', for mu)",
                 p->numel, p->numel_ref, p->shapes.tokens);
        float *ref = calloc((size_t)nr, sizeof *ref), *o = calloc((size_t)n, sizeof *o);
        float *sq = calloc((size_t)L * Dt, sizeof *sq), *pv = calloc(Dp, sizeof *pv);
        for (int i = 0; i < nr; i++)
            ref[i] = 0.01f * (float)(i % 13) - 0.05f;
        ditd_text_embeds te = {.seq = sq, .pooled = pv};
        ditd_gen_sample s = {.seed = 3, .guidance = 3.5f};
        s.cond.prompt = &te;
        ditd_gen_params gp = {.steps = 2, .sampler = p->sched_base.kind};
        err = ditd_pipeline_generate(p, &gp, 1, &s, NULL, o, NULL, NULL, NULL);
        TU_CHECK(err == DITD_EINVAL && strstr(ditd_err_detail(), "no reference"),
                 "a sample without its reference: %d %s", err, ditd_err_detail());
        s.ref_latents = ref;
        gp.strength = 0.5;
        s.image_latents = ref;
        err = ditd_pipeline_generate(p, &gp, 1, &s, NULL, o, NULL, NULL, NULL);
        TU_CHECK(err == DITD_EINVAL && strstr(ditd_err_detail(), "strength"),
                 "strength with a reference: %d %s", err, ditd_err_detail());
        gp.strength = 0.0;
        s.image_latents = NULL;
        ditd_cache_config cc;
        ditd_cache_config_default(DITD_CACHE_FIRST_BLOCK, &cc);
        TU_OK(ditd_pipeline_set_cache(p, &cc));
        err = ditd_pipeline_generate(p, &gp, 1, &s, NULL, o, NULL, NULL, NULL);
        TU_CHECK(err == DITD_EUNSUPPORTED && strstr(ditd_err_detail(), "reference"),
                 "step caching with a reference: %d %s", err, ditd_err_detail());
        TU_OK(ditd_pipeline_set_cache(p, NULL));
        TU_OK(ditd_pipeline_generate(p, &gp, 1, &s, NULL, o, NULL, NULL, NULL));
        /* the reference moves the result: the model attends to it */
        float *o2 = calloc((size_t)n, sizeof *o2);
        for (int i = 0; i < nr; i++)
            ref[i] = -ref[i] + 0.3f;
        TU_OK(ditd_pipeline_generate(p, &gp, 1, &s, NULL, o2, NULL, NULL, NULL));
        double diff = 0;
        for (int i = 0; o2 && i < n; i++)
            diff += fabs((double)o[i] - (double)o2[i]);
        TU_CHECK(diff > 1e-3, "another reference, another result (sum |diff| %g)", diff);
        TU_OK(ditd_pipeline_set_reference(p, 0, 0));
        err = ditd_pipeline_generate(p, &gp, 1, &s, NULL, o, NULL, NULL, NULL);
        TU_CHECK(err == DITD_EINVAL && strstr(ditd_err_detail(), "no reference size"),
                 "reference latents without a reference size: %d %s", err, ditd_err_detail());
        s.ref_latents = NULL;
        TU_OK(ditd_pipeline_generate(p, &gp, 1, &s, NULL, o, NULL, NULL, NULL));
        checks += 8;
        free(ref), free(o), free(o2), free(sq), free(pv);
    }
    ditd_pipeline_free(p);
    if (info.dir[0])
        ditd_model_info_free(&info);
    return checks == 18;
}

int main(void)
{
    char path[4096], kdir[4096];
    json_error_t jerr;
    json_t *root, *cases, *c;
    size_t i;
    int checked = 0, with_two = 0, auto_on = 0;

    ditd_backend_cpu.set_threads(1);
    snprintf(path, sizeof path, "%s/flux_kontext/expected/cases.json", tu_fixtures());
    root = json_load_file(path, 0, &jerr);
    TU_CHECK(root != NULL, "%s: %s", path, jerr.text);
    TU_CHECK(edit_folder_make(kdir, sizeof kdir, "flux-kontext", "FluxKontextPipeline") == 0,
             "a FluxKontextPipeline folder in %s", kdir);
    cases = json_object_get(root, "cases");
    json_array_foreach(cases, i, c) {
        int ok = run_case(c, kdir);
        checked += ok;
        with_two += ok && json_array_size(json_object_get(c, "refs")) == 2;
        auto_on += ok && json_is_true(json_object_get(c, "auto_resize")) &&
                   json_array_size(json_object_get(c, "refs")) > 0;
    }
    TU_CHECK(checked >= MIN_CASES, "FluxKontextPipeline cases checked to the end: %d (at least %d)",
             checked, MIN_CASES);
    TU_CHECK(with_two >= 1 && auto_on >= 1, "a case with two references (%d), one with "
             "_auto_resize (%d)", with_two, auto_on);
    TU_CHECK(refusals(kdir), "every refusal checked");
    edit_folder_rm(kdir);
    json_decref(root);
    return tu_exit();
}
