/* A text model's replica under mpirun: the worker loop of every rank of one
 * group (the world), the text encoders on --text-rank R, fed by a test
 * transport on the leader with two batches: two prompts at 64x48 (one with
 * a negative prompt and true_cfg 2; guidance 3.5, which a pipeline that
 * guides on guidance_scale (SD3) runs as CFG over both negatives, with
 * skip-layer guidance on block 1 where the pipeline row has it), then the
 * first prompt again at 32x32 (a re-plan, and a cache hit). Each result equals, within one 8-bit level,
 * what one rank alone (no mesh, encoders on itself) makes of the same
 * batches, run first on world rank 0; the last heartbeat of the group run
 * counts the cache hit.
 *   mpirun -np G test_worker_text --model DIR [--text-rank R] [layout flags] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/backend/backend.h"
#include "engine/core/error.h"
#include "engine/models/model.h"
#include "engine/parallel/comm.h"
#include "engine/worker/worker.h"
#include "proto/ditd.pb-c.h"
#include "tests/mpi/mpi_args.h"
#include "tests/test_util.h"

#define BATCHES 2
#define MAX_IMAGES 4

/* one batch's images as the leader got them */
typedef struct got {
    int n, w, h, c;
    uint8_t *px[MAX_IMAGES];
    size_t len[MAX_IMAGES];
} got;

typedef struct tt {
    ditd_transport t;
    uint8_t *batch[BATCHES];
    size_t batch_len[BATCHES];
    int next, waiting, shutdown_sent, errors;
    got res[BATCHES];
    uint64_t hits, misses;   /* the last heartbeat's */
} tt;

static int tt_send(ditd_transport *t, const uint8_t *buf, size_t len)
{
    tt *x = (tt *)t;
    Ditd__Envelope *env = ditd__envelope__unpack(NULL, len, buf);
    if (!env)
        return DITD_ECOMM;
    if (env->msg_case == DITD__ENVELOPE__MSG_RESULT && x->waiting) {
        got *g = &x->res[x->next - 1];
        const Ditd__Result *r = env->result;
        g->n = (int)r->n_images;
        g->w = (int)r->width;
        g->h = (int)r->height;
        g->c = (int)r->channels;
        for (size_t i = 0; i < r->n_images && i < MAX_IMAGES; i++) {
            g->len[i] = r->images[i]->pixels.len;
            g->px[i] = malloc(g->len[i] ? g->len[i] : 1);
            memcpy(g->px[i], r->images[i]->pixels.data, g->len[i]);
        }
        x->waiting = 0;
    } else if (env->msg_case == DITD__ENVELOPE__MSG_ERROR) {
        fprintf(stderr, "worker error (batch %llu): %s\n",
                (unsigned long long)env->error->batch_id, env->error->message);
        x->errors++;
        x->waiting = 0;
    } else if (env->msg_case == DITD__ENVELOPE__MSG_HEARTBEAT) {
        x->hits = env->heartbeat->text_cache_hits;
        x->misses = env->heartbeat->text_cache_misses;
    }
    ditd__envelope__free_unpacked(env, NULL);
    return 0;
}

static int tt_recv(ditd_transport *t, uint8_t **buf, size_t *len, int timeout_ms)
{
    tt *x = (tt *)t;
    if (!x->waiting && x->next < BATCHES) {
        *len = x->batch_len[x->next];
        *buf = malloc(*len);
        memcpy(*buf, x->batch[x->next], *len);
        x->next++;
        x->waiting = 1;
        return 0;
    }
    if (!x->waiting && !x->shutdown_sent) {
        Ditd__Envelope env = DITD__ENVELOPE__INIT;
        Ditd__Shutdown sd = DITD__SHUTDOWN__INIT;
        env.msg_case = DITD__ENVELOPE__MSG_SHUTDOWN;
        env.shutdown = &sd;
        *len = ditd__envelope__get_packed_size(&env);
        *buf = malloc(*len);
        ditd__envelope__pack(&env, *buf);
        x->shutdown_sent = 1;
        return 0;
    }
    if (timeout_ms > 0)
        usleep(1000);
    return DITD_ETIMEDOUT;
}

