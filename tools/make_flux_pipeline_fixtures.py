#!/usr/bin/env python3
"""Build the FLUX.1 pipeline fixtures: two tiny FluxPipeline folders and what Diffusers'
FluxPipeline makes with them, in float64 (tests/fixtures/flux_pipeline/).

What it is: a script that makes tiny random-weight Diffusers pipeline components in the
layout of FLUX.1's hub folders --

  dev/      model_index.json, scheduler/ (FLUX.1-dev's: dynamic shifting), transformer/
            (guidance_embeds, 2 double + 1 single blocks), vae/ (4 levels: scale 8)
  schnell/  the same for FLUX.1-schnell (no guidance, 1 + 1 blocks, shift 1.0), vae/ (3
            levels: scale 4)
  common/   text_encoder/ (CLIPTextModel, real vocabulary 49408, 77 positions, eos_token_id
            2: the legacy argmax pooling) and text_encoder_2/ (T5EncoderModel v1.1,
            gated-gelu, vocabulary 32128, two shards + index), shared by the two pipelines
            as FLUX.1-dev and -schnell share theirs

every weight stored in bf16, as FLUX.1's hub files are (the float64 reference is computed
from exactly those rounded values)

-- then assembles complete folders with tests/fixtures/tokenizers/unpack.py (the real
CLIP and T5 tokenizers, FLUX.1's tokenizer/ and tokenizer_2/) and
tests/fixtures/flux_pipeline/assemble.py (the same script meson runs at build time),
loads them with FluxPipeline.from_pretrained(folder, torch_dtype=torch.float64), checks
every weight is float64 and equal to the stored (rounded) value, and runs the cases of
CASES with explicit noise (latents=, recorded), writing expected/cases.json and the .npy
files it lists: noise, token ids, prompt embeddings, sigmas and timesteps, the latents
after every step, the final latents, and the decoded image as float and as uint8. Then it
loads the same folders with torch_dtype=torch.bfloat16 (Diffusers' own bf16 run: nothing is
kept in float32 by these classes; the tool records which parameters are, per component, in
cases.json "bf16_float32_kept") and runs every case again from the same noise, writing
<case>_final_latents_bf16.npy and the bf16 run's errors against the float64 final latents
(bf16_rel, bf16_rel_l2): the bound ditd's bf16 CPU path is held to.
README.md next to the fixtures gives every layout and dtype.

What it is not: part of the build or the tests (tests never need PyTorch). Re-run only
when a fixture must change:

    python tools/make_flux_pipeline_fixtures.py [--out tests/fixtures/flux_pipeline]

It deletes and rewrites the folders it owns (dev/, schnell/, common/, expected/);
re-running gives identical files.
"""

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import safetensors.torch
import torch
import transformers
from transformers import CLIPTextConfig, CLIPTextModel, T5Config, T5EncoderModel

import diffusers
from diffusers import AutoencoderKL, FluxPipeline, FluxTransformer2DModel
from diffusers.pipelines.flux.pipeline_flux import calculate_shift

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_flux_fixtures import pack, unpack  # noqa: E402  (FluxPipeline's 2x2 packing)

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "tests" / "fixtures" / "flux_pipeline"
UNPACK = REPO / "tests" / "fixtures" / "tokenizers" / "unpack.py"
DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}

# The text encoders: tiny, but with the real vocabularies and positions of FLUX.1's
# (openai/clip-vit-large-patch14's text model, google/t5-v1_1-xxl's encoder).
CLIP = dict(vocab_size=49408, hidden_size=6, intermediate_size=14, num_hidden_layers=2,
            num_attention_heads=3, max_position_embeddings=77, hidden_act="quick_gelu",
            layer_norm_eps=1e-5, bos_token_id=0, eos_token_id=2, pad_token_id=1, projection_dim=9)
T5 = dict(vocab_size=32128, d_model=6, d_kv=3, num_heads=3, d_ff=10, num_layers=2,
          feed_forward_proj="gated-gelu", relative_attention_num_buckets=32,
          relative_attention_max_distance=128, layer_norm_epsilon=1e-6, is_encoder_decoder=False,
          use_cache=False)

