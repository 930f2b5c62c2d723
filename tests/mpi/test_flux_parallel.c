/* The FLUX.1 transformer under mpirun: context parallel over the joint
 * text + image sequence (text and image tokens both split over the cp
 * ranks, unevenly, as Diffusers' Flux _cp_plan), for every fixture model
 * and case of tests/fixtures/flux:
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
 *     ditd_flux_set_size (the split and the attention planned anew);
 *   - at least 5 cases checked.
 * Tensor parallel (Diffusers' Flux TP plan, heads and MLP columns split)
 * alone and with ring. A layout FLUX cannot run is refused on every rank
 * alike at load: more ulysses ranks than a tp rank's heads (EINVAL).
 *
 *   mpirun -np G test_flux_parallel --ring R --ulysses U --tp T [--rotate p2p]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/backend/backend.h"
#include "engine/models/flux/flux.h"
#include "engine/parallel/comm.h"
#include "engine/parallel/mesh.h"
#include "tests/flux_case.h"
#include "tests/mpi/mpi_args.h"

#define TOL 1e-4
#define MIN_CASES 7

static int rank_world;
static int uneven_text; /* cases whose text length the cp degree does not divide */
static int refused;     /* loads refused because a tp split would cut GGML blocks */

/* This rank's text and image shares, against ditd_split of L and N. */
static void check_shares(const ditd_flux *par, const ditd_mesh *mesh, const char *what)
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
static void check_one_text_token(const ditd_flux_config *cfg, const char *dir, const flux_case *fc,
                                 ditd_flux *par, const ditd_mesh *mesh)
{
    char what[512];
    size_t Dt = (size_t)cfg->joint_attention_dim, B = (size_t)fc->B;
    const float *g = cfg->guidance_embeds ? fc->guidance : NULL;
    ditd_flux *one = NULL;
    float *text1 = calloc(B * Dt, sizeof *text1);
    float *a = calloc(fc->n_out, sizeof *a), *b = calloc(fc->n_out, sizeof *b);
    for (size_t i = 0; i < B; i++)
        memcpy(text1 + i * Dt, fc->text + i * (size_t)fc->L * Dt, Dt * sizeof *text1);
    TU_OK(ditd_flux_new_mesh(cfg, &ditd_backend_cpu, fc->B, fc->h, fc->w, 1, dir, NULL, &one));
    TU_OK(ditd_flux_set_size(par, fc->h, fc->w, 1));
    if (one) {
        snprintf(what, sizeof what, "rank %d %s: 1 text token (%d here)", rank_world, dir,
                 par->l_loc);
        check_shares(par, mesh, what);
        TU_OK(ditd_flux_forward(one, fc->B, fc->x, fc->t, text1, fc->pooled, g, a));
        TU_OK(ditd_flux_forward(par, fc->B, fc->x, fc->t, text1, fc->pooled, g, b));
        TU_CLOSE(what, b, a, fc->n_out, TOL);
    }
    ditd_flux_free(one);
    free(text1);
    free(a);
    free(b);
}

/* Runs the model's cases; -1 when the layout cannot split its heads (a
 * model with fewer heads than ulysses x tp ranks need: not this layout's). */
