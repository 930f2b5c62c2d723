/* Diffusers FluxTransformer2DModel: loading and planning (the forward is
 * flux_forward.c). */
#include "engine/models/flux/flux.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/error.h"
#include "engine/io/weights.h"
#include "kernels/cpu/rope.h"

#define TFREQ 256 /* Timesteps(num_channels=256) of CombinedTimestep*TextProjEmbeddings */

/* ---- planning: the same carve sequence runs twice (count, then hand out) ---- */

static int carve(ditd_arena *a, void **p, ditd_dtype dt, size_t n)
{
    int err;
    *p = ditd_arena_bytes(a, n * ditd_dtype_size(dt), &err);
    return err;
}

static int carve_lin(ditd_arena *a, ditd_flux_lin *l, ditd_dtype dt, size_t n, size_t k)
{
    return carve(a, &l->w, dt, n * k) | carve(a, &l->b, dt, n);
}

/* Where a linear's weight comes from in the file: each part `rows` x `K`
 * there; under tp a row-parallel layer keeps only some columns (ncols
 * ranges [c0, c0 + cn), side by side), a column-parallel one some rows (the
 * loader's slice). NULL in carve_qlin: the whole tensor. */
typedef struct qsrc {
    size_t rows, K;
    int ncols;
    size_t c0[2], cn[2];
} qsrc;

/* Whether the linear whose weight is the row concatenation of parts (each
 * "<name>.weight") stays in its GGML blocks: every part so stored, one
 * type, on a backend with linear_q in host memory (the CPU), and each
 * column range a tp rank keeps made of whole blocks (else the weight is
 * dequantized at load). Then l->q says how (data set by carve_qlin). */
static int quant_plan(const ditd_flux *m, ditd_flux_lin *l, size_t N, size_t K, int nparts,
                      const char *const *parts, const qsrc *src)
{
    memset(&l->q, 0, sizeof l->q);
    if (!m->src || !m->ops->linear_q || m->ops->device != DITD_DEVICE_CPU)
        return 0;
    const qsrc whole = {.rows = N / (size_t)nparts, .K = K};
    if (!src)
        src = &whole;
    int type = -1;
    size_t rb = 0;
    for (int i = 0; i < nparts; i++) {
        char name[256];
        int t;
        size_t r;
        snprintf(name, sizeof name, "%s.weight", parts[i]);
        if (!ditd_weights_quant(m->src, name, (int64_t)src->rows, (int64_t)src->K, &t, &r) ||
            (type >= 0 && t != type))
            return 0;
        type = t;
        rb = r;
    }
    if (src->ncols) {
        int elems = 0, bytes = 0;
        size_t kept = 0;
        ditd_gguf_type_block((ditd_gguf_type)type, &elems, &bytes);
        rb = 0;
        for (int i = 0; i < src->ncols; i++) {
            if (src->c0[i] % (size_t)elems || src->cn[i] % (size_t)elems)
                return 0; /* a tp rank's columns would cut blocks */
            rb += src->cn[i] / (size_t)elems * (size_t)bytes;
            kept += src->cn[i];
        }
        if (kept != K)
            return 0;
    }
    l->q = (ditd_qweight){.type = type, .N = (int)N, .K = (int)K, .row_bytes = rb};
    return 1;
}

/* carve_lin, or the blocks of a quantized weight (quant_plan) and a dense
 * bias. parts: printf formats of the parts' names, with the block index. */
static int carve_qlin(ditd_flux *m, ditd_arena *a, ditd_flux_lin *l, ditd_dtype dt, size_t n,
                      size_t k, int layer, int nparts, const char *const *fmts, const qsrc *src)
{
    char names[3][256];
    const char *parts[3];
    for (int i = 0; i < nparts; i++) {
        snprintf(names[i], sizeof names[i], fmts[i], layer);
        parts[i] = names[i];
    }
    if (!quant_plan(m, l, n, k, nparts, parts, src))
        return carve_lin(a, l, dt, n, k);
    int err;
    l->w = ditd_arena_bytes(a, n * l->q.row_bytes, &err);
    l->q.data = l->w;
    return err | carve(a, &l->b, dt, n);
}

#define QLIN1(l, n, k, layer, fmt) carve_qlin(m, a, (l), wt, (n), (k), (layer), 1, \
                                              (const char *const[]){fmt}, NULL)
#define QLINS(l, n, k, layer, fmt, ...) carve_qlin(m, a, (l), wt, (n), (k), (layer), 1, \
                                                   (const char *const[]){fmt}, &(qsrc){__VA_ARGS__})

