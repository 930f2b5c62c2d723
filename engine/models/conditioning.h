/* Conditioning: what a denoiser is conditioned on, besides x and t.
 *
 * Two nouns. A ditd_cond_input is one sample's conditioning as the request
 * gave it: a class id (class-conditional families: DiT), or text embeddings
 * (text-conditional families: FLUX, SD3; made by engine/text, borrowed
 * here). A ditd_cond is one forward batch's conditioning, B rows, planned
 * once for max_rows and filled row by row by the pipeline.
 *
 * Guidance takes its unconditional input from here too: ditd_cond_set_row
 * with uncond = 1 writes the null class (class families) or the negative
 * prompt's embedding (text families), so the pipeline never knows which
 * kind of conditioning a family takes.
 *
 * What it is not: no text encoder, no tokenizer, no model; the family
 * (engine/models/denoiser.h) reads the rows it needs in its forward.
 */
#ifndef DITD_ENGINE_CONDITIONING_H
#define DITD_ENGINE_CONDITIONING_H

#include <stddef.h>
#include <stdint.h>

typedef enum ditd_cond_kind {
    DITD_COND_CLASS = 0, /* "class": a class id; the null class K for guidance */
    DITD_COND_TEXT,      /* "text": sequence + pooled embedding + mask; the negative prompt's */
} ditd_cond_kind;
#define DITD_COND_KIND_COUNT 2

const char *ditd_cond_kind_name(ditd_cond_kind k);
int ditd_cond_kind_from_str(const char *s, ditd_cond_kind *out);

/* What a family says about its conditioning (part of its shapes). */
typedef struct ditd_cond_shape {
    ditd_cond_kind kind;
    int num_classes;     /* class: K; ids 0..K-1, K is the null class */
    int text_len;        /* text: L tokens of the sequence embedding */
    int text_dim;        /* text: Dt */
    int pooled_dim;      /* text: Dp of the pooled vector (0: none) */
    int image_len;       /* image embeddings a row must carry (ditd_cond.image): tokens and */
    int image_dim;       /* width (Wan 2.1 I2V: the CLIP hidden states); 0: none */
} ditd_cond_shape;

/* One prompt's embeddings, host f32, borrowed (engine/text makes them). */
typedef struct ditd_text_embeds {
    const float *seq;     /* (L, Dt) */
    const uint8_t *mask;  /* (L), 1 = real token; NULL = every token is */
    const float *pooled;  /* (Dp); NULL when the family has no pooled vector */
} ditd_text_embeds;

/* One sample's conditioning. */
typedef struct ditd_cond_input {
    int64_t class_id;                 /* class: 0..K-1 */
    const ditd_text_embeds *prompt;   /* text: the prompt */
    const ditd_text_embeds *negative; /* text: the unconditional input of guidance */
} ditd_cond_input;

/* A forward batch's conditioning: row r belongs to forward row r. */
typedef struct ditd_cond {
    ditd_cond_shape shape;
    int max_rows;
    int64_t *class_ids;  /* (B) class: 0..K (K = null) */
    float *text;         /* (B, L, Dt) text */
    uint8_t *mask;       /* (B, L) text */
    float *pooled;       /* (B, Dp) text, when Dp > 0 */
    float *guidance;     /* (B) guidance_scale per row, for families that embed it */
    /* Skip-layer guidance (SD3: StableDiffusion3Pipeline's skip_guidance_layers
     * call the transformer with skip_layers=[...]): the block indices this
     * forward call skips, for every row of it. Borrowed, set by the caller
     * around the one forward it applies to (the pipeline, only for a
     * pipeline row with DITD_REQ_SKIP_LAYERS); NULL / 0 = none (what
     * ditd_cond_init leaves). Families without such layers ignore it. */
    const int *skip_layers;
    int n_skip_layers;
    /* Per-latent-frame timesteps, borrowed (the pipeline's; NULL by default:
     * the forward's t (B) per row). Wan 2.2 TI2V-5B's expand_timesteps:
     * WanPipeline / WanImageToVideoPipeline hand the transformer a (B, seq)
     * timestep, mask * t per token, and their mask is constant over each
     * latent frame (all ones, or the conditioning first frame at 0), so a
     * row is t_frames[row * t_frames_n + f] for frame f; the family expands
     * it to its tokens. Only the Wan family reads it. */
    const float *t_frames; /* (B, t_frames_n) */
    int t_frames_n;        /* F, frames per row */
    /* Image embeddings, borrowed (NULL by default): the CLIP vision hidden
     * states Wan 2.1 image-to-video cross-attends (WanImageToVideoPipeline's
     * image_embeds; FLF2V: both images' tokens side by side). Only the Wan
     * family reads them. */
    const float *image;    /* (B, image_len, image_dim) */
    int image_len, image_dim;
} ditd_cond;

/* Plans host buffers for max_rows rows of `shape`. Owned: ditd_cond_free. */
int ditd_cond_init(ditd_cond *c, const ditd_cond_shape *shape, int max_rows);
void ditd_cond_free(ditd_cond *c);

/* Checks one sample's input against the shape: a class id in 0..K-1, a
 * prompt present for text. DITD_EINVAL naming what is wrong. */
int ditd_cond_check(const ditd_cond_shape *shape, const ditd_cond_input *in);

/* Row `row` := the sample's conditional input (uncond = 0) or its
 * unconditional one (uncond = 1: the null class K; the negative prompt's
 * embedding, which must then be given). 0, or DITD_EINVAL. */
int ditd_cond_set_row(ditd_cond *c, int row, const ditd_cond_input *in, int uncond);

/* A borrowed view of rows [r0, max_rows) (cfg parallel runs a half). */
ditd_cond ditd_cond_view(const ditd_cond *c, int r0);

#endif
