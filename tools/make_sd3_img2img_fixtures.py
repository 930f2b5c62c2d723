#!/usr/bin/env python3
"""Build the SD3 edit fixtures: what Diffusers' StableDiffusion3Img2ImgPipeline and
StableDiffusion3InpaintPipeline make, in float64, from the tiny SD3 folders of
tests/fixtures/sd3_pipeline (tests/fixtures/sd3_img2img/).

What it is: tools/make_flux_img2img_fixtures.py's pattern for SD3. The sd3, sd35 and sd3_not5
folders are assembled as the build does (tests/fixtures/tokenizers/unpack.py,
tests/fixtures/sd3_pipeline/assemble.py: the real CLIP and T5 vocabularies), loaded with
StableDiffusion3Img2ImgPipeline / StableDiffusion3InpaintPipeline.from_pretrained(folder,
torch_dtype=torch.float64) (their components are StableDiffusion3Pipeline's), and run on input
images and masks already at the target size, so VaeImageProcessor resizes nothing (the tool
asserts the image's preprocess is the plain normalization and the mask's the plain
binarization). Two more folders are made from sd35 in the temporary tree: sd35_dyn (its
scheduler with use_dynamic_shifting, so mu comes from the image tokens) and, for the cases whose
name says so, the same components under the edit classes' own names in model_index.json.

The noise is ditd's (engine/core/philox.h; the Python definition in
tools/make_sampler_fixtures.py):
  - the image's latent_dist.sample(generator): mean + std x ditd_philox_normal(seed,
    DITD_LATENT_POSTERIOR_STREAM = 2^63, 0, C h w), one draw per request (the one image is
    encoded once and repeated for num_images_per_prompt);
  - randn_tensor((B, C, h, w)): image b's row is ditd_philox_normal(seed, b, 0, C h w);
  - the inpainting pipeline's prepare_mask_latents encodes the masked image too (a second
    latent_dist.sample); its latents feed only a 33-channel transformer, not this one's 16, so
    that draw is replaced by the mean, and the tool checks the result does not depend on it.
Everything else is stock Diffusers 0.42: get_timesteps (strength, scheduler.order), the
scheduler's own sigmas (shift 3, or mu from calculate_shift), (z - shift_factor) x
scaling_factor, scale_noise at the first kept step (the inpainting pipeline at strength 1: the
noise itself), classifier-free guidance over the negative prompt ("" when none), the mask
processor and the per-step blend, and each pipeline's own decode: img2img
latents / scaling_factor + shift_factor, inpainting latents / scaling_factor (Diffusers 0.42.1
leaves shift_factor out there; the images are what that pipeline returns).

Writes tests/fixtures/sd3_img2img/expected/cases.json and, per case, <name>_image.png (RGB
8-bit), <name>_image_u8.npy ((H, W, 3)), for inpainting <name>_mask.png (8-bit gray: white
repainted, black kept), <name>_mask_u8.npy ((H, W)) and <name>_mask_latents.npy ((h, w)),
<name>_image_latents.npy ((1, 16, h, w)), <name>_timesteps.npy (the kept ones),
<name>_final_latents.npy ((B, 16, h, w)) and <name>_out_u8.npy ((B, H, W, 3): the pipeline's own
images); float arrays float32 (the float64 results rounded once).

What it is not: part of the build or the tests. Re-run only when a fixture must change:

    /root/ditd-venv/bin/python tools/make_sd3_img2img_fixtures.py [--out tests/fixtures/sd3_img2img]

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
import diffusers.pipelines.stable_diffusion_3.pipeline_stable_diffusion_3_img2img as img2img_mod
import diffusers.pipelines.stable_diffusion_3.pipeline_stable_diffusion_3_inpaint as inpaint_mod
from diffusers import StableDiffusion3Img2ImgPipeline, StableDiffusion3InpaintPipeline
from diffusers.models.autoencoders import vae as vae_mod

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_flux_img2img_fixtures import input_image, npy, philox, write_json  # noqa: E402
from make_flux_inpaint_fixtures import make_mask  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "tests" / "fixtures" / "sd3_img2img"
SD3 = REPO / "tests" / "fixtures" / "sd3_pipeline"
UNPACK = REPO / "tests" / "fixtures" / "tokenizers" / "unpack.py"
POSTERIOR_STREAM = 1 << 63
# sd35's scheduler with dynamic shifting (FlowMatchEulerDiscreteScheduler's defaults for the rest)
DYN_SCHEDULER = dict(num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=True, base_shift=0.5,
                     max_shift=1.15, base_image_seq_len=256, max_image_seq_len=4096)

# name, pipeline ("img2img" / "inpaint"), folder, call kwargs (__call__'s names), seed, mask kind.
# A name with "class" runs on a folder whose model_index.json names the edit class.
CASES = [
    ("i2i_sd3_64_s03", "img2img", "sd3",
     dict(prompt="A photo of an astronaut riding a horse on the moon", height=64, width=64,
          num_inference_steps=10, strength=0.3, guidance_scale=7.0, max_sequence_length=16), 31, None),
    ("i2i_sd3_48x80_s075_neg", "img2img", "sd3",
     dict(prompt="Crème brûlée à la française", prompt_3="a crème brûlée on a marble table, 8k",
          negative_prompt="blurry, low quality", height=48, width=80, num_inference_steps=4,
          strength=0.75, guidance_scale=5.0, max_sequence_length=32), 32, None),
    ("i2i_sd3_32_s10", "img2img", "sd3",
     dict(prompt="a lighthouse at dusk", height=32, width=32, num_inference_steps=3, strength=1.0,
          guidance_scale=7.0, max_sequence_length=16), 33, None),
    ("i2i_sd35_32x48_s06_batch2_class", "img2img", "sd35",
     dict(prompt="two cats on a sofa, 猫", negative_prompt="fog", height=32, width=48,
          num_inference_steps=5, strength=0.6, guidance_scale=4.5, max_sequence_length=16,
          num_images_per_prompt=2), 34, None),
    ("i2i_sd35_dyn_48_s075", "img2img", "sd35_dyn",
     dict(prompt="a cozy cabin, 雪, 🌲", height=48, width=48, num_inference_steps=4, strength=0.75,
          guidance_scale=4.5, max_sequence_length=8), 35, None),
    ("i2i_sd3_not5_32x48_s05_nocfg", "img2img", "sd3_not5",
     dict(prompt="a small boat", height=32, width=48, num_inference_steps=4, strength=0.5,
          guidance_scale=1.0, max_sequence_length=8), 36, None),
    ("inp_sd3_48x64_s03_holes", "inpaint", "sd3",
     dict(prompt="a red fox in the snow, watercolor", height=48, width=64, num_inference_steps=10,
          strength=0.3, guidance_scale=7.0, max_sequence_length=16), 41, "holes"),
    ("inp_sd3_64x48_s075_holes_neg", "inpaint", "sd3",
     dict(prompt="a lighthouse at dusk, 灯台", negative_prompt="blurry", height=64, width=48,
          num_inference_steps=4, strength=0.75, guidance_scale=5.0, max_sequence_length=16), 42,
     "holes"),
    ("inp_sd3_32_s10_stripes", "inpaint", "sd3",
     dict(prompt="a bowl of ramen", height=32, width=32, num_inference_steps=3, strength=1.0,
          guidance_scale=7.0, max_sequence_length=16), 43, "stripes"),
    ("inp_sd35_48x32_s075_batch2_holes_class", "inpaint", "sd35",
     dict(prompt="two cats on a sofa", negative_prompt="", height=48, width=32,
          num_inference_steps=4, strength=0.75, guidance_scale=4.5, max_sequence_length=16,
          num_images_per_prompt=2), 44, "holes"),
    ("inp_sd3_32_s06_gray", "inpaint", "sd3",
     dict(prompt="a cozy cabin", height=32, width=32, num_inference_steps=5, strength=0.6,
          guidance_scale=7.0, max_sequence_length=8), 45, "gray"),
]
CLASSES = {"img2img": "StableDiffusion3Img2ImgPipeline", "inpaint": "StableDiffusion3InpaintPipeline"}
PIPES = {"img2img": StableDiffusion3Img2ImgPipeline, "inpaint": StableDiffusion3InpaintPipeline}


class DitdNoise:
    """randn_tensor (both modules) and latent_dist.sample replaced by ditd's Philox streams under
    the current case's seed; a call's second posterior draw (the inpainting pipeline's masked
    image) gives the mean, or mean + masked_shift (to show it is unused)."""

    def __init__(self):
        self.seed = None
        self.masked_shift = 0.0
        self.noise_calls = 0
        self.posterior_calls = 0
        self.orig = (img2img_mod.randn_tensor, inpaint_mod.randn_tensor,
                     vae_mod.DiagonalGaussianDistribution.sample)

    def __enter__(self):
        me = self

        def randn(shape, generator=None, device=None, dtype=None, layout=None):
            B, n = shape[0], math.prod(shape[1:])
            rows = np.stack([philox(me.seed, b, n) for b in range(B)]).reshape(shape)
            me.noise_calls += 1
            return torch.from_numpy(rows).to(dtype)

        def sample(dist, generator=None):
            assert dist.mean.shape[0] == 1, "one image, encoded once"
            me.posterior_calls += 1
            if me.posterior_calls > 1:  # the masked image (prepare_mask_latents)
                return dist.mean + me.masked_shift
            eps = philox(me.seed, POSTERIOR_STREAM, dist.mean[0].numel()).reshape(dist.mean.shape)
            return dist.mean + dist.std * torch.from_numpy(eps).to(dist.mean.dtype)

        img2img_mod.randn_tensor = randn
        inpaint_mod.randn_tensor = randn
        vae_mod.DiagonalGaussianDistribution.sample = sample
        return self

    def __exit__(self, *exc):
        img2img_mod.randn_tensor, inpaint_mod.randn_tensor, vae_mod.DiagonalGaussianDistribution.sample = self.orig


def run(pipe, kind, kw, noise, seed, pil, mpil):
    """One call; (final latents, the pipeline's images as float [0, 1], what was seen)."""
    noise.seed = seed
    noise.posterior_calls = 0
    noise.noise_calls = 0
    seen = {}

    def grab(p, i, t, k):
        seen.setdefault("first_t", float(t))
        seen["latents"] = k["latents"].clone()  # after the step (and the blend): the last is final
        return {}

    orig_mask = getattr(pipe, "prepare_mask_latents", None)
    if kind == "inpaint":
        orig_enc = pipe._encode_vae_image

        def enc(image, generator):
            lat = orig_enc(image=image, generator=generator)
            seen.setdefault("image_latents", lat.clone())
            return lat

        def mask_lat(*a, **k):
            mask, mil = orig_mask(*a, **k)
            seen["mask"] = mask.clone()
            return mask, mil

        pipe._encode_vae_image = enc
        pipe.prepare_mask_latents = mask_lat
        extra = dict(mask_image=mpil)
    else:
        orig_prep = pipe.prepare_latents
        vae = pipe.vae

        def prep(image, timestep, batch_size, num_images_per_prompt, dtype, device, generator=None):
            with torch.no_grad():
                z = img2img_mod.retrieve_latents(vae.encode(image.to(dtype=dtype)), generator=generator)
            seen["image_latents"] = (z - vae.config.shift_factor) * vae.config.scaling_factor
            noise.posterior_calls -= 1  # the same draw again inside
            return orig_prep(image, timestep, batch_size, num_images_per_prompt, dtype, device, generator)

        pipe.prepare_latents = prep
        extra = {}
    try:
        with torch.no_grad():
            img = pipe(**kw, **extra, image=pil, output_type="np", callback_on_step_end=grab,
                       return_dict=False)[0]
    finally:
        if kind == "inpaint":
            pipe._encode_vae_image = orig_enc
            pipe.prepare_mask_latents = orig_mask
        else:
            pipe.prepare_latents = orig_prep
    want_post = 2 if kind == "inpaint" else 1
    assert noise.posterior_calls == want_post and noise.noise_calls == 1, (noise.posterior_calls,
                                                                            noise.noise_calls)
    return seen["latents"], img, seen


def make_case(pipes, exp, case, noise):
    name, kind, folder, kw, seed, mkind = case
    pipe = pipes[(kind, folder)]
    H, W = kw["height"], kw["width"]
    vsf = pipe.vae_scale_factor
    h, w = H // vsf, W // vsf
    assert h * vsf == H and w * vsf == W and h % 2 == 0 and w % 2 == 0, name
    u8 = input_image(H, W, seed)
    png = f"{name}_image.png"
    Image.fromarray(u8, "RGB").save(exp / png, optimize=True)
    pil = Image.open(exp / png).convert("RGB")
    assert np.array_equal(np.array(pil), u8)
    pre = pipe.image_processor.preprocess(pil, height=H, width=W)
    want = torch.from_numpy(u8.astype(np.float32) / 255.0).permute(2, 0, 1)[None] * 2.0 - 1.0
    assert torch.equal(pre.float(), want), f"{name}: preprocess is not the plain normalization"
    mpil = m8 = None
    if mkind:
        m8 = make_mask(H, W, mkind, seed)
        Image.fromarray(m8, "L").save(exp / f"{name}_mask.png", optimize=True)
        mpil = Image.open(exp / f"{name}_mask.png")
        assert np.array_equal(np.array(mpil.convert("L")), m8)
        mpre = pipe.mask_processor.preprocess(mpil, height=H, width=W)
        mwant = torch.from_numpy((m8.astype(np.float32) / 255.0 >= 0.5).astype(np.float32))[None, None]
        assert torch.equal(mpre.float(), mwant), f"{name}: the mask preprocess is not the binarization"

    noise.masked_shift = 0.0
    lat, img, seen = run(pipe, kind, kw, noise, seed, pil, mpil)
    assert lat.dtype == torch.float64
    nimg = kw.get("num_images_per_prompt", 1)
    B = nimg
    assert lat.shape == (B, 16, h, w), (name, lat.shape)
    if kind == "inpaint" and mkind == "holes" and "neg" in name:  # the masked image's draw is unused
        noise.masked_shift = 3.0
        lat2, img2, _ = run(pipe, kind, kw, noise, seed, pil, mpil)
        assert torch.equal(lat, lat2) and np.array_equal(img, img2), "the masked image reached the loop"
    steps, strength = kw["num_inference_steps"], kw["strength"]
    assert pipe.scheduler.order == 1
    init = min(steps * strength, steps)
    t_start = int(max(steps - init, 0))
    kept = pipe.scheduler.timesteps[t_start * pipe.scheduler.order:]
    assert seen["first_t"] == float(kept[0]), name
    out_u8 = (img * 255).round().astype(np.uint8)
    inside = float(((img > 0.0) & (img < 1.0)).mean())
    assert inside > 0.5, f"{name}: only {inside:.2f} of the pixels are not clipped"
    # the decode as each pipeline writes it, from the final latents
    sf, sh = pipe.vae.config.scaling_factor, pipe.vae.config.shift_factor
    with torch.no_grad():
        z = lat / sf if kind == "inpaint" else lat / sf + sh
        again = pipe.image_processor.postprocess(pipe.vae.decode(z, return_dict=False)[0], output_type="np")
    assert np.array_equal(again, img), f"{name}: the pipeline's decode is not {kind}'s rule"
    p = f"{name}_"
    entry = dict(
        name=name, pipeline=CLASSES[kind], folder=folder, folder_class="class" in name,
        prompt=kw["prompt"], prompt_2=kw.get("prompt_2"), prompt_3=kw.get("prompt_3"),
        negative_prompt=kw.get("negative_prompt"), height=H, width=W, num_inference_steps=steps,
        strength=strength, guidance_scale=kw["guidance_scale"],
        cfg_used=kw["guidance_scale"] > 1, max_sequence_length=kw["max_sequence_length"],
        num_images_per_prompt=nimg, batch=B, seed=seed, latent_channels=16, latent_height=h,
        latent_width=w, vae_scale_factor=vsf, t_start=t_start, steps_run=steps - t_start,
        first_sigma=float(pipe.scheduler.sigmas[t_start]),
        dynamic_shifting=bool(pipe.scheduler.config.get("use_dynamic_shifting")),
        decode="latents / scaling_factor" if kind == "inpaint" else "latents / scaling_factor + shift_factor",
        unclipped=inside,
        image=png, image_u8=npy(exp, p + "image_u8.npy", u8, np.uint8),
        image_latents=npy(exp, p + "image_latents.npy", seen["image_latents"]),
        timesteps=npy(exp, p + "timesteps.npy", kept),
        final_latents=npy(exp, p + "final_latents.npy", lat),
        out_u8=npy(exp, p + "out_u8.npy", out_u8, np.uint8),
    )
    msg = ""
    if mkind:
        mask = seen["mask"]
        grid = mask[0, 0]
        assert torch.equal(mask[:B], grid[None, None].expand(B, 1, h, w)), name
        entry.update(mask=f"{name}_mask.png", mask_u8=npy(exp, p + "mask_u8.npy", m8, np.uint8),
                     mask_kind=mkind, mask_latents=npy(exp, p + "mask_latents.npy", grid),
                     repainted=int(grid.sum()))
        msg = f", mask {mkind}: {entry['repainted']} of {h * w} latent cells repainted"
    print(f"{name}: {CLASSES[kind]} on {folder} B={B} {H}x{W} steps {steps} strength {strength} -> "
          f"t_start {t_start}, first sigma {entry['first_sigma']:.6f}{msg}")
    return entry


def relabel(src, dst, cls=None, scheduler=None):
    """A copy of folder src at dst, model_index.json naming cls, or another scheduler config."""
    shutil.copytree(src, dst, symlinks=False)
    if cls:
        mi = json.loads((dst / "model_index.json").read_text())
        mi["_class_name"] = cls
        (dst / "model_index.json").write_text(json.dumps(mi, indent=2) + "\n")
    if scheduler:
        cfg = dict(scheduler, _class_name="FlowMatchEulerDiscreteScheduler",
                   _diffusers_version=diffusers.__version__)
        (dst / "scheduler" / "scheduler_config.json").write_text(json.dumps(cfg, indent=2) + "\n")


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
        subprocess.run([sys.executable, str(SD3 / "assemble.py"), str(tmp / "tok"), str(tmp / "pipes"),
                        str(tmp / "pipes.stamp")], check=True)
        root = tmp / "pipes"
        relabel(root / "sd35", root / "sd35_dyn", scheduler=DYN_SCHEDULER)
        pipes = {}
        for name, kind, folder, kw, seed, mkind in CASES:
            if (kind, folder) in pipes:
                continue
            d = root / folder
            if "class" in name:  # the same components under the edit class's name
                d = root / f"{folder}_{kind}"
                relabel(root / folder, d, cls=CLASSES[kind])
            extra = dict(text_encoder_3=None, tokenizer_3=None) if folder == "sd3_not5" else {}
            pipe = PIPES[kind].from_pretrained(d, torch_dtype=torch.float64, **extra)
            pipe.set_progress_bar_config(disable=True)
            for cname in ("transformer", "vae", "text_encoder", "text_encoder_2", "text_encoder_3"):
                m = getattr(pipe, cname)
                assert m is None or all(t.dtype == torch.float64 for t in m.parameters()), cname
            assert pipe.transformer.config.in_channels == 16
            pipes[(kind, folder)] = pipe
        with DitdNoise() as noise:
            cases = [make_case(pipes, exp, c, noise) for c in CASES]
    assert len(cases) >= 11
    meta = dict(diffusers=diffusers.__version__, transformers=transformers.__version__,
                torch=torch.__version__, compute="float64", stored="float32 (u8 arrays uint8)",
                posterior_stream=hex(POSTERIOR_STREAM), dynamic_scheduler=DYN_SCHEDULER, cases=cases)
    write_json(exp / "cases.json", meta)
    print(f"{len(cases)} cases -> {exp}")


if __name__ == "__main__":
    main()
