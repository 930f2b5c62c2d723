#!/usr/bin/env python3
"""Build the FluxImg2ImgPipeline fixtures: what Diffusers' FluxImg2ImgPipeline makes, in
float64, from the tiny FLUX.1 folders of tests/fixtures/flux_pipeline (tests/fixtures/flux_img2img/).

What it is: a script that assembles the dev and schnell folders exactly as the build does
(tests/fixtures/tokenizers/unpack.py, tests/fixtures/flux_pipeline/assemble.py), loads them with
FluxImg2ImgPipeline.from_pretrained(folder, torch_dtype=torch.float64) (the components are
FluxPipeline's), and runs the cases of CASES on input images that are already at the target
size, so VaeImageProcessor.preprocess resizes nothing (PIL's resize to the image's own size is a
copy) and no resampling filter is involved: the reference checks the img2img path alone.

The noise is ditd's, so that the C test runs the real path from a seed: the pipeline's two
random draws are replaced, with the same shapes, by engine/core/philox.h's normals (the Python
definition in tools/make_sampler_fixtures.py):
  - the VAE's latent_dist.sample(generator): mean + std x ditd_philox_normal(seed,
    DITD_LATENT_POSTERIOR_STREAM = 2^63, 0, k C h w), one draw per request of k images
    (Diffusers encodes the image list once, as one batch, and repeats it for
    num_images_per_prompt: output i edits image i % k);
  - prepare_latents' randn_tensor((B, C, h, w)): image b's row is ditd_philox_normal(seed, b, 0,
    C h w), ditd's initial noise.
Everything else is stock Diffusers 0.42: get_timesteps (strength), the posterior sample shifted
and scaled ((z - shift_factor) x scaling_factor), scale_noise at the first kept step, packing,
the loop, the unscale and the decode.

Writes tests/fixtures/flux_img2img/expected/cases.json and, per case, <name>_image.png (the input,
RGB 8-bit; a case of k > 1 images: <name>_image0.png ...), <name>_image_u8.npy (the same pixels,
(H, W, 3), or (k, H, W, 3)), <name>_image_latents.npy (the shifted and scaled posterior draw,
(k, 16, h, w)), <name>_timesteps.npy (the kept ones),
<name>_final_latents.npy ((B, 16, h, w), ditd's unpacked layout) and <name>_out_u8.npy (the decoded
images, (B, H, W, 3)); float arrays float32 (the float64 results rounded once).

What it is not: part of the build or the tests. Re-run only when a fixture must change:

    python tools/make_flux_img2img_fixtures.py [--out tests/fixtures/flux_img2img]

It rewrites expected/; re-running gives identical files.
"""

import argparse
import json
import math
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
import transformers
from PIL import Image

import diffusers
import diffusers.pipelines.flux.pipeline_flux_img2img as img2img_mod
from diffusers import FluxImg2ImgPipeline, FluxPipeline
from diffusers.models.autoencoders import vae as vae_mod

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_sampler_fixtures import philox_normal  # noqa: E402  (engine/core/philox.h in Python)

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "tests" / "fixtures" / "flux_img2img"
FLUX = REPO / "tests" / "fixtures" / "flux_pipeline"
UNPACK = REPO / "tests" / "fixtures" / "tokenizers" / "unpack.py"
POSTERIOR_STREAM = 1 << 63

# name, folder, prompt, negative prompt, true_cfg_scale, height, width, steps, strength,
# guidance_scale, max_sequence_length, num_images_per_prompt, seed
CASES = [
    ("dev_32x48_s03", "dev", "a red fox in the snow, watercolor", None, 1.0, 32, 48, 5, 0.3, 3.5, 77, 1, 11),
    ("dev_48x32_s06", "dev", "Crème brûlée in São Paulo, 東京 🍮", None, 1.0, 48, 32, 5, 0.6, 3.5, 77, 1, 12),
    ("dev_32_s10", "dev", "a lighthouse at dusk", None, 1.0, 32, 32, 3, 1.0, 3.5, 16, 1, 13),
    ("dev_32x48_s06_batch2", "dev", "two cats on a sofa", None, 1.0, 32, 48, 4, 0.6, 7.0, 77, 2, 14),
    ("dev_32x48_s075_true_cfg", "dev", "a bowl of ramen", "blurry, watermark", 2.0, 32, 48, 4, 0.75, 3.5,
     77, 1, 15),
    ("schnell_32_s05", "schnell", "a cozy cabin, 雪, 🌲", None, 1.0, 32, 32, 4, 0.5, 0.0, 77, 1, 16),
    # an image list (the last field: k images, image=[...]): output i edits image i % k, the
    # posterior draw of image j at offset j C h w of the one batched draw
    ("dev_32x48_s06_2img", "dev", "two birds on a wire", None, 1.0, 32, 48, 4, 0.6, 3.5, 77, 2, 17, 2),
    ("dev_32_s075_2img_n4", "dev", "a harbor at noon", "blurry", 2.0, 32, 32, 4, 0.75, 3.5, 77, 4, 18,
     2),
]


