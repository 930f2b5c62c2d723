/* transformers CLIPTextModel / CLIPTextModelWithProjection forward. */
#include "engine/text/clip_text.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/error.h"
#include "engine/text/clip_layers.h"
#include "engine/text/text_weights.h"
#include "kernels/cpu/text_kernels.h"

struct ditd_clip_text {
    ditd_clip_text_config cfg;
    int with_proj;
    const ditd_backend_ops *ops;
    int max_batch, max_tokens;
    ditd_text_weights w;
    const char *prefix;          /* "text_model." or "" */

    ditd_text_mat tok;           /* (V, D) */
    void *pos;                   /* (max_positions, D) */
    ditd__clip_layer *layers;
    void *lnf_g, *lnf_b;         /* (D) */
    ditd_text_mat proj;          /* (P, D) */

    /* activations (B, N, ...) for max_batch x max_tokens */
    ditd__clip_bufs b;
    void *pool, *pooled_proj;
    uint8_t *keep;               /* (B, N) */

    /* LoRA (engine/text/text_lora.h): the linears adapters may target, 6
     * per layer then text_projection; the scratch of ditd_lora_apply */
    ditd_lora_target *targets;
    int n_targets;
    float *lora_tmp;
    size_t lora_tmp_floats;
};

const ditd_lora_target *ditd_clip_text_lora_targets(const ditd_clip_text *m, int *n)
{
    *n = m->n_targets;
    return m->targets;
}

const ditd_clip_text_config *ditd_clip_text_config_of(const ditd_clip_text *m)
{
    return &m->cfg;
}

int ditd_clip_text_has_projection(const ditd_clip_text *m)
{
    return m->with_proj;
}

size_t ditd_clip_text_borrowed_bytes(const ditd_clip_text *m)
{
    return m->w.borrowed_bytes;
}

size_t ditd_clip_text_arena_bytes(const ditd_clip_text *m)
{
    return m->w.arena.size;
}

/* One pass over every tensor and buffer (plan, then carve). */
static int walk(ditd_clip_text *m)
{
    const ditd_clip_text_config *c = &m->cfg;
    ditd_text_weights *w = &m->w;
    int64_t D = c->hidden_size, F = c->intermediate_size;
    size_t BN = (size_t)m->max_batch * (size_t)m->max_tokens;
    char name[256];
    int err;

#define N_(...) (snprintf(name, sizeof name, __VA_ARGS__), name)
#define MAT(dst, r, cc, ...)                                                   \
    if ((err = ditd_text_weights_mat(w, &(dst), N_(__VA_ARGS__), (r), (cc)))) \
    return err
#define SMALL(dst, d0, d1, ...)                                                   \
    if ((err = ditd_text_weights_small(w, &(dst), N_(__VA_ARGS__), (d0), (d1)))) \
    return err
    const char *p = m->prefix;
    MAT(m->tok, c->vocab_size, D, "%sembeddings.token_embedding.weight", p);
    SMALL(m->pos, c->max_positions, D, "%sembeddings.position_embedding.weight", p);
    for (int l = 0; l < c->num_layers; l++)
        if ((err = ditd__clip_layer_walk(w, &m->layers[l], p, l, D, F)))
            return err;
    SMALL(m->lnf_g, D, 0, "%sfinal_layer_norm.weight", p);
    SMALL(m->lnf_b, D, 0, "%sfinal_layer_norm.bias", p);
    if (m->with_proj)
        MAT(m->proj, c->projection_dim, D, "text_projection.weight");
#undef MAT
#undef SMALL
#undef N_
    if ((err = ditd__clip_bufs_carve(w, &m->b, BN, m->max_tokens, D, F, 0)) ||
        (err = ditd_text_weights_carve(w, &m->pool, (size_t)m->max_batch * D, 0)) ||
        (err = ditd_text_weights_carve(w, &m->pooled_proj,
                                       (size_t)m->max_batch * (size_t)c->projection_dim, 0)) ||
        (err = ditd_text_weights_carve(w, (void **)&m->keep, BN, 1)) ||
        (err = ditd_text_weights_carve(w, (void **)&m->lora_tmp,
                                       m->lora_tmp_floats * sizeof(float), 1)))
        return err;
    return 0;
}

