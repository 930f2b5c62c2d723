#!/usr/bin/env python3
"""Step caching on the embedded fashion-dit: class accuracy and PSNR against uncached.

What it is: a one-off measurement for docs/caching.md (issue 24). It runs
build/tests/golden/cache_eval (bench/cache_eval.c: ditd's pipeline, one image per
batch as one request, N images per class, seeds SEED..SEED+N-1) without a cache and
with each method at a setting that skips at least 40 % of the transformer's block
evaluations, scores every run with the project's classifier (tools/fashion_classifier.pt,
tools/train_classifier.py; the way tools/eval_default.py scores), and reports per run:
block evaluations and steps skipped, CPU time and its speed-up, class accuracy against
the uncached accuracy, and the PSNR of the 8-bit images against the uncached ones.
MagCache's ratios are first calibrated on this model (calibrate=true, the mean over the
run's images) and then passed as mag_ratios.

What it is not: a CI test (it needs PyTorch for the classifier).

    OMP_NUM_THREADS=1 /root/ditd-venv/bin/python tools/eval_cache.py [--n 20] [--json out.json]
"""
import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

TOOLS = Path(__file__).resolve().parent
REPO = TOOLS.parent
sys.path.insert(0, str(TOOLS))
from train_classifier import classify, load_classifier  # noqa: E402

TAYLOR = ("taylorseer_cache:cache_interval=3,disable_cache_before_step=2,max_order=1,"
          "taylor_factors_dtype=float32,cache_identifiers=transformer_blocks\\.\\d+")


def run(exe, model, prefix, n, seed, steps, guidance, specs):
    out = subprocess.run([str(exe), str(model), prefix, str(n), str(seed), str(steps),
                          str(guidance)] + specs, check=True, capture_output=True, text=True)
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


def psnr(a, b):
    mse = ((a.astype(np.float64) - b.astype(np.float64)) ** 2).mean(axis=(-1, -2))
    with np.errstate(divide="ignore"):
        p = 10 * np.log10(255.0 ** 2 / mse)
    return float(np.mean(np.minimum(p, 99.0)))  # identical images count as 99 dB


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--exe", default=REPO / "build" / "tests" / "golden" / "cache_eval")
    ap.add_argument("--model", default=REPO / "models" / "fashion-dit")
    ap.add_argument("--n", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--guidance", type=float, default=3.0)
    ap.add_argument("--json")
    a = ap.parse_args()
    net = load_classifier()
    tmp = tempfile.mkdtemp(prefix="ditd-cache-eval-")
    cal = run(a.exe, a.model, f"{tmp}/cal", a.n, a.seed, a.steps, a.guidance,
              ["mag_cache:calibrate=true"])[0]["calibration"]
    mag = ("mag_cache:threshold=0.1,max_skip_steps=3,retention_ratio=0.2,mag_ratios="
           + ";".join(f"{r:.6f}" for r in cal))
    specs = ["none", "first_block_cache:threshold=0.3", mag, TAYLOR]
    runs = run(a.exe, a.model, f"{tmp}/run", a.n, a.seed, a.steps, a.guidance, specs)
    imgs = [np.load(r["file"]).astype(np.uint8) for r in runs]
    base = imgs[0]
    rows = []
    for r, im in zip(runs, imgs):
        acc = float(np.mean([(classify(net, im[c]) == c).mean() for c in range(im.shape[0])]))
        ev = r["evals"] or 1
        rows.append({"spec": r["spec"] if not r["spec"].startswith("mag_cache") else
                     "mag_cache:threshold=0.1,max_skip_steps=3,retention_ratio=0.2,"
                     "mag_ratios=<calibrated>",
                     "evals_skipped_pct": 100.0 * r["evals_skipped"] / ev if r["evals"] else 0.0,
                     "steps_skipped": r["steps_skipped"], "steps": r["steps"],
                     "cpu_s": r["cpu_s"], "speedup": runs[0]["cpu_s"] / r["cpu_s"],
                     "accuracy": acc, "psnr_db": psnr(im, base) if r is not runs[0] else None})
    print(f"fashion-dit, {a.steps} steps, guidance {a.guidance}, {a.n} images per class, "
          f"seeds {a.seed}..{a.seed + a.n - 1}; calibrated mag_ratios {['%.4f' % x for x in cal]}")
    print("| cache | block evals skipped | steps skipped | CPU s | speed-up | accuracy | "
          "PSNR vs uncached |\n| --- | --- | --- | --- | --- | --- | --- |")
    for x in rows:
        print(f"| `{x['spec']}` | {x['evals_skipped_pct']:.1f}% | {x['steps_skipped']} / "
              f"{x['steps'] or a.steps * base.shape[0] * base.shape[1]} | {x['cpu_s']:.2f} | "
              f"{x['speedup']:.2f}x | {x['accuracy'] * 100:.1f}% | "
              f"{'-' if x['psnr_db'] is None else '%.1f dB' % x['psnr_db']} |")
    ok = all(x["accuracy"] >= rows[0]["accuracy"] - 0.02 - 1e-9 and
             (x is rows[0] or x["evals_skipped_pct"] >= 40.0) for x in rows)
    print("every method: >= 40 % of block evaluations skipped, accuracy >= uncached - 2 points:",
          "yes" if ok else "NO")
    if a.json:
        Path(a.json).write_text(json.dumps({"calibration": cal, "runs": rows}, indent=1) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
