/* `ditd encode`: token ids to text-encoder embeddings, no server. For users
 * checking parity with Diffusers/transformers: prints the ids and a summary
 * of the output, and writes it to .npy.
 *
 * What it is not: a tokenizer. Text reaches ids through encode_tokenize()
 * (the one call site for engine/text/tokenizer.h); --ids gives them directly.
 */
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "engine/backend/backend.h"
#include "engine/core/error.h"
#include "engine/io/npy.h"
#include "engine/text/clip_text.h"
#include "engine/text/t5_encoder.h"
#include "engine/text/tokenizer.h"
#include "engine/text/text_config.h"
#include "server/cmd/cli.h"
#include "server/cmd/cmd.h"

#define MAX_IDS 4096

static void usage(FILE *f)
{
    fprintf(f,
            "usage: ditd encode --model DIR (--ids IDS | --prompt TEXT) [options]\n"
            "\n"
            "  --model DIR        a Diffusers pipeline folder (model_index.json) or one\n"
            "                     text-encoder folder (config.json + model.safetensors)\n"
            "  --component NAME   in a pipeline folder: text_encoder (default, else the\n"
            "                     first of text_encoder_2, text_encoder_3 present)\n"
            "  --ids IDS          token ids, comma-separated; ';' separates sequences of\n"
            "                     equal length (a batch)\n"
            "  --mask M           attention mask in the same shape as --ids (1 attend,\n"
            "                     0 padding); default all 1, as Diffusers calls CLIP and T5\n"
            "  --prompt TEXT      text, tokenized with the component's tokenizer folder\n"
            "  --max-length N     --prompt: pad/truncate to N tokens (default: CLIP 77, T5 512)\n"
            "  --output WHAT      last (default: last_hidden_state) | pooled | text-embeds\n"
            "                     (CLIPTextModelWithProjection) | hidden:I (CLIP\n"
            "                     hidden_states[I], I may be negative: hidden:-2 is SD3's)\n"
            "  --save FILE.npy    write the output, float32 (B, N, D) or (B, D)\n"
            "  --threads T        CPU threads (default: all)\n");
}

static int fail(const char *what, int err)
{
    const char *d = ditd_err_detail();
    fprintf(stderr, "ditd encode: %s: %s%s%s\n", what, ditd_strerror(err), *d ? ": " : "", d);
    return 1;
}

/* "1,2,3;4,5,6" -> (B, N) int64; 0 or DITD_EINVAL naming the fault. */
static int parse_rows(const char *s, const char *flag, int64_t *out, int *B, int *N)
{
    int b = 0, n = 0, row_n = -1;
    const char *p = s;
    while (*p) {
        char *end;
        long long v = strtoll(p, &end, 10);
        if (end == p || v < 0)
            return ditd_err_set(DITD_EINVAL, "%s: \"%s\": expected non-negative integers at \"%.20s\"",
                                flag, s, p);
        if (b * (row_n > 0 ? row_n : 0) + n >= MAX_IDS)
            return ditd_err_set(DITD_EINVAL, "%s: more than %d ids", flag, MAX_IDS);
        out[(size_t)b * (size_t)(row_n > 0 ? row_n : 0) + (size_t)n] = v;
        n++;
        p = end;
        while (*p == ' ')
            p++;
        if (*p == ',') {
            p++;
        } else if (*p == ';' || !*p) {
            if (row_n >= 0 && n != row_n)
                return ditd_err_set(DITD_EINVAL, "%s: sequence %d has %d ids, the first has %d",
                                    flag, b, n, row_n);
            row_n = n;
            b++;
            n = 0;
            if (*p)
                p++;
        } else {
            return ditd_err_set(DITD_EINVAL, "%s: \"%s\": unexpected '%c'", flag, s, *p);
        }
    }
    if (b == 0 || row_n <= 0)
        return ditd_err_set(DITD_EINVAL, "%s: no ids", flag);
    *B = b;
    *N = row_n;
    return 0;
}

/* Text to ids with the tokenizer of the component (tok_dir, e.g. tokenizer_2/
 * for text_encoder_2/): the single place where ditd encode meets the
 * tokenizer. Pads/truncates to max_length as the Diffusers pipelines do. */
