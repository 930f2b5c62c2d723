#!/usr/bin/env python3
"""Build the reference fixtures that ditd's C tests compare against.

What it is: a script that makes small random-weight Diffusers DiTTransformer2DModel
checkpoints (Diffusers layout, pixel space, no VAE) under tests/fixtures/models/<name>/,
and records what Diffusers computes with them in <name>/expected/ (.npy files described by
<name>/expected/cases.json):

  - forward cases: transformer(x, t, y).sample for fixed inputs, computed in float64;
  - sampling cases: the final latents of a 10-step class-conditional run that mirrors
    diffusers' DiTPipeline.__call__ (with and without classifier-free guidance) for the
    DDIM, DPM-Solver++ 2M and flow-matching Euler schedulers.

What it is not: part of the build or the tests. The fixtures are committed; tests never
need PyTorch. Run it again only when a fixture must change:

    python tools/make_fixtures.py [--out tests/fixtures/models]

It deletes and rewrites every fixture folder it owns; re-running gives identical files.
"""

import argparse
import inspect
import json
import math
import shutil
import sys
from pathlib import Path

import numpy as np
import safetensors.torch
import torch

import diffusers
from diffusers import (
    DDIMScheduler,
    DiTTransformer2DModel,
    DPMSolverMultistepScheduler,
    FlowMatchEulerDiscreteScheduler,
)

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "tests" / "fixtures" / "models"

SAMPLERS = {
    "ddim": DDIMScheduler,
    "dpmpp-2m": DPMSolverMultistepScheduler,
    "flow-euler": FlowMatchEulerDiscreteScheduler,
}

LABELS = ["tee", "trouser", "pullover", "dress, gown", "coat",
          "sandal", "shirt", "sneaker", "bag", "ankle boot"]

# Each model: its transformer config, the dtype its weights are stored in, its own
# scheduler, and which sampler gets the extra guidance-1.0 (no CFG) case.
CONFIGS = [
    {
        "name": "tiny-p2-c4-sigma",
        "seed": 1001,
        "transformer": dict(
            in_channels=4, out_channels=8, patch_size=2, sample_size=16,
            num_attention_heads=4, attention_head_dim=16, num_layers=2,
            num_embeds_ada_norm=10, attention_bias=True,
        ),
        "weight_dtype": "float32",
        "max_shard_size": None,
        "scheduler": (DDIMScheduler, dict(
            num_train_timesteps=1000, beta_schedule="linear", beta_start=0.0001,
            beta_end=0.02, clip_sample=False, set_alpha_to_one=True, steps_offset=0,
            prediction_type="epsilon", timestep_spacing="leading",
        )),
        "no_cfg_sampler": "ddim",
    },
    {
        "name": "tiny-p4-c1-h3",
        "seed": 1002,
        "transformer": dict(
            in_channels=1, out_channels=1, patch_size=4, sample_size=28,
            num_attention_heads=3, attention_head_dim=16, num_layers=2,
            num_embeds_ada_norm=10, attention_bias=True,
        ),
        "weight_dtype": "float16",
        "max_shard_size": None,
        "scheduler": (DPMSolverMultistepScheduler, dict(
            num_train_timesteps=1000, beta_schedule="linear", beta_start=0.0001,
            beta_end=0.02, solver_order=2, algorithm_type="dpmsolver++",
            lower_order_final=True, timestep_spacing="linspace",
            prediction_type="epsilon",
        )),
        "no_cfg_sampler": "dpmpp-2m",
    },
    {
        "name": "tiny-p2-c1-h6",
        "seed": 1003,
        "transformer": dict(
            in_channels=1, out_channels=2, patch_size=2, sample_size=14,
            num_attention_heads=6, attention_head_dim=8, num_layers=3,
            num_embeds_ada_norm=5, attention_bias=False,
            # Not the default, so a loader that ignores norm_eps (used by the MLP
            # LayerNorm only; adaLN and the final norm hardcode 1e-6) fails here.
            norm_eps=1e-3,
        ),
        "weight_dtype": "float32",
        "max_shard_size": None,
        "scheduler": (FlowMatchEulerDiscreteScheduler, dict(
            num_train_timesteps=1000, shift=3.0,
        )),
        "no_cfg_sampler": "flow-euler",
    },
    {
        "name": "tiny-sharded-bf16",
        "seed": 1004,
        "transformer": dict(
            in_channels=4, out_channels=4, patch_size=2, sample_size=16,
            num_attention_heads=6, attention_head_dim=16, num_layers=2,
            num_embeds_ada_norm=10, attention_bias=True,
        ),
        "weight_dtype": "bfloat16",
        "max_shard_size": "400KB",
        "scheduler": (DDIMScheduler, dict(
            num_train_timesteps=1000, beta_schedule="scaled_linear", beta_start=0.00085,
            beta_end=0.012, clip_sample=False, set_alpha_to_one=False, steps_offset=0,
            prediction_type="v_prediction", timestep_spacing="trailing",
        )),
        "no_cfg_sampler": "ddim",
    },
]

