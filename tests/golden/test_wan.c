/* Golden: the Wan transformer (WanTransformer3DModel) of every fixture model
 * against Diffusers computed in float64 (tools/make_wan_fixtures.py): Wan
 * 2.1 T2V-like (f32), Wan 2.2 TI2V-like with per-frame timesteps (the
 * expand_timesteps inputs: the first frame at 0, or all at t), Wan 2.2
 * I2V-like (in_channels != out_channels, no norm2, a bf16 checkpoint; on
 * the CPU's bf16-weight table no farther from float64 than Diffusers' own
 * bf16 run), Wan 2.1 I2V-like and FLF2V-like (the image branch: CLIP image
 * embeddings, pos_embed; 512 text tokens); odd
 * frame counts, non-square odd patch grids, batch 2, one frame.
 * Bound: max|ours - ref| / max|ref| <= 1e-5 on every output; at least 13
 * cases must be checked. Also: per-frame timesteps all equal to t give
 * one-timestep's output; the registry hands out the family, its shapes come
 * from the config, set_video_size and the table's forward (conditioning rows,
 * cond.t_frames) give the same numbers; sizes, checkpoints and configs that
 * cannot work are refused naming key and value. */
#include <string.h>

#include "engine/backend/backend.h"
#include "engine/models/registry.h"
#include "engine/models/wan/wan.h"
#include "tests/wan_case.h"

#define TOL 1e-5
#define MIN_CASES 13

static int run_model(const char *dir, const ditd_backend_ops *ops)
{
    char path[4200], what[512];
    ditd_wan_config cfg;
    int checked = 0;
    size_t i;
    json_t *c, *cases = wan_cases(dir);
    snprintf(path, sizeof path, "%s/config.json", dir);
    TU_OK(ditd_wan_config_load(path, &cfg));
    json_array_foreach(cases, i, c) {
        wan_case wc;
        ditd_wan *m = NULL;
        if (wan_case_load(dir, c, &wc) == 0)
            TU_OK(ditd_wan_new_mesh(&cfg, ops, wc.B, wc.F, wc.h, wc.w, wc.L, dir, NULL, &m));
        if (m) {
            float *got = calloc(wc.n_out, sizeof *got);
            TU_CHECK(wc.n_out == (size_t)wc.B * cfg.out_channels * wc.F * wc.h * wc.w,
                     "out size");
            TU_OK(ditd_wan_forward(m, wc.B, wc.x, wc.t, wc.t_frames, wc.text, wc.image, got));
            snprintf(what, sizeof what, "%s %s forward[%zu] B=%d %d frames of %dx%d text %d%s",
                     ops->name, dir, i, wc.B, wc.F, wc.w, wc.h, wc.L,
                     wc.t_frames ? " per-frame t" : "");
            TU_CLOSE(what, got, wc.out, wc.n_out, TOL);
            checked++;
            /* per-frame timesteps all at t: the one-timestep path's output */
            if (wc.t_frames) {
                int all_t = 1;
                for (int b = 0; b < wc.B; b++)
                    for (int f = 0; f < wc.F; f++)
                        all_t &= wc.t_frames[b * wc.F + f] == wc.t[b];
                if (all_t) {
                    float *one = calloc(wc.n_out, sizeof *one);
                    TU_OK(ditd_wan_forward(m, wc.B, wc.x, wc.t, NULL, wc.text, wc.image, one));
                    snprintf(what, sizeof what, "%s forward[%zu]: t (B) vs t_frames all at t",
                             dir, i);
                    TU_CLOSE(what, one, got, wc.n_out, 1e-6);
                    free(one);
                }
            }
            free(got);
            ditd_wan_free(m);
        }
        wan_case_free(&wc);
    }
    json_decref(cases);
    return checked;
}

/* The bf16 checkpoint on the CPU's bf16-weight table (bf16 x bf16 GEMMs,
 * fp32 elsewhere): no farther from Diffusers' float64 output than
 * Diffusers' own bf16 run (torch_dtype=torch.bfloat16) in both max|d| /
 * max|ref| and the relative L2 norm, and within BF16_TOL. */
