/* FLUX.1's original (Black Forest Labs) parameter names, as the widely
 * shared checkpoints keep them (the GGUF conversions among them), mapped to
 * Diffusers' FluxTransformer2DModel names exactly as Diffusers' single-file
 * loader does (diffusers/loaders/single_file_utils.py,
 * convert_flux_transformer_checkpoint_to_diffusers): renames, the fused
 * qkv and linear1 cut by rows into to_q / to_k / to_v (/ proj_mlp), and the
 * final layer's [shift; scale] swapped into norm_out's [scale; shift].
 * Registered as aliases on the weight source (engine/io/weights.h), so the
 * loader reads Diffusers names whatever the file says. A
 * "model.diffusion_model." prefix is understood, as Diffusers strips it.
 *
 * Sizes come from the config (inner_dim, mlp_dim), not FLUX.1's 3072: the
 * tiny test models use the same names.
 */
#include <stdio.h>
#include <string.h>

#include "engine/core/error.h"
#include "engine/io/weights.h"
#include "engine/models/flux/flux.h"

typedef struct bfl {
    ditd_weights *w;
    const char *pre; /* "" or "model.diffusion_model." */
    int err;
} bfl;

/* dst := rows of src ("%s" names formatted with the block index). */
static void seg1(bfl *b, const char *dst, const char *src, int64_t r0, int64_t rows)
{
    if (b->err)
        return;
    char s[256];
    snprintf(s, sizeof s, "%s%s", b->pre, src);
    ditd_weight_seg g = {s, r0, rows};
    b->err = ditd_weights_alias(b->w, dst, 1, &g);
}

/* dst.{weight,bias} := src.{weight,bias}, rows [r0, r0 + rows) (-1: all). */
static void lin(bfl *b, const char *dst, const char *src, int64_t r0, int64_t rows)
{
    char d[256], s[256];
    snprintf(d, sizeof d, "%s.weight", dst);
    snprintf(s, sizeof s, "%s.weight", src);
    seg1(b, d, s, r0, rows);
    snprintf(d, sizeof d, "%s.bias", dst);
    snprintf(s, sizeof s, "%s.bias", src);
    seg1(b, d, s, r0, rows);
}

static int has(const bfl *b, const char *name)
{
    char s[256];
    snprintf(s, sizeof s, "%s%s", b->pre, name);
    return ditd_weights_has_raw(b->w, s);
}

