/* Tokenizer ids against transformers 5 (tests/fixtures/tokenizers/, made by
 * tools/make_tokenizer_fixtures.py): every prompt of expected.jsonl through
 * every folder of the asked kind (CLIP: hub, pad "!", transformers-5 saved;
 * T5: hub, spiece.model only, transformers-5 saved), ids and mask compared
 * whole at the pipelines' lengths. With "errors": bad folders and files,
 * invalid UTF-8, lengths, and concurrent encodes on one tokenizer. With
 * "umt5": google/umt5-xxl's real vocabulary (Wan's tokenizer/) against
 * transformers 5 on expected_umt5.jsonl (tools/make_umt5_tokenizer_fixtures.py),
 * and WanPipeline's prompt_clean (ditd_wan_prompt_clean) against Diffusers'
 * (without ftfy), then the ids of the cleaned prompt at 512.
 *
 * usage: test_tokenizer clip|t5|umt5|errors FOLDERS_DIR
 */
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "engine/text/tokenizer.h"
#include "engine/text/prompt_clean.h"
#include "tests/test_util.h"

#define MIN_PROMPTS 2000

static const char *root;

static int check_folder(const char *name, json_t **recs, size_t n, int clip)
{
    char dir[1024];
    snprintf(dir, sizeof(dir), "%s/%s", root, name);
    ditd_tokenizer *t = NULL;
    int err = ditd_tokenizer_load(dir, &t);
    TU_CHECK(err == 0, "load %s: %s %s", dir, ditd_err_name(err), ditd_err_detail());
    if (err)
        return 0;
    TU_CHECK(ditd_tokenizer_kind(t) == (clip ? DITD_TOK_CLIP : DITD_TOK_T5), "%s kind", name);
    int checked = 0, bad = 0;
    int32_t *ids = malloc(1024 * sizeof(int32_t)), *mask = malloc(1024 * sizeof(int32_t));
    for (size_t r = 0; r < n; r++) {
        const json_t *rec = recs[r];
        const json_t *p = json_object_get(rec, "prompt");
        const json_t *want = json_object_get(json_object_get(rec, "ids"), name);
        int ml = clip ? 77 : (int)json_integer_value(json_object_get(rec, "t5_max_length"));
        if (!want)
            continue;
        int nt = -1;
        err = ditd_tokenizer_encode(t, json_string_value(p), json_string_length(p), ml, ids, mask, &nt);
        int ok = err == 0 && nt == (int)json_array_size(want);
        for (int i = 0; ok && i < ml; i++) {
            int32_t w = i < nt ? (int32_t)json_integer_value(json_array_get(want, (size_t)i))
                               : ditd_tokenizer_pad_id(t);
            ok = ids[i] == w && mask[i] == (i < nt);
        }
        if (!ok && bad++ < 8) {
            fprintf(stderr, "FAIL %s prompt %zu %s (len %zu): rc %s, got %d tokens, want %zu\n  got :", name, r,
                    json_dumps(p, JSON_ENCODE_ANY | JSON_ENSURE_ASCII), json_string_length(p), ditd_err_name(err),
                    nt, json_array_size(want));
            for (int i = 0; i < nt && i < 40; i++)
                fprintf(stderr, " %d", ids[i]);
            fprintf(stderr, "\n  want:");
            for (size_t i = 0; i < json_array_size(want) && i < 40; i++)
                fprintf(stderr, " %lld", (long long)json_integer_value(json_array_get(want, i)));
            fputc('\n', stderr);
        }
        tu_checks++;
        if (!ok)
            tu_failures++;
        checked++;
    }
    printf("%-14s %d prompts checked, %d differ (pad id %d)\n", name, checked, bad, ditd_tokenizer_pad_id(t));
    TU_CHECK(checked >= MIN_PROMPTS, "%s: only %d prompts checked", name, checked);
    /* prompts past 1 KB at max_length 4096: across many of ditd's chunks */
    int32_t *lids = malloc(4096 * sizeof(int32_t));
    int long_checked = 0, long_bad = 0;
    for (size_t r = 0; r < n; r++) {
        const json_t *want = json_object_get(json_object_get(recs[r], "long_ids"), name);
        const json_t *p = json_object_get(recs[r], "prompt");
        int ml = (int)json_integer_value(json_object_get(recs[r], "long_max_length"));
        if (!want || ml <= 0 || ml > 4096)
            continue;
        int nt = -1;
        err = ditd_tokenizer_encode(t, json_string_value(p), json_string_length(p), ml, lids, NULL, &nt);
        int ok = err == 0 && nt == (int)json_array_size(want);
        for (int i = 0; ok && i < ml; i++)
            ok = lids[i] == (i < nt ? (int32_t)json_integer_value(json_array_get(want, (size_t)i))
                                    : ditd_tokenizer_pad_id(t));
        if (!ok && long_bad++ < 4) {
            int first = 0;
            while (first < nt && first < (int)json_array_size(want)
                   && lids[first] == json_integer_value(json_array_get(want, (size_t)first)))
                first++;
            fprintf(stderr, "FAIL %s long prompt %zu (%zu bytes): %d tokens, want %zu; first difference at %d\n",
                    name, r, json_string_length(p), nt, json_array_size(want), first);
        }
        tu_checks++;
        if (!ok)
            tu_failures++;
        long_checked++;
    }
    if (long_checked) {
        printf("%-14s %d long prompts (max_length 4096) checked, %d differ\n", name, long_checked, long_bad);
        TU_CHECK(long_checked >= 100, "%s: only %d long prompts checked", name, long_checked);
    }
    free(lids);
    free(ids);
    free(mask);
    ditd_tokenizer_free(t);
    return checked;
}

