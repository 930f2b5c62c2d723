/* Golden: AutoencoderKLWan decode and encode against Diffusers 0.42 in
 * float64 (tools/make_wan_vae_fixtures.py), for every fixture VAE under
 * tests/fixtures/wan_vae/ (a Wan 2.1-shaped one with z_dim 16; z_dim 4 with
 * its own decoder_base_dim, one temporal stage and a bf16 checkpoint; a Wan
 * 2.2-shaped residual one with patch_size 2): 1, 2 and 3 latent frames (1,
 * 5, 9 video frames), odd and non-square sizes, batches of 2, encodes of
 * 1, 5, 9 and 7 frames (the 7th dropped as Diffusers drops it), tiled
 * decodes (enable_tiling with small tiles, with and without patch_size),
 * the attention through scores in memory (the path of heads above 512). Bound:
 * max|ours - ref| / max|ref| <= 1e-5 for every output. The encoder's draw
 * is checked as mean_ref + std_ref * the Philox noise. Config refusals are
 * checked on edited copies of a fixture config. */
#include <jansson.h>
#include <string.h>

#include "engine/backend/backend.h"
#include "engine/core/philox.h"
#include "engine/io/npy.h"
#include "engine/models/registry.h"
#include "engine/models/wan_vae/wan_vae.h"
#include "tests/test_util.h"

#define TOL 1e-5

static float *load(const char *dir, json_t *c, const char *key, int64_t *shape)
{
    char path[4096];
    float *d = NULL;
    int nd = 0;
    const char *f = json_string_value(json_object_get(c, key));
    TU_CHECK(f != NULL, "%s: case without %s", dir, key);
    if (!f)
        return NULL;
    snprintf(path, sizeof path, "%s/expected/%s", dir, f);
    TU_OK(ditd_npy_read_f32(path, 5, &nd, shape, &d));
    TU_CHECK(nd == 5, "%s: %d dims", path, nd);
    return d;
}

static size_t numel(const int64_t *s)
{
    return (size_t)(s[0] * s[1] * s[2] * s[3] * s[4]);
}

