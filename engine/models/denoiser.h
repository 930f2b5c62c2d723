/* The denoiser interface: what the pipeline, the worker and the server see
 * of a model family (the ggml_backend_i / stable-diffusion.cpp
 * DiffusionModel idea). Each family is one `static const
 * ditd_denoiser_family` table of function pointers, found by its Diffusers
 * `_class_name` in the registry (engine/models/registry.h):
 *
 *     DiTTransformer2DModel   engine/models/dit/dit_denoiser.c (class ids)
 *     FluxTransformer2DModel  engine/models/flux/flux_denoiser.c (text: joint
 *                             attention over a text prefix, RoPE, pooled
 *                             vector, guidance embedding; any latent size
 *                             through set_size)
 *     SD3Transformer2DModel   engine/models/sd3/sd3_denoiser.c (text: SD3 /
 *                             SD3.5's MMDiT, joint attention, pooled vector,
 *                             skip-layer guidance; any size through set_size)
 *     WanTransformer3DModel   engine/models/wan/wan_denoiser.c (video: text
 *                             cross-attention, 3-D RoPE; latents (C, F, h, w)
 *                             of any frame count and size through
 *                             set_video_size)
 *
 * A loaded model is a ditd_denoiser: the family's own struct, whose first
 * member is this base, so the pipeline holds a `ditd_denoiser *` and never
 * names a family. Latents only: a denoiser knows its latent shape, not the
 * image (the VAE's scale factor is the model folder's business,
 * engine/models/model.h).
 *
 * What it is not: no sampler, no guidance (engine/pipeline), no parallel
 * layout policy (the family takes a mesh and splits heads and tokens
 * through engine/parallel/cp_attention.h).
 */
#ifndef DITD_ENGINE_DENOISER_H
#define DITD_ENGINE_DENOISER_H

#include <stddef.h>

#include "engine/backend/backend.h"
#include "engine/models/conditioning.h"
#include "engine/models/lora.h"
#include "engine/parallel/mesh.h"

/* What a family reads from its config: enough to plan buffers, check a
 * parallel layout and validate requests, without loading weights. */
typedef struct ditd_denoiser_shapes {
    int in_channels;      /* C: latent channels of x */
    int out_channels;     /* Co: C, or 2C with a learned sigma (the pipeline keeps the first C),
                           * or fewer than C where x carries a condition concatenated on
                           * channels (Wan 2.2 I2V: C = 36, Co = 16) */
    int height, width;    /* latent size the model runs at (pixel-space model: the image) */
    int frames;           /* latent frames F of a video family (x is (B, C, F, h, w)); 0 or 1:
                           * an image (every image family leaves it 0) */
    int heads;            /* H attention heads (tp and ulysses split them) */
    int head_dim;         /* Dh of each head: what the backend's attention must take
                           * (ditd_backend_check_head_dim); 0 for a family with none */
    int tokens;           /* N image tokens at height x width (ring x ulysses split them) */
    int prefix_tokens;    /* tokens outside that split (FLUX's text tokens); 0 for DiT */
    int guidance_embed;   /* 1: the model takes guidance_scale as an input (FLUX.1-dev's
                           * distilled guidance): the pipeline runs no unconditional
                           * pass and fills cond.guidance; 0: classifier-free guidance */
    ditd_cond_shape cond; /* class ids or text embeddings */
    int latent_multiple;  /* a family with set_size: height and width must be multiples of
                           * this (FLUX's 2x2 packing: 2); 0: runs only at height x width */
    int ref_height, ref_width; /* reference latents (FluxKontextPipeline, set_reference): each
                           * row of x is its latents (C, h, w) followed by the reference's
                           * (C, ref_height, ref_width), whose tokens join the image stream
                           * after the latents' with their own positions; the output is the
                           * latents' alone. 0: no reference (x is the latents) */
} ditd_denoiser_shapes;

typedef struct ditd_denoiser ditd_denoiser;

