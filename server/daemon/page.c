/* GET /: the embedded web page (server/daemon/page.html). Only the response: the
 * route itself lives in server/daemon/routes.c. */
#include "server/daemon/page.h"

#include <microhttpd.h>

struct MHD_Response *ditd_page_response(void)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(
        ditd_page_html_len, (void *)ditd_page_html, MHD_RESPMEM_PERSISTENT);
    if (!r)
        return NULL;
    MHD_add_response_header(r, "Content-Type", "text/html; charset=utf-8");
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
    MHD_add_response_header(r, "Content-Security-Policy",
                            "default-src 'none'; script-src 'unsafe-inline'; style-src "
                            "'unsafe-inline'; img-src data:; media-src blob:; connect-src 'self' blob:; "
                            "form-action 'none'; frame-ancestors 'none'; base-uri 'none'");
    return r;
}
