/* A job's states, outcome and references (server/daemon/job.h). */
#include "server/daemon/job.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/error.h"
#include "server/daemon/log.h"

static const char *const state_names[] = {"body", "waiting", "answered"};
static const char *const outcome_names[] = {"pending", "result", "error", "canceled"};

const char *ditd_job_state_name(ditd_job_state s)
{
    return (unsigned)s < DITD_JOB_STATE_COUNT ? state_names[s] : "?";
}

int ditd_job_state_from_str(const char *s, ditd_job_state *out)
{
    for (int i = 0; i < DITD_JOB_STATE_COUNT; i++)
        if (!strcmp(s, state_names[i])) {
            *out = (ditd_job_state)i;
            return 0;
        }
    return DITD_EINVAL;
}

const char *ditd_job_outcome_name(ditd_job_outcome o)
{
    return (unsigned)o < DITD_JOB_OUTCOME_COUNT ? outcome_names[o] : "?";
}

int ditd_job_outcome_from_str(const char *s, ditd_job_outcome *out)
{
    for (int i = 0; i < DITD_JOB_OUTCOME_COUNT; i++)
        if (!strcmp(s, outcome_names[i])) {
            *out = (ditd_job_outcome)i;
            return 0;
        }
    return DITD_EINVAL;
}

/* Which ids a client may give: printable ASCII without blanks or quotes,
 * short enough to log and echo. */
static int rid_ok(const char *r)
{
    size_t n = 0;
    for (; r[n]; n++) {
        unsigned char c = (unsigned char)r[n];
        if (c <= 0x20 || c >= 0x7f || c == '"' || c == '\\' || n >= 79)
            return 0;
    }
    return n > 0;
}

void ditd_job_make_rid(ditd_job_list *l, const char *given, char *out, size_t n)
{
    if (given && rid_ok(given))
        snprintf(out, n, "%s", given);
    else
        snprintf(out, n, "req-%llx-%llu", (unsigned long long)l->epoch & 0xffffff,
                 (unsigned long long)++l->next_rid);
}

ditd_job *ditd_job_new(ditd_job_list *l, ditd_srv *s, const ditd_job_sink *sink, const char *rid)
{
    ditd_job *j = calloc(1, sizeof *j);
    if (!j)
        return NULL;
    j->refs = 1;
    j->s = s;
    j->sink = sink;
    j->id = ++l->next_id;
    if (rid && *rid)
        snprintf(j->rid, sizeof j->rid, "%s", rid);
    else
        ditd_job_make_rid(l, NULL, j->rid, sizeof j->rid);
    j->t_arrive = ditd__now();
    j->ev_tail = &j->ev_head;
    j->all_next = l->head;
    if (l->head)
        l->head->all_prev = j;
    l->head = j;
    l->live++;
    j->list = l;
    return j;
}

void ditd_job_ref(ditd_job *j)
{
    assert(j->refs > 0);
    j->refs++;
}

void ditd_job_unref(ditd_job *j)
{
    assert(j->refs > 0);
    if (--j->refs > 0)
        return;
    ditd_job_list *l = j->list;
    /* an accepted job that nobody holds any more has had its outcome */
    assert(j->state == DITD_JOB_BODY || ditd_job_terminal(j));
    if (j->all_prev)
        j->all_prev->all_next = j->all_next;
    else
        l->head = j->all_next;
    if (j->all_next)
        j->all_next->all_prev = j->all_prev;
    l->live--;
    while (j->ev_head) {
        ditd_sse_ev *e = j->ev_head;
        j->ev_head = e->next;
        free(e->text);
        free(e);
    }
    if (j->resp)
        MHD_destroy_response(j->resp);
    free(j->out);
    free(j->pixels);
    ditd_genreq_free(&j->rq);
    free(j);
}

int ditd_job_accept(ditd_job *j, const ditd_genreq *rq, size_t numel)
{
    assert(j->state == DITD_JOB_BODY && !ditd_job_terminal(j));
    if (!(j->pixels = calloc((size_t)rq->n, numel)))
        return DITD_ENOMEM;
    j->rq = *rq;
    j->numel = numel;
    j->state = DITD_JOB_WAITING;
    return 0;
}

void ditd_job_refuse(ditd_job *j)
{
    assert(j->state == DITD_JOB_BODY || (j->state == DITD_JOB_WAITING && !ditd_job_terminal(j)));
    j->state = DITD_JOB_ANSWERED;
    if (!ditd_job_terminal(j))
        j->outcome = DITD_JOB_ERROR;
}

void ditd_job_answered(ditd_job *j)
{
    assert(ditd_job_terminal(j));
    j->state = DITD_JOB_ANSWERED;
}

int ditd_job_fail(ditd_job *j, const ditd_api_error *e)
{
    if (ditd_job_terminal(j))
        return 0;
    j->outcome = DITD_JOB_ERROR;
    if (j->state == DITD_JOB_WAITING)
        j->sink->failed(j, e);
    return 1;
}

void ditd_job_fail_encode(ditd_job *j, const ditd_api_error *e)
{
    assert(j->outcome == DITD_JOB_RESULT && j->state == DITD_JOB_WAITING);
    j->outcome = DITD_JOB_ERROR;
    j->sink->failed(j, e);
}

int ditd_job_cancel(ditd_job *j)
{
    int was = ditd_job_terminal(j);
    if (!was)
        j->outcome = DITD_JOB_CANCELED;
    j->state = DITD_JOB_ANSWERED;
    return !was;
}

void ditd_job_sample_back(ditd_job *j, int index, const uint8_t *pixels, int channels)
{
    assert(index >= 0 && index < j->rq.n && j->finished < j->rq.n);
    j->finished++;
    if (ditd_job_terminal(j))
        return;
    if (!pixels)
        return; /* dropped: the scheduler fails the job */
    j->channels = channels;
    memcpy(j->pixels + (size_t)index * j->numel, pixels, j->numel);
    if (j->finished == j->rq.n) {
        j->outcome = DITD_JOB_RESULT;
        j->sink->complete(j);
    }
}

void ditd_job_progress(ditd_job *j, int step, int total)
{
    if (!ditd_job_terminal(j) && (j->rq.stream || j->background) && j->state == DITD_JOB_WAITING)
        j->sink->progress(j, step, total);
}

void ditd_job_partial(ditd_job *j, int image, int partial_index, const uint8_t *pixels)
{
    if (!ditd_job_terminal(j) && j->rq.stream && j->state == DITD_JOB_WAITING)
        j->sink->partial(j, image, partial_index, pixels);
}
