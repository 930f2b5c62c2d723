/* mpi: the parallel VAE encode equals the one-rank encode, bit for bit.
 *
 * Run under mpirun with G ranks (2, 3, 4). Every rank encodes together
 * (rows split at latent resolution, the stride-2 downsamples' bottom pad
 * the next band's first row, GroupNorm statistics summed in float64 in
 * image order, the mid-block attention over the whole latent) with 1
 * thread; the leader then encodes alone, with 2 threads, on a second VAE
 * planned for larger images (as a server's): the mean (latent_dist.mode())
 * and the Philox draw (latent_dist.sample()) must be equal as bytes
 * (memcmp), and every rank must hold the same latents as the leader.
 *
 * Cases:
 *   - the fixture VAEs' encode cases (tests/fixtures/vae/kl*: images of
 *     10x14, 20x12, 6x10 batch 2, and 23x13, 45x27, 11x9 whose sides are
 *     not a multiple of the scale factor; row units automatic and 2), also
 *     against Diffusers' float64 mean within 1e-5;
 *   - random-weight VAEs, SD-like (4 latent channels, quant_conv, 3 blocks)
 *     and FLUX-like (16, none, 4 blocks), on images whose heights are not a
 *     multiple of the scale factor (rows the stride-2 stages drop), odd
 *     latent heights (13, 7, 11), non-square, a batch of 2, row units of
 *     1, 3 and automatic (one latent row, the encoder's default; with 3,
 *     a 7-row latent on 4 ranks is encoded whole on every rank, no
 *     collective);
 *   - the published configs (flux-vae, sd-vae-ft-ema: full widths, random
 *     weights) on a small image, one latent row a unit (always split).
 * A floor on the cases run, and on the cases that really split.
 * Then a refusal: an image too small for the downsamples, named. */
#include <jansson.h>
#include <string.h>

#include "engine/backend/backend.h"
#include "engine/core/philox.h"
#include "engine/io/npy.h"
#include "engine/models/vae/autoencoder_kl.h"
#include "engine/models/vae/vae_config.h"
#include "engine/parallel/comm.h"
#include "tests/test_util.h"

static int rank_, G_;
static int split_cases;

static uint64_t fnv(const void *p, size_t n, uint64_t h)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

static size_t bytes_differ(const float *a, const float *b, size_t n, size_t *first)
{
    size_t d = 0;
    *first = n;
    for (size_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof *a)) {
            if (!d)
                *first = i;
            d++;
        }
    return d;
}

/* Every rank's mean and draw hash to the leader's. */
static void same_on_every_rank(ditd_comm *world, const char *what, const float *mean,
                               const float *draw, size_t n)
{
    int64_t mine = (int64_t)fnv(draw, n * sizeof *draw, fnv(mean, n * sizeof *mean, 0xcbf29ce484222325ull));
    int64_t *all = calloc((size_t)G_, sizeof *all);
    int *cnt = calloc((size_t)G_, sizeof *cnt), *dsp = calloc((size_t)G_, sizeof *dsp);
    for (int r = 0; r < G_; r++) {
        cnt[r] = 1;
        dsp[r] = r;
    }
    TU_OK(ditd_comm_allgatherv(world, DITD_DTYPE_I64, &mine, all, cnt, dsp));
    if (rank_ == 0) {
        int bad = 0;
        for (int r = 0; r < G_; r++)
            bad += all[r] != all[0];
        TU_CHECK(bad == 0, "%s: %d of %d ranks hold other latents than the leader", what, bad, G_);
    }
    free(all);
    free(cnt);
    free(dsp);
}

