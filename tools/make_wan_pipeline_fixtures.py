#!/usr/bin/env python3
"""Build the WanPipeline fixtures that ditd's C tests compare against.

What it is: a script that makes tiny random-weight WanPipeline folders under
tests/fixtures/wan_pipeline/ -- wan21/ (Wan 2.1 T2V-like), wan22/ (Wan 2.2 T2V-A14B-like: a
second expert transformer_2 below boundary_ratio 0.875, guidance_scale_2; it commits only its
model_index.json and transformer_2/, the rest is wan21's, copied by assemble.py) and ti2v/
(Wan 2.2 TI2V-5B-like: expand_timesteps, a 48-channel residual AutoencoderKLWan with patch_size 2
and spatial scale 16, a 48-channel transformer; text encoder and scheduler are wan21's) --
(wan21: WanTransformer3DModel, AutoencoderKLWan,
UMT5EncoderModel with the real UMT5 vocabulary of 256,384 rows; the tokenizer is assembled at
build time by tests/fixtures/wan_pipeline/assemble.py from tests/fixtures/tokenizers/'s
umt5_hub) and records what Diffusers' WanPipeline makes with it in float64 in expected/ (.npy
files listed in expected/cases.json): the prompt embeddings (prompt_clean, 512 tokens with the
mask, padding zeroed), the timesteps (UniPC flow), the final latents (output_type
"latent") and the decoded frames (output_type "np", x 255 rounded to 8 bits) for clips of 5 and 9 frames, non-square sizes, negative prompts, batches and
num_videos_per_prompt.

One change to WanPipeline as run here: prepare_latents casts given latents to float32
(torch.float32 is hard-coded in __call__); the reference keeps them float64 so the whole
trajectory is float64 (the difference is float32 rounding of the latents, far below the
tests' 1e-4).

What it is not: part of the build or the tests. The fixtures are committed; tests never need
PyTorch. Run it again only when a fixture must change:

    /root/ditd-venv/bin/python tools/make_wan_pipeline_fixtures.py [--out tests/fixtures/wan_pipeline]

It deletes and rewrites the folders it owns (wan21/, expected/); re-running gives identical
files.
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
from transformers import UMT5Config, UMT5EncoderModel

import diffusers
from diffusers import AutoencoderKLWan, WanPipeline, WanTransformer3DModel

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "tests" / "fixtures" / "wan_pipeline"
UNPACK = REPO / "tests" / "fixtures" / "tokenizers" / "unpack.py"

# d_model 4 keeps the 256,384-row embedding at 2 MB in bf16
UMT5 = dict(vocab_size=256384, d_model=4, d_kv=2, d_ff=8, num_layers=2, num_heads=2,
            relative_attention_num_buckets=32, relative_attention_max_distance=128,
            feed_forward_proj="gated-gelu", layer_norm_epsilon=1e-6, is_encoder_decoder=False,
            use_cache=False)

MODEL_INDEX = {
    "_class_name": "WanPipeline",
    "scheduler": ["diffusers", "UniPCMultistepScheduler"],
    "text_encoder": ["transformers", "UMT5EncoderModel"],
    "tokenizer": ["transformers", "T5TokenizerFast"],
    "transformer": ["diffusers", "WanTransformer3DModel"],
    "vae": ["diffusers", "AutoencoderKLWan"],
}

TRANSFORMER = dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12,
                   in_channels=16, out_channels=16, text_dim=UMT5["d_model"], freq_dim=32,
                   ffn_dim=40, num_layers=2, cross_attn_norm=True,
                   qk_norm="rms_norm_across_heads", eps=1e-6, rope_max_seq_len=64)
VAE = dict(base_dim=4, decoder_base_dim=6, z_dim=16, dim_mult=[1, 2, 4, 4], num_res_blocks=1,
           temperal_downsample=[False, True, True],
           latents_mean=[0.1 * i - 0.8 for i in range(16)],
           latents_std=[1.0 + 0.1 * i for i in range(16)])
# Wan-AI/Wan2.1-T2V-1.3B-Diffusers scheduler/scheduler_config.json, key for key
SCHEDULER = {"beta_end": 0.02, "beta_schedule": "linear", "beta_start": 0.0001,
             "disable_corrector": [], "dynamic_thresholding_ratio": 0.995,
             "final_sigmas_type": "zero", "flow_shift": 3.0, "lower_order_final": True,
             "num_train_timesteps": 1000, "predict_x0": True, "prediction_type": "flow_prediction",
             "rescale_betas_zero_snr": False, "sample_max_value": 1.0, "solver_order": 2,
             "solver_p": None, "solver_type": "bh2", "steps_offset": 0, "thresholding": False,
             "timestep_spacing": "linspace", "trained_betas": None, "use_beta_sigmas": False,
             "use_exponential_sigmas": False, "use_flow_sigmas": True, "use_karras_sigmas": False}

# name, call kwargs (WanPipeline.__call__'s names)
CASES = [
    ("wan_5f_32x48_default", dict(prompt="A cat walks on the grass, realistic", height=32, width=48,
                                  num_frames=5, num_inference_steps=4, max_sequence_length=512)),
    ("wan_9f_48x32_negative", dict(prompt="Crème brûlée &amp; café &lt;b&gt;  in   Paris",
                                   negative_prompt="blurry, low quality, static", height=48, width=32,
                                   num_frames=9, num_inference_steps=3, guidance_scale=4.0,
                                   max_sequence_length=64)),
    ("wan_5f_32x32_batch2", dict(prompt=["a red fox running through snow", "一只红色的狐狸 🦊"],
                                 negative_prompt=["fog", ""], height=32, width=32, num_frames=5,
                                 num_inference_steps=3, max_sequence_length=32)),
    ("wan_9f_32x64_videos2", dict(prompt="waves crashing on rocks at sunset", height=32, width=64,
                                  num_frames=9, num_inference_steps=2, guidance_scale=6.0,
                                  max_sequence_length=16, num_videos_per_prompt=2)),
    ("wan_7f_rounded_nocfg", dict(prompt="a lighthouse", height=32, width=48, num_frames=7,
                                  num_inference_steps=3, guidance_scale=1.0,
                                  max_sequence_length=24)),
]


CASES_22 = [
    ("wan22_5f_32x48_experts", dict(prompt="A cat walks on the grass, realistic", height=32,
                                    width=48, num_frames=5, num_inference_steps=4,
                                    max_sequence_length=32)),
    ("wan22_9f_48x32_guidance2", dict(prompt=["a red fox running through snow", "rain on a window"],
                                      negative_prompt=["blurry", ""], height=48, width=32,
                                      num_frames=9, num_inference_steps=4, guidance_scale=4.0,
                                      guidance_scale_2=2.5, max_sequence_length=24)),
    ("wan22_5f_32x32_nocfg", dict(prompt="a lighthouse", height=32, width=32, num_frames=5,
                                  num_inference_steps=5, guidance_scale=1.0, guidance_scale_2=3.0,
                                  max_sequence_length=16)),
]
CASES_TI2V = [
    ("ti2v_5f_64x32", dict(prompt="waves crashing on rocks at sunset", height=64, width=32,
                           num_frames=5, num_inference_steps=3, max_sequence_length=16)),
    ("ti2v_9f_32x64_negative", dict(prompt="a red balloon over a city", negative_prompt="fog",
                                    height=32, width=64, num_frames=9, num_inference_steps=3,
                                    guidance_scale=3.0, max_sequence_length=16)),
]
# Wan-AI/Wan2.2-TI2V-5B-Diffusers vae/config.json's shape, at tiny widths
VAE_TI2V = dict(base_dim=4, decoder_base_dim=6, z_dim=48, dim_mult=[1, 2, 4, 4], num_res_blocks=1,
                temperal_downsample=[False, True, True], is_residual=True, in_channels=12,
                out_channels=12, patch_size=2, scale_factor_spatial=16, scale_factor_temporal=4,
                latents_mean=[0.05 * i - 1.2 for i in range(48)],
                latents_std=[0.8 + 0.02 * i for i in range(48)])


def randomize(model, gen):
    """Non-degenerate random weights: every matrix N(0, 1/fan_in), embeddings N(0, 1),
    norm gains 1 + N(0, 0.1^2), biases N(0, 0.1^2); so no layer is the default init."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "embedding" in name and p.ndim == 2 or name.endswith("shared.weight") or \
                    "relative_attention_bias" in name:
                v = torch.randn(p.shape, generator=gen, dtype=torch.float64)
            elif p.ndim > 1:
                v = torch.randn(p.shape, generator=gen, dtype=torch.float64) / p[0].numel() ** 0.5
            elif "norm" in name and name.endswith("weight"):
                v = 1 + 0.1 * torch.randn(p.shape, generator=gen, dtype=torch.float64)
            elif "scale_shift_table" in name:
                v = 0.1 * torch.randn(p.shape, generator=gen, dtype=torch.float64)
            else:
                v = 0.1 * torch.randn(p.shape, generator=gen, dtype=torch.float64)
            p.copy_(v.to(p.dtype))
        for name, p in model.named_parameters():  # scale_shift_table has ndim 3
            if "scale_shift_table" in name:
                p.copy_((0.1 * torch.randn(p.shape, generator=gen, dtype=torch.float64)).to(p.dtype))


