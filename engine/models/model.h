/* A model folder in Diffusers layout, as users have it on disk:
 *   model_index.json            pipeline class, components, id2label
 *   transformer/config.json     + *.safetensors (single or sharded); its
 *                               _class_name picks the denoiser family
 *                               (engine/models/registry.h)
 *   scheduler/scheduler_config.json
 *   vae/config.json             latent models only: block_out_channels
 *                               gives the VAE scale factor
 *   ditd.json                   optional: ditd's default generation settings
 *                               {"num_inference_steps", "guidance_scale", "sampler"}
 *
 * This module reads the folder's small JSON files into typed fields; it
 * does not load weights (the family's table does) or build samplers
 * (engine/pipeline/sampler.h).
 *
 * Latent and image are different shapes: the denoiser works on latents
 * (shapes: C x h x w); the image is (h x vae_scale) x (w x vae_scale)
 * pixels of image_channels. A pixel-space model (no vae) has vae_scale 1
 * and image_channels C: the two are equal.
 */
#ifndef DITD_ENGINE_MODEL_H
#define DITD_ENGINE_MODEL_H

#include <stdint.h>

#include "engine/core/tensor.h"

#include "engine/models/denoiser.h"
#include "engine/models/pipeline_class.h"

#define DITD_MODEL_PATH_MAX 4096
#define DITD_MODEL_MAX_IMAGE_SIZE 2048    /* pixels per side, unless ditd.json says */
#define DITD_MODEL_MAX_SEQUENCE_LENGTH 512 /* FluxPipeline's limit on T5 tokens */

typedef struct ditd_model_info {
    char dir[DITD_MODEL_PATH_MAX];
    char name[256];              /* the folder's base name: the API's model id */
    char transformer_dir[DITD_MODEL_PATH_MAX];
    /* Weights from a file beside the folder (--transformer-file,
     * --text-encoder-2-file: a .gguf or .safetensors, as a ComfyUI /
     * stable-diffusion.cpp download pairs with a Diffusers folder), set by
     * ditd_model_info_set_files; "" = the component folder's own. The
     * folder's config.json still says the shapes. */
    char transformer_file[DITD_MODEL_PATH_MAX];
    char text_encoder_2_file[DITD_MODEL_PATH_MAX];
    char scheduler_config[DITD_MODEL_PATH_MAX];
    char pipeline_class[128];    /* model_index.json's _class_name */
    const ditd_pipeline_class *pipeline; /* its row of the pipeline table (static, borrowed):
                                          * everything that depends on the class asks it */
    char denoiser_class[128];    /* transformer/config.json's _class_name */
    const ditd_denoiser_family *denoiser; /* its family (static table, from the registry) */
    ditd_denoiser_shapes shapes; /* latent shape, heads, tokens, conditioning */
    int needs_vae;               /* model_index.json names a vae component */
    char vae_dir[DITD_MODEL_PATH_MAX]; /* "" without a vae (or without vae/config.json) */
    char vae_class[128];         /* vae/config.json's _class_name ("" without) */
    const struct ditd_vae_family *vae; /* its family (static table, from the registry); NULL without */
    int vae_scale;               /* 2^(len(vae block_out_channels) - 1); 1 without a vae */
    int image_width, image_height; /* pixels: latent size x vae_scale */
    int image_channels;          /* vae out_channels (3); C without a vae. vae_scale and
                                  * the image are 0 for a latent model without vae/ (its
                                  * latents can be saved; decoding is refused) */
    int num_classes;             /* K for class conditioning, else 0 */
    char **labels;               /* K entries (id2label; "class N" when absent), owned */
    /* Sizes. A resizable model (its family has set_size) takes any image
     * width and height in [min_size, max_size] pixels that are multiples of
     * size_multiple (vae_scale x the family's latent_multiple: FLUX 16);
     * image_width x image_height is then the default size. Otherwise the
     * model makes image_width x image_height only (min = max = that). */
    int resizable;
    int size_multiple;
    int min_size, max_size;      /* per side; ditd.json "max_image_size" (default 2048) */
    /* Text models (shapes.cond.kind DITD_COND_TEXT): the T5 length a request
     * may ask for (the pipeline's max_sequence_length, <= 512) and its
     * default (FLUX 512, SD3 256; ditd.json may change it); 0 for class
     * models. */
    int max_sequence_length;
    int default_max_sequence_length;
    /* defaults for requests that give none (ditd.json, else the pipeline
     * row's: DiTPipeline 25 steps, guidance 4; FluxPipeline 28, 3.5;
     * StableDiffusion3Pipeline 28, 7) */
    int default_steps;
    float default_guidance;
    char default_sampler[32];    /* "" = the scheduler_config's own class */
    /* Video models (a pipeline row with default_frames: WanPipeline): the
     * clip's default frame count in pixels (81; ditd.json "num_frames" may
     * change it), the VAE's scale_factor_temporal (vae/config.json, 4 when
     * absent, as WanPipeline), the most frames a request may ask for
     * (ditd.json "max_frames", default 1 + 64 frame_step) and the frame rate
     * (the row's: 16). A clip of N frames (N = 1 + k frame_step) is
     * (N - 1) / frame_step + 1 latent frames: ditd_model_latent_frames.
     * All 0 for an image model. */
    int frames;
    int frame_step;
    int max_frames;
    int fps;
    /* Two experts (a pipeline row with max_experts 2: WanPipeline, Wan 2.2
     * A14B): model_index.json's transformer_2 folder, the same transformer
     * class with the same shapes, and the pipeline config's boundary_ratio:
     * the steps whose timestep t < boundary_ratio x num_train_timesteps run
     * transformer_2. "" and -1 without: one transformer. transformer_2
     * without boundary_ratio is not used (as Diffusers: its boundary is
     * None), boundary_ratio without transformer_2 is refused (Diffusers
     * would fail at the first low-noise step). expand_timesteps (TI2V-5B):
     * the model_index.json flag, 0 or 1 (docs/wan_pipeline.md). */
    char transformer_2_dir[DITD_MODEL_PATH_MAX];
    double boundary_ratio;
    int expand_timesteps;
    /* Image-to-video (a row with image_to_video: WanImageToVideoPipeline):
     * the condition's channels (in_channels - out_channels: 4 mask + the
     * VAE's z_dim; 0 with expand_timesteps, TI2V-5B, where the image's
     * latents replace the first latent frame instead), and for a transformer with an image branch
     * (shapes.cond.image_dim) the image_encoder/ folder (CLIPVisionModel)
     * and image_processor/preprocessor_config.json; "" without. */
    int cond_channels;
    char image_encoder_dir[DITD_MODEL_PATH_MAX];
    char image_processor_config[DITD_MODEL_PATH_MAX];
    /* FLF2V (first-last-frame-to-video): the transformer's image tokens
     * (shapes.cond.image_len, Wan's pos_embed_seq_len) are two images' of the
     * image encoder, so every clip takes a last frame too (Diffusers'
     * last_image); 0 for any other folder. Known when the folder is read, so
     * the front-end can require or refuse a last frame without the encoder. */
    int last_image;
} ditd_model_info;

