/* The informational routes of `ditd serve` (rows of the table in
 * routes.c): GET /v1/models and /v1/models/{id}, /healthz, /readyz,
 * /metrics, /openapi.json and the page at /. Each reads the server's state
 * and answers at once; none queues work. Loop thread only. */
#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "engine/core/error.h"
#include "proto/openapi.h"
#include "server/daemon/jobrun.h"
#include "server/daemon/log.h"
#include "server/daemon/page.h"
#include "server/daemon/reply.h"
#include "server/daemon/routes.h"
#include "server/daemon/sched.h"
#include "server/daemon/serve.h"
#include "server/daemon/webhook.h"

/* "storage": per component, its weights format, bytes, tensor count and
 * the tensors of each storage type (engine/models/model_storage.h). */
static json_t *storage_json(const ditd_model_storage *st)
{
    json_t *o = json_object();
    for (int i = 0; o && i < st->n; i++) {
        const ditd_component_storage *c = &st->c[i];
        json_t *types = json_object();
        for (int k = 0; types && k < c->ntypes; k++)
            json_object_set_new(types, c->types[k].name, json_integer(c->types[k].count));
        json_object_set_new(o, c->component,
                            json_pack("{s:s,s:I,s:i,s:o*}", "format", c->format, "bytes",
                                      (json_int_t)c->bytes, "tensors", c->tensors, "types",
                                      types));
    }
    return o;
}

/* One entry of GET /v1/models: the served model under one of its names
 * (its folder's or an alias; "root" is the folder's). docs/api.md shows
 * the shape. NULL on out of memory. */
