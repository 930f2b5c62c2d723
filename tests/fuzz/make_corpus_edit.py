#!/usr/bin/env python3
"""Writes the seeds of fuzz_editreq (issue 23): POST /v1/images/edits bodies, the first line the
Content-Type (empty: JSON). Forms with a 16x16 PNG image and an RGBA mask (OpenAI's), the image's
own alpha, two images (with a mask and n 4, n 3, both with alpha, alpha on one only, two sizes), a
mask of another size; JSON with base64, a data URL, `images` objects, an array of two.
Stdlib only (PNGs written by hand); deterministic; each seed under 4 KB."""
import base64
import json
import os
import struct
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
B = "XyZ"


def png(w, h, ct, px):
    def chunk(k, d):
        return struct.pack(">I", len(d)) + k + d + struct.pack(">I", zlib.crc32(k + d))
    ch = {2: 3, 6: 4, 0: 1}[ct]
    raw = b"".join(b"\0" + bytes(px(x, y, c) for x in range(w) for c in range(ch)) for y in range(h))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, ct, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))


def form(parts):
    out = b""
    for name, val, fn in parts:
        disp = f'Content-Disposition: form-data; name="{name}"' + (f'; filename="{fn}"' if fn else "")
        out += f"--{B}\r\n{disp}\r\n".encode() + (b"Content-Type: image/png\r\n" if fn else b"") + b"\r\n"
        out += (val if isinstance(val, bytes) else val.encode()) + b"\r\n"
    return f"multipart/form-data; boundary={B}\n".encode() + out + f"--{B}--\r\n".encode()


def main():
    d = os.path.join(HERE, "corpus", "editreq")
    os.makedirs(d, exist_ok=True)
    img = png(16, 16, 2, lambda x, y, c: (x * 13 + y * 7 + c * 50) % 256)
    mask = png(16, 16, 6, lambda x, y, c: 0 if c == 3 and 4 <= x < 12 else 255)
    alpha = png(16, 16, 6, lambda x, y, c: (0 if 5 <= y < 9 else 255) if c == 3 else 90)
    small = png(8, 8, 6, lambda x, y, c: 0)
    img2 = png(16, 16, 2, lambda x, y, c: (x * 5 + y * 17 + c * 90) % 256)
    text = [("prompt", "a fox", None), ("seed", "3", None), ("num_inference_steps", "4", None)]
    seeds = {
        "form_img2img": form([("image", img, "a.png")] + text + [("strength", "0.5", None)]),
        "form_mask": form([("image", img, "a.png"), ("mask", mask, "m.png")] + text
                          + [("stream", "true", None), ("size", "16x16", None)]),
        "form_alpha": form([("image[]", alpha, "a.png")] + text),
        "form_two": form([("image[]", img, "a.png"), ("image[]", img, "b.png")] + text),
        "form_small_mask": form([("image", img, "a.png"), ("mask", small, "m.png")] + text),
        "form_noimage": form(text),
        "json_b64": b"\n" + json.dumps({"prompt": "x", "image": base64.b64encode(img).decode(),
                                        "strength": 1.0, "n": 2}).encode(),
        "json_dataurl_mask": b"\n" + json.dumps({
            "prompt": "x", "image": "data:image/png;base64," + base64.b64encode(img).decode(),
            "mask": {"image_url": "data:image/png;base64," + base64.b64encode(mask).decode()},
            "sampler": "flow-euler"}).encode(),
        "json_images": b"\n" + json.dumps({"prompt": "x", "images": [
            {"image_url": "data:image/png;base64," + base64.b64encode(alpha).decode()}]}).encode(),
        "json_bad_b64": b"\n" + json.dumps({"prompt": "x", "image": "!!!"}).encode(),
        # several images (Diffusers' image list: output i edits image i % k)
        "form_two_mask_n4": form([("image[]", img, "a.png"), ("image[]", img2, "b.png"),
                                  ("mask", mask, "m.png"), ("n", "4", None)] + text),
        "form_two_n3": form([("image[]", img, "a.png"), ("image[]", img2, "b.png"),
                             ("n", "3", None)] + text),
        "form_two_alpha": form([("image[]", alpha, "a.png"), ("image[]", alpha, "b.png")] + text),
        "form_alpha_mixed": form([("image[]", alpha, "a.png"), ("image[]", img, "b.png")] + text),
        "form_two_sizes": form([("image[]", img, "a.png"), ("image[]", small, "b.png")] + text),
        "json_array_two": b"\n" + json.dumps({"prompt": "x", "n": 2, "image": [
            base64.b64encode(img).decode(),
            "data:image/png;base64," + base64.b64encode(img2).decode()]}).encode(),
        # FluxKontextPipeline's max_area (and its refusals: strength, a mask, other folders)
        "form_max_area": form([("image", img, "a.png"), ("max_area", "256", None)] + text),
        "json_max_area_strength": b"\n" + json.dumps({
            "prompt": "x", "image": base64.b64encode(img).decode(), "max_area": 4096,
            "strength": 0.5, "size": "16x32"}).encode(),
        "json_max_area_bad": b"\n" + json.dumps({"prompt": "x", "image": base64.b64encode(img).decode(),
                                                 "max_area": 1.5e12}).encode(),
    }
    for name, data in seeds.items():
        assert len(data) < 4096, (name, len(data))
        open(os.path.join(d, name), "wb").write(data)


if __name__ == "__main__":
    main()
