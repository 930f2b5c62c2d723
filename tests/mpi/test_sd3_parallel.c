/* The SD3 / SD3.5 transformer under mpirun: context parallel over the joint
 * text + image sequence (text and image tokens both split over the cp
 * ranks, unevenly, as FLUX's plan), attn2 of the MMDiT-X blocks over the
 * image tokens alone, tensor parallel, for every fixture model and case of
 * tests/fixtures/sd3 (skip-layer guidance cases included):
 *   - each cp rank holds only its share of the text and of the image:
 *     ditd_split(L, R*U, s) and ditd_split(N, R*U, s) for cp rank s (the
 *     whole text when R*U = 1), and under cp some case has a text length
 *     the cp degree does not divide;
 *   - the same forward at a text length of 1 (the case's first text token),
 *     so that every cp rank but the first holds no text token;
 *   - the mesh's output equal to one rank's (no mesh) within 1e-4 relative
 *     (max|a-b|/max|b|), and to Diffusers' float64 output within 1e-4;
 *   - every rank of the group gets the same bits (the leader's);
 *   - the mesh's model is loaded at another size and re-planned with
 *     ditd_sd3_set_size;
 *   - at least 10 cases checked.
 * A layout SD3 cannot run is refused on every rank alike at load (--refusals:
 * more ulysses ranks than a tp rank's heads, EINVAL).
 * With DITD_TEST_SD3_GGUF=1: the Q8_0 SD3.5 in its original names
 * (tests/fixtures/sd3wan_gguf/sd35-q8_0) instead, its linears kept in their
 * blocks on both sides (under tp every rank's Q8_0 slice), at least 2 cases.
 *
 *   mpirun -np G test_sd3_parallel --ring R --ulysses U --tp T [--rotate p2p]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/backend/backend.h"
#include "engine/models/sd3/sd3.h"
#include "engine/parallel/comm.h"
#include "engine/parallel/mesh.h"
#include "tests/mpi/mpi_args.h"
#include "tests/sd3_case.h"

#define TOL 1e-4
#define MIN_CASES 10

static int rank_world;
static int gguf_run; /* DITD_TEST_SD3_GGUF=1 */
static int uneven_text; /* cases whose text length the cp degree does not divide */

/* This rank's text and image shares, against ditd_split of L and N. */
static void check_shares(const ditd_sd3 *par, const ditd_mesh *mesh, const char *what)
{
    const ditd_layout *l = &mesh->layout;
    int RU = l->ring * l->ulysses, s = mesh->ring_rank * l->ulysses + mesh->ulysses_rank;
    int toff, tcnt, ioff, icnt;
    ditd_split(par->L, RU, s, &toff, &tcnt);
    ditd_split(par->N, RU, s, &ioff, &icnt);
    TU_CHECK(par->l_loc == tcnt && par->txt0 == toff,
             "%s: cp rank %d of %d holds text tokens [%d, +%d), its share of %d is [%d, +%d)", what,
             s, RU, par->txt0, par->l_loc, par->L, toff, tcnt);
    TU_CHECK(par->n_loc == icnt && par->tok0 == ioff,
             "%s: cp rank %d of %d holds image tokens [%d, +%d), its share of %d is [%d, +%d)",
             what, s, RU, par->tok0, par->n_loc, par->N, ioff, icnt);
}

/* The case at text length 1 (each sample's first text token): the mesh's
 * model (re-planned) against one rank's; every cp rank but 0 holds no text. */
