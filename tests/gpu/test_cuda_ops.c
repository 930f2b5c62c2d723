/* GPU: every op of the CUDA backend table (and the kernels beside it: Philox
 * noise, guidance, the sampler's linear update; the Wan VAE's video ops)
 * against the CPU backend, on
 * fresh random inputs; FLUX's rope and rmsnorm_heads are test_cuda_flux's.
 * Exits 77 (skipped) without a GPU.
 *
 * Method: inputs are drawn in f32, uploaded (rounded to bf16) and downloaded
 * again, so both backends compute on the same bf16-representable values;
 * the CPU computes in fp32 (float64 statistics), the GPU in bf16 storage
 * with fp32 arithmetic. Output buffers are poisoned (bf16 NaN) first, so an
 * element the GPU did not write fails. The measure is tu_compare's
 * rel = max|gpu - cpu| / max|cpu|, bounded per op below. The seed is printed
 * (DITD_TEST_SEED repeats a run).
 *
 * The bounds, and why (u = 2^-8, bf16's unit roundoff is u/2 = 2^-9):
 *   exact moves (embedding, unpatchify, im2col, copy2d, conversions): 0
 *   one bf16 rounding of the output (act, add, gated residual, merge,
 *     timestep embedding):                                   BF16_1 = 4e-3
 *   linear (fp32 accumulation, bf16 out, epilogue in fp32):  LINEAR = 8e-3
 *   layernorm + modulate (fp32 statistics, one rounding):    NORM = 8e-3
 *   patch embedding (GEMM + bias, rounded, + pos, rounded):  PATCH = 1.2e-2
 *   attention (P rounded to bf16 before P V, output rounded): ATTN = 1.6e-2;
 *     its LSE in fp32:                                       ATTN_LSE = 1e-5
 *   Philox normals: bit-identical except where CUDA's double libm and
 *     glibc's round a tie differently: at most 1 in 10^4, each within one
 *     float ulp.
 *   fp32 sampler helpers: 1e-6.
 *
 * Running it (docs/cuda.md): every check has a name (--list prints them);
 * `test_cuda_ops NAME...` or DITD_OPS_FILTER=a,b runs only the checks whose
 * name contains one of the words. After each check the compute stream is
 * synchronized and the runtime's last error read, so a fault is named by the
 * check that made it; a sticky fault (the context is lost) stops the run
 * with the command that repeats that check alone. A failed comparison
 * prints its worst element as (b, n, h, d)-style coordinates, and writes
 * both arrays as .npy to DITD_TEST_OUT (else $OUT) when set.
 *
 * Streams: every host<->device transfer and memset of this test is queued
 * on the backend's compute stream (cudaStreamNonBlocking). A cudaMemset or
 * pageable cudaMemcpy on the legacy stream 0 is not ordered with it: the
 * poison could land after the kernel, or a download read before it. */
#include <cuda_runtime_api.h>
#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <sys/stat.h>
#include <time.h>

#include "engine/backend/backend.h"
#include "engine/backend/backend_cuda.h"
#include "engine/core/philox.h"
#include "engine/io/npy.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/dequant.h"
#include "kernels/cuda/cuda_kernels.h"
#include "tests/test_util.h"

#define BF16_1 4e-3
#define LINEAR 8e-3
#define NORM 8e-3
#define PATCH 1.2e-2
#define ATTN 1.6e-2
#define ATTN_LSE 1e-5

static const ditd_backend_ops *G;
static const ditd_backend_ops *C = &ditd_backend_cpu;
static uint64_t rng;
static cudaStream_t ST;     /* the backend's compute stream */
static const char *out_dir; /* DITD_TEST_OUT / OUT: failing arrays as .npy */
static int dumps;

/* ---- comparisons that name the worst element ---- */

/* The logical shape of a compared array, outermost first, with a letter per
 * dimension, e.g. {4, {B, Nq, H, Dh}, "bnhd"}. */
typedef struct shape {
    int nd;
    int64_t d[4];
    const char *names;
} shape;

static shape shp(const char *names, int64_t a, int64_t b, int64_t c, int64_t d)
{
    shape s = {(int)strlen(names), {a, b, c, d}, names};
    return s;
}

static void decode(const shape *s, size_t flat, char *buf, size_t len)
{
    size_t idx[4] = {0, 0, 0, 0}, r = flat;
    int o = 0;
    for (int i = s->nd - 1; i >= 0; i--) {
        idx[i] = r % (size_t)s->d[i];
        r /= (size_t)s->d[i];
    }
    o += snprintf(buf + o, len - (size_t)o, "(");
    for (int i = 0; i < s->nd && o < (int)len; i++)
        o += snprintf(buf + o, len - (size_t)o, "%s%c %zu", i ? ", " : "", s->names[i], idx[i]);
    if (o < (int)len)
        snprintf(buf + o, len - (size_t)o, ")");
}

