/* The backend registry: which ops table serves a device in this binary.
 * What it is not: the tables themselves (engine/backend_cpu.c,
 * engine/backend_cuda.c). */
#include "engine/backend.h"

#include "ditd_build_config.h"
#include "engine/error.h"

#if DITD_HAVE_CUDA
#include "engine/backend_cuda.h"
#endif

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