/* Reads the folder. Errors name the file and key; a pipeline class the
 * table lacks, or one that does not drive the folder's transformer, is
 * refused naming both. *out is owned: release with ditd_model_info_free(). */
int ditd_model_info_load(const char *dir, ditd_model_info *out);
void ditd_model_info_free(ditd_model_info *m);

/* The weights files that replace transformer/'s and text_encoder_2/'s
 * (NULL or "": the folder's). Checked here, before any weight is read: the
 * file exists and is a regular .gguf or .safetensors file (DITD_ENOENT /
 * DITD_EINVAL naming the flag and the file); the denoiser family takes a
 * weights file (DITD_EUNSUPPORTED naming its class otherwise); the
 * pipeline's text_encoder_2 is a T5 (FLUX; DITD_EUNSUPPORTED naming the
 * pipeline otherwise). Whether the file's tensors fit the config is the
 * load's to say, by tensor. */
int ditd_model_info_set_files(ditd_model_info *m, const char *transformer_file,
                              const char *text_encoder_2_file);

/* The dtype a checkpoint keeps its weights in (weights_path: a component
 * folder or a .safetensors file/index): that of its largest tensor, F32
 * unless it is BF16 or F16 (a checkpoint may keep a few small tensors in
 * f32). Any family. A folder without a safetensors checkpoint is F32 (the
 * family's load says what is missing); so is a GGUF file or folder (its
 * blocks are computed in f32 unless --dtype bf16 says otherwise). */
int ditd_model_checkpoint_dtype(const char *weights_path, ditd_dtype *out);

/* Whether the model makes width x height pixels: any multiple of
 * size_multiple in [min_size, max_size] per side for a resizable model,
 * its one image size otherwise. 0, or DITD_EINVAL with a detail naming the
 * size, the model and what it takes (the server, the worker and generate
 * all say the same). */
int ditd_model_check_size(const ditd_model_info *m, int width, int height);

/* WanPipeline's rounding of num_frames: N stays when N % frame_step is 1,
 * else N / frame_step x frame_step + 1 (and at least 1). n for an image
 * model. */
int ditd_model_round_frames(const ditd_model_info *m, int n);

/* The latent frames of a clip of n frames ((n - 1) / frame_step + 1 after
 * ditd_model_round_frames); 0 for an image model. */
int ditd_model_latent_frames(const ditd_model_info *m, int n);

/* Whether a video model makes clips of n frames (after rounding: 1..
 * max_frames): 0, or DITD_EINVAL naming the count, the model and its
 * limits; an image model takes n <= 1 only. */
int ditd_model_check_frames(const ditd_model_info *m, int n);

/* Class id from a request's words: a number "0".."K-1", or a label from
 * id2label (case-insensitive; a label with commas has each part as a
 * synonym, as DiTPipeline.get_label_ids). DITD_EINVAL when none matches. */
int ditd_model_class_from_str(const ditd_model_info *m, const char *s, int *out);

#endif