static int run_vae(const char *name)
{
    char dir[4096], path[4200], what[600];
    json_error_t jerr;
    json_t *root, *cases, *c;
    size_t i;
    int checked = 0;

    snprintf(dir, sizeof dir, "%s/wan_vae/%s", tu_fixtures(), name);
    snprintf(path, sizeof path, "%s/expected/cases.json", dir);
    root = json_load_file(path, 0, &jerr);
    TU_CHECK(root != NULL, "%s: %s", path, jerr.text);
    if (!root)
        return 0;
    cases = json_object_get(root, "cases");
    snprintf(path, sizeof path, "%s/vae", dir);
    json_array_foreach(cases, i, c) {
        const char *kind = json_string_value(json_object_get(c, "kind"));
        int64_t zs[5] = {0}, os[5] = {0}, ms[5] = {0}, ss[5] = {0};
        ditd_wan_vae *v = NULL;
        ditd_wan_vae_opts o = {0};
        if (strcmp(kind, "decode") == 0) {
            float *z = load(dir, c, "z", zs), *ref = load(dir, c, "out", os);
            /* planned for a latent larger than the case: any size up to it runs */
            o.max_h = (int)zs[3] + 1;
            o.max_w = (int)zs[4] + 2;
            TU_OK(ditd_wan_vae_load(path, &ditd_backend_cpu, &o, &v));
            size_t n = numel(os);
            float *out = calloc(n, sizeof *out);
            if (v && z && ref && out) {
                TU_OK(ditd_wan_vae_decode(v, z, (int)zs[0], (int)zs[2], (int)zs[3], (int)zs[4], out));
                snprintf(what, sizeof what, "%s decode z (%lld, %lld, %lld, %lld, %lld)", name,
                         (long long)zs[0], (long long)zs[1], (long long)zs[2], (long long)zs[3],
                         (long long)zs[4]);
                TU_CLOSE(what, out, ref, n, TOL);
                checked++;
                if (i == 0 && strcmp(name, "wan22-res") == 0) {
                    /* the attention through scores in memory (Wan 2.2's head of 1024) */
                    ditd_wan_vae *g = NULL;
                    ditd_wan_vae_opts go = o;
                    go.gemm_attention = 1;
                    TU_OK(ditd_wan_vae_load(path, &ditd_backend_cpu, &go, &g));
                    float *o2 = calloc(n, sizeof *o2);
                    if (g && o2) {
                        TU_OK(ditd_wan_vae_decode(g, z, (int)zs[0], (int)zs[2], (int)zs[3],
                                                  (int)zs[4], o2));
                        char w2[700];
                        snprintf(w2, sizeof w2, "%s (gemm attention)", what);
                        TU_CLOSE(w2, o2, ref, n, TOL);
                    }
                    free(o2);
                    ditd_wan_vae_free(g);
                }
                if (zs[2] > 1) { /* the same buffers again: the caches start clean for every clip */
                    TU_OK(ditd_wan_vae_decode(v, z, (int)zs[0], (int)zs[2], (int)zs[3], (int)zs[4],
                                              out));
                    snprintf(what + strlen(what), sizeof what - strlen(what), " (second run)");
                    TU_CLOSE(what, out, ref, n, TOL);
                }
            }
            free(z);
            free(ref);
            free(out);
        } else if (strcmp(kind, "encode") == 0) {
            float *x = load(dir, c, "x", zs), *mref = load(dir, c, "mean", ms);
            float *sref = load(dir, c, "std", ss);
            o.max_video_h = (int)zs[3];
            o.max_video_w = (int)zs[4];
            TU_OK(ditd_wan_vae_load(path, &ditd_backend_cpu, &o, &v));
            size_t n = numel(ms), per = n / (size_t)ms[0];
            float *mean = calloc(n, sizeof *mean), *draw = calloc(n, sizeof *draw);
            float *want = calloc(n, sizeof *want);
            if (v && x && mref && sref && mean && draw && want) {
                const ditd_wan_vae_config *cf = ditd_wan_vae_config_of(v);
                TU_CHECK(ditd_wan_vae_latent_side(cf, (int)zs[3]) == ms[3] &&
                             ditd_wan_vae_latent_side(cf, (int)zs[4]) == ms[4] &&
                             ditd_wan_vae_encode_frames(cf, (int)zs[2]) == ms[2],
                         "%s: latent of %lld frames of %lld x %lld", name, (long long)zs[2],
                         (long long)zs[3], (long long)zs[4]);
                TU_OK(ditd_wan_vae_encode(v, x, (int)zs[0], (int)zs[2], (int)zs[3], (int)zs[4], 99,
                                          mean, draw));
                for (int64_t b = 0; b < ms[0]; b++) {
                    ditd_philox_normal(99, (uint64_t)b, 0, per, want + b * per);
                    for (size_t e = 0; e < per; e++)
                        want[b * per + e] = (float)((double)mref[b * per + e] +
                                                    (double)sref[b * per + e] * want[b * per + e]);
                }
                snprintf(what, sizeof what, "%s encode mean x (%lld, %lld, %lld, %lld, %lld)", name,
                         (long long)zs[0], (long long)zs[1], (long long)zs[2], (long long)zs[3],
                         (long long)zs[4]);
                TU_CLOSE(what, mean, mref, n, TOL);
                snprintf(what, sizeof what, "%s encode draw (%lld frames)", name, (long long)zs[2]);
                TU_CLOSE(what, draw, want, n, TOL);
                checked++;
            }
            free(x);
            free(mref);
            free(sref);
            free(mean);
            free(draw);
            free(want);
        } else if (strcmp(kind, "tiled") == 0) {
            float *z = load(dir, c, "z", zs), *ref = load(dir, c, "out", os);
            json_t *tl = json_object_get(c, "tiles");
            o.max_h = (int)zs[3];
            o.max_w = (int)zs[4];
            o.tiling = 1;
            o.max_frames = (int)zs[2];
            o.tile_sample_min_h = (int)json_integer_value(json_object_get(tl, "tile_sample_min_height"));
            o.tile_sample_min_w = (int)json_integer_value(json_object_get(tl, "tile_sample_min_width"));
            o.tile_sample_stride_h =
                (int)json_integer_value(json_object_get(tl, "tile_sample_stride_height"));
            o.tile_sample_stride_w =
                (int)json_integer_value(json_object_get(tl, "tile_sample_stride_width"));
            TU_OK(ditd_wan_vae_load(path, &ditd_backend_cpu, &o, &v));
            size_t n = numel(os);
            float *out = calloc(n, sizeof *out);
            if (v && z && ref && out) {
                TU_OK(ditd_wan_vae_decode(v, z, (int)zs[0], (int)zs[2], (int)zs[3], (int)zs[4], out));
                snprintf(what, sizeof what, "%s tiled decode z (%lld, %lld, %lld, %lld, %lld)", name,
                         (long long)zs[0], (long long)zs[1], (long long)zs[2], (long long)zs[3],
                         (long long)zs[4]);
                TU_CLOSE(what, out, ref, n, TOL);
                checked++;
                /* the tiles show: the whole-latent decode is not the tiled one */
                ditd_wan_vae *whole = NULL;
                o.tiling = 0;
                TU_OK(ditd_wan_vae_load(path, &ditd_backend_cpu, &o, &whole));
                if (whole) {
                    TU_OK(ditd_wan_vae_decode(whole, z, (int)zs[0], (int)zs[2], (int)zs[3],
                                              (int)zs[4], out));
                    tu_err d = tu_compare(out, ref, n);
                    TU_CHECK(d.rel > 1e-3, "%s: the untiled decode is within %.3g of the tiled "
                             "reference: the tiling was not exercised", what, d.rel);
                    ditd_wan_vae_free(whole);
                }
            }
            free(z);
            free(ref);
            free(out);
        } else {
            TU_CHECK(0, "%s: unknown case kind %s", dir, kind);
        }
        ditd_wan_vae_free(v);
    }
    json_decref(root);
    return checked;
}

