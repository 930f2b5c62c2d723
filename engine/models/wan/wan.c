/* Diffusers WanTransformer3DModel: loading and planning (the forward is
 * wan_forward.c). */
#include "engine/models/wan/wan.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/error.h"
#include "engine/io/safetensors.h"
#include "kernels/cpu/rope.h"

/* ---- planning: the same carve sequence runs twice (count, then hand out) ---- */

static int carve(ditd_arena *a, void **p, ditd_dtype dt, size_t n)
{
    int err;
    *p = ditd_arena_bytes(a, n * ditd_dtype_size(dt), &err);
    return err;
}

static int carve_lin(ditd_arena *a, ditd_wan_lin *l, ditd_dtype dt, size_t n, size_t k)
{
    return carve(a, &l->w, dt, n * k) | carve(a, &l->b, dt, n);
}

static int carve_weights(ditd_wan *m)
{
    const ditd_wan_config *c = &m->cfg;
    size_t D = (size_t)c->inner_dim, A = (size_t)m->A, F = (size_t)m->fc;
    size_t pp = (size_t)c->patch_h * (size_t)c->patch_w;
    ditd_dtype wt = m->ops->weight_dtype, at = m->ops->act_dtype;
    ditd_arena *a = &m->weights;
    int err = 0;

    err |= carve_lin(a, &m->patch, wt, D, (size_t)c->in_channels * pp);
    err |= carve_lin(a, &m->t1, wt, D, (size_t)c->freq_dim);
    err |= carve_lin(a, &m->t2, wt, D, D);
    err |= carve_lin(a, &m->tproj, wt, 6 * D, D);
    err |= carve_lin(a, &m->x1, wt, D, (size_t)c->text_dim);
    err |= carve_lin(a, &m->x2, wt, D, D);
    err |= carve(a, &m->sst_out, at, 2 * D);
    err |= carve_lin(a, &m->proj, wt, pp * (size_t)c->out_channels, D);
    if (c->image_dim) {
        size_t Di = (size_t)c->image_dim;
        err |= carve(a, &m->ie_n1w, at, Di) | carve(a, &m->ie_n1b, at, Di);
        err |= carve_lin(a, &m->ie_ff1, wt, Di, Di);
        err |= carve_lin(a, &m->ie_ff2, wt, D, Di);
        err |= carve(a, &m->ie_n2w, at, D) | carve(a, &m->ie_n2b, at, D);
        if (c->pos_embed_seq_len)
            err |= carve(a, &m->ie_pos, at, (size_t)c->pos_embed_seq_len * Di);
    }
    for (int l = 0; l < c->num_layers; l++) {
        ditd_wan_block *b = &m->blk[l];
        err |= carve(a, &b->sst, at, 6 * D);
        err |= carve_lin(a, &b->qkv, wt, 3 * A, D);
        err |= carve(a, &b->nq1, at, A) | carve(a, &b->nk1, at, A);
        err |= carve(a, &b->out1.w, wt, D * A) | carve(a, &b->out1.b, wt, D);
        if (c->cross_attn_norm)
            err |= carve(a, &b->n2w, at, D) | carve(a, &b->n2b, at, D);
        err |= carve_lin(a, &b->q2, wt, A, D);
        err |= carve_lin(a, &b->kv2, wt, 2 * A, D);
        err |= carve(a, &b->nq2, at, A) | carve(a, &b->nk2, at, A);
        if (c->image_dim)
            err |= carve_lin(a, &b->kvi, wt, 2 * A, D) | carve(a, &b->nki, at, A);
        err |= carve(a, &b->out2.w, wt, D * A) | carve(a, &b->out2.b, wt, D);
        err |= carve_lin(a, &b->ff1, wt, F, D);
        err |= carve(a, &b->ff2.w, wt, D * F) | carve(a, &b->ff2.b, wt, D);
    }
    return err ? DITD_ENOMEM : 0;
}

