/* `ditd generate`'s parts (not a public header: the command is
 * ditd_cmd_generate in cmd.h):
 *   generate_args.c  the command line, as given (no model folder read);
 *   generate_io.c    the files it writes (PNG images, MP4 clips / PNG frames);
 *   cmd_generate.c   the run: the group, the replica (engine/worker/replica.h),
 *                    the checks that need the folder, prompts, adapters, the
 *                    denoising, the decode. */
#ifndef DITD_SERVER_CMD_GENERATE_H
#define DITD_SERVER_CMD_GENERATE_H

#include <stdint.h>

#include "engine/backend/backend.h"
#include "engine/models/lora.h"
#include "engine/parallel/mesh.h"
#include "engine/pipeline/step_cache.h"
#include "engine/pipeline/edit_images.h"
#include "server/common/image_in.h"

/* --lora NAME=PATH (repeatable) and --lora-scale NAME=S, as given (with
 * --lora-dir's files after the --lora flags). */
typedef struct ditd_gen_lora_args {
    int n;
    char name[DITD_LORA_MAX_SET][64];
    const char *path[DITD_LORA_MAX_SET];
    float scale[DITD_LORA_MAX_SET];
    int n_scale;
    char scale_name[DITD_LORA_MAX_SET][64];
    float scale_val[DITD_LORA_MAX_SET];
    /* --lora-expert NAME=WHERE (two experts, Wan 2.2): per adapter 0 both,
     * 1 transformer alone, 2 transformer_2 alone (docs/lora.md) */
    int expert[DITD_LORA_MAX_SET];
    int n_expert;
    char expert_name[DITD_LORA_MAX_SET][64];
    int expert_val[DITD_LORA_MAX_SET];
} ditd_gen_lora_args;

/* The command line; -1 / 0 / NULL: not given (the model's default). */
typedef struct ditd_gen_args {
    ditd_layout layout;
    const char *model_dir;   /* the embedded default model's when not given */
    const char *transformer_file, *text_encoder_2_file; /* --transformer-file, ... */
    const char *class_str, *sampler_str, *latents_path, *save_path, *out_path, *dtype_str;
    const char *prompts[3], *negatives[3];
    const char *skip_str, *image_path, *mask_path;
    /* --image given several times (an edit's image list, Diffusers' semantics:
     * output i edits image i % n_images, engine/pipeline/edit_images.h);
     * image_paths[0] is image_path */
    const char *image_paths[DITD_EDIT_MAX_IMAGES];
    int n_images, n_given;
    const char *last_image_path; /* image-to-video's last frame (FLF2V: Diffusers' last_image) */
    double strength, true_cfg, slg_scale, slg_start, slg_stop, guidance, guidance_2;
    long size_w, size_h, max_seq, frames, seed, steps, n, threads, comm_timeout_ms;
    int vae_tiling, save_frames, quiet;
    long max_area;               /* --max-area (a reference row: Kontext's max_area) */
    int auto_resize;             /* --no-auto-resize: 0; -1 the row's (_auto_resize) */
    ditd_device device;
    ditd_cache_config cache_cfg; /* --cache (method none: off) */
    ditd_gen_lora_args la;
} ditd_gen_args;

/* argv into *a: 0 to run, -1 when the help was printed (exit 0), 2 when
 * refused (said on stderr). */
int ditd__gen_args_parse(int argc, char **argv, ditd_gen_args *a);

/* "ditd generate: WHAT: error: detail" on stderr; returns 1. */
int ditd__gen_fail(const char *what, int err);
/* The leader: writes n clips of F frames (n, F, H, W, 3) as OUT.mp4
 * (OUT-i.mp4 for n > 1) and/or PNG frames OUT-000.png ... (OUT-i-000.png)
 * (mp4, save_frames as -o and --save-frames say). 0 or 1 (said). */
int ditd__gen_write_clips(const uint8_t *vid, int n, int F, int H, int W, const char *out_path,
                          int mp4, int save_frames, int fps, int quiet, long seed, int steps);

/* Reads and decodes an image file (PNG, JPEG, WebP; at most
 * DITD_IMAGE_MAX_BYTES_DEFAULT bytes, the upload limits) into *img (the
 * caller frees: ditd_image_free); channels 3: an RGBA image keeps its
 * color, as PIL's convert("RGB"), else as decoded. 0, or the error with its
 * detail. */
int ditd__gen_read_image(const char *path, int channels, ditd_image *img);
/* img (RGB, or RGBA as decoded) replaced by its RGB at w x h as PIL's
 * Image.resize((w, h), LANCZOS) then convert("RGB") (RGBA resized
 * premultiplied; engine/core/image_resize.h), the order Diffusers'
 * processors run; the same size only drops alpha. Sizes over the resize
 * limits refused before allocating. */
int ditd__gen_resize_image(ditd_image *img, int w, int h);

/* FluxKontextPipeline's reference at w x h (ditd_pipeline_class_reference_size):
 * VaeImageProcessor.resize then preprocess. *out NULL and 0 when the image is
 * at that size already (PIL's resize to its own size is a copy: use its own
 * pixels, RGB). Otherwise *out = the w x h RGB pixels (malloc'd, the caller
 * frees it): PIL's Lanczos (engine/core/image_resize.h; RGBA resized
 * premultiplied, then its color), or an RGBA image's color at its size.
 * DITD_EINVAL for sizes over the resize limits or another channel count. */
int ditd__gen_reference_pixels(const ditd_image *img, int w, int h, uint8_t **out);

#endif
