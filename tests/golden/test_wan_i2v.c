/* WanImageToVideoPipeline end to end against Diffusers 0.42 in float64
 * (tools/make_wan_i2v_fixtures.py, tests/fixtures/wan_pipeline/expected_i2v):
 *   - PIL's Image.resize (bicubic, lanczos, bilinear; up and down) byte for
 *     byte (engine/core/image_resize.h);
 *   - the tiny CLIPVisionModel's hidden states (every index) on random
 *     pixels against transformers float64;
 *   - per case (Wan 2.1 I2V-like with the image encoder, Wan 2.2
 *     I2V-A14B-like with two experts): CLIPImageProcessor's pixel values,
 *     image_embeds (hidden_states[-2]), the condition (mask + VAE latents),
 *     the timesteps, the final latents (1e-4 relative) and the decoded frames
 *     (one 8-bit level);
 *   - refusals: no image on an image-to-video row, an image on WanPipeline.
 */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/backend/backend.h"
#include "engine/io/json_config.h"
#include "engine/io/npy.h"
#include "engine/models/model.h"
#include "engine/pipeline/image_cond.h"
#include "engine/pipeline/latent_video.h"
#include "engine/pipeline/pipeline.h"
#include "engine/pipeline/prompt_encoder.h"
#include "engine/vision/clip_vision.h"
#include "engine/core/image_resize.h"
#include "tests/test_util.h"

#define MAXB 2
static char exp_dir[4096];

static float *npy(const char *name, size_t *n)
{
    char path[8192];
    int nd;
    int64_t shape[8];
    float *d = NULL;
    snprintf(path, sizeof path, "%s/%s", exp_dir, name);
    if (ditd_npy_read_f32(path, 8, &nd, shape, &d)) {
        TU_CHECK(0, "%s: %s", path, ditd_err_detail());
        return NULL;
    }
    *n = 1;
    for (int i = 0; i < nd; i++)
        *n *= (size_t)shape[i];
    return d;
}

static uint8_t *bytes(const float *f, size_t n)
{
    uint8_t *b = malloc(n ? n : 1);
    for (size_t i = 0; b && i < n; i++)
        b[i] = (uint8_t)f[i];
    return b;
}

static int jint(json_t *c, const char *k) { return (int)json_integer_value(json_object_get(c, k)); }
static double jnum(json_t *c, const char *k) { return json_number_value(json_object_get(c, k)); }
static const char *jstr(json_t *c, const char *k) { return json_string_value(json_object_get(c, k)); }

