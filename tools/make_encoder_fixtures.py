#!/usr/bin/env python3
"""Build the reference fixtures for ditd's text encoders (CLIP, T5, UMT5).

What it is: a script that makes tiny random-weight transformers checkpoints --
CLIPTextModel, CLIPTextModelWithProjection and T5EncoderModel -- in the folder layout a
Diffusers pipeline has for text_encoder*/ (config.json + model.safetensors), under
tests/fixtures/encoders/<name>/, and records what transformers computes with them, in
float64 with eager attention, in <name>/expected/ (.npy files listed by cases.json):

  - CLIP: last_hidden_state, pooler_output, hidden_states[i] for a few i, text_embeds
    (WithProjection), for fixed token ids with and without a padding attention mask;
  - T5: last_hidden_state, with and without a padding mask;
  - UMT5 (UMT5EncoderModel, a relative bias per block): last_hidden_state, and as
    WanPipeline._get_t5_prompt_embeds calls it (max_sequence_length 512, the
    attention mask, then the padded positions zeroed; "zeroed" in cases.json);
  - umt5-wan-vocab: a UMT5 with Wan's vocabulary size (256,384; d_model 2, so the
    table stays 1 MB) and WanPipeline._get_t5_prompt_embeds itself on prompts, with the
    real UMT5 tokenizer (tests/fixtures/tokenizers/, umt5_hub): prompt_clean, tokenize
    to 512 with the mask, encode, zero the padding (prompts + embeddings in cases.json);
  - t5_buckets.json: T5Attention._relative_position_bucket for a range of offsets.

The weights are stored in f32, f16 or bf16 (one fixture each at least); the float64
reference runs on exactly the stored values. Names are transformers': CLIP with the
"text_model." prefix of hub checkpoints, and without it as transformers 5 saves
CLIPTextModel; T5's embedding as shared.weight or encoder.embed_tokens.weight.

What it is not: part of the build or the tests (tests never need PyTorch). Re-run only
when a fixture must change:

    python tools/make_encoder_fixtures.py [--out tests/fixtures/encoders]

It deletes and rewrites the folders it owns; re-running gives identical files.
"""

import argparse
import json
import shutil
from pathlib import Path

import numpy as np
import safetensors.torch
import torch
import transformers
from transformers import (CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection, T5Config, T5EncoderModel,
                          UMT5Config, UMT5EncoderModel)

DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}


