/* The one replica open (engine/worker/replica.h) and the config cache it
 * reads through (engine/io/json_config.h), on the assembled tiny SD3 folder
 * (every component: model_index.json, scheduler, transformer, VAE, CLIP-L,
 * CLIP-G, T5):
 *   - what `ditd serve` does at start-up in one process (the front-end's
 *     model_info, then the worker's replica with its decode tail and text
 *     encoders), then a second replica: each component's config file is
 *     parsed once in all, and opened once (inotify counts the opens, so a
 *     reader that went around the cache is seen too);
 *   - a config file changed on disk is parsed again, once;
 *   - the two halves (begin: device and folder, no weight; load) and their
 *     refusals (load before begin, a missing folder, a dtype the device
 *     cannot keep). */
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "engine/core/error.h"
#include "engine/io/json_config.h"
#include "engine/worker/replica.h"
#include "tests/test_util.h"

#ifndef SD3_PIPELINE_DIR
#error "SD3_PIPELINE_DIR: the assembled folders (tests/fixtures/sd3_pipeline/assemble.py)"
#endif

static const char *const files[] = {
    "model_index.json",           "scheduler/scheduler_config.json", "transformer/config.json",
    "vae/config.json",            "text_encoder/config.json",        "text_encoder_2/config.json",
    "text_encoder_3/config.json",
};
#define N_FILES (int)(sizeof files / sizeof files[0])

static ditd_replica_opts worker_opts(const char *dir)
{
    ditd_replica_opts o = {
        .model_dir = dir,
        .device = DITD_DEVICE_CPU,
        .dtype = "f32",
        .max_samples = 2,
        .decode = DITD_REPLICA_DECODE,
        .text = 1,
        .text_rank = 0,
    };
    return o;
}

static void test_once(const char *dir)
{
    char path[1024];
    ditd_model_info front;
    ditd_replica r1, r2;
    ditd_replica_opts o = worker_opts(dir);
    int checked = 0;

    /* every open of each file, whoever opens it */
    int fd = inotify_init1(IN_NONBLOCK), wd[16], opens[16] = {0};
    TU_CHECK(fd >= 0, "inotify_init1");
    for (int i = 0; i < N_FILES; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        wd[i] = fd >= 0 ? inotify_add_watch(fd, path, IN_OPEN) : -1;
        TU_CHECK(wd[i] >= 0, "inotify_add_watch %s", path);
    }
    ditd_json_config_cache_clear();
    TU_OK(ditd_model_info_load(dir, &front)); /* the front-end's */
    TU_OK(ditd_replica_open(&o, &r1));        /* the worker's */
    TU_CHECK(r1.pipe && r1.li && !r1.lv && r1.penc, "replica parts: pipe %p li %p lv %p penc %p",
             (void *)r1.pipe, (void *)r1.li, (void *)r1.lv, (void *)r1.penc);
    TU_OK(ditd_replica_open(&o, &r2)); /* a second replica in the same process */
    for (int i = 0; i < N_FILES; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        unsigned n = ditd_json_config_parses(path);
        TU_CHECK(n == 1, "%s parsed %u times (once asked)", files[i], n);
        checked++;
    }
    TU_CHECK(checked == N_FILES && N_FILES >= 7, "%d config files checked", checked);
    char evbuf[8192] __attribute__((aligned(__alignof__(struct inotify_event))));
    ssize_t got;
    while (fd >= 0 && (got = read(fd, evbuf, sizeof evbuf)) > 0)
        for (char *p = evbuf; p < evbuf + got;) {
            const struct inotify_event *ev = (const struct inotify_event *)p;
            for (int i = 0; i < N_FILES; i++)
                if (ev->wd == wd[i] && (ev->mask & IN_OPEN))
                    opens[i]++;
            p += sizeof *ev + ev->len;
        }
    for (int i = 0; i < N_FILES; i++)
        TU_CHECK(opens[i] == 1, "%s opened %d times (once asked)", files[i], opens[i]);
    if (fd >= 0)
        close(fd);
    printf("config files parsed for 1 model_info + 2 replicas: %u (%d components)\n",
           ditd_json_config_parses(NULL), N_FILES);

    /* a file changed on disk is parsed again (its modification time moves),
     * once; then restored */
    snprintf(path, sizeof path, "%s/transformer/config.json", dir);
    struct stat st;
    TU_CHECK(stat(path, &st) == 0, "stat %s", path);
    struct timespec moved[2] = {st.st_atim, st.st_mtim}, back[2] = {st.st_atim, st.st_mtim};
    moved[1].tv_sec += 7;
    TU_CHECK(utimensat(AT_FDCWD, path, moved, 0) == 0, "touch %s", path);
    ditd_replica_close(&r2);
    TU_OK(ditd_replica_open(&o, &r2));
    unsigned n = ditd_json_config_parses(path);
    TU_CHECK(n == 2, "changed transformer/config.json parsed %u times (2 expected)", n);
    snprintf(path, sizeof path, "%s/vae/config.json", dir);
    n = ditd_json_config_parses(path);
    TU_CHECK(n == 1, "unchanged vae/config.json parsed %u times", n);
    snprintf(path, sizeof path, "%s/transformer/config.json", dir);
    TU_CHECK(utimensat(AT_FDCWD, path, back, 0) == 0, "restore %s", path);

    ditd_replica_close(&r2);
    ditd_replica_close(&r1);
    ditd_model_info_free(&front);
}

static void test_halves(const char *dir)
{
    ditd_replica r;
    ditd_replica_opts o = worker_opts(dir);

    /* begin: the folder, no weights */
    TU_OK(ditd_replica_begin(&o, &r));
    TU_CHECK(r.have_info && r.ops && !r.pipe && !r.li && !r.penc, "begin opened weights");
    TU_CHECK(!strcmp(r.info.pipeline->name, "StableDiffusion3Pipeline"), "pipeline %s",
             r.info.pipeline->name);
    /* the caller may change what to load after begin: latents only */
    o.decode = DITD_REPLICA_NO_DECODE;
    o.text = 0;
    TU_OK(ditd_replica_load(&o, &r));
    TU_CHECK(r.pipe && !r.li && !r.penc, "load without decode or encoders");
    ditd_replica_close(&r);
    TU_CHECK(!r.pipe && !r.have_info, "close zeroes");

    memset(&r, 0, sizeof r);
    TU_CHECK_ERR(ditd_replica_load(&o, &r), DITD_EINVAL, "before ditd_replica_begin");
    o.model_dir = "/nonexistent/ditd-folder";
    TU_CHECK_ERR(ditd_replica_open(&o, &r), DITD_ENOENT, "/nonexistent/ditd-folder");
    ditd_replica_close(&r);
    o = worker_opts(dir);
    o.dtype = "f8";
    TU_CHECK_ERR(ditd_replica_open(&o, &r), DITD_EINVAL, "f8");
    ditd_replica_close(&r);
    o = worker_opts(dir);
    o.text_rank = 1; /* a group of one has rank 0 only */
    TU_CHECK_ERR(ditd_replica_open(&o, &r), DITD_EINVAL, "text encoder rank 1");
    ditd_replica_close(&r);
}

int main(void)
{
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/sd3", SD3_PIPELINE_DIR);
    ditd_backend_cpu.set_threads(1);
    test_once(dir);
    test_halves(dir);
    return tu_exit();
}
