/* One FLUX forward case of the committed fixtures (tests/fixtures/flux/<model>/,
 * made by tools/make_flux_fixtures.py): the inputs as the denoiser interface
 * takes them and Diffusers' float64 output. Shared by the golden and mpi
 * tests. */
#ifndef DITD_TESTS_FLUX_CASE_H
#define DITD_TESTS_FLUX_CASE_H

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>

#include "engine/io/npy.h"
#include "tests/test_util.h"

static const char *const flux_models[] = {"tiny-c4", "tiny-c16", "deep-guidance", "heads6"};
#define FLUX_MODELS 4

typedef struct flux_case {
    int B, h, w, L;
    float *x, *t, *text, *pooled, *guidance, *out;
    size_t n_out;
} flux_case;

static float *flux_npy(const char *dir, json_t *c, const char *key, size_t *n)
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
static json_t *flux_cases(const char *dir)
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

static int flux_case_load(const char *dir, json_t *c, flux_case *fc)
{
    fc->B = (int)json_integer_value(json_object_get(c, "B"));
    fc->h = (int)json_integer_value(json_object_get(c, "height"));
    fc->w = (int)json_integer_value(json_object_get(c, "width"));
    fc->L = (int)json_integer_value(json_object_get(c, "text_len"));
    fc->x = flux_npy(dir, c, "x", NULL);
    fc->t = flux_npy(dir, c, "t", NULL);
    fc->text = flux_npy(dir, c, "text", NULL);
    fc->pooled = flux_npy(dir, c, "pooled", NULL);
    fc->guidance = flux_npy(dir, c, "guidance", NULL);
    fc->out = flux_npy(dir, c, "out", &fc->n_out);
    return fc->x && fc->t && fc->text && fc->pooled && fc->guidance && fc->out ? 0 : -1;
}

static void flux_case_free(flux_case *fc)
{
    free(fc->x);
    free(fc->t);
    free(fc->text);
    free(fc->pooled);
    free(fc->guidance);
    free(fc->out);
}

#endif
