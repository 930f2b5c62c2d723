#!/usr/bin/env python3
"""Reference fixtures for the community FLUX LoRA formats
(engine/models/lora_convert.c, docs/lora.md "Formats").

What it is: tiny random adapters for the tiny FLUX.1-dev folder
(tests/fixtures/flux_pipeline/dev: 2 double blocks, 1 single block, inner
dim 32, MLP 128) written in the community formats, and the final latents
Diffusers 0.42 gives with them in float64 through
FluxPipeline.load_lora_weights(state_dict) + set_adapters(names,
adapter_weights=...), the prompt embeddings given as
tools/make_lora_fixtures.py runs the pipeline:

  kohya-bfl  lora_unet_<BFL module, '.' as '_'>.lora_down / .lora_up / .alpha
             (every BFL module, alphas != rank; Diffusers'
             _convert_kohya_flux_lora_to_diffusers);
  bfl        diffusion_model.<BFL module>.lora_down / .lora_up / .alpha
             (ComfyUI; the same converter after its 'diffusion_model.' ->
             'lora_unet_' rename), and diffusion_model.<BFL>.lora_A / .lora_B
             (which Diffusers 0.42 does not convert: its reference is the
             same tensors under the lora_down names);
  xlabs      [diffusion_model.]double_blocks.<i>.processor.qkv_lora1.down.weight
             ... (_convert_xlabs_flux_lora_to_diffusers);
  ai-toolkit transformer.<Diffusers module>.lora_A / .lora_B (Diffusers' own
             names; ditd reads it as peft), here on x_embedder, the final
             proj_out and norm_out.linear too.

Two departures from a plain load_lora_weights(file), both stated in the
cases: (1) Diffusers' kohya converter hard-codes FLUX.1's sizes for a single
block's linear1 split (dims=[3072, 3072, 3072, 12288]); on the tiny model the
converter runs with the tiny sizes put in that one place (the source patched
by text, the rest of it as shipped). (2) That converter writes the modules
outside the blocks (img_in, txt_in, time_in, vector_in, guidance_in,
final_layer) without the 'transformer.' prefix, so load_lora_weights then
drops them (checked below: those modules get no LoRA layer); ditd applies
them as lora_state_dict maps them, so for a file with them the reference is
FluxPipeline.lora_state_dict(file) with the prefix added, then
load_lora_weights of that.

Writes tests/fixtures/lora_formats/: cases.json, the adapters
(*.safetensors) and <case>_out.npy (float64). The noise and the prompt
embeddings are the FLUX pipeline fixture's (dev_64_default).

Run with the project's virtualenv:
  /root/ditd-venv/bin/python tools/make_lora_format_fixtures.py
The C test (tests/golden/test_lora_formats.c) reads the files, never Python.
"""
import inspect
import json
import sys
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

import diffusers
import diffusers.loaders.lora_conversion_utils as lcu
import diffusers.loaders.lora_pipeline as lpipe

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tools"))
import make_lora_fixtures as mlf  # noqa: E402  (flux_pipe, linear_shapes, flux_linears)

OUT = REPO / "tests" / "fixtures" / "lora_formats"
EXP = mlf.FLUXDIR / "expected"
FCASE = "dev_64_default"

assert diffusers.__version__ == "0.42.1", diffusers.__version__


def patch_kohya_dims(D, FF):
    """Diffusers' kohya FLUX converter with the tiny model's linear1 split
    sizes in place of FLUX.1's (the one hard-coded size in it)."""
    src = inspect.getsource(lcu._convert_kohya_flux_lora_to_diffusers)
    old = "dims=[3072, 3072, 3072, 12288]"
    assert src.count(old) == 1, "the converter changed: look again"
    src = src.replace(old, f"dims=[{D}, {D}, {D}, {FF}]")
    ns = {}
    exec(compile(src, lcu.__file__, "exec"), lcu.__dict__, ns)
    lpipe._convert_kohya_flux_lora_to_diffusers = ns["_convert_kohya_flux_lora_to_diffusers"]


