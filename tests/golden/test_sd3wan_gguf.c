/* Golden: SD3.5 and Wan transformers read from GGUF files in their
 * original key names (engine/models/sd3/sd3_orig.c,
 * engine/models/wan/wan_orig.c: Diffusers' single-file conversions) against
 * Diffusers computed in float64 on the same weights dequantized by the gguf
 * package and mapped by Diffusers' own conversion
 * (tools/make_sd3_wan_gguf_fixtures.py): SD3.5 in Q8_0 with ComfyUI's
 * "model.diffusion_model." prefix (fused qkv cut, [shift; scale] swapped,
 * MMDiT-X attn2, QK norms, a skip-layer case), Wan in Q8_0 without the
 * prefix, Wan in Q4_K / Q5_K / Q6_K with it. Bound: max|ours - ref| /
 * max|ref| <= 1e-4 on every output; at least 5 cases. On each case: the
 * linears stay in their GGML blocks (ops->linear_q) and the output is
 * bit-identical to the same file dequantized at load
 * (DITD_WEIGHTS_DEQUANTIZE=1), in fewer bytes; the same weights in a GGUF
 * in Diffusers' names give the same bits (the mapping is exact); on the
 * first case of each model, the bf16 table too (quantized panels rounded to
 * bf16, bit-identical to the file dequantized at load into bf16 weights,
 * within test_bf16's 1e-2 of float64). The Wan 2.1 I2V-like fixture's
 * weights in original names (the image branch: img_emb.proj, k_img, v_img,
 * norm_k_img; F32, the same numbers) give that fixture's Diffusers outputs
 * within 1e-4 and the Diffusers-named checkpoint's bits. Refused,
 * naming the tensor: an original-named file with a tensor missing, and one
 * with a tensor no mapping reads (an unprefixed one beside prefixed names,
 * another component's, is left aside). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/backend/backend.h"
#include "engine/io/gguf.h"
#include "engine/models/sd3/sd3.h"
#include "engine/models/wan/wan.h"
#include "tests/sd3_case.h"
#include "tests/wan_case.h"

#define TOL 1e-4
#define MIN_CASES 5

/* ---- a GGUF file rewritten: one tensor dropped, or one added ---- */

typedef struct wbuf {
    uint8_t *p;
    size_t n, cap;
} wbuf;

static void put(wbuf *b, const void *v, size_t n)
{
    if (b->n + n > b->cap) {
        size_t cap = (b->n + n) * 2;
        uint8_t *p = realloc(b->p, cap);
        if (!p)
            abort();
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, v, n);
    b->n += n;
}

static void u32(wbuf *b, uint32_t v) { put(b, &v, 4); }
static void u64(wbuf *b, uint64_t v) { put(b, &v, 8); }

static void pad(wbuf *b, size_t a)
{
    static const uint8_t z[64] = {0};
    while (b->n % a)
        put(b, z, 1);
}

/* dst := src's tensors (no metadata, alignment 32) without `drop`, plus
 * `add` (a copy of the first 1-D F32 tensor under that name). 0 or -1. */
static int rewrite(const char *src, const char *dst, const char *drop, const char *add)
{
    ditd_gguf *g = NULL;
    if (ditd_gguf_open(src, &g))
        return -1;
    size_t n = ditd_gguf_count(g), keep = 0;
    const ditd_gguf_tensor *copy = NULL;
    for (size_t i = 0; i < n; i++) {
        const ditd_gguf_tensor *t = ditd_gguf_at(g, i);
        keep += !(drop && strcmp(t->name, drop) == 0);
        if (!copy && t->ndim == 1 && t->type == DITD_GGUF_F32)
            copy = t;
    }
    const ditd_gguf_tensor *list[4096];
    const char *names[4096];
    size_t k = 0;
    for (size_t i = 0; i < n && k < 4095; i++) {
        const ditd_gguf_tensor *t = ditd_gguf_at(g, i);
        if (!(drop && strcmp(t->name, drop) == 0)) {
            list[k] = t;
            names[k++] = t->name;
        }
    }
    if (add && copy) {
        list[k] = copy;
        names[k++] = add;
    }
    wbuf h = {0}, d = {0};
    put(&h, "GGUF", 4);
    u32(&h, 3);
    u64(&h, k);
    u64(&h, 0);
    for (size_t i = 0; i < k; i++) {
        const ditd_gguf_tensor *t = list[i];
        u64(&h, strlen(names[i]));
        put(&h, names[i], strlen(names[i]));
        u32(&h, (uint32_t)t->ndim);
        for (int j = 0; j < t->ndim; j++)
            u64(&h, (uint64_t)t->ne[j]);
        u32(&h, (uint32_t)t->type);
        pad(&d, 32);
        u64(&h, d.n);
        put(&d, t->data, t->nbytes);
    }
    pad(&h, 32);
    FILE *f = fopen(dst, "wb");
    int ok = f && fwrite(h.p, 1, h.n, f) == h.n && fwrite(d.p, 1, d.n, f) == d.n;
    if (f && fclose(f))
        ok = 0;
    free(h.p);
    free(d.p);
    ditd_gguf_free(g);
    (void)keep;
    return ok ? 0 : -1;
}

