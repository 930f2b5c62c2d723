/* A class-conditional model's class names (id2label) as requests use them:
 * a number or a label. Apart from model.c, which reads the folder, so that
 * request validation (and its fuzz target) needs no model loading code. */
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
