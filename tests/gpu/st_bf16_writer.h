/* A bf16 safetensors writer for the GPU tests and benchmarks: the header
 * (names, shapes, offsets), then each tensor's values asked of a callback in
 * f32 and stored rounded to nearest even, as torch's .to(torch.bfloat16).
 * Header-only (static functions), for tests/gpu only; the engine reads
 * safetensors and never writes them. */
#ifndef DITD_TESTS_GPU_ST_BF16_WRITER_H
#define DITD_TESTS_GPU_ST_BF16_WRITER_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct st_entry {
    char name[160];
    int nd;            /* 1 or 2 */
    int64_t shape[2];
} st_entry;

/* Fills buf with the numel f32 values of entry i; 0, or nonzero to stop. */
typedef int (*st_fill_fn)(size_t i, const st_entry *e, float *buf, size_t numel, void *ud);

static size_t st_numel(const st_entry *e)
{
    size_t n = 1;
    for (int d = 0; d < e->nd; d++)
        n *= (size_t)e->shape[d];
    return n;
}

static uint16_t st_round_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* Writes the n entries to path; 0, or -1 with a line on stderr. */
static int st_write_bf16(const char *path, const st_entry *e, size_t n, st_fill_fn fill, void *ud)
{
    size_t cap = 4096, len = 0, off = 0, maxn = 1;
    char *hdr = malloc(cap);
    float *buf = NULL;
    uint16_t *b16 = NULL;
    FILE *f = NULL;
    int rc = -1;
    if (!hdr)
        goto out;
    len += (size_t)snprintf(hdr, cap, "{");
    for (size_t i = 0; i < n; i++) {
        size_t numel = st_numel(&e[i]);
        if (numel > maxn)
            maxn = numel;
        while (cap - len < strlen(e[i].name) + 200) {
            char *h = realloc(hdr, cap *= 2);
            if (!h)
                goto out;
            hdr = h;
        }
        len += (size_t)snprintf(hdr + len, cap - len, "%s\"%s\":{\"dtype\":\"BF16\",\"shape\":[",
                                i ? "," : "", e[i].name);
        for (int d = 0; d < e[i].nd; d++)
            len += (size_t)snprintf(hdr + len, cap - len, "%s%lld", d ? "," : "",
                                    (long long)e[i].shape[d]);
        len += (size_t)snprintf(hdr + len, cap - len, "],\"data_offsets\":[%zu,%zu]}", off,
                                off + 2 * numel);
        off += 2 * numel;
    }
    if (cap - len < 2)
        goto out;
    len += (size_t)snprintf(hdr + len, cap - len, "}");
    uint64_t hl = len;
    if (!(buf = malloc(maxn * sizeof *buf)) || !(b16 = malloc(maxn * sizeof *b16)) ||
        !(f = fopen(path, "wb")) || fwrite(&hl, 8, 1, f) != 1 || fwrite(hdr, 1, len, f) != len)
        goto out;
    for (size_t i = 0; i < n; i++) {
        size_t numel = st_numel(&e[i]);
        if (fill(i, &e[i], buf, numel, ud))
            goto out;
        for (size_t j = 0; j < numel; j++)
            b16[j] = st_round_bf16(buf[j]);
        if (fwrite(b16, 2, numel, f) != numel)
            goto out;
    }
    rc = 0;
out:
    if (f && fclose(f))
        rc = -1;
    if (rc)
        fprintf(stderr, "st_write_bf16: cannot write %s\n", path);
    free(hdr);
    free(buf);
    free(b16);
    return rc;
}

#endif
