/* Step caching against Diffusers' own hooks (tools/make_cache_fixtures.py):
 * First Block Cache, MagCache (given ratios, FLUX's ratios interpolated,
 * calibration) and TaylorSeer (modules, whole blocks) on the tiny DiT fixture,
 * DiTPipeline's loop with guidance; First Block Cache and MagCache on the
 * tiny FLUX.1-dev folder with true CFG (a state per branch), and
 * TaylorSeer there in lite mode, with Diffusers' default config (every
 * block's attn: two streams) and on whole blocks; First Block Cache,
 * MagCache, its calibration and TaylorSeer (ff, ff_context; the default
 * config on attn; whole blocks) on the tiny SD3 folder with CFG ([uncond;
 * cond] under one state, as StableDiffusion3Pipeline runs them through the
 * hooks); the same on the tiny Wan 2.1 folder (WanPipeline's cond / uncond
 * contexts: a state per branch, calibrated per branch; TaylorSeer on attn1 /
 * attn2 / ffn, on whole blocks and in lite mode); First Block Cache and
 * TaylorSeer on the tiny Wan 2.2 folder (two experts, each hooked with
 * states of its own). At least 27 cases. Per case: the same steps skipped,
 * step by step, and the final latents within 1e-4 of Diffusers' float64 run; and
 * ditd's code allocates nothing on the host in the steps after the first.
 * Plus the config parser's refusals. */
#include <dlfcn.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/backend/backend.h"
#include "engine/core/error.h"
#include "engine/io/npy.h"
#include "engine/models/model.h"
#include "engine/pipeline/pipeline.h"
#include "engine/pipeline/step_cache.h"
#include "tests/test_util.h"

#define TOL 1e-4
#define MAX_STEPS 64

/* "Nothing allocated per step": the allocator's entry points count the
 * calls ditd's code (this program and the engine linked into it: the caller
 * lies in this object) makes on the main thread between the first step's
 * end and the last's (on_step turns counting on and off); glibc's own
 * functions do the work. Calls from other libraries are not counted: the
 * GEMM library (oneDNN) allocates per call inside itself (C++ operator new:
 * 6 a step here), which is not the cache's doing. */
/* volatile: the compiler takes malloc for a builtin that reads nothing */
static _Thread_local volatile int counting;
static volatile long step_allocs;
static const char self_marker; /* an address in this object */
#if defined(__SANITIZE_ADDRESS__) /* ASan's allocator owns malloc: nothing counted */
#define COUNT_ALLOCS 0
#else
#define COUNT_ALLOCS 1
extern void *__libc_malloc(size_t n);
extern void *__libc_calloc(size_t n, size_t m);
extern void *__libc_realloc(void *p, size_t n);

static void count(const void *caller)
{
    Dl_info self, at;
    if (counting && dladdr(&self_marker, &self) && dladdr(caller, &at) &&
        at.dli_fbase == self.dli_fbase)
        step_allocs++;
}

__attribute__((noinline)) void *malloc(size_t n)
{
    count(__builtin_return_address(0));
    return __libc_malloc(n);
}

__attribute__((noinline)) void *calloc(size_t n, size_t m)
{
    count(__builtin_return_address(0));
    return __libc_calloc(n, m);
}

__attribute__((noinline)) void *realloc(void *p, size_t n)
{
    count(__builtin_return_address(0));
    return __libc_realloc(p, n);
}
#endif

typedef struct step_log {
    ditd_pipeline *p;
    int n;
    int prev[2];
    uint8_t skipped[2][MAX_STEPS];
} step_log;

/* after every step: did the step skip for each sample (its steps_skipped grew) */
static int on_step(void *ud, int step, int total, const float *x0, uint8_t *active)
{
    step_log *l = ud;
    (void)x0, (void)active;
    counting = 0;
    for (int i = 0; i < l->n; i++) {
        ditd_cache_stats st;
        ditd_pipeline_cache_stats(l->p, i, &st);
        if (step - 1 < MAX_STEPS)
            l->skipped[i][step - 1] = (uint8_t)(st.steps_skipped > l->prev[i]);
        l->prev[i] = st.steps_skipped;
    }
    if (step == 1)
        step_allocs = 0;
    counting = step < total; /* the steps after the first: the cache's buffers are planned */
    return 0;
}

