/* libFuzzer target: the text-encoder part of LoRA adapter files
 * (engine/text/text_lora.c) over one safetensors image, against two encoders
 * of a few linears each: "text_encoder" (a CLIP: the optional "text_model."
 * prefix, kohya lora_te1_ / lora_te_) and "text_encoder_2" (a T5, no kohya
 * names). When it opens, every uploaded module is checked against its target
 * (rank in range, the scale finite, A and B finite, in the upload's place).
 * The "device" is host memory with a LoRA op that is never called. Replayed
 * over corpus/text_lora in the 'fuzz' suite. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/error.h"
#include "engine/text/text_lora.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void up(void *dst, const float *src, size_t n)
{
    memcpy(dst, src, n * sizeof *src);
}

static void lora_op(const void *x, size_t ldx, const void *a, const void *b, float s, void *y,
                    size_t ldy, int M, int N, int K, int r, float *tmp, ditd_act act)
{
    (void)x, (void)ldx, (void)a, (void)b, (void)s, (void)y, (void)ldy, (void)M, (void)N;
    (void)K, (void)r, (void)tmp, (void)act;
    abort(); /* loading queues no op */
}

static const ditd_backend_ops host = {
    .name = "fuzz", .act_dtype = DITD_DTYPE_F32, .upload = up, .lora = lora_op};

static const ditd_lora_target clip_t[] = {
    {.name = "encoder.layers.0.self_attn.q_proj", .n_out = 3, .k_in = 3},
    {.name = "encoder.layers.0.mlp.fc1", .n_out = 5, .k_in = 3},
    {.name = "text_projection", .n_out = 2, .k_in = 3},
};
static const ditd_lora_target t5_t[] = {
    {.name = "encoder.block.0.layer.0.SelfAttention.q", .n_out = 4, .k_in = 3},
    {.name = "encoder.block.0.layer.1.DenseReluDense.wo", .n_out = 3, .k_in = 6},
};

static const ditd_text_lora_part parts[2] = {
    {.component = "text_encoder", .kind = "CLIP", .kohya = {"lora_te1_", "lora_te_"},
     .optional_prefix = "text_model.", .targets = clip_t, .n_targets = 3, .ops = &host},
    {.component = "text_encoder_2", .kind = "T5", .targets = t5_t, .n_targets = 2, .ops = &host},
};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ditd_text_lora *t = NULL;
    if (ditd_text_lora_open_mem(data, size, "fuzz.safetensors", "fuzz", parts, 2, &t) != 0) {
        if (t || ditd_err_detail()[0] == '\0')
            abort(); /* an error must leave no adapter and say why */
        return 0;
    }
    if (t->n_parts != 2)
        abort();
    for (int p = 0; p < 2; p++) {
        const ditd_lora_dev *d = t->dev[p];
        if (!d) {
            if (t->n_mod[p])
                abort();
            continue;
        }
        const ditd_lora_target *tg = parts[p].targets;
        int mods = 0;
        for (int i = 0; i < d->n_targets; i++) {
            const ditd_lora_dev_mod *m = &d->t[i];
            if (!m->rank)
                continue;
            mods++;
            if (m->rank < 0 || m->rank > DITD_LORA_MAX_RANK || m->rank > t->max_rank ||
                !isfinite(m->scale))
                abort();
            const float *a = m->a, *b = m->b;
            for (size_t j = 0; j < (size_t)m->rank * (size_t)tg[i].k_in; j++)
                if (!isfinite(a[j]))
                    abort();
            for (size_t j = 0; j < (size_t)tg[i].n_out * (size_t)m->rank; j++)
                if (!isfinite(b[j]))
                    abort();
        }
        if (mods != t->n_mod[p] || d->n_targets != parts[p].n_targets)
            abort();
    }
    ditd_text_lora_free(t);
    return 0;
}
