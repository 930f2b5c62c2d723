/* libFuzzer target: a text encoder's config.json (CLIPTextConfig,
 * T5Config, UMT5Config), with and without a model_index.json class; and an
 * image encoder's (CLIPVisionConfig) and its processor's
 * preprocessor_config.json (CLIPImageProcessor, then run on a small image
 * when its sizes are small). Any input must give 0 with a config inside the
 * ranges the encoders rely on, or an error with a detail; never a crash or a
 * leak. */
#include <stdint.h>
#include <stdlib.h>

#include "engine/core/error.h"
#include "engine/text/text_config.h"
#include "engine/vision/clip_vision.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const char *const hints[] = {NULL, "CLIPTextModel", "T5EncoderModel", "UMT5EncoderModel"};
    for (size_t h = 0; h < sizeof hints / sizeof hints[0]; h++) {
        ditd_text_config c;
        ditd_err_clear();
        if (ditd_text_config_parse((const char *)data, size, "fuzz.json", hints[h], &c) != 0) {
            if (ditd_err_detail()[0] == '\0')
                abort();
            continue;
        }
        if (c.arch == DITD_TEXT_T5 || c.arch == DITD_TEXT_UMT5) {
            const ditd_t5_config *t = &c.t5;
            if (t->bias_per_layer != (c.arch == DITD_TEXT_UMT5))
                abort();
            if (t->d_model <= 0 || t->d_kv <= 0 || t->num_heads <= 0 || t->num_layers <= 0 ||
                t->num_buckets < 4 || t->max_distance <= t->num_buckets / 4 || !(t->eps > 0.0f))
                abort();
        } else {
            const ditd_clip_text_config *k = &c.clip;
            if (k->hidden_size <= 0 || k->num_heads <= 0 || k->hidden_size % k->num_heads ||
                k->max_positions <= 0 || k->eos_token_id < 0 || !(k->eps > 0.0f) ||
                k->legacy_argmax != (k->eos_token_id == 2))
                abort();
        }
    }
    /* the image encoder's config and processor */
    ditd_clip_vision_config v;
    ditd_err_clear();
    if (ditd_clip_vision_config_parse((const char *)data, size, "fuzz.json", NULL, &v) == 0) {
        if (v.hidden_size < 1 || v.num_heads < 1 || v.hidden_size % v.num_heads ||
            v.patch_size < 1 || v.image_size % v.patch_size || !(v.eps > 0.0f))
            abort();
    } else if (ditd_err_detail()[0] == '\0') {
        abort();
    }
    ditd_clip_image_processor p;
    ditd_err_clear();
    if (ditd_clip_image_processor_parse((const char *)data, size, "fuzz.json", &p) == 0) {
        int ow, oh;
        static const uint8_t img[6][8][3];
        ditd_clip_image_processor_out_size(&p, 8, 6, &ow, &oh);
        if (ow >= 1 && oh >= 1 && ow <= 64 && oh <= 64 && p.shortest_edge <= 64 &&
            p.size_w <= 64 && p.size_h <= 64) {
            float *out = malloc((size_t)3 * ow * oh * sizeof *out);
            if (out && ditd_clip_image_preprocess(&p, &img[0][0][0], 8, 6, out) != 0 &&
                ditd_err_detail()[0] == '\0')
                abort();
            free(out);
        }
    } else if (ditd_err_detail()[0] == '\0') {
        abort();
    }
    return 0;
}
