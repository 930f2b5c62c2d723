#!/usr/bin/env python3
"""Build the preview fixtures: what a preview of Diffusers' FluxPipeline is, in float64, on the
tiny FLUX.1 folders of tests/fixtures/flux_pipeline (tests/fixtures/flux_previews/).

What it is: a script that assembles the dev and schnell folders exactly as the build does
(tests/fixtures/tokenizers/unpack.py, tests/fixtures/flux_pipeline/assemble.py), loads them with
FluxPipeline.from_pretrained(folder, torch_dtype=torch.float64) and runs the cases of CASES from
ditd's noise (latents= packed from engine/core/philox.h's normals: image b's (16, h, w) is
ditd_philox_normal(seed, b, 0, 16 h w), so the C test runs from the seed alone). A forward hook on
the transformer captures, at every step, its input (the latents before the step) and its output
(the velocity, after guidance: the dev cases run no true CFG, so one forward a step);
callback_on_step_end marks the step. At every step i the prediction of the clean latents is what
FlowMatchEulerDiscreteScheduler's Euler step implies, in float64:

    x0 = sample - sigma_i * model_output        (sigma_i = scheduler.sigmas[i])

unpacked to (B, 16, h, w), unscaled as the pipeline unscales its final latents
(x0 / scaling_factor + shift_factor), decoded by the pipeline's VAE and mapped by its
image_processor.postprocess(output_type="np"), then (x 255).round() to uint8.

Writes tests/fixtures/flux_previews/expected/cases.json and per case <name>_x0.npy
((steps, B, 16, h, w) float32, the float64 values rounded once) and <name>_x0_u8.npy
((steps, B, H, W, 3) uint8): every step's x0 and its image, so a test can check any preview
schedule (ditd's at partial_images 1..3 picks some of these steps).

What it is not: part of the build or the tests. Re-run only when a fixture must change:

    python tools/make_flux_preview_fixtures.py [--out tests/fixtures/flux_previews]

It rewrites expected/; re-running gives identical files.
"""

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
import transformers

import diffusers
from diffusers import FluxPipeline

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_flux_fixtures import pack  # noqa: E402  (FluxPipeline's 2x2 packing)
from make_sampler_fixtures import philox_normal  # noqa: E402  (engine/core/philox.h in Python)

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "tests" / "fixtures" / "flux_previews"
FLUX = REPO / "tests" / "fixtures" / "flux_pipeline"
UNPACK = REPO / "tests" / "fixtures" / "tokenizers" / "unpack.py"

# name, folder, prompt, height, width, steps, guidance_scale, max_sequence_length,
# num_images_per_prompt, seed
CASES = [
    ("dev_32x48_8steps", "dev", "a lighthouse on a cliff at dusk, oil painting", 32, 48, 8, 3.5, 77, 1, 31),
    ("dev_48x32_batch2", "dev", "Crème brûlée in São Paulo, 東京 🍮", 48, 32, 6, 3.5, 77, 2, 32),
    ("schnell_32_4steps", "schnell", "a cozy cabin in the snow", 32, 32, 4, 0.0, 77, 1, 33),
]


def philox(seed, sample, n):
    return np.array(philox_normal(seed, sample, 0, n), dtype=np.uint32).view(np.float32)


def write_json(path, obj):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n")


def npy(exp, name, a, dtype=np.float32):
    if isinstance(a, torch.Tensor):
        a = a.detach().cpu().numpy()
    np.save(exp / name, np.ascontiguousarray(np.asarray(a).astype(dtype)))
    return name


