/* `ditd encode` end to end, as a user runs it: the real binary in a child
 * process, on the encoder fixtures. The saved .npy must equal transformers'
 * output (float64 reference, relative 1e-5) for CLIP text_embeds with a
 * padding mask, CLIP hidden_states[-2] and T5 last_hidden_state, from a
 * component folder and from a pipeline folder (model_index.json,
 * --component); bad input gets a message and a non-zero exit. */
#include <fcntl.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "engine/core/error.h"
#include "engine/io/npy.h"
#include "tests/test_util.h"

static const char *ditd_bin;
static char tmpdir[256];
static char errbuf[8192];

/* Runs ditd with args (NULL-terminated, without argv[0]); exit status,
 * stderr in errbuf. */
static int run(const char *const *args)
{
    return tu_spawn(ditd_bin, args, tmpdir, errbuf, sizeof errbuf);
}

/* "a,b,c;d,e,f" of an int64 (B, N) fixture array. */
static char *rows_of(const char *path)
{
    int64_t s[4], *v = NULL;
    int nd;
    TU_OK(ditd_npy_read_i64(path, 4, &nd, s, &v));
    if (!v)
        return NULL;
    char *out = calloc((size_t)(s[0] * s[1]) * 24 + 1, 1);
    for (int64_t b = 0; b < s[0]; b++)
        for (int64_t j = 0; j < s[1]; j++)
            sprintf(out + strlen(out), "%lld%s", (long long)v[b * s[1] + j],
                    j + 1 < s[1] ? "," : b + 1 < s[0] ? ";" : "");
    free(v);
    return out;
}

static void same_npy(const char *got_path, const char *want_path, const char *what)
{
    int64_t sg[4], sw[4];
    int ng = 0, nw = 0;
    float *g = NULL, *w = NULL;
    TU_OK(ditd_npy_read_f32(got_path, 4, &ng, sg, &g));
    TU_OK(ditd_npy_read_f32(want_path, 4, &nw, sw, &w));
    if (g && w) {
        int same = ng == nw;
        size_t n = 1;
        for (int i = 0; same && i < ng; i++) {
            same = sg[i] == sw[i];
            n *= (size_t)sg[i];
        }
        TU_CHECK(same, "%s: shapes differ", what);
        if (same)
            TU_CLOSE(what, g, w, n, 1e-5);
    }
    free(g);
    free(w);
}

