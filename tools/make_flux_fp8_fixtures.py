#!/usr/bin/env python3
"""Tiny FLUX.1 transformers as FP8 safetensors checkpoints, in the three ways
the shared FP8 FLUX files store them, and what Diffusers computes with their
dequantized weights in float64.

    /root/ditd-venv/bin/python tools/make_flux_fp8_fixtures.py

tests/fixtures/flux_fp8/<name>/ holds config.json,
diffusion_pytorch_model.safetensors and expected/ (the layout of
tools/make_flux_gguf_fixtures.py, read by tests/flux_case.h):

  e4m3-row     Diffusers' names; every 2-D weight float8_e4m3fn with one
               scale per row, `P.weight_scale` of shape (N, 1) in F32, the
               compressed-tensors / ModelOpt / vLLM layout (the activation
               scales those files may carry are weight-only irrelevant and
               left out); biases and norms in BF16.
  e4m3-scaled  FLUX.1's original (BFL) names with ComfyUI's
               "model.diffusion_model." prefix, ComfyUI's "scaled fp8":
               one F32 `P.scale_weight` per weight and the empty
               `scaled_fp8` marker tensor; biases and norms in BF16.
  e5m2         Diffusers' names, float8_e5m2 weights cast without a scale
               (as the plain "fp8" conversions do), vectors in F32.

And values.safetensors, for the unit test of the conversions and scales:
every byte as F8_E4M3 (`e4m3`) and F8_E5M2 (`e5m2`) with torch's float32
of each (`e4m3_f32`, `e5m2_f32`); a (5, 7) E4M3 weight with per-row scales
(`row.weight`, `row.weight_scale` (5, 1) BF16) and one with a per-tensor
scale (`one.weight`, `one.scale_weight` F32), with torch's q.float() * s of
each (`row_f32`, `one_f32`).

The stored value of a weight is q.float() * scale (one f32 multiply); the
reference is Diffusers' FluxTransformer2DModel in float64 on exactly those
values, and ditd, keeping the FP8 bytes and multiplying each row by its
scale as its GEMM reads the panel, must agree within 1e-4. Deterministic.
"""
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

import diffusers
from diffusers import FluxTransformer2DModel

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_flux_gguf_fixtures as g  # noqa: E402  (to_bfl, from_bfl, write_expected)

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "tests" / "fixtures" / "flux_fp8"
FP8_MAX = {torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0}


def quantize(w, dtype, scale):
    """w (N, K) float32 -> (q, s, stored value) with s None (no scale),
    'tensor' (one f32) or 'row' ((N, 1) f32)."""
    w = torch.from_numpy(w)
    if scale is None:
        q = w.to(dtype)
        return q, None, q.float()
    amax = w.abs().amax() if scale == "tensor" else w.abs().amax(dim=1, keepdim=True)
    s = (amax / FP8_MAX[dtype]).float().clamp(min=1e-12)
    q = (w / s).to(dtype)
    return q, s.reshape(()) if scale == "tensor" else s, q.float() * s


def write(path, tensors, dtype, scale, suffix, vec_dtype, marker=False):
    """tensors: name -> float32 array. Writes the checkpoint and returns
    name -> the values it stores (what any reader must get)."""
    out, stored = {}, {}
    for name, a in sorted(tensors.items()):
        if a.ndim == 2 and name.endswith(".weight"):
            q, s, v = quantize(a, dtype, scale)
            out[name] = q.contiguous()
            if s is not None:
                out[name[: -len("weight")] + suffix] = s.contiguous()
            stored[name] = v.numpy()
        else:
            t = torch.from_numpy(a).to(vec_dtype)
            out[name] = t.contiguous()
            stored[name] = t.float().numpy()
    if marker:
        out["scaled_fp8"] = torch.empty(0, dtype=dtype)
    save_file(out, str(path))
    return stored


def make(name, seed, cfg, cases, dtype, scale, names, prefix="", suffix="", vec_dtype=torch.bfloat16,
         marker=False):
    torch.manual_seed(seed)
    model = FluxTransformer2DModel(**cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    D = cfg["num_attention_heads"] * cfg["attention_head_dim"]
    F, nl, ns = 4 * D, cfg["num_layers"], cfg["num_single_layers"]
    d = OUT / name
    if d.exists():
        shutil.rmtree(d)
    (d / "expected").mkdir(parents=True)
    (d / "config.json").write_text(json.dumps(dict(_class_name="FluxTransformer2DModel",
                                                   _diffusers_version=diffusers.__version__,
                                                   out_channels=None, **cfg), indent=2) + "\n")
    ck = d / "diffusion_pytorch_model.safetensors"
    if names == "bfl":
        bfl = g.to_bfl(sd, D, F, nl, ns)
        stored = write(ck, {prefix + k: v for k, v in bfl.items()}, dtype, scale, suffix,
                       vec_dtype, marker)
        deq = g.from_bfl({k[len(prefix):]: v for k, v in stored.items()}, D, F, nl, ns)
    else:
        deq = write(ck, sd, dtype, scale, suffix, vec_dtype, marker)
    assert sorted(deq) == sorted(sd), name
    moved = max(float(np.abs(deq[k] - sd[k]).max()) for k in sd)
    print(f"{name}: FP8 moves a weight by up to {moved:.3g}")
    g.write_expected(d, cfg, deq, cases, seed, f"{ck.name}: {dtype} weights times their scales")


def values():
    OUT.mkdir(parents=True, exist_ok=True)
    b = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    t = {}
    for key, dt in (("e4m3", torch.float8_e4m3fn), ("e5m2", torch.float8_e5m2)):
        t[key] = b.view(dt).clone()
        t[key + "_f32"] = t[key].float()
    gen = torch.Generator().manual_seed(2604)
    w = torch.randn(5, 7, generator=gen)
    q, s, _ = quantize(w.numpy(), torch.float8_e4m3fn, "row")
    s = s.to(torch.bfloat16)
    t["row.weight"], t["row.weight_scale"] = q, s
    t["row_f32"] = q.float() * s.float()
    q, s, v = quantize((3 * w).numpy(), torch.float8_e4m3fn, "tensor")
    t["one.weight"], t["one.scale_weight"], t["one_f32"] = q, s, v
    save_file({k: v.contiguous() for k, v in t.items()}, str(OUT / "values.safetensors"))
    print("values.safetensors")


def main():
    torch.set_num_threads(2)
    values()
    small = dict(patch_size=1, in_channels=16, num_layers=1, num_single_layers=2,
                 attention_head_dim=32, num_attention_heads=2, joint_attention_dim=64,
                 pooled_projection_dim=64, guidance_embeds=True, axes_dims_rope=[8, 12, 12])
    cases = [(1, 8, 8, 6), (2, 6, 4, 5)]
    make("e4m3-row", 2601, small, cases, torch.float8_e4m3fn, "row", "diffusers",
         suffix="weight_scale")
    make("e4m3-scaled", 2602, small, cases[:1], torch.float8_e4m3fn, "tensor", "bfl",
         prefix="model.diffusion_model.", suffix="scale_weight", marker=True)
    make("e5m2", 2603, small, cases[:1], torch.float8_e5m2, None, "diffusers",
         vec_dtype=torch.float32)


if __name__ == "__main__":
    main()
