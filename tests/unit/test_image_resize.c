/* PIL's Lanczos resize (engine/core/image_resize.c) against Pillow itself:
 * tests/fixtures/image_resize (tools/make_resize_fixtures.py) holds PIL's
 * Image.resize((dw, dh), Image.LANCZOS) of pseudo-random L and RGB images
 * (up, down, mixed, one axis, 1xN and Nx1, primes, extreme aspect ratios,
 * random pairs; and RGBA, which PIL resizes premultiplied, then its color as
 * VaeImageProcessor converts it); the images are drawn here from the same LCG. Every case
 * must be equal byte for byte; floors on the cases and on those where PIL
 * ran the vertical pass first. Then the refusals: sides 0 and negative,
 * channels other than 1 and 3, sides and products over the limits (refused
 * before allocating: a NULL destination is never touched). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/error.h"
#include "engine/core/image_resize.h"
#include "tests/test_util.h"

#define MIN_CASES 240 /* the tool writes 254 */
#define MIN_VFIRST 40 /* cases where only the vertical-first order gives PIL's bytes (50) */

/* the tool's generator: x <- x * 6364136223846793005 + 1442695040888963407 */
static uint8_t lcg(uint64_t *x)
{
    *x = *x * 6364136223846793005ULL + 1442695040888963407ULL;
    return (uint8_t)(*x >> 56);
}

static uint8_t *source(const char *kind, uint64_t seed, int w, int h, int c)
{
    uint8_t *a = malloc((size_t)w * h * c);
    if (!a)
        return NULL;
    uint64_t x = seed;
    if (!strcmp(kind, "noise")) {
        for (size_t i = 0; i < (size_t)w * h * c; i++)
            a[i] = lcg(&x);
        return a;
    }
    int bw = (w + 2) / 3, bh = (h + 2) / 3;
    uint8_t *cell = malloc((size_t)bw * bh);
    if (!cell) {
        free(a);
        return NULL;
    }
    for (int i = 0; i < bw * bh; i++)
        cell[i] = (lcg(&x) & 0x80) ? 255 : 0;
    for (int y = 0; y < h; y++)
        for (int xx = 0; xx < w; xx++)
            for (int k = 0; k < c; k++)
                a[((size_t)y * w + xx) * c + k] = cell[(y / 3) * bw + xx / 3];
    free(cell);
    return a;
}

static uint8_t *read_all(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    uint8_t *b = NULL;
    *n = 0;
    if (f && !fseek(f, 0, SEEK_END)) {
        long l = ftell(f);
        if (l > 0 && !fseek(f, 0, SEEK_SET) && (b = malloc((size_t)l)) &&
            fread(b, 1, (size_t)l, f) == (size_t)l)
            *n = (size_t)l;
    }
    if (f)
        fclose(f);
    return b;
}

static void against_pil(void)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/image_resize/out.bin", tu_fixtures());
    size_t nblob;
    uint8_t *blob = read_all(path, &nblob);
    TU_CHECK(blob != NULL, "cannot read %s", path);
    snprintf(path, sizeof path, "%s/image_resize/manifest.txt", tu_fixtures());
    FILE *m = fopen(path, "r");
    TU_CHECK(m != NULL, "cannot open %s", path);
    if (!blob || !m) {
        free(blob);
        if (m)
            fclose(m);
        return;
    }
    char line[256], kind[16], order[16];
    int cases = 0, equal = 0, vfirst = 0, up = 0, down = 0, ones = 0, gray = 0, rgb = 0, rgba = 0;
    while (fgets(line, sizeof line, m)) {
        unsigned long long seed;
        int sw, sh, c, dw, dh;
        size_t off;
        if (line[0] == '#' || sscanf(line, "%15s %llu %d %d %d %d %d %15s %zu", kind, &seed, &sw,
                                     &sh, &c, &dw, &dh, order, &off) != 9)
            continue;
        const int oc = c == 4 ? 3 : c; /* RGBA: resized, then its color */
        const size_t nout = (size_t)dw * dh * oc;
        TU_CHECK(off + nout <= nblob, "case %s %llu: out.bin too short", kind, seed);
        if (off + nout > nblob)
            break;
        uint8_t *src = source(kind, seed, sw, sh, c), *got = malloc(nout);
        TU_CHECK(src && got, "out of memory");
        if (src && got) {
            if (c == 4)
                TU_OK(ditd_image_resize_rgba(src, sw, sh, got, dw, dh));
            else
                TU_OK(ditd_image_resize(src, sw, sh, c, got, dw, dh));
            size_t diff = 0;
            int worst = 0;
            for (size_t i = 0; i < nout; i++) {
                int d = abs((int)got[i] - (int)blob[off + i]);
                diff += d != 0;
                worst = d > worst ? d : worst;
            }
            TU_CHECK(diff == 0, "%s %dx%d -> %dx%d (%d ch, PIL %s): %zu of %zu bytes differ, "
                     "worst %d levels", kind, sw, sh, dw, dh, c, order, diff, nout, worst);
            equal += diff == 0;
            vfirst += diff == 0 && !strcmp(order, "VH");
            up += diff == 0 && (dw > sw || dh > sh);
            down += diff == 0 && (dw < sw || dh < sh);
            ones += diff == 0 && (sw == 1 || sh == 1 || dw == 1 || dh == 1);
            gray += diff == 0 && c == 1;
            rgb += diff == 0 && c == 3;
            rgba += diff == 0 && c == 4;
        }
        cases++;
        free(src);
        free(got);
    }
    fclose(m);
    free(blob);
    printf("PIL LANCZOS: %d of %d cases equal byte for byte (vertical pass first %d, upscaling %d, "
           "downscaling %d, a 1-pixel side %d, L %d, RGB %d, RGBA %d)\n", equal, cases, vfirst, up,
           down, ones, gray, rgb, rgba);
    TU_CHECK(cases >= MIN_CASES, "%d cases read (at least %d)", cases, MIN_CASES);
    TU_CHECK(equal == cases, "%d of %d equal", equal, cases);
    TU_CHECK(vfirst >= MIN_VFIRST, "%d vertical-first cases (at least %d)", vfirst, MIN_VFIRST);
    TU_CHECK(up >= 40 && down >= 40 && ones >= 20 && gray >= 90 && rgb >= 90 && rgba >= 35,
             "coverage: up %d, down %d, 1-pixel %d, L %d, RGB %d, RGBA %d", up, down, ones, gray,
             rgb, rgba);
}

