/* The CPU GEMM layer (kernels/cpu/gemm.c) and its bf16 path.
 *
 * - f32 -> bf16 rounding against an independent definition: of the two bf16
 *   neighbours of x (truncated, and one ulp up), the nearer in float64, the
 *   even one on a tie; NaN stays NaN, infinities stay, overflow goes to inf.
 *   Bit patterns around ties plus 10^6 random ones: exact.
 * - ditd_cpu_linear_bf16 against a float64 reference over the bf16-rounded x,
 *   w and b (the products are exact in fp32, so only the fp32 summation
 *   differs): max|got - ref| / max|ref| <= 2e-6, as the fp32 linear; every
 *   activation, strided x and y, M = 0, 1, and DiT shapes. The padding of y
 *   must stay untouched.
 * - ditd_cpu_patch_embed_bf16 the same way against Conv2d in float64.
 * - ditd_cpu_gemm f32 with bias against float64: 2e-6, on both sides of the
 *   few-rows kernel's threshold (M <= 16).
 * - The packed kernel (kernels/cpu/gemm_packed.c), f32 and bf16, where this
 *   CPU runs it: w packed in place by ditd_cpu_pack_weight (the bytes after
 *   w untouched, the packed bytes a permutation of the original), then
 *   ditd_cpu_gemm_packed against the float64 reference, 2e-6 as above
 *   (bf16: over the bf16-rounded inputs): every M from 1 to 13 and 97 (the
 *   6-row blocks and their tails), N across the 16-column vectors and
 *   64-column panels, K 1 to 129 and across the k passes (2048 f32, 4096
 *   bf16, an odd K), strided x and y (padding untouched), bias f32/bf16 or
 *   none, each activation, M = 0.
 * The suite runs this program twice: as built (oneDNN when found) and with
 * DITD_CPU_GEMM=openblas (the fallback), which must agree with the same
 * references. The first line printed names the library in use.
 */
#include "kernels/cpu/cpu_kernels.h"
#include "tests/kernels/kt_common.h"

#include <string.h>

static float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* The reference rounding, by comparing distances in float64. */
static uint16_t ref_bf16(float x)
{
    uint32_t u = f32_bits(x);
    if (isnan(x))
        return 0xffff; /* any NaN: compared by class below */
    uint16_t lo = (uint16_t)(u >> 16);
    if ((u & 0xffffu) == 0)
        return lo;
    uint16_t hi = (uint16_t)(lo + 1); /* away from zero in magnitude */
    double dx = (double)x, dlo = (double)bits_f32((uint32_t)lo << 16);
    double dhi;
    if ((hi & 0x7fffu) == 0x7f80u) /* one past the largest finite: infinity */
        dhi = (x > 0 ? 1 : -1) * ldexp(1.0, 128);
    else
        dhi = (double)bits_f32((uint32_t)hi << 16);
    double elo = fabs(dx - dlo), ehi = fabs(dhi - dx);
    if (elo < ehi)
        return lo;
    if (ehi < elo)
        return hi;
    return (lo & 1u) ? hi : lo;
}

static int check_rounding(kt_rng *rng)
{
    static const uint32_t fixed[] = {
        0x3f808000u, /* 1 + 2^-8: a tie, lo even -> stays */
        0x3f818000u, /* tie, lo odd -> up */
        0x3f808001u, 0x3f807fffu, 0xbf818000u, 0x00000001u, 0x80000001u, 0x007fffffu,
        0x7f7fffffu, /* largest finite: rounds to inf */
        0xff7fffffu, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0x7f800001u, 0xffc00001u,
        0x00000000u, 0x80000000u, 0x3f800000u,
    };
    int fail = 0;
    size_t n = 0;
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0] + 1000000; i++, n++) {
        float x = i < sizeof fixed / sizeof fixed[0] ? bits_f32(fixed[i])
                                                     : bits_f32((uint32_t)kt_next(rng));
        uint16_t got;
        ditd_cpu_f32_to_bf16(&x, &got, 1);
        float back;
        ditd_cpu_bf16_to_f32(&got, &back, 1);
        int ok;
        if (isnan(x))
            ok = isnan(back);
        else
            ok = got == ref_bf16(x);
        if (!ok) {
            if (!fail)
                printf("    bf16(0x%08x) = 0x%04x, want 0x%04x\n", f32_bits(x), got, ref_bf16(x));
            fail = 1;
        }
    }
    printf("%-58s %zu values %s\n", "f32 -> bf16 round to nearest even", n, fail ? "FAIL" : "exact");
    return fail;
}

