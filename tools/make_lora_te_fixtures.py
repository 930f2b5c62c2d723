#!/usr/bin/env python3
"""Reference fixtures for text-encoder LoRA adapters (engine/text/text_lora.c, docs/lora.md).

What it is: tiny random adapters for the tiny FLUX.1-dev pipeline folder
(tests/fixtures/flux_pipeline/dev, assembled with its tokenizers as the build does) and
what Diffusers 0.42 makes with them in float64 -- the prompt embeddings (T5 sequence and
CLIP pooled vector, FluxPipeline.encode_prompt) and the final latents of FluxPipeline
(the flux_pipeline case dev_64_default: its prompt, noise, 4 steps, guidance 3.5):

  c4   te_clip_r4_peft.safetensors: rank 4 on every CLIP linear (q/k/v/out_proj, fc1, fc2
       of both layers) in PEFT names text_encoder.text_model.encoder.layers.N...lora_A/B
       (hub spelling; Diffusers strips text_model. for transformers 5's flattened
       CLIPTextModel), F32, and in the same file a transformer part (rank 4 on some
       transformer linears): FluxPipeline.load_lora_weights splits it by prefix.
  c8k  te_clip_r8_kohya.safetensors: rank 8 with alpha 4 on some CLIP linears in kohya
       names lora_te1_text_model_encoder_layers_N_..., BF16; Diffusers loads this very
       file (its kohya FLUX converter maps lora_te1_ to text_encoder and folds alpha in).
  t4   te_t5_r4_peft.safetensors: rank 4 with alpha 8 on every T5 linear (q, k, v, o,
       wi_0, wi_1, wo) in PEFT names text_encoder_2.encoder.block.N..., BF16.
       FluxLoraLoaderMixin loads no T5 adapter (its _lora_loadable_modules are transformer
       and text_encoder), so the reference is PEFT's own injection into T5EncoderModel:
       inject_adapter_in_model + set_peft_model_state_dict (LoraConfig with the file's rank
       and alpha), weighted by Diffusers' set_weights_and_activate_adapters.

Adapters loaded with load_lora_weights are weighted with pipe.set_adapters(names,
adapter_weights=...). Cases: c4 at 1 and 0.5, c8k at 1, t4 at 1 and 0.5, c4 at 1 with t4
at 0.5. Each case asserts the adapters changed what they should (the pooled vector for
CLIP, the sequence for T5) and left the rest bit for bit.

And StableDiffusion3Pipeline (the tiny sd3 folder of tests/fixtures/sd3_pipeline, its case
sd3_64_default: CFG over ""): g4 (sd3_clips_r4_peft.safetensors, rank 4 on both CLIPs in
PEFT names, through load_lora_weights) at 1, and at 0.5 with t3 (sd3_t5_r4_peft, rank 4 on
every T5 linear, text_encoder_3.*, through PEFT) at 1: prompt and negative embeddings and
the final latents.

Writes tests/fixtures/lora_te/: cases.json, the adapters, <case>_{seq,pooled}.npy
(float64; SD3 also _neg_seq, _neg_pooled) and <case>_out.npy (float64 final latents).

Run with the project's virtualenv (about a minute):
  /root/ditd-venv/bin/python tools/make_lora_te_fixtures.py
The C test (tests/golden/test_lora_te.c) reads the files, never Python.
"""
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

import diffusers
import transformers
from diffusers import FluxPipeline
from diffusers.utils.peft_utils import set_weights_and_activate_adapters
from peft import LoraConfig, inject_adapter_in_model, set_peft_model_state_dict

REPO = Path(__file__).resolve().parent.parent
FLUXDIR = REPO / "tests" / "fixtures" / "flux_pipeline"
UNPACK = REPO / "tests" / "fixtures" / "tokenizers" / "unpack.py"
OUT = REPO / "tests" / "fixtures" / "lora_te"
CASE = "dev_64_default"


def rand(rng, shape, dtype, std):
    return torch.from_numpy(rng.standard_normal(shape) * std).to(dtype)


def make_adapter(rng, model, modules, rank, dtype, std=0.3):
    """{module: (A (rank, in), B (out, rank))}; B is not zero, so the adapter acts."""
    out = {}
    for m in modules:
        lin = model.get_submodule(m)
        out[m] = (rand(rng, (rank, lin.in_features), dtype, std),
                  rand(rng, (lin.out_features, rank), dtype, std))
    return out


