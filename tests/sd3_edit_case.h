/* What the SD3 edit tests share (tests/golden/test_sd3_edit.c,
 * tests/cli/test_generate_sd3_edit.c): the expected values of
 * tools/make_sd3_img2img_fixtures.py (tests/fixtures/sd3_img2img/expected/),
 * a case's fields, and the temporary folders some cases run on: an
 * assembled SD3 folder's components linked under another pipeline class
 * (model_index.json's _class_name), or with another scheduler config
 * (sd35_dyn: dynamic shifting). Not a test itself. */
#ifndef DITD_TESTS_SD3_EDIT_CASE_H
#define DITD_TESTS_SD3_EDIT_CASE_H

#include <dirent.h>
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/core/error.h"
#include "engine/io/npy.h"
#include "tests/test_util.h"

#define SD3_EDIT_SET "sd3_img2img"

/* <fixtures>/sd3_img2img/expected/<name> as floats, or (u8) as bytes; NULL
 * after a failed check. *n: its values. */
static void *sd3e_npy(const char *name, size_t *n, int u8)
{
    char path[4096];
    int64_t shape[8];
    int nd;
    float *d = NULL;
    *n = 0;
    if (!name) {
        TU_CHECK(0, "a fixture file is not named in cases.json");
        return NULL;
    }
    snprintf(path, sizeof path, "%s/" SD3_EDIT_SET "/expected/%s", tu_fixtures(), name);
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

static inline int sd3e_int(json_t *c, const char *k)
{
    return (int)json_integer_value(json_object_get(c, k));
}
static inline double sd3e_num(json_t *c, const char *k)
{
    return json_number_value(json_object_get(c, k));
}
static inline const char *sd3e_str(json_t *c, const char *k)
{
    return json_string_value(json_object_get(c, k));
}

/* A temporary folder (tu_mkdtemp with tmpl) with every entry of src linked
 * but model_index.json (rewritten, _class_name cls when not NULL) and, when
 * sched is not NULL, scheduler/ (a folder of its own whose
 * scheduler_config.json is sched). 0, or -1. */
static int sd3e_folder_make(char *out, size_t cap, const char *tmpl, const char *src,
                            const char *cls, json_t *sched)
{
    char a[4096], b[4096];
    if (tu_mkdtemp(out, cap, tmpl))
        return -1;
    DIR *d = opendir(src);
    if (!d)
        return -1;
    struct dirent *e;
    int rc = 0;
    while (!rc && (e = readdir(d))) {
        if (e->d_name[0] == '.' || !strcmp(e->d_name, "model_index.json") ||
            (sched && !strcmp(e->d_name, "scheduler")))
            continue;
        snprintf(a, sizeof a, "%s/%s", src, e->d_name);
        snprintf(b, sizeof b, "%s/%s", out, e->d_name);
        rc = symlink(a, b) ? -1 : 0;
    }
    closedir(d);
    if (rc)
        return -1;
    json_error_t je;
    snprintf(a, sizeof a, "%s/model_index.json", src);
    json_t *mi = json_load_file(a, 0, &je);
    if (!mi)
        return -1;
    if (cls)
        json_object_set_new(mi, "_class_name", json_string(cls));
    snprintf(b, sizeof b, "%s/model_index.json", out);
    rc = json_dump_file(mi, b, JSON_INDENT(2));
    json_decref(mi);
    if (rc || !sched)
        return rc ? -1 : 0;
    json_t *sc = json_deep_copy(sched);
    json_object_set_new(sc, "_class_name", json_string("FlowMatchEulerDiscreteScheduler"));
    snprintf(b, sizeof b, "%s/scheduler", out);
    if (mkdir(b, 0755)) {
        json_decref(sc);
        return -1;
    }
    snprintf(b, sizeof b, "%s/scheduler/scheduler_config.json", out);
    rc = json_dump_file(sc, b, JSON_INDENT(2));
    json_decref(sc);
    return rc ? -1 : 0;
}

/* Removes what sd3e_folder_make made (links, the rewritten files). */
static void sd3e_folder_rm(const char *dir)
{
    char p[4096];
    DIR *d = opendir(dir);
    struct dirent *e;
    if (!d)
        return;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        if (unlink(p)) { /* scheduler/: its one file */
            char q[4200];
            snprintf(q, sizeof q, "%s/scheduler_config.json", p);
            unlink(q);
            rmdir(p);
        }
    }
    closedir(d);
    rmdir(dir);
}

/* The folder a case runs on, under root (the assembled sd3_pipeline
 * folders): its own, or a temporary one (sd35_dyn: sd35 with the dynamic
 * scheduler of cases.json; folder_class: the edit class in
 * model_index.json) that *tmp says to remove (sd3e_folder_rm). 0, or -1. */
static int sd3e_case_folder(json_t *meta, json_t *c, const char *root, char *dir, size_t cap,
                            int *tmp)
{
    const char *folder = sd3e_str(c, "folder");
    int dyn = folder && !strcmp(folder, "sd35_dyn");
    int cls = json_is_true(json_object_get(c, "folder_class"));
    *tmp = 0;
    if (!folder)
        return -1;
    if (!dyn && !cls) {
        snprintf(dir, cap, "%s/%s", root, folder);
        return 0;
    }
    char src[4096];
    snprintf(src, sizeof src, "%s/%s", root, dyn ? "sd35" : folder);
    if (sd3e_folder_make(dir, cap, dyn ? "sd35-dyn" : "sd3-edit-class", src,
                         cls ? sd3e_str(c, "pipeline") : NULL,
                         dyn ? json_object_get(meta, "dynamic_scheduler") : NULL))
        return -1;
    *tmp = 1;
    return 0;
}

#endif
