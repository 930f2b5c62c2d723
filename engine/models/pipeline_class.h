/* The pipeline table: what each Diffusers pipeline class means, as data.
 *
 * A model folder's model_index.json names its pipeline class
 * ("_class_name": "FluxPipeline"); that name finds one `static const
 * ditd_pipeline_class` row here (through the registry,
 * engine/models/registry.h, component DITD_COMPONENT_PIPELINE), and from
 * then on nothing in ditd names a pipeline: the model folder, the sampling
 * loop, the prompt encoder, the latent decode, the worker, the batcher and
 * the command line ask the row. A row says
 *
 *   - which transformer classes it drives and which conditioning they take;
 *   - the prompt recipe: which tokenizers and text encoders, which of their
 *     outputs (last or penultimate hidden states, pooled or projected
 *     vector), how many tokens each, and how the outputs are joined into the
 *     one sequence and the one pooled vector the transformer reads;
 *   - the guidance kind: classifier-free guidance on guidance_scale (the
 *     null class or the negative prompt; "" when none is given), or FLUX's
 *     rule (guidance_scale is the model's input, true_cfg_scale > 1 with a
 *     negative prompt runs the unconditional pass); skip-layer guidance;
 *   - the scheduler rules: whether the pipeline hands the scheduler its own
 *     sigmas (FluxPipeline's linspace(1, 1/steps));
 *   - the latent unscale rule before the VAE;
 *   - defaults (steps, guidance, max_sequence_length) and what a request may
 *     carry (DITD_REQ_* bits: the HTTP layer refuses the rest by name).
 *
 * Built in: DiTPipeline, FluxPipeline, FluxImg2ImgPipeline, FluxInpaintPipeline,
 * FluxKontextPipeline, StableDiffusion3Pipeline, StableDiffusion3Img2ImgPipeline,
 * StableDiffusion3InpaintPipeline, WanPipeline, WanImageToVideoPipeline. A test or
 * an embedding program adds its own with ditd_registry_add(
 * DITD_COMPONENT_PIPELINE, name, &row) before any model loads, and
 * ditd_registry_find_pipeline() finds a row by name.
 *
 * What it is not: no code runs here; the loop that follows a row is
 * engine/pipeline (pipeline.c, prompt_encoder.c, latent_image.c).
 */
#ifndef DITD_ENGINE_PIPELINE_CLASS_H
#define DITD_ENGINE_PIPELINE_CLASS_H

#include "engine/models/conditioning.h"

/* How a pipeline turns its final latents into the VAE's input. */
typedef enum ditd_latent_rule {
    DITD_LATENT_RULE_DIT = 0,  /* latents / scaling_factor (DiTPipeline) */
    DITD_LATENT_RULE_SHIFTED,  /* latents / scaling_factor + shift_factor (FLUX, SD3) */
    DITD_LATENT_RULE_MEAN_STD, /* latents x latents_std + latents_mean per channel
                                * (WanPipeline: ditd_wan_vae_unscale) */
} ditd_latent_rule;
#define DITD_LATENT_RULE_COUNT 3

const char *ditd_latent_rule_name(ditd_latent_rule r);
int ditd_latent_rule_from_str(const char *s, ditd_latent_rule *out);

/* When the unconditional pass runs, and with which scale. */
typedef enum ditd_guidance_kind {
    /* "cfg": guidance_scale > 1 runs it (DiTPipeline: the null class;
     * StableDiffusion3Pipeline: the negative prompt, "" when none), unless
     * the model embeds the guidance; eps = u + g (c - u) */
    DITD_GUIDANCE_CFG = 0,
    /* "true_cfg" (FluxPipeline): guidance_scale goes to a model that embeds
     * it and nowhere else; true_cfg_scale > 1 with a negative prompt given
     * ("" counts) runs the pass, eps = u + true_cfg (c - u) */
    DITD_GUIDANCE_TRUE_CFG,
} ditd_guidance_kind;
#define DITD_GUIDANCE_KIND_COUNT 2

const char *ditd_guidance_kind_name(ditd_guidance_kind k);
int ditd_guidance_kind_from_str(const char *s, ditd_guidance_kind *out);

