/* Diffusers SD3Transformer2DModel (Stable Diffusion 3 and 3.5, the MMDiT),
 * forward only.
 *
 * The model reads like Diffusers' transformer_sd3.py:
 *   pos_embed: a stride-p patch embedding (PatchEmbed) plus the 2-D sincos
 *     positional table of an M x M patch grid (M = pos_embed_max_size),
 *     cropped to the latent's grid, centred (cropped_pos_embed);
 *   temb = TimestepEmbedding(Timesteps(t)) + PixArtAlphaTextProjection(pooled)
 *     (CombinedTimestepTextProjEmbeddings); context_embedder on the text;
 *   num_layers JointTransformerBlocks: image and text each with their own
 *     AdaLayerNormZero (shift, scale, gate x attention, MLP), q/k/v
 *     (optionally per-head RMSNorm of q and k, qk_norm "rms_norm"), one
 *     joint attention over [image; text] (JointAttnProcessor2_0), to_out /
 *     to_add_out, gelu-tanh FeedForwards. The last block is context_pre_only:
 *     AdaLayerNormContinuous on the text, which then only gives keys and
 *     values (no to_add_out, no ff_context). SD3.5-medium's MMDiT-X: in the
 *     blocks of dual_attention_layers, SD35AdaLayerNormZeroX's 9-way
 *     modulation and a second, image-only self attention attn2 on
 *     LN(x) (1 + scale2) + shift2, gated into the image stream after the
 *     joint attention;
 *   norm_out (AdaLayerNormContinuous), proj_out, unpatchify.
 * Parameter names and numerics follow Diffusers, so a checkpoint Diffusers
 * loads gives the same tensors here. The positional table is the
 * checkpoint's pos_embed.pos_embed (a persistent buffer) when it has one,
 * else computed as PatchEmbed computes it (base_size = sample_size / p);
 * only the window of the current size is kept on the device.
 *
 * Timesteps: t is the scheduler's (sigma * 1000), which is what
 * StableDiffusion3Pipeline passes the model. The text's attention mask is
 * not used (the pipeline passes none; every token attends). Skip-layer guidance: a forward
 * may skip a list of blocks (forward(skip_layers=...), the pipeline's
 * skip_guidance_layers; ditd_cond.skip_layers through the family table).
 *
 * Sizes: any latent (h, w) in multiples of patch_size up to M * p each, and
 * any text length L. Weights are loaded once; the activations (and the
 * cropped positional table) are planned for one (h, w, L) and max_batch at
 * a time, again by ditd_sd3_set_size when the size changes; the forward
 * allocates nothing.
 *
 * Parallel (a mesh), as FLUX (engine/models/flux/flux.h): ring x ulysses
 * context parallel over the joint sequence, cp rank s holding the text
 * tokens ditd_split(L, R*U, s) and the image tokens ditd_split(N, R*U, s);
 * the joint attention is cp_attention's split mode over every rank's
 * [text slice; image slice] (ditd_cp_attention_new_counts), attn2 the plain
 * split over the image tokens alone; a rank with no text token skips its
 * text stream; proj_out's tokens are all-gathered. One rank (and tp alone)
 * keeps the whole text as the joint attention's prefix. Tensor parallel
 * (Megatron): to_q/k/v, add_q/k/v_proj, attn2.to_q/k/v, ff(_context).net.0
 * by output rows (heads, MLP columns); to_out.0, to_add_out, attn2.to_out.0,
 * ff(_context).net.2 by input columns, one all-reduce after each (the bias
 * once, on tp rank 0). Embeddings, modulations, QK norms and the output
 * layer are replicated. CP x TP composes.
 *
 * LoRA adapters (engine/models/lora.h, docs/lora.md): every Linear is a
 * target in Diffusers' module names (sd3.c lora_targets), the term added in
 * lin() per sample's set; under tp A and B cut with their base weight.
 *
 * What it is not: no text encoders (CLIP-L, CLIP-G, T5 and how
 * StableDiffusion3Pipeline joins them: engine/pipeline, engine/text), no
 * sampler, no VAE; no ControlNet residuals, no IP-Adapter.
 */
#ifndef DITD_ENGINE_SD3_H
#define DITD_ENGINE_SD3_H

#include "engine/backend/backend.h"
#include "engine/core/tensor.h"
#include "engine/models/denoiser.h"
#include "engine/models/lora_linear.h"
#include "engine/models/weight_list.h"
#include "engine/models/sd3/sd3_config.h"
#include "engine/parallel/cp_attention.h"
#include "engine/parallel/mesh.h"

/* The text length the family table loads at: StableDiffusion3Pipeline's
 * CLIP tokens (77) and T5 tokens (max_sequence_length 256), joined. The
 * latent size is the config's sample_size. */
#define DITD_SD3_DEFAULT_TEXT_LEN (77 + 256)

/* One linear layer's weight (N, K) and bias (N); its LoRA targets. The
 * weight is dense at w, or (q.data set) the GGUF file's blocks kept as they
 * are, dequantized panel by panel by linear_q (docs/quant.md). */
