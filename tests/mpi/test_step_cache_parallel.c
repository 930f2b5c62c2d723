/* Step caching under every layout equals one rank (issue 24): the tiny DiT
 * fixture (6 heads, 49 tokens), two samples with guidance 4 (so cfg rows),
 * 12 flow-matching steps, with First Block Cache, MagCache and TaylorSeer.
 * Every rank also runs the one-rank pipeline; the group's final latents are
 * within 1e-4 of it, the same steps are skipped step by step (the leader's
 * callback) and every rank counts the same skips.
 *
 * First Block Cache is the one data-dependent decision: its threshold is
 * picked from the one-rank run so that some steps skip and some do not and
 * no compared value is within 1 % of it. Under a layout that splits the
 * sequence (ulysses, ring) or the rows (cfg), the test shows that the ranks'
 * own shares of the residual would have decided differently at some step
 * (the ratio of this rank's tokens alone, ditd_step_cache_fbc_trace) while
 * the group's decision, from the gathered per-token sums, is one rank's.
 *
 * With --flux DIR (the assembled FLUX.1-dev folder): FluxPipeline with true
 * CFG (a state per branch; text tokens split with the image under cp),
 * First Block Cache (tools/make_cache_fixtures.py's threshold), MagCache
 * (FLUX's ratios) and TaylorSeer's lite mode, the group against one rank likewise; a layout the model
 * cannot take (its 2 heads) skips this part on every rank. With --sd3 DIR
 * and --wan DIR (the assembled folders) the same for SD3 (CFG, one state)
 * and Wan 2.1 (CFG, a state per branch) with their fixture cases.
 *   mpirun -np G test_step_cache_parallel [--cfg 2] [--ring R] [--ulysses U]
 *       [--tp T] [--rotate p2p] [--flux DIR] [--sd3 DIR] [--wan DIR] */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/backend/backend.h"
#include "engine/io/npy.h"
#include "engine/models/model.h"
#include "engine/parallel/comm.h"
#include "engine/parallel/mesh.h"
#include "engine/pipeline/pipeline.h"
#include "engine/pipeline/step_cache.h"
#include "tests/mpi/mpi_args.h"
#include "tests/test_util.h"

#define STEPS 12
#define NS 2
#define TOL 1e-4

static int rank_world;

typedef struct flags {
    ditd_pipeline *p;
    int prev[NS];
    uint8_t sk[NS][STEPS];
} flags;

static int on_step(void *ud, int step, int total, const float *x0, uint8_t *active)
{
    flags *f = ud;
    (void)total, (void)x0, (void)active;
    for (int i = 0; i < NS; i++) {
        ditd_cache_stats st;
        ditd_pipeline_cache_stats(f->p, i, &st);
        if (step >= 1 && step <= STEPS)
            f->sk[i][step - 1] = (uint8_t)(st.steps_skipped > f->prev[i]);
        f->prev[i] = st.steps_skipped;
    }
    return 0;
}

static void fmt_flags(const flags *f, int i, char *buf)
{
    for (int s = 0; s < STEPS; s++)
        buf[s] = f->sk[i][s] ? 'S' : '.';
    buf[STEPS] = 0;
}

static float guidance = 4.0f;

static int generate(ditd_pipeline *p, const ditd_cache_config *cfg, const float *noise,
                    float *out, flags *f, int leader)
{
    ditd_gen_params gp = {.steps = STEPS, .sampler = DITD_SAMPLER_FLOW_EULER};
    int err = ditd_pipeline_set_cache(p, cfg);
    if (err)
        return err;
    ditd_gen_sample s[NS];
    memset(s, 0, sizeof s);
    for (int i = 0; i < NS; i++) {
        s[i].index = (uint64_t)i;
        s[i].cond.class_id = 1 + i;
        s[i].guidance = guidance;
    }
    memset(f, 0, sizeof *f);
    f->p = p;
    return ditd_pipeline_generate(p, &gp, NS, s, noise, out, NULL, leader ? on_step : NULL, f);
}

