/* Patch embedding and unpatchify.
 *
 * - ditd_cpu_patch_embed against the plain Conv2d definition (kernel =
 *   stride = p, bias) in float64, flattened to (B, N, D) tokens in row-major
 *   (h, w) order, plus the positional table: max|got - ref| / max|ref| <= 2e-6.
 * - ditd_cpu_unpatchify against the Diffusers definition, element by element
 *   (reshape(B, h, w, p, p, C); einsum "nhwpqc->nchpwq"): exact.
 * - Round trip: patchify (the inverse reshuffle, written here) then
 *   unpatchify gives back the image bit for bit.
 */
#include "kernels/cpu/cpu_kernels.h"
#include "tests/kernels/kt_common.h"

#include <string.h>

static int check_patch_embed(kt_rng *rng, int B, int C, int Hi, int Wi, int p, int D,
                             int with_bias, int with_pos)
{
    const int gh = Hi / p, gw = Wi / p, N = gh * gw, K = C * p * p;
    float *x = kt_alloc(sizeof(float) * (size_t)B * C * Hi * Wi);
    float *w = kt_alloc(sizeof(float) * (size_t)D * K);
    float *b = kt_alloc(sizeof(float) * (size_t)D);
    float *pos = kt_alloc(sizeof(float) * (size_t)N * D);
    float *y = kt_alloc(sizeof(float) * (size_t)B * N * D);
    float *scratch = kt_alloc(sizeof(float) * (size_t)B * N * K);
    double *ref = kt_alloc(sizeof(double) * (size_t)B * N * D);
    kt_fill(rng, x, (size_t)B * C * Hi * Wi, -1.0f, 1.0f);
    kt_fill(rng, w, (size_t)D * K, -0.3f, 0.3f);
    kt_fill(rng, b, (size_t)D, -0.5f, 0.5f);
    kt_fill(rng, pos, (size_t)N * D, -1.0f, 1.0f);

    /* conv2d(x, w, b, stride=p)[b, d, r, c], then flatten(2).transpose(1, 2) */
    for (int bb = 0; bb < B; ++bb)
        for (int r = 0; r < gh; ++r)
            for (int c = 0; c < gw; ++c)
                for (int d = 0; d < D; ++d) {
                    double s = with_bias ? (double)b[d] : 0.0;
                    for (int ch = 0; ch < C; ++ch)
                        for (int i = 0; i < p; ++i)
                            for (int j = 0; j < p; ++j)
                                s += (double)w[(((size_t)d * C + ch) * p + i) * p + j] *
                                     (double)x[(((size_t)bb * C + ch) * Hi + r * p + i) * Wi +
                                               c * p + j];
                    const int n = r * gw + c;
                    if (with_pos)
                        s += (double)pos[(size_t)n * D + d];
                    ref[((size_t)bb * N + n) * D + d] = s;
                }
    ditd_cpu_patch_embed(x, w, with_bias ? b : NULL, with_pos ? pos : NULL, y, scratch, B, C,
                         Hi, Wi, p, D);
    char what[160];
    snprintf(what, sizeof what, "patch_embed B=%d C=%d %dx%d p=%d D=%d bias=%d pos=%d", B, C,
             Hi, Wi, p, D, with_bias, with_pos);
    const int fail = kt_check(what, y, ref, (size_t)B * N * D, 0.0, 2e-6);
    free(x);
    free(w);
    free(b);
    free(pos);
    free(y);
    free(scratch);
    free(ref);
    return fail;
}

/* tokens (B, h*w, p*p*C), per-token layout (p, q, c) -> image (B, C, h*p, w*p) */
static float unpatchify_ref(const float *x, int bb, int c, int yy, int xx, int C, int h, int w,
                            int p)
{
    /* x.reshape(B, h, w, p, p, C)[bb, yy / p, xx / p, yy % p, xx % p, c] */
    const size_t idx = (((((size_t)bb * h + yy / p) * w + xx / p) * p + yy % p) * p + xx % p) *
                           (size_t)C + (size_t)c;
    return x[idx];
}

static int check_unpatchify(kt_rng *rng, int B, int C, int h, int w, int p)
{
    const size_t n = (size_t)B * h * w * p * p * C;
    const int Ho = h * p, Wo = w * p;
    float *tok = kt_alloc(sizeof(float) * n);
    float *img = kt_alloc(sizeof(float) * n);
    float *img2 = kt_alloc(sizeof(float) * n);
    float *tok2 = kt_alloc(sizeof(float) * n);
    kt_fill(rng, tok, n, -1.0f, 1.0f);
    ditd_cpu_unpatchify(tok, img, B, C, h, w, p);
    int fail = 0;
    for (int bb = 0; bb < B && !fail; ++bb)
        for (int c = 0; c < C && !fail; ++c)
            for (int yy = 0; yy < Ho && !fail; ++yy)
                for (int xx = 0; xx < Wo; ++xx) {
                    const float want = unpatchify_ref(tok, bb, c, yy, xx, C, h, w, p);
                    const float got = img[(((size_t)bb * C + c) * Ho + yy) * Wo + xx];
                    if (got != want) {
                        printf("    unpatchify[b=%d c=%d y=%d x=%d]: got %.9g want %.9g\n", bb,
                               c, yy, xx, (double)got, (double)want);
                        fail = 1;
                        break;
                    }
                }

    /* Round trip: image -> patchify -> unpatchify == image. */
    kt_fill(rng, img2, n, -1.0f, 1.0f);
    for (int bb = 0; bb < B; ++bb)
        for (int r = 0; r < h; ++r)
            for (int s = 0; s < w; ++s)
                for (int i = 0; i < p; ++i)
                    for (int j = 0; j < p; ++j)
                        for (int c = 0; c < C; ++c)
                            tok2[(((((size_t)bb * h + r) * w + s) * p + i) * p + j) * C + c] =
                                img2[(((size_t)bb * C + c) * Ho + r * p + i) * Wo + s * p + j];
    ditd_cpu_unpatchify(tok2, img, B, C, h, w, p);
    if (memcmp(img, img2, sizeof(float) * n)) {
        printf("    unpatchify(patchify(x)) != x\n");
        fail = 1;
    }
    printf("%-58s %s\n", "unpatchify", fail ? "FAIL" : "exact");
    printf("    (B=%d C=%d h=%d w=%d p=%d, definition and round trip)\n", B, C, h, w, p);
    free(tok);
    free(img);
    free(img2);
    free(tok2);
    return fail;
}

int main(void)
{
    kt_rng rng = {0x5eed0004u};
    int fail = 0;
    fail |= check_patch_embed(&rng, 2, 4, 16, 16, 2, 72, 1, 1);
    fail |= check_patch_embed(&rng, 1, 1, 28, 28, 4, 48, 1, 1); /* N = 49 */
    fail |= check_patch_embed(&rng, 1, 3, 10, 14, 2, 16, 1, 0); /* non-square */
    fail |= check_patch_embed(&rng, 3, 1, 14, 14, 2, 36, 0, 1); /* N = 49, no bias */
    fail |= check_patch_embed(&rng, 2, 4, 32, 32, 2, 1152, 1, 1); /* DiT-XL/2 at 256 */
    fail |= check_unpatchify(&rng, 2, 8, 16, 16, 2);
    fail |= check_unpatchify(&rng, 1, 1, 7, 7, 4);
    fail |= check_unpatchify(&rng, 3, 2, 5, 7, 2);
    fail |= check_unpatchify(&rng, 1, 3, 1, 1, 3);
    printf(fail ? "test_patch: FAILED\n" : "test_patch: ok\n");
    return fail;
}