def clip_linears(clip, layers):
    return [f"encoder.layers.{l}.{s}" for l in layers
            for s in ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                      "self_attn.out_proj", "mlp.fc1", "mlp.fc2"]]


def t5_linears(t5):
    n = t5.config.num_layers
    return [f"encoder.block.{l}.{s}" for l in range(n)
            for s in ["layer.0.SelfAttention.q", "layer.0.SelfAttention.k",
                      "layer.0.SelfAttention.v", "layer.0.SelfAttention.o",
                      "layer.1.DenseReluDense.wi_0", "layer.1.DenseReluDense.wi_1",
                      "layer.1.DenseReluDense.wo"]]


def f64(t):
    return t.to(torch.float64)


def load_pipe(folder):
    pipe = FluxPipeline.from_pretrained(folder, torch_dtype=torch.float64)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def peft_t5(t5, name, ad, alpha, weight):
    """PEFT's LoRA on T5EncoderModel: the reference where Diffusers loads none."""
    rank = next(iter(ad.values()))[0].shape[0]
    cfg = LoraConfig(r=rank, lora_alpha=alpha, target_modules=list(ad), lora_dropout=0.0)
    inject_adapter_in_model(cfg, t5, adapter_name=name)
    sd = {}
    for m, (a, b) in ad.items():
        sd[m + ".lora_A.weight"] = f64(a)
        sd[m + ".lora_B.weight"] = f64(b)
    res = set_peft_model_state_dict(t5, sd, adapter_name=name)
    assert not res.unexpected_keys, res.unexpected_keys
    set_weights_and_activate_adapters(t5, [name], [weight])
    m0 = next(iter(ad))
    got = float(t5.get_submodule(m0).scaling[name])
    assert abs(got - weight * alpha / rank) < 1e-12, (got, weight * alpha / rank)


