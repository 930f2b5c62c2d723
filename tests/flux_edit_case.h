/* What the FLUX edit tests share (test_flux_img2img.c, test_flux_inpaint.c):
 * the expected values a fixture tool wrote (tests/fixtures/<set>/expected/),
 * a case's fields, and a temporary folder that links the assembled
 * FLUX.1-dev folder's components under another pipeline class. */
#ifndef DITD_TESTS_FLUX_EDIT_CASE_H
#define DITD_TESTS_FLUX_EDIT_CASE_H

#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/core/error.h"
#include "engine/backend/backend.h"
#include "engine/io/npy.h"
#include "engine/models/model.h"
#include "engine/core/image_resize.h"
#include "engine/pipeline/prompt_encoder.h"
#include "tests/test_util.h"

#ifndef FLUX_PIPELINE_DIR
#error "FLUX_PIPELINE_DIR: the assembled FluxPipeline folders"
#endif

/* <fixtures>/<set>/expected/<name> as floats, or (u8) as bytes; NULL after a
 * failed check. *n: its values. */
static void *edit_npy(const char *set, const char *name, size_t *n, int u8)
{
    char path[4096];
    int64_t shape[8];
    int nd;
    float *d = NULL;
    snprintf(path, sizeof path, "%s/%s/expected/%s", tu_fixtures(), set, name);
    if (ditd_npy_read_f32(path, 8, &nd, shape, &d)) {
        TU_CHECK(0, "%s: %s", path, ditd_err_detail());
        return NULL;
    }
    *n = 1;
    for (int i = 0; i < nd; i++)
        *n *= (size_t)shape[i];
    if (!u8)
        return d;
    uint8_t *b = malloc(*n ? *n : 1);
    for (size_t i = 0; b && i < *n; i++)
        b[i] = (uint8_t)d[i];
    free(d);
    return b;
}

/* a case's fields */
static inline int jint(json_t *c, const char *k)
{
    return (int)json_integer_value(json_object_get(c, k));
}
static inline double jnum(json_t *c, const char *k)
{
    return json_number_value(json_object_get(c, k));
}
static inline const char *jstr(json_t *c, const char *k)
{
    return json_string_value(json_object_get(c, k));
}

/* An input of another size than the output (iw x ih, ch channels): resized
 * to w x h by ditd_image_resize (PIL's Lanczos, as VaeImageProcessor), the
 * bytes checked equal to the processor's (the case's want_key). px is freed;
 * the resized pixels are returned (NULL after a failed check). */
static inline uint8_t *edit_resize_check(const char *set, json_t *c, const char *want_key,
                                         uint8_t *px, int iw, int ih, int ch, int w, int h)
{
    size_t n_rs, n = (size_t)w * h * ch;
    uint8_t *want = edit_npy(set, jstr(c, want_key), &n_rs, 1), *rs = malloc(n);
    size_t same = 0;
    int ok = want && rs && n_rs == n && !ditd_image_resize(px, iw, ih, ch, rs, w, h);
    for (size_t i = 0; ok && i < n; i++)
        same += rs[i] == want[i];
    TU_CHECK(ok && same == n, "%s: the %dx%d %s resized to %dx%d: %zu of %zu bytes equal PIL's "
             "Lanczos", jstr(c, "name"), iw, ih, want_key, w, h, same, n);
    printf("%s  %s: the %dx%d input (%s) resized to %dx%d, %zu of %zu bytes equal PIL's Lanczos\n",
           ok && same == n ? "ok " : "FAIL", jstr(c, "name"), iw, ih, want_key, w, h, same, n);
    free(want);
    free(px);
    if (!(ok && same == n)) {
        free(rs);
        return NULL;
    }
    return rs;
}

static const char *const edit_folder_parts[] = {"scheduler", "text_encoder", "text_encoder_2",
                                                "tokenizer", "tokenizer_2", "transformer", "vae"};
#define EDIT_FOLDER_PARTS (int)(sizeof edit_folder_parts / sizeof *edit_folder_parts)

/* A temporary folder (tu_mkdtemp with tmpl): dev's components linked,
 * model_index.json naming pipeline_class. 0, or -1. */
static int edit_folder_make(char *out, size_t cap, const char *tmpl, const char *pipeline_class)
{
    char src[4096], dst[4096];
    if (tu_mkdtemp(out, cap, tmpl))
        return -1;
    for (int i = 0; i < EDIT_FOLDER_PARTS; i++) {
        snprintf(src, sizeof src, "%s/dev/%s", FLUX_PIPELINE_DIR, edit_folder_parts[i]);
        snprintf(dst, sizeof dst, "%s/%s", out, edit_folder_parts[i]);
        if (symlink(src, dst))
            return -1;
    }
    snprintf(src, sizeof src, "%s/dev/model_index.json", FLUX_PIPELINE_DIR);
    json_error_t je;
    json_t *mi = json_load_file(src, 0, &je);
    if (!mi)
        return -1;
    json_object_set_new(mi, "_class_name", json_string(pipeline_class));
    snprintf(dst, sizeof dst, "%s/model_index.json", out);
    int rc = json_dump_file(mi, dst, JSON_INDENT(2));
    json_decref(mi);
    return rc;
}

static void edit_folder_rm(const char *dir)
{
    char p[4096];
    for (int i = 0; i < EDIT_FOLDER_PARTS; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, edit_folder_parts[i]);
        unlink(p);
    }
    snprintf(p, sizeof p, "%s/model_index.json", dir);
    unlink(p);
    rmdir(dir);
}

/* The case's prompt into te[0] and, when neg != NULL, its negative into
 * te[1], by the folder's encoders on the CPU; *pe, *seq, *pooled the
 * caller frees. 0, or -1 after a failed check. */
static int edit_encode_prompts(const ditd_model_info *info, int L, const char *prompt,
                               const char *neg, ditd_prompt_encoder **pe, float **seq,
                               float **pooled, ditd_text_embeds te[2])
{
    ditd_prompt_encoder_opts o = {.max_sequence_length = L};
    TU_OK(ditd_prompt_encoder_new(info, &ditd_backend_cpu, &o, pe));
    if (!*pe)
        return -1;
    const int Dt = ditd_prompt_encoder_text_dim(*pe), Dp = ditd_prompt_encoder_pooled_dim(*pe);
    *seq = malloc(2 * (size_t)L * Dt * sizeof **seq);
    *pooled = malloc(2 * (size_t)Dp * sizeof **pooled);
    if (!*seq || !*pooled)
        return -1;
    TU_OK(ditd_prompt_encoder_encode(*pe, prompt, strlen(prompt), L, *seq, *pooled));
    te[0] = (ditd_text_embeds){.seq = *seq, .pooled = *pooled};
    if (neg) {
        float *ns = *seq + (size_t)L * Dt, *np = *pooled + Dp;
        TU_OK(ditd_prompt_encoder_encode(*pe, neg, strlen(neg), L, ns, np));
        te[1] = (ditd_text_embeds){.seq = ns, .pooled = np};
    }
    return 0;
}

#endif
