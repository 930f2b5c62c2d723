/* One Wan forward case of the committed fixtures (tests/fixtures/wan/<model>/,
 * made by tools/make_wan_fixtures.py): the inputs as the denoiser interface
 * takes them and Diffusers' float64 output. Shared by the golden and mpi
 * tests. */
#ifndef DITD_TESTS_WAN_CASE_H
#define DITD_TESTS_WAN_CASE_H

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>

#include "engine/io/npy.h"
#include "tests/test_util.h"

static const char *const wan_models[] = {"t2v", "ti2v", "i2v", "i2v21", "flf2v"};
#define WAN_MODELS 5

typedef struct wan_case {
    int B, F, h, w, L;
    float *x, *t, *t_frames, *text, *out; /* t_frames NULL: one timestep per sample */
    float *image;                         /* (B, Li, Di) or NULL: no image branch */
    size_t n_out;
} wan_case;

static float *wan_npy(const char *dir, json_t *c, const char *key, size_t *n)
{
    char path[4096];
    int64_t shape[5];
    int nd;
    float *d = NULL;
    const char *f = json_string_value(json_object_get(c, key));
    if (!f)
        return NULL;
    snprintf(path, sizeof path, "%s/expected/%s", dir, f);
    TU_OK(ditd_npy_read_f32(path, 5, &nd, shape, &d));
    if (d && n) {
        *n = 1;
        for (int i = 0; i < nd; i++)
            *n *= (size_t)shape[i];
    }
    return d;
}

/* The cases of model folder dir (a JSON array, owned: json_decref), or NULL. */
static json_t *wan_cases(const char *dir)
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

static int wan_case_load(const char *dir, json_t *c, wan_case *wc)
{
    wc->B = (int)json_integer_value(json_object_get(c, "B"));
    wc->F = (int)json_integer_value(json_object_get(c, "frames"));
    wc->h = (int)json_integer_value(json_object_get(c, "height"));
    wc->w = (int)json_integer_value(json_object_get(c, "width"));
    wc->L = (int)json_integer_value(json_object_get(c, "text_len"));
    wc->x = wan_npy(dir, c, "x", NULL);
    wc->t = wan_npy(dir, c, "t", NULL);
    wc->t_frames = wan_npy(dir, c, "t_frames", NULL);
    wc->text = wan_npy(dir, c, "text", NULL);
    wc->image = wan_npy(dir, c, "image", NULL);
    wc->out = wan_npy(dir, c, "out", &wc->n_out);
    return wc->x && wc->t && wc->text && wc->out ? 0 : -1;
}

static void wan_case_free(wan_case *wc)
{
    free(wc->x);
    free(wc->t);
    free(wc->t_frames);
    free(wc->text);
    free(wc->image);
    free(wc->out);
}

#endif
