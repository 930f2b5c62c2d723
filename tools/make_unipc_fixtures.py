#!/usr/bin/env python3
"""Reference fixtures for UniPCMultistepScheduler in engine/pipeline/sampler.c
(diffusers 0.42, torch float32), as tools/make_sampler_fixtures.py writes
them for the other samplers, into tests/fixtures/samplers/:

  unipc_index.json - the cases: scheduler_config.json text, the sampler to
                     run (after from_config when it differs from the file's
                     class), steps, Diffusers' timesteps (int64), the row of
                     traj; "error" where Diffusers fails (or gives NaN) or
                     ditd refuses by design.
  unipc_init.npy   - float32 (2, 1, 5, 5): the start of every case.
  unipc_bank.npy   - float32 (50, 2, 1, 5, 5): the model output at step i.
  unipc_traj.npy   - float32 (rows, 2, 2, 25): per step, the sample after the
                     step and the x0 prediction of the step (predict_x0: the
                     converted model output; otherwise the data prediction
                     the same output converts to, from the sample the step
                     was given).

Cases: Wan 2.1's and Wan 2.2's scheduler_config.json (flow_prediction,
use_flow_sigmas, flow_shift 3.0 and 5.0, bh2, order 2) at every step count
1..50; bh1, order 1, lower_order_final false, disable_corrector,
final_sigmas_type sigma_min, shift_terminal; the epsilon / v_prediction /
sample configs on the three beta schedules and spacings, predict_x0 true and
false; from_config to and from DDIM, DPM-Solver and flow Euler.

    /root/ditd-venv/bin/python tools/make_unipc_fixtures.py
"""
import copy
import json
import os
import sys

import numpy as np
import torch
import diffusers
from diffusers import (DDIMScheduler, DPMSolverMultistepScheduler, FlowMatchEulerDiscreteScheduler,
                       UniPCMultistepScheduler)

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "samplers")
SHAPE = (2, 1, 5, 5)
BANK_STEPS = 50
CLASSES = {"DDIMScheduler": DDIMScheduler, "DPMSolverMultistepScheduler": DPMSolverMultistepScheduler,
           "FlowMatchEulerDiscreteScheduler": FlowMatchEulerDiscreteScheduler,
           "UniPCMultistepScheduler": UniPCMultistepScheduler}
KIND_OF = {"DDIMScheduler": "ddim", "DPMSolverMultistepScheduler": "dpmpp-2m",
           "FlowMatchEulerDiscreteScheduler": "flow-euler", "UniPCMultistepScheduler": "unipc"}

# Wan-AI/Wan2.1-T2V-1.3B-Diffusers scheduler/scheduler_config.json (flow_shift
# 3.0; the 720p configs use 5.0).
WAN21 = {"_class_name": "UniPCMultistepScheduler", "_diffusers_version": "0.33.0.dev0", "beta_end": 0.02,
         "beta_schedule": "linear", "beta_start": 0.0001, "disable_corrector": [],
         "dynamic_thresholding_ratio": 0.995, "final_sigmas_type": "zero", "flow_shift": 3.0,
         "lower_order_final": True, "num_train_timesteps": 1000, "predict_x0": True,
         "prediction_type": "flow_prediction", "rescale_betas_zero_snr": False, "sample_max_value": 1.0,
         "solver_order": 2, "solver_p": None, "solver_type": "bh2", "steps_offset": 0, "thresholding": False,
         "timestep_spacing": "linspace", "trained_betas": None, "use_beta_sigmas": False,
         "use_exponential_sigmas": False, "use_flow_sigmas": True, "use_karras_sigmas": False}
# Wan 2.2 (diffusers 0.35 saves the newer keys too).
WAN22 = {**WAN21, "_diffusers_version": "0.35.0.dev0", "time_shift_type": "exponential",
         "use_dynamic_shifting": False, "sigma_min": None, "sigma_max": None, "shift_terminal": None}


