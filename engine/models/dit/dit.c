/* Diffusers DiTTransformer2DModel forward: patch embed, blocks, final layer. */
#include "engine/models/dit/dit.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/error.h"
#include "engine/core/philox.h"
#include "engine/io/weights.h"
#include "engine/models/weight_list.h"
#include "kernels/cpu/cpu_kernels.h"

#define TFREQ 256 /* E: Timesteps(num_channels=256) in CombinedTimestepLabelEmbeddings */
#define ADA_EPS 1e-6f /* AdaLayerNormZero's and norm_out's LayerNorm eps (fixed in Diffusers) */

/* ---- planning: the same carve sequence runs twice (count, then hand out) ---- */

static int carve(ditd_arena *a, void **p, ditd_dtype dt, size_t n)
{
    int err;
    *p = ditd_arena_bytes(a, n * ditd_dtype_size(dt), &err);
    return err;
}

/* The model's weight list (engine/models/weight_list.h), written once from
 * the config and this rank's tp plan, walked for planning, loading and
 * packing. tp: q, k, v and ff.net.0.proj column-parallel (this rank's heads
 * and MLP rows), to_out.0 and ff.net.2 row-parallel (the matching columns). */
static void weight_list(ditd_dit *m, ditd_wl *wl)
{
    const ditd_dit_config *c = &m->cfg;
    int64_t D = c->inner_dim, F = c->ff_dim, p = c->patch_size;
    int64_t K1 = (int64_t)c->num_embeds_ada_norm + 1, po = p * p * c->out_channels;
    int64_t Dh = c->head_dim, hcD = (int64_t)m->hc * Dh, h0D = (int64_t)m->h0 * Dh;
    int64_t Fl = m->fc, f0 = m->f0;
    const int P = DITD_WL_PACK;
    static const char *const qkv[3] = {"to_q", "to_k", "to_v"};
    char pre[160];

    /* a (D, C, p, p) conv weight: read by load_weights, never packed */
    ditd_wl_add(wl, DITD_WL_DENSE | DITD_WL_OWN_LOAD, D, c->in_channels * p * p, &m->patch_w,
                &m->patch_b, NULL, "pos_embed.proj");
    ditd_wl_add(wl, P, 2 * D, D, &m->out1_w, &m->out1_b, NULL, "proj_out_1");
    ditd_wl_add(wl, P, po, D, &m->out2_w, &m->out2_b, NULL, "proj_out_2");
    for (int l = 0; l < c->num_layers; l++) {
        ditd_dit_block *b = &m->blocks[l];
        ditd_wl_add(wl, P, D, TFREQ, &b->t1_w, &b->t1_b, NULL,
                    "transformer_blocks.%d.norm1.emb.timestep_embedder.linear_1", l);
        ditd_wl_add(wl, P, D, D, &b->t2_w, &b->t2_b, NULL,
                    "transformer_blocks.%d.norm1.emb.timestep_embedder.linear_2", l);
        /* LabelEmbedding keeps one extra row, the null class, for CFG; a
         * table (rows read by class id), no bias */
        ditd_wl_add(wl, DITD_WL_DENSE, K1, D, &b->cls, NULL, NULL,
                    "transformer_blocks.%d.norm1.emb.class_embedder.embedding_table", l);
        ditd_wl_add(wl, P, 6 * D, D, &b->ada_w, &b->ada_b, NULL,
                    "transformer_blocks.%d.norm1.linear", l);
        b->qkv_b = NULL;
        snprintf(pre, sizeof pre, "transformer_blocks.%d.attn1", l);
        ditd_wl_rows_of(ditd_wl_add_fused(wl, P, D, D, &b->qkv_w,
                                          c->attention_bias ? &b->qkv_b : NULL, NULL, pre, 3, qkv),
                        h0D, hcD);
        ditd_wl_cols_of(ditd_wl_add(wl, P, D, D, &b->o_w, &b->o_b, NULL,
                                    "transformer_blocks.%d.attn1.to_out.0", l),
                        1, &h0D, &hcD);
        ditd_wl_rows_of(ditd_wl_add(wl, P, F, D, &b->ff1_w, &b->ff1_b, NULL,
                                    "transformer_blocks.%d.ff.net.0.proj", l),
                        f0, Fl);
        ditd_wl_cols_of(ditd_wl_add(wl, P, D, F, &b->ff2_w, &b->ff2_b, NULL,
                                    "transformer_blocks.%d.ff.net.2", l),
                        1, &f0, &Fl);
    }
}

static int carve_weights(ditd_dit *m)
{
    int err1, err;
    if (!m->wl.n)
        weight_list(m, &m->wl);
    if ((err = ditd_wl_plan(&m->wl, &m->weights, m->ops, NULL)))
        return err;
    m->pos = ditd_arena_bytes(&m->weights,
                              (size_t)m->N * (size_t)m->cfg.inner_dim *
                                  ditd_dtype_size(m->ops->act_dtype),
                              &err1);
    return err1 ? DITD_ENOMEM : 0;
}

