/* `ditd generate --image REF.png` on a FluxKontextPipeline folder (the tiny
 * FLUX.1-dev folder under a model_index.json naming that class), as a user
 * runs it: the real binary in a child process, for the cases of
 * tests/fixtures/flux_kontext (Diffusers'
 * FluxKontextPipeline in float64 with ditd's Philox noise, so a run from the
 * seed alone reproduces it): --size the request's size, --max-area the
 * case's (the output is brought to it as Diffusers does), --no-auto-resize
 * when the case turns _auto_resize off, -n for a batch of two (with one
 * reference, and with two: --image twice, output i takes reference i % 2), a
 * negative prompt with --true-cfg, no --image for text-to-image;
 * --save-latents within 1e-4 of Diffusers' final latents, the PNGs within one
 * 8-bit level of its images. One case once more with --latents (the noise
 * written by this test from ditd's Philox draw, under another --seed: the
 * same result). Refused, naming the field: --strength and --mask on a
 * Kontext folder, --max-area on FluxPipeline. A reference that is not at the
 * size the pipeline brings it to is resized and runs.
 *   test_generate_kontext DITD */
#include <jansson.h>
#include <png.h>
#include <stdio.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/error.h"
#include "engine/core/philox.h"
#include "engine/io/npy.h"
#include "tests/flux_edit_case.h"
#include "tests/test_util.h"

#define MIN_CASES 7

static const char *ditd_bin;
static char tmpdir[256], kdir[4096];
static char errbuf[8192];

static float *fixture(const char *name, size_t *n)
{
    return edit_npy("flux_kontext", name, n, 0);
}

/* Image b of a run's PNGs against Diffusers' out_u8 rows: the worst level. */
static int png_worst(const char *path, const float *want, size_t per)
{
    png_image pi;
    memset(&pi, 0, sizeof pi);
    pi.version = PNG_IMAGE_VERSION;
    int worst = 256;
    if (png_image_begin_read_from_file(&pi, path)) {
        pi.format = PNG_FORMAT_RGB;
        unsigned char *px = malloc(PNG_IMAGE_SIZE(pi));
        if (px && png_image_finish_read(&pi, NULL, px, 0, NULL) && PNG_IMAGE_SIZE(pi) == per) {
            size_t off;
            worst = tu_pixels_worst(px, want, per, &off);
        }
        free(px);
    }
    return worst;
}

/* The case's initial noise as Diffusers drew it (ditd's Philox streams
 * under its seed) into an npy of (B, 16, h, w): --latents. */
static int write_noise(json_t *c, const char *path)
{
    int B = jint(c, "batch"), h = jint(c, "latent_height"), w = jint(c, "latent_width");
    size_t per = (size_t)16 * h * w;
    float *x = malloc((size_t)B * per * sizeof *x);
    if (!x)
        return -1;
    for (int b = 0; b < B; b++)
        ditd_philox_normal((uint64_t)jint(c, "seed"), (uint64_t)b, 0, per, x + (size_t)b * per);
    int64_t shape[4] = {B, 16, h, w};
    int err = ditd_npy_write_f32(path, 4, shape, x);
    free(x);
    return err;
}

/* One case through the binary (with_latents: --latents and another seed);
 * 1 when checked to the end. */
