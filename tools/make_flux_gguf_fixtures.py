#!/usr/bin/env python3
"""Tiny FLUX.1 transformers as GGUF files, the way the shared FLUX GGUFs are
made, and what Diffusers computes with their dequantized weights in float64.

    /root/ditd-venv/bin/python tools/make_flux_gguf_fixtures.py

tests/fixtures/flux_gguf/<name>/ holds config.json, <name>.gguf and expected/
(cases.json + .npy, the layout of tools/make_flux_fixtures.py, read by
tests/flux_case.h):

  q8_0      inner_dim 64, guidance_embeds: every 2-D weight whose rows are
            whole blocks in Q8_0 (gguf.quants.quantize), vectors and the
            x_embedder in F32; FLUX.1's original (BFL) names, as the shared
            conversions keep them (fused qkv, linear1/linear2,
            final_layer.adaLN_modulation in [shift; scale]).
  q8_0-diffusers  the same tensors in Diffusers' names (a GGUF written from a
            Diffusers checkpoint), the same expected outputs.
  q4_k      inner_dim 256 (so that rows are whole 256-value blocks): Q4_K
            weights in BFL names with the "model.diffusion_model." prefix of
            ComfyUI-saved files, ff.net.2 and the text MLP's down projection
            in Q6_K, the single blocks' linear2 in Q5_K (mixed types, as the
            K-quant "mixes" do). The gguf package dequantizes K types but
            does not quantize them: the blocks are made here (a plain
            min/max fit of each 32-value group, 6-bit scales and mins), and
            the reference is gguf.quants.dequantize of those bytes, as for
            every type.

The reference model is Diffusers' FluxTransformer2DModel with the
dequantized weights (mapped to Diffusers' names the way Diffusers'
convert_flux_transformer_checkpoint_to_diffusers does: chunk qkv, split
linear1, swap the final layer's scale and shift), run in float64 on the
inputs of each case; ditd reads the GGUF and must agree within 1e-4.
Deterministic; about 2.5 MB in all.
"""
import json
import shutil
from pathlib import Path

import numpy as np
import torch
import gguf
from gguf import GGMLQuantizationType as T

import diffusers
from diffusers import FluxPipeline, FluxTransformer2DModel

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "tests" / "fixtures" / "flux_gguf"


