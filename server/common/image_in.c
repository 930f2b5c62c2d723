/* Decoding of uploaded PNG / JPEG / WebP images with limits checked from
 * the header first. libpng and libjpeg report errors by longjmp; every
 * decoder here keeps what it must free in volatile locals and frees it on
 * the way out of its setjmp. */
#include "server/common/image_in.h"

#include <stdio.h> /* before jpeglib.h, which uses FILE */

#include <jpeglib.h>
#include <png.h>
#include <setjmp.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <webp/decode.h>

#include "engine/core/error.h"

static _Atomic uint64_t pixel_bytes_allocated;

uint64_t ditd_image_pixel_bytes_allocated(void)
{
    return atomic_load(&pixel_bytes_allocated);
}

static uint8_t *pixel_alloc(size_t n)
{
    uint8_t *p = malloc(n ? n : 1);
    if (p)
        atomic_fetch_add(&pixel_bytes_allocated, (uint64_t)n);
    return p;
}

void ditd_image_limits_default(ditd_image_limits *lim)
{
    lim->max_bytes = DITD_IMAGE_MAX_BYTES_DEFAULT;
    lim->max_dim = DITD_IMAGE_MAX_DIM_DEFAULT;
    lim->max_pixels = DITD_IMAGE_MAX_PIXELS_DEFAULT;
}

ditd_image_format ditd_image_sniff(const uint8_t *d, size_t len)
{
    if (len >= 8 && memcmp(d, "\x89PNG\r\n\x1a\n", 8) == 0)
        return DITD_IMAGE_PNG;
    if (len >= 3 && d[0] == 0xFF && d[1] == 0xD8 && d[2] == 0xFF)
        return DITD_IMAGE_JPEG;
    if (len >= 12 && memcmp(d, "RIFF", 4) == 0 && memcmp(d + 8, "WEBP", 4) == 0)
        return DITD_IMAGE_WEBP;
    return DITD_IMAGE_UNKNOWN;
}

const char *ditd_image_format_name(ditd_image_format f)
{
    switch (f) {
    case DITD_IMAGE_PNG: return "png";
    case DITD_IMAGE_JPEG: return "jpeg";
    case DITD_IMAGE_WEBP: return "webp";
    default: return "unknown";
    }
}

/* The header's size against the limits, before any pixel is touched. */
static int check_dims(const char *fmt, long long w, long long h, const ditd_image_limits *lim)
{
    if (w <= 0 || h <= 0)
        return ditd_err_set(DITD_EFORMAT, "%s: header gives %lldx%lld pixels", fmt, w, h);
    if (w > lim->max_dim || h > lim->max_dim)
        return ditd_err_set(DITD_ERANGE, "%s: %lldx%lld exceeds the limit of %d pixels a side", fmt,
                            w, h, lim->max_dim);
    if (w * h > lim->max_pixels)
        return ditd_err_set(DITD_ERANGE, "%s: %lldx%lld is %lld pixels, over the limit of %lld",
                            fmt, w, h, w * h, (long long)lim->max_pixels);
    return 0;
}

/* ---- EXIF orientation ------------------------------------------------- */

static unsigned rd16(const uint8_t *p, int le)
{
    return le ? (unsigned)p[0] | (unsigned)p[1] << 8 : (unsigned)p[0] << 8 | (unsigned)p[1];
}

