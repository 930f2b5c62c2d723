/* The pipeline table: one row per Diffusers pipeline class, and its rules. */
#include "engine/models/pipeline_class.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "engine/core/error.h"

/* DiTPipeline: a class id, guidance_scale 4 over the null class, the
 * scheduler's own steps, latents / scaling_factor. */
const ditd_pipeline_class ditd_pipeline_dit = {
    .name = "DiTPipeline",
    .transformers = {"DiTTransformer2DModel", NULL},
    .cond = DITD_COND_CLASS,
    .guidance = DITD_GUIDANCE_CFG,
    .unscale = DITD_LATENT_RULE_DIT,
    .default_steps = 25,
    .default_guidance = 4.0f,
};

/* FluxPipeline's recipe, guidance and scheduler rules: shared by the rows
 * of the FLUX family (the img2img row differs only in its defaults). */
#define FLUX_TEXT_RULES                                                                           \
    .transformers = {"FluxTransformer2DModel", NULL}, .cond = DITD_COND_TEXT, .n_parts = 2,       \
    .parts = {                                                                                    \
        {.tokenizer = "tokenizer", .encoder = "text_encoder", .kind = DITD_PROMPT_ENC_CLIP,       \
         .tokens = 77, .prompt = 0, .seq = DITD_PROMPT_SEQ_NONE, .seq_group = -1,                 \
         .pooled = DITD_PROMPT_POOLED_POOLER},                                                    \
        {.tokenizer = "tokenizer_2", .encoder = "text_encoder_2", .kind = DITD_PROMPT_ENC_T5,     \
         .tokens = 0, .prompt = 1, .seq = DITD_PROMPT_SEQ_LAST, .seq_group = 0,                   \
         .pooled = DITD_PROMPT_POOLED_NONE},                                                      \
    },                                                                                            \
    .guidance = DITD_GUIDANCE_TRUE_CFG, .pipeline_sigmas = 1, .unscale = DITD_LATENT_RULE_SHIFTED, \
    .default_max_sequence_length = 512, .max_sequence_length = 512,                               \
    .request = DITD_REQ_NEGATIVE_PROMPT | DITD_REQ_TRUE_CFG | DITD_REQ_MAX_SEQUENCE

/* FluxPipeline.encode_prompt: CLIP's pooler_output at 77 tokens (prompt),
 * T5's last_hidden_state at max_sequence_length (prompt_2, else prompt);
 * dev's guidance embedded, true CFG with a negative prompt; the
 * scheduler gets linspace(1, 1/steps). */
const ditd_pipeline_class ditd_pipeline_flux = {
    .name = "FluxPipeline",
    FLUX_TEXT_RULES,
    .cache_branch_contexts = 1, /* cache_context("cond") / ("uncond"); FluxImg2ImgPipeline sets none */
    .default_steps = 28,
    .default_guidance = 3.5f,
    .img2img = &ditd_pipeline_flux_img2img, /* the same components take edits */
    .inpaint = &ditd_pipeline_flux_inpaint,   /* and masked ones */
};

/* FluxImg2ImgPipeline (diffusers 0.42 pipelines/flux/pipeline_flux_img2img.py):
 * FluxPipeline's rules, its __call__ defaults (strength 0.6, 28 steps,
 * guidance_scale 7.0), and an input image: latent_dist.sample() of the VAE,
 * (z - shift_factor) x scaling_factor, scale_noise at the first step
 * get_timesteps keeps. A folder of this class also serves text-to-image
 * (no image: noise and the whole schedule, as FluxPipeline with these
 * defaults). */
const ditd_pipeline_class ditd_pipeline_flux_img2img = {
    .name = "FluxImg2ImgPipeline",
    FLUX_TEXT_RULES,
    .default_steps = 28,
    .default_guidance = 7.0f,
    .img2img = &ditd_pipeline_flux_img2img,
    .inpaint = &ditd_pipeline_flux_inpaint,
    .default_strength = 0.6,
};

