#!/usr/bin/env python3
"""Reference fixtures for step caching (engine/pipeline/step_cache.c).

What it is: Diffusers 0.42's own cache hooks (apply_first_block_cache,
apply_taylorseer_cache, apply_mag_cache from diffusers.hooks) on the committed
tiny DiT fixture model (tests/fixtures/models/tiny-p2-c1-h6), float64, in the
DiTPipeline loop of tools/make_fixtures.py (sample_dit). DiTPipeline has no
cache_context: the whole [x; x] forward runs under one context, set once, as a
user of the hooks must. Per case it records the step-by-step decision of the
hook (did the blocks run at this step), the quantity compared (First Block
Cache's relative L1; MagCache's accumulated error) and the final latents.

Writes tests/fixtures/cache/:
  cases.json  - the cases: method, config fields (Diffusers names), class
                labels, guidance, steps, per-step "skipped" flags, the
                compared quantity per step, and the file names below
  <case>_noise.npy  float32 (n, C, S, S): the initial latents
  <case>_out.npy    float64 (n, C, S, S): Diffusers' final latents

Thresholds are chosen from an uncached pass so that some steps skip and some
do not, and no compared value lies within 2 % of its threshold (a float32 run
must take the same decisions). The script asserts both.

Run with the project's virtualenv:
  /root/ditd-venv/bin/python tools/make_cache_fixtures.py
The C test (tests/golden/test_step_cache.c) reads the files, never Python.
"""
import argparse
import json
import re
import sys
from pathlib import Path

import numpy as np
import torch

import diffusers
from diffusers import FlowMatchEulerDiscreteScheduler
from diffusers.hooks import (FirstBlockCacheConfig, MagCacheConfig, TaylorSeerCacheConfig,
                             apply_first_block_cache, apply_mag_cache, apply_taylorseer_cache)
from diffusers.hooks import first_block_cache as fbc_mod
from diffusers.hooks import mag_cache as mag_mod
from diffusers.hooks import taylorseer_cache as tay_mod
from diffusers.hooks.hooks import CacheContext, _set_cache_context

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tools"))
import make_fixtures as mf  # noqa: E402  (sample_dit, reference_model, load_state_dict)

MODEL = REPO / "tests" / "fixtures" / "models" / "tiny-p2-c1-h6"
OUT = REPO / "tests" / "fixtures" / "cache"
STEPS = 12
GUIDANCE = 4.0

assert diffusers.__version__ == "0.42.1", diffusers.__version__

LOG = []  # (kind, value, compute) per hook decision


def instrument():
    """Record each hook's decision as Diffusers takes it."""
    orig_fbc = fbc_mod.FBCHeadBlockHook._should_compute_remaining_blocks

    def fbc_should(self, residual):
        st = self.state_manager.get_state()
        prev = st.head_block_residual
        val = None
        if prev is not None:
            val = float(((residual - prev).abs().mean() / prev.abs().mean()).item())
        r = orig_fbc(self, residual)
        LOG.append(("fbc", val, bool(r)))
        return r

    fbc_mod.FBCHeadBlockHook._should_compute_remaining_blocks = fbc_should

    orig_mag = mag_mod.MagCacheHeadHook.new_forward

    def mag_forward(self, module, *args, **kwargs):
        out = orig_mag(self, module, *args, **kwargs)
        st = self.state_manager.get_state()
        LOG.append(("mag", float(st.accumulated_err), bool(st.should_compute)))
        return out

    mag_mod.MagCacheHeadHook.new_forward = mag_forward

    orig_cal = mag_mod.MagCacheBlockHook._perform_calibration_step

    def mag_cal(self, state, residual):
        orig_cal(self, state, residual)
        LOG.append(("cal", float(state.calibration_ratios[-1]), True))

    mag_mod.MagCacheBlockHook._perform_calibration_step = mag_cal

    orig_tay = tay_mod.TaylorSeerCacheHook._measure_should_compute

    def tay_should(self):
        r, st = orig_tay(self)
        LOG.append(("tay", None, bool(r)))
        return r, st

    tay_mod.TaylorSeerCacheHook._measure_should_compute = tay_should


def fresh_model():
    config = mf.DiTTransformer2DModel.load_config(MODEL / "transformer")
    sd = mf.load_state_dict(MODEL / "transformer")
    return mf.reference_model(config, sd, torch.float64)


def scheduler():
    return FlowMatchEulerDiscreteScheduler.from_pretrained(MODEL / "scheduler")


def run(method, fields, labels, noise, steps=STEPS, guidance=GUIDANCE):
    model = fresh_model()
    if method == "first_block_cache":
        apply_first_block_cache(model, FirstBlockCacheConfig(**fields))
    elif method == "taylorseer_cache":
        f = dict(fields)
        # float64 in the reference is ditd's float32 (the widest it keeps);
        # bfloat16 is bfloat16 on both sides
        f["taylor_factors_dtype"] = (torch.bfloat16 if f.get("taylor_factors_dtype") == "bfloat16"
                                     else torch.float64)
        apply_taylorseer_cache(model, TaylorSeerCacheConfig(**f))
    elif method == "mag_cache":
        apply_mag_cache(model, MagCacheConfig(**fields))
    _set_cache_context(model, CacheContext("cond"))
    LOG.clear()
    out = mf.sample_dit(model, scheduler(), labels, noise, guidance, steps,
                        model.config.num_embeds_ada_norm)
    return out.numpy(), list(LOG)


def per_step(log, kind, steps, per_forward=1):
    """The log of one kind, as (value, compute) per step."""
    rows = [(v, c) for k, v, c in log if k == kind]
    assert len(rows) == steps * per_forward, (kind, len(rows), steps, per_forward)
    return rows


