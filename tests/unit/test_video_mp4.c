/* MP4 out (engine/io/video_mp4.h): a synthetic 9-frame clip written as
 * H.264 yuv420p at 16 fps, decoded back through libavformat (frame count,
 * size, frame rate) and, when the ffprobe binary is installed, by ffprobe
 * itself (-count_frames); odd sizes refused. Without FFmpeg's libraries the
 * writer must say so (the test then skips: 77). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/core/error.h"
#include "engine/io/video_mp4.h"
#include "tests/test_util.h"

#define F 9
#define W 64
#define H 48

int main(void)
{
    static uint8_t clip[F * H * W * 3];
    char path[] = "/tmp/ditd_mp4_XXXXXX";
    int fd = mkstemp(path);
    TU_CHECK(fd >= 0, "mkstemp");
    if (fd < 0)
        return tu_exit();
    close(fd);
    for (int f = 0; f < F; f++) /* a gradient moving right, a frame a step */
        for (int y = 0; y < H; y++)
            for (int x = 0; x < W; x++) {
                uint8_t *p = clip + (((size_t)f * H + y) * W + x) * 3;
                p[0] = (uint8_t)((x + 4 * f) * 4);
                p[1] = (uint8_t)(y * 5);
                p[2] = (uint8_t)(128 + 10 * f);
            }
    int err = ditd_video_write_mp4(path, clip, F, W, H, 16);
    if (err == DITD_EUNSUPPORTED && strstr(ditd_err_detail(), "without FFmpeg")) {
        printf("skip: %s\n", ditd_err_detail());
        unlink(path);
        return 77;
    }
    TU_OK(err);
    int n = 0, w = 0, h = 0, num = 0, den = 0;
    TU_OK(ditd_video_probe(path, &n, &w, &h, &num, &den));
    TU_CHECK(n == F && w == W && h == H && den > 0 && num == 16 * den,
             "decoded: %d frames %dx%d at %d/%d fps; wrote %d frames %dx%d at 16", n, w, h, num, den,
             F, W, H);
    if (access("/usr/bin/ffprobe", X_OK) == 0) {
        char cmd[512], line[256] = "";
        snprintf(cmd, sizeof cmd,
                 "/usr/bin/ffprobe -v error -count_frames -select_streams v:0 -show_entries "
                 "stream=codec_name,pix_fmt,width,height,avg_frame_rate,nb_read_frames -of "
                 "csv=p=0 %s",
                 path);
        FILE *pp = popen(cmd, "r");
        TU_CHECK(pp != NULL, "popen ffprobe");
        if (pp) {
            if (!fgets(line, sizeof line, pp))
                line[0] = '\0';
            pclose(pp);
        }
        line[strcspn(line, "\n")] = '\0';
        TU_CHECK(strcmp(line, "h264,64,48,yuv420p,16/1,9") == 0,
                 "ffprobe: \"%s\", want \"h264,64,48,yuv420p,16/1,9\"", line);
    } else {
        printf("note: no /usr/bin/ffprobe: decoded through libavformat only\n");
    }
    TU_CHECK_ERR(ditd_video_write_mp4(path, clip, F, W - 1, H, 16), DITD_EINVAL, "even");
    unlink(path);
    return tu_exit();
}