static int carve_acts(ditd_dit *m)
{
    const ditd_dit_config *c = &m->cfg;
    size_t B = (size_t)m->max_batch, N = (size_t)m->N, D = (size_t)c->inner_dim;
    size_t p = (size_t)c->patch_size, po = p * p * (size_t)c->out_channels;
    size_t Nl = (size_t)m->n_loc, Dh = (size_t)c->head_dim;
    size_t hcD = (size_t)m->hc * Dh;
    int U = m->lay.ulysses, R = m->lay.ring;
    ditd_dtype at = m->ops->act_dtype;
    ditd_arena *a = &m->acts;
    int err = 0;

    err |= carve(a, &m->h, at, B * Nl * D);
    err |= carve(a, &m->xn, at, B * Nl * D);
    err |= carve(a, &m->qkv, at, B * Nl * 3 * hcD);
    err |= carve(a, &m->att, at, B * Nl * hcD);
    err |= carve(a, &m->ff, at, B * Nl * (size_t)m->fc);
    err |= carve(a, &m->tfreq, at, B * TFREQ);
    err |= carve(a, &m->temb, at, B * D);
    err |= carve(a, &m->cond, at, B * D);
    err |= carve(a, &m->cond0, at, B * D);
    err |= carve(a, &m->mod, at, B * 6 * D);
    err |= carve(a, &m->scratch, at, B * N * (size_t)c->in_channels * p * p);
    err |= carve(a, &m->tok_out, at, B * N * po);
    if (R * U > 1) { /* the split and gather around the token-wise layers */
        err |= carve(a, &m->embed, at, B * N * D);
        err |= carve(a, &m->tok_loc, at, B * Nl * po);
        err |= carve(a, &m->tok_gath, at, B * N * po);
    }
    if (m->n_lora_t) { /* LoRA's rank-r scratch, fp32 */
        m->lora_tmp_n = ditd_lora_tmp_floats(B * Nl);
        err |= carve(a, (void **)&m->lora_tmp, DITD_DTYPE_F32, m->lora_tmp_n);
    }
    if (m->ops->upload_args) { /* per-step arguments on the device (graphs) */
        err |= carve(a, (void **)&m->d_t, DITD_DTYPE_F32, B);
        err |= carve(a, (void **)&m->d_y, DITD_DTYPE_I64, B);
    }
    return err ? DITD_ENOMEM : 0;
}

/* The parallel plan: who holds which heads, MLP columns and tokens. Pure
 * arithmetic on (layout, rank, model), so every rank derives the same. */
static int plan_par(ditd_dit *m, const ditd_mesh *mesh)
{
    const ditd_dit_config *c = &m->cfg;
    int err;
    m->mesh = mesh && mesh->size > 1 ? mesh : NULL;
    m->lay = m->mesh ? mesh->layout : DITD_LAYOUT_SINGLE;
    if (m->mesh && (err = ditd_layout_check_attention(&m->lay, c->num_heads, m->N)))
        return err;
    int T = m->lay.tp, RU = m->lay.ring * m->lay.ulysses;
    m->tp_rank = m->mesh ? mesh->tp_rank : 0;
    ditd_split(c->num_heads, T, m->tp_rank, &m->h0, &m->hc);
    ditd_split(c->ff_dim, T, m->tp_rank, &m->f0, &m->fc);
    /* the attention over the split sequence, on this tp rank's heads */
    if ((err = ditd_cp_attention_new(m->ops, m->mesh, m->max_batch, m->N, 0, m->hc, c->head_dim,
                                     &m->cpa)))
        return err;
    m->n_loc = m->cpa->n_loc;
    m->tok0 = m->cpa->tok0;
    m->tok_cnt = m->cpa->tok_cnt;
    m->tok_off = m->cpa->tok_off;
    if (!(m->cnt_a = calloc(2 * (size_t)RU, sizeof(int))))
        return ditd_err_set(DITD_ENOMEM, "parallel plan");
    m->dsp_a = m->cnt_a + RU;
    return 0;
}

/* Plans both arenas and commits them; the pointers are valid afterwards. */
static int plan(ditd_dit *m)
{
    int err;
    if ((err = carve_weights(m)) || (err = carve_acts(m)))
        return err;
    if ((err = ditd_arena_commit(&m->weights, m->weights.peak_plan)) ||
        (err = ditd_arena_commit(&m->acts, m->acts.peak_plan)))
        return err;
    if ((err = carve_weights(m)) || (err = carve_acts(m)))
        return err;
    /* positions: a pure function of the grid, as Diffusers' PatchEmbed buffer
     * (base_size = sample_size / patch_size, interpolation_scale = 1) */
    float *pos = malloc((size_t)m->N * (size_t)m->cfg.inner_dim * sizeof(float));
    if (!pos)
        return ditd_err_set(DITD_ENOMEM, "positional embedding");
    ditd_cpu_pos_embed_2d(pos, m->cfg.inner_dim, m->gh, m->gw, m->cfg.sample_size / m->cfg.patch_size,
                          1.0f);
    m->ops->upload(m->pos, pos, (size_t)m->N * (size_t)m->cfg.inner_dim);
    free(pos);
    return 0;
}

/* The linears a LoRA adapter may target (Diffusers' module names): per
 * block DITD_DIT_LORA_PER_BLOCK, then proj_out_1, proj_out_2, each with
 * this rank's tp slice as the weight list cuts it. None on a backend
 * without the lora op. */
