#!/usr/bin/env python3
"""Times one DiT forward in Diffusers (PyTorch, CPU) beside `ditd bench`, in one run.

Same config, token count, batch and thread count; random weights on both sides (timing
does not depend on the values). For each weight dtype asked (fp32, bf16) it runs
`ditd bench --dtype ...` (which measures the machine's FMA peak in the same process)
and Diffusers with the model in that dtype (torch.bfloat16: weights, activations and
matmuls in bf16, as `torch_dtype=torch.bfloat16` runs it), and with --env both it runs
ditd twice: with the environment as given and with the OpenBLAS variables
(OPENBLAS_CORETYPE, OPENBLAS_L2_SIZE) removed. Prints one table: median ms per forward,
GFLOP/s (median and fastest forward), % of the FMA peak (the best of its samples) that
ditd measured beside it, peak RSS, and the speed ratios.
A benchmark: it asserts nothing. The rows are medians; on a shared machine compare the
ratios within one run.

    /root/ditd-venv/bin/python bench/compare_torch.py --config DiT-XL/2 \\
        --tokens 256 --batch 2 --threads 2 --dtypes fp32,bf16 --env both --ditd build/ditd

VAE mode: one AutoencoderKL decode of a --size x --size image (random weights,
the published sd-vae-ft-ema or FLUX.1 sizes), ms and peak RSS of each side, each
in its own process:

    /root/ditd-venv/bin/python bench/compare_torch.py --vae sd-vae-ft-ema --size 256 \\
        --threads 2 --ditd build/ditd
"""
import argparse
import math
import os
import re
import resource
import statistics
import subprocess
import sys
import time

SIZES = {"S": (12, 6, 64), "B": (12, 12, 64), "L": (24, 16, 64), "XL": (28, 16, 72)}
OPENBLAS_VARS = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")


def parse_config(name):
    m = re.fullmatch(r"DiT-(S|B|L|XL)/(\d+)", name, re.IGNORECASE)
    if not m:
        sys.exit(f"unknown config {name}")
    layers, heads, head_dim = SIZES[m.group(1).upper()]
    return layers, heads, head_dim, int(m.group(2))


def torch_forward(args, dtype):
    """Median ms per forward and peak RSS (MiB) of a child process running Diffusers."""
    code = f"""
import math, resource, statistics, sys, time, torch
from diffusers import DiTTransformer2DModel
torch.set_num_threads({args.threads})
side = math.isqrt({args.tokens}); sample = side * {parse_config(args.config)[3]}
layers, heads, head_dim, patch = {parse_config(args.config)}
model = DiTTransformer2DModel(num_attention_heads=heads, attention_head_dim=head_dim,
    in_channels=4, out_channels=8, num_layers=layers, sample_size=sample, patch_size=patch,
    num_embeds_ada_norm=1000).eval().to(torch.{dtype})
g = torch.Generator().manual_seed(0)
x = torch.randn({args.batch}, 4, sample, sample, generator=g).to(torch.{dtype})
t = torch.full(({args.batch},), 500.0)
y = torch.arange({args.batch}) % 1000
times = []
with torch.inference_mode():
    for i in range({args.warmup} + {args.iters}):
        t0 = time.perf_counter(); model(x, timestep=t, class_labels=y)
        if i >= {args.warmup}: times.append((time.perf_counter() - t0) * 1e3)
print(statistics.median(times), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
      torch.__version__, torch.get_num_threads(), min(times))
"""
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                         text=True).stdout.split()
    return float(out[0]), float(out[1]), out[2], int(out[3]), float(out[4])


