#!/usr/bin/env python3
"""Reference fixtures for LoRA adapters on SD3 and Wan (docs/lora.md).

What it is: tiny random adapters for the committed tiny SD3.5 transformer
(tests/fixtures/sd3_pipeline/sd35: qk_norm, a dual-attention block, a
context_pre_only block) and the tiny Wan 2.1 / Wan 2.2 transformers
(tests/fixtures/wan_pipeline/wan21, wan22's transformer_2), and the final
latents Diffusers 0.42 gives with them in float64:

  SD3: StableDiffusion3Pipeline.load_lora_weights + set_adapters(names,
       adapter_weights=...), prompt embeddings, pooled vectors and noise of
       the committed pipeline case sd35_32_batch2 (CFG 3.0, 2 steps);
  Wan: WanPipeline.load_lora_weights + set_adapters, the embeddings and
       noise of wan_5f_32x32_batch2 (CFG, 3 steps); Wan 2.2's two experts
       (wan22_5f_32x48_experts, 4 steps, two of them on transformer_2) with
       an adapter loaded into transformer (the default) and / or, with
       load_into_transformer_2=True, into transformer_2.

Adapters: rank 4 on every nn.Linear of the model (PEFT lora_A / lora_B
names, no alpha: scale 1; BF16); rank 8 on some modules with alpha 16 (F16).
Diffusers' SD3 and Wan loaders refuse `.alpha` tensors ("all LoRA param
names contain 'lora'") and take alpha from the file's lora_adapter_metadata
(as save_lora_weights writes it): the reference loads such a file; ditd's
committed file holds the same tensors with `<module>.alpha` (which ditd
reads; it does not read the metadata). No kohya file: Diffusers' Wan loader
takes `lora_unet_` names only in musubi's original Wan module names, and its
SD3 loader takes none.

Cases: scales 1, 0.5, -1; the rank-8 adapter alone; two adapters at once; a
batch of two samples with an adapter and without (each reference sample runs
alone: Diffusers cannot mix); Wan 2.2: one adapter on both experts (loaded
twice, the second time into transformer_2), different adapters per expert,
and an adapter on transformer alone. And one forward each of the Wan 2.1
I2V-like and TI2V-like transformers of tests/fixtures/wan (the image branch's
linears; per-frame timesteps) with a rank-4 adapter at 0.7 through the
model's load_lora_adapter + set_adapters.

Writes tests/fixtures/lora_sd3wan/: cases.json, the adapters
(*.safetensors) and <case>_out.npy (float64), sd35_sample0_noise.npy. Run with the project's
virtualenv:
  /root/ditd-venv/bin/python tools/make_lora_sd3wan_fixtures.py
The C test (tests/golden/test_lora_sd3wan.c) reads the files, never Python.
"""
import json
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

import diffusers
from diffusers import (AutoencoderKLWan, FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel,
                       StableDiffusion3Pipeline, UniPCMultistepScheduler, WanPipeline,
                       WanTransformer3DModel)

REPO = Path(__file__).resolve().parent.parent
SD3DIR = REPO / "tests" / "fixtures" / "sd3_pipeline"
WANDIR = REPO / "tests" / "fixtures" / "wan_pipeline"
OUT = REPO / "tests" / "fixtures" / "lora_sd3wan"
ALPHA = 16.0

assert diffusers.__version__ == "0.42.1", diffusers.__version__


def linears(model):
    return {n: (m.out_features, m.in_features) for n, m in model.named_modules()
            if isinstance(m, torch.nn.Linear)}


def make_adapter(rng, shapes, modules, rank, dtype):
    """{module: (A (rank, in), B (out, rank))}, random, rounded to the dtype
    the file stores (the reference runs on the rounded values)."""
    out = {}
    for m in modules:
        n_out, k_in = shapes[m]
        a = rng.standard_normal((rank, k_in)) / np.sqrt(k_in)
        b = rng.standard_normal((n_out, rank)) * (0.5 / np.sqrt(rank))
        out[m] = (torch.from_numpy(a).to(dtype), torch.from_numpy(b).to(dtype))
    return out


