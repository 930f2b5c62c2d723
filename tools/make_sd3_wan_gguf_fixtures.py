#!/usr/bin/env python3
"""Tiny SD3.5 and Wan transformers as GGUF files in their original key
names, the way the shared conversions store them, and what Diffusers
computes with their dequantized weights in float64.

    /root/ditd-venv/bin/python tools/make_sd3_wan_gguf_fixtures.py

tests/fixtures/sd3wan_gguf/<name>/ holds config.json, <name>.gguf and
expected/ (cases.json + .npy in the layouts of tools/make_sd3_fixtures.py
and tools/make_wan_fixtures.py, read by tests/sd3_case.h / tests/wan_case.h):

  sd35-q8_0   SD3Transformer2DModel, 2 heads of 32 (inner 64), 2 blocks, the
              first with MMDiT-X's attn2, QK norms: every 2-D weight in Q8_0
              (every row is whole 32-value blocks in this config), vectors,
              the patch conv and the positional table in F32; SD3's original
              (MMDiT) names with ComfyUI's "model.diffusion_model." prefix
              (fused qkv, the last block's context adaLN and the final layer's
              adaLN in [shift; scale]).
  sd35-q8_0-diffusers  the same tensors in Diffusers' names, the same outputs.
  wan-q8_0    WanTransformer3DModel, 2 heads of 32, 2 blocks: Q8_0 as above,
              Wan's original names (self_attn.q, cross_attn.o, ffn.0,
              modulation, head.head, norm3 ...), no prefix.
  wan-q8_0-diffusers  the same tensors in Diffusers' names.
  wan-q4_k    2 heads of 128 (inner 256: the K types need K % 256 == 0), 1 block,
              freq_dim 256: Q4_K, the FFN's down projection in Q6_K and the
              attentions' output projections in Q5_K (a K-quant "mix"); the
              text embedder's first linear (K = 24) in F32; original names with
              the prefix. The gguf package dequantizes K types but does not
              quantize them: the blocks are made by
              tools/make_flux_gguf_fixtures.py's min/max fit, and the reference
              is gguf.quants.dequantize of those bytes, as for every type.

  pipeline/sd35-orig-f16.gguf, pipeline/wan21-orig-f32.gguf  the transformers of
              the SD3.5 and Wan 2.1 pipeline fixtures (tests/fixtures/sd3_pipeline/sd35,
              tests/fixtures/wan_pipeline/wan21) in their original names, each
              tensor in the checkpoint's own dtype (F16, F32): the same numbers,
              so those pipelines' Diffusers references hold for `ditd generate
              --transformer-file` (tests/cli/sd3_wan_gguf_generate.py).
  pipeline/wan-i2v21-orig-f32.gguf  the Wan 2.1 I2V-like fixture (tests/fixtures/wan/i2v21:
              the image branch, img_emb.proj.*, k_img / v_img / norm_k_img) the same
              way, judged by that fixture's own references (test_sd3wan_gguf).

The original names are made from Diffusers' state dict by the inverse of
Diffusers' own single-file conversion, and checked: Diffusers'
convert_sd3_transformer_checkpoint_to_diffusers /
convert_wan_transformer_to_diffusers must give the state dict back exactly.
The reference model takes the dequantized file through that same
conversion, then runs in float64; ditd reads the GGUF and must agree within
1e-4. Deterministic; about 2.2 MB in all.
"""
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import torch
import gguf
from gguf import GGMLQuantizationType as T

import diffusers
from diffusers import SD3Transformer2DModel, WanTransformer3DModel
from diffusers.loaders.single_file_utils import (convert_sd3_transformer_checkpoint_to_diffusers,
                                                 convert_wan_transformer_to_diffusers)

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "tests" / "fixtures" / "sd3wan_gguf"
sys.path.insert(0, str(REPO / "tools"))
from make_flux_gguf_fixtures import QUANT  # noqa: E402  (Q8_0 and the K-type block makers)

PREFIX = "model.diffusion_model."


# ---- names: Diffusers -> original (the inverse of Diffusers' conversions) ----