/* the same size is a copy; a one-axis resize equals PIL's through the
 * filter entry too */
static void entries(void)
{
    uint8_t a[5 * 4 * 3], b[5 * 4 * 3], c[9 * 4 * 3];
    uint64_t x = 7;
    for (size_t i = 0; i < sizeof a; i++)
        a[i] = lcg(&x);
    TU_OK(ditd_image_resize(a, 5, 4, 3, b, 5, 4));
    TU_CHECK(!memcmp(a, b, sizeof a), "the same size is not a copy");
    uint8_t d[9 * 4 * 3];
    TU_OK(ditd_image_resize(a, 5, 4, 3, c, 9, 4));
    TU_OK(ditd_image_resize_filter(a, 5, 4, 3, d, 9, 4, DITD_RESAMPLE_LANCZOS));
    TU_CHECK(!memcmp(c, d, sizeof c), "ditd_image_resize is not the lanczos filter entry");
}

/* absurd sizes: refused with EINVAL before anything is allocated or
 * written (dst NULL: a write would crash) */
static void refusals(void)
{
    uint8_t px[12] = {0};
    int n = 0;
#define REFUSE(sw, sh, ch, dst, dw, dh, what)                                                  \
    do {                                                                                      \
        TU_CHECK_ERR(ditd_image_resize(px, sw, sh, ch, dst, dw, dh), DITD_EINVAL, what);     \
        n++;                                                                                  \
    } while (0)
    REFUSE(0, 2, 3, px, 2, 2, "sides must be >= 1");
    REFUSE(2, 2, 3, px, 0, 2, "sides must be >= 1");
    REFUSE(2, -5, 3, px, 2, 2, "sides must be >= 1");
    REFUSE(2, 2, 1, px, 2, -1, "sides must be >= 1");
    REFUSE(-2147483647 - 1, 2, 1, px, 2, 2, "sides must be >= 1");
    REFUSE(2, 2, 2, px, 3, 3, "2 channels (1: L, 3: RGB)");
    REFUSE(2, 2, 4, px, 3, 3, "4 channels (1: L, 3: RGB)");
    REFUSE(2, 2, 0, px, 3, 3, "0 channels");
    REFUSE(65537, 1, 1, NULL, 1, 1, "over the resize limits");
    REFUSE(1, 1, 1, NULL, 1, 2147483647, "over the resize limits");
    REFUSE(2147483647, 2147483647, 3, NULL, 2147483647, 2147483647, "over the resize limits");
    REFUSE(20000, 20000, 3, NULL, 16, 16, "over the resize limits");  /* 4e8 source pixels */
    REFUSE(16, 16, 3, NULL, 30000, 30000, "over the resize limits");  /* 9e8 destination */
    REFUSE(2, 2, 3, NULL, 3, 3, "no pixels");
    TU_CHECK_ERR(ditd_image_resize_filter(px, 2, 2, 5, px, 1, 1, DITD_RESAMPLE_BICUBIC),
                 DITD_EINVAL, "channels 1..4");
    TU_CHECK_ERR(ditd_image_resize_filter(px, 2, 2, 3, px, 1, 1, (ditd_resample)9),
                 DITD_EUNSUPPORTED, "resample 9");
    TU_CHECK_ERR(ditd_image_resize_rgba(px, 0, 2, px, 1, 1), DITD_EINVAL, "sides must be >= 1");
    TU_CHECK_ERR(ditd_image_resize_rgba(px, 2, 2, NULL, 70000, 1), DITD_EINVAL, "resize limits");
    n += 4;
    TU_CHECK(n == 18, "%d refusals checked", n);
#undef REFUSE
}

int main(void)
{
    against_pil();
    entries();
    refusals();
    return tu_exit();
}