static int run_case(json_t *c, int with_latents)
{
    const char *name = jstr(c, "name");
    char ref[2][4096], lat_path[600], png_path[600], noise[600], steps[16], g[32], L[16], seed[32],
        tcfg[32], nimg[16], size[32], area[32];
    const char *args[48];
    int na = 0, B = jint(c, "batch");
    json_t *refs = json_object_get(c, "refs");
    if (json_array_size(refs) > 2)
        return 0;
    snprintf(lat_path, sizeof lat_path, "%s/%s%s.npy", tmpdir, name, with_latents ? "-l" : "");
    snprintf(png_path, sizeof png_path, "%s/%s%s.png", tmpdir, name, with_latents ? "-l" : "");
    snprintf(noise, sizeof noise, "%s/%s-noise.npy", tmpdir, name);
    snprintf(steps, sizeof steps, "%d", jint(c, "num_inference_steps"));
    snprintf(g, sizeof g, "%.9g", jnum(c, "guidance_scale"));
    snprintf(L, sizeof L, "%d", jint(c, "max_sequence_length"));
    snprintf(seed, sizeof seed, "%d", jint(c, "seed") + (with_latents ? 1000 : 0));
    snprintf(tcfg, sizeof tcfg, "%.9g", jnum(c, "true_cfg_scale"));
    snprintf(nimg, sizeof nimg, "%d", B);
    snprintf(size, sizeof size, "%dx%d", jint(c, "request_width"), jint(c, "request_height"));
    snprintf(area, sizeof area, "%d", jint(c, "max_area"));
    const char *base[] = {"generate", "--model", kdir, "--prompt", jstr(c, "prompt"), "--size", size,
                          "--max-area", area, "--steps", steps, "--guidance", g,
                          "--max-sequence-length", L, "--seed", seed, "-n", nimg,
                          "--save-latents", lat_path, "-o", png_path, "-q", "--threads", "1",
                          "--dtype", "f32"};
    for (size_t i = 0; i < sizeof base / sizeof base[0]; i++)
        args[na++] = base[i];
    for (size_t k = 0; k < json_array_size(refs); k++) { /* two: Diffusers' image list */
        snprintf(ref[k], sizeof ref[k], "%s/flux_kontext/expected/%s", tu_fixtures(),
                 jstr(json_array_get(refs, k), "png"));
        args[na++] = "--image";
        args[na++] = ref[k];
    }
    if (!json_is_true(json_object_get(c, "auto_resize")))
        args[na++] = "--no-auto-resize";
    if (jstr(c, "negative_prompt")) {
        args[na++] = "--negative-prompt";
        args[na++] = jstr(c, "negative_prompt");
        args[na++] = "--true-cfg";
        args[na++] = tcfg;
    }
    if (with_latents) {
        TU_CHECK(write_noise(c, noise) == 0, "%s: the noise file", name);
        args[na++] = "--latents";
        args[na++] = noise;
    }
    args[na] = NULL;
    int rc = tu_spawn(ditd_bin, args, tmpdir, errbuf, sizeof errbuf);
    TU_CHECK(rc == 0, "%s: ditd generate exit %d: %s", name, rc, errbuf);
    if (rc)
        return 0;
    int nd2;
    int64_t shape2[8];
    size_t n, n2 = 1;
    float *want = fixture(jstr(c, "final_latents"), &n), *got = NULL;
    TU_OK(ditd_npy_read_f32(lat_path, 8, &nd2, shape2, &got));
    int lat_ok = 0;
    if (want && got) {
        for (int i = 0; i < nd2; i++)
            n2 *= (size_t)shape2[i];
        TU_CHECK(n == n2, "%s: --save-latents (%zu values), Diffusers %zu", name, n2, n);
        if (n == n2) {
            char what[256];
            snprintf(what, sizeof what, "%s: ditd generate%s's final latents vs Diffusers", name,
                     with_latents ? " --latents" : "");
            lat_ok = tu_compare(got, want, n).rel <= 1e-4;
            TU_CLOSE(what, got, want, n, 1e-4);
        }
    }
    size_t ni;
    float *img = fixture(jstr(c, "out_u8"), &ni);
    int worst = 0;
    for (int b = 0; img && b < B; b++) {
        char p[700];
        if (B == 1)
            snprintf(p, sizeof p, "%s", png_path);
        else
            snprintf(p, sizeof p, "%s/%s%s-%d.png", tmpdir, name, with_latents ? "-l" : "", b);
        int w = png_worst(p, img + (size_t)b * (ni / (size_t)B), ni / (size_t)B);
        worst = w > worst ? w : worst;
    }
    TU_CHECK(img && worst <= 1, "%s: the PNGs within one level of Diffusers' images (worst %d)",
             name, worst);
    int done = img && worst <= 1 && lat_ok;
    if (done)
        printf("ok   %s%s\n", name, with_latents ? " (--latents)" : "");
    free(img), free(want), free(got);
    return done;
}

