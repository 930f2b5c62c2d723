/* The community FLUX LoRA formats (docs/lora.md "Formats"), read into the
 * model's Diffusers modules as Diffusers' FluxLoraLoaderMixin.lora_state_dict
 * converts them (diffusers/loaders/lora_conversion_utils.py, 0.42):
 *
 *   kohya-bfl  lora_unet_<BFL module, '.' as '_'>.lora_down.weight,
 *              .lora_up.weight, .alpha (sd-scripts' FLUX LoRAs;
 *              _convert_kohya_flux_lora_to_diffusers);
 *   bfl        diffusion_model.<BFL module>.lora_down / .lora_up / .alpha
 *              (ComfyUI: the same converter after its rename), or
 *              .lora_A / .lora_B (+ .alpha) under diffusion_model.,
 *              base_model.model. or no prefix;
 *   xlabs      [diffusion_model.]double_blocks.<i>.processor.qkv_lora1
 *              .down.weight / .up.weight ... (XLabs' processors;
 *              _convert_xlabs_flux_lora_to_diffusers).
 *
 * The BFL module names are FLUX's original ones (double_blocks.<i>.img_attn
 * .qkv, single_blocks.<i>.linear1, final_layer.adaLN_modulation.1, ...). A
 * fused BFL linear becomes its Diffusers parts: qkv -> to_q, to_k, to_v (the
 * A matrix shared, B split by rows); a single block's linear1 -> to_q, to_k,
 * to_v, proj_mlp; when B is block-diagonal and the rank divides by the parts
 * (sd-scripts' split qkv), A and B are split by rank instead, as Diffusers
 * does. final_layer.adaLN_modulation.1 -> norm_out.linear with the two halves
 * of B's rows swapped (BFL's shift, scale against Diffusers' scale, shift).
 * The scale is alpha / rank (alpha defaults to the rank) except on
 * final_layer's two modules, whose alpha Diffusers' converter leaves out
 * (scale 1); XLabs files have no alpha (scale 1). Diffusers folds the scale
 * into A and B; ditd keeps it as the module's scale, the same product.
 *
 * What it is not: Diffusers' names (ai-toolkit saves those) and kohya over
 * Diffusers names are read by lora.c itself; no BFL Control LoRAs, no
 * lora_transformer_ "mixture" names, no DoRA, no text-encoder modules (all
 * refused naming the tensor).
 */
#ifndef DITD_ENGINE_LORA_CONVERT_H
#define DITD_ENGINE_LORA_CONVERT_H

#include "engine/io/safetensors.h"
#include "engine/models/lora.h"

/* The format of st's tensor names for a model whose linears are
 * targets[0 .. nt): for a FLUX transformer (a target in
 * single_transformer_blocks.), DITD_LORA_FORMAT_KOHYA_BFL, _BFL or _XLABS
 * when any tensor is named in one of them (ditd_lora_convert_read then
 * reads the file and refuses any other name); else DITD_LORA_FORMAT_PEFT
 * (lora.c's own reading: PEFT and kohya over Diffusers names; another
 * family's file in BFL names is refused there as modules it lacks). */
ditd_lora_format ditd_lora_convert_detect(const ditd_safetensors *st,
                                          const ditd_lora_target *targets, int nt);

/* Reads st (named `what` in errors), a file of the community format fmt,
 * for the model's targets[0 .. nt) into l: l->mod (owned by l, in file
 * order), l->n_mod, l->max_rank, l->format. Text-encoder tensors (lora_te*,
 * text_encoder*) are skipped when skip_te is set (a model with text
 * encoders: engine/text/text_lora.h reads them), refused otherwise. Errors
 * (DITD_EFORMAT,
 * DITD_ENOENT for a module or block the model lacks, DITD_ESHAPE,
 * DITD_EUNSUPPORTED, DITD_ENOMEM) name the file's tensor; on error l may
 * hold modules already read (ditd_lora_free frees them). */
int ditd_lora_convert_read(const ditd_safetensors *st, const char *what, ditd_lora_format fmt,
                           const ditd_lora_target *targets, int nt, int skip_te, ditd_lora *l);

/* A module's alpha tensor al (one number, finite) into *alpha; errors name
 * the tensor and `what`. Shared with lora.c's own reader. */
int ditd__lora_read_alpha(const ditd_safetensors *st, const ditd_st_tensor *al, const char *what,
                          float *alpha);

/* Re-lays B of every module whose target stores its output rows grouped
 * (ditd_lora_target.row_groups g > 1: output row r = c g + q is the model's
 * row q (n_out / g) + c), so the term lands where the model keeps each
 * output. DITD_ENOMEM (naming `what`). */
int ditd__lora_relay_rows(ditd_lora *l, const ditd_lora_target *targets, const char *what);

#endif