static int lora_targets(ditd_dit *m)
{
    const ditd_dit_config *c = &m->cfg;
    int D = c->inner_dim, F = c->ff_dim, p = c->patch_size, L = c->num_layers;
    int hd[2] = {m->h0 * c->head_dim, m->hc * c->head_dim}, ff[2] = {m->f0, m->fc};
    if (!m->ops->lora) {
        m->base.lora_refusal = "this backend has no LoRA op";
        return 0;
    }
    int n = L * DITD_DIT_LORA_PER_BLOCK + 2;
    if (!(m->lora_t = calloc((size_t)n, sizeof *m->lora_t)))
        return ditd_err_set(DITD_ENOMEM, "LoRA targets");
    static const char *const sub[DITD_DIT_LORA_PER_BLOCK] = {
        "norm1.emb.timestep_embedder.linear_1", "norm1.emb.timestep_embedder.linear_2",
        "norm1.linear", "attn1.to_q", "attn1.to_k", "attn1.to_v", "attn1.to_out.0",
        "ff.net.0.proj", "ff.net.2"};
    const int shape[DITD_DIT_LORA_PER_BLOCK][2] = {{D, TFREQ}, {D, D}, {6 * D, D}, {D, D}, {D, D},
                                                  {D, D}, {D, D}, {F, D}, {D, F}};
    for (int l = 0; l < L; l++)
        for (int j = 0; j < DITD_DIT_LORA_PER_BLOCK; j++) {
            ditd_lora_target *t = &m->lora_t[l * DITD_DIT_LORA_PER_BLOCK + j];
            snprintf(t->name, sizeof t->name, "transformer_blocks.%d.%s", l, sub[j]);
            t->n_out = shape[j][0];
            t->k_in = shape[j][1];
            if (m->lay.tp <= 1)
                continue;
            if (j >= DITD_DIT_LORA_Q && j < DITD_DIT_LORA_Q + 3) /* column-parallel */
                ditd_lora_target_slice(t, DITD_LORA_OUT_SLICE, 1, &hd[0], &hd[1]);
            else if (j == DITD_DIT_LORA_FF1)
                ditd_lora_target_slice(t, DITD_LORA_OUT_SLICE, 1, &ff[0], &ff[1]);
            else if (j == DITD_DIT_LORA_O) /* row-parallel */
                ditd_lora_target_slice(t, DITD_LORA_IN_SLICE, 1, &hd[0], &hd[1]);
            else if (j == DITD_DIT_LORA_FF2)
                ditd_lora_target_slice(t, DITD_LORA_IN_SLICE, 1, &ff[0], &ff[1]);
        }
    ditd_lora_target *t = &m->lora_t[L * DITD_DIT_LORA_PER_BLOCK];
    snprintf(t[0].name, sizeof t[0].name, "proj_out_1");
    t[0].n_out = 2 * D, t[0].k_in = D;
    snprintf(t[1].name, sizeof t[1].name, "proj_out_2");
    t[1].n_out = p * p * c->out_channels, t[1].k_in = D;
    m->n_lora_t = n;
    m->base.lora_targets = m->lora_t;
    m->base.n_lora_targets = n;
    return 0;
}

static int dit_alloc(const ditd_dit_config *cfg, const ditd_backend_ops *ops, int max_batch,
                     const ditd_mesh *mesh, ditd_dit **out)
{
    ditd_dit *m;
    int err;
    if (max_batch <= 0 || max_batch > 4096)
        return ditd_err_set(DITD_EINVAL, "max batch %d (1..4096)", max_batch);
    m = calloc(1, sizeof *m);
    if (!m)
        return ditd_err_set(DITD_ENOMEM, "model");
    m->cfg = *cfg;
    m->ops = ops;
    m->max_batch = max_batch;
    m->base.max_batch = max_batch; /* base.family: set by the family table's load */
    ditd_dit_config_shapes(cfg, &m->base.shapes);
    m->gh = cfg->sample_size / cfg->patch_size;
    m->gw = m->gh;
    m->N = m->gh * m->gw;
    ditd_arena_init_mem(&m->weights, ops->mem_alloc, ops->mem_free);
    ditd_arena_init_mem(&m->acts, ops->mem_alloc, ops->mem_free);
    m->blocks = calloc((size_t)cfg->num_layers, sizeof *m->blocks);
    if (!m->blocks) {
        free(m);
        return ditd_err_set(DITD_ENOMEM, "model blocks");
    }
    if ((err = plan_par(m, mesh)) || (err = lora_targets(m)) || (err = plan(m))) {
        ditd_dit_free(m);
        return err;
    }
    /* graphs only for a forward without collectives: each collective stays
     * a host call, watched (engine/parallel/comm_nccl.c) */
    if (ops->graph_begin && m->lay.tp == 1 && m->lay.ring * m->lay.ulysses == 1 &&
        !(m->graphs = calloc((size_t)max_batch + 1, sizeof *m->graphs))) {
        ditd_dit_free(m);
        return ditd_err_set(DITD_ENOMEM, "graph table");
    }
    *out = m;
    return 0;
}

void ditd_dit_free(ditd_dit *m)
{
    if (!m)
        return;
    ditd_wl_free(&m->wl);
    if (m->graphs) {
        for (int b = 0; b <= m->max_batch; b++)
            if (m->graphs[b].exec)
                m->ops->graph_free(m->graphs[b].exec);
        free(m->graphs);
    }
    ditd_arena_free(&m->weights);
    ditd_arena_free(&m->acts);
    free(m->blocks);
    ditd_cp_attention_free(m->cpa);
    free(m->cnt_a);
    free(m->lora_t);
    free(m);
}

size_t ditd_dit_weight_bytes(const ditd_dit *m)
{
    return m->weights.size;
}

size_t ditd_dit_act_bytes(const ditd_dit *m)
{
    return m->acts.size + (m->cpa ? ditd_cp_attention_bytes(m->cpa) : 0);
}

/* ---- loading ---- */

typedef struct loader {
    const ditd_weights *st;
    const ditd_backend_ops *ops;
    float *stage;       /* host f32 staging for non-f32 or device weights */
    size_t stage_len;
} loader;

/* Reads `name`, of full shape (d0, d1, ...), into dst: whole when len < 0,
 * otherwise indices [start, start + len) along `axis` (a tp rank's slice,
 * read from the mmap without touching the rest). */
