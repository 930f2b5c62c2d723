#!/usr/bin/env python3
"""Writes the hand-made seed corpus of the fuzz targets (stdlib only).

Seeds are small (< 4 KB) valid files and a few broken ones; libFuzzer
finds the rest. Inputs libFuzzer found interesting are kept beside them
under names starting with 'found-'; this script leaves those alone.

    python3 tests/fuzz/make_corpus.py
"""
import json
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


def st(tensors, data, metadata=None, pad=True, raw_header=None):
    """A safetensors image; tensors: name -> (dtype, shape, (b, e))."""
    if raw_header is None:
        h = {}
        if metadata is not None:
            h["__metadata__"] = metadata
        for name, (dt, shape, offs) in tensors.items():
            h[name] = {"dtype": dt, "shape": shape, "data_offsets": list(offs)}
        raw_header = json.dumps(h, separators=(",", ":")).encode()
    if pad:
        raw_header += b" " * ((8 - len(raw_header) % 8) % 8)
    return struct.pack("<Q", len(raw_header)) + raw_header + data


def gguf_str(s):
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def gguf(kvs, tensors, align=32, version=3, nt=None, nkv=None):
    """A GGUF image. kvs: (key, raw value bytes with their u32 type first);
    tensors: (name, ne list, ggml type, offset, data bytes placed there)."""
    out = b"GGUF" + struct.pack("<IQQ", version, len(tensors) if nt is None else nt,
                                len(kvs) if nkv is None else nkv)
    for k, v in kvs:
        out += gguf_str(k) + v
    for name, ne, t, off, _ in tensors:
        out += gguf_str(name) + struct.pack("<I", len(ne)) + struct.pack("<%dQ" % len(ne), *ne)
        out += struct.pack("<IQ", t, off)
    out += b"\0" * ((align - len(out) % align) % align)
    data = bytearray()
    for _, _, _, off, blob in tensors:
        if not blob:
            continue
        if len(data) < off + len(blob):
            data += b"\0" * (off + len(blob) - len(data))
        data[off:off + len(blob)] = blob
    return out + bytes(data)


def kv_u32(v):
    return struct.pack("<II", 4, v)


def kv_string(s):
    return struct.pack("<I", 8) + gguf_str(s)


def kv_array(elem_type, fmt, values):
    body = b"".join(gguf_str(v) for v in values) if elem_type == 8 else struct.pack(
        "<" + fmt * len(values), *values)
    return struct.pack("<IIQ", 9, elem_type, len(values)) + body


def q8_0_block(scale_bits, qs):
    return struct.pack("<H", scale_bits) + bytes(q & 0xff for q in qs)


def npy(dict_text, data, major=1):
    pre = 10 if major == 1 else 12
    h = dict_text.encode("latin1")
    h += b" " * ((64 - (pre + len(h) + 1) % 64) % 64) + b"\n"
    lenfield = struct.pack("<H", len(h)) if major == 1 else struct.pack("<I", len(h))
    return b"\x93NUMPY" + bytes([major, 0]) + lenfield + h + data


def write(target, name, blob):
    assert len(blob) < 4096, (target, name, len(blob))
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(blob)


def f32(*v):
    return struct.pack("<%df" % len(v), *v)