def pack(x):
    b, c, h, w = x.shape
    x = x.view(b, c, h // 2, 2, w // 2, 2).permute(0, 2, 4, 1, 3, 5)
    return x.reshape(b, (h // 2) * (w // 2), c * 4)


def unpack(x, h, w):
    b, n, c4 = x.shape
    x = x.view(b, h // 2, w // 2, c4 // 4, 2, 2).permute(0, 3, 1, 4, 2, 5)
    return x.reshape(b, c4 // 4, h, w)


# ---- Q4_K / Q5_K / Q6_K blocks (the gguf package only dequantizes them) ----

def _f16(v):
    return np.asarray(v, dtype=np.float32).astype(np.float16)


def _scales_k4(sc, mn):
    """8 6-bit scales and mins (n, 8) -> the 12 packed bytes (n, 12)."""
    s = np.zeros((sc.shape[0], 12), dtype=np.uint8)
    for j in range(4):
        s[:, j] = sc[:, j] | ((sc[:, j + 4] >> 4) << 6)
        s[:, j + 4] = mn[:, j] | ((mn[:, j + 4] >> 4) << 6)
        s[:, j + 8] = (sc[:, j + 4] & 0xF) | ((mn[:, j + 4] & 0xF) << 4)
    return s


def _fit_k(x, qmax):
    """x (n, 256): per 32-group scale/min as 6-bit multiples of fp16 d, dmin."""
    g = x.reshape(-1, 8, 32)
    lo = np.minimum(g.min(-1), 0)
    hi = g.max(-1)
    scale = (hi - lo) / qmax
    d = _f16(scale.max(-1) / 63).astype(np.float32)
    dmin = _f16((-lo).max(-1) / 63).astype(np.float32)
    sd = np.where(d > 0, d, 1)[:, None]
    sm = np.where(dmin > 0, dmin, 1)[:, None]
    sc = np.clip(np.ceil(scale / sd), 0, 63).astype(np.uint8)
    mn = np.clip(np.round(-lo / sm), 0, 63).astype(np.uint8)
    dl = (d[:, None] * sc)[..., None]
    ml = (dmin[:, None] * mn)[..., None]
    q = np.clip(np.round((g + ml) / np.where(dl > 0, dl, 1)), 0, qmax).astype(np.uint8)
    return d, dmin, sc, mn, q  # q (n, 8, 32)


def quant_q4_k(x):
    n = x.size // 256
    d, dmin, sc, mn, q = _fit_k(x.reshape(n, 256), 15)
    qs = np.zeros((n, 128), dtype=np.uint8)
    for gi in range(8):
        qs[:, (gi // 2) * 32:(gi // 2) * 32 + 32] |= q[:, gi] << (4 * (gi % 2))
    return np.concatenate([_f16(d).view(np.uint8).reshape(n, 2),
                           _f16(dmin).view(np.uint8).reshape(n, 2),
                           _scales_k4(sc, mn), qs], axis=1)


def quant_q5_k(x):
    n = x.size // 256
    d, dmin, sc, mn, q = _fit_k(x.reshape(n, 256), 31)
    qs = np.zeros((n, 128), dtype=np.uint8)
    qh = np.zeros((n, 32), dtype=np.uint8)
    for gi in range(8):
        qs[:, (gi // 2) * 32:(gi // 2) * 32 + 32] |= (q[:, gi] & 0xF) << (4 * (gi % 2))
        qh |= ((q[:, gi] >> 4) & 1) << gi
    return np.concatenate([_f16(d).view(np.uint8).reshape(n, 2),
                           _f16(dmin).view(np.uint8).reshape(n, 2),
                           _scales_k4(sc, mn), qh, qs], axis=1)


def quant_q6_k(x):
    n = x.size // 256
    g = x.reshape(n, 16, 16)
    amax = np.abs(g).max(-1)
    scale = amax / 31
    d = _f16(scale.max(-1) / 127).astype(np.float32)
    sd = np.where(d > 0, d, 1)[:, None]
    sc = np.clip(np.round(scale / sd), -128, 127).astype(np.int8)
    dl = (d[:, None] * sc.astype(np.float32))[..., None]
    q = (np.clip(np.round(g / np.where(dl != 0, dl, 1)), -32, 31) + 32).astype(np.uint8)
    q = q.reshape(n, 256)
    ql = np.zeros((n, 128), dtype=np.uint8)
    qh = np.zeros((n, 64), dtype=np.uint8)
    for e in range(256):
        h, r = divmod(e, 128)
        ql[:, h * 64 + r % 64] |= (q[:, e] & 0xF) << (4 * (r // 64))
        qh[:, h * 32 + r % 32] |= (q[:, e] >> 4) << (2 * (r // 32))
    return np.concatenate([ql, qh, sc.view(np.uint8), _f16(d).view(np.uint8).reshape(n, 2)],
                          axis=1)


QUANT = {T.Q8_0: lambda x: gguf.quants.quantize(x, T.Q8_0),
         T.Q4_K: quant_q4_k, T.Q5_K: quant_q5_k, T.Q6_K: quant_q6_k}


# ---- names: Diffusers <-> BFL ----

def to_bfl(sd, D, F, nl, ns):
    """Diffusers' state dict -> FLUX.1's original names (the inverse of
    convert_flux_transformer_checkpoint_to_diffusers)."""
    b = {}
    cat = lambda *ks: np.concatenate([sd[k] for k in ks], axis=0)
    for wb in ("weight", "bias"):
        b[f"time_in.in_layer.{wb}"] = sd[f"time_text_embed.timestep_embedder.linear_1.{wb}"]
        b[f"time_in.out_layer.{wb}"] = sd[f"time_text_embed.timestep_embedder.linear_2.{wb}"]
        b[f"vector_in.in_layer.{wb}"] = sd[f"time_text_embed.text_embedder.linear_1.{wb}"]
        b[f"vector_in.out_layer.{wb}"] = sd[f"time_text_embed.text_embedder.linear_2.{wb}"]
        if f"time_text_embed.guidance_embedder.linear_1.{wb}" in sd:
            b[f"guidance_in.in_layer.{wb}"] = sd[f"time_text_embed.guidance_embedder.linear_1.{wb}"]
            b[f"guidance_in.out_layer.{wb}"] = sd[f"time_text_embed.guidance_embedder.linear_2.{wb}"]
        b[f"txt_in.{wb}"] = sd[f"context_embedder.{wb}"]
        b[f"img_in.{wb}"] = sd[f"x_embedder.{wb}"]
        for i in range(nl):
            p, q = f"transformer_blocks.{i}.", f"double_blocks.{i}."
            b[f"{q}img_mod.lin.{wb}"] = sd[f"{p}norm1.linear.{wb}"]
            b[f"{q}txt_mod.lin.{wb}"] = sd[f"{p}norm1_context.linear.{wb}"]
            b[f"{q}img_attn.qkv.{wb}"] = cat(*(f"{p}attn.to_{c}.{wb}" for c in "qkv"))
            b[f"{q}txt_attn.qkv.{wb}"] = cat(*(f"{p}attn.add_{c}_proj.{wb}" for c in "qkv"))
            b[f"{q}img_mlp.0.{wb}"] = sd[f"{p}ff.net.0.proj.{wb}"]
            b[f"{q}img_mlp.2.{wb}"] = sd[f"{p}ff.net.2.{wb}"]
            b[f"{q}txt_mlp.0.{wb}"] = sd[f"{p}ff_context.net.0.proj.{wb}"]
            b[f"{q}txt_mlp.2.{wb}"] = sd[f"{p}ff_context.net.2.{wb}"]
            b[f"{q}img_attn.proj.{wb}"] = sd[f"{p}attn.to_out.0.{wb}"]
            b[f"{q}txt_attn.proj.{wb}"] = sd[f"{p}attn.to_add_out.{wb}"]
        for i in range(ns):
            p, q = f"single_transformer_blocks.{i}.", f"single_blocks.{i}."
            b[f"{q}modulation.lin.{wb}"] = sd[f"{p}norm.linear.{wb}"]
            b[f"{q}linear1.{wb}"] = cat(f"{p}attn.to_q.{wb}", f"{p}attn.to_k.{wb}",
                                        f"{p}attn.to_v.{wb}", f"{p}proj_mlp.{wb}")
            b[f"{q}linear2.{wb}"] = sd[f"{p}proj_out.{wb}"]
        b[f"final_layer.linear.{wb}"] = sd[f"proj_out.{wb}"]
        scale, shift = np.split(sd[f"norm_out.linear.{wb}"], 2, axis=0)
        b[f"final_layer.adaLN_modulation.1.{wb}"] = np.concatenate([shift, scale], axis=0)
    for i in range(nl):
        p, q = f"transformer_blocks.{i}.attn.", f"double_blocks.{i}."
        b[f"{q}img_attn.norm.query_norm.scale"] = sd[f"{p}norm_q.weight"]
        b[f"{q}img_attn.norm.key_norm.scale"] = sd[f"{p}norm_k.weight"]
        b[f"{q}txt_attn.norm.query_norm.scale"] = sd[f"{p}norm_added_q.weight"]
        b[f"{q}txt_attn.norm.key_norm.scale"] = sd[f"{p}norm_added_k.weight"]
    for i in range(ns):
        p, q = f"single_transformer_blocks.{i}.attn.", f"single_blocks.{i}."
        b[f"{q}norm.query_norm.scale"] = sd[f"{p}norm_q.weight"]
        b[f"{q}norm.key_norm.scale"] = sd[f"{p}norm_k.weight"]
    assert sum(v.size for v in b.values()) == sum(v.size for v in sd.values())
    return b


def from_bfl(b, D, F, nl, ns):
    """FLUX.1's names -> Diffusers', as convert_flux_transformer_checkpoint_to_diffusers
    (with this model's inner_dim and mlp_dim instead of its fixed 3072)."""
    sd = {}
    for wb in ("weight", "bias"):
        sd[f"time_text_embed.timestep_embedder.linear_1.{wb}"] = b[f"time_in.in_layer.{wb}"]
        sd[f"time_text_embed.timestep_embedder.linear_2.{wb}"] = b[f"time_in.out_layer.{wb}"]
        sd[f"time_text_embed.text_embedder.linear_1.{wb}"] = b[f"vector_in.in_layer.{wb}"]
        sd[f"time_text_embed.text_embedder.linear_2.{wb}"] = b[f"vector_in.out_layer.{wb}"]
        if f"guidance_in.in_layer.{wb}" in b:
            sd[f"time_text_embed.guidance_embedder.linear_1.{wb}"] = b[f"guidance_in.in_layer.{wb}"]
            sd[f"time_text_embed.guidance_embedder.linear_2.{wb}"] = b[f"guidance_in.out_layer.{wb}"]
        sd[f"context_embedder.{wb}"] = b[f"txt_in.{wb}"]
        sd[f"x_embedder.{wb}"] = b[f"img_in.{wb}"]
        for i in range(nl):
            p, q = f"transformer_blocks.{i}.", f"double_blocks.{i}."
            sd[f"{p}norm1.linear.{wb}"] = b[f"{q}img_mod.lin.{wb}"]
            sd[f"{p}norm1_context.linear.{wb}"] = b[f"{q}txt_mod.lin.{wb}"]
            for c, part in zip("qkv", np.split(b[f"{q}img_attn.qkv.{wb}"], 3, axis=0)):
                sd[f"{p}attn.to_{c}.{wb}"] = part
            for c, part in zip("qkv", np.split(b[f"{q}txt_attn.qkv.{wb}"], 3, axis=0)):
                sd[f"{p}attn.add_{c}_proj.{wb}"] = part
            sd[f"{p}ff.net.0.proj.{wb}"] = b[f"{q}img_mlp.0.{wb}"]
            sd[f"{p}ff.net.2.{wb}"] = b[f"{q}img_mlp.2.{wb}"]
            sd[f"{p}ff_context.net.0.proj.{wb}"] = b[f"{q}txt_mlp.0.{wb}"]
            sd[f"{p}ff_context.net.2.{wb}"] = b[f"{q}txt_mlp.2.{wb}"]
            sd[f"{p}attn.to_out.0.{wb}"] = b[f"{q}img_attn.proj.{wb}"]
            sd[f"{p}attn.to_add_out.{wb}"] = b[f"{q}txt_attn.proj.{wb}"]
        for i in range(ns):
            p, q = f"single_transformer_blocks.{i}.", f"single_blocks.{i}."
            sd[f"{p}norm.linear.{wb}"] = b[f"{q}modulation.lin.{wb}"]
            qq, kk, vv, mlp = np.split(b[f"{q}linear1.{wb}"], [D, 2 * D, 3 * D], axis=0)
            sd[f"{p}attn.to_q.{wb}"], sd[f"{p}attn.to_k.{wb}"] = qq, kk
            sd[f"{p}attn.to_v.{wb}"], sd[f"{p}proj_mlp.{wb}"] = vv, mlp
            sd[f"{p}proj_out.{wb}"] = b[f"{q}linear2.{wb}"]
        sd[f"proj_out.{wb}"] = b[f"final_layer.linear.{wb}"]
        shift, scale = np.split(b[f"final_layer.adaLN_modulation.1.{wb}"], 2, axis=0)
        sd[f"norm_out.linear.{wb}"] = np.concatenate([scale, shift], axis=0)
    for i in range(nl):
        p, q = f"transformer_blocks.{i}.attn.", f"double_blocks.{i}."
        sd[f"{p}norm_q.weight"] = b[f"{q}img_attn.norm.query_norm.scale"]
        sd[f"{p}norm_k.weight"] = b[f"{q}img_attn.norm.key_norm.scale"]
        sd[f"{p}norm_added_q.weight"] = b[f"{q}txt_attn.norm.query_norm.scale"]
        sd[f"{p}norm_added_k.weight"] = b[f"{q}txt_attn.norm.key_norm.scale"]
    for i in range(ns):
        p, q = f"single_transformer_blocks.{i}.attn.", f"single_blocks.{i}."
        sd[f"{p}norm_q.weight"] = b[f"{q}norm.query_norm.scale"]
        sd[f"{p}norm_k.weight"] = b[f"{q}norm.key_norm.scale"]
    return sd


# ---- the fixtures ----

def qtype_of(name, arr, default):
    """Which type a tensor is stored in: 2-D weights whose rows are whole
    blocks quantized (the x_embedder stays F32: ditd reads it as a conv)."""
    if arr.ndim != 2 or name.startswith(("img_in", "x_embedder", "model.diffusion_model.img_in")):
        return T.F32
    qt = default
    if default == T.Q4_K:
        if "mlp.2." in name or "ff.net.2." in name or "ff_context.net.2." in name:
            qt = T.Q6_K
        elif "linear2" in name or ".proj_out." in name:
            qt = T.Q5_K
    block = gguf.constants.GGML_QUANT_SIZES[qt][0]
    return qt if arr.shape[1] % block == 0 else T.F32


def write_gguf(path, tensors, default, prefix=""):
    """tensors: name -> float32 array. Returns name -> the dequantized values."""
    w = gguf.GGUFWriter(str(path), arch="flux")
    deq = {}
    for name in sorted(tensors):
        a = np.ascontiguousarray(tensors[name], dtype=np.float32)
        qt = qtype_of(prefix + name, a, default)
        if qt == T.F32:
            w.add_tensor(prefix + name, a)
            deq[name] = a
        else:
            q = QUANT[qt](a)
            w.add_tensor(prefix + name, q.reshape(a.shape[0], -1), raw_dtype=qt)
            deq[name] = gguf.quants.dequantize(q.reshape(a.shape[0], -1), qt).astype(np.float32)
            assert deq[name].shape == a.shape, name
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return deq


def make(name, seed, cfg, default, cases, names="bfl", prefix="", same_as=None):
    torch.manual_seed(seed)
    model = FluxTransformer2DModel(**cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    D = cfg["num_attention_heads"] * cfg["attention_head_dim"]
    F, nl, ns = 4 * D, cfg["num_layers"], cfg["num_single_layers"]
    bfl = to_bfl(sd, D, F, nl, ns)
    back = from_bfl(bfl, D, F, nl, ns)
    assert all(np.array_equal(back[k], sd[k]) for k in sd) and len(back) == len(sd)
    d = OUT / name
    if d.exists():
        shutil.rmtree(d)
    (d / "expected").mkdir(parents=True)
    (d / "config.json").write_text(json.dumps(dict(_class_name="FluxTransformer2DModel",
                                                   _diffusers_version=diffusers.__version__,
                                                   out_channels=None, **cfg), indent=2) + "\n")
    if names == "bfl":
        deq = from_bfl(write_gguf(d / f"{name}.gguf", bfl, default, prefix), D, F, nl, ns)
    else:
        deq = write_gguf(d / f"{name}.gguf", sd, default, prefix)
    if same_as:  # the same weights in other names: the same expected outputs
        shutil.rmtree(d / "expected")
        shutil.copytree(OUT / same_as / "expected", d / "expected")
        return deq
    write_expected(d, cfg, deq, cases, seed, f"{name}.gguf dequantized by gguf {gguf.__name__}")
    return deq


def write_expected(d, cfg, deq, cases, seed, weights):
    """Diffusers' FluxTransformer2DModel in float64 on the dequantized
    weights `deq` (Diffusers' names), on random inputs of each case (B, h,
    w, text_len): d/expected/ as tests/flux_case.h reads it."""
    ref = FluxTransformer2DModel(**cfg).to(torch.float64)
    ref.load_state_dict({k: torch.from_numpy(v).double() for k, v in deq.items()})
    ref.eval()
    C = cfg["in_channels"] // 4
    g = torch.Generator().manual_seed(seed + 1)
    listed = []
    for i, (B, h, w, L) in enumerate(cases):
        x = torch.randn(B, C, h, w, generator=g, dtype=torch.float64).float().double()
        t = (torch.rand(B, generator=g, dtype=torch.float64) * 1000).float().double()
        text = torch.randn(B, L, cfg["joint_attention_dim"], generator=g,
                           dtype=torch.float64).float().double()
        pooled = torch.randn(B, cfg["pooled_projection_dim"], generator=g,
                             dtype=torch.float64).float().double()
        guidance = (1 + 4 * torch.rand(B, generator=g, dtype=torch.float64)).float().double()
        img_ids = FluxPipeline._prepare_latent_image_ids(B, h // 2, w // 2, "cpu", torch.float64)
        txt_ids = torch.zeros(L, 3, dtype=torch.float64)
        with torch.no_grad():
            o = ref(hidden_states=pack(x), encoder_hidden_states=text, pooled_projections=pooled,
                    timestep=t / 1000, img_ids=img_ids, txt_ids=txt_ids,
                    guidance=guidance if cfg["guidance_embeds"] else None, return_dict=False)[0]
        out = unpack(o, h, w)
        files = {}
        for key, val in (("x", x), ("t", t), ("text", text), ("pooled", pooled),
                         ("guidance", guidance), ("out", out)):
            files[key] = f"forward{i}_{key}.npy"
            np.save(d / "expected" / files[key], val.numpy().astype(np.float32))
        listed.append(dict(B=B, height=h, width=w, text_len=L, **files))
    meta = dict(diffusers=diffusers.__version__, torch=torch.__version__, compute="float64",
                weights=weights, config=cfg, forward=listed)
    (d / "expected" / "cases.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(f"{d.name}: {len(listed)} cases")


def main():
    torch.set_num_threads(2)
    small = dict(patch_size=1, in_channels=16, num_layers=1, num_single_layers=2,
                 attention_head_dim=32, num_attention_heads=2, joint_attention_dim=64,
                 pooled_projection_dim=64, guidance_embeds=True, axes_dims_rope=[8, 12, 12])
    make("q8_0", 2501, small, T.Q8_0, [(1, 8, 8, 6), (2, 6, 4, 5)])
    make("q8_0-diffusers", 2501, small, T.Q8_0, [], names="diffusers", same_as="q8_0")
    big = dict(patch_size=1, in_channels=64, num_layers=1, num_single_layers=1,
               attention_head_dim=128, num_attention_heads=2, joint_attention_dim=256,
               pooled_projection_dim=256, guidance_embeds=False, axes_dims_rope=[16, 56, 56])
    make("q4_k", 2502, big, T.Q4_K, [(1, 8, 8, 7)], prefix="model.diffusion_model.")


if __name__ == "__main__":
    main()
