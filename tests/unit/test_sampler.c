/* Unit tests of the samplers and the scheduler config (engine/pipeline/sampler.c).
 *
 * Numerics against Diffusers: tests/fixtures/samplers/ (written by
 * tools/make_sampler_fixtures.py with diffusers + torch) holds, for a few
 * hundred scheduler configs x step counts, Diffusers' timesteps and the
 * float32 trajectory from a fixed start under a fixed bank of "model
 * outputs". Every case runs here: the timesteps must be equal (exactly),
 * and every step's sample and x0 prediction within TOL of Diffusers'
 * (max |ours - theirs| / max |theirs| per step and sample). Cases Diffusers
 * fails on (or ditd refuses by design) must be refused. The FLUX cases
 * carry "image_seq_len": dynamic shifting's schedule at that token count.
 *
 * Then the config edge: bad JSON, unknown classes, unsupported values (the
 * detail names file, key and value), lazy tu_checks of keys a class does not
 * read, from_config semantics, and the sampler's argument tu_checks.
 */
#include "engine/pipeline/sampler.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "ditd_build_config.h"
#include "engine/core/error.h"
#include "engine/io/npy.h"
#include "tests/test_util.h"

/* Diffusers computes every coefficient in float32 and so do we, with the
 * same operations in the same order; what is left is torch's own float32
 * sqrt/log/exp (vector math, within an ulp but not correctly rounded)
 * against libm's, so a coefficient can differ by an ulp. Measured: at most
 * 2.2e-6 over all cases below. A DPM-Solver step whose terms cancel (the
 * fixture's "cond": sum of |terms| / |result|, up to 2.4e4 for "dpmsolver"
 * at sigma 2e4) magnifies that ulp by cond: such a case gets
 * FLT_EPSILON x cond when that is larger. */
#define TOL 5e-6




static float *load_npy(const char *name, int want_ndim, int64_t *shape)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/samplers/%s", tu_fixtures(), name);
    int ndim = 0;
    float *data = NULL;
    int err = ditd_npy_read_f32(path, 8, &ndim, shape, &data);
    TU_CHECK(err == 0 && ndim == want_ndim, "%s: %s %s, ndim %d", path, ditd_err_name(err),
          ditd_err_detail(), ndim);
    if (err || ndim != want_ndim) {
        free(data);
        return NULL;
    }
    return data;
}

static double rel_err(const float *a, const float *b, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (!(d <= num))
            num = d; /* NaN wins */
        if (fabs((double)b[i]) > den)
            den = fabs((double)b[i]);
    }
    return den > 0 ? num / den : num;
}

/* Parses a case's config and converts it to the case's sampler. */
static int case_config(const json_t *c, const char *name, ditd_sched_config *cfg)
{
    const char *text = json_string_value(json_object_get(c, "config"));
    ditd_sampler_kind kind;
    int err = ditd_sched_config_parse(text, strlen(text), name, cfg);
    if (!err)
        err = ditd_sampler_kind_from_str(json_string_value(json_object_get(c, "sampler")), &kind);
    if (!err && kind != cfg->kind)
        err = ditd_sched_config_convert(cfg, kind, cfg);
    const json_t *seq = json_object_get(c, "image_seq_len");
    if (seq) { /* dynamic: made as FluxPipeline calls it, sigmas linspace(1, 1/steps) */
        cfg->image_seq_len = (int)json_integer_value(seq);
        cfg->pipeline_sigmas = cfg->use_dynamic_shifting;
    }
    return err;
}

/* One fixture set: index.json (tools/make_sampler_fixtures.py: DDIM,
 * DPM-Solver, flow Euler) or unipc_index.json (tools/make_unipc_fixtures.py:
 * UniPC, with the conversions to and from it). */
