/* The backend registry: which ops table serves a device in this binary.
 * What it is not: the tables themselves (engine/backend/backend_cpu.c,
 * engine/backend/backend_cuda.c). */
#include "engine/backend/backend.h"

#include <stdio.h>
#include <stdlib.h>

#include "ditd_build_config.h"
#include "engine/core/error.h"

#if DITD_HAVE_CUDA
#include "engine/backend/backend_cuda.h"
#endif

int ditd_backend_check_head_dim(const ditd_backend_ops *ops, int head_dim, const char *what)
{
    if (head_dim >= 1 && head_dim <= ops->attn_max_head_dim)
        return 0;
    return ditd_err_set(DITD_EUNSUPPORTED,
                        "%s = %d: the %s backend's attention takes heads of 1..%d", what, head_dim,
                        ops->name, ops->attn_max_head_dim);
}

const ditd_backend_ops *ditd_backend_table(ditd_device d)
{
    switch (d) {
    case DITD_DEVICE_CPU: return &ditd_backend_cpu;
    case DITD_DEVICE_CUDA:
#if DITD_HAVE_CUDA
        return ditd_backend_cuda_table();
#else
        break;
#endif
    }
    ditd_err_set(DITD_EUNSUPPORTED, "backend \"%s\" is not built into this binary",
                 ditd_device_name(d));
    return NULL;
}

const ditd_backend_ops *ditd_backend_get(ditd_device d)
{
    switch (d) {
    case DITD_DEVICE_CPU: return &ditd_backend_cpu;
    case DITD_DEVICE_CUDA:
#if DITD_HAVE_CUDA
        /* NULL with the detail set when there is no usable GPU */
        return ditd_backend_cuda_get();
#else
        break;
#endif
    }
    ditd_err_set(DITD_EUNSUPPORTED, "backend \"%s\" is not built into this binary",
                 ditd_device_name(d));
    return NULL;
}

int ditd_backend_local_rank(void)
{
    const char *v = getenv("OMPI_COMM_WORLD_LOCAL_RANK");
    char *end;
    long r;
    if (!v || !*v)
        return 0;
    r = strtol(v, &end, 10);
    return *end || r < 0 || r > 1 << 20 ? 0 : (int)r;
}

int ditd_backend_check(ditd_device d)
{
    switch (d) {
    case DITD_DEVICE_CPU: return 0;
    case DITD_DEVICE_CUDA:
#if DITD_HAVE_CUDA
        if (ditd_backend_cuda_available())
            return 0;
        return ditd_err_set(DITD_EDEVICE, "--device cuda: no CUDA device is visible to this process "
                                          "(driver, CUDA_VISIBLE_DEVICES)");
#else
        break;
#endif
    }
    return ditd_err_set(DITD_EUNSUPPORTED, "--device %s: this ditd was built without the %s backend "
                                           "(meson -Dcuda=enabled, with nvcc)",
                        ditd_device_name(d), ditd_device_name(d));
}

const ditd_backend_ops *ditd_backend_open(ditd_device d)
{
    if (d == DITD_DEVICE_CPU) /* the callers log ditd_backend_cpu_gemm_info() their way */
        return &ditd_backend_cpu;
    if (ditd_backend_check(d))
        return NULL;
#if DITD_HAVE_CUDA
    if (ditd_backend_cuda_select(ditd_backend_local_rank()) < 0)
        return NULL;
#endif
    const ditd_backend_ops *ops = ditd_backend_get(d);
    if (!ops) {
        char detail[512];
        snprintf(detail, sizeof detail, "%s", ditd_err_detail());
        ditd_err_set(DITD_EDEVICE, "--device %s: %s", ditd_device_name(d), detail);
    }
    return ops;
}

int ditd_pack_linear(const ditd_backend_ops *ops, void *w, int N, int K)
{
    return ops->pack_linear ? ops->pack_linear(w, N, K) : 0;
}
