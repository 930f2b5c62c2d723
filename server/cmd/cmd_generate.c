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
#include "engine/worker/replica.h"
#include "server/cmd/generate.h"
#include "engine/io/video_mp4.h"
#include "server/cmd/cmd.h"
#include "server/common/image.h"
#include "server/common/image_in.h"
#include "server/common/lora_spec.h"


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

/* The text-encoder part of every --lora, on the rank holding the encoders
 * (penc), into *set; as lora_load. */
static int text_lora_load(const ditd_gen_lora_args *la, const ditd_prompt_encoder *penc,
                          ditd_text_lora_set *set)
{
    for (int i = 0; penc && i < la->n; i++) {
        ditd_text_lora *t = NULL;
        int err = ditd_prompt_encoder_lora_open(penc, la->path[i], la->name[i], &t);
        if (err) {
            fprintf(stderr, "ditd generate: --lora %s=%s: %s: %s\n", la->name[i], la->path[i],
                    ditd_err_name(err), ditd_err_detail());
            return err;
        }
        set->ad[set->n] = t;
        set->weight[set->n++] = la->scale[i];
    }
    return 0;
}

/* A text model's prompts (te[0]) and negative prompts (te[1], when the
 * pipeline row's rule runs the unconditional pass: want_neg), encoded on
 * the leader (penc: the replica's encoders there) and broadcast to a
 * group; every rank ends with the same embeddings. *emb and *te are owned
 * by the caller. */
