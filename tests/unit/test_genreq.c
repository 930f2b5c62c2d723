/* The request validator (server/daemon/genreq.h) against a class model and a
 * resizable text model, without a daemon: which bodies it accepts (with
 * their defaults filled: size, max_sequence_length, true_cfg_scale, the
 * model's steps and guidance; prompts copied), and which it refuses, with
 * the status, the `param` and words of the message each refusal must have.
 * The http suite checks the same over HTTP with a served text model; this
 * runs everywhere, ASan/UBSan included. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ditd_build_config.h"
#include "engine/core/error.h"
#include "server/daemon/genreq.h"

static int failures, checks;

#define CHECK(cond, ...)                                                                   \
    do {                                                                                   \
        checks++;                                                                          \
        if (!(cond)) {                                                                     \
            failures++;                                                                    \
            printf("FAIL %s:%d: ", __FILE__, __LINE__);                                    \
            printf(__VA_ARGS__);                                                           \
            printf("\n");                                                                  \
        }                                                                                  \
    } while (0)

static char *labels[] = {"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat"};
static ditd_model_info cls, txt, sd3, t2v, i2v, flf;
static const char *const aliases[] = {"black-forest-labs/FLUX.1-dev", "flux"};
static const char *const lora_names[] = {"style", "char.v2"};
static ditd_genreq_model gm_cls, gm_txt, gm_sd3, gm_t2v, gm_i2v, gm_flf;

static void models(void)
{
    strcpy(cls.name, "fashion");
    cls.shapes.height = cls.shapes.width = 28;
    cls.shapes.in_channels = 1;
    cls.shapes.tokens = 49;
    cls.image_width = cls.image_height = 28;
    cls.image_channels = 1;
    cls.num_classes = 5;
    cls.labels = labels;
    cls.min_size = cls.max_size = 28;
    cls.default_steps = 25;
    cls.default_guidance = 4.0f;
    cls.pipeline = &ditd_pipeline_dit;
    gm_cls = (ditd_genreq_model){&cls, NULL, 0, DITD_SAMPLER_DDIM, NULL, lora_names, 2, 2, NULL};

    strcpy(txt.name, "dev");
    txt.shapes.cond.kind = DITD_COND_TEXT;
    txt.shapes.height = txt.shapes.width = 128;
    txt.shapes.in_channels = 16;
    txt.shapes.tokens = 4096;
    txt.vae_scale = 8;
    txt.image_width = txt.image_height = 1024;
    txt.image_channels = 3;
    txt.resizable = 1;
    txt.size_multiple = 16;
    txt.min_size = 16;
    txt.max_size = 2048;
    txt.max_sequence_length = 512;
    txt.default_max_sequence_length = 512;
    txt.default_steps = 28;
    txt.default_guidance = 3.5f;
    txt.pipeline = &ditd_pipeline_flux;
    gm_txt = (ditd_genreq_model){&txt, aliases, 2, DITD_SAMPLER_FLOW_EULER, NULL, NULL, 0, 4, NULL};

    sd3 = txt; /* StableDiffusion3Pipeline's row: three prompts, skip-layer guidance */
    strcpy(sd3.name, "sd3");
    sd3.pipeline = &ditd_pipeline_sd3;
    sd3.default_max_sequence_length = 256;
    sd3.default_steps = 28;
    sd3.default_guidance = 7.0f;
    gm_sd3 = (ditd_genreq_model){&sd3, NULL, 0, DITD_SAMPLER_FLOW_EULER, NULL, NULL, 0, 4, NULL};

    t2v = txt; /* WanPipeline and WanImageToVideoPipeline: clips of 81 frames at 16 fps */
    strcpy(t2v.name, "wan");
    t2v.pipeline = &ditd_pipeline_wan;
    t2v.frames = 81;
    t2v.frame_step = 4;
    t2v.max_frames = 257;
    t2v.fps = 16;
    t2v.default_steps = 50;
    t2v.default_guidance = 5.0f;
    gm_t2v = (ditd_genreq_model){&t2v, NULL, 0, DITD_SAMPLER_UNIPC, NULL, NULL, 0, 4, NULL};
    i2v = t2v;
    strcpy(i2v.name, "wan-i2v");
    i2v.pipeline = &ditd_pipeline_wan_i2v;
    gm_i2v = (ditd_genreq_model){&i2v, NULL, 0, DITD_SAMPLER_UNIPC, NULL, NULL, 0, 4, NULL};
    flf = i2v;
    strcpy(flf.name, "wan-flf2v");
    flf.last_image = 1;
    gm_flf = (ditd_genreq_model){&flf, NULL, 0, DITD_SAMPLER_UNIPC, NULL, NULL, 0, 4, NULL};
}

/* POST /v1/videos bodies: a text-to-video model takes a prompt alone and
 * refuses input_reference naming it; an image-to-video one
 * (WanImageToVideoPipeline) needs it: base64, a data URL or {"image_url"}
 * (a 3x2 RGB PNG, pixel (x, y) = (10x + y, 20, 200)), decoded at its own
 * size; without one, or with one that is no image, 400 naming it */
