/* 2-D convolution on the CPU (kernels/cpu/image_kernels.h): PyTorch
 * nn.Conv2d, dilation 1, groups 1, any k, s and asymmetric zero padding.
 *
 * Three ways to compute it, one chosen per process (conv_init):
 *   - direct, AVX-512 (the default on a CPU with AVX-512F): no im2col. The
 *     output pixels of a plane are taken flat (row-major, p = oy Wo + ox) in
 *     blocks of 64; a micro-kernel holds a block of 6 output channels x 64
 *     pixels in 24 zmm registers and, per (tap, input channel), loads 4
 *     vectors of the input plane shifted by the tap (masked: lanes whose tap
 *     falls in the zero padding, or past the last pixel, read 0) and
 *     broadcasts 6 weights straight from w's (Cout, Cin, k, k) layout:
 *     24 FMAs. This needs Wo == Wx and s == 1 (a tap is then a constant
 *     shift of the flat index); other shapes (the encoder's stride 2) first
 *     copy their taps into an im2col buffer and run the same micro-kernel on
 *     it as a 1x1 convolution over Cin k k channels.
 *   - direct, portable: the same loops and order in plain C, vectorized by
 *     the compiler (CPUs without AVX-512F, or DITD_CPU_CONV=portable).
 *   - gemm: the readable reference, im2col in chunks of output rows and one
 *     cblas_sgemm per chunk (DITD_CPU_CONV=gemm), kept for comparisons
 *     (given no scratch for its im2col, a call takes the direct kernel).
 *
 * Numerics (why the direct kernel is ours): every output element is
 *     y = b + sum over passes (sum over taps (sum over the pass's channels)),
 * fma by fma in that order, a pass being CONV_PASS_K (tap, channel) steps
 * (128 channels of a 3x3), its partial sum carried in y between passes. The
 * order depends on (Cin, k, s, pads) only: not on which rows or how many
 * a call is given, where in a block a pixel falls, nor on the thread count
 * (threads share out whole (pixel block, channel group) items). A rank that
 * computes a band of rows therefore gets, bit for bit, what one rank gets
 * for the whole image (the parallel VAE decode relies on it). OpenBLAS's
 * sgemm gives no such promise: with its Haswell kernels (an AVX2 CPU, or
 * OPENBLAS_CORETYPE=Haswell) an element's bits change with the GEMM's
 * column count and with the number of threads (docs/vae.md), which is why
 * the gemm path is not the default.
 */
#include "kernels/cpu/image_kernels.h"

#include <assert.h>
#include <cblas.h>
#include <omp.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if (defined(__GNUC__) || defined(__clang__)) && defined(__x86_64__)
#define CONV_X86 1
#include <immintrin.h>
#else
#define CONV_X86 0
#endif

enum {
    CONV_MR = 6,       /* output channels per micro-kernel */
    CONV_NV = 4,       /* 16-lane vectors of pixels per micro-kernel */
    CONV_NP = 64,      /* pixels per block */
    CONV_PASS_K = 1152, /* (tap, channel) steps per pass: 128 channels of a 3x3; its
                         * tile of 64 pixels is 288 KiB, in L2 (measured: 72 to 1152
                         * steps, longer passes ran faster) */
    CONV_MAX_TAPS = 49 /* k <= 7 on the direct path (larger k: im2col) */
};

typedef enum conv_path { PATH_AVX512, PATH_PORTABLE, PATH_GEMM } conv_path;

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static conv_path g_path;

static void conv_init(void)
{
    const char *e = getenv("DITD_CPU_CONV");
    int avx512 = 0;
#if CONV_X86
    avx512 = __builtin_cpu_supports("avx512f");
#endif
    if (e && strcmp(e, "gemm") == 0)
        g_path = PATH_GEMM;
    else if ((e && strcmp(e, "portable") == 0) || !avx512)
        g_path = PATH_PORTABLE;
    else
        g_path = PATH_AVX512;
}

const char *ditd_cpu_conv2d_info(void)
{
    pthread_once(&g_once, conv_init);
    switch (g_path) {
    case PATH_AVX512: return "direct (ditd, avx512)";
    case PATH_PORTABLE: return "direct (ditd, portable C)";
    default: return "im2col + OpenBLAS sgemm (DITD_CPU_CONV=gemm)";
    }
}

/* ---- im2col (the gemm path, and the direct kernel's strided shapes) ---- */

