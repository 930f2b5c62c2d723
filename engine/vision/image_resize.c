/* Pillow's 8-bit Image.resize (libImaging/Resample.c), reimplemented. */
#include "engine/vision/image_resize.h"

#include <math.h>
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

/* precompute_coeffs + normalize_coeffs_8bpc: per output index its first
 * input index, count and fixed-point weights (ksize a row). */
static int coeffs(int in_size, int out_size, const filter *f, int **bounds_out, int32_t **kk_out,
                  int *ksize_out)
{
    double scale = (double)((float)in_size - 0.0f) / out_size, fscale = scale;
    if (fscale < 1.0)
        fscale = 1.0;
    double support = f->support * fscale;
    int ksize = (int)ceil(support) * 2 + 1;
    double *k = malloc((size_t)out_size * ksize * sizeof(double));
    int32_t *kk = malloc((size_t)out_size * ksize * sizeof(int32_t));
    int *bounds = malloc((size_t)out_size * 2 * sizeof(int));
    if (!k || !kk || !bounds) {
        free(k);
        free(kk);
        free(bounds);
        return ditd_err_set(DITD_ENOMEM, "resize coefficients");
    }
    for (int xx = 0; xx < out_size; xx++) {
        double center = 0.0 + (xx + 0.5) * scale, ww = 0.0, ss = 1.0 / fscale;
        int xmin = (int)(center - support + 0.5), xmax;
        if (xmin < 0)
            xmin = 0;
        xmax = (int)(center + support + 0.5);
        if (xmax > in_size)
            xmax = in_size;
        xmax -= xmin;
        double *kr = k + (size_t)xx * ksize;
        int x;
        for (x = 0; x < xmax; x++) {
            double wv = f->fn((x + xmin - center + 0.5) * ss);
            kr[x] = wv;
            ww += wv;
        }
        for (x = 0; x < xmax; x++)
            if (ww != 0.0)
                kr[x] /= ww;
        for (; x < ksize; x++)
            kr[x] = 0;
        bounds[xx * 2] = xmin;
        bounds[xx * 2 + 1] = xmax;
    }
    for (size_t i = 0; i < (size_t)out_size * ksize; i++)
        kk[i] = k[i] < 0 ? (int32_t)(-0.5 + k[i] * (1 << PRECISION_BITS))
                         : (int32_t)(0.5 + k[i] * (1 << PRECISION_BITS));
    free(k);
    *bounds_out = bounds;
    *kk_out = kk;
    *ksize_out = ksize;
    return 0;
}

/* clip8: the sum's integer part (arithmetic shift) clamped to a byte */
static uint8_t clip8(int32_t v)
{
    int32_t q = v >> PRECISION_BITS;
    return (uint8_t)(q < 0 ? 0 : q > 255 ? 255 : q);
}

/* (h, w) -> (h, ow): ImagingResampleHorizontal_8bpc */
static void horizontal(const uint8_t *in, int w, int h, int C, uint8_t *out, int ow,
                       const int *b, const int32_t *kk, int ks)
{
    for (int y = 0; y < h; y++)
        for (int xx = 0; xx < ow; xx++) {
            int xmin = b[xx * 2], xmax = b[xx * 2 + 1];
            const int32_t *k = kk + (size_t)xx * ks;
            for (int c = 0; c < C; c++) {
                int32_t ss = 1 << (PRECISION_BITS - 1);
                for (int x = 0; x < xmax; x++)
                    ss += (int32_t)in[((size_t)y * w + x + xmin) * C + c] * k[x];
                out[((size_t)y * ow + xx) * C + c] = clip8(ss);
            }
        }
}

/* (h, w) -> (oh, w): ImagingResampleVertical_8bpc */
static void vertical(const uint8_t *in, int w, int h, int C, uint8_t *out, int oh,
                     const int *b, const int32_t *kk, int ks)
{
    (void)h;
    for (int yy = 0; yy < oh; yy++) {
        int ymin = b[yy * 2], ymax = b[yy * 2 + 1];
        const int32_t *k = kk + (size_t)yy * ks;
        for (int x = 0; x < w; x++)
            for (int c = 0; c < C; c++) {
                int32_t ss = 1 << (PRECISION_BITS - 1);
                for (int y = 0; y < ymax; y++)
                    ss += (int32_t)in[((size_t)(y + ymin) * w + x) * C + c] * k[y];
                out[((size_t)yy * w + x) * C + c] = clip8(ss);
            }
    }
}

int ditd_image_resize(const uint8_t *in, int w, int h, int C, uint8_t *out, int ow, int oh,
                      ditd_resample fr)
{
    const filter *f = fr == DITD_RESAMPLE_BICUBIC    ? &BICUBIC
                      : fr == DITD_RESAMPLE_BILINEAR ? &BILINEAR
                      : fr == DITD_RESAMPLE_LANCZOS  ? &LANCZOS
                                                     : NULL;
    if (!f)
        return ditd_err_set(DITD_EUNSUPPORTED, "resample %d", (int)fr);
    if (w < 1 || h < 1 || ow < 1 || oh < 1 || C < 1 || C > 4)
        return ditd_err_set(DITD_EINVAL, "resize %dx%d (%d channels) to %dx%d", w, h, C, ow, oh);
    if (w == ow && h == oh) {
        memcpy(out, in, (size_t)w * h * C);
        return 0;
    }
    int *bh = NULL, *bv = NULL, kh = 0, kv = 0, err;
    int32_t *kkh = NULL, *kkv = NULL;
    uint8_t *tmp = NULL;
    if ((err = coeffs(h, oh, f, &bv, &kkv, &kv)) || (err = coeffs(w, ow, f, &bh, &kkh, &kh)))
        goto done;
    /* Pillow 13 runs the vertical pass first when the width grows and the
     * height shrinks (measured: 100 of 100 such sizes), else the horizontal
     * one (docs/wan_pipeline.md: where this is not yet PIL's choice) */
    int vfirst = ow > w && oh < h;
    int tw = vfirst ? w : ow, th = vfirst ? oh : h;
    if (!(tmp = malloc((size_t)tw * th * C))) {
        err = ditd_err_set(DITD_ENOMEM, "resize buffer");
        goto done;
    }
    if (vfirst) {
        vertical(in, w, h, C, tmp, oh, bv, kkv, kv);
        horizontal(tmp, w, oh, C, out, ow, bh, kkh, kh);
    } else if (ow != w) {
        horizontal(in, w, h, C, tmp, ow, bh, kkh, kh);
        if (oh != h)
            vertical(tmp, ow, h, C, out, oh, bv, kkv, kv);
        else
            memcpy(out, tmp, (size_t)ow * h * C);
    } else {
        vertical(in, w, h, C, out, oh, bv, kkv, kv);
    }
    err = 0;
done:
    free(bh);
    free(bv);
    free(kkh);
    free(kkv);
    free(tmp);
    return err;
}
