/* LoRA adapters on SD3 and Wan against Diffusers (tools/make_lora_sd3wan_fixtures.py):
 * the assembled tiny SD3.5 folder (qk_norm, a dual-attention block, a
 * context_pre_only block) and the tiny Wan 2.1 and two-expert Wan 2.2
 * folders, prompt embeddings and noise of their committed pipeline cases:
 *   - ditd's targets are every nn.Linear Diffusers' model has (by name);
 *   - final latents within 1e-4 relative of Diffusers' float64
 *     load_lora_weights + set_adapters (rank 4 on every linear, rank 8 with
 *     alpha on some, scales 1, 0.5, -1, two adapters at once; Wan 2.2: one
 *     adapter on both experts, another per expert, one on transformer alone);
 *   - a batch of samples with an adapter and without equal to each alone
 *     within 1e-6, and the base model's bytes the same before and after a
 *     run with adapters;
 *   - refusals naming the tensor: an SD3 adapter on Wan, a shape that does
 *     not fit; transformer_2 adapters on a model with one transformer.
 * The case counts are asserted. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/backend/backend.h"
#include "engine/core/error.h"
#include "engine/io/npy.h"
#include "engine/models/lora.h"
#include "engine/models/model.h"
#include "engine/models/wan/wan.h"
#include "engine/pipeline/pipeline.h"
#include "tests/lora_case.h"
#include "tests/test_util.h"
#include "tests/wan_case.h"

#define TOL 1e-4
#define BATCH_TOL 1e-6
#define MAXB 2


static const char *fix_dir(const char *sub)
{
    static char dir[3][4096];
    static int k;
    k = (k + 1) % 3;
    snprintf(dir[k], sizeof dir[k], "%s/%s", tu_fixtures(), sub);
    return dir[k];
}

/* Sample i of a (B, ...) npy file dir/name: its values (owned), *per each. */
static float *load_row(const char *dir, const char *name, int i, size_t *per)
{
    char path[4300];
    int64_t shape[8];
    float *d = NULL;
    int nd;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    TU_OK(ditd_npy_read_f32(path, 8, &nd, shape, &d));
    if (!d)
        return NULL;
    size_t n = 1;
    for (int j = 1; j < nd; j++)
        n *= (size_t)shape[j];
    *per = n;
    TU_CHECK(i < shape[0], "%s: sample %d of %lld", name, i, (long long)shape[0]);
    if (i >= shape[0]) {
        free(d);
        return NULL;
    }
    memmove(d, d + (size_t)i * n, n * sizeof *d);
    return d;
}

static float *load_all(const char *dir, const char *name, size_t *numel)
{
    char path[4300];
    int64_t shape[8];
    float *d = NULL;
    int nd;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    TU_OK(ditd_npy_read_f32(path, 8, &nd, shape, &d));
    *numel = 1;
    for (int j = 0; d && j < nd; j++)
        *numel *= (size_t)shape[j];
    return d;
}

/* Every Diffusers linear of the model (cases.json "linears") is one of d's targets. */
static void check_targets(const ditd_denoiser *d, json_t *names, const char *fam)
{
    size_t i, found = 0;
    json_t *v;
    json_array_foreach(names, i, v) {
        int k = 0;
        while (k < d->n_lora_targets && strcmp(d->lora_targets[k].name, json_string_value(v)))
            k++;
        TU_CHECK(k < d->n_lora_targets, "%s: Diffusers' linear %s is no ditd target", fam,
                 json_string_value(v));
        found += k < d->n_lora_targets;
    }
    printf("%s: %zu of Diffusers' %zu linears are targets (ditd lists %d)\n", fam, found,
           json_array_size(names), d->n_lora_targets);
    TU_CHECK(found == json_array_size(names) && (int)found == d->n_lora_targets && found >= 20,
             "%s: %zu linears found, %d targets", fam, found, d->n_lora_targets);
}

/* One forward of a tests/fixtures/wan model (its committed case, B 2) with
 * the adapter at its scale on sample 0 and none on sample 1: row 0 against
 * Diffusers with the adapter on, row 1 against the fixture's base output.
 * 1 when compared. */
