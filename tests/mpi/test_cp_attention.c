/* Context-parallel attention (engine/parallel/cp_attention.h) under mpirun,
 * on random Q/K/V, with and without an unsplit prefix:
 *   - every rank's output rows (its split tokens, and the whole prefix)
 *     against a float64 softmax attention over [prefix; all tokens]
 *     computed here, relative error max|a-b|/max|b| <= 1e-5;
 *   - the same for the module on one rank (no mesh);
 *   - the prefix output has the same bits on every rank of the group;
 *   - a layout with more ulysses ranks than heads is refused (EINVAL).
 * Sizes are uneven on purpose (tokens and heads that do not divide).
 *
 *   mpirun -np G test_cp_attention --cfg C --ring R --ulysses U --tp T [--rotate p2p]
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/backend/backend.h"
#include "engine/core/philox.h"
#include "engine/parallel/comm.h"
#include "engine/parallel/cp_attention.h"
#include "engine/parallel/mesh.h"
#include "tests/mpi/mpi_args.h"
#include "tests/test_util.h"

#define TOL 1e-5

typedef struct acase {
    int B, N, L, H, Dh;
} acase;

static const acase cases[] = {
    {2, 13, 5, 6, 8}, /* uneven tokens and heads, a text-like prefix */
    {1, 16, 0, 4, 16}, /* no prefix: the DiT's case */
    {3, 7, 1, 5, 4},  /* one prefix token, five heads */
    {2, 9, 12, 4, 8}, /* a prefix longer than the split part */
};

static int rank_world;

/* ref (B, T, H Dh) = softmax(q k^T / sqrt(Dh)) v over T tokens, in float64. */
static void attention_ref(const float *q, const float *k, const float *v, float *out, int B, int T,
                          int H, int Dh)
{
    size_t HD = (size_t)H * (size_t)Dh;
    double *s = malloc((size_t)T * sizeof *s);
    double scale = 1.0 / sqrt((double)Dh);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int i = 0; i < T; i++) {
                const float *qi = q + ((size_t)b * T + i) * HD + (size_t)h * Dh;
                double mx = -INFINITY, sum = 0;
                for (int j = 0; j < T; j++) {
                    const float *kj = k + ((size_t)b * T + j) * HD + (size_t)h * Dh;
                    double d = 0;
                    for (int e = 0; e < Dh; e++)
                        d += (double)qi[e] * kj[e];
                    s[j] = d * scale;
                    mx = s[j] > mx ? s[j] : mx;
                }
                for (int j = 0; j < T; j++)
                    sum += (s[j] = exp(s[j] - mx));
                for (int e = 0; e < Dh; e++) {
                    double acc = 0;
                    for (int j = 0; j < T; j++)
                        acc += s[j] * v[((size_t)b * T + j) * HD + (size_t)h * Dh + e];
                    out[((size_t)b * T + i) * HD + (size_t)h * Dh + e] = (float)(acc / sum);
                }
            }
    free(s);
}

/* Runs one case through `a` with this rank's rows; checks against ref. */
static void run_case(ditd_cp_attention *a, const acase *c, const float *fq, const float *fk,
                     const float *fv, const float *ref, const char *what, float *po_out)
{
    int B = c->B, N = c->N, L = c->L, T = L + N;
    size_t HD = (size_t)c->H * (size_t)c->Dh, ld = 3 * HD, ldo = HD + 3;
    size_t nl = (size_t)a->n_loc;
    /* fused (B, n_loc, 3 H Dh) like a model's qkv projection; the prefix alike */
    float *qkv = calloc((size_t)B * nl * ld, sizeof(float));
    float *pqkv = calloc((size_t)B * (size_t)(L ? L : 1) * ld, sizeof(float));
    float *o = calloc((size_t)B * nl * ldo, sizeof(float));
    float *po = calloc((size_t)B * (size_t)(L ? L : 1) * HD, sizeof(float));
    float *got = calloc((size_t)B * nl * HD, sizeof(float));
    float *want = calloc((size_t)B * nl * HD, sizeof(float));
    const float *full[3] = {fq, fk, fv};
    for (int b = 0; b < B; b++) {
        for (size_t i = 0; i < nl; i++)
            for (int j = 0; j < 3; j++)
                memcpy(qkv + ((size_t)b * nl + i) * ld + (size_t)j * HD,
                       full[j] + ((size_t)b * T + (size_t)L + (size_t)a->tok0 + i) * HD,
                       HD * sizeof(float));
        for (int i = 0; i < L; i++)
            for (int j = 0; j < 3; j++)
                memcpy(pqkv + ((size_t)b * L + (size_t)i) * ld + (size_t)j * HD,
                       full[j] + ((size_t)b * T + (size_t)i) * HD, HD * sizeof(float));
    }
    TU_OK(ditd_cp_attention_run(a, B, qkv, qkv + HD, qkv + 2 * HD, ld, o, ldo, L ? pqkv : NULL,
                                L ? pqkv + HD : NULL, L ? pqkv + 2 * HD : NULL, ld, L ? po : NULL,
                                HD));
    for (int b = 0; b < B; b++)
        for (size_t i = 0; i < nl; i++) {
            memcpy(got + ((size_t)b * nl + i) * HD, o + ((size_t)b * nl + i) * ldo, HD * sizeof(float));
            memcpy(want + ((size_t)b * nl + i) * HD,
                   ref + ((size_t)b * T + (size_t)L + (size_t)a->tok0 + i) * HD, HD * sizeof(float));
        }
    char w[256];
    snprintf(w, sizeof w, "%s B=%d N=%d L=%d H=%d Dh=%d rank %d split tokens [%d, %d)", what, B, N,
             L, c->H, c->Dh, rank_world, a->tok0, a->tok0 + a->n_loc);
    TU_CLOSE(w, got, want, (size_t)B * nl * HD, TOL);
    if (L) {
        float *pw = calloc((size_t)B * (size_t)L * HD, sizeof(float));
        for (int b = 0; b < B; b++)
            memcpy(pw + (size_t)b * L * HD, ref + (size_t)b * T * HD, (size_t)L * HD * sizeof(float));
        snprintf(w, sizeof w, "%s B=%d N=%d L=%d H=%d rank %d prefix", what, B, N, L, c->H,
                 rank_world);
        TU_CLOSE(w, po, pw, (size_t)B * (size_t)L * HD, TOL);
        if (po_out)
            memcpy(po_out, po, (size_t)B * (size_t)L * HD * sizeof(float));
        free(pw);
    }
    free(qkv);
    free(pqkv);
    free(o);
    free(po);
    free(got);
    free(want);
}