static int carve_acts(ditd_wan *m)
{
    const ditd_wan_config *c = &m->cfg;
    size_t B = (size_t)m->max_batch, N = (size_t)m->N, Nl = (size_t)m->n_loc, L = (size_t)m->L;
    size_t D = (size_t)c->inner_dim, A = (size_t)m->A, F = (size_t)m->fc;
    size_t BF = B * (size_t)m->F, pp = (size_t)c->patch_h * (size_t)c->patch_w;
    size_t Co = pp * (size_t)c->out_channels, half = (size_t)c->head_dim / 2;
    ditd_dtype at = m->ops->act_dtype;
    ditd_arena *a = &m->acts;
    int err = 0;

    err |= carve(a, &m->img, at, B * Nl * D) | carve(a, &m->xn, at, B * Nl * D);
    err |= carve(a, &m->qkv, at, B * Nl * 3 * A) | carve(a, &m->ao, at, B * Nl * A);
    err |= carve(a, &m->hid, at, B * Nl * F);
    err |= carve(a, &m->text_in, at, B * L * (size_t)c->text_dim);
    err |= carve(a, &m->ctx, at, B * L * D) | carve(a, &m->ctx_h, at, B * L * D);
    err |= carve(a, &m->kv, at, B * L * 2 * A);
    if (c->image_dim) {
        size_t Li = (size_t)m->Li, Di = (size_t)c->image_dim;
        err |= carve(a, &m->im_in, at, B * Li * Di) | carve(a, &m->im_h, at, B * Li * Di);
        err |= carve(a, &m->im_ctx, at, B * Li * D) | carve(a, &m->kvim, at, B * Li * 2 * A);
        err |= carve(a, &m->aoi, at, B * Nl * A);
    }
    size_t ssr = Nl > L ? Nl : L; /* rows of any qk_norm: tokens, text or image */
    ssr = ssr > (size_t)m->Li ? ssr : (size_t)m->Li;
    err |= carve(a, (void **)&m->ss, DITD_DTYPE_F32, B * ssr);
    err |= carve(a, &m->tfreq, at, BF * (size_t)c->freq_dim);
    err |= carve(a, &m->temb, at, BF * D) | carve(a, &m->stemb, at, BF * D);
    err |= carve(a, &m->tp6, at, BF * 6 * D) | carve(a, &m->mod, at, BF * 6 * D);
    err |= carve(a, &m->mod_out, at, BF * 2 * D);
    /* the RoPE table stays fp32 on every backend, as Diffusers keeps it */
    err |= carve(a, &m->rope_cos, DITD_DTYPE_F32, N * half) |
           carve(a, &m->rope_sin, DITD_DTYPE_F32, N * half);
    err |= carve(a, &m->scratch, at, B * N * (size_t)c->in_channels * pp);
    err |= carve(a, &m->tok_out, at, B * N * Co);
    if (m->lay.ring * m->lay.ulysses > 1) {
        err |= carve(a, &m->embed, at, B * N * D);
        err |= carve(a, &m->tok_loc, at, B * Nl * Co);
        err |= carve(a, &m->tok_gath, at, B * N * Co);
    }
    return err ? DITD_ENOMEM : 0;
}

/* WanRotaryPosEmbed's table: token (f, row, col) takes positions (f, row,
 * col) on the axes of t, h and w channels (get_1d_rotary_pos_embed per axis
 * in float64, concatenated). */
static int rope_tables(ditd_wan *m)
{
    size_t N = (size_t)m->N, half = (size_t)m->cfg.head_dim / 2;
    int dims[3] = {m->cfg.rope_t, m->cfg.rope_h, m->cfg.rope_w};
    float *ids = malloc(N * 3 * sizeof(float));
    float *cs = malloc(2 * N * half * sizeof(float));
    if (!ids || !cs) {
        free(ids);
        free(cs);
        return ditd_err_set(DITD_ENOMEM, "RoPE table of %zu tokens", N);
    }
    for (size_t n = 0; n < N; n++) {
        size_t f = n / (size_t)m->P, r = (n % (size_t)m->P) / (size_t)m->gw;
        ids[n * 3 + 0] = (float)f;
        ids[n * 3 + 1] = (float)r;
        ids[n * 3 + 2] = (float)(n % (size_t)m->gw);
    }
    ditd_cpu_rope_table(ids, (int)N, 3, dims, 10000.0, cs, cs + N * half);
    m->ops->upload_f32(m->rope_cos, cs, N * half);
    m->ops->upload_f32(m->rope_sin, cs + N * half, N * half);
    free(ids);
    free(cs);
    return 0;
}