static int config_from_json(const char *method, json_t *fields, ditd_cache_config *cfg)
{
    const char *key;
    json_t *v;
    int err;
    if ((err = ditd_cache_method_from_str(method, &cfg->method)))
        return err;
    ditd_cache_config_default(cfg->method, cfg);
    json_object_foreach(fields, key, v) {
        char buf[64];
        if (json_is_array(v)) {
            size_t n = json_array_size(v), i;
            const char *items[DITD_CACHE_MAX_RATIOS];
            char num[DITD_CACHE_MAX_RATIOS][32];
            json_t *e;
            json_array_foreach(v, i, e) {
                if (json_is_string(e)) {
                    items[i] = json_string_value(e);
                } else {
                    snprintf(num[i], sizeof num[i], "%.17g", json_number_value(e));
                    items[i] = num[i];
                }
            }
            err = ditd_cache_config_set_list(cfg, key, items, (int)n);
        } else if (json_is_string(v)) {
            err = ditd_cache_config_set(cfg, key, json_string_value(v));
        } else if (json_is_boolean(v)) {
            err = ditd_cache_config_set(cfg, key, json_is_true(v) ? "true" : "false");
        } else if (json_is_null(v)) {
            err = ditd_cache_config_set(cfg, key, "None");
        } else {
            snprintf(buf, sizeof buf, json_is_integer(v) ? "%.0f" : "%.17g", json_number_value(v));
            err = ditd_cache_config_set(cfg, key, buf);
        }
        if (err)
            return err;
    }
    return ditd_cache_config_check(cfg);
}

/* A fixture array of up to 5 dimensions; *numel1: the elements past the
 * first dimension (one sample's), when numel1 is given */
static float *load_n(const char *dir, const char *name, int64_t *shape, size_t *numel1)
{
    char path[4300];
    float *d = NULL;
    int nd = 0;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    TU_OK(ditd_npy_read_f32(path, 5, &nd, shape, &d));
    if (numel1) {
        *numel1 = 1;
        for (int i = 1; i < nd; i++)
            *numel1 *= (size_t)shape[i];
    }
    return d;
}

static float *load(const char *dir, const char *name, int64_t *shape)
{
    return load_n(dir, name, shape, NULL);
}

/* One case on pipeline p: the same steps skipped as Diffusers, step by
 * step, and the final latents within TOL. Returns 1 when it ran. */
