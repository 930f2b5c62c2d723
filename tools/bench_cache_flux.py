#!/usr/bin/env python3
"""Step caching on a FLUX-shaped model: ditd beside Diffusers' hooks, same CPU, same inputs.

What it is: the FLUX rows of issue 24's benchmark. The model is FluxTransformer2DModel with
FLUX.1-dev's block structure (double-stream blocks, then single-stream blocks, joint
attention, head_dim 128 with RoPE axes (16, 56, 56), guidance embedding, 64 packed input
channels) at reduced width and depth (--heads heads, --double / --single blocks) and RANDOM
weights (torch's default init, seed 0): its timings are FLUX's arithmetic at a small size, its
skip decisions are those of random weights, not of the trained model. Text conditioning is
random prompt embeddings (T5 width of the tiny fixture, 6) given to both sides; the scheduler,
the VAE (for the PSNR / SSIM images) and the text encoders' folders come from the tiny
FLUX.1-dev fixture (build/tests/golden/flux_pipeline/dev). For 28 and 50 steps and each method
(none; First Block Cache; MagCache with Diffusers' FLUX_MAG_RATIOS, interpolated to the step
count as the hook does, its other fields Diffusers' defaults; TaylorSeer with Diffusers'
default config, which hooks every block's attn) it runs the same images:

  ditd       build/tests/golden/cache_eval_text (bench/cache_eval_text.c): ditd's pipeline,
             float32, one image per batch; and the same under ulysses 2
             (mpirun -np 2 ... --ulysses 2: the engine path of
             `mpirun -np 2 ditd generate --ulysses-degree 2`);
  Diffusers  FluxPipeline with transformer.enable_cache(<the same config>), float32,
             output_type="latent", the hooks' state reset between images.

One thread per process (ulysses 2: two processes). Every method's images are timed --repeat
rounds, the methods interleaved within a round, and the median round is reported, so load on
a shared machine falls on every method alike and the speed-ups are ratios measured in one run.
Prints per row: steps skipped, median wall seconds of the denoising loops and the speed-up over
that side's uncached run, PSNR and SSIM of the decoded 8-bit images against that side's
uncached images, and ditd's images against Diffusers' (the same method); CPU-time speed-ups
too (what a shared machine measures more fairly). Under ulysses 2 it
also gives the largest difference of the final latents from one rank's.

What it is not: a test; a quality measure (random weights: that is tools/eval_cache.py on the
trained fashion-dit).

    /root/ditd-venv/bin/python tools/bench_cache_flux.py [--steps 28 50] [--n 2] [--repeat 3]
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

TOOLS = Path(__file__).resolve().parent
REPO = TOOLS.parent
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, str(TOOLS))
import make_cache_fixtures as mcf  # noqa: E402  (instrument, LOG: the hooks' decisions)
from bench_cache import psnr, ssim  # noqa: E402
from diffusers import (AutoencoderKL, FirstBlockCacheConfig, FlowMatchEulerDiscreteScheduler,  # noqa: E402
                       FluxPipeline, FluxTransformer2DModel, MagCacheConfig,
                       TaylorSeerCacheConfig)
from diffusers.hooks import mag_cache as mag_mod  # noqa: E402
from diffusers.hooks.hooks import HookRegistry  # noqa: E402

FIXTURE = REPO / "build" / "tests" / "golden" / "flux_pipeline" / "dev"
EXE = REPO / "build" / "tests" / "golden" / "cache_eval_text"
FBC_THRESHOLD = 0.4  # random weights: their first-block residual changes 0.32..0.51 a step


def methods(steps):
    """(name, ditd spec, Diffusers config or None)"""
    return [
        ("none", "none", None),
        (f"first_block_cache:threshold={FBC_THRESHOLD}", f"first_block_cache:threshold={FBC_THRESHOLD}",
         FirstBlockCacheConfig(threshold=FBC_THRESHOLD)),
        (f"mag_cache:mag_ratios=FLUX,num_inference_steps={steps}",
         f"mag_cache:mag_ratios=FLUX,num_inference_steps={steps}",
         MagCacheConfig(mag_ratios=mag_mod.FLUX_MAG_RATIOS, num_inference_steps=steps)),
        ("taylorseer_cache (Diffusers' defaults)", "taylorseer_cache", TaylorSeerCacheConfig()),
    ]


def make_model(out, heads, double, single, seed):
    """The fixture's folder with a FLUX-shaped random transformer."""
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
    return fx