static void round_bf16(const float *a, uint16_t *h, double *d, size_t n)
{
    ditd_cpu_f32_to_bf16(a, h, n);
    for (size_t i = 0; i < n; i++) {
        float f;
        ditd_cpu_bf16_to_f32(&h[i], &f, 1);
        d[i] = f;
    }
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

static double ref_act(double x, ditd_cpu_act act)
{
    if (act == DITD_CPU_ACT_GELU_TANH)
        return 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
    if (act == DITD_CPU_ACT_SILU)
        return x / (1.0 + exp(-x));
    return x;
}

/* The float64 reference of act(x w^T + b) over xd (M, K rows of stride
 * ldx), wd (N, K), bd (N, or NULL) into ref, y's written columns copied to
 * got; 1 if y's padding columns [N, ldy) no longer hold the sentinel. */
static int reference_and_padding(const double *xd, size_t ldx, const double *wd, const double *bd,
                                 ditd_cpu_act act, const float *y, size_t ldy, float sentinel,
                                 int M, int N, int K, double *ref, float *got)
{
    int fail = 0;
    for (int i = 0; i < M; ++i) {
        for (int j = 0; j < N; ++j) {
            double s = bd ? bd[j] : 0.0;
            for (int k = 0; k < K; ++k)
                s += xd[(size_t)i * ldx + k] * wd[(size_t)j * K + k];
            ref[(size_t)i * N + j] = ref_act(s, act);
            got[(size_t)i * N + j] = y[(size_t)i * ldy + j];
        }
        for (size_t j = (size_t)N; j < ldy; ++j)
            if (y[(size_t)i * ldy + j] != sentinel) {
                printf("    row %d: padding column %zu overwritten\n", i, j);
                fail = 1;
            }
    }
    return fail;
}

static int check_linear_bf16(kt_rng *rng, int M, int N, int K, size_t pad_x, size_t pad_y,
                             int with_bias, ditd_cpu_act act)
{
    const size_t ldx = (size_t)K + pad_x, ldy = (size_t)N + pad_y;
    float *x = kt_alloc(sizeof(float) * (size_t)M * ldx);
    float *w = kt_alloc(sizeof(float) * (size_t)N * K);
    float *b = kt_alloc(sizeof(float) * (size_t)N);
    uint16_t *wh = kt_alloc(2 * (size_t)N * K), *bh = kt_alloc(2 * (size_t)N);
    uint16_t *xh = kt_alloc(2 * (size_t)M * ldx + 2);
    double *xd = kt_alloc(sizeof(double) * (size_t)M * ldx + 8);
    double *wd = kt_alloc(sizeof(double) * (size_t)N * K), *bd = kt_alloc(sizeof(double) * N);
    float *y = kt_alloc(sizeof(float) * (size_t)M * ldy + 4);
    float *got = kt_alloc(sizeof(float) * (size_t)M * N + 4);
    double *ref = kt_alloc(sizeof(double) * (size_t)M * N + 8);
    kt_fill(rng, x, (size_t)M * ldx, -1.0f, 1.0f);
    const float ws = 1.7f / sqrtf((float)K);
    kt_fill(rng, w, (size_t)N * K, -ws, ws);
    kt_fill(rng, b, (size_t)N, -0.5f, 0.5f);
    round_bf16(x, xh, xd, (size_t)M * ldx);
    round_bf16(w, wh, wd, (size_t)N * K);
    round_bf16(b, bh, bd, (size_t)N);
    const float sentinel = 12345.0f;
    for (size_t i = 0; i < (size_t)M * ldy; ++i)
        y[i] = sentinel;

    ditd_cpu_linear_bf16(x, ldx, wh, with_bias ? bh : NULL, y, ldy, M, N, K, act);

    int fail = reference_and_padding(xd, ldx, wd, with_bias ? bd : NULL, act, y, ldy, sentinel,
                                     M, N, K, ref, got);
    char what[160];
    snprintf(what, sizeof what, "linear_bf16 M=%d N=%d K=%d ldx=%zu ldy=%zu bias=%d act=%d", M,
             N, K, ldx, ldy, with_bias, (int)act);
    fail |= kt_check(what, got, ref, (size_t)M * N, 0.0, 2e-6);
    free(x), free(w), free(b), free(wh), free(bh), free(xh), free(xd), free(wd), free(bd);
    free(y), free(got), free(ref);
    return fail;
}

static int check_gemm_f32(kt_rng *rng, int M, int N, int K, size_t ldx, size_t ldy)
{
    float *x = kt_alloc(sizeof(float) * (size_t)M * ldx), *w = kt_alloc(sizeof(float) * N * K);
    float *b = kt_alloc(sizeof(float) * N), *y = kt_alloc(sizeof(float) * (size_t)M * ldy);
    float *got = kt_alloc(sizeof(float) * (size_t)M * N);
    double *ref = kt_alloc(sizeof(double) * (size_t)M * N);
    kt_fill(rng, x, (size_t)M * ldx, -1.0f, 1.0f);
    kt_fill(rng, w, (size_t)N * K, -0.1f, 0.1f);
    kt_fill(rng, b, (size_t)N, -0.5f, 0.5f);
    ditd_cpu_gemm(x, ldx, w, b, 0, y, ldy, M, N, K);
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double s = b[j];
            for (int k = 0; k < K; k++)
                s += (double)x[(size_t)i * ldx + k] * (double)w[(size_t)j * K + k];
            ref[(size_t)i * N + j] = s;
            got[(size_t)i * N + j] = y[(size_t)i * ldy + j];
        }
    char what[160];
    snprintf(what, sizeof what, "gemm f32 + bias M=%d N=%d K=%d ldx=%zu ldy=%zu", M, N, K, ldx,
             ldy);
    int fail = kt_check(what, got, ref, (size_t)M * N, 0.0, 2e-6);
    free(x), free(w), free(b), free(y), free(got), free(ref);
    return fail;
}

