/* Error table and the per-thread error detail. */
#include "engine/core/error.h"

#include <stdarg.h>
#include <stdio.h>

static _Thread_local char err_detail[1024];

const char *ditd_strerror(int err)
{
    switch (err) {
    case DITD_OK: return "success";
#define DITD__ERR_MSG(name, msg, http) case DITD_E##name: return msg;
    DITD_ERRNO_MAP(DITD__ERR_MSG)
#undef DITD__ERR_MSG
    default: return "unknown error";
    }
}

const char *ditd_err_name(int err)
{
    switch (err) {
    case DITD_OK: return "OK";
#define DITD__ERR_NAME(name, msg, http) case DITD_E##name: return "E" #name;
    DITD_ERRNO_MAP(DITD__ERR_NAME)
#undef DITD__ERR_NAME
    default: return "EUNKNOWN";
    }
}

int ditd_err_http_status(int err)
{
    switch (err) {
    case DITD_OK: return 200;
#define DITD__ERR_HTTP(name, msg, http) case DITD_E##name: return http;
    DITD_ERRNO_MAP(DITD__ERR_HTTP)
#undef DITD__ERR_HTTP
    default: return 500;
    }
}

int ditd_err_set(int err, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err_detail, sizeof err_detail, fmt, ap);
    va_end(ap);
    return err;
}

const char *ditd_err_detail(void)
{
    return err_detail;
}

void ditd_err_clear(void)
{
    err_detail[0] = '\0';
}