def unipc_cases():
    cases = []
    for shift in (3.0, 5.0):
        for steps in range(1, 51):
            cases.append((f"wan21-shift{shift}-{steps}", {**WAN21, "flow_shift": shift}, None, steps))
    for steps in (1, 2, 3, 7, 30, 40, 50):
        cases.append((f"wan22-shift5.0-{steps}", {**WAN22, "flow_shift": 5.0}, None, steps))
    for steps in (1, 2, 3, 4, 9, 20, 33):
        cases.append((f"wan-bh1-{steps}", {**WAN21, "solver_type": "bh1"}, None, steps))
        cases.append((f"wan-order1-{steps}", {**WAN21, "solver_order": 1}, None, steps))
        cases.append((f"wan-lof0-sigmamin-{steps}", {**WAN21, "lower_order_final": False,
                                                      "final_sigmas_type": "sigma_min"}, None, steps))
        cases.append((f"wan-lof0-{steps}", {**WAN21, "lower_order_final": False}, None, steps))
        cases.append((f"wan-sigmamin-{steps}", {**WAN21, "final_sigmas_type": "sigma_min"}, None, steps))
        cases.append((f"wan-noncorr-{steps}", {**WAN21, "disable_corrector": [0, 2, 5]}, None, steps))
        cases.append((f"wan-terminal-{steps}", {**WAN21, "shift_terminal": 0.05}, None, steps))
        cases.append((f"wan-shift1-{steps}", {**WAN21, "flow_shift": 1.0, "solver_type": "bh1"}, None, steps))
    cases.append(("wan-midpoint-is-bh2", {**WAN21, "solver_type": "midpoint"}, None, 10))
    cases.append(("wan-train500", {**WAN21, "num_train_timesteps": 500}, None, 17))
    # VP configs (epsilon, v, sample), as SD-style checkpoints ship UniPC
    betas = {"linear": {"beta_start": 0.0001, "beta_end": 0.02},
             "scaled_linear": {"beta_start": 0.00085, "beta_end": 0.012}, "squaredcos_cap_v2": {}}
    c = 0
    for beta, bkw in betas.items():
        for pred in ("epsilon", "v_prediction", "sample"):
            for spacing in ("linspace", "leading", "trailing"):
                for steps in (1, 2, 10, 25):
                    cfg = {"_class_name": "UniPCMultistepScheduler", "beta_schedule": beta, **bkw,
                           "prediction_type": pred, "timestep_spacing": spacing,
                           "solver_type": ["bh2", "bh1"][c % 2], "predict_x0": (c // 2) % 3 != 2,
                           "solver_order": [2, 2, 1][c % 3],
                           "final_sigmas_type": ["zero", "sigma_min"][(c // 5) % 2],
                           "lower_order_final": (c // 7) % 2 == 0}
                    if spacing == "leading" and c % 3 == 0:
                        cfg["steps_offset"] = 1
                    cases.append((f"unipc-{beta}-{pred}-{spacing}-{steps}-v{c}", cfg, None, steps))
                    c += 1
    cases.append(("unipc-zsnr-v-trailing", {"_class_name": "UniPCMultistepScheduler",
                  "beta_schedule": "scaled_linear", "beta_start": 0.00085, "beta_end": 0.012,
                  "rescale_betas_zero_snr": True, "prediction_type": "v_prediction",
                  "timestep_spacing": "trailing"}, None, 10))
    cases.append(("unipc-defaults-20", {"_class_name": "UniPCMultistepScheduler"}, None, 20))
    cases.append(("unipc-saved-by-diffusers", json.loads(UniPCMultistepScheduler().to_json_string()), None, 12))
    cases.append(("unipc-order3", {"_class_name": "UniPCMultistepScheduler", "solver_order": 3}, "refuse", 10))
    cases.append(("unipc-karras", {"_class_name": "UniPCMultistepScheduler", "use_karras_sigmas": True},
                  "refuse", 10))
    cases.append(("unipc-flow-noise-pred", {**WAN21, "predict_x0": False}, None, 10))
    return cases


DIT = {"_class_name": "DDIMScheduler", "_diffusers_version": "0.12.0.dev0", "beta_end": 0.02,
       "beta_schedule": "linear", "beta_start": 0.0001, "clip_sample": False,
       "num_train_timesteps": 1000, "prediction_type": "epsilon", "set_alpha_to_one": True,
       "steps_offset": 0, "trained_betas": None}
SD3 = {"_class_name": "FlowMatchEulerDiscreteScheduler", "_diffusers_version": "0.29.0",
       "num_train_timesteps": 1000, "shift": 3.0}


def convert_cases():
    dpm = {"_class_name": "DPMSolverMultistepScheduler", "solver_type": "heun", "timestep_spacing": "trailing",
           "prediction_type": "v_prediction", "lower_order_final": False, "final_sigmas_type": "sigma_min"}
    vp_unipc = {"_class_name": "UniPCMultistepScheduler", "solver_type": "bh1", "timestep_spacing": "leading",
                "steps_offset": 1, "prediction_type": "v_prediction", "final_sigmas_type": "sigma_min",
                "beta_schedule": "scaled_linear", "beta_start": 0.00085, "beta_end": 0.012}
    return [
        ("conv-wan-to-flow-euler-10", WAN21, "flow-euler", 10),
        ("conv-wan-to-dpm-10", WAN21, "refuse-dpmpp-2m", 10),   # DPM with flow sigmas: ditd refuses
        ("conv-wan-to-ddim-10", WAN21, "ddim", 10),            # DDIM has no flow_prediction
        ("conv-dit-to-unipc-25", DIT, "unipc", 25),
        ("conv-dit-to-unipc-7", DIT, "unipc", 7),
        ("conv-dpm-to-unipc-12", dpm, "unipc", 12),
        ("conv-sd3-to-unipc-10", SD3, "unipc", 10),
        ("conv-unipc-to-dpm-12", vp_unipc, "dpmpp-2m", 12),
        ("conv-unipc-to-ddim-12", vp_unipc, "ddim", 12),
        ("conv-unipc-to-flow-12", vp_unipc, "flow-euler", 12),
    ]


def build(cfg, target):
    sched = CLASSES[cfg["_class_name"]].from_config(cfg)
    if target is not None and KIND_OF[cfg["_class_name"]] != target:
        tcls = [c for n, c in CLASSES.items() if KIND_OF[n] == target][0]
        sched = tcls.from_config(sched.config)
    return sched


def run_case(cfg, target, steps, init, bank):
    sched = build(cfg, target)
    sched.set_timesteps(steps)
    ts = sched.timesteps
    sample = init.clone()
    rows = []
    for i, t in enumerate(ts):
        m = bank[i]
        before = sample
        if isinstance(sched, UniPCMultistepScheduler):
            out = sched.step(m, t, sample)
            conv = sched.model_outputs[-1]
            if sched.predict_x0:
                x0 = conv
            else:  # the data prediction of this model output (what predict_x0 would convert)
                alpha_t, sigma_t = sched._sigma_to_alpha_sigma_t(sched.sigmas[i])
                x0 = {"epsilon": lambda: (before - sigma_t * m) / alpha_t, "sample": lambda: m,
                      "v_prediction": lambda: alpha_t * before - sigma_t * m}[sched.config.prediction_type]()
        elif isinstance(sched, DDIMScheduler):
            out = sched.step(m, t, sample)
            x0 = out.pred_original_sample
        elif isinstance(sched, DPMSolverMultistepScheduler):
            out = sched.step(m, t, sample)
            assert sched.config.algorithm_type == "dpmsolver++"
            x0 = sched.model_outputs[-1]
        else:
            out = sched.step(m, t, sample)
            x0 = before - sched.sigmas[i] * m
        sample = out.prev_sample
        assert sample.dtype == torch.float32 and x0.dtype == torch.float32
        rows.append(np.stack([sample.numpy().reshape(2, -1), x0.numpy().reshape(2, -1)]))
    kind = KIND_OF[type(sched).__name__]
    if ts.dtype == torch.int64:
        tlist = [int(v) for v in ts]
    else:
        tlist = [float(v) for v in ts]
    return kind, tlist, np.stack(rows).astype(np.float32)


def main():
    g = torch.Generator().manual_seed(20261202)
    init = torch.randn(SHAPE, generator=g, dtype=torch.float32)
    bank = torch.randn((BANK_STEPS,) + SHAPE, generator=g, dtype=torch.float32)
    index = {"diffusers": diffusers.__version__, "torch": torch.__version__, "numpy": np.__version__,
             "shape": list(SHAPE), "init": "unipc_init.npy", "bank": "unipc_bank.npy",
             "traj": "unipc_traj.npy", "cases": []}
    traj, row, names = [], 0, set()
    for name, cfg, target, steps in unipc_cases() + convert_cases():
        assert name not in names, name
        names.add(name)
        if target is not None and target.startswith("refuse"):
            index["cases"].append({"name": name, "config": json.dumps(cfg),
                                   "sampler": target[7:] or KIND_OF[cfg["_class_name"]], "steps": steps,
                                   "error": "refused by ditd"})
            continue
        try:
            kind, tlist, t = run_case(cfg, target, steps, init, bank)
            if not np.all(np.isfinite(t)):
                raise ValueError("Diffusers' trajectory is not finite")
            if tlist.count(tlist[0]) > 1:
                raise ValueError("repeated first timestep (index_for_timestep picks the second)")
            N = build(cfg, target).config.num_train_timesteps
            if kind != "flow-euler" and any(not 0 <= t < N for t in tlist):
                raise ValueError("a timestep outside 0..num_train_timesteps - 1")
        except (IndexError, ValueError) as e:
            index["cases"].append({"name": name, "config": json.dumps(cfg),
                                   "sampler": target or KIND_OF[cfg["_class_name"]], "steps": steps,
                                   "error": repr(e)})
            print(f"{name}: Diffusers: {e!r}", file=sys.stderr)
            continue
        index["cases"].append({"name": name, "config": json.dumps(cfg), "sampler": kind, "steps": steps,
                               "timesteps": tlist, "row": row})
        traj.append(t)
        row += len(tlist)
    os.makedirs(OUT, exist_ok=True)
    np.save(os.path.join(OUT, "unipc_init.npy"), init.numpy())
    np.save(os.path.join(OUT, "unipc_bank.npy"), bank.numpy())
    np.save(os.path.join(OUT, "unipc_traj.npy"), np.concatenate(traj))
    with open(os.path.join(OUT, "unipc_index.json"), "w") as f:
        json.dump(index, f, indent=0)
        f.write("\n")
    print(f"{len(index['cases'])} cases, {row} steps -> {OUT}", file=sys.stderr)


if __name__ == "__main__":
    main()
