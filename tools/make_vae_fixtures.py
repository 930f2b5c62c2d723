#!/usr/bin/env python3
"""Build the AutoencoderKL reference fixtures for ditd's C tests (tests/fixtures/vae/).

What it is: a script that makes tiny random-weight Diffusers AutoencoderKL checkpoints in
Diffusers layout (<name>/vae/config.json + diffusion_pytorch_model.safetensors, stored in
f32, f16 or bf16) and records what Diffusers computes with them, in float64, in
<name>/expected/ (.npy files listed in <name>/expected/cases.json):

  - decode: AutoencoderKL.decode(z).sample for odd, non-square latents;
  - encode: AutoencoderKL.encode(x).latent_dist mean and std (also of images whose sides
    are not a multiple of the scale factor);
  - tiled:  the same decode after enable_tiling() (tiles, overlap, blending).

and one latent DiT model folder, dit-latent/ (transformer + scheduler + vae with a
shift_factor, model_index naming DiTPipeline), with the output of diffusers' DiTPipeline itself (float64, its noise
replaced by a recorded array): the latents handed to vae.decode and the uint8 image.

Random weights are scaled so that no layer is degenerate: every weight N(0, 1/fan_in),
every bias and GroupNorm beta N(0, 0.1^2), every GroupNorm gamma 1 + N(0, 0.1^2); 16-bit
checkpoints are rounded first and the reference computed from the rounded weights.

What it is not: part of the build or the tests (they never need PyTorch). Run it again
only when a fixture must change:

    python tools/make_vae_fixtures.py [--out tests/fixtures/vae]
"""

import argparse
import json
import shutil
from pathlib import Path

import numpy as np
import safetensors.torch
import torch

import diffusers
from diffusers import AutoencoderKL, DDIMScheduler, DiTPipeline, DiTTransformer2DModel
from diffusers.pipelines.dit import pipeline_dit

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "tests" / "fixtures" / "vae"

DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}

CONFIGS = [
    {
        "name": "kl4-f32",
        "seed": 11,
        "dtype": "f32",
        "vae": dict(in_channels=3, out_channels=3, latent_channels=4,
                    down_block_types=["DownEncoderBlock2D"] * 2,
                    up_block_types=["UpDecoderBlock2D"] * 2,
                    block_out_channels=[16, 32], layers_per_block=1, norm_num_groups=4,
                    sample_size=16, scaling_factor=0.18215),
        "decode": [(2, 5, 7), (1, 8, 3)],
        "encode": [(1, 10, 14)],
        "tiled": [(1, 13, 10)],
        "encode_odd": [(1, 23, 13)],
    },
    {
        "name": "kl16-bf16",
        "seed": 12,
        "dtype": "bf16",
        "vae": dict(in_channels=3, out_channels=3, latent_channels=16,
                    down_block_types=["DownEncoderBlock2D"] * 3,
                    up_block_types=["UpDecoderBlock2D"] * 3,
                    block_out_channels=[8, 16, 32], layers_per_block=2, norm_num_groups=8,
                    sample_size=32, scaling_factor=0.3611, shift_factor=0.1159,
                    use_quant_conv=False, use_post_quant_conv=False, force_upcast=True),
        "decode": [(1, 6, 5)],
        "encode": [(1, 20, 12)],
        "tiled": [(1, 11, 9)],
        "encode_odd": [(1, 45, 27)],
    },
    {
        # stored with the deprecated attention names (query/key/value/proj_attn) of
        # older checkpoints, which Diffusers still loads
        "name": "kl4-f16-oldattn",
        "seed": 13,
        "dtype": "f16",
        "deprecated_attn_names": True,
        "vae": dict(in_channels=3, out_channels=3, latent_channels=4,
                    down_block_types=["DownEncoderBlock2D"] * 2,
                    up_block_types=["UpDecoderBlock2D"] * 2,
                    block_out_channels=[8, 16], layers_per_block=1, norm_num_groups=4,
                    sample_size=16),
        "decode": [(1, 9, 4)],
        "encode": [(2, 6, 10)],
        "tiled": [],
        "encode_odd": [(1, 11, 9)],
    },
]


