/* Webhooks of `ditd serve` (--webhook-url, --webhook-secret, --webhook-ca):
 * an event for each background job that ends, POSTed as OpenAI posts its
 * webhooks (the Standard Webhooks scheme): video.completed / video.failed
 * for a clip (/v1/videos), job.completed / job.failed for an image job
 * (/v1/images/generations with "background": true, /v1/jobs):
 *
 *   webhook-id: evt_<24 hex>        unique per event, the same on a retry
 *   webhook-timestamp: <Unix s>     of this attempt
 *   webhook-signature: v1,<base64 HMAC-SHA256(key, id "." timestamp "." body)>
 *   body: {"id": "evt_...", "object": "event", "created_at": T,
 *          "type": "video.completed", "data": {"id": "<video or job id>"}}
 *
 * key is the secret's bytes: a "whsec_" secret is base64 after its prefix,
 * as OpenAI issues them (the official client's webhooks.unwrap verifies
 * it). A delivery is a 2xx answer within 10 s; otherwise it is retried
 * after 1, 2, 4, 8 and 16 s, then dropped (logged and counted). Delivery
 * runs on a thread of its own (the loop never waits on a receiver). The URL
 * is http:// or https://: over TLS the receiver's certificate chain must
 * lead to a root of the system's store (or of --webhook-ca, a PEM file,
 * instead) and name the URL's host (a DNS name, or an IP address in its
 * subjectAltName); a receiver that fails the check gets nothing, and the
 * attempt counts as failed. Events still queued when the server stops are
 * dropped, each logged. */
#ifndef DITD_SERVER_DAEMON_WEBHOOK_H
#define DITD_SERVER_DAEMON_WEBHOOK_H

typedef struct ditd_webhook ditd_webhook;

/* Checks url (http[s]://HOST[:PORT][/PATH]), secret ("whsec_" + base64 of
 * at least 16 bytes) and, for https, reads the roots (ca_file, a PEM file,
 * or NULL / "": the system's), starts the delivery thread. url "": no
 * webhooks (*out NULL, 0). DITD_EINVAL naming the flag otherwise. */
int ditd_webhook_open(const char *url, const char *secret, const char *ca_file,
                      ditd_webhook **out);
/* Stops the thread; what was not delivered is dropped (logged). NULL: no-op. */
void ditd_webhook_close(ditd_webhook *w);

/* Queues an event of type about object_id (loop thread; never blocks on
 * the network). NULL: no-op. */
void ditd_webhook_emit(ditd_webhook *w, const char *type, const char *object_id);

/* Counters for /metrics: events delivered, attempts that failed, events
 * dropped after the last retry (or at shutdown). */
void ditd_webhook_counts(ditd_webhook *w, unsigned long long *delivered,
                         unsigned long long *failed_attempts, unsigned long long *dropped);

#endif