# ------------------------------------------------------- BFL module names ---

def bfl_modules(tr):
    """[(BFL module name, [Diffusers targets])], the mapping Diffusers'
    converters use (the single block's linear1 is q|k|v|mlp)."""
    c = tr.config
    out = []
    for i in range(c.num_layers):
        p = f"transformer_blocks.{i}."
        q = f"double_blocks.{i}."
        out += [(q + "img_attn.qkv", [p + "attn.to_q", p + "attn.to_k", p + "attn.to_v"]),
                (q + "img_attn.proj", [p + "attn.to_out.0"]),
                (q + "img_mlp.0", [p + "ff.net.0.proj"]), (q + "img_mlp.2", [p + "ff.net.2"]),
                (q + "img_mod.lin", [p + "norm1.linear"]),
                (q + "txt_attn.qkv", [p + "attn.add_q_proj", p + "attn.add_k_proj",
                                      p + "attn.add_v_proj"]),
                (q + "txt_attn.proj", [p + "attn.to_add_out"]),
                (q + "txt_mlp.0", [p + "ff_context.net.0.proj"]),
                (q + "txt_mlp.2", [p + "ff_context.net.2"]),
                (q + "txt_mod.lin", [p + "norm1_context.linear"])]
    for i in range(c.num_single_layers):
        p = f"single_transformer_blocks.{i}."
        q = f"single_blocks.{i}."
        out += [(q + "linear1", [p + "attn.to_q", p + "attn.to_k", p + "attn.to_v",
                                 p + "proj_mlp"]),
                (q + "linear2", [p + "proj_out"]), (q + "modulation.lin", [p + "norm.linear"])]
    out += [("img_in", ["x_embedder"]), ("txt_in", ["context_embedder"]),
            ("time_in.in_layer", ["time_text_embed.timestep_embedder.linear_1"]),
            ("time_in.out_layer", ["time_text_embed.timestep_embedder.linear_2"]),
            ("vector_in.in_layer", ["time_text_embed.text_embedder.linear_1"]),
            ("vector_in.out_layer", ["time_text_embed.text_embedder.linear_2"]),
            ("guidance_in.in_layer", ["time_text_embed.guidance_embedder.linear_1"]),
            ("guidance_in.out_layer", ["time_text_embed.guidance_embedder.linear_2"]),
            ("final_layer.adaLN_modulation.1", ["norm_out.linear"]),
            ("final_layer.linear", ["proj_out"])]
    return out


def fused_shape(tr, targets):
    outs = [tr.get_submodule(t).out_features for t in targets]
    k = tr.get_submodule(targets[0]).in_features
    return sum(outs), k, outs


def rand_ab(rng, n_out, k_in, rank, dtype, sparse_parts=None):
    """A (rank, k_in), B (n_out, rank), rounded to the file's dtype. With
    sparse_parts (the split sizes), B is block-diagonal: part j only uses
    rank columns [j r/n, (j+1) r/n), the form Diffusers' kohya converter
    detects and splits by rank."""
    a = rng.standard_normal((rank, k_in)) / np.sqrt(k_in)
    b = rng.standard_normal((n_out, rank)) * (0.5 / np.sqrt(rank))
    if sparse_parts:
        n, r0, row = len(sparse_parts), rank // len(sparse_parts), 0
        mask = np.zeros_like(b)
        for j, d in enumerate(sparse_parts):
            mask[row:row + d, j * r0:(j + 1) * r0] = 1
            row += d
        b = b * mask
    return torch.from_numpy(a).to(dtype), torch.from_numpy(b).to(dtype)


# ----------------------------------------------------------------- runs ---