static const char *prompts[] = {"a red fox in the snow, watercolour", "ein Fuchs 🦊 im Schnee"};

/* Batch k as the front-end would send it. */
static void make_batch(tt *x, int k, const ditd_model_info *info)
{
    Ditd__Envelope env = DITD__ENVELOPE__INIT;
    Ditd__Batch b = DITD__BATCH__INIT;
    Ditd__Sample s[2], *sp[2];
    int n = k == 0 ? 2 : 1;
    for (int i = 0; i < n; i++) {
        ditd__sample__init(&s[i]);
        s[i].seed = 42;
        s[i].index = (uint64_t)i;
        s[i].prompt = (char *)prompts[i];
        s[i].guidance = 3.5f;
        s[i].true_cfg = i == 1 ? 2.0f : 1.0f;
        s[i].negative_prompt = i == 1 ? "blurry" : "";
        s[i].has_negative = i == 1; /* FluxPipeline: a negative prompt given */
        sp[i] = &s[i];
    }
    b.batch_id = (uint64_t)k + 1;
    b.model = (char *)info->name;
    b.width = (uint32_t)(k == 0 ? 4 : 2) * (uint32_t)info->size_multiple;
    b.height = (uint32_t)(k == 0 ? 3 : 2) * (uint32_t)info->size_multiple;
    b.steps = 2;
    b.sampler = 0;
    b.max_sequence_length = 32;
    uint32_t skip[1] = {1};
    if (k == 0 && (info->pipeline->request & DITD_REQ_SKIP_LAYERS)) {
        /* skip-layer guidance on block 1 at every step but the first
         * (StableDiffusion3Pipeline: steps * start < i < steps * stop) */
        b.n_skip_layers = 1;
        b.skip_layers = skip;
        b.slg_scale = 2.8f;
        b.slg_start = 0.0f;
        b.slg_stop = 1.0f;
    }
    b.n_samples = (size_t)n;
    b.samples = sp;
    env.msg_case = DITD__ENVELOPE__MSG_BATCH;
    env.batch = &b;
    x->batch_len[k] = ditd__envelope__get_packed_size(&env);
    x->batch[k] = malloc(x->batch_len[k]);
    ditd__envelope__pack(&env, x->batch[k]);
}

static void tt_init(tt *x, const ditd_model_info *info)
{
    memset(x, 0, sizeof *x);
    x->t.send = tt_send;
    x->t.recv = tt_recv;
    for (int k = 0; k < BATCHES; k++)
        make_batch(x, k, info);
}

static void tt_free(tt *x)
{
    for (int k = 0; k < BATCHES; k++) {
        free(x->batch[k]);
        for (int i = 0; i < MAX_IMAGES; i++)
            free(x->res[k].px[i]);
    }
}

