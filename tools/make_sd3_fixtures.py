#!/usr/bin/env python3
"""Build the SD3 / SD3.5 transformer fixtures that ditd's C tests compare against.

What it is: a script that makes tiny random-weight Diffusers SD3Transformer2DModel
checkpoints under tests/fixtures/sd3/<name>/ and records what Diffusers computes
with them, in float64, in <name>/expected/ (.npy files listed in
<name>/expected/cases.json):

  sd3-tiny   SD3 (qk_norm None, no dual attention), 2 layers (the last one
             context_pre_only). Its checkpoint has no pos_embed.pos_embed: the
             reference keeps the buffer PatchEmbed computes (2-D sincos,
             base_size = sample_size / patch_size), as from_pretrained does for
             a missing buffer, so ditd's own table is checked.
  sd35-tiny  SD3.5-like: qk_norm "rms_norm", dual attention (MMDiT-X,
             SD35AdaLayerNormZeroX) on layers 0 and 2 of 3, the last one
             context_pre_only; the checkpoint carries pos_embed.pos_embed.
  sd35-bf16  the sd35-tiny architecture (other weights) saved in bfloat16; the
             reference is that bf16 checkpoint upcast to float64.

Every model: pos_embed_max_size 6 (a 6x6 patch grid, latents up to 12x12), and
cases of a non-square latent (an odd token count, the positional table cropped
off-centre), an odd text length, batch 2, and skip-layer guidance
(StableDiffusion3Pipeline's skip_guidance_layers: forward(skip_layers=[...])).

Every case also records Diffusers run in bfloat16 (the model as
from_pretrained(torch_dtype=torch.bfloat16) gives it: weights, activations and
attention in bf16, on the CPU) and that run's error against the float64
reference (forward<i>_out_bf16.npy, "bf16_rel" and "bf16_rel_l2" in
cases.json): the yardstick tests/golden/test_sd3.c holds ditd's bf16-weight CPU
table to.

Inputs are stored as ditd's denoiser interface takes them: latents (B, C, h, w),
the scheduler's timestep t (sigma * 1000, what StableDiffusion3Pipeline passes the
model), the text sequence (B, L, joint_attention_dim) and the pooled vector
(B, pooled_projection_dim).

What it is not: part of the build or the tests. The fixtures are committed; tests
never need PyTorch. Run it again only when a fixture must change:

    python tools/make_sd3_fixtures.py [--out tests/fixtures/sd3]

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
from diffusers import SD3Transformer2DModel

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "tests" / "fixtures" / "sd3"

BASE = dict(sample_size=8, patch_size=2, in_channels=4, out_channels=4, attention_head_dim=8,
            num_attention_heads=2, joint_attention_dim=24, caption_projection_dim=16,
            pooled_projection_dim=20, pos_embed_max_size=6)

# name, seed, config overrides, dtype saved, keep pos_embed buffer,
# forward cases: (B, latent h, latent w, text length, skip_layers)
CONFIGS = [
    ("sd3-tiny", 3001, dict(num_layers=2, qk_norm=None, dual_attention_layers=()),
     torch.float32, False,
     [(1, 12, 12, 6, []), (2, 6, 10, 7, []), (2, 6, 10, 7, [0]), (1, 10, 4, 5, [1])]),
    ("sd35-tiny", 3002, dict(num_layers=3, qk_norm="rms_norm", dual_attention_layers=(0, 2)),
     torch.float32, True,
     [(2, 10, 6, 9, []), (1, 8, 12, 3, []), (2, 10, 6, 9, [1]), (1, 6, 8, 5, [0, 2])]),
    ("sd35-bf16", 3003, dict(num_layers=3, qk_norm="rms_norm", dual_attention_layers=(0, 2)),
     torch.bfloat16, True,
     [(2, 6, 10, 7, []), (1, 10, 6, 4, [1])]),
]


def save(path, a):
    np.save(path, np.ascontiguousarray(a.detach().cpu().numpy().astype(np.float32)))


def make(out_root, name, seed, over, dtype, keep_pos, cases):
    torch.manual_seed(seed)
    cfg = dict(BASE, **over)
    model = SD3Transformer2DModel(**cfg)
    # move every parameter off its init (RMSNorm weights would all be 1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    d = out_root / name
    if d.exists():
        shutil.rmtree(d)
    (d / "expected").mkdir(parents=True)
    model = model.to(dtype)
    model.save_pretrained(d, safe_serialization=True)
    wfile = d / "diffusion_pytorch_model.safetensors"
    sd = safetensors.torch.load_file(wfile)
    if not keep_pos:
        del sd["pos_embed.pos_embed"]
        safetensors.torch.save_file(sd, wfile, metadata={"format": "pt"})
    # the reference: a fresh model (its pos_embed buffer computed as PatchEmbed
    # does), then the stored weights, computed in float64
    ref = SD3Transformer2DModel(**cfg)
    missing, unexpected = ref.load_state_dict({k: v.float() for k, v in sd.items()}, strict=False)
    assert not unexpected and missing == ([] if keep_pos else ["pos_embed.pos_embed"]), missing
    ref = ref.to(torch.float64).eval()
    rbf = SD3Transformer2DModel(**cfg)
    rbf.load_state_dict({k: v.float() for k, v in sd.items()}, strict=False)
    rbf = rbf.to(torch.bfloat16).eval()
    C = cfg["in_channels"]
    listed = []
    g = torch.Generator().manual_seed(seed + 1)
    for i, (B, h, w, L, skip) in enumerate(cases):
        x = torch.randn(B, C, h, w, generator=g, dtype=torch.float64).float().double()
        sigma = torch.rand(B, generator=g, dtype=torch.float64)
        t = (sigma * 1000).float().double()          # the scheduler's timesteps (float32)
        text = torch.randn(B, L, cfg["joint_attention_dim"], generator=g,
                           dtype=torch.float64).float().double()
        pooled = torch.randn(B, cfg["pooled_projection_dim"], generator=g,
                             dtype=torch.float64).float().double()
        with torch.no_grad():
            out = ref(hidden_states=x, encoder_hidden_states=text, pooled_projections=pooled,
                      timestep=t, skip_layers=skip or None, return_dict=False)[0]
            bf = rbf(hidden_states=x.bfloat16(), encoder_hidden_states=text.bfloat16(),
                     pooled_projections=pooled.bfloat16(), timestep=t.float(),
                     skip_layers=skip or None, return_dict=False)[0].double()
        names = {}
        for key, val in (("x", x), ("t", t), ("text", text), ("pooled", pooled), ("out", out),
                         ("out_bf16", bf)):
            names[key] = f"forward{i}_{key}.npy"
            save(d / "expected" / names[key], val)
        diff = (bf - out).abs()
        bf16_rel = float(diff.max() / out.abs().max())
        bf16_rel_l2 = float(diff.norm() / out.norm())
        listed.append(dict(B=B, height=h, width=w, text_len=L, skip_layers=skip, **names,
                           bf16_rel=bf16_rel, bf16_rel_l2=bf16_rel_l2))
    cfg_json = dict(cfg, dual_attention_layers=list(cfg["dual_attention_layers"]))
    meta = dict(diffusers=diffusers.__version__, torch=torch.__version__, compute="float64",
                weights=str(dtype).replace("torch.", ""), pos_embed_in_checkpoint=keep_pos,
                config=cfg_json, forward=listed)
    (d / "expected" / "cases.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(f"{name}: {len(listed)} cases")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args()
    torch.set_num_threads(1)
    for name, seed, over, dtype, keep_pos, cases in CONFIGS:
        make(args.out, name, seed, over, dtype, keep_pos, cases)


if __name__ == "__main__":
    main()