def mag_margin(fields, steps):
    """The smallest |err - threshold| over the steps at which MagCacheHeadHook
    compares (the log keeps err after a reset, not the value compared):
    MagCache's decisions follow from the ratios alone, replayed here."""
    ratios = fields["mag_ratios"]
    retention = int(fields["retention_ratio"] * fields["num_inference_steps"] + 0.5)
    ratio, n, err, margin, have_res = 1.0, 0, 0.0, float("inf"), False
    for s in range(steps):
        if s >= retention:
            ratio *= ratios[s] if s < len(ratios) else 1.0
            n += 1
            err += abs(1.0 - ratio)
            if have_res and n <= fields["max_skip_steps"]:
                margin = min(margin, abs(err - fields["threshold"]))
            if not (have_res and err <= fields["threshold"] and n <= fields["max_skip_steps"]):
                ratio, n, err = 1.0, 0, 0.0
        have_res = True
    return margin


# ---------------------------------------------------------------- FLUX ---
FLUXDIR = REPO / "tests" / "fixtures" / "flux_pipeline"
FLUX_CASE = "dev_64_true_cfg"  # true CFG: a cond and an uncond state per sample
FLUX_STEPS = 12


def flux_run(method, fields, case, exp):
    """FluxPipeline (dev, true CFG, prompt embeddings given) with the hook on
    its transformer through transformer.enable_cache, as a user does."""
    from diffusers import AutoencoderKL, FluxPipeline, FluxTransformer2DModel
    d = FLUXDIR / "dev"
    tr = FluxTransformer2DModel.from_pretrained(d / "transformer", torch_dtype=torch.float64)
    vae = AutoencoderKL.from_pretrained(d / "vae", torch_dtype=torch.float64)
    sched = FlowMatchEulerDiscreteScheduler.from_pretrained(d / "scheduler")
    pipe = FluxPipeline(scheduler=sched, vae=vae, text_encoder=None, tokenizer=None,
                        text_encoder_2=None, tokenizer_2=None, transformer=tr)
    pipe.set_progress_bar_config(disable=True)
    if method == "first_block_cache":
        tr.enable_cache(FirstBlockCacheConfig(**fields))
    elif method == "mag_cache":
        tr.enable_cache(MagCacheConfig(**fields))
    elif method == "taylorseer_cache":
        f = dict(fields, taylor_factors_dtype=torch.float64)  # ditd: float32
        tr.enable_cache(TaylorSeerCacheConfig(**f))
    ld = lambda k: torch.from_numpy(np.load(exp / case[k])).to(torch.float64)
    noise = np.load(exp / case["noise"])
    B, C, h, w = noise.shape
    packed = FluxPipeline._pack_latents(torch.from_numpy(noise), B, C, h, w).to(torch.float64)
    LOG.clear()
    with torch.no_grad():
        lat = pipe(prompt_embeds=ld("prompt_embeds"), pooled_prompt_embeds=ld("pooled"),
                   negative_prompt_embeds=ld("negative_prompt_embeds"),
                   negative_pooled_prompt_embeds=ld("negative_pooled"),
                   true_cfg_scale=case["true_cfg_scale"], height=case["height"],
                   width=case["width"], num_inference_steps=FLUX_STEPS,
                   guidance_scale=case["guidance_scale"], latents=packed, output_type="latent",
                   return_dict=False)[0]
    out = FluxPipeline._unpack_latents(lat, case["height"], case["width"], 8)
    return out.numpy(), noise, list(LOG)