/* PIL resizes and the tower on random pixels; the count of checks done. */
static int clip_vision_checks(void)
{
    char path[8192];
    json_error_t je;
    int n = 0;
    snprintf(path, sizeof path, "%s/clip_vision/cases.json", exp_dir);
    json_t *m = json_load_file(path, 0, &je);
    TU_CHECK(m != NULL, "%s: %s", path, je.text);
    if (!m)
        return 0;
    char sub[4200];
    snprintf(sub, sizeof sub, "%s", exp_dir);
    snprintf(exp_dir, sizeof exp_dir, "%s/clip_vision", sub);
    json_t *rz = json_object_get(m, "resizes"), *c;
    size_t i;
    json_array_foreach(rz, i, c) {
        size_t ni, no;
        float *fi = npy(jstr(c, "input"), &ni), *fo = npy(jstr(c, "output"), &no);
        int ow = jint(c, "ow"), oh = jint(c, "oh");
        ditd_resample f;
        uint8_t *in = fi ? bytes(fi, ni) : NULL, *out = malloc(no ? no : 1);
        if (in && out && !ditd_resample_from_pil(jint(c, "resample"), &f) &&
            no == (size_t)ow * oh * 3) {
            TU_OK(ditd_image_resize_filter(in, jint(c, "w"), jint(c, "h"), 3, out, ow, oh, f));
            size_t diff = 0;
            int worst = 0;
            for (size_t j = 0; j < no; j++) {
                int d = abs((int)out[j] - (int)fo[j]);
                diff += d != 0;
                worst = d > worst ? d : worst;
            }
            /* Pillow 13's pass order (the fixture's pil_order) is ditd's
             * rule (image_resize.h): every case equal */
            const char *po = jstr(c, "pil_order");
            TU_CHECK(diff == 0, "resize %dx%d -> %dx%d %s (PIL %s): %zu of %zu bytes differ, "
                     "worst %d", jint(c, "w"), jint(c, "h"), ow, oh, ditd_resample_name(f), po,
                     diff, no, worst);
            printf("%s  resize %dx%d -> %dx%d %s (PIL %s): %zu of %zu bytes differ\n",
                   diff ? "FAIL" : "ok", jint(c, "w"), jint(c, "h"), ow, oh,
                   ditd_resample_name(f), po, diff, no);
            n += diff == 0;
        }
        free(fi), free(fo), free(in), free(out);
    }
    /* the tower: every hidden state of two random images */
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/i2v21/image_encoder", WAN_PIPELINE_DIR);
    ditd_clip_vision *cv = NULL;
    TU_OK(ditd_clip_vision_new(dir, "CLIPVisionModel", &ditd_backend_cpu, 2, &cv));
    size_t npx;
    float *px = npy(jstr(m, "pixels"), &npx);
    json_t *hid = json_object_get(m, "hidden");
    if (cv && px) {
        const ditd_clip_vision_config *cc = ditd_clip_vision_config_of(cv);
        size_t nh = (size_t)2 * ditd_clip_vision_tokens(cv) * cc->hidden_size;
        float *got = malloc(nh * sizeof *got);
        TU_CHECK((int)json_array_size(hid) == cc->num_layers + 1, "%zu hidden states",
                 json_array_size(hid));
        for (int k = 0; got && k <= cc->num_layers; k++) {
            size_t nw;
            float *want = npy(json_string_value(json_array_get(hid, (size_t)k)), &nw);
            if (!want || nw != nh) {
                TU_CHECK(0, "hidden_states[%d]: %zu values, want %zu", k, nw, nh);
                free(want);
                continue;
            }
            char what[128];
            TU_OK(ditd_clip_vision_encode(cv, 2, px, k, got));
            snprintf(what, sizeof what, "CLIP vision hidden_states[%d] (2, %d, %d)", k,
                     ditd_clip_vision_tokens(cv), cc->hidden_size);
            TU_CLOSE(what, got, want, nh, 1e-5);
            n++;
            if (k == cc->num_layers - 1) { /* -2 is the same state */
                float *g2 = malloc(nh * sizeof *g2);
                TU_OK(ditd_clip_vision_encode(cv, 2, px, -2, g2));
                TU_CHECK(g2 && memcmp(g2, got, nh * sizeof *g2) == 0, "hidden_index -2 == %d", k);
                free(g2);
            }
            free(want);
        }
        TU_CHECK_ERR(ditd_clip_vision_encode(cv, 3, px, -2, got), DITD_EINVAL, "batch");
        TU_CHECK_ERR(ditd_clip_vision_encode(cv, 1, px, 9, got), DITD_EINVAL, "hidden_index");
        free(got);
    }
    ditd_clip_vision_free(cv);
    free(px);
    snprintf(exp_dir, sizeof exp_dir, "%s", sub);
    json_decref(m);
    return n;
}

