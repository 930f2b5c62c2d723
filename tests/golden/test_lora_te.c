/* Text-encoder LoRA adapters against Diffusers (tools/make_lora_te_fixtures.py):
 * the assembled tiny FLUX.1-dev folder with a CLIP adapter in PEFT names whose
 * file also carries a transformer part, one in kohya names (lora_te1_, alpha), a
 * T5 adapter in PEFT names (text_encoder_2.*, referenced by PEFT's own injection
 * into T5EncoderModel), scales 1 and 0.5 and two at once: the prompt embeddings
 * (T5 sequence, CLIP pooled vector) within 1e-5 and the final latents within
 * 1e-4 of Diffusers' float64 run. Then: two sequences with different adapter
 * sets in one encoder batch, each equal to its solo encoding; the base encoding
 * the same bytes before and after; the embedding cache keyed on the adapter
 * set and weights; the loader's refusals naming the tensor. And the tiny
 * SD3 folder: both CLIPs (SD3LoraLoaderMixin) and its T5 (PEFT), embeddings
 * and final latents under CFG. Case counts are asserted. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/backend/backend.h"
#include "engine/core/error.h"
#include "engine/io/npy.h"
#include "engine/models/lora.h"
#include "engine/models/model.h"
#include "engine/pipeline/pipeline.h"
#include "engine/pipeline/prompt_encoder.h"
#include "engine/text/clip_text.h"
#include "engine/text/t5_encoder.h"
#include "engine/text/text_lora.h"
#include "tests/test_util.h"

#define EMB_TOL 1e-5
#define LAT_TOL 1e-4
#define MAX_AD 4

typedef struct adapter {
    const char *name;
    char path[4300];
    ditd_text_lora *text;   /* on the prompt encoder */
    ditd_lora_dev *den;     /* the transformer part */
} adapter;

static adapter ads[MAX_AD];
static int n_ads;

static const char *fix_dir(void)
{
    static char dir[4096];
    snprintf(dir, sizeof dir, "%s/lora_te", tu_fixtures());
    return dir;
}

static float *load(const char *dir, const char *name, int64_t *shape, size_t *numel)
{
    char path[4300];
    float *d = NULL;
    int nd;
    int64_t sh[8];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    TU_OK(ditd_npy_read_f32(path, 8, &nd, sh, &d));
    size_t n = 1;
    for (int i = 0; i < nd; i++)
        n *= (size_t)sh[i];
    if (shape)
        memcpy(shape, sh, sizeof sh);
    if (numel)
        *numel = d ? n : 0;
    return d;
}

static const adapter *find(const char *name)
{
    for (int i = 0; i < n_ads; i++)
        if (!strcmp(ads[i].name, name))
            return &ads[i];
    return NULL;
}

/* A case's sets: text and transformer, in the file's order. */
static void make_sets(json_t *uses, ditd_text_lora_set *ts, ditd_lora_set *ds)
{
    size_t i;
    json_t *u;
    ts->n = ds->n = 0;
    json_array_foreach(uses, i, u) {
        const adapter *a = find(json_string_value(json_object_get(u, "adapter")));
        float w = (float)json_number_value(json_object_get(u, "scale"));
        TU_CHECK(a != NULL, "adapter %s", json_string_value(json_object_get(u, "adapter")));
        if (!a)
            continue;
        ts->ad[ts->n] = a->text;
        ts->weight[ts->n++] = w;
        ds->ad[ds->n] = a->den;
        ds->weight[ds->n++] = w;
    }
}

static int same_bytes(const float *a, const float *b, size_t n)
{
    return memcmp(a, b, n * sizeof *a) == 0;
}

/* ---- against Diffusers ---- */

