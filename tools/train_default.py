#!/usr/bin/env python3
"""Train ditd's embedded default model: a class-conditional DiT on Fashion-MNIST.

What it is: a CPU training script for a small Diffusers DiTTransformer2DModel
(adaLN-Zero, class-conditional, pixel space, 28x28x1 in [-1, 1]) trained with
rectified flow (flow matching): x_t = (1 - s) x0 + s noise, the model predicts the
velocity noise - x0 at timestep t = 1000 s, s drawn logit-normal. That is exactly
what Diffusers' FlowMatchEulerDiscreteScheduler integrates, so ditd's `flow-euler`
sampler (and Diffusers' DiTPipeline with that scheduler) reproduce it.

Classifier-free guidance: labels are replaced by the null class
(num_embeds_ada_norm = 10) with probability 0.1, using Diffusers' own
LabelEmbedding.token_drop. Diffusers' DiT has one CombinedTimestepLabelEmbeddings
per block (plus block 0's again for the output layer), each of which would draw
its own dropout mask in train mode; we drop once, before the model, and keep those
embedders in eval mode so all blocks see the same label.

It keeps an EMA of the weights and saves the EMA, in Diffusers layout:

    models/fashion-dit/model_index.json        DiTPipeline, id2label, no vae
    models/fashion-dit/transformer/            save_pretrained (fp16 safetensors)
    models/fashion-dit/scheduler/scheduler_config.json
    models/fashion-dit/ditd.json               default steps / guidance / sampler

A full training state (weights, EMA, optimizer, step) goes to --ckpt every
--save-every minutes, and the EMA model is exported then too, so a partial run is
usable; --resume continues from --ckpt. It stops at --steps or after --minutes.

    python tools/train_default.py                  # the default model (4400 steps or 72 min)
    python tools/train_default.py --timing 30      # time 30 steps, save nothing
    python tools/train_default.py --resume         # continue from --ckpt
    python tools/train_default.py --export-only    # re-export --ckpt's EMA

Data: Debian package dataset-fashion-mnist (/usr/share/datasets/fashion-mnist).
Runs on one thread by default (--threads).
"""

import argparse
import copy
import gzip
import json
import math
import os
import shutil
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import diffusers
from diffusers import DiTTransformer2DModel, FlowMatchEulerDiscreteScheduler
from diffusers.models.embeddings import LabelEmbedding

REPO = Path(__file__).resolve().parent.parent
DATA = Path("/usr/share/datasets/fashion-mnist")
CLASSES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
           "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"]
NUM_CLASSES = len(CLASSES)


def load_split(split):
    """Fashion-MNIST as uint8 images (N, 28, 28) and int64 labels (N,)."""
    prefix = "train" if split == "train" else "t10k"
    with gzip.open(DATA / f"{prefix}-images-idx3-ubyte.gz", "rb") as f:
        raw = f.read()
    n = int.from_bytes(raw[4:8], "big")
    images = np.frombuffer(raw, np.uint8, offset=16).reshape(n, 28, 28)
    with gzip.open(DATA / f"{prefix}-labels-idx1-ubyte.gz", "rb") as f:
        raw = f.read()
    labels = np.frombuffer(raw, np.uint8, offset=8).astype(np.int64)
    assert labels.shape[0] == n
    return images, labels


def make_model(args):
    return DiTTransformer2DModel(
        num_attention_heads=args.heads,
        attention_head_dim=args.width // args.heads,
        in_channels=1,
        out_channels=1,
        num_layers=args.layers,
        attention_bias=True,
        sample_size=28,
        patch_size=args.patch,
        activation_fn="gelu-approximate",
        num_embeds_ada_norm=NUM_CLASSES,
        norm_type="ada_norm_zero",
        norm_elementwise_affine=False,
        norm_eps=1e-5,
    )


