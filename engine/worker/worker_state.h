/* The worker's internals, shared by its files (not a public header:
 * engine/worker/worker.h is):
 *   worker_msg.c   its messages to the front-end, and those that come mid-batch;
 *   worker_text.c  a text model's prompts, encoded once on the text rank;
 *   worker_lora.c  LoRA adapters: loaded at start, per-sample sets;
 *   worker_batch.c a batch: its check, sizes, buffers, the step callback
 *                  (progress, previews, cancels), the run and its Result;
 *   worker.c       the group's word, the leader's and followers' loops, start-up.
 * Each uses only those before it in this list (no circle). */
#ifndef DITD_ENGINE_WORKER_INTERNAL_H
#define DITD_ENGINE_WORKER_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "engine/core/clock.h"
#include "engine/models/lora.h"
#include "engine/pipeline/step_cache.h"
#include "engine/worker/replica.h"
#include "engine/worker/worker.h"
#include "proto/ditd.pb-c.h"

typedef struct pending {
    struct pending *next;
    uint8_t *buf;
    size_t len;
} pending;

/* The leader's word to its group, broadcast lazily (the group may wait
 * long for it): a batch follows as a variable-length broadcast of the
 * packed Envelope, or the loop ends. */
enum { GROUP_BATCH = 1, GROUP_SHUTDOWN = 2 };
typedef struct group_hdr {
    uint32_t kind;
    uint32_t pad;
    uint64_t len;   /* GROUP_BATCH: bytes of the Envelope that follows */
} group_hdr;
#define GROUP_NAP_US 200

typedef struct ditd__worker {
    const ditd_worker_config *cfg;
    ditd_transport *t;     /* the leader's; NULL on a follower */
    const ditd_mesh *mesh; /* NULL or a group of one: no group messages */
    int leader;
    ditd_replica rep;      /* the model, its pipeline, tail and encoders (replica.h) */
    ditd_cache_config cache_cfg; /* the running batch's step caching (method none: off) */
    /* a text model: every rank's embeddings of the running batch: prompt i at te[i], its
     * negative at te[max_batch + i] (the encoders: rep.penc, on the text rank) */
    int text_rank;         /* group rank of the encoders */
    int Dt, Dp;
    float *emb;            /* (2 max_batch, text_len(Lmax) Dt + Dp) */
    ditd_text_embeds *te;  /* (2 max_batch) */
    ditd_prompt_stats pstats; /* the text rank's, as its last broadcast said (leader) */
    /* LoRA adapters (cfg->loras), on the denoiser's device; the leader keeps
     * the files' host copies until its Adapters message is sent */
    int n_lora;
    ditd_lora_dev **lora_dev;
    ditd_lora **lora_host;
    ditd_lora_set lsets[DITD_WORKER_MAX_BATCH]; /* the running batch's, per sample */
    /* their text-encoder parts (engine/text/text_lora.h), on the text rank
     * only (rep.penc); text_lora[k] goes with lora_dev[k] */
    ditd_text_lora **text_lora;
    uint64_t hb_seq;
    double next_hb;
    bool stop, stop_now;
    pending *queued, **queued_tail; /* batches that came during a batch */
    /* the running batch */
    const Ditd__Batch *batch;
    ditd_gen_sample samples[DITD_WORKER_MAX_BATCH];
    uint8_t active[DITD_WORKER_MAX_BATCH];
    int partial_sent[DITD_WORKER_MAX_BATCH];
    double t_start, t_step;
    float *out;    /* max_batch latents of numel_lat (C h w) */
    float *img_lat;  /* edits (a row with img2img): max_batch input-image latents, or NULL */
    float *mask_lat; /* inpainting (a row with inpaint): max_batch masks on the latent grid */
    /* image-to-video (rep.ic): max_batch conditions of numel_cond and image
     * embeddings of numel_emb, grown with the clip size as out is */
    float *i2v_cond, *i2v_emb;
    size_t numel_cond, numel_emb, cap_cond;
    uint8_t *pix;  /* max_batch images of numel_img (H W C pixels), previews and results (leader) */
    size_t numel_lat, numel_img;   /* at the running batch's size */
    size_t cap_lat, cap_img;       /* what out and pix hold per sample */
    int img_w, img_h;              /* the running batch's image, pixels */
    int frames;                    /* a video model: the running batch's clip in pixel frames
                                    * (its images are (frames, H, W, C)); 0 for images */
    uint8_t *gbuf; /* a follower's copy of the batch Envelope */
    size_t gcap;
    int comm_err;  /* the transport failed */
    int group_err; /* the group cannot stay in step */
} ditd__worker;

static inline int ditd__worker_in_group(const ditd__worker *w)
{
    return w->mesh && w->mesh->size > 1;
}

/* worker_msg.c: messages to the front-end (the leader's; a follower says
 * nothing), and one that came while a batch runs (takes buf) */
int ditd__worker_send_env(ditd__worker *w, Ditd__Envelope *env);
void ditd__worker_heartbeat(ditd__worker *w, bool ready);
void ditd__worker_error(ditd__worker *w, uint64_t batch_id, int code, const char *msg);
void ditd__worker_handle_async(ditd__worker *w, uint8_t *buf, size_t len);

/* worker_batch.c */
int ditd__worker_batch_ok(ditd__worker *w, const Ditd__Batch *b);
int ditd__worker_plan_buffers(ditd__worker *w);
void ditd__worker_run_batch(ditd__worker *w, const Ditd__Batch *b);

/* worker_text.c */
int ditd__worker_text_init(ditd__worker *w);
int ditd__worker_encode_prompts(ditd__worker *w, const Ditd__Batch *b);
int ditd__worker_text_lora_init(ditd__worker *w);
void ditd__worker_text_lora_free(ditd__worker *w);

/* worker_lora.c */
int ditd__worker_lora_init(ditd__worker *w);
void ditd__worker_send_adapters(ditd__worker *w);
int ditd__worker_find_lora(const ditd__worker *w, const char *name);
int ditd__worker_set_loras(ditd__worker *w, int i, const Ditd__Sample *sm);

#endif
