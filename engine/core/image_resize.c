/* Pillow 13's 8-bit Image.resize (libImaging/Resample.c), reimplemented
 * (image_resize.h says what it is and what it costs). */
#include "engine/core/image_resize.h"

#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/error.h"

#define PRECISION_BITS (32 - 8 - 2)

typedef struct filter {
    double (*fn)(double x);
    double support;
} filter;

static double bilinear_fn(double x)
{
    if (x < 0.0)
        x = -x;
    return x < 1.0 ? 1.0 - x : 0.0;
}

static double bicubic_fn(double x)
{
    const double a = -0.5;
    if (x < 0.0)
        x = -x;
    if (x < 1.0)
        return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
    if (x < 2.0)
        return (((x - 5) * x + 8) * x - 4) * a;
    return 0.0;
}

static double sinc(double x)
{
    if (x == 0.0)
        return 1.0;
    x = x * M_PI;
    return sin(x) / x;
}

static double lanczos_fn(double x)
{
    return -3.0 <= x && x < 3.0 ? sinc(x) * sinc(x / 3) : 0.0;
}

static const filter BILINEAR = {bilinear_fn, 1.0}, BICUBIC = {bicubic_fn, 2.0},
                    LANCZOS = {lanczos_fn, 3.0};

const char *ditd_resample_name(ditd_resample f)
{
    switch (f) {
    case DITD_RESAMPLE_LANCZOS: return "lanczos";
    case DITD_RESAMPLE_BILINEAR: return "bilinear";
    case DITD_RESAMPLE_BICUBIC: return "bicubic";
    }
    return "?";
}

int ditd_resample_from_str(const char *s, ditd_resample *out)
{
    static const ditd_resample all[] = {DITD_RESAMPLE_LANCZOS, DITD_RESAMPLE_BILINEAR,
                                        DITD_RESAMPLE_BICUBIC};
    for (int i = 0; i < 3; i++)
        if (s && strcmp(s, ditd_resample_name(all[i])) == 0) {
            *out = all[i];
            return 0;
        }
    return ditd_err_set(DITD_EUNSUPPORTED, "resample \"%s\" (lanczos, bilinear, bicubic)",
                        s ? s : "(null)");
}

int ditd_resample_from_pil(int code, ditd_resample *out)
{
    if (code < 1 || code > 3)
        return ditd_err_set(DITD_EUNSUPPORTED, "resample %d (PIL's 1 lanczos, 2 bilinear, 3 bicubic)",
                            code);
    *out = (ditd_resample)code;
    return 0;
}

/* One axis: per output index its first source index and count (bounds,
 * 2 a row) and ksize fixed-point weights. */
typedef struct axis {
    int ksize;
    int *bounds;
    int32_t *kk;
} axis;

/* Pillow's ksize for in -> out: the most weights an output index takes. */
static int axis_ksize(int in_size, int out_size, const filter *f)
{
    double fscale = (double)in_size / out_size;
    return (int)ceil(f->support * (fscale < 1.0 ? 1.0 : fscale)) * 2 + 1;
}

static size_t axis_bytes(int out_size, int ksize)
{
    return (size_t)out_size * (2 * sizeof(int) + (size_t)ksize * sizeof(int32_t));
}

/* precompute_coeffs + normalize_coeffs_8bpc into a carved table. The
 * weights are evaluated twice (once for their sum, once divided by it)
 * instead of kept in a double table: the same double operations, so the
 * same values, and no second buffer. */
static void axis_fill(int in_size, int out_size, const filter *f, axis *a, void *mem)
{
    /* Pillow passes the box as float: (float)in_size - 0.0f, then double */
    double scale = (double)((float)in_size - 0.0f) / out_size, fscale = scale;
    if (fscale < 1.0)
        fscale = 1.0;
    const double support = f->support * fscale, inv = 1.0 / fscale;
    const int ks = a->ksize;
    a->bounds = mem;
    a->kk = (int32_t *)(a->bounds + (size_t)out_size * 2);
    for (int xx = 0; xx < out_size; xx++) {
        double center = 0.0 + (xx + 0.5) * scale, ww = 0.0;
        int xmin = (int)(center - support + 0.5), xmax;
        if (xmin < 0)
            xmin = 0;
        xmax = (int)(center + support + 0.5);
        if (xmax > in_size)
            xmax = in_size;
        xmax -= xmin;
        for (int x = 0; x < xmax; x++)
            ww += f->fn((x + xmin - center + 0.5) * inv);
        int32_t *k = a->kk + (size_t)xx * ks;
        int x;
        for (x = 0; x < xmax; x++) {
            double w = f->fn((x + xmin - center + 0.5) * inv);
            if (ww != 0.0)
                w /= ww;
            k[x] = w < 0 ? (int32_t)(-0.5 + w * (1 << PRECISION_BITS))
                         : (int32_t)(0.5 + w * (1 << PRECISION_BITS));
        }
        for (; x < ks; x++)
            k[x] = 0;
        a->bounds[xx * 2] = xmin;
        a->bounds[xx * 2 + 1] = xmax;
    }
}

