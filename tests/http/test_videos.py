#!/usr/bin/env python3
"""OpenAI's videos API on `ditd serve` (issues 21 and 22): /v1/videos on a WanPipeline folder,
driven by the official `openai` client (its videos methods unchanged, create_and_poll included),
http.client and ffprobe. The model is the tiny Wan 2.2 A14B-like folder the build assembles
(<builddir>/tests/golden/wan_pipeline/wan22: two experts, the real UMT5 tokenizer; its numerics
are checked against Diffusers by test_wan_pipeline and wan_generate_cli). Exit 0 pass, 1 fail,
77 skip.

usage: test_videos.py --ditd BUILD/ditd CASE
cases: videos (create_and_poll, retrieve, list, download_content video and thumbnail, delete;
       the clip equals `ditd generate`'s for the same seed, frame for frame; keys; the refusals:
       bad ids, another key's video, bad fields, input_reference, an image endpoint on a video
       model; /v1/models' frame fields),
       videos_restart (--data-dir: a completed clip listed and downloadable after SIGTERM and
       after SIGKILL, a deleted running clip stops and its files go),
       videos_i2v (input_reference on the tiny Wan 2.1 I2V folder: the openai client, curl -F and
       JSON make ditd generate --image's clip; it survives a SIGKILL in the store; the refusals;
       ulysses 2 under mpirun makes the same clip),
       videos_flf2v (last_frame_reference on the tiny FLF2V folder: the openai client, curl -F
       and JSON make ditd generate --image --last-image's clip; it survives a SIGKILL in the
       store; the refusals; ulysses 2 under mpirun makes the same clip),
       videos_mpi (a two-rank replica under ulysses 2 and cfg 2 makes one rank's clip),
       videos_webhook (signed video.completed / video.failed events, a retry after a 500)
"""
import argparse
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_http as th  # noqa: E402
from test_http import Daemon, check  # noqa: E402

PROMPT = "a red fox running through snow"
EXTRA = {"seed": 5, "num_inference_steps": 4, "guidance_scale_2": 2.5}


def wan_model(ditd):
    d = os.path.join(os.path.dirname(ditd), "tests", "golden", "wan_pipeline", "wan22")
    return d if os.path.exists(os.path.join(d, "model_index.json")) else None


def probe(data):
    """ffprobe's (codec, pix_fmt, width, height, rate, frames) of MP4 bytes."""
    with tempfile.NamedTemporaryFile(suffix=".mp4") as f:
        f.write(data)
        f.flush()
        r = subprocess.run(["ffprobe", "-v", "error", "-count_frames", "-select_streams", "v:0",
                            "-show_entries",
                            "stream=codec_name,pix_fmt,width,height,r_frame_rate,nb_read_frames",
                            "-of", "json", f.name], capture_output=True, text=True)
    if r.returncode != 0:
        return None
    s = json.loads(r.stdout)["streams"][0]
    return (s["codec_name"], s["pix_fmt"], s["width"], s["height"], s["r_frame_rate"],
            int(s["nb_read_frames"]))


def reference_frames(ditd, model, tmp):
    """`ditd generate` with the same request: its PNG frames (pixels)."""
    out = os.path.join(tmp, "ref.png")
    r = subprocess.run([ditd, "generate", "--model", model, "--prompt", PROMPT, "--size", "48x32",
                        "--frames", "5", "--steps", "4", "--seed", "5", "--guidance-2", "2.5",
                        "--threads", "1", "-q", "-o", out], capture_output=True, text=True,
                       timeout=300)
    check(r.returncode == 0, "ditd generate makes the reference clip", r.stderr[-300:])
    frames = []
    for i in range(5):
        p = os.path.join(tmp, "ref-%03d.png" % i)
        frames.append(th.png_pixels(open(p, "rb").read()) if os.path.exists(p) else None)
    return frames


def mp4_psnr(mp4, ref, w, h):
    """The worst PSNR (dB) of the MP4's frames against `ditd generate`'s PNG frames `ref`, each
    put through the same 4:2:0 conversion first (chroma subsampling alone costs these
    noise-like tiny clips about 20 dB) against the H.264 frame (CRF 18), as wan_generate_cli
    checks ditd generate's own MP4. 0 when the MP4 does not decode to len(ref) frames."""
    n, fb = len(ref), w * h * 3
    with tempfile.NamedTemporaryFile(suffix=".mp4") as f:
        f.write(mp4)
        f.flush()
        raw = subprocess.run(["ffmpeg", "-v", "error", "-i", f.name, "-f", "rawvideo",
                              "-pix_fmt", "rgb24", "-"], capture_output=True).stdout
    check(len(raw) == n * fb, "the MP4 decodes to %d frames" % n, len(raw))
    worst = 99.0
    for i in range(n):
        if ref[i] is None or len(raw) != n * fb:
            return 0
        yuv = subprocess.run(["ffmpeg", "-v", "error", "-f", "rawvideo", "-pix_fmt", "rgb24",
                              "-s", "%dx%d" % (w, h), "-i", "-", "-pix_fmt", "yuv420p", "-f",
                              "rawvideo", "-"], input=bytes(ref[i]), capture_output=True).stdout
        back = subprocess.run(["ffmpeg", "-v", "error", "-f", "rawvideo", "-pix_fmt", "yuv420p",
                               "-s", "%dx%d" % (w, h), "-i", "-", "-f", "rawvideo", "-pix_fmt",
                               "rgb24", "-"], input=yuv, capture_output=True).stdout
        got = raw[i * fb:(i + 1) * fb]
        mse = sum((a - b) ** 2 for a, b in zip(got, back)) / fb if len(back) == fb else 1e9
        worst = min(worst, 99.0 if mse == 0 else 10 * math.log10(255 * 255 / mse))
    return worst


def api_error(d, method, path, body=None, headers=None):
    st, _, data = d.request(method, path, body, headers)
    try:
        return st, json.loads(data)["error"]
    except (ValueError, KeyError, TypeError):
        return st, {}