static int diffusers_cases(json_t *doc, const ditd_model_info *info, ditd_pipeline *p,
                           ditd_prompt_encoder *pe, ditd_prompt_encoder *pc)
{
    const char *prompt = json_string_value(json_object_get(doc, "prompt"));
    const int L = (int)json_integer_value(json_object_get(doc, "max_sequence_length"));
    const size_t Dt = (size_t)ditd_prompt_encoder_text_dim(pe);
    const size_t T = (size_t)ditd_prompt_encoder_text_len(pe, L), Dp =
        (size_t)ditd_prompt_encoder_pooled_dim(pe);
    char edir[4096], fpath[4300];
    json_error_t jerr;
    json_t *fc = NULL, *e, *c, *fdoc;
    size_t k, nref;
    int ran = 0;
    float *seq = calloc(T * Dt, sizeof *seq), *pooled = calloc(Dp, sizeof *pooled);
    float *base_seq = calloc(T * Dt, sizeof *seq), *base_pooled = calloc(Dp, sizeof *pooled);
    float *cseq = calloc(T * Dt, sizeof *seq), *cpooled = calloc(Dp, sizeof *pooled);
    ditd_prompt_texts pt = {.texts = {prompt}, .lens = {strlen(prompt)}};

    snprintf(edir, sizeof edir, "%s/flux_pipeline/expected", tu_fixtures());
    snprintf(fpath, sizeof fpath, "%s/cases.json", edir);
    fdoc = json_load_file(fpath, 0, &jerr);
    TU_CHECK(fdoc != NULL, "%s: %s", fpath, jerr.text);
    json_array_foreach(json_object_get(fdoc, "cases"), k, e)
        if (!strcmp(json_string_value(json_object_get(e, "name")),
                    json_string_value(json_object_get(doc, "flux_case"))))
            fc = e;
    TU_CHECK(fc != NULL, "the flux case");
    if (!fc)
        goto done;

    /* the base encoding, against Diffusers and kept for "unchanged after" */
    TU_OK(ditd_prompt_encoder_encode_lora(pe, &pt, L, NULL, base_seq, base_pooled));
    {
        json_t *b = json_object_get(doc, "base");
        float *rs = load(fix_dir(), json_string_value(json_object_get(b, "seq")), NULL, &nref);
        TU_CHECK(nref == T * Dt, "base seq: %zu values, want %zu", nref, T * Dt);
        if (rs && nref == T * Dt)
            TU_CLOSE("base seq", base_seq, rs, nref, EMB_TOL);
        free(rs);
        float *rp = load(fix_dir(), json_string_value(json_object_get(b, "pooled")), NULL, &nref);
        if (rp && nref == Dp)
            TU_CLOSE("base pooled", base_pooled, rp, nref, EMB_TOL);
        free(rp);
    }

    int64_t sn[8];
    size_t numel;
    float *noise = load(edir, json_string_value(json_object_get(fc, "noise")), sn, &numel);
    TU_OK(ditd_pipeline_set_size(p, (int)json_integer_value(json_object_get(fc, "latent_height")),
                                 (int)json_integer_value(json_object_get(fc, "latent_width")), L));
    float *got = calloc(numel ? numel : 1, sizeof *got);
    json_array_foreach(json_object_get(doc, "cases"), k, c) {
        const char *name = json_string_value(json_object_get(c, "name"));
        char what[160];
        ditd_text_lora_set ts;
        ditd_lora_set ds;
        make_sets(json_object_get(c, "uses"), &ts, &ds);
        TU_OK(ditd_prompt_encoder_encode_lora(pe, &pt, L, &ts, seq, pooled));
        size_t ns, np, no;
        float *rs = load(fix_dir(), json_string_value(json_object_get(c, "seq")), NULL, &ns);
        float *rp = load(fix_dir(), json_string_value(json_object_get(c, "pooled")), NULL, &np);
        float *ro = load(fix_dir(), json_string_value(json_object_get(c, "out")), NULL, &no);
        if (!rs || !rp || !ro || ns != T * Dt || np != Dp || no != numel || !noise) {
            TU_CHECK(0, "%s: fixture sizes %zu %zu %zu", name, ns, np, no);
            free(rs), free(rp), free(ro);
            continue;
        }
        snprintf(what, sizeof what, "%s seq", name);
        TU_CLOSE(what, seq, rs, ns, EMB_TOL);
        snprintf(what, sizeof what, "%s pooled", name);
        TU_CLOSE(what, pooled, rp, np, EMB_TOL);

        /* the cache: a second encode is a hit with the same bytes; the same
         * prompt with other weights, or none, is not that entry */
        ditd_prompt_stats s0, s1;
        ditd_prompt_encoder_stats(pc, &s0);
        TU_OK(ditd_prompt_encoder_encode_lora(pc, &pt, L, &ts, cseq, cpooled));
        TU_OK(ditd_prompt_encoder_encode_lora(pc, &pt, L, &ts, cseq, cpooled));
        ditd_prompt_encoder_stats(pc, &s1);
        TU_CHECK(s1.hits == s0.hits + 1 && s1.misses == s0.misses + 1,
                 "%s: cache %llu hits %llu misses after, %llu %llu before", name,
                 (unsigned long long)s1.hits, (unsigned long long)s1.misses,
                 (unsigned long long)s0.hits, (unsigned long long)s0.misses);
        TU_CHECK(same_bytes(cseq, seq, ns) && same_bytes(cpooled, pooled, np),
                 "%s: the cached embeddings are the encoders' bytes", name);
        ditd_text_lora_set half = ts;
        for (int i = 0; i < half.n; i++)
            half.weight[i] *= 0.25f;
        TU_OK(ditd_prompt_encoder_encode_lora(pc, &pt, L, &half, cseq, cpooled));
        ditd_prompt_encoder_stats(pc, &s0);
        TU_CHECK(s0.misses == s1.misses + 1, "%s: other weights miss the cache", name);
        TU_CHECK(!same_bytes(cseq, seq, ns) || !same_bytes(cpooled, pooled, np),
                 "%s: other weights, other embeddings", name);

        /* the final latents: these embeddings, the file's transformer part */
        ditd_text_embeds te = {.seq = seq, .pooled = pooled};
        ditd_gen_sample smp = {
            .guidance = (float)json_number_value(json_object_get(fc, "guidance_scale")),
            .loras = &ds};
        smp.cond.prompt = &te;
        ditd_gen_params gp = {
            .steps = (int)json_integer_value(json_object_get(fc, "num_inference_steps")),
            .sampler = p->sched_base.kind};
        TU_OK(ditd_pipeline_generate(p, &gp, 1, &smp, noise, got, NULL, NULL, NULL));
        snprintf(what, sizeof what, "%s final latents", name);
        TU_CLOSE(what, got, ro, numel, LAT_TOL);
        ran++;
        free(rs), free(rp), free(ro);
    }
    /* the base encoders are untouched: the same bytes as before any adapter */
    TU_OK(ditd_prompt_encoder_encode_lora(pe, &pt, L, NULL, seq, pooled));
    TU_CHECK(same_bytes(seq, base_seq, T * Dt) && same_bytes(pooled, base_pooled, Dp),
             "the base encoding after the adapters is the same bytes as before");
    {
        ditd_text_lora_set zero = {.n = 1, .ad = {find("c4")->text}, .weight = {0.0f}};
        TU_OK(ditd_prompt_encoder_encode_lora(pe, &pt, L, &zero, seq, pooled));
        TU_CHECK(same_bytes(seq, base_seq, T * Dt) && same_bytes(pooled, base_pooled, Dp),
                 "an adapter at weight 0 gives the base bytes");
    }
    free(got);
    free(noise);
done:
    (void)info;
    json_decref(fdoc);
    free(seq), free(pooled), free(base_seq), free(base_pooled), free(cseq), free(cpooled);
    return ran;
}