/* One case; 1 when checked to the end. */
static int run_case(json_t *c)
{
    char dir[4096], what[512];
    const char *name = jstr(c, "name");
    int B = jint(c, "batch"), L = jint(c, "max_sequence_length"), N = jint(c, "num_frames");
    int F = jint(c, "latent_frames"), lh = jint(c, "latent_height"), lw = jint(c, "latent_width");
    int H = jint(c, "height"), W = jint(c, "width"), iw = jint(c, "image_width"),
        ih = jint(c, "image_height");
    int cfg = json_is_true(json_object_get(c, "cfg_used")), done = 0;
    float g = (float)jnum(c, "guidance_scale");
    const char *pr = json_string_value(json_array_get(json_object_get(c, "prompts"), 0));
    const char *ng = json_string_value(json_array_get(json_object_get(c, "negative_prompts"), 0));
    size_t n_noise, n_fin, n_ts, n_img, n_cond, n_im, n_px = 0, n_emb = 0;
    float *noise = npy(jstr(c, "noise"), &n_noise), *fin = npy(jstr(c, "final_latents"), &n_fin);
    float *ts = npy(jstr(c, "timesteps"), &n_ts), *frames = npy(jstr(c, "frames_u8"), &n_img);
    float *cond_w = npy(jstr(c, "condition"), &n_cond), *im = npy(jstr(c, "image_u8"), &n_im);
    size_t n_last = 0; /* FLF2V: the last frame, the same size */
    float *lim = jstr(c, "last_image_u8") ? npy(jstr(c, "last_image_u8"), &n_last) : NULL;
    int branch = json_object_get(c, "image_embeds") != NULL;
    float *px_w = branch ? npy(jstr(c, "pixel_values"), &n_px) : NULL;
    float *emb_w = branch ? npy(jstr(c, "image_embeds"), &n_emb) : NULL;
    ditd_model_info info;
    ditd_prompt_encoder *pe = NULL;
    ditd_pipeline *p = NULL;
    ditd_latent_video *lv = NULL;
    ditd_image_cond *ic = NULL;
    uint8_t *rgb = NULL, *last = NULL, *pix = NULL;
    float *seq = NULL, *cond = NULL, *emb = NULL, *out = NULL, pooled[2];
    memset(&info, 0, sizeof info);
    snprintf(dir, sizeof dir, "%s/%s", WAN_PIPELINE_DIR, jstr(c, "folder"));
    if (!noise || !fin || !ts || !frames || !cond_w || !im || (branch && (!px_w || !emb_w)) ||
        B < 1 || B > MAXB || n_im != (size_t)iw * ih * 3)
        goto out;
    rgb = bytes(im, n_im);
    last = lim ? bytes(lim, n_last) : NULL;
    TU_OK(ditd_model_info_load(dir, &info));
    if (!info.pipeline)
        goto out;
    int ti2v = strcmp(jstr(c, "folder"), "ti2vi") == 0;
    TU_CHECK(info.pipeline->image_to_video && info.cond_channels == (ti2v ? 0 : 20) &&
                 info.expand_timesteps == ti2v &&
                 (info.image_encoder_dir[0] != 0) == branch &&
                 (info.shapes.cond.image_dim > 0) == branch,
             "%s: %s, %d condition channels, image encoder '%s'", name, info.pipeline->name,
             info.cond_channels, info.image_encoder_dir);
    /* the image inputs */
    TU_OK(ditd_image_cond_new(&info, &ditd_backend_cpu, W, H, &ic));
    if (!ic)
        goto out;
    size_t nc = ditd_image_cond_numel(ic, N, W, H), ne = ditd_image_cond_embeds_numel(ic);
    TU_CHECK(nc == n_cond && ne == n_emb, "%s: condition %zu values (Diffusers %zu), embeds %zu "
             "(%zu)", name, nc, n_cond, ne, n_emb);
    if (nc != n_cond || ne != n_emb)
        goto out;
    cond = malloc(nc * sizeof *cond);
    emb = ne ? malloc(ne * sizeof *emb) : NULL;
    TU_OK(ditd_image_cond_run(ic, rgb, iw, ih, last, last ? iw : 0, last ? ih : 0, N, W, H, cond,
                              emb));
    snprintf(what, sizeof what, "%s: condition (%d, %d, %d, %d)", name,
             ti2v ? info.shapes.out_channels : 20, ti2v ? 1 : F, lh, lw);
    TU_CLOSE(what, cond, cond_w, nc, 1e-5);
    if (branch) {
        ditd_clip_image_processor proc;
        float *px = malloc(n_px * sizeof *px);
        TU_OK(ditd_clip_image_processor_load(info.image_processor_config, &proc));
        TU_OK(ditd_clip_image_preprocess(&proc, rgb, iw, ih, px));
        size_t same = 0;
        for (size_t i = 0; px && i < n_px; i++)
            same += px[i] == px_w[i];
        TU_CHECK(same == n_px, "%s: CLIPImageProcessor pixel values equal (%zu of %zu)", name,
                 same, n_px);
        free(px);
        snprintf(what, sizeof what, "%s: image_embeds (hidden_states[-2])", name);
        TU_CLOSE(what, emb, emb_w, ne, 1e-5);
    }
    /* the prompts and the loop */
    /* one encoder per folder and length (the UMT5 tokenizer's 256,384 pieces load once) */
    static ditd_prompt_encoder *pe_cache;
    static char pe_key[4200];
    char key[4200];
    snprintf(key, sizeof key, "%s@%d", dir, L);
    if (pe_cache && strcmp(key, pe_key) != 0) {
        ditd_prompt_encoder_free(pe_cache);
        pe_cache = NULL;
    }
    if (!pe_cache) {
        ditd_prompt_encoder_opts o = {.max_sequence_length = L};
        TU_OK(ditd_prompt_encoder_new(&info, &ditd_backend_cpu, &o, &pe_cache));
        snprintf(pe_key, sizeof pe_key, "%s", key);
    }
    if (!(pe = pe_cache))
        goto out;
    const int Dt = ditd_prompt_encoder_text_dim(pe);
    seq = malloc(2 * (size_t)L * Dt * sizeof *seq);
    if (!seq)
        goto out;
    ditd_text_embeds te[2];
    TU_OK(ditd_prompt_encoder_encode(pe, pr, strlen(pr), L, seq, pooled));
    te[0] = (ditd_text_embeds){.seq = seq, .pooled = pooled};
    if (cfg) {
        TU_OK(ditd_prompt_encoder_encode(pe, ng ? ng : "", ng ? strlen(ng) : 0, L,
                                         seq + (size_t)L * Dt, pooled + 1));
        te[1] = (ditd_text_embeds){.seq = seq + (size_t)L * Dt, .pooled = pooled + 1};
    }
    ditd_gen_sample smp[MAXB];
    for (int b = 0; b < B; b++) {
        smp[b] = (ditd_gen_sample){.index = (uint64_t)b, .guidance = g, .true_cfg = 1.0f,
                                   .video_cond = cond, .image_embeds = emb};
        smp[b].cond.prompt = &te[0];
        smp[b].cond.negative = cfg ? &te[1] : NULL;
        if (json_is_number(json_object_get(c, "guidance_scale_2"))) {
            smp[b].has_guidance_2 = 1;
            smp[b].guidance_2 = (float)jnum(c, "guidance_scale_2");
        }
    }
    TU_OK(ditd_pipeline_new(&info, &ditd_backend_cpu, B, &p));
    if (!p)
        goto out;
    TU_OK(ditd_pipeline_set_video_size(p, F, lh, lw, L));
    TU_CHECK(p->numel * B == n_noise && p->numel_cond == (ti2v ? 0 : nc) && p->first_frame == ti2v,
             "%s: latents %zu, condition %zu values a sample, first frame %d", name, p->numel,
             p->numel_cond, p->first_frame);
    out = malloc(n_fin * sizeof *out);
    if (!out || p->numel * B != n_noise)
        goto out;
    ditd_gen_params gp = {.steps = jint(c, "num_inference_steps"), .sampler = p->sched_base.kind};
    /* refused: a sample without its image */
    smp[0].video_cond = NULL;
    int e = ditd_pipeline_generate(p, &gp, B, smp, noise, out, NULL, NULL, NULL);
    TU_CHECK(e == DITD_EINVAL && strstr(ditd_err_detail(), "no input image"),
             "%s: a sample without an image is refused (%d: %s)", name, e, ditd_err_detail());
    smp[0].video_cond = cond;
    TU_OK(ditd_pipeline_generate(p, &gp, B, smp, noise, out, NULL, NULL, NULL));
    const float *t = ditd_sampler_timesteps(p->sampler);
    int same = 0;
    for (size_t i = 0; i < n_ts && (int)i < ditd_sampler_num_steps(p->sampler); i++)
        same += t[i] == ts[i];
    TU_CHECK(same == (int)n_ts, "%s: timesteps equal Diffusers' (%d of %zu)", name, same, n_ts);
    snprintf(what, sizeof what, "%s: final latents (%d, %d, %d, %d, %d)%s%s%s", name, B,
             info.shapes.out_channels, F, lh, lw, cfg ? ", CFG" : "", p->den2 ? ", two experts" : "",
             ti2v ? ", first frame the image's at t = 0" : "");
    TU_CLOSE(what, out, fin, n_fin, 1e-4);
    TU_OK(ditd_latent_video_new(&info, &ditd_backend_cpu, lh, lw, &lv));
    if (!lv || n_img != (size_t)B * N * H * W * 3 || !(pix = malloc(n_img)))
        goto out;
    TU_OK(ditd_latent_video_run(lv, out, B, F, lh, lw, pix));
    size_t off;
    int worst = tu_pixels_worst(pix, frames, n_img, &off);
    TU_CHECK(worst <= 1, "%s: frames: worst %d levels (%zu of %zu off by one)", name, worst, off,
             n_img);
    printf("ok   %s: %d frames %dx%d x%d within %d level(s) (%zu of %zu off)\n", name, N, W, H, B,
           worst, off, n_img);
    done = 1;
out:
    ditd_latent_video_free(lv);
    ditd_pipeline_free(p);
    ditd_image_cond_free(ic);
    if (info.dir[0])
        ditd_model_info_free(&info);
    free(noise), free(fin), free(ts), free(frames), free(cond_w), free(im), free(px_w),
        free(emb_w);
    free(lim), free(last);
    free(rgb), free(pix), free(seq), free(cond), free(emb), free(out);
    return done;
}


