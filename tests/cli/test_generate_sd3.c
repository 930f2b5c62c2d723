/* `ditd generate` on StableDiffusion3Pipeline folders, as a user runs it:
 * the real binary in a child process, for the golden cases of
 * tests/fixtures/sd3_pipeline with a negative prompt, prompt_2 / prompt_3,
 * skip-layer guidance and a T5-less folder. --latents gives Diffusers'
 * noise, --save-latents writes the final latents: within 1e-4 of Diffusers'
 * float64 run; the PNG within one 8-bit level of its image. Flags a
 * pipeline does not take are refused naming it.
 *   test_generate_sd3 DITD SD3_PIPELINE_DIR */
#include <jansson.h>
#include <png.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/error.h"
#include "engine/io/npy.h"
#include "tests/test_util.h"

#define MIN_CASES 4

static const char *ditd_bin, *pipe_dir;
static char tmpdir[256];
static char errbuf[8192];

static float *npy_fixture(const char *name, size_t *n, int64_t *shape, int *nd)
{
    char path[4096];
    float *d = NULL;
    snprintf(path, sizeof path, "%s/sd3_pipeline/expected/%s", tu_fixtures(), name);
    if (ditd_npy_read_f32(path, 8, nd, shape, &d)) {
        TU_CHECK(0, "%s: %s", path, ditd_err_detail());
        return NULL;
    }
    *n = 1;
    for (int i = 0; i < *nd; i++)
        *n *= (size_t)shape[i];
    return d;
}

static const char *jstr(json_t *c, const char *k) { return json_string_value(json_object_get(c, k)); }
static int jint(json_t *c, const char *k) { return (int)json_integer_value(json_object_get(c, k)); }

/* One case through the binary; 1 when checked to the end. */
static int run_case(json_t *c)
{
    const char *name = jstr(c, "name");
    char model[4096], noise_path[4096], lat_path[600], png_path[600], size[32], steps[16], g[32],
        L[16], skip[64] = "", sscale[32], sstart[32], sstop[32];
    const char *args[48];
    int na = 0, done = 0;
    json_t *negs = json_object_get(c, "negative_prompts"), *sk = json_object_get(c, "skip_guidance_layers");
    if (jint(c, "batch") != 1)
        return 0; /* one prompt a run here */
    snprintf(model, sizeof model, "%s/%s", pipe_dir, jstr(c, "folder"));
    snprintf(noise_path, sizeof noise_path, "%s/sd3_pipeline/expected/%s", tu_fixtures(), jstr(c, "noise"));
    snprintf(lat_path, sizeof lat_path, "%s/%s.npy", tmpdir, name);
    snprintf(png_path, sizeof png_path, "%s/%s.png", tmpdir, name);
    snprintf(size, sizeof size, "%dx%d", jint(c, "width"), jint(c, "height"));
    snprintf(steps, sizeof steps, "%d", jint(c, "num_inference_steps"));
    snprintf(g, sizeof g, "%.9g", json_number_value(json_object_get(c, "guidance_scale")));
    snprintf(L, sizeof L, "%d", jint(c, "max_sequence_length"));
    const char *base[] = {"generate", "--model", model, "--prompt",
                          json_string_value(json_array_get(json_object_get(c, "prompts"), 0)),
                          "--size", size, "--steps", steps, "--guidance", g, "--max-sequence-length", L,
                          "--latents", noise_path, "--save-latents", lat_path, "-o", png_path, "-q",
                          "--threads", "1"};
    for (size_t i = 0; i < sizeof base / sizeof base[0]; i++)
        args[na++] = base[i];
    static const char *const opt[][2] = {{"prompt_2", "--prompt-2"}, {"prompt_3", "--prompt-3"},
                                         {"negative_prompt_2", "--negative-prompt-2"},
                                         {"negative_prompt_3", "--negative-prompt-3"}};
    for (size_t i = 0; i < sizeof opt / sizeof opt[0]; i++)
        if (jstr(c, opt[i][0])) {
            args[na++] = opt[i][1];
            args[na++] = jstr(c, opt[i][0]);
        }
    if (json_is_array(negs) && json_is_string(json_array_get(negs, 0))) {
        args[na++] = "--negative-prompt";
        args[na++] = json_string_value(json_array_get(negs, 0));
    }
    if (json_is_array(sk) && json_array_size(sk) > 0) {
        size_t off = 0, i;
        json_t *v;
        json_array_foreach(sk, i, v) {
            off += (size_t)snprintf(skip + off, sizeof skip - off, "%s%lld", i ? "," : "",
                                    (long long)json_integer_value(v));
        }
        snprintf(sscale, sizeof sscale, "%.9g", json_number_value(json_object_get(c, "skip_layer_guidance_scale")));
        snprintf(sstart, sizeof sstart, "%.9g", json_number_value(json_object_get(c, "skip_layer_guidance_start")));
        snprintf(sstop, sizeof sstop, "%.9g", json_number_value(json_object_get(c, "skip_layer_guidance_stop")));
        const char *sl[] = {"--skip-layers", skip, "--slg-scale", sscale, "--slg-start", sstart,
                            "--slg-stop", sstop};
        for (size_t k = 0; k < 8; k++)
            args[na++] = sl[k];
    }
    args[na] = NULL;
    int rc = tu_spawn(ditd_bin, args, tmpdir, errbuf, sizeof errbuf);
    TU_CHECK(rc == 0, "%s: ditd generate exit %d: %s", name, rc, errbuf);
    if (rc)
        return 0;
    int nd, nd2;
    int64_t shape[8], shape2[8];
    size_t n, n2;
    float *want = npy_fixture(jstr(c, "final_latents"), &n, shape, &nd), *got = NULL;
    TU_OK(ditd_npy_read_f32(lat_path, 8, &nd2, shape2, &got));
    if (want && got) {
        n2 = 1;
        for (int i = 0; i < nd2; i++)
            n2 *= (size_t)shape2[i];
        TU_CHECK(nd == nd2 && n == n2, "%s: --save-latents (%zu values), Diffusers %zu", name, n2, n);
        if (n == n2) {
            char what[256];
            snprintf(what, sizeof what, "%s: ditd generate's final latents vs Diffusers", name);
            TU_CLOSE(what, got, want, n, 1e-4);
        }
    }
    size_t ni;
    int ndi;
    int64_t si[8];
    float *img = npy_fixture(jstr(c, "image_u8"), &ni, si, &ndi);
    png_image pi;
    memset(&pi, 0, sizeof pi);
    pi.version = PNG_IMAGE_VERSION;
    unsigned char *px = NULL;
    if (img && png_image_begin_read_from_file(&pi, png_path)) {
        pi.format = PNG_FORMAT_RGB;
        px = malloc(PNG_IMAGE_SIZE(pi));
        if (px && png_image_finish_read(&pi, NULL, px, 0, NULL) && PNG_IMAGE_SIZE(pi) == ni) {
            size_t off;
            int worst = tu_pixels_worst(px, img, ni, &off);
            TU_CHECK(worst <= 1, "%s: the PNG within one level of Diffusers' image (worst %d)", name, worst);
            done = worst <= 1;
        } else {
            TU_CHECK(0, "%s: %s: %ux%u, want %zu values", name, png_path, pi.width, pi.height, ni);
        }
    } else {
        TU_CHECK(0, "%s: cannot read %s", name, png_path);
    }
    free(px), free(img), free(want), free(got);
    return done;
}