int main(int argc, char **argv)
{
    ditd_layout l = DITD_LAYOUT_SINGLE;
    ditd_comm *world = NULL;
    ditd_mesh *mesh = NULL;
    int checked = 0;

    if (ditd_comm_mpi_init(&argc, &argv) || ditd_comm_mpi_world(&world)) {
        fprintf(stderr, "MPI: %s\n", ditd_err_detail());
        return 1;
    }
    rank_world = ditd_comm_rank(world);
    int arg_rc = tm_parse_layout(argc, argv, &l, NULL, NULL);
    if (arg_rc)
        return arg_rc;
    ditd_backend_cpu.set_threads(1);
    /* one seed for every rank: the leader's, broadcast */
    uint64_t seed = 0;
    if (rank_world == 0) {
        const char *env = getenv("DITD_TEST_SEED");
        seed = env ? strtoull(env, NULL, 10) : (uint64_t)time(NULL);
        printf("seed %llu (DITD_TEST_SEED replays)\n", (unsigned long long)seed);
    }
    TU_OK(ditd_comm_bcast(world, &seed, sizeof seed, 0));
    TU_OK(ditd_mesh_new(world, &l, &mesh));
    if (!mesh)
        goto out;

    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const acase *c = &cases[ci];
        int T = c->L + c->N;
        size_t n = (size_t)c->B * (size_t)T * (size_t)c->H * (size_t)c->Dh;
        float *fq = malloc(n * sizeof(float)), *fk = malloc(n * sizeof(float));
        float *fv = malloc(n * sizeof(float)), *ref = malloc(n * sizeof(float));
        size_t pn = (size_t)c->B * (size_t)c->L * (size_t)c->H * (size_t)c->Dh;
        float *po = calloc(pn ? pn : 1, sizeof(float)), *po0 = calloc(pn ? pn : 1, sizeof(float));
        ditd_philox_normal(seed, 3 * ci, 0, n, fq);
        ditd_philox_normal(seed, 3 * ci + 1, 0, n, fk);
        ditd_philox_normal(seed, 3 * ci + 2, 0, n, fv);
        for (size_t i = 0; i < n; i++) /* peaked but not one-hot softmaxes */
            fq[i] *= 1.5f;
        attention_ref(fq, fk, fv, ref, c->B, T, c->H, c->Dh);

        ditd_cp_attention *one = NULL, *par = NULL;
        TU_OK(ditd_cp_attention_new(&ditd_backend_cpu, NULL, c->B, c->N, c->L, c->H, c->Dh, &one));
        if (one) {
            run_case(one, c, fq, fk, fv, ref, "one rank", NULL);
            checked++;
        }
        TU_OK(ditd_cp_attention_new(&ditd_backend_cpu, mesh, c->B, c->N, c->L, c->H, c->Dh, &par));
        if (par) {
            run_case(par, c, fq, fk, fv, ref, "mesh", po);
            checked++;
            if (pn) { /* the same bits on every rank (the leader's, broadcast) */
                memcpy(po0, po, pn * sizeof(float));
                TU_OK(ditd_comm_bcast(mesh->group, po0, pn * sizeof(float), 0));
                TU_CHECK(memcmp(po0, po, pn * sizeof(float)) == 0,
                         "case %zu: prefix output differs from the leader's on rank %d", ci,
                         rank_world);
            }
        }
        ditd_cp_attention_free(one);
        ditd_cp_attention_free(par);
        free(fq);
        free(fk);
        free(fv);
        free(ref);
        free(po);
        free(po0);
    }
    TU_CHECK(checked == 2 * (int)(sizeof cases / sizeof cases[0]), "ran %d of %d case runs", checked,
             2 * (int)(sizeof cases / sizeof cases[0]));
    if (mesh->layout.ulysses > 1) { /* fewer heads than ulysses ranks: refused, not hung */
        ditd_cp_attention *bad = NULL;
        int err = ditd_cp_attention_new(&ditd_backend_cpu, mesh, 1, 8, 2, mesh->layout.ulysses - 1,
                                        8, &bad);
        TU_CHECK(err == DITD_EINVAL && strstr(ditd_err_detail(), "ulysses"),
                 "ulysses %d over %d heads: %s: %s", mesh->layout.ulysses, mesh->layout.ulysses - 1,
                 ditd_err_name(err), ditd_err_detail());
        ditd_cp_attention_free(bad);
    }
    ditd_mesh_free(mesh);
out:;
    float f = (float)tu_failures;
    ditd_comm_allreduce_sum(world, DITD_DTYPE_F32, &f, 1);
    int all = (int)f;
    if (rank_world == 0)
        printf("%d checks on rank 0; %d failed over all ranks\n", tu_checks, all);
    ditd_comm_free(world);
    ditd_comm_mpi_finalize();
    return all ? 1 : 0;
}
