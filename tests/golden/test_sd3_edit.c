/* StableDiffusion3Img2ImgPipeline and StableDiffusion3InpaintPipeline end to
 * end against Diffusers run in float64 (the fixtures of
 * tools/make_sd3_img2img_fixtures.py on the tiny SD3 folders of
 * tests/fixtures/sd3_pipeline, assembled in the build tree; the expected
 * arrays in tests/fixtures/sd3_img2img/). Images and masks are at the target
 * size, so no resampling is involved; Diffusers' random draws were made
 * ditd's (the posterior from DITD_LATENT_POSTERIOR_STREAM, the noise from
 * each image's stream), so every case runs from its seed alone. For every
 * case:
 *   - the folder's row names the SD3 edit rows, and the row the case follows
 *     (ditd_pipeline_class_edit_row) is the Diffusers class that made it;
 *   - ditd_pipeline_strength_start gives get_timesteps' t_start, and the
 *     kept timesteps (shift 3, or mu from the image tokens) equal Diffusers';
 *   - the mask on the latent grid equals Diffusers' exactly (inpainting);
 *   - the image latents within 1e-4 relative;
 *   - the final latents (strength 0.3 / 0.5 / 0.6 / 0.75 / 1.0, CFG over a
 *     negative prompt or "", none at guidance 1, prompt_3, a batch of two
 *     from one image, SD3, SD3.5, no T5, dynamic shifting) within 1e-4
 *     relative;
 *   - the decoded images, by the edit row's unscale, within one 8-bit level
 *     (and the inpainting images farther than that under the other rule, so
 *     the rule is what the test checks).
 * Two cases run on folders whose model_index.json names the edit class. At
 * least 11 cases are checked (6 img2img, 5 inpainting), and the refusals. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/backend/backend.h"
#include "engine/core/error.h"
#include "engine/models/model.h"
#include "engine/models/registry.h"
#include "engine/pipeline/latent_image.h"
#include "engine/pipeline/pipeline.h"
#include "engine/pipeline/prompt_encoder.h"
#include "tests/sd3_edit_case.h"
#include "tests/test_util.h"

#define MIN_IMG2IMG 6
#define MIN_INPAINT 5
#define MAXB 2

static ditd_prompt_texts texts(const char *a, const char *b, const char *c)
{
    ditd_prompt_texts t = {.texts = {a ? a : "", b, c}};
    for (int k = 0; k < 3; k++)
        t.lens[k] = t.texts[k] ? strlen(t.texts[k]) : 0;
    return t;
}

static int rule_off_more; /* inpainting cases whose images the shifted rule puts > 1 level off */

