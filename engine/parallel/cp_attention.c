/* Context-parallel attention (Ulysses, Ring allgather/p2p, USP, uneven or
 * per-rank token counts, with an optional unsplit prefix), for any family. */
#include "engine/parallel/cp_attention.h"

#include <math.h>
#include <stdlib.h>

#include "engine/core/error.h"

static int carve(ditd_arena *a, void **p, ditd_dtype dt, size_t n)
{
    int err;
    *p = ditd_arena_bytes(a, n * ditd_dtype_size(dt), &err);
    return err;
}

static size_t max_sz(size_t x, size_t y)
{
    return x > y ? x : y;
}

static int carve_all(ditd_cp_attention *a)
{
    size_t B = (size_t)a->max_batch, N = (size_t)a->N, L = (size_t)a->L, Dh = (size_t)a->Dh;
    size_t Nl = (size_t)a->n_loc, nr = (size_t)a->nr, mr = (size_t)a->max_ring;
    size_t HD = (size_t)a->H * Dh, huD = (size_t)a->hu * Dh, hu = (size_t)a->hu;
    int U = a->U, R = a->R;
    ditd_dtype at = a->ops->act_dtype;
    ditd_arena *ar = &a->acts;
    int err = 0;

    if (R * U > 1) {
        if (U > 1) {
            err |= carve(ar, &a->a2a_send, at, max_sz(B * Nl * 3 * HD, B * nr * huD));
            err |= carve(ar, &a->a2a_recv, at, max_sz(3 * B * nr * huD, B * Nl * HD));
            err |= carve(ar, &a->o_acc, at, B * nr * huD);
            err |= carve(ar, &a->q, at, B * nr * huD);
        }
        if (R > 1 && a->mesh->layout.rotate == DITD_RING_ALLGATHER) {
            err |= carve(ar, &a->kv, at, B * N * 2 * huD);
        } else {
            err |= carve(ar, &a->kv, at, B * mr * 2 * huD);
            if (R > 1)
                err |= carve(ar, &a->kv2, at, B * mr * 2 * huD);
        }
    }
    if (R > 1 || L > 0 || a->seg) {
        err |= carve(ar, &a->o_blk, at, B * nr * huD);
        err |= carve(ar, (void **)&a->lse_acc, DITD_DTYPE_F32, B * hu * nr);
        err |= carve(ar, (void **)&a->lse_blk, DITD_DTYPE_F32, B * hu * nr);
    }
    if (L > 0) {
        err |= carve(ar, &a->p_o, at, (size_t)R * B * L * huD);
        err |= carve(ar, (void **)&a->p_lse, DITD_DTYPE_F32, (size_t)R * B * hu * L);
        err |= carve(ar, &a->p_blk, at, B * L * huD);
        err |= carve(ar, (void **)&a->p_lse_blk, DITD_DTYPE_F32, B * hu * L);
        if (U > 1)
            err |= carve(ar, &a->p_gath, at, B * L * HD);
    }
    return err ? DITD_ENOMEM : 0;
}

