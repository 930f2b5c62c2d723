#!/usr/bin/env python3
"""Build the WanImageToVideoPipeline fixtures that ditd's C tests compare against.

What it is: a script that writes, under tests/fixtures/wan_pipeline/,
  i2v21/     Wan 2.1 I2V-like (WanImageToVideoPipeline with a tiny CLIPVisionModel
             image_encoder/ (257 tokens: image_size 32, patch 2) and its image_processor/
             (CLIPImageProcessor, shortest_edge 36 bicubic, crop 32), a 36-channel
             WanTransformer3DModel with the image branch (image_dim, added_kv_proj_dim));
  i2v22/     Wan 2.2 I2V-A14B-like (no image encoder, two 36-channel experts,
             boundary_ratio 0.875, expand_timesteps false);
  flf2v/     Wan 2.1 FLF2V-like (last_image; a transformer with pos_embed_seq_len 514 for both
             images' CLIP tokens): its own transformer/, i2v21's image encoder and processor;
  ti2vi/     Wan 2.2 TI2V-5B-like in image mode (expand_timesteps: the image's latents replace
             the first latent frame, at t = 0): only model_index.json, ti2v/'s transformer and
             48-channel VAE;
both taking wan21/'s scheduler, UMT5 text encoder (real vocabulary) and VAE (assemble.py
copies them), and expected_i2v/: what Diffusers' WanImageToVideoPipeline makes in float64
(cases.json lists the .npy files): the input image (PNG), the CLIP pixel values and
image_embeds (hidden_states[-2]), the condition (mask + VAE latents, 20 channels), the
timesteps, the final latents and the decoded frames; plus clip_vision/: the tower on random
pixels against transformers float64 and PIL resizes of random images (bicubic and lanczos,
up and down) that ditd's image_resize.c must equal byte for byte.

As tools/make_wan_pipeline_fixtures.py: the latents given are kept float64 (prepare_latents
would cast them to float32), so the whole trajectory is float64. With no torchvision
installed, transformers 5's CLIPImageProcessor is its PIL backend (CLIPImageProcessorPil):
PIL's bicubic resize, numpy rescale and normalize -- what ditd reproduces.

What it is not: part of the build or the tests. Run it again only when a fixture changes:

    /root/ditd-venv/bin/python tools/make_wan_i2v_fixtures.py [--out tests/fixtures/wan_pipeline]
"""

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import PIL.Image
import safetensors.torch
import torch
import transformers
from transformers import CLIPImageProcessor, CLIPVisionConfig, CLIPVisionModel

import diffusers
from diffusers import WanImageToVideoPipeline, WanTransformer3DModel

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_wan_pipeline_fixtures as base  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "tests" / "fixtures" / "wan_pipeline"

CLIP = dict(hidden_size=8, intermediate_size=16, num_hidden_layers=3, num_attention_heads=2,
            num_channels=3, image_size=32, patch_size=2, hidden_act="gelu", layer_norm_eps=1e-5,
            projection_dim=8)
PROCESSOR = {"crop_size": {"height": 32, "width": 32}, "do_center_crop": True,
             "do_convert_rgb": True, "do_normalize": True, "do_rescale": True, "do_resize": True,
             "image_mean": [0.48145466, 0.4578275, 0.40821073],
             "image_processor_type": "CLIPImageProcessor",
             "image_std": [0.26862954, 0.26130258, 0.27577711], "resample": 3,
             "rescale_factor": 0.00392156862745098, "size": {"shortest_edge": 36}}
TR_I2V21 = dict(base.TRANSFORMER, in_channels=36, out_channels=16, image_dim=CLIP["hidden_size"],
                added_kv_proj_dim=24)
