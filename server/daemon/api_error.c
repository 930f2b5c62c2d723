/* The API's error object (api_error.h). */
#include "server/daemon/api_error.h"

#include <stdarg.h>
#include <stdio.h>

#include "engine/core/error.h"

static void vset(ditd_api_error *e, int status, const char *type, const char *code,
                 const char *param, const char *fmt, va_list ap)
{
    e->status = status;
    e->type = type;
    e->code = code;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    vsnprintf(e->message, sizeof e->message, fmt, ap);
}

int ditd_api_error_set(ditd_api_error *e, int status, const char *type, const char *code,
                       const char *param, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vset(e, status, type, code, param, fmt, ap);
    va_end(ap);
    return status;
}

int ditd_api_bad(ditd_api_error *e, const char *param, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vset(e, 400, "invalid_request_error", "invalid_value", param, fmt, ap);
    va_end(ap);
    return DITD_EINVAL;
}