typedef struct ditd_sd3_lin {
    void *w, *b;
    ditd_qweight q;
    ditd_lora_slot lora;
} ditd_sd3_lin;

/* JointTransformerBlock. */
typedef struct ditd_sd3_block {
    int pre_only;                 /* context_pre_only: the last block */
    int dual;                     /* attn2 (dual_attention_layers) */
    ditd_sd3_lin ada;             /* norm1.linear (6D or, dual, 9D, D) */
    ditd_sd3_lin ada_c;           /* norm1_context.linear (6D, D); pre_only (2D, D) */
    ditd_sd3_lin qkv, qkv_c;      /* to_q|to_k|to_v, add_q|k|v_proj fused by rows (3A, D) */
    void *nq, *nk, *nq_c, *nk_c;  /* norm_q, norm_k, norm_added_q, norm_added_k (Dh), qk_norm */
    ditd_sd3_lin out, out_c;      /* to_out.0, to_add_out (D, A); out_c not pre_only */
    ditd_sd3_lin ff1, ff2;        /* ff.net.0.proj (F, D), ff.net.2 (D, F) */
    ditd_sd3_lin ff1_c, ff2_c;    /* ff_context, not pre_only */
    ditd_sd3_lin qkv2, out2;      /* attn2.to_q|k|v (3A, D), attn2.to_out.0 (D, A), dual */
    void *nq2, *nk2;              /* attn2.norm_q, norm_k (Dh), dual and qk_norm */
} ditd_sd3_block;

typedef struct ditd_sd3 {
    ditd_denoiser base;     /* first: a ditd_sd3 is a denoiser (sd3_denoiser.c) */
    ditd_sd3_config cfg;
    const ditd_backend_ops *ops;
    int max_batch;
    int h, w;               /* latent size */
    int gh, gw, N;          /* patch grid (h/p, w/p), N image tokens */
    int L;                  /* text tokens (all of them) */

    ditd_arena weights, acts;

    void *patch_w, *patch_b; /* pos_embed.proj (D, C, p, p), (D) */
    /* the positional table (M*M, D), not kept whole (SD3.5-medium's is
     * 384^2 x 1536): set_size reads its window from the checkpoint's
     * pos_embed.pos_embed (pos_w kept open: a mapping, no copy; pos_name
     * the file's own name of it, "pos_embed" in the original names), or,
     * for a checkpoint without one, assembles it from the table's column
     * and row halves (pos_cols, pos_rows: (M, D) host, computed at load) */
    struct ditd_weights *pos_w;
    char pos_name[64];
    const struct ditd_weights *src; /* while loading: which linears stay quantized */
    int quantized;                  /* linears kept in GGML blocks */
    ditd_wl wl;             /* while loading: the weight list (weight_list.h) */
    float *pos_cols, *pos_rows;
    ditd_sd3_lin ctx_emb;   /* context_embedder (D, Dt) */
    ditd_sd3_lin t1, t2;    /* time_text_embed.timestep_embedder linear_1 (D, 256), linear_2 */
    ditd_sd3_lin p1, p2;    /* .text_embedder linear_1 (D, Dp), linear_2 (D, D) */
    ditd_sd3_lin norm_out;  /* norm_out.linear (2D, D): [scale; shift] */
    ditd_sd3_lin proj;      /* proj_out (p*p*Co, D), rows (dy, dx, c) */
    ditd_sd3_block *blk;    /* num_layers */

    /* activations for max_batch samples; Nl = this rank's image tokens,
     * Ll = its text tokens (l_loc; L on one rank) */
    void *pos;              /* (N, D) the table cropped to (gh, gw) */
    void *img, *txt;        /* (B, Nl, D), (B, Ll, D) residual streams */
    void *xn, *tn;          /* (B, Nl, D), (B, Ll, D) modulated / projected */
    void *xn2;              /* (B, Nl, D) attn2's input (dual blocks) */
    void *qkv, *pqkv;       /* (B, Nl, 3A), (B, Ll, 3A) */
    void *cat, *pcat;       /* (B, Nl, A + Fl), (B, Ll, A + Fl): [attention | MLP hidden] */
    void *text_in;          /* (B, Ll, Dt) */
    void *pooled_in;        /* (B, Dp) */
    void *tfreq;            /* (B, 256) sinusoidal features */
    void *tmp;              /* (B, D) */
    void *vec;              /* (B, D) temb */
    void *svec;             /* (B, D) SiLU(temb), what every modulation reads */
    void *mod, *mod_c;      /* (B, 9D), (B, 6D) */
    void *scratch;          /* (B, N, C p p) im2col of the patch embedding */
    void *tok_out;          /* (B, N, p p Co) */
    float *h_freq;          /* (B, 256) host features before upload */

    /* parallel plan; no mesh: one rank, n_loc = N, hc = H, fc = F */
    const ditd_mesh *mesh;
    ditd_layout lay;
    int tp_rank;
    int hc, h0;             /* this tp rank's heads */
    int fc, f0;             /* this tp rank's MLP columns */
    int A;                  /* hc * Dh */
    int n_loc, tok0;        /* this rank's image tokens [tok0, tok0 + n_loc) */
    int l_loc, txt0;        /* this rank's text tokens [txt0, txt0 + l_loc) (cp); L, 0 */
    ditd_cp_attention *cpa; /* the joint attention */
    ditd_cp_attention *cpa2;/* attn2 over the image tokens (a dual block), else NULL */
    int *cnt_a, *dsp_a;     /* (R*U) counts of the final gather */
    int *icnt, *ioff;       /* (R*U) image tokens per cp rank */
    int *jcnt;              /* (R*U) joint tokens per cp rank: text + image */
    int *jlead;             /* (R*U) text tokens per cp rank (the leading segment) */
    void *jqkv;             /* (B, Ll + Nl, 3A) [text; image] q|k|v (cp) */
    void *jo;               /* (B, Ll + Nl, A) the attention's output (cp) */
    void *embed;            /* (B, N, D) the whole image's embedding (cp) */
    void *tok_loc;          /* (B, Nl, p p Co) (cp) */
    void *tok_gath;         /* (B*N, p p Co) rank blocks (cp) */

    /* LoRA (engine/models/lora.h): the linears an adapter may target, in
     * Diffusers' module names (tp: this rank's slices; pos_embed.proj is a conv, not
     * a target); the rank-r scratch (fp32) in the activation arena; the
     * forward's batch size. */
    ditd_lora_list lora;
    float *lora_tmp;
    size_t lora_tmp_n;
    int fwd_B;
} ditd_sd3;