static uint32_t rd32(const uint8_t *p, int le)
{
    return le ? (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24
              : (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

/* The Orientation of IFD0 of a TIFF block (offsets count from its start). */
static int tiff_orientation(const uint8_t *t, size_t tl)
{
    int le;
    if (tl < 8)
        return 1;
    if (t[0] == 'I' && t[1] == 'I')
        le = 1;
    else if (t[0] == 'M' && t[1] == 'M')
        le = 0;
    else
        return 1;
    if (rd16(t + 2, le) != 42)
        return 1;
    uint32_t ifd = rd32(t + 4, le);
    if (ifd > tl || tl - ifd < 2)
        return 1;
    unsigned n = rd16(t + ifd, le);
    if ((size_t)n * 12 > tl - ifd - 2)
        return 1;
    for (unsigned i = 0; i < n; i++) {
        const uint8_t *e = t + ifd + 2 + (size_t)i * 12;
        if (rd16(e, le) != 0x0112)
            continue;
        /* SHORT, count 1: the value sits in the first two bytes of the field */
        if (rd16(e + 2, le) != 3 || rd32(e + 4, le) != 1)
            return 1;
        unsigned o = rd16(e + 8, le);
        return o >= 1 && o <= 8 ? (int)o : 1;
    }
    return 1;
}

int ditd_image_exif_orientation(const uint8_t *app1, size_t len)
{
    if (!app1 || len < 6 + 8 || memcmp(app1, "Exif\0\0", 6) != 0)
        return 1;
    return tiff_orientation(app1 + 6, len - 6);
}

/* An EXIF payload as PNG's eXIf and WebP's EXIF chunks hold it: the TIFF
 * block itself, or (as some writers do) JPEG's "Exif\0\0" before it. */
static int exif_payload_orientation(const uint8_t *p, size_t len)
{
    if (len >= 6 && memcmp(p, "Exif\0\0", 6) == 0)
        return ditd_image_exif_orientation(p, len);
    return tiff_orientation(p, len);
}

/* PNG: the eXIf chunk, wherever it stands (PIL reads one after IDAT too),
 * by walking the chunks (each length checked against the file); 1 without. */
static int png_orientation(const uint8_t *d, size_t len)
{
    size_t o = 8;
    while (len >= 12 && o <= len - 12) {
        uint32_t n = rd32(d + o, 0);
        if (n > len - o - 12)
            return 1;
        if (memcmp(d + o + 4, "eXIf", 4) == 0)
            return exif_payload_orientation(d + o + 8, n);
        if (memcmp(d + o + 4, "IEND", 4) == 0)
            return 1;
        o += 12 + (size_t)n;
    }
    return 1;
}

/* WebP: the extended format's EXIF chunk (RIFF chunks, padded to even). */
static int webp_orientation(const uint8_t *d, size_t len)
{
    size_t o = 12;
    while (len >= 8 && o <= len - 8) {
        uint32_t n = rd32(d + o + 4, 1);
        if (n > len - o - 8)
            return 1;
        if (memcmp(d + o, "EXIF", 4) == 0)
            return exif_payload_orientation(d + o + 8, n);
        o += 8 + (size_t)n + (n & 1u);
    }
    return 1;
}

int ditd_image_orient(const uint8_t *src, int w, int h, int ch, int o, uint8_t **dst, int *dw,
                      int *dh)
{
    if (o < 1 || o > 8 || w <= 0 || h <= 0 || ch <= 0)
        return ditd_err_set(DITD_EINVAL, "orient: orientation %d on %dx%dx%d", o, w, h, ch);
    int swap = o >= 5;
    int ow = swap ? h : w, oh = swap ? w : h;
    uint8_t *d = pixel_alloc((size_t)w * h * ch);
    if (!d)
        return ditd_err_set(DITD_ENOMEM, "orient: %dx%d", w, h);
    for (int y = 0; y < oh; y++) {
        for (int x = 0; x < ow; x++) {
            int sx, sy;
            switch (o) {
            case 1: sx = x; sy = y; break;
            case 2: sx = w - 1 - x; sy = y; break;         /* mirror left-right */
            case 3: sx = w - 1 - x; sy = h - 1 - y; break; /* rotate 180 */
            case 4: sx = x; sy = h - 1 - y; break;         /* mirror top-bottom */
            case 5: sx = y; sy = x; break;                 /* transpose */
            case 6: sx = y; sy = h - 1 - x; break;         /* rotate 90 clockwise */
            case 7: sx = w - 1 - y; sy = h - 1 - x; break; /* transverse */
            default: sx = w - 1 - y; sy = x; break;        /* 8: rotate 90 counter-clockwise */
            }
            memcpy(d + ((size_t)y * ow + x) * ch, src + ((size_t)sy * w + sx) * ch, (size_t)ch);
        }
    }
    *dst = d;
    *dw = ow;
    *dh = oh;
    return 0;
}

/* The decoded pixels into out, turned upright by EXIF orientation o as
 * PIL's ImageOps.exif_transpose does (pix is taken: kept or freed). */
static int finish(uint8_t *pix, int w, int h, int ch, ditd_image_format fmt, int o,
                  ditd_image *out)
{
    if (o != 1) {
        uint8_t *t = NULL;
        int tw, th, rc = ditd_image_orient(pix, w, h, ch, o, &t, &tw, &th);
        free(pix);
        if (rc)
            return rc;
        pix = t;
        w = tw;
        h = th;
    }
    out->pixels = pix;
    out->width = w;
    out->height = h;
    out->channels = ch;
    out->format = fmt;
    out->orientation = o;
    return 0;
}

/* ---- PNG -------------------------------------------------------------- */

typedef struct png_src {
    const uint8_t *data;
    size_t len, pos;
    jmp_buf jb;
    char msg[160];
} png_src;

static void png_read_mem(png_structp png, png_bytep out, png_size_t n)
{
    png_src *s = png_get_io_ptr(png);
    if (n > s->len - s->pos)
        png_error(png, "truncated data");
    memcpy(out, s->data + s->pos, n);
    s->pos += n;
}

static void png_on_error(png_structp png, png_const_charp msg)
{
    png_src *s = png_get_error_ptr(png);
    snprintf(s->msg, sizeof s->msg, "%s", msg);
    longjmp(s->jb, 1);
}

static void png_on_warning(png_structp png, png_const_charp msg)
{
    (void)png;
    (void)msg;
}

static int decode_png(const uint8_t *data, size_t len, const ditd_image_limits *lim,
                      ditd_image *out, int probe)
{
    png_src s = {.data = data, .len = len};
    png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &s, png_on_error,
                                             png_on_warning);
    if (!png)
        return ditd_err_set(DITD_ENOMEM, "png: create");
    png_infop info = png_create_info_struct(png);
    uint8_t *volatile pix = NULL;
    png_bytep *volatile rows = NULL;
    volatile int err = 0;
    if (!info) {
        png_destroy_read_struct(&png, NULL, NULL);
        return ditd_err_set(DITD_ENOMEM, "png: create");
    }
    if (setjmp(s.jb)) {
        if (!err)
            err = ditd_err_set(DITD_EFORMAT, "png: %s", s.msg);
        goto fail;
    }
    png_set_read_fn(png, &s, png_read_mem);
    /* ancillary chunks (iCCP, zTXt) are decompressed by libpng: bound them */
    png_set_chunk_malloc_max(png, 8u << 20);
    png_read_info(png, info);
    png_uint_32 w = png_get_image_width(png, info), h = png_get_image_height(png, info);
    if ((err = check_dims("png", w, h, lim)))
        goto fail;
    const int orient = png_orientation(data, len);
    if (probe) {
        png_destroy_read_struct(&png, &info, NULL);
        out->width = (int)(orient >= 5 ? h : w);
        out->height = (int)(orient >= 5 ? w : h);
        out->format = DITD_IMAGE_PNG;
        out->orientation = orient;
        return 0;
    }
    int ct = png_get_color_type(png, info);
    int alpha = (ct & PNG_COLOR_MASK_ALPHA) || png_get_valid(png, info, PNG_INFO_tRNS);
    png_set_strip_16(png);
    png_set_packing(png);
    if (ct == PNG_COLOR_TYPE_PALETTE)
        png_set_palette_to_rgb(png);
    if (ct == PNG_COLOR_TYPE_GRAY && png_get_bit_depth(png, info) < 8)
        png_set_expand_gray_1_2_4_to_8(png);
    if (png_get_valid(png, info, PNG_INFO_tRNS))
        png_set_tRNS_to_alpha(png);
    if (!(ct & PNG_COLOR_MASK_COLOR))
        png_set_gray_to_rgb(png);
    png_set_interlace_handling(png);
    png_read_update_info(png, info);
    int ch = png_get_channels(png, info);
    if (ch != (alpha ? 4 : 3) || png_get_bit_depth(png, info) != 8) {
        err = ditd_err_set(DITD_EFORMAT, "png: color type %d did not expand to 8-bit RGB(A)", ct);
        goto fail;
    }
    size_t stride = (size_t)w * ch;
    if (png_get_rowbytes(png, info) != stride) {
        err = ditd_err_set(DITD_EFORMAT, "png: row of %zu bytes, want %zu",
                           (size_t)png_get_rowbytes(png, info), stride);
        goto fail;
    }
    pix = pixel_alloc(stride * h);
    rows = malloc(sizeof(png_bytep) * h);
    if (!pix || !rows) {
        err = ditd_err_set(DITD_ENOMEM, "png: %ux%u pixels", (unsigned)w, (unsigned)h);
        goto fail;
    }
    for (png_uint_32 y = 0; y < h; y++)
        rows[y] = pix + stride * y;
    png_read_image(png, rows);
    png_read_end(png, NULL);
    free(rows);
    rows = NULL;
    png_destroy_read_struct(&png, &info, NULL);
    return finish(pix, (int)w, (int)h, ch, DITD_IMAGE_PNG, orient, out);
fail:
    free(rows);
    free(pix);
    png_destroy_read_struct(&png, &info, NULL);
    return err;
}

/* ---- JPEG ------------------------------------------------------------- */

typedef struct jpeg_err {
    struct jpeg_error_mgr mgr;
    jmp_buf jb;
    char msg[JMSG_LENGTH_MAX];
} jpeg_err;

static void jpeg_on_error(j_common_ptr c)
{
    jpeg_err *e = (jpeg_err *)c->err;
    c->err->format_message(c, e->msg);
    longjmp(e->jb, 1);
}

/* Warnings (corrupt data, premature end: libjpeg would fill in gray) are
 * refusals here: a half-decoded upload is not an image to edit. */
static void jpeg_on_message(j_common_ptr c, int level)
{
    if (level < 0)
        jpeg_on_error(c);
}

/* A progressive JPEG of a few KB can hold thousands of scans, each a full
 * pass over the coefficients: a CPU bomb. libjpeg-turbo's own tools cap the
 * scans through the progress monitor the same way (djpeg -maxscans). */
#define JPEG_MAX_SCANS 256

static void jpeg_on_progress(j_common_ptr c)
{
    j_decompress_ptr d = (j_decompress_ptr)c;
    if (d->input_scan_number > JPEG_MAX_SCANS) {
        jpeg_err *e = (jpeg_err *)c->err;
        snprintf(e->msg, sizeof e->msg, "more than %d scans", JPEG_MAX_SCANS);
        longjmp(e->jb, 1);
    }
}

static int decode_jpeg(const uint8_t *data, size_t len, const ditd_image_limits *lim,
                       ditd_image *out, int probe)
{
    struct jpeg_decompress_struct cinfo;
    jpeg_err je;
    uint8_t *volatile pix = NULL;
    volatile int err = 0;
    struct jpeg_progress_mgr prog = {.progress_monitor = jpeg_on_progress};
    memset(&cinfo, 0, sizeof cinfo);
    cinfo.err = jpeg_std_error(&je.mgr);
    je.mgr.error_exit = jpeg_on_error;
    je.mgr.emit_message = jpeg_on_message;
    je.msg[0] = '\0';
    if (setjmp(je.jb)) {
        /* a header cut after its frame (a bomb's header alone): the size it
         * gives is refused for what it is, not as a truncation */
        if (!err && cinfo.global_state && cinfo.image_width && cinfo.image_height)
            err = check_dims("jpeg", cinfo.image_width, cinfo.image_height, lim);
        if (!err)
            err = ditd_err_set(DITD_EFORMAT, "jpeg: %s", je.msg);
        goto fail;
    }
    jpeg_create_decompress(&cinfo);
    cinfo.progress = &prog;
    /* libjpeg's working memory (progressive coefficient buffers) is bounded
     * by the pixel limit: 6 coefficient planes of 2 bytes a pixel at most */
    cinfo.mem->max_memory_to_use = (long)((size_t)lim->max_pixels * 16 + (64u << 20));
    jpeg_mem_src(&cinfo, data, (unsigned long)len);
    jpeg_save_markers(&cinfo, JPEG_APP0 + 1, 0xFFFF);
    jpeg_read_header(&cinfo, TRUE);
    if ((err = check_dims("jpeg", cinfo.image_width, cinfo.image_height, lim)))
        goto fail;
    if (cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK) {
        err = ditd_err_set(DITD_EUNSUPPORTED, "jpeg: CMYK images are not accepted");
        goto fail;
    }
    int orient = 1;
    for (jpeg_saved_marker_ptr m = cinfo.marker_list; m; m = m->next) {
        if (m->marker == JPEG_APP0 + 1 && m->data_length >= 6 && memcmp(m->data, "Exif\0\0", 6) == 0) {
            orient = ditd_image_exif_orientation(m->data, m->data_length);
            break;
        }
    }
    if (probe) {
        out->width = (int)(orient >= 5 ? cinfo.image_height : cinfo.image_width);
        out->height = (int)(orient >= 5 ? cinfo.image_width : cinfo.image_height);
        out->format = DITD_IMAGE_JPEG;
        out->orientation = orient;
        jpeg_destroy_decompress(&cinfo);
        return 0;
    }
    cinfo.out_color_space = JCS_RGB;
    jpeg_start_decompress(&cinfo);
    if (cinfo.output_components != 3) {
        err = ditd_err_set(DITD_EFORMAT, "jpeg: %d output components, want 3",
                           cinfo.output_components);
        goto fail;
    }
    size_t w = cinfo.output_width, h = cinfo.output_height, stride = w * 3;
    pix = pixel_alloc(stride * h);
    if (!pix) {
        err = ditd_err_set(DITD_ENOMEM, "jpeg: %zux%zu pixels", w, h);
        goto fail;
    }
    while (cinfo.output_scanline < cinfo.output_height) {
        JSAMPROW row = pix + stride * cinfo.output_scanline;
        if (jpeg_read_scanlines(&cinfo, &row, 1) != 1) {
            err = ditd_err_set(DITD_EFORMAT, "jpeg: truncated data at row %u",
                               cinfo.output_scanline);
            goto fail;
        }
    }
    jpeg_finish_decompress(&cinfo);
    jpeg_destroy_decompress(&cinfo);
    out->format = DITD_IMAGE_JPEG;
    out->channels = 3;
    out->orientation = orient;
    if (orient != 1) {
        uint8_t *o = NULL;
        int ow = 0, oh = 0;
        int rc = ditd_image_orient(pix, (int)w, (int)h, 3, orient, &o, &ow, &oh);
        free(pix);
        if (rc)
            return rc;
        out->pixels = o;
        out->width = ow;
        out->height = oh;
        return 0;
    }
    out->pixels = pix;
    out->width = (int)w;
    out->height = (int)h;
    return 0;
fail:
    free(pix);
    jpeg_destroy_decompress(&cinfo);
    return err;
}

/* ---- WebP ------------------------------------------------------------- */

static const char *vp8_status(VP8StatusCode c)
{
    switch (c) {
    case VP8_STATUS_OUT_OF_MEMORY: return "out of memory";
    case VP8_STATUS_INVALID_PARAM: return "invalid parameter";
    case VP8_STATUS_BITSTREAM_ERROR: return "bitstream error";
    case VP8_STATUS_UNSUPPORTED_FEATURE: return "unsupported feature";
    case VP8_STATUS_SUSPENDED: return "suspended";
    case VP8_STATUS_USER_ABORT: return "aborted";
    case VP8_STATUS_NOT_ENOUGH_DATA: return "truncated data";
    default: return "error";
    }
}

static int decode_webp(const uint8_t *data, size_t len, const ditd_image_limits *lim,
                       ditd_image *out, int probe)
{
    WebPBitstreamFeatures f;
    VP8StatusCode st = WebPGetFeatures(data, len, &f);
    if (st != VP8_STATUS_OK)
        return ditd_err_set(DITD_EFORMAT, "webp: %s in the header", vp8_status(st));
    if (f.has_animation)
        return ditd_err_set(DITD_EUNSUPPORTED, "webp: animated images are not accepted");
    int rc = check_dims("webp", f.width, f.height, lim);
    if (rc)
        return rc;
    /* a truncated file is refused before its pixels are allocated: the RIFF
     * header states the file's length (RIFF size + 8, padded to even) */
    uint32_t riff = (uint32_t)data[4] | (uint32_t)data[5] << 8 | (uint32_t)data[6] << 16 |
                    (uint32_t)data[7] << 24;
    if ((uint64_t)riff + 8 > len)
        return ditd_err_set(DITD_EFORMAT, "webp: truncated data (%zu bytes of the %llu the RIFF "
                            "header gives)", len, (unsigned long long)riff + 8);
    const int orient = webp_orientation(data, len);
    if (probe) {
        out->width = orient >= 5 ? f.height : f.width;
        out->height = orient >= 5 ? f.width : f.height;
        out->channels = f.has_alpha ? 4 : 3;
        out->format = DITD_IMAGE_WEBP;
        out->orientation = orient;
        return 0;
    }
    int ch = f.has_alpha ? 4 : 3;
    size_t stride = (size_t)f.width * ch, n = stride * (size_t)f.height;
    uint8_t *pix = pixel_alloc(n);
    if (!pix)
        return ditd_err_set(DITD_ENOMEM, "webp: %dx%d pixels", f.width, f.height);
    uint8_t *r = ch == 4 ? WebPDecodeRGBAInto(data, len, pix, n, (int)stride)
                         : WebPDecodeRGBInto(data, len, pix, n, (int)stride);
    if (!r) {
        free(pix);
        return ditd_err_set(DITD_EFORMAT, "webp: truncated or corrupt data (%dx%d header)",
                            f.width, f.height);
    }
    return finish(pix, f.width, f.height, ch, DITD_IMAGE_WEBP, orient, out);
}

static int decode_or_probe(const uint8_t *data, size_t len, const ditd_image_limits *lim,
                           ditd_image *out, int probe)
{
    ditd_image_limits def;
    memset(out, 0, sizeof *out);
    if (!lim) {
        ditd_image_limits_default(&def);
        lim = &def;
    }
    if (!data || len == 0)
        return ditd_err_set(DITD_EFORMAT, "image: empty");
    if (len > lim->max_bytes)
        return ditd_err_set(DITD_ERANGE, "image: %zu bytes, over the limit of %zu", len,
                            lim->max_bytes);
    if (len > 0xFFFFFFFFu)
        return ditd_err_set(DITD_ERANGE, "image: %zu bytes", len);
    int rc;
    switch (ditd_image_sniff(data, len)) {
    case DITD_IMAGE_PNG: rc = decode_png(data, len, lim, out, probe); break;
    case DITD_IMAGE_JPEG: rc = decode_jpeg(data, len, lim, out, probe); break;
    case DITD_IMAGE_WEBP: rc = decode_webp(data, len, lim, out, probe); break;
    default:
        if (len >= 6 && (memcmp(data, "GIF87a", 6) == 0 || memcmp(data, "GIF89a", 6) == 0))
            return ditd_err_set(DITD_EUNSUPPORTED, "image: GIF is not accepted (PNG, JPEG or WebP)");
        if (len >= 2 && data[0] == 'B' && data[1] == 'M')
            return ditd_err_set(DITD_EUNSUPPORTED, "image: BMP is not accepted (PNG, JPEG or WebP)");
        return ditd_err_set(DITD_EFORMAT,
                            "image: unknown format (first bytes %02x %02x %02x %02x; PNG, JPEG or WebP accepted)",
                            data[0], len > 1 ? data[1] : 0, len > 2 ? data[2] : 0,
                            len > 3 ? data[3] : 0);
    }
    if (rc)
        memset(out, 0, sizeof *out);
    return rc;
}

int ditd_image_decode(const uint8_t *data, size_t len, const ditd_image_limits *lim,
                      ditd_image *out)
{
    return decode_or_probe(data, len, lim, out, 0);
}

int ditd_image_probe(const uint8_t *data, size_t len, const ditd_image_limits *lim,
                     ditd_image *out)
{
    return decode_or_probe(data, len, lim, out, 1);
}

void ditd_image_free(ditd_image *img)
{
    if (!img)
        return;
    free(img->pixels);
    img->pixels = NULL;
}

void ditd_image_to_luma(const ditd_image *img, uint8_t *out)
{
    const size_t np = (size_t)img->width * (size_t)img->height;
    const size_t c = (size_t)img->channels;
    for (size_t i = 0; i < np; i++) {
        const uint8_t *p = img->pixels + c * i;
        uint32_t l = (uint32_t)p[0] * 19595u + (uint32_t)p[1] * 38470u + (uint32_t)p[2] * 7471u +
                     0x8000u;
        out[i] = (uint8_t)(l >> 16);
    }
}