/* The split of the video tokens, the attention, every buffer, the RoPE
 * table, for the current (F, h, w, L). At load and again by
 * ditd_wan_set_size (the old ones freed first). */
static int plan_acts(ditd_wan *m)
{
    int err, RU = m->lay.ring * m->lay.ulysses;
    ditd_cp_attention_free(m->cpa);
    m->cpa = NULL;
    ditd_arena_free(&m->acts);
    if ((err = ditd_cp_attention_new(m->ops, m->mesh, m->max_batch, m->N, 0, m->hc,
                                     m->cfg.head_dim, &m->cpa)))
        return err;
    m->n_loc = m->cpa->n_loc;
    m->tok0 = m->cpa->tok0;
    for (int j = 0; j < RU; j++)
        ditd_split(m->N, RU, j, &m->ioff[j], &m->icnt[j]);
    if ((err = carve_acts(m)) || (err = ditd_arena_commit(&m->acts, m->acts.peak_plan)) ||
        (err = carve_acts(m)))
        goto fail;
    if ((err = rope_tables(m)))
        goto fail;
    return 0;
fail:
    ditd_cp_attention_free(m->cpa);
    m->cpa = NULL;
    return err;
}

/* (frames, height, width, text_len) checked against the patch and the
 * RoPE; m's sizes and shapes set to them when `set`. */
static int check_sizes(const ditd_wan_config *c, int frames, int height, int width, int text_len)
{
    int p = c->patch_h, R = c->rope_max_seq_len;
    if (frames <= 0 || height <= 0 || width <= 0 || frames > 65536 || height > 16384 ||
        width > 16384 || height % p || width % p)
        return ditd_err_set(DITD_EINVAL,
                            "Wan latents of %d frames of %dx%d: positive, width and height multiples of the patch %d",
                            frames, width, height, p);
    if (frames > R || height / p > R || width / p > R)
        return ditd_err_set(DITD_EINVAL,
                            "Wan latents of %d frames of %dx%d patches: each at most rope_max_seq_len = %d",
                            frames, width / p, height / p, R);
    if ((long long)frames * (height / p) * (width / p) > (1 << 30))
        return ditd_err_set(DITD_EINVAL, "Wan latents of %d frames of %dx%d: too many tokens",
                            frames, width, height);
    if (text_len <= 0 || text_len > 65536)
        return ditd_err_set(DITD_EINVAL, "Wan text length %d (1..65536)", text_len);
    if (c->image_dim && text_len != DITD_WAN_IMAGE_TEXT_LEN)
        return ditd_err_set(DITD_EINVAL,
                            "Wan text length %d: a model with an image branch (image_dim) takes %d text tokens (WanAttnProcessor splits the context there)",
                            text_len, DITD_WAN_IMAGE_TEXT_LEN);
    return 0;
}

static void set_sizes(ditd_wan *m, int frames, int height, int width, int text_len)
{
    int p = m->cfg.patch_h;
    m->F = frames;
    m->h = height;
    m->w = width;
    m->gh = height / p;
    m->gw = width / p;
    m->P = m->gh * m->gw;
    m->N = frames * m->P;
    m->L = text_len;
    ditd_wan_shapes(&m->cfg, frames, height, width, text_len, &m->base.shapes);
}