static int wan_forward_case(json_t *fc, json_t *linears)
{
    const char *mname = json_string_value(json_object_get(fc, "model"));
    char dir[4300], path[4400];
    ditd_wan_config cfg;
    ditd_wan *m = NULL;
    ditd_lora *l = NULL;
    ditd_lora_dev *dev = NULL;
    wan_case wc;
    size_t n_want = 0;
    int ok = 0;
    memset(&wc, 0, sizeof wc);
    snprintf(dir, sizeof dir, "%s/wan/%s", tu_fixtures(), mname);
    snprintf(path, sizeof path, "%s/config.json", dir);
    TU_OK(ditd_wan_config_load(path, &cfg));
    json_t *cases = wan_cases(dir);
    json_t *c = json_array_get(cases, (size_t)json_integer_value(json_object_get(fc, "case")));
    float *want = load_all(fix_dir("lora_sd3wan"), json_string_value(json_object_get(fc, "out")),
                           &n_want);
    if (!c || wan_case_load(dir, c, &wc) || !want || wc.B != 2 || n_want != wc.n_out) {
        TU_CHECK(0, "%s: forward case inputs (B %d, %zu of %zu outputs)", mname, wc.B, n_want,
                 wc.n_out);
        goto out;
    }
    TU_OK(ditd_wan_new_mesh(&cfg, &ditd_backend_cpu, wc.B, wc.F, wc.h, wc.w, wc.L, dir, NULL, &m));
    if (!m)
        goto out;
    check_targets(&m->base, json_object_get(linears, mname), mname);
    snprintf(path, sizeof path, "%s/%s", fix_dir("lora_sd3wan"),
             json_string_value(json_object_get(fc, "adapter")));
    TU_OK(ditd_lora_open(path, "f4", m->base.lora_targets, m->base.n_lora_targets, &l));
    if (l)
        TU_OK(ditd_lora_dev_new(l, &ditd_backend_cpu, m->base.lora_targets,
                                m->base.n_lora_targets, &dev));
    if (!dev)
        goto out;
    ditd_lora_set set = {.n = 1, .ad = {dev},
                         .weight = {(float)json_number_value(json_object_get(fc, "scale"))}};
    const ditd_lora_set *rows[2] = {&set, NULL};
    float *got = calloc(wc.n_out, sizeof *got);
    size_t per = wc.n_out / 2;
    char what[200];
    m->base.loras = rows;
    TU_OK(ditd_wan_forward(m, wc.B, wc.x, wc.t_frames ? NULL : wc.t, wc.t_frames, wc.text,
                           wc.image, got));
    m->base.loras = NULL;
    snprintf(what, sizeof what, "%s forward: sample 0 with the adapter%s", mname,
             wc.image ? " (image branch)" : wc.t_frames ? " (per-frame timesteps)" : "");
    TU_CLOSE(what, got, want, per, TOL);
    snprintf(what, sizeof what, "%s forward: sample 1 without, in the same batch", mname);
    TU_CLOSE(what, got + per, wc.out + per, per, TOL);
    free(got);
    ok = 1;
out:
    ditd_lora_dev_free(dev);
    ditd_lora_free(l);
    ditd_wan_free(m);
    wan_case_free(&wc);
    json_decref(cases);
    free(want);
    return ok;
}

/* One family's inputs of pipeline case pc, sample i: embeddings (and the
 * negative ones), pooled vectors, noise. */
typedef struct inputs {
    float *emb, *nemb, *pool, *npool, *noise;
    size_t n_emb, numel;
    ditd_text_embeds te[2];
} inputs;

static int load_inputs(const char *edir, json_t *pc, int i, int pooled, inputs *in)
{
    size_t k;
    memset(in, 0, sizeof *in);
    in->emb = load_row(edir, json_string_value(json_object_get(pc, "prompt_embeds")), i, &in->n_emb);
    in->nemb = load_row(edir, json_string_value(json_object_get(pc, "negative_prompt_embeds")), i, &k);
    in->noise = load_row(edir, json_string_value(json_object_get(pc, "noise")), i, &in->numel);
    if (pooled) {
        in->pool = load_row(edir, json_string_value(json_object_get(pc, "pooled")), i, &k);
        in->npool = load_row(edir, json_string_value(json_object_get(pc, "negative_pooled")), i, &k);
    } else { /* Wan: no pooled vector (the interface still takes a pointer) */
        in->pool = calloc(1, sizeof(float));
        in->npool = calloc(1, sizeof(float));
    }
    in->te[0] = (ditd_text_embeds){.seq = in->emb, .pooled = in->pool};
    in->te[1] = (ditd_text_embeds){.seq = in->nemb, .pooled = in->npool};
    return in->emb && in->nemb && in->noise && in->pool && in->npool ? 0 : -1;
}

static void free_inputs(inputs *in)
{
    free(in->emb), free(in->nemb), free(in->pool), free(in->npool), free(in->noise);
}

typedef struct family {
    const char *key;      /* "sd3", "wan" */
    const char *edir;     /* the pipeline fixtures' expected/ */
    int pooled;
    json_t *pcases;       /* the pipeline fixtures' cases */
} family;