def philox(seed, sample, n):
    return np.array(philox_normal(seed, sample, 0, n), dtype=np.uint32).view(np.float32)


class DitdNoise:
    """The pipeline's randn_tensor and latent_dist.sample, replaced by ditd's Philox streams
    under the current case's seed (see the file header). Counts its calls."""

    def __init__(self):
        self.seed = None
        self.calls = {"noise": 0, "posterior": 0}
        self.orig_randn = img2img_mod.randn_tensor
        self.orig_sample = vae_mod.DiagonalGaussianDistribution.sample

    def __enter__(self):
        me = self

        def randn(shape, generator=None, device=None, dtype=None, layout=None):
            B, n = shape[0], math.prod(shape[1:])
            rows = np.stack([philox(me.seed, b, n) for b in range(B)]).reshape(shape)
            me.calls["noise"] += 1
            return torch.from_numpy(rows).to(dtype)

        def sample(dist, generator=None):
            # the k images of a request are encoded as one batch: one draw of (k, C, h, w), so
            # image j's noise is elements [j C h w, (j + 1) C h w) of the posterior stream
            eps = philox(me.seed, POSTERIOR_STREAM, dist.mean.numel()).reshape(dist.mean.shape)
            me.calls["posterior"] += 1
            return dist.mean + dist.std * torch.from_numpy(eps).to(dist.mean.dtype)

        img2img_mod.randn_tensor = randn
        vae_mod.DiagonalGaussianDistribution.sample = sample
        return self

    def __exit__(self, *exc):
        img2img_mod.randn_tensor = self.orig_randn
        vae_mod.DiagonalGaussianDistribution.sample = self.orig_sample


