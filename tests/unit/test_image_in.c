/* Uploaded-image decoding (server/common/image_in.c): PNG in every color
 * type and bit depth, interlaced, with tRNS; JPEG RGB and gray, EXIF
 * orientations 1..8 (both byte orders) against transforms composed here from
 * flips and a transpose; WebP lossless and lossy; and the hostile inputs
 * (header bombs, truncation, unknown formats) each refused with its message
 * and no pixel memory allocated. The images are encoded here with libpng,
 * libjpeg and libwebp, so the expected pixels are known exactly. */
#include <stddef.h>
#include <stdio.h> /* before jpeglib.h */

#include <jpeglib.h>
#include <png.h>
#include <webp/encode.h>

#include "server/common/image.h"
#include "server/common/image_in.h"
#include "tests/test_util.h"

/* ---- encoders ---------------------------------------------------------- */

typedef struct buf {
    uint8_t *d;
    size_t n, cap;
} buf;

static void buf_put(buf *b, const void *p, size_t n)
{
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->d = realloc(b->d, b->cap);
        if (!b->d)
            abort();
    }
    memcpy(b->d + b->n, p, n);
    b->n += n;
}

static void png_w(png_structp png, png_bytep d, png_size_t n)
{
    buf_put(png_get_io_ptr(png), d, n);
}

static void png_f(png_structp png)
{
    (void)png;
}

/* samples: rows of packed samples as libpng takes them (bit depth < 8 packed
 * by png_set_packing from one sample a byte; 16-bit as big-endian pairs). */
static buf png_make(int w, int h, int ct, int depth, int interlace, const uint8_t *samples,
                    size_t stride, const png_color *pal, int npal, const png_byte *trns, int ntrns,
                    const png_color_16 *trans_color)
{
    buf b = {0};
    png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, NULL, NULL, NULL);
    png_infop info = png_create_info_struct(png);
    if (setjmp(png_jmpbuf(png)))
        abort();
    png_set_write_fn(png, &b, png_w, png_f);
    png_set_IHDR(png, info, w, h, depth, ct, interlace ? PNG_INTERLACE_ADAM7 : PNG_INTERLACE_NONE,
                 PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
    if (pal)
        png_set_PLTE(png, info, pal, npal);
    if (trns || trans_color)
        png_set_tRNS(png, info, trns, ntrns, trans_color);
    png_write_info(png, info);
    if (depth < 8)
        png_set_packing(png);
    png_bytep *rows = malloc(sizeof *rows * h);
    for (int y = 0; y < h; y++)
        rows[y] = (png_bytep)samples + stride * y;
    png_write_image(png, rows);
    png_write_end(png, NULL);
    png_destroy_write_struct(&png, &info);
    free(rows);
    return b;
}

/* app1: an Exif payload written as APP1 (NULL: none); cmyk: 4 components */
static buf jpeg_make(int w, int h, int comps, J_COLOR_SPACE cs, const uint8_t *px, int quality,
                     const uint8_t *app1, size_t app1_len)
{
    struct jpeg_compress_struct c;
    struct jpeg_error_mgr e;
    unsigned char *mem = NULL;
    unsigned long memlen = 0;
    c.err = jpeg_std_error(&e);
    jpeg_create_compress(&c);
    jpeg_mem_dest(&c, &mem, &memlen);
    c.image_width = w;
    c.image_height = h;
    c.input_components = comps;
    c.in_color_space = cs;
    jpeg_set_defaults(&c);
    jpeg_set_quality(&c, quality, TRUE);
    jpeg_start_compress(&c, TRUE);
    if (app1)
        jpeg_write_marker(&c, JPEG_APP0 + 1, app1, (unsigned)app1_len);
    while (c.next_scanline < c.image_height) {
        JSAMPROW row = (JSAMPROW)px + (size_t)c.next_scanline * w * comps;
        jpeg_write_scanlines(&c, &row, 1);
    }
    jpeg_finish_compress(&c);
    jpeg_destroy_compress(&c);
    buf b = {0};
    buf_put(&b, mem, memlen);
    free(mem);
    return b;
}

/* progressive: 0 sequential, 1 libjpeg's simple progression (10 scans),
 * 2 a scan bomb: each coefficient of each component in its own scan with 10
 * refinements (2112 scans) */
