#!/usr/bin/env python3
"""T5 encoder GGUFs (llama.cpp's T5 names, as the shared
t5-v1_1-xxl-encoder-Q8_0.gguf files keep them) and a tiny FLUX pipeline that
takes a GGUF transformer and a GGUF T5 beside an ordinary Diffusers folder,
with what transformers / Diffusers compute from their dequantized weights in
float64.

    /root/ditd-venv/bin/python tools/make_gguf_t5_fixtures.py [--pipes DIR]

DIR is the assembled FLUX pipeline folders of the build
(<builddir>/tests/golden/flux_pipeline; its dev/ lends the scheduler, VAE,
CLIP and tokenizers). Writes tests/fixtures/gguf_t5/:

  t5-q8_0/     config.json (T5EncoderModel v1.1: gated-gelu, d_model 64, 2
               blocks, vocab 512) + t5-q8_0.gguf: every matrix and the
               token embedding in Q8_0 (gguf.quants.quantize), norms and the
               relative position bias F32; expected/ (cases.json + .npy):
               last_hidden_state for token ids with and without a padding
               mask.
  t5-q4_k/     d_model 256 (rows of whole 256-value blocks), 1 block: q, k,
               v, o, wi_0 in Q4_K, wi_1 in Q5_K, wo in Q6_K (blocks made by
               tools/make_flux_gguf_fixtures.py's min/max fit; the gguf
               package dequantizes K types, it does not make them), the
               embedding Q8_0.
  t5-relu/     T5 v1.0's non-gated relu feed-forward, d_model 32, Q8_0.
  t5-relu-iq4_nl.gguf  t5-relu's tensors with enc.blk.1.attn_k.weight in
               IQ4_NL (random bytes): a type ditd refuses, naming it.
  pipeline/    transformer/config.json and text_encoder_2/config.json for a
               FluxPipeline folder (dev's other components), flux-q8_0.gguf
               (FLUX.1's original BFL names, Q8_0 where rows are whole
               blocks) and t5-q8_0.gguf (vocab 32128, d_model 32, Q8_0);
               expected/: the noise and FluxPipeline's final latents
               (N, C, h, w) in float64 from the dequantized weights.

The names are gguf-py's T5ENCODER tensor map (the one transformers' GGUF
loader inverts): token_embd, enc.blk.N.attn_{q,k,v,o,rel_b,norm},
enc.blk.N.ffn_{gate,up,down,norm}, enc.output_norm. ditd must agree within
1e-5 (hidden states) and 1e-4 (final latents). Deterministic; ~2 MB.
"""
import argparse
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import torch
import gguf
from gguf import GGMLQuantizationType as T

import diffusers
import transformers
from diffusers import FluxPipeline, FluxTransformer2DModel
from transformers import T5Config, T5EncoderModel

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_flux_gguf_fixtures import (quant_q4_k, quant_q5_k, quant_q6_k, to_bfl,  # noqa: E402
                                     write_gguf)

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "tests" / "fixtures" / "gguf_t5"
QUANT = {T.Q8_0: lambda x: gguf.quants.quantize(x, T.Q8_0),
         T.Q4_K: quant_q4_k, T.Q5_K: quant_q5_k, T.Q6_K: quant_q6_k}


def t5_gguf_name(hf):
    """transformers' T5EncoderModel name -> llama.cpp's (gguf-py's T5ENCODER map)."""
    m = gguf.get_tensor_name_map(gguf.MODEL_ARCH.T5ENCODER, 64)
    base, suf = hf.rsplit(".", 1)
    g = m.get_name(base)
    assert g is not None, hf
    return g + "." + suf


def randomize(model, gen):
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "shared" in name or "relative_attention_bias" in name:
                v = torch.randn(p.shape, generator=gen, dtype=torch.float64)
            elif p.ndim > 1:
                v = torch.randn(p.shape, generator=gen, dtype=torch.float64) / p[0].numel() ** 0.5
            else:
                v = 1 + 0.1 * torch.randn(p.shape, generator=gen, dtype=torch.float64)
            p.copy_(v)


