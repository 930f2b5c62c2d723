#!/usr/bin/env python3
"""The SD VAE decode, ditd beside Diffusers on PyTorch CPU, side by side in one run.

AutoencoderKL with sd-vae-ft-ema's shape (4 latent channels, block_out_channels
128, 256, 512, 512, 2 layers per block, random weights: timing does not depend on
the values), one image of --sizes pixels, the same thread count on every side.
For each size the engines run one after the other, each in its own process:

  - Diffusers (PyTorch CPU, float32; its convolutions are oneDNN's);
  - ditd, conv2d through im2col + OpenBLAS sgemm (DITD_CPU_CONV=gemm: the
    convolution before issue 21), with OPENBLAS_CORETYPE unset and set to
    --coretype (OpenBLAS reads it at load; ditd's other kernels do not);
  - ditd, conv2d through its own direct kernel (the default; no OpenBLAS).

The C side is `ditd bench --vae` (server/cmd_bench_vae.c). Each engine prints the
median wall time per decode, the median process CPU time per decode (all threads:
on a machine shared with other work the wall time grows with the load, the CPU
time much less) and its peak RSS; the table also gives the load average before
each run. OMP_WAIT_POLICY=passive on every side (idle OpenMP threads sleep
instead of spinning, so CPU time counts work). A benchmark: it asserts nothing.

    /root/ditd-venv/bin/python bench/compare_vae.py --sizes 512,1024 --threads 2 \\
        --iters 3 --ditd build/ditd
"""
import argparse
import os
import re
import subprocess
import sys

TORCH = r"""
import resource, statistics, sys, time, torch
from diffusers import AutoencoderKL
size, threads, iters, warmup = (int(a) for a in sys.argv[1:5])
torch.set_num_threads(threads)
vae = AutoencoderKL(block_out_channels=[128, 256, 512, 512], layers_per_block=2, latent_channels=4,
                    down_block_types=["DownEncoderBlock2D"] * 4, up_block_types=["UpDecoderBlock2D"] * 4,
                    sample_size=256, scaling_factor=0.18215).eval()
h = size // 8
z = torch.randn(1, 4, h, h, generator=torch.Generator().manual_seed(0))
ts, cs = [], []
with torch.inference_mode():
    for i in range(warmup + iters):
        t0, c0 = time.perf_counter(), time.process_time()
        vae.decode(z)
        if i >= warmup:
            ts.append((time.perf_counter() - t0) * 1e3)
            cs.append((time.process_time() - c0) * 1e3)
print(statistics.median(ts), statistics.median(cs),
      resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0, torch.__version__)
"""


def load():
    return os.getloadavg()[0]


def run_ditd(args, size, conv, coretype):
    env = dict(os.environ, OMP_WAIT_POLICY="passive", DITD_CPU_CONV=conv)
    env.pop("OPENBLAS_CORETYPE", None)
    if coretype:
        env["OPENBLAS_CORETYPE"] = coretype
    cmd = [args.ditd, "bench", "--vae", "sd-vae-ft-ema", "--size", str(size), "--threads",
           str(args.threads), "--iters", str(args.iters), "--warmup", str(args.warmup)]
    la = load()
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
    m = re.search(r"median ([0-9.]+) ms.*peak RSS ([0-9.]+) MiB", out)
    c = re.search(r"CPU time per decode: median ([0-9.]+) ms", out)
    return float(m.group(1)), float(c.group(1)), float(m.group(2)), la


def run_torch(args, size):
    env = dict(os.environ, OMP_WAIT_POLICY="passive")
    la = load()
    res = subprocess.run([sys.executable, "-c", TORCH, str(size), str(args.threads), str(args.iters),
                          str(args.warmup)], check=True, capture_output=True, text=True,
                         env=env).stdout.split()
    return float(res[0]), float(res[1]), float(res[2]), la, res[3]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="512,1024", help="image sides in pixels (comma)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=0)
    ap.add_argument("--coretype", default="Haswell", help="OPENBLAS_CORETYPE for the 'set' row")
    ap.add_argument("--no-coretype-row", action="store_true", help="skip the gemm row with it set")
    ap.add_argument("--ditd", default=os.path.join(os.path.dirname(__file__), "..", "build", "ditd"))
    args = ap.parse_args()
    print(f"SD VAE (sd-vae-ft-ema shape, random weights) decode, {args.threads} threads, "
          f"{args.iters} timed decodes after {args.warmup} warm-up (medians), "
          f"OMP_WAIT_POLICY=passive; OPENBLAS_CORETYPE in the environment: "
          f"{os.environ.get('OPENBLAS_CORETYPE', '(unset)')}\n", flush=True)
    print("| size | engine | wall ms | CPU ms | peak RSS MiB | load avg before | wall ratio to ditd direct |")
    print("|---|---|---|---|---|---|---|", flush=True)
    for size in (int(s) for s in args.sizes.split(",")):
        rows = []
        t = run_torch(args, size)
        rows.append((f"Diffusers {t[4]} (oneDNN conv)", t[0], t[1], t[2], t[3]))
        rows.append(("ditd before: im2col + OpenBLAS, CORETYPE unset",) + run_ditd(args, size, "gemm", None))
        if not args.no_coretype_row:
            rows.append((f"ditd before: im2col + OpenBLAS, CORETYPE={args.coretype}",)
                        + run_ditd(args, size, "gemm", args.coretype))
        rows.append(("ditd after: direct conv (avx512)",) + run_ditd(args, size, "ditd", None))
        ref = rows[-1][1]
        for name, ms, cpu, rss, la in rows:
            print(f"| {size}x{size} | {name} | {ms:.0f} | {cpu:.0f} | {rss:.0f} | {la:.1f} | {ms / ref:.2f} |",
                  flush=True)


if __name__ == "__main__":
    main()
