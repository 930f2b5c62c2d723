/* Opening a replica: the one way `ditd serve`'s worker, `ditd generate` and
 * `ditd bench` turn a model folder into what runs it.
 *
 * What it is: the device's backend (on CUDA this rank's GPU, and a group's
 * collectives moved to NCCL), the model folder (engine/models/model.h), the
 * denoiser's ops table by its weights' dtype, the denoising pipeline on the
 * group (engine/pipeline/pipeline.h), the tail that decodes its latents on
 * the whole group (latent_image.h for images, latent_video.h for clips),
 * for an image-to-video row its image condition on every rank
 * (image_cond.h) and, for a text model, the prompt encoders on one rank of
 * the group (prompt_encoder.h). Each component's config.json is parsed once for all
 * of it (engine/io/json_config.h keeps the parsed files).
 * What it is not: the batch loop (worker.h), the command lines, LoRA
 * adapters (the caller's: they name files the folder does not).
 *
 * Collective over opts->mesh: every rank calls ditd_replica_open and every
 * rank returns, whatever failed on it (the NCCL switch is agreed first);
 * the ranks' outcomes may differ, and the caller agrees on them as its
 * loop does. */
#ifndef DITD_ENGINE_REPLICA_H
#define DITD_ENGINE_REPLICA_H

#include "engine/backend/backend.h"
#include "engine/models/model.h"
#include "engine/parallel/mesh.h"
#include "engine/pipeline/image_cond.h"
#include "engine/pipeline/latent_image.h"
#include "engine/pipeline/latent_video.h"
#include "engine/pipeline/pipeline.h"
#include "engine/pipeline/prompt_encoder.h"

/* What to decode with: none (latents only), or the folder's VAE on the
 * whole group (a pixel-space model needs none either way). */
enum { DITD_REPLICA_NO_DECODE = 0, DITD_REPLICA_DECODE = 1 };

typedef struct ditd_replica_opts {
    const char *model_dir;   /* borrowed for the call */
    /* weights files for transformer/ and text_encoder_2/ (NULL: the
     * folder's; ditd_model_info_set_files), borrowed for the call */
    const char *transformer_file, *text_encoder_2_file;
    ditd_device device;      /* CUDA: this rank's GPU (ditd_backend_open) */
    const char *dtype;       /* the denoiser's weights: "auto" (NULL), "f32", "bf16" */
    int max_samples;         /* samples per batch (the pipeline's max) */
    ditd_mesh *mesh;         /* the group, borrowed; NULL: one rank */
    int comm_timeout_ms;     /* NCCL watchdog per collective; <= 0: the default */
    int decode;              /* DITD_REPLICA_NO_DECODE / DITD_REPLICA_DECODE */
    int vae_tiling;          /* image VAEs: Diffusers' enable_tiling (video: refused) */
    int video_h, video_w;    /* video: the largest latent size decoded (0: the folder's max) */
    int text;                /* a text model: open its prompt encoders on text_rank */
    int text_rank;           /* the group rank of the encoders (0: the leader) */
    ditd_prompt_encoder_opts text_opts; /* max_sequence_length <= 0: the folder's longest */
} ditd_replica_opts;

typedef struct ditd_replica {
    ditd_model_info info;
    int have_info;
    const ditd_backend_ops *ops;  /* the device's table (borrowed) */
    const ditd_backend_ops *wops; /* the denoiser's: ops for its weights' dtype */
    ditd_pipeline *pipe;
    ditd_latent_image *li;        /* an image model's VAE tail (decode asked), else NULL */
    ditd_latent_video *lv;        /* a video model's (decode asked), else NULL */
    ditd_prompt_encoder *penc;    /* on the text rank of a text model (text asked), else NULL */
    /* an image-to-video row's image condition (WanImageToVideoPipeline: the
     * VAE encoder and, with an image branch, the CLIP vision tower), on
     * every rank's CPU backend, planned for clips up to video_w x video_h
     * latents (the folder's max_size without them); else NULL */
    ditd_image_cond *ic;
} ditd_replica;

/* Opens *r (zeroed first) as opts says: ditd_replica_begin, then
 * ditd_replica_load. 0, or the first error with its detail (naming the
 * component, the file or the option); what was opened stays in *r for
 * ditd_replica_close. */
int ditd_replica_open(const ditd_replica_opts *opts, ditd_replica *r);
/* The two halves, for a caller that checks its own options against the
 * folder before any weight is read (`ditd generate`): begin zeroes *r and
 * opens the device and the folder (r->ops, r->info: cheap); load reads the
 * weights (r->wops, r->pipe, r->li / r->lv, r->ic, r->penc) with opts as they are
 * then (the caller may fill in decode, video_h/w, text_opts after begin). */
int ditd_replica_begin(const ditd_replica_opts *opts, ditd_replica *r);
int ditd_replica_load(const ditd_replica_opts *opts, ditd_replica *r);
/* Frees what ditd_replica_open made; *r may be partly open or zero. */
void ditd_replica_close(ditd_replica *r);

#endif