static int load_part(loader *ld, void *dst, const char *name, int ndim, const int64_t *shape,
                     int axis, int64_t start, int64_t len)
{
    size_t n = 1;
    for (int i = 0; i < ndim; i++)
        n *= (size_t)(len >= 0 && i == axis ? len : shape[i]);
    int direct = ld->ops->device == DITD_DEVICE_CPU && ld->ops->weight_dtype == DITD_DTYPE_F32;
    float *to = direct ? dst : NULL;
    if (!direct) {
        if (n > ld->stage_len) {
            float *s = realloc(ld->stage, n * sizeof(float));
            if (!s)
                return ditd_err_set(DITD_ENOMEM, "staging %zu floats for %s", n, name);
            ld->stage = s;
            ld->stage_len = n;
        }
        to = ld->stage;
    }
    int err = len < 0 ? ditd_weights_read_f32(ld->st, name, ndim, shape, to)
                      : ditd_weights_read_f32_slice(ld->st, name, ndim, shape, axis, start,
                                                    len, to);
    if (!err && !direct)
        ld->ops->upload_weight(dst, ld->stage, n);
    return err;
}

/* Reads `name` with the expected shape into dst (rows [row0, row0 + shape[0])
 * of a fused destination are addressed by the caller through dst). */
static int load(loader *ld, void *dst, const char *name, int ndim, int64_t d0, int64_t d1,
                int64_t d2, int64_t d3)
{
    int64_t shape[4] = {d0, d1, d2, d3};
    return load_part(ld, dst, name, ndim, shape, 0, 0, -1);
}

static int load_weights(ditd_dit *m, const ditd_weights *st)
{
    const ditd_dit_config *c = &m->cfg;
    const ditd_backend_ops *ops = m->ops;
    int64_t D = c->inner_dim, p = c->patch_size, C = c->in_channels;
    loader ld = {.st = st, .ops = ops};
    char name[256];
    int err = 0;

#define LOAD(dst, nd, a, b, cc, d, ...)                                   \
    do {                                                                  \
        snprintf(name, sizeof name, __VA_ARGS__);                         \
        if ((err = load(&ld, (dst), name, (nd), (a), (b), (cc), (d))))    \
            goto done;                                                    \
    } while (0)

    LOAD(m->patch_w, 4, D, C, p, p, "pos_embed.proj.weight");
    LOAD(m->patch_b, 1, D, 0, 0, 0, "pos_embed.proj.bias");
    if ((err = ditd_wl_load(&m->wl, st, ops)))
        goto done;
#undef LOAD
    /* A checkpoint with attention biases that the config says it lacks would
     * silently change the numbers: refuse it. */
    if (!c->attention_bias && ditd_weights_has(st, "transformer_blocks.0.attn1.to_q.bias"))
        err = ditd_err_set(DITD_EFORMAT,
                           "checkpoint has transformer_blocks.0.attn1.to_q.bias but config says attention_bias false");
done:
    free(ld.stage);
    return err;
}

/* Every weight the forward passes to linear, re-laid for the backend
 * (backend.h pack_linear; nothing where the backend reads them as they are).
 * After the whole model is in place: qkv_w is filled in three parts. */
static int pack_linears(ditd_dit *m)
{
    return ditd_wl_pack(&m->wl, m->ops, NULL);
}

int ditd_dit_new(const ditd_dit_config *cfg, const ditd_backend_ops *ops, int max_batch,
                 const char *weights_path, ditd_dit **out)
{
    return ditd_dit_new_mesh(cfg, ops, max_batch, weights_path, NULL, out);
}

int ditd_dit_new_mesh(const ditd_dit_config *cfg, const ditd_backend_ops *ops, int max_batch,
                      const char *weights_path, const ditd_mesh *mesh, ditd_dit **out)
{
    ditd_weights *st;
    ditd_dit *m;
    int err;

    if ((err = ditd_weights_open(weights_path, &st)))
        return err;
    if ((err = dit_alloc(cfg, ops, max_batch, mesh, &m)))
        goto fail_alloc;
    if ((err = load_weights(m, st)) || (err = pack_linears(m)))
        goto fail_load;
    ditd_weights_free(st);
    *out = m;
    return 0;
fail_load:
    ditd_dit_free(m);
fail_alloc:
    ditd_weights_free(st);
    return err;
}

/* Fills a (rows, cols) weight, or the slice [start, start + len) of it
 * along `axis`, with std * N(0, 1) from the stream (seed, tensor id): the
 * same numbers the whole tensor has there, so tp ranks draw their slices
 * of the single-rank model. stage holds the slice. */
static void fill_random_slice(const ditd_backend_ops *ops, void *dst, size_t rows, size_t cols,
                              int axis, size_t start, size_t len, uint64_t seed, uint64_t id,
                              float std, float *stage)
{
    size_t n;
    if (axis == 0) {
        n = len * cols;
        ditd_philox_normal(seed, id, start * cols, n, stage);
    } else {
        n = rows * len;
        for (size_t r = 0; r < rows; r++)
            ditd_philox_normal(seed, id, r * cols + start, len, stage + r * len);
    }
    for (size_t i = 0; i < n; i++)
        stage[i] *= std;
    ops->upload_weight(dst, stage, n);
}

/* Fills n weights with std * N(0, 1) from the stream (seed, tensor id). */
static void fill_random(const ditd_backend_ops *ops, void *dst, size_t n, uint64_t seed,
                        uint64_t id, float std, float *stage)
{
    fill_random_slice(ops, dst, n, 1, 0, 0, n, seed, id, std, stage);
}

int ditd_dit_new_random(const ditd_dit_config *cfg, const ditd_backend_ops *ops, int max_batch,
                        uint64_t seed, ditd_dit **out)
{
    return ditd_dit_new_random_mesh(cfg, ops, max_batch, seed, NULL, out);
}

