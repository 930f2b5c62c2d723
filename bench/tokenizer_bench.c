/* Tokenizer throughput (not a test): encodes the 2,400 prompts of the
 * tokenizer fixtures through one folder, one thread, as the pipelines call
 * the tokenizers (CLIP 77, T5 the record's length), and prints prompts/s
 * (best of the repeats). Compare with bench/tokenizer_bench.py, which runs
 * the `tokenizers` library on the same prompts.
 *
 *   tokenizer_bench FOLDERS_DIR clip_hub|t5_tf5|... [REPEATS]
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/core/error.h"
#include "engine/text/tokenizer.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s FOLDERS_DIR FOLDER [REPEATS]\n", argv[0]);
        return 2;
    }
    int reps = argc > 3 ? atoi(argv[3]) : 5;
    char path[1024];
    snprintf(path, sizeof(path), "%s/expected.jsonl", argv[1]);
    FILE *f = fopen(path, "rb");
    if (!f) {
        perror(path);
        return 1;
    }
    size_t n = 0, cap = 4096;
    char **text = malloc(cap * sizeof(*text));
    size_t *len = malloc(cap * sizeof(*len));
    int *ml = malloc(cap * sizeof(*ml));
    char *line = NULL;
    size_t lcap = 0;
    int first = 1;
    while (getline(&line, &lcap, f) > 0) {
        if (first) { /* header */
            first = 0;
            continue;
        }
        json_t *j = json_loads(line, JSON_ALLOW_NUL, NULL);
        json_t *p = json_object_get(j, "prompt");
        if (!json_object_get(j, "t5_max_length")) { /* the long-prompt records */
            json_decref(j);
            continue;
        }
        len[n] = json_string_length(p);
        text[n] = malloc(len[n] + 1);
        memcpy(text[n], json_string_value(p), len[n] + 1);
        ml[n] = (int)json_integer_value(json_object_get(j, "t5_max_length"));
        json_decref(j);
        n++;
    }
    free(line);
    fclose(f);
    snprintf(path, sizeof(path), "%s/%s", argv[1], argv[2]);
    double t0 = now_s();
    ditd_tokenizer *t;
    if (ditd_tokenizer_load(path, &t)) {
        fprintf(stderr, "%s: %s\n", path, ditd_err_detail());
        return 1;
    }
    double load = now_s() - t0;
    int clip = ditd_tokenizer_kind(t) == DITD_TOK_CLIP;
    int32_t ids[512], mask[512];
    double best = 1e9;
    long tokens = 0;
    for (int r = 0; r < reps; r++) {
        tokens = 0;
        t0 = now_s();
        for (size_t i = 0; i < n; i++) {
            int nt;
            if (ditd_tokenizer_encode(t, text[i], len[i], clip ? 77 : ml[i], ids, mask, &nt))
                return 1;
            tokens += nt;
        }
        double dt = now_s() - t0;
        if (dt < best)
            best = dt;
    }
    printf("ditd       %-14s load %.0f ms, %zu prompts (%ld tokens): %.0f prompts/s, %.2f us/prompt\n", argv[2],
           load * 1e3, n, tokens, n / best, best / n * 1e6);
    ditd_tokenizer_free(t);
    for (size_t i = 0; i < n; i++)
        free(text[i]);
    free(text);
    free(len);
    free(ml);
    return 0;
}