static int carve_weights(ditd_flux *m)
{
    const ditd_flux_config *c = &m->cfg;
    size_t D = (size_t)c->inner_dim, Dh = (size_t)c->head_dim;
    size_t A = (size_t)m->A, F = (size_t)m->fc; /* this tp rank's */
    size_t a0 = (size_t)m->h0 * Dh, f0 = (size_t)m->f0, FF = (size_t)c->mlp_dim;
    ditd_dtype wt = m->ops->weight_dtype;
    ditd_arena *a = &m->weights;
    int err = 0;
    /* the file's shapes of the tp-split layers (rows: this rank's slice) */
    const qsrc qkv_src = {.rows = D, .K = D}, up_src = {.rows = FF, .K = D};

    err |= carve_lin(a, &m->x_emb, wt, D, (size_t)c->in_channels);
    err |= QLIN1(&m->ctx_emb, D, (size_t)c->joint_attention_dim, 0, "context_embedder");
    err |= QLIN1(&m->t1, D, TFREQ, 0, "time_text_embed.timestep_embedder.linear_1");
    err |= QLIN1(&m->t2, D, D, 0, "time_text_embed.timestep_embedder.linear_2");
    if (c->guidance_embeds) {
        err |= QLIN1(&m->g1, D, TFREQ, 0, "time_text_embed.guidance_embedder.linear_1");
        err |= QLIN1(&m->g2, D, D, 0, "time_text_embed.guidance_embedder.linear_2");
    }
    err |= QLIN1(&m->p1, D, (size_t)c->pooled_dim, 0, "time_text_embed.text_embedder.linear_1");
    err |= QLIN1(&m->p2, D, D, 0, "time_text_embed.text_embedder.linear_2");
    err |= QLIN1(&m->norm_out, 2 * D, D, 0, "norm_out.linear");
    err |= carve_lin(a, &m->proj, wt, (size_t)c->out_channels, D);
    for (int l = 0; l < c->num_layers; l++) {
        ditd_flux_double *b = &m->dbl[l];
        static const char *const qkv[3] = {"transformer_blocks.%d.attn.to_q",
                                           "transformer_blocks.%d.attn.to_k",
                                           "transformer_blocks.%d.attn.to_v"};
        static const char *const qkv_c[3] = {"transformer_blocks.%d.attn.add_q_proj",
                                             "transformer_blocks.%d.attn.add_k_proj",
                                             "transformer_blocks.%d.attn.add_v_proj"};
        err |= QLIN1(&b->ada, 6 * D, D, l, "transformer_blocks.%d.norm1.linear");
        err |= QLIN1(&b->ada_c, 6 * D, D, l, "transformer_blocks.%d.norm1_context.linear");
        err |= carve_qlin(m, a, &b->qkv, wt, 3 * A, D, l, 3, qkv, &qkv_src);
        err |= carve_qlin(m, a, &b->qkv_c, wt, 3 * A, D, l, 3, qkv_c, &qkv_src);
        err |= carve(a, &b->nq, wt, Dh) | carve(a, &b->nk, wt, Dh);
        err |= carve(a, &b->nq_c, wt, Dh) | carve(a, &b->nk_c, wt, Dh);
        err |= QLINS(&b->out, D, A, l, "transformer_blocks.%d.attn.to_out.0", .rows = D, .K = D,
                     .ncols = 1, .c0 = {a0}, .cn = {A});
        err |= QLINS(&b->out_c, D, A, l, "transformer_blocks.%d.attn.to_add_out", .rows = D,
                     .K = D, .ncols = 1, .c0 = {a0}, .cn = {A});
        err |= QLINS(&b->ff1, F, D, l, "transformer_blocks.%d.ff.net.0.proj", .rows = FF, .K = D);
        err |= QLINS(&b->ff2, D, F, l, "transformer_blocks.%d.ff.net.2", .rows = D, .K = FF,
                     .ncols = 1, .c0 = {f0}, .cn = {F});
        err |= QLINS(&b->ff1_c, F, D, l, "transformer_blocks.%d.ff_context.net.0.proj",
                     .rows = FF, .K = D);
        err |= QLINS(&b->ff2_c, D, F, l, "transformer_blocks.%d.ff_context.net.2", .rows = D,
                     .K = FF, .ncols = 1, .c0 = {f0}, .cn = {F});
    }
    for (int l = 0; l < c->num_single_layers; l++) {
        ditd_flux_single *b = &m->sgl[l];
        static const char *const qkv[3] = {"single_transformer_blocks.%d.attn.to_q",
                                           "single_transformer_blocks.%d.attn.to_k",
                                           "single_transformer_blocks.%d.attn.to_v"};
        err |= QLIN1(&b->ada, 3 * D, D, l, "single_transformer_blocks.%d.norm.linear");
        err |= carve_qlin(m, a, &b->qkv, wt, 3 * A, D, l, 3, qkv, &qkv_src);
        err |= carve(a, &b->nq, wt, Dh) | carve(a, &b->nk, wt, Dh);
        err |= carve_qlin(m, a, &b->mlp, wt, F, D, l, 1,
                          (const char *const[]){"single_transformer_blocks.%d.proj_mlp"}, &up_src);
        /* (D, D + FF) in the file; this rank's attention then MLP columns */
        err |= QLINS(&b->out, D, A + F, l, "single_transformer_blocks.%d.proj_out", .rows = D,
                     .K = D + FF, .ncols = 2, .c0 = {a0, D + f0}, .cn = {A, F});
    }
    return err ? DITD_ENOMEM : 0;
}