TR_FLF2V = dict(TR_I2V21, pos_embed_seq_len=2 * 257)
TR_I2V22 = dict(base.TRANSFORMER, in_channels=36, out_channels=16)
INDEX = {
    "_class_name": "WanImageToVideoPipeline",
    "scheduler": ["diffusers", "UniPCMultistepScheduler"],
    "text_encoder": ["transformers", "UMT5EncoderModel"],
    "tokenizer": ["transformers", "T5TokenizerFast"],
    "transformer": ["diffusers", "WanTransformer3DModel"],
    "vae": ["diffusers", "AutoencoderKLWan"],
}

CASES_21 = [
    ("i2v21_5f_32x48", dict(prompt="A cat walks on the grass, realistic", negative_prompt="blurry",
                            height=32, width=48, num_frames=5, num_inference_steps=3,
                            max_sequence_length=512), (48, 32)),
    ("i2v21_9f_48x32_nocfg", dict(prompt="waves on rocks", height=48, width=32, num_frames=9,
                                  num_inference_steps=2, guidance_scale=1.0,
                                  max_sequence_length=512),
     (32, 48)),
]
CASES_22 = [
    ("i2v22_5f_32x48_experts", dict(prompt="a red fox running through snow", height=32, width=48,
                                    num_frames=5, num_inference_steps=4, guidance_scale=4.0,
                                    guidance_scale_2=2.5, max_sequence_length=32), (48, 32)),
    ("i2v22_9f_32x32_videos2_nocfg", dict(prompt="a lighthouse", height=32, width=32,
                                          num_frames=9, num_inference_steps=4, guidance_scale=1.0,
                                          num_videos_per_prompt=2, max_sequence_length=16),
     (32, 32)),
]
# Wan 2.2 TI2V-5B-like in image mode (WanImageToVideoPipeline with expand_timesteps: the image's
# latents replace the first latent frame, held at t = 0); ti2v's transformer and VAE
# FLF2V-like (Wan 2.1 with last_image: both images' CLIP tokens through pos_embed, the last frame
# in the condition video and the mask); i2v21's image encoder, its own transformer
CASES_FLF2V = [
    ("flf2v_9f_32x48", dict(prompt="a flower opens", negative_prompt="blurry", height=32,
                            width=48, num_frames=9, num_inference_steps=3,
                            max_sequence_length=512), (48, 32)),
]
CASES_TI2VI = [
    ("ti2vi_5f_64x32", dict(prompt="waves crashing on rocks at sunset", height=64, width=32,
                            num_frames=5, num_inference_steps=3, max_sequence_length=16), (32, 64)),
    ("ti2vi_9f_32x64_resized", dict(prompt="a red balloon over a city", negative_prompt="fog",
                                    height=32, width=64, num_frames=9, num_inference_steps=3,
                                    guidance_scale=3.0, max_sequence_length=16), (48, 24)),
]


