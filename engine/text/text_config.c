/* A text encoder's config.json -> ditd_text_config (CLIPTextConfig, T5Config, UMT5Config). */
#include "engine/text/text_config.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "engine/core/error.h"
#include "engine/io/json_config.h"

const char *ditd_text_arch_name(ditd_text_arch a)
{
    switch (a) {
    case DITD_TEXT_CLIP: return "CLIPTextModel";
    case DITD_TEXT_CLIP_PROJ: return "CLIPTextModelWithProjection";
    case DITD_TEXT_T5: return "T5EncoderModel";
    case DITD_TEXT_UMT5: return "UMT5EncoderModel";
    }
    return "unknown";
}

int ditd_text_arch_from_str(const char *s, ditd_text_arch *out)
{
    static const ditd_text_arch all[] = {DITD_TEXT_CLIP, DITD_TEXT_CLIP_PROJ, DITD_TEXT_T5,
                                         DITD_TEXT_UMT5};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        if (strcmp(s, ditd_text_arch_name(all[i])) == 0) {
            *out = all[i];
            return 0;
        }
    }
    return ditd_err_set(DITD_EUNSUPPORTED,
                        "text encoder class \"%s\" is not supported (CLIPTextModel, "
                        "CLIPTextModelWithProjection, T5EncoderModel, UMT5EncoderModel)",
                        s);
}

/* ---- typed getters: absent or null gives the default ---- */

static int get_int(json_t *root, const char *path, const char *key, int lo, int hi, int dflt,
                   int *out)
{
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) {
        *out = dflt;
        return 0;
    }
    if (!json_is_integer(v))
        return ditd_err_set(DITD_EFORMAT, "%s: %s must be an integer", path, key);
    json_int_t i = json_integer_value(v);
    if (i < lo || i > hi)
        return ditd_err_set(DITD_EUNSUPPORTED, "%s: %s = %lld is not supported (%d..%d)", path, key,
                            (long long)i, lo, hi);
    *out = (int)i;
    return 0;
}

/* A token id: an integer, or absent/null (-1). */
static int get_id(json_t *root, const char *path, const char *key, int64_t dflt, int64_t *out)
{
    json_t *v = json_object_get(root, key);
    if (!v) {
        *out = dflt;
        return 0;
    }
    if (json_is_null(v)) {
        *out = -1;
        return 0;
    }
    if (json_is_array(v))
        return ditd_err_set(DITD_EUNSUPPORTED, "%s: %s as a list is not supported (one token id)",
                            path, key);
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return ditd_err_set(DITD_EFORMAT, "%s: %s must be a non-negative integer", path, key);
    *out = json_integer_value(v);
    return 0;
}

static int get_eps(json_t *root, const char *path, const char *key, double dflt, float *out)
{
    json_t *v = json_object_get(root, key);
    double d = dflt;
    if (v && !json_is_null(v)) {
        if (!json_is_number(v))
            return ditd_err_set(DITD_EFORMAT, "%s: %s must be a number", path, key);
        d = json_number_value(v);
    }
    /* the encoders compute in float: an eps that rounds to 0 there is 0 */
    if (!(d > 0.0) || d > 1.0 || !((float)d > 0.0f))
        return ditd_err_set(DITD_EUNSUPPORTED, "%s: %s = %g is not supported (%g <= eps <= 1)", path,
                            key, d, (double)1.401298464e-45f);
    *out = (float)d;
    return 0;
}

static int get_str(json_t *root, const char *path, const char *key, const char *dflt,
                   const char **out)
{
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) {
        *out = dflt;
        return 0;
    }
    if (!json_is_string(v))
        return ditd_err_set(DITD_EFORMAT, "%s: %s must be a string", path, key);
    *out = json_string_value(v);
    return 0;
}

/* ---- the keys: what each one does to the encoder ---- */

/* Keys of PretrainedConfig (transformers 4.x wrote all of them, 5.x a few)
 * and of generation, which an encoder's forward never reads: metadata,
 * output switches, heads and generation settings. */
