/* Step caching's config and counts in the front-end <-> replica messages
 * (proto/ditd.proto CacheConfig, CacheStats): ditd_cache_config's typed
 * fields copied one for one, so the replica runs exactly what the request
 * gave (no text round trip: doubles stay doubles).
 *
 * What it is not: no validation beyond what the message can get wrong
 * (counts, enums); the ranges are ditd_cache_config_check's. */
#ifndef DITD_ENGINE_CACHE_MSG_H
#define DITD_ENGINE_CACHE_MSG_H

#include "engine/pipeline/step_cache.h"
#include "proto/ditd.pb-c.h"

/* A message viewing c: m's repeated fields point into c and into ids
 * (2 * DITD_CACHE_MAX_PATTERNS pointers the caller provides), so c and ids
 * must outlive m's use (packing). */
void ditd_cache_msg_from_config(const ditd_cache_config *c, Ditd__CacheConfig *m,
                                char *ids[2 * DITD_CACHE_MAX_PATTERNS]);

/* The config a message gives (NULL: off), checked as
 * ditd_cache_config_check. DITD_EINVAL naming the field otherwise. */
int ditd_cache_msg_to_config(const Ditd__CacheConfig *m, ditd_cache_config *out);

#endif
