/* ditd_image_resize (PIL's Lanczos, engine/core/image_resize.h) timed:
 * IN (raw RGB bytes, W x H) to OW x OH, REPEAT times; prints the
 * milliseconds of each on one line and writes the result to OUT (raw) for
 * a comparison with PIL's. tools/bench_img2img_flux.py runs it. Not a test.
 *
 *   resize_eval IN W H OW OH REPEAT OUT */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "engine/core/error.h"
#include "engine/core/image_resize.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(int argc, char **argv)
{
    if (argc != 8) {
        fprintf(stderr, "usage: %s IN W H OW OH REPEAT OUT\n", argv[0]);
        return 2;
    }
    int w = atoi(argv[2]), h = atoi(argv[3]), ow = atoi(argv[4]), oh = atoi(argv[5]);
    int rep = atoi(argv[6]);
    if (w < 1 || h < 1 || ow < 1 || oh < 1 || rep < 1)
        return 2;
    size_t n = (size_t)w * h * 3, on = (size_t)ow * oh * 3;
    uint8_t *in = malloc(n), *out = malloc(on);
    FILE *f = fopen(argv[1], "rb");
    if (!in || !out || !f || fread(in, 1, n, f) != n)
        return 2;
    fclose(f);
    for (int r = 0; r < rep; r++) {
        double t0 = now();
        if (ditd_image_resize(in, w, h, 3, out, ow, oh)) {
            fprintf(stderr, "%s\n", ditd_err_detail());
            return 1;
        }
        printf("%s%.3f", r ? " " : "", 1e3 * (now() - t0));
    }
    printf("\n");
    f = fopen(argv[7], "wb");
    if (!f || fwrite(out, 1, on, f) != on)
        return 1;
    fclose(f);
    free(in);
    free(out);
    return 0;
}
