/* ditd generate --lora with text-encoder adapters (docs/lora.md, "Text encoders"), as a
 * user runs it: the tiny FLUX.1-dev folder with the adapters of tests/fixtures/lora_te
 * (a CLIP adapter whose file carries a transformer part, a kohya CLIP adapter, a T5
 * adapter), --prompt, f32 weights, and the tiny SD3 folder (both CLIPs, then with its
 * T5): final latents (--save-latents) against Diffusers' float64 runs
 * (tools/make_lora_te_fixtures.py) within 1e-4; and the refusals naming
 * the option, the file and the tensor (a text-encoder adapter on the DiT, which has no
 * text encoder; an SD3 T5 file on FLUX). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/io/npy.h"
#include "tests/test_util.h"

static const char *ditd_bin;
static char tmpdir[256];
static char errbuf[8192];

#define RUN(...) tu_spawn(ditd_bin, (const char *const[]){__VA_ARGS__, NULL}, tmpdir, errbuf, \
                          sizeof errbuf)

static char model[1100], fix[1024], noise[1200], lat[512];

/* --save-latents against a fixture's out, within 1e-4 */
static int compare(const char *what, const char *want_name)
{
    char want_path[1200];
    int64_t sg[4], sw[4];
    int ng, nw;
    float *got = NULL, *want = NULL;
    snprintf(want_path, sizeof want_path, "%s/%s", fix, want_name);
    TU_OK(ditd_npy_read_f32(lat, 4, &ng, sg, &got));
    TU_OK(ditd_npy_read_f32(want_path, 4, &nw, sw, &want));
    int ok = got && want && ng == 4 && nw == 4 && !memcmp(sg, sw, sizeof sg);
    TU_CHECK(ok, "%s: latents of another shape", what);
    if (ok)
        TU_CLOSE(what, got, want, (size_t)(sg[0] * sg[1] * sg[2] * sg[3]), 1e-4);
    free(got), free(want);
    return ok;
}