static json_t *find_case(json_t *cases, const char *name)
{
    size_t j;
    json_t *e;
    json_array_foreach(cases, j, e)
        if (!strcmp(json_string_value(json_object_get(e, "name")), name))
            return e;
    return NULL;
}

/* The case c on p: n samples in one batch against Diffusers, and each alone
 * against its row of the batch. 1 when compared. */
static int run_case(ditd_pipeline *p, const family *f, const lc_adapters *ad, json_t *c,
                    int *batch_checks)
{
    const char *name = json_string_value(json_object_get(c, "name"));
    json_t *pc = find_case(f->pcases, json_string_value(json_object_get(c, "case")));
    json_t *smp = json_object_get(c, "samples"), *smp2 = json_object_get(c, "samples_2");
    int n = (int)json_array_size(smp), ok = 0;
    inputs in[MAXB];
    ditd_lora_set sets[MAXB], sets2[MAXB];
    ditd_gen_sample s[MAXB];
    size_t n_want;
    float *want = load_all(fix_dir("lora_sd3wan"), json_string_value(json_object_get(c, "out")),
                           &n_want);
    TU_CHECK(pc && n >= 1 && n <= MAXB && want, "%s: pipeline case, %d samples", name, n);
    if (!pc || n < 1 || n > MAXB || !want) {
        free(want);
        return 0;
    }
    memset(in, 0, sizeof in);
    float g = (float)json_number_value(json_object_get(pc, "guidance_scale"));
    int err = 0;
    for (int i = 0; i < n; i++) {
        err |= load_inputs(f->edir, pc, i, f->pooled, &in[i]);
        s[i] = (ditd_gen_sample){.index = (uint64_t)i, .guidance = g, .true_cfg = 1.0f};
        s[i].cond.prompt = &in[i].te[0];
        s[i].cond.negative = &in[i].te[1];
        if (json_is_number(json_object_get(pc, "guidance_scale_2"))) {
            s[i].has_guidance_2 = 1;
            s[i].guidance_2 = (float)json_number_value(json_object_get(pc, "guidance_scale_2"));
        }
        lc_make_set(ad, json_array_get(smp, (size_t)i), &sets[i]);
        s[i].loras = sets[i].n ? &sets[i] : NULL;
        if (smp2) { /* transformer_2's own set (empty: none there) */
            lc_make_set(ad, json_array_get(smp2, (size_t)i), &sets2[i]);
            s[i].loras_2 = &sets2[i];
        }
    }
    size_t numel = in[0].numel;
    TU_CHECK(!err && n_want == (size_t)n * numel, "%s: inputs, %zu outputs for %d x %zu", name,
             n_want, n, numel);
    if (err || n_want != (size_t)n * numel)
        goto out;
    int L = (int)json_integer_value(json_object_get(pc, f->pooled ? "text_len"
                                                                   : "max_sequence_length"));
    int lh = (int)json_integer_value(json_object_get(pc, "latent_height"));
    int lw = (int)json_integer_value(json_object_get(pc, "latent_width"));
    if (f->pooled)
        TU_OK(ditd_pipeline_set_size(p, lh, lw, L));
    else
        TU_OK(ditd_pipeline_set_video_size(
            p, (int)json_integer_value(json_object_get(pc, "latent_frames")), lh, lw, L));
    ditd_gen_params gp = {.steps = (int)json_integer_value(json_object_get(pc, "num_inference_steps")),
                          .sampler = p->sched_base.kind};
    float *noise = malloc((size_t)n * numel * sizeof *noise), *got = calloc(n_want, sizeof *got);
    for (int i = 0; noise && i < n; i++)
        memcpy(noise + (size_t)i * numel, in[i].noise, numel * sizeof *noise);
    if (noise && got) {
        TU_OK(ditd_pipeline_generate(p, &gp, n, s, noise, got, NULL, NULL, NULL));
        TU_CLOSE(name, got, want, n_want, TOL);
        ok = 1;
        for (int i = 0; n > 1 && i < n; i++) {
            float *alone = calloc(numel, sizeof *alone);
            char what[200];
            TU_OK(ditd_pipeline_generate(p, &gp, 1, &s[i], in[i].noise, alone, NULL, NULL, NULL));
            snprintf(what, sizeof what, "%s: sample %d in the batch vs alone", name, i);
            TU_CLOSE(what, got + (size_t)i * numel, alone, numel, BATCH_TOL);
            (*batch_checks)++;
            free(alone);
        }
    }
    free(noise), free(got);
out:
    for (int i = 0; i < n; i++)
        free_inputs(&in[i]);
    free(want);
    return ok;
}