/* Encodes on the group (par) and, on the leader, alone (one); compares. */
static int check(ditd_comm *world, ditd_vae *par, ditd_vae *one, const char *what, const float *x,
                 int B, int H, int W, uint64_t seed, uint64_t stream, uint64_t offset,
                 const float *dref)
{
    const ditd_vae_config *c = ditd_vae_config_of(par);
    const int h = ditd_vae_latent_side(c, H), w = ditd_vae_latent_side(c, W);
    const size_t n = (size_t)B * c->latent_channels * h * w;
    float *m = calloc(n, sizeof *m), *d = calloc(n, sizeof *d);
    float *m1 = calloc(n, sizeof *m1), *d1 = calloc(n, sizeof *d1);
    int got = 0;

    ditd_backend_cpu.set_threads(1);
    ditd_comm_stats_reset(world);
    TU_OK(ditd_vae_encode_stream(par, x, B, H, W, seed, stream, offset, m, d));
    const ditd_comm_stat *st = ditd_comm_stats(world);
    const unsigned long long sr = st[DITD_COLL_SENDRECV].calls, ag = st[DITD_COLL_ALLGATHERV].calls;
    same_on_every_rank(world, what, m, d, n);
    if (rank_ == 0) {
        size_t fm, fd;
        ditd_backend_cpu.set_threads(2);
        TU_OK(ditd_vae_encode_stream(one, x, B, H, W, seed, stream, offset, m1, d1));
        size_t dm = bytes_differ(m, m1, n, &fm), dd = bytes_differ(d, d1, n, &fd);
        tu_checks++;
        if (dm || dd)
            tu_failures++;
        const int split = sr > 0 && ag > 0;
        split_cases += split;
        printf("%s G=%d %s: image %dx%d batch %d -> latent %dx%d, %s (sendrecv %llu, allgatherv %llu): "
               "%zu mean and %zu draw floats of %zu differ from one rank",
               dm || dd ? "FAIL" : "ok  ", G_, what, H, W, B, h, w, split ? "split" : "whole", sr, ag,
               dm, dd, n);
        if (dm)
            printf(" (mean first at %zu: %.9g vs %.9g)", fm, m[fm], m1[fm]);
        printf("\n");
        if (dref) {
            char w2[512];
            snprintf(w2, sizeof w2, "G=%d %s mean vs Diffusers", G_, what);
            TU_CLOSE(w2, m, dref, n, 1e-5);
        }
        got = 1;
    }
    free(m);
    free(d);
    free(m1);
    free(d1);
    return got;
}

/* An image in [-1, 1]: normal draws halved, clamped. */
static void pixels(uint64_t seed, uint64_t stream, size_t n, float *x)
{
    ditd_philox_normal(seed, stream, 0, n, x);
    for (size_t e = 0; e < n; e++) {
        float u = 0.5f * x[e];
        x[e] = u < -1.0f ? -1.0f : u > 1.0f ? 1.0f : u;
    }
}

static float *load(const char *dir, json_t *c, const char *key, int64_t *shape)
{
    char path[4096];
    float *d = NULL;
    int nd = 0;
    snprintf(path, sizeof path, "%s/expected/%s", dir, json_string_value(json_object_get(c, key)));
    TU_OK(ditd_npy_read_f32(path, 4, &nd, shape, &d));
    return d;
}

static int run_fixtures(ditd_comm *world)
{
    static const char *const dirs[] = {"kl16-bf16", "kl4-f16-oldattn", "kl4-f32"};
    int checked = 0;
    for (int k = 0; k < 3; k++) {
        char dir[4096], path[4200], what[256];
        json_error_t jerr;
        size_t i;
        json_t *c;
        snprintf(dir, sizeof dir, "%s/vae/%s", tu_fixtures(), dirs[k]);
        snprintf(path, sizeof path, "%s/expected/cases.json", dir);
        json_t *root = json_load_file(path, 0, &jerr);
        TU_CHECK(root != NULL, "%s: %s", path, jerr.text);
        if (!root)
            continue;
        snprintf(path, sizeof path, "%s/vae", dir);
        json_array_foreach(json_object_get(root, "cases"), i, c) {
            if (strcmp(json_string_value(json_object_get(c, "kind")), "encode"))
                continue;
            int64_t xs[4], ms[4];
            float *x = load(dir, c, "x", xs), *mref = load(dir, c, "mean", ms);
            const int B = (int)xs[0], H = (int)xs[2], W = (int)xs[3];
            for (int unit = 0; unit <= 2; unit += 2) {
                ditd_vae_opts o = {.max_h = 1, .max_w = 1, .max_image_h = H, .max_image_w = W,
                                   .comm = world, .row_unit = unit};
                ditd_vae_opts o1 = {.max_h = 4, .max_w = 4, .max_image_h = H + 16, .max_image_w = W + 8};
                ditd_vae *par = NULL, *one = NULL;
                TU_OK(ditd_vae_load(path, &ditd_backend_cpu, &o, &par));
                if (rank_ == 0)
                    TU_OK(ditd_vae_load(path, &ditd_backend_cpu, &o1, &one));
                snprintf(what, sizeof what, "%s unit %d", dirs[k], unit);
                if (par && (rank_ || one))
                    checked += check(world, par, one, what, x, B, H, W, 1234, 0, 0, mref);
                ditd_vae_free(par);
                ditd_vae_free(one);
            }
            free(x);
            free(mref);
        }
        json_decref(root);
    }
    return checked;
}

