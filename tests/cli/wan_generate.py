#!/usr/bin/env python3
"""ditd generate on a WanPipeline folder (issue 21): clips end to end.

For each case of tests/fixtures/wan_pipeline/expected/cases.json (Diffusers'
WanPipeline in float64, its noise given with --latents), `ditd generate
--frames N --size WxH -o clip.mp4 --save-frames --save-latents` must give:
  - final latents (n, C, T, h, w) within 1e-4 relative of Diffusers';
  - PNG frames within one 8-bit level of Diffusers' frames;
  - an MP4 whose stream (ffprobe) has the clip's frame count, size and fps,
    its first frame within codec error of the PNG frame: PSNR >= 30 dB
    against the PNG frame put through the same 4:2:0 conversion by ffmpeg.
Then the refusals: a frame count past the model's limit, --frames on an
image model, -o with another extension, --guidance-2 on a one-expert model.
At least 4 clips (a two-expert and a TI2V one among them) and 5 refusals
are checked. (`ditd serve` serves clips at /v1/videos: tests/http/test_videos.py.) Stdlib plus the ffmpeg/ffprobe commands (deploy/install-deps.sh), which also decode the PNG frames.

usage: wan_generate.py DITD WAN_PIPELINE_DIR FIXTURES_DIR
"""
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile

ditd, pipes, fix = sys.argv[1:4]
failures = []


def fail(msg):
    print("FAIL", msg)
    failures.append(msg)


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from wan_generate_util import png_rgb, read_npy  # noqa: E402


def run(args):
    return subprocess.run([ditd, "generate"] + args, capture_output=True, text=True)