def dit_init(model):
    """The DiT paper's initialisation (Peebles & Xie, initialize_weights), mapped to
    Diffusers' names: xavier linears, patch projection like a linear, N(0, 0.02)
    label tables and timestep MLPs, adaLN-Zero modulations and the output layer zero."""
    for m in model.modules():
        if isinstance(m, nn.Linear):
            nn.init.xavier_uniform_(m.weight)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
    w = model.pos_embed.proj.weight
    nn.init.xavier_uniform_(w.view(w.shape[0], -1))
    nn.init.zeros_(model.pos_embed.proj.bias)
    for block in model.transformer_blocks:
        emb = block.norm1.emb
        nn.init.normal_(emb.class_embedder.embedding_table.weight, std=0.02)
        nn.init.normal_(emb.timestep_embedder.linear_1.weight, std=0.02)
        nn.init.normal_(emb.timestep_embedder.linear_2.weight, std=0.02)
        nn.init.zeros_(block.norm1.linear.weight)
        nn.init.zeros_(block.norm1.linear.bias)
    for lin in (model.proj_out_1, model.proj_out_2):
        nn.init.zeros_(lin.weight)
        nn.init.zeros_(lin.bias)


def set_train(model, train):
    """model.train(train), but the per-block label embedders stay in eval mode:
    label dropout is applied once per sample, before the model (see module doc)."""
    model.train(train)
    for m in model.modules():
        if isinstance(m, LabelEmbedding):
            m.eval()


def drop_labels(model, labels):
    """Diffusers' own dropout (LabelEmbedding.token_drop): each label becomes the null
    class num_embeds_ada_norm with probability class_dropout_prob (0.1)."""
    emb = model.transformer_blocks[0].norm1.emb.class_embedder
    assert emb.num_classes == model.config.num_embeds_ada_norm == NUM_CLASSES
    assert emb.embedding_table.num_embeddings == NUM_CLASSES + 1
    return emb.token_drop(labels)


def sample_sigmas(n, args, gen):
    """Training noise levels s in (0, 1): logit-normal(mean, std) (SD3's choice)."""
    u = torch.randn(n, generator=gen) * args.logit_std + args.logit_mean
    return torch.sigmoid(u)


def flow_loss(model, x0, labels, args, gen):
    n = x0.shape[0]
    s = sample_sigmas(n, args, gen)
    noise = torch.randn(x0.shape, generator=gen)
    sb = s.view(n, 1, 1, 1)
    xt = (1 - sb) * x0 + sb * noise
    target = noise - x0
    # FlowMatchEulerDiscreteScheduler feeds the model t = 1000 * sigma.
    t = s * 1000.0
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
        pred = model(xt, timestep=t, class_labels=labels).sample
    return F.mse_loss(pred.float(), target)


@torch.no_grad()
def ema_update(ema, model, decay):
    for pe, pm in zip(ema.parameters(), model.parameters()):
        pe.lerp_(pm, 1.0 - decay)


def scheduler_config(args):
    sched = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=args.shift)
    return sched


