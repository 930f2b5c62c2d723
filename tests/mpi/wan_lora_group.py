#!/usr/bin/env python3
"""`mpirun -np 2 ditd generate --lora` on the tiny two-expert Wan 2.2 folder (issue 26): layouts
equal to one rank and to Diffusers.

The case wan22_5f_32x48_experts of tests/fixtures/wan_pipeline/expected (its prompt, size, steps,
CFG and Diffusers' noise through --latents) with the rank-4 adapter of tests/fixtures/lora_sd3wan
at scale 1 on both experts (ditd generate applies an adapter to both; Diffusers' reference loads
it into transformer and, with load_into_transformer_2=True, into transformer_2), and once more
with the rank-8 one added at --lora-scale -0.5 (one rank's result only: Diffusers has no such
case). Under ulysses 2, ring 2 (p2p) and cfg 2 the leader's final latents are within 1e-4
relative of one rank's, and for the first case of Diffusers' (tools/make_lora_sd3wan_fixtures.py);
the adapters change the latents; tp 2 is refused, naming tensor parallel. At least 2 x 3 runs
are checked. Stdlib only.

usage: wan_lora_group.py DITD MPIRUN WAN_PIPELINE_DIR FIXTURES_DIR
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

ditd, mpirun, pipes, fix = sys.argv[1:5]
LAYOUTS = [["--ulysses-degree", "2"], ["--ring-degree", "2", "--ring-rotate", "p2p"],
           ["--cfg-degree", "2"]]
lora = os.path.join(fix, "lora_sd3wan")
exp = os.path.join(fix, "wan_pipeline", "expected")
c = {x["name"]: x for x in json.load(open(os.path.join(exp, "cases.json")))["cases"]}[
    "wan22_5f_32x48_experts"]
common = ["generate", "--model", os.path.join(pipes, c["folder"]), "--prompt", c["prompts"][0],
          "--frames", str(c["num_frames"]), "--size", "%dx%d" % (c["width"], c["height"]),
          "--steps", str(c["num_inference_steps"]), "--guidance", str(c["guidance_scale"]),
          "--max-sequence-length", str(c["max_sequence_length"]),
          "--latents", os.path.join(exp, c["noise"]), "--threads", "1", "-q"]
W4 = ["--lora", "w4=" + os.path.join(lora, "wan_r4_peft.safetensors")]
W48 = W4 + ["--lora", "w8=" + os.path.join(lora, "wan_r8_some_alpha.safetensors"),
            "--lora-scale", "w8=-0.5"]
SETS = [("w4", W4, os.path.join(lora, "wan22_both_experts_out.npy")), ("w4+w8", W48, None)]

tmp = tempfile.mkdtemp(prefix="wan_lora_group.")


def read_f64(path):
    """The values of a little-endian float64 .npy file (the Diffusers reference)."""
    with open(path, "rb") as f:
        data = f.read()
    hl = struct.unpack("<H", data[8:10])[0]
    assert "'<f8'" in data[10:10 + hl].decode("latin1"), path
    n = (len(data) - 10 - hl) // 8
    return struct.unpack("<%dd" % n, data[10 + hl:10 + hl + 8 * n])


def run(cmd, out):
    r = subprocess.run(cmd + ["--save-latents", out], capture_output=True, text=True, timeout=280)
    return r, (read_npy(out)[1] if r.returncode == 0 else None)


checked = 0
r, base = run([ditd] + common, os.path.join(tmp, "base.npy"))
if base is None:
    fail("base: exit %d: %s" % (r.returncode, r.stderr.strip()[-400:]))
for tag, flags, ref_path in SETS:
    r, one = run([ditd] + common + flags, os.path.join(tmp, tag + "-one.npy"))
    if one is None:
        fail("%s: one rank: exit %d: %s" % (tag, r.returncode, r.stderr.strip()[-400:]))
        continue
    if base is not None and rel(one, base) < 1e-2:
        fail("%s: the adapters hardly change the latents (%.3g)" % (tag, rel(one, base)))
    ref = read_f64(ref_path) if ref_path else None
    if ref is not None and (len(ref) != len(one) or rel(one, ref) > 1e-4):
        fail("%s: one rank %.3g relative to Diffusers (1e-4)" % (tag, rel(one, ref)))
        ref = None
    elif ref is not None:
        print("ok %s one rank: latents %.2g vs Diffusers" % (tag, rel(one, ref)))
    for i, lay in enumerate(LAYOUTS):
        name = "%s %s" % (tag, " ".join(lay))
        r, par = run([mpirun, "--oversubscribe", "-np", "2", ditd] + common + flags + lay,
                     os.path.join(tmp, "%s-%d.npy" % (tag, i)))
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

# tensor parallel: refused with its reason
r = subprocess.run([mpirun, "--oversubscribe", "-np", "2", ditd] + common + W4 +
                   ["--tp-degree", "2", "--save-latents", os.path.join(tmp, "tp.npy")],
                   capture_output=True, text=True, timeout=280)
if r.returncode == 0 or "tensor parallel" not in (r.stderr + r.stdout):
    fail("tp 2: exit %d, want a refusal naming tensor parallel: %s"
         % (r.returncode, (r.stderr + r.stdout).strip()[-400:]))
else:
    print("ok tp 2 refused: %s" % [l for l in r.stderr.splitlines() if "tensor parallel" in l][0])
    checked += 1

shutil.rmtree(tmp, ignore_errors=True)
print("%d runs checked" % checked)
if checked < len(SETS) * len(LAYOUTS) + 1:
    fail("too few checked: %d (%d)" % (checked, len(SETS) * len(LAYOUTS) + 1))
sys.exit(1 if failures else 0)
