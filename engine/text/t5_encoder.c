/* transformers T5EncoderModel and UMT5EncoderModel forward. */
#include "engine/text/t5_encoder.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/error.h"
#include "engine/text/text_lora.h"
#include "engine/text/t5_gguf.h"
#include "engine/text/text_weights.h"
#include "kernels/cpu/text_kernels.h"

typedef struct t5_block {
    void *ln0, *ln1;                    /* (D) */
    ditd_text_mat q, k, v;              /* (I, D), I = H * Dh */
    ditd_text_mat o;                    /* (D, I) */
    ditd_text_mat wi0, wi1;             /* (F, D): wi (or wi_0), wi_1 when gated */
    ditd_text_mat wo;                   /* (D, F) */
} t5_block;

struct ditd_t5_encoder {
    ditd_t5_config cfg;
    const ditd_backend_ops *ops;
    int max_batch, max_tokens;
    ditd_text_weights w;

    ditd_text_mat emb;                  /* (V, D) */
    t5_block *blocks;
    void *lnf;                          /* (D) */
    float *h_rel_table;                 /* (L_rel, num_buckets, H), host: L_rel = 1 (T5) or L (UMT5) */
    float *h_rel;                       /* (H, 2N - 1), host */

    void *h, *xn, *qkv, *att, *ff0, *ff1, *tmp, *rel, *scratch;
    void *att_scratch;              /* (N, N) scores */
    uint8_t *keep;
    size_t scratch_elems;

    /* LoRA (engine/text/text_lora.h): per block q, k, v, o, wi (wi_0), [wi_1,]
     * wo; the scratch of ditd_lora_apply */
    ditd_lora_target *targets;
    int n_targets, per_block;
    float *lora_tmp;
    size_t lora_tmp_floats;
};

/* A block's targets, from its first index. */
enum { T_Q, T_K, T_V, T_O, T_WI0, T_WI1 };
#define T_WO(m) ((m)->per_block - 1)

const ditd_lora_target *ditd_t5_encoder_lora_targets(const ditd_t5_encoder *m, int *n)
{
    *n = m->n_targets;
    return m->targets;
}

static void set_targets(ditd_t5_encoder *m)
{
    const ditd_t5_config *c = &m->cfg;
    const int D = c->d_model, F = c->d_ff, I = c->num_heads * c->d_kv;
    for (int l = 0; l < c->num_layers; l++) {
        ditd_lora_target *t = &m->targets[l * m->per_block];
        const char *att = "layer.0.SelfAttention", *ff = "layer.1.DenseReluDense";
        const char *nm[7] = {"q", "k", "v", "o", c->gated ? "wi_0" : "wi", "wi_1", "wo"};
        for (int i = 0; i < m->per_block; i++) {
            int k = i == T_WO(m) ? 6 : i;
            snprintf(t[i].name, sizeof t[i].name, "encoder.block.%d.%s.%s", l,
                     k < 4 ? att : ff, nm[k]);
            t[i].n_out = k < 3 ? I : k == 3 ? D : k < 6 ? F : D;
            t[i].k_in = k == 3 ? I : k == 6 ? F : D;
        }
    }
}

const ditd_t5_config *ditd_t5_encoder_config_of(const ditd_t5_encoder *m)
{
    return &m->cfg;
}

size_t ditd_t5_encoder_borrowed_bytes(const ditd_t5_encoder *m)
{
    return m->w.borrowed_bytes;
}

int ditd_t5_encoder_quantized(const ditd_t5_encoder *m, size_t *bytes)
{
    return ditd_text_weights_quantized(&m->w, bytes);
}

size_t ditd_t5_encoder_arena_bytes(const ditd_t5_encoder *m)
{
    return m->w.arena.size;
}

