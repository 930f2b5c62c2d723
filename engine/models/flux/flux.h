/* Diffusers FluxTransformer2DModel (FLUX.1 dev and schnell), forward only.
 *
 * The model reads like Diffusers' transformer_flux.py:
 *   x_embedder (on 2x2-packed latents) and context_embedder (T5 sequence);
 *   vec = timestep embedding (+ guidance embedding, FLUX.1-dev) + the
 *     pooled text projection (CombinedTimestep[Guidance]TextProjEmbeddings);
 *   num_layers double-stream blocks: image and text each with their own
 *     adaLN-Zero modulation, q/k/v, per-head RMSNorm of q and k and MLP,
 *     one joint attention over [text; image] with 3-axis RoPE;
 *   num_single_layers single-stream blocks over [text; image]: one
 *     modulation, attention and a gelu-tanh MLP in parallel, one proj_out;
 *   AdaLayerNormContinuous and proj_out on the image tokens.
 * Parameter names and numerics follow Diffusers, so a checkpoint Diffusers
 * loads gives the same tensors here.
 *
 * Latents: the model takes and gives (B, C, h, w) latents, as the denoiser
 * interface does (C = in_channels / 4 = 16 for FLUX.1), and packs them
 * itself: FluxPipeline's 2x2 packing followed by x_embedder is exactly a
 * stride-2 patch embedding with x_embedder's weight seen as (D, C, 2, 2),
 * and proj_out's rows are reordered at load from (c, dy, dx) to
 * (dy, dx, c) so that the unpatchify op unpacks. Positions: img_ids are
 * (0, row, col) of each packed token (FluxPipeline); txt_ids are zeros, so
 * RoPE leaves the text tokens as they are and is applied to image tokens
 * only. The T5 attention mask is not used (FluxPipeline passes none).
 *
 * Timesteps: t is the scheduler's (sigma * 1000), what the pipeline hands
 * every family; FluxPipeline passes t / 1000 and the model multiplies by
 * 1000 again, so the features are those of t. Guidance: the scale per row
 * (cond.guidance), multiplied by 1000 as the model does.
 *
 * Sizes: FLUX serves any latent size (h, w even: images in multiples of 16)
 * and text length L. The weights are loaded once; the activations are
 * planned for one (h, w, L) and max_batch at a time, again by
 * ditd_flux_set_size when the size changes (the family table's set_size);
 * the forward allocates nothing.
 *
 * Parallel (a mesh): ring x ulysses context parallel over the joint text +
 * image sequence, as Diffusers' Flux _cp_plan splits both hidden_states and
 * encoder_hidden_states: cp rank s holds the text tokens
 * ditd_split(L, R*U, s) and the image tokens ditd_split(N, R*U, s) (after
 * x_embedder), runs the text stream of the double blocks on its own text
 * slice only and the single blocks on its [text slice; image slice], and
 * the joint attention goes through engine/parallel/cp_attention.h's plain
 * split mode over every rank's [text slice; image slice] (no replicated
 * prefix; keys in rank order, which attention does not see). A rank may
 * hold 0 text tokens (L < R*U): its text stream is skipped. RoPE is applied
 * to each rank's own tokens (text ids are zeros: the identity). The
 * proj_out image tokens are all-gathered before unpacking. One rank (and tp
 * alone) keeps the whole text as the attention's prefix, as before.
 * Tensor parallel (Diffusers' Flux _tp_plan, Megatron): to_q/k/v,
 * add_q/k/v_proj, ff(.context).net.0.proj and proj_mlp by output rows
 * (heads, MLP columns); to_out.0, to_add_out, ff(.context).net.2 by input
 * columns, and the single blocks' proj_out by input columns in its two
 * packed blocks [attention | MLP]; one all-reduce after each row-parallel
 * layer (the bias added once, on tp rank 0). Embeddings, modulations,
 * QK norms (over head_dim, after the split) and the output layer are
 * replicated. Each rank reads only its slices. CP x TP composes.
 *
 * What it is not: no text encoders, no sampler, no VAE (engine/pipeline,
 * engine/text, the VAE family); no CUDA kernels for RoPE and the head norm
 * yet (a backend without ops->rope is refused at load).
 */