int ditd_dit_new_random_mesh(const ditd_dit_config *cfg, const ditd_backend_ops *ops,
                             int max_batch, uint64_t seed, const ditd_mesh *mesh, ditd_dit **out)
{
    ditd_dit *m;
    int err = dit_alloc(cfg, ops, max_batch, mesh, &m);
    if (err)
        return err;
    const ditd_dit_config *c = &m->cfg;
    size_t D = (size_t)c->inner_dim, F = (size_t)c->ff_dim, p = (size_t)c->patch_size;
    size_t po = p * p * (size_t)c->out_channels, K1 = (size_t)c->num_embeds_ada_norm + 1;
    size_t Dh = (size_t)c->head_dim, hcD = (size_t)m->hc * Dh, h0D = (size_t)m->h0 * Dh;
    size_t Fl = (size_t)m->fc, f0 = (size_t)m->f0;
    size_t big = F * D > K1 * D ? F * D : K1 * D;
    float *stage = malloc((big > 6 * D * D ? big : 6 * D * D) * sizeof(float));
    uint64_t id = 0;
    if (!stage) {
        ditd_dit_free(m);
        return ditd_err_set(DITD_ENOMEM, "random weights");
    }
    fill_random(ops, m->patch_w, D * (size_t)c->in_channels * p * p, seed, id++, 0.02f, stage);
    fill_random(ops, m->patch_b, D, seed, id++, 0.02f, stage);
    fill_random(ops, m->out1_w, 2 * D * D, seed, id++, 0.02f, stage);
    fill_random(ops, m->out1_b, 2 * D, seed, id++, 0.02f, stage);
    fill_random(ops, m->out2_w, po * D, seed, id++, 0.02f, stage);
    fill_random(ops, m->out2_b, po, seed, id++, 0.02f, stage);
    for (int l = 0; l < c->num_layers; l++) {
        ditd_dit_block *b = &m->blocks[l];
        fill_random(ops, b->t1_w, D * TFREQ, seed, id++, 0.02f, stage);
        fill_random(ops, b->t1_b, D, seed, id++, 0.02f, stage);
        fill_random(ops, b->t2_w, D * D, seed, id++, 0.02f, stage);
        fill_random(ops, b->t2_b, D, seed, id++, 0.02f, stage);
        fill_random(ops, b->cls, K1 * D, seed, id++, 0.02f, stage);
        fill_random(ops, b->ada_w, 6 * D * D, seed, id++, 0.02f, stage);
        fill_random(ops, b->ada_b, 6 * D, seed, id++, 0.02f, stage);
        /* (3D, D) q;k;v stream: this rank's head rows of each */
        for (size_t j = 0; j < 3; j++)
            fill_random_slice(ops, ditd_ptr_w(ops, b->qkv_w, j * hcD * D), 3 * D, D, 0,
                              j * D + h0D, hcD, seed, id, 0.02f, stage);
        id++;
        if (b->qkv_b) {
            for (size_t j = 0; j < 3; j++)
                fill_random_slice(ops, ditd_ptr_w(ops, b->qkv_b, j * hcD), 3 * D, 1, 0,
                                  j * D + h0D, hcD, seed, id, 0.02f, stage);
            id++;
        }
        fill_random_slice(ops, b->o_w, D, D, 1, h0D, hcD, seed, id++, 0.02f, stage);
        fill_random(ops, b->o_b, D, seed, id++, 0.02f, stage);
        fill_random_slice(ops, b->ff1_w, F, D, 0, f0, Fl, seed, id++, 0.02f, stage);
        fill_random_slice(ops, b->ff1_b, F, 1, 0, f0, Fl, seed, id++, 0.02f, stage);
        fill_random_slice(ops, b->ff2_w, D, F, 1, f0, Fl, seed, id++, 0.02f, stage);
        fill_random(ops, b->ff2_b, D, seed, id++, 0.02f, stage);
    }
    free(stage);
    if ((err = pack_linears(m))) {
        ditd_dit_free(m);
        return err;
    }
    *out = m;
    return 0;
}

/* ---- forward ---- */

/* ops->linear, plus the LoRA adapters of the rows on target t (engine/
 * models/lora.h): y (B rows, N) from x (B rows, K), `rows` rows a sample.
 * With an adapter on t the linear runs without its activation and the
 * activation follows the adapters' term (PEFT wraps the Linear). */
static void lin(ditd_dit *m, int t, int B, int rows, const void *x, size_t ldx, const void *w,
                const void *b, void *y, size_t ldy, int N, int K, ditd_act act)
{
    const ditd_lora_set *const *ls = m->base.loras;
    if (!ditd_lora_touches(ls, B, t)) {
        m->ops->linear(x, ldx, w, b, y, ldy, B * rows, N, K, act);
        return;
    }
    m->ops->linear(x, ldx, w, b, y, ldy, B * rows, N, K, DITD_ACT_NONE);
    ditd_lora_apply(m->ops, ls, B, rows, t, x, ldx, y, ldy, N, K, act, m->lora_tmp,
                    m->lora_tmp_n);
}

/* Block l's target j. */
static int lt(int l, int j)
{
    return l * DITD_DIT_LORA_PER_BLOCK + j;
}

/* Conditioning of one block: c = TimestepEmbedding(tfreq) + LabelEmbedding(y).
 *   tfreq (B, E) -> linear_1, SiLU -> linear_2 -> (B, D); + table[y] (B, D) */
static void block_conditioning(ditd_dit *m, int l, int B, const int64_t *h_y, void *cond)
{
    const ditd_backend_ops *ops = m->ops;
    const ditd_dit_block *b = &m->blocks[l];
    int D = m->cfg.inner_dim;
    lin(m, lt(l, DITD_DIT_LORA_T1), B, 1, m->tfreq, TFREQ, b->t1_w, b->t1_b, m->temb, (size_t)D,
        D, TFREQ, DITD_ACT_SILU);
    lin(m, lt(l, DITD_DIT_LORA_T2), B, 1, m->temb, (size_t)D, b->t2_w, b->t2_b, cond, (size_t)D,
        D, D, DITD_ACT_NONE);
    if (m->d_y)
        ops->embedding_dev(b->cls, m->d_y, m->temb, B, D);
    else
        ops->embedding(b->cls, h_y, m->temb, B, D);
    ops->add(cond, m->temb, (size_t)B * (size_t)D);
}