/* col (Cin*k*k, n_rows*Wo) for output rows [r0, r0 + n_rows). */
static void im2col(const float *x, size_t psx, float *col, int Cin, int Hx, int Wx, int k, int s,
                   int pad_t, int pad_l, int r0, int n_rows, int Wo)
{
    const int K = Cin * k * k;
    const size_t ncol = (size_t)n_rows * Wo;
#pragma omp parallel for schedule(static)
    for (int kk = 0; kk < K; kk++) {
        const int ci = kk / (k * k), ky = (kk / k) % k, kx = kk % k;
        const float *xp = x + (size_t)ci * psx;
        float *cp = col + (size_t)kk * ncol;
        for (int r = 0; r < n_rows; r++) {
            const int iy = (r0 + r) * s + ky - pad_t;
            float *dst = cp + (size_t)r * Wo;
            if (iy < 0 || iy >= Hx) {
                memset(dst, 0, (size_t)Wo * sizeof *dst);
                continue;
            }
            const float *src = xp + (size_t)iy * Wx;
            if (s == 1) {
                /* ix = ox + kx - pad_l: a shifted copy with zeros at the ends */
                int lo = pad_l - kx, hi = Wx + pad_l - kx; /* ox range reading inside */
                if (lo < 0)
                    lo = 0;
                if (hi > Wo)
                    hi = Wo;
                if (hi < lo)
                    hi = lo;
                for (int ox = 0; ox < lo; ox++)
                    dst[ox] = 0.0f;
                if (hi > lo)
                    memcpy(dst + lo, src + lo + kx - pad_l, (size_t)(hi - lo) * sizeof *dst);
                for (int ox = hi; ox < Wo; ox++)
                    dst[ox] = 0.0f;
            } else {
                for (int ox = 0; ox < Wo; ox++) {
                    const int ix = ox * s + kx - pad_l;
                    dst[ox] = (ix >= 0 && ix < Wx) ? src[ix] : 0.0f;
                }
            }
        }
    }
}

/* ---- the gemm path (reference) ---- */

static void fill_bias(float *y, size_t psy, const float *b, int Cout, size_t off, size_t n)
{
#pragma omp parallel for schedule(static)
    for (int co = 0; co < Cout; co++) {
        float *p = y + (size_t)co * psy + off;
        const float v = b ? b[co] : 0.0f;
        for (size_t i = 0; i < n; i++)
            p[i] = v;
    }
}

static void conv_gemm(const float *xb, size_t psx, const float *w, const float *b, float *yb,
                      size_t psy, float *scratch, size_t scratch_n, int Cin, int Hx, int Wx,
                      int Cout, int k, int s, int pad_t, int pad_l, int Ho, int Wo, int plain_1x1)
{
    const int K = Cin * k * k;
    if (plain_1x1) {
        /* (Cout, HW) = w (Cout, Cin) . x (Cin, HW): no copy at all */
        fill_bias(yb, psy, b, Cout, 0, (size_t)Ho * Wo);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, Cout, Ho * Wo, Cin, 1.0f, w, Cin, xb,
                    (int)psx, 1.0f, yb, (int)psy);
        return;
    }
    int chunk = (int)(scratch_n / ((size_t)K * Wo));
    if (chunk > Ho)
        chunk = Ho;
    for (int r0 = 0; r0 < Ho; r0 += chunk) {
        const int nr = Ho - r0 < chunk ? Ho - r0 : chunk;
        const int ncol = nr * Wo;
        im2col(xb, psx, scratch, Cin, Hx, Wx, k, s, pad_t, pad_l, r0, nr, Wo);
        fill_bias(yb, psy, b, Cout, (size_t)r0 * Wo, (size_t)ncol);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, Cout, ncol, K, 1.0f, w, K, scratch,
                    ncol, 1.0f, yb + (size_t)r0 * Wo, (int)psy);
    }
}

/* ---- the direct kernel ---- */

/* One direct convolution over flat pixels: y (Cout, npix) from x planes
 * (Cin, .) of stride psx, tap t reading x at p + off[t] where valid. The
 * flat input index of output pixel p for tap (ky, kx) is
 * (oy + ky - pad_t) Wx + (ox + kx - pad_l) = p + off[t] when Wx == Wo. */
typedef struct conv_job {
    const float *x, *w, *b;
    float *y;
    size_t psx, psy;
    int Cin, Cout, taps; /* taps = k k; w row of one output channel: Cin taps floats */
    int npix, Wo, Hx, k, pad_t, pad_l;
    ptrdiff_t off[CONV_MAX_TAPS];
} conv_job;

