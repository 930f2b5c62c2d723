/* Unit: vae/config.json (AutoencoderKL) parsing: the published configs
 * (sd-vae-ft-ema, the FLUX.1 VAE) read with their values and defaults, the
 * scale factor from len(block_out_channels), and every refusal naming the
 * key and the value. */
#include <string.h>

#include "engine/backend/backend.h"
#include "engine/core/error.h"
#include "engine/models/vae/vae_config.h"
#include "tests/test_util.h"

static const char *SD =
    "{\"_class_name\": \"AutoencoderKL\", \"_diffusers_version\": \"0.4.2\", \"act_fn\": \"silu\","
    " \"block_out_channels\": [128, 256, 512, 512], \"down_block_types\": [\"DownEncoderBlock2D\","
    " \"DownEncoderBlock2D\", \"DownEncoderBlock2D\", \"DownEncoderBlock2D\"], \"in_channels\": 3,"
    " \"latent_channels\": 4, \"layers_per_block\": 2, \"norm_num_groups\": 32, \"out_channels\": 3,"
    " \"sample_size\": 256, \"up_block_types\": [\"UpDecoderBlock2D\", \"UpDecoderBlock2D\","
    " \"UpDecoderBlock2D\", \"UpDecoderBlock2D\"]}";

static const char *FLUX =
    "{\"_class_name\": \"AutoencoderKL\", \"act_fn\": \"silu\", \"block_out_channels\": [128, 256, 512, 512],"
    " \"down_block_types\": [\"DownEncoderBlock2D\", \"DownEncoderBlock2D\", \"DownEncoderBlock2D\","
    " \"DownEncoderBlock2D\"], \"force_upcast\": true, \"in_channels\": 3, \"latent_channels\": 16,"
    " \"latents_mean\": null, \"latents_std\": null, \"layers_per_block\": 2, \"mid_block_add_attention\": true,"
    " \"norm_num_groups\": 32, \"out_channels\": 3, \"sample_size\": 1024, \"scaling_factor\": 0.3611,"
    " \"shift_factor\": 0.1159, \"up_block_types\": [\"UpDecoderBlock2D\", \"UpDecoderBlock2D\","
    " \"UpDecoderBlock2D\", \"UpDecoderBlock2D\"], \"use_post_quant_conv\": false, \"use_quant_conv\": false}";

/* SD with one key's value replaced (text substitution). */
static int parse_with(const char *from, const char *to, ditd_vae_config *c)
{
    char buf[4096];
    const char *at = strstr(SD, from);
    TU_CHECK(at != NULL, "test bug: %s not in the config", from);
    if (!at)
        return 0;
    snprintf(buf, sizeof buf, "%.*s%s%s", (int)(at - SD), SD, to, at + strlen(from));
    return ditd_vae_config_parse(buf, strlen(buf), "vae/config.json", c);
}

#define REFUSED(from, to, code, words1, words2)                                               \
    do {                                                                                      \
        ditd_vae_config c_;                                                                   \
        ditd_err_clear();                                                                     \
        int e_ = parse_with((from), (to), &c_);                                               \
        TU_CHECK(e_ == (code) && tu_has(ditd_err_detail(), (words1)) &&                       \
                     tu_has(ditd_err_detail(), (words2)),                                     \
                 "%s -> %s: got %s \"%s\" (want %s naming %s, %s)", (from), (to), ditd_err_name(e_), \
                 ditd_err_detail(), ditd_err_name(code), (words1), (words2));                 \
    } while (0)

