/* OpenAI's videos API on the job store (rows of the table in routes.c):
 *   POST /v1/videos (JSON or multipart/form-data)  -> the video object, queued
 *   GET /v1/videos (limit, after, order)            -> a page of video objects
 *   GET /v1/videos/{id}                             -> the video object
 *   GET /v1/videos/{id}/content (variant)           -> the MP4; variant=thumbnail: the
 *                                                      first frame as a PNG
 *   DELETE /v1/videos/{id}                          -> gone (a running clip stops at
 *                                                      its next step on every rank)
 * A video is a job of kind "video" (jobrun.h): the same store, owner rule
 * (another key's video is 404, as an unknown one), retention and disk
 * budget as the image jobs of route_jobs.c. The official client sends a
 * form whatever the fields; its values are text, turned here into the
 * JSON the request parser reads (ditd_genreq_parse_video). docs/api.md
 * shows the shapes. Loop thread only. */
#include <gnutls/gnutls.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/error.h"
#include "server/common/parse.h"
#include "server/daemon/jobrun.h"
#include "server/daemon/multipart.h"
#include "server/daemon/reply.h"
#include "server/daemon/routes.h"
#include "server/daemon/serve.h"

/* The video object of a row (its stored request gives the clip's frames
 * and frame rate). NULL on out of memory. */
static json_t *video_json(ditd_srv *s, const ditd_jrow *r)
{
    ditd_jrow full;
    long long frames = 0, fps = 0;
    char seconds[32] = "";
    json_t *o = json_object();
    if (!o)
        return NULL;
    if (!ditd_jobstore_get(s->jobrun->st, r->id, NULL, &full, 1)) {
        json_t *q = full.request ? json_loads(full.request, 0, NULL) : NULL;
        frames = json_integer_value(json_object_get(q, "num_frames"));
        fps = json_integer_value(json_object_get(q, "fps"));
        const char *p = json_string_value(json_object_get(q, "prompt"));
        json_object_set_new(o, "prompt", p ? json_string(p) : json_null());
        json_decref(q);
        ditd_jrow_free(&full);
    }
    if (fps > 0)
        snprintf(seconds, sizeof seconds, "%g", (double)frames / (double)fps);
    json_object_set_new(o, "id", json_string(r->id));
    json_object_set_new(o, "object", json_string("video"));
    json_object_set_new(o, "model", json_string(r->model));
    json_object_set_new(o, "status", json_string(ditd_jstatus_name(r->status)));
    json_object_set_new(o, "progress", json_integer(r->progress));
    json_object_set_new(o, "created_at", json_integer((json_int_t)r->created_at));
    json_object_set_new(o, "completed_at", ditd_route_opt_time(r->completed_at));
    json_object_set_new(o, "expires_at", ditd_route_opt_time(r->expires_at));
    json_object_set_new(o, "size", json_string(r->size));
    json_object_set_new(o, "seconds", json_string(seconds));
    json_object_set_new(o, "num_frames", json_integer((json_int_t)frames));
    json_object_set_new(o, "fps", json_integer((json_int_t)fps));
    json_object_set_new(o, "remixed_from_video_id", json_null());
    json_object_set_new(o, "error", ditd_route_job_error(r));
    return o;
}

static enum MHD_Result not_found(ditd_srv *s, struct MHD_Connection *c, ditd_route_req *rq,
                                 const char *rid)
{
    ditd_api_error e;
    ditd_api_error_set(&e, 404, "invalid_request_error", "video_not_found", "video_id",
                       "no video '%.100s'", rq->id ? rq->id : "");
    return ditd_route_answer_err(s, c, rq->route, &e, rid, 0, 0);
}

/* The caller's video {id}: 0, DITD_ENOENT (none, another key's, or a job
 * of another kind), or a store error. */
static int get_video(ditd_srv *s, ditd_route_req *rq, ditd_jrow *row)
{
    int err = ditd_jobstore_get(s->jobrun->st, rq->id, rq->owner, row, 0);
    if (!err && strcmp(row->kind, "video"))
        err = DITD_ENOENT;
    return err;
}

