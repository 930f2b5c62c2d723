/* The worker's internals, shared by its files (not a public header:
 * engine/worker/worker.h is):
 *   worker_msg.c   its messages to the front-end, those that come mid-batch, and
 *                  the group's agreement on an outcome;
 *   worker_text.c  a text model's prompts, encoded once on the text rank;
 *   worker_lora.c  LoRA adapters: the replica's table (loaded at start or by a
 *                  LoraOp), the device cache under --lora-cache-mb, per-sample sets;
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
 * long for it): a batch or a LoraOp follows as a variable-length broadcast
 * of the packed Envelope (GROUP_BATCH), or the loop ends. */
enum { GROUP_BATCH = 1, GROUP_SHUTDOWN = 2 };
typedef struct group_hdr {
    uint32_t kind;
    uint32_t pad;
    uint64_t len;   /* GROUP_BATCH: bytes of the Envelope that follows */
} group_hdr;
#define GROUP_NAP_US 200

/* One adapter of the replica's table. */
typedef struct ditd__wlora {
    char name[64];
    char *path;            /* owned: reloaded from here after an eviction */
    ditd_lora_dev *dev;    /* on the device, or NULL (evicted) */
    size_t bytes;          /* its device bytes (from its first load) */
    size_t cost;           /* what it counts against the budget: the same on every rank */
    uint64_t used;         /* lora_clock when a batch last used it (or it loaded) */
    ditd_lora *host;       /* the leader's host copy, until its modules are reported */
    ditd_text_lora *text;  /* its text-encoder part, on the text rank (rep.penc); kept while
                            * it is known (host memory, the encoders' CPU) */
} ditd__wlora;

/* A cache event for the front-end (proto LoraEvent). */
typedef struct ditd__lora_ev {
    char name[64];
    uint32_t kind;         /* DITD__LORA_EV_* */
    uint64_t bytes;
} ditd__lora_ev;
enum { DITD__LORA_EV_LOAD = 1, DITD__LORA_EV_HIT, DITD__LORA_EV_MISS, DITD__LORA_EV_EVICT,
       DITD__LORA_EV_UNLOAD };
#define DITD__LORA_EVENTS 256

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
    /* LoRA adapters the replica knows (cfg->loras, then LoraOps), in the
     * same order on every rank; each on the denoiser's device or evicted
     * (worker_lora.c). Every rank makes the same cache decisions from the
     * same messages, so the group agrees on what is resident. */
    int n_lora;
    ditd__wlora *lora;          /* (DITD_WORKER_MAX_LORAS) */
    size_t lora_budget;         /* --lora-cache-mb in bytes; 0: no limit */
    size_t lora_resident;       /* the resident adapters' costs (bytes; ditd__wlora.cost) */
    uint64_t lora_clock;        /* ticks once per batch or load: the LRU's order */
    ditd__lora_ev *lev;         /* (DITD__LORA_EVENTS) events not yet sent (leader) */
    int n_lev;
    ditd_lora_set lsets[DITD_WORKER_MAX_BATCH]; /* the running batch's, per sample */
    uint64_t hb_seq;
    double next_hb;
    bool stop, stop_now;
    pending *queued, **queued_tail; /* batches that came during a batch */
    /* the running batch */
    const Ditd__Batch *batch;
    ditd_gen_sample samples[DITD_WORKER_MAX_BATCH];
    uint8_t active[DITD_WORKER_MAX_BATCH];
    int partial_sent[DITD_WORKER_MAX_BATCH]; /* previews sent per sample (a latent model's: on
                                              * every rank, which all decode them) */
    /* a latent model's batch that wants previews: the step's progress waits
     * for the preview hook (on_preview), which sends it with the previews */
    int latent_previews;
    double pend_step_ms;
    double t_start, t_step;
    float *out;    /* max_batch latents of numel_lat (C h w) */
    float *img_lat;  /* edits (a row with img2img): max_batch input-image latents, or NULL */
    float *mask_lat; /* inpainting (a row with inpaint): max_batch masks on the latent grid */
    float *x0_keep;  /* inpainting: max_batch previews' latents, x0 with the kept region the
                      * image's (on_preview), planned with mask_lat */
    float *ref_lat;  /* a reference row (Kontext): max_batch reference latents, grown to cap_ref */
    size_t cap_ref;
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
void ditd__worker_lora_done(ditd__worker *w, uint64_t op_id, int code, const char *msg,
                            Ditd__LoraInfo *info);
void ditd__worker_handle_async(ditd__worker *w, uint8_t *buf, size_t len);
/* Every rank of the group (collective): whether every rank's err is 0.
 * Returns err, or on a rank that succeeded DITD_EUNAVAIL naming the ranks
 * that failed (msg gets that sentence). A group of one returns err. */
int ditd__worker_group_agree(ditd__worker *w, int err, char *msg, size_t cap);

/* worker_batch.c */
int ditd__worker_batch_ok(ditd__worker *w, const Ditd__Batch *b);
int ditd__worker_plan_buffers(ditd__worker *w);
void ditd__worker_run_batch(ditd__worker *w, const Ditd__Batch *b);

/* worker_text.c */
int ditd__worker_text_init(ditd__worker *w);
int ditd__worker_encode_prompts(ditd__worker *w, const Ditd__Batch *b);

/* worker_lora.c */
int ditd__worker_lora_init(ditd__worker *w);
void ditd__worker_lora_free(ditd__worker *w);
void ditd__worker_send_adapters(ditd__worker *w);
void ditd__worker_lora_flush(ditd__worker *w);
int ditd__worker_find_lora(const ditd__worker *w, const char *name);
int ditd__worker_lora_prepare(ditd__worker *w, const Ditd__Batch *b);
int ditd__worker_set_loras(ditd__worker *w, int i, const Ditd__Sample *sm);
void ditd__worker_lora_op(ditd__worker *w, const Ditd__LoraOp *op);

#endif