int ditd_clip_text_new(const char *dir, const char *class_hint, const ditd_backend_ops *ops,
                       int max_batch, int max_tokens, ditd_clip_text **out)
{
    char path[4096];
    ditd_text_config tc;
    ditd_clip_text *m;
    int err;

    if (!ops->linear_wt || !ops->embedding_wt || !ops->layernorm_affine ||
        !ops->attention_masked)
        return ditd_err_set(DITD_EUNSUPPORTED, "the %s backend has no text-encoder ops", ops->name);
    snprintf(path, sizeof path, "%s/config.json", dir);
    if ((err = ditd_text_config_load(path, class_hint, &tc)))
        return err;
    if (tc.arch == DITD_TEXT_T5 || tc.arch == DITD_TEXT_UMT5)
        return ditd_err_set(DITD_EINVAL, "%s: a %s, not a CLIP text model", path,
                            ditd_text_arch_name(tc.arch));
    if (max_tokens == 0)
        max_tokens = tc.clip.max_positions;
    if (max_batch <= 0 || max_batch > 4096 || max_tokens <= 0 ||
        max_tokens > tc.clip.max_positions || max_tokens > DITD_CPU_MASKED_ATTN_MAX_N)
        return ditd_err_set(DITD_EINVAL, "%s: batch %d x %d tokens (1..4096 x 1..%d)", dir,
                            max_batch, max_tokens, tc.clip.max_positions);
    m = calloc(1, sizeof *m);
    if (!m)
        return ditd_err_set(DITD_ENOMEM, "CLIP text model");
    m->cfg = tc.clip;
    m->with_proj = tc.arch == DITD_TEXT_CLIP_PROJ;
    m->ops = ops;
    m->max_batch = max_batch;
    m->max_tokens = max_tokens;
    m->layers = calloc((size_t)m->cfg.num_layers, sizeof *m->layers);
    m->n_targets = m->cfg.num_layers * DITD__CLIP_T_PER_LAYER + m->with_proj;
    m->targets = calloc((size_t)m->n_targets, sizeof *m->targets);
    m->lora_tmp_floats = ditd_lora_tmp_floats((size_t)max_batch * (size_t)max_tokens);
    if (!m->layers || !m->targets) {
        err = ditd_err_set(DITD_ENOMEM, "CLIP layers");
        goto fail;
    }
    if ((err = ditd_text_weights_open(&m->w, dir, ops)))
        goto fail;
    m->prefix = ditd_text_weights_has(&m->w, "text_model.embeddings.token_embedding.weight")
                    ? "text_model."
                    : "";
    if (m->with_proj && !*m->prefix) {
        err = ditd_err_set(DITD_EFORMAT,
                           "%s: CLIPTextModelWithProjection weights are named text_model.*, "
                           "this checkpoint has no text_model.embeddings.token_embedding.weight",
                           dir);
        goto fail;
    }
    if (!m->with_proj && ditd_text_weights_has(&m->w, "text_projection.weight")) {
        err = ditd_err_set(DITD_EFORMAT,
                           "%s: the checkpoint has text_projection.weight but the config says "
                           "CLIPTextModel (CLIPTextModelWithProjection?)",
                           dir);
        goto fail;
    }
    if ((err = walk(m)) || (err = ditd_text_weights_commit(&m->w)) || (err = walk(m)))
        goto fail;
    for (int l = 0; l < m->cfg.num_layers; l++)
        ditd__clip_layer_targets(&m->targets[l * DITD__CLIP_T_PER_LAYER], l, m->cfg.hidden_size,
                                 m->cfg.intermediate_size);
    if (m->with_proj) {
        ditd_lora_target *t = &m->targets[m->n_targets - 1];
        snprintf(t->name, sizeof t->name, "text_projection");
        t->n_out = m->cfg.projection_dim;
        t->k_in = m->cfg.hidden_size;
    }
    *out = m;
    return 0;
fail:
    ditd_clip_text_free(m);
    return err;
}

void ditd_clip_text_free(ditd_clip_text *m)
{
    if (!m)
        return;
    if (m->w.src)
        ditd_text_weights_free(&m->w);
    free(m->layers);
    free(m->targets);
    free(m);
}

int ditd_clip_text_encode(ditd_clip_text *m, int B, int N, const int64_t *ids,
                          const uint8_t *keep, const ditd_clip_text_out *out)
{
    return ditd_clip_text_encode_lora(m, B, N, ids, keep, NULL, out);
}

