/* SD3 / SD3.5's original (Stability AI, MMDiT) parameter names, as the
 * released single files and their GGUF conversions keep them, mapped to
 * Diffusers' SD3Transformer2DModel names exactly as Diffusers'
 * single-file loader does (diffusers/loaders/single_file_utils.py,
 * convert_sd3_transformer_checkpoint_to_diffusers): renames; each
 * attention's fused qkv (weight and bias) cut by rows into to_q / to_k /
 * to_v (add_q/k/v_proj for the context stream); the last block's context
 * adaLN and the final layer's adaLN_modulation, stored [shift; scale],
 * swapped into Diffusers' [scale; shift]. Registered as aliases on the
 * weight source (engine/io/weights.h) through engine/models/orig_map.h, so
 * the loader reads Diffusers names whatever the file says, and a file
 * tensor nothing maps is refused. ComfyUI's "model.diffusion_model."
 * prefix is understood, as Diffusers strips it; in a prefixed file the
 * unprefixed tensors (a whole-pipeline checkpoint's VAE and text encoders,
 * which the conversion leaves aside) are not the transformer's and are not
 * checked.
 *
 * As Diffusers decides them from the file: the number of blocks (the last
 * one is context_pre_only), the MMDiT-X second attention of a block (its
 * x_block.attn2 tensors), the QK norms (any ln_q). The config must agree;
 * the loader says which tensor does not.
 */
#include <stdio.h>
#include <string.h>

#include "engine/core/error.h"
#include "engine/models/orig_map.h"
#include "engine/models/sd3/sd3.h"

static int block_count(const ditd_orig_map *m)
{
    char s[160];
    int n = 0;
    for (;; n++) {
        snprintf(s, sizeof s, "joint_blocks.%d.x_block.adaLN_modulation.1.weight", n);
        if (!ditd_orig_map_has(m, s))
            return n;
    }
}

/* dst.{weight,bias} := src.{weight,bias} with its two row halves swapped
 * (swap_scale_shift: [shift; scale] -> [scale; shift], halves of D rows) */
static void swapped(ditd_orig_map *m, const char *dst, const char *src, int64_t D)
{
    for (int k = 0; k < 2; k++) {
        const char *what = k ? "bias" : "weight";
        char d[200], s[200];
        snprintf(d, sizeof d, "%s.%s", dst, what);
        snprintf(s, sizeof s, "%s.%s", src, what);
        ditd_weight_seg g[2] = {{s, D, D}, {s, 0, D}};
        ditd_orig_map_seg(m, d, 2, g);
    }
}