/* FluxInpaintPipeline (diffusers 0.42 pipelines/flux/pipeline_flux_inpaint.py):
 * FluxImg2ImgPipeline's path and defaults (strength 0.6, 28 steps, guidance
 * 7.0) plus a mask (mask_image: white repainted, black kept), binarized at
 * 0.5 and taken to the latent grid by nearest interpolation
 * (ditd_latent_mask_from_gray); after every step the kept latents are the
 * image's, noised to the next step's sigma with the initial noise (the last
 * step: the image's latents themselves). The masked image's own VAE encode
 * feeds only a 64-channel (Fill) transformer and is not run. A folder of
 * this class serves text-to-image and unmasked edits too. */
const ditd_pipeline_class ditd_pipeline_flux_inpaint = {
    .name = "FluxInpaintPipeline",
    FLUX_TEXT_RULES,
    .default_steps = 28,
    .default_guidance = 7.0f,
    .img2img = &ditd_pipeline_flux_img2img,
    .inpaint = &ditd_pipeline_flux_inpaint,
    .default_strength = 0.6,
};

/* FluxKontextPipeline (diffusers 0.42 pipelines/flux/pipeline_flux_kontext.py):
 * FluxPipeline's recipe, guidance (true CFG with a negative prompt) and
 * scheduler rules, its __call__ defaults (28 steps, guidance_scale 3.5,
 * max_area 1024**2, _auto_resize True), and an input image as a reference:
 * retrieve_latents(sample_mode="argmax") of the VAE, (z - shift_factor) x
 * scaling_factor, packed after the noise tokens with image ids (1, row, col);
 * the schedule's mu from the noise tokens alone; no strength. Its __call__
 * runs no cache_context. Without an image it is text-to-image at max_area. */
const ditd_pipeline_class ditd_pipeline_flux_kontext = {
    .name = "FluxKontextPipeline",
    FLUX_TEXT_RULES,
    .default_steps = 28,
    .default_guidance = 3.5f,
    .reference = 1,
    .default_max_area = 1024L * 1024L,
    .auto_resize = 1,
};

/* StableDiffusion3Pipeline's recipe, guidance and scheduler rules: shared by
 * the SD3 rows (the edit rows differ in their defaults, skip-layer guidance
 * and, for inpainting, the decode). encode_prompt: both CLIPs'
 * hidden_states[-2] at 77 tokens joined on channels and zero-padded to
 * joint_attention_dim, then T5's last_hidden_state at max_sequence_length
 * (zeros without text_encoder_3); the pooled vector is both CLIPs' projected
 * text_embeds. guidance_scale over the negative prompt ("" when none), the
 * scheduler's own steps (shift, mu from the image tokens). */
#define SD3_TEXT_RULES                                                                            \
    .transformers = {"SD3Transformer2DModel", NULL}, .cond = DITD_COND_TEXT, .n_parts = 3,        \
    .parts = {                                                                                    \
        {.tokenizer = "tokenizer", .encoder = "text_encoder", .kind = DITD_PROMPT_ENC_CLIP,       \
         .tokens = 77, .prompt = 0, .seq = DITD_PROMPT_SEQ_PENULTIMATE, .seq_group = 0,           \
         .pooled = DITD_PROMPT_POOLED_PROJECTED},                                                 \
        {.tokenizer = "tokenizer_2", .encoder = "text_encoder_2", .kind = DITD_PROMPT_ENC_CLIP,   \
         .tokens = 77, .prompt = 1, .seq = DITD_PROMPT_SEQ_PENULTIMATE, .seq_group = 0,           \
         .pooled = DITD_PROMPT_POOLED_PROJECTED},                                                 \
        {.tokenizer = "tokenizer_3", .encoder = "text_encoder_3", .kind = DITD_PROMPT_ENC_T5,     \
         .tokens = 0, .prompt = 2, .seq = DITD_PROMPT_SEQ_LAST, .seq_group = 1,                   \
         .pooled = DITD_PROMPT_POOLED_NONE, .optional = 1},                                       \
    },                                                                                            \
    .guidance = DITD_GUIDANCE_CFG, .default_max_sequence_length = 256, .max_sequence_length = 512

