/* ditd_cpu_attention and ditd_cpu_attention_merge against a float64
 * reference (plain softmax(scale q k^T) v per query, no tiling).
 *
 * Tolerances (whole tensor):
 *   o:   max|got - ref| / max|ref|          <= 5e-6
 *   lse: max|got - ref| / max(max|ref|, 1)  <= 1e-6
 *   merge of attention over keys [0, k) and [k, Nk) against the reference
 *   over all keys: the same tolerances.
 * Also: padding columns of o (ld > H*Dh) are never written; results do not
 * depend on the number of threads (bitwise); Nk = 0 is the empty result.
 * Every case runs twice: on the kernel's default path (AVX-512 where the CPU
 * has it) and on the portable one (DITD_CPU_ATTN_ISA=portable).
 */
#include "kernels/cpu/cpu_kernels.h"
#include "tests/kernels/kt_common.h"

#include <omp.h>
#include <stdlib.h>
#include <string.h>

typedef struct shape {
    int B, Nq, Nk, H, Dh;
    float scale_mul; /* scale = scale_mul / sqrt(Dh) */
    float amp;       /* inputs uniform in (-amp, amp) */
} shape;

/* o (B, Nq, H*Dh) contiguous, lse (B, H, Nq), in double. */
static void reference(const float *q, size_t ldq, const float *k, size_t ldk, const float *v,
                      size_t ldv, double *o, double *lse, int B, int Nq, int Nk, int H, int Dh,
                      double scale)
{
    double *s = kt_alloc(sizeof(double) * (size_t)(Nk > 0 ? Nk : 1));
    for (int b = 0; b < B; ++b)
        for (int h = 0; h < H; ++h)
            for (int i = 0; i < Nq; ++i) {
                const float *qi = q + ((size_t)b * Nq + i) * ldq + (size_t)h * Dh;
                double m = -INFINITY;
                for (int j = 0; j < Nk; ++j) {
                    const float *kj = k + ((size_t)b * Nk + j) * ldk + (size_t)h * Dh;
                    double d = 0.0;
                    for (int e = 0; e < Dh; ++e)
                        d += (double)qi[e] * (double)kj[e];
                    s[j] = scale * d;
                    if (s[j] > m)
                        m = s[j];
                }
                double l = 0.0;
                for (int j = 0; j < Nk; ++j) {
                    s[j] = exp(s[j] - m);
                    l += s[j];
                }
                double *oi = o + (((size_t)b * Nq + i) * H + h) * Dh;
                for (int e = 0; e < Dh; ++e) {
                    double acc = 0.0;
                    for (int j = 0; j < Nk; ++j)
                        acc += s[j] * (double)v[((size_t)b * Nk + j) * ldv + (size_t)h * Dh + e];
                    oi[e] = acc / l;
                }
                lse[((size_t)b * H + h) * Nq + i] = m + log(l);
            }
    free(s);
}

/* Copies rows [j0, j0 + n) of every batch of x (B, N, ld) into (B, n, ld). */
static float *slice_rows(const float *x, size_t ld, int B, int N, int j0, int n)
{
    float *out = kt_alloc(sizeof(float) * (size_t)B * (size_t)(n > 0 ? n : 1) * ld);
    for (int b = 0; b < B; ++b)
        memcpy(out + (size_t)b * n * ld, x + ((size_t)b * N + j0) * ld,
               sizeof(float) * (size_t)n * ld);
    return out;
}

/* o (ldo) -> contiguous (B*Nq, H*Dh) */
static void gather_o(const float *o, size_t ldo, float *dst, int rows, int HD)
{
    for (int r = 0; r < rows; ++r)
        memcpy(dst + (size_t)r * HD, o + (size_t)r * ldo, sizeof(float) * (size_t)HD);
}

