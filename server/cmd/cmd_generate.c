/* `ditd generate`: one batch of images to PNG files, no server. Also the
 * way to reproduce a Diffusers run exactly: --latents gives the initial
 * noise, --save-latents writes the final latents. */
#include <ctype.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "engine/backend/backend.h"
#include "engine/parallel/comm.h"
#include "engine/core/error.h"
#include "engine/parallel/mesh.h"
#include "engine/models/model.h"
#include "engine/io/npy.h"
#include "engine/pipeline/pipeline.h"
#include "engine/pipeline/prompt_encoder.h"
#include "server/cmd/cli.h"
#include "engine/pipeline/image_cond.h"
#include "engine/pipeline/latent_image.h"
#include "engine/pipeline/latent_video.h"
#include "engine/io/video_mp4.h"
#include "server/cmd/cmd.h"
#include "server/common/image.h"
#include "server/common/image_in.h"
#include "server/common/lora_spec.h"

static void usage(FILE *f)
{
    char samplers[256];
    ditd_sampler_kind_list(" | ", samplers, sizeof samplers);
    fprintf(f,
            "usage: ditd generate [options] -o OUT.png\n"
            "\n"
            "  --model DIR          Diffusers model folder (default: the embedded model)\n"
            "  --class N|NAME       class models: class id or label from id2label (default 0)\n"
            "  --prompt TEXT        text models (FLUX, SD3): the prompt\n"
            "  --prompt-2 T, --prompt-3 T  the pipeline's prompt_2 / prompt_3 (FLUX: T5's;\n"
            "                       SD3: CLIP-G's, T5's); default: the prompt\n"
            "  --negative-prompt T  text models: the unconditional input of guidance\n"
            "                       (--negative-prompt-2/-3 as --prompt-2/-3)\n"
            "  --true-cfg S         FLUX: true_cfg_scale (> 1 with a negative prompt\n"
            "                       runs the unconditional pass; default 1)\n"
            "  --skip-layers L,...  SD3: skip-layer guidance on these blocks\n"
            "                       (--slg-scale S, --slg-start F, --slg-stop F: 2.8, 0.01, 0.2)\n"
            "  --size WxH           models that take any size: the image in pixels\n"
            "                       (default: the model's)\n"
            "  --max-sequence-length L  text models: T5 tokens (default: the pipeline's:\n"
            "                       FLUX 512, SD3 256)\n"
            "  --seed S             noise seed (default 0)\n"
            "  --steps K            denoising steps (default: the model's)\n"
            "  --guidance G         classifier-free guidance scale, <= 1 turns it off\n"
            "                       (default: the model's)\n"
            "  --guidance-2 G       two experts (Wan 2.2 A14B): guidance_scale_2, the low-noise\n"
            "                       expert's scale (default: --guidance)\n"
            "  --sampler NAME       %s (default: the model's)\n"
            "  --lora NAME=PATH     a LoRA adapter (.safetensors: PEFT/Diffusers or kohya names)\n"
            "                       applied unmerged at scale 1; repeatable (docs/lora.md)\n"
            "  --lora-scale NAME=S  the scale of adapter NAME (Diffusers' adapter_weights)\n"
            "  --lora-dir DIR       every *.safetensors file in DIR is an adapter too, named\n"
            "                       by its file name without .safetensors\n"
            "  --cache SPEC         step caching: METHOD[:key=value,...] with METHOD\n"
            "                       first_block_cache | taylorseer_cache | mag_cache | none\n"
            "                       and the Diffusers config's fields, e.g.\n"
            "                       first_block_cache:threshold=0.08 (docs/caching.md)\n"
            "  -n N                 images (1..64); N > 1 writes OUT-0.png, OUT-1.png, ...\n"
            "  --threads T          CPU threads (default: all)\n"
            "  --device D           cpu (default) | cuda: the GPU of this node-local rank\n"
            "  --dtype T            CPU weights: f32 | bf16 | auto (default: bf16 for a bf16\n"
            "                       checkpoint on a CPU with AVX512-BF16/AMX, else f32)\n"
            "                       (OMPI_COMM_WORLD_LOCAL_RANK, else 0)\n"
            "  --comm-timeout-ms MS cuda groups: a NCCL collective not done in MS aborts\n"
            "                       its communicator and fails the run (default 60000)\n"
            "  --latents FILE.npy   initial noise (N, C, h, w) float (latent shape), instead\n"
            "                       of the generator (with --image: the noise the pipeline\n"
            "                       mixes with the image's latents, as Diffusers' randn)\n"

            "  --save-latents FILE.npy  write the final latents (N, C, h, w) float32\n"
            "  --frames N           video models: frames of the clip (default: the model's;\n"
            "                       rounded to 1 + k x the VAE's temporal factor)\n"
            "  --save-frames        video models with -o OUT.mp4: also OUT-000.png, ...\n"
            "                       (-o OUT.png writes the frames only)\n"
            "  --vae-tiling         decode a latent model's image tile by tile (Diffusers' enable_tiling)\n"
            "  -o, --output OUT.png output file\n"
            "  -q, --quiet          no progress on stderr\n"
            "\n"
            "parallel (one group of G = C*R*U*T ranks: mpirun -np G ditd generate ...;\n"
            "the images are written by rank 0):\n"
            "  --ulysses-degree U   Ulysses sequence parallel (all-to-all over heads)\n"
            "  --ring-degree R      Ring attention (K/V blocks travel the ring)\n"
            "  --ring-rotate M      allgather (default) | p2p\n"
            "  --tp-degree T        Megatron tensor parallel\n"
            "  --cfg-degree C       1 or 2: conditional and unconditional halves apart\n",
            samplers);
    fputs("\nimage edits (docs/edits.md):\n"
          "  --image FILE         img2img (a row with img2img: FLUX): start from this PNG,\n"
          "                       JPEG or WebP, at the output size (the default --size;\n"
          "                       no resampling yet); on an image-to-video folder\n"
          "                       (WanImageToVideoPipeline) the clip's first frame, any size\n"
          "                       (resized to --size as Diffusers, lanczos)\n"
          "  --strength S         with --image: 0 < S <= 1 of the schedule is run from the\n"
          "                       noised image (default: the pipeline's, FLUX 0.6)\n",
          f);
}

typedef struct progress {
    int quiet;
    int tty;
} progress;

static int on_step(void *ud, int step, int total, const float *x0, uint8_t *active)
{
    progress *pr = ud;
    (void)x0;
    (void)active;
    if (pr->quiet)
        return 0;
    if (pr->tty)
        fprintf(stderr, "\rstep %d/%d%s", step, total, step == total ? "\n" : "");
    else if (step == total || step % 10 == 0)
        fprintf(stderr, "step %d/%d\n", step, total);
    return 0;
}

