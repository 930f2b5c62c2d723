#!/usr/bin/env python3
"""`mpirun -np 2 ditd generate --lora` on the tiny SD3.5 and two-expert Wan 2.2 folders (issue 26):
layouts equal to one rank and to Diffusers.

Each model's pipeline case (its prompt through ditd's own text encoders, its size, steps, CFG and
Diffusers' noise through --latents) with the adapters of tests/fixtures/lora_sd3wan:
  - SD3.5 (sd35_32_batch2's first sample): s4 at 1, and s4 at 0.5 with s8 at -1; Diffusers'
    references are tools/make_lora_sd3wan_fixtures.py's sd3_r4_s1 and sd3_two;
  - Wan 2.2 (wan22_5f_32x48_experts): w4 at 1 on both experts (ditd generate applies an adapter to
    both; Diffusers' reference loads it into transformer and, with load_into_transformer_2=True,
    into transformer_2: wan22_both_experts), and w4 with w8 at -0.5 (one rank's result only);
    with --lora-expert, w8 on transformer and w4 at 0.5 on transformer_2 (wan22_per_expert), and
    w4 at -1 on transformer alone (wan22_transformer_only), under ulysses 2 and tp 2.
One rank is within 1e-4 relative of Diffusers; under ulysses 2, ring 2 (p2p), cfg 2, tp 2 and
tp 2 x ring 2 the leader's final latents are within 1e-4 of one rank's (and of Diffusers' where
there is a reference); the adapters change the latents; --lora-expert's refusals name what is
wrong. The count of runs is asserted. Stdlib only.

usage: lora_sd3wan_group.py DITD MPIRUN SD3_PIPELINE_DIR WAN_PIPELINE_DIR FIXTURES_DIR
"""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from group_check import fail, failures, read_npy, rel  # noqa: E402

ditd, mpirun, sd3_pipes, wan_pipes, fix = sys.argv[1:6]
LAYOUTS = [(2, ["--ulysses-degree", "2"]), (2, ["--ring-degree", "2", "--ring-rotate", "p2p"]),
           (2, ["--cfg-degree", "2"]), (2, ["--tp-degree", "2"]),
           (4, ["--tp-degree", "2", "--ring-degree", "2", "--ring-rotate", "p2p"])]
lora = os.path.join(fix, "lora_sd3wan")


def case(sub, name):
    exp = os.path.join(fix, sub, "expected")
    return exp, {x["name"]: x for x in json.load(open(os.path.join(exp, "cases.json")))["cases"]}[name]


def ad(name, file):
    return ["--lora", "%s=%s" % (name, os.path.join(lora, file))]


def out(name):
    return os.path.join(lora, name + "_out.npy")


exp, c = case("sd3_pipeline", "sd35_32_batch2")
sd3 = ["generate", "--model", os.path.join(sd3_pipes, c["folder"]), "--prompt", c["prompts"][0],
       "--size", "%dx%d" % (c["width"], c["height"]), "--steps", str(c["num_inference_steps"]),
       "--guidance", str(c["guidance_scale"]), "--max-sequence-length",
       str(c["max_sequence_length"]), "--latents", os.path.join(lora, "sd35_sample0_noise.npy")]
S4, S8 = ad("s4", "sd3_r4_peft.safetensors"), ad("s8", "sd3_r8_some_alpha.safetensors")
exp, c = case("wan_pipeline", "wan22_5f_32x48_experts")
wan = ["generate", "--model", os.path.join(wan_pipes, c["folder"]), "--prompt", c["prompts"][0],
       "--frames", str(c["num_frames"]), "--size", "%dx%d" % (c["width"], c["height"]),
       "--steps", str(c["num_inference_steps"]), "--guidance", str(c["guidance_scale"]),
       "--max-sequence-length", str(c["max_sequence_length"]),
       "--latents", os.path.join(exp, c["noise"])]
W4, W8 = ad("w4", "wan_r4_peft.safetensors"), ad("w8", "wan_r8_some_alpha.safetensors")
# (tag, the command's common part, adapter flags, Diffusers' reference or None, layouts)
FEW = [LAYOUTS[0], LAYOUTS[3]]  # ulysses 2, tp 2
RUNS = [("sd3 s4", sd3, S4, out("sd3_r4_s1"), LAYOUTS),
        ("sd3 s4+s8", sd3, S4 + S8 + ["--lora-scale", "s4=0.5", "--lora-scale", "s8=-1"],
         out("sd3_two"), LAYOUTS),
        ("wan22 w4", wan, W4, out("wan22_both_experts"), LAYOUTS),
        ("wan22 w4+w8", wan, W4 + W8 + ["--lora-scale", "w8=-0.5"], None, LAYOUTS),
        # --lora-expert: w8 on transformer, w4 at 0.5 on transformer_2 (Diffusers: w8 loaded
        # into transformer, w4 with load_into_transformer_2=True); w4 at -1 on transformer alone
        ("wan22 per expert", wan, W8 + W4 + ["--lora-scale", "w4=0.5", "--lora-expert",
                                             "w8=transformer", "--lora-expert", "w4=transformer_2"],
         out("wan22_per_expert"), FEW),
        ("wan22 transformer only", wan, W4 + ["--lora-scale", "w4=-1", "--lora-expert",
                                              "w4=transformer"], out("wan22_transformer_only"), FEW)]
