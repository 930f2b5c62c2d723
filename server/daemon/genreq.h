/* A generation request: the JSON body of POST /v1/images/generations turned,
 * once, into typed fields (JSON stops here). Validation names the field that
 * is wrong; nothing invalid reaches the scheduler.
 *
 * What a request may say depends on the model's conditioning
 * (engine/models/conditioning.h) and its pipeline row
 * (engine/models/pipeline_class.h): a class model's prompt names a class
 * (or class_label gives it); a text model's prompt is text, with what its
 * pipeline takes beside it (negative_prompt, max_sequence_length; FLUX's
 * true_cfg_scale and prompt_2; SD3's prompt_2, prompt_3 and skip-layer
 * guidance); anything else is refused naming the field. Sizes
 * follow the model: its one size, or for a resizable model any multiple of
 * size_multiple within [min_size, max_size] per side.
 *
 * Also the OpenAI error envelope every route answers with. */
#ifndef DITD_SERVER_GENREQ_H
#define DITD_SERVER_GENREQ_H

#include <stddef.h>
#include <stdint.h>

#include "engine/models/lora.h"
#include "engine/models/model.h"
#include "engine/pipeline/pipeline.h"
#include "engine/pipeline/sampler.h"
#include "server/daemon/api_error.h"

#define DITD_GENREQ_MAX_N 10
/* A prompt's (and a negative prompt's) limit in UTF-8 bytes: far past what
 * the text encoders read (T5: max_sequence_length tokens, CLIP 77), so no
 * real prompt meets it, and a request cannot park megabytes in the queue. */
#define DITD_GENREQ_MAX_PROMPT_BYTES 8192

typedef struct ditd_genreq {
    int n;                      /* 1..10 */
    int width, height;          /* the image, in pixels */
    int steps;
    ditd_sampler_kind sampler;
    float guidance;
    int64_t class_id;           /* class models */
    /* text models (both owned, NUL-terminated valid UTF-8; NULL for class
     * models; negative_prompt NULL when not given) */
    char *prompt;
    char *negative_prompt;
    char *prompt_23[2];         /* prompt_2, prompt_3 (NULL when not given) */
    char *negative_23[2];       /* negative_prompt_2, negative_prompt_3 */
    float true_cfg;             /* FluxPipeline's true_cfg_scale, >= 0 (default 1) */
    int max_sequence_length;    /* 1..the model's; 0 for class models */
    /* skip-layer guidance (StableDiffusion3Pipeline): 0 layers = off */
    int n_skip_layers;
    int skip_layers[DITD_MAX_SKIP_LAYERS];
    float slg_scale, slg_start, slg_stop;
    uint64_t seed;
    int seed_given;
    int stream;
    int partial_images;         /* 0..3 */
    /* step caching (engine/pipeline/step_cache.h): the request's "cache",
     * else the server's default; method none: off */
    ditd_cache_config cache;
    /* a clip (POST /v1/videos, ditd_genreq_parse_video): its frames in
     * pixels, rounded as WanPipeline (1 + k x the VAE's temporal scale), and
     * the MP4's frame rate; 0 for an image. guidance_scale_2: a model with
     * two experts only. */
    int frames;
    int fps;
    int has_guidance_2;
    float guidance_2;
    /* LoRA adapters ("loras": [{"name", "scale"}, ...]): indexes into the
     * server's adapters (ditd_genreq_model.lora_names) and their weights */
    int n_loras;
    int lora_idx[DITD_LORA_MAX_SET];
    float lora_scale[DITD_LORA_MAX_SET];
    /* an edit (POST /v1/images/edits, ditd_genreq_parse_edit): edit 1,
     * 0 < strength <= 1, image n_images x (height, width, 3) 8-bit RGB
     * at the request's size, one after the other, mask n_masks x (height,
     * width) 8-bit luma in Diffusers' mask_image sense (white repainted,
     * black kept) or NULL (img2img, n_masks 0); both owned. Output i edits
     * image i % n_images with mask i % n_masks (n_masks 1: one mask for
     * all; ditd_genreq_edit_input). A generation: edit 0, strength 0, both
     * NULL, the counts 0. */
    int edit;
    double strength;
    uint8_t *image;
    uint8_t *mask;
    int n_images, n_masks;
    /* image-to-video (a clip of a WanImageToVideoPipeline folder):
     * image is its input_reference, (image_h, image_w, 3) 8-bit RGB at its
     * own size (the replica resizes it to the clip's, as Diffusers does);
     * edit 0, mask NULL. 0 otherwise. */
    int image_w, image_h;
    /* FLF2V (ditd_model_info.last_image): the clip's last frame, its
     * last_frame_reference, (last_h, last_w, 3) 8-bit RGB at its own size,
     * owned; NULL and 0 otherwise. */
    uint8_t *last_image;
    int last_w, last_h;
} ditd_genreq;


/* The served model and the extra names a request's `model` may use to reach
 * it (--served-model-name). Borrowed. */