static int plan(ditd_wan *m, const ditd_mesh *mesh)
{
    int err;
    m->mesh = mesh && mesh->size > 1 ? mesh : NULL;
    m->lay = m->mesh ? mesh->layout : DITD_LAYOUT_SINGLE;
    if (m->mesh && (err = ditd_layout_check_attention(&m->lay, m->cfg.num_heads, m->N)))
        return err;
    /* tp: this rank's heads and FFN columns, as evenly as they go */
    m->tp_rank = m->mesh ? mesh->tp_rank : 0;
    ditd_split(m->cfg.num_heads, m->lay.tp, m->tp_rank, &m->h0, &m->hc);
    ditd_split(m->cfg.ffn_dim, m->lay.tp, m->tp_rank, &m->f0, &m->fc);
    m->A = m->hc * m->cfg.head_dim;
    int RU = m->lay.ring * m->lay.ulysses;
    if (!(m->cnt_a = calloc(4 * (size_t)RU, sizeof(int))))
        return ditd_err_set(DITD_ENOMEM, "Wan plan");
    m->dsp_a = m->cnt_a + RU;
    m->icnt = m->dsp_a + RU;
    m->ioff = m->icnt + RU;
    if ((err = carve_weights(m)) || (err = ditd_arena_commit(&m->weights, m->weights.peak_plan)) ||
        (err = carve_weights(m)))
        return err;
    return 0;
}

/* The host buffers that follow the frame count (B F rows). */
static int plan_host(ditd_wan *m)
{
    size_t BF = (size_t)m->max_batch * (size_t)m->F;
    float *f = realloc(m->h_freq, BF * (size_t)m->cfg.freq_dim * sizeof(float));
    if (f)
        m->h_freq = f;
    float *t = f ? realloc(m->h_t, BF * sizeof(float)) : NULL;
    if (t)
        m->h_t = t;
    return f && t ? 0 : ditd_err_set(DITD_ENOMEM, "Wan timestep features");
}

int ditd_wan_set_size(ditd_wan *m, int frames, int height, int width, int text_len)
{
    int err, p = m->cfg.patch_h;
    if (m->cpa && frames == m->F && height == m->h && width == m->w && text_len == m->L)
        return 0;
    /* every check first: a refusal leaves the model as it was */
    if ((err = check_sizes(&m->cfg, frames, height, width, text_len)))
        return err;
    if (m->mesh && (err = ditd_layout_check_attention(&m->lay, m->cfg.num_heads,
                                                      frames * (height / p) * (width / p))))
        return err;
    set_sizes(m, frames, height, width, text_len);
    if ((err = plan_host(m)))
        return err;
    return plan_acts(m);
}

void ditd_wan_free(ditd_wan *m)
{
    if (!m)
        return;
    ditd_arena_free(&m->weights);
    ditd_arena_free(&m->acts);
    ditd_cp_attention_free(m->cpa);
    free(m->blk);
    free(m->cnt_a);
    free(m->h_freq);
    free(m->h_t);
    free(m);
}

size_t ditd_wan_weight_bytes(const ditd_wan *m)
{
    return m->weights.size;
}

size_t ditd_wan_act_bytes(const ditd_wan *m)
{
    return m->acts.size + (m->cpa ? ditd_cp_attention_bytes(m->cpa) : 0);
}

void ditd_wan_shapes(const ditd_wan_config *c, int frames, int height, int width, int text_len,
                     ditd_denoiser_shapes *out)
{
    memset(out, 0, sizeof *out);
    out->in_channels = c->in_channels;
    out->out_channels = c->out_channels;
    out->height = height;
    out->width = width;
    out->frames = frames;
    out->heads = c->num_heads;
    out->tokens = frames * (height / c->patch_h) * (width / c->patch_w);
    out->prefix_tokens = 0; /* the text is cross-attended, outside the split */
    out->latent_multiple = c->patch_h;
    out->cond.kind = DITD_COND_TEXT;
    out->cond.text_len = text_len;
    out->cond.text_dim = c->text_dim;
    out->cond.pooled_dim = 0;
}

/* ---- loading ---- */

typedef struct loader {
    const ditd_safetensors *st;
    const ditd_backend_ops *ops;
    float *stage;
    size_t cap;
    char name[256];
} loader;

/* dst := the slice [start, start + len) along `axis` of tensor ld->name of
 * shape (nd dims), the whole tensor when len < 0; as a weight (upload_weight)
 * or in the activation type (act: upload). `fix` (may be NULL) edits the
 * staged values first. */
