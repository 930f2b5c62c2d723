/* The LoRA routes (rows of the table in routes.c; docs/lora.md,
 * docs/api.md):
 *   GET /v1/loras             the adapters this server knows (--lora,
 *                             --lora-dir, POST), as the replicas reported
 *                             them; answered at once from the server's state;
 *   POST /v1/loras            (admin key) load {"name", "path"} on every
 *                             replica: the path checked against the allowed
 *                             folders here, the load done by sched_lora.c,
 *                             the connection suspended until every replica
 *                             answered;
 *   DELETE /v1/loras/{name}   (admin key) unload, refused while a request
 *                             not yet answered names the adapter.
 * Loop thread only. Not the loading itself (engine/worker/worker_lora.c). */
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "engine/core/error.h"
#include "engine/models/lora.h"
#include "server/daemon/lora_admin.h"
#include "server/daemon/reply.h"
#include "server/daemon/routes.h"
#include "server/daemon/sched.h"
#include "server/daemon/serve.h"

/* Slot i's entry; NULL on out of memory. */
static json_t *lora_json(const ditd_srv *s, int i)
{
    const ditd_srv_lora *l = &s->loras[i];
    json_t *o = json_object(), *mods = json_array();
    int ok = o && mods, on = 0;
    for (int m = 0; ok && m < l->n_modules; m++)
        ok = !json_array_append_new(mods, json_pack("{s:s,s:i}", "name", l->modules[m], "rank",
                                                    (json_int_t)l->ranks[m]));
    if (!ok) {
        json_decref(o);
        json_decref(mods);
        return NULL;
    }
    for (int r = 0; r < s->nrep; r++)
        on += s->rep[r].lora_resident[i] > 0;
    const char *name = s->cfg.loras.v[i].name;
    json_object_set_new(o, "id", json_string(name));
    json_object_set_new(o, "object", json_string("lora"));
    json_object_set_new(o, "model", json_string(s->info.name));
    /* loaded: on some replica's device now (under --lora-cache-mb an
     * adapter may be known but evicted; before a replica reports, neither) */
    json_object_set_new(o, "loaded", json_boolean(on > 0));
    json_object_set_new(o, "replicas_loaded", json_integer(on));
    json_object_set_new(o, "format", l->known ? json_string(ditd_lora_format_name(
                                                    (ditd_lora_format)l->format))
                                              : json_null());
    json_object_set_new(o, "rank", l->known ? json_integer(l->max_rank) : json_null());
    json_object_set_new(o, "num_modules", json_integer(l->n_modules));
    json_object_set_new(o, "modules", mods);
    json_object_set_new(o, "bytes", json_integer((json_int_t)l->bytes));
    json_object_set_new(o, "rows_served",
                        json_integer(i < DITD_METRICS_MAX_LORAS ? (json_int_t)s->m.lora_rows[i] : 0));
    return o;
}

enum MHD_Result ditd_route_loras(ditd_srv *s, struct MHD_Connection *c, ditd_route_req *rq,
                                 const char *rid)
{
    json_t *root, *data = json_array();
    int ok = data != NULL;
    for (int i = 0; ok && i < s->cfg.loras.n; i++)
        if (s->lora_names[i]) /* live (not a free slot, not one loading) */
            ok = !json_array_append_new(data, lora_json(s, i));
    root = ok ? json_pack("{s:s,s:o,s:i}", "object", "list", "data", data,
                          "max_loras_per_request", s->cfg.max_loras_per_request)
              : NULL;
    if (!ok)
        json_decref(data);
    return ditd_route_answer_json(s, c, rq->route, 200, root, rid);
}

/* ------------------------------------------------------------------ */
/* admin                                                               */

/* The op is over: its answer goes on the suspended connection. */
static void op_done(ditd_srv *s, void *ctx, int status, const ditd_api_error *e,
                    const char *name)
{
    ditd_route_req *rq = ctx;
    ditd_http_conn *hc = ditd_http_conn_of(rq->conn);
    const char *rid = hc ? hc->rid : NULL;
    size_t n = 0;
    if (status == 200) {
        json_t *o;
        int k = ditd__sched_lora_slot(s, name);
        if (!strcmp(rq->row->method, "DELETE"))
            o = json_pack("{s:s,s:s,s:b}", "id", name, "object", "lora", "deleted", 1);
        else
            o = k >= 0 ? lora_json(s, k) : NULL;
        char *txt = o ? json_dumps(o, JSON_COMPACT) : NULL;
        json_decref(o);
        n = txt ? strlen(txt) : 0;
        rq->resp = txt ? ditd_reply_buffer(txt, n, "application/json", rid) : NULL;
    } else {
        rq->resp = ditd_reply_error(e, rid, status == 503 ? 1 : 0, &n);
    }
    rq->resp_status = status;
    rq->resp_len = n;
    rq->waiting = 0;
    if (!rq->resp) { /* out of memory: a fixed 500 (ditd_route_answer's) */
        rq->resp = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
        rq->resp_status = 500;
    }
    MHD_resume_connection(rq->conn);
    ditd_http_kick(&s->http);
}

static void gone(ditd_srv *s, ditd_route_req *rq);

/* Starts the op and waits for it (the connection suspended). */
static enum MHD_Result start(ditd_srv *s, struct MHD_Connection *c, ditd_route_req *rq,
                             const char *rid, int kind, const char *name, const char *path)
{
    ditd_api_error e;
    int st = ditd__sched_lora_start(s, kind, name, path, op_done, rq, &e);
    if (st)
        return ditd_route_answer_err(s, c, rq->route, &e, rid, st == 503 ? 1 : 0, 0);
    rq->conn = c;
    rq->waiting = 1;
    rq->gone = gone;
    MHD_suspend_connection(c);
    return MHD_YES;
}