typedef struct ditd_genreq_model {
    const ditd_model_info *info;
    const char *const *aliases;
    int n_aliases;
    ditd_sampler_kind sched_default; /* the model's scheduler kind */
    const ditd_cache_config *cache_default; /* ditd serve --cache; NULL: none */
    /* the LoRA adapters a request may name by slot (a NULL entry: none
     * there), and how many at once */
    const char *const *lora_names;
    int n_loras;
    int max_loras;
    /* the folder's scheduler_config (borrowed; NULL: steps are not checked
     * against it): a step count the sampler cannot take (UniPC's flow
     * sigmas repeating a timestep at 400 steps, say) is refused with 400
     * naming num_inference_steps, not failed on a replica */
    const ditd_sched_config *sched;
} ditd_genreq_model;

/* 1 when `name` reaches the model: its folder name or one of its aliases. */
int ditd_genreq_model_named(const ditd_genreq_model *gm, const char *name);

/* Parses and validates body (len bytes, not NUL-terminated) against the
 * model. Returns 0 with *out filled (its strings owned: release with
 * ditd_genreq_free, or hand them to a job, ditd_job_accept), or
 * DITD_EINVAL (400) / DITD_ENOENT (404, unknown model) / DITD_ENOMEM (500)
 * with *e filled and nothing owned. */
int ditd_genreq_parse(const char *body, size_t len, const ditd_genreq_model *gm,
                      ditd_genreq *out, ditd_api_error *e);
/* The same for the body of POST /v1/videos (OpenAI's video create: model,
 * prompt, seconds, size; plus ditd's seed, num_inference_steps,
 * guidance_scale, guidance_scale_2, negative_prompt, num_frames, fps,
 * max_sequence_length, sampler, cache), for a video model: one clip (n 1),
 * frames from num_frames, else seconds x fps + 1, else the model's default,
 * rounded as the pipeline rounds them. An image model is refused naming
 * /v1/images/generations. input_reference (image-to-video): required on a
 * WanImageToVideoPipeline folder, refused naming it on a text-to-video one;
 * a base64 string, a data URL or {"image_url": ...} holding one (the videos
 * route turns a form's file part into base64), a PNG, JPEG or WebP decoded
 * under the default ditd_image_limits into out->image at its own size.
 * last_frame_reference (ditd's, FLF2V): the same forms and limits into
 * out->last_image; required on a folder whose transformer takes a last
 * frame (ditd_model_info.last_image), refused naming it on any other.
 * ditd_genreq_parse refuses a video model naming /v1/videos. */
int ditd_genreq_parse_video(const char *body, size_t len, const ditd_genreq_model *gm,
                            ditd_genreq *out, ditd_api_error *e);
/* The same for POST /v1/images/edits (OpenAI's image edit): the body is
 * multipart/form-data (ctype says so: `image` or `image[]`, `mask` as file
 * parts, the other fields as text) or JSON (`image` a base64 string or a
 * data URL, or `images` [{"image_url": ...}], `mask` likewise); the fields
 * of a generation plus `strength`. The model's row must take edits (its
 * img2img; a mask: its inpaint). OpenAI's mask rule: the mask's transparent
 * pixels (alpha <= 127) are repainted; without a mask, the image's own alpha
 * when it has transparent pixels, else the whole image is edited (img2img).
 * Several images (`image[]` repeated, a JSON array): Diffusers' image list,
 * output i edits image i % k, n a multiple of k; one mask for all of them,
 * or without one each image's own alpha (all of them transparent somewhere,
 * or none). The images are decoded under lim (NULL: defaults), all of one
 * size, and must be at the request's size (size absent: the first image's).
 * Errors name the field. */
struct ditd_image_limits;
int ditd_genreq_parse_edit(const char *ctype, const char *body, size_t len,
                           const ditd_genreq_model *gm, const struct ditd_image_limits *lim,
                           ditd_genreq *out, ditd_api_error *e);
/* Output i's input of an edit (engine/pipeline/edit_images.h: image
 * i % n_images, its mask i % n_masks or NULL) and the image's index j (its
 * part of the posterior draw). */
void ditd_genreq_edit_input(const ditd_genreq *r, int i, const uint8_t **image,
                            const uint8_t **mask, int *j);
/* The clip's length in seconds as OpenAI's video object states it: frames
 * over fps, "%g" ("5.0625" for 81 frames at 16 fps). */
void ditd_genreq_seconds(const ditd_genreq *r, char *out, size_t n);

/* Frees what the request owns (its strings); the struct may be reused. */
void ditd_genreq_free(ditd_genreq *r);

/* Values per image of the request: channels x width x height (x frames for
 * a clip). */
size_t ditd_genreq_numel(const ditd_genreq *r, const ditd_model_info *m);

/* The envelope {"error":{"message","type","param","code"}} as a malloc'd
 * string (NULL on out of memory). */
char *ditd_api_error_json(const ditd_api_error *e);

/* The length of the valid UTF-8 sequence at p (n bytes left), 0 if none
 * starts there. */
size_t ditd_utf8_seq(const unsigned char *p, size_t n);
/* Replaces each byte of s that starts no valid UTF-8 sequence with '?'. */
void ditd_utf8_clean(char *s);


#endif
