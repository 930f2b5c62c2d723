/* Pillow's Image.resize for 8-bit images, bit for bit: the separable
 * convolution of its libImaging/Resample.c (the filter's support widened
 * by the downscale factor, so a reduction is antialiased; coefficients
 * normalised in double, then fixed point with 22 fraction bits; the
 * horizontal pass, clipped to 8 bits, then the vertical pass), for the
 * filters the preprocessors of Diffusers and transformers ask for:
 * bilinear (PIL 2), bicubic (3, a = -0.5), lanczos (1, a = 3).
 *
 * What it is: CLIPImageProcessor's resize (resample 3) and
 * VaeImageProcessor's (resample "lanczos") on the CPU, as those classes
 * call PIL.Image.resize with no box and no reducing_gap.
 * What it is not: a general image library; no other filters, no 16-bit or
 * float images, no premultiplied alpha (RGBA is resized channel by
 * channel, as PIL does for RGB; callers pass RGB).
 */
#ifndef DITD_ENGINE_IMAGE_RESIZE_H
#define DITD_ENGINE_IMAGE_RESIZE_H

#include <stdint.h>

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

/* in (h, w, C) interleaved bytes -> out (oh, ow, C), C in 1..4. The same
 * size is a copy, as PIL's. 0, DITD_EINVAL (a size < 1), DITD_ENOMEM. */
int ditd_image_resize(const uint8_t *in, int w, int h, int C, uint8_t *out, int ow, int oh,
                      ditd_resample f);

#endif