/* Form fields whose text is a number in the JSON body, and the one that
 * holds JSON. */
static const char *const int_fields[] = {"seed", "num_inference_steps", "num_frames", "fps",
                                         "max_sequence_length", NULL};
static const char *const num_fields[] = {"guidance_scale", "guidance_scale_2", NULL};
static const char *const obj_fields[] = {"cache", NULL};

/* A form (the official client's) as the JSON body the request parser reads
 * (ditd_multipart_to_json), its file parts input_reference and
 * last_frame_reference (FLF2V) as base64 text:
 * the body the job store keeps, so a restart re-runs the same clip. NULL
 * with *e on a bad form. */
static json_t *form_json(const char *ctype, const char *body, size_t len, ditd_api_error *e)
{
    ditd_multipart_form form;
    char field[64];
    json_t *o;
    if (ditd_multipart_parse(ctype, (const uint8_t *)body, len, NULL, &form)) {
        ditd_api_error_set(e, 400, "invalid_request_error", "invalid_value", NULL,
                           "the multipart/form-data body: %s", ditd_err_detail());
        ditd_err_clear();
        return NULL;
    }
    o = ditd_multipart_to_json(&form, int_fields, num_fields, obj_fields, field, sizeof field);
    if (!o && field[0]) /* a field named: the client's; else out of memory */
        ditd_api_error_set(e, 400, "invalid_request_error", "invalid_value", field, "%s",
                           ditd_err_detail());
    else if (!o)
        ditd_api_error_set(e, 500, "server_error", "internal_error", NULL, "%s", ditd_err_detail());
    /* (a text field given twice was refused above; a file part repeated, a
     * list, is refused here: a clip takes one of each) */
    static const char *const files[] = {"input_reference", "last_frame_reference"};
    for (size_t i = 0; o && i < sizeof files / sizeof files[0]; i++) {
        if (ditd_multipart_count(&form, files[i]) > 1) {
            ditd_api_error_set(e, 400, "invalid_request_error", "invalid_value", files[i],
                               "'%s' is given twice", files[i]);
            json_decref(o);
            o = NULL;
            break;
        }
        const ditd_multipart_part *p = ditd_multipart_find(&form, files[i], 0);
        if (!p || !p->filename)
            continue;
        /* the file's bytes, as JSON gives them */
        gnutls_datum_t in = {(unsigned char *)p->data, (unsigned)p->len}, b64 = {NULL, 0};
        json_t *str = NULL;
        if (p->len <= ((size_t)1 << 30) && gnutls_base64_encode2(&in, &b64) >= 0)
            str = json_stringn((const char *)b64.data, b64.size);
        gnutls_free(b64.data);
        if (!str || json_object_set_new(o, files[i], str)) {
            ditd_api_error_set(e, 500, "server_error", "internal_error", NULL, "out of memory");
            json_decref(o);
            o = NULL;
        }
    }
    ditd_multipart_free(&form);
    ditd_err_clear();
    return o;
}

enum MHD_Result ditd_route_video_create(ditd_srv *s, struct MHD_Connection *c, ditd_route_req *rq,
                                        const char *rid)
{
    ditd_api_error e;
    ditd_jrow row;
    const char *ct = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Type");
    const char *body = rq->body ? rq->body : "";
    size_t len = rq->body_len;
    char *txt = NULL;
    char b[80];
    if (ct && !ditd_multipart_boundary(ct, b, sizeof b)) {
        json_t *o = form_json(ct, body, len, &e);
        if (!o)
            return ditd_route_answer_err(s, c, rq->route, &e, rid, 0, 0);
        txt = json_dumps(o, JSON_COMPACT);
        json_decref(o);
        if (!txt)
            return ditd_route_answer(s, c, rq->route, 500, NULL, 0);
        body = txt;
        len = strlen(txt);
    }
    ditd_err_clear();
    int st = ditd_jobrun_create(s, rq->owner, "video", body, len, &row, &e);
    free(txt);
    if (st)
        return ditd_route_answer_err(s, c, rq->route, &e, rid, 0, 0);
    json_t *o = video_json(s, &row);
    char *out = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    size_t n = out ? strlen(out) : 0;
    struct MHD_Response *r = out ? ditd_reply_buffer(out, n, "application/json", rid) : NULL;
    if (r) {
        char loc[80];
        snprintf(loc, sizeof loc, "/v1/videos/%s", row.id);
        MHD_add_response_header(r, "Location", loc);
    }
    return ditd_route_answer(s, c, rq->route, 200, r, n);
}

