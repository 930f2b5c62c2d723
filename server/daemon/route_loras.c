/* GET /v1/loras (a row of the table in routes.c): the LoRA adapters this
 * server holds (--lora, --lora-dir), as the replicas reported loading them
 * (docs/lora.md, docs/api.md). Answers at once from the server's state.
 * Loop thread only. Not the loading: the replicas read the files at start
 * (engine/worker/worker.h); no admin route loads or unloads at run time. */
#include <jansson.h>

#include "engine/models/lora.h"
#include "server/daemon/routes.h"
#include "server/daemon/serve.h"

/* One entry; NULL on out of memory. */
static json_t *lora_json(const ditd_srv *s, int i)
{
    const ditd_srv_lora *l = &s->loras[i];
    json_t *o = json_object(), *mods = json_array();
    int ok = o && mods;
    for (int m = 0; ok && m < l->n_modules; m++)
        ok = !json_array_append_new(mods, json_pack("{s:s,s:i}", "name", l->modules[m], "rank",
                                                    (json_int_t)l->ranks[m]));
    if (!ok) {
        json_decref(o);
        json_decref(mods);
        return NULL;
    }
    const char *name = s->cfg.loras.v[i].name;
    json_object_set_new(o, "id", json_string(name));
    json_object_set_new(o, "object", json_string("lora"));
    json_object_set_new(o, "model", json_string(s->info.name));
    /* loaded: a replica said so (before that, only the name is known) */
    json_object_set_new(o, "loaded", json_boolean(l->known));
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
        ok = !json_array_append_new(data, lora_json(s, i));
    root = ok ? json_pack("{s:s,s:o,s:i}", "object", "list", "data", data,
                          "max_loras_per_request", s->cfg.max_loras_per_request)
              : NULL;
    if (!ok)
        json_decref(data);
    return ditd_route_answer_json(s, c, rq->route, 200, root, rid);
}
