/* An edit request: the body of POST /v1/images/edits (multipart/form-data as
 * the OpenAI API and its clients send it, or JSON with base64 or data-URL
 * images) turned, once, into a typed ditd_genreq with its input image and
 * mask decoded (JSON and encoded images stop here).
 *
 * The text fields go through the generation parser (genreq.c: the same
 * rules, refusals and defaults), then what only an edit has: the image
 * (server/common/image_in.c: PNG, JPEG, WebP under the header limits), the
 * mask (OpenAI's rule: its transparent pixels are the ones to change,
 * converted to Diffusers' mask_image, white repainted), strength, and the
 * edit row's defaults (FluxImg2ImgPipeline's 28 steps and guidance 7 for a
 * FluxPipeline folder). The image and its mask are resized to the output
 * size as VaeImageProcessor does (PIL Lanczos, engine/pipeline/image_resize.h;
 * no size: the image's, rounded down to the VAE multiple). Not here: several
 * input images (Kontext's), background jobs of edits. Loop thread only. */
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/error.h"
#include "engine/models/pipeline_class.h"
#include "engine/pipeline/image_resize.h"
#include "server/common/image_in.h"
#include "server/daemon/genreq.h"
#include "server/daemon/image_json.h"
#include "server/daemon/multipart.h"

/* a 400 naming the field (api_error.h) */
#define bad(...) ditd_api_bad(__VA_ARGS__)


static int oom(ditd_api_error *e)
{
    ditd_api_error_set(e, 500, "server_error", "internal_error", NULL, "out of memory");
    return DITD_ENOMEM;
}

/* *px (w x h x c, owned) replaced by its resize to ow x oh (nothing done
 * at the same size). */
static int resize_to(uint8_t **px, int w, int h, int c, int ow, int oh, ditd_api_error *e)
{
    if (w == ow && h == oh)
        return 0;
    uint8_t *out = malloc((size_t)ow * oh * c);
    if (!out)
        return oom(e);
    if (ditd_image_resize(*px, w, h, c, out, ow, oh)) {
        free(out);
        return bad(e, "size", "resizing the input to %dx%d: %s", ow, oh, ditd_err_detail());
    }
    free(*px);
    *px = out;
    return 0;
}

/* One encoded upload: its bytes (owned when `own`) and the field it came in. */
typedef struct upload {
    const uint8_t *data;
    size_t len;
    uint8_t *own;
    char field[16];
} upload;

/* Form fields whose text is a number (or JSON) in the body genreq reads. */
static const char *const int_fields[] = {"n", "seed", "num_inference_steps", "partial_images",
                                         "max_sequence_length", NULL};
static const char *const num_fields[] = {"guidance_scale", "strength", "true_cfg_scale", NULL};
static const char *const obj_fields[] = {"cache", "loras", NULL};

/* The form's text fields as a JSON object and its image and mask parts. */
static int from_form(const char *ctype, const char *body, size_t len, json_t **root,
                     ditd_multipart_form *form, upload *img, upload *mask, ditd_api_error *e)
{
    char field[64];
    if (ditd_multipart_parse(ctype, (const uint8_t *)body, len, NULL, form)) {
        bad(e, NULL, "the multipart/form-data body: %s", ditd_err_detail());
        return DITD_EINVAL;
    }
    int ni = ditd_multipart_count(form, "image"), na = ditd_multipart_count(form, "image[]");
    if (ni + na == 0)
        return bad(e, "image", "'image' is required: the picture to edit (a file part of the "
                   "form: PNG, JPEG or WebP)");
    if (ni + na > 1)
        return bad(e, na ? "image[]" : "image", "%d input images: this server's edit pipelines "
                   "(img2img, inpainting) take one image", ni + na);
    if (ditd_multipart_count(form, "mask") > 1)
        return bad(e, "mask", "'mask' given %d times: one mask", ditd_multipart_count(form, "mask"));
    const ditd_multipart_part *p = ditd_multipart_find(form, ni ? "image" : "image[]", 0);
    img->data = p->data;
    img->len = p->len;
    snprintf(img->field, sizeof img->field, "%s", ni ? "image" : "image[]");
    if ((p = ditd_multipart_find(form, "mask", 0))) {
        mask->data = p->data;
        mask->len = p->len;
        snprintf(mask->field, sizeof mask->field, "mask");
    }
    *root = ditd_multipart_to_json(form, int_fields, num_fields, obj_fields, field, sizeof field);
    if (!*root) {
        if (!field[0])
            return oom(e);
        return bad(e, field, "%s", ditd_err_detail());
    }
    json_object_del(*root, "image");
    json_object_del(*root, "image[]");
    json_object_del(*root, "mask");
    /* a form's booleans are text */
    json_t *v = json_object_get(*root, "stream");
    if (json_is_string(v)) {
        const char *t = json_string_value(v);
        if (!strcmp(t, "true") || !strcmp(t, "false"))
            json_object_set_new(*root, "stream", json_boolean(!strcmp(t, "true")));
    }
    return 0;
}