def run(uses):
    """Final latents of dev_64_default with the adapters of uses
    [(name, state dict, weight, via)], via 'file' (load_lora_weights of the
    state dict as the file holds it) or 'state_dict' (lora_state_dict's
    conversion, the missing 'transformer.' prefixes added, then loaded)."""
    from diffusers import FluxPipeline
    pipe, tr = mlf.flux_pipe()
    for name, sd, _, via in uses:
        sd = {k: v.to(torch.float64) for k, v in sd.items()}
        if via == "state_dict":
            conv = FluxPipeline.lora_state_dict(sd)
            sd = {(k if k.startswith("transformer.") else "transformer." + k): v
                  for k, v in conv.items()}
        pipe.load_lora_weights(sd, adapter_name=name)
    if uses:
        pipe.set_adapters([u[0] for u in uses], adapter_weights=[u[2] for u in uses])
    fc = {c["name"]: c for c in json.loads((EXP / "cases.json").read_text())["cases"]}[FCASE]
    ld = lambda k: torch.from_numpy(np.load(EXP / fc[k])).to(torch.float64)
    noise = np.load(EXP / fc["noise"])
    B, C, h, w = noise.shape
    packed = FluxPipeline._pack_latents(torch.from_numpy(noise), B, C, h, w).to(torch.float64)
    with torch.no_grad():
        lat = pipe(prompt_embeds=ld("prompt_embeds"), pooled_prompt_embeds=ld("pooled"),
                   height=fc["height"], width=fc["width"],
                   num_inference_steps=fc["num_inference_steps"],
                   guidance_scale=fc["guidance_scale"], latents=packed, output_type="latent",
                   return_dict=False)[0]
    return FluxPipeline._unpack_latents(lat, fc["height"], fc["width"], 8).numpy(), tr


def lora_modules(tr):
    from peft.tuners.tuners_utils import BaseTunerLayer
    return {n for n, m in tr.named_modules() if isinstance(m, BaseTunerLayer)}


# ----------------------------------------------------------------- main ---

