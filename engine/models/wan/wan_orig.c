/* Wan 2.1 / 2.2's original parameter names (the Wan-AI release, as its
 * single files and GGUF conversions keep them), mapped to Diffusers'
 * WanTransformer3DModel names exactly as Diffusers' single-file loader
 * does (diffusers/loaders/single_file_utils.py,
 * convert_wan_transformer_to_diffusers): every name passes through the
 * same ordered list of substring replacements (self_attn -> attn1, .q. ->
 * .to_q., modulation -> scale_shift_table, the norm2/norm3 swap, the I2V
 * image embedder ...), each applied to the whole name in turn as Python's
 * str.replace does. Nothing is cut or re-laid: every Diffusers tensor is one
 * file tensor. Registered as aliases through engine/models/orig_map.h, so a
 * file tensor that maps onto no parameter of the model is refused naming
 * it. ComfyUI's "model.diffusion_model." prefix is removed first, as
 * Diffusers removes it; in a prefixed file only the prefixed tensors are
 * mapped (the others are the VAE's or the text encoders' in a
 * whole-pipeline checkpoint: Diffusers' load leaves them unused).
 *
 * Not mapped (Diffusers maps them, ditd has no such model): the VACE,
 * Animate face adapter and motion encoder tensors; a file that has them is
 * refused naming the first.
 */
#include <stdio.h>
#include <string.h>

#include "engine/core/error.h"
#include "engine/models/orig_map.h"
#include "engine/models/wan/wan.h"

/* TRANSFORMER_KEYS_RENAME_DICT, in its order (Python dicts keep it). */
static const char *const RENAME[][2] = {
    {"time_embedding.0", "condition_embedder.time_embedder.linear_1"},
    {"time_embedding.2", "condition_embedder.time_embedder.linear_2"},
    {"text_embedding.0", "condition_embedder.text_embedder.linear_1"},
    {"text_embedding.2", "condition_embedder.text_embedder.linear_2"},
    {"time_projection.1", "condition_embedder.time_proj"},
    {"cross_attn", "attn2"},
    {"self_attn", "attn1"},
    {".o.", ".to_out.0."},
    {".q.", ".to_q."},
    {".k.", ".to_k."},
    {".v.", ".to_v."},
    {".k_img.", ".add_k_proj."},
    {".v_img.", ".add_v_proj."},
    {".norm_k_img.", ".norm_added_k."},
    {"head.modulation", "scale_shift_table"},
    {"head.head", "proj_out"},
    {"modulation", "scale_shift_table"},
    {"ffn.0", "ffn.net.0.proj"},
    {"ffn.2", "ffn.net.2"},
    {"norm2", "norm__placeholder"},
    {"norm3", "norm2"},
    {"norm__placeholder", "norm3"},
    {"img_emb.proj.0", "condition_embedder.image_embedder.norm1"},
    {"img_emb.proj.1", "condition_embedder.image_embedder.ff.net.0.proj"},
    {"img_emb.proj.3", "condition_embedder.image_embedder.ff.net.2"},
    {"img_emb.proj.4", "condition_embedder.image_embedder.norm2"},
    {"before_proj", "proj_in"},
    {"after_proj", "proj_out"},
};

/* s := s with every (non-overlapping, left to right) `from` replaced by
 * `to`, as str.replace. 0, or -1 when the result does not fit. */
static int replace_all(char *s, size_t cap, const char *from, const char *to)
{
    char out[512];
    size_t nf = strlen(from), nt = strlen(to), o = 0;
    const char *p = s, *q;
    int hit = 0;
    while ((q = strstr(p, from))) {
        size_t k = (size_t)(q - p);
        if (o + k + nt >= sizeof out)
            return -1;
        memcpy(out + o, p, k);
        memcpy(out + o + k, to, nt);
        o += k + nt;
        p = q + nf;
        hit = 1;
    }
    if (!hit)
        return 0;
    size_t rest = strlen(p);
    if (o + rest >= sizeof out || o + rest >= cap)
        return -1;
    memcpy(out + o, p, rest + 1);
    memcpy(s, out, o + rest + 1);
    return 0;
}

int ditd_wan_alias_orig(ditd_weights *w, ditd_orig_map *m, int *found)
{
    int err;
    *found = 0;
    int prefixed = !ditd_weights_has_raw(w, "blocks.0.self_attn.q.weight");
    if (prefixed && !ditd_weights_has_raw(w, DITD_ORIG_PREFIX "blocks.0.self_attn.q.weight"))
        return 0; /* Diffusers names (or not Wan: the loader says which is missing) */
    /* the names are the file's own: the map's prefix stays "" and each
     * name is cut below, as Diffusers cuts it (every occurrence) */
    if ((err = ditd_orig_map_init(m, w, "")))
        return err;
    /* a prefixed (whole-checkpoint) file: the prefixed tensors are the
     * transformer's; the rest (VAE, text encoders) another component's */
    if (prefixed)
        m->scope = DITD_ORIG_PREFIX;
    *found = 1;
    const ditd_gguf *g = ditd_weights_gguf(w);
    const ditd_safetensors *st = ditd_weights_st(w);
    size_t n = g ? ditd_gguf_count(g) : ditd_safetensors_count(st);
    for (size_t i = 0; i < n && !m->err; i++) {
        const char *raw = g ? ditd_gguf_at(g, i)->name : ditd_safetensors_at(st, i)->name;
        char name[200];
        if (prefixed && strncmp(raw, DITD_ORIG_PREFIX, strlen(DITD_ORIG_PREFIX)) != 0)
            continue;
        if (snprintf(name, sizeof name, "%s", raw) >= (int)sizeof name ||
            replace_all(name, sizeof name, DITD_ORIG_PREFIX, "") < 0)
            return m->err = ditd_err_set(DITD_EFORMAT, "%s: tensor name too long: %.80s...",
                                         ditd_weights_path(w), raw);
        for (size_t r = 0; r < sizeof RENAME / sizeof *RENAME; r++)
            if (replace_all(name, sizeof name, RENAME[r][0], RENAME[r][1]) < 0)
                return m->err = ditd_err_set(DITD_EFORMAT,
                                             "%s: tensor name too long: %.80s...",
                                             ditd_weights_path(w), raw);
        ditd_orig_map_one(m, name, raw);
    }
    return m->err;
}
