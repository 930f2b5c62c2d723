/* Bounded number parsing (server/common/parse.h). */
#include "server/common/parse.h"

#include <errno.h>
#include <stdlib.h>

#include "engine/core/error.h"

int ditd_parse_long(const char *s, long lo, long hi, const char *what, long *out)
{
    char *end;
    long v;
    errno = 0;
    v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        return ditd_err_set(DITD_EINVAL, "%s: \"%s\" is not an integer in %ld..%ld", what, s, lo, hi);
    *out = v;
    return 0;
}

int ditd_parse_double(const char *s, double lo, double hi, const char *what, double *out)
{
    char *end;
    double v;
    errno = 0;
    v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= lo && v <= hi))
        return ditd_err_set(DITD_EINVAL, "%s: \"%s\" is not a number in %g..%g", what, s, lo, hi);
    *out = v;
    return 0;
}