def ditd_run(model, inputs, steps, guidance, repeat, specs, ranks=1):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    tmp = tempfile.mkdtemp(prefix="ditd-bench-flux-")
    cmd = [str(EXE), str(model), str(inputs), f"{tmp}/run", str(steps), str(guidance), str(repeat)]
    if ranks > 1:
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                   OMPI_MCA_btl_vader_single_copy_mechanism="none",
                   OMPI_MCA_rmaps_base_oversubscribe="1")
        cmd = ["mpirun", "--oversubscribe", "-np", str(ranks)] + cmd + ["--ulysses", str(ranks)]
    out = subprocess.run(cmd + specs, check=True, capture_output=True, text=True, env=env)
    runs = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert len(runs) == len(specs), out.stderr
    for r in runs:
        r["latents"] = np.load(r["file"])
    return runs


def diffusers_pipe(model):
    tr = FluxTransformer2DModel.from_pretrained(model / "transformer", torch_dtype=torch.float32)
    sched = FlowMatchEulerDiscreteScheduler.from_pretrained(model / "scheduler")
    pipe = FluxPipeline(scheduler=sched, vae=None, text_encoder=None, tokenizer=None,
                        text_encoder_2=None, tokenizer_2=None, transformer=tr)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def skipped_steps(log, steps):
    """Steps at which the hooks ran no block (TaylorSeer: predicted every hooked module)."""
    for kind in ("fbc", "mag", "tay"):
        rows = [ok for k, _, ok in log if k == kind]
        if rows:
            per = len(rows) // steps
            assert per * steps == len(rows), (kind, len(rows), steps)
            return sum(not any(rows[s * per:(s + 1) * per]) for s in range(steps))
    return 0


def diffusers_round(pipe, emb, pooled, noise, steps, guidance, H, W):
    """Every image once: seconds of the pipeline calls, final latents (N, C, h, w), steps
    skipped."""
    N, C, h, w = noise.shape
    registry = HookRegistry.check_if_exists_or_initialize(pipe.transformer)
    outs, secs, cpu, skipped = [], 0.0, 0.0, 0
    for i in range(N):
        registry.reset_stateful_hooks()
        mcf.LOG.clear()
        packed = FluxPipeline._pack_latents(torch.from_numpy(noise[i:i + 1]), 1, C, h, w)
        t0, c0 = time.perf_counter(), time.process_time()
        with torch.no_grad():
            lat = pipe(prompt_embeds=torch.from_numpy(emb[i:i + 1]),
                       pooled_prompt_embeds=torch.from_numpy(pooled[i:i + 1]), height=H, width=W,
                       num_inference_steps=steps, guidance_scale=guidance, latents=packed,
                       output_type="latent", return_dict=False)[0]
        secs += time.perf_counter() - t0
        cpu += time.process_time() - c0
        skipped += skipped_steps(mcf.LOG, steps)
        outs.append(FluxPipeline._unpack_latents(lat, H, W, 8).numpy()[0])
    return secs, cpu, np.stack(outs), skipped


