/* Diffusers DiTTransformer2DModel forward: patch embed, blocks, final layer. */
#include "engine/dit.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/error.h"
#include "engine/philox.h"
#include "engine/safetensors.h"
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

static int carve_weights(ditd_dit *m)
{
    const ditd_dit_config *c = &m->cfg;
    size_t D = (size_t)c->inner_dim, F = (size_t)c->ff_dim, p = (size_t)c->patch_size;
    size_t K1 = (size_t)c->num_embeds_ada_norm + 1, po = p * p * (size_t)c->out_channels;
    ditd_dtype wt = m->ops->weight_dtype;
    ditd_arena *a = &m->weights;
    int err = 0;

    err |= carve(a, &m->patch_w, wt, D * (size_t)c->in_channels * p * p);
    err |= carve(a, &m->patch_b, wt, D);
    err |= carve(a, &m->pos, m->ops->act_dtype, (size_t)m->N * D);
    err |= carve(a, &m->out1_w, wt, 2 * D * D);
    err |= carve(a, &m->out1_b, wt, 2 * D);
    err |= carve(a, &m->out2_w, wt, po * D);
    err |= carve(a, &m->out2_b, wt, po);
    for (int l = 0; l < c->num_layers; l++) {
        ditd_dit_block *b = &m->blocks[l];
        err |= carve(a, &b->t1_w, wt, D * TFREQ);
        err |= carve(a, &b->t1_b, wt, D);
        err |= carve(a, &b->t2_w, wt, D * D);
        err |= carve(a, &b->t2_b, wt, D);
        err |= carve(a, &b->cls, wt, K1 * D);
        err |= carve(a, &b->ada_w, wt, 6 * D * D);
        err |= carve(a, &b->ada_b, wt, 6 * D);
        err |= carve(a, &b->qkv_w, wt, 3 * D * D);
        b->qkv_b = NULL;
        if (c->attention_bias)
            err |= carve(a, &b->qkv_b, wt, 3 * D);
        err |= carve(a, &b->o_w, wt, D * D);
        err |= carve(a, &b->o_b, wt, D);
        err |= carve(a, &b->ff1_w, wt, F * D);
        err |= carve(a, &b->ff1_b, wt, F);
        err |= carve(a, &b->ff2_w, wt, D * F);
        err |= carve(a, &b->ff2_b, wt, D);
    }
    return err ? DITD_ENOMEM : 0;
}

static int carve_acts(ditd_dit *m)
{
    const ditd_dit_config *c = &m->cfg;
    size_t B = (size_t)m->max_batch, N = (size_t)m->N, D = (size_t)c->inner_dim;
    size_t p = (size_t)c->patch_size;
    ditd_dtype at = m->ops->act_dtype;
    ditd_arena *a = &m->acts;
    int err = 0;

    err |= carve(a, &m->h, at, B * N * D);
    err |= carve(a, &m->xn, at, B * N * D);
    err |= carve(a, &m->qkv, at, B * N * 3 * D);
    err |= carve(a, &m->att, at, B * N * D);
    err |= carve(a, &m->ff, at, B * N * (size_t)c->ff_dim);
    err |= carve(a, &m->tfreq, at, B * TFREQ);
    err |= carve(a, &m->temb, at, B * D);
    err |= carve(a, &m->cond, at, B * D);
    err |= carve(a, &m->cond0, at, B * D);
    err |= carve(a, &m->mod, at, B * 6 * D);
    err |= carve(a, &m->scratch, at, B * N * (size_t)c->in_channels * p * p);
    err |= carve(a, &m->tok_out, at, B * N * p * p * (size_t)c->out_channels);
    return err ? DITD_ENOMEM : 0;
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

static int dit_alloc(const ditd_dit_config *cfg, const ditd_backend_ops *ops, int max_batch,
                     ditd_dit **out)
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
    m->gh = cfg->sample_size / cfg->patch_size;
    m->gw = m->gh;
    m->N = m->gh * m->gw;
    ditd_arena_init(&m->weights);
    ditd_arena_init(&m->acts);
    m->blocks = calloc((size_t)cfg->num_layers, sizeof *m->blocks);
    if (!m->blocks) {
        free(m);
        return ditd_err_set(DITD_ENOMEM, "model blocks");
    }
    if ((err = plan(m))) {
        ditd_dit_free(m);
        return err;
    }
    *out = m;
    return 0;
}

