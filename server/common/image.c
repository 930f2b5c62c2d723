/* PNG encoding through libpng's write callbacks into a growing buffer. */
#include "server/common/image.h"

#include <errno.h>
#include <png.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/error.h"

typedef struct membuf {
    uint8_t *data;
    size_t len, cap;
    int oom;
} membuf;

static void mem_write(png_structp png, png_bytep data, png_size_t len)
{
    membuf *mb = png_get_io_ptr(png);
    if (mb->oom)
        return;
    if (mb->len + len > mb->cap) {
        size_t cap = mb->cap ? mb->cap : 4096;
        while (cap < mb->len + len)
            cap *= 2;
        uint8_t *d = realloc(mb->data, cap);
        if (!d) {
            mb->oom = 1;
            return;
        }
        mb->data = d;
        mb->cap = cap;
    }
    memcpy(mb->data + mb->len, data, len);
    mb->len += len;
}

static void mem_flush(png_structp png)
{
    (void)png;
}

int ditd_png_encode(const uint8_t *pixels, int width, int height, int channels,
                    uint8_t **out, size_t *out_len)
{
    static const int types[] = {0, PNG_COLOR_TYPE_GRAY, PNG_COLOR_TYPE_GRAY_ALPHA,
                                PNG_COLOR_TYPE_RGB, PNG_COLOR_TYPE_RGB_ALPHA};
    membuf mb = {0};
    png_structp png;
    png_infop info;
    /* volatile: modified after setjmp and read after longjmp */
    png_bytep *volatile rows = NULL;

    if (width <= 0 || height <= 0 || width > 1 << 16 || height > 1 << 16 || channels < 1 ||
        channels > 4)
        return ditd_err_set(DITD_EINVAL, "png: %dx%d with %d channels", width, height, channels);
    png = png_create_write_struct(PNG_LIBPNG_VER_STRING, NULL, NULL, NULL);
    if (!png)
        return ditd_err_set(DITD_ENOMEM, "png: create");
    info = png_create_info_struct(png);
    if (!info) {
        png_destroy_write_struct(&png, NULL);
        return ditd_err_set(DITD_ENOMEM, "png: info");
    }
    if (setjmp(png_jmpbuf(png))) {
        png_destroy_write_struct(&png, &info);
        free(rows);
        free(mb.data);
        return ditd_err_set(DITD_EINTERNAL, "png: libpng error");
    }
    rows = malloc((size_t)height * sizeof *rows);
    if (!rows) {
        png_destroy_write_struct(&png, &info);
        return ditd_err_set(DITD_ENOMEM, "png: rows");
    }
    for (int y = 0; y < height; y++)
        rows[y] = (png_bytep)pixels + (size_t)y * (size_t)width * (size_t)channels;
    png_set_write_fn(png, &mb, mem_write, mem_flush);
    png_set_IHDR(png, info, (png_uint_32)width, (png_uint_32)height, 8, types[channels],
                 PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
    png_set_rows(png, info, rows);
    png_write_png(png, info, PNG_TRANSFORM_IDENTITY, NULL);
    png_destroy_write_struct(&png, &info);
    free(rows);
    if (mb.oom) {
        free(mb.data);
        return ditd_err_set(DITD_ENOMEM, "png: output buffer");
    }
    *out = mb.data;
    *out_len = mb.len;
    return 0;
}

int ditd_png_write_file(const char *path, const uint8_t *pixels, int width, int height,
                        int channels)
{
    uint8_t *buf;
    size_t len;
    char tmp[4096];
    FILE *f;
    int err = ditd_png_encode(pixels, width, height, channels, &buf, &len);
    if (err)
        return err;
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp) {
        free(buf);
        return ditd_err_set(DITD_EINVAL, "path too long: %s", path);
    }
    f = fopen(tmp, "wb");
    if (!f) {
        free(buf);
        return ditd_err_set(DITD_EIO, "%s: cannot create: %s", tmp, strerror(errno));
    }
    size_t wrote = fwrite(buf, 1, len, f);
    if (fclose(f) != 0 || wrote != len) {
        free(buf);
        remove(tmp);
        return ditd_err_set(DITD_EIO, "%s: write failed", tmp);
    }
    free(buf);
    if (rename(tmp, path) != 0) {
        remove(tmp);
        return ditd_err_set(DITD_EIO, "%s: cannot rename into place: %s", path, strerror(errno));
    }
    return 0;
}