/* ---- The step-caching seam (the pipeline layer's step cache implements it;
 * docs/caching.md) ----
 *
 * A family that supports caching calls these hooks from its forward when
 * d->cache is set (the pipeline sets it for a batch with a cache and
 * clears it after), so a cache can skip work the way Diffusers' hooks do:
 *
 *   blocks_begin(streams, &run)       before the first transformer block;
 *                                     run = 0: skip every block (MagCache:
 *                                     the cache wrote the streams)
 *   <block 0>
 *   first_block_done(streams, &run)   after the first block ("head");
 *                                     run = 0: skip the others (First
 *                                     Block Cache: the cache wrote them)
 *   <blocks 1 .. n-1>
 *   blocks_end(streams)               after the last block, only when the
 *                                     blocks ran
 *   <final layer, reading streams->img>
 *
 * and around each of its named modules (TaylorSeer; the family lists them
 * with module_name, Diffusers' module names, e.g. "transformer_blocks.3.attn1"):
 *
 *   module_begin(id, out, &predicted) predicted = 1: the cache wrote the
 *                                     module's output into out; do not run it
 *   <the module, writing out>         otherwise
 *   module_end(id, out)               after it ran
 *
 * A module that returns two streams (FLUX's and SD3's blocks and their
 * attention: image and text) or a strided one calls module_begin_parts /
 * module_end_parts instead, with its outputs as parts (ditd_cache_part);
 * the parts' elements per forward row add up to module_name's *elems.
 *
 * The streams are this rank's rows and tokens, in the family's activation
 * buffers; the cache may rewrite them in place. The hooks are collective
 * over the group when the cache needs a group decision: every rank of the
 * model calls them in the same order (they are called unconditionally at
 * those points, never inside rank-dependent branches). A hook's error is
 * returned by the forward as is. Families without these hooks leave
 * cache_blocks 0 and module_name NULL, and a cache refuses to start. */
typedef struct ditd_cache_streams {
    int B;          /* forward rows on this rank */
    void *img;      /* (B, n_img, D) image tokens: what the final layer reads */
    int n_img;      /* this rank's image tokens (cp split) */
    int tok0;       /* the first of them in the whole image */
    void *txt;      /* (B, n_txt, D) text tokens of a joint-attention family, or NULL */
    int n_txt;
    int D;
} ditd_cache_streams;

/* One output of a hooked module on this rank: per forward row b, `tokens`
 * rows of `cols` values, `ld` values apart, from ptr + b * tokens * ld. */
typedef struct ditd_cache_part {
    void *ptr;
    int tokens, cols;
    size_t ld;
} ditd_cache_part;

typedef struct ditd_denoiser_cache {
    void *ctx;
    int (*blocks_begin)(void *ctx, const ditd_cache_streams *s, int *run);
    int (*first_block_done)(void *ctx, const ditd_cache_streams *s, int *run);
    int (*blocks_end)(void *ctx, const ditd_cache_streams *s);
    /* out: (B, elems) for the module, elems per row as module_name gave */
    int (*module_begin)(void *ctx, int id, void *out, int *predicted);
    int (*module_end)(void *ctx, int id, const void *out);
    /* the same for a module of n (1..2) parts; a part of 0 tokens is empty */
    int (*module_begin_parts)(void *ctx, int id, const ditd_cache_part *parts, int n,
                              int *predicted);
    int (*module_end_parts)(void *ctx, int id, const ditd_cache_part *parts, int n);
} ditd_denoiser_cache;

typedef struct ditd_denoiser_family {
    const char *class_name; /* Diffusers _class_name of the component's config.json */
    /* Reads <dir>/config.json (dir: the component folder, e.g. transformer/)
     * into *out. Errors name the file, key and value. */
    int (*shapes)(const char *dir, ditd_denoiser_shapes *out);
    /* Loads the weights in dir for batches of up to max_batch rows, as one
     * rank of `mesh` (borrowed, outlives the model; NULL = one rank). A
     * layout the model cannot run is DITD_EINVAL on every rank alike,
     * before any collective. *out owned: ->free. */
    int (*load)(const char *dir, const ditd_backend_ops *ops, int max_batch,
                const ditd_mesh *mesh, ditd_denoiser **out);
    /* Optional: load's contract with the weights read from `weights` (a
     * .gguf or .safetensors file) instead of dir's own; dir still gives
     * config.json. NULL: the family reads its folder only. */
    int (*load_file)(const char *dir, const char *weights, const ditd_backend_ops *ops,
                     int max_batch, const ditd_mesh *mesh, ditd_denoiser **out);
    /* out (B, Co, h, w) = model(x (B, C, h, w), t (B), cond rows 0..B-1).
     * x and out are backend buffers; t and cond host memory. Allocates
     * nothing. Under a mesh: collective over the model's ranks, which pass
     * the same arguments and all get the whole out. Input errors are found
     * before any collective. */
    int (*forward)(ditd_denoiser *d, int B, const void *x, const float *t, const ditd_cond *cond,
                   void *out);
    void (*free)(ditd_denoiser *d);
    /* Optional; NULL for a family that runs only at the size its config
     * gives (DiT). Re-plans the model for latents (C, height, width) and
     * text_len text tokens (text families; others ignore it), keeping the
     * weights, and updates d->shapes. Allocates: between batches, never
     * inside one. Not collective: under a mesh every rank calls it with the
     * same sizes, and a size the layout cannot split is DITD_EINVAL on every
     * rank alike. */
    int (*set_size)(ditd_denoiser *d, int height, int width, int text_len);
    /* Optional; NULL for image families. A video family's set_size: re-plans
     * for latents (C, frames, height, width) and text_len text tokens, with
     * set_size's contract (set_size then keeps the frame count). */
    int (*set_video_size)(ditd_denoiser *d, int frames, int height, int width, int text_len);
    /* Optional (TaylorSeer): the name of module id (0 .. d->cache_modules - 1)
     * as Diffusers' named_modules() spells it, and its output's elements per
     * forward row on this rank (*elems; a module of parts: all its parts').
     * *elems 0: a module whose output the cache cannot hold: it may only be
     * skip-predicted, and when module_begin says predicted the family zeroes
     * its outputs itself. 0, or DITD_ERANGE past the last. */
    int (*module_name)(const ditd_denoiser *d, int id, char *buf, size_t cap, size_t *elems);
    /* Optional (FLUX): re-plans for reference latents of ref_height x ref_width
     * after the latents in every row of x (shapes.ref_height / ref_width; 0 x 0:
     * none), keeping the weights and the latent size, with set_size's contract.
     * NULL: the family takes no reference. */
    int (*set_reference)(ditd_denoiser *d, int ref_height, int ref_width);
} ditd_denoiser_family;