/* StableDiffusion3Pipeline: the rules above, 28 steps, guidance_scale 7,
 * skip-layer guidance; edits follow StableDiffusion3Img2ImgPipeline and
 * StableDiffusion3InpaintPipeline, whose components are the same. */
const ditd_pipeline_class ditd_pipeline_sd3 = {
    .name = "StableDiffusion3Pipeline",
    SD3_TEXT_RULES,
    .unscale = DITD_LATENT_RULE_SHIFTED,
    .default_steps = 28,
    .default_guidance = 7.0f,
    .slg_scale = 2.8f,
    .slg_start = 0.01f,
    .slg_stop = 0.2f,
    .request = DITD_REQ_NEGATIVE_PROMPT | DITD_REQ_MAX_SEQUENCE | DITD_REQ_SKIP_LAYERS,
    .img2img = &ditd_pipeline_sd3_img2img, /* any SD3 folder takes edits */
    .inpaint = &ditd_pipeline_sd3_inpaint,
};

/* StableDiffusion3Img2ImgPipeline (diffusers 0.42 pipelines/stable_diffusion_3/
 * pipeline_stable_diffusion_3_img2img.py): the rules above, its __call__
 * defaults (strength 0.6, 50 steps, guidance_scale 7.0), no skip-layer
 * guidance (its __call__ has none), and an input image: latent_dist.sample()
 * of the VAE, (z - shift_factor) x scaling_factor, scale_noise at the first
 * step get_timesteps keeps (FlowMatchEulerDiscreteScheduler's order is 1);
 * the decode latents / scaling_factor + shift_factor. A folder of this class
 * also serves text-to-image with these defaults. */
const ditd_pipeline_class ditd_pipeline_sd3_img2img = {
    .name = "StableDiffusion3Img2ImgPipeline",
    SD3_TEXT_RULES,
    .unscale = DITD_LATENT_RULE_SHIFTED,
    .default_steps = 50,
    .default_guidance = 7.0f,
    .request = DITD_REQ_NEGATIVE_PROMPT | DITD_REQ_MAX_SEQUENCE,
    .img2img = &ditd_pipeline_sd3_img2img,
    .inpaint = &ditd_pipeline_sd3_inpaint,
    .default_strength = 0.6,
};

/* StableDiffusion3InpaintPipeline (diffusers 0.42 pipelines/stable_diffusion_3/
 * pipeline_stable_diffusion_3_inpaint.py) for a 16-channel transformer: the
 * img2img path (at strength 1 the latents are the noise itself, which
 * scale_noise at sigma 1 gives exactly) with its __call__ defaults (strength
 * 1.0, 50 steps, guidance_scale 7.0), no skip-layer guidance, a mask
 * (mask_image: white repainted, black kept; binarized at 0.5, nearest to the
 * latent grid) and after every step the kept latents the image's, noised to
 * the next step's sigma with the initial noise (the last step: the image's
 * latents). Its decode is the other SD3 rows', latents / scaling_factor +
 * shift_factor: Diffusers 0.42.1's pipeline leaves shift_factor out of its
 * decode (its encode subtracts it; diffusers#13611), which shifts every
 * color, and ditd does not copy that. The masked image's latents feed only a
 * 33-channel transformer, which ditd does not load (the VAE's 16 latent
 * channels must be the transformer's in_channels). */