static int get_x(loader *ld, void *dst, int nd, const int64_t *shape, int axis, int64_t start,
                 int64_t len, int act, void (*fix)(float *, size_t))
{
    size_t n = 1;
    for (int i = 0; i < nd; i++)
        n *= (size_t)(i == axis && len >= 0 ? len : shape[i]);
    if (n > ld->cap) {
        float *s = realloc(ld->stage, n * sizeof(float));
        if (!s)
            return ditd_err_set(DITD_ENOMEM, "staging %zu floats for %s", n, ld->name);
        ld->stage = s;
        ld->cap = n;
    }
    int err = len < 0 || (start == 0 && len == shape[axis])
                  ? ditd_safetensors_read_f32(ld->st, ld->name, nd, shape, ld->stage)
                  : ditd_safetensors_read_f32_slice(ld->st, ld->name, nd, shape, axis, start,
                                                    len, ld->stage);
    if (err)
        return err;
    if (fix)
        fix(ld->stage, n);
    if (act)
        ld->ops->upload(dst, ld->stage, n);
    else
        ld->ops->upload_weight(dst, ld->stage, n);
    return 0;
}

/* norm2's weight as the modulate op's scale: w - 1 (LN(x) (1 + (w - 1)) + b) */
static void minus_one(float *v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        v[i] -= 1.0f;
}

#define NAME(...) snprintf(ld.name, sizeof ld.name, __VA_ARGS__)
#define TRY(call)             \
    do {                      \
        if ((err = (call)))   \
            goto done;        \
    } while (0)

/* a whole Linear "<prefix>.weight" (n, k) and "<prefix>.bias" (n) */
static int lin_all(loader *ld, ditd_wan_lin *l, int64_t n, int64_t k, const char *pre)
{
    int64_t sw[2] = {n, k}, sb[1] = {n};
    int err;
    snprintf(ld->name, sizeof ld->name, "%s.weight", pre);
    if ((err = get_x(ld, l->w, 2, sw, 0, 0, -1, 0, NULL)))
        return err;
    snprintf(ld->name, sizeof ld->name, "%s.bias", pre);
    return get_x(ld, l->b, 1, sb, 0, 0, -1, 0, NULL);
}

/* column-parallel: rows [start, start + len) of weight and bias */
static int lin_col(loader *ld, ditd_wan_lin *l, int64_t n, int64_t k, int64_t start, int64_t len,
                   const char *pre)
{
    int64_t sw[2] = {n, k}, sb[1] = {n};
    int err;
    snprintf(ld->name, sizeof ld->name, "%s.weight", pre);
    if ((err = get_x(ld, l->w, 2, sw, 0, start, len, 0, NULL)))
        return err;
    snprintf(ld->name, sizeof ld->name, "%s.bias", pre);
    return get_x(ld, l->b, 1, sb, 0, start, len, 0, NULL);
}

/* row-parallel: weight columns [start, start + len), the whole bias */
static int lin_row(loader *ld, ditd_wan_lin *l, int64_t n, int64_t k, int64_t start, int64_t len,
                   const char *pre)
{
    int64_t sw[2] = {n, k}, sb[1] = {n};
    int err;
    snprintf(ld->name, sizeof ld->name, "%s.weight", pre);
    if ((err = get_x(ld, l->w, 2, sw, 1, start, len, 0, NULL)))
        return err;
    snprintf(ld->name, sizeof ld->name, "%s.bias", pre);
    return get_x(ld, l->b, 1, sb, 0, 0, -1, 0, NULL);
}

/* a vector (n) [start, start + len) in the activation type */
static int vec_act(loader *ld, void *dst, int64_t n, int64_t start, int64_t len,
                   void (*fix)(float *, size_t))
{
    int64_t s[1] = {n};
    return get_x(ld, dst, 1, s, 0, start, len, 1, fix);
}

