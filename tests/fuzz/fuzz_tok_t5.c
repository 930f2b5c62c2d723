/* libFuzzer target: the T5 tokenizer's encode (precompiled charsmap over
 * grapheme clusters, WhitespaceSplit, Metaspace, Viterbi, added tokens,
 * truncation, padding) on arbitrary bytes, through the tokenizer.json folder
 * and the spiece.model-only one. Byte 0 picks max_length, byte 1 the folder;
 * see fuzz_tok_common.h. */
#include "tests/fuzz/fuzz_tok_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    return fz_encode_pair("t5_tf5", "t5_spm", data, size);
}
