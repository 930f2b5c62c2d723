#!/usr/bin/env python3
"""Reference fixtures for LoRA adapters (engine/models/lora.c, docs/lora.md).

What it is: tiny random adapters for the committed tiny DiT model
(tests/fixtures/models/tiny-p2-c1-h6) and the tiny FLUX.1-dev folder
(tests/fixtures/flux_pipeline/dev), and the final latents Diffusers 0.42
gives with them in float64:

  FLUX: FluxPipeline.load_lora_weights(state_dict, adapter_name=...) and
        set_adapters(names, adapter_weights=...), prompt embeddings given,
        as tools/make_cache_fixtures.py runs the pipeline;
  DiT:  DiTPipeline has no LoRA loader mixin, so PEFT's own
        inject_adapter_in_model + set_peft_model_state_dict (LoraConfig with
        the file's rank and alpha), then Diffusers' set_adapters machinery
        (diffusers.utils.peft_utils.set_weights_and_activate_adapters), in
        the DiTPipeline loop of tools/make_fixtures.py (sample_dit).

Adapters (the same numbers under several names): rank 4 on every linear
ditd adapts (PEFT lora_A / lora_B names, no alpha: scale 1; BF16 for the DiT,
F32 for FLUX); rank 8 on some modules only with alpha (lora_down / lora_up +
.alpha for the DiT, lora_A / lora_B + .alpha for FLUX, and the same in
kohya's lora_unet_ names; F16 for the DiT, BF16 for FLUX). Diffusers runs the PEFT-named A/B + alpha
state dict of each; the kohya and down/up files are the same tensors
renamed, so their reference is that run (Diffusers' own kohya converter
targets SD/SDXL/BFL names, not Diffusers module names).

Cases: scales 1, 0.5, 0, -1; two adapters at once; an adapter on some
modules only; kohya; and a DiT batch mixing a sample with an adapter and
one without (the reference runs each sample alone: Diffusers cannot mix).

Writes tests/fixtures/lora/: cases.json, the adapters (*.safetensors),
<case>_noise.npy (float32) and <case>_out.npy (float64).

Run with the project's virtualenv:
  /root/ditd-venv/bin/python tools/make_lora_fixtures.py
The C test (tests/golden/test_lora.c) reads the files, never Python.
"""
import json
import sys
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

import diffusers
from diffusers import FlowMatchEulerDiscreteScheduler
from diffusers.utils.peft_utils import set_weights_and_activate_adapters
from peft import LoraConfig, inject_adapter_in_model, set_peft_model_state_dict

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tools"))
import make_fixtures as mf  # noqa: E402  (sample_dit, reference_model, load_state_dict)

MODEL = REPO / "tests" / "fixtures" / "models" / "tiny-p2-c1-h6"
FLUXDIR = REPO / "tests" / "fixtures" / "flux_pipeline"
OUT = REPO / "tests" / "fixtures" / "lora"
DIT_STEPS = 6
DIT_GUIDANCE = 4.0

assert diffusers.__version__ == "0.42.1", diffusers.__version__


# ------------------------------------------------------------ adapters ---

def make_adapter(rng, shapes, modules, rank, dtype):
    """{module: (A (rank, in), B (out, rank))}, random, rounded to the torch
    dtype the file stores (the reference runs on the rounded values)."""
    out = {}
    for m in modules:
        n_out, k_in = shapes[m]
        a = rng.standard_normal((rank, k_in)) / np.sqrt(k_in)
        b = rng.standard_normal((n_out, rank)) * (0.5 / np.sqrt(rank))
        out[m] = (torch.from_numpy(a).to(dtype), torch.from_numpy(b).to(dtype))
    return out


def f64(t):
    return t.to(torch.float64).numpy()