static int check_shape(kt_rng *rng, shape sh)
{
    const int B = sh.B, Nq = sh.Nq, Nk = sh.Nk, H = sh.H, Dh = sh.Dh, HD = H * Dh;
    const float scale = sh.scale_mul / sqrtf((float)Dh);
    /* q in its own buffer with padded rows; k and v interleaved in one fused
     * (B, Nk, 2*H*Dh + 3) buffer, as views into a fused KV projection; o with
     * padded rows. */
    const size_t ldq = (size_t)HD + 5, ldkv = 2 * (size_t)HD + 3, ldo = (size_t)HD + 7;
    float *q = kt_alloc(sizeof(float) * (size_t)B * Nq * ldq);
    float *kv = kt_alloc(sizeof(float) * (size_t)B * Nk * ldkv + 1);
    float *o = kt_alloc(sizeof(float) * (size_t)B * Nq * ldo);
    float *o1 = kt_alloc(sizeof(float) * (size_t)B * Nq * ldo);
    float *lse = kt_alloc(sizeof(float) * (size_t)B * H * Nq);
    float *lse1 = kt_alloc(sizeof(float) * (size_t)B * H * Nq);
    float *og = kt_alloc(sizeof(float) * (size_t)B * Nq * HD);
    double *oref = kt_alloc(sizeof(double) * (size_t)B * Nq * HD);
    double *lref = kt_alloc(sizeof(double) * (size_t)B * H * Nq);
    kt_fill(rng, q, (size_t)B * Nq * ldq, -sh.amp, sh.amp);
    kt_fill(rng, kv, (size_t)B * Nk * ldkv, -sh.amp, sh.amp);
    const float *k = kv, *v = kv + HD;
    const float sentinel = -777.0f;
    for (size_t i = 0; i < (size_t)B * Nq * ldo; ++i)
        o[i] = sentinel;

    char tag[128];
    snprintf(tag, sizeof tag, "B=%d Nq=%d Nk=%d H=%d Dh=%d scale=%.3g amp=%g", B, Nq, Nk, H,
             Dh, (double)scale, (double)sh.amp);
    char what[200];
    int fail = 0;

    reference(q, ldq, k, ldkv, v, ldkv, oref, lref, B, Nq, Nk, H, Dh, (double)scale);
    ditd_cpu_attention(q, ldq, k, ldkv, v, ldkv, o, ldo, lse, B, Nq, Nk, H, Dh, scale);
    for (int r = 0; r < B * Nq; ++r)
        for (size_t c = (size_t)HD; c < ldo; ++c)
            if (o[(size_t)r * ldo + c] != sentinel) {
                if (!fail)
                    printf("    %s: padding o[%d][%zu] overwritten\n", tag, r, c);
                fail = 1;
            }
    gather_o(o, ldo, og, B * Nq, HD);
    snprintf(what, sizeof what, "attn o   %s", tag);
    fail |= kt_check(what, og, oref, (size_t)B * Nq * HD, 0.0, 5e-6);
    snprintf(what, sizeof what, "attn lse %s", tag);
    fail |= kt_check(what, lse, lref, (size_t)B * H * Nq, 1.0, 1e-6);

    /* One thread gives the same bits (tasks are independent). */
    const int nthreads = omp_get_max_threads();
    omp_set_num_threads(1);
    ditd_cpu_attention(q, ldq, k, ldkv, v, ldkv, o1, ldo, lse1, B, Nq, Nk, H, Dh, scale);
    omp_set_num_threads(nthreads);
    for (int r = 0; r < B * Nq; ++r)
        if (memcmp(o1 + (size_t)r * ldo, o + (size_t)r * ldo, sizeof(float) * (size_t)HD)) {
            printf("    %s: 1 thread and %d threads differ at row %d\n", tag, nthreads, r);
            fail = 1;
            break;
        }

    /* Split the keys at ks, attend to each part, merge by LSE. */
    if (Nk >= 2) {
        const int ks = Nk / 3 > 0 ? Nk / 3 : 1;
        float *ka = slice_rows(kv, ldkv, B, Nk, 0, ks);
        float *kb = slice_rows(kv, ldkv, B, Nk, ks, Nk - ks);
        ditd_cpu_attention(q, ldq, ka, ldkv, ka + HD, ldkv, o, ldo, lse, B, Nq, ks, H, Dh,
                           scale);
        ditd_cpu_attention(q, ldq, kb, ldkv, kb + HD, ldkv, o1, ldo, lse1, B, Nq, Nk - ks, H,
                           Dh, scale);
        ditd_cpu_attention_merge(o, ldo, lse, o1, ldo, lse1, B, Nq, H, Dh);
        gather_o(o, ldo, og, B * Nq, HD);
        snprintf(what, sizeof what, "merge o   [0,%d)+[%d,%d) %s", ks, ks, Nk, tag);
        fail |= kt_check(what, og, oref, (size_t)B * Nq * HD, 0.0, 5e-6);
        snprintf(what, sizeof what, "merge lse [0,%d)+[%d,%d) %s", ks, ks, Nk, tag);
        fail |= kt_check(what, lse, lref, (size_t)B * H * Nq, 1.0, 1e-6);
        free(ka);
        free(kb);
    }

    /* Empty accumulator (lse = -inf) merged with the full result: the full
     * result; then merging an empty block (Nk = 0) changes nothing. */
    for (size_t i = 0; i < (size_t)B * Nq * ldo; ++i)
        o[i] = sentinel;
    for (size_t i = 0; i < (size_t)B * H * Nq; ++i)
        lse[i] = -INFINITY;
    ditd_cpu_attention(q, ldq, k, ldkv, v, ldkv, o1, ldo, lse1, B, Nq, Nk, H, Dh, scale);
    ditd_cpu_attention_merge(o, ldo, lse, o1, ldo, lse1, B, Nq, H, Dh);
    ditd_cpu_attention(q, ldq, k, ldkv, v, ldkv, o1, ldo, lse1, B, Nq, 0, H, Dh, scale);
    ditd_cpu_attention_merge(o, ldo, lse, o1, ldo, lse1, B, Nq, H, Dh);
    gather_o(o, ldo, og, B * Nq, HD);
    snprintf(what, sizeof what, "merge o   empty+all+empty %s", tag);
    fail |= kt_check(what, og, oref, (size_t)B * Nq * HD, 0.0, 5e-6);
    snprintf(what, sizeof what, "merge lse empty+all+empty %s", tag);
    fail |= kt_check(what, lse, lref, (size_t)B * H * Nq, 1.0, 1e-6);

    free(q);
    free(kv);
    free(o);
    free(o1);
    free(lse);
    free(lse1);
    free(og);
    free(oref);
    free(lref);
    return fail;
}