static void test_fixtures(const char *index_name)
{
    char path[1024];
    const int unipc = strstr(index_name, "unipc") != NULL;
    snprintf(path, sizeof path, "%s/samplers/%s", tu_fixtures(), index_name);
    json_error_t jerr;
    json_t *root = json_load_file(path, 0, &jerr);
    TU_CHECK(root != NULL, "%s: %s", path, jerr.text);
    if (!root)
        return;

    int64_t s_init[8], s_bank[8], s_traj[8];
    float *init = load_npy(json_string_value(json_object_get(root, "init")), 4, s_init);
    float *bank = load_npy(json_string_value(json_object_get(root, "bank")), 5, s_bank);
    float *traj = load_npy(json_string_value(json_object_get(root, "traj")), 4, s_traj);
    if (!init || !bank || !traj)
        goto done;
    const size_t B = (size_t)s_init[0], numel = (size_t)(s_init[1] * s_init[2] * s_init[3]);
    TU_CHECK(B == 2 && s_traj[1] == 2 && (size_t)s_traj[3] == numel, "fixture shapes");
    if (B != 2 || (size_t)s_traj[3] != numel)
        goto done;
    const int bank_steps = (int)s_bank[0];

    double worst[DITD_SAMPLER_KIND_COUNT] = {0}, worst_x0[DITD_SAMPLER_KIND_COUNT] = {0};
    const char *worst_case[DITD_SAMPLER_KIND_COUNT] = {0};
    int ran[DITD_SAMPLER_KIND_COUNT] = {0}, refused = 0, steps_run = 0, ran_dynamic = 0;
    int dyn_types[2] = {0}, dyn_terminal = 0, wan_steps[2][51] = {{0}}, unipc_kinds[8] = {0};
    double worst_flow_sigmas = 0; /* UniPC on flow sigmas (Wan), sample or x0 */
    double worst_scaled = 0;
    const char *worst_scaled_case = "-";
    float x[2][64], x0[2][64];

    size_t ci;
    const json_t *c;
    json_array_foreach(json_object_get(root, "cases"), ci, c) {
        const char *name = json_string_value(json_object_get(c, "name"));
        const int steps = (int)json_integer_value(json_object_get(c, "steps"));
        ditd_sched_config cfg;
        ditd_sampler *s = NULL;
        ditd_err_clear();
        int err = case_config(c, name, &cfg);
        if (!err)
            err = ditd_sampler_new(&cfg, steps, 2, numel, &s);

        if (json_object_get(c, "error")) {
            TU_CHECK(err == DITD_EUNSUPPORTED, "%s: Diffusers: %s; ditd: %s \"%s\"", name,
                  json_string_value(json_object_get(c, "error")), ditd_err_name(err),
                  ditd_err_detail());
            refused++;
            ditd_sampler_free(s);
            continue;
        }
        TU_CHECK(err == 0, "%s: %s \"%s\"", name, ditd_err_name(err), ditd_err_detail());
        if (err)
            continue;

        /* timesteps, exactly */
        const json_t *ts = json_object_get(c, "timesteps");
        const int n = ditd_sampler_num_steps(s);
        TU_CHECK(n == (int)json_array_size(ts), "%s: %d steps, Diffusers %zu", name, n,
              json_array_size(ts));
        const float *ours = ditd_sampler_timesteps(s);
        for (int i = 0; i < n && i < (int)json_array_size(ts); i++) {
            float want = (float)json_number_value(json_array_get(ts, (size_t)i));
            TU_CHECK(ours[i] == want, "%s: timestep %d: %.9g, Diffusers %.9g", name, i, ours[i],
                  want);
        }
        if (n != (int)json_array_size(ts) || n > bank_steps) {
            ditd_sampler_free(s);
            continue;
        }

        /* the trajectory, twice: slots in lockstep (a batch), then slot by
         * slot (slot 1 starts after slot 0 is done; state is per slot) */
        const size_t row0 = (size_t)json_integer_value(json_object_get(c, "row"));
        const json_t *jc = json_object_get(c, "cond");
        const double cond = jc ? json_number_value(jc) : 1.0;
        const double tol = fmax(TOL, FLT_EPSILON * cond);
        for (int pass = 0; pass < 2; pass++) {
            for (size_t b = 0; b < B; b++)
                memcpy(x[b], init + b * numel, sizeof(float) * numel);
            for (int outer = 0; outer < (pass ? 2 : n); outer++) {
                for (int inner = 0; inner < (pass ? n : 2); inner++) {
                    const int i = pass ? inner : outer, b = pass ? outer : inner;
                    const float *m = bank + ((size_t)i * B + (size_t)b) * numel;
                    err = ditd_sampler_step(s, i, b, m, x[b], x0[b]);
                    TU_CHECK(err == 0, "%s: step %d: %s", name, i, ditd_err_detail());
                    const float *want = traj + (((row0 + (size_t)i) * 2 + 0) * B + (size_t)b) * numel;
                    const float *want_x0 = traj + (((row0 + (size_t)i) * 2 + 1) * B + (size_t)b) * numel;
                    double e = rel_err(x[b], want, numel), e0 = rel_err(x0[b], want_x0, numel);
                    TU_CHECK(e <= tol && e0 <= tol,
                          "%s: step %d sample %d: rel err %.3g, x0 %.3g (tolerance %.3g)", name, i,
                          b, e, e0, tol);
                    if (cond > 10) {
                        if (!(e / cond <= worst_scaled)) {
                            worst_scaled = e / cond;
                            worst_scaled_case = name;
                        }
                    } else if (!(e <= worst[cfg.kind])) {
                        worst[cfg.kind] = e;
                        worst_case[cfg.kind] = name;
                    }
                    if (cond <= 10 && !(e0 <= worst_x0[cfg.kind]))
                        worst_x0[cfg.kind] = e0;
                    if (cfg.kind == DITD_SAMPLER_UNIPC && cfg.use_flow_sigmas)
                        worst_flow_sigmas = fmax(worst_flow_sigmas, fmax(e, e0));
                    steps_run++;
                }
            }
        }
        ran[cfg.kind]++;
        if (cfg.kind == DITD_SAMPLER_UNIPC) {
            /* Wan's configs: flow_prediction on flow sigmas, bh2, order 2 */
            if (cfg.use_flow_sigmas && cfg.prediction_type == DITD_SCHED_PRED_FLOW &&
                cfg.solver_type == DITD_SCHED_SOLVER_BH2 && cfg.solver_order == 2 &&
                cfg.lower_order_final && cfg.n_disable_corrector == 0 && !cfg.has_shift_terminal &&
                cfg.final_sigmas_type == DITD_SCHED_FINAL_ZERO && steps <= 50 &&
                (cfg.flow_shift == 3.0 || cfg.flow_shift == 5.0))
                wan_steps[cfg.flow_shift == 5.0][steps]++;
            unipc_kinds[0] += cfg.solver_type == DITD_SCHED_SOLVER_BH1;
            unipc_kinds[1] += cfg.solver_order == 1;
            unipc_kinds[2] += !cfg.predict_x0;
            unipc_kinds[3] += cfg.prediction_type == DITD_SCHED_PRED_EPSILON;
            unipc_kinds[4] += cfg.prediction_type == DITD_SCHED_PRED_V;
            unipc_kinds[5] += cfg.prediction_type == DITD_SCHED_PRED_SAMPLE;
            unipc_kinds[6] += cfg.n_disable_corrector > 0;
            unipc_kinds[7] += cfg.final_sigmas_type == DITD_SCHED_FINAL_SIGMA_MIN;
        }
        if (cfg.kind == DITD_SAMPLER_FLOW_EULER && cfg.use_dynamic_shifting) {
            ran_dynamic++;
            dyn_types[cfg.time_shift_type]++;
            dyn_terminal += cfg.has_shift_terminal;
        }
        ditd_sampler_free(s);
    }
    for (int k = 0; k < DITD_SAMPLER_KIND_COUNT; k++)
        printf("  %-10s %3d cases, max rel err (cond <= 10) sample %.3g (%s), x0 %.3g\n",
               ditd_sampler_kind_name((ditd_sampler_kind)k), ran[k], worst[k],
               worst_case[k] ? worst_case[k] : "-", worst_x0[k]);
    printf("  cases with cond > 10: max rel err / cond %.3g (%s)\n", worst_scaled,
           worst_scaled_case);
    printf("  %d refused as expected, %d sample-steps compared, tolerance %g\n", refused,
           steps_run, TOL);
    printf("  flow with dynamic shifting: %d cases (%d exponential, %d linear, %d with "
           "shift_terminal)\n",
           ran_dynamic, dyn_types[0], dyn_types[1], dyn_terminal);
    if (unipc) {
        int wan = 0;
        for (int sh = 0; sh < 2; sh++)
            for (int st = 1; st <= 50; st++) {
                TU_CHECK(wan_steps[sh][st] >= 1, "Wan flow_shift %s: no case of %d steps",
                         sh ? "5.0" : "3.0", st);
                wan += wan_steps[sh][st];
            }
        printf("  unipc: %d Wan cases (flow_shift 3.0 and 5.0, 1..50 steps); bh1 %d, order 1 %d, "
               "noise prediction %d, epsilon %d, v %d, sample %d, disable_corrector %d, "
               "sigma_min %d; max rel err on flow sigmas %.3g\n",
               wan, unipc_kinds[0], unipc_kinds[1], unipc_kinds[2], unipc_kinds[3], unipc_kinds[4],
               unipc_kinds[5], unipc_kinds[6], unipc_kinds[7], worst_flow_sigmas);
        TU_CHECK(ran[DITD_SAMPLER_UNIPC] >= 200 && refused >= 40, "too few UniPC cases: %d ran, %d refused",
                 ran[DITD_SAMPLER_UNIPC], refused);
        for (int i = 0; i < 8; i++)
            TU_CHECK(unipc_kinds[i] >= 3, "UniPC variant %d: only %d cases", i, unipc_kinds[i]);
        TU_CHECK(ran[DITD_SAMPLER_DDIM] >= 1 && ran[DITD_SAMPLER_DPMPP_2M] >= 1 &&
                     ran[DITD_SAMPLER_FLOW_EULER] >= 2,
                 "too few conversions from UniPC ran");
    } else {
        TU_CHECK(ran[0] >= 100 && ran[1] >= 100 && ran[2] >= 10, "too few cases ran");
        TU_CHECK(ran_dynamic >= 24 && dyn_types[0] >= 12 && dyn_types[1] >= 12 && dyn_terminal >= 10,
                 "too few dynamic shifting cases ran: %d", ran_dynamic);
    }

done:
    free(init);
    free(bank);
    free(traj);
    json_decref(root);
}

