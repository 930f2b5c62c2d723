/* LoRA adapters on a replica: loaded on every rank at start, announced by
 * the leader, and each sample's set (worker_state.h). */
#include "engine/worker/worker_state.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/error.h"

/* The index of the loaded adapter called name, or -1. */
int ditd__worker_find_lora(const ditd__worker *w, const char *name)
{
    for (int k = 0; k < w->n_lora; k++)
        if (!strcmp(w->lora_dev[k]->name, name))
            return k;
    return -1;
}

/* Every rank: sample i's adapter set from its message (batch_ok checked
 * the names on the leader; the group runs the same bytes). */
int ditd__worker_set_loras(ditd__worker *w, int i, const Ditd__Sample *sm)
{
    ditd_lora_set *ls = &w->lsets[i];
    ls->n = 0;
    w->samples[i].loras = NULL;
    if (!sm->n_lora_names)
        return 0;
    if (sm->n_lora_names != sm->n_lora_scales || sm->n_lora_names > DITD_LORA_MAX_SET)
        return ditd_err_set(DITD_EINVAL, "sample %d: LoRA names and scales do not pair", i);
    for (size_t k = 0; k < sm->n_lora_names; k++) {
        int a = ditd__worker_find_lora(w, sm->lora_names[k]);
        if (a < 0)
            return ditd_err_set(DITD_EINVAL, "sample %d: LoRA adapter '%.64s' is not loaded", i,
                                sm->lora_names[k]);
        ls->ad[ls->n] = w->lora_dev[a];
        ls->weight[ls->n++] = sm->lora_scales[k];
    }
    w->samples[i].loras = ls;
    return 0;
}

/* Every rank: reads and uploads cfg->loras for the denoiser. The leader
 * keeps the host copies for its Adapters message. A file that does not
 * load is named, with the loader's reason. */
int ditd__worker_lora_init(ditd__worker *w)
{
    const ditd_worker_config *cfg = w->cfg;
    const ditd_denoiser *den = w->rep.pipe->den;
    int err;
    if (cfg->n_loras <= 0)
        return 0;
    if (den->n_lora_targets <= 0)
        return ditd_err_set(DITD_EUNSUPPORTED, "--lora %s=%s: %s", cfg->loras[0].name,
                            cfg->loras[0].path, den->lora_refusal);
    w->lora_dev = calloc((size_t)cfg->n_loras, sizeof *w->lora_dev);
    w->lora_host = calloc((size_t)cfg->n_loras, sizeof *w->lora_host);
    if (!w->lora_dev || !w->lora_host)
        return ditd_err_set(DITD_ENOMEM, "%d LoRA adapters", cfg->n_loras);
    for (int i = 0; i < cfg->n_loras; i++) {
        ditd_lora *l = NULL;
        ditd_lora_dev *d = NULL;
        /* a text model's text-encoder tensors are worker_text.c's */
        if ((err = (w->rep.info.shapes.cond.kind == DITD_COND_TEXT ? ditd_lora_open_transformer
                                                                   : ditd_lora_open)(
                 cfg->loras[i].path, cfg->loras[i].name, den->lora_targets, den->n_lora_targets,
                 &l)) ||
            (err = ditd_lora_dev_new(l, w->rep.pipe->ops, den->lora_targets, den->n_lora_targets,
                                     &d))) {
            char why[768];
            snprintf(why, sizeof why, "%s", ditd_err_detail());
            ditd_lora_free(l);
            return ditd_err_set(err, "--lora %s=%s: %s", cfg->loras[i].name, cfg->loras[i].path,
                                why);
        }
        w->lora_dev[w->n_lora++] = d;
        if (w->leader)
            w->lora_host[i] = l;
        else
            ditd_lora_free(l);
    }
    return 0;
}

/* The leader, once after start-up: what it loaded, for GET /v1/loras;
 * then the host copies go. */
void ditd__worker_send_adapters(ditd__worker *w)
{
    const ditd_denoiser *den = w->rep.pipe->den;
    Ditd__Envelope env = DITD__ENVELOPE__INIT;
    Ditd__Adapters am = DITD__ADAPTERS__INIT;
    Ditd__LoraInfo *li = calloc((size_t)w->n_lora + 1, sizeof *li);
    Ditd__LoraInfo **lip = calloc((size_t)w->n_lora + 1, sizeof *lip);
    char ***mods = calloc((size_t)w->n_lora + 1, sizeof *mods);
    uint32_t **ranks = calloc((size_t)w->n_lora + 1, sizeof *ranks);
    int ok = li && lip && mods && ranks;
    for (int i = 0; ok && i < w->n_lora; i++) {
        const ditd_lora *l = w->lora_host[i];
        ditd__lora_info__init(&li[i]);
        li[i].name = w->lora_dev[i]->name;
        li[i].bytes = w->lora_dev[i]->bytes;
        lip[i] = &li[i];
        if (!l)
            continue;
        li[i].format = (uint32_t)l->format;
        li[i].max_rank = (uint32_t)l->max_rank;
        mods[i] = calloc((size_t)l->n_mod + 1, sizeof *mods[i]);
        ranks[i] = calloc((size_t)l->n_mod + 1, sizeof *ranks[i]);
        if (!mods[i] || !ranks[i]) {
            ok = 0;
            break;
        }
        for (int k = 0; k < l->n_mod; k++) {
            mods[i][k] = (char *)den->lora_targets[l->mod[k].target].name;
            ranks[i][k] = (uint32_t)l->mod[k].rank;
        }
        li[i].n_modules = li[i].n_ranks = (size_t)l->n_mod;
        li[i].modules = mods[i];
        li[i].ranks = ranks[i];
    }
    if (ok) {
        am.n_loras = (size_t)w->n_lora;
        am.loras = lip;
        env.msg_case = DITD__ENVELOPE__MSG_ADAPTERS;
        env.adapters = &am;
        ditd__worker_send_env(w, &env);
    }
    for (int i = 0; i < w->n_lora; i++) {
        if (mods)
            free(mods[i]);
        if (ranks)
            free(ranks[i]);
        ditd_lora_free(w->lora_host[i]);
        w->lora_host[i] = NULL;
    }
    free(mods);
    free(ranks);
    free(lip);
    free(li);
}
