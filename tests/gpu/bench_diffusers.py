#!/usr/bin/env python3
"""Diffusers DiTTransformer2DModel (DiT-XL/2 shape, random weights) forward
time in bf16 with SDPA attention, eager and under torch.compile, on the same
GPU and shapes as `ditd bench --device cuda`. Run by tests/gpu/run.sh; prints
one markdown row per (mode, tokens, batch) as soon as it is measured, so a
timeout still leaves the rows it had. Exits 77 when torch (with CUDA) or
diffusers is not importable.

Usage: bench_diffusers.py [--budget SECONDS] [--tokens 256,1024,4096] [--batches 1,2]
"""
import argparse
import math
import statistics
import sys
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--budget", type=float, default=200.0,
                    help="seconds after which the remaining torch.compile rows are skipped")
    ap.add_argument("--tokens", default="256,1024,4096")
    ap.add_argument("--batches", default="1,2")
    ap.add_argument("--iters", type=int, default=10)
    args = ap.parse_args()
    try:
        import torch
        from diffusers import DiTTransformer2DModel
    except Exception as e:  # ImportError, or a broken install
        print(f"diffusers bench skipped: {e}")
        return 77
    if not torch.cuda.is_available():
        print("diffusers bench skipped: torch sees no CUDA device")
        return 77

    import diffusers
    print(f"torch {torch.__version__}, diffusers {diffusers.__version__}, "
          f"{torch.cuda.get_device_name(0)}", flush=True)
    print("| implementation | tokens | batch | ms/forward (median) |\n|---|---|---|---|", flush=True)
    start = time.time()
    tokens = [int(t) for t in args.tokens.split(",")]
    batches = [int(b) for b in args.batches.split(",")]
    torch.manual_seed(0)
    for mode in ("eager", "compile"):
        for n in tokens:
            side = int(math.isqrt(n))
            with torch.device("cuda"):
                model = DiTTransformer2DModel(
                    num_attention_heads=16, attention_head_dim=72, in_channels=4,
                    out_channels=8, num_layers=28, patch_size=2, sample_size=2 * side,
                    num_embeds_ada_norm=1000, norm_type="ada_norm_zero",
                    activation_fn="gelu-approximate").to(torch.bfloat16).eval()
            fwd = model
            if mode == "compile":
                fwd = torch.compile(model)
            for b in batches:
                name = "Diffusers bf16 SDPA" + (" + torch.compile" if mode == "compile" else "")
                if mode == "compile" and time.time() - start > args.budget:
                    print(f"| {name} | {n} | {b} | skipped (time budget) |", flush=True)
                    continue
                x = torch.randn(b, 4, 2 * side, 2 * side, device="cuda", dtype=torch.bfloat16)
                t = torch.full((b,), 999, device="cuda", dtype=torch.long)
                y = torch.arange(b, device="cuda", dtype=torch.long) * 7 % 1000
                with torch.inference_mode():
                    for _ in range(3):
                        fwd(x, timestep=t, class_labels=y)
                    torch.cuda.synchronize()
                    times = []
                    for _ in range(args.iters):
                        a = torch.cuda.Event(enable_timing=True)
                        e = torch.cuda.Event(enable_timing=True)
                        a.record()
                        fwd(x, timestep=t, class_labels=y)
                        e.record()
                        e.synchronize()
                        times.append(a.elapsed_time(e))
                print(f"| {name} | {n} | {b} | {statistics.median(times):.2f} |", flush=True)
            del model, fwd
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
