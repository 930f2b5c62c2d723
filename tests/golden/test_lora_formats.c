/* The community FLUX LoRA formats against Diffusers
 * (tools/make_lora_format_fixtures.py, engine/models/lora_convert.c): the
 * assembled tiny FLUX.1-dev folder with adapters in kohya-over-BFL names,
 * BFL / ComfyUI names (lora_down / lora_up + alpha and lora_A / lora_B),
 * XLabs names and ai-toolkit's (Diffusers names, on x_embedder and the final
 * proj_out too), ranks 4 and 8, scales 1, 0.5, -1, two at once, some
 * modules only: final latents within 1e-4 of Diffusers' float64
 * load_lora_weights + set_adapters. Then what the conversion made of the
 * files (formats, the q|k|v and linear1 splits, the split by rank of a
 * block-diagonal up matrix, norm_out's swapped halves, proj_out's re-laid
 * rows, final_layer's alpha left out as Diffusers does), and the refusals:
 * a block or module the model lacks, shapes that do not fit, formats mixed,
 * spellings mixed, unknown modules, Control LoRAs, text-encoder tensors and
 * full-weight differences, each naming the tensor. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/backend/backend.h"
#include "engine/core/error.h"
#include "engine/io/npy.h"
#include "engine/io/safetensors.h"
#include "engine/models/lora.h"
#include "engine/models/model.h"
#include "engine/pipeline/pipeline.h"
#include "tests/test_util.h"

#define TOL 1e-4
#define MAX_AD 8

typedef struct adapters {
    int n;
    const char *name[MAX_AD];
    ditd_lora *host[MAX_AD];
    ditd_lora_dev *dev[MAX_AD];
} adapters;

static const char *fmt_dir(void)
{
    static char dir[4096];
    snprintf(dir, sizeof dir, "%s/lora_formats", tu_fixtures());
    return dir;
}

static float *load(const char *dir, const char *name, int64_t *shape)
{
    char path[4300];
    float *d = NULL;
    int nd;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    TU_OK(ditd_npy_read_f32(path, 4, &nd, shape, &d));
    return d;
}

static int find_ad(const adapters *ad, const char *n)
{
    for (int k = 0; k < ad->n; k++)
        if (!strcmp(ad->name[k], n))
            return k;
    return -1;
}

static int target_of(const ditd_pipeline *p, const char *name)
{
    for (int i = 0; i < p->den->n_lora_targets; i++)
        if (!strcmp(p->den->lora_targets[i].name, name))
            return i;
    return -1;
}

static const ditd_lora_module *mod_of(const ditd_lora *l, int target)
{
    for (int i = 0; l && i < l->n_mod; i++)
        if (l->mod[i].target == target)
            return &l->mod[i];
    return NULL;
}

/* ---- what the conversion made of the files ---- */

static float *read_tensor(const char *file, const char *name, size_t *n)
{
    char path[4300];
    ditd_safetensors *st = NULL;
    float *v = NULL;
    snprintf(path, sizeof path, "%s/%s", fmt_dir(), file);
    TU_OK(ditd_safetensors_open(path, &st));
    const ditd_st_tensor *t = st ? ditd_safetensors_find(st, name) : NULL;
    TU_CHECK(t != NULL, "%s has no %s", file, name);
    if (t) {
        *n = 1;
        for (int i = 0; i < t->ndim; i++)
            *n *= (size_t)t->shape[i];
        v = malloc(*n * sizeof *v);
        TU_OK(ditd_safetensors_read_f32(st, name, t->ndim, t->shape, v));
    }
    ditd_safetensors_free(st);
    return v;
}

