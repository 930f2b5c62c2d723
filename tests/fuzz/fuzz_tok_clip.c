/* libFuzzer target: the CLIP tokenizer's encode (normalizer, pre-tokenizer,
 * byte-level BPE, added tokens, truncation, padding) on arbitrary bytes,
 * through the FLUX.1-style folder (pad <|endoftext|>) and the SD2-style one
 * (pad "!"). Byte 0 picks max_length, byte 1 the folder; see
 * fuzz_tok_common.h. */
#include "tests/fuzz/fuzz_tok_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    return fz_encode_pair("clip_hub", "clip_pad_excl", data, size);
}