/* Strided 2-D copy of rows x cols elements (pack/unpack around the
 * collectives), on the backend's device. */
static void copy2d(const ditd_backend_ops *ops, void *dst, size_t ldd, const void *src,
                   size_t lds, size_t rows, size_t cols)
{
    ops->copy2d(dst, ldd, src, lds, rows, cols);
}

/* Multi-head self-attention on the modulated tokens xn (B, N_loc, D) into
 * xn: this rank's heads (tp), over the whole sequence (cp). */
static int self_attention(ditd_dit *m, int l, int B)
{
    const ditd_dit_block *b = &m->blocks[l];
    const ditd_backend_ops *ops = m->ops;
    const ditd_dit_config *c = &m->cfg;
    int D = c->inner_dim, M = B * m->n_loc, hcD = m->hc * c->head_dim;
    size_t ld3 = 3 * (size_t)hcD;
    int err;

    /* qkv (B, N_loc, 3 H_loc Dh) = xn @ [Wq; Wk; Wv]^T (this rank's rows):
     * q, k, v are (B, N_loc, H_loc, Dh) views of stride 3 H_loc Dh */
    ops->linear(m->xn, (size_t)D, b->qkv_w, b->qkv_b, m->qkv, ld3, M, 3 * hcD, D, DITD_ACT_NONE);
    /* adapters on to_q, to_k, to_v: their column blocks (this rank's heads) */
    for (int j = 0; j < 3 && m->base.loras; j++) {
        int t = lt(l, DITD_DIT_LORA_Q + j);
        if (ditd_lora_touches(m->base.loras, B, t))
            ditd_lora_apply(ops, m->base.loras, B, m->n_loc, t, m->xn, (size_t)D,
                            ditd_ptr_act(ops, m->qkv, (size_t)j * (size_t)hcD), ld3, hcD, D,
                            DITD_ACT_NONE, m->lora_tmp, m->lora_tmp_n);
    }
    /* attention over the whole sequence (context parallel: engine/parallel) */
    if ((err = ditd_cp_attention_run(m->cpa, B, m->qkv, ditd_ptr_act(ops, m->qkv, (size_t)hcD),
                                     ditd_ptr_act(ops, m->qkv, 2 * (size_t)hcD), ld3, m->att,
                                     (size_t)hcD, NULL, NULL, NULL, 0, NULL, 0)))
        return err;
    /* to_out.0: (B, N_loc, H_loc Dh) -> (B, N_loc, D) into xn (free again);
     * row-parallel under tp: partial sums, the bias once, then all-reduce */
    lin(m, lt(l, DITD_DIT_LORA_O), B, m->n_loc, m->att, (size_t)hcD, b->o_w,
        m->tp_rank == 0 ? b->o_b : NULL, m->xn, (size_t)D, D, hcD, DITD_ACT_NONE);
    if (m->lay.tp > 1)
        return ditd_comm_allreduce_sum(m->mesh->tp_comm, ops->act_dtype, m->xn,
                                       (size_t)M * (size_t)D);
    return 0;
}

/* The MLP on the modulated tokens xn (B, N_loc, D) into xn:
 *   FF = Linear(F -> D) . GELU(tanh) . Linear(D -> F);
 *   tp: fc1 by columns (B, N_loc, F_loc), fc2 by rows, all-reduce */
static int feed_forward(ditd_dit *m, int l, int B)
{
    const ditd_backend_ops *ops = m->ops;
    const ditd_dit_block *b = &m->blocks[l];
    int D = m->cfg.inner_dim, M = B * m->n_loc, Fl = m->fc;
    lin(m, lt(l, DITD_DIT_LORA_FF1), B, m->n_loc, m->xn, (size_t)D, b->ff1_w, b->ff1_b, m->ff,
        (size_t)Fl, Fl, D, m->cfg.activation);
    lin(m, lt(l, DITD_DIT_LORA_FF2), B, m->n_loc, m->ff, (size_t)Fl, b->ff2_w,
        m->tp_rank == 0 ? b->ff2_b : NULL, m->xn, (size_t)D, D, Fl, DITD_ACT_NONE);
    if (m->lay.tp > 1)
        return ditd_comm_allreduce_sum(m->mesh->tp_comm, ops->act_dtype, m->xn,
                                       (size_t)M * (size_t)D);
    return 0;
}

/* Module `id` of a block (attn1: self_attention, ff: feed_forward) into xn,
 * or its output as a cache predicts it (TaylorSeer, denoiser.h). */
static int module(ditd_dit *m, int id, int l, int B, int ff)
{
    const ditd_denoiser_cache *cc = m->base.cache;
    int pred = 0, err;
    if (cc && cc->module_begin && (err = cc->module_begin(cc->ctx, id, m->xn, &pred)))
        return err;
    if (pred)
        return 0;
    if ((err = ff ? feed_forward(m, l, B) : self_attention(m, l, B)))
        return err;
    return cc && cc->module_end ? cc->module_end(cc->ctx, id, m->xn) : 0;
}

/* The forward's ops, queued (or captured) in order; the arguments were
 * checked by ditd_dit_forward. With m->d_t / m->d_y the timesteps and ids
 * are read from there (uploaded before), else from the host arrays. */