/* The First Block Cache threshold: between two measured ratios, 1 % clear of
 * every ratio the run then compares, with skips and computes. One-rank
 * pipeline, so every rank finds the same. */
static double pick_threshold(ditd_pipeline *one, const float *noise, float *out)
{
    ditd_cache_config cfg;
    flags f;
    double v[NS * STEPS], g, l;
    int nv = 0;
    TU_OK(ditd_cache_config_parse("first_block_cache:threshold=0", &cfg));
    TU_OK(generate(one, &cfg, noise, out, &f, 1));
    for (int i = 0; i < NS; i++)
        for (int k = 0; ditd_step_cache_fbc_trace(one->scache, i, 0, k, &g, &l) == 0; k++)
            v[nv++] = g;
    for (int a = 0; a < nv; a++) /* sort */
        for (int b = a + 1; b < nv; b++)
            if (v[b] < v[a]) {
                double t = v[a];
                v[a] = v[b];
                v[b] = t;
            }
    for (int k = nv / 4; k + 1 < nv; k++) {
        double thr = sqrt(v[k] * v[k + 1]), ok = 1;
        int skips = 0;
        cfg.threshold = thr;
        TU_OK(generate(one, &cfg, noise, out, &f, 1));
        for (int i = 0; i < NS; i++) {
            for (int j = 0; ditd_step_cache_fbc_trace(one->scache, i, 0, j, &g, &l) == 0; j++)
                ok = ok && fabs(g - thr) > 0.01 * thr;
            for (int s = 0; s < STEPS; s++)
                skips += f.sk[i][s];
        }
        if (ok && skips > 0 && skips < NS * (STEPS - 1))
            return thr;
    }
    TU_CHECK(0, "no First Block Cache threshold fits");
    return 0.1;
}

/* How many (rank, step) decisions this group run's ranks would have taken
 * otherwise from their own shares alone (summed over the group). */
static int disagreements(ditd_pipeline *grp, const ditd_mesh *mesh, double thr)
{
    float d = 0;
    double g, l;
    for (int i = 0; i < NS; i++)
        for (int k = 0; ditd_step_cache_fbc_trace(grp->scache, i, 0, k, &g, &l) == 0; k++)
            if (!isnan(l) && (l > thr) != (g > thr))
                d += 1;
    ditd_comm_allreduce_sum(mesh->group, DITD_DTYPE_F32, &d, 1);
    return (int)d;
}

/* Under a split layout, a threshold where some rank's own share decides
 * otherwise than the group: candidates between a rank's share and the
 * group's ratio (every rank's shares gathered, so all try the same), kept
 * when the one-rank run stays 0.2 % clear of it (layouts agree on the
 * ratio to 1e-7) and skips some steps. */