def case_videos(ditd):
    model = wan_model(ditd)
    if not model:
        print("skip: no Wan pipeline folder (the build assembles it)")
        return 77
    if not shutil.which("ffprobe"):
        print("skip: no ffprobe")
        return 77
    import openai
    tmp = tempfile.mkdtemp(prefix="ditd-videos-")
    ref = reference_frames(ditd, model, tmp)
    d = Daemon(ditd, "--api-key", "k1,k2", api_key="k1", model=model)
    checked = 0
    try:
        c = openai.OpenAI(base_url=d.url("/v1"), api_key="k1", max_retries=0)
        v = c.videos.create_and_poll(model="wan22", prompt=PROMPT, size="48x32", seconds="0.25",
                                     extra_body=EXTRA, poll_interval_ms=100)
        check(v.status == "completed" and v.object == "video" and v.progress == 100,
              "create_and_poll: completed", (v.status, v.progress, v.error))
        check(v.size == "48x32" and v.seconds == "0.3125" and v.model == "wan22",
              "the video object: size, seconds (5 frames at 16 fps), model",
              (v.size, v.seconds, v.model))
        check(v.completed_at and v.created_at and v.expires_at and v.expires_at > v.completed_at,
              "created_at, completed_at, expires_at (--job-ttl)")
        m = d.metrics()
        runs = [v_ for k, v_ in m.items() if k.startswith("ditd_job_run_seconds_count{") and 'kind="video"' in k]
        waits = [v_ for k, v_ in m.items() if k.startswith("ditd_job_wait_seconds_count{") and 'kind="video"' in k]
        check(runs == [1.0] and waits == [1.0], "metrics: the clip's wait and run time observed",
              (runs, waits))
        r = c.videos.retrieve(v.id)
        check(r.id == v.id and r.status == "completed", "retrieve", r.status)
        mp4 = c.videos.download_content(v.id).read()
        check(probe(mp4) == ("h264", "yuv420p", 48, 32, "16/1", 5),
              "download_content: an H.264 MP4 of 5 frames, 48x32, 16 fps", probe(mp4))
        png = c.videos.download_content(v.id, variant="thumbnail").read()
        px = th.png_pixels(png) if png[:8] == b"\x89PNG\r\n\x1a\n" else None
        check(px is not None and px == ref[0],
              "the thumbnail is the first frame, equal to ditd generate's for the same seed")
        # the whole clip: the MP4's frames against generate's frames through the same 4:2:0
        worst = mp4_psnr(mp4, ref, 48, 32)
        check(worst >= 30, "every MP4 frame within codec error of generate's frame (%.1f dB at "
              "worst, 30 asked)" % worst)
        checked += 1
        # list: ours only, newest first, after/limit
        v2 = c.videos.create(model="wan22", prompt="waves", size="32x32", extra_body=dict(
            EXTRA, num_frames=5))
        page = c.videos.list(limit=1)
        check([x.id for x in page.data] == [v2.id] and page.has_more, "list: newest first, limit 1",
              [x.id for x in page.data])
        allv = c.videos.list(order="asc")
        check([x.id for x in allv.data] == [v.id, v2.id], "list: order asc", [x.id for x in allv.data])
        st, _, data = d.request("GET", f"/v1/videos?after={v2.id}&order=desc")
        check(st == 200 and [x["id"] for x in json.loads(data)["data"]] == [v.id], "list: after")
        st, _, data = d.request("GET", "/v1/jobs", headers={"Authorization": "Bearer k1"})
        check(st == 200 and {x["kind"] for x in json.loads(data)["data"]} == {"video"},
              "the videos are jobs of kind video in /v1/jobs")
        # another key sees none of them
        c2 = openai.OpenAI(base_url=d.url("/v1"), api_key="k2", max_retries=0)
        check(c2.videos.list().data == [], "another key lists none")
        for fn in (lambda: c2.videos.retrieve(v.id), lambda: c2.videos.download_content(v.id),
                   lambda: c2.videos.delete(v.id)):
            try:
                fn()
                check(False, "another key's video is 404")
            except openai.NotFoundError:
                check(True, "another key's video is 404")
        # delete
        dl = c.videos.delete(v.id)
        check(dl.deleted and dl.id == v.id and dl.object == "video.deleted", "delete")
        try:
            c.videos.retrieve(v.id)
            check(False, "a deleted video is 404")
        except openai.NotFoundError:
            check(True, "a deleted video is 404")
        # refusals, in the OpenAI envelope, naming the field
        bad = [
            ({"prompt": "x", "seconds": "abc"}, 400, "seconds"),
            ({"prompt": "x", "seconds": "4", "num_frames": 5}, 400, "seconds"),
            ({"prompt": "x", "num_frames": 100000}, 400, "num_frames"),
            ({"prompt": "x", "size": "50x32"}, 400, "size"),
            ({"prompt": "x", "n": 2}, 400, "n"),
            ({"prompt": "x", "stream": True}, 400, "stream"),
            ({"prompt": "x", "fps": 0}, 400, "fps"),
            ({"prompt": "x", "guidance_scale_2": -1}, 400, "guidance_scale_2"),
            # UniPC's flow sigmas repeat a timestep at 1000 steps: refused here, not failed later
            ({"prompt": "x", "num_inference_steps": 1000}, 400, "num_inference_steps"),
            ({"prompt": "x", "input_reference": "data:image/png;base64,AAAA"}, 400,
             "input_reference"),
            ({"prompt": "x", "last_frame_reference": "data:image/png;base64,AAAA"}, 400,
             "last_frame_reference"),
            ({"size": "32x32"}, 400, "prompt"),
            ({"prompt": "x", "model": "nope"}, 404, "model"),
        ]
        for body, want, param in bad:
            st, e = api_error(d, "POST", "/v1/videos", body)
            check(st == want and e.get("param") == param and e.get("message"),
                  f"POST /v1/videos {body}: {want} naming '{param}'", (st, e))
            checked += 1
        try:
            c.videos.create(model="wan22", prompt="x", input_reference=("a.png", b"\x89PNG", "image/png"))
            check(False, "the client's input_reference is refused")
        except openai.APIError as ex:
            check(isinstance(ex, openai.BadRequestError) and "input_reference" in str(ex),
                  "the client's input_reference is refused by name", str(ex)[:300])
        st, e = api_error(d, "POST", "/v1/images/generations", {"prompt": "x"})
        check(st == 400 and "/v1/videos" in e.get("message", ""),
              "/v1/images/generations on a video model names /v1/videos", (st, e))
        for path in ("/v1/videos/job_000000000000000000000000", "/v1/videos/nope/content"):
            st, e = api_error(d, "GET", path)
            check(st == 404 and e.get("code") == "video_not_found", f"GET {path}: 404", (st, e))
        st, e = api_error(d, "GET", f"/v1/videos/{v2.id}/content?variant=spritesheet")
        check(st in (400, 409), "variant spritesheet is refused", (st, e))
        st, e = api_error(d, "GET", "/v1/videos", headers={"Authorization": "Bearer nope"})
        check(st == 401, "a bad key is 401", st)
        # /v1/models: the clip's fields
        st, _, data = d.request("GET", "/v1/models/wan22")
        m = json.loads(data) if st == 200 else {}
        vf = m.get("video", {})
        check(vf.get("fps") == 16 and vf.get("default_frames") == 81 and vf.get("frame_step") == 4
              and vf.get("max_frames") == 257 and vf.get("experts") == 2
              and vf.get("input_reference") == "refused"
              and vf.get("last_frame_reference") == "refused"
              and "guidance_scale_2" in m.get("parameters", []),
              "/v1/models: frames, fps, experts, guidance_scale_2", m.get("video"))
        c.videos.delete(v2.id)
    finally:
        d.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    check(checked >= 12, f"{checked} video cases checked (at least 12)")
    return 0


