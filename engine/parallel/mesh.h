/* The mesh of a worker group (one replica): its G ranks split into
 *   cfg x ring x ulysses x tp        (outermost first; dp is the replicas)
 * with group rank g = ((c * R + r) * U + u) * T + t, so ulysses and tp
 * groups are contiguous ranks (they talk most) and ring peers are strided.
 * Every axis communicator, and the context-parallel one (ring x ulysses,
 * which gathers the sequence), is built once in ditd_mesh_new() and kept
 * for the life of the mesh: the "persistent mesh" of DESIGN.md.
 *
 * It also carries the group's control channel: the group leader (group
 * rank 0) makes every control decision and broadcasts it
 * (ditd_mesh_bcast*), so all ranks run the same collectives.
 *
 * What it is not: it knows no model. Whether a layout fits a model's
 * attention (heads, tokens) is ditd_layout_check_attention(), called when
 * the model loads.
 *
 * Worker-loop use (world = rank 0 front-end + D groups of G ranks):
 *     ditd_comm_mpi_init(&argc, &argv);
 *     ditd_comm_mpi_world(&world);
 *     int r = ditd_comm_rank(world);
 *     // front-end joins no group (color -1); workers by replica
 *     ditd_comm_split(world, r == 0 ? -1 : (r - 1) / G, r, &group);
 *     ditd_mesh_new(group, &layout, &mesh);      // steals nothing; group outlives mesh
 *     ditd_pipeline_new_group(&info, ops, max_samples, mesh, &pipe);
 *     loop: leader fills buf; ditd_mesh_bcast_var(mesh, buf, cap, &len);
 *           every rank decodes the batch and calls ditd_pipeline_generate()
 *           with the same arguments (cb on the leader, NULL elsewhere).
 * A world of one uses ditd_comm_self_new(&group) instead of MPI.
 */
#ifndef DITD_ENGINE_MESH_H
#define DITD_ENGINE_MESH_H

#include <stddef.h>

#include "engine/parallel/comm.h"

typedef enum ditd_ring_rotate {
    DITD_RING_ALLGATHER = 0, /* gather every K/V block, then loop (as Diffusers) */
    DITD_RING_P2P,           /* a send/recv ring, double-buffered, overlapped */
} ditd_ring_rotate;

const char *ditd_ring_rotate_name(ditd_ring_rotate r);
int ditd_ring_rotate_from_str(const char *s, ditd_ring_rotate *out);

/* Diffusers' ParallelConfig inside one replica. */
typedef struct ditd_layout {
    int cfg;                  /* 1 or 2: conditional / unconditional halves */
    int ring;                 /* ring_degree */
    int ulysses;              /* ulysses_degree */
    int tp;                   /* tp_degree */
    ditd_ring_rotate rotate;  /* rotate_method */
    int convert_to_fp32;      /* merge ring partials in fp32 (always so on the CPU) */
} ditd_layout;

/* One rank, nothing split. */
#define DITD_LAYOUT_SINGLE ((ditd_layout){1, 1, 1, 1, DITD_RING_ALLGATHER, 1})

/* Group size the layout needs: cfg * ring * ulysses * tp. */
int ditd_layout_size(const ditd_layout *l);

/* The layout alone against a group of group_size ranks: degrees >= 1, cfg
 * 1 or 2, the product equal to the group size. DITD_EINVAL with a detail
 * naming the numbers. Collective-free: every rank decides the same. */
int ditd_layout_check(const ditd_layout *l, int group_size);

/* The layout against an attention of `heads` heads over `tokens` split
 * tokens (any family; a prefix outside the split does not count): tp <=
 * heads; ulysses <= the smallest local head count (heads split over tp);
 * ring * ulysses <= tokens. Uneven splits are fine (heads and tokens are
 * split as evenly as they go); these are the only sizes that cannot work
 * (a rank with no head or no token). DITD_EINVAL naming the numbers. */
int ditd_layout_check_attention(const ditd_layout *l, int heads, int tokens);