static double pick_split_threshold(ditd_pipeline *one, ditd_pipeline *grp, const ditd_mesh *mesh,
                                   const float *noise, float *out, double fallback)
{
    ditd_cache_config cfg;
    flags f;
    double mine[NS * STEPS * 2], *all, g, l;
    int G = mesh->size, per = NS * STEPS * 2;
    TU_OK(ditd_cache_config_parse("first_block_cache:threshold=0", &cfg));
    TU_OK(generate(grp, &cfg, noise, out, &f, ditd_mesh_is_leader(mesh)));
    for (int j = 0; j < per; j++)
        mine[j] = NAN;
    for (int i = 0; i < NS; i++)
        for (int k = 0; k < STEPS &&
                        ditd_step_cache_fbc_trace(grp->scache, i, 0, k, &g, &l) == 0; k++) {
            mine[(i * STEPS + k) * 2] = g;
            mine[(i * STEPS + k) * 2 + 1] = l;
        }
    all = malloc((size_t)G * (size_t)per * sizeof(double));
    int *cnt = malloc(2 * (size_t)G * sizeof(int));
    for (int r = 0; r < G; r++) {
        cnt[r] = per;
        cnt[G + r] = r * per;
    }
    memcpy(all + (size_t)mesh->rank * per, mine, sizeof mine);
    TU_OK(ditd_comm_allgatherv(mesh->group, DITD_DTYPE_I64, NULL, all, cnt, cnt + G));
    double thr = fallback;
    int tried = 0, found = 0;
    for (int j = 0; j < G * NS * STEPS && !found && tried < 24; j++) {
        double gv = all[2 * j], lv = all[2 * j + 1];
        if (isnan(gv) || isnan(lv) || fabs(lv - gv) < 0.005 * gv)
            continue;
        double cand = 0.5 * (gv + lv), ok = 1;
        int skips = 0;
        tried++;
        cfg.threshold = cand;
        TU_OK(generate(one, &cfg, noise, out, &f, 1));
        for (int i = 0; i < NS; i++) {
            for (int k = 0; ditd_step_cache_fbc_trace(one->scache, i, 0, k, &g, &l) == 0; k++)
                ok = ok && fabs(g - cand) > 0.002 * cand;
            for (int s = 0; s < STEPS; s++)
                skips += f.sk[i][s];
        }
        if (!ok || skips == 0 || skips >= NS * (STEPS - 1))
            continue;
        TU_OK(generate(grp, &cfg, noise, out, &f, ditd_mesh_is_leader(mesh)));
        if (disagreements(grp, mesh, cand) > 0) {
            thr = cand;
            found = 1;
        }
    }
    free(all);
    free(cnt);
    TU_CHECK(found, "no threshold where a rank's share decides otherwise (%d tried)", tried);
    return thr;
}