def write_t5(folder, cfg, types, seed):
    """A T5EncoderModel of cfg with random weights as a GGUF (types: a function
    name -> ggml type) in folder/<folder name>.gguf and its config.json. Returns
    the float64 model holding the dequantized weights."""
    folder.mkdir(parents=True)
    torch.manual_seed(seed)
    model = T5EncoderModel(T5Config(**cfg)).to(torch.float64).eval()  # no dropout
    randomize(model, torch.Generator().manual_seed(seed))
    model.config.save_pretrained(folder)
    c = json.loads((folder / "config.json").read_text())
    c.pop("transformers_version", None)
    c["torch_dtype"] = c.pop("dtype", "float32")
    (folder / "config.json").write_text(json.dumps(c, indent=2, sort_keys=True) + "\n")
    w = gguf.GGUFWriter(str(folder / (folder.name + ".gguf")), arch="t5encoder")
    w.add_block_count(cfg["num_layers"])
    w.add_embedding_length(cfg["d_model"])
    deq = {}
    sd = {k: v for k, v in model.state_dict().items() if k != "encoder.embed_tokens.weight"}
    for hf in sorted(sd):
        a = sd[hf].numpy().astype(np.float32)
        qt = types(hf) if a.ndim == 2 and "relative_attention_bias" not in hf else T.F32
        name = t5_gguf_name(hf)
        if qt == T.F32:
            w.add_tensor(name, a)
            deq[hf] = a
        else:
            q = QUANT[qt](a)
            w.add_tensor(name, q.reshape(a.shape[0], -1), raw_dtype=qt)
            deq[hf] = gguf.quants.dequantize(q.reshape(a.shape[0], -1), qt).astype(np.float32)
            assert deq[hf].shape == a.shape, hf
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with torch.no_grad():
        for k, p in model.state_dict().items():
            src = deq["shared.weight" if k == "encoder.embed_tokens.weight" else k]
            p.copy_(torch.from_numpy(src).to(torch.float64))
    return model


def t5_cases(folder, model, vocab):
    exp = folder / "expected"
    exp.mkdir()
    gen = torch.Generator().manual_seed(7)
    ids = torch.randint(0, vocab, (2, 12), generator=gen)
    mask = torch.ones(2, 12, dtype=torch.int64)
    mask[1, 8:] = 0
    cases = []
    for i, m in enumerate((None, mask)):
        with torch.no_grad():
            h = model(input_ids=ids, attention_mask=m).last_hidden_state
        np.save(exp / f"ids_{i}.npy", ids.numpy().astype(np.int64))
        np.save(exp / f"hidden_{i}.npy", h.numpy().astype(np.float32))
        c = dict(ids=f"ids_{i}.npy", hidden=f"hidden_{i}.npy", B=2, N=12)
        if m is not None:
            np.save(exp / f"mask_{i}.npy", m.numpy().astype(np.uint8))
            c["mask"] = f"mask_{i}.npy"
        cases.append(c)
    (exp / "cases.json").write_text(json.dumps(dict(cases=cases), indent=2) + "\n")


def t5_types_q8(hf):
    return T.Q8_0


def t5_types_k(hf):
    if "wo" in hf:
        return T.Q6_K
    if "wi_1" in hf:
        return T.Q5_K
    if "shared" in hf:
        return T.Q8_0
    return T.Q4_K