static int run_one(ditd_pipeline *p, json_t *c, int n, const ditd_gen_sample *samples,
                   ditd_sampler_kind sampler, int *skips_seen, int *computes_seen)
{
    char dir[4096];
    const char *name = json_string_value(json_object_get(c, "name"));
    int steps = (int)json_integer_value(json_object_get(c, "steps")), ran = 0;
    int64_t sn[5], so[5];
    size_t numel = 0, numel_o = 0;
    ditd_cache_config cfg;
    step_log lg = {.p = p, .n = n};
    snprintf(dir, sizeof dir, "%s/cache", tu_fixtures());
    float *noise = load_n(dir, json_string_value(json_object_get(c, "noise")), sn, &numel);
    float *want = load_n(dir, json_string_value(json_object_get(c, "out")), so, &numel_o);
    ditd_gen_params gp = {.steps = steps, .sampler = sampler};
    TU_OK(config_from_json(json_string_value(json_object_get(c, "method")),
                           json_object_get(c, "fields"), &cfg));
    TU_OK(ditd_pipeline_set_cache(p, &cfg));
    TU_CHECK(n >= 1 && n <= 2 && steps <= MAX_STEPS && numel == numel_o, "%s: %d samples, %d steps, %zu / %zu elements", name, n,
             steps, numel, numel_o);
    if (!noise || !want || n < 1 || n > 2 || steps > MAX_STEPS || numel != numel_o)
        goto out;
    float *got = calloc((size_t)n * numel, sizeof *got), *plain = calloc((size_t)n * numel, sizeof *plain);
    TU_OK(ditd_pipeline_generate(p, &gp, n, samples, noise, got, NULL, on_step, &lg));
    counting = 0;
    TU_CHECK(step_allocs == 0, "%s: %ld allocations in steps 2..%d", name, step_allocs, steps);
    /* the same steps skipped, step by step */
    json_t *per = json_object_get(c, "skipped_per_sample");
    int case_skips = 0, case_computes = 0;
    for (int i = 0; i < n; i++) {
        json_t *want_sk = per ? json_array_get(per, (size_t)i) : json_object_get(c, "skipped");
        char got_s[MAX_STEPS + 1], want_s[MAX_STEPS + 1];
        for (int s = 0; s < steps; s++) {
            int w = json_is_true(json_array_get(want_sk, (size_t)s));
            got_s[s] = lg.skipped[i][s] ? 'S' : '.';
            want_s[s] = w ? 'S' : '.';
            *skips_seen += w;
            *computes_seen += !w;
            case_skips += w;
            case_computes += !w;
        }
        got_s[steps] = want_s[steps] = 0;
        TU_CHECK(!strcmp(got_s, want_s), "%s sample %d: skipped steps %s here, %s in Diffusers",
                 name, i, got_s, want_s);
        printf("%s %s sample %d: steps %s (S = skipped)\n", strcmp(got_s, want_s) ? "FAIL" : "ok  ",
               name, i, got_s);
        ditd_cache_stats st;
        ditd_pipeline_cache_stats(p, i, &st);
        TU_CHECK(st.steps == steps, "%s: %d steps counted", name, st.steps);
        printf("     %s: %d of %d steps skipped, %ld of %ld evaluations skipped\n", name,
               st.steps_skipped, st.steps, st.evals_skipped, st.evals);
        /* per branch (FluxPipeline's cond / uncond contexts): the
         * evaluations Diffusers skipped in both */
        json_t *br = json_object_get(c, "skipped_branches");
        if (br) {
            int L = p->den->cache_blocks, per_skip = 0;
            const char *m = json_string_value(json_object_get(c, "method"));
            for (size_t b = 0; b < json_array_size(br); b++)
                for (int s = 0; s < steps; s++)
                    per_skip += json_is_true(json_array_get(json_array_get(br, b), (size_t)s));
            long want_ev = (long)per_skip * (strcmp(m, "mag_cache") ? L - 1 : L);
            TU_CHECK(st.evals_skipped == want_ev && st.evals == 2L * steps * L,
                     "%s: %ld of %ld block evaluations skipped, Diffusers %ld of %ld", name,
                     st.evals_skipped, st.evals, want_ev, 2L * steps * L);
        }
    }
    /* the case can tell: Diffusers skipped some of its steps and computed
     * others (a calibration run computes every step) */
    if (!cfg.calibrate)
        TU_CHECK(case_skips > 0 && case_computes > 0, "%s: Diffusers skipped %d, computed %d steps",
                 name, case_skips, case_computes);
    /* calibration: the ratios MagCacheBlockHook measures */
    /* calibration_branches: one list per branch (a pipeline with cond /
     * uncond contexts), else "calibration" for the one shared state */
    json_t *cal_br = json_object_get(c, "calibration_branches");
    size_t n_br = cal_br ? json_array_size(cal_br) : 1;
    for (size_t b = 0; b < n_br && (cal_br || json_object_get(c, "calibration")); b++) {
        json_t *cal = cal_br ? json_array_get(cal_br, b) : json_object_get(c, "calibration");
        int nc = 0;
        const float *r = ditd_step_cache_calibration(p->scache, 0, (int)b, &nc);
        TU_CHECK(nc == (int)json_array_size(cal), "%s: %d ratios, want %zu", name, nc,
                 json_array_size(cal));
        double worst = 0;
        for (int s = 0; s < nc && s < (int)json_array_size(cal); s++) {
            double w = json_number_value(json_array_get(cal, (size_t)s));
            double e = fabs(r[s] - w) / fabs(w);
            worst = e > worst ? e : worst;
        }
        TU_CHECK(worst <= 1e-5, "%s: calibration ratios off by %.3g", name, worst);
        printf("%s %s branch %zu: %d calibration ratios within %.3g of Diffusers' (first %.6g, last %.6g)\n",
               worst <= 1e-5 ? "ok  " : "FAIL", name, b, nc, worst, nc ? (double)r[0] : 0.0,
               nc ? (double)r[nc - 1] : 0.0);
    }
    TU_CLOSE(name, got, want, (size_t)n * numel, TOL);
    /* the test can fail: where steps were skipped, the cached result is not
     * the uncached one */
    TU_OK(ditd_pipeline_set_cache(p, NULL));
    TU_OK(ditd_pipeline_generate(p, &gp, n, samples, noise, plain, NULL, NULL, NULL));
    tu_err e = tu_compare(plain, want, (size_t)n * numel);
    int any_skip = 0;
    for (int i = 0; i < n; i++)
        for (int s = 0; s < steps; s++)
            any_skip |= lg.skipped[i][s];
    if (any_skip) {
        TU_CHECK(e.rel > 100 * TOL, "%s: uncached run only %.3g from the cached reference", name,
                 e.rel);
        printf("     %s: uncached latents are %.3g from the cached reference\n", name, e.rel);
    }
    ran = 1;
    free(got);
    free(plain);
out:
    free(noise);
    free(want);
    return ran;
}

