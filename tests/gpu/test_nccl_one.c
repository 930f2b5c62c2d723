/* GPU: the NCCL transport (engine/parallel/comm_nccl.c) on one GPU, as a
 * communicator of one rank bootstrapped over the "self" transport (no MPI,
 * no mpirun). One device cannot hold two ranks of a NCCL communicator, so
 * this is what one GPU can check of it:
 *   - the non-blocking init (ncclCommInitRankConfig polled to the end), its
 *     splits (a child, a split of the child, a rank that joins none) and
 *     ncclCommFinalize at free, each within seconds;
 *   - every collective through the public wrappers on device buffers, bf16
 *     and f32: all-to-all, all-gather (given and in place), all-reduce,
 *     broadcast, send/recv to self, barrier; each result downloaded and
 *     compared bit for bit, and each ordered after the compute-stream op
 *     that wrote its input (an add queued just before it);
 *   - fail-stop: a send/recv to a rank that does not exist, handed to the
 *     transport below the wrappers' checks, makes NCCL fail; the comm is
 *     aborted and so is its sibling split (one family), whose next call is
 *     refused and whose free does not wait out the deadline.
 * Exits 77 without a GPU. */
#include <cuda_runtime_api.h>
#include <stdint.h>
#include <time.h>

#include "engine/backend/backend.h"
#include "engine/backend/backend_cuda.h"
#include "engine/parallel/comm.h"
#include "tests/test_util.h"

#define N 4099 /* odd: no size happens to be a multiple of anything */

static const ditd_backend_ops *G;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void fill(float *h, size_t n, float base)
{
    for (size_t i = 0; i < n; i++)
        h[i] = base + (float)((i * 37) % 101) / 8.0f; /* exact in bf16 */
}

/* The device buffer's n values equal want's, bit for bit. */
static void same(const char *what, const void *d, const float *want, size_t n)
{
    float *got = malloc(n * sizeof *got);
    size_t bad = n;
    G->download(got, d, n);
    TU_OK(G->status());
    for (size_t i = 0; i < n && bad == n; i++)
        if (memcmp(&got[i], &want[i], sizeof got[i]))
            bad = i;
    TU_CHECK(bad == n, "%s: element %zu is %g, want %g", what, bad, bad < n ? got[bad] : 0.0,
             bad < n ? want[bad] : 0.0);
    if (bad == n)
        printf("ok   %s\n", what);
    free(got);
}

/* Every collective of c on bf16 device buffers; each input is written by an
 * add on the compute stream just before (the transport must wait for it). */