def ditd_forward(args, dtype, env_unset):
    env = dict(os.environ)
    if env_unset:
        for v in OPENBLAS_VARS:
            env.pop(v, None)
    cmd = [args.ditd, "bench", "--config", args.config, "--tokens", str(args.tokens),
           "--batch", str(args.batch), "--threads", str(args.threads),
           "--iters", str(args.iters), "--warmup", str(args.warmup), "--no-gemm",
           "--dtype", "f32" if dtype == "float32" else "bf16"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
    lines = out.splitlines()
    gemm = next((l[len("GEMM: "):] for l in lines if l.startswith("GEMM: ")), "?")
    peak = next((float(re.search(r"FMA peak: ([\d.]+)", l).group(1)) for l in lines
                 if l.startswith("FMA peak:")), float("nan"))
    rows = [l for l in lines if l.startswith("| ") and not l.startswith("|---")]
    head = [c.strip() for c in rows[0].strip("|").split("|")]
    cells = dict(zip(head, [c.strip() for c in rows[1].strip("|").split("|")]))
    return {"ms": float(cells["ms/forward (median)"]), "gflops": float(cells["GFLOP/s"]),
            "min_ms": float(cells["min"]), "rss": float(cells["peak RSS (MiB)"]), "peak": peak,
            "gemm": gemm}


VAE_CONFIGS = {
    "sd-vae-ft-ema": dict(latent_channels=4, sample_size=256, scaling_factor=0.18215),
    "flux-vae": dict(latent_channels=16, sample_size=1024, scaling_factor=0.3611, shift_factor=0.1159,
                     use_quant_conv=False, use_post_quant_conv=False),
}

TORCH_VAE = r"""
import resource, statistics, sys, time, torch
from diffusers import AutoencoderKL
name, size, threads, iters, warmup, extra = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), eval(sys.argv[6])
torch.set_num_threads(threads)
vae = AutoencoderKL(block_out_channels=[128, 256, 512, 512], layers_per_block=2,
                    down_block_types=["DownEncoderBlock2D"] * 4, up_block_types=["UpDecoderBlock2D"] * 4,
                    **extra).eval()
h = size // 8
z = torch.randn(1, vae.config.latent_channels, h, h, generator=torch.Generator().manual_seed(0))
ts = []
with torch.inference_mode():
    for i in range(warmup + iters):
        t0 = time.perf_counter()
        vae.decode(z)
        if i >= warmup:
            ts.append((time.perf_counter() - t0) * 1e3)
print(statistics.median(ts), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0, torch.__version__)
"""


def vae_main(args):
    cmd = [args.ditd, "bench", "--vae", args.vae, "--size", str(args.size), "--threads", str(args.threads),
           "--iters", str(args.iters), "--warmup", str(args.warmup)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    m = re.search(r"median ([0-9.]+) ms.*peak RSS ([0-9.]+) MiB", out)
    d_ms, d_rss = float(m.group(1)), float(m.group(2))
    res = subprocess.run([sys.executable, "-c", TORCH_VAE, args.vae, str(args.size), str(args.threads),
                          str(args.iters), str(args.warmup), repr(VAE_CONFIGS[args.vae])],
                         check=True, capture_output=True, text=True).stdout.split()
    t_ms, t_rss, tv = float(res[0]), float(res[1]), res[2]
    print(f"| {args.vae} decode | {args.size}x{args.size} | threads {args.threads} |")
    print("| engine | ms/decode (median) | peak RSS MiB | time ratio to ditd |")
    print("|---|---|---|---|")
    print(f"| ditd (CPU, fp32) | {d_ms:.0f} | {d_rss:.0f} | 1.00 |")
    print(f"| Diffusers {tv} (CPU, fp32) | {t_ms:.0f} | {t_rss:.0f} | {t_ms / d_ms:.2f} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vae", choices=sorted(VAE_CONFIGS), help="time the VAE decode instead")
    ap.add_argument("--size", type=int, default=256, help="VAE mode: image side in pixels")
    ap.add_argument("--config", default="DiT-XL/2")
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--dtypes", default="fp32,bf16", help="fp32, bf16 or both (comma)")
    ap.add_argument("--env", choices=["given", "unset", "both"], default="both",
                    help="ditd with the OpenBLAS variables as given, removed, or both")
    ap.add_argument("--no-torch", action="store_true", help="ditd rows only")
    ap.add_argument("--ditd", default=os.path.join(os.path.dirname(__file__), "..", "build", "ditd"))
    args = ap.parse_args()
    if args.vae:
        return vae_main(args)
    dtypes = [{"fp32": "float32", "bf16": "bfloat16"}[d] for d in args.dtypes.split(",")]
    envs = {"given": [False], "unset": [True], "both": [False, True]}[args.env]

    given = " ".join(f"{v}={os.environ[v]}" for v in OPENBLAS_VARS if v in os.environ) or "none"
    print(f"{args.config}, {args.tokens} tokens, batch {args.batch}, {args.threads} threads, "
          f"{args.iters} timed forwards after {args.warmup} warm-up (medians). "
          f"Environment as given: {given}.")
    rows, ref = [], {}
    for dt in dtypes:
        for unset in envs:
            d = ditd_forward(args, dt, unset)
            label = f"ditd ({'fp32' if dt == 'float32' else 'bf16 weights'})"
            rows.append((label, "unset" if unset else "as given", d["ms"], d["gflops"], d["peak"],
                         d["rss"], d["min_ms"]))
            ref.setdefault(dt, d)
            gemm = d["gemm"]
        if not args.no_torch:
            t_ms, t_rss, tv, tth, t_min = torch_forward(args, dt)
            rows.append((f"Diffusers {tv} ({'fp32' if dt == 'float32' else 'bf16'}, {tth} thr.)",
                         "-", t_ms, None, ref[dt]["peak"], t_rss, t_min))
    print(f"ditd GEMMs: {gemm}\n")
    flops = ref[dtypes[0]]["gflops"] * ref[dtypes[0]]["ms"] * 1e6  # the same model each row
    print("| engine | OpenBLAS env | ms/forward (median) | GFLOP/s | fastest ms | GFLOP/s (fastest) "
          "| FMA peak (GFLOP/s, same run) | % of peak (median / fastest) | peak RSS (MiB) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        g, gb = flops / (r[2] * 1e6), flops / (r[6] * 1e6)
        print(f"| {r[0]} | {r[1]} | {r[2]:.1f} | {g:.1f} | {r[6]:.1f} | {gb:.1f} | {r[4]:.1f} | "
              f"{100 * g / r[4]:.0f}% / {100 * gb / r[4]:.0f}% | {r[5]:.0f} |")
    if "float32" in ref and "bfloat16" in ref:
        print(f"\nditd bf16 / fp32 speed (env as given): median {ref['float32']['ms'] / ref['bfloat16']['ms']:.2f}x, "
              f"fastest {ref['float32']['min_ms'] / ref['bfloat16']['min_ms']:.2f}x; "
              f"peak RSS {ref['bfloat16']['rss'] / ref['float32']['rss']:.2f}x")


if __name__ == "__main__":
    main()