/* Channels per pass: CONV_PASS_K steps of (tap, channel), at least one channel. */
static int pass_channels(int taps)
{
    int c = CONV_PASS_K / taps;
    return c < 1 ? 1 : c;
}

/* The tile of one pass for pixels [p0, p0 + 64): tile[(t nc + c) 64 + l] =
 * x[c0 + c] at p0 + l + off[t] where tap t of pixel p0 + l falls inside
 * the image, else 0 (the zero padding; lanes past npix are 0 too). A plain
 * copy: it changes no value, only where the micro-kernel finds it (aligned,
 * contiguous, in L1 for every micro-block of the item). */
static void pack_tile(const conv_job *j, int p0, int c0, int c1, float *tile)
{
    const int nc = c1 - c0;
    for (int t = 0; t < j->taps; t++) {
        const int ky = t / j->k, kx = t % j->k;
        int lo = CONV_NP, hi = 0; /* lanes [lo, hi) of one row run: see below */
        unsigned char ok[CONV_NP];
        for (int l = 0; l < CONV_NP; l++) {
            const int p = p0 + l;
            int v = 0;
            if (p < j->npix) {
                const int oy = p / j->Wo, ox = p % j->Wo;
                const int iy = oy + ky - j->pad_t, ix = ox + kx - j->pad_l;
                v = iy >= 0 && iy < j->Hx && ix >= 0 && ix < j->Wo;
            }
            ok[l] = (unsigned char)v;
            if (v) {
                lo = l < lo ? l : lo;
                hi = l + 1;
            }
        }
        int all = hi > lo;
        for (int l = lo; l < hi && all; l++)
            all = ok[l];
        for (int c = 0; c < nc; c++) {
            const float *xs = j->x + (size_t)(c0 + c) * j->psx + p0 + j->off[t];
            float *d = tile + ((size_t)t * nc + c) * CONV_NP;
            if (all) { /* one contiguous run of valid lanes */
                memset(d, 0, (size_t)lo * sizeof *d);
                memcpy(d + lo, xs + lo, (size_t)(hi - lo) * sizeof *d);
                memset(d + hi, 0, (size_t)(CONV_NP - hi) * sizeof *d);
            } else {
                for (int l = 0; l < CONV_NP; l++)
                    d[l] = ok[l] ? xs[l] : 0.0f;
            }
        }
    }
}

/* The portable micro-kernel: output channels [co, co + mr) of the block at
 * p0 over one pass (channels [c0, c0 + nc), its tile); first: start from
 * the bias, else from y. The AVX-512 one's order: taps, then channels. */
static void ukr_portable(const conv_job *j, const float *tile, int co, int mr, int p0, int c0,
                         int nc, int first)
{
    float acc[CONV_MR][CONV_NP];
    const int np = j->npix - p0 < CONV_NP ? j->npix - p0 : CONV_NP;
    for (int i = 0; i < mr; i++) {
        const float *yr = j->y + (size_t)(co + i) * j->psy + p0;
        const float bv = j->b ? j->b[co + i] : 0.0f;
        for (int l = 0; l < CONV_NP; l++)
            acc[i][l] = first ? bv : (l < np ? yr[l] : 0.0f);
    }
    const size_t wrow = (size_t)j->Cin * j->taps;
    const float *tv = tile;
    for (int t = 0; t < j->taps; t++)
        for (int c = 0; c < nc; c++, tv += CONV_NP)
            for (int i = 0; i < mr; i++) {
                const float wv = j->w[(size_t)(co + i) * wrow + (size_t)(c0 + c) * j->taps + t];
                for (int l = 0; l < CONV_NP; l++)
                    acc[i][l] += wv * tv[l];
            }
    for (int i = 0; i < mr; i++) {
        float *yr = j->y + (size_t)(co + i) * j->psy + p0;
        for (int l = 0; l < np; l++)
            yr[l] = acc[i][l];
    }
}

#if CONV_X86
#define CONV_TARGET __attribute__((target("avx512f")))
#define CONV_UNROLL _Pragma("GCC unroll 8")

/* The AVX-512 micro-kernel for MR output channels, as a macro over a
 * literal MR (and every loop over the accumulators unrolled) so that the
 * 24 accumulators stay in registers: per (tap, channel) 4 aligned loads of
 * the tile, MR broadcasts of w, 4 MR FMAs. */