static void structure(const ditd_pipeline *p, const adapters *ad, json_t *files)
{
    int kb4 = find_ad(ad, "kb4"), kb8 = find_ad(ad, "kb8");
    const char *kb4_file = json_string_value(json_object_get(files, "kb4"));
    TU_CHECK(kb4 >= 0 && kb8 >= 0 && kb4_file, "kb4 and kb8 opened");
    if (kb4 < 0 || kb8 < 0 || !kb4_file)
        return;
    const ditd_lora *l4 = ad->host[kb4], *l8 = ad->host[kb8];
    static const struct { const char *ad, *fmt; } want[] = {
        {"kb4", "kohya-bfl"}, {"bfl4", "bfl"}, {"kb8", "bfl"},
        {"x4", "xlabs"}, {"x8", "xlabs"}, {"ait8", "peft"},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        int k = find_ad(ad, want[i].ad);
        TU_CHECK(k >= 0 && !strcmp(ditd_lora_format_name(ad->host[k]->format), want[i].fmt),
                 "adapter %s read as %s", want[i].ad, k >= 0 ? ditd_lora_format_name(ad->host[k]->format) : "-");
    }
    /* every BFL module: every one of the model's targets, x_embedder and proj_out too */
    TU_CHECK(l4->n_mod == p->den->n_lora_targets, "kb4: %d modules, the model has %d targets",
             l4->n_mod, p->den->n_lora_targets);
    /* scales: alpha / rank, but final_layer's alpha (8) left out */
    static const struct { const char *mod; float scale; } sc[] = {
        {"transformer_blocks.0.attn.to_q", 0.5f}, {"transformer_blocks.1.attn.add_v_proj", 0.5f},
        {"single_transformer_blocks.0.proj_mlp", 0.5f}, {"x_embedder", 1.0f},
        {"context_embedder", 0.25f}, {"norm_out.linear", 1.0f}, {"proj_out", 1.0f},
    };
    for (size_t i = 0; i < sizeof sc / sizeof sc[0]; i++) {
        const ditd_lora_module *m = mod_of(l4, target_of(p, sc[i].mod));
        TU_CHECK(m && m->scale == sc[i].scale, "kb4 %s: scale %g, want %g", sc[i].mod,
                 m ? (double)m->scale : -1.0, (double)sc[i].scale);
    }
    /* q|k|v: A shared, B split by rows */
    {
        size_t na, nb;
        float *A = read_tensor(kb4_file, "lora_unet_double_blocks_0_img_attn_qkv.lora_down.weight", &na);
        float *B = read_tensor(kb4_file, "lora_unet_double_blocks_0_img_attn_qkv.lora_up.weight", &nb);
        const ditd_lora_module *k = mod_of(l4, target_of(p, "transformer_blocks.0.attn.to_k"));
        int ok = A && B && k && k->rank == 4 && na == (size_t)4 * k->k_in &&
                 !memcmp(k->a, A, na * sizeof *A) &&
                 !memcmp(k->b, B + (size_t)k->n_out * 4, (size_t)k->n_out * 4 * sizeof *B);
        TU_CHECK(ok, "kb4 to_k: qkv's A and the middle third of its B");
        free(A), free(B);
    }
    /* norm_out: the halves of B swapped */
    {
        size_t nb;
        float *B = read_tensor(kb4_file, "lora_unet_final_layer_adaLN_modulation_1.lora_up.weight", &nb);
        const ditd_lora_module *m = mod_of(l4, target_of(p, "norm_out.linear"));
        size_t h = m ? (size_t)m->n_out / 2 * 4 : 0;
        TU_CHECK(B && m && nb == 2 * h && !memcmp(m->b, B + h, h * sizeof *B) &&
                     !memcmp(m->b + h, B, h * sizeof *B),
                 "kb4 norm_out.linear: B = [second half, first half] of the file's");
        free(B);
    }
    /* proj_out: B's rows re-laid as the model keeps them, (c, q) -> (q, c) */
    {
        size_t nb;
        float *B = read_tensor(kb4_file, "lora_unet_final_layer_linear.lora_up.weight", &nb);
        const ditd_lora_module *m = mod_of(l4, target_of(p, "proj_out"));
        int ok = B && m && nb == (size_t)m->n_out * 4, C = m ? m->n_out / 4 : 0;
        for (int o = 0; ok && o < m->n_out; o++)
            ok = !memcmp(m->b + ((size_t)(o % 4) * C + o / 4) * 4, B + (size_t)o * 4,
                         4 * sizeof *B);
        TU_CHECK(ok, "kb4 proj_out: B's row c*4+q at q*C+c");
        free(B);
    }
    /* kb8: linear1's up matrix is block-diagonal, so rank 8 splits by rank (2 each) */
    static const char *const l1[] = {"single_transformer_blocks.0.attn.to_q",
                                     "single_transformer_blocks.0.attn.to_v",
                                     "single_transformer_blocks.0.proj_mlp"};
    for (int i = 0; i < 3; i++) {
        const ditd_lora_module *m = mod_of(l8, target_of(p, l1[i]));
        TU_CHECK(m && m->rank == 2 && m->scale == 2.0f, "kb8 %s: rank %d scale %g (want 2, 2)",
                 l1[i], m ? m->rank : -1, m ? (double)m->scale : -1.0);
    }
    const ditd_lora_module *q8 = mod_of(l8, target_of(p, "transformer_blocks.0.attn.to_q"));
    TU_CHECK(q8 && q8->rank == 8, "kb8 img_attn.qkv (not block-diagonal) keeps rank 8");
    TU_CHECK(l8->n_mod == 3 + 1 + 1 + 1 + 4 + 1, "kb8: %d modules, 11 expected", l8->n_mod);
}