static void small_config(ditd_vae_config *c, int kind)
{
    static const struct {
        const char *name;
        int latent, quant, n, ch[4], groups;
    } kinds[] = {
        {"SD-like 4-channel", 4, 1, 3, {16, 32, 32}, 8},
        {"FLUX-like 16-channel", 16, 0, 4, {8, 16, 16, 32}, 4},
    };
    TU_OK(ditd_vae_config_named(kind == 0 ? "sd-vae-ft-ema" : "flux-vae", c));
    c->latent_channels = kinds[kind].latent;
    c->use_post_quant_conv = c->use_quant_conv = kinds[kind].quant;
    c->n_blocks = kinds[kind].n;
    for (int i = 0; i < c->n_blocks; i++)
        c->block_out_channels[i] = kinds[kind].ch[i];
    c->norm_num_groups = kinds[kind].groups;
    c->layers_per_block = 1;
    c->mid_block_add_attention = 1;
    TU_OK(ditd_vae_config_finish(c, kinds[kind].name));
}

static int run_random(ditd_comm *world)
{
    /* image rows, columns, batch: for f = 4 (SD-like) and f = 8 (FLUX-like);
     * latents 13x7, 7x19, 11x5 with rows the stride-2 stages drop */
    static const int sizes[2][3][3] = {
        {{55, 28, 1}, {29, 77, 1}, {44, 21, 2}},
        {{109, 56, 1}, {59, 158, 1}, {88, 47, 2}},
    };
    static const int units[] = {1, 3, 0};
    static const char *const names[] = {"SD-like", "FLUX-like"};
    int checked = 0;
    for (int k = 0; k < 2; k++) {
        ditd_vae_config c;
        small_config(&c, k);
        ditd_vae_opts o1 = {.max_h = 4, .max_w = 4, .max_image_h = 128, .max_image_w = 160};
        ditd_vae *one = NULL;
        if (rank_ == 0)
            TU_OK(ditd_vae_new_random(&c, &ditd_backend_cpu, &o1, 5, &one));
        for (int ui = 0; ui < 3; ui++) {
            ditd_vae_opts o = {.max_h = 2, .max_w = 2, .max_image_h = 109, .max_image_w = 158,
                               .comm = world, .row_unit = units[ui]};
            ditd_vae *par = NULL;
            TU_OK(ditd_vae_new_random(&c, &ditd_backend_cpu, &o, 5, &par));
            for (int si = 0; si < 3; si++) {
                const int H = sizes[k][si][0], W = sizes[k][si][1], B = sizes[k][si][2];
                const size_t xn = (size_t)B * 3 * H * W;
                float *x = malloc(xn * sizeof *x);
                pixels(21 + (uint64_t)si, (uint64_t)k, xn, x);
                char what[128];
                snprintf(what, sizeof what, "%s unit %d", names[k], units[ui]);
                if (par && (rank_ || one))
                    checked += check(world, par, one, what, x, B, H, W, 77 + (uint64_t)si,
                                     UINT64_C(1) << 63, 3 * (uint64_t)si, NULL);
                free(x);
            }
            ditd_vae_free(par);
        }
        ditd_vae_free(one);
    }
    return checked;
}

