/* A family's LoRA target list and its linears with adapters on them
 * (engine/models/lora_linear.h). */
#include "engine/models/lora_linear.h"

#include <stdarg.h>
#include <stdio.h>

void ditd_lora_list_add(ditd_lora_list *l, ditd_lora_slot *slot, ditd_lora_cut cut, int n_out,
                        int k_in, int parts, const char *const *part, const char *fmt, ...)
{
    char name[sizeof l->t->name];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    slot->first1 = l->n + 1;
    slot->parts = parts;
    for (int i = 0; i < parts; i++, l->n++) {
        if (l->n >= l->cap)
            continue;
        ditd_lora_target *t = &l->t[l->n];
        if (parts > 1)
            snprintf(t->name, sizeof t->name, "%s.%s", name, part[i]);
        else
            snprintf(t->name, sizeof t->name, "%s", name);
        t->n_out = n_out / parts;
        t->k_in = k_in;
        if (l->tp > 1)
            ditd_lora_target_slice(t, cut.shard, cut.n_rng, cut.off, cut.len);
    }
}

void ditd_lora_linear(const ditd_backend_ops *ops, const ditd_lora_set *const *sets, int B,
                      ditd_lora_slot slot, const void *x, size_t ldx, const void *w,
                      const ditd_qweight *q, const void *b, void *y, size_t ldy, int M, int N,
                      int K, ditd_act act, float *tmp, size_t tmp_floats)
{
    int touch = 0;
    for (int p = 0; sets && slot.first1 && p < slot.parts; p++)
        touch |= ditd_lora_touches(sets, B, slot.first1 - 1 + p);
    if (q && q->data)
        ops->linear_q(x, ldx, q, b, y, ldy, M, touch ? DITD_ACT_NONE : act);
    else
        ops->linear(x, ldx, w, b, y, ldy, M, N, K, touch ? DITD_ACT_NONE : act);
    if (!touch)
        return;
    int np = slot.parts, Np = N / np;
    for (int p = 0; p < np; p++) /* a fused linear has no activation */
        ditd_lora_apply(ops, sets, B, M / B, slot.first1 - 1 + p, x, ldx,
                        ditd_ptr_act(ops, y, (size_t)p * (size_t)Np), ldy, Np, K,
                        np > 1 ? DITD_ACT_NONE : act, tmp, tmp_floats);
}