static buf jpeg_make_prog(int w, int h, const uint8_t *px, int progressive)
{
    static jpeg_scan_info scans[3 * 64 * 11];
    struct jpeg_compress_struct c;
    struct jpeg_error_mgr e;
    unsigned char *mem = NULL;
    unsigned long memlen = 0;
    c.err = jpeg_std_error(&e);
    jpeg_create_compress(&c);
    jpeg_mem_dest(&c, &mem, &memlen);
    c.image_width = w;
    c.image_height = h;
    c.input_components = 3;
    c.in_color_space = JCS_RGB;
    jpeg_set_defaults(&c);
    jpeg_set_quality(&c, 95, TRUE);
    if (progressive == 1)
        jpeg_simple_progression(&c);
    if (progressive == 2) {
        int n = 0;
        for (int comp = 0; comp < 3; comp++) {
            for (int k = 0; k < 64; k++) {
                for (int r = 0; r <= 10; r++) {
                    jpeg_scan_info *si = &scans[n++];
                    si->comps_in_scan = 1;
                    si->component_index[0] = comp;
                    si->Ss = k;
                    si->Se = k;
                    si->Ah = r ? 11 - r : 0;
                    si->Al = r ? 10 - r : 10;
                }
            }
        }
        /* DC scans of all components come before any AC scan of theirs: ours do */
        c.scan_info = scans;
        c.num_scans = n;
    }
    jpeg_start_compress(&c, TRUE);
    while (c.next_scanline < c.image_height) {
        JSAMPROW row = (JSAMPROW)px + (size_t)c.next_scanline * w * 3;
        jpeg_write_scanlines(&c, &row, 1);
    }
    jpeg_finish_compress(&c);
    jpeg_destroy_compress(&c);
    buf b = {0};
    buf_put(&b, mem, memlen);
    free(mem);
    return b;
}

/* An Exif APP1 payload holding only IFD0 with Orientation = o. */
static size_t exif_make(uint8_t *p, int o, int le)
{
    size_t n = 0;
#define B(x) (p[n++] = (uint8_t)(x))
#define W16(v) (le ? (B((v) & 255), B((v) >> 8)) : (B((v) >> 8), B((v) & 255)))
#define W32(v) (le ? (W16((v) & 0xFFFF), W16((v) >> 16)) : (W16((v) >> 16), W16((v) & 0xFFFF)))
    memcpy(p, "Exif\0\0", 6);
    n = 6;
    if (le) {
        B('I'); B('I');
    } else {
        B('M'); B('M');
    }
    W16(42);
    W32(8);
    W16(2); /* two entries: an unrelated one, then Orientation */
    W16(0x010F); W16(2); W32(4); W32(0x00414243); /* Make, ASCII, inline */
    W16(0x0112); W16(3); W32(1); W16(o); W16(0);
    W32(0); /* no next IFD */
#undef W32
#undef W16
#undef B
    return n;
}

static uint32_t crc32_png(const uint8_t *p, size_t n)
{
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++)
            c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
    }
    return c ^ 0xFFFFFFFFu;
}

static void be32(uint8_t *p, uint32_t v)
{
    p[0] = v >> 24;
    p[1] = v >> 16;
    p[2] = v >> 8;
    p[3] = v;
}

/* ---- PNG --------------------------------------------------------------- */

static void expect_pixels(const char *what, const ditd_image *im, int w, int h, int ch,
                          const uint8_t *want, int tol)
{
    TU_CHECK(im->width == w && im->height == h && im->channels == ch, "%s: %dx%dx%d, want %dx%dx%d",
             what, im->width, im->height, im->channels, w, h, ch);
    if (im->width != w || im->height != h || im->channels != ch || !im->pixels)
        return;
    int worst = 0;
    size_t wi = 0;
    for (size_t i = 0; i < (size_t)w * h * ch; i++) {
        int d = abs((int)im->pixels[i] - (int)want[i]);
        if (d > worst) {
            worst = d;
            wi = i;
        }
    }
    TU_CHECK(worst <= tol, "%s: byte %zu is %d, want %d (tolerance %d)", what, wi, im->pixels[wi],
             want[wi], tol);
}

static int n_png_cases;

static void png_case(const char *what, int w, int h, int ct, int depth, int interlace,
                     const uint8_t *samples, size_t stride, const png_color *pal, int npal,
                     const png_byte *trns, int ntrns, const png_color_16 *tc, int want_ch,
                     const uint8_t *want)
{
    buf b = png_make(w, h, ct, depth, interlace, samples, stride, pal, npal, trns, ntrns, tc);
    ditd_image im;
    TU_OK(ditd_image_decode(b.d, b.n, NULL, &im));
    TU_CHECK(im.format == DITD_IMAGE_PNG && im.orientation == 1, "%s: format %d", what, im.format);
    expect_pixels(what, &im, w, h, want_ch, want, 0);
    ditd_image_free(&im);
    free(b.d);
    n_png_cases++;
}