def export(ema, args, out):
    """Write the Diffusers folder (EMA weights) and check Diffusers loads it back."""
    out = Path(out)
    tmp = out.with_name(out.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    model = copy.deepcopy(ema).eval()
    if args.save_dtype == "float16":
        model = model.to(torch.float16)
    model.save_pretrained(tmp / "transformer", safe_serialization=True)
    scheduler_config(args).save_pretrained(tmp / "scheduler")
    index = {
        "_class_name": "DiTPipeline",
        "_diffusers_version": diffusers.__version__,
        "transformer": ["diffusers", "DiTTransformer2DModel"],
        "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
        "id2label": {str(i): c for i, c in enumerate(CLASSES)},
    }
    (tmp / "model_index.json").write_text(json.dumps(index, indent=2) + "\n")
    defaults = out / "ditd.json"
    if defaults.exists():  # chosen by tools/eval_default.py's sweep: keep it
        shutil.copy(defaults, tmp / "ditd.json")
    else:
        (tmp / "ditd.json").write_text(json.dumps(
            {"num_inference_steps": args.default_steps, "guidance_scale": args.default_guidance,
             "sampler": "flow-euler"}, indent=2) + "\n")
    check_load(tmp, ema)
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
    for f in out.rglob("*"):
        if f.is_file():
            f.chmod(0o644)


@torch.no_grad()
def check_load(folder, ema):
    """DiTTransformer2DModel.from_pretrained loads the export, and it computes what the
    EMA model computes (to the storage precision)."""
    back = DiTTransformer2DModel.from_pretrained(folder / "transformer", torch_dtype=torch.float32).eval()
    FlowMatchEulerDiscreteScheduler.from_pretrained(folder / "scheduler")
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 1, 28, 28, generator=g)
    t = torch.tensor([1000.0, 600.0, 250.0, 10.0])
    y = torch.tensor([0, 5, 9, NUM_CLASSES])
    ref = copy.deepcopy(ema).eval()
    a = ref(x, timestep=t, class_labels=y).sample
    b = back(x, timestep=t, class_labels=y).sample
    rel = ((a - b).norm() / a.norm().clamp_min(1e-12)).item()
    if rel > 5e-3:
        raise SystemExit(f"export check failed: relative difference {rel:.3g} after reload")
    return rel


def save_ckpt(path, model, ema, opt, step, args, elapsed):
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save({"model": model.state_dict(), "ema": ema.state_dict(), "opt": opt.state_dict(),
                "step": step, "args": vars(args), "elapsed": elapsed}, tmp)
    os.replace(tmp, path)