static void collectives(ditd_comm *c, const char *name)
{
    char what[160];
    float *h = malloc(N * sizeof *h), *one = malloc(N * sizeof *one), *want = malloc(N * sizeof *want);
    void *a = NULL, *b = NULL, *o = NULL;
    fill(h, N, 1.0f);
    for (size_t i = 0; i < N; i++) {
        one[i] = 1.0f;
        want[i] = h[i] + 1.0f;
    }
    TU_OK(G->mem_alloc(&a, N * 2));
    TU_OK(G->mem_alloc(&b, 2 * N * 2));
    TU_OK(G->mem_alloc(&o, N * 2));
    if (!a || !b || !o)
        goto done;
    G->upload(o, one, N);

    /* all-to-all: one block to self, at an offset */
    int cnt[1] = {N}, dsp0[1] = {0}, dspN[1] = {N};
    G->upload(a, h, N);
    G->add(a, o, N);
    TU_OK(ditd_comm_alltoallv(c, DITD_DTYPE_BF16, a, cnt, dsp0, b, cnt, dspN));
    snprintf(what, sizeof what, "%s: all-to-all (after an add on the compute stream)", name);
    same(what, ditd_ptr_act(G, b, N), want, N);

    /* all-gather, given and in place */
    G->upload(a, h, N);
    G->add(a, o, N);
    TU_OK(ditd_comm_allgatherv(c, DITD_DTYPE_BF16, a, b, cnt, dsp0));
    snprintf(what, sizeof what, "%s: all-gather", name);
    same(what, b, want, N);
    G->add(b, o, N);
    TU_OK(ditd_comm_allgatherv(c, DITD_DTYPE_BF16, NULL, b, cnt, dsp0));
    for (size_t i = 0; i < N; i++)
        want[i] += 1.0f;
    snprintf(what, sizeof what, "%s: all-gather in place", name);
    same(what, b, want, N);

    /* all-reduce of one rank: the sum is the value */
    G->upload(a, h, N);
    G->add(a, o, N);
    TU_OK(ditd_comm_allreduce_sum(c, DITD_DTYPE_BF16, a, N));
    for (size_t i = 0; i < N; i++)
        want[i] = h[i] + 1.0f;
    snprintf(what, sizeof what, "%s: all-reduce (bf16)", name);
    same(what, a, want, N);

    /* broadcast from rank 0 (bytes) */
    G->add(a, o, N);
    TU_OK(ditd_comm_bcast(c, a, N * 2, 0));
    for (size_t i = 0; i < N; i++)
        want[i] += 1.0f;
    snprintf(what, sizeof what, "%s: broadcast", name);
    same(what, a, want, N);

    /* send/recv to self, the wait after another op queued in between */
    ditd_comm_req req;
    G->upload(b, one, N);
    TU_OK(ditd_comm_sendrecv_start(c, DITD_DTYPE_BF16, a, N, 0, b, N, 0, &req));
    G->add(o, o, N); /* overlapped work on the compute stream */
    TU_OK(ditd_comm_wait(c, &req));
    snprintf(what, sizeof what, "%s: send/recv to self", name);
    same(what, b, want, N);
    TU_OK(ditd_comm_barrier(c));

    const ditd_comm_stat *st = ditd_comm_stats(c);
    TU_CHECK(st[DITD_COLL_ALLTOALLV].calls == 1 && st[DITD_COLL_ALLGATHERV].calls == 2 &&
                 st[DITD_COLL_ALLREDUCE].calls == 1 && st[DITD_COLL_BCAST].calls == 1 &&
                 st[DITD_COLL_SENDRECV].calls == 1,
             "%s: statistics count every call", name);
done:
    if (a)
        G->mem_free(a, 0);
    if (b)
        G->mem_free(b, 0);
    if (o)
        G->mem_free(o, 0);
    free(h), free(one), free(want);
}

/* f32 all-reduce (the ring's LSE travels in f32) on a cudaMalloc buffer. */
static void allreduce_f32(ditd_comm *c)
{
    float h[N], back[N], *d = NULL;
    cudaStream_t s = (cudaStream_t)ditd_backend_cuda_compute_stream();
    fill(h, N, -3.0f);
    TU_CHECK(cudaMalloc((void **)&d, sizeof h) == cudaSuccess, "cudaMalloc");
    if (!d)
        return;
    TU_CHECK(cudaMemcpyAsync(d, h, sizeof h, cudaMemcpyHostToDevice, s) == cudaSuccess, "upload");
    TU_OK(ditd_comm_allreduce_sum(c, DITD_DTYPE_F32, d, N));
    TU_CHECK(cudaMemcpyAsync(back, d, sizeof h, cudaMemcpyDeviceToHost, s) == cudaSuccess &&
                 cudaStreamSynchronize(s) == cudaSuccess,
             "download");
    TU_CHECK(!memcmp(back, h, sizeof h), "all-reduce (f32) of one rank changed the values");
    printf("%s all-reduce (f32)\n", memcmp(back, h, sizeof h) ? "FAIL" : "ok  ");
    cudaFree(d);
}

