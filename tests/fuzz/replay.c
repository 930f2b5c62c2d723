/* Corpus replay driver: runs a libFuzzer target's LLVMFuzzerTestOneInput
 * over every file named on the command line, descending into folders, so
 * the 'fuzz' test suite replays each corpus with the project's compiler
 * (and its sanitizers, under -Db_sanitize) on every run. A crash fails the
 * test; so does an empty corpus, which would test nothing.
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int run_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        perror(path);
        return -1;
    }
    uint8_t *buf = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (len == cap) {
            cap = cap ? 2 * cap : 4096;
            uint8_t *nb = realloc(buf, cap);
            if (!nb) {
                free(buf);
                fclose(f);
                return -1;
            }
            buf = nb;
        }
        size_t n = fread(buf + len, 1, cap - len, f);
        len += n;
        if (n == 0)
            break;
    }
    fclose(f);
    /* An exact-size copy, so ASan sees reads past the end of the input. */
    uint8_t *exact = malloc(len ? len : 1);
    if (!exact) {
        free(buf);
        return -1;
    }
    if (len)
        memcpy(exact, buf, len);
    free(buf);
    LLVMFuzzerTestOneInput(exact, len);
    free(exact);
    return 0;
}

static int run_path(const char *path, int *count)
{
    struct stat sb;
    if (stat(path, &sb) != 0) {
        perror(path);
        return -1;
    }
    if (!S_ISDIR(sb.st_mode)) {
        (*count)++;
        return run_file(path);
    }
    DIR *d = opendir(path);
    if (!d) {
        perror(path);
        return -1;
    }
    struct dirent *e;
    int rc = 0;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        size_t n = strlen(path) + strlen(e->d_name) + 2;
        char *p = malloc(n);
        if (!p) {
            rc = -1;
            break;
        }
        snprintf(p, n, "%s/%s", path, e->d_name);
        if (run_path(p, count) != 0)
            rc = -1;
        free(p);
    }
    closedir(d);
    return rc;
}

int main(int argc, char **argv)
{
    int count = 0, rc = 0;
    if (argc < 2) {
        fprintf(stderr, "usage: %s CORPUS_DIR_OR_FILE...\n", argv[0]);
        return 2;
    }
    for (int i = 1; i < argc; i++)
        if (run_path(argv[i], &count) != 0)
            rc = 1;
    printf("replayed %d inputs\n", count);
    if (count == 0) {
        fprintf(stderr, "no inputs: an empty corpus tests nothing\n");
        return 1;
    }
    return rc;
}