#define CONV_UKR(MR)                                                                               \
    static CONV_TARGET void ukr512_##MR(const conv_job *j, const float *tile, int co, int p0,      \
                                        int c0, int nc, int first)                                 \
    {                                                                                              \
        __m512 r[MR][CONV_NV];                                                                     \
        __mmask16 tail[CONV_NV];                                                                   \
        CONV_UNROLL for (int v = 0; v < CONV_NV; v++)                                              \
        {                                                                                          \
            int n = j->npix - p0 - 16 * v;                                                         \
            tail[v] = n >= 16 ? (__mmask16)0xffff : n <= 0 ? 0 : (__mmask16)((1u << n) - 1);       \
        }                                                                                          \
        CONV_UNROLL for (int i = 0; i < MR; i++)                                                   \
        {                                                                                          \
            const float *yr = j->y + (size_t)(co + i) * j->psy + p0;                               \
            CONV_UNROLL for (int v = 0; v < CONV_NV; v++)                                          \
                r[i][v] = first ? _mm512_set1_ps(j->b ? j->b[co + i] : 0.0f)                      \
                                : _mm512_maskz_loadu_ps(tail[v], yr + 16 * v);                     \
        }                                                                                          \
        const size_t wrow = (size_t)j->Cin * j->taps, wstep = (size_t)j->taps;                     \
        const float *tv = tile;                                                                    \
        for (int t = 0; t < j->taps; t++) {                                                        \
            const float *ws = j->w + (size_t)co * wrow + (size_t)c0 * wstep + t;                   \
            for (int c = 0; c < nc; c++, tv += CONV_NP, ws += wstep) {                             \
                const __m512 x0 = _mm512_load_ps(tv), x1 = _mm512_load_ps(tv + 16);                \
                const __m512 x2 = _mm512_load_ps(tv + 32), x3 = _mm512_load_ps(tv + 48);           \
                CONV_UNROLL for (int i = 0; i < MR; i++)                                           \
                {                                                                                  \
                    const __m512 a = _mm512_set1_ps(ws[(size_t)i * wrow]);                         \
                    r[i][0] = _mm512_fmadd_ps(a, x0, r[i][0]);                                     \
                    r[i][1] = _mm512_fmadd_ps(a, x1, r[i][1]);                                     \
                    r[i][2] = _mm512_fmadd_ps(a, x2, r[i][2]);                                     \
                    r[i][3] = _mm512_fmadd_ps(a, x3, r[i][3]);                                     \
                }                                                                                  \
            }                                                                                      \
        }                                                                                          \
        CONV_UNROLL for (int i = 0; i < MR; i++)                                                   \
        {                                                                                          \
            float *yr = j->y + (size_t)(co + i) * j->psy + p0;                                     \
            CONV_UNROLL for (int v = 0; v < CONV_NV; v++)                                          \
                _mm512_mask_storeu_ps(yr + 16 * v, tail[v], r[i][v]);                              \
        }                                                                                          \
    }
CONV_UKR(1)
CONV_UKR(2)
CONV_UKR(3)
CONV_UKR(4)
CONV_UKR(5)
CONV_UKR(6)

typedef void (*ukr512_fn)(const conv_job *, const float *, int, int, int, int, int);
static const ukr512_fn g_ukr512[CONV_MR] = {ukr512_1, ukr512_2, ukr512_3,
                                            ukr512_4, ukr512_5, ukr512_6};
#endif

/* Items: pixel blocks x groups of micro-blocks of output channels (enough
 * groups that every thread has several items); an item packs each pass's
 * tile once and runs it through every micro-block of its group. */
