/* The front-end's log: text or JSON lines, levels, a reopenable file. */
#include "server/daemon/log.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "engine/core/error.h"
#include "server/daemon/genreq.h"

static struct {
    ditd_log_level min;
    ditd_log_format fmt;
    int fd;              /* 2 = stderr */
    char path[4096];
} g_log = {DITD_LOG_INFO, DITD_LOG_TEXT, 2, ""};

static const char *const level_names[] = {"debug", "info", "warn", "error"};
static const char *const format_names[] = {"text", "json"};

const char *ditd_log_level_name(ditd_log_level l)
{
    return (unsigned)l < 4 ? level_names[l] : "?";
}

int ditd_log_level_from_str(const char *s, ditd_log_level *out)
{
    for (int i = 0; i < 4; i++)
        if (!strcmp(s, level_names[i])) {
            *out = (ditd_log_level)i;
            return 0;
        }
    if (!strcmp(s, "warning")) {
        *out = DITD_LOG_WARN;
        return 0;
    }
    return DITD_EINVAL;
}

const char *ditd_log_format_name(ditd_log_format f)
{
    return (unsigned)f < 2 ? format_names[f] : "?";
}

int ditd_log_format_from_str(const char *s, ditd_log_format *out)
{
    for (int i = 0; i < 2; i++)
        if (!strcmp(s, format_names[i])) {
            *out = (ditd_log_format)i;
            return 0;
        }
    return DITD_EINVAL;
}

double ditd__now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int open_file(const char *path)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0640);
    if (fd < 0)
        return ditd_err_set(DITD_EIO, "log file %s: %s", path, strerror(errno));
    return fd;
}

int ditd_log_open(ditd_log_level min, ditd_log_format fmt, const char *path)
{
    g_log.min = min;
    g_log.fmt = fmt;
    if (!path || !*path)
        return 0;
    int fd = open_file(path);
    if (fd < 0)
        return fd;
    ditd_log_close();
    snprintf(g_log.path, sizeof g_log.path, "%s", path);
    g_log.fd = fd;
    return 0;
}

int ditd_log_reopen(void)
{
    if (!g_log.path[0])
        return 0;
    int fd = open_file(g_log.path);
    if (fd < 0)
        return fd;
    close(g_log.fd);
    g_log.fd = fd;
    return 0;
}

void ditd_log_close(void)
{
    if (g_log.fd != 2)
        close(g_log.fd);
    g_log.fd = 2;
    g_log.path[0] = '\0';
}

/* Appends s to b as the inside of a JSON string (escapes; valid UTF-8
 * kept, other bytes as '?'). */
static size_t json_esc(char *b, size_t at, size_t cap, const char *s)
{
    static const char hex[] = "0123456789abcdef";
    for (; s && *s && at + 7 < cap; s++) {
        unsigned char c = (unsigned char)*s;
        if (c >= 0x80) {
            size_t k = ditd_utf8_seq((const unsigned char *)s, strnlen(s, 4));
            if (!k) {
                b[at++] = '?';
                continue;
            }
            if (at + k + 7 >= cap)
                break;
            memcpy(b + at, s, k);
            at += k;
            s += k - 1;
        } else if (c == '"' || c == '\\') {
            b[at++] = '\\';
            b[at++] = (char)c;
        } else if (c < 0x20 || c == 0x7f) {
            b[at++] = '\\';
            b[at++] = 'u';
            b[at++] = '0';
            b[at++] = '0';
            b[at++] = hex[c >> 4];
            b[at++] = hex[c & 15];
        } else {
            b[at++] = (char)c;
        }
    }
    return at;
}

/* Control bytes and bytes that are not UTF-8 become '?' in text lines: a
 * client cannot forge a line. */
static size_t text_clean(char *b, size_t at, size_t cap, const char *s)
{
    for (; s && *s && at + 1 < cap; s++) {
        unsigned char c = (unsigned char)*s;
        size_t k = c >= 0x80 ? ditd_utf8_seq((const unsigned char *)s, strnlen(s, 4)) : 1;
        if (c < 0x20 || c == 0x7f || !k) {
            b[at++] = '?';
        } else if (at + k < cap) {
            memcpy(b + at, s, k);
            at += k;
            s += k - 1;
        } else {
            break;
        }
    }
    return at;
}

