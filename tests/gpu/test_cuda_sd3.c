/* GPU: the SD3 family (SD3Transformer2DModel) on the CUDA backend. Exits 77
 * (skipped) without a GPU.
 *
 * Every forward case of tests/fixtures/sd3 (SD3, SD3.5-like with QK norms
 * and dual attention, a bf16 checkpoint; skip-layer guidance cases
 * included) on the CUDA backend: the weights in device memory, as many
 * bytes as the CPU's bf16-weight table holds; the forward against that
 * table (the same bf16 weights, f32 activations) within SD3_FWD_ACT and
 * against Diffusers' float64 output within SD3_FWD_REF
 * (tests/gpu/sd3_bounds.h, derived on a CPU emulation of bf16 storage that
 * test_sd3_bf16_emu keeps within half of each; the first GPU run is what
 * confirms them). The family runs on ops the CUDA backend already has (no
 * SD3-only kernel); this checks it end to end there. At least FWD_MIN
 * cases. */
#include <string.h>

#include "engine/backend/backend.h"
#include "engine/backend/backend_cuda.h"
#include "engine/models/sd3/sd3.h"
#include "tests/gpu/sd3_bounds.h"
#include "tests/sd3_case.h"

#define FWD_MIN 10

static const ditd_backend_ops *G;

static int run_model(const char *dir)
{
    char path[4200], what[600];
    ditd_sd3_config cfg;
    int checked = 0;
    size_t i;
    json_t *c, *cases;
    snprintf(path, sizeof path, "%s/config.json", dir);
    TU_OK(ditd_sd3_config_load(path, &cfg));
    cases = sd3_cases(dir);
    json_array_foreach(cases, i, c) {
        sd3_case fc;
        ditd_sd3 *mc = NULL, *mg = NULL;
        void *dx = NULL, *dout = NULL;
        if (sd3_case_load(dir, c, &fc) != 0)
            goto next;
        TU_OK(ditd_sd3_new_mesh(&cfg, &ditd_backend_cpu_bf16, fc.B, fc.h, fc.w, fc.L, dir, NULL,
                                &mc));
        TU_OK(ditd_sd3_new_mesh(&cfg, G, fc.B, fc.h, fc.w, fc.L, dir, NULL, &mg));
        if (!mc || !mg)
            goto next;
        if (i == 0) {
            TU_CHECK(ditd_backend_cuda_is_device_ptr(mg->patch_w) &&
                         ditd_backend_cuda_is_device_ptr(mg->blk[0].qkv.w) &&
                         ditd_backend_cuda_is_device_ptr(mg->pos),
                     "%s: weights and the positional window in device memory", dir);
            TU_CHECK(ditd_sd3_weight_bytes(mg) == ditd_sd3_weight_bytes(mc),
                     "%s: weights %zu bytes on the GPU, %zu in the CPU's bf16 table", dir,
                     ditd_sd3_weight_bytes(mg), ditd_sd3_weight_bytes(mc));
        }
        size_t nin = (size_t)fc.B * (size_t)cfg.in_channels * fc.h * fc.w;
        float *ref = calloc(fc.n_out, sizeof *ref), *got = calloc(fc.n_out, sizeof *got);
        TU_OK(ditd_sd3_forward(mc, fc.B, fc.x, fc.t, fc.text, fc.pooled, fc.skip, fc.n_skip, ref));
        TU_OK(G->mem_alloc(&dx, nin * ditd_dtype_size(G->act_dtype)));
        TU_OK(G->mem_alloc(&dout, fc.n_out * ditd_dtype_size(G->act_dtype)));
        if (dx && dout) {
            G->upload(dx, fc.x, nin);
            TU_OK(ditd_sd3_forward(mg, fc.B, dx, fc.t, fc.text, fc.pooled, fc.skip, fc.n_skip,
                                   dout));
            G->download(got, dout, fc.n_out);
            TU_OK(G->status());
            snprintf(what, sizeof what,
                     "cuda %s forward[%zu] B=%d latent %dx%d text %d, %d skipped vs float64 "
                     "Diffusers (its own bf16: %.3g)",
                     dir, i, fc.B, fc.w, fc.h, fc.L, fc.n_skip, fc.bf16_rel);
            TU_CLOSE(what, got, fc.out, fc.n_out, SD3_FWD_REF);
            snprintf(what, sizeof what, "cuda %s forward[%zu] vs the CPU's bf16-weight table", dir,
                     i);
            TU_CLOSE(what, got, ref, fc.n_out, SD3_FWD_ACT);
            checked++;
        }
        free(ref), free(got);
    next:
        if (dx)
            G->mem_free(dx, 0);
        if (dout)
            G->mem_free(dout, 0);
        ditd_sd3_free(mc);
        ditd_sd3_free(mg);
        sd3_case_free(&fc);
    }
    json_decref(cases);
    return checked;
}

int main(void)
{
    char dir[4096];
    int cases = 0;
    if (!ditd_backend_cuda_available()) {
        printf("no CUDA device: skipped\n");
        return 77;
    }
    G = ditd_backend_get(DITD_DEVICE_CUDA);
    TU_CHECK(G != NULL, "CUDA backend: %s", ditd_err_detail());
    if (!G)
        return tu_exit();
    for (int m = 0; m < SD3_MODELS; m++) {
        snprintf(dir, sizeof dir, "%s/sd3/%s", tu_fixtures(), sd3_models[m]);
        cases += run_model(dir);
    }
    TU_CHECK(cases >= FWD_MIN, "checked %d SD3 forward cases (at least %d)", cases, FWD_MIN);
    ditd_backend_cuda_shutdown();
    return tu_exit();
}