#ifndef DITD_ENGINE_FLUX_H
#define DITD_ENGINE_FLUX_H

#include "engine/backend/backend.h"
#include "engine/core/tensor.h"
#include "engine/models/denoiser.h"
#include "engine/models/flux/flux_config.h"
#include "engine/models/weight_list.h"
#include "engine/parallel/cp_attention.h"
#include "engine/parallel/mesh.h"

/* The latent size and text length a FLUX model loads at through the family
 * table (FluxPipeline's defaults: 1024x1024 pixels, max_sequence_length 512). */
#define DITD_FLUX_DEFAULT_LATENT 128
#define DITD_FLUX_DEFAULT_TEXT_LEN 512

/* One linear layer's weight (N, K) and bias (N). A weight read from a GGUF
 * file in GGML blocks stays so (q.data == w: the blocks, copied into the
 * weight arena) and runs through ops->linear_q; otherwise q.data is NULL
 * and w holds weight_dtype values for ops->linear. */
typedef struct ditd_flux_lin {
    void *w, *b;
    ditd_qweight q;
    /* LoRA: 1 + its first target in ditd_flux.lora_t (0: none), and how
     * many consecutive targets share its output columns in equal blocks
     * (3 for a fused to_q|to_k|to_v) */
    int lora, lora_parts;
} ditd_flux_lin;

/* FluxTransformerBlock: the image stream's weights, then the text stream's. */
typedef struct ditd_flux_double {
    ditd_flux_lin ada, ada_c;     /* norm1.linear, norm1_context.linear (6D, D) */
    ditd_flux_lin qkv, qkv_c;     /* to_q|to_k|to_v, add_q|k|v_proj fused by rows (3D, D) */
    void *nq, *nk, *nq_c, *nk_c;  /* norm_q, norm_k, norm_added_q, norm_added_k (Dh) */
    ditd_flux_lin out, out_c;     /* to_out.0, to_add_out (D, D) */
    ditd_flux_lin ff1, ff2;       /* ff.net.0.proj (F, D), ff.net.2 (D, F) */
    ditd_flux_lin ff1_c, ff2_c;   /* ff_context */
} ditd_flux_double;

/* FluxSingleTransformerBlock. */
typedef struct ditd_flux_single {
    ditd_flux_lin ada;            /* norm.linear (3D, D) */
    ditd_flux_lin qkv;            /* attn.to_q|to_k|to_v (3D, D) */
    void *nq, *nk;                /* attn.norm_q, attn.norm_k (Dh) */
    ditd_flux_lin mlp;            /* proj_mlp (F, D) */
    ditd_flux_lin out;            /* proj_out (D, D + F) */
} ditd_flux_single;

