#!/usr/bin/env python3
"""Step caching on the embedded fashion-dit: ditd beside Diffusers' hooks, same CPU, same noise.

What it is: the benchmark table of issue 24 for models/fashion-dit (DiTTransformer2DModel,
8 blocks, 28x28, FlowMatchEuler) at 28 and 50 steps. For each method (none, First Block
Cache, MagCache with ratios calibrated on this model at that step count, TaylorSeer on whole
blocks) it runs the same images on both sides, one image per batch, one thread each:

  ditd      build/tests/golden/cache_eval (bench/cache_eval.c), float32, the noise given
            through DITD_CACHE_EVAL_NOISE;
  Diffusers DiTTransformer2DModel in float32 with diffusers.hooks' apply_first_block_cache /
            apply_mag_cache / apply_taylorseer_cache, in DiTPipeline's loop
            (tools/make_fixtures.py sample_dit) under one cache context, the hooks'
            state reset between images (reset_stateful_hooks), as a fresh pipeline call.

and prints per method: steps skipped (of all the images' steps), wall-clock seconds of the
whole run and the speed-up over that side's uncached run (wall clock and CPU time: the
median of --repeat runs), the PSNR and SSIM of the 8-bit images
against that side's uncached images, and the PSNR of ditd's images against Diffusers' (the
same method, the same noise: how far the two implementations are apart). MagCache's ratios
are calibrated by ditd (calibrate=true, the mean over the images, printed to 6 decimals) and
the same list is given to both sides.

What it is not: a test (timings on a shared machine); a quality measure (that is
tools/eval_cache.py, with the classifier).

    /root/ditd-venv/bin/python tools/bench_cache.py [--steps 28 50] [--n 3] [--repeat 3] [--json out.json]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TOOLS = Path(__file__).resolve().parent
REPO = TOOLS.parent
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, str(TOOLS))
import make_cache_fixtures as mcf  # noqa: E402  (instrument, LOG: the hooks' decisions)
import make_fixtures as mf  # noqa: E402  (sample_dit, reference_model, load_state_dict)
from diffusers import FlowMatchEulerDiscreteScheduler  # noqa: E402
from diffusers.hooks import (FirstBlockCacheConfig, MagCacheConfig, TaylorSeerCacheConfig,  # noqa: E402
                             apply_first_block_cache, apply_mag_cache, apply_taylorseer_cache)
from diffusers.hooks.hooks import CacheContext, HookRegistry, _set_cache_context  # noqa: E402

MODEL = REPO / "models" / "fashion-dit"
EXE = REPO / "build" / "tests" / "golden" / "cache_eval"
FBC = {"threshold": 0.3}
MAG = {"threshold": 0.1, "max_skip_steps": 3, "retention_ratio": 0.2}
TAY = {"cache_interval": 3, "disable_cache_before_step": 2, "max_order": 1,
       "cache_identifiers": [r"transformer_blocks\.\d+"]}


def spec_of(method, fields):
    if method == "none":
        return "none"
    parts = []
    for k, v in fields.items():
        if isinstance(v, list):
            v = ";".join(f"{x:.6f}" if isinstance(x, float) else str(x) for x in v)
        parts.append(f"{k}={v}")
    return method + ":" + ",".join(parts)


def ditd_runs(noise_file, n, steps, guidance, specs):
    env = dict(os.environ, DITD_CACHE_EVAL_NOISE=str(noise_file), OMP_NUM_THREADS="1")
    tmp = tempfile.mkdtemp(prefix="ditd-bench-cache-")
    out = subprocess.run([str(EXE), str(MODEL), f"{tmp}/run", str(n), "0", str(steps),
                          str(guidance)] + specs, check=True, capture_output=True, text=True,
                         env=env)
    runs = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    for r in runs:
        r["images"] = np.load(r["file"]).astype(np.uint8)  # (K, N, H, W)
    return runs


def to_u8(x):
    """ditd_pipeline_to_pixels: (x / 2 + 0.5).clamp(0, 1), (v * 255).round(), float32"""
    v = np.clip(x.astype(np.float32) / np.float32(2) + np.float32(0.5), 0, 1)
    return np.rint(v * np.float32(255)).astype(np.uint8)


def diffusers_run(method, fields, noise, steps, guidance):
    """Every image of noise (K, N, 1, H, W) through the hooked model; wall seconds of the
    loop, its CPU seconds, steps skipped, 8-bit images (K, N, H, W)."""
    config = mf.DiTTransformer2DModel.load_config(MODEL / "transformer")
    model = mf.reference_model(config, mf.load_state_dict(MODEL / "transformer"), torch.float32)
    if method == "first_block_cache":
        apply_first_block_cache(model, FirstBlockCacheConfig(**fields))
    elif method == "mag_cache":
        apply_mag_cache(model, MagCacheConfig(**fields, num_inference_steps=steps))
    elif method == "taylorseer_cache":
        apply_taylorseer_cache(model, TaylorSeerCacheConfig(**fields,
                                                            taylor_factors_dtype=torch.float32))
    registry = HookRegistry.check_if_exists_or_initialize(model)
    sched = FlowMatchEulerDiscreteScheduler.from_pretrained(MODEL / "scheduler")
    K, N = noise.shape[:2]
    imgs = np.zeros((K, N) + noise.shape[-2:], np.uint8)
    skipped = 0
    per = config["num_layers"]  # TaylorSeer: every block hooked, one decision each per forward
    t0, c0 = time.perf_counter(), time.process_time()
    for c in range(K):
        for j in range(N):
            registry.reset_stateful_hooks()
            if method != "none":
                _set_cache_context(model, CacheContext("cond"))
            mcf.LOG.clear()
            with torch.no_grad():
                out = mf.sample_dit(model, sched, [c], noise[c, j:j + 1], guidance, steps,
                                    config["num_embeds_ada_norm"])
            imgs[c, j] = to_u8(out.numpy()[0, 0])
            kind = {"first_block_cache": "fbc", "mag_cache": "mag",
                    "taylorseer_cache": "tay"}.get(method)
            rows = [ok for k, _, ok in mcf.LOG if k == kind]
            if kind == "tay":  # a step skips when every hooked block was predicted
                rows = [any(rows[s * per:(s + 1) * per]) for s in range(steps)]
            assert kind is None or len(rows) == steps, (method, len(rows))
            skipped += sum(not ok for ok in rows)
    return time.perf_counter() - t0, time.process_time() - c0, skipped, imgs


def psnr(a, b):
    mse = ((a.astype(np.float64) - b.astype(np.float64)) ** 2).mean(axis=(-1, -2))
    with np.errstate(divide="ignore"):
        p = 10 * np.log10(255.0 ** 2 / mse)
    return float(np.mean(np.minimum(p, 99.0)))  # identical images count as 99 dB


def _gauss_valid(x, win):
    """x (..., H, W) filtered by the separable window, 'valid' region"""
    k = len(win)
    H, W = x.shape[-2:]
    y = sum(win[i] * x[..., i:H - k + 1 + i, :] for i in range(k))
    return sum(win[i] * y[..., :, i:W - k + 1 + i] for i in range(k))


def ssim(a, b):
    """Mean SSIM (Wang et al. 2004: Gaussian window 11, sigma 1.5, K1 0.01, K2 0.03, L 255,
    the valid region) of 8-bit images (..., H, W), over the images and any channel axis."""
    g = np.exp(-0.5 * ((np.arange(11) - 5) / 1.5) ** 2)
    win = g / g.sum()
    x, y = a.astype(np.float64), b.astype(np.float64)
    c1, c2 = (0.01 * 255) ** 2, (0.03 * 255) ** 2
    mx, my = _gauss_valid(x, win), _gauss_valid(y, win)
    sxx = _gauss_valid(x * x, win) - mx * mx
    syy = _gauss_valid(y * y, win) - my * my
    sxy = _gauss_valid(x * y, win) - mx * my
    m = ((2 * mx * my + c1) * (2 * sxy + c2)) / ((mx * mx + my * my + c1) * (sxx + syy + c2))
    return float(m.mean())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, nargs="+", default=[28, 50])
    ap.add_argument("--n", type=int, default=3, help="images per class")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--guidance", type=float, default=3.0)
    ap.add_argument("--repeat", type=int, default=1,
                    help="time every run this many times and report the median (a shared machine)")
    ap.add_argument("--json")
    a = ap.parse_args()
    torch.set_num_threads(1)
    mcf.instrument()
    K = json.loads((MODEL / "transformer" / "config.json").read_text())["num_embeds_ada_norm"]
    rng = np.random.default_rng(a.seed)
    noise = rng.standard_normal((K, a.n, 1, 28, 28)).astype(np.float32)
    tmp = Path(tempfile.mkdtemp(prefix="ditd-bench-cache-"))
    np.save(tmp / "noise.npy", noise)
    results = []
    for steps in a.steps:
        cal = ditd_runs(tmp / "noise.npy", a.n, steps, a.guidance,
                        ["mag_cache:calibrate=true"])[0]["calibration"]
        mag = dict(MAG, mag_ratios=[float(f"{r:.6f}") for r in cal])
        methods = [("none", {}), ("first_block_cache", FBC), ("mag_cache", mag),
                   ("taylorseer_cache", TAY)]
        specs = [spec_of(m, f) for m, f in methods]
        specs[3] += ",taylor_factors_dtype=float32"
        dr = ditd_runs(tmp / "noise.npy", a.n, steps, a.guidance, specs)
        for d in dr:
            d["wall_all"], d["cpu_all"] = [d["wall_s"]], [d["cpu_s"]]
        for _ in range(a.repeat - 1):  # the median of the repeats (the images are the same)
            for d, again in zip(dr, ditd_runs(tmp / "noise.npy", a.n, steps, a.guidance, specs)):
                assert np.array_equal(d["images"], again["images"])
                d["wall_all"].append(again["wall_s"])
                d["cpu_all"].append(again["cpu_s"])
        for d in dr:
            d["wall_s"], d["cpu_s"] = np.median(d["wall_all"]), np.median(d["cpu_all"])
        hf_runs = [[] for _ in methods]
        for _ in range(a.repeat):  # the methods interleaved within a round, as ditd's
            for k, (m, f) in enumerate(methods):
                hf_runs[k].append(diffusers_run(m, f, noise, steps, a.guidance))
        hf = [(float(np.median([r[0] for r in runs])), float(np.median([r[1] for r in runs])))
              + runs[0][2:] for runs in hf_runs]
        for (m, f), spec, d, (hw, hc, hs, him) in zip(methods, specs, dr, hf):
            if m == "mag_cache":
                spec = spec_of(m, dict(MAG, mag_ratios="<calibrated>"))
            results.append({
                "steps": steps, "method": m, "spec": spec,
                "fields": {k: ("<calibrated>" if k == "mag_ratios" else v) for k, v in f.items()},
                "total_steps": K * a.n * steps,
                "ditd": {"skipped": d["steps_skipped"], "wall_s": d["wall_s"],
                         "speedup": dr[0]["wall_s"] / d["wall_s"], "cpu_s": d["cpu_s"],
                         "cpu_speedup": dr[0]["cpu_s"] / d["cpu_s"],
                         "psnr_db": None if m == "none" else psnr(d["images"], dr[0]["images"]),
                         "ssim": None if m == "none" else ssim(d["images"], dr[0]["images"])},
                "diffusers": {"skipped": hs, "wall_s": hw, "speedup": hf[0][0] / hw, "cpu_s": hc,
                              "cpu_speedup": hf[0][1] / hc,
                              "psnr_db": None if m == "none" else psnr(him, hf[0][3]),
                              "ssim": None if m == "none" else ssim(him, hf[0][3])},
                "psnr_ditd_vs_diffusers_db": psnr(d["images"], him)})
        print(f"steps {steps}: calibrated mag_ratios {['%.4f' % x for x in cal]}", file=sys.stderr)
    print(f"fashion-dit, guidance {a.guidance}, {a.n} images per class ({K * a.n} images), "
          f"one image per batch, one thread, float32 both sides, the same noise (seed {a.seed}); "
          f"times: the median of {a.repeat} run(s); load average at the start "
          f"{' / '.join('%.2f' % x for x in os.getloadavg())}")
    print("| steps | method | steps skipped ditd / Diffusers | wall s ditd / Diffusers | "
          "wall speed-up ditd / Diffusers | CPU speed-up ditd / Diffusers | "
          "PSNR vs uncached ditd / Diffusers | SSIM vs uncached ditd / Diffusers | "
          "PSNR ditd vs Diffusers |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in results:
        d, h = r["ditd"], r["diffusers"]
        ps = ("-" if d["psnr_db"] is None else f"{d['psnr_db']:.1f} / {h['psnr_db']:.1f} dB")
        ss = ("-" if d["ssim"] is None else f"{d['ssim']:.4f} / {h['ssim']:.4f}")
        print(f"| {r['steps']} | `{r['spec']}` | {d['skipped']} / {h['skipped']} of {r['total_steps']} | "
              f"{d['wall_s']:.2f} / {h['wall_s']:.2f} | {d['speedup']:.2f}x / {h['speedup']:.2f}x | "
              f"{d['cpu_speedup']:.2f}x / {h['cpu_speedup']:.2f}x | "
              f"{ps} | {ss} | {r['psnr_ditd_vs_diffusers_db']:.1f} dB |")
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