/* A folder of `base`'s components (symlinks; `transformer` from tsrc when
 * given) with this model_index.json and, when proc is given, this
 * image_processor/preprocessor_config.json; 0 when made. */
static int variant(const char *tmp, const char *base, const char *index, const char *tsrc,
                   const char *proc)
{
    static const char *const comps[] = {"scheduler", "text_encoder", "tokenizer", "vae",
                                        "image_encoder", "transformer_2"};
    char path[8192], src[8192];
    FILE *f;
    snprintf(path, sizeof path, "rm -rf '%s/v' && mkdir -p '%s/v'", tmp, tmp);
    if (system(path) != 0)
        return -1;
    for (size_t i = 0; i < sizeof comps / sizeof comps[0]; i++) {
        snprintf(src, sizeof src, "%s/%s/%s", WAN_PIPELINE_DIR, base, comps[i]);
        snprintf(path, sizeof path, "%s/v/%s", tmp, comps[i]);
        if (access(src, F_OK) == 0 && symlink(src, path) != 0)
            return -1;
    }
    snprintf(src, sizeof src, "%s/%s/transformer", WAN_PIPELINE_DIR, tsrc ? tsrc : base);
    snprintf(path, sizeof path, "%s/v/transformer", tmp);
    if (symlink(src, path) != 0)
        return -1;
    snprintf(path, sizeof path, "%s/v/image_processor", tmp);
    if (proc) {
        if (mkdir(path, 0700) != 0)
            return -1;
        snprintf(path, sizeof path, "%s/v/image_processor/preprocessor_config.json", tmp);
        if (!(f = fopen(path, "w")))
            return -1;
        fputs(proc, f);
        fclose(f);
    } else {
        snprintf(src, sizeof src, "%s/%s/image_processor", WAN_PIPELINE_DIR, base);
        if (access(src, F_OK) == 0 && symlink(src, path) != 0)
            return -1;
    }
    snprintf(path, sizeof path, "%s/v/model_index.json", tmp);
    if (!(f = fopen(path, "w")))
        return -1;
    fputs(index, f);
    fclose(f);
    ditd_json_config_cache_clear(); /* the same paths, new contents: never a cached parse */
    return 0;
}