static int parse(const char *text, ditd_sched_config *c)
{
    return ditd_sched_config_parse(text, strlen(text), "sc.json", c);
}

static void test_config_errors(void)
{
    ditd_sched_config c;
    TU_CHECK_ERR(parse("{", &c), DITD_EFORMAT, "sc.json");
    TU_CHECK_ERR(parse("[1, 2]", &c), DITD_EFORMAT, "sc.json", "object");
    TU_CHECK_ERR(parse("{}", &c), DITD_EUNSUPPORTED, "sc.json", "_class_name", "(missing)");
    TU_CHECK_ERR(parse("{\"_class_name\": \"PNDMScheduler\"}", &c), DITD_EUNSUPPORTED, "sc.json",
              "_class_name \"PNDMScheduler\"", "DDIMScheduler");
    TU_CHECK_ERR(parse("{\"_class_name\": 3}", &c), DITD_EUNSUPPORTED, "_class_name 3");
    TU_CHECK_ERR(parse("{\"_class_name\": \"DDIMScheduler\", \"beta_schedule\": \"sigmoid\"}", &c),
              DITD_EUNSUPPORTED, "sc.json: beta_schedule \"sigmoid\" is not supported",
              "linear, scaled_linear, squaredcos_cap_v2");
    TU_CHECK_ERR(parse("{\"_class_name\": \"DDIMScheduler\", \"prediction_type\": \"flow_prediction\"}", &c),
              DITD_EUNSUPPORTED, "prediction_type \"flow_prediction\"", "v_prediction");
    TU_CHECK_ERR(parse("{\"_class_name\": \"DDIMScheduler\", \"timestep_spacing\": \"karras\"}", &c),
              DITD_EUNSUPPORTED, "timestep_spacing \"karras\"", "leading, trailing, linspace");
    TU_CHECK_ERR(parse("{\"_class_name\": \"DDIMScheduler\", \"thresholding\": true}", &c),
              DITD_EUNSUPPORTED, "thresholding true");
    TU_CHECK_ERR(parse("{\"_class_name\": \"DDIMScheduler\", \"trained_betas\": [0.1, 0.2]}", &c),
              DITD_EUNSUPPORTED, "trained_betas");
    TU_CHECK_ERR(parse("{\"_class_name\": \"DDIMScheduler\", \"clip_sample\": \"yes\"}", &c),
              DITD_EUNSUPPORTED, "clip_sample \"yes\"", "true, false");
    TU_CHECK_ERR(parse("{\"_class_name\": \"DDIMScheduler\", \"num_train_timesteps\": 1}", &c),
              DITD_EUNSUPPORTED, "num_train_timesteps 1");
    TU_CHECK_ERR(parse("{\"_class_name\": \"DDIMScheduler\", \"beta_end\": 1.5}", &c),
              DITD_EUNSUPPORTED, "beta_end 1.5");
    TU_CHECK_ERR(parse("{\"_class_name\": \"DPMSolverMultistepScheduler\", \"solver_order\": 3}", &c),
              DITD_EUNSUPPORTED, "solver_order 3", "1, 2");
    TU_CHECK_ERR(parse("{\"_class_name\": \"DPMSolverMultistepScheduler\", \"algorithm_type\": \"sde-dpmsolver++\"}", &c),
              DITD_EUNSUPPORTED, "algorithm_type \"sde-dpmsolver++\"");
    TU_CHECK_ERR(parse("{\"_class_name\": \"DPMSolverMultistepScheduler\", \"algorithm_type\": \"dpmsolver\"}", &c),
              DITD_EUNSUPPORTED, "final_sigmas_type \"zero\"", "dpmsolver");
    TU_CHECK_ERR(parse("{\"_class_name\": \"DPMSolverMultistepScheduler\", \"use_lu_lambdas\": true}", &c),
              DITD_EUNSUPPORTED, "use_lu_lambdas true");
    TU_CHECK_ERR(parse("{\"_class_name\": \"DPMSolverMultistepScheduler\", \"variance_type\": \"learned_range\"}", &c),
              DITD_EUNSUPPORTED, "variance_type");
    /* dynamic shifting: flow runs it (with the sequence length), DPM-Solver
     * refuses it */
    TU_CHECK_ERR(parse("{\"_class_name\": \"FlowMatchEulerDiscreteScheduler\", \"use_dynamic_shifting\": true}", &c),
              0, NULL);
    TU_CHECK(c.use_dynamic_shifting && c.base_shift == 0.5 && c.max_shift == 1.15 &&
                 c.base_image_seq_len == 256 && c.max_image_seq_len == 4096 &&
                 c.time_shift_type == DITD_SCHED_TIME_SHIFT_EXPONENTIAL && c.image_seq_len == 0,
             "flow dynamic shifting defaults");
    {
        ditd_sampler *ds = NULL;
        TU_CHECK_ERR(ditd_sampler_new(&c, 10, 1, 4, &ds), DITD_EINVAL, "use_dynamic_shifting true",
                     "image_seq_len 0");
        c.image_seq_len = 1024;
        TU_CHECK_ERR(ditd_sampler_new(&c, 10, 1, 4, &ds), 0, NULL);
        ditd_sampler_free(ds);
    }
    TU_CHECK_ERR(parse("{\"_class_name\": \"FlowMatchEulerDiscreteScheduler\", \"use_dynamic_shifting\": true, "
                       "\"time_shift_type\": \"cosine\"}", &c),
                 DITD_EUNSUPPORTED, "time_shift_type \"cosine\"", "exponential, linear");
    TU_CHECK_ERR(parse("{\"_class_name\": \"FlowMatchEulerDiscreteScheduler\", \"use_dynamic_shifting\": true, "
                       "\"base_shift\": null}", &c),
                 DITD_EUNSUPPORTED, "base_shift null");
    TU_CHECK_ERR(parse("{\"_class_name\": \"FlowMatchEulerDiscreteScheduler\", \"base_shift\": null, "
                       "\"max_shift\": null}", &c),
                 0, NULL); /* unused without dynamic shifting */
    TU_CHECK_ERR(parse("{\"_class_name\": \"FlowMatchEulerDiscreteScheduler\", \"use_dynamic_shifting\": true, "
                       "\"max_shift\": Infinity}", &c),
                 DITD_EUNSUPPORTED, "max_shift (not finite)");
    TU_CHECK_ERR(parse("{\"_class_name\": \"FlowMatchEulerDiscreteScheduler\", \"use_dynamic_shifting\": true, "
                       "\"max_image_seq_len\": 256}", &c),
                 DITD_EUNSUPPORTED, "max_image_seq_len 256");
    TU_CHECK_ERR(parse("{\"_class_name\": \"DPMSolverMultistepScheduler\", \"use_dynamic_shifting\": true}", &c),
              DITD_EUNSUPPORTED, "use_dynamic_shifting true");
    TU_CHECK_ERR(parse("{\"_class_name\": \"FlowMatchEulerDiscreteScheduler\", \"stochastic_sampling\": true}", &c),
              DITD_EUNSUPPORTED, "stochastic_sampling true");
    TU_CHECK_ERR(parse("{\"_class_name\": \"FlowMatchEulerDiscreteScheduler\", \"invert_sigmas\": true}", &c),
              DITD_EUNSUPPORTED, "invert_sigmas true");
    TU_CHECK_ERR(parse("{\"_class_name\": \"FlowMatchEulerDiscreteScheduler\", \"shift\": -1}", &c),
              DITD_EUNSUPPORTED, "shift -1");
    TU_CHECK_ERR(parse("{\"_class_name\": \"FlowMatchEulerDiscreteScheduler\", \"use_karras_sigmas\": true}", &c),
              DITD_EUNSUPPORTED, "use_karras_sigmas true");

    /* Keys a class does not read are kept, and checked only by a class
     * that reads them (Diffusers keeps them in the config too). */
    const char *flow_odd = "{\"_class_name\": \"FlowMatchEulerDiscreteScheduler\", "
                           "\"beta_schedule\": \"sigmoid\", \"solver_order\": 3, "
                           "\"thresholding\": true}";
    TU_CHECK_ERR(parse(flow_odd, &c), 0, NULL);
    ditd_sched_config d;
    TU_CHECK_ERR(ditd_sched_config_convert(&c, DITD_SAMPLER_DDIM, &d), DITD_EUNSUPPORTED,
              "beta_schedule \"sigmoid\"");
    const char *ddim_odd = "{\"_class_name\": \"DDIMScheduler\", \"solver_order\": 3, "
                           "\"_diffusers_version\": \"NaN\"}";
    TU_CHECK_ERR(parse(ddim_odd, &c), 0, NULL);
    TU_CHECK_ERR(ditd_sched_config_convert(&c, DITD_SAMPLER_DPMPP_2M, &d), DITD_EUNSUPPORTED,
              "(as DPMSolverMultistepScheduler): solver_order 3");
    TU_CHECK_ERR(parse("{\"_class_name\": \"DDIMScheduler\", \"use_dynamic_shifting\": true}", &c),
              0, NULL);
    TU_CHECK_ERR(ditd_sched_config_convert(&c, DITD_SAMPLER_DPMPP_2M, &d), DITD_EUNSUPPORTED,
              "use_dynamic_shifting true");
    TU_CHECK_ERR(ditd_sched_config_convert(&c, DITD_SAMPLER_FLOW_EULER, &d), 0, NULL);
    TU_CHECK(d.use_dynamic_shifting, "use_dynamic_shifting carries to flow");

    /* Python's -Infinity (as Diffusers saves lambda_min_clipped), but not
     * inside strings */
    TU_CHECK_ERR(parse("{\"_class_name\": \"DPMSolverMultistepScheduler\", "
                    "\"lambda_min_clipped\": -Infinity, \"x\": \"-Infinity NaN\"}", &c), 0, NULL);
    TU_CHECK(isinf(c.lambda_min_clipped) && c.lambda_min_clipped < 0, "lambda_min_clipped %g",
          c.lambda_min_clipped);
    TU_CHECK_ERR(parse("{\"_class_name\": \"DPMSolverMultistepScheduler\", "
                    "\"lambda_min_clipped\": NaN}", &c), DITD_EUNSUPPORTED, "lambda_min_clipped nan");

    /* files */
    TU_CHECK_ERR(ditd_sched_config_load("/nonexistent/scheduler_config.json", &c), DITD_ENOENT,
              "/nonexistent/scheduler_config.json");
    char path[] = "/tmp/ditd_test_sampler_XXXXXX";
    int fd = mkstemp(path);
    TU_CHECK(fd >= 0, "mkstemp");
    if (fd >= 0) {
        const char *text = "{\"_class_name\": \"DDIMScheduler\", \"beta_schedule\": \"sigmoid\"}";
        TU_CHECK(write(fd, text, strlen(text)) == (ssize_t)strlen(text), "write");
        close(fd);
        TU_CHECK_ERR(ditd_sched_config_load(path, &c), DITD_EUNSUPPORTED, path, "beta_schedule");
        FILE *f = fopen(path, "w");
        if (f) {
            fputs("{\"_class_name\": \"DDIMScheduler\", \"clip_sample\": false}\n", f);
            fclose(f);
        }
        TU_CHECK_ERR(ditd_sched_config_load(path, &c), 0, NULL);
        TU_CHECK(!strcmp(c.source, path) && c.kind == DITD_SAMPLER_DDIM && !c.clip_sample,
              "loaded %s", c.source);
        unlink(path);
    }
}