def save_ditd(path, ad, alpha=None):
    """Diffusers / PEFT names, with ditd's <module>.alpha when there is one."""
    t = {}
    for m, (a, b) in ad.items():
        t["transformer." + m + ".lora_A.weight"] = a.contiguous()
        t["transformer." + m + ".lora_B.weight"] = b.contiguous()
        if alpha is not None:
            t["transformer." + m + ".alpha"] = torch.tensor(alpha, dtype=a.dtype)
    save_file(t, str(path))


def diffusers_file(tmp, pipe_cls, name, ad, alpha):
    """The adapter as Diffusers saves it (float64; alpha in lora_adapter_metadata)."""
    sd = {m + s: t.to(torch.float64) for m, (a, b) in ad.items()
          for s, t in ((".lora_A.weight", a), (".lora_B.weight", b))}
    rank = next(iter(ad.values()))[0].shape[0]
    meta = {"r": rank, "lora_alpha": alpha if alpha is not None else rank,
            "target_modules": sorted(ad.keys())}
    d = Path(tmp) / name
    pipe_cls.save_lora_weights(d, transformer_lora_layers=sd,
                               transformer_lora_adapter_metadata=meta, weight_name="a.safetensors")
    return d / "a.safetensors"


def check_scaling(model, ads, uses):
    for n, w in uses:
        ad, alpha = ads[n]["tensors"], ads[n]["alpha"]
        m0 = next(iter(ad))
        rank = ad[m0][0].shape[0]
        got = float(model.get_submodule(m0).scaling[n])
        want = w * (alpha if alpha is not None else rank) / rank
        assert abs(got - want) < 1e-12, (n, got, want)


def rel(a, b):
    return float(np.abs(a - b).max() / np.abs(b).max())


# ------------------------------------------------------------------ SD3 ---

def sd3_pipe():
    d = SD3DIR / "sd35"
    tr = SD3Transformer2DModel.from_pretrained(d / "transformer", torch_dtype=torch.float64)
    sched = FlowMatchEulerDiscreteScheduler.from_pretrained(d / "scheduler")
    pipe = StableDiffusion3Pipeline(transformer=tr, scheduler=sched, vae=None, text_encoder=None,
                                    tokenizer=None, text_encoder_2=None, tokenizer_2=None,
                                    text_encoder_3=None, tokenizer_3=None)
    pipe.set_progress_bar_config(disable=True)
    return pipe, tr


def sd3_run(ads, files, uses, case, i):
    pipe, tr = sd3_pipe()
    for n, _ in uses:
        pipe.load_lora_weights(str(files[n]), adapter_name=n)
    if uses:
        pipe.set_adapters([n for n, _ in uses], adapter_weights=[w for _, w in uses])
        check_scaling(tr, ads, uses)
    exp = SD3DIR / "expected"
    ld = lambda k: torch.from_numpy(np.load(exp / case[k])[i:i + 1]).to(torch.float64)
    with torch.no_grad():
        lat = pipe(prompt_embeds=ld("prompt_embeds"), pooled_prompt_embeds=ld("pooled"),
                   negative_prompt_embeds=ld("negative_prompt_embeds"),
                   negative_pooled_prompt_embeds=ld("negative_pooled"),
                   height=case["height"], width=case["width"],
                   num_inference_steps=case["num_inference_steps"],
                   guidance_scale=case["guidance_scale"], latents=ld("noise"),
                   output_type="latent", return_dict=False)[0]
    assert lat.dtype == torch.float64
    return lat.numpy()


# ------------------------------------------------------------------ Wan ---

