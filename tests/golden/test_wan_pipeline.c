/* WanPipeline end to end against Diffusers run in float64 (the fixtures of
 * tools/make_wan_pipeline_fixtures.py: tiny random Wan 2.1 T2V-like, Wan 2.2
 * T2V-A14B-like (two experts) and TI2V-5B-like (expand_timesteps, the
 * 48-channel residual VAE) folders with the real UMT5 tokenizer, assembled
 * in the build tree; the expected
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
 *     (latent_image.h) refuses these latents by name;
 *   - two experts: transformer_2 loaded, the boundary timestep and the
 *     expert of every step as WanPipeline chose them, guidance_scale_2;
 *     TI2V: the folder's expand_timesteps.
 * At least 10 cases are checked, 2 of them with 9 frames (3 latent frames),
 * 3 with two experts and 2 TI2V. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/backend/backend.h"
#include "engine/io/npy.h"
#include "engine/models/model.h"
#include "engine/pipeline/latent_image.h"
#include "engine/pipeline/latent_video.h"
#include "engine/pipeline/pipeline.h"
#include "engine/pipeline/prompt_encoder.h"
#include "tests/test_util.h"

#define MIN_CASES 10
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
static int run_case(json_t *c, int *nine, int *experts2, int *expand)
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
        if (json_is_number(json_object_get(c, "guidance_scale_2"))) {
            smp[b].has_guidance_2 = 1;
            smp[b].guidance_2 = (float)jnum(c, "guidance_scale_2");
        }
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

    /* Wan 2.2 A14B: the second expert and its boundary; TI2V: expand_timesteps */
    json_t *per_step = json_object_get(c, "expert_per_step");
    int two = per_step != NULL, ti2v = strcmp(jstr(c, "folder"), "ti2v") == 0;
    TU_CHECK((info.transformer_2_dir[0] != 0) == two && info.expand_timesteps == ti2v,
             "%s: transformer_2 '%s' (Diffusers %s), expand_timesteps %d", name,
             info.transformer_2_dir, two ? "two experts" : "one", info.expand_timesteps);
    TU_OK(ditd_pipeline_new(&info, &ditd_backend_cpu, B, &p));
    if (!p)
        goto out;
    TU_CHECK((p->den2 != NULL) == two &&
                 (!two || p->boundary_t == (float)jnum(c, "boundary_timestep")),
             "%s: second expert %s, boundary %g (Diffusers %g)", name, p->den2 ? "loaded" : "none",
             (double)p->boundary_t, jnum(c, "boundary_timestep"));
    TU_OK(ditd_pipeline_set_video_size(p, F, lh, lw, L));
    TU_CHECK(p->numel == numel, "%s: the loop's sample is %zu values, (C, F, h, w) %zu", name,
             p->numel, numel);
    ditd_gen_params gp = {.steps = steps, .sampler = p->sched_base.kind};
    out = malloc(n_fin * sizeof *out);
    if (!out || p->numel != numel)
        goto out;
    TU_OK(ditd_pipeline_generate(p, &gp, B, smp, noise, out, NULL, NULL, NULL));
    if (two) { /* step caching: a state per expert (test_step_cache checks it against
                * Diffusers); every step is counted, over the two */
        ditd_cache_config cc;
        ditd_cache_config_default(DITD_CACHE_FIRST_BLOCK, &cc);
        float *tmp_out = malloc(n_fin * sizeof *tmp_out);
        TU_OK(ditd_pipeline_set_cache(p, &cc));
        int e = tmp_out ? ditd_pipeline_generate(p, &gp, B, smp, noise, tmp_out, NULL, NULL, NULL) : -1;
        ditd_cache_stats st;
        ditd_pipeline_cache_stats(p, 0, &st);
        TU_CHECK(e == 0 && st.steps == steps,
                 "%s: caching with two experts: %d (%s), %d of %d steps", name, e,
                 e ? ditd_err_detail() : "ok", st.steps, steps);
        TU_OK(ditd_pipeline_set_cache(p, NULL));
        free(tmp_out);
    }
    TU_CHECK(p->sampler && ditd_sampler_num_steps(p->sampler) == (int)n_ts, "%s: %zu timesteps",
             name, n_ts);
    if (p->sampler && ditd_sampler_num_steps(p->sampler) == (int)n_ts) {
        const float *t = ditd_sampler_timesteps(p->sampler);
        int same = 0;
        for (size_t i = 0; i < n_ts; i++)
            same += t[i] == ts[i];
        TU_CHECK(same == (int)n_ts, "%s: timesteps equal Diffusers' (%d of %zu; first %.9g vs %.9g)",
                 name, same, n_ts, (double)t[0], (double)ts[0]);
        /* the expert of each step, by the pipeline's rule, as Diffusers chose it */
        int agree = 0, low = 0;
        for (size_t i = 0; two && i < n_ts && i < json_array_size(per_step); i++) {
            int e = t[i] < p->boundary_t ? 2 : 1;
            agree += e == (int)json_integer_value(json_array_get(per_step, i));
            low += e == 2;
        }
        TU_CHECK(!two || (agree == (int)n_ts && low > 0 && low < (int)n_ts),
                 "%s: expert per step agrees %d of %zu (%d low-noise steps)", name, agree, n_ts, low);
    }
    snprintf(what, sizeof what, "%s: final latents (%d, %d, %d, %d, %d), %d steps%s%s", name, B,
             info.shapes.in_channels, F, lh, lw, steps, cfg ? ", CFG" : "",
             two ? ", two experts" : "");
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
    *experts2 = two;
    *expand = ti2v;
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