/* UniPC's keys: Wan's config, every refusal naming key and value, the
 * solver_type rewrites, and from_config to and from the others. */
static void test_unipc_config(void)
{
    ditd_sched_config c, d;
#define U "{\"_class_name\": \"UniPCMultistepScheduler\", "
    const char *wan = U "\"beta_end\": 0.02, \"beta_schedule\": \"linear\", \"beta_start\": 0.0001, "
                      "\"disable_corrector\": [], \"dynamic_thresholding_ratio\": 0.995, "
                      "\"final_sigmas_type\": \"zero\", \"flow_shift\": 5.0, \"lower_order_final\": true, "
                      "\"num_train_timesteps\": 1000, \"predict_x0\": true, \"prediction_type\": "
                      "\"flow_prediction\", \"rescale_betas_zero_snr\": false, \"sample_max_value\": 1.0, "
                      "\"solver_order\": 2, \"solver_p\": null, \"solver_type\": \"bh2\", \"steps_offset\": 0, "
                      "\"thresholding\": false, \"timestep_spacing\": \"linspace\", \"trained_betas\": null, "
                      "\"use_beta_sigmas\": false, \"use_exponential_sigmas\": false, \"use_flow_sigmas\": true, "
                      "\"use_karras_sigmas\": false, \"time_shift_type\": \"exponential\", "
                      "\"use_dynamic_shifting\": false, \"sigma_min\": null, \"sigma_max\": null, "
                      "\"shift_terminal\": null}";
    TU_CHECK_ERR(parse(wan, &c), 0, NULL);
    TU_CHECK(c.kind == DITD_SAMPLER_UNIPC && c.use_flow_sigmas && c.flow_shift == 5.0 &&
                 c.prediction_type == DITD_SCHED_PRED_FLOW && c.solver_type == DITD_SCHED_SOLVER_BH2 &&
                 c.predict_x0 && c.solver_order == 2 && c.n_disable_corrector == 0 &&
                 !c.has_shift_terminal,
             "Wan's scheduler_config.json");
    TU_CHECK_ERR(parse(U "\"disable_corrector\": [0, 3, -1]}", &c), 0, NULL);
    TU_CHECK(c.n_disable_corrector == 3 && c.disable_corrector[1] == 3 && c.disable_corrector[2] == -1,
             "disable_corrector [0, 3, -1]");
    TU_CHECK_ERR(parse(U "\"x\": 0}", &c), 0, NULL);
    TU_CHECK(c.timestep_spacing == DITD_SCHED_SPACING_LINSPACE && c.solver_type == DITD_SCHED_SOLVER_BH2 &&
                 c.prediction_type == DITD_SCHED_PRED_EPSILON && !c.use_flow_sigmas && c.flow_shift == 1.0,
             "UniPC defaults");
    /* Diffusers' __init__ rewrites the other solvers' names to bh2 */
    TU_CHECK_ERR(parse(U "\"solver_type\": \"heun\"}", &c), 0, NULL);
    TU_CHECK(c.solver_type == DITD_SCHED_SOLVER_BH2, "heun -> bh2: %s", ditd_sched_solver_name(c.solver_type));
    TU_CHECK_ERR(parse(U "\"solver_type\": \"logrho\"}", &c), 0, NULL);
    TU_CHECK(c.solver_type == DITD_SCHED_SOLVER_BH2, "logrho -> bh2");
    TU_CHECK_ERR(parse("{\"_class_name\": \"DPMSolverMultistepScheduler\", \"solver_type\": \"bh1\"}", &c),
                 0, NULL);
    TU_CHECK(c.solver_type == DITD_SCHED_SOLVER_MIDPOINT, "DPM-Solver: bh1 -> midpoint");
    /* refusals, each naming the key and the value */
    TU_CHECK_ERR(parse(U "\"solver_order\": 3}", &c), DITD_EUNSUPPORTED, "solver_order 3", "1, 2",
                 "UniPCMultistepScheduler");
    TU_CHECK_ERR(parse(U "\"solver_type\": \"bh3\"}", &c), DITD_EUNSUPPORTED, "solver_type \"bh3\"", "bh2");
    TU_CHECK_ERR(parse(U "\"solver_p\": {\"x\": 1}}", &c), DITD_EUNSUPPORTED, "solver_p (not null)");
    TU_CHECK_ERR(parse(U "\"use_karras_sigmas\": true}", &c), DITD_EUNSUPPORTED, "use_karras_sigmas true");
    TU_CHECK_ERR(parse(U "\"use_exponential_sigmas\": true}", &c), DITD_EUNSUPPORTED,
                 "use_exponential_sigmas true");
    TU_CHECK_ERR(parse(U "\"use_beta_sigmas\": true}", &c), DITD_EUNSUPPORTED, "use_beta_sigmas true");
    TU_CHECK_ERR(parse(U "\"use_dynamic_shifting\": true}", &c), DITD_EUNSUPPORTED,
                 "use_dynamic_shifting true");
    TU_CHECK_ERR(parse(U "\"thresholding\": true}", &c), DITD_EUNSUPPORTED, "thresholding true");
    TU_CHECK_ERR(parse(U "\"trained_betas\": [0.1]}", &c), DITD_EUNSUPPORTED, "trained_betas");
    TU_CHECK_ERR(parse(U "\"prediction_type\": \"flow_prediction\", \"predict_x0\": false}", &c),
                 DITD_EUNSUPPORTED, "flow_prediction", "predict_x0 false");
    TU_CHECK_ERR(parse(U "\"shift_terminal\": 0.1}", &c), DITD_EUNSUPPORTED,
                 "shift_terminal without use_flow_sigmas");
    TU_CHECK_ERR(parse(U "\"use_flow_sigmas\": true, \"flow_shift\": 0}", &c), DITD_EUNSUPPORTED,
                 "flow_shift 0", "> 0");
    TU_CHECK_ERR(parse(U "\"use_flow_sigmas\": true, \"shift_terminal\": 1.5}", &c), DITD_EUNSUPPORTED,
                 "shift_terminal 1.5");
    TU_CHECK_ERR(parse(U "\"disable_corrector\": [1.5]}", &c), DITD_EUNSUPPORTED, "disable_corrector [1.5]",
                 "at most 32 integers");
    TU_CHECK_ERR(parse(U "\"disable_corrector\": 2}", &c), DITD_EUNSUPPORTED, "disable_corrector 2");
    TU_CHECK_ERR(parse(U "\"predict_x0\": \"yes\"}", &c), DITD_EUNSUPPORTED, "predict_x0 \"yes\"");
    TU_CHECK_ERR(parse(U "\"prediction_type\": \"x0\"}", &c), DITD_EUNSUPPORTED, "prediction_type \"x0\"",
                 "flow_prediction");
    TU_CHECK_ERR(parse("{\"_class_name\": \"DPMSolverMultistepScheduler\", \"use_flow_sigmas\": true}", &c),
                 DITD_EUNSUPPORTED, "use_flow_sigmas true", "DPMSolverMultistepScheduler");
    TU_CHECK_ERR(parse("{\"_class_name\": \"DPMSolverMultistepScheduler\", \"prediction_type\": "
                       "\"flow_prediction\"}", &c),
                 DITD_EUNSUPPORTED, "prediction_type \"flow_prediction\"", "use_flow_sigmas");
    /* a schedule whose last step Diffusers makes NaN, named */
    {
        ditd_sampler *ds = NULL;
        TU_CHECK_ERR(parse(U "\"use_flow_sigmas\": true, \"prediction_type\": \"flow_prediction\", "
                           "\"lower_order_final\": false}", &c), 0, NULL);
        TU_CHECK_ERR(ditd_sampler_new(&c, 10, 1, 4, &ds), DITD_EUNSUPPORTED, "10 steps", "step 9",
                     "lower_order_final false");
        TU_CHECK_ERR(parse(U "\"solver_type\": \"bh1\"}", &c), 0, NULL);
        TU_CHECK_ERR(ditd_sampler_new(&c, 4, 1, 4, &ds), DITD_EUNSUPPORTED, "step 3", "bh1");
        TU_CHECK_ERR(parse(wan, &c), 0, NULL);
        TU_CHECK_ERR(ditd_sampler_new(&c, 100001, 1, 4, &ds), DITD_ERANGE, "100001");
        TU_CHECK_ERR(ditd_sampler_new(&c, 5, 2, 4, &ds), 0, NULL);
        if (ds) {
            float m[4] = {1, 2, 3, 4}, x[4] = {0.5f, -1, 2, 0};
            TU_CHECK(ditd_sampler_get_kind(ds) == DITD_SAMPLER_UNIPC && ditd_sampler_num_steps(ds) == 5 &&
                         ditd_sampler_timesteps(ds)[0] == 999.0f,
                     "Wan 5 steps: first timestep %g", ditd_sampler_timesteps(ds)[0]);
            TU_CHECK_ERR(ditd_sampler_step(ds, 1, 0, m, x, NULL), DITD_EINVAL, "UniPC steps run in order");
            TU_CHECK_ERR(ditd_sampler_step(ds, 0, 0, m, x, NULL), 0, NULL);
            TU_CHECK_ERR(ditd_sampler_step(ds, 2, 0, m, x, NULL), DITD_EINVAL, "step 2 after step 0");
            TU_CHECK_ERR(ditd_sampler_step(ds, 0, 2, m, x, NULL), DITD_EINVAL, "slot 2");
            ditd_sampler_free(ds);
        }
    }
    /* from_config: Wan's UniPC as flow Euler keeps Euler's shift 1 (the file
     * says flow_shift, which FlowMatchEulerDiscreteScheduler does not read) */
    TU_CHECK_ERR(parse(wan, &c), 0, NULL);
    TU_CHECK_ERR(ditd_sched_config_convert(&c, DITD_SAMPLER_FLOW_EULER, &d), 0, NULL);
    TU_CHECK(d.kind == DITD_SAMPLER_FLOW_EULER && d.shift == 1.0 && !d.use_dynamic_shifting, "Wan -> flow Euler");
    TU_CHECK_ERR(ditd_sched_config_convert(&c, DITD_SAMPLER_DPMPP_2M, &d), DITD_EUNSUPPORTED,
                 "(as DPMSolverMultistepScheduler)", "flow");
    TU_CHECK_ERR(ditd_sched_config_convert(&c, DITD_SAMPLER_DDIM, &d), DITD_EUNSUPPORTED, "flow_prediction");
    /* DPM-Solver's heun becomes bh2, UniPC's bh1 becomes midpoint */
    TU_CHECK_ERR(parse("{\"_class_name\": \"DPMSolverMultistepScheduler\", \"solver_type\": \"heun\", "
                       "\"lower_order_final\": false}", &c), 0, NULL);
    TU_CHECK_ERR(ditd_sched_config_convert(&c, DITD_SAMPLER_UNIPC, &d), 0, NULL);
    TU_CHECK(d.solver_type == DITD_SCHED_SOLVER_BH2 && !d.lower_order_final && d.predict_x0 &&
                 d.timestep_spacing == DITD_SCHED_SPACING_LINSPACE,
             "DPM-Solver heun -> UniPC bh2");
    TU_CHECK_ERR(parse(U "\"solver_type\": \"bh1\", \"predict_x0\": false}", &c), 0, NULL);
    TU_CHECK_ERR(ditd_sched_config_convert(&c, DITD_SAMPLER_DPMPP_2M, &d), 0, NULL);
    TU_CHECK(d.solver_type == DITD_SCHED_SOLVER_MIDPOINT, "UniPC bh1 -> DPM-Solver midpoint");
    TU_CHECK_ERR(ditd_sched_config_convert(&d, DITD_SAMPLER_UNIPC, &c), 0, NULL);
    TU_CHECK(c.solver_type == DITD_SCHED_SOLVER_BH2 && !c.predict_x0,
             "... and back: midpoint -> bh2 (as Diffusers: the rewrite is in the config), predict_x0 kept");
#undef U
}