static void refused(const char *const *args, const char *want1, const char *want2, const char *what)
{
    int rc = tu_spawn(ditd_bin, args, tmpdir, errbuf, sizeof errbuf);
    TU_CHECK(rc != 0 && strstr(errbuf, want1) && (!want2 || strstr(errbuf, want2)),
             "%s: refused naming \"%s\": rc %d: %s", what, want1, rc, errbuf);
}

int main(int argc, char **argv)
{
    char path[4096];
    json_error_t jerr;
    if (argc != 2) {
        fprintf(stderr, "usage: test_generate_kontext DITD\n");
        return 2;
    }
    ditd_bin = argv[1];
    (void)edit_encode_prompts; /* the header's, for the golden tests */
    if (tu_mkdtemp(tmpdir, sizeof tmpdir, "gen-kontext") ||
        edit_folder_make(kdir, sizeof kdir, "kontext-cli", "FluxKontextPipeline"))
        return 1;
    snprintf(path, sizeof path, "%s/flux_kontext/expected/cases.json", tu_fixtures());
    json_t *root = json_load_file(path, 0, &jerr), *c;
    TU_CHECK(root != NULL, "%s: %s", path, jerr.text);
    size_t i;
    int checked = 0, with_lat = 0;
    json_array_foreach(json_object_get(root, "cases"), i, c) {
        checked += run_case(c, 0);
        if (!strcmp(jstr(c, "name"), "batch2_one_ref"))
            with_lat += run_case(c, 1);
    }
    TU_CHECK(checked >= MIN_CASES && with_lat == 1,
             "cases through ditd generate on a Kontext folder: %d (at least %d), with --latents %d",
             checked, MIN_CASES, with_lat);

    char ref[4096], dev[4096];
    snprintf(ref, sizeof ref, "%s/flux_kontext/expected/ref_same_ar_ref.png", tu_fixtures());
    snprintf(dev, sizeof dev, "%s/dev", FLUX_PIPELINE_DIR);
    const char *bad_str[] = {"generate", "--model", kdir, "--prompt", "a", "--image", ref,
                             "--strength", "0.5", "-o", "x.png", NULL};
    refused(bad_str, "--strength", "no strength", "--strength on Kontext");
    const char *bad_mask[] = {"generate", "--model", kdir, "--prompt", "a", "--image", ref,
                              "--mask", ref, "-o", "x.png", NULL};
    refused(bad_mask, "--mask", "no mask", "--mask on Kontext");
    const char *bad_area[] = {"generate", "--model", dev, "--prompt", "a", "--max-area", "4096",
                              "-o", "x.png", NULL};
    refused(bad_area, "--max-area", "FluxPipeline", "--max-area on FluxPipeline");
    /* _auto_resize on: the 48x32 reference goes to 1248x832, a resize (PIL's
     * Lanczos, byte for byte: test_image_resize; the route equals this run,
     * http_kontext) */
    char rpath[700];
    snprintf(rpath, sizeof rpath, "%s/resized.png", tmpdir);
    const char *resize[] = {"generate", "--model", kdir, "--prompt", "a", "--image", ref,
                            "--max-area", "1024", "--steps", "1", "-o", rpath, NULL};
    int rc = tu_spawn(ditd_bin, resize, tmpdir, errbuf, sizeof errbuf);
    TU_CHECK(rc == 0 && access(rpath, R_OK) == 0,
             "a reference not at its preferred resolution is resized and runs: rc %d: %s", rc,
             errbuf);
    json_decref(root);
    edit_folder_rm(kdir);
    snprintf(path, sizeof path, "rm -rf '%s'", tmpdir);
    TU_CHECK(system(path) == 0, "cleanup");
    return tu_exit();
}
