#!/usr/bin/env python3
"""Times one DiT forward in Diffusers (PyTorch, CPU) beside `ditd bench`.

Same config, token count, batch and thread count; random weights on both
sides (timing does not depend on the values). Prints a table with the
median ms per forward of each and the ratio. A benchmark: it asserts nothing.

    /root/ditd-venv/bin/python bench/compare_torch.py --config DiT-XL/2 \
        --tokens 256 --batch 2 --threads 2 --ditd build/ditd

VAE mode: one AutoencoderKL decode of a --size x --size image (random weights,
the published sd-vae-ft-ema or FLUX.1 sizes), ms and peak RSS of each side, each
in its own process:

    /root/ditd-venv/bin/python bench/compare_torch.py --vae sd-vae-ft-ema --size 256 \
        --threads 2 --ditd build/ditd
"""
import argparse
import math
import os
import re
import statistics
import subprocess
import sys
import time

SIZES = {"S": (12, 6, 64), "B": (12, 12, 64), "L": (24, 16, 64), "XL": (28, 16, 72)}


def parse_config(name):
    m = re.fullmatch(r"DiT-(S|B|L|XL)/(\d+)", name, re.IGNORECASE)
    if not m:
        sys.exit(f"unknown config {name}")
    layers, heads, head_dim = SIZES[m.group(1).upper()]
    return layers, heads, head_dim, int(m.group(2))


def torch_forward_ms(args):
    import torch
    from diffusers import DiTTransformer2DModel

    torch.set_num_threads(args.threads)
    layers, heads, head_dim, patch = parse_config(args.config)
    side = math.isqrt(args.tokens)
    sample = side * patch
    model = DiTTransformer2DModel(
        num_attention_heads=heads, attention_head_dim=head_dim, in_channels=4,
        out_channels=8, num_layers=layers, sample_size=sample, patch_size=patch,
        num_embeds_ada_norm=1000).eval()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(args.batch, 4, sample, sample, generator=g)
    t = torch.full((args.batch,), 500.0)
    y = torch.arange(args.batch) % 1000
    times = []
    with torch.inference_mode():
        for i in range(args.warmup + args.iters):
            t0 = time.perf_counter()
            model(x, timestep=t, class_labels=y)
            dt = (time.perf_counter() - t0) * 1e3
            if i >= args.warmup:
                times.append(dt)
    return statistics.median(times), torch.__version__, torch.get_num_threads()


def ditd_forward_ms(args):
    cmd = [args.ditd, "bench", "--config", args.config, "--tokens", str(args.tokens),
           "--batch", str(args.batch), "--threads", str(args.threads),
           "--iters", str(args.iters), "--warmup", str(args.warmup), "--no-gemm"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    row = [l for l in out.splitlines() if l.startswith("| ") and "ms/forward" not in l
           and not l.startswith("|---")][0]
    cells = [c.strip() for c in row.strip("|").split("|")]
    return float(cells[6]), float(cells[9])


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
    ap.add_argument("--ditd", default=os.path.join(os.path.dirname(__file__), "..", "build", "ditd"))
    args = ap.parse_args()
    if args.vae:
        return vae_main(args)

    d_ms, d_gflops = ditd_forward_ms(args)
    t_ms, tv, tthreads = torch_forward_ms(args)
    print(f"| {args.config} | tokens {args.tokens} | batch {args.batch} | threads {args.threads} |")
    print("| engine | ms/forward (median) | ratio to ditd |")
    print("|---|---|---|")
    print(f"| ditd (CPU, fp32) | {d_ms:.1f} | 1.00 |")
    print(f"| Diffusers {tv} (CPU, fp32, {tthreads} threads) | {t_ms:.1f} | {t_ms / d_ms:.2f} |")
    print(f"ditd is {t_ms / d_ms:.2f}x the speed of PyTorch ({d_gflops:.0f} GFLOP/s)")


if __name__ == "__main__":
    main()
