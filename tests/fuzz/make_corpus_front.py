#!/usr/bin/env python3
"""Writes the hand-made seeds of the front-end's fuzz targets (stdlib only):
corpus/genreq/ (request bodies and header-like strings) and corpus/proto/
(packed Envelopes of every message kind, written here in protobuf's wire
format by hand from proto/ditd.proto). Leaves found-* and crash-* files
alone. usage: make_corpus_front.py [CORPUS_DIR]"""
import json
import os
import struct
import sys

here = os.path.dirname(os.path.abspath(__file__))
root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "corpus")


def write(sub, name, data):
    d = os.path.join(root, sub)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


# ---- genreq: bodies of POST /v1/images/generations
base = {"model": "fashion \"q\" \u20ac", "prompt": "dress", "n": 1, "size": "28x28",
        "response_format": "b64_json", "seed": 1, "num_inference_steps": 4}
bodies = {
    "valid": base,
    "class-label": dict(base, prompt=None, class_label="Coat"),
    "class-number": dict(base, class_label=3),
    "stream": dict(base, stream=True, partial_images=2),
    "sampler": dict(base, sampler="dpm++2m", guidance_scale=1.5),
    "size-wrap": dict(base, size="4294967324x4294967324"),
    "size-blank": dict(base, size=" 28x28"),
    "size-zero": dict(base, size="0x0"),
    "size-auto": dict(base, size="auto"),
    "euro-prompt": dict(base, prompt="\u20ac" * 300),
    "n-big": dict(base, n=99),
    "seed-big": dict(base, seed=2 ** 64),
    "wrong-model": dict(base, model="nope"),
    "url": dict(base, response_format="url"),
}
# a text model's (fuzz_genreq.c's second model: "flux", multiples of 16 in 16..512)
text = {"model": "black-forest-labs/FLUX.1-dev", "prompt": "a red fox in the snow, \u00e9t\u00e9 \u732b",
        "size": "48x32", "seed": 3, "num_inference_steps": 4, "max_sequence_length": 77}
bodies.update({
    "text-valid": text,
    "text-negative": dict(text, negative_prompt="blurry", true_cfg_scale=4.0),
    "text-size-odd": dict(text, size="40x32"),
    "text-size-big": dict(text, size="1024x1024"),
    "text-msl-big": dict(text, max_sequence_length=513),
    "text-class-label": dict(text, class_label=3),
    "text-long-prompt": dict(text, prompt="a" * 8193),
    "text-empty-prompt": dict(text, prompt=""),
    "text-prompt-list": dict(text, prompt=["a", "b"]),
})
for name, b in bodies.items():
    write("genreq", name, json.dumps({k: v for k, v in b.items() if v is not None}))
write("genreq", "not-object", "[1,2,3]")
write("genreq", "truncated", '{"prompt": "dre')
write("genreq", "dup-keys", '{"n": 1, "n": 2, "prompt": "dress"}')
write("genreq", "bearer", "Bearer k1")
write("genreq", "bearer-cut", b"Bearer \xe2\x82")


# ---- lora_admin: bodies of POST /v1/loras
for name, body in {
        "valid": {"name": "style-v2.1", "path": "style.safetensors"},
        "absolute": {"name": "s", "path": "/srv/adapters/../etc/passwd"},
        "no-name": {"path": "a.safetensors"},
        "bad-name": {"name": "a b/\u20ac", "path": "a"},
        "long-name": {"name": "n" * 64, "path": "a"},
        "long-path": {"name": "x", "path": "p" * 1100},
        "extra": {"name": "x", "path": "a", "scale": 0.5},
        "types": {"name": ["x"], "path": {"p": 1}},
        "null": {"name": None, "path": None}}.items():
    write("lora_admin", name, json.dumps(body, ensure_ascii=False))
write("lora_admin", "nul", '{"name": "x", "path": "a\\u0000b"}')
write("lora_admin", "dup", '{"name": "x", "name": "y", "path": "a"}')
write("lora_admin", "not-object", '["x", "a"]')
write("lora_admin", "truncated", '{"name": "x", "pa')