/* One case on folder dir; 1 when it was checked to the end. */
static int run_case(json_t *c, const char *dir, int *inpaint)
{
    char what[512];
    const char *name = sd3e_str(c, "name"), *prompt = sd3e_str(c, "prompt");
    const char *neg = sd3e_str(c, "negative_prompt"), *want_row = sd3e_str(c, "pipeline");
    int B = sd3e_int(c, "batch"), L = sd3e_int(c, "max_sequence_length");
    int lh = sd3e_int(c, "latent_height"), lw = sd3e_int(c, "latent_width");
    int H = sd3e_int(c, "height"), W = sd3e_int(c, "width"), steps = sd3e_int(c, "num_inference_steps");
    int cfg = json_is_true(json_object_get(c, "cfg_used"));
    double strength = sd3e_num(c, "strength");
    float g = (float)sd3e_num(c, "guidance_scale");
    uint64_t seed = (uint64_t)json_integer_value(json_object_get(c, "seed"));
    int masked = sd3e_str(c, "mask") != NULL;
    size_t n_img, n_il, n_ts, n_fin, n_out, n_m8 = 0, n_ml = 0;
    uint8_t *img = sd3e_npy(sd3e_str(c, "image_u8"), &n_img, 1);
    float *want_px = sd3e_npy(sd3e_str(c, "out_u8"), &n_out, 0);
    float *il_ref = sd3e_npy(sd3e_str(c, "image_latents"), &n_il, 0);
    float *ts = sd3e_npy(sd3e_str(c, "timesteps"), &n_ts, 0);
    float *fin = sd3e_npy(sd3e_str(c, "final_latents"), &n_fin, 0);
    uint8_t *m8 = masked ? sd3e_npy(sd3e_str(c, "mask_u8"), &n_m8, 1) : NULL;
    float *ml_ref = masked ? sd3e_npy(sd3e_str(c, "mask_latents"), &n_ml, 0) : NULL, *ml = NULL;
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
    *inpaint = masked;

    if (!img || !want_px || !il_ref || !ts || !fin || B < 1 || B > MAXB || !prompt || !want_row ||
        (masked && (!m8 || !ml_ref)))
        goto out;
    TU_CHECK(n_img == (size_t)H * W * 3 && n_il == (size_t)16 * lh * lw &&
                 n_fin == (size_t)B * 16 * lh * lw && n_out == (size_t)B * H * W * 3 &&
                 (!masked || (n_m8 == (size_t)H * W && n_ml == (size_t)lh * lw)),
             "%s: fixture sizes", name);
    if (n_img != (size_t)H * W * 3 || n_il != (size_t)16 * lh * lw || n_fin != (size_t)B * n_il ||
        n_out != (size_t)B * n_img || (masked && (n_m8 != (size_t)H * W || n_ml != (size_t)lh * lw)))
        goto out;
    if (masked) { /* the mask on the latent grid: exactly Diffusers' */
        if (!(ml = malloc(n_ml * sizeof *ml)))
            goto out;
        TU_OK(ditd_latent_mask_from_gray(m8, H, W, lh, lw, ml));
        int same = 0, ones = 0;
        for (size_t i = 0; i < n_ml; i++) {
            same += ml[i] == ml_ref[i];
            ones += ml[i] == 1.0f;
        }
        TU_CHECK(same == (int)n_ml && ones == sd3e_int(c, "repainted") && ones > 0 &&
                     ones < (int)n_ml,
                 "%s: mask on the latent grid %dx%d: %d of %zu equal Diffusers', %d repainted",
                 name, lw, lh, same, n_ml, ones);
    }
    int t_start = -1;
    TU_OK(ditd_pipeline_strength_start(steps, strength, &t_start));
    TU_CHECK(t_start == sd3e_int(c, "t_start"), "%s: t_start %d, Diffusers' get_timesteps %d", name,
             t_start, sd3e_int(c, "t_start"));

    TU_OK(ditd_model_info_load(dir, &info));
    if (!info.pipeline)
        goto out;
    const ditd_pipeline_class *er = ditd_pipeline_class_edit_row(info.pipeline, 1, masked);
    TU_CHECK(info.pipeline->img2img == &ditd_pipeline_sd3_img2img &&
                 info.pipeline->inpaint == &ditd_pipeline_sd3_inpaint && er &&
                 !strcmp(er->name, want_row),
             "%s: %s folder: the edit follows %s (Diffusers: %s)", name, info.pipeline->name,
             er ? er->name : "(none)", want_row);
    if (!er)
        goto out;

    /* the prompt (prompt_3 to T5) and, under CFG, the negative one ("" when none) */
    const int T = ditd_pipeline_class_text_len(info.pipeline, L);
    ditd_prompt_encoder_opts o = {.max_sequence_length = L};
    TU_OK(ditd_prompt_encoder_new(&info, &ditd_backend_cpu, &o, &pe));
    if (!pe)
        goto out;
    const int Dt = ditd_prompt_encoder_text_dim(pe), Dp = ditd_prompt_encoder_pooled_dim(pe);
    seq = malloc(2 * (size_t)T * Dt * sizeof *seq);
    pooled = malloc(2 * (size_t)Dp * sizeof *pooled);
    if (!seq || !pooled)
        goto out;
    ditd_prompt_texts pt = texts(prompt, sd3e_str(c, "prompt_2"), sd3e_str(c, "prompt_3"));
    TU_OK(ditd_prompt_encoder_encode_n(pe, &pt, L, seq, pooled));
    te[0] = (ditd_text_embeds){.seq = seq, .pooled = pooled};
    TU_CHECK(ditd_pipeline_class_needs_negative(er, g, 1.0f, neg != NULL, 0) == cfg,
             "%s: the row's rule says the negative pass %s", name, cfg ? "runs" : "does not run");
    if (cfg) {
        ditd_prompt_texts nt = texts(neg, NULL, NULL);
        TU_OK(ditd_prompt_encoder_encode_n(pe, &nt, L, seq + (size_t)T * Dt, pooled + Dp));
        te[1] = (ditd_text_embeds){.seq = seq + (size_t)T * Dt, .pooled = pooled + Dp};
    }

    /* the image's latents: one encode per request, shared by its images */
    TU_OK(ditd_latent_image_new(&info, &ditd_backend_cpu, NULL, 0, &li));
    if (!li)
        goto out;
    TU_OK(ditd_latent_image_set_size(li, lh, lw));
    if (!(il = malloc(n_il * sizeof *il)))
        goto out;
    TU_OK(ditd_latent_image_encode(li, img, H, W, seed, il));
    snprintf(what, sizeof what, "%s: image latents (1, 16, %d, %d)", name, lh, lw);
    TU_CLOSE(what, il, il_ref, n_il, 1e-4);

    /* the loop from the seed */
    TU_OK(ditd_pipeline_new(&info, &ditd_backend_cpu, B, &p));
    if (!p)
        goto out;
    TU_OK(ditd_pipeline_set_size(p, lh, lw, T));
    for (int b = 0; b < B; b++) {
        smp[b] = (ditd_gen_sample){.seed = seed, .index = (uint64_t)b, .guidance = g,
                                   .true_cfg = 1.0f, .image_latents = il, .mask_latents = ml};
        smp[b].cond.prompt = &te[0];
        if (cfg)
            smp[b].cond.negative = &te[1];
    }
    ditd_gen_params gp = {.steps = steps, .sampler = p->sched_base.kind, .strength = strength};
    if (!(out = malloc(n_fin * sizeof *out)))
        goto out;
    TU_OK(ditd_pipeline_generate(p, &gp, B, smp, NULL, out, NULL, NULL, NULL));
    if (p->sampler && ditd_sampler_num_steps(p->sampler) - t_start == (int)n_ts) {
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

    /* the decoded images, by the edit row's unscale */
    if (!(pix = malloc(n_out)))
        goto out;
    TU_OK(ditd_latent_image_run_as(li, er->unscale, out, B, NULL, pix));
    size_t off;
    int worst = tu_pixels_worst(pix, want_px, n_out, &off);
    TU_CHECK(worst <= 1, "%s: images %dx%d (%s decode): worst %d levels (%zu of %zu off by one)",
             name, W, H, ditd_latent_rule_name(er->unscale), worst, off, n_out);
    if (masked) { /* the other rule (shift_factor added) is visibly another image */
        TU_OK(ditd_latent_image_run_as(li, DITD_LATENT_RULE_SHIFTED, out, B, NULL, pix));
        int other = tu_pixels_worst(pix, want_px, n_out, &off);
        rule_off_more += other > 1;
        printf("     %s: the shifted decode would be %d levels off\n", name, other);
    }
    printf("ok   %s (%s on %s): images %dx%d x%d within %d level(s)\n", name, er->name,
           info.pipeline->name, W, H, B, worst);
    done = 1;
out:
    ditd_latent_image_free(li);
    ditd_pipeline_free(p);
    ditd_prompt_encoder_free(pe);
    if (info.dir[0])
        ditd_model_info_free(&info);
    free(img), free(want_px), free(il_ref), free(ts), free(fin), free(m8), free(ml_ref), free(ml);
    free(seq), free(pooled), free(il), free(out), free(pix);
    return done;
}

/* A copy of the sd3 folder whose transformer says in_channels 33 (an
 * inpainting transformer that takes the mask and the masked image's
 * latents): refused at the VAE naming the channels. 1 when checked. */
static int refuse_33_channels(void)
{
    char dir[4096], src[4096], p[4200], q[4200];
    snprintf(src, sizeof src, "%s/sd3", SD3_PIPELINE_DIR);
    if (sd3e_folder_make(dir, sizeof dir, "sd3-33ch", src, NULL, NULL))
        return 0;
    /* transformer/: its own folder, the weights linked, the config rewritten */
    snprintf(p, sizeof p, "%s/transformer", dir);
    unlink(p);
    int ok = mkdir(p, 0755) == 0;
    snprintf(q, sizeof q, "%s/sd3/transformer/diffusion_pytorch_model.safetensors",
             SD3_PIPELINE_DIR);
    snprintf(p, sizeof p, "%s/transformer/diffusion_pytorch_model.safetensors", dir);
    ok = ok && symlink(q, p) == 0;
    snprintf(q, sizeof q, "%s/sd3/transformer/config.json", SD3_PIPELINE_DIR);
    json_error_t je;
    json_t *tc = json_load_file(q, 0, &je);
    ok = ok && tc;
    if (tc) {
        json_object_set_new(tc, "in_channels", json_integer(33));
        json_object_set_new(tc, "out_channels", json_integer(16));
        snprintf(p, sizeof p, "%s/transformer/config.json", dir);
        ok = ok && json_dump_file(tc, p, JSON_INDENT(2)) == 0;
        json_decref(tc);
    }
    int checked = 0;
    ditd_model_info info;
    memset(&info, 0, sizeof info);
    if (ok) {
        int err = ditd_model_info_load(dir, &info);
        ditd_latent_image *li = NULL;
        if (!err)
            err = ditd_latent_image_new(&info, &ditd_backend_cpu, NULL, 0, &li);
        TU_CHECK(err != 0 && strstr(ditd_err_detail(), "33"),
                 "a 33-channel SD3 transformer refused naming its channels: %d %s", err,
                 ditd_err_detail());
        checked = err != 0;
        ditd_latent_image_free(li);
        if (info.dir[0])
            ditd_model_info_free(&info);
    }
    snprintf(p, sizeof p, "%s/transformer/config.json", dir);
    unlink(p);
    snprintf(p, sizeof p, "%s/transformer/diffusion_pytorch_model.safetensors", dir);
    unlink(p);
    snprintf(p, sizeof p, "%s/transformer", dir);
    rmdir(p);
    sd3e_folder_rm(dir);
    return checked;
}

/* What is refused, and the rows' fields: 1 when every check ran. */
static int refusals(void)
{
    char dir[4096];
    int checks = 0;
    const ditd_pipeline_class *s = &ditd_pipeline_sd3, *i2i = &ditd_pipeline_sd3_img2img,
                              *inp = &ditd_pipeline_sd3_inpaint;
    TU_CHECK(s->img2img == i2i && s->inpaint == inp && i2i->img2img == i2i && i2i->inpaint == inp &&
                 inp->img2img == i2i && inp->inpaint == inp,
             "the SD3 rows name the SD3 edit rows");
    TU_CHECK(i2i->default_strength == 0.6 && i2i->default_steps == 50 &&
                 i2i->default_guidance == 7.0f && inp->default_strength == 1.0 &&
                 inp->default_steps == 50 && inp->default_guidance == 7.0f &&
                 s->default_steps == 28,
             "__call__'s defaults: img2img strength 0.6, inpaint 1.0, both 50 steps, 7.0");
    TU_CHECK(i2i->unscale == DITD_LATENT_RULE_SHIFTED && inp->unscale == DITD_LATENT_RULE_DIT &&
                 s->unscale == DITD_LATENT_RULE_SHIFTED,
             "the decodes: img2img shifted, inpaint latents / scaling_factor (Diffusers 0.42.1)");
    TU_CHECK((s->request & DITD_REQ_SKIP_LAYERS) && !(i2i->request & DITD_REQ_SKIP_LAYERS) &&
                 !(inp->request & DITD_REQ_SKIP_LAYERS) && i2i->slg_scale == 0.0f,
             "skip-layer guidance: the text-to-image row only");
    TU_CHECK(i2i->n_parts == s->n_parts && inp->n_parts == s->n_parts &&
                 !memcmp(i2i->parts, s->parts, sizeof s->parts) &&
                 !memcmp(inp->parts, s->parts, sizeof s->parts) && i2i->guidance == s->guidance &&
                 inp->guidance == s->guidance && i2i->pipeline_sigmas == s->pipeline_sigmas &&
                 i2i->max_sequence_length == s->max_sequence_length &&
                 i2i->default_max_sequence_length == 256 &&
                 !strcmp(i2i->transformers[0], "SD3Transformer2DModel"),
             "the edit rows share the text-to-image row's recipe, guidance and scheduler rules");
    TU_CHECK(ditd_pipeline_class_edit_row(s, 0, 0) == s && ditd_pipeline_class_edit_row(s, 1, 0) == i2i &&
                 ditd_pipeline_class_edit_row(s, 1, 1) == inp &&
                 ditd_pipeline_class_edit_row(s, 0, 1) == NULL &&
                 ditd_pipeline_class_edit_row(&ditd_pipeline_dit, 1, 0) == NULL,
             "ditd_pipeline_class_edit_row");
    checks += 6;
    const ditd_pipeline_class *pc = NULL;
    TU_OK(ditd_registry_find_pipeline("StableDiffusion3Img2ImgPipeline", &pc));
    TU_CHECK(pc == i2i, "the registry finds StableDiffusion3Img2ImgPipeline");
    pc = NULL;
    TU_OK(ditd_registry_find_pipeline("StableDiffusion3InpaintPipeline", &pc));
    TU_CHECK(pc == inp, "the registry finds StableDiffusion3InpaintPipeline");
    checks += 2;

    /* on the sd3 folder: skip-layer guidance refused on an edit, kept on
     * text-to-image; a decode rule that is not an image's refused */
    snprintf(dir, sizeof dir, "%s/sd3", SD3_PIPELINE_DIR);
    ditd_model_info info;
    memset(&info, 0, sizeof info);
    ditd_pipeline *p = NULL;
    ditd_latent_image *li = NULL;
    TU_OK(ditd_model_info_load(dir, &info));
    TU_OK(ditd_pipeline_new(&info, &ditd_backend_cpu, 1, &p));
    TU_OK(ditd_latent_image_new(&info, &ditd_backend_cpu, NULL, 0, &li));
    if (p && li) {
        const int lh = 4, lw = 4, n = 16 * lh * lw, T = ditd_pipeline_class_text_len(info.pipeline, 8);
        TU_OK(ditd_pipeline_set_size(p, lh, lw, T));
        TU_OK(ditd_latent_image_set_size(li, lh, lw));
        const int Dt = 16, Dp = 10;
        float *lat = calloc((size_t)n, sizeof *lat), *o = calloc((size_t)n, sizeof *o);
        float *mk = calloc((size_t)lh * lw, sizeof *mk);
        float *sq = calloc((size_t)T * Dt, sizeof *sq), *pv = calloc(Dp, sizeof *pv);
        uint8_t px[32 * 32 * 3];
        for (int i = 0; lat && i < n; i++)
            lat[i] = 0.01f * (float)(i % 17) - 0.05f;
        for (int i = 0; mk && i < lh * lw; i++)
            mk[i] = (float)(i % 3 == 0);
        if (lat && o && mk && sq && pv) {
            ditd_text_embeds te = {.seq = sq, .pooled = pv};
            ditd_gen_sample smp = {.seed = 3, .image_latents = lat, .guidance = 1.0f, .true_cfg = 1.0f};
            smp.cond.prompt = &te;
            ditd_gen_params gp = {.steps = 4, .sampler = p->sched_base.kind, .strength = 0.5,
                                  .n_skip_layers = 1, .skip_layers = {0}, .slg_scale = 2.8f,
                                  .slg_start = 0.01f, .slg_stop = 0.9f};
            int err = ditd_pipeline_generate(p, &gp, 1, &smp, NULL, o, NULL, NULL, NULL);
            TU_CHECK(err == DITD_EINVAL && strstr(ditd_err_detail(), "skip_guidance_layers") &&
                         strstr(ditd_err_detail(), "StableDiffusion3Img2ImgPipeline"),
                     "skip-layer guidance on an img2img edit: %d %s", err, ditd_err_detail());
            smp.mask_latents = mk;
            err = ditd_pipeline_generate(p, &gp, 1, &smp, NULL, o, NULL, NULL, NULL);
            TU_CHECK(err == DITD_EINVAL && strstr(ditd_err_detail(), "StableDiffusion3InpaintPipeline"),
                     "skip-layer guidance on a masked edit: %d %s", err, ditd_err_detail());
            smp.image_latents = smp.mask_latents = NULL;
            gp.strength = 0.0;
            TU_OK(ditd_pipeline_generate(p, &gp, 1, &smp, NULL, o, NULL, NULL, NULL));
            err = ditd_latent_image_run_as(li, DITD_LATENT_RULE_MEAN_STD, o, 1, NULL, px);
            TU_CHECK(err == DITD_EUNSUPPORTED, "a decode under mean_std refused: %d %s", err,
                     ditd_err_detail());
            checks += 4;
        }
        free(lat), free(o), free(mk), free(sq), free(pv);
    }
    ditd_latent_image_free(li);
    ditd_pipeline_free(p);
    if (info.dir[0])
        ditd_model_info_free(&info);
    checks += refuse_33_channels();
    return checks == 13;
}

int main(void)
{
    char path[4096];
    json_error_t jerr;
    json_t *root, *cases, *c;
    size_t i;
    int n_i2i = 0, n_inp = 0, on_class = 0, dyn = 0;

    ditd_backend_cpu.set_threads(1);
    snprintf(path, sizeof path, "%s/" SD3_EDIT_SET "/expected/cases.json", tu_fixtures());
    root = json_load_file(path, 0, &jerr);
    TU_CHECK(root != NULL, "%s: %s", path, jerr.text);
    const char *ps = json_string_value(json_object_get(root, "posterior_stream"));
    TU_CHECK(ps && strtoull(ps, NULL, 16) == DITD_LATENT_POSTERIOR_STREAM,
             "the fixtures' posterior stream %s is ditd's", ps ? ps : "(none)");
    cases = json_object_get(root, "cases");
    json_array_foreach(cases, i, c) {
        char dir[4096];
        int tmp = 0, masked = 0;
        if (sd3e_case_folder(root, c, SD3_PIPELINE_DIR, dir, sizeof dir, &tmp)) {
            TU_CHECK(0, "%s: a folder for the case", sd3e_str(c, "name"));
            continue;
        }
        int ok = run_case(c, dir, &masked);
        if (tmp)
            sd3e_folder_rm(dir);
        n_i2i += ok && !masked;
        n_inp += ok && masked;
        on_class += ok && json_is_true(json_object_get(c, "folder_class"));
        dyn += ok && json_is_true(json_object_get(c, "dynamic_shifting"));
    }
    TU_CHECK(n_i2i >= MIN_IMG2IMG && n_inp >= MIN_INPAINT,
             "cases checked to the end: %d img2img (at least %d), %d inpainting (at least %d)",
             n_i2i, MIN_IMG2IMG, n_inp, MIN_INPAINT);
    TU_CHECK(on_class >= 2 && dyn >= 1, "on edit-class folders: %d; with dynamic shifting: %d",
             on_class, dyn);
    TU_CHECK(rule_off_more >= 1, "inpainting images the shifted decode puts off by more than one "
             "level: %d of %d", rule_off_more, n_inp);
    TU_CHECK(refusals(), "every refusal checked");
    json_decref(root);
    return tu_exit();
}