void ditd_dit_free(ditd_dit *m)
{
    if (!m)
        return;
    ditd_arena_free(&m->weights);
    ditd_arena_free(&m->acts);
    free(m->blocks);
    free(m);
}

size_t ditd_dit_weight_bytes(const ditd_dit *m)
{
    return m->weights.size;
}

size_t ditd_dit_act_bytes(const ditd_dit *m)
{
    return m->acts.size;
}

/* ---- loading ---- */

typedef struct loader {
    const ditd_safetensors *st;
    const ditd_backend_ops *ops;
    float *stage;       /* host f32 staging for non-f32 or device weights */
    size_t stage_len;
} loader;

/* Reads `name` with the expected shape into dst (rows [row0, row0 + shape[0])
 * of a fused destination are addressed by the caller through dst). */
static int load(loader *ld, void *dst, const char *name, int ndim, int64_t d0, int64_t d1,
                int64_t d2, int64_t d3)
{
    int64_t shape[4] = {d0, d1, d2, d3};
    size_t n = 1;
    for (int i = 0; i < ndim; i++)
        n *= (size_t)shape[i];
    if (ld->ops->device == DITD_DEVICE_CPU && ld->ops->weight_dtype == DITD_DTYPE_F32)
        return ditd_safetensors_read_f32(ld->st, name, ndim, shape, dst);
    if (n > ld->stage_len) {
        float *s = realloc(ld->stage, n * sizeof(float));
        if (!s)
            return ditd_err_set(DITD_ENOMEM, "staging %zu floats for %s", n, name);
        ld->stage = s;
        ld->stage_len = n;
    }
    int err = ditd_safetensors_read_f32(ld->st, name, ndim, shape, ld->stage);
    if (!err)
        ld->ops->upload_weight(dst, ld->stage, n);
    return err;
}