def randomize(model, gen, dtype):
    """Non-degenerate random weights, rounded to the checkpoint dtype."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim > 1:
                fan_in = p[0].numel()
                v = torch.randn(p.shape, generator=gen, dtype=torch.float64) / fan_in ** 0.5
            elif "norm" in name and name.endswith("weight"):
                v = 1 + 0.1 * torch.randn(p.shape, generator=gen, dtype=torch.float64)
            else:
                v = 0.1 * torch.randn(p.shape, generator=gen, dtype=torch.float64)
            p.copy_(v.to(dtype).to(p.dtype))


def save_vae(model, folder, dtype, deprecated):
    folder.mkdir(parents=True, exist_ok=True)
    model.save_config(folder)
    sd = {k: v.to(dtype).contiguous() for k, v in model.state_dict().items()}
    if deprecated:
        ren = {"to_q": "query", "to_k": "key", "to_v": "value", "to_out.0": "proj_attn"}
        out = {}
        for k, v in sd.items():
            for a, b in ren.items():
                if ".attentions.0." + a + "." in k:
                    k = k.replace(".attentions.0." + a + ".", ".attentions.0." + b + ".")
            out[k] = v
        sd = out
    safetensors.torch.save_file(sd, str(folder / "diffusion_pytorch_model.safetensors"))


def npsave(d, name, t):
    np.save(d / name, np.ascontiguousarray(t.detach().cpu().numpy().astype(np.float32)))
    return name


def make_vae(cfg, out):
    root = out / cfg["name"]
    if root.exists():
        shutil.rmtree(root)
    exp = root / "expected"
    exp.mkdir(parents=True)
    gen = torch.Generator().manual_seed(cfg["seed"])
    model = AutoencoderKL(**cfg["vae"]).to(torch.float64).eval()
    randomize(model, gen, DTYPES[cfg["dtype"]])
    save_vae(model, root / "vae", DTYPES[cfg["dtype"]], cfg.get("deprecated_attn_names", False))
    cases = []
    with torch.no_grad():
        for i, (b, h, w) in enumerate(cfg["decode"]):
            z = torch.randn((b, model.config.latent_channels, h, w), generator=gen,
                            dtype=torch.float32).to(torch.float64)
            model.disable_tiling()
            y = model.decode(z).sample
            cases.append({"kind": "decode", "z": npsave(exp, f"decode{i}_z.npy", z),
                          "out": npsave(exp, f"decode{i}_out.npy", y)})
        for i, (b, hh, ww) in enumerate(cfg["encode"]):
            x = (torch.rand((b, 3, hh, ww), generator=gen, dtype=torch.float32) * 2 - 1).to(torch.float64)
            d = model.encode(x).latent_dist
            cases.append({"kind": "encode", "x": npsave(exp, f"encode{i}_x.npy", x),
                          "mean": npsave(exp, f"encode{i}_mean.npy", d.mean),
                          "std": npsave(exp, f"encode{i}_std.npy", d.std)})
        for i, (b, h, w) in enumerate(cfg["tiled"]):
            z = torch.randn((b, model.config.latent_channels, h, w), generator=gen,
                            dtype=torch.float32).to(torch.float64)
            model.enable_tiling()
            y = model.decode(z).sample
            model.disable_tiling()
            cases.append({"kind": "tiled", "z": npsave(exp, f"tiled{i}_z.npy", z),
                          "out": npsave(exp, f"tiled{i}_out.npy", y)})
        # images whose sides are not a multiple of the scale factor (the stride-2
        # stages drop their last row or column): drawn last, from a generator of
        # their own, so the cases above keep their bytes
        gen_odd = torch.Generator().manual_seed(cfg["seed"] + 100)
        for i, (b, hh, ww) in enumerate(cfg.get("encode_odd", [])):
            x = (torch.rand((b, 3, hh, ww), generator=gen_odd, dtype=torch.float32) * 2 - 1).to(torch.float64)
            d = model.encode(x).latent_dist
            cases.append({"kind": "encode", "x": npsave(exp, f"encode_odd{i}_x.npy", x),
                          "mean": npsave(exp, f"encode_odd{i}_mean.npy", d.mean),
                          "std": npsave(exp, f"encode_odd{i}_std.npy", d.std)})
    (exp / "cases.json").write_text(json.dumps({"diffusers": diffusers.__version__,
                                                "cases": cases}, indent=1) + "\n")
    print(root, len(cases), "cases")


def make_dit_latent(out):
    """A tiny latent DiT + the kl4 VAE, run through diffusers' DiTPipeline in float64."""
    root = out / "dit-latent"
    if root.exists():
        shutil.rmtree(root)
    gen = torch.Generator().manual_seed(21)
    transformer = DiTTransformer2DModel(
        num_attention_heads=2, attention_head_dim=16, in_channels=4, out_channels=8,
        num_layers=2, sample_size=8, patch_size=2, num_embeds_ada_norm=1000,
    ).to(torch.float64).eval()
    with torch.no_grad():
        for p in transformer.parameters():
            p.copy_(0.05 * torch.randn(p.shape, generator=gen, dtype=torch.float64))
    # a shift_factor that DiTPipeline must ignore (it only divides by scaling_factor)
    vae = AutoencoderKL(**CONFIGS[0]["vae"], shift_factor=0.5).to(torch.float64).eval()
    randomize(vae, gen, torch.float32)
    sched = DDIMScheduler(beta_schedule="linear", clip_sample=False)
    pipe = DiTPipeline(transformer=transformer, vae=vae, scheduler=sched)
    pipe.save_pretrained(root, safe_serialization=True)
    # float32 checkpoints on disk (save_pretrained wrote float64)
    for sub, m in (("transformer", transformer), ("vae", vae)):
        safetensors.torch.save_file({k: v.to(torch.float32).contiguous() for k, v in m.state_dict().items()},
                                    str(root / sub / "diffusion_pytorch_model.safetensors"))
    exp = root / "expected"
    exp.mkdir()
    classes, steps, guidance = [3, 7], 4, 4.0
    noise = torch.randn((len(classes), 4, 8, 8), generator=gen, dtype=torch.float32)
    pipeline_dit.randn_tensor = lambda *a, **k: noise.to(torch.float64)
    seen = {}
    decode = vae.decode

    def spy(z, *a, **k):
        seen["z"] = z.clone()
        return decode(z, *a, **k)

    vae.decode = spy
    with torch.no_grad():
        img = pipe(class_labels=classes, guidance_scale=guidance, num_inference_steps=steps,
                   output_type="np").images
    pix = (img * 255).round().astype(np.uint8)  # numpy_to_pil's rule, without PIL
    npsave(exp, "noise.npy", noise)
    npsave(exp, "decode_in.npy", seen["z"])
    np.save(exp / "pixels.npy", pix.astype(np.float32))  # (B, H, W, 3) levels 0..255
    (exp / "cases.json").write_text(json.dumps({
        "diffusers": diffusers.__version__, "classes": classes, "steps": steps,
        "guidance_scale": guidance, "sampler": "ddim"}, indent=1) + "\n")
    print(root, "DiTPipeline", pix.shape)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(2)
    for cfg in CONFIGS:
        make_vae(cfg, args.out)
    make_dit_latent(args.out)


if __name__ == "__main__":
    main()
