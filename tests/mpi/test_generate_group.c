/* `mpirun -np G ditd generate` with layout flags writes, from the leader,
 * the latents one rank writes (relative error <= 1e-4), and a layout that
 * does not fit the world is refused with its numbers and exit status 2.
 *   test_generate_group DITD MPIRUN */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "engine/io/npy.h"
#include "tests/test_util.h"

static int run(const char *cmd)
{
    printf("$ %s\n", cmd);
    fflush(stdout);
    int rc = system(cmd);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

static float *load(const char *path, size_t *n)
{
    int nd;
    int64_t shape[8];
    float *x = NULL;
    if (ditd_npy_read_f32(path, 8, &nd, shape, &x)) {
        fprintf(stderr, "%s: %s\n", path, ditd_err_detail());
        return NULL;
    }
    *n = 1;
    for (int i = 0; i < nd; i++)
        *n *= (size_t)shape[i];
    return x;
}

int main(int argc, char **argv)
{
    char cmd[8192], model[4096], ref[256], par[256], log[256];
    if (argc != 3) {
        fprintf(stderr, "usage: test_generate_group DITD MPIRUN\n");
        return 2;
    }
    const char *ditd = argv[1], *mpirun = argv[2];
    const char *tmp = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(model, sizeof model, "%s/models/tiny-p2-c4-sigma", tu_fixtures());
    snprintf(ref, sizeof ref, "%s/ditd-group-ref-%d.npy", tmp, (int)getpid());
    snprintf(par, sizeof par, "%s/ditd-group-par-%d.npy", tmp, (int)getpid());
    snprintf(log, sizeof log, "%s/ditd-group-log-%d.txt", tmp, (int)getpid());
    const char *common = "--class 2 --seed 5 --steps 5 --guidance 3 -n 2 -q --threads 1";

    snprintf(cmd, sizeof cmd, "%s generate --model %s %s --save-latents %s", ditd, model, common, ref);
    TU_CHECK(run(cmd) == 0, "single rank");
    snprintf(cmd, sizeof cmd,
             "%s --oversubscribe -np 4 %s generate --model %s %s --save-latents %s "
             "--cfg-degree 2 --ulysses-degree 2 --ring-rotate p2p",
             mpirun, ditd, model, common, par);
    TU_CHECK(run(cmd) == 0, "cfg 2 x ulysses 2");
    size_t na = 0, nb = 0;
    float *a = load(par, &na), *b = load(ref, &nb);
    TU_CHECK(a && b && na == nb, "both latents, same size (%zu, %zu)", na, nb);
    if (a && b && na == nb)
        TU_CLOSE("mpirun -np 4 ditd generate --cfg-degree 2 --ulysses-degree 2 vs one rank", a, b,
                 na, 1e-4);
    free(a);
    free(b);

    /* refused: 3 ranks for a layout of 2 */
    snprintf(cmd, sizeof cmd,
             "%s --oversubscribe -np 3 %s generate --model %s %s --save-latents %s "
             "--ring-degree 2 2>%s",
             mpirun, ditd, model, common, par, log);
    int rc = run(cmd);
    TU_CHECK(rc != 0, "refused layout exits non-zero (%d)", rc);
    FILE *f = fopen(log, "r");
    char text[8192] = "";
    if (f) {
        size_t k = fread(text, 1, sizeof text - 1, f);
        text[k] = 0;
        fclose(f);
    }
    TU_CHECK(strstr(text, "= 2 ranks, the group has 3") != NULL, "message names the numbers: %s",
             text);
    remove(ref);
    remove(par);
    remove(log);
    return tu_exit();
}