static void test_png(void)
{
    enum { W = 13, H = 7 };
    static uint8_t s[W * H * 8], want[W * H * 4];
    /* gray at 1, 2, 4, 8 bits, plain and interlaced */
    for (int depth = 1; depth <= 8; depth *= 2) {
        for (int il = 0; il < 2; il++) {
            int maxv = (1 << depth) - 1;
            for (int i = 0; i < W * H; i++) {
                int v = (int)(tu_rng() % (maxv + 1));
                s[i] = (uint8_t)v;
                int v8 = v * 255 / maxv;
                want[3 * i] = want[3 * i + 1] = want[3 * i + 2] = (uint8_t)v8;
            }
            char what[64];
            snprintf(what, sizeof what, "gray%d%s", depth, il ? " interlaced" : "");
            png_case(what, W, H, PNG_COLOR_TYPE_GRAY, depth, il, s, W, NULL, 0, NULL, 0, NULL, 3, want);
        }
    }
    /* gray 8 with a transparent gray value (tRNS) */
    png_color_16 tc = {.gray = 77};
    for (int i = 0; i < W * H; i++) {
        s[i] = (uint8_t)(i % 3 == 0 ? 77 : tu_rng() % 70);
        want[4 * i] = want[4 * i + 1] = want[4 * i + 2] = s[i];
        want[4 * i + 3] = s[i] == 77 ? 0 : 255;
    }
    png_case("gray8 tRNS", W, H, PNG_COLOR_TYPE_GRAY, 8, 0, s, W, NULL, 0, NULL, 0, &tc, 4, want);
    /* gray 16: reduced to the high byte */
    for (int i = 0; i < W * H; i++) {
        s[2 * i] = (uint8_t)tu_rng();
        s[2 * i + 1] = (uint8_t)tu_rng();
        want[3 * i] = want[3 * i + 1] = want[3 * i + 2] = s[2 * i];
    }
    png_case("gray16", W, H, PNG_COLOR_TYPE_GRAY, 16, 0, s, 2 * W, NULL, 0, NULL, 0, NULL, 3, want);
    /* gray+alpha 8 and 16 */
    for (int depth = 8; depth <= 16; depth += 8) {
        int bps = depth / 8;
        for (int i = 0; i < W * H; i++) {
            for (int k = 0; k < 2 * bps; k++)
                s[2 * bps * i + k] = (uint8_t)tu_rng();
            want[4 * i] = want[4 * i + 1] = want[4 * i + 2] = s[2 * bps * i];
            want[4 * i + 3] = s[2 * bps * i + bps];
        }
        png_case(depth == 8 ? "gray+alpha8" : "gray+alpha16", W, H, PNG_COLOR_TYPE_GRAY_ALPHA, depth, 0,
                 s, 2 * bps * W, NULL, 0, NULL, 0, NULL, 4, want);
    }
    /* RGB and RGBA at 8 and 16 bits, plain and interlaced */
    for (int alpha = 0; alpha < 2; alpha++) {
        for (int depth = 8; depth <= 16; depth += 8) {
            for (int il = 0; il < 2; il++) {
                int ch = alpha ? 4 : 3, bps = depth / 8;
                for (int i = 0; i < W * H; i++) {
                    for (int c = 0; c < ch; c++) {
                        for (int k = 0; k < bps; k++)
                            s[(i * ch + c) * bps + k] = (uint8_t)tu_rng();
                        want[i * ch + c] = s[(i * ch + c) * bps];
                    }
                }
                char what[64];
                snprintf(what, sizeof what, "%s%d%s", alpha ? "rgba" : "rgb", depth,
                         il ? " interlaced" : "");
                png_case(what, W, H, alpha ? PNG_COLOR_TYPE_RGB_ALPHA : PNG_COLOR_TYPE_RGB, depth, il,
                         s, (size_t)W * ch * bps, NULL, 0, NULL, 0, NULL, ch, want);
            }
        }
    }
    /* palette at 1, 2, 4, 8 bits, without and with tRNS */
    png_color pal[256];
    png_byte trns[256];
    for (int i = 0; i < 256; i++) {
        pal[i].red = (png_byte)tu_rng();
        pal[i].green = (png_byte)tu_rng();
        pal[i].blue = (png_byte)tu_rng();
        trns[i] = (png_byte)tu_rng();
    }
    for (int depth = 1; depth <= 8; depth *= 2) {
        for (int t = 0; t < 2; t++) {
            int npal = 1 << depth, ntrns = npal / 2 + 1 > npal ? npal : npal / 2 + 1;
            int ch = t ? 4 : 3;
            for (int i = 0; i < W * H; i++) {
                int v = (int)(tu_rng() % npal);
                s[i] = (uint8_t)v;
                want[ch * i] = pal[v].red;
                want[ch * i + 1] = pal[v].green;
                want[ch * i + 2] = pal[v].blue;
                if (t)
                    want[ch * i + 3] = v < ntrns ? trns[v] : 255; /* entries past tRNS: opaque */
            }
            char what[64];
            snprintf(what, sizeof what, "palette%d%s", depth, t ? " tRNS" : "");
            png_case(what, W, H, PNG_COLOR_TYPE_PALETTE, depth, 0, s, W, pal, npal, t ? trns : NULL,
                     t ? ntrns : 0, NULL, ch, want);
        }
    }
    TU_CHECK(n_png_cases == 28, "%d PNG cases, want 28", n_png_cases);
}