def make_case(pipe, exp, case):
    name, folder, prompt, H, W, steps, gs, msl, B, seed = case
    vsf = pipe.vae_scale_factor
    h, w = H // vsf, W // vsf
    assert h * vsf == H and w * vsf == W and h % 2 == 0 and w % 2 == 0, name
    n = 16 * h * w
    noise = np.stack([philox(seed, b, n).reshape(16, h, w) for b in range(B)])
    latents = pack(torch.from_numpy(noise).to(torch.float64))

    seen = {"io": [], "steps": []}

    def hook(mod, args, kwargs, out):
        seen["io"].append((kwargs["hidden_states"].clone(), out[0].clone()))

    def on_step(p, i, t, kw):
        seen["steps"].append(i)
        return {}

    handle = pipe.transformer.register_forward_hook(hook, with_kwargs=True)
    try:
        with torch.no_grad():
            pipe(prompt=prompt, height=H, width=W, num_inference_steps=steps, guidance_scale=gs,
                 max_sequence_length=msl, num_images_per_prompt=B, latents=latents,
                 output_type="latent", callback_on_step_end=on_step, return_dict=False)
    finally:
        handle.remove()
    assert seen["steps"] == list(range(steps)) and len(seen["io"]) == steps, name
    sigmas = pipe.scheduler.sigmas.to(torch.float64)
    cfg = pipe.vae.config
    x0s, imgs = [], []
    for i, (x, v) in enumerate(seen["io"]):
        assert x.dtype == torch.float64 and v.dtype == torch.float64
        x0 = x - sigmas[i] * v  # the flow Euler step's clean prediction, float64
        x0 = FluxPipeline._unpack_latents(x0, H, W, vsf)
        with torch.no_grad():
            z = x0 / cfg.scaling_factor + cfg.shift_factor
            img = pipe.vae.decode(z, return_dict=False)[0]
            img = pipe.image_processor.postprocess(img, output_type="np")
        x0s.append(x0)
        imgs.append((img * 255).round().astype(np.uint8))
    p = f"{name}_"
    entry = dict(name=name, folder=folder, prompt=prompt, height=H, width=W, num_inference_steps=steps,
                 guidance_scale=gs, max_sequence_length=msl, batch=B, seed=seed, latent_height=h,
                 latent_width=w, x0=npy(exp, p + "x0.npy", torch.stack(x0s)),
                 x0_u8=npy(exp, p + "x0_u8.npy", np.stack(imgs), np.uint8))
    print(f"{name}: B={B} {H}x{W} latent {h}x{w}: {steps} steps' x0 and images")
    return entry


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args()
    torch.set_num_threads(2)
    torch.use_deterministic_algorithms(True)
    transformers.logging.set_verbosity_error()
    diffusers.utils.logging.set_verbosity_error()
    diffusers.utils.logging.disable_progress_bar()
    exp = args.out / "expected"
    shutil.rmtree(exp, ignore_errors=True)
    exp.mkdir(parents=True)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        subprocess.run([sys.executable, str(UNPACK), str(tmp / "tok"), str(tmp / "tok.stamp")], check=True)
        subprocess.run([sys.executable, str(FLUX / "assemble.py"), str(tmp / "tok"), str(tmp / "pipes"),
                        str(tmp / "pipes.stamp")], check=True)
        pipes = {}
        for name in ("dev", "schnell"):
            pipe = FluxPipeline.from_pretrained(tmp / "pipes" / name, torch_dtype=torch.float64)
            pipe.set_progress_bar_config(disable=True)
            for m in (pipe.transformer, pipe.vae, pipe.text_encoder, pipe.text_encoder_2):
                assert all(t.dtype == torch.float64 for t in m.parameters())
            pipes[name] = pipe
        cases = [make_case(pipes[c[1]], exp, c) for c in CASES]
    meta = dict(diffusers=diffusers.__version__, transformers=transformers.__version__,
                torch=torch.__version__, compute="float64", stored="float32 (u8 arrays uint8)",
                x0="sample - sigma_i * model_output (FlowMatchEulerDiscreteScheduler)", cases=cases)
    write_json(exp / "cases.json", meta)
    print(f"{len(cases)} cases -> {exp}")


if __name__ == "__main__":
    main()
