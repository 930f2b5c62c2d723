#!/usr/bin/env python3
"""Writes tests/fixtures/image_in/: small images made by PIL and the pixels
PIL decodes from them, so test_image_in checks ditd's decoder (and its EXIF
orientation) against an independent reader. (PIL writes no interlaced
PNG; those are made by libpng in the test itself.)

Each case: <name>.<png|jpg|webp>, <name>.raw (8-bit RGB or RGBA, row-major,
after PIL's ImageOps.exif_transpose) and a line of manifest.txt:
"name file width height channels tolerance". Deterministic. Run with
/root/ditd-venv/bin/python tools/make_image_in_fixtures.py.
"""
import io
import os

from PIL import Image, ImageOps

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "image_in")


def base(w=12, h=7):
    im = Image.new("RGBA", (w, h))
    im.putdata([((x * 23 + y * 5) % 256, (y * 37) % 256, (x * y * 11 + 40) % 256, 30 + (x * 17 + y * 9) % 220)
                for y in range(h) for x in range(w)])
    return im


def exif_bytes(o):
    ex = Image.Exif()
    ex[0x0112] = o
    return ex.tobytes()


def main():
    os.makedirs(OUT, exist_ok=True)
    cases = []

    def add(name, ext, data, tol):
        with open(os.path.join(OUT, name + "." + ext), "wb") as f:
            f.write(data)
        im = Image.open(io.BytesIO(data))
        im = ImageOps.exif_transpose(im)
        has_alpha = im.mode in ("RGBA", "LA", "PA") or (im.mode == "P" and "transparency" in im.info) \
            or (im.mode in ("L", "RGB", "1") and "transparency" in im.info)
        ref = im.convert("RGBA" if has_alpha else "RGB")
        with open(os.path.join(OUT, name + ".raw"), "wb") as f:
            f.write(ref.tobytes())
        cases.append("%s %s.%s %d %d %d %d" % (name, name, ext, ref.width, ref.height, 4 if has_alpha else 3, tol))

    def enc(im, fmt, **kw):
        b = io.BytesIO()
        im.save(b, fmt, **kw)
        return b.getvalue()

    im = base()
    add("png_1", "png", enc(im.convert("L").point(lambda v: 255 if v > 100 else 0).convert("1"), "PNG"), 0)
    add("png_L", "png", enc(im.convert("L"), "PNG"), 0)
    add("png_LA", "png", enc(im.convert("LA"), "PNG"), 0)
    add("png_RGB", "png", enc(im.convert("RGB"), "PNG"), 0)
    add("png_RGBA", "png", enc(im, "PNG"), 0)
    p = im.convert("RGB").convert("P", palette=Image.ADAPTIVE, colors=16)
    add("png_P", "png", enc(p, "PNG"), 0)
    add("png_P_trns", "png", enc(p, "PNG", transparency=bytes([0, 128, 255] + [255] * 13)), 0)
    add("png_L_trns", "png", enc(im.convert("L"), "PNG", transparency=im.convert("L").getpixel((0, 0))), 0)
    rgb = im.convert("RGB")
    add("jpeg_gray", "jpg", enc(im.convert("L"), "JPEG", quality=90), 2)
    add("jpeg_progressive", "jpg", enc(rgb, "JPEG", quality=90, progressive=True), 2)
    for o in range(1, 9):
        add("jpeg_exif%d" % o, "jpg", enc(rgb, "JPEG", quality=90, exif=exif_bytes(o)), 2)
    add("webp_lossless_rgba", "webp", enc(im, "WEBP", lossless=True, exact=True), 0)
    add("webp_lossless_rgb", "webp", enc(rgb, "WEBP", lossless=True), 0)
    add("webp_lossy", "webp", enc(rgb, "WEBP", quality=90), 3)
    # the EXIF orientation of a PNG (eXIf chunk) and a WebP (EXIF chunk), as
    # Diffusers' load_image applies it through exif_transpose
    for o in (3, 6, 8):
        add("png_exif%d" % o, "png", enc(rgb, "PNG", exif=exif_bytes(o)), 0)
        add("webp_exif%d" % o, "webp", enc(im, "WEBP", lossless=True, exact=True, exif=exif_bytes(o)), 0)
    with open(os.path.join(OUT, "manifest.txt"), "w") as f:
        f.write("\n".join(cases) + "\n")
    print("%d cases" % len(cases))


if __name__ == "__main__":
    main()
