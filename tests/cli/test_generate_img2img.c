/* `ditd generate --image IN.png [--mask M.png] --strength S` on the FLUX.1
 * folders, as a user runs it: the real binary in a child process, for the
 * cases of tests/fixtures/flux_img2img (Diffusers' FluxImg2ImgPipeline in
 * float64 with ditd's Philox draws, so a run from the seed alone reproduces
 * it) and two of tests/fixtures/flux_inpaint (FluxInpaintPipeline: a mask
 * with holes, alone and with true CFG and a batch of two; the golden test
 * runs all five): the
 * input PNG at the output size (so --size comes from the image), -n for the
 * batch of two, --save-latents within 1e-4 of Diffusers' final latents, the
 * PNGs within one 8-bit level of its images. Refused, naming the reason:
 * --image on a model without img2img, an image of another size than
 * --size, --strength without --image, --strength out of range, --mask without --image,
 * a mask of another size, -n not a multiple of the --image count, two
 * --image of different sizes. The image-list cases pass --image twice
 * (output i edits image i mod 2, as Diffusers' image list).
 *   test_generate_img2img DITD FLUX_PIPELINE_DIR */
#include <jansson.h>
#include <png.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/error.h"
#include "engine/io/npy.h"
#include "tests/test_util.h"

#define MIN_CASES 7
#define MIN_MASK_CASES 2
#define MIN_LIST_CASES 2 /* image lists: two --image, -n 2 and -n 4 */

static int n_list;
static const char *ditd_bin, *pipe_dir;
static char tmpdir[256];
static char errbuf[8192];

static const char *set = "flux_img2img"; /* the fixture set of the cases being run */

static float *npy_fixture(const char *name, size_t *n)
{
    char path[4096];
    int64_t shape[8];
    int nd;
    float *d = NULL;
    snprintf(path, sizeof path, "%s/%s/expected/%s", tu_fixtures(), set, name);
    if (ditd_npy_read_f32(path, 8, &nd, shape, &d)) {
        TU_CHECK(0, "%s: %s", path, ditd_err_detail());
        return NULL;
    }
    *n = 1;
    for (int i = 0; i < nd; i++)
        *n *= (size_t)shape[i];
    return d;
}

static const char *jstr(json_t *c, const char *k) { return json_string_value(json_object_get(c, k)); }
static int jint(json_t *c, const char *k) { return (int)json_integer_value(json_object_get(c, k)); }
static double jnum(json_t *c, const char *k) { return json_number_value(json_object_get(c, k)); }

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

