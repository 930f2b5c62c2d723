/* Pillow's Image.resize for 8-bit images, bit for bit (Pillow 13's
 * libImaging/Resample.c, reimplemented): the separable convolution whose
 * filter support widens by the reduction factor (so a reduction is
 * antialiased), coefficients normalised in double and rounded to fixed
 * point with 22 fraction bits, two passes with an 8-bit clip between them,
 * the vertical pass first exactly when Pillow 13 runs it first (the height
 * loses more than twice the pixels the width does), else the horizontal
 * one over just the source rows the vertical pass reads.
 *
 * What it is: the resize of Diffusers' VaeImageProcessor (resample
 * "lanczos": the image processor on RGB, the mask processor on L) and of
 * CLIPImageProcessor (bicubic), as those call PIL.Image.resize with no box
 * and no reducing_gap. Measured against Pillow 13 in
 * tests/unit/test_image_resize.c (docs/edits.md#resampling).
 * What it is not: a general image library; no other filters, no 16-bit or
 * float images; RGBA only as PIL's resize-then-convert("RGB") below.
 *
 * Memory: one allocation per call (nothing kept): the two coefficient
 * tables, 4 x (d x (k + 2)) bytes an axis with k = 2 ceil(3 max(1, s/d)) + 1
 * for Lanczos (about 4 x (6 s + 9 d) bytes), and, when both axes change, the
 * 8-bit intermediate: dw x sh x C bytes horizontal first (of which the
 * source rows the vertical pass reads are used), sw x dh x C vertical first. A one-axis resize writes
 * straight into dst; the same size is a copy.
 */
#ifndef DITD_ENGINE_IMAGE_RESIZE_H
#define DITD_ENGINE_IMAGE_RESIZE_H

#include <stdint.h>

/* The largest side and the largest pixel count (source, destination and the
 * intermediate) a resize takes: larger is refused before allocating. The
 * image decoders' own limits (server/common/image_in.h) are far below. */
#define DITD_IMAGE_RESIZE_MAX_SIDE 65536
#define DITD_IMAGE_RESIZE_MAX_PIXELS (1L << 28)

typedef enum ditd_resample {
    DITD_RESAMPLE_LANCZOS = 1,  /* PIL.Image.LANCZOS */
    DITD_RESAMPLE_BILINEAR = 2, /* PIL.Image.BILINEAR */
    DITD_RESAMPLE_BICUBIC = 3,  /* PIL.Image.BICUBIC */
} ditd_resample;

const char *ditd_resample_name(ditd_resample f);
/* "lanczos", "bilinear", "bicubic": 0, or DITD_EUNSUPPORTED naming s. */
int ditd_resample_from_str(const char *s, ditd_resample *out);
/* PIL's integer codes 1, 2, 3 (transformers' `resample`): the same. */
int ditd_resample_from_pil(int code, ditd_resample *out);

/* src (sh, sw, channels) interleaved bytes -> dst (dh, dw, channels): PIL's
 * Image.resize((dw, dh), Image.LANCZOS), channels 1 (mode L) or 3 (RGB).
 * dst must not overlap src. 0, DITD_EINVAL (a side < 1 or over the limits
 * above, other channels: nothing allocated), DITD_ENOMEM. Any thread. */
int ditd_image_resize(const uint8_t *src, int sw, int sh, int channels, uint8_t *dst, int dw,
                      int dh);

/* src RGBA (sh, sw, 4) -> dst RGB (dh, dw, 3) as PIL's
 * Image.resize((dw, dh), LANCZOS).convert("RGB") of an RGBA image: PIL
 * resizes RGBA premultiplied (RGBA -> RGBa: c a / 255 rounded as its
 * MULDIV255; the four channels resized; RGBa -> RGBA: 255 c / a truncated,
 * clipped, a = 0 or 255 kept), then drops alpha. What VaeImageProcessor does
 * to an RGBA input of another size (it resizes before converting). Two more
 * buffers than ditd_image_resize: the premultiplied source and the 4-channel
 * result (4 (sw sh + dw dh) bytes). Errors as ditd_image_resize. */
int ditd_image_resize_rgba(const uint8_t *src, int sw, int sh, uint8_t *dst, int dw, int dh);

/* The same with filter f and channels 1..4 (each channel on its own, as PIL
 * treats RGB and RGBX). */
int ditd_image_resize_filter(const uint8_t *src, int sw, int sh, int channels, uint8_t *dst,
                             int dw, int dh, ditd_resample f);

#endif
