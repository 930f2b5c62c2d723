/* WanPipeline end to end against Diffusers run in float64 (the fixtures of
 * tools/make_wan_pipeline_fixtures.py: a tiny random Wan 2.1 T2V-like folder
 * with the real UMT5 tokenizer, assembled in the build tree; the expected
 * arrays in tests/fixtures/wan_pipeline/expected/). Everything Wan-specific
 * comes from the pipeline table's row and the model folder; this test names
 * no pipeline class. For every case:
 *   - the model folder's frame rule: num_frames rounded to 1 + 4k and the
 *     latent frames (N - 1) / 4 + 1, as WanPipeline;
 *   - the prompt encoder (the row's UMT5 recipe: prompt_clean, the mask,
 *     the padded rows zeroed) within TEXT_TOL of Diffusers' encode_prompt,
 *     the negatives included;
 *   - the timesteps (UniPC flow, the scheduler's own sigmas) equal
 *     Diffusers';
 *   - the final latents (C, F, h, w) per sample (CFG over the negative
 *     prompt or "", batches, num_videos_per_prompt, non-square sizes through
 *     ditd_pipeline_set_video_size) within 1e-4 relative;
 *   - the decoded frames (latents_mean / latents_std, the Wan VAE,
 *     postprocess_video) within one 8-bit level; the image tail
 *     (latent_image.h) refuses these latents by name.
 * At least 5 cases are checked, 2 of them with 9 frames (3 latent frames). */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/backend/backend.h"
#include "engine/io/npy.h"
#include "engine/models/model.h"
#include "engine/pipeline/latent_image.h"
#include "engine/pipeline/latent_video.h"
#include "engine/pipeline/pipeline.h"
#include "engine/pipeline/prompt_encoder.h"
#include "tests/test_util.h"

#define MIN_CASES 5
#define MIN_9F_CASES 2
#define TEXT_TOL 5e-5 /* f32 encoder against float64 (as test_sd3_pipeline.c) */
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
    snprintf(path, sizeof path, "%s/wan_pipeline/expected/%s", tu_fixtures(), name);
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