#define PNG_3X2 "iVBORw0KGgoAAAANSUhEUgAAAAMAAAACCAIAAAASFvFNAAAAHElEQVR4nGNgEDnBJXJCROQEA6PICW6RE6IiJwAxIgVoforT9AAAAABJRU5ErkJggg=="
static void test_video(void)
{
    static const struct {
        const ditd_genreq_model *gm;
        const char *body;
        const char *says; /* NULL: accepted */
    } cases[] = {
        {&gm_t2v, "{\"prompt\":\"a fox\",\"num_frames\":33}", NULL},
        {&gm_t2v, "{\"prompt\":\"a fox\",\"input_reference\":true}", "(text-to-video)"},
        {&gm_t2v, "{\"prompt\":\"a fox\",\"input_reference\":\"" PNG_3X2 "\"}", "(text-to-video)"},
        {&gm_i2v, "{\"prompt\":\"a fox\",\"num_frames\":33,\"input_reference\":\"" PNG_3X2 "\"}",
         NULL},
        {&gm_i2v, "{\"prompt\":\"a fox\",\"num_frames\":33,\"input_reference\":"
                  "\"data:image/png;base64," PNG_3X2 "\"}", NULL},
        {&gm_i2v, "{\"prompt\":\"a fox\",\"num_frames\":33,\"input_reference\":"
                  "{\"image_url\":\"data:image/png;base64," PNG_3X2 "\"}}", NULL},
        {&gm_i2v, "{\"prompt\":\"a fox\"}", "give 'input_reference'"},
        {&gm_i2v, "{\"prompt\":\"a fox\",\"input_reference\":null}", "give 'input_reference'"},
        {&gm_i2v, "{\"prompt\":\"a fox\",\"input_reference\":true}", "base64 string"},
        {&gm_i2v, "{\"prompt\":\"a fox\",\"input_reference\":\"@@@\"}", "not valid base64"},
        {&gm_i2v, "{\"prompt\":\"a fox\",\"input_reference\":\"data:image/png;base64,AAAA\"}",
         "'input_reference': "},
        {&gm_i2v, "{\"prompt\":\"a fox\",\"input_reference\":\"https://x/a.png\"}",
         "not fetched"},
    };
    int n = 0, accepted = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ditd_genreq r;
        ditd_api_error e;
        memset(&r, 0, sizeof r);
        memset(&e, 0, sizeof e);
        int err = ditd_genreq_parse_video(cases[i].body, strlen(cases[i].body), cases[i].gm, &r, &e);
        if (!cases[i].says) {
            CHECK(err == 0 && r.frames == 33, "%s: accepted, 33 frames (%d: %s)", cases[i].body,
                  err, e.message);
            if (cases[i].gm == &gm_i2v) {
                int px_ok = r.image && r.image_w == 3 && r.image_h == 2 && !r.edit && !r.mask;
                for (int y = 0; px_ok && y < 2; y++)
                    for (int x = 0; x < 3; x++)
                        px_ok &= r.image[3 * (3 * y + x)] == 10 * x + y &&
                                 r.image[3 * (3 * y + x) + 1] == 20 &&
                                 r.image[3 * (3 * y + x) + 2] == 200;
                CHECK(px_ok, "%.60s...: the 3x2 input_reference decoded (%dx%d)", cases[i].body,
                      r.image_w, r.image_h);
                accepted++;
            } else {
                CHECK(!r.image && !r.image_w, "a text-to-video clip carries no image");
            }
        } else {
            CHECK(err == DITD_EINVAL && e.status == 400 && !strcmp(e.param, "input_reference") &&
                      strstr(e.message, cases[i].says),
                  "%.80s on %s: 400 input_reference saying \"%s\" (%d %d '%s': %s)", cases[i].body,
                  cases[i].gm->info->name, cases[i].says, err, e.status, e.param, e.message);
            CHECK(!r.image, "a refused body owns no image");
        }
        ditd_genreq_free(&r);
        n++;
    }
    CHECK(n == 12 && accepted == 3, "%d video bodies, %d images taken", n, accepted);
}

/* last_frame_reference (FLF2V, ditd's field): an FLF2V model needs it beside
 * input_reference, in the same forms, decoded at its own size (a 1x1 PNG of
 * (7, 8, 9) and the 3x2 one: the two frames are not mixed up); a one-frame
 * clip is refused naming num_frames; a text-to-video or plain
 * image-to-video model refuses it naming it */
