/* `ditd generate` end to end, as a user runs it: the real binary in a child
 * process. Checks the PNG (size, channels, determinism by seed), that
 * --latents/--save-latents reproduce the Diffusers fixture run, and that bad
 * input gets a clear message and a non-zero exit, never a crash. */
#include <fcntl.h>
#include <png.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "engine/backend/backend.h"
#include "engine/core/error.h"
#include "engine/io/npy.h"
#include "tests/test_util.h"

static const char *ditd_bin;
static char tmpdir[256];
static char errbuf[8192];

/* Runs ditd with args (NULL-terminated, without argv[0]); exit status,
 * stderr in errbuf. */
static int run(const char *const *args)
{
    return tu_spawn(ditd_bin, args, tmpdir, errbuf, sizeof errbuf);
}

static int read_png(const char *path, int *w, int *h, int *channels, unsigned char **pix)
{
    png_image img;
    memset(&img, 0, sizeof img);
    img.version = PNG_IMAGE_VERSION;
    if (!png_image_begin_read_from_file(&img, path))
        return -1;
    *w = (int)img.width;
    *h = (int)img.height;
    *channels = PNG_IMAGE_PIXEL_CHANNELS(img.format);
    *pix = malloc(PNG_IMAGE_SIZE(img));
    if (!png_image_finish_read(&img, NULL, *pix, 0, NULL)) {
        free(*pix);
        return -1;
    }
    return 0;
}

static int same_file(const char *a, const char *b)
{
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    int same = fa && fb;
    while (same) {
        int ca = fgetc(fa), cb = fgetc(fb);
        if (ca != cb)
            same = 0;
        if (ca == EOF || cb == EOF)
            break;
    }
    if (fa)
        fclose(fa);
    if (fb)
        fclose(fb);
    return same;
}

#define RUN(...) run((const char *const[]){__VA_ARGS__, NULL})