def flux_cases():
    exp = FLUXDIR / "expected"
    case = next(c for c in json.loads((exp / "cases.json").read_text())["cases"]
                if c["name"] == FLUX_CASE)
    out_cases = []

    def branches(log, kind):
        rows = [(v, c) for k, v, c in log if k == kind]
        assert len(rows) == 2 * FLUX_STEPS, (kind, len(rows))
        return rows

    def emit(name, method, fields, out, noise, rows):
        skipped = [[not rows[2 * s + b][1] for s in range(FLUX_STEPS)] for b in range(2)]
        n_skip = sum(map(sum, skipped))
        assert 0 < n_skip < 2 * FLUX_STEPS, (name, skipped)
        np.save(OUT / f"{name}_noise.npy", noise.astype("<f4"))
        np.save(OUT / f"{name}_out.npy", out.astype("<f8"))
        out_cases.append({
            "name": name, "family": "flux", "method": method, "fields": fields,
            "flux_case": FLUX_CASE, "steps": FLUX_STEPS,
            "skipped": [a and b for a, b in zip(*skipped)], "skipped_branches": skipped,
            "values_branches": [[rows[2 * s + b][0] for s in range(FLUX_STEPS)] for b in range(2)],
            "noise": f"{name}_noise.npy", "out": f"{name}_out.npy", "dtype_reference": "float64"})
        print(f"{name}: skipped cond {skipped[0]} uncond {skipped[1]}", file=sys.stderr)

    # First Block Cache: a threshold between the measured values, 2 % clear of all
    _, _, log = flux_run("first_block_cache", {"threshold": 0.0}, case, exp)
    vals = sorted(v for v, _ in branches(log, "fbc") if v is not None)
    gaps = sorted(range(len(vals) - 1), key=lambda i: -vals[i + 1] / vals[i])
    for k in gaps:
        thr = float(np.sqrt(vals[k] * vals[k + 1]))
        out, noise, log = flux_run("first_block_cache", {"threshold": thr}, case, exp)
        rows = branches(log, "fbc")
        n_skip = sum(not c for _, c in rows)
        if 1 < n_skip < 2 * FLUX_STEPS - 4 and all(v is None or abs(v - thr) > 0.02 * thr
                                                   for v, _ in rows):
            break
    else:
        raise SystemExit("no FLUX First Block Cache threshold fits")
    emit("flux_fbc", "first_block_cache", {"threshold": thr}, out, noise, rows)

    # MagCache with FLUX's published ratios, interpolated to 12 steps
    fields = {"threshold": 0.1, "max_skip_steps": 2, "retention_ratio": 0.2,
              "num_inference_steps": FLUX_STEPS,
              "mag_ratios": [float(x) for x in mag_mod.FLUX_MAG_RATIOS.tolist()]}
    out, noise, log = flux_run("mag_cache", fields, case, exp)
    emit("flux_mag", "mag_cache", dict(fields, mag_ratios="FLUX"), out, noise,
         branches(log, "mag"))
    # TaylorSeer's lite mode: every block skip-predicted (zeros), proj_out
    # predicted; 3 blocks + proj_out hooked, called once per forward each
    fields = {"cache_interval": 3, "disable_cache_before_step": 2, "max_order": 1,
              "use_lite_mode": True}
    out, noise, log = flux_run("taylorseer_cache", fields, case, exp)
    rows = [c for k2, _, c in log if k2 == "tay"]
    per = 4
    assert len(rows) == 2 * FLUX_STEPS * per, len(rows)
    comp = [[any(rows[(2 * s + b) * per:(2 * s + b + 1) * per]) for s in range(FLUX_STEPS)]
            for b in range(2)]
    skipped = [[not x for x in comp[b]] for b in range(2)]
    assert 0 < sum(map(sum, skipped)) < 2 * FLUX_STEPS
    np.save(OUT / "flux_tay_lite_noise.npy", noise.astype("<f4"))
    np.save(OUT / "flux_tay_lite_out.npy", out.astype("<f8"))
    out_cases.append({
        "name": "flux_tay_lite", "family": "flux", "method": "taylorseer_cache",
        "fields": dict(fields, taylor_factors_dtype="float32"), "flux_case": FLUX_CASE,
        "steps": FLUX_STEPS, "skipped": [a and b for a, b in zip(*skipped)],
        "noise": "flux_tay_lite_noise.npy", "out": "flux_tay_lite_out.npy",
        "dtype_reference": "float64"})
    print(f"flux_tay_lite: skipped cond {skipped[0]} uncond {skipped[1]}", file=sys.stderr)

    # TaylorSeer on the two-stream modules: Diffusers' default config (its
    # default identifiers hook every block's attn: a double block's returns
    # the image and text outputs, a single block's the attention of [text;
    # image]) and whole blocks (each returns both streams) at order 2
    cfgs = json.loads((FLUXDIR / "dev" / "transformer" / "config.json").read_text())
    nb = cfgs["num_layers"] + cfgs["num_single_layers"]
    for name, fields in (
            ("flux_tay_default", {}),
            ("flux_tay_blocks", {"cache_interval": 3, "disable_cache_before_step": 2,
                                 "max_order": 2,
                                 "cache_identifiers": [r"transformer_blocks\.\d+",
                                                       r"single_transformer_blocks\.\d+"]})):
        out, noise, log = flux_run("taylorseer_cache", fields, case, exp)
        rows = [c for k2, _, c in log if k2 == "tay"]
        assert len(rows) == 2 * FLUX_STEPS * nb, (name, len(rows))
        comp = [[any(rows[(2 * s + b) * nb:(2 * s + b + 1) * nb]) for s in range(FLUX_STEPS)]
                for b in range(2)]
        skipped = [[not x for x in comp[b]] for b in range(2)]
        assert 0 < sum(map(sum, skipped)) < 2 * FLUX_STEPS
        np.save(OUT / f"{name}_noise.npy", noise.astype("<f4"))
        np.save(OUT / f"{name}_out.npy", out.astype("<f8"))
        out_cases.append({
            "name": name, "family": "flux", "method": "taylorseer_cache",
            "fields": dict(fields, taylor_factors_dtype="float32"), "flux_case": FLUX_CASE,
            "steps": FLUX_STEPS, "skipped": [a and b for a, b in zip(*skipped)],
            "modules_per_step": 2 * nb, "noise": f"{name}_noise.npy", "out": f"{name}_out.npy",
            "dtype_reference": "float64"})
        print(f"{name}: skipped cond {skipped[0]} uncond {skipped[1]}", file=sys.stderr)
    return out_cases


# ----------------------------------------------------------------- SD3 ---
SD3DIR = REPO / "tests" / "fixtures" / "sd3_pipeline"
SD3_CASE = "sd3_48_slg"  # its embeddings and noise; run here without skip-layer guidance
SD3_STEPS = 12


def sd3_tail_text_passthrough(tr):
    """SD3's last JointTransformerBlock is context_pre_only and returns None
    for the text stream. Diffusers' FBCBlockHook (tail) subtracts the head's
    text output from it and FBCHeadBlockHook adds that residual back on a
    skip: both raise TypeError on SD3 (diffusers 0.42.1). Here the tail's
    text output is its text input instead of None: a value nothing reads
    (SD3Transformer2DModel's norm_out and proj_out read only the image
    stream), so the hooks' arithmetic runs and every image value is
    Diffusers' own. Applied before the hooks wrap the block."""
    tail = tr.transformer_blocks[-1]
    assert tail.context_pre_only
    orig = tail.forward

    def forward(hidden_states, encoder_hidden_states, temb, *args, **kwargs):
        enc, hid = orig(hidden_states, encoder_hidden_states, temb, *args, **kwargs)
        assert enc is None
        return encoder_hidden_states, hid

    tail.forward = forward


