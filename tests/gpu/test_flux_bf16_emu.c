/* No GPU needed (suite 'bundle'): the bounds test_cuda_flux holds the CUDA
 * FLUX forward to (tests/gpu/flux_bounds.h), checked on a CPU emulation of
 * the CUDA backend's storage: the CPU's bf16-weight table with every op's
 * output (and every upload) rounded to bf16 to nearest even, as the CUDA
 * kernels round what they store. For every forward case of the FLUX
 * fixtures the emulated forward must stay within half of each bound:
 *   against the CPU's bf16-weight table (the same weights): FLUX_FWD_ACT / 2;
 *   against Diffusers' float64 output: FLUX_FWD_REF / 2.
 * What it is not: a test of any CUDA code; it says whether bf16 storage
 * alone, with these models, leaves room inside the stated bounds. At least
 * 5 cases must be checked. */
#include <string.h>

#include "engine/backend/backend.h"
#include "engine/models/flux/flux.h"
#include "tests/flux_case.h"
#include "tests/gpu/bf16_emu.h"
#include "tests/gpu/flux_bounds.h"

#define MIN_CASES 5

int main(void)
{
    /* the ops that store a result, rounded (tests/gpu/bf16_emu.h) */
    ditd_backend_ops E;
    bf16_emu_table(&E);

    int checked = 0;
    for (int mi = 0; mi < FLUX_MODELS; mi++) {
        char dir[4096], path[4200], what[600];
        ditd_flux_config cfg;
        size_t i;
        json_t *c, *cases;
        snprintf(dir, sizeof dir, "%s/flux/%s", tu_fixtures(), flux_models[mi]);
        snprintf(path, sizeof path, "%s/config.json", dir);
        TU_OK(ditd_flux_config_load(path, &cfg));
        cases = flux_cases(dir);
        json_array_foreach(cases, i, c) {
            flux_case fc;
            ditd_flux *mw = NULL, *me = NULL;
            if (flux_case_load(dir, c, &fc) == 0) {
                TU_OK(ditd_flux_new_mesh(&cfg, W, fc.B, fc.h, fc.w, fc.L, dir, NULL, &mw));
                TU_OK(ditd_flux_new_mesh(&cfg, &E, fc.B, fc.h, fc.w, fc.L, dir, NULL, &me));
            }
            if (mw && me) {
                const float *gd = cfg.guidance_embeds ? fc.guidance : NULL;
                float *ref = calloc(fc.n_out, sizeof *ref), *got = calloc(fc.n_out, sizeof *got);
                float *x = malloc(fc.n_out * sizeof *x); /* in = out size (latent channels) */
                memcpy(x, fc.x, fc.n_out * sizeof *x);
                round_n(x, fc.n_out); /* as the CUDA test uploads it */
                TU_OK(ditd_flux_forward(mw, fc.B, fc.x, fc.t, fc.text, fc.pooled, gd, ref));
                TU_OK(ditd_flux_forward(me, fc.B, x, fc.t, fc.text, fc.pooled, gd, got));
                snprintf(what, sizeof what,
                         "%s[%zu] bf16 storage vs the bf16-weight CPU table (FLUX_FWD_ACT / 2)",
                         flux_models[mi], i);
                TU_CLOSE(what, got, ref, fc.n_out, FLUX_FWD_ACT / 2);
                snprintf(what, sizeof what,
                         "%s[%zu] bf16 storage vs float64 Diffusers (FLUX_FWD_REF / 2)",
                         flux_models[mi], i);
                TU_CLOSE(what, got, fc.out, fc.n_out, FLUX_FWD_REF / 2);
                checked++;
                free(ref), free(got), free(x);
            }
            ditd_flux_free(mw);
            ditd_flux_free(me);
            flux_case_free(&fc);
        }
        json_decref(cases);
    }
    TU_CHECK(checked >= MIN_CASES, "checked %d cases (at least %d)", checked, MIN_CASES);
    return tu_exit();
}