COMMON = dict(activation_fn="gelu-approximate", norm_type="ada_norm_zero",
              norm_elementwise_affine=False)

STEPS = 10
GUIDANCE = 4.0


def log(*a):
    print(*a, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------- weights

def init_scale(name, p):
    """Standard deviation for a re-initialized parameter, chosen so activations stay O(1).

    Diffusers zeroes the adaLN-zero linears and proj_out; tests need every path live.
    """
    if name.endswith("bias"):
        return 0.1
    if "embedding_table" in name:
        return 0.5
    fan_in = int(np.prod(p.shape[1:]))
    gain = 1.0
    # adaLN modulation linears (norm1.linear, proj_out_1): keep shift/scale/gate moderate.
    if "norm1.linear" in name or "proj_out_1" in name:
        gain = 0.5
    return gain / math.sqrt(fan_in)


def randomize(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float32) * init_scale(name, p))


def load_state_dict(folder):
    """All tensors of a Diffusers transformer folder (single file or sharded), as stored."""
    idx = folder / "diffusion_pytorch_model.safetensors.index.json"
    files = (sorted(set(json.loads(idx.read_text())["weight_map"].values())) if idx.exists()
             else ["diffusion_pytorch_model.safetensors"])
    sd = {}
    for f in files:
        sd.update(safetensors.torch.load_file(str(folder / f)))
    return sd


def reference_model(config, sd, dtype):
    """A model built from config holding the stored weights, upcast exactly to dtype."""
    m = DiTTransformer2DModel.from_config(config)
    missing, unexpected = m.load_state_dict({k: v.to(torch.float32) for k, v in sd.items()},
                                            strict=True)
    assert not missing and not unexpected
    return m.to(dtype).eval()


# ---------------------------------------------------------------------------- numerics

def err_stats(a, ref):
    a = np.asarray(a, np.float64)
    ref = np.asarray(ref, np.float64)
    d = np.abs(a - ref)
    return {
        "max_abs": float(d.max()),
        "max_abs_over_max_ref": float(d.max() / np.abs(ref).max()),
        "rel_l2": float(np.linalg.norm(a - ref) / np.linalg.norm(ref)),
    }


@torch.no_grad()
def forward(model, x, t, y, dtype):
    return model(torch.from_numpy(x).to(dtype), timestep=torch.from_numpy(t),
                 class_labels=torch.from_numpy(y)).sample


