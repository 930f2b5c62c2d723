/* The CPU backend's text-encoder ops. Thin adapters from the ops table's types to kernels/cpu/text_kernels.h; no
 * arithmetic here. */
#include "engine/backend/backend_cpu_text.h"

#include <assert.h>
#include <string.h>

#include "engine/core/error.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/text_kernels.h"

static ditd_cpu_tact tact(ditd_text_act a)
{
    switch (a) {
    case DITD_TEXT_ACT_GELU: return DITD_CPU_TACT_GELU;
    case DITD_TEXT_ACT_GELU_NEW: return DITD_CPU_TACT_GELU_TANH;
    case DITD_TEXT_ACT_QUICK_GELU: return DITD_CPU_TACT_QUICK_GELU;
    case DITD_TEXT_ACT_RELU: return DITD_CPU_TACT_RELU;
    case DITD_TEXT_ACT_NONE: break;
    }
    return DITD_CPU_TACT_NONE;
}

static ditd_cpu_wtype wtype(ditd_dtype t)
{
    switch (t) {
    case DITD_DTYPE_F16: return DITD_CPU_W_F16;
    case DITD_DTYPE_BF16: return DITD_CPU_W_BF16;
    case DITD_DTYPE_F32: return DITD_CPU_W_F32;
    case DITD_DTYPE_I64: break;
    }
    assert(!"weight dtype must be f32, f16 or bf16");
    return DITD_CPU_W_F32;
}

void ditd__cpu_linear_wt(const void *x, size_t ldx, const void *w, ditd_dtype wdt, const void *b,
                         void *y, size_t ldy, int M, int N, int K, ditd_text_act act,
                         void *scratch, size_t scratch_elems)
{
    ditd_cpu_linear_wt(x, ldx, w, wtype(wdt), b, y, ldy, M, N, K, tact(act), scratch,
                       scratch_elems);
}

void ditd__cpu_mul(void *y, const void *x, size_t n)
{
    ditd_cpu_mul(y, x, n);
}

void ditd__cpu_embedding_wt(const void *table, ditd_dtype wdt, const int64_t *h_ids, void *out,
                            int n, int D)
{
    ditd_cpu_embedding_wt(table, wtype(wdt), h_ids, out, n, D);
}

void ditd__cpu_layernorm_affine(const void *x, void *y, int rows, int D, float eps, const void *g,
                                const void *b)
{
    ditd_cpu_layernorm_affine(x, y, rows, D, eps, g, b);
}

void ditd__cpu_rmsnorm(const void *x, void *y, int rows, int D, float eps, const void *w)
{
    ditd_cpu_rmsnorm(x, y, rows, D, eps, w);
}

void ditd__cpu_attention_masked(const void *q, size_t ldq, const void *k, size_t ldk,
                                const void *v, size_t ldv, void *o, size_t ldo, int B, int N,
                                int H, int Dh, float scale, const void *rel, const uint8_t *keep,
                                int causal, void *scratch)
{
    ditd_cpu_attention_masked(q, ldq, k, ldk, v, ldv, o, ldo, B, N, H, Dh, scale, rel, keep,
                              causal, scratch);
}

void ditd__cpu_act_text(void *y, size_t ldy, int rows, int cols, ditd_text_act act)
{
    ditd_cpu_tact_apply(y, ldy, rows, cols, tact(act));
}