static int load_weights(ditd_dit *m, const ditd_safetensors *st)
{
    const ditd_dit_config *c = &m->cfg;
    const ditd_backend_ops *ops = m->ops;
    int64_t D = c->inner_dim, F = c->ff_dim, p = c->patch_size, C = c->in_channels;
    int64_t po = p * p * c->out_channels;
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
    LOAD(m->out1_w, 2, 2 * D, D, 0, 0, "proj_out_1.weight");
    LOAD(m->out1_b, 1, 2 * D, 0, 0, 0, "proj_out_1.bias");
    LOAD(m->out2_w, 2, po, D, 0, 0, "proj_out_2.weight");
    LOAD(m->out2_b, 1, po, 0, 0, 0, "proj_out_2.bias");
    for (int l = 0; l < c->num_layers; l++) {
        ditd_dit_block *b = &m->blocks[l];
        const char *qkv[3] = {"to_q", "to_k", "to_v"};
        LOAD(b->t1_w, 2, D, TFREQ, 0, 0, "transformer_blocks.%d.norm1.emb.timestep_embedder.linear_1.weight", l);
        LOAD(b->t1_b, 1, D, 0, 0, 0, "transformer_blocks.%d.norm1.emb.timestep_embedder.linear_1.bias", l);
        LOAD(b->t2_w, 2, D, D, 0, 0, "transformer_blocks.%d.norm1.emb.timestep_embedder.linear_2.weight", l);
        LOAD(b->t2_b, 1, D, 0, 0, 0, "transformer_blocks.%d.norm1.emb.timestep_embedder.linear_2.bias", l);
        /* LabelEmbedding keeps one extra row, the null class, for CFG. */
        LOAD(b->cls, 2, c->num_embeds_ada_norm + 1, D, 0, 0,
             "transformer_blocks.%d.norm1.emb.class_embedder.embedding_table.weight", l);
        LOAD(b->ada_w, 2, 6 * D, D, 0, 0, "transformer_blocks.%d.norm1.linear.weight", l);
        LOAD(b->ada_b, 1, 6 * D, 0, 0, 0, "transformer_blocks.%d.norm1.linear.bias", l);
        for (int j = 0; j < 3; j++) {
            LOAD(ditd_ptr_w(ops, b->qkv_w, (size_t)(j * D * D)), 2, D, D, 0, 0,
                 "transformer_blocks.%d.attn1.%s.weight", l, qkv[j]);
            if (b->qkv_b)
                LOAD(ditd_ptr_w(ops, b->qkv_b, (size_t)(j * D)), 1, D, 0, 0, 0,
                     "transformer_blocks.%d.attn1.%s.bias", l, qkv[j]);
        }
        LOAD(b->o_w, 2, D, D, 0, 0, "transformer_blocks.%d.attn1.to_out.0.weight", l);
        LOAD(b->o_b, 1, D, 0, 0, 0, "transformer_blocks.%d.attn1.to_out.0.bias", l);
        LOAD(b->ff1_w, 2, F, D, 0, 0, "transformer_blocks.%d.ff.net.0.proj.weight", l);
        LOAD(b->ff1_b, 1, F, 0, 0, 0, "transformer_blocks.%d.ff.net.0.proj.bias", l);
        LOAD(b->ff2_w, 2, D, F, 0, 0, "transformer_blocks.%d.ff.net.2.weight", l);
        LOAD(b->ff2_b, 1, D, 0, 0, 0, "transformer_blocks.%d.ff.net.2.bias", l);
    }
#undef LOAD
    /* A checkpoint with attention biases that the config says it lacks would
     * silently change the numbers: refuse it. */
    if (!c->attention_bias && ditd_safetensors_find(st, "transformer_blocks.0.attn1.to_q.bias"))
        err = ditd_err_set(DITD_EFORMAT,
                           "checkpoint has transformer_blocks.0.attn1.to_q.bias but config says attention_bias false");
done:
    free(ld.stage);
    return err;
}

int ditd_dit_new(const ditd_dit_config *cfg, const ditd_backend_ops *ops, int max_batch,
                 const char *weights_path, ditd_dit **out)
{
    ditd_safetensors *st;
    ditd_dit *m;
    int err;

    if ((err = ditd_safetensors_open(weights_path, &st)))
        return err;
    if ((err = dit_alloc(cfg, ops, max_batch, &m)))
        goto fail_alloc;
    if ((err = load_weights(m, st)))
        goto fail_load;
    ditd_safetensors_free(st);
    *out = m;
    return 0;
fail_load:
    ditd_dit_free(m);
fail_alloc:
    ditd_safetensors_free(st);
    return err;
}

/* Fills n weights with std * N(0, 1) from the stream (seed, tensor id). */
static void fill_random(const ditd_backend_ops *ops, void *dst, size_t n, uint64_t seed,
                        uint64_t id, float std, float *stage)
{
    ditd_philox_normal(seed, id, 0, n, stage);
    for (size_t i = 0; i < n; i++)
        stage[i] *= std;
    ops->upload_weight(dst, stage, n);
}

