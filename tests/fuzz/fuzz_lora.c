/* libFuzzer target: the LoRA adapter loader (engine/models/lora.c and the
 * community FLUX formats of engine/models/lora_convert.c) over one
 * safetensors image, against a fixed list of linears: three DiT-named ones
 * (PEFT and kohya names resolve onto them) and a FLUX-named set with a
 * double block's q|k|v, a single block's q|k|v|mlp, norm_out, x_embedder
 * and a row-grouped proj_out (kohya-bfl, bfl and xlabs names resolve onto
 * those). When it opens, every module it returned is
 * checked against its target (rank in range, the scale finite, A and B
 * finite numbers), so what passed the loader's checks is what a model may
 * upload. Replayed over corpus/lora in the 'fuzz' suite. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "engine/core/error.h"
#include "engine/models/lora.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const ditd_lora_target targets[] = {
    {.name = "transformer_blocks.0.attn1.to_q", .n_out = 3, .k_in = 2},
    {.name = "transformer_blocks.0.ff.net.0.proj", .n_out = 4, .k_in = 2},
    {.name = "proj_out", .n_out = 2, .k_in = 4, .row_groups = 2},
    {.name = "transformer_blocks.0.attn.to_q", .n_out = 2, .k_in = 2},
    {.name = "transformer_blocks.0.attn.to_k", .n_out = 2, .k_in = 2},
    {.name = "transformer_blocks.0.attn.to_v", .n_out = 2, .k_in = 2},
    {.name = "single_transformer_blocks.0.attn.to_q", .n_out = 2, .k_in = 2},
    {.name = "single_transformer_blocks.0.attn.to_k", .n_out = 2, .k_in = 2},
    {.name = "single_transformer_blocks.0.attn.to_v", .n_out = 2, .k_in = 2},
    {.name = "single_transformer_blocks.0.proj_mlp", .n_out = 4, .k_in = 2},
    {.name = "single_transformer_blocks.0.proj_out", .n_out = 2, .k_in = 6},
    {.name = "norm_out.linear", .n_out = 4, .k_in = 2},
    {.name = "x_embedder", .n_out = 2, .k_in = 4},
};
#define NT ((int)(sizeof targets / sizeof targets[0]))

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ditd_lora *l = NULL;
    if (ditd_lora_open_mem(data, size, "fuzz.safetensors", "fuzz", targets, NT, &l) != 0) {
        if (l || ditd_err_detail()[0] == '\0')
            abort(); /* an error must leave no adapter and say why */
        return 0;
    }
    if (l->n_mod < 1)
        abort();
    for (int i = 0; i < l->n_mod; i++) {
        const ditd_lora_module *m = &l->mod[i];
        if (m->target < 0 || m->target >= NT || (i && m->target <= l->mod[i - 1].target))
            abort(); /* one module per target, sorted */
        const ditd_lora_target *t = &targets[m->target];
        if (m->rank < 1 || m->rank > DITD_LORA_MAX_RANK || m->rank > l->max_rank ||
            m->n_out != t->n_out || m->k_in != t->k_in || !isfinite(m->scale))
            abort();
        for (size_t j = 0; j < (size_t)m->rank * (size_t)m->k_in; j++)
            if (!isfinite(m->a[j]))
                abort();
        for (size_t j = 0; j < (size_t)m->n_out * (size_t)m->rank; j++)
            if (!isfinite(m->b[j]))
                abort();
    }
    ditd_lora_free(l);
    return 0;
}