/* ---- JPEG -------------------------------------------------------------- */

static void flip_h(uint8_t *p, int w, int h, int ch)
{
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w / 2; x++)
            for (int c = 0; c < ch; c++) {
                uint8_t *a = p + ((size_t)y * w + x) * ch + c, *b = p + ((size_t)y * w + w - 1 - x) * ch + c;
                uint8_t t = *a;
                *a = *b;
                *b = t;
            }
}

static void flip_v(uint8_t *p, int w, int h, int ch)
{
    for (int y = 0; y < h / 2; y++)
        for (size_t i = 0; i < (size_t)w * ch; i++) {
            uint8_t *a = p + (size_t)y * w * ch + i, *b = p + (size_t)(h - 1 - y) * w * ch + i;
            uint8_t t = *a;
            *a = *b;
            *b = t;
        }
}

/* src w x h -> dst h x w */
static void transpose(const uint8_t *src, uint8_t *dst, int w, int h, int ch)
{
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++)
            memcpy(dst + ((size_t)x * h + y) * ch, src + ((size_t)y * w + x) * ch, (size_t)ch);
}

/* EXIF orientation o as composed flips: 2 H, 3 H+V, 4 V, 5 T, 6 T+H, 7 T+H+V, 8 T+V */
static uint8_t *oriented_ref(const uint8_t *src, int w, int h, int ch, int o, int *ow, int *oh)
{
    uint8_t *d = malloc((size_t)w * h * ch);
    if (o >= 5) {
        transpose(src, d, w, h, ch);
        *ow = h;
        *oh = w;
    } else {
        memcpy(d, src, (size_t)w * h * ch);
        *ow = w;
        *oh = h;
    }
    if (o == 2 || o == 3 || o == 6 || o == 7)
        flip_h(d, *ow, *oh, ch);
    if (o == 3 || o == 4 || o == 7 || o == 8)
        flip_v(d, *ow, *oh, ch);
    return d;
}