/* No adapters before and after a run with them: the same bytes; and the
 * adapters change the result. */
static int base_unchanged(ditd_pipeline *p, const family *f, const lc_adapters *ad, json_t *pc)
{
    inputs in;
    int ok = 0;
    if (!pc || ad->n < 2 || load_inputs(f->edir, pc, 0, f->pooled, &in)) {
        TU_CHECK(0, "%s: base check inputs", f->key);
        return 0;
    }
    float g = (float)json_number_value(json_object_get(pc, "guidance_scale"));
    ditd_gen_sample s = {.guidance = g, .true_cfg = 1.0f};
    s.cond.prompt = &in.te[0];
    s.cond.negative = &in.te[1];
    ditd_lora_set set = {.n = 2, .ad = {ad->dev[0], ad->dev[1]}, .weight = {1.0f, -0.5f}};
    ditd_gen_params gp = {.steps = (int)json_integer_value(json_object_get(pc, "num_inference_steps")),
                          .sampler = p->sched_base.kind};
    float *a = calloc(in.numel, sizeof *a), *b = calloc(in.numel, sizeof *b);
    float *w = calloc(in.numel, sizeof *w);
    if (a && b && w) {
        TU_OK(ditd_pipeline_generate(p, &gp, 1, &s, in.noise, a, NULL, NULL, NULL));
        s.loras = &set;
        TU_OK(ditd_pipeline_generate(p, &gp, 1, &s, in.noise, w, NULL, NULL, NULL));
        s.loras = NULL;
        TU_OK(ditd_pipeline_generate(p, &gp, 1, &s, in.noise, b, NULL, NULL, NULL));
        TU_CHECK(!memcmp(a, b, in.numel * sizeof *a),
                 "%s: base run after a run with adapters differs from the one before", f->key);
        TU_CHECK(memcmp(a, w, in.numel * sizeof *a), "%s: the adapters changed nothing", f->key);
        printf("%s: base unchanged: %zu latents, the same bytes before and after\n", f->key,
               in.numel);
        ok = 1;
    }
    free(a), free(b), free(w);
    free_inputs(&in);
    return ok;
}

static int load_pipeline(const char *dir, ditd_model_info *info, ditd_pipeline **p)
{
    memset(info, 0, sizeof *info);
    *p = NULL;
    TU_OK(ditd_model_info_load(dir, info));
    TU_OK(ditd_pipeline_new(info, &ditd_backend_cpu, MAXB, p));
    return *p ? 0 : -1;
}