static int carve_acts(ditd_flux *m)
{
    const ditd_flux_config *c = &m->cfg;
    size_t B = (size_t)m->max_batch, N = (size_t)m->N, Nl = (size_t)m->n_loc, L = (size_t)m->l_loc;
    size_t D = (size_t)c->inner_dim, Dh = (size_t)c->head_dim;
    size_t A = (size_t)m->A, F = (size_t)m->fc;
    size_t Ci = (size_t)c->in_channels, Co = (size_t)c->out_channels;
    ditd_dtype at = m->ops->act_dtype;
    ditd_arena *a = &m->acts;
    int err = 0;

    err |= carve(a, &m->img, at, B * Nl * D) | carve(a, &m->txt, at, B * L * D);
    err |= carve(a, &m->xn, at, B * Nl * D) | carve(a, &m->tn, at, B * L * D);
    err |= carve(a, &m->qkv, at, B * Nl * 3 * A) | carve(a, &m->pqkv, at, B * L * 3 * A);
    err |= carve(a, &m->cat, at, B * Nl * (A + F)) | carve(a, &m->pcat, at, B * L * (A + F));
    err |= carve(a, &m->text_in, at, B * L * (size_t)c->joint_attention_dim);
    err |= carve(a, &m->pooled_in, at, B * (size_t)c->pooled_dim);
    err |= carve(a, &m->tfreq, at, B * TFREQ);
    err |= carve(a, &m->tmp, at, B * D) | carve(a, &m->vec, at, B * D);
    err |= carve(a, &m->svec, at, B * D);
    err |= carve(a, &m->mod, at, B * 6 * D) | carve(a, &m->mod_c, at, B * 6 * D);
    /* the RoPE table stays fp32 on every backend, as Diffusers keeps it */
    err |= carve(a, &m->rope_cos, DITD_DTYPE_F32, N * Dh / 2) |
           carve(a, &m->rope_sin, DITD_DTYPE_F32, N * Dh / 2);
    err |= carve(a, &m->scratch, at, B * N * Ci);
    err |= carve(a, &m->tok_out, at, B * N * Co);
    if (m->lay.ring * m->lay.ulysses > 1) {
        err |= carve(a, &m->embed, at, B * N * D);
        err |= carve(a, &m->tok_loc, at, B * Nl * Co);
        err |= carve(a, &m->tok_gath, at, B * N * Co);
        err |= carve(a, &m->jqkv, at, B * (L + Nl) * 3 * A);
        err |= carve(a, &m->jo, at, B * (L + Nl) * A);
    }
    return err ? DITD_ENOMEM : 0;
}

/* The RoPE table of the image tokens: ids (0, row, col) of each packed
 * token, as FluxPipeline._prepare_latent_image_ids. */
static int rope_tables(ditd_flux *m)
{
    size_t N = (size_t)m->N, half = (size_t)m->cfg.head_dim / 2;
    float *ids = malloc(N * 3 * sizeof(float));
    float *cs = malloc(2 * N * half * sizeof(float));
    if (!ids || !cs) {
        free(ids);
        free(cs);
        return ditd_err_set(DITD_ENOMEM, "RoPE table of %zu tokens", N);
    }
    for (int r = 0; r < m->gh; r++)
        for (int col = 0; col < m->gw; col++) {
            float *id = ids + ((size_t)r * (size_t)m->gw + (size_t)col) * 3;
            id[0] = 0.0f;
            id[1] = (float)r;
            id[2] = (float)col;
        }
    ditd_cpu_rope_table(ids, (int)N, DITD_FLUX_AXES, m->cfg.axes_dims, 10000.0, cs, cs + N * half);
    m->ops->upload_f32(m->rope_cos, cs, N * half);
    m->ops->upload_f32(m->rope_sin, cs + N * half, N * half);
    free(ids);
    free(cs);
    return 0;
}

/* The parallel plan and the activations for the current (h, w, L): the
 * split of the text and image tokens, the attention, every buffer, the RoPE table.
 * Run at load and again by ditd_flux_set_size (the old ones freed first). */
static int plan_acts(ditd_flux *m)
{
    const ditd_flux_config *c = &m->cfg;
    int err;
    ditd_cp_attention_free(m->cpa);
    m->cpa = NULL;
    ditd_arena_free(&m->acts);
    int RU = m->lay.ring * m->lay.ulysses;
    if (RU > 1) {
        /* the joint attention over every cp rank's [text slice; image slice],
         * no prefix (Diffusers' _cp_plan splits both streams) */
        int s = m->mesh->ring_rank * m->lay.ulysses + m->mesh->ulysses_rank, toff, tcnt;
        for (int j = 0; j < RU; j++) {
            ditd_split(m->N, RU, j, &m->ioff[j], &m->icnt[j]);
            ditd_split(m->L, RU, j, &toff, &tcnt);
            m->jcnt[j] = tcnt + m->icnt[j];
            m->jlead[j] = tcnt;
            if (j == s) {
                m->txt0 = toff;
                m->l_loc = tcnt;
            }
        }
        /* lead: each rank's text slice comes first (ulysses alone then
         * attends segment-wise, the bits of one rank's text prefix path) */
        if ((err = ditd_cp_attention_new_counts(m->ops, m->mesh, m->max_batch, m->jcnt, m->jlead,
                                                m->hc, c->head_dim, &m->cpa)))
            return err;
        m->n_loc = m->icnt[s];
        m->tok0 = m->ioff[s];
    } else {
        /* one rank (or tp alone): the whole text is the attention's prefix */
        if ((err = ditd_cp_attention_new(m->ops, m->mesh, m->max_batch, m->N, m->L, m->hc,
                                         c->head_dim, &m->cpa)))
            return err;
        m->n_loc = m->cpa->n_loc;
        m->tok0 = m->cpa->tok0;
        m->l_loc = m->L;
        m->txt0 = 0;
    }
    if ((err = carve_acts(m)) || (err = ditd_arena_commit(&m->acts, m->acts.peak_plan)) ||
        (err = carve_acts(m)))
        return err;
    return rope_tables(m);
}

