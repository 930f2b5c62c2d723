/* Diffusers WanTransformer3DModel (Wan 2.1 / 2.2 text-to-video, Wan 2.2
 * image-to-video by channel concatenation, Wan 2.2 TI2V), forward only.
 *
 * The model reads like Diffusers' transformer_wan.py:
 *   patch_embedding: Conv3d with kernel = stride = (1, p, p) over the
 *     latents (B, C, F, h, w): a linear over each patch, tokens (f, row, col);
 *   rope: WanRotaryPosEmbed, Dh split into t = Dh - 4 (Dh / 6) channels for
 *     the frame index and h = w = 2 (Dh / 6) for row and column, theta 1e4;
 *   condition_embedder: temb = time_embedder(sinusoidal freq_dim features
 *     of t) (linear_1, SiLU, linear_2); timestep_proj = time_proj(SiLU(temb))
 *     (6D); the text through text_embedder (linear_1, GELU-tanh, linear_2);
 *   num_layers WanTransformerBlocks: [shift, scale, gate, c_shift, c_scale,
 *     c_gate] = scale_shift_table + timestep_proj; self-attention on
 *     LN(x)(1 + scale) + shift with q and k RMS-normalized over the whole
 *     inner dim (qk_norm rms_norm_across_heads) then RoPE, gated residual;
 *     cross-attention of norm2(x) (affine LayerNorm when cross_attn_norm,
 *     else the identity) to the projected text, q and k normalized the same
 *     way, plain residual; FFN (GELU-tanh) on LN(x)(1 + c_scale) + c_shift,
 *     gated residual;
 *   norm_out: [shift, scale] = scale_shift_table + temb (not SiLU'd), then
 *     proj_out and the unpatchify to (B, Co, F, h, w).
 * Every LayerNorm and RMSNorm takes the config's eps. Parameter names and
 * numerics follow Diffusers, so a checkpoint Diffusers loads gives the same
 * tensors here.
 *
 * Timesteps: t (B) as the scheduler gives it (WanPipeline passes it as it
 * is), or per latent frame, t_frames (B, F): Wan 2.2 TI2V's
 * expand_timesteps, whose per-token timestep is constant over a frame
 * (engine/models/conditioning.h); the modulations are then per (sample,
 * frame) rows, exactly Diffusers' per-token ones.
 *
 * Sizes: any latent frame count F and size (h, w multiples of p) with each
 * of F, h/p, w/p at most rope_max_seq_len, and any text length L (WanPipeline:
 * 512). The weights are loaded once; the activations are planned for one
 * (F, h, w, L) and max_batch at a time, again by ditd_wan_set_size when the
 * size changes; the forward allocates nothing.
 *
 * Parallel (a mesh), as Diffusers' Wan _cp_plan: ring x ulysses context
 * parallel over the N = F (h/p)(w/p) video tokens, cp rank s holding
 * ditd_split(N, R*U, s) (after patch_embedding: uneven over frames and
 * patches is fine), its rows of the RoPE table and of the per-frame
 * modulations; self-attention through engine/parallel/cp_attention.h (no
 * prefix); cross-attention local: every rank projects the whole text
 * (replicated) and attends its own query tokens to it; proj_out's tokens
 * all-gathered before the unpatchify. Tensor parallel (Diffusers has no
 * Wan _tp_plan; FLUX's Megatron plan): to_q, to_k, to_v of both attentions
 * and ffn.net.0.proj by output rows (heads, FFN columns), to_out.0 and
 * ffn.net.2 by input columns with one all-reduce after each (the bias once,
 * on tp rank 0); norm_q / norm_k hold this rank's slice of the inner dim,
 * and their sum of squares is all-reduced over tp before the scaling, so
 * the RMSNorm is over all heads exactly. Embeddings, modulations and the
 * output layer are replicated. Each rank reads only its slices.
 *
 * LoRA adapters (engine/models/lora.h, docs/lora.md): every Linear is a
 * target in Diffusers' module names (wan.c lora_targets), the term added in
 * lin() per sample's set; under tp A and B cut with their base weight.
 *
 * Image branch (Wan 2.1 I2V / FLF2V: image_dim, added_kv_proj_dim): the
 * CLIP image hidden states (B, Li, Di) through condition_embedder.
 * image_embedder (pos_embed for FLF2V, LayerNorm, FeedForward with erf
 * GELU, LayerNorm; eps 1e-5, FP32LayerNorm's default), and in every block
 * a second cross-attention of the same normalized q to add_k_proj /
 * add_v_proj of that context (k RMS-normalized across heads by
 * norm_added_k), added to the text attention's output before to_out; the
 * text is then the last 512 tokens (WanAttnProcessor splits there), so such
 * a model runs at text length 512 only. Its erf GELU is the gelu_erf op (a
 * backend without it refuses such a model at load); its affine LayerNorms
 * run as layernorm_modulate with scale w - 1 and shift b, as norm2 does.
 *
 * What it is not: no text encoder (UMT5), no CLIP vision encoder, no
 * sampler, no VAE, no pipeline. A backend without the rope, row_sumsq,
 * rmsnorm_rows and upload_f32 ops is refused at load.
 */