#define PNG_1X1 "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGNg5+AEAAAyABmP5B0GAAAAAElFTkSuQmCC"
static void test_last_frame(void)
{
    static const struct {
        const ditd_genreq_model *gm;
        const char *body;
        const char *param; /* NULL: accepted */
        const char *says;
    } cases[] = {
        {&gm_flf, "{\"prompt\":\"a\",\"num_frames\":33,\"input_reference\":\"" PNG_3X2
                  "\",\"last_frame_reference\":\"" PNG_1X1 "\"}", NULL, NULL},
        {&gm_flf, "{\"prompt\":\"a\",\"num_frames\":33,\"input_reference\":\"" PNG_3X2
                  "\",\"last_frame_reference\":{\"image_url\":\"data:image/png;base64," PNG_1X1
                  "\"}}", NULL, NULL},
        {&gm_flf, "{\"prompt\":\"a\",\"input_reference\":\"" PNG_3X2 "\"}",
         "last_frame_reference", "give 'last_frame_reference'"},
        {&gm_flf, "{\"prompt\":\"a\",\"input_reference\":\"" PNG_3X2
                  "\",\"last_frame_reference\":\"data:image/png;base64,AAAA\"}",
         "last_frame_reference", "'last_frame_reference': "},
        {&gm_flf, "{\"prompt\":\"a\",\"input_reference\":\"" PNG_3X2
                  "\",\"last_frame_reference\":\"http://x/b.png\"}",
         "last_frame_reference", "not fetched"},
        {&gm_flf, "{\"prompt\":\"a\",\"num_frames\":1,\"input_reference\":\"" PNG_3X2
                  "\",\"last_frame_reference\":\"" PNG_1X1 "\"}", "num_frames", "at least 5"},
        {&gm_flf, "{\"prompt\":\"a\",\"last_frame_reference\":\"" PNG_1X1 "\"}",
         "input_reference", "give 'input_reference'"},
        {&gm_i2v, "{\"prompt\":\"a\",\"input_reference\":\"" PNG_3X2
                  "\",\"last_frame_reference\":\"" PNG_1X1 "\"}",
         "last_frame_reference", "first frame alone"},
        {&gm_t2v, "{\"prompt\":\"a\",\"last_frame_reference\":\"" PNG_1X1 "\"}",
         "last_frame_reference", "(text-to-video)"},
    };
    int n = 0, accepted = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ditd_genreq r;
        ditd_api_error e;
        memset(&r, 0, sizeof r);
        memset(&e, 0, sizeof e);
        int err = ditd_genreq_parse_video(cases[i].body, strlen(cases[i].body), cases[i].gm, &r, &e);
        if (!cases[i].param) {
            CHECK(err == 0 && r.frames == 33 && r.image && r.image_w == 3 && r.image_h == 2 &&
                      r.last_image && r.last_w == 1 && r.last_h == 1 && r.last_image[0] == 7 &&
                      r.last_image[1] == 8 && r.last_image[2] == 9,
                  "%.70s...: both frames decoded (%d: %s; first %dx%d, last %dx%d)", cases[i].body,
                  err, e.message, r.image_w, r.image_h, r.last_w, r.last_h);
            accepted++;
        } else {
            CHECK(err == DITD_EINVAL && e.status == 400 && !strcmp(e.param, cases[i].param) &&
                      strstr(e.message, cases[i].says),
                  "%.80s on %s: 400 %s saying \"%s\" (%d %d '%s': %s)", cases[i].body,
                  cases[i].gm->info->name, cases[i].param, cases[i].says, err, e.status, e.param,
                  e.message);
            CHECK(!r.image && !r.last_image, "a refused body owns no image");
        }
        ditd_genreq_free(&r);
        n++;
    }
    CHECK(n == 9 && accepted == 2, "%d last-frame bodies, %d taken", n, accepted);
}

/* body refused by the model: status, param ("" for none) and a word of the message */
typedef struct refusal {
    int text;
    const char *body;
    int status;
    const char *param;
    const char *says;
} refusal;

static const refusal refusals[] = {
    /* a text model's fields on a class model */
    {0, "{\"prompt\":\"dress\",\"negative_prompt\":\"x\"}", 400, "negative_prompt", "class-conditional"},
    {0, "{\"prompt\":\"dress\",\"true_cfg_scale\":2}", 400, "true_cfg_scale", "for text models"},
    {0, "{\"prompt\":\"dress\",\"max_sequence_length\":77}", 400, "max_sequence_length", "for text models"},
    {0, "{\"prompt\":\"dress\",\"size\":\"32x32\"}", 400, "size", "\"28x28\""},
    {0, "{\"prompt\":\"fox\"}", 400, "prompt", "names no class"},
    {0, "{\"model\":\"flux\",\"prompt\":\"dress\"}", 404, "model", "does not exist"},
    /* LoRA adapters (the class model's server has "style" and "char.v2", 2 a request) */
    {0, "{\"prompt\":\"dress\",\"loras\":{}}", 400, "loras", "must be an array"},
    {0, "{\"prompt\":\"dress\",\"loras\":[\"style\"]}", 400, "loras[0]", "must be an object"},
    {0, "{\"prompt\":\"dress\",\"loras\":[{\"name\":\"nope\"}]}", 400, "loras[0].name", "unknown LoRA adapter 'nope'; this server has 'style', 'char.v2'"},
    {0, "{\"prompt\":\"dress\",\"loras\":[{\"scale\":1}]}", 400, "loras[0].name", "must be a string"},
    {0, "{\"prompt\":\"dress\",\"loras\":[{\"name\":\"style\",\"scale\":10.5}]}", 400, "loras[0].scale", "-10..10"},
    {0, "{\"prompt\":\"dress\",\"loras\":[{\"name\":\"style\",\"scale\":\"1\"}]}", 400, "loras[0].scale", "-10..10"},
    {0, "{\"prompt\":\"dress\",\"loras\":[{\"name\":\"style\",\"weight\":1}]}", 400, "loras[0].weight", "unknown field"},
    {0, "{\"prompt\":\"dress\",\"loras\":[{\"name\":\"style\"},{\"name\":\"style\"}]}", 400, "loras[1].name", "named twice"},
    {0, "{\"prompt\":\"dress\",\"loras\":[{\"name\":\"style\"},{\"name\":\"char.v2\"},{\"name\":\"x\"}]}", 400, "loras", "at most 2 per request"},
    {1, "{\"prompt\":\"a\",\"loras\":[{\"name\":\"style\"}]}", 400, "loras[0].name", "this server has none"},
    /* a text model */
    {1, "{\"prompt\":\"a fox\",\"class_label\":3}", 400, "class_label", "text-conditioned"},
    {1, "{\"n\":1}", 400, "prompt", "required"},
    {1, "{\"prompt\":null}", 400, "prompt", "required"},
    {1, "{\"prompt\":[\"a\",\"b\"]}", 400, "prompt", "must be a string"},
    {1, "{\"prompt\":3}", 400, "prompt", "must be a string"},
    {1, "{\"prompt\":\"a\",\"negative_prompt\":{}}", 400, "negative_prompt", "must be a string"},
    {1, "{\"prompt\":\"a\",\"true_cfg_scale\":-0.5}", 400, "true_cfg_scale", "0..100"},
    {1, "{\"prompt\":\"a\",\"true_cfg_scale\":\"2\"}", 400, "true_cfg_scale", "0..100"},
    {1, "{\"prompt\":\"a\",\"true_cfg_scale\":101}", 400, "true_cfg_scale", "0..100"},
    {1, "{\"prompt\":\"a\",\"max_sequence_length\":0}", 400, "max_sequence_length", "1..512"},
    {1, "{\"prompt\":\"a\",\"max_sequence_length\":513}", 400, "max_sequence_length", "1..512"},
    {1, "{\"prompt\":\"a\",\"max_sequence_length\":77.5}", 400, "max_sequence_length", "integer"},
    {1, "{\"prompt\":\"a\",\"size\":\"1000x1024\"}", 400, "size", "multiples of 16 in 16..2048"},
    {1, "{\"prompt\":\"a\",\"size\":\"1024x1000\"}", 400, "size", "multiples of 16 in 16..2048"},
    {1, "{\"prompt\":\"a\",\"size\":\"2064x1024\"}", 400, "size", "multiples of 16 in 16..2048"},
    {1, "{\"prompt\":\"a\",\"size\":\"8x16\"}", 400, "size", "(default \"1024x1024\")"},
    {1, "{\"prompt\":\"a\",\"size\":\"0x16\"}", 400, "size", "WIDTHxHEIGHT"},
    {1, "{\"prompt\":\"a\",\"size\":\"16x16 \"}", 400, "size", "WIDTHxHEIGHT"},
    {1, "{\"prompt\":\"a\",\"size\":\"4294967312x16\"}", 400, "size", "WIDTHxHEIGHT"},
    {1, "{\"prompt\":\"a\",\"guidance_scale\":-1}", 400, "guidance_scale", "0..100"},
    {1, "{\"prompt\":\"a\\u0000b\"}", 400, "", "not valid JSON"},
    {1, "{\"prompt\":\"\\ud800\"}", 400, "", "not valid JSON"},
    {1, "{\"prompt\":\"\xff\"}", 400, "", "not valid JSON"},
    {1, "{\"model\":\"dall-e-3\",\"prompt\":\"a\"}", 404, "model", "'black-forest-labs/FLUX.1-dev', 'flux'"},
    {1, "{\"model\":\"fashion\",\"prompt\":\"a\"}", 404, "model", "does not exist"},
};