def sd3_run(method, fields, case, exp):
    """StableDiffusion3Pipeline (CFG, prompt embeddings given), the hook
    applied to its transformer with diffusers.hooks' apply_* (SD3Transformer2DModel
    has no CacheMixin: no enable_cache, no cache_context). The pipeline sets
    no cache context: MagCache's hooks then set their own ("inference"),
    First Block Cache needs one set by its user: one for the whole call, as
    for DiT. Either way the [uncond; cond] rows of a step share one state."""
    from diffusers import AutoencoderKL, SD3Transformer2DModel, StableDiffusion3Pipeline
    d = SD3DIR / case["folder"]
    tr = SD3Transformer2DModel.from_pretrained(d / "transformer", torch_dtype=torch.float64)
    vae = AutoencoderKL.from_pretrained(d / "vae", torch_dtype=torch.float64)
    sched = FlowMatchEulerDiscreteScheduler.from_pretrained(d / "scheduler")
    pipe = StableDiffusion3Pipeline(transformer=tr, scheduler=sched, vae=vae, text_encoder=None,
                                    tokenizer=None, text_encoder_2=None, tokenizer_2=None,
                                    text_encoder_3=None, tokenizer_3=None)
    pipe.set_progress_bar_config(disable=True)
    if method == "first_block_cache":
        sd3_tail_text_passthrough(tr)
        apply_first_block_cache(tr, FirstBlockCacheConfig(**fields))
        _set_cache_context(tr, CacheContext("cond"))
    elif method == "mag_cache":
        apply_mag_cache(tr, MagCacheConfig(**fields))
    elif method == "taylorseer_cache":
        if any(re.fullmatch(p, "transformer_blocks.1") for p in fields.get("cache_identifiers", [])):
            # a hooked context_pre_only block returns (None, hidden_states):
            # TaylorSeerState.update reads None.dtype (AttributeError,
            # diffusers 0.42.1); its text output is read by nothing
            sd3_tail_text_passthrough(tr)
        apply_taylorseer_cache(tr, TaylorSeerCacheConfig(**dict(fields,
                                                                taylor_factors_dtype=torch.float64)))
        _set_cache_context(tr, CacheContext("cond"))
    ld = lambda k: torch.from_numpy(np.load(exp / case[k])).to(torch.float64)
    noise = np.load(exp / case["noise"])
    LOG.clear()
    with torch.no_grad():
        out = pipe(prompt_embeds=ld("prompt_embeds"), pooled_prompt_embeds=ld("pooled"),
                   negative_prompt_embeds=ld("negative_prompt_embeds"),
                   negative_pooled_prompt_embeds=ld("negative_pooled"),
                   guidance_scale=case["guidance_scale"], height=case["height"],
                   width=case["width"], num_inference_steps=SD3_STEPS,
                   latents=torch.from_numpy(noise).to(torch.float64), output_type="latent",
                   return_dict=False)[0]
    return out.numpy(), noise, list(LOG)


def sd3_cases():
    exp = SD3DIR / "expected"
    case = next(c for c in json.loads((exp / "cases.json").read_text())["cases"]
                if c["name"] == SD3_CASE)
    assert case["cfg_used"] and case["batch"] == 1
    out_cases = []

    def emit(name, method, fields, out, noise, rows, extra=None):
        skipped = [not c for _, c in rows]
        assert 0 < sum(skipped) < SD3_STEPS, (name, skipped)
        np.save(OUT / f"{name}_noise.npy", noise.astype("<f4"))
        np.save(OUT / f"{name}_out.npy", out.astype("<f8"))
        c = {"name": name, "family": "sd3", "method": method, "fields": fields,
             "sd3_case": SD3_CASE, "steps": SD3_STEPS, "skipped": skipped,
             "values": [v for v, _ in rows], "noise": f"{name}_noise.npy",
             "out": f"{name}_out.npy", "dtype_reference": "float64"}
        c.update(extra or {})
        out_cases.append(c)
        print(f"{name}: skipped {skipped}", file=sys.stderr)

    # First Block Cache: a threshold between the measured values, 2 % clear of all
    _, _, log = sd3_run("first_block_cache", {"threshold": 0.0}, case, exp)
    vals = sorted(v for v, _ in per_step(log, "fbc", SD3_STEPS) if v is not None)
    gaps = sorted(range(len(vals) - 1), key=lambda i: -vals[i + 1] / vals[i])
    for k in gaps:
        thr = float(np.sqrt(vals[k] * vals[k + 1]))
        out, noise, log = sd3_run("first_block_cache", {"threshold": thr}, case, exp)
        rows = per_step(log, "fbc", SD3_STEPS)
        n_skip = sum(not c for _, c in rows)
        if 1 < n_skip < SD3_STEPS - 2 and all(v is None or abs(v - thr) > 0.02 * thr
                                               for v, _ in rows):
            break
    else:
        raise SystemExit("no SD3 First Block Cache threshold fits")
    emit("sd3_fbc", "first_block_cache", {"threshold": thr}, out, noise, rows)

    # MagCache: ratios calibrated on this model (the calibration checked too),
    # then a threshold that skips some steps
    cal_fields = {"calibrate": True, "num_inference_steps": SD3_STEPS}
    out_c, noise, log = sd3_run("mag_cache", cal_fields, case, exp)
    ratios = [v for k2, v, _ in log if k2 == "cal"]
    assert len(ratios) == SD3_STEPS
    np.save(OUT / "sd3_mag_calibrate_out.npy", out_c.astype("<f8"))
    out_cases.append({"name": "sd3_mag_calibrate", "family": "sd3", "method": "mag_cache",
                      "fields": cal_fields, "sd3_case": SD3_CASE, "steps": SD3_STEPS,
                      "skipped": [False] * SD3_STEPS, "calibration": ratios,
                      "noise": "sd3_mag_noise.npy", "out": "sd3_mag_calibrate_out.npy",
                      "dtype_reference": "float64"})
    for thr in (0.3, 0.5, 0.8, 1.2):
        fields = {"threshold": thr, "max_skip_steps": 2, "retention_ratio": 0.2,
                  "num_inference_steps": SD3_STEPS, "mag_ratios": [float(r) for r in ratios]}
        out, noise, log = sd3_run("mag_cache", fields, case, exp)
        rows = per_step(log, "mag", SD3_STEPS)
        n_skip = sum(not c for _, c in rows)
        if 1 < n_skip < SD3_STEPS - 2 and mag_margin(fields, SD3_STEPS) > 0.02 * thr:
            break
    else:
        raise SystemExit("no SD3 MagCache threshold fits")
    emit("sd3_mag", "mag_cache", fields, out, noise, rows)

    # TaylorSeer on the single-stream modules (ff of each block, ff_context
    # of all but the context_pre_only last one), order 1, float64 factors
    # here (ditd: float32); one context, as First Block Cache
    n_layers = json.loads((SD3DIR / case["folder"] / "transformer" / "config.json")
                          .read_text())["num_layers"]
    fields = {"cache_interval": 3, "disable_cache_before_step": 2, "max_order": 1,
              "cache_identifiers": [r"transformer_blocks\.\d+\.ff",
                                    r"transformer_blocks\.\d+\.ff_context"]}
    per = 2 * n_layers - 1
    out, noise, log = sd3_run("taylorseer_cache", fields, case, exp)
    rows = [c for k2, _, c in log if k2 == "tay"]
    assert len(rows) == SD3_STEPS * per, len(rows)
    comp = [any(rows[s * per:(s + 1) * per]) for s in range(SD3_STEPS)]
    emit("sd3_tay_ff", "taylorseer_cache", dict(fields, taylor_factors_dtype="float32"), out,
         noise, [(None, c) for c in comp], {"modules_per_step": per})

    # TaylorSeer on the two-stream modules: Diffusers' default config (every
    # block's attn: the image and text outputs; the context_pre_only block's
    # text attention output is read by nothing) and whole blocks at order 2
    assert n_layers == 2  # transformer_blocks.1 is the context_pre_only tail
    for name, fields in (
            ("sd3_tay_default", {}),
            ("sd3_tay_blocks", {"cache_interval": 3, "disable_cache_before_step": 2,
                                "max_order": 2,
                                "cache_identifiers": [r"transformer_blocks\.\d+"]})):
        out, noise, log = sd3_run("taylorseer_cache", fields, case, exp)
        rows = [c for k2, _, c in log if k2 == "tay"]
        assert len(rows) == SD3_STEPS * n_layers, (name, len(rows))
        comp = [any(rows[s * n_layers:(s + 1) * n_layers]) for s in range(SD3_STEPS)]
        emit(name, "taylorseer_cache", dict(fields, taylor_factors_dtype="float32"), out, noise,
             [(None, c) for c in comp], {"modules_per_step": n_layers})
    return out_cases


