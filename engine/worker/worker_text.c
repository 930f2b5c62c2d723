/* A text model's prompts: encoded once per batch on the text-encoder
 * rank, the embeddings broadcast to the group (worker_state.h). */
#include "engine/worker/worker_state.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/error.h"

/* What the text-encoder rank tells its group before the embeddings. */
typedef struct text_hdr {
    int32_t err;
    uint32_t pad;
    ditd_prompt_stats st;
    char msg[480];
} text_hdr;

/* Whether sample sm runs the unconditional pass on a negative prompt: the
 * pipeline row's rule. */
static int wants_negative(const ditd__worker *w, const Ditd__Sample *sm)
{
    return ditd_pipeline_class_needs_negative(w->rep.info.pipeline, sm->guidance, sm->true_cfg,
                                              sm->has_negative, w->rep.info.shapes.guidance_embed);
}

static const char *or_empty(const char *s)
{
    return s ? s : "";
}

/* The text rank: sample sm's text adapters and weights (its names were
 * checked on the leader; the group runs the same bytes). */
static int text_set(const ditd__worker *w, const Ditd__Sample *sm, ditd_text_lora_set *ts)
{
    ts->n = 0;
    if (!w->rep.penc || !sm->n_lora_names)
        return 0;
    if (sm->n_lora_names != sm->n_lora_scales || sm->n_lora_names > DITD_LORA_MAX_SET)
        return ditd_err_set(DITD_EINVAL, "LoRA names and scales do not pair");
    for (size_t k = 0; k < sm->n_lora_names; k++) {
        int a = ditd__worker_find_lora(w, sm->lora_names[k]);
        if (a < 0)
            return ditd_err_set(DITD_EINVAL, "LoRA adapter '%.64s' is not loaded",
                                sm->lora_names[k]);
        ts->ad[ts->n] = w->lora[a].text;
        ts->weight[ts->n++] = sm->lora_scales[k];
    }
    return 0;
}

/* Every rank: the batch's prompts (and the negative prompts of samples
 * whose unconditional pass runs) encoded once on the text-encoder rank,
 * broadcast to the group; sample i's cond points at them. An encoder's
 * error is every rank's (it travels in the header). */
int ditd__worker_encode_prompts(ditd__worker *w, const Ditd__Batch *b)
{
    const int n = (int)b->n_samples, L = (int)b->max_sequence_length;
    const int T = ditd_pipeline_class_text_len(w->rep.info.pipeline, L);
    const size_t one = (size_t)T * (size_t)w->Dt + (size_t)w->Dp;
    const int me = ditd__worker_in_group(w) ? w->mesh->rank : 0;
    text_hdr h;
    int err = 0;

    memset(&h, 0, sizeof h);
    if (me == w->text_rank) {
        for (int i = 0; i < n && !err; i++) {
            const Ditd__Sample *sm = b->samples[i];
            float *e = w->emb + (size_t)i * one, *ne = w->emb + (size_t)(n + i) * one;
            ditd_prompt_texts pt = {
                .texts = {or_empty(sm->prompt), or_empty(sm->prompt_2), or_empty(sm->prompt_3)}};
            ditd_prompt_texts nt = {.texts = {or_empty(sm->negative_prompt),
                                              or_empty(sm->negative_prompt_2),
                                              or_empty(sm->negative_prompt_3)}};
            for (int k = 0; k < 3; k++) {
                pt.lens[k] = strlen(pt.texts[k]);
                nt.lens[k] = strlen(nt.texts[k]);
            }
            /* each prompt with its own request's adapters (the negative too) */
            ditd_text_lora_set ts;
            err = text_set(w, sm, &ts);
            if (!err)
                err = ditd_prompt_encoder_encode_lora(w->rep.penc, &pt, L, &ts, e,
                                                      e + (size_t)T * w->Dt);
            if (!err && wants_negative(w, sm))
                err = ditd_prompt_encoder_encode_lora(w->rep.penc, &nt, L, &ts, ne,
                                                      ne + (size_t)T * w->Dt);
            if (!err && w->t && ditd_now_ms() >= w->next_hb) /* long encoders: stay alive */
                ditd__worker_heartbeat(w, true);
            if (err)
                snprintf(h.msg, sizeof h.msg, "sample %d: %s", i, ditd_err_detail());
        }
        h.err = err;
        ditd_prompt_encoder_stats(w->rep.penc, &h.st);
    }
    if (ditd__worker_in_group(w)) {
        ditd_comm *g = w->mesh->group;
        if ((err = ditd_comm_bcast(g, &h, sizeof h, w->text_rank)) ||
            (!h.err && (err = ditd_comm_bcast(g, w->emb, 2 * (size_t)n * one * sizeof(float),
                                              w->text_rank)))) {
            w->group_err = err;
            return err;
        }
    }
    w->pstats = h.st;
    if (h.err) {
        h.msg[sizeof h.msg - 1] = '\0';
        return ditd_err_set(h.err, "%s", h.msg);
    }
    for (int i = 0; i < n; i++) {
        float *e = w->emb + (size_t)i * one, *ne = w->emb + (size_t)(n + i) * one;
        w->te[i] = (ditd_text_embeds){.seq = e, .pooled = w->Dp ? e + (size_t)T * w->Dt : NULL};
        w->te[n + i] = (ditd_text_embeds){.seq = ne,
                                          .pooled = w->Dp ? ne + (size_t)T * w->Dt : NULL};
        w->samples[i].cond.prompt = &w->te[i];
        w->samples[i].cond.negative = wants_negative(w, b->samples[i]) ? &w->te[n + i] : NULL;
    }
    return 0;
}

/* A text model: every rank's embedding buffers (the encoders themselves
 * are the replica's, on the text-encoder rank: replica.h). The encoders'
 * widths are the transformer's. */
int ditd__worker_text_init(ditd__worker *w)
{
    const ditd_model_info *m = &w->rep.info;
    const size_t one =
        (size_t)ditd_pipeline_class_text_len(m->pipeline, m->max_sequence_length) *
            (size_t)m->shapes.cond.text_dim +
        (size_t)m->shapes.cond.pooled_dim;
    w->text_rank = w->cfg->text_encoder_rank; /* ditd_replica_open checked it */
    w->Dt = m->shapes.cond.text_dim;
    w->Dp = m->shapes.cond.pooled_dim;
    w->emb = malloc(2 * (size_t)w->cfg->max_batch * one * sizeof *w->emb);
    w->te = calloc(2 * (size_t)w->cfg->max_batch, sizeof *w->te);
    if (!w->emb || !w->te)
        return ditd_err_set(DITD_ENOMEM, "text embeddings for %d samples", w->cfg->max_batch);
    return 0;
}
