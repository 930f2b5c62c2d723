/* MP4 out: 8-bit RGB frames to H.264 yuv420p in an MP4 file, through
 * FFmpeg's libraries (libavcodec, libavformat, libswscale, libavutil), and
 * a probe that decodes one back (frame count, size, frame rate).
 *
 * What it is not: a streaming writer (the whole clip is given), audio, or
 * any codec but H.264. Built without FFmpeg (meson found no libavcodec)
 * both return DITD_EUNSUPPORTED saying so.
 */
#ifndef DITD_ENGINE_IO_VIDEO_MP4_H
#define DITD_ENGINE_IO_VIDEO_MP4_H

#include <stdint.h>

/* Writes F frames (F, H, W, 3) RGB bytes at fps frames per second to
 * path: H.264 (the encoder FFmpeg has for it, libx264 on Debian), yuv420p
 * (W and H even: DITD_EINVAL otherwise), crf 18. Errors name the path and
 * FFmpeg's message. */
int ditd_video_write_mp4(const char *path, const uint8_t *frames, int F, int W, int H, int fps);

/* Opens path and decodes its first video stream: the frames decoded, the
 * size and the stream's average frame rate (num / den). */
int ditd_video_probe(const char *path, int *frames, int *W, int *H, int *fps_num, int *fps_den);

/* 1 when ditd was built with FFmpeg's libraries (the two calls above
 * work), 0 when they return DITD_EUNSUPPORTED: for refusing an .mp4
 * output before any work is done. */
int ditd_video_mp4_available(void);

#endif