/* One case through the binary; 1 when checked to the end. */
static int run_case(json_t *c)
{
    const char *name = jstr(c, "name");
    char model[4096], image[4096], mask[4096], lat_path[600], png_path[600], steps[16], g[32], L[16], seed[32],
        strength[32], tcfg[32], nimg[16];
    const char *args[64];
    int na = 0, done = 0, B = jint(c, "batch");
    snprintf(model, sizeof model, "%s/%s", pipe_dir, jstr(c, "folder"));
    snprintf(image, sizeof image, "%s/%s/expected/%s", tu_fixtures(), set, jstr(c, "image"));
    snprintf(lat_path, sizeof lat_path, "%s/%s.npy", tmpdir, name);
    snprintf(png_path, sizeof png_path, "%s/%s.png", tmpdir, name);
    snprintf(steps, sizeof steps, "%d", jint(c, "num_inference_steps"));
    snprintf(g, sizeof g, "%.9g", jnum(c, "guidance_scale"));
    snprintf(L, sizeof L, "%d", jint(c, "max_sequence_length"));
    snprintf(seed, sizeof seed, "%d", jint(c, "seed"));
    snprintf(strength, sizeof strength, "%.17g", jnum(c, "strength"));
    snprintf(tcfg, sizeof tcfg, "%.9g", jnum(c, "true_cfg_scale"));
    snprintf(nimg, sizeof nimg, "%d", B);
    const char *base[] = {"generate", "--model", model, "--prompt", jstr(c, "prompt"), "--image",
                          image, "--strength", strength, "--steps", steps, "--guidance", g,
                          "--max-sequence-length", L, "--seed", seed, "-n", nimg,
                          "--save-latents", lat_path, "-o", png_path, "-q", "--threads", "1",
                          "--dtype", "f32"};
    for (size_t i = 0; i < sizeof base / sizeof base[0]; i++)
        args[na++] = base[i];
    /* an image list: --image repeated, in order (the first is in base) */
    json_t *ims = json_object_get(c, "images");
    char more[4][4096];
    for (size_t j = 1; j < json_array_size(ims) && j <= 4; j++) {
        snprintf(more[j - 1], sizeof more[j - 1], "%s/%s/expected/%s", tu_fixtures(), set,
                 json_string_value(json_array_get(ims, j)));
        args[na++] = "--image";
        args[na++] = more[j - 1];
    }
    n_list += json_array_size(ims) > 1;
    if (jstr(c, "mask")) {
        snprintf(mask, sizeof mask, "%s/%s/expected/%s", tu_fixtures(), set, jstr(c, "mask"));
        args[na++] = "--mask";
        args[na++] = mask;
    }
    if (jstr(c, "negative_prompt")) {
        args[na++] = "--negative-prompt";
        args[na++] = jstr(c, "negative_prompt");
        args[na++] = "--true-cfg";
        args[na++] = tcfg;
    }
    args[na] = NULL;
    int rc = tu_spawn(ditd_bin, args, tmpdir, errbuf, sizeof errbuf);
    TU_CHECK(rc == 0, "%s: ditd generate exit %d: %s", name, rc, errbuf);
    if (rc)
        return 0;
    int nd2;
    int64_t shape2[8];
    size_t n, n2 = 1;
    float *want = npy_fixture(jstr(c, "final_latents"), &n), *got = NULL;
    TU_OK(ditd_npy_read_f32(lat_path, 8, &nd2, shape2, &got));
    int lat_ok = 0;
    if (want && got) {
        for (int i = 0; i < nd2; i++)
            n2 *= (size_t)shape2[i];
        TU_CHECK(n == n2, "%s: --save-latents (%zu values), Diffusers %zu", name, n2, n);
        if (n == n2) {
            char what[256];
            snprintf(what, sizeof what, "%s: ditd generate --image's final latents vs Diffusers",
                     name);
            lat_ok = tu_compare(got, want, n).rel <= 1e-4;
            TU_CLOSE(what, got, want, n, 1e-4);
        }
    }
    size_t ni;
    float *img = npy_fixture(jstr(c, "out_u8"), &ni);
    int worst = 0;
    for (int b = 0; img && b < B; b++) {
        char p[700];
        if (B == 1)
            snprintf(p, sizeof p, "%s", png_path);
        else
            snprintf(p, sizeof p, "%s/%s-%d.png", tmpdir, name, b);
        int w = png_worst(p, img + (size_t)b * (ni / (size_t)B), ni / (size_t)B);
        worst = w > worst ? w : worst;
    }
    TU_CHECK(img && worst <= 1, "%s: the PNGs within one level of Diffusers' images (worst %d)", name,
             worst);
    done = img && worst <= 1 && lat_ok;
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
    if (argc != 3) {
        fprintf(stderr, "usage: test_generate_img2img DITD FLUX_PIPELINE_DIR\n");
        return 2;
    }
    ditd_bin = argv[1];
    pipe_dir = argv[2];
    if (tu_mkdtemp(tmpdir, sizeof tmpdir, "gen-img2img"))
        return 1;
    snprintf(path, sizeof path, "%s/flux_img2img/expected/cases.json", tu_fixtures());
    json_t *root = json_load_file(path, 0, &jerr), *c;
    TU_CHECK(root != NULL, "%s: %s", path, jerr.text);
    size_t i;
    int checked = 0;
    json_array_foreach(json_object_get(root, "cases"), i, c) checked += run_case(c);
    TU_CHECK(checked >= MIN_CASES, "cases through ditd generate --image: %d (at least %d)", checked,
             MIN_CASES);
    TU_CHECK(n_list >= MIN_LIST_CASES, "image-list cases (--image repeated): %d (at least %d)",
             n_list, MIN_LIST_CASES);
    json_decref(root);
    /* inpainting: the holes case alone, and with true CFG and a batch of two */
    set = "flux_inpaint";
    snprintf(path, sizeof path, "%s/flux_inpaint/expected/cases.json", tu_fixtures());
    root = json_load_file(path, 0, &jerr);
    TU_CHECK(root != NULL, "%s: %s", path, jerr.text);
    int masked = 0;
    json_array_foreach(json_object_get(root, "cases"), i, c) {
        const char *nm = jstr(c, "name");
        if (nm && (!strcmp(nm, "dev_32x48_s03_holes") || !strcmp(nm, "dev_32x48_s075_batch2_true_cfg")))
            masked += run_case(c);
    }
    TU_CHECK(masked >= MIN_MASK_CASES, "cases through ditd generate --image --mask: %d (at least %d)",
             masked, MIN_MASK_CASES);

    char model[4096], image[4096];
    snprintf(model, sizeof model, "%s/dev", pipe_dir);
    snprintf(image, sizeof image, "%s/flux_img2img/expected/dev_32x48_s03_image.png", tu_fixtures());
    const char *bad_model[] = {"generate", "--image", image, "-o", "x.png", NULL};
    refused(bad_model, "takes no input image", "DiTPipeline", "--image on the embedded DiT");
    const char *bad_size[] = {"generate", "--model", model, "--prompt", "a", "--image", image,
                              "--size", "32x32", "-o", "x.png", NULL};
    refused(bad_size, "resampling", "48x32", "--image 48x32 with --size 32x32");
    const char *bad_str[] = {"generate", "--model", model, "--prompt", "a", "--strength", "0.5",
                             "-o", "x.png", NULL};
    refused(bad_str, "--strength needs --image", NULL, "--strength without --image");
    const char *bad_range[] = {"generate", "--model", model, "--prompt", "a", "--image", image,
                               "--strength", "1.5", "-o", "x.png", NULL};
    refused(bad_range, "--strength", NULL, "--strength 1.5");
    const char *bad_zero[] = {"generate", "--model", model, "--prompt", "a", "--image", image,
                              "--strength", "0", "-o", "x.png", NULL};
    refused(bad_zero, "strength 0", NULL, "--strength 0");
    const char *bad_mask[] = {"generate", "--model", model, "--prompt", "a", "--mask", image,
                              "-o", "x.png", NULL};
    refused(bad_mask, "--mask needs --image", NULL, "--mask without --image");
    char small[4096];
    snprintf(small, sizeof small, "%s/flux_img2img/expected/dev_32_s10_image.png", tu_fixtures());
    const char *bad_msize[] = {"generate", "--model", model, "--prompt", "a", "--image", image,
                               "--mask", small, "-o", "x.png", NULL};
    refused(bad_msize, "--mask", "32x32", "a 32x32 mask on a 48x32 image");
    /* an image list: n a multiple of the images; the images of one size */
    char l0[4096], l1[4096];
    snprintf(l0, sizeof l0, "%s/flux_img2img/expected/dev_32x48_s06_2img_image0.png", tu_fixtures());
    snprintf(l1, sizeof l1, "%s/flux_img2img/expected/dev_32x48_s06_2img_image1.png", tu_fixtures());
    const char *bad_n[] = {"generate", "--model", model, "--prompt", "a", "--image", l0, "--image",
                           l1, "-n", "3", "-o", "x.png", NULL};
    refused(bad_n, "n = 3", "2 input images", "-n 3 from two --image");
    const char *bad_lsize[] = {"generate", "--model", model, "--prompt", "a", "--image", l0,
                               "--image", small, "-o", "x.png", NULL};
    refused(bad_lsize, "same size", "32x32", "two --image of different sizes");
    json_decref(root);
    snprintf(path, sizeof path, "rm -rf '%s'", tmpdir);
    TU_CHECK(system(path) == 0, "cleanup");
    return tu_exit();
}
