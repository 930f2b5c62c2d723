/* The worker group's mesh: layout checks, axis communicators, the leader's
 * broadcast channel. */
#include "engine/parallel/mesh.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ditd_build_config.h"
#include "engine/core/error.h"

const char *ditd_ring_rotate_name(ditd_ring_rotate r)
{
    switch (r) {
    case DITD_RING_ALLGATHER: return "allgather";
    case DITD_RING_P2P: return "p2p";
    }
    return "unknown";
}

int ditd_ring_rotate_from_str(const char *s, ditd_ring_rotate *out)
{
    if (strcmp(s, "allgather") == 0) {
        *out = DITD_RING_ALLGATHER;
        return 0;
    }
    if (strcmp(s, "p2p") == 0) {
        *out = DITD_RING_P2P;
        return 0;
    }
    return ditd_err_set(DITD_EINVAL, "ring rotate method \"%s\" (allgather, p2p)", s);
}

static const char *const axis_names[DITD_AXIS_COUNT] = {"cfg", "ring", "ulysses", "tp", "cp",
                                                        "group"};

const char *ditd_mesh_axis_name(ditd_mesh_axis a)
{
    return (unsigned)a < DITD_AXIS_COUNT ? axis_names[a] : "unknown";
}

int ditd_mesh_axis_from_str(const char *s, ditd_mesh_axis *out)
{
    for (int a = 0; a < DITD_AXIS_COUNT; a++) {
        if (strcmp(s, axis_names[a]) == 0) {
            *out = (ditd_mesh_axis)a;
            return 0;
        }
    }
    return ditd_err_set(DITD_EINVAL, "mesh axis \"%s\" (cfg, ring, ulysses, tp, cp, group)", s);
}

int ditd_layout_size(const ditd_layout *l)
{
    return l->cfg * l->ring * l->ulysses * l->tp;
}

int ditd_layout_check(const ditd_layout *l, int group_size)
{
    if (l->cfg < 1 || l->ring < 1 || l->ulysses < 1 || l->tp < 1)
        return ditd_err_set(DITD_EINVAL,
                            "degrees must be >= 1: cfg %d, ring %d, ulysses %d, tp %d", l->cfg,
                            l->ring, l->ulysses, l->tp);
    if (l->cfg > 2)
        return ditd_err_set(DITD_EINVAL,
                            "cfg degree %d: classifier-free guidance has 2 halves (1 or 2)",
                            l->cfg);
    if (l->rotate != DITD_RING_ALLGATHER && l->rotate != DITD_RING_P2P)
        return ditd_err_set(DITD_EINVAL, "ring rotate method %d", (int)l->rotate);
    long need = (long)l->cfg * l->ring * l->ulysses * l->tp;
    if (need != group_size)
        return ditd_err_set(DITD_EINVAL,
                            "the layout needs cfg %d x ring %d x ulysses %d x tp %d = %ld ranks, "
                            "the group has %d",
                            l->cfg, l->ring, l->ulysses, l->tp, need, group_size);
    return 0;
}

int ditd_layout_check_attention(const ditd_layout *l, int heads, int N)
{
    int H = heads;
    if (l->tp > H)
        return ditd_err_set(DITD_EINVAL, "tp degree %d > %d attention heads: a rank would hold no head",
                            l->tp, H);
    /* heads split over tp as evenly as they go; the smallest share is H / T */
    int h_min = H / l->tp;
    if (l->ulysses > h_min)
        return ditd_err_set(DITD_EINVAL,
                            "ulysses degree %d > %d local heads (%d heads / tp %d): a rank would "
                            "hold no head",
                            l->ulysses, h_min, H, l->tp);
    if ((long)l->ring * l->ulysses > N)
        return ditd_err_set(DITD_EINVAL,
                            "ring %d x ulysses %d = %d sequence shards > %d tokens", l->ring,
                            l->ulysses, l->ring * l->ulysses, N);
    return 0;
}

int ditd_mesh_new(ditd_comm *group, const ditd_layout *l, ditd_mesh **out)
{
    ditd_mesh *m;
    int err, G = ditd_comm_size(group);

    *out = NULL;
    if ((err = ditd_layout_check(l, G)))
        return err;
    m = calloc(1, sizeof *m);
    if (!m)
        return ditd_err_set(DITD_ENOMEM, "mesh");
    m->layout = *l;
    m->group = group;
    m->rank = ditd_comm_rank(group);
    m->size = G;
    int R = l->ring, U = l->ulysses, T = l->tp, g = m->rank;
    m->tp_rank = g % T;
    m->ulysses_rank = g / T % U;
    m->ring_rank = g / (T * U) % R;
    m->cfg_rank = g / (T * U * R);
    int c = m->cfg_rank, r = m->ring_rank, u = m->ulysses_rank, t = m->tp_rank;
    /* every rank makes every split, in the same order (they are collective) */
    if ((err = ditd_comm_split(group, (r * U + u) * T + t, c, &m->cfg_comm)) ||
        (err = ditd_comm_split(group, (c * U + u) * T + t, r, &m->ring_comm)) ||
        (err = ditd_comm_split(group, (c * R + r) * T + t, u, &m->ulysses_comm)) ||
        (err = ditd_comm_split(group, (c * R + r) * U + u, t, &m->tp_comm)) ||
        (err = ditd_comm_split(group, c * T + t, r * U + u, &m->cp_comm))) {
        ditd_mesh_free(m);
        return err;
    }
    *out = m;
    return 0;
}