static void test_refusals(void)
{
    int n = 0;
    for (size_t i = 0; i < sizeof refusals / sizeof refusals[0]; i++) {
        const refusal *r = &refusals[i];
        ditd_genreq rq;
        ditd_api_error e;
        int err = ditd_genreq_parse(r->body, strlen(r->body), r->text ? &gm_txt : &gm_cls, &rq, &e);
        CHECK(err != 0 && e.status == r->status && !strcmp(e.param, r->param) &&
                  strstr(e.message, r->says),
              "%s model, %s: want %d param '%s' saying '%s'; got err %d, %d '%s': %s",
              r->text ? "text" : "class", r->body, r->status, r->param, r->says, err, e.status,
              e.param, e.message);
        char *js = ditd_api_error_json(&e);
        CHECK(js && strstr(js, "\"error\""), "the envelope of %s", r->body);
        free(js);
        n++;
    }
    CHECK(n >= 40, "%d refusals checked", n);
}

/* The byte limit of prompt and negative_prompt, at its edge. */
static void test_prompt_limit(void)
{
    size_t cap = DITD_GENREQ_MAX_PROMPT_BYTES + 64;
    char *body = malloc(cap + 64), *p;
    for (int neg = 0; neg < 2; neg++) {
        for (int extra = 0; extra < 2; extra++) {
            /* 4-byte characters (U+1F98A) up to the limit, plus one byte */
            p = body + sprintf(body, "{\"prompt\":\"%s", neg ? "a\",\"negative_prompt\":\"" : "");
            for (int k = 0; k < DITD_GENREQ_MAX_PROMPT_BYTES / 4; k++)
                p += sprintf(p, "\xf0\x9f\xa6\x8a");
            p += sprintf(p, "%s\"}", extra ? "x" : "");
            ditd_genreq rq;
            ditd_api_error e;
            int err = ditd_genreq_parse(body, strlen(body), &gm_txt, &rq, &e);
            const char *field = neg ? "negative_prompt" : "prompt";
            if (extra) {
                CHECK(err && e.status == 400 && !strcmp(e.param, field) && strstr(e.message, "8193 bytes") &&
                          strstr(e.message, "8192"),
                      "%s of 8193 bytes: 400 naming the limit (got %d %s: %s)", field, e.status, e.param,
                      e.message);
            } else {
                const char *got = neg ? rq.negative_prompt : rq.prompt;
                CHECK(!err && got && strlen(got) == DITD_GENREQ_MAX_PROMPT_BYTES,
                      "%s of exactly 8192 bytes: accepted whole", field);
                if (!err)
                    ditd_genreq_free(&rq);
            }
        }
    }
    free(body);
}