int ditd_flux_alias_bfl(ditd_weights *w, const ditd_flux_config *c, int *found)
{
    bfl b = {.w = w, .pre = "", .err = 0};
    *found = 0;
    if (!has(&b, "img_in.weight")) {
        b.pre = "model.diffusion_model.";
        if (!has(&b, "img_in.weight"))
            return 0; /* Diffusers names (or not FLUX: the loader says which is missing) */
    }
    *found = 1;
    const int64_t D = c->inner_dim, F = c->mlp_dim;
    char d[160], s[160];
    lin(&b, "time_text_embed.timestep_embedder.linear_1", "time_in.in_layer", 0, -1);
    lin(&b, "time_text_embed.timestep_embedder.linear_2", "time_in.out_layer", 0, -1);
    lin(&b, "time_text_embed.text_embedder.linear_1", "vector_in.in_layer", 0, -1);
    lin(&b, "time_text_embed.text_embedder.linear_2", "vector_in.out_layer", 0, -1);
    if (has(&b, "guidance_in.in_layer.weight")) {
        lin(&b, "time_text_embed.guidance_embedder.linear_1", "guidance_in.in_layer", 0, -1);
        lin(&b, "time_text_embed.guidance_embedder.linear_2", "guidance_in.out_layer", 0, -1);
    }
    lin(&b, "context_embedder", "txt_in", 0, -1);
    lin(&b, "x_embedder", "img_in", 0, -1);
    /* every block the file has, so that the loader's "more blocks than the
     * config says" check sees them */
    for (int i = 0; !b.err; i++) {
        snprintf(s, sizeof s, "double_blocks.%d.img_mod.lin.weight", i);
        if (!has(&b, s))
            break;
#define L(dst, src, r0, rows)                                             \
    do {                                                                  \
        snprintf(d, sizeof d, "transformer_blocks.%d." dst, i);           \
        snprintf(s, sizeof s, "double_blocks.%d." src, i);                \
        lin(&b, d, s, (r0), (rows));                                      \
    } while (0)
#define N(dst, src)                                                       \
    do {                                                                  \
        snprintf(d, sizeof d, "transformer_blocks.%d." dst, i);           \
        snprintf(s, sizeof s, "double_blocks.%d." src, i);                \
        seg1(&b, d, s, 0, -1);                                            \
    } while (0)
        L("norm1.linear", "img_mod.lin", 0, -1);
        L("norm1_context.linear", "txt_mod.lin", 0, -1);
        L("attn.to_q", "img_attn.qkv", 0, D);
        L("attn.to_k", "img_attn.qkv", D, D);
        L("attn.to_v", "img_attn.qkv", 2 * D, D);
        L("attn.add_q_proj", "txt_attn.qkv", 0, D);
        L("attn.add_k_proj", "txt_attn.qkv", D, D);
        L("attn.add_v_proj", "txt_attn.qkv", 2 * D, D);
        N("attn.norm_q.weight", "img_attn.norm.query_norm.scale");
        N("attn.norm_k.weight", "img_attn.norm.key_norm.scale");
        N("attn.norm_added_q.weight", "txt_attn.norm.query_norm.scale");
        N("attn.norm_added_k.weight", "txt_attn.norm.key_norm.scale");
        L("ff.net.0.proj", "img_mlp.0", 0, -1);
        L("ff.net.2", "img_mlp.2", 0, -1);
        L("ff_context.net.0.proj", "txt_mlp.0", 0, -1);
        L("ff_context.net.2", "txt_mlp.2", 0, -1);
        L("attn.to_out.0", "img_attn.proj", 0, -1);
        L("attn.to_add_out", "txt_attn.proj", 0, -1);
#undef L
#undef N
    }
    for (int i = 0; !b.err; i++) {
        snprintf(s, sizeof s, "single_blocks.%d.modulation.lin.weight", i);
        if (!has(&b, s))
            break;
#define L(dst, src, r0, rows)                                             \
    do {                                                                  \
        snprintf(d, sizeof d, "single_transformer_blocks.%d." dst, i);    \
        snprintf(s, sizeof s, "single_blocks.%d." src, i);                \
        lin(&b, d, s, (r0), (rows));                                      \
    } while (0)
        L("norm.linear", "modulation.lin", 0, -1);
        L("attn.to_q", "linear1", 0, D);
        L("attn.to_k", "linear1", D, D);
        L("attn.to_v", "linear1", 2 * D, D);
        L("proj_mlp", "linear1", 3 * D, F);
        L("proj_out", "linear2", 0, -1);
#undef L
        snprintf(d, sizeof d, "single_transformer_blocks.%d.attn.norm_q.weight", i);
        snprintf(s, sizeof s, "single_blocks.%d.norm.query_norm.scale", i);
        seg1(&b, d, s, 0, -1);
        snprintf(d, sizeof d, "single_transformer_blocks.%d.attn.norm_k.weight", i);
        snprintf(s, sizeof s, "single_blocks.%d.norm.key_norm.scale", i);
        seg1(&b, d, s, 0, -1);
    }
    lin(&b, "proj_out", "final_layer.linear", 0, -1);
    /* swap_scale_shift: BFL's [shift; scale] -> Diffusers' [scale; shift] */
    for (int k = 0; k < 2 && !b.err; k++) {
        const char *what = k ? "bias" : "weight";
        char s0[200], s1[200];
        snprintf(d, sizeof d, "norm_out.linear.%s", what);
        snprintf(s0, sizeof s0, "%sfinal_layer.adaLN_modulation.1.%s", b.pre, what);
        snprintf(s1, sizeof s1, "%sfinal_layer.adaLN_modulation.1.%s", b.pre, what);
        ditd_weight_seg g[2] = {{s0, D, D}, {s1, 0, D}};
        b.err = ditd_weights_alias(w, d, 2, g);
    }
    return b.err;
}