void ditd_mesh_free(ditd_mesh *m)
{
    if (!m)
        return;
    ditd_comm_free(m->cfg_comm);
    ditd_comm_free(m->ring_comm);
    ditd_comm_free(m->ulysses_comm);
    ditd_comm_free(m->tp_comm);
    ditd_comm_free(m->cp_comm);
    ditd_comm_free(m->dev_group);
    free(m);
}

int ditd_mesh_use_nccl(ditd_mesh *m, int ok, int timeout_ms)
{
    float bad = ok ? 0.0f : 1.0f;
    int err;
    if (m->size == 1)
        return 0;
    if (m->dev_group)
        return ditd_err_set(DITD_EINVAL, "the mesh already uses NCCL");
    /* agree first (host MPI): nobody enters the bootstrap alone */
    if ((err = ditd_comm_allreduce_sum(m->group, DITD_DTYPE_F32, &bad, 1)))
        return err;
    if (bad > 0.5f)
        return ditd_err_set(DITD_EDEVICE, "%g of the group's %d ranks could not open their GPU",
                            (double)bad, m->size);
#if DITD_HAVE_NCCL
    ditd_comm *root = NULL, *ax[5] = {NULL, NULL, NULL, NULL, NULL};
    int R = m->layout.ring, U = m->layout.ulysses, T = m->layout.tp;
    int c = m->cfg_rank, r = m->ring_rank, u = m->ulysses_rank, t = m->tp_rank;
    if ((err = ditd_comm_nccl_new_opts(m->group, -1, timeout_ms, &root)))
        return err;
    /* the same colors and keys as ditd_mesh_new, over the same group ranks */
    if ((err = ditd_comm_split(root, (r * U + u) * T + t, c, &ax[0])) ||
        (err = ditd_comm_split(root, (c * U + u) * T + t, r, &ax[1])) ||
        (err = ditd_comm_split(root, (c * R + r) * T + t, u, &ax[2])) ||
        (err = ditd_comm_split(root, (c * R + r) * U + u, t, &ax[3])) ||
        (err = ditd_comm_split(root, c * T + t, r * U + u, &ax[4]))) {
        for (int i = 0; i < 5; i++)
            ditd_comm_free(ax[i]);
        ditd_comm_free(root);
        return err;
    }
    ditd_comm_free(m->cfg_comm);
    ditd_comm_free(m->ring_comm);
    ditd_comm_free(m->ulysses_comm);
    ditd_comm_free(m->tp_comm);
    ditd_comm_free(m->cp_comm);
    m->cfg_comm = ax[0];
    m->ring_comm = ax[1];
    m->ulysses_comm = ax[2];
    m->tp_comm = ax[3];
    m->cp_comm = ax[4];
    m->dev_group = root;
    return 0;
#else
    (void)timeout_ms;
    return ditd_err_set(DITD_EUNSUPPORTED,
                        "a multi-rank group on cuda needs NCCL, and this ditd was built without it");
#endif
}

ditd_comm *ditd_mesh_comm(const ditd_mesh *m, ditd_mesh_axis a)
{
    switch (a) {
    case DITD_AXIS_CFG: return m->cfg_comm;
    case DITD_AXIS_RING: return m->ring_comm;
    case DITD_AXIS_ULYSSES: return m->ulysses_comm;
    case DITD_AXIS_TP: return m->tp_comm;
    case DITD_AXIS_CP: return m->cp_comm;
    case DITD_AXIS_GROUP: return m->group;
    case DITD_AXIS_COUNT: break;
    }
    return NULL;
}

void ditd_mesh_stats_reset(ditd_mesh *m)
{
    for (int a = 0; a < DITD_AXIS_COUNT; a++)
        ditd_comm_stats_reset(ditd_mesh_comm(m, (ditd_mesh_axis)a));
}

int ditd_mesh_bcast(const ditd_mesh *m, void *buf, size_t len)
{
    if (m->size == 1)
        return 0;
    return ditd_comm_bcast(m->group, buf, len, 0);
}

int ditd_mesh_bcast_lazy(const ditd_mesh *m, void *buf, size_t len, int nap_us)
{
    if (m->size == 1)
        return 0;
    return ditd_comm_bcast_lazy(m->group, buf, len, 0, nap_us);
}

int ditd_mesh_bcast_var(const ditd_mesh *m, void *buf, size_t cap, size_t *len)
{
    uint64_t n = *len;
    int err;
    if (m->size > 1 && (err = ditd_comm_bcast(m->group, &n, sizeof n, 0)))
        return err;
    *len = (size_t)n;
    if (n > cap)
        return ditd_err_set(DITD_ERANGE, "group message of %llu bytes > buffer of %zu",
                            (unsigned long long)n, cap);
    return ditd_mesh_bcast(m, buf, (size_t)n);
}