/* The published configs at full width on a small image: 5 latent rows over
 * G ranks, a unit each. */
static int run_published(ditd_comm *world)
{
    static const char *const names[] = {"flux-vae", "sd-vae-ft-ema"};
    static const int sizes[2][2] = {{45, 24}, {40, 31}}; /* latents 5x3 */
    int checked = 0;
    for (int k = 0; k < 2; k++) {
        ditd_vae_config c;
        TU_OK(ditd_vae_config_named(names[k], &c));
        const int H = sizes[k][0], W = sizes[k][1];
        ditd_vae_opts o = {.max_h = 1, .max_w = 1, .max_image_h = H, .max_image_w = W, .comm = world,
                           .row_unit = 1};
        ditd_vae_opts o1 = {.max_h = 1, .max_w = 1, .max_image_h = 64, .max_image_w = 64};
        ditd_vae *par = NULL, *one = NULL;
        TU_OK(ditd_vae_new_random(&c, &ditd_backend_cpu, &o, 9, &par));
        if (rank_ == 0)
            TU_OK(ditd_vae_new_random(&c, &ditd_backend_cpu, &o1, 9, &one));
        const size_t xn = (size_t)3 * H * W;
        float *x = malloc(xn * sizeof *x);
        pixels(31, (uint64_t)k, xn, x);
        if (par && (rank_ || one))
            checked += check(world, par, one, names[k], x, 1, H, W, 5, 0, 0, NULL);
        free(x);
        ditd_vae_free(par);
        ditd_vae_free(one);
    }
    return checked;
}

/* Too small for the downsamples: refused on every rank, before any collective. */
static void run_refusal(ditd_comm *world)
{
    ditd_vae_config c;
    small_config(&c, 1);
    ditd_vae_opts o = {.max_h = 1, .max_w = 1, .max_image_h = 16, .max_image_w = 16, .comm = world};
    ditd_vae *par = NULL;
    TU_OK(ditd_vae_new_random(&c, &ditd_backend_cpu, &o, 5, &par));
    float x[3 * 3 * 16] = {0}, m[64];
    if (par)
        TU_CHECK_ERR(ditd_vae_encode(par, x, 1, 3, 16, 1, m, NULL), DITD_EINVAL, "image 16 x 3",
                     "downsample 2 of 3", "8 x 1");
    ditd_vae_free(par);
}

int main(int argc, char **argv)
{
    ditd_comm *world = NULL;
    if (ditd_comm_mpi_init(&argc, &argv) || ditd_comm_mpi_world(&world)) {
        fprintf(stderr, "MPI: %s\n", ditd_err_detail());
        return 1;
    }
    rank_ = ditd_comm_rank(world);
    G_ = ditd_comm_size(world);
    int fx = run_fixtures(world), rnd = run_random(world), pub = run_published(world);
    run_refusal(world);
    if (rank_ == 0) {
        TU_CHECK(fx >= 12, "ran %d fixture encode cases (want 12)", fx);
        TU_CHECK(rnd >= 18, "ran %d random-weight cases (want 18)", rnd);
        TU_CHECK(pub >= 2, "ran %d published-config cases (want 2)", pub);
        /* on 4 ranks (more on 2 or 3): automatic units (1 row) split every
         * latent of >= 4 rows (5 of the fixtures' 6: all but the 3-row one;
         * the 6 random ones), units of 2 the fixtures' two 11-row latents, of
         * 1 the 6 random ones, of 3 the 13- and 11-row random ones (4), and
         * the 2 published-config cases: 5 + 2 + 6 + 6 + 4 + 2 */
        TU_CHECK(split_cases >= 25, "%d cases split over the group (want >= 25)", split_cases);
        printf("%d fixture, %d random-weight, %d published-config cases; %d split over %d ranks\n", fx,
               rnd, pub, split_cases, G_);
    }
    int rc = rank_ == 0 ? tu_exit() : 0;
    ditd_comm_free(world);
    ditd_comm_mpi_finalize();
    return rc;
}