def save_peft(path, ad, alpha=None, down_up=False):
    """Diffusers / PEFT names: transformer.<m>.lora_A/B.weight (or lora_down/up)."""
    a_s, b_s = (".lora_down.weight", ".lora_up.weight") if down_up else (".lora_A.weight",
                                                                         ".lora_B.weight")
    t = {}
    for m, (a, b) in ad.items():
        t["transformer." + m + a_s] = a.contiguous()
        t["transformer." + m + b_s] = b.contiguous()
        if alpha is not None:
            t["transformer." + m + ".alpha"] = torch.tensor(alpha, dtype=a.dtype)
    save_file(t, str(path))


def save_kohya(path, ad, alpha):
    t = {}
    for m, (a, b) in ad.items():
        k = "lora_unet_" + m.replace(".", "_")
        t[k + ".lora_down.weight"] = a.contiguous()
        t[k + ".lora_up.weight"] = b.contiguous()
        t[k + ".alpha"] = torch.tensor(alpha, dtype=a.dtype)
    save_file(t, str(path))


def linear_shapes(model, names):
    return {n: (model.get_submodule(n).out_features, model.get_submodule(n).in_features)
            for n in names}


# ------------------------------------------------------------------ DiT ---

def dit_linears(cfg):
    names = []
    for l in range(cfg["num_layers"]):
        p = f"transformer_blocks.{l}."
        names += [p + "norm1.emb.timestep_embedder.linear_1",
                  p + "norm1.emb.timestep_embedder.linear_2", p + "norm1.linear",
                  p + "attn1.to_q", p + "attn1.to_k", p + "attn1.to_v", p + "attn1.to_out.0",
                  p + "ff.net.0.proj", p + "ff.net.2"]
    return names + ["proj_out_1", "proj_out_2"]


def dit_model():
    config = mf.DiTTransformer2DModel.load_config(MODEL / "transformer")
    sd = mf.load_state_dict(MODEL / "transformer")
    return mf.reference_model(config, sd, torch.float64)


def dit_run(adapters, uses, label, noise):
    """One sample through DiTPipeline's loop with the adapters of `uses`
    [(name, weight)] injected by PEFT and weighted as set_adapters does."""
    model = dit_model()
    names = [n for n, _ in uses]
    for n in names:
        ad, alpha = adapters[n]["tensors"], adapters[n]["alpha"]
        rank = next(iter(ad.values()))[0].shape[0]
        cfg = LoraConfig(r=rank, lora_alpha=alpha if alpha is not None else rank,
                         target_modules=list(ad.keys()), lora_dropout=0.0)
        inject_adapter_in_model(cfg, model, adapter_name=n)
        sd = {}
        for m, (a, b) in ad.items():
            sd[m + ".lora_A.weight"] = a.to(torch.float64)
            sd[m + ".lora_B.weight"] = b.to(torch.float64)
        res = set_peft_model_state_dict(model, sd, adapter_name=n)
        assert not res.unexpected_keys, res.unexpected_keys
    if names:
        set_weights_and_activate_adapters(model, names, [w for _, w in uses])
        for n, w in uses:  # the scaling PEFT applies: weight * alpha / r
            ad, alpha = adapters[n]["tensors"], adapters[n]["alpha"]
            m0 = next(iter(ad))
            rank = ad[m0][0].shape[0]
            got = model.get_submodule(m0).scaling[n]
            want = w * (alpha if alpha is not None else rank) / rank
            assert abs(got - want) < 1e-12, (n, got, want)
    model = model.to(torch.float64)
    sched = FlowMatchEulerDiscreteScheduler.from_pretrained(MODEL / "scheduler")
    with torch.no_grad():
        out = mf.sample_dit(model, sched, [label], noise, DIT_GUIDANCE, DIT_STEPS,
                            model.config.num_embeds_ada_norm)
    return out.numpy()


# ----------------------------------------------------------------- FLUX ---

