/* libFuzzer target: the two JSON configs a model folder brings,
 * scheduler/scheduler_config.json (typed, then converted to every sampler
 * and built for a few step counts), transformer/config.json and
 * vae/config.json (AutoencoderKL), and transformer/config.json as
 * WanTransformer3DModel. Any input
 * must give 0 or an error with a detail, never a crash or a leak. */
#include <stdint.h>
#include <stdlib.h>

#include "engine/models/dit/dit_config.h"
#include "engine/models/vae/vae_config.h"
#include "engine/models/wan/wan_config.h"
#include "engine/core/error.h"
#include "engine/pipeline/sampler.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ditd_sched_config base, cfg;
    ditd_dit_config dit;
    ditd_vae_config vae;

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
    ditd_wan_config wan;
    if (ditd_wan_config_parse((const char *)data, size, "fuzz.json", &wan) == 0) {
        /* what the Wan model relies on */
        if (wan.inner_dim != wan.num_heads * wan.head_dim || wan.patch_t != 1 ||
            wan.patch_h != wan.patch_w || wan.patch_h < 1 || wan.out_channels < 1 ||
            wan.rope_t + wan.rope_h + wan.rope_w != wan.head_dim || wan.rope_t < 2 ||
            wan.rope_h % 2 || wan.rope_t % 2 || wan.freq_dim % 2 || !(wan.eps > 0.0f) ||
            (wan.image_dim > 0) != (wan.image_len > 0) ||
            (wan.image_dim && wan.added_kv_proj_dim != wan.inner_dim))
            abort();
    } else if (ditd_err_detail()[0] == '\0') {
        abort();
    }
    return 0;
}