def wan_pipe(folder):
    d = WANDIR / folder
    tr = WanTransformer3DModel.from_pretrained(WANDIR / "wan21" / "transformer",
                                               torch_dtype=torch.float64)
    tr2 = None
    if folder == "wan22":
        tr2 = WanTransformer3DModel.from_pretrained(d / "transformer_2", torch_dtype=torch.float64)
    for t in (tr, tr2):  # _keep_in_fp32_modules: scale_shift_table kept f32 otherwise
        if t is not None:
            t.to(torch.float64)
    sched = UniPCMultistepScheduler.from_pretrained(WANDIR / "wan21" / "scheduler")
    vae = AutoencoderKLWan.from_pretrained(WANDIR / "wan21" / "vae", torch_dtype=torch.float64)
    mi = json.loads((d / "model_index.json").read_text())
    pipe = WanPipeline(tokenizer=None, text_encoder=None, transformer=tr, vae=vae, scheduler=sched,
                       transformer_2=tr2, boundary_ratio=mi.get("boundary_ratio"))
    pipe.set_progress_bar_config(disable=True)
    orig = pipe.prepare_latents

    def prepare_latents(*a, **k):  # keep the given latents float64 (WanPipeline casts to f32)
        lat = k.get("latents", a[-1] if a else None)
        return lat.to(torch.float64) if lat is not None else orig(*a, **k)
    pipe.prepare_latents = prepare_latents
    return pipe, tr, tr2


def wan_run(ads, files, uses, uses2, folder, case, i):
    """uses on transformer (load_lora_weights), uses2 on transformer_2
    (load_lora_weights(..., load_into_transformer_2=True)), adapter names
    suffixed _2 there; set_adapters over all of them."""
    pipe, tr, tr2 = wan_pipe(folder)
    for n, _ in uses:
        pipe.load_lora_weights(str(files[n]), adapter_name=n)
    for n, _ in uses2:
        pipe.load_lora_weights(str(files[n]), adapter_name=n + "_2", load_into_transformer_2=True)
    names = [n for n, _ in uses] + [n + "_2" for n, _ in uses2]
    if names:
        pipe.set_adapters(names, adapter_weights=[w for _, w in uses] + [w for _, w in uses2])
        check_scaling(tr, ads, uses)
        if uses2:
            check_scaling(tr2, {n + "_2": v for n, v in ads.items()},
                          [(n + "_2", w) for n, w in uses2])
    exp = WANDIR / "expected"
    ld = lambda k: torch.from_numpy(np.load(exp / case[k])[i:i + 1]).to(torch.float64)
    kw = dict(guidance_scale_2=case["guidance_scale_2"]) if "guidance_scale_2" in case else {}
    with torch.no_grad():
        lat = pipe(prompt_embeds=ld("prompt_embeds"),
                   negative_prompt_embeds=ld("negative_prompt_embeds"),
                   height=case["height"], width=case["width"], num_frames=case["num_frames"],
                   num_inference_steps=case["num_inference_steps"],
                   guidance_scale=case["guidance_scale"], latents=ld("noise"),
                   output_type="latent", return_dict=False, **kw)[0]
    assert lat.dtype == torch.float64
    return lat.numpy()


# ----------------------------------------------------------------- main ---