/* The cases of one text family (c.family): the pipeline on the assembled
 * folder mdir, each case's embeddings, noise and size from its pipeline
 * fixture (<family>_pipeline/expected, case c.<family>_case). */
static int family_cases(json_t *doc, const char *family, const char *fixture, const char *mdir,
                        int *skips_seen, int *computes_seen)
{
    char edir[4096], fpath[4300], key[64];
    json_error_t jerr;
    json_t *fdoc = NULL, *c;
    ditd_model_info info;
    ditd_pipeline *p = NULL;
    float *emb = NULL, *pool = NULL, *nemb = NULL, *npool = NULL;
    int ran = 0, sd3 = !strcmp(fixture, "sd3"), wan = !strcmp(fixture, "wan");
    size_t k;

    snprintf(edir, sizeof edir, "%s/%s_pipeline/expected", tu_fixtures(), fixture);
    snprintf(key, sizeof key, "%s_case", family);
    TU_OK(ditd_model_info_load(mdir, &info));
    TU_OK(ditd_pipeline_new(&info, &ditd_backend_cpu, 1, &p));
    json_array_foreach(json_object_get(doc, "cases"), k, c) {
        const char *fam = json_string_value(json_object_get(c, "family"));
        if (!fam || strcmp(fam, family) || !p)
            continue;
        int64_t sh[5];
        if (!fdoc) {
            snprintf(fpath, sizeof fpath, "%s/cases.json", edir);
            fdoc = json_load_file(fpath, 0, &jerr);
            TU_CHECK(fdoc != NULL, "%s: %s", fpath, jerr.text);
        }
        json_t *fc = NULL, *e;
        size_t j;
        json_array_foreach(json_object_get(fdoc, "cases"), j, e)
            if (!strcmp(json_string_value(json_object_get(e, "name")),
                        json_string_value(json_object_get(c, key))))
                fc = e;
        TU_CHECK(fc != NULL, "%s case %s", family, json_string_value(json_object_get(c, key)));
        if (!fc)
            continue;
        free(emb), free(pool), free(nemb), free(npool);
        emb = load(edir, json_string_value(json_object_get(fc, "prompt_embeds")), sh);
        pool = wan ? NULL : load(edir, json_string_value(json_object_get(fc, "pooled")), sh);
        nemb = load(edir, json_string_value(json_object_get(fc, "negative_prompt_embeds")), sh);
        npool = wan ? NULL : load(edir, json_string_value(json_object_get(fc, "negative_pooled")), sh);
        /* FLUX's and Wan's text is max_sequence_length T5 tokens, SD3's 77
         * CLIP + that; Wan's latents have frames */
        int lh = (int)json_integer_value(json_object_get(fc, "latent_height"));
        int lw = (int)json_integer_value(json_object_get(fc, "latent_width"));
        int T = (int)json_integer_value(json_object_get(fc, sd3 ? "text_len" : "max_sequence_length"));
        if (wan)
            TU_OK(ditd_pipeline_set_video_size(
                p, (int)json_integer_value(json_object_get(fc, "latent_frames")), lh, lw, T));
        else
            TU_OK(ditd_pipeline_set_size(p, lh, lw, T));
        ditd_text_embeds te[2] = {{.seq = emb, .pooled = pool}, {.seq = nemb, .pooled = npool}};
        ditd_gen_sample smp = {.guidance = (float)json_number_value(json_object_get(fc, "guidance_scale")),
                               .true_cfg = sd3 || wan ? 1.0f
                                                      : (float)json_number_value(json_object_get(fc, "true_cfg_scale"))};
        smp.cond.prompt = &te[0];
        smp.cond.negative = &te[1];
        json_t *g2 = json_object_get(fc, "guidance_scale_2"); /* two experts */
        if (json_is_number(g2)) {
            smp.has_guidance_2 = 1;
            smp.guidance_2 = (float)json_number_value(g2);
        }
        if (emb && nemb && (wan || (pool && npool)))
            ran += run_one(p, c, 1, &smp, p->sched_base.kind, skips_seen, computes_seen);
    }
    free(emb), free(pool), free(nemb), free(npool);
    json_decref(fdoc);
    ditd_pipeline_free(p);
    ditd_model_info_free(&info);
    return ran;
}