const ditd_pipeline_class ditd_pipeline_sd3_inpaint = {
    .name = "StableDiffusion3InpaintPipeline",
    SD3_TEXT_RULES,
    .unscale = DITD_LATENT_RULE_SHIFTED,
    .default_steps = 50,
    .default_guidance = 7.0f,
    .request = DITD_REQ_NEGATIVE_PROMPT | DITD_REQ_MAX_SEQUENCE,
    .img2img = &ditd_pipeline_sd3_img2img,
    .inpaint = &ditd_pipeline_sd3_inpaint,
    .default_strength = 1.0,
};

/* What WanPipeline and WanImageToVideoPipeline share: the UMT5 prompt,
 * CFG with a state per branch, the mean/std unscale, the defaults, the
 * request fields, 81 frames at 16 fps. */
#define WAN_TEXT_RULES                                                                            \
    .transformers = {"WanTransformer3DModel", NULL}, .cond = DITD_COND_TEXT, .n_parts = 1,        \
    .parts = {{.tokenizer = "tokenizer", .encoder = "text_encoder", .kind = DITD_PROMPT_ENC_UMT5, \
               .tokens = 0, .prompt = 0, .seq = DITD_PROMPT_SEQ_LAST, .seq_group = 0,             \
               .pooled = DITD_PROMPT_POOLED_NONE}},                                               \
    .guidance = DITD_GUIDANCE_CFG, .cache_branch_contexts = 1,                                    \
    .unscale = DITD_LATENT_RULE_MEAN_STD, .default_steps = 50, .default_guidance = 5.0f,          \
    .default_max_sequence_length = 512, .max_sequence_length = 512,                               \
    .request = DITD_REQ_NEGATIVE_PROMPT | DITD_REQ_MAX_SEQUENCE | DITD_REQ_GUIDANCE_2,           \
    .default_frames = 81, .fps = 16

/* WanPipeline (Wan 2.1 T2V, diffusers 0.42 pipelines/wan/pipeline_wan.py):
 * the UMT5 encoder's last_hidden_state at max_sequence_length (512) as
 * _get_t5_prompt_embeds makes it (prompt_clean, the attention mask, the rows
 * past the prompt's tokens zeroed), no pooled vector; guidance_scale 5 over
 * the negative prompt ("" when none), two passes; 50 steps on the
 * scheduler's own sigmas (UniPC flow, flow_shift); 81 frames at 16 fps. The
 * latents go to the VAE through latents_mean / latents_std
 * (ditd_wan_vae_unscale) in engine/pipeline/latent_video.c; the image tail
 * (latent_image.c) refuses them (docs/wan_pipeline.md). Wan 2.2 A14B's
 * second expert (transformer_2, boundary_ratio, guidance_scale_2) and TI2V-5B's
 * expand_timesteps are the same row: the model folder says which. */
const ditd_pipeline_class ditd_pipeline_wan = {
    .name = "WanPipeline",
    WAN_TEXT_RULES,
    .max_experts = 2, /* Wan 2.2 A14B: transformer_2 below boundary_ratio */
};

/* WanImageToVideoPipeline (diffusers 0.42 pipelines/wan/pipeline_wan_i2v.py):
 * WanPipeline's recipe, guidance, scheduler, defaults and tail, and an
 * input image per sample: the condition (mask of 4 channels + the VAE's
 * argmax latents of [image, zeros] scaled by latents_mean / latents_std,
 * prepare_latents) after the latents on channels, and for Wan 2.1 I2V
 * (a transformer with image_dim) CLIPVisionModel's hidden_states[-2] of
 * CLIPImageProcessor's pixels as encoder_hidden_states_image, in both
 * passes. Wan 2.2 I2V-A14B: no image encoder, two experts. */
const ditd_pipeline_class ditd_pipeline_wan_i2v = {
    .name = "WanImageToVideoPipeline",
    WAN_TEXT_RULES,
    .max_experts = 2,
    .image_to_video = 1,
};

