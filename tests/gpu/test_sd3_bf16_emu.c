/* No GPU needed (suite 'bundle'): the bounds test_cuda_sd3 holds the CUDA
 * SD3 forward to (tests/gpu/sd3_bounds.h), checked on the CPU emulation of
 * the CUDA backend's bf16 storage (tests/gpu/bf16_emu.h). For every forward
 * case of the SD3 fixtures (skip-layer cases included) the emulated forward
 * must stay within half of each bound:
 *   against the CPU's bf16-weight table (the same weights): SD3_FWD_ACT / 2;
 *   against Diffusers' float64 output: SD3_FWD_REF / 2.
 * What it is not: a test of any CUDA code; it says whether bf16 storage
 * alone, with these models, leaves room inside the stated bounds. At least
 * 10 cases must be checked. */
#include <string.h>

#include "engine/models/sd3/sd3.h"
#include "tests/gpu/bf16_emu.h"
#include "tests/gpu/sd3_bounds.h"
#include "tests/sd3_case.h"

#define MIN_CASES 10

int main(void)
{
    ditd_backend_ops E;
    bf16_emu_table(&E);
    int checked = 0;
    for (int mi = 0; mi < SD3_MODELS; mi++) {
        char dir[4096], path[4200], what[600];
        ditd_sd3_config cfg;
        size_t i;
        json_t *c, *cases;
        snprintf(dir, sizeof dir, "%s/sd3/%s", tu_fixtures(), sd3_models[mi]);
        snprintf(path, sizeof path, "%s/config.json", dir);
        TU_OK(ditd_sd3_config_load(path, &cfg));
        cases = sd3_cases(dir);
        json_array_foreach(cases, i, c) {
            sd3_case fc;
            ditd_sd3 *mw = NULL, *me = NULL;
            if (sd3_case_load(dir, c, &fc) == 0) {
                TU_OK(ditd_sd3_new_mesh(&cfg, W, fc.B, fc.h, fc.w, fc.L, dir, NULL, &mw));
                TU_OK(ditd_sd3_new_mesh(&cfg, &E, fc.B, fc.h, fc.w, fc.L, dir, NULL, &me));
            }
            if (mw && me) {
                size_t nin = (size_t)fc.B * (size_t)cfg.in_channels * fc.h * fc.w;
                float *ref = calloc(fc.n_out, sizeof *ref), *got = calloc(fc.n_out, sizeof *got);
                float *x = malloc(nin * sizeof *x);
                memcpy(x, fc.x, nin * sizeof *x);
                round_n(x, nin); /* as the CUDA test uploads it */
                TU_OK(ditd_sd3_forward(mw, fc.B, fc.x, fc.t, fc.text, fc.pooled, fc.skip,
                                       fc.n_skip, ref));
                TU_OK(ditd_sd3_forward(me, fc.B, x, fc.t, fc.text, fc.pooled, fc.skip, fc.n_skip,
                                       got));
                snprintf(what, sizeof what,
                         "%s[%zu] bf16 storage vs the bf16-weight CPU table (SD3_FWD_ACT / 2)",
                         sd3_models[mi], i);
                TU_CLOSE(what, got, ref, fc.n_out, SD3_FWD_ACT / 2);
                snprintf(what, sizeof what,
                         "%s[%zu] bf16 storage vs float64 Diffusers (SD3_FWD_REF / 2; Diffusers' "
                         "own bf16: %.3g)",
                         sd3_models[mi], i, fc.bf16_rel);
                TU_CLOSE(what, got, fc.out, fc.n_out, SD3_FWD_REF / 2);
                checked++;
                free(ref), free(got), free(x);
            }
            ditd_sd3_free(mw);
            ditd_sd3_free(me);
            sd3_case_free(&fc);
        }
        json_decref(cases);
    }
    TU_CHECK(checked >= MIN_CASES, "checked %d cases (at least %d)", checked, MIN_CASES);
    return tu_exit();
}