#define BF16_TOL 1e-2
static int bf16_table(const char *dir)
{
    char path[4200];
    ditd_wan_config cfg;
    int checked = 0;
    size_t i;
    json_t *c, *cases = wan_cases(dir);
    snprintf(path, sizeof path, "%s/config.json", dir);
    TU_OK(ditd_wan_config_load(path, &cfg));
    json_array_foreach(cases, i, c) {
        wan_case wc;
        ditd_wan *m = NULL;
        float *own = NULL;
        if (wan_case_load(dir, c, &wc) == 0 && (own = wan_npy(dir, c, "out_bf16", NULL)))
            TU_OK(ditd_wan_new_mesh(&cfg, &ditd_backend_cpu_bf16, wc.B, wc.F, wc.h, wc.w, wc.L,
                                    dir, NULL, &m));
        if (m) {
            float *got = calloc(wc.n_out, sizeof *got);
            TU_OK(ditd_wan_forward(m, wc.B, wc.x, wc.t, wc.t_frames, wc.text, wc.image, got));
            tu_err e = tu_compare(got, wc.out, wc.n_out), d = tu_compare(own, wc.out, wc.n_out);
            printf("%s cpu-bf16 forward[%zu]: ditd rel %.3g rel_l2 %.3g, Diffusers bf16 rel %.3g "
                   "rel_l2 %.3g\n", dir, i, e.rel, e.rel_l2, d.rel, d.rel_l2);
            TU_CHECK(e.rel <= d.rel && e.rel_l2 <= d.rel_l2 && e.rel <= BF16_TOL,
                     "%s[%zu]: ditd's bf16 table (rel %.3g, rel_l2 %.3g) farther from float64 "
                     "than Diffusers' bf16 (rel %.3g, rel_l2 %.3g) or over %g",
                     dir, i, e.rel, e.rel_l2, d.rel, d.rel_l2, BF16_TOL);
            checked++;
            free(got);
            ditd_wan_free(m);
        }
        free(own);
        wan_case_free(&wc);
    }
    json_decref(cases);
    return checked;
}

/* The family seam: the registry's table, shapes from the config, the
 * model loaded at the table's default size, then set_video_size to each
 * case's and the forward through ditd_denoiser_forward with conditioning
 * rows (and cond.t_frames), against the same Diffusers outputs. */
