/* Decoding of uploaded images (PNG, JPEG, WebP) from memory into 8-bit RGB
 * or RGBA, for the input side of /v1/images/edits (issue 23).
 *
 * The format is sniffed from magic bytes, never from a file name or a
 * Content-Type. Size limits (encoded bytes, each dimension, width*height)
 * are checked from the header before a single pixel is decoded or any
 * pixel memory is allocated, so decompression bombs are refused cheaply.
 * Gray, gray+alpha and palette images are expanded to RGB(A); 16-bit PNG
 * is reduced to 8 bits; the EXIF orientation (tag 0x0112: a JPEG's APP1, a
 * PNG's eXIf chunk wherever it stands, a WebP's EXIF chunk) is applied, as
 * PIL's ImageOps.exif_transpose does, so the pixels come back upright as a
 * viewer shows them.
 *
 * Not here: animation (an animated WebP is refused; an APNG gives its first
 * frame, as any PNG reader does), color management (ICC profiles are
 * ignored: pixels are taken as sRGB), CMYK JPEG (refused), GIF/BMP/TIFF (refused: GIF and BMP by name).
 * Thread-safe: no shared state beyond an atomic allocation counter.
 */
#ifndef DITD_SERVER_COMMON_IMAGE_IN_H
#define DITD_SERVER_COMMON_IMAGE_IN_H

#include <stddef.h>
#include <stdint.h>

typedef struct ditd_image_limits {
    size_t max_bytes;   /* encoded size */
    int max_dim;        /* each of width, height */
    int64_t max_pixels; /* width * height */
} ditd_image_limits;

/* Defaults: 20 MiB encoded, 8192 per side, 16 Mpixel (4096x4096). */
#define DITD_IMAGE_MAX_BYTES_DEFAULT ((size_t)20 << 20)
#define DITD_IMAGE_MAX_DIM_DEFAULT 8192
#define DITD_IMAGE_MAX_PIXELS_DEFAULT ((int64_t)1 << 24)

typedef enum ditd_image_format {
    DITD_IMAGE_UNKNOWN = 0,
    DITD_IMAGE_PNG,
    DITD_IMAGE_JPEG,
    DITD_IMAGE_WEBP,
} ditd_image_format;

typedef struct ditd_image {
    uint8_t *pixels;   /* row-major, interleaved, width*channels bytes a row; free with ditd_image_free */
    int width, height; /* after the EXIF orientation */
    int channels;      /* 3 (RGB) or 4 (RGBA: the source had alpha or transparency) */
    ditd_image_format format;
    int orientation;   /* the EXIF orientation applied (1..8; 1: none) */
} ditd_image;

void ditd_image_limits_default(ditd_image_limits *lim);

/* The format from the first bytes; DITD_IMAGE_UNKNOWN when none matches. */
ditd_image_format ditd_image_sniff(const uint8_t *data, size_t len);
const char *ditd_image_format_name(ditd_image_format f);

/* Decodes data[0..len) into *out (zeroed on failure; nothing to free then).
 * lim NULL: the defaults. Errors: DITD_EFORMAT (truncated or corrupt data,
 * unknown format), DITD_ERANGE (a limit; the detail names it and the
 * header's size), DITD_EUNSUPPORTED (animated WebP, CMYK JPEG, GIF, BMP),
 * DITD_ENOMEM. The detail always says what is wrong. */
int ditd_image_decode(const uint8_t *data, size_t len, const ditd_image_limits *lim,
                      ditd_image *out);

/* The same checks from the header alone (format, limits, a WebP's stated
 * length): out gets the size after the EXIF orientation, the format and
 * orientation (channels for WebP only), never pixels (nothing to free).
 * What passes may still fail to decode (corrupt data past the header). For
 * several uploads: probe all, then decode. */
int ditd_image_probe(const uint8_t *data, size_t len, const ditd_image_limits *lim,
                     ditd_image *out);

void ditd_image_free(ditd_image *img);

/* The image's luma as PIL's convert("L") computes it from RGB (alpha
 * ignored): (R 19595 + G 38470 + B 7471 + 0x8000) >> 16, into out
 * (width x height bytes). What Diffusers' mask processor reads of a
 * mask_image (white repainted, black kept). */
void ditd_image_to_luma(const ditd_image *img, uint8_t *out);

/* Total bytes ever allocated for pixels by this module (all threads): the
 * tests check that a refused bomb allocated none. */
uint64_t ditd_image_pixel_bytes_allocated(void);

/* The EXIF orientation in a JPEG's APP1 Exif payload (starting at "Exif\0\0"),
 * 1..8, or 1 when absent or malformed. Exposed for the tests and fuzzers. */
int ditd_image_exif_orientation(const uint8_t *app1, size_t len);

/* Applies EXIF orientation o (1..8) to src (w x h, ch channels) into a new
 * malloc'd buffer *dst with dimensions *dw x *dh. */
int ditd_image_orient(const uint8_t *src, int w, int h, int ch, int o, uint8_t **dst, int *dw,
                      int *dh);

#endif