int ditd_dit_new_random(const ditd_dit_config *cfg, const ditd_backend_ops *ops, int max_batch,
                        uint64_t seed, ditd_dit **out)
{
    ditd_dit *m;
    int err = dit_alloc(cfg, ops, max_batch, &m);
    if (err)
        return err;
    const ditd_dit_config *c = &m->cfg;
    size_t D = (size_t)c->inner_dim, F = (size_t)c->ff_dim, p = (size_t)c->patch_size;
    size_t po = p * p * (size_t)c->out_channels, K1 = (size_t)c->num_embeds_ada_norm + 1;
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
        fill_random(ops, b->qkv_w, 3 * D * D, seed, id++, 0.02f, stage);
        if (b->qkv_b)
            fill_random(ops, b->qkv_b, 3 * D, seed, id++, 0.02f, stage);
        fill_random(ops, b->o_w, D * D, seed, id++, 0.02f, stage);
        fill_random(ops, b->o_b, D, seed, id++, 0.02f, stage);
        fill_random(ops, b->ff1_w, F * D, seed, id++, 0.02f, stage);
        fill_random(ops, b->ff1_b, F, seed, id++, 0.02f, stage);
        fill_random(ops, b->ff2_w, D * F, seed, id++, 0.02f, stage);
        fill_random(ops, b->ff2_b, D, seed, id++, 0.02f, stage);
    }
    free(stage);
    *out = m;
    return 0;
}

/* ---- forward ---- */

/* Conditioning of one block: c = TimestepEmbedding(tfreq) + LabelEmbedding(y).
 *   tfreq (B, E) -> linear_1, SiLU -> linear_2 -> (B, D); + table[y] (B, D) */
static void block_conditioning(ditd_dit *m, const ditd_dit_block *b, int B, const int64_t *h_y,
                               void *cond)
{
    const ditd_backend_ops *ops = m->ops;
    int D = m->cfg.inner_dim;
    ops->linear(m->tfreq, TFREQ, b->t1_w, b->t1_b, m->temb, (size_t)D, B, D, TFREQ, DITD_ACT_SILU);
    ops->linear(m->temb, (size_t)D, b->t2_w, b->t2_b, cond, (size_t)D, B, D, D, DITD_ACT_NONE);
    ops->embedding(b->cls, h_y, m->temb, B, D);
    ops->add(cond, m->temb, (size_t)B * (size_t)D);
}

/* Multi-head self-attention on the modulated tokens xn (B, N, D) into att. */
static void self_attention(ditd_dit *m, const ditd_dit_block *b, int B)
{
    const ditd_backend_ops *ops = m->ops;
    const ditd_dit_config *c = &m->cfg;
    int D = c->inner_dim, N = m->N, M = B * N;
    size_t ld3 = 3 * (size_t)D;

    /* qkv (B, N, 3D) = xn @ [Wq; Wk; Wv]^T: q, k, v are (B, N, H, Dh) views of stride 3D */
    ops->linear(m->xn, (size_t)D, b->qkv_w, b->qkv_b, m->qkv, ld3, M, 3 * D, D, DITD_ACT_NONE);
    ops->attention(m->qkv, ld3, ditd_ptr_act(ops, m->qkv, (size_t)D), ld3,
                   ditd_ptr_act(ops, m->qkv, 2 * (size_t)D), ld3, m->att, (size_t)D, NULL,
                   B, N, N, c->num_heads, c->head_dim, 1.0f / sqrtf((float)c->head_dim));
    /* to_out.0: (B, N, D) -> (B, N, D), into xn (free again) */
    ops->linear(m->att, (size_t)D, b->o_w, b->o_b, m->xn, (size_t)D, M, D, D, DITD_ACT_NONE);
}

