#!/usr/bin/env python3
"""`mpirun -np G ditd generate --image [--mask]` on the SD3 folder (issue 23): every layout equal
to one rank.

For two cases of tests/fixtures/sd3_img2img/expected/cases.json -- StableDiffusion3Img2ImgPipeline
at strength 0.75 with CFG over a negative prompt and prompt_3, and StableDiffusion3InpaintPipeline
at 0.75 with a mask with holes and a negative prompt -- ditd generate from the seed alone (the
posterior draw and the noise are Philox streams, the image encoded on every rank) under ulysses 2,
ring 2 (p2p), tp 2 and cfg 2 writes, from the leader, final latents within 1e-4 relative of one
rank's and of Diffusers' float64 run, and PNGs within one 8-bit level of one rank's (the layouts
sum in other orders: latents a few 1e-7 apart can round a pixel the other way). At least 2 cases x 4 layouts
are checked. Stdlib only.

usage: sd3_edit_group.py DITD MPIRUN SD3_PIPELINE_DIR FIXTURES_DIR
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from group_check import fail, failures, read_npy, rel  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "http"))
from test_http import png_pixels  # noqa: E402  (stdlib: the PNG's 8-bit samples)

ditd, mpirun, root, fix = sys.argv[1:5]
LAYOUTS = [
    (2, ["--ulysses-degree", "2"]),
    (2, ["--ring-degree", "2", "--ring-rotate", "p2p"]),
    (2, ["--tp-degree", "2"]),
    (2, ["--cfg-degree", "2"]),
]
CASES = ("i2i_sd3_48x80_s075_neg", "inp_sd3_64x48_s075_holes_neg")


def png_levels(a, b):
    """The worst level between two PNG files' pixels (256 when their sizes differ)."""
    pa, pb = (png_pixels(open(p, "rb").read()) for p in (a, b))
    return max(abs(x - y) for x, y in zip(pa, pb)) if len(pa) == len(pb) else 256


tmp = tempfile.mkdtemp(prefix="sd3_edit_group.")
checked = 0
cases = {c["name"]: c for c in json.load(open(os.path.join(fix, "cases.json")))["cases"]}
for name in CASES:
    c = cases[name]
    args = ["generate", "--model", os.path.join(root, c["folder"]), "--prompt", c["prompt"],
            "-n", str(c["batch"]), "--image", os.path.join(fix, c["image"]),
            "--strength", repr(c["strength"]), "--steps", str(c["num_inference_steps"]),
            "--guidance", repr(c["guidance_scale"]),
            "--max-sequence-length", str(c["max_sequence_length"]), "--seed", str(c["seed"]),
            "--dtype", "f32", "--threads", "1", "-q"]
    if c.get("mask"):
        args += ["--mask", os.path.join(fix, c["mask"])]
    if c.get("negative_prompt") is not None:
        args += ["--negative-prompt", c["negative_prompt"]]
    if c.get("prompt_3"):
        args += ["--prompt-3", c["prompt_3"]]
    one, one_png = os.path.join(tmp, name + "-1.npy"), os.path.join(tmp, name + "-1.png")
    r = subprocess.run([ditd] + args + ["--save-latents", one, "-o", one_png], capture_output=True,
                       text=True, timeout=120)
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
        tag = "-".join(lay).replace("--", "")
        out, png = os.path.join(tmp, f"{name}-{tag}.npy"), os.path.join(tmp, f"{name}-{tag}.png")
        cmd = [mpirun, "-np", str(np_), ditd] + args + lay + ["--save-latents", out, "-o", png]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=150)
        if r.returncode != 0:
            fail(f"{name} {' '.join(lay)}: exit {r.returncode}: {r.stderr[-600:]}")
            continue
        _, got = read_npy(out)
        e1, ed = rel(got, ref1), rel(got, ref)
        lv = png_levels(png, one_png)
        print(f"{name} np {np_} {' '.join(lay)}: vs one rank rel {e1:.3g}, vs Diffusers rel {ed:.3g}, "
              f"PNG within {lv} level(s) of one rank's")
        if e1 > 1e-4 or ed > 1e-4 or lv > 1:
            fail(f"{name} {' '.join(lay)}: rel {e1:.3g} (one rank) {ed:.3g} (Diffusers), PNG {lv} levels off")
            continue
        checked += 1
shutil.rmtree(tmp, ignore_errors=True)
want = len(CASES) * len(LAYOUTS)
if checked < want:
    fail(f"{checked} case x layout runs checked, want {want}")
print(f"{checked} runs checked, {len(failures)} failures")
sys.exit(1 if failures else 0)