static int run(const ditd_layout *l, ditd_mesh *mesh)
{
    char dir[4096], path[4300], spec[16384], what[256];
    ditd_model_info info;
    ditd_pipeline *one = NULL, *grp = NULL;
    int64_t sh[4];
    int nd, checked = 0, leader = ditd_mesh_is_leader(mesh);
    float *noise = NULL;

    snprintf(dir, sizeof dir, "%s/models/tiny-p2-c1-h6", tu_fixtures());
    snprintf(path, sizeof path, "%s/cache/fbc_batch2_noise.npy", tu_fixtures());
    TU_OK(ditd_npy_read_f32(path, 4, &nd, sh, &noise));
    TU_OK(ditd_model_info_load(dir, &info));
    TU_OK(ditd_pipeline_new(&info, &ditd_backend_cpu, NS, &one));
    TU_OK(ditd_pipeline_new_group(&info, &ditd_backend_cpu, NS, mesh, &grp));
    if (!noise || !one || !grp)
        goto out;
    size_t numel = (size_t)(sh[1] * sh[2] * sh[3]);
    float *ref = malloc(NS * numel * sizeof(float)), *got = malloc(NS * numel * sizeof(float));

    double thr = pick_threshold(one, noise, ref);
    if (l->ring * l->ulysses > 1 || l->cfg > 1)
        thr = pick_split_threshold(one, grp, mesh, noise, ref, thr);
    /* MagCache: ratios measured on this model (calibrate), then used */
    ditd_cache_config cal;
    TU_OK(ditd_cache_config_parse("mag_cache:calibrate=true", &cal));
    flags fc;
    TU_OK(generate(one, &cal, noise, ref, &fc, 1));
    int nr = 0;
    const float *r = ditd_step_cache_calibration(one->scache, 0, 0, &nr);
    int o = snprintf(spec, sizeof spec, "mag_cache:threshold=0.25,max_skip_steps=2,mag_ratios=");
    for (int k = 0; k < nr && o < (int)sizeof spec - 32; k++)
        o += snprintf(spec + o, sizeof spec - (size_t)o, "%s%.9g", k ? ";" : "", (double)r[k]);

    char fbc_spec[64];
    snprintf(fbc_spec, sizeof fbc_spec, "first_block_cache:threshold=%.17g", thr);
    const char *specs[] = {
        fbc_spec,
        spec,
        "mag_cache:calibrate=true",
        "taylorseer_cache:cache_interval=2,disable_cache_before_step=3,max_order=2,"
        "taylor_factors_dtype=float32,cache_identifiers=transformer_blocks\\.\\d+",
        "taylorseer_cache:cache_interval=3,disable_cache_before_step=2,max_order=1,"
        "taylor_factors_dtype=float32,cache_identifiers=transformer_blocks\\.\\d+\\.attn1;"
        "transformer_blocks\\.\\d+\\.ff",
    };
    for (size_t c = 0; c < sizeof specs / sizeof specs[0]; c++) {
        ditd_cache_config cfg;
        flags f1, fg;
        TU_OK(ditd_cache_config_parse(specs[c], &cfg));
        TU_OK(generate(one, &cfg, noise, ref, &f1, 1));
        TU_OK(generate(grp, &cfg, noise, got, &fg, leader));
        snprintf(what, sizeof what, "rank %d: %s", rank_world, ditd_cache_method_name(cfg.method));
        TU_CLOSE(what, got, ref, NS * numel, TOL);
        int skipped = 0;
        for (int i = 0; i < NS; i++) {
            ditd_cache_stats a, b;
            ditd_pipeline_cache_stats(one, i, &a);
            ditd_pipeline_cache_stats(grp, i, &b);
            skipped += a.steps_skipped;
            TU_CHECK(a.steps == b.steps && a.steps_skipped == b.steps_skipped &&
                         a.evals == b.evals && a.evals_skipped == b.evals_skipped,
                     "%s sample %d: group skipped %d steps (%ld evals), one rank %d (%ld)", what, i,
                     b.steps_skipped, b.evals_skipped, a.steps_skipped, a.evals_skipped);
            if (leader) {
                char s1[STEPS + 1], s2[STEPS + 1];
                fmt_flags(&f1, i, s1);
                fmt_flags(&fg, i, s2);
                TU_CHECK(!strcmp(s1, s2), "%s sample %d: steps %s in the group, %s on one rank",
                         what, i, s2, s1);
                printf("%s %s sample %d: steps %s (one rank %s), %ld of %ld evaluations skipped\n",
                       strcmp(s1, s2) ? "FAIL" : "ok  ", what, i, s2, s1, b.evals_skipped, b.evals);
            }
        }
        TU_CHECK(cfg.calibrate || skipped > 0, "%s: no step skipped", what);
        if (cfg.calibrate) { /* the same ratios measured by the group */
            int n1 = 0, n2 = 0;
            const float *r1 = ditd_step_cache_calibration(one->scache, 1, 0, &n1);
            const float *r2 = ditd_step_cache_calibration(grp->scache, 1, 0, &n2);
            double worst = 0;
            for (int k = 0; k < n1 && k < n2; k++)
                worst = fmax(worst, fabs(r1[k] - r2[k]) / fabs(r1[k]));
            TU_CHECK(n1 == STEPS && n1 == n2 && worst < 1e-5,
                     "%s: calibration %d / %d ratios, off by %.3g", what, n1, n2, worst);
        }
        if (cfg.method == DITD_CACHE_FIRST_BLOCK) {
            /* the group's ratio equals one rank's; this rank's own share alone
             * would have decided otherwise at some step (counted over ranks) */
            float disagree = 0;
            double worst = 0;
            for (int i = 0; i < NS; i++) {
                double g1, l1, g2, l2;
                for (int k = 0; ditd_step_cache_fbc_trace(one->scache, i, 0, k, &g1, &l1) == 0;
                     k++) {
                    if (ditd_step_cache_fbc_trace(grp->scache, i, 0, k, &g2, &l2)) {
                        TU_CHECK(0, "%s: no group ratio %d", what, k);
                        break;
                    }
                    worst = fmax(worst, fabs(g2 - g1) / g1);
                }
            }
            TU_CHECK(worst < 1e-5, "%s: the group's relative L1 is %.3g from one rank's", what,
                     worst);
            (void)disagree;
            disagree = (float)disagreements(grp, mesh, thr);
            int split = l->ring * l->ulysses > 1 || l->cfg > 1;
            if (leader)
                printf("     %s: group ratio within %.2g of one rank's; %d rank-step decisions "
                       "a rank's own share would have taken otherwise\n",
                       what, worst, (int)disagree);
            TU_CHECK(!split || disagree >= 1,
                     "%s: no step where a rank's share would decide differently", what);
        }
        checked++;
    }
    /* no guidance: only conditional rows, so under cfg 2 the second half has
     * no forward: it joins First Block Cache's exchange idle, and keeps the
     * counters of the others as the first half does */
    {
        ditd_cache_config cfg;
        guidance = 1.0f;
        TU_OK(ditd_cache_config_parse("first_block_cache", &cfg));
        double thr1 = pick_threshold(one, noise, ref);
        char spec1[64];
        snprintf(spec1, sizeof spec1, "first_block_cache:threshold=%.17g", thr1);
        const char *g1[] = {spec1, spec, specs[3]};
        for (int c = 0; c < 3; c++) {
            flags f1, fg;
            TU_OK(ditd_cache_config_parse(g1[c], &cfg));
            TU_OK(generate(one, &cfg, noise, ref, &f1, 1));
            TU_OK(generate(grp, &cfg, noise, got, &fg, leader));
            snprintf(what, sizeof what, "rank %d: %s, guidance 1", rank_world,
                     ditd_cache_method_name(cfg.method));
            TU_CLOSE(what, got, ref, NS * numel, TOL);
            for (int i = 0; i < NS; i++) {
                ditd_cache_stats a, b;
                ditd_pipeline_cache_stats(one, i, &a);
                ditd_pipeline_cache_stats(grp, i, &b);
                TU_CHECK(a.steps_skipped == b.steps_skipped && a.evals_skipped == b.evals_skipped &&
                             a.evals == b.evals,
                         "%s sample %d: group skipped %d steps (%ld of %ld evals), one rank %d "
                         "(%ld of %ld)",
                         what, i, b.steps_skipped, b.evals_skipped, b.evals, a.steps_skipped,
                         a.evals_skipped, a.evals);
                TU_CHECK(i > 0 || a.steps_skipped > 0, "%s: no step skipped", what);
                if (leader)
                    printf("ok   %s sample %d: %d of %d steps skipped (one rank %d)\n", what, i,
                           b.steps_skipped, b.steps, a.steps_skipped);
            }
            checked++;
        }
        guidance = 4.0f;
    }
    free(ref);
    free(got);
out:
    free(noise);
    ditd_pipeline_free(one);
    ditd_pipeline_free(grp);
    ditd_model_info_free(&info);
    return checked;
}