static int load_weights(ditd_wan *m, const ditd_safetensors *st)
{
    const ditd_wan_config *c = &m->cfg;
    const ditd_backend_ops *ops = m->ops;
    int64_t D = c->inner_dim, FF = c->ffn_dim, p = c->patch_h, C = c->in_channels;
    int64_t Di = c->image_dim;
    int64_t A = m->A, a0 = (int64_t)m->h0 * c->head_dim, Fl = m->fc, f0 = m->f0;
    loader ld = {.st = st, .ops = ops};
    char pre[200];
    int err = 0;

    /* an image branch in the checkpoint the config does not declare */
    if (!Di && (ditd_safetensors_find(st, "condition_embedder.image_embedder.norm1.weight") ||
                ditd_safetensors_find(st, "blocks.0.attn2.add_k_proj.weight")))
        return ditd_err_set(DITD_EFORMAT,
                            "the checkpoint has an image branch (condition_embedder.image_embedder, attn2.add_k_proj) but the config has no image_dim");
    if (Di) {
        const char *ie = "condition_embedder.image_embedder";
        NAME("%s.norm1.weight", ie);
        TRY(vec_act(&ld, m->ie_n1w, Di, 0, -1, minus_one));
        NAME("%s.norm1.bias", ie);
        TRY(vec_act(&ld, m->ie_n1b, Di, 0, -1, NULL));
        snprintf(pre, sizeof pre, "%s.ff.net.0.proj", ie);
        TRY(lin_all(&ld, &m->ie_ff1, Di, Di, pre));
        snprintf(pre, sizeof pre, "%s.ff.net.2", ie);
        TRY(lin_all(&ld, &m->ie_ff2, D, Di, pre));
        NAME("%s.norm2.weight", ie);
        TRY(vec_act(&ld, m->ie_n2w, D, 0, -1, minus_one));
        NAME("%s.norm2.bias", ie);
        TRY(vec_act(&ld, m->ie_n2b, D, 0, -1, NULL));
        if (c->pos_embed_seq_len) {
            int64_t sp[3] = {1, c->pos_embed_seq_len, Di};
            NAME("%s.pos_embed", ie);
            TRY(get_x(&ld, m->ie_pos, 3, sp, 0, 0, -1, 1, NULL));
        } else if (NAME("%s.pos_embed", ie), ditd_safetensors_find(st, ld.name)) {
            err = ditd_err_set(DITD_EFORMAT,
                               "checkpoint has %s but config has no pos_embed_seq_len", ld.name);
            goto done;
        }
    }
    {
        int64_t s[5] = {D, C, 1, p, p}, sb[1] = {D};
        NAME("patch_embedding.weight");
        TRY(get_x(&ld, m->patch.w, 5, s, 0, 0, -1, 0, NULL));
        NAME("patch_embedding.bias");
        TRY(get_x(&ld, m->patch.b, 1, sb, 0, 0, -1, 0, NULL));
    }
    TRY(lin_all(&ld, &m->t1, D, c->freq_dim, "condition_embedder.time_embedder.linear_1"));
    TRY(lin_all(&ld, &m->t2, D, D, "condition_embedder.time_embedder.linear_2"));
    TRY(lin_all(&ld, &m->tproj, 6 * D, D, "condition_embedder.time_proj"));
    TRY(lin_all(&ld, &m->x1, D, c->text_dim, "condition_embedder.text_embedder.linear_1"));
    TRY(lin_all(&ld, &m->x2, D, D, "condition_embedder.text_embedder.linear_2"));
    {
        int64_t s[3] = {1, 2, D};
        NAME("scale_shift_table");
        TRY(get_x(&ld, m->sst_out, 3, s, 0, 0, -1, 1, NULL));
    }
    /* proj_out rows are (dt, dy, dx, c) with dt = 1: the unpatchify op's order */
    TRY(lin_all(&ld, &m->proj, p * p * c->out_channels, D, "proj_out"));
    for (int l = 0; l < c->num_layers; l++) {
        ditd_wan_block *b = &m->blk[l];
        static const char *const qkv[3] = {"to_q", "to_k", "to_v"};
        {
            int64_t s[3] = {1, 6, D};
            NAME("blocks.%d.scale_shift_table", l);
            TRY(get_x(&ld, b->sst, 3, s, 0, 0, -1, 1, NULL));
        }
        for (int j = 0; j < 3; j++) { /* fused by rows: q, k, v (this rank's heads of each) */
            ditd_wan_lin part = {ditd_ptr_w(ops, b->qkv.w, (size_t)(j * A * D)),
                                 ditd_ptr_w(ops, b->qkv.b, (size_t)(j * A))};
            snprintf(pre, sizeof pre, "blocks.%d.attn1.%s", l, qkv[j]);
            TRY(lin_col(&ld, &part, D, D, a0, A, pre));
        }
        NAME("blocks.%d.attn1.norm_q.weight", l);
        TRY(vec_act(&ld, b->nq1, D, a0, A, NULL));
        NAME("blocks.%d.attn1.norm_k.weight", l);
        TRY(vec_act(&ld, b->nk1, D, a0, A, NULL));
        snprintf(pre, sizeof pre, "blocks.%d.attn1.to_out.0", l);
        TRY(lin_row(&ld, &b->out1, D, D, a0, A, pre));
        if (c->cross_attn_norm) {
            NAME("blocks.%d.norm2.weight", l);
            TRY(vec_act(&ld, b->n2w, D, 0, -1, minus_one));
            NAME("blocks.%d.norm2.bias", l);
            TRY(vec_act(&ld, b->n2b, D, 0, -1, NULL));
        } else if (NAME("blocks.%d.norm2.weight", l), ditd_safetensors_find(st, ld.name)) {
            err = ditd_err_set(DITD_EFORMAT, "checkpoint has %s but config says cross_attn_norm false",
                               ld.name);
            goto done;
        }
        snprintf(pre, sizeof pre, "blocks.%d.attn2.to_q", l);
        TRY(lin_col(&ld, &b->q2, D, D, a0, A, pre));
        for (int j = 0; j < 2; j++) {
            ditd_wan_lin part = {ditd_ptr_w(ops, b->kv2.w, (size_t)(j * A * D)),
                                 ditd_ptr_w(ops, b->kv2.b, (size_t)(j * A))};
            snprintf(pre, sizeof pre, "blocks.%d.attn2.%s", l, qkv[j + 1]);
            TRY(lin_col(&ld, &part, D, D, a0, A, pre));
        }
        NAME("blocks.%d.attn2.norm_q.weight", l);
        TRY(vec_act(&ld, b->nq2, D, a0, A, NULL));
        NAME("blocks.%d.attn2.norm_k.weight", l);
        TRY(vec_act(&ld, b->nk2, D, a0, A, NULL));
        if (Di) {
            static const char *const kvi[2] = {"add_k_proj", "add_v_proj"};
            for (int j = 0; j < 2; j++) {
                ditd_wan_lin part = {ditd_ptr_w(ops, b->kvi.w, (size_t)(j * A * D)),
                                     ditd_ptr_w(ops, b->kvi.b, (size_t)(j * A))};
                snprintf(pre, sizeof pre, "blocks.%d.attn2.%s", l, kvi[j]);
                TRY(lin_col(&ld, &part, D, D, a0, A, pre));
            }
            NAME("blocks.%d.attn2.norm_added_k.weight", l);
            TRY(vec_act(&ld, b->nki, D, a0, A, NULL));
        }
        snprintf(pre, sizeof pre, "blocks.%d.attn2.to_out.0", l);
        TRY(lin_row(&ld, &b->out2, D, D, a0, A, pre));
        snprintf(pre, sizeof pre, "blocks.%d.ffn.net.0.proj", l);
        TRY(lin_col(&ld, &b->ff1, FF, D, f0, Fl, pre));
        snprintf(pre, sizeof pre, "blocks.%d.ffn.net.2", l);
        TRY(lin_row(&ld, &b->ff2, D, FF, f0, Fl, pre));
    }
    /* more blocks in the checkpoint than the config says would silently
     * drop layers: refuse */
    NAME("blocks.%d.scale_shift_table", c->num_layers);
    if (ditd_safetensors_find(st, ld.name))
        err = ditd_err_set(DITD_EFORMAT, "checkpoint has %s but config says num_layers %d",
                           ld.name, c->num_layers);
done:
    free(ld.stage);
    return err;
}