# ----------------------------------------------------------------- Wan ---
WANDIR = REPO / "tests" / "fixtures" / "wan_pipeline"
WAN_CASE = "wan_9f_48x32_negative"  # its embeddings and noise (3 latent frames of 6x4)
WAN_STEPS = 12


def wan_run(method, fields, case, exp):
    """WanPipeline (CFG with a negative prompt, prompt embeddings given) with
    the hook on its transformer through transformer.enable_cache, as a user
    does; the pipeline runs its two passes under cache_context("cond") and
    ("uncond"): a state per branch. Float64 throughout, given latents kept
    float64 as tools/make_wan_pipeline_fixtures.py keeps them."""
    from diffusers import AutoencoderKLWan, UniPCMultistepScheduler, WanPipeline, WanTransformer3DModel
    d = WANDIR / case["folder"]
    # wan22 (two experts) commits its model_index.json and transformer_2/;
    # the rest is wan21's (tests/fixtures/wan_pipeline/assemble.py)
    two = (d / "transformer_2").is_dir()
    base = WANDIR / "wan21" if two else d
    tr = WanTransformer3DModel.from_pretrained(base / "transformer", torch_dtype=torch.float64)
    tr.to(torch.float64)  # _keep_in_fp32_modules kept scale_shift_table float32
    tr2 = None
    if two:
        tr2 = WanTransformer3DModel.from_pretrained(d / "transformer_2", torch_dtype=torch.float64)
        tr2.to(torch.float64)
    vae = AutoencoderKLWan.from_pretrained(base / "vae", torch_dtype=torch.float64)
    sched = UniPCMultistepScheduler.from_pretrained(base / "scheduler")
    mi = json.loads((d / "model_index.json").read_text())
    pipe = WanPipeline(tokenizer=None, text_encoder=None, transformer=tr, vae=vae, scheduler=sched,
                       transformer_2=tr2, boundary_ratio=mi.get("boundary_ratio"))
    pipe.set_progress_bar_config(disable=True)
    orig = pipe.prepare_latents

    def prepare_latents(*a, **k):
        lat = k.get("latents", a[-1] if a else None)
        return lat.to(torch.float64) if lat is not None else orig(*a, **k)

    pipe.prepare_latents = prepare_latents
    # two experts: the cache enabled on each, each with hooks and states of
    # its own (a user of the hooks enables both)
    for t in (tr, tr2):
        if t is None:
            continue
        if method == "first_block_cache":
            t.enable_cache(FirstBlockCacheConfig(**fields))
        elif method == "mag_cache":
            t.enable_cache(MagCacheConfig(**fields))
        elif method == "taylorseer_cache":
            t.enable_cache(TaylorSeerCacheConfig(**dict(fields, taylor_factors_dtype=torch.float64)))
        for k, v in list(t.named_parameters()) + list(t.named_buffers()):
            assert not v.is_floating_point() or v.dtype == torch.float64, k
    kw = {"guidance_scale_2": case["guidance_scale_2"]} if case.get("guidance_scale_2") else {}
    ld = lambda k: torch.from_numpy(np.load(exp / case[k])).to(torch.float64)
    noise = np.load(exp / case["noise"])
    LOG.clear()
    with torch.no_grad():
        out = pipe(prompt_embeds=ld("prompt_embeds"), negative_prompt_embeds=ld("negative_prompt_embeds"),
                   guidance_scale=case["guidance_scale"], height=case["height"],
                   width=case["width"], num_frames=case["num_frames"],
                   num_inference_steps=WAN_STEPS, max_sequence_length=case["max_sequence_length"],
                   latents=torch.from_numpy(noise).to(torch.float64), output_type="latent",
                   return_dict=False, **kw)[0]
    assert out.dtype == torch.float64
    return out.numpy(), noise, list(LOG)


