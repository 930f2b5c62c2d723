#!/usr/bin/env python3
"""LoRA adapters on a FLUX-shaped model: ditd beside Diffusers, same CPU, same inputs.

What it is: issue 26's benchmark. The model is FluxTransformer2DModel with FLUX.1-dev's width
(24 heads x 128 = 3072, MLP 12288, RoPE axes (16, 56, 56), guidance embedding, 64 packed input
channels) at reduced depth (--double / --single blocks) and RANDOM weights (torch's default
init, seed 0); the text width and the scheduler come from the tiny FLUX.1-dev fixture
(build/tests/golden/flux_pipeline/dev), the text is --text-len random embeddings (512 as
FLUX.1-dev's T5). Adapters are random PEFT files (Diffusers' names, `transformer.` prefix) of
rank 16 and 64 on every linear a FLUX LoRA trainer targets in the blocks (attention q/k/v/out
and the context ones, both MLPs, proj_mlp / proj_out, the adaLN linears). For each rank it times
one denoising step at --size x --size (1024: 4096 image + 512 text tokens):

  base         no adapter;
  one          one adapter, unmerged;
  two          two adapters on the same image, unmerged;
  batch4       four images, each with its own adapter: ditd runs them as ONE batch (rows
               carry different adapters); Diffusers cannot mix adapters in a batch, so it runs
               the four images one after another, set_adapters switching between them;
  merged       the same adapter as `one`, merged into the weights (W + B A, a folder of its
               own): the floor an unmerged adapter is measured against.

  ditd       build/tests/golden/lora_eval_text (bench/lora_eval_text.c): ditd's pipeline,
             float32, the adapters through ditd_lora (engine/models/lora.h);
  Diffusers  FluxPipeline.load_lora_weights + set_adapters, float32, output_type="latent".

Both sides use --threads threads. Every case runs --repeat rounds, interleaved within a round;
the median is reported. Also prints the largest difference of ditd's final latents from
Diffusers' (the same case), a check that both computed the same thing.

What it is not: a test; quality (random weights and adapters).

    /root/ditd-venv/bin/python tools/bench_lora_flux.py [--size 1024] [--ranks 16 64] [--repeat 1]
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from diffusers import FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel
from diffusers.utils import logging as dlog
from safetensors.torch import save_file

dlog.set_verbosity_error()  # PEFT's "missing keys" of the other adapters, the text-encoder notes

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "build" / "tests" / "golden" / "flux_pipeline" / "dev"
EXE = ROOT / "build" / "tests" / "golden" / "lora_eval_text"
NAMES = "abcd"


def targets(tr):
    """(module name, out, in) of every block linear an adapter takes here."""
    out = []
    for name, mod in tr.named_modules():
        if not isinstance(mod, torch.nn.Linear):
            continue
        if name.startswith(("transformer_blocks.", "single_transformer_blocks.")):
            out.append((name, mod.out_features, mod.in_features))
    return out


def make_model(out, heads, double, single, seed):
    """The fixture's folder with a FLUX-shaped random transformer (returned, float32)."""
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(FIXTURE, out, ignore=shutil.ignore_patterns("transformer"))
    fx = json.loads((FIXTURE / "transformer" / "config.json").read_text())
    torch.manual_seed(seed)
    tr = FluxTransformer2DModel(patch_size=1, in_channels=64, num_layers=double,
                                num_single_layers=single, attention_head_dim=128,
                                num_attention_heads=heads,
                                joint_attention_dim=fx["joint_attention_dim"],
                                pooled_projection_dim=fx["pooled_projection_dim"],
                                guidance_embeds=True, axes_dims_rope=(16, 56, 56))
    tr.save_pretrained(out / "transformer")
    return tr, fx


