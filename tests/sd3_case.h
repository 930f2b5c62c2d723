/* One SD3 forward case of the committed fixtures (tests/fixtures/sd3/<model>/,
 * made by tools/make_sd3_fixtures.py): the inputs as the denoiser interface
 * takes them, the blocks skip-layer guidance skips, Diffusers' float64
 * output and how far Diffusers' own bf16 run is from it. Shared by the golden and mpi tests. */
#ifndef DITD_TESTS_SD3_CASE_H
#define DITD_TESTS_SD3_CASE_H

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>

#include "engine/io/npy.h"
#include "tests/test_util.h"

static const char *const sd3_models[] = {"sd3-tiny", "sd35-tiny", "sd35-bf16"};
#define SD3_MODELS 3
#define SD3_MAX_SKIP 8

typedef struct sd3_case {
    int B, h, w, L;
    int skip[SD3_MAX_SKIP], n_skip;
    float *x, *t, *text, *pooled, *out;
    size_t n_out;
    double bf16_rel, bf16_rel_l2; /* Diffusers in bf16 against its float64 out */
} sd3_case;

static float *sd3_npy(const char *dir, json_t *c, const char *key, size_t *n)
{
    char path[4096];
    int64_t shape[4];
    int nd;
    float *d = NULL;
    snprintf(path, sizeof path, "%s/expected/%s", dir, json_string_value(json_object_get(c, key)));
    TU_OK(ditd_npy_read_f32(path, 4, &nd, shape, &d));
    if (d && n) {
        *n = 1;
        for (int i = 0; i < nd; i++)
            *n *= (size_t)shape[i];
    }
    return d;
}

/* The cases of model folder dir (a JSON array, owned: json_decref), or NULL. */
static json_t *sd3_cases(const char *dir)
{
    char path[4096];
    json_error_t jerr;
    snprintf(path, sizeof path, "%s/expected/cases.json", dir);
    json_t *root = json_load_file(path, 0, &jerr);
    TU_CHECK(root != NULL, "%s: %s", path, jerr.text);
    if (!root)
        return NULL;
    json_t *fwd = json_incref(json_object_get(root, "forward"));
    json_decref(root);
    return fwd;
}

static int sd3_case_load(const char *dir, json_t *c, sd3_case *fc)
{
    json_t *sk = json_object_get(c, "skip_layers"), *e;
    size_t i;
    fc->B = (int)json_integer_value(json_object_get(c, "B"));
    fc->h = (int)json_integer_value(json_object_get(c, "height"));
    fc->w = (int)json_integer_value(json_object_get(c, "width"));
    fc->L = (int)json_integer_value(json_object_get(c, "text_len"));
    fc->bf16_rel = json_number_value(json_object_get(c, "bf16_rel"));
    fc->bf16_rel_l2 = json_number_value(json_object_get(c, "bf16_rel_l2"));
    fc->n_skip = 0;
    json_array_foreach(sk, i, e) {
        if (fc->n_skip < SD3_MAX_SKIP)
            fc->skip[fc->n_skip++] = (int)json_integer_value(e);
    }
    fc->x = sd3_npy(dir, c, "x", NULL);
    fc->t = sd3_npy(dir, c, "t", NULL);
    fc->text = sd3_npy(dir, c, "text", NULL);
    fc->pooled = sd3_npy(dir, c, "pooled", NULL);
    fc->out = sd3_npy(dir, c, "out", &fc->n_out);
    return fc->x && fc->t && fc->text && fc->pooled && fc->out ? 0 : -1;
}

static void sd3_case_free(sd3_case *fc)
{
    free(fc->x);
    free(fc->t);
    free(fc->text);
    free(fc->pooled);
    free(fc->out);
}

#endif