tmp = tempfile.mkdtemp(prefix="lora_sd3wan_group.")


def read_f64(path):
    """The values of a little-endian float64 .npy file (a Diffusers reference)."""
    with open(path, "rb") as f:
        data = f.read()
    hl = struct.unpack("<H", data[8:10])[0]
    assert "'<f8'" in data[10:10 + hl].decode("latin1"), path
    n = (len(data) - 10 - hl) // 8
    return struct.unpack("<%dd" % n, data[10 + hl:10 + hl + 8 * n])


def run(cmd, path):
    r = subprocess.run(cmd + ["--threads", "1", "-q", "--save-latents", path], capture_output=True,
                       text=True, timeout=280)
    return r, (read_npy(path)[1] if r.returncode == 0 else None)


checked, base = 0, {}
for tag, common, flags, ref_path, layouts in RUNS:
    key = common[2]
    if key not in base:
        r, base[key] = run([ditd] + common, os.path.join(tmp, "base-%d.npy" % len(base)))
        if base[key] is None:
            fail("%s base: exit %d: %s" % (tag, r.returncode, r.stderr.strip()[-400:]))
    r, one = run([ditd] + common + flags, os.path.join(tmp, "%d-one.npy" % checked))
    if one is None:
        fail("%s: one rank: exit %d: %s" % (tag, r.returncode, r.stderr.strip()[-400:]))
        continue
    if base[key] is not None and rel(one, base[key]) < 1e-2:
        fail("%s: the adapters hardly change the latents (%.3g)" % (tag, rel(one, base[key])))
    ref = read_f64(ref_path) if ref_path else None
    if ref is not None and (len(ref) != len(one) or rel(one, ref) > 1e-4):
        fail("%s: one rank %.3g relative to Diffusers (1e-4)" % (tag, rel(one, ref)))
        ref = None
    elif ref is not None:
        print("ok %s one rank: latents %.2g vs Diffusers" % (tag, rel(one, ref)))
    for i, (np_, lay) in enumerate(layouts):
        name = "%s %s" % (tag, " ".join(lay))
        r, par = run([mpirun, "--oversubscribe", "-np", str(np_), ditd] + common + flags + lay,
                     os.path.join(tmp, "%d-%d.npy" % (checked, i)))
        if par is None:
            fail("%s: exit %d: %s" % (name, r.returncode, r.stderr.strip()[-600:]))
            continue
        e1 = rel(par, one)
        ed = rel(par, ref) if ref is not None else 0.0
        if e1 > 1e-4 or ed > 1e-4:
            fail("%s: %.3g relative to one rank, %.3g to Diffusers (1e-4)" % (name, e1, ed))
            continue
        print("ok %s: latents %.2g vs one rank%s" % (name, e1,
                                                     ", %.2g vs Diffusers" % ed if ref else ""))
        checked += 1

# --lora-expert refused by name: on a model with one transformer, a WHERE it does not know,
# a NAME no --lora gave
for flags, said in ((S4 + ["--lora-expert", "s4=transformer_2"], "has one transformer"),
                    (S4 + ["--lora-expert", "s4=low"], "WHERE is both, transformer or"),
                    (["--lora-expert", "s4=both"], "no --lora s4=PATH")):
    r = subprocess.run([ditd] + sd3 + flags + ["-q", "--save-latents", os.path.join(tmp, "x.npy")],
                       capture_output=True, text=True, timeout=120)
    if r.returncode == 0 or said not in r.stderr:
        fail("%s: exit %d, want a refusal saying '%s': %s"
             % (" ".join(flags[-2:]), r.returncode, said, r.stderr.strip()[-300:]))
    else:
        print("ok refused: %s" % r.stderr.strip().splitlines()[-1])
        checked += 1

shutil.rmtree(tmp, ignore_errors=True)
want = sum(len(r[4]) for r in RUNS) + 3
print("%d runs checked" % checked)
if checked < want:
    fail("too few checked: %d (%d)" % (checked, want))
sys.exit(1 if failures else 0)