int ditd_clip_text_encode_lora(ditd_clip_text *m, int B, int N, const int64_t *ids,
                               const uint8_t *keep, const ditd_lora_set *const *loras,
                               const ditd_clip_text_out *out)
{
    const ditd_clip_text_config *c = &m->cfg;
    const ditd_backend_ops *ops = m->ops;
    const int D = c->hidden_size, F = c->intermediate_size, L = c->num_layers;
    const size_t BN = (size_t)B * (size_t)N;
    int hidx = out->hidden_index < 0 ? out->hidden_index + L + 1 : out->hidden_index;

    if (B <= 0 || B > m->max_batch || N <= 0 || N > m->max_tokens)
        return ditd_err_set(DITD_EINVAL, "CLIP encode: batch %d x %d tokens (at most %d x %d)", B,
                            N, m->max_batch, m->max_tokens);
    if (out->hidden && (hidx < 0 || hidx > L))
        return ditd_err_set(DITD_EINVAL, "CLIP encode: hidden_index %d (the model has %d hidden states)",
                            out->hidden_index, L + 1);
    if (out->text_embeds && !m->with_proj)
        return ditd_err_set(DITD_EINVAL, "CLIP encode: text_embeds asked of a CLIPTextModel (no projection)");
    for (size_t i = 0; i < BN; i++)
        if (ids[i] < 0 || ids[i] >= c->vocab_size)
            return ditd_err_set(DITD_ERANGE, "CLIP encode: token id %lld at [%zu, %zu] is outside the vocabulary (0..%d)",
                                (long long)ids[i], i / (size_t)N, i % (size_t)N, c->vocab_size - 1);
    if (keep)
        memcpy(m->keep, keep, BN);

    // embeddings: token + absolute position, (B, N, D)
    ops->embedding_wt(m->tok.p, m->tok.dt, ids, m->b.h, (int)BN, D);
    for (int b = 0; b < B; b++)
        ops->add(ditd_ptr_act(ops, m->b.h, (size_t)b * N * D), m->pos, (size_t)N * D);
    if (out->hidden && hidx == 0)
        ops->download(out->hidden, m->b.h, BN * D);

    const ditd_text_lora_run lo = {.sets = loras, .B = B, .rows = N, .tmp = m->lora_tmp,
                                   .tmp_floats = m->lora_tmp_floats};
    for (int l = 0; l < L; l++) {
        ditd__clip_layer_forward(ops, &m->layers[l], &m->b, B, N, D, F, c->num_heads, c->eps,
                                 c->act, keep ? m->keep : NULL, 1, &lo,
                                 l * DITD__CLIP_T_PER_LAYER);
        if (out->hidden && hidx == l + 1)
            ops->download(out->hidden, m->b.h, BN * D);
    }
    if (!out->last && !out->pooled && !out->text_embeds)
        return ops->status();

    // final LayerNorm: last_hidden_state (B, N, D)
    ops->layernorm_affine(m->b.h, m->b.xn, (int)BN, D, c->eps, m->lnf_g, m->lnf_b);
    if (out->last)
        ops->download(out->last, m->b.xn, BN * D);
    if (out->pooled || out->text_embeds) {
        // pooled (B, D): the end-of-text row of each sequence
        for (int b = 0; b < B; b++) {
            const int64_t *r = ids + (size_t)b * N;
            int at = 0;
            if (c->legacy_argmax) { /* torch argmax: the first largest id */
                for (int j = 1; j < N; j++)
                    if (r[j] > r[at])
                        at = j;
            } else { /* the first eos; none found: position 0, as argmax of zeros */
                for (int j = 0; j < N; j++)
                    if (r[j] == c->eos_token_id) {
                        at = j;
                        break;
                    }
            }
            ops->copy2d(ditd_ptr_act(ops, m->pool, (size_t)b * D), D,
                        ditd_ptr_act(ops, m->b.xn, ((size_t)b * N + at) * D), D, 1, (size_t)D);
        }
        if (out->pooled)
            ops->download(out->pooled, m->pool, (size_t)B * D);
        if (out->text_embeds) {
            int P = c->projection_dim;
            const ditd_text_lora_run lp = {.sets = loras, .B = B, .rows = 1, .tmp = m->lora_tmp,
                                           .tmp_floats = m->lora_tmp_floats};
            ditd_text_lora_linear(ops, &lp, L * DITD__CLIP_T_PER_LAYER, m->pool, D, &m->proj,
                                  NULL, m->pooled_proj, P, P, D, DITD_TEXT_ACT_NONE,
                                  m->b.scratch, m->b.scratch_elems);
            ops->download(out->text_embeds, m->pooled_proj, (size_t)B * P);
        }
    }
    return ops->status();
}