static json_t *model_json(ditd_srv *s, const char *id)
{
    const ditd_model_info *m = &s->info;
    int text = m->shapes.cond.kind == DITD_COND_TEXT;
    char size[32];
    json_t *o = json_object(), *sizes = json_array(), *samplers = json_array();
    json_t *defaults = json_object(), *range = json_object();
    if (!o || !sizes || !samplers || !defaults || !range) {
        json_decref(o), json_decref(sizes), json_decref(samplers), json_decref(defaults),
            json_decref(range);
        return NULL;
    }
    snprintf(size, sizeof size, "%dx%d", m->image_width, m->image_height);
    json_object_set_new(o, "id", json_string(id));
    json_object_set_new(o, "object", json_string("model"));
    json_object_set_new(o, "created", json_integer((json_int_t)s->t_wall));
    json_object_set_new(o, "owned_by", json_string("ditd"));
    json_object_set_new(o, "root", json_string(m->name));
    json_object_set_new(o, "architecture", json_string(m->denoiser_class));
    /* the pipeline row: its class, guidance kind and what a request may carry */
    const ditd_pipeline_class *pc = m->pipeline;
    json_t *params = json_array();
    json_object_set_new(o, "pipeline", json_string(pc->name));
    json_object_set_new(o, "guidance", json_string(ditd_guidance_kind_name(pc->guidance)));
    if (params) {
        static const char *const p23[2] = {"prompt_2", "prompt_3"};
        static const char *const n23[2] = {"negative_prompt_2", "negative_prompt_3"};
        if (!text)
            json_array_append_new(params, json_string("class_label"));
        if (pc->request & DITD_REQ_NEGATIVE_PROMPT)
            json_array_append_new(params, json_string("negative_prompt"));
        for (int k = 0; k + 1 < ditd_pipeline_class_prompts(pc) && k < 2; k++) {
            json_array_append_new(params, json_string(p23[k]));
            if (pc->request & DITD_REQ_NEGATIVE_PROMPT)
                json_array_append_new(params, json_string(n23[k]));
        }
        if (pc->request & DITD_REQ_TRUE_CFG)
            json_array_append_new(params, json_string("true_cfg_scale"));
        if (pc->request & DITD_REQ_MAX_SEQUENCE)
            json_array_append_new(params, json_string("max_sequence_length"));
        if (pc->request & DITD_REQ_SKIP_LAYERS) {
            json_array_append_new(params, json_string("skip_guidance_layers"));
            json_array_append_new(params, json_string("skip_layer_guidance_scale"));
            json_array_append_new(params, json_string("skip_layer_guidance_start"));
            json_array_append_new(params, json_string("skip_layer_guidance_stop"));
        }
        if (m->transformer_2_dir[0] && (pc->request & DITD_REQ_GUIDANCE_2))
            json_array_append_new(params, json_string("guidance_scale_2"));
        json_object_set_new(o, "parameters", params);
    }
    /* a video model: its clips (POST /v1/videos) */
    if (m->frames > 0)
        json_object_set_new(o, "video",
                            json_pack("{s:i,s:i,s:i,s:i,s:i,s:b,s:s,s:s,s:s}", "default_frames",
                                      m->frames, "frame_step", m->frame_step, "max_frames",
                                      m->max_frames, "fps", m->fps, "experts",
                                      m->transformer_2_dir[0] ? 2 : 1, "expand_timesteps",
                                      m->expand_timesteps, "endpoint", "/v1/videos",
                                      "input_reference",
                                      pc->image_to_video ? "required" : "refused",
                                      "last_frame_reference",
                                      m->last_image ? "required" : "refused"));
    /* image edits (POST /v1/images/edits): which modes the folder takes, by
     * which rows; null when it takes no input image */
    if (pc->img2img && m->needs_vae && m->frames <= 0) {
        json_t *ed = json_pack("{s:s,s:b,s:b,s:s,s:f,s:i,s:s}", "img2img", pc->img2img->name,
                               "inpaint", pc->inpaint != NULL, "mask", pc->inpaint != NULL,
                               "inpaint_pipeline", pc->inpaint ? pc->inpaint->name : "",
                               "default_strength", pc->img2img->default_strength,
                               "default_steps", pc->img2img->default_steps, "endpoint",
                               "/v1/images/edits");
        if (ed) {
            json_object_set_new(ed, "max_images", json_integer(1));
            json_object_set_new(ed, "mode", json_string(pc->inpaint ? "img2img, inpaint"
                                                                     : "img2img"));
            /* a masked edit's own defaults (SD3's inpainting: strength 1.0) */
            if (pc->inpaint) {
                json_object_set_new(ed, "inpaint_default_strength",
                                    json_real(pc->inpaint->default_strength));
                json_object_set_new(ed, "inpaint_default_steps",
                                    json_integer(pc->inpaint->default_steps));
            }
            json_object_set_new(ed, "skip_guidance_layers",
                                json_boolean((pc->img2img->request & DITD_REQ_SKIP_LAYERS) != 0));
        }
        json_object_set_new(o, "edits", ed);
    } else if (pc->reference && m->needs_vae && m->frames <= 0) {
        /* FluxKontextPipeline: the image is a reference the model attends
         * to (no strength, no mask), the output at max_area pixels */
        json_t *ed = json_pack("{s:s,s:n,s:s,s:b,s:b,s:n,s:i,s:I,s:b,s:s,s:i}", "mode",
                               "reference", "img2img", "reference_pipeline", pc->name, "inpaint", 0,
                               "mask", 0, "default_strength", "default_steps", pc->default_steps,
                               "max_area", (json_int_t)pc->default_max_area, "auto_resize",
                               pc->auto_resize, "endpoint", "/v1/images/edits", "max_images", 1);
        json_object_set_new(o, "edits", ed);
    } else {
        json_object_set_new(o, "edits", json_null());
    }
    json_object_set_new(o, "conditioning", json_string(text ? "text" : "class"));
    if (!text) {
        json_t *classes = json_array();
        for (int i = 0; classes && i < m->num_classes; i++)
            json_array_append_new(classes, json_pack("{s:i,s:s}", "id", i, "label", m->labels[i]));
        json_object_set_new(o, "classes", classes);
        json_object_set_new(o, "num_classes", json_integer(m->num_classes));
    } else {
        json_object_set_new(o, "max_sequence_length", json_integer(m->max_sequence_length));
        json_object_set_new(o, "max_prompt_bytes", json_integer(DITD_GENREQ_MAX_PROMPT_BYTES));
    }
    /* sizes: the one a fixed model makes; a resizable model's default,
     * with the range it takes in size_range */
    json_array_append_new(sizes, json_string(size));
    json_object_set_new(o, "sizes", sizes);
    json_object_set_new(range, "resizable", json_boolean(m->resizable));
    json_object_set_new(range, "default", json_string(size));
    if (m->resizable) {
        json_object_set_new(range, "min", json_integer(m->min_size));
        json_object_set_new(range, "max", json_integer(m->max_size));
        json_object_set_new(range, "multiple", json_integer(m->size_multiple));
    }
    json_object_set_new(o, "size_range", range);
    json_object_set_new(o, "channels", json_integer(m->image_channels));
    json_object_set_new(defaults, "num_inference_steps", json_integer(m->default_steps));
    json_object_set_new(defaults, "guidance_scale", json_real((double)m->default_guidance));
    json_object_set_new(defaults, "sampler", json_string(ditd_sampler_kind_name(s->sched_default)));
    json_object_set_new(defaults, "size", json_string(size));
    if (text) {
        json_object_set_new(defaults, "max_sequence_length",
                            json_integer(m->default_max_sequence_length));
        if (pc->request & DITD_REQ_TRUE_CFG)
            json_object_set_new(defaults, "true_cfg_scale", json_real(1.0));
        if (pc->request & DITD_REQ_SKIP_LAYERS) {
            json_object_set_new(defaults, "skip_layer_guidance_scale", json_real(pc->slg_scale));
            json_object_set_new(defaults, "skip_layer_guidance_start", json_real(pc->slg_start));
            json_object_set_new(defaults, "skip_layer_guidance_stop", json_real(pc->slg_stop));
        }
    }
    json_object_set_new(o, "defaults", defaults);
    for (int k = 0; k < DITD_SAMPLER_KIND_COUNT; k++)
        json_array_append_new(samplers, json_string(ditd_sampler_kind_name((ditd_sampler_kind)k)));
    json_object_set_new(o, "samplers", samplers);
    json_object_set_new(o, "max_n", json_integer(DITD_GENREQ_MAX_N));
    json_object_set_new(o, "storage", storage_json(&s->storage));
    return o;
}