MODEL_INDEX = {
    "_class_name": "FluxPipeline",
    "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
    "text_encoder": ["transformers", "CLIPTextModel"],
    "text_encoder_2": ["transformers", "T5EncoderModel"],
    "tokenizer": ["transformers", "CLIPTokenizer"],
    "tokenizer_2": ["transformers", "T5TokenizerFast"],
    "transformer": ["diffusers", "FluxTransformer2DModel"],
    "vae": ["diffusers", "AutoencoderKL"],
}

PIPELINES = {
    "dev": dict(
        seed=1101,
        # FLUX.1-dev's scheduler_config.json, key for key
        scheduler=dict(base_image_seq_len=256, base_shift=0.5, max_image_seq_len=4096, max_shift=1.15,
                       num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=True),
        transformer=dict(patch_size=1, in_channels=64, num_layers=2, num_single_layers=1,
                         attention_head_dim=16, num_attention_heads=2, joint_attention_dim=T5["d_model"],
                         pooled_projection_dim=CLIP["hidden_size"], guidance_embeds=True,
                         axes_dims_rope=[4, 4, 8]),
        transformer_dtype="bf16",
        vae=dict(in_channels=3, out_channels=3, latent_channels=16,
                 down_block_types=["DownEncoderBlock2D"] * 4, up_block_types=["UpDecoderBlock2D"] * 4,
                 block_out_channels=[8, 8, 16, 16], layers_per_block=1, norm_num_groups=4,
                 sample_size=64, scaling_factor=0.3611, shift_factor=0.1159, use_quant_conv=False,
                 use_post_quant_conv=False, force_upcast=True, mid_block_add_attention=True),
        vae_dtype="bf16",
    ),
    "schnell": dict(
        seed=1102,
        # FLUX.1-schnell's scheduler_config.json, key for key
        scheduler=dict(base_image_seq_len=256, base_shift=0.5, max_image_seq_len=4096, max_shift=1.15,
                       num_train_timesteps=1000, shift=1.0, use_dynamic_shifting=False),
        transformer=dict(patch_size=1, in_channels=64, num_layers=1, num_single_layers=1,
                         attention_head_dim=16, num_attention_heads=2, joint_attention_dim=T5["d_model"],
                         pooled_projection_dim=CLIP["hidden_size"], guidance_embeds=False,
                         axes_dims_rope=[4, 4, 8]),
        transformer_dtype="bf16",
        vae=dict(in_channels=3, out_channels=3, latent_channels=16,
                 down_block_types=["DownEncoderBlock2D"] * 3, up_block_types=["UpDecoderBlock2D"] * 3,
                 block_out_channels=[8, 16, 16], layers_per_block=1, norm_num_groups=4, sample_size=32,
                 scaling_factor=0.3611, shift_factor=0.1159, use_quant_conv=False,
                 use_post_quant_conv=False, force_upcast=True, mid_block_add_attention=True),
        vae_dtype="bf16",
    ),
}

LONG = ("A sprawling fantasy city at golden hour, seen from a hot air balloon drifting above "
        "terracotta rooftops, winding canals with gondolas, market stalls overflowing with "
        "oranges, lemons and spices, children chasing pigeons across a marble plaza, a "
        "cathedral with stained glass windows catching the low sun, distant snow-capped "
        "mountains, a river delta glittering like hammered copper, flocks of birds in "
        "V formation, laundry lines strung between balconies, a clock tower striking six, "
        "street musicians with violins and accordions, lanterns being lit one by one, "
        "highly detailed, cinematic composition, 35mm film grain, soft volumetric light, "
        "painted in the style of a nineteenth century oil panorama")