/* rq->gone: the client left while its op runs */
static void gone(ditd_srv *s, ditd_route_req *rq)
{
    ditd__sched_lora_forget(s, rq); /* the op goes on; nobody hears it */
    rq->waiting = 0;
}

static enum MHD_Result refuse(ditd_srv *s, struct MHD_Connection *c, ditd_route_req *rq,
                              const char *rid, int status, const char *code, const char *param,
                              const char *fmt, ...) __attribute__((format(printf, 8, 9)));
static enum MHD_Result refuse(ditd_srv *s, struct MHD_Connection *c, ditd_route_req *rq,
                              const char *rid, int status, const char *code, const char *param,
                              const char *fmt, ...)
{
    ditd_api_error e;
    char msg[sizeof e.message];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    ditd_api_error_set(&e, status, status >= 500 ? "server_error" : "invalid_request_error", code,
                       param, "%s", msg);
    return ditd_route_answer_err(s, c, rq->route, &e, rid, 0, 0);
}

/* Why the path rule (docs/lora.md): whoever holds an admin key makes the
 * server read the file, and a load's refusal quotes what it read (tensor
 * names, shapes); so by default files come only from the folders the
 * operator named for adapters (--lora-root, --lora-dir), links and ".."
 * resolved first. --lora-any-path lifts it for a host where the key
 * holder may read anything the server can. */
enum MHD_Result ditd_route_lora_load(ditd_srv *s, struct MHD_Connection *c, ditd_route_req *rq,
                                     const char *rid)
{
    ditd_lora_admin_req ar;
    ditd_api_error e;
    char resolved[DITD_LORA_PATH_MAX], why[512];
    const char *roots[2] = {s->cfg.lora_root, s->cfg.lora_dir};
    const char *base = s->cfg.lora_root[0] ? s->cfg.lora_root : s->cfg.lora_dir;
    int k, err;

    if (ditd_lora_admin_parse(rq->body, rq->body_len, &ar, &e))
        return ditd_route_answer_err(s, c, rq->route, &e, rid, 0, 0);
    if ((k = ditd__sched_lora_slot(s, ar.name)) >= 0) {
        if (s->lora_names[k])
            return refuse(s, c, rq, rid, 409, "lora_exists", "name", "LoRA adapter '%s' is "
                          "loaded already (DELETE /v1/loras/%s first)", ar.name, ar.name);
        return refuse(s, c, rq, rid, 409, "lora_busy", "name", "LoRA adapter '%s' is being %s; "
                      "retry when that ends", ar.name,
                      s->lora_op.kind == 1 ? "loaded" : "unloaded");
    }
    if (!s->cfg.lora_any_path && !s->cfg.lora_root[0] && !s->cfg.lora_dir[0])
        return refuse(s, c, rq, rid, 403, "path_not_allowed", "path",
                      "this server loads adapter files only from the folders --lora-root and "
                      "--lora-dir name, and it was given neither (nor --lora-any-path)");
    if ((err = ditd_lora_path_resolve(base, ar.path, resolved))) {
        snprintf(why, sizeof why, "%s", ditd_err_detail());
        return refuse(s, c, rq, rid, 400, err == DITD_ENOENT ? "file_not_found" : "invalid_value",
                      "path", "'path': %s", why);
    }
    if (!s->cfg.lora_any_path && !ditd_lora_path_under(roots, 2, resolved))
        return refuse(s, c, rq, rid, 403, "path_not_allowed", "path",
                      "'path': %s is outside the folders adapters may be loaded from (%s); "
                      "ditd serve --lora-any-path lifts this", resolved,
                      s->cfg.lora_root[0] && s->cfg.lora_dir[0] ? "--lora-root and --lora-dir"
                      : s->cfg.lora_root[0]                     ? "--lora-root"
                                                                : "--lora-dir");
    return start(s, c, rq, rid, 1, ar.name, resolved);
}

enum MHD_Result ditd_route_lora_unload(ditd_srv *s, struct MHD_Connection *c, ditd_route_req *rq,
                                       const char *rid)
{
    const char *name = rq->id ? rq->id : "";
    char shown[80];
    int k = ditd__sched_lora_slot(s, name), n;
    snprintf(shown, sizeof shown, "%.64s", name);
    ditd_utf8_clean(shown);
    if (k < 0)
        return refuse(s, c, rq, rid, 404, "lora_not_found", NULL,
                      "no LoRA adapter '%s' (GET /v1/loras lists them)", shown);
    if (!s->lora_names[k])
        return refuse(s, c, rq, rid, 409, "lora_busy", NULL,
                      "LoRA adapter '%s' is being %s; retry when that ends", shown,
                      s->lora_op.kind == 1 ? "loaded" : "unloaded");
    /* Refused while in use, rather than waited for: an unload that waits
     * would keep the adapter hidden for as long as a queue takes, with no
     * way for the caller to see why; a 409 says it, and the caller stops
     * sending the adapter and retries. */
    if ((n = ditd__sched_lora_in_use(s, k)) > 0)
        return refuse(s, c, rq, rid, 409, "lora_in_use", NULL,
                      "LoRA adapter '%s' is named by %d request(s) not yet answered (queued or "
                      "running); unload it once they finish", shown, n);
    return start(s, c, rq, rid, 2, name, NULL);
}