/* One case; 1 when checked to the end. */
static int run_case(json_t *c, int *nine)
{
    char dir[4096], what[512];
    const char *name = jstr(c, "name");
    json_t *prompts = json_object_get(c, "prompts"), *negs = json_object_get(c, "negative_prompts");
    int B = jint(c, "batch"), nb = (int)json_array_size(prompts);
    int per = jint(c, "num_videos_per_prompt") > 0 ? jint(c, "num_videos_per_prompt") : 1;
    int L = jint(c, "max_sequence_length"), N = jint(c, "num_frames");
    int F = jint(c, "latent_frames"), lh = jint(c, "latent_height"), lw = jint(c, "latent_width");
    int steps = jint(c, "num_inference_steps");
    int cfg = json_is_true(json_object_get(c, "cfg_used"));
    float g = (float)jnum(c, "guidance_scale");
    int done = 0;
    size_t n_emb, n_noise, n_fin, n_ts, n_nemb = 0, n_img = 0;

    snprintf(dir, sizeof dir, "%s/%s", WAN_PIPELINE_DIR, jstr(c, "folder"));
    float *emb = npy(jstr(c, "prompt_embeds"), &n_emb);
    float *noise = npy(jstr(c, "noise"), &n_noise), *fin = npy(jstr(c, "final_latents"), &n_fin);
    float *ts = npy(jstr(c, "timesteps"), &n_ts), *img = npy(jstr(c, "frames_u8"), &n_img);
    float *nemb = cfg ? npy(jstr(c, "negative_prompt_embeds"), &n_nemb) : NULL;
    ditd_model_info info;
    ditd_prompt_encoder *pe = NULL;
    ditd_pipeline *p = NULL;
    ditd_latent_image *li = NULL;
    ditd_latent_video *lv = NULL;
    uint8_t *pix = NULL;
    float *seq = NULL, *pooled = NULL, *out = NULL;
    ditd_text_embeds te[2 * MAXB];
    ditd_gen_sample smp[MAXB];
    memset(&info, 0, sizeof info);

    TU_CHECK(B == nb * per && B >= 1 && B <= MAXB, "%s: %d videos of %d prompts x %d", name, B, nb,
             per);
    if (!emb || !noise || !fin || !ts || !img || (cfg && !nemb) || B > MAXB || B < 1 || B != nb * per)
        goto out;
    TU_OK(ditd_model_info_load(dir, &info));
    if (!info.pipeline)
        goto out;
    TU_CHECK(info.frame_step == 4 && info.fps == 16 && info.frames == 81 && info.default_steps == 50 &&
                 fabsf(info.default_guidance - 5.0f) < 1e-6f && info.default_max_sequence_length == 512,
             "%s: the folder's video defaults: step %d fps %d frames %d steps %d guidance %g L %d",
             name, info.frame_step, info.fps, info.frames, info.default_steps,
             (double)info.default_guidance, info.default_max_sequence_length);
    TU_CHECK(ditd_model_round_frames(&info, N) == jint(c, "num_frames_rounded") &&
                 ditd_model_latent_frames(&info, N) == F && ditd_model_check_frames(&info, N) == 0,
             "%s: %d frames round to %d (Diffusers %d), %d latent frames (Diffusers %d)", name, N,
             ditd_model_round_frames(&info, N), jint(c, "num_frames_rounded"),
             ditd_model_latent_frames(&info, N), F);
    TU_CHECK(ditd_model_check_size(&info, lw * info.vae_scale, lh * info.vae_scale) == 0,
             "%s: %dx%d: %s", name, lw * info.vae_scale, lh * info.vae_scale, ditd_err_detail());
    TU_CHECK(ditd_pipeline_class_text_len(info.pipeline, L) == L, "%s: text length at L %d: %d",
             name, L, ditd_pipeline_class_text_len(info.pipeline, L));
    ditd_prompt_encoder_opts o = {.max_sequence_length = L};
    TU_OK(ditd_prompt_encoder_new(&info, &ditd_backend_cpu, &o, &pe));
    if (!pe)
        goto out;
    const int Dt = ditd_prompt_encoder_text_dim(pe), Dp = ditd_prompt_encoder_pooled_dim(pe);
    const size_t numel = (size_t)info.shapes.in_channels * F * lh * lw;
    TU_CHECK(Dp == 0 && n_emb == (size_t)B * L * Dt && n_noise == (size_t)B * numel &&
                 n_fin == n_noise && (!cfg || n_nemb == n_emb),
             "%s: fixture sizes (%zu, %zu) for B %d L %d Dt %d Dp %d", name, n_emb, n_noise, B, L,
             Dt, Dp);
    if (Dp != 0 || n_emb != (size_t)B * L * Dt || n_noise != (size_t)B * numel || n_noise != n_fin ||
        (cfg && n_nemb != n_emb))
        goto out;
    seq = malloc(2 * (size_t)B * L * Dt * sizeof *seq);
    pooled = malloc(2 * (size_t)B * sizeof *pooled);
    if (!seq || !pooled)
        goto out;

    /* sample b is prompt b / per; the negative prompt defaults to "" */
    for (int b = 0; b < B; b++) {
        const char *pr = str_at(prompts, b / per), *ng = str_at(negs, b / per);
        float *s = seq + (size_t)b * L * Dt;
        TU_OK(ditd_prompt_encoder_encode(pe, pr ? pr : "", pr ? strlen(pr) : 0, L, s, pooled + b));
        te[b] = (ditd_text_embeds){.seq = s, .pooled = pooled + b};
        smp[b] = (ditd_gen_sample){.seed = 0, .index = (uint64_t)b, .guidance = g, .true_cfg = 1.0f};
        smp[b].cond.prompt = &te[b];
        TU_CHECK(ditd_pipeline_class_needs_negative(info.pipeline, g, 1.0f, ng != NULL, 0) == cfg,
                 "%s: the row's rule says the negative pass %s", name, cfg ? "runs" : "does not run");
        if (cfg) {
            float *ns = seq + (size_t)(B + b) * L * Dt;
            TU_OK(ditd_prompt_encoder_encode(pe, ng ? ng : "", ng ? strlen(ng) : 0, L, ns,
                                             pooled + B + b));
            te[B + b] = (ditd_text_embeds){.seq = ns, .pooled = pooled + B + b};
            smp[b].cond.negative = &te[B + b];
        }
    }
    snprintf(what, sizeof what, "%s: prompt_embeds (%d, %d, %d)", name, B, L, Dt);
    TU_CLOSE(what, seq, emb, n_emb, TEXT_TOL);
    if (cfg) {
        snprintf(what, sizeof what, "%s: negative_prompt_embeds", name);
        TU_CLOSE(what, seq + (size_t)B * L * Dt, nemb, n_nemb, TEXT_TOL);
    }

    TU_OK(ditd_pipeline_new(&info, &ditd_backend_cpu, B, &p));
    if (!p)
        goto out;
    TU_OK(ditd_pipeline_set_video_size(p, F, lh, lw, L));
    TU_CHECK(p->numel == numel, "%s: the loop's sample is %zu values, (C, F, h, w) %zu", name,
             p->numel, numel);
    ditd_gen_params gp = {.steps = steps, .sampler = p->sched_base.kind};
    out = malloc(n_fin * sizeof *out);
    if (!out || p->numel != numel)
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
    snprintf(what, sizeof what, "%s: final latents (%d, 16, %d, %d, %d), %d steps%s", name, B, F,
             lh, lw, steps, cfg ? ", CFG" : "");
    TU_CLOSE(what, out, fin, n_fin, 1e-4);

    /* the image tail refuses video latents by name */
    int err = ditd_latent_image_new(&info, &ditd_backend_cpu, NULL, 0, &li);
    TU_CHECK(err == DITD_EUNSUPPORTED && li == NULL && strstr(ditd_err_detail(), "video"),
             "%s: the image decode is refused (%d: %s)", name, err, ditd_err_detail());
    /* the video tail: frames within one 8-bit level */
    TU_OK(ditd_latent_video_new(&info, &ditd_backend_cpu, lh, lw, &lv));
    if (!lv)
        goto out;
    const int s = ditd_latent_video_scale(lv), NF = ditd_latent_video_frames(lv, F);
    const size_t npx = (size_t)B * NF * (lh * s) * (lw * s) * 3;
    TU_CHECK(NF == jint(c, "num_frames_rounded") && n_img == npx,
             "%s: %d frames (Diffusers %d), %zu frame values (Diffusers %zu)", name, NF,
             jint(c, "num_frames_rounded"), npx, n_img);
    if (n_img != npx || !(pix = malloc(npx)))
        goto out;
    TU_OK(ditd_latent_video_run(lv, out, B, F, lh, lw, pix));
    size_t off;
    int worst = tu_pixels_worst(pix, img, npx, &off);
    TU_CHECK(worst <= 1, "%s: frames %dx%d x%d: worst %d levels (%zu of %zu values off by one)",
             name, lw * s, lh * s, NF, worst, off, npx);
    printf("ok   %s: %d frames %dx%d x%d within %d level(s) (%zu of %zu off)\n", name, NF, lw * s,
           lh * s, B, worst, off, npx);
    *nine = F == 3;
    done = 1;
out:
    ditd_latent_image_free(li);
    ditd_latent_video_free(lv);
    ditd_pipeline_free(p);
    ditd_prompt_encoder_free(pe);
    if (info.dir[0])
        ditd_model_info_free(&info);
    free(emb), free(noise), free(fin), free(ts), free(nemb), free(img);
    free(seq), free(pooled), free(out), free(pix);
    return done;
}

int main(void)
{
    char path[4096];
    json_error_t jerr;
    json_t *root, *cases, *c;
    size_t i;
    int checked = 0, nine = 0;

    ditd_backend_cpu.set_threads(1);
    snprintf(path, sizeof path, "%s/wan_pipeline/expected/cases.json", tu_fixtures());
    root = json_load_file(path, 0, &jerr);
    TU_CHECK(root != NULL, "%s: %s", path, jerr.text);
    cases = json_object_get(root, "cases");
    json_array_foreach(cases, i, c) {
        int n9 = 0;
        if (run_case(c, &n9)) {
            checked++;
            nine += n9;
        }
    }
    TU_CHECK(checked >= MIN_CASES, "WanPipeline cases checked to the end: %d (at least %d)", checked,
             MIN_CASES);
    TU_CHECK(nine >= MIN_9F_CASES, "9-frame cases: %d (at least %d)", nine, MIN_9F_CASES);
    json_decref(root);
    return tu_exit();
}