/* ---- against Diffusers ---- */

static int cases(ditd_pipeline *p, json_t *doc, const adapters *ad)
{
    char edir[4096], fpath[4300];
    json_error_t jerr;
    json_t *c, *fdoc;
    size_t k;
    int ran = 0;

    snprintf(edir, sizeof edir, "%s/flux_pipeline/expected", tu_fixtures());
    snprintf(fpath, sizeof fpath, "%s/cases.json", edir);
    fdoc = json_load_file(fpath, 0, &jerr);
    TU_CHECK(fdoc != NULL, "%s: %s", fpath, jerr.text);
    if (!fdoc)
        return 0;
    json_array_foreach(json_object_get(doc, "cases"), k, c) {
        const char *name = json_string_value(json_object_get(c, "name"));
        json_t *fc = NULL, *e, *u;
        size_t j;
        json_array_foreach(json_object_get(fdoc, "cases"), j, e)
            if (!strcmp(json_string_value(json_object_get(e, "name")),
                        json_string_value(json_object_get(c, "flux_case"))))
                fc = e;
        TU_CHECK(fc != NULL, "%s: flux case", name);
        if (!fc)
            continue;
        ditd_lora_set set = {0};
        json_array_foreach(json_object_get(c, "samples"), j, u) {
            int a = find_ad(ad, json_string_value(json_object_get(u, "adapter")));
            TU_CHECK(a >= 0 && set.n < DITD_LORA_MAX_SET, "%s: adapter %d", name, a);
            if (a < 0 || set.n == DITD_LORA_MAX_SET)
                continue;
            set.ad[set.n] = ad->dev[a];
            set.weight[set.n++] = (float)json_number_value(json_object_get(u, "scale"));
        }
        int64_t sh[4], sn[4], so[4];
        float *emb = load(edir, json_string_value(json_object_get(fc, "prompt_embeds")), sh);
        float *pool = load(edir, json_string_value(json_object_get(fc, "pooled")), sh);
        float *noise = load(edir, json_string_value(json_object_get(fc, "noise")), sn);
        float *want = load(fmt_dir(), json_string_value(json_object_get(c, "out")), so);
        TU_OK(ditd_pipeline_set_size(p, (int)json_integer_value(json_object_get(fc, "latent_height")),
                                     (int)json_integer_value(json_object_get(fc, "latent_width")),
                                     (int)json_integer_value(json_object_get(fc, "max_sequence_length"))));
        ditd_text_embeds te = {.seq = emb, .pooled = pool};
        ditd_gen_sample smp = {.guidance = (float)json_number_value(json_object_get(fc, "guidance_scale")),
                               .loras = &set};
        smp.cond.prompt = &te;
        ditd_gen_params gp = {.steps = (int)json_integer_value(json_object_get(fc, "num_inference_steps")),
                              .sampler = p->sched_base.kind};
        if (emb && pool && noise && want && sn[0] == 1 && set.n > 0) {
            size_t numel = (size_t)(sn[1] * sn[2] * sn[3]);
            float *got = calloc(numel, sizeof *got);
            char what[200];
            TU_OK(ditd_pipeline_generate(p, &gp, 1, &smp, noise, got, NULL, NULL, NULL));
            snprintf(what, sizeof what, "%s (%s)", name,
                     json_string_value(json_object_get(c, "reference")));
            TU_CLOSE(what, got, want, numel, TOL);
            ran++;
            free(got);
        }
        free(emb), free(pool), free(noise), free(want);
    }
    json_decref(fdoc);
    return ran;
}

/* ---- refusals ---- */

/* An adapter of F32 tensors named and shaped by spec ("name:d0,d1;..."),
 * values 0.01 i (zero when the name ends in '!'), opened against p's
 * targets; returns the error and leaves the adapter in *out (NULL: freed). */
