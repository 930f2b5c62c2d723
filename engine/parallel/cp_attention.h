/* Context-parallel attention: one multi-head attention over a sequence whose
 * tokens are split over the ring x ulysses ranks of a mesh, for any family
 * and any (B, N, H, Dh). Every family calls this; none writes its own.
 *
 *   tokens: N "split" tokens (image patches) over R*U cp ranks, cp rank
 *     s = r*U + u holding ditd_split(N, R*U, s) (uneven is fine), or
 *     counts[s] tokens as the caller gives them (_new_counts: FLUX under cp
 *     passes each rank's [text slice; image slice]), and an optional
 *     prefix of L tokens (FLUX's text on one rank or under tp alone) that
 *     is NOT split: every cp rank holds the whole prefix, the same values.
 *     The attention is over the concatenation [prefix; all N tokens],
 *     queries of both kinds.
 *   heads: H is what the caller holds (after its own tensor-parallel
 *     split); ulysses splits them again, ditd_split(H, U, u).
 *
 *   Ulysses: all-to-all from (local tokens, all H heads) to (the ring
 *     chunk's tokens, H_u heads), attention, all-to-all back.
 *   Ring: K/V blocks of the R ring chunks visit every ring rank (allgather,
 *     or p2p: send/recv double-buffered, the next block in flight while
 *     this one's attention runs); partials merge by their log-sum-exp in
 *     fp32, the own block first.
 *   Prefix, split queries: the prefix K/V (this rank's H_u heads, sliced
 *     from the replicated prefix, no communication) is one more block,
 *     merged after the ring blocks.
 *   Prefix queries: ring rank r attends them to its own chunk (ring rank 0
 *     also to the prefix itself); the R partials are all-gathered over the
 *     ring and merged in ring order 0..R-1 on every rank, then the heads
 *     all-gathered over ulysses. So every cp rank ends with the same bits
 *     of the prefix output, which keeps a replicated text stream replicated.
 *   One rank (no mesh, or R*U = 1): one attention call over the split
 *     tokens (exactly the single-rank op), plus the prefix block merged.
 *
 * Memory: every buffer is planned in _new for max_batch; _run allocates
 * nothing and synchronizes only in the collectives.
 *
 * What it is not: no projections, no norms, no RoPE (the family applies
 * them to q and k before the call), no tensor parallelism (the caller's).
 */
#ifndef DITD_ENGINE_CP_ATTENTION_H
#define DITD_ENGINE_CP_ATTENTION_H

#include <stddef.h>

#include "engine/backend/backend.h"
#include "engine/core/tensor.h"
#include "engine/parallel/mesh.h"

typedef struct ditd_cp_attention {
    const ditd_backend_ops *ops;
    const ditd_mesh *mesh;   /* borrowed; NULL = one rank (also a mesh without cp) */
    int R, U, ring_rank, uly_rank;
    int max_batch, N, L, H, Dh;
    /* the split: this rank's tokens, its ring chunk, its ulysses heads */
    int n_loc, tok0;         /* N_loc tokens of this cp rank, from token tok0 */
    int nr, ring0;           /* tokens of this rank's ring chunk */
    int hu, hu0;             /* heads after the ulysses exchange */
    int max_ring;
    int *tok_cnt, *tok_off;  /* (R*U) tokens per cp rank */
    int *ring_cnt, *ring_off;/* (R) tokens per ring chunk */
    int *uh_cnt, *uh_off;    /* (U) heads per ulysses rank */
    int *cnt_a, *dsp_a, *cnt_b, *dsp_b; /* (max(R*U, 2)) collective counts */
    int *lead;               /* (R*U) leading-segment tokens per cp rank (_new_counts) */
    int seg;                 /* ulysses alone with segments: segment-wise attention */
    int nf;                  /* leading-segment tokens of this ring chunk (seg) */
    ditd_arena acts;
    void *a2a_send, *a2a_recv;
    void *q;                 /* (B, N_ring, H_u Dh) */
    void *kv, *kv2;          /* K/V blocks (B, n, 2 H_u Dh): all R (allgather) or 2 (p2p) */
    void *o_acc, *o_blk;     /* (B, N_ring, H_u Dh) */
    float *lse_acc, *lse_blk;/* (B, H_u, N_ring) fp32 */
    void *p_o;               /* (R, B, L, H_u Dh) prefix partials, ring rank order */
    float *p_lse;            /* (R, B, H_u, L) */
    void *p_blk;             /* (B, L, H_u Dh) */
    float *p_lse_blk;        /* (B, H_u, L) */
    void *p_gath;            /* (B, L, H Dh) ulysses blocks before reordering */
} ditd_cp_attention;

/* Plans the split and the buffers for an attention of H heads of Dh over
 * N split tokens and L prefix tokens (0: none), batches up to max_batch.
 * The mesh (borrowed, outlives this) is checked first
 * (ditd_layout_check_attention on H and N: DITD_EINVAL naming the numbers,
 * on every rank alike). Not collective. *out owned: _free. */
int ditd_cp_attention_new(const ditd_backend_ops *ops, const ditd_mesh *mesh, int max_batch,
                          int N, int L, int H, int Dh, ditd_cp_attention **out);
/* The same without a prefix, the tokens split as given: cp rank s (= r*U + u)
 * holds counts[s] > 0 tokens (R*U counts, the same on every rank; cp rank s's
 * tokens follow s-1's in the attention's order). lead (R*U, or NULL): the
 * first lead[s] <= counts[s] of rank s's tokens form a leading segment
 * (FLUX: its text slice before its image slice). Under ulysses alone (R = 1)
 * the attention then runs as one rank runs it with that segment as the
 * prefix: queries of the rest against the rest, then against the segment,
 * merged; the segment's queries against the rest, then against itself,
 * merged; so its bits equal one rank's prefix path. Under ring the segments
 * are attended like any tokens. Without a cp group (one rank) counts (and
 * lead) hold one entry. */
int ditd_cp_attention_new_counts(const ditd_backend_ops *ops, const ditd_mesh *mesh,
                                 int max_batch, const int *counts, const int *lead, int H, int Dh,
                                 ditd_cp_attention **out);
void ditd_cp_attention_free(ditd_cp_attention *a);

/* o = softmax(q k^T / sqrt(Dh)) v over [prefix; all N tokens].
 *   q, k, v: (B, N_loc, H, Dh) this rank's tokens [tok0, tok0 + n_loc),
 *            rows of stride ld elements (one token's H*Dh values contiguous)
 *   o:       (B, N_loc, H Dh), rows of stride ldo
 *   pq, pk, pv: (B, L, H, Dh) the whole prefix, same on every cp rank,
 *            rows of stride pld (NULL when L = 0)
 *   po:      (B, L, H Dh), stride pldo: the prefix's output, the same bits
 *            on every cp rank
 * Backend buffers. Collective over the mesh's ring and ulysses comms:
 * every cp rank calls it with the same B. B <= max_batch. */
int ditd_cp_attention_run(ditd_cp_attention *a, int B, const void *q, const void *k,
                          const void *v, size_t ld, void *o, size_t ldo, const void *pq,
                          const void *pk, const void *pv, size_t pld, void *po, size_t pldo);

/* Bytes of the planned buffers. */
size_t ditd_cp_attention_bytes(const ditd_cp_attention *a);

#endif
