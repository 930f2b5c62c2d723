/* libFuzzer target: what the HTTP edge validates of a request, the bytes a
 * client controls: the JSON body of POST /v1/images/generations
 * (ditd_genreq_parse against a fixed-size class model and a resizable
 * text model with an alias) and of POST /v1/videos (ditd_genreq_parse_video
 * against a two-expert Wan-like video model, an image-to-video one whose
 * input_reference is decoded, an FLF2V one that takes last_frame_reference
 * too, and the image models), the error envelope every
 * refusal is written in (it must stay valid JSON whatever the message
 * quotes), and an Authorization header (ditd_auth_check). Any input gives a
 * typed request within its bounds or a 4xx naming the problem; never a
 * crash, a leak, or an envelope that is not JSON. The HTTP framing itself
 * is libmicrohttpd's; the abuse suite (tests/http/test_abuse.py) drives it
 * with hostile sockets. */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/error.h"
#include "engine/models/model.h"
#include "server/common/image_in.h"
#include "server/daemon/auth.h"
#include "server/daemon/genreq.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char *labels[] = {"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat, jacket",
                         "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"};

static void envelope_is_json(const ditd_api_error *e)
{
    char *js = ditd_api_error_json(e);
    json_error_t je;
    json_t *root;
    if (!js)
        abort();
    root = json_loads(js, 0, &je);
    if (!root || !json_is_string(json_object_get(json_object_get(root, "error"), "message")))
        abort();
    json_decref(root);
    free(js);
}

