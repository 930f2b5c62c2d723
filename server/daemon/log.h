/* The front-end's log: one line per event, text or JSON, with a level, on
 * stderr or in a file that SIGHUP reopens (log rotation). Access lines (one
 * per HTTP request) are a record of their own with fixed fields.
 *
 * Process-wide, like syslog: opened once by `ditd serve`, written from the
 * loop thread (and, before the loop runs, from main; the webhook thread's
 * rare warnings too: webhook.h). Each line is one
 * write(), so ranks under mpirun never interleave mid-line. Not a metrics
 * or tracing facility.
 *
 * Also the front-end's clock (ditd__now), so that every module that logs or
 * times reads the same monotonic seconds. */
#ifndef DITD_SERVER_LOG_H
#define DITD_SERVER_LOG_H

#include <stdarg.h>
#include <stdint.h>

typedef enum ditd_log_level {
    DITD_LOG_DEBUG = 0,
    DITD_LOG_INFO,
    DITD_LOG_WARN,
    DITD_LOG_ERROR,
} ditd_log_level;

typedef enum ditd_log_format {
    DITD_LOG_TEXT = 0,
    DITD_LOG_JSON,
} ditd_log_format;

const char *ditd_log_level_name(ditd_log_level l);
int ditd_log_level_from_str(const char *s, ditd_log_level *out);   /* 0 or DITD_EINVAL */
const char *ditd_log_format_name(ditd_log_format f);
int ditd_log_format_from_str(const char *s, ditd_log_format *out); /* 0 or DITD_EINVAL */

/* Lines under `min` are dropped. path NULL or "" writes to stderr; a file is
 * opened for append. Returns 0 or DITD_EIO naming the path (the log stays on
 * stderr then). */
int ditd_log_open(ditd_log_level min, ditd_log_format fmt, const char *path);
/* Reopens the file (SIGHUP after a rotation); a no-op on stderr. 0 or
 * DITD_EIO (the old file stays in use). */
int ditd_log_reopen(void);
void ditd_log_close(void);

void ditd_log(ditd_log_level l, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void ditd_logv(ditd_log_level l, const char *fmt, va_list ap) __attribute__((format(printf, 2, 0)));

/* One HTTP request, as it ended. Strings are borrowed; any may be NULL. */
typedef struct ditd_log_access {
    const char *method;
    const char *path;     /* the route's path as the client sent it (truncated) */
    const char *route;    /* the route's name (metrics label) */
    const char *rid;      /* request id */
    const char *peer;     /* client address */
    int status;           /* 0: no answer was sent (the client went away) */
    uint64_t bytes;       /* response body bytes sent */
    double ms;            /* arrival to the end of the answer */
} ditd_log_access;
void ditd_log_request(const ditd_log_access *a);

/* Monotonic seconds. */
double ditd__now(void);

#endif
