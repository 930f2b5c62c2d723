#!/usr/bin/env python3
"""Writes tests/fixtures/gguf/: GGUF files made by the gguf package's own
GGUFWriter, with the package's numpy dequantization beside every quantized
tensor as the reference the C tests compare bit for bit.

    /root/ditd-venv/bin/python tools/make_gguf_fixtures.py

types.gguf holds, for every block type ditd dequantizes, a tensor
"q.<TYPE>" of shape (3, 512) and "ref.<TYPE>" (F32): gguf.quants.dequantize
of q's bytes. Types the package can quantize (F16, BF16, Q4_0, Q4_1, Q5_0,
Q5_1, Q8_0) are quantized from random normal values with
gguf.quants.quantize; the K types, which the package only dequantizes, get
random blocks (random scale bytes and quants, finite fp16 super-scales): the
dequantization is what is tested, and random blocks reach every bit of it.
Also: a 3-D Q8_0 tensor (dimension order), an IQ4_NL tensor (a type ditd
does not dequantize: must be refused naming tensor and type), and metadata
of every value type, arrays included, with values the test knows.

Deterministic (fixed seeds); a few hundred KB.
"""
import os

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T
from gguf.constants import GGML_QUANT_SIZES

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "tests", "fixtures", "gguf")

QUANTIZABLE = [T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0]
K_TYPES = [T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K]


def f16_bytes(rng, n, lo=-6, hi=-1):
    """n random finite fp16 values of magnitude 2^lo .. 2^hi, as bytes."""
    v = rng.uniform(0.5, 1.0, n) * np.exp2(rng.integers(lo, hi + 1, n))
    v *= rng.choice([-1.0, 1.0], n)
    return v.astype(np.float16).view(np.uint8).reshape(n, 2)


def random_k_blocks(rng, qt, nblocks):
    """Random blocks of a K type with sane super-scales (d, dmin)."""
    _, size = GGML_QUANT_SIZES[qt]
    b = rng.integers(0, 256, (nblocks, size), dtype=np.uint8)
    if qt == T.Q2_K:        # scales[16] qs[64] d dmin
        b[:, 80:82] = f16_bytes(rng, nblocks)
        b[:, 82:84] = f16_bytes(rng, nblocks)
    elif qt == T.Q3_K:      # hmask[32] qs[64] scales[12] d
        b[:, 108:110] = f16_bytes(rng, nblocks)
    elif qt in (T.Q4_K, T.Q5_K):  # d dmin scales[12] ...
        b[:, 0:2] = f16_bytes(rng, nblocks)
        b[:, 2:4] = f16_bytes(rng, nblocks)
    elif qt == T.Q6_K:      # ql[128] qh[64] scales[16] d
        b[:, 208:210] = f16_bytes(rng, nblocks)
    return b


def add_metadata(w):
    w.add_uint8("test.u8", 200)
    w.add_int8("test.i8", -100)
    w.add_uint16("test.u16", 60000)
    w.add_int16("test.i16", -30000)
    w.add_uint32("test.u32", 4000000000)
    w.add_int32("test.i32", -2000000000)
    w.add_float32("test.f32", 0.25)
    w.add_bool("test.bool", True)
    w.add_string("test.str", "FLUX.1 \u00e9")
    w.add_uint64("test.u64", 2**63 + 5)
    w.add_int64("test.i64", -(2**62))
    w.add_float64("test.f64", -1.5e300)
    w.add_array("test.arr_i32", [1, -2, 3])
    w.add_array("test.arr_str", ["a", "", "\u00fcber"])
    w.add_array("test.arr_f32", [0.5, -0.5])


