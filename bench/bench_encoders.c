/* Times a text encoder (CLIP or T5) of a model folder on random token ids:
 * load time, encode time (median and min of --repeat runs) and the peak
 * resident set (VmHWM: the mapped checkpoint pages it touched plus its
 * arena). A benchmark: it asserts nothing. bench/bench_encoders.py runs it
 * beside transformers.
 *
 *   bench_encoders --model DIR --tokens N [--batch B] [--repeat K] [--threads T]
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/core/clock.h"
#include "engine/backend/backend.h"
#include "engine/core/error.h"
#include "engine/text/clip_text.h"
#include "engine/text/t5_encoder.h"
#include "engine/text/text_config.h"

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* VmHWM of this process image: unlike ru_maxrss it starts again at exec,
 * so a parent's size (the fork before exec) does not count. */
static double peak_rss_mib(void)
{
    char line[256];
    double kib = -1;
    FILE *f = fopen("/proc/self/status", "r");
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmHWM: %lf kB", &kib) == 1)
            break;
    if (f)
        fclose(f);
    return kib / 1024.0;
}

int main(int argc, char **argv)
{
    const char *model = NULL;
    int N = 77, B = 1, K = 3, T = 0, c;
    static const struct option lo[] = {{"model", required_argument, 0, 'm'},
                                       {"tokens", required_argument, 0, 'n'},
                                       {"batch", required_argument, 0, 'b'},
                                       {"repeat", required_argument, 0, 'r'},
                                       {"threads", required_argument, 0, 't'},
                                       {0, 0, 0, 0}};
    while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        switch (c) {
        case 'm': model = optarg; break;
        case 'n': N = atoi(optarg); break;
        case 'b': B = atoi(optarg); break;
        case 'r': K = atoi(optarg); break;
        case 't': T = atoi(optarg); break;
        default: return 2;
        }
    }
    if (!model || N <= 0 || B <= 0 || K <= 0 || K > 100) {
        fprintf(stderr, "usage: bench_encoders --model DIR --tokens N [--batch B] [--repeat K] [--threads T]\n");
        return 2;
    }
    const ditd_backend_ops *ops = &ditd_backend_cpu;
    int threads = ops->set_threads(T);
    char cfg[4096 + 16];
    ditd_text_config tc;
    snprintf(cfg, sizeof cfg, "%s/config.json", model);
    int err = ditd_text_config_load(cfg, NULL, &tc);
    if (err) {
        fprintf(stderr, "%s: %s\n", ditd_strerror(err), ditd_err_detail());
        return 1;
    }
    int is_t5 = tc.arch == DITD_TEXT_T5;
    int V = is_t5 ? tc.t5.vocab_size : tc.clip.vocab_size, D = is_t5 ? tc.t5.d_model : tc.clip.hidden_size;
    int64_t *ids = malloc((size_t)B * N * sizeof *ids);
    float *out = malloc((size_t)B * N * D * sizeof *out);
    float *pooled = malloc((size_t)B * D * sizeof *pooled);
    if (!ids || !out || !pooled)
        return 1;
    uint64_t s = 88172645463325252ull;
    for (int i = 0; i < B * N; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        ids[i] = (int64_t)(s % (uint64_t)V);
    }
    double t0 = ditd_now_ms();
    ditd_t5_encoder *t5 = NULL;
    ditd_clip_text *clip = NULL;
    err = is_t5 ? ditd_t5_encoder_new(model, NULL, ops, B, N, &t5)
                : ditd_clip_text_new(model, NULL, ops, B, N, &clip);
    double load = ditd_now_ms() - t0;
    if (err) {
        fprintf(stderr, "%s: %s\n", ditd_strerror(err), ditd_err_detail());
        return 1;
    }
    double *ms = calloc((size_t)K, sizeof *ms);
    for (int k = 0; k < K && !err; k++) {
        t0 = ditd_now_ms();
        if (is_t5) {
            err = ditd_t5_encoder_encode(t5, B, N, ids, NULL, out);
        } else {
            ditd_clip_text_out o = {.last = out, .pooled = pooled};
            err = ditd_clip_text_encode(clip, B, N, ids, NULL, &o);
        }
        ms[k] = ditd_now_ms() - t0;
    }
    if (err) {
        fprintf(stderr, "%s: %s\n", ditd_strerror(err), ditd_err_detail());
        return 1;
    }
    qsort(ms, (size_t)K, sizeof *ms, cmp_d);
    size_t borrowed = is_t5 ? ditd_t5_encoder_borrowed_bytes(t5) : ditd_clip_text_borrowed_bytes(clip);
    size_t arena = is_t5 ? ditd_t5_encoder_arena_bytes(t5) : ditd_clip_text_arena_bytes(clip);
    printf("{\"model\": \"%s\", \"class\": \"%s\", \"batch\": %d, \"tokens\": %d, \"threads\": %d, "
           "\"load_ms\": %.1f, \"median_ms\": %.1f, \"min_ms\": %.1f, \"peak_rss_mib\": %.1f, "
           "\"borrowed_mib\": %.1f, \"arena_mib\": %.1f}\n",
           model, ditd_text_arch_name(tc.arch), B, N, threads, load, ms[K / 2], ms[0], peak_rss_mib(),
           borrowed / 1048576.0, arena / 1048576.0);
    free(ms);
    free(ids);
    free(out);
    free(pooled);
    ditd_t5_encoder_free(t5);
    ditd_clip_text_free(clip);
    return 0;
}