static int family(const char *dir)
{
    const void *t = NULL;
    ditd_denoiser_shapes s;
    ditd_denoiser *d = NULL;
    int checked = 0;
    size_t i;
    json_t *c, *cases;
    TU_OK(ditd_registry_find_dir(DITD_COMPONENT_TRANSFORMER, dir, &t));
    TU_CHECK(t == &ditd_wan_family, "registry gives the Wan family");
    TU_OK(ditd_wan_family.shapes(dir, &s));
    TU_CHECK(s.cond.kind == DITD_COND_TEXT && s.in_channels == 8 && s.out_channels == 8 &&
                 s.heads == 6 && s.frames == DITD_WAN_DEFAULT_FRAMES &&
                 s.height == DITD_WAN_DEFAULT_HEIGHT && s.width == DITD_WAN_DEFAULT_WIDTH &&
                 s.tokens == 21 * 30 * 52 && s.prefix_tokens == 0 && s.cond.text_dim == 20 &&
                 s.cond.pooled_dim == 0 && s.latent_multiple == 2,
             "ti2v shapes");
    TU_CHECK(ditd_denoiser_numel_in(&s) == (size_t)8 * 21 * 60 * 104, "numel counts frames");
    /* the default clip's frames exceed this tiny config's rope_max_seq_len:
     * the load is refused naming it */
    TU_CHECK_ERR(ditd_denoiser_load(&ditd_wan_family, dir, &ditd_backend_cpu, 2, NULL, &d),
                 DITD_EINVAL, "rope_max_seq_len");
    /* so load the model directly at a small size and use the table */
    {
        char path[4200];
        ditd_wan_config cfg;
        ditd_wan *m = NULL;
        snprintf(path, sizeof path, "%s/config.json", dir);
        TU_OK(ditd_wan_config_load(path, &cfg));
        TU_OK(ditd_wan_new_mesh(&cfg, &ditd_backend_cpu, 2, 1, 4, 4, 3, dir, NULL, &m));
        if (!m)
            return 0;
        m->base.family = &ditd_wan_family;
        d = &m->base;
    }
    /* sizes refused naming them, the model left as it was */
    TU_CHECK_ERR(ditd_denoiser_set_video_size(d, 3, 9, 8, 4), DITD_EINVAL, "8x9");
    TU_CHECK_ERR(ditd_denoiser_set_video_size(d, 33, 8, 8, 4), DITD_EINVAL, "rope_max_seq_len");
    TU_CHECK(d->shapes.frames == 1 && d->shapes.height == 4, "a refused size changes nothing");
    TU_OK(ditd_denoiser_set_size(d, 6, 8, 3));
    TU_CHECK(d->shapes.frames == 1 && d->shapes.height == 6 && d->shapes.width == 8,
             "set_size keeps the frame count");
    cases = wan_cases(dir);
    json_array_foreach(cases, i, c) {
        wan_case wc;
        ditd_cond cond;
        memset(&cond, 0, sizeof cond);
        if (wan_case_load(dir, c, &wc) == 0 &&
            ditd_denoiser_set_video_size(d, wc.F, wc.h, wc.w, wc.L) == 0 &&
            ditd_cond_init(&cond, &d->shapes.cond, wc.B) == 0) {
            TU_CHECK(d->shapes.frames == wc.F && d->shapes.height == wc.h &&
                         d->shapes.width == wc.w && d->shapes.tokens == wc.F * wc.h * wc.w / 4 &&
                         d->shapes.cond.text_len == wc.L,
                     "shapes after set_video_size");
            ditd_text_embeds emb[2];
            for (int b = 0; b < wc.B; b++) {
                ditd_cond_input in = {.prompt = &emb[b]};
                emb[b] = (ditd_text_embeds){.seq = wc.text + (size_t)b * wc.L * 20};
                TU_OK(ditd_cond_set_row(&cond, b, &in, 0));
            }
            cond.t_frames = wc.t_frames;
            cond.t_frames_n = wc.F;
            float *got = calloc(wc.n_out, sizeof *got);
            TU_CHECK(ditd_denoiser_numel_out(&d->shapes) * (size_t)wc.B == wc.n_out, "numel out");
            TU_OK(ditd_denoiser_forward(d, wc.B, wc.x, wc.t, &cond, got));
            char what[512];
            snprintf(what, sizeof what, "%s through the family table, %d frames of %dx%d text %d",
                     dir, wc.F, wc.w, wc.h, wc.L);
            TU_CLOSE(what, got, wc.out, wc.n_out, TOL);
            if (wc.t_frames) { /* a view at row 1 offsets t_frames by one row */
                ditd_cond v = ditd_cond_view(&cond, 1);
                TU_CHECK(v.t_frames == wc.t_frames + wc.F, "cond view of t_frames");
                cond.t_frames_n = wc.F + 1;
                TU_CHECK_ERR(ditd_denoiser_forward(d, wc.B, wc.x, wc.t, &cond, got), DITD_EINVAL,
                             "frames");
            }
            checked++;
            free(got);
        } else {
            TU_CHECK(0, "%s case %zu: %s", dir, i, ditd_err_detail());
        }
        ditd_cond_free(&cond);
        wan_case_free(&wc);
    }
    json_decref(cases);
    ditd_denoiser_free(d);
    return checked;
}

/* The image branch through the family table: cond.image (and a view of
 * it), against Diffusers. */