/* A folder made of wan22's components (symlinks) with this model_index.json
 * and transformer_2 pointing at t2 ("" for none); what loading it gives. */
static int load_variant(const char *tmp, const char *index, const char *t2, ditd_model_info *info)
{
    static const char *const comps[] = {"scheduler", "text_encoder", "tokenizer", "transformer", "vae"};
    char path[4096], src[4096];
    FILE *f;
    snprintf(path, sizeof path, "rm -rf '%s/v' && mkdir -p '%s/v'", tmp, tmp);
    if (system(path) != 0)
        return -1;
    for (size_t i = 0; i < sizeof comps / sizeof comps[0]; i++) {
        snprintf(src, sizeof src, "%s/wan22/%s", WAN_PIPELINE_DIR, comps[i]);
        snprintf(path, sizeof path, "%s/v/%s", tmp, comps[i]);
        if (symlink(src, path) != 0)
            return -1;
    }
    if (t2[0]) {
        snprintf(src, sizeof src, "%s/%s", WAN_PIPELINE_DIR, t2);
        snprintf(path, sizeof path, "%s/v/transformer_2", tmp);
        if (symlink(src, path) != 0)
            return -1;
    }
    snprintf(path, sizeof path, "%s/v/model_index.json", tmp);
    if (!(f = fopen(path, "w")))
        return -1;
    fprintf(f, "{\"_class_name\": \"WanPipeline\", \"scheduler\": [\"diffusers\", "
               "\"UniPCMultistepScheduler\"], \"text_encoder\": [\"transformers\", \"UMT5EncoderModel\"], "
               "\"tokenizer\": [\"transformers\", \"T5TokenizerFast\"], \"transformer\": "
               "[\"diffusers\", \"WanTransformer3DModel\"], \"vae\": [\"diffusers\", "
               "\"AutoencoderKLWan\"]%s}\n", index);
    fclose(f);
    snprintf(path, sizeof path, "%s/v", tmp);
    return ditd_model_info_load(path, info);
}