/* The split: pure arithmetic on (layout, rank, N, H), the same on every rank. */
static int plan_split(ditd_cp_attention *a, const int *counts, const int *lead)
{
    int R = a->R, U = a->U, RU = R * U;
    int *ints = calloc((size_t)(7 * RU + 2 * R + 2 * U + 8), sizeof(int));
    if (!ints)
        return ditd_err_set(DITD_ENOMEM, "context-parallel plan");
    a->tok_cnt = ints;
    a->tok_off = a->tok_cnt + RU;
    a->cnt_a = a->tok_off + RU;
    a->dsp_a = a->cnt_a + RU;
    a->cnt_b = a->dsp_a + RU;
    a->dsp_b = a->cnt_b + RU;
    a->ring_cnt = a->dsp_b + RU;
    a->ring_off = a->ring_cnt + R;
    a->uh_cnt = a->ring_off + R;
    a->uh_off = a->uh_cnt + U;
    a->lead = a->uh_off + U;
    for (int s = 0; s < RU; s++) {
        if (counts) {
            a->tok_off[s] = s ? a->tok_off[s - 1] + a->tok_cnt[s - 1] : 0;
            a->tok_cnt[s] = counts[s];
        } else {
            ditd_split(a->N, RU, s, &a->tok_off[s], &a->tok_cnt[s]);
        }
    }
    a->max_ring = 0;
    for (int j = 0; j < R; j++) {
        a->ring_off[j] = a->tok_off[j * U];
        a->ring_cnt[j] = 0;
        for (int v = 0; v < U; v++)
            a->ring_cnt[j] += a->tok_cnt[j * U + v];
        if (a->ring_cnt[j] > a->max_ring)
            a->max_ring = a->ring_cnt[j];
    }
    for (int v = 0; v < U; v++)
        ditd_split(a->H, U, v, &a->uh_off[v], &a->uh_cnt[v]);
    int s = a->ring_rank * U + a->uly_rank;
    a->n_loc = a->tok_cnt[s];
    a->tok0 = a->tok_off[s];
    a->nr = a->ring_cnt[a->ring_rank];
    a->ring0 = a->ring_off[a->ring_rank];
    a->hu = a->uh_cnt[a->uly_rank];
    a->hu0 = a->uh_off[a->uly_rank];
    /* segments: only ulysses alone runs them segment-wise */
    a->seg = lead && R == 1 && U > 1;
    a->nf = 0;
    for (int v = 0; lead && v < RU; v++) {
        a->lead[v] = lead[v];
        if (v / U == a->ring_rank)
            a->nf += lead[v];
    }
    return 0;
}

/* The constructor behind both entry points: counts (R*U, or NULL for the
 * even split of N) already checked by the caller. */
static int cp_new(const ditd_backend_ops *ops, const ditd_mesh *mesh, int max_batch, int N,
                  const int *counts, const int *lead, int L, int H, int Dh,
                  ditd_cp_attention **out)
{
    ditd_cp_attention *a;
    int err;

    *out = NULL;
    if (max_batch <= 0 || N <= 0 || L < 0 || H <= 0 || Dh <= 0)
        return ditd_err_set(DITD_EINVAL, "attention of batch %d, %d tokens, %d prefix, %d heads of %d",
                            max_batch, N, L, H, Dh);
    if (mesh && mesh->size > 1) {
        ditd_layout one_tp = mesh->layout;
        one_tp.tp = 1; /* H is already the caller's tp share */
        if ((err = ditd_layout_check_attention(&one_tp, H, N)))
            return err;
    }
    if (!(a = calloc(1, sizeof *a)))
        return ditd_err_set(DITD_ENOMEM, "context-parallel attention");
    a->ops = ops;
    a->mesh = mesh && mesh->size > 1 && mesh->layout.ring * mesh->layout.ulysses > 1 ? mesh : NULL;
    a->R = a->mesh ? mesh->layout.ring : 1;
    a->U = a->mesh ? mesh->layout.ulysses : 1;
    a->ring_rank = a->mesh ? mesh->ring_rank : 0;
    a->uly_rank = a->mesh ? mesh->ulysses_rank : 0;
    a->max_batch = max_batch;
    a->N = N;
    a->L = L;
    a->H = H;
    a->Dh = Dh;
    ditd_arena_init_mem(&a->acts, ops->mem_alloc, ops->mem_free);
    if ((err = plan_split(a, a->mesh ? counts : NULL, a->mesh ? lead : NULL)) ||
        (err = carve_all(a)) ||
        (err = ditd_arena_commit(&a->acts, a->acts.peak_plan)) || (err = carve_all(a))) {
        ditd_cp_attention_free(a);
        return err;
    }
    *out = a;
    return 0;
}

int ditd_cp_attention_new(const ditd_backend_ops *ops, const ditd_mesh *mesh, int max_batch,
                          int N, int L, int H, int Dh, ditd_cp_attention **out)
{
    return cp_new(ops, mesh, max_batch, N, NULL, NULL, L, H, Dh, out);
}

