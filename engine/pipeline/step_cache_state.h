/* Step caching's internals, shared by step_cache.c (state, block hooks,
 * the group's exchange) and step_cache_taylor.c (TaylorSeer's module hooks).
 * Not a public header: engine/pipeline/step_cache.h is. */
#ifndef DITD_ENGINE_STEP_CACHE_INTERNAL_H
#define DITD_ENGINE_STEP_CACHE_INTERNAL_H

#include "engine/pipeline/step_cache.h"

#define MAX_ORDER_BUFS 10 /* max_order (<= 8) + 2 */
#define HDR 6             /* exchange record header: tok0, n_img, r0, nr, tp_rank, valid */

/* One state as a hook's StateManager keeps it per cache context. */
typedef struct unit_state {
    int has_prev;        /* fbc: head_block_residual is set; mag: previous_residual is set */
    int step_index;      /* mag */
    float acc_ratio, acc_err;
    int acc_steps;
    uint8_t present;     /* has rows in this step's forward */
    uint8_t compute;     /* this forward's decision (fbc, mag) */
    int calls, preds;    /* taylorseer: hooked-module calls / predictions this step */
    int n_cal, n_cal_out; /* mag calibrate: ratios measured, and kept at the run's end */
} unit_state;

/* TaylorSeerState of one (unit, module) */
typedef struct tay_state {
    int current_step;     /* -1 */
    int last_update_step; /* -1: None */
    int orders;           /* len(taylor_factors[0]); 0: none */
    uint8_t compute;      /* this call's decision */
} tay_state;

struct ditd_step_cache {
    const ditd_backend_ops *ops;
    const ditd_mesh *mesh;
    int max_samples, max_slots;
    ditd_cache_config cfg;
    ditd_denoiser *den;
    ditd_denoiser_cache hooks;
    int n, steps, shared, units, L, N;
    size_t E;        /* elements of one row's image stream on this rank */
    int R;           /* rows a forward may have on this rank */

    /* device buffers (one block) */
    void *mem;
    size_t mem_bytes;
    void *in, *hout, *res;  /* (R, E) scratch of a forward */
    void *prev_res, *tail;  /* (slots, E) */
    void *zero;             /* (max module elems) zeros */
    /* taylorseer: per module */
    int np;                 /* family's modules */
    uint8_t *hooked, *inactive;
    char (*names)[160];     /* the family's module names */
    size_t *elems;
    void **tbuf;            /* (slots, np, MAX_ORDER_BUFS) buffer pointers */
    tay_state *tay;         /* (units, np) */

    /* host */
    unit_state *us;         /* (units) */
    float *cal, *cal_out;   /* (units, steps) */
    ditd_cache_stats *stats; /* (max_samples) */
    int rows;               /* this step's rows (both halves) */
    int *row_sample, *row_unit, *row_slot; /* (2 max_samples) */
    int r0, nr;
    int n_img;              /* this rank's image tokens in the last forward */
    double *tok;            /* (R, N, 4) per-token statistics of this rank */
    double *send, *recv;    /* exchange records */
    size_t rec;             /* doubles per record */
    double *table;          /* (2 max_samples, N, 2) the step's gathered statistics */
    int *counts, *displs;   /* (group size) */
    uint8_t *dec;           /* (units) broadcast decisions */
    float *mag;             /* (steps) mag_ratios interpolated */
    double *trace;          /* fbc: (units, steps + 1, 2) the group's and this rank's own ratio */
    int *trace_n;           /* (units) decisions traced */
    int retention_step, mag_steps;
};

/* helpers over this rank's rows */
static inline void *cache_row(const ditd_step_cache *c, void *base, size_t r, size_t E)
{
    return ditd_ptr_act(c->ops, base, r * E);
}

static inline void copy_row(const ditd_step_cache *c, void *dst, const void *src, size_t E)
{
    c->ops->copy2d(dst, E, src, E, 1, E);
}

/* TaylorSeer (step_cache_taylor.c): which of the family's modules are
 * hooked (c->np, hooked, inactive, elems), and the module hooks. */
int ditd__step_cache_resolve_modules(ditd_step_cache *c, ditd_denoiser *d);
int ditd__step_cache_module_begin(void *ctx, int id, void *out, int *predicted);
int ditd__step_cache_module_end(void *ctx, int id, const void *out);
int ditd__step_cache_module_begin_parts(void *ctx, int id, const ditd_cache_part *parts, int n,
                                        int *predicted);
int ditd__step_cache_module_end_parts(void *ctx, int id, const ditd_cache_part *parts, int n);
/* A cfg half without rows: the counters of one forward as the other half
 * advances them (a predicted module's submodules are not called). */
void ditd__step_cache_module_idle(ditd_step_cache *c);

#endif
