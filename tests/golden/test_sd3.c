/* Golden: the SD3 / SD3.5 transformer (SD3Transformer2DModel) of every
 * fixture model against Diffusers computed in float64
 * (tools/make_sd3_fixtures.py): SD3 (no QK norm, the positional table
 * computed), SD3.5-like (QK RMSNorm, MMDiT-X dual attention, the table from
 * the checkpoint), the same in a bf16 checkpoint; non-square latents with
 * the table cropped off-centre, odd text lengths, batch 2, skip-layer
 * guidance on and off.
 * Bound: max|ours - ref| / max|ref| <= 1e-5 on every output; at least 10
 * cases must be checked. The bf16-weight CPU table on the same cases: no
 * farther from the reference than Diffusers' own bf16 run. Also: the
 * registry hands out the SD3 family, its shapes come from the config, the
 * table's set_size and forward (with conditioning rows and
 * ditd_cond.skip_layers) give the same numbers, sizes and skip lists it
 * cannot take are refused, checkpoints that disagree with their config are
 * refused naming the tensor, and bad configs are refused naming key and
 * value. */
#include <string.h>

#include "engine/backend/backend.h"
#include "engine/models/registry.h"
#include "engine/models/sd3/sd3.h"
#include "tests/sd3_case.h"

#define TOL 1e-5
#define MIN_CASES 10

static int run_model(const char *dir)
{
    char path[4200];
    ditd_sd3_config cfg;
    int checked = 0;
    size_t i;
    json_t *c, *cases = sd3_cases(dir);
    snprintf(path, sizeof path, "%s/config.json", dir);
    TU_OK(ditd_sd3_config_load(path, &cfg));
    json_array_foreach(cases, i, c) {
        sd3_case fc;
        ditd_sd3 *m = NULL;
        if (sd3_case_load(dir, c, &fc) == 0)
            TU_OK(ditd_sd3_new_mesh(&cfg, &ditd_backend_cpu, fc.B, fc.h, fc.w, fc.L, dir, NULL,
                                    &m));
        if (m) {
            float *got = calloc(fc.n_out, sizeof *got);
            TU_CHECK(fc.n_out == (size_t)fc.B * (size_t)cfg.out_channels * fc.h * fc.w,
                     "out size");
            TU_OK(ditd_sd3_forward(m, fc.B, fc.x, fc.t, fc.text, fc.pooled, fc.skip, fc.n_skip,
                                   got));
            char what[512];
            snprintf(what, sizeof what, "%s forward[%zu] B=%d latent %dx%d text %d, %d skipped",
                     dir, i, fc.B, fc.w, fc.h, fc.L, fc.n_skip);
            TU_CLOSE(what, got, fc.out, fc.n_out, TOL);
            checked++;
            if (fc.n_skip) { /* the skip list matters: without it the output moves off */
                TU_OK(ditd_sd3_forward(m, fc.B, fc.x, fc.t, fc.text, fc.pooled, NULL, 0, got));
                tu_err e = tu_compare(got, fc.out, fc.n_out);
                TU_CHECK(e.rel > 100 * TOL, "%s: skipping %d blocks changes the output (rel %.3g)",
                         what, fc.n_skip, e.rel);
            }
            free(got);
            ditd_sd3_free(m);
        }
        sd3_case_free(&fc);
    }
    json_decref(cases);
    return checked;
}

/* ditd's bf16-weight CPU table (ditd_backend_cpu_bf16: weights rounded to
 * bf16, activations f32) on every case: no farther from the float64
 * reference than Diffusers' own bf16 run (from_pretrained(torch_dtype=
 * torch.bfloat16)) is, in both measures (rel and rel_l2), as
 * test_bf16.c holds the DiT. Returns the cases checked. */