def lr_at(step, args, minutes=0.0):
    """Linear warm-up, then cosine from lr to lr_min. Progress is the larger of the
    step fraction and the wall-time fraction, so the decay completes within --minutes
    on a busy machine too."""
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    frac = (step - args.warmup) / max(1, args.steps - args.warmup)
    if args.minutes > 0:
        frac = max(frac, minutes / args.minutes)
    frac = min(1.0, frac)
    return args.lr_min + 0.5 * (args.lr - args.lr_min) * (1 + math.cos(math.pi * frac))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(REPO / "models" / "fashion-dit"))
    ap.add_argument("--ckpt", default="/work/fashion-train/ckpt.pt",
                    help="training state (outside the repo)")
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--export-only", action="store_true", help="export --ckpt's EMA and exit")
    ap.add_argument("--timing", type=int, default=0, help="time this many steps, save nothing")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    # model
    ap.add_argument("--width", type=int, default=192)
    ap.add_argument("--heads", type=int, default=3)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--patch", type=int, default=4)
    # optimisation
    ap.add_argument("--steps", type=int, default=4400)
    ap.add_argument("--minutes", type=float, default=72.0, help="wall-time budget")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=6e-4)
    ap.add_argument("--lr-min", type=float, default=3e-5)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--weight-decay", type=float, default=0.0)
    ap.add_argument("--ema", type=float, default=0.999)
    ap.add_argument("--logit-mean", type=float, default=0.0)
    ap.add_argument("--logit-std", type=float, default=1.0)
    ap.add_argument("--shift", type=float, default=1.0, help="FlowMatchEulerDiscreteScheduler shift")
    ap.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=True,
                    help="bfloat16 autocast for the matmuls (fp32 master weights and EMA)")
    ap.add_argument("--save-every", type=float, default=10.0, help="minutes between checkpoints")
    ap.add_argument("--save-dtype", choices=["float16", "float32"], default="float16")
    ap.add_argument("--default-steps", type=int, default=20)
    ap.add_argument("--default-guidance", type=float, default=3.0)
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)

    model = make_model(args)
    if args.export_only:
        state = torch.load(args.ckpt, map_location="cpu")
        for k in ("width", "heads", "layers", "patch", "shift"):
            setattr(args, k, state["args"][k])
        ema = make_model(args)
        ema.load_state_dict(state["ema"])
        export(ema, args, args.out)
        print(f"exported EMA at step {state['step']} to {args.out}")
        return

    dit_init(model)
    ema = copy.deepcopy(model).eval()
    for p in ema.parameters():
        p.requires_grad_(False)
    nparams = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.99),
                            weight_decay=args.weight_decay)
    step, elapsed0 = 0, 0.0
    if args.resume and Path(args.ckpt).exists():
        state = torch.load(args.ckpt, map_location="cpu")
        model.load_state_dict(state["model"])
        ema.load_state_dict(state["ema"])
        opt.load_state_dict(state["opt"])
        step, elapsed0 = state["step"], state["elapsed"]
        print(f"resumed at step {step} ({elapsed0 / 60:.1f} min trained)", flush=True)

    images, labels = load_split("train")
    x_all = torch.from_numpy(images.copy()).float().div_(127.5).sub_(1.0).unsqueeze(1)  # [-1, 1]
    y_all = torch.from_numpy(labels.copy())
    n = x_all.shape[0]
    print(f"DiT width {args.width} heads {args.heads} layers {args.layers} patch {args.patch}: "
          f"{nparams / 1e6:.2f} M parameters, {(28 // args.patch) ** 2} tokens; {n} images; "
          f"torch {torch.__version__} diffusers {diffusers.__version__}, {args.threads} thread(s)",
          flush=True)

    gen = torch.Generator().manual_seed(args.seed * 1000 + step)
    perm, pos = torch.randperm(n, generator=gen), 0
    set_train(model, True)
    t_start = time.time()
    t_last_save = t_start
    t_log, loss_acc, loss_n = time.time(), 0.0, 0
    limit = args.timing if args.timing else args.steps
    done = 0
    while step < limit:
        if pos + args.batch > n:
            perm, pos = torch.randperm(n, generator=gen), 0
        idx = perm[pos:pos + args.batch]
        pos += args.batch
        x0, y = x_all[idx], drop_labels(model, y_all[idx])
        for g in opt.param_groups:
            g["lr"] = lr_at(step, args, (elapsed0 + time.time() - t_start) / 60)
        loss = flow_loss(model, x0, y, args, gen)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        decay = min(args.ema, (1 + step) / (10 + step))
        ema_update(ema, model, decay)
        step += 1
        done += 1
        loss_acc += loss.item()
        loss_n += 1
        now = time.time()
        if args.timing and done == 5:
            t_timing = now  # skip warm-up
        if step % 100 == 0 or (args.timing and step == limit):
            print(f"step {step} loss {loss_acc / loss_n:.4f} lr {opt.param_groups[0]['lr']:.2e} "
                  f"{(now - t_log) / loss_n * 1000:.0f} ms/step elapsed "
                  f"{(elapsed0 + now - t_start) / 60:.1f} min", flush=True)
            t_log, loss_acc, loss_n = now, 0.0, 0
        if args.timing:
            continue
        if elapsed0 + now - t_start > args.minutes * 60:
            print(f"time budget reached at step {step}", flush=True)
            break
        if now - t_last_save > args.save_every * 60:
            save_ckpt(args.ckpt, model, ema, opt, step, args, elapsed0 + now - t_start)
            export(ema, args, args.out)
            print(f"checkpoint at step {step}", flush=True)
            t_last_save = time.time()

    if args.timing:
        ms = (time.time() - t_timing) / max(1, done - 5) * 1000
        print(f"timing: {ms:.0f} ms/step at batch {args.batch}; "
              f"{args.minutes} min = {int(args.minutes * 60000 / ms)} steps", flush=True)
        return
    elapsed = elapsed0 + time.time() - t_start
    save_ckpt(args.ckpt, model, ema, opt, step, args, elapsed)
    export(ema, args, args.out)
    print(f"done: {step} steps, {elapsed / 60:.1f} min, exported to {args.out}", flush=True)


if __name__ == "__main__":
    main()
