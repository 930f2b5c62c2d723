#!/usr/bin/env python3
"""Times a FLUX transformer in Diffusers (PyTorch, CPU, float32) beside ditd's bench_flux on
the same checkpoint, latent size, text length, batch and threads, per block and per forward,
and ditd again under context-parallel layouts (mpirun) with the bytes per collective.

It writes a random-weight FluxTransformer2DModel of FLUX.1-dev's width (hidden 3072, 24 heads
x 128, T5 4096, CLIP 768, guidance embeds, axes_dims_rope [16, 56, 56]) at reduced depth
(--double, --single blocks; the issue's benchmark uses 1 + 1) into --dir (about 2.2 GB for
1 + 1) unless it is there, then prints one table: ms per forward, per double and single block,
GFLOP/s per block (the FLOP formula is bench_flux.c's, docs/flux.md), each beside Diffusers.
Diffusers' blocks are timed with forward hooks inside one forward; ditd's by forwards with
blocks left out (bench_flux --blocks). Every timed part holds --lock (flock) so benchmarks of
people sharing the machine do not overlap. A benchmark: it asserts nothing.

    /root/ditd-venv/bin/python bench/compare_flux.py --latent 128 --text 512 --threads 2 \\
        --bench build/tests/kernels/bench_flux --dir /tmp/flux-bench --layouts ulysses2,ring2
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
from diffusers import FluxPipeline, FluxTransformer2DModel

# what tests/run.sh sets for Open MPI as root on one machine
MPI_ENV = {
    "OMPI_ALLOW_RUN_AS_ROOT": "1",
    "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
    "OMPI_MCA_btl_vader_single_copy_mechanism": "none",
    "OMPI_MCA_rmaps_base_oversubscribe": "1",
    "OMPI_MCA_btl": "self,vader",
}
LAYOUTS = {
    "ulysses2": ["--ulysses", "2"],
    "ring2": ["--ring", "2"],
    "ring2p2p": ["--ring", "2", "--rotate", "p2p"],
    "tp2": ["--tp", "2"],
}


def flops(S, D, F, single):
    """bench_flux.c's count for batch 1: GEMMs + the attention's two products."""
    if single:
        return 6 * S * D * D + 4 * S * S * D + 2 * S * D * F + 2 * S * D * (D + F) + 6 * D * D
    return 6 * S * D * D + 4 * S * S * D + 2 * S * D * D + 4 * S * D * F + 24 * D * D


@contextmanager
def locked(path):
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def time_diffusers(args, n_img, lock):
    torch.set_num_threads(args.threads)
    model = FluxTransformer2DModel.from_pretrained(args.dir, torch_dtype=torch.float32).eval()
    B, h = args.batch, args.latent
    g = torch.Generator().manual_seed(1)
    x = torch.randn(B, n_img, 64, generator=g)
    text = torch.randn(B, args.text, 4096, generator=g)
    pooled = torch.randn(B, 768, generator=g)
    img_ids = FluxPipeline._prepare_latent_image_ids(B, h // 2, h // 2, "cpu", torch.float32)
    txt_ids = torch.zeros(args.text, 3)
    t = torch.full((B,), 0.5)
    gd = torch.full((B,), 3.5)
    starts, block_ms = {}, {"double": [], "single": []}

    def pre(kind):
        return lambda mod, a, kw=None: starts.__setitem__(kind, time.perf_counter())

    def post(kind):
        return lambda mod, a, *rest: block_ms[kind].append((time.perf_counter() - starts[kind]) * 1e3)

    for blk in model.transformer_blocks:
        blk.register_forward_pre_hook(pre("double"))
        blk.register_forward_hook(post("double"))
    for blk in model.single_transformer_blocks:
        blk.register_forward_pre_hook(pre("single"))
        blk.register_forward_hook(post("single"))
    total = []
    with torch.no_grad(), locked(lock):
        for r in range(args.reps + 1):
            if r == 1:  # the first forward warms up
                block_ms = {"double": [], "single": []}
            t0 = time.perf_counter()
            model(hidden_states=x, encoder_hidden_states=text, pooled_projections=pooled,
                  timestep=t, img_ids=img_ids, txt_ids=txt_ids, guidance=gd, return_dict=False)
            if r:
                total.append((time.perf_counter() - t0) * 1e3)
    del model
    return (statistics.median(total), statistics.median(block_ms["double"]),
            statistics.median(block_ms["single"]))


def run_ditd(args, layout, lock):
    h = str(args.latent)
    cmd = [args.bench, str(args.dir), "--height", h, "--width", h, "--text", str(args.text),
           "--batch", str(args.batch), "--reps", str(args.reps), "--blocks"]
    env = dict(os.environ)
    if layout:
        ranks = 2 if layout != "ulysses2ring2" else 4
        per = max(1, args.threads // ranks)
        env.update(MPI_ENV, OMP_NUM_THREADS=str(per))
        cmd = [args.mpirun, "--oversubscribe", "-np", str(ranks)] + cmd + ["--threads", str(per)] \
            + LAYOUTS[layout]
        label, thr = layout, f"{ranks} x {per}"
    else:
        env["OMP_NUM_THREADS"] = str(args.threads)
        cmd += ["--threads", str(args.threads)]
        label, thr = "ditd, 1 rank", f"1 x {args.threads}"
    out = subprocess.run(["flock", lock] + cmd, capture_output=True, text=True, env=env)
    if out.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed ({out.returncode}):\n{out.stderr}")
    fwd = float(re.search(r"median ([0-9.]+) ms per forward", out.stdout).group(1))
    m = re.search(r"block ms: double ([0-9.-]+) single ([0-9.-]+)", out.stdout)
    return label, thr, fwd, float(m.group(1)), float(m.group(2)), out.stdout


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--latent", type=int, default=128, help="latent side (image / 8); 128 = 1024x1024")
    ap.add_argument("--text", type=int, default=512)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2, help="in all; split over the ranks under mpirun")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--double", type=int, default=1)
    ap.add_argument("--single", type=int, default=1)
    ap.add_argument("--bench", required=True, help="path of ditd's bench_flux")
    ap.add_argument("--mpirun", default="mpirun")
    ap.add_argument("--layouts", default="", help="comma list of " + ", ".join(LAYOUTS))
    ap.add_argument("--no-diffusers", action="store_true")
    ap.add_argument("--lock", default="/tmp/ditd-bench.lock")
    ap.add_argument("--dir", type=Path, required=True, help="where the checkpoint is written")
    args = ap.parse_args()
    layouts = [l for l in args.layouts.split(",") if l]
    for l in layouts:
        if l not in LAYOUTS:
            raise SystemExit(f"--layouts: {l} is not one of {', '.join(LAYOUTS)}")
    if not (args.dir / "config.json").exists():
        torch.manual_seed(0)
        FluxTransformer2DModel(num_layers=args.double, num_single_layers=args.single,
                               guidance_embeds=True).save_pretrained(args.dir, safe_serialization=True)
    n_img = (args.latent // 2) ** 2
    S, D = n_img + args.text, 3072
    fd, fs = flops(S, D, 4 * D, False), flops(S, D, 4 * D, True)
    print(f"FLUX.1-dev width, {args.double} double + {args.single} single blocks, latent "
          f"{args.latent}x{args.latent} ({n_img} image + {args.text} text tokens), batch "
          f"{args.batch}, float32; OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', '(unset)')} "
          f"OPENBLAS_L2_SIZE={os.environ.get('OPENBLAS_L2_SIZE', '(unset)')}; "
          f"torch {torch.__version__}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(f"analytic GFLOP (batch 1): double block {fd / 1e9:.1f}, single block {fs / 1e9:.1f}")
    rows, details = [], []
    if not args.no_diffusers:
        fwd, td, ts = time_diffusers(args, n_img, args.lock)
        print(f"[Diffusers: {fwd:.0f} ms per forward]", file=sys.stderr, flush=True)
        rows.append(("Diffusers (PyTorch CPU)", f"1 x {args.threads}", fwd, td, ts))
    for layout in [None] + layouts:
        label, thr, fwd, td, ts, out = run_ditd(args, layout, args.lock)
        print(f"[{label}: {fwd:.0f} ms per forward]", file=sys.stderr, flush=True)
        rows.append((f"ditd {label}" if layout else label, thr, fwd, td, ts))
        details.append((label, out))
    ref = rows[0]
    B = args.batch
    print(f"\nmedian of {args.reps} (after 1 warm-up); ratio = this row's ms / the first row's\n")
    print("| run | ranks x threads | ms/forward | ms/double block | GFLOP/s double | ms/single block "
          "| GFLOP/s single | forward ratio | double ratio | single ratio |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, thr, fwd, td, ts in rows:
        print(f"| {name} | {thr} | {fwd:.0f} | {td:.0f} | {B * fd / td / 1e6:.0f} | {ts:.0f} "
              f"| {B * fs / ts / 1e6:.0f} | {fwd / ref[2]:.2f} | {td / ref[3]:.2f} | {ts / ref[4]:.2f} |")
    for label, out in details:
        print(f"\n{label}, bench_flux's output:\n\n{out.strip()}")


if __name__ == "__main__":
    main()