static int family_image(const char *dir)
{
    char path[4200];
    ditd_wan_config cfg;
    ditd_wan *m = NULL;
    int checked = 0;
    size_t i;
    json_t *c, *cases;
    snprintf(path, sizeof path, "%s/config.json", dir);
    TU_OK(ditd_wan_config_load(path, &cfg));
    TU_OK(ditd_wan_new_mesh(&cfg, &ditd_backend_cpu, 2, 1, 4, 4, 512, dir, NULL, &m));
    if (!m)
        return 0;
    m->base.family = &ditd_wan_family;
    ditd_denoiser *d = &m->base;
    cases = wan_cases(dir);
    json_array_foreach(cases, i, c) {
        wan_case wc;
        ditd_cond cond;
        memset(&cond, 0, sizeof cond);
        if (wan_case_load(dir, c, &wc) == 0 && wc.image &&
            ditd_denoiser_set_video_size(d, wc.F, wc.h, wc.w, wc.L) == 0 &&
            ditd_cond_init(&cond, &d->shapes.cond, wc.B) == 0) {
            ditd_text_embeds emb[2];
            for (int b = 0; b < wc.B; b++) {
                ditd_cond_input in = {.prompt = &emb[b]};
                emb[b] = (ditd_text_embeds){.seq = wc.text + (size_t)b * wc.L * cfg.text_dim};
                TU_OK(ditd_cond_set_row(&cond, b, &in, 0));
            }
            cond.image = wc.image;
            cond.image_len = cfg.image_len;
            cond.image_dim = cfg.image_dim;
            float *got = calloc(wc.n_out, sizeof *got);
            TU_OK(ditd_denoiser_forward(d, wc.B, wc.x, wc.t, &cond, got));
            char what[512];
            snprintf(what, sizeof what, "%s through the family table with cond.image", dir);
            TU_CLOSE(what, got, wc.out, wc.n_out, TOL);
            ditd_cond v = ditd_cond_view(&cond, 1);
            TU_CHECK(v.image == wc.image + (size_t)cfg.image_len * cfg.image_dim,
                     "cond view of the image embeddings");
            cond.image_len = cfg.image_len - 1;
            TU_CHECK_ERR(ditd_denoiser_forward(d, wc.B, wc.x, wc.t, &cond, got), DITD_EINVAL,
                         "image embeddings of");
            checked++;
            free(got);
        } else {
            TU_CHECK(0, "%s case %zu: %s", dir, i, ditd_err_detail());
        }
        ditd_cond_free(&cond);
        wan_case_free(&wc);
    }
    json_decref(cases);
    ditd_denoiser_free(d);
    return checked;
}

/* A checkpoint that disagrees with its config, refused naming the tensor. */
static void checkpoint_refusals(const char *dir)
{
    char path[4200];
    ditd_wan_config cfg, bad;
    ditd_wan *m = NULL;
    snprintf(path, sizeof path, "%s/config.json", dir);
    TU_OK(ditd_wan_config_load(path, &cfg));
    bad = cfg;
    bad.cross_attn_norm = 0;
    TU_CHECK_ERR(ditd_wan_new_mesh(&bad, &ditd_backend_cpu, 1, 1, 4, 4, 2, dir, NULL, &m),
                 DITD_EFORMAT, "blocks.0.norm2.weight");
    bad = cfg;
    bad.num_layers = 1;
    TU_CHECK_ERR(ditd_wan_new_mesh(&bad, &ditd_backend_cpu, 1, 1, 4, 4, 2, dir, NULL, &m),
                 DITD_EFORMAT, "num_layers 1");
    bad = cfg;
    bad.num_layers = 3;
    TU_CHECK_ERR(ditd_wan_new_mesh(&bad, &ditd_backend_cpu, 1, 1, 4, 4, 2, dir, NULL, &m),
                 DITD_ENOENT, "blocks.2");
    bad = cfg;
    bad.text_dim = 25;
    TU_CHECK(ditd_wan_new_mesh(&bad, &ditd_backend_cpu, 1, 1, 4, 4, 2, dir, NULL, &m) < 0 &&
                 tu_has(ditd_err_detail(), "text_embedder.linear_1.weight"),
             "a wrong text_dim names the tensor: %s", ditd_err_detail());
    TU_CHECK_ERR(ditd_wan_new_mesh(&cfg, &ditd_backend_cpu, 1, 2, 5, 4, 2, dir, NULL, &m),
                 DITD_EINVAL, "patch 2");
    TU_CHECK(m == NULL, "nothing handed out on a refusal");
}

/* The image branch's refusals (the i2v21 fixture): a text length other
 * than 512, a forward without the image embeddings (or with them for a
 * model without the branch), a checkpoint with the branch under a config
 * without it. */
