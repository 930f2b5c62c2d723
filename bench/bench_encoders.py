#!/usr/bin/env python3
"""Times ditd's text encoders beside transformers (PyTorch, CPU), same threads.

Writes random-weight checkpoints with the real configs -- CLIP-L's text model
(openai/clip-vit-large-patch14, as FLUX.1 and SD3 use it) and the T5-XXL encoder
(google/t5-v1_1-xxl, FLUX.1's text_encoder_2) -- in bf16, as those pipelines ship
them, to --workdir. The T5 file is written one tensor at a time (numpy, no torch),
so making it needs no more memory than its largest tensor.

Each row runs in a fresh process and reports the median of --repeat encodes and the
process's peak resident set (VmHWM, which starts again at exec: the checkpoint
pages it touched, its buffers). Both sides run with OMP_WAIT_POLICY=passive: on a
shared, oversubscribed machine spinning OpenMP threads make 2-thread runs 10-60x
slower and the numbers meaningless. transformers runs from_pretrained on the same folder in float32 (the CPU
default) and in bfloat16, with eager attention, under torch.inference_mode.

--t5-layers runs T5-XXL at a reduced depth (the same 4096-wide layers, fewer of
them) where the shared machine cannot hold 24; the report gives the measured
numbers and says so. A benchmark: it asserts nothing.

    /root/ditd-venv/bin/python bench/bench_encoders.py \\
        --bench build/tests/golden/bench_encoders --threads 2 --t5-layers 2,4
"""
import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

CLIP_L = {"architectures": ["CLIPTextModel"], "model_type": "clip_text_model", "vocab_size": 49408,
          "hidden_size": 768, "intermediate_size": 3072, "projection_dim": 768, "num_hidden_layers": 12,
          "num_attention_heads": 12, "max_position_embeddings": 77, "hidden_act": "quick_gelu",
          "layer_norm_eps": 1e-5, "attention_dropout": 0.0, "dropout": 0.0, "initializer_factor": 1.0,
          "initializer_range": 0.02, "bos_token_id": 0, "eos_token_id": 2, "pad_token_id": 1}
T5_XXL = {"architectures": ["T5EncoderModel"], "model_type": "t5", "vocab_size": 32128, "d_model": 4096,
          "d_kv": 64, "d_ff": 10240, "num_layers": 24, "num_decoder_layers": 24, "num_heads": 64,
          "relative_attention_num_buckets": 32, "relative_attention_max_distance": 128,
          "feed_forward_proj": "gated-gelu", "dense_act_fn": "gelu_new", "is_gated_act": True,
          "layer_norm_epsilon": 1e-6, "dropout_rate": 0.1, "initializer_factor": 1.0,
          "is_encoder_decoder": True, "tie_word_embeddings": False, "use_cache": True,
          "pad_token_id": 0, "eos_token_id": 1, "decoder_start_token_id": 0}


def clip_tensors(c):
    D, F, L = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"]
    p = "text_model."
    yield p + "embeddings.token_embedding.weight", (c["vocab_size"], D)
    yield p + "embeddings.position_embedding.weight", (c["max_position_embeddings"], D)
    for i in range(L):
        e = f"{p}encoder.layers.{i}."
        for n in ("q_proj", "k_proj", "v_proj", "out_proj"):
            yield e + f"self_attn.{n}.weight", (D, D)
            yield e + f"self_attn.{n}.bias", (D,)
        for n in ("layer_norm1", "layer_norm2"):
            yield e + n + ".weight", (D,)
            yield e + n + ".bias", (D,)
        yield e + "mlp.fc1.weight", (F, D)
        yield e + "mlp.fc1.bias", (F,)
        yield e + "mlp.fc2.weight", (D, F)
        yield e + "mlp.fc2.bias", (D,)
    yield p + "final_layer_norm.weight", (D,)
    yield p + "final_layer_norm.bias", (D,)


def t5_tensors(c):
    D, F, I = c["d_model"], c["d_ff"], c["num_heads"] * c["d_kv"]
    yield "shared.weight", (c["vocab_size"], D)
    yield "encoder.embed_tokens.weight", (c["vocab_size"], D)
    for i in range(c["num_layers"]):
        e = f"encoder.block.{i}.layer."
        for n in "qkv":
            yield e + f"0.SelfAttention.{n}.weight", (I, D)
        yield e + "0.SelfAttention.o.weight", (D, I)
        if i == 0:
            yield e + "0.SelfAttention.relative_attention_bias.weight", (c["relative_attention_num_buckets"],
                                                                       c["num_heads"])
        yield e + "0.layer_norm.weight", (D,)
        yield e + "1.DenseReluDense.wi_0.weight", (F, D)
        yield e + "1.DenseReluDense.wi_1.weight", (F, D)
        yield e + "1.DenseReluDense.wo.weight", (D, F)
        yield e + "1.layer_norm.weight", (D,)
    yield "encoder.final_layer_norm.weight", (D,)


def bf16_bits(a):
    u = a.astype(np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def write_safetensors(path, tensors, seed):
    """bf16 safetensors, tensor by tensor: random normal / sqrt(fan_in) for
    matrices, ~1 for norm gains, small biases."""
    tensors = list(tensors)
    header, off = {}, 0
    for name, shape in tensors:
        n = int(np.prod(shape)) * 2
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [off, off + n]}
        off += n
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    rng = np.random.default_rng(seed)
    with open(path, "wb") as f:
        f.write(len(h).to_bytes(8, "little"))
        f.write(h)
        for name, shape in tensors:
            if len(shape) == 1:
                a = (1.0 if "norm" in name else 0.0) + 0.05 * rng.standard_normal(shape, dtype=np.float32)
            elif "embedding" in name or "shared" in name or "embed_tokens" in name or "relative" in name:
                a = rng.standard_normal(shape, dtype=np.float32)
            else:
                a = rng.standard_normal(shape, dtype=np.float32) / np.float32(np.sqrt(shape[1]))
            f.write(bf16_bits(a).tobytes())