static int forward_ops(ditd_dit *m, int B, const void *x, const float *h_t, const int64_t *h_y,
                       void *out)
{
    const ditd_backend_ops *ops = m->ops;
    const ditd_dit_config *c = &m->cfg;
    int D = c->inner_dim, N = m->N, Nl = m->n_loc, p = c->patch_size;
    int po = p * p * c->out_channels, cp = m->lay.ring * m->lay.ulysses > 1;
    size_t ld6 = 6 * (size_t)D;
    int err;

    /* patch embedding: x (B, C, S, S) -> h (B, N, D), plus positions; under
     * cp every rank embeds the whole image (cheap) and keeps its tokens */
    if (!cp) {
        ops->patch_embed(x, m->patch_w, m->patch_b, m->pos, m->h, m->scratch, B, c->in_channels,
                         c->sample_size, c->sample_size, p, D);
    } else {
        ops->patch_embed(x, m->patch_w, m->patch_b, m->pos, m->embed, m->scratch, B,
                         c->in_channels, c->sample_size, c->sample_size, p, D);
        for (size_t b = 0; b < (size_t)B; b++) /* (B, N_loc, D) */
            copy2d(ops, ditd_ptr_act(ops, m->h, b * (size_t)Nl * D), (size_t)D,
                   ditd_ptr_act(ops, m->embed, (b * (size_t)N + (size_t)m->tok0) * D), (size_t)D,
                   (size_t)Nl, (size_t)D);
    }
    /* timestep features (B, E), shared by every block's embedder */
    if (m->d_t)
        ops->timestep_embed_dev(m->d_t, m->tfreq, B, TFREQ);
    else
        ops->timestep_embed(h_t, m->tfreq, B, TFREQ);

    /* block 0's conditioning first: the final layer reads it even when a
     * cache skips block 0 (Diffusers calls transformer_blocks[0].norm1.emb
     * there directly) */
    block_conditioning(m, 0, B, h_y, m->cond0);

    /* step caching (engine/models/denoiser.h): the block hooks around the
     * blocks, the module hooks around each block, its attn1 and its ff */
    const ditd_denoiser_cache *cc = m->base.cache;
    ditd_cache_streams cs = {B, m->h, Nl, m->tok0, NULL, 0, D};
    int run = 1, pred = 0;
    if (cc && (err = cc->blocks_begin(cc->ctx, &cs, &run)))
        return err;
    for (int l = 0; run && l < c->num_layers; l++) {
        const ditd_dit_block *b = &m->blocks[l];
        void *cond = l == 0 ? m->cond0 : m->cond;
        const void *shift_msa = m->mod, *scale_msa = ditd_ptr_act(ops, m->mod, (size_t)D);
        const void *gate_msa = ditd_ptr_act(ops, m->mod, 2 * (size_t)D);
        const void *shift_mlp = ditd_ptr_act(ops, m->mod, 3 * (size_t)D);
        const void *scale_mlp = ditd_ptr_act(ops, m->mod, 4 * (size_t)D);
        const void *gate_mlp = ditd_ptr_act(ops, m->mod, 5 * (size_t)D);

        /* adaLN-Zero: mod (B, 6D) = Linear(SiLU(cond)) =
         *   [shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp] */
        if (cc && cc->module_begin && (err = cc->module_begin(cc->ctx, 3 * l, m->h, &pred)))
            return err;
        if (pred)
            goto block_done;
        if (l > 0)
            block_conditioning(m, l, B, h_y, cond);
        ops->act(cond, m->temb, (size_t)B * (size_t)D, DITD_ACT_SILU);
        lin(m, lt(l, DITD_DIT_LORA_ADA), B, 1, m->temb, (size_t)D, b->ada_w, b->ada_b, m->mod, ld6,
            6 * D, D, DITD_ACT_NONE);

        /* attention: h += gate_msa * Attn(LN(h) * (1 + scale_msa) + shift_msa) */
        ops->layernorm_modulate(m->h, m->xn, B, Nl, D, ADA_EPS, shift_msa, scale_msa, ld6);
        if ((err = module(m, 3 * l + 1, l, B, 0)))
            return err;
        ops->gated_residual(m->h, m->xn, B, Nl, D, gate_msa, ld6);

        /* MLP: h += gate_mlp * FF(LN(h) * (1 + scale_mlp) + shift_mlp),
         *   FF = Linear(F -> D) . GELU(tanh) . Linear(D -> F);
         *   tp: fc1 by columns (B, N_loc, F_loc), fc2 by rows, all-reduce */
        ops->layernorm_modulate(m->h, m->xn, B, Nl, D, c->norm_eps, shift_mlp, scale_mlp, ld6);
        if ((err = module(m, 3 * l + 2, l, B, 1)))
            return err;
        ops->gated_residual(m->h, m->xn, B, Nl, D, gate_mlp, ld6);
        if (cc && cc->module_end && (err = cc->module_end(cc->ctx, 3 * l, m->h)))
            return err;
    block_done:
        if (l == 0 && cc && (err = cc->first_block_done(cc->ctx, &cs, &run)))
            return err;
        if (run && l == c->num_layers - 1 && cc && (err = cc->blocks_end(cc->ctx, &cs)))
            return err;
    }

    /* final layer, conditioned on block 0's embedding as in Diffusers:
     *   [shift, scale] (B, 2D) = proj_out_1(SiLU(cond0));
     *   tokens (B, N_loc, p*p*Co) = proj_out_2(LN(h) * (1 + scale) + shift) */
    ops->act(m->cond0, m->temb, (size_t)B * (size_t)D, DITD_ACT_SILU);
    int t_out = c->num_layers * DITD_DIT_LORA_PER_BLOCK; /* proj_out_1, proj_out_2 */
    lin(m, t_out, B, 1, m->temb, (size_t)D, m->out1_w, m->out1_b, m->mod, 2 * (size_t)D, 2 * D, D,
        DITD_ACT_NONE);
    ops->layernorm_modulate(m->h, m->xn, B, Nl, D, ADA_EPS, m->mod,
                            ditd_ptr_act(ops, m->mod, (size_t)D), 2 * (size_t)D);
    lin(m, t_out + 1, B, Nl, m->xn, (size_t)D, m->out2_w, m->out2_b, cp ? m->tok_loc : m->tok_out,
        (size_t)po, po, D, DITD_ACT_NONE);
    if (cp) {
        /* gather the sequence: cp rank s's block is (B, N_s, p*p*Co) */
        int RU = m->lay.ring * m->lay.ulysses;
        for (int s = 0; s < RU; s++) {
            m->cnt_a[s] = B * m->tok_cnt[s] * po;
            m->dsp_a[s] = B * m->tok_off[s] * po;
        }
        if ((err = ditd_comm_allgatherv(m->mesh->cp_comm, ops->act_dtype, m->tok_loc, m->tok_gath,
                                        m->cnt_a, m->dsp_a)))
            return err;
        for (int s = 0; s < RU; s++)
            for (size_t b = 0; b < (size_t)B; b++)
                copy2d(ops,
                       ditd_ptr_act(ops, m->tok_out, (b * (size_t)N + (size_t)m->tok_off[s]) * (size_t)po),
                       (size_t)po,
                       ditd_ptr_act(ops, m->tok_gath, (size_t)m->dsp_a[s] + b * (size_t)m->tok_cnt[s] * (size_t)po),
                       (size_t)po, (size_t)m->tok_cnt[s], (size_t)po);
    }
    /* unpatchify: (B, gh*gw, p*p*Co) -> (B, Co, S, S) */
    ops->unpatchify(m->tok_out, out, B, c->out_channels, m->gh, m->gw, p);
    /* an op a device refused (no sync: faults surface at the caller's) */
    return ops->status();
}

