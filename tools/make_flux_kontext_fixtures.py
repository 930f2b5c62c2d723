#!/usr/bin/env python3
"""Build the FluxKontextPipeline fixtures: what Diffusers' FluxKontextPipeline makes, in float64,
from the tiny FLUX.1-dev folder of tests/fixtures/flux_pipeline under that class
(tests/fixtures/flux_kontext/).

What it is: a script that assembles the dev folder exactly as the build does
(tests/fixtures/tokenizers/unpack.py, tests/fixtures/flux_pipeline/assemble.py, real CLIP and T5
vocabularies), loads it with FluxKontextPipeline.from_pretrained(folder,
torch_dtype=torch.float64) (the components are FluxPipeline's) and runs the cases of CASES. The
reference images are already at the size the pipeline brings them to (a multiple of
vae_scale_factor x 2; with _auto_resize, a preferred resolution of their aspect ratio), so
VaeImageProcessor.resize / preprocess resize nothing (PIL's resize to the image's own size is a
copy; the tool asserts the preprocessed tensor is the plain normalization): no resampling filter
is involved. Each case gives max_area, so the output stays small: the pipeline's own size rule
(the request's aspect ratio at max_area pixels, rounded down to 16) is part of what is checked.

The noise is ditd's, so that the C test runs the real path from a seed: prepare_latents'
randn_tensor((B, C, h, w)) is replaced, with the same shape, by engine/core/philox.h's normals
(image b's row is ditd_philox_normal(seed, b, 0, C h w); the Python definition in
tools/make_sampler_fixtures.py). Kontext draws nothing else: its VAE encode is
retrieve_latents(sample_mode="argmax"), the posterior's mode (the tool asserts no posterior sample
is drawn). Everything else is stock Diffusers 0.42.

The preferred-resolution reference (_auto_resize on) is about a megapixel; to keep the committed
files small it is stored as a small image (<name>_ref_u8.npy) that is blown up by an integer
factor (cases.json's ref_upscale, every pixel repeated in a block: np.kron), which the C test does
the same way, and as <name>_ref.png at full size (blocks compress well) for the command line.

Writes tests/fixtures/flux_kontext/expected/cases.json and, per case, <name>_ref[<k>].png (the
references, RGB 8-bit), <name>_ref[<k>]_u8.npy ((h, w, 3) before the blow-up),
<name>_ref_latents.npy ((K, 16, rh, rw): each reference's mode, shifted and scaled, ditd's
unpacked layout), <name>_timesteps.npy, <name>_final_latents.npy ((B, 16, h, w)) and
<name>_out_u8.npy ((B, H, W, 3)); float arrays float32 (the float64 results rounded once).

What it is not: part of the build or the tests. Re-run only when a fixture must change:

    python tools/make_flux_kontext_fixtures.py [--out tests/fixtures/flux_kontext]

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
import diffusers.pipelines.flux.pipeline_flux_kontext as kontext_mod
from diffusers import FluxKontextPipeline, FluxPipeline
from diffusers.models.autoencoders import vae as vae_mod

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_sampler_fixtures import philox_normal  # noqa: E402  (engine/core/philox.h in Python)

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "tests" / "fixtures" / "flux_kontext"
FLUX = REPO / "tests" / "fixtures" / "flux_pipeline"
UNPACK = REPO / "tests" / "fixtures" / "tokenizers" / "unpack.py"

# name, prompt, negative prompt, true_cfg_scale, requested height, width, max_area, references
# [(h, w, upscale)] (none: text-to-image), _auto_resize, steps, guidance_scale,
# max_sequence_length, num_images_per_prompt, seed
CASES = [
    # the reference of the output's aspect ratio; the request 64x96 brought to max_area 32x48
    ("ref_same_ar", "make the sky purple", None, 1.0, 64, 96, 32 * 48, [(32, 48, 1)], False, 4, 3.5, 77,
     1, 21),
    # a reference of another aspect ratio; max_area 1600 at 3:2 rounds to 49 x 33, down to 48 x 32
    ("ref_other_ar", "Crème brûlée in São Paulo, 東京 🍮", None, 1.0, 32, 48, 40 * 40, [(64, 32, 1)],
     False, 4, 2.5, 77, 1, 22),
    # one reference for two images (num_images_per_prompt 2: the latents repeated)
    ("batch2_one_ref", "two cats on a sofa", None, 1.0, 48, 32, 48 * 32, [(32, 32, 1)], False, 3, 3.5,
     77, 2, 23),
    # two references, one per image (image=[a, b], num_images_per_prompt 2)
    ("batch2_two_refs", "a lighthouse at dusk", None, 1.0, 32, 32, 32 * 32, [(48, 32, 1), (48, 32, 1)],
     False, 3, 3.5, 16, 2, 24),
    # true CFG with a negative prompt
    ("true_cfg", "a bowl of ramen", "blurry, watermark", 2.0, 32, 48, 32 * 48, [(32, 32, 1)], False, 4,
     3.5, 77, 1, 25),
    # _auto_resize on, the reference already at a preferred resolution (880 x 1184, 3:4-ish):
    # stored as 55 x 74 blown up 16 times
    ("auto_resize_preferred", "a cozy cabin, 雪, 🌲", None, 1.0, 32, 32, 32 * 32, [(74, 55, 16)], True,
     2, 3.5, 77, 1, 26),
    # no image: text-to-image at max_area
    ("no_image", "a red fox in the snow, watercolor", None, 1.0, 48, 48, 48 * 48, [], True, 3, 3.5,
     77, 1, 27),
]


def philox(seed, sample, n):
    return np.array(philox_normal(seed, sample, 0, n), dtype=np.uint32).view(np.float32)


class DitdNoise:
    """The pipeline's randn_tensor replaced by ditd's Philox streams under the current case's
    seed (see the file header); the posterior's sample made to fail (Kontext takes the mode)."""

    def __init__(self):
        self.seed = None
        self.calls = 0
        self.orig_randn = kontext_mod.randn_tensor
        self.orig_sample = vae_mod.DiagonalGaussianDistribution.sample

    def __enter__(self):
        me = self

        def randn(shape, generator=None, device=None, dtype=None, layout=None):
            B, n = shape[0], math.prod(shape[1:])
            rows = np.stack([philox(me.seed, b, n) for b in range(B)]).reshape(shape)
            me.calls += 1
            return torch.from_numpy(rows).to(dtype)

        def sample(dist, generator=None):
            raise AssertionError("FluxKontextPipeline drew a posterior sample")

        kontext_mod.randn_tensor = randn
        vae_mod.DiagonalGaussianDistribution.sample = sample
        return self

    def __exit__(self, *exc):
        kontext_mod.randn_tensor = self.orig_randn
        vae_mod.DiagonalGaussianDistribution.sample = self.orig_sample


