#!/usr/bin/env python3
"""FluxKontextPipeline on a FLUX-shaped model: ditd beside Diffusers, same CPU, same inputs.

What it is: issue 23's Kontext benchmark. The model is FluxTransformer2DModel with FLUX.1-dev's
width (24 heads x 128 = 3072, MLP 12288, RoPE axes (16, 56, 56), guidance embedding) at reduced
depth (--double / --single blocks) and RANDOM weights (tools/bench_lora_flux.py's maker), in the
tiny FLUX.1-dev fixture folder (build/tests/golden/flux_pipeline/dev: its scheduler and text
widths) under a model_index.json naming FluxKontextPipeline. The request: a --size x --size output
(1024: 4096 noise tokens) with a --size x --size reference (4096 reference tokens) and --text-len
random text embeddings (512, FLUX.1-dev's T5), --steps steps at guidance 3.5. Both sides get the
same initial noise, the same reference latents (random, (1, 16, size/8, size/8): the VAE is left
out, both sides take the latents as they are: Diffusers' `image` of latent_channels channels) and
the same embeddings:

  ditd       build/tests/golden/kontext_eval (bench/kontext_eval.c): ditd's pipeline, float32,
             ditd_pipeline_set_reference + ditd_gen_sample.ref_latents;
  Diffusers  FluxKontextPipeline(image=latents, prompt_embeds=..., latents=packed noise),
             float32, output_type="latent".

ms per step is the median over the steps of the median round (Diffusers: callback_on_step_end's
clock), ms per request the whole loop (every step, the sampler; Diffusers: the pipe() call). Both
sides use --threads threads; --repeat rounds, interleaved; the median is reported. Also prints the
largest difference of ditd's final latents from Diffusers' (a check that both computed the same).

What it is not: a test; quality (random weights).

    /root/ditd-venv/bin/python tools/bench_kontext_flux.py [--size 1024] [--steps 2] [--threads 2]
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from diffusers import FlowMatchEulerDiscreteScheduler, FluxKontextPipeline, FluxPipeline
from diffusers import FluxTransformer2DModel
from diffusers.utils import logging as dlog

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_lora_flux import make_model  # noqa: E402  (the FLUX-shaped random transformer)

dlog.set_verbosity_error()
ROOT = Path(__file__).resolve().parent.parent
EXE = ROOT / "build" / "tests" / "golden" / "kontext_eval"


def ditd_rounds(model, inputs, steps, repeat, threads):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads))
    tmp = tempfile.mkdtemp(prefix="ditd-bench-kontext-")
    out = subprocess.run([str(EXE), str(model), str(inputs), f"{tmp}/out.npy", str(steps), "3.5",
                          str(repeat)], check=True, capture_output=True, text=True, env=env)
    runs = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    lat = np.load(f"{tmp}/out.npy")
    shutil.rmtree(tmp, ignore_errors=True)
    return runs, lat


def diffusers_round(pipe, emb, pooled, noise, ref, size, steps):
    C, h = noise.shape[1], noise.shape[2]
    packed = FluxPipeline._pack_latents(torch.from_numpy(noise), 1, C, h, h)
    marks = []

    def cb(p, i, t, kw):
        marks.append(time.perf_counter())
        return {}

    t0 = time.perf_counter()
    with torch.no_grad():
        lat = pipe(image=torch.from_numpy(ref), prompt_embeds=torch.from_numpy(emb),
                   pooled_prompt_embeds=torch.from_numpy(pooled), height=size, width=size,
                   max_area=size * size, num_inference_steps=steps, guidance_scale=3.5, latents=packed,
                   output_type="latent", callback_on_step_end=cb, return_dict=False)[0]
    wall = time.perf_counter() - t0
    # the first step's clock starts at the call (its preparation: a few ms against seconds)
    step_s = [b - a for a, b in zip([t0] + marks[:-1], marks)]
    return wall, step_s, FluxPipeline._unpack_latents(lat, size, size, 8).numpy()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--heads", type=int, default=24)
    ap.add_argument("--double", type=int, default=1)
    ap.add_argument("--single", type=int, default=1)
    ap.add_argument("--text-len", type=int, default=512)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--work", default="/tmp/ditd-bench-kontext")
    a = ap.parse_args()
    if not EXE.exists():
        raise SystemExit(f"build first: {EXE}")
    torch.set_num_threads(a.threads)
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    model = work / "model"
    tr, fx = make_model(model, a.heads, a.double, a.single, 0)
    mi = json.loads((model / "model_index.json").read_text())
    mi["_class_name"] = "FluxKontextPipeline"
    (model / "model_index.json").write_text(json.dumps(mi, indent=2))
    rng = np.random.default_rng(1)
    lh = a.size // 8
    inputs = work / "inputs"
    inputs.mkdir(exist_ok=True)
    noise = rng.standard_normal((1, 16, lh, lh)).astype(np.float32)
    ref = rng.standard_normal((1, 16, lh, lh)).astype(np.float32)
    emb = rng.standard_normal((1, a.text_len, fx["joint_attention_dim"])).astype(np.float32)
    pooled = rng.standard_normal((1, fx["pooled_projection_dim"])).astype(np.float32)
    for n, v in (("noise", noise), ("ref", ref), ("emb", emb), ("pooled", pooled)):
        np.save(inputs / f"{n}.npy", v)
    tokens = (a.size // 16) ** 2
    pipe = FluxKontextPipeline(
        scheduler=FlowMatchEulerDiscreteScheduler.from_pretrained(model / "scheduler"), vae=None,
        text_encoder=None, tokenizer=None, text_encoder_2=None, tokenizer_2=None,
        transformer=FluxTransformer2DModel.from_pretrained(model / "transformer",
                                                           torch_dtype=torch.float32))
    pipe.set_progress_bar_config(disable=True)
    del tr
    d_wall, d_step, f_wall, f_step = [], [], [], []
    d_lat = f_lat = None
    for _ in range(a.repeat):  # interleaved: load on a shared machine falls on both alike
        runs, d_lat = ditd_rounds(model, inputs, a.steps, 1, a.threads)
        d_wall.append(runs[0]["wall_s"])
        d_step.append(statistics.median(runs[0]["steps_s"]))
        w, s, f_lat = diffusers_round(pipe, emb, pooled, noise, ref, a.size, a.steps)
        f_wall.append(w)
        f_step.append(statistics.median(s))
    err = float(np.abs(d_lat - f_lat).max() / max(np.abs(f_lat).max(), 1e-30))
    print(f"# FluxKontextPipeline, FLUX-shaped transformer: {a.heads} heads x 128, {a.double} double "
          f"+ {a.single} single blocks, random weights; {a.size}x{a.size} output + {a.size}x{a.size} "
          f"reference: {tokens} noise + {tokens} reference + {a.text_len} text tokens; {a.steps} "
          f"steps; {a.threads} threads; median of {a.repeat}")
    print("| side | ms / step | ms / request | Diffusers / ditd | latents ditd vs Diffusers |")
    print("| --- | --- | --- | --- | --- |")
    ds, dw = statistics.median(d_step) * 1e3, statistics.median(d_wall) * 1e3
    fs, fw = statistics.median(f_step) * 1e3, statistics.median(f_wall) * 1e3
    print(f"| ditd | {ds:.0f} | {dw:.0f} | | {err:.2e} |")
    print(f"| Diffusers | {fs:.0f} | {fw:.0f} | {fw / dw:.2f} | |")


if __name__ == "__main__":
    main()