#define IDX_HEAD "{\"_class_name\": \"WanImageToVideoPipeline\", \"scheduler\": [\"diffusers\", " \
    "\"UniPCMultistepScheduler\"], \"text_encoder\": [\"transformers\", \"UMT5EncoderModel\"], " \
    "\"tokenizer\": [\"transformers\", \"T5TokenizerFast\"], \"transformer\": [\"diffusers\", " \
    "\"WanTransformer3DModel\"], \"vae\": [\"diffusers\", \"AutoencoderKLWan\"]"
#define IDX_IMG ", \"image_encoder\": [\"transformers\", \"CLIPVisionModel\"], " \
    "\"image_processor\": [\"transformers\", \"CLIPImageProcessor\"]"

/* Folders the row refuses, by name; the count checked. */
static int refusals(void)
{
    char tmp[4096], dir[4200];
    ditd_model_info mi;
    ditd_image_cond *ic = NULL;
    int n = 0;
    if (tu_mkdtemp(tmp, sizeof tmp, "wan-i2v"))
        return 0;
    snprintf(dir, sizeof dir, "%s/v", tmp);
    /* an image branch without the encoder */
    if (!variant(tmp, "i2v21", IDX_HEAD "}", NULL, NULL)) {
        TU_CHECK_ERR(ditd_model_info_load(dir, &mi), DITD_ENOENT, "image branch", "image_encoder");
        n++;
    }
    /* TI2V-5B's image mode is not built */
    if (!variant(tmp, "i2v21", IDX_HEAD IDX_IMG ", \"expand_timesteps\": true}", NULL, NULL)) {
        TU_CHECK_ERR(ditd_model_info_load(dir, &mi), DITD_EUNSUPPORTED, "expand_timesteps");
        n++;
    }
    /* a 16-channel transformer has no room for the condition */
    if (!variant(tmp, "i2v22", IDX_HEAD "}", "wan21", NULL)) {
        TU_CHECK_ERR(ditd_model_info_load(dir, &mi), DITD_EUNSUPPORTED, "in_channels 16",
                     "4 mask channels");
        n++;
    }
    /* a processor key ditd does not know; a crop the tower cannot take */
    static const char *const procs[][2] = {
        {"{\"size\": {\"shortest_edge\": 36}, \"crop_size\": {\"height\": 32, \"width\": 32}, "
         "\"do_pad\": true}", "\"do_pad\""},
        {"{\"size\": {\"shortest_edge\": 36}, \"crop_size\": {\"height\": 30, \"width\": 30}}",
         "makes 30x30"},
        {"{\"size\": {\"longest_edge\": 36}}", "shortest_edge"},
        {"{\"resample\": 4}", "resample 4"},
    };
    for (size_t i = 0; i < sizeof procs / sizeof procs[0]; i++) {
        if (variant(tmp, "i2v21", IDX_HEAD IDX_IMG "}", NULL, procs[i][0]))
            continue;
        TU_OK(ditd_model_info_load(dir, &mi));
        int e = ditd_image_cond_new(&mi, &ditd_backend_cpu, 48, 48, &ic);
        TU_CHECK(e != 0 && ic == NULL && strstr(ditd_err_detail(), procs[i][1]),
                 "processor %s refused naming %s (%d: %s)", procs[i][0], procs[i][1], e,
                 ditd_err_detail());
        ditd_image_cond_free(ic);
        ic = NULL;
        ditd_model_info_free(&mi);
        n++;
    }
    /* sizes and counts the condition does not take */
    if (!variant(tmp, "i2v22", IDX_HEAD "}", NULL, NULL) && !ditd_model_info_load(dir, &mi)) {
        uint8_t px[16 * 16 * 3] = {0};
        float cnd[20 * 3 * 4 * 4];
        TU_OK(ditd_image_cond_new(&mi, &ditd_backend_cpu, 32, 32, &ic));
        if (ic) {
            TU_CHECK_ERR(ditd_image_cond_run(ic, px, 16, 16, NULL, 0, 0, 9, 48, 32, cnd, NULL),
                         DITD_EINVAL, "48x32 clip");
            TU_CHECK_ERR(ditd_image_cond_run(ic, px, 16, 16, NULL, 0, 0, 8, 32, 32, cnd, NULL),
                         DITD_EINVAL, "8 frames");
            TU_CHECK_ERR(ditd_image_cond_run(ic, px, 16, 16, NULL, 0, 0, 9, 20, 32, cnd, NULL),
                         DITD_EINVAL, "multiples of 8");
            TU_OK(ditd_image_cond_run(ic, px, 16, 16, NULL, 0, 0, 9, 32, 32, cnd, NULL));
            n += 4;
        }
        ditd_image_cond_free(ic);
        ditd_model_info_free(&mi);
    }
    snprintf(dir, sizeof dir, "rm -rf '%s'", tmp);
    if (system(dir) != 0)
        TU_CHECK(0, "removing %s", tmp);
    return n;
}