#ifndef DITD_ENGINE_WAN_H
#define DITD_ENGINE_WAN_H

#include "engine/backend/backend.h"
#include "engine/core/tensor.h"
#include "engine/models/denoiser.h"
#include "engine/models/lora_linear.h"
#include "engine/models/wan/wan_config.h"
#include "engine/models/weight_list.h"
#include "engine/parallel/cp_attention.h"
#include "engine/parallel/mesh.h"

/* The latent size the family table loads at (WanPipeline's defaults for
 * Wan 2.1: 81 frames of 480x832 through a 4x8x8 VAE: 21 x 60 x 104) and
 * the text length (max_sequence_length 512). */
#define DITD_WAN_DEFAULT_FRAMES 21
#define DITD_WAN_DEFAULT_HEIGHT 60
#define DITD_WAN_DEFAULT_WIDTH 104
#define DITD_WAN_DEFAULT_TEXT_LEN 512

/* One linear layer's weight (N, K) and bias (N); its LoRA targets. The
 * weight is dense at w, or (q.data set) the GGUF file's blocks kept as they
 * are, dequantized panel by panel by linear_q (docs/quant.md). */
typedef struct ditd_wan_lin {
    void *w, *b;
    ditd_qweight q;
    ditd_lora_slot lora;
} ditd_wan_lin;

/* WanTransformerBlock. Under tp, A = this rank's hc heads x Dh, Fl its FFN
 * columns. */
typedef struct ditd_wan_block {
    void *sst;                /* scale_shift_table (6, D), activation type */
    ditd_wan_lin qkv;         /* attn1.to_q|to_k|to_v fused by rows (3A, D) */
    void *nq1, *nk1;          /* attn1.norm_q, norm_k: this rank's (A), activation type */
    ditd_wan_lin out1;        /* attn1.to_out.0 (D, A) */
    void *n2w, *n2b;          /* norm2 (cross_attn_norm): weight - 1 and bias (D), act type */
    ditd_wan_lin q2;          /* attn2.to_q (A, D) */
    ditd_wan_lin kv2;         /* attn2.to_k|to_v fused by rows (2A, D) */
    void *nq2, *nk2;          /* attn2.norm_q, norm_k (A), activation type */
    ditd_wan_lin kvi;         /* attn2.add_k_proj|add_v_proj fused by rows (2A, D) (image) */
    void *nki;                /* attn2.norm_added_k (A), activation type (image) */
    ditd_wan_lin out2;        /* attn2.to_out.0 (D, A) */
    ditd_wan_lin ff1, ff2;    /* ffn.net.0.proj (Fl, D), ffn.net.2 (D, Fl) */
} ditd_wan_block;

