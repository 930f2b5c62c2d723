/* MP4 out through FFmpeg's libraries. */
#include "engine/io/video_mp4.h"

#include <stdio.h>
#include <string.h>

#include "engine/core/error.h"

#ifndef DITD_HAVE_FFMPEG

int ditd_video_mp4_available(void) { return 0; }

int ditd_video_write_mp4(const char *path, const uint8_t *frames, int F, int W, int H, int fps)
{
    (void)frames, (void)F, (void)W, (void)H, (void)fps;
    return ditd_err_set(DITD_EUNSUPPORTED, "%s: ditd was built without FFmpeg's libraries "
                        "(libavcodec-dev libavformat-dev libswscale-dev libavutil-dev)", path);
}

int ditd_video_probe(const char *path, int *frames, int *W, int *H, int *fps_num, int *fps_den)
{
    (void)frames, (void)W, (void)H, (void)fps_num, (void)fps_den;
    return ditd_err_set(DITD_EUNSUPPORTED, "%s: ditd was built without FFmpeg's libraries", path);
}

#else

#include <libavcodec/avcodec.h>
#include <libavformat/avformat.h>
#include <libavutil/imgutils.h>
#include <libavutil/opt.h>
#include <libswscale/swscale.h>

int ditd_video_mp4_available(void) { return 1; }

static int av_fail(const char *path, const char *what, int averr)
{
    char msg[AV_ERROR_MAX_STRING_SIZE] = "";
    av_strerror(averr, msg, sizeof msg);
    return ditd_err_set(DITD_EIO, "%s: %s: %s", path, what, msg);
}

/* Sends f (NULL: flush) and writes every packet the encoder gives. */
static int drain(const char *path, AVCodecContext *cc, AVFormatContext *fc, AVStream *st,
                 AVFrame *f, AVPacket *pkt)
{
    int r = avcodec_send_frame(cc, f);
    if (r < 0)
        return av_fail(path, "encode", r);
    for (;;) {
        r = avcodec_receive_packet(cc, pkt);
        if (r == AVERROR(EAGAIN) || r == AVERROR_EOF)
            return 0;
        if (r < 0)
            return av_fail(path, "encode", r);
        av_packet_rescale_ts(pkt, cc->time_base, st->time_base);
        pkt->stream_index = st->index;
        r = av_interleaved_write_frame(fc, pkt);
        if (r < 0)
            return av_fail(path, "write", r);
    }
}

