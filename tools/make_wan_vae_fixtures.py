#!/usr/bin/env python3
"""Build the AutoencoderKLWan reference fixtures for ditd's C tests (tests/fixtures/wan_vae/).

What it is: a script that makes tiny random-weight Diffusers AutoencoderKLWan checkpoints in
Diffusers layout (<name>/vae/config.json + diffusion_pytorch_model.safetensors, f32 or bf16)
and records what Diffusers 0.42 computes with them, in float64, in <name>/expected/ (.npy
files listed in <name>/expected/cases.json):

  - decode: AutoencoderKLWan.decode(z).sample (chunked: the first latent frame, then one
    latent frame at a time) for 1, 2 and 3 latent frames (1, 5, 9 video frames), odd,
    non-square latents;
  - encode: AutoencoderKLWan.encode(x).latent_dist mean and std (chunked: 1 frame, then 4
    at a time) for 1, 5 and 9 frames (and one count that is not 1 + 4k: Diffusers drops
    the frames past the last whole chunk);
  - tiled: the same decode after enable_tiling(...) with small tiles.

The configs: a Wan 2.1-shaped VAE (dim_mult [1, 2, 4, 4], temporal downsampling in the last
two blocks, z_dim 16), a smaller one with z_dim 4, a separate decoder_base_dim and a single
temporal stage (bf16 checkpoint), and a Wan 2.2-shaped residual one (is_residual, patch_size 2,
12 channels in and out, spatial scale 16).

Random weights: every weight N(0, 1/fan_in), every bias N(0, 0.1^2), every RMS-norm gamma
1 + N(0, 0.1^2); conv_out scaled by 0.3 so that few outputs reach the decoder's clamp to
[-1, 1]. 16-bit checkpoints are rounded first and the reference computed from the rounded
weights.

What it is not: part of the build or the tests (they never need PyTorch). Run it again only
when a fixture must change:

    python tools/make_wan_vae_fixtures.py [--out tests/fixtures/wan_vae]
"""

import argparse
import json
import shutil
from pathlib import Path

import numpy as np
import safetensors.torch
import torch

import diffusers
from diffusers import AutoencoderKLWan

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "tests" / "fixtures" / "wan_vae"

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}

CONFIGS = [
    {
        "name": "wan21-z16",
        "seed": 31,
        "dtype": "f32",
        "vae": dict(base_dim=4, decoder_base_dim=6, z_dim=16, dim_mult=[1, 2, 4, 4], num_res_blocks=1,
                    temperal_downsample=[False, True, True],
                    latents_mean=[0.1 * i - 0.8 for i in range(16)],
                    latents_std=[1.0 + 0.1 * i for i in range(16)]),
        # (B, T, h, w) latents; (B, F, H, W) videos
        "decode": [(1, 1, 3, 5), (1, 2, 4, 3), (2, 3, 3, 4)],
        "encode": [(1, 1, 24, 40), (1, 5, 22, 34), (1, 9, 16, 24), (1, 7, 16, 16)],
        "tiled": [((1, 3, 7, 9), dict(tile_sample_min_height=32, tile_sample_min_width=32,
                                      tile_sample_stride_height=24, tile_sample_stride_width=24))],
    },
    {
        "name": "wan21-z4-bf16",
        "seed": 32,
        "dtype": "bf16",
        "vae": dict(base_dim=8, decoder_base_dim=12, z_dim=4, dim_mult=[1, 2, 2],
                    num_res_blocks=2, temperal_downsample=[True, False],
                    latents_mean=[0.0, 0.1, -0.2, 0.3], latents_std=[1.0, 2.0, 1.5, 0.5],
                    scale_factor_temporal=2, scale_factor_spatial=4),
        "decode": [(1, 3, 5, 7)],
        "encode": [(1, 5, 10, 14)],
        "tiled": [],
    },
    {
        "name": "wan22-res",
        "seed": 33,
        "dtype": "f32",
        "vae": dict(base_dim=4, decoder_base_dim=8, z_dim=12, dim_mult=[1, 2, 4, 4],
                    num_res_blocks=1, temperal_downsample=[False, True, True], is_residual=True,
                    in_channels=12, out_channels=12, patch_size=2, scale_factor_spatial=16,
                    latents_mean=[0.05 * i for i in range(12)],
                    latents_std=[1.0 + 0.05 * i for i in range(12)]),
        "decode": [(1, 1, 3, 2), (1, 3, 2, 3)],
        "encode": [(1, 1, 32, 48), (1, 9, 32, 32)],
        "tiled": [((1, 2, 5, 4), dict(tile_sample_min_height=48, tile_sample_min_width=48,
                                      tile_sample_stride_height=32, tile_sample_stride_width=32))],
    },
]