int main(int argc, char **argv)
{
    char model[1024], model4[1024], a[512], b[512], c[512], lat[512], noise[1024], want[1024];
    int w, h, ch, rc;
    unsigned char *pix = NULL;

    if (argc < 2) {
        fprintf(stderr, "usage: test_generate PATH/TO/ditd\n");
        return 2;
    }
    ditd_bin = argv[1];
    snprintf(tmpdir, sizeof tmpdir, "/tmp/ditd-test-cli-XXXXXX");
    if (!mkdtemp(tmpdir))
        return 2;
    snprintf(model, sizeof model, "%s/models/tiny-p4-c1-h3", tu_fixtures());
    snprintf(model4, sizeof model4, "%s/models/tiny-p2-c4-sigma", tu_fixtures());
    snprintf(a, sizeof a, "%s/a.png", tmpdir);
    snprintf(b, sizeof b, "%s/b.png", tmpdir);
    snprintf(c, sizeof c, "%s/c.png", tmpdir);
    snprintf(lat, sizeof lat, "%s/lat.npy", tmpdir);

    /* a grayscale picture of the model's size; one seed, one picture */
    rc = RUN("generate", "--model", model, "--class", "Dress", "--seed", "7", "--steps", "5", "-q", "-o", a);
    TU_CHECK(rc == 0, "rc %d: %s", rc, errbuf);
    TU_CHECK(read_png(a, &w, &h, &ch, &pix) == 0, "%s is not a PNG", a);
    TU_CHECK(w == 28 && h == 28 && ch == 1, "%dx%d, %d channels; want 28x28 gray", w, h, ch);
    free(pix);
    pix = NULL;
    rc = RUN("generate", "--model", model, "--class", "3", "--seed", "7", "--steps", "5", "-q", "-o", b);
    TU_CHECK(rc == 0 && same_file(a, b), "same seed, class by number: rc %d, files differ", rc);
    rc = RUN("generate", "--model", model, "--class", "3", "--seed", "8", "--steps", "5", "-q", "-o", c);
    TU_CHECK(rc == 0 && !same_file(a, c), "another seed gave the same picture (rc %d)", rc);

    /* --cache: First Block Cache at a threshold that skips steps (this random-weight
     * model's first-block residual changes a lot: 1 skips 3 of 5) changes the
     * picture and says what it skipped; a bad spec is refused by name */
    {
        char fbc[512];
        int skipped = -1, steps = -1;
        snprintf(fbc, sizeof fbc, "%s/fbc.png", tmpdir);
        rc = RUN("generate", "--model", model, "--class", "3", "--seed", "7", "--steps", "5",
                 "--cache", "first_block_cache:threshold=1", "-o", fbc);
        const char *at = strstr(errbuf, "first_block_cache skipped ");
        if (at)
            sscanf(at, "first_block_cache skipped %d of %d steps", &skipped, &steps);
        TU_CHECK(rc == 0 && skipped > 0 && steps == 5, "--cache first_block_cache: rc %d, "
                 "skipped %d of %d: %s", rc, skipped, steps, errbuf);
        TU_CHECK(rc == 0 && !same_file(a, fbc), "skipped steps left the picture as it was");
        rc = RUN("generate", "--model", model, "--class", "3", "--seed", "7", "--steps", "5",
                 "--cache", "first_block_cache:threshold=0", "-q", "-o", fbc);
        TU_CHECK(rc == 0 && same_file(a, fbc), "threshold 0 skips nothing: the same picture (rc %d)",
                 rc);
        rc = RUN("generate", "--model", model, "--cache", "first_block_cache:thresold=0.1", "-o", fbc);
        TU_CHECK(rc == 2 && strstr(errbuf, "--cache") && strstr(errbuf, "thresold"),
                 "a misspelled field: rc %d: %s", rc, errbuf);
        rc = RUN("generate", "--model", model, "--cache", "fastercache", "-o", fbc);
        TU_CHECK(rc == 2 && strstr(errbuf, "--cache") && strstr(errbuf, "fastercache"),
                 "an unknown method: rc %d: %s", rc, errbuf);
        rc = RUN("generate", "--model", model, "--cache", "first_block_cache:threshold=-1", "-o", fbc);
        TU_CHECK(rc == 2 && strstr(errbuf, "threshold"), "a negative threshold: rc %d: %s", rc,
                 errbuf);
    }

    /* 4 channels: an RGBA PNG; -n 2 writes two files */
    snprintf(c, sizeof c, "%s/four.png", tmpdir);
    rc = RUN("generate", "--model", model4, "-n", "2", "--steps", "3", "-q", "-o", c);
    TU_CHECK(rc == 0, "rc %d: %s", rc, errbuf);
    snprintf(c, sizeof c, "%s/four-1.png", tmpdir);
    TU_CHECK(read_png(c, &w, &h, &ch, &pix) == 0 && w == 16 && h == 16 && ch == 4,
             "%s: %dx%d, %d channels", c, w, h, ch);
    free(pix);
    pix = NULL;

    /* reproduce the Diffusers fixture run: DPM-Solver++ 10 steps, guidance 4, classes [1, 3]
     * as two runs of one image each would not match (the noise file has 2 samples): run -n 2
     * with class 1 only for shape checks, and the exact case through sample3 (guidance 1). */
    snprintf(noise, sizeof noise, "%s/expected/sample3_dpmpp-2m_g1_noise.npy", model);
    snprintf(want, sizeof want, "%s/expected/sample3_dpmpp-2m_g1_out.npy", model);
    rc = RUN("generate", "--model", model, "-n", "2", "--class", "1", "--steps", "10", "--guidance", "1",
             "--latents", noise, "--save-latents", lat, "-q");
    TU_CHECK(rc == 0, "rc %d: %s", rc, errbuf);
    {
        int nd1, nd2;
        int64_t s1[4], s2[4];
        float *got = NULL, *ref = NULL;
        TU_OK(ditd_npy_read_f32(lat, 4, &nd1, s1, &got));
        TU_OK(ditd_npy_read_f32(want, 4, &nd2, s2, &ref));
        if (got && ref) {
            TU_CHECK(nd1 == 4 && s1[0] == 2 && s1[1] == 1 && s1[2] == 28, "saved shape");
            /* sample 0 has class 1 in the fixture; sample 1 has class 3, ours class 1 */
            TU_CLOSE("generate --latents sample 0 vs Diffusers", got, ref, 28 * 28, 1e-4);
        }
        free(got);
        free(ref);
    }

    /* bad input: clear message, exit 1 or 2, never a signal */
    rc = RUN("generate", "--model", model, "--class", "nope", "-o", a);
    TU_CHECK(rc == 1 && strstr(errbuf, "unknown class \"nope\"") && strstr(errbuf, "trouser"),
             "unknown class: rc %d: %s", rc, errbuf);
    rc = RUN("generate", "--model", model, "--class", "10", "-o", a);
    TU_CHECK(rc == 1 && strstr(errbuf, "class 10 outside 0..9"), "class 10: rc %d: %s", rc, errbuf);
    rc = RUN("generate", "--model", "/nonexistent", "-o", a);
    TU_CHECK(rc == 1 && strstr(errbuf, "model_index.json"), "missing model: rc %d: %s", rc, errbuf);
    rc = RUN("generate", "--model", model, "--sampler", "euler-a", "-o", a);
    TU_CHECK(rc == 1 && strstr(errbuf, "euler-a"), "bad sampler: rc %d: %s", rc, errbuf);
    rc = RUN("generate", "--model", model, "--steps", "0", "-o", a);
    TU_CHECK(rc == 2 && strstr(errbuf, "--steps"), "steps 0: rc %d: %s", rc, errbuf);
    rc = RUN("generate", "--model", model, "--latents", want, "-n", "1", "-o", a);
    TU_CHECK(rc == 1 && strstr(errbuf, "expected (1, 1, 28, 28)"), "latents shape: rc %d: %s", rc, errbuf);
    rc = RUN("generate", "--model", model, "--latents", model, "-o", a);
    TU_CHECK(rc == 1 && strstr(errbuf, "--latents"), "latents not npy: rc %d: %s", rc, errbuf);
    rc = RUN("generate", "--model", model);
    TU_CHECK(rc == 2 && strstr(errbuf, "-o"), "no output: rc %d: %s", rc, errbuf);
    rc = RUN("generate", "--model", model, "-o", "/nonexistent-dir/x.png", "--steps", "1", "-q");
    TU_CHECK(rc == 1 && strstr(errbuf, "/nonexistent-dir/x.png"), "unwritable: rc %d: %s", rc, errbuf);
    /* --device cuda: runs where there is a GPU; without one (or in a build
     * without CUDA) a clear message naming cuda and exit 1 */
    if (ditd_backend_check(DITD_DEVICE_CUDA) == 0) {
        rc = RUN("generate", "--model", model, "--device", "cuda", "--steps", "3", "-q", "-o", c);
        TU_CHECK(rc == 0, "--device cuda on a GPU: rc %d: %s", rc, errbuf);
    } else {
        ditd_err_clear();
        rc = RUN("generate", "--model", model, "--device", "cuda", "--steps", "3", "-q", "-o", c);
        TU_CHECK(rc == 1 && strstr(errbuf, "--device cuda"), "--device cuda without a GPU: rc %d: %s",
                 rc, errbuf);
    }
    rc = RUN("generate", "--model", model, "--device", "tpu", "-o", a);
    TU_CHECK(rc == 2 && strstr(errbuf, "tpu"), "--device tpu: rc %d: %s", rc, errbuf);
    rc = RUN("frobnicate");
    TU_CHECK(rc == 2 && strstr(errbuf, "unknown command"), "unknown command: rc %d: %s", rc, errbuf);

    /* a latent model whose vae/ is missing is refused for -o, naming the file */
    {
        char vdir[512], cmd[2048];
        snprintf(vdir, sizeof vdir, "%s/latent", tmpdir);
        snprintf(cmd, sizeof cmd,
                 "cp -r '%s' '%s' && sed -i 's/\"_class_name\": \"DiTPipeline\",/\"_class_name\": "
                 "\"DiTPipeline\", \"vae\": [\"diffusers\", \"AutoencoderKL\"],/' '%s/model_index.json'",
                 model4, vdir, vdir);
        TU_CHECK(system(cmd) == 0, "%s", cmd);
        rc = RUN("generate", "--model", vdir, "-o", a);
        TU_CHECK(rc == 1 && strstr(errbuf, "vae/config.json"), "latent model: rc %d: %s", rc, errbuf);
        rc = RUN("generate", "--model", vdir, "--steps", "2", "-q", "--save-latents", lat);
        TU_CHECK(rc == 0, "latent model --save-latents: rc %d: %s", rc, errbuf);
    }

    /* a latent DiT with its vae/ (tests/fixtures/vae/dit-latent): -o writes the decoded
     * picture, sample_size 8 x vae scale factor 2 = 16 pixels a side, 3 channels */
    {
        char lm[1024], png[600];
        unsigned char hdr[26] = {0};
        snprintf(lm, sizeof lm, "%s/vae/dit-latent", tu_fixtures());
        snprintf(png, sizeof png, "%s/latent.png", tmpdir);
        rc = RUN("generate", "--model", lm, "--steps", "2", "--class", "3", "-q", "-o", png);
        TU_CHECK(rc == 0, "latent model -o: rc %d: %s", rc, errbuf);
        FILE *f = fopen(png, "rb");
        TU_CHECK(f && fread(hdr, 1, sizeof hdr, f) == sizeof hdr, "read %s", png);
        if (f)
            fclose(f);
        /* IHDR: width, height (big-endian) at 16 and 20, bit depth 8, color type 2 (RGB) */
        TU_CHECK(hdr[19] == 16 && hdr[23] == 16 && hdr[24] == 8 && hdr[25] == 2,
                 "latent.png is %dx%d, depth %d, color type %d (want 16x16 RGB)", hdr[19], hdr[23],
                 hdr[24], hdr[25]);
        rc = RUN("generate", "--model", lm, "--steps", "2", "-q", "--vae-tiling", "-o", png);
        TU_CHECK(rc == 0, "latent model --vae-tiling: rc %d: %s", rc, errbuf);
    }

    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    TU_CHECK(system(cmd) == 0, "cleanup");
    return tu_exit();
}