int main(void)
{
    /* the mid-block attention's head (block_out_channels[-1]) is the
     * backend's question, asked where the VAE loads: a config with 1024
     * parses; the CPU's attention (up to 512) refuses it, naming itself */
    TU_CHECK_ERR(ditd_backend_check_head_dim(&ditd_backend_cpu, 1024,
                                             "the mid-block attention's head (block_out_channels[-1])"),
                 DITD_EUNSUPPORTED, "block_out_channels[-1]) = 1024", "cpu", "1..512");
    TU_OK(ditd_backend_check_head_dim(&ditd_backend_cpu, 512, "head"));

    ditd_vae_config c;

    TU_OK(ditd_vae_config_parse(SD, strlen(SD), "sd", &c));
    TU_CHECK(c.latent_channels == 4 && c.n_blocks == 4 && c.block_out_channels[3] == 512 &&
                 c.layers_per_block == 2 && c.norm_num_groups == 32 && c.sample_size == 256,
             "sd-vae-ft-ema sizes");
    /* absent keys take AutoencoderKL's defaults */
    TU_CHECK(c.scaling_factor == 0.18215 && !c.has_shift_factor && c.use_quant_conv &&
                 c.use_post_quant_conv && c.mid_block_add_attention && c.force_upcast,
             "sd-vae-ft-ema defaults");
    TU_CHECK(ditd_vae_config_scale_factor(&c) == 8, "scale factor %d (want 8)",
             ditd_vae_config_scale_factor(&c));
    TU_OK(ditd_vae_config_parse(FLUX, strlen(FLUX), "flux", &c));
    TU_CHECK(c.latent_channels == 16 && c.has_shift_factor && c.shift_factor == 0.1159 &&
                 c.scaling_factor == 0.3611 && !c.use_quant_conv && !c.use_post_quant_conv,
             "FLUX.1 VAE values");
    {
        /* the defaults of an empty object: one block of 64, 4 latent channels, scale 1 */
        TU_OK(ditd_vae_config_parse("{}", 2, "empty", &c));
        TU_CHECK(c.n_blocks == 1 && c.block_out_channels[0] == 64 && c.layers_per_block == 1 &&
                     ditd_vae_config_scale_factor(&c) == 1 && c.sample_size == 32,
                 "defaults of {}");
        /* a 3-block VAE scales by 4, not 8 */
        const char *t = "{\"block_out_channels\": [32, 64, 64], \"norm_num_groups\": 32,"
                        " \"down_block_types\": [\"DownEncoderBlock2D\", \"DownEncoderBlock2D\", \"DownEncoderBlock2D\"],"
                        " \"up_block_types\": [\"UpDecoderBlock2D\", \"UpDecoderBlock2D\", \"UpDecoderBlock2D\"],"
                        " \"sample_size\": [64, 64]}";
        TU_OK(ditd_vae_config_parse(t, strlen(t), "three", &c));
        TU_CHECK(ditd_vae_config_scale_factor(&c) == 4 && c.sample_size == 64, "3 blocks: scale %d",
                 ditd_vae_config_scale_factor(&c));
    }
    TU_OK(ditd_vae_config_named("sd-vae-ft-ema", &c));
    TU_CHECK(c.latent_channels == 4 && ditd_vae_config_decode_flops(&c, 32, 32) > 1e11,
             "sd-vae-ft-ema: %.3g FLOPs for a 32x32 latent", ditd_vae_config_decode_flops(&c, 32, 32));
    TU_OK(ditd_vae_config_named("flux-vae", &c));
    TU_CHECK(c.latent_channels == 16 && c.has_shift_factor, "flux-vae named");
    TU_CHECK_ERR(ditd_vae_config_named("sdxl", &c), DITD_EINVAL, "sdxl", "sd-vae-ft-ema");

    /* refusals: each names the key and the value */
    REFUSED("\"_class_name\": \"AutoencoderKL\"", "\"_class_name\": \"AutoencoderTiny\"",
            DITD_EUNSUPPORTED, "_class_name", "AutoencoderTiny");
    REFUSED("\"act_fn\": \"silu\"", "\"act_fn\": \"gelu\"", DITD_EUNSUPPORTED, "act_fn", "gelu");
    REFUSED("\"act_fn\": \"silu\"", "\"act_fn\": 3", DITD_EFORMAT, "act_fn", "string");
    REFUSED("\"DownEncoderBlock2D\", \"DownEncoderBlock2D\"]", "\"DownEncoderBlock2D\", \"AttnDownEncoderBlock2D\"]",
            DITD_EUNSUPPORTED, "down_block_types[3]", "AttnDownEncoderBlock2D");
    REFUSED("\"UpDecoderBlock2D\", \"UpDecoderBlock2D\"]", "\"UpDecoderBlock2D\"]",
            DITD_EUNSUPPORTED, "up_block_types has 3", "block_out_channels 4");
    REFUSED("\"norm_num_groups\": 32", "\"norm_num_groups\": 48", DITD_EUNSUPPORTED,
            "block_out_channels[0] = 128", "norm_num_groups = 48");
    REFUSED("\"latent_channels\": 4", "\"latent_channels\": 0", DITD_EUNSUPPORTED, "latent_channels", "0");
    REFUSED("\"latent_channels\": 4", "\"latent_channels\": \"4\"", DITD_EFORMAT, "latent_channels",
            "integer");
    REFUSED("\"layers_per_block\": 2", "\"layers_per_block\": 99", DITD_EUNSUPPORTED, "layers_per_block",
            "99");
    REFUSED("[128, 256, 512, 512]", "[128, 256, 512, -32]", DITD_EUNSUPPORTED, "block_out_channels[3]",
            "-32");
    REFUSED("[128, 256, 512, 512]", "[]", DITD_EFORMAT, "block_out_channels", "non-empty");
    REFUSED("\"sample_size\": 256", "\"sample_size\": [256, 128]", DITD_EUNSUPPORTED, "sample_size",
            "[256, 128]");
    REFUSED("\"sample_size\": 256", "\"sample_size\": \"big\"", DITD_EFORMAT, "sample_size", "integer");
    REFUSED("\"in_channels\": 3", "\"in_channels\": 3, \"scaling_factor\": -1", DITD_EUNSUPPORTED,
            "scaling_factor", "-1");
    REFUSED("\"in_channels\": 3", "\"in_channels\": 3, \"latents_mean\": [0.1, 0.2]", DITD_EUNSUPPORTED,
            "latents_mean has 2", "latent_channels = 4");
    REFUSED("\"in_channels\": 3", "\"in_channels\": 3, \"use_quant_conv\": 1", DITD_EFORMAT,
            "use_quant_conv", "true or false");
    REFUSED("\"in_channels\": 3", "\"in_channels\": 3, \"shift_factor\": \"x\"", DITD_EFORMAT,
            "shift_factor", "number");
    {
        ditd_err_clear();
        TU_CHECK_ERR(ditd_vae_config_parse("[1]", 3, "vae/config.json", &c), DITD_EFORMAT,
                     "vae/config.json", "not a JSON object");
        TU_CHECK_ERR(ditd_vae_config_parse("{", 1, "vae/config.json", &c), DITD_EFORMAT,
                     "vae/config.json");
    }
    return tu_exit();
}