def case_videos_restart(ditd):
    model = wan_model(ditd)
    if not model:
        print("skip: no Wan pipeline folder (the build assembles it)")
        return 77
    data_dir = tempfile.mkdtemp(prefix="ditd-videos-store-")
    try:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            d = Daemon(ditd, "--data-dir", data_dir, model=model)
            st, _, body = d.request("POST", "/v1/videos", dict(EXTRA, prompt=PROMPT, size="48x32",
                                                                num_frames=5))
            vid = json.loads(body)["id"] if st == 200 else None
            check(st == 200 and vid, f"created ({sig.name})", st)
            o = {}
            t0 = time.time()
            while time.time() - t0 < 120:
                _, _, b = d.request("GET", f"/v1/videos/{vid}")
                o = json.loads(b)
                if o["status"] in ("completed", "failed"):
                    break
                time.sleep(0.1)
            check(o.get("status") == "completed", f"completed before the restart ({sig.name})", o)
            _, _, mp4 = d.request("GET", f"/v1/videos/{vid}/content")
            # a long clip that is running when it is deleted
            st, _, body = d.request("POST", "/v1/videos", dict(EXTRA, prompt="long", size="256x256",
                                                                num_frames=33,
                                                                num_inference_steps=200))
            lid = json.loads(body)["id"]
            t0, lo = time.time(), {}
            while time.time() - t0 < 60:
                _, _, b = d.request("GET", f"/v1/videos/{lid}")
                lo = json.loads(b)
                if lo["status"] != "queued" and (lo["progress"] > 0 or lo["status"] != "in_progress"):
                    break
                time.sleep(0.05)
            check(lo.get("status") == "in_progress" and 0 < lo.get("progress", 0) < 100,
                  "the long clip runs, its progress moves", lo)
            st, _, _ = d.request("DELETE", f"/v1/videos/{lid}")
            check(st == 200, "a running clip deleted", st)
            # it stopped: the next clip runs at once (the long one takes ~16 s alone here)
            st, _, body = d.request("POST", "/v1/videos", dict(EXTRA, prompt="next", size="32x32",
                                                                num_frames=5))
            nid = json.loads(body)["id"] if st == 200 else None
            t0, no = time.time(), {}
            while nid and time.time() - t0 < 60:
                _, _, b = d.request("GET", f"/v1/videos/{nid}")
                no = json.loads(b)
                if no["status"] in ("completed", "failed"):
                    break
                time.sleep(0.05)
            check(no.get("status") == "completed" and time.time() - t0 < 5,
                  "after the delete the next clip completes at once (%.1f s)" % (time.time() - t0))
            d.request("DELETE", f"/v1/videos/{nid}")
            st, _, _ = d.request("GET", f"/v1/videos/{lid}")
            check(st == 404, "and gone", st)
            if sig == signal.SIGKILL:
                os.killpg(d.proc.pid, signal.SIGKILL)
                d.proc.wait()
            else:
                d.stop(sig)
            check(not os.path.exists(os.path.join(data_dir, "results", lid)),
                  "the deleted clip left no files")
            d = Daemon(ditd, "--data-dir", data_dir, model=model)
            st, _, b = d.request("GET", "/v1/videos")
            ids = [x["id"] for x in json.loads(b)["data"]] if st == 200 else []
            check(vid in ids and lid not in ids, f"after {sig.name}: the completed clip is listed",
                  ids)
            st, _, again = d.request("GET", f"/v1/videos/{vid}/content")
            check(st == 200 and again == mp4, f"after {sig.name}: the same MP4 bytes")
            st, _, thumb = d.request("GET", f"/v1/videos/{vid}/content?variant=thumbnail")
            check(st == 200 and thumb[:4] == b"\x89PNG", f"after {sig.name}: the thumbnail")
            d.request("DELETE", f"/v1/videos/{vid}")
            d.stop()
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)
    return 0