static int encode_tokenize(const char *tok_dir, ditd_text_arch arch, const char *prompt,
                           int max_length, int64_t *ids, int *n)
{
    ditd_tok_kind want = arch == DITD_TEXT_T5 ? DITD_TOK_T5 : DITD_TOK_CLIP;
    ditd_tokenizer *tok = NULL;
    int32_t *ids32 = NULL;
    int err;
    if ((err = ditd_tokenizer_load(tok_dir, &tok)))
        return err;
    if (ditd_tokenizer_kind(tok) != want) {
        err = ditd_err_set(DITD_EINVAL, "%s is a %s tokenizer; a %s encoder needs a %s one", tok_dir,
                           ditd_tok_kind_name(ditd_tokenizer_kind(tok)), ditd_text_arch_name(arch),
                           ditd_tok_kind_name(want));
        goto done;
    }
    if (!(ids32 = malloc((size_t)max_length * sizeof *ids32))) {
        err = DITD_ENOMEM;
        goto done;
    }
    /* The pipelines pass no attention mask to the encoders: padding is
     * attended to, so the tokenizer's mask is not used here. */
    if ((err = ditd_tokenizer_encode(tok, prompt, strlen(prompt), max_length, ids32, NULL, NULL)))
        goto done;
    for (int i = 0; i < max_length; i++)
        ids[i] = ids32[i];
    *n = max_length;
done:
    free(ids32);
    ditd_tokenizer_free(tok);
    return err;
}

/* The component folder and model_index.json's class for it (when the
 * folder is a pipeline). */
static int find_component(const char *model, const char *component, char *dir, size_t dlen,
                          char *tok, size_t tlen, char *cls, size_t clen)
{
    char path[4096 + 32];
    json_error_t jerr;
    struct stat sb;
    cls[0] = 0;
    snprintf(path, sizeof path, "%s/model_index.json", model);
    if (stat(path, &sb) != 0) { /* a component folder itself */
        if (component)
            return ditd_err_set(DITD_EINVAL, "--component %s: %s has no model_index.json",
                                component, model);
        snprintf(dir, dlen, "%s", model);
        /* text_encoder_2/ -> ../tokenizer_2/, as a pipeline folder pairs them */
        const char *base = strrchr(model, '/') ? strrchr(model, '/') + 1 : model;
        const char *suffix = strncmp(base, "text_encoder", 12) == 0 ? base + 12 : "";
        snprintf(tok, tlen, "%s/../tokenizer%s", model, suffix);
        return 0;
    }
    json_t *idx = json_load_file(path, 0, &jerr);
    if (!idx)
        return ditd_err_set(DITD_EFORMAT, "%s: line %d: %s", path, jerr.line, jerr.text);
    static const char *const names[] = {"text_encoder", "text_encoder_2", "text_encoder_3"};
    static const char *const toks[] = {"tokenizer", "tokenizer_2", "tokenizer_3"};
    int err = 0, k = -1;
    for (int i = 0; i < 3; i++) {
        json_t *e = json_object_get(idx, names[i]);
        int present = json_is_array(e) && json_is_string(json_array_get(e, 1));
        if (component ? strcmp(component, names[i]) == 0 : present) {
            if (!present) {
                err = ditd_err_set(DITD_ENOENT, "%s: no %s component", path, names[i]);
                goto done;
            }
            k = i;
            snprintf(cls, clen, "%s", json_string_value(json_array_get(e, 1)));
            break;
        }
    }
    if (k < 0) {
        err = component ? ditd_err_set(DITD_EINVAL,
                                       "--component %s (text_encoder, text_encoder_2, text_encoder_3)",
                                       component)
                        : ditd_err_set(DITD_ENOENT, "%s names no text encoder", path);
        goto done;
    }
    snprintf(dir, dlen, "%s/%s", model, names[k]);
    snprintf(tok, tlen, "%s/%s", model, toks[k]);
done:
    json_decref(idx);
    return err;
}

