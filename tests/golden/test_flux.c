/* Golden: the FLUX.1 transformer (FluxTransformer2DModel) of every fixture
 * model against Diffusers computed in float64 (tools/make_flux_fixtures.py).
 * Bound: max|ours - ref| / max|ref| <= 1e-5 on every output; at least 5
 * cases must be checked. Also: the registry hands out the FLUX family, its
 * shapes come from the config, the table's set_size and forward (with
 * conditioning rows) give the same numbers, and bad configs are refused
 * naming key and value. */
#include <string.h>

#include "engine/backend/backend.h"
#include "engine/models/flux/flux.h"
#include "engine/models/registry.h"
#include "tests/flux_case.h"

#define TOL 1e-5
#define MIN_CASES 7

static int run_model(const char *dir)
{
    char path[4200];
    ditd_flux_config cfg;
    int checked = 0;
    size_t i;
    json_t *c, *cases = flux_cases(dir);
    snprintf(path, sizeof path, "%s/config.json", dir);
    TU_OK(ditd_flux_config_load(path, &cfg));
    json_array_foreach(cases, i, c) {
        flux_case fc;
        ditd_flux *m = NULL;
        if (flux_case_load(dir, c, &fc) == 0) {
            TU_OK(ditd_flux_new_mesh(&cfg, &ditd_backend_cpu, fc.B, fc.h, fc.w, fc.L, dir, NULL, &m));
        }
        if (m) {
            float *got = calloc(fc.n_out, sizeof *got);
            TU_CHECK(fc.n_out == (size_t)fc.B * (size_t)cfg.latent_channels * fc.h * fc.w,
                     "out size");
            TU_OK(ditd_flux_forward(m, fc.B, fc.x, fc.t, fc.text, fc.pooled,
                                    cfg.guidance_embeds ? fc.guidance : NULL, got));
            char what[512];
            snprintf(what, sizeof what, "%s forward[%zu] B=%d latent %dx%d text %d", dir, i, fc.B,
                     fc.h, fc.w, fc.L);
            TU_CLOSE(what, got, fc.out, fc.n_out, TOL);
            checked++;
            free(got);
            ditd_flux_free(m);
        }
        flux_case_free(&fc);
    }
    json_decref(cases);
    return checked;
}

/* The family seam: the registry's table, shapes from the config, the
 * model loaded at the table's default size, then set_size to each case's
 * size and the forward through ditd_denoiser_forward with conditioning
 * rows, against the same Diffusers outputs. Returns the cases checked. */