int main(int argc, char **argv)
{
    char c4[1300], c8k[1300], t4[1300], t3[1300], dit[1100];
    int rc, ran = 0;
    if (argc < 4) {
        fprintf(stderr, "usage: test_generate_lora_te PATH/TO/ditd FLUX_PIPELINE_DIR "
                        "SD3_PIPELINE_DIR\n");
        return 2;
    }
    ditd_bin = argv[1];
    if (tu_mkdtemp(tmpdir, sizeof tmpdir, "lora-te"))
        return 2;
    snprintf(model, sizeof model, "%s/dev", argv[2]);
    snprintf(fix, sizeof fix, "%s/lora_te", tu_fixtures());
    snprintf(noise, sizeof noise, "%s/flux_pipeline/expected/dev_64_default_noise.npy",
             tu_fixtures());
    snprintf(lat, sizeof lat, "%s/lat.npy", tmpdir);
    snprintf(dit, sizeof dit, "%s/models/tiny-p2-c1-h6", tu_fixtures());
    snprintf(c4, sizeof c4, "c4=%s/te_clip_r4_peft.safetensors", fix);
    snprintf(c8k, sizeof c8k, "c8k=%s/te_clip_r8_kohya.safetensors", fix);
    snprintf(t4, sizeof t4, "t4=%s/te_t5_r4_peft.safetensors", fix);
    snprintf(t3, sizeof t3, "t3=%s/sd3_t5_r4_peft.safetensors", fix);
#define GEN(...)                                                                              \
    RUN("generate", "--model", model, "--prompt",                                            \
        "A photo of an astronaut riding a horse on the moon", "--steps", "4", "--guidance",   \
        "3.5", "--size", "64x64", "--dtype", "f32", "--latents", noise, "--save-latents", lat, \
        "-q", __VA_ARGS__)

    rc = GEN("--lora", c4);
    TU_CHECK(rc == 0, "--lora c4: rc %d: %s", rc, errbuf);
    ran += rc == 0 && compare("--lora c4 (CLIP + transformer, PEFT)", "te_c4_s1_out.npy");
    rc = GEN("--lora", c4, "--lora-scale", "c4=0.5");
    TU_CHECK(rc == 0, "--lora c4 at 0.5: rc %d: %s", rc, errbuf);
    ran += rc == 0 && compare("--lora c4 --lora-scale c4=0.5", "te_c4_s05_out.npy");
    rc = GEN("--lora", c8k);
    TU_CHECK(rc == 0, "--lora c8k: rc %d: %s", rc, errbuf);
    ran += rc == 0 && compare("--lora c8k (kohya CLIP)", "te_c8k_s1_out.npy");
    rc = GEN("--lora", t4);
    TU_CHECK(rc == 0, "--lora t4: rc %d: %s", rc, errbuf);
    ran += rc == 0 && compare("--lora t4 (T5, PEFT)", "te_t4_s1_out.npy");
    rc = GEN("--lora", c4, "--lora", t4, "--lora-scale", "t4=0.5");
    TU_CHECK(rc == 0, "--lora c4 --lora t4: rc %d: %s", rc, errbuf);
    ran += rc == 0 && compare("--lora c4 --lora t4 --lora-scale t4=0.5", "te_c4_t4_out.npy");

    /* one kohya file with both parts (the transformer in BFL names, CLIP's
     * lora_te1_), as trainers write them: the same latents as the two parts
     * given as two adapters, bit for bit */
    {
        char kb[1300], kbt[1300], two[600];
        snprintf(kb, sizeof kb, "kb=%s/lora_formats/flux_kohya_bfl_r4.safetensors",
                 tu_fixtures());
        snprintf(kbt, sizeof kbt, "kbt=%s/flux_kohya_bfl_te1.safetensors", fix);
        snprintf(two, sizeof two, "%s/two.npy", tmpdir);
        rc = GEN("--lora", kb, "--lora", c8k);
        TU_CHECK(rc == 0 && rename(lat, two) == 0, "--lora kb --lora c8k: rc %d: %s", rc, errbuf);
        rc = GEN("--lora", kbt);
        TU_CHECK(rc == 0, "--lora kbt: rc %d: %s", rc, errbuf);
        int64_t sa[4], sb[4];
        int na, nb;
        float *a = NULL, *b = NULL;
        if (rc == 0 && !ditd_npy_read_f32(two, 4, &na, sa, &a) &&
            !ditd_npy_read_f32(lat, 4, &nb, sb, &b)) {
            size_t n = (size_t)(sa[0] * sa[1] * sa[2] * sa[3]);
            TU_CHECK(na == 4 && nb == 4 && !memcmp(sa, sb, sizeof sa) &&
                         !memcmp(a, b, n * sizeof *a),
                     "one kohya file with the transformer and CLIP parts = the two files apart");
            ran++;
        }
        free(a), free(b);
        remove(two);
    }

    /* SD3: both CLIPs (g4) at 1, then at 0.5 with the T5 (t3); CFG over "" */
    {
        char sd3[1100], sd3_noise[1200], g4[1300];
        snprintf(sd3, sizeof sd3, "%s/sd3", argv[3]);
        snprintf(sd3_noise, sizeof sd3_noise,
                 "%s/sd3_pipeline/expected/sd3_64_default_noise.npy", tu_fixtures());
        snprintf(g4, sizeof g4, "g4=%s/sd3_clips_r4_peft.safetensors", fix);
#define GEN3(...)                                                                             \
    RUN("generate", "--model", sd3, "--prompt",                                               \
        "A photo of an astronaut riding a horse on the moon", "--steps", "3", "--guidance", "7", \
        "--size", "64x64", "--max-sequence-length", "256", "--dtype", "f32", "--latents",      \
        sd3_noise, "--save-latents", lat, "-q", __VA_ARGS__)
        rc = GEN3("--lora", g4);
        TU_CHECK(rc == 0, "SD3 --lora g4: rc %d: %s", rc, errbuf);
        ran += rc == 0 && compare("SD3 --lora g4 (both CLIPs)", "sd3_g4_s1_out.npy");
        rc = GEN3("--lora", g4, "--lora", t3, "--lora-scale", "g4=0.5");
        TU_CHECK(rc == 0, "SD3 --lora g4 --lora t3: rc %d: %s", rc, errbuf);
        ran += rc == 0 && compare("SD3 --lora g4 --lora t3 --lora-scale g4=0.5 (CLIPs + T5)",
                                  "sd3_g4_t3_out.npy");
#undef GEN3
    }

    /* refusals: SD3's T5 part on FLUX (no text_encoder_3); a text-encoder file on the DiT */
    rc = GEN("--lora", t3);
    TU_CHECK(rc != 0 && tu_has(errbuf, "--lora t3") && tu_has(errbuf, "text_encoder_3.") &&
                 tu_has(errbuf, "a text encoder this model does not have"),
             "an SD3 T5 adapter on FLUX: rc %d: %s", rc, errbuf);
    rc = RUN("generate", "--model", dit, "--class", "3", "--steps", "2", "-q", "-o",
             "x.png", "--lora", c8k);
    TU_CHECK(rc != 0 && tu_has(errbuf, "--lora c8k") && tu_has(errbuf, "lora_te1_") &&
                 tu_has(errbuf, "no text encoder"),
             "a text-encoder adapter on the DiT: rc %d: %s", rc, errbuf);

    TU_CHECK(ran == 8, "%d of 8 runs compared", ran);
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", tmpdir);
    return tu_exit();
}