# ---- proto: wire format by hand
def varint(v):
    out = b""
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out += bytes([b | 0x80])
        else:
            return out + bytes([b])


def key(field, wt):
    return varint(field << 3 | wt)


def vi(field, v):
    return key(field, 0) + varint(v & 0xFFFFFFFFFFFFFFFF)


def ld(field, data):
    if isinstance(data, str):
        data = data.encode()
    return key(field, 2) + varint(len(data)) + data


def f32(field, v):
    return key(field, 5) + struct.pack("<f", v)


def f64(field, v):
    return key(field, 1) + struct.pack("<d", v)


sample = vi(1, 7) + vi(2, 42) + vi(3, 0) + vi(4, 3) + f32(5, 4.0) + vi(6, 1)
batch = vi(1, 5) + ld(2, "tiny") + vi(3, 28) + vi(4, 28) + vi(5, 4) + vi(6, 1) + ld(7, sample) + ld(7, sample)
pixels = bytes(range(256)) * 3 + bytes(16)  # 784 = 28 x 28 x 1
progress = vi(1, 5) + vi(2, 2) + vi(3, 4) + f64(4, 12.5) + f64(5, 3.0) + \
    ld(6, vi(1, 1) + vi(2, 0) + ld(3, pixels))
result = vi(1, 5) + vi(2, 28) + vi(3, 28) + vi(4, 1) + f64(5, 40.0) + \
    ld(6, vi(1, 0) + ld(3, pixels)) + ld(6, vi(1, 1) + vi(2, 1))
cancel = vi(1, 5) + key(2, 2) + varint(2) + varint(0) + varint(1)  # packed slots
error = vi(1, 5) + vi(2, (-1000 + 3) & 0xFFFFFFFFFFFFFFFF) + ld(3, "model load failed: \u20ac")
heartbeat = vi(1, 1) + vi(2, 99) + vi(3, 1) + vi(4, 0) + vi(5, 8) + vi(6, 2)
shutdown = vi(1, 1)
for name, field, msg in [("batch", 2, batch), ("progress", 3, progress), ("result", 4, result),
                         ("cancel", 5, cancel), ("error", 6, error), ("heartbeat", 7, heartbeat),
                         ("shutdown", 8, shutdown)]:
    write("proto", "env-" + name, vi(1, 1) + ld(field, msg))
    write("proto", "msg-" + name, msg)
# LoRA: an Adapters report, a LoraOp load and unload, a LoraDone with its info, LoraEvents
lora_info = ld(1, "d4") + vi(2, 0) + vi(3, 4) + ld(4, "transformer_blocks.0.attn1.to_q") + \
    key(5, 2) + varint(1) + varint(4) + vi(6, 80128) + vi(7, 1)
lora_msgs = [("adapters", 9, ld(1, lora_info) + ld(1, ld(1, "d8") + vi(7, 0))),
             ("lora-load", 10, vi(1, 3) + vi(2, 1) + ld(3, "d4") + ld(4, "/srv/a/d4.safetensors")),
             ("lora-unload", 10, vi(1, 4) + vi(2, 2) + ld(3, "d4")),
             ("lora-done", 11, vi(1, 3) + ld(4, lora_info)),
             ("lora-done-error", 11, vi(1, 3) + vi(2, (-1000 + 4) & 0xFFFFFFFFFFFFFFFF) +
              ld(3, "d4=x: tensor 'a.lora_A.weight' in x: shape (2, 3)")),
             ("lora-events", 12, b"".join(ld(1, ld(1, "d4") + vi(2, k) + vi(3, 80128)) for k in range(1, 6)))]
for name, field, msg in lora_msgs:
    write("proto", "env-" + name, vi(1, 1) + ld(field, msg))
    write("proto", "msg-" + name, msg)
write("proto", "env-two-oneofs", vi(1, 0) + ld(7, heartbeat) + ld(2, batch))
write("proto", "truncated", (vi(1, 1) + ld(4, result))[:-7])
write("proto", "bad-length", key(4, 2) + varint(1 << 40))
print("wrote seeds under", root)