/* A JSON image's bytes (image_json.c), in the upload of field. */
static int json_upload(json_t *v, const char *field, upload *u, ditd_api_error *e)
{
    int err = ditd_genreq_json_bytes(v, field, &u->own, &u->len, e);
    u->data = u->own;
    snprintf(u->field, sizeof u->field, "%s", field);
    return err;
}

static int from_json(const char *body, size_t len, json_t **root, upload *img, upload *mask,
                     ditd_api_error *e)
{
    json_error_t jerr;
    *root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!*root)
        return bad(e, NULL, "the body is not valid JSON: %s (line %d, column %d)", jerr.text,
                   jerr.line, jerr.column);
    if (!json_is_object(*root))
        return bad(e, NULL, "the body must be a JSON object");
    json_t *im = json_object_get(*root, "image"), *ims = json_object_get(*root, "images");
    const char *field = "image";
    if (im && !json_is_null(im) && ims && !json_is_null(ims))
        return bad(e, "images", "give 'image' or 'images', not both");
    if (ims && !json_is_null(ims)) {
        im = ims;
        field = "images";
    }
    if (json_is_array(im)) {
        if (json_array_size(im) != 1)
            return bad(e, field, "%zu input images: this server's edit pipelines (img2img, "
                       "inpainting) take one image", json_array_size(im));
        im = json_array_get(im, 0);
    }
    if (!im || json_is_null(im))
        return bad(e, "image", "'image' is required: the picture to edit (base64 or a data URL)");
    int err = json_upload(im, field, img, e);
    json_t *mk = json_object_get(*root, "mask");
    if (!err && mk && !json_is_null(mk))
        err = json_upload(mk, "mask", mask, e);
    json_object_del(*root, "image");
    json_object_del(*root, "images");
    json_object_del(*root, "mask");
    return err;
}

/* Decodes an upload, naming its field on failure. */
static int decode(const upload *u, const ditd_image_limits *lim, ditd_image *out,
                  ditd_api_error *e)
{
    int err = ditd_image_decode(u->data, u->len, lim, out);
    if (err == DITD_ENOMEM)
        return oom(e);
    if (err)
        return bad(e, u->field, "'%s': %s", u->field, ditd_err_detail());
    return 0;
}