static int plan(ditd_flux *m, const ditd_mesh *mesh)
{
    int err;
    m->mesh = mesh && mesh->size > 1 ? mesh : NULL;
    m->lay = m->mesh ? mesh->layout : DITD_LAYOUT_SINGLE;
    if (m->mesh && (err = ditd_layout_check_attention(&m->lay, m->cfg.num_heads, m->N)))
        return err;
    /* tp: this rank's heads and MLP columns, as evenly as they go */
    m->tp_rank = m->mesh ? mesh->tp_rank : 0;
    ditd_split(m->cfg.num_heads, m->lay.tp, m->tp_rank, &m->h0, &m->hc);
    ditd_split(m->cfg.mlp_dim, m->lay.tp, m->tp_rank, &m->f0, &m->fc);
    m->A = m->hc * m->cfg.head_dim;
    int RU = m->lay.ring * m->lay.ulysses;
    if (!(m->cnt_a = calloc(6 * (size_t)RU, sizeof(int))) ||
        !(m->h_freq = malloc((size_t)m->max_batch * TFREQ * sizeof(float))))
        return ditd_err_set(DITD_ENOMEM, "FLUX plan");
    m->dsp_a = m->cnt_a + RU;
    m->icnt = m->dsp_a + RU;
    m->ioff = m->icnt + RU;
    m->jcnt = m->ioff + RU;
    m->jlead = m->jcnt + RU;
    if ((err = carve_weights(m)) || (err = ditd_arena_commit(&m->weights, m->weights.peak_plan)) ||
        (err = carve_weights(m)))
        return err;
    return plan_acts(m);
}

/* (height, width, text_len) checked; m's sizes and shapes set to them. */
static int set_sizes(ditd_flux *m, int height, int width, int text_len)
{
    if (height <= 0 || width <= 0 || height % 2 || width % 2 || height > 16384 || width > 16384)
        return ditd_err_set(DITD_EINVAL,
                            "FLUX latent size %dx%d: width and height must be positive and even (2x2 packing)",
                            width, height);
    if (text_len <= 0 || text_len > 65536)
        return ditd_err_set(DITD_EINVAL, "FLUX text length %d (1..65536)", text_len);
    m->h = height;
    m->w = width;
    m->gh = height / 2;
    m->gw = width / 2;
    m->N = m->gh * m->gw;
    m->L = text_len;
    ditd_flux_shapes(&m->cfg, height, width, text_len, &m->base.shapes);
    return 0;
}

int ditd_flux_set_size(ditd_flux *m, int height, int width, int text_len)
{
    int err;
    if (m->cpa && height == m->h && width == m->w && text_len == m->L)
        return 0;
    /* the layout against the new token count first: a refusal leaves the
     * model as it was */
    if (m->mesh && (err = ditd_layout_check_attention(&m->lay, m->cfg.num_heads,
                                                      (height / 2) * (width / 2))))
        return err;
    if ((err = set_sizes(m, height, width, text_len)))
        return err;
    return plan_acts(m);
}

void ditd_flux_free(ditd_flux *m)
{
    if (!m)
        return;
    ditd_arena_free(&m->weights);
    ditd_arena_free(&m->acts);
    ditd_cp_attention_free(m->cpa);
    free(m->dbl);
    free(m->sgl);
    free(m->cnt_a);
    free(m->h_freq);
    free(m);
}

size_t ditd_flux_weight_bytes(const ditd_flux *m)
{
    return m->weights.size;
}

size_t ditd_flux_act_bytes(const ditd_flux *m)
{
    return m->acts.size + (m->cpa ? ditd_cp_attention_bytes(m->cpa) : 0);
}

void ditd_flux_shapes(const ditd_flux_config *c, int height, int width, int text_len,
                      ditd_denoiser_shapes *out)
{
    memset(out, 0, sizeof *out);
    out->in_channels = c->latent_channels;
    out->out_channels = c->out_channels / 4;
    out->height = height;
    out->width = width;
    out->heads = c->num_heads;
    out->head_dim = c->head_dim;
    out->tokens = (height / 2) * (width / 2);
    out->prefix_tokens = text_len;
    out->guidance_embed = c->guidance_embeds;
    out->latent_multiple = 2; /* 2x2 packing */
    out->cond.kind = DITD_COND_TEXT;
    out->cond.text_len = text_len;
    out->cond.text_dim = c->joint_attention_dim;
    out->cond.pooled_dim = c->pooled_dim;
}