/* ---- SD3 ---- */

static int sd3_model(const char *dir, const char *twin)
{
    char path[4200], what[600];
    ditd_sd3_config cfg;
    int checked = 0;
    size_t i;
    json_t *c, *cases = sd3_cases(dir);
    snprintf(path, sizeof path, "%s/config.json", dir);
    TU_OK(ditd_sd3_config_load(path, &cfg));
    json_array_foreach(cases, i, c) {
        sd3_case fc;
        ditd_sd3 *m = NULL, *d = NULL, *t = NULL;
        if (sd3_case_load(dir, c, &fc) == 0)
            TU_OK(ditd_sd3_new_mesh(&cfg, &ditd_backend_cpu, fc.B, fc.h, fc.w, fc.L, dir, NULL,
                                    &m));
        if (m) {
            float *got = calloc(fc.n_out, sizeof *got), *o2 = calloc(fc.n_out, sizeof *o2);
            TU_OK(ditd_sd3_forward(m, fc.B, fc.x, fc.t, fc.text, fc.pooled, fc.skip, fc.n_skip,
                                   got));
            snprintf(what, sizeof what, "%s forward[%zu] B=%d latent %dx%d text %d skip %d", dir,
                     i, fc.B, fc.h, fc.w, fc.L, fc.n_skip);
            TU_CLOSE(what, got, fc.out, fc.n_out, TOL);
            checked++;
            setenv("DITD_WEIGHTS_DEQUANTIZE", "1", 1);
            TU_OK(ditd_sd3_new_mesh(&cfg, &ditd_backend_cpu, fc.B, fc.h, fc.w, fc.L, dir, NULL,
                                    &d));
            unsetenv("DITD_WEIGHTS_DEQUANTIZE");
            if (d) {
                TU_OK(ditd_sd3_forward(d, fc.B, fc.x, fc.t, fc.text, fc.pooled, fc.skip,
                                       fc.n_skip, o2));
                TU_CHECK(memcmp(got, o2, fc.n_out * sizeof *got) == 0,
                         "%s: kept quantized differs from dequantized at load", what);
                printf("     %d linears kept quantized: weights %zu bytes (%zu dequantized)\n",
                       m->quantized, ditd_sd3_weight_bytes(m), ditd_sd3_weight_bytes(d));
                TU_CHECK(m->quantized > 0 && d->quantized == 0 &&
                             ditd_sd3_weight_bytes(m) < ditd_sd3_weight_bytes(d),
                         "%s: %d quantized linears, %zu vs %zu bytes", what, m->quantized,
                         ditd_sd3_weight_bytes(m), ditd_sd3_weight_bytes(d));
            }
            TU_OK(ditd_sd3_new_mesh(&cfg, &ditd_backend_cpu, fc.B, fc.h, fc.w, fc.L, twin, NULL,
                                    &t));
            if (t) {
                memset(o2, 0, fc.n_out * sizeof *o2);
                TU_OK(ditd_sd3_forward(t, fc.B, fc.x, fc.t, fc.text, fc.pooled, fc.skip,
                                       fc.n_skip, o2));
                TU_CHECK(t->quantized == m->quantized &&
                             memcmp(got, o2, fc.n_out * sizeof *got) == 0,
                         "%s: original names differ from Diffusers' names (%s)", what, twin);
            }
            if (i == 0 && ditd_backend_cpu_has_bf16()) {
                ditd_sd3 *qb = NULL, *db = NULL;
                TU_OK(ditd_sd3_new_mesh(&cfg, &ditd_backend_cpu_bf16, fc.B, fc.h, fc.w, fc.L, dir,
                                        NULL, &qb));
                setenv("DITD_WEIGHTS_DEQUANTIZE", "1", 1);
                TU_OK(ditd_sd3_new_mesh(&cfg, &ditd_backend_cpu_bf16, fc.B, fc.h, fc.w, fc.L, dir,
                                        NULL, &db));
                unsetenv("DITD_WEIGHTS_DEQUANTIZE");
                if (qb && db) {
                    float *a = calloc(fc.n_out, sizeof *a), *b = calloc(fc.n_out, sizeof *b);
                    TU_OK(ditd_sd3_forward(qb, fc.B, fc.x, fc.t, fc.text, fc.pooled, fc.skip,
                                           fc.n_skip, a));
                    TU_OK(ditd_sd3_forward(db, fc.B, fc.x, fc.t, fc.text, fc.pooled, fc.skip,
                                           fc.n_skip, b));
                    TU_CHECK(qb->quantized > 0 && memcmp(a, b, fc.n_out * sizeof *a) == 0,
                             "%s bf16: kept quantized (%d linears) differs from dequantized at "
                             "load", what, qb->quantized);
                    snprintf(what, sizeof what, "%s forward[%zu] bf16 compute", dir, i);
                    TU_CLOSE(what, a, fc.out, fc.n_out, 1e-2);
                    free(a);
                    free(b);
                }
                ditd_sd3_free(qb);
                ditd_sd3_free(db);
            }
            free(got);
            free(o2);
        }
        ditd_sd3_free(m);
        ditd_sd3_free(d);
        ditd_sd3_free(t);
        sd3_case_free(&fc);
    }
    json_decref(cases);
    return checked;
}