static int try_spec(const ditd_pipeline *p, const char *spec, ditd_lora **out)
{
    char header[4096] = "{", names[16][160];
    float data[4096];
    size_t off = 0, len;
    int nt = 0;
    const char *s = spec;
    while (*s && nt < 16) {
        const char *colon = strchr(s, ':'), *semi = strchr(s, ';');
        if (!semi)
            semi = s + strlen(s);
        size_t nl = (size_t)(colon - s);
        int zero = nl > 0 && s[nl - 1] == '!';
        snprintf(names[nt], sizeof names[nt], "%.*s", (int)(nl - (size_t)zero), s);
        int64_t dims[4];
        int nd = 0;
        size_t n = 1;
        for (const char *d = colon + 1; d < semi && nd < 4;) {
            dims[nd] = strtoll(d, (char **)&d, 10);
            n *= (size_t)dims[nd++];
            if (*d == ',')
                d++;
        }
        char shape[64] = "";
        for (int i = 0; i < nd; i++)
            snprintf(shape + strlen(shape), sizeof shape - strlen(shape), i ? ",%lld" : "%lld",
                     (long long)dims[i]);
        snprintf(header + strlen(header), sizeof header - strlen(header),
                 "%s\"%s\":{\"dtype\":\"F32\",\"shape\":[%s],\"data_offsets\":[%zu,%zu]}",
                 nt ? "," : "", names[nt], shape, off * 4, (off + n) * 4);
        for (size_t i = 0; i < n && off < 4096; i++, off++)
            data[off] = zero ? 0.0f : 0.01f * (float)(off % 97 + 1);
        nt++;
        s = *semi ? semi + 1 : semi;
    }
    strcat(header, "}");
    uint8_t *img = tu_st_image(header, data, off * 4, &len);
    ditd_lora *l = NULL;
    int err = ditd_lora_open_mem(img, len, "t.safetensors", "t", p->den->lora_targets,
                                 p->den->n_lora_targets, &l);
    TU_CHECK(err ? l == NULL : l != NULL, "an error leaves no adapter");
    free(img);
    if (out)
        *out = l;
    else
        ditd_lora_free(l);
    return err;
}