def ref_image(H, W, seed):
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
    name, prompt, neg, tcfg, RH, RW, max_area, refs, auto, steps, gs, msl, nimg, seed = case
    vsf = pipe.vae_scale_factor
    mult = vsf * 2
    # the pipeline's size rule, in Python as it writes it
    ar = RW / RH
    W = round((max_area * ar) ** 0.5) // mult * mult
    H = round((max_area / ar) ** 0.5) // mult * mult
    h, w = H // vsf, W // vsf
    pils, ref_entries = [], []
    for k, (sh, sw, up) in enumerate(refs):
        small = ref_image(sh, sw, seed * 10 + k)
        big = np.kron(small, np.ones((up, up, 1), dtype=np.uint8)) if up > 1 else small
        png = f"{name}_ref{k if len(refs) > 1 else ''}.png"
        Image.fromarray(big, "RGB").save(exp / png, optimize=True)
        pil = Image.open(exp / png).convert("RGB")
        assert np.array_equal(np.array(pil), big)
        pils.append(pil)
        ref_entries.append(dict(png=png, upscale=up, height=big.shape[0], width=big.shape[1],
                                u8=npy(exp, f"{name}_ref{k if len(refs) > 1 else ''}_u8.npy", small,
                                       np.uint8)))
    image = None if not pils else (pils[0] if len(pils) == 1 else pils)
    RHt = RWt = 0
    if pils:
        # the reference's size as __call__ computes it; it must be the image's own
        ih, iw = pipe.image_processor.get_default_height_width(pils[0])
        rar = iw / ih
        if auto:
            _, iw, ih = min((abs(rar - pw / ph), pw, ph) for pw, ph in kontext_mod.PREFERRED_KONTEXT_RESOLUTIONS)
        RWt, RHt = iw // mult * mult, ih // mult * mult
        for pil in pils:
            assert (pil.width, pil.height) == (RWt, RHt), f"{name}: reference not at {RWt}x{RHt}"
            pre = pipe.image_processor.preprocess(pipe.image_processor.resize(pil, RHt, RWt), RHt, RWt)
            u8 = np.array(pil)
            want = torch.from_numpy(u8.astype(np.float32) / 255.0).permute(2, 0, 1)[None] * 2.0 - 1.0
            assert torch.equal(pre.float(), want), f"{name}: preprocess is not the plain normalization"

    noise.seed = seed
    before = noise.calls
    seen = {}
    orig_enc = pipe._encode_vae_image

    def enc(image, generator):
        lat = orig_enc(image=image, generator=generator)
        seen["ref_latents"] = lat.clone()
        return lat

    pipe._encode_vae_image = enc
    try:
        with torch.no_grad():
            lat = pipe(image=image, prompt=prompt, negative_prompt=neg, true_cfg_scale=tcfg, height=RH,
                       width=RW, num_inference_steps=steps, guidance_scale=gs, max_sequence_length=msl,
                       num_images_per_prompt=nimg, output_type="latent", max_area=max_area,
                       _auto_resize=auto, return_dict=False)[0]
    finally:
        pipe._encode_vae_image = orig_enc
    assert noise.calls == before + 1
    assert lat.dtype == torch.float64
    B = nimg
    assert lat.shape == (B, (h // 2) * (w // 2), 64), (name, lat.shape, H, W)
    fin = FluxPipeline._unpack_latents(lat, H, W, vsf)
    with torch.no_grad():
        z = fin / pipe.vae.config.scaling_factor + pipe.vae.config.shift_factor
        img = pipe.vae.decode(z, return_dict=False)[0]
        img = pipe.image_processor.postprocess(img, output_type="np")
    out_u8 = (img * 255).round().astype(np.uint8)
    p = f"{name}_"
    entry = dict(
        name=name, prompt=prompt, negative_prompt=neg, true_cfg_scale=tcfg, request_height=RH,
        request_width=RW, max_area=max_area, auto_resize=auto, height=H, width=W,
        num_inference_steps=steps, guidance_scale=gs, max_sequence_length=msl,
        num_images_per_prompt=nimg, batch=B, seed=seed, latent_channels=16, latent_height=h,
        latent_width=w, vae_scale_factor=vsf, refs=ref_entries, ref_height=RHt, ref_width=RWt,
        timesteps=npy(exp, p + "timesteps.npy", pipe.scheduler.timesteps),
        final_latents=npy(exp, p + "final_latents.npy", fin),
        out_u8=npy(exp, p + "out_u8.npy", out_u8, np.uint8),
    )
    if pils:
        assert seen["ref_latents"].shape == (len(pils), 16, RHt // vsf, RWt // vsf)
        entry["ref_latents"] = npy(exp, p + "ref_latents.npy", seen["ref_latents"])
    print(f"{name}: B={B} request {RW}x{RH} max_area {max_area} -> {W}x{H}, "
          f"{len(pils)} reference(s) {RWt}x{RHt} (auto_resize {auto}), {steps} steps")
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
        folder = tmp / "pipes" / "dev"
        mi = json.loads((folder / "model_index.json").read_text())
        mi["_class_name"] = "FluxKontextPipeline"
        (folder / "model_index.json").write_text(json.dumps(mi, indent=2))
        pipe = FluxKontextPipeline.from_pretrained(folder, torch_dtype=torch.float64)
        pipe.set_progress_bar_config(disable=True)
        for m in (pipe.transformer, pipe.vae, pipe.text_encoder, pipe.text_encoder_2):
            assert all(t.dtype == torch.float64 for t in m.parameters())
        with DitdNoise() as noise:
            cases = [make_case(pipe, exp, c, noise) for c in CASES]
    assert len(cases) >= 7
    meta = dict(diffusers=diffusers.__version__, transformers=transformers.__version__,
                torch=torch.__version__, compute="float64", stored="float32 (u8 arrays uint8)",
                pipeline="FluxKontextPipeline", cases=cases)
    write_json(exp / "cases.json", meta)
    print(f"{len(cases)} cases -> {exp}")


if __name__ == "__main__":
    main()