/* ---- Wan ---- */

static int wan_model(const char *dir, const char *twin)
{
    char path[4200], what[600];
    ditd_wan_config cfg;
    int checked = 0;
    size_t i;
    json_t *c, *cases = wan_cases(dir);
    snprintf(path, sizeof path, "%s/config.json", dir);
    TU_OK(ditd_wan_config_load(path, &cfg));
    json_array_foreach(cases, i, c) {
        wan_case wc;
        ditd_wan *m = NULL, *d = NULL, *t = NULL;
        if (wan_case_load(dir, c, &wc) == 0)
            TU_OK(ditd_wan_new_mesh(&cfg, &ditd_backend_cpu, wc.B, wc.F, wc.h, wc.w, wc.L, dir,
                                    NULL, &m));
        if (m) {
            float *got = calloc(wc.n_out, sizeof *got), *o2 = calloc(wc.n_out, sizeof *o2);
            TU_OK(ditd_wan_forward(m, wc.B, wc.x, wc.t, NULL, wc.text, NULL, got));
            snprintf(what, sizeof what, "%s forward[%zu] B=%d %d frames of %dx%d text %d", dir,
                     i, wc.B, wc.F, wc.w, wc.h, wc.L);
            TU_CLOSE(what, got, wc.out, wc.n_out, TOL);
            checked++;
            setenv("DITD_WEIGHTS_DEQUANTIZE", "1", 1);
            TU_OK(ditd_wan_new_mesh(&cfg, &ditd_backend_cpu, wc.B, wc.F, wc.h, wc.w, wc.L, dir,
                                    NULL, &d));
            unsetenv("DITD_WEIGHTS_DEQUANTIZE");
            if (d) {
                TU_OK(ditd_wan_forward(d, wc.B, wc.x, wc.t, NULL, wc.text, NULL, o2));
                TU_CHECK(memcmp(got, o2, wc.n_out * sizeof *got) == 0,
                         "%s: kept quantized differs from dequantized at load", what);
                printf("     %d linears kept quantized: weights %zu bytes (%zu dequantized)\n",
                       m->quantized, ditd_wan_weight_bytes(m), ditd_wan_weight_bytes(d));
                TU_CHECK(m->quantized > 0 && d->quantized == 0 &&
                             ditd_wan_weight_bytes(m) < ditd_wan_weight_bytes(d),
                         "%s: %d quantized linears, %zu vs %zu bytes", what, m->quantized,
                         ditd_wan_weight_bytes(m), ditd_wan_weight_bytes(d));
            }
            if (twin) {
                TU_OK(ditd_wan_new_mesh(&cfg, &ditd_backend_cpu, wc.B, wc.F, wc.h, wc.w, wc.L,
                                        twin, NULL, &t));
                if (t) {
                    memset(o2, 0, wc.n_out * sizeof *o2);
                    TU_OK(ditd_wan_forward(t, wc.B, wc.x, wc.t, NULL, wc.text, NULL, o2));
                    TU_CHECK(t->quantized == m->quantized &&
                                 memcmp(got, o2, wc.n_out * sizeof *got) == 0,
                             "%s: original names differ from Diffusers' names (%s)", what, twin);
                }
            }
            if (i == 0 && ditd_backend_cpu_has_bf16()) {
                ditd_wan *qb = NULL, *db = NULL;
                TU_OK(ditd_wan_new_mesh(&cfg, &ditd_backend_cpu_bf16, wc.B, wc.F, wc.h, wc.w,
                                        wc.L, dir, NULL, &qb));
                setenv("DITD_WEIGHTS_DEQUANTIZE", "1", 1);
                TU_OK(ditd_wan_new_mesh(&cfg, &ditd_backend_cpu_bf16, wc.B, wc.F, wc.h, wc.w,
                                        wc.L, dir, NULL, &db));
                unsetenv("DITD_WEIGHTS_DEQUANTIZE");
                if (qb && db) {
                    float *a = calloc(wc.n_out, sizeof *a), *b = calloc(wc.n_out, sizeof *b);
                    TU_OK(ditd_wan_forward(qb, wc.B, wc.x, wc.t, NULL, wc.text, NULL, a));
                    TU_OK(ditd_wan_forward(db, wc.B, wc.x, wc.t, NULL, wc.text, NULL, b));
                    TU_CHECK(qb->quantized > 0 && memcmp(a, b, wc.n_out * sizeof *a) == 0,
                             "%s bf16: kept quantized (%d linears) differs from dequantized at "
                             "load", what, qb->quantized);
                    snprintf(what, sizeof what, "%s forward[%zu] bf16 compute", dir, i);
                    TU_CLOSE(what, a, wc.out, wc.n_out, 1e-2);
                    free(a);
                    free(b);
                }
                ditd_wan_free(qb);
                ditd_wan_free(db);
            }
            free(got);
            free(o2);
        }
        ditd_wan_free(m);
        ditd_wan_free(d);
        ditd_wan_free(t);
        wan_case_free(&wc);
    }
    json_decref(cases);
    return checked;
}