def make_adapter(path, mods, rank, seed):
    """A random PEFT-named adapter (alpha = rank: scale 1); its tensors, by module."""
    g = torch.Generator().manual_seed(seed)
    sd, ab = {}, {}
    for name, n, k in mods:
        a = torch.randn(rank, k, generator=g) / k ** 0.5
        b = torch.randn(n, rank, generator=g) * (0.02 / rank ** 0.5)
        sd[f"transformer.{name}.lora_A.weight"] = a.contiguous()
        sd[f"transformer.{name}.lora_B.weight"] = b.contiguous()
        ab[name] = (a, b)
    save_file(sd, str(path))
    return ab


def make_merged(base_dir, out, tr, ab):
    """base_dir's folder with the adapter ab merged into a copy of tr's weights."""
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(base_dir, out, ignore=shutil.ignore_patterns("transformer"))
    sd = {k: v.clone() for k, v in tr.state_dict().items()}
    for name, (a, b) in ab.items():
        sd[f"{name}.weight"] += b @ a
    m = FluxTransformer2DModel.from_config(tr.config)
    m.load_state_dict(sd)
    m.save_pretrained(out / "transformer")
    del m, sd


def ditd_run(model, inputs, repeat, threads, loras, specs):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads))
    tmp = tempfile.mkdtemp(prefix="ditd-bench-lora-")
    cmd = [str(EXE), str(model), str(inputs), f"{tmp}/run", "1", "3.5", str(repeat)]
    for name, path in loras:
        cmd += ["--lora", f"{name}={path}"]
    out = subprocess.run(cmd + specs, check=True, capture_output=True, text=True, env=env)
    runs = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert len(runs) == len(specs), out.stderr
    for r in runs:
        r["latents"] = np.load(r["file"])
    shutil.rmtree(tmp, ignore_errors=True)
    return runs


def diffusers_pipe(model):
    tr = FluxTransformer2DModel.from_pretrained(model / "transformer", torch_dtype=torch.float32)
    sched = FlowMatchEulerDiscreteScheduler.from_pretrained(model / "scheduler")
    pipe = FluxPipeline(scheduler=sched, vae=None, text_encoder=None, tokenizer=None,
                        text_encoder_2=None, tokenizer_2=None, transformer=tr)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def diffusers_image(pipe, emb, pooled, noise, i, size):
    """Image i, one step: (seconds, final latents (C, h, w))."""
    N, C, h, w = noise.shape
    packed = FluxPipeline._pack_latents(torch.from_numpy(noise[i:i + 1]), 1, C, h, w)
    t0 = time.perf_counter()
    with torch.no_grad():
        lat = pipe(prompt_embeds=torch.from_numpy(emb[i:i + 1]),
                   pooled_prompt_embeds=torch.from_numpy(pooled[i:i + 1]), height=size,
                   width=size, num_inference_steps=1, guidance_scale=3.5, latents=packed,
                   output_type="latent", return_dict=False)[0]
    return time.perf_counter() - t0, FluxPipeline._unpack_latents(lat, size, size, 8).numpy()[0]


def diffusers_cases(pipe, emb, pooled, noise, size, repeat, adapters):
    """{case: ([seconds per round], latents (n, C, h, w))} for the unmerged cases."""
    secs = {c: [] for c in ("base", "one", "two", "batch4")}
    lats = {}
    for _ in range(repeat):
        pipe.disable_lora()
        t, l0 = diffusers_image(pipe, emb, pooled, noise, 0, size)
        secs["base"].append(t)
        lats["base"] = l0[None]
        pipe.enable_lora()
        pipe.set_adapters([adapters[0]], adapter_weights=[1.0])
        t, l1 = diffusers_image(pipe, emb, pooled, noise, 0, size)
        secs["one"].append(t)
        lats["one"] = l1[None]
        pipe.set_adapters(adapters[:2], adapter_weights=[1.0, 1.0])
        t, l2 = diffusers_image(pipe, emb, pooled, noise, 0, size)
        secs["two"].append(t)
        lats["two"] = l2[None]
        tot, outs = 0.0, []
        for i, name in enumerate(adapters):
            pipe.set_adapters([name], adapter_weights=[1.0])
            t, li = diffusers_image(pipe, emb, pooled, noise, i, size)
            tot += t
            outs.append(li)
        secs["batch4"].append(tot)
        lats["batch4"] = np.stack(outs)
    return secs, lats