/* Every weight the forward passes to linear, re-laid for the backend
 * (backend.h pack_linear), once all are loaded. Not patch_embedding:
 * patch_embed reads it as a conv weight. */
static int pack_linears(ditd_wan *m)
{
    const ditd_wan_config *c = &m->cfg;
    const ditd_backend_ops *ops = m->ops;
    int D = c->inner_dim, A = m->A, F = m->fc, pp = c->patch_h * c->patch_w;
    int err = 0;
#define PACK(l, n, k)                                               \
    do {                                                            \
        if (!err)                                                   \
            err = ditd_pack_linear(ops, (l).w, (int)(n), (int)(k)); \
    } while (0)
    PACK(m->t1, D, c->freq_dim);
    PACK(m->t2, D, D);
    PACK(m->tproj, 6 * D, D);
    PACK(m->x1, D, c->text_dim);
    PACK(m->x2, D, D);
    PACK(m->proj, pp * c->out_channels, D);
    if (c->image_dim) {
        PACK(m->ie_ff1, c->image_dim, c->image_dim);
        PACK(m->ie_ff2, D, c->image_dim);
    }
    for (int l = 0; l < c->num_layers; l++) {
        ditd_wan_block *b = &m->blk[l];
        PACK(b->qkv, 3 * A, D);
        PACK(b->out1, D, A);
        PACK(b->q2, A, D);
        PACK(b->kv2, 2 * A, D);
        PACK(b->out2, D, A);
        if (c->image_dim)
            PACK(b->kvi, 2 * A, D);
        PACK(b->ff1, F, D);
        PACK(b->ff2, D, F);
    }
#undef PACK
    return err;
}

