#!/usr/bin/env python3
"""img2img on a FLUX-shaped model: ditd beside Diffusers' FluxImg2ImgPipeline, same CPU, same inputs.

What it is: issue 23's img2img benchmark, and the resize beside PIL's. The model is
FluxTransformer2DModel with FLUX.1-dev's width (24 heads x 128 = 3072, MLP 12288, RoPE axes (16,
56, 56), guidance embedding) at reduced depth (--double / --single blocks) and RANDOM weights
(tools/bench_lora_flux.py's maker); the text width, the VAE and the scheduler are the tiny FLUX.1-dev
fixture's (build/tests/golden/flux_pipeline/dev), the text --text-len random embeddings. One
request: an input image of --input WxH (random, smooth) resized to --size x --size (PIL's Lanczos),
VAE-encoded, --steps steps at --strength (5 at 0.6: 3 steps run), decoded.

  ditd       build/tests/golden/img2img_eval (bench/img2img_eval.c), float32, one rank;
  Diffusers  FluxImg2ImgPipeline(prompt_embeds=..., image=PIL image), float32, output_type="np",
             its two random draws replaced by ditd's Philox streams (the fixture tools' DitdNoise),
             so both compute the same request (the largest final-latent difference is printed).

Both at --threads threads; --repeat rounds each (the first left out when there are more: the
median of the warm ones). Then the resize alone:
build/tests/golden/resize_eval (bench/resize_eval.c, ditd_image_resize) beside
PIL.Image.resize(LANCZOS) of the same RGB image, --rs-in -> --rs-out, and whether the bytes agree.

What it is not: a test; quality (random weights).

    /root/ditd-venv/bin/python tools/bench_img2img_flux.py [--size 1024] [--threads 2] [--repeat 1]
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
import PIL
import torch
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_lora_flux import FIXTURE, make_model  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
EXE = ROOT / "build" / "tests" / "golden" / "img2img_eval"


def smooth_image(h, w, seed):
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    img = np.stack([128 + 80 * np.sin(x / w * 7.1), 128 + 70 * np.cos(y / h * 5.3),
                    128 + 60 * np.sin((x + y) / (h + w) * 9.0)], -1) + rng.normal(0, 20, (h, w, 3))
    return np.clip(np.round(img), 0, 255).astype(np.uint8)


def ditd_run(model, inputs, size, steps, strength, repeat, threads, seed):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads))
    tmp = tempfile.mkdtemp(prefix="ditd-bench-i2i-")
    cmd = [str(EXE), str(model), str(inputs), f"{tmp}/lat", str(size), str(size), str(steps),
           str(strength), "3.5", str(repeat), str(seed)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env)
    runs = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    lat = np.load(f"{tmp}/lat.npy")
    shutil.rmtree(tmp, ignore_errors=True)
    return runs, lat


def diffusers_run(model, img, emb, pooled, size, steps, strength, repeat, seed):
    import functools

    import make_flux_img2img_fixtures as fx  # its DitdNoise: ditd's Philox draws
    from diffusers import FluxImg2ImgPipeline, FluxPipeline
    # the draws are pure Python (seconds at this size): computed once, before any timing
    fx.philox = functools.lru_cache(maxsize=None)(fx.philox)
    n = 16 * (size // 8) ** 2
    fx.philox(seed, 0, n)
    fx.philox(seed, fx.POSTERIOR_STREAM, n)
    pipe = FluxImg2ImgPipeline.from_pretrained(model, torch_dtype=torch.float32,
                                               text_encoder=None, tokenizer=None,
                                               text_encoder_2=None, tokenizer_2=None)
    pipe.set_progress_bar_config(disable=True)
    pil = Image.fromarray(img, "RGB")
    runs, lat = [], None
    with fx.DitdNoise() as noise:
        for _ in range(repeat):
            noise.seed = seed
            marks = []

            def cb(p, i, t, kw):
                marks.append(time.perf_counter())
                return {}

            t0 = time.perf_counter()
            with torch.no_grad():
                out = pipe(prompt_embeds=torch.from_numpy(emb), pooled_prompt_embeds=torch.from_numpy(pooled),
                           image=pil, height=size, width=size, num_inference_steps=steps,
                           strength=strength, guidance_scale=3.5, output_type="latent",
                           callback_on_step_end=cb, return_dict=False)[0]
                t_loop_end = time.perf_counter()
                z = FluxPipeline._unpack_latents(out, size, size, pipe.vae_scale_factor)
                lat = z.numpy()
                zz = z / pipe.vae.config.scaling_factor + pipe.vae.config.shift_factor
                pipe.image_processor.postprocess(pipe.vae.decode(zz, return_dict=False)[0], output_type="np")
            t1 = time.perf_counter()
            steps_s = [b - a for a, b in zip(marks, marks[1:])]
            runs.append(dict(request_s=t1 - t0, steps_s=steps_s, last_step_end=t_loop_end))
    return runs, lat


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--input", default="896x1152", help="the input image's WxH (resized to --size)")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--strength", type=float, default=0.6)
    ap.add_argument("--heads", type=int, default=24)
    ap.add_argument("--double", type=int, default=1)
    ap.add_argument("--single", type=int, default=1)
    ap.add_argument("--text-len", type=int, default=512)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument("--rs-in", default="1024x1024")
    ap.add_argument("--rs-out", default="768x1344")
    ap.add_argument("--work", default="/tmp/ditd-bench-img2img")
    a = ap.parse_args()
    if not EXE.exists() or not FIXTURE.exists():
        raise SystemExit(f"build first: {EXE} and {FIXTURE}")
    torch.set_num_threads(a.threads)
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    model = work / "model"
    _, fx = make_model(model, a.heads, a.double, a.single, 0)
    iw, ih = (int(v) for v in a.input.split("x"))
    img = smooth_image(ih, iw, 1)
    rng = np.random.default_rng(1)
    emb = rng.standard_normal((1, a.text_len, fx["joint_attention_dim"])).astype(np.float32)
    pooled = rng.standard_normal((1, fx["pooled_projection_dim"])).astype(np.float32)
    inputs = work / "inputs"
    inputs.mkdir(exist_ok=True)
    np.save(inputs / "image.npy", img.astype(np.float32))
    np.save(inputs / "emb.npy", emb)
    np.save(inputs / "pooled.npy", pooled)
    run_steps = a.steps - int(max(a.steps - min(a.steps * a.strength, a.steps), 0))
    print(f"# FLUX-shaped transformer: {a.heads} heads x 128, {a.double} double + {a.single} single "
          f"blocks, random weights; img2img {iw}x{ih} -> {a.size}x{a.size}, "
          f"{a.steps} steps at strength {a.strength} ({run_steps} run), {(a.size // 16) ** 2} image + "
          f"{a.text_len} text tokens; the fixture's tiny VAE; {a.threads} threads; "
          f"{'median of the warm rounds, ' + str(a.repeat - 1) if a.repeat > 1 else 'one round (cold)'}")
    d, dlat = ditd_run(model, inputs, a.size, a.steps, a.strength, a.repeat, a.threads, a.seed)
    f, flat = diffusers_run(model, img, emb, pooled, a.size, a.steps, a.strength, a.repeat, a.seed)
    # warm rounds: the first of each side plans buffers (ditd) or warms caches; with --repeat > 1
    # it is left out
    if a.repeat > 1:
        d, f = d[1:], f[1:]
    d_step = statistics.median([s for r in d for s in r["steps_s"]])
    f_step = statistics.median([s for r in f for s in r["steps_s"]]) if f[0]["steps_s"] else float("nan")
    d_req = statistics.median(r["request_s"] for r in d)
    f_req = statistics.median(r["request_s"] for r in f)
    err = float(np.abs(dlat - flat).max() / max(np.abs(flat).max(), 1e-30))
    print("| | ditd | Diffusers | Diffusers / ditd |")
    print("| --- | --- | --- | --- |")
    print(f"| ms per step (median) | {1e3 * d_step:.0f} | {1e3 * f_step:.0f} | {f_step / d_step:.2f} |")
    print(f"| ms per request ({run_steps} steps, resize, encode, decode) | {1e3 * d_req:.0f} | "
          f"{1e3 * f_req:.0f} | {f_req / d_req:.2f} |")
    print(f"| ditd's parts (ms): resize {1e3 * statistics.median(r['resize_s'] for r in d):.1f}, encode "
          f"{1e3 * statistics.median(r['encode_s'] for r in d):.0f}, loop "
          f"{1e3 * statistics.median(r['loop_s'] for r in d):.0f}, decode "
          f"{1e3 * statistics.median(r['decode_s'] for r in d):.0f} | | | |")
    print(f"\nfinal latents, ditd vs Diffusers: {err:.2e} relative (max abs / max ref)")
    # the resize alone: ditd's (a request's resize_s, through img2img_eval on an image of that size)
    # beside PIL's, the same bytes
    rw, rh = (int(v) for v in a.rs_in.split("x"))
    ow, oh = (int(v) for v in a.rs_out.split("x"))
    src = smooth_image(rh, rw, 2)
    pil = Image.fromarray(src, "RGB")
    pil_s = []
    for _ in range(max(a.repeat, 5)):
        t0 = time.perf_counter()
        want = pil.resize((ow, oh), Image.LANCZOS)
        pil_s.append(time.perf_counter() - t0)
    rs_exe = ROOT / "build" / "tests" / "golden" / "resize_eval"
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "in.raw").write_bytes(src.tobytes())
        out = subprocess.run([str(rs_exe), f"{tmp}/in.raw", str(rw), str(rh), str(ow), str(oh),
                              str(max(a.repeat, 5)), f"{tmp}/out.raw"], capture_output=True, text=True,
                             check=True)
        ditd_ms = [float(v) for v in out.stdout.split()]
        same = (Path(tmp) / "out.raw").read_bytes() == np.asarray(want).tobytes()
    print(f"\n| resize {rw}x{rh} -> {ow}x{oh} RGB, Lanczos | ms (median) |")
    print("| --- | --- |")
    print(f"| ditd_image_resize (one thread) | {statistics.median(ditd_ms):.1f} |")
    print(f"| PIL {PIL.__version__} Image.resize (one thread) | {1e3 * statistics.median(pil_s):.1f} |")
    print(f"\nditd's bytes equal PIL's: {same}")


if __name__ == "__main__":
    main()