def rel(a, b):
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--ranks", type=int, nargs="+", default=[16, 64])
    ap.add_argument("--heads", type=int, default=24)
    ap.add_argument("--double", type=int, default=1)
    ap.add_argument("--single", type=int, default=1)
    ap.add_argument("--text-len", type=int, default=512)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--work", default="/tmp/ditd-bench-lora")
    a = ap.parse_args()
    if not EXE.exists() or not FIXTURE.exists():
        raise SystemExit(f"build first: {EXE} and {FIXTURE}")
    torch.set_num_threads(a.threads)
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    model = work / "model"
    tr, fx = make_model(model, a.heads, a.double, a.single, 0)
    mods = targets(tr)
    rng = np.random.default_rng(1)
    lh = a.size // 8
    inputs = work / "inputs"
    inputs.mkdir(exist_ok=True)
    noise = rng.standard_normal((4, 16, lh, lh)).astype(np.float32)
    emb = rng.standard_normal((4, a.text_len, fx["joint_attention_dim"])).astype(np.float32)
    pooled = rng.standard_normal((4, fx["pooled_projection_dim"])).astype(np.float32)
    np.save(inputs / "noise.npy", noise)
    np.save(inputs / "emb.npy", emb)
    np.save(inputs / "pooled.npy", pooled)
    tokens = (a.size // 16) ** 2
    print(f"# FLUX-shaped transformer: {a.heads} heads x 128, {a.double} double + {a.single} "
          f"single blocks, random weights; {a.size}x{a.size}: {tokens} image + {a.text_len} text "
          f"tokens; {len(mods)} adapted linears; one step; {a.threads} threads; "
          f"median of {a.repeat}; OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', '(unset)')}")
    rows = []
    for r in a.ranks:
        files, abs_ = [], []
        for j, n in enumerate(NAMES):
            p = work / f"r{r}_{n}.safetensors"
            abs_.append(make_adapter(p, mods, r, 100 * r + j))
            files.append((n, str(p)))
        merged = work / f"merged_r{r}"
        make_merged(model, merged, tr, abs_[0])
        specs = ["-", "a", "a+b", "a;b;c;d"]
        d = ditd_run(model, inputs, a.repeat, a.threads, files, specs)
        dm = ditd_run(merged, inputs, a.repeat, a.threads, [], ["-"])[0]
        pipe = diffusers_pipe(model)
        for n, p in files:
            pipe.load_lora_weights(p, adapter_name=n)
        dsec, dlat = diffusers_cases(pipe, emb, pooled, noise, a.size, a.repeat, list(NAMES))
        del pipe
        mpipe = diffusers_pipe(merged)
        msec, mlat = [], None
        for _ in range(a.repeat):
            t, mlat = diffusers_image(mpipe, emb, pooled, noise, 0, a.size)
            msec.append(t)
        del mpipe
        shutil.rmtree(merged, ignore_errors=True)
        for case, run in zip(("base", "one", "two", "batch4"), d):
            rows.append((r, case, statistics.median(run["wall_s"]), statistics.median(dsec[case]),
                         rel(run["latents"], dlat[case])))
        rows.append((r, "merged", statistics.median(dm["wall_s"]), statistics.median(msec),
                     rel(dm["latents"][0], mlat)))
    base = {r: (ds, fs) for r, c, ds, fs, _ in rows if c == "base"}
    print("| rank | case | ditd s | ditd vs its base | Diffusers s | Diffusers vs its base "
          "| Diffusers / ditd | latents ditd vs Diffusers |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r, c, ds, fs, e in rows:
        b = base[r]
        print(f"| {r} | {c} | {ds:.2f} | {ds / b[0]:.3f} | {fs:.2f} | {fs / b[1]:.3f} "
              f"| {fs / ds:.2f} | {e:.2e} |")


if __name__ == "__main__":
    main()
