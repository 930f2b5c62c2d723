/* What a request may ask of a loaded model folder: a class-conditional
 * model's class names (id2label, a number or a label), the image sizes it
 * makes and a video model's clip lengths. Apart from model.c, which reads the folder, so that request
 * validation (and its fuzz target) needs no model loading code. */
#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "engine/core/error.h"
#include "engine/models/model.h"

/* Compares s with the comma-separated synonym list in label, ignoring case
 * and the spaces around each synonym. */
static int label_matches(const char *label, const char *s)
{
    size_t sl;
    while (isspace((unsigned char)*s))
        s++;
    sl = strlen(s);
    while (sl && isspace((unsigned char)s[sl - 1]))
        sl--;
    while (*label) {
        const char *end = strchr(label, ',');
        size_t n = end ? (size_t)(end - label) : strlen(label);
        const char *a = label;
        while (n && isspace((unsigned char)*a)) {
            a++;
            n--;
        }
        while (n && isspace((unsigned char)a[n - 1]))
            n--;
        if (n == sl && n && strncasecmp(a, s, n) == 0)
            return 1;
        if (!end)
            break;
        label = end + 1;
    }
    return 0;
}

int ditd_model_class_from_str(const ditd_model_info *m, const char *s, int *out)
{
    char *end;
    long id;
    errno = 0;
    id = strtol(s, &end, 10);
    if (!errno && end != s && *end == '\0') {
        if (id < 0 || id >= m->num_classes)
            return ditd_err_set(DITD_EINVAL, "class %ld outside 0..%d", id, m->num_classes - 1);
        *out = (int)id;
        return 0;
    }
    for (int i = 0; i < m->num_classes; i++) {
        if (label_matches(m->labels[i], s)) {
            *out = i;
            return 0;
        }
    }
    return ditd_err_set(DITD_EINVAL, "unknown class \"%s\"", s);
}

int ditd_model_check_size(const ditd_model_info *m, int width, int height)
{
    if (m->resizable && m->size_multiple > 0) {
        if (width % m->size_multiple || height % m->size_multiple || width < m->min_size ||
            height < m->min_size || width > m->max_size || height > m->max_size)
            return ditd_err_set(DITD_EINVAL,
                                "size \"%dx%d\" is not supported by '%s': width and height must be "
                                "multiples of %d in %d..%d pixels (default \"%dx%d\")",
                                width, height, m->name, m->size_multiple, m->min_size, m->max_size,
                                m->image_width, m->image_height);
        return 0;
    }
    if (width != m->image_width || height != m->image_height)
        return ditd_err_set(DITD_EINVAL, "size \"%dx%d\" is not supported by '%s'; supported: \"%dx%d\"",
                            width, height, m->name, m->image_width, m->image_height);
    return 0;
}

int ditd_model_round_frames(const ditd_model_info *m, int n)
{
    if (m->frame_step <= 0)
        return n;
    if (n % m->frame_step != 1 % m->frame_step)
        n = n / m->frame_step * m->frame_step + 1;
    return n < 1 ? 1 : n;
}

int ditd_model_latent_frames(const ditd_model_info *m, int n)
{
    if (m->frame_step <= 0)
        return 0;
    return (ditd_model_round_frames(m, n) - 1) / m->frame_step + 1;
}

int ditd_model_check_frames(const ditd_model_info *m, int n)
{
    if (m->frame_step <= 0) {
        if (n <= 1)
            return 0;
        return ditd_err_set(DITD_EINVAL, "%d frames: %s is an image model", n, m->name);
    }
    int r = ditd_model_round_frames(m, n);
    if (n < 1 || r > m->max_frames)
        return ditd_err_set(DITD_EINVAL, "%d frames: %s makes 1..%d (1 + k x %d)", n, m->name,
                            m->max_frames, m->frame_step);
    return 0;
}
