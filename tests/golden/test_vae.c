/* Golden: AutoencoderKL decode, encode and tiled decode against Diffusers
 * in float64 (tools/make_vae_fixtures.py), for every fixture VAE under
 * tests/fixtures/vae/ (4 and 16 latent channels, 2 and 3 blocks, f32, f16
 * and bf16 checkpoints, deprecated attention names, odd and non-square
 * latents). Bound: max|ours - ref| / max|ref| <= 1e-5 for every output.
 * The encoder's draw is checked as mean_ref + std_ref * the Philox noise. */
#include <dirent.h>
#include <jansson.h>
#include <string.h>

#include "engine/backend/backend.h"
#include "engine/core/philox.h"
#include "engine/io/npy.h"
#include "engine/models/vae/autoencoder_kl.h"
#include "tests/test_util.h"

#define TOL 1e-5

static float *load(const char *dir, json_t *c, const char *key, int64_t *shape)
{
    char path[4096];
    float *d = NULL;
    int nd = 0;
    const char *f = json_string_value(json_object_get(c, key));
    TU_CHECK(f != NULL, "%s: case without %s", dir, key);
    if (!f)
        return NULL;
    snprintf(path, sizeof path, "%s/expected/%s", dir, f);
    TU_OK(ditd_npy_read_f32(path, 4, &nd, shape, &d));
    TU_CHECK(nd == 4, "%s: %d dims", path, nd);
    return d;
}

static int run_vae(const char *dir)
{
    char path[4096];
    json_error_t jerr;
    json_t *root, *cases, *c;
    size_t i;
    int checked = 0;

    snprintf(path, sizeof path, "%s/expected/cases.json", dir);
    root = json_load_file(path, 0, &jerr);
    TU_CHECK(root != NULL, "%s: %s", path, jerr.text);
    if (!root)
        return 0;
    cases = json_object_get(root, "cases");
    snprintf(path, sizeof path, "%s/vae", dir);
    json_array_foreach(cases, i, c) {
        const char *kind = json_string_value(json_object_get(c, "kind"));
        int64_t zs[4] = {0}, os[4] = {0}, ms[4] = {0};
        ditd_vae *v = NULL;
        ditd_vae_opts o = {0};
        char what[512];
        if (strcmp(kind, "decode") == 0 || strcmp(kind, "tiled") == 0) {
            float *z = load(dir, c, "z", zs), *ref = load(dir, c, "out", os);
            o.max_h = (int)zs[2];
            o.max_w = (int)zs[3];
            o.tiling = strcmp(kind, "tiled") == 0;
            TU_OK(ditd_vae_load(path, &ditd_backend_cpu, &o, &v));
            size_t n = (size_t)(os[0] * os[1] * os[2] * os[3]);
            float *out = calloc(n, sizeof *out);
            if (v && z && ref && out) {
                TU_OK(ditd_vae_decode(v, z, (int)zs[0], (int)zs[2], (int)zs[3], out));
                snprintf(what, sizeof what, "%s %s (%lld, %lld, %lld, %lld)", dir + strlen(tu_fixtures()),
                         kind, (long long)zs[0], (long long)zs[1], (long long)zs[2], (long long)zs[3]);
                TU_CLOSE(what, out, ref, n, TOL);
                checked++;
                if (o.tiling) {
                    /* the tiles show: the whole-latent decode is not the tiled one */
                    ditd_vae *whole = NULL;
                    o.tiling = 0;
                    TU_OK(ditd_vae_load(path, &ditd_backend_cpu, &o, &whole));
                    if (whole) {
                        TU_OK(ditd_vae_decode(whole, z, (int)zs[0], (int)zs[2], (int)zs[3], out));
                        tu_err d = tu_compare(out, ref, n);
                        TU_CHECK(d.rel > 1e-3, "%s: the untiled decode is within %.3g of the tiled "
                                 "reference: the tiling was not exercised", what, d.rel);
                        ditd_vae_free(whole);
                    }
                }
            }
            free(z);
            free(ref);
            free(out);
        } else if (strcmp(kind, "encode") == 0) {
            int64_t ss[4];
            float *x = load(dir, c, "x", zs), *mref = load(dir, c, "mean", ms), *sref = load(dir, c, "std", ss);
            o.max_h = o.max_w = 1;
            o.max_image_h = (int)zs[2];
            o.max_image_w = (int)zs[3];
            TU_OK(ditd_vae_load(path, &ditd_backend_cpu, &o, &v));
            size_t n = (size_t)(ms[0] * ms[1] * ms[2] * ms[3]), per = n / (size_t)ms[0];
            float *mean = calloc(n, sizeof *mean), *draw = calloc(n, sizeof *draw);
            float *want = calloc(n, sizeof *want);
            if (v && x && mref && sref && mean && draw && want) {
                TU_CHECK(ditd_vae_latent_side(ditd_vae_config_of(v), (int)zs[2]) == ms[2] &&
                             ditd_vae_latent_side(ditd_vae_config_of(v), (int)zs[3]) == ms[3],
                         "latent side of %lld x %lld", (long long)zs[2], (long long)zs[3]);
                TU_OK(ditd_vae_encode(v, x, (int)zs[0], (int)zs[2], (int)zs[3], 1234, mean, draw));
                for (int64_t b = 0; b < ms[0]; b++) {
                    ditd_philox_normal(1234, (uint64_t)b, 0, per, want + b * per);
                    for (size_t e = 0; e < per; e++)
                        want[b * per + e] = (float)((double)mref[b * per + e] +
                                                    (double)sref[b * per + e] * want[b * per + e]);
                }
                snprintf(what, sizeof what, "%s encode mean (%lld, 3, %lld, %lld)", dir + strlen(tu_fixtures()),
                         (long long)zs[0], (long long)zs[2], (long long)zs[3]);
                TU_CLOSE(what, mean, mref, n, TOL);
                snprintf(what, sizeof what, "%s encode draw", dir + strlen(tu_fixtures()));
                TU_CLOSE(what, draw, want, n, TOL);
                checked++;
            }
            free(x);
            free(mref);
            free(sref);
            free(mean);
            free(draw);
            free(want);
        } else {
            TU_CHECK(0, "%s: unknown case kind %s", dir, kind);
        }
        ditd_vae_free(v);
    }
    json_decref(root);
    return checked;
}

int main(void)
{
    char dir[4096], sub[4400];
    struct dirent *e;
    DIR *d;
    int vaes = 0, cases = 0;

    snprintf(dir, sizeof dir, "%s/vae", tu_fixtures());
    d = opendir(dir);
    TU_CHECK(d != NULL, "cannot open %s", dir);
    while (d && (e = readdir(d))) {
        if (strncmp(e->d_name, "kl", 2) != 0)
            continue;
        snprintf(sub, sizeof sub, "%s/%s", dir, e->d_name);
        cases += run_vae(sub);
        vaes++;
    }
    if (d)
        closedir(d);
    /* the committed fixtures: 3 VAEs, 9 cases (a loop that ran nothing fails) */
    TU_CHECK(vaes >= 3 && cases >= 12, "ran %d VAEs, %d cases (want >= 3, >= 12)", vaes, cases);
    return tu_exit();
}