def sd3_to_orig(sd, nl):
    o = {}
    cat = lambda *ks: np.concatenate([sd[k] for k in ks], axis=0)
    swap = lambda a: np.concatenate(np.split(a, 2, axis=0)[::-1], axis=0)
    if "pos_embed.pos_embed" in sd:
        o["pos_embed"] = sd["pos_embed.pos_embed"]
    for wb in ("weight", "bias"):
        o[f"x_embedder.proj.{wb}"] = sd[f"pos_embed.proj.{wb}"]
        o[f"t_embedder.mlp.0.{wb}"] = sd[f"time_text_embed.timestep_embedder.linear_1.{wb}"]
        o[f"t_embedder.mlp.2.{wb}"] = sd[f"time_text_embed.timestep_embedder.linear_2.{wb}"]
        o[f"context_embedder.{wb}"] = sd[f"context_embedder.{wb}"]
        o[f"y_embedder.mlp.0.{wb}"] = sd[f"time_text_embed.text_embedder.linear_1.{wb}"]
        o[f"y_embedder.mlp.2.{wb}"] = sd[f"time_text_embed.text_embedder.linear_2.{wb}"]
        for i in range(nl):
            p, x, c = f"transformer_blocks.{i}.", f"joint_blocks.{i}.x_block.", \
                f"joint_blocks.{i}.context_block."
            last = i == nl - 1
            o[f"{x}attn.qkv.{wb}"] = cat(*(f"{p}attn.to_{k}.{wb}" for k in "qkv"))
            o[f"{c}attn.qkv.{wb}"] = cat(*(f"{p}attn.add_{k}_proj.{wb}" for k in "qkv"))
            o[f"{x}attn.proj.{wb}"] = sd[f"{p}attn.to_out.0.{wb}"]
            if not last:
                o[f"{c}attn.proj.{wb}"] = sd[f"{p}attn.to_add_out.{wb}"]
            if f"{p}attn2.to_q.{wb}" in sd:
                o[f"{x}attn2.qkv.{wb}"] = cat(*(f"{p}attn2.to_{k}.{wb}" for k in "qkv"))
                o[f"{x}attn2.proj.{wb}"] = sd[f"{p}attn2.to_out.0.{wb}"]
            o[f"{x}adaLN_modulation.1.{wb}"] = sd[f"{p}norm1.linear.{wb}"]
            ctx = sd[f"{p}norm1_context.linear.{wb}"]
            o[f"{c}adaLN_modulation.1.{wb}"] = swap(ctx) if last else ctx
            o[f"{x}mlp.fc1.{wb}"] = sd[f"{p}ff.net.0.proj.{wb}"]
            o[f"{x}mlp.fc2.{wb}"] = sd[f"{p}ff.net.2.{wb}"]
            if not last:
                o[f"{c}mlp.fc1.{wb}"] = sd[f"{p}ff_context.net.0.proj.{wb}"]
                o[f"{c}mlp.fc2.{wb}"] = sd[f"{p}ff_context.net.2.{wb}"]
        o[f"final_layer.linear.{wb}"] = sd[f"proj_out.{wb}"]
        o[f"final_layer.adaLN_modulation.1.{wb}"] = swap(sd[f"norm_out.linear.{wb}"])
    for i in range(nl):
        p, x, c = f"transformer_blocks.{i}.", f"joint_blocks.{i}.x_block.", \
            f"joint_blocks.{i}.context_block."
        if f"{p}attn.norm_q.weight" in sd:
            o[f"{x}attn.ln_q.weight"] = sd[f"{p}attn.norm_q.weight"]
            o[f"{x}attn.ln_k.weight"] = sd[f"{p}attn.norm_k.weight"]
            o[f"{c}attn.ln_q.weight"] = sd[f"{p}attn.norm_added_q.weight"]
            o[f"{c}attn.ln_k.weight"] = sd[f"{p}attn.norm_added_k.weight"]
        if f"{p}attn2.norm_q.weight" in sd:
            o[f"{x}attn2.ln_q.weight"] = sd[f"{p}attn2.norm_q.weight"]
            o[f"{x}attn2.ln_k.weight"] = sd[f"{p}attn2.norm_k.weight"]
    assert sum(v.size for v in o.values()) == sum(v.size for v in sd.values())
    return o


WAN_INV = [  # Diffusers -> original, applied in order
    ("condition_embedder.time_embedder.linear_1", "time_embedding.0"),
    ("condition_embedder.time_embedder.linear_2", "time_embedding.2"),
    ("condition_embedder.text_embedder.linear_1", "text_embedding.0"),
    ("condition_embedder.text_embedder.linear_2", "text_embedding.2"),
    ("condition_embedder.time_proj", "time_projection.1"),
    (".attn1.", ".self_attn."), (".attn2.", ".cross_attn."),
    (".to_out.0.", ".o."), (".to_q.", ".q."), (".to_k.", ".k."), (".to_v.", ".v."),
    (".add_k_proj.", ".k_img."), (".add_v_proj.", ".v_img."), (".norm_added_k.", ".norm_k_img."),
    ("ffn.net.0.proj", "ffn.0"), ("ffn.net.2", "ffn.2"),
    (".norm2.", ".norm3."),
]


