/* The Wan transformer under mpirun, for every fixture model and case of
 * tests/fixtures/wan that the layout can split:
 *   - context parallel over the video tokens (ulysses, ring with either
 *     rotation, both): cp rank s holds ditd_split(N, R*U, s) tokens, and
 *     under cp some case's token count (frames x patches) is not a multiple
 *     of the cp degree and some rank's share starts or ends inside a frame
 *     (the per-frame modulations are split at frame boundaries);
 *   - the text of cross-attention replicated on every rank;
 *   - tensor parallel over heads and FFN columns, the across-heads RMSNorm's
 *     sums of squares all-reduced over tp;
 *   - the mesh's output equal to one rank's (no mesh) within 1e-4 relative
 *     (max|a-b|/max|b|), and to Diffusers' float64 output within 1e-4;
 *   - every rank of the group gets the same bits (the leader's);
 *   - the mesh's model is loaded at another size and re-planned with
 *     ditd_wan_set_size;
 *   - every case when the layout splits 2 heads (13), the six-head model's
 *     4 otherwise;
 *   - the image branch (Wan 2.1 I2V / FLF2V fixtures): the image context
 *     replicated like the text, add_k_proj / add_v_proj by heads under tp.
 * With --refusals: a layout Wan cannot run is refused on every rank alike
 * at load (more ulysses ranks than a tp rank's heads: EINVAL).
 *
 *   mpirun -np G test_wan_parallel --ring R --ulysses U --tp T [--rotate p2p]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/backend/backend.h"
#include "engine/models/wan/wan.h"
#include "engine/parallel/comm.h"
#include "engine/parallel/mesh.h"
#include "tests/mpi/mpi_args.h"
#include "tests/wan_case.h"

#define TOL 1e-4
#define MIN_CASES 13

static int rank_world;
static int gguf_run;    /* DITD_TEST_WAN_GGUF=1 */
static int uneven;      /* cases whose token count the cp degree does not divide */
static int mid_frame;   /* cases where some rank's share begins inside a frame */