static void test_loras(void)
{
    ditd_genreq rq;
    ditd_api_error e;
    const char *b = "{\"prompt\":\"dress\",\"loras\":[{\"name\":\"char.v2\",\"scale\":-0.5},"
                    "{\"name\":\"style\"}]}";
    int err = ditd_genreq_parse(b, strlen(b), &gm_cls, &rq, &e);
    CHECK(!err && rq.n_loras == 2 && rq.lora_idx[0] == 1 && rq.lora_scale[0] == -0.5f &&
              rq.lora_idx[1] == 0 && rq.lora_scale[1] == 1.0f,
          "two adapters in order, scale 1 by default (err %d: %s; n %d)", err, e.message,
          rq.n_loras);
    if (!err)
        ditd_genreq_free(&rq);
    b = "{\"prompt\":\"dress\",\"loras\":null}";
    err = ditd_genreq_parse(b, strlen(b), &gm_cls, &rq, &e);
    CHECK(!err && rq.n_loras == 0, "loras null: none");
    if (!err)
        ditd_genreq_free(&rq);
    b = "{\"prompt\":\"dress\",\"loras\":[{\"name\":\"style\",\"scale\":-10}]}";
    err = ditd_genreq_parse(b, strlen(b), &gm_cls, &rq, &e);
    CHECK(!err && rq.n_loras == 1 && rq.lora_scale[0] == -10.0f, "scale -10 (the edge) accepted");
    if (!err)
        ditd_genreq_free(&rq);
}

static void test_accepted(void)
{
    ditd_genreq rq;
    ditd_api_error e;
    const char *b;

    /* a text model's defaults */
    b = "{\"prompt\":\"a red fox \\u732b\"}";
    CHECK(ditd_genreq_parse(b, strlen(b), &gm_txt, &rq, &e) == 0, "a bare text prompt: %s", e.message);
    CHECK(rq.prompt && !strcmp(rq.prompt, "a red fox \xe7\x8c\xab") && !rq.negative_prompt,
          "the prompt, decoded to UTF-8; no negative prompt");
    CHECK(rq.width == 1024 && rq.height == 1024 && rq.max_sequence_length == 512 &&
              rq.true_cfg == 1.0f && rq.steps == 28 && rq.guidance == 3.5f &&
              rq.sampler == DITD_SAMPLER_FLOW_EULER && rq.n == 1,
          "defaults: 1024x1024, max_sequence_length 512, true_cfg 1, 28 steps, guidance 3.5 "
          "(got %dx%d %d %g %d %g)", rq.width, rq.height, rq.max_sequence_length, (double)rq.true_cfg,
          rq.steps, (double)rq.guidance);
    CHECK(ditd_genreq_numel(&rq, &txt) == 3u * 1024 * 1024, "numel: 3 x 1024 x 1024");
    ditd_genreq_free(&rq);
    CHECK(!rq.prompt && !rq.negative_prompt, "free clears the strings");

    /* every field, through an alias */
    b = "{\"model\":\"black-forest-labs/FLUX.1-dev\",\"prompt\":\"\",\"negative_prompt\":\"blurry\","
        "\"true_cfg_scale\":4,\"max_sequence_length\":77,\"size\":\"48x2048\",\"n\":3,"
        "\"guidance_scale\":0,\"class_label\":null,\"seed\":9}";
    CHECK(ditd_genreq_parse(b, strlen(b), &gm_txt, &rq, &e) == 0, "every text field: %s", e.message);
    CHECK(rq.prompt && !strcmp(rq.prompt, "") && rq.negative_prompt &&
              !strcmp(rq.negative_prompt, "blurry") && rq.true_cfg == 4.0f &&
              rq.max_sequence_length == 77 && rq.width == 48 && rq.height == 2048 && rq.n == 3 &&
              rq.guidance == 0.0f && rq.seed == 9,
          "the fields as given (an empty prompt is a prompt; class_label null is absent)");
    ditd_genreq_free(&rq);
    b = "{\"model\":\"dev\",\"prompt\":\"a\",\"size\":\"16x16\"}";
    CHECK(ditd_genreq_parse(b, strlen(b), &gm_txt, &rq, &e) == 0 && rq.width == 16,
          "the folder's name, the least size");
    ditd_genreq_free(&rq);
    b = "{\"model\":\"flux\",\"prompt\":\"a\",\"size\":\"auto\"}";
    CHECK(ditd_genreq_parse(b, strlen(b), &gm_txt, &rq, &e) == 0 && rq.width == 1024,
          "the second alias; size auto is the default");
    ditd_genreq_free(&rq);

    /* a class model as before: no text kept */
    b = "{\"model\":\"fashion\",\"prompt\":\" Dress. \",\"negative_prompt\":null,\"size\":\"28x28\"}";
    CHECK(ditd_genreq_parse(b, strlen(b), &gm_cls, &rq, &e) == 0 && rq.class_id == 3 && !rq.prompt &&
              rq.max_sequence_length == 0,
          "a class model: the prompt names class 3, no text kept (%s)", e.message);
    ditd_genreq_free(&rq);
    b = "{\"class_label\":\"coat\",\"prompt\":\"dress\"}";
    CHECK(ditd_genreq_parse(b, strlen(b), &gm_cls, &rq, &e) == 0 && rq.class_id == 4,
          "class_label wins over the prompt");
    ditd_genreq_free(&rq);
    /* what each pipeline row takes: SD3 three prompts and skip-layer
     * guidance, no true_cfg_scale; FLUX prompt_2 only; DiT none */
    b = "{\"prompt\":\"a\",\"prompt_2\":\"b\",\"prompt_3\":\"c\",\"negative_prompt\":\"n\","
        "\"negative_prompt_3\":\"n3\",\"skip_guidance_layers\":[7,8,9],"
        "\"skip_layer_guidance_scale\":2.5,\"skip_layer_guidance_stop\":0.5}";
    CHECK(ditd_genreq_parse(b, strlen(b), &gm_sd3, &rq, &e) == 0, "SD3's fields: %s", e.message);
    CHECK(rq.prompt_23[0] && !strcmp(rq.prompt_23[0], "b") && rq.prompt_23[1] &&
              !strcmp(rq.prompt_23[1], "c") && !rq.negative_23[0] && rq.negative_23[1] &&
              !strcmp(rq.negative_23[1], "n3") && rq.n_skip_layers == 3 && rq.skip_layers[0] == 7 &&
              rq.skip_layers[2] == 9 && rq.slg_scale == 2.5f && rq.slg_start == 0.01f &&
              rq.slg_stop == 0.5f && rq.max_sequence_length == 256 && rq.guidance == 7.0f,
          "SD3: prompts, skip layers 7..9, scale 2.5, start 0.01 (default), stop 0.5, L 256, g 7");
    ditd_genreq_free(&rq);
    CHECK(!rq.prompt_23[0] && !rq.prompt_23[1] && !rq.negative_23[1], "free clears them all");
    static const struct {
        const ditd_genreq_model *gm;
        const char *body, *param;
    } not_taken[] = {
        {&gm_sd3, "{\"prompt\":\"a\",\"true_cfg_scale\":4}", "true_cfg_scale"},
        {&gm_txt, "{\"prompt\":\"a\",\"prompt_3\":\"c\"}", "prompt_3"},
        {&gm_txt, "{\"prompt\":\"a\",\"skip_guidance_layers\":[1]}", "skip_guidance_layers"},
        {&gm_sd3, "{\"prompt\":\"a\",\"skip_guidance_layers\":[-1]}", "skip_guidance_layers"},
        {&gm_sd3, "{\"prompt\":\"a\",\"skip_guidance_layers\":\"7\"}", "skip_guidance_layers"},
        {&gm_sd3, "{\"prompt\":\"a\",\"skip_layer_guidance_start\":2}", "skip_layer_guidance_start"},
        {&gm_cls, "{\"prompt\":\"dress\",\"prompt_2\":\"b\"}", "prompt_2"},
    };
    for (size_t i = 0; i < sizeof not_taken / sizeof not_taken[0]; i++) {
        b = not_taken[i].body;
        int rc = ditd_genreq_parse(b, strlen(b), not_taken[i].gm, &rq, &e);
        CHECK(rc == DITD_EINVAL && e.status == 400 && !strcmp(e.param, not_taken[i].param),
              "%s refused naming %s: %d %s (%s)", b, not_taken[i].param, rc, e.param, e.message);
        if (!rc)
            ditd_genreq_free(&rq);
    }
    b = "{\"prompt\":\"a\",\"prompt_2\":\"t5\",\"true_cfg_scale\":2}";
    CHECK(ditd_genreq_parse(b, strlen(b), &gm_txt, &rq, &e) == 0 && rq.prompt_23[0] &&
              !strcmp(rq.prompt_23[0], "t5") && rq.true_cfg == 2.0f && rq.n_skip_layers == 0,
          "FLUX: prompt_2 and true_cfg_scale (%s)", e.message);
    ditd_genreq_free(&rq);
    CHECK(ditd_genreq_model_named(&gm_txt, "flux") && ditd_genreq_model_named(&gm_txt, "dev") &&
              !ditd_genreq_model_named(&gm_txt, "Flux") && !ditd_genreq_model_named(&gm_cls, "flux"),
          "names: exact, case-sensitive, per model");
}

