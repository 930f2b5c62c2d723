/* The HTTP routes of `ditd serve` (see routes.c): libmicrohttpd's request
 * and completion callbacks, and the periodic watch over waiting requests.
 * Loop thread only. */
#ifndef DITD_SERVER_ROUTES_H
#define DITD_SERVER_ROUTES_H

#include <microhttpd.h>

typedef struct ditd_srv ditd_srv;

/* libmicrohttpd callbacks; cls is the ditd_srv. */
enum MHD_Result ditd__on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                 const char *method, const char *version, const char *upload,
                                 size_t *upload_size, void **ctx);
void ditd__on_completed(void *cls, struct MHD_Connection *conn, void **ctx,
                        enum MHD_RequestTerminationCode toe);
/* Periodic: request timeouts, clients gone while waiting, keep-alives. */
void ditd__jobs_watch(ditd_srv *s);

#endif
