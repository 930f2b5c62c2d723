#!/usr/bin/env python3
"""Reference fixtures for engine/pipeline/sampler.c and engine/core/philox.c.

Writes tests/fixtures/samplers/:
  index.json  - the cases: scheduler_config.json text, the sampler to run
                (after Diffusers' from_config conversion when it differs from
                the file's class), the step count, "image_seq_len" for the
                FLUX cases (dynamic shifting: the schedule FluxPipeline asks
                for at that many image tokens), Diffusers' timesteps,
                where the case's trajectory starts in traj.npy, and "cond"
                (how much a DPM-Solver step magnifies coefficient ulps; see
                dpm_amplification). A case Diffusers fails on (or that ditd
                refuses by design) has "error" instead: ditd must refuse it.
                Plus Random123's Philox known answers and normals pinned by
                an independent Python implementation of engine/core/philox.h.
  init.npy    - float32 (2, 1, 5, 5): the starting sample of every case.
  bank.npy    - float32 (S, 2, 1, 5, 5): the "model output" at step i of
                every case (a fixed random tensor per step).
  traj.npy    - float32 (rows, 2, 2, 25): per step of each case, the sample
                after the step ([:, 0]) and the prediction of x0 ([:, 1]),
                as Diffusers computes them in float32.

Run with the project's virtualenv (torch, diffusers, numpy):
  /root/ditd-venv/bin/python tools/make_sampler_fixtures.py
The C tests read these files and never need Python.
"""
import json
import math
import os
import struct
import sys

import numpy as np
import torch
import diffusers
from diffusers import (DDIMScheduler, DPMSolverMultistepScheduler,
                       FlowMatchEulerDiscreteScheduler)
from diffusers.pipelines.flux.pipeline_flux import calculate_shift, retrieve_timesteps

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures",
                   "samplers")
SHAPE = (2, 1, 5, 5)
BANK_STEPS = 30

CLASSES = {
    "DDIMScheduler": DDIMScheduler,
    "DPMSolverMultistepScheduler": DPMSolverMultistepScheduler,
    "FlowMatchEulerDiscreteScheduler": FlowMatchEulerDiscreteScheduler,
}
KIND_OF = {"DDIMScheduler": "ddim", "DPMSolverMultistepScheduler": "dpmpp-2m",
           "FlowMatchEulerDiscreteScheduler": "flow-euler"}

# ---------------------------------------------------------------- Philox ---
M32 = 0xFFFFFFFF


def philox4x32_10(ctr, key):
    """Random123 philox4x32 with 10 rounds, written from the paper: the key
    is bumped after every round (and the last bump unused), which is the
    same schedule as bumping before rounds 2..10."""
    c = list(ctr)
    k0, k1 = key
    for _ in range(10):
        p0 = 0xD2511F53 * c[0]
        p1 = 0xCD9E8D57 * c[2]
        hi0, lo0 = p0 >> 32, p0 & M32
        hi1, lo1 = p1 >> 32, p1 & M32
        c = [hi1 ^ c[1] ^ k0, lo1, hi0 ^ c[3] ^ k1, lo0]
        k0 = (k0 + 0x9E3779B9) & M32
        k1 = (k1 + 0xBB67AE85) & M32
    return c


KAT = [  # Random123 kat_vectors, philox4x32 10: ctr, key, expected
    ([0, 0, 0, 0], [0, 0], [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]),
    ([M32] * 4, [M32] * 2, [0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD]),
    ([0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344], [0xA4093822, 0x299F31D0],
     [0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1]),
]


def philox_normal(seed, sample, offset, n):
    """The definition in engine/core/philox.h, element by element."""
    out = []
    key = [seed & M32, seed >> 32]
    for e in range(offset, offset + n):
        j, lane = e // 4, e % 4
        x = philox4x32_10([j & M32, j >> 32, sample & M32, sample >> 32], key)
        p = lane // 2
        u1 = (x[2 * p] + 0.5) * 2.0 ** -32
        u2 = (x[2 * p + 1] + 0.5) * 2.0 ** -32
        r = math.sqrt(-2.0 * math.log(u1))
        t = 6.283185307179586 * u2
        z = r * math.cos(t) if lane % 2 == 0 else r * math.sin(t)
        out.append(struct.unpack("<I", struct.pack("<f", z))[0])  # round to f32
    return out