int main(void)
{
    kt_rng rng = {0x5eed0002u};
    const shape shapes[] = {
        /* B, Nq, Nk, H, Dh, scale_mul, amp */
        {1, 49, 49, 3, 8, 1.0f, 1.0f},
        {2, 50, 77, 6, 16, 1.0f, 1.0f},
        {1, 1, 1, 1, 72, 1.0f, 1.0f},
        {2, 1, 130, 2, 72, 1.0f, 1.0f},
        {1, 130, 1, 2, 72, 1.0f, 1.0f},
        {2, 256, 256, 2, 72, 1.0f, 1.0f},
        {1, 65, 129, 3, 64, 1.0f, 1.0f},
        {1, 64, 64, 3, 40, 1.0f, 1.0f},
        {1, 70, 200, 2, 128, 1.0f, 1.0f},
        {1, 9, 70, 1, 256, 1.0f, 1.0f},
        {1, 33, 31, 3, 5, 1.0f, 1.0f},
        /* sharp softmax: scores spread over tens of units, so the running
         * max changes between key tiles and most weights underflow */
        {1, 100, 300, 2, 64, 1.0f, 3.0f},
        {2, 49, 150, 3, 72, 4.0f, 2.0f},
        /* several key tiles with a partial last one, every query-vector
         * count (1..4 of 16) in the last query block: DiT-XL/2's Dh = 72,
         * FLUX's 128, an odd Dh, the largest */
        {1, 243, 389, 2, 72, 1.0f, 1.0f},
        {2, 130, 197, 2, 128, 1.0f, 2.0f},
        {1, 97, 100, 2, 100, 1.0f, 1.0f},
        {1, 17, 40, 1, DITD_CPU_ATTN_MAX_DH, 1.0f, 1.0f},
    };
    const size_t nshapes = sizeof shapes / sizeof shapes[0];
    const char *paths[] = {NULL, "portable"}; /* DITD_CPU_ATTN_ISA */
    int fail = 0;
    size_t checked = 0;
    for (int p = 0; p < 2; ++p) {
        if (paths[p])
            setenv("DITD_CPU_ATTN_ISA", paths[p], 1);
        else
            unsetenv("DITD_CPU_ATTN_ISA");
        printf("path: %s\n", paths[p] ? paths[p] : "default");
        for (size_t i = 0; i < nshapes; ++i) {
            fail |= check_shape(&rng, shapes[i]);
            ++checked;
        }
    }
    unsetenv("DITD_CPU_ATTN_ISA");
    if (checked < 2 * nshapes || nshapes < 17) {
        printf("test_attention: only %zu cases checked\n", checked);
        fail = 1;
    }
    printf(fail ? "test_attention: FAILED\n" : "test_attention: ok\n");
    return fail;
}