static int run_cases(void)
{
    char dir[4096], mdir[4096], path[4300];
    json_error_t jerr;
    json_t *doc, *c;
    ditd_model_info info;
    ditd_pipeline *p = NULL;
    size_t k;
    int ran = 0, skips_seen = 0, computes_seen = 0;

    snprintf(dir, sizeof dir, "%s/cache", tu_fixtures());
    snprintf(mdir, sizeof mdir, "%s/models/tiny-p2-c1-h6", tu_fixtures());
    snprintf(path, sizeof path, "%s/cases.json", dir);
    doc = json_load_file(path, 0, &jerr);
    TU_CHECK(doc != NULL, "%s: %s", path, jerr.text);
    if (!doc)
        return 0;
    TU_OK(ditd_model_info_load(mdir, &info));
    TU_OK(ditd_pipeline_new(&info, &ditd_backend_cpu, 2, &p));
    if (!p)
        goto done;
    json_array_foreach(json_object_get(doc, "cases"), k, c) {
        if (json_object_get(c, "family"))
            continue;
        json_t *labels = json_object_get(c, "class_labels");
        int n = (int)json_array_size(labels);
        ditd_gen_sample samples[2];
        for (int i = 0; i < n && i < 2; i++) {
            memset(&samples[i], 0, sizeof samples[i]);
            samples[i].index = (uint64_t)i;
            samples[i].cond.class_id = json_integer_value(json_array_get(labels, (size_t)i));
            samples[i].guidance = (float)json_number_value(json_object_get(c, "guidance_scale"));
        }
        ran += run_one(p, c, n, samples, DITD_SAMPLER_FLOW_EULER, &skips_seen, &computes_seen);
    }
    /* FLUX.1-dev, true CFG: a state per branch (FluxPipeline's contexts);
     * SD3, CFG: [uncond; cond] under one state */
    ran += family_cases(doc, "flux", "flux", FLUX_PIPELINE_DIR "/dev", &skips_seen, &computes_seen);
    ran += family_cases(doc, "sd3", "sd3", SD3_PIPELINE_DIR "/sd3", &skips_seen, &computes_seen);
    /* Wan 2.1, CFG: WanPipeline's cond / uncond contexts, a state per branch;
     * Wan 2.2's two experts: a state per expert and branch */
    ran += family_cases(doc, "wan", "wan", WAN_PIPELINE_DIR "/wan21", &skips_seen, &computes_seen);
    ran += family_cases(doc, "wan22", "wan", WAN_PIPELINE_DIR "/wan22", &skips_seen,
                        &computes_seen);
    TU_CHECK(skips_seen > 0 && computes_seen > 0, "skipped %d, computed %d steps in all cases",
             skips_seen, computes_seen);
    printf("cases: %d; steps skipped %d, computed %d\n", ran, skips_seen, computes_seen);
done:
    ditd_pipeline_free(p);
    ditd_model_info_free(&info);
    json_decref(doc);
    return ran;
}