def wan_cases():
    exp = WANDIR / "expected"
    case = next(c for c in json.loads((exp / "cases.json").read_text())["cases"]
                if c["name"] == WAN_CASE)
    assert case["cfg_used"] and case["batch"] == 1
    out_cases = []

    def branches(log, kind):
        rows = [(v, c) for k, v, c in log if k == kind]
        assert len(rows) == 2 * WAN_STEPS, (kind, len(rows))
        return rows

    def emit(name, method, fields, out, noise, rows, extra=None):
        skipped = [[not rows[2 * s + b][1] for s in range(WAN_STEPS)] for b in range(2)]
        n_skip = sum(map(sum, skipped))
        assert 0 < n_skip < 2 * WAN_STEPS, (name, skipped)
        np.save(OUT / f"{name}_noise.npy", noise.astype("<f4"))
        np.save(OUT / f"{name}_out.npy", out.astype("<f8"))
        c = {"name": name, "family": "wan", "method": method, "fields": fields,
             "wan_case": WAN_CASE, "steps": WAN_STEPS,
             "skipped": [a and b for a, b in zip(*skipped)], "skipped_branches": skipped,
             "values_branches": [[rows[2 * s + b][0] for s in range(WAN_STEPS)] for b in range(2)],
             "noise": f"{name}_noise.npy", "out": f"{name}_out.npy", "dtype_reference": "float64"}
        c.update(extra or {})
        out_cases.append(c)
        print(f"{name}: skipped cond {skipped[0]} uncond {skipped[1]}", file=sys.stderr)

    # First Block Cache: a threshold between the measured values (both
    # branches), 2 % clear of all; preferably one at which the branches decide
    # differently somewhere (their states are apart)
    _, _, log = wan_run("first_block_cache", {"threshold": 0.0}, case, exp)
    vals = sorted(v for v, _ in branches(log, "fbc") if v is not None)
    gaps = sorted(range(len(vals) - 1), key=lambda i: -vals[i + 1] / vals[i])
    fits = []
    for k in gaps:
        thr = float(np.sqrt(vals[k] * vals[k + 1]))
        out, noise, log = wan_run("first_block_cache", {"threshold": thr}, case, exp)
        rows = branches(log, "fbc")
        n_skip = sum(not c for _, c in rows)
        if 1 < n_skip < 2 * WAN_STEPS - 4 and all(v is None or abs(v - thr) > 0.02 * thr
                                                  for v, _ in rows):
            fits.append((thr, out, noise, rows))
            if any(rows[2 * s][1] != rows[2 * s + 1][1] for s in range(WAN_STEPS)):
                fits = fits[-1:]
                break
    if not fits:
        raise SystemExit("no Wan First Block Cache threshold fits")
    thr, out, noise, rows = fits[0]
    emit("wan_fbc", "first_block_cache", {"threshold": thr}, out, noise, rows)

    # MagCache: ratios calibrated per branch here; Diffusers' calibration
    # prints each context's list, the hook takes one: the cond branch's
    cal_fields = {"calibrate": True, "num_inference_steps": WAN_STEPS}
    out_c, noise, log = wan_run("mag_cache", cal_fields, case, exp)
    cal = [v for k2, v, _ in log if k2 == "cal"]
    assert len(cal) == 2 * WAN_STEPS
    cal_br = [cal[0::2], cal[1::2]]
    np.save(OUT / "wan_mag_calibrate_out.npy", out_c.astype("<f8"))
    out_cases.append({"name": "wan_mag_calibrate", "family": "wan", "method": "mag_cache",
                      "fields": cal_fields, "wan_case": WAN_CASE, "steps": WAN_STEPS,
                      "skipped": [False] * WAN_STEPS, "calibration": cal_br[0],
                      "calibration_branches": cal_br,
                      "noise": "wan_mag_noise.npy", "out": "wan_mag_calibrate_out.npy",
                      "dtype_reference": "float64"})
    for thr in (0.1, 0.2, 0.3, 0.5, 0.8):
        fields = {"threshold": thr, "max_skip_steps": 2, "retention_ratio": 0.2,
                  "num_inference_steps": WAN_STEPS, "mag_ratios": [float(r) for r in cal_br[0]]}
        out, noise, log = wan_run("mag_cache", fields, case, exp)
        rows = branches(log, "mag")
        n_skip = sum(not c for _, c in rows)
        if 1 < n_skip < 2 * WAN_STEPS - 4 and mag_margin(fields, WAN_STEPS) > 0.02 * thr:
            break
    else:
        raise SystemExit("no Wan MagCache threshold fits")
    emit("wan_mag", "mag_cache", fields, out, noise, rows)

    # TaylorSeer (float64 factors here, float32 in ditd): attn1, attn2 and
    # ffn of every block at order 1; whole blocks at order 2 with a cool-down
    n_layers = json.loads((WANDIR / case["folder"] / "transformer" / "config.json")
                          .read_text())["num_layers"]
    tay = [("wan_tay_modules", {"cache_interval": 3, "disable_cache_before_step": 2,
                                "max_order": 1,
                                "cache_identifiers": [r"blocks\.\d+\.attn1", r"blocks\.\d+\.attn2",
                                                      r"blocks\.\d+\.ffn"]}, 3 * n_layers),
           ("wan_tay_blocks", {"cache_interval": 2, "disable_cache_before_step": 3,
                               "max_order": 2, "disable_cache_after_step": 10,
                               "cache_identifiers": [r"blocks\.\d+"]}, n_layers),
           # the lite mode: every block skip-predicted (zeros), proj_out predicted
           ("wan_tay_lite", {"cache_interval": 3, "disable_cache_before_step": 2,
                             "max_order": 1, "use_lite_mode": True}, n_layers + 1)]
    for name, fields, per in tay:
        out, noise, log = wan_run("taylorseer_cache", fields, case, exp)
        rows = [c for k2, _, c in log if k2 == "tay"]
        assert len(rows) == 2 * WAN_STEPS * per, (name, len(rows))
        comp = [[any(rows[(2 * s + b) * per:(2 * s + b + 1) * per]) for s in range(WAN_STEPS)]
                for b in range(2)]
        skipped = [[not x for x in comp[b]] for b in range(2)]
        assert 0 < sum(map(sum, skipped)) < 2 * WAN_STEPS, (name, skipped)
        np.save(OUT / f"{name}_noise.npy", noise.astype("<f4"))
        np.save(OUT / f"{name}_out.npy", out.astype("<f8"))
        out_cases.append({
            "name": name, "family": "wan", "method": "taylorseer_cache",
            "fields": dict(fields, taylor_factors_dtype="float32"), "wan_case": WAN_CASE,
            "steps": WAN_STEPS, "skipped": [a and b for a, b in zip(*skipped)],
            "modules_per_step": per, "noise": f"{name}_noise.npy", "out": f"{name}_out.npy",
            "dtype_reference": "float64"})
        print(f"{name}: skipped cond {skipped[0]} uncond {skipped[1]}", file=sys.stderr)
    return out_cases