typedef struct ditd_flux {
    ditd_denoiser base;     /* first: a ditd_flux is a denoiser (flux_denoiser.c) */
    ditd_flux_config cfg;
    const ditd_backend_ops *ops;
    int max_batch;
    int h, w;               /* latent size */
    int gh, gw, N;          /* packed token grid (h/2, w/2), N image tokens */
    int L;                  /* text tokens (all of them) */
    /* reference latents (FluxKontextPipeline; ditd_flux_set_reference): rh x rw,
     * their Nr packed tokens after the N of the latents in the image stream,
     * NT = N + Nr in all (NT = N without one) */
    int rh, rw, rgh, rgw, Nr, NT;

    ditd_arena weights, acts;
    const struct ditd_weights *src; /* while loading: which linears stay quantized */
    int quantized;          /* linears kept in GGML blocks */
    ditd_wl wl;             /* while loading: the weight list (weight_list.h) */

    ditd_flux_lin x_emb;    /* x_embedder (D, 4C) = conv (D, C, 2, 2) */
    ditd_flux_lin ctx_emb;  /* context_embedder (D, Dt) */
    ditd_flux_lin t1, t2;   /* time_text_embed.timestep_embedder linear_1 (D, 256), linear_2 */
    ditd_flux_lin g1, g2;   /* .guidance_embedder (guidance_embeds) */
    ditd_flux_lin p1, p2;   /* .text_embedder linear_1 (D, Dp), linear_2 (D, D) */
    ditd_flux_lin norm_out; /* norm_out.linear (2D, D): [scale; shift] */
    ditd_flux_lin proj;     /* proj_out (4Co, D), rows reordered to (dy, dx, c) */
    ditd_flux_double *dbl;  /* num_layers */
    ditd_flux_single *sgl;  /* num_single_layers */

    /* activations for max_batch samples; Nl = this rank's image tokens,
     * Ll = its text tokens (l_loc; L on one rank) */
    void *img, *txt;        /* (B, Nl, D), (B, Ll, D) residual streams */
    void *xn, *tn;          /* (B, Nl, D), (B, Ll, D) modulated / projected */
    void *qkv, *pqkv;       /* (B, Nl, 3D), (B, Ll, 3D) */
    void *cat, *pcat;       /* (B, Nl, D + F), (B, Ll, D + F): [attention | MLP hidden] */
    void *text_in;          /* (B, Ll, Dt) */
    void *pooled_in;        /* (B, Dp) */
    void *tfreq;            /* (B, 256) sinusoidal features */
    void *tmp;              /* (B, D) */
    void *vec;              /* (B, D) conditioning */
    void *svec;             /* (B, D) SiLU(vec), what every modulation reads */
    void *mod, *mod_c;      /* (B, 6D) */
    void *rope_cos, *rope_sin; /* (NT, Dh/2) of the image tokens, fp32 on every backend */
    void *scratch;          /* (B, max(N, Nr), 4C) im2col of the packing */
    void *tok_out;          /* (B, NT, 4Co) */
    float *h_freq;          /* (B, 256) host features before upload */

    /* parallel plan; no mesh: one rank, n_loc = N, hc = H, fc = F. Under
     * tp the attention holds hc heads (A = hc Dh columns of q, k, v) and
     * the MLPs fc columns: qkv (B, Nl, 3A), cat (B, Nl, A + fc). */
    const ditd_mesh *mesh;
    ditd_layout lay;
    int tp_rank;
    int hc, h0;             /* this tp rank's heads */
    int fc, f0;             /* this tp rank's MLP columns */
    int A;                  /* hc * Dh */
    int n_loc, tok0;        /* this rank's image tokens [tok0, tok0 + n_loc) */
    int l_loc, txt0;        /* this rank's text tokens [txt0, txt0 + l_loc) (cp); L, 0 */
    ditd_cp_attention *cpa;
    int *cnt_a, *dsp_a;     /* (R*U) counts of the final gather */
    int *icnt, *ioff;       /* (R*U) image tokens per cp rank */
    int *jcnt;              /* (R*U) joint tokens per cp rank: text + image */
    int *jlead;             /* (R*U) text tokens per cp rank (the leading segment) */
    void *jqkv;             /* (B, Ll + Nl, 3A) [text; image] q|k|v (cp) */
    void *jo;               /* (B, Ll + Nl, A) the attention's output (cp) */
    void *embed;            /* (B, NT, D) the whole image stream's embedding (cp) */
    void *tok_loc;          /* (B, Nl, 4Co) (cp) */
    void *tok_gath;         /* (B*NT, 4Co) rank blocks (cp) */

    /* LoRA (engine/models/lora.h): the linears an adapter may target, by
     * Diffusers' module names (none under tp; x_embedder and the final
     * proj_out, whose rows ditd re-lays, are not targets yet); the rank-r
     * scratch (fp32) in the activation arena; the forward's batch size. */
    ditd_lora_target *lora_t;
    int n_lora_t;
    float *lora_tmp;
    size_t lora_tmp_n;
    int fwd_B;
} ditd_flux;

