#!/usr/bin/env python3
"""ditd generate with --transformer-file on an SD3.5 and a Wan 2.1 folder (issue 25).

The assembled StableDiffusion3Pipeline (sd35/) and WanPipeline (wan21/)
folders with transformer/ holding only config.json, and the transformer
given as a GGUF in its original key names (SD3's joint_blocks, Wan's
self_attn/cross_attn/head; tests/fixtures/sd3wan_gguf/pipeline, written by
tools/make_sd3_wan_gguf_fixtures.py in the checkpoints' own F16 / F32, so the
numbers are the same): the final latents must be those pipelines' Diffusers
references (float64, tests/fixtures/{sd3,wan}_pipeline/expected) within
1e-4 relative, one case each. The same .gguf inside transformer/ (no flag)
gives the same latents bit for bit. A Wan 2.2 folder (two experts) refuses
--transformer-file naming transformer_2. Stdlib only.

usage: sd3_wan_gguf_generate.py DITD SD3_PIPELINE_DIR WAN_PIPELINE_DIR FIXTURES_DIR
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

ditd, sd3_pipes, wan_pipes, fix = sys.argv[1:5]
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from wan_generate_util import read_npy  # noqa: E402

failures = []
checks = 0


def check(ok, msg):
    global checks
    checks += 1
    print(("ok   " if ok else "FAIL ") + msg)
    if not ok:
        failures.append(msg)


def rel(got, want):
    m = max(abs(w) for w in want)
    return max(abs(g - w) for g, w in zip(got, want)) / m


tmp = tempfile.mkdtemp(prefix="sd3wan_gguf.")


def bare_copy(src, name):
    """src with transformer/ holding only its config.json."""
    d = os.path.join(tmp, name)
    shutil.copytree(src, d)
    t = os.path.join(d, "transformer")
    for f in os.listdir(t):
        if f != "config.json":
            os.remove(os.path.join(t, f))
    return d


def case_of(expected, name):
    cases = json.load(open(os.path.join(expected, "cases.json")))["cases"]
    return next(c for c in cases if c["name"] == name)


def run_family(label, model, gguf, expected, case, extra):
    out = os.path.join(tmp, label)
    args = [ditd, "generate", "-q", "--model", model, "--prompt", case["prompts"][0],
            "--size", "%dx%d" % (case["width"], case["height"]),
            "--steps", str(case["num_inference_steps"]), "--guidance", str(case["guidance_scale"]),
            "--max-sequence-length", str(case["max_sequence_length"]),
            "--latents", os.path.join(expected, case["noise"]), "--threads", "1"] + extra
    want_shape, want = read_npy(os.path.join(expected, case["final_latents"]))
    got = {}
    for how, flag in (("flag", ["--transformer-file", gguf]), ("folder", [])):
        if how == "folder":
            shutil.copy(gguf, os.path.join(model, "transformer"))
        r = subprocess.run(args + flag + ["--save-latents", "%s-%s.npy" % (out, how)],
                           capture_output=True, text=True)
        check(r.returncode == 0, "%s (%s): ditd generate runs: %s"
              % (label, how, r.stderr.strip()[-300:]))
        if r.returncode:
            continue
        shape, got[how] = read_npy("%s-%s.npy" % (out, how))
        if how == "flag":
            e = rel(got[how], want)
            check(shape == want_shape and e <= 1e-4,
                  "%s --transformer-file %s: final latents %s vs Diffusers float64: rel %.3g "
                  "(tol 1e-4)" % (label, os.path.basename(gguf), shape, e))
    if len(got) == 2:
        check(got["flag"] == got["folder"],
              "%s: transformer/ holding the .gguf gives the flag's latents bit for bit" % label)


pipe_fix = os.path.join(fix, "sd3wan_gguf", "pipeline")
sd3_exp = os.path.join(fix, "sd3_pipeline", "expected")
run_family("sd35", bare_copy(os.path.join(sd3_pipes, "sd35"), "sd35"),
           os.path.join(pipe_fix, "sd35-orig-f16.gguf"), sd3_exp,
           case_of(sd3_exp, "sd35_64_default"), ["-o", os.path.join(tmp, "sd35.png")])
wan_exp = os.path.join(fix, "wan_pipeline", "expected")
c = case_of(wan_exp, "wan_5f_32x48_default")
run_family("wan21", bare_copy(os.path.join(wan_pipes, "wan21"), "wan21"),
           os.path.join(pipe_fix, "wan21-orig-f32.gguf"), wan_exp, c,
           ["--frames", str(c["num_frames"]), "-o", os.path.join(tmp, "wan21.mp4")])

# two experts: the flag would name one of them
r = subprocess.run([ditd, "generate", "-q", "--model", os.path.join(wan_pipes, "wan22"),
                    "--prompt", "a", "--frames", "5", "--transformer-file",
                    os.path.join(pipe_fix, "wan21-orig-f32.gguf"), "-o",
                    os.path.join(tmp, "x.mp4")], capture_output=True, text=True)
check(r.returncode != 0 and "transformer_2" in r.stderr and "--transformer-file" in r.stderr,
      "Wan 2.2 (two experts) refuses --transformer-file naming transformer_2: %r"
      % r.stderr.strip()[-300:])

shutil.rmtree(tmp, ignore_errors=True)
print("%d checks, %d failed" % (checks, len(failures)))
sys.exit(1 if failures or checks < 7 else 0)