/* Runs the model's cases; -1 when the layout cannot split its heads. */
static int run_model(const char *dir, const ditd_mesh *mesh)
{
    char path[4200], what[512];
    ditd_wan_config cfg;
    int checked = 0;
    size_t i;
    json_t *c, *cases;
    snprintf(path, sizeof path, "%s/config.json", dir);
    TU_OK(ditd_wan_config_load(path, &cfg));
    const ditd_layout *l = &mesh->layout;
    int RU = l->ring * l->ulysses;
    if (cfg.num_heads % l->tp || (cfg.num_heads / l->tp) % l->ulysses)
        return -1;
    cases = wan_cases(dir);
    json_array_foreach(cases, i, c) {
        wan_case wc;
        ditd_wan *one = NULL, *par = NULL;
        if (wan_case_load(dir, c, &wc) == 0) {
            TU_OK(ditd_wan_new_mesh(&cfg, &ditd_backend_cpu, wc.B, wc.F, wc.h, wc.w, wc.L, dir,
                                    NULL, &one));
            /* the mesh's model loaded at another size, then re-planned */
            TU_OK(ditd_wan_new_mesh(&cfg, &ditd_backend_cpu, wc.B, wc.F + 1, wc.h + 2, wc.w,
                                    cfg.image_dim ? wc.L : wc.L + 1, dir, mesh, &par));
            if (par)
                TU_OK(ditd_wan_set_size(par, wc.F, wc.h, wc.w, wc.L));
        }
        if (one && par && gguf_run)
            TU_CHECK(one->quantized > 0 && par->quantized == one->quantized,
                     "rank %d %s[%zu]: %d linears kept quantized on one rank, %d under the mesh",
                     rank_world, dir, i, one->quantized, par->quantized);
        if (one && par) {
            float *a = calloc(wc.n_out, sizeof *a), *b = calloc(wc.n_out, sizeof *b);
            float *lead = calloc(wc.n_out, sizeof *lead);
            int s = mesh->ring_rank * l->ulysses + mesh->ulysses_rank, off, cnt;
            ditd_split(par->N, RU, s, &off, &cnt);
            TU_CHECK(par->n_loc == cnt && par->tok0 == off,
                     "rank %d: cp rank %d holds tokens [%d, +%d), its share of %d is [%d, +%d)",
                     rank_world, s, par->tok0, par->n_loc, par->N, off, cnt);
            if (par->N % RU)
                uneven++;
            for (int j = 1; j < RU; j++) {
                ditd_split(par->N, RU, j, &off, &cnt);
                if (off % par->P) {
                    mid_frame++;
                    break;
                }
            }
            TU_OK(ditd_wan_forward(one, wc.B, wc.x, wc.t, wc.t_frames, wc.text, wc.image, a));
            TU_OK(ditd_wan_forward(par, wc.B, wc.x, wc.t, wc.t_frames, wc.text, wc.image, b));
            snprintf(what, sizeof what,
                     "rank %d %s[%zu] %d frames x %d patches (%d tokens here)%s: mesh vs one rank",
                     rank_world, dir, i, wc.F, par->P, par->n_loc,
                     wc.t_frames ? ", per-frame t" : "");
            TU_CLOSE(what, b, a, wc.n_out, TOL);
            snprintf(what, sizeof what, "rank %d %s[%zu]: mesh vs Diffusers", rank_world, dir, i);
            TU_CLOSE(what, b, wc.out, wc.n_out, TOL);
            memcpy(lead, b, wc.n_out * sizeof *lead);
            TU_OK(ditd_comm_bcast(mesh->group, lead, wc.n_out * sizeof *lead, 0));
            TU_CHECK(memcmp(lead, b, wc.n_out * sizeof *lead) == 0,
                     "%s[%zu]: rank %d's output differs from the leader's", dir, i, rank_world);
            checked++;
            free(a);
            free(b);
            free(lead);
        }
        ditd_wan_free(one);
        ditd_wan_free(par);
        wan_case_free(&wc);
    }
    json_decref(cases);
    return checked;
}

/* The Q4_K Wan (2 heads of 128) under tp: a rank's 128 columns of a
 * row-parallel linear would cut its 256-value blocks: refused on every rank
 * naming the first such tensor (attn1's output projection, Q5_K) and the
 * numbers; loaded with DITD_WEIGHTS_DEQUANTIZE=1 it equals one
 * rank's quantized model and Diffusers. */
static void gguf_tp_refusal(const ditd_mesh *mesh)
{
    char dir[4096], path[4200], what[512];
    ditd_wan_config cfg;
    size_t i;
    json_t *c, *cases;
    snprintf(dir, sizeof dir, "%s/sd3wan_gguf/wan-q4_k", tu_fixtures());
    snprintf(path, sizeof path, "%s/config.json", dir);
    TU_OK(ditd_wan_config_load(path, &cfg));
    cases = wan_cases(dir);
    json_array_foreach(cases, i, c) {
        wan_case wc;
        ditd_wan *one = NULL, *par = NULL;
        if (wan_case_load(dir, c, &wc) != 0)
            continue;
        TU_CHECK_ERR(ditd_wan_new_mesh(&cfg, &ditd_backend_cpu, wc.B, wc.F, wc.h, wc.w, wc.L,
                                       dir, mesh, &par),
                     DITD_EUNSUPPORTED, "blocks.0.attn1.to_out.0.weight", "Q5_K",
                     "blocks of 256", "tensor parallel 2", "128 is not a multiple of 256",
                     "DITD_WEIGHTS_DEQUANTIZE");
        TU_OK(ditd_wan_new_mesh(&cfg, &ditd_backend_cpu, wc.B, wc.F, wc.h, wc.w, wc.L, dir, NULL,
                                &one));
        setenv("DITD_WEIGHTS_DEQUANTIZE", "1", 1);
        TU_OK(ditd_wan_new_mesh(&cfg, &ditd_backend_cpu, wc.B, wc.F, wc.h, wc.w, wc.L, dir, mesh,
                                &par));
        unsetenv("DITD_WEIGHTS_DEQUANTIZE");
        if (one && par) {
            float *a = calloc(wc.n_out, sizeof *a), *b = calloc(wc.n_out, sizeof *b);
            TU_OK(ditd_wan_forward(one, wc.B, wc.x, wc.t, NULL, wc.text, NULL, a));
            TU_OK(ditd_wan_forward(par, wc.B, wc.x, wc.t, NULL, wc.text, NULL, b));
            TU_CHECK(one->quantized > 0 && par->quantized == 0,
                     "one rank keeps %d linears quantized, the dequantized mesh %d",
                     one->quantized, par->quantized);
            snprintf(what, sizeof what, "rank %d %s: tp dequantized vs one rank quantized",
                     rank_world, dir);
            TU_CLOSE(what, b, a, wc.n_out, TOL);
            snprintf(what, sizeof what, "rank %d %s: tp dequantized vs Diffusers", rank_world,
                     dir);
            TU_CLOSE(what, b, wc.out, wc.n_out, TOL);
            free(a);
            free(b);
        }
        ditd_wan_free(one);
        ditd_wan_free(par);
        wan_case_free(&wc);
    }
    json_decref(cases);
}