/* A text encoder's kind, as its tokenizer and config say. */
typedef enum ditd_prompt_encoder_kind {
    DITD_PROMPT_ENC_CLIP = 0, /* "clip": CLIPTextModel / CLIPTextModelWithProjection */
    DITD_PROMPT_ENC_T5,       /* "t5": T5EncoderModel */
    DITD_PROMPT_ENC_UMT5,     /* "umt5": UMT5EncoderModel as WanPipeline calls it
                               * (ditd_wan_prompt_embeds: prompt_clean, the attention
                               * mask, the padded rows zeroed) */
} ditd_prompt_encoder_kind;

/* Which hidden states of an encoder join the sequence. */
typedef enum ditd_prompt_seq {
    DITD_PROMPT_SEQ_NONE = 0,    /* none (FLUX's CLIP gives only its pooled vector) */
    DITD_PROMPT_SEQ_LAST,        /* last_hidden_state */
    DITD_PROMPT_SEQ_PENULTIMATE, /* hidden_states[-2], before the final norm (SD3's CLIPs) */
} ditd_prompt_seq;

/* Which vector of an encoder joins the pooled vector. */
typedef enum ditd_prompt_pooled {
    DITD_PROMPT_POOLED_NONE = 0,
    DITD_PROMPT_POOLED_POOLER,    /* pooler_output (CLIPTextModel's output[1]) */
    DITD_PROMPT_POOLED_PROJECTED, /* text_embeds (CLIPTextModelWithProjection's output[0]) */
} ditd_prompt_pooled;

/* One tokenizer + text encoder of a recipe. */
typedef struct ditd_prompt_part {
    const char *tokenizer;           /* component folder: "tokenizer", "tokenizer_2", ... */
    const char *encoder;             /* "text_encoder", ... */
    ditd_prompt_encoder_kind kind;
    int tokens;                      /* a fixed length (CLIP: 77; a pooled-only part takes the
                                      * tokenizer's shorter model_max_length), 0: the request's
                                      * max_sequence_length */
    int prompt;                      /* which prompt it reads: 0 prompt, 1 prompt_2, 2 prompt_3
                                      * (an empty or absent one falls back to prompt) */
    ditd_prompt_seq seq;
    int seq_group;                   /* the sequence is the groups one after the other (group
                                      * 0 first); the parts of one group are joined on channels
                                      * in part order, then zero-padded to the transformer's
                                      * text width. All parts of a group have one length. */
    ditd_prompt_pooled pooled;       /* joined on channels in part order */
    int optional;                    /* model_index.json may name it null: its sequence is
                                      * zeros (SD3 without T5) */
} ditd_prompt_part;

#define DITD_PROMPT_MAX_PARTS 4

/* What a request may carry besides prompt/class, size, n, seed, steps,
 * guidance_scale, sampler (the HTTP layer refuses the rest by name). */
enum {
    DITD_REQ_NEGATIVE_PROMPT = 1u << 0, /* negative_prompt */
    DITD_REQ_TRUE_CFG = 1u << 1,        /* true_cfg_scale */
    DITD_REQ_MAX_SEQUENCE = 1u << 2,    /* max_sequence_length */
    DITD_REQ_SKIP_LAYERS = 1u << 3,     /* skip_guidance_layers and their scale, start, stop */
    DITD_REQ_GUIDANCE_2 = 1u << 4,      /* guidance_scale_2: the second expert's guidance (a
                                         * folder with two experts only, below) */
};
/* prompt_2 / prompt_3 (and their negative_prompt_2 / _3) are what the
 * recipe's parts read: ditd_pipeline_class_prompts(). */