int ditd_wan_new_mesh(const ditd_wan_config *cfg, const ditd_backend_ops *ops, int max_batch,
                      int frames, int height, int width, int text_len, const char *weights_path,
                      const ditd_mesh *mesh, ditd_wan **out)
{
    ditd_safetensors *st = NULL;
    ditd_wan *m;
    int err;

    if (max_batch <= 0 || max_batch > 4096)
        return ditd_err_set(DITD_EINVAL, "max batch %d (1..4096)", max_batch);
    if (!ops->rope || !ops->row_sumsq || !ops->rmsnorm_rows || !ops->upload_f32)
        return ditd_err_set(DITD_EUNSUPPORTED,
                            "WanTransformer3DModel needs the rope, row_sumsq, rmsnorm_rows and upload_f32 ops, which the %s backend lacks",
                            ops->name);
    if (cfg->image_dim && !ops->gelu_erf)
        return ditd_err_set(DITD_EUNSUPPORTED,
                            "a WanTransformer3DModel with an image branch (image_dim = %d) needs the gelu_erf op, which the %s backend lacks",
                            cfg->image_dim, ops->name);
    if ((err = check_sizes(cfg, frames, height, width, text_len)))
        return err;
    if (!(m = calloc(1, sizeof *m)))
        return ditd_err_set(DITD_ENOMEM, "Wan model");
    m->cfg = *cfg;
    m->ops = ops;
    m->Li = cfg->image_len;
    m->max_batch = max_batch;
    m->base.max_batch = max_batch;
    ditd_arena_init_mem(&m->weights, ops->mem_alloc, ops->mem_free);
    ditd_arena_init_mem(&m->acts, ops->mem_alloc, ops->mem_free);
    if (!(m->blk = calloc((size_t)cfg->num_layers, sizeof *m->blk))) {
        err = ditd_err_set(DITD_ENOMEM, "Wan blocks");
        goto fail;
    }
    set_sizes(m, frames, height, width, text_len);
    if ((err = plan(m, mesh)) || (err = plan_host(m)) || (err = plan_acts(m)) ||
        (err = ditd_safetensors_open(weights_path, &st)) || (err = load_weights(m, st)) ||
        (err = pack_linears(m)))
        goto fail;
    ditd_safetensors_free(st);
    *out = m;
    return 0;
fail:
    if (st)
        ditd_safetensors_free(st);
    ditd_wan_free(m);
    return err;
}
