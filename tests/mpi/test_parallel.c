/* Parallel invariance under mpirun: one layout per launch, every fixture
 * model it can run, a batch of three samples with mixed guidance, a full
 * sampling; every rank's latents against the single-rank pipeline's
 * (computed on each rank), relative error max|a-b|/max|b| <= 1e-4.
 * Also: a sample dropped by the leader's callback mid-way and a stop, which
 * every rank must follow (same collectives, same result), and the
 * single-rank path through a mesh of one.
 *
 *   mpirun -np G test_parallel --cfg C --ring R --ulysses U --tp T [--rotate p2p]
 *   mpirun -np G test_parallel --refusals
 * The second checks that impossible layouts are refused, with their
 * message, by every rank alike (the harness's timeout catches a hang), and
 * that the group still works afterwards. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/backend/backend.h"
#include "engine/parallel/comm.h"
#include "engine/parallel/mesh.h"
#include "engine/models/model.h"
#include "engine/pipeline/pipeline.h"
#include "tests/mpi/mpi_args.h"
#include "tests/test_util.h"

#define STEPS 5
#define TOL 1e-4

static const char *const models[] = {"tiny-p4-c1-h3", "tiny-p2-c1-h6", "tiny-p2-c4-sigma",
                                     "tiny-sharded-bf16"};
static const ditd_sampler_kind kinds[] = {DITD_SAMPLER_DDIM, DITD_SAMPLER_DPMPP_2M,
                                          DITD_SAMPLER_FLOW_EULER, DITD_SAMPLER_DPMPP_2M};

typedef struct drop {
    int at_step, which, stop_at;
} drop;

static int on_step(void *ud, int step, int total, const float *x0, uint8_t *active)
{
    drop *d = ud;
    (void)total;
    (void)x0;
    if (step == d->at_step && active)
        active[d->which] = 0;
    return step == d->stop_at;
}

static int rank_world;

static void say(const char *fmt, const char *a, const char *b)
{
    if (rank_world == 0)
        printf(fmt, a, b);
}

static void run_model(ditd_mesh *mesh, const char *model, ditd_sampler_kind kind)
{
    char dir[4096], what[512], lay[128];
    ditd_model_info info;
    ditd_pipeline *ref = NULL, *par = NULL;
    const ditd_layout *l = &mesh->layout;
    int leader = ditd_mesh_is_leader(mesh);

    snprintf(lay, sizeof lay, "cfg %d x ring %d (%s) x ulysses %d x tp %d", l->cfg, l->ring,
             ditd_ring_rotate_name(l->rotate), l->ulysses, l->tp);
    snprintf(dir, sizeof dir, "%s/models/%s", tu_fixtures(), model);
    TU_OK(ditd_model_info_load(dir, &info));
    if (ditd_layout_check_attention(l, info.shapes.heads, info.shapes.tokens)) {
        snprintf(what, sizeof what, "%s", ditd_err_detail());
        say("skip %s: %s\n", model, what);
        ditd_model_info_free(&info);
        return;
    }
    TU_OK(ditd_pipeline_new(&info, &ditd_backend_cpu, 3, &ref));
    TU_OK(ditd_pipeline_new_group(&info, &ditd_backend_cpu, 3, mesh, &par));
    if (!ref || !par)
        goto done;

    size_t numel = ref->numel;
    ditd_gen_params gp = {.steps = STEPS, .sampler = kind};
    ditd_gen_sample s[3] = {
        {.seed = 21, .index = 0, .cond.class_id = 1, .guidance = 4.0f},
        {.seed = 22, .index = 0, .cond.class_id = 2, .guidance = 1.0f},
        {.seed = 21, .index = 1, .cond.class_id = 3, .guidance = 2.5f},
    };
    float *want = calloc(3 * numel, sizeof(float)), *got = calloc(3 * numel, sizeof(float));

    /* the whole batch */
    TU_OK(ditd_pipeline_generate(ref, &gp, 3, s, NULL, want, NULL, NULL, NULL));
    TU_OK(ditd_pipeline_generate(par, &gp, 3, s, NULL, got, NULL, NULL, NULL));
    snprintf(what, sizeof what, "rank %d %s: %s %s, 3 samples", mesh->rank, lay, model,
             ditd_sampler_kind_name(kind));
    TU_CLOSE(what, got, want, 3 * numel, TOL);
    /* and the parallel plans really ran: each axis of degree > 1 moved bytes */
    const int deg[] = {l->cfg, l->ring, l->ulysses, l->tp};
    const ditd_mesh_axis ax[] = {DITD_AXIS_CFG, DITD_AXIS_RING, DITD_AXIS_ULYSSES, DITD_AXIS_TP};
    for (int a = 0; a < 4; a++) {
        uint64_t bytes = 0;
        const ditd_comm_stat *st = ditd_comm_stats(ditd_mesh_comm(mesh, ax[a]));
        for (int k = 0; k < DITD_COLL_COUNT; k++)
            bytes += st[k].bytes;
        TU_CHECK(deg[a] == 1 || bytes > 0, "rank %d: axis %s of degree %d moved no bytes",
                 mesh->rank, ditd_mesh_axis_name(ax[a]), deg[a]);
    }

    /* the leader drops sample 1 after step 2; the others follow */
    uint8_t act_ref[3] = {1, 1, 1}, act_par[3] = {1, 1, 1};
    drop d = {.at_step = 2, .which = 1, .stop_at = -1};
    TU_OK(ditd_pipeline_generate(ref, &gp, 3, s, NULL, want, act_ref, on_step, &d));
    TU_OK(ditd_pipeline_generate(par, &gp, 3, s, NULL, got, act_par, leader ? on_step : NULL,
                                 leader ? &d : NULL));
    TU_CHECK(act_par[1] == 0, "rank %d: the leader's drop reaches every rank", mesh->rank);
    snprintf(what, sizeof what, "rank %d %s: %s sample 0 with sample 1 dropped", mesh->rank, lay,
             model);
    TU_CLOSE(what, got, want, numel, TOL);
    snprintf(what, sizeof what, "rank %d %s: %s sample 2 with sample 1 dropped", mesh->rank, lay,
             model);
    TU_CLOSE(what, got + 2 * numel, want + 2 * numel, numel, TOL);

    /* the leader stops the batch after step 3: every rank returns ECANCELED */
    drop st = {.at_step = -1, .which = 0, .stop_at = 3};
    int err = ditd_pipeline_generate(par, &gp, 3, s, NULL, got, NULL, leader ? on_step : NULL,
                                     leader ? &st : NULL);
    TU_CHECK(err == DITD_ECANCELED, "rank %d: stop gives %s", mesh->rank, ditd_err_name(err));

    free(want);
    free(got);