static int check_patch_bf16(kt_rng *rng, int B, int C, int Hi, int Wi, int p, int D)
{
    const int gh = Hi / p, gw = Wi / p, N = gh * gw, K = C * p * p;
    size_t nx = (size_t)B * C * Hi * Wi, nw = (size_t)D * K;
    float *x = kt_alloc(sizeof(float) * nx), *w = kt_alloc(sizeof(float) * nw);
    float *b = kt_alloc(sizeof(float) * D), *pos = kt_alloc(sizeof(float) * (size_t)N * D);
    float *y = kt_alloc(sizeof(float) * (size_t)B * N * D);
    float *scratch = kt_alloc(sizeof(float) * (size_t)B * N * K);
    uint16_t *wh = kt_alloc(2 * nw), *bh = kt_alloc(2 * (size_t)D), *xh = kt_alloc(2 * nx);
    double *xd = kt_alloc(8 * nx), *wd = kt_alloc(8 * nw), *bd = kt_alloc(8 * (size_t)D);
    double *ref = kt_alloc(sizeof(double) * (size_t)B * N * D);
    kt_fill(rng, x, nx, -1.0f, 1.0f);
    kt_fill(rng, w, nw, -0.3f, 0.3f);
    kt_fill(rng, b, (size_t)D, -0.5f, 0.5f);
    kt_fill(rng, pos, (size_t)N * D, -1.0f, 1.0f);
    round_bf16(x, xh, xd, nx);
    round_bf16(w, wh, wd, nw);
    round_bf16(b, bh, bd, (size_t)D);
    for (int bb = 0; bb < B; ++bb)
        for (int r = 0; r < gh; ++r)
            for (int c = 0; c < gw; ++c)
                for (int d = 0; d < D; ++d) {
                    double s = bd[d];
                    for (int ch = 0; ch < C; ++ch)
                        for (int i = 0; i < p; ++i)
                            for (int j = 0; j < p; ++j)
                                s += wd[(((size_t)d * C + ch) * p + i) * p + j] *
                                     xd[(((size_t)bb * C + ch) * Hi + r * p + i) * Wi + c * p + j];
                    const int n = r * gw + c;
                    ref[((size_t)bb * N + n) * D + d] = s + (double)pos[(size_t)n * D + d];
                }
    ditd_cpu_patch_embed_bf16(x, wh, bh, pos, y, scratch, B, C, Hi, Wi, p, D);
    char what[160];
    snprintf(what, sizeof what, "patch_embed_bf16 B=%d C=%d %dx%d p=%d D=%d", B, C, Hi, Wi, p, D);
    int fail = kt_check(what, y, ref, (size_t)B * N * D, 0.0, 2e-6);
    free(x), free(w), free(b), free(pos), free(y), free(scratch), free(wh), free(bh), free(xh);
    free(xd), free(wd), free(bd), free(ref);
    return fail;
}

