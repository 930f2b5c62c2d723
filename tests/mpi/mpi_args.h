/* The command line the mpi test programs share: the layout flags
 * --cfg N --ring N --ulysses N --tp N --rotate allgather|p2p, and one
 * optional switch of the program's own (e.g. --refusals). */
#ifndef DITD_TESTS_MPI_ARGS_H
#define DITD_TESTS_MPI_ARGS_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/parallel/mesh.h"

/* Fills *l (and *flag_set when `flag`, which may be NULL, is given); 0, or
 * the exit status 2 with the argument named on stderr. */
static inline int tm_parse_layout(int argc, char **argv, ditd_layout *l, const char *flag,
                                  int *flag_set)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : "";
        if (strcmp(a, "--cfg") == 0) l->cfg = atoi(v), i++;
        else if (strcmp(a, "--ring") == 0) l->ring = atoi(v), i++;
        else if (strcmp(a, "--ulysses") == 0) l->ulysses = atoi(v), i++;
        else if (strcmp(a, "--tp") == 0) l->tp = atoi(v), i++;
        else if (strcmp(a, "--rotate") == 0) {
            if (ditd_ring_rotate_from_str(v, &l->rotate)) {
                fprintf(stderr, "--rotate %s: not allgather or p2p\n", v);
                return 2;
            }
            i++;
        } else if (flag && strcmp(a, flag) == 0) {
            *flag_set = 1;
        } else {
            fprintf(stderr, "unknown argument %s\n", a);
            return 2;
        }
    }
    return 0;
}

#endif