typedef struct ditd_mesh {
    ditd_layout layout;
    ditd_comm *group;        /* borrowed: the whole replica */
    int rank, size;          /* in the group; rank 0 is the leader */
    int cfg_rank, ring_rank, ulysses_rank, tp_rank;
    ditd_comm *cfg_comm;     /* same (ring, ulysses, tp) */
    ditd_comm *ring_comm;    /* same (cfg, ulysses, tp), ordered by ring rank */
    ditd_comm *ulysses_comm; /* same (cfg, ring, tp) */
    ditd_comm *tp_comm;      /* same (cfg, ring, ulysses) */
    ditd_comm *cp_comm;      /* same (cfg, tp): ring x ulysses, rank r * U + u */
    ditd_comm *dev_group;    /* owned: NCCL over the group after ditd_mesh_use_nccl (the
                              * axis comms are its splits), else NULL */
} ditd_mesh;

/* Checks the layout against the group (before any collective: on a refusal
 * every rank returns the same DITD_EINVAL and nothing hangs), then splits
 * the axis communicators. Collective over `group`, which is borrowed and
 * must outlive the mesh. *out is owned: ditd_mesh_free(). */
int ditd_mesh_new(ditd_comm *group, const ditd_layout *l, ditd_mesh **out);
void ditd_mesh_free(ditd_mesh *m);

/* For a group whose activations live on GPUs (the CUDA backend): replaces
 * the axis communicators (cfg, ring, ulysses, tp, cp) by NCCL ones, made
 * once here: one NCCL communicator over the group, bootstrapped over the
 * group's MPI comm (ncclGetUniqueId + broadcast), then split per axis
 * (ncclCommSplit), non-blocking, each call watched against timeout_ms
 * (<= 0: 60 s; see ditd_comm_nccl_new). The group itself (the control
 * channel, host bytes) stays MPI. Collective over the group; call it after
 * ditd_backend_open(DITD_DEVICE_CUDA) with ok = whether that worked: the
 * ranks first agree, so a rank without its GPU makes every rank return
 * DITD_EDEVICE instead of leaving the others in the bootstrap. On failure
 * the mesh keeps its MPI comms. A mesh of one: nothing to do (0).
 * DITD_EUNSUPPORTED in a build without NCCL. */
int ditd_mesh_use_nccl(ditd_mesh *m, int ok, int timeout_ms);

static inline int ditd_mesh_is_leader(const ditd_mesh *m) { return m->rank == 0; }

/* The axis communicators (ditd_coll stats are per communicator). */
typedef enum ditd_mesh_axis {
    DITD_AXIS_CFG = 0,
    DITD_AXIS_RING,
    DITD_AXIS_ULYSSES,
    DITD_AXIS_TP,
    DITD_AXIS_CP,
    DITD_AXIS_GROUP,
    DITD_AXIS_COUNT
} ditd_mesh_axis;

const char *ditd_mesh_axis_name(ditd_mesh_axis a);
int ditd_mesh_axis_from_str(const char *s, ditd_mesh_axis *out);
/* Borrowed. */
ditd_comm *ditd_mesh_comm(const ditd_mesh *m, ditd_mesh_axis a);
void ditd_mesh_stats_reset(ditd_mesh *m);

/* len bytes from the leader to every rank of the group (in place).
 * Collective: every rank calls it with the same len. */
int ditd_mesh_bcast(const ditd_mesh *m, void *buf, size_t len);

/* ditd_mesh_bcast for a message the group waits for while idle (the next
 * batch, a shutdown): waiting ranks nap nap_us between checks instead of
 * spinning (ditd_comm_bcast_lazy). Every rank calls this one for the
 * message, not ditd_mesh_bcast. */
int ditd_mesh_bcast_lazy(const ditd_mesh *m, void *buf, size_t len, int nap_us);

/* A message of variable length from the leader: the leader passes *len;
 * every rank gets it in buf (capacity cap) and *len. When the leader's
 * *len exceeds cap, every rank returns DITD_ERANGE (and the bytes are not
 * sent), so the group stays in step. */
int ditd_mesh_bcast_var(const ditd_mesh *m, void *buf, size_t cap, size_t *len);

/* The even split used everywhere: part i of `total` over `parts` has
 * total / parts elements, one more for the first total % parts parts. */
static inline void ditd_split(int total, int parts, int i, int *off, int *cnt)
{
    int q = total / parts, r = total % parts;
    *cnt = q + (i < r);
    *off = i * q + (i < r ? i : r);
}

#endif