int ditd_t5_relative_bucket(int rel, int num_buckets, int max_distance)
{
    /* bidirectional: half the buckets for keys after the query */
    int nb = num_buckets / 2, bucket = rel > 0 ? nb : 0, n = rel < 0 ? -rel : rel;
    int max_exact = nb / 2;
    if (n < max_exact)
        return bucket + n;
    /* the other half log-spaced up to max_distance, in float32 as torch:
     * log(n / max_exact) / log(max_distance / max_exact) * (nb - max_exact) */
    float f = logf((float)n / (float)max_exact);
    f = f / (float)log((double)max_distance / (double)max_exact);
    f = f * (float)(nb - max_exact);
    long large = max_exact + (long)f;
    if (large > nb - 1)
        large = nb - 1;
    return bucket + (int)large;
}

static int walk(ditd_t5_encoder *m)
{
    const ditd_t5_config *c = &m->cfg;
    ditd_text_weights *w = &m->w;
    int64_t D = c->d_model, F = c->d_ff, I = (int64_t)c->num_heads * c->d_kv;
    size_t BN = (size_t)m->max_batch * (size_t)m->max_tokens;
    char name[256];
    int err;

#define N_(...) (snprintf(name, sizeof name, __VA_ARGS__), name)
#define MAT(dst, r, cc, ...)                                                   \
    if ((err = ditd_text_weights_mat(w, &(dst), N_(__VA_ARGS__), (r), (cc)))) \
    return err
/* a linear that may keep a GGUF checkpoint's blocks (ditd_text_linear) */
#define QMAT(dst, r, cc, ...)                                                   \
    if ((err = ditd_text_weights_qmat(w, &(dst), N_(__VA_ARGS__), (r), (cc)))) \
    return err
#define SMALL(dst, d0, ...)                                                      \
    if ((err = ditd_text_weights_small(w, &(dst), N_(__VA_ARGS__), (d0), 0))) \
    return err
    /* T5EncoderModel ties encoder.embed_tokens to shared: either name */
    const char *emb = ditd_text_weights_has(w, "encoder.embed_tokens.weight")
                          ? "encoder.embed_tokens.weight"
                          : "shared.weight";
    MAT(m->emb, c->vocab_size, D, "%s", emb);
    /* T5: block 0's table, shared; UMT5: one per block */
    for (int l = 0; l < (c->bias_per_layer ? c->num_layers : 1); l++)
        if ((err = ditd_text_weights_host(
                 w, m->h_rel_table + (size_t)l * c->num_buckets * c->num_heads,
                 N_("encoder.block.%d.layer.0.SelfAttention.relative_attention_bias.weight", l),
                 c->num_buckets, c->num_heads)))
            return err;
    for (int l = 0; l < c->num_layers; l++) {
        t5_block *b = &m->blocks[l];
        const char *e = "encoder.block";
        SMALL(b->ln0, D, "%s.%d.layer.0.layer_norm.weight", e, l);
        QMAT(b->q, I, D, "%s.%d.layer.0.SelfAttention.q.weight", e, l);
        QMAT(b->k, I, D, "%s.%d.layer.0.SelfAttention.k.weight", e, l);
        QMAT(b->v, I, D, "%s.%d.layer.0.SelfAttention.v.weight", e, l);
        QMAT(b->o, D, I, "%s.%d.layer.0.SelfAttention.o.weight", e, l);
        SMALL(b->ln1, D, "%s.%d.layer.1.layer_norm.weight", e, l);
        /* linear_q fuses gelu_new (T5 v1.1's) but not relu: that one's wi
         * is dequantized at load */
        const int fuse = c->act == DITD_TEXT_ACT_GELU_NEW || c->act == DITD_TEXT_ACT_NONE;
        if (c->gated) {
            if (fuse) {
                QMAT(b->wi0, F, D, "%s.%d.layer.1.DenseReluDense.wi_0.weight", e, l);
            } else {
                MAT(b->wi0, F, D, "%s.%d.layer.1.DenseReluDense.wi_0.weight", e, l);
            }
            QMAT(b->wi1, F, D, "%s.%d.layer.1.DenseReluDense.wi_1.weight", e, l);
        } else if (fuse) {
            QMAT(b->wi0, F, D, "%s.%d.layer.1.DenseReluDense.wi.weight", e, l);
        } else {
            MAT(b->wi0, F, D, "%s.%d.layer.1.DenseReluDense.wi.weight", e, l);
        }
        QMAT(b->wo, D, F, "%s.%d.layer.1.DenseReluDense.wo.weight", e, l);
    }
    SMALL(m->lnf, D, "encoder.final_layer_norm.weight");
#undef MAT
#undef QMAT
#undef SMALL
#undef N_
    int64_t Kmax = F > D ? F : D;
    Kmax = I > Kmax ? I : Kmax;
    m->scratch_elems = (size_t)DITD_CPU_WT_PANEL * (size_t)Kmax;
    size_t R = (size_t)c->num_heads * (2 * (size_t)m->max_tokens - 1);
    if ((err = ditd_text_weights_carve(w, &m->h, BN * D, 0)) ||
        (err = ditd_text_weights_carve(w, &m->xn, BN * D, 0)) ||
        (err = ditd_text_weights_carve(w, &m->qkv, BN * 3 * I, 0)) ||
        (err = ditd_text_weights_carve(w, &m->att, BN * I, 0)) ||
        (err = ditd_text_weights_carve(w, &m->ff0, BN * F, 0)) ||
        (err = ditd_text_weights_carve(w, &m->ff1, c->gated ? BN * F : 1, 0)) ||
        (err = ditd_text_weights_carve(w, &m->tmp, BN * D, 0)) ||
        (err = ditd_text_weights_carve(w, &m->rel, R, 0)) ||
        (err = ditd_text_weights_carve(w, &m->scratch, m->scratch_elems, 0)) ||
        (err = ditd_text_weights_carve(w, &m->att_scratch,
                                       (size_t)m->max_tokens * (size_t)m->max_tokens, 0)) ||
        (err = ditd_text_weights_carve(w, (void **)&m->keep, BN, 1)) ||
        (err = ditd_text_weights_carve(w, (void **)&m->lora_tmp,
                                       m->lora_tmp_floats * sizeof(float), 1)))
        return err;
    return 0;
}

int ditd_t5_encoder_new(const char *dir, const char *class_hint, const ditd_backend_ops *ops,
                        int max_batch, int max_tokens, ditd_t5_encoder **out)
{
    return ditd_t5_encoder_new_file(dir, NULL, class_hint, ops, max_batch, max_tokens, out);
}

int ditd_t5_encoder_new_file(const char *dir, const char *weights, const char *class_hint,
                             const ditd_backend_ops *ops, int max_batch, int max_tokens,
                             ditd_t5_encoder **out)
{
    char path[4096];
    ditd_text_config tc;
    ditd_t5_encoder *m;
    int err;

    if (!ops->linear_wt || !ops->embedding_wt || !ops->rmsnorm || !ops->mul ||
        !ops->attention_masked)
        return ditd_err_set(DITD_EUNSUPPORTED, "the %s backend has no text-encoder ops", ops->name);
    if (ops->act_dtype == DITD_DTYPE_F16)
        return ditd_err_set(DITD_EUNSUPPORTED,
                            "T5 with float16 activations (transformers clamps them there) is not supported");
    snprintf(path, sizeof path, "%s/config.json", dir);
    if ((err = ditd_text_config_load(path, class_hint, &tc)))
        return err;
    if (tc.arch != DITD_TEXT_T5 && tc.arch != DITD_TEXT_UMT5)
        return ditd_err_set(DITD_EINVAL, "%s: a %s, not a T5EncoderModel or UMT5EncoderModel", path,
                            ditd_text_arch_name(tc.arch));
    if (max_batch <= 0 || max_batch > 4096 || max_tokens <= 0 ||
        max_tokens > DITD_CPU_MASKED_ATTN_MAX_N)
        return ditd_err_set(DITD_EINVAL, "%s: batch %d x %d tokens (1..4096 x 1..%d)", dir,
                            max_batch, max_tokens, DITD_CPU_MASKED_ATTN_MAX_N);
    m = calloc(1, sizeof *m);
    if (!m)
        return ditd_err_set(DITD_ENOMEM, "T5 encoder");
    m->cfg = tc.t5;
    m->ops = ops;
    m->max_batch = max_batch;
    m->max_tokens = max_tokens;
    m->blocks = calloc((size_t)m->cfg.num_layers, sizeof *m->blocks);
    m->h_rel_table = calloc((size_t)(m->cfg.bias_per_layer ? m->cfg.num_layers : 1) *
                                (size_t)m->cfg.num_buckets * (size_t)m->cfg.num_heads,
                            sizeof(float));
    m->h_rel = calloc((size_t)m->cfg.num_heads * (2 * (size_t)max_tokens - 1), sizeof(float));
    m->per_block = m->cfg.gated ? 7 : 6;
    m->n_targets = m->cfg.num_layers * m->per_block;
    m->targets = calloc((size_t)m->n_targets, sizeof *m->targets);
    m->lora_tmp_floats = ditd_lora_tmp_floats((size_t)max_batch * (size_t)max_tokens);
    if (!m->blocks || !m->h_rel_table || !m->h_rel || !m->targets) {
        err = ditd_err_set(DITD_ENOMEM, "T5 blocks");
        goto fail;
    }
    if ((err = ditd_text_weights_open(&m->w, weights && weights[0] ? weights : dir, ops)) ||
        (err = ditd__t5_gguf_alias(m->w.src, m->cfg.num_layers)))
        goto fail;
    if (m->cfg.gated &&
        ditd_text_weights_has(&m->w, "encoder.block.0.layer.1.DenseReluDense.wi.weight")) {
        err = ditd_err_set(DITD_EFORMAT, "%s: the config says a gated feed-forward (wi_0, wi_1) "
                                         "but the checkpoint has DenseReluDense.wi",
                           dir);
        goto fail;
    }
    if (!m->cfg.gated &&
        ditd_text_weights_has(&m->w, "encoder.block.0.layer.1.DenseReluDense.wi_0.weight")) {
        err = ditd_err_set(DITD_EFORMAT, "%s: the config says feed_forward_proj without gate "
                                         "but the checkpoint has DenseReluDense.wi_0",
                           dir);
        goto fail;
    }
    if (!m->cfg.bias_per_layer && m->cfg.num_layers > 1 &&
        ditd_text_weights_has(&m->w,
                              "encoder.block.1.layer.0.SelfAttention.relative_attention_bias.weight")) {
        err = ditd_err_set(DITD_EFORMAT, "%s: the config says T5EncoderModel (one relative "
                                         "attention bias, block 0's) but block 1 has its own: a "
                                         "UMT5EncoderModel checkpoint?",
                           dir);
        goto fail;
    }
    if ((err = walk(m)) || (err = ditd_text_weights_commit(&m->w)) || (err = walk(m)))
        goto fail;
    set_targets(m);
    *out = m;
    return 0;
fail:
    ditd_t5_encoder_free(m);
    return err;
}

void ditd_t5_encoder_free(ditd_t5_encoder *m)
{
    if (!m)
        return;
    if (m->w.src)
        ditd_text_weights_free(&m->w);
    free(m->blocks);
    free(m->h_rel_table);
    free(m->h_rel);
    free(m->targets);
    free(m);
}

int ditd_t5_encoder_encode(ditd_t5_encoder *m, int B, int N, const int64_t *ids,
                           const uint8_t *keep, float *h_last)
{
    return ditd_t5_encoder_encode_lora(m, B, N, ids, keep, NULL, h_last);
}

int ditd_t5_encoder_encode_lora(ditd_t5_encoder *m, int B, int N, const int64_t *ids,
                                const uint8_t *keep, const ditd_lora_set *const *loras,
                                float *h_last)
{
    const ditd_t5_config *c = &m->cfg;
    const ditd_backend_ops *ops = m->ops;
    const int D = c->d_model, F = c->d_ff, H = c->num_heads, Dh = c->d_kv, I = H * Dh;
    const size_t BN = (size_t)B * (size_t)N, ld3 = 3 * (size_t)I, R = 2 * (size_t)N - 1;

    if (B <= 0 || B > m->max_batch || N <= 0 || N > m->max_tokens)
        return ditd_err_set(DITD_EINVAL, "T5 encode: batch %d x %d tokens (at most %d x %d)", B, N,
                            m->max_batch, m->max_tokens);
    for (size_t i = 0; i < BN; i++)
        if (ids[i] < 0 || ids[i] >= c->vocab_size)
            return ditd_err_set(DITD_ERANGE, "T5 encode: token id %lld at [%zu, %zu] is outside the vocabulary (0..%d)",
                                (long long)ids[i], i / (size_t)N, i % (size_t)N, c->vocab_size - 1);
    if (keep) /* host memory: only backends whose arena is host memory have these ops */
        memcpy(m->keep, keep, BN);

    const ditd_text_lora_run lo = {.sets = loras, .B = B, .rows = N, .tmp = m->lora_tmp,
                                   .tmp_floats = m->lora_tmp_floats};
    // embeddings (B, N, D); T5 adds no positions here
    ops->embedding_wt(m->emb.p, m->emb.dt, ids, m->h, (int)BN, D);
    for (int l = 0; l < c->num_layers; l++) {
        const t5_block *b = &m->blocks[l];
        if (l == 0 || c->bias_per_layer) {
            // relative position bias (H, 2N - 1) by key - query offset, from block 0's
            // table (T5, shared by all blocks) or this block's (UMT5)
            const float *tab = m->h_rel_table + (size_t)l * c->num_buckets * H;
            for (int r = -(N - 1); r <= N - 1; r++) {
                int bk = ditd_t5_relative_bucket(r, c->num_buckets, c->max_distance);
                for (int h = 0; h < H; h++)
                    m->h_rel[(size_t)h * R + (size_t)(r + N - 1)] = tab[(size_t)bk * H + h];
            }
            ops->upload(m->rel, m->h_rel, (size_t)H * R);
        }
        // self-attention: h += o(attn(norm(h))), scores unscaled plus the shared bias
        const int t0 = l * m->per_block;
#define LIN(x, ldx, w, yy, ldy, n, k, a, t)                                                  \
    ditd_text_lora_linear(ops, &lo, t0 + (t), x, ldx, &(w), NULL, yy, ldy, n, k, a, m->scratch, \
                          m->scratch_elems)
        ops->rmsnorm(m->h, m->xn, (int)BN, D, c->eps, b->ln0);
        LIN(m->xn, D, b->q, m->qkv, ld3, I, D, DITD_TEXT_ACT_NONE, T_Q);
        LIN(m->xn, D, b->k, ditd_ptr_act(ops, m->qkv, I), ld3, I, D, DITD_TEXT_ACT_NONE, T_K);
        LIN(m->xn, D, b->v, ditd_ptr_act(ops, m->qkv, 2 * (size_t)I), ld3, I, D,
            DITD_TEXT_ACT_NONE, T_V);
        ops->attention_masked(m->qkv, ld3, ditd_ptr_act(ops, m->qkv, I), ld3,
                              ditd_ptr_act(ops, m->qkv, 2 * (size_t)I), ld3, m->att, I, B, N, H,
                              Dh, 1.0f, m->rel, keep ? m->keep : NULL, 0, m->att_scratch);
        LIN(m->att, I, b->o, m->tmp, D, D, I, DITD_TEXT_ACT_NONE, T_O);
        ops->add(m->h, m->tmp, BN * D);
        // feed-forward: h += wo(act(wi_0 x) * wi_1 x) or wo(act(wi x)), x = norm(h)
        ops->rmsnorm(m->h, m->xn, (int)BN, D, c->eps, b->ln1);
        LIN(m->xn, D, b->wi0, m->ff0, F, F, D, c->act, T_WI0);
        if (c->gated) {
            LIN(m->xn, D, b->wi1, m->ff1, F, F, D, DITD_TEXT_ACT_NONE, T_WI1);
            ops->mul(m->ff0, m->ff1, BN * F);
        }
        LIN(m->ff0, F, b->wo, m->tmp, D, D, F, DITD_TEXT_ACT_NONE, T_WO(m));
#undef LIN
        ops->add(m->h, m->tmp, BN * D);
    }
    ops->rmsnorm(m->h, m->xn, (int)BN, D, c->eps, m->lnf);
    ops->download(h_last, m->xn, BN * D);
    return ops->status();
}