static void test_convert(void)
{
    ditd_sched_config c, d;
    /* A key the file left to DDIM's default does not carry: DPM-Solver
     * keeps its own default timestep_spacing. */
    TU_CHECK_ERR(parse("{\"_class_name\": \"DDIMScheduler\", \"clip_sample\": false, "
                    "\"beta_schedule\": \"scaled_linear\", \"prediction_type\": \"v_prediction\"}", &c),
              0, NULL);
    TU_CHECK(c.timestep_spacing == DITD_SCHED_SPACING_LEADING, "DDIM default spacing");
    TU_CHECK_ERR(ditd_sched_config_convert(&c, DITD_SAMPLER_DPMPP_2M, &d), 0, NULL);
    TU_CHECK(d.kind == DITD_SAMPLER_DPMPP_2M && d.timestep_spacing == DITD_SCHED_SPACING_LINSPACE &&
              d.beta_schedule == DITD_SCHED_BETA_SCALED_LINEAR &&
              d.prediction_type == DITD_SCHED_PRED_V && d.solver_order == 2,
          "converted: spacing %s beta %s pred %s", ditd_sched_spacing_name(d.timestep_spacing),
          ditd_sched_beta_name(d.beta_schedule), ditd_sched_prediction_name(d.prediction_type));
    /* ... a key it set does, and a key the target does not read rides
     * along to a third class */
    TU_CHECK_ERR(parse("{\"_class_name\": \"DDIMScheduler\", \"timestep_spacing\": \"leading\", "
                    "\"clip_sample\": false, \"shift\": 2.5}", &c), 0, NULL);
    TU_CHECK_ERR(ditd_sched_config_convert(&c, DITD_SAMPLER_DPMPP_2M, &d), 0, NULL);
    TU_CHECK(d.timestep_spacing == DITD_SCHED_SPACING_LEADING, "explicit spacing carries");
    TU_CHECK_ERR(ditd_sched_config_convert(&d, DITD_SAMPLER_DDIM, &d), 0, NULL);
    TU_CHECK(!d.clip_sample, "clip_sample rides through DPM-Solver back to DDIM");
    TU_CHECK_ERR(ditd_sched_config_convert(&d, DITD_SAMPLER_FLOW_EULER, &d), 0, NULL);
    TU_CHECK(d.shift == 2.5, "shift rides along: %g", d.shift);
    /* defaults */
    ditd_sched_config_init(&c, DITD_SAMPLER_DPMPP_2M);
    TU_CHECK_ERR(ditd_sched_config_check(&c), 0, NULL);
    TU_CHECK(c.lower_order_final && c.solver_order == 2 && isinf(c.lambda_min_clipped),
          "DPM defaults");
}