def make(workdir, name, cfg, tensors, layers=None):
    d = Path(workdir) / name
    d.mkdir(parents=True, exist_ok=True)
    st = d / "model.safetensors"
    if not st.exists():
        print(f"writing {st} ...", file=sys.stderr, flush=True)
        write_safetensors(st, tensors(cfg), seed=len(name))
    (d / "config.json").write_text(json.dumps(cfg, indent=1) + "\n")
    return d


def variant(workdir, base, name, cfg):
    """The same checkpoint under a config of fewer layers (the extra tensors are
    never read)."""
    d = Path(workdir) / name
    d.mkdir(parents=True, exist_ok=True)
    if not (d / "model.safetensors").exists():
        os.symlink(base / "model.safetensors", d / "model.safetensors")
    (d / "config.json").write_text(json.dumps(cfg, indent=1) + "\n")
    return d


TORCH_CHILD = r"""
import json, re, statistics, sys, time, torch, transformers
d, tokens, threads, repeat, dtype = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
torch.set_num_threads(threads)
cfg = json.load(open(d + "/config.json"))
cls = transformers.T5EncoderModel if cfg["model_type"] == "t5" else transformers.CLIPTextModel
t0 = time.perf_counter()
m = cls.from_pretrained(d, dtype=getattr(torch, dtype), attn_implementation="eager").eval()
load = (time.perf_counter() - t0) * 1e3
ids = torch.randint(0, cfg["vocab_size"], (1, tokens))
ms = []
with torch.inference_mode():
    for _ in range(repeat):
        t0 = time.perf_counter()
        m(input_ids=ids)
        ms.append((time.perf_counter() - t0) * 1e3)
print(json.dumps({"load_ms": load, "median_ms": statistics.median(ms), "min_ms": min(ms),
                  "peak_rss_mib": int(re.search(r"VmHWM:\s*(\d+)", open("/proc/self/status").read()).group(1)) / 1024}))
"""


def run_torch(d, tokens, threads, repeat, dtype):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OMP_WAIT_POLICY="passive",
               TRANSFORMERS_VERBOSITY="error")
    r = subprocess.run([sys.executable, "-c", TORCH_CHILD, str(d), str(tokens), str(threads), str(repeat), dtype],
                       capture_output=True, text=True, env=env)
    if r.returncode:
        return {"error": r.stderr.strip().splitlines()[-1] if r.stderr.strip() else f"exit {r.returncode}"}
    return json.loads(r.stdout.strip().splitlines()[-1])


def run_ditd(bench, d, tokens, threads, repeat):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OMP_WAIT_POLICY="passive")
    r = subprocess.run([bench, "--model", str(d), "--tokens", str(tokens), "--threads", str(threads),
                        "--repeat", str(repeat)], capture_output=True, text=True, env=env)
    if r.returncode:
        return {"error": r.stderr.strip()}
    return json.loads(r.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bench", required=True, help="the bench_encoders binary")
    ap.add_argument("--workdir", default="/tmp/ditd-bench-encoders")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--t5-layers", default="2,4", help="T5-XXL depths to run (24 = full)")
    ap.add_argument("--t5-tokens", default="256,512")
    ap.add_argument("--torch-dtypes", default="float32,bfloat16")
    ap.add_argument("--skip-torch-above", type=int, default=4,
                    help="T5 depths above this run ditd only (transformers would not fit)")
    args = ap.parse_args()

    rows = []
    clip = make(args.workdir, "clip-l-bf16", CLIP_L, clip_tensors)
    t5full = make(args.workdir, "t5-xxl-bf16", T5_XXL, t5_tensors)
    jobs = [("CLIP-L", clip, 77, True)]
    for L in [int(x) for x in args.t5_layers.split(",")]:
        d = t5full if L == 24 else variant(args.workdir, t5full, f"t5-xxl-{L}l", dict(T5_XXL, num_layers=L))
        for n in [int(x) for x in args.t5_tokens.split(",")]:
            jobs.append((f"T5-XXL {L} layers", d, n, L <= args.skip_torch_above))
    for what, d, n, with_torch in jobs:
        r = run_ditd(args.bench, d, n, args.threads, args.repeat)
        rows.append({**r, "model": what, "tokens": n, "impl": "ditd (bf16 weights, f32 compute)"})
        print(json.dumps(rows[-1]), flush=True)
        if with_torch:
            for dt in args.torch_dtypes.split(","):
                r = run_torch(d, n, args.threads, args.repeat, dt)
                rows.append({**r, "model": what, "tokens": n, "impl": f"transformers {dt}"})
                print(json.dumps(rows[-1]), flush=True)
    print("\n| model | tokens | implementation | median ms | min ms | peak RSS MiB |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in rows:
        if "error" in r:
            print(f"| {r['model']} | {r['tokens']} | {r['impl']} | error: {r['error'][:60]} | | |")
        else:
            print(f"| {r['model']} | {r['tokens']} | {r['impl']} | {r['median_ms']:.0f} | {r['min_ms']:.0f} | "
                  f"{r['peak_rss_mib']:.0f} |")


if __name__ == "__main__":
    main()
