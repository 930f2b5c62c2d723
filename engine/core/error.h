/* Error codes of ditd: one X-macro table gives each code its name, message and
 * HTTP status (as libuv's UV_ERRNO_MAP). Fallible functions return 0 or a
 * negative DITD_E* code; a human-readable detail (which file, which tensor,
 * which key) is kept per thread by ditd_err_set() and read by ditd_err_detail().
 *
 * This is not a logging facility and holds no global state beyond the
 * per-thread detail buffer.
 */
#ifndef DITD_ENGINE_ERROR_H
#define DITD_ENGINE_ERROR_H

#include <stddef.h>

/*          name          message                         http */
#define DITD_ERRNO_MAP(X)                                              \
    X(INVAL,      "invalid argument",                     400)          \
    X(NOMEM,      "out of memory",                        500)          \
    X(IO,         "input/output error",                   500)          \
    X(NOENT,      "no such file or object",               404)          \
    X(FORMAT,     "malformed file",                       400)          \
    X(UNSUPPORTED,"unsupported configuration",            400)          \
    X(SHAPE,      "shape mismatch",                       400)          \
    X(RANGE,      "value out of range",                   400)          \
    X(BUSY,       "queue full",                           429)          \
    X(CANCELED,   "canceled",                             499)          \
    X(TIMEDOUT,   "timed out",                            504)          \
    X(UNAVAIL,    "service unavailable",                  503)          \
    X(COMM,       "communication failure",                500)          \
    X(DEVICE,     "device error",                         500)          \
    X(INTERNAL,   "internal error",                       500)

typedef enum ditd_errno {
    DITD_OK = 0,
#define DITD__ERR_ENUM(name, msg, http) DITD_E##name,
    DITD__ERR_FIRST = -1000,
    DITD_ERRNO_MAP(DITD__ERR_ENUM)
#undef DITD__ERR_ENUM
    DITD__ERR_LAST
} ditd_errno;

/* Static strings; unknown codes give "unknown error" / "EUNKNOWN" / 500. */
const char *ditd_strerror(int err);
const char *ditd_err_name(int err);
int ditd_err_http_status(int err);

/* Records a printf-style detail for this thread and returns err, so callers
 * write `return ditd_err_set(DITD_EFORMAT, "%s: tensor %s ...", ...)`. */
int ditd_err_set(int err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The last detail recorded on this thread ("" if none). Borrowed; valid until
 * the next ditd_err_set() on this thread. */
const char *ditd_err_detail(void);

/* Clears this thread's detail. */
void ditd_err_clear(void);

#endif