# name, pipeline, prompt (str or list), negative prompt, true_cfg_scale, height, width,
# steps, guidance_scale, max_sequence_length, num_images_per_prompt
CASES = [
    ("dev_64_default", "dev", "A photo of an astronaut riding a horse on the moon", None, 1.0,
     64, 64, 4, 3.5, 512, 1),
    ("dev_48x80_accents", "dev", "Crème brûlée à la française, naïve café in São Paulo, Ærø, Straße", None,
     1.0, 48, 80, 3, 1.0, 77, 1),
    ("dev_80x32_cjk", "dev", "一只在雪地里奔跑的红色狐狸，水彩画风格。東京の夜景、ネオン。", None, 1.0,
     80, 32, 2, 3.5, 16, 1),
    ("dev_32_emoji", "dev", "🐱🚀 a cat flying a rocket to the 🌕 ✨👩‍🚀", None, 1.0, 32, 32, 2, 3.5, 128, 1),
    ("dev_48x32_empty", "dev", "", None, 1.0, 48, 32, 3, 3.5, 77, 1),
    ("dev_48x80_long", "dev", LONG, None, 1.0, 48, 80, 2, 3.5, 512, 1),
    ("dev_32x48_batch2", "dev", ["a red cube on a glass table", "Ein Hund im Schnee, Öl auf Leinwand"], None,
     1.0, 32, 48, 2, 3.5, 77, 1),
    ("dev_80x32_images2", "dev", "two lighthouses at dusk", None, 1.0, 80, 32, 3, 1.0, 16, 2),
    ("dev_64_true_cfg", "dev", "a bowl of ramen, studio lighting", "blurry, low quality, watermark", 2.0,
     64, 64, 3, 3.5, 77, 1),
    ("dev_32x48_true_cfg_batch2", "dev", ["a castle on a cliff", "ein Schloss am Meer 🏰"],
     ["fog", ""], 2.0, 32, 48, 2, 1.0, 512, 1),
    ("schnell_64_default", "schnell", "a watercolor fox in the snow", None, 1.0, 64, 64, 4, 0.0, 256, 1),
    ("schnell_32x48_batch2", "schnell", ["a cozy cabin, 雪, 🌲", ""], None, 1.0, 32, 48, 4, 0.0, 512, 1),
    ("schnell_32x64_long", "schnell", LONG, None, 1.0, 32, 64, 2, 0.0, 77, 1),
    ("schnell_80x48", "schnell", "Crème brûlée, 東京, 🍮", None, 1.0, 80, 48, 4, 0.0, 256, 1),
]


def randomize(model, gen):
    """Non-degenerate random weights: every matrix N(0, 1/fan_in), embeddings N(0, 1),
    norm gains 1 + N(0, 0.1^2), biases N(0, 0.1^2); so no layer is the default init."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "embedding" in name or name.endswith("shared.weight") or "relative_attention_bias" in name:
                v = torch.randn(p.shape, generator=gen, dtype=torch.float64)
            elif p.ndim > 1:
                v = torch.randn(p.shape, generator=gen, dtype=torch.float64) / p[0].numel() ** 0.5
            elif "norm" in name and name.endswith("weight"):
                v = 1 + 0.1 * torch.randn(p.shape, generator=gen, dtype=torch.float64)
            else:
                v = 0.1 * torch.randn(p.shape, generator=gen, dtype=torch.float64)
            p.copy_(v.to(p.dtype))


def write_json(path, obj):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n")


def hub_config(folder, extra):
    """transformers 5 writes "dtype"; FLUX.1's hub configs (transformers 4) say "torch_dtype"."""
    cfg = json.loads((folder / "config.json").read_text())
    cfg.pop("transformers_version", None)
    cfg["torch_dtype"] = cfg.pop("dtype", "bfloat16")
    cfg.update(extra)
    write_json(folder / "config.json", cfg)


def make_text_encoders(common):
    """common/text_encoder: one model.safetensors with the text_model. names of FLUX.1's hub
    file (transformers 4 wrote them); common/text_encoder_2: transformers' own sharded save
    (two shards + model.safetensors.index.json, as FLUX.1's)."""
    gen = torch.Generator().manual_seed(1001)
    clip = CLIPTextModel(CLIPTextConfig(**CLIP)).to(torch.float64)
    randomize(clip, gen)
    d = common / "text_encoder"
    d.mkdir(parents=True)
    clip.config.save_pretrained(d)
    sd = {}
    for k, v in clip.state_dict().items():
        if k.endswith("position_ids"):
            continue
        k = k if k.startswith("text_model.") else "text_model." + k
        sd[k] = v.to(torch.bfloat16).contiguous()
    safetensors.torch.save_file(sd, str(d / "model.safetensors"), metadata={"format": "pt"})
    hub_config(d, {"torch_dtype": "bfloat16"})

    gen = torch.Generator().manual_seed(1002)
    t5 = T5EncoderModel(T5Config(**T5)).to(torch.float64)
    randomize(t5, gen)
    d = common / "text_encoder_2"
    t5.to(torch.bfloat16).save_pretrained(d, max_shard_size="300KB")
    assert (d / "model.safetensors.index.json").exists(), "T5 should come in two shards"
    hub_config(d, {"torch_dtype": "bfloat16"})