/* "cache": typed once, the server's default when absent, off by null or
 * method none; bad fields refused naming cache.<field>. */
static void test_cache(void)
{
    ditd_genreq rq;
    ditd_api_error e;
    ditd_cache_config def;
    const char *b;
    int n = 0;

    b = "{\"prompt\":\"dress\"}";
    CHECK(ditd_genreq_parse(b, strlen(b), &gm_cls, &rq, &e) == 0 && rq.cache.method == DITD_CACHE_NONE,
          "no cache, no default: off (%d)", (int)rq.cache.method);
    b = "{\"prompt\":\"dress\",\"cache\":{\"method\":\"first_block_cache\",\"threshold\":0.2}}";
    CHECK(ditd_genreq_parse(b, strlen(b), &gm_cls, &rq, &e) == 0 &&
              rq.cache.method == DITD_CACHE_FIRST_BLOCK && rq.cache.threshold == 0.2,
          "first_block_cache threshold 0.2 exactly (%s; got %d %.17g)", e.message,
          (int)rq.cache.method, rq.cache.threshold);
    b = "{\"prompt\":\"dress\",\"cache\":{\"method\":\"first_block_cache\"}}";
    CHECK(ditd_genreq_parse(b, strlen(b), &gm_cls, &rq, &e) == 0 && rq.cache.threshold == 0.05,
          "Diffusers' default threshold 0.05 (got %g)", rq.cache.threshold);
    b = "{\"prompt\":\"dress\",\"cache\":{\"method\":\"taylorseer_cache\",\"cache_interval\":4,"
        "\"disable_cache_before_step\":2,\"disable_cache_after_step\":null,\"max_order\":2,"
        "\"taylor_factors_dtype\":\"float32\",\"use_lite_mode\":false,"
        "\"cache_identifiers\":[\"blocks\\\\.\\\\d+\"]}}";
    CHECK(ditd_genreq_parse(b, strlen(b), &gm_cls, &rq, &e) == 0 &&
              rq.cache.method == DITD_CACHE_TAYLORSEER && rq.cache.cache_interval == 4 &&
              rq.cache.disable_cache_before_step == 2 && rq.cache.disable_cache_after_step == -1 &&
              rq.cache.max_order == 2 && rq.cache.taylor_factors_dtype == DITD_DTYPE_F32 &&
              rq.cache.n_cache_identifiers == 1 &&
              !strcmp(rq.cache.cache_identifiers[0], "blocks\\.\\d+"),
          "taylorseer_cache's fields (%s; pattern '%s')", e.message, rq.cache.cache_identifiers[0]);
    b = "{\"prompt\":\"dress\",\"cache\":{\"method\":\"mag_cache\",\"threshold\":0.1,"
        "\"max_skip_steps\":2,\"retention_ratio\":0.25,\"mag_ratios\":[1.0,0.99,0.98,0.97]}}";
    CHECK(ditd_genreq_parse(b, strlen(b), &gm_cls, &rq, &e) == 0 && rq.cache.method == DITD_CACHE_MAG &&
              rq.cache.threshold == 0.1 && rq.cache.max_skip_steps == 2 &&
              rq.cache.retention_ratio == 0.25 && rq.cache.n_mag_ratios == 4 &&
              rq.cache.mag_ratios[3] == 0.97f,
          "mag_cache with ratios as numbers (%s)", e.message);
    b = "{\"prompt\":\"dress\",\"cache\":{\"method\":\"mag_cache\",\"mag_ratios\":\"FLUX\"}}";
    CHECK(ditd_genreq_parse(b, strlen(b), &gm_cls, &rq, &e) == 0 && rq.cache.n_mag_ratios > 4,
          "mag_cache with FLUX's ratios (%s)", e.message);

    /* the server's default, and turning it off */
    CHECK(ditd_cache_config_parse("first_block_cache:threshold=0.3", &def) == 0, "a default spec");
    ditd_genreq_model gd = gm_cls;
    gd.cache_default = &def;
    b = "{\"prompt\":\"dress\"}";
    CHECK(ditd_genreq_parse(b, strlen(b), &gd, &rq, &e) == 0 && ditd_cache_config_equal(&rq.cache, &def),
          "the server's default applies when the request gives none");
    b = "{\"prompt\":\"dress\",\"cache\":null}";
    CHECK(ditd_genreq_parse(b, strlen(b), &gd, &rq, &e) == 0 && rq.cache.method == DITD_CACHE_NONE,
          "cache null turns the default off");
    b = "{\"prompt\":\"dress\",\"cache\":{\"method\":\"none\"}}";
    CHECK(ditd_genreq_parse(b, strlen(b), &gd, &rq, &e) == 0 && rq.cache.method == DITD_CACHE_NONE,
          "method none turns the default off");
    b = "{\"prompt\":\"dress\",\"cache\":{\"method\":\"mag_cache\",\"calibrate\":true}}";
    CHECK(ditd_genreq_parse(b, strlen(b), &gd, &rq, &e) == 0 && rq.cache.method == DITD_CACHE_MAG &&
              rq.cache.calibrate,
          "a request's own cache wins over the default (%s)", e.message);

    static const struct {
        const char *cache, *param, *says;
    } bad_cache[] = {
        {"3", "cache", "must be an object"},
        {"\"first_block_cache\"", "cache", "must be an object"},
        {"{}", "cache.method", "must be a string"},
        {"{\"threshold\":0.1}", "cache.method", "must be a string"},
        {"{\"method\":\"fastercache\"}", "cache.method", "fastercache"},
        {"{\"method\":\"none\",\"threshold\":0.1}", "cache.threshold", "takes no fields"},
        {"{\"method\":\"first_block_cache\",\"threshold\":\"high\"}", "cache.threshold", "must be a number"},
        {"{\"method\":\"first_block_cache\",\"threshold\":-0.5}", "cache.threshold", ">= 0"},
        {"{\"method\":\"first_block_cache\",\"cache_interval\":2}", "cache.cache_interval", "not a field"},
        {"{\"method\":\"first_block_cache\",\"threshold\":{}}", "cache.threshold", "must be a number"},
        {"{\"method\":\"taylorseer_cache\",\"cache_interval\":0}", "cache.cache_interval", ">= 1"},
        {"{\"method\":\"taylorseer_cache\",\"max_order\":1.5}", "cache.max_order", "not an integer"},
        {"{\"method\":\"taylorseer_cache\",\"use_lite_mode\":3}", "cache.use_lite_mode", "true or false"},
        {"{\"method\":\"taylorseer_cache\",\"cache_identifiers\":[\"a\",3]}", "cache.cache_identifiers", "must be a string"},
        {"{\"method\":\"mag_cache\"}", "cache", "mag_ratios"},
        {"{\"method\":\"mag_cache\",\"mag_ratios\":[1.0,\"x\"]}", "cache.mag_ratios", "must be a number"},
        {"{\"method\":\"mag_cache\",\"calibrate\":true,\"retention_ratio\":2}", "cache.retention_ratio", "0..1"},
        {"{\"method\":\"first_block_cache\",\"threshold\":null}", "cache.threshold", "must be a number"},
        {"{\"method\":\"taylorseer_cache\",\"cache_identifiers\":\"blocks\"}", "cache.cache_identifiers", "must be an array"},
        {"{\"method\":\"mag_cache\",\"mag_ratios\":\"1;2\"}", "cache.mag_ratios", "must be an array"},
        {"{\"method\":\"mag_cache\",\"calibrate\":1}", "cache.calibrate", "true or false"},
        {"{\"method\":\"taylorseer_cache\",\"taylor_factors_dtype\":\"float8\"}", "cache.taylor_factors_dtype", "float8"},
        {"{\"method\":\"taylorseer_cache\",\"frobnicate\":1}", "cache.frobnicate", "not a field"},
    };
    for (size_t i = 0; i < sizeof bad_cache / sizeof bad_cache[0]; i++) {
        char body[512];
        snprintf(body, sizeof body, "{\"prompt\":\"dress\",\"cache\":%s}", bad_cache[i].cache);
        int rc = ditd_genreq_parse(body, strlen(body), &gm_cls, &rq, &e);
        CHECK(rc == DITD_EINVAL && e.status == 400 && !strcmp(e.param, bad_cache[i].param) &&
                  strstr(e.message, bad_cache[i].says),
              "%s: want 400 param '%s' saying '%s'; got %d %d '%s': %s", body, bad_cache[i].param,
              bad_cache[i].says, rc, e.status, e.param, e.message);
        n++;
    }
    CHECK(n >= 23, "%d cache refusals checked", n);
}