def write_json(path, obj):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n")


def make_pipeline(d):
    write_json(d / "model_index.json", dict(MODEL_INDEX, _diffusers_version=diffusers.__version__))
    write_json(d / "scheduler" / "scheduler_config.json",
               dict(SCHEDULER, _class_name="UniPCMultistepScheduler",
                    _diffusers_version=diffusers.__version__))
    gen = torch.Generator().manual_seed(2121)
    cfg = UMT5Config(**UMT5)
    cfg._attn_implementation = "eager"
    te = UMT5EncoderModel(cfg).to(torch.float64)
    randomize(te, gen)
    (d / "text_encoder").mkdir(parents=True)
    te.config.save_pretrained(d / "text_encoder")
    sd = {k: v.to(torch.bfloat16).contiguous() for k, v in te.state_dict().items()
          if k != "encoder.embed_tokens.weight"}
    safetensors.torch.save_file(sd, str(d / "text_encoder" / "model.safetensors"),
                                metadata={"format": "pt"})
    tr = WanTransformer3DModel(**TRANSFORMER).to(torch.float64)
    randomize(tr, gen)
    tr.to(torch.float32).save_pretrained(d / "transformer", safe_serialization=True)
    vae = AutoencoderKLWan(**VAE).to(torch.float64)
    randomize(vae, gen)
    vae.to(torch.float32).save_pretrained(d / "vae", safe_serialization=True)


def make_wan22(d):
    """Wan 2.2 T2V-A14B-like: wan21's components plus a second expert (its own random weights,
    the same config) and boundary_ratio 0.875 (the A14B's), so the four-step schedule
    999, 899 | 749, 499 switches inside."""
    write_json(d / "model_index.json", dict(MODEL_INDEX, _diffusers_version=diffusers.__version__,
                                            transformer_2=["diffusers", "WanTransformer3DModel"],
                                            boundary_ratio=0.875, expand_timesteps=False))
    gen = torch.Generator().manual_seed(2222)
    tr = WanTransformer3DModel(**TRANSFORMER).to(torch.float64)
    randomize(tr, gen)
    tr.to(torch.float32).save_pretrained(d / "transformer_2", safe_serialization=True)


def make_ti2v(d):
    """Wan 2.2 TI2V-5B-like: expand_timesteps, the residual 48-channel VAE (patch_size 2, spatial
    scale 16) and a 48-channel transformer; wan21's text encoder and scheduler."""
    write_json(d / "model_index.json", dict(MODEL_INDEX, _diffusers_version=diffusers.__version__,
                                            boundary_ratio=None, expand_timesteps=True))
    gen = torch.Generator().manual_seed(2323)
    tr = WanTransformer3DModel(**dict(TRANSFORMER, in_channels=48, out_channels=48)).to(torch.float64)
    randomize(tr, gen)
    tr.to(torch.float32).save_pretrained(d / "transformer", safe_serialization=True)
    vae = AutoencoderKLWan(**VAE_TI2V).to(torch.float64)
    randomize(vae, gen)
    vae.to(torch.float32).save_pretrained(d / "vae", safe_serialization=True)


def check_float64(pipe):
    for cname in ("text_encoder", "transformer", "transformer_2", "vae"):
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


def load_pipe(d):
    """The assembled folder in float64, given latents kept float64 (see the docstring)."""
    kw = {} if (d / "transformer_2").is_dir() else dict(transformer_2=None)
    pipe = WanPipeline.from_pretrained(d, torch_dtype=torch.float64, **kw)
    pipe.set_progress_bar_config(disable=True)
    for t in (pipe.transformer, pipe.transformer_2):  # _keep_in_fp32_modules kept
        if t is not None:                             # scale_shift_table f32
            t.to(torch.float64)
    orig = pipe.prepare_latents

    def prepare_latents(*a, **k):
        lat = k.get("latents", a[-1] if a else None)
        if lat is not None:
            return lat.to(torch.float64)
        return orig(*a, **k)
    pipe.prepare_latents = prepare_latents
    check_float64(pipe)
    return pipe