static void test_jpeg(void)
{
    enum { W = 24, H = 16 };
    static uint8_t px[W * H * 3], gray[W * H], want[W * H * 3];
    /* smooth content, so quality 100 reproduces it within a few levels */
    for (int y = 0; y < H; y++)
        for (int x = 0; x < W; x++) {
            px[(y * W + x) * 3] = (uint8_t)(x * 10);
            px[(y * W + x) * 3 + 1] = (uint8_t)(y * 15);
            px[(y * W + x) * 3 + 2] = (uint8_t)(128 + x * 2 - y * 3);
            gray[y * W + x] = (uint8_t)(x * 5 + y * 7);
        }
    buf b = jpeg_make(W, H, 3, JCS_RGB, px, 100, NULL, 0);
    ditd_image ref;
    TU_OK(ditd_image_decode(b.d, b.n, NULL, &ref));
    TU_CHECK(ref.format == DITD_IMAGE_JPEG && ref.orientation == 1, "jpeg: format %d orientation %d",
             ref.format, ref.orientation);
    expect_pixels("jpeg rgb q100", &ref, W, H, 3, px, 12);
    free(b.d);

    b = jpeg_make(W, H, 1, JCS_GRAYSCALE, gray, 100, NULL, 0);
    ditd_image g;
    TU_OK(ditd_image_decode(b.d, b.n, NULL, &g));
    for (int i = 0; i < W * H; i++)
        want[3 * i] = want[3 * i + 1] = want[3 * i + 2] = gray[i];
    expect_pixels("jpeg gray q100", &g, W, H, 3, want, 3);
    ditd_image_free(&g);
    free(b.d);

    /* EXIF orientation: the same scan with an APP1 of each orientation and
     * byte order decodes to the orientation-1 pixels transformed here */
    int n_orient = 0;
    for (int le = 0; le < 2; le++) {
        for (int o = 1; o <= 8; o++) {
            uint8_t app1[64];
            size_t n = exif_make(app1, o, le);
            TU_CHECK(ditd_image_exif_orientation(app1, n) == o, "exif parser: %d (le %d)",
                     ditd_image_exif_orientation(app1, n), le);
            b = jpeg_make(W, H, 3, JCS_RGB, px, 100, app1, n);
            ditd_image im;
            /* the header alone says the upright size and allocates nothing */
            uint64_t a0 = ditd_image_pixel_bytes_allocated();
            TU_OK(ditd_image_probe(b.d, b.n, NULL, &im));
            TU_CHECK(im.pixels == NULL && ditd_image_pixel_bytes_allocated() == a0,
                     "probe allocated pixels");
            TU_CHECK(im.orientation == o && im.width == (o >= 5 ? H : W) &&
                         im.height == (o >= 5 ? W : H),
                     "probe of orientation %d: %dx%d, orientation %d", o, im.width, im.height,
                     im.orientation);
            TU_OK(ditd_image_decode(b.d, b.n, NULL, &im));
            int ow, oh;
            uint8_t *r = oriented_ref(ref.pixels, W, H, 3, o, &ow, &oh);
            char what[48];
            snprintf(what, sizeof what, "orientation %d (%s)", o, le ? "II" : "MM");
            TU_CHECK(im.orientation == o, "%s: reported %d", what, im.orientation);
            expect_pixels(what, &im, ow, oh, 3, r, 0);
            free(r);
            ditd_image_free(&im);
            free(b.d);
            n_orient++;
        }
    }
    TU_CHECK(n_orient == 16, "%d orientation cases", n_orient);
    ditd_image_free(&ref);

    /* malformed Exif payloads: orientation 1, no read past the end */
    uint8_t app1[64];
    size_t n = exif_make(app1, 6, 1);
    for (size_t cut = 0; cut < n; cut++) {
        uint8_t *c = malloc(cut ? cut : 1);
        memcpy(c, app1, cut);
        int o = ditd_image_exif_orientation(c, cut);
        TU_CHECK(o == 1 || cut >= n - 4, "exif cut at %zu: %d", cut, o);
        free(c);
    }
    uint8_t bad[64];
    memcpy(bad, app1, n);
    bad[10] = 0xFF; /* IFD offset past the end (II: low byte of offset at 10) */
    TU_CHECK(ditd_image_exif_orientation(bad, n) == 1, "exif bad IFD offset");
    memcpy(bad, app1, n);
    bad[14] = 0xFF; /* entry count 255: more entries than bytes */
    TU_CHECK(ditd_image_exif_orientation(bad, n) == 1, "exif huge count");
    memcpy(bad, app1, n);
    bad[6 + 8 + 2 + 12 + 8] = 9; /* orientation 9: out of range */
    TU_CHECK(ditd_image_exif_orientation(bad, n) == 1, "exif orientation 9");

    /* progressive: decodes as the sequential file does; a scan bomb does not */
    buf seq = jpeg_make_prog(W, H, px, 0), prog = jpeg_make_prog(W, H, px, 1);
    ditd_image is, ip;
    TU_OK(ditd_image_decode(seq.d, seq.n, NULL, &is));
    TU_OK(ditd_image_decode(prog.d, prog.n, NULL, &ip));
    if (is.pixels)
        expect_pixels("jpeg progressive", &ip, W, H, 3, is.pixels, 2);
    ditd_image_free(&is);
    ditd_image_free(&ip);
    free(seq.d);
    free(prog.d);
    buf bomb = jpeg_make_prog(8, 8, px, 2);
    {
        ditd_image im2;
        TU_CHECK_ERR(ditd_image_decode(bomb.d, bomb.n, NULL, &im2), DITD_EFORMAT, "jpeg: more than 256 scans");
        TU_CHECK(im2.pixels == NULL, "scan bomb left pixels");
    }
    free(bomb.d);

    /* CMYK: refused */
    static uint8_t cmyk[8 * 8 * 4];
    b = jpeg_make(8, 8, 4, JCS_CMYK, cmyk, 90, NULL, 0);
    ditd_image im;
    TU_CHECK_ERR(ditd_image_decode(b.d, b.n, NULL, &im), DITD_EUNSUPPORTED, "CMYK");
    free(b.d);
}

