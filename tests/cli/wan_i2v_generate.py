#!/usr/bin/env python3
"""ditd generate --image on WanImageToVideoPipeline folders (issue 21).

For each single-video case of tests/fixtures/wan_pipeline/expected_i2v/cases.json
(Diffusers' WanImageToVideoPipeline in float64, its noise given with --latents),
`ditd generate --image IN.png --frames N --size WxH -o clip.png --save-latents` must give
the final latents within 1e-4 relative of Diffusers' and PNG frames within one 8-bit level.
Then the refusals: no --image on an image-to-video folder, --image on WanPipeline,
--strength with image-to-video, an FLF2V folder without its last image, --last-image on
WanPipeline. FLF2V's case runs with --last-image, TI2V's second with an image of another size
(resized). At least 6 clips (Wan 2.1 I2V, Wan 2.2 I2V-A14B, TI2V-5B in image mode, FLF2V) and
5 refusals are checked. Stdlib plus ffmpeg (PNG decoding), as wan_generate.py.

usage: wan_i2v_generate.py DITD WAN_PIPELINE_DIR FIXTURES_DIR
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
ditd, pipes, fix = sys.argv[1:4]
failures = []


def fail(msg):
    print("FAIL", msg)
    failures.append(msg)


def run(args):
    return subprocess.run([ditd, "generate"] + args, capture_output=True, text=True)


from wan_generate_util import png_rgb, read_npy  # noqa: E402

tmp = tempfile.mkdtemp(prefix="wan_i2v_generate.")
cases = json.load(open(os.path.join(fix, "cases.json")))["cases"]
checked, kinds = 0, set()
for c in cases:
    if c["batch"] != 1:
        continue
    name, out = c["name"], os.path.join(tmp, c["name"])
    args = ["--model", os.path.join(pipes, c["folder"]), "--image", os.path.join(fix, c["image"]),
            "--prompt", c["prompts"][0], "--frames", str(c["num_frames"]),
            "--size", "%dx%d" % (c["width"], c["height"]),
            "--steps", str(c["num_inference_steps"]), "--guidance", str(c["guidance_scale"]),
            "--max-sequence-length", str(c["max_sequence_length"]),
            "--latents", os.path.join(fix, c["noise"]), "--save-latents", out + ".npy",
            "-o", out + ".png", "--threads", "1", "-q"]
    if c.get("negative_prompts"):
        args += ["--negative-prompt", c["negative_prompts"][0]]
    if c.get("last_image"):  # FLF2V
        args += ["--last-image", os.path.join(fix, c["last_image"])]
    if "guidance_scale_2" in c:
        args += ["--guidance-2", str(c["guidance_scale_2"])]
    r = run(args)
    if r.returncode != 0:
        fail("%s: exit %d: %s" % (name, r.returncode, r.stderr.strip()))
        continue
    shape, got = read_npy(out + ".npy")
    rshape, ref = read_npy(os.path.join(fix, c["final_latents"]))
    if shape != rshape:
        fail("%s: latents %s, Diffusers %s" % (name, shape, rshape))
        continue
    rel = max(abs(a - b) for a, b in zip(got, ref)) / max(abs(v) for v in ref)
    if not rel <= 1e-4:
        fail("%s: final latents %.3g relative (1e-4)" % (name, rel))
    fshape, fref = read_npy(os.path.join(fix, c["frames_u8"]))  # (B, F, H, W, 3)
    F, H, W = fshape[1], fshape[2], fshape[3]
    worst = 0
    for f in range(F):
        px = png_rgb("%s-%03d.png" % (out, f), W, H)
        if px is None:
            fail("%s: frame %d is not a %dx%d RGB PNG" % (name, f, W, H))
            worst = 99
            break
        worst = max(worst, max(abs(a - b) for a, b in zip(px, fref[f * H * W * 3:(f + 1) * H * W * 3])))
    if worst > 1:
        fail("%s: frames %d levels off Diffusers' (1)" % (name, worst))
    if checked == 0:  # --save-latents alone (no -o: no decode) gives the same latents
        lat_only = out + "-latents-only.npy"
        i = args.index("--save-latents")
        r2 = run(args[:i] + ["--save-latents", lat_only] + [x for x in args[i + 2:] if x not in ("-o", out + ".png")])
        if r2.returncode != 0 or not os.path.exists(lat_only) or read_npy(lat_only)[1] != got:
            fail("%s: --save-latents without -o: exit %d %s" % (name, r2.returncode, r2.stderr[-300:]))
    print("ok %s: latents %.2g relative, %d frames worst %d level(s)" % (name, rel, F, worst))
    checked += 1
    kinds.add(c["folder"])

refusals = 0
i2v, t2v = os.path.join(pipes, "i2v21"), os.path.join(pipes, "wan21")
img = os.path.join(fix, cases[0]["image"])
for args, needle in [
        (["--model", i2v, "--prompt", "a", "--frames", "5", "-o", tmp + "/x.png"], "give --image"),
        (["--model", t2v, "--prompt", "a", "--frames", "5", "--image", img, "-o", tmp + "/x.png"],
         "takes no input image"),
        (["--model", i2v, "--prompt", "a", "--frames", "5", "--image", img, "--strength", "0.5",
          "-o", tmp + "/x.png"], "--strength"),
        (["--model", os.path.join(pipes, "flf2v"), "--prompt", "a", "--frames", "5", "--image", img,
          "--size", "48x32", "-o", tmp + "/x.png"], "last image"),
        (["--model", t2v, "--prompt", "a", "--frames", "5", "--image", img, "--last-image", img,
          "-o", tmp + "/x.png"], "not an image-to-video pipeline")]:
    r = run(args)
    if r.returncode == 0 or needle not in r.stderr:
        fail("refusal %s: exit %d, stderr %r (wanted %r)" % (args, r.returncode, r.stderr, needle))
    refusals += 1

shutil.rmtree(tmp, ignore_errors=True)
print("%d clips, %d refusals checked" % (checked, refusals))
if checked < 6 or refusals < 5 or kinds != {"i2v21", "i2v22", "ti2vi", "flf2v"}:
    fail("too few checked: %d clips (6), %d refusals (5), folders %s" % (checked, refusals,
                                                                        sorted(kinds)))
sys.exit(1 if failures else 0)