static json_t **read_expected_file(const char *file, size_t *n, json_t **header)
{
    char path[1024];
    snprintf(path, sizeof(path), "%s/%s", root, file);
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "FAIL: %s missing\n", path);
        exit(1);
    }
    size_t cap = 4096;
    json_t **recs = malloc(cap * sizeof(*recs));
    *n = 0;
    *header = NULL;
    char *line = NULL;
    size_t lcap = 0;
    ssize_t l;
    while ((l = getline(&line, &lcap, f)) > 0) {
        json_error_t je;
        json_t *j = json_loadb(line, (size_t)l, JSON_ALLOW_NUL, &je);
        if (!j) {
            fprintf(stderr, "FAIL: %s: %s\n", path, je.text);
            exit(1);
        }
        if (!*header) {
            *header = j;
            continue;
        }
        if (*n == cap)
            recs = realloc(recs, (cap *= 2) * sizeof(*recs));
        recs[(*n)++] = j;
    }
    free(line);
    fclose(f);
    return recs;
}

static json_t **read_expected(size_t *n, json_t **header)
{
    return read_expected_file("expected.jsonl", n, header);
}

/* ids (nt of them, then padding) equal the reference list `want`; prints the
 * first few failures */
static int same_ids(const char *what, size_t r, const json_t *p, const int32_t *ids, const int32_t *mask, int nt,
                    int ml, int pad, const json_t *want, int *bad)
{
    int ok = nt == (int)json_array_size(want);
    for (int i = 0; ok && i < ml; i++)
        ok = ids[i] == (i < nt ? (int32_t)json_integer_value(json_array_get(want, (size_t)i)) : pad) &&
             (!mask || mask[i] == (i < nt));
    if (!ok && (*bad)++ < 8) {
        fprintf(stderr, "FAIL %s prompt %zu %s: got %d tokens, want %zu\n  got :", what, r,
                json_dumps(p, JSON_ENCODE_ANY | JSON_ENSURE_ASCII), nt, json_array_size(want));
        for (int i = 0; i < nt && i < 40; i++)
            fprintf(stderr, " %d", ids[i]);
        fprintf(stderr, "\n  want:");
        for (size_t i = 0; i < json_array_size(want) && i < 40; i++)
            fprintf(stderr, " %lld", (long long)json_integer_value(json_array_get(want, i)));
        fputc('\n', stderr);
    }
    tu_checks++;
    if (!ok)
        tu_failures++;
    return ok;
}

