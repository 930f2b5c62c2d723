#!/usr/bin/env python3
"""`mpirun -np G ditd generate --image REF.png` on a FluxKontextPipeline folder (issue 23): every
layout equal to one rank.

The tiny FLUX.1-dev folder under a model_index.json naming FluxKontextPipeline (a temporary folder
linking dev's components), and two cases of tests/fixtures/flux_kontext/expected/cases.json: a
reference of another aspect ratio (6 noise tokens + 8 reference tokens beside 77 text tokens) and
true CFG with a negative prompt (6 + 4). Kontext's sequence (text + noise + reference tokens)
splits over the cp ranks as any other: under ulysses 2, ring 2 (p2p), ring 3 (14 image tokens in
5 + 5 + 4, 77 text tokens in 26 + 26 + 25: uneven), tp 2 and cfg 2, ditd generate from the seed
alone writes, from the leader, final latents within 1e-4 relative of one rank's and of Diffusers'
float64 run. At least 2 cases x 5 layouts are checked. Stdlib only.

usage: kontext_group.py DITD MPIRUN FLUX_DEV_DIR FIXTURES_DIR
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from group_check import fail, failures, read_npy, rel  # noqa: E402

ditd, mpirun, dev, fix = sys.argv[1:5]
LAYOUTS = [
    (2, ["--ulysses-degree", "2"]),
    (2, ["--ring-degree", "2", "--ring-rotate", "p2p"]),
    (3, ["--ring-degree", "3"]),
    (2, ["--tp-degree", "2"]),
    (2, ["--cfg-degree", "2"]),
]
CASES = ("ref_other_ar", "true_cfg")

tmp = tempfile.mkdtemp(prefix="kontext_group.")
model = os.path.join(tmp, "kontext")
os.mkdir(model)
for part in os.listdir(dev):
    if part != "model_index.json":
        os.symlink(os.path.join(os.path.abspath(dev), part), os.path.join(model, part))
mi = json.load(open(os.path.join(dev, "model_index.json")))
mi["_class_name"] = "FluxKontextPipeline"
json.dump(mi, open(os.path.join(model, "model_index.json"), "w"), indent=2)

checked = 0
cases = {c["name"]: c for c in json.load(open(os.path.join(fix, "cases.json")))["cases"]}
for name in CASES:
    c = cases[name]
    args = ["generate", "--model", model, "--prompt", c["prompt"], "-n", str(c["batch"]),
            "--image", os.path.join(fix, c["refs"][0]["png"]),
            "--size", f"{c['request_width']}x{c['request_height']}", "--max-area", str(c["max_area"]),
            "--steps", str(c["num_inference_steps"]), "--guidance", repr(c["guidance_scale"]),
            "--max-sequence-length", str(c["max_sequence_length"]), "--seed", str(c["seed"]),
            "--dtype", "f32", "--threads", "1", "-q"]
    if not c["auto_resize"]:
        args += ["--no-auto-resize"]
    if c["negative_prompt"]:
        args += ["--negative-prompt", c["negative_prompt"], "--true-cfg", repr(c["true_cfg_scale"])]
    one = os.path.join(tmp, name + "-1.npy")
    r = subprocess.run([ditd] + args + ["--save-latents", one], capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        fail(f"{name}: one rank: exit {r.returncode}: {r.stderr[-600:]}")
        continue
    _, ref1 = read_npy(one)
    _, ref = read_npy(os.path.join(fix, c["final_latents"]))
    e = rel(ref1, ref)
    print(f"{name}: one rank vs Diffusers float64: rel {e:.3g}")
    if e > 1e-4:
        fail(f"{name}: one rank vs Diffusers rel {e:.3g} > 1e-4")
    for np_, lay in LAYOUTS:
        out = os.path.join(tmp, f"{name}-{'-'.join(lay).replace('--', '')}.npy")
        cmd = [mpirun, "-np", str(np_), ditd] + args + lay + ["--save-latents", out]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=150)
        if r.returncode != 0:
            fail(f"{name} {' '.join(lay)}: exit {r.returncode}: {r.stderr[-600:]}")
            continue
        _, got = read_npy(out)
        e1, ed = rel(got, ref1), rel(got, ref)
        print(f"{name} np {np_} {' '.join(lay)}: vs one rank rel {e1:.3g}, vs Diffusers rel {ed:.3g}")
        if e1 > 1e-4 or ed > 1e-4:
            fail(f"{name} {' '.join(lay)}: rel {e1:.3g} (one rank) {ed:.3g} (Diffusers) > 1e-4")
            continue
        checked += 1
shutil.rmtree(tmp, ignore_errors=True)
want = len(CASES) * len(LAYOUTS)
if checked < want:
    fail(f"{checked} case x layout runs checked, want {want}")
print(f"{checked} runs checked, {len(failures)} failures")
sys.exit(1 if failures else 0)