enum MHD_Result ditd_route_model(ditd_srv *s, struct MHD_Connection *c, ditd_route_req *rq,
                                 const char *rid)
{
    ditd_api_error e;
    const char *name = rq->id ? rq->id : "";
    if (!ditd_genreq_model_named(&s->gm, name)) {
        ditd_api_error_set(&e, 404, "invalid_request_error", "model_not_found", "model",
                           "no model '%.200s'; this server has '%s'", name, s->info.name);
        return ditd_route_answer_err(s, c, rq->route, &e, rid, 0, 0);
    }
    return ditd_route_answer_json(s, c, rq->route, 200, model_json(s, name), rid);
}

enum MHD_Result ditd_route_models(ditd_srv *s, struct MHD_Connection *c, ditd_route_req *rq,
                                  const char *rid)
{
    /* every name is an entry (as vLLM lists its served names), the
     * folder's first */
    json_t *root, *data = json_array();
    int ok = data && !json_array_append_new(data, model_json(s, s->info.name));
    for (int i = 0; ok && i < s->gm.n_aliases; i++)
        ok = !json_array_append_new(data, model_json(s, s->gm.aliases[i]));
    root = ok ? json_pack("{s:s,s:o}", "object", "list", "data", data) : NULL;
    if (!ok)
        json_decref(data);
    return ditd_route_answer_json(s, c, rq->route, 200, root, rid);
}

enum MHD_Result ditd_route_healthz(ditd_srv *s, struct MHD_Connection *c, ditd_route_req *rq,
                                   const char *rid)
{
    /* alive while one replica is: a stalled replica is reported, and
     * routed around, but does not make the process look dead */
    double now = ditd__now();
    int alive_n = 0;
    json_t *root, *reps = json_array();
    for (int r = 0; r < s->nrep; r++) {
        double age = s->rep[r].last_hb > 0 ? now - s->rep[r].last_hb : -1;
        int alive = ditd__sched_replica_alive(s, r);
        alive_n += alive;
        json_array_append_new(reps, json_pack("{s:i,s:b,s:b,s:f,s:b}", "replica", r, "alive",
                                              alive, "ready", s->rep[r].ready,
                                              "last_heartbeat_s", age, "busy",
                                              s->rep[r].running != NULL));
    }
    const char *st = alive_n == 0 ? "unhealthy" : alive_n < s->nrep ? "degraded" : "ok";
    root = json_pack("{s:s,s:i,s:i,s:o}", "status", st, "replicas_alive", alive_n,
                     "replicas_total", s->nrep, "replicas", reps);
    return ditd_route_answer_json(s, c, rq->route, alive_n ? 200 : 503, root, rid);
}