int main(int argc, char **argv)
{
    ditd_layout l = DITD_LAYOUT_SINGLE;
    ditd_comm *world = NULL;
    ditd_mesh *mesh = NULL;
    const char *model = NULL;
    int text_rank = 0, rank, checked = 0;
    char *rest[64];
    int nrest = 0;

    if (ditd_comm_mpi_init(&argc, &argv) || ditd_comm_mpi_world(&world)) {
        fprintf(stderr, "MPI: %s\n", ditd_err_detail());
        return 1;
    }
    for (int i = 0; i < argc && nrest < 63; i++) {
        if (strcmp(argv[i], "--model") == 0 && i + 1 < argc)
            model = argv[++i];
        else if (strcmp(argv[i], "--text-rank") == 0 && i + 1 < argc)
            text_rank = atoi(argv[++i]);
        else
            rest[nrest++] = argv[i];
    }
    int arg_rc = model ? tm_parse_layout(nrest, rest, &l, NULL, NULL) : 2;
    if (arg_rc) {
        fprintf(stderr, "usage: test_worker_text --model DIR [--text-rank R] [layout flags]\n");
        return arg_rc;
    }
    rank = ditd_comm_rank(world);
    ditd_model_info info;
    TU_OK(ditd_model_info_load(model, &info));
    TU_CHECK(info.shapes.cond.kind == DITD_COND_TEXT && info.resizable,
             "%s is a text model that takes any size", model);

    /* one rank alone: the reference */
    tt ref, grp;
    tt_init(&ref, &info);
    tt_init(&grp, &info);
    if (rank == 0) {
        ditd_worker_config wc = {.model_dir = model, .max_batch = 2, .threads = 1,
                                 .heartbeat_ms = 60000, .text_cache_entries = 8,
                                 .text_cache_mb = 64};
        TU_OK(ditd_worker_run(&wc, &ref.t));
        TU_CHECK(ref.errors == 0 && ref.next == BATCHES, "one rank: %d batches, %d errors",
                 ref.next, ref.errors);
    }
    float f = 0;
    ditd_comm_allreduce_sum(world, DITD_DTYPE_F32, &f, 1); /* wait for rank 0 */

    /* the group */
    TU_OK(ditd_mesh_new(world, &l, &mesh));
    if (mesh) {
        ditd_worker_config wc = {.model_dir = model, .mesh = mesh, .max_batch = 2, .threads = 1,
                                 .heartbeat_ms = 60000, .text_encoder_rank = text_rank,
                                 .text_cache_entries = 8, .text_cache_mb = 64};
        TU_OK(ditd_worker_run(&wc, ditd_mesh_is_leader(mesh) ? &grp.t : NULL));
        if (ditd_mesh_is_leader(mesh)) {
            TU_CHECK(grp.errors == 0 && grp.next == BATCHES, "group: %d batches, %d errors",
                     grp.next, grp.errors);
            for (int k = 0; k < BATCHES; k++) {
                got *a = &grp.res[k], *b = &ref.res[k];
                TU_CHECK(a->n == b->n && a->w == b->w && a->h == b->h && a->c == b->c && a->n > 0,
                         "batch %d: %d images %dx%dx%d, one rank %d %dx%dx%d", k, a->n, a->w, a->h,
                         a->c, b->n, b->w, b->h, b->c);
                for (int i = 0; i < a->n && i < b->n; i++) {
                    int worst = 0;
                    for (size_t j = 0; j < a->len[i] && a->len[i] == b->len[i]; j++) {
                        int d = abs((int)a->px[i][j] - (int)b->px[i][j]);
                        worst = d > worst ? d : worst;
                    }
                    TU_CHECK(a->len[i] == b->len[i] && a->len[i] > 0 && worst <= 1,
                             "batch %d image %d: %zu bytes, worst difference %d levels", k, i,
                             a->len[i], worst);
                    checked++;
                }
            }
            /* batch 2 repeats batch 1's first prompt at the same length */
            TU_CHECK(grp.hits >= 1 && grp.misses >= 3, "cache: %llu hits, %llu misses",
                     (unsigned long long)grp.hits, (unsigned long long)grp.misses);
            TU_CHECK(checked >= 3, "images compared: %d (at least 3)", checked);
            printf("group of %d, text rank %d: %d images equal to one rank's; cache %llu hits, "
                   "%llu misses\n", mesh->size, text_rank, checked, (unsigned long long)grp.hits,
                   (unsigned long long)grp.misses);
        }
        ditd_mesh_free(mesh);
    }
    tt_free(&ref);
    tt_free(&grp);
    ditd_model_info_free(&info);
    f = (float)tu_failures;
    ditd_comm_allreduce_sum(world, DITD_DTYPE_F32, &f, 1);
    int all = (int)f;
    if (rank == 0)
        printf("%d checks on rank 0; %d failed over all ranks\n", tu_checks, all);
    ditd_comm_free(world);
    ditd_comm_mpi_finalize();
    return all ? 1 : 0;
}
