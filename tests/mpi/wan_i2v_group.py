#!/usr/bin/env python3
"""`mpirun -np G ditd generate --image` on WanImageToVideoPipeline folders (issue 21): layouts
equal to one rank.

For the Wan 2.1 I2V-like case (the CLIP image embeddings in both passes, the 36-channel input)
under cfg 2 and ulysses 2, and the TI2V-5B-like image-mode case (the first latent frame
replaced, its timestep 0 through per-frame timesteps) under ring 2 (p2p) and tp 2, of
tests/fixtures/wan_pipeline/expected_i2v/cases.json: ditd generate with Diffusers' noise
(--latents) writes final latents within 1e-4 relative of one rank's and of Diffusers'. At least
4 runs are checked. Stdlib.

usage: wan_i2v_group.py DITD MPIRUN WAN_PIPELINE_DIR FIXTURES_DIR
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
RUNS = [("i2v21_5f_32x48", 2, ["--cfg-degree", "2"]),
        ("i2v21_5f_32x48", 2, ["--ulysses-degree", "2"]),
        ("ti2vi_5f_64x32", 2, ["--ring-degree", "2", "--ring-rotate", "p2p"]),
        ("ti2vi_5f_64x32", 2, ["--tp-degree", "2"])]

tmp = tempfile.mkdtemp(prefix="wan_i2v_group.")
cases = {c["name"]: c for c in json.load(open(os.path.join(fix, "cases.json")))["cases"]}
one_lat, checked = {}, 0
for name, np_, flags in RUNS:
    c = cases.get(name)
    if c is None:
        fail("%s: not in cases.json" % name)
        continue
    common = ["generate", "--model", os.path.join(pipes, c["folder"]),
              "--image", os.path.join(fix, c["image"]), "--prompt", c["prompts"][0],
              "--frames", str(c["num_frames"]), "--size", "%dx%d" % (c["width"], c["height"]),
              "--steps", str(c["num_inference_steps"]), "--guidance", str(c["guidance_scale"]),
              "--max-sequence-length", str(c["max_sequence_length"]),
              "--latents", os.path.join(fix, c["noise"]), "--threads", "1", "-q"]
    if c.get("negative_prompts"):
        common += ["--negative-prompt", c["negative_prompts"][0]]
    if name not in one_lat:
        one = os.path.join(tmp, name + "-one")
        r = subprocess.run([ditd] + common + ["--save-latents", one + ".npy"],
                           capture_output=True, text=True, timeout=300)
        if r.returncode != 0:
            fail("%s: one rank: exit %d: %s" % (name, r.returncode, r.stderr.strip()[-400:]))
            continue
        one_lat[name] = read_npy(one + ".npy")[1]
    tag = "%s %s" % (name, " ".join(flags))
    out = os.path.join(tmp, "%s-%d" % (name, checked))
    r = subprocess.run([mpirun, "--oversubscribe", "-np", str(np_), ditd] + common + flags +
                       ["--save-latents", out + ".npy"], capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        fail("%s: exit %d: %s" % (tag, r.returncode, r.stderr.strip()[-600:]))
        continue
    lat = read_npy(out + ".npy")[1]
    e1, ed = rel(lat, one_lat[name]), rel(lat, read_npy(os.path.join(fix, c["final_latents"]))[1])
    if not (e1 <= 1e-4 and ed <= 1e-4):
        fail("%s: latents %.3g relative to one rank, %.3g to Diffusers (1e-4)" % (tag, e1, ed))
    print("ok %s: latents %.2g vs one rank, %.2g vs Diffusers" % (tag, e1, ed))
    checked += 1

shutil.rmtree(tmp, ignore_errors=True)
print("%d runs checked" % checked)
if checked < len(RUNS):
    fail("too few checked: %d (%d)" % (checked, len(RUNS)))
sys.exit(1 if failures else 0)