int ditd_cp_attention_new_counts(const ditd_backend_ops *ops, const ditd_mesh *mesh,
                                 int max_batch, const int *counts, const int *lead, int H, int Dh,
                                 ditd_cp_attention **out)
{
    int RU = mesh && mesh->size > 1 ? mesh->layout.ring * mesh->layout.ulysses : 1;
    long N = 0;
    *out = NULL;
    if (!counts)
        return ditd_err_set(DITD_EINVAL, "context-parallel attention: no token counts");
    for (int s = 0; s < RU; s++) {
        if (counts[s] <= 0)
            return ditd_err_set(DITD_EINVAL,
                                "context-parallel attention: cp rank %d of %d would hold %d tokens "
                                "(every rank needs at least one)",
                                s, RU, counts[s]);
        if (lead && (lead[s] < 0 || lead[s] > counts[s]))
            return ditd_err_set(DITD_EINVAL,
                                "context-parallel attention: cp rank %d's leading segment of %d "
                                "tokens is outside 0..%d",
                                s, lead[s], counts[s]);
        N += counts[s];
    }
    if (N > 1 << 30)
        return ditd_err_set(DITD_EINVAL, "context-parallel attention: %ld tokens", N);
    return cp_new(ops, mesh, max_batch, (int)N, counts, lead, 0, H, Dh, out);
}

void ditd_cp_attention_free(ditd_cp_attention *a)
{
    if (!a)
        return;
    ditd_arena_free(&a->acts);
    free(a->tok_cnt);
    free(a);
}

size_t ditd_cp_attention_bytes(const ditd_cp_attention *a)
{
    return a->acts.size;
}

/* Strided 2-D copy of rows x cols elements on the backend's device. */
static void copy2d(const ditd_backend_ops *ops, void *dst, size_t ldd, const void *src,
                   size_t lds, size_t rows, size_t cols)
{
    ops->copy2d(dst, ldd, src, lds, rows, cols);
}

/* Where rank v's token i (of nv, its first fv the leading segment) sits in
 * this ring chunk's buffers under seg: the leading segments of all ranks
 * first, (B, nf) rows, then the rest, (B, nr - nf) rows; row index of
 * sample b's token, in rows of the buffer. */
static size_t seg_row(const ditd_cp_attention *a, int v, size_t b, size_t i, size_t Bz)
{
    size_t tf = 0, ti = 0, nf = (size_t)a->nf, ni = (size_t)a->nr - nf;
    int r = a->ring_rank, U = a->U;
    for (int u = 0; u < v; u++) {
        tf += (size_t)a->lead[r * U + u];
        ti += (size_t)(a->tok_cnt[r * U + u] - a->lead[r * U + u]);
    }
    size_t fv = (size_t)a->lead[r * U + v];
    return i < fv ? b * nf + tf + i : Bz * nf + b * ni + ti + (i - fv);
}

/* Ulysses alone with segments: the chunk's attention as one rank runs its
 * prefix path (run_one_rank), the leading segment as the prefix. q (B*nr,
 * H_u Dh), kv (B*nr, 2 H_u Dh) and o (B*nr, H_u Dh) in seg_row's layout. */
static void run_seg(ditd_cp_attention *a, int B, const void *q, const void *kv, void *o)
{
    const ditd_backend_ops *ops = a->ops;
    int hu = a->hu, Dh = a->Dh, NF = a->nf, NI = a->nr - a->nf;
    size_t huD = (size_t)hu * (size_t)Dh, Bz = (size_t)B;
    float scale = 1.0f / sqrtf((float)Dh);
    const void *qT = q, *qI = ditd_ptr_act(ops, q, Bz * (size_t)NF * huD);
    const void *kT = kv, *kI = ditd_ptr_act(ops, kv, Bz * (size_t)NF * 2 * huD);
    const void *vT = ditd_ptr_act(ops, kT, huD), *vI = ditd_ptr_act(ops, kI, huD);
    void *oT = o, *oI = ditd_ptr_act(ops, o, Bz * (size_t)NF * huD);

    ops->attention(qI, huD, kI, 2 * huD, vI, 2 * huD, oI, huD, a->lse_acc, B, NI, NI, hu, Dh,
                   scale);
    if (!NF)
        return;
    ops->attention(qI, huD, kT, 2 * huD, vT, 2 * huD, a->o_blk, huD, a->lse_blk, B, NI, NF, hu, Dh,
                   scale);
    ops->attention_merge(oI, huD, a->lse_acc, a->o_blk, huD, a->lse_blk, B, NI, hu, Dh);
    ops->attention(qT, huD, kI, 2 * huD, vI, 2 * huD, oT, huD, a->lse_acc, B, NF, NI, hu, Dh, scale);
    ops->attention(qT, huD, kT, 2 * huD, vT, 2 * huD, a->o_blk, huD, a->lse_blk, B, NF, NF, hu, Dh,
                   scale);
    ops->attention_merge(oT, huD, a->lse_acc, a->o_blk, huD, a->lse_blk, B, NF, hu, Dh);
}