static void refusals(const ditd_pipeline *p)
{
    /* the tiny model: inner dim 32, MLP 128, 2 double blocks, 1 single, 64 channels */
    ditd_lora *l = NULL;
    TU_OK(try_spec(p, "lora_unet_double_blocks_1_img_attn_qkv.lora_down.weight:2,32;"
                      "lora_unet_double_blocks_1_img_attn_qkv.lora_up.weight:96,2", NULL));
    TU_CHECK_ERR(try_spec(p, "lora_unet_double_blocks_2_img_attn_qkv.lora_down.weight:2,32;"
                             "lora_unet_double_blocks_2_img_attn_qkv.lora_up.weight:96,2", NULL),
                 DITD_ENOENT, "lora_unet_double_blocks_2_img_attn_qkv.lora_down.weight",
                 "transformer_blocks.2.attn.to_q", "does not have");
    TU_CHECK_ERR(try_spec(p, "diffusion_model.single_blocks.3.linear2.lora_A.weight:2,160;"
                             "diffusion_model.single_blocks.3.linear2.lora_B.weight:32,2", NULL),
                 DITD_ENOENT, "single_blocks.3.linear2.lora_A.weight",
                 "single_transformer_blocks.3.proj_out");
    TU_CHECK_ERR(try_spec(p, "double_blocks.5.processor.proj_lora1.down.weight:2,32;"
                             "double_blocks.5.processor.proj_lora1.up.weight:32,2", NULL),
                 DITD_ENOENT, "double_blocks.5.processor.proj_lora1.down.weight",
                 "transformer_blocks.5.attn.to_out.0");
    /* shapes: a fused up matrix of the wrong height, a down of the wrong width */
    TU_CHECK_ERR(try_spec(p, "lora_unet_single_blocks_0_linear1.lora_down.weight:2,32;"
                             "lora_unet_single_blocks_0_linear1.lora_up.weight:96,2", NULL),
                 DITD_ESHAPE, "lora_unet_single_blocks_0_linear1.lora_up.weight",
                 "expected (224, 2)");
    TU_CHECK_ERR(try_spec(p, "double_blocks.0.processor.qkv_lora2.down.weight:4,16;"
                             "double_blocks.0.processor.qkv_lora2.up.weight:96,4", NULL),
                 DITD_ESHAPE, "double_blocks.0.processor.qkv_lora2.down.weight",
                 "expected (4, 32)");
    TU_CHECK_ERR(try_spec(p, "diffusion_model.img_in.lora_A.weight:2,16;"
                             "diffusion_model.img_in.lora_B.weight:32,2", NULL),
                 DITD_ESHAPE, "diffusion_model.img_in.lora_A.weight", "x_embedder",
                 "expected (2, 64)");
    /* formats mixed */
    TU_CHECK_ERR(try_spec(p, "lora_unet_double_blocks_0_img_attn_qkv.lora_down.weight:2,32;"
                             "lora_unet_double_blocks_0_img_attn_qkv.lora_up.weight:96,2;"
                             "transformer.proj_out.lora_A.weight:2,32;"
                             "transformer.proj_out.lora_B.weight:64,2", NULL),
                 DITD_EFORMAT, "transformer.proj_out.lora_A.weight", "in a kohya-bfl file");
    TU_CHECK_ERR(try_spec(p, "double_blocks.0.processor.proj_lora1.down.weight:2,32;"
                             "double_blocks.0.processor.proj_lora1.up.weight:32,2;"
                             "lora_unet_double_blocks_0_img_mlp_0.lora_down.weight:2,32;"
                             "lora_unet_double_blocks_0_img_mlp_0.lora_up.weight:128,2", NULL),
                 DITD_EFORMAT, "lora_unet_double_blocks_0_img_mlp_0.lora_down.weight",
                 "kohya-bfl names in a xlabs file");
    TU_CHECK_ERR(try_spec(p, "lora_unet_double_blocks_0_img_mlp_0.lora_down.weight:2,32;"
                             "lora_unet_double_blocks_0_img_mlp_0.lora_up.weight:128,2;"
                             "lora_unet_transformer_blocks_0_attn_to_q.lora_down.weight:2,32;"
                             "lora_unet_transformer_blocks_0_attn_to_q.lora_up.weight:32,2", NULL),
                 DITD_EFORMAT, "lora_unet_transformer_blocks_0_attn_to_q", "kohya (Diffusers modules)");
    TU_CHECK_ERR(try_spec(p, "diffusion_model.img_in.lora_A.weight:2,64;"
                             "diffusion_model.img_in.lora_up.weight:32,2", NULL),
                 DITD_EFORMAT, "diffusion_model.img_in.lora_up.weight", "spellings mixed");
    /* names that are no module ditd maps, alpha in XLabs, A without B */
    TU_CHECK_ERR(try_spec(p, "lora_unet_double_blocks_0_img_attn_norm.lora_down.weight:2,32", NULL),
                 DITD_EFORMAT, "lora_unet_double_blocks_0_img_attn_norm.lora_down.weight",
                 "not a FLUX module");
    TU_CHECK_ERR(try_spec(p, "double_blocks.0.processor.qkv_lora1.alpha:", NULL), DITD_EFORMAT,
                 "double_blocks.0.processor.qkv_lora1.alpha", "not a LoRA tensor");
    TU_CHECK_ERR(try_spec(p, "lora_unet_txt_in.lora_down.weight:2,6", NULL), DITD_EFORMAT,
                 "lora_unet_txt_in.lora_down.weight", "no up (B)");
    TU_CHECK_ERR(try_spec(p, "lora_unet_double_blocks_x_img_mlp_0.lora_down.weight:2,32", NULL),
                 DITD_EFORMAT, "no block number");
    /* Control LoRAs, text encoders, full-weight differences (zero ones skipped) */
    TU_CHECK_ERR(try_spec(p, "diffusion_model.img_in.lora_A.weight:2,128;"
                             "diffusion_model.img_in.lora_B.weight:32,2;"
                             "diffusion_model.double_blocks.0.img_attn.norm.query_norm.scale:16",
                          NULL),
                 DITD_EUNSUPPORTED, "query_norm.scale", "Control LoRA");
    TU_CHECK_ERR(try_spec(p, "lora_te1_text_model_encoder_layers_0_mlp_fc1.lora_down.weight:2,4;"
                             "lora_unet_img_in.lora_down.weight:2,64;"
                             "lora_unet_img_in.lora_up.weight:32,2", NULL),
                 DITD_EUNSUPPORTED, "lora_te1_text_model", "text-encoder");
    TU_CHECK_ERR(try_spec(p, "diffusion_model.img_in.diff_b:32;"
                             "diffusion_model.img_in.lora_A.weight:2,64;"
                             "diffusion_model.img_in.lora_B.weight:32,2", NULL),
                 DITD_EUNSUPPORTED, "diffusion_model.img_in.diff_b", "full-weight difference");
    TU_OK(try_spec(p, "diffusion_model.img_in.diff_b!:32;"
                      "diffusion_model.img_in.lora_A.weight:2,64;"
                      "diffusion_model.img_in.lora_B.weight:32,2", &l));
    TU_CHECK(l && l->n_mod == 1 && l->format == DITD_LORA_FORMAT_BFL,
             "a zero .diff_b is skipped (Diffusers purges it), the rest read");
    ditd_lora_free(l);
    /* another family (the DiT's linears): BFL names are modules it lacks */
    {
        static const ditd_lora_target dit[] = {
            {.name = "transformer_blocks.0.attn1.to_q", .n_out = 32, .k_in = 32},
        };
        float d[64] = {0.5f};
        size_t len;
        uint8_t *img = tu_st_image("{\"lora_unet_double_blocks_0_img_mlp_0.lora_down.weight\":"
                                "{\"dtype\":\"F32\",\"shape\":[2,32],\"data_offsets\":[0,256]}}",
                                d, sizeof d, &len);
        TU_CHECK_ERR(ditd_lora_open_mem(img, len, "dit.safetensors", "t", dit, 1, &l),
                     DITD_ENOENT, "no linear module 'double_blocks_0_img_mlp_0'");
        free(img);
    }
    /* a module twice: ComfyUI's dotted and kohya's spelling of one */
    TU_CHECK_ERR(try_spec(p, "lora_unet_img_in.lora_down.weight:2,64;"
                             "lora_unet_img_in.lora_up.weight:32,2;"
                             "lora_unet_img.in.lora_down.weight:2,64", NULL),
                 DITD_EFORMAT, "already has");
}

