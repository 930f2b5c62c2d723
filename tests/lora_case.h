/* What the LoRA golden tests share (test_lora, test_lora_sd3wan): the
 * adapters a fixture's cases.json names, opened for a pipeline's denoiser
 * and uploaded, and a case's per-sample set built from its JSON list
 * [{adapter, scale}]. Header-only, as tests/test_util.h. */
#ifndef DITD_TESTS_LORA_CASE_H
#define DITD_TESTS_LORA_CASE_H

#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "engine/models/lora.h"
#include "engine/pipeline/pipeline.h"
#include "tests/test_util.h"

#define LC_MAX_AD 4

typedef struct lc_adapters {
    int n;
    const char *name[LC_MAX_AD]; /* borrowed from the JSON */
    ditd_lora_dev *dev[LC_MAX_AD];
} lc_adapters;

/* Every {name: file} of files (file under dir) opened for p's denoiser and
 * uploaded; a file that does not open is a failed check. */
static inline void lc_open_adapters(const ditd_pipeline *p, json_t *files, const char *dir,
                                    lc_adapters *ad)
{
    const char *key;
    json_t *v;
    ad->n = 0;
    json_object_foreach(files, key, v) {
        char path[4300];
        ditd_lora *l = NULL;
        snprintf(path, sizeof path, "%s/%s", dir, json_string_value(v));
        TU_OK(ditd_lora_open(path, key, p->den->lora_targets, p->den->n_lora_targets, &l));
        if (!l || ad->n == LC_MAX_AD) {
            ditd_lora_free(l);
            continue;
        }
        ad->name[ad->n] = key;
        TU_OK(ditd_lora_dev_new(l, p->ops, p->den->lora_targets, p->den->n_lora_targets,
                                &ad->dev[ad->n]));
        if (ad->dev[ad->n])
            ad->n++;
        ditd_lora_free(l);
    }
}

static inline void lc_free_adapters(lc_adapters *ad)
{
    for (int i = 0; i < ad->n; i++)
        ditd_lora_dev_free(ad->dev[i]);
    ad->n = 0;
}

/* A sample's set from its JSON list [{adapter, scale}]: 0, or -1 (an
 * adapter not opened, or too many). */
static inline int lc_make_set(const lc_adapters *ad, json_t *list, ditd_lora_set *s)
{
    size_t i;
    json_t *u;
    memset(s, 0, sizeof *s);
    json_array_foreach(list, i, u) {
        const char *n = json_string_value(json_object_get(u, "adapter"));
        int k = 0;
        while (k < ad->n && strcmp(ad->name[k], n))
            k++;
        TU_CHECK(k < ad->n, "adapter %s not opened", n);
        if (k == ad->n || s->n == DITD_LORA_MAX_SET)
            return -1;
        s->ad[s->n] = ad->dev[k];
        s->weight[s->n++] = (float)json_number_value(json_object_get(u, "scale"));
    }
    return 0;
}

#endif