/* ---- loading ---- */

typedef struct loader {
    const ditd_weights *st;
    const ditd_backend_ops *ops;
    float *stage;
    size_t cap;
    char name[256];
} loader;

/* Reads tensor `name` of shape (d0[, d1]) into host staging. */
static int stage(loader *ld, int64_t d0, int64_t d1)
{
    size_t n = (size_t)d0 * (size_t)(d1 > 0 ? d1 : 1);
    if (n > ld->cap) {
        float *s = realloc(ld->stage, n * sizeof(float));
        if (!s)
            return ditd_err_set(DITD_ENOMEM, "staging %zu floats for %s", n, ld->name);
        ld->stage = s;
        ld->cap = n;
    }
    int64_t shape[2] = {d0, d1};
    return ditd_weights_read_f32(ld->st, ld->name, d1 > 0 ? 2 : 1, shape, ld->stage);
}

/* dst := tensor (d0[, d1]); d1 = 0 for a vector. */
static int get(loader *ld, void *dst, int64_t d0, int64_t d1)
{
    int err = stage(ld, d0, d1);
    if (!err)
        ld->ops->upload_weight(dst, ld->stage, (size_t)d0 * (size_t)(d1 > 0 ? d1 : 1));
    return err;
}

/* dst := the slice [start, start + len) along `axis` of the 2-D tensor
 * (d0, d1) (a tp rank's rows or columns), or of the vector (d0) when d1 = 0;
 * into `to` (host) instead of uploading when to != NULL. */
static int get_slice(loader *ld, void *dst, int64_t d0, int64_t d1, int axis, int64_t start,
                     int64_t len, float *to)
{
    int64_t shape[2] = {d0, d1};
    int nd = d1 > 0 ? 2 : 1;
    size_t n = (size_t)(axis == 0 ? len : d0) * (size_t)(nd == 2 ? (axis == 1 ? len : d1) : 1);
    if (!to && n > ld->cap) {
        float *s = realloc(ld->stage, n * sizeof(float));
        if (!s)
            return ditd_err_set(DITD_ENOMEM, "staging %zu floats for %s", n, ld->name);
        ld->stage = s;
        ld->cap = n;
    }
    float *buf = to ? to : ld->stage;
    int err = start == 0 && len == shape[axis]
                  ? ditd_weights_read_f32(ld->st, ld->name, nd, shape, buf)
                  : ditd_weights_read_f32_slice(ld->st, ld->name, nd, shape, axis, start, len,
                                                    buf);
    if (!err && !to)
        ld->ops->upload_weight(dst, buf, n);
    return err;
}

/* A weight kept in its blocks, row-parallel under tp: of the file's
 * (N, Ksrc) tensor `name`, every row's block columns [c0[i], c0[i] + cn[i])
 * side by side into dst (rows of the carved row bytes). */
static int qcols(const ditd_weights *st, const char *name, int64_t N, int64_t Ksrc, int nr,
                 const int64_t *c0, const int64_t *cn, void *dst)
{
    int type, elems = 0, bytes = 0;
    size_t rb;
    if (!ditd_weights_quant(st, name, N, Ksrc, &type, &rb))
        return ditd_err_set(DITD_EINTERNAL, "%s: no longer in GGML blocks", name);
    ditd_gguf_type_block((ditd_gguf_type)type, &elems, &bytes);
    uint8_t *tmp = malloc((size_t)N * rb);
    if (!tmp)
        return ditd_err_set(DITD_ENOMEM, "staging %s", name);
    int err = ditd_weights_rows(st, name, 0, N, tmp);
    uint8_t *o = dst;
    for (int64_t r = 0; !err && r < N; r++)
        for (int i = 0; i < nr; i++) {
            size_t n = (size_t)(cn[i] / elems) * (size_t)bytes;
            memcpy(o, tmp + (size_t)r * rb + (size_t)(c0[i] / elems) * (size_t)bytes, n);
            o += n;
        }
    free(tmp);
    return err;
}

#define NAME(...) snprintf(ld.name, sizeof ld.name, __VA_ARGS__)
#define GET(dst, d0, d1, ...)                            \
    do {                                                 \
        NAME(__VA_ARGS__);                               \
        if ((err = get(&ld, (dst), (d0), (d1))))         \
            goto done;                                   \
    } while (0)
/* a Linear "<prefix>.weight" (n, k) and "<prefix>.bias" (n) */
#define LIN(l, n, k, ...)                                \
    do {                                                 \
        char pre_[200];                                  \
        snprintf(pre_, sizeof pre_, __VA_ARGS__);        \
        if ((l).q.data) {                                \
            NAME("%s.weight", pre_);                     \
            if ((err = ditd_weights_rows(st, ld.name, 0, (n), (l).w))) \
                goto done;                               \
        } else {                                         \
            GET((l).w, (n), (k), "%s.weight", pre_);     \
        }                                                \
        GET((l).b, (n), 0, "%s.bias", pre_);             \
    } while (0)