/* The model folder's two-expert keys: what is refused, naming what. */
static int expert_refusals(void)
{
    static const struct {
        const char *index, *t2, *needle; /* needle NULL: loads */
        int two;
    } cases[] = {
        {", \"boundary_ratio\": 0.875", "", "transformer_2 is absent", 0},
        {", \"transformer_2\": [\"diffusers\", \"WanTransformer3DModel\"], \"boundary_ratio\": 0.875",
         "", "transformer_2/config.json: missing", 0},
        {", \"transformer_2\": [\"diffusers\", \"WanTransformer3DModel\"], \"boundary_ratio\": 0.875",
         "ti2v/transformer", "in_channels 48, the first transformer's is 16", 0},
        {", \"transformer_2\": [\"diffusers\", \"WanTransformer3DModel\"], \"boundary_ratio\": 1.5",
         "wan22/transformer_2", "boundary_ratio must be", 0},
        {", \"transformer_2\": \"WanTransformer3DModel\", \"boundary_ratio\": 0.5",
         "wan22/transformer_2", "transformer_2 must be", 0},
        {", \"expand_timesteps\": \"yes\"", "", "expand_timesteps must be", 0},
        /* WanPipeline: no boundary, transformer_2 never runs (not loaded) */
        {", \"transformer_2\": [\"diffusers\", \"WanTransformer3DModel\"]", "wan22/transformer_2",
         NULL, 0},
        {", \"transformer_2\": [\"diffusers\", \"WanTransformer3DModel\"], \"boundary_ratio\": 0.5",
         "wan22/transformer_2", NULL, 1},
        {", \"transformer_2\": null, \"boundary_ratio\": null", "", NULL, 0},
    };
    char tmp[4096];
    int n = 0;
    if (tu_mkdtemp(tmp, sizeof tmp, "wan-experts") != 0)
        return 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ditd_model_info info;
        memset(&info, 0, sizeof info);
        int err = load_variant(tmp, cases[i].index, cases[i].t2, &info);
        if (cases[i].needle) {
            TU_CHECK(err != 0 && strstr(ditd_err_detail(), cases[i].needle),
                     "folder %zu refused (%d): '%s' (wanted '%s')", i, err, err ? ditd_err_detail() : "",
                     cases[i].needle);
        } else {
            TU_CHECK(err == 0 && (info.transformer_2_dir[0] != 0) == cases[i].two,
                     "folder %zu loads (%d: %s) with %s", i, err, err ? ditd_err_detail() : "",
                     cases[i].two ? "two experts" : "one");
            if (err == 0)
                ditd_model_info_free(&info);
        }
        n++;
    }
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", tmp);
    return n;
}

int main(void)
{
    char path[4096];
    json_error_t jerr;
    json_t *root, *cases, *c;
    size_t i;
    int checked = 0, nine = 0, two = 0, expand = 0;

    ditd_backend_cpu.set_threads(1);
    snprintf(path, sizeof path, "%s/wan_pipeline/expected/cases.json", tu_fixtures());
    root = json_load_file(path, 0, &jerr);
    TU_CHECK(root != NULL, "%s: %s", path, jerr.text);
    cases = json_object_get(root, "cases");
    json_array_foreach(cases, i, c) {
        int n9 = 0, e2 = 0, ex = 0;
        if (run_case(c, &n9, &e2, &ex)) {
            checked++;
            nine += n9;
            two += e2;
            expand += ex;
        }
    }
    TU_CHECK(checked >= MIN_CASES, "WanPipeline cases checked to the end: %d (at least %d)", checked,
             MIN_CASES);
    TU_CHECK(nine >= MIN_9F_CASES, "9-frame cases: %d (at least %d)", nine, MIN_9F_CASES);
    TU_CHECK(two >= 3 && expand >= 2, "Wan 2.2 cases: %d with two experts (at least 3), %d TI2V "
             "(at least 2)", two, expand);
    int refused = expert_refusals();
    TU_CHECK(refused >= 9, "two-expert folder variants checked: %d (at least 9)", refused);
    json_decref(root);
    return tu_exit();
}