/* The packed kernel on one shape: see the header. Returns 0 when this CPU
 * does not run it for this dtype (nothing checked; *ran stays). */
static int check_packed(kt_rng *rng, int bf16, int M, int N, int K, size_t pad_x, size_t pad_y,
                        int with_bias, ditd_cpu_act act, int *ran)
{
    if (!ditd_cpu_gemm_packs(bf16))
        return 0;
    const size_t ldx = (size_t)K + pad_x, ldy = (size_t)N + pad_y, nw = (size_t)N * K;
    const size_t es = bf16 ? 2 : 4, tail = 64;
    float *x = kt_alloc(sizeof(float) * ((size_t)M * ldx + 1));
    float *w = kt_alloc(sizeof(float) * nw), *b = kt_alloc(sizeof(float) * (size_t)N);
    unsigned char *wp = kt_alloc(nw * es + tail), *orig = kt_alloc(nw * es);
    uint16_t *bh = kt_alloc(2 * (size_t)N), *xh = kt_alloc(2 * ((size_t)M * ldx + 1));
    double *xd = kt_alloc(sizeof(double) * ((size_t)M * ldx + 1)), *wd = kt_alloc(8 * nw);
    double *bd = kt_alloc(sizeof(double) * (size_t)N);
    float *y = kt_alloc(sizeof(float) * ((size_t)M * ldy + 1));
    float *got = kt_alloc(sizeof(float) * ((size_t)M * N + 1));
    double *ref = kt_alloc(sizeof(double) * ((size_t)M * N + 1));
    kt_fill(rng, x, (size_t)M * ldx, -1.0f, 1.0f);
    const float ws = 1.7f / sqrtf((float)K);
    kt_fill(rng, w, nw, -ws, ws);
    kt_fill(rng, b, (size_t)N, -0.5f, 0.5f);
    if (bf16) {
        round_bf16(x, xh, xd, (size_t)M * ldx);
        round_bf16(w, (uint16_t *)wp, wd, nw);
        round_bf16(b, bh, bd, (size_t)N);
    } else {
        memcpy(wp, w, nw * es);
        for (size_t i = 0; i < (size_t)M * ldx; i++)
            xd[i] = x[i];
        for (size_t i = 0; i < nw; i++)
            wd[i] = w[i];
        for (int j = 0; j < N; j++)
            bd[j] = b[j];
    }
    memcpy(orig, wp, nw * es);
    memset(wp + nw * es, 0xa5, tail);
    int fail = 0;
    if (ditd_cpu_pack_weight(wp, bf16, N, K) != 0) {
        printf("    pack_weight failed\n");
        fail = 1;
    }
    for (size_t i = 0; i < tail; i++)
        if (wp[nw * es + i] != 0xa5) {
            printf("    packing wrote past the weight (byte %zu)\n", i);
            fail = 1;
            break;
        }
    /* the same values: compare the sorted element multisets */
    {
        size_t n = nw;
        uint32_t *a = kt_alloc(4 * n), *c = kt_alloc(4 * n);
        for (size_t i = 0; i < n; i++) {
            if (bf16) {
                a[i] = ((uint16_t *)wp)[i];
                c[i] = ((uint16_t *)orig)[i];
            } else {
                memcpy(&a[i], wp + 4 * i, 4);
                memcpy(&c[i], orig + 4 * i, 4);
            }
        }
        qsort(a, n, 4, cmp_u32);
        qsort(c, n, 4, cmp_u32);
        if (memcmp(a, c, 4 * n) != 0) {
            printf("    packed weight is not a permutation of the original\n");
            fail = 1;
        }
        free(a), free(c);
    }
    const float sentinel = 12345.0f;
    for (size_t i = 0; i < (size_t)M * ldy; ++i)
        y[i] = sentinel;
    const void *bias = with_bias ? (bf16 ? (const void *)bh : (const void *)b) : NULL;
    ditd_cpu_gemm_packed(x, ldx, wp, bias, bf16, y, ldy, M, N, K, act);
    fail |= reference_and_padding(xd, ldx, wd, with_bias ? bd : NULL, act, y, ldy, sentinel, M, N,
                                  K, ref, got);
    char what[160];
    snprintf(what, sizeof what, "packed %s M=%d N=%d K=%d ldx=%zu ldy=%zu bias=%d act=%d",
             bf16 ? "bf16" : "f32", M, N, K, ldx, ldy, with_bias, (int)act);
    if (M > 0)
        fail |= kt_check(what, got, ref, (size_t)M * N, 0.0, 2e-6);
    free(x), free(w), free(b), free(wp), free(orig), free(bh), free(xh), free(xd), free(wd);
    free(bd), free(y), free(got), free(ref);
    (*ran)++;
    return fail;
}

