/* libFuzzer target: the CLIP tokenizer's encode (normalizer, pre-tokenizer,
 * byte-level BPE, added tokens, truncation, padding) on arbitrary bytes,
 * through the FLUX.1-style folder (pad <|endoftext|>) and the SD2-style one
 * (pad "!"). Byte 0 picks max_length, byte 1 the folder; see
 * fuzz_tok_common.h. */
#include "tests/fuzz/fuzz_tok_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static ditd_tokenizer *tok[2];
    if (!tok[0]) {
        tok[0] = fz_load("clip_hub");
        tok[1] = fz_load("clip_pad_excl");
    }
    if (size < 2)
        return 0;
    uint8_t *d = malloc(size - 1);
    d[0] = data[0];
    memcpy(d + 1, data + 2, size - 2);
    fz_encode(tok[data[1] & 1], d, size - 1);
    free(d);
    return 0;
}