def case_videos_mpi(ditd):
    """A replica of two ranks (mpirun -np 3 ditd serve --ulysses-degree 2, then --cfg-degree 2):
    the denoising on the group, the decode on its leader; the clip equals one rank's
    (`ditd generate`), frame for frame within one level, and the group serves the next."""
    model = wan_model(ditd)
    if not model:
        print("skip: no Wan pipeline folder (the build assembles it)")
        return 77
    if not shutil.which("mpirun"):
        print("skip: no mpirun")
        return 77
    tmp = tempfile.mkdtemp(prefix="ditd-videos-mpi-")
    ref = reference_frames(ditd, model, tmp)
    checked = 0
    try:
        for flags in (["--ulysses-degree", "2"], ["--cfg-degree", "2"]):
            d = Daemon(ditd, *flags, mpi_np=3, model=model)  # rank 0 is the front-end
            try:
                for k in range(2):
                    st, _, body = d.request("POST", "/v1/videos", dict(
                        EXTRA, prompt=PROMPT, size="48x32", num_frames=5))
                    vid = json.loads(body)["id"] if st == 200 else None
                    o, t0 = {}, time.time()
                    while vid and time.time() - t0 < 120:
                        _, _, b = d.request("GET", f"/v1/videos/{vid}")
                        o = json.loads(b)
                        if o["status"] in ("completed", "failed"):
                            break
                        time.sleep(0.1)
                    check(o.get("status") == "completed", f"{flags} clip {k}: completed", o)
                    st, _, png = d.request("GET", f"/v1/videos/{vid}/content?variant=thumbnail")
                    px = th.png_pixels(png) if st == 200 else None
                    worst = max(abs(a - b) for a, b in zip(px, ref[0])) if px and ref[0] else 99
                    check(px is not None and len(px) == len(ref[0] or []) and worst <= 1,
                          f"{flags} clip {k}: the first frame within one level of one rank's "
                          f"({worst})")
                    checked += 1
            finally:
                d.stop()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    check(checked >= 4, f"{checked} group clips checked (at least 4)")
    return 0


def case_videos_webhook(ditd):
    """--webhook-url / --webhook-secret: a receiver on 127.0.0.1 answers 500 to the first
    delivery and 204 to the retry; the event verifies with the official client's
    webhooks.unwrap (the Standard Webhooks signature) and names the clip; a failed clip sends
    video.failed; the metrics count them; a bad URL or secret stops the start."""
    import base64 as b64
    import http.server
    import threading
    import openai
    model = wan_model(ditd)
    if not model:
        print("skip: no Wan pipeline folder (the build assembles it)")
        return 77
    secret = "whsec_" + b64.b64encode(b"ditd-test-webhook-key-0123456789").decode()
    got, lock = [], threading.Lock()

    class Receiver(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            with lock:
                got.append((dict(self.headers), body))
                first = len(got) == 1
            self.send_response(500 if first else 204)
            self.end_headers()

        def log_message(self, *a):
            pass

    srv = http.server.HTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{srv.server_address[1]}/hooks/ditd"
    try:
        for bad_url, bad_secret, needle in [("gopher://127.0.0.1/x", secret, "https://"),
                                            (url, "s3cret", "whsec_"),
                                            ("ftp://x", secret, "http://")]:
            r = subprocess.run([ditd, "serve", "--model", model, "--port", "0", "--webhook-url",
                                bad_url, "--webhook-secret", bad_secret], capture_output=True,
                               text=True, timeout=60)
            check(r.returncode != 0 and needle in r.stderr, f"--webhook-url {bad_url}: refused "
                  f"naming '{needle}'", r.stderr[-300:])
        d = Daemon(ditd, "--webhook-url", url, env={"DITD_WEBHOOK_SECRET": secret}, model=model)
        try:
            st, _, body = d.request("POST", "/v1/videos", dict(EXTRA, prompt=PROMPT, size="48x32",
                                                                num_frames=5))
            vid = json.loads(body)["id"]
            t0 = time.time()
            while time.time() - t0 < 30 and len(got) < 2:
                time.sleep(0.1)
            check(len(got) == 2, "the event came twice: a 500, then the retry", len(got))
            if len(got) == 2:
                (h1, b1), (h2, b2) = got
                client = openai.OpenAI(api_key="x", webhook_secret=secret)
                ev = client.webhooks.unwrap(b2, h2)
                check(ev.type == "video.completed" and ev.data.id == vid and ev.object == "event",
                      "webhooks.unwrap verifies the event: video.completed for the clip", ev)
                check(h1.get("webhook-id") == h2.get("webhook-id") and b1 == b2,
                      "the retry is the same event (same webhook-id and body)")
                try:
                    client.webhooks.unwrap(b2.replace(vid.encode(), b"job_forged"), h2)
                    check(False, "a changed body fails the signature")
                except openai.InvalidWebhookSignatureError:
                    check(True, "a changed body fails the signature")
            # a failed clip: TaylorSeer's default identifiers (^blocks.*attn,
            # fullmatch) hook no Wan module (attn1, attn2): refused on the replica
            st, _, body = d.request("POST", "/v1/videos", dict(EXTRA, prompt="x", size="32x32",
                                                                num_frames=5, cache={
                                                                    "method": "taylorseer_cache"}))
            fid = json.loads(body)["id"]
            t0 = time.time()
            while time.time() - t0 < 30 and len(got) < 3:
                time.sleep(0.1)
            ev = openai.OpenAI(api_key="x", webhook_secret=secret).webhooks.unwrap(
                got[-1][1], got[-1][0]) if len(got) >= 3 else None
            check(ev is not None and ev.type == "video.failed" and ev.data.id == fid,
                  "a failed clip sends video.failed", ev)
            m = d.metrics()
            check(m.get('ditd_webhooks_total{outcome="delivered"}') == 2 and
                  m.get("ditd_webhook_failed_attempts_total") == 1,
                  "metrics: 2 delivered, 1 failed attempt",
                  {k: v for k, v in m.items() if "webhook" in k})
        finally:
            d.stop()
    finally:
        srv.shutdown()
    return 0


I2V_IMAGE = "ti2vi_9f_32x64_resized_image.png"  # 48x24: resized to the 48x32 clip (lanczos)
I2V_EXTRA = {"seed": 5, "num_inference_steps": 2, "num_frames": 5}


def i2v_model(ditd, tmp, name="i2v21"):
    """The tiny Wan 2.1 I2V folder (CLIP image branch; name "flf2v": the FLF2V one) as a folder
    of that name whose ditd.json caps the size at 64 (the replica plans the image condition and
    the decode for the largest clip: 2048x2048 by default, gigabytes even for this tiny VAE);
    None when not assembled."""
    src = os.path.join(os.path.dirname(ditd), "tests", "golden", "wan_pipeline", name)
    if not os.path.exists(os.path.join(src, "model_index.json")):
        return None
    d = os.path.join(tmp, name)
    os.mkdir(d)
    for f in os.listdir(src):
        os.symlink(os.path.join(src, f), os.path.join(d, f))
    with open(os.path.join(d, "ditd.json"), "w") as f:
        json.dump({"max_image_size": 64}, f)
    return d


def tiny_png(w, h):
    """A w x h RGB PNG of zeros (stdlib)."""
    import struct
    import zlib

    def chunk(t, b):
        return struct.pack(">I", len(b)) + t + b + struct.pack(">I", zlib.crc32(t + b) & 0xFFFFFFFF)
    rows = b"".join(b"\0" + bytes(3 * w) for _ in range(h))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)) +
            chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