/* Loads a model for latents (C, height, width) and text_len text tokens,
 * batches up to max_batch, weights from a safetensors checkpoint (file,
 * index or folder) or a GGUF file (engine/io/weights.h; its linears kept in
 * their blocks on the CPU), in Diffusers' names or SD3's original ones
 * (sd3_orig.c), as one rank of `mesh` (borrowed; NULL = one rank).
 * Refused (DITD_EUNSUPPORTED / DITD_EINVAL / DITD_EFORMAT, on every rank
 * alike): a size set_size refuses, a layout the heads or tokens cannot
 * take, a backend without rmsnorm_heads (qk_norm), a checkpoint whose
 * tensors disagree with the config (missing, extra blocks, attn2 or QK norms
 * the config does not have). *out owned: ditd_sd3_free. */
int ditd_sd3_new_mesh(const ditd_sd3_config *cfg, const ditd_backend_ops *ops, int max_batch,
                      int height, int width, int text_len, const char *weights_path,
                      const ditd_mesh *mesh, ditd_sd3 **out);
void ditd_sd3_free(ditd_sd3 *m);

/* Re-plans the activations (not the weights) for latents (C, height, width)
 * and text_len text tokens; nothing happens when they are the current ones.
 * height and width multiples of patch_size, at most pos_embed_max_size *
 * patch_size (DITD_EINVAL naming them, the model left as it was). Allocates:
 * call it between forwards. Not collective; under a mesh every rank calls
 * it with the same sizes. Other errors (ENOMEM) leave it without
 * activations: its forward refuses until a set_size succeeds. */
int ditd_sd3_set_size(ditd_sd3 *m, int height, int width, int text_len);

/* out (B, Co, h, w) = SD3(x (B, C, h, w), h_t (B), text (B, L, Dt),
 * pooled (B, Dp)), skipping the blocks skip[0..n_skip) (NULL / 0: none;
 * each in [0, num_layers), else DITD_EINVAL). x and out backend buffers,
 * the rest host. Collective under a mesh (every rank the same arguments,
 * every rank the whole out). */
int ditd_sd3_forward(ditd_sd3 *m, int B, const void *x, const float *h_t, const float *h_text,
                     const float *h_pooled, const int *skip, int n_skip, void *out);

/* The shapes the model gives the denoiser interface at (height, width, L). */
void ditd_sd3_shapes(const ditd_sd3_config *c, int height, int width, int text_len,
                     ditd_denoiser_shapes *out);

/* SD3's original (MMDiT) names in w mapped to Diffusers' as aliases
 * (sd3_orig.c); *found 0 (and m untouched) for a file in Diffusers' names.
 * m (engine/models/orig_map.h) checks the file after the weight list is
 * written; freed by the caller. */
struct ditd_weights;
struct ditd_orig_map;
int ditd_sd3_alias_orig(struct ditd_weights *w, const ditd_sd3_config *c,
                        struct ditd_orig_map *m, int *found);

/* The SD3Transformer2DModel family (engine/models/sd3/sd3_denoiser.c). */
extern const ditd_denoiser_family ditd_sd3_family;

size_t ditd_sd3_weight_bytes(const ditd_sd3 *m);
size_t ditd_sd3_act_bytes(const ditd_sd3 *m);

#endif