int main(void)
{
    char path[4300], mdir[4096];
    json_error_t jerr;
    ditd_model_info info;
    ditd_pipeline *p = NULL;
    adapters ad = {0};
    int ran = 0;

    snprintf(path, sizeof path, "%s/cases.json", fmt_dir());
    json_t *doc = json_load_file(path, 0, &jerr);
    TU_CHECK(doc != NULL, "%s: %s", path, jerr.text);
    snprintf(mdir, sizeof mdir, "%s/dev", FLUX_PIPELINE_DIR);
    TU_OK(ditd_model_info_load(mdir, &info));
    TU_OK(ditd_pipeline_new(&info, &ditd_backend_cpu, 1, &p));
    if (!doc || !p)
        goto done;
    const char *key;
    json_t *v, *files = json_object_get(doc, "adapters");
    json_object_foreach(files, key, v) {
        ditd_lora *l = NULL;
        snprintf(path, sizeof path, "%s/%s", fmt_dir(), json_string_value(v));
        TU_OK(ditd_lora_open(path, key, p->den->lora_targets, p->den->n_lora_targets, &l));
        if (!l || ad.n == MAX_AD) {
            ditd_lora_free(l);
            continue;
        }
        ad.name[ad.n] = key;
        ad.host[ad.n] = l;
        TU_OK(ditd_lora_dev_new(l, p->ops, p->den->lora_targets, p->den->n_lora_targets,
                                &ad.dev[ad.n]));
        if (ad.dev[ad.n])
            ad.n++;
        else
            ditd_lora_free(l);
    }
    TU_CHECK(ad.n == 6, "%d adapters opened, 6 expected", ad.n);
    structure(p, &ad, files);
    ran = cases(p, doc, &ad);
    refusals(p);
    printf("cases: %d FLUX community-format cases against Diffusers\n", ran);
    TU_CHECK(ran >= 9, "checked %d cases (want 9)", ran);
done:
    for (int i = 0; i < ad.n; i++) {
        ditd_lora_dev_free(ad.dev[i]);
        ditd_lora_free(ad.host[i]);
    }
    json_decref(doc);
    ditd_pipeline_free(p);
    ditd_model_info_free(&info);
    return tu_exit();
}