def wait_video(d, vid, limit=60):
    t0, o = time.time(), {}
    while time.time() - t0 < limit:
        _, _, b = d.request("GET", f"/v1/videos/{vid}")
        o = json.loads(b)
        if o.get("status") in ("completed", "failed"):
            break
        time.sleep(0.05)
    return o


def case_videos_i2v(ditd):
    """input_reference on a WanImageToVideoPipeline folder: the openai client's file, curl's form
    and a JSON data URL each make `ditd generate --image`'s clip (thumbnail equal to its first
    PNG frame, pixel for pixel; every MP4 frame within codec error); the image is kept in the
    stored body (--data-dir): a clip queued at a SIGKILL runs after the restart and is the same
    clip; the refusals name input_reference (none, not base64, undecodable, over the pixel
    limit, two files, an image URL); under mpirun a two-rank replica (ulysses 2) makes the
    same clip."""
    if not shutil.which("ffprobe") or not shutil.which("curl"):
        print("skip: no ffprobe or curl")
        return 77
    import base64
    import sqlite3
    import openai
    tmp = tempfile.mkdtemp(prefix="ditd-videos-i2v-")
    model = i2v_model(ditd, tmp)
    if not model:
        print("skip: no Wan I2V folder (the build assembles it)")
        shutil.rmtree(tmp, ignore_errors=True)
        return 77
    img = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures",
                       "wan_pipeline", "expected_i2v", I2V_IMAGE)
    png = open(img, "rb").read()
    out = os.path.join(tmp, "ref.png")
    r = subprocess.run([ditd, "generate", "--model", model, "--image", img, "--prompt", PROMPT,
                        "--size", "48x32", "--frames", "5", "--steps", "2", "--seed", "5",
                        "--threads", "1", "-q", "-o", out], capture_output=True, text=True,
                       timeout=300)
    check(r.returncode == 0, "ditd generate --image makes the reference clip", r.stderr[-300:])
    ref = []
    for i in range(5):
        p = os.path.join(tmp, "ref-%03d.png" % i)
        ref.append(th.png_pixels(open(p, "rb").read()) if os.path.exists(p) else None)
    data_dir = os.path.join(tmp, "store")
    d = Daemon(ditd, "--data-dir", data_dir, api_key="k1", model=model)
    checked, first_mp4 = 0, []

    def same_clip(vid, how):
        nonlocal checked
        st, _, thumb = d.request("GET", f"/v1/videos/{vid}/content?variant=thumbnail")
        px = th.png_pixels(thumb) if st == 200 and thumb[:4] == b"\x89PNG" else None
        check(px is not None and px == ref[0],
              f"{how}: the thumbnail equals ditd generate --image's first frame")
        st, _, mp4 = d.request("GET", f"/v1/videos/{vid}/content")
        if first_mp4 and mp4 == first_mp4[0]:  # the same pixels, the same encoder: the same file
            check(True, f"{how}: the same MP4 bytes as the first clip's")
        else:  # the first clip (or a different file): decoded, frame by frame
            check(st == 200 and probe(mp4) == ("h264", "yuv420p", 48, 32, "16/1", 5),
                  f"{how}: an H.264 MP4 of 5 frames, 48x32", probe(mp4) if st == 200 else st)
            worst = mp4_psnr(mp4, ref, 48, 32) if st == 200 else 0
            check(worst >= 30, f"{how}: every MP4 frame within codec error of generate's (%.1f "
                  "dB at worst, 30 asked)" % worst)
            first_mp4.append(mp4)
        checked += 1
    try:
        # the official client: input_reference a file, sent as a form
        c = openai.OpenAI(base_url=d.url("/v1"), api_key="k1", max_retries=0)
        with open(img, "rb") as f:
            v = c.videos.create_and_poll(model="i2v21", prompt=PROMPT, size="48x32",
                                         input_reference=f, extra_body=I2V_EXTRA,
                                         poll_interval_ms=100)
        check(v.status == "completed" and v.size == "48x32", "openai client: completed",
              (v.status, v.error))
        same_clip(v.id, "openai client")
        # the image is in the stored body, as base64 of the file's bytes
        db = sqlite3.connect(os.path.join(data_dir, "jobs.db"))
        row = db.execute("SELECT request FROM jobs WHERE id = ?", (v.id,)).fetchone()
        db.close()
        ir = json.loads(row[0]).get("input_reference") if row else None
        check(isinstance(ir, str) and base64.b64decode(ir) == png,
              "the stored request keeps the image (base64 of the file)")
        # curl's multipart form
        r = subprocess.run(["curl", "-s", "-H", "Authorization: Bearer k1", "-F", "prompt=" + PROMPT,
                            "-F", "size=48x32", "-F", "seed=5", "-F", "num_inference_steps=2",
                            "-F", "num_frames=5", "-F", "input_reference=@" + img + ";type=image/png",
                            d.url("/v1/videos")], capture_output=True, text=True, timeout=60)
        vid = json.loads(r.stdout).get("id") if r.stdout.startswith("{") else None
        check(vid and wait_video(d, vid).get("status") == "completed", "curl -F: completed",
              r.stdout[:300])
        same_clip(vid, "curl -F")
        # JSON: a data URL, and OpenAI's {"image_url": ...} object
        for how, ref_field in (("JSON data URL", "data:image/png;base64," + base64.b64encode(png).decode()),
                               ("JSON image_url", {"image_url": "data:image/png;base64," +
                                                   base64.b64encode(png).decode()})):
            st, _, b = d.request("POST", "/v1/videos", dict(I2V_EXTRA, prompt=PROMPT, size="48x32",
                                                             input_reference=ref_field))
            vid = json.loads(b).get("id") if st == 200 else None
            check(vid and wait_video(d, vid).get("status") == "completed", f"{how}: completed",
                  (st, b[:300]))
            same_clip(vid, how)
        # refusals, naming input_reference
        big = base64.b64encode(tiny_png(9000, 1)).decode()
        for body, needle in [
                ({"prompt": "x"}, "give 'input_reference'"),
                ({"prompt": "x", "input_reference": "@@@"}, "not valid base64"),
                ({"prompt": "x", "input_reference": "data:image/png;base64,AAAA"}, "input_reference"),
                ({"prompt": "x", "input_reference": big}, "9000"),
                ({"prompt": "x", "input_reference": "https://example.com/a.png"}, "not fetched")]:
            st, e = api_error(d, "POST", "/v1/videos", dict(body, size="48x32", num_frames=5))
            check(st == 400 and e.get("param") == "input_reference" and needle in e.get("message", ""),
                  f"{str(body)[:60]}: 400 naming input_reference ({needle})", (st, e))
            checked += 1
        # a last frame (FLF2V's): this transformer takes the first alone
        st, e = api_error(d, "POST", "/v1/videos", dict(I2V_EXTRA, prompt="x", size="48x32",
                                                         input_reference=base64.b64encode(png).decode(),
                                                         last_frame_reference=base64.b64encode(png).decode()))
        check(st == 400 and e.get("param") == "last_frame_reference" and
              "takes no last frame" in e.get("message", ""),
              "last_frame_reference on an I2V model: 400 naming it", (st, e))
        st, _, b = d.request("GET", "/v1/models/i2v21")
        vf = json.loads(b).get("video", {}) if st == 200 else {}
        check(vf.get("input_reference") == "required" and vf.get("last_frame_reference") == "refused",
              "/v1/models: input_reference required, last_frame_reference refused", vf)
        checked += 2
        r = subprocess.run(["curl", "-s", "-H", "Authorization: Bearer k1", "-F", "prompt=x",
                            "-F", "input_reference=@" + img, "-F", "input_reference=@" + img,
                            d.url("/v1/videos")], capture_output=True, text=True, timeout=60)
        e = json.loads(r.stdout).get("error", {}) if r.stdout.startswith("{") else {}
        check(e.get("param") == "input_reference" and "twice" in e.get("message", ""),
              "two input_reference files: refused naming it", r.stdout[:300])
        try:
            c.videos.create(model="i2v21", prompt="x", input_reference=("a.png", b"\x89PNG", "image/png"))
            check(False, "the client's undecodable input_reference is refused")
        except openai.APIError as ex:
            check(isinstance(ex, openai.BadRequestError) and "input_reference" in str(ex),
                  "the client's undecodable input_reference: 400 naming it", str(ex)[:300])
        checked += 2
        # a restart: a clip queued behind a long one at a SIGKILL runs after it, the same clip
        st, _, b = d.request("POST", "/v1/videos", dict(I2V_EXTRA, prompt="long", size="48x32",
                                                         num_frames=9, num_inference_steps=500,
                                                         input_reference="data:image/png;base64," +
                                                         base64.b64encode(png).decode()))
        lid = json.loads(b).get("id")
        st, _, b = d.request("POST", "/v1/videos", dict(I2V_EXTRA, prompt=PROMPT, size="48x32",
                                                         input_reference=base64.b64encode(png).decode()))
        qid = json.loads(b).get("id")
        _, _, b = d.request("GET", f"/v1/videos/{qid}")
        check(json.loads(b).get("status") == "queued", "the second clip is queued behind the long one")
        os.killpg(d.proc.pid, signal.SIGKILL)
        d.proc.wait()
        d = Daemon(ditd, "--data-dir", data_dir, api_key="k1", model=model)
        d.request("DELETE", f"/v1/videos/{lid}")
        o = wait_video(d, qid)
        check(o.get("status") == "completed", "after SIGKILL: the queued clip runs", o)
        same_clip(qid, "after SIGKILL")
        d.stop()
        # a two-rank replica (mpirun -np 3: the front-end and ulysses 2): both ranks get the
        # image in the broadcast batch and make the same condition; the clip is one rank's
        if shutil.which("mpirun"):
            d = Daemon(ditd, "--ulysses-degree", "2", mpi_np=3, model=model)
            st, _, b = d.request("POST", "/v1/videos", dict(I2V_EXTRA, prompt=PROMPT, size="48x32",
                                                             input_reference=base64.b64encode(png).decode()))
            vid = json.loads(b).get("id") if st == 200 else None
            check(vid and wait_video(d, vid).get("status") == "completed", "ulysses 2: completed")
            st, _, thumb = d.request("GET", f"/v1/videos/{vid}/content?variant=thumbnail")
            px = th.png_pixels(thumb) if st == 200 and thumb[:4] == b"\x89PNG" else None
            check(px is not None and px == ref[0],
                  "ulysses 2: the thumbnail equals one rank's (ditd generate --image), bit for bit")
            checked += 1
    finally:
        d.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    check(checked >= 14, f"{checked} image-to-video cases checked (at least 14)")
    return 0