static void parser(void)
{
    ditd_cache_config c;
    TU_OK(ditd_cache_config_parse("none", &c));
    TU_CHECK(c.method == DITD_CACHE_NONE, "none");
    TU_OK(ditd_cache_config_parse("first_block_cache", &c));
    TU_CHECK(c.method == DITD_CACHE_FIRST_BLOCK && c.threshold == 0.05, "fbc default %g",
             c.threshold);
    TU_OK(ditd_cache_config_parse("first_block_cache:threshold=0.2", &c));
    TU_CHECK(c.threshold == 0.2, "threshold %g", c.threshold);
    TU_OK(ditd_cache_config_parse("mag_cache:mag_ratios=FLUX,threshold=0.1,max_skip_steps=2", &c));
    TU_CHECK(c.n_mag_ratios == 28 && c.mag_ratios[1] == 1.21094f && c.max_skip_steps == 2 &&
                 c.threshold == 0.1,
             "mag FLUX ratios: %d", c.n_mag_ratios);
    TU_OK(ditd_cache_config_parse("mag_cache:mag_ratios=1;1.1;0.9", &c));
    TU_CHECK(c.n_mag_ratios == 3 && c.mag_ratios[2] == 0.9f, "mag ratios list");
    TU_OK(ditd_cache_config_parse("taylorseer_cache:cache_interval=2,max_order=2,"
                                  "disable_cache_after_step=None,taylor_factors_dtype=torch.float32,"
                                  "cache_identifiers=transformer_blocks\\.\\d+",
                                  &c));
    TU_CHECK(c.cache_interval == 2 && c.max_order == 2 && c.disable_cache_after_step == -1 &&
                 c.taylor_factors_dtype == DITD_DTYPE_F32 && c.n_cache_identifiers == 1,
             "taylorseer fields");
    TU_CHECK(c.taylor_factors_dtype == DITD_DTYPE_F32, "dtype");
    ditd_cache_config d;
    TU_OK(ditd_cache_config_parse("taylorseer_cache:cache_interval=2,max_order=2,"
                                  "taylor_factors_dtype=float32,"
                                  "cache_identifiers=transformer_blocks\\.\\d+",
                                  &d));
    TU_CHECK(ditd_cache_config_equal(&c, &d), "equal configs");
    TU_OK(ditd_cache_config_parse("taylorseer_cache", &d));
    TU_CHECK(!ditd_cache_config_equal(&c, &d), "different configs");
    TU_CHECK(d.taylor_factors_dtype == DITD_DTYPE_BF16, "Diffusers' default dtype bfloat16");

    TU_CHECK_ERR(ditd_cache_config_parse("teacache", &c), DITD_EINVAL, "teacache");
    TU_CHECK_ERR(ditd_cache_config_parse("first_block_cache:max_order=2", &c), DITD_EINVAL,
                 "max_order");
    TU_CHECK_ERR(ditd_cache_config_parse("first_block_cache:threshold=abc", &c), DITD_EINVAL,
                 "abc");
    TU_CHECK_ERR(ditd_cache_config_parse("first_block_cache:threshold", &c), DITD_EINVAL,
                 "key=value");
    TU_CHECK_ERR(ditd_cache_config_parse("first_block_cache:threshold=-1", &c), DITD_EINVAL,
                 "threshold");
    TU_CHECK_ERR(ditd_cache_config_parse("mag_cache", &c), DITD_EINVAL, "mag_ratios");
    TU_CHECK_ERR(ditd_cache_config_parse("mag_cache:calibrate=maybe", &c), DITD_EINVAL,
                 "maybe");
    TU_CHECK_ERR(ditd_cache_config_parse("taylorseer_cache:cache_interval=0", &c), DITD_EINVAL,
                 "cache_interval");
    TU_CHECK_ERR(ditd_cache_config_parse("taylorseer_cache:disable_cache_before_step=0", &c),
                 DITD_EINVAL, "before any step");
    TU_CHECK_ERR(ditd_cache_config_parse("taylorseer_cache:taylor_factors_dtype=float16", &c),
                 DITD_EINVAL, "float16");
    TU_CHECK_ERR(ditd_cache_config_parse("none:threshold=1", &c), DITD_EINVAL, "none");
}