static size_t stamp(char *b, size_t cap)
{
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    size_t n = strftime(b, cap, "%Y-%m-%dT%H:%M:%S", &tm);
    n += (size_t)snprintf(b + n, cap - n, ".%03dZ", (int)(ts.tv_nsec / 1000000));
    return n;
}

static void emit(char *line, size_t n)
{
    line[n++] = '\n';
    /* one write per line */
    ssize_t w = write(g_log.fd, line, n);
    (void)w;
}

void ditd_log(ditd_log_level l, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    ditd_logv(l, fmt, ap);
    va_end(ap);
}

void ditd_logv(ditd_log_level l, const char *fmt, va_list ap)
{
    char msg[2048], line[4608], ts[40];
    size_t n;
    if (l < g_log.min)
        return;
    vsnprintf(msg, sizeof msg, fmt, ap);
    n = strlen(msg);
    while (n && (msg[n - 1] == '\n' || msg[n - 1] == '\r'))
        msg[--n] = '\0';
    stamp(ts, sizeof ts);
    if (g_log.fmt == DITD_LOG_JSON) {
        n = (size_t)snprintf(line, sizeof line, "{\"ts\":\"%s\",\"level\":\"%s\",\"msg\":\"", ts,
                             ditd_log_level_name(l));
        n = json_esc(line, n, sizeof line - 3, msg);
        line[n++] = '"';
        line[n++] = '}';
    } else {
        n = (size_t)snprintf(line, sizeof line, "%s ditd serve: %s%s", ts,
                             l >= DITD_LOG_WARN ? ditd_log_level_name(l) : "",
                             l >= DITD_LOG_WARN ? ": " : "");
        n = text_clean(line, n, sizeof line - 1, msg);
    }
    emit(line, n);
}

void ditd_log_request(const ditd_log_access *a)
{
    char line[2048], ts[40];
    size_t n;
    if (DITD_LOG_INFO < g_log.min)
        return;
    stamp(ts, sizeof ts);
    if (g_log.fmt == DITD_LOG_JSON) {
        n = (size_t)snprintf(line, sizeof line, "{\"ts\":\"%s\",\"level\":\"info\",\"msg\":\"request\",\"method\":\"", ts);
        n = json_esc(line, n, sizeof line - 200, a->method ? a->method : "-");
        n += (size_t)snprintf(line + n, sizeof line - n, "\",\"path\":\"");
        n = json_esc(line, n, sizeof line - 200, a->path ? a->path : "-");
        n += (size_t)snprintf(line + n, sizeof line - n, "\",\"route\":\"");
        n = json_esc(line, n, sizeof line - 200, a->route ? a->route : "-");
        n += (size_t)snprintf(line + n, sizeof line - n, "\",\"request_id\":\"");
        n = json_esc(line, n, sizeof line - 200, a->rid ? a->rid : "-");
        n += (size_t)snprintf(line + n, sizeof line - n, "\",\"peer\":\"");
        n = json_esc(line, n, sizeof line - 200, a->peer ? a->peer : "-");
        n += (size_t)snprintf(line + n, sizeof line - n,
                              "\",\"status\":%d,\"bytes\":%llu,\"latency_ms\":%.3f}", a->status,
                              (unsigned long long)a->bytes, a->ms);
    } else {
        n = (size_t)snprintf(line, sizeof line, "%s ditd serve: request ", ts);
        n = text_clean(line, n, sizeof line - 200, a->method ? a->method : "-");
        line[n++] = ' ';
        n = text_clean(line, n, sizeof line - 200, a->path ? a->path : "-");
        n += (size_t)snprintf(line + n, sizeof line - n, " route=");
        n = text_clean(line, n, sizeof line - 200, a->route ? a->route : "-");
        n += (size_t)snprintf(line + n, sizeof line - n, " status=%d bytes=%llu ms=%.1f id=",
                              a->status, (unsigned long long)a->bytes, a->ms);
        n = text_clean(line, n, sizeof line - 80, a->rid ? a->rid : "-");
        n += (size_t)snprintf(line + n, sizeof line - n, " peer=");
        n = text_clean(line, n, sizeof line - 2, a->peer ? a->peer : "-");
    }
    emit(line, n);
}
