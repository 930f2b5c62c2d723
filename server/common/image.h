/* PNG encoding of raw 8-bit pixels (libpng), to memory or to a file.
 *
 * Pixels are row-major interleaved: channels 1 (gray), 3 (RGB) or 4 (RGBA).
 * Thread-safe (no shared state): the front-end runs it on libuv's work queue.
 */
#ifndef DITD_SERVER_IMAGE_H
#define DITD_SERVER_IMAGE_H

#include <stddef.h>
#include <stdint.h>

/* Encodes to a malloc'd buffer: *out (owned by the caller, free()), *out_len. */
int ditd_png_encode(const uint8_t *pixels, int width, int height, int channels,
                    uint8_t **out, size_t *out_len);

/* Encodes and writes atomically (temporary file + rename). */
int ditd_png_write_file(const char *path, const uint8_t *pixels, int width, int height,
                        int channels);

#endif
