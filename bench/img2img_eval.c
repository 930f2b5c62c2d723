/* img2img on a text-conditioned FLUX folder, timed as a request: the input
 * image resized to W x H (PIL's Lanczos, engine/core/image_resize.h),
 * VAE-encoded (the posterior draw from SEED), the schedule truncated by
 * STRENGTH, the loop, the decode to pixels; one rank, float32, the given
 * prompt embeddings. tools/bench_img2img_flux.py hands the same inputs to
 * Diffusers' FluxImg2ImgPipeline. Not a test.
 *
 *   img2img_eval MODEL_DIR IN_DIR OUT W H STEPS STRENGTH GUIDANCE REPEAT SEED
 *
 * IN_DIR holds image.npy (IH, IW, 3) (8-bit values as float32), emb.npy
 * (1, T, Dt) and pooled.npy (1, Dp). OUT.npy gets the first round's final
 * latents (1, C, h, w); a JSON line per round gives the seconds of the
 * request and of its parts (resize, encode, each step, decode). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/backend/backend.h"
#include "engine/core/error.h"
#include "engine/io/npy.h"
#include "engine/models/model.h"
#include "engine/core/image_resize.h"
#include "engine/pipeline/latent_image.h"
#include "engine/pipeline/pipeline.h"

#define MAX_STEPS 64

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static float *load(const char *dir, const char *name, int want_nd, int64_t *sh)
{
    char path[4200];
    float *d = NULL;
    int nd = 0;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    if (ditd_npy_read_f32(path, 4, &nd, sh, &d) || nd != want_nd) {
        fprintf(stderr, "%s: %s\n", path, nd != want_nd ? "wrong rank" : ditd_err_detail());
        free(d);
        return NULL;
    }
    return d;
}

typedef struct clock_steps {
    int n;
    double t[MAX_STEPS + 1];
} clock_steps;

static int on_step(void *ud, int step, int total, const float *x0, uint8_t *active)
{
    clock_steps *cs = ud;
    (void)step, (void)total, (void)x0, (void)active;
    if (cs->n < MAX_STEPS)
        cs->t[++cs->n] = now();
    return 0;
}

int main(int argc, char **argv)
{
    if (argc != 11) {
        fprintf(stderr, "usage: %s MODEL_DIR IN_DIR OUT W H STEPS STRENGTH GUIDANCE REPEAT SEED\n",
                argv[0]);
        return 2;
    }
    const char *dir = argv[1], *in = argv[2], *outp = argv[3];
    int W = atoi(argv[4]), H = atoi(argv[5]), steps = atoi(argv[6]), rounds = atoi(argv[9]);
    double strength = atof(argv[7]);
    float guidance = (float)atof(argv[8]);
    uint64_t seed = strtoull(argv[10], NULL, 10);
    int64_t si[4], se[4], sp[4];
    float *imf = load(in, "image.npy", 3, si), *emb = load(in, "emb.npy", 3, se),
          *pooled = load(in, "pooled.npy", 2, sp);
    if (!imf || !emb || !pooled || si[2] != 3 || steps < 1 || steps > MAX_STEPS || rounds < 1)
        return 2;
    const int IH = (int)si[0], IW = (int)si[1], T = (int)se[1];
    const size_t nin = (size_t)IH * IW * 3, npx = (size_t)H * W * 3;
    uint8_t *img = malloc(nin), *rs = malloc(npx), *pix = malloc(npx);
    for (size_t i = 0; img && i < nin; i++)
        img[i] = (uint8_t)imf[i];
    ditd_model_info info;
    ditd_pipeline *p = NULL;
    ditd_latent_image *li = NULL;
    int vs = 0;
    if (!img || !rs || !pix || ditd_model_info_load(dir, &info) ||
        ditd_pipeline_new(&info, &ditd_backend_cpu, 1, &p) ||
        ditd_latent_image_new(&info, &ditd_backend_cpu, NULL, 0, &li)) {
        fprintf(stderr, "%s: %s\n", dir, ditd_err_detail());
        return 1;
    }
    vs = info.vae_scale;
    const int h = H / vs, w = W / vs;
    if (ditd_pipeline_set_size(p, h, w, T) || ditd_latent_image_set_size(li, h, w)) {
        fprintf(stderr, "%dx%d: %s\n", W, H, ditd_err_detail());
        return 1;
    }
    const int C = li->Cl;
    const size_t numel = (size_t)C * h * w;
    float *il = malloc(numel * sizeof *il), *lat = malloc(numel * sizeof *lat);
    if (!il || !lat)
        return 1;
    ditd_text_embeds te = {.seq = emb, .pooled = pooled};
    ditd_gen_params gp = {.steps = steps, .sampler = p->sched_base.kind, .strength = strength};
    for (int r = 0; r < rounds; r++) {
        clock_steps cs = {0};
        double t0 = now();
        if (ditd_image_resize(img, IW, IH, 3, rs, W, H))
            goto fail;
        double t1 = now();
        if (ditd_latent_image_encode(li, rs, H, W, seed, il))
            goto fail;
        double t2 = now();
        ditd_gen_sample smp = {.seed = seed, .index = 0, .guidance = guidance, .true_cfg = 1.0f,
                               .image_latents = il};
        smp.cond.prompt = &te;
        cs.t[0] = now();
        if (ditd_pipeline_generate(p, &gp, 1, &smp, NULL, lat, NULL, on_step, &cs))
            goto fail;
        double t3 = now();
        if (ditd_latent_image_run(li, lat, 1, NULL, pix))
            goto fail;
        double t4 = now();
        if (r == 0) {
            char path[4200];
            int64_t shape[4] = {1, C, h, w};
            snprintf(path, sizeof path, "%s.npy", outp);
            if (ditd_npy_write_f32(path, 4, shape, lat))
                goto fail;
        }
        printf("{\"round\": %d, \"request_s\": %.4f, \"resize_s\": %.5f, \"encode_s\": %.4f, "
               "\"loop_s\": %.4f, \"decode_s\": %.4f, \"steps_s\": [", r, t4 - t0, t1 - t0,
               t2 - t1, t3 - t2, t4 - t3);
        for (int k = 0; k < cs.n; k++)
            printf("%s%.4f", k ? ", " : "", cs.t[k + 1] - cs.t[k]);
        printf("]}\n");
        fflush(stdout);
    }
    ditd_latent_image_free(li);
    ditd_pipeline_free(p);
    ditd_model_info_free(&info);
    free(img), free(rs), free(pix), free(il), free(lat), free(imf), free(emb), free(pooled);
    return 0;
fail:
    fprintf(stderr, "img2img: %s\n", ditd_err_detail());
    return 1;
}