typedef struct ditd_pipeline_class {
    const char *name;                    /* model_index.json's _class_name */
    const char *transformers[4];         /* the transformer classes it drives, NULL-ended;
                                          * [0] NULL: any */
    ditd_cond_kind cond;                 /* what the transformer is conditioned on */
    int n_parts;                         /* text: the prompt recipe */
    ditd_prompt_part parts[DITD_PROMPT_MAX_PARTS];
    ditd_guidance_kind guidance;
    /* step caching (docs/caching.md): 1 when the pipeline runs its guidance
     * branches under cache_context("cond") / ("uncond") (FluxPipeline,
     * WanPipeline), so Diffusers' hooks keep a state per branch; 0 when the
     * guided rows run in one forward under one context (DiTPipeline,
     * StableDiffusion3Pipeline): a sample's branches share one state */
    int cache_branch_contexts;
    int pipeline_sigmas;                 /* 1: the scheduler gets linspace(1, 1/steps) */
    ditd_latent_rule unscale;
    int default_steps;
    float default_guidance;
    int default_max_sequence_length;     /* text: max_sequence_length when a request gives none */
    int max_sequence_length;             /* text: the most it may ask for */
    /* skip-layer guidance defaults (StableDiffusion3Pipeline's __call__) */
    float slg_scale, slg_start, slg_stop;
    unsigned request;                    /* DITD_REQ_* */
    /* video pipelines (WanPipeline): num_frames when a request gives none
     * (81) and the frame rate of the clip (16); 0 for an image pipeline.
     * num_frames is rounded to 1 + k x the VAE's scale_factor_temporal and
     * the latents have (num_frames - 1) / scale_factor_temporal + 1 frames
     * (ditd_model_info's frames, engine/models/model.h). */
    int default_frames;
    int fps;
    /* Two experts (WanPipeline, Wan 2.2 A14B): 2 when the row may drive a
     * second transformer, model_index.json's `transformer_2`, for the steps
     * whose timestep is below boundary_ratio x num_train_timesteps (the
     * pipeline config's `boundary_ratio`), with guidance_scale_2 (the
     * request's; guidance_scale when it gives none). 0 or 1: one transformer
     * (a folder naming transformer_2 is then refused). */
    int max_experts;
    /* Image edits (img2img): the row whose rules an edit request on this
     * folder follows (an input image, strength: the schedule truncated as
     * get_timesteps, the image's VAE draw shifted and scaled, noised with the
     * scheduler's scale_noise at the first kept step; engine/pipeline/
     * pipeline.h, latent_image.h). FluxPipeline names FluxImg2ImgPipeline,
     * whose components are the same, so a FluxPipeline folder takes edits
     * too; FluxImg2ImgPipeline names itself (StableDiffusion3Pipeline:
     * StableDiffusion3Img2ImgPipeline). The edit row must share this row's
     * transformers, recipe, guidance and scheduler rules; its defaults, its
     * request fields (SD3's edit rows have no skip-layer guidance) and its
     * unscale (the decode of the samples that follow it) may differ.
     * NULL: the folder takes no input image. */
    const struct ditd_pipeline_class *img2img;
    /* Masked edits (inpainting): the row a request with a mask follows
     * (FluxInpaintPipeline: the img2img path plus per-step blending of the
     * kept latents with the noised image's, ditd_gen_sample.mask_latents).
     * The same sharing rule as img2img. NULL: no masks. */
    const struct ditd_pipeline_class *inpaint;
    double default_strength;             /* an img2img row: strength when a request gives none */
    /* Image-to-video (WanImageToVideoPipeline): 1 when every sample carries
     * an input image, made into a condition concatenated after the latents
     * on channels (the transformer's in_channels - out_channels of them:
     * the frame mask, then the VAE's latents of the image followed by zero
     * frames; engine/pipeline/image_cond.h) and, when the transformer has
     * an image branch (cond.image_dim), the image encoder's hidden states
     * (ditd_cond.image). 0: the latents are the transformer's whole input. */
    int image_to_video;
    /* A reference image (FluxKontextPipeline): 1 when an input image is a
     * reference the transformer attends to, not a start: its VAE latents
     * (the posterior's mode, shifted and scaled) are packed into tokens after
     * the noise tokens, with their own positions (first id 1), and the
     * output is the noise tokens' (ditd_gen_sample.ref_latents); no strength,
     * the whole schedule from noise. The output size is the request's aspect
     * ratio at default_max_area pixels (ditd_pipeline_class_area_size), the
     * reference's size the closest preferred resolution when auto_resize
     * (ditd_pipeline_class_reference_size). 0: no reference. */
    int reference;
    long default_max_area;               /* a reference row: max_area (1024 x 1024) */
    int auto_resize;                     /* a reference row: _auto_resize's default (1) */
} ditd_pipeline_class;