static void check_one_text_token(const ditd_sd3_config *cfg, const char *dir, const sd3_case *fc,
                                 ditd_sd3 *par, const ditd_mesh *mesh)
{
    char what[512];
    size_t Dt = (size_t)cfg->joint_attention_dim, B = (size_t)fc->B;
    ditd_sd3 *one = NULL;
    float *text1 = calloc(B * Dt, sizeof *text1);
    float *a = calloc(fc->n_out, sizeof *a), *b = calloc(fc->n_out, sizeof *b);
    for (size_t i = 0; i < B; i++)
        memcpy(text1 + i * Dt, fc->text + i * (size_t)fc->L * Dt, Dt * sizeof *text1);
    TU_OK(ditd_sd3_new_mesh(cfg, &ditd_backend_cpu, fc->B, fc->h, fc->w, 1, dir, NULL, &one));
    TU_OK(ditd_sd3_set_size(par, fc->h, fc->w, 1));
    if (one) {
        snprintf(what, sizeof what, "rank %d %s: 1 text token (%d here)", rank_world, dir,
                 par->l_loc);
        check_shares(par, mesh, what);
        TU_OK(ditd_sd3_forward(one, fc->B, fc->x, fc->t, text1, fc->pooled, fc->skip, fc->n_skip,
                               a));
        TU_OK(ditd_sd3_forward(par, fc->B, fc->x, fc->t, text1, fc->pooled, fc->skip, fc->n_skip,
                               b));
        TU_CLOSE(what, b, a, fc->n_out, TOL);
    }
    ditd_sd3_free(one);
    free(text1);
    free(a);
    free(b);
}

static int run_model(const char *dir, const ditd_mesh *mesh)
{
    char path[4200], what[512];
    ditd_sd3_config cfg;
    int checked = 0;
    size_t i;
    json_t *c, *cases;
    snprintf(path, sizeof path, "%s/config.json", dir);
    TU_OK(ditd_sd3_config_load(path, &cfg));
    const ditd_layout *l = &mesh->layout;
    cases = sd3_cases(dir);
    json_array_foreach(cases, i, c) {
        sd3_case fc;
        ditd_sd3 *one = NULL, *par = NULL;
        if (sd3_case_load(dir, c, &fc) == 0) {
            TU_OK(ditd_sd3_new_mesh(&cfg, &ditd_backend_cpu, fc.B, fc.h, fc.w, fc.L, dir, NULL,
                                    &one));
            /* the mesh's model loaded at another size, then re-planned for
             * the case's (set_size under a mesh) */
            int h2 = fc.h + 2 <= 12 ? fc.h + 2 : fc.h - 2;
            TU_OK(ditd_sd3_new_mesh(&cfg, &ditd_backend_cpu, fc.B, h2, fc.w, fc.L + 1, dir, mesh,
                                    &par));
            if (par)
                TU_OK(ditd_sd3_set_size(par, fc.h, fc.w, fc.L));
        }
        if (one && par && gguf_run)
            TU_CHECK(one->quantized > 0 && par->quantized == one->quantized,
                     "rank %d %s[%zu]: %d linears kept quantized on one rank, %d under the mesh",
                     rank_world, dir, i, one->quantized, par->quantized);
        if (one && par) {
            float *a = calloc(fc.n_out, sizeof *a), *b = calloc(fc.n_out, sizeof *b);
            float *lead = calloc(fc.n_out, sizeof *lead);
            TU_OK(ditd_sd3_forward(one, fc.B, fc.x, fc.t, fc.text, fc.pooled, fc.skip, fc.n_skip,
                                   a));
            TU_OK(ditd_sd3_forward(par, fc.B, fc.x, fc.t, fc.text, fc.pooled, fc.skip, fc.n_skip,
                                   b));
            snprintf(what, sizeof what,
                     "rank %d %s[%zu] %d image tokens (%d here), %d text (%d here), %d skipped: mesh vs one rank",
                     rank_world, dir, i, par->N, par->n_loc, fc.L, par->l_loc, fc.n_skip);
            check_shares(par, mesh, what);
            if (fc.L % (l->ring * l->ulysses))
                uneven_text++;
            TU_CLOSE(what, b, a, fc.n_out, TOL);
            snprintf(what, sizeof what, "rank %d %s[%zu]: mesh vs Diffusers", rank_world, dir, i);
            TU_CLOSE(what, b, fc.out, fc.n_out, TOL);
            memcpy(lead, b, fc.n_out * sizeof *lead);
            TU_OK(ditd_comm_bcast(mesh->group, lead, fc.n_out * sizeof *lead, 0));
            TU_CHECK(memcmp(lead, b, fc.n_out * sizeof *lead) == 0,
                     "%s[%zu]: rank %d's output differs from the leader's", dir, i, rank_world);
            if (i == 0)
                check_one_text_token(&cfg, dir, &fc, par, mesh);
            checked++;
            free(a);
            free(b);
            free(lead);
        }
        ditd_sd3_free(one);
        ditd_sd3_free(par);
        sd3_case_free(&fc);
    }
    json_decref(cases);
    return checked;
}