/* A request the parser accepted is within its bounds. */
static void check_accepted(const ditd_model_info *m, const ditd_genreq *rq)
{
    int text = m->shapes.cond.kind == DITD_COND_TEXT;
    if (rq->n < 1 || rq->n > DITD_GENREQ_MAX_N || rq->steps < 1 || rq->steps > 1000 ||
        !(rq->guidance >= 0 && rq->guidance <= 100) || rq->partial_images < 0 ||
        rq->partial_images > 3 || (unsigned)rq->sampler >= DITD_SAMPLER_KIND_COUNT ||
        rq->seed > (uint64_t)INT64_MAX || ditd_cache_config_check(&rq->cache))
        abort();
    if (m->resizable) {
        if (rq->width % m->size_multiple || rq->height % m->size_multiple ||
            rq->width < m->min_size || rq->height < m->min_size || rq->width > m->max_size ||
            rq->height > m->max_size)
            abort();
    } else if (rq->width != m->image_width || rq->height != m->image_height) {
        abort();
    }
    if (text) {
        if (!rq->prompt || strlen(rq->prompt) > DITD_GENREQ_MAX_PROMPT_BYTES ||
            (rq->negative_prompt && strlen(rq->negative_prompt) > DITD_GENREQ_MAX_PROMPT_BYTES) ||
            !(rq->true_cfg >= 0 && rq->true_cfg <= 100) || rq->max_sequence_length < 1 ||
            rq->max_sequence_length > m->max_sequence_length)
            abort();
        if (rq->n_skip_layers < 0 || rq->n_skip_layers > DITD_MAX_SKIP_LAYERS ||
            (rq->n_skip_layers && !(m->pipeline->request & DITD_REQ_SKIP_LAYERS)) ||
            ((rq->prompt_23[0] || rq->negative_23[0]) && ditd_pipeline_class_prompts(m->pipeline) < 2) ||
            ((rq->prompt_23[1] || rq->negative_23[1]) && ditd_pipeline_class_prompts(m->pipeline) < 3))
            abort();
        json_t *js = json_string(rq->prompt); /* valid UTF-8 */
        if (!js)
            abort();
        json_decref(js);
    } else if (rq->class_id < 0 || rq->class_id >= m->num_classes || rq->prompt ||
               rq->negative_prompt || rq->max_sequence_length) {
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static ditd_model_info m, t, s3, wv, wi, wf;
    static const char *const aliases[] = {"black-forest-labs/FLUX.1-dev", "dall-e-3"};
    static char *keys[] = {"k1", "a-longer-key-0123456789"};
    static ditd_auth auth = {keys, 2};
    ditd_genreq rq;
    ditd_api_error e;
    char *s;

    if (!m.num_classes) {
        strcpy(m.name, "fashion \"q\" \xe2\x82\xac");
        m.shapes.height = m.shapes.width = 28; /* latents = pixels: no vae */
        m.shapes.in_channels = 1;
        m.shapes.tokens = 49;
        m.image_width = m.image_height = 28;
        m.image_channels = 1;
        m.num_classes = 10;
        m.labels = labels;
        m.default_steps = 4;
        m.default_guidance = 4.0f;
        m.min_size = m.max_size = 28;
        m.pipeline = &ditd_pipeline_dit;
        /* a FLUX-like text model: any multiple of 16 in 16..512 */
        strcpy(t.name, "flux");
        t.shapes.cond.kind = DITD_COND_TEXT;
        t.shapes.height = t.shapes.width = 4;
        t.shapes.in_channels = 16;
        t.shapes.tokens = 4;
        t.vae_scale = 8;
        t.image_width = t.image_height = 32;
        t.image_channels = 3;
        t.resizable = 1;
        t.size_multiple = 16;
        t.min_size = 16;
        t.max_size = 512;
        t.max_sequence_length = 512;
        t.default_max_sequence_length = 512;
        t.default_steps = 28;
        t.default_guidance = 3.5f;
        t.pipeline = &ditd_pipeline_flux;
        /* an SD3-like one: three prompts, skip-layer guidance */
        s3 = t;
        strcpy(s3.name, "sd3");
        s3.pipeline = &ditd_pipeline_sd3;
        s3.default_max_sequence_length = 256;
        s3.default_guidance = 7.0f;
        /* a Wan 2.2-like video model: two experts, 16 fps, 1 + 4k frames up to 257 */
        wv = t;
        strcpy(wv.name, "wan");
        wv.pipeline = &ditd_pipeline_wan;
        wv.default_guidance = 5.0f;
        wv.frames = 81;
        wv.frame_step = 4;
        wv.max_frames = 257;
        wv.fps = 16;
        strcpy(wv.transformer_2_dir, "/nonexistent/transformer_2");
        wv.boundary_ratio = 0.875;
        /* a Wan 2.1 I2V-like one: input_reference required */
        wi = wv;
        strcpy(wi.name, "wan-i2v");
        wi.pipeline = &ditd_pipeline_wan_i2v;
        wi.transformer_2_dir[0] = '\0';
        wi.boundary_ratio = 0;
        /* a Wan 2.1 FLF2V-like one: last_frame_reference required too */
        wf = wi;
        strcpy(wf.name, "wan-flf2v");
        wf.last_image = 1;
    }
    /* LoRA adapters on the class and text models ("loras" is parsed too) */
    static const char *const loras[] = {"style", "d4"};
    const ditd_genreq_model models[] = {{&m, NULL, 0, DITD_SAMPLER_DDIM, NULL, loras, 2, 4, NULL},
                                        {&t, aliases, 2, DITD_SAMPLER_FLOW_EULER, NULL, loras, 2, 1, NULL},
                                        {&s3, NULL, 0, DITD_SAMPLER_FLOW_EULER, NULL, NULL, 0, 4, NULL},
                                        {&wv, NULL, 0, DITD_SAMPLER_UNIPC, NULL, NULL, 0, 4, NULL},
                                        {&wi, NULL, 0, DITD_SAMPLER_UNIPC, NULL, NULL, 0, 4, NULL},
                                        {&wf, NULL, 0, DITD_SAMPLER_UNIPC, NULL, NULL, 0, 4, NULL}};
    for (size_t k = 0; k < sizeof models / sizeof models[0]; k++) {
        /* a clip: only the video model takes it; frames rounded and in range */
        if (ditd_genreq_parse_video((const char *)data, size, &models[k], &rq, &e) == 0) {
            const ditd_model_info *vm = models[k].info;
            if (vm->frames <= 0 || rq.n != 1 || rq.frames < 1 || rq.frames > vm->max_frames ||
                rq.frames % vm->frame_step != 1 || rq.fps < 1 || rq.fps > 120 ||
                (rq.has_guidance_2 && !(rq.guidance_2 >= 0 && rq.guidance_2 <= 100)))
                abort();
            /* an image-to-video clip carries its decoded first frame; no other does */
            if (vm->pipeline->image_to_video
                    ? !rq.image || rq.image_w < 1 || rq.image_h < 1 ||
                          (int64_t)rq.image_w * rq.image_h > DITD_IMAGE_MAX_PIXELS_DEFAULT ||
                          rq.mask || rq.edit
                    : rq.image != NULL)
                abort();
            /* an FLF2V clip carries its last frame too, of two frames at least; no other does */
            if (vm->last_image
                    ? !rq.last_image || rq.last_w < 1 || rq.last_h < 1 ||
                          (int64_t)rq.last_w * rq.last_h > DITD_IMAGE_MAX_PIXELS_DEFAULT ||
                          rq.frames < 2
                    : rq.last_image != NULL)
                abort();
            check_accepted(vm, &rq);
            ditd_genreq_free(&rq);
        } else {
            if (e.status != 400 && e.status != 404)
                abort();
            envelope_is_json(&e);
        }
        if (ditd_genreq_parse((const char *)data, size, &models[k], &rq, &e) == 0) {
            check_accepted(models[k].info, &rq);
            ditd_genreq_free(&rq);
        } else {
            if (e.status != 400 && e.status != 404)
                abort();
            envelope_is_json(&e);
        }
    }
    /* the same bytes as a message (cut anywhere) and as a header */
    if (!(s = malloc(size + 1)))
        return 0;
    memcpy(s, data, size);
    s[size] = '\0';
    ditd_api_error_set(&e, 400, "invalid_request_error", "invalid_value", s, "%s", s);
    envelope_is_json(&e);
    int ok = ditd_auth_check(&auth, s);
    if (ok && !strstr(s, "k1") && !strstr(s, keys[1]))
        abort();
    ditd_utf8_clean(s);
    json_t *str = json_string(s);
    if (!str)
        abort(); /* clean text is UTF-8 */
    json_decref(str);
    free(s);
    ditd_err_clear();
    return 0;
}