static void image_refusals(const char *dir, const char *plain)
{
    char path[4200];
    ditd_wan_config cfg, bad;
    ditd_wan *m = NULL;
    snprintf(path, sizeof path, "%s/config.json", dir);
    TU_OK(ditd_wan_config_load(path, &cfg));
    TU_CHECK_ERR(ditd_wan_new_mesh(&cfg, &ditd_backend_cpu, 1, 1, 4, 4, 7, dir, NULL, &m),
                 DITD_EINVAL, "takes 512 text tokens");
    bad = cfg;
    bad.image_dim = bad.added_kv_proj_dim = bad.image_len = 0;
    TU_CHECK_ERR(ditd_wan_new_mesh(&bad, &ditd_backend_cpu, 1, 1, 4, 4, 512, dir, NULL, &m),
                 DITD_EFORMAT, "image branch");
    TU_OK(ditd_wan_new_mesh(&cfg, &ditd_backend_cpu, 1, 1, 4, 4, 512, dir, NULL, &m));
    if (m) {
        size_t nin = (size_t)cfg.in_channels * 16, nout = (size_t)cfg.out_channels * 16;
        float *x = calloc(nin, sizeof *x), *o = calloc(nout, sizeof *o), t = 500.0f;
        float *text = calloc(512 * (size_t)cfg.text_dim, sizeof *text);
        TU_CHECK_ERR(ditd_wan_forward(m, 1, x, &t, NULL, text, NULL, o), DITD_EINVAL,
                     "CLIP image embeddings");
        free(x), free(o), free(text);
        ditd_wan_free(m);
        m = NULL;
    }
    snprintf(path, sizeof path, "%s/config.json", plain);
    TU_OK(ditd_wan_config_load(path, &cfg));
    TU_OK(ditd_wan_new_mesh(&cfg, &ditd_backend_cpu, 1, 1, 4, 4, 3, plain, NULL, &m));
    if (m) {
        size_t nin = (size_t)cfg.in_channels * 16, nout = (size_t)cfg.out_channels * 16;
        float *x = calloc(nin, sizeof *x), *o = calloc(nout, sizeof *o), t = 500.0f;
        float *text = calloc(3 * (size_t)cfg.text_dim, sizeof *text);
        TU_CHECK_ERR(ditd_wan_forward(m, 1, x, &t, NULL, text, text, o), DITD_EINVAL,
                     "no image branch");
        free(x), free(o), free(text);
        ditd_wan_free(m);
    }
}