static void conv_direct(const conv_job *j, conv_path path)
{
    const int nblk = (j->npix + CONV_NP - 1) / CONV_NP, nmb = (j->Cout + CONV_MR - 1) / CONV_MR;
    const int T = omp_get_max_threads();
    int ng = (8 * T + nblk - 1) / nblk;
    ng = ng < 1 ? 1 : ng > nmb ? nmb : ng;
    const long items = (long)nblk * ng;
    const int cpp = pass_channels(j->taps);
    const double work = (double)j->npix * j->Cout * j->Cin * j->taps;
#pragma omp parallel if (work > 1e6 && T > 1)
    {
        /* one tile per thread, taps nc <= CONV_PASS_K */
        float *tile = aligned_alloc(64, (size_t)CONV_PASS_K * CONV_NP * sizeof *tile);
        if (!tile) {
            fprintf(stderr, "ditd_cpu_conv2d: out of memory for a %zu-byte tile\n",
                    (size_t)CONV_PASS_K * CONV_NP * sizeof *tile);
            abort();
        }
#pragma omp for schedule(dynamic, 1)
        for (long it = 0; it < items; it++) {
            const int pb = (int)(it / ng), g = (int)(it % ng), p0 = pb * CONV_NP;
            const int mb0 = (int)((long)nmb * g / ng), mb1 = (int)((long)nmb * (g + 1) / ng);
            for (int c0 = 0; c0 < j->Cin; c0 += cpp) {
                const int nc = j->Cin - c0 < cpp ? j->Cin - c0 : cpp;
                pack_tile(j, p0, c0, c0 + nc, tile);
                for (int mb = mb0; mb < mb1; mb++) {
                    const int co = mb * CONV_MR;
                    const int mr = j->Cout - co < CONV_MR ? j->Cout - co : CONV_MR;
#if CONV_X86
                    if (path == PATH_AVX512) {
                        g_ukr512[mr - 1](j, tile, co, p0, c0, nc, c0 == 0);
                        continue;
                    }
#endif
                    (void)path;
                    ukr_portable(j, tile, co, mr, p0, c0, nc, c0 == 0);
                }
            }
        }
        free(tile);
    }
}

void ditd_cpu_conv2d(const float *x, size_t psx, const float *w, const float *b, float *y,
                     size_t psy, float *scratch, size_t scratch_n, int B, int Cin, int Hx,
                     int Wx, int Cout, int k, int s, int pad_t, int pad_b, int pad_l, int pad_r)
{
    const int Ho = ditd_cpu_conv2d_out(Hx, pad_t, pad_b, k, s);
    const int Wo = ditd_cpu_conv2d_out(Wx, pad_l, pad_r, k, s);
    const int K = Cin * k * k;
    const int plain_1x1 = k == 1 && s == 1 && pad_t == 0 && pad_b == 0 && pad_l == 0 && pad_r == 0;
    /* a tap is a shift of the flat pixel index: the direct kernel reads x */
    const int shifted = s == 1 && Wo == Wx && k * k <= CONV_MAX_TAPS;
    assert(Ho > 0 && Wo > 0 && psy >= (size_t)Ho * Wo && psx >= (size_t)Hx * Wx);
    assert(plain_1x1 || shifted || (scratch && scratch_n >= (size_t)K * Wo));
    pthread_once(&g_once, conv_init);

    for (int bi = 0; bi < B; bi++) {
        const float *xb = x + (size_t)bi * Cin * psx;
        float *yb = y + (size_t)bi * Cout * psy;
        if (g_path == PATH_GEMM && (plain_1x1 || (scratch && scratch_n >= (size_t)K * Wo))) {
            conv_gemm(xb, psx, w, b, yb, psy, scratch, scratch_n, Cin, Hx, Wx, Cout, k, s, pad_t,
                      pad_l, Ho, Wo, plain_1x1);
            continue;
        }
        if (shifted) {
            conv_job j = {.x = xb, .w = w, .b = b, .y = yb, .psx = psx, .psy = psy, .Cin = Cin,
                          .Cout = Cout, .taps = k * k, .npix = Ho * Wo, .Wo = Wo, .Hx = Hx, .k = k,
                          .pad_t = pad_t, .pad_l = pad_l};
            for (int t = 0; t < k * k; t++)
                j.off[t] = (ptrdiff_t)(t / k - pad_t) * Wx + (t % k - pad_l);
            conv_direct(&j, g_path);
            continue;
        }
        /* other shapes: the taps copied out (im2col), then the direct kernel
         * as a 1x1 convolution over K channels; an element's order is a
         * function of K alone, whatever the chunk */
        int chunk = (int)(scratch_n / ((size_t)K * Wo));
        if (chunk > Ho)
            chunk = Ho;
        for (int r0 = 0; r0 < Ho; r0 += chunk) {
            const int nr = Ho - r0 < chunk ? Ho - r0 : chunk;
            im2col(xb, psx, scratch, Cin, Hx, Wx, k, s, pad_t, pad_l, r0, nr, Wo);
            conv_job j = {.x = scratch, .w = w, .b = b, .y = yb + (size_t)r0 * Wo,
                          .psx = (size_t)nr * Wo, .psy = psy, .Cin = K, .Cout = Cout, .taps = 1,
                          .npix = nr * Wo, .Wo = nr * Wo, .Hx = 1, .k = 1};
            conv_direct(&j, g_path);
        }
    }
}