int main(void)
{
    char path[8192];
    json_error_t je;
    snprintf(exp_dir, sizeof exp_dir, "%s/wan_pipeline/expected_i2v", tu_fixtures());
    int nv = clip_vision_checks();
    TU_CHECK(nv >= 10 + 4, "%d resize / CLIP vision checks (at least 14)", nv);
    snprintf(path, sizeof path, "%s/cases.json", exp_dir);
    json_t *m = json_load_file(path, 0, &je);
    TU_CHECK(m != NULL, "%s: %s", path, je.text);
    int n = 0;
    size_t i;
    json_t *c;
    json_array_foreach(json_object_get(m, "cases"), i, c) n += run_case(c);
    TU_CHECK(n >= 7, "%d image-to-video cases checked (at least 7)", n);
    /* WanPipeline takes no image: its row, and a sample carrying one */
    ditd_model_info t2v;
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/wan21", WAN_PIPELINE_DIR);
    if (ditd_model_info_load(dir, &t2v) == 0) {
        ditd_image_cond *ic = NULL;
        TU_CHECK_ERR(ditd_image_cond_new(&t2v, &ditd_backend_cpu, 32, 32, &ic), DITD_EUNSUPPORTED,
                     "takes no input image");
        TU_CHECK(!t2v.pipeline->image_to_video && t2v.cond_channels == 0, "WanPipeline row");
        ditd_model_info_free(&t2v);
    }
    int nr = refusals();
    TU_CHECK(nr >= 11, "%d refusals checked (at least 11)", nr);
    json_decref(m);
    return tu_exit();
}