def make_case(pipe, exp, index, case, folder):
    name, kw = case
    prompts = as_list(kw["prompt"], 1)
    per = kw.get("num_videos_per_prompt", 1)
    B = len(prompts) * per
    vs, vt = pipe.vae_scale_factor_spatial, pipe.vae_scale_factor_temporal
    H, W, N = kw["height"], kw["width"], kw["num_frames"]
    Nr = N if N % vt == 1 else N // vt * vt + 1
    F, h, w = (Nr - 1) // vt + 1, H // vs, W // vs
    L = kw.get("max_sequence_length", 512)
    g = kw.get("guidance_scale", 5.0)
    gen = torch.Generator().manual_seed(7100 + index)
    C = pipe.transformer.config.in_channels
    noise = torch.randn((B, C, F, h, w), generator=gen, dtype=torch.float32)

    def run():
        with torch.no_grad():
            return pipe(**kw, latents=noise.to(torch.float64).clone(), output_type="latent",
                        return_dict=False)[0]

    lat = run()
    assert lat.dtype == torch.float64 and lat.shape == (B, C, F, h, w), (name, lat.shape)
    timesteps = pipe.scheduler.timesteps.clone()
    again = run()
    assert torch.equal(again, lat), f"{name}: not deterministic"
    with torch.no_grad():  # the decode: latents_mean / latents_std, the VAE, postprocess_video
        frames = pipe(**kw, latents=noise.to(torch.float64).clone(), output_type="np",
                      return_dict=False)[0]
    Hs, Ws = h * vs, w * vs
    assert frames.shape == (B, Nr, Hs, Ws, 3), (name, frames.shape)
    u8 = np.round(frames * 255).astype(np.uint8)
    inside = float(((frames > 0.0) & (frames < 1.0)).mean())
    assert inside > 0.5, f"{name}: only {inside:.2f} of the pixels are not clipped"
    moved = float(((lat - noise.double()).abs().max() / lat.abs().max()).item())
    assert moved > 1e-2, f"{name}: the latents hardly moved ({moved})"

    cfg = g > 1
    with torch.no_grad():
        pe, npe = pipe.encode_prompt(prompt=kw["prompt"], negative_prompt=kw.get("negative_prompt"),
                                     do_classifier_free_guidance=cfg, num_videos_per_prompt=per,
                                     max_sequence_length=L, device="cpu")
    assert pe.shape == (B, L, UMT5["d_model"]), (name, pe.shape)
    p = f"{name}_"
    entry = dict(
        name=name, folder=folder, prompts=prompts, batch=B, num_videos_per_prompt=per,
        negative_prompts=as_list(kw.get("negative_prompt"), len(prompts)),
        height=H, width=W, num_frames=N, num_frames_rounded=Nr, latent_frames=F,
        latent_height=h, latent_width=w, num_inference_steps=kw["num_inference_steps"],
        guidance_scale=g, max_sequence_length=L, cfg_used=cfg,
        noise=npy(exp, p + "noise.npy", noise),
        prompt_embeds=npy(exp, p + "prompt_embeds.npy", pe),
        timesteps=npy(exp, p + "timesteps.npy", timesteps),
        final_latents=npy(exp, p + "final_latents.npy", lat),
        frames_u8=npy(exp, p + "frames_u8.npy", u8, np.uint8),
    )
    if cfg:
        entry["negative_prompt_embeds"] = npy(exp, p + "negative_prompt_embeds.npy", npe)
    if "guidance_scale_2" in kw:
        entry["guidance_scale_2"] = kw["guidance_scale_2"]
    if pipe.transformer_2 is not None:  # which expert ran each step (WanPipeline's rule)
        bt = pipe.config.boundary_ratio * pipe.scheduler.config.num_train_timesteps
        entry["boundary_timestep"] = bt
        entry["expert_per_step"] = [1 if t >= bt else 2 for t in timesteps.tolist()]
        assert 1 in entry["expert_per_step"] and 2 in entry["expert_per_step"], name
    print(f"{name}: B={B} {N}->{Nr} frames {H}x{W} latent {F}x{h}x{w} steps "
          f"{kw['num_inference_steps']} L {L} cfg {cfg} moved {moved:.3f}")
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
    for sub in ("wan21", "wan22", "ti2v", "expected"):
        shutil.rmtree(out / sub, ignore_errors=True)
    make_pipeline(out / "wan21")
    make_wan22(out / "wan22")
    make_ti2v(out / "ti2v")
    exp = out / "expected"
    exp.mkdir()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        subprocess.run([sys.executable, str(UNPACK), str(tmp / "tok"), str(tmp / "tok.stamp")], check=True)
        subprocess.run([sys.executable, str(out / "assemble.py"), str(tmp / "tok"), str(tmp / "pipes"),
                        str(tmp / "pipes.stamp")], check=True)
        cases = []
        for folder, fcases in (("wan21", CASES), ("wan22", CASES_22), ("ti2v", CASES_TI2V)):
            pipe = load_pipe(tmp / "pipes" / folder)
            assert (pipe.transformer_2 is not None) == (folder == "wan22"), folder
            assert bool(pipe.config.expand_timesteps) == (folder == "ti2v"), folder
            for c in fcases:  # the case's index seeds its noise
                cases.append(make_case(pipe, exp, len(cases), c, folder))
    assert len(cases) >= 10
    meta = dict(diffusers=diffusers.__version__, transformers=transformers.__version__,
                torch=torch.__version__, compute="float64", stored="float32", cases=cases)
    write_json(exp / "cases.json", meta)
    print(f"{len(cases)} cases -> {exp}")


if __name__ == "__main__":
    main()