int ditd_sd3_alias_orig(ditd_weights *w, const ditd_sd3_config *c, ditd_orig_map *m, int *found)
{
    int err;
    *found = 0;
    const char *pre = "";
    if (!ditd_weights_has_raw(w, "joint_blocks.0.x_block.attn.qkv.weight")) {
        pre = DITD_ORIG_PREFIX;
        if (!ditd_weights_has_raw(w, DITD_ORIG_PREFIX "joint_blocks.0.x_block.attn.qkv.weight"))
            return 0; /* Diffusers names (or not SD3: the loader says which is missing) */
    }
    if ((err = ditd_orig_map_init(m, w, pre)))
        return err;
    *found = 1;
    const int64_t D = c->inner_dim;
    const int nl = block_count(m);
    int qk = 0;
    for (int i = 0; i < nl && !qk; i++) {
        char s[160];
        snprintf(s, sizeof s, "joint_blocks.%d.x_block.attn.ln_q.weight", i);
        qk = ditd_orig_map_has(m, s);
    }
    char d[200], s[200];
    if (ditd_orig_map_has(m, "pos_embed")) /* else computed, as PatchEmbed does */
        ditd_orig_map_one(m, "pos_embed.pos_embed", "pos_embed");
    ditd_orig_map_lin(m, "pos_embed.proj", "x_embedder.proj", 0, -1);
    ditd_orig_map_lin(m, "time_text_embed.timestep_embedder.linear_1", "t_embedder.mlp.0", 0, -1);
    ditd_orig_map_lin(m, "time_text_embed.timestep_embedder.linear_2", "t_embedder.mlp.2", 0, -1);
    ditd_orig_map_lin(m, "context_embedder", "context_embedder", 0, -1);
    ditd_orig_map_lin(m, "time_text_embed.text_embedder.linear_1", "y_embedder.mlp.0", 0, -1);
    ditd_orig_map_lin(m, "time_text_embed.text_embedder.linear_2", "y_embedder.mlp.2", 0, -1);
    for (int i = 0; i < nl && !m->err; i++) {
        const int last = i == nl - 1;
#define L(dst, src, r0, rows)                                             \
    do {                                                                  \
        snprintf(d, sizeof d, "transformer_blocks.%d." dst, i);           \
        snprintf(s, sizeof s, "joint_blocks.%d." src, i);                 \
        ditd_orig_map_lin(m, d, s, (r0), (rows));                         \
    } while (0)
#define N(dst, src)                                                       \
    do {                                                                  \
        snprintf(d, sizeof d, "transformer_blocks.%d." dst, i);           \
        snprintf(s, sizeof s, "joint_blocks.%d." src, i);                 \
        ditd_orig_map_one(m, d, s);                                       \
    } while (0)
        L("attn.to_q", "x_block.attn.qkv", 0, D);
        L("attn.to_k", "x_block.attn.qkv", D, D);
        L("attn.to_v", "x_block.attn.qkv", 2 * D, D);
        L("attn.add_q_proj", "context_block.attn.qkv", 0, D);
        L("attn.add_k_proj", "context_block.attn.qkv", D, D);
        L("attn.add_v_proj", "context_block.attn.qkv", 2 * D, D);
        if (qk) {
            N("attn.norm_q.weight", "x_block.attn.ln_q.weight");
            N("attn.norm_k.weight", "x_block.attn.ln_k.weight");
            N("attn.norm_added_q.weight", "context_block.attn.ln_q.weight");
            N("attn.norm_added_k.weight", "context_block.attn.ln_k.weight");
        }
        L("attn.to_out.0", "x_block.attn.proj", 0, -1);
        if (!last)
            L("attn.to_add_out", "context_block.attn.proj", 0, -1);
        snprintf(s, sizeof s, "joint_blocks.%d.x_block.attn2.qkv.weight", i);
        if (ditd_orig_map_has(m, s)) {
            L("attn2.to_q", "x_block.attn2.qkv", 0, D);
            L("attn2.to_k", "x_block.attn2.qkv", D, D);
            L("attn2.to_v", "x_block.attn2.qkv", 2 * D, D);
            if (qk) {
                N("attn2.norm_q.weight", "x_block.attn2.ln_q.weight");
                N("attn2.norm_k.weight", "x_block.attn2.ln_k.weight");
            }
            L("attn2.to_out.0", "x_block.attn2.proj", 0, -1);
        }
        L("norm1.linear", "x_block.adaLN_modulation.1", 0, -1);
        if (!last) {
            L("norm1_context.linear", "context_block.adaLN_modulation.1", 0, -1);
        } else {
            snprintf(d, sizeof d, "transformer_blocks.%d.norm1_context.linear", i);
            snprintf(s, sizeof s, "joint_blocks.%d.context_block.adaLN_modulation.1", i);
            swapped(m, d, s, D);
        }
        L("ff.net.0.proj", "x_block.mlp.fc1", 0, -1);
        L("ff.net.2", "x_block.mlp.fc2", 0, -1);
        if (!last) {
            L("ff_context.net.0.proj", "context_block.mlp.fc1", 0, -1);
            L("ff_context.net.2", "context_block.mlp.fc2", 0, -1);
        }
#undef L
#undef N
    }
    ditd_orig_map_lin(m, "proj_out", "final_layer.linear", 0, -1);
    swapped(m, "norm_out.linear", "final_layer.adaLN_modulation.1", D);
    return m->err;
}