int ditd_dit_forward(ditd_dit *m, int B, const void *x, const float *h_t, const int64_t *h_y,
                     void *out)
{
    const ditd_backend_ops *ops = m->ops;
    const ditd_dit_config *c = &m->cfg;
    int D = c->inner_dim, F = c->ff_dim, N = m->N, M, p = c->patch_size;
    int po = p * p * c->out_channels;
    size_t ld6 = 6 * (size_t)D;

    if (B <= 0 || B > m->max_batch)
        return ditd_err_set(DITD_EINVAL, "batch %d outside 1..%d", B, m->max_batch);
    for (int i = 0; i < B; i++) {
        if (h_y[i] < 0 || h_y[i] > c->num_embeds_ada_norm)
            return ditd_err_set(DITD_EINVAL, "class id %lld outside 0..%d (%d = unconditional)",
                                (long long)h_y[i], c->num_embeds_ada_norm, c->num_embeds_ada_norm);
        if (!isfinite(h_t[i]))
            return ditd_err_set(DITD_EINVAL, "timestep of sample %d is not finite", i);
    }
    M = B * N;

    /* patch embedding: x (B, C, S, S) -> h (B, N, D), plus positions */
    ops->patch_embed(x, m->patch_w, m->patch_b, m->pos, m->h, m->scratch, B, c->in_channels,
                     c->sample_size, c->sample_size, p, D);
    /* timestep features (B, E), shared by every block's embedder */
    ops->timestep_embed(h_t, m->tfreq, B, TFREQ);

    for (int l = 0; l < c->num_layers; l++) {
        const ditd_dit_block *b = &m->blocks[l];
        void *cond = l == 0 ? m->cond0 : m->cond;
        const void *shift_msa = m->mod, *scale_msa = ditd_ptr_act(ops, m->mod, (size_t)D);
        const void *gate_msa = ditd_ptr_act(ops, m->mod, 2 * (size_t)D);
        const void *shift_mlp = ditd_ptr_act(ops, m->mod, 3 * (size_t)D);
        const void *scale_mlp = ditd_ptr_act(ops, m->mod, 4 * (size_t)D);
        const void *gate_mlp = ditd_ptr_act(ops, m->mod, 5 * (size_t)D);

        /* adaLN-Zero: mod (B, 6D) = Linear(SiLU(cond)) =
         *   [shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp] */
        block_conditioning(m, b, B, h_y, cond);
        ops->act(cond, m->temb, (size_t)B * (size_t)D, DITD_ACT_SILU);
        ops->linear(m->temb, (size_t)D, b->ada_w, b->ada_b, m->mod, ld6, B, 6 * D, D, DITD_ACT_NONE);

        /* attention: h += gate_msa * Attn(LN(h) * (1 + scale_msa) + shift_msa) */
        ops->layernorm_modulate(m->h, m->xn, B, N, D, ADA_EPS, shift_msa, scale_msa, ld6);
        self_attention(m, b, B);
        ops->gated_residual(m->h, m->xn, B, N, D, gate_msa, ld6);

        /* MLP: h += gate_mlp * FF(LN(h) * (1 + scale_mlp) + shift_mlp),
         *   FF = Linear(F -> D) . GELU(tanh) . Linear(D -> F) */
        ops->layernorm_modulate(m->h, m->xn, B, N, D, c->norm_eps, shift_mlp, scale_mlp, ld6);
        ops->linear(m->xn, (size_t)D, b->ff1_w, b->ff1_b, m->ff, (size_t)F, M, F, D,
                    c->activation);
        ops->linear(m->ff, (size_t)F, b->ff2_w, b->ff2_b, m->xn, (size_t)D, M, D, F, DITD_ACT_NONE);
        ops->gated_residual(m->h, m->xn, B, N, D, gate_mlp, ld6);
    }

    /* final layer, conditioned on block 0's embedding as in Diffusers:
     *   [shift, scale] (B, 2D) = proj_out_1(SiLU(cond0));
     *   tokens (B, N, p*p*Co) = proj_out_2(LN(h) * (1 + scale) + shift) */
    ops->act(m->cond0, m->temb, (size_t)B * (size_t)D, DITD_ACT_SILU);
    ops->linear(m->temb, (size_t)D, m->out1_w, m->out1_b, m->mod, 2 * (size_t)D, B, 2 * D, D,
                DITD_ACT_NONE);
    ops->layernorm_modulate(m->h, m->xn, B, N, D, ADA_EPS, m->mod,
                            ditd_ptr_act(ops, m->mod, (size_t)D), 2 * (size_t)D);
    ops->linear(m->xn, (size_t)D, m->out2_w, m->out2_b, m->tok_out, (size_t)po, M, po, D,
                DITD_ACT_NONE);
    /* unpatchify: (B, gh*gw, p*p*Co) -> (B, Co, S, S) */
    ops->unpatchify(m->tok_out, out, B, c->out_channels, m->gh, m->gw, p);
    return 0;
}
