/* `ditd generate`'s files (generate.h): the input image, the clips and
 * images it writes. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/error.h"
#include "engine/io/video_mp4.h"
#include "server/cmd/generate.h"
#include "engine/core/image_resize.h"
#include "server/common/image.h"
#include "server/common/image_in.h"

int ditd__gen_fail(const char *what, int err)
{
    const char *d = ditd_err_detail();
    fprintf(stderr, "ditd generate: %s: %s%s%s\n", what, ditd_strerror(err), *d ? ": " : "", d);
    return 1;
}
/* The leader: writes n clips of F frames (n, F, H, W, 3) as OUT.mp4
 * (OUT-i.mp4 for n > 1) and/or PNG frames OUT-000.png ... (OUT-i-000.png).
 * 0 or 1 (said). */
int ditd__gen_write_clips(const uint8_t *vid, int n, int F, int H, int W, const char *out_path,
                          int mp4, int save_frames, int fps, int quiet, long seed, int steps)
{
    const size_t frame = (size_t)H * W * 3, clip = (size_t)F * frame;
    int err;
    const char *dot = strrchr(out_path, '.');
    int stem = dot && !strchr(dot, '/') ? (int)(dot - out_path) : (int)strlen(out_path);
    for (int i = 0; i < n; i++) {
        char base[4096], path[4200];
        if (n == 1)
            snprintf(base, sizeof base, "%.*s", stem, out_path);
        else
            snprintf(base, sizeof base, "%.*s-%d", stem, out_path, i);
        const uint8_t *c = vid + (size_t)i * clip;
        if (mp4) {
            snprintf(path, sizeof path, "%s.mp4", base);
            if ((err = ditd_video_write_mp4(path, c, F, W, H, fps)))
                return ditd__gen_fail(path, err), 1;
            if (!quiet)
                fprintf(stderr, "wrote %s (%dx%d, %d frames at %d fps, seed %ld, %d steps)\n",
                        path, W, H, F, fps, seed, steps);
        }
        if (mp4 && !save_frames)
            continue;
        for (int f = 0; f < F; f++) {
            snprintf(path, sizeof path, "%s-%03d.png", base, f);
            if ((err = ditd_png_write_file(path, c + (size_t)f * frame, W, H, 3)))
                return ditd__gen_fail(path, err), 1;
        }
        if (!quiet)
            fprintf(stderr, "wrote %s-000.png .. %s-%03d.png (%dx%d, seed %ld, %d steps)\n", base,
                    base, F - 1, W, H, seed, steps);
    }
    return 0;
}

int ditd__gen_read_image(const char *path, int channels, ditd_image *img)
{
    FILE *f = fopen(path, "rb");
    uint8_t *buf = NULL;
    size_t len = 0;
    int err;
    if (f && fseek(f, 0, SEEK_END) == 0) {
        long l = ftell(f);
        if (l >= 0 && (size_t)l <= DITD_IMAGE_MAX_BYTES_DEFAULT && fseek(f, 0, SEEK_SET) == 0 &&
            (buf = malloc((size_t)l + 1)) && fread(buf, 1, (size_t)l, f) == (size_t)l)
            len = (size_t)l;
    }
    if (f)
        fclose(f);
    err = len ? ditd_image_decode(buf, len, NULL, img)
              : ditd_err_set(DITD_EIO, "cannot read %s (at most %zu bytes)", path,
                             DITD_IMAGE_MAX_BYTES_DEFAULT);
    free(buf);
    if (err)
        return err;
    if (channels == 3 && img->channels == 4) { /* RGBA: the color, as PIL's convert("RGB") */
        size_t np = (size_t)img->width * img->height;
        for (size_t i = 0; i < np; i++)
            memmove(img->pixels + 3 * i, img->pixels + 4 * i, 3);
        img->channels = 3;
    }
    return 0;
}

int ditd__gen_resize_image(ditd_image *img, int w, int h)
{
    const size_t np = (size_t)img->width * img->height;
    if (w == img->width && h == img->height) { /* no resize: the color (convert("RGB")) */
        for (size_t i = 0; img->channels == 4 && i < np; i++)
            memmove(img->pixels + 3 * i, img->pixels + 4 * i, 3);
        img->channels = 3;
        return 0;
    }
    if (w < 1 || h < 1 || w > DITD_IMAGE_RESIZE_MAX_SIDE || h > DITD_IMAGE_RESIZE_MAX_SIDE ||
        (long)w * h > DITD_IMAGE_RESIZE_MAX_PIXELS)
        return ditd_err_set(DITD_EINVAL, "size %dx%d: over the resize limits", w, h);
    uint8_t *out = malloc((size_t)w * h * 3);
    if (!out)
        return ditd_err_set(DITD_ENOMEM, "resize to %dx%d", w, h);
    int err = img->channels == 4
                  ? ditd_image_resize_rgba(img->pixels, img->width, img->height, out, w, h)
                  : ditd_image_resize(img->pixels, img->width, img->height, 3, out, w, h);
    if (err) {
        free(out);
        return err;
    }
    free(img->pixels);
    img->pixels = out;
    img->width = w;
    img->height = h;
    img->channels = 3;
    return 0;
}

int ditd__gen_reference_pixels(const ditd_image *img, int w, int h, uint8_t **out)
{
    *out = NULL;
    if (img->channels != 3 && img->channels != 4)
        return ditd_err_set(DITD_EINVAL, "a reference image of %d channels (RGB or RGBA)",
                            img->channels);
    if (img->width == w && img->height == h && img->channels == 3)
        return 0;
    /* VaeImageProcessor.resize to the chosen resolution (PIL's Lanczos, RGBA
     * premultiplied), then the color (convert("RGB")) */
    if (w < 1 || h < 1 || w > DITD_IMAGE_RESIZE_MAX_SIDE || h > DITD_IMAGE_RESIZE_MAX_SIDE ||
        (long)w * h > DITD_IMAGE_RESIZE_MAX_PIXELS)
        return ditd_err_set(DITD_EINVAL, "reference size %dx%d: over the resize limits", w, h);
    uint8_t *px = malloc((size_t)w * h * 3);
    if (!px)
        return ditd_err_set(DITD_ENOMEM, "reference resize to %dx%d", w, h);
    int err = 0;
    if (img->width == w && img->height == h)
        for (size_t i = 0; i < (size_t)w * h; i++)
            memcpy(px + 3 * i, img->pixels + 4 * i, 3);
    else if (img->channels == 4)
        err = ditd_image_resize_rgba(img->pixels, img->width, img->height, px, w, h);
    else
        err = ditd_image_resize(img->pixels, img->width, img->height, 3, px, w, h);
    if (err) {
        free(px);
        return err;
    }
    *out = px;
    return 0;
}
