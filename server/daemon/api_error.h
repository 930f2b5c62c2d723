/* The API's error object (OpenAI's {"error": {message, type, param,
 * code}}) as the request parsers fill it; reply.c writes it. */
#ifndef DITD_SERVER_API_ERROR_H
#define DITD_SERVER_API_ERROR_H

/* A validation failure: HTTP status, OpenAI type/code, the offending field
 * ("" when none) and a message for people. */
typedef struct ditd_api_error {
    int status;
    const char *type;           /* "invalid_request_error", "server_error", ... */
    const char *code;           /* "invalid_value", "model_not_found", ... */
    char param[64];
    char message[1024];
} ditd_api_error;

/* Fills *e; returns status. param may be NULL. */
int ditd_api_error_set(ditd_api_error *e, int status, const char *type, const char *code,
                       const char *param, const char *fmt, ...) __attribute__((format(printf, 6, 7)));

/* A 400 invalid_request_error / invalid_value naming param (may be NULL);
 * returns DITD_EINVAL, for the request parsers' "return bad(...)". */
int ditd_api_bad(ditd_api_error *e, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif
