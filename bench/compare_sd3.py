#!/usr/bin/env python3
"""Times an SD3.5-Large-shaped SD3Transformer2DModel in Diffusers (PyTorch, CPU) beside ditd's
bench_sd3 on the same checkpoint, latent size, text length and threads, per block and per
forward, in float32 and bfloat16, and ditd again under parallel layouts (mpirun: ulysses 2,
cfg 2, ...) with the bytes per collective beside the analytic figure.

It writes a random-weight SD3Transformer2DModel of SD3.5 Large's width (hidden 2432, 38 heads x
64, joint_attention_dim 4096, caption_projection_dim 2432, pooled 2048, patch 2, 16 channels,
pos_embed_max_size 192, qk_norm rms_norm) at reduced depth (--layers, 2 by default: one joint
block and the context_pre_only last block; about 1.9 GB in float32) into --dir unless it is
there, then prints one table: ms per forward, per joint block and per last block, GFLOP/s per
block (the FLOP formulas are bench_sd3.c's, docs/sd3.md), each beside Diffusers. Diffusers'
blocks are timed with forward pre/post hooks inside one forward; ditd's by forwards with blocks
skipped (bench_sd3 --blocks). With --cpu-time both sides' one-rank rows are timed in process CPU
time over the threads (time.process_time, CLOCK_PROCESS_CPUTIME_ID), which a machine shared by
more runnable threads than cores disturbs far less than wall time. Every timed part holds --lock (flock) so the benchmarks of people
sharing the machine do not overlap. A benchmark: it asserts nothing.

    /root/ditd-venv/bin/python bench/compare_sd3.py --latent 128 --text 333 --threads 2 \\
        --bench build/tests/kernels/bench_sd3 --dir /tmp/sd35l --dtypes f32,bf16 \\
        --layouts ulysses2,cfg2

cfg2 is the pipeline's classifier-free-guidance layout: its row runs batch 2 (the conditional
and the unconditional row) split over the two cfg ranks, each rank's forward batch 1, and its
ratios are per sample. The layouts run --layout-reps reps (their bytes are the same in every
rep; on 2 shared cores their times measure the layout's overhead, not a speedup).
"""
import argparse
import fcntl
import os
import re
import statistics
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import torch
from diffusers import SD3Transformer2DModel

MPI_ENV = {  # what tests/run.sh sets for Open MPI as root on one machine
    "OMPI_ALLOW_RUN_AS_ROOT": "1",
    "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
    "OMPI_MCA_btl_vader_single_copy_mechanism": "none",
    "OMPI_MCA_rmaps_base_oversubscribe": "1",
    "OMPI_MCA_btl": "self,vader",
}
LAYOUTS = {  # name: (bench_sd3 arguments, batch)
    "ulysses2": (["--ulysses", "2"], 1),
    "ring2": (["--ring", "2"], 1),
    "tp2": (["--tp", "2"], 1),
    "cfg2": (["--cfg", "2"], 2),
}
SD35_LARGE = dict(sample_size=128, patch_size=2, in_channels=16, attention_head_dim=64,
                  num_attention_heads=38, joint_attention_dim=4096, caption_projection_dim=2432,
                  pooled_projection_dim=2048, out_channels=16, pos_embed_max_size=192,
                  dual_attention_layers=(), qk_norm="rms_norm")
DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}


def flops(N, L, D, F, last):
    """bench_sd3.c's counts for batch 1: GEMMs + the attention's two products."""
    S = N + L
    if last:
        return 16 * D * D + 6 * S * D * D + 4 * S * S * D + 2 * N * D * D + 4 * N * D * F
    return 24 * D * D + 6 * S * D * D + 4 * S * S * D + 2 * S * D * D + 4 * S * D * F


@contextmanager
def locked(path):
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def clock(args):
    """wall time, or with --cpu-time the process's CPU time over its threads (seconds)"""
    return time.process_time() / args.threads if args.cpu_time else time.perf_counter()


def time_diffusers(args, dtype, n_img):
    torch.set_num_threads(args.threads)
    model = SD3Transformer2DModel.from_pretrained(args.dir, torch_dtype=DTYPES[dtype]).eval()
    nl = len(model.transformer_blocks)
    g = torch.Generator().manual_seed(1)
    h = args.latent
    x = torch.randn(1, 16, h, h, generator=g).to(DTYPES[dtype])
    text = torch.randn(1, args.text, 4096, generator=g).to(DTYPES[dtype])
    pooled = torch.randn(1, 2048, generator=g).to(DTYPES[dtype])
    t = torch.full((1,), 500.0)
    starts, block_ms = {}, {"joint": [], "last": []}

    def pre(kind):
        return lambda mod, a, kw=None: starts.__setitem__(kind, clock(args))

    def post(kind):
        return lambda mod, a, *rest: block_ms[kind].append((clock(args) - starts[kind]) * 1e3)

    for i, blk in enumerate(model.transformer_blocks):
        kind = "last" if i == nl - 1 else "joint"
        blk.register_forward_pre_hook(pre(kind))
        blk.register_forward_hook(post(kind))
    total = []
    with torch.no_grad(), locked(args.lock):
        for r in range(args.reps + 1):
            if r == 1:  # the first forward warms up
                block_ms = {"joint": [], "last": []}
            t0 = clock(args)
            model(hidden_states=x, encoder_hidden_states=text, pooled_projections=pooled,
                  timestep=t, return_dict=False)
            if r:
                total.append((clock(args) - t0) * 1e3)
    del model
    return (statistics.median(total), statistics.median(block_ms["joint"]),
            statistics.median(block_ms["last"]))