int main(int argc, char **argv)
{
    char fx[4096], ids[4096 + 64], mask[4096 + 64], want[4096 + 64], out[512];
    if (argc < 2) {
        fprintf(stderr, "usage: test_encode PATH/TO/ditd\n");
        return 2;
    }
    ditd_bin = argv[1];
    if (tu_mkdtemp(tmpdir, sizeof tmpdir, "encode"))
        return 1;
    snprintf(fx, sizeof fx, "%s/encoders", tu_fixtures());
    snprintf(out, sizeof out, "%s/out.npy", tmpdir);

    /* CLIPTextModelWithProjection: text_embeds of a padded, masked batch */
    snprintf(ids, sizeof ids, "%s/clip-proj-f16/expected/case1_ids.npy", fx);
    snprintf(mask, sizeof mask, "%s/clip-proj-f16/expected/case1_mask.npy", fx);
    char *ids_s = rows_of(ids), *mask_s = rows_of(mask);
    char model[4096 + 64];
    snprintf(model, sizeof model, "%s/clip-proj-f16", fx);
    if (ids_s && mask_s) {
        const char *a[] = {"encode", "--model", model, "--ids", ids_s, "--mask", mask_s,
                           "--output", "text-embeds", "--save", out, "--threads", "2", NULL};
        TU_CHECK(run(a) == 0, "encode text-embeds: %s", errbuf);
        snprintf(want, sizeof want, "%s/clip-proj-f16/expected/case1_text_embeds.npy", fx);
        same_npy(out, want, "ditd encode clip-proj-f16 --output text-embeds (masked)");
        const char *h[] = {"encode", "--model", model, "--ids", ids_s, "--mask", mask_s,
                           "--output", "hidden:-2", "--save", out, NULL};
        TU_CHECK(run(h) == 0, "encode hidden:-2: %s", errbuf);
        snprintf(want, sizeof want, "%s/clip-proj-f16/expected/case1_hidden3.npy", fx);
        same_npy(out, want, "ditd encode clip-proj-f16 --output hidden:-2");
    }
    free(ids_s);
    free(mask_s);

    /* T5 from a pipeline folder: model_index.json names text_encoder_2 */
    char pipe[512], p[1024];
    snprintf(pipe, sizeof pipe, "%s/pipe", tmpdir);
    mkdir(pipe, 0755);
    snprintf(p, sizeof p, "%s/model_index.json", pipe);
    FILE *f = fopen(p, "w");
    if (f) {
        fputs("{\"_class_name\": \"FluxPipeline\", \"text_encoder\": [\"transformers\", \"CLIPTextModel\"],\n"
              " \"text_encoder_2\": [\"transformers\", \"T5EncoderModel\"]}\n", f);
        fclose(f);
    }
    snprintf(p, sizeof p, "%s/text_encoder", pipe);
    snprintf(model, sizeof model, "%s/clip-quick-f32", fx);
    TU_CHECK(symlink(model, p) == 0, "symlink %s", p);
    snprintf(p, sizeof p, "%s/text_encoder_2", pipe);
    snprintf(model, sizeof model, "%s/t5-relu-f32", fx);
    TU_CHECK(symlink(model, p) == 0, "symlink %s", p);
    snprintf(ids, sizeof ids, "%s/t5-relu-f32/expected/case0_ids.npy", fx);
    snprintf(mask, sizeof mask, "%s/t5-relu-f32/expected/case0_mask.npy", fx);
    ids_s = rows_of(ids);
    mask_s = rows_of(mask);
    if (ids_s && mask_s) {
        const char *a[] = {"encode", "--model", pipe, "--component", "text_encoder_2", "--ids", ids_s,
                           "--mask", mask_s, "--save", out, NULL};
        TU_CHECK(run(a) == 0, "encode T5: %s", errbuf);
        snprintf(want, sizeof want, "%s/t5-relu-f32/expected/case0_last.npy", fx);
        same_npy(out, want, "ditd encode pipeline --component text_encoder_2 (T5, masked)");
        /* the default component is text_encoder (CLIP): T5 ids are in its vocabulary too */
        const char *d[] = {"encode", "--model", pipe, "--ids", "98,1,2,3,98", "--output", "pooled",
                           "--save", out, NULL};
        TU_CHECK(run(d) == 0, "encode default component: %s", errbuf);
    }

    /* refusals: message and exit status */
    struct {
        const char *args[12];
        int rc;
        const char *msg;
    } bad[] = {
        {{"encode", "--model", pipe, "--component", "text_encoder_2", "--ids", "1,2", "--output", "pooled"},
         2, "--output pooled is not one T5EncoderModel has"},
        {{"encode", "--model", pipe, "--component", "text_encoder_3", "--ids", "1"}, 1, "no text_encoder_3"},
        {{"encode", "--model", pipe, "--ids", "1,2,x"}, 1, "expected non-negative integers at \"x\""},
        {{"encode", "--model", pipe, "--ids", "1,2;3"}, 1, "sequence 1 has 1 ids"},
        {{"encode", "--model", pipe, "--ids", "1,2,99999"}, 1, "token id 99999"},
        {{"encode", "--model", pipe, "--ids", "1,2", "--mask", "1"}, 2, "--mask is 1 x 1"},
        {{"encode", "--model", pipe, "--prompt", "a cat"}, 1, "tokenizer"}, /* pipe has none */
        {{"encode", "--model", pipe}, 2, "one of --ids or --prompt"},
        {{"encode", "--model", "/nonexistent", "--ids", "1"}, 1, "/nonexistent/config.json"},
        {{"encode", "--model", pipe, "--ids", "1", "--output", "hidden:9"}, 2, "--output hidden:9"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int rc = run(bad[i].args);
        TU_CHECK(rc == bad[i].rc && strstr(errbuf, bad[i].msg), "case %zu: rc %d (want %d), stderr \"%s\" (want \"%s\")",
                 i, rc, bad[i].rc, errbuf, bad[i].msg);
    }
    /* --prompt through the real CLIP tokenizer (folders unpacked by the unit
     * suite, argv[2]): the ids reach the encoder, whose tiny vocabulary
     * refuses the CLIP bos id 49406 by name; a T5 encoder paired with a CLIP
     * tokenizer is refused naming both. */
    if (argc > 2) {
        char tl[4096 + 64], tgt[4096 + 64];
        snprintf(tgt, sizeof tgt, "%s/clip_hub", argv[2]);
        snprintf(tl, sizeof tl, "%s/tokenizer", pipe);
        TU_CHECK(symlink(tgt, tl) == 0, "symlink %s", tl);
        snprintf(tl, sizeof tl, "%s/tokenizer_2", pipe);
        TU_CHECK(symlink(tgt, tl) == 0, "symlink %s", tl);
        const char *a[] = {"encode", "--model", pipe, "--prompt", "a photo of a cat", NULL};
        int rc = run(a);
        TU_CHECK(rc == 1 && strstr(errbuf, "49406"), "--prompt: rc %d, stderr \"%s\" (want the bos id 49406 named)",
                 rc, errbuf);
        const char *b[] = {"encode", "--model", pipe, "--component", "text_encoder_2", "--prompt", "a cat", NULL};
        rc = run(b);
        TU_CHECK(rc == 1 && strstr(errbuf, "tokenizer; a"), "--prompt, T5 with a CLIP tokenizer: rc %d, \"%s\"",
                 rc, errbuf);
    } else {
        TU_CHECK(0, "no tokenizer folder given (argv[2])");
    }
    free(ids_s);
    free(mask_s);
    snprintf(p, sizeof p, "rm -rf '%s'", tmpdir);
    TU_CHECK(system(p) == 0, "cleanup");
    return tu_exit();
}