FLF2V_IMAGES = ("flf2v_9f_32x48_image.png", "flf2v_9f_32x48_last_image.png")  # both 48x32


def case_videos_flf2v(ditd):
    """last_frame_reference (ditd's field) on the tiny FLF2V folder: the openai client (the first
    frame a file, the last a data URL in extra_body: a text part), curl -F with two files and
    JSON (data URLs, {"image_url": ...}) each make `ditd generate --image A --last-image B`'s
    clip (thumbnail equal to its first PNG frame, pixel for pixel; every MP4 frame within codec
    error; the forms the same MP4 bytes); the last frame is kept in the stored body: a clip
    queued at a SIGKILL runs after the restart and is the same clip; /v1/models says both
    frames are required; the refusals name last_frame_reference (none, not base64,
    undecodable, an image URL, given twice, a one-frame clip naming num_frames); under mpirun
    a two-rank replica (ulysses 2) makes the same clip. (Its refusal on an I2V and a T2V model
    is in videos_i2v and videos.)"""
    if not shutil.which("ffprobe") or not shutil.which("curl"):
        print("skip: no ffprobe or curl")
        return 77
    import base64
    import sqlite3
    import openai
    tmp = tempfile.mkdtemp(prefix="ditd-videos-flf2v-")
    model = i2v_model(ditd, tmp, "flf2v")
    if not model:
        print("skip: no Wan FLF2V folder (the build assembles it)")
        shutil.rmtree(tmp, ignore_errors=True)
        return 77
    fix = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures",
                       "wan_pipeline", "expected_i2v")
    first, last = (os.path.join(fix, f) for f in FLF2V_IMAGES)
    png_a, png_b = open(first, "rb").read(), open(last, "rb").read()
    b64_a, b64_b = base64.b64encode(png_a).decode(), base64.b64encode(png_b).decode()
    out = os.path.join(tmp, "ref.png")
    r = subprocess.run([ditd, "generate", "--model", model, "--image", first, "--last-image", last,
                        "--prompt", PROMPT, "--size", "48x32", "--frames", "5", "--steps", "2",
                        "--seed", "5", "--threads", "1", "-q", "-o", out], capture_output=True,
                       text=True, timeout=300)
    check(r.returncode == 0, "ditd generate --image --last-image makes the reference clip",
          r.stderr[-300:])
    ref = []
    for i in range(5):
        p = os.path.join(tmp, "ref-%03d.png" % i)
        ref.append(th.png_pixels(open(p, "rb").read()) if os.path.exists(p) else None)
    # the first frame alone makes another clip: the last frame is used, not ignored
    r = subprocess.run([ditd, "generate", "--model", model, "--image", first, "--last-image", first, "--prompt", PROMPT, "--size",
                        "48x32", "--frames", "5", "--steps", "2", "--seed", "5", "--threads", "1",
                        "-q", "-o", os.path.join(tmp, "other.png")], capture_output=True,
                       text=True, timeout=300)
    other = os.path.join(tmp, "other-004.png")
    check(r.returncode == 0 and os.path.exists(other) and
          th.png_pixels(open(other, "rb").read()) != ref[4],
          "another last frame makes another clip (generate)", r.stderr[-300:])
    data_dir = os.path.join(tmp, "store")
    d = Daemon(ditd, "--data-dir", data_dir, api_key="k1", model=model)
    checked, first_mp4 = 0, []

    def same_clip(vid, how):
        nonlocal checked
        st, _, thumb = d.request("GET", f"/v1/videos/{vid}/content?variant=thumbnail")
        px = th.png_pixels(thumb) if st == 200 and thumb[:4] == b"\x89PNG" else None
        check(px is not None and px == ref[0],
              f"{how}: the thumbnail equals ditd generate --image --last-image's first frame")
        st, _, mp4 = d.request("GET", f"/v1/videos/{vid}/content")
        if first_mp4:  # the same pixels through the same encoder: the same file
            check(st == 200 and mp4 == first_mp4[0], f"{how}: the same MP4 bytes as the first clip's")
        else:  # the first clip: decoded, frame by frame
            check(st == 200 and probe(mp4) == ("h264", "yuv420p", 48, 32, "16/1", 5),
                  f"{how}: an H.264 MP4 of 5 frames, 48x32", probe(mp4) if st == 200 else st)
            worst = mp4_psnr(mp4, ref, 48, 32) if st == 200 else 0
            check(worst >= 30, f"{how}: every MP4 frame (the last one too) within codec error of "
                  "generate's (%.1f dB at worst, 30 asked)" % worst)
            first_mp4.append(mp4)
        checked += 1
    try:
        st, _, b = d.request("GET", "/v1/models/flf2v")
        vf = json.loads(b).get("video", {}) if st == 200 else {}
        check(vf.get("input_reference") == "required" and vf.get("last_frame_reference") == "required",
              "/v1/models: input_reference and last_frame_reference required", vf)
        # the official client: the first frame a file; the last (no such parameter) in extra_body
        c = openai.OpenAI(base_url=d.url("/v1"), api_key="k1", max_retries=0)
        with open(first, "rb") as f:
            v = c.videos.create_and_poll(model="flf2v", prompt=PROMPT, size="48x32",
                                         input_reference=f, poll_interval_ms=100,
                                         extra_body=dict(I2V_EXTRA, last_frame_reference=
                                                         "data:image/png;base64," + b64_b))
        check(v.status == "completed" and v.size == "48x32", "openai client: completed",
              (v.status, v.error))
        same_clip(v.id, "openai client")
        # both frames are in the stored body
        db = sqlite3.connect(os.path.join(data_dir, "jobs.db"))
        row = db.execute("SELECT request FROM jobs WHERE id = ?", (v.id,)).fetchone()
        db.close()
        q = json.loads(row[0]) if row else {}
        check(base64.b64decode(q.get("input_reference", "")) == png_a and
              q.get("last_frame_reference") == "data:image/png;base64," + b64_b,
              "the stored request keeps both frames")
        # curl's form, two files (the stored body: base64 of each file)
        r = subprocess.run(["curl", "-s", "-H", "Authorization: Bearer k1", "-F", "prompt=" + PROMPT,
                            "-F", "size=48x32", "-F", "seed=5", "-F", "num_inference_steps=2",
                            "-F", "num_frames=5", "-F", "input_reference=@" + first + ";type=image/png",
                            "-F", "last_frame_reference=@" + last + ";type=image/png",
                            d.url("/v1/videos")], capture_output=True, text=True, timeout=60)
        vid = json.loads(r.stdout).get("id") if r.stdout.startswith("{") else None
        check(vid and wait_video(d, vid).get("status") == "completed", "curl -F: completed",
              r.stdout[:300])
        same_clip(vid, "curl -F")
        db = sqlite3.connect(os.path.join(data_dir, "jobs.db"))
        row = db.execute("SELECT request FROM jobs WHERE id = ?", (vid,)).fetchone()
        db.close()
        check(row and base64.b64decode(json.loads(row[0]).get("last_frame_reference", "")) == png_b,
              "curl -F: the stored request keeps the last file as base64")
        # JSON: base64, data URLs, OpenAI's {"image_url": ...} object
        for how, a, z in (("JSON base64", b64_a, b64_b),
                          ("JSON data URL", "data:image/png;base64," + b64_a,
                           "data:image/png;base64," + b64_b),
                          ("JSON image_url", {"image_url": "data:image/png;base64," + b64_a},
                           {"image_url": "data:image/png;base64," + b64_b})):
            st, _, b = d.request("POST", "/v1/videos", dict(I2V_EXTRA, prompt=PROMPT, size="48x32",
                                                             input_reference=a,
                                                             last_frame_reference=z))
            vid = json.loads(b).get("id") if st == 200 else None
            check(vid and wait_video(d, vid).get("status") == "completed", f"{how}: completed",
                  (st, b[:300]))
            same_clip(vid, how)
        # refusals, naming last_frame_reference (num_frames for a one-frame clip)
        big = base64.b64encode(tiny_png(9000, 1)).decode()
        for body, param, needle in [
                ({}, "last_frame_reference", "give 'last_frame_reference'"),
                ({"last_frame_reference": None}, "last_frame_reference", "give 'last_frame_reference'"),
                ({"last_frame_reference": "@@@"}, "last_frame_reference", "not valid base64"),
                ({"last_frame_reference": "data:image/png;base64,AAAA"}, "last_frame_reference",
                 "last_frame_reference"),
                ({"last_frame_reference": big}, "last_frame_reference", "9000"),
                ({"last_frame_reference": "https://example.com/b.png"}, "last_frame_reference",
                 "not fetched"),
                ({"last_frame_reference": 7}, "last_frame_reference", "base64"),
                ({"last_frame_reference": b64_b, "num_frames": 1}, "num_frames", "at least 5")]:
            st, e = api_error(d, "POST", "/v1/videos", dict(dict(I2V_EXTRA, prompt="x", size="48x32",
                                                                 input_reference=b64_a), **body))
            check(st == 400 and e.get("param") == param and needle in e.get("message", ""),
                  f"{str(body)[:60]}: 400 naming {param} ({needle})", (st, e))
            checked += 1
        r = subprocess.run(["curl", "-s", "-H", "Authorization: Bearer k1", "-F", "prompt=x",
                            "-F", "input_reference=@" + first, "-F", "last_frame_reference=@" + last,
                            "-F", "last_frame_reference=@" + last, d.url("/v1/videos")],
                           capture_output=True, text=True, timeout=60)
        e = json.loads(r.stdout).get("error", {}) if r.stdout.startswith("{") else {}
        check(e.get("param") == "last_frame_reference" and "twice" in e.get("message", ""),
              "two last_frame_reference files: refused naming it", r.stdout[:300])
        r2 = subprocess.run(["curl", "-s", "-H", "Authorization: Bearer k1", "-F", "prompt=x",
                             "-F", "input_reference=@" + first, "-F",
                             "last_frame_reference=@" + os.devnull + ";filename=empty.png",
                             d.url("/v1/videos")], capture_output=True, text=True, timeout=60)
        e = json.loads(r2.stdout).get("error", {}) if r2.stdout.startswith("{") else {}
        check(e.get("param") == "last_frame_reference", "an empty last_frame_reference file: "
              "refused naming it", r2.stdout[:300])
        checked += 2
        # a restart: a clip queued behind a long one at a SIGKILL runs after it, the same clip
        st, _, b = d.request("POST", "/v1/videos", dict(I2V_EXTRA, prompt="long", size="48x32",
                                                         num_frames=9, num_inference_steps=500,
                                                         input_reference=b64_a,
                                                         last_frame_reference=b64_b))
        lid = json.loads(b).get("id")
        st, _, b = d.request("POST", "/v1/videos", dict(I2V_EXTRA, prompt=PROMPT, size="48x32",
                                                         input_reference=b64_a,
                                                         last_frame_reference=b64_b))
        qid = json.loads(b).get("id")
        _, _, b = d.request("GET", f"/v1/videos/{qid}")
        check(json.loads(b).get("status") == "queued", "the second clip is queued behind the long one")
        os.killpg(d.proc.pid, signal.SIGKILL)
        d.proc.wait()
        d = Daemon(ditd, "--data-dir", data_dir, api_key="k1", model=model)
        d.request("DELETE", f"/v1/videos/{lid}")
        o = wait_video(d, qid)
        check(o.get("status") == "completed", "after SIGKILL: the queued clip runs", o)
        same_clip(qid, "after SIGKILL")
        d.stop()
        # a two-rank replica (mpirun -np 3: the front-end and ulysses 2): both ranks get both
        # frames in the broadcast batch and make the same condition; the clip is one rank's
        if shutil.which("mpirun"):
            d = Daemon(ditd, "--ulysses-degree", "2", mpi_np=3, model=model)
            st, _, b = d.request("POST", "/v1/videos", dict(I2V_EXTRA, prompt=PROMPT, size="48x32",
                                                             input_reference=b64_a,
                                                             last_frame_reference=b64_b))
            vid = json.loads(b).get("id") if st == 200 else None
            check(vid and wait_video(d, vid).get("status") == "completed", "ulysses 2: completed")
            st, _, thumb = d.request("GET", f"/v1/videos/{vid}/content?variant=thumbnail")
            px = th.png_pixels(thumb) if st == 200 and thumb[:4] == b"\x89PNG" else None
            check(px is not None and px == ref[0],
                  "ulysses 2: the thumbnail equals one rank's (ditd generate), bit for bit")
            st, _, mp4 = d.request("GET", f"/v1/videos/{vid}/content")
            check(st == 200 and first_mp4 and mp4 == first_mp4[0],
                  "ulysses 2: the same MP4 bytes as one rank's")
            checked += 1
    finally:
        d.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    check(checked >= 17, f"{checked} first-last-frame cases checked (at least 17)")
    return 0


CASES = {"videos": case_videos, "videos_i2v": case_videos_i2v, "videos_flf2v": case_videos_flf2v, "videos_webhook": case_videos_webhook, "videos_restart": case_videos_restart, "videos_mpi": case_videos_mpi}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ditd", required=True)
    ap.add_argument("case", choices=sorted(CASES))
    a = ap.parse_args()
    t0 = time.time()
    rc = CASES[a.case](os.path.abspath(a.ditd))
    print(f"{a.case}: {time.time() - t0:.1f} s, {len(th.failures)} failure(s)")
    if rc == 77:
        return 77
    return 1 if th.failures else 0


if __name__ == "__main__":
    sys.exit(main())