enum MHD_Result ditd_route_readyz(ditd_srv *s, struct MHD_Connection *c, ditd_route_req *rq,
                                  const char *rid)
{
    int up = ditd__sched_replicas_up(s);
    const char *why = s->draining ? "draining" : up == 0 ? "no replica ready"
                      : s->q_len >= s->cfg.max_queue ? "queue full" : NULL;
    json_t *root = json_pack("{s:s,s:i,s:i,s:i,s:b}", "status", why ? why : "ready", "replicas_up",
                             up, "queue_depth", s->q_len, "max_queue", s->cfg.max_queue,
                             "draining", s->draining);
    return ditd_route_answer_json(s, c, rq->route, why ? 503 : 200, root, rid);
}

enum MHD_Result ditd_route_metrics(ditd_srv *s, struct MHD_Connection *c, ditd_route_req *rq,
                                   const char *rid)
{
    ditd_metrics_gauges g = {.model = s->info.name,
                             .queue_depth = s->q_len,
                             .running_batches = ditd__sched_running(s),
                             .replicas = s->nrep,
                             .replicas_up = ditd__sched_replicas_up(s),
                             .draining = s->draining,
                             .connections = s->http.n_conns,
                             .refused_capacity = s->http.refused_capacity,
                             .refused_per_client = s->http.refused_per_client,
                             .read_timeouts = s->http.read_timeouts,
                             .evicted = s->http.evicted};
    for (ditd_job *j = s->jobs.head; j; j = j->all_next)
        g.inflight_requests += j->state == DITD_JOB_WAITING;
    for (int r = 0; r < s->nrep; r++) {
        g.text_cache_hits += s->rep[r].text_hits;
        g.text_cache_misses += s->rep[r].text_misses;
        g.text_cache_entries += s->rep[r].text_entries;
        g.text_encode_s += s->rep[r].text_encode_ms / 1e3;
    }
    if (s->jobrun && s->jobrun->st) {
        ditd_jobstore_counts(s->jobrun->st, g.jobs);
        g.store_bytes = ditd_jobstore_bytes(s->jobrun->st);
        g.jobs_created = s->jobrun->created;
        g.jobs_expired = s->jobrun->expired;
        g.jobs_deleted = s->jobrun->deleted;
        g.jobs_refused_full = s->jobrun->refused_full;
    }
    ditd_webhook_counts(s->webhook, &g.hooks_delivered, &g.hooks_failed, &g.hooks_dropped);
    g.lora_names = s->lora_names;
    g.n_loras = s->cfg.loras.n;
    for (int i = 0; i < s->cfg.loras.n; i++) {
        g.loras_loaded += s->lora_names[i] != NULL;
        for (int r = 0; r < s->nrep; r++)
            g.lora_resident_bytes += s->rep[r].lora_resident[i];
    }
    size_t len = 0;
    char *text = ditd_metrics_render(&s->m, &g, &len);
    return ditd_route_answer(
        s, c, rq->route, 200,
        text ? ditd_reply_buffer(text, len, "text/plain; version=0.0.4; charset=utf-8", rid) : NULL,
        len);
}

enum MHD_Result ditd_route_openapi(ditd_srv *s, struct MHD_Connection *c, ditd_route_req *rq,
                                   const char *rid)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(
        ditd_openapi_json_len, (void *)ditd_openapi_json, MHD_RESPMEM_PERSISTENT);
    if (r) {
        MHD_add_response_header(r, "Content-Type", "application/json");
        ditd_reply_headers(r, rid);
    }
    return ditd_route_answer(s, c, rq->route, 200, r, ditd_openapi_json_len);
}

enum MHD_Result ditd_route_page(ditd_srv *s, struct MHD_Connection *c, ditd_route_req *rq,
                                const char *rid)
{
    struct MHD_Response *r = ditd_page_response();
    if (r)
        ditd_reply_headers(r, rid);
    return ditd_route_answer(s, c, rq->route, 200, r, ditd_page_html_len);
}