/* clip8: the sum's integer part (arithmetic shift) clamped to a byte */
static inline uint8_t clip8(int32_t v)
{
    int32_t q = v >> PRECISION_BITS;
    return (uint8_t)(q < 0 ? 0 : q > 255 ? 255 : q);
}

/* rows [y0, y0 + rows) of in (w wide) -> out (rows, ow):
 * ImagingResampleHorizontal_8bpc with its row offset */
static void horizontal(const uint8_t *in, int w, int y0, int rows, int C, uint8_t *out, int ow,
                       const axis *a)
{
    for (int y = 0; y < rows; y++) {
        const uint8_t *line = in + (size_t)(y + y0) * w * C;
        uint8_t *o = out + (size_t)y * ow * C;
        for (int xx = 0; xx < ow; xx++) {
            const int xmin = a->bounds[xx * 2], xmax = a->bounds[xx * 2 + 1];
            const int32_t *k = a->kk + (size_t)xx * a->ksize;
            const uint8_t *p = line + (size_t)xmin * C;
            for (int c = 0; c < C; c++) {
                int32_t ss = 1 << (PRECISION_BITS - 1);
                for (int x = 0; x < xmax; x++)
                    ss += (int32_t)p[(size_t)x * C + c] * k[x];
                o[(size_t)xx * C + c] = clip8(ss);
            }
        }
    }
}

/* in (rows, w) -> out (oh, w), the bounds' first rows less y0:
 * ImagingResampleVertical_8bpc */
static void vertical(const uint8_t *in, int w, int y0, int C, uint8_t *out, int oh,
                     const axis *a)
{
    const size_t stride = (size_t)w * C;
    for (int yy = 0; yy < oh; yy++) {
        const int ymin = a->bounds[yy * 2] - y0, ymax = a->bounds[yy * 2 + 1];
        const int32_t *k = a->kk + (size_t)yy * a->ksize;
        const uint8_t *p = in + (size_t)ymin * stride;
        uint8_t *o = out + (size_t)yy * stride;
        for (size_t i = 0; i < stride; i++) {
            int32_t ss = 1 << (PRECISION_BITS - 1);
            for (int y = 0; y < ymax; y++)
                ss += (int32_t)p[(size_t)y * stride + i] * k[y];
            o[i] = clip8(ss);
        }
    }
}

int ditd_image_resize_filter(const uint8_t *src, int sw, int sh, int C, uint8_t *dst, int dw,
                             int dh, ditd_resample fr)
{
    const filter *f = fr == DITD_RESAMPLE_BICUBIC    ? &BICUBIC
                      : fr == DITD_RESAMPLE_BILINEAR ? &BILINEAR
                      : fr == DITD_RESAMPLE_LANCZOS  ? &LANCZOS
                                                     : NULL;
    if (!f)
        return ditd_err_set(DITD_EUNSUPPORTED, "resample %d", (int)fr);
    const long M = DITD_IMAGE_RESIZE_MAX_SIDE;
    if (sw < 1 || sh < 1 || dw < 1 || dh < 1 || C < 1 || C > 4)
        return ditd_err_set(DITD_EINVAL, "resize %dx%d (%d channels) to %dx%d: sides must be "
                            ">= 1, channels 1..4", sw, sh, C, dw, dh);
    if (sw > M || sh > M || dw > M || dh > M || (long)sw * sh > DITD_IMAGE_RESIZE_MAX_PIXELS ||
        (long)dw * dh > DITD_IMAGE_RESIZE_MAX_PIXELS)
        return ditd_err_set(DITD_EINVAL, "resize %dx%d to %dx%d: over the resize limits (sides "
                            "<= %ld, %ld pixels)", sw, sh, dw, dh, M,
                            (long)DITD_IMAGE_RESIZE_MAX_PIXELS);
    if (!src || !dst)
        return ditd_err_set(DITD_EINVAL, "resize: no pixels");
    if (sw == dw && sh == dh) { /* PIL: a copy */
        memcpy(dst, src, (size_t)sw * sh * C);
        return 0;
    }
    const int need_h = dw != sw, need_v = dh != sh;
    /* Pillow 13: the vertical pass first when the height loses more than
     * twice the pixels the width loses */
    const int h_first = !(sh - dh > 0 && sh - dh > (sw - dw) * 2);
    axis ah = {need_h ? axis_ksize(sw, dw, f) : 0, NULL, NULL};
    axis av = {need_v || (need_h && h_first) ? axis_ksize(sh, dh, f) : 0, NULL, NULL};
    const size_t bh = ah.ksize ? axis_bytes(dw, ah.ksize) : 0;
    const size_t bv = av.ksize ? axis_bytes(dh, av.ksize) : 0;
    /* the intermediate: the horizontal pass first runs when the width
     * shrinks (dw x sh < sw x sh) or the height does not (dw x sh <= dw x
     * dh); the vertical first when the height shrinks (sw x dh < sw x sh):
     * within the limits checked above */
    const size_t tpix = !(need_h && need_v) ? 0 : h_first ? (size_t)dw * sh : (size_t)sw * dh;
    const size_t al = sizeof(int32_t);
    const size_t off_v = (bh + al - 1) / al * al, off_t = off_v + (bv + al - 1) / al * al;
    uint8_t *mem = malloc(off_t + tpix * C + 1);
    if (!mem)
        return ditd_err_set(DITD_ENOMEM, "resize %dx%d to %dx%d", sw, sh, dw, dh);
    if (ah.ksize)
        axis_fill(sw, dw, f, &ah, mem);
    if (av.ksize)
        axis_fill(sh, dh, f, &av, mem + off_v);
    uint8_t *tmp = mem + off_t;
    if (h_first) {
        if (need_h) {
            /* only the source rows the vertical pass reads (all of them
             * when the height stays) */
            const int y0 = av.bounds[0];
            const int y1 = av.bounds[dh * 2 - 2] + av.bounds[dh * 2 - 1];
            horizontal(src, sw, y0, y1 - y0, C, need_v ? tmp : dst, dw, &ah);
            if (need_v)
                vertical(tmp, dw, y0, C, dst, dh, &av);
        } else {
            vertical(src, sw, 0, C, dst, dh, &av);
        }
    } else {
        vertical(src, sw, 0, C, need_h ? tmp : dst, dh, &av);
        if (need_h)
            horizontal(tmp, sw, 0, dh, C, dst, dw, &ah);
    }
    free(mem);
    return 0;
}