/* Every shape of the packed kernel's header, both dtypes. */
static int check_packed_all(kt_rng *rng, int *ran)
{
    static const int Ms[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 97};
    static const int Ns[] = {1, 15, 16, 17, 48, 64, 65, 130};
    static const int Ks[] = {1, 2, 3, 64, 129};
    const ditd_cpu_act acts[] = {DITD_CPU_ACT_NONE, DITD_CPU_ACT_GELU_TANH, DITD_CPU_ACT_SILU};
    int fail = 0, n = 0;
    for (int bf16 = 0; bf16 < 2; bf16++) {
        for (size_t m = 0; m < sizeof Ms / sizeof *Ms; m++)
            for (size_t j = 0; j < sizeof Ns / sizeof *Ns; j++)
                for (size_t k = 0; k < sizeof Ks / sizeof *Ks; k++, n++)
                    fail |= check_packed(rng, bf16, Ms[m], Ns[j], Ks[k], (size_t)(n % 3),
                                         (size_t)(n % 5 == 0 ? 3 : 0), n % 4 != 3, acts[n % 3],
                                         ran);
        fail |= check_packed(rng, bf16, 512, 1152, 1152, 0, 0, 1, DITD_CPU_ACT_GELU_TANH, ran);
        fail |= check_packed(rng, bf16, 2, 6912, 1152, 0, 0, 1, DITD_CPU_ACT_NONE, ran);
        fail |= check_packed(rng, bf16, 300, 32, 1152, 5, 0, 1, DITD_CPU_ACT_NONE, ran);
        fail |= check_packed(rng, bf16, 70, 96, 2050, 0, 3, 1, DITD_CPU_ACT_SILU, ran);
        fail |= check_packed(rng, bf16, 40, 70, 4097, 1, 0, 1, DITD_CPU_ACT_GELU_TANH, ran);
        fail |= check_packed(rng, bf16, 0, 64, 64, 0, 0, 1, DITD_CPU_ACT_NONE, ran);
    }
    return fail;
}

