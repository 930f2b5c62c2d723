/* The background-job routes (rows of the table in routes.c):
 *   POST /v1/images/generations with "background": true  -> 202, the job
 *   GET /v1/jobs (limit, after, order)                      -> a page of jobs
 *   GET /v1/jobs/{id}                                        -> the job
 *   GET /v1/jobs/{id}/content (index)                        -> its PNG
 *   DELETE /v1/jobs/{id}                                     -> gone (stops it)
 * Every lookup is by the caller's key: another key's job is 404, as an
 * unknown one. docs/api.md shows the shapes. Loop thread only. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/error.h"
#include "server/common/parse.h"
#include "server/daemon/jobrun.h"
#include "server/daemon/reply.h"
#include "server/daemon/routes.h"
#include "server/daemon/serve.h"

json_t *ditd_route_opt_time(long long t)
{
    return t > 0 ? json_integer((json_int_t)t) : json_null();
}

json_t *ditd_route_job_error(const ditd_jrow *r)
{
    return r->status == DITD_JS_FAILED
               ? json_pack("{s:s,s:s}", "code", r->error_code, "message", r->error_message)
               : json_null();
}

/* The job object. NULL on out of memory. */
static json_t *job_json(const ditd_jrow *r)
{
    json_t *o = json_object();
    char url[96];
    if (!o)
        return NULL;
    json_object_set_new(o, "id", json_string(r->id));
    json_object_set_new(o, "object", json_string("job"));
    json_object_set_new(o, "kind", json_string(r->kind));
    json_object_set_new(o, "model", json_string(r->model));
    json_object_set_new(o, "status", json_string(ditd_jstatus_name(r->status)));
    json_object_set_new(o, "progress", json_integer(r->progress));
    json_object_set_new(o, "created_at", json_integer((json_int_t)r->created_at));
    json_object_set_new(o, "started_at", ditd_route_opt_time(r->started_at));
    json_object_set_new(o, "completed_at", ditd_route_opt_time(r->completed_at));
    json_object_set_new(o, "expires_at", ditd_route_opt_time(r->expires_at));
    json_object_set_new(o, "size", json_string(r->size));
    json_object_set_new(o, "outputs", json_integer(r->n_outputs));
    snprintf(url, sizeof url, "/v1/jobs/%s/content", r->id);
    json_object_set_new(o, "content_url",
                        r->status == DITD_JS_COMPLETED ? json_string(url) : json_null());
    json_object_set_new(o, "error", ditd_route_job_error(r));
    return o;
}

static json_t *job_json_s(ditd_srv *s, const ditd_jrow *r)
{
    (void)s;
    return job_json(r);
}

static enum MHD_Result not_found(ditd_srv *s, struct MHD_Connection *c, ditd_route_req *rq,
                                 const char *rid)
{
    ditd_api_error e;
    ditd_api_error_set(&e, 404, "invalid_request_error", "job_not_found", "id",
                       "no job '%.100s'", rq->id ? rq->id : "");
    return ditd_route_answer_err(s, c, rq->route, &e, rid, 0, 0);
}

enum MHD_Result ditd_route_store_error(ditd_srv *s, struct MHD_Connection *c, ditd_route_req *rq,
                                       const char *rid)
{
    ditd_api_error e;
    ditd_api_error_set(&e, 500, "server_error", "storage_failed", NULL, "the job store: %s",
                       ditd_err_detail());
    return ditd_route_answer_err(s, c, rq->route, &e, rid, 0, 0);
}

/* POST /v1/images/generations with "background": true (route_gen.c asks). */
enum MHD_Result ditd_route_job_create(ditd_srv *s, struct MHD_Connection *c, ditd_route_req *rq,
                                      const char *rid)
{
    ditd_api_error e;
    ditd_jrow row;
    int st = ditd_jobrun_create(s, rq->owner, "image", rq->body ? rq->body : "",
                                rq->body_len, &row, &e);
    if (st)
        return ditd_route_answer_err(s, c, DITD_ROUTE_GENERATIONS, &e, rid, 0, 0);
    json_t *o = job_json(&row);
    char *txt = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    size_t n = txt ? strlen(txt) : 0;
    struct MHD_Response *r = txt ? ditd_reply_buffer(txt, n, "application/json", rid) : NULL;
    if (r) {
        char loc[80];
        snprintf(loc, sizeof loc, "/v1/jobs/%s", row.id);
        MHD_add_response_header(r, "Location", loc);
    }
    return ditd_route_answer(s, c, DITD_ROUTE_GENERATIONS, 202, r, n);
}

enum MHD_Result ditd_route_job_get(ditd_srv *s, struct MHD_Connection *c, ditd_route_req *rq,
                                   const char *rid)
{
    ditd_jrow row;
    int err = ditd_jobstore_get(s->jobrun->st, rq->id, rq->owner, &row, 0);
    if (err == DITD_ENOENT)
        return not_found(s, c, rq, rid);
    if (err)
        return ditd_route_store_error(s, c, rq, rid);
    return ditd_route_answer_json(s, c, rq->route, 200, job_json(&row), rid);
}

