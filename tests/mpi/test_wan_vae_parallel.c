/* mpi: the Wan VAE's parallel decode equals the one-rank decode, bit for bit.
 *
 * Run under mpirun with G ranks (2, 3, 4). For every decode and tiled case of
 * the fixture VAEs (tests/fixtures/wan_vae/), every rank decodes together
 * (rows split at latent resolution in units of 1 row: 3 rows over 2 ranks
 * is 1, 2; then the automatic unit, with which these small latents are
 * decoded whole on every rank), and the leader compares with the decode it
 * runs alone on a second, ungrouped VAE: every float bit-identical -- and
 * with Diffusers' float64 output within 1e-5. It also reports the bytes
 * per collective. */
#include <jansson.h>
#include <string.h>

#include "engine/backend/backend.h"
#include "engine/io/npy.h"
#include "engine/models/wan_vae/wan_vae.h"
#include "engine/parallel/comm.h"
#include "tests/test_util.h"

static int rank_;

static float *load(const char *dir, json_t *c, const char *key, int64_t *shape)
{
    char path[4096];
    float *d = NULL;
    int nd = 0;
    snprintf(path, sizeof path, "%s/expected/%s", dir, json_string_value(json_object_get(c, key)));
    TU_OK(ditd_npy_read_f32(path, 5, &nd, shape, &d));
    return d;
}

static int tile_opt(json_t *c, const char *key)
{
    return (int)json_integer_value(json_object_get(json_object_get(c, "tiles"), key));
}

static int run_vae(ditd_comm *world, const char *name, int unit)
{
    char dir[4096], path[4200], what[512];
    json_error_t jerr;
    json_t *root, *c;
    size_t i;
    int checked = 0;
    const int G = ditd_comm_size(world);

    snprintf(dir, sizeof dir, "%s/wan_vae/%s", tu_fixtures(), name);
    snprintf(path, sizeof path, "%s/expected/cases.json", dir);
    root = json_load_file(path, 0, &jerr);
    TU_CHECK(root != NULL, "%s: %s", path, jerr.text);
    if (!root)
        return 0;
    snprintf(path, sizeof path, "%s/vae", dir);
    json_array_foreach(json_object_get(root, "cases"), i, c) {
        const char *kind = json_string_value(json_object_get(c, "kind"));
        if (strcmp(kind, "decode") && strcmp(kind, "tiled"))
            continue;
        const int tiled = !strcmp(kind, "tiled");
        int64_t zs[5], os[5];
        float *z = load(dir, c, "z", zs), *ref = load(dir, c, "out", os);
        size_t n = (size_t)(os[0] * os[1] * os[2] * os[3] * os[4]);
        ditd_wan_vae_opts o = {.max_h = (int)zs[3], .max_w = (int)zs[4], .comm = world,
                               .row_unit = unit};
        if (tiled) {
            o.tiling = 1;
            o.max_frames = (int)zs[2];
            o.tile_sample_min_h = tile_opt(c, "tile_sample_min_height");
            o.tile_sample_min_w = tile_opt(c, "tile_sample_min_width");
            o.tile_sample_stride_h = tile_opt(c, "tile_sample_stride_height");
            o.tile_sample_stride_w = tile_opt(c, "tile_sample_stride_width");
        }
        ditd_wan_vae *par = NULL, *one = NULL;
        float *out = calloc(n, sizeof *out), *solo = calloc(n, sizeof *solo);
        TU_OK(ditd_wan_vae_load(path, &ditd_backend_cpu, &o, &par));
        ditd_comm_stats_reset(world);
        if (par)
            TU_OK(ditd_wan_vae_decode(par, z, (int)zs[0], (int)zs[2], (int)zs[3], (int)zs[4],
                                      rank_ == 0 ? out : NULL));
        if (rank_ == 0) {
            const ditd_comm_stat *st = ditd_comm_stats(world);
            ditd_wan_vae_opts o1 = o;
            o1.comm = NULL;
            TU_OK(ditd_wan_vae_load(path, &ditd_backend_cpu, &o1, &one));
            if (one)
                TU_OK(ditd_wan_vae_decode(one, z, (int)zs[0], (int)zs[2], (int)zs[3], (int)zs[4],
                                          solo));
            snprintf(what, sizeof what, "G=%d unit %d %s %s (%lld, %lld, %lld, %lld, %lld) vs Diffusers",
                     G, unit, name, kind, (long long)zs[0], (long long)zs[1], (long long)zs[2],
                     (long long)zs[3], (long long)zs[4]);
            TU_CLOSE(what, out, ref, n, 1e-5);
            size_t bitdiff = 0;
            for (size_t e = 0; e < n; e++)
                bitdiff += memcmp(&out[e], &solo[e], sizeof(float)) != 0;
            tu_checks++;
            if (bitdiff)
                tu_failures++;
            printf("%s G=%d unit %d %s %s: %zu of %zu floats not bit-equal to one rank\n",
                   bitdiff ? "FAIL" : "ok  ", G, unit, name, kind, bitdiff, n);
            printf("     comm: sendrecv %llu calls %llu B, allgatherv %llu calls %llu B\n",
                   (unsigned long long)st[DITD_COLL_SENDRECV].calls,
                   (unsigned long long)st[DITD_COLL_SENDRECV].bytes,
                   (unsigned long long)st[DITD_COLL_ALLGATHERV].calls,
                   (unsigned long long)st[DITD_COLL_ALLGATHERV].bytes);
            ditd_wan_vae_free(one);
            checked++;
        }
        ditd_wan_vae_free(par);
        free(z);
        free(ref);
        free(out);
        free(solo);
    }
    json_decref(root);
    return checked;
}

int main(int argc, char **argv)
{
    static const char *const names[] = {"wan21-z16", "wan21-z4-bf16", "wan22-res"};
    ditd_comm *world = NULL;
    int cases = 0;

    if (ditd_comm_mpi_init(&argc, &argv) || ditd_comm_mpi_world(&world)) {
        fprintf(stderr, "MPI: %s\n", ditd_err_detail());
        return 1;
    }
    rank_ = ditd_comm_rank(world);
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++) {
        /* unit 1: every case with at least G latent rows splits; unit 0
         * (automatic: 8 rows for these narrow latents): decoded whole on
         * every rank, with no collective */
        cases += run_vae(world, names[k], 1);
        cases += run_vae(world, names[k], 0);
    }
    /* 3 VAEs: 6 decodes and 2 tiled decodes, twice */
    if (rank_ == 0)
        TU_CHECK(cases >= 16, "ran %d cases (want >= 16)", cases);
    int rc = rank_ == 0 ? tu_exit() : 0;
    ditd_comm_free(world);
    ditd_comm_mpi_finalize();
    return rc;
}
