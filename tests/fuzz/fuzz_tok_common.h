/* Shared by the tokenizer encode fuzz targets: loads the tokenizer folders
 * once from $DITD_TOK_DIR (the build tree's tests/unit/tokenizers, which
 * meson builds from tests/fixtures/tokenizers) and checks one encode:
 * valid UTF-8 must encode (bos/eos in place, ids in the vocabulary, mask
 * and padding right, the same ids twice), invalid UTF-8 must be refused
 * with a detail. The first input byte picks max_length.
 */
#ifndef DITD_FUZZ_TOK_COMMON_H
#define DITD_FUZZ_TOK_COMMON_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/error.h"
#include "engine/text/tokenizer.h"

static ditd_tokenizer *fz_load(const char *folder)
{
    const char *root = getenv("DITD_TOK_DIR");
    char dir[1024];
    ditd_tokenizer *t = NULL;
    if (!root) {
        fprintf(stderr, "set DITD_TOK_DIR to build/tests/unit/tokenizers\n");
        abort();
    }
    snprintf(dir, sizeof dir, "%s/%s", root, folder);
    if (ditd_tokenizer_load(dir, &t) != 0) {
        fprintf(stderr, "%s: %s\n", dir, ditd_err_detail());
        abort();
    }
    return t;
}

static int fz_utf8_ok(const uint8_t *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        uint8_t c = s[i];
        size_t k;
        uint32_t cp, min;
        if (c < 0x80) { i++; continue; }
        if ((c & 0xE0) == 0xC0) { k = 2; cp = c & 0x1F; min = 0x80; }
        else if ((c & 0xF0) == 0xE0) { k = 3; cp = c & 0x0F; min = 0x800; }
        else if ((c & 0xF8) == 0xF0) { k = 4; cp = c & 0x07; min = 0x10000; }
        else return 0;
        if (i + k > n) return 0;
        for (size_t j = 1; j < k; j++) {
            if ((s[i + j] & 0xC0) != 0x80) return 0;
            cp = (cp << 6) | (s[i + j] & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
        i += k;
    }
    return 1;
}

static void fz_encode(const ditd_tokenizer *t, const uint8_t *data, size_t size)
{
    static const int lengths[] = {77, 2, 3, 16, 128, 256, 512, 1};
    if (size == 0)
        return;
    int ml = lengths[data[0] % 8];
    const char *text = (const char *)data + 1;
    size_t len = size - 1;
    int32_t *ids = malloc(512 * sizeof(int32_t)), *mask = malloc(512 * sizeof(int32_t));
    int32_t *ids2 = malloc(512 * sizeof(int32_t));
    int n = -1, n2 = -1;
    int clip = ditd_tokenizer_kind(t) == DITD_TOK_CLIP;
    int rc = ditd_tokenizer_encode(t, text, len, ml, ids, mask, &n);
    if (ml < (clip ? 2 : 1)) {
        if (rc != DITD_ERANGE)
            abort();
    } else if (!fz_utf8_ok((const uint8_t *)text, len)) {
        if (rc != DITD_EINVAL || ditd_err_detail()[0] == '\0')
            abort();
    } else {
        if (rc != 0 || n < (clip ? 2 : 1) || n > ml)
            abort();
        if (clip && ids[0] != ditd_tokenizer_bos_id(t))
            abort();
        if (ids[n - 1] != ditd_tokenizer_eos_id(t))
            abort();
        for (int i = 0; i < ml; i++) {
            if (ids[i] < 0 || ids[i] >= ditd_tokenizer_vocab_size(t) || mask[i] != (i < n))
                abort();
            if (i >= n && ids[i] != ditd_tokenizer_pad_id(t))
                abort();
        }
        if (ditd_tokenizer_encode(t, text, len, ml, ids2, NULL, &n2) != 0 || n2 != n
            || memcmp(ids, ids2, (size_t)ml * sizeof(int32_t)) != 0)
            abort();
    }
    free(ids);
    free(ids2);
    free(mask);
}

/* The encode targets' body: byte 1 picks one of two folders (loaded once),
 * byte 0 (kept) the max_length, the rest is the text. */
static int fz_encode_pair(const char *folder0, const char *folder1, const uint8_t *data,
                          size_t size)
{
    static ditd_tokenizer *tok[2];
    if (!tok[0]) {
        tok[0] = fz_load(folder0);
        tok[1] = fz_load(folder1);
    }
    if (size < 2)
        return 0;
    uint8_t *d = malloc(size - 1);
    if (!d)
        return 0;
    d[0] = data[0];
    memcpy(d + 1, data + 2, size - 2);
    fz_encode(tok[data[1] & 1], d, size - 1);
    free(d);
    return 0;
}

#endif