static void refusals(void)
{
    static const struct {
        const char *json, *needle;
    } bad[] = {
        {"{\"patch_size\": [2, 2, 2]}", "patch_size = [2, 2, 2]"},
        {"{\"patch_size\": [1, 2, 4]}", "patch_size = [1, 2, 4]"},
        {"{\"patch_size\": [1, 2]}", "patch_size"},
        {"{\"patch_size\": [1, 0, 0]}", "patch_size[1]"},
        {"{\"image_dim\": 1280}", "image_dim = 1280 with added_kv_proj_dim = 0"},
        {"{\"image_dim\": 1280, \"added_kv_proj_dim\": 1280}", "added_kv_proj_dim = 1280 must equal"},
        {"{\"image_dim\": 1280, \"added_kv_proj_dim\": 5120, \"pos_embed_seq_len\": 513}",
         "pos_embed_seq_len = 513"},
        {"{\"added_kv_proj_dim\": 5120}", "added_kv_proj_dim = 5120"},
        {"{\"pos_embed_seq_len\": 514}", "pos_embed_seq_len = 514"},
        {"{\"image_dim\": \"x\"}", "image_dim"},
        {"{\"qk_norm\": 3}", "qk_norm"},
        {"{\"attention_head_dim\": 4}", "attention_head_dim = 4"},
        {"{\"attention_head_dim\": 15}", "attention_head_dim = 15"},
        {"{\"num_attention_heads\": 0}", "num_attention_heads = 0"},
        {"{\"in_channels\": 0}", "in_channels = 0"},
        {"{\"text_dim\": -1}", "text_dim = -1"},
        {"{\"freq_dim\": 255}", "freq_dim = 255"},
        {"{\"ffn_dim\": 0}", "ffn_dim = 0"},
        {"{\"num_layers\": 0}", "num_layers = 0"},
        {"{\"eps\": 0}", "eps = 0"},
        {"{\"eps\": \"small\"}", "eps"},
        {"{\"rope_max_seq_len\": 0}", "rope_max_seq_len = 0"},
        {"{\"cross_attn_norm\": 1}", "cross_attn_norm"},
        {"{\"_class_name\": \"FluxTransformer2DModel\"}", "FluxTransformer2DModel"},
        {"[1]", "not a JSON object"},
    };
    ditd_wan_config c;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        TU_CHECK(ditd_wan_config_parse(bad[i].json, strlen(bad[i].json), "cfg.json", &c) < 0 &&
                     tu_has(ditd_err_detail(), bad[i].needle),
                 "refused %s naming \"%s\" (got: %s)", bad[i].json, bad[i].needle, ditd_err_detail());
    /* the defaults are WanTransformer3DModel.__init__'s (Wan 2.1 T2V 14B) */
    TU_OK(ditd_wan_config_parse("{}", 2, "cfg.json", &c));
    TU_CHECK(c.inner_dim == 5120 && c.num_layers == 40 && c.ffn_dim == 13824 &&
                 c.in_channels == 16 && c.out_channels == 16 && c.text_dim == 4096 &&
                 c.freq_dim == 256 && c.cross_attn_norm == 1 && c.rope_max_seq_len == 1024 &&
                 c.patch_h == 2 && c.rope_t == 44 && c.rope_h == 42 && c.rope_w == 42 &&
                 c.eps == 1e-6f,
             "defaults");
    /* null out_channels is in_channels; qk_norm's value is not used (Diffusers) */
    const char *ok = "{\"in_channels\": 36, \"out_channels\": null, \"qk_norm\": null, "
                     "\"image_dim\": null, \"added_kv_proj_dim\": null}";
    TU_OK(ditd_wan_config_parse(ok, strlen(ok), "cfg.json", &c));
    TU_CHECK(c.out_channels == 36 && c.image_dim == 0 && c.image_len == 0,
             "out_channels null -> in_channels");
    /* Wan 2.1 I2V (CLIP's 257 tokens) and FLF2V (pos_embed's) */
    const char *i2v = "{\"image_dim\": 1280, \"added_kv_proj_dim\": 5120}";
    TU_OK(ditd_wan_config_parse(i2v, strlen(i2v), "cfg.json", &c));
    TU_CHECK(c.image_dim == 1280 && c.image_len == DITD_WAN_CLIP_TOKENS, "I2V image tokens");
    const char *flf = "{\"image_dim\": 1280, \"added_kv_proj_dim\": 5120, "
                      "\"pos_embed_seq_len\": 514}";
    TU_OK(ditd_wan_config_parse(flf, strlen(flf), "cfg.json", &c));
    TU_CHECK(c.image_len == 514, "FLF2V image tokens");
}

int main(void)
{
    char dir[4096];
    int cases = 0;
    for (int i = 0; i < WAN_MODELS; i++) {
        snprintf(dir, sizeof dir, "%s/wan/%s", tu_fixtures(), wan_models[i]);
        cases += run_model(dir, &ditd_backend_cpu);
    }
    TU_CHECK(cases >= MIN_CASES, "Wan golden cases checked: %d (at least %d)", cases, MIN_CASES);
    snprintf(dir, sizeof dir, "%s/wan/i2v", tu_fixtures());
    TU_CHECK(bf16_table(dir) >= 2, "i2v cases on the bf16-weight table");
    snprintf(dir, sizeof dir, "%s/wan/ti2v", tu_fixtures());
    TU_CHECK(family(dir) >= 3, "Wan cases through the family table");
    snprintf(dir, sizeof dir, "%s/wan/t2v", tu_fixtures());
    checkpoint_refusals(dir);
    {
        char plain[4096];
        snprintf(plain, sizeof plain, "%s", dir);
        snprintf(dir, sizeof dir, "%s/wan/i2v21", tu_fixtures());
        image_refusals(dir, plain);
        TU_CHECK(family_image(dir) >= 2, "image-branch cases through the family table");
    }
    refusals();
    return tu_exit();
}