/* Captures forward_ops for this (B, x, out) and runs the graph once. */
static int forward_capture(ditd_dit *m, ditd_dit_graph *gr, int B, const void *x,
                           const float *h_t, const int64_t *h_y, void *out)
{
    const ditd_backend_ops *ops = m->ops;
    void *exec = NULL;
    int err = ops->graph_begin(), err2;
    if (err == DITD_EUNSUPPORTED) { /* graphs turned off: op by op from now on */
        free(m->graphs);
        m->graphs = NULL;
        return forward_ops(m, B, x, h_t, h_y, out);
    }
    if (!err) {
        err = forward_ops(m, B, x, h_t, h_y, out);
        err2 = ops->graph_end(&exec);
        err = err ? err : err2;
    }
    if (err) {
        /* The capture failed: say so once, turn graphs off for this model
         * (a capture that failed would fail again at every later forward)
         * and run this forward op by op; nothing of it ran yet. */
        fprintf(stderr, "ditd: CUDA graph capture of the forward (batch %d) failed: %s: %s; "
                        "CUDA graphs off for this model, running op by op\n",
                B, ditd_err_name(err), ditd_err_detail());
        if (exec)
            ops->graph_free(exec);
        for (int b = 0; b <= m->max_batch; b++)
            if (m->graphs[b].exec)
                ops->graph_free(m->graphs[b].exec);
        free(m->graphs);
        m->graphs = NULL;
        ops->status(); /* clear what the capture left */
        return forward_ops(m, B, x, h_t, h_y, out);
    }
    gr->exec = exec;
    gr->x = x;
    gr->out = out;
    if ((err = ops->graph_launch(exec)))
        return err;
    return ops->status();
}

int ditd_dit_forward(ditd_dit *m, int B, const void *x, const float *h_t, const int64_t *h_y,
                     void *out)
{
    const ditd_backend_ops *ops = m->ops;
    const ditd_dit_config *c = &m->cfg;
    int err;

    if (B <= 0 || B > m->max_batch)
        return ditd_err_set(DITD_EINVAL, "batch %d outside 1..%d", B, m->max_batch);
    for (int i = 0; i < B; i++) {
        if (h_y[i] < 0 || h_y[i] > c->num_embeds_ada_norm)
            return ditd_err_set(DITD_EINVAL, "class id %lld outside 0..%d (%d = unconditional)",
                                (long long)h_y[i], c->num_embeds_ada_norm, c->num_embeds_ada_norm);
        if (!isfinite(h_t[i]))
            return ditd_err_set(DITD_EINVAL, "timestep of sample %d is not finite", i);
    }
    if (!m->d_t) /* host arguments (the CPU): op by op, as always */
        return forward_ops(m, B, x, h_t, h_y, out);

    /* this step's arguments into the device buffers, in stream order before
     * whatever reads them (a replay included) */
    ops->upload_args(m->d_t, h_t, m->d_y, h_y, B);
    /* a cache decides on the host inside the forward, and adapters change
     * per batch: op by op */
    if (!m->graphs || m->base.cache || m->base.loras)
        return forward_ops(m, B, x, h_t, h_y, out);
    ditd_dit_graph *gr = &m->graphs[B];
    if (gr->exec && (gr->x != x || gr->out != out)) { /* other buffers: capture anew */
        ops->graph_free(gr->exec);
        gr->exec = NULL;
        gr->runs = 0;
    }
    if (gr->exec) {
        if ((err = ops->graph_launch(gr->exec)))
            return err;
        return ops->status();
    }
    /* the first forward of a shape runs op by op: it makes the one-time
     * choices (cuBLASLt algorithms) outside any capture */
    if (gr->runs++ < 1)
        return forward_ops(m, B, x, h_t, h_y, out);
    return forward_capture(m, gr, B, x, h_t, h_y, out);
}