/* ---- one encoder batch mixing adapter sets ---- */

/* The parts of a FLUX folder's encoders, opened by hand at batch 2. */
static int batch_checks(void)
{
    char dir[4300];
    ditd_clip_text *clip = NULL;
    ditd_t5_encoder *t5 = NULL;
    ditd_text_lora *tl[3] = {0};
    int checks = 0;
    const int N = 77, NT = 40;
    snprintf(dir, sizeof dir, "%s/dev/text_encoder", FLUX_PIPELINE_DIR);
    TU_OK(ditd_clip_text_new(dir, NULL, &ditd_backend_cpu, 2, N, &clip));
    snprintf(dir, sizeof dir, "%s/dev/text_encoder_2", FLUX_PIPELINE_DIR);
    TU_OK(ditd_t5_encoder_new(dir, NULL, &ditd_backend_cpu, 2, NT, &t5));
    if (!clip || !t5)
        goto done;
    ditd_text_lora_part parts[2] = {
        {.component = "text_encoder", .kind = "CLIP", .kohya = {"lora_te1_", "lora_te_"},
         .optional_prefix = "text_model.", .ops = &ditd_backend_cpu},
        {.component = "text_encoder_2", .kind = "T5", .ops = &ditd_backend_cpu},
    };
    parts[0].targets = ditd_clip_text_lora_targets(clip, &parts[0].n_targets);
    parts[1].targets = ditd_t5_encoder_lora_targets(t5, &parts[1].n_targets);
    TU_CHECK(parts[0].n_targets == 12 && parts[1].n_targets == 14,
             "%d CLIP and %d T5 targets (want 12, 14)", parts[0].n_targets, parts[1].n_targets);
    static const char *const names[3] = {"c4", "c8k", "t4"};
    for (int i = 0; i < 3; i++)
        TU_OK(ditd_text_lora_open(find(names[i])->path, names[i], parts, 2, &tl[i]));
    if (!tl[0] || !tl[1] || !tl[2])
        goto done;
    TU_CHECK(tl[0]->dev[0] && !tl[0]->dev[1] && tl[0]->n_mod[0] == 12,
             "c4: 12 CLIP modules, no T5");
    TU_CHECK(tl[1]->format == DITD_LORA_FORMAT_KOHYA && tl[1]->n_mod[0] == 3,
             "c8k: kohya, 3 modules");
    TU_CHECK(!tl[2]->dev[0] && tl[2]->dev[1] && tl[2]->n_mod[1] == 14, "t4: 14 T5 modules");

    /* sets: sequence 0 with c4, sequence 1 with c8k at -0.5 then c4 at 0.5, and none */
    ditd_lora_set sa = {.n = 1, .ad = {tl[0]->dev[0]}, .weight = {1.0f}};
    ditd_lora_set sb = {.n = 2, .ad = {tl[1]->dev[0], tl[0]->dev[0]}, .weight = {-0.5f, 0.5f}};
    ditd_lora_set st = {.n = 1, .ad = {tl[2]->dev[1]}, .weight = {0.5f}};
    int64_t ids[2 * 77];
    for (int i = 0; i < 2 * N; i++)
        ids[i] = (int64_t)(tu_rng() % 49000);
    const int D = ditd_clip_text_config_of(clip)->hidden_size;
    float *h2 = calloc(2 * (size_t)N * D, sizeof(float)), *p2 = calloc(2 * (size_t)D, sizeof(float));
    float *h1 = calloc((size_t)N * D, sizeof(float)), *p1 = calloc((size_t)D, sizeof(float));
    const ditd_lora_set *const mixes[3][2] = {{&sa, &sb}, {&sb, NULL}, {NULL, &sa}};
    for (int m = 0; m < 3; m++) {
        ditd_clip_text_out o2 = {.last = h2, .pooled = p2};
        TU_OK(ditd_clip_text_encode_lora(clip, 2, N, ids, NULL, mixes[m], &o2));
        for (int b = 0; b < 2; b++) {
            const ditd_lora_set *const one[1] = {mixes[m][b]};
            ditd_clip_text_out o1 = {.last = h1, .pooled = p1};
            TU_OK(ditd_clip_text_encode_lora(clip, 1, N, ids + (size_t)b * N, NULL,
                                             mixes[m][b] ? one : NULL, &o1));
            char what[96];
            snprintf(what, sizeof what, "CLIP batch mix %d, sequence %d vs alone", m, b);
            TU_CLOSE(what, h2 + (size_t)b * N * D, h1, (size_t)N * D, 1e-6);
            TU_CLOSE(what, p2 + (size_t)b * D, p1, (size_t)D, 1e-6);
            checks++;
        }
    }
    /* T5: sequence 0 with t4 at 0.5, sequence 1 without */
    const int Dm = ditd_t5_encoder_config_of(t5)->d_model;
    float *t2 = calloc(2 * (size_t)NT * Dm, sizeof(float)), *t1 = calloc((size_t)NT * Dm, sizeof(float));
    for (int i = 0; i < 2 * NT; i++)
        ids[i] = (int64_t)(tu_rng() % 32000);
    const ditd_lora_set *const tmix[2] = {&st, NULL};
    TU_OK(ditd_t5_encoder_encode_lora(t5, 2, NT, ids, NULL, tmix, t2));
    for (int b = 0; b < 2; b++) {
        const ditd_lora_set *const one[1] = {tmix[b]};
        TU_OK(ditd_t5_encoder_encode_lora(t5, 1, NT, ids + (size_t)b * NT, NULL,
                                          tmix[b] ? one : NULL, t1));
        char what[96];
        snprintf(what, sizeof what, "T5 batch, sequence %d vs alone", b);
        TU_CLOSE(what, t2 + (size_t)b * NT * Dm, t1, (size_t)NT * Dm, 1e-6);
        checks++;
    }
    free(h2), free(p2), free(h1), free(p1), free(t2), free(t1);
done:
    for (int i = 0; i < 3; i++)
        ditd_text_lora_free(tl[i]);
    ditd_clip_text_free(clip);
    ditd_t5_encoder_free(t5);
    return checks;
}