def main():
    torch.set_num_threads(2)
    torch.use_deterministic_algorithms(True)
    diffusers.utils.logging.set_verbosity_error()
    OUT.mkdir(parents=True, exist_ok=True)
    for f in list(OUT.glob("*.npy")) + list(OUT.glob("*.safetensors")):
        f.unlink()
    rng = np.random.default_rng(2626)
    cases, files = [], {}
    tmp = tempfile.TemporaryDirectory()

    # ---- SD3 (the tiny SD3.5: every kind of linear SD3 has)
    scases = {c["name"]: c for c in json.loads((SD3DIR / "expected" / "cases.json").read_text())["cases"]}
    sc = scases["sd35_32_batch2"]
    _, tr = sd3_pipe()
    sh = linears(tr)
    assert len(sh) == 36, len(sh)
    some = ["context_embedder", "time_text_embed.text_embedder.linear_1",
            "transformer_blocks.0.norm1.linear", "transformer_blocks.0.attn.to_k",
            "transformer_blocks.0.attn.add_v_proj", "transformer_blocks.0.attn2.to_q",
            "transformer_blocks.0.ff_context.net.0.proj", "transformer_blocks.1.norm1_context.linear",
            "transformer_blocks.1.attn.to_out.0", "transformer_blocks.1.ff.net.2", "proj_out"]
    s_ads = {"s4": {"tensors": make_adapter(rng, sh, sorted(sh), 4, torch.bfloat16), "alpha": None},
             "s8": {"tensors": make_adapter(rng, sh, some, 8, torch.float16), "alpha": ALPHA}}
    save_ditd(OUT / "sd3_r4_peft.safetensors", s_ads["s4"]["tensors"])
    save_ditd(OUT / "sd3_r8_some_alpha.safetensors", s_ads["s8"]["tensors"], ALPHA)
    files["sd3"] = {"s4": "sd3_r4_peft.safetensors", "s8": "sd3_r8_some_alpha.safetensors"}
    s_files = {n: diffusers_file(tmp.name, StableDiffusion3Pipeline, "sd3_" + n, v["tensors"],
                                 v["alpha"]) for n, v in s_ads.items()}
    s_base = [sd3_run(s_ads, s_files, [], sc, i) for i in range(2)]
    # sample 0's noise alone, for `ditd generate --latents` (tests/mpi/lora_sd3wan_group.py)
    np.save(OUT / "sd35_sample0_noise.npy",
            np.load(SD3DIR / "expected" / sc["noise"])[:1].astype("<f4"))

    def sd3_case(name, samples):
        outs = []
        for i, uses in enumerate(samples):
            o = sd3_run(s_ads, s_files, uses, sc, i)
            if uses:
                assert rel(o, s_base[i]) > 1e-2, (name, rel(o, s_base[i]))
            outs.append(o)
        np.save(OUT / f"{name}_out.npy", np.concatenate(outs).astype("<f8"))
        cases.append({"name": name, "family": "sd3", "folder": "sd35", "case": sc["name"],
                      "samples": [[{"adapter": n, "scale": w} for n, w in u] for u in samples],
                      "out": f"{name}_out.npy"})
        print(f"{name}: |lora - base| / |base| = "
              f"{[round(rel(outs[i], s_base[i]), 4) for i in range(len(samples))]}", file=sys.stderr)

    sd3_case("sd3_r4_s1", [[("s4", 1.0)]])
    sd3_case("sd3_r4_s05", [[("s4", 0.5)]])
    sd3_case("sd3_r4_sm1", [[("s4", -1.0)]])
    sd3_case("sd3_r8_some", [[("s8", 1.0)]])
    sd3_case("sd3_two", [[("s4", 0.5), ("s8", -1.0)]])
    sd3_case("sd3_batch_mixed", [[("s4", 1.0)], []])

    # ---- Wan 2.1 T2V, and Wan 2.2's two experts (the same config)
    wcases = {c["name"]: c for c in json.loads((WANDIR / "expected" / "cases.json").read_text())["cases"]}
    wc, w2c = wcases["wan_5f_32x32_batch2"], wcases["wan22_5f_32x48_experts"]
    _, tr, _ = wan_pipe("wan21")
    wsh = linears(tr)
    assert len(wsh) == 6 + 10 * tr.config.num_layers, len(wsh)
    wsome = ["condition_embedder.time_proj", "condition_embedder.text_embedder.linear_2",
             "blocks.0.attn1.to_q", "blocks.0.attn1.to_v", "blocks.0.attn2.to_k",
             "blocks.1.attn2.to_out.0", "blocks.1.ffn.net.0.proj", "proj_out"]
    w_ads = {"w4": {"tensors": make_adapter(rng, wsh, sorted(wsh), 4, torch.bfloat16), "alpha": None},
             "w8": {"tensors": make_adapter(rng, wsh, wsome, 8, torch.float16), "alpha": ALPHA}}
    save_ditd(OUT / "wan_r4_peft.safetensors", w_ads["w4"]["tensors"])
    save_ditd(OUT / "wan_r8_some_alpha.safetensors", w_ads["w8"]["tensors"], ALPHA)
    files["wan"] = {"w4": "wan_r4_peft.safetensors", "w8": "wan_r8_some_alpha.safetensors"}
    w_files = {n: diffusers_file(tmp.name, WanPipeline, "wan_" + n, v["tensors"], v["alpha"])
               for n, v in w_ads.items()}
    w_base = {}

    def wan_case(name, folder, c, samples, samples2=None):
        """samples: per sample the adapters on transformer; samples2 (Wan 2.2):
        on transformer_2 (None in the JSON: the same as on transformer)."""
        outs = []
        for i, uses in enumerate(samples):
            uses2 = samples2[i] if samples2 is not None else (uses if folder == "wan22" else [])
            key = (folder, c["name"], i)
            if key not in w_base:
                w_base[key] = wan_run(w_ads, w_files, [], [], folder, c, i)
            o = wan_run(w_ads, w_files, uses, uses2, folder, c, i)
            if uses or uses2:
                assert rel(o, w_base[key]) > 1e-2, (name, rel(o, w_base[key]))
            outs.append(o)
            print(f"{name}[{i}]: |lora - base| / |base| = {rel(o, w_base[key]):.4f}",
                  file=sys.stderr)
        np.save(OUT / f"{name}_out.npy", np.concatenate(outs).astype("<f8"))
        e = {"name": name, "family": "wan", "folder": folder, "case": c["name"],
             "samples": [[{"adapter": n, "scale": w} for n, w in u] for u in samples],
             "out": f"{name}_out.npy"}
        if samples2 is not None:
            e["samples_2"] = [[{"adapter": n, "scale": w} for n, w in u] for u in samples2]
        cases.append(e)

    wan_case("wan_r4_s1", "wan21", wc, [[("w4", 1.0)]])
    wan_case("wan_r4_s05", "wan21", wc, [[("w4", 0.5)]])
    wan_case("wan_r4_sm1", "wan21", wc, [[("w4", -1.0)]])
    wan_case("wan_r8_some", "wan21", wc, [[("w8", 1.0)]])
    wan_case("wan_two", "wan21", wc, [[("w4", 0.5), ("w8", -1.0)]])
    wan_case("wan_batch_mixed", "wan21", wc, [[("w8", 1.0)], []])
    wan_case("wan22_both_experts", "wan22", w2c, [[("w4", 1.0)]])
    wan_case("wan22_per_expert", "wan22", w2c, [[("w8", 1.0)]], [[("w4", 0.5)]])
    wan_case("wan22_transformer_only", "wan22", w2c, [[("w4", -1.0)]], [[]])

    # ---- Wan forwards with the image branch (Wan 2.1 I2V: image_embedder.ff, add_k/v_proj)
    # and with per-frame timesteps (TI2V: time_embedder / time_proj on B F rows): the committed
    # forward case 0 of tests/fixtures/wan/<m> (B 2), the adapter at 0.7 on both samples through
    # Diffusers' own load_lora_adapter + set_adapters (what load_lora_weights calls)
    fwd, flinears = [], {}
    for m in ("i2v21", "ti2v"):
        d = REPO / "tests" / "fixtures" / "wan" / m
        tr = WanTransformer3DModel.from_pretrained(d, torch_dtype=torch.float64).to(torch.float64)
        fsh = linears(tr)
        flinears[m] = sorted(fsh)
        ad = make_adapter(rng, fsh, sorted(fsh), 4, torch.bfloat16)
        fname = f"wan_{m}_r4_peft.safetensors"
        save_ditd(OUT / fname, ad)
        c0 = json.loads((d / "expected" / "cases.json").read_text())["forward"][0]
        ld = lambda k: torch.from_numpy(np.load(d / "expected" / c0[k])).to(torch.float64)
        x, text = ld("x"), ld("text")
        B, Fr, h, w = x.shape[0], x.shape[2], x.shape[3], x.shape[4]
        if c0.get("t_frames"):
            tf = ld("t_frames")
            timestep = tf[:, :, None].expand(B, Fr, (h // 2) * (w // 2)).reshape(B, -1)
        else:
            timestep = ld("t")
        image = ld("image") if c0.get("image") else None
        sd = {"transformer." + k + s: t.to(torch.float64) for k, (a, b) in ad.items()
              for s, t in ((".lora_A.weight", a), (".lora_B.weight", b))}
        tr.load_lora_adapter(sd, prefix="transformer", adapter_name="f4")
        tr.set_adapters(["f4"], weights=[0.7])
        assert abs(float(tr.get_submodule(flinears[m][0]).scaling["f4"]) - 0.7) < 1e-12
        with torch.no_grad():
            o = tr(hidden_states=x, timestep=timestep, encoder_hidden_states=text,
                   encoder_hidden_states_image=image, return_dict=False)[0]
        base = np.load(d / "expected" / c0["out"])
        r = rel(o.numpy()[0], base[0])
        assert r > 1e-2, (m, r)
        np.save(OUT / f"wan_{m}_forward_out.npy", o.numpy().astype("<f8"))
        fwd.append({"name": f"wan_{m}_forward", "model": m, "case": 0, "adapter": fname,
                    "scale": 0.7, "out": f"wan_{m}_forward_out.npy"})
        print(f"wan_{m}_forward: {len(fsh)} linears, |lora - base| / |base| = {r:.4f}",
              file=sys.stderr)

    # a shape that does not fit: blocks.0.attn1.to_q's A with 7 inputs
    d = wsh["blocks.0.attn1.to_q"][1]
    save_file({"transformer.blocks.0.attn1.to_q.lora_A.weight": torch.zeros(4, d + 1),
               "transformer.blocks.0.attn1.to_q.lora_B.weight": torch.zeros(wsh["blocks.0.attn1.to_q"][0], 4)},
              str(OUT / "wan_bad_shape.safetensors"))
    files["bad"] = {"wan_bad_shape": "wan_bad_shape.safetensors"}

    diffusers_copies(files, cases, s_files["s8"], w_files["w8"])
    doc = {"about": "tools/make_lora_sd3wan_fixtures.py: Diffusers 0.42 float64 final latents "
                    "with LoRA adapters on SD3 and Wan (load_lora_weights + set_adapters)",
           "linears": dict({"sd3": sorted(sh), "wan": sorted(wsh)}, **flinears),
           "forward": fwd,
           "adapters": files, "cases": cases}
    (OUT / "cases.json").write_text(json.dumps(doc, indent=1) + "\n")
    tmp.cleanup()
    print(f"{len(cases)} cases", file=sys.stderr)


def diffusers_copies(files, cases, sd3_file, wan_file):
    """The rank-8 adapters as Diffusers itself saved them (alpha only in the file's
    lora_adapter_metadata, no .alpha tensors, float64): ditd reads that metadata as
    load_lora_weights does, so the same final latents are the reference (cases
    *_r8_some_diffusers, the out of *_r8_some)."""
    shutil.copy(sd3_file, OUT / "sd3_r8_some_diffusers.safetensors")
    shutil.copy(wan_file, OUT / "wan_r8_some_diffusers.safetensors")
    files["sd3"]["s8d"] = "sd3_r8_some_diffusers.safetensors"
    files["wan"]["w8d"] = "wan_r8_some_diffusers.safetensors"
    for c in list(cases):
        if c["name"] in ("sd3_r8_some", "wan_r8_some"):
            d = json.loads(json.dumps(c))
            d["name"] = c["name"] + "_diffusers"
            for u in d["samples"]:
                for x in u:
                    x["adapter"] = x["adapter"] + "d"
            cases.append(d)


def only_copies():
    """--diffusers-copies-only: the two Diffusers-saved files from the committed
    rank-8 adapters (the same tensors), and their cases, without rerunning Diffusers."""
    doc = json.loads((OUT / "cases.json").read_text())
    tmp = tempfile.TemporaryDirectory()
    paths = []
    for fam, cls, key in (("sd3", StableDiffusion3Pipeline, "s8"), ("wan", WanPipeline, "w8")):
        sd = load_file(str(OUT / doc["adapters"][fam][key]))
        ad = {}
        for k, v in sd.items():
            if k.endswith(".lora_A.weight"):
                m = k[len("transformer."):-len(".lora_A.weight")]
                ad[m] = (v, sd[k.replace("lora_A", "lora_B")])
        paths.append(diffusers_file(tmp.name, cls, f"{fam}_{key}", ad, ALPHA))
    doc["cases"] = [c for c in doc["cases"] if not c["name"].endswith("_diffusers")]
    diffusers_copies(doc["adapters"], doc["cases"], *paths)
    (OUT / "cases.json").write_text(json.dumps(doc, indent=1) + "\n")
    tmp.cleanup()


if __name__ == "__main__":
    if sys.argv[1:] == ["--diffusers-copies-only"]:
        only_copies()
    else:
        main()