static float *npy(const char *dir, json_t *c, const char *key)
{
    char path[4300];
    float *d = NULL;
    int nd;
    int64_t sh[5];
    snprintf(path, sizeof path, "%s/%s", dir, json_string_value(json_object_get(c, key)));
    TU_OK(ditd_npy_read_f32(path, 5, &nd, sh, &d));
    return d;
}

static json_t *case_named(json_t *doc, const char *name)
{
    size_t i;
    json_t *c;
    json_array_foreach(json_object_get(doc, "cases"), i, c)
        if (!strcmp(json_string_value(json_object_get(c, "name")), name))
            return c;
    return NULL;
}

/* "<method>:<fields>" of a tools/make_cache_fixtures.py case: numbers and
 * lists (';'-separated) as the --cache syntax takes them */
static void case_spec(json_t *c, char *buf, size_t cap)
{
    const char *key;
    json_t *v;
    size_t n = (size_t)snprintf(buf, cap, "%s:", json_string_value(json_object_get(c, "method")));
    json_object_foreach(json_object_get(c, "fields"), key, v) {
        n += (size_t)snprintf(buf + n, n < cap ? cap - n : 0, "%s%s=", buf[n - 1] == ':' ? "" : ",",
                              key);
        if (json_is_array(v)) {
            size_t i;
            json_t *e;
            json_array_foreach(v, i, e) {
                if (json_is_string(e))
                    n += (size_t)snprintf(buf + n, n < cap ? cap - n : 0, "%s%s", i ? ";" : "",
                                          json_string_value(e));
                else
                    n += (size_t)snprintf(buf + n, n < cap ? cap - n : 0, "%s%.9g", i ? ";" : "",
                                          json_number_value(e));
            }
        } else if (json_is_string(v)) {
            n += (size_t)snprintf(buf + n, n < cap ? cap - n : 0, "%s", json_string_value(v));
        } else if (json_is_boolean(v)) {
            n += (size_t)snprintf(buf + n, n < cap ? cap - n : 0, "%s", json_is_true(v) ? "true" : "false");
        } else if (json_is_null(v)) {
            n += (size_t)snprintf(buf + n, n < cap ? cap - n : 0, "None");
        } else {
            n += (size_t)snprintf(buf + n, n < cap ? cap - n : 0, "%.17g", json_number_value(v));
        }
    }
    TU_CHECK(n < cap, "spec of %s: %zu characters", json_string_value(json_object_get(c, "name")), n);
}