def wan_to_orig(sd):
    o = {}
    for k, v in sd.items():
        n = k
        if n == "scale_shift_table":
            n = "head.modulation"
        elif n.startswith("proj_out."):
            n = "head.head." + n[len("proj_out."):]
        n = n.replace(".scale_shift_table", ".modulation")
        for a, b in WAN_INV:
            n = n.replace(a, b)
        o[n] = v
    return o


def to_diffusers(orig, family):
    """Diffusers' own conversion of an original-named dict (numpy in and out)."""
    ck = {k: torch.from_numpy(np.array(v)) for k, v in orig.items()}
    conv = (convert_sd3_transformer_checkpoint_to_diffusers if family == "sd3"
            else convert_wan_transformer_to_diffusers)(ck)
    return {k: v.numpy() for k, v in conv.items()}


# ---- GGUF ----

def qtype_of(name, arr, default):
    """2-D weights whose rows are whole blocks quantized; the rest F32."""
    if arr.ndim != 2:
        return T.F32
    qt = default
    if default == T.Q4_K:
        if ".ffn.2." in name or ".ffn.net.2." in name:
            qt = T.Q6_K
        elif ".o." in name or ".to_out.0." in name:
            qt = T.Q5_K
    block = gguf.constants.GGML_QUANT_SIZES[qt][0]
    return qt if arr.shape[1] % block == 0 else T.F32


def write_gguf(path, tensors, default, prefix, arch):
    """tensors: name -> float32 array. Returns name -> the dequantized values."""
    w = gguf.GGUFWriter(str(path), arch=arch)
    deq = {}
    for name in sorted(tensors):
        a = np.ascontiguousarray(tensors[name], dtype=np.float32)
        qt = qtype_of(name, a, default)
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


def save(path, a):
    np.save(path, np.ascontiguousarray(a.detach().cpu().to(torch.float64).numpy()
                                       .astype(np.float32)))