def write_bad_type(src, dst, bad):
    """src's tensors again, `bad` stored as IQ4_NL (a type ditd reads but does
    not dequantize): random bytes of the right size."""
    r = gguf.GGUFReader(str(src))
    w = gguf.GGUFWriter(str(dst), arch="t5encoder")
    rng = np.random.default_rng(5)
    for t in r.tensors:
        shape = [int(x) for x in reversed(t.shape)]  # PyTorch order
        if t.name == bad:
            nb = shape[1] // 32 * 18
            w.add_tensor(t.name, rng.integers(0, 256, (shape[0], nb), dtype=np.uint8),
                         raw_dtype=T.IQ4_NL)
        elif t.tensor_type == T.F32:
            w.add_tensor(t.name, np.asarray(t.data, dtype=np.float32).reshape(shape))
        else:
            w.add_tensor(t.name, np.asarray(t.data).reshape(shape[0], -1), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def make_pipeline(out, pipes):
    """FluxPipeline from dev/ with a GGUF transformer and a GGUF T5."""
    d = out / "pipeline"
    exp = d / "expected"
    exp.mkdir(parents=True)
    t5cfg = dict(vocab_size=32128, d_model=32, d_kv=8, num_heads=4, d_ff=64, num_layers=2,
                 feed_forward_proj="gated-gelu", relative_attention_num_buckets=32,
                 relative_attention_max_distance=128, layer_norm_epsilon=1e-6,
                 is_encoder_decoder=False, use_cache=False)
    t5 = write_t5(d / "t5-q8_0", t5cfg, t5_types_q8, 2001)
    (d / "text_encoder_2").mkdir()
    shutil.move(str(d / "t5-q8_0" / "config.json"), d / "text_encoder_2" / "config.json")
    shutil.move(str(d / "t5-q8_0" / "t5-q8_0.gguf"), d / "t5-q8_0.gguf")
    (d / "t5-q8_0").rmdir()

    tcfg = dict(patch_size=1, in_channels=64, num_layers=1, num_single_layers=1,
                attention_head_dim=32, num_attention_heads=2, joint_attention_dim=32,
                pooled_projection_dim=6, guidance_embeds=True, axes_dims_rope=[8, 12, 12])
    torch.manual_seed(2002)
    tr = FluxTransformer2DModel(**tcfg).to(torch.float64).eval()
    randomize(tr, torch.Generator().manual_seed(2002))
    tr.save_config(d / "transformer")
    sd = {k: v.numpy().astype(np.float32) for k, v in tr.state_dict().items()}
    D, F = 64, 256
    bfl = to_bfl(sd, D, F, 1, 1)
    deq_bfl = write_gguf(d / "flux-q8_0.gguf", bfl, T.Q8_0)
    # back to Diffusers' names: the same split to_bfl undid
    from make_flux_gguf_fixtures import from_bfl
    deq = from_bfl(deq_bfl, D, F, 1, 1)
    with torch.no_grad():
        for k, p in tr.state_dict().items():
            p.copy_(torch.from_numpy(np.asarray(deq[k])).to(torch.float64))

    pipe = FluxPipeline.from_pretrained(Path(pipes) / "dev", torch_dtype=torch.float64,
                                        transformer=tr, text_encoder_2=t5)
    pipe.set_progress_bar_config(disable=True)
    H = W = 32
    vsf = pipe.vae_scale_factor
    h, w, C = H // vsf, W // vsf, 16
    noise = torch.randn((1, C, h, w), generator=torch.Generator().manual_seed(2003),
                        dtype=torch.float32)
    packed = FluxPipeline._pack_latents(noise, 1, C, h, w).to(torch.float64)
    prompt, steps, gs = "a red fox in the snow, 雪", 3, 3.5
    with torch.no_grad():
        lat = pipe(prompt=prompt, height=H, width=W, num_inference_steps=steps, guidance_scale=gs,
                   max_sequence_length=32, latents=packed, output_type="latent",
                   return_dict=False)[0]
    final = FluxPipeline._unpack_latents(lat, H, W, vsf)
    np.save(exp / "noise.npy", noise.numpy().astype(np.float32))
    np.save(exp / "final_latents.npy", final.numpy().astype(np.float32))
    meta = dict(prompt=prompt, width=W, height=H, steps=steps, guidance=gs,
                max_sequence_length=32, seed=0, noise="noise.npy",
                final_latents="final_latents.npy", diffusers=diffusers.__version__,
                transformers=transformers.__version__, compute="float64")
    (exp / "cases.json").write_text(json.dumps(meta, indent=2, ensure_ascii=False) + "\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pipes", default=str(REPO / "build" / "tests" / "golden" / "flux_pipeline"))
    args = ap.parse_args()
    torch.set_num_threads(2)
    torch.use_deterministic_algorithms(True)
    transformers.logging.set_verbosity_error()
    diffusers.utils.logging.set_verbosity_error()
    shutil.rmtree(OUT, ignore_errors=True)
    OUT.mkdir(parents=True)
    base = dict(relative_attention_num_buckets=32, relative_attention_max_distance=128,
                layer_norm_epsilon=1e-6, is_encoder_decoder=False, use_cache=False)
    m = write_t5(OUT / "t5-q8_0", dict(base, vocab_size=512, d_model=64, d_kv=16, num_heads=4,
                                       d_ff=96, num_layers=2, feed_forward_proj="gated-gelu"),
                 t5_types_q8, 1001)
    t5_cases(OUT / "t5-q8_0", m, 512)
    m = write_t5(OUT / "t5-q4_k", dict(base, vocab_size=300, d_model=256, d_kv=64, num_heads=4,
                                       d_ff=256, num_layers=1, feed_forward_proj="gated-gelu"),
                 t5_types_k, 1002)
    t5_cases(OUT / "t5-q4_k", m, 300)
    m = write_t5(OUT / "t5-relu", dict(base, vocab_size=200, d_model=32, d_kv=8, num_heads=4,
                                       d_ff=64, num_layers=2, feed_forward_proj="relu"),
                 t5_types_q8, 1003)
    t5_cases(OUT / "t5-relu", m, 200)
    write_bad_type(OUT / "t5-relu" / "t5-relu.gguf", OUT / "t5-relu-iq4_nl.gguf",
                   "enc.blk.1.attn_k.weight")
    make_pipeline(OUT, args.pipes)
    print("wrote", OUT)


if __name__ == "__main__":
    main()
