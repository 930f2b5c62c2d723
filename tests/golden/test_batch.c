/* Batch composition: a sample's result does not depend on what else is in
 * its batch (mixed guidance, other classes and seeds), and dropping a sample
 * mid-way (cancellation) leaves the others exactly as they would be. */
#include "engine/backend/backend.h"
#include "engine/models/model.h"
#include "engine/pipeline/pipeline.h"
#include "tests/test_util.h"

typedef struct drop {
    int at_step, which;
} drop;

static int drop_one(void *ud, int step, int total, const float *x0, uint8_t *active)
{
    drop *d = ud;
    (void)total;
    (void)x0;
    if (step == d->at_step && active)
        active[d->which] = 0;
    return 0;
}

static int stop_all(void *ud, int step, int total, const float *x0, uint8_t *active)
{
    (void)ud;
    (void)total;
    (void)x0;
    (void)active;
    return step == 2;
}

int main(void)
{
    char dir[4096];
    ditd_model_info info;
    ditd_pipeline *p = NULL;
    const char *models[] = {"tiny-p2-c4-sigma", "tiny-p2-c1-h6"};
    ditd_sampler_kind kinds[] = {DITD_SAMPLER_DPMPP_2M, DITD_SAMPLER_DDIM};

    for (int mi = 0; mi < 2; mi++) {
        snprintf(dir, sizeof dir, "%s/models/%s", tu_fixtures(), models[mi]);
        TU_OK(ditd_model_info_load(dir, &info));
        TU_OK(ditd_pipeline_new(&info, &ditd_backend_cpu, 3, &p));
        if (!p)
            return tu_exit();
        size_t numel = p->numel;
        ditd_gen_params gp = {.steps = 6, .sampler = kinds[mi]};
        ditd_gen_sample s[3] = {
            {.seed = 11, .index = 0, .cond.class_id = 1, .guidance = 4.0f},
            {.seed = 12, .index = 0, .cond.class_id = 2, .guidance = 1.0f},
            {.seed = 11, .index = 1, .cond.class_id = 3, .guidance = 2.5f},
        };
        float *together = calloc(3 * numel, sizeof(float));
        float *alone = calloc(3 * numel, sizeof(float));
        float *dropped = calloc(3 * numel, sizeof(float));
        char what[256];

        TU_OK(ditd_pipeline_generate(p, &gp, 3, s, NULL, together, NULL, NULL, NULL));
        for (int i = 0; i < 3; i++)
            TU_OK(ditd_pipeline_generate(p, &gp, 1, &s[i], NULL, alone + i * numel, NULL, NULL, NULL));
        for (int i = 0; i < 3; i++) {
            snprintf(what, sizeof what, "%s %s sample %d in a batch of 3 vs alone", models[mi],
                     ditd_sampler_kind_name(gp.sampler), i);
            TU_CLOSE(what, together + i * numel, alone + i * numel, numel, 1e-5);
        }
        /* drop the middle sample after step 3: the others are unchanged */
        uint8_t active[3] = {1, 1, 1};
        drop d = {.at_step = 3, .which = 1};
        TU_OK(ditd_pipeline_generate(p, &gp, 3, s, NULL, dropped, active, drop_one, &d));
        for (int i = 0; i < 3; i += 2) {
            snprintf(what, sizeof what, "%s sample %d with sample 1 dropped at step 3", models[mi], i);
            TU_CLOSE(what, dropped + i * numel, alone + i * numel, numel, 1e-5);
        }
        TU_CHECK(active[1] == 0, "the flag stays cleared");
        /* stopping the batch returns DITD_ECANCELED */
        int err = ditd_pipeline_generate(p, &gp, 3, s, NULL, dropped, NULL, stop_all, NULL);
        TU_CHECK(err == DITD_ECANCELED, "stop: %s", ditd_err_name(err));
        /* bad input is refused, not run */
        ditd_gen_sample bad = s[0];
        bad.cond.class_id = info.num_classes;
        TU_CHECK(ditd_pipeline_generate(p, &gp, 1, &bad, NULL, dropped, NULL, NULL, NULL) == DITD_EINVAL,
                 "class K (the null class) is not a request class");
        bad = s[0];
        bad.guidance = (float)NAN;
        TU_CHECK(ditd_pipeline_generate(p, &gp, 1, &bad, NULL, dropped, NULL, NULL, NULL) == DITD_EINVAL,
                 "NaN guidance");
        TU_CHECK(ditd_pipeline_generate(p, &gp, 4, s, NULL, dropped, NULL, NULL, NULL) == DITD_EINVAL,
                 "more samples than planned");
        free(together);
        free(alone);
        free(dropped);
        ditd_pipeline_free(p);
        ditd_model_info_free(&info);
    }
    return tu_exit();
}