/* A text family's pipeline (folder mdir) under the mesh against one rank,
 * with the cache cases `names` of tools/make_cache_fixtures.py (their
 * configs; the embeddings, noise and size of their <family>_pipeline case).
 * FLUX: true CFG; SD3: CFG, one state; Wan: CFG, a state per branch, video
 * latents. Returns the cases checked, or -1 when the layout does not fit
 * the model (skipped, the same on every rank). */
static int run_text(ditd_mesh *mesh, const char *family, const char *mdir,
                    const char *const *names, int n_names)
{
    char edir[4096], path[4300], what[256], key[64];
    json_error_t jerr;
    ditd_model_info info;
    ditd_pipeline *one = NULL, *grp = NULL;
    /* wan22 (two experts): the wan fixtures, its own cases */
    int checked = 0, sd3 = !strcmp(family, "sd3"), wan = !strncmp(family, "wan", 3);
    const char *fixture = wan ? "wan" : family;
    memset(&info, 0, sizeof info);
    snprintf(path, sizeof path, "%s/cache/cases.json", tu_fixtures());
    json_t *cdoc = json_load_file(path, 0, &jerr);
    snprintf(edir, sizeof edir, "%s/%s_pipeline/expected", tu_fixtures(), fixture);
    snprintf(path, sizeof path, "%s/cases.json", edir);
    json_t *fdoc = json_load_file(path, 0, &jerr);
    snprintf(key, sizeof key, "%s_case", family);
    json_t *c0 = cdoc ? case_named(cdoc, names[0]) : NULL;
    json_t *fc = fdoc && c0 ? case_named(fdoc, json_string_value(json_object_get(c0, key))) : NULL;
    TU_CHECK(c0 && fc, "%s fixtures (%s)", family, path);
    if (!c0 || !fc)
        goto out0;
    TU_OK(ditd_model_info_load(mdir, &info));
    TU_OK(ditd_pipeline_new(&info, &ditd_backend_cpu, 1, &one));
    int err = ditd_pipeline_new_group(&info, &ditd_backend_cpu, 1, mesh, &grp);
    if (err == DITD_EINVAL) { /* this layout does not fit the model: the same on every rank */
        if (ditd_mesh_is_leader(mesh))
            printf("skip %s: %s\n", family, ditd_err_detail());
        checked = -1;
        goto out;
    }
    TU_OK(err);
    int lh = (int)json_integer_value(json_object_get(fc, "latent_height"));
    int lw = (int)json_integer_value(json_object_get(fc, "latent_width"));
    int F = wan ? (int)json_integer_value(json_object_get(fc, "latent_frames")) : 1;
    int L = (int)json_integer_value(json_object_get(fc, sd3 ? "text_len" : "max_sequence_length"));
    if (wan) {
        TU_OK(ditd_pipeline_set_video_size(one, F, lh, lw, L));
        TU_OK(ditd_pipeline_set_video_size(grp, F, lh, lw, L));
    } else {
        TU_OK(ditd_pipeline_set_size(one, lh, lw, L));
        TU_OK(ditd_pipeline_set_size(grp, lh, lw, L));
    }
    float *emb = npy(edir, fc, "prompt_embeds"), *nemb = npy(edir, fc, "negative_prompt_embeds");
    float *pool = wan ? NULL : npy(edir, fc, "pooled");
    float *npool = wan ? NULL : npy(edir, fc, "negative_pooled");
    float *noise = npy(edir, fc, "noise");
    size_t numel = (size_t)16 * F * lh * lw;
    float *ref = malloc(numel * sizeof(float)), *got = malloc(numel * sizeof(float));
    ditd_text_embeds te[2] = {{.seq = emb, .pooled = pool}, {.seq = nemb, .pooled = npool}};
    ditd_gen_sample smp = {.guidance = (float)json_number_value(json_object_get(fc, "guidance_scale")),
                           .true_cfg = sd3 || wan ? 1.0f
                                                  : (float)json_number_value(json_object_get(fc, "true_cfg_scale"))};
    smp.cond.prompt = &te[0];
    smp.cond.negative = &te[1];
    int ok_in = emb && nemb && noise && (wan || (pool && npool));
    for (int k = 0; k < n_names && ok_in; k++) {
        json_t *c = case_named(cdoc, names[k]);
        char spec[16384];
        ditd_cache_config cfg;
        ditd_cache_stats a, b;
        TU_CHECK(c != NULL, "cache case %s", names[k]);
        if (!c)
            continue;
        case_spec(c, spec, sizeof spec);
        ditd_gen_params gp = {.steps = (int)json_integer_value(json_object_get(c, "steps")),
                              .sampler = one->sched_base.kind};
        TU_OK(ditd_cache_config_parse(spec, &cfg));
        TU_OK(ditd_pipeline_set_cache(one, &cfg));
        TU_OK(ditd_pipeline_set_cache(grp, &cfg));
        TU_OK(ditd_pipeline_generate(one, &gp, 1, &smp, noise, ref, NULL, NULL, NULL));
        TU_OK(ditd_pipeline_generate(grp, &gp, 1, &smp, noise, got, NULL, NULL, NULL));
        snprintf(what, sizeof what, "rank %d: %s %s (%s)", rank_world, family,
                 ditd_cache_method_name(cfg.method), names[k]);
        TU_CLOSE(what, got, ref, numel, TOL);
        ditd_pipeline_cache_stats(one, 0, &a);
        ditd_pipeline_cache_stats(grp, 0, &b);
        TU_CHECK(a.steps_skipped == b.steps_skipped && a.evals_skipped == b.evals_skipped &&
                     a.evals_skipped > 0,
                 "%s: group skipped %d steps (%ld evals), one rank %d (%ld)", what, b.steps_skipped,
                 b.evals_skipped, a.steps_skipped, a.evals_skipped);
        if (ditd_mesh_is_leader(mesh))
            printf("ok   %s: %d of %d steps, %ld of %ld block evaluations skipped (one rank: %d, "
                   "%ld)\n",
                   what, b.steps_skipped, b.steps, b.evals_skipped, b.evals, a.steps_skipped,
                   a.evals_skipped);
        checked++;
    }
    free(emb), free(pool), free(nemb), free(npool), free(noise), free(ref), free(got);
out:
    ditd_pipeline_free(one);
    ditd_pipeline_free(grp);
    ditd_model_info_free(&info);
out0:
    json_decref(cdoc);
    json_decref(fdoc);
    return checked;
}

