/* The web page served at GET / (server/daemon/page.html, embedded at build time by
 * proto/embed.py). A single self-contained HTML file: no build step, no
 * external assets. It uses only the public API (GET /v1/models, streamed
 * POST /v1/images/generations); nothing here knows about models. */
#ifndef DITD_SERVER_PAGE_H
#define DITD_SERVER_PAGE_H

#include <stddef.h>

struct MHD_Response;

extern const unsigned char ditd_page_html[]; /* NUL-terminated */
extern const size_t ditd_page_html_len;      /* without the NUL */

/* A new response carrying the page (persistent memory: the bytes are not
 * copied) with its Content-Type and a Content-Security-Policy that forbids
 * anything but the page's own inline script/style, same-origin fetches and
 * data: images. Owned by the caller (queue it, then destroy); NULL on OOM. */
struct MHD_Response *ditd_page_response(void);

#endif