static void dump(const char *what, const char *suffix, const float *a, const shape *s)
{
    char path[4096], name[200];
    size_t j = 0;
    for (const char *p = what; *p && j + 1 < sizeof name; p++)
        name[j++] = (char)((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
                                   (*p >= '0' && *p <= '9') || *p == '-'
                               ? *p
                               : '_');
    name[j] = 0;
    snprintf(path, sizeof path, "%s/%s.%s.npy", out_dir, name, suffix);
    if (ditd_npy_write_f32(path, s->nd, s->d, a))
        fprintf(stderr, "  (could not write %s: %s)\n", path, ditd_err_detail());
    else
        fprintf(stderr, "  wrote %s\n", path);
}

/* rel = max|got - want| / max|want| <= tol, printed either way; on a
 * failure the worst element's coordinates, and both arrays as .npy. */
static void close_to(const char *what, const float *got, const float *want, const shape *s,
                     double tol)
{
    size_t n = 1;
    char at[160];
    for (int i = 0; i < s->nd; i++)
        n *= (size_t)s->d[i];
    tu_err e = tu_compare(got, want, n);
    int ok = e.rel <= tol;
    tu_checks++;
    printf("%s %s: rel %.3g (max_abs %.3g / max_ref %.3g), rel_l2 %.3g, tol %.1g%s\n",
           ok ? "ok  " : "FAIL", what, e.rel, e.max_abs, e.max_ref, e.rel_l2, tol,
           ok ? "" : "  <--");
    if (ok)
        return;
    tu_failures++;
    decode(s, e.worst, at, sizeof at);
    fprintf(stderr, "  worst element %s = flat %zu: got %.9g, want %.9g\n", at, e.worst,
            (double)got[e.worst], (double)want[e.worst]);
    if (out_dir && dumps < 40) {
        dump(what, "got", got, s);
        dump(what, "want", want, s);
        dumps += 2;
    }
}

static uint64_t next_u64(void)
{
    /* splitmix64 */
    uint64_t z = (rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* uniform in [-scale, scale), never all zeros */
static float *rnd(size_t n, float scale)
{
    float *h = malloc((n ? n : 1) * sizeof *h);
    for (size_t i = 0; i < n; i++)
        h[i] = scale * (float)((double)(next_u64() >> 11) / 4503599627370496.0 - 1.0);
    return h;
}

static float *zeros(size_t n)
{
    return calloc(n ? n : 1, sizeof(float));
}

/* Device bf16 copy of h; h becomes the rounded values both backends use. */
static void *dev_in(float *h, size_t n)
{
    void *d = NULL;
    TU_OK(G->mem_alloc(&d, n * 2));
    G->upload(d, h, n);
    G->download(h, d, n);
    TU_OK(G->status());
    return d;
}

/* A device buffer of n bf16, poisoned with NaN (in stream order). */
static void *dev_out(size_t n)
{
    void *d = NULL;
    TU_OK(G->mem_alloc(&d, n * 2));
    TU_CHECK(cudaMemsetAsync(d, 0xff, n * 2, ST) == cudaSuccess, "poison");
    return d;
}

static float *down(const void *d, size_t n)
{
    float *h = malloc((n ? n : 1) * sizeof *h);
    G->download(h, d, n);
    TU_OK(G->status());
    return h;
}

/* Device f32 copy of h, or n poisoned floats; in stream order. */
static float *dev_f32(const float *h, size_t n)
{
    float *d = NULL;
    TU_CHECK(cudaMalloc((void **)&d, n * sizeof(float)) == cudaSuccess, "cudaMalloc");
    if (h)
        TU_CHECK(cudaMemcpyAsync(d, h, n * sizeof(float), cudaMemcpyHostToDevice, ST) ==
                     cudaSuccess,
                 "upload f32");
    else
        TU_CHECK(cudaMemsetAsync(d, 0xff, n * sizeof(float), ST) == cudaSuccess, "poison f32");
    return d;
}

/* After everything queued on the compute stream. */
static float *down_f32(const float *d, size_t n)
{
    float *h = malloc(n * sizeof *h);
    TU_CHECK(cudaMemcpyAsync(h, d, n * sizeof(float), cudaMemcpyDeviceToHost, ST) ==
                     cudaSuccess &&
                 cudaStreamSynchronize(ST) == cudaSuccess,
             "download f32");
    return h;
}

/* ---- linear ---- */

/* lt: a DiT shape, which must get a cuBLASLt algorithm (not the fallback) */
static void check_linear(int M, int N, int K, size_t ldx, size_t ldy, int bias, ditd_act act,
                         int lt)
{
    int fb0 = ditd_backend_cuda_gemm_fallbacks();
    shape sh = shp("mn", M, (int64_t)ldy, 0, 0);
    char what[160];
    float *x = rnd((size_t)M * ldx, 1.0f), *w = rnd((size_t)N * K, 0.05f);
    float *b = rnd((size_t)N, 0.5f), *y = zeros((size_t)M * ldy);
    void *dx = dev_in(x, (size_t)M * ldx), *dw = dev_in(w, (size_t)N * K);
    void *db = dev_in(b, (size_t)N), *dy = dev_out((size_t)M * ldy);
    /* the CPU reference reads its weights re-laid (backend.h pack_linear) */
    float *wc = malloc(sizeof(float) * (size_t)N * K);
    if (!wc || ditd_pack_linear(C, memcpy(wc, w, sizeof(float) * (size_t)N * K), N, K)) {
        fprintf(stderr, "check_linear: no memory for the CPU's copy of w\n");
        exit(1);
    }
    C->linear(x, ldx, wc, bias ? b : NULL, y, ldy, M, N, K, act);
    free(wc);
    G->linear(dx, ldx, dw, bias ? db : NULL, dy, ldy, M, N, K, act);
    float *gy = down(dy, (size_t)M * ldy);
    /* compare the written columns only */
    for (int m = 0; m < M; m++)
        for (size_t n = (size_t)N; n < ldy; n++)
            gy[m * ldy + n] = y[m * ldy + n] = 0;
    snprintf(what, sizeof what, "linear M %d N %d K %d ldx %zu ldy %zu bias %d %s", M, N, K, ldx,
             ldy, bias, ditd_act_name(act));
    close_to(what, gy, y, &sh, LINEAR);
    if (lt)
        TU_CHECK(ditd_backend_cuda_gemm_fallbacks() == fb0,
                 "%s: a DiT shape took the slow fallback kernel, not cuBLASLt", what);
    G->mem_free(dx, 0), G->mem_free(dw, 0), G->mem_free(db, 0), G->mem_free(dy, 0);
    free(x), free(w), free(b), free(y), free(gy);
}

/* ---- FP8 weights (linear_q: cuBLASLt's FP8 GEMM) ----
 * The CPU's reference is its weight-only path (the FP8 values times the row
 * scales, f32 x); the GPU rounds x to e4m3 per token as well, so the bound
 * is the e4m3 rounding's (3 mantissa bits: 2^-4 relative a product at worst,
 * averaging over K): FP8_LINEAR, relative to the largest output. The shape
 * must take cuBLASLt's FP8 GEMM (no fallback counted), and the fallback's
 * weight dequantization must equal the CPU's values rounded to bf16. */
#define FP8_LINEAR 5e-2
static void check_linear_fp8(int M, int N, int K, int e5m2, int bias, ditd_act act)
{
    int fb0 = ditd_backend_cuda_gemm_fallbacks();
    shape sh = shp("mn", M, N, 0, 0);
    char what[160];
    float *x = rnd((size_t)M * K, 1.0f), *b = rnd((size_t)N, 0.5f), *y = zeros((size_t)M * N);
    uint8_t *wq = malloc((size_t)N * K);
    float *sc = malloc((size_t)N * sizeof *sc);
    for (size_t i = 0; wq && i < (size_t)N * K; i++) { /* finite, ~2^-6 .. 2^1 */
        uint64_t r = next_u64();
        unsigned e = e5m2 ? 9u + (unsigned)(r % 8) : (unsigned)(r % 9);
        unsigned m = (unsigned)(r >> 8) & (e5m2 ? 3u : 7u);
        wq[i] = (uint8_t)(((r >> 16) & 1) << 7 | e << (e5m2 ? 2 : 3) | m);
    }
    for (int n = 0; sc && n < N; n++)
        sc[n] = 0.01f + 0.01f * (float)(next_u64() % 1000) / 1000.0f;
    const int type = e5m2 ? DITD_Q_F8_E5M2 : DITD_Q_F8_E4M3;
    ditd_qweight qc = {.type = type, .N = N, .K = K, .row_bytes = (size_t)K, .data = wq, .scale = sc};
    C->linear_q(x, (size_t)K, &qc, bias ? b : NULL, y, (size_t)N, M, act);
    void *dx = dev_in(x, (size_t)M * K), *db = dev_in(b, (size_t)N), *dy = dev_out((size_t)M * N);
    void *dw = NULL, *ds = NULL;
    cudaMalloc(&dw, (size_t)N * K);
    cudaMalloc(&ds, (size_t)N * sizeof(float));
    cudaMemcpy(dw, wq, (size_t)N * K, cudaMemcpyHostToDevice);
    cudaMemcpy(ds, sc, (size_t)N * sizeof(float), cudaMemcpyHostToDevice);
    ditd_qweight qg = qc;
    qg.data = dw;
    qg.scale = ds;
    TU_CHECK(G->linear_q_takes && G->linear_q_takes(type, N, K), "linear_q takes FP8 %d x %d", N,
             K);
    G->linear_q(dx, (size_t)K, &qg, bias ? db : NULL, dy, (size_t)N, M, act);
    float *gy = down(dy, (size_t)M * N);
    snprintf(what, sizeof what, "linear_q %s M %d N %d K %d bias %d %s", e5m2 ? "e5m2" : "e4m3",
             M, N, K, bias, ditd_act_name(act));
    close_to(what, gy, y, &sh, FP8_LINEAR);
    TU_CHECK(ditd_backend_cuda_gemm_fallbacks() == fb0,
             "%s: no cuBLASLt FP8 algorithm (the dequantizing fallback ran)", what);
    /* the fallback's dequantization: the CPU's values rounded to bf16 */
    void *dwd = dev_out((size_t)N * K);
    TU_CHECK(ditd_cuda_dequant_fp8_bf16(dw, e5m2, ds, N, K, dwd, ST) == 0, "dequant_fp8_bf16");
    float *wd = down(dwd, (size_t)N * K), *wc = malloc((size_t)N * K * sizeof *wc);
    ditd_cpu_dequant_rows(type, wq, (size_t)K, sc, 0, N, 0, K, wc, (size_t)K, 0);
    size_t bad = 0;
    for (size_t i = 0; i < (size_t)N * K; i++) {
        uint16_t h;
        float r;
        ditd_cpu_f32_to_bf16(&wc[i], &h, 1);
        ditd_cpu_bf16_to_f32(&h, &r, 1);
        bad += memcmp(&r, &wd[i], 4) != 0;
    }
    TU_CHECK(bad == 0, "%s: %zu dequantized weights differ from the CPU's rounded to bf16", what,
             bad);
    cudaFree(dw), cudaFree(ds);
    G->mem_free(dx, 0), G->mem_free(db, 0), G->mem_free(dy, 0), G->mem_free(dwd, 0);
    free(x), free(b), free(y), free(gy), free(wq), free(sc), free(wd), free(wc);
}

/* ---- LoRA (kernels/cuda/lora.cu) ----
 * y = act(y + s (x A^T) B^T) on a y the GPU and the CPU start from alike
 * (rounded to bf16); columns past N (ldy > N) must stay as they were. The
 * bound: the rank-r term in fp32, one bf16 rounding of y: LINEAR. */
static void check_lora(int M, int N, int K, int r, size_t ldx, size_t ldy, float s, ditd_act act)
{
    shape sh = shp("mn", M, (int64_t)ldy, 0, 0);
    char what[160];
    float *x = rnd((size_t)M * ldx, 1.0f), *a = rnd((size_t)r * K + 1, 0.1f);
    float *b = rnd((size_t)N * (r ? r : 1), 0.1f), *y = rnd((size_t)M * ldy, 1.0f);
    float *tmp = zeros((size_t)M * (r ? r : 1));
    void *dx = dev_in(x, (size_t)M * ldx), *da = dev_in(a, (size_t)r * K + 1);
    void *db = dev_in(b, (size_t)N * (r ? r : 1)), *dy = dev_in(y, (size_t)M * ldy);
    float *dt = dev_f32(NULL, (size_t)M * (r ? r : 1));
    C->lora(x, ldx, a, b, s, y, ldy, M, N, K, r, tmp, act);
    G->lora(dx, ldx, da, db, s, dy, ldy, M, N, K, r, dt, act);
    float *gy = down(dy, (size_t)M * ldy);
    snprintf(what, sizeof what, "lora M %d N %d K %d r %d ldx %zu ldy %zu s %g %s", M, N, K, r,
             ldx, ldy, (double)s, ditd_act_name(act));
    close_to(what, gy, y, &sh, LINEAR);
    G->mem_free(dx, 0), G->mem_free(da, 0), G->mem_free(db, 0), G->mem_free(dy, 0);
    cudaFree(dt);
    free(x), free(a), free(b), free(y), free(tmp), free(gy);
}

/* ---- attention ---- */

static void check_attention(int B, int Nq, int Nk, int H, int Dh, int fused)
{
    char what[160];
    size_t hd = (size_t)H * Dh;
    /* fused: q, k, v views of one (B, N, 3 H Dh) buffer (Nq == Nk) */
    size_t ld = fused ? 3 * hd : hd + (Dh % 8 ? 0 : 8); /* strided rows either way */
    float scale = 1.0f / sqrtf((float)Dh);
    size_t nq = (size_t)B * Nq * ld, nk = (size_t)B * Nk * ld;
    float *q = rnd(nq, 2.0f), *k = fused ? q : rnd(nk ? nk : 1, 2.0f), *v = fused ? q : rnd(nk ? nk : 1, 1.0f);
    void *dq = dev_in(q, nq), *dk = fused ? dq : dev_in(k, nk ? nk : 1), *dv = fused ? dq : dev_in(v, nk ? nk : 1);
    const float *kq = fused ? q + hd : k, *vq = fused ? q + 2 * hd : v;
    const void *dkq = fused ? ditd_ptr_act(G, dq, hd) : dk, *dvq = fused ? ditd_ptr_act(G, dq, 2 * hd) : dv;
    size_t no = (size_t)B * Nq * hd, nl = (size_t)B * H * Nq;
    float *o = zeros(no), *lse = zeros(nl);
    void *dout = dev_out(no);
    float *dlse = dev_f32(NULL, nl);
    C->attention(q, ld, kq, ld, vq, ld, o, hd, lse, B, Nq, Nk, H, Dh, scale);
    G->attention(dq, ld, dkq, ld, dvq, ld, dout, hd, dlse, B, Nq, Nk, H, Dh, scale);
    float *go = down(dout, no), *gl = down_f32(dlse, nl);
    snprintf(what, sizeof what, "attention B %d Nq %d Nk %d H %d Dh %d %s", B, Nq, Nk, H, Dh,
             fused ? "fused qkv" : "strided");
    if (Nk == 0) {
        int ok = 1;
        for (size_t i = 0; i < no; i++)
            ok &= go[i] == 0.0f;
        for (size_t i = 0; i < nl; i++)
            ok &= gl[i] == -INFINITY;
        TU_CHECK(ok, "%s: o = 0 and lse = -inf expected", what);
    } else {
        shape so = shp("bnhd", B, Nq, H, Dh), sl = shp("bhn", B, H, Nq, 0);
        close_to(what, go, o, &so, ATTN);
        strncat(what, " lse", sizeof what - strlen(what) - 1);
        close_to(what, gl, lse, &sl, ATTN_LSE);
    }
    G->mem_free(dout, 0);
    cudaFree(dlse);
    G->mem_free(dq, 0);
    if (!fused)
        G->mem_free(dk, 0), G->mem_free(dv, 0), free(k), free(v);
    free(q), free(o), free(lse), free(go), free(gl);
}

static void check_merge(int B, int Nq, int H, int Dh)
{
    size_t hd = (size_t)H * Dh, no = (size_t)B * Nq * hd, nl = (size_t)B * H * Nq;
    float *oa = rnd(no, 1.0f), *ob = rnd(no, 1.0f), *la = rnd(nl, 5.0f), *lb = rnd(nl, 5.0f);
    la[0] = -INFINITY; /* an empty accumulator takes the block */
    lb[1] = -INFINITY; /* an empty block keeps the accumulator */
    la[2] = lb[2] = -INFINITY; /* both empty: unchanged */
    void *doa = dev_in(oa, no), *dob = dev_in(ob, no);
    float *dla = dev_f32(la, nl), *dlb = dev_f32(lb, nl);
    C->attention_merge(oa, hd, la, ob, hd, lb, B, Nq, H, Dh);
    G->attention_merge(doa, hd, dla, dob, hd, dlb, B, Nq, H, Dh);
    float *go = down(doa, no), *gl = down_f32(dla, nl);
    shape so = shp("bnhd", B, Nq, H, Dh), sl = shp("bhn", B, H, Nq, 0);
    close_to("attention_merge o", go, oa, &so, BF16_1);
    TU_CHECK(gl[2] == -INFINITY, "both empty: lse %g", (double)gl[2]);
    gl[2] = la[2] = 0;
    close_to("attention_merge lse", gl, la, &sl, ATTN_LSE);
    G->mem_free(doa, 0), G->mem_free(dob, 0);
    cudaFree(dla), cudaFree(dlb);
    free(oa), free(ob), free(la), free(lb), free(go), free(gl);
}

/* ---- norms, residual, elementwise ---- */

static void check_norm(int B, int N, int D, int modulate)
{
    size_t n = (size_t)B * N * D, nm = (size_t)B * 6 * D;
    float *x = rnd(n, 3.0f), *mod = rnd(nm, 1.0f), *y = zeros(n);
    for (size_t i = 0; i < n; i++)
        x[i] += 0.7f; /* a mean away from 0 */
    void *dx = dev_in(x, n), *dm = dev_in(mod, nm), *dy = dev_out(n);
    const float *sh = modulate ? mod : NULL, *sc = modulate ? mod + D : NULL;
    C->layernorm_modulate(x, y, B, N, D, 1e-6f, sh, sc, 6 * (size_t)D);
    G->layernorm_modulate(dx, dy, B, N, D, 1e-6f, modulate ? dm : NULL,
                          modulate ? ditd_ptr_act(G, dm, (size_t)D) : NULL, 6 * (size_t)D);
    float *gy = down(dy, n);
    shape sn = shp("bnd", B, N, D, 0);
    close_to(modulate ? "layernorm_modulate" : "layernorm (plain)", gy, y, &sn, NORM);
    /* in place, as the model may */
    G->layernorm_modulate(dx, dx, B, N, D, 1e-6f, modulate ? dm : NULL,
                          modulate ? ditd_ptr_act(G, dm, (size_t)D) : NULL, 6 * (size_t)D);
    float *gi = down(dx, n);
    close_to("layernorm_modulate in place", gi, y, &sn, NORM);

    /* gated residual: h += gate * y, gate in the same fused buffer */
    float *h = rnd(n, 2.0f), *yy = rnd(n, 2.0f);
    void *dh = dev_in(h, n), *dyy = dev_in(yy, n);
    C->gated_residual(h, yy, B, N, D, mod + 2 * D, 6 * (size_t)D);
    G->gated_residual(dh, dyy, B, N, D, ditd_ptr_act(G, dm, 2 * (size_t)D), 6 * (size_t)D);
    float *gh = down(dh, n);
    close_to("gated_residual", gh, h, &sn, BF16_1);
    G->mem_free(dx, 0), G->mem_free(dm, 0), G->mem_free(dy, 0), G->mem_free(dh, 0),
        G->mem_free(dyy, 0);
    free(x), free(mod), free(y), free(gy), free(gi), free(h), free(yy), free(gh);
}

static void check_elementwise(void)
{
    size_t n = 100003;
    shape sh = shp("i", (int64_t)n, 0, 0, 0), s2 = shp("rc", 37, 64, 0, 0);
    float *x = rnd(n, 6.0f), *y = rnd(n, 2.0f);
    void *dx = dev_in(x, n), *dy = dev_in(y, n), *da = dev_out(n);
    ditd_act acts[3] = {DITD_ACT_NONE, DITD_ACT_GELU_TANH, DITD_ACT_SILU};
    for (int a = 0; a < 3; a++) {
        float *ref = malloc(n * sizeof *ref);
        char what[64];
        C->act(x, ref, n, acts[a]);
        G->act(dx, da, n, acts[a]);
        float *g = down(da, n);
        snprintf(what, sizeof what, "act %s", ditd_act_name(acts[a]));
        close_to(what, g, ref, &sh, BF16_1);
        free(ref), free(g);
    }
    C->add(y, x, n);
    G->add(dy, dx, n);
    float *gy = down(dy, n);
    close_to("add", gy, y, &sh, BF16_1);

    /* copy2d: 37 rows of 50 from stride 77 to stride 64 */
    void *dc = dev_out(37 * 64);
    float *ref = zeros(37 * 64), *src = x;
    C->copy2d(ref, 64, src, 77, 37, 50);
    G->copy2d(dc, 64, dx, 77, 37, 50);
    float *gc = down(dc, 37 * 64);
    for (size_t r = 0; r < 37; r++)
        for (size_t c = 50; c < 64; c++)
            gc[r * 64 + c] = 0;
    close_to("copy2d", gc, ref, &s2, 0.0);

    /* conversions round to nearest even, and back exactly: upload, download
     * and upload again must not move a value */
    float *back = down(dx, n);
    close_to("bf16 round trip", back, x, &sh, 0.0);
    G->mem_free(dx, 0), G->mem_free(dy, 0), G->mem_free(da, 0), G->mem_free(dc, 0);
    free(x), free(y), free(gy), free(ref), free(gc), free(back);
}

/* step caching (engine/pipeline/step_cache.c): y = a x + b y (one bf16
 * rounding) and the per-row float64 statistics of two bf16 inputs (the
 * same bf16 values on both sides: the sums agree to float64 rounding) */
static void check_step_cache_ops(void)
{
    int rows = 2500, D = 96; /* more rows than one chunk of the host copy */
    size_t n = (size_t)rows * D;
    shape sh = shp("i", (int64_t)n, 0, 0, 0), s4 = shp("rq", rows, 4, 0, 0);
    float *x = rnd(n, 3.0f), *y = rnd(n, 2.0f);
    void *dx = dev_in(x, n), *dy = dev_in(y, n);
    double *cs = malloc(4 * n / D * sizeof(double)), *gs = malloc(4 * n / D * sizeof(double));
    C->row_diff_stats(x, y, rows, D, cs);
    G->row_diff_stats(dx, dy, rows, D, gs);
    TU_OK(G->status());
    float *cf = malloc(4 * (size_t)rows * sizeof(float)), *gf = malloc(4 * (size_t)rows * sizeof(float));
    for (size_t i = 0; i < 4 * (size_t)rows; i++)
        cf[i] = (float)cs[i], gf[i] = (float)gs[i];
    close_to("row_diff_stats", gf, cf, &s4, 1e-6);
    C->axpby(y, x, -1.0f, 1.0f, n, 0);
    G->axpby(dy, dx, -1.0f, 1.0f, n, 0);
    float *g = down(dy, n);
    close_to("axpby", g, y, &sh, BF16_1);
    G->mem_free(dx, 0), G->mem_free(dy, 0);
    free(x), free(y), free(cs), free(gs), free(cf), free(gf), free(g);
}

static void check_embeddings(void)
{
    int rows = 1001, D = 1152, B = 5, dim = 256;
    float *table = rnd((size_t)rows * D, 1.0f), *out = zeros((size_t)B * D);
    int64_t ids[5];
    float t[5];
    for (int b = 0; b < B; b++) {
        ids[b] = (int64_t)(next_u64() % (uint64_t)rows);
        t[b] = (float)(next_u64() % 1000);
    }
    void *dt = dev_in(table, (size_t)rows * D), *dout = dev_out((size_t)B * D);
    C->embedding(table, ids, out, B, D);
    G->embedding(dt, ids, dout, B, D);
    float *g = down(dout, (size_t)B * D);
    shape se = shp("bd", B, D, 0, 0), st = shp("bd", B, dim, 0, 0);
    close_to("embedding", g, out, &se, 0.0);

    float *te = zeros((size_t)B * dim);
    void *dte = dev_out((size_t)B * dim);
    C->timestep_embed(t, te, B, dim);
    G->timestep_embed(t, dte, B, dim);
    float *gt = down(dte, (size_t)B * dim);
    close_to("timestep_embed", gt, te, &st, BF16_1);
    G->mem_free(dt, 0), G->mem_free(dout, 0), G->mem_free(dte, 0);
    free(table), free(out), free(g), free(te), free(gt);
}

static void check_patches(int B, int Cc, int S, int p, int D)
{
    char what[128];
    int gh = S / p, N = gh * gh, K = Cc * p * p;
    size_t nx = (size_t)B * Cc * S * S, ny = (size_t)B * N * D;
    float *x = rnd(nx, 2.0f), *w = rnd((size_t)D * K, 0.2f), *b = rnd((size_t)D, 0.5f);
    float *pos = rnd((size_t)N * D, 1.0f), *y = zeros(ny), *scr = zeros((size_t)B * N * K);
    void *dx = dev_in(x, nx), *dw = dev_in(w, (size_t)D * K), *db = dev_in(b, (size_t)D);
    void *dp = dev_in(pos, (size_t)N * D), *dy = dev_out(ny), *ds = dev_out((size_t)B * N * K);
    C->patch_embed(x, w, b, pos, y, scr, B, Cc, S, S, p, D);
    G->patch_embed(dx, dw, db, dp, dy, ds, B, Cc, S, S, p, D);
    float *gy = down(dy, ny);
    snprintf(what, sizeof what, "patch_embed B %d C %d S %d p %d D %d", B, Cc, S, p, D);
    shape sy = shp("bnd", B, N, D, 0), si = shp("bcyx", B, Cc, S, S);
    close_to(what, gy, y, &sy, PATCH);

    /* unpatchify of tokens (B, N, p*p*Cc) */
    size_t nt = (size_t)B * N * p * p * Cc;
    float *tok = rnd(nt, 1.0f), *img = zeros(nx);
    void *dtok = dev_in(tok, nt), *dimg = dev_out(nx);
    C->unpatchify(tok, img, B, Cc, gh, gh, p);
    G->unpatchify(dtok, dimg, B, Cc, gh, gh, p);
    float *gi = down(dimg, nx);
    snprintf(what, sizeof what, "unpatchify B %d C %d h %d p %d", B, Cc, gh, p);
    close_to(what, gi, img, &si, 0.0);
    G->mem_free(dx, 0), G->mem_free(dw, 0), G->mem_free(db, 0), G->mem_free(dp, 0);
    G->mem_free(dy, 0), G->mem_free(ds, 0), G->mem_free(dtok, 0), G->mem_free(dimg, 0);
    free(x), free(w), free(b), free(pos), free(y), free(scr), free(gy), free(tok), free(img),
        free(gi);
}

/* ---- kernels beside the table ---- */

static void check_philox(void)
{
    uint64_t seed = next_u64(), sample = next_u64() % 1000;
    uint64_t offset = 3 + next_u64() % 1000; /* not a multiple of 4 most of the time */
    size_t n = 1000003;
    float *ref = malloc(n * sizeof *ref), *d = dev_f32(NULL, n);
    ditd_philox_normal(seed, sample, offset, n, ref);
    TU_CHECK(ditd_cuda_philox_normal(seed, sample, offset, n, d, (ditd_cuda_stream)ST) == 0, "launch");
    float *g = down_f32(d, n);
    size_t differ = 0, far = 0;
    for (size_t i = 0; i < n; i++) {
        if (g[i] == ref[i])
            continue;
        differ++;
        if (fabsf(g[i] - ref[i]) > fabsf(nextafterf(ref[i], INFINITY) - ref[i]) * 1.01f)
            far++;
    }
    printf("%s philox normal: %zu of %zu differ (at most 1 in 10^4), %zu beyond one ulp\n",
           differ * 10000 <= n && !far ? "ok  " : "FAIL", differ, n, far);
    TU_CHECK(differ * 10000 <= n && far == 0, "philox: %zu differ, %zu beyond an ulp", differ, far);
    cudaFree(d);
    free(ref), free(g);
}

static void check_sampler_helpers(void)
{
    size_t n = 50001;
    float *c = rnd(n, 2.0f), *u = rnd(n, 2.0f), *ref = malloc(n * sizeof *ref);
    void *dc = dev_in(c, n), *du = dev_in(u, n);
    float *dout = dev_f32(NULL, n);
    float gs = 4.0f;
    shape sh = shp("i", (int64_t)n, 0, 0, 0);
    for (size_t i = 0; i < n; i++)
        ref[i] = u[i] + gs * (c[i] - u[i]);
    TU_CHECK(ditd_cuda_guidance(dc, du, gs, dout, n, (ditd_cuda_stream)ST) == 0, "launch");
    float *g = down_f32(dout, n);
    close_to("guidance", g, ref, &sh, 1e-6);

    float *x = rnd(n, 3.0f), *m = rnd(n, 1.0f), *pv = rnd(n, 1.0f);
    float *dxx = dev_f32(x, n), *dm = dev_f32(m, n), *dpv = dev_f32(pv, n);
    for (size_t i = 0; i < n; i++) {
        float v = 0.9f * x[i] + 0.3f * m[i] - 0.2f * pv[i];
        ref[i] = v < -1.0f ? -1.0f : v > 1.0f ? 1.0f : v;
    }
    TU_CHECK(ditd_cuda_lincomb(dxx, 0.9f, dm, 0.3f, dpv, -0.2f, 1.0f, n, (ditd_cuda_stream)ST) == 0, "launch");
    float *gx = down_f32(dxx, n);
    close_to("lincomb (clip 1)", gx, ref, &sh, 1e-6);
    G->mem_free(dc, 0), G->mem_free(du, 0);
    cudaFree(dout), cudaFree(dxx), cudaFree(dm), cudaFree(dpv);
    free(c), free(u), free(ref), free(g), free(x), free(m), free(pv), free(gx);
}

/* ---- the checks, by name ---- */

/* A flat comparison (the image checks compare gathered planes). */
#define CLOSE_FLAT(what, got, want, n, tol)                                                    \
    do {                                                                                       \
        shape s_ = shp("i", (int64_t)(n), 0, 0, 0);                                            \
        close_to(what, got, want, &s_, tol);                                                   \
    } while (0)

/* ---- the VAE's image ops (kernels/cuda/image.cu) ----
 * conv2d: a GEMM of bf16 inputs, fp32 accumulation, bias, one rounding: LINEAR.
 * GroupNorm statistics: double sums of the same bf16 values: 1e-6 (as floats).
 * GroupNorm apply (+ SiLU): one rounding of an fp32 result: NORM.
 * Upsample and the planes <-> tokens transposes move values: exact. */
static void check_conv(int Cin, int Hx, int Wx, int Cout, int k, int s, int pt, int pb, int pl,
                       int pr, size_t scratch_rows)
{
    const int Ho = (Hx + pt + pb - k) / s + 1, Wo = (Wx + pl + pr - k) / s + 1;
    const size_t psx = (size_t)(Hx + 2) * Wx, psy = (size_t)(Ho + 2) * Wo, nx = Cin * psx,
                 ny = Cout * psy, nw = (size_t)Cout * Cin * k * k;
    const size_t sn = ((size_t)Cin * k * k + Cout) * Wo * scratch_rows;
    float *x = rnd(nx, 1.0f), *w = rnd(nw, 0.3f), *b = rnd((size_t)Cout, 0.5f), *y = zeros(ny);
    float *scr = zeros(sn);
    void *dx = dev_in(x, nx), *dw = dev_in(w, nw), *db = dev_in(b, (size_t)Cout), *dy = dev_out(ny);
    void *ds = dev_out(sn);
    C->conv2d(x, psx, w, b, y, psy, scr, sn, 1, Cin, Hx, Wx, Cout, k, s, pt, pb, pl, pr);
    G->conv2d(dx, psx, dw, db, dy, psy, ds, sn, 1, Cin, Hx, Wx, Cout, k, s, pt, pb, pl, pr);
    float *gy = down(dy, ny);
    /* compare the planes' rows only (the rest of each plane is not written) */
    float *a = zeros((size_t)Cout * Ho * Wo), *r = zeros((size_t)Cout * Ho * Wo);
    for (int c = 0; c < Cout; c++) {
        memcpy(a + (size_t)c * Ho * Wo, gy + c * psy, (size_t)Ho * Wo * sizeof *a);
        memcpy(r + (size_t)c * Ho * Wo, y + c * psy, (size_t)Ho * Wo * sizeof *r);
    }
    char what[128];
    snprintf(what, sizeof what, "conv2d %dx%d s%d %dx%dx%d -> %d (chunks of %zu rows)", k, k, s, Cin,
             Hx, Wx, Cout, scratch_rows);
    CLOSE_FLAT(what, a, r, (size_t)Cout * Ho * Wo, LINEAR);
    G->mem_free(dx, 0), G->mem_free(dw, 0), G->mem_free(db, 0), G->mem_free(dy, 0),
        G->mem_free(ds, 0);
    free(x), free(w), free(b), free(y), free(scr), free(gy), free(a), free(r);
}

static void check_image_ops(void)
{

    const int Cc = 64, R = 13, W = 21, Gr = 32;
    const size_t ps = (size_t)(R + 2) * W, n = Cc * ps;
    float *x = rnd(n, 2.0f), *g = rnd(Cc, 0.5f), *be = rnd(Cc, 0.5f), *y = zeros(n);
    for (int i = 0; i < Cc; i++)
        g[i] += 1.0f;
    for (size_t i = 0; i < n; i++)
        x[i] += 0.4f;
    void *dx = dev_in(x, n), *dg = dev_in(g, Cc), *dbe = dev_in(be, Cc), *dy = dev_out(n);
    double sc[2 * 32], sg[2 * 32];
    float fc[2 * 32], fg[2 * 32], mean[32], rstd[32];
    C->groupnorm_stats(x, ps, 1, Cc, R, W, Gr, sc);
    G->groupnorm_stats(dx, ps, 1, Cc, R, W, Gr, sg);
    TU_OK(G->status());
    for (int i = 0; i < 2 * Gr; i++)
        fc[i] = (float)sc[i], fg[i] = (float)sg[i];
    CLOSE_FLAT("groupnorm_stats (double sums)", fg, fc, (size_t)2 * Gr, 1e-6);
    const double cnt = (double)(Cc / Gr) * R * W;
    for (int i = 0; i < Gr; i++) {
        double m = sc[2 * i] / cnt;
        mean[i] = (float)m;
        rstd[i] = (float)(1.0 / sqrt(sc[2 * i + 1] / cnt - m * m + 1e-6));
    }
    for (int silu = 0; silu < 2; silu++) {
        C->groupnorm_apply(x, ps, y, ps, 1, Cc, R, W, Gr, mean, rstd, g, be, silu);
        G->groupnorm_apply(dx, ps, dy, ps, 1, Cc, R, W, Gr, mean, rstd, dg, dbe, silu);
        float *gy = down(dy, n), *a = zeros((size_t)Cc * R * W), *r = zeros((size_t)Cc * R * W);
        for (int c = 0; c < Cc; c++) {
            memcpy(a + (size_t)c * R * W, gy + c * ps, (size_t)R * W * sizeof *a);
            memcpy(r + (size_t)c * R * W, y + c * ps, (size_t)R * W * sizeof *r);
        }
        CLOSE_FLAT(silu ? "groupnorm_apply + silu" : "groupnorm_apply", a, r, (size_t)Cc * R * W, NORM);
        free(gy), free(a), free(r);
    }
    /* upsample: exact */
    const size_t ps2 = (size_t)(2 * R + 2) * 2 * W, n2 = Cc * ps2;
    float *u = zeros(n2);
    void *du = dev_out(n2);
    C->upsample_nearest2x(x, ps, u, ps2, 1, Cc, R, W);
    G->upsample_nearest2x(dx, ps, du, ps2, 1, Cc, R, W);
    float *gu = down(du, n2), *a = zeros((size_t)Cc * 4 * R * W), *r = zeros((size_t)Cc * 4 * R * W);
    for (int c = 0; c < Cc; c++) {
        memcpy(a + (size_t)c * 4 * R * W, gu + c * ps2, (size_t)4 * R * W * sizeof *a);
        memcpy(r + (size_t)c * 4 * R * W, u + c * ps2, (size_t)4 * R * W * sizeof *r);
    }
    CLOSE_FLAT("upsample_nearest2x", a, r, (size_t)Cc * 4 * R * W, 0.0);
    /* planes -> tokens -> planes (accumulate): exact moves, one bf16 add */
    const int nt = R * W;
    float *t = zeros((size_t)nt * Cc);
    void *dt = dev_out((size_t)nt * Cc);
    C->planes_to_tokens(x, ps, t, Cc, nt);
    G->planes_to_tokens(dx, ps, dt, Cc, nt);
    float *gt = down(dt, (size_t)nt * Cc);
    CLOSE_FLAT("planes_to_tokens", gt, t, (size_t)nt * Cc, 0.0);
    C->tokens_to_planes(t, x, ps, Cc, nt, 1);
    G->tokens_to_planes(dt, dx, ps, Cc, nt, 1);
    float *gx = down(dx, n);
    CLOSE_FLAT("tokens_to_planes (accumulate)", gx, x, n, BF16_1);
    G->mem_free(dx, 0), G->mem_free(dg, 0), G->mem_free(dbe, 0), G->mem_free(dy, 0),
        G->mem_free(du, 0), G->mem_free(dt, 0);
    free(x), free(g), free(be), free(y), free(u), free(gu), free(a), free(r), free(t), free(gt),
        free(gx);
}

/* ---- the Wan VAE's video ops (kernels/cuda/video.cu) ----
 * conv3d: a GEMM of bf16 inputs over the time taps, fp32 accumulation,
 * bias, one rounding: LINEAR. Channel RMS norm (+ SiLU): fp32 statistics,
 * one rounding: NORM. AvgDown3D: an fp32 mean, one rounding (plus the
 * accumulate's): 2 BF16_1. DupUp3D moves values; its accumulate is one
 * bf16 add: BF16_1. */

/* Frames are (C, rows + 2, W) planes with plane stride ps; only the rows of
 * each plane's interior (or all of it, halo = 0) are compared. */
static void close_planes(const char *what, const float *gpu, const float *cpu, int C, size_t ps,
                         size_t off, size_t n, double tol)
{
    float *a = zeros((size_t)C * n), *r = zeros((size_t)C * n);
    for (int c = 0; c < C; c++) {
        memcpy(a + (size_t)c * n, gpu + c * ps + off, n * sizeof *a);
        memcpy(r + (size_t)c * n, cpu + c * ps + off, n * sizeof *r);
    }
    CLOSE_FLAT(what, a, r, (size_t)C * n, tol);
    free(a), free(r);
}

static void check_conv3d(int Cin, int R, int W, int Cout, int kT, int k, int null_tap)
{
    /* frames with halo rows (pad_h 0 over R + 2 rows) for k = 3; interior rows for k = 1 */
    const size_t ps = (size_t)(R + 2) * W, nx = (size_t)Cin * ps, ny = (size_t)Cout * ps;
    const size_t nw = (size_t)Cout * Cin * kT * k * k, sn = ((size_t)Cin * kT * k * k + Cout) * W * 4;
    float *x[4], *w = rnd(nw, 0.3f), *b = rnd((size_t)Cout, 0.5f), *y = zeros(ny), *scr = zeros(sn);
    void *dxs[4], *dw = dev_in(w, nw), *db = dev_in(b, (size_t)Cout), *dy = dev_out(ny);
    void *ds = dev_out(sn);
    const void *cf[4], *gf[4];
    const size_t off = k == 3 ? 0 : (size_t)W; /* where the conv reads from */
    for (int j = 0; j < kT; j++) {
        x[j] = rnd(nx, 1.0f);
        dxs[j] = dev_in(x[j], nx);
        cf[j] = j == null_tap ? NULL : x[j] + off;
        gf[j] = j == null_tap ? NULL : (const void *)((const uint16_t *)dxs[j] + off);
    }
    const int H = k == 3 ? R + 2 : R;
    C->conv3d_frame(cf, kT, ps, w, b, y + W, ps, scr, sn, Cin, H, W, Cout, k, 0, k / 2);
    G->conv3d_frame(gf, kT, ps, dw, db, (uint16_t *)dy + W, ps, ds, sn, Cin, H, W, Cout, k, 0, k / 2);
    float *gy = down(dy, ny);
    char what[128];
    snprintf(what, sizeof what, "conv3d %dx%dx%d %dx%dx%d -> %d (tap %d zeros)", kT, k, k, Cin, R, W,
             Cout, null_tap);
    close_planes(what, gy, y, Cout, ps, (size_t)W, (size_t)R * W, LINEAR);
    for (int j = 0; j < kT; j++)
        G->mem_free(dxs[j], 0), free(x[j]);
    G->mem_free(dw, 0), G->mem_free(db, 0), G->mem_free(dy, 0), G->mem_free(ds, 0);
    free(w), free(b), free(y), free(scr), free(gy);
}

static void check_video_ops(void)
{
    const int Cc = 24, R = 6, W = 10;
    const size_t ps = (size_t)(R + 2) * W, n = (size_t)Cc * ps;
    float *x = rnd(n, 2.0f), *x2 = rnd(n, 2.0f), *g = rnd(Cc, 0.5f), *y = zeros(n);
    for (int i = 0; i < Cc; i++)
        g[i] += 1.0f;
    void *dx = dev_in(x, n), *dx2 = dev_in(x2, n), *dg = dev_in(g, Cc), *dy = dev_out(n);
    for (int silu = 0; silu < 2; silu++) {
        C->rmsnorm_channels(x + W, ps, y + W, ps, Cc, R * W, g, silu);
        G->rmsnorm_channels((uint16_t *)dx + W, ps, (uint16_t *)dy + W, ps, Cc, R * W, dg, silu);
        float *gy = down(dy, n);
        close_planes(silu ? "rmsnorm_channels + silu" : "rmsnorm_channels", gy, y, Cc, ps,
                     (size_t)W, (size_t)R * W, NORM);
        free(gy);
    }
    /* AvgDown3D(24 -> 48, ft 2, fs 2) with the first tap zeros, accumulating */
    const int Co = 48, Ho = R / 2, Wo = W / 2;
    const size_t pso = (size_t)Ho * Wo, no = (size_t)Co * pso;
    float *ya = rnd(no, 1.0f);
    void *dya = dev_in(ya, no);
    const void *cf[2] = {NULL, x2 + W}, *gf[2] = {NULL, (uint16_t *)dx2 + W};
    C->avgdown3d_frame(cf, ps, Cc, R, W, Co, 2, 2, ya, pso, 1);
    G->avgdown3d_frame(gf, ps, Cc, R, W, Co, 2, 2, dya, pso, 1);
    float *gya = down(dya, no);
    CLOSE_FLAT("avgdown3d (accumulate)", gya, ya, no, 2 * BF16_1);
    /* DupUp3D(24 -> 12, ft 2, fs 2), second time slot, accumulating */
    const int Cu = 12;
    const size_t psu = (size_t)4 * R * W, nu = (size_t)Cu * psu;
    float *yu = rnd(nu, 1.0f);
    void *dyu = dev_in(yu, nu);
    C->dupup3d_frame(x + W, ps, Cc, R, W, Cu, 2, 2, 1, yu, psu, 1);
    G->dupup3d_frame((uint16_t *)dx + W, ps, Cc, R, W, Cu, 2, 2, 1, dyu, psu, 1);
    float *gyu = down(dyu, nu);
    CLOSE_FLAT("dupup3d (accumulate)", gyu, yu, nu, BF16_1);
    G->mem_free(dx, 0), G->mem_free(dx2, 0), G->mem_free(dg, 0), G->mem_free(dy, 0),
        G->mem_free(dya, 0), G->mem_free(dyu, 0);
    free(x), free(x2), free(g), free(y), free(ya), free(gya), free(yu), free(gyu);
}

static int argc_;
static char **argv_;
static const char *filter;

/* A check runs when no filter is given, or its name contains one of the
 * words (command line, else DITD_OPS_FILTER, comma-separated). */
static int wanted(const char *name)
{
    char buf[512], *save = NULL;
    int words = 0;
    for (int i = 1; i < argc_; i++) {
        if (argv_[i][0] == '-') /* --list */
            continue;
        words++;
        if (strstr(name, argv_[i]))
            return 1;
    }
    if (!words && !filter)
        return 1;
    if (!filter)
        return 0;
    snprintf(buf, sizeof buf, "%s", filter);
    for (char *w = strtok_r(buf, ",", &save); w; w = strtok_r(NULL, ",", &save))
        if (*w && strstr(name, w))
            return 1;
    return 0;
}

static int listing, ran;

/* After each check: wait for its work, then read the runtime's error and
 * the backend's. 0 to go on; 1 to stop (the error is sticky: every later
 * CUDA call would fail with it, and name the wrong check). */
static int settle(const char *name)
{
    cudaError_t e = cudaStreamSynchronize(ST);
    cudaError_t last = cudaGetLastError();
    int berr = G->status();
    if (e == cudaSuccess)
        e = last;
    if (berr)
        printf("FAIL %s: the backend kept an error: %s: %s\n", name, ditd_err_name(berr),
               ditd_err_detail());
    if (e == cudaSuccess) {
        if (berr)
            tu_failures++;
        return 0;
    }
    tu_failures++;
    /* a sticky error survives the read: the next sync reports it again */
    int sticky = cudaDeviceSynchronize() != cudaSuccess;
    printf("FAIL %s: CUDA error %s (%s)%s\n", name, cudaGetErrorName(e), cudaGetErrorString(e),
           sticky ? ", sticky" : "");
    if (sticky)
        printf("stopped: a sticky CUDA error after check '%s': the context is lost. Repeat that "
               "check alone, synchronously: CUDA_LAUNCH_BLOCKING=1 DITD_TEST_SEED=<seed above> "
               "test_cuda_ops %s\n",
               name, name);
    return sticky;
}

#define CHECK(name, call)                                                                      \
    do {                                                                                       \
        if (!wanted(name))                                                                     \
            break;                                                                             \
        if (listing) {                                                                         \
            printf("%s\n", name);                                                              \
            break;                                                                             \
        }                                                                                      \
        int f0_ = tu_failures;                                                                 \
        printf("-- %s\n", name);                                                               \
        fflush(stdout);                                                                        \
        call;                                                                                  \
        ran++;                                                                                 \
        if (settle(name))                                                                      \
            return 1;                                                                          \
        printf("%s %s\n", tu_failures == f0_ ? "PASS" : "FAIL", name);                         \
        fflush(stdout);                                                                        \
    } while (0)

static int run_checks(void)
{
    CHECK("elementwise", check_elementwise());
    CHECK("embeddings", check_embeddings());
    CHECK("step-cache", check_step_cache_ops());
    /* DiT-XL/2 shapes at 256 tokens, batch 2 (cuBLASLt must take them);
     * odd ones; tiny fixture ones */
    CHECK("linear/qkv-dit-xl", check_linear(512, 3 * 1152, 1152, 1152, 3 * 1152, 1, DITD_ACT_NONE, 1));
    CHECK("linear/fc1-gelu-dit-xl",
          check_linear(512, 4608, 1152, 1152, 4608, 1, DITD_ACT_GELU_TANH, 1));
    CHECK("linear/fc2-dit-xl", check_linear(512, 1152, 4608, 4608, 1152, 1, DITD_ACT_NONE, 1));
    CHECK("linear/adaln-silu-dit-xl", check_linear(2, 1152, 256, 256, 1152, 1, DITD_ACT_SILU, 1));
    CHECK("linear/strided", check_linear(77, 96, 136, 200, 104, 1, DITD_ACT_NONE, 0));
    CHECK("linear/proj-out-fixture", check_linear(98, 8, 96, 96, 8, 1, DITD_ACT_NONE, 0));
    CHECK("linear/k4-fallback", check_linear(98, 96, 4, 4, 96, 0, DITD_ACT_GELU_TANH, 0));
    CHECK("linear/odd", check_linear(33, 30, 17, 17, 30, 1, DITD_ACT_SILU, 0));
    CHECK("linear_q/fp8-e4m3", check_linear_fp8(96, 256, 512, 0, 1, DITD_ACT_NONE));
    CHECK("linear_q/fp8-e4m3-gelu", check_linear_fp8(37, 3072, 3072, 0, 1, DITD_ACT_GELU_TANH));
    CHECK("linear_q/fp8-e5m2-silu", check_linear_fp8(5, 64, 128, 1, 0, DITD_ACT_SILU));
    /* LoRA: FLUX-ish qkv at rank 16, an MLP's fc1 with its GELU after the
     * term, strided rows (a column block of a fused qkv), act only (r 0) */
    CHECK("lora/qkv-r16", check_lora(256, 3072, 3072, 16, 3072, 3 * 3072, 1.0f, DITD_ACT_NONE));
    CHECK("lora/fc1-gelu-r64", check_lora(130, 1536, 384, 64, 384, 1536, 0.5f, DITD_ACT_GELU_TANH));
    CHECK("lora/strided-r4", check_lora(33, 48, 48, 4, 64, 144, -1.0f, DITD_ACT_SILU));
    CHECK("lora/act-only", check_lora(17, 40, 24, 0, 24, 40, 1.0f, DITD_ACT_GELU_TANH));
    CHECK("attention/dit-xl-fused", check_attention(2, 256, 256, 16, 72, 1));
    CHECK("attention/n1024-dh64-fused", check_attention(1, 1024, 1024, 4, 64, 1));
    CHECK("attention/nk37-strided", check_attention(2, 100, 37, 3, 64, 0));
    CHECK("attention/dh128-strided", check_attention(1, 65, 130, 2, 128, 0));
    CHECK("attention/dh8-fixture", check_attention(2, 49, 49, 6, 8, 1));
    CHECK("attention/dh16-fixture", check_attention(1, 64, 64, 4, 16, 1));
    CHECK("attention/dh20-unvectorized", check_attention(1, 70, 45, 2, 20, 0));
    CHECK("attention/nk0", check_attention(1, 5, 0, 2, 72, 0));
    CHECK("merge", check_merge(2, 33, 3, 72));
    CHECK("layernorm/modulate", check_norm(2, 37, 1152, 1));
    CHECK("layernorm/plain", check_norm(1, 19, 96, 0));
    CHECK("patch/dit-xl", check_patches(2, 4, 32, 2, 1152));
    CHECK("patch/c1-s14", check_patches(2, 1, 14, 2, 96));
    CHECK("patch/p4", check_patches(1, 1, 28, 4, 48));
    CHECK("philox", check_philox());
    CHECK("sampler", check_sampler_helpers());
    /* the VAE's (kernels/cuda/image.cu) */
    CHECK("image/conv-halo", check_conv(64, 17, 24, 128, 3, 1, 0, 0, 1, 1, 5));
    CHECK("image/conv-downsample", check_conv(32, 12, 20, 32, 3, 2, 0, 1, 0, 1, 100));
    CHECK("image/conv-1x1", check_conv(48, 9, 9, 96, 1, 1, 0, 0, 0, 0, 3));
    CHECK("image/conv-in-c4", check_conv(4, 8, 8, 512, 3, 1, 1, 1, 1, 1, 2));
    CHECK("image/groupnorm-upsample-transpose", check_image_ops());
    /* the Wan VAE's (kernels/cuda/video.cu) */
    CHECK("video/conv3d-causal-halo", check_conv3d(16, 7, 13, 24, 3, 3, 0));
    CHECK("video/conv3d-3x3x3", check_conv3d(8, 5, 9, 8, 3, 3, -1));
    CHECK("video/conv3d-time", check_conv3d(32, 4, 11, 64, 3, 1, 1));
    CHECK("video/conv3d-1x1x1", check_conv3d(20, 6, 7, 40, 1, 1, -1));
    CHECK("video/rmsnorm-avgdown-dupup", check_video_ops());
    return 0;
}

/* --self-test (no GPU; suite 'bundle'): the coordinates of the worst
 * element and the .npy dumps of a failed comparison, on a planted error. */
static int self_test(const char *dir)
{
    shape s = shp("bnhd", 2, 3, 4, 5);
    float want[120], got[120], *back = NULL;
    char at[160], path[4096];
    int64_t sh[4];
    int nd = 0, f0 = tu_failures;
    for (int i = 0; i < 120; i++)
        want[i] = got[i] = (float)(i % 7) - 3.0f;
    got[1 * 60 + 2 * 20 + 3 * 5 + 4] += 0.5f; /* (b 1, n 2, h 3, d 4) */
    got[7] += 0.25f;
    decode(&s, 119, at, sizeof at);
    TU_CHECK(!strcmp(at, "(b 1, n 2, h 3, d 4)"), "decode 119: %s", at);
    decode(&s, 0, at, sizeof at);
    TU_CHECK(!strcmp(at, "(b 0, n 0, h 0, d 0)"), "decode 0: %s", at);
    if (mkdir(dir, 0777) && errno != EEXIST) {
        fprintf(stderr, "cannot make %s: %s\n", dir, strerror(errno));
        return 1;
    }
    out_dir = dir;
    printf("(the next comparison must FAIL: a planted error)\n");
    close_to("self-test/planted", got, want, &s, 1e-3);
    int planted = tu_failures - f0;
    tu_failures = f0; /* the planted failure is the expected outcome */
    TU_CHECK(planted == 1, "the planted error fails the comparison (%d failures)", planted);
    tu_err e = tu_compare(got, want, 120);
    decode(&s, e.worst, at, sizeof at);
    TU_CHECK(!strcmp(at, "(b 1, n 2, h 3, d 4)"), "worst element at %s", at);
    snprintf(path, sizeof path, "%s/self-test_planted.got.npy", dir);
    TU_OK(ditd_npy_read_f32(path, 4, &nd, sh, &back));
    TU_CHECK(back && nd == 4 && sh[0] == 2 && sh[1] == 3 && sh[2] == 4 && sh[3] == 5 &&
                 !memcmp(back, got, sizeof got),
             "%s: the array, shape (2, 3, 4, 5)", path);
    free(back);
    back = NULL;
    snprintf(path, sizeof path, "%s/self-test_planted.want.npy", dir);
    TU_OK(ditd_npy_read_f32(path, 4, &nd, sh, &back));
    TU_CHECK(back && !memcmp(back, want, sizeof want), "%s", path);
    free(back);
    /* the filter */
    char *words[] = {"test_cuda_ops", "--list", "fc1", "merge"};
    argc_ = 4, argv_ = words, filter = NULL;
    TU_CHECK(wanted("linear/fc1-gelu-dit-xl") && wanted("merge") && !wanted("attention/nk0"),
             "filter words");
    argc_ = 2, filter = "nk0,philox";
    TU_CHECK(wanted("attention/nk0") && wanted("philox") && !wanted("merge"), "DITD_OPS_FILTER");
    argc_ = 1, filter = NULL;
    TU_CHECK(wanted("anything"), "no filter: everything");
    return tu_exit();
}

int main(int argc, char **argv)
{
    argc_ = argc, argv_ = argv;
    filter = getenv("DITD_OPS_FILTER");
    if (filter && !*filter)
        filter = NULL;
    if (argc > 2 && !strcmp(argv[1], "--self-test"))
        return self_test(argv[2]);
    for (int i = 1; i < argc; i++)
        listing |= !strcmp(argv[i], "--list");
    if (listing)
        return run_checks();
    if (argc > 1 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"))) {
        printf("usage: test_cuda_ops [--list] [WORD...]  (or DITD_OPS_FILTER=a,b): the checks "
               "whose name contains a word\nDITD_TEST_SEED repeats a run; DITD_TEST_OUT (else "
               "$OUT): failing arrays as .npy\n");
        return 0;
    }
    if (!ditd_backend_cuda_available()) {
        printf("no CUDA device: skipped\n");
        return 77;
    }
    const char *s = getenv("DITD_TEST_SEED");
    rng = s && *s ? strtoull(s, NULL, 0) : (uint64_t)time(NULL) ^ ((uint64_t)clock() << 32);
    printf("seed %llu (DITD_TEST_SEED repeats it)\n", (unsigned long long)rng);
    out_dir = getenv("DITD_TEST_OUT");
    if (!out_dir || !*out_dir)
        out_dir = getenv("OUT");
    if (out_dir && !*out_dir)
        out_dir = NULL;
    if (out_dir && mkdir(out_dir, 0777) && errno != EEXIST) {
        fprintf(stderr, "cannot make %s: %s (no .npy dumps)\n", out_dir, strerror(errno));
        out_dir = NULL;
    }
    G = ditd_backend_get(DITD_DEVICE_CUDA);
    TU_CHECK(G != NULL, "CUDA backend: %s", ditd_err_detail());
    if (!G)
        return tu_exit();
    ST = (cudaStream_t)ditd_backend_cuda_compute_stream();
    if (run_checks()) {
        printf("%d checks, %d failed (stopped early)\n", tu_checks, tu_failures);
        return 1;
    }
    TU_CHECK(ran > 0, "no check matched the filter");
    TU_OK(G->status());
    ditd_backend_cuda_shutdown();
    return tu_exit();
}
