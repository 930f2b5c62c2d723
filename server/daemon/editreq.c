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
 * FluxPipeline folder); on a FluxKontextPipeline folder the image is a
 * reference (reference_edit: max_area, no strength, no mask). Several images
 * (`image[]` repeated, a JSON array) are Diffusers' image list
 * (engine/pipeline/edit_images.h: output i edits image i % k); every upload's
 * header is read and checked (limits, sizes) before any of them is decoded.
 * The images and the mask are resized to the output size as VaeImageProcessor
 * does (PIL Lanczos, RGBA premultiplied, engine/core/image_resize.h; no
 * size: the first image's, rounded down to the VAE multiple), a reference to
 * its Kontext resolution. Not here: background jobs of edits. Loop thread
 * only. */
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/error.h"
#include "engine/models/pipeline_class.h"
#include "engine/core/image_resize.h"
#include "engine/pipeline/edit_images.h"
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

/* One encoded upload: its bytes (owned when `own`) and the field it came in. */
typedef struct upload {
    const uint8_t *data;
    size_t len;
    uint8_t *own;
    char field[16]; /* the error's param: the form's or JSON's name */
    char label[24]; /* in messages: the name, with [j] when there are several */
} upload;

/* Form fields whose text is a number (or JSON) in the body genreq reads. */
static const char *const int_fields[] = {"n", "seed", "num_inference_steps", "partial_images",
                                         "max_sequence_length", "max_area", NULL};
static const char *const num_fields[] = {"guidance_scale", "strength", "true_cfg_scale", NULL};
static const char *const obj_fields[] = {"cache", "loras", NULL};

/* The form's text fields as a JSON object and its image and mask parts:
 * `image` or `image[]` (the OpenAI clients send a list as repeated
 * `image[]`), up to DITD_EDIT_MAX_IMAGES, in the order of the parts. */
static int from_form(const char *ctype, const char *body, size_t len, json_t **root,
                     ditd_multipart_form *form, upload *img, int *n_img, upload *mask,
                     ditd_api_error *e)
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
    if (ni && na)
        return bad(e, "image[]", "give the images as 'image' or as 'image[]', not both");
    if (ni + na > DITD_EDIT_MAX_IMAGES)
        return bad(e, na ? "image[]" : "image", "%d input images: at most %d", ni + na,
                   DITD_EDIT_MAX_IMAGES);
    if (ditd_multipart_count(form, "mask") > 1)
        return bad(e, "mask", "'mask' given %d times: one mask (it applies to every image)",
                   ditd_multipart_count(form, "mask"));
    const char *name = ni ? "image" : "image[]";
    *n_img = ni + na;
    for (int k = 0; k < *n_img; k++) {
        const ditd_multipart_part *p = ditd_multipart_find(form, name, k);
        img[k].data = p->data;
        img[k].len = p->len;
        snprintf(img[k].field, sizeof img[k].field, "%s", name);
        if (*n_img == 1)
            snprintf(img[k].label, sizeof img[k].label, "%s", name);
        else
            snprintf(img[k].label, sizeof img[k].label, "image[%d]", k);
    }
    const ditd_multipart_part *p;
    if ((p = ditd_multipart_find(form, "mask", 0))) {
        mask->data = p->data;
        mask->len = p->len;
        snprintf(mask->field, sizeof mask->field, "mask");
        snprintf(mask->label, sizeof mask->label, "mask");
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

/* A JSON image's bytes (image_json.c), in the upload of field (label: in
 * messages). */
static int json_upload(json_t *v, const char *field, const char *label, upload *u,
                       ditd_api_error *e)
{
    int err = ditd_genreq_json_bytes(v, field, &u->own, &u->len, e);
    u->data = u->own;
    snprintf(u->field, sizeof u->field, "%s", field);
    snprintf(u->label, sizeof u->label, "%s", label);
    return err;
}

static int from_json(const char *body, size_t len, json_t **root, upload *img, int *n_img,
                     upload *mask, ditd_api_error *e)
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
    if (!im || json_is_null(im) || (json_is_array(im) && json_array_size(im) == 0))
        return bad(e, "image", "'image' is required: the picture to edit (base64 or a data URL)");
    size_t k = json_is_array(im) ? json_array_size(im) : 1;
    if (k > DITD_EDIT_MAX_IMAGES)
        return bad(e, field, "%zu input images: at most %d", k, DITD_EDIT_MAX_IMAGES);
    int err = 0;
    for (size_t j = 0; j < k && !err; j++) {
        char l[24];
        if (k > 1)
            snprintf(l, sizeof l, "%s[%zu]", field, j);
        else
            snprintf(l, sizeof l, "%s", field);
        err = json_upload(json_is_array(im) ? json_array_get(im, j) : im, field, l, &img[j], e);
        *n_img = (int)j + 1; /* freed by the caller, the failed one too */
    }
    json_t *mk = json_object_get(*root, "mask");
    if (!err && mk && !json_is_null(mk))
        err = json_upload(mk, "mask", "mask", mask, e);
    json_object_del(*root, "image");
    json_object_del(*root, "images");
    json_object_del(*root, "mask");
    return err;
}

/* An upload's header against the limits, naming its field on failure:
 * nothing of its pixels is allocated yet. */
static int probe(const upload *u, const ditd_image_limits *lim, ditd_image *hdr,
                 ditd_api_error *e)
{
    int err = ditd_image_probe(u->data, u->len, lim, hdr);
    if (err == DITD_ENOMEM)
        return oom(e);
    if (err)
        return bad(e, u->field, "'%s': %s", u->label, ditd_err_detail());
    return 0;
}

/* Decodes an upload, naming its field on failure. */
static int decode(const upload *u, const ditd_image_limits *lim, ditd_image *out,
                  ditd_api_error *e);

/* FluxKontextPipeline (a reference row): the image is a reference, not a
 * start. The output is the request's size (given, else the folder's) at
 * max_area pixels with its aspect ratio, rounded down to vae_scale x 2, as
 * the pipeline does; the reference goes at the size the pipeline brings it
 * to (its preferred resolution, _auto_resize), resized as VaeImageProcessor
 * does (PIL Lanczos, RGBA premultiplied, then its color). No strength, no
 * mask (named). */
static int reference_edit(const ditd_model_info *m, int size_given, int strength_given,
                          int n_given, long max_area, const upload *img, int n_img,
                          const upload *mask, const ditd_image_limits *lim, json_t *root,
                          ditd_genreq *r, ditd_api_error *e)
{
    const ditd_pipeline_class *pc = m->pipeline;
    ditd_image in = {0}, hdr;
    int err = 0, rw = 0, rh = 0, W0 = 0, H0 = 0;
    if (strength_given)
        return bad(e, "strength", "'%s' (%s) takes a reference image, not a start: no 'strength' "
                   "(the whole schedule runs from noise)", m->name, pc->name);
    if (mask->data)
        return bad(e, "mask", "'%s' (%s) takes a reference image and no 'mask'", m->name,
                   pc->name);
    int w0 = size_given ? r->width : m->image_width, h0 = size_given ? r->height : m->image_height;
    if (ditd_pipeline_class_area_size(max_area > 0 ? max_area : pc->default_max_area, w0, h0,
                                      2 * m->vae_scale, &r->width, &r->height))
        return bad(e, max_area > 0 ? "max_area" : "size", "%s", ditd_err_detail());
    if (ditd_model_check_size(m, r->width, r->height))
        return bad(e, max_area > 0 ? "max_area" : "size", "the output %dx%d (%s at max_area): %s",
                   r->width, r->height, size_given ? "size" : "the default size",
                   ditd_err_detail());
    /* every header first (limits, one size), before any pixel is decoded */
    for (int j = 0; j < n_img; j++) {
        if ((err = probe(&img[j], lim, &hdr, e)))
            return err;
        if (j == 0) {
            W0 = hdr.width;
            H0 = hdr.height;
        } else if (hdr.width != W0 || hdr.height != H0) {
            return bad(e, img[j].field, "'%s' is %dx%d, '%s' %dx%d: the references of one edit "
                       "must be the same size", img[j].label, hdr.width, hdr.height,
                       img[0].label, W0, H0);
        }
    }
    if (ditd_pipeline_class_reference_size(pc->auto_resize, W0, H0, m->vae_scale, &rw, &rh))
        return bad(e, img[0].field, "'%s': %s", img[0].label, ditd_err_detail());
    /* Diffusers' image list: output i takes reference i % k (n not given:
     * one output per reference) */
    if (!n_given)
        r->n = n_img;
    if (ditd_edit_images_check(r->n, n_img, 0))
        return bad(e, "n", "%s", ditd_err_detail());
    const size_t np = (size_t)rw * (size_t)rh;
    if (!(r->image = malloc(np * 3 * (size_t)n_img)))
        return oom(e);
    for (int j = 0; j < n_img && !err; j++) {
        if ((err = decode(&img[j], lim, &in, e)))
            break;
        uint8_t *to = r->image + (size_t)j * np * 3;
        if (in.width != rw || in.height != rh) { /* VaeImageProcessor.resize */
            int rc = in.channels == 4
                         ? ditd_image_resize_rgba(in.pixels, in.width, in.height, to, rw, rh)
                         : ditd_image_resize(in.pixels, in.width, in.height, 3, to, rw, rh);
            if (rc)
                err = bad(e, img[j].field, "'%s' to %dx%d: %s", img[j].label, rw, rh,
                          ditd_err_detail());
        } else { /* the color (PIL's convert("RGB")): alpha is no mask here */
            for (size_t i = 0; i < np; i++)
                memcpy(to + i * 3, in.pixels + (size_t)in.channels * i, 3);
        }
        ditd_image_free(&in);
    }
    if (err)
        return err;
    r->image_w = rw;
    r->image_h = rh;
    r->n_images = n_img;
    r->edit = 1;
    r->strength = 0.0;
    if (r->cache.method != DITD_CACHE_NONE) {
        if (!json_object_get(root, "cache")) /* the server's --cache: not for this edit */
            r->cache.method = DITD_CACHE_NONE;
        else
            return bad(e, "cache", "step caching with a reference image (Kontext) is not "
                       "supported yet");
    }
    return 0;
}

static int decode(const upload *u, const ditd_image_limits *lim, ditd_image *out,
                  ditd_api_error *e)
{
    int err = ditd_image_decode(u->data, u->len, lim, out);
    if (err == DITD_ENOMEM)
        return oom(e);
    if (err)
        return bad(e, u->field, "'%s': %s", u->label, ditd_err_detail());
    return 0;
}

/* Whether an RGBA image has a pixel that is not opaque. */
static int has_transparency(const ditd_image *im)
{
    const size_t np = (size_t)im->width * (size_t)im->height;
    if (im->channels != 4)
        return 0;
    for (size_t i = 0; i < np; i++)
        if (im->pixels[4 * i + 3] != 255)
            return 1;
    return 0;
}

void ditd_genreq_edit_input(const ditd_genreq *r, int i, const uint8_t **image,
                            const uint8_t **mask, int *j)
{
    const size_t np = (size_t)r->width * (size_t)r->height;
    const int k = r->n_images > 0 ? r->n_images : 1;
    const int jj = ditd_edit_image_of(i, k);
    *image = r->image ? r->image + (size_t)jj * np * 3 : NULL;
    *mask = r->mask ? r->mask + (size_t)ditd_edit_mask_of(i, r->n_masks) * np : NULL;
    *j = jj;
}

int ditd_genreq_parse_edit(const char *ctype, const char *body, size_t len,
                           const ditd_genreq_model *gm, const ditd_image_limits *lim,
                           ditd_genreq *r, ditd_api_error *e)
{
    const ditd_model_info *m = gm->info;
    const ditd_pipeline_class *pc = m->pipeline;
    const ditd_pipeline_class *erow = pc ? pc->img2img : NULL;
    ditd_multipart_form form = {0};
    upload img[DITD_EDIT_MAX_IMAGES] = {{0}}, mask = {0};
    int n_img = 0;
    ditd_image in = {0}, mk = {0};
    json_t *root = NULL;
    char *txt = NULL;
    char b[80];
    int err, parsed = 0;

    memset(r, 0, sizeof *r);
    if (ctype && !ditd_multipart_boundary(ctype, b, sizeof b))
        err = from_form(ctype, body, len, &root, &form, img, &n_img, &mask, e);
    else
        err = from_json(body, len, &root, img, &n_img, &mask, e);
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
    int n_given = json_object_get(root, "n") && !json_is_null(json_object_get(root, "n"));
    json_t *sv = json_object_get(root, "strength");
    if (sv && !json_is_null(sv) &&
        !(json_is_number(sv) && json_number_value(sv) > 0 && json_number_value(sv) <= 1)) {
        err = bad(e, "strength", "'strength' must be a number in (0, 1]: the part of the schedule "
                  "run from the noised image (1: all of it, the image only sets the start)");
        goto done;
    }
    double strength = sv && !json_is_null(sv) ? json_number_value(sv) : 0.0;
    const int strength_given = sv && !json_is_null(sv);
    const int reference = pc && pc->reference;
    /* max_area: a reference row's own (Kontext), an integer of pixels */
    json_t *ma = json_object_get(root, "max_area");
    long max_area = 0;
    if (ma && !json_is_null(ma)) {
        if (!reference) {
            err = bad(e, "max_area", "'max_area' is FluxKontextPipeline's; '%s' (%s) takes none",
                      m->name, pc ? pc->name : "?");
            goto done;
        }
        if (!json_is_integer(ma) || json_integer_value(ma) < 256 ||
            json_integer_value(ma) > 16384LL * 16384LL) {
            err = bad(e, "max_area", "'max_area' must be an integer of pixels (256..2^28)");
            goto done;
        }
        max_area = (long)json_integer_value(ma);
    }
    json_object_del(root, "max_area");
    json_object_del(root, "strength"); /* an edit's own: the generation parser refuses it */
    sv = NULL;
    /* an edit starts mid-schedule from the noised image: flow-euler only
     * (a known sampler's other names are refused here, before the
     * generation parser builds their schedule) */
    const char *smp = json_string_value(json_object_get(root, "sampler"));
    ditd_sampler_kind sk;
    if (!reference && smp && !ditd_sampler_kind_from_str(smp, &sk) &&
        sk != DITD_SAMPLER_FLOW_EULER) {
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
    if (reference && m->needs_vae) {
        err = reference_edit(m, size_given, strength_given, n_given, max_area, img, n_img,
                             &mask, lim, root, r, e);
        goto done;
    }
    if (!erow || !m->needs_vae) {
        err = bad(e, "model", "'%s' (%s) takes no input image: edits need a pipeline with "
                  "img2img (FLUX.1's: FluxPipeline, FluxImg2ImgPipeline, FluxInpaintPipeline; "
                  "SD3's: StableDiffusion3Pipeline and its Img2Img and Inpaint pipelines)",
                  m->name, pc ? pc->name : "?");
        goto done;
    }
    /* every header first (limits, sizes): a bomb or a mismatch among the
     * uploads is refused before any pixel memory is taken */
    ditd_image hdr;
    int W0 = 0, H0 = 0;
    for (int j = 0; j < n_img; j++) {
        if ((err = probe(&img[j], lim, &hdr, e)))
            goto done;
        if (j == 0) {
            W0 = hdr.width;
            H0 = hdr.height;
        } else if (hdr.width != W0 || hdr.height != H0) {
            err = bad(e, img[j].field, "'%s' is %dx%d, '%s' %dx%d: the images of one edit must "
                      "be the same size", img[j].label, hdr.width, hdr.height, img[0].label, W0,
                      H0);
            goto done;
        }
    }
    if (!size_given) { /* the image's size rounded down to the VAE multiple, as
                        * VaeImageProcessor.get_default_height_width */
        const int q = m->resizable && m->size_multiple > 0 ? m->size_multiple : 1;
        const int w = W0 >= q ? W0 - W0 % q : W0, h = H0 >= q ? H0 - H0 % q : H0;
        if (ditd_model_check_size(m, w, h)) {
            err = bad(e, img[0].field, "'%s' is %dx%d: %s (the output takes the image's size, "
                      "rounded down to a multiple of %d)", img[0].label, W0, H0,
                      ditd_err_detail(), q);
            goto done;
        }
        r->width = w;
        r->height = h;
    }
    const int rs = r->width != W0 || r->height != H0; /* resized to the output size */
    const size_t npo = (size_t)r->width * (size_t)r->height;
    if (mask.data) {
        if ((err = probe(&mask, lim, &hdr, e)))
            goto done;
        if (hdr.width != W0 || hdr.height != H0) {
            err = bad(e, "mask", "'mask' is %dx%d, the image %dx%d: they must be the same size "
                      "(OpenAI's rule)", hdr.width, hdr.height, W0, H0);
            goto done;
        }
    }
    /* Diffusers' image list: n a multiple of the images (n not given:
     * one output per image) */
    if (!n_given)
        r->n = n_img;
    if (ditd_edit_images_check(r->n, n_img, 0)) {
        err = bad(e, "n", "%s", ditd_err_detail());
        goto done;
    }
    const size_t np = (size_t)W0 * (size_t)H0;
    if (mask.data) {
        if ((err = decode(&mask, lim, &mk, e)))
            goto done;
        if (mk.channels != 4) {
            err = bad(e, "mask", "'mask' has no alpha channel: its fully transparent pixels mark "
                      "what to change (OpenAI's mask); send a PNG or WebP with alpha");
            goto done;
        }
    }
    if (!(r->image = malloc(npo * 3 * (size_t)n_img))) {
        err = oom(e);
        goto done;
    }
    r->n_images = n_img;
    /* without a mask, each image's own transparency (all of them, or none) */
    int n_alpha = 0;
    for (int j = 0; j < n_img; j++) {
        if ((err = decode(&img[j], lim, &in, e)))
            goto done;
        int t = !mask.data && has_transparency(&in);
        if (j > 0 && t != (n_alpha > 0)) {
            const upload *tr = t ? &img[j] : &img[0], *op = t ? &img[0] : &img[j];
            err = bad(e, img[j].field, "'%s' has transparent pixels and '%s' none: without a "
                      "mask each image's transparency is its mask, so all of them need some or "
                      "none (or send a mask)", tr->label, op->label);
            goto done;
        }
        if (t) {
            uint8_t *nm = realloc(r->mask, np * (size_t)(j + 1));
            if (!nm) {
                err = oom(e);
                goto done;
            }
            r->mask = nm;
            for (size_t i = 0; i < np; i++) /* OpenAI's alpha (0 = change) as Diffusers' luma */
                r->mask[(size_t)j * np + i] = (uint8_t)(255 - in.pixels[4 * i + 3]);
            n_alpha++;
        }
        /* the image at the output size, then its color (PIL's convert("RGB")):
         * VaeImageProcessor.preprocess resizes (Lanczos; RGBA premultiplied) first */
        uint8_t *dst = r->image + (size_t)j * npo * 3;
        if (!rs) {
            for (size_t i = 0; i < np; i++)
                memcpy(dst + 3 * i, in.pixels + (size_t)in.channels * i, 3);
        } else if (in.channels == 4 ? ditd_image_resize_rgba(in.pixels, W0, H0, dst, r->width,
                                                             r->height)
                                    : ditd_image_resize(in.pixels, W0, H0, 3, dst, r->width,
                                                        r->height)) {
            err = bad(e, img[j].field, "resizing '%s' to %dx%d: %s", img[j].label, r->width,
                      r->height, ditd_err_detail());
            goto done;
        }
        ditd_image_free(&in);
    }
    r->n_masks = n_alpha;
    const ditd_pipeline_class *row = erow;
    if (mk.pixels || n_alpha) {
        if (!pc->inpaint) {
            err = bad(e, mask.data ? "mask" : img[0].field, "'%s' (%s) takes no mask "
                      "(inpainting)", m->name, pc->name);
            goto done;
        }
        row = pc->inpaint;
    }
    if (mk.pixels) {
        /* the mask: OpenAI's alpha (0 = change) as Diffusers' luma (white =
         * repaint; the engine binarizes at 0.5: alpha <= 127 is repainted);
         * one mask for every image, as Diffusers' one mask_image */
        if (!(r->mask = malloc(np))) {
            err = oom(e);
            goto done;
        }
        for (size_t i = 0; i < np; i++)
            r->mask[i] = (uint8_t)(255 - mk.pixels[4 * i + 3]);
        r->n_masks = 1;
    }
    /* the masks (Diffusers' L) at the output size too, as the mask processor
     * resizes before its binarize */
    if (rs && r->mask) {
        uint8_t *mo = malloc(npo * (size_t)r->n_masks);
        if (!mo) {
            err = oom(e);
            goto done;
        }
        for (int j = 0; j < r->n_masks; j++)
            if (ditd_image_resize(r->mask + (size_t)j * np, W0, H0, 1, mo + (size_t)j * npo,
                                  r->width, r->height)) {
                free(mo);
                err = bad(e, "mask", "resizing the mask to %dx%d: %s", r->width, r->height,
                          ditd_err_detail());
                goto done;
            }
        free(r->mask);
        r->mask = mo;
    }
    /* the edit row's request fields (SD3's edit pipelines have no skip-layer
     * guidance, which the folder's text-to-image row has) */
    if (r->n_skip_layers > 0 && !(row->request & DITD_REQ_SKIP_LAYERS)) {
        err = bad(e, "skip_guidance_layers", "'skip_guidance_layers': %s has no skip-layer "
                  "guidance (an edit of '%s' follows it)", row->name, m->name);
        goto done;
    }
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
    for (int j = 0; j < n_img; j++)
        free(img[j].own);
    free(mask.own);
    free(txt);
    json_decref(root);
    ditd_multipart_free(&form);
    ditd_err_clear();
    return err;
}
