#!/usr/bin/env python3
"""Diffusers in bf16 on the golden fixtures: the yardstick for ditd's bf16 mode.

What it is: for every fixture model under tests/fixtures/models/ (made by
tools/make_fixtures.py) and every sampling case of its expected/cases.json, the
same DiTPipeline loop (make_fixtures.sample_dit) run with the transformer cast to
torch.bfloat16, as `DiTPipeline.from_pretrained(..., torch_dtype=torch.bfloat16)`
runs it: weights, activations, latents and scheduler arithmetic in bf16, from the
case's own noise. Its final latents go to expected/<case>bf16_out.npy and their
error against the case's float64 reference (the "out" file) to expected/bf16.json.

tests/golden/test_bf16.c runs ditd with bf16 weights on the same cases and
requires its error against the same reference to be no larger than Diffusers'.

What it is not: part of the build or the tests (they never need PyTorch). Run it
after tools/make_fixtures.py, with the venv's python:

    python tools/make_bf16_fixtures.py [--models tests/fixtures/models]
"""

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

import diffusers
from diffusers import DiTTransformer2DModel

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_fixtures as mf  # noqa: E402  (the same loop, models and error metrics)


def run_model(root):
    exp = root / "expected"
    cases = json.loads((exp / "cases.json").read_text())
    config = DiTTransformer2DModel.load_config(root / "transformer")
    sd = mf.load_state_dict(root / "transformer")
    mbf = mf.reference_model(config, sd, torch.bfloat16)
    nc = cases["num_embeds_ada_norm"]
    out = {
        "model": cases["model"],
        "what": "Diffusers sampling with the transformer in torch.bfloat16, vs the float64 "
                "reference of cases.json",
        "diffusers_version": diffusers.__version__,
        "torch_version": torch.__version__,
        "cases": [],
    }
    for i, c in enumerate(cases["sampling"]):
        cls = mf.SAMPLERS[c["sampler"]]
        # as make_fixtures: the model's scheduler folder, read by the case's class
        sched = cls.from_config(dict(cls.load_config(root / "scheduler")))
        noise = np.load(exp / c["noise"])
        ref = np.load(exp / c["out"]).astype(np.float64)
        lat = mf.sample_dit(mbf, sched, c["class_labels"], noise, c["guidance_scale"], c["steps"],
                            nc).to(torch.float32).numpy()
        assert np.isfinite(lat).all()
        name = c["out"].replace("_out.npy", "_bf16_out.npy")
        err = mf.err_stats(lat, ref)
        out["cases"].append({
            "sampling_index": i,
            "sampler": c["sampler"],
            "guidance_scale": c["guidance_scale"],
            "out": c["out"],
            "bf16_out": mf.save(exp / name, lat, np.float32),
            "diffusers_bf16_vs_reference": err,
        })
        mf.log(f"{cases['model']}: {c['sampler']} g={c['guidance_scale']:g} bf16 "
               f"max_abs/max_ref={err['max_abs_over_max_ref']:.2e} rel_l2={err['rel_l2']:.2e}")
    (exp / "bf16.json").write_text(json.dumps(out, indent=2, allow_nan=False) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", type=Path, default=mf.DEFAULT_OUT)
    args = ap.parse_args()
    diffusers.utils.logging.set_verbosity_error()
    diffusers.utils.logging.disable_progress_bar()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    n = 0
    for root in sorted(p for p in args.models.iterdir() if (p / "expected" / "cases.json").exists()):
        run_model(root)
        n += 1
    assert n >= 3, f"only {n} fixture models found under {args.models}"
    return 0


if __name__ == "__main__":
    sys.exit(main())