/* ---- WebP -------------------------------------------------------------- */

static void test_webp(void)
{
    enum { W = 17, H = 9 };
    static uint8_t rgb[W * H * 3], rgba[W * H * 4];
    for (int i = 0; i < W * H; i++) {
        for (int c = 0; c < 3; c++)
            rgb[3 * i + c] = rgba[4 * i + c] = (uint8_t)tu_rng();
        rgba[4 * i + 3] = (uint8_t)(1 + tu_rng() % 255); /* no alpha 0: lossless may rewrite its RGB */
    }
    uint8_t *out = NULL;
    size_t n = WebPEncodeLosslessRGB(rgb, W, H, W * 3, &out);
    TU_CHECK(n > 0, "WebPEncodeLosslessRGB");
    ditd_image im;
    TU_OK(ditd_image_decode(out, n, NULL, &im));
    TU_CHECK(im.format == DITD_IMAGE_WEBP, "webp format %d", im.format);
    expect_pixels("webp lossless rgb", &im, W, H, 3, rgb, 0);
    ditd_image_free(&im);
    WebPFree(out);

    n = WebPEncodeLosslessRGBA(rgba, W, H, W * 4, &out);
    TU_OK(ditd_image_decode(out, n, NULL, &im));
    expect_pixels("webp lossless rgba", &im, W, H, 4, rgba, 0);
    ditd_image_free(&im);
    WebPFree(out);

    /* lossy: a flat color survives within a few levels */
    for (int i = 0; i < W * H; i++) {
        rgb[3 * i] = 200;
        rgb[3 * i + 1] = 100;
        rgb[3 * i + 2] = 50;
    }
    n = WebPEncodeRGB(rgb, W, H, W * 3, 95, &out);
    TU_OK(ditd_image_decode(out, n, NULL, &im));
    expect_pixels("webp lossy rgb", &im, W, H, 3, rgb, 8);
    ditd_image_free(&im);
    WebPFree(out);
}

/* ---- hostile ----------------------------------------------------------- */

#define REFUSED(data, len, lim, code, ...)                                            \
    do {                                                                              \
        ditd_image im_;                                                               \
        uint64_t a0_ = ditd_image_pixel_bytes_allocated();                            \
        TU_CHECK_ERR(ditd_image_decode((data), (len), (lim), &im_), code, __VA_ARGS__); \
        TU_CHECK(im_.pixels == NULL, "pixels left after a refusal");                  \
        TU_CHECK(ditd_image_pixel_bytes_allocated() == a0_, "%llu pixel bytes allocated by a refusal", \
                 (unsigned long long)(ditd_image_pixel_bytes_allocated() - a0_));     \
        n_refused++;                                                                  \
    } while (0)

static int n_refused;