def make(family, name, seed, cfg, default, cases, names="orig", prefix="", same_as=None):
    torch.manual_seed(seed)
    Model = SD3Transformer2DModel if family == "sd3" else WanTransformer3DModel
    model = Model(**cfg)
    with torch.no_grad():  # every parameter off its init (norm weights would be 1)
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    orig = sd3_to_orig(sd, cfg["num_layers"]) if family == "sd3" else wan_to_orig(sd)
    back = to_diffusers(orig, family)  # the inverse is exact by Diffusers' own map
    assert sorted(back) == sorted(sd), sorted(set(back) ^ set(sd))
    assert all(np.array_equal(back[k], sd[k]) for k in sd)
    d = OUT / name
    if d.exists():
        shutil.rmtree(d)
    (d / "expected").mkdir(parents=True)
    cj = dict(cfg)
    if "dual_attention_layers" in cj:
        cj["dual_attention_layers"] = list(cj["dual_attention_layers"])
    if "patch_size" in cj and family == "wan":
        cj["patch_size"] = list(cj["patch_size"])
    (d / "config.json").write_text(json.dumps(dict(_class_name=Model.__name__,
                                                   _diffusers_version=diffusers.__version__,
                                                   **cj), indent=2) + "\n")
    arch = "sd3" if family == "sd3" else "wan"
    if names == "orig":
        deq = to_diffusers(write_gguf(d / f"{name}.gguf", orig, default, prefix, arch), family)
    else:
        deq = write_gguf(d / f"{name}.gguf", sd, default, prefix, arch)
    if same_as:  # the same weights in other names: the same expected outputs
        shutil.rmtree(d / "expected")
        shutil.copytree(OUT / same_as / "expected", d / "expected")
        return
    ref = Model(**cfg).to(torch.float64)
    ref.load_state_dict({k: torch.from_numpy(v).double() for k, v in deq.items()}, strict=True)
    ref.eval()
    g = torch.Generator().manual_seed(seed + 1)
    listed = []
    for i, case in enumerate(cases):
        files = {}
        if family == "sd3":
            B, h, w, L, skip = case
            x = torch.randn(B, cfg["in_channels"], h, w, generator=g,
                            dtype=torch.float64).float().double()
            t = (torch.rand(B, generator=g, dtype=torch.float64) * 1000).float().double()
            text = torch.randn(B, L, cfg["joint_attention_dim"], generator=g,
                               dtype=torch.float64).float().double()
            pooled = torch.randn(B, cfg["pooled_projection_dim"], generator=g,
                                 dtype=torch.float64).float().double()
            with torch.no_grad():
                out = ref(hidden_states=x, encoder_hidden_states=text, pooled_projections=pooled,
                          timestep=t, skip_layers=skip or None, return_dict=False)[0]
            vals = (("x", x), ("t", t), ("text", text), ("pooled", pooled), ("out", out))
            entry = dict(B=B, height=h, width=w, text_len=L, skip_layers=skip)
        else:
            B, Fr, h, w, L = case
            x = torch.randn(B, cfg["in_channels"], Fr, h, w, generator=g,
                            dtype=torch.float64).float().double()
            t = (1000 * torch.rand(B, generator=g, dtype=torch.float64)).float().double()
            text = torch.randn(B, L, cfg["text_dim"], generator=g,
                               dtype=torch.float64).float().double()
            with torch.no_grad():
                out = ref(hidden_states=x, timestep=t, encoder_hidden_states=text,
                          return_dict=False)[0]
            vals = (("x", x), ("t", t), ("text", text), ("out", out))
            entry = dict(B=B, frames=Fr, height=h, width=w, text_len=L)
        for key, val in vals:
            files[key] = f"forward{i}_{key}.npy"
            save(d / "expected" / files[key], val)
        listed.append(dict(entry, **files))
    meta = dict(diffusers=diffusers.__version__, torch=torch.__version__, compute="float64",
                weights=f"{name}.gguf dequantized by gguf, mapped by Diffusers' conversion",
                config=cj, forward=listed)
    (d / "expected" / "cases.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(f"{name}: {len(listed)} cases")


def pipeline_copies():
    from safetensors.numpy import load_file
    (OUT / "pipeline").mkdir(parents=True, exist_ok=True)
    for family, src, name in (
            ("sd3", REPO / "tests/fixtures/sd3_pipeline/sd35/transformer", "sd35-orig-f16.gguf"),
            ("wan", REPO / "tests/fixtures/wan_pipeline/wan21/transformer", "wan21-orig-f32.gguf"),
            ("wan", REPO / "tests/fixtures/wan/i2v21", "wan-i2v21-orig-f32.gguf")):
        sd = load_file(str(src / "diffusion_pytorch_model.safetensors"))
        nl = json.loads((src / "config.json").read_text())["num_layers"]
        orig = sd3_to_orig(sd, nl) if family == "sd3" else wan_to_orig(sd)
        back = to_diffusers(orig, family)
        assert sorted(back) == sorted(sd) and all(np.array_equal(back[k], sd[k]) for k in sd)
        w = gguf.GGUFWriter(str(OUT / "pipeline" / name), arch=family)
        for k in sorted(orig):
            w.add_tensor(k, np.ascontiguousarray(orig[k]))  # its own dtype: F16 or F32
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        print(f"pipeline/{name}: {len(orig)} tensors")


def main():
    torch.set_num_threads(2)
    pipeline_copies()
    sd35 = dict(sample_size=8, patch_size=2, in_channels=4, out_channels=4, attention_head_dim=32,
                num_attention_heads=2, joint_attention_dim=32, caption_projection_dim=64,
                pooled_projection_dim=32, pos_embed_max_size=6, num_layers=2,
                qk_norm="rms_norm", dual_attention_layers=(0,))
    make("sd3", "sd35-q8_0", 3501, sd35, T.Q8_0, [(1, 8, 8, 7, []), (2, 6, 10, 5, [1])],
         prefix=PREFIX)
    make("sd3", "sd35-q8_0-diffusers", 3501, sd35, T.Q8_0, [], names="diffusers",
         same_as="sd35-q8_0")
    wan = dict(patch_size=(1, 2, 2), num_layers=2, cross_attn_norm=True,
               qk_norm="rms_norm_across_heads", eps=1e-6, rope_max_seq_len=32,
               num_attention_heads=2, attention_head_dim=32, in_channels=4, out_channels=4,
               text_dim=32, freq_dim=32, ffn_dim=128)
    make("wan", "wan-q8_0", 2601, wan, T.Q8_0, [(1, 2, 6, 6, 5), (2, 1, 4, 6, 4)])
    make("wan", "wan-q8_0-diffusers", 2601, wan, T.Q8_0, [], names="diffusers",
         same_as="wan-q8_0")
    big = dict(wan, num_layers=1, attention_head_dim=128, text_dim=24, freq_dim=256, ffn_dim=256)
    make("wan", "wan-q4_k", 2602, big, T.Q4_K, [(1, 2, 4, 4, 5)], prefix=PREFIX)


if __name__ == "__main__":
    main()