def picture(w, h, seed):
    """A smooth RGB picture with some texture (bytes), so the VAE sees structure."""
    r = np.random.RandomState(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    img = np.zeros((h, w, 3))
    for c in range(3):
        a, b, p = r.uniform(0.05, 0.3), r.uniform(0.05, 0.3), r.uniform(0, 6.3)
        img[..., c] = 0.5 + 0.35 * np.sin(a * x + b * y + p) + 0.1 * r.randn(h, w)
    return np.clip(np.round(img * 255), 0, 255).astype(np.uint8)


def make_i2v21(d, gen):
    base.write_json(d / "model_index.json",
                    dict(INDEX, _diffusers_version=diffusers.__version__,
                         image_encoder=["transformers", "CLIPVisionModel"],
                         image_processor=["transformers", "CLIPImageProcessor"],
                         transformer_2=[None, None], boundary_ratio=None, expand_timesteps=False))
    enc = CLIPVisionModel(CLIPVisionConfig(**CLIP)).to(torch.float64)
    base.randomize(enc, gen)
    enc.to(torch.float32).save_pretrained(d / "image_encoder", safe_serialization=True)
    base.write_json(d / "image_processor" / "preprocessor_config.json", PROCESSOR)
    tr = WanTransformer3DModel(**TR_I2V21).to(torch.float64)
    base.randomize(tr, gen)
    tr.to(torch.float32).save_pretrained(d / "transformer", safe_serialization=True)


def make_i2v22(d, gen):
    base.write_json(d / "model_index.json",
                    dict(INDEX, _diffusers_version=diffusers.__version__, image_encoder=[None, None],
                         image_processor=[None, None], transformer_2=["diffusers", "WanTransformer3DModel"],
                         boundary_ratio=0.875, expand_timesteps=False))
    for sub in ("transformer", "transformer_2"):
        tr = WanTransformer3DModel(**TR_I2V22).to(torch.float64)
        base.randomize(tr, gen)
        tr.to(torch.float32).save_pretrained(d / sub, safe_serialization=True)


def make_flf2v(d, gen):
    base.write_json(d / "model_index.json",
                    dict(INDEX, _diffusers_version=diffusers.__version__,
                         image_encoder=["transformers", "CLIPVisionModel"],
                         image_processor=["transformers", "CLIPImageProcessor"],
                         transformer_2=[None, None], boundary_ratio=None, expand_timesteps=False))
    tr = WanTransformer3DModel(**TR_FLF2V).to(torch.float64)
    base.randomize(tr, gen)
    tr.to(torch.float32).save_pretrained(d / "transformer", safe_serialization=True)


def make_ti2vi(d):
    base.write_json(d / "model_index.json",
                    dict(INDEX, _diffusers_version=diffusers.__version__, image_encoder=[None, None],
                         image_processor=[None, None], transformer_2=[None, None],
                         boundary_ratio=None, expand_timesteps=True))


def load_pipe(d):
    kw = {} if (d / "image_encoder").is_dir() else dict(image_encoder=None, image_processor=None)
    pipe = WanImageToVideoPipeline.from_pretrained(d, torch_dtype=torch.float64, **kw)
    pipe.set_progress_bar_config(disable=True)
    for m in (pipe.transformer, pipe.transformer_2, pipe.image_encoder):
        if m is not None:
            m.to(torch.float64)
    orig = pipe.prepare_latents

    def prepare_latents(*a, **k):  # dtype (the 7th) float64: the given latents stay float64
        a = list(a)
        a[6] = torch.float64
        return orig(*a, **k)
    pipe.prepare_latents = prepare_latents
    base.check_float64(pipe)
    return pipe


def make_case(pipe, exp, index, case, folder):
    name, kw, (iw, ih) = case
    img = picture(iw, ih, 900 + index)
    png = f"{name}_image.png"
    PIL.Image.fromarray(img).save(exp / png)
    image = PIL.Image.open(exp / png).convert("RGB")
    flf = folder == "flf2v"
    extra = {}
    if flf:  # the last frame: another picture of the same size
        limg = picture(iw, ih, 950 + index)
        lpng = f"{name}_last_image.png"
        PIL.Image.fromarray(limg).save(exp / lpng)
        extra["last_image"] = PIL.Image.open(exp / lpng).convert("RGB")
    per = kw.get("num_videos_per_prompt", 1)
    B = per
    vs, vt = pipe.vae_scale_factor_spatial, pipe.vae_scale_factor_temporal
    H, W, N = kw["height"], kw["width"], kw["num_frames"]
    F, h, w = (N - 1) // vt + 1, H // vs, W // vs
    g = kw.get("guidance_scale", 5.0)
    gen = torch.Generator().manual_seed(8100 + index)
    Z = pipe.vae.config.z_dim
    noise = torch.randn((B, Z, F, h, w), generator=gen, dtype=torch.float32)
    seen = {}
    tr_fwd = pipe.transformer.forward

    def spy(*a, **k):  # the first step's inputs: the condition channels, the image embeds
        if "x" not in seen:
            seen["x"] = k["hidden_states"].detach().clone()
            e = k.get("encoder_hidden_states_image")
            seen["e"] = None if e is None else e.detach().clone()
        return tr_fwd(*a, **k)
    pipe.transformer.forward = spy

    def run(out):
        with torch.no_grad():
            return pipe(image=image, **kw, **extra, latents=noise.to(torch.float64).clone(),
                        output_type=out, return_dict=False)[0]
    lat = run("latent")
    pipe.transformer.forward = tr_fwd
    assert lat.dtype == torch.float64 and lat.shape == (B, Z, F, h, w), (name, lat.shape)
    timesteps = pipe.scheduler.timesteps.clone()
    assert torch.equal(run("latent"), lat), f"{name}: not deterministic"
    frames = run("np")
    assert frames.shape == (B, N, H, W, 3), (name, frames.shape)
    u8 = np.round(frames * 255).astype(np.uint8)
    if pipe.config.expand_timesteps:  # the first latent frame of the input is the condition
        cond = seen["x"][:B, :, 0:1]
        assert cond.shape == (B, Z, 1, h, w), cond.shape
        assert torch.equal(lat[:, :, 0:1], cond), f"{name}: the result's first frame"
    else:
        cond = seen["x"][:B, 16:]
        assert cond.shape == (B, 20, F, h, w), cond.shape
    moved = float(((lat - noise.double()).abs().max() / lat.abs().max()).item())
    assert moved > 1e-2, f"{name}: the latents hardly moved ({moved})"
    p = f"{name}_"
    entry = dict(name=name, folder=folder, prompts=[kw["prompt"]], batch=B,
                 num_videos_per_prompt=per, negative_prompts=base.as_list(kw.get("negative_prompt"), 1),
                 image=png, image_u8=base.npy(exp, p + "image_u8.npy", img, np.uint8),
                 image_width=iw, image_height=ih, height=H, width=W, num_frames=N,
                 latent_frames=F, latent_height=h, latent_width=w,
                 num_inference_steps=kw["num_inference_steps"], guidance_scale=g,
                 max_sequence_length=kw["max_sequence_length"], cfg_used=g > 1,
                 noise=base.npy(exp, p + "noise.npy", noise),
                 condition=base.npy(exp, p + "condition.npy", cond[0]),
                 timesteps=base.npy(exp, p + "timesteps.npy", timesteps),
                 final_latents=base.npy(exp, p + "final_latents.npy", lat),
                 frames_u8=base.npy(exp, p + "frames_u8.npy", u8, np.uint8))
    if seen["e"] is not None:
        with torch.no_grad():
            px = pipe.image_processor(images=image, return_tensors="pt")["pixel_values"]
        entry["pixel_values"] = base.npy(exp, p + "pixel_values.npy", px[0])
        # FLF2V: (2, 257, D) for one video, which the transformer views as (1, 514, D)
        e = seen["e"].reshape(B, -1, seen["e"].shape[-1]) if flf else seen["e"]
        entry["image_embeds"] = base.npy(exp, p + "image_embeds.npy", e[0])
    if flf:
        entry["last_image"] = lpng
        entry["last_image_u8"] = base.npy(exp, p + "last_image_u8.npy", limg, np.uint8)
    if "guidance_scale_2" in kw:
        entry["guidance_scale_2"] = kw["guidance_scale_2"]
    if pipe.transformer_2 is not None:
        bt = pipe.config.boundary_ratio * pipe.scheduler.config.num_train_timesteps
        entry["expert_per_step"] = [1 if t >= bt else 2 for t in timesteps.tolist()]
        assert 1 in entry["expert_per_step"] and 2 in entry["expert_per_step"], name
    print(f"{name}: B={B} {N} frames {H}x{W} image {iw}x{ih} steps {kw['num_inference_steps']} "
          f"cfg {g > 1} moved {moved:.3f}")
    return entry


def make_clip_vision(out, enc_dir):
    """The tower on random pixels against float64; PIL resizes byte for byte."""
    out.mkdir(parents=True)
    enc = CLIPVisionModel.from_pretrained(enc_dir, torch_dtype=torch.float64).eval()
    gen = torch.Generator().manual_seed(31)
    px = torch.randn((2, 3, 32, 32), generator=gen, dtype=torch.float32)
    with torch.no_grad():
        hs = enc(pixel_values=px.to(torch.float64), output_hidden_states=True).hidden_states
    meta = dict(pixels=base.npy(out, "pixels.npy", px),
                hidden=[base.npy(out, f"hidden_{i}.npy", hs[i]) for i in range(len(hs))])
    resizes = []
    r = np.random.RandomState(5)
    # up, down, mixed (both orders), one axis; CLIP-like shortest-edge reductions; two
    # reductions where Pillow 13 runs the vertical pass first (ditd does not: measured)
    for i, (w, h, ow, oh, f) in enumerate([(48, 32, 54, 36, 3), (37, 53, 16, 23, 3),
                                            (64, 40, 21, 13, 3), (30, 30, 45, 17, 1),
                                            (50, 26, 19, 40, 1), (33, 21, 33, 29, 2),
                                            (104, 60, 48, 28, 3), (60, 104, 28, 48, 3),
                                            (20, 64, 9, 9, 3), (12, 40, 9, 30, 1)]):
        img = r.randint(0, 256, (h, w, 3)).astype(np.uint8)
        pil = PIL.Image.fromarray(img)
        res = np.asarray(pil.resize((ow, oh), resample=f))
        hv = np.array_equal(res, np.asarray(pil.resize((ow, h), f).resize((ow, oh), f)))
        vh = np.array_equal(res, np.asarray(pil.resize((w, oh), f).resize((ow, oh), f)))
        order = "HV" if hv and not vh else "VH" if vh and not hv else "either" if hv else "?"
        resizes.append(dict(w=w, h=h, ow=ow, oh=oh, resample=f, pil_order=order,
                            input=base.npy(out, f"resize_{i}_in.npy", img, np.uint8),
                            output=base.npy(out, f"resize_{i}_out.npy", res, np.uint8)))
    meta["resizes"] = resizes
    base.write_json(out / "cases.json", meta)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args()
    torch.set_num_threads(2)
    torch.use_deterministic_algorithms(True)
    transformers.logging.set_verbosity_error()
    diffusers.utils.logging.set_verbosity_error()
    out = args.out
    for sub in ("i2v21", "i2v22", "ti2vi", "flf2v", "expected_i2v"):
        shutil.rmtree(out / sub, ignore_errors=True)
    gen = torch.Generator().manual_seed(2424)
    make_i2v21(out / "i2v21", gen)
    make_i2v22(out / "i2v22", gen)
    make_ti2vi(out / "ti2vi")
    make_flf2v(out / "flf2v", gen)
    exp = out / "expected_i2v"
    exp.mkdir()
    make_clip_vision(exp / "clip_vision", out / "i2v21" / "image_encoder")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        subprocess.run([sys.executable, str(base.UNPACK), str(tmp / "tok"), str(tmp / "tok.stamp")],
                       check=True)
        subprocess.run([sys.executable, str(out / "assemble.py"), str(tmp / "tok"),
                        str(tmp / "pipes"), str(tmp / "pipes.stamp")], check=True)
        cases = []
        for folder, fcases in (("i2v21", CASES_21), ("i2v22", CASES_22), ("ti2vi", CASES_TI2VI),
                               ("flf2v", CASES_FLF2V)):
            pipe = load_pipe(tmp / "pipes" / folder)
            assert isinstance(pipe.image_processor, CLIPImageProcessor) == (folder == "i2v21") or \
                pipe.image_processor is not None or folder == "i2v22"
            for c in fcases:
                cases.append(make_case(pipe, exp, len(cases), c, folder))
    assert len(cases) >= 7
    base.write_json(exp / "cases.json",
                    dict(diffusers=diffusers.__version__, transformers=transformers.__version__,
                         torch=torch.__version__, compute="float64", stored="float32",
                         cases=cases))
    print(f"{len(cases)} cases -> {exp}")


if __name__ == "__main__":
    main()
