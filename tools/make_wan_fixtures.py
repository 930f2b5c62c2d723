#!/usr/bin/env python3
"""Build the Wan transformer fixtures that ditd's C tests compare against.

What it is: a script that makes tiny random-weight Diffusers WanTransformer3DModel
checkpoints under tests/fixtures/wan/<name>/ and records what Diffusers computes with
them, in float64, in <name>/expected/ (.npy files listed in <name>/expected/cases.json):

  t2v    Wan 2.1 T2V-like: 2 layers, 2 heads x 16, cross_attn_norm, float32 weights;
         odd frame counts, non-square odd patch grids, batch 2, one image (1 frame).
  ti2v   Wan 2.2 TI2V-5B-like: 6 heads x 12 (ulysses 3, tp 2 under mpirun), with
         expand_timesteps inputs: per-latent-frame timesteps (B, F), the conditioning
         first frame at 0 as WanImageToVideoPipeline builds them, and all frames at t
         as WanPipeline does; expanded here to Diffusers' (B, seq) per-token timestep.
  i2v21  Wan 2.1 I2V-like: the image branch (image_dim, added_kv_proj_dim), CLIP image
         embeddings of 257 tokens, text of 512 tokens.
  flf2v  Wan 2.1 FLF2V-like: the image branch with pos_embed over two images' tokens.
  i2v    Wan 2.2 I2V-A14B-like: in_channels 12 != out_channels 4 (image latents
         concatenated on channels), cross_attn_norm false, bfloat16 checkpoint; with
         Diffusers' own bf16 output (torch_dtype=torch.bfloat16) beside the float64 one.

The inputs are stored as ditd's denoiser interface takes them: latents (B, C, F, h, w),
the scheduler's timesteps t (B) (Wan takes them as they are), or per-frame timesteps
t_frames (B, F), and the text sequence (B, L, Dt) (no mask: WanPipeline passes none).

The reference: the saved weights (bf16 ones widened exactly), the model in float64.
Diffusers' FP32LayerNorm casts its input to float32 even in a float64 model; here it is
patched to compute in the input's dtype, so that the reference is float64 throughout
(the timestep features stay float32, as get_timestep_embedding computes them).

What it is not: part of the build or the tests. The fixtures are committed; tests never
need PyTorch. Run it again only when a fixture must change:

    python tools/make_wan_fixtures.py [--out tests/fixtures/wan]

It deletes and rewrites every fixture folder it owns; re-running gives identical files.
"""

import argparse
import json
import shutil
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

import diffusers
from diffusers import WanTransformer3DModel
from diffusers.models import normalization

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "tests" / "fixtures" / "wan"

BASE = dict(patch_size=(1, 2, 2), num_layers=2, cross_attn_norm=True,
            qk_norm="rms_norm_across_heads", eps=1e-6, rope_max_seq_len=32)

# name, seed, config overrides, checkpoint dtype,
# forward cases: (B, frames, latent h, latent w, text length, timestep kind)
#   kind "t": one timestep per sample; "first0": per-frame, frame 0 at 0 (TI2V image
#   conditioning); "ones": per-frame, every frame at t (WanPipeline expand_timesteps)
CONFIGS = [
    ("t2v", 2101, dict(num_attention_heads=2, attention_head_dim=16, in_channels=4,
                       out_channels=4, text_dim=24, freq_dim=32, ffn_dim=48),
     torch.float32,
     [(1, 3, 6, 10, 7, "t"), (2, 2, 10, 6, 5, "t"), (2, 1, 6, 6, 4, "t"),
      (1, 5, 6, 6, 3, "t")]),
    ("ti2v", 2201, dict(num_attention_heads=6, attention_head_dim=12, in_channels=8,
                        out_channels=8, text_dim=20, freq_dim=16, ffn_dim=96),
     torch.float32,
     [(2, 3, 6, 8, 6, "first0"), (1, 5, 4, 6, 5, "ones"), (2, 5, 2, 14, 4, "first0"),
      (1, 2, 6, 10, 3, "t")]),
    ("i2v", 2301, dict(num_attention_heads=2, attention_head_dim=16, in_channels=12,
                       out_channels=4, text_dim=24, freq_dim=32, ffn_dim=40,
                       cross_attn_norm=False),
     torch.bfloat16,
     [(2, 3, 6, 6, 5, "t"), (1, 2, 10, 14, 8, "t")]),
    # Wan 2.1 I2V-like: the image branch (CLIP image embeddings of 257 tokens,
    # image_embedder, attn2.add_k_proj / add_v_proj); the text is 512 tokens
    # (WanAttnProcessor takes the last 512 of the context as the text)
    ("i2v21", 2401, dict(num_attention_heads=2, attention_head_dim=16, in_channels=12,
                         out_channels=4, text_dim=8, freq_dim=16, ffn_dim=40, image_dim=20,
                         added_kv_proj_dim=32),
     torch.float32,
     [(2, 2, 4, 6, 512, "t"), (1, 3, 6, 4, 512, "t")]),
    # Wan 2.1 FLF2V-like: pos_embed over two images' tokens (2 x 9 here)
    ("flf2v", 2501, dict(num_attention_heads=2, attention_head_dim=16, in_channels=12,
                         out_channels=4, text_dim=8, freq_dim=16, ffn_dim=40, image_dim=20,
                         added_kv_proj_dim=32, pos_embed_seq_len=18),
     torch.float32,
     [(2, 2, 6, 4, 512, "t")]),
]