/* PREFERRED_KONTEXT_RESOLUTIONS, (width, height) */
static const int kontext_res[][2] = {
    {672, 1568}, {688, 1504}, {720, 1456}, {752, 1392},  {800, 1328},  {832, 1248},
    {880, 1184}, {944, 1104}, {1024, 1024}, {1104, 944}, {1184, 880},  {1248, 832},
    {1328, 800}, {1392, 752}, {1456, 720},  {1504, 688}, {1568, 672},
};

int ditd_pipeline_class_area_size(long max_area, int width, int height, int multiple, int *out_w,
                                  int *out_h)
{
    if (max_area <= 0 || width <= 0 || height <= 0 || multiple <= 0)
        return ditd_err_set(DITD_EINVAL, "max_area %ld for %dx%d", max_area, width, height);
    /* Python floats: aspect_ratio = width / height; round((max_area * ar) ** 0.5) */
    double ar = (double)width / (double)height;
    double w = nearbyint(pow((double)max_area * ar, 0.5));
    double h = nearbyint(pow((double)max_area / ar, 0.5));
    if (!(w < 1e6 && h < 1e6))
        return ditd_err_set(DITD_EINVAL, "max_area %ld for %dx%d", max_area, width, height);
    int iw = (int)w / multiple * multiple, ih = (int)h / multiple * multiple;
    if (iw <= 0 || ih <= 0)
        return ditd_err_set(DITD_EINVAL, "max_area %ld at %dx%d's aspect ratio leaves %dx%d "
                            "(multiples of %d)", max_area, width, height, iw, ih, multiple);
    *out_w = iw;
    *out_h = ih;
    return 0;
}

int ditd_pipeline_class_reference_size(int auto_resize, int iw, int ih, int vae_scale,
                                       int *out_w, int *out_h)
{
    if (vae_scale <= 0 || iw <= 0 || ih <= 0)
        return ditd_err_set(DITD_EINVAL, "reference image %dx%d", iw, ih);
    const int multiple = 2 * vae_scale;
    int w = iw - iw % vae_scale, h = ih - ih % vae_scale; /* get_default_height_width */
    if (w <= 0 || h <= 0)
        return ditd_err_set(DITD_EINVAL, "reference image %dx%d: smaller than the VAE's %d", iw,
                            ih, vae_scale);
    if (auto_resize) {
        double ar = (double)w / (double)h, best = INFINITY;
        int bw = 0, bh = 0;
        for (size_t i = 0; i < sizeof kontext_res / sizeof kontext_res[0]; i++) {
            double d = fabs(ar - (double)kontext_res[i][0] / (double)kontext_res[i][1]);
            /* min over (diff, w, h) tuples */
            if (d < best || (d == best && (kontext_res[i][0] < bw ||
                                           (kontext_res[i][0] == bw && kontext_res[i][1] < bh)))) {
                best = d;
                bw = kontext_res[i][0];
                bh = kontext_res[i][1];
            }
        }
        w = bw;
        h = bh;
    }
    w = w / multiple * multiple;
    h = h / multiple * multiple;
    if (w <= 0 || h <= 0)
        return ditd_err_set(DITD_EINVAL, "reference image %dx%d: smaller than %d pixels a side "
                            "(vae_scale_factor x 2)", iw, ih, multiple);
    *out_w = w;
    *out_h = h;
    return 0;
}

static const char *const rule_names[DITD_LATENT_RULE_COUNT] = {"dit", "shifted", "mean_std"};
static const char *const guidance_names[DITD_GUIDANCE_KIND_COUNT] = {"cfg", "true_cfg"};

const char *ditd_latent_rule_name(ditd_latent_rule r)
{
    return (unsigned)r < DITD_LATENT_RULE_COUNT ? rule_names[r] : "?";
}