int main(void)
{
    ditd_comm *self = NULL, *root = NULL, *child = NULL, *grand = NULL, *none = NULL;
    ditd_comm *sib_a = NULL, *sib_b = NULL;
    double t;
    if (!ditd_backend_cuda_available()) {
        printf("no CUDA device: skipped\n");
        return 77;
    }
    G = ditd_backend_get(DITD_DEVICE_CUDA);
    TU_CHECK(G != NULL, "CUDA backend: %s", ditd_err_detail());
    if (!G)
        return tu_exit();
    TU_OK(ditd_comm_self_new(&self));

    /* non-blocking init over the self transport's "broadcast" of the id */
    t = now_s();
    TU_OK(ditd_comm_nccl_new_opts(self, -1, 20000, &root));
    printf("init: %.3f s\n", now_s() - t);
    if (!root)
        goto out;
    TU_CHECK(ditd_comm_rank(root) == 0 && ditd_comm_size(root) == 1 &&
                 !strcmp(root->ops->name, "nccl"),
             "root: rank %d of %d, %s", ditd_comm_rank(root), ditd_comm_size(root), root->ops->name);

    /* splits: a child, a split of the child, a rank that joins none */
    t = now_s();
    TU_OK(ditd_comm_split(root, 3, 0, &child));
    TU_OK(child ? ditd_comm_split(child, 0, 5, &grand) : DITD_EINVAL);
    TU_OK(ditd_comm_split(root, -1, 0, &none));
    printf("splits: %.3f s\n", now_s() - t);
    TU_CHECK(none == NULL, "color < 0 gives no comm");
    TU_CHECK(child && grand && ditd_comm_size(child) == 1 && ditd_comm_size(grand) == 1,
             "splits of one rank");

    collectives(root, "root");
    if (child)
        collectives(child, "split");
    if (grand)
        collectives(grand, "split of a split");
    allreduce_f32(root);

    /* finalize, children first (as ditd_mesh_free) */
    t = now_s();
    ditd_comm_free(grand);
    ditd_comm_free(child);
    grand = child = NULL;
    double fin = now_s() - t;
    printf("finalize of two splits: %.3f s\n", fin);
    TU_CHECK(fin < 5.0, "finalize took %.1f s", fin);

    /* fail-stop: an invalid peer below the wrappers' checks */
    TU_OK(ditd_comm_split(root, 0, 0, &sib_a));
    TU_OK(ditd_comm_split(root, 0, 0, &sib_b));
    if (sib_a && sib_b) {
        void *buf = NULL;
        ditd_comm_req req = {0};
        TU_OK(G->mem_alloc(&buf, 64));
        int rc = sib_a->ops->sendrecv_start(sib_a, DITD_DTYPE_BF16, buf, 8, 1, buf, 0, 0, &req);
        if (!rc)
            rc = sib_a->ops->wait(sib_a, &req);
        TU_CHECK(rc == DITD_ECOMM, "send to rank 1 of 1: got %s (%s), want DITD_ECOMM",
                 ditd_err_name(rc), ditd_err_detail());
        printf("invalid peer: %s: %s\n", ditd_err_name(rc), ditd_err_detail());
        TU_CHECK_ERR(ditd_comm_allreduce_sum(sib_b, DITD_DTYPE_BF16, buf, 8), DITD_ECOMM,
                     "aborted after an earlier failure");
        TU_CHECK_ERR(ditd_comm_barrier(root), DITD_ECOMM, "aborted");
        t = now_s();
        ditd_comm_free(sib_a);
        ditd_comm_free(sib_b);
        sib_a = sib_b = NULL;
        double ft = now_s() - t;
        printf("free after the abort: %.3f s (deadline 20 s)\n", ft);
        TU_CHECK(ft < 2.0, "free of aborted comms took %.1f s: it waited for the deadline", ft);
        G->mem_free(buf, 0);
        TU_OK(G->status());
    }
out:
    ditd_comm_free(sib_a);
    ditd_comm_free(sib_b);
    ditd_comm_free(grand);
    ditd_comm_free(child);
    t = now_s();
    ditd_comm_free(root);
    printf("free of the root: %.3f s\n", now_s() - t);
    ditd_comm_free(self);
    ditd_backend_cuda_shutdown();
    return tu_exit();
}