/* The fixture config of wan21-z16 with the keys of the JSON object `edits` set. */
static int parse_edits(const char *edits, ditd_wan_vae_config *out)
{
    char path[4096];
    json_error_t jerr;
    snprintf(path, sizeof path, "%s/wan_vae/wan21-z16/vae/config.json", tu_fixtures());
    json_t *root = json_load_file(path, 0, &jerr);
    TU_CHECK(root != NULL, "%s: %s", path, jerr.text);
    if (!root)
        return -1;
    json_t *v = json_loads(edits, 0, &jerr);
    TU_CHECK(v != NULL, "%s: %s", edits, jerr.text);
    json_object_update(root, v);
    json_decref(v);
    char *text = json_dumps(root, 0);
    int err = ditd_wan_vae_config_parse(text, strlen(text), "edited.json", out);
    free(text);
    json_decref(root);
    return err;
}

/* The same with one key set to the JSON `value`. */
static int parse_edited(const char *key, const char *value, ditd_wan_vae_config *out)
{
    char edits[512];
    snprintf(edits, sizeof edits, "{\"%s\": %s}", key, value);
    return parse_edits(edits, out);
}

static void refusals(void)
{
    ditd_wan_vae_config c;
    TU_OK(parse_edited("dropout", "0.1", &c)); /* read, ignored */
    TU_CHECK(c.z_dim == 16 && c.base_dim == 4 && c.decoder_base_dim == 6 && c.n_mult == 4,
             "fixture config read as z %d base %d dec %d mult %d", c.z_dim, c.base_dim,
             c.decoder_base_dim, c.n_mult);
    TU_CHECK_ERR(parse_edited("attn_scales", "[0.5]", &c), DITD_EUNSUPPORTED, "attn_scales");
    TU_CHECK_ERR(parse_edited("temperal_downsample", "[true, true]", &c), DITD_EUNSUPPORTED,
                 "temperal_downsample has 2 entries");
    TU_CHECK_ERR(parse_edited("temperal_downsample", "[true, true, true]", &c), DITD_EUNSUPPORTED,
                 "3 temporal downsamples");
    TU_CHECK_ERR(parse_edited("temperal_downsample", "[true, 1, true]", &c), DITD_EFORMAT,
                 "temperal_downsample[1]");
    TU_CHECK_ERR(parse_edited("z_dim", "0", &c), DITD_EUNSUPPORTED, "z_dim = 0");
    TU_CHECK_ERR(parse_edited("latents_mean", "[1, 2]", &c), DITD_EUNSUPPORTED,
                 "latents_mean has 2 entries");
    TU_CHECK_ERR(parse_edited("latents_std", "\"x\"", &c), DITD_EFORMAT, "latents_std");
    TU_CHECK_ERR(parse_edited("patch_size", "2", &c), DITD_EUNSUPPORTED, "in_channels = 3");
    TU_CHECK_ERR(parse_edited("scale_factor_spatial", "16", &c), DITD_EUNSUPPORTED,
                 "scale_factor_spatial = 16");
    TU_CHECK_ERR(parse_edited("scale_factor_temporal", "2", &c), DITD_EUNSUPPORTED,
                 "scale_factor_temporal = 2");
    TU_CHECK_ERR(parse_edited("dim_mult", "[1, 0]", &c), DITD_EFORMAT, "dim_mult[1]");
    TU_CHECK_ERR(parse_edits("{\"is_residual\": true, \"dim_mult\": [1, 3], \"temperal_downsample\": "
                             "[false], \"scale_factor_spatial\": 2, \"scale_factor_temporal\": 1}",
                             &c),
                 DITD_EUNSUPPORTED, "down block 1: 4 channels x factor 1 not divisible by 12");
    TU_OK(parse_edits("{\"dim_mult\": [1, 3], \"temperal_downsample\": [false], "
                      "\"scale_factor_spatial\": 2, \"scale_factor_temporal\": 1}", &c));
    TU_CHECK(ditd_wan_vae_config_frames(&c, 3) == 3 && ditd_wan_vae_encode_frames(&c, 9) == 9,
             "no temporal stage: %d frames of 3 latent frames, %d latent frames of 9",
             ditd_wan_vae_config_frames(&c, 3), ditd_wan_vae_encode_frames(&c, 9));
    TU_CHECK_ERR(parse_edited("_class_name", "\"AutoencoderKL\"", &c), DITD_EUNSUPPORTED,
                 "AutoencoderKLWan");
    TU_CHECK_ERR(parse_edited("num_res_blocks", "1.5", &c), DITD_EFORMAT, "num_res_blocks");
}

