/* Each component's weights format, bytes and storage types
 * (model_storage.h). */
#include "engine/models/model_storage.h"

#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "engine/core/error.h"
#include "engine/io/weights.h"

static void count_type(ditd_component_storage *c, const char *name)
{
    for (int k = 0; k < c->ntypes; k++)
        if (strcmp(c->types[k].name, name) == 0) {
            c->types[k].count++;
            return;
        }
    if (c->ntypes == DITD_STORAGE_MAX_TYPES)
        return;
    ditd_storage_type *t = &c->types[c->ntypes++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->count = 1;
}

/* Reads one component's headers into out->c[out->n] (left out when its
 * weights do not open). */
static void component(ditd_model_storage *out, const char *name, const char *path)
{
    struct stat sb;
    if (!path || !path[0] || stat(path, &sb) != 0 || out->n == DITD_STORAGE_MAX_COMPONENTS)
        return;
    ditd_weights *w = NULL;
    if (ditd_weights_open(path, &w)) {
        ditd_err_clear();
        return;
    }
    ditd_component_storage *c = &out->c[out->n++];
    memset(c, 0, sizeof *c);
    snprintf(c->component, sizeof c->component, "%s", name);
    snprintf(c->format, sizeof c->format, "%s", ditd_weights_format(w));
    const ditd_gguf *g = ditd_weights_gguf(w);
    const ditd_safetensors *st = ditd_weights_st(w);
    size_t n = g ? ditd_gguf_count(g) : ditd_safetensors_count(st);
    for (size_t i = 0; i < n; i++) {
        if (g) {
            const ditd_gguf_tensor *t = ditd_gguf_at(g, i);
            c->bytes += t->nbytes;
            count_type(c, ditd_gguf_type_name(t->type));
        } else {
            const ditd_st_tensor *t = ditd_safetensors_at(st, i);
            c->bytes += t->nbytes;
            count_type(c, ditd_st_dtype_name(t->dtype));
        }
        c->tensors++;
    }
    /* most tensors first (a stable insertion sort: ties keep file order) */
    for (int i = 1; i < c->ntypes; i++)
        for (int j = i; j > 0 && c->types[j].count > c->types[j - 1].count; j--) {
            ditd_storage_type t = c->types[j];
            c->types[j] = c->types[j - 1];
            c->types[j - 1] = t;
        }
    ditd_weights_free(w);
}

void ditd_model_storage_read(const ditd_model_info *m, ditd_model_storage *out)
{
    char p[DITD_MODEL_PATH_MAX + 64];
    memset(out, 0, sizeof *out);
    component(out, "transformer", m->transformer_file[0] ? m->transformer_file
                                                         : m->transformer_dir);
    component(out, "transformer_2", m->transformer_2_dir);
    const ditd_pipeline_class *pc = m->pipeline;
    for (int i = 0; pc && i < pc->n_parts; i++) {
        const char *enc = pc->parts[i].encoder;
        int seen = 0;
        for (int k = 0; k < i; k++)
            seen |= strcmp(pc->parts[k].encoder, enc) == 0;
        if (!enc || seen)
            continue;
        if (strcmp(enc, "text_encoder_2") == 0 && m->text_encoder_2_file[0]) {
            component(out, enc, m->text_encoder_2_file);
            continue;
        }
        snprintf(p, sizeof p, "%s/%s", m->dir, enc);
        component(out, enc, p);
    }
    component(out, "image_encoder", m->image_encoder_dir);
    component(out, "vae", m->vae_dir);
}

void ditd_component_storage_line(const ditd_component_storage *c, char *buf, size_t len)
{
    double b = (double)c->bytes;
    size_t o = (size_t)snprintf(buf, len, "%s, %.1f %s in %d tensors", c->format,
                                b >= 1e9 ? b / 1e9 : b / 1e6, b >= 1e9 ? "GB" : "MB", c->tensors);
    for (int k = 0; k < c->ntypes && o < len; k++)
        o += (size_t)snprintf(buf + o, len - o, "%s %s %d", k ? "," : ":", c->types[k].name,
                              c->types[k].count);
}