static const char *const generic_keys[] = {
    "architectures", "model_type", "transformers_version", "torch_dtype", "dtype",
    "return_dict", "output_hidden_states", "output_attentions", "torchscript", "use_bfloat16",
    "tf_legacy_loss", "is_encoder_decoder", "is_decoder", "cross_attention_hidden_size",
    "add_cross_attention", "tie_encoder_decoder", "tie_word_embeddings",
    "chunk_size_feed_forward", /* chunking the MLP gives the same numbers */
    "finetuning_task", "id2label", "label2id", "num_labels", "problem_type", "tokenizer_class",
    "prefix", "bos_token_id", "pad_token_id", "sep_token_id", "decoder_start_token_id",
    "task_specific_params", "max_length", "min_length", "do_sample", "early_stopping",
    "num_beams", "num_beam_groups", "diversity_penalty", "temperature", "top_k", "top_p",
    "typical_p", "repetition_penalty", "length_penalty", "no_repeat_ngram_size",
    "encoder_no_repeat_ngram_size", "bad_words_ids", "num_return_sequences", "output_scores",
    "return_dict_in_generate", "forced_bos_token_id", "forced_eos_token_id",
    "remove_invalid_values", "exponential_decay_length_penalty", "suppress_tokens",
    "begin_suppress_tokens", "use_cache", "output_past", "gradient_checkpointing",
    "pruned_heads", /* checked: must be empty */
};

/* Keys of CLIPTextConfig. */
static const char *const clip_keys[] = {
    "vocab_size", "hidden_size", "intermediate_size", "projection_dim", "num_hidden_layers",
    "num_attention_heads", "max_position_embeddings", "hidden_act", "layer_norm_eps",
    "eos_token_id",
    /* training and initialisation only */
    "attention_dropout", "dropout", "initializer_range", "initializer_factor",
};

/* Keys of T5Config. */
static const char *const t5_keys[] = {
    "vocab_size", "d_model", "d_kv", "d_ff", "num_layers", "num_heads",
    "relative_attention_num_buckets", "relative_attention_max_distance", "layer_norm_epsilon",
    "feed_forward_proj", "eos_token_id",
    /* recomputed from feed_forward_proj by T5Config itself, whatever the file says */
    "dense_act_fn", "is_gated_act",
    /* the decoder's: T5EncoderModel builds no decoder */
    "num_decoder_layers", "scale_decoder_outputs",
    /* legacy, read by no T5 code; training and initialisation only */
    "n_positions", "dropout_rate", "classifier_dropout", "initializer_factor",
};

/* Keys of UMT5Config: T5Config's (the same names, the same meaning; its
 * defaults differ), and one that google/umt5-* configs carry and no
 * transformers code reads. */
static const char *const umt5_extra_keys[] = {
    "scalable_attention",
};

static int in_list(const char *k, const char *const *list, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(k, list[i]) == 0)
            return 1;
    return 0;
}

#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

/* Refuses a key that is in neither the generic list nor the family's. */
static int check_keys(json_t *root, const char *path, ditd_text_arch arch)
{
    const char *k;
    json_t *v;
    json_object_foreach(root, k, v) {
        if (k[0] == '_') /* _name_or_path, _commit_hash, _attn_implementation...: metadata */
            continue;
        int t5 = arch == DITD_TEXT_T5 || arch == DITD_TEXT_UMT5;
        int known = in_list(k, generic_keys, COUNT(generic_keys)) ||
                    (t5 ? in_list(k, t5_keys, COUNT(t5_keys))
                        : in_list(k, clip_keys, COUNT(clip_keys))) ||
                    (arch == DITD_TEXT_UMT5 && in_list(k, umt5_extra_keys, COUNT(umt5_extra_keys)));
        if (strcmp(k, "quantization_config") == 0)
            return ditd_err_set(DITD_EUNSUPPORTED,
                                "%s: quantization_config is not supported (ditd reads f32, f16 "
                                "and bf16 weights)",
                                path);
        if (!known)
            return ditd_err_set(DITD_EUNSUPPORTED,
                                "%s: key \"%s\" is not one ditd knows for %s; refusing rather than "
                                "guessing what it changes",
                                path, k, ditd_text_arch_name(arch));
    }
    v = json_object_get(root, "pruned_heads");
    if (v && !json_is_null(v) && !(json_is_object(v) && json_object_size(v) == 0))
        return ditd_err_set(DITD_EUNSUPPORTED, "%s: pruned_heads must be empty (pruned models are not supported)",
                            path);
    return 0;
}

/* The class: "architectures" (one entry), else model_index.json's class,
 * else model_type. */