/* --- umt5: the real vocabulary, and WanPipeline's prompt_clean */
static void check_umt5(void)
{
    size_t n;
    json_t *header;
    json_t **recs = read_expected_file("expected_umt5.jsonl", &n, &header);
    printf("reference: %s, %zu prompts\n", json_string_value(json_object_get(header, "reference")), n);
    char dir[1024];
    snprintf(dir, sizeof(dir), "%s/umt5_hub", root);
    ditd_tokenizer *t = NULL;
    TU_OK(ditd_tokenizer_load(dir, &t));
    if (!t)
        exit(1);
    TU_CHECK(ditd_tokenizer_kind(t) == DITD_TOK_T5 && ditd_tokenizer_vocab_size(t) == 256300 &&
                 ditd_tokenizer_pad_id(t) == 0 && ditd_tokenizer_eos_id(t) == 1,
             "umt5_hub: kind %d, %d pieces (want 256300), pad %d, eos %d", (int)ditd_tokenizer_kind(t),
             ditd_tokenizer_vocab_size(t), ditd_tokenizer_pad_id(t), ditd_tokenizer_eos_id(t));
    int32_t *ids = malloc(4096 * sizeof(int32_t)), *mask = malloc(4096 * sizeof(int32_t));
    int checked = 0, bad = 0, longs = 0, cleaned = 0, clean_bad = 0, ftfy_same = 0, unk = 0, changed = 0;
    for (size_t r = 0; r < n; r++) {
        const json_t *p = json_object_get(recs[r], "prompt");
        int ml = (int)json_integer_value(json_object_get(recs[r], "max_length"));
        const json_t *want = json_object_get(recs[r], "ids");
        int nt = -1;
        int err = ditd_tokenizer_encode(t, json_string_value(p), json_string_length(p), ml, ids, mask, &nt);
        TU_CHECK(err == 0, "umt5 prompt %zu: %s", r, ditd_err_detail());
        if (err)
            continue;
        same_ids("umt5_hub", r, p, ids, mask, nt, ml, 0, want, &bad);
        for (int i = 0; i < nt; i++)
            unk += ids[i] == 2;
        checked++;
        longs += ml == 4096;
        const json_t *cw = json_object_get(recs[r], "clean");
        if (!cw)
            continue;
        char *c = NULL;
        size_t cl = 0;
        err = ditd_wan_prompt_clean(json_string_value(p), json_string_length(p), &c, &cl);
        int ok = err == 0 && cl == json_string_length(cw) && memcmp(c, json_string_value(cw), cl) == 0;
        if (!ok && clean_bad++ < 8)
            fprintf(stderr, "FAIL prompt_clean %zu %s\n  got : %s\n  want: %s\n", r,
                    json_dumps(p, JSON_ENCODE_ANY | JSON_ENSURE_ASCII),
                    c ? json_dumps(json_stringn(c, cl), JSON_ENCODE_ANY | JSON_ENSURE_ASCII) : ditd_err_detail(),
                    json_dumps(cw, JSON_ENCODE_ANY | JSON_ENSURE_ASCII));
        tu_checks++;
        tu_failures += !ok;
        changed += ok && (cl != json_string_length(p) || memcmp(c, json_string_value(p), cl) != 0);
        ftfy_same += json_is_true(json_object_get(recs[r], "ftfy_same"));
        if (ok) {
            err = ditd_tokenizer_encode(t, c, cl, 512, ids, mask, &nt);
            if (!err)
                same_ids("umt5_hub (cleaned, 512)", r, p, ids, mask, nt, 512, 0,
                         json_object_get(recs[r], "clean_ids"), &bad);
        }
        free(c);
        cleaned++;
    }
    printf("umt5_hub: %d prompts (%d at max_length 4096) checked, %d differ; %d tokens are unknowns (id 2)\n",
           checked, longs, bad, unk);
    printf("prompt_clean: %d prompts, %d changed by it, %d differ; %d of them ftfy.fix_text leaves unchanged\n",
           cleaned, changed, clean_bad, ftfy_same);
    TU_CHECK(checked >= 2600 && longs >= 80 && cleaned >= 2600, "only %d prompts, %d long, %d cleaned", checked,
             longs, cleaned);
    TU_CHECK(changed >= 300 && unk >= 500, "the fixture exercises too little: %d cleaned differently, %d unknowns",
             changed, unk);
    TU_CHECK(json_is_true(json_object_get(header, "ftfy")) && ftfy_same >= 900,
             "%d prompts ftfy leaves unchanged (want >= 900)", ftfy_same);
    free(ids);
    free(mask);
    ditd_tokenizer_free(t);
    for (size_t i = 0; i < n; i++)
        json_decref(recs[i]);
    free(recs);
    json_decref(header);
}

/* --- time linear in the input: one word of n and 16n bytes (BPE and
 * Viterbi run over the whole word), best of three each */
static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts); /* CPU time: the machine is shared */
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static double time_encode(const ditd_tokenizer *t, const char *text, size_t n)
{
    int32_t ids[512], mask[512];
    double best = 1e9;
    for (int r = 0; r < 3; r++) {
        double t0 = now_s();
        int err = ditd_tokenizer_encode(t, text, n, 512, ids, mask, NULL);
        double dt = now_s() - t0;
        TU_CHECK(err == 0, "encode of %zu bytes: %s", n, ditd_err_detail());
        if (dt < best)
            best = dt;
    }
    return best;
}