/* The base every family's model struct starts with. */
struct ditd_denoiser {
    const ditd_denoiser_family *family;
    ditd_denoiser_shapes shapes;
    int max_batch;
    /* step caching: set by the family at load (and set_size) */
    int cache_blocks;          /* transformer blocks the block hooks span; 0: no block hooks */
    int cache_modules;         /* modules module_name lists; 0: none */
    size_t cache_img_elems;    /* n_img * D of this rank: elements of one row of streams->img */
    /* set by the pipeline around a batch (borrowed); NULL: no caching */
    const ditd_denoiser_cache *cache;
    /* LoRA adapters (engine/models/lora.h, docs/lora.md): the linears an
     * adapter may target, set by the family at load (owned by it; 0
     * targets: this model takes no adapters, lora_refusal says why); and,
     * set by the pipeline around each forward (borrowed), the adapter set
     * of each forward row (B entries, a NULL entry: none); NULL: no row
     * carries one, the forward is exactly the base model's. */
    const ditd_lora_target *lora_targets;
    int n_lora_targets;
    const char *lora_refusal;
    const ditd_lora_set *const *loras;
};

/* The checks every family's shapes get (positive sizes, conditioning
 * consistent); `what` names the config in messages. DITD_EINVAL. */
int ditd_denoiser_shapes_check(const ditd_denoiser_shapes *s, const char *what);

/* Whether b (what: the config it came from) has a's shapes, field for field
 * (two experts of one pipeline must): 0, or DITD_EUNSUPPORTED naming the
 * first field that differs and both values. */
int ditd_denoiser_shapes_same(const ditd_denoiser_shapes *a, const ditd_denoiser_shapes *b,
                              const char *what);

/* Wrappers over the table, with the checks every family shares. */
int ditd_denoiser_load(const ditd_denoiser_family *f, const char *dir,
                       const ditd_backend_ops *ops, int max_batch, const ditd_mesh *mesh,
                       ditd_denoiser **out);
/* ditd_denoiser_load with the weights from file `weights` (NULL or "": dir's);
 * DITD_EUNSUPPORTED naming the class for a family without load_file. */
int ditd_denoiser_load_file(const ditd_denoiser_family *f, const char *dir, const char *weights,
                            const ditd_backend_ops *ops, int max_batch, const ditd_mesh *mesh,
                            ditd_denoiser **out);
int ditd_denoiser_forward(ditd_denoiser *d, int B, const void *x, const float *t,
                          const ditd_cond *cond, void *out);
void ditd_denoiser_free(ditd_denoiser *d);
/* The table's set_size; for a family without one, 0 when the size is the
 * model's already and DITD_EUNSUPPORTED naming the size it runs at
 * otherwise. The new shapes are checked (ditd_denoiser_shapes_check). */
int ditd_denoiser_set_size(ditd_denoiser *d, int height, int width, int text_len);
/* The table's set_video_size; for a family without one, frames <= 1 is
 * ditd_denoiser_set_size and more frames DITD_EUNSUPPORTED naming the
 * family. The new shapes are checked. */
int ditd_denoiser_set_video_size(ditd_denoiser *d, int frames, int height, int width,
                                 int text_len);

/* The table's set_reference; for a family without one, 0 x 0 is 0 and a
 * reference DITD_EUNSUPPORTED naming the family. The new shapes are checked. */
int ditd_denoiser_set_reference(ditd_denoiser *d, int ref_height, int ref_width);

/* Elements of one sample's input (C [F] h w) and output (Co [F] h w): F
 * counts when frames > 1. */
size_t ditd_denoiser_numel_in(const ditd_denoiser_shapes *s);
size_t ditd_denoiser_numel_out(const ditd_denoiser_shapes *s);

#endif