static int find_arch(json_t *root, const char *path, const char *hint, ditd_text_arch *out)
{
    json_t *a = json_object_get(root, "architectures");
    const char *mt = NULL, *cls = NULL;
    int err;
    if ((err = get_str(root, path, "model_type", NULL, &mt)))
        return err;
    if (a && !json_is_null(a)) {
        if (!json_is_array(a) || json_array_size(a) != 1 ||
            !json_is_string(json_array_get(a, 0)))
            return ditd_err_set(DITD_EFORMAT, "%s: architectures must be a list of one class name",
                                path);
        cls = json_string_value(json_array_get(a, 0));
    }
    if (cls && hint && strcmp(cls, hint) != 0)
        return ditd_err_set(DITD_EFORMAT,
                            "%s: architectures says \"%s\" but model_index.json says \"%s\"", path,
                            cls, hint);
    if (!cls)
        cls = hint;
    if (!cls && mt)
        cls = strcmp(mt, "t5") == 0 ? "T5EncoderModel"
              : strcmp(mt, "umt5") == 0 ? "UMT5EncoderModel"
              : strcmp(mt, "clip_text_model") == 0 ? "CLIPTextModel" : NULL;
    if (!cls)
        return ditd_err_set(DITD_EFORMAT,
                            "%s: neither architectures nor model_type names a text encoder", path);
    if ((err = ditd_text_arch_from_str(cls, out)))
        return ditd_err_set(err, "%s: %s", path, ditd_err_detail());
    const char *want = *out == DITD_TEXT_T5 ? "t5" : *out == DITD_TEXT_UMT5 ? "umt5" : "clip_text_model";
    if (mt && strcmp(mt, want) != 0)
        return ditd_err_set(DITD_EUNSUPPORTED, "%s: model_type \"%s\" does not fit %s (\"%s\")",
                            path, mt, cls, want);
    return 0;
}

static int clip_from_json(json_t *root, const char *path, ditd_clip_text_config *c)
{
    const char *act = NULL;
    int err;
    memset(c, 0, sizeof *c);
    /* defaults: CLIPTextConfig's */
    if ((err = get_int(root, path, "vocab_size", 1, 1 << 24, 49408, &c->vocab_size)) ||
        (err = get_int(root, path, "hidden_size", 1, 65536, 512, &c->hidden_size)) ||
        (err = get_int(root, path, "intermediate_size", 1, 1 << 20, 2048, &c->intermediate_size)) ||
        (err = get_int(root, path, "projection_dim", 1, 65536, 512, &c->projection_dim)) ||
        (err = get_int(root, path, "num_hidden_layers", 1, 1000, 12, &c->num_layers)) ||
        (err = get_int(root, path, "num_attention_heads", 1, 1024, 8, &c->num_heads)) ||
        (err = get_int(root, path, "max_position_embeddings", 1, 4096, 77, &c->max_positions)) ||
        (err = get_eps(root, path, "layer_norm_eps", 1e-5, &c->eps)) ||
        (err = get_str(root, path, "hidden_act", "quick_gelu", &act)) ||
        (err = get_id(root, path, "eos_token_id", 49407, &c->eos_token_id)) ||
        (err = get_id(root, path, "bos_token_id", 49406, &c->bos_token_id)) ||
        (err = get_id(root, path, "pad_token_id", 1, &c->pad_token_id)))
        return err;
    if (strcmp(act, "none") == 0 || ditd_text_act_from_str(act, &c->act))
        return ditd_err_set(DITD_EUNSUPPORTED,
                            "%s: hidden_act \"%s\" is not supported (quick_gelu, gelu, gelu_new, relu)",
                            path, act);
    if (c->hidden_size % c->num_heads)
        return ditd_err_set(DITD_EUNSUPPORTED,
                            "%s: hidden_size = %d is not divisible by num_attention_heads = %d",
                            path, c->hidden_size, c->num_heads);
    if (c->eos_token_id < 0)
        return ditd_err_set(DITD_EUNSUPPORTED, "%s: eos_token_id null is not supported (the pooled output needs it)",
                            path);
    /* transformers: eos_token_id == 2 marks configs written before PR
     * #24773, whose pooled token is the largest id of each sequence */
    c->legacy_argmax = c->eos_token_id == 2;
    return 0;
}

