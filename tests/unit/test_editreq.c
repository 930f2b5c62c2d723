/* The edit route's parser with several input images (server/daemon/editreq.c,
 * issue 23): Diffusers' image list typed once (output i edits image i % k,
 * n a multiple of k, n absent = k, one mask for all or each image's own
 * alpha), through the form (`image[]` repeated) and JSON (an array); and the
 * hostile cases, where the refusal must come from the headers before any
 * upload's pixels are allocated (the image module's allocation counter does
 * not move): a bomb as the second image, a mask of another size, images of
 * two sizes, n not a multiple. Images are written here with libpng's
 * simplified API, so their pixels are known exactly. */
#include <png.h>
#include <zlib.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/error.h"
#include "engine/models/model.h"
#include "engine/pipeline/edit_images.h"
#include "server/common/image_in.h"
#include "server/daemon/api_error.h"
#include "server/daemon/genreq.h"
#include "tests/test_util.h"

#define B "XyZ"
#define S 16

static ditd_model_info flux;
static ditd_genreq_model gm;

static void model_init(void)
{
    strcpy(flux.name, "flux");
    flux.shapes.cond.kind = DITD_COND_TEXT;
    flux.shapes.height = flux.shapes.width = 2;
    flux.shapes.in_channels = 16;
    flux.shapes.tokens = 1;
    flux.vae_scale = 8;
    flux.needs_vae = 1;
    flux.image_width = flux.image_height = S;
    flux.image_channels = 3;
    flux.resizable = 1;
    flux.size_multiple = 16;
    flux.min_size = 16;
    flux.max_size = 64;
    flux.max_sequence_length = 512;
    flux.default_max_sequence_length = 512;
    flux.default_steps = 28;
    flux.default_guidance = 3.5f;
    flux.pipeline = &ditd_pipeline_flux;
    gm = (ditd_genreq_model){&flux, NULL, 0, DITD_SAMPLER_FLOW_EULER, NULL, NULL, 0, 4, NULL};
}

typedef struct buf {
    uint8_t *d;
    size_t n;
} buf;

/* A w x h PNG of ch channels (3 RGB, 4 RGBA) whose pixel bytes are f(x, y, c). */
static buf png_of(int w, int h, int ch, int (*f)(int, int, int, int), int seed)
{
    png_image pi;
    memset(&pi, 0, sizeof pi);
    pi.version = PNG_IMAGE_VERSION;
    pi.width = (png_uint_32)w;
    pi.height = (png_uint_32)h;
    pi.format = ch == 4 ? PNG_FORMAT_RGBA : PNG_FORMAT_RGB;
    uint8_t *px = malloc((size_t)w * h * ch);
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++)
            for (int c = 0; c < ch; c++)
                px[((size_t)y * w + x) * ch + c] = (uint8_t)f(x, y, c, seed);
    png_alloc_size_t n = 0;
    png_image_write_to_memory(&pi, NULL, &n, 0, px, 0, NULL);
    buf b = {malloc(n), n};
    png_image_write_to_memory(&pi, b.d, &n, 0, px, 0, NULL);
    b.n = n;
    free(px);
    return b;
}

static int color(int x, int y, int c, int seed)
{
    return (x * 13 + y * 7 + c * 50 + seed * 31) % 256;
}
/* OpenAI's mask: transparent (change) in columns 4..11 */
static int oamask(int x, int y, int c, int seed)
{
    (void)y, (void)seed;
    return c == 3 ? (x >= 4 && x < 12 ? 0 : 255) : 0;
}
/* an image with its own alpha: transparent in rows seed..seed+3 */
static int alpha(int x, int y, int c, int seed)
{
    return c == 3 ? (y >= seed && y < seed + 4 ? 0 : 255) : color(x, y, c, seed);
}

/* A form of parts (name, data or text). */
typedef struct part {
    const char *name;
    const buf *file;
    const char *text;
} part;

static buf form(const part *p, int n)
{
    size_t cap = 1 << 16, len = 0;
    buf b = {malloc(cap), 0};
    for (int i = 0; i < n; i++) {
        len += (size_t)snprintf((char *)b.d + len, cap - len,
                                "--" B "\r\nContent-Disposition: form-data; name=\"%s\"%s\r\n\r\n",
                                p[i].name, p[i].file ? "; filename=\"f.png\"" : "");
        if (p[i].file) {
            memcpy(b.d + len, p[i].file->d, p[i].file->n);
            len += p[i].file->n;
        } else {
            len += (size_t)snprintf((char *)b.d + len, cap - len, "%s", p[i].text);
        }
        memcpy(b.d + len, "\r\n", 2);
        len += 2;
    }
    len += (size_t)snprintf((char *)b.d + len, cap - len, "--" B "--\r\n");
    b.n = len;
    return b;
}

static const char *CT = "multipart/form-data; boundary=" B;

