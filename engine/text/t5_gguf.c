/* A T5 encoder GGUF (llama.cpp's names, as the shared
 * t5-v1_1-xxl-encoder-*.gguf files keep them) read under transformers'
 * T5EncoderModel names: aliases on the weight source (engine/io/weights.h),
 * the map gguf-py's T5ENCODER tensor table gives (and transformers'
 * GGUF loader inverts):
 *
 *   token_embd                      shared
 *   enc.blk.{i}.attn_{q,k,v,o}      encoder.block.{i}.layer.0.SelfAttention.{q,k,v,o}
 *   enc.blk.{i}.attn_rel_b          ...layer.0.SelfAttention.relative_attention_bias
 *   enc.blk.{i}.attn_norm           ...layer.0.layer_norm
 *   enc.blk.{i}.ffn_gate            ...layer.1.DenseReluDense.wi_0 (gated)
 *   enc.blk.{i}.ffn_up              ...wi_1 (gated), else ...wi
 *   enc.blk.{i}.ffn_down            ...wo
 *   enc.blk.{i}.ffn_norm            ...layer.1.layer_norm
 *   enc.output_norm                 encoder.final_layer_norm
 *
 * each with its ".weight". The tensors' (PyTorch-order) shapes are
 * transformers' own. What it is not: a config reader (the folder's
 * config.json says the shapes) or a decoder map. */
#include "engine/text/t5_gguf.h"

#include <stdio.h>
#include <string.h>

#include "engine/core/error.h"

static int alias1(ditd_weights *w, const char *hf, const char *gg)
{
    if (!ditd_weights_has_raw(w, gg) || ditd_weights_has_raw(w, hf))
        return 0; /* absent: the encoder's walk names what it misses */
    const ditd_weight_seg seg = {gg, 0, -1};
    return ditd_weights_alias(w, hf, 1, &seg);
}

int ditd__t5_gguf_alias(ditd_weights *w, int num_layers)
{
    const ditd_gguf *g = ditd_weights_gguf(w);
    if (!g)
        return 0;
    const char *arch = ditd_gguf_kv_str(g, "general.architecture");
    if (arch && strcmp(arch, "t5") != 0 && strcmp(arch, "t5encoder") != 0)
        return ditd_err_set(DITD_EFORMAT,
                            "%s: general.architecture is \"%s\", not a T5 encoder (t5encoder)",
                            ditd_weights_path(w), arch);
    if (!ditd_weights_has_raw(w, "enc.blk.0.attn_q.weight") &&
        !ditd_weights_has_raw(w, "encoder.block.0.layer.0.SelfAttention.q.weight"))
        return ditd_err_set(DITD_EFORMAT,
                            "%s: neither enc.blk.0.attn_q.weight (llama.cpp's T5 names) nor "
                            "encoder.block.0.layer.0.SelfAttention.q.weight: not a T5 encoder",
                            ditd_weights_path(w));
    int err;
    if ((err = alias1(w, "shared.weight", "token_embd.weight")) ||
        (err = alias1(w, "encoder.final_layer_norm.weight", "enc.output_norm.weight")))
        return err;
    for (int l = 0; l < num_layers; l++) {
        char gg[96], hf[160], gate[96];
        static const struct { const char *gg, *hf; } map[] = {
            {"attn_q", "layer.0.SelfAttention.q"},
            {"attn_k", "layer.0.SelfAttention.k"},
            {"attn_v", "layer.0.SelfAttention.v"},
            {"attn_o", "layer.0.SelfAttention.o"},
            {"attn_rel_b", "layer.0.SelfAttention.relative_attention_bias"},
            {"attn_norm", "layer.0.layer_norm"},
            {"ffn_gate", "layer.1.DenseReluDense.wi_0"},
            {"ffn_down", "layer.1.DenseReluDense.wo"},
            {"ffn_norm", "layer.1.layer_norm"},
        };
        for (size_t i = 0; i < sizeof map / sizeof *map; i++) {
            snprintf(gg, sizeof gg, "enc.blk.%d.%s.weight", l, map[i].gg);
            snprintf(hf, sizeof hf, "encoder.block.%d.%s.weight", l, map[i].hf);
            if ((err = alias1(w, hf, gg)))
                return err;
        }
        /* ffn_up is wi_1 beside a gate, else the one wi */
        snprintf(gate, sizeof gate, "enc.blk.%d.ffn_gate.weight", l);
        snprintf(gg, sizeof gg, "enc.blk.%d.ffn_up.weight", l);
        snprintf(hf, sizeof hf, "encoder.block.%d.layer.1.DenseReluDense.%s.weight", l,
                 ditd_weights_has_raw(w, gate) ? "wi_1" : "wi");
        if ((err = alias1(w, hf, gg)))
            return err;
    }
    return 0;
}