/* "WxH", each 1..16384 */
static int parse_size(const char *s, long *w, long *h)
{
    char *end;
    *w = strtol(s, &end, 10);
    if (end == s || (*end != 'x' && *end != 'X'))
        return ditd_err_set(DITD_EINVAL, "--size \"%s\": expected WxH, e.g. 1024x768", s);
    const char *s2 = end + 1;
    *h = strtol(s2, &end, 10);
    if (end == s2 || *end || *w < 1 || *h < 1 || *w > 16384 || *h > 16384)
        return ditd_err_set(DITD_EINVAL, "--size \"%s\": expected WxH, each 1..16384", s);
    return 0;
}

static int fail(const char *what, int err)
{
    const char *d = ditd_err_detail();
    fprintf(stderr, "ditd generate: %s: %s%s%s\n", what, ditd_strerror(err), *d ? ": " : "", d);
    return 1;
}

/* The prompts of each encoder, as given ("" / NULL: the first one). */
static ditd_prompt_texts prompt_texts(const char *const t[3])
{
    ditd_prompt_texts pt;
    for (int k = 0; k < 3; k++) {
        pt.texts[k] = t[k] ? t[k] : "";
        pt.lens[k] = strlen(pt.texts[k]);
    }
    return pt;
}

/* A text model's prompts (te[0]) and negative prompts (te[1], when the
 * pipeline row's rule runs the unconditional pass: want_neg), encoded on
 * the leader and broadcast to a group; every rank ends with the same
 * embeddings. *penc, *emb and *te are owned by the caller. */
static int encode_prompts(const ditd_model_info *info, const ditd_mesh *mesh,
                          const char *const prompts[3], const char *const negatives[3],
                          int want_neg, int L, ditd_prompt_encoder **penc, float **emb,
                          ditd_text_embeds **te)
{
    const size_t T = (size_t)ditd_pipeline_class_text_len(info->pipeline, L);
    const size_t one = T * (size_t)info->shapes.cond.text_dim + (size_t)info->shapes.cond.pooled_dim;
    const int has_pooled = info->shapes.cond.pooled_dim > 0;
    int32_t st = 0;
    int err = 0;
    if (!(*emb = malloc(2 * one * sizeof **emb)) || !(*te = calloc(2, sizeof **te)))
        return ditd_err_set(DITD_ENOMEM, "text embeddings");
    float *seq = *emb, *nseq = *emb + one;
    if (!mesh || ditd_mesh_is_leader(mesh)) {
        ditd_prompt_encoder_opts o = {.max_sequence_length = L};
        ditd_prompt_texts pt = prompt_texts(prompts), nt = prompt_texts(negatives);
        /* the encoders run on the CPU backend, whatever the denoiser's */
        if (!(err = ditd_prompt_encoder_new(info, &ditd_backend_cpu, &o, penc)) &&
            !(err = ditd_prompt_encoder_encode_n(*penc, &pt, L, seq,
                                                 seq + T * info->shapes.cond.text_dim)) &&
            want_neg)
            err = ditd_prompt_encoder_encode_n(*penc, &nt, L, nseq,
                                               nseq + T * info->shapes.cond.text_dim);
        st = err;
    }
    if (mesh && mesh->size > 1) { /* the leader's outcome, then its embeddings */
        int e2;
        if ((e2 = ditd_comm_bcast(mesh->group, &st, sizeof st, 0)) ||
            (!st && (e2 = ditd_comm_bcast(mesh->group, *emb, 2 * one * sizeof(float), 0))))
            return e2;
        if (st && !err)
            return ditd_err_set(st, "the leader could not encode the prompt (see its message)");
    }
    if (err)
        return err;
    (*te)[0] = (ditd_text_embeds){
        .seq = seq, .pooled = has_pooled ? seq + T * info->shapes.cond.text_dim : NULL};
    (*te)[1] = (ditd_text_embeds){
        .seq = nseq, .pooled = has_pooled ? nseq + T * info->shapes.cond.text_dim : NULL};
    return 0;
}

/* Decodes a video model's n clips (n, C, T, h, w) and writes each as
 * OUT.mp4 (OUT-i.mp4 for n > 1) and/or PNG frames OUT-000.png ...
 * (OUT-i-000.png). *vid: the frames, the caller frees. 0 or 1 (said). */
static int write_clips(ditd_latent_video *lv, const float *lat, int n, int T, int h, int w,
                       const char *out_path, int mp4, int save_frames, int fps, int quiet,
                       long seed, int steps, uint8_t **vid)
{
    const int s = ditd_latent_video_scale(lv), F = ditd_latent_video_frames(lv, T);
    const int H = h * s, W = w * s;
    const size_t frame = (size_t)H * W * 3, clip = (size_t)F * frame;
    int err;
    if (!(*vid = malloc((size_t)n * clip)))
        return fail("decoding", DITD_ENOMEM), 1;
    if ((err = ditd_latent_video_run(lv, lat, n, T, h, w, *vid)))
        return fail("decoding", err), 1;
    const char *dot = strrchr(out_path, '.');
    int stem = dot && !strchr(dot, '/') ? (int)(dot - out_path) : (int)strlen(out_path);
    for (int i = 0; i < n; i++) {
        char base[4096], path[4200];
        if (n == 1)
            snprintf(base, sizeof base, "%.*s", stem, out_path);
        else
            snprintf(base, sizeof base, "%.*s-%d", stem, out_path, i);
        const uint8_t *c = *vid + (size_t)i * clip;
        if (mp4) {
            snprintf(path, sizeof path, "%s.mp4", base);
            if ((err = ditd_video_write_mp4(path, c, F, W, H, fps)))
                return fail(path, err), 1;
            if (!quiet)
                fprintf(stderr, "wrote %s (%dx%d, %d frames at %d fps, seed %ld, %d steps)\n",
                        path, W, H, F, fps, seed, steps);
        }
        if (mp4 && !save_frames)
            continue;
        for (int f = 0; f < F; f++) {
            snprintf(path, sizeof path, "%s-%03d.png", base, f);
            if ((err = ditd_png_write_file(path, c + (size_t)f * frame, W, H, 3)))
                return fail(path, err), 1;
        }
        if (!quiet)
            fprintf(stderr, "wrote %s-000.png .. %s-%03d.png (%dx%d, seed %ld, %d steps)\n", base,
                    base, F - 1, W, H, seed, steps);
    }
    return 0;
}