static int parse_form(const part *p, int n, ditd_genreq *r, ditd_api_error *e)
{
    buf f = form(p, n);
    memset(e, 0, sizeof *e);
    int rc = ditd_genreq_parse_edit(CT, (const char *)f.d, f.n, &gm, NULL, r, e);
    free(f.d);
    return rc;
}

/* Refused naming param with every word in the message, and no upload's
 * pixels allocated on the way. */
static int n_refused;
static void refused(const part *p, int n, const char *param, const char *w1, const char *w2,
                    const char *what)
{
    ditd_genreq r;
    ditd_api_error e;
    uint64_t a0 = ditd_image_pixel_bytes_allocated();
    int rc = parse_form(p, n, &r, &e);
    TU_CHECK(rc != 0 && e.status == 400 && !strcmp(e.param, param) && strstr(e.message, w1) &&
                 (!w2 || strstr(e.message, w2)),
             "%s: refused naming %s (%s): rc %d, %d %s: %s", what, param, w1, rc, e.status, e.param,
             e.message);
    TU_CHECK(ditd_image_pixel_bytes_allocated() == a0,
             "%s: %llu pixel bytes allocated before the refusal", what,
             (unsigned long long)(ditd_image_pixel_bytes_allocated() - a0));
    if (rc == 0)
        ditd_genreq_free(&r);
    n_refused++;
}