/* A layout Wan refuses: the same error on every rank, before any collective. */
static void refusals(const ditd_mesh *mesh, const char *dir)
{
    char path[4200];
    ditd_wan_config cfg;
    ditd_wan *m = NULL;
    snprintf(path, sizeof path, "%s/config.json", dir);
    TU_OK(ditd_wan_config_load(path, &cfg));
    int err = ditd_wan_new_mesh(&cfg, &ditd_backend_cpu, 1, 2, 4, 4, 3, dir, mesh, &m);
    const ditd_layout *l = &mesh->layout;
    TU_CHECK(l->tp > cfg.num_heads || l->ulysses > (cfg.num_heads + l->tp - 1) / l->tp,
             "the refusals run needs more tp ranks than heads or more ulysses ranks than a tp rank's heads");
    TU_CHECK(err == DITD_EINVAL &&
                 (strstr(ditd_err_detail(), "ulysses") || strstr(ditd_err_detail(), "tp")),
             "tp %d x ulysses %d over %d heads refused: %s: %s", l->tp, l->ulysses, cfg.num_heads,
             ditd_err_name(err), ditd_err_detail());
    TU_CHECK(m == NULL, "nothing handed out");
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
        snprintf(dir, sizeof dir, "%s/wan/%s", tu_fixtures(), wan_models[0]);
        refusals(mesh, dir);
    } else if ((gguf_run = getenv("DITD_TEST_WAN_GGUF") != NULL)) {
        /* the Q8_0 Wan in original names, kept quantized on both sides */
        snprintf(dir, sizeof dir, "%s/sd3wan_gguf/wan-q8_0", tu_fixtures());
        checked = run_model(dir, mesh);
        TU_CHECK(checked >= 2, "Wan GGUF cases checked under the mesh: %d (at least 2)", checked);
        if (l.tp == 2)
            gguf_tp_refusal(mesh);
    } else {
        int models = 0;
        for (int i = 0; i < WAN_MODELS; i++) {
            snprintf(dir, sizeof dir, "%s/wan/%s", tu_fixtures(), wan_models[i]);
            int k = run_model(dir, mesh);
            if (k >= 0) {
                checked += k;
                models++;
            }
        }
        /* every model when the layout splits 2 heads; the six-head one always */
        int floor = models == WAN_MODELS ? MIN_CASES : 4;
        TU_CHECK(checked >= floor && models >= 1,
                 "Wan cases checked under the mesh: %d of %d models (at least %d cases)", checked,
                 models, floor);
        TU_CHECK(l.ring * l.ulysses == 1 || (uneven >= 1 && mid_frame >= 1),
                 "cp degree %d: %d cases with uneven token shares, %d splitting a frame (need both)",
                 l.ring * l.ulysses, uneven, mid_frame);
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