int ditd_latent_rule_from_str(const char *s, ditd_latent_rule *out)
{
    for (int i = 0; i < DITD_LATENT_RULE_COUNT; i++)
        if (s && !strcmp(s, rule_names[i])) {
            *out = (ditd_latent_rule)i;
            return 0;
        }
    return ditd_err_set(DITD_EINVAL, "unknown latent rule \"%s\" (dit, shifted, mean_std)", s ? s : "(null)");
}

const char *ditd_guidance_kind_name(ditd_guidance_kind k)
{
    return (unsigned)k < DITD_GUIDANCE_KIND_COUNT ? guidance_names[k] : "?";
}

int ditd_guidance_kind_from_str(const char *s, ditd_guidance_kind *out)
{
    for (int i = 0; i < DITD_GUIDANCE_KIND_COUNT; i++)
        if (s && !strcmp(s, guidance_names[i])) {
            *out = (ditd_guidance_kind)i;
            return 0;
        }
    return ditd_err_set(DITD_EINVAL, "unknown guidance kind \"%s\" (cfg, true_cfg)",
                        s ? s : "(null)");
}

int ditd_pipeline_class_check(const ditd_pipeline_class *pc, const char *tcls, ditd_cond_kind kind)
{
    char list[256];
    size_t len = 0;
    int ok = pc->transformers[0] == NULL;
    list[0] = '\0';
    for (int i = 0; i < 4 && pc->transformers[i]; i++) {
        ok = ok || strcmp(pc->transformers[i], tcls) == 0;
        int n = snprintf(list + len, sizeof list - len, "%s%s", i ? ", " : "", pc->transformers[i]);
        if (n > 0 && len + (size_t)n < sizeof list)
            len += (size_t)n;
    }
    if (!ok)
        return ditd_err_set(DITD_EUNSUPPORTED, "%s drives %s, not a %s", pc->name, list, tcls);
    if (kind != pc->cond)
        return ditd_err_set(DITD_EUNSUPPORTED, "%s takes %s conditioning; the %s is %s-conditioned",
                            pc->name, ditd_cond_kind_name(pc->cond), tcls, ditd_cond_kind_name(kind));
    return 0;
}

int ditd_pipeline_class_text_len(const ditd_pipeline_class *pc, int L)
{
    int total = 0;
    for (int g = 0; g < DITD_PROMPT_MAX_PARTS; g++) {
        for (int i = 0; i < pc->n_parts; i++) {
            const ditd_prompt_part *pp = &pc->parts[i];
            if (pp->seq != DITD_PROMPT_SEQ_NONE && pp->seq_group == g) {
                total += pp->tokens > 0 ? pp->tokens : L;
                break; /* one length a group */
            }
        }
    }
    return total;
}

int ditd_pipeline_class_prompts(const ditd_pipeline_class *pc)
{
    int n = 0;
    for (int i = 0; i < pc->n_parts; i++)
        if (pc->parts[i].prompt + 1 > n)
            n = pc->parts[i].prompt + 1;
    return n;
}

float ditd_pipeline_class_cfg_scale(const ditd_pipeline_class *pc, float guidance, float true_cfg,
                                    int has_negative, int embeds)
{
    switch (pc->guidance) {
    case DITD_GUIDANCE_TRUE_CFG:
        return true_cfg > 1.0f && has_negative ? true_cfg : 0.0f;
    case DITD_GUIDANCE_CFG:
    default:
        return guidance > 1.0f && !embeds ? guidance : 0.0f;
    }
}

int ditd_pipeline_class_needs_negative(const ditd_pipeline_class *pc, float guidance,
                                       float true_cfg, int has_negative, int embeds)
{
    return pc->cond == DITD_COND_TEXT &&
           ditd_pipeline_class_cfg_scale(pc, guidance, true_cfg, has_negative, embeds) > 0.0f;
}

const ditd_pipeline_class *ditd_pipeline_class_edit_row(const ditd_pipeline_class *pc, int image,
                                                        int mask)
{
    if (mask)
        return image ? pc->inpaint : NULL;
    return image ? pc->img2img : pc;
}
