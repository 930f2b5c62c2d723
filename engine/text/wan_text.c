/* WanPipeline's _get_t5_prompt_embeds. */
#include "engine/text/wan_text.h"

#include <stdlib.h>
#include <string.h>

#include "engine/core/error.h"
#include "engine/text/prompt_clean.h"

/* ---- the embeddings ---- */

int ditd_wan_text_encode(ditd_t5_encoder *m, int B, int N, const int64_t *ids, const uint8_t *keep,
                         float *out)
{
    if (!keep)
        return ditd_err_set(DITD_EINVAL, "Wan text encode: the attention mask is required");
    for (int b = 0; b < B; b++)
        for (int t = 1; t < N; t++)
            if (keep[(size_t)b * N + t] && !keep[(size_t)b * N + t - 1])
                return ditd_err_set(DITD_EINVAL, "Wan text encode: row %d's mask has a 1 at %d after "
                                                 "a 0 (the tokenizer pads at the end)",
                                    b, t);
    int err = ditd_t5_encoder_encode(m, B, N, ids, keep, out);
    if (err)
        return err;
    // pipeline_wan.py: u[:seq_len], then zeros up to max_sequence_length
    const size_t D = (size_t)ditd_t5_encoder_config_of(m)->d_model;
    for (size_t i = 0; i < (size_t)B * (size_t)N; i++)
        if (!keep[i])
            memset(out + i * D, 0, D * sizeof(float));
    return 0;
}

int ditd_wan_prompt_embeds(ditd_t5_encoder *m, const ditd_tokenizer *tok, int B,
                           const char *const *prompts, int max_len, float *out, int *seq_lens)
{
    if (B <= 0 || max_len <= 0)
        return ditd_err_set(DITD_EINVAL, "Wan prompt embeds: %d prompts, max_sequence_length %d", B,
                            max_len);
    const size_t BN = (size_t)B * (size_t)max_len;
    int32_t *ids32 = malloc(BN * sizeof *ids32), *mask32 = malloc(BN * sizeof *mask32);
    int64_t *ids = malloc(BN * sizeof *ids);
    uint8_t *keep = malloc(BN);
    int err = 0;
    if (!ids32 || !mask32 || !ids || !keep) {
        err = ditd_err_set(DITD_ENOMEM, "Wan prompt embeds: %d x %d tokens", B, max_len);
        goto fail;
    }
    for (int b = 0; b < B; b++) {
        char *clean = NULL;
        size_t clen = 0;
        int nt = 0;
        if ((err = ditd_wan_prompt_clean(prompts[b], strlen(prompts[b]), &clean, &clen)))
            goto fail;
        err = ditd_tokenizer_encode(tok, clean, clen, max_len, ids32 + (size_t)b * max_len,
                                    mask32 + (size_t)b * max_len, &nt);
        free(clean);
        if (err)
            goto fail;
        if (seq_lens)
            seq_lens[b] = nt;
    }
    for (size_t i = 0; i < BN; i++) {
        ids[i] = ids32[i];
        keep[i] = mask32[i] != 0;
    }
    err = ditd_wan_text_encode(m, B, max_len, ids, keep, out);
fail:
    free(ids32);
    free(mask32);
    free(ids);
    free(keep);
    return err;
}