int ditd_genreq_parse_edit(const char *ctype, const char *body, size_t len,
                           const ditd_genreq_model *gm, const ditd_image_limits *lim,
                           ditd_genreq *r, ditd_api_error *e)
{
    const ditd_model_info *m = gm->info;
    const ditd_pipeline_class *pc = m->pipeline;
    const ditd_pipeline_class *erow = pc ? pc->img2img : NULL;
    ditd_multipart_form form = {0};
    upload img = {0}, mask = {0};
    ditd_image in = {0}, mk = {0};
    json_t *root = NULL;
    char *txt = NULL;
    char b[80];
    int err, parsed = 0;

    memset(r, 0, sizeof *r);
    if (ctype && !ditd_multipart_boundary(ctype, b, sizeof b))
        err = from_form(ctype, body, len, &root, &form, &img, &mask, e);
    else
        err = from_json(body, len, &root, &img, &mask, e);
    if (err)
        goto done;
    json_t *v = json_object_get(root, "background");
    if (json_is_true(v)) {
        err = bad(e, "background", "background jobs take generations (POST "
                  "/v1/images/generations); an edit is answered synchronously or streamed");
        goto done;
    }
    /* the fields a generation has, by the generation parser */
    json_t *size = json_object_get(root, "size");
    int size_given = size && !json_is_null(size) &&
                     !(json_is_string(size) && !strcmp(json_string_value(size), "auto"));
    int steps_given = json_object_get(root, "num_inference_steps") &&
                      !json_is_null(json_object_get(root, "num_inference_steps"));
    int guidance_given = json_object_get(root, "guidance_scale") &&
                         !json_is_null(json_object_get(root, "guidance_scale"));
    json_t *sv = json_object_get(root, "strength");
    if (sv && !json_is_null(sv) &&
        !(json_is_number(sv) && json_number_value(sv) > 0 && json_number_value(sv) <= 1)) {
        err = bad(e, "strength", "'strength' must be a number in (0, 1]: the part of the schedule "
                  "run from the noised image (1: all of it, the image only sets the start)");
        goto done;
    }
    double strength = sv && !json_is_null(sv) ? json_number_value(sv) : 0.0;
    json_object_del(root, "strength"); /* an edit's own: the generation parser refuses it */
    sv = NULL;
    /* an edit starts mid-schedule from the noised image: flow-euler only
     * (a known sampler's other names are refused here, before the
     * generation parser builds their schedule) */
    const char *smp = json_string_value(json_object_get(root, "sampler"));
    ditd_sampler_kind sk;
    if (smp && !ditd_sampler_kind_from_str(smp, &sk) && sk != DITD_SAMPLER_FLOW_EULER) {
        err = bad(e, "sampler", "sampler '%s': an edit starts from the noised image, which is "
                  "done for flow-euler only", smp);
        goto done;
    }
    if (!(txt = json_dumps(root, JSON_COMPACT))) {
        err = oom(e);
        goto done;
    }
    if ((err = ditd_genreq_parse(txt, strlen(txt), gm, r, e)))
        goto done;
    parsed = 1;
    if (!erow || !m->needs_vae) {
        err = bad(e, "model", "'%s' (%s) takes no input image: edits need a pipeline with "
                  "img2img (FLUX.1's: FluxPipeline, FluxImg2ImgPipeline, FluxInpaintPipeline)",
                  m->name, pc ? pc->name : "?");
        goto done;
    }
    if ((err = decode(&img, lim, &in, e)))
        goto done;
    if (mask.data && (err = decode(&mask, lim, &mk, e)))
        goto done;
    if (!size_given) { /* the image's size rounded down to the VAE multiple, as
                        * VaeImageProcessor.get_default_height_width */
        const int q = m->resizable && m->size_multiple > 0 ? m->size_multiple : 1;
        const int w = in.width >= q ? in.width - in.width % q : in.width;
        const int h = in.height >= q ? in.height - in.height % q : in.height;
        if (ditd_model_check_size(m, w, h)) {
            err = bad(e, img.field, "'%s' is %dx%d: %s (the output takes the image's size, "
                      "rounded down to a multiple of %d)", img.field, in.width, in.height,
                      ditd_err_detail(), q);
            goto done;
        }
        r->width = w;
        r->height = h;
    }
    if (mk.pixels && (mk.width != in.width || mk.height != in.height)) {
        err = bad(e, "mask", "'mask' is %dx%d, the image %dx%d: they must be the same size",
                  mk.width, mk.height, in.width, in.height);
        goto done;
    }
    if (mk.pixels && mk.channels != 4) {
        err = bad(e, "mask", "'mask' has no alpha channel: its fully transparent pixels mark what "
                  "to change (OpenAI's mask); send a PNG or WebP with alpha");
        goto done;
    }
    /* the mask: OpenAI's alpha (0 = change) as Diffusers' luma (white =
     * repaint; the engine binarizes at 0.5: alpha <= 127 is repainted) */
    const size_t np = (size_t)in.width * (size_t)in.height;
    const ditd_image *alpha = mk.pixels ? &mk : NULL;
    if (!alpha && in.channels == 4)
        for (size_t i = 0; i < np && !alpha; i++)
            if (in.pixels[4 * i + 3] != 255)
                alpha = &in; /* no mask: the image's own transparency */
    const ditd_pipeline_class *row = erow;
    if (alpha) {
        if (!pc->inpaint) {
            err = bad(e, mask.data ? "mask" : img.field, "'%s' (%s) takes no mask (inpainting)",
                      m->name, pc->name);
            goto done;
        }
        row = pc->inpaint;
        if (!(r->mask = malloc(np))) {
            err = oom(e);
            goto done;
        }
        for (size_t i = 0; i < np; i++)
            r->mask[i] = (uint8_t)(255 - alpha->pixels[4 * i + 3]);
    }
    /* the image at the output size, then its color: VaeImageProcessor.preprocess
     * resizes (PIL's Lanczos; RGBA premultiplied) before convert("RGB") */
    if (!(r->image = malloc((size_t)r->width * r->height * 3))) {
        err = oom(e);
        goto done;
    }
    if (r->width == in.width && r->height == in.height) {
        for (size_t i = 0; i < np; i++)
            memcpy(r->image + 3 * i, in.pixels + (size_t)in.channels * i, 3);
    } else if (in.channels == 4 ? ditd_image_resize_rgba(in.pixels, in.width, in.height, r->image,
                                                         r->width, r->height)
                                : ditd_image_resize(in.pixels, in.width, in.height, 3, r->image,
                                                    r->width, r->height)) {
        err = bad(e, img.field, "resizing '%s' to %dx%d: %s", img.field, r->width, r->height,
                  ditd_err_detail());
        goto done;
    }
    /* the mask (Diffusers' L) too, as the mask processor before its binarize */
    if (r->mask && (err = resize_to(&r->mask, in.width, in.height, 1, r->width, r->height, e)))
        goto done;
    /* the edit row's defaults for what the request does not give */
    if (!steps_given && row != pc)
        r->steps = row->default_steps;
    if (!guidance_given && row != pc)
        r->guidance = row->default_guidance;
    r->strength = strength > 0.0 ? strength : row->default_strength;
    r->edit = 1;
    int t0;
    if (ditd_pipeline_strength_start(r->steps, r->strength, &t0)) {
        err = bad(e, "strength", "%s", ditd_err_detail());
        goto done;
    }
    if (r->sampler != DITD_SAMPLER_FLOW_EULER) {
        err = bad(e, "sampler", "sampler '%s': an edit starts from the noised image, which is "
                  "done for flow-euler only", ditd_sampler_kind_name(r->sampler));
        goto done;
    }
    if (t0 > 0 && r->cache.method != DITD_CACHE_NONE) {
        if (!json_object_get(root, "cache")) { /* the server's --cache: not for this edit */
            r->cache.method = DITD_CACHE_NONE;
        } else {
            err = bad(e, "cache", "step caching with strength < 1 is not supported yet");
            goto done;
        }
    }
    err = 0;
done:
    if (err && parsed)
        ditd_genreq_free(r);
    ditd_image_free(&in);
    ditd_image_free(&mk);
    free(img.own);
    free(mask.own);
    free(txt);
    json_decref(root);
    ditd_multipart_free(&form);
    ditd_err_clear();
    return err;
}