/* TaylorSeer with Diffusers' default patterns matches no DiT module (its
 * attention is attn1, the defaults end in "attn"): refused, naming them. */
static void refusals(void)
{
    char mdir[4096];
    ditd_model_info info;
    ditd_pipeline *p = NULL;
    ditd_cache_config cfg;
    snprintf(mdir, sizeof mdir, "%s/models/tiny-p2-c1-h6", tu_fixtures());
    TU_OK(ditd_model_info_load(mdir, &info));
    TU_OK(ditd_pipeline_new(&info, &ditd_backend_cpu, 1, &p));
    if (!p)
        return;
    float *noise = calloc(4 * 14 * 14, sizeof(float)), *out = calloc(4 * 14 * 14, sizeof(float));
    ditd_gen_sample s = {.cond.class_id = 1, .guidance = 1.0f};
    ditd_gen_params gp = {.steps = 3, .sampler = DITD_SAMPLER_FLOW_EULER};
    TU_OK(ditd_cache_config_parse("taylorseer_cache", &cfg));
    TU_OK(ditd_pipeline_set_cache(p, &cfg));
    TU_CHECK_ERR(ditd_pipeline_generate(p, &gp, 1, &s, noise, out, NULL, NULL, NULL), DITD_EINVAL,
                 "transformer_blocks.0.attn1");
    TU_OK(ditd_cache_config_parse("taylorseer_cache:use_lite_mode=true", &cfg));
    TU_OK(ditd_pipeline_set_cache(p, &cfg));
    TU_CHECK_ERR(ditd_pipeline_generate(p, &gp, 1, &s, noise, out, NULL, NULL, NULL), DITD_EINVAL,
                 "proj_out");
    /* and the pipeline still serves without a cache afterwards */
    cfg.cache_interval = 0;
    TU_CHECK_ERR(ditd_pipeline_set_cache(p, &cfg), DITD_EINVAL, "cache_interval");
    TU_OK(ditd_pipeline_set_cache(p, NULL));
    TU_OK(ditd_pipeline_generate(p, &gp, 1, &s, noise, out, NULL, NULL, NULL));
    TU_CHECK(p->den->cache == NULL, "no cache left on the model");
    free(noise);
    free(out);
    ditd_pipeline_free(p);
    ditd_model_info_free(&info);
}

int main(void)
{
    /* the allocation count can fail: it counts this object's calls, and
     * the engine is linked into this object */
    Dl_info self, eng;
    counting = 1;
    void *volatile probe = malloc(8);
    counting = 0;
    free(probe);
    TU_CHECK(step_allocs == COUNT_ALLOCS && dladdr(&self_marker, &self) &&
                 dladdr(&ditd_backend_cpu, &eng) && self.dli_fbase == eng.dli_fbase,
             "allocation counter: %ld for one malloc; the engine %s this object", step_allocs,
             self.dli_fbase == eng.dli_fbase ? "in" : "not in");
    parser();
    refusals();
    int ran = run_cases();
    TU_CHECK(ran >= 27, "ran %d cache cases (8 DiT, 5 FLUX, 6 SD3, 6 Wan 2.1, 2 Wan 2.2 expected)",
             ran);
    return tu_exit();
}
