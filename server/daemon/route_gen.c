/* POST /v1/images/generations and POST /v1/images/edits (rows of the table
 * in routes.c): the body is validated into a typed request (genreq.h; an
 * edit's by editreq.c, its image decoded), the job queued (sched.h),
 * and the connection either streams (SSE) or waits suspended until the
 * reply sink (reply.c) resumes it with the answer; with "background": true
 * it becomes a stored job instead (route_jobs.c). Loop thread only. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/error.h"
#include "engine/models/pipeline_class.h"
#include "server/daemon/log.h"
#include "server/daemon/reply.h"
#include "server/daemon/routes.h"
#include "server/daemon/sched.h"
#include "server/daemon/serve.h"

/* "background": true (a boolean: the OpenAI API's own "background" is a
 * string, the image's transparency, and stays ignored) makes the request a
 * stored job (route_jobs.c). */
static int is_background(const char *body, size_t len)
{
    json_t *root = body ? json_loadb(body, len, 0, NULL) : NULL;
    int yes = root && json_is_true(json_object_get(root, "background"));
    json_decref(root);
    return yes;
}

/* Validate (a generation's body, or an edit's), queue, and either stream or
 * wait. */
static enum MHD_Result submit(ditd_srv *s, struct MHD_Connection *c, ditd_route_req *req,
                              const char *rid, ditd_route route)
{
    ditd_job *j = ditd_job_new(&s->jobs, s, &ditd_reply_sink, rid);
    if (!j)
        return MHD_NO;
    req->job = j;
    j->conn = c;
    j->http10 = req->http10;
    const char *acc = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Accept");
    j->want_png = acc && strstr(acc, "image/png") != NULL;
    ditd_api_error e;
    ditd_genreq rq;
    int st;
    const char *body = req->body ? req->body : "";
    if (route == DITD_ROUTE_EDITS
            ? ditd_genreq_parse_edit(MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Type"),
                                     body, req->body_len, &s->gm, NULL, &rq, &e)
            : ditd_genreq_parse(body, req->body_len, &s->gm, &rq, &e)) {
        ditd_job_refuse(j);
        return ditd_route_answer_err(s, c, route, &e, j->rid, 0, 0);
    }
    /* FluxKontextPipeline brings a generation's size to max_area too (as its
     * __call__ does with or without an image; an edit did it already) */
    const ditd_pipeline_class *pc = s->info.pipeline;
    if (route == DITD_ROUTE_GENERATIONS && pc && pc->reference &&
        (ditd_pipeline_class_area_size(pc->default_max_area, rq.width, rq.height,
                                       2 * s->info.vae_scale, &rq.width, &rq.height) ||
         ditd_model_check_size(&s->info, rq.width, rq.height))) {
        ditd_api_error_set(&e, 400, "invalid_request_error", "invalid_value", "size", "%s",
                           ditd_err_detail());
        ditd_genreq_free(&rq);
        ditd_job_refuse(j);
        return ditd_route_answer_err(s, c, route, &e, j->rid, 0, 0);
    }
    free(req->body);
    req->body = NULL;
    req->body_len = req->body_cap = 0;
    if (ditd_job_accept(j, &rq, ditd_genreq_numel(&rq, &s->info))) {
        ditd_genreq_free(&rq);
        ditd_job_refuse(j);
        ditd_api_error_set(&e, 500, "server_error", "internal_error", NULL, "out of memory");
        return ditd_route_answer_err(s, c, route, &e, j->rid, 0, 0);
    }
    if ((st = ditd__sched_submit(s, j, &e))) {
        ditd_job_refuse(j); /* nothing of it is out */
        return ditd_route_answer_err(s, c, route, &e, j->rid,
                                     st == 429 ? ditd__sched_retry_after(s) : st == 503 ? 5 : 0, 0);
    }
    if (j->rq.stream) {
        j->status = 200;
        return ditd_route_answer(s, c, route, 200, ditd_reply_stream(j), 0);
    }
    j->suspended = 1;
    MHD_suspend_connection(c);
    return MHD_YES;
}

/* The body is in: a background job, or a request answered on this
 * connection. */
enum MHD_Result ditd_route_generate(ditd_srv *s, struct MHD_Connection *c, ditd_route_req *req,
                                    const char *rid)
{
    if (is_background(req->body, req->body_len))
        return ditd_route_job_create(s, c, req, rid);
    return submit(s, c, req, rid, DITD_ROUTE_GENERATIONS);
}

enum MHD_Result ditd_route_edit(ditd_srv *s, struct MHD_Connection *c, ditd_route_req *req,
                                const char *rid)
{
    return submit(s, c, req, rid, DITD_ROUTE_EDITS);
}