/* --lora NAME=PATH (repeatable) and --lora-scale NAME=S, as given. */
typedef struct lora_args {
    int n;
    char name[DITD_LORA_MAX_SET][64];
    const char *path[DITD_LORA_MAX_SET];
    float scale[DITD_LORA_MAX_SET];
    int n_scale;
    char scale_name[DITD_LORA_MAX_SET][64];
    float scale_val[DITD_LORA_MAX_SET];
} lora_args;

/* NAME=VALUE into name (letters, digits, '_', '-', '.'; 1..63) and *val. */
static int name_eq(const char *arg, const char *opt, char name[64], const char **val)
{
    const char *eq = strchr(arg, '=');
    size_t len = eq ? (size_t)(eq - arg) : 0;
    if (!eq || len == 0 || len >= 64 || !eq[1])
        return ditd_err_set(DITD_EINVAL, "%s \"%s\": expected NAME=%s", opt, arg,
                            strcmp(opt, "--lora") ? "SCALE" : "PATH");
    for (size_t i = 0; i < len; i++)
        if (!isalnum((unsigned char)arg[i]) && !strchr("_-.", arg[i]))
            return ditd_err_set(DITD_EINVAL, "%s \"%s\": an adapter name takes letters, digits, "
                                             "'_', '-' and '.'",
                                opt, arg);
    memcpy(name, arg, len);
    name[len] = '\0';
    *val = eq + 1;
    return 0;
}

static int lora_arg(lora_args *la, const char *arg)
{
    const char *path;
    int err;
    if (la->n == DITD_LORA_MAX_SET)
        return ditd_err_set(DITD_EINVAL, "--lora: at most %d adapters", DITD_LORA_MAX_SET);
    if ((err = name_eq(arg, "--lora", la->name[la->n], &path)))
        return err;
    for (int i = 0; i < la->n; i++)
        if (!strcmp(la->name[i], la->name[la->n]))
            return ditd_err_set(DITD_EINVAL, "--lora: adapter name %s given twice", la->name[i]);
    la->path[la->n] = path;
    la->scale[la->n++] = 1.0f;
    return 0;
}

static int lora_scale_arg(lora_args *la, const char *arg)
{
    const char *v;
    double s;
    int err;
    if (la->n_scale == DITD_LORA_MAX_SET)
        return ditd_err_set(DITD_EINVAL, "--lora-scale: at most %d", DITD_LORA_MAX_SET);
    if ((err = name_eq(arg, "--lora-scale", la->scale_name[la->n_scale], &v)) ||
        (err = ditd_parse_double(v, -100, 100, "--lora-scale", &s)))
        return err;
    la->scale_val[la->n_scale++] = (float)s;
    return 0;
}

/* Opens and uploads every --lora for the pipeline's model into *set. On an
 * error, says so (naming the option and the file) and returns it; what was
 * uploaded is in *set for the caller to free. */
static int lora_load(const lora_args *la, ditd_pipeline *p, ditd_lora_set *set)
{
    int err;
    for (int i = 0; i < la->n; i++) {
        ditd_lora *l = NULL;
        ditd_lora_dev *d = NULL;
        if (p->den->n_lora_targets <= 0) {
            fprintf(stderr, "ditd generate: --lora %s: %s\n", la->name[i], p->den->lora_refusal);
            return DITD_EUNSUPPORTED;
        }
        if ((err = ditd_lora_open(la->path[i], la->name[i], p->den->lora_targets,
                                  p->den->n_lora_targets, &l)) ||
            (err = ditd_lora_dev_new(l, p->ops, p->den->n_lora_targets, &d))) {
            fprintf(stderr, "ditd generate: --lora %s=%s: %s: %s\n", la->name[i], la->path[i],
                    ditd_err_name(err), ditd_err_detail());
            ditd_lora_free(l);
            return err;
        }
        set->ad[set->n] = d;
        set->weight[set->n++] = la->scale[i];
        ditd_lora_free(l);
    }
    return 0;
}