int main(void)
{
    model_init();
    buf a = png_of(S, S, 3, color, 1), b = png_of(S, S, 3, color, 2);
    buf m = png_of(S, S, 4, oamask, 0), small = png_of(8, 8, 4, oamask, 0);
    buf al0 = png_of(S, S, 4, alpha, 2), al1 = png_of(S, S, 4, alpha, 9);
    const size_t np = (size_t)S * S;
    ditd_genreq r;
    ditd_api_error e;

    /* two images, one mask, n 4: output i edits image i % 2, the one mask */
    part two_mask[] = {{"image[]", &a, NULL}, {"image[]", &b, NULL}, {"mask", &m, NULL},
                       {"prompt", NULL, "a fox"}, {"n", NULL, "4"}};
    TU_OK(parse_form(two_mask, 5, &r, &e));
    if (r.image) {
        TU_CHECK(r.n == 4 && r.n_images == 2 && r.n_masks == 1 && r.mask && r.edit,
                 "two images and a mask: n %d, %d images, %d masks", r.n, r.n_images, r.n_masks);
        for (int i = 0; i < 4; i++) {
            const uint8_t *im, *mk;
            int j;
            ditd_genreq_edit_input(&r, i, &im, &mk, &j);
            int want = i % 2;
            int ok = j == want && mk == r.mask;
            for (size_t p = 0; ok && p < np * 3; p++)
                ok = im[p] ==
                     (uint8_t)color((int)(p / 3 % S), (int)(p / 3 / S), (int)(p % 3), want + 1);
            TU_CHECK(ok, "output %d: image %d (want %d) and the one mask", i, j, want);
        }
        /* Diffusers' sense: white where OpenAI's is transparent */
        TU_CHECK(r.mask[4] == 255 && r.mask[3] == 0 && r.mask[12] == 0, "the mask converted");
        ditd_genreq_free(&r);
    }
    /* n absent: one output per image; without a mask each image's own alpha */
    part two_alpha[] = {{"image[]", &al0, NULL}, {"image[]", &al1, NULL}, {"prompt", NULL, "x"}};
    TU_OK(parse_form(two_alpha, 3, &r, &e));
    if (r.image) {
        TU_CHECK(r.n == 2 && r.n_images == 2 && r.n_masks == 2,
                 "two images with alpha: n %d, %d masks", r.n, r.n_masks);
        const uint8_t *im, *mk0, *mk1;
        int j;
        ditd_genreq_edit_input(&r, 0, &im, &mk0, &j);
        ditd_genreq_edit_input(&r, 1, &im, &mk1, &j);
        TU_CHECK(mk0 && mk1 && mk0[2 * S] == 255 && mk0[9 * S] == 0 && mk1[9 * S] == 255 &&
                     mk1[2 * S] == 0,
                 "each image's transparency is its own mask");
        ditd_genreq_free(&r);
    }
    /* JSON: an array of two, n 2 */
    {
        char *body = malloc(1 << 16);
        char *b64a = NULL, *b64b = NULL;
        /* plain base64 by hand (the route's decoder is gnutls') */
        static const char T[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        const buf *src[2] = {&a, &b};
        char **dst[2] = {&b64a, &b64b};
        for (int k = 0; k < 2; k++) {
            const buf *s = src[k];
            char *o = malloc(s->n / 3 * 4 + 8), *q = o;
            for (size_t i = 0; i < s->n; i += 3) {
                uint32_t v = (uint32_t)s->d[i] << 16 |
                             (i + 1 < s->n ? (uint32_t)s->d[i + 1] << 8 : 0) |
                             (i + 2 < s->n ? s->d[i + 2] : 0);
                *q++ = T[v >> 18 & 63];
                *q++ = T[v >> 12 & 63];
                *q++ = i + 1 < s->n ? T[v >> 6 & 63] : '=';
                *q++ = i + 2 < s->n ? T[v & 63] : '=';
            }
            *q = 0;
            *dst[k] = o;
        }
        snprintf(body, 1 << 16, "{\"prompt\": \"x\", \"n\": 2, \"image\": [\"%s\", "
                 "\"data:image/png;base64,%s\"]}", b64a, b64b);
        memset(&e, 0, sizeof e);
        TU_OK(ditd_genreq_parse_edit(NULL, body, strlen(body), &gm, NULL, &r, &e));
        if (r.image) {
            TU_CHECK(r.n == 2 && r.n_images == 2 && !r.mask &&
                         r.image[np * 3] == (uint8_t)color(0, 0, 0, 2) &&
                         r.image[0] == (uint8_t)color(0, 0, 0, 1),
                     "JSON array: two images in order");
            ditd_genreq_free(&r);
        }
        /* and n 3 refused naming n */
        snprintf(body, 1 << 16, "{\"prompt\": \"x\", \"n\": 3, \"image\": [\"%s\", \"%s\"]}", b64a,
                 b64b);
        memset(&e, 0, sizeof e);
        uint64_t a0 = ditd_image_pixel_bytes_allocated();
        TU_CHECK(ditd_genreq_parse_edit(NULL, body, strlen(body), &gm, NULL, &r, &e) != 0 &&
                     !strcmp(e.param, "n") && strstr(e.message, "n = 3") &&
                     ditd_image_pixel_bytes_allocated() == a0,
                 "JSON n 3 of 2 images: %s %s", e.param, e.message);
        free(b64a), free(b64b), free(body);
    }

    /* hostile: each refused from the headers, before any upload's pixels */
    buf bomb = png_of(1, 1, 3, color, 0);
    /* IHDR height 100000 with its CRC: a 1x100000 PNG header */
    bomb.d[20] = 0, bomb.d[21] = 0x01, bomb.d[22] = 0x86, bomb.d[23] = 0xA0;
    uint32_t crc = (uint32_t)crc32(0, bomb.d + 12, 17);
    for (int k = 0; k < 4; k++)
        bomb.d[29 + k] = (uint8_t)(crc >> (24 - 8 * k));
    part p_bomb[] = {{"image[]", &a, NULL}, {"image[]", &bomb, NULL}, {"prompt", NULL, "x"}};
    refused(p_bomb, 3, "image[]", "image[1]", "100000", "a 1x100000 PNG as the second image");
    part p_sizes[] = {{"image[]", &a, NULL}, {"image[]", &small, NULL}, {"prompt", NULL, "x"}};
    refused(p_sizes, 3, "image[]", "same size", "8x8", "images of two sizes");
    part p_msize[] = {{"image[]", &a, NULL}, {"image[]", &b, NULL}, {"mask", &small, NULL},
                      {"prompt", NULL, "x"}};
    refused(p_msize, 4, "mask", "8x8", "same size", "a mask of another size");
    part p_n[] = {{"image[]", &a, NULL}, {"image[]", &b, NULL}, {"n", NULL, "3"},
                  {"prompt", NULL, "x"}};
    refused(p_n, 4, "n", "n = 3", "2 input images", "n 3 of two images");
    part p_mixed[] = {{"image", &a, NULL}, {"image[]", &b, NULL}, {"prompt", NULL, "x"}};
    refused(p_mixed, 3, "image[]", "not both", NULL, "image and image[] mixed");
    part p_17[18];
    for (int i = 0; i < 17; i++)
        p_17[i] = (part){"image[]", &a, NULL};
    p_17[17] = (part){"prompt", NULL, "x"};
    refused(p_17, 18, "image[]", "17 input images", "16", "17 images");
    /* transparency on one image of two (decoded, then refused) */
    part p_alpha1[] = {{"image[]", &a, NULL}, {"image[]", &al0, NULL}, {"prompt", NULL, "x"}};
    memset(&e, 0, sizeof e);
    TU_CHECK(parse_form(p_alpha1, 3, &r, &e) != 0 && !strcmp(e.param, "image[]") &&
                 strstr(e.message, "image[1]") && strstr(e.message, "transparent"),
             "transparency on one image of two: %s %s", e.param, e.message);
    /* files of one name are a list; a text field twice is still refused */
    part p_twice[] = {{"image[]", &a, NULL}, {"prompt", NULL, "x"}, {"prompt", NULL, "y"}};
    refused(p_twice, 3, "prompt", "given twice", NULL, "a text field twice");
    TU_CHECK(n_refused == 7, "%d hostile refusals checked, want 7", n_refused);
    free(a.d), free(b.d), free(m.d), free(small.d), free(al0.d), free(al1.d), free(bomb.d);
    printf("%d checks, %d failures (%d refusals before any pixels)\n", tu_checks, tu_failures,
           n_refused);
    return tu_exit();
}