def main():
    OUT.mkdir(parents=True, exist_ok=True)
    for f in list(OUT.glob("*.npy")) + list(OUT.glob("*.safetensors")):
        f.unlink()
    rng = np.random.default_rng(2626)
    _, tr = mlf.flux_pipe()
    D = tr.config.num_attention_heads * tr.config.attention_head_dim
    FF = tr.get_submodule("single_transformer_blocks.0.proj_mlp").out_features
    patch_kohya_dims(D, FF)
    mods = bfl_modules(tr)
    tops = {"img_in", "txt_in", "time_in", "vector_in", "guidance_in", "final_layer"}

    files, cases = {}, []

    # kohya-bfl, rank 4, every BFL module; alphas 2 (scale 0.5) on the
    # blocks, others on the rest; final_layer's alpha 8 is one Diffusers
    # leaves out (scale 1). BF16.
    kb4 = {}
    for m, tg in mods:
        n_out, k_in, _ = fused_shape(tr, tg)
        a, b = rand_ab(rng, n_out, k_in, 4, torch.bfloat16)
        k = "lora_unet_" + m.replace(".", "_")
        alpha = 8.0 if m.startswith("final_layer") else 1.0 if m == "txt_in" else \
            4.0 if m == "img_in" else 2.0
        kb4[k + ".lora_down.weight"] = a
        kb4[k + ".lora_up.weight"] = b
        kb4[k + ".alpha"] = torch.tensor(alpha, dtype=torch.bfloat16)
    save_file(kb4, str(OUT / "flux_kohya_bfl_r4.safetensors"))
    files["kb4"] = "flux_kohya_bfl_r4.safetensors"

    # bfl (diffusion_model. + lora_A / lora_B): the same tensors as kb4
    bfl4 = {}
    for m, _ in mods:
        k = "lora_unet_" + m.replace(".", "_")
        bfl4["diffusion_model." + m + ".lora_A.weight"] = kb4[k + ".lora_down.weight"]
        bfl4["diffusion_model." + m + ".lora_B.weight"] = kb4[k + ".lora_up.weight"]
        bfl4["diffusion_model." + m + ".alpha"] = kb4[k + ".alpha"]
    save_file(bfl4, str(OUT / "flux_bfl_r4.safetensors"))
    files["bfl4"] = "flux_bfl_r4.safetensors"

    # bfl / ComfyUI (diffusion_model. + lora_down / lora_up + alpha), rank 8,
    # some block modules only; linear1's B block-diagonal (the sparse split);
    # alpha 16 (scale 2). F16.
    some = ["double_blocks.0.img_attn.qkv", "double_blocks.1.txt_attn.proj",
            "double_blocks.0.txt_mlp.0", "double_blocks.1.img_mod.lin", "single_blocks.0.linear1",
            "single_blocks.0.linear2"]
    kb8 = {}
    for m, tg in mods:
        if m not in some:
            continue
        n_out, k_in, outs = fused_shape(tr, tg)
        a, b = rand_ab(rng, n_out, k_in, 8, torch.float16,
                       sparse_parts=outs if m.endswith("linear1") else None)
        kb8["diffusion_model." + m + ".lora_down.weight"] = a
        kb8["diffusion_model." + m + ".lora_up.weight"] = b
        kb8["diffusion_model." + m + ".alpha"] = torch.tensor(16.0, dtype=torch.float16)
    save_file(kb8, str(OUT / "flux_bfl_downup_r8_some.safetensors"))
    files["kb8"] = "flux_bfl_downup_r8_some.safetensors"

    # xlabs, rank 4 on every module it has (F32), rank 8 on some (BF16, with
    # the diffusion_model. prefix)
    def xlabs(rank, dtype, only=None, prefix=""):
        sd = {}
        c = tr.config
        keys = []
        for i in range(c.num_layers):
            p = f"transformer_blocks.{i}."
            keys += [(f"double_blocks.{i}.processor.qkv_lora1",
                      [p + "attn.to_q", p + "attn.to_k", p + "attn.to_v"]),
                     (f"double_blocks.{i}.processor.proj_lora1", [p + "attn.to_out.0"]),
                     (f"double_blocks.{i}.processor.qkv_lora2",
                      [p + "attn.add_q_proj", p + "attn.add_k_proj", p + "attn.add_v_proj"]),
                     (f"double_blocks.{i}.processor.proj_lora2", [p + "attn.to_add_out"])]
        for i in range(c.num_single_layers):
            p = f"single_transformer_blocks.{i}."
            keys += [(f"single_blocks.{i}.processor.qkv_lora",
                      [p + "attn.to_q", p + "attn.to_k", p + "attn.to_v"]),
                     (f"single_blocks.{i}.processor.proj_lora", [p + "proj_out"])]
        for m, tg in keys:
            if only and m not in only:
                continue
            n_out, k_in, _ = fused_shape(tr, tg)
            a, b = rand_ab(rng, n_out, k_in, rank, dtype)
            sd[prefix + m + ".down.weight"] = a
            sd[prefix + m + ".up.weight"] = b
        return sd

    x4 = xlabs(4, torch.float32)
    x8 = xlabs(8, torch.bfloat16, only={"double_blocks.1.processor.qkv_lora2",
                                        "double_blocks.0.processor.proj_lora1",
                                        "single_blocks.0.processor.qkv_lora"},
               prefix="diffusion_model.")
    save_file(x4, str(OUT / "flux_xlabs_r4.safetensors"))
    save_file(x8, str(OUT / "flux_xlabs_r8_some.safetensors"))
    files["x4"] = "flux_xlabs_r4.safetensors"
    files["x8"] = "flux_xlabs_r8_some.safetensors"

    # ai-toolkit: Diffusers names with the transformer. prefix, rank 8, on
    # x_embedder, the final proj_out, norm_out.linear and some block modules
    ait_mods = ["x_embedder", "proj_out", "norm_out.linear", "context_embedder",
                "transformer_blocks.1.attn.to_k", "single_transformer_blocks.0.proj_mlp"]
    ait = {}
    shapes = mlf.linear_shapes(tr, ait_mods)
    for m in ait_mods:
        a, b = rand_ab(rng, shapes[m][0], shapes[m][1], 8, torch.float32)
        ait["transformer." + m + ".lora_A.weight"] = a
        ait["transformer." + m + ".lora_B.weight"] = b
    save_file(ait, str(OUT / "flux_aitoolkit_r8.safetensors"))
    files["ait8"] = "flux_aitoolkit_r8.safetensors"
    sds = {"kb4": kb4, "bfl4": bfl4, "kb8": kb8, "x4": x4, "x8": x8, "ait8": ait}

    # Diffusers' load_lora_weights drops the modules outside the blocks of a
    # kohya file (no 'transformer.' prefix after its converter): checked
    _, tr_file = run([("kb4", kb4, 1.0, "file")])
    got = lora_modules(tr_file)
    assert "x_embedder" not in got and "proj_out" not in got and "norm_out.linear" not in got, got
    assert "transformer_blocks.0.attn.to_q" in got, got
    print("load_lora_weights(kohya file) leaves out: x_embedder, context_embedder, "
          "time_text_embed.*, norm_out.linear, proj_out", file=sys.stderr)

    base, _ = run([])

    def rel(a, b):
        return float(np.abs(a - b).max() / np.abs(b).max())

    def case(name, uses, note):
        """uses [(adapter, weight)]; the reference adapters' state dicts
        (bfl4's: kb4's tensors, which Diffusers converts)"""
        ref = []
        for n, w in uses:
            src = "kb4" if n == "bfl4" else n
            via = "state_dict" if src == "kb4" else "file"
            ref.append((n, sds[src], w, via))
        out, trr = run(ref)
        r = rel(out, base)
        assert r > 1e-2, (name, r)
        np.save(OUT / f"{name}_out.npy", out.astype("<f8"))
        cases.append({"name": name, "flux_case": FCASE,
                      "samples": [{"adapter": n, "scale": w} for n, w in uses],
                      "reference": note, "out": f"{name}_out.npy"})
        print(f"{name}: |lora - base| / |base| = {r:.4f}", file=sys.stderr)
        return trr

    trk = case("kohya_bfl_r4_s1", [("kb4", 1.0)],
               "lora_state_dict(file) + 'transformer.' on the modules outside the blocks")
    assert "x_embedder" in lora_modules(trk) and "proj_out" in lora_modules(trk)
    case("bfl_r4_s05", [("bfl4", 0.5)],
         "kb4's tensors (the same numbers under lora_down names), as kohya_bfl_r4_s1")
    case("bfl_downup_r8_some_s1", [("kb8", 1.0)], "load_lora_weights(file)")
    case("bfl_downup_r8_some_sm1", [("kb8", -1.0)], "load_lora_weights(file)")
    case("xlabs_r4_s1", [("x4", 1.0)], "load_lora_weights(file)")
    case("xlabs_r8_some_s05", [("x8", 0.5)], "load_lora_weights(file)")
    case("aitoolkit_r8_s1", [("ait8", 1.0)], "load_lora_weights(file)")
    case("aitoolkit_r8_sm1", [("ait8", -1.0)], "load_lora_weights(file)")
    case("two_xlabs_kohya", [("x4", 0.5), ("kb8", 1.0)], "load_lora_weights of both files")

    doc = {"about": "tools/make_lora_format_fixtures.py: Diffusers 0.42 float64 final latents "
                    "of the tiny FLUX.1-dev with community-format LoRA adapters "
                    "(load_lora_weights + set_adapters)",
           "adapters": files, "cases": cases}
    (OUT / "cases.json").write_text(json.dumps(doc, indent=1) + "\n")
    print(f"{len(cases)} cases", file=sys.stderr)


if __name__ == "__main__":
    main()