/* a weight kept in its GGML blocks: rows [start, start + len) copied (a
 * column-parallel rank's rows) */
#define QROWS(l, start, len)                                                      \
    ((l).q.data ? ditd_weights_rows(st, ld.name, (start), (len), (l).w) : 1)

/* column-parallel Linear (n, k): rows [start, start + len) of weight and bias */
#define COL(l, n, k, start, len, ...)                                             \
    do {                                                                          \
        char pre_[200];                                                           \
        snprintf(pre_, sizeof pre_, __VA_ARGS__);                                 \
        NAME("%s.weight", pre_);                                                  \
        if ((err = QROWS(l, (start), (len))) == 1)                                \
            err = get_slice(&ld, (l).w, (n), (k), 0, (start), (len), NULL);       \
        if (err)                                                                  \
            goto done;                                                            \
        NAME("%s.bias", pre_);                                                    \
        if ((err = get_slice(&ld, (l).b, (n), 0, 0, (start), (len), NULL)))       \
            goto done;                                                            \
    } while (0)
/* row-parallel Linear (n, k): weight columns [start, start + len), the whole bias */
#define ROW(l, n, k, start, len, ...)                                             \
    do {                                                                          \
        char pre_[200];                                                           \
        snprintf(pre_, sizeof pre_, __VA_ARGS__);                                 \
        NAME("%s.weight", pre_);                                                  \
        if ((l).q.data)                                                           \
            err = qcols(st, ld.name, (n), (k), 1, (int64_t[]){(start)},           \
                        (int64_t[]){(len)}, (l).w);                               \
        else                                                                      \
            err = get_slice(&ld, (l).w, (n), (k), 1, (start), (len), NULL);       \
        if (err)                                                                  \
            goto done;                                                            \
        GET((l).b, (n), 0, "%s.bias", pre_);                                      \
    } while (0)

/* The single blocks' proj_out (D, D + F), row-parallel in its two packed
 * input blocks: this rank's attention columns [a0, a0 + A) then its MLP
 * columns [D + f0, D + f0 + Fl), side by side: (D, A + Fl). */
static int get_packed(loader *ld, void *dst, int64_t D, int64_t F, int64_t a0, int64_t A,
                      int64_t f0, int64_t Fl)
{
    float *pa = malloc((size_t)(D * A) * sizeof(float));
    float *pf = malloc((size_t)(D * Fl) * sizeof(float));
    float *all = malloc((size_t)(D * (A + Fl)) * sizeof(float));
    int err;
    if (!pa || !pf || !all) {
        err = ditd_err_set(DITD_ENOMEM, "staging %s", ld->name);
        goto out;
    }
    if ((err = get_slice(ld, NULL, D, D + F, 1, a0, A, pa)) ||
        (err = get_slice(ld, NULL, D, D + F, 1, D + f0, Fl, pf)))
        goto out;
    for (int64_t r = 0; r < D; r++) {
        memcpy(all + r * (A + Fl), pa + r * A, (size_t)A * sizeof(float));
        memcpy(all + r * (A + Fl) + A, pf + r * Fl, (size_t)Fl * sizeof(float));
    }
    ld->ops->upload_weight(dst, all, (size_t)(D * (A + Fl)));
out:
    free(pa);
    free(pf);
    free(all);
    return err;
}

/* Part j of a fused q|k|v linear (rows [j A, (j + 1) A) of (3A, K)): its
 * weight rows (values, or blocks when kept quantized) and bias. */
static ditd_flux_lin part_of(const ditd_backend_ops *ops, const ditd_flux_lin *l, int j,
                             int64_t A, int64_t K)
{
    ditd_flux_lin p = *l;
    p.w = l->q.data ? (void *)((uint8_t *)l->w + (size_t)(j * A) * l->q.row_bytes)
                    : ditd_ptr_w(ops, l->w, (size_t)(j * A * K));
    p.q.data = l->q.data ? p.w : NULL;
    p.b = ditd_ptr_w(ops, l->b, (size_t)(j * A));
    return p;
}