typedef struct ditd_wan {
    ditd_denoiser base;     /* first: a ditd_wan is a denoiser (wan_denoiser.c) */
    ditd_wan_config cfg;
    ditd_wl wl;             /* while loading: the weight list (weight_list.h) */
    const ditd_backend_ops *ops;
    int max_batch;
    int F, h, w;            /* latent frames and size */
    int gh, gw, P, N;       /* patch grid per frame, P = gh gw tokens per frame, N = F P */
    int L;                  /* text tokens */

    ditd_arena weights, acts;
    const struct ditd_weights *src; /* while loading: which linears stay quantized */
    int quantized;                  /* linears kept in GGML blocks */

    ditd_wan_lin patch;     /* patch_embedding (D, C, 1, p, p) as a conv (D, C, p, p) */
    ditd_wan_lin t1, t2;    /* condition_embedder.time_embedder.linear_1 (D, freq), linear_2 */
    ditd_wan_lin tproj;     /* condition_embedder.time_proj (6D, D) */
    ditd_wan_lin x1, x2;    /* condition_embedder.text_embedder.linear_1 (D, Dt), linear_2 */
    void *sst_out;          /* scale_shift_table (2, D), activation type */
    ditd_wan_lin proj;      /* proj_out (p p Co, D), rows (dy, dx, c): the unpatchify order */
    ditd_wan_block *blk;
    /* the image embedder (WanImageEmbedding; image_dim > 0): LN, FF (GELU
     * erf), LN, with pos_embed for FLF2V */
    void *ie_n1w, *ie_n1b;  /* condition_embedder.image_embedder.norm1: weight - 1, bias (Di),
                             * act type (the modulate op's scale and shift) */
    ditd_wan_lin ie_ff1;    /* .ff.net.0.proj (Di, Di) */
    ditd_wan_lin ie_ff2;    /* .ff.net.2 (D, Di) */
    void *ie_n2w, *ie_n2b;  /* .norm2: weight - 1, bias (D), act type */
    void *ie_pos;           /* .pos_embed (Li, Di), act type (pos_embed_seq_len) */

    /* activations for max_batch samples; Nl = this rank's video tokens; the
     * modulation rows are (B F) (per-frame timesteps) or B */
    void *img;              /* (B, Nl, D) residual stream */
    void *xn;               /* (B, Nl, D) normalized / projected */
    void *qkv;              /* (B, Nl, 3A) */
    void *ao;               /* (B, Nl, A) an attention's output */
    void *hid;              /* (B, Nl, Fl) FFN hidden */
    void *text_in;          /* (B, L, Dt) */
    void *ctx;              /* (B, L, D) projected text */
    void *ctx_h;            /* (B, L, D) text_embedder's hidden */
    void *kv;               /* (B, L, 2A) cross-attention k|v */
    int Li;                 /* image tokens (cfg.image_len; 0 without the image branch) */
    void *im_in, *im_h;     /* (B, Li, Di) the image embeddings, the embedder's hidden */
    void *im_ctx;           /* (B, Li, D) embedded image context */
    void *kvim;             /* (B, Li, 2A) its k|v */
    void *aoi;              /* (B, Nl, A) the image attention's output */
    float *ss;              /* (B max(Nl, L, Li)) fp32 sums of squares (qk_norm) */
    void *tfreq;            /* (B F, freq) sinusoidal features */
    void *temb;             /* (B F, D) */
    void *stemb;            /* (B F, D) SiLU(temb), then scratch */
    void *tp6;              /* (B F, 6D) timestep_proj */
    void *mod;              /* (B F, 6D) a block's modulation */
    void *mod_out;          /* (B F, 2D) the output layer's [shift, scale] */
    void *rope_cos, *rope_sin; /* (N, Dh/2) fp32 on every backend */
    void *scratch;          /* (B, N, C p p) im2col of the patch embedding */
    void *embed;            /* (B, N, D) the whole video's embedding (cp) */
    void *tok_out;          /* (B, N, p p Co) */
    void *tok_loc;          /* (B, Nl, p p Co) (cp) */
    void *tok_gath;         /* (B N, p p Co) rank blocks (cp) */
    float *h_freq;          /* (B F, freq) host features before upload */
    float *h_t;             /* (B F) host timesteps of the modulation rows */

    /* parallel plan; no mesh: one rank, n_loc = N, hc = H, fc = F */
    const ditd_mesh *mesh;
    ditd_layout lay;
    int tp_rank;
    int hc, h0;             /* this tp rank's heads */
    int fc, f0;             /* this tp rank's FFN columns */
    int A;                  /* hc Dh */
    int n_loc, tok0;        /* this rank's video tokens [tok0, tok0 + n_loc) */
    ditd_cp_attention *cpa;
    int *cnt_a, *dsp_a;     /* (R U) counts of the final gather */
    int *icnt, *ioff;       /* (R U) tokens per cp rank */

    /* LoRA (engine/models/lora.h): the linears an adapter may target, in
     * Diffusers' module names (tp: this rank's slices; patch_embedding is a conv, not
     * a target); the rank-r scratch (fp32) in the activation arena; the
     * forward's batch size. */
    ditd_lora_list lora;
    float *lora_tmp;
    size_t lora_tmp_n;
    int fwd_B;
} ditd_wan;

