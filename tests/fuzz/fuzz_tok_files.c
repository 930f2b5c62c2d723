/* libFuzzer target: the tokenizer file readers. Byte 0 picks which file the
 * rest of the input becomes, in a scratch folder beside small valid
 * companions: 0 tokenizer.json (alone), 1 spiece.model (alone), 2 vocab.json
 * (with a fixed merges.txt), 3 merges.txt (with a fixed vocab.json), 4
 * tokenizer_config.json (with a fixed unigram tokenizer.json), 5
 * special_tokens_map.json (with fixed CLIP files). The folder is loaded;
 * a load that fails must say why, one that succeeds must encode a few
 * fixed texts. The scratch folder lives in $TMPDIR and is removed at exit.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/core/error.h"
#include "engine/text/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char dir[512];
static const char *const FILES[] = {"tokenizer.json", "spiece.model", "vocab.json", "merges.txt",
                                    "tokenizer_config.json", "special_tokens_map.json"};
#define NFILES (sizeof FILES / sizeof *FILES)

static const char *at(const char *rel)
{
    static char p[640];
    snprintf(p, sizeof p, "%s/%s", dir, rel);
    return p;
}

static void put(const char *rel, const void *d, size_t n)
{
    FILE *f = fopen(at(rel), "wb");
    if (!f)
        abort();
    if (n && fwrite(d, 1, n, f) != n)
        abort();
    if (fclose(f) != 0)
        abort();
}

static void clear(void)
{
    for (size_t i = 0; i < NFILES; i++)
        unlink(at(FILES[i]));
}

static void cleanup(void)
{
    clear();
    rmdir(dir);
}

static const char VOCAB[] = "{\"a\": 0, \"b\": 1, \"a</w>\": 2, \"b</w>\": 3, \"ab</w>\": 4, \"ab\": 5, "
                            "\"<|startoftext|>\": 6, \"<|endoftext|>\": 7, \"!\": 8}";
static const char MERGES[] = "#version: 0.2\na b</w>\na b\n";
static const char UNIGRAM[] = "{\"model\": {\"type\": \"Unigram\", \"unk_id\": 2, \"vocab\": [[\"<pad>\", 0], "
                              "[\"</s>\", 0], [\"<unk>\", 0], [\"\\u2581\", -2], [\"\\u2581a\", -3], [\"b\", -4]]}}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!dir[0]) {
        const char *tmp = getenv("TMPDIR");
        snprintf(dir, sizeof dir, "%s/ditd-fuzz-tok-XXXXXX", tmp ? tmp : "/tmp");
        if (!mkdtemp(dir))
            abort();
        atexit(cleanup);
    }
    if (size < 1)
        return 0;
    int which = data[0] % 6;
    clear();
    put(FILES[which], data + 1, size - 1);
    if (which == 2 || which == 5)
        put("merges.txt", MERGES, sizeof MERGES - 1);
    if (which == 3 || which == 5)
        put("vocab.json", VOCAB, sizeof VOCAB - 1);
    if (which == 4)
        put("tokenizer.json", UNIGRAM, sizeof UNIGRAM - 1);
    ditd_tokenizer *t = NULL;
    ditd_err_clear();
    int rc = ditd_tokenizer_load(dir, &t);
    if (rc != 0) {
        if (t || ditd_err_detail()[0] == '\0')
            abort();
        return 0;
    }
    static const char *texts[] = {"", "a b ab!", ("<|endoftext|> ab </s> \u2581" "a"), "\xc3\xa9\xe2\x80\x83\xf0\x9f\x98\x80 aaaa"};
    int32_t ids[16], mask[16];
    for (size_t i = 0; i < sizeof texts / sizeof *texts; i++) {
        int n = 0;
        int e = ditd_tokenizer_encode(t, texts[i], strlen(texts[i]), 16, ids, mask, &n);
        if (e != 0 && ditd_err_detail()[0] == '\0')
            abort();
        if (e == 0)
            for (int k = 0; k < 16; k++)
                if (ids[k] < 0 || ids[k] >= ditd_tokenizer_vocab_size(t))
                    abort();
    }
    ditd_tokenizer_free(t);
    return 0;
}