/* A layout SD3 refuses: the same error on every rank, before any collective. */
static void refusals(const ditd_mesh *mesh, const char *dir)
{
    char path[4200];
    ditd_sd3_config cfg;
    ditd_sd3 *m = NULL;
    snprintf(path, sizeof path, "%s/config.json", dir);
    TU_OK(ditd_sd3_config_load(path, &cfg));
    int err = ditd_sd3_new_mesh(&cfg, &ditd_backend_cpu, 1, 8, 8, 4, dir, mesh, &m);
    const ditd_layout *l = &mesh->layout;
    TU_CHECK(l->tp > cfg.num_heads || l->ulysses > (cfg.num_heads + l->tp - 1) / l->tp,
             "the refusals run needs more tp ranks than heads or more ulysses ranks than a tp rank's heads");
    TU_CHECK(err == DITD_EINVAL &&
                 (strstr(ditd_err_detail(), "ulysses") || strstr(ditd_err_detail(), "tp")),
             "tp %d x ulysses %d over %d heads refused: %s: %s", l->tp, l->ulysses, cfg.num_heads,
             ditd_err_name(err), ditd_err_detail());
    ditd_sd3_free(m);
}

int main(int argc, char **argv)
{
    ditd_layout l = DITD_LAYOUT_SINGLE;
    ditd_comm *world = NULL;
    ditd_mesh *mesh = NULL;
    char dir[4096];
    int checked = 0, refuse = 0;

    if (ditd_comm_mpi_init(&argc, &argv) || ditd_comm_mpi_world(&world)) {
        fprintf(stderr, "MPI: %s\n", ditd_err_detail());
        return 1;
    }
    rank_world = ditd_comm_rank(world);
    int arg_rc = tm_parse_layout(argc, argv, &l, "--refusals", &refuse);
    if (arg_rc)
        return arg_rc;
    ditd_backend_cpu.set_threads(1);
    TU_OK(ditd_mesh_new(world, &l, &mesh));
    if (!mesh)
        goto out;
    if (refuse) {
        snprintf(dir, sizeof dir, "%s/sd3/%s", tu_fixtures(), sd3_models[1]);
        refusals(mesh, dir);
    } else if ((gguf_run = getenv("DITD_TEST_SD3_GGUF") != NULL)) {
        snprintf(dir, sizeof dir, "%s/sd3wan_gguf/sd35-q8_0", tu_fixtures());
        checked = run_model(dir, mesh);
        TU_CHECK(checked >= 2, "SD3 GGUF cases checked under the mesh: %d (at least 2)", checked);
        TU_CHECK(l.ring * l.ulysses == 1 || uneven_text >= 1,
                 "no case with a text length that cp degree %d does not divide", l.ring * l.ulysses);
    } else {
        for (int i = 0; i < SD3_MODELS; i++) {
            snprintf(dir, sizeof dir, "%s/sd3/%s", tu_fixtures(), sd3_models[i]);
            checked += run_model(dir, mesh);
        }
        TU_CHECK(checked >= MIN_CASES, "SD3 cases checked under the mesh: %d (at least %d)",
                 checked, MIN_CASES);
        TU_CHECK(l.ring * l.ulysses == 1 || uneven_text >= 1,
                 "no case with a text length that cp degree %d does not divide", l.ring * l.ulysses);
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