static void test_hostile(void)
{
    static uint8_t px[8 * 8 * 3];
    ditd_image_limits lim;
    ditd_image_limits_default(&lim);

    /* JPEG: SOF0 patched to 30000x30000 */
    buf j = jpeg_make(8, 8, 3, JCS_RGB, px, 90, NULL, 0);
    size_t sof = 0;
    for (size_t i = 2; i + 9 < j.n; i++)
        if (j.d[i] == 0xFF && j.d[i + 1] == 0xC0) {
            sof = i;
            break;
        }
    TU_CHECK(sof > 0, "no SOF0 in the encoded JPEG");
    j.d[sof + 5] = 30000 >> 8;
    j.d[sof + 6] = 30000 & 255;
    j.d[sof + 7] = 30000 >> 8;
    j.d[sof + 8] = 30000 & 255;
    REFUSED(j.d, j.n, NULL, DITD_ERANGE, "jpeg: 30000x30000 exceeds the limit of 8192");
    ditd_image_limits big = lim;
    big.max_dim = 65535;
    REFUSED(j.d, j.n, &big, DITD_ERANGE, "900000000 pixels, over the limit of 16777216");
    /* the same header cut right after the frame header (no scan: a bomb's
     * header alone), and probed: the same refusal from the header */
    REFUSED(j.d, sof + 19, NULL, DITD_ERANGE, "jpeg: 30000x30000 exceeds the limit of 8192");
    {
        ditd_image im;
        uint64_t a0 = ditd_image_pixel_bytes_allocated();
        TU_CHECK_ERR(ditd_image_probe(j.d, sof + 19, NULL, &im), DITD_ERANGE,
                     "jpeg: 30000x30000 exceeds");
        TU_CHECK(ditd_image_pixel_bytes_allocated() == a0, "probe allocated pixels");
    }
    /* truncated JPEG */
    buf j2 = jpeg_make(8, 8, 3, JCS_RGB, px, 90, NULL, 0);
    {
        ditd_image im;
        TU_CHECK_ERR(ditd_image_decode(j2.d, j2.n / 2, NULL, &im), DITD_EFORMAT, "jpeg: ");
        TU_CHECK(im.pixels == NULL, "truncated jpeg left pixels");
    }
    REFUSED(j2.d, 10, NULL, DITD_EFORMAT, "jpeg: ");
    free(j.d);
    free(j2.d);

    /* PNG: IHDR patched to 1x100000 (CRC fixed, so libpng reads it) */
    uint8_t one[4] = {1, 2, 3, 4};
    buf p = png_make(1, 1, PNG_COLOR_TYPE_RGB, 8, 0, one, 3, NULL, 0, NULL, 0, NULL);
    /* signature 8, length 4, "IHDR" 4, width at 16, height at 20, CRC at 29 */
    be32(p.d + 20, 100000);
    be32(p.d + 29, crc32_png(p.d + 12, 17));
    REFUSED(p.d, p.n, NULL, DITD_ERANGE, "png: 1x100000 exceeds the limit of 8192");
    be32(p.d + 16, 8000);
    be32(p.d + 20, 8000);
    be32(p.d + 29, crc32_png(p.d + 12, 17));
    REFUSED(p.d, p.n, NULL, DITD_ERANGE, "png: 8000x8000 is 64000000 pixels");
    be32(p.d + 29, 0); /* a bad CRC on IHDR */
    REFUSED(p.d, p.n, NULL, DITD_EFORMAT, "png: ", "CRC");
    free(p.d);
    /* truncated PNG: in the header and in the data */
    static uint8_t rgbbig[64 * 64 * 3];
    for (size_t i = 0; i < sizeof rgbbig; i++)
        rgbbig[i] = (uint8_t)tu_rng();
    p = png_make(64, 64, PNG_COLOR_TYPE_RGB, 8, 0, rgbbig, 64 * 3, NULL, 0, NULL, 0, NULL);
    REFUSED(p.d, 20, NULL, DITD_EFORMAT, "png: truncated data");
    {
        ditd_image im;
        TU_CHECK_ERR(ditd_image_decode(p.d, p.n / 2, NULL, &im), DITD_EFORMAT, "png: truncated data");
        TU_CHECK(im.pixels == NULL, "truncated png left pixels");
    }
    /* over the byte limit */
    ditd_image_limits small = lim;
    small.max_bytes = 100;
    REFUSED(p.d, p.n, &small, DITD_ERANGE, "bytes, over the limit of 100");
    free(p.d);

    /* WebP: VP8L header patched to 16384x16384 */
    uint8_t *w = NULL;
    static uint8_t rgba[4 * 4 * 4];
    for (size_t i = 0; i < sizeof rgba; i++)
        rgba[i] = (uint8_t)(1 + i);
    size_t wn = WebPEncodeLosslessRGBA(rgba, 4, 4, 16, &w);
    TU_CHECK(wn > 25 && memcmp(w + 12, "VP8L", 4) == 0 && w[20] == 0x2f, "not a simple VP8L file");
    uint32_t bits = (uint32_t)w[21] | (uint32_t)w[22] << 8 | (uint32_t)w[23] << 16 | (uint32_t)w[24] << 24;
    bits = (bits & 0xF0000000u) | 16383u | 16383u << 14;
    w[21] = bits;
    w[22] = bits >> 8;
    w[23] = bits >> 16;
    w[24] = bits >> 24;
    REFUSED(w, wn, NULL, DITD_ERANGE, "webp: 16384x16384 exceeds");
    WebPFree(w);
    wn = WebPEncodeLosslessRGBA(rgba, 4, 4, 16, &w);
    REFUSED(w, 14, NULL, DITD_EFORMAT, "webp: ");
    /* truncated past its header: refused from the RIFF length, before the
     * pixels are allocated */
    REFUSED(w, wn - 4, NULL, DITD_EFORMAT, "webp: truncated data");
    REFUSED(w, wn / 2, NULL, DITD_EFORMAT, "webp: ");
    WebPFree(w);

    /* unknown formats */
    REFUSED((const uint8_t *)"GIF89a\x01\x00\x01\x00", 10, NULL, DITD_EUNSUPPORTED, "GIF");
    REFUSED((const uint8_t *)"hello, world", 12, NULL, DITD_EFORMAT, "unknown format", "68 65 6c 6c");
    REFUSED((const uint8_t *)"BM", 2, NULL, DITD_EUNSUPPORTED, "BMP is not accepted");
    REFUSED((const uint8_t *)"", 0, NULL, DITD_EFORMAT, "empty");
    TU_CHECK(n_refused == 17, "%d refusals checked, want 17", n_refused);
}