static void linear(const char *folder)
{
    char dir[1024];
    ditd_tokenizer *t = NULL;
    snprintf(dir, sizeof(dir), "%s/%s", root, folder);
    TU_OK(ditd_tokenizer_load(dir, &t));
    if (!t)
        return;
    size_t n = 8 * 1024;
    char *text = malloc(16 * n);
    static const char *pat[] = {"a", "ab", "\xe6\x97\xa5", "!?", "\xc3\xa9"};
    for (size_t p = 0; p < sizeof(pat) / sizeof(*pat); p++) {
        size_t k = strlen(pat[p]);
        for (size_t i = 0; i + k <= 16 * n; i += k)
            memcpy(text + i, pat[p], k);
        size_t n1 = n / k * k, n4 = 16 * n / k * k;
        double t1 = time_encode(t, text, n1), t4 = time_encode(t, text, n4);
        printf("%s one word of \"%s\": %zu bytes %.2f ms, %zu bytes %.2f ms (x%.1f)\n", folder, pat[p], n1,
               t1 * 1e3, n4, t4 * 1e3, t4 / t1);
        /* x16 the data: linear x16, n log n (the BPE heap) about x20, more
         * once the caches are outgrown; quadratic would be x256 */
        TU_CHECK(t4 < 80.0 * t1 + 0.002, "%s: %zu -> %zu bytes took %.3f -> %.3f s: not linear", folder, n1, n4,
                 t1, t4);
    }
    free(text);
    ditd_tokenizer_free(t);
}

/* --- errors */
static void write_file(const char *dir, const char *name, const char *text)
{
    char p[1024];
    snprintf(p, sizeof(p), "%s/%s", dir, name);
    FILE *f = fopen(p, "wb");
    fputs(text, f);
    fclose(f);
}

typedef struct job { const ditd_tokenizer *t; int ml; const char *text; const int32_t *want; int fails; } job;

static void *encode_many(void *arg)
{
    job *j = arg;
    int32_t ids[128], mask[128];
    for (int i = 0; i < 300; i++) {
        int nt;
        if (ditd_tokenizer_encode(j->t, j->text, strlen(j->text), j->ml, ids, mask, &nt)
            || memcmp(ids, j->want, (size_t)j->ml * sizeof(int32_t)))
            j->fails++;
    }
    return NULL;
}