def flux_linears(tr):
    c = tr.config
    names = ["context_embedder", "time_text_embed.timestep_embedder.linear_1",
             "time_text_embed.timestep_embedder.linear_2"]
    if c.guidance_embeds:
        names += ["time_text_embed.guidance_embedder.linear_1",
                  "time_text_embed.guidance_embedder.linear_2"]
    names += ["time_text_embed.text_embedder.linear_1", "time_text_embed.text_embedder.linear_2",
              "norm_out.linear"]
    for l in range(c.num_layers):
        p = f"transformer_blocks.{l}."
        names += [p + s for s in ["norm1.linear", "norm1_context.linear", "attn.to_q",
                                  "attn.to_k", "attn.to_v", "attn.add_q_proj", "attn.add_k_proj",
                                  "attn.add_v_proj", "attn.to_out.0", "attn.to_add_out",
                                  "ff.net.0.proj", "ff.net.2", "ff_context.net.0.proj",
                                  "ff_context.net.2"]]
    for l in range(c.num_single_layers):
        p = f"single_transformer_blocks.{l}."
        names += [p + s for s in ["norm.linear", "attn.to_q", "attn.to_k", "attn.to_v",
                                  "proj_mlp", "proj_out"]]
    return names


def flux_pipe():
    from diffusers import AutoencoderKL, FluxPipeline, FluxTransformer2DModel
    d = FLUXDIR / "dev"
    tr = FluxTransformer2DModel.from_pretrained(d / "transformer", torch_dtype=torch.float64)
    vae = AutoencoderKL.from_pretrained(d / "vae", torch_dtype=torch.float64)
    sched = FlowMatchEulerDiscreteScheduler.from_pretrained(d / "scheduler")
    pipe = FluxPipeline(scheduler=sched, vae=vae, text_encoder=None, tokenizer=None,
                        text_encoder_2=None, tokenizer_2=None, transformer=tr)
    pipe.set_progress_bar_config(disable=True)
    return pipe, tr


def flux_run(adapters, uses, case, exp):
    from diffusers import FluxPipeline
    pipe, tr = flux_pipe()
    names = [n for n, _ in uses]
    for n in names:
        ad, alpha = adapters[n]["tensors"], adapters[n]["alpha"]
        sd = {}
        for m, (a, b) in ad.items():
            sd["transformer." + m + ".lora_A.weight"] = a.to(torch.float64)
            sd["transformer." + m + ".lora_B.weight"] = b.to(torch.float64)
            if alpha is not None:
                sd["transformer." + m + ".alpha"] = torch.tensor(float(alpha), dtype=torch.float64)
        pipe.load_lora_weights(sd, adapter_name=n)
    if names:
        pipe.set_adapters(names, adapter_weights=[w for _, w in uses])
        for n, w in uses:
            ad, alpha = adapters[n]["tensors"], adapters[n]["alpha"]
            m0 = next(iter(ad))
            rank = ad[m0][0].shape[0]
            got = float(tr.get_submodule(m0).scaling[n])
            want = w * (alpha if alpha is not None else rank) / rank
            assert abs(got - want) < 1e-12, (n, got, want)
    ld = lambda k: torch.from_numpy(np.load(exp / case[k])).to(torch.float64)
    noise = np.load(exp / case["noise"])
    B, C, h, w = noise.shape
    packed = FluxPipeline._pack_latents(torch.from_numpy(noise), B, C, h, w).to(torch.float64)
    kw = {}
    if case.get("true_cfg_scale", 1.0) > 1:
        kw = dict(negative_prompt_embeds=ld("negative_prompt_embeds"),
                  negative_pooled_prompt_embeds=ld("negative_pooled"),
                  true_cfg_scale=case["true_cfg_scale"])
    with torch.no_grad():
        lat = pipe(prompt_embeds=ld("prompt_embeds"), pooled_prompt_embeds=ld("pooled"),
                   height=case["height"], width=case["width"],
                   num_inference_steps=case["num_inference_steps"],
                   guidance_scale=case["guidance_scale"], latents=packed, output_type="latent",
                   return_dict=False, **kw)[0]
    return FluxPipeline._unpack_latents(lat, case["height"], case["width"], 8).numpy(), noise