def make_pipeline(root, name, spec):
    d = root / name
    write_json(d / "model_index.json", dict(MODEL_INDEX, _diffusers_version=diffusers.__version__))
    write_json(d / "scheduler" / "scheduler_config.json",
               dict(spec["scheduler"], _class_name="FlowMatchEulerDiscreteScheduler",
                    _diffusers_version=diffusers.__version__))
    gen = torch.Generator().manual_seed(spec["seed"])
    tr = FluxTransformer2DModel(**spec["transformer"]).to(torch.float64)
    randomize(tr, gen)
    tr.to(DTYPES[spec["transformer_dtype"]]).save_pretrained(d / "transformer", safe_serialization=True)
    vae = AutoencoderKL(**spec["vae"]).to(torch.float64)
    randomize(vae, gen)
    vae.to(DTYPES[spec["vae_dtype"]]).save_pretrained(d / "vae", safe_serialization=True)


def stored_weights(folder):
    """Every tensor of every safetensors file under folder, by name."""
    out = {}
    for f in sorted(folder.glob("*.safetensors")):
        out.update(safetensors.torch.load_file(str(f)))
    return out


def check_float64(pipe, folder):
    """Every parameter and buffer float64, and every weight equal to the stored value."""
    comps = {"text_encoder": pipe.text_encoder, "text_encoder_2": pipe.text_encoder_2,
             "transformer": pipe.transformer, "vae": pipe.vae}
    for cname, m in comps.items():
        for k, t in list(m.named_parameters()) + list(m.named_buffers()):
            if t.is_floating_point():
                assert t.dtype == torch.float64, f"{cname}.{k} is {t.dtype}"
        stored = stored_weights(folder / cname)
        sd = m.state_dict()
        n = 0
        for k, v in stored.items():
            key = k if k in sd else k.removeprefix("text_model.")
            if key not in sd and cname == "text_encoder":
                key = "text_model." + k
            assert key in sd, f"{cname}: stored {k} not in the loaded model"
            assert torch.equal(sd[key], v.to(torch.float64)), f"{cname}.{k} differs from the stored value"
            n += 1
        params = {k for k, _ in m.named_parameters()}
        assert n >= len(params) - 1, f"{cname}: {n} stored tensors for {len(params)} parameters"


def npy(exp, name, a, dtype=np.float32):
    if isinstance(a, torch.Tensor):
        a = a.detach().cpu().numpy()
    np.save(exp / name, np.ascontiguousarray(np.asarray(a).astype(dtype)))
    return name


class DtypeWatch:
    """Forward hooks that record the dtype of every floating output of the four models."""

    def __init__(self, pipe):
        self.seen = {}
        self.handles = []
        for cname in ("text_encoder", "text_encoder_2", "transformer"):
            m = getattr(pipe, cname)
            self.handles.append(m.register_forward_hook(self.hook(cname)))
        self.handles.append(pipe.vae.decoder.register_forward_hook(self.hook("vae.decoder")))

    def hook(self, cname):
        def f(_m, _inp, out):
            t = out[0] if isinstance(out, (tuple, list)) else getattr(out, "last_hidden_state", out)
            if isinstance(t, torch.Tensor):
                self.seen.setdefault(cname, set()).add(t.dtype)
        return f

    def check(self, want):
        for cname in want:
            assert self.seen.get(cname) == {torch.float64}, f"{cname} ran in {self.seen.get(cname)}"
        self.seen = {}