static int run_model_bf16(const char *dir)
{
    char path[4200];
    ditd_sd3_config cfg;
    int checked = 0;
    size_t i;
    json_t *c, *cases = sd3_cases(dir);
    snprintf(path, sizeof path, "%s/config.json", dir);
    TU_OK(ditd_sd3_config_load(path, &cfg));
    json_array_foreach(cases, i, c) {
        sd3_case fc;
        ditd_sd3 *m = NULL;
        if (sd3_case_load(dir, c, &fc) == 0)
            TU_OK(ditd_sd3_new_mesh(&cfg, &ditd_backend_cpu_bf16, fc.B, fc.h, fc.w, fc.L, dir,
                                    NULL, &m));
        if (m) {
            float *got = calloc(fc.n_out, sizeof *got);
            TU_OK(ditd_sd3_forward(m, fc.B, fc.x, fc.t, fc.text, fc.pooled, fc.skip, fc.n_skip,
                                   got));
            tu_err e = tu_compare(got, fc.out, fc.n_out);
            TU_CHECK(fc.bf16_rel > 0 && e.rel <= fc.bf16_rel && e.rel_l2 <= fc.bf16_rel_l2,
                     "%s forward[%zu] in bf16: rel %.3g, rel_l2 %.3g; Diffusers' bf16 %.3g, %.3g",
                     dir, i, e.rel, e.rel_l2, fc.bf16_rel, fc.bf16_rel_l2);
            printf("%s %s forward[%zu] bf16 weights: rel %.3g rel_l2 %.3g (Diffusers bf16: %.3g "
                   "%.3g)\n",
                   e.rel <= fc.bf16_rel && e.rel_l2 <= fc.bf16_rel_l2 ? "ok  " : "FAIL", dir, i,
                   e.rel, e.rel_l2, fc.bf16_rel, fc.bf16_rel_l2);
            checked++;
            free(got);
            ditd_sd3_free(m);
        }
        sd3_case_free(&fc);
    }
    json_decref(cases);
    return checked;
}

/* The family seam: the registry's table, shapes from the config, the model
 * loaded at the table's default size, then set_size to each case's size
 * and the forward through ditd_denoiser_forward with conditioning rows and
 * the skip list in ditd_cond, against the same Diffusers outputs. Returns
 * the cases checked. */
static int family(const char *dir)
{
    const void *t = NULL;
    ditd_denoiser_shapes s;
    ditd_denoiser *d = NULL;
    int checked = 0;
    size_t i;
    json_t *c, *cases;
    TU_OK(ditd_registry_find_dir(DITD_COMPONENT_TRANSFORMER, dir, &t));
    TU_CHECK(t == &ditd_sd3_family, "registry gives the SD3 family");
    TU_OK(ditd_sd3_family.shapes(dir, &s));
    /* sd35-tiny: sample_size 8, patch 2, 4 channels, 2 heads, text 24, pooled 20 */
    TU_CHECK(s.cond.kind == DITD_COND_TEXT && s.in_channels == 4 && s.out_channels == 4 &&
                 s.heads == 2 && s.height == 8 && s.width == 8 && s.tokens == 16 &&
                 s.prefix_tokens == DITD_SD3_DEFAULT_TEXT_LEN && s.cond.text_dim == 24 &&
                 s.cond.pooled_dim == 20 && s.guidance_embed == 0 && s.latent_multiple == 2,
             "sd35-tiny shapes");
    TU_OK(ditd_denoiser_load(&ditd_sd3_family, dir, &ditd_backend_cpu, 2, NULL, &d));
    if (!d)
        return 0;
    /* sizes refused naming them, the model left as it was */
    TU_CHECK_ERR(ditd_denoiser_set_size(d, 9, 8, 4), DITD_EINVAL, "8x9");
    TU_CHECK_ERR(ditd_denoiser_set_size(d, 14, 8, 4), DITD_EINVAL, "pos_embed_max_size");
    TU_CHECK(d->shapes.height == 8 && d->shapes.cond.text_len == DITD_SD3_DEFAULT_TEXT_LEN,
             "a refused size changes nothing");
    cases = sd3_cases(dir);
    json_array_foreach(cases, i, c) {
        sd3_case fc;
        ditd_cond cond;
        memset(&cond, 0, sizeof cond);
        if (sd3_case_load(dir, c, &fc) == 0 && ditd_denoiser_set_size(d, fc.h, fc.w, fc.L) == 0 &&
            ditd_cond_init(&cond, &d->shapes.cond, fc.B) == 0) {
            TU_CHECK(d->shapes.height == fc.h && d->shapes.width == fc.w &&
                         d->shapes.tokens == fc.h * fc.w / 4 && d->shapes.cond.text_len == fc.L,
                     "shapes after set_size");
            TU_CHECK(!cond.skip_layers && cond.n_skip_layers == 0, "cond_init skips nothing");
            ditd_text_embeds emb[2];
            for (int b = 0; b < fc.B; b++) {
                ditd_cond_input in = {.prompt = &emb[b]};
                emb[b] = (ditd_text_embeds){
                    .seq = fc.text + (size_t)b * fc.L * 24, .pooled = fc.pooled + (size_t)b * 20};
                TU_OK(ditd_cond_set_row(&cond, b, &in, 0));
            }
            cond.skip_layers = fc.n_skip ? fc.skip : NULL;
            cond.n_skip_layers = fc.n_skip;
            float *got = calloc(fc.n_out, sizeof *got);
            TU_CHECK(ditd_denoiser_numel_out(&d->shapes) * (size_t)fc.B == fc.n_out, "numel out");
            TU_OK(ditd_denoiser_forward(d, fc.B, fc.x, fc.t, &cond, got));
            char what[512];
            snprintf(what, sizeof what,
                     "%s through the family table, set_size %dx%d text %d, %d skipped", dir, fc.w,
                     fc.h, fc.L, fc.n_skip);
            TU_CLOSE(what, got, fc.out, fc.n_out, TOL);
            checked++;
            /* a skip list naming no block is refused before any op */
            int bad[1] = {3};
            cond.skip_layers = bad;
            cond.n_skip_layers = 1;
            TU_CHECK_ERR(ditd_denoiser_forward(d, fc.B, fc.x, fc.t, &cond, got), DITD_EINVAL,
                         "skip layer 3 outside 0..2");
            free(got);
        } else {
            TU_CHECK(0, "%s case %zu: %s", dir, i, ditd_err_detail());
        }
        ditd_cond_free(&cond);
        sd3_case_free(&fc);
    }
    json_decref(cases);
    ditd_denoiser_free(d);
    return checked;
}