/* Whether row pc drives transformer class `tcls` with conditioning `kind`:
 * 0, or DITD_EUNSUPPORTED naming both and what the row takes. */
int ditd_pipeline_class_check(const ditd_pipeline_class *pc, const char *tcls,
                              ditd_cond_kind kind);

/* The transformer's text length for a request's max_sequence_length L: the
 * sum over the recipe's sequence groups of their token counts (FLUX: L;
 * SD3: 77 + L). 0 for a class pipeline. */
int ditd_pipeline_class_text_len(const ditd_pipeline_class *pc, int L);

/* How many prompts a request may give: 1 + the highest `prompt` a part
 * reads (FLUX 2: prompt, prompt_2; SD3 3); 0 for a class pipeline. */
int ditd_pipeline_class_prompts(const ditd_pipeline_class *pc);

/* The guidance scale of one sample's unconditional pass, 0 for none.
 * guidance: its guidance_scale; true_cfg: its true_cfg_scale; has_negative:
 * a negative prompt was given (text; "" counts); embeds: the model takes
 * guidance as an input. The one rule the batcher, the worker, the loop and
 * the command line share. */
float ditd_pipeline_class_cfg_scale(const ditd_pipeline_class *pc, float guidance, float true_cfg,
                                    int has_negative, int embeds);

/* Whether a sample's negative prompt must be encoded: its pass runs
 * (ditd_pipeline_class_cfg_scale > 0) on a text pipeline. */
int ditd_pipeline_class_needs_negative(const ditd_pipeline_class *pc, float guidance,
                                       float true_cfg, int has_negative, int embeds);

/* The row a sample follows on a folder of row pc: with a mask pc->inpaint,
 * with an input image pc->img2img, else pc itself; NULL when pc takes no
 * such input (a mask without an image: NULL). Its unscale decodes the
 * sample, its request says what the sample may carry. */
const ditd_pipeline_class *ditd_pipeline_class_edit_row(const ditd_pipeline_class *pc, int image,
                                                        int mask);

/* FluxKontextPipeline's output size: the request's width x height keeps its
 * aspect ratio at max_area pixels, width = round(sqrt(max_area x ratio)),
 * height = round(sqrt(max_area / ratio)) (Python's round, half to even), each
 * rounded down to a multiple of `multiple` (vae_scale_factor x 2). 0, or
 * DITD_EINVAL naming the sizes (non-positive, or nothing left). */
int ditd_pipeline_class_area_size(long max_area, int width, int height, int multiple, int *out_w,
                                  int *out_h);

/* The size FluxKontextPipeline brings a reference image of iw x ih to: the
 * image's size rounded down to vae_scale (get_default_height_width); with
 * auto_resize the preferred resolution (PREFERRED_KONTEXT_RESOLUTIONS) of the
 * closest aspect ratio (ties: the smaller width, then height, as Python's
 * min over tuples); then rounded down to `multiple` (vae_scale x 2). 0, or
 * DITD_EINVAL for an image too small to keep a pixel. */
int ditd_pipeline_class_reference_size(int auto_resize, int iw, int ih, int vae_scale,
                                       int *out_w, int *out_h);

/* The built-in rows (for tests and documentation). */
extern const ditd_pipeline_class ditd_pipeline_dit;
extern const ditd_pipeline_class ditd_pipeline_flux;
extern const ditd_pipeline_class ditd_pipeline_flux_img2img;
extern const ditd_pipeline_class ditd_pipeline_flux_inpaint;
extern const ditd_pipeline_class ditd_pipeline_flux_kontext;
extern const ditd_pipeline_class ditd_pipeline_sd3;
extern const ditd_pipeline_class ditd_pipeline_sd3_img2img;
extern const ditd_pipeline_class ditd_pipeline_sd3_inpaint;
extern const ditd_pipeline_class ditd_pipeline_wan;
extern const ditd_pipeline_class ditd_pipeline_wan_i2v;

#endif
