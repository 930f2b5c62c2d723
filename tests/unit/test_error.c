/* The error table: names, messages and HTTP statuses, and the per-thread detail. */
#include "engine/core/error.h"

#include "tests/test_util.h"

int main(void)
{
    TU_CHECK(strcmp(ditd_err_name(DITD_EINVAL), "EINVAL") == 0, "%s", ditd_err_name(DITD_EINVAL));
    TU_CHECK(ditd_err_http_status(DITD_EINVAL) == 400, "%d", ditd_err_http_status(DITD_EINVAL));
    TU_CHECK(ditd_err_http_status(DITD_EBUSY) == 429, "%d", ditd_err_http_status(DITD_EBUSY));
    TU_CHECK(ditd_err_http_status(DITD_EUNAVAIL) == 503, "%d", ditd_err_http_status(DITD_EUNAVAIL));
    TU_CHECK(ditd_err_http_status(12345) == 500, "%d", ditd_err_http_status(12345));
    TU_CHECK(strcmp(ditd_strerror(DITD_OK), "success") == 0, "%s", ditd_strerror(DITD_OK));
    TU_CHECK(strcmp(ditd_strerror(-1), "unknown error") == 0, "%s", ditd_strerror(-1));
    /* every code has a distinct negative value and a name */
    for (int e = DITD__ERR_FIRST + 1; e < DITD__ERR_LAST; e++) {
        TU_CHECK(e < 0, "%d", e);
        TU_CHECK(strcmp(ditd_err_name(e), "EUNKNOWN") != 0, "code %d has no name", e);
    }
    TU_CHECK(ditd_err_set(DITD_EFORMAT, "file %s tensor %d", "a.safetensors", 3) == DITD_EFORMAT, "return");
    TU_CHECK(strcmp(ditd_err_detail(), "file a.safetensors tensor 3") == 0, "%s", ditd_err_detail());
    ditd_err_clear();
    TU_CHECK(ditd_err_detail()[0] == '\0', "%s", ditd_err_detail());
    return tu_exit();
}