static int run_model(const char *dir, const ditd_mesh *mesh)
{
    char path[4200], what[512];
    ditd_flux_config cfg;
    int checked = 0;
    size_t i;
    json_t *c, *cases;
    snprintf(path, sizeof path, "%s/config.json", dir);
    TU_OK(ditd_flux_config_load(path, &cfg));
    const ditd_layout *l = &mesh->layout;
    if (cfg.num_heads % l->tp || (cfg.num_heads / l->tp) % l->ulysses)
        return -1;
    /* the Q4_K model under tp: its heads' 128 columns cut 256-value blocks */
    const int cut_blocks = l->tp > 1 && strstr(dir, "q4_k") != NULL;
    cases = flux_cases(dir);
    json_array_foreach(cases, i, c) {
        flux_case fc;
        ditd_flux *one = NULL, *par = NULL;
        if (flux_case_load(dir, c, &fc) == 0) {
            TU_OK(ditd_flux_new_mesh(&cfg, &ditd_backend_cpu, fc.B, fc.h, fc.w, fc.L, dir, NULL,
                                     &one));
            /* the mesh's model loaded at another size, then re-planned
             * for the case's (set_size under a mesh) */
            if (cut_blocks) {
                /* the Q4_K model's 128-column head slices cut its 256-value
                 * blocks: refused naming the numbers, on every rank; then
                 * loaded with every weight as floats, as the refusal says */
                int err = ditd_flux_new_mesh(&cfg, &ditd_backend_cpu, fc.B, fc.h, fc.w, fc.L,
                                             dir, mesh, &par);
                char want[160];
                snprintf(want, sizeof want, "tensor parallel %d gives this rank its columns",
                         l->tp);
                const char *d = ditd_err_detail();
                TU_CHECK(err == DITD_EUNSUPPORTED && !par && strstr(d, "Q4_K") &&
                             strstr(d, "blocks of 256") && strstr(d, want) &&
                             strstr(d, "transformer_blocks.0.attn.to_out.0.weight") &&
                             strstr(d, "is not a multiple of 256"),
                         "rank %d %s tp %d: a split that cuts Q4_K blocks refused: %s: %s",
                         rank_world, dir, l->tp, ditd_err_name(err), d);
                refused++;
                setenv("DITD_WEIGHTS_DEQUANTIZE", "1", 1);
            }
            TU_OK(ditd_flux_new_mesh(&cfg, &ditd_backend_cpu, fc.B, fc.h + 2, fc.w + 4, fc.L + 1,
                                     dir, mesh, &par));
            if (cut_blocks)
                unsetenv("DITD_WEIGHTS_DEQUANTIZE");
            if (par)
                TU_OK(ditd_flux_set_size(par, fc.h, fc.w, fc.L));
        }
        if (one && par) {
            const float *g = cfg.guidance_embeds ? fc.guidance : NULL;
            float *a = calloc(fc.n_out, sizeof *a), *b = calloc(fc.n_out, sizeof *b);
            float *lead = calloc(fc.n_out, sizeof *lead);
            TU_OK(ditd_flux_forward(one, fc.B, fc.x, fc.t, fc.text, fc.pooled, g, a));
            TU_OK(ditd_flux_forward(par, fc.B, fc.x, fc.t, fc.text, fc.pooled, g, b));
            snprintf(what, sizeof what,
                     "rank %d %s[%zu] %d image tokens (%d here), %d text (%d here): mesh vs one rank",
                     rank_world, dir, i, par->N, par->n_loc, fc.L, par->l_loc);
            check_shares(par, mesh, what);
            if (strstr(dir, "flux_gguf") || strstr(dir, "flux_fp8"))
                /* every tp slice of the Q8_0 model is whole blocks (32 values),
                 * of the FP8 one whole rows with their scales; the Q4_K one
                 * under tp was loaded as floats (above) */
                TU_CHECK(one->quantized > 0 && (cut_blocks ? par->quantized == 0
                                                           : par->quantized == one->quantized),
                         "%s: %d linears kept quantized under the mesh, %d on one rank", what,
                         par->quantized, one->quantized);
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
        ditd_flux_free(one);
        ditd_flux_free(par);
        flux_case_free(&fc);
    }
    json_decref(cases);
    return checked;
}

/* Layouts FLUX refuses: the same error on every rank, before any collective
 * (more tp ranks than heads, more ulysses ranks than a tp rank's heads). */
static void refusals(const ditd_mesh *mesh, const char *dir)
{
    char path[4200];
    ditd_flux_config cfg;
    ditd_flux *m = NULL;
    snprintf(path, sizeof path, "%s/config.json", dir);
    TU_OK(ditd_flux_config_load(path, &cfg));
    int err = ditd_flux_new_mesh(&cfg, &ditd_backend_cpu, 1, 8, 8, 4, dir, mesh, &m);
    const ditd_layout *l = &mesh->layout;
    TU_CHECK(l->tp > cfg.num_heads || l->ulysses > (cfg.num_heads + l->tp - 1) / l->tp,
             "the refusals run needs more tp ranks than heads or more ulysses ranks than a tp rank's heads");
    TU_CHECK(err == DITD_EINVAL &&
                 (strstr(ditd_err_detail(), "ulysses") || strstr(ditd_err_detail(), "tp")),
             "tp %d x ulysses %d over %d heads refused: %s: %s", l->tp, l->ulysses, cfg.num_heads,
             ditd_err_name(err), ditd_err_detail());
    ditd_flux_free(m);
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
        snprintf(dir, sizeof dir, "%s/flux/%s", tu_fixtures(), flux_models[0]);
        refusals(mesh, dir);
    } else {
        /* DITD_TEST_FLUX_GGUF=1: the GGUF models (tests/fixtures/flux_gguf;
         * linears kept quantized, the Q4_K one dequantized at load under tp)
         * and the FP8 one with per-row scales (tests/fixtures/flux_fp8) */
        static const char *const gguf_models[] = {"flux_gguf/q8_0", "flux_gguf/q4_k",
                                                  "flux_fp8/e4m3-row"};
        const char *gg = getenv("DITD_TEST_FLUX_GGUF");
        const int gguf = gg && strcmp(gg, "1") == 0;
        const int nmodels = gguf ? 3 : FLUX_MODELS;
        int models = 0;
        for (int i = 0; i < nmodels; i++) {
            if (gguf)
                snprintf(dir, sizeof dir, "%s/%s", tu_fixtures(), gguf_models[i]);
            else
                snprintf(dir, sizeof dir, "%s/flux/%s", tu_fixtures(), flux_models[i]);
            int k = run_model(dir, mesh);
            if (k >= 0) {
                checked += k;
                models++;
            }
        }
        /* every model when the layout splits 2 heads; the six-head one always */
        int floor = gguf ? 5 : models == FLUX_MODELS ? MIN_CASES : 2;
        TU_CHECK(checked >= floor && models >= 1,
                 "FLUX cases checked under the mesh: %d of %d models (at least %d cases)", checked,
                 models, floor);
        TU_CHECK(!gguf || l.tp == 1 || refused >= 1,
                 "tp %d: no load refused for cutting the Q4_K model's blocks", l.tp);
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