int ditd_cmd_generate(int argc, char **argv)
{
    enum { O_MODEL = 256, O_CLASS, O_SEED, O_STEPS, O_GUIDANCE, O_SAMPLER, O_THREADS, O_LATENTS,
           O_SAVE, O_DEVICE, O_COMM_TIMEOUT, O_VAE_TILING, O_DTYPE, O_PROMPT, O_NEG, O_TRUE_CFG,
           O_SIZE, O_MAXSEQ, O_PROMPT2, O_PROMPT3, O_NEG2, O_NEG3, O_SKIP, O_SLG_SCALE,
           O_SLG_START, O_SLG_STOP, O_CACHE, O_FRAMES, O_SAVE_FRAMES, O_GUIDANCE2, O_LORA,
           O_LORA_SCALE, O_IMAGE, O_STRENGTH, O_LORA_DIR };
    static const struct option opts[] = {
        {"model", required_argument, 0, O_MODEL},     {"class", required_argument, 0, O_CLASS},
        {"seed", required_argument, 0, O_SEED},       {"steps", required_argument, 0, O_STEPS},
        {"guidance", required_argument, 0, O_GUIDANCE}, {"sampler", required_argument, 0, O_SAMPLER},
        {"guidance-2", required_argument, 0, O_GUIDANCE2},
        {"threads", required_argument, 0, O_THREADS}, {"latents", required_argument, 0, O_LATENTS},
        {"save-latents", required_argument, 0, O_SAVE},
        {"vae-tiling", no_argument, 0, O_VAE_TILING}, {"output", required_argument, 0, 'o'},
        {"quiet", no_argument, 0, 'q'},               {"help", no_argument, 0, 'h'},
        {"device", required_argument, 0, O_DEVICE},
        {"dtype", required_argument, 0, O_DTYPE},
        {"comm-timeout-ms", required_argument, 0, O_COMM_TIMEOUT},
        {"prompt", required_argument, 0, O_PROMPT},
        {"negative-prompt", required_argument, 0, O_NEG},
        {"true-cfg", required_argument, 0, O_TRUE_CFG},
        {"size", required_argument, 0, O_SIZE},
        {"max-sequence-length", required_argument, 0, O_MAXSEQ},
        {"prompt-2", required_argument, 0, O_PROMPT2},
        {"prompt-3", required_argument, 0, O_PROMPT3},
        {"negative-prompt-2", required_argument, 0, O_NEG2},
        {"negative-prompt-3", required_argument, 0, O_NEG3},
        {"skip-layers", required_argument, 0, O_SKIP},
        {"slg-scale", required_argument, 0, O_SLG_SCALE},
        {"slg-start", required_argument, 0, O_SLG_START},
        {"slg-stop", required_argument, 0, O_SLG_STOP},
        {"cache", required_argument, 0, O_CACHE},
        {"lora", required_argument, 0, O_LORA},
        {"lora-scale", required_argument, 0, O_LORA_SCALE},
        {"lora-dir", required_argument, 0, O_LORA_DIR},
        {"frames", required_argument, 0, O_FRAMES},
        {"save-frames", no_argument, 0, O_SAVE_FRAMES},
        {"image", required_argument, 0, O_IMAGE},
        {"strength", required_argument, 0, O_STRENGTH},
        DITD_LAYOUT_LONGOPTS,
        {0, 0, 0, 0}};
    ditd_layout layout = DITD_LAYOUT_SINGLE;
    const char *model_dir = NULL, *class_str = NULL, *sampler_str = NULL, *latents_path = NULL;
    const char *prompts[3] = {NULL, NULL, NULL}, *negatives[3] = {NULL, NULL, NULL};
    const char *skip_str = NULL, *image_path = NULL;
    double strength = -1;
    ditd_image in_img = {0}; /* --image, decoded */
    float *img_lat = NULL;   /* --image: its latents (C, h, w) */
    ditd_image_cond *icond = NULL; /* --image on an image-to-video folder */
    float *i2v_cond = NULL, *i2v_emb = NULL;
    double true_cfg = 1.0, slg_scale = -1, slg_start = -1, slg_stop = -1;
    long size_w = 0, size_h = 0, max_seq = 0;
    ditd_prompt_encoder *penc = NULL; /* text models, on the leader */
    float *emb = NULL;                /* text models: (2n, L Dt + Dp) */
    ditd_text_embeds *te = NULL;
    const char *save_path = NULL, *out_path = NULL, *dtype_str = "auto";
    int vae_tiling = 0;
    ditd_latent_image *li = NULL; /* latent models: the VAE decode */
    ditd_latent_video *lv = NULL; /* video models: the video VAE, on the leader */
    uint8_t *vid = NULL;          /* video models: (n, F, H, W, 3) frames */
    long frames = 0;
    int save_frames = 0;
    long seed = 0, steps = -1, n = 1, threads = 0, comm_timeout_ms = DITD_NCCL_DEFAULT_TIMEOUT_MS;
    ditd_device device = DITD_DEVICE_CPU;
    double guidance = -1, guidance_2 = -1;
    progress pr = {0};
    ditd_cache_config cache_cfg; /* --cache (method none: off) */
    lora_args la = {0};          /* --lora, --lora-scale */
    const char *lora_dir = NULL; /* --lora-dir */
    static ditd_lora_specs dir_specs; /* its files (the paths la.path points at) */
    ditd_lora_set lora_set = {0};
    int c, err, rc = 1;

    ditd_cache_config_default(DITD_CACHE_NONE, &cache_cfg);

    pr.tty = isatty(STDERR_FILENO);
    optind = 1;
    while ((c = getopt_long(argc, argv, "o:n:qh", opts, NULL)) != -1) {
        err = 0;
        switch (c) {
        case O_MODEL: model_dir = optarg; break;
        case O_CLASS: class_str = optarg; break;
        case O_SEED: err = ditd_parse_long(optarg, 0, 0x7fffffffffffffffL, "--seed", &seed); break;
        case O_STEPS: err = ditd_parse_long(optarg, 1, 1000, "--steps", &steps); break;
        case O_GUIDANCE: err = ditd_parse_double(optarg, 0, 100, "--guidance", &guidance); break;
        case O_GUIDANCE2:
            err = ditd_parse_double(optarg, 0, 100, "--guidance-2", &guidance_2);
            break;
        case O_SAMPLER: sampler_str = optarg; break;
        case O_THREADS: err = ditd_parse_long(optarg, 1, 1024, "--threads", &threads); break;
        case O_LATENTS: latents_path = optarg; break;
        case O_SAVE: save_path = optarg; break;
        case O_VAE_TILING: vae_tiling = 1; break;
        case O_DEVICE: err = ditd_device_from_str(optarg, &device); break;
        case O_DTYPE: dtype_str = optarg; break;
        case O_PROMPT: prompts[0] = optarg; break;
        case O_PROMPT2: prompts[1] = optarg; break;
        case O_PROMPT3: prompts[2] = optarg; break;
        case O_NEG: negatives[0] = optarg; break;
        case O_NEG2: negatives[1] = optarg; break;
        case O_NEG3: negatives[2] = optarg; break;
        case O_SKIP: skip_str = optarg; break;
        case O_SLG_SCALE: err = ditd_parse_double(optarg, 0, 100, "--slg-scale", &slg_scale); break;
        case O_SLG_START: err = ditd_parse_double(optarg, 0, 1, "--slg-start", &slg_start); break;
        case O_SLG_STOP: err = ditd_parse_double(optarg, 0, 1, "--slg-stop", &slg_stop); break;
        case O_CACHE:
            if ((err = ditd_cache_config_parse(optarg, &cache_cfg))) {
                char why[512];
                snprintf(why, sizeof why, "%s", ditd_err_detail());
                ditd_err_set(err, "--cache: %s", why);
            }
            break;
        case O_FRAMES: err = ditd_parse_long(optarg, 1, 100000, "--frames", &frames); break;
        case O_LORA: err = lora_arg(&la, optarg); break;
        case O_LORA_SCALE: err = lora_scale_arg(&la, optarg); break;
        case O_LORA_DIR: lora_dir = optarg; break;
        case O_SAVE_FRAMES: save_frames = 1; break;
        case O_IMAGE: image_path = optarg; break;
        case O_STRENGTH: err = ditd_parse_double(optarg, 0, 1, "--strength", &strength); break;
        case O_TRUE_CFG: err = ditd_parse_double(optarg, 0, 100, "--true-cfg", &true_cfg); break;
        case O_SIZE: err = parse_size(optarg, &size_w, &size_h); break;
        case O_MAXSEQ: err = ditd_parse_long(optarg, 1, 4096, "--max-sequence-length", &max_seq); break;
        case O_COMM_TIMEOUT:
            err = ditd_parse_long(optarg, 100, 86400000, "--comm-timeout-ms", &comm_timeout_ms);
            break;
        case 'n': err = ditd_parse_long(optarg, 1, 64, "-n", &n); break;
        case 'o': out_path = optarg; break;
        case 'q': pr.quiet = 1; break;
        case 'h': usage(stdout); return 0;
        default:
            if (ditd_layout_option(c, optarg, &layout, &err))
                break;
            usage(stderr);
            return 2;
        }
        if (err) {
            fprintf(stderr, "ditd generate: %s\n", ditd_err_detail());
            return 2;
        }
    }
    if (lora_dir) { /* after the --lora flags, in file-name order */
        dir_specs.n = 0;
        err = ditd_lora_specs_add_dir(&dir_specs, lora_dir, "--lora-dir");
        for (int i = 0; !err && i < dir_specs.n; i++) {
            for (int k = 0; !err && k < la.n; k++)
                if (!strcmp(la.name[k], dir_specs.v[i].name))
                    err = ditd_err_set(DITD_EINVAL, "--lora-dir %s: adapter name %s given twice "
                                       "(%s and %s)", lora_dir, la.name[k], la.path[k],
                                       dir_specs.v[i].path);
            if (!err && la.n == DITD_LORA_MAX_SET)
                err = ditd_err_set(DITD_EINVAL, "--lora-dir %s: at most %d adapters in all",
                                   lora_dir, DITD_LORA_MAX_SET);
            if (!err) {
                snprintf(la.name[la.n], sizeof la.name[la.n], "%s", dir_specs.v[i].name);
                la.path[la.n] = dir_specs.v[i].path;
                la.scale[la.n++] = 1.0f;
            }
        }
        if (err) {
            fprintf(stderr, "ditd generate: %s\n", ditd_err_detail());
            return 2;
        }
    }
    for (int i = 0; i < la.n_scale; i++) {
        int k = 0;
        while (k < la.n && strcmp(la.name[k], la.scale_name[i]))
            k++;
        if (k == la.n) {
            fprintf(stderr, "ditd generate: --lora-scale %s: no --lora %s=PATH given\n",
                    la.scale_name[i], la.scale_name[i]);
            return 2;
        }
        la.scale[k] = la.scale_val[i];
    }
    if (optind < argc) {
        fprintf(stderr, "ditd generate: unexpected argument \"%s\"\n", argv[optind]);
        return 2;
    }
    if (!out_path && !save_path) {
        fprintf(stderr, "ditd generate: give -o OUT.png (or --save-latents FILE.npy)\n");
        return 2;
    }
    if (strength >= 0 && !image_path) {
        fprintf(stderr, "ditd generate: --strength needs --image\n");
        return 2;
    }
    if (!model_dir && !(model_dir = ditd_default_model_dir())) {
        fprintf(stderr, "ditd generate: no --model given and no embedded default model\n");
        return 2;
    }

    /* A group: every rank of the world (mpirun -np G) is one rank of it. */
    ditd_comm *world = NULL;
    ditd_mesh *mesh = NULL;
    int leader = 1, use_mpi = ditd_comm_launched_by_mpi() || ditd_layout_size(&layout) > 1;
    if (use_mpi) {
        if ((err = ditd_comm_mpi_init(NULL, NULL)) || (err = ditd_comm_mpi_world(&world)))
            return fail("MPI", err);
        if ((err = ditd_mesh_new(world, &layout, &mesh))) {
            fail("layout", err);
            ditd_comm_free(world);
            ditd_comm_mpi_finalize();
            return 2;
        }
        leader = ditd_mesh_is_leader(mesh);
        if (!leader)
            pr.quiet = 1;
    }

    ditd_model_info info;
    ditd_pipeline *pipe = NULL;
    ditd_gen_params gp;
    ditd_gen_sample *samples = NULL;
    float *noise = NULL, *out = NULL;
    uint8_t *pix = NULL;
    int class_id;
    /* the device: for cuda this rank's GPU (cudaSetDevice(local rank))
     * before the backend starts; a group on GPUs moves its collectives to
     * NCCL (every rank calls this; they agree first, so none is left in
     * the bootstrap) */
    const ditd_backend_ops *ops = ditd_backend_open(device);
    if (!ops)
        fprintf(stderr, "ditd generate: %s\n", ditd_err_detail());
    else if (device == DITD_DEVICE_CPU && leader && !pr.quiet) /* docs/cpu.md */
        fprintf(stderr, "ditd: cpu GEMMs: %s\n", ditd_backend_cpu_gemm_info());
    if (device != DITD_DEVICE_CPU && mesh && mesh->size > 1 &&
        (err = ditd_mesh_use_nccl(mesh, ops != NULL, (int)comm_timeout_ms)) && ops) {
        fail("NCCL", err);
        ops = NULL;
    }
    if (!ops) {
        ditd_mesh_free(mesh);
        ditd_comm_free(world);
        if (use_mpi)
            ditd_comm_mpi_finalize();
        return 1;
    }

    if ((err = ditd_model_info_load(model_dir, &info))) {
        fail(model_dir, err);
        ditd_mesh_free(mesh);
        ditd_comm_free(world);
        if (use_mpi)
            ditd_comm_mpi_finalize();
        return 1;
    }
    int text = info.shapes.cond.kind == DITD_COND_TEXT;
    class_id = 0;
    /* video models (WanPipeline): the clip's frames, rounded as the
     * pipeline rounds them; -o OUT.mp4 and/or PNG frames */
    const int video = info.frames > 0;
    const char *ext = out_path ? strrchr(out_path, '.') : NULL;
    if (ext && strchr(ext, '/'))
        ext = NULL;
    const int want_mp4 = video && ext && !strcasecmp(ext, ".mp4");
    int nfr = 1, lat_t = 1;
    if (!video && (frames > 1 || save_frames)) {
        fprintf(stderr, "ditd generate: --frames/--save-frames: %s makes images, not clips\n",
                info.name);
        goto done_info;
    }
    if (video) {
        nfr = frames ? ditd_model_round_frames(&info, (int)frames) : info.frames;
        if (ditd_model_check_frames(&info, nfr)) {
            fprintf(stderr, "ditd generate: --frames: %s\n", ditd_err_detail());
            goto done_info;
        }
        if (frames && nfr != frames && leader && !pr.quiet)
            fprintf(stderr, "ditd generate: --frames %ld rounded to %d (1 + k x %d, as %s)\n",
                    frames, nfr, info.frame_step, info.pipeline->name);
        lat_t = ditd_model_latent_frames(&info, nfr);
        if (vae_tiling) {
            fprintf(stderr, "ditd generate: --vae-tiling: image models only (a clip is decoded "
                    "frame chunk by frame chunk)\n");
            goto done_info;
        }
        if (out_path && !want_mp4 && !(ext && !strcasecmp(ext, ".png"))) {
            fprintf(stderr, "ditd generate: -o %s: %s writes clips: -o OUT.mp4, or -o OUT.png for "
                    "PNG frames OUT-000.png, ...\n", out_path, info.name);
            goto done_info;
        }
        if (want_mp4 && !ditd_video_mp4_available()) {
            fprintf(stderr, "ditd generate: -o %s: this ditd is built without FFmpeg; write PNG "
                    "frames with -o OUT.png instead\n", out_path);
            goto done_info;
        }
    }
    if (text && class_str) {
        fprintf(stderr, "ditd generate: --class: %s takes a text --prompt, not a class\n", info.name);
        goto done_info;
    }
    const ditd_pipeline_class *pc = info.pipeline;
    const char *prompt = prompts[0], *negative = negatives[0];
    if (!text && (prompt || prompts[1] || prompts[2] || negative || negatives[1] ||
                  negatives[2] || max_seq)) {
        fprintf(stderr, "ditd generate: --prompt/--negative-prompt/--max-sequence-length: %s is "
                "class-conditional: use --class\n", info.name);
        goto done_info;
    }
    if (text && !prompt) {
        fprintf(stderr, "ditd generate: %s is a text model: give --prompt TEXT\n", info.name);
        goto done_info;
    }
    for (int k = 1; k < 3; k++)
        if ((prompts[k] || negatives[k]) && k >= ditd_pipeline_class_prompts(pc)) {
            fprintf(stderr, "ditd generate: --prompt-%d/--negative-prompt-%d: %s takes %d prompt(s)\n",
                    k + 1, k + 1, pc->name, ditd_pipeline_class_prompts(pc));
            goto done_info;
        }
    /* --image: the folder's edit row (FluxPipeline: FluxImg2ImgPipeline) gives
     * the defaults; the image sets the size */
    const ditd_pipeline_class *erow = image_path ? pc->img2img : NULL;
    const int i2v = pc->image_to_video; /* WanImageToVideoPipeline: --image is the first frame */
    if (i2v && !image_path) {
        fprintf(stderr, "ditd generate: %s (%s) makes a clip from an image: give --image FILE\n",
                info.name, pc->name);
        goto done_info;
    }
    if (i2v && strength >= 0) {
        fprintf(stderr, "ditd generate: --strength: %s starts from noise (the image is the "
                "condition, not img2img)\n", pc->name);
        goto done_info;
    }
    if (image_path && !i2v && (!erow || video || !info.needs_vae)) {
        fprintf(stderr, "ditd generate: --image: %s (%s) takes no input image (img2img: a "
                "pipeline row with img2img, e.g. FLUX)\n", info.name, pc->name);
        goto done_info;
    }
    if (image_path) {
        FILE *f = fopen(image_path, "rb");
        uint8_t *buf = NULL;
        size_t len = 0;
        if (f && fseek(f, 0, SEEK_END) == 0) {
            long l = ftell(f);
            if (l >= 0 && (size_t)l <= DITD_IMAGE_MAX_BYTES_DEFAULT && fseek(f, 0, SEEK_SET) == 0 &&
                (buf = malloc((size_t)l + 1)) && fread(buf, 1, (size_t)l, f) == (size_t)l)
                len = (size_t)l;
        }
        if (f)
            fclose(f);
        err = len ? ditd_image_decode(buf, len, NULL, &in_img)
                  : ditd_err_set(DITD_EIO, "cannot read %s (at most %zu bytes)", image_path,
                                 DITD_IMAGE_MAX_BYTES_DEFAULT);
        free(buf);
        if (err) {
            fprintf(stderr, "ditd generate: --image %s: %s\n", image_path, ditd_err_detail());
            goto done_info;
        }
        if (in_img.channels == 4) { /* RGBA: the color, as PIL's convert("RGB") */
            size_t np = (size_t)in_img.width * in_img.height;
            for (size_t i = 0; i < np; i++)
                memmove(in_img.pixels + 3 * i, in_img.pixels + 4 * i, 3);
            in_img.channels = 3;
        }
        if (!size_w) {
            size_w = in_img.width;
            size_h = in_img.height;
        } else if (i2v) { /* resized to the clip as VideoProcessor.preprocess (lanczos) */
        } else if (size_w != in_img.width || size_h != in_img.height) {
            fprintf(stderr, "ditd generate: --image %s is %dx%d, --size %ldx%ld: resampling the "
                    "input is not done yet (give the image at the output size)\n", image_path,
                    in_img.width, in_img.height, size_w, size_h);
            goto done_info;
        }
        if (i2v)
            ; /* the row's own defaults */
        else {
            if (steps <= 0 && erow != pc)
                steps = erow->default_steps;
            if (guidance < 0 && erow != pc)
                guidance = erow->default_guidance;
            if (strength < 0)
                strength = erow->default_strength;
        }
        if (!info.resizable && (size_w != info.image_width || size_h != info.image_height)) {
            fprintf(stderr, "ditd generate: --image %s is %ldx%ld; %s makes %dx%d\n", image_path,
                    size_w, size_h, info.name, info.image_width, info.image_height);
            goto done_info;
        }
    }
    if (true_cfg != 1.0 && pc->guidance != DITD_GUIDANCE_TRUE_CFG) {
        fprintf(stderr, "ditd generate: --true-cfg: %s guides with --guidance\n", pc->name);
        goto done_info;
    }
    if (guidance_2 >= 0 && !info.transformer_2_dir[0]) {
        fprintf(stderr, "ditd generate: --guidance-2: %s has one transformer (guidance_scale_2 "
                "needs transformer_2 and boundary_ratio in model_index.json)\n", info.name);
        goto done_info;
    }
    memset(&gp, 0, sizeof gp);
    if (skip_str) {
        if (!(pc->request & DITD_REQ_SKIP_LAYERS)) {
            fprintf(stderr, "ditd generate: --skip-layers: %s has no skip-layer guidance\n", pc->name);
            goto done_info;
        }
        char *end;
        const char *q = skip_str;
        while (*q) {
            long v = strtol(q, &end, 10);
            if (end == q || v < 0 || v > 1000 || gp.n_skip_layers == DITD_MAX_SKIP_LAYERS ||
                (*end && *end != ',')) {
                fprintf(stderr, "ditd generate: --skip-layers \"%s\": up to %d block indices, "
                        "comma-separated\n", skip_str, DITD_MAX_SKIP_LAYERS);
                goto done_info;
            }
            gp.skip_layers[gp.n_skip_layers++] = (int)v;
            q = *end ? end + 1 : end;
        }
    } else if (slg_scale >= 0 || slg_start >= 0 || slg_stop >= 0) {
        fprintf(stderr, "ditd generate: --slg-scale/--slg-start/--slg-stop need --skip-layers\n");
        goto done_info;
    }
    gp.slg_scale = slg_scale >= 0 ? (float)slg_scale : pc->slg_scale;
    gp.slg_start = slg_start >= 0 ? (float)slg_start : pc->slg_start;
    gp.slg_stop = slg_stop >= 0 ? (float)slg_stop : pc->slg_stop;
    if (text && max_seq > info.max_sequence_length) {
        fprintf(stderr, "ditd generate: --max-sequence-length %ld (1..%d)\n", max_seq,
                info.max_sequence_length);
        goto done_info;
    }
    if (!max_seq)
        max_seq = info.default_max_sequence_length;
    if (size_w && ditd_model_check_size(&info, (int)size_w, (int)size_h)) {
        fprintf(stderr, "ditd generate: --size: %s\n", ditd_err_detail());
        goto done_info;
    }
    if (!text && (err = ditd_model_class_from_str(&info, class_str ? class_str : "0", &class_id))) {
        fprintf(stderr, "ditd generate: --class: %s; classes:", ditd_err_detail());
        for (int i = 0; i < info.num_classes && i < 50; i++)
            fprintf(stderr, "%s %d \"%s\"", i ? ";" : "", i, info.labels[i]);
        fputc('\n', stderr);
        goto done_info;
    }
    gp.steps = steps > 0 ? (int)steps : info.default_steps;
    if (!sampler_str && info.default_sampler[0])
        sampler_str = info.default_sampler;
    ditd_dtype ckpt;
    const ditd_backend_ops *wops; /* the denoiser's: its weights' dtype */
    if ((err = ditd_model_checkpoint_dtype(info.transformer_dir, &ckpt))) {
        fail(info.transformer_dir, err);
        goto done_info;
    }
    if (!(wops = ditd_backend_for_weights(ops, dtype_str, ckpt))) {
        fprintf(stderr, "ditd generate: %s\n", ditd_err_detail());
        goto done_info;
    }
    if ((err = ditd_pipeline_new_group(&info, wops, (int)n, mesh, &pipe))) {
        fail("loading the model", err);
        goto done_info;
    }
    if ((out_path || image_path) && info.needs_vae && !video &&
        (err = ditd_latent_image_new(&info, &ditd_backend_cpu, mesh ? mesh->group : NULL, vae_tiling,
                                     &li))) { /* on the CPU, whatever the denoiser's device */
        fail("loading the VAE", err);
        goto done;
    }
    if (video) { /* the clip: frames x the size asked for, else the model's */
        int sh = (size_h ? (int)size_h : info.image_height) / info.vae_scale;
        int sw = (size_w ? (int)size_w : info.image_width) / info.vae_scale;
        if ((err = ditd_pipeline_set_video_size(
                 pipe, lat_t, sh, sw, text ? ditd_pipeline_class_text_len(pc, (int)max_seq) : 0))) {
            fail("--frames/--size", err);
            goto done;
        }
        if (out_path && leader &&
            (err = ditd_latent_video_new(&info, &ditd_backend_cpu, sh, sw, &lv))) {
            fail("loading the VAE", err);
            goto done;
        }
    } else if (info.resizable) { /* the size asked for, else the model's default */
        int sh = (size_h ? (int)size_h : info.image_height) / info.vae_scale;
        int sw = (size_w ? (int)size_w : info.image_width) / info.vae_scale;
        if ((err = ditd_pipeline_set_size(
                 pipe, sh, sw, text ? ditd_pipeline_class_text_len(pc, (int)max_seq) : 0)) ||
            (li && (err = ditd_latent_image_set_size(li, sh, sw)))) {
            fail("--size", err);
            goto done;
        }
    }
    float g_eff = guidance >= 0 ? (float)guidance : info.default_guidance;
    int want_neg = ditd_pipeline_class_needs_negative(pc, g_eff, (float)true_cfg, negative != NULL,
                                                      info.shapes.guidance_embed);
    if (text && (err = encode_prompts(&info, mesh, prompts, negatives, want_neg, (int)max_seq,
                                      &penc, &emb, &te))) {
        fail("encoding the prompt", err);
        goto done;
    }
    if ((err = lora_load(&la, pipe, &lora_set)))
        goto done;
    gp.sampler = pipe->sched_base.kind;
    if (sampler_str && (err = ditd_sampler_kind_from_str(sampler_str, &gp.sampler))) {
        fail("--sampler", err);
        goto done;
    }
    ops->set_threads((int)threads);

    /* latents (n, C, h, w); for a pixel-space model they are the image */
    int C = pc->image_to_video ? pipe->shapes.out_channels : pipe->shapes.in_channels;
    int LH = pipe->shapes.height, LW = pipe->shapes.width;
    size_t numel = video ? pipe->numel : ditd_denoiser_numel_in(&pipe->shapes);
    if (latents_path && video) { /* (n, C, T, h, w) */
        int nd;
        int64_t shape[8];
        if ((err = ditd_npy_read_f32(latents_path, 8, &nd, shape, &noise))) {
            fail("--latents", err);
            goto done;
        }
        if (nd != 5 || shape[0] != n || shape[1] != C || shape[2] != lat_t || shape[3] != LH ||
            shape[4] != LW) {
            fprintf(stderr, "ditd generate: --latents: %s has %d dims, expected (%ld, %d, %d, %d, "
                    "%d) (n, C, latent frames, h, w)\n", latents_path, nd, n, C, lat_t, LH, LW);
            goto done;
        }
    } else if (latents_path) {
        int nd;
        int64_t shape[8];
        if ((err = ditd_npy_read_f32(latents_path, 8, &nd, shape, &noise))) {
            fail("--latents", err);
            goto done;
        }
        if (nd != 4 || shape[0] != n || shape[1] != C || shape[2] != LH || shape[3] != LW) {
            fprintf(stderr,
                    "ditd generate: --latents: %s has %d dims (%lld, %lld, %lld, %lld), expected "
                    "(%ld, %d, %d, %d)\n",
                    latents_path, nd, (long long)shape[0], nd > 1 ? (long long)shape[1] : 0LL,
                    nd > 2 ? (long long)shape[2] : 0LL, nd > 3 ? (long long)shape[3] : 0LL, n, C,
                    LH, LW);
            goto done;
        }
    }
    if (image_path && pc->image_to_video) { /* the condition and image embeddings, every rank */
        int W = LW * info.vae_scale, H = LH * info.vae_scale;
        if ((err = ditd_image_cond_new(&info, &ditd_backend_cpu, W, H, &icond)) ||
            !(i2v_cond = malloc(ditd_image_cond_numel(icond, nfr, W, H) * sizeof(float))) ||
            (ditd_image_cond_embeds_numel(icond) &&
             !(i2v_emb = malloc(ditd_image_cond_embeds_numel(icond) * sizeof(float))))) {
            fail("the image condition", err ? err : DITD_ENOMEM);
            goto done;
        }
        if ((err = ditd_image_cond_run(icond, in_img.pixels, in_img.width, in_img.height, NULL, 0,
                                       0, nfr, W, H, i2v_cond, i2v_emb))) {
            fail("encoding --image", err);
            goto done;
        }
        if (leader && !pr.quiet)
            fprintf(stderr, "image-to-video: %s %dx%d as the first of %d frames at %dx%d (%s)\n",
                    image_path, in_img.width, in_img.height, nfr, W, H, pc->name);
    } else if (image_path) { /* every rank encodes (one rank's work, the same latents) */
        int st = 0;
        gp.strength = strength;
        if ((err = ditd_pipeline_strength_start(gp.steps, strength, &st))) {
            fail("--strength", err);
            goto done;
        }
        if (!(img_lat = malloc(numel * sizeof *img_lat))) {
            fprintf(stderr, "ditd generate: out of memory\n");
            goto done;
        }
        if ((err = ditd_latent_image_encode(li, in_img.pixels, in_img.height, in_img.width,
                                            (uint64_t)seed, img_lat))) {
            fail("encoding --image", err);
            goto done;
        }
        if (leader && !pr.quiet)
            fprintf(stderr, "img2img: %s %dx%d, strength %g: %d of %d steps (%s)\n", image_path,
                    in_img.width, in_img.height, strength, gp.steps - st, gp.steps, erow->name);
    }
    samples = calloc((size_t)n, sizeof *samples);
    out = malloc((size_t)n * numel * sizeof *out);
    pix = malloc(li ? (size_t)li->Co * li->H * li->W : numel);
    if (!samples || !out || !pix) {
        fprintf(stderr, "ditd generate: out of memory\n");
        goto done;
    }
    for (long i = 0; i < n; i++) {
        samples[i].seed = (uint64_t)seed;
        samples[i].index = (uint64_t)i;
        samples[i].cond.class_id = class_id;
        if (text) {
            samples[i].cond.prompt = &te[0];
            samples[i].cond.negative = want_neg ? &te[1] : NULL;
        }
        samples[i].guidance = guidance >= 0 ? (float)guidance : info.default_guidance;
        samples[i].true_cfg = (float)true_cfg;
        samples[i].has_guidance_2 = guidance_2 >= 0;
        samples[i].guidance_2 = (float)guidance_2;
        samples[i].loras = lora_set.n ? &lora_set : NULL;
        samples[i].image_latents = img_lat;
        samples[i].video_cond = i2v_cond;
        samples[i].image_embeds = i2v_emb;
    }
    if ((err = ditd_pipeline_set_cache(pipe, &cache_cfg))) { /* every rank alike */
        fail("--cache", err);
        goto done;
    }
    if ((err = ditd_pipeline_generate(pipe, &gp, (int)n, samples, noise, out, NULL,
                                      leader ? on_step : NULL, &pr))) {
        fail("generating", err);
        goto done;
    }
    for (long i = 0; leader && !pr.quiet && cache_cfg.method != DITD_CACHE_NONE && i < n; i++) {
        ditd_cache_stats st;
        ditd_pipeline_cache_stats(pipe, (int)i, &st);
        fprintf(stderr, "image %ld: %s skipped %d of %d steps, %ld of %ld block evaluations\n", i,
                ditd_cache_method_name(cache_cfg.method), st.steps_skipped, st.steps,
                st.evals_skipped, st.evals);
    }
    /* a latent model: every rank of the group decodes together */
    uint8_t *img_all = NULL;
    if (li && out_path) {
        img_all = leader ? malloc((size_t)n * li->Co * li->H * li->W) : NULL;
        if ((leader && !img_all) || (err = ditd_latent_image_run(li, out, (int)n, NULL, img_all))) {
            fail("decoding", err ? err : DITD_ENOMEM);
            free(img_all);
            goto done;
        }
    }
    if (!leader) {
        rc = 0;
        goto done;
    }
    if (save_path) {
        int64_t shape[5] = {n, C, video ? lat_t : LH, video ? LH : LW, LW};
        if ((err = ditd_npy_write_f32(save_path, video ? 5 : 4, shape, out))) {
            fail("--save-latents", err);
            goto done;
        }
    }
    if (lv) { /* a video model: no image tail (img_all is NULL) */
        rc = write_clips(lv, out, (int)n, lat_t, LH, LW, out_path, want_mp4, save_frames,
                         info.fps, pr.quiet, seed, gp.steps, &vid);
        goto done;
    }
    for (long i = 0; out_path && i < n; i++) {
        char path[4096];
        const char *dot = strrchr(out_path, '.');
        if (n == 1)
            snprintf(path, sizeof path, "%s", out_path);
        else if (dot && strchr(dot, '/') == NULL)
            snprintf(path, sizeof path, "%.*s-%ld%s", (int)(dot - out_path), out_path, i, dot);
        else
            snprintf(path, sizeof path, "%s-%ld", out_path, i);
        int pc = li ? li->Co : C, ph = li ? li->H : LH, pw = li ? li->W : LW;
        if (li)
            memcpy(pix, img_all + (size_t)i * pc * ph * pw, (size_t)pc * ph * pw);
        else
            ditd_pipeline_to_pixels(out + (size_t)i * numel, C, LH, LW, pix);
        if (pc != 1 && pc != 3 && pc != 4) {
            fprintf(stderr, "ditd generate: %d channels cannot be written as PNG\n", pc);
            free(img_all);
            goto done;
        }
        if ((err = ditd_png_write_file(path, pix, pw, ph, pc))) {
            fail(path, err);
            free(img_all);
            goto done;
        }
        if (!pr.quiet && text)
            fprintf(stderr, "wrote %s (%dx%d, seed %ld, %d steps, guidance %g, %s)\n", path, pw, ph,
                    seed, gp.steps, (double)samples[0].guidance, ditd_sampler_kind_name(gp.sampler));
        else if (!pr.quiet)
            fprintf(stderr, "wrote %s (class %d \"%s\", seed %ld, %d steps, guidance %g, %s)\n", path,
                    class_id, info.labels[class_id], seed, gp.steps, (double)samples[0].guidance,
                    ditd_sampler_kind_name(gp.sampler));
    }
    free(img_all);
    rc = 0;
done:
    ditd_latent_video_free(lv);
    free(vid);
    ditd_latent_image_free(li);
    for (int i = 0; i < lora_set.n; i++)
        ditd_lora_dev_free((ditd_lora_dev *)lora_set.ad[i]);
    ditd_pipeline_free(pipe);
done_info:
    ditd_image_free(&in_img);
    free(img_lat);
    ditd_image_cond_free(icond);
    free(i2v_cond);
    free(i2v_emb);
    ditd_prompt_encoder_free(penc);
    free(emb);
    free(te);
    ditd_model_info_free(&info);
    free(samples);
    free(noise);
    free(out);
    free(pix);
    ditd_mesh_free(mesh);
    ditd_comm_free(world);
    if (use_mpi)
        ditd_comm_mpi_finalize();
    return rc;
}