/* One rank: the split tokens' attention is one call, as without a prefix;
 * the prefix adds one block to each kind of query. */
static void run_one_rank(ditd_cp_attention *a, int B, const void *q, const void *k,
                         const void *v, size_t ld, void *o, size_t ldo, const void *pq,
                         const void *pk, const void *pv, size_t pld, void *po, size_t pldo)
{
    const ditd_backend_ops *ops = a->ops;
    int N = a->N, L = a->L, H = a->H, Dh = a->Dh;
    size_t HD = (size_t)H * (size_t)Dh;
    float scale = 1.0f / sqrtf((float)Dh);

    ops->attention(q, ld, k, ld, v, ld, o, ldo, L ? a->lse_acc : NULL, B, N, N, H, Dh, scale);
    if (!L)
        return;
    /* split queries against the prefix keys, merged */
    ops->attention(q, ld, pk, pld, pv, pld, a->o_blk, HD, a->lse_blk, B, N, L, H, Dh, scale);
    ops->attention_merge(o, ldo, a->lse_acc, a->o_blk, HD, a->lse_blk, B, N, H, Dh);
    /* prefix queries: the split keys, then the prefix's own */
    ops->attention(pq, pld, k, ld, v, ld, po, pldo, a->p_lse, B, L, N, H, Dh, scale);
    ops->attention(pq, pld, pk, pld, pv, pld, a->p_blk, HD, a->p_lse_blk, B, L, L, H, Dh, scale);
    ops->attention_merge(po, pldo, a->p_lse, a->p_blk, HD, a->p_lse_blk, B, L, H, Dh);
}

