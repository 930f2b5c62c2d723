/* Previews of a latent model against Diffusers' FluxPipeline run in float64
 * (tools/make_flux_preview_fixtures.py on the tiny FLUX.1 folders of
 * tests/fixtures/flux_pipeline, assembled in the build tree; the expected
 * arrays in tests/fixtures/flux_previews/). The reference captured, at every
 * step, the transformer's input and output and made x0 as the flow Euler
 * scheduler does (sample - sigma_i v), unscaled it as the final latents and
 * decoded it with the pipeline's VAE. Here the pipeline's preview hook
 * (ditd_pipeline_set_preview) gets the sampler's x0 and decodes it with
 * ditd_latent_image_run, as the worker does. For every case and step:
 *   - the hook runs after the step callback, once per step, steps 1..total;
 *   - x0 within 1e-4 relative of the reference;
 *   - its decoded image within one 8-bit level.
 * At least 18 step previews (each of every image of its batch) are checked.
 * And the hook's contract: a stop decided at a step is never previewed
 * (generate returns DITD_ECANCELED, the hook saw only the steps before), a
 * sample dropped by the callback arrives inactive at the same step's hook. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/backend/backend.h"
#include "engine/core/error.h"
#include "engine/io/npy.h"
#include "engine/models/model.h"
#include "engine/pipeline/latent_image.h"
#include "engine/pipeline/pipeline.h"
#include "engine/pipeline/prompt_encoder.h"
#include "tests/flux_edit_case.h"
#include "tests/test_util.h"

#define MIN_PREVIEWS 18
#define MAXB 2

typedef struct run {
    const char *name;
    ditd_latent_image *li;
    int B, steps, H, W;
    size_t zn;
    const float *x0_ref;   /* (steps, B, 16, h, w) */
    const float *px_ref;   /* (steps, B, H, W, 3) */
    uint8_t *pix;          /* (B, H, W, 3) */
    int cb_calls, hook_calls, last_cb_step, order_ok, checked;
    int worst;             /* the worst level difference seen */
    size_t off;            /* values off by a level */
    int stop_at, drop_at;  /* the callback stops the batch / drops sample 1 at that step */
    int drop_seen;         /* the hook saw sample 1 inactive at drop_at */
} run;

static int on_step(void *ud, int step, int total, const float *x0, uint8_t *active)
{
    run *r = ud;
    (void)x0, (void)total;
    r->cb_calls++;
    r->last_cb_step = step;
    if (r->drop_at == step && active)
        active[1] = 0;
    return r->stop_at == step;
}

static int on_preview(void *ud, int step, int total, const float *x0, const uint8_t *active)
{
    run *r = ud;
    char what[256];
    r->hook_calls++;
    r->order_ok += r->last_cb_step == step && step == r->hook_calls && total == r->steps;
    if (r->drop_at == step)
        r->drop_seen = active && !active[1] && active[0];
    if (!r->x0_ref || step < 1 || step > r->steps)
        return 0;
    for (int b = 0; b < r->B; b++) {
        if (active && !active[b])
            continue;
        const float *want = r->x0_ref + ((size_t)(step - 1) * r->B + b) * r->zn;
        snprintf(what, sizeof what, "%s: step %d of %d, image %d: x0", r->name, step, total, b);
        TU_CLOSE(what, x0 + (size_t)b * r->zn, want, r->zn, 1e-4);
    }
    int err = ditd_latent_image_run(r->li, x0, r->B, active, r->pix);
    if (err)
        return err;
    const size_t pn = (size_t)r->H * r->W * 3;
    for (int b = 0; b < r->B; b++) {
        if (active && !active[b])
            continue;
        size_t off;
        int worst = tu_pixels_worst(r->pix + (size_t)b * pn,
                                    r->px_ref + ((size_t)(step - 1) * r->B + b) * pn, pn, &off);
        TU_CHECK(worst <= 1, "%s: step %d image %d: preview %dx%d worst %d levels (%zu of %zu off)",
                 r->name, step, b, r->W, r->H, worst, off, pn);
        r->checked += worst <= 1;
        r->worst = worst > r->worst ? worst : r->worst;
        r->off += off;
    }
    return 0;
}