def input_image(H, W, seed):
    """A smooth colour field with some texture, mostly away from 0 and 255."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:H, 0:W].astype(np.float64)
    r = 128 + 80 * np.sin(x / W * 3.1 + seed)
    g = 128 + 70 * np.cos(y / H * 2.7 - seed)
    b = 128 + 60 * np.sin((x + y) / (H + W) * 5.0)
    img = np.stack([r, g, b], -1) + rng.normal(0, 12, (H, W, 3))
    return np.clip(np.round(img), 0, 255).astype(np.uint8)


def write_json(path, obj):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n")


def npy(exp, name, a, dtype=np.float32):
    if isinstance(a, torch.Tensor):
        a = a.detach().cpu().numpy()
    np.save(exp / name, np.ascontiguousarray(np.asarray(a).astype(dtype)))
    return name


def make_case(pipe, exp, case, noise):
    name, folder, prompt, neg, tcfg, H, W, steps, strength, gs, msl, nimg, seed = case[:13]
    k = case[13] if len(case) > 13 else 1
    vsf = pipe.vae_scale_factor
    h, w = H // vsf, W // vsf
    assert h * vsf == H and w * vsf == W and h % 2 == 0 and w % 2 == 0, name
    assert nimg % k == 0, f"{name}: Diffusers repeats the image list: n a multiple of k"
    u8s, pngs, pils = [], [], []
    for j in range(k):
        u8 = input_image(H, W, seed + 100 * j)
        png = f"{name}_image.png" if k == 1 else f"{name}_image{j}.png"
        Image.fromarray(u8, "RGB").save(exp / png, optimize=True)
        pil = Image.open(exp / png).convert("RGB")
        assert np.array_equal(np.array(pil), u8)
        u8s.append(u8)
        pngs.append(png)
        pils.append(pil)
    u8 = u8s[0] if k == 1 else np.stack(u8s)
    # at the target size: the processor's resize is the identity
    pre = pipe.image_processor.preprocess(pils[0] if k == 1 else pils, height=H, width=W)
    want = torch.from_numpy(np.stack(u8s).astype(np.float32) / 255.0).permute(0, 3, 1, 2) * 2.0 - 1.0
    assert torch.equal(pre.float(), want), f"{name}: preprocess is not the plain normalization"
    pil = pils[0] if k == 1 else pils

    noise.seed = seed
    before = dict(noise.calls)
    seen = {}

    def grab(p, i, t, kw):
        seen.setdefault("first_t", t)
        return {}

    orig_enc = pipe._encode_vae_image

    def enc(image, generator):
        lat = orig_enc(image=image, generator=generator)
        seen["image_latents"] = lat.clone()
        return lat

    pipe._encode_vae_image = enc
    try:
        with torch.no_grad():
            lat = pipe(prompt=prompt, negative_prompt=neg, true_cfg_scale=tcfg, image=pil, height=H,
                       width=W, num_inference_steps=steps, strength=strength, guidance_scale=gs,
                       max_sequence_length=msl, num_images_per_prompt=nimg, output_type="latent",
                       callback_on_step_end=grab, return_dict=False)[0]
    finally:
        pipe._encode_vae_image = orig_enc
    assert noise.calls["noise"] == before["noise"] + 1 and noise.calls["posterior"] == before["posterior"] + 1
    assert lat.dtype == torch.float64
    B = nimg
    timesteps = pipe.scheduler.timesteps.clone()  # the full schedule
    init = min(steps * strength, steps)
    t_start = int(max(steps - init, 0))
    kept = timesteps[t_start:]
    assert float(seen["first_t"]) == float(kept[0]), name
    fin = FluxPipeline._unpack_latents(lat, H, W, vsf)
    # the decode as the pipeline does it (output_type="np" then 8-bit)
    with torch.no_grad():
        z = fin / pipe.vae.config.scaling_factor + pipe.vae.config.shift_factor
        img = pipe.vae.decode(z, return_dict=False)[0]
        img = pipe.image_processor.postprocess(img, output_type="np")
    out_u8 = (img * 255).round().astype(np.uint8)
    p = f"{name}_"
    entry = dict(
        name=name, folder=folder, prompt=prompt, negative_prompt=neg, true_cfg_scale=tcfg, height=H,
        width=W, num_inference_steps=steps, strength=strength, guidance_scale=gs,
        max_sequence_length=msl, num_images_per_prompt=nimg, batch=B, seed=seed, latent_channels=16,
        latent_height=h, latent_width=w, vae_scale_factor=vsf, t_start=t_start,
        steps_run=steps - t_start, first_sigma=float(pipe.scheduler.sigmas[t_start]),
        image=pngs[0], images=pngs, n_images=k, image_u8=npy(exp, p + "image_u8.npy", u8, np.uint8),
        image_latents=npy(exp, p + "image_latents.npy", seen["image_latents"]),
        timesteps=npy(exp, p + "timesteps.npy", kept),
        final_latents=npy(exp, p + "final_latents.npy", fin),
        out_u8=npy(exp, p + "out_u8.npy", out_u8, np.uint8),
    )
    if k > 1:  # Diffusers' cat([image_latents] * (n // k)): output i started from image i % k
        il = seen["image_latents"]
        assert il.shape[0] == k, f"{name}: {il.shape[0]} image latents for {k} images"
    print(f"{name}: k={k} B={B} {H}x{W} latent {h}x{w} steps {steps} strength {strength} -> t_start {t_start} "
          f"({steps - t_start} run), first sigma {entry['first_sigma']:.6f}")
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
            pipe = FluxImg2ImgPipeline.from_pretrained(tmp / "pipes" / name, torch_dtype=torch.float64)
            pipe.set_progress_bar_config(disable=True)
            for m in (pipe.transformer, pipe.vae, pipe.text_encoder, pipe.text_encoder_2):
                assert all(t.dtype == torch.float64 for t in m.parameters())
            pipes[name] = pipe
        with DitdNoise() as noise:
            cases = [make_case(pipes[c[1]], exp, c, noise) for c in CASES]
    assert len(cases) >= 8
    meta = dict(diffusers=diffusers.__version__, transformers=transformers.__version__,
                torch=torch.__version__, compute="float64", stored="float32 (u8 arrays uint8)",
                posterior_stream=hex(POSTERIOR_STREAM), cases=cases)
    write_json(exp / "cases.json", meta)
    print(f"{len(cases)} cases -> {exp}")


if __name__ == "__main__":
    main()