tmp = tempfile.mkdtemp(prefix="wan_generate.")
cases = json.load(open(os.path.join(fix, "cases.json")))["cases"]
checked = 0
kinds = set()
for c in cases:
    if c["batch"] != 1 or c.get("num_videos_per_prompt", 1) != 1 or c.get("negative_prompts"):
        continue
    name, out = c["name"], os.path.join(tmp, c["name"])
    args = ["--model", os.path.join(pipes, c["folder"]), "--prompt", c["prompts"][0],
            "--frames", str(c["num_frames"]), "--size", "%dx%d" % (c["width"], c["height"]),
            "--steps", str(c["num_inference_steps"]), "--guidance", str(c["guidance_scale"]),
            "--max-sequence-length", str(c["max_sequence_length"]),
            "--latents", os.path.join(fix, c["noise"]), "--save-latents", out + ".npy",
            "-o", out + ".mp4", "--save-frames", "--threads", "1", "-q"]
    if "guidance_scale_2" in c:
        args += ["--guidance-2", str(c["guidance_scale_2"])]
    r = run(args)
    if r.returncode != 0:
        fail("%s: exit %d: %s" % (name, r.returncode, r.stderr.strip()))
        continue
    mp4 = "without FFmpeg" not in r.stderr
    shape, got = read_npy(out + ".npy")
    rshape, ref = read_npy(os.path.join(fix, c["final_latents"]))
    if shape != rshape:
        fail("%s: latents %s, Diffusers %s" % (name, shape, rshape))
        continue
    scale = max(abs(v) for v in ref)
    rel = max(abs(a - b) for a, b in zip(got, ref)) / scale
    if not rel <= 1e-4:
        fail("%s: final latents %.3g relative (1e-4)" % (name, rel))
    fshape, fref = read_npy(os.path.join(fix, c["frames_u8"]))  # (B, F, H, W, 3)
    F, H, W = fshape[1], fshape[2], fshape[3]
    if F != c["num_frames_rounded"]:
        fail("%s: Diffusers' clip has %d frames, the case says %d" % (name, F, c["num_frames_rounded"]))
    worst = 0
    for f in range(F):
        p = "%s-%03d.png" % (out, f)
        if not os.path.exists(p):
            fail("%s: %s not written" % (name, p))
            break
        px = png_rgb(p, W, H)
        if px is None:
            fail("%s: frame %d is not a %dx%d RGB PNG" % (name, f, W, H))
            break
        ref_f = fref[f * H * W * 3:(f + 1) * H * W * 3]
        worst = max(worst, max(abs(a - b) for a, b in zip(px, ref_f)))
    if worst > 1:
        fail("%s: frames %d levels off Diffusers' (1)" % (name, worst))
    print("ok %s: latents %.2g relative, frames worst %d level(s)" % (name, rel, worst))
    if mp4:
        probe = subprocess.run(["ffprobe", "-v", "error", "-count_frames", "-select_streams", "v:0",
                                "-show_entries", "stream=codec_name,pix_fmt,width,height,r_frame_rate,nb_read_frames",
                                "-of", "json", out + ".mp4"], capture_output=True, text=True)
        st = json.loads(probe.stdout)["streams"][0] if probe.returncode == 0 else {}
        want = {"codec_name": "h264", "pix_fmt": "yuv420p", "width": W, "height": H,
                "r_frame_rate": "16/1", "nb_read_frames": str(F)}
        for k, v in want.items():
            if st.get(k) != v:
                fail("%s: mp4 %s = %r, expected %r" % (name, k, st.get(k), v))
        raw = subprocess.run(["ffmpeg", "-v", "error", "-i", out + ".mp4", "-frames:v", "1",
                              "-f", "rawvideo", "-pix_fmt", "rgb24", "-"], capture_output=True).stdout
        # codec error: the PNG frame through the same 4:2:0 conversion (what
        # chroma subsampling alone costs; noise-like tiny clips lose ~20 dB
        # there), against the H.264 frame (CRF 18)
        yuv = subprocess.run(["ffmpeg", "-v", "error", "-i", out + "-000.png", "-pix_fmt", "yuv420p",
                              "-f", "rawvideo", "-"], capture_output=True).stdout
        px0 = subprocess.run(["ffmpeg", "-v", "error", "-f", "rawvideo", "-pix_fmt", "yuv420p",
                              "-s", "%dx%d" % (W, H), "-i", "-", "-f", "rawvideo", "-pix_fmt", "rgb24",
                              "-"], input=yuv, capture_output=True).stdout
        if len(raw) != len(px0):
            fail("%s: mp4 first frame %d bytes, PNG %d" % (name, len(raw), len(px0)))
        else:
            mse = sum((a - b) ** 2 for a, b in zip(raw, px0)) / len(px0)
            psnr = 99.0 if mse == 0 else 10 * math.log10(255 * 255 / mse)
            if psnr < 30:
                fail("%s: mp4 first frame %.1f dB PSNR against the PNG frame in 4:2:0 (30)" % (name, psnr))
            print("ok %s: mp4 %s %dx%d %s fps %s frames, first frame %.1f dB" % (
                name, st.get("codec_name"), W, H, st.get("r_frame_rate"), st.get("nb_read_frames"), psnr))
    else:
        print("note %s: ditd built without FFmpeg, mp4 not checked" % name)
    checked += 1
    kinds.add(c["folder"])

refusals = 0
wan = os.path.join(pipes, "wan21")
for args, needle in [
        (["--model", wan, "--prompt", "a", "--frames", "100001", "-o", tmp + "/x.mp4"], "--frames"),
        (["--model", wan, "--prompt", "a", "--frames", "5", "-o", tmp + "/x.gif"], "writes clips"),
        (["--frames", "5", "-o", tmp + "/x.png"], "makes images"),  # the embedded image model
        (["--model", wan, "--prompt", "a", "--frames", "5000", "-o", tmp + "/x.png"], "--frames"),
        (["--model", wan, "--prompt", "a", "--frames", "5", "--guidance-2", "3", "-o", tmp + "/x.png"],
         "one transformer")]:
    r = run(args)
    if r.returncode == 0 or needle not in r.stderr:
        fail("refusal %s: exit %d, stderr %r (wanted %r)" % (args, r.returncode, r.stderr, needle))
    refusals += 1


shutil.rmtree(tmp, ignore_errors=True)
print("%d clips, %d refusals checked" % (checked, refusals))
if checked < 4 or refusals < 5 or kinds != {"wan21", "wan22", "ti2v"}:
    fail("too few checked: %d clips (4), %d refusals (5), folders %s" % (checked, refusals,
                                                                        sorted(kinds)))
sys.exit(1 if failures else 0)