static void test_enums(void)
{
    ditd_sampler_kind k;
    const struct {
        const char *s;
        ditd_sampler_kind k;
    } ok[] = {
        {"ddim", DITD_SAMPLER_DDIM},           {"dpmpp-2m", DITD_SAMPLER_DPMPP_2M},
        {"dpm++2m", DITD_SAMPLER_DPMPP_2M},    {"dpmsolver++", DITD_SAMPLER_DPMPP_2M},
        {"flow-euler", DITD_SAMPLER_FLOW_EULER}, {"euler-flow", DITD_SAMPLER_FLOW_EULER},
        {"DDIMScheduler", DITD_SAMPLER_DDIM},
        {"FlowMatchEulerDiscreteScheduler", DITD_SAMPLER_FLOW_EULER},
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        TU_CHECK_ERR(ditd_sampler_kind_from_str(ok[i].s, &k), 0, NULL);
        TU_CHECK(k == ok[i].k, "%s -> %d", ok[i].s, (int)k);
    }
    TU_CHECK_ERR(ditd_sampler_kind_from_str("euler", &k), DITD_EINVAL, "\"euler\"", "ddim");
    TU_CHECK_ERR(ditd_sampler_kind_from_str(NULL, &k), DITD_EINVAL, NULL);
    for (int i = 0; i < DITD_SAMPLER_KIND_COUNT; i++) {
        TU_CHECK_ERR(ditd_sampler_kind_from_str(ditd_sampler_kind_name((ditd_sampler_kind)i), &k), 0, NULL);
        TU_CHECK((int)k == i, "kind round trip %d", i);
    }
    TU_CHECK(!strcmp(ditd_sampler_kind_name((ditd_sampler_kind)9), "?"), "out of range name");

#define ROUND_TRIP(prefix, type, count)                                                    \
    for (int i = 0; i < (count); i++) {                                                    \
        type v_;                                                                           \
        TU_CHECK_ERR(prefix##_from_str(prefix##_name((type)i), &v_), 0, NULL);                \
        TU_CHECK((int)v_ == i, #prefix " round trip %d", i);                                  \
    }                                                                                      \
    do {                                                                                   \
        type v_;                                                                           \
        TU_CHECK_ERR(prefix##_from_str("nope", &v_), DITD_EINVAL, "\"nope\"");                \
    } while (0)
    ROUND_TRIP(ditd_sched_beta, ditd_sched_beta, 3);
    ROUND_TRIP(ditd_sched_prediction, ditd_sched_prediction, 3);
    ROUND_TRIP(ditd_sched_spacing, ditd_sched_spacing, 3);
    ROUND_TRIP(ditd_sched_algorithm, ditd_sched_algorithm, 2);
    ROUND_TRIP(ditd_sched_solver, ditd_sched_solver, 2);
    ROUND_TRIP(ditd_sched_final_sigmas, ditd_sched_final_sigmas, 2);
#undef ROUND_TRIP
}

/* The sampler names are listed once (DITD_SAMPLER_KIND_MAP): the HTTP API's
 * document must list the same, in the same order, and the joined list
 * must hold every name. */
static void test_names_listed_once(void)
{
    char path[4096], list[256];
    json_error_t jerr;
    snprintf(path, sizeof path, "%s/proto/openapi.json", DITD_SOURCE_ROOT);
    json_t *root = json_load_file(path, 0, &jerr);
    TU_CHECK(root != NULL, "%s: %s", path, jerr.text);
    json_t *en = json_object_get(
        json_object_get(json_object_get(json_object_get(json_object_get(json_object_get(
                                                            root, "components"),
                                                        "schemas"),
                                        "CreateImageRequest"),
                        "properties"),
                        "sampler"),
        "enum");
    TU_CHECK(json_is_array(en) && json_array_size(en) == DITD_SAMPLER_KIND_COUNT,
             "openapi.json sampler enum has %zu names, the table %d", json_array_size(en),
             DITD_SAMPLER_KIND_COUNT);
    ditd_sampler_kind_list(" | ", list, sizeof list);
    for (int i = 0; i < DITD_SAMPLER_KIND_COUNT; i++) {
        const char *name = ditd_sampler_kind_name((ditd_sampler_kind)i);
        const char *doc = json_string_value(json_array_get(en, (size_t)i));
        TU_CHECK(doc && !strcmp(doc, name), "openapi.json sampler %d: %s, table: %s", i,
                 doc ? doc : "(none)", name);
        TU_CHECK(strstr(list, name) != NULL, "list \"%s\" lacks %s", list, name);
    }
    TU_CHECK(!strcmp(list, "ddim | dpmpp-2m | flow-euler | unipc"), "list: %s", list);
    json_decref(root);
}

static void test_sampler_args(void)
{
    ditd_sched_config c;
    ditd_sampler *s = NULL;
    float m[4] = {0.1f, -0.2f, 0.3f, 0.4f}, x[4] = {1, 2, 3, 4};
    ditd_sched_config_init(&c, DITD_SAMPLER_DPMPP_2M);
    TU_CHECK_ERR(ditd_sampler_new(&c, 0, 1, 4, &s), DITD_ERANGE, "num_inference_steps 0");
    TU_CHECK_ERR(ditd_sampler_new(&c, 1001, 1, 4, &s), DITD_ERANGE, "1001");
    TU_CHECK_ERR(ditd_sampler_new(&c, 10, 0, 4, &s), DITD_EINVAL, NULL);
    /* Diffusers' leading spacing + steps_offset can pass the last timestep */
    ditd_sched_config_init(&c, DITD_SAMPLER_DDIM);
    c.steps_offset = 1;
    TU_CHECK_ERR(ditd_sampler_new(&c, 1000, 1, 4, &s), DITD_EUNSUPPORTED, "timestep 1000");

    ditd_sched_config_init(&c, DITD_SAMPLER_DPMPP_2M);
    TU_CHECK_ERR(ditd_sampler_new(&c, 10, 2, 4, &s), 0, NULL);
    if (!s)
        return;
    TU_CHECK(ditd_sampler_num_steps(s) == 10 && ditd_sampler_timesteps(s)[0] == 999.0f &&
              ditd_sampler_get_kind(s) == DITD_SAMPLER_DPMPP_2M,
          "dpm 10 steps: t0 %g", ditd_sampler_timesteps(s)[0]);
    TU_CHECK_ERR(ditd_sampler_step(s, 10, 0, m, x, NULL), DITD_EINVAL, "step 10");
    TU_CHECK_ERR(ditd_sampler_step(s, 0, 2, m, x, NULL), DITD_EINVAL, "slot 2");
    TU_CHECK_ERR(ditd_sampler_step(s, 1, 0, m, x, NULL), DITD_EINVAL, "in order");
    TU_CHECK_ERR(ditd_sampler_step(s, 0, 0, m, x, NULL), 0, NULL);
    TU_CHECK_ERR(ditd_sampler_step(s, 2, 0, m, x, NULL), DITD_EINVAL, "step 2 after step 0");
    TU_CHECK_ERR(ditd_sampler_step(s, 1, 1, m, x, NULL), DITD_EINVAL, "slot 1");
    TU_CHECK_ERR(ditd_sampler_step(s, 1, 0, m, x, NULL), 0, NULL);
    /* restarting a slot at step 0 is allowed at any time */
    TU_CHECK_ERR(ditd_sampler_step(s, 0, 0, m, x, NULL), 0, NULL);
    ditd_sampler_free(s);
    ditd_sampler_free(NULL);
}

int main(void)
{
    test_fixtures("index.json");
    test_fixtures("unipc_index.json");
    test_unipc_config();
    test_config_errors();
    test_convert();
    test_enums();
    test_names_listed_once();
    test_sampler_args();
    return tu_exit();
}