static int t5_from_json(json_t *root, const char *path, int umt5, ditd_t5_config *c)
{
    const char *ff = NULL;
    char base[64];
    int err;
    memset(c, 0, sizeof *c);
    c->bias_per_layer = umt5;
    /* defaults: T5Config's, or UMT5Config's where they differ */
    if ((err = get_int(root, path, "vocab_size", 1, 1 << 24, umt5 ? 250112 : 32128, &c->vocab_size)) ||
        (err = get_int(root, path, "d_model", 1, 65536, 512, &c->d_model)) ||
        (err = get_int(root, path, "d_kv", 1, 4096, 64, &c->d_kv)) ||
        (err = get_int(root, path, "d_ff", 1, 1 << 20, umt5 ? 1024 : 2048, &c->d_ff)) ||
        (err = get_int(root, path, "num_layers", 1, 1000, umt5 ? 8 : 6, &c->num_layers)) ||
        (err = get_int(root, path, "num_heads", 1, 1024, umt5 ? 6 : 8, &c->num_heads)) ||
        (err = get_int(root, path, "relative_attention_num_buckets", 2, 1 << 16, 32,
                       &c->num_buckets)) ||
        (err = get_int(root, path, "relative_attention_max_distance", 1, 1 << 20, 128,
                       &c->max_distance)) ||
        (err = get_eps(root, path, "layer_norm_epsilon", 1e-6, &c->eps)) ||
        (err = get_str(root, path, "feed_forward_proj", umt5 ? "gated-gelu" : "relu", &ff)) ||
        (err = get_id(root, path, "pad_token_id", 0, &c->pad_token_id)))
        return err;
    /* the encoder never reads eos_token_id; T5Config allows a list */
    json_t *eos = json_object_get(root, "eos_token_id");
    if (eos && json_is_array(eos))
        c->eos_token_id = -1;
    else if ((err = get_id(root, path, "eos_token_id", 1, &c->eos_token_id)))
        return err;
    /* T5Config: "gated-ACT" or "ACT"; "gated-gelu" means gelu_new */
    const char *dash = strchr(ff, '-');
    c->gated = dash != NULL;
    if ((dash && (strncmp(ff, "gated", (size_t)(dash - ff)) != 0 || dash - ff != 5 ||
                  strchr(dash + 1, '-'))) ||
        strlen(ff) >= sizeof base)
        return ditd_err_set(DITD_EUNSUPPORTED,
                            "%s: feed_forward_proj \"%s\" is not supported (\"ACT\" or \"gated-ACT\")",
                            path, ff);
    snprintf(base, sizeof base, "%s", dash ? dash + 1 : ff);
    if (strcmp(ff, "gated-gelu") == 0)
        snprintf(base, sizeof base, "gelu_new");
    if (strcmp(base, "none") == 0 || ditd_text_act_from_str(base, &c->act))
        return ditd_err_set(DITD_EUNSUPPORTED,
                            "%s: feed_forward_proj \"%s\" is not supported (relu, gated-gelu, gelu, "
                            "gated-relu, gelu_new, quick_gelu and their gated forms)",
                            path, ff);
    /* the relative buckets: half per direction, half of those exact */
    if (c->num_buckets < 4)
        return ditd_err_set(DITD_EUNSUPPORTED,
                            "%s: relative_attention_num_buckets = %d (at least 4)", path,
                            c->num_buckets);
    if (c->max_distance <= c->num_buckets / 4)
        return ditd_err_set(DITD_EUNSUPPORTED,
                            "%s: relative_attention_max_distance = %d must exceed num_buckets / 4 = %d",
                            path, c->max_distance, c->num_buckets / 4);
    return 0;
}

static int config_from_json(json_t *root, const char *path, const char *hint, ditd_text_config *out)
{
    ditd_text_config c;
    int err;
    memset(&c, 0, sizeof c);
    if (!json_is_object(root))
        return ditd_err_set(DITD_EFORMAT, "%s: not a JSON object", path);
    if ((err = find_arch(root, path, hint, &c.arch)) || (err = check_keys(root, path, c.arch)))
        return err;
    err = c.arch == DITD_TEXT_T5 || c.arch == DITD_TEXT_UMT5
              ? t5_from_json(root, path, c.arch == DITD_TEXT_UMT5, &c.t5)
              : clip_from_json(root, path, &c.clip);
    if (err)
        return err;
    *out = c;
    return 0;
}

int ditd_text_config_load(const char *path, const char *class_hint, ditd_text_config *out)
{
    int err;
    json_t *root = ditd_json_config_get(path, NULL, &err);
    if (!root)
        return err;
    err = config_from_json(root, path, class_hint, out);
    json_decref(root);
    return err;
}

int ditd_text_config_parse(const char *text, size_t len, const char *name, const char *class_hint,
                           ditd_text_config *out)
{
    json_error_t jerr;
    json_t *root = json_loadb(text, len, 0, &jerr);
    int err;
    if (!root)
        return ditd_err_set(DITD_EFORMAT, "%s: line %d: %s", name, jerr.line, jerr.text);
    err = config_from_json(root, name, class_hint, out);
    json_decref(root);
    return err;
}
