/* ditd_model_info_set_files: --transformer-file and --text-encoder-2-file,
 * the weights files that stand in for a component folder's own (a GGUF or
 * single-file safetensors download beside an ordinary Diffusers folder).
 * It checks what can be checked without reading a weight; the loaders say
 * which tensor does not fit. It is not a loader. */
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "engine/core/error.h"
#include "engine/models/model.h"

static int ends_with(const char *s, const char *suf)
{
    size_t n = strlen(s), m = strlen(suf);
    return n >= m && strcmp(s + n - m, suf) == 0;
}

static int check_file(const char *flag, const char *path, char *dst)
{
    struct stat sb;
    if (strlen(path) >= DITD_MODEL_PATH_MAX)
        return ditd_err_set(DITD_EINVAL, "%s: path too long", flag);
    if (stat(path, &sb) != 0)
        return ditd_err_set(DITD_ENOENT, "%s %s: no such file", flag, path);
    if (!S_ISREG(sb.st_mode))
        return ditd_err_set(DITD_EINVAL, "%s %s: not a regular file (a folder goes in the model "
                            "folder's component directory instead)", flag, path);
    if (!ends_with(path, ".gguf") && !ends_with(path, ".safetensors"))
        return ditd_err_set(DITD_EINVAL, "%s %s: a .gguf or .safetensors file is expected", flag,
                            path);
    strcpy(dst, path);
    return 0;
}

int ditd_model_info_set_files(ditd_model_info *m, const char *transformer_file,
                              const char *text_encoder_2_file)
{
    int err;
    m->transformer_file[0] = m->text_encoder_2_file[0] = '\0';
    if (transformer_file && transformer_file[0]) {
        if ((err = check_file("--transformer-file", transformer_file, m->transformer_file)))
            return err;
        if (!m->denoiser || !m->denoiser->load_file)
            return ditd_err_set(DITD_EUNSUPPORTED,
                                "--transformer-file %s: %s does not take its weights from a "
                                "separate file yet",
                                transformer_file, m->denoiser_class);
        if (m->transformer_2_dir[0])
            return ditd_err_set(DITD_EUNSUPPORTED,
                                "--transformer-file %s: %s has two transformers (transformer "
                                "and transformer_2, Wan 2.2's two experts); the flag would name "
                                "one, and there is no --transformer-2-file: put each expert's "
                                ".gguf in its own folder (transformer/, transformer_2/) instead",
                                transformer_file, m->name);
    }
    if (text_encoder_2_file && text_encoder_2_file[0]) {
        const ditd_pipeline_class *pc = m->pipeline;
        int t5 = 0;
        for (int i = 0; pc && i < pc->n_parts; i++)
            if (strcmp(pc->parts[i].encoder, "text_encoder_2") == 0)
                t5 = pc->parts[i].kind == DITD_PROMPT_ENC_T5;
        if (!t5)
            return ditd_err_set(DITD_EUNSUPPORTED,
                                "--text-encoder-2-file %s: %s's text_encoder_2 is not a T5 "
                                "encoder (only FLUX's T5 is read from a file)",
                                text_encoder_2_file, pc ? pc->name : m->pipeline_class);
        if ((err = check_file("--text-encoder-2-file", text_encoder_2_file,
                              m->text_encoder_2_file)))
            return err;
    }
    return 0;
}
