#!/usr/bin/env python3
"""Build the StableDiffusion3Pipeline fixtures that ditd's C tests compare against.

What it is: a script that makes three tiny random-weight StableDiffusion3Pipeline folders
under tests/fixtures/sd3_pipeline/ -- sd3 (SD3-Medium-like), sd35 (SD3.5-Medium-like:
qk_norm rms_norm, a dual-attention MMDiT-X layer) and sd3_not5 (sd3 without T5, as
Diffusers allows) -- with the real CLIP and T5 vocabularies (the tokenizers are assembled
at build time by tests/fixtures/sd3_pipeline/assemble.py), and records what Diffusers'
StableDiffusion3Pipeline makes with them in float64 in expected/ (.npy files listed in
expected/cases.json): the prompt embeddings, the timesteps, the final latents and the
decoded image, for CFG with and without negative prompts, prompt_2 / prompt_3, batches,
skip-layer guidance on and off, and T5 present and absent.

The text encoders are CLIP-L-like and CLIP-G-like CLIPTextModelWithProjection (hidden 6 and
8, projections 4 and 6: the pooled vector is 10 wide) and a T5 encoder of d_model 16, so the
two CLIPs' penultimate hidden states (6 + 8 = 14 channels) are zero-padded to 16 as the
pipeline pads them.

What it is not: part of the build or the tests. The fixtures are committed; tests never need
PyTorch. Run it again only when a fixture must change:

    /root/ditd-venv/bin/python tools/make_sd3_pipeline_fixtures.py [--out tests/fixtures/sd3_pipeline]

It deletes and rewrites the folders it owns (sd3/, sd35/, sd3_not5/, common/, expected/);
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
from transformers import CLIPTextConfig, CLIPTextModelWithProjection, T5Config, T5EncoderModel

import diffusers
from diffusers import AutoencoderKL, SD3Transformer2DModel, StableDiffusion3Pipeline

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "tests" / "fixtures" / "sd3_pipeline"
UNPACK = REPO / "tests" / "fixtures" / "tokenizers" / "unpack.py"

CLIP_L = dict(vocab_size=49408, hidden_size=6, intermediate_size=14, num_hidden_layers=2,
              num_attention_heads=3, max_position_embeddings=77, hidden_act="quick_gelu",
              layer_norm_eps=1e-5, bos_token_id=0, eos_token_id=2, pad_token_id=1, projection_dim=4)
CLIP_G = dict(vocab_size=49408, hidden_size=8, intermediate_size=16, num_hidden_layers=3,
              num_attention_heads=2, max_position_embeddings=77, hidden_act="gelu",
              layer_norm_eps=1e-5, bos_token_id=0, eos_token_id=2, pad_token_id=1, projection_dim=6)
T5 = dict(vocab_size=32128, d_model=16, d_kv=4, num_heads=4, d_ff=24, num_layers=2,
          feed_forward_proj="gated-gelu", relative_attention_num_buckets=32,
          relative_attention_max_distance=128, layer_norm_epsilon=1e-6, is_encoder_decoder=False,
          use_cache=False)

MODEL_INDEX = {
    "_class_name": "StableDiffusion3Pipeline",
    "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
    "text_encoder": ["transformers", "CLIPTextModelWithProjection"],
    "text_encoder_2": ["transformers", "CLIPTextModelWithProjection"],
    "text_encoder_3": ["transformers", "T5EncoderModel"],
    "tokenizer": ["transformers", "CLIPTokenizer"],
    "tokenizer_2": ["transformers", "CLIPTokenizer"],
    "tokenizer_3": ["transformers", "T5TokenizerFast"],
    "transformer": ["diffusers", "SD3Transformer2DModel"],
    "vae": ["diffusers", "AutoencoderKL"],
}

TRANSFORMER = dict(sample_size=8, patch_size=2, in_channels=16, out_channels=16, num_layers=2,
                   attention_head_dim=8, num_attention_heads=2, joint_attention_dim=T5["d_model"],
                   caption_projection_dim=16,
                   pooled_projection_dim=CLIP_L["projection_dim"] + CLIP_G["projection_dim"],
                   pos_embed_max_size=16)
VAE = dict(in_channels=3, out_channels=3, latent_channels=16,
           down_block_types=["DownEncoderBlock2D"] * 4, up_block_types=["UpDecoderBlock2D"] * 4,
           block_out_channels=[8, 8, 16, 16], layers_per_block=1, norm_num_groups=4, sample_size=64,
           scaling_factor=1.5305, shift_factor=0.0609, use_quant_conv=False,
           use_post_quant_conv=False, force_upcast=True, mid_block_add_attention=True)
# stabilityai's scheduler_config.json, key for key
SCHEDULER = dict(num_train_timesteps=1000, shift=3.0)

PIPELINES = {
    "sd3": dict(seed=3101, transformer=dict(TRANSFORMER), t5=True),
    "sd35": dict(seed=3102, transformer=dict(TRANSFORMER, qk_norm="rms_norm", dual_attention_layers=[0]),
                 t5=True),
    # the same transformer and VAE as sd3's (assemble.py copies them): only T5 is gone
    "sd3_not5": dict(base="sd3", t5=False),
}

LONG = ("A sprawling fantasy city at golden hour, seen from a hot air balloon drifting above "
        "terracotta rooftops, winding canals with gondolas, market stalls overflowing with "
        "oranges, lemons and spices, children chasing pigeons across a marble plaza, a "
        "cathedral with stained glass windows catching the low sun, distant snow-capped "
        "mountains, highly detailed, cinematic composition")

# name, folder, call kwargs (StableDiffusion3Pipeline.__call__'s names)
CASES = [
    ("sd3_64_default", "sd3", dict(prompt="A photo of an astronaut riding a horse on the moon",
                                   height=64, width=64, num_inference_steps=3, guidance_scale=7.0)),
    ("sd3_48x80_negative", "sd3", dict(prompt="Crème brûlée à la française, naïve café, Straße",
                                       negative_prompt="blurry, low quality", height=48, width=80,
                                       num_inference_steps=3, guidance_scale=5.0,
                                       max_sequence_length=77)),
    ("sd3_32x48_batch2", "sd3", dict(prompt=["a red cube on a glass table", "一只红色的狐狸 🦊"],
                                     negative_prompt=["fog", ""], height=32, width=48,
                                     num_inference_steps=2, guidance_scale=7.0, max_sequence_length=32)),
    ("sd3_64_nocfg", "sd3", dict(prompt="two lighthouses at dusk", height=64, width=64,
                                 num_inference_steps=2, guidance_scale=1.0, max_sequence_length=16)),
    ("sd3_80x32_prompts23", "sd3", dict(prompt="a castle", prompt_2="on a cliff, oil painting",
                                        prompt_3="a castle on a cliff above a stormy sea, dramatic",
                                        negative_prompt="fog", negative_prompt_3="haze, noise",
                                        height=80, width=32, num_inference_steps=2, guidance_scale=4.0,
                                        max_sequence_length=24)),
    ("sd3_48_slg", "sd3", dict(prompt="a bowl of ramen, studio lighting", height=48, width=48,
                               num_inference_steps=10, guidance_scale=7.0, max_sequence_length=16,
                               skip_guidance_layers=[1], skip_layer_guidance_scale=2.8,
                               skip_layer_guidance_start=0.01, skip_layer_guidance_stop=0.5)),
    ("sd3_64x32_images2", "sd3", dict(prompt="🐱🚀 a cat flying a rocket ✨", height=64, width=32,
                                   num_inference_steps=2, guidance_scale=7.0, max_sequence_length=16,
                                   num_images_per_prompt=2)),
    ("sd35_64_default", "sd35", dict(prompt="A watercolor fox in the snow", height=64, width=64,
                                     num_inference_steps=3, guidance_scale=4.5)),
    ("sd35_80x48_long_slg", "sd35", dict(prompt=LONG, negative_prompt="", height=80, width=48,
                                         num_inference_steps=8, guidance_scale=4.5,
                                         max_sequence_length=128, skip_guidance_layers=[0, 1],
                                         skip_layer_guidance_scale=1.5)),
    ("sd35_32_batch2", "sd35", dict(prompt=["", "a cozy cabin, 雪, 🌲"], height=32, width=32,
                                    num_inference_steps=2, guidance_scale=3.0, max_sequence_length=8)),
    ("sd3_not5_64", "sd3_not5", dict(prompt="a lighthouse", negative_prompt="blur", height=64,
                                     width=48, num_inference_steps=3, guidance_scale=7.0,
                                     max_sequence_length=40)),
    ("sd3_not5_32_default_length", "sd3_not5", dict(prompt="a small boat", height=32, width=32,
                                                    num_inference_steps=2, guidance_scale=6.0)),
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


def make_text_encoders(common):
    """CLIP-L (f16, the "text_model." names of SD3's hub files), CLIP-G (bf16) and T5 (bf16,
    one file)."""
    for i, (cfg, dt) in enumerate(((CLIP_L, torch.float16), (CLIP_G, torch.bfloat16))):
        gen = torch.Generator().manual_seed(3001 + i)
        clip = CLIPTextModelWithProjection(CLIPTextConfig(**cfg)).to(torch.float64)
        randomize(clip, gen)
        d = common / ("text_encoder" if i == 0 else "text_encoder_2")
        d.mkdir(parents=True)
        clip.config.save_pretrained(d)
        sd = {k: v.to(dt).contiguous() for k, v in clip.state_dict().items()
              if not k.endswith("position_ids")}
        safetensors.torch.save_file(sd, str(d / "model.safetensors"), metadata={"format": "pt"})
    gen = torch.Generator().manual_seed(3003)
    t5 = T5EncoderModel(T5Config(**T5)).to(torch.float64)
    randomize(t5, gen)
    t5.to(torch.bfloat16).save_pretrained(common / "text_encoder_3")


def make_pipeline(root, name, spec):
    d = root / name
    mi = dict(MODEL_INDEX, _diffusers_version=diffusers.__version__)
    if not spec["t5"]:
        mi["text_encoder_3"] = [None, None]
        mi["tokenizer_3"] = [None, None]
    write_json(d / "model_index.json", mi)
    write_json(d / "scheduler" / "scheduler_config.json",
               dict(SCHEDULER, _class_name="FlowMatchEulerDiscreteScheduler",
                    _diffusers_version=diffusers.__version__))
    if "base" in spec:
        return
    gen = torch.Generator().manual_seed(spec["seed"])
    tr = SD3Transformer2DModel(**spec["transformer"]).to(torch.float64)
    randomize(tr, gen)
    tr.to(torch.float16).save_pretrained(d / "transformer", safe_serialization=True)
    vae = AutoencoderKL(**VAE).to(torch.float64)
    randomize(vae, gen)
    vae.to(torch.float16).save_pretrained(d / "vae", safe_serialization=True)


def check_float64(pipe):
    for cname in ("text_encoder", "text_encoder_2", "text_encoder_3", "transformer", "vae"):
        m = getattr(pipe, cname)
        if m is None:
            continue
        for k, t in list(m.named_parameters()) + list(m.named_buffers()):
            if t.is_floating_point():
                assert t.dtype == torch.float64, f"{cname}.{k} is {t.dtype}"


def npy(exp, name, a, dtype=np.float32):
    if isinstance(a, torch.Tensor):
        a = a.detach().cpu().numpy()
    np.save(exp / name, np.ascontiguousarray(np.asarray(a).astype(dtype)))
    return name


def as_list(v, n):
    if v is None:
        return None
    return [v] * n if isinstance(v, str) else list(v)


def make_case(pipe, exp, index, case):
    name, folder, kw = case
    prompts = as_list(kw["prompt"], 1)
    nimg = kw.get("num_images_per_prompt", 1)
    B = len(prompts) * nimg
    vsf = pipe.vae_scale_factor
    H, W = kw["height"], kw["width"]
    h, w = H // vsf, W // vsf
    L = kw.get("max_sequence_length", 256)
    gen = torch.Generator().manual_seed(7000 + index)
    noise = torch.randn((B, 16, h, w), generator=gen, dtype=torch.float32)

    def run(output_type, capture=None):
        def cb(p, i, t, k):
            if capture is not None:
                capture.append(k["latents"].clone())
            return {}
        with torch.no_grad():
            return pipe(**kw, latents=noise.to(torch.float64).clone(), output_type=output_type,
                        callback_on_step_end=cb, return_dict=False)[0]

    steps_lat = []
    lat = run("latent", steps_lat)
    assert lat.dtype == torch.float64 and lat.shape == (B, 16, h, w), (name, lat.shape)
    timesteps = pipe.scheduler.timesteps.clone()
    sigmas = pipe.scheduler.sigmas.clone()
    img = run("np")
    pil = run("pil")
    u8 = np.stack([np.array(p) for p in pil])
    assert np.array_equal(u8, (img * 255).round().astype(np.uint8)), name
    inside = float(((img > 0.0) & (img < 1.0)).mean())
    assert inside > 0.5, f"{name}: only {inside:.2f} of the pixels are not clipped"
    again = run("latent")
    assert torch.equal(again, lat), f"{name}: not deterministic"

    cfg = kw["guidance_scale"] > 1
    with torch.no_grad():
        pe, npe, pooled, npooled = pipe.encode_prompt(
            prompt=kw["prompt"], prompt_2=kw.get("prompt_2"), prompt_3=kw.get("prompt_3"),
            negative_prompt=kw.get("negative_prompt"), negative_prompt_2=kw.get("negative_prompt_2"),
            negative_prompt_3=kw.get("negative_prompt_3"), do_classifier_free_guidance=cfg,
            num_images_per_prompt=nimg, max_sequence_length=L, device="cpu")
    assert pe.shape == (B, 77 + L, T5["d_model"]), (name, pe.shape)
    p = f"{name}_"
    entry = dict(
        name=name, folder=folder, prompts=prompts, batch=B, num_images_per_prompt=nimg,
        prompt_2=kw.get("prompt_2"), prompt_3=kw.get("prompt_3"),
        negative_prompts=as_list(kw.get("negative_prompt"), len(prompts)),
        negative_prompt_2=kw.get("negative_prompt_2"), negative_prompt_3=kw.get("negative_prompt_3"),
        height=H, width=W, latent_height=h, latent_width=w, vae_scale_factor=vsf,
        num_inference_steps=kw["num_inference_steps"], guidance_scale=kw["guidance_scale"],
        max_sequence_length=L, text_len=77 + L, cfg_used=cfg,
        skip_guidance_layers=kw.get("skip_guidance_layers"),
        skip_layer_guidance_scale=kw.get("skip_layer_guidance_scale", 2.8),
        skip_layer_guidance_start=kw.get("skip_layer_guidance_start", 0.01),
        skip_layer_guidance_stop=kw.get("skip_layer_guidance_stop", 0.2),
        noise=npy(exp, p + "noise.npy", noise),
        prompt_embeds=npy(exp, p + "prompt_embeds.npy", pe),
        pooled=npy(exp, p + "pooled.npy", pooled),
        timesteps=npy(exp, p + "timesteps.npy", timesteps),
        sigmas=npy(exp, p + "sigmas.npy", sigmas),
        final_latents=npy(exp, p + "final_latents.npy", lat),
        image_u8=npy(exp, p + "image_u8.npy", u8, np.uint8),
    )
    if cfg:
        entry["negative_prompt_embeds"] = npy(exp, p + "negative_prompt_embeds.npy", npe)
        entry["negative_pooled"] = npy(exp, p + "negative_pooled.npy", npooled)
    if entry["skip_guidance_layers"]:
        # the same case without skip-layer guidance: SLG must change the result
        kw2 = {k: v for k, v in kw.items() if not k.startswith("skip_")}
        with torch.no_grad():
            plain = pipe(**kw2, latents=noise.to(torch.float64).clone(), output_type="latent",
                         return_dict=False)[0]
        entry["slg_effect_rel"] = float(((plain - lat).abs().max() / lat.abs().max()).item())
        assert entry["slg_effect_rel"] > 1e-3, name
    print(f"{name}: B={B} {H}x{W} latent {h}x{w} steps {kw['num_inference_steps']} L {L} "
          f"cfg {cfg} unclipped {inside:.2f}")
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
    out = args.out
    for sub in list(PIPELINES) + ["common", "expected"]:
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
        for name, spec in PIPELINES.items():
            extra = {} if spec["t5"] else dict(text_encoder_3=None, tokenizer_3=None)
            pipe = StableDiffusion3Pipeline.from_pretrained(tmp / "pipes" / name,
                                                            torch_dtype=torch.float64, **extra)
            pipe.set_progress_bar_config(disable=True)
            check_float64(pipe)
            assert (pipe.text_encoder_3 is None) == (not spec["t5"])
            pipes[name] = pipe
        cases = [make_case(pipes[c[1]], exp, i, c) for i, c in enumerate(CASES)]
    assert len(cases) >= 10
    meta = dict(diffusers=diffusers.__version__, transformers=transformers.__version__,
                torch=torch.__version__, compute="float64", stored="float32 (image_u8 uint8)",
                cases=cases)
    write_json(exp / "cases.json", meta)
    print(f"{len(cases)} cases -> {exp}")


if __name__ == "__main__":
    main()
