/* Conditioning rows of a forward batch: class ids or text embeddings. */
#include "engine/models/conditioning.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "engine/core/error.h"

static const char *const kind_names[DITD_COND_KIND_COUNT] = {"class", "text"};

const char *ditd_cond_kind_name(ditd_cond_kind k)
{
    return (unsigned)k < DITD_COND_KIND_COUNT ? kind_names[k] : "?";
}

int ditd_cond_kind_from_str(const char *s, ditd_cond_kind *out)
{
    for (int i = 0; i < DITD_COND_KIND_COUNT; i++) {
        if (s && strcasecmp(s, kind_names[i]) == 0) {
            *out = (ditd_cond_kind)i;
            return 0;
        }
    }
    return ditd_err_set(DITD_EINVAL, "conditioning \"%s\" (class, text)", s ? s : "(null)");
}

int ditd_cond_init(ditd_cond *c, const ditd_cond_shape *shape, int max_rows)
{
    memset(c, 0, sizeof *c);
    if (max_rows <= 0)
        return ditd_err_set(DITD_EINVAL, "conditioning for %d rows", max_rows);
    if (shape->kind == DITD_COND_CLASS && shape->num_classes <= 0)
        return ditd_err_set(DITD_EINVAL, "class conditioning with %d classes", shape->num_classes);
    if (shape->kind == DITD_COND_TEXT &&
        (shape->text_len <= 0 || shape->text_dim <= 0 || shape->pooled_dim < 0))
        return ditd_err_set(DITD_EINVAL, "text conditioning (%d, %d), pooled %d", shape->text_len,
                            shape->text_dim, shape->pooled_dim);
    if ((unsigned)shape->kind >= DITD_COND_KIND_COUNT)
        return ditd_err_set(DITD_EINVAL, "conditioning kind %d", (int)shape->kind);
    c->shape = *shape;
    c->max_rows = max_rows;
    size_t B = (size_t)max_rows, L = (size_t)shape->text_len;
    int ok;
    c->guidance = calloc(B, sizeof *c->guidance);
    if (shape->kind == DITD_COND_CLASS) {
        c->class_ids = malloc(B * sizeof *c->class_ids);
        ok = c->guidance && c->class_ids;
    } else {
        c->text = malloc(B * L * (size_t)shape->text_dim * sizeof *c->text);
        c->mask = malloc(B * L);
        if (shape->pooled_dim)
            c->pooled = malloc(B * (size_t)shape->pooled_dim * sizeof *c->pooled);
        ok = c->guidance && c->text && c->mask && (!shape->pooled_dim || c->pooled);
    }
    if (!ok) {
        ditd_cond_free(c);
        return ditd_err_set(DITD_ENOMEM, "conditioning rows");
    }
    return 0;
}

void ditd_cond_free(ditd_cond *c)
{
    free(c->class_ids);
    free(c->text);
    free(c->mask);
    free(c->pooled);
    free(c->guidance);
    memset(c, 0, sizeof *c);
}

int ditd_cond_check(const ditd_cond_shape *shape, const ditd_cond_input *in)
{
    if (shape->kind == DITD_COND_CLASS) {
        if (in->class_id < 0 || in->class_id >= shape->num_classes)
            return ditd_err_set(DITD_EINVAL, "class %lld outside 0..%d", (long long)in->class_id,
                                shape->num_classes - 1);
        return 0;
    }
    if (!in->prompt || !in->prompt->seq)
        return ditd_err_set(DITD_EINVAL, "a text-conditioned model needs the prompt's embedding");
    if (shape->pooled_dim && !in->prompt->pooled)
        return ditd_err_set(DITD_EINVAL, "the model needs the prompt's pooled embedding");
    return 0;
}

static int set_text(ditd_cond *c, int row, const ditd_text_embeds *e)
{
    size_t L = (size_t)c->shape.text_len, Dt = (size_t)c->shape.text_dim;
    memcpy(c->text + (size_t)row * L * Dt, e->seq, L * Dt * sizeof(float));
    if (e->mask)
        memcpy(c->mask + (size_t)row * L, e->mask, L);
    else
        memset(c->mask + (size_t)row * L, 1, L);
    if (c->pooled) {
        if (!e->pooled)
            return ditd_err_set(DITD_EINVAL, "the model needs a pooled embedding");
        memcpy(c->pooled + (size_t)row * (size_t)c->shape.pooled_dim, e->pooled,
               (size_t)c->shape.pooled_dim * sizeof(float));
    }
    return 0;
}

int ditd_cond_set_row(ditd_cond *c, int row, const ditd_cond_input *in, int uncond)
{
    if (row < 0 || row >= c->max_rows)
        return ditd_err_set(DITD_EINVAL, "conditioning row %d outside 0..%d", row, c->max_rows - 1);
    if (c->shape.kind == DITD_COND_CLASS) {
        c->class_ids[row] = uncond ? c->shape.num_classes : in->class_id;
        return 0;
    }
    const ditd_text_embeds *e = uncond ? in->negative : in->prompt;
    if (!e || !e->seq)
        return ditd_err_set(DITD_EINVAL, "guidance needs the %s prompt's embedding",
                            uncond ? "negative" : "positive");
    return set_text(c, row, e);
}

ditd_cond ditd_cond_view(const ditd_cond *c, int r0)
{
    ditd_cond v = *c;
    size_t r = (size_t)r0, L = (size_t)c->shape.text_len;
    v.max_rows = c->max_rows - r0;
    if (c->class_ids)
        v.class_ids = c->class_ids + r;
    if (c->text)
        v.text = c->text + r * L * (size_t)c->shape.text_dim;
    if (c->mask)
        v.mask = c->mask + r * L;
    if (c->pooled)
        v.pooled = c->pooled + r * (size_t)c->shape.pooled_dim;
    if (c->guidance)
        v.guidance = c->guidance + r;
    if (c->t_frames)
        v.t_frames = c->t_frames + r * (size_t)c->t_frames_n;
    if (c->image)
        v.image = c->image + r * (size_t)c->image_len * (size_t)c->image_dim;
    return v;
}
