/* No GPU needed (suite 'bundle'): the bounds test_cuda_wan holds the CUDA
 * Wan forward to (tests/gpu/wan_bounds.h), checked on a CPU emulation of the
 * CUDA backend's bf16 storage (tests/gpu/bf16_emu.h). For every forward
 * case of the Wan fixtures the emulated forward must stay within half of
 * each bound:
 *   against the CPU's bf16-weight table (the same weights): WAN_FWD_ACT / 2;
 *   against Diffusers' float64 output: WAN_FWD_REF / 2.
 * What it is not: a test of any CUDA code; it says whether bf16 storage
 * alone, with these models, leaves room inside the stated bounds. At least
 * 13 cases must be checked. */
#include <string.h>

#include "engine/backend/backend.h"
#include "engine/models/wan/wan.h"
#include "tests/gpu/bf16_emu.h"
#include "tests/gpu/wan_bounds.h"
#include "tests/wan_case.h"

#define MIN_CASES 13

int main(void)
{
    ditd_backend_ops E;
    bf16_emu_table(&E);

    int checked = 0;
    for (int mi = 0; mi < WAN_MODELS; mi++) {
        char dir[4096], path[4200], what[600];
        ditd_wan_config cfg;
        size_t i;
        json_t *c, *cases;
        snprintf(dir, sizeof dir, "%s/wan/%s", tu_fixtures(), wan_models[mi]);
        snprintf(path, sizeof path, "%s/config.json", dir);
        TU_OK(ditd_wan_config_load(path, &cfg));
        cases = wan_cases(dir);
        json_array_foreach(cases, i, c) {
            wan_case wc;
            ditd_wan *mw = NULL, *me = NULL;
            if (wan_case_load(dir, c, &wc) == 0) {
                TU_OK(ditd_wan_new_mesh(&cfg, W, wc.B, wc.F, wc.h, wc.w, wc.L, dir, NULL, &mw));
                TU_OK(ditd_wan_new_mesh(&cfg, &E, wc.B, wc.F, wc.h, wc.w, wc.L, dir, NULL, &me));
            }
            if (mw && me) {
                size_t nin = (size_t)wc.B * cfg.in_channels * wc.F * wc.h * wc.w;
                float *ref = calloc(wc.n_out, sizeof *ref), *got = calloc(wc.n_out, sizeof *got);
                float *x = malloc(nin * sizeof *x);
                memcpy(x, wc.x, nin * sizeof *x);
                round_n(x, nin); /* as the CUDA test uploads it */
                TU_OK(ditd_wan_forward(mw, wc.B, wc.x, wc.t, wc.t_frames, wc.text, wc.image, ref));
                TU_OK(ditd_wan_forward(me, wc.B, x, wc.t, wc.t_frames, wc.text, wc.image, got));
                snprintf(what, sizeof what,
                         "%s[%zu] bf16 storage vs the bf16-weight CPU table (WAN_FWD_ACT / 2)",
                         wan_models[mi], i);
                TU_CLOSE(what, got, ref, wc.n_out, WAN_FWD_ACT / 2);
                snprintf(what, sizeof what,
                         "%s[%zu] bf16 storage vs float64 Diffusers (WAN_FWD_REF / 2)",
                         wan_models[mi], i);
                TU_CLOSE(what, got, wc.out, wc.n_out, WAN_FWD_REF / 2);
                checked++;
                free(ref), free(got), free(x);
            }
            ditd_wan_free(mw);
            ditd_wan_free(me);
            wan_case_free(&wc);
        }
        json_decref(cases);
    }
    TU_CHECK(checked >= MIN_CASES, "checked %d cases (at least %d)", checked, MIN_CASES);
    return tu_exit();
}