def decode(vae, lat):
    """8-bit images (N, 3, H, W) as FluxPipeline decodes latents"""
    with torch.no_grad():
        x = torch.from_numpy(lat.astype(np.float32))
        x = x / vae.config.scaling_factor + vae.config.shift_factor
        img = vae.decode(x, return_dict=False)[0]
    v = (img / 2 + 0.5).clamp(0, 1)
    return (v * 255).round().to(torch.uint8).numpy()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, nargs="+", default=[28, 50])
    ap.add_argument("--n", type=int, default=2, help="images")
    ap.add_argument("--size", type=int, default=256, help="image side in pixels")
    ap.add_argument("--text-len", type=int, default=128)
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--double", type=int, default=4)
    ap.add_argument("--single", type=int, default=8)
    ap.add_argument("--guidance", type=float, default=3.5)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--no-ulysses", action="store_true")
    ap.add_argument("--json")
    a = ap.parse_args()
    torch.set_num_threads(1)
    mcf.instrument()
    tmp = Path(tempfile.mkdtemp(prefix="ditd-bench-flux-"))
    model = tmp / "model"
    fx = make_model(model, a.heads, a.double, a.single, 0)
    rng = np.random.default_rng(0)
    h = w = a.size // 8
    noise = rng.standard_normal((a.n, 16, h, w)).astype(np.float32)
    emb = rng.standard_normal((a.n, a.text_len, fx["joint_attention_dim"])).astype(np.float32)
    pooled = rng.standard_normal((a.n, fx["pooled_projection_dim"])).astype(np.float32)
    inputs = tmp / "in"
    inputs.mkdir()
    for k, v in (("noise", noise), ("emb", emb), ("pooled", pooled)):
        np.save(inputs / f"{k}.npy", v)
    vae = AutoencoderKL.from_pretrained(model / "vae", torch_dtype=torch.float32)
    load = os.getloadavg()
    results = []
    for steps in a.steps:
        ms = methods(steps)
        specs = [m[1] for m in ms]
        d1 = ditd_run(model, inputs, steps, a.guidance, a.repeat, specs)
        du = None if a.no_ulysses else ditd_run(model, inputs, steps, a.guidance, a.repeat, specs, 2)
        pipes = [diffusers_pipe(model) for _ in ms]
        for p, (_, _, cfg) in zip(pipes, ms):
            if cfg is not None:
                p.transformer.enable_cache(cfg)
        hsecs, hcpu = [[] for _ in ms], [[] for _ in ms]
        hlat, hskip = [None] * len(ms), [0] * len(ms)
        for _ in range(a.repeat):
            for k, p in enumerate(pipes):
                s, c, lat, hskip[k] = diffusers_round(p, emb, pooled, noise, steps, a.guidance,
                                                      a.size, a.size)
                hsecs[k].append(s)
                hcpu[k].append(c)
                hlat[k] = lat
        im_d = [decode(vae, r["latents"]) for r in d1]
        im_h = [decode(vae, x) for x in hlat]
        im_u = [decode(vae, r["latents"]) for r in du] if du else None
        med = lambda xs: statistics.median(xs)  # noqa: E731
        for k, (name, spec, _) in enumerate(ms):
            row = {"steps": steps, "method": name, "spec": spec, "total_steps": a.n * steps,
                   "ditd": {"skipped": d1[k]["steps_skipped"], "evals": d1[k]["evals"],
                            "evals_skipped": d1[k]["evals_skipped"],
                            "wall_s": med(d1[k]["wall_s"]),
                            "speedup": med(d1[0]["wall_s"]) / med(d1[k]["wall_s"]),
                            "cpu_s": med(d1[k]["cpu_s"]),
                            "cpu_speedup": med(d1[0]["cpu_s"]) / med(d1[k]["cpu_s"]),
                            "psnr_db": None if k == 0 else psnr(im_d[k], im_d[0]),
                            "ssim": None if k == 0 else ssim(im_d[k], im_d[0])},
                   "diffusers": {"skipped": hskip[k], "wall_s": med(hsecs[k]),
                                 "speedup": med(hsecs[0]) / med(hsecs[k]),
                                 "cpu_s": med(hcpu[k]), "cpu_speedup": med(hcpu[0]) / med(hcpu[k]),
                                 "psnr_db": None if k == 0 else psnr(im_h[k], im_h[0]),
                                 "ssim": None if k == 0 else ssim(im_h[k], im_h[0])},
                   "psnr_ditd_vs_diffusers_db": psnr(im_d[k], im_h[k]),
                   "latent_rel_ditd_vs_diffusers": float(np.abs(d1[k]["latents"] - hlat[k]).max()
                                                         / np.abs(hlat[k]).max())}
            if du:
                row["ulysses2"] = {"skipped": du[k]["steps_skipped"],
                                   "wall_s": med(du[k]["wall_s"]),
                                   "speedup": med(du[0]["wall_s"]) / med(du[k]["wall_s"]),
                                   "psnr_db": None if k == 0 else psnr(im_u[k], im_u[0]),
                                   "ssim": None if k == 0 else ssim(im_u[k], im_u[0]),
                                   "max_abs_vs_one_rank": float(np.abs(du[k]["latents"] -
                                                                       d1[k]["latents"]).max())}
            results.append(row)
    cfg = json.loads((model / "transformer" / "config.json").read_text())
    print(f"FLUX-shaped, RANDOM weights: {cfg['num_layers']} double + {cfg['num_single_layers']} "
          f"single blocks, {cfg['num_attention_heads']} heads of 128 (inner {128 * cfg['num_attention_heads']}), "
          f"{a.size}x{a.size} ({(a.size // 16) ** 2} image tokens), {a.text_len} text tokens, "
          f"guidance {a.guidance}, {a.n} images, one image per batch, float32, one thread per "
          f"process; wall: the median of {a.repeat} rounds, methods interleaved; load average "
          f"at the start {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f}")
    print("| steps | method | steps skipped ditd / Diffusers | wall s ditd / Diffusers | wall "
          "speed-up ditd / Diffusers | CPU speed-up ditd / Diffusers | PSNR vs uncached ditd / "
          "Diffusers | SSIM vs uncached ditd / Diffusers | PSNR ditd vs Diffusers |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in results:
        d, hf = r["ditd"], r["diffusers"]
        ps = "-" if d["psnr_db"] is None else f"{d['psnr_db']:.1f} / {hf['psnr_db']:.1f} dB"
        ss = "-" if d["ssim"] is None else f"{d['ssim']:.4f} / {hf['ssim']:.4f}"
        print(f"| {r['steps']} | `{r['method']}` | {d['skipped']} / {hf['skipped']} of "
              f"{r['total_steps']} | {d['wall_s']:.2f} / {hf['wall_s']:.2f} | {d['speedup']:.2f}x / {hf['speedup']:.2f}x | "
              f"{d['cpu_speedup']:.2f}x / {hf['cpu_speedup']:.2f}x | {ps} | {ss} | {r['psnr_ditd_vs_diffusers_db']:.1f} dB |")
    if not a.no_ulysses:
        print()
        print("ditd under ulysses 2 (mpirun -np 2, one thread each):")
        print("| steps | method | steps skipped | wall s | speed-up over uncached ulysses 2 | "
              "speed-up over uncached one rank | PSNR vs uncached | SSIM vs uncached | "
              "max abs latents vs one rank |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        base1 = {r["steps"]: r["ditd"]["wall_s"] for r in results if r["spec"] == "none"}
        for r in results:
            u = r["ulysses2"]
            ps = "-" if u["psnr_db"] is None else f"{u['psnr_db']:.1f} dB"
            ss = "-" if u["ssim"] is None else f"{u['ssim']:.4f}"
            print(f"| {r['steps']} | `{r['method']}` | {u['skipped']} of {r['total_steps']} | "
                  f"{u['wall_s']:.2f} | {u['speedup']:.2f}x | {base1[r['steps']] / u['wall_s']:.2f}x | "
                  f"{ps} | {ss} | {u['max_abs_vs_one_rank']:.2g} |")
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1) + "\n")
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