int main(int argc, char **argv)
{
    ditd_layout l = DITD_LAYOUT_SINGLE;
    ditd_comm *world = NULL;
    ditd_mesh *mesh = NULL;
    int checked = 0;

    if (ditd_comm_mpi_init(&argc, &argv) || ditd_comm_mpi_world(&world)) {
        fprintf(stderr, "MPI: %s\n", ditd_err_detail());
        return 1;
    }
    rank_world = ditd_comm_rank(world);
    /* ours: --flux / --sd3 / --wan DIR; the rest is the layout */
    static const char *const opt[3] = {"--flux", "--sd3", "--wan"};
    const char *dirs[3] = {NULL, NULL, NULL};
    for (int i = 1; i + 1 < argc;) {
        int o = 0;
        while (o < 3 && strcmp(argv[i], opt[o]))
            o++;
        if (o == 3) {
            i++;
            continue;
        }
        dirs[o] = argv[i + 1];
        for (int j = i; j + 2 <= argc; j++)
            argv[j] = argv[j + 2];
        argc -= 2;
    }
    int arg_rc = tm_parse_layout(argc, argv, &l, NULL, NULL);
    if (arg_rc)
        return arg_rc;
    ditd_backend_cpu.set_threads(1);
    TU_OK(ditd_mesh_new(world, &l, &mesh));
    if (mesh) {
        checked = run(&l, mesh);
        TU_CHECK(checked >= 8, "%d cache configs checked under the mesh (8 expected)", checked);
        /* FLUX: First Block Cache at the fixture's threshold, MagCache with
         * FLUX's ratios, TaylorSeer's lite mode, its default config (every
         * block's attn: two streams, a single block's strided by tp heads)
         * and whole blocks; SD3 and Wan: their fixture cases (TaylorSeer: SD3
         * on ff / ff_context, the default config on attn, whole blocks; Wan
         * on attn1 / attn2 / ffn; Wan 2.2's two experts, a cache each) */
        static const char *const flux_cases[] = {"flux_fbc", "flux_mag", "flux_tay_lite",
                                                 "flux_tay_default", "flux_tay_blocks"};
        static const char *const sd3_cases[] = {"sd3_fbc", "sd3_mag", "sd3_tay_ff",
                                                "sd3_tay_default", "sd3_tay_blocks"};
        static const char *const wan_cases[] = {"wan_fbc", "wan_mag", "wan_tay_modules"};
        static const char *const wan22_cases[] = {"wan22_fbc", "wan22_tay_blocks"};
        static const char *const fam[4] = {"flux", "sd3", "wan", "wan22"},
                                 *sub[4] = {"dev", "sd3", "wan21", "wan22"};
        const char *const *names[4] = {flux_cases, sd3_cases, wan_cases, wan22_cases};
        const int n_names[4] = {5, 5, 3, 2}, dir_of[4] = {0, 1, 2, 2};
        char mdir[4200];
        for (int f = 0; f < 4; f++) {
            if (!dirs[dir_of[f]])
                continue;
            snprintf(mdir, sizeof mdir, "%s/%s", dirs[dir_of[f]], sub[f]);
            int r = run_text(mesh, fam[f], mdir, names[f], n_names[f]);
            TU_CHECK(r < 0 || r == n_names[f], "%s: %d of %d cache cases checked", fam[f], r,
                     n_names[f]);
        }
        ditd_mesh_free(mesh);
    }
    float f = (float)tu_failures;
    ditd_comm_allreduce_sum(world, DITD_DTYPE_F32, &f, 1);
    int all = (int)f;
    if (rank_world == 0)
        printf("%d checks on rank 0; %d failed over all ranks\n", tu_checks, all);
    ditd_comm_free(world);
    ditd_comm_mpi_finalize();
    return all ? 1 : 0;
}
