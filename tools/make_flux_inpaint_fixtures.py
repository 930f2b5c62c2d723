#!/usr/bin/env python3
"""Build the FluxInpaintPipeline fixtures: what Diffusers' FluxInpaintPipeline makes, in float64,
from the tiny FLUX.1 folders of tests/fixtures/flux_pipeline (tests/fixtures/flux_inpaint/).

What it is: tools/make_flux_img2img_fixtures.py's pattern for the inpainting pipeline. The dev and
schnell folders are assembled as the build does, loaded with
FluxInpaintPipeline.from_pretrained(folder, torch_dtype=torch.float64), and run on input images
and masks already at the target size (VaeImageProcessor resizes nothing; the tool asserts the
image's preprocess is the plain normalization and the mask's is the plain binarization), so those
check the inpainting path alone; one case gives an image and a mask of other sizes, which the
processors resize with PIL's Lanczos (asserted here, with the resized pixels written). The path: the mask processor (convert("L"), binarize at 0.5,
nearest interpolation to the latent grid) and the per-step blending of the kept latents with the
image's latents noised to the next sigma.

The noise is ditd's (engine/core/philox.h, in Python in tools/make_sampler_fixtures.py):
  - the image's latent_dist.sample(generator): mean + std x ditd_philox_normal(seed, 2^63, 0,
    C h w), one draw per request;
  - prepare_latents' randn_tensor((B, C, h, w)): row b is ditd_philox_normal(seed, b, 0, C h w);
  - prepare_mask_latents encodes the masked image too (a second latent_dist.sample); its latents
    feed only a 64-channel (Fill) transformer, not this one's 16 channels, so the draw is
    replaced by the mean (it changes nothing: the tool checks the final latents do not depend
    on it by running one case twice with different values there).
Everything else is stock Diffusers 0.42.

Writes tests/fixtures/flux_inpaint/expected/cases.json and, per case, <name>_image.png,
<name>_image_u8.npy ((input_height, input_width, 3)), <name>_mask.png (8-bit gray: white
repainted, black kept), <name>_mask_u8.npy ((mask_height, mask_width)), <name>_image_resized_u8.npy
and <name>_mask_resized_u8.npy (PIL's Lanczos to (H, W)), <name>_mask_latents.npy ((h, w), Diffusers' mask on the latent
grid), <name>_image_latents.npy ((1, 16, h, w)), <name>_final_latents.npy ((B, 16, h, w),
unpacked) and <name>_out_u8.npy ((B, H, W, 3)); float arrays float32.

What it is not: part of the build or the tests. Re-run only when a fixture must change:

    python tools/make_flux_inpaint_fixtures.py [--out tests/fixtures/flux_inpaint]

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
import diffusers.pipelines.flux.pipeline_flux_inpaint as inpaint_mod
from diffusers import FluxInpaintPipeline, FluxPipeline
from diffusers.models.autoencoders import vae as vae_mod

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_flux_img2img_fixtures import input_image, npy, philox, write_json  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "tests" / "fixtures" / "flux_inpaint"
FLUX = REPO / "tests" / "fixtures" / "flux_pipeline"
UNPACK = REPO / "tests" / "fixtures" / "tokenizers" / "unpack.py"
POSTERIOR_STREAM = 1 << 63

# name, folder, prompt, negative prompt, true_cfg_scale, height, width, steps, strength,
# guidance_scale, max_sequence_length, num_images_per_prompt, seed, mask kind
CASES = [
    ("dev_32x48_s03_holes", "dev", "a red fox in the snow, watercolor", None, 1.0, 32, 48, 5, 0.3, 3.5,
     77, 1, 21, "holes"),
    ("dev_48x32_s075_holes", "dev", "a lighthouse at dusk, 灯台", None, 1.0, 48, 32, 4, 0.75, 3.5, 77, 1,
     22, "holes"),
    ("dev_32_s10_stripes", "dev", "a bowl of ramen", None, 1.0, 32, 32, 3, 1.0, 3.5, 16, 1, 23, "stripes"),
    ("dev_32x48_s075_batch2_true_cfg", "dev", "two cats on a sofa", "blurry", 2.0, 32, 48, 4, 0.75, 3.5,
     77, 2, 24, "holes"),
    ("schnell_32_s06_gray", "schnell", "a cozy cabin, 🌲", None, 1.0, 32, 32, 4, 0.6, 0.0, 77, 1, 25,
     "gray"),
    # an image (24x40, H x W: enlarged) and a mask (45x75: reduced) of other sizes than the
    # output's 32x48: both resized by PIL's Lanczos (the mask as L, before its binarize)
    ("dev_32x48_from_24x40_mask_45x75_s075", "dev", "a lighthouse at dusk", None, 1.0, 32, 48, 4, 0.75,
     3.5, 77, 1, 26, "holes", ((24, 40), (45, 75))),
]


def make_mask(H, W, kind, seed):
    """8-bit gray, white = repaint. 'holes': a white block with black holes and a stray dot, its
    edges off the 8-pixel grid; 'stripes': vertical bands 5 pixels wide; 'gray': levels near the
    0.5 threshold (127, 128, 200, 40) in patches, so the binarization itself is checked."""
    m = np.zeros((H, W), np.uint8)
    if kind == "holes":
        m[3:H - 5, 5:W - 3] = 255
        m[9:15, 11:19] = 0
        m[H // 2 + 1:H // 2 + 6, W - 14:W - 9] = 0
        m[H - 3, 2] = 255
    elif kind == "stripes":
        for x in range(W):
            if (x // 5) % 2 == 0:
                m[:, x] = 255
    else:
        rng = np.random.default_rng(seed)
        levels = np.array([127, 128, 200, 40], np.uint8)
        m = levels[rng.integers(0, 4, (H // 4, W // 4))].repeat(4, 0).repeat(4, 1)
    return m


class DitdNoise:
    """randn_tensor and latent_dist.sample replaced by ditd's Philox streams under the current
    case's seed; the second posterior draw of a call (the masked image's) gives the mean, or
    mean + masked_shift (to show it is unused)."""

    def __init__(self):
        self.seed = None
        self.masked_shift = 0.0
        self.calls = {"noise": 0, "posterior": 0}
        self.in_case = 0
        self.orig_randn = inpaint_mod.randn_tensor
        self.orig_sample = vae_mod.DiagonalGaussianDistribution.sample

    def __enter__(self):
        me = self

        def randn(shape, generator=None, device=None, dtype=None, layout=None):
            B, n = shape[0], math.prod(shape[1:])
            rows = np.stack([philox(me.seed, b, n) for b in range(B)]).reshape(shape)
            me.calls["noise"] += 1
            return torch.from_numpy(rows).to(dtype)

        def sample(dist, generator=None):
            assert dist.mean.shape[0] == 1, "one image, encoded once"
            me.calls["posterior"] += 1
            me.in_case += 1
            if me.in_case > 1:  # the masked image (prepare_mask_latents)
                return dist.mean + me.masked_shift
            eps = philox(me.seed, POSTERIOR_STREAM, dist.mean[0].numel()).reshape(dist.mean.shape)
            return dist.mean + dist.std * torch.from_numpy(eps).to(dist.mean.dtype)

        inpaint_mod.randn_tensor = randn
        vae_mod.DiagonalGaussianDistribution.sample = sample
        return self

    def __exit__(self, *exc):
        inpaint_mod.randn_tensor = self.orig_randn
        vae_mod.DiagonalGaussianDistribution.sample = self.orig_sample


def run(pipe, case, noise, pil, mpil):
    name, folder, prompt, neg, tcfg, H, W, steps, strength, gs, msl, nimg, seed, kind = case[:14]
    noise.seed = seed
    noise.in_case = 0
    seen = {}
    orig_enc = pipe._encode_vae_image
    orig_mask = pipe.prepare_mask_latents

    def enc(image, generator):
        lat = orig_enc(image=image, generator=generator)
        seen.setdefault("image_latents", lat.clone())
        return lat

    def mask_lat(*a, **kw):
        mask, mil = orig_mask(*a, **kw)
        seen["mask"] = mask.clone()
        return mask, mil

    pipe._encode_vae_image = enc
    pipe.prepare_mask_latents = mask_lat
    try:
        with torch.no_grad():
            lat = pipe(prompt=prompt, negative_prompt=neg, true_cfg_scale=tcfg, image=pil, mask_image=mpil,
                       height=H, width=W, num_inference_steps=steps, strength=strength, guidance_scale=gs,
                       max_sequence_length=msl, num_images_per_prompt=nimg, output_type="latent",
                       return_dict=False)[0]
    finally:
        pipe._encode_vae_image = orig_enc
        pipe.prepare_mask_latents = orig_mask
    assert noise.in_case == 2, f"{name}: {noise.in_case} posterior draws (image, masked image)"
    return lat, seen


def make_case(pipe, exp, case, noise):
    name, folder, prompt, neg, tcfg, H, W, steps, strength, gs, msl, nimg, seed, kind = case[:14]
    (IH, IW), (MH, MW) = case[14] if len(case) > 14 else ((H, W), (H, W))
    vsf = pipe.vae_scale_factor
    h, w = H // vsf, W // vsf
    assert h * vsf == H and w * vsf == W and h % 2 == 0 and w % 2 == 0, name
    u8 = input_image(IH, IW, seed)
    png = f"{name}_image.png"
    Image.fromarray(u8, "RGB").save(exp / png, optimize=True)
    pil = Image.open(exp / png).convert("RGB")
    assert np.array_equal(np.array(pil), u8)
    m8 = make_mask(MH, MW, kind, seed)
    mpng = f"{name}_mask.png"
    Image.fromarray(m8, "L").save(exp / mpng, optimize=True)
    mpil = Image.open(exp / mpng)
    assert np.array_equal(np.array(mpil.convert("L")), m8)
    # the processors' resizes: the identity at the target size, else PIL's Lanczos (the mask in
    # its own mode L, then binarized)
    rs = u8 if (IH, IW) == (H, W) else np.asarray(pil.resize((W, H), Image.LANCZOS))
    mrs = m8 if (MH, MW) == (H, W) else np.asarray(mpil.resize((W, H), Image.LANCZOS))
    pre = pipe.image_processor.preprocess(pil, height=H, width=W)
    want = torch.from_numpy(rs.astype(np.float32) / 255.0).permute(2, 0, 1)[None] * 2.0 - 1.0
    assert torch.equal(pre.float(), want), f"{name}: preprocess is not Lanczos then the normalization"
    mpre = pipe.mask_processor.preprocess(mpil, height=H, width=W)
    mwant = torch.from_numpy((mrs.astype(np.float32) / 255.0 >= 0.5).astype(np.float32))[None, None]
    assert torch.equal(mpre.float(), mwant), f"{name}: the mask preprocess is not Lanczos then the binarization"

    before = dict(noise.calls)
    noise.masked_shift = 0.0
    lat, seen = run(pipe, case, noise, pil, mpil)
    assert noise.calls["noise"] == before["noise"] + 1
    assert lat.dtype == torch.float64
    if name == CASES[0][0]:  # the masked image's draw changes nothing
        noise.masked_shift = 3.0
        lat2, _ = run(pipe, case, noise, pil, mpil)
        assert torch.equal(lat, lat2), "the masked image's latents reached the loop"
    B = nimg
    init = min(steps * strength, steps)
    t_start = int(max(steps - init, 0))
    fin = FluxPipeline._unpack_latents(lat, H, W, vsf)
    mask_grid = FluxPipeline._unpack_latents(seen["mask"], H, W, vsf)[0, 0]  # (h, w), every channel alike
    assert torch.equal(FluxPipeline._unpack_latents(seen["mask"], H, W, vsf)[0],
                       mask_grid[None].expand(16, h, w))
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
        steps_run=steps - t_start, mask_kind=kind, repainted=int(mask_grid.sum()),
        image=png, image_u8=npy(exp, p + "image_u8.npy", u8, np.uint8),
        mask=mpng, mask_u8=npy(exp, p + "mask_u8.npy", m8, np.uint8),
        input_height=IH, input_width=IW, mask_height=MH, mask_width=MW,
        image_resized_u8=npy(exp, p + "image_resized_u8.npy", rs, np.uint8) if (IH, IW) != (H, W) else None,
        mask_resized_u8=npy(exp, p + "mask_resized_u8.npy", mrs, np.uint8) if (MH, MW) != (H, W) else None,
        mask_latents=npy(exp, p + "mask_latents.npy", mask_grid),
        image_latents=npy(exp, p + "image_latents.npy", seen["image_latents"]),
        final_latents=npy(exp, p + "final_latents.npy", fin),
        out_u8=npy(exp, p + "out_u8.npy", out_u8, np.uint8),
    )
    print(f"{name}: B={B} {H}x{W} latent {h}x{w} steps {steps} strength {strength} -> t_start {t_start}, "
          f"mask {kind}: {entry['repainted']} of {h * w} latent cells repainted")
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
            pipe = FluxInpaintPipeline.from_pretrained(tmp / "pipes" / name, torch_dtype=torch.float64)
            pipe.set_progress_bar_config(disable=True)
            for m in (pipe.transformer, pipe.vae, pipe.text_encoder, pipe.text_encoder_2):
                assert all(t.dtype == torch.float64 for t in m.parameters())
            pipes[name] = pipe
        with DitdNoise() as noise:
            cases = [make_case(pipes[c[1]], exp, c, noise) for c in CASES]
    assert len(cases) >= 6
    meta = dict(diffusers=diffusers.__version__, transformers=transformers.__version__,
                torch=torch.__version__, compute="float64", stored="float32 (u8 arrays uint8)",
                posterior_stream=hex(POSTERIOR_STREAM), cases=cases)
    write_json(exp / "cases.json", meta)
    print(f"{len(cases)} cases -> {exp}")


if __name__ == "__main__":
    main()