static int load_weights(ditd_flux *m, const ditd_weights *st)
{
    const ditd_flux_config *c = &m->cfg;
    const ditd_backend_ops *ops = m->ops;
    int64_t D = c->inner_dim, F = c->mlp_dim, Dh = c->head_dim, Co = c->out_channels;
    int64_t A = m->A, a0 = (int64_t)m->h0 * Dh, Fl = m->fc, f0 = m->f0; /* this tp rank's */
    loader ld = {.st = st, .ops = ops};
    int err = 0;

    LIN(m->x_emb, D, c->in_channels, "x_embedder");
    LIN(m->ctx_emb, D, c->joint_attention_dim, "context_embedder");
    LIN(m->t1, D, TFREQ, "time_text_embed.timestep_embedder.linear_1");
    LIN(m->t2, D, D, "time_text_embed.timestep_embedder.linear_2");
    if (c->guidance_embeds) {
        LIN(m->g1, D, TFREQ, "time_text_embed.guidance_embedder.linear_1");
        LIN(m->g2, D, D, "time_text_embed.guidance_embedder.linear_2");
    } else if (ditd_weights_has(st, "time_text_embed.guidance_embedder.linear_1.weight")) {
        err = ditd_err_set(DITD_EFORMAT,
                           "checkpoint has time_text_embed.guidance_embedder but config says guidance_embeds false");
        goto done;
    }
    LIN(m->p1, D, c->pooled_dim, "time_text_embed.text_embedder.linear_1");
    LIN(m->p2, D, D, "time_text_embed.text_embedder.linear_2");
    LIN(m->norm_out, 2 * D, D, "norm_out.linear");
    /* proj_out: rows (c, dy, dx) -> (dy, dx, c), the unpatchify op's order */
    {
        int64_t C = Co / 4;
        float *tmp = malloc((size_t)(Co * D) * sizeof(float));
        if (!tmp) {
            err = ditd_err_set(DITD_ENOMEM, "proj_out");
            goto done;
        }
        NAME("proj_out.weight");
        if (!(err = stage(&ld, Co, D))) {
            for (int64_t r = 0; r < Co; r++) /* r = ch*4 + q, q = dy*2 + dx */
                memcpy(tmp + ((r % 4) * C + r / 4) * D, ld.stage + r * D, (size_t)D * sizeof(float));
            ops->upload_weight(m->proj.w, tmp, (size_t)(Co * D));
            NAME("proj_out.bias");
            if (!(err = stage(&ld, Co, 0))) {
                for (int64_t r = 0; r < Co; r++)
                    tmp[(r % 4) * C + r / 4] = ld.stage[r];
                ops->upload_weight(m->proj.b, tmp, (size_t)Co);
            }
        }
        free(tmp);
        if (err)
            goto done;
    }
    for (int l = 0; l < c->num_layers; l++) {
        ditd_flux_double *b = &m->dbl[l];
        const char *qkv[3] = {"to_q", "to_k", "to_v"};
        const char *qkv_c[3] = {"add_q_proj", "add_k_proj", "add_v_proj"};
        LIN(b->ada, 6 * D, D, "transformer_blocks.%d.norm1.linear", l);
        LIN(b->ada_c, 6 * D, D, "transformer_blocks.%d.norm1_context.linear", l);
        for (int j = 0; j < 3; j++) { /* fused by rows: q, k, v (this rank's heads of each) */
            ditd_flux_lin part = part_of(ops, &b->qkv, j, A, D);
            ditd_flux_lin part_c = part_of(ops, &b->qkv_c, j, A, D);
            COL(part, D, D, a0, A, "transformer_blocks.%d.attn.%s", l, qkv[j]);
            COL(part_c, D, D, a0, A, "transformer_blocks.%d.attn.%s", l, qkv_c[j]);
        }
        GET(b->nq, Dh, 0, "transformer_blocks.%d.attn.norm_q.weight", l);
        GET(b->nk, Dh, 0, "transformer_blocks.%d.attn.norm_k.weight", l);
        GET(b->nq_c, Dh, 0, "transformer_blocks.%d.attn.norm_added_q.weight", l);
        GET(b->nk_c, Dh, 0, "transformer_blocks.%d.attn.norm_added_k.weight", l);
        ROW(b->out, D, D, a0, A, "transformer_blocks.%d.attn.to_out.0", l);
        ROW(b->out_c, D, D, a0, A, "transformer_blocks.%d.attn.to_add_out", l);
        COL(b->ff1, F, D, f0, Fl, "transformer_blocks.%d.ff.net.0.proj", l);
        ROW(b->ff2, D, F, f0, Fl, "transformer_blocks.%d.ff.net.2", l);
        COL(b->ff1_c, F, D, f0, Fl, "transformer_blocks.%d.ff_context.net.0.proj", l);
        ROW(b->ff2_c, D, F, f0, Fl, "transformer_blocks.%d.ff_context.net.2", l);
    }
    for (int l = 0; l < c->num_single_layers; l++) {
        ditd_flux_single *b = &m->sgl[l];
        const char *qkv[3] = {"to_q", "to_k", "to_v"};
        LIN(b->ada, 3 * D, D, "single_transformer_blocks.%d.norm.linear", l);
        for (int j = 0; j < 3; j++) {
            ditd_flux_lin part = part_of(ops, &b->qkv, j, A, D);
            COL(part, D, D, a0, A, "single_transformer_blocks.%d.attn.%s", l, qkv[j]);
        }
        GET(b->nq, Dh, 0, "single_transformer_blocks.%d.attn.norm_q.weight", l);
        GET(b->nk, Dh, 0, "single_transformer_blocks.%d.attn.norm_k.weight", l);
        COL(b->mlp, F, D, f0, Fl, "single_transformer_blocks.%d.proj_mlp", l);
        NAME("single_transformer_blocks.%d.proj_out.weight", l);
        if (b->out.q.data)
            err = qcols(st, ld.name, D, D + F, 2, (int64_t[]){a0, D + f0}, (int64_t[]){A, Fl},
                        b->out.w);
        else
            err = get_packed(&ld, b->out.w, D, F, a0, A, f0, Fl);
        if (err)
            goto done;
        GET(b->out.b, D, 0, "single_transformer_blocks.%d.proj_out.bias", l);
    }
    /* more blocks in the checkpoint than the config says would silently
     * drop layers: refuse */
    NAME("transformer_blocks.%d.norm1.linear.weight", c->num_layers);
    if (ditd_weights_has(st, ld.name))
        err = ditd_err_set(DITD_EFORMAT, "checkpoint has %s but config says num_layers %d",
                           ld.name, c->num_layers);
    NAME("single_transformer_blocks.%d.norm.linear.weight", c->num_single_layers);
    if (!err && ditd_weights_has(st, ld.name))
        err = ditd_err_set(DITD_EFORMAT, "checkpoint has %s but config says num_single_layers %d",
                           ld.name, c->num_single_layers);
done:
    free(ld.stage);
    return err;
}