@torch.no_grad()
def sample_dit(model, scheduler, class_labels, noise, guidance_scale, num_inference_steps,
               null_class):
    """DiTPipeline.__call__ (diffusers 0.3x-0.4x) minus the VAE.

    Differences from the pipeline, all as the brief asks: the null class is the model's
    num_embeds_ada_norm (the pipeline hardcodes 1000); the noise is given; the result is the
    final latents (the conditional half under CFG), not decoded; scale_model_input is called
    only if the scheduler has it.
    """
    dtype = model.dtype
    latent_channels = model.config.in_channels
    batch_size = len(class_labels)
    latents = torch.from_numpy(noise).to(dtype)
    latent_model_input = torch.cat([latents] * 2) if guidance_scale > 1 else latents

    class_labels = torch.tensor(class_labels).reshape(-1)
    class_null = torch.tensor([null_class] * batch_size)
    class_labels_input = (torch.cat([class_labels, class_null], 0) if guidance_scale > 1
                          else class_labels)

    scheduler.set_timesteps(num_inference_steps)
    for t in scheduler.timesteps:
        if guidance_scale > 1:
            half = latent_model_input[: len(latent_model_input) // 2]
            latent_model_input = torch.cat([half, half], dim=0)
        if hasattr(scheduler, "scale_model_input"):
            latent_model_input = scheduler.scale_model_input(latent_model_input, t)

        timesteps = t
        if not torch.is_tensor(timesteps):
            dtype_t = torch.float64 if isinstance(timesteps, float) else torch.int64
            timesteps = torch.tensor([timesteps], dtype=dtype_t)
        elif len(timesteps.shape) == 0:
            timesteps = timesteps[None]
        timesteps = timesteps.expand(latent_model_input.shape[0])

        noise_pred = model(latent_model_input, timestep=timesteps,
                           class_labels=class_labels_input).sample

        if guidance_scale > 1:
            eps, rest = noise_pred[:, :latent_channels], noise_pred[:, latent_channels:]
            cond_eps, uncond_eps = torch.split(eps, len(eps) // 2, dim=0)
            half_eps = uncond_eps + guidance_scale * (cond_eps - uncond_eps)
            eps = torch.cat([half_eps, half_eps], dim=0)
            noise_pred = torch.cat([eps, rest], dim=1)

        if model.config.out_channels // 2 == latent_channels:
            model_output, _ = torch.split(noise_pred, latent_channels, dim=1)
        else:
            model_output = noise_pred

        latent_model_input = scheduler.step(model_output, t, latent_model_input).prev_sample

    if guidance_scale > 1:
        latents, _ = latent_model_input.chunk(2, dim=0)
    else:
        latents = latent_model_input
    return latents


def jsonable(v):
    """A config value as strict JSON (jansson rejects Infinity/NaN: they become strings)."""
    if isinstance(v, float) and not math.isfinite(v):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
    if isinstance(v, (np.ndarray, torch.Tensor)):
        return np.asarray(v).tolist()
    if isinstance(v, (tuple, list)):
        return [jsonable(x) for x in v]
    if isinstance(v, (np.floating,)):
        return jsonable(float(v))
    if isinstance(v, (np.integer,)):
        return int(v)
    return v


def resolved_config(scheduler):
    """The keys the scheduler class takes, as from_config resolved them.

    scheduler.config also carries the source config's foreign keys along unused (a DDIM made
    from a flow config keeps "shift": 3.0); those are left out here.
    """
    params = inspect.signature(type(scheduler).__init__).parameters
    return {k: jsonable(v) for k, v in scheduler.config.items() if k in params}


def save(path, arr, dtype):
    arr = np.ascontiguousarray(np.asarray(arr, dtype=np.dtype(dtype).newbyteorder("<")))
    np.save(path, arr)
    return path.name


# ---------------------------------------------------------------------------- one model

def make_model(spec, out_root):
    name = spec["name"]
    root = out_root / name
    if root.exists():
        shutil.rmtree(root)
    (root / "expected").mkdir(parents=True)
    tcfg = dict(COMMON, **spec["transformer"])
    nc = tcfg["num_embeds_ada_norm"]
    C, Co, S = tcfg["in_channels"], tcfg["out_channels"], tcfg["sample_size"]

    # Transformer: build, randomize every parameter, store in the chosen dtype.
    torch.manual_seed(spec["seed"])
    model = DiTTransformer2DModel(**tcfg)
    randomize(model, spec["seed"])
    wdtype = getattr(torch, spec["weight_dtype"])
    save_kw = dict(safe_serialization=True)
    if spec["max_shard_size"]:
        save_kw["max_shard_size"] = spec["max_shard_size"]
    model.to(wdtype).save_pretrained(root / "transformer", **save_kw)
    config = DiTTransformer2DModel.load_config(root / "transformer")

    # Reference models: the stored (rounded) weights, upcast exactly.
    sd = load_state_dict(root / "transformer")
    assert all(v.dtype == wdtype for v in sd.values()), "stored dtype"
    m64 = reference_model(config, sd, torch.float64)
    m32 = reference_model(config, sd, torch.float32)

    # Scheduler and model_index.json.
    sched_cls, sched_kw = spec["scheduler"]
    sched_cls(**sched_kw).save_pretrained(root / "scheduler")
    if sched_cls is not DDIMScheduler:
        # DDIMScheduler.from_config() of a config without clip_sample takes
        # DDIM's default, clip_sample=True. On a random-weight eps model that
        # makes the end-to-end run ill-conditioned: DDIM's x0 = (x - sqrt(1-a)
        # eps) / sqrt(a) cancels, the clip keeps only the cancelled elements,
        # and float32 rounding grows ~500x over 10 steps (Diffusers' own
        # float32 run lands 3.7e-5 from its float64 run, a third of the 1e-4
        # budget). The file states clip_sample false, a key the DPM and flow
        # classes ignore and from_config carries to DDIM; clipping is covered
        # by the sampler-level fixtures (tools/make_sampler_fixtures.py).
        cfg_path = root / "scheduler" / "scheduler_config.json"
        cfg = json.loads(cfg_path.read_text())
        cfg["clip_sample"] = False
        cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    sched_config = dict(sched_cls.load_config(root / "scheduler"))
    id2label = {str(i): LABELS[i % len(LABELS)] for i in range(nc)}
    model_index = {
        "_class_name": "DiTPipeline",
        "_diffusers_version": diffusers.__version__,
        "id2label": id2label,
        "scheduler": ["diffusers", sched_cls.__name__],
        "transformer": ["diffusers", "DiTTransformer2DModel"],
    }
    (root / "model_index.json").write_text(json.dumps(model_index, indent=2) + "\n")

    exp = root / "expected"
    rng = np.random.default_rng(spec["seed"])
    cases = {
        "model": name,
        "in_channels": C,
        "out_channels": Co,
        "sample_size": S,
        "patch_size": tcfg["patch_size"],
        "num_attention_heads": tcfg["num_attention_heads"],
        "attention_head_dim": tcfg["attention_head_dim"],
        "num_layers": tcfg["num_layers"],
        "num_embeds_ada_norm": nc,
        "weight_dtype": spec["weight_dtype"],
        "sharded": bool(spec["max_shard_size"]),
        "diffusers_version": diffusers.__version__,
        "torch_version": torch.__version__,
        "numpy_version": np.__version__,
        "forward": [],
        "sampling": [],
    }

    # A. Forward cases.
    fwd_inputs = [
        (np.array([0.0, 999.0, 500.0, 137.5], np.float32),
         np.array([0, nc - 1, nc, 3 % nc], np.int64)),
        (np.array([61.75], np.float32), np.array([1], np.int64)),
    ]
    loaded = DiTTransformer2DModel.from_pretrained(root / "transformer").eval()
    for i, (t, y) in enumerate(fwd_inputs):
        b = len(t)
        x = rng.standard_normal((b, C, S, S), dtype=np.float32)
        out64 = forward(m64, x, t, y, torch.float64).numpy()
        out32 = forward(m32, x, t, y, torch.float32).numpy()
        assert out64.shape == (b, Co, S, S)
        assert np.isfinite(out64).all()
        sd_ = float(out64.std())
        assert 0.1 < sd_ < 10, f"{name}: forward output std {sd_}"
        # Diffusers' own loader must read the checkpoint and agree with the reference.
        outl = forward(loaded.to(torch.float32), x, t, y, torch.float32).numpy()
        assert np.array_equal(outl, out32), f"{name}: from_pretrained output differs"
        # The timestep sinusoid, as Diffusers computes it (always float32): a debugging aid.
        t_proj = m32.transformer_blocks[0].norm1.emb.time_proj(torch.from_numpy(t)).numpy()
        p = f"forward{i}_"
        cases["forward"].append({
            "x": save(exp / f"{p}x.npy", x, np.float32),
            "t": save(exp / f"{p}t.npy", t, np.float32),
            "y": save(exp / f"{p}y.npy", y, np.int64),
            "out": save(exp / f"{p}out.npy", out64, np.float32),
            "t_proj": save(exp / f"{p}t_proj.npy", t_proj, np.float32),
            "dtype_reference": "float64",
            "output_std": sd_,
            "float32_diffusers_vs_reference": err_stats(out32, out64),
        })
        log(f"{name}: forward{i} B={b} std={sd_:.3f} "
            f"fp32 rel_l2={cases['forward'][-1]['float32_diffusers_vs_reference']['rel_l2']:.2e}")

    # B. Sampling cases.
    runs = [(s, GUIDANCE) for s in SAMPLERS] + [(spec["no_cfg_sampler"], 1.0)]
    class_labels = [1, 3 % nc]
    for j, (sampler, g) in enumerate(runs):
        cls = SAMPLERS[sampler]
        noise = rng.standard_normal((len(class_labels), C, S, S), dtype=np.float32)
        s64 = cls.from_config(sched_config)
        s32 = cls.from_config(sched_config)
        lat64 = sample_dit(m64, s64, class_labels, noise, g, STEPS, nc).numpy()
        lat32 = sample_dit(m32, s32, class_labels, noise, g, STEPS, nc).numpy()
        assert lat64.dtype == np.float64, f"{name}/{sampler}: latents came back {lat64.dtype}"
        assert np.isfinite(lat64).all()
        p = f"sample{j}_{sampler}_g{g:g}_"
        case = {
            "sampler": sampler,
            "scheduler_class": cls.__name__,
            "scheduler_config": resolved_config(s64),
            "steps": STEPS,
            "guidance_scale": g,
            "class_labels": class_labels,
            "noise": save(exp / f"{p}noise.npy", noise, np.float32),
            "out": save(exp / f"{p}out.npy", lat64, np.float32),
            "timesteps": save(exp / f"{p}timesteps.npy", s64.timesteps.numpy(), np.float64),
        }
        if hasattr(s64, "sigmas"):
            case["sigmas"] = save(exp / f"{p}sigmas.npy", s64.sigmas.numpy(), np.float64)
        case["dtype_reference"] = "float64"
        case["float32_diffusers_vs_reference"] = err_stats(lat32, lat64)
        cases["sampling"].append(case)
        log(f"{name}: {sampler} g={g:g} out std={lat64.std():.3f} "
            f"fp32 rel_l2={case['float32_diffusers_vs_reference']['rel_l2']:.2e}")

    (exp / "cases.json").write_text(json.dumps(cases, indent=2, allow_nan=False) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args()
    diffusers.utils.logging.set_verbosity_error()
    diffusers.utils.logging.disable_progress_bar()
    torch.set_num_threads(1)  # bitwise-stable reductions from run to run
    torch.use_deterministic_algorithms(True)
    args.out.mkdir(parents=True, exist_ok=True)
    for spec in CONFIGS:
        make_model(spec, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