/* ---- refusals ---- */

/* A file of one module: A (ra, ka) and B (nb, rb), F32, names a_name/b_name;
 * opened on the prompt encoder. */
static int try_text(const ditd_prompt_encoder *pe, const char *a_name, int ra, int ka,
                    const char *b_name, int nb, int rb)
{
    static float d[4096];
    char h[1024];
    size_t la = (size_t)ra * ka * 4, lb = (size_t)nb * rb * 4, len;
    for (int i = 0; i < 4096; i++)
        d[i] = 0.01f * (float)(i % 97 + 1);
    snprintf(h, sizeof h,
             "{\"%s\":{\"dtype\":\"F32\",\"shape\":[%d,%d],\"data_offsets\":[0,%zu]},"
             "\"%s\":{\"dtype\":\"F32\",\"shape\":[%d,%d],\"data_offsets\":[%zu,%zu]}}",
             a_name, ra, ka, la, b_name, nb, rb, la, la + lb);
    uint8_t *img = tu_st_image(h, d, la + lb, &len);
    /* a file: the prompt encoder opens adapters by path (under $TMPDIR) */
    char path[4096];
    snprintf(path, sizeof path, "%s/ditd-test-lora-te-XXXXXX",
             getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    int fd = mkstemp(path);
    FILE *f = fd >= 0 ? fdopen(fd, "wb") : NULL;
    int err = DITD_EIO, wrote = f && fwrite(img, 1, len, f) == len;
    if (f && fclose(f) != 0)
        wrote = 0;
    else if (!f && fd >= 0)
        close(fd);
    if (wrote) {
        ditd_text_lora *t = NULL;
        err = ditd_prompt_encoder_lora_open(pe, path, "bad", &t);
        TU_CHECK(err ? t == NULL : t != NULL, "an error leaves no adapter");
        ditd_text_lora_free(t);
    }
    if (fd >= 0)
        unlink(path);
    free(img);
    return err;
}

static int refusals(const ditd_prompt_encoder *pe, const ditd_pipeline *p)
{
    int n = 0;
#define A_ "text_encoder.text_model.encoder.layers."
    /* the good one first (so the refusals below are about the one change) */
    TU_OK(try_text(pe, A_ "1.self_attn.q_proj.lora_A.weight", 2, 6,
                   A_ "1.self_attn.q_proj.lora_B.weight", 6, 2));
    TU_OK(try_text(pe, "text_encoder.encoder.layers.1.mlp.fc1.lora_A.weight", 2, 6,
                   "text_encoder.encoder.layers.1.mlp.fc1.lora_B.weight", 14, 2));
    /* a layer the CLIP lacks (it has 2) */
    TU_CHECK_ERR(try_text(pe, A_ "5.self_attn.q_proj.lora_A.weight", 2, 6,
                          A_ "5.self_attn.q_proj.lora_B.weight", 6, 2),
                 DITD_ENOENT, "'" A_ "5.self_attn.q_proj.lora_A.weight'",
                 "has no linear module 'text_model.encoder.layers.5.self_attn.q_proj'");
    n++;
    /* A of the wrong width; B of the wrong height */
    TU_CHECK_ERR(try_text(pe, A_ "0.mlp.fc2.lora_A.weight", 2, 6, A_ "0.mlp.fc2.lora_B.weight",
                          6, 2),
                 DITD_ESHAPE, "'" A_ "0.mlp.fc2.lora_A.weight'", "takes 14 inputs");
    n++;
    TU_CHECK_ERR(try_text(pe, A_ "0.mlp.fc1.lora_A.weight", 2, 6, A_ "0.mlp.fc1.lora_B.weight",
                          6, 2),
                 DITD_ESHAPE, "'" A_ "0.mlp.fc1.lora_B.weight'", "expected (14, 2)");
    n++;
    /* a T5 module name under the CLIP, and a T5 block it lacks */
    TU_CHECK_ERR(try_text(pe, "text_encoder.encoder.block.0.layer.0.SelfAttention.q.lora_A.weight",
                          2, 6, "text_encoder.encoder.block.0.layer.0.SelfAttention.q.lora_B.weight",
                          6, 2),
                 DITD_ENOENT, "text_encoder (CLIP) has no linear module");
    n++;
    TU_CHECK_ERR(try_text(pe, "text_encoder_2.encoder.block.3.layer.0.SelfAttention.q.lora_A.weight",
                          2, 6, "text_encoder_2.encoder.block.3.layer.0.SelfAttention.q.lora_B.weight",
                          9, 2),
                 DITD_ENOENT, "'text_encoder_2.encoder.block.3.layer.0.SelfAttention.q.lora_A.weight'",
                 "text_encoder_2 (T5) has no linear module");
    n++;
    /* a component FLUX lacks; kohya names for the T5 */
    TU_CHECK_ERR(try_text(pe, "text_encoder_3.encoder.block.0.layer.0.SelfAttention.q.lora_A.weight",
                          2, 6, "text_encoder_3.encoder.block.0.layer.0.SelfAttention.q.lora_B.weight",
                          9, 2),
                 DITD_ENOENT, "'text_encoder_3.", "a text encoder this model does not have");
    n++;
    TU_CHECK_ERR(try_text(pe, "lora_te2_encoder_block_0_layer_0_SelfAttention_q.lora_down.weight",
                          2, 6, "lora_te2_encoder_block_0_layer_0_SelfAttention_q.lora_up.weight",
                          9, 2),
                 DITD_ENOENT, "'lora_te2_encoder_block_0_layer_0_SelfAttention_q.lora_down.weight'",
                 "kohya names for a T5 are not read");
    n++;
    /* B twice (lora_B and lora_up), no A */
    TU_CHECK_ERR(try_text(pe, A_ "0.self_attn.v_proj.lora_B.weight", 6, 2,
                          A_ "0.self_attn.v_proj.lora_up.weight", 6, 2),
                 DITD_EFORMAT, "already has");
    n++;
    /* PEFT and kohya text-encoder names in one file */
    TU_CHECK_ERR(try_text(pe, A_ "0.self_attn.k_proj.lora_A.weight", 2, 6,
                          "lora_te1_text_model_encoder_layers_0_self_attn_k_proj.lora_up.weight",
                          6, 2),
                 DITD_EFORMAT, "names in a");
    n++;
    /* the transformer loader without text encoders refuses them, with them skips them */
    {
        const char *h = "{\"text_encoder.text_model.encoder.layers.0.mlp.fc1.lora_A.weight\":"
                        "{\"dtype\":\"F32\",\"shape\":[1,6],\"data_offsets\":[0,24]}}";
        float d[6] = {1, 2, 3, 4, 5, 6};
        size_t len;
        uint8_t *img = tu_st_image(h, d, sizeof d, &len);
        ditd_lora *l = NULL;
        TU_CHECK_ERR(ditd_lora_open_mem(img, len, "x.safetensors", "x", p->den->lora_targets,
                                        p->den->n_lora_targets, &l),
                     DITD_EUNSUPPORTED, "text_encoder.text_model.encoder.layers.0.mlp.fc1.lora_A",
                     "no text encoder");
        ditd_lora_free(l);
        free(img);
        n++;
    }
    for (int i = 0; i < n_ads; i++) { /* a text-only file: a transformer part of no modules */
        ditd_lora *l = NULL;
        TU_OK(ditd_lora_open_transformer(ads[i].path, ads[i].name, p->den->lora_targets,
                                         p->den->n_lora_targets, &l));
        TU_CHECK(!l || l->n_mod == (strcmp(ads[i].name, "c4") ? 0 : 3),
                 "%s: %d transformer modules", ads[i].name, l ? l->n_mod : -1);
        ditd_lora_free(l);
    }
#undef A_
    return n;
}

/* ---- SD3: both CLIPs by SD3LoraLoaderMixin, the T5 by PEFT ---- */

static int sd3_cases(json_t *doc)
{
    json_t *sd = json_object_get(doc, "sd3"), *c, *fc = NULL, *e, *fdoc;
    const char *prompt = json_string_value(json_object_get(sd, "prompt"));
    const int L = (int)json_integer_value(json_object_get(sd, "max_sequence_length"));
    char path[4300], edir[4096];
    json_error_t jerr;
    ditd_model_info info;
    ditd_prompt_encoder *pe = NULL;
    ditd_pipeline *p = NULL;
    ditd_text_lora *tl[2] = {0};
    size_t k;
    int ran = 0;
    memset(&info, 0, sizeof info);
    snprintf(edir, sizeof edir, "%s/sd3_pipeline/expected", tu_fixtures());
    snprintf(path, sizeof path, "%s/cases.json", edir);
    fdoc = json_load_file(path, 0, &jerr);
    TU_CHECK(fdoc != NULL, "%s: %s", path, jerr.text);
    json_array_foreach(json_object_get(fdoc, "cases"), k, e)
        if (!strcmp(json_string_value(json_object_get(e, "name")),
                    json_string_value(json_object_get(sd, "case"))))
            fc = e;
    TU_CHECK(fc != NULL, "the SD3 case");
    if (!fc || !prompt)
        goto done;
    snprintf(path, sizeof path, "%s/%s", SD3_PIPELINE_DIR,
             json_string_value(json_object_get(fc, "folder")));
    TU_OK(ditd_model_info_load(path, &info));
    ditd_prompt_encoder_opts po = {.max_sequence_length = L};
    TU_OK(ditd_prompt_encoder_new(&info, &ditd_backend_cpu, &po, &pe));
    TU_OK(ditd_pipeline_new(&info, &ditd_backend_cpu, 1, &p));
    if (!pe || !p)
        goto done;
    static const char *const names[2] = {"g4", "t3"};
    for (int i = 0; i < 2; i++) {
        snprintf(path, sizeof path, "%s/%s", fix_dir(),
                 json_string_value(json_object_get(json_object_get(sd, "adapters"), names[i])));
        TU_OK(ditd_prompt_encoder_lora_open(pe, path, names[i], &tl[i]));
    }
    if (!tl[0] || !tl[1])
        goto done;
    TU_CHECK(tl[0]->dev[0] && tl[0]->dev[1] && !tl[0]->dev[2] && tl[0]->n_mod[0] == 12 &&
                 tl[0]->n_mod[1] == 7,
             "g4: 12 modules on text_encoder, 7 on text_encoder_2, none on the T5");
    TU_CHECK(!tl[1]->dev[0] && !tl[1]->dev[1] && tl[1]->dev[2], "t3: the T5 only");
    const size_t T = (size_t)ditd_prompt_encoder_text_len(pe, L),
                 Dt = (size_t)ditd_prompt_encoder_text_dim(pe),
                 Dp = (size_t)ditd_prompt_encoder_pooled_dim(pe);
    float *seq = calloc(2 * T * Dt, sizeof *seq), *pooled = calloc(2 * Dp, sizeof *pooled);
    size_t nn;
    float *noise = load(edir, json_string_value(json_object_get(fc, "noise")), NULL, &nn);
    float *got = calloc(nn ? nn : 1, sizeof *got);
    TU_OK(ditd_pipeline_set_size(p, (int)json_integer_value(json_object_get(fc, "latent_height")),
                                 (int)json_integer_value(json_object_get(fc, "latent_width")),
                                 (int)T));
    json_array_foreach(json_object_get(sd, "cases"), k, c) {
        const char *name = json_string_value(json_object_get(c, "name"));
        ditd_text_lora_set ts = {0};
        size_t i;
        json_t *u;
        json_array_foreach(json_object_get(c, "uses"), i, u) {
            const char *n = json_string_value(json_object_get(u, "adapter"));
            ts.ad[ts.n] = tl[strcmp(n, "g4") ? 1 : 0];
            ts.weight[ts.n++] = (float)json_number_value(json_object_get(u, "scale"));
        }
        ditd_prompt_texts pt = {.texts = {prompt}, .lens = {strlen(prompt)}};
        ditd_prompt_texts nt = {.texts = {""}, .lens = {0}};
        TU_OK(ditd_prompt_encoder_encode_lora(pe, &pt, L, &ts, seq, pooled));
        TU_OK(ditd_prompt_encoder_encode_lora(pe, &nt, L, &ts, seq + T * Dt, pooled + Dp));
        static const char *const what[4] = {"seq", "pooled", "neg_seq", "neg_pooled"};
        const float *mine[4] = {seq, pooled, seq + T * Dt, pooled + Dp};
        const size_t want_n[4] = {T * Dt, Dp, T * Dt, Dp};
        int ok = 1;
        for (int w = 0; w < 4; w++) {
            size_t n;
            char label[160];
            float *r = load(fix_dir(), json_string_value(json_object_get(c, what[w])), NULL, &n);
            TU_CHECK(r && n == want_n[w], "%s %s: %zu values, want %zu", name, what[w], n,
                     want_n[w]);
            if (r && n == want_n[w]) {
                snprintf(label, sizeof label, "SD3 %s %s", name, what[w]);
                TU_CLOSE(label, mine[w], r, n, EMB_TOL);
            } else {
                ok = 0;
            }
            free(r);
        }
        size_t no;
        float *ro = load(fix_dir(), json_string_value(json_object_get(c, "out")), NULL, &no);
        if (ok && ro && noise && no == nn) {
            ditd_text_embeds te[2] = {{.seq = seq, .pooled = pooled},
                                      {.seq = seq + T * Dt, .pooled = pooled + Dp}};
            ditd_gen_sample smp = {
                .guidance = (float)json_number_value(json_object_get(fc, "guidance_scale")),
                .true_cfg = 1.0f};
            smp.cond.prompt = &te[0];
            smp.cond.negative = &te[1];
            ditd_gen_params gp = {
                .steps = (int)json_integer_value(json_object_get(fc, "num_inference_steps")),
                .sampler = p->sched_base.kind};
            char label[160];
            TU_OK(ditd_pipeline_generate(p, &gp, 1, &smp, noise, got, NULL, NULL, NULL));
            snprintf(label, sizeof label, "SD3 %s final latents", name);
            TU_CLOSE(label, got, ro, no, LAT_TOL);
            ran++;
        }
        free(ro);
    }
    free(seq), free(pooled), free(noise), free(got);
done:
    for (int i = 0; i < 2; i++)
        ditd_text_lora_free(tl[i]);
    ditd_prompt_encoder_free(pe);
    ditd_pipeline_free(p);
    ditd_model_info_free(&info);
    json_decref(fdoc);
    return ran;
}

int main(void)
{
    char path[4300], mdir[4096];
    json_error_t jerr;
    ditd_model_info info;
    ditd_pipeline *p = NULL;
    ditd_prompt_encoder *pe = NULL, *pc = NULL;
    int cases = 0, batch = 0, refused = 0, sd3 = 0;

    snprintf(path, sizeof path, "%s/cases.json", fix_dir());
    json_t *doc = json_load_file(path, 0, &jerr);
    TU_CHECK(doc != NULL, "%s: %s", path, jerr.text);
    if (!doc)
        return tu_exit();
    snprintf(mdir, sizeof mdir, "%s/dev", FLUX_PIPELINE_DIR);
    TU_OK(ditd_model_info_load(mdir, &info));
    TU_OK(ditd_pipeline_new(&info, &ditd_backend_cpu, 1, &p));
    int L = (int)json_integer_value(json_object_get(doc, "max_sequence_length"));
    ditd_prompt_encoder_opts po = {.max_sequence_length = L};
    TU_OK(ditd_prompt_encoder_new(&info, &ditd_backend_cpu, &po, &pe));
    po.cache_entries = 64;
    po.cache_bytes = 64u << 20;
    TU_OK(ditd_prompt_encoder_new(&info, &ditd_backend_cpu, &po, &pc));
    if (!p || !pe || !pc)
        goto done;

    const char *key;
    json_t *v;
    json_object_foreach(json_object_get(doc, "adapters"), key, v) {
        adapter *a = &ads[n_ads];
        ditd_lora *l = NULL;
        if (n_ads == MAX_AD)
            break;
        a->name = key;
        snprintf(a->path, sizeof a->path, "%s/%s", fix_dir(), json_string_value(v));
        TU_OK(ditd_prompt_encoder_lora_open(pe, a->path, key, &a->text));
        TU_OK(ditd_lora_open_transformer(a->path, key, p->den->lora_targets,
                                         p->den->n_lora_targets, &l));
        if (l)
            TU_OK(ditd_lora_dev_new(l, p->ops, p->den->lora_targets, p->den->n_lora_targets, &a->den));
        ditd_lora_free(l);
        if (a->text && a->den)
            n_ads++;
    }
    TU_CHECK(n_ads == 3, "%d adapters opened, 3 expected", n_ads);
    /* the cache encoder's adapters are the same files opened on it */
    cases = diffusers_cases(doc, &info, p, pe, pc);
    batch = batch_checks();
    refused = refusals(pe, p);
    sd3 = sd3_cases(doc);
done:
    for (int i = 0; i < n_ads; i++) {
        ditd_text_lora_free(ads[i].text);
        ditd_lora_dev_free(ads[i].den);
    }
    printf("cases: %d FLUX and %d SD3 against Diffusers, %d batch rows against alone, %d "
           "refusals\n", cases, sd3, batch, refused);
    TU_CHECK(cases >= 6 && sd3 >= 2 && batch >= 8 && refused >= 10,
             "checked %d FLUX, %d SD3 cases, %d batch rows, %d refusals (want 6, 2, 8, 10)",
             cases, sd3, batch, refused);
    ditd_prompt_encoder_free(pe);
    ditd_prompt_encoder_free(pc);
    ditd_pipeline_free(p);
    ditd_model_info_free(&info);
    json_decref(doc);
    return tu_exit();
}