int main(void)
{
    char path[4300];
    json_error_t jerr;
    int ran[3] = {0}, batch_checks = 0, base = 0, refused = 0, fwd = 0;
    snprintf(path, sizeof path, "%s/cases.json", fix_dir("lora_sd3wan"));
    json_t *doc = json_load_file(path, 0, &jerr);
    TU_CHECK(doc != NULL, "%s: %s", path, jerr.text);
    snprintf(path, sizeof path, "%s/cases.json", fix_dir("sd3_pipeline/expected"));
    json_t *sdoc = json_load_file(path, 0, &jerr);
    TU_CHECK(sdoc != NULL, "%s: %s", path, jerr.text);
    snprintf(path, sizeof path, "%s/cases.json", fix_dir("wan_pipeline/expected"));
    json_t *wdoc = json_load_file(path, 0, &jerr);
    TU_CHECK(wdoc != NULL, "%s: %s", path, jerr.text);
    if (!doc || !sdoc || !wdoc)
        goto done;
    family fams[2] = {
        {"sd3", fix_dir("sd3_pipeline/expected"), 1, json_object_get(sdoc, "cases")},
        {"wan", fix_dir("wan_pipeline/expected"), 0, json_object_get(wdoc, "cases")},
    };
    char sedir[4096], wedir[4096];
    snprintf(sedir, sizeof sedir, "%s", fams[0].edir);
    snprintf(wedir, sizeof wedir, "%s", fams[1].edir);
    fams[0].edir = sedir, fams[1].edir = wedir;
    static const char *const folders[3] = {"sd35", "wan21", "wan22"};
    static const char *const roots[3] = {SD3_PIPELINE_DIR, WAN_PIPELINE_DIR, WAN_PIPELINE_DIR};
    json_t *linears = json_object_get(doc, "linears");
    for (int fi = 0; fi < 3; fi++) {
        const family *f = &fams[fi == 0 ? 0 : 1];
        char dir[4300];
        ditd_model_info info;
        ditd_pipeline *p = NULL;
        lc_adapters ad = {0};
        json_t *c;
        size_t k;
        snprintf(dir, sizeof dir, "%s/%s", roots[fi], folders[fi]);
        if (load_pipeline(dir, &info, &p))
            goto next;
        check_targets(p->den, json_object_get(linears, f->key), folders[fi]);
        lc_open_adapters(p, json_object_get(json_object_get(doc, "adapters"), f->key),
                     fix_dir("lora_sd3wan"), &ad);
        TU_CHECK(ad.n == 3, "%s: %d adapters opened, 3 expected (the rank-8 one twice: with "
                 ".alpha, and as Diffusers saved it, alpha in its metadata)", folders[fi], ad.n);
        json_array_foreach(json_object_get(doc, "cases"), k, c)
            if (!strcmp(json_string_value(json_object_get(c, "folder")), folders[fi]))
                ran[fi] += run_case(p, f, &ad, c, &batch_checks);
        if (fi < 2) /* the base model's bytes, on each family */
            base += base_unchanged(p, f, &ad,
                                   find_case(f->pcases, fi == 0 ? "sd35_32_batch2"
                                                                : "wan_5f_32x32_batch2"));
        if (fi == 1) {
            /* refusals against Wan's targets, naming the tensor */
            ditd_lora *l = NULL;
            snprintf(path, sizeof path, "%s/sd3_r4_peft.safetensors", fix_dir("lora_sd3wan"));
            TU_CHECK_ERR(ditd_lora_open(path, "s", p->den->lora_targets, p->den->n_lora_targets,
                                        &l),
                         DITD_ENOENT, "sd3_r4_peft.safetensors", "transformer.",
                         "the model has no linear module");
            refused += l == NULL;
            ditd_lora_free(l);
            l = NULL;
            snprintf(path, sizeof path, "%s/wan_bad_shape.safetensors", fix_dir("lora_sd3wan"));
            TU_CHECK_ERR(ditd_lora_open(path, "b", p->den->lora_targets, p->den->n_lora_targets,
                                        &l),
                         DITD_ESHAPE, "transformer.blocks.0.attn1.to_q.lora_A.weight",
                         "expected (4, 24)");
            refused += l == NULL;
            ditd_lora_free(l);
            /* transformer_2's adapters on a model with one transformer */
            if (ad.n) {
                ditd_lora_set set = {.n = 1, .ad = {ad.dev[0]}, .weight = {1.0f}};
                float te_pool = 0, *noise = calloc(p->numel + 1, sizeof(float));
                float *seq = calloc((size_t)p->shapes.cond.text_len * p->shapes.cond.text_dim + 1,
                                    sizeof(float));
                float *o = calloc(p->numel + 1, sizeof(float));
                ditd_text_embeds te = {.seq = seq, .pooled = &te_pool};
                ditd_gen_sample s = {.guidance = 1.0f, .true_cfg = 1.0f, .loras_2 = &set};
                s.cond.prompt = &te;
                ditd_gen_params gp = {.steps = 2, .sampler = p->sched_base.kind};
                TU_CHECK_ERR(ditd_pipeline_generate(p, &gp, 1, &s, noise, o, NULL, NULL, NULL),
                             DITD_EINVAL, "transformer_2", "one transformer");
                refused++;
                free(noise), free(seq), free(o);
            }
        }
        if (fi == 2)
            TU_CHECK(p->den2 && p->den2->n_lora_targets == p->den->n_lora_targets &&
                         !p->lora_experts_differ,
                     "wan22: both experts list the same %d targets", p->den->n_lora_targets);
    next:
        lc_free_adapters(&ad);
        ditd_pipeline_free(p);
        ditd_model_info_free(&info);
    }
    {
        size_t k;
        json_t *fc;
        json_array_foreach(json_object_get(doc, "forward"), k, fc)
            fwd += wan_forward_case(fc, linears);
    }
done:
    json_decref(doc), json_decref(sdoc), json_decref(wdoc);
    printf("cases: %d SD3, %d Wan 2.1, %d Wan 2.2 against Diffusers; %d batch rows against "
           "alone; %d base checks; %d refusals; %d Wan forwards\n",
           ran[0], ran[1], ran[2], batch_checks, base, refused, fwd);
    TU_CHECK(ran[0] >= 7 && ran[1] >= 7 && ran[2] >= 3 && batch_checks >= 4 && base >= 2 &&
                 refused >= 3 && fwd >= 2,
             "checked %d SD3, %d Wan 2.1, %d Wan 2.2 cases, %d batch rows, %d base, %d refusals, "
             "%d forwards (want 7, 7, 3, 4, 2, 3, 2)",
             ran[0], ran[1], ran[2], batch_checks, base, refused, fwd);
    return tu_exit();
}