def main():
    # --- safetensors ---------------------------------------------------
    write("safetensors", "empty", st({}, b""))
    write("safetensors", "f32-2x3", st({"w": ("F32", [2, 3], (0, 24))}, f32(*range(6))))
    mixed = (f32(1.5, -2.0) + struct.pack("<3H", 0x3C00, 0x0001, 0x7E00)
             + struct.pack("<2H", 0x3F80, 0xFF80) + struct.pack("<d", 0.1)
             + struct.pack("<2q", 1, -1) + b"\x01\x00")
    write("safetensors", "mixed-dtypes", st({
        "a.weight": ("F32", [2], (0, 8)),
        "a.bias": ("F16", [3], (8, 14)),
        "b": ("BF16", [2, 1], (14, 18)),
        "c": ("F64", [], (18, 26)),
        "idx": ("I64", [2], (26, 42)),
        "mask": ("BOOL", [2], (42, 44)),
    }, mixed, metadata={"format": "pt"}))
    write("safetensors", "4d-bf16", st({"q": ("BF16", [2, 3, 2, 2], (0, 48))},
                                       bytes(range(48))))
    write("safetensors", "zero-size-and-hole", st({
        "z": ("F32", [0, 4], (0, 0)),
        "a": ("F32", [1], (4, 8)),
    }, f32(0, 1)))
    write("safetensors", "unaligned", st({"u": ("U8", [3], (0, 3)),
                                          "h": ("F16", [2], (3, 7))},
                                         b"\x01\x02\x03" + struct.pack("<2H", 0x3C00, 0xBC00),
                                         pad=False))
    write("safetensors", "f8-f4", st({"e": ("F8_E4M3", [2], (0, 2)),
                                      "f": ("F4", [4], (2, 4))}, b"\x38\xb8\x12\x34"))
    write("safetensors", "bad-offsets", st({"w": ("F32", [2], (4, 12))}, f32(1)))
    write("safetensors", "bad-overlap", st({"a": ("F32", [2], (0, 8)),
                                            "b": ("F32", [2], (4, 12))}, f32(1, 2, 3)))
    write("safetensors", "bad-nbytes", st({"a": ("F16", [3], (0, 4))}, b"\0" * 4))
    write("safetensors", "bad-json", st(None, b"", raw_header=b'{"a":{"dtype":"F32",'))
    write("safetensors", "bad-length", struct.pack("<Q", 1 << 40) + b"{}")
    write("safetensors", "bad-dtype", st({"a": ("F128", [1], (0, 16))}, b"\0" * 16))
    write("safetensors", "overflow-shape",
          st({"a": ("F64", [2**40, 2**40, 2**40], (0, 8))}, b"\0" * 8))

    # --- gguf ----------------------------------------------------------
    q8 = q8_0_block(0x3C00, range(-16, 16)) + q8_0_block(0x2E66, range(31, -1, -1))
    q4k = struct.pack("<HH", 0x2C00, 0x2400) + bytes(range(12)) + bytes((7 * i) & 0xff for i in range(128))
    q6k = bytes((3 * i) & 0xff for i in range(192)) + bytes((i * 13) & 0xff for i in range(16)) + struct.pack("<H", 0x2000)
    meta = [("general.architecture", kv_string("flux")),
            ("general.alignment", kv_u32(32)),
            ("test.b", struct.pack("<IB", 7, 1)),
            ("test.f64", struct.pack("<Id", 12, -0.5)),
            ("test.i64", struct.pack("<Iq", 11, -3)),
            ("test.strs", kv_array(8, "", ["a", "", "xyz"])),
            ("test.i16s", kv_array(3, "h", [1, -2, 3]))]
    write("gguf", "good", gguf(meta, [
        ("img_in.weight", [64, 1], 8, 0, q8),
        ("blk.q4k", [256, 1], 12, 96, q4k),
        ("blk.q6k", [256], 14, 256, q6k),
        ("bias", [2], 0, 480, struct.pack("<2f", 0.5, -1.0)),
        ("half", [2, 2], 1, 512, struct.pack("<4H", 0x3C00, 0x8001, 0x7BFF, 0xC000)),
        ("bf", [3], 30, 544, struct.pack("<3H", 0x3F80, 0xFF80, 0x0001)),
    ]))
    write("gguf", "empty", gguf([], []))
    write("gguf", "align64", gguf([("general.alignment", kv_u32(64))],
                                  [("a", [32, 1, 1], 8, 0, q8[:34]), ("b", [2], 0, 64, b"\0" * 8)],
                                  align=64))
    write("gguf", "v2", gguf([], [("a", [32], 8, 0, q8[:34])], version=2))
    write("gguf", "unsupported-type", gguf([], [("iq", [32], 20, 0, b"\1" * 18)]))
    write("gguf", "bad-v1", gguf([], [], version=1))
    write("gguf", "bad-offset", gguf([], [("a", [32], 8, 1 << 40, b"")]))
    write("gguf", "bad-misaligned", gguf([], [("a", [32], 8, 8, q8[:34])]))
    write("gguf", "bad-overlap", gguf([], [("a", [64], 8, 0, q8), ("b", [32], 8, 32, q8[:34])]))
    write("gguf", "bad-dims", gguf([], [("a", [32, 1 << 40, 1 << 40], 8, 0, q8[:34])]))
    write("gguf", "bad-block", gguf([], [("a", [33], 8, 0, q8)]))
    write("gguf", "bad-type", gguf([], [("a", [32], 99, 0, q8[:34])]))
    write("gguf", "bad-alignment", gguf([("general.alignment", kv_u32(48))], []))
    # a 5-D conv (the shared Wan GGUFs' patch_embedding), and one past the limit
    write("gguf", "conv5d", gguf([], [("patch_embedding.weight", [2, 2, 1, 2, 2], 0, 0,
                                       struct.pack("<16f", *range(16)))]))
    write("gguf", "bad-6d", gguf([], [("a", [1, 1, 1, 1, 1, 2], 0, 0, b"\0" * 8)]))
    write("gguf", "bad-counts", gguf([], [], nt=1 << 61, nkv=1 << 59))
    write("gguf", "bad-strlen", b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 1 << 62) + b"k")
    write("gguf", "bad-nested", gguf([("n", struct.pack("<IIQ", 9, 9, 1))], []))
    write("gguf", "bad-truncated", gguf(meta, [("img_in.weight", [64, 1], 8, 0, q8)])[:-5])

    # --- npy -----------------------------------------------------------
    write("npy", "f4-2x3", npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }",
                               f32(*range(6))))
    write("npy", "f8-v2", npy("{'descr': '<f8', 'fortran_order': False, 'shape': (3,), }",
                              struct.pack("<3d", 0.1, -1e300, 2.5), major=2))
    write("npy", "i8-v3", npy("{'descr': '<i8', 'fortran_order': False, 'shape': (2,), }",
                              struct.pack("<2q", -5, 7), major=3))
    write("npy", "i4", npy("{'descr': '<i4', 'fortran_order': False, 'shape': (2, 1), }",
                           struct.pack("<2i", 3, -3)))
    write("npy", "u1", npy("{'descr': '|u1', 'fortran_order': False, 'shape': (3,), }",
                           b"\x00\x80\xff"))
    write("npy", "f2", npy("{'descr': '<f2', 'fortran_order': False, 'shape': (2,), }",
                              struct.pack("<2H", 0x3C00, 0x0001)))
    write("npy", "b1", npy("{'descr': '|b1', 'fortran_order': False, 'shape': (2,), }",
                           b"\x00\x01"))
    write("npy", "scalar", npy("{'descr': '<f4', 'fortran_order': False, 'shape': (), }",
                               f32(4.5)))
    write("npy", "quotes-list",
          npy('{"shape": [1, 2], "fortran_order": True, "descr": "<u8"}',
              struct.pack("<2Q", 1, 2**64 - 1)))
    write("npy", "bad-bigendian", npy("{'descr': '>f4', 'fortran_order': False, 'shape': (1,), }",
                                      f32(1)))
    write("npy", "bad-fortran", npy("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2), }",
                                    f32(1, 2, 3, 4)))
    write("npy", "bad-truncated", npy("{'descr': '<f4', 'fortran_order': False, 'shape': (9,), }",
                                      f32(1)))
    write("npy", "bad-structured",
          npy("{'descr': [('x', '<f4')], 'fortran_order': False, 'shape': (1,), }", f32(1)))

    # --- st_index ------------------------------------------------------
    def idx(m, extra=None):
        d = {"metadata": {"total_size": 50}, "weight_map": m}
        if extra:
            d.update(extra)
        return json.dumps(d, indent=2).encode()

    write("st_index", "good", idx({"a": "s1.safetensors", "b": "s1.safetensors",
                                   "c": "s2.safetensors", "d": "sub/s3.safetensors"}))
    write("st_index", "good-partial", idx({"c": "s2.safetensors"}))
    write("st_index", "missing-tensor", idx({"x": "s1.safetensors"}))
    write("st_index", "wrong-shard", idx({"a": "s2.safetensors"}))
    write("st_index", "escape", idx({"a": "../s1.safetensors"}))
    write("st_index", "absolute", idx({"a": "/etc/hostname"}))
    write("st_index", "folder", idx({"a": "sub"}))
    write("st_index", "not-safetensors", idx({"a": "model.safetensors.index.json"}))
    write("st_index", "no-shard-file", idx({"a": "s9.safetensors"}))
    write("st_index", "bad-json", b'{"weight_map": {"a": "s1.safetensors"')

    # --- LoRA adapters (fuzz_lora: targets to_q (3, 2), ff.net.0.proj (4, 2),
    # proj_out (2, 4)) --------------------------------------------------
    q = "transformer.transformer_blocks.0.attn1.to_q"
    write("lora", "peft", st({q + ".lora_A.weight": ("F32", [2, 2], (0, 16)),
                              q + ".lora_B.weight": ("F32", [3, 2], (16, 40))},
                             f32(*[0.1 * i for i in range(10)])))
    write("lora", "peft-alpha-f16", st({q + ".alpha": ("F16", [], (0, 2)),
                                        q + ".lora_down.weight": ("F16", [1, 2], (2, 6)),
                                        q + ".lora_up.weight": ("F16", [3, 1], (6, 12))},
                                       struct.pack("<6H", 0x4000, 0x3C00, 0xBC00, 0x3800,
                                                   0x3400, 0x3000)))
    k = "lora_unet_transformer_blocks_0_ff_net_0_proj"
    p = "lora_unet_proj_out"
    write("lora", "kohya-two", st({k + ".alpha": ("F32", [], (0, 4)),
                                   k + ".lora_down.weight": ("BF16", [1, 2], (4, 8)),
                                   k + ".lora_up.weight": ("BF16", [4, 1], (8, 16)),
                                   p + ".lora_down.weight": ("F32", [1, 4], (16, 32)),
                                   p + ".lora_up.weight": ("F32", [2, 1], (32, 40))},
                                  f32(4.0) + struct.pack("<6H", 0x3F80, 0xBF80, 0x3F00, 0x3E80,
                                                         0x3E00, 0x3D80)
                                  + f32(1, 2, 3, 4, 0.5, -0.5)))
    write("lora", "unknown-module", st({"transformer.x.lora_A.weight": ("F32", [1, 2], (0, 8))},
                                       f32(1, 2)))
    write("lora", "wrong-shape", st({q + ".lora_A.weight": ("F32", [2, 3], (0, 24)),
                                     q + ".lora_B.weight": ("F32", [3, 2], (24, 48))},
                                    f32(*range(12))))
    write("lora", "no-b", st({q + ".lora_A.weight": ("F32", [2, 2], (0, 16))}, f32(1, 2, 3, 4)))
    write("lora", "nan", st({q + ".lora_A.weight": ("F32", [1, 2], (0, 8)),
                             q + ".lora_B.weight": ("F32", [3, 1], (8, 20))},
                            f32(1, float("nan"), 1, 2, 3)))
    write("lora", "text-encoder", st({"lora_te_x.lora_down.weight": ("F32", [1, 2], (0, 8))},
                                     f32(1, 2)))
    write("lora", "truncated", st({q + ".lora_A.weight": ("F32", [2, 2], (0, 16)),
                                   q + ".lora_B.weight": ("F32", [3, 2], (16, 40))},
                                  f32(*range(7))))

    # --- community FLUX formats (fuzz_lora's FLUX-named targets: a double
    # block's q|k|v (2, 2) each, a single block's q|k|v (2, 2) and proj_mlp
    # (4, 2), its proj_out (2, 6), norm_out.linear (4, 2), x_embedder (2, 4),
    # proj_out (2, 4) in 2 row groups)
    def lora_st(spec):
        """spec: [(name, dtype F32, shape)]; values 0.1, 0.2, ..."""
        tensors, off, vals = {}, 0, []
        for name, shape in spec:
            n = 1
            for d in shape:
                n *= d
            tensors[name] = ("F32", shape, (off, off + 4 * n))
            off += 4 * n
            vals += [0.1 * (len(vals) + i + 1) for i in range(n)]
        return st(tensors, f32(*vals))

    kb = "lora_unet_double_blocks_0_img_attn_qkv"
    write("lora", "kohya-bfl", lora_st([
        (kb + ".alpha", []), (kb + ".lora_down.weight", [2, 2]), (kb + ".lora_up.weight", [6, 2]),
        ("lora_unet_single_blocks_0_linear1.lora_down.weight", [2, 2]),
        ("lora_unet_single_blocks_0_linear1.lora_up.weight", [10, 2]),
        ("lora_unet_final_layer_adaLN_modulation_1.lora_down.weight", [1, 2]),
        ("lora_unet_final_layer_adaLN_modulation_1.lora_up.weight", [4, 1]),
        ("lora_unet_final_layer_linear.alpha", []),
        ("lora_unet_final_layer_linear.lora_down.weight", [1, 2]),
        ("lora_unet_final_layer_linear.lora_up.weight", [2, 1]),
        ("lora_unet_img_in.lora_down.weight", [1, 4]),
        ("lora_unet_img_in.lora_up.weight", [2, 1])]))
    # the up matrix block-diagonal: split by rank
    write("lora", "kohya-bfl-split-qkv", st(
        {kb + ".lora_down.weight": ("F32", [3, 2], (0, 24)),
         kb + ".lora_up.weight": ("F32", [6, 3], (24, 96))},
        f32(1, 2, 3, 4, 5, 6, 1, 0, 0, 2, 0, 0, 0, 3, 0, 0, 4, 0, 0, 0, 5, 0, 0, 6)))
    d = "diffusion_model.double_blocks.0.img_attn.qkv"
    write("lora", "bfl-comfy", lora_st([
        (d + ".alpha", []), (d + ".lora_down.weight", [1, 2]), (d + ".lora_up.weight", [6, 1]),
        ("diffusion_model.single_blocks.0.linear2.lora_down.weight", [1, 6]),
        ("diffusion_model.single_blocks.0.linear2.lora_up.weight", [2, 1])]))
    write("lora", "bfl-lora-a", lora_st([
        (d + ".lora_A.weight", [1, 2]), (d + ".lora_B.weight", [6, 1]),
        ("diffusion_model.single_blocks.0.linear2.diff_b", [2])]))
    write("lora", "bfl-spellings-mixed", lora_st([
        (d + ".lora_A.weight", [1, 2]), (d + ".lora_up.weight", [6, 1])]))
    xd = "double_blocks.0.processor.qkv_lora1"
    write("lora", "xlabs", lora_st([
        (xd + ".down.weight", [2, 2]), (xd + ".up.weight", [6, 2]),
        ("diffusion_model.single_blocks.0.processor.proj_lora.down.weight", [1, 6]),
        ("diffusion_model.single_blocks.0.processor.proj_lora.up.weight", [2, 1])]))
    write("lora", "xlabs-kohya-mixed", lora_st([
        (xd + ".down.weight", [2, 2]), (xd + ".up.weight", [6, 2]),
        (kb + ".lora_down.weight", [2, 2]), (kb + ".lora_up.weight", [6, 2])]))
    write("lora", "kohya-bfl-no-block", lora_st([
        ("lora_unet_double_blocks_7_img_attn_qkv.lora_down.weight", [2, 2]),
        ("lora_unet_double_blocks_7_img_attn_qkv.lora_up.weight", [6, 2])]))
    write("lora", "kohya-bfl-wrong-up", lora_st([
        (kb + ".lora_down.weight", [2, 2]), (kb + ".lora_up.weight", [4, 2])]))
    # --- text-encoder LoRA (fuzz_text_lora: text_encoder (CLIP) q_proj (3, 3), fc1 (5, 3),
    # text_projection (2, 3); text_encoder_2 (T5) q (4, 3), wo (3, 6)) ----------------
    c = "text_encoder.text_model.encoder.layers.0.self_attn.q_proj"
    t = "text_encoder_2.encoder.block.0.layer.0.SelfAttention.q"
    write("text_lora", "peft-both", st({c + ".lora_A.weight": ("F32", [1, 3], (0, 12)),
                                        c + ".lora_B.weight": ("F32", [3, 1], (12, 24)),
                                        t + ".lora_A.weight": ("F32", [1, 3], (24, 36)),
                                        t + ".lora_B.weight": ("F32", [4, 1], (36, 52)),
                                        t + ".alpha": ("F32", [], (52, 56)),
                                        "transformer.x.lora_A.weight": ("F32", [1, 1], (56, 60))},
                                       f32(*[0.1 * i for i in range(14)], 2.0, 1.0)))
    f = "text_encoder.encoder.layers.0.mlp.fc1"
    write("text_lora", "peft-flat-bf16", st({f + ".lora_down.weight": ("BF16", [1, 3], (0, 6)),
                                             f + ".lora_up.weight": ("BF16", [5, 1], (6, 16))},
                                            struct.pack("<8H", 0x3F80, 0xBF80, 0x3F00, 0x3E80,
                                                        0x3E00, 0x3D80, 0x3D00, 0x3C80)))
    k = "lora_te1_text_model_encoder_layers_0_mlp_fc1"
    write("text_lora", "kohya", st({k + ".alpha": ("F32", [], (0, 4)),
                                    k + ".lora_down.weight": ("F32", [1, 3], (4, 16)),
                                    k + ".lora_up.weight": ("F32", [5, 1], (16, 36))},
                                   f32(4.0, 1, 2, 3, 1, 2, 3, 4, 5)))
    write("text_lora", "kohya-t5", st({"lora_te2_encoder_block_0_layer_0_SelfAttention_q"
                                       ".lora_down.weight": ("F32", [1, 3], (0, 12))},
                                      f32(1, 2, 3)))
    write("text_lora", "no-component", st({"text_encoder_3.x.lora_A.weight": ("F32", [1, 3],
                                                                              (0, 12))},
                                          f32(1, 2, 3)))
    write("text_lora", "wrong-shape", st({c + ".lora_A.weight": ("F32", [1, 2], (0, 8)),
                                          c + ".lora_B.weight": ("F32", [3, 1], (8, 20))},
                                         f32(1, 2, 3, 4, 5)))
    write("text_lora", "mixed", st({c + ".lora_A.weight": ("F32", [1, 3], (0, 12)),
                                    k + ".lora_up.weight": ("F32", [5, 1], (12, 32))},
                                   f32(1, 2, 3, 1, 2, 3, 4, 5)))


if __name__ == "__main__":
    main()