int ditd_image_resize(const uint8_t *src, int sw, int sh, int channels, uint8_t *dst, int dw,
                      int dh)
{
    if (channels != 1 && channels != 3)
        return ditd_err_set(DITD_EINVAL, "resize: %d channels (1: L, 3: RGB)", channels);
    return ditd_image_resize_filter(src, sw, sh, channels, dst, dw, dh, DITD_RESAMPLE_LANCZOS);
}

int ditd_image_resize_rgba(const uint8_t *src, int sw, int sh, uint8_t *dst, int dw, int dh)
{
    const long M = DITD_IMAGE_RESIZE_MAX_SIDE;
    if (sw < 1 || sh < 1 || dw < 1 || dh < 1 || sw > M || sh > M || dw > M || dh > M ||
        (long)sw * sh > DITD_IMAGE_RESIZE_MAX_PIXELS || (long)dw * dh > DITD_IMAGE_RESIZE_MAX_PIXELS)
        return ditd_err_set(DITD_EINVAL, "resize %dx%d to %dx%d (RGBA): sides must be >= 1 and "
                            "within the resize limits (sides <= %ld, %ld pixels)", sw, sh, dw, dh,
                            M, (long)DITD_IMAGE_RESIZE_MAX_PIXELS);
    if (!src || !dst)
        return ditd_err_set(DITD_EINVAL, "resize: no pixels");
    const size_t ns = (size_t)sw * sh, nd = (size_t)dw * dh;
    if (sw == dw && sh == dh) { /* PIL: a copy, then the color */
        for (size_t i = 0; i < ns; i++)
            memcpy(dst + 3 * i, src + 4 * i, 3);
        return 0;
    }
    uint8_t *pre = malloc(4 * (ns + nd));
    if (!pre)
        return ditd_err_set(DITD_ENOMEM, "resize %dx%d to %dx%d (RGBA)", sw, sh, dw, dh);
    uint8_t *out = pre + 4 * ns;
    for (size_t i = 0; i < ns; i++) { /* RGBa: Pillow's MULDIV255 */
        const unsigned a = src[4 * i + 3];
        for (int c = 0; c < 3; c++) {
            unsigned t = src[4 * i + c] * a + 128;
            pre[4 * i + c] = (uint8_t)(((t >> 8) + t) >> 8);
        }
        pre[4 * i + 3] = (uint8_t)a;
    }
    int err = ditd_image_resize_filter(pre, sw, sh, 4, out, dw, dh, DITD_RESAMPLE_LANCZOS);
    for (size_t i = 0; !err && i < nd; i++) { /* RGBA again (rgba2rgbA), then RGB */
        const unsigned a = out[4 * i + 3];
        for (int c = 0; c < 3; c++) {
            unsigned v = out[4 * i + c];
            dst[3 * i + c] = (uint8_t)(a == 255 || a == 0 ? v : (255 * v) / a > 255 ? 255
                                                                                    : (255 * v) / a);
        }
    }
    free(pre);
    return err;
}