static int encode_prompts(const ditd_model_info *info, const ditd_mesh *mesh,
                          ditd_prompt_encoder *penc, const ditd_gen_lora_args *la,
                          ditd_text_lora_set *loras, const char *const prompts[3],
                          const char *const negatives[3], int want_neg, int L, float **emb,
                          ditd_text_embeds **te)
{
    const size_t T = (size_t)ditd_pipeline_class_text_len(info->pipeline, L);
    const size_t one =
        T * (size_t)info->shapes.cond.text_dim + (size_t)info->shapes.cond.pooled_dim;
    const int has_pooled = info->shapes.cond.pooled_dim > 0;
    int32_t st = 0;
    int err = 0;
    if (!(*emb = malloc(2 * one * sizeof **emb)) || !(*te = calloc(2, sizeof **te)))
        return ditd_err_set(DITD_ENOMEM, "text embeddings");
    float *seq = *emb, *nseq = *emb + one;
    if (!mesh || ditd_mesh_is_leader(mesh)) {
        ditd_prompt_texts pt = prompt_texts(prompts), nt = prompt_texts(negatives);
        /* the --lora files' text-encoder parts first (an error is the group's, below);
         * the negative prompt too: Diffusers runs the encoders with their adapters on */
        if (!(err = text_lora_load(la, penc, loras)) &&
            !(err = ditd_prompt_encoder_encode_lora(penc, &pt, L, loras, seq,
                                                    seq + T * info->shapes.cond.text_dim)) &&
            want_neg)
            err = ditd_prompt_encoder_encode_lora(penc, &nt, L, loras, nseq,
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






/* Opens and uploads every --lora for the pipeline's model into *set (a text
 * model's: the transformer part; text_lora_load reads the rest). On an
 * error, says so (naming the option and the file) and returns it; what was
 * uploaded is in *set for the caller to free. */
static int lora_load(const ditd_gen_lora_args *la, ditd_pipeline *p, int text, ditd_lora_set *set)
{
    int err;
    for (int i = 0; i < la->n; i++) {
        ditd_lora *l = NULL;
        ditd_lora_dev *d = NULL;
        if (p->den->n_lora_targets <= 0) {
            fprintf(stderr, "ditd generate: --lora %s: %s\n", la->name[i], p->den->lora_refusal);
            return DITD_EUNSUPPORTED;
        }
        if ((err = (text ? ditd_lora_open_transformer : ditd_lora_open)(
                 la->path[i], la->name[i], p->den->lora_targets, p->den->n_lora_targets, &l)) ||
            (err = ditd_lora_dev_new(l, p->ops, p->den->lora_targets, p->den->n_lora_targets,
                                     &d))) {
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
    ditd_gen_args a;
    progress pr = {0};
    ditd_image in_img = {0}; /* --image, decoded */
    ditd_image in_more[DITD_EDIT_MAX_IMAGES] = {{0}}; /* the second and later --image */
    ditd_image last_img = {0}; /* --last-image (image-to-video), decoded */
    uint8_t *mask_l = NULL;  /* --mask: its luma (H, W) */
    float *mask_lat = NULL;  /* and on the latent grid (h, w) */
    float *img_lat = NULL;   /* --image: its latents (C, h, w) */
    float *ref_lat = NULL;   /* --image on a reference row (Kontext): k x (C, rh, rw) */
    size_t ref_numel = 0;    /* C rh rw of one */
    float *i2v_cond = NULL, *i2v_emb = NULL;
    float *emb = NULL;       /* text models: (2n, L Dt + Dp) */
    ditd_text_embeds *te = NULL;
    uint8_t *vid = NULL;     /* video models: (n, F, H, W, 3) frames */
    ditd_lora_set lora_set = {0};
    ditd_text_lora_set text_lora_set = {0}; /* on the rank with the encoders */
    ditd_lora_set lora_ex[2] = {{0}}; /* --lora-expert: transformer's, transformer_2's */
    int lora_split = 0;
    int err, rc = 1;

    if ((rc = ditd__gen_args_parse(argc, argv, &a)))
        return rc < 0 ? 0 : rc;
    rc = 1;
    pr.quiet = a.quiet;
    pr.tty = isatty(STDERR_FILENO);

    /* A group: every rank of the world (mpirun -np G) is one rank of it. */
    ditd_comm *world = NULL;
    ditd_mesh *mesh = NULL;
    int leader = 1, use_mpi = ditd_comm_launched_by_mpi() || ditd_layout_size(&a.layout) > 1;
    if (use_mpi) {
        if ((err = ditd_comm_mpi_init(NULL, NULL)) || (err = ditd_comm_mpi_world(&world)))
            return ditd__gen_fail("MPI", err);
        if ((err = ditd_mesh_new(world, &a.layout, &mesh))) {
            ditd__gen_fail("layout", err);
            ditd_comm_free(world);
            ditd_comm_mpi_finalize();
            return 2;
        }
        leader = ditd_mesh_is_leader(mesh);
        if (!leader)
            pr.quiet = 1;
    }

    ditd_gen_params gp;
    ditd_gen_sample *samples = NULL;
    float *noise = NULL, *out = NULL;
    uint8_t *pix = NULL;
    int class_id;
    /* the replica's first half: the device (for cuda this rank's GPU,
     * cudaSetDevice(local rank), before the backend starts; a group on GPUs
     * moves its collectives to NCCL, every rank agreeing first) and the
     * folder; the weights load once the options are checked against it */
    ditd_replica rep;
    ditd_replica_opts ro = {
        .model_dir = a.model_dir,
        .transformer_file = a.transformer_file,
        .text_encoder_2_file = a.text_encoder_2_file,
        .device = a.device,
        .dtype = a.dtype_str,
        .max_samples = (int)a.n,
        .mesh = mesh,
        .comm_timeout_ms = (int)a.comm_timeout_ms,
    };
    if ((err = ditd_replica_begin(&ro, &rep))) {
        ditd__gen_fail(rep.ops ? a.model_dir : "--device", err);
        ditd_replica_close(&rep);
        ditd_mesh_free(mesh);
        ditd_comm_free(world);
        if (use_mpi)
            ditd_comm_mpi_finalize();
        return 1;
    }
    const ditd_backend_ops *ops = rep.ops;
    if (a.device == DITD_DEVICE_CPU && leader && !pr.quiet) /* docs/cpu.md */
        fprintf(stderr, "ditd: cpu GEMMs: %s\n", ditd_backend_cpu_gemm_info());
    int text = rep.info.shapes.cond.kind == DITD_COND_TEXT;
    class_id = 0;
    /* video models (WanPipeline): the clip's frames, rounded as the
     * pipeline rounds them; -o OUT.mp4 and/or PNG frames */
    const int video = rep.info.frames > 0;
    const char *ext = a.out_path ? strrchr(a.out_path, '.') : NULL;
    if (ext && strchr(ext, '/'))
        ext = NULL;
    const int want_mp4 = video && ext && !strcasecmp(ext, ".mp4");
    int nfr = 1, lat_t = 1;
    if (!video && (a.frames > 1 || a.save_frames)) {
        fprintf(stderr, "ditd generate: --frames/--save-frames: %s makes images, not clips\n",
                rep.info.name);
        goto done;
    }
    if (video) {
        nfr = a.frames ? ditd_model_round_frames(&rep.info, (int)a.frames) : rep.info.frames;
        if (ditd_model_check_frames(&rep.info, nfr)) {
            fprintf(stderr, "ditd generate: --frames: %s\n", ditd_err_detail());
            goto done;
        }
        if (a.frames && nfr != a.frames && leader && !pr.quiet)
            fprintf(stderr, "ditd generate: --frames %ld rounded to %d (1 + k x %d, as %s)\n",
                    a.frames, nfr, rep.info.frame_step, rep.info.pipeline->name);
        lat_t = ditd_model_latent_frames(&rep.info, nfr);
        if (a.vae_tiling) {
            fprintf(stderr, "ditd generate: --vae-tiling: image models only (a clip is decoded "
                    "frame chunk by frame chunk)\n");
            goto done;
        }
        if (a.out_path && !want_mp4 && !(ext && !strcasecmp(ext, ".png"))) {
            fprintf(stderr, "ditd generate: -o %s: %s writes clips: -o OUT.mp4, or -o OUT.png for "
                    "PNG frames OUT-000.png, ...\n", a.out_path, rep.info.name);
            goto done;
        }
        if (want_mp4 && !ditd_video_mp4_available()) {
            fprintf(stderr, "ditd generate: -o %s: this ditd is built without FFmpeg; write PNG "
                    "frames with -o OUT.png instead\n", a.out_path);
            goto done;
        }
    }
    if (text && a.class_str) {
        fprintf(stderr, "ditd generate: --class: %s takes a text --prompt, not a class\n",
                rep.info.name);
        goto done;
    }
    const ditd_pipeline_class *pc = rep.info.pipeline;
    const char *prompt = a.prompts[0], *negative = a.negatives[0];
    if (!text && (prompt || a.prompts[1] || a.prompts[2] || negative || a.negatives[1] ||
                  a.negatives[2] || a.max_seq)) {
        fprintf(stderr, "ditd generate: --prompt/--negative-prompt/--max-sequence-length: %s is "
                "class-conditional: use --class\n", rep.info.name);
        goto done;
    }
    if (text && !prompt) {
        fprintf(stderr, "ditd generate: %s is a text model: give --prompt TEXT\n", rep.info.name);
        goto done;
    }
    for (int k = 1; k < 3; k++)
        if ((a.prompts[k] || a.negatives[k]) && k >= ditd_pipeline_class_prompts(pc)) {
            fprintf(stderr,
                    "ditd generate: --prompt-%d/--negative-prompt-%d: %s takes %d prompt(s)\n",
                    k + 1, k + 1, pc->name, ditd_pipeline_class_prompts(pc));
            goto done;
        }
    /* --image: the folder's edit row (FluxPipeline: FluxImg2ImgPipeline) gives
     * the defaults; the image sets the size */
    const ditd_pipeline_class *erow = a.image_path ? pc->img2img : NULL;
    const int i2v = pc->image_to_video; /* WanImageToVideoPipeline: --image is the first frame */
    const int kontext = pc->reference;  /* FluxKontextPipeline: --image is a reference */
    if ((a.max_area || a.auto_resize == 0) && !kontext) {
        fprintf(stderr, "ditd generate: --%s: %s (%s) takes no reference image "
                "(FluxKontextPipeline's max_area, _auto_resize)\n",
                a.max_area ? "max-area" : "no-auto-resize", rep.info.name, pc->name);
        goto done;
    }
    if (kontext && (a.strength >= 0 || a.mask_path)) {
        fprintf(stderr, "ditd generate: --%s: %s (%s) takes a reference image, not a start: %s\n",
                a.mask_path ? "mask" : "strength", rep.info.name, pc->name,
                a.mask_path ? "no mask" : "no strength (the whole schedule runs from noise)");
        goto done;
    }
    if (i2v && !a.image_path) {
        fprintf(stderr, "ditd generate: %s (%s) makes a clip from an image: give --image FILE\n",
                rep.info.name, pc->name);
        goto done;
    }
    if (a.last_image_path && !i2v) {
        fprintf(stderr, "ditd generate: --last-image: %s (%s) is not an image-to-video "
                "pipeline\n", rep.info.name, pc->name);
        goto done;
    }
    if (i2v && (a.strength >= 0 || a.mask_path)) {
        fprintf(stderr, "ditd generate: --%s: %s starts from noise (the image is the condition, "
                "not an edit)\n", a.mask_path ? "mask" : "strength", pc->name);
        goto done;
    }
    if (a.mask_path && erow) { /* a masked edit follows the row's inpaint row */
        if (!pc->inpaint) {
            fprintf(stderr, "ditd generate: --mask: %s (%s) takes no mask (inpainting: a "
                    "pipeline row with inpaint, e.g. FLUX)\n", rep.info.name, pc->name);
            goto done;
        }
        erow = pc->inpaint;
    }
    if (a.image_path && !i2v && ((!erow && !kontext) || video || !rep.info.needs_vae)) {
        fprintf(stderr, "ditd generate: --image: %s (%s) takes no input image (img2img: a "
                "pipeline row with img2img, e.g. FLUX, SD3)\n", rep.info.name, pc->name);
        goto done;
    }
    if (a.n_images > 1 && i2v) {
        fprintf(stderr, "ditd generate: --image given %d times: %s takes one first frame\n",
                a.n_images, pc->name);
        goto done;
    }
    if (a.image_path) {
        if ((err = ditd__gen_read_image(a.image_path, i2v ? 3 : 0, &in_img))) {
            fprintf(stderr, "ditd generate: --image %s: %s\n", a.image_path, ditd_err_detail());
            goto done;
        }
        for (int j = 1; j < a.n_images; j++) { /* an image list: one size */
            if ((err = ditd__gen_read_image(a.image_paths[j], 0, &in_more[j]))) {
                fprintf(stderr, "ditd generate: --image %s: %s\n", a.image_paths[j],
                        ditd_err_detail());
                goto done;
            }
            if (in_more[j].width != in_img.width || in_more[j].height != in_img.height) {
                fprintf(stderr, "ditd generate: --image %s is %dx%d, --image %s %dx%d: the "
                        "images of one edit must be the same size\n", a.image_paths[j],
                        in_more[j].width, in_more[j].height, a.image_path, in_img.width,
                        in_img.height);
                goto done;
            }
        }
        if (a.n_images > 1) { /* Diffusers' image list: n a multiple (-n absent: one each) */
            if (ditd_edit_images_check((int)a.n, a.n_images, a.mask_path ? 1 : 0)) {
                fprintf(stderr, "ditd generate: -n: %s\n", ditd_err_detail());
                goto done;
            }
        }
        if (kontext) { /* the output's size is the request's (below), not the image's */
        } else if (!a.size_w && !i2v && rep.info.resizable && rep.info.size_multiple > 0) {
            /* VaeImageProcessor.get_default_height_width: the image's size
             * rounded down to the VAE multiple (docs/edits.md#resampling) */
            const int q = rep.info.size_multiple;
            a.size_w = in_img.width >= q ? in_img.width - in_img.width % q : in_img.width;
            a.size_h = in_img.height >= q ? in_img.height - in_img.height % q : in_img.height;
        } else if (!a.size_w) {
            a.size_w = in_img.width;
            a.size_h = in_img.height;
        }
        /* an edit's image at the output size, then its color: VaeImageProcessor.
         * preprocess (PIL Lanczos, RGBA premultiplied; image-to-video resizes in
         * its own condition) */
        if (!i2v && !kontext &&
            (err = ditd__gen_resize_image(&in_img, (int)a.size_w, (int)a.size_h))) {
            fprintf(stderr, "ditd generate: --image %s (%dx%d) to --size %ldx%ld: %s\n",
                    a.image_path, in_img.width, in_img.height, a.size_w, a.size_h,
                    ditd_err_detail());
            goto done;
        }
        for (int j = 1; !i2v && !kontext && j < a.n_images; j++) /* each image of the list, alike */
            if ((err = ditd__gen_resize_image(&in_more[j], (int)a.size_w, (int)a.size_h))) {
                fprintf(stderr, "ditd generate: --image %s to --size %ldx%ld: %s\n",
                        a.image_paths[j], a.size_w, a.size_h, ditd_err_detail());
                goto done;
            }
        if (a.last_image_path && (err = ditd__gen_read_image(a.last_image_path, 3, &last_img))) {
            fprintf(stderr, "ditd generate: --last-image %s: %s\n", a.last_image_path,
                    ditd_err_detail());
            goto done;
        }
        if (a.mask_path) { /* Diffusers' mask_image: resized in its own mode, then
                            * its luma (PIL's convert("L")): RGB resized per
                            * channel, RGBA premultiplied, as PIL */
            ditd_image mk = {0};
            if ((err = ditd__gen_read_image(a.mask_path, 0, &mk))) {
                fprintf(stderr, "ditd generate: --mask %s: %s\n", a.mask_path, ditd_err_detail());
                goto done;
            }
            if ((err = ditd__gen_resize_image(&mk, in_img.width, in_img.height))) {
                fprintf(stderr, "ditd generate: --mask %s (%dx%d) to %dx%d: %s\n", a.mask_path,
                        mk.width, mk.height, in_img.width, in_img.height, ditd_err_detail());
                ditd_image_free(&mk);
                goto done;
            }
            if ((mask_l = malloc((size_t)mk.width * (size_t)mk.height)))
                ditd_image_to_luma(&mk, mask_l);
            ditd_image_free(&mk);
            if (!mask_l) {
                fprintf(stderr, "ditd generate: out of memory\n");
                goto done;
            }
        }
        if (!i2v && !kontext) { /* an edit row's defaults; image-to-video keeps the row's own */
            if (a.steps <= 0 && erow != pc)
                a.steps = erow->default_steps;
            if (a.guidance < 0 && erow != pc)
                a.guidance = erow->default_guidance;
            if (a.strength < 0)
                a.strength = erow->default_strength;
        }
        if (!rep.info.resizable && !kontext &&
            (a.size_w != rep.info.image_width || a.size_h != rep.info.image_height)) {
            fprintf(stderr, "ditd generate: --image %s is %ldx%ld; %s makes %dx%d\n", a.image_path,
                    a.size_w, a.size_h, rep.info.name, rep.info.image_width, rep.info.image_height);
            goto done;
        }
    }
    if (kontext) {
        /* FluxKontextPipeline: the request's aspect ratio at max_area pixels,
         * rounded down to vae_scale_factor x 2 (with or without an image) */
        long rw = a.size_w ? a.size_w : rep.info.image_width;
        long rh = a.size_h ? a.size_h : rep.info.image_height;
        long area = a.max_area ? a.max_area : pc->default_max_area;
        int ow = 0, oh = 0;
        if (ditd_pipeline_class_area_size(area, (int)rw, (int)rh, 2 * rep.info.vae_scale, &ow,
                                          &oh)) {
            fprintf(stderr, "ditd generate: --size/--max-area: %s\n", ditd_err_detail());
            goto done;
        }
        if (leader && !pr.quiet && (ow != rw || oh != rh))
            fprintf(stderr, "%s: %ldx%ld adjusted to %dx%d (max_area %ld)\n", pc->name, rw, rh, ow,
                    oh, area);
        a.size_w = ow;
        a.size_h = oh;
    }
    if (a.true_cfg != 1.0 && pc->guidance != DITD_GUIDANCE_TRUE_CFG) {
        fprintf(stderr, "ditd generate: --true-cfg: %s guides with --guidance\n", pc->name);
        goto done;
    }
    if (a.guidance_2 >= 0 && !rep.info.transformer_2_dir[0]) {
        fprintf(stderr, "ditd generate: --guidance-2: %s has one transformer (guidance_scale_2 "
                "needs transformer_2 and boundary_ratio in model_index.json)\n", rep.info.name);
        goto done;
    }
    memset(&gp, 0, sizeof gp);
    if (a.skip_str) { /* an edit: its row's (SD3's edit pipelines have none) */
        const ditd_pipeline_class *sr = erow && !i2v ? erow : pc;
        if (!(sr->request & DITD_REQ_SKIP_LAYERS)) {
            fprintf(stderr, "ditd generate: --skip-layers: %s has no skip-layer guidance\n",
                    sr->name);
            goto done;
        }
        char *end;
        const char *q = a.skip_str;
        while (*q) {
            long v = strtol(q, &end, 10);
            if (end == q || v < 0 || v > 1000 || gp.n_skip_layers == DITD_MAX_SKIP_LAYERS ||
                (*end && *end != ',')) {
                fprintf(stderr, "ditd generate: --skip-layers \"%s\": up to %d block indices, "
                        "comma-separated\n", a.skip_str, DITD_MAX_SKIP_LAYERS);
                goto done;
            }
            gp.skip_layers[gp.n_skip_layers++] = (int)v;
            q = *end ? end + 1 : end;
        }
    } else if (a.slg_scale >= 0 || a.slg_start >= 0 || a.slg_stop >= 0) {
        fprintf(stderr, "ditd generate: --slg-scale/--slg-start/--slg-stop need --skip-layers\n");
        goto done;
    }
    gp.slg_scale = a.slg_scale >= 0 ? (float)a.slg_scale : pc->slg_scale;
    gp.slg_start = a.slg_start >= 0 ? (float)a.slg_start : pc->slg_start;
    gp.slg_stop = a.slg_stop >= 0 ? (float)a.slg_stop : pc->slg_stop;
    if (text && a.max_seq > rep.info.max_sequence_length) {
        fprintf(stderr, "ditd generate: --max-sequence-length %ld (1..%d)\n", a.max_seq,
                rep.info.max_sequence_length);
        goto done;
    }
    if (!a.max_seq)
        a.max_seq = rep.info.default_max_sequence_length;
    if (a.size_w && ditd_model_check_size(&rep.info, (int)a.size_w, (int)a.size_h)) {
        fprintf(stderr, "ditd generate: --size: %s\n", ditd_err_detail());
        goto done;
    }
    if (!text &&
        (err = ditd_model_class_from_str(&rep.info, a.class_str ? a.class_str : "0", &class_id))) {
        fprintf(stderr, "ditd generate: --class: %s; classes:", ditd_err_detail());
        for (int i = 0; i < rep.info.num_classes && i < 50; i++)
            fprintf(stderr, "%s %d \"%s\"", i ? ";" : "", i, rep.info.labels[i]);
        fputc('\n', stderr);
        goto done;
    }
    gp.steps = a.steps > 0 ? (int)a.steps : rep.info.default_steps;
    if (!a.sampler_str && rep.info.default_sampler[0])
        a.sampler_str = rep.info.default_sampler;
    /* the weights: the pipeline, the tail that decodes on the whole group
     * (when there is something to write or an image to encode) and a text
     * model's encoders on the leader */
    const int vs = rep.info.vae_scale > 0 ? rep.info.vae_scale : 1; /* 0: no vae/ (refused below) */
    const int sh = (a.size_h ? (int)a.size_h : rep.info.image_height) / vs;
    const int sw = (a.size_w ? (int)a.size_w : rep.info.image_width) / vs;
    /* the VAE: to decode (-o), or to encode an img2img --image (image-to-video encodes its
     * image through engine/pipeline/image_cond.h, so a clip is decoded only for -o) */
    ro.decode = a.out_path || (a.image_path && !pc->image_to_video) ? DITD_REPLICA_DECODE
                                                                     : DITD_REPLICA_NO_DECODE;
    ro.vae_tiling = a.vae_tiling;
    ro.video_h = sh;
    ro.video_w = sw;
    ro.text = text;
    ro.text_rank = 0;
    ro.text_opts.max_sequence_length = (int)a.max_seq;
    if ((err = ditd_replica_load(&ro, &rep))) {
        ditd__gen_fail("loading the model", err);
        goto done;
    }
    ditd_pipeline *pipe = rep.pipe;
    ditd_latent_image *li = rep.li;  /* image models: the VAE decode, on the group */
    ditd_latent_video *lv = rep.lv;  /* video models: the video VAE, on the group */
    if (video) { /* the clip: frames x the size asked for, else the model's */
        if ((err = ditd_pipeline_set_video_size(
                 pipe, lat_t, sh, sw,
                 text ? ditd_pipeline_class_text_len(pc, (int)a.max_seq) : 0))) {
            ditd__gen_fail("--frames/--size", err);
            goto done;
        }
    } else if (rep.info.resizable) { /* the size asked for, else the model's default */
        if ((err = ditd_pipeline_set_size(
                 pipe, sh, sw, text ? ditd_pipeline_class_text_len(pc, (int)a.max_seq) : 0)) ||
            (li && (err = ditd_latent_image_set_size(li, sh, sw)))) {
            ditd__gen_fail("--size", err);
            goto done;
        }
    }
    float g_eff = a.guidance >= 0 ? (float)a.guidance : rep.info.default_guidance;
    int want_neg = ditd_pipeline_class_needs_negative(
        pc, g_eff, (float)a.true_cfg, negative != NULL, rep.info.shapes.guidance_embed);
    if (text && (err = encode_prompts(&rep.info, mesh, rep.penc, &a.la, &text_lora_set, a.prompts,
                                      a.negatives, want_neg, (int)a.max_seq, &emb, &te))) {
        ditd__gen_fail("encoding the prompt", err);
        goto done;
    }
    if ((err = lora_load(&a.la, pipe, text, &lora_set)))
        goto done;
    /* --lora-expert: each expert its own set of the adapters (WanPipeline's
     * load_lora_weights, with load_into_transformer_2 for transformer_2's) */
    for (int i = 0; i < a.la.n; i++) {
        if (a.la.expert[i] && !pipe->den2) {
            fprintf(stderr, "ditd generate: --lora-expert %s: %s has one transformer\n",
                    a.la.name[i], rep.info.name);
            err = DITD_EINVAL;
            goto done;
        }
        lora_split |= a.la.expert[i] != 0;
        for (int e = 0; e < 2; e++)
            if (a.la.expert[i] != 2 - e) { /* both, or this expert's */
                lora_ex[e].ad[lora_ex[e].n] = lora_set.ad[i];
                lora_ex[e].weight[lora_ex[e].n++] = lora_set.weight[i];
            }
    }
    gp.sampler = pipe->sched_base.kind;
    if (a.sampler_str && (err = ditd_sampler_kind_from_str(a.sampler_str, &gp.sampler))) {
        ditd__gen_fail("--sampler", err);
        goto done;
    }
    ops->set_threads((int)a.threads);

    /* latents (n, C, h, w); for a pixel-space model they are the image */
    int C = pc->image_to_video ? pipe->shapes.out_channels : pipe->shapes.in_channels;
    int LH = pipe->shapes.height, LW = pipe->shapes.width;
    size_t numel = video ? pipe->numel : ditd_denoiser_numel_in(&pipe->shapes);
    if (a.latents_path && video) { /* (n, C, T, h, w) */
        int nd;
        int64_t shape[8];
        if ((err = ditd_npy_read_f32(a.latents_path, 8, &nd, shape, &noise))) {
            ditd__gen_fail("--latents", err);
            goto done;
        }
        if (nd != 5 || shape[0] != a.n || shape[1] != C || shape[2] != lat_t || shape[3] != LH ||
            shape[4] != LW) {
            fprintf(stderr, "ditd generate: --latents: %s has %d dims, expected (%ld, %d, %d, %d, "
                    "%d) (n, C, latent frames, h, w)\n", a.latents_path, nd, a.n, C, lat_t, LH, LW);
            goto done;
        }
    } else if (a.latents_path) {
        int nd;
        int64_t shape[8];
        if ((err = ditd_npy_read_f32(a.latents_path, 8, &nd, shape, &noise))) {
            ditd__gen_fail("--latents", err);
            goto done;
        }
        if (nd != 4 || shape[0] != a.n || shape[1] != C || shape[2] != LH || shape[3] != LW) {
            fprintf(stderr,
                    "ditd generate: --latents: %s has %d dims (%lld, %lld, %lld, %lld), expected "
                    "(%ld, %d, %d, %d)\n",
                    a.latents_path, nd, (long long)shape[0], nd > 1 ? (long long)shape[1] : 0LL,
                    nd > 2 ? (long long)shape[2] : 0LL, nd > 3 ? (long long)shape[3] : 0LL, a.n, C,
                    LH, LW);
            goto done;
        }
    }
    if (a.image_path && pc->image_to_video) { /* the condition and image embeddings, every rank */
        int W = LW * rep.info.vae_scale, H = LH * rep.info.vae_scale;
        ditd_image_cond *icond = rep.ic; /* the replica's, planned for this clip's size */
        if (!(i2v_cond = malloc(ditd_image_cond_numel(icond, nfr, W, H) * sizeof(float))) ||
            (ditd_image_cond_embeds_numel(icond) &&
             !(i2v_emb = malloc(ditd_image_cond_embeds_numel(icond) * sizeof(float))))) {
            ditd__gen_fail("the image condition", DITD_ENOMEM);
            goto done;
        }
        if ((err = ditd_image_cond_run(icond, in_img.pixels, in_img.width, in_img.height,
                                       last_img.pixels, last_img.width, last_img.height, nfr, W,
                                       H, i2v_cond, i2v_emb))) {
            ditd__gen_fail("encoding --image", err);
            goto done;
        }
        if (leader && !pr.quiet)
            fprintf(stderr, "image-to-video: %s %dx%d as the first of %d frames at %dx%d (%s)\n",
                    a.image_path, in_img.width, in_img.height, nfr, W, H, pc->name);
    } else if (a.image_path && kontext) { /* the references: the group encodes each together */
        const int vsc = rep.info.vae_scale;
        int rw = 0, rh = 0;
        uint8_t *ref_px = NULL;
        if ((err = ditd_pipeline_class_reference_size(
                 a.auto_resize >= 0 ? a.auto_resize : pc->auto_resize, in_img.width,
                 in_img.height, vsc, &rw, &rh))) {
            ditd__gen_fail("--image", err);
            goto done;
        }
        /* Diffusers' image list: every --image of one size (checked above),
         * output i takes reference i % k */
        const int k_ref = a.n_images > 1 ? a.n_images : 1;
        const size_t per_ref = (size_t)C * (rh / vsc) * (rw / vsc);
        ref_numel = per_ref;
        if (!(ref_lat = malloc((size_t)k_ref * per_ref * sizeof *ref_lat))) {
            fprintf(stderr, "ditd generate: out of memory\n");
            goto done;
        }
        for (int j = 0; j < k_ref; j++) {
            const ditd_image *im = j ? &in_more[j] : &in_img;
            if ((err = ditd__gen_reference_pixels(im, rw, rh, &ref_px))) {
                fprintf(stderr, "ditd generate: --image %s: %s\n", a.image_paths[j],
                        ditd_err_detail());
                goto done;
            }
            err = ditd_latent_image_encode_mode(li, ref_px ? ref_px : im->pixels, rh, rw,
                                                ref_lat + (size_t)j * per_ref);
            free(ref_px);
            ref_px = NULL;
            if (err) {
                ditd__gen_fail("encoding --image", err);
                goto done;
            }
        }
        if ((err = ditd_pipeline_set_reference(pipe, rh / vsc, rw / vsc))) {
            ditd__gen_fail("--image", err);
            goto done;
        }
        if (leader && !pr.quiet)
            fprintf(stderr, "reference: %s %dx%d as %dx%d (%s)\n", a.image_path, in_img.width,
                    in_img.height, rw, rh, pc->name);
    } else if (a.image_path) { /* the group encodes together (the same latents on every rank) */
        int st = 0;
        gp.strength = a.strength;
        if ((err = ditd_pipeline_strength_start(gp.steps, a.strength, &st))) {
            ditd__gen_fail("--strength", err);
            goto done;
        }
        const int k = a.n_images > 1 ? a.n_images : 1;
        if (!(img_lat = malloc((size_t)k * numel * sizeof *img_lat))) {
            fprintf(stderr, "ditd generate: out of memory\n");
            goto done;
        }
        for (int j = 0; j < k; j++) /* image j: its part of the one posterior draw */
            if ((err = ditd_latent_image_encode_nth(li, j ? in_more[j].pixels : in_img.pixels,
                                                    in_img.height, in_img.width,
                                                    (uint64_t)a.seed, j,
                                                    img_lat + (size_t)j * numel))) {
                ditd__gen_fail("encoding --image", err);
                goto done;
            }
        if (mask_l && (!(mask_lat = malloc((size_t)li->h * li->w * sizeof *mask_lat)) ||
                       ditd_latent_mask_from_gray(mask_l, in_img.height, in_img.width, li->h,
                                                  li->w, mask_lat))) {
            fprintf(stderr, "ditd generate: --mask: %s\n",
                    mask_lat ? ditd_err_detail() : "out of memory");
            goto done;
        }
        if (leader && !pr.quiet)
            fprintf(stderr, "%s: %s%s %dx%d, strength %g: %d of %d steps (%s), encoded on %d rank%s\n",
                    mask_l ? "inpaint" : "img2img", a.image_path, k > 1 ? " and more" : "",
                    in_img.width, in_img.height, a.strength, gp.steps - st, gp.steps,
                    erow->name, ditd_vae_last_stats(li->vae).ranks,
                    ditd_vae_last_stats(li->vae).ranks > 1 ? "s" : "");
    }
    samples = calloc((size_t)a.n, sizeof *samples);
    out = malloc((size_t)a.n * numel * sizeof *out);
    pix = malloc(li ? (size_t)li->Co * li->H * li->W : numel);
    if (!samples || !out || !pix) {
        fprintf(stderr, "ditd generate: out of memory\n");
        goto done;
    }
    for (long i = 0; i < a.n; i++) {
        samples[i].seed = (uint64_t)a.seed;
        samples[i].index = (uint64_t)i;
        samples[i].cond.class_id = class_id;
        if (text) {
            samples[i].cond.prompt = &te[0];
            samples[i].cond.negative = want_neg ? &te[1] : NULL;
        }
        samples[i].guidance = a.guidance >= 0 ? (float)a.guidance : rep.info.default_guidance;
        samples[i].true_cfg = (float)a.true_cfg;
        samples[i].has_guidance_2 = a.guidance_2 >= 0;
        samples[i].guidance_2 = (float)a.guidance_2;
        samples[i].loras = lora_set.n ? &lora_set : NULL;
        if (lora_split) {
            samples[i].loras = lora_ex[0].n ? &lora_ex[0] : NULL;
            samples[i].loras_2 = &lora_ex[1]; /* empty: none on transformer_2 */
        }
        const int k_img = a.n_images > 1 ? a.n_images : 1; /* output i edits image i % k */
        samples[i].image_latents =
            img_lat ? img_lat + (size_t)ditd_edit_image_of((int)i, k_img) * numel : NULL;
        samples[i].ref_latents =
            ref_lat ? ref_lat + (size_t)ditd_edit_image_of((int)i, k_img) * (ref_numel) : NULL;
        samples[i].mask_latents = mask_lat;
        samples[i].video_cond = i2v_cond;
        samples[i].image_embeds = i2v_emb;
    }
    if ((err = ditd_pipeline_set_cache(pipe, &a.cache_cfg))) { /* every rank alike */
        ditd__gen_fail("--cache", err);
        goto done;
    }
    if ((err = ditd_pipeline_generate(pipe, &gp, (int)a.n, samples, noise, out, NULL,
                                      leader ? on_step : NULL, &pr))) {
        ditd__gen_fail("generating", err);
        goto done;
    }
    for (long i = 0; leader && !pr.quiet && a.cache_cfg.method != DITD_CACHE_NONE && i < a.n; i++) {
        ditd_cache_stats st;
        ditd_pipeline_cache_stats(pipe, (int)i, &st);
        fprintf(stderr, "image %ld: %s skipped %d of %d steps, %ld of %ld block evaluations\n", i,
                ditd_cache_method_name(a.cache_cfg.method), st.steps_skipped, st.steps,
                st.evals_skipped, st.evals);
    }
    /* a latent model: every rank of the group decodes together */
    uint8_t *img_all = NULL;
    if (li && a.out_path) {
        img_all = leader ? malloc((size_t)a.n * li->Co * li->H * li->W) : NULL;
        if ((leader && !img_all) ||
            (err = ditd_latent_image_run_as(li, erow ? erow->unscale : li->rule, out, (int)a.n,
                                            NULL, img_all))) {
            ditd__gen_fail("decoding", err ? err : DITD_ENOMEM);
            free(img_all);
            goto done;
        }
    }
    /* a video model: the group decodes each clip (a band of rows per rank),
     * the leader gets the frames */
    int F = 0, S = 0;
    if (lv) {
        F = ditd_latent_video_frames(lv, lat_t);
        S = ditd_latent_video_scale(lv);
        size_t clip = (size_t)F * (size_t)(LH * S) * (size_t)(LW * S) * 3;
        vid = leader ? malloc((size_t)a.n * clip) : NULL;
        if ((leader && !vid) ||
            (err = ditd_latent_video_run(lv, out, (int)a.n, lat_t, LH, LW, vid))) {
            ditd__gen_fail("decoding", err ? err : DITD_ENOMEM);
            goto done;
        }
    }
    if (!leader) {
        rc = 0;
        goto done;
    }
    if (a.save_path) {
        int64_t shape[5] = {a.n, C, video ? lat_t : LH, video ? LH : LW, LW};
        if ((err = ditd_npy_write_f32(a.save_path, video ? 5 : 4, shape, out))) {
            ditd__gen_fail("--save-latents", err);
            goto done;
        }
    }
    if (lv) { /* a video model: no image tail (img_all is NULL) */
        rc = ditd__gen_write_clips(vid, (int)a.n, F, LH * S, LW * S, a.out_path, want_mp4,
                                   a.save_frames, rep.info.fps, pr.quiet, a.seed, gp.steps);
        goto done;
    }
    for (long i = 0; a.out_path && i < a.n; i++) {
        char path[4096];
        const char *dot = strrchr(a.out_path, '.');
        if (a.n == 1)
            snprintf(path, sizeof path, "%s", a.out_path);
        else if (dot && strchr(dot, '/') == NULL)
            snprintf(path, sizeof path, "%.*s-%ld%s", (int)(dot - a.out_path), a.out_path, i, dot);
        else
            snprintf(path, sizeof path, "%s-%ld", a.out_path, i);
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
            ditd__gen_fail(path, err);
            free(img_all);
            goto done;
        }
        if (!pr.quiet && text)
            fprintf(stderr, "wrote %s (%dx%d, seed %ld, %d steps, guidance %g, %s)\n", path, pw, ph,
                    a.seed, gp.steps, (double)samples[0].guidance,
                    ditd_sampler_kind_name(gp.sampler));
        else if (!pr.quiet)
            fprintf(stderr, "wrote %s (class %d \"%s\", seed %ld, %d steps, guidance %g, %s)\n",
                    path, class_id, rep.info.labels[class_id], a.seed, gp.steps,
                    (double)samples[0].guidance, ditd_sampler_kind_name(gp.sampler));
    }
    free(img_all);
    rc = 0;
done:
    free(vid);
    for (int i = 0; i < lora_set.n; i++)
        ditd_lora_dev_free((ditd_lora_dev *)lora_set.ad[i]);
    for (int i = 0; i < text_lora_set.n; i++)
        ditd_text_lora_free((ditd_text_lora *)text_lora_set.ad[i]);
    ditd_image_free(&in_img);
    for (int j = 0; j < DITD_EDIT_MAX_IMAGES; j++)
        ditd_image_free(&in_more[j]);
    free(img_lat);
    ditd_image_free(&last_img);
    free(i2v_cond);
    free(i2v_emb);
    free(mask_l);
    free(mask_lat);
    free(ref_lat);
    free(emb);
    free(te);
    ditd_replica_close(&rep);
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