def main():
    torch.set_num_threads(2)
    torch.use_deterministic_algorithms(True)
    transformers.logging.set_verbosity_error()
    diffusers.utils.logging.set_verbosity_error()
    diffusers.utils.logging.disable_progress_bar()
    OUT.mkdir(parents=True, exist_ok=True)
    for f in list(OUT.glob("*.npy")) + list(OUT.glob("*.safetensors")):
        f.unlink()
    rng = np.random.default_rng(2626)
    fcase = next(c for c in json.loads((FLUXDIR / "expected" / "cases.json").read_text())["cases"]
                 if c["name"] == CASE)
    noise = np.load(FLUXDIR / "expected" / fcase["noise"])
    prompt = fcase["prompts"][0]
    L = fcase["max_sequence_length"]

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        subprocess.run([sys.executable, str(UNPACK), str(tmp / "tok"), str(tmp / "tok.stamp")],
                       check=True)
        subprocess.run([sys.executable, str(FLUXDIR / "assemble.py"), str(tmp / "tok"),
                        str(tmp / "pipes"), str(tmp / "pipes.stamp")], check=True)
        folder = tmp / "pipes" / "dev"
        base = load_pipe(folder)
        clip, t5, tr = base.text_encoder, base.text_encoder_2, base.transformer
        assert not hasattr(clip, "text_model"), "transformers 5's CLIPTextModel is flattened"

        # ---- the adapters
        c4 = make_adapter(rng, clip, clip_linears(clip, [0, 1]), 4, torch.float32)
        c4_tr = make_adapter(rng, tr, ["transformer_blocks.0.attn.to_q",
                                       "single_transformer_blocks.0.proj_mlp",
                                       "transformer_blocks.1.ff.net.2"], 4, torch.float32)
        c8 = make_adapter(rng, clip, ["encoder.layers.0.self_attn.q_proj",
                                      "encoder.layers.1.mlp.fc1",
                                      "encoder.layers.1.self_attn.out_proj"], 8, torch.bfloat16)
        # smaller values: alpha 8 on rank 4 doubles the term, and T5's unscaled attention
        # turns a large change of q and k into a near one-hot softmax (the sequence still
        # moves by about half its size, printed below)
        t4 = make_adapter(rng, t5, t5_linears(t5), 4, torch.bfloat16, std=0.15)
        C8_ALPHA, T4_ALPHA = 4.0, 8.0

        sd = {}
        for m, (a, b) in c4.items():
            sd[f"text_encoder.text_model.{m}.lora_A.weight"] = a.contiguous()
            sd[f"text_encoder.text_model.{m}.lora_B.weight"] = b.contiguous()
        for m, (a, b) in c4_tr.items():
            sd[f"transformer.{m}.lora_A.weight"] = a.contiguous()
            sd[f"transformer.{m}.lora_B.weight"] = b.contiguous()
        save_file(sd, str(OUT / "te_clip_r4_peft.safetensors"))
        sd = {}
        for m, (a, b) in c8.items():
            k = "lora_te1_text_model_" + m.replace(".", "_")
            sd[k + ".lora_down.weight"] = a.contiguous()
            sd[k + ".lora_up.weight"] = b.contiguous()
            sd[k + ".alpha"] = torch.tensor(C8_ALPHA, dtype=torch.bfloat16)
        save_file(sd, str(OUT / "te_clip_r8_kohya.safetensors"))
        sd = {}
        for m, (a, b) in t4.items():
            sd[f"text_encoder_2.{m}.lora_A.weight"] = a.contiguous()
            sd[f"text_encoder_2.{m}.lora_B.weight"] = b.contiguous()
            sd[f"text_encoder_2.{m}.alpha"] = torch.tensor(T4_ALPHA, dtype=torch.bfloat16)
        save_file(sd, str(OUT / "te_t5_r4_peft.safetensors"))
        files = {"c4": "te_clip_r4_peft.safetensors", "c8k": "te_clip_r8_kohya.safetensors",
                 "t4": "te_t5_r4_peft.safetensors"}

        def encode(pipe):
            with torch.no_grad():
                seq, pooled, _ = pipe.encode_prompt(prompt=prompt, prompt_2=None,
                                                    max_sequence_length=L)
            return seq.numpy(), pooled.numpy()

        def generate(pipe):
            B, C, h, w = noise.shape
            packed = FluxPipeline._pack_latents(torch.from_numpy(noise), B, C, h, w)
            with torch.no_grad():
                lat = pipe(prompt=prompt, height=fcase["height"], width=fcase["width"],
                           num_inference_steps=fcase["num_inference_steps"],
                           guidance_scale=fcase["guidance_scale"], max_sequence_length=L,
                           latents=packed.to(torch.float64), output_type="latent",
                           return_dict=False)[0]
            return FluxPipeline._unpack_latents(lat, fcase["height"], fcase["width"], 8).numpy()

        seq0, pool0 = encode(base)
        out0 = generate(base)
        ref0 = np.load(FLUXDIR / "expected" / fcase["final_latents"])
        r0 = float(np.abs(out0 - ref0).max() / np.abs(ref0).max())
        assert r0 < 1e-6, r0  # the assembled folder is the flux_pipeline fixture's
        np.save(OUT / "base_seq.npy", seq0.astype("<f8"))
        np.save(OUT / "base_pooled.npy", pool0.astype("<f8"))
        cases = []

        def case(name, uses):
            pipe = load_pipe(folder)
            names, weights = [], []
            for n, w in uses:
                if n == "t4":
                    peft_t5(pipe.text_encoder_2, n, t4, T4_ALPHA, w)
                    continue
                pipe.load_lora_weights(str(OUT / files[n]), adapter_name=n)
                names.append(n)
                weights.append(w)
            if names:
                pipe.set_adapters(names, adapter_weights=weights)
            for n, w in uses:  # the scale each module got is the one ditd computes
                if n == "c4":
                    m = pipe.text_encoder.get_submodule("encoder.layers.1.mlp.fc2")
                    assert abs(float(m.scaling[n]) - w) < 1e-12, (n, m.scaling)
                    m = pipe.transformer.get_submodule("transformer_blocks.0.attn.to_q")
                    assert abs(float(m.scaling[n]) - w) < 1e-12, (n, m.scaling)
                if n == "c8k":  # alpha folded into down/up by the kohya converter
                    m = pipe.text_encoder.get_submodule("encoder.layers.1.mlp.fc1")
                    a = m.lora_A[n].weight.detach()
                    bb = m.lora_B[n].weight.detach()
                    got = float(m.scaling[n]) * (bb @ a)
                    a0, b0 = c8["encoder.layers.1.mlp.fc1"]
                    want = w * C8_ALPHA / 8 * (f64(b0) @ f64(a0))
                    assert float((got - want).abs().max()) < 1e-12, n
            seq, pooled = encode(pipe)
            out = generate(pipe)
            clip_used = any(n in ("c4", "c8k") for n, _ in uses)
            t5_used = any(n == "t4" for n, _ in uses)
            dp = float(np.abs(pooled - pool0).max() / np.abs(pool0).max())
            ds = float(np.abs(seq - seq0).max() / np.abs(seq0).max())
            do = float(np.abs(out - out0).max() / np.abs(out0).max())
            assert (dp > 1e-2) == clip_used and (dp == 0.0) == (not clip_used), (name, dp)
            assert (ds > 1e-2) == t5_used and (ds == 0.0) == (not t5_used), (name, ds)
            assert do > 1e-3, (name, do)
            for what, a in (("seq", seq), ("pooled", pooled), ("out", out)):
                np.save(OUT / f"{name}_{what}.npy", a.astype("<f8"))
            cases.append({"name": name, "uses": [{"adapter": n, "scale": w} for n, w in uses],
                          "seq": f"{name}_seq.npy", "pooled": f"{name}_pooled.npy",
                          "out": f"{name}_out.npy"})
            print(f"{name}: pooled {dp:.3g}, seq {ds:.3g}, latents {do:.3g} from the base",
                  file=sys.stderr)

        case("te_c4_s1", [("c4", 1.0)])
        case("te_c4_s05", [("c4", 0.5)])
        case("te_c8k_s1", [("c8k", 1.0)])
        case("te_t4_s1", [("t4", 1.0)])
        case("te_t4_s05", [("t4", 0.5)])
        case("te_c4_t4", [("c4", 1.0), ("t4", 0.5)])

    sd3 = sd3_cases(rng)
    doc = {"about": "tools/make_lora_te_fixtures.py: Diffusers 0.42 float64 prompt embeddings "
                    "and final latents of the tiny FLUX.1-dev folder with text-encoder LoRA "
                    "adapters (load_lora_weights + set_adapters; T5 through PEFT)",
           "flux_case": CASE, "prompt": prompt, "max_sequence_length": L,
           "diffusers": diffusers.__version__, "transformers": transformers.__version__,
           "base": {"seq": "base_seq.npy", "pooled": "base_pooled.npy"},
           "adapters": files, "cases": cases, "sd3": sd3}
    (OUT / "cases.json").write_text(json.dumps(doc, indent=1) + "\n")
    combined()
    print(f"{len(cases)} cases", file=sys.stderr)


