/* libFuzzer target: sharded checkpoints. The input is the text of a
 * `model.safetensors.index.json` placed in a scratch folder beside three
 * fixed, valid shards (s1.safetensors: a, b; s2.safetensors: c;
 * sub/s3.safetensors: d); the folder is then opened as a model. This
 * exercises the weight-map checks, shard path validation ("..", absolute
 * paths, folders), shard de-duplication and cross-shard duplicate names.
 * The scratch folder lives in $TMPDIR and is removed at exit.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/core/error.h"
#include "engine/io/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char dir[512];

static const char *at(const char *rel)
{
    static char p[640];
    snprintf(p, sizeof p, "%s/%s", dir, rel);
    return p;
}

static void put(const char *rel, const char *header, size_t data_len)
{
    FILE *f = fopen(at(rel), "wb");
    if (!f)
        abort();
    uint64_t n = strlen(header);
    fwrite(&n, 8, 1, f);
    fwrite(header, 1, n, f);
    for (size_t i = 0; i < data_len; i++)
        fputc((int)(i * 37 % 251), f);
    if (fclose(f) != 0)
        abort();
}

static void cleanup(void)
{
    const char *files[] = { "s1.safetensors", "s2.safetensors", "sub/s3.safetensors",
                            "model.safetensors.index.json" };
    for (size_t i = 0; i < sizeof files / sizeof *files; i++)
        unlink(at(files[i]));
    rmdir(at("sub"));
    rmdir(dir);
}

static void setup(void)
{
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/ditd-fuzz-index-XXXXXX", tmp ? tmp : "/tmp");
    if (!mkdtemp(dir) || mkdir(at("sub"), 0755) != 0)
        abort();
    atexit(cleanup);
    put("s1.safetensors",
        "{\"a\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]},"
        "\"b\":{\"dtype\":\"F16\",\"shape\":[3],\"data_offsets\":[16,22]}}",
        22);
    put("s2.safetensors", "{\"c\":{\"dtype\":\"BF16\",\"shape\":[2,1],\"data_offsets\":[0,4]}}",
        4);
    put("sub/s3.safetensors",
        "{\"__metadata__\":{\"format\":\"pt\"},"
        "\"d\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[0,8]}}",
        8);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!dir[0])
        setup();
    FILE *f = fopen(at("model.safetensors.index.json"), "wb");
    if (!f)
        abort();
    if (size)
        fwrite(data, 1, size, f);
    if (fclose(f) != 0)
        abort();

    ditd_safetensors *st = NULL;
    int rc = ditd_safetensors_open(dir, &st);
    if (rc != 0) {
        if (st || ditd_err_detail()[0] == '\0')
            abort();
        return 0;
    }
    for (size_t i = 0; i < ditd_safetensors_count(st); i++) {
        const ditd_st_tensor *t = ditd_safetensors_at(st, i);
        float out[4];
        if (ditd_safetensors_find(st, t->name) != t)
            abort();
        if (ditd_safetensors_read_f32(st, t->name, t->ndim, t->shape, out) != 0)
            abort(); /* every shard tensor above is a readable float */
    }
    ditd_safetensors_free(st);
    return 0;
}