/* Every weight the forward passes to linear, re-laid for the backend
 * (backend.h pack_linear), once all are loaded (qkv comes in three parts).
 * Not x_embedder: patch_embed reads it as a conv weight. */
static int pack_linears(ditd_flux *m)
{
    const ditd_flux_config *c = &m->cfg;
    const ditd_backend_ops *ops = m->ops;
    int D = c->inner_dim, A = m->A, F = m->fc;
    int err = 0;
#define PACK(l, n, k)                                               \
    do {                                                            \
        if ((l).q.data)                                             \
            m->quantized++; /* its blocks are read as they are */   \
        else if (!err)                                              \
            err = ditd_pack_linear(ops, (l).w, (int)(n), (int)(k)); \
    } while (0)
    PACK(m->ctx_emb, D, c->joint_attention_dim);
    PACK(m->t1, D, TFREQ);
    PACK(m->t2, D, D);
    if (c->guidance_embeds) {
        PACK(m->g1, D, TFREQ);
        PACK(m->g2, D, D);
    }
    PACK(m->p1, D, c->pooled_dim);
    PACK(m->p2, D, D);
    PACK(m->norm_out, 2 * D, D);
    PACK(m->proj, c->out_channels, D);
    for (int l = 0; l < c->num_layers; l++) {
        ditd_flux_double *b = &m->dbl[l];
        PACK(b->ada, 6 * D, D);
        PACK(b->ada_c, 6 * D, D);
        PACK(b->qkv, 3 * A, D);
        PACK(b->qkv_c, 3 * A, D);
        PACK(b->out, D, A);
        PACK(b->out_c, D, A);
        PACK(b->ff1, F, D);
        PACK(b->ff2, D, F);
        PACK(b->ff1_c, F, D);
        PACK(b->ff2_c, D, F);
    }
    for (int l = 0; l < c->num_single_layers; l++) {
        ditd_flux_single *b = &m->sgl[l];
        PACK(b->ada, 3 * D, D);
        PACK(b->qkv, 3 * A, D);
        PACK(b->mlp, F, D);
        PACK(b->out, D, A + F);
    }
#undef PACK
    return err;
}

int ditd_flux_new_mesh(const ditd_flux_config *cfg, const ditd_backend_ops *ops, int max_batch,
                       int height, int width, int text_len, const char *weights_path,
                       const ditd_mesh *mesh, ditd_flux **out)
{
    ditd_weights *st = NULL;
    ditd_flux *m;
    int bfl = 0;
    int err;

    if (max_batch <= 0 || max_batch > 4096)
        return ditd_err_set(DITD_EINVAL, "max batch %d (1..4096)", max_batch);
    if (!ops->rope || !ops->rmsnorm_heads || !ops->upload_f32)
        return ditd_err_set(DITD_EUNSUPPORTED,
                            "FluxTransformer2DModel needs the rope, rmsnorm_heads and upload_f32 ops, which the %s backend lacks yet",
                            ops->name);
    if (!(m = calloc(1, sizeof *m)))
        return ditd_err_set(DITD_ENOMEM, "FLUX model");
    m->cfg = *cfg;
    m->ops = ops;
    m->max_batch = max_batch;
    m->base.max_batch = max_batch;
    ditd_arena_init_mem(&m->weights, ops->mem_alloc, ops->mem_free);
    ditd_arena_init_mem(&m->acts, ops->mem_alloc, ops->mem_free);
    m->dbl = calloc((size_t)cfg->num_layers + 1, sizeof *m->dbl);
    m->sgl = calloc((size_t)cfg->num_single_layers + 1, sizeof *m->sgl);
    if (!m->dbl || !m->sgl) {
        err = ditd_err_set(DITD_ENOMEM, "FLUX blocks");
        goto fail;
    }
    /* the weights first: which linears stay quantized decides their sizes */
    if ((err = ditd_weights_open(weights_path, &st)) ||
        (err = ditd_flux_alias_bfl(st, cfg, &bfl)))
        goto fail;
    m->src = st;
    if ((err = set_sizes(m, height, width, text_len)) || (err = plan(m, mesh)) ||
        (err = load_weights(m, st)) || (err = pack_linears(m)))
        goto fail;
    m->src = NULL;
    ditd_weights_free(st);
    *out = m;
    return 0;
fail:
    ditd_weights_free(st);
    ditd_flux_free(m);
    return err;
}