/* The I2V fixture (tests/fixtures/wan/i2v21) read from its original-named
 * GGUF against its own references and its safetensors checkpoint. */
static int wan_i2v_orig(void)
{
    char dir[4096], gg[4200], path[4200], what[600];
    ditd_wan_config cfg;
    int checked = 0;
    size_t i;
    snprintf(dir, sizeof dir, "%s/wan/i2v21", tu_fixtures());
    snprintf(gg, sizeof gg, "%s/sd3wan_gguf/pipeline/wan-i2v21-orig-f32.gguf", tu_fixtures());
    snprintf(path, sizeof path, "%s/config.json", dir);
    TU_OK(ditd_wan_config_load(path, &cfg));
    json_t *c, *cases = wan_cases(dir);
    json_array_foreach(cases, i, c) {
        wan_case wc;
        ditd_wan *m = NULL, *st = NULL;
        if (wan_case_load(dir, c, &wc) == 0) {
            TU_OK(ditd_wan_new_mesh(&cfg, &ditd_backend_cpu, wc.B, wc.F, wc.h, wc.w, wc.L, gg,
                                    NULL, &m));
            TU_OK(ditd_wan_new_mesh(&cfg, &ditd_backend_cpu, wc.B, wc.F, wc.h, wc.w, wc.L, dir,
                                    NULL, &st));
        }
        if (m && st) {
            float *a = calloc(wc.n_out, sizeof *a), *b = calloc(wc.n_out, sizeof *b);
            TU_OK(ditd_wan_forward(m, wc.B, wc.x, wc.t, wc.t_frames, wc.text, wc.image, a));
            TU_OK(ditd_wan_forward(st, wc.B, wc.x, wc.t, wc.t_frames, wc.text, wc.image, b));
            snprintf(what, sizeof what, "%s forward[%zu] (image branch, original names)", gg, i);
            TU_CLOSE(what, a, wc.out, wc.n_out, TOL);
            TU_CHECK(memcmp(a, b, wc.n_out * sizeof *a) == 0,
                     "%s: original names differ from the Diffusers checkpoint", what);
            checked++;
            free(a);
            free(b);
        }
        ditd_wan_free(m);
        ditd_wan_free(st);
        wan_case_free(&wc);
    }
    json_decref(cases);
    return checked;
}

/* ---- refusals ---- */