done:
    ditd_pipeline_free(ref);
    ditd_pipeline_free(par);
    ditd_model_info_free(&info);
}

typedef struct refusal {
    ditd_layout layout;
    const char *model;   /* NULL: refused by the mesh alone */
    const char *expect;  /* in the detail */
} refusal;

static void refusals(ditd_comm *world)
{
    int G = ditd_comm_size(world);
    char dir[4096];
    /* for a group of 4 */
    const refusal cases[] = {
        {{1, 1, 2, 1, DITD_RING_ALLGATHER, 1}, NULL, "= 2 ranks, the group has 4"},
        {{1, 2, 3, 1, DITD_RING_P2P, 1}, NULL, "= 6 ranks, the group has 4"},
        {{4, 1, 1, 1, DITD_RING_ALLGATHER, 1}, NULL, "cfg degree 4"},
        {{1, 0, 4, 1, DITD_RING_ALLGATHER, 1}, NULL, "ring 0"},
        {{1, 1, 1, 4, DITD_RING_ALLGATHER, 1}, "tiny-p4-c1-h3", "tp degree 4 > 3 attention heads"},
        {{1, 1, 4, 1, DITD_RING_ALLGATHER, 1}, "tiny-p4-c1-h3", "ulysses degree 4 > 3 local heads"},
        {{1, 1, 2, 2, DITD_RING_ALLGATHER, 1}, "tiny-p4-c1-h3",
         "ulysses degree 2 > 1 local heads (3 heads / tp 2)"},
    };
    if (G != 4) {
        fprintf(stderr, "--refusals runs on 4 ranks, not %d\n", G);
        tu_failures++;
        return;
    }
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const refusal *c = &cases[i];
        ditd_mesh *mesh = NULL;
        int err = ditd_mesh_new(world, &c->layout, &mesh);
        if (!err && c->model) {
            ditd_model_info info;
            ditd_pipeline *p = NULL;
            snprintf(dir, sizeof dir, "%s/models/%s", tu_fixtures(), c->model);
            TU_OK(ditd_model_info_load(dir, &info));
            err = ditd_pipeline_new_group(&info, &ditd_backend_cpu, 2, mesh, &p);
            ditd_pipeline_free(p);
            ditd_model_info_free(&info);
        }
        ditd_mesh_free(mesh);
        const char *detail = ditd_err_detail();
        int ok = err == DITD_EINVAL && strstr(detail, c->expect);
        if (rank_world == 0 || !ok)
            printf("%s rank %d refused: %s: %s\n", ok ? "ok  " : "FAIL", ditd_comm_rank(world),
                   ditd_err_name(err), detail);
        TU_CHECK(ok, "expected EINVAL with \"%s\"", c->expect);
    }
    /* the group still runs a layout afterwards */
    ditd_layout good = {1, 2, 2, 1, DITD_RING_P2P, 1};
    ditd_mesh *mesh = NULL;
    TU_OK(ditd_mesh_new(world, &good, &mesh));
    if (mesh)
        run_model(mesh, "tiny-p2-c4-sigma", DITD_SAMPLER_DDIM);
    ditd_mesh_free(mesh);
}

int main(int argc, char **argv)
{
    ditd_layout l = DITD_LAYOUT_SINGLE;
    int do_refusals = 0;
    ditd_comm *world = NULL;
    ditd_mesh *mesh = NULL;

    if (ditd_comm_mpi_init(&argc, &argv) || ditd_comm_mpi_world(&world)) {
        fprintf(stderr, "MPI: %s\n", ditd_err_detail());
        return 1;
    }
    rank_world = ditd_comm_rank(world);
    int arg_rc = tm_parse_layout(argc, argv, &l, "--refusals", &do_refusals);
    if (arg_rc)
        return arg_rc;
    ditd_backend_cpu.set_threads(1);
    if (do_refusals) {
        refusals(world);
    } else {
        TU_OK(ditd_mesh_new(world, &l, &mesh));
        if (mesh) {
            for (size_t i = 0; i < sizeof models / sizeof models[0]; i++)
                run_model(mesh, models[i], kinds[i]);
            ditd_mesh_free(mesh);
        }
    }
    /* every rank's verdict, so the launch fails if any rank failed */
    int mine = tu_failures, all = 0;
    ditd_comm *w = world;
    float f = (float)mine;
    ditd_comm_allreduce_sum(w, DITD_DTYPE_F32, &f, 1);
    all = (int)f;
    ditd_comm_free(world);
    ditd_comm_mpi_finalize();
    if (rank_world == 0)
        printf("%d check(s) failed over all ranks\n", all);
    return all ? 1 : 0;
}