static void errors(void)
{
    char dir[1024];
    ditd_tokenizer *t = NULL;
    snprintf(dir, sizeof(dir), "%s/clip_hub", root);
    TU_OK(ditd_tokenizer_load(dir, &t));
    if (!t)
        return;
    int32_t ids[80], mask[80];
    TU_CHECK_ERR(ditd_tokenizer_encode(t, "a\xff" "b", 3, 77, ids, mask, NULL), DITD_EINVAL, "UTF-8", "byte 1");
    TU_CHECK_ERR(ditd_tokenizer_encode(t, "\xed\xa0\x80", 3, 77, ids, mask, NULL), DITD_EINVAL, "UTF-8");
    TU_CHECK_ERR(ditd_tokenizer_encode(t, "\xc0\xaf", 2, 77, ids, mask, NULL), DITD_EINVAL, "UTF-8");
    TU_CHECK_ERR(ditd_tokenizer_encode(t, "a", 1, 1, ids, mask, NULL), DITD_ERANGE, "max_length 1");
    int nt = 0;
    TU_OK(ditd_tokenizer_encode(t, "a photo of a cat", 16, 2, ids, mask, &nt));
    TU_CHECK(nt == 2 && ids[0] == 49406 && ids[1] == 49407, "max_length 2 keeps bos, eos: %d %d %d", nt, ids[0],
             ids[1]);
    TU_CHECK(ditd_tokenizer_model_max_length(t) == 77 && ditd_tokenizer_vocab_size(t) == 49408,
             "model_max_length %d vocab %d", ditd_tokenizer_model_max_length(t), ditd_tokenizer_vocab_size(t));
    TU_CHECK(ditd_tokenizer_token(t, 320) && strcmp(ditd_tokenizer_token(t, 320), "a</w>") == 0, "token 320");

    /* concurrent encodes on one tokenizer (ThreadSanitizer-free check: same ids) */
    static const char *texts[] = {"A photo of an astronaut riding a horse on mars!", "ÇA VA? 日本語のテキスト 👍🏽",
                                  "it's the <|endoftext|> end", ""};
    int32_t want[4][77];
    pthread_t th[4];
    job jobs[4];
    for (int i = 0; i < 4; i++) {
        TU_OK(ditd_tokenizer_encode(t, texts[i], strlen(texts[i]), 77, want[i], mask, NULL));
        jobs[i] = (job){t, 77, texts[i], want[i], 0};
        pthread_create(&th[i], NULL, encode_many, &jobs[i]);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        TU_CHECK(jobs[i].fails == 0, "thread %d: %d encodes differ", i, jobs[i].fails);
    }
    ditd_tokenizer_free(t);

    /* broken folders */
    char tmp[] = "/tmp/ditd-tok-XXXXXX";
    TU_CHECK(mkdtemp(tmp) != NULL, "mkdtemp");
    TU_CHECK_ERR(ditd_tokenizer_load(tmp, &t), DITD_ENOENT, "no tokenizer files");
    write_file(tmp, "tokenizer_config.json", "{\"tokenizer_class\": \"BertTokenizer\"}");
    TU_CHECK_ERR(ditd_tokenizer_load(tmp, &t), DITD_EUNSUPPORTED, "BertTokenizer");
    write_file(tmp, "tokenizer_config.json", "{\"tokenizer_class\": \"CLIPTokenizer\"");
    TU_CHECK_ERR(ditd_tokenizer_load(tmp, &t), DITD_EFORMAT, "tokenizer_config.json");
    write_file(tmp, "tokenizer_config.json", "{\"tokenizer_class\": \"CLIPTokenizer\"}");
    TU_CHECK_ERR(ditd_tokenizer_load(tmp, &t), DITD_ENOENT, "vocab.json");
    write_file(tmp, "vocab.json", "{\"a\": 0, \"b\": 1, \"<|endoftext|>\": 2, \"<|startoftext|>\": 3}");
    write_file(tmp, "merges.txt", "#version: 0.2\na c\n");
    TU_CHECK_ERR(ditd_tokenizer_load(tmp, &t), DITD_EFORMAT, "merges.txt", "not in the vocabulary");
    write_file(tmp, "merges.txt", "#version: 0.2\na  b\n");
    TU_CHECK_ERR(ditd_tokenizer_load(tmp, &t), DITD_EFORMAT, "merges.txt:2");
    write_file(tmp, "vocab.json", "[1, 2]");
    TU_CHECK_ERR(ditd_tokenizer_load(tmp, &t), DITD_EFORMAT, "vocab.json", "not a JSON object");
    write_file(tmp, "tokenizer_config.json", "{\"tokenizer_class\": \"T5Tokenizer\"}");
    TU_CHECK_ERR(ditd_tokenizer_load(tmp, &t), DITD_ENOENT, "spiece.model");
    write_file(tmp, "spiece.model", "\x0a\x05\x0a\x03\xe2\x96");
    TU_CHECK_ERR(ditd_tokenizer_load(tmp, &t), DITD_EFORMAT, "spiece.model");
    write_file(tmp, "tokenizer.json", "{\"model\": {\"type\": \"Unigram\", \"vocab\": [[\"a\", \"x\"]]}}");
    TU_CHECK_ERR(ditd_tokenizer_load(tmp, &t), DITD_EFORMAT, "tokenizer.json", "vocab[0]");
    write_file(tmp, "tokenizer.json", "{\"model\": {\"type\": \"Unigram\", \"unk_id\": 0, \"vocab\": [[\"<unk>\", 0], "
               "[\"</s>\", 0], [\"<pad>\", 0], [\"\\u2581a\", -1]]}, \"normalizer\": {\"type\": \"Precompiled\", "
               "\"precompiled_charsmap\": \"AAAA\"}}");
    TU_CHECK_ERR(ditd_tokenizer_load(tmp, &t), DITD_EFORMAT, "charsmap");
    write_file(tmp, "tokenizer.json", "{\"model\": {\"type\": \"Unigram\", \"unk_id\": 0, \"vocab\": [[\"<unk>\", 0], "
               "[\"</s>\", 0], [\"<pad>\", 0], [\"\\u2581a\", -1]]}}");
    TU_OK(ditd_tokenizer_load(tmp, &t));
    if (t) {
        /* "a b a": "\u2581a" 3; "\u2581b" has no piece: two unknowns fused to
         * id 2, not the file's unk_id 0 (transformers 5's T5Tokenizer builds
         * its Unigram with unk_id=2: it gives [3, 2, 3, 1, 2, 2] here);
         * "\u2581a" 3; </s> 1; padding <pad> 2 */
        TU_OK(ditd_tokenizer_encode(t, "a b a", 5, 6, ids, mask, &nt));
        TU_CHECK(nt == 4 && ids[0] == 3 && ids[1] == 2 && ids[2] == 3 && ids[3] == 1 && ids[4] == 2 && ids[5] == 2,
                 "tiny unigram: %d [%d %d %d %d %d %d]", nt, ids[0], ids[1], ids[2], ids[3], ids[4], ids[5]);
        ditd_tokenizer_free(t);
    }
    const char *names[] = {"tokenizer_config.json", "vocab.json", "merges.txt", "spiece.model", "tokenizer.json"};
    for (int i = 0; i < 5; i++) {
        char p[1100];
        snprintf(p, sizeof(p), "%s/%s", tmp, names[i]);
        unlink(p);
    }
    rmdir(tmp);

    /* through model_index.json */
    static const struct { const char *comp; ditd_tok_kind kind; } comps[] = {
        {"clip_hub", DITD_TOK_CLIP}, {"clip_tf5", DITD_TOK_CLIP}, {"t5_hub", DITD_TOK_T5}, {"t5_spm", DITD_TOK_T5}};
    for (int i = 0; i < 4; i++) {
        t = NULL;
        TU_OK(ditd_tokenizer_load_component(root, comps[i].comp, &t));
        TU_CHECK(t && ditd_tokenizer_kind(t) == comps[i].kind, "%s kind", comps[i].comp);
        ditd_tokenizer_free(t);
    }
    TU_CHECK_ERR(ditd_tokenizer_load_component(root, "clip_pad_excl", &t), DITD_EFORMAT, "T5TokenizerFast",
                 "clip tokenizer");
    TU_CHECK_ERR(ditd_tokenizer_load_component(root, "t5_tf5", &t), DITD_EUNSUPPORTED, "GPT2Tokenizer");
    TU_CHECK_ERR(ditd_tokenizer_load_component(root, "scheduler", &t), DITD_EUNSUPPORTED, "scheduler");
    TU_CHECK_ERR(ditd_tokenizer_load_component(root, "tokenizer_3", &t), DITD_ENOENT, "tokenizer_3");
    TU_CHECK_ERR(ditd_tokenizer_load_component("/nonexistent", "tokenizer", &t), DITD_ENOENT, "model_index.json");

    ditd_tok_kind k;
    TU_CHECK(ditd_tok_kind_from_str("T5TokenizerFast", &k) == 0 && k == DITD_TOK_T5, "from_str");
    TU_CHECK(strcmp(ditd_tok_kind_name(DITD_TOK_CLIP), "clip") == 0, "name");
    TU_CHECK_ERR(ditd_tok_kind_from_str("gpt2", &k), DITD_EUNSUPPORTED, "gpt2");
    linear("clip_hub");
    linear("t5_tf5");
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s clip|t5|errors FOLDERS_DIR\n", argv[0]);
        return 2;
    }
    root = argv[2];
    if (strcmp(argv[1], "errors") == 0) {
        errors();
    } else if (strcmp(argv[1], "umt5") == 0) {
        check_umt5();
    } else {
        int clip = strcmp(argv[1], "clip") == 0;
        size_t n;
        json_t *header;
        json_t **recs = read_expected(&n, &header);
        printf("reference: %s, %zu prompts\n", json_string_value(json_object_get(header, "reference")), n);
        TU_CHECK(n >= MIN_PROMPTS, "only %zu prompts in expected.jsonl", n);
        const char *key;
        json_t *v;
        int folders = 0;
        json_object_foreach(json_object_get(header, "folders"), key, v) {
            if (strcmp(json_string_value(json_object_get(v, "kind")), clip ? "clip" : "t5") != 0)
                continue;
            check_folder(key, recs, n, clip);
            folders++;
        }
        TU_CHECK(folders == 3, "%d %s folders (want 3)", folders, argv[1]);
        TU_CHECK(json_integer_value(json_object_get(header, "long_count")) >= 100, "long prompts in the fixture");
        for (size_t i = 0; i < n; i++)
            json_decref(recs[i]);
        free(recs);
        json_decref(header);
    }
    printf("%d checks, %d failures\n", tu_checks, tu_failures);
    return tu_failures ? 1 : 0;
}