/* Loads a model for latents (C, frames, height, width) and text_len text
 * tokens, batches up to max_batch, weights from a safetensors checkpoint
 * (file, index or folder; f32, f16 or bf16) or a GGUF file
 * (engine/io/weights.h; its linears kept in their blocks on the CPU), in
 * Diffusers' names or Wan's original ones (wan_orig.c), as one rank of `mesh`
 * (borrowed; NULL = one rank). Refused (DITD_EUNSUPPORTED / DITD_EINVAL, on
 * every rank alike): a size the patch or the RoPE cannot take, a layout the
 * heads or tokens cannot take, a backend without the ops wan.h names, a
 * checkpoint with an image branch or more blocks than num_layers. *out
 * owned: ditd_wan_free. */
int ditd_wan_new_mesh(const ditd_wan_config *cfg, const ditd_backend_ops *ops, int max_batch,
                      int frames, int height, int width, int text_len, const char *weights_path,
                      const ditd_mesh *mesh, ditd_wan **out);
void ditd_wan_free(ditd_wan *m);

/* Re-plans the activations (not the weights) for latents (C, frames,
 * height, width) and text_len text tokens; nothing happens when they are
 * the current ones. Allocates: between forwards, never inside one. Not
 * collective; under a mesh every rank calls it with the same sizes, and a
 * size the layout cannot split is DITD_EINVAL on every rank alike, the
 * model left as it was. Other errors (ENOMEM) leave it without
 * activations: its forward refuses (DITD_EINVAL) until a set_size succeeds. */
int ditd_wan_set_size(ditd_wan *m, int frames, int height, int width, int text_len);

/* out (B, Co, F, h, w) = Wan(x (B, C, F, h, w), timesteps, text (B, L, Dt)
 * [, image embeddings (B, Li, Di)]). Timesteps: h_t (B), or h_t_frames
 * (B, F) when not NULL (then h_t is not read and may be NULL). h_image:
 * the CLIP image hidden states of a model with an image branch (Wan 2.1
 * I2V; FLF2V: the two images' tokens side by side, Li = pos_embed_seq_len),
 * NULL otherwise. x and out backend buffers, the rest host. Collective
 * under a mesh (every rank the same arguments, every rank the whole out). */
int ditd_wan_forward(ditd_wan *m, int B, const void *x, const float *h_t,
                     const float *h_t_frames, const float *h_text, const float *h_image,
                     void *out);

/* The shapes the model gives the denoiser interface at (F, h, w, L). */
void ditd_wan_shapes(const ditd_wan_config *c, int frames, int height, int width, int text_len,
                     ditd_denoiser_shapes *out);

/* The WanTransformer3DModel family (engine/models/wan/wan_denoiser.c). */
extern const ditd_denoiser_family ditd_wan_family;

size_t ditd_wan_weight_bytes(const ditd_wan *m);
size_t ditd_wan_act_bytes(const ditd_wan *m);

/* Wan's original names in w mapped to Diffusers' as aliases (wan_orig.c);
 * *found 0 (and m untouched) for a file in Diffusers' names. m
 * (engine/models/orig_map.h) checks the file after the weight list is
 * written; freed by the caller. */
struct ditd_weights;
struct ditd_orig_map;
int ditd_wan_alias_orig(struct ditd_weights *w, struct ditd_orig_map *m, int *found);

#endif