def run_ditd(args, dtype, layout, batch):
    h = str(args.latent)
    reps = args.layout_reps if layout else args.reps
    cmd = [args.bench, str(args.dir), "--height", h, "--width", h, "--text", str(args.text),
           "--batch", str(batch), "--reps", str(reps), "--dtype", dtype, "--blocks"]
    env = dict(os.environ)
    if layout:
        per = max(1, args.threads // 2)
        env.update(MPI_ENV, OMP_NUM_THREADS=str(per))
        cmd = [args.mpirun, "--oversubscribe", "-np", "2"] + cmd + ["--threads", str(per)] \
            + LAYOUTS[layout][0]
        label, thr = f"ditd {layout}", f"2 x {per}"
    else:
        env["OMP_NUM_THREADS"] = str(args.threads)
        cmd += ["--threads", str(args.threads)] + (["--cpu-time"] if args.cpu_time else [])
        label, thr = "ditd, 1 rank" + (f", batch {batch}" if batch > 1 else ""), f"1 x {args.threads}"
    out = subprocess.run(["flock", args.lock] + cmd, capture_output=True, text=True, env=env)
    if out.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed ({out.returncode}):\n{out.stderr}")
    fwd = float(re.search(r"median ([0-9.]+) ms per forward", out.stdout).group(1))
    m = re.search(r"block ms: joint ([0-9.-]+) last ([0-9.-]+)", out.stdout)
    return label, thr, fwd, float(m.group(1)), float(m.group(2)), out.stdout


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--latent", type=int, default=128, help="latent side (image / 8); 128 = 1024x1024")
    ap.add_argument("--text", type=int, default=333, help="77 CLIP + 256 T5 tokens")
    ap.add_argument("--threads", type=int, default=2, help="in all; split over the ranks under mpirun")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--layout-reps", type=int, default=1)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--bench", required=True, help="path of ditd's bench_sd3")
    ap.add_argument("--mpirun", default="mpirun")
    ap.add_argument("--dtypes", default="f32,bf16")
    ap.add_argument("--layouts", default="", help="comma list of " + ", ".join(LAYOUTS) +
                    " (run in float32)")
    ap.add_argument("--no-diffusers", action="store_true")
    ap.add_argument("--cpu-time", action="store_true",
                    help="one-rank rows in process CPU time / threads (both sides), not wall time")
    ap.add_argument("--lock", default="/tmp/ditd-bench.lock")
    ap.add_argument("--dir", type=Path, required=True, help="where the checkpoint is written")
    args = ap.parse_args()
    layouts = [l for l in args.layouts.split(",") if l]
    dtypes = [d for d in args.dtypes.split(",") if d]
    for l in layouts:
        if l not in LAYOUTS:
            raise SystemExit(f"--layouts: {l} is not one of {', '.join(LAYOUTS)}")
    for d in dtypes:
        if d not in DTYPES:
            raise SystemExit(f"--dtypes: {d} is not one of {', '.join(DTYPES)}")
    if not (args.dir / "config.json").exists():
        torch.manual_seed(0)
        SD3Transformer2DModel(num_layers=args.layers, **SD35_LARGE).save_pretrained(
            args.dir, safe_serialization=True)
    n_img = (args.latent // 2) ** 2
    D = 2432
    fj, fl = flops(n_img, args.text, D, 4 * D, False), flops(n_img, args.text, D, 4 * D, True)
    print(f"SD3.5 Large width, {args.layers} blocks, latent {args.latent}x{args.latent} ({n_img} "
          f"image + {args.text} text tokens), batch 1; "
          f"OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', '(unset)')}; torch "
          f"{torch.__version__} ({torch.get_num_threads()} default threads); "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(f"analytic GFLOP (batch 1): joint block {fj / 1e9:.1f}, last block {fl / 1e9:.1f}")
    rows, details = [], []
    for dtype in dtypes:
        if not args.no_diffusers:
            fwd, tj, tl = time_diffusers(args, dtype, n_img)
            print(f"[Diffusers {dtype}: {fwd:.0f} ms per forward]", file=sys.stderr, flush=True)
            rows.append((f"Diffusers (PyTorch CPU) {dtype}", f"1 x {args.threads}", 1, fwd, tj, tl))
        label, thr, fwd, tj, tl, out = run_ditd(args, dtype, None, 1)
        print(f"[{label} {dtype}: {fwd:.0f} ms per forward]", file=sys.stderr, flush=True)
        rows.append((f"{label} {dtype}", thr, 1, fwd, tj, tl))
        details.append((f"{label} {dtype}", out))
    for layout in layouts:
        batch = LAYOUTS[layout][1]
        label, thr, fwd, tj, tl, out = run_ditd(args, "f32", layout, batch)
        print(f"[{label}: {fwd:.0f} ms per forward]", file=sys.stderr, flush=True)
        rows.append((f"{label} f32" + (f", batch {batch}" if batch > 1 else ""), thr, batch, fwd,
                     tj, tl))
        details.append((label, out))
    print(f"\nmedian of {args.reps} (layouts: {args.layout_reps}) after 1 warm-up; "
          f"{'one-rank rows in process CPU time / threads, layouts in wall time' if args.cpu_time else 'wall time'}"
          "; ratio = this row's ms per sample / the first row's\n")
    print("| run | ranks x threads | batch | ms/forward | ms/joint block | GFLOP/s joint | "
          "ms/last block | GFLOP/s last | forward ratio | joint ratio |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    ref = rows[0]
    for name, thr, b, fwd, tj, tl in rows:
        print(f"| {name} | {thr} | {b} | {fwd:.0f} | {tj:.0f} | {b * fj / tj / 1e6:.0f} | {tl:.0f} "
              f"| {b * fl / tl / 1e6:.0f} | {fwd / b / ref[3]:.2f} | {tj / b / ref[4]:.2f} |")
    for label, out in details:
        print(f"\n{label}, bench_sd3's output:\n\n{out.strip()}")


if __name__ == "__main__":
    main()
