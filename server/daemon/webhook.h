/* Webhooks of `ditd serve` (--webhook-url, --webhook-secret): an event for
 * each video job that ends (video.completed, video.failed), POSTed as
 * OpenAI posts its webhooks (the Standard Webhooks scheme):
 *
 *   webhook-id: evt_<24 hex>        unique per event, the same on a retry
 *   webhook-timestamp: <Unix s>     of this attempt
 *   webhook-signature: v1,<base64 HMAC-SHA256(key, id "." timestamp "." body)>
 *   body: {"id": "evt_...", "object": "event", "created_at": T,
 *          "type": "video.completed", "data": {"id": "<video id>"}}
 *
 * key is the secret's bytes: a "whsec_" secret is base64 after its prefix,
 * as OpenAI issues them (the official client's webhooks.unwrap verifies
 * it). A delivery is a 2xx answer within 10 s; otherwise it is retried
 * after 1, 2, 4, 8 and 16 s, then dropped (logged and counted). Delivery
 * runs on a thread of its own (the loop never waits on a receiver). The URL
 * is plain http:// (a receiver on the node, or a relay): https:// is
 * refused at start-up, not built yet. Events still queued when the server
 * stops are dropped, each logged. */
#ifndef DITD_SERVER_DAEMON_WEBHOOK_H
#define DITD_SERVER_DAEMON_WEBHOOK_H

typedef struct ditd_webhook ditd_webhook;

/* Checks url (http://HOST[:PORT][/PATH]) and secret ("whsec_" + base64 of
 * at least 16 bytes), starts the delivery thread. url "": no webhooks
 * (*out NULL, 0). DITD_EINVAL naming the flag otherwise. */
int ditd_webhook_open(const char *url, const char *secret, ditd_webhook **out);
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