/* One case; the number of previews checked within a level. */
static int run_case(json_t *c)
{
    char dir[4096];
    const char *name = jstr(c, "name"), *prompt = jstr(c, "prompt");
    int B = jint(c, "batch"), L = jint(c, "max_sequence_length"), steps = jint(c, "num_inference_steps");
    int lh = jint(c, "latent_height"), lw = jint(c, "latent_width"), H = jint(c, "height"),
        W = jint(c, "width");
    float g = (float)jnum(c, "guidance_scale");
    uint64_t seed = (uint64_t)json_integer_value(json_object_get(c, "seed"));
    size_t n_x0, n_px;
    float *x0_ref = edit_npy("flux_previews", jstr(c, "x0"), &n_x0, 0);
    float *px_ref = edit_npy("flux_previews", jstr(c, "x0_u8"), &n_px, 0);
    ditd_model_info info;
    ditd_prompt_encoder *pe = NULL;
    ditd_pipeline *p = NULL;
    ditd_latent_image *li = NULL;
    float *seq = NULL, *pooled = NULL, *out = NULL;
    ditd_text_embeds te[2];
    ditd_gen_sample smp[MAXB];
    run r;
    int checked = 0;
    memset(&info, 0, sizeof info);
    memset(smp, 0, sizeof smp);
    memset(&r, 0, sizeof r);

    const size_t zn = (size_t)16 * lh * lw, pn = (size_t)H * W * 3;
    if (!x0_ref || !px_ref || !prompt || B < 1 || B > MAXB)
        goto out;
    TU_CHECK(n_x0 == (size_t)steps * B * zn && n_px == (size_t)steps * B * pn, "%s: fixture sizes",
             name);
    if (n_x0 != (size_t)steps * B * zn || n_px != (size_t)steps * B * pn)
        goto out;
    snprintf(dir, sizeof dir, "%s/%s", FLUX_PIPELINE_DIR, jstr(c, "folder"));
    TU_OK(ditd_model_info_load(dir, &info));
    if (!info.pipeline || edit_encode_prompts(&info, L, prompt, NULL, &pe, &seq, &pooled, te))
        goto out;
    TU_OK(ditd_latent_image_new(&info, &ditd_backend_cpu, NULL, 0, &li));
    TU_OK(ditd_pipeline_new(&info, &ditd_backend_cpu, B, &p));
    if (!li || !p)
        goto out;
    TU_OK(ditd_latent_image_set_size(li, lh, lw));
    TU_OK(ditd_pipeline_set_size(p, lh, lw, L));
    for (int b = 0; b < B; b++) {
        smp[b] = (ditd_gen_sample){.seed = seed, .index = (uint64_t)b, .guidance = g};
        smp[b].cond.prompt = &te[0];
    }
    ditd_gen_params gp = {.steps = steps, .sampler = p->sched_base.kind};
    out = malloc((size_t)B * zn * sizeof *out);
    r.pix = malloc((size_t)B * pn);
    if (!out || !r.pix)
        goto out;
    r = (run){.name = name, .li = li, .B = B, .steps = steps, .H = H, .W = W, .zn = zn,
              .x0_ref = x0_ref, .px_ref = px_ref, .pix = r.pix};
    uint8_t active[MAXB] = {1, 1};
    ditd_pipeline_set_preview(p, on_preview, &r);
    TU_OK(ditd_pipeline_generate(p, &gp, B, smp, NULL, out, active, on_step, &r));
    TU_CHECK(r.cb_calls == steps && r.hook_calls == steps && r.order_ok == steps,
             "%s: callback %d, hook %d times, %d in order after their step (%d steps)", name,
             r.cb_calls, r.hook_calls, r.order_ok, steps);
    checked = r.checked;
    printf("ok   %s: %d previews of %dx%d x%d: worst %d level(s), %zu of %zu values off\n", name,
           checked, W, H, B, r.worst, r.off, (size_t)checked * pn);

    /* a stop at step 2 is never previewed */
    r = (run){.name = name, .li = li, .B = B, .steps = steps, .H = H, .W = W, .zn = zn,
              .pix = r.pix, .stop_at = 2};
    int err = ditd_pipeline_generate(p, &gp, B, smp, NULL, out, active, on_step, &r);
    TU_CHECK(err == DITD_ECANCELED && r.cb_calls == 2 && r.hook_calls == 1,
             "%s: stopped at step 2: %d, callback %d, hook %d times (1: the stop's step has none)",
             name, err, r.cb_calls, r.hook_calls);
    if (B == 2) { /* sample 1 dropped at step 2: that step's hook sees it inactive */
        active[0] = active[1] = 1;
        r = (run){.name = name, .li = li, .B = B, .steps = steps, .H = H, .W = W, .zn = zn,
                  .pix = r.pix, .drop_at = 2};
        TU_OK(ditd_pipeline_generate(p, &gp, B, smp, NULL, out, active, on_step, &r));
        TU_CHECK(r.drop_seen && r.hook_calls == steps && !active[1],
                 "%s: sample 1 dropped at step 2 arrives inactive at its hook (%d)", name,
                 r.drop_seen);
    }
    ditd_pipeline_set_preview(p, NULL, NULL);
out:
    ditd_latent_image_free(li);
    ditd_pipeline_free(p);
    ditd_prompt_encoder_free(pe);
    if (info.dir[0])
        ditd_model_info_free(&info);
    free(x0_ref), free(px_ref), free(seq), free(pooled), free(out), free(r.pix);
    return checked;
}

int main(void)
{
    char path[4096];
    json_error_t jerr;
    json_t *root, *c;
    size_t i;
    int checked = 0;

    (void)edit_folder_make, (void)edit_folder_rm; /* the FluxPipeline folders serve as they are */
    ditd_backend_cpu.set_threads(1);
    snprintf(path, sizeof path, "%s/flux_previews/expected/cases.json", tu_fixtures());
    root = json_load_file(path, 0, &jerr);
    TU_CHECK(root != NULL, "%s: %s", path, jerr.text);
    json_array_foreach(json_object_get(root, "cases"), i, c)
        checked += run_case(c);
    TU_CHECK(checked >= MIN_PREVIEWS, "previews checked within one level: %d (at least %d)",
             checked, MIN_PREVIEWS);
    json_decref(root);
    return tu_exit();
}