def main():
    os.makedirs(OUT, exist_ok=True)
    rng = np.random.default_rng(25)
    w = gguf.GGUFWriter(os.path.join(OUT, "types.gguf"), arch="ditd-test")
    add_metadata(w)
    rows, cols = 3, 512
    checked = 0
    for qt in QUANTIZABLE + K_TYPES:
        if qt in QUANTIZABLE:
            x = rng.standard_normal((rows, cols)).astype(np.float32)
            x[0, :7] = [0.0, -0.0, 1e-8, -65504.0, 3.0, 1.0 / 3.0, -2.5]
            q = gguf.quants.quantize(x, qt)
            if q.dtype == np.float16:
                q = q.view(np.uint8)
        else:
            bs, _ = GGML_QUANT_SIZES[qt]
            q = random_k_blocks(rng, qt, rows * cols // bs).reshape(rows, -1)
        ref = gguf.quants.dequantize(q, qt).astype(np.float32, copy=False)
        assert ref.shape == (rows, cols), (qt.name, ref.shape)
        assert np.all(np.isfinite(ref)), qt.name
        w.add_tensor("q." + qt.name, q, raw_dtype=qt)
        w.add_tensor("ref." + qt.name, np.ascontiguousarray(ref))
        checked += 1
    # F32 through the same path (a plain copy)
    x = rng.standard_normal((rows, cols)).astype(np.float32)
    w.add_tensor("q.F32", x)
    w.add_tensor("ref.F32", x.copy())
    # dimension order: numpy (2, 3, 64) is ggml ne (64, 3, 2)
    x3 = rng.standard_normal((2, 3, 64)).astype(np.float32)
    q3 = gguf.quants.quantize(x3, T.Q8_0)
    w.add_tensor("q3.Q8_0", q3, raw_dtype=T.Q8_0)
    w.add_tensor("ref3.Q8_0", gguf.quants.dequantize(q3, T.Q8_0).astype(np.float32))
    # a type ditd does not dequantize
    w.add_tensor("blk.unsupported", rng.integers(0, 256, (2, 18), dtype=np.uint8),
                 raw_dtype=T.IQ4_NL)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print("types.gguf:", checked + 1, "types")

    # a custom alignment (64) and a single F16 tensor
    w = gguf.GGUFWriter(os.path.join(OUT, "align64.gguf"), arch="ditd-test")
    w.add_custom_alignment(64)
    a = rng.standard_normal((5, 7)).astype(np.float16)
    w.add_tensor("a", rng.standard_normal((3,)).astype(np.float32))
    w.add_tensor("b", a)
    w.add_tensor("b_ref", a.astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def make_dit():
    """gguf/dit/: the DiT fixture tiny-p2-c1-h6 (tools/make_fixtures.py) as a
    GGUF in Diffusers' names, its 2-D weights whose rows are whole blocks in
    Q8_0 and the rest F32, with Diffusers' float64 forward on the
    dequantized weights for that fixture's inputs (x, t, y copied)."""
    import json
    import shutil
    import torch
    import safetensors.numpy
    from diffusers import DiTTransformer2DModel
    src = os.path.join(HERE, "..", "tests", "fixtures", "models", "tiny-p2-c1-h6")
    out = os.path.join(OUT, "dit")
    if os.path.exists(out):
        shutil.rmtree(out)
    os.makedirs(os.path.join(out, "expected"))
    shutil.copy(os.path.join(src, "transformer", "config.json"), out)
    sd = safetensors.numpy.load_file(
        os.path.join(src, "transformer", "diffusion_pytorch_model.safetensors"))
    w = gguf.GGUFWriter(os.path.join(out, "dit.gguf"), arch="dit")
    deq, nq = {}, 0
    for name in sorted(sd):
        a = np.ascontiguousarray(sd[name], dtype=np.float32)
        if a.ndim == 2 and a.shape[1] % 32 == 0:
            q = gguf.quants.quantize(a, T.Q8_0)
            w.add_tensor(name, q, raw_dtype=T.Q8_0)
            deq[name] = gguf.quants.dequantize(q, T.Q8_0).astype(np.float32)
            nq += 1
        else:
            w.add_tensor(name, a)
            deq[name] = a
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with open(os.path.join(out, "config.json")) as f:
        cfg = {k: v for k, v in json.load(f).items() if not k.startswith("_")}
    model = DiTTransformer2DModel(**cfg).to(torch.float64)
    model.load_state_dict({k: torch.from_numpy(v).double() for k, v in deq.items()})
    model.eval()
    with open(os.path.join(src, "expected", "cases.json")) as f:
        cases = json.load(f)["forward"]
    listed = []
    for i, c in enumerate(cases):
        files = {}
        for key in ("x", "t", "y"):
            files[key] = c[key]
            shutil.copy(os.path.join(src, "expected", c[key]), os.path.join(out, "expected"))
        x = np.load(os.path.join(src, "expected", c["x"]))
        t = np.load(os.path.join(src, "expected", c["t"]))
        y = np.load(os.path.join(src, "expected", c["y"]))
        with torch.no_grad():
            o = model(torch.from_numpy(x).double(), timestep=torch.from_numpy(t),
                      class_labels=torch.from_numpy(y)).sample
        files["out"] = f"forward{i}_out.npy"
        np.save(os.path.join(out, "expected", files["out"]), o.numpy().astype(np.float32))
        listed.append(files)
    with open(os.path.join(out, "expected", "cases.json"), "w") as f:
        json.dump({"model": "tiny-p2-c1-h6 in Q8_0", "quantized": nq, "forward": listed}, f,
                  indent=1)
    print("dit:", nq, "Q8_0 tensors,", len(listed), "cases")


if __name__ == "__main__":
    main()
    make_dit()
