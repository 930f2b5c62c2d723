#!/usr/bin/env python3
"""`mpirun -np G ditd generate --image` on the FLUX.1-dev folder (issue 23): every layout equal
to one rank.

For two cases of tests/fixtures/flux_img2img/expected/cases.json (strength 0.3, and 0.75 with true
CFG and a negative prompt), ditd generate from the seed alone (the posterior draw and the noise are
Philox streams, the image encoded by the whole group together: the leader must say "encoded on G
ranks", the 4-row latent split over them) under ulysses 2, ring 2 (p2p), tp 2, cfg 2 and
cfg 2 x ulysses 2 writes, from the leader, final latents within 1e-4 relative of one rank's and of
Diffusers' float64 run. And inpainting (`--mask`, tests/fixtures/flux_inpaint beside it): the
true-CFG case with a batch of two under cfg 2 x ulysses 2 (the mask blend runs on every rank of
both cfg halves). At least 2 cases x 5 layouts + 1 are checked. Stdlib only.

usage: img2img_group.py DITD MPIRUN FLUX_DEV_DIR FIXTURES_DIR
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from group_check import fail, failures, read_npy, rel  # noqa: E402

ditd, mpirun, model, fix = sys.argv[1:5]
LAYOUTS = [
    (2, ["--ulysses-degree", "2"]),
    (2, ["--ring-degree", "2", "--ring-rotate", "p2p"]),
    (2, ["--tp-degree", "2"]),
    (2, ["--cfg-degree", "2"]),
    (4, ["--cfg-degree", "2", "--ulysses-degree", "2"]),
]
CASES = ("dev_32x48_s03", "dev_32x48_s075_true_cfg")
INPAINT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(fix))), "flux_inpaint", "expected")
RUNS = [(fix, n, LAYOUTS) for n in CASES] + [(INPAINT, "dev_32x48_s075_batch2_true_cfg", LAYOUTS[4:])]


tmp = tempfile.mkdtemp(prefix="img2img_group.")
checked = 0
for fdir, name, layouts in RUNS:
    c = {c["name"]: c for c in json.load(open(os.path.join(fdir, "cases.json")))["cases"]}[name]
    args = ["generate", "--model", model, "--prompt", c["prompt"], "-n", str(c["batch"]),
            "--image", os.path.join(fdir, c["image"]), "--strength", repr(c["strength"]),
            "--steps", str(c["num_inference_steps"]), "--guidance", repr(c["guidance_scale"]),
            "--max-sequence-length", str(c["max_sequence_length"]), "--seed", str(c["seed"]),
            "--dtype", "f32", "--threads", "1", "-q"]
    if c.get("mask"):
        args += ["--mask", os.path.join(fdir, c["mask"])]
    if c["negative_prompt"]:
        args += ["--negative-prompt", c["negative_prompt"], "--true-cfg", repr(c["true_cfg_scale"])]
    one = os.path.join(tmp, name + "-1.npy")
    r = subprocess.run([ditd] + args + ["--save-latents", one], capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        fail(f"{name}: one rank: exit {r.returncode}: {r.stderr[-600:]}")
        continue
    _, ref1 = read_npy(one)
    _, ref = read_npy(os.path.join(fdir, c["final_latents"]))
    e = rel(ref1, ref)
    print(f"{name}: one rank vs Diffusers float64: rel {e:.3g}")
    if e > 1e-4:
        fail(f"{name}: one rank vs Diffusers rel {e:.3g} > 1e-4")
    for np_, lay in layouts:
        out = os.path.join(tmp, f"{name}-{'-'.join(lay).replace('--', '')}.npy")
        # not quiet: the leader's img2img line says how many ranks encoded the image
        cmd = [mpirun, "-np", str(np_), ditd] + [a for a in args if a != "-q"] + lay + ["--save-latents", out]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=150)
        if r.returncode != 0:
            fail(f"{name} {' '.join(lay)}: exit {r.returncode}: {r.stderr[-600:]}")
            continue
        if f"encoded on {np_} ranks" not in r.stderr:
            fail(f"{name} {' '.join(lay)}: the image was not encoded on the group of {np_}: "
                 f"{[l for l in r.stderr.splitlines() if 'img2img' in l or 'inpaint' in l]}")
            continue
        _, got = read_npy(out)
        e1, ed = rel(got, ref1), rel(got, ref)
        print(f"{name} np {np_} {' '.join(lay)}: vs one rank rel {e1:.3g}, vs Diffusers rel {ed:.3g}")
        if e1 > 1e-4 or ed > 1e-4:
            fail(f"{name} {' '.join(lay)}: rel {e1:.3g} (one rank) {ed:.3g} (Diffusers) > 1e-4")
            continue
        checked += 1
shutil.rmtree(tmp, ignore_errors=True)
want = sum(len(r[2]) for r in RUNS)
if checked < want:
    fail(f"{checked} case x layout runs checked, want {want}")
print(f"{checked} runs checked, {len(failures)} failures")
sys.exit(1 if failures else 0)