int main(int argc, char **argv)
{
    char path[4096];
    json_error_t jerr;
    if (argc != 3) {
        fprintf(stderr, "usage: test_generate_sd3 DITD SD3_PIPELINE_DIR\n");
        return 2;
    }
    ditd_bin = argv[1];
    pipe_dir = argv[2];
    if (tu_mkdtemp(tmpdir, sizeof tmpdir, "gen-sd3"))
        return 1;
    snprintf(path, sizeof path, "%s/sd3_pipeline/expected/cases.json", tu_fixtures());
    json_t *root = json_load_file(path, 0, &jerr), *c;
    TU_CHECK(root != NULL, "%s: %s", path, jerr.text);
    size_t i;
    int checked = 0;
    json_array_foreach(json_object_get(root, "cases"), i, c) checked += run_case(c);
    TU_CHECK(checked >= MIN_CASES, "cases through ditd generate: %d (at least %d)", checked, MIN_CASES);
    /* what the pipeline row does not take, refused by name */
    char model[4096];
    snprintf(model, sizeof model, "%s/sd3", pipe_dir);
    const char *bad1[] = {"generate", "--model", model, "--prompt", "a", "--true-cfg", "3", "-o",
                          "x.png", NULL};
    int rc = tu_spawn(ditd_bin, bad1, tmpdir, errbuf, sizeof errbuf);
    TU_CHECK(rc != 0 && strstr(errbuf, "--true-cfg") && strstr(errbuf, "StableDiffusion3Pipeline"),
             "--true-cfg on SD3: refused naming it: rc %d: %s", rc, errbuf);
    const char *bad2[] = {"generate", "--model", model, "--prompt", "a", "--skip-layers", "1,x", "-o",
                          "x.png", NULL};
    rc = tu_spawn(ditd_bin, bad2, tmpdir, errbuf, sizeof errbuf);
    TU_CHECK(rc != 0 && strstr(errbuf, "--skip-layers"), "--skip-layers 1,x refused: rc %d: %s", rc, errbuf);
    json_decref(root);
    snprintf(path, sizeof path, "rm -rf '%s'", tmpdir);
    TU_CHECK(system(path) == 0, "cleanup");
    return tu_exit();
}
