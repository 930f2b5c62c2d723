/* A family's original (pre-Diffusers) parameter names mapped onto
 * Diffusers' ones, as Diffusers' single-file loader maps them
 * (diffusers/loaders/single_file_utils.py), recorded so that the file can
 * be checked for tensors the mapping did not use.
 *
 * The family's mapper (engine/models/sd3/sd3_orig.c,
 * engine/models/wan/wan_orig.c) calls ditd_orig_map_seg for every
 * Diffusers name: it registers the alias on the weight source
 * (engine/io/weights.h; none when the names agree) and remembers which of
 * the file's tensors it read. After the model's weight list is written,
 * ditd_orig_map_check refuses a file tensor no mapping read and a mapped
 * name the model does not read, naming both: Diffusers' own load would
 * refuse those as unexpected keys, and a silently ignored tensor is a
 * wrong model.
 *
 * What it is not: the mapping itself (the family's), or used for files in
 * Diffusers' names (those load as they are).
 */
#ifndef DITD_ENGINE_ORIG_MAP_H
#define DITD_ENGINE_ORIG_MAP_H

#include <stdint.h>

#include "engine/io/weights.h"
#include "engine/models/weight_list.h"

#define DITD_ORIG_PREFIX "model.diffusion_model." /* ComfyUI's, which Diffusers strips */

typedef struct ditd_orig_pair {
    char dst[160];
    char src[160]; /* the file's name (the first segment's) */
} ditd_orig_pair;

typedef struct ditd_orig_map {
    ditd_weights *w;
    const char *pre;      /* "" or DITD_ORIG_PREFIX: what the file's names start with */
    const char *scope;    /* the file tensors that are the transformer's: those starting
                           * with it ("" all; DITD_ORIG_PREFIX in a whole-pipeline
                           * checkpoint, whose VAE and text encoders are other
                           * components' and not checked) */
    ditd_orig_pair *p;
    int n, cap;
    uint8_t *used;        /* per file tensor: read by a mapping */
    int err;              /* the first error; every call after it does nothing */
} ditd_orig_map;

/* Starts a map over w's tensors (pre as above, scope = pre). 0 or
 * DITD_ENOMEM. */
int ditd_orig_map_init(ditd_orig_map *m, ditd_weights *w, const char *pre);
void ditd_orig_map_free(ditd_orig_map *m);

/* Whether the file holds pre + name. */
int ditd_orig_map_has(const ditd_orig_map *m, const char *name);

/* dst := the rows of nseg (1..2) segments, src names without the prefix.
 * A missing source is m->err = DITD_EFORMAT naming it and dst. */
void ditd_orig_map_seg(ditd_orig_map *m, const char *dst, int nseg, const ditd_weight_seg *segs);
/* dst.{weight,bias} := src.{weight,bias} rows [r0, r0 + rows) (rows -1: all). */
void ditd_orig_map_lin(ditd_orig_map *m, const char *dst, const char *src, int64_t r0,
                       int64_t rows);
/* dst := src, whole. */
void ditd_orig_map_one(ditd_orig_map *m, const char *dst, const char *src);

/* After the weight list l is written: every file tensor in scope read by some
 * mapping, every mapped name read by l or listed in also (NULL-ended).
 * DITD_EFORMAT naming the tensor, the file and cls otherwise. */
int ditd_orig_map_check(const ditd_orig_map *m, const ditd_wl *l, const char *const *also,
                        const char *cls);

#endif