def randomize(model, gen):
    """Random values everywhere (norm gains near 1, biases small), so that every
    parameter changes the output and none is the default init."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1 and ("norm" in name):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen, dtype=torch.float64))
            elif p.ndim == 1:
                p.copy_(0.1 * torch.randn(p.shape, generator=gen, dtype=torch.float64))
            elif "embed" in name or "shared" in name or "relative_attention_bias" in name:
                p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float64))
            else:
                p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float64) / p.shape[1] ** 0.5)


def save(model, out, dtype, rename=None, drop=(), shards=1):
    """Rounds the weights to dtype, writes model.safetensors (names renamed) -- or
    `shards` files with a model.safetensors.index.json, as large hub checkpoints
    come -- and puts the rounded values back into the float64 model."""
    sd = {}
    with torch.no_grad():
        for k, v in model.state_dict().items():
            r = v.to(DTYPES[dtype])
            v.copy_(r.to(torch.float64))
            if k in drop:
                continue
            sd[rename(k) if rename else k] = r.clone().contiguous()
    if shards == 1:
        safetensors.torch.save_file(sd, str(out / "model.safetensors"), metadata={"format": "pt"})
        return
    names = sorted(sd)
    weight_map = {}
    for i in range(shards):
        file = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        part = {k: sd[k] for k in names[i::shards]}
        safetensors.torch.save_file(part, str(out / file), metadata={"format": "pt"})
        weight_map.update({k: file for k in part})
    total = sum(v.numel() * v.element_size() for v in sd.values())
    (out / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}, indent=1) + "\n")


def write_config(model, out, extra=None):
    model.config.save_pretrained(out)
    cfg = json.loads((out / "config.json").read_text())
    cfg.pop("dtype", None)
    cfg.pop("transformers_version", None)
    cfg.update(extra or {})
    (out / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def npy(out, name, a):
    np.save(out / "expected" / name, np.ascontiguousarray(a))
    return name


def clip_case(model, with_proj, ids, mask, out, tag, hidden_idx):
    m = model.text_model if with_proj else model
    with torch.no_grad():
        r = m(input_ids=torch.tensor(ids), attention_mask=None if mask is None else torch.tensor(mask),
              output_hidden_states=True)
        emb = model.text_projection(r.pooler_output) if with_proj else None
    case = {
        "ids": npy(out, f"{tag}_ids.npy", np.array(ids, dtype=np.int64)),
        "last": npy(out, f"{tag}_last.npy", r.last_hidden_state.numpy().astype(np.float32)),
        "pooled": npy(out, f"{tag}_pooled.npy", r.pooler_output.numpy().astype(np.float32)),
        "hidden": {},
    }
    if mask is not None:
        case["mask"] = npy(out, f"{tag}_mask.npy", np.array(mask, dtype=np.int64))
    for i in hidden_idx:
        case["hidden"][str(i)] = npy(out, f"{tag}_hidden{i}.npy", r.hidden_states[i].numpy().astype(np.float32))
    if with_proj:
        case["text_embeds"] = npy(out, f"{tag}_text_embeds.npy", emb.numpy().astype(np.float32))
    return case


def make_clip(root, name, seed, cfg, with_proj, dtype, prefix, cases):
    out = root / name
    shutil.rmtree(out, ignore_errors=True)
    (out / "expected").mkdir(parents=True)
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    config = CLIPTextConfig(**cfg)
    config._attn_implementation = "eager"
    cls = CLIPTextModelWithProjection if with_proj else CLIPTextModel
    model = cls(config).double().eval()
    randomize(model, gen)
    rename = None
    if prefix and not with_proj:
        rename = lambda k: "text_model." + k  # noqa: E731 (hub checkpoints, transformers 4.x)
    save(model, out, dtype, rename)
    write_config(model, out, {"architectures": [cls.__name__]})
    got = []
    L = cfg["num_hidden_layers"]
    for i, (ids, mask) in enumerate(cases):
        got.append(clip_case(model, with_proj, ids, mask, out, f"case{i}", [0, 1, L - 1, L]))
    (out / "expected" / "cases.json").write_text(json.dumps({"class": cls.__name__, "dtype": dtype, "cases": got},
                                                            indent=1) + "\n")


def make_t5(root, name, seed, cfg, dtype, emb_name, cases, shards=1):
    out = root / name
    shutil.rmtree(out, ignore_errors=True)
    (out / "expected").mkdir(parents=True)
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    config = T5Config(**cfg)
    config._attn_implementation = "eager"
    model = T5EncoderModel(config).double().eval()
    randomize(model, gen)
    # shared and encoder.embed_tokens are one tensor; the file has one of the names
    drop = ("encoder.embed_tokens.weight",) if emb_name == "shared.weight" else ("shared.weight",)
    save(model, out, dtype, drop=drop, shards=shards)
    write_config(model, out, {"architectures": ["T5EncoderModel"]})
    got = []
    for i, (ids, mask) in enumerate(cases):
        with torch.no_grad():
            r = model(input_ids=torch.tensor(ids), attention_mask=None if mask is None else torch.tensor(mask))
        c = {"ids": npy(out, f"case{i}_ids.npy", np.array(ids, dtype=np.int64)),
             "last": npy(out, f"case{i}_last.npy", r.last_hidden_state.numpy().astype(np.float32))}
        if mask is not None:
            c["mask"] = npy(out, f"case{i}_mask.npy", np.array(mask, dtype=np.int64))
        got.append(c)
    (out / "expected" / "cases.json").write_text(json.dumps({"class": "T5EncoderModel", "dtype": dtype, "cases": got},
                                                            indent=1) + "\n")


def make_umt5(root, name, seed, cfg, dtype, emb_name, cases):
    """cases: (ids, mask, zeroed); zeroed: the output rows where mask is 0 set to
    zero, as WanPipeline does after the encoder."""
    out = root / name
    shutil.rmtree(out, ignore_errors=True)
    (out / "expected").mkdir(parents=True)
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    config = UMT5Config(**cfg)
    config._attn_implementation = "eager"
    model = UMT5EncoderModel(config).double().eval()
    assert all(b.layer[0].SelfAttention.has_relative_attention_bias for b in model.encoder.block)
    randomize(model, gen)
    drop = ("encoder.embed_tokens.weight",) if emb_name == "shared.weight" else ("shared.weight",)
    save(model, out, dtype, drop=drop)
    write_config(model, out, {"architectures": ["UMT5EncoderModel"], "scalable_attention": True})
    got = []
    for i, (ids, mask, zeroed) in enumerate(cases):
        with torch.no_grad():
            m = None if mask is None else torch.tensor(mask)
            h = model(input_ids=torch.tensor(ids), attention_mask=m).last_hidden_state
            if zeroed:  # pipeline_wan.py: u[:seq_len], then new_zeros up to max_sequence_length
                seq_lens = m.gt(0).sum(dim=1).long()
                h = torch.stack([torch.cat([u[:v], u.new_zeros(h.shape[1] - v, h.shape[2])])
                                 for u, v in zip(h, seq_lens)])
        c = {"ids": npy(out, f"case{i}_ids.npy", np.array(ids, dtype=np.int64)),
             "last": npy(out, f"case{i}_last.npy", h.numpy().astype(np.float32)), "zeroed": zeroed}
        if mask is not None:
            c["mask"] = npy(out, f"case{i}_mask.npy", np.array(mask, dtype=np.int64))
        got.append(c)
    (out / "expected" / "cases.json").write_text(json.dumps({"class": "UMT5EncoderModel", "dtype": dtype,
                                                             "cases": got}, indent=1) + "\n")


WAN_PROMPTS = [
    "A cat and a dog baking a cake together in a kitchen. The cat is carefully measuring flour.",
    "  Two &amp;amp; three &lt;b&gt;bold&lt;/b&gt;\u3000\u3000caf\u00e9   \t\n",
    "\u8272\u8c03\u8273\u4e3d\uff0c\u8fc7\u66dd\uff0c\u9759\u6001\uff0c\u7ec6\u8282\u6a21\u7cca\u4e0d\u6e05\uff0c\u5b57\u5e55",
    "",
    " ".join(["a very long prompt about a river and mountains"] * 80),
]


def make_umt5_wan(root, name, seed):
    """A UMT5 with Wan's vocabulary size, through WanPipeline._get_t5_prompt_embeds
    with the real tokenizer (needs tests/fixtures/tokenizers/umt5_tokenizer.json.xz)."""
    import sys
    import tempfile
    import types
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests/fixtures/tokenizers"))
    import unpack
    from transformers import T5Tokenizer
    from diffusers import WanPipeline
    from diffusers.pipelines.wan.pipeline_wan import prompt_clean
    import diffusers.utils
    assert not diffusers.utils.is_ftfy_available(), "the reference is prompt_clean without ftfy"
    out = root / name
    shutil.rmtree(out, ignore_errors=True)
    (out / "expected").mkdir(parents=True)
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    cfg = dict(vocab_size=256384, d_model=2, d_kv=2, d_ff=6, num_layers=2, num_heads=2,
               relative_attention_num_buckets=32, relative_attention_max_distance=128,
               feed_forward_proj="gated-gelu", layer_norm_epsilon=1e-6, is_encoder_decoder=False, use_cache=False)
    config = UMT5Config(**cfg)
    config._attn_implementation = "eager"
    model = UMT5EncoderModel(config).double().eval()
    randomize(model, gen)
    save(model, out, "bf16", drop=("encoder.embed_tokens.weight",))
    write_config(model, out, {"architectures": ["UMT5EncoderModel"], "scalable_attention": True})
    with tempfile.TemporaryDirectory() as tmp:
        unpack.make_umt5_hub(tmp + "/umt5_hub")
        tok = T5Tokenizer.from_pretrained(tmp + "/umt5_hub")
    pipe = types.SimpleNamespace(tokenizer=tok, text_encoder=model, _execution_device=torch.device("cpu"))
    with torch.no_grad():
        emb = WanPipeline._get_t5_prompt_embeds(pipe, prompt=WAN_PROMPTS, max_sequence_length=512,
                                                device=torch.device("cpu"), dtype=torch.float64)
    seq_lens = [sum(tok(prompt_clean(p), max_length=512, truncation=True).attention_mask) for p in WAN_PROMPTS]
    case = {"prompts": WAN_PROMPTS, "max_sequence_length": 512, "seq_lens": seq_lens,
            "last": npy(out, "wan_embeds.npy", emb.numpy().astype(np.float32))}
    (out / "expected" / "cases.json").write_text(json.dumps({"class": "UMT5EncoderModel", "dtype": "bf16",
                                                             "wan_prompt_embeds": case, "cases": []},
                                                            indent=1, ensure_ascii=False) + "\n")


def wan_ids(rng, V, N, lens):
    """Token rows as the T5 tokenizer pads them for WanPipeline: text, </s> (1),
    then <pad> (0) up to max_sequence_length; the mask 1 over text and </s>."""
    ids, mask = [], []
    for n in lens:
        ids.append(rng.integers(2, V, size=n - 1).tolist() + [1] + [0] * (N - n))
        mask.append([1] * n + [0] * (N - n))
    return ids, mask


def rand_ids(rng, B, N, V, lo=0):
    return rng.integers(lo, V, size=(B, N)).tolist()


def clip_ids(rng, B, N, V, bos, eos, pad, lens):
    """bos, random text, eos, then pad (CLIP pipelines pad with eos or '!')."""
    rows = []
    for b in range(B):
        n = lens[b]
        body = rng.integers(3, V - 2, size=n - 2).tolist()
        rows.append([bos] + body + [eos] + [pad] * (N - n))
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent.parent / "tests/fixtures/encoders"))
    args = ap.parse_args()
    root = Path(args.out)
    root.mkdir(parents=True, exist_ok=True)
    torch.use_deterministic_algorithms(True)
    rng = np.random.default_rng(20261201)

    # CLIPTextModel, quick_gelu, hub names (text_model.*), f32, eos_token_id rule
    V, N = 99, 16
    cfg = dict(vocab_size=V, hidden_size=24, intermediate_size=37, num_hidden_layers=3, num_attention_heads=3,
               max_position_embeddings=N, hidden_act="quick_gelu", layer_norm_eps=1e-5, bos_token_id=V - 2,
               eos_token_id=V - 1, pad_token_id=V - 1, projection_dim=12)
    ids = clip_ids(rng, 3, N, V, V - 2, V - 1, V - 1, [16, 9, 5])
    ids_short = clip_ids(rng, 2, 11, V, V - 2, V - 1, 1, [11, 7])
    mask = [[1] * 11, [1] * 7 + [0] * 4]
    make_clip(root, "clip-quick-f32", 1, cfg, False, "f32", True, [(ids, None), (ids_short, mask)])

    # CLIPTextModel, gelu, transformers-5 names (no prefix), bf16, legacy eos_token_id 2 (argmax of ids)
    V = 61
    cfg = dict(vocab_size=V, hidden_size=20, intermediate_size=28, num_hidden_layers=2, num_attention_heads=5,
               max_position_embeddings=12, hidden_act="gelu", layer_norm_eps=1e-5, bos_token_id=0, eos_token_id=2,
               pad_token_id=1, projection_dim=8)
    ids = rand_ids(rng, 2, 12, V - 1)
    ids[0][7] = V - 1  # a unique largest id: argmax picks it
    ids[1][3] = V - 1
    ids[1][9] = V - 1  # ties: the first
    make_clip(root, "clip-gelu-legacy-bf16", 2, cfg, False, "bf16", False, [(ids, None)])

    # CLIPTextModelWithProjection, quick_gelu, f16, padding mask, seq shorter than max
    V = 77
    cfg = dict(vocab_size=V, hidden_size=28, intermediate_size=44, num_hidden_layers=4, num_attention_heads=7,
               max_position_embeddings=20, hidden_act="quick_gelu", layer_norm_eps=1e-5, bos_token_id=V - 2,
               eos_token_id=V - 1, pad_token_id=0, projection_dim=10)
    ids = clip_ids(rng, 2, 20, V, V - 2, V - 1, V - 1, [20, 6])
    ids2 = clip_ids(rng, 3, 13, V, V - 2, V - 1, 0, [13, 4, 9])
    mask2 = [[1] * 13, [1] * 4 + [0] * 9, [1] * 9 + [0] * 4]
    # no eos at all in one row: transformers takes position 0
    ids3 = [rng.integers(3, V - 2, size=8).tolist()]
    make_clip(root, "clip-proj-f16", 3, cfg, True, "f16", True, [(ids, None), (ids2, mask2), (ids3, None)])

    # T5EncoderModel, gated-gelu (gelu_new), bf16, small buckets so that N reaches the log buckets
    V = 53
    cfg = dict(vocab_size=V, d_model=20, d_kv=7, d_ff=36, num_layers=3, num_heads=3, relative_attention_num_buckets=8,
               relative_attention_max_distance=20, feed_forward_proj="gated-gelu", layer_norm_epsilon=1e-6,
               is_encoder_decoder=False, use_cache=False)
    ids = rand_ids(rng, 2, 30, V)
    mask = [[1] * 30, [1] * 17 + [0] * 13]
    make_t5(root, "t5-gated-bf16", 4, cfg, "bf16", "shared.weight", [(ids, mask), (rand_ids(rng, 1, 5, V), None)])

    # T5EncoderModel, relu, f32, default buckets (32, 128), odd heads, inner dim != d_model
    V = 47
    cfg = dict(vocab_size=V, d_model=16, d_kv=5, d_ff=30, num_layers=2, num_heads=5, feed_forward_proj="relu",
               layer_norm_epsilon=1e-6, is_encoder_decoder=False, use_cache=False)
    ids = rand_ids(rng, 3, 21, V)
    mask = [[1] * 21, [1] * 12 + [0] * 9, [1] * 2 + [0] * 19]
    make_t5(root, "t5-relu-f32", 5, cfg, "f32", "encoder.embed_tokens.weight", [(ids, mask), (ids, None)])

    # The same, in two shards with an index (as t5-v1_1-xxl and FLUX.1's text_encoder_2 come)
    make_t5(root, "t5-relu-f32-sharded", 5, cfg, "f32", "encoder.embed_tokens.weight", [(ids, mask)], shards=2)

    # UMT5EncoderModel (Wan's text encoder, in small): gated-gelu, a bias table per
    # block; f32 and bf16; WanPipeline's max_sequence_length 512 with its mask and
    # zeroed padding, and short unmasked rows.
    V = 71
    cfg = dict(vocab_size=V, d_model=24, d_kv=6, d_ff=40, num_layers=3, num_heads=4, relative_attention_num_buckets=32,
               relative_attention_max_distance=128, feed_forward_proj="gated-gelu", layer_norm_epsilon=1e-6,
               is_encoder_decoder=False, use_cache=False)
    wid, wmask = wan_ids(rng, V, 512, [37, 300])
    short = rand_ids(rng, 2, 19, V)
    short_mask = [[1] * 19, [1] * 6 + [0] * 13]
    make_umt5(root, "umt5-f32", 6, cfg, "f32", "shared.weight",
              [(wid, wmask, True), (short, None, False), (short, short_mask, False)])
    cfg_b = dict(cfg, relative_attention_num_buckets=8, relative_attention_max_distance=20, num_layers=2,
                 d_kv=5, num_heads=3)
    wid, wmask = wan_ids(rng, V, 512, [512, 1, 200])
    make_umt5(root, "umt5-bf16", 7, cfg_b, "bf16", "encoder.embed_tokens.weight",
              [(wid, wmask, True), (rand_ids(rng, 1, 40, V), None, False)])

    make_umt5_wan(root, "umt5-wan-vocab", 8)

    # The bucket function itself, over offsets far past max_distance.
    from transformers.models.t5.modeling_t5 import T5Attention
    rel = torch.arange(-1100, 1101)
    buckets = {}
    for nb, md in [(32, 128), (8, 20), (64, 256), (16, 50)]:
        b = T5Attention._relative_position_bucket(rel, bidirectional=True, num_buckets=nb, max_distance=md)
        buckets[f"{nb},{md}"] = b.tolist()
    (root / "t5_buckets.json").write_text(json.dumps({"first": -1100, "buckets": buckets}) + "\n")
    # Configs with every key transformers writes (use_diff=False): all must load.
    (root / "configs").mkdir(exist_ok=True)
    for name, cfg in [("full-clip.json", CLIPTextConfig(architectures=["CLIPTextModelWithProjection"])),
                      ("full-t5.json", T5Config(feed_forward_proj="gated-gelu", architectures=["T5EncoderModel"])),
                      ("full-umt5.json", UMT5Config(architectures=["UMT5EncoderModel"]))]:
        d = json.loads(cfg.to_json_string(use_diff=False))
        d.pop("transformers_version", None)
        (root / "configs" / name).write_text(json.dumps(d, indent=1, sort_keys=True) + "\n")
    print("transformers", transformers.__version__, "->", root)


if __name__ == "__main__":
    main()