def run(pipe, case, packed, output_type, capture=None):
    _, _, prompt, neg, tcfg, H, W, steps, gs, msl, nimg = case

    def cb(p, i, t, kw):
        if capture is not None:
            capture.append(kw["latents"].clone())
        return {}

    with torch.no_grad():
        return pipe(prompt=prompt, negative_prompt=neg, true_cfg_scale=tcfg, height=H, width=W,
                    num_inference_steps=steps, guidance_scale=gs, max_sequence_length=msl,
                    num_images_per_prompt=nimg, latents=packed.clone(), output_type=output_type,
                    callback_on_step_end=cb, return_dict=False)[0]


def step64(sched):
    """FlowMatchEulerDiscreteScheduler.step without its float32 upcast of the sample (only to
    measure what that upcast costs; the fixtures are stock Diffusers)."""
    def step(model_output, timestep, sample, return_dict=False, **_kw):
        if sched.step_index is None:
            sched._init_step_index(timestep)
        dt = sched.sigmas[sched.step_index + 1] - sched.sigmas[sched.step_index]
        sched._step_index += 1
        return (sample + dt * model_output,)
    return step


def make_case(pipe, exp, index, case, watch):
    name, pname, prompt, neg, tcfg, H, W, steps, gs, msl, nimg = case
    prompts = [prompt] if isinstance(prompt, str) else list(prompt)
    B = len(prompts) * nimg
    vsf = pipe.vae_scale_factor
    h, w = H // vsf, W // vsf
    assert h * vsf == H and w * vsf == W and h % 2 == 0 and w % 2 == 0, name
    C = pipe.transformer.config.in_channels // 4
    gen = torch.Generator().manual_seed(5000 + index)
    noise = torch.randn((B, C, h, w), generator=gen, dtype=torch.float32)
    packed = FluxPipeline._pack_latents(noise, B, C, h, w).to(torch.float64)
    # the packing round-trips, and ours is Diffusers'
    assert torch.equal(packed, pack(noise).to(torch.float64))
    assert torch.equal(FluxPipeline._unpack_latents(packed, H, W, vsf), noise.to(torch.float64))
    assert torch.equal(unpack(pack(noise), h, w), noise)

    steps_lat = []
    lat = run(pipe, case, packed, "latent", steps_lat)
    watch.check(["text_encoder", "text_encoder_2", "transformer"])
    assert lat.dtype == torch.float64 and lat.shape == (B, (h // 2) * (w // 2), 4 * C), (name, lat.shape)
    assert len(steps_lat) == steps and torch.equal(steps_lat[-1], lat)
    sigmas = pipe.scheduler.sigmas.clone()
    timesteps = pipe.scheduler.timesteps.clone()
    seq = (h // 2) * (w // 2)
    cfg = pipe.scheduler.config
    mu = calculate_shift(seq, cfg.base_image_seq_len, cfg.max_image_seq_len, cfg.base_shift, cfg.max_shift)

    steps_np = []
    img = run(pipe, case, packed, "np", steps_np)
    watch.check(["transformer", "vae.decoder"])
    # the same latents again: the float64 run is deterministic
    assert all(torch.equal(a, b) for a, b in zip(steps_lat, steps_np)), f"{name}: not deterministic"
    pil = run(pipe, case, packed, "pil")
    u8 = np.stack([np.array(p) for p in pil])
    assert u8.dtype == np.uint8 and u8.shape == (B, H, W, 3), (name, u8.shape)
    assert img.dtype == np.float32 and img.shape == (B, H, W, 3)
    assert np.array_equal(u8, (img * 255).round().astype(np.uint8)), name
    inside = float(((img > 0.0) & (img < 1.0)).mean())
    assert inside > 0.5, f"{name}: only {inside:.2f} of the pixels are not clipped"

    # what the stock scheduler's float32 upcast of the sample costs against a float64 step
    orig = pipe.scheduler.step
    pipe.scheduler.step = step64(pipe.scheduler)
    try:
        lat64 = run(pipe, case, packed, "latent")
    finally:
        pipe.scheduler.step = orig
    upcast_rel = float(((lat64 - lat).abs().max() / lat.abs().max()).item())

    with torch.no_grad():
        pe, pooled, text_ids = pipe.encode_prompt(prompt=prompts, prompt_2=None, device="cpu",
                                                  num_images_per_prompt=nimg, max_sequence_length=msl)
    assert pe.dtype == torch.float64 and pooled.dtype == torch.float64
    assert pe.shape == (B, msl, pipe.transformer.config.joint_attention_dim)
    assert torch.equal(text_ids, torch.zeros(msl, 3, dtype=torch.float64))
    clip_ids = pipe.tokenizer(prompts, padding="max_length", max_length=pipe.tokenizer_max_length,
                              truncation=True, return_tensors="np").input_ids
    t5_ids = pipe.tokenizer_2(prompts, padding="max_length", max_length=msl, truncation=True,
                              return_tensors="np").input_ids

    p = f"{name}_"
    entry = dict(
        name=name, folder=pname, prompts=prompts,
        negative_prompts=None if neg is None else ([neg] if isinstance(neg, str) else list(neg)),
        prompt_is_list=not isinstance(prompt, str), height=H, width=W,
        num_inference_steps=steps, guidance_scale=gs, true_cfg_scale=tcfg, max_sequence_length=msl,
        num_images_per_prompt=nimg, batch=B, latent_channels=C, latent_height=h, latent_width=w,
        vae_scale_factor=vsf, image_seq_len=seq, mu=mu,
        guidance_used=bool(pipe.transformer.config.guidance_embeds),
        true_cfg_used=bool(tcfg > 1 and neg is not None),
        float64_step_rel_diff=upcast_rel,
        noise=npy(exp, p + "noise.npy", noise),
        clip_ids=npy(exp, p + "clip_ids.npy", clip_ids, np.int64),
        t5_ids=npy(exp, p + "t5_ids.npy", t5_ids, np.int64),
        prompt_embeds=npy(exp, p + "prompt_embeds.npy", pe),
        pooled=npy(exp, p + "pooled.npy", pooled),
        sigmas=npy(exp, p + "sigmas.npy", sigmas),
        timesteps=npy(exp, p + "timesteps.npy", timesteps),
        # the latents after each step but the last (that one is final_latents)
        step_latents=npy(exp, p + "step_latents.npy",
                         torch.stack([FluxPipeline._unpack_latents(s, H, W, vsf) for s in steps_lat[:-1]])),
        final_latents=npy(exp, p + "final_latents.npy", FluxPipeline._unpack_latents(lat, H, W, vsf)),
        image_float=npy(exp, p + "image_float.npy", img),
        image_u8=npy(exp, p + "image_u8.npy", u8, np.uint8),
    )
    if entry["true_cfg_used"]:
        negs = [neg] if isinstance(neg, str) else list(neg)
        with torch.no_grad():
            npe, npooled, _ = pipe.encode_prompt(prompt=negs, prompt_2=None, device="cpu",
                                                 num_images_per_prompt=nimg, max_sequence_length=msl)
        entry["negative_prompt_embeds"] = npy(exp, p + "negative_prompt_embeds.npy", npe)
        entry["negative_pooled"] = npy(exp, p + "negative_pooled.npy", npooled)
    print(f"{name}: B={B} {H}x{W} latent {h}x{w} seq {seq} steps {steps} mu {mu:.4f} "
          f"unclipped {inside:.2f} f64-step rel diff {upcast_rel:.1e}")
    return entry


def errors(got, ref):
    """max|d| / max|ref| and the relative L2 norm, in float64 on the stored float32 arrays (the
    measures tests/test_util.h's tu_compare takes)."""
    got = np.asarray(got, np.float32).astype(np.float64)
    ref = np.asarray(ref, np.float32).astype(np.float64)
    d = np.abs(got - ref)
    return float(d.max() / np.abs(ref).max()), float(np.sqrt((d * d).sum() / (ref * ref).sum()))


def float32_in_bf16(pipe):
    """The parameters and buffers Diffusers / transformers keep in float32 when the pipeline is
    loaded with torch_dtype=torch.bfloat16 (names per component)."""
    out = {}
    for cname in ("text_encoder", "text_encoder_2", "transformer", "vae"):
        m = getattr(pipe, cname)
        kept = sorted(k for k, t in list(m.named_parameters()) + list(m.named_buffers())
                      if t.is_floating_point() and t.dtype != torch.bfloat16)
        out[cname] = kept
    return out


def make_bf16(pipe16, exp, index, case, entry):
    """The same case with Diffusers loaded in bfloat16 (FluxPipeline.from_pretrained(...,
    torch_dtype=torch.bfloat16)): the same prompts and the same float32 noise (the pipeline casts
    the latents to the text encoders' dtype, bf16, as it does for any latents= it is given; the
    scheduler steps in float32 and casts back to bf16). Writes <name>_final_latents_bf16.npy and
    the errors against the float64 final latents into entry."""
    name, _, _, _, _, H, W, _, _, _, _ = case
    vsf = pipe16.vae_scale_factor
    noise = np.load(exp / entry["noise"])
    ref = np.load(exp / entry["final_latents"])
    B, C, h, w = noise.shape
    packed = FluxPipeline._pack_latents(torch.from_numpy(noise), B, C, h, w)
    lat = run(pipe16, case, packed, "latent")
    assert lat.dtype == torch.bfloat16 and lat.shape == packed.shape, (name, lat.dtype, lat.shape)
    fin = FluxPipeline._unpack_latents(lat, H, W, vsf).float()
    again = FluxPipeline._unpack_latents(run(pipe16, case, packed, "latent"), H, W, vsf).float()
    assert torch.equal(fin, again), f"{name}: the bf16 run is not deterministic"
    entry["final_latents_bf16"] = npy(exp, f"{name}_final_latents_bf16.npy", fin)
    rel, rel_l2 = errors(np.load(exp / entry["final_latents_bf16"]), ref)
    assert 1e-5 < rel < 0.5, f"{name}: bf16 rel error {rel:.2e}"
    entry["bf16_rel"], entry["bf16_rel_l2"] = rel, rel_l2
    print(f"{name}: Diffusers bf16 vs float64 final latents: rel {rel:.3e} rel_l2 {rel_l2:.3e}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args()
    torch.set_num_threads(2)
    torch.use_deterministic_algorithms(True)
    transformers.logging.set_verbosity_error()
    diffusers.utils.logging.set_verbosity_error()
    diffusers.utils.logging.disable_progress_bar()
    out = args.out
    for sub in ("dev", "schnell", "common", "expected"):
        shutil.rmtree(out / sub, ignore_errors=True)
    make_text_encoders(out / "common")
    for name, spec in PIPELINES.items():
        make_pipeline(out, name, spec)
    exp = out / "expected"
    exp.mkdir()

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        subprocess.run([sys.executable, str(UNPACK), str(tmp / "tok"), str(tmp / "tok.stamp")], check=True)
        subprocess.run([sys.executable, str(out / "assemble.py"), str(tmp / "tok"), str(tmp / "pipes"),
                        str(tmp / "pipes.stamp")], check=True)
        pipes = {}
        for name in PIPELINES:
            folder = tmp / "pipes" / name
            pipe = FluxPipeline.from_pretrained(folder, torch_dtype=torch.float64)
            pipe.set_progress_bar_config(disable=True)
            check_float64(pipe, folder)
            pipes[name] = pipe
        cases = []
        for i, case in enumerate(CASES):
            pipe = pipes[case[1]]
            watch = DtypeWatch(pipe)
            cases.append(make_case(pipe, exp, i, case, watch))
            for hnd in watch.handles:
                hnd.remove()
        # the same cases in bfloat16 (Diffusers' own bf16 run: what ditd's bf16 CPU path is held to)
        kept32 = {}
        for name in PIPELINES:
            pipe16 = FluxPipeline.from_pretrained(tmp / "pipes" / name, torch_dtype=torch.bfloat16)
            pipe16.set_progress_bar_config(disable=True)
            kept32[name] = float32_in_bf16(pipe16)
            for i, case in enumerate(CASES):
                if case[1] == name:
                    make_bf16(pipe16, exp, i, case, cases[i])
    assert len(cases) >= 10 and sum("bf16_rel" in c for c in cases) >= 6
    meta = dict(diffusers=diffusers.__version__, transformers=transformers.__version__,
                torch=torch.__version__, compute="float64", stored="float32 (ids int64, image_u8 uint8)",
                bf16_float32_kept=kept32, cases=cases)
    write_json(exp / "cases.json", meta)
    print(f"{len(cases)} cases -> {exp}")


if __name__ == "__main__":
    main()
