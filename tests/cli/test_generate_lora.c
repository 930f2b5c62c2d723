/* ditd generate --lora NAME=PATH / --lora-scale NAME=S / --lora-dir DIR (docs/lora.md), as a
 * user runs it: the tiny DiT fixture with the adapters of
 * tests/fixtures/lora, final latents (--save-latents) against Diffusers'
 * float64 runs (tools/make_lora_fixtures.py) within 1e-4; two adapters at
 * once; and the refusals (a file for another model, a missing file, a scale
 * for no adapter, a malformed option, a name given twice), each naming what
 * is wrong. */
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

static char model[1024], fix[1024], noise[1200], lat[512];

static void fx(char *buf, size_t cap, const char *name)
{
    snprintf(buf, cap, "%s/%s", fix, name);
}

/* --save-latents against a fixture's out, within 1e-4 */
static int compare(const char *what, const char *want_name)
{
    char want_path[1200];
    int64_t sg[4], sw[4];
    int ng, nw;
    float *got = NULL, *want = NULL;
    fx(want_path, sizeof want_path, want_name);
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
    char d4[1300], d8[1300], d8k[1300], f4[1300], bad[1300];
    int rc, ran = 0;
    if (argc < 2) {
        fprintf(stderr, "usage: test_generate_lora PATH/TO/ditd\n");
        return 2;
    }
    ditd_bin = argv[1];
    if (tu_mkdtemp(tmpdir, sizeof tmpdir, "lora"))
        return 2;
    snprintf(model, sizeof model, "%s/models/tiny-p2-c1-h6", tu_fixtures());
    snprintf(fix, sizeof fix, "%s/lora", tu_fixtures());
    fx(noise, sizeof noise, "dit_r4_s1_noise.npy");
    snprintf(lat, sizeof lat, "%s/lat.npy", tmpdir);
    snprintf(d4, sizeof d4, "d4=%s/dit_r4_peft.safetensors", fix);
    snprintf(d8, sizeof d8, "d8=%s/dit_r8_some_downup.safetensors", fix);
    snprintf(d8k, sizeof d8k, "d8k=%s/dit_r8_some_kohya.safetensors", fix);
    snprintf(f4, sizeof f4, "f4=%s/flux_r4_peft.safetensors", fix);
    snprintf(bad, sizeof bad, "x=%s/no-such.safetensors", fix);
#define GEN(...)                                                                            \
    RUN("generate", "--model", model, "--class", "3", "--steps", "6", "--guidance", "4",    \
        "--sampler", "flow-euler", "--latents", noise, "--save-latents", lat, "-q", __VA_ARGS__)

    rc = GEN("--lora", d4);
    TU_CHECK(rc == 0, "--lora d4: rc %d: %s", rc, errbuf);
    ran += rc == 0 && compare("--lora d4 (scale 1)", "dit_r4_s1_out.npy");
    rc = GEN("--lora", d4, "--lora-scale", "d4=0.5");
    TU_CHECK(rc == 0, "--lora-scale d4=0.5: rc %d: %s", rc, errbuf);
    ran += rc == 0 && compare("--lora d4 --lora-scale d4=0.5", "dit_r4_s05_out.npy");
    rc = GEN("--lora", d4, "--lora-scale", "d4=-1");
    ran += rc == 0 && compare("--lora d4 --lora-scale d4=-1", "dit_r4_sm1_out.npy");
    rc = GEN("--lora", d8k);
    TU_CHECK(rc == 0, "--lora kohya: rc %d: %s", rc, errbuf);
    ran += rc == 0 && compare("--lora d8k (kohya)", "dit_r8_some_kohya_out.npy");
    rc = GEN("--lora", d4, "--lora", d8, "--lora-scale", "d8=0.5");
    TU_CHECK(rc == 0, "two adapters: rc %d: %s", rc, errbuf);
    ran += rc == 0 && compare("--lora d4 --lora d8 --lora-scale d8=0.5", "dit_two_out.npy");

    /* --lora-dir: its files named by their stems (d8 here), with a --lora */
    char ldir[400], cp[2900];
    snprintf(ldir, sizeof ldir, "%s/adapters", tmpdir);
    snprintf(cp, sizeof cp, "mkdir -p '%s' && cp '%s/dit_r8_some_downup.safetensors' '%s/d8.safetensors' "
             "&& echo x > '%s/notes.txt'", ldir, fix, ldir, ldir);
    TU_CHECK(system(cp) == 0, "%s", cp);
    rc = GEN("--lora", d4, "--lora-dir", ldir, "--lora-scale", "d8=0.5");
    TU_CHECK(rc == 0, "--lora-dir: rc %d: %s", rc, errbuf);
    ran += rc == 0 && compare("--lora d4 --lora-dir (d8) --lora-scale d8=0.5", "dit_two_out.npy");
    rc = GEN("--lora", d8, "--lora-dir", ldir);
    TU_CHECK(rc == 2 && tu_has(errbuf, "d8 given twice"), "--lora-dir: a name given twice: rc %d: %s",
             rc, errbuf);
    rc = GEN("--lora-dir", "/nonexistent-lora-dir");
    TU_CHECK(rc == 2 && tu_has(errbuf, "--lora-dir /nonexistent-lora-dir"),
             "a missing --lora-dir: rc %d: %s", rc, errbuf);

    /* refusals */
    rc = GEN("--lora", f4);
    TU_CHECK(rc != 0 && tu_has(errbuf, "--lora f4") && tu_has(errbuf, "no linear module"),
             "a FLUX adapter on the DiT: rc %d: %s", rc, errbuf);
    rc = GEN("--lora", bad);
    TU_CHECK(rc != 0 && tu_has(errbuf, "no-such.safetensors"), "a missing file: rc %d: %s", rc,
             errbuf);
    rc = GEN("--lora", d4, "--lora-scale", "d9=1");
    TU_CHECK(rc == 2 && tu_has(errbuf, "--lora-scale d9"), "a scale for no adapter: rc %d: %s",
             rc, errbuf);
    rc = GEN("--lora", "nopath");
    TU_CHECK(rc == 2 && tu_has(errbuf, "NAME=PATH"), "--lora without '=': rc %d: %s", rc, errbuf);
    rc = GEN("--lora", d4, "--lora", d4);
    TU_CHECK(rc == 2 && tu_has(errbuf, "given twice"), "a name twice: rc %d: %s", rc, errbuf);
    rc = GEN("--lora", d4, "--lora-scale", "d4=abc");
    TU_CHECK(rc == 2 && tu_has(errbuf, "--lora-scale"), "a scale that is no number: rc %d: %s",
             rc, errbuf);

    TU_CHECK(ran == 6, "%d of 6 runs compared", ran);
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", tmpdir);
    return tu_exit();
}