static void summary(const char *what, const float *x, int ndim, const int64_t *shape)
{
    size_t n = 1;
    for (int i = 0; i < ndim; i++)
        n *= (size_t)shape[i];
    double s = 0, ss = 0;
    for (size_t i = 0; i < n; i++) {
        s += x[i];
        ss += (double)x[i] * x[i];
    }
    double mean = s / (double)n, sd = sqrt(ss / (double)n - mean * mean > 0 ? ss / (double)n - mean * mean : 0);
    printf("%s (", what);
    for (int i = 0; i < ndim; i++)
        printf("%s%lld", i ? ", " : "", (long long)shape[i]);
    printf("): mean %.6g std %.6g\n  first:", mean, sd);
    for (size_t i = 0; i < n && i < 6; i++)
        printf(" %.6g", x[i]);
    printf("\n");
}

int ditd_cmd_encode(int argc, char **argv)
{
    enum { O_MODEL = 256, O_COMPONENT, O_IDS, O_MASK, O_PROMPT, O_MAXLEN, O_OUTPUT, O_SAVE, O_THREADS };
    static const struct option longopts[] = {
        {"model", required_argument, 0, O_MODEL},   {"component", required_argument, 0, O_COMPONENT},
        {"ids", required_argument, 0, O_IDS},       {"mask", required_argument, 0, O_MASK},
        {"prompt", required_argument, 0, O_PROMPT}, {"max-length", required_argument, 0, O_MAXLEN},
        {"output", required_argument, 0, O_OUTPUT}, {"save", required_argument, 0, O_SAVE},
        {"threads", required_argument, 0, O_THREADS}, {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0}};
    const char *model = NULL, *component = NULL, *ids_s = NULL, *mask_s = NULL, *prompt = NULL;
    const char *output = "last", *save = NULL;
    long max_length = 0, threads = 0;
    int c, err, rc = 1;
    static int64_t ids[MAX_IDS], maskv[MAX_IDS];
    uint8_t keep[MAX_IDS];
    int B = 0, N = 0, mB = 0, mN = 0;

    optind = 1;
    while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        err = 0;
        switch (c) {
        case O_MODEL: model = optarg; break;
        case O_COMPONENT: component = optarg; break;
        case O_IDS: ids_s = optarg; break;
        case O_MASK: mask_s = optarg; break;
        case O_PROMPT: prompt = optarg; break;
        case O_MAXLEN: err = ditd_parse_long(optarg, 1, MAX_IDS, "--max-length", &max_length); break;
        case O_OUTPUT: output = optarg; break;
        case O_SAVE: save = optarg; break;
        case O_THREADS: err = ditd_parse_long(optarg, 1, 4096, "--threads", &threads); break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
        if (err)
            return fail("bad option", err);
    }
    if (optind < argc) {
        fprintf(stderr, "ditd encode: unexpected argument \"%s\"\n", argv[optind]);
        return 2;
    }
    if (!model || !ids_s == !prompt) {
        fprintf(stderr, "ditd encode: needs --model and one of --ids or --prompt\n\n");
        usage(stderr);
        return 2;
    }

    char dir[4096], tok[4096], cls[128];
    ditd_text_config tc;
    if ((err = find_component(model, component, dir, sizeof dir, tok, sizeof tok, cls, sizeof cls)))
        return fail("model", err);
    char cfg_path[4096 + 16];
    snprintf(cfg_path, sizeof cfg_path, "%s/config.json", dir);
    if ((err = ditd_text_config_load(cfg_path, cls[0] ? cls : NULL, &tc)))
        return fail("config", err);
    int is_t5 = tc.arch == DITD_TEXT_T5;

    /* what to return */
    enum { OUT_LAST, OUT_POOLED, OUT_EMBEDS, OUT_HIDDEN } what = OUT_LAST;
    long hidden = 0;
    if (strcmp(output, "last") == 0) {
        what = OUT_LAST;
    } else if (!is_t5 && strcmp(output, "pooled") == 0) {
        what = OUT_POOLED;
    } else if (tc.arch == DITD_TEXT_CLIP_PROJ && strcmp(output, "text-embeds") == 0) {
        what = OUT_EMBEDS;
    } else if (!is_t5 && strncmp(output, "hidden:", 7) == 0 &&
               !ditd_parse_long(output + 7, -1 - tc.clip.num_layers, tc.clip.num_layers, "--output hidden:I",
                                &hidden)) {
        what = OUT_HIDDEN;
    } else {
        fprintf(stderr, "ditd encode: --output %s is not one %s has (%s)\n", output,
                ditd_text_arch_name(tc.arch),
                is_t5 ? "last" : tc.arch == DITD_TEXT_CLIP_PROJ
                                     ? "last, pooled, text-embeds, hidden:I"
                                     : "last, pooled, hidden:I");
        return 2;
    }

    /* the ids */
    if (ids_s) {
        if ((err = parse_rows(ids_s, "--ids", ids, &B, &N)))
            return fail("ids", err);
    } else {
        int n = 0;
        if (!max_length)
            max_length = is_t5 ? 512 : tc.clip.max_positions;
        if ((err = encode_tokenize(tok, tc.arch, prompt, (int)max_length, ids, &n)))
            return fail("prompt", err);
        B = 1;
        N = n;
    }
    if (mask_s) {
        if ((err = parse_rows(mask_s, "--mask", maskv, &mB, &mN)))
            return fail("mask", err);
        if (mB != B || mN != N) {
            fprintf(stderr, "ditd encode: --mask is %d x %d, the ids %d x %d\n", mB, mN, B, N);
            return 2;
        }
        for (int i = 0; i < B * N; i++)
            keep[i] = maskv[i] != 0;
    }
    if (threads)
        ditd_backend_cpu.set_threads((int)threads);

    printf("%s %s: %d x %d token ids\n", ditd_text_arch_name(tc.arch), dir, B, N);
    for (int b = 0; b < B; b++) {
        printf("  ids[%d]:", b);
        for (int j = 0; j < N; j++)
            printf(" %lld", (long long)ids[(size_t)b * N + j]);
        printf("\n");
    }

    int D = is_t5 ? tc.t5.d_model : tc.clip.hidden_size;
    int64_t shape[3] = {B, N, D};
    int ndim = 3;
    if (what == OUT_POOLED || what == OUT_EMBEDS) {
        ndim = 2;
        shape[1] = what == OUT_EMBEDS ? tc.clip.projection_dim : D;
    }
    size_t n = (size_t)shape[0] * (size_t)shape[1] * (ndim == 3 ? (size_t)D : 1);
    float *y = calloc(n, sizeof *y);
    if (!y)
        return fail("output", ditd_err_set(DITD_ENOMEM, "%zu floats", n));
    const char *name = "last_hidden_state";
    if (is_t5) {
        ditd_t5_encoder *m = NULL;
        if ((err = ditd_t5_encoder_new(dir, cls[0] ? cls : NULL, &ditd_backend_cpu, B, N, &m))) {
            fail("load", err);
            goto out;
        }
        err = ditd_t5_encoder_encode(m, B, N, ids, mask_s ? keep : NULL, y);
        ditd_t5_encoder_free(m);
    } else {
        ditd_clip_text *m = NULL;
        if ((err = ditd_clip_text_new(dir, cls[0] ? cls : NULL, &ditd_backend_cpu, B, N, &m))) {
            fail("load", err);
            goto out;
        }
        ditd_clip_text_out o = {0};
        switch (what) {
        case OUT_LAST: o.last = y; break;
        case OUT_POOLED: o.pooled = y; name = "pooler_output"; break;
        case OUT_EMBEDS: o.text_embeds = y; name = "text_embeds"; break;
        case OUT_HIDDEN: o.hidden = y; o.hidden_index = (int)hidden; name = "hidden_states[I]"; break;
        }
        err = ditd_clip_text_encode(m, B, N, ids, mask_s ? keep : NULL, &o);
        ditd_clip_text_free(m);
    }
    if (err) {
        fail("encode", err);
        goto out;
    }
    summary(name, y, ndim, shape);
    if (save) {
        if ((err = ditd_npy_write_f32(save, ndim, shape, y))) {
            fail("save", err);
            goto out;
        }
        printf("wrote %s\n", save);
    }
    rc = 0;
out:
    free(y);
    return rc;
}
