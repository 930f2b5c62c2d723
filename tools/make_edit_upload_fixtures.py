#!/usr/bin/env python3
"""Writes tests/fixtures/edit_uploads/: the uploads tests/http/test_edits.py sends to
POST /v1/images/edits in the formats its own stdlib PNG writer cannot make (the http tests run
without PIL). Made by PIL; deterministic; each file a few KB.

  img.webp          lossless WebP of the test's 48x32 RGB image (image_rgb() there, the same
                    formula here): its pixels are the PNG's exactly, so its edit must equal the PNG's
  img_lossy.webp    lossy WebP (quality 80) of the same image
  mask.webp         OpenAI's mask of the test (transparent where hole() is true) as lossless RGBA
  photo_exif6.jpg   a JPEG stored 32 wide and 48 tall with EXIF orientation 6 (rotate 90
                    clockwise): upright it is 48x32, the test's size
  bomb_30000.jpg    a real JPEG header whose frame says 30000x30000, cut right after the frame
                    header (a decompression bomb's header, no scan data)
  cut.webp          the lossy WebP cut to half its length (its RIFF header says more)
  tiny.bmp, tiny.gif  formats the route refuses by name

What it is not: part of the build. Run /root/ditd-venv/bin/python tools/make_edit_upload_fixtures.py
when a fixture must change; re-running gives identical files.
"""
import io
import os
import struct

from PIL import Image

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "edit_uploads")
W, H = 48, 32


def image_rgb():  # tests/http/test_edits.py's image_rgb(), as an image
    im = Image.new("RGB", (W, H))
    im.putdata([((40 + 4 * x) % 256, (200 - 5 * y) % 256, (17 * x + 11 * y) % 256)
                for y in range(H) for x in range(W)])
    return im


def hole(x, y):  # tests/http/test_edits.py's hole()
    return 5 <= x < 41 and 3 <= y < 27 and not (17 <= x < 27 and 11 <= y < 19)


def enc(im, fmt, **kw):
    b = io.BytesIO()
    im.save(b, fmt, **kw)
    return b.getvalue()


def main():
    os.makedirs(OUT, exist_ok=True)
    files = {}
    img = image_rgb()
    files["img.webp"] = enc(img, "WEBP", lossless=True, exact=True)
    assert Image.open(io.BytesIO(files["img.webp"])).convert("RGB").tobytes() == img.tobytes()
    lossy = enc(img, "WEBP", quality=80)
    files["img_lossy.webp"] = lossy
    mask = Image.new("RGBA", (W, H))
    mask.putdata([(0, 0, 0, 0 if hole(x, y) else 255) for y in range(H) for x in range(W)])
    files["mask.webp"] = enc(mask, "WEBP", lossless=True, exact=True)
    # stored 32x48; EXIF 6 = rotate 90 clockwise to view, so upright 48x32
    st = Image.new("RGB", (H, W))
    st.putdata([((30 + 5 * x + 2 * y) % 256, (90 + 3 * y) % 256, (220 - 4 * x - y) % 256)
                for y in range(W) for x in range(H)])
    ex = Image.Exif()
    ex[0x0112] = 6
    files["photo_exif6.jpg"] = enc(st, "JPEG", quality=92, exif=ex.tobytes())
    j = bytearray(enc(st, "JPEG", quality=92))
    i = j.index(b"\xff\xc0")
    struct.pack_into(">HH", j, i + 5, 30000, 30000)
    files["bomb_30000.jpg"] = bytes(j[: i + 19])  # SOF0 of 3 components: 2 + 17 bytes
    files["cut.webp"] = lossy[: len(lossy) // 2]
    files["tiny.bmp"] = enc(img.resize((4, 4)), "BMP")
    files["tiny.gif"] = enc(img.resize((4, 4)).convert("P"), "GIF")
    for name, data in files.items():
        with open(os.path.join(OUT, name), "wb") as f:
            f.write(data)
    print("%d files -> %s" % (len(files), OUT))


if __name__ == "__main__":
    main()