/* Checkpoints that disagree with their config are refused naming the tensor. */
static void checkpoint_refusals(void)
{
    char dir[4096], path[4200];
    ditd_sd3_config cfg;
    ditd_sd3 *m = NULL;
    /* sd35-tiny's weights read as a model without dual attention in block 0:
     * its 9-way norm1 is refused by shape */
    snprintf(dir, sizeof dir, "%s/sd3/sd35-tiny", tu_fixtures());
    snprintf(path, sizeof path, "%s/config.json", dir);
    TU_OK(ditd_sd3_config_load(path, &cfg));
    cfg.dual[0] = 0;
    cfg.n_dual--;
    int err = ditd_sd3_new_mesh(&cfg, &ditd_backend_cpu, 1, 8, 8, 3, dir, NULL, &m);
    TU_CHECK(err < 0 && tu_has(ditd_err_detail(), "transformer_blocks.0.norm1.linear.weight"),
             "block 0 dual in the checkpoint, not in the config, refused: %s", ditd_err_detail());
    ditd_sd3_free(m);
    m = NULL;
    TU_OK(ditd_sd3_config_load(path, &cfg));
    cfg.qk_norm = DITD_SD3_QK_NONE;
    err = ditd_sd3_new_mesh(&cfg, &ditd_backend_cpu, 1, 8, 8, 3, dir, NULL, &m);
    TU_CHECK(err == DITD_EFORMAT && tu_has(ditd_err_detail(), "norm_q"),
             "QK norms under qk_norm null refused: %s", ditd_err_detail());
    ditd_sd3_free(m);
    m = NULL;
    TU_OK(ditd_sd3_config_load(path, &cfg));
    cfg.num_layers = 2; /* block 2 in the checkpoint is one too many */
    cfg.dual[2] = 0;
    cfg.n_dual = 1;
    err = ditd_sd3_new_mesh(&cfg, &ditd_backend_cpu, 1, 8, 8, 3, dir, NULL, &m);
    TU_CHECK(err < 0, "a checkpoint with more blocks than num_layers refused: %s",
             ditd_err_detail());
    ditd_sd3_free(m);
}

