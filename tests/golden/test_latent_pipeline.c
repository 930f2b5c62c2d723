/* Golden: a latent DiT end to end against Diffusers' own DiTPipeline
 * (tests/fixtures/vae/dit-latent, made by tools/make_vae_fixtures.py in
 * float64 with the pipeline's noise replaced by noise.npy): a tiny DiT with
 * 4 latent channels + a tiny AutoencoderKL, DDIM, guidance 4, two classes.
 * The VAE has a shift_factor (0.5), which DiTPipeline ignores: so must we.
 * Bounds: the latents handed to vae.decode (1 / scaling_factor * latents)
 * within 1e-4 relative; every 8-bit pixel within one level. */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/backend/backend.h"
#include "engine/io/npy.h"
#include "engine/models/model.h"
#include "engine/models/registry.h"
#include "engine/pipeline/latent_image.h"
#include "engine/pipeline/pipeline.h"
#include "tests/test_util.h"

int main(void)
{
    char dir[4096], path[4400];
    json_error_t jerr;
    json_t *cases;
    ditd_model_info info;
    ditd_pipeline *p = NULL;
    ditd_latent_image *li = NULL;
    float *noise = NULL, *dec_in = NULL, *pix_ref = NULL;
    int64_t ns[4], ds[4], ps[4];
    int nd;

    snprintf(dir, sizeof dir, "%s/vae/dit-latent", tu_fixtures());
    snprintf(path, sizeof path, "%s/expected/cases.json", dir);
    cases = json_load_file(path, 0, &jerr);
    TU_CHECK(cases != NULL, "%s: %s", path, jerr.text);
    if (!cases)
        return tu_exit();
    TU_OK(ditd_model_info_load(dir, &info));
    TU_CHECK(info.needs_vae && info.image_width == 16 && info.image_height == 16 &&
                 info.image_channels == 3 && info.vae_scale == 2 && info.vae != NULL,
             "model info: needs_vae %d, image %dx%d px, %d channels, vae scale %d (want 1, 16x16, 3, 2)",
             info.needs_vae, info.image_width, info.image_height, info.image_channels, info.vae_scale);
    snprintf(path, sizeof path, "%s/expected/noise.npy", dir);
    TU_OK(ditd_npy_read_f32(path, 4, &nd, ns, &noise));
    snprintf(path, sizeof path, "%s/expected/decode_in.npy", dir);
    TU_OK(ditd_npy_read_f32(path, 4, &nd, ds, &dec_in));
    snprintf(path, sizeof path, "%s/expected/pixels.npy", dir);
    TU_OK(ditd_npy_read_f32(path, 4, &nd, ps, &pix_ref));
    json_t *classes = json_object_get(cases, "classes");
    const int n = (int)json_array_size(classes);
    TU_CHECK(n == 2 && ns[0] == n && ps[0] == n && ps[3] == 3, "fixture shapes");
    TU_OK(ditd_pipeline_new(&info, &ditd_backend_cpu, n, &p));
    TU_OK(ditd_latent_image_new(&info, &ditd_backend_cpu, NULL, 0, &li));
    if (li)
        TU_CHECK(ditd_vae_config_of(li->vae)->has_shift_factor &&
                     ditd_vae_config_of(li->vae)->shift_factor == 0.5,
                 "the fixture VAE has shift_factor 0.5 (DiTPipeline must ignore it)");
    if (p && li && noise && dec_in && pix_ref && n == 2) {
        ditd_gen_params gp = {.steps = (int)json_integer_value(json_object_get(cases, "steps"))};
        ditd_gen_sample s[2] = {0};
        TU_OK(ditd_sampler_kind_from_str(json_string_value(json_object_get(cases, "sampler")), &gp.sampler));
        for (int i = 0; i < n; i++) {
            s[i].seed = 0;
            s[i].index = (uint64_t)i;
            s[i].cond.class_id = (int)json_integer_value(json_array_get(classes, (size_t)i));
            s[i].guidance = (float)json_number_value(json_object_get(cases, "guidance_scale"));
        }
        size_t zn = (size_t)(ns[0] * ns[1] * ns[2] * ns[3]);
        float *lat = malloc(zn * sizeof *lat);
        size_t pn = (size_t)(ps[0] * ps[1] * ps[2] * ps[3]);
        uint8_t *pix = calloc(pn, 1);
        TU_OK(ditd_pipeline_generate(p, &gp, n, s, noise, lat, NULL, NULL, NULL));
        /* what DiTPipeline hands to vae.decode */
        ditd_vae_unscale_dit(ditd_vae_config_of(li->vae), lat, zn);
        TU_CLOSE("latents / scaling_factor vs DiTPipeline", lat, dec_in, zn, 1e-4);
        /* the image, from our own latents */
        TU_OK(ditd_pipeline_generate(p, &gp, n, s, noise, lat, NULL, NULL, NULL));
        TU_OK(ditd_latent_image_run(li, lat, n, NULL, pix));
        TU_CHECK(li->H == ps[1] && li->W == ps[2] && li->Co == ps[3], "image %dx%dx%d", li->H, li->W,
                 li->Co);
        int worst = 0;
        size_t off = 0;
        for (size_t i = 0; i < pn; i++) {
            int d = abs((int)pix[i] - (int)lrintf(pix_ref[i]));
            if (d > worst) {
                worst = d;
                off++;
            }
        }
        size_t differ = 0;
        for (size_t i = 0; i < pn; i++)
            differ += pix[i] != (uint8_t)lrintf(pix_ref[i]);
        tu_checks++;
        if (worst > 1)
            tu_failures++;
        printf("%s pixels vs DiTPipeline: max difference %d level(s), %zu of %zu differ (tol 1)\n",
               worst > 1 ? "FAIL" : "ok  ", worst, differ, pn);
        (void)off;
        free(lat);
        free(pix);
    }
    /* Each pipeline's own unscale rule (model_index.json's _class_name): the
     * fixture VAE has shift_factor 0.5, which DiTPipeline ignores and
     * FluxPipeline adds after dividing by scaling_factor; the decode itself
     * is checked against Diffusers above and in test_vae. */
    if (li) {
        ditd_latent_rule r;
        const ditd_pipeline_class *pc = NULL;
        TU_CHECK(li->rule == DITD_LATENT_RULE_DIT, "DiTPipeline's rule: %s", ditd_latent_rule_name(li->rule));
        TU_OK(ditd_registry_find_pipeline("FluxPipeline", &pc));
        TU_CHECK(pc && pc->unscale == DITD_LATENT_RULE_SHIFTED, "FluxPipeline's rule: %s",
                 pc ? ditd_latent_rule_name(pc->unscale) : "?");
        TU_OK(ditd_latent_rule_from_str(ditd_latent_rule_name(DITD_LATENT_RULE_SHIFTED), &r));
        TU_CHECK(r == DITD_LATENT_RULE_SHIFTED, "rule name round trip");
        ditd_model_info fi = info;
        ditd_latent_image *lf = NULL;
        fi.pipeline = pc; /* the same folder decoded by FluxPipeline's rule */
        TU_OK(ditd_latent_image_new(&fi, &ditd_backend_cpu, NULL, 0, &lf));
        int e = ditd_registry_find_pipeline("FooPipeline", &pc);
        TU_CHECK(e == DITD_EUNSUPPORTED && strstr(ditd_err_detail(), "FooPipeline") &&
                     strstr(ditd_err_detail(), "FluxPipeline"),
                 "an unknown pipeline is refused by name: %s", ditd_err_detail());
        const size_t zn = (size_t)li->Cl * li->h * li->w, pn = (size_t)li->Co * li->H * li->W;
        float *z = malloc(zn * sizeof *z), *zs = malloc(zn * sizeof *zs);
        float *img = malloc(pn * sizeof *img);
        uint8_t *pd = malloc(pn), *pf = malloc(pn), *pm = malloc(pn);
        if (lf && z && zs && img && pd && pf && pm) {
            for (size_t i = 0; i < zn; i++)
                z[i] = (float)((double)(tu_rng() >> 11) / 9007199254740992.0 * 4.0 - 2.0);
            TU_OK(ditd_latent_image_run(li, z, 1, NULL, pd));
            TU_OK(ditd_latent_image_run(lf, z, 1, NULL, pf));
            /* FluxPipeline by hand: (z / sf) + shift in float32, then the decode */
            const ditd_vae_config *vc = ditd_vae_config_of(lf->vae);
            for (size_t i = 0; i < zn; i++)
                zs[i] = z[i] / (float)vc->scaling_factor + (float)vc->shift_factor;
            TU_OK(ditd_vae_decode(lf->vae, zs, 1, lf->h, lf->w, img));
            ditd_pipeline_to_pixels(img, lf->Co, lf->H, lf->W, pm);
            size_t same = 0, differ = 0;
            for (size_t i = 0; i < pn; i++) {
                same += pf[i] == pm[i];
                differ += pf[i] != pd[i];
            }
            TU_CHECK(same == pn, "FluxPipeline's rule: %zu of %zu pixels as (z / sf + shift) decoded",
                     same, pn);
            TU_CHECK(differ > pn / 10, "the shift matters: %zu of %zu pixels differ from DiTPipeline's",
                     differ, pn);
        }
        free(z), free(zs), free(img), free(pd), free(pf), free(pm);
        ditd_latent_image_free(lf);
    }
    ditd_latent_image_free(li);
    ditd_pipeline_free(p);
    ditd_model_info_free(&info);
    free(noise);
    free(dec_in);
    free(pix_ref);
    json_decref(cases);
    return tu_exit();
}