/* Loads a model for latents (C, height, width) and text_len text tokens,
 * batches up to max_batch, weights from a safetensors checkpoint (file,
 * index or folder) or a GGUF file (or a folder holding one; engine/io/
 * weights.h), in Diffusers' names or FLUX.1's original ones, as one rank of `mesh` (borrowed; NULL = one rank).
 * height and width even. Refused (DITD_EUNSUPPORTED / DITD_EINVAL, on every
 * rank alike): a layout the heads or tokens cannot take, a backend
 * without the rope, rmsnorm_heads and upload_f32 ops. *out owned: ditd_flux_free. */
int ditd_flux_new_mesh(const ditd_flux_config *cfg, const ditd_backend_ops *ops, int max_batch,
                       int height, int width, int text_len, const char *weights_path,
                       const ditd_mesh *mesh, ditd_flux **out);
void ditd_flux_free(ditd_flux *m);

/* Re-plans the activations (not the weights) for latents (C, height, width)
 * and text_len text tokens; nothing happens when they are the current ones.
 * Allocates: call it between forwards, never inside one. Not collective;
 * under a mesh every rank calls it with the same sizes, and a token count
 * the layout cannot split is DITD_EINVAL on every rank alike, the model
 * left as it was. Other errors (ENOMEM) leave it without activations: its
 * forward refuses (DITD_EINVAL) until a set_size succeeds. */
int ditd_flux_set_size(ditd_flux *m, int height, int width, int text_len);

/* Reference latents (FluxKontextPipeline): from now on every row of the
 * forward's x is the latents (C, h, w) followed by a reference (C,
 * ref_height, ref_width); its 2x2-packed tokens go through x_embedder and
 * join the image stream after the latents' (Diffusers' torch.cat([latents,
 * image_latents], dim=1)) with img_ids (1, row, col) of the reference's own
 * grid, every block sees them, and the output is the latents' tokens alone
 * (noise_pred[:, :N]). Context parallel splits the whole image stream (N +
 * Nr tokens). 0 x 0: none again. Even sizes; re-plans the activations as
 * ditd_flux_set_size (its contract: not collective, a refusal leaves the
 * model as it was). A later set_size keeps the reference. */
int ditd_flux_set_reference(ditd_flux *m, int ref_height, int ref_width);

/* out (B, C, h, w) = FLUX(x (B, C, h, w), h_t (B), text (B, L, Dt),
 * pooled (B, Dp), guidance (B); NULL unless guidance_embeds). x and out
 * backend buffers, the rest host. Collective under a mesh (every rank the
 * same arguments, every rank the whole out). */
int ditd_flux_forward(ditd_flux *m, int B, const void *x, const float *h_t, const float *h_text,
                      const float *h_pooled, const float *h_guidance, void *out);

/* The shapes the model gives the denoiser interface at (height, width, L). */
void ditd_flux_shapes(const ditd_flux_config *c, int height, int width, int text_len,
                      ditd_denoiser_shapes *out);

/* The FluxTransformer2DModel family (engine/models/flux/flux_denoiser.c). */
extern const ditd_denoiser_family ditd_flux_family;

/* Registers on `w` the Diffusers names of a checkpoint in FLUX.1's
 * original (BFL) names (flux_bfl.c), as Diffusers' single-file loader maps
 * them; *found = 0 and nothing registered when the file is not in those
 * names. 0 or the alias error. */
struct ditd_weights;
int ditd_flux_alias_bfl(struct ditd_weights *w, const ditd_flux_config *c, int *found);

size_t ditd_flux_weight_bytes(const ditd_flux *m);
size_t ditd_flux_act_bytes(const ditd_flux *m);

#endif
