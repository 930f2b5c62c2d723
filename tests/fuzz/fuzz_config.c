/* libFuzzer target: the two JSON configs a model folder brings,
 * scheduler/scheduler_config.json (typed, then converted to every sampler
 * and built for a few step counts), transformer/config.json (DiT, SD3,
 * WanTransformer3DModel) and vae/config.json (AutoencoderKL,
 * AutoencoderKLWan). Any input
 * must give 0 or an error with a detail, never a crash or a leak. */
#include <stdint.h>
#include <stdlib.h>

#include "engine/models/dit/dit_config.h"
#include "engine/models/sd3/sd3_config.h"
#include "engine/models/vae/vae_config.h"
#include "engine/models/wan_vae/wan_vae_config.h"
#include "engine/models/wan/wan_config.h"
#include "engine/core/error.h"
#include "engine/pipeline/sampler.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ditd_sched_config base, cfg;
    ditd_dit_config dit;
    ditd_vae_config vae;
    ditd_sd3_config sd3;
    ditd_wan_vae_config wan;

    if (ditd_sched_config_parse((const char *)data, size, "fuzz.json", &base) == 0) {
        for (int k = 0; k < DITD_SAMPLER_KIND_COUNT; k++) {
            if (ditd_sched_config_convert(&base, (ditd_sampler_kind)k, &cfg) != 0)
                continue;
            cfg.image_seq_len = 1024; /* reach flow's dynamic shifting */
            static const int steps[] = {1, 2, 7, 50};
            for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
                ditd_sampler *s = NULL;
                if (ditd_sampler_new(&cfg, steps[i], 1, 4, &s) == 0) {
                    if (!s || ditd_sampler_num_steps(s) < 1)
                        abort();
                    ditd_sampler_free(s);
                } else if (s || ditd_err_detail()[0] == '\0') {
                    abort();
                }
            }
        }
    } else if (ditd_err_detail()[0] == '\0') {
        abort();
    }
    ditd_err_clear();
    if (ditd_dit_config_parse((const char *)data, size, "fuzz.json", &dit) == 0) {
        if (dit.inner_dim != dit.num_heads * dit.head_dim || dit.inner_dim % 4)
            abort();
    } else if (ditd_err_detail()[0] == '\0') {
        abort();
    }
    ditd_err_clear();
    if (ditd_sd3_config_parse((const char *)data, size, "fuzz.json", &sd3) == 0) {
        /* what the SD3 model relies on */
        int n_dual = 0;
        for (int l = 0; l < DITD_SD3_MAX_LAYERS; l++) {
            if (sd3.dual[l] && l >= sd3.num_layers)
                abort();
            n_dual += sd3.dual[l] != 0;
        }
        if (n_dual != sd3.n_dual || sd3.inner_dim != sd3.num_heads * sd3.head_dim ||
            sd3.inner_dim % 4 || sd3.caption_projection_dim != sd3.inner_dim ||
            sd3.pos_embed_max_size < 1 || sd3.sample_size < sd3.patch_size ||
            sd3.out_channels < 1 || sd3.mlp_dim != 4 * sd3.inner_dim)
            abort();
    } else if (ditd_err_detail()[0] == '\0') {
        abort();
    }
    ditd_err_clear();
    if (ditd_vae_config_parse((const char *)data, size, "fuzz.json", &vae) == 0) {
        /* what the VAE relies on */
        if (vae.n_blocks < 1 || vae.n_blocks > DITD_VAE_MAX_BLOCKS || vae.norm_num_groups < 1 ||
            ditd_vae_config_scale_factor(&vae) != 1 << (vae.n_blocks - 1))
            abort();
        for (int i = 0; i < vae.n_blocks; i++)
            if (vae.block_out_channels[i] < 1 || vae.block_out_channels[i] % vae.norm_num_groups)
                abort();
    } else if (ditd_err_detail()[0] == '\0') {
        abort();
    }
    ditd_err_clear();
    if (ditd_wan_vae_config_parse((const char *)data, size, "fuzz.json", &wan) == 0) {
        /* what the Wan VAE relies on */
        if (wan.n_mult < 1 || wan.n_mult > DITD_WAN_VAE_MAX_BLOCKS || wan.z_dim < 1 ||
            wan.z_dim > DITD_WAN_VAE_MAX_Z || wan.patch_size < 1 ||
            wan.in_channels % (wan.patch_size * wan.patch_size) ||
            wan.out_channels % (wan.patch_size * wan.patch_size) ||
            wan.n_latents_mean != wan.z_dim || wan.n_latents_std != wan.z_dim ||
            ditd_wan_vae_config_time_factor(&wan) > 4 ||
            wan.scale_factor_spatial != ditd_wan_vae_config_scale_factor(&wan))
            abort();
    } else if (ditd_err_detail()[0] == '\0') {
        abort();
    }
    ditd_err_clear();
    ditd_wan_config wt;
    if (ditd_wan_config_parse((const char *)data, size, "fuzz.json", &wt) == 0) {
        /* what the Wan model relies on */
        if (wt.inner_dim != wt.num_heads * wt.head_dim || wt.patch_t != 1 ||
            wt.patch_h != wt.patch_w || wt.patch_h < 1 || wt.out_channels < 1 ||
            wt.rope_t + wt.rope_h + wt.rope_w != wt.head_dim || wt.rope_t < 2 ||
            wt.rope_h % 2 || wt.rope_t % 2 || wt.freq_dim % 2 || !(wt.eps > 0.0f) ||
            (wt.image_dim > 0) != (wt.image_len > 0) ||
            (wt.image_dim && wt.added_kv_proj_dim != wt.inner_dim))
            abort();
    } else if (ditd_err_detail()[0] == '\0') {
        abort();
    }
    return 0;
}