def randomize(model, gen, dtype):
    """Non-degenerate random weights, rounded to the checkpoint dtype."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("gamma"):
                v = 1 + 0.1 * torch.randn(p.shape, generator=gen, dtype=torch.float64)
            elif p.ndim > 1:
                fan_in = p[0].numel()
                v = torch.randn(p.shape, generator=gen, dtype=torch.float64) / fan_in ** 0.5
                if name.startswith("decoder.conv_out"):
                    v = 0.3 * v
            else:
                v = 0.1 * torch.randn(p.shape, generator=gen, dtype=torch.float64)
            p.copy_(v.to(dtype).to(p.dtype))


def save_vae(model, folder, dtype):
    folder.mkdir(parents=True, exist_ok=True)
    model.save_config(folder)
    sd = {k: v.to(dtype).contiguous() for k, v in model.state_dict().items()}
    safetensors.torch.save_file(sd, str(folder / "diffusion_pytorch_model.safetensors"))


def npsave(d, name, t):
    np.save(d / name, np.ascontiguousarray(t.detach().cpu().numpy().astype(np.float32)))
    return name


def f32(t):
    """A float32 input widened to float64: both sides start from the same numbers."""
    return t.to(torch.float32).to(torch.float64)


def make_vae(cfg, out):
    root = out / cfg["name"]
    if root.exists():
        shutil.rmtree(root)
    exp = root / "expected"
    exp.mkdir(parents=True)
    gen = torch.Generator().manual_seed(cfg["seed"])
    model = AutoencoderKLWan(**cfg["vae"]).to(torch.float64).eval()
    randomize(model, gen, DTYPES[cfg["dtype"]])
    save_vae(model, root / "vae", DTYPES[cfg["dtype"]])
    z_dim = model.config.z_dim
    cin = model.config.in_channels // (model.config.patch_size or 1) ** 2
    cases = []
    with torch.no_grad():
        for i, (b, t, h, w) in enumerate(cfg["decode"]):
            z = f32(torch.randn((b, z_dim, t, h, w), generator=gen, dtype=torch.float64))
            model.disable_tiling()
            y = model.decode(z).sample
            sat = (y.abs() >= 1.0).double().mean().item()
            print(f"  decode {tuple(z.shape)} -> {tuple(y.shape)}, clamped {sat:.3f}")
            cases.append({"kind": "decode", "z": npsave(exp, f"decode{i}_z.npy", z),
                          "out": npsave(exp, f"decode{i}_out.npy", y)})
        for i, (b, f, hh, ww) in enumerate(cfg["encode"]):
            x = f32(torch.rand((b, cin, f, hh, ww), generator=gen, dtype=torch.float64) * 2 - 1)
            model.disable_tiling()
            d = model.encode(x).latent_dist
            print(f"  encode {tuple(x.shape)} -> {tuple(d.mean.shape)}")
            cases.append({"kind": "encode", "x": npsave(exp, f"encode{i}_x.npy", x),
                          "mean": npsave(exp, f"encode{i}_mean.npy", d.mean),
                          "std": npsave(exp, f"encode{i}_std.npy", d.std)})
        for i, ((b, t, h, w), tiles) in enumerate(cfg["tiled"]):
            z = f32(torch.randn((b, z_dim, t, h, w), generator=gen, dtype=torch.float64))
            model.enable_tiling(**tiles)
            y = model.decode(z).sample
            model.disable_tiling()
            print(f"  tiled {tuple(z.shape)} -> {tuple(y.shape)} {tiles}")
            cases.append({"kind": "tiled", "z": npsave(exp, f"tiled{i}_z.npy", z),
                          "out": npsave(exp, f"tiled{i}_out.npy", y), "tiles": tiles})
    (exp / "cases.json").write_text(json.dumps({"diffusers": diffusers.__version__,
                                                "cases": cases}, indent=1) + "\n")
    print(root, len(cases), "cases")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(2)
    for cfg in CONFIGS:
        make_vae(cfg, args.out)


if __name__ == "__main__":
    main()
