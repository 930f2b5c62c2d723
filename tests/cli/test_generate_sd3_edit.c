/* `ditd generate --image IN.png [--mask M.png] [--strength S]` on the SD3
 * folders, as a user runs it: the real binary in a child process, for three
 * cases of tests/fixtures/sd3_img2img (Diffusers'
 * StableDiffusion3Img2ImgPipeline and StableDiffusion3InpaintPipeline in
 * float64 with ditd's Philox draws, so a run from the seed alone reproduces
 * them; the golden test runs all eleven): img2img at strength 0.75 with a
 * negative prompt and --prompt-3; inpainting with a mask with holes, CFG
 * over "" and -n 2 on a folder whose model_index.json names
 * StableDiffusion3InpaintPipeline; inpainting on the stripes mask with no
 * --strength (the inpainting row's default, 1.0). The input PNG at the
 * output size (so --size comes from the image), --save-latents within 1e-4
 * of Diffusers' final latents, the PNGs within one 8-bit level of its images
 * (the inpainting ones decoded as that pipeline decodes, without
 * shift_factor). Refused, naming the reason: --skip-layers with --image and
 * with --mask (the SD3 edit pipelines have no skip-layer guidance).
 *   test_generate_sd3_edit DITD SD3_PIPELINE_DIR */
#include <jansson.h>
#include <png.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/error.h"
#include "engine/io/npy.h"
#include "tests/sd3_edit_case.h"
#include "tests/test_util.h"

#define MIN_CASES 3

static const char *ditd_bin, *pipe_dir;
static char tmpdir[256];
static char errbuf[8192];

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

/* One case through the binary on folder model; 1 when checked to the end.
 * with_strength 0: --strength left out (the edit row's default). */
static int run_case(json_t *c, const char *model, int with_strength)
{
    const char *name = sd3e_str(c, "name");
    char image[4096], mask[4096], lat_path[600], png_path[600], steps[16], g[32], L[16], seed[32],
        strength[32], nimg[16];
    const char *args[48];
    int na = 0, done = 0, B = sd3e_int(c, "batch");
    snprintf(image, sizeof image, "%s/" SD3_EDIT_SET "/expected/%s", tu_fixtures(),
             sd3e_str(c, "image"));
    snprintf(lat_path, sizeof lat_path, "%s/%s.npy", tmpdir, name);
    snprintf(png_path, sizeof png_path, "%s/%s.png", tmpdir, name);
    snprintf(steps, sizeof steps, "%d", sd3e_int(c, "num_inference_steps"));
    snprintf(g, sizeof g, "%.9g", sd3e_num(c, "guidance_scale"));
    snprintf(L, sizeof L, "%d", sd3e_int(c, "max_sequence_length"));
    snprintf(seed, sizeof seed, "%d", sd3e_int(c, "seed"));
    snprintf(strength, sizeof strength, "%.17g", sd3e_num(c, "strength"));
    snprintf(nimg, sizeof nimg, "%d", B);
    const char *base[] = {"generate", "--model", model, "--prompt", sd3e_str(c, "prompt"),
                          "--image", image, "--steps", steps, "--guidance", g,
                          "--max-sequence-length", L, "--seed", seed, "-n", nimg,
                          "--save-latents", lat_path, "-o", png_path, "-q", "--threads", "1",
                          "--dtype", "f32"};
    for (size_t i = 0; i < sizeof base / sizeof base[0]; i++)
        args[na++] = base[i];
    if (with_strength) {
        args[na++] = "--strength";
        args[na++] = strength;
    }
    if (sd3e_str(c, "mask")) {
        snprintf(mask, sizeof mask, "%s/" SD3_EDIT_SET "/expected/%s", tu_fixtures(),
                 sd3e_str(c, "mask"));
        args[na++] = "--mask";
        args[na++] = mask;
    }
    if (sd3e_str(c, "negative_prompt")) {
        args[na++] = "--negative-prompt";
        args[na++] = sd3e_str(c, "negative_prompt");
    }
    if (sd3e_str(c, "prompt_3")) {
        args[na++] = "--prompt-3";
        args[na++] = sd3e_str(c, "prompt_3");
    }
    args[na] = NULL;
    int rc = tu_spawn(ditd_bin, args, tmpdir, errbuf, sizeof errbuf);
    TU_CHECK(rc == 0, "%s: ditd generate exit %d: %s", name, rc, errbuf);
    if (rc)
        return 0;
    int nd2;
    int64_t shape2[8];
    size_t n, n2 = 1;
    float *want = sd3e_npy(sd3e_str(c, "final_latents"), &n, 0), *got = NULL;
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
    float *img = sd3e_npy(sd3e_str(c, "out_u8"), &ni, 0);
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
        fprintf(stderr, "usage: test_generate_sd3_edit DITD SD3_PIPELINE_DIR\n");
        return 2;
    }
    ditd_bin = argv[1];
    pipe_dir = argv[2];
    if (tu_mkdtemp(tmpdir, sizeof tmpdir, "gen-sd3-edit"))
        return 1;
    snprintf(path, sizeof path, "%s/" SD3_EDIT_SET "/expected/cases.json", tu_fixtures());
    json_t *root = json_load_file(path, 0, &jerr), *c;
    TU_CHECK(root != NULL, "%s: %s", path, jerr.text);
    static const char *const names[] = {"i2i_sd3_48x80_s075_neg",
                                        "inp_sd35_48x32_s075_batch2_holes_class",
                                        "inp_sd3_32_s10_stripes"};
    size_t i;
    int checked = 0;
    json_array_foreach(json_object_get(root, "cases"), i, c) {
        const char *nm = sd3e_str(c, "name");
        for (size_t k = 0; nm && k < sizeof names / sizeof *names; k++) {
            if (strcmp(nm, names[k]))
                continue;
            char dir[4096];
            int tmp = 0;
            if (sd3e_case_folder(root, c, pipe_dir, dir, sizeof dir, &tmp)) {
                TU_CHECK(0, "%s: a folder for the case", nm);
                continue;
            }
            checked += run_case(c, dir, k != 2);
            if (tmp)
                sd3e_folder_rm(dir);
        }
    }
    TU_CHECK(checked >= MIN_CASES, "SD3 cases through ditd generate --image: %d (at least %d)",
             checked, MIN_CASES);

    char model[4096], image[4096], mask[4096];
    snprintf(model, sizeof model, "%s/sd3", pipe_dir);
    snprintf(image, sizeof image, "%s/" SD3_EDIT_SET "/expected/inp_sd3_32_s10_stripes_image.png",
             tu_fixtures());
    snprintf(mask, sizeof mask, "%s/" SD3_EDIT_SET "/expected/inp_sd3_32_s10_stripes_mask.png",
             tu_fixtures());
    const char *slg_i2i[] = {"generate", "--model", model, "--prompt", "a", "--image", image,
                             "--skip-layers", "1", "-o", "x.png", NULL};
    refused(slg_i2i, "--skip-layers", "StableDiffusion3Img2ImgPipeline",
            "--skip-layers with --image");
    const char *slg_inp[] = {"generate", "--model", model, "--prompt", "a", "--image", image,
                             "--mask", mask, "--skip-layers", "1", "-o", "x.png", NULL};
    refused(slg_inp, "--skip-layers", "StableDiffusion3InpaintPipeline",
            "--skip-layers with --mask");
    json_decref(root);
    snprintf(path, sizeof path, "rm -rf '%s'", tmpdir);
    TU_CHECK(system(path) == 0, "cleanup");
    return tu_exit();
}