/* The OpenAPI document's request "cache" object lists exactly the Diffusers
 * configs' fields (FirstBlockCacheConfig, TaylorSeerCacheConfig,
 * MagCacheConfig) and method, with the four method names; the validator
 * takes each field with its method; the response's "cache" object lists
 * the counts a response carries. */
static void test_cache_openapi(void)
{
    static const struct {
        const char *field, *method, *value;
    } fields[] = {
        {"threshold", "first_block_cache", "0.1"},
        {"cache_interval", "taylorseer_cache", "4"},
        {"disable_cache_before_step", "taylorseer_cache", "2"},
        {"disable_cache_after_step", "taylorseer_cache", "null"},
        {"max_order", "taylorseer_cache", "2"},
        {"taylor_factors_dtype", "taylorseer_cache", "\"float32\""},
        {"cache_identifiers", "taylorseer_cache", "[\"blocks\\\\.\\\\d+\"]"},
        {"skip_predict_identifiers", "taylorseer_cache", "[\"proj_out\"]"},
        {"use_lite_mode", "taylorseer_cache", "true"},
        {"max_skip_steps", "mag_cache", "2"},
        {"retention_ratio", "mag_cache", "0.3"},
        {"num_inference_steps", "mag_cache", "28"},
        {"mag_ratios", "mag_cache", "[1.0, 0.98, 0.97]"},
        {"calibrate", "mag_cache", "true"},
    };
    static const char *const methods[] = {"first_block_cache", "taylorseer_cache", "mag_cache",
                                          "none"};
    static const char *const counts[] = {"method", "steps", "steps_skipped", "evals",
                                         "evals_skipped"};
    const size_t nf = sizeof fields / sizeof fields[0];
    char path[4096];
    json_error_t jerr;
    ditd_genreq rq;
    ditd_api_error e;
    snprintf(path, sizeof path, "%s/proto/openapi.json", DITD_SOURCE_ROOT);
    json_t *root = json_load_file(path, 0, &jerr);
    CHECK(root != NULL, "%s: %s", path, jerr.text);
    json_t *sch = json_object_get(json_object_get(root, "components"), "schemas");
    json_t *req = json_object_get(json_object_get(json_object_get(json_object_get(
                                                      sch, "CreateImageRequest"),
                                                  "properties"),
                                  "cache"),
                  "properties");
    json_t *res = json_object_get(json_object_get(json_object_get(json_object_get(
                                                      sch, "ImagesResponse"),
                                                  "properties"),
                                  "cache"),
                  "properties");
    CHECK(json_object_size(req) == nf + 1, "openapi.json cache lists %zu fields, Diffusers' "
                                           "configs %zu and method", json_object_size(req), nf);
    json_t *en = json_object_get(json_object_get(req, "method"), "enum");
    for (size_t i = 0; i < sizeof methods / sizeof methods[0]; i++) {
        int found = 0;
        for (size_t j = 0; j < json_array_size(en); j++)
            found |= !strcmp(json_string_value(json_array_get(en, j)), methods[i]);
        CHECK(found, "openapi.json cache.method lacks %s", methods[i]);
    }
    int n = 0;
    for (size_t i = 0; i < nf; i++) {
        char body[512];
        CHECK(json_object_get(req, fields[i].field) != NULL, "openapi.json cache lacks %s",
              fields[i].field);
        snprintf(body, sizeof body,
                 "{\"prompt\":\"dress\",\"cache\":{\"method\":\"%s\",\"%s\":%s%s}}",
                 fields[i].method, fields[i].field, fields[i].value,
                 !strcmp(fields[i].method, "mag_cache") && strcmp(fields[i].field, "mag_ratios")
                     ? ",\"mag_ratios\":\"FLUX\""
                     : "");
        int rc = ditd_genreq_parse(body, strlen(body), &gm_cls, &rq, &e);
        CHECK(rc == 0, "%s: refused (%s: %s)", body, e.param, e.message);
        n += rc == 0;
        if (rc == 0)
            ditd_genreq_free(&rq);
    }
    for (size_t i = 0; i < sizeof counts / sizeof counts[0]; i++)
        CHECK(json_object_get(res, counts[i]) != NULL, "openapi.json response cache lacks %s",
              counts[i]);
    CHECK(n == (int)nf, "%d of %zu documented cache fields taken", n, nf);
    json_decref(root);
}

int main(void)
{
    models();
    test_cache();
    test_cache_openapi();
    test_refusals();
    test_prompt_limit();
    test_accepted();
    test_loras();
    test_video();
    test_last_frame();
    ditd_err_clear();
    printf("%d checks, %d failed\n", checks, failures);
    if (checks < 60) {
        printf("FAIL: only %d checks ran\n", checks);
        return 1;
    }
    return failures ? 1 : 0;
}
