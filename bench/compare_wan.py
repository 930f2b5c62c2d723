#!/usr/bin/env python3
"""Times a Wan-2.1-1.3B-shaped WanTransformer3DModel in Diffusers (PyTorch, CPU) beside ditd's
bench_wan on the same checkpoint, clip, text length and threads: ms per block, GFLOP/s and the
attention's share of the FLOPs, in float32 and bfloat16; then ditd again under parallel layouts
(mpirun: ulysses 2, ring 2 p2p) with its bytes per collective beside the analytic figure.

It writes a random-weight WanTransformer3DModel of Wan 2.1 T2V 1.3B's width (dim 1536: 12 heads
x 128, FFN 8960, text_dim 4096, freq_dim 256, patch (1, 2, 2), 16 channels, qk_norm
rms_norm_across_heads, cross_attn_norm) at reduced depth (--layers, 1 by default) into --dir
unless it is there. Diffusers' block is timed with forward pre/post hooks on blocks[0] inside
one forward; ditd's as the forward minus a forward with no block (bench_wan --blocks). The
default clip is 480x832 x 81 frames: 21 latent frames of 60x104, 32,760 tokens. With --cpu-time
both sides' one-rank rows are timed in process CPU time over the threads. A benchmark: it
asserts nothing.

    /root/ditd-venv/bin/python bench/compare_wan.py --threads 2 --bench build/tests/kernels/bench_wan \\
        --dir /tmp/wan13b --dtypes f32,bf16 --layouts ulysses2,ring2p2p --cpu-time
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from diffusers import WanTransformer3DModel

CONFIG = dict(patch_size=(1, 2, 2), num_attention_heads=12, attention_head_dim=128, in_channels=16,
              out_channels=16, text_dim=4096, freq_dim=256, ffn_dim=8960, cross_attn_norm=True,
              qk_norm="rms_norm_across_heads", eps=1e-6, rope_max_seq_len=1024)
LAYOUTS = {"ulysses2": (2, ["--ulysses", "2"]), "ring2p2p": (2, ["--ring", "2", "--rotate", "p2p"]),
           "ring2": (2, ["--ring", "2"]), "tp2": (2, ["--tp", "2"])}


def make(d, layers):
    if (d / "config.json").exists():
        return
    torch.manual_seed(0)
    m = WanTransformer3DModel(**CONFIG, num_layers=layers)
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0, 0.02)
    m.save_pretrained(d, safe_serialization=True)


def flops_block(N, L, D=1536, F=8960):
    return 12 * N * D * D + 4 * N * N * D + 4 * L * D * D + 4 * N * L * D + 4 * N * D * F


def clock(cpu):
    return time.process_time() / torch.get_num_threads() if cpu else time.perf_counter()


def diffusers_block(d, dtype, F, h, w, L, reps, cpu):
    m = WanTransformer3DModel.from_pretrained(d, torch_dtype=dtype).eval()
    x = torch.randn(1, 16, F, h, w, dtype=dtype)
    text = torch.randn(1, L, 4096, dtype=dtype)
    t = torch.tensor([500.0])
    marks = {}
    m.blocks[0].register_forward_pre_hook(lambda *a: marks.__setitem__("b0", clock(cpu)))
    m.blocks[0].register_forward_hook(lambda *a: marks.__setitem__("b1", clock(cpu)))
    fw, bl = [], []
    with torch.no_grad():
        for r in range(reps + 1):
            t0 = clock(cpu)
            m(hidden_states=x, timestep=t, encoder_hidden_states=text, return_dict=False)
            t1 = clock(cpu)
            if r:
                fw.append(1e3 * (t1 - t0))
                bl.append(1e3 * (marks["b1"] - marks["b0"]))
    return statistics.median(fw), statistics.median(bl)


def ditd(bench, d, dtype, F, h, w, L, threads, reps, cpu, mpi=None):
    cmd = [bench, str(d), "--frames", str(F), "--height", str(h), "--width", str(w), "--text", str(L),
           "--threads", str(threads), "--reps", str(reps), "--dtype", dtype, "--blocks"]
    if cpu and not mpi:
        cmd.append("--cpu-time")
    if mpi:
        n, flags = mpi
        cmd = ["mpirun", "--oversubscribe", "-np", str(n), "--bind-to", "none"] + cmd + flags
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_btl_vader_single_copy_mechanism="none")
    out = subprocess.run(cmd, capture_output=True, text=True, env=env).stdout
    fw = float(re.search(r"median ([\d.]+) ms per forward", out).group(1))
    blk = float(re.search(r"block ms: ([\d.]+)", out).group(1))
    return fw, blk, out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bench", required=True)
    ap.add_argument("--dir", type=Path, default=Path("/tmp/wan13b"))
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--frames", type=int, default=21)
    ap.add_argument("--height", type=int, default=60)
    ap.add_argument("--width", type=int, default=104)
    ap.add_argument("--text", type=int, default=512)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--dtypes", default="f32,bf16")
    ap.add_argument("--layouts", default="")
    ap.add_argument("--cpu-time", action="store_true")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    make(a.dir, a.layers)
    N = a.frames * (a.height // 2) * (a.width // 2)
    fb = flops_block(N, a.text)
    print(f"Wan 2.1 1.3B-shaped (dim 1536, 12 x 128, FFN 8960), {a.layers} block(s), latent "
          f"{a.frames} x {a.height}x{a.width} = {N} tokens + {a.text} text tokens, {a.threads} "
          f"threads, {a.reps} rep(s), {'process CPU time / threads' if a.cpu_time else 'wall time'}; "
          f"a block is {fb / 1e9:.0f} GFLOP, attention {100 * 4 * N * N * 1536 / fb:.0f} % of it\n")
    print("| dtype | ditd ms/block | ditd GFLOP/s | Diffusers ms/block | Diffusers GFLOP/s | ditd / Diffusers |")
    print("|---|---|---|---|---|---|")
    for dt in a.dtypes.split(","):
        tdt = torch.float32 if dt == "f32" else torch.bfloat16
        _, db, _ = ditd(a.bench, a.dir, dt, a.frames, a.height, a.width, a.text, a.threads, a.reps,
                        a.cpu_time)
        _, pb = diffusers_block(a.dir, tdt, a.frames, a.height, a.width, a.text, a.reps, a.cpu_time)
        print(f"| {dt} | {db:.0f} | {fb / db / 1e6:.1f} | {pb:.0f} | {fb / pb / 1e6:.1f} | {db / pb:.2f} |",
              flush=True)
    for name in [x for x in a.layouts.split(",") if x]:
        fw, blk, out = ditd(a.bench, a.dir, "f32", a.frames, a.height, a.width, a.text, a.threads,
                            a.reps, False, LAYOUTS[name])
        print(f"\n### ditd f32 under {name} (mpirun -np {LAYOUTS[name][0]}, {a.threads} threads each)\n")
        print("\n".join(l for l in out.splitlines() if l.startswith("|") or "inside collectives" in l))


if __name__ == "__main__":
    sys.exit(main())