/* ---- PIL's reading of PIL-made files (tools/make_image_in_fixtures.py) */

static uint8_t *slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *d = malloc(len > 0 ? (size_t)len : 1);
    *n = d ? fread(d, 1, (size_t)len, f) : 0;
    fclose(f);
    return d;
}

static void test_fixtures(const char *dir)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/manifest.txt", dir);
    FILE *m = fopen(path, "r");
    TU_CHECK(m != NULL, "cannot open %s", path);
    if (!m)
        return;
    char name[128], file[160];
    int w, h, ch, tol, n_cases = 0;
    while (fscanf(m, "%127s %159s %d %d %d %d", name, file, &w, &h, &ch, &tol) == 6) {
        size_t n = 0, rn = 0;
        snprintf(path, sizeof path, "%s/%s", dir, file);
        uint8_t *data = slurp(path, &n);
        snprintf(path, sizeof path, "%s/%s.raw", dir, name);
        uint8_t *raw = slurp(path, &rn);
        TU_CHECK(data && raw && rn == (size_t)w * h * ch, "%s: files (%zu raw bytes)", name, rn);
        if (data && raw && rn == (size_t)w * h * ch) {
            ditd_image im;
            TU_OK(ditd_image_decode(data, n, NULL, &im));
            expect_pixels(name, &im, w, h, ch, raw, tol);
            ditd_image_free(&im);
            /* the probe says the upright size the decode gives */
            TU_OK(ditd_image_probe(data, n, NULL, &im));
            TU_CHECK(im.width == w && im.height == h, "%s: probe %dx%d, want %dx%d", name,
                     im.width, im.height, w, h);
            n_cases++;
        }
        free(data);
        free(raw);
    }
    fclose(m);
    TU_CHECK(n_cases >= 27, "%d fixture cases, want 27", n_cases);
    printf("%d PIL fixture cases\n", n_cases);
}

/* ditd_image_to_luma against PIL's convert("L") (values from Pillow 12: RGB and RGBA, alpha
 * ignored). */
static void test_luma(void)
{
    uint8_t rgb[] = {255, 0, 0, 0, 255, 0, 0, 0, 255, 128, 128, 128, 12, 200, 77};
    uint8_t rgba[] = {12, 200, 77, 0, 255, 255, 255, 7};
    const uint8_t want[] = {76, 150, 29, 128, 130}, want4[] = {130, 255};
    uint8_t out[5];
    ditd_image a = {.pixels = rgb, .width = 5, .height = 1, .channels = 3};
    ditd_image_to_luma(&a, out);
    TU_CHECK(memcmp(out, want, 5) == 0, "luma of RGB as PIL's convert(\"L\"): %d %d %d %d %d",
             out[0], out[1], out[2], out[3], out[4]);
    ditd_image b = {.pixels = rgba, .width = 1, .height = 2, .channels = 4};
    ditd_image_to_luma(&b, out);
    TU_CHECK(memcmp(out, want4, 2) == 0, "luma of RGBA ignores alpha: %d %d", out[0], out[1]);
}

int main(int argc, char **argv)
{
    tu_seed();
    if (argc > 1)
        test_fixtures(argv[1]);
    else
        TU_CHECK(0, "usage: test_image_in FIXTURE_DIR");
    test_png();
    test_jpeg();
    test_webp();
    test_hostile();
    test_luma();
    printf("%d checks, %d failures (%d PNG cases, %d refusals)\n", tu_checks, tu_failures, n_png_cases,
           n_refused);
    return tu_failures ? 1 : 0;
}