WAN22_CASE = "wan22_5f_32x48_experts"  # two experts, CFG (guidance_scale_2 = guidance_scale)


def wan22_cases():
    """Wan 2.2's two experts: transformer above boundary_ratio, transformer_2
    below, the cache enabled on each (a state per expert and branch)."""
    exp = WANDIR / "expected"
    case = next(c for c in json.loads((exp / "cases.json").read_text())["cases"]
                if c["name"] == WAN22_CASE)
    assert case["folder"] == "wan22" and case["batch"] == 1 and case["cfg_used"]
    out_cases = []

    def branches(log, kind):
        rows = [(v, c) for k, v, c in log if k == kind]
        assert len(rows) == 2 * WAN_STEPS, (kind, len(rows))
        return rows

    def emit(name, method, fields, out, noise, skipped, extra=None):
        assert 0 < sum(map(sum, skipped)) < 2 * WAN_STEPS, (name, skipped)
        np.save(OUT / f"{name}_noise.npy", noise.astype("<f4"))
        np.save(OUT / f"{name}_out.npy", out.astype("<f8"))
        c = {"name": name, "family": "wan22", "method": method, "fields": fields,
             "wan22_case": WAN22_CASE, "steps": WAN_STEPS,
             "skipped": [a and b for a, b in zip(*skipped)], "skipped_branches": skipped,
             "noise": f"{name}_noise.npy", "out": f"{name}_out.npy", "dtype_reference": "float64"}
        c.update(extra or {})
        out_cases.append(c)
        print(f"{name}: skipped cond {skipped[0]} uncond {skipped[1]}", file=sys.stderr)

    # First Block Cache: a threshold between the measured values, 2 % clear of all
    _, _, log = wan_run("first_block_cache", {"threshold": 0.0}, case, exp)
    vals = sorted(v for v, _ in branches(log, "fbc") if v is not None)
    gaps = sorted(range(len(vals) - 1), key=lambda i: -vals[i + 1] / vals[i])
    for k in gaps:
        thr = float(np.sqrt(vals[k] * vals[k + 1]))
        out, noise, log = wan_run("first_block_cache", {"threshold": thr}, case, exp)
        rows = branches(log, "fbc")
        n_skip = sum(not c for _, c in rows)
        if 1 < n_skip < 2 * WAN_STEPS - 4 and all(v is None or abs(v - thr) > 0.02 * thr
                                                  for v, _ in rows):
            break
    else:
        raise SystemExit("no Wan 2.2 First Block Cache threshold fits")
    emit("wan22_fbc", "first_block_cache", {"threshold": thr}, out, noise,
         [[not rows[2 * s + b][1] for s in range(WAN_STEPS)] for b in range(2)])

    # TaylorSeer on whole blocks: each expert's modules count their own
    # calls, so the second expert warms up again at its first step
    n_layers = json.loads((WANDIR / "wan21" / "transformer" / "config.json")
                          .read_text())["num_layers"]
    fields = {"cache_interval": 2, "disable_cache_before_step": 2, "max_order": 1,
              "cache_identifiers": [r"blocks\.\d+"]}
    out, noise, log = wan_run("taylorseer_cache", fields, case, exp)
    rows = [c for k2, _, c in log if k2 == "tay"]
    per = n_layers
    assert len(rows) == 2 * WAN_STEPS * per, len(rows)
    comp = [[any(rows[(2 * s + b) * per:(2 * s + b + 1) * per]) for s in range(WAN_STEPS)]
            for b in range(2)]
    emit("wan22_tay_blocks", "taylorseer_cache", dict(fields, taylor_factors_dtype="float32"),
         out, noise, [[not x for x in comp[b]] for b in range(2)], {"modules_per_step": per})
    del out_cases[-1]["skipped_branches"]  # the C test's block-evaluation count is FBC's / Mag's
    return out_cases