int ditd_video_write_mp4(const char *path, const uint8_t *frames, int F, int W, int H, int fps)
{
    AVFormatContext *fc = NULL;
    AVCodecContext *cc = NULL;
    AVFrame *f = NULL;
    AVPacket *pkt = NULL;
    struct SwsContext *sws = NULL;
    AVStream *st;
    const AVCodec *codec;
    int err = 0, r, opened = 0;

    av_log_set_level(AV_LOG_ERROR); /* errors come back through ditd_err_set */
    if (F < 1 || W < 2 || H < 2 || W % 2 || H % 2 || fps < 1 || fps > 240)
        return ditd_err_set(DITD_EINVAL, "%s: %d frames of %dx%d at %d fps (yuv420p needs an even "
                            "size; 1..240 fps)", path, F, W, H, fps);
    if (!(codec = avcodec_find_encoder(AV_CODEC_ID_H264)))
        return ditd_err_set(DITD_EUNSUPPORTED, "%s: FFmpeg has no H.264 encoder", path);
    if ((r = avformat_alloc_output_context2(&fc, NULL, "mp4", path)) < 0)
        return av_fail(path, "mp4 muxer", r);
    if (!(st = avformat_new_stream(fc, NULL)) || !(cc = avcodec_alloc_context3(codec)) ||
        !(f = av_frame_alloc()) || !(pkt = av_packet_alloc())) {
        err = ditd_err_set(DITD_ENOMEM, "%s: encoder", path);
        goto done;
    }
    cc->width = W;
    cc->height = H;
    cc->pix_fmt = AV_PIX_FMT_YUV420P;
    cc->time_base = (AVRational){1, fps};
    cc->framerate = (AVRational){fps, 1};
    cc->gop_size = 12;
    if (fc->oformat->flags & AVFMT_GLOBALHEADER)
        cc->flags |= AV_CODEC_FLAG_GLOBAL_HEADER;
    av_opt_set(cc->priv_data, "crf", "18", 0);
    av_opt_set(cc->priv_data, "preset", "medium", 0);
    if ((r = avcodec_open2(cc, codec, NULL)) < 0) {
        err = av_fail(path, "open the H.264 encoder", r);
        goto done;
    }
    if ((r = avcodec_parameters_from_context(st->codecpar, cc)) < 0) {
        err = av_fail(path, "stream parameters", r);
        goto done;
    }
    st->time_base = cc->time_base;
    st->avg_frame_rate = cc->framerate;
    if ((r = avio_open(&fc->pb, path, AVIO_FLAG_WRITE)) < 0) {
        err = av_fail(path, "open", r);
        goto done;
    }
    opened = 1;
    if ((r = avformat_write_header(fc, NULL)) < 0) {
        err = av_fail(path, "header", r);
        goto done;
    }
    f->format = AV_PIX_FMT_YUV420P;
    f->width = W;
    f->height = H;
    if ((r = av_frame_get_buffer(f, 0)) < 0) {
        err = av_fail(path, "frame", r);
        goto done;
    }
    sws = sws_getContext(W, H, AV_PIX_FMT_RGB24, W, H, AV_PIX_FMT_YUV420P, SWS_BICUBIC, NULL, NULL,
                         NULL);
    if (!sws) {
        err = ditd_err_set(DITD_ENOMEM, "%s: colour conversion", path);
        goto done;
    }
    for (int i = 0; i < F; i++) {
        const uint8_t *src[1] = {frames + (size_t)i * W * H * 3};
        const int stride[1] = {3 * W};
        if ((r = av_frame_make_writable(f)) < 0) {
            err = av_fail(path, "frame", r);
            goto done;
        }
        sws_scale(sws, src, stride, 0, H, f->data, f->linesize);
        f->pts = i;
        if ((err = drain(path, cc, fc, st, f, pkt)))
            goto done;
    }
    if ((err = drain(path, cc, fc, st, NULL, pkt)))
        goto done;
    if ((r = av_write_trailer(fc)) < 0)
        err = av_fail(path, "trailer", r);
done:
    sws_freeContext(sws);
    av_packet_free(&pkt);
    av_frame_free(&f);
    avcodec_free_context(&cc);
    if (opened)
        avio_closep(&fc->pb);
    avformat_free_context(fc);
    return err;
}

int ditd_video_probe(const char *path, int *frames, int *W, int *H, int *fps_num, int *fps_den)
{
    AVFormatContext *fc = NULL;
    AVCodecContext *cc = NULL;
    AVPacket *pkt = NULL;
    AVFrame *f = NULL;
    const AVCodec *codec = NULL;
    int err = 0, r, si, n = 0;

    av_log_set_level(AV_LOG_ERROR);
    if ((r = avformat_open_input(&fc, path, NULL, NULL)) < 0)
        return av_fail(path, "open", r);
    if ((r = avformat_find_stream_info(fc, NULL)) < 0) {
        err = av_fail(path, "stream info", r);
        goto done;
    }
    if ((si = av_find_best_stream(fc, AVMEDIA_TYPE_VIDEO, -1, -1, &codec, 0)) < 0) {
        err = ditd_err_set(DITD_EFORMAT, "%s: no video stream", path);
        goto done;
    }
    if (!(cc = avcodec_alloc_context3(codec)) || !(pkt = av_packet_alloc()) ||
        !(f = av_frame_alloc())) {
        err = ditd_err_set(DITD_ENOMEM, "%s: decoder", path);
        goto done;
    }
    avcodec_parameters_to_context(cc, fc->streams[si]->codecpar);
    if ((r = avcodec_open2(cc, codec, NULL)) < 0) {
        err = av_fail(path, "open the decoder", r);
        goto done;
    }
    for (int eof = 0; !eof;) {
        r = av_read_frame(fc, pkt);
        if (r < 0) {
            eof = 1;
            avcodec_send_packet(cc, NULL);
        } else {
            if (pkt->stream_index == si)
                avcodec_send_packet(cc, pkt);
            av_packet_unref(pkt);
        }
        while (avcodec_receive_frame(cc, f) == 0)
            n++;
    }
    *frames = n;
    *W = cc->width;
    *H = cc->height;
    *fps_num = fc->streams[si]->avg_frame_rate.num;
    *fps_den = fc->streams[si]->avg_frame_rate.den;
done:
    av_frame_free(&f);
    av_packet_free(&pkt);
    avcodec_free_context(&cc);
    avformat_close_input(&fc);
    return err;
}

#endif