enum MHD_Result ditd_route_video_get(ditd_srv *s, struct MHD_Connection *c, ditd_route_req *rq,
                                     const char *rid)
{
    ditd_jrow row;
    int err = get_video(s, rq, &row);
    if (err == DITD_ENOENT)
        return not_found(s, c, rq, rid);
    if (err)
        return ditd_route_store_error(s, c, rq, rid);
    return ditd_route_answer_json(s, c, rq->route, 200, video_json(s, &row), rid);
}

enum MHD_Result ditd_route_video_delete(ditd_srv *s, struct MHD_Connection *c, ditd_route_req *rq,
                                        const char *rid)
{
    ditd_jrow row;
    int err = get_video(s, rq, &row);
    if (err == DITD_ENOENT)
        return not_found(s, c, rq, rid);
    if (err || ditd_jobrun_delete(s, row.id))
        return ditd_route_store_error(s, c, rq, rid);
    return ditd_route_answer_json(s, c, rq->route, 200,
                                  json_pack("{s:s,s:s,s:b}", "id", row.id, "object",
                                            "video.deleted", "deleted", 1),
                                  rid);
}

enum MHD_Result ditd_route_video_content(ditd_srv *s, struct MHD_Connection *c, ditd_route_req *rq,
                                         const char *rid)
{
    ditd_api_error e;
    ditd_jrow row;
    int err = get_video(s, rq, &row);
    if (err == DITD_ENOENT)
        return not_found(s, c, rq, rid);
    if (err)
        return ditd_route_store_error(s, c, rq, rid);
    const char *variant = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "variant");
    int thumb = variant && !strcmp(variant, "thumbnail");
    if (variant && !thumb && strcmp(variant, "video")) {
        ditd_api_error_set(&e, 400, "invalid_request_error", "invalid_value", "variant",
                           "variant '%.40s' is not offered: 'video' (the MP4) or 'thumbnail' (its "
                           "first frame, PNG)", variant);
        return ditd_route_answer_err(s, c, rq->route, &e, rid, 0, 0);
    }
    if (row.status != DITD_JS_COMPLETED) {
        ditd_api_error_set(&e, 409, "invalid_request_error", "video_not_completed", "video_id",
                           "video %s is %s: its content is there once it is completed", row.id,
                           ditd_jstatus_name(row.status));
        return ditd_route_answer_err(s, c, rq->route, &e, rid, 0, 0);
    }
    uint8_t *data;
    size_t len;
    if ((err = ditd_jobstore_read(s->jobrun->st, row.id, thumb, thumb ? "png" : "mp4", &data, &len)))
        return ditd_route_store_error(s, c, rq, rid);
    struct MHD_Response *r = ditd_reply_buffer((char *)data, len, thumb ? "image/png" : "video/mp4",
                                               rid);
    if (r) {
        char cd[96];
        snprintf(cd, sizeof cd, "attachment; filename=\"%s.%s\"", row.id, thumb ? "png" : "mp4");
        MHD_add_response_header(r, "Content-Disposition", cd);
    }
    return ditd_route_answer(s, c, rq->route, 200, r, len);
}

enum MHD_Result ditd_route_videos_list(ditd_srv *s, struct MHD_Connection *c, ditd_route_req *rq,
                                       const char *rid)
{
    return ditd_route_jobs_page(s, c, rq, rid, "video", video_json);
}
