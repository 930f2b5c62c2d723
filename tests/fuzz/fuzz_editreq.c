/* libFuzzer target: the body of POST /v1/images/edits as the HTTP edge types
 * it (ditd_genreq_parse_edit, server/daemon/editreq.c): the input up to its
 * first newline (at most 200 bytes) is the Content-Type (empty: JSON), the
 * rest the body: a multipart form with image/mask file parts, or JSON with
 * base64 and data-URL images. Against a FLUX-like model (edits and masks)
 * and a class model (none). Any input gives a typed edit within its bounds
 * (images of the request's size, n a multiple of their count, one mask or
 * one per image, a strength in (0, 1], flow-euler) or a
 * 4xx naming the problem in a valid JSON envelope; never a crash or a leak.
 * The decoders and the form parser have their own targets (fuzz_image_in,
 * fuzz_multipart); here is what joins them. */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/error.h"
#include "engine/models/model.h"
#include "engine/pipeline/edit_images.h"
#include "server/common/image_in.h"
#include "server/daemon/genreq.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char *labels[] = {"a", "b"};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static ditd_model_info t, m, kx;
    if (!t.pipeline) {
        strcpy(t.name, "flux");
        t.shapes.cond.kind = DITD_COND_TEXT;
        t.shapes.height = t.shapes.width = 2;
        t.shapes.in_channels = 16;
        t.shapes.tokens = 1;
        t.vae_scale = 8;
        t.needs_vae = 1;
        t.image_width = t.image_height = 16;
        t.image_channels = 3;
        t.resizable = 1;
        t.size_multiple = 16;
        t.min_size = 16;
        t.max_size = 64;
        t.max_sequence_length = 512;
        t.default_max_sequence_length = 512;
        t.default_steps = 28;
        t.default_guidance = 3.5f;
        t.pipeline = &ditd_pipeline_flux;
        strcpy(m.name, "dit");
        m.shapes.height = m.shapes.width = 16;
        m.shapes.in_channels = 3;
        m.shapes.tokens = 16;
        m.image_width = m.image_height = 16;
        m.image_channels = 3;
        m.num_classes = 2;
        m.labels = labels;
        m.default_steps = 4;
        m.default_guidance = 4.0f;
        m.min_size = m.max_size = 16;
        m.pipeline = &ditd_pipeline_dit;
        kx = t; /* a FluxKontextPipeline folder: the image a reference */
        strcpy(kx.name, "kontext");
        kx.pipeline = &ditd_pipeline_flux_kontext;
    }
    char ct[201];
    size_t n = 0;
    while (n < size && n < 200 && data[n] != '\n')
        n++;
    memcpy(ct, data, n);
    ct[n] = '\0';
    const char *body = (const char *)data + n + (n < size);
    size_t blen = size - n - (n < size);
    ditd_image_limits lim = {.max_bytes = 4096, .max_dim = 64, .max_pixels = 64 * 64};
    const ditd_genreq_model models[] = {
        {&t, NULL, 0, DITD_SAMPLER_FLOW_EULER, NULL, NULL, 0, 4, NULL},
        {&m, NULL, 0, DITD_SAMPLER_DDIM, NULL, NULL, 0, 4, NULL},
        {&kx, NULL, 0, DITD_SAMPLER_FLOW_EULER, NULL, NULL, 0, 4, NULL}};
    for (size_t k = 0; k < sizeof models / sizeof models[0]; k++) {
        ditd_genreq rq;
        ditd_api_error e;
        const ditd_model_info *mi = models[k].info;
        int rc = ditd_genreq_parse_edit(n ? ct : NULL, body, blen, &models[k], &lim, &rq, &e);
        if (rc == 0 && mi->pipeline->reference) {
            /* a reference: no strength, no mask, at a preferred Kontext
             * resolution (sides 672 .. 1568) or its own size within the limits */
            const int side = lim.max_dim > 1568 ? lim.max_dim : 1568;
            if (!rq.edit || !rq.image || rq.strength != 0.0 || rq.mask || rq.image_w < 16 ||
                rq.image_h < 16 || rq.image_w > side || rq.image_h > side ||
                rq.width < mi->min_size || rq.width > mi->max_size || rq.height < mi->min_size ||
                rq.height > mi->max_size || !rq.prompt)
                abort();
            volatile uint8_t sum = 0;
            for (size_t i = 0; i < (size_t)rq.image_w * (size_t)rq.image_h * 3; i++)
                sum ^= rq.image[i];
            (void)sum;
            ditd_genreq_free(&rq);
        } else if (rc == 0) {
            if (!rq.edit || !rq.image || !(rq.strength > 0 && rq.strength <= 1) ||
                rq.sampler != DITD_SAMPLER_FLOW_EULER || !mi->pipeline->img2img ||
                (rq.mask && !mi->pipeline->inpaint) || rq.width < mi->min_size ||
                rq.width > mi->max_size || rq.height < mi->min_size || rq.height > mi->max_size ||
                rq.n < 1 || rq.n > DITD_GENREQ_MAX_N || !rq.prompt || rq.n_images < 1 ||
                rq.n_images > DITD_EDIT_MAX_IMAGES || rq.n % rq.n_images != 0 ||
                (!rq.mask) != (rq.n_masks == 0) ||
                (rq.n_masks > 1 && rq.n_masks != rq.n_images))
                abort();
            /* the pixels are there, all of them, and every output's input */
            volatile uint8_t sum = 0;
            size_t np = (size_t)rq.width * (size_t)rq.height;
            for (size_t i = 0; i < np * 3 * (size_t)rq.n_images; i++)
                sum ^= rq.image[i];
            for (size_t i = 0; rq.mask && i < np * (size_t)rq.n_masks; i++)
                sum ^= rq.mask[i];
            for (int i = 0; i < rq.n; i++) {
                const uint8_t *im, *mk;
                int j;
                ditd_genreq_edit_input(&rq, i, &im, &mk, &j);
                if (!im || j != i % rq.n_images || (!mk) != (!rq.mask))
                    abort();
                sum ^= im[np * 3 - 1];
                if (mk)
                    sum ^= mk[np - 1];
            }
            (void)sum;
            ditd_genreq_free(&rq);
        } else {
            if (e.status != 400 && e.status != 404 && e.status != 500)
                abort();
            char *js = ditd_api_error_json(&e);
            json_t *root = js ? json_loads(js, 0, NULL) : NULL;
            if (!root)
                abort();
            json_decref(root);
            free(js);
        }
    }
    ditd_err_clear();
    return 0;
}
