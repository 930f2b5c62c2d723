#!/usr/bin/env python3
"""Writes tests/fixtures/image_resize/: PIL's Image.resize((dw, dh), Image.LANCZOS)
of deterministic pseudo-random images, for tests/unit/test_image_resize.c to
compare ditd's engine/core/image_resize.c against byte for byte.

The source images are not stored: both sides draw them from the same 64-bit
LCG (seed per case, `src_bytes` below; the C test has the same generator),
so only PIL's results are committed. Kinds: "noise" (every byte uniform:
the worst case for Lanczos' overshoot and the 0/255 clip) and "blocks"
(0/255 squares of side 3: a binary mask, as the mask processor resizes
before binarizing). Modes: L (channels 1) and RGB (3), the two
VaeImageProcessor resizes (the mask processor converts to L, the image
processor to RGB), and RGBA (channels 4: PIL's resize of an RGBA image, which it runs
premultiplied, then convert("RGB"): the result has 3 channels). Sizes: up, down, mixed, one axis, the same size, 1xN and
Nx1 (from and to), primes, extreme aspect ratios, large reductions, and
random pairs; for each, which pass order PIL ran (found by composing single
passes: "HV", "VH", or "either" when both give the same bytes).

Files: manifest.txt, one line a case: "kind seed sw sh channels dw dh order
offset" (offset: where the result starts in out.bin, dh x dw x channels
bytes, 3 for RGBA; order "rgba" for those). Deterministic. Run: /root/ditd-venv/bin/python tools/make_resize_fixtures.py
"""
import os
import random

import numpy as np
import PIL
from PIL import Image

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "image_resize")
M64 = (1 << 64) - 1


def src_bytes(kind, seed, w, h, c):
    """The LCG image: x <- x * 6364136223846793005 + 1442695040888963407 (mod 2^64),
    a byte is x >> 56; "blocks" draws one byte per 3x3 square and keeps its top bit."""
    x = seed & M64
    def nxt():
        nonlocal x
        x = (x * 6364136223846793005 + 1442695040888963407) & M64
        return x >> 56
    if kind == "noise":
        return np.array([nxt() for _ in range(w * h * c)], np.uint8).reshape(h, w, c)
    bw, bh = (w + 2) // 3, (h + 2) // 3
    cells = np.array([255 if nxt() & 0x80 else 0 for _ in range(bw * bh)], np.uint8).reshape(bh, bw)
    m = np.repeat(np.repeat(cells, 3, 0), 3, 1)[:h, :w]
    return np.repeat(m[:, :, None], c, 2)


def pil(a, c):
    return Image.fromarray(a[:, :, 0] if c == 1 else a, {1: "L", 3: "RGB", 4: "RGBA"}[c])


def main():
    os.makedirs(OUT, exist_ok=True)
    f = Image.LANCZOS
    sizes = [
        # up
        (7, 5, 23, 17), (3, 2, 31, 29), (16, 16, 40, 40), (10, 6, 11, 7),
        # down
        (61, 47, 13, 11), (64, 64, 16, 16), (97, 89, 31, 7), (48, 48, 47, 47), (90, 60, 45, 30),
        # mixed (one axis up, the other down), both ways, and the vertical-first rule
        (40, 13, 17, 37), (13, 40, 37, 17), (50, 60, 45, 20), (37, 53, 31, 11), (20, 64, 9, 9),
        (12, 40, 9, 30), (30, 70, 60, 10),
        # one axis
        (29, 31, 29, 7), (29, 31, 11, 31), (31, 29, 31, 64), (31, 29, 70, 29),
        # the same size (a copy)
        (17, 13, 17, 13),
        # 1-pixel sides, from and to
        (1, 37, 1, 11), (37, 1, 11, 1), (1, 1, 13, 7), (23, 19, 1, 1), (41, 3, 1, 17),
        (1, 20, 30, 1), (5, 1, 1, 5), (1, 9, 1, 40),
        # primes
        (53, 47, 29, 31), (101, 13, 7, 97), (2, 3, 5, 7),
        # extreme aspect ratios
        (200, 3, 5, 120), (3, 200, 120, 5), (160, 2, 40, 2), (2, 150, 2, 50),
        # large reductions, and a FLUX-like 1024x1024 -> 768x1344 at 1/16 scale
        (256, 192, 16, 12), (128, 96, 32, 24), (64, 64, 48, 84), (48, 84, 64, 64),
    ]
    rng = random.Random(23)
    for _ in range(40):
        sizes.append((rng.randint(1, 48), rng.randint(1, 48), rng.randint(1, 48), rng.randint(1, 48)))
    lines, blob, seed = [], bytearray(), 1
    orders = {"HV": 0, "VH": 0, "either": 0}
    for i, (sw, sh, dw, dh) in enumerate(sizes):
        for c in (1, 3, 4) if i % 2 == 0 else (1, 3):
            for kind in (("noise", "blocks") if i % 3 == 0 and c != 4 else ("noise",)):
                a = src_bytes(kind, seed, sw, sh, c)
                im = pil(a, c)
                if c == 4:  # RGBA: resized premultiplied, then the color (VaeImageProcessor's order)
                    r = np.asarray(im.resize((dw, dh), f).convert("RGB"))
                    lines.append(f"{kind} {seed} {sw} {sh} {c} {dw} {dh} rgba {len(blob)}")
                    blob += r.astype(np.uint8).tobytes()
                    seed += 1
                    continue
                r = np.asarray(im.resize((dw, dh), f))
                hv = np.array_equal(r, np.asarray(im.resize((dw, sh), f).resize((dw, dh), f)))
                vh = np.array_equal(r, np.asarray(im.resize((sw, dh), f).resize((dw, dh), f)))
                order = "either" if hv and vh else "HV" if hv else "VH" if vh else "?"
                assert order != "?", (sw, sh, dw, dh, c)
                orders[order] += 1
                lines.append(f"{kind} {seed} {sw} {sh} {c} {dw} {dh} {order} {len(blob)}")
                blob += r.astype(np.uint8).tobytes()
                seed += 1
    with open(os.path.join(OUT, "out.bin"), "wb") as fh:
        fh.write(blob)
    with open(os.path.join(OUT, "manifest.txt"), "w") as fh:
        fh.write(f"# PIL {PIL.__version__}: Image.resize(LANCZOS) of LCG images (tools/make_resize_fixtures.py)\n")
        fh.write("\n".join(lines) + "\n")
    print(f"{len(lines)} cases, {len(blob)} bytes, pass orders {orders}")


if __name__ == "__main__":
    main()