def dit_cases():
    cfg = json.loads((MODEL / "transformer" / "config.json").read_text())
    C, S = cfg["in_channels"], cfg["sample_size"]
    rng = np.random.default_rng(2024)
    cases = []

    def emit(name, method, fields, labels, noise, skipped, values, out, extra=None):
        np.save(OUT / f"{name}_noise.npy", noise.astype("<f4"))
        np.save(OUT / f"{name}_out.npy", out.astype("<f8"))
        case = {"name": name, "method": method, "fields": fields, "class_labels": labels,
                "guidance_scale": GUIDANCE, "steps": STEPS, "skipped": skipped,
                "values": values, "noise": f"{name}_noise.npy", "out": f"{name}_out.npy",
                "dtype_reference": "float64"}
        if extra:
            case.update(extra)
        n_skip = sum(skipped)
        assert 0 < n_skip < STEPS, f"{name}: {n_skip} of {STEPS} steps skipped"
        cases.append(case)
        print(f"{name}: skipped {skipped}", file=sys.stderr)

    noise = rng.standard_normal((1, C, S, S)).astype(np.float32)
    labels = [3]

    # ---- First Block Cache: threshold between the measured relative L1s
    _, log = run("first_block_cache", {"threshold": 0.0}, labels, noise)
    vals = [v for v, _ in per_step(log, "fbc", STEPS)][1:]
    srt = sorted(vals)
    # thresholds at the gaps between the measured values, widest first, until
    # one gives some skips, some computes, and every value 2 % away from it
    gaps = sorted(range(len(srt) - 1), key=lambda i: -srt[i + 1] / srt[i])
    for k in gaps:
        thr = float(np.sqrt(srt[k] * srt[k + 1]))
        out, log = run("first_block_cache", {"threshold": thr}, labels, noise)
        rows = per_step(log, "fbc", STEPS)
        n_skip = sum(not c for _, c in rows)
        if 0 < n_skip < STEPS - 1 and all(v is None or abs(v - thr) > 0.02 * thr
                                          for v, _ in rows):
            break
    else:
        raise SystemExit("no First Block Cache threshold fits")
    emit("fbc", "first_block_cache", {"threshold": thr}, labels, noise,
         [not c for _, c in rows], [v for v, _ in rows], out)

    # ---- MagCache: ratios calibrated on this model, then a threshold
    _, log = run("mag_cache", {"calibrate": True, "num_inference_steps": STEPS}, labels, noise)
    ratios = [v for k2, v, _ in log if k2 == "cal"]
    assert len(ratios) == STEPS
    emit_cal = ratios
    fields = {"threshold": 0.25, "max_skip_steps": 2, "retention_ratio": 0.2,
              "num_inference_steps": STEPS, "mag_ratios": [float(r) for r in ratios]}
    out, log = run("mag_cache", fields, labels, noise)
    rows = per_step(log, "mag", STEPS)
    emit("mag", "mag_cache", fields, labels, noise, [not c for _, c in rows],
         [v for v, _ in rows], out)
    # calibration itself: ditd's measured ratios against Diffusers'
    out_c, _ = run("mag_cache", {"calibrate": True, "num_inference_steps": STEPS}, labels, noise)
    cases.append({"name": "mag_calibrate", "method": "mag_cache",
                  "fields": {"calibrate": True, "num_inference_steps": STEPS},
                  "class_labels": labels, "guidance_scale": GUIDANCE, "steps": STEPS,
                  "skipped": [False] * STEPS, "calibration": emit_cal,
                  "noise": "mag_noise.npy", "out": "mag_calibrate_out.npy",
                  "dtype_reference": "float64"})
    np.save(OUT / "mag_calibrate_out.npy", out_c.astype("<f8"))
    # ratios given for another step count: nearest_interp (28 -> 12 steps, FLUX's)
    flux_fields = {"threshold": 0.12, "max_skip_steps": 3, "retention_ratio": 0.1,
                   "num_inference_steps": STEPS,
                   "mag_ratios": [float(x) for x in mag_mod.FLUX_MAG_RATIOS.tolist()]}
    out, log = run("mag_cache", flux_fields, labels, noise)
    rows = per_step(log, "mag", STEPS)
    emit("mag_flux_ratios", "mag_cache", dict(flux_fields, mag_ratios="FLUX"), labels, noise,
         [not c for _, c in rows], [v for v, _ in rows], out)

    # ---- TaylorSeer: attn1 and ff of every block predicted, order 1; and
    # whole blocks at order 2
    tay_cases = [
        ("tay_modules", {"cache_interval": 3, "disable_cache_before_step": 2, "max_order": 1,
                         "cache_identifiers": [r"transformer_blocks\.\d+\.attn1",
                                               r"transformer_blocks\.\d+\.ff"]}, 6),
        ("tay_modules_bf16", {"cache_interval": 3, "disable_cache_before_step": 2, "max_order": 1,
                              "taylor_factors_dtype": "bfloat16",
                              "cache_identifiers": [r"transformer_blocks\.\d+\.attn1",
                                                    r"transformer_blocks\.\d+\.ff"]}, 6),
        ("tay_blocks", {"cache_interval": 2, "disable_cache_before_step": 3, "max_order": 2,
                        "disable_cache_after_step": 10,
                        "cache_identifiers": [r"transformer_blocks\.\d+"]}, 3),
    ]
    for name, fields, per in tay_cases:
        out, log = run("taylorseer_cache", fields, labels, noise)
        rows = per_step(log, "tay", STEPS, per)
        comp = [any(c for _, c in rows[s * per:(s + 1) * per]) for s in range(STEPS)]
        emit(name, "taylorseer_cache",
             dict(fields, taylor_factors_dtype=fields.get("taylor_factors_dtype", "float32")), labels,
             noise, [not c for c in comp], None, out, {"modules_per_step": per})

    # ---- two samples in one batch: each as it would be alone (ditd keeps a
    # state per sample; Diffusers would pool the batch, so the reference is
    # two single-sample runs)
    noise2 = rng.standard_normal((2, C, S, S)).astype(np.float32)
    outs, skips = [], []
    for j in range(2):
        o, log = run("first_block_cache", {"threshold": thr}, [1 + j], noise2[j:j + 1])
        outs.append(o)
        skips.append([not c for _, c in per_step(log, "fbc", STEPS)])
    np.save(OUT / "fbc_batch2_noise.npy", noise2.astype("<f4"))
    np.save(OUT / "fbc_batch2_out.npy", np.concatenate(outs).astype("<f8"))
    cases.append({"name": "fbc_batch2", "method": "first_block_cache",
                  "fields": {"threshold": thr}, "class_labels": [1, 2],
                  "guidance_scale": GUIDANCE, "steps": STEPS, "skipped": skips[0],
                  "skipped_per_sample": skips, "noise": "fbc_batch2_noise.npy",
                  "out": "fbc_batch2_out.npy", "dtype_reference": "float64"})
    print(f"fbc_batch2: skipped {skips}", file=sys.stderr)

    return cases


FAMILIES = {"dit": dit_cases, "flux": flux_cases, "sd3": sd3_cases, "wan": wan_cases,
            "wan22": wan22_cases}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--family", action="append", choices=sorted(FAMILIES),
                    help="remake only this family's cases (repeatable); the others' "
                         "cases and files stay as committed. Default: all")
    args = ap.parse_args()
    fams = args.family or list(FAMILIES)
    instrument()
    OUT.mkdir(parents=True, exist_ok=True)
    old = []
    if args.family and (OUT / "cases.json").exists():
        old = json.loads((OUT / "cases.json").read_text())["cases"]
    keep = [c for c in old if c.get("family", "dit") not in fams]
    kept_files = {c[k] for c in keep for k in ("noise", "out")}
    for f in OUT.glob("*.npy"):
        if f.name not in kept_files:
            f.unlink()
    cases = []
    for fam in FAMILIES:  # the document keeps one order: dit, flux, sd3, ...
        cases += FAMILIES[fam]() if fam in fams else [c for c in keep
                                                      if c.get("family", "dit") == fam]
    doc = {"model": "models/tiny-p2-c1-h6", "diffusers": diffusers.__version__,
           "torch": torch.__version__, "cases": cases}
    (OUT / "cases.json").write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