static void refusals(void)
{
    static const struct {
        const char *json, *needle;
    } bad[] = {
        {"{\"qk_norm\": \"layer_norm\"}", "qk_norm = \"layer_norm\""},
        {"{\"qk_norm\": \"rms_norm_across_heads\"}", "rms_norm_across_heads"},
        {"{\"qk_norm\": 1}", "qk_norm"},
        {"{\"num_layers\": 4, \"dual_attention_layers\": [0, 4]}", "names block 4"},
        {"{\"dual_attention_layers\": [-1]}", "dual_attention_layers[0] = -1"},
        {"{\"dual_attention_layers\": 3}", "dual_attention_layers"},
        {"{\"dual_attention_layers\": [0.5]}", "dual_attention_layers[0]"},
        {"{\"pos_embed_max_size\": null}", "pos_embed_max_size = 0"},
        {"{\"caption_projection_dim\": 1536}", "caption_projection_dim = 1536"},
        {"{\"num_attention_heads\": 0}", "num_attention_heads = 0"},
        {"{\"patch_size\": 0}", "patch_size = 0"},
        {"{\"num_layers\": 0}", "num_layers = 0"},
        {"{\"sample_size\": 1}", "sample_size = 1"},
        {"{\"joint_attention_dim\": -1}", "joint_attention_dim = -1"},
        {"{\"pooled_projection_dim\": 0}", "pooled_projection_dim = 0"},
        {"{\"num_attention_heads\": 3, \"attention_head_dim\": 3, \"caption_projection_dim\": 9}",
         "multiple of 4"},
        {"{\"_class_name\": \"FluxTransformer2DModel\"}", "FluxTransformer2DModel"},
        {"[1]", "not a JSON object"},
    };
    ditd_sd3_config c;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        TU_CHECK(ditd_sd3_config_parse(bad[i].json, strlen(bad[i].json), "cfg.json", &c) < 0 &&
                     tu_has(ditd_err_detail(), bad[i].needle),
                 "refused %s naming \"%s\" (got: %s)", bad[i].json, bad[i].needle, ditd_err_detail());
    /* the defaults are SD3-medium's transformer sizes */
    TU_OK(ditd_sd3_config_parse("{}", 2, "cfg.json", &c));
    TU_CHECK(c.inner_dim == 1152 && c.num_layers == 18 && c.in_channels == 16 &&
                 c.out_channels == 16 && c.patch_size == 2 && c.pos_embed_max_size == 96 &&
                 c.sample_size == 128 && c.joint_attention_dim == 4096 && c.pooled_dim == 2048 &&
                 c.qk_norm == DITD_SD3_QK_NONE && c.n_dual == 0 && c.mlp_dim == 4 * 1152,
             "defaults");
    /* SD3.5-medium's config: MMDiT-X in blocks 0..12, QK RMSNorm, null out_channels */
    static const char sd35m[] =
        "{\"_class_name\": \"SD3Transformer2DModel\", \"attention_head_dim\": 64,"
        " \"caption_projection_dim\": 1536, \"dual_attention_layers\": [0, 1, 2, 3, 4, 5, 6,"
        " 7, 8, 9, 10, 11, 12], \"in_channels\": 16, \"joint_attention_dim\": 4096,"
        " \"num_attention_heads\": 24, \"num_layers\": 24, \"out_channels\": null,"
        " \"patch_size\": 2, \"pooled_projection_dim\": 2048, \"pos_embed_max_size\": 384,"
        " \"qk_norm\": \"rms_norm\", \"sample_size\": 128}";
    TU_OK(ditd_sd3_config_parse(sd35m, strlen(sd35m), "sd35m.json", &c));
    TU_CHECK(c.inner_dim == 1536 && c.n_dual == 13 && c.dual[12] && !c.dual[13] &&
                 c.qk_norm == DITD_SD3_QK_RMS && c.out_channels == 16 &&
                 c.pos_embed_max_size == 384,
             "SD3.5-medium config");
}

int main(void)
{
    char dir[4096];
    int cases = 0;
    for (int i = 0; i < SD3_MODELS; i++) {
        snprintf(dir, sizeof dir, "%s/sd3/%s", tu_fixtures(), sd3_models[i]);
        cases += run_model(dir);
    }
    TU_CHECK(cases >= MIN_CASES, "SD3 golden cases checked: %d (at least %d)", cases, MIN_CASES);
    cases = 0;
    for (int i = 0; i < SD3_MODELS; i++) {
        snprintf(dir, sizeof dir, "%s/sd3/%s", tu_fixtures(), sd3_models[i]);
        cases += run_model_bf16(dir);
    }
    TU_CHECK(cases >= MIN_CASES, "SD3 bf16 cases checked: %d (at least %d)", cases, MIN_CASES);
    snprintf(dir, sizeof dir, "%s/sd3/sd35-tiny", tu_fixtures());
    TU_CHECK(family(dir) >= 4, "SD3 cases through the family table");
    checkpoint_refusals();
    refusals();
    return tu_exit();
}