/* The registry hands out the Wan table; its image-side load refuses, its
 * summary gives what the model folder reads. */
static void registry(void)
{
    char path[4096];
    const void *t = NULL;
    TU_OK(ditd_registry_find(DITD_COMPONENT_VAE, "AutoencoderKLWan", &t));
    const ditd_vae_family *f = t;
    TU_CHECK(f && f->video && f->video->decode == ditd_wan_vae_decode, "AutoencoderKLWan table");
    if (!f)
        return;
    ditd_vae_config vc;
    snprintf(path, sizeof path, "%s/wan_vae/wan22-res/vae/config.json", tu_fixtures());
    TU_OK(f->config_load(path, &vc));
    TU_CHECK(vc.latent_channels == 12 && ditd_vae_config_scale_factor(&vc) == 16 &&
                 vc.out_channels == 3 && vc.in_channels == 3,
             "summary: %d latent channels, scale %d, %d/%d pixel channels", vc.latent_channels,
             ditd_vae_config_scale_factor(&vc), vc.in_channels, vc.out_channels);
    ditd_vae *img = NULL;
    ditd_vae_opts io = {.max_h = 4, .max_w = 4};
    snprintf(path, sizeof path, "%s/wan_vae/wan22-res/vae", tu_fixtures());
    TU_CHECK_ERR(f->load(path, &ditd_backend_cpu, &io, &img), DITD_EUNSUPPORTED, "video VAE");
    /* other backends and sizes are refused at load */
    ditd_wan_vae *v = NULL;
    ditd_wan_vae_opts o = {.max_h = 4, .max_w = 4};
    TU_CHECK_ERR(ditd_wan_vae_load(path, &ditd_backend_cpu_bf16, &o, &v), DITD_EUNSUPPORTED, "f32");
    o.max_video_h = 30;
    o.max_video_w = 32;
    TU_CHECK_ERR(ditd_wan_vae_load(path, &ditd_backend_cpu, &o, &v), DITD_EINVAL,
                 "multiple of the scale factor 16");
    ditd_wan_vae_free(v);
}

/* WanPipeline's unscale and its inverse. */
static void scale_rules(void)
{
    ditd_wan_vae_config c;
    TU_OK(parse_edited("dropout", "0.0", &c));
    float x[2 * 16 * 3];
    for (int i = 0; i < 2 * 16 * 3; i++)
        x[i] = 0.01f * (float)(i % 17) - 0.05f;
    float y[2 * 16 * 3];
    memcpy(y, x, sizeof x);
    ditd_wan_vae_unscale(&c, y, 2, 3);
    /* channel 5 of clip 1: latents * std + mean (to float rounding) */
    float want = x[(16 + 5) * 3 + 1] * (float)c.latents_std[5] + (float)c.latents_mean[5];
    TU_CHECK(fabsf(y[(16 + 5) * 3 + 1] - want) < 1e-6f, "unscale %g vs %g", y[(16 + 5) * 3 + 1],
             want);
    ditd_wan_vae_scale(&c, y, 2, 3);
    tu_err d = tu_compare(y, x, 2 * 16 * 3);
    TU_CHECK(d.max_abs < 1e-6, "scale(unscale(x)) off by %g", d.max_abs);
}

int main(void)
{
    static const char *const names[] = {"wan21-z16", "wan21-z4-bf16", "wan22-res"};
    int cases = 0;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        cases += run_vae(names[i]);
    /* the committed fixtures: 3 VAEs, 6 decodes, 7 encodes and 2 tiled decodes (a loop
     * that ran nothing fails) */
    TU_CHECK(cases >= 15, "ran %d cases (want >= 15)", cases);
    refusals();
    registry();
    scale_rules();
    return tu_exit();
}