int ditd_cp_attention_run(ditd_cp_attention *a, int B, const void *q_in, const void *k_in,
                          const void *v_in, size_t ld, void *o_out, size_t ldo, const void *pq,
                          const void *pk, const void *pv, size_t pld, void *po, size_t pldo)
{
    const ditd_backend_ops *ops = a->ops;
    const ditd_mesh *mesh = a->mesh;
    ditd_dtype at = ops->act_dtype;
    int U = a->U, R = a->R, r = a->ring_rank, Dh = a->Dh, L = a->L;
    size_t Bz = (size_t)B, nl = (size_t)a->n_loc, nr = (size_t)a->nr, Lz = (size_t)L;
    size_t HD = (size_t)a->H * (size_t)Dh, huD = (size_t)a->hu * (size_t)Dh;
    size_t hu0D = (size_t)a->hu0 * (size_t)Dh;
    float scale = 1.0f / sqrtf((float)Dh);
    int err;

    if (B <= 0 || B > a->max_batch)
        return ditd_err_set(DITD_EINVAL, "attention batch %d outside 1..%d", B, a->max_batch);
    if (L && (!pq || !pk || !pv || !po))
        return ditd_err_set(DITD_EINVAL, "attention planned with a %d-token prefix got none", L);
    if (R * U == 1) {
        run_one_rank(a, B, q_in, k_in, v_in, ld, o_out, ldo, pq, pk, pv, pld, po, pldo);
        return 0;
    }

    int p2p = R > 1 && mesh->layout.rotate == DITD_RING_P2P;
    const void *q;
    size_t ldq;
    void *o = U > 1 ? a->o_acc : o_out; /* (B, N_ring, H_u Dh) */
    size_t ldo_r = U > 1 ? huD : ldo;
    void *kv_own = R > 1 && !p2p ? ditd_ptr_act(ops, a->kv, Bz * (size_t)a->ring0 * 2 * huD) : a->kv;
    const void *src[3] = {q_in, k_in, v_in};

    if (U > 1) {
        /* to ulysses rank v: (B, 3, N_loc, H_v Dh), its heads of q, k, v */
        size_t sd = 0, rd = 0;
        for (int v = 0; v < U; v++) {
            size_t vD = (size_t)a->uh_cnt[v] * Dh, nv = (size_t)a->tok_cnt[r * U + v];
            for (size_t b = 0; b < Bz; b++)
                for (size_t j = 0; j < 3; j++)
                    copy2d(ops, ditd_ptr_act(ops, a->a2a_send, sd + (b * 3 + j) * nl * vD), vD,
                           ditd_ptr_act(ops, src[j], b * nl * ld + (size_t)a->uh_off[v] * Dh), ld,
                           nl, vD);
            a->cnt_a[v] = (int)(Bz * 3 * nl * vD);
            a->dsp_a[v] = (int)sd;
            sd += Bz * 3 * nl * vD;
            a->cnt_b[v] = (int)(Bz * 3 * nv * huD);
            a->dsp_b[v] = (int)rd;
            rd += Bz * 3 * nv * huD;
        }
        if ((err = ditd_comm_alltoallv(mesh->ulysses_comm, at, a->a2a_send, a->cnt_a, a->dsp_a,
                                       a->a2a_recv, a->cnt_b, a->dsp_b)))
            return err;
        /* from v: (B, 3, N_v, H_u Dh), v's tokens of this ring chunk */
        for (int v = 0; v < U; v++) {
            size_t nv = (size_t)a->tok_cnt[r * U + v];
            size_t off = (size_t)(a->tok_off[r * U + v] - a->ring0);
            for (size_t b = 0; a->seg && b < Bz; b++) { /* segment by segment */
                const void *s = ditd_ptr_act(ops, a->a2a_recv, (size_t)a->dsp_b[v] + b * 3 * nv * huD);
                size_t fv = (size_t)a->lead[r * U + v];
                size_t parts[2][2] = {{0, fv}, {fv, nv - fv}}; /* first row, rows */
                for (int p = 0; p < 2; p++) {
                    if (!parts[p][1])
                        continue;
                    size_t row = seg_row(a, v, b, parts[p][0], Bz), i0 = parts[p][0];
                    copy2d(ops, ditd_ptr_act(ops, a->q, row * huD), huD,
                           ditd_ptr_act(ops, s, i0 * huD), huD, parts[p][1], huD);
                    for (size_t j = 1; j < 3; j++)
                        copy2d(ops, ditd_ptr_act(ops, kv_own, row * 2 * huD + (j - 1) * huD),
                               2 * huD, ditd_ptr_act(ops, s, (j * nv + i0) * huD), huD,
                               parts[p][1], huD);
                }
            }
            for (size_t b = 0; !a->seg && b < Bz; b++) {
                const void *s = ditd_ptr_act(ops, a->a2a_recv, (size_t)a->dsp_b[v] + b * 3 * nv * huD);
                copy2d(ops, ditd_ptr_act(ops, a->q, (b * nr + off) * huD), huD, s, huD, nv, huD);
                for (size_t j = 1; j < 3; j++)
                    copy2d(ops, ditd_ptr_act(ops, kv_own, (b * nr + off) * 2 * huD + (j - 1) * huD),
                           2 * huD, ditd_ptr_act(ops, s, j * nv * huD), huD, nv, huD);
            }
        }
        q = a->q;
        ldq = huD;
    } else {
        /* ring only: q stays in place; this rank's K/V block, contiguous */
        for (size_t b = 0; b < Bz; b++)
            for (size_t j = 1; j < 3; j++)
                copy2d(ops, ditd_ptr_act(ops, kv_own, b * nr * 2 * huD + (j - 1) * huD), 2 * huD,
                       ditd_ptr_act(ops, src[j], b * nl * ld), ld, nl, HD);
        q = q_in;
        ldq = ld;
    }

    /* prefix queries against this ring chunk (before p2p moves the blocks):
     * ring rank r's partial at p_o[r], p_lse[r]; ring rank 0 adds the
     * prefix's own keys */
    void *pr_o = NULL;
    float *pr_lse = NULL;
    if (L) {
        pr_o = ditd_ptr_act(ops, a->p_o, (size_t)r * Bz * Lz * huD);
        pr_lse = a->p_lse + (size_t)r * Bz * (size_t)a->hu * Lz;
        ops->attention(ditd_ptr_act(ops, pq, hu0D), pld, kv_own, 2 * huD,
                       ditd_ptr_act(ops, kv_own, huD), 2 * huD, pr_o, huD, pr_lse, B, L, (int)nr,
                       a->hu, Dh, scale);
        if (r == 0) {
            ops->attention(ditd_ptr_act(ops, pq, hu0D), pld, ditd_ptr_act(ops, pk, hu0D), pld,
                           ditd_ptr_act(ops, pv, hu0D), pld, a->p_blk, huD, a->p_lse_blk, B, L, L,
                           a->hu, Dh, scale);
            ops->attention_merge(pr_o, huD, pr_lse, a->p_blk, huD, a->p_lse_blk, B, L, a->hu, Dh);
        }
    }

    if (a->seg) {
        run_seg(a, B, q, kv_own, o);
    } else if (R == 1) {
        ops->attention(q, ldq, kv_own, 2 * huD, ditd_ptr_act(ops, kv_own, huD), 2 * huD, o, ldo_r,
                       L ? a->lse_acc : NULL, B, (int)nr, (int)nr, a->hu, Dh, scale);
    } else {
        /* block j holds ring chunk j's K/V: (B, ring_cnt[j], 2 H_u Dh) */
        void *cur = kv_own, *nxt = a->kv2;
        ditd_comm_req req;
        if (!p2p) {
            for (int j = 0; j < R; j++) {
                a->cnt_a[j] = (int)(Bz * (size_t)a->ring_cnt[j] * 2 * huD);
                a->dsp_a[j] = (int)(Bz * (size_t)a->ring_off[j] * 2 * huD);
            }
            if ((err = ditd_comm_allgatherv(mesh->ring_comm, at, NULL, a->kv, a->cnt_a, a->dsp_a)))
                return err;
        }
        for (int i = 0; i < R; i++) {
            int j = (r + R - i) % R, jn = (j + R - 1) % R;
            const void *blk = p2p ? cur : ditd_ptr_act(ops, a->kv, (size_t)a->dsp_a[j]);
            if (p2p && i + 1 < R &&
                (err = ditd_comm_sendrecv_start(
                     mesh->ring_comm, at, cur, (int)(Bz * (size_t)a->ring_cnt[j] * 2 * huD),
                     (r + 1) % R, nxt, (int)(Bz * (size_t)a->ring_cnt[jn] * 2 * huD),
                     (r + R - 1) % R, &req)))
                return err;
            /* the block in hand, while the next one travels */
            ops->attention(q, ldq, blk, 2 * huD, ditd_ptr_act(ops, blk, huD), 2 * huD,
                           i ? a->o_blk : o, i ? huD : ldo_r, i ? a->lse_blk : a->lse_acc, B,
                           (int)nr, a->ring_cnt[j], a->hu, Dh, scale);
            if (i)
                ops->attention_merge(o, ldo_r, a->lse_acc, a->o_blk, huD, a->lse_blk, B, (int)nr,
                                     a->hu, Dh);
            if (p2p && i + 1 < R) {
                if ((err = ditd_comm_wait(mesh->ring_comm, &req)))
                    return err;
                void *t = cur;
                cur = nxt;
                nxt = t;
            }
        }
    }
    if (L) { /* the split queries' last block: the prefix keys, this rank's heads */
        ops->attention(q, ldq, ditd_ptr_act(ops, pk, hu0D), pld, ditd_ptr_act(ops, pv, hu0D), pld,
                       a->o_blk, huD, a->lse_blk, B, (int)nr, L, a->hu, Dh, scale);
        ops->attention_merge(o, ldo_r, a->lse_acc, a->o_blk, huD, a->lse_blk, B, (int)nr, a->hu,
                             Dh);
    }

    if (U > 1) {
        /* back: to v its tokens for this rank's heads, (B, N_v, H_u Dh) */
        size_t sd = 0, rd = 0;
        for (int v = 0; v < U; v++) {
            size_t vD = (size_t)a->uh_cnt[v] * Dh, nv = (size_t)a->tok_cnt[r * U + v];
            size_t off = (size_t)(a->tok_off[r * U + v] - a->ring0);
            size_t fv = a->seg ? (size_t)a->lead[r * U + v] : 0;
            for (size_t b = 0; b < Bz; b++) {
                if (!a->seg) {
                    copy2d(ops, ditd_ptr_act(ops, a->a2a_send, sd + b * nv * huD), huD,
                           ditd_ptr_act(ops, o, (b * nr + off) * huD), huD, nv, huD);
                    continue;
                }
                if (fv)
                    copy2d(ops, ditd_ptr_act(ops, a->a2a_send, sd + b * nv * huD), huD,
                           ditd_ptr_act(ops, o, seg_row(a, v, b, 0, Bz) * huD), huD, fv, huD);
                if (nv > fv)
                    copy2d(ops, ditd_ptr_act(ops, a->a2a_send, sd + (b * nv + fv) * huD), huD,
                           ditd_ptr_act(ops, o, seg_row(a, v, b, fv, Bz) * huD), huD, nv - fv,
                           huD);
            }
            a->cnt_a[v] = (int)(Bz * nv * huD);
            a->dsp_a[v] = (int)sd;
            sd += Bz * nv * huD;
            a->cnt_b[v] = (int)(Bz * nl * vD);
            a->dsp_b[v] = (int)rd;
            rd += Bz * nl * vD;
        }
        if ((err = ditd_comm_alltoallv(mesh->ulysses_comm, at, a->a2a_send, a->cnt_a, a->dsp_a,
                                       a->a2a_recv, a->cnt_b, a->dsp_b)))
            return err;
        for (int v = 0; v < U; v++) {
            size_t vD = (size_t)a->uh_cnt[v] * Dh;
            for (size_t b = 0; b < Bz; b++)
                copy2d(ops, ditd_ptr_act(ops, o_out, b * nl * ldo + (size_t)a->uh_off[v] * Dh), ldo,
                       ditd_ptr_act(ops, a->a2a_recv, (size_t)a->dsp_b[v] + b * nl * vD), vD, nl,
                       vD);
        }
    }
    if (!L)
        return 0;

    /* the prefix's output: ring partials gathered and merged in ring order
     * (the same bits everywhere), then the heads gathered over ulysses */
    size_t pblk = Bz * Lz * huD, lblk = Bz * (size_t)a->hu * Lz;
    if (R > 1) {
        for (int j = 0; j < R; j++) {
            a->cnt_a[j] = (int)pblk;
            a->dsp_a[j] = (int)((size_t)j * pblk);
            a->cnt_b[j] = (int)lblk;
            a->dsp_b[j] = (int)((size_t)j * lblk);
        }
        if ((err = ditd_comm_allgatherv(mesh->ring_comm, at, NULL, a->p_o, a->cnt_a, a->dsp_a)) ||
            (err = ditd_comm_allgatherv(mesh->ring_comm, DITD_DTYPE_F32, NULL, a->p_lse, a->cnt_b,
                                        a->dsp_b)))
            return err;
        for (int j = 1; j < R; j++)
            ops->attention_merge(a->p_o, huD, a->p_lse, ditd_ptr_act(ops, a->p_o, (size_t)j * pblk),
                                 huD, a->p_lse + (size_t)j * lblk, B, L, a->hu, Dh);
    }
    if (U == 1) {
        copy2d(ops, po, pldo, a->p_o, huD, Bz * Lz, huD);
        return 0;
    }
    for (int v = 0; v < U; v++) {
        a->cnt_b[v] = (int)(Bz * Lz * (size_t)a->uh_cnt[v] * Dh);
        a->dsp_b[v] = (int)(Bz * Lz * (size_t)a->uh_off[v] * Dh);
    }
    if ((err = ditd_comm_allgatherv(mesh->ulysses_comm, at, a->p_o, a->p_gath, a->cnt_b, a->dsp_b)))
        return err;
    for (int v = 0; v < U; v++)
        copy2d(ops, ditd_ptr_act(ops, po, (size_t)a->uh_off[v] * Dh), pldo,
               ditd_ptr_act(ops, a->p_gath, (size_t)a->dsp_b[v]), (size_t)a->uh_cnt[v] * Dh,
               Bz * Lz, (size_t)a->uh_cnt[v] * Dh);
    return 0;
}