CLIP_TOKENS = 257


LN_DIFFUSERS = normalization.FP32LayerNorm.forward


def ln_in_dtype(self, inputs):
    return F.layer_norm(inputs, self.normalized_shape,
                        self.weight.to(inputs.dtype) if self.weight is not None else None,
                        self.bias.to(inputs.dtype) if self.bias is not None else None, self.eps)


def save(path, a):
    np.save(path, np.ascontiguousarray(a.detach().cpu().to(torch.float64).numpy()
                                       .astype(np.float32)))


def make(out_root, name, seed, over, dtype, cases):
    torch.manual_seed(seed)
    cfg = dict(BASE, **over)
    model = WanTransformer3DModel(**cfg)
    # move every parameter off its init (norm weights would all be 1, biases 0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    d = out_root / name
    if d.exists():
        shutil.rmtree(d)
    (d / "expected").mkdir(parents=True)
    model.to(dtype).save_pretrained(d, safe_serialization=True)
    ref = WanTransformer3DModel.from_pretrained(d, torch_dtype=dtype).to(torch.float64)
    ref.eval()
    # a bf16 checkpoint: also Diffusers' own bf16 run (its fp32 modules kept in
    # fp32, FP32LayerNorm as Diffusers has it), the yardstick of ditd's bf16 table
    own = None
    if dtype == torch.bfloat16:
        own = WanTransformer3DModel.from_pretrained(d, torch_dtype=torch.bfloat16)
        own.eval()
    C, Dt = cfg["in_channels"], cfg["text_dim"]
    listed = []
    g = torch.Generator().manual_seed(seed + 1)
    for i, (B, Fr, h, w, L, kind) in enumerate(cases):
        x = torch.randn(B, C, Fr, h, w, generator=g, dtype=torch.float64).float().double()
        t = (1000 * torch.rand(B, generator=g, dtype=torch.float64)).float().double()
        text = torch.randn(B, L, Dt, generator=g, dtype=torch.float64).float().double()
        seq = Fr * (h // 2) * (w // 2)
        tf = None
        if kind == "t":
            timestep = t
        else:
            # WanImageToVideoPipeline: first_frame_mask (frame 0 at 0) times t, taken at
            # every patch ([:, ::2, ::2]) and flattened; WanPipeline: a mask of ones
            mask = torch.ones(Fr, dtype=torch.float64)
            if kind == "first0":
                mask[0] = 0
            tf = (mask[None, :] * t[:, None]).float().double()  # (B, F)
            timestep = tf[:, :, None].expand(B, Fr, seq // Fr).reshape(B, seq)
        image = None
        img_in = None
        if cfg.get("image_dim"):
            # ditd takes (B, Li, Di); FLF2V's Diffusers input is (2B, Li/2, Di), which
            # WanImageEmbedding views as (B, Li, Di)
            Li = cfg.get("pos_embed_seq_len") or CLIP_TOKENS
            image = torch.randn(B, Li, cfg["image_dim"], generator=g,
                                dtype=torch.float64).float().double()
            img_in = image.reshape(2 * B, Li // 2, -1) if cfg.get("pos_embed_seq_len") else image
        with torch.no_grad():
            o = ref(hidden_states=x, timestep=timestep, encoder_hidden_states=text,
                    encoder_hidden_states_image=img_in, return_dict=False)[0]
        names = {}
        vals = [("x", x), ("t", t), ("text", text), ("out", o)]
        if image is not None:
            vals.append(("image", image))
        if own is not None:
            normalization.FP32LayerNorm.forward = LN_DIFFUSERS
            with torch.no_grad():
                ob = own(hidden_states=x.to(torch.bfloat16), timestep=timestep.float(),
                         encoder_hidden_states=text.to(torch.bfloat16), return_dict=False)[0]
            normalization.FP32LayerNorm.forward = ln_in_dtype
            vals.append(("out_bf16", ob))
        if tf is not None:
            vals.append(("t_frames", tf))
        for key, val in vals:
            names[key] = f"forward{i}_{key}.npy"
            save(d / "expected" / names[key], val)
        listed.append(dict(B=B, frames=Fr, height=h, width=w, text_len=L, timesteps=kind,
                           **names))
    meta = dict(diffusers=diffusers.__version__, torch=torch.__version__,
                compute="float64", checkpoint=str(dtype).replace("torch.", ""),
                config={k: list(v) if isinstance(v, tuple) else v for k, v in cfg.items()},
                forward=listed)
    (d / "expected" / "cases.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(f"{name}: {len(listed)} cases")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args()
    torch.set_num_threads(1)
    normalization.FP32LayerNorm.forward = ln_in_dtype
    for name, seed, over, dtype, cases in CONFIGS:
        make(args.out, name, seed, over, dtype, cases)


if __name__ == "__main__":
    main()
