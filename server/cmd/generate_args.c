/* `ditd generate`'s command line (generate.h): the options, as given, into
 * ditd_gen_args; what needs the model folder is checked by cmd_generate.c. */
#include <ctype.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/error.h"
#include "engine/pipeline/sampler.h"
#include "server/cmd/cli.h"
#include "server/cmd/generate.h"
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
            "  --lora-expert NAME=WHERE  two experts (Wan 2.2): adapter NAME on both (the\n"
            "                       default), transformer or transformer_2 alone\n"
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
            "  --vae-tiling         decode a latent model's image tile by tile (Diffusers' "
            "enable_tiling)\n"
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
    fputs("\nweights from files beside the folder (docs/quant.md):\n"
          "  --transformer-file F the transformer's weights from this .gguf or\n"
          "                       .safetensors file instead of DIR/transformer/'s (a\n"
          "                       ComfyUI / stable-diffusion.cpp download); its config.json\n"
          "                       still says the shapes\n"
          "  --text-encoder-2-file F  FLUX: the T5 encoder's weights from this .gguf\n"
          "                       (llama.cpp's T5 names or transformers') or .safetensors\n",
          f);
    fputs("\nimage edits (docs/edits.md):\n"
          "  --image FILE         img2img (FLUX, SD3: a row with img2img): from this PNG,\n"
          "                       JPEG or WebP, resized to --size as Diffusers (PIL\n"
          "                       lanczos; no --size: the image's, rounded down to the\n"
          "                       model's multiple); repeatable: an image list, output i\n"
          "                       edits image i mod k (-n a multiple of k; default k);\n"
          "                       on an image-to-video folder\n"
          "                       (WanImageToVideoPipeline) the clip's first frame, any size\n"
          "                       (resized to --size as Diffusers, lanczos)\n"
          "  --last-image FILE    image-to-video with a last frame too (FLF2V: Diffusers'\n"
          "                       last_image; a transformer with pos_embed_seq_len)\n"
          "  --strength S         with --image: 0 < S <= 1 of the schedule is run from the\n"
          "                       noised image (default: the edit row's: FLUX 0.6; SD3 0.6,\n"
          "                       with --mask 1.0)\n"
          "  --mask FILE          with --image: inpainting (a row with inpaint: FLUX, SD3),\n"
          "                       as Diffusers' mask_image: white is repainted, black kept\n"
          "                       (its luma, binarized at 0.5); any size (resized too);\n"
          "                       one mask for every --image\n"
"  on a FluxKontextPipeline folder --image is the reference image (no --strength,\n"
          "  no --mask); the output is --size's aspect ratio at --max-area pixels:\n"
          "  --max-area PIXELS    the output's area (default 1048576, Kontext's max_area)\n"
          "  --no-auto-resize     keep the reference's own size (rounded down to 16) instead\n"
          "                       of the preferred resolution of its aspect ratio\n",
          f);
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
/* NAME=VALUE into name (letters, digits, '_', '-', '.'; 1..63) and *val. */
static int name_eq(const char *arg, const char *opt, char name[64], const char **val)
{
    const char *eq = strchr(arg, '=');
    size_t len = eq ? (size_t)(eq - arg) : 0;
    if (!eq || len == 0 || len >= 64 || !eq[1])
        return ditd_err_set(DITD_EINVAL, "%s \"%s\": expected NAME=%s", opt, arg,
                            !strcmp(opt, "--lora")          ? "PATH"
                            : !strcmp(opt, "--lora-expert") ? "WHERE"
                                                            : "SCALE");
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
static int lora_arg(ditd_gen_lora_args *la, const char *arg)
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
static int lora_scale_arg(ditd_gen_lora_args *la, const char *arg)
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

static int lora_expert_arg(ditd_gen_lora_args *la, const char *arg)
{
    static const char *const where[3] = {"both", "transformer", "transformer_2"};
    const char *v;
    int err;
    if (la->n_expert == DITD_LORA_MAX_SET)
        return ditd_err_set(DITD_EINVAL, "--lora-expert: at most %d", DITD_LORA_MAX_SET);
    if ((err = name_eq(arg, "--lora-expert", la->expert_name[la->n_expert], &v)))
        return err;
    for (int k = 0; k < 3; k++)
        if (!strcmp(v, where[k])) {
            la->expert_val[la->n_expert++] = k;
            return 0;
        }
    return ditd_err_set(DITD_EINVAL, "--lora-expert \"%s\": WHERE is both, transformer or "
                        "transformer_2", arg);
}

int ditd__gen_args_parse(int argc, char **argv, ditd_gen_args *a)
{
    enum { O_MODEL = 256, O_CLASS, O_SEED, O_STEPS, O_GUIDANCE, O_SAMPLER, O_THREADS, O_LATENTS,
           O_SAVE, O_DEVICE, O_COMM_TIMEOUT, O_VAE_TILING, O_DTYPE, O_PROMPT, O_NEG, O_TRUE_CFG,
           O_SIZE, O_MAXSEQ, O_PROMPT2, O_PROMPT3, O_NEG2, O_NEG3, O_SKIP, O_SLG_SCALE,
           O_SLG_START, O_SLG_STOP, O_CACHE, O_FRAMES, O_SAVE_FRAMES, O_GUIDANCE2, O_LORA,
           O_LORA_SCALE, O_IMAGE, O_STRENGTH, O_LORA_DIR, O_MASK, O_LAST_IMAGE, O_LORA_EXPERT,
           O_MAX_AREA, O_NO_AUTO_RESIZE,
           O_TFILE, O_TE2FILE };
    static const struct option opts[] = {{"model", required_argument, 0, O_MODEL},
                                         {"transformer-file", required_argument, 0, O_TFILE},
                                         {"text-encoder-2-file", required_argument, 0, O_TE2FILE},
                                         {"class", required_argument, 0, O_CLASS},
                                         {"seed", required_argument, 0, O_SEED},
                                         {"steps", required_argument, 0, O_STEPS},
                                         {"guidance", required_argument, 0, O_GUIDANCE},
                                         {"sampler", required_argument, 0, O_SAMPLER},
                                         {"guidance-2", required_argument, 0, O_GUIDANCE2},
                                         {"threads", required_argument, 0, O_THREADS},
                                         {"latents", required_argument, 0, O_LATENTS},
                                         {"save-latents", required_argument, 0, O_SAVE},
                                         {"vae-tiling", no_argument, 0, O_VAE_TILING},
                                         {"output", required_argument, 0, 'o'},
                                         {"quiet", no_argument, 0, 'q'},
                                         {"help", no_argument, 0, 'h'},
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
                                         {"lora-expert", required_argument, 0, O_LORA_EXPERT},
                                         {"frames", required_argument, 0, O_FRAMES},
                                         {"save-frames", no_argument, 0, O_SAVE_FRAMES},
                                         {"image", required_argument, 0, O_IMAGE},
                                         {"strength", required_argument, 0, O_STRENGTH},
                                         {"mask", required_argument, 0, O_MASK},
                                         {"last-image", required_argument, 0, O_LAST_IMAGE},
                                         {"max-area", required_argument, 0, O_MAX_AREA},
                                         {"no-auto-resize", no_argument, 0, O_NO_AUTO_RESIZE},
                                         DITD_LAYOUT_LONGOPTS,
                                         {0, 0, 0, 0}};
    const char *lora_dir = NULL; /* --lora-dir */
    static ditd_lora_specs dir_specs; /* its files (the paths la.path points at) */
    int c, err;

    memset(a, 0, sizeof *a);
    a->layout = DITD_LAYOUT_SINGLE;
    a->strength = -1;
    a->auto_resize = -1;
    a->true_cfg = 1.0;
    a->slg_scale = a->slg_start = a->slg_stop = -1;
    a->dtype_str = "auto";
    a->steps = -1;
    a->n = 1;
    a->comm_timeout_ms = DITD_NCCL_DEFAULT_TIMEOUT_MS;
    a->device = DITD_DEVICE_CPU;
    a->guidance = a->guidance_2 = -1;
    ditd_cache_config_default(DITD_CACHE_NONE, &a->cache_cfg);

    optind = 1;
    while ((c = getopt_long(argc, argv, "o:n:qh", opts, NULL)) != -1) {
        err = 0;
        switch (c) {
        case O_MODEL: a->model_dir = optarg; break;
        case O_TFILE: a->transformer_file = optarg; break;
        case O_TE2FILE: a->text_encoder_2_file = optarg; break;
        case O_CLASS: a->class_str = optarg; break;
        case O_SEED:
            err = ditd_parse_long(optarg, 0, 0x7fffffffffffffffL, "--seed", &a->seed);
            break;
        case O_STEPS: err = ditd_parse_long(optarg, 1, 1000, "--steps", &a->steps); break;
        case O_GUIDANCE: err = ditd_parse_double(optarg, 0, 100, "--guidance", &a->guidance); break;
        case O_GUIDANCE2:
            err = ditd_parse_double(optarg, 0, 100, "--guidance-2", &a->guidance_2);
            break;
        case O_SAMPLER: a->sampler_str = optarg; break;
        case O_THREADS: err = ditd_parse_long(optarg, 1, 1024, "--threads", &a->threads); break;
        case O_LATENTS: a->latents_path = optarg; break;
        case O_SAVE: a->save_path = optarg; break;
        case O_VAE_TILING: a->vae_tiling = 1; break;
        case O_DEVICE: err = ditd_device_from_str(optarg, &a->device); break;
        case O_DTYPE: a->dtype_str = optarg; break;
        case O_PROMPT: a->prompts[0] = optarg; break;
        case O_PROMPT2: a->prompts[1] = optarg; break;
        case O_PROMPT3: a->prompts[2] = optarg; break;
        case O_NEG: a->negatives[0] = optarg; break;
        case O_NEG2: a->negatives[1] = optarg; break;
        case O_NEG3: a->negatives[2] = optarg; break;
        case O_SKIP: a->skip_str = optarg; break;
        case O_SLG_SCALE:
            err = ditd_parse_double(optarg, 0, 100, "--slg-scale", &a->slg_scale);
            break;
        case O_SLG_START:
            err = ditd_parse_double(optarg, 0, 1, "--slg-start", &a->slg_start);
            break;
        case O_SLG_STOP: err = ditd_parse_double(optarg, 0, 1, "--slg-stop", &a->slg_stop); break;
        case O_CACHE:
            if ((err = ditd_cache_config_parse(optarg, &a->cache_cfg))) {
                char why[512];
                snprintf(why, sizeof why, "%s", ditd_err_detail());
                ditd_err_set(err, "--cache: %s", why);
            }
            break;
        case O_FRAMES: err = ditd_parse_long(optarg, 1, 100000, "--frames", &a->frames); break;
        case O_LORA: err = lora_arg(&a->la, optarg); break;
        case O_LORA_SCALE: err = lora_scale_arg(&a->la, optarg); break;
        case O_LORA_DIR: lora_dir = optarg; break;
        case O_LORA_EXPERT: err = lora_expert_arg(&a->la, optarg); break;
        case O_SAVE_FRAMES: a->save_frames = 1; break;
        case O_IMAGE:
            if (a->n_images == DITD_EDIT_MAX_IMAGES) {
                fprintf(stderr, "ditd generate: --image given more than %d times\n",
                        DITD_EDIT_MAX_IMAGES);
                return 2;
            }
            if (!a->image_path)
                a->image_path = optarg;
            a->image_paths[a->n_images++] = optarg;
            break;
        case O_MASK: a->mask_path = optarg; break;
        case O_LAST_IMAGE: a->last_image_path = optarg; break;
        case O_MAX_AREA:
            err = ditd_parse_long(optarg, 256, 16384L * 16384L, "--max-area", &a->max_area);
            break;
        case O_NO_AUTO_RESIZE: a->auto_resize = 0; break;
        case O_STRENGTH: err = ditd_parse_double(optarg, 0, 1, "--strength", &a->strength); break;
        case O_TRUE_CFG: err = ditd_parse_double(optarg, 0, 100, "--true-cfg", &a->true_cfg); break;
        case O_SIZE: err = parse_size(optarg, &a->size_w, &a->size_h); break;
        case O_MAXSEQ:
            err = ditd_parse_long(optarg, 1, 4096, "--max-sequence-length", &a->max_seq);
            break;
        case O_COMM_TIMEOUT:
            err = ditd_parse_long(optarg, 100, 86400000, "--comm-timeout-ms", &a->comm_timeout_ms);
            break;
        case 'n':
            err = ditd_parse_long(optarg, 1, 64, "-n", &a->n);
            a->n_given = 1;
            break;
        case 'o': a->out_path = optarg; break;
        case 'q': a->quiet = 1; break;
        case 'h': usage(stdout); return -1;
        default:
            if (ditd_layout_option(c, optarg, &a->layout, &err))
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
            for (int k = 0; !err && k < a->la.n; k++)
                if (!strcmp(a->la.name[k], dir_specs.v[i].name))
                    err = ditd_err_set(DITD_EINVAL, "--lora-dir %s: adapter name %s given twice "
                                       "(%s and %s)", lora_dir, a->la.name[k], a->la.path[k],
                                       dir_specs.v[i].path);
            if (!err && a->la.n == DITD_LORA_MAX_SET)
                err = ditd_err_set(DITD_EINVAL, "--lora-dir %s: at most %d adapters in all",
                                   lora_dir, DITD_LORA_MAX_SET);
            if (!err) {
                snprintf(a->la.name[a->la.n], sizeof a->la.name[a->la.n], "%s",
                         dir_specs.v[i].name);
                a->la.path[a->la.n] = dir_specs.v[i].path;
                a->la.scale[a->la.n++] = 1.0f;
            }
        }
        if (err) {
            fprintf(stderr, "ditd generate: %s\n", ditd_err_detail());
            return 2;
        }
    }
    for (int i = 0; i < a->la.n_scale; i++) {
        int k = 0;
        while (k < a->la.n && strcmp(a->la.name[k], a->la.scale_name[i]))
            k++;
        if (k == a->la.n) {
            fprintf(stderr, "ditd generate: --lora-scale %s: no --lora %s=PATH given\n",
                    a->la.scale_name[i], a->la.scale_name[i]);
            return 2;
        }
        a->la.scale[k] = a->la.scale_val[i];
    }
    for (int i = 0; i < a->la.n_expert; i++) {
        int k = 0;
        while (k < a->la.n && strcmp(a->la.name[k], a->la.expert_name[i]))
            k++;
        if (k == a->la.n) {
            fprintf(stderr, "ditd generate: --lora-expert %s: no --lora %s=PATH given\n",
                    a->la.expert_name[i], a->la.expert_name[i]);
            return 2;
        }
        a->la.expert[k] = a->la.expert_val[i];
    }
    if (optind < argc) {
        fprintf(stderr, "ditd generate: unexpected argument \"%s\"\n", argv[optind]);
        return 2;
    }
    if (!a->out_path && !a->save_path) {
        fprintf(stderr, "ditd generate: give -o OUT.png (or --save-latents FILE.npy)\n");
        return 2;
    }
    if (a->strength >= 0 && !a->image_path) {
        fprintf(stderr, "ditd generate: --strength needs --image\n");
        return 2;
    }
    if (a->last_image_path && !a->image_path) {
        fprintf(stderr, "ditd generate: --last-image needs --image (the first frame)\n");
        return 2;
    }
    if (a->n_images > 1 && !a->n_given) /* an image list: one output per image */
        a->n = a->n_images;
    if (a->mask_path && !a->image_path) {
        fprintf(stderr, "ditd generate: --mask needs --image\n");
        return 2;
    }
    if (!a->model_dir && !(a->model_dir = ditd_default_model_dir())) {
        fprintf(stderr, "ditd generate: no --model given and no embedded default model\n");
        return 2;
    }
    return 0;
}
