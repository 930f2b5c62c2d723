#!/usr/bin/env python3
"""Times one FLUX transformer forward in Diffusers (PyTorch, CPU, float32) beside ditd's
bench_flux on the same checkpoint, latent size, text length, batch and thread count.

It writes a random-weight FluxTransformer2DModel of FLUX.1-dev's width (hidden 3072,
24 heads x 128, T5 4096, CLIP 768, guidance embeds) at reduced depth (--double, --single
blocks; the issue's benchmark uses 1 + 1) into --dir (about 2 GB for 1 + 1), then
prints the median ms per forward of each and the ratio. A benchmark: it asserts nothing.

    /root/ditd-venv/bin/python bench/compare_flux.py --latent 64 --text 128 --threads 2 \
        --bench build/tests/kernels/bench_flux --dir /tmp/flux-bench
"""
import argparse
import os
import re
import statistics
import subprocess
import time
from pathlib import Path

import torch
from diffusers import FluxPipeline, FluxTransformer2DModel


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--latent", type=int, default=128, help="latent side (image / 8); 128 = 1024x1024")
    ap.add_argument("--text", type=int, default=512)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--double", type=int, default=1)
    ap.add_argument("--single", type=int, default=1)
    ap.add_argument("--bench", required=True, help="path of ditd's bench_flux")
    ap.add_argument("--dir", type=Path, required=True, help="where the checkpoint is written")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    cfg = dict(num_layers=args.double, num_single_layers=args.single, guidance_embeds=True)
    if not (args.dir / "config.json").exists():
        FluxTransformer2DModel(**cfg).save_pretrained(args.dir, safe_serialization=True)
    model = FluxTransformer2DModel.from_pretrained(args.dir, torch_dtype=torch.float32).eval()
    B, h = args.batch, args.latent
    n_img = (h // 2) * (h // 2)
    x = torch.randn(B, n_img, 64)
    text = torch.randn(B, args.text, 4096)
    pooled = torch.randn(B, 768)
    img_ids = FluxPipeline._prepare_latent_image_ids(B, h // 2, h // 2, "cpu", torch.float32)
    txt_ids = torch.zeros(args.text, 3)
    t = torch.full((B,), 0.5)
    g = torch.full((B,), 3.5)
    times = []
    with torch.no_grad():
        for r in range(args.reps + 1):
            t0 = time.perf_counter()
            model(hidden_states=x, encoder_hidden_states=text, pooled_projections=pooled,
                  timestep=t, img_ids=img_ids, txt_ids=txt_ids, guidance=g, return_dict=False)
            if r:
                times.append((time.perf_counter() - t0) * 1e3)
    torch_ms = statistics.median(times)
    del model
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    out = subprocess.run([args.bench, str(args.dir), "--height", str(h), "--width", str(h),
                          "--text", str(args.text), "--batch", str(B), "--threads",
                          str(args.threads), "--reps", str(args.reps)],
                         capture_output=True, text=True, env=env, check=True).stdout
    print(out.strip())
    ditd_ms = float(re.search(r"median ([0-9.]+) ms", out).group(1))
    print(f"| blocks | latent | image + text tokens | batch | threads | Diffusers ms | ditd ms | ditd / Diffusers |")
    print(f"| {args.double} + {args.single} | {h}x{h} | {n_img} + {args.text} | {B} | {args.threads} "
          f"| {torch_ms:.0f} | {ditd_ms:.0f} | {ditd_ms / torch_ms:.2f} |")


if __name__ == "__main__":
    main()
