/* The names of ditd_text_act (transformers' ACT2FN names), apart from any
 * backend so that config readers (and their fuzz targets) need no kernels. */
#include <string.h>

#include "engine/backend/backend.h"
#include "engine/core/error.h"

const char *ditd_text_act_name(ditd_text_act a)
{
    switch (a) {
    case DITD_TEXT_ACT_NONE: return "none";
    case DITD_TEXT_ACT_GELU: return "gelu";
    case DITD_TEXT_ACT_GELU_NEW: return "gelu_new";
    case DITD_TEXT_ACT_QUICK_GELU: return "quick_gelu";
    case DITD_TEXT_ACT_RELU: return "relu";
    }
    return "unknown";
}

int ditd_text_act_from_str(const char *s, ditd_text_act *out)
{
    static const ditd_text_act all[] = {DITD_TEXT_ACT_NONE, DITD_TEXT_ACT_GELU,
                                        DITD_TEXT_ACT_GELU_NEW, DITD_TEXT_ACT_QUICK_GELU,
                                        DITD_TEXT_ACT_RELU};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        if (strcmp(s, ditd_text_act_name(all[i])) == 0) {
            *out = all[i];
            return 0;
        }
    }
    return ditd_err_set(DITD_EUNSUPPORTED,
                        "activation \"%s\" is not supported (gelu, gelu_new, quick_gelu, relu)", s);
}