enum MHD_Result ditd_route_job_delete(ditd_srv *s, struct MHD_Connection *c, ditd_route_req *rq,
                                      const char *rid)
{
    ditd_jrow row;
    int err = ditd_jobstore_get(s->jobrun->st, rq->id, rq->owner, &row, 0);
    if (err == DITD_ENOENT)
        return not_found(s, c, rq, rid);
    if (err || ditd_jobrun_delete(s, row.id))
        return ditd_route_store_error(s, c, rq, rid);
    return ditd_route_answer_json(s, c, rq->route, 200,
                                  json_pack("{s:s,s:s,s:b}", "id", row.id, "object", "job.deleted",
                                            "deleted", 1),
                                  rid);
}

enum MHD_Result ditd_route_job_content(ditd_srv *s, struct MHD_Connection *c, ditd_route_req *rq,
                                       const char *rid)
{
    ditd_api_error e;
    ditd_jrow row;
    long index = 0;
    int err = ditd_jobstore_get(s->jobrun->st, rq->id, rq->owner, &row, 0);
    if (err == DITD_ENOENT)
        return not_found(s, c, rq, rid);
    if (err)
        return ditd_route_store_error(s, c, rq, rid);
    if (row.status != DITD_JS_COMPLETED) {
        ditd_api_error_set(&e, 409, "invalid_request_error", "job_not_completed", "id",
                           "job %s is %s: its content is there once it is completed", row.id,
                           ditd_jstatus_name(row.status));
        return ditd_route_answer_err(s, c, rq->route, &e, rid, 0, 0);
    }
    const char *ix = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "index");
    if (ix && ditd_parse_long(ix, 0, row.n_outputs - 1, "index", &index)) {
        ditd_api_error_set(&e, 400, "invalid_request_error", "invalid_value", "index",
                           "index: '%.20s' is not an image of this job (0..%d)", ix,
                           row.n_outputs - 1);
        ditd_err_clear();
        return ditd_route_answer_err(s, c, rq->route, &e, rid, 0, 0);
    }
    uint8_t *data;
    size_t len;
    /* a video job's output 0 is its MP4 (/v1/videos/{id}/content says the same) */
    const char *ext = !strcmp(row.kind, "video") && index == 0 ? "mp4" : "png";
    if ((err = ditd_jobstore_read(s->jobrun->st, row.id, (int)index, ext, &data, &len)))
        return ditd_route_store_error(s, c, rq, rid);
    struct MHD_Response *r = ditd_reply_buffer((char *)data, len,
                                               ext[0] == 'm' ? "video/mp4" : "image/png", rid);
    if (r) {
        char cd[96];
        snprintf(cd, sizeof cd, "attachment; filename=\"%s-%ld.%s\"", row.id, index, ext);
        MHD_add_response_header(r, "Content-Disposition", cd);
    }
    return ditd_route_answer(s, c, rq->route, 200, r, len);
}

enum MHD_Result ditd_route_jobs_page(ditd_srv *s, struct MHD_Connection *c, ditd_route_req *rq,
                                     const char *rid, const char *kind, ditd_route_job_fn obj)
{
    ditd_api_error e;
    const char *ls = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "limit");
    const char *after = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "after");
    const char *order = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "order");
    long limit = 20;
    int n = 0, more = 0, desc = 1, err;
    if (ls && ditd_parse_long(ls, 1, DITD_JOBSTORE_MAX_LIST, "limit", &limit)) {
        ditd_err_clear();
        ditd_api_error_set(&e, 400, "invalid_request_error", "invalid_value", "limit",
                           "limit must be an integer in 1..%d", DITD_JOBSTORE_MAX_LIST);
        return ditd_route_answer_err(s, c, rq->route, &e, rid, 0, 0);
    }
    if (order && strcmp(order, "asc") && strcmp(order, "desc")) {
        ditd_api_error_set(&e, 400, "invalid_request_error", "invalid_value", "order",
                           "order must be 'asc' or 'desc'");
        return ditd_route_answer_err(s, c, rq->route, &e, rid, 0, 0);
    }
    desc = !order || !strcmp(order, "desc");
    ditd_jrow *rows = calloc(DITD_JOBSTORE_MAX_LIST, sizeof *rows);
    if (!rows)
        return ditd_route_answer(s, c, rq->route, 500, NULL, 0);
    err = ditd_jobstore_list(s->jobrun->st, rq->owner, kind, after && *after ? after : NULL,
                             (int)limit, desc, rows, &n, &more);
    if (err == DITD_ENOENT) {
        free(rows);
        ditd_api_error_set(&e, 400, "invalid_request_error", "invalid_value", "after",
                           "after: no %s '%.100s'", kind ? kind : "job", after);
        return ditd_route_answer_err(s, c, rq->route, &e, rid, 0, 0);
    }
    if (err) {
        free(rows);
        return ditd_route_store_error(s, c, rq, rid);
    }
    json_t *data = json_array();
    for (int i = 0; data && i < n; i++)
        json_array_append_new(data, obj(s, &rows[i]));
    json_t *root = data ? json_pack("{s:s,s:o,s:o,s:o,s:b}", "object", "list", "data", data,
                                    "first_id", n ? json_string(rows[0].id) : json_null(),
                                    "last_id", n ? json_string(rows[n - 1].id) : json_null(),
                                    "has_more", more)
                        : NULL;
    free(rows);
    return ditd_route_answer_json(s, c, rq->route, 200, root, rid);
}

enum MHD_Result ditd_route_jobs_list(ditd_srv *s, struct MHD_Connection *c, ditd_route_req *rq,
                                     const char *rid)
{
    return ditd_route_jobs_page(s, c, rq, rid, NULL, job_json_s);
}