int main(void)
{
    kt_rng rng = {0x5eed0b16u};
    int fail = 0, checks = 0;
    printf("GEMM: %s\n", ditd_cpu_gemm_info());
    fail |= check_rounding(&rng), checks++;
    const ditd_cpu_act acts[] = {DITD_CPU_ACT_NONE, DITD_CPU_ACT_GELU_TANH, DITD_CPU_ACT_SILU};
    for (int a = 0; a < 3; ++a) {
        fail |= check_linear_bf16(&rng, 49, 50, 72, 0, 0, 1, acts[a]), checks++;
        fail |= check_linear_bf16(&rng, 1, 1, 1, 0, 0, 1, acts[a]), checks++;
        fail |= check_linear_bf16(&rng, 50, 33, 8, 3, 5, 0, acts[a]), checks++;
        fail |= check_linear_bf16(&rng, 2, 6912, 1152, 0, 0, 1, acts[a]), checks++;
    }
    fail |= check_linear_bf16(&rng, 64, 96, 4608, 0, 7, 1, DITD_CPU_ACT_NONE), checks++;
    fail |= check_linear_bf16(&rng, 130, 200, 1152, 16, 16, 1, DITD_CPU_ACT_GELU_TANH), checks++;
    fail |= check_linear_bf16(&rng, 0, 16, 16, 0, 0, 1, DITD_CPU_ACT_NONE), checks++;
    /* the few-rows kernel (M <= 16) and the library on either side of it */
    fail |= check_linear_bf16(&rng, 16, 70, 33, 5, 3, 1, DITD_CPU_ACT_SILU), checks++;
    fail |= check_linear_bf16(&rng, 17, 70, 33, 5, 3, 1, DITD_CPU_ACT_SILU), checks++;
    fail |= check_gemm_f32(&rng, 3, 65, 130, 131, 70), checks++;
    fail |= check_gemm_f32(&rng, 16, 200, 1157, 1160, 203), checks++;
    fail |= check_gemm_f32(&rng, 77, 65, 130, 131, 70), checks++;
    fail |= check_gemm_f32(&rng, 512, 96, 1152, 1152, 96), checks++;
    fail |= check_patch_bf16(&rng, 2, 4, 16, 16, 2, 40), checks++;
    fail |= check_patch_bf16(&rng, 1, 3, 8, 12, 4, 24), checks++;
    int packed = 0;
    fail |= check_packed_all(&rng, &packed);
    /* 14 x 8 x 5 + 6 shapes per dtype the CPU runs the packed kernel in;
     * none where it runs neither (no AVX-512, or DITD_CPU_GEMM names a
     * library) */
    int want = (ditd_cpu_gemm_packs(0) ? 566 : 0) + (ditd_cpu_gemm_packs(1) ? 566 : 0);
    if (packed != want) {
        printf("test_gemm: %d packed-kernel checks ran, %d expected\n", packed, want);
        fail = 1;
    }
    checks += packed;
    if (checks < 24) {
        printf("test_gemm: only %d checks ran\n", checks);
        fail = 1;
    }
    printf(fail ? "test_gemm: FAILED\n" : "test_gemm: ok (%d checks)\n", checks);
    return fail;
}