static int family(const char *dir)
{
    const void *t = NULL;
    ditd_denoiser_shapes s;
    ditd_denoiser *d = NULL;
    int checked = 0;
    size_t i;
    json_t *c, *cases;
    TU_OK(ditd_registry_find_dir(DITD_COMPONENT_TRANSFORMER, dir, &t));
    TU_CHECK(t == &ditd_flux_family, "registry gives the FLUX family");
    TU_OK(ditd_flux_family.shapes(dir, &s));
    TU_CHECK(s.cond.kind == DITD_COND_TEXT && s.in_channels == 16 && s.out_channels == 16 &&
                 s.heads == 2 && s.height == DITD_FLUX_DEFAULT_LATENT &&
                 s.tokens == 64 * 64 && s.prefix_tokens == DITD_FLUX_DEFAULT_TEXT_LEN &&
                 s.cond.text_dim == 32 && s.cond.pooled_dim == 32 && s.guidance_embed == 1,
             "deep-guidance shapes");
    TU_OK(ditd_denoiser_load(&ditd_flux_family, dir, &ditd_backend_cpu, 2, NULL, &d));
    if (!d)
        return 0;
    /* sizes refused naming them, the model left as it was */
    TU_CHECK_ERR(ditd_denoiser_set_size(d, 9, 8, 4), DITD_EINVAL, "8x9");
    TU_CHECK(d->shapes.height == DITD_FLUX_DEFAULT_LATENT, "a refused size changes nothing");
    /* an image family: set_video_size is set_size for one frame, refused for more */
    TU_CHECK_ERR(ditd_denoiser_set_video_size(d, 3, 8, 8, 4), DITD_EUNSUPPORTED, "image model",
                 "3 frames");
    TU_OK(ditd_denoiser_set_video_size(d, 1, DITD_FLUX_DEFAULT_LATENT, DITD_FLUX_DEFAULT_LATENT,
                                       DITD_FLUX_DEFAULT_TEXT_LEN));
    TU_CHECK(d->shapes.frames == 0, "an image family has no frames");
    cases = flux_cases(dir);
    json_array_foreach(cases, i, c) {
        flux_case fc;
        ditd_cond cond;
        memset(&cond, 0, sizeof cond);
        if (flux_case_load(dir, c, &fc) == 0 && ditd_denoiser_set_size(d, fc.h, fc.w, fc.L) == 0 &&
            ditd_cond_init(&cond, &d->shapes.cond, fc.B) == 0) {
            TU_CHECK(d->shapes.height == fc.h && d->shapes.width == fc.w &&
                         d->shapes.tokens == fc.h * fc.w / 4 && d->shapes.cond.text_len == fc.L,
                     "shapes after set_size");
            ditd_text_embeds emb[2];
            for (int b = 0; b < fc.B; b++) {
                ditd_cond_input in = {.prompt = &emb[b]};
                emb[b] = (ditd_text_embeds){
                    .seq = fc.text + (size_t)b * fc.L * 32, .pooled = fc.pooled + (size_t)b * 32};
                TU_OK(ditd_cond_set_row(&cond, b, &in, 0));
                cond.guidance[b] = fc.guidance[b];
            }
            float *got = calloc(fc.n_out, sizeof *got);
            TU_CHECK(ditd_denoiser_numel_out(&d->shapes) * (size_t)fc.B == fc.n_out, "numel out");
            TU_OK(ditd_denoiser_forward(d, fc.B, fc.x, fc.t, &cond, got));
            char what[512];
            snprintf(what, sizeof what, "%s through the family table, set_size %dx%d text %d", dir,
                     fc.w, fc.h, fc.L);
            TU_CLOSE(what, got, fc.out, fc.n_out, TOL);
            checked++;
            free(got);
        } else {
            TU_CHECK(0, "%s case %zu: %s", dir, i, ditd_err_detail());
        }
        ditd_cond_free(&cond);
        flux_case_free(&fc);
    }
    json_decref(cases);
    ditd_denoiser_free(d);
    return checked;
}

static void refusals(void)
{
    static const struct {
        const char *json, *needle;
    } bad[] = {
        {"{\"patch_size\": 2}", "patch_size = 2"},
        {"{\"in_channels\": 30}", "in_channels = 30"},
        {"{\"out_channels\": 32}", "out_channels = 32"},
        {"{\"axes_dims_rope\": [16, 56, 54]}", "axes_dims_rope [16, 56, 54]"},
        {"{\"axes_dims_rope\": [16, 56]}", "axes_dims_rope"},
        {"{\"num_attention_heads\": 0}", "num_attention_heads = 0"},
        {"{\"guidance_embeds\": 1}", "guidance_embeds"},
        {"{\"joint_attention_dim\": -1}", "joint_attention_dim = -1"},
        {"{\"_class_name\": \"SD3Transformer2DModel\"}", "SD3Transformer2DModel"},
    };
    ditd_flux_config c;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        TU_CHECK(ditd_flux_config_parse(bad[i].json, strlen(bad[i].json), "cfg.json", &c) < 0 &&
                     tu_has(ditd_err_detail(), bad[i].needle),
                 "refused %s naming \"%s\" (got: %s)", bad[i].json, bad[i].needle, ditd_err_detail());
    /* the defaults are FLUX.1-dev's transformer sizes, less guidance */
    TU_OK(ditd_flux_config_parse("{}", 2, "cfg.json", &c));
    TU_CHECK(c.inner_dim == 3072 && c.num_layers == 19 && c.num_single_layers == 38 &&
                 c.latent_channels == 16 && c.joint_attention_dim == 4096 && c.pooled_dim == 768,
             "defaults");
}

int main(void)
{
    char dir[4096];
    int cases = 0;
    for (int i = 0; i < FLUX_MODELS; i++) {
        snprintf(dir, sizeof dir, "%s/flux/%s", tu_fixtures(), flux_models[i]);
        cases += run_model(dir);
    }
    TU_CHECK(cases >= MIN_CASES, "FLUX golden cases checked: %d (at least %d)", cases, MIN_CASES);
    snprintf(dir, sizeof dir, "%s/flux/deep-guidance", tu_fixtures());
    TU_CHECK(family(dir) >= 2, "FLUX cases through the family table");
    refusals();
    return tu_exit();
}
