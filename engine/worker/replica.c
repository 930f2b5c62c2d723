/* Opening a replica (replica.h): backend, folder, pipeline, tail, image
 * condition, encoders. */
#include "engine/worker/replica.h"

#include <stdio.h>
#include <string.h>

#include "engine/core/error.h"

static int group_size(const ditd_mesh *m)
{
    return m ? m->size : 1;
}

/* The device, and on a GPU group its collectives on NCCL: every rank takes
 * part in the switch, whether or not its own device opened (it says so to
 * the others), so that none is left in NCCL's bootstrap. */
static int open_device(const ditd_replica_opts *o, ditd_replica *r)
{
    int err = ditd_backend_check(o->device);
    if (!err && !(r->ops = ditd_backend_open(o->device)))
        err = DITD_EDEVICE;
    if (o->device != DITD_DEVICE_CPU && group_size(o->mesh) > 1) {
        char own[512];
        snprintf(own, sizeof own, "%s", ditd_err_detail());
        int e = ditd_mesh_use_nccl(o->mesh, !err, o->comm_timeout_ms);
        if (err)
            ditd_err_set(err, "%s", own); /* this rank's reason, not the agreement's */
        else
            err = e;
    }
    return err;
}

/* The latents' tail on the whole group, on each rank's CPU backend (also
 * on a GPU replica: the VAEs have no device decode yet, docs/vae.md). */
static int open_decode(const ditd_replica_opts *o, ditd_replica *r)
{
    const ditd_model_info *m = &r->info;
    ditd_comm *group = group_size(o->mesh) > 1 ? o->mesh->group : NULL;
    if (m->frames > 0) { /* a clip: a band of rows per rank, planned for the largest size */
        if (!m->vae_dir[0] || m->vae_scale <= 0)
            return ditd_err_set(DITD_EUNSUPPORTED, "%s: a video model without vae/: its clips "
                                "cannot be decoded", m->name);
        if (o->vae_tiling)
            return ditd_err_set(DITD_EUNSUPPORTED, "--vae-tiling: image models only (a clip is "
                                "decoded frame chunk by frame chunk)");
        int h = o->video_h > 0 ? o->video_h : m->max_size / m->vae_scale;
        int w = o->video_w > 0 ? o->video_w : m->max_size / m->vae_scale;
        return ditd_latent_video_new_group(m, &ditd_backend_cpu, h, w, group, &r->lv);
    }
    if (!m->needs_vae)
        return 0;
    return ditd_latent_image_new(m, &ditd_backend_cpu, group, o->vae_tiling, &r->li);
}

/* A text model's encoders, on the text rank only, on the CPU backend (the
 * GPU is the denoiser's). */
static int open_text(const ditd_replica_opts *o, ditd_replica *r)
{
    const int G = group_size(o->mesh), me = G > 1 ? o->mesh->rank : 0;
    if (r->info.shapes.cond.kind != DITD_COND_TEXT)
        return 0;
    if (o->text_rank < 0 || o->text_rank >= G)
        return ditd_err_set(DITD_EINVAL, "text encoder rank %d: the replica's group has ranks "
                            "0..%d", o->text_rank, G - 1);
    if (me != o->text_rank)
        return 0;
    ditd_prompt_encoder_opts to = o->text_opts;
    if (to.max_sequence_length <= 0)
        to.max_sequence_length = r->info.max_sequence_length;
    return ditd_prompt_encoder_new(&r->info, &ditd_backend_cpu, &to, &r->penc);
}

int ditd_replica_begin(const ditd_replica_opts *o, ditd_replica *r)
{
    int err;
    memset(r, 0, sizeof *r);
    if ((err = open_device(o, r)))
        return err;
    if ((err = ditd_model_info_load(o->model_dir, &r->info)))
        return err;
    r->have_info = 1;
    if ((err = ditd_model_info_set_files(&r->info, o->transformer_file, o->text_encoder_2_file)))
        return err;
    return 0;
}

int ditd_replica_load(const ditd_replica_opts *o, ditd_replica *r)
{
    ditd_dtype ckpt;
    int err;
    if (!r->have_info || !r->ops)
        return ditd_err_set(DITD_EINVAL, "ditd_replica_load before ditd_replica_begin");
    /* the denoiser's table by its weights' dtype (or auto by the
     * checkpoint's); the VAE and the encoders keep the f32 CPU table they
     * are written for */
    if ((err = ditd_model_checkpoint_dtype(r->info.transformer_file[0] ? r->info.transformer_file
                                                                     : r->info.transformer_dir,
                                           &ckpt)))
        return err;
    if (!(r->wops = ditd_backend_for_weights(r->ops, o->dtype ? o->dtype : "auto", ckpt)))
        return DITD_EINVAL;
    if ((err = ditd_pipeline_new_group(&r->info, r->wops, o->max_samples, o->mesh, &r->pipe)))
        return err;
    if (o->decode == DITD_REPLICA_DECODE && (err = open_decode(o, r)))
        return err;
    if (r->info.pipeline->image_to_video) { /* every rank makes the same condition */
        const int vs = r->info.vae_scale > 0 ? r->info.vae_scale : 1;
        int h = o->video_h > 0 ? o->video_h * vs : r->info.max_size;
        int w = o->video_w > 0 ? o->video_w * vs : r->info.max_size;
        if ((err = ditd_image_cond_new(&r->info, &ditd_backend_cpu, w, h, &r->ic)))
            return err;
    }
    if (o->text && (err = open_text(o, r)))
        return err;
    return 0;
}

int ditd_replica_open(const ditd_replica_opts *o, ditd_replica *r)
{
    int err = ditd_replica_begin(o, r);
    return err ? err : ditd_replica_load(o, r);
}

void ditd_replica_close(ditd_replica *r)
{
    ditd_prompt_encoder_free(r->penc);
    ditd_image_cond_free(r->ic);
    ditd_latent_image_free(r->li);
    ditd_latent_video_free(r->lv);
    ditd_pipeline_free(r->pipe);
    if (r->have_info)
        ditd_model_info_free(&r->info);
    memset(r, 0, sizeof *r);
}