# ----------------------------------------------------------------- main ---

def main():
    OUT.mkdir(parents=True, exist_ok=True)
    for f in list(OUT.glob("*.npy")) + list(OUT.glob("*.safetensors")):
        f.unlink()
    rng = np.random.default_rng(26)
    cases, files = [], {}

    def rel(a, b):
        return float(np.abs(a - b).max() / np.abs(b).max())

    # ---- DiT
    cfg = json.loads((MODEL / "transformer" / "config.json").read_text())
    model = dit_model()
    lin = dit_linears(cfg)
    shapes = linear_shapes(model, lin)
    some = ["transformer_blocks.0.attn1.to_q", "transformer_blocks.0.attn1.to_v",
            "transformer_blocks.2.ff.net.0.proj", "transformer_blocks.1.norm1.linear",
            "transformer_blocks.1.norm1.emb.timestep_embedder.linear_1", "proj_out_2"]
    dit_ads = {
        "d4": {"tensors": make_adapter(rng, shapes, lin, 4, torch.bfloat16), "alpha": None},
        "d8": {"tensors": make_adapter(rng, shapes, some, 8, torch.float16), "alpha": 4.0},
    }
    save_peft(OUT / "dit_r4_peft.safetensors", dit_ads["d4"]["tensors"])
    save_peft(OUT / "dit_r8_some_downup.safetensors", dit_ads["d8"]["tensors"], alpha=4.0,
              down_up=True)
    save_kohya(OUT / "dit_r8_some_kohya.safetensors", dit_ads["d8"]["tensors"], alpha=4.0)
    files["dit"] = {"d4": "dit_r4_peft.safetensors", "d8": "dit_r8_some_downup.safetensors",
                    "d8k": "dit_r8_some_kohya.safetensors"}
    C, S = cfg["in_channels"], cfg["sample_size"]
    noise = rng.standard_normal((2, C, S, S)).astype(np.float32)
    labels = [3, 1]
    base = [dit_run(dit_ads, [], labels[i], noise[i:i + 1]) for i in range(2)]

    def dit_case(name, samples, expect_change=True):
        outs = []
        for i, uses in enumerate(samples):
            ref_uses = [("d8" if n == "d8k" else n, w) for n, w in uses]
            o = dit_run(dit_ads, ref_uses, labels[i], noise[i:i + 1])
            if expect_change and uses:
                assert rel(o, base[i]) > 1e-2, (name, rel(o, base[i]))
            outs.append(o)
        out = np.concatenate(outs)
        np.save(OUT / f"{name}_noise.npy", noise[:len(samples)].astype("<f4"))
        np.save(OUT / f"{name}_out.npy", out.astype("<f8"))
        cases.append({"name": name, "family": "dit", "steps": DIT_STEPS,
                      "guidance_scale": DIT_GUIDANCE, "sampler": "flow-euler",
                      "class_labels": labels[:len(samples)],
                      "samples": [[{"adapter": n, "scale": w} for n, w in u] for u in samples],
                      "noise": f"{name}_noise.npy", "out": f"{name}_out.npy"})
        print(f"{name}: |lora - base| / |base| = "
              f"{[round(rel(outs[i], base[i]), 4) for i in range(len(samples))]}", file=sys.stderr)

    dit_case("dit_r4_s1", [[("d4", 1.0)]])
    dit_case("dit_r4_s05", [[("d4", 0.5)]])
    dit_case("dit_r4_s0", [[("d4", 0.0)]], expect_change=False)
    dit_case("dit_r4_sm1", [[("d4", -1.0)]])
    dit_case("dit_r8_some", [[("d8", 1.0)]])
    dit_case("dit_r8_some_kohya", [[("d8k", 1.0)]])
    dit_case("dit_two", [[("d4", 1.0), ("d8", 0.5)]])
    dit_case("dit_batch_mixed", [[("d4", 1.0)], []])
    dit_case("dit_batch_two_sets", [[("d8k", -1.0)], [("d4", 0.5), ("d8", 1.0)]])
    assert rel(np.load(OUT / "dit_r4_s0_out.npy"), base[0]) == 0.0

    # ---- FLUX
    exp = FLUXDIR / "expected"
    fcases = {c["name"]: c for c in json.loads((exp / "cases.json").read_text())["cases"]}
    _, tr = flux_pipe()
    flin = flux_linears(tr)
    fshapes = linear_shapes(tr, flin)
    fsome = ["transformer_blocks.0.attn.to_q", "transformer_blocks.1.attn.add_k_proj",
             "transformer_blocks.0.ff.net.0.proj", "transformer_blocks.1.ff_context.net.2",
             "single_transformer_blocks.0.proj_mlp", "single_transformer_blocks.0.proj_out",
             "single_transformer_blocks.0.attn.to_v", "norm_out.linear",
             "time_text_embed.timestep_embedder.linear_1"]
    flux_ads = {
        "f4": {"tensors": make_adapter(rng, fshapes, flin, 4, torch.float32), "alpha": None},
        "f8": {"tensors": make_adapter(rng, fshapes, fsome, 8, torch.bfloat16), "alpha": 16.0},
    }
    save_peft(OUT / "flux_r4_peft.safetensors", flux_ads["f4"]["tensors"])
    save_peft(OUT / "flux_r8_some_peft.safetensors", flux_ads["f8"]["tensors"], alpha=16.0)
    save_kohya(OUT / "flux_r8_some_kohya.safetensors", flux_ads["f8"]["tensors"], alpha=16.0)
    files["flux"] = {"f4": "flux_r4_peft.safetensors", "f8": "flux_r8_some_peft.safetensors",
                     "f8k": "flux_r8_some_kohya.safetensors"}
    fbase = {}

    def flux_case(name, fc_name, uses):
        fc = fcases[fc_name]
        if fc_name not in fbase:
            fbase[fc_name] = flux_run(flux_ads, [], fc, exp)[0]
        ref_uses = [("f8" if n == "f8k" else n, w) for n, w in uses]
        out, noise = flux_run(flux_ads, ref_uses, fc, exp)
        r = rel(out, fbase[fc_name])
        assert r > 1e-2, (name, r)
        np.save(OUT / f"{name}_out.npy", out.astype("<f8"))
        cases.append({"name": name, "family": "flux", "flux_case": fc_name,
                      "samples": [[{"adapter": n, "scale": w} for n, w in uses]] * noise.shape[0],
                      "out": f"{name}_out.npy"})
        print(f"{name}: |lora - base| / |base| = {r:.4f}", file=sys.stderr)

    flux_case("flux_r4_s1", "dev_64_default", [("f4", 1.0)])
    flux_case("flux_r4_sm1", "dev_64_default", [("f4", -1.0)])
    flux_case("flux_r8_some_s05", "dev_64_default", [("f8", 0.5)])
    flux_case("flux_r8_some_kohya", "dev_64_default", [("f8k", 1.0)])
    flux_case("flux_two", "dev_64_default", [("f4", 0.5), ("f8", 1.0)])
    flux_case("flux_true_cfg_r4", "dev_64_true_cfg", [("f4", 1.0)])

    doc = {"about": "tools/make_lora_fixtures.py: Diffusers 0.42 float64 final latents with "
                    "LoRA adapters (load_lora_weights / PEFT + set_adapters)",
           "adapters": files, "cases": cases}
    (OUT / "cases.json").write_text(json.dumps(doc, indent=1) + "\n")
    print(f"{len(cases)} cases", file=sys.stderr)


if __name__ == "__main__":
    main()