static void refusals(void)
{
    char tmp[512], src[4200], bad[700], path[4200];
    if (tu_mkdtemp(tmp, sizeof tmp, "sd3wan-gguf") != 0)
        return;
    snprintf(bad, sizeof bad, "%s/bad.gguf", tmp);
    {
        ditd_sd3_config cfg;
        ditd_sd3 *m = NULL;
        snprintf(path, sizeof path, "%s/sd3wan_gguf/sd35-q8_0/config.json", tu_fixtures());
        snprintf(src, sizeof src, "%s/sd3wan_gguf/sd35-q8_0/sd35-q8_0.gguf", tu_fixtures());
        TU_OK(ditd_sd3_config_load(path, &cfg));
        const char *gone = "model.diffusion_model.joint_blocks.1.x_block.mlp.fc2.bias";
        TU_CHECK(rewrite(src, bad, gone, NULL) == 0, "write %s", bad);
        TU_CHECK_ERR(ditd_sd3_new_mesh(&cfg, &ditd_backend_cpu, 1, 8, 8, 7, bad, NULL, &m),
                     DITD_EFORMAT, gone, "transformer_blocks.1.ff.net.2.bias", "missing");
        const char *extra = "model.diffusion_model.joint_blocks.0.x_block.attn.extra.bias";
        TU_CHECK(rewrite(src, bad, NULL, extra) == 0, "write %s", bad);
        TU_CHECK_ERR(ditd_sd3_new_mesh(&cfg, &ditd_backend_cpu, 1, 8, 8, 7, bad, NULL, &m),
                     DITD_EFORMAT, extra, "SD3Transformer2DModel");
        /* an unprefixed tensor beside the prefixed ones: another component's
         * (a whole-pipeline checkpoint's VAE), left aside as Diffusers does */
        TU_CHECK(rewrite(src, bad, NULL, "first_stage_model.decoder.conv_in.bias") == 0,
                 "write %s", bad);
        TU_OK(ditd_sd3_new_mesh(&cfg, &ditd_backend_cpu, 1, 8, 8, 7, bad, NULL, &m));
        ditd_sd3_free(m);
        m = NULL;
        /* a config of one block: the file's block 0 has a context stream
         * (to_add_out) the config's last block does not */
        cfg.num_layers = 1;
        TU_CHECK_ERR(ditd_sd3_new_mesh(&cfg, &ditd_backend_cpu, 1, 8, 8, 7, src, NULL, &m),
                     DITD_EFORMAT, "joint_blocks.0.context_block.attn.proj.weight",
                     "transformer_blocks.0.attn.to_add_out.weight", "no such layer");
    }
    {
        ditd_wan_config cfg;
        ditd_wan *m = NULL;
        snprintf(path, sizeof path, "%s/sd3wan_gguf/wan-q8_0/config.json", tu_fixtures());
        snprintf(src, sizeof src, "%s/sd3wan_gguf/wan-q8_0/wan-q8_0.gguf", tu_fixtures());
        TU_OK(ditd_wan_config_load(path, &cfg));
        TU_CHECK(rewrite(src, bad, "blocks.1.ffn.2.bias", NULL) == 0, "write %s", bad);
        TU_CHECK_ERR(ditd_wan_new_mesh(&cfg, &ditd_backend_cpu, 1, 1, 4, 4, 3, bad, NULL, &m),
                     DITD_ENOENT, "blocks.1.ffn.net.2.bias");
        TU_CHECK(rewrite(src, bad, NULL, "blocks.0.self_attn.extra.bias") == 0, "write %s", bad);
        TU_CHECK_ERR(ditd_wan_new_mesh(&cfg, &ditd_backend_cpu, 1, 1, 4, 4, 3, bad, NULL, &m),
                     DITD_EFORMAT, "blocks.0.self_attn.extra.bias", "WanTransformer3DModel");
    }
    unlink(bad);
    rmdir(tmp);
}

int main(void)
{
    char dir[4096], twin[4096];
    int cases = 0;
    snprintf(dir, sizeof dir, "%s/sd3wan_gguf/sd35-q8_0", tu_fixtures());
    snprintf(twin, sizeof twin, "%s/sd3wan_gguf/sd35-q8_0-diffusers", tu_fixtures());
    cases += sd3_model(dir, twin);
    snprintf(dir, sizeof dir, "%s/sd3wan_gguf/wan-q8_0", tu_fixtures());
    snprintf(twin, sizeof twin, "%s/sd3wan_gguf/wan-q8_0-diffusers", tu_fixtures());
    cases += wan_model(dir, twin);
    snprintf(dir, sizeof dir, "%s/sd3wan_gguf/wan-q4_k", tu_fixtures());
    cases += wan_model(dir, NULL);
    TU_CHECK(cases >= MIN_CASES, "SD3 / Wan GGUF cases checked: %d (at least %d)", cases,
             MIN_CASES);
    int i2v = wan_i2v_orig();
    TU_CHECK(i2v >= 2, "Wan I2V original-name cases checked: %d (at least 2)", i2v);
    refusals();
    return tu_exit();
}