def philox_fixture():
    for ctr, key, want in KAT:
        got = philox4x32_10(ctr, key)
        assert got == want, (ctr, key, [hex(v) for v in got])
    pinned = []
    for seed, sample, offset, n in [
        (0, 0, 0, 16),
        (42, 1, 3, 9),
        (0x123456789ABCDEF0, 7, 1000001, 7),
        (2**64 - 1, 2**40 + 3, 2**33 + 5, 6),
    ]:
        pinned.append({"seed": hex(seed), "sample": hex(sample), "offset": hex(offset),
                       "bits": philox_normal(seed, sample, offset, n)})
    return {"kat": [{"ctr": c, "key": k, "out": o} for c, k, o in KAT], "normal": pinned}


# ---------------------------------------------------------------- cases ----
BETAS = {
    "linear": {"beta_start": 0.0001, "beta_end": 0.02},
    "scaled_linear": {"beta_start": 0.00085, "beta_end": 0.012},
    "squaredcos_cap_v2": {},
}
PREDS = ["epsilon", "sample", "v_prediction"]
SPACINGS = ["leading", "trailing", "linspace"]
STEPS = [1, 2, 10, 25]


def ddim_cases():
    cases, c = [], 0
    for beta, bkw in BETAS.items():
        for pred in PREDS:
            for spacing in SPACINGS:
                for steps in STEPS:
                    cfg = {"_class_name": "DDIMScheduler", "num_train_timesteps": 1000,
                           "beta_schedule": beta, **bkw, "prediction_type": pred,
                           "timestep_spacing": spacing, "clip_sample": c % 2 == 0,
                           "set_alpha_to_one": (c // 2) % 2 == 0}
                    if c % 3 == 0:
                        cfg["clip_sample_range"] = 1.5
                    if spacing == "leading" and c % 3 == 1:
                        cfg["steps_offset"] = 1
                    cases.append((f"ddim-{beta}-{pred}-{spacing}-{steps}-v{c}", cfg, None, steps))
                    c += 1
    base = {"_class_name": "DDIMScheduler", "beta_schedule": "scaled_linear",
            "beta_start": 0.00085, "beta_end": 0.012, "clip_sample": False}
    for pred, spacing, steps in [("v_prediction", "trailing", 10), ("v_prediction", "linspace", 25),
                                 ("epsilon", "leading", 25), ("sample", "trailing", 2)]:
        cases.append((f"ddim-zsnr-{pred}-{spacing}-{steps}",
                      {**base, "rescale_betas_zero_snr": True, "prediction_type": pred,
                       "timestep_spacing": spacing}, None, steps))
    cases.append(("ddim-trailing-16-ties", {"_class_name": "DDIMScheduler",
                  "timestep_spacing": "trailing", "clip_sample": False}, None, 16))
    cases.append(("ddim-linspace-3-ties", {"_class_name": "DDIMScheduler",
                  "timestep_spacing": "linspace", "clip_sample": False}, None, 3))
    cases.append(("ddim-train500", {"_class_name": "DDIMScheduler", "num_train_timesteps": 500,
                  "beta_start": 0.0002, "beta_end": 0.03, "clip_sample": False}, None, 25))
    cases.append(("ddim-defaults", {"_class_name": "DDIMScheduler"}, None, 10))
    return cases


def dpm_cases():
    cases, c = [], 0
    for beta, bkw in BETAS.items():
        for pred in PREDS:
            for spacing in SPACINGS:
                for steps in STEPS:
                    final = ["zero", "sigma_min"][(c // 5) % 2]
                    cfg = {"_class_name": "DPMSolverMultistepScheduler",
                           "num_train_timesteps": 1000, "beta_schedule": beta, **bkw,
                           "prediction_type": pred, "timestep_spacing": spacing,
                           "solver_order": [2, 2, 2, 1][c % 4],
                           "solver_type": ["midpoint", "heun"][(c // 2) % 2],
                           "lower_order_final": (c // 3) % 2 == 0,
                           "euler_at_final": c % 7 == 3,
                           "final_sigmas_type": final,
                           "use_karras_sigmas": c % 5 == 2}
                    if final == "sigma_min" and c % 3 == 2:
                        cfg["algorithm_type"] = "dpmsolver"
                    if spacing == "leading" and c % 3 == 0:
                        cfg["steps_offset"] = 1
                    cases.append((f"dpm-{beta}-{pred}-{spacing}-{steps}-v{c}", cfg, None, steps))
                    c += 1
    # lower_order_final only applies below 15 steps
    for steps in (14, 15, 16):
        for lof in (True, False):
            for solver_type in ("midpoint", "heun"):
                cases.append((f"dpm-lof{int(lof)}-{solver_type}-{steps}",
                              {"_class_name": "DPMSolverMultistepScheduler",
                               "lower_order_final": lof, "final_sigmas_type": "sigma_min",
                               "solver_type": solver_type}, None, steps))
    cases.append(("dpm-karras-30", {"_class_name": "DPMSolverMultistepScheduler",
                  "beta_schedule": "scaled_linear", "beta_start": 0.00085, "beta_end": 0.012,
                  "use_karras_sigmas": True}, None, 30))
    cases.append(("dpm-karras-sigma-bounds", {"_class_name": "DPMSolverMultistepScheduler",
                  "use_karras_sigmas": True, "sigma_min": 0.05, "sigma_max": 40.0}, None, 10))
    cases.append(("dpm-karras-cos-trunc", {"_class_name": "DPMSolverMultistepScheduler",
                  "beta_schedule": "squaredcos_cap_v2", "use_karras_sigmas": True}, None, 25))
    cases.append(("dpm-lambda-clipped", {"_class_name": "DPMSolverMultistepScheduler",
                  "lambda_min_clipped": -5.0}, None, 10))
    cases.append(("dpm-lambda-clipped-trailing", {"_class_name": "DPMSolverMultistepScheduler",
                  "beta_schedule": "scaled_linear", "beta_start": 0.00085, "beta_end": 0.012,
                  "lambda_min_clipped": -2.5, "timestep_spacing": "trailing"}, None, 10))
    lam = DPMSolverMultistepScheduler().lambda_t  # clip exactly 100 timesteps:
    cut = float((lam[899] + lam[900]) / 2)        # 9 trailing steps of 10 asked
    cases.append(("dpm-lambda-clipped-trailing-short", {"_class_name":
                  "DPMSolverMultistepScheduler", "lambda_min_clipped": cut,
                  "timestep_spacing": "trailing"}, None, 10))
    cases.append(("dpm-zsnr-v-trailing", {"_class_name": "DPMSolverMultistepScheduler",
                  "beta_schedule": "scaled_linear", "beta_start": 0.00085, "beta_end": 0.012,
                  "rescale_betas_zero_snr": True, "prediction_type": "v_prediction",
                  "timestep_spacing": "trailing"}, None, 10))
    cases.append(("dpm-deis", {"_class_name": "DPMSolverMultistepScheduler",
                  "algorithm_type": "deis"}, None, 10))
    cases.append(("dpm-dpmsolver-zero", {"_class_name": "DPMSolverMultistepScheduler",
                  "algorithm_type": "dpmsolver"}, None, 10))
    cases.append(("dpm-order3", {"_class_name": "DPMSolverMultistepScheduler",
                  "solver_order": 3}, "refuse", 10))
    cases.append(("ddim-trailing-61-negative", {"_class_name": "DDIMScheduler",
                  "timestep_spacing": "trailing"}, "refuse", 61))
    cases.append(("dpm-euler-final-sigma-min", {"_class_name": "DPMSolverMultistepScheduler",
                  "euler_at_final": True, "final_sigmas_type": "sigma_min",
                  "lower_order_final": False}, None, 25))
    # A config as Diffusers saves it: every key, lambda_min_clipped -Infinity.
    saved = json.loads(DPMSolverMultistepScheduler().to_json_string())
    cases.append(("dpm-saved-by-diffusers", saved, None, 10))
    return cases


def flow_cases():
    cases = []
    for shift in (1.0, 3.0, 2.7):
        for steps in STEPS:
            cfg = {"_class_name": "FlowMatchEulerDiscreteScheduler",
                   "num_train_timesteps": 1000, "shift": shift}
            cases.append((f"flow-shift{shift}-{steps}", cfg, None, steps))
    for steps in (2, 10, 25):
        cases.append((f"flow-terminal-{steps}", {"_class_name": "FlowMatchEulerDiscreteScheduler",
                      "shift": 3.0, "shift_terminal": 0.1}, None, steps))
    sd3 = {"_class_name": "FlowMatchEulerDiscreteScheduler", "_diffusers_version": "0.29.0",
           "base_image_seq_len": 256, "base_shift": 0.5, "max_image_seq_len": 4096,
           "max_shift": 1.15, "num_train_timesteps": 1000, "shift": 3.0,
           "use_dynamic_shifting": False, "invert_sigmas": False, "shift_terminal": None}
    cases.append(("flow-sd3-style-28", sd3, None, 28))
    cases.append(("flow-train100-7", {"_class_name": "FlowMatchEulerDiscreteScheduler",
                  "num_train_timesteps": 100, "shift": 2.0}, None, 7))
    # one step onto shift_terminal: Diffusers divides 0 by 0 (NaN sigmas)
    cases.append(("flow-terminal-1", {"_class_name": "FlowMatchEulerDiscreteScheduler",
                  "shift": 3.0, "shift_terminal": 0.1}, None, 1))
    return cases


# The scheduler_config.json of black-forest-labs/FLUX.1-dev and -schnell.
FLUX_DEV = {"_class_name": "FlowMatchEulerDiscreteScheduler", "_diffusers_version": "0.30.0.dev0",
            "base_image_seq_len": 256, "base_shift": 0.5, "max_image_seq_len": 4096,
            "max_shift": 1.15, "num_train_timesteps": 1000, "shift": 3.0,
            "use_dynamic_shifting": True}
FLUX_SCHNELL = {**FLUX_DEV, "shift": 1.0, "use_dynamic_shifting": False}


def flux_cases():
    """Dynamic shifting as FluxPipeline runs it, at several image token
    counts (FLUX: (latent_h / 2) * (latent_w / 2); 777 odd, 6000 past
    max_image_seq_len, 16 below base_image_seq_len)."""
    cases, c = [], 0
    for seq in (256, 1024, 4096, 777, 6000, 16):
        for tst in ("exponential", "linear"):
            for term in (None, 0.1):
                steps = [28, 4, 13, 2][c % 4]
                cfg = {**FLUX_DEV, "time_shift_type": tst}
                if term is not None:
                    cfg["shift_terminal"] = term
                cases.append((f"flux-dev-{tst}-seq{seq}-term{term}-{steps}", cfg, None, steps, seq))
                c += 1
    cases.append(("flux-dev-defaults-4096-1", FLUX_DEV, None, 1, 4096))
    cases.append(("flux-dev-terminal-1", {**FLUX_DEV, "shift_terminal": 0.2}, None, 1, 4096))
    cases.append(("flux-odd-config-300", {**FLUX_DEV, "base_shift": 0.25, "max_shift": 2.0,
                  "base_image_seq_len": 64, "max_image_seq_len": 1024,
                  "num_train_timesteps": 500}, None, 20, 300))
    # schnell: static shift 1, the sequence length is ignored; ditd runs
    # set_timesteps(steps), not FluxPipeline's sigma list (see docs/flux.md)
    for steps in (1, 4):
        cases.append((f"flux-schnell-4096-{steps}", FLUX_SCHNELL, None, steps, 4096))
    return cases


# A DiT-style checkpoint's scheduler (DDIM, as facebook/DiT-XL-2-256 ships),
# converted as in `DPMSolverMultistepScheduler.from_config(pipe.scheduler.config)`.
DIT = {"_class_name": "DDIMScheduler", "_diffusers_version": "0.12.0.dev0", "beta_end": 0.02,
       "beta_schedule": "linear", "beta_start": 0.0001, "clip_sample": False,
       "num_train_timesteps": 1000, "prediction_type": "epsilon", "set_alpha_to_one": True,
       "steps_offset": 0, "trained_betas": None}


def convert_cases():
    dit_lead = {**DIT, "timestep_spacing": "leading"}
    dpm_hidden = {"_class_name": "DPMSolverMultistepScheduler", "timestep_spacing": "trailing",
                  "clip_sample": True, "set_alpha_to_one": False, "steps_offset": 0,
                  "prediction_type": "v_prediction", "solver_type": "heun"}
    return [
        ("conv-dit-ddim-25", DIT, "ddim", 25),
        ("conv-dit-to-dpm-25", DIT, "dpmpp-2m", 25),
        ("conv-dit-to-dpm-10", DIT, "dpmpp-2m", 10),
        ("conv-dit-leading-to-dpm-10", dit_lead, "dpmpp-2m", 10),
        ("conv-dit-to-flow-10", DIT, "flow-euler", 10),
        ("conv-dpm-to-ddim-10", dpm_hidden, "ddim", 10),
        ("conv-flow-to-dpm-10", {"_class_name": "FlowMatchEulerDiscreteScheduler", "shift": 3.0,
                                 "num_train_timesteps": 500}, "dpmpp-2m", 10),
    ]


# --------------------------------------------------------------- running ---
def build(cfg, target):
    cls_name = cfg["_class_name"]
    sched = CLASSES[cls_name].from_config(cfg)  # what from_pretrained does
    if target is not None and KIND_OF[cls_name] != target:
        tcls = [c for n, c in CLASSES.items() if KIND_OF[n] == target][0]
        sched = tcls.from_config(sched.config)
    return sched


def dpm_amplification(sched, i, model_output, sample):
    """How much a DPM-Solver step magnifies ulp-level differences in its
    float32 coefficients: (sum of |term|) / |result|, from the coefficients
    Diffusers uses (copied from its first/second order update). Where terms
    of 1e4 cancel to a result of 1 (algorithm "dpmsolver" near sigma_max of
    squaredcos_cap_v2), a 1-ulp difference in torch's log/exp against libm's
    moves the result by 1e4 ulp, and the C test scales its tolerance by this."""
    sched = __import__("copy").deepcopy(sched)
    if sched.step_index is None:
        sched._init_step_index(sched.timesteps[i])
    conv = sched.convert_model_output(model_output, sample=sample).double()
    x = sample.double()
    st, ss = sched.sigmas[i + 1], sched.sigmas[i]
    at, st = sched._sigma_to_alpha_sigma_t(st)
    as_, ss = sched._sigma_to_alpha_sigma_t(ss)
    h = (torch.log(at) - torch.log(st)) - (torch.log(as_) - torch.log(ss))
    if sched.config.algorithm_type == "dpmsolver++":
        c1, c2 = st / ss, at * (torch.exp(-h) - 1.0)
    else:
        c1, c2 = at / as_, st * (torch.exp(h) - 1.0)
    terms = (c1.abs().item() * x.abs() + c2.abs().item() * conv.abs())
    result = (c1.item() * x - c2.item() * conv).abs().max().item()
    return max(1.0, terms.max().item() / max(result, 1e-30))


def run_case(cfg, target, steps, init, bank, seq=None):
    sched = build(cfg, target)
    if seq is not None and sched.config.use_dynamic_shifting:
        # FluxPipeline.__call__, step 5
        sigmas = np.linspace(1.0, 1 / steps, steps)
        mu = calculate_shift(seq, sched.config.get("base_image_seq_len", 256),
                             sched.config.get("max_image_seq_len", 4096),
                             sched.config.get("base_shift", 0.5),
                             sched.config.get("max_shift", 1.15))
        retrieve_timesteps(sched, steps, "cpu", sigmas=sigmas, mu=mu)
    else:
        sched.set_timesteps(steps)
    ts = sched.timesteps
    sample = init.clone()
    rows = []
    cond = 1.0
    for i, t in enumerate(ts):
        m = bank[i]
        before = sample
        if isinstance(sched, DDIMScheduler):
            out = sched.step(m, t, sample)
            x0 = out.pred_original_sample
        elif isinstance(sched, DPMSolverMultistepScheduler):
            cond = max(cond, dpm_amplification(sched, i, m, sample))
            out = sched.step(m, t, sample)
            if sched.config.algorithm_type == "dpmsolver++":
                x0 = sched.model_outputs[-1]
            else:  # model_outputs holds epsilon: x0 as ditd previews it
                alpha_t, sigma_t = sched._sigma_to_alpha_sigma_t(sched.sigmas[i])
                x0 = (before - sigma_t * sched.model_outputs[-1]) / alpha_t
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
        assert ts.dtype == torch.float32
        tlist = [float(v) for v in ts]
    return kind, tlist, np.stack(rows).astype(np.float32), cond


def main():
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(20240611)
    init = torch.randn(SHAPE, generator=g, dtype=torch.float32)
    bank = torch.randn((BANK_STEPS,) + SHAPE, generator=g, dtype=torch.float32)

    all_cases = ddim_cases() + dpm_cases() + flow_cases() + flux_cases() + convert_cases()
    index = {"diffusers": diffusers.__version__, "torch": torch.__version__,
             "numpy": np.__version__, "shape": list(SHAPE), "init": "init.npy",
             "bank": "bank.npy", "traj": "traj.npy", "philox": philox_fixture(), "cases": []}
    traj, row = [], 0
    names = set()
    for case in all_cases:
        name, cfg, target, steps = case[:4]
        seq = case[4] if len(case) > 4 else None
        extra = {"image_seq_len": seq} if seq is not None else {}
        assert name not in names, name
        names.add(name)
        if target == "refuse":  # Diffusers runs it, ditd refuses it by design
            index["cases"].append({"name": name, "config": json.dumps(cfg),
                                   "sampler": KIND_OF[cfg["_class_name"]], "steps": steps,
                                   "error": "refused by ditd"})
            continue
        try:
            kind, tlist, t, cond = run_case(cfg, target, steps, init, bank, seq)
            if not np.all(np.isfinite(t)):
                raise ValueError("Diffusers' sigmas are not finite")
        except (IndexError, ValueError) as e:
            # Diffusers fails on this one: ditd must refuse it.
            index["cases"].append({"name": name, "config": json.dumps(cfg),
                                   "sampler": target or KIND_OF[cfg["_class_name"]],
                                   "steps": steps, **extra, "error": repr(e)})
            print(f"{name}: Diffusers raises {e!r}", file=sys.stderr)
            continue
        assert len(tlist) <= BANK_STEPS
        assert np.all(np.isfinite(t)), name
        index["cases"].append({"name": name, "config": json.dumps(cfg), "sampler": kind,
                               "steps": steps, **extra, "timesteps": tlist, "row": row,
                               "cond": float(f"{cond:.3g}")})
        traj.append(t)
        row += len(tlist)

    os.makedirs(OUT, exist_ok=True)
    np.save(os.path.join(OUT, "init.npy"), init.numpy())
    np.save(os.path.join(OUT, "bank.npy"), bank.numpy())
    np.save(os.path.join(OUT, "traj.npy"), np.concatenate(traj))
    with open(os.path.join(OUT, "index.json"), "w") as f:
        json.dump(index, f, indent=0)
        f.write("\n")
    print(f"{len(index['cases'])} cases, {row} steps -> {OUT}", file=sys.stderr)


if __name__ == "__main__":
    main()
