#!/usr/bin/env python3
"""Build the FLUX.1 transformer fixtures that ditd's C tests compare against.

What it is: a script that makes tiny random-weight Diffusers FluxTransformer2DModel
checkpoints (as Diffusers' own tests: one double and one single block, 2 heads x 16,
axes_dims_rope [4, 4, 8]; plus a deeper one with guidance_embeds, an odd text length
and a non-square odd token grid) under tests/fixtures/flux/<name>/, and records what
Diffusers computes with them, in float64, in <name>/expected/ (.npy files listed in
<name>/expected/cases.json).

The inputs are stored as ditd's denoiser interface takes them: latents (B, C, h, w)
before FluxPipeline's 2x2 packing, the scheduler's timestep t (sigma * 1000; the
pipeline hands the model t / 1000 and the model multiplies by 1000), the guidance
scale, the text sequence (B, L, Dt) and the pooled vector (B, Dp). The reference packs
the latents exactly as FluxPipeline._pack_latents does, builds img_ids with
FluxPipeline._prepare_latent_image_ids and txt_ids as zeros, and unpacks the output
with FluxPipeline._unpack_latents' inverse of that packing.

What it is not: part of the build or the tests. The fixtures are committed; tests never
need PyTorch. Run it again only when a fixture must change:

    python tools/make_flux_fixtures.py [--out tests/fixtures/flux]

It deletes and rewrites every fixture folder it owns; re-running gives identical files.
"""

import argparse
import json
import shutil
from pathlib import Path

import numpy as np
import safetensors.torch
import torch

import diffusers
from diffusers import FluxPipeline, FluxTransformer2DModel

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "tests" / "fixtures" / "flux"

BASE = dict(patch_size=1, num_layers=1, num_single_layers=1, attention_head_dim=16,
            num_attention_heads=2, joint_attention_dim=32, pooled_projection_dim=32,
            axes_dims_rope=[4, 4, 8])

# name, seed, config overrides, forward cases: (B, latent h, latent w, text length)
CONFIGS = [
    ("tiny-c4", 2001, dict(in_channels=16, guidance_embeds=False),
     [(1, 8, 8, 6), (2, 4, 6, 3)]),
    ("tiny-c16", 2002, dict(in_channels=64, guidance_embeds=False),
     [(2, 8, 8, 7)]),
    ("deep-guidance", 2003, dict(in_channels=64, guidance_embeds=True, num_layers=2,
                                 num_single_layers=3),
     [(2, 10, 14, 9), (1, 6, 10, 5)]),
    # six heads: ulysses 3 and ulysses 3 x tp 2 under mpirun
    ("heads6", 2004, dict(in_channels=64, guidance_embeds=True, num_attention_heads=6,
                          attention_head_dim=8, axes_dims_rope=[2, 2, 4]),
     [(1, 10, 6, 7), (2, 6, 6, 4)]),
]


def pack(x):
    # FluxPipeline._pack_latents: (B, C, h, w) -> (B, h/2 * w/2, C * 4)
    b, c, h, w = x.shape
    x = x.view(b, c, h // 2, 2, w // 2, 2).permute(0, 2, 4, 1, 3, 5)
    return x.reshape(b, (h // 2) * (w // 2), c * 4)


def unpack(x, h, w):
    # FluxPipeline._unpack_latents, on latent sizes: (B, N, C * 4) -> (B, C, h, w)
    b, n, c4 = x.shape
    x = x.view(b, h // 2, w // 2, c4 // 4, 2, 2).permute(0, 3, 1, 4, 2, 5)
    return x.reshape(b, c4 // 4, h, w)


def save(path, a):
    np.save(path, np.ascontiguousarray(a.detach().cpu().numpy().astype(np.float32)))


def make(out_root, name, seed, over, cases):
    torch.manual_seed(seed)
    cfg = dict(BASE, **over)
    model = FluxTransformer2DModel(**cfg)
    # move every parameter off its init (RMSNorm weights would all be 1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    d = out_root / name
    if d.exists():
        shutil.rmtree(d)
    (d / "expected").mkdir(parents=True)
    model.save_pretrained(d, safe_serialization=True)
    # the reference: the saved float32 weights, computed in float64
    ref = FluxTransformer2DModel.from_pretrained(d, torch_dtype=torch.float32).to(torch.float64)
    ref.eval()
    C = cfg["in_channels"] // 4
    listed = []
    g = torch.Generator().manual_seed(seed + 1)
    for i, (B, h, w, L) in enumerate(cases):
        x = torch.randn(B, C, h, w, generator=g, dtype=torch.float64).float().double()
        sigma = torch.rand(B, generator=g, dtype=torch.float64)
        t = (sigma * 1000).float().double()          # the scheduler's timesteps (float32)
        text = torch.randn(B, L, cfg["joint_attention_dim"], generator=g,
                           dtype=torch.float64).float().double()
        pooled = torch.randn(B, cfg["pooled_projection_dim"], generator=g,
                             dtype=torch.float64).float().double()
        guidance = (1 + 4 * torch.rand(B, generator=g, dtype=torch.float64)).float().double()
        img_ids = FluxPipeline._prepare_latent_image_ids(B, h // 2, w // 2, "cpu",
                                                         torch.float64)
        txt_ids = torch.zeros(L, 3, dtype=torch.float64)
        with torch.no_grad():
            o = ref(hidden_states=pack(x), encoder_hidden_states=text,
                    pooled_projections=pooled, timestep=t / 1000, img_ids=img_ids,
                    txt_ids=txt_ids,
                    guidance=guidance if cfg["guidance_embeds"] else None,
                    return_dict=False)[0]
        out = unpack(o, h, w)
        names = {}
        for key, val in (("x", x), ("t", t), ("text", text), ("pooled", pooled),
                         ("guidance", guidance), ("out", out)):
            names[key] = f"forward{i}_{key}.npy"
            save(d / "expected" / names[key], val)
        listed.append(dict(B=B, height=h, width=w, text_len=L, **names))
    meta = dict(diffusers=diffusers.__version__, torch=torch.__version__,
                compute="float64", config=cfg, forward=listed)
    (d / "expected" / "cases.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(f"{name}: {len(listed)} cases")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args()
    torch.set_num_threads(1)
    for name, seed, over, cases in CONFIGS:
        make(args.out, name, seed, over, cases)


if __name__ == "__main__":
    main()
