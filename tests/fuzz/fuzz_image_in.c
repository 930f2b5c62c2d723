/* libFuzzer target: uploaded-image decoding (server/common/image_in.c):
 * format sniffing, the PNG / JPEG / WebP header checks (ditd_image_probe:
 * no pixels, the decode's size) and decoders, the
 * EXIF orientation parser on the raw bytes. Limits are small (1024 a side,
 * 1 Mpixel), so an accepted header never asks for much memory. */
#include <stdint.h>
#include <stdlib.h>

#include "engine/core/error.h"
#include "server/common/image_in.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ditd_image_limits lim = {.max_bytes = 1 << 20, .max_dim = 1024, .max_pixels = 1 << 20};
    ditd_image im;
    uint64_t before = ditd_image_pixel_bytes_allocated();
    /* the header probe: never pixels, and the size it gives is the decode's */
    ditd_image hdr;
    int prc = ditd_image_probe(data, size, &lim, &hdr);
    if (hdr.pixels || ditd_image_pixel_bytes_allocated() != before)
        abort();
    int rc = ditd_image_decode(data, size, &lim, &im);
    if (rc == 0 && (prc != 0 || hdr.width != im.width || hdr.height != im.height))
        abort();
    if (rc == 0) {
        if (!im.pixels || im.width <= 0 || im.height <= 0 || im.width > 1024 || im.height > 1024 ||
            (im.channels != 3 && im.channels != 4) || im.orientation < 1 || im.orientation > 8)
            abort();
        /* touch every byte: the buffer is as large as claimed */
        volatile uint8_t sum = 0;
        for (size_t i = 0; i < (size_t)im.width * im.height * im.channels; i++)
            sum += im.pixels[i];
        (void)sum;
        ditd_image_free(&im);
    } else {
        if (im.pixels || ditd_err_detail()[0] == '\0')
            abort();
        /* a refusal from the size checks allocated nothing for pixels */
        if (rc == DITD_ERANGE && ditd_image_pixel_bytes_allocated() != before)
            abort();
    }
    int o = ditd_image_exif_orientation(data, size);
    if (o < 1 || o > 8)
        abort();
    return 0;
}