SD3DIR = REPO / "tests" / "fixtures" / "sd3_pipeline"
SD3_CASE = "sd3_64_default"


def sd3_cases(rng):
    """StableDiffusion3Pipeline (the tiny sd3 folder): both CLIPs
    (CLIPTextModelWithProjection) by SD3LoraLoaderMixin.load_lora_weights, the T5
    (text_encoder_3, which it does not load) by PEFT; CFG over "" as the case runs it.
    No alpha: SD3's loader passes no network alphas (an .alpha key is not applied)."""
    from diffusers import StableDiffusion3Pipeline
    fcase = next(c for c in json.loads((SD3DIR / "expected" / "cases.json").read_text())["cases"]
                 if c["name"] == SD3_CASE)
    noise = np.load(SD3DIR / "expected" / fcase["noise"])
    prompt, L = fcase["prompts"][0], fcase["max_sequence_length"]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        subprocess.run([sys.executable, str(UNPACK), str(tmp / "tok"), str(tmp / "tok.stamp")],
                       check=True)
        subprocess.run([sys.executable, str(SD3DIR / "assemble.py"), str(tmp / "tok"),
                        str(tmp / "pipes"), str(tmp / "pipes.stamp")], check=True)
        folder = tmp / "pipes" / fcase["folder"]

        def load():
            pipe = StableDiffusion3Pipeline.from_pretrained(folder, torch_dtype=torch.float64)
            pipe.set_progress_bar_config(disable=True)
            return pipe

        base = load()
        c1, c2, t5 = base.text_encoder, base.text_encoder_2, base.text_encoder_3
        assert hasattr(c1, "text_model") and hasattr(c2, "text_model")
        g = make_adapter(rng, c1, ["text_model." + m for m in clip_linears(c1, [0, 1])], 4,
                         torch.float32)
        g2 = make_adapter(rng, c2, ["text_model." + m for m in
                                    clip_linears(c2, [1]) + ["encoder.layers.2.mlp.fc2"]], 4,
                          torch.float32)
        t3 = make_adapter(rng, t5, t5_linears(t5), 4, torch.bfloat16, std=0.15)
        sd = {}
        for comp, ad in (("text_encoder", g), ("text_encoder_2", g2)):
            for m, (a, b) in ad.items():
                sd[f"{comp}.{m}.lora_A.weight"] = a.contiguous()
                sd[f"{comp}.{m}.lora_B.weight"] = b.contiguous()
        save_file(sd, str(OUT / "sd3_clips_r4_peft.safetensors"))
        sd = {}
        for m, (a, b) in t3.items():
            sd[f"text_encoder_3.{m}.lora_A.weight"] = a.contiguous()
            sd[f"text_encoder_3.{m}.lora_B.weight"] = b.contiguous()
        save_file(sd, str(OUT / "sd3_t5_r4_peft.safetensors"))
        files = {"g4": "sd3_clips_r4_peft.safetensors", "t3": "sd3_t5_r4_peft.safetensors"}

        def run(pipe):
            with torch.no_grad():
                pe, npe, pp, npp = pipe.encode_prompt(prompt=prompt, prompt_2=None, prompt_3=None,
                                                      do_classifier_free_guidance=True,
                                                      max_sequence_length=L)
                lat = pipe(prompt=prompt, height=fcase["height"], width=fcase["width"],
                           num_inference_steps=fcase["num_inference_steps"],
                           guidance_scale=fcase["guidance_scale"], max_sequence_length=L,
                           latents=torch.from_numpy(noise).to(torch.float64),
                           output_type="latent", return_dict=False)[0]
            return [x.numpy() for x in (pe, pp, npe, npp, lat)]

        r0 = run(base)
        ref0 = np.load(SD3DIR / "expected" / fcase["final_latents"])
        assert float(np.abs(r0[4] - ref0).max() / np.abs(ref0).max()) < 1e-6
        cases = []
        for name, uses in (("sd3_g4_s1", [("g4", 1.0)]), ("sd3_g4_t3", [("g4", 0.5), ("t3", 1.0)])):
            pipe = load()
            for n, w in uses:
                if n == "t3":
                    peft_t5(pipe.text_encoder_3, n, t3, 4.0, w)  # alpha = rank: scale 1
                else:
                    pipe.load_lora_weights(str(OUT / files[n]), adapter_name=n)
                    pipe.set_adapters([n], adapter_weights=[w])
                    m = pipe.text_encoder_2.get_submodule("text_model.encoder.layers.2.mlp.fc2")
                    assert abs(float(m.scaling[n]) - w) < 1e-12, m.scaling
            r = run(pipe)
            for i, what in enumerate(("seq", "pooled", "neg_seq", "neg_pooled")):
                d = float(np.abs(r[i] - r0[i]).max() / np.abs(r0[i]).max())
                assert d > 1e-3, (name, what, d)
            d = float(np.abs(r[4] - r0[4]).max() / np.abs(r0[4]).max())
            assert d > 1e-3, (name, d)
            out = {}
            for i, what in enumerate(("seq", "pooled", "neg_seq", "neg_pooled", "out")):
                np.save(OUT / f"{name}_{what}.npy", r[i].astype("<f8"))
                out[what] = f"{name}_{what}.npy"
            cases.append(dict(name=name, uses=[{"adapter": n, "scale": w} for n, w in uses], **out))
            print(f"{name}: latents {d:.3g} from the base", file=sys.stderr)
    return {"case": SD3_CASE, "prompt": prompt, "max_sequence_length": L, "adapters": files,
            "cases": cases}


def combined():
    """flux_kohya_bfl_te1.safetensors: one kohya file as trainers write them, the transformer
    in BFL names (tests/fixtures/lora_formats/flux_kohya_bfl_r4.safetensors) and CLIP's
    lora_te1_ modules (te_clip_r8_kohya.safetensors) together; test_generate_lora_te holds it
    to the two files given apart, bit for bit (--combined-only: this file alone)."""
    from safetensors.torch import load_file
    a = load_file(str(REPO / "tests" / "fixtures" / "lora_formats" / "flux_kohya_bfl_r4.safetensors"))
    b = load_file(str(OUT / "te_clip_r8_kohya.safetensors"))
    save_file(dict(sorted({**a, **b}.items())), str(OUT / "flux_kohya_bfl_te1.safetensors"))


if __name__ == "__main__":
    if sys.argv[1:] == ["--combined-only"]:
        combined()
    else:
        main()
