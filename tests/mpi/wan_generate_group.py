#!/usr/bin/env python3
"""`mpirun -np G ditd generate` on WanPipeline folders (issue 21): every layout equal to one rank.

For a Wan 2.2 A14B-like case (two experts, the switch inside the schedule, CFG) and a TI2V-5B-like
one (expand_timesteps, the 48-channel residual VAE) of tests/fixtures/wan_pipeline/expected/
cases.json, ditd generate with Diffusers' noise (--latents) under ulysses 2, ring 2 (p2p), USP
(ulysses 2 x ring 2), tp 2, cfg 2 and cfg 2 x ulysses 2 writes, from the leader:
  - final latents within 1e-4 relative of one rank's and of Diffusers';
  - PNG frames within one 8-bit level of one rank's (the decode runs on the leader from
    latents within 1e-4, so a value on a rounding edge may move one level; how many do is
    printed).
At least 2 cases x 6 layouts are checked. Stdlib plus ffmpeg to read the PNG frames.

usage: wan_generate_group.py DITD MPIRUN WAN_PIPELINE_DIR FIXTURES_DIR
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from group_check import fail, failures, read_npy, rel  # noqa: E402

ditd, mpirun, pipes, fix = sys.argv[1:5]
LAYOUTS = [
    (2, ["--ulysses-degree", "2"]),
    (2, ["--ring-degree", "2", "--ring-rotate", "p2p"]),
    (4, ["--ulysses-degree", "2", "--ring-degree", "2", "--ring-rotate", "p2p"]),
    (2, ["--tp-degree", "2"]),
    (2, ["--cfg-degree", "2"]),
    (4, ["--cfg-degree", "2", "--ulysses-degree", "2"]),
]
CASES = ("wan22_5f_32x48_experts", "ti2v_5f_64x32")


def frame(path):
    r = subprocess.run(["ffmpeg", "-v", "error", "-i", path, "-f", "rawvideo", "-pix_fmt", "rgb24", "-"],
                       capture_output=True)
    return r.stdout if r.returncode == 0 else None


tmp = tempfile.mkdtemp(prefix="wan_generate_group.")
cases = {c["name"]: c for c in json.load(open(os.path.join(fix, "cases.json")))["cases"]}
checked = 0
for name in CASES:
    c = cases.get(name)
    if c is None:
        fail("%s: not in cases.json" % name)
        continue
    common = ["generate", "--model", os.path.join(pipes, c["folder"]), "--prompt", c["prompts"][0],
              "--frames", str(c["num_frames"]), "--size", "%dx%d" % (c["width"], c["height"]),
              "--steps", str(c["num_inference_steps"]), "--guidance", str(c["guidance_scale"]),
              "--max-sequence-length", str(c["max_sequence_length"]),
              "--latents", os.path.join(fix, c["noise"]), "--threads", "1", "-q"]
    one = os.path.join(tmp, name + "-one")
    r = subprocess.run([ditd] + common + ["--save-latents", one + ".npy", "-o", one + ".png"],
                       capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        fail("%s: one rank: exit %d: %s" % (name, r.returncode, r.stderr.strip()[-400:]))
        continue
    _, ref = read_npy(os.path.join(fix, c["final_latents"]))
    _, lat1 = read_npy(one + ".npy")
    F = c["num_frames_rounded"]
    for np_, flags in LAYOUTS:
        tag = "%s %s" % (name, " ".join(flags))
        out = os.path.join(tmp, "%s-%d-%d" % (name, np_, checked))
        r = subprocess.run([mpirun, "--oversubscribe", "-np", str(np_), ditd] + common + flags +
                           ["--save-latents", out + ".npy", "-o", out + ".png"],
                           capture_output=True, text=True, timeout=300)
        if r.returncode != 0:
            fail("%s: exit %d: %s" % (tag, r.returncode, r.stderr.strip()[-600:]))
            continue
        _, lat = read_npy(out + ".npy")
        e1, ed = rel(lat, lat1), rel(lat, ref)
        if not (e1 <= 1e-4 and ed <= 1e-4):
            fail("%s: latents %.3g relative to one rank, %.3g to Diffusers (1e-4)" % (tag, e1, ed))
        worst, off = 0, 0
        for f in range(F):
            a, b = frame("%s-%03d.png" % (out, f)), frame("%s-%03d.png" % (one, f))
            if a is None or b is None or len(a) != len(b):
                fail("%s: frame %d missing or of another size" % (tag, f))
                break
            d = [abs(x - y) for x, y in zip(a, b)]
            worst, off = max(worst, max(d)), off + sum(1 for v in d if v)
        if worst > 1:
            fail("%s: frames %d levels off one rank's" % (tag, worst))
        print("ok %s: latents %.2g vs one rank, %.2g vs Diffusers; frames worst %d (%d values off)"
              % (tag, e1, ed, worst, off))
        checked += 1

shutil.rmtree(tmp, ignore_errors=True)
print("%d case x layout runs checked" % checked)
if checked < len(CASES) * len(LAYOUTS):
    fail("too few checked: %d (%d)" % (checked, len(CASES) * len(LAYOUTS)))
sys.exit(1 if failures else 0)
